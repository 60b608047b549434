"""Every step of a runbook, described once: its one-line summary (`--list`, the comment above the
step's function, `compile --plan`), the host it is mostly about, the spec entry it comes from, what
it runs on which host as data (ACTIONS: actions.Action, whose `{NAME}`s are the decisions the
settings block holds; actions.preview makes its `--dry-run` lines from them, as for the fan-out's
steps, fanout.ACTIONS), and the single-host install (`SingleHost`, one of the two install
strategies resolve.py picks from; the other is fanout.FanOut): its steps, its own words for the
previews, its partials. The names beside the destination come from the decisions (rbrules.paths'
rules).

The destination-side steps are the install engine's (hostkit/rbkit/engine.py, STEPS): a
single-host runbook runs them one by one through the engine on the destination, a fan-out node
runs them all in its own process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rbrules import enginerules, linkrate

from .view import Action

if TYPE_CHECKING:
    from .view import Array, Decisions, Plan, Setting, Transfer

ENGINE_DOCS = {
    "stage": "make a fresh staging beside the destination (on a re-run: unchanged files "
    "hard-linked from the current install)",
    "receive": "unpack the tar stream into the staging",
    "verify": "check the staging against the manifest: every file, mode, link and digest",
    "relocate": "rewrite what names the old path (shebangs, activate scripts) for the new one",
    "prove": "the staged interpreter runs here and reports the staging as sys.prefix",
    "swap": "put the proven copy in place in one rename, then prove it there (sys.prefix, "
    "the console scripts); a failure puts back what was there",
    "exports": "write the env file: CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's libs first",
    "probe": "run the checks with the moved interpreter",
}

SINGLE_HOST = (
    "preflight",
    "manifest",
    "transfer",
    "verify",
    "relocate",
    "prove",
    "swap",
    "exports",
    "probe",
)
FANOUT = ("fan_preflight", "fan_pack", "fan_copy", "fan_install", "fan_compare")


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + "."


DOCS = {
    "preflight": "Reach every host, ship the kit, check the source is a venv after the excludes, "
    "take the destination's lock, check its state and free space.",
    "manifest": "Hash every file of the source (in parallel) into a manifest; detect a re-run "
    "and what an incremental one must send.",
    "transfer": "Stream the source into a staging directory beside the destination.",
    **{s: _sentence(ENGINE_DOCS[s]) for s in ("verify", "relocate", "prove", "swap", "exports")},
    "probe": "Run the checks with the moved interpreter on the target; fetch the report.",
    "fan_preflight": "Reach the source, check the engine and its tools here, list the nodes.",
    "fan_pack": "Pack the source once: manifest, tar with the chosen compression, the kit: one "
    "bundle (on a re-run: only what changed since the last fan-out).",
    "fan_copy": "Let the engine carry the bundle to every node (sbcast, or clush --copy).",
    "fan_install": "On every node at once, the install engine: "
    + ", ".join(enginerules.ENGINE_STEPS)
    + " (a node the changes alone cannot serve gets the whole bundle).",
    "fan_compare": "Fetch every node's report and compare: nodes x checks, odd and missing nodes "
    "named.",
}
# the spec entry each step comes from (the `(specs/x.yaml:14)` marker above the step)
WHERE = {
    "preflight": ("hosts",),
    "manifest": ("transfer", "verify"),
    "transfer": ("transfer",),
    "verify": ("transfer", "verify"),
    "relocate": ("transfer", "to"),
    "prove": ("transfer", "to"),
    "swap": ("transfer", "on_existing"),
    "exports": ("cuda",),
    "probe": ("checks",),
    "fan_preflight": ("fanout",),
    "fan_pack": ("transfer",),
    "fan_copy": ("fanout",),
    "fan_install": ("fanout",),
    "fan_compare": ("fanout",),
}

# What each single-host step runs, on which host (actions.Action: `--dry-run`'s lines, made by
# actions.preview; `{NAME}` is a decision, as the settings block or the Plan names it)
STREAMS = (
    "streams side by side from {rules.streams_min_mb} MB: one per two of the {RB_JOBS} jobs, at "
    "most {rules.max_streams}"
)
RELAYED = "jobs: the fewest of the three machines; each stream its own ssh clients here"
CHECKED_KIT = "check tar and python3 >= 3.9"
AUDITED = (
    "refused with the files and packages named unless --force; on one machine, references "
    "outside the venv are said, not refused"
)
PRINT_PREFIX = "-c 'import sys; print(sys.prefix)'"
ACTIONS: dict[str, tuple[Action, ...]] = {
    "preflight": (
        Action(
            "each host", note="connect; use the kit here; " + CHECKED_KIT, when=("host.local", True)
        ),
        Action(
            "each host",
            note="connect; copy the kit to a private directory (mktemp -d), checked by its "
            "sha256; " + CHECKED_KIT,
            when=("host.local", False),
        ),
        Action(
            "src",
            "rbkit engine scan {RB_SRC_PATH} {RB_EXCLUDE_ARGS}",
            "refused unless pyvenv.cfg, bin/python and files are sent",
        ),
        Action(
            "dst",
            "rbkit engine serve --dest {RB_DST_PATH}",
            "refuses a parent of it another user can write (shared_parent: "
            "{destination.shared_parent}); takes {destination.lock} for the run (a second run is "
            "refused, naming this one)",
        ),
        Action(
            "dst",
            "rbkit engine preflight",
            "on_existing {destination.on_existing}; free space for {destination.staging}",
        ),
        Action(
            "src",
            "rbprobes preflight --venv {RB_SRC_PATH} --arch {RB_AUDIT_ARCH} {RB_AUDIT_ARGS}",
            AUDITED,
            unless=("RB_AUDIT_ARCH", ""),
        ),
        Action("src", "rbprobes outside {RB_SRC_PATH}", AUDITED, when=("RB_AUDIT_ARCH", "")),
        Action("note", note="compression: {compression}"),
    ),
    "manifest": (
        Action(
            "src",
            "rbkit engine hash {RB_SRC_PATH} {RB_EXCLUDE_ARGS} --algo {RB_VERIFY} --jobs {RB_JOBS} "
            "--scanned <preflight's scan of it>",
        ),
        Action(
            "here", note="keep a copy in runs/{RB_NAME}/manifest.jsonl; send it to {RB_DST_HOST}"
        ),
        Action(
            "dst",
            "rbkit engine current",
            "if {RB_DST_PATH}/{rules.installed_manifest} matches, skip the install",
        ),
        Action(
            "dst",
            "rbkit engine stage",
            "if it differs, link unchanged files from {RB_DST_PATH} into {destination.staging}, "
            "send only the rest",
            when=("RB_INCREMENTAL", "1"),
        ),
    ),
    "transfer": (
        Action(
            "dst",
            "rbkit engine stage",
            "rm -rf {destination.staging} && mkdir {destination.staging}",
        ),
        Action(
            "src",
            "tar -C {RB_SRC_PATH} {rules.tar_record} --null --no-recursion -T <names to send> "
            "-cf - | <compress: {compression}>",
            "rbkit engine send",
        ),
        Action(
            "more",
            note="| a pipe on {RB_SRC_HOST}, no ssh (" + STREAMS + ") |",
            when=("stream_path", "pipe"),
        ),
        Action(
            "more",
            note="| ssh from {RB_SRC_HOST} to {RB_DST_HOST} (direct; " + STREAMS + ") |",
            when=("stream_path", "direct"),
        ),
        Action(
            "more",
            note="| ssh from {RB_SRC_HOST} to {RB_DST_HOST} where it reaches it (direct; "
            + STREAMS
            + "), else through this machine (relay; "
            + STREAMS
            + ", "
            + RELAYED
            + ") |",
            when=("stream_path", "auto"),
        ),
        Action(
            "more",
            note="| through this machine (relay; " + STREAMS + ", " + RELAYED + ") |",
            when=("stream_path", "relay"),
        ),
        Action(
            "dst",
            "<decompress> | tar -C {destination.staging} {rules.tar_record} -xf - --no-same-owner",
            "rbkit engine receive; how much tar has read, every 5 s",
        ),
    ),
    "verify": (
        Action(
            "dst",
            "rbkit engine verify {destination.staging} --jobs {RB_JOBS}",
            "against the manifest; the stamp relocate, prove and swap require",
        ),
    ),
    "relocate": (
        Action(
            "dst",
            "rbkit engine relocate {destination.staging} --old {RB_SRC_PATH} --new {RB_DST_PATH}",
        ),
    ),
    "prove": (
        Action(
            "dst",
            "{destination.staging}/bin/python -I -B " + PRINT_PREFIX,
            "within {rules.prove_timeout} s",
        ),
    ),
    "swap": (
        Action(
            "dst",
            "rbkit engine swap",
            "{destination.staging} into {RB_DST_PATH}; on_existing: {destination.on_existing}, "
            "from the engine's choices",
        ),
        Action(
            "dst",
            "{RB_DST_PATH}/bin/python " + PRINT_PREFIX,
            "then each console script (one per interpreter line) started to its sys.prefix; on "
            "failure put back what was there",
        ),
    ),
    "exports": (
        Action("dst", "rbkit engine exports", "write {destination.env_path}"),
        Action(
            "more",
            note="CUDA_HOME={destination.cuda_home}; LD_LIBRARY_PATH: {RB_LIBRARY_DIRS:list} (in "
            "site-packages), then $CUDA_HOME/lib64",
            unless=("destination.cuda_home", ""),
        ),
    ),
    "probe": (
        Action(
            "dst",
            "rbkit engine probe",
            "source the env file; {RB_DST_PATH}/bin/python {rules.site_flags} <kit>/{rules.start} "
            "rbprobes run: {checks.kinds:list}",
        ),
        Action("here", note="fetch the report to runs/{RB_NAME}/<run>/probe-{RB_DST_HOST}.json"),
    ),
}


def host(step: str, transfer: Transfer) -> str:
    """The host a step is mostly about (named in its log lines and the report)."""
    src_host, dst_host = transfer.src_host, transfer.dst_host
    if step == "manifest":
        return src_host
    if step in ("preflight", "transfer"):
        return src_host if src_host == dst_host else f"{src_host}->{dst_host}"
    return dst_host


@dataclass(frozen=True)
class SingleHost:
    """The install on one destination: the stream into its staging, then the engine's steps one
    by one there (the strategy resolve picks for a spec without `fanout:`)."""

    # what `compression: auto` takes where it is not measured, the first that every end has
    # (else none): lz4 first (docs/benchmarks.md)
    auto_compression = ("lz4", "zstd")
    partials = ()
    streams = True
    fanout = None
    actions = ACTIONS  # each step's --dry-run lines, as data

    def step_ids(self, checks_run: bool) -> tuple[str, ...]:
        return tuple(s for s in SINGLE_HOST if s != "probe" or checks_run)

    def settings(self) -> list[Setting]:
        return []

    def arrays(self) -> list[Array]:
        return []

    def compression_note(self, plan: Decisions) -> str:
        """The stream's compression as the run decides it (rb::preflight_compression's rule)."""
        transfer = plan.transfer
        compression = transfer.compression
        if compression == "auto" and transfer.src_host == transfer.dst_host and plan.hosts[0].local:
            return "none (both ends are this machine: no link to save)"
        if compression == "auto":
            return (
                "decided at run time: on the relay, measured: the link's rate (zeros through "
                f"this machine for {linkrate.LINK_SECONDS} s) against each compressor both ends "
                f"have, packing a {linkrate.MEASURE_SAMPLE >> 20} MiB sample of the source on "
                "the source: the fastest way through; where "
                "that cannot run, and on the direct route, none if every machine the stream "
                "passes through runs one kernel (the same boot id: no link to save), else "
                + ", else ".join(
                    f"{tool} -1 if both ends have {tool}" for tool in self.auto_compression
                )
                + ", else none"
            )
        return fixed_compression_note(compression)

    # compile --plan's words for where it installs (`code` marks a value as inline code)
    def installs_on(self, plan: Plan, code: Callable[[str], str]) -> str:
        return code(plan.transfer.dst_host)

    def checks_on(self, plan: Plan, code: Callable[[str], str]) -> str:
        return code(plan.transfer.dst_host)

    def route_lines(self, plan: Plan, code: Callable[[str], str]) -> list[str]:
        return []

    def preview_words(self, plan: Decisions) -> dict[str, object]:
        """Its own words for the previews: the compression as the run decides it, and the way the
        stream goes (a pipe on one host, else the route)."""
        transfer = plan.transfer
        same = transfer.src_host == transfer.dst_host
        return {
            "compression": self.compression_note(plan),
            "stream_path": "pipe" if same else transfer.route,
        }


def fixed_compression_note(compression: str) -> str:
    """A compression the spec fixed (not auto), in words."""
    if compression == "none":
        return "none"
    return f"{compression} (preflight fails if an end lacks it)"
