"""The view model's types: what resolve decides, grouped the way the runbook reads, as frozen
dataclasses the templates read by attribute.

A runbook reads top to bottom as its identity (the header), its settings (`readonly` values,
arrays and maps, made from the groups below: the spec and the kit, the transfer, the destination,
the checks, the fan-out), the hosts it reaches, how it installs, the kit, and its steps. `Plan`
holds each group once; `Plan.settings`, `arrays` and `maps` are the rows the settings block prints,
in the runbook's order, made from the groups by plan.rows (the one place that names an RB_*
value). Every string here reaches bash through a quoting filter (render.py); a word that must
expand at run time is a `render.Safe`, a str, so it fits every `str` field and stays Safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Protocol

Words = tuple[str, ...]  # shell words, each quoted by |shwords (a Safe one stays as it is)


@dataclass(frozen=True)
class Setting:
    """`readonly NAME=value`, under its comment line (none when empty)."""

    name: str
    value: str
    comment: str = ""


@dataclass(frozen=True)
class Array:
    """`readonly -a NAME=(words)`, under its comment line (none when empty)."""

    name: str
    words: Words
    comment: str = ""


@dataclass(frozen=True)
class Map:
    """`declare -rA NAME=([key]=value ...)`: keys are identifiers."""

    name: str
    entries: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Identity:
    """The runbook and its spec: the header, and the settings that name them."""

    name: str
    script_name: str
    spec_path: str
    spec_sha256: str
    spec_chain: tuple[str, ...]  # the bases it extends, nearest first
    # (name, path from the runbook's folder, sha256) of each file of the chain
    spec_files: tuple[tuple[str, str, str], ...]
    description_lines: tuple[str, ...]
    compiler_version: str
    seal_placeholder: str  # the 64 zeros render.seal fills in


@dataclass(frozen=True)
class Transfer:
    """What moves from where to where, and how (spec `transfer:`)."""

    where: str  # `file:line` of `transfer:`
    src_host: str
    src_path: str
    dst_host: str
    dst_path: str
    route: Optional[str]  # None with fan-out: the cluster's engine carries the bundle
    route_written: str  # transfer.route as the spec has it (compile --plan shows it)
    compression: str
    auto_compression: tuple[str, ...]  # what `auto` takes: the first every end has, else none
    verify: str
    rerun: str
    jobs: str  # hashing threads on each host, or "auto"
    incremental: bool  # a re-run sends only what changed
    exclude: Words  # transfer.exclude, the patterns
    exclude_args: Words
    direct_ssh: Optional[Words]  # the source's ssh to the destination; None with fan-out
    ssh_ciphers: str


@dataclass(frozen=True)
class Destination:
    """How the copy is installed at the destination, and the env file it gets."""

    on_existing: str
    special_modes: str
    outside_links: str
    keep_backups: int
    swap_atomic: str
    shared_parent: str  # transfer.shared_parent: refuse or allow
    cuda_home: str  # "" without `cuda:`
    env_file: str  # "" for the default, DEST.env.sh
    env_path: str  # the env file the run writes (rbrules.paths.env_file)
    staging: str  # beside the destination (rbrules.paths.staging)
    lock: str  # beside the destination (rbrules.paths.lock)
    cuda_version: str  # "" without `cuda:`
    library_path_first: Words
    env: Words  # KEY=VALUE, sorted by key


@dataclass(frozen=True)
class Gpu:
    """The GPU the spec declares, with what the catalog knows of it (derived once)."""

    model: str
    count: int
    capability: str  # "" when neither the spec nor the catalog says
    arch: str  # sm_NN; "" without a capability
    arch_name: str  # the catalog's name of the architecture; "" when it does not know it
    names: Words  # what a device's name must name to be this model


@dataclass(frozen=True)
class Check:
    """A check the spec lists, as `compile --plan` shows it."""

    kind: str
    params: tuple[tuple[str, str], ...]  # (name, value in one short line)
    allow_skip: bool


@dataclass(frozen=True)
class Checks:
    """What proves the move: the audit on the source before, the checks on the target after."""

    gpu_declared: bool
    gpu: Optional[Gpu]
    listed: tuple[Check, ...]  # the spec's checks
    kinds: Words  # the types the probe runs: the implied ones first, then the listed
    audit_arch: str  # "" for no kernel audit
    audit_args: Words
    run: bool  # whether the checks run on the target (the probe step, or each fan-out node)
    on_failed_checks: str
    config: str  # the checks as one JSON document for `rbprobes run` (resolve)


@dataclass(frozen=True)
class Fanout:
    """The install on many nodes through the cluster's engine (spec `fanout:`)."""

    engine: str  # slurm | clush
    nodes: str  # the node set as the engines get it (folded)
    nodes_given: str  # as the spec wrote it
    node_list: Words
    success: str  # "all", or how many nodes must pass
    timeout_s: int
    connect_timeout: int
    scratch_base: str
    topology: Optional[str]  # clush only ("" for none); None with slurm
    copy_opts: Optional[Words]  # sbcast options (slurm)
    engine_opts: Optional[Words]  # clush options (clush)
    clush: Optional[Words]  # how clush is started (clush)


@dataclass(frozen=True)
class KitFile:
    """One file of the kit, embedded (compile --standalone): the line that names it, then its text,
    in the one quoted heredoc that holds the whole kit."""

    path: str
    head: str  # a render.Safe: `SEPARATOR PATH`, ` -n` after it when the file has no final newline
    text: str  # a render.Safe: the file as this repository has it, ended by one newline


@dataclass(frozen=True)
class Kit:
    """The host-side kit: pinned by its sha256 (a file beside the runbook), or embedded."""

    sha256: str
    file: str  # .kit/<sha256>.tar; "" when embedded
    standalone: bool
    partial: str  # the template that writes it into the run directory
    runtime_partial: str  # the runtime: read from the pinned kit, or written in place
    separator: str  # embedded: the word that starts each file's line (no line of a file does)
    delimiter: str  # embedded: the heredoc's end (no line of the kit equals it)
    host_dirs: tuple[str, ...]  # the packages the tar sent to hosts holds (not the controller's)
    files: tuple[KitFile, ...]  # embedded: its files


@dataclass(frozen=True)
class Exclusion:
    """A ShellCheck check the runbook turns off for the whole file, with its reason."""

    code: str  # SC2016
    lines: tuple[str, ...]  # the reason, as comment lines


@dataclass(frozen=True)
class HostView:
    """A host the runbook touches and how it is reached."""

    id: str
    where: str  # `file:line` of its entry under `hosts:`
    summary: str
    ssh_words: Words  # empty for this machine
    target: str  # user@host for ssh, "" for this machine
    local: bool
    port: int  # 0: ssh's default
    identity_file: str
    jump: str
    host_keys: str
    options: tuple[tuple[str, str], ...]  # the ssh options, sorted by name


@dataclass(frozen=True)
class StepView:
    """A step function of the runbook: its place, its text (steps.py) and its template."""

    id: str
    index: int
    total: int
    where: str  # `file:line` of the spec entry it comes from
    doc: str  # its one-line summary
    host: str  # the host it is mostly about
    preview: str  # what --dry-run prints, lines joined by newlines
    template: str

    @property
    def doc_lines(self) -> tuple[str, ...]:
        return (self.doc,)


@dataclass(frozen=True)
class Action:
    """One thing a step does, as --dry-run shows it (actions.preview makes the line): `on` (a key
    of actions.ON), the command words, a note in plain words (in parentheses after the command),
    each `{NAME}` in them a decision; shown only `when` the decision named first has the value
    second, and `unless` it has."""

    on: str
    run: str = ""
    note: str = ""
    when: Optional[tuple[str, object]] = None
    unless: Optional[tuple[str, object]] = None


class Install(Protocol):
    """How a runbook installs, chosen once by resolve: on one destination (steps.SingleHost) or on
    every node of a fan-out (fanout.FanOut). Each mode has its own steps, what they run as data
    (actions.preview makes their `--dry-run` text), its settings rows and partials; nothing else
    asks which mode a runbook is in."""

    auto_compression: tuple[str, ...]  # what `compression: auto` takes, in order
    streams: bool  # the runbook streams the source to the destination (a route, its ssh hop)
    fanout: Optional[Fanout]  # the nodes and the engine's options; None on one destination

    @property
    def partials(self) -> tuple[str, ...]: ...  # the templates of its state and helpers

    def step_ids(self, checks_run: bool) -> tuple[str, ...]: ...

    def compression_note(self, plan: Decisions) -> str: ...  # as the run decides it, in words

    # each step's --dry-run lines as data (actions.preview makes them), by step id
    actions: Mapping[str, tuple[Action, ...]]

    def preview_words(self, plan: Decisions) -> dict[str, object]: ...  # its own words for them

    def settings(self) -> list[Setting]: ...  # its own rows of the settings block

    def arrays(self) -> list[Array]: ...

    # compile --plan's words for where it installs and checks (`code` marks inline code)
    def installs_on(self, plan: Plan, code: Callable[[str], str]) -> str: ...

    def checks_on(self, plan: Plan, code: Callable[[str], str]) -> str: ...

    def route_lines(self, plan: Plan, code: Callable[[str], str]) -> list[str]: ...


@dataclass(frozen=True)
class Decisions:
    """What resolve decides from the spec, before any text: the groups the steps' previews and the
    settings rows are made from (resolve builds them first, then the Plan in one go)."""

    runbook: Identity
    kit: Kit
    transfer: Transfer
    destination: Destination
    checks: Checks
    fanout: Optional[Fanout]
    install: Install  # how it installs, chosen once: on one destination, or on the nodes
    hosts: tuple[HostView, ...]


@dataclass(frozen=True)
class Plan(Decisions):
    """The view model of one runbook: every decision (the Decisions), and the text made from them,
    for the templates to paste."""

    partials: tuple[str, ...]  # the templates of how it installs: on one destination, or the nodes
    steps: tuple[StepView, ...]
    # the settings block, in the runbook's order (made from the groups above)
    settings: tuple[Setting, ...]
    arrays: tuple[Array, ...]
    maps: tuple[Map, ...]
    # ShellCheck exclusions for the whole file, each with its reason; their codes for the directive
    exclusions: tuple[Exclusion, ...]
    exclusion_codes: str
