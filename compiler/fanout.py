"""Fan-out to many nodes through the cluster's own engine (Slurm or ClusterShell): the compile side.

Node sets are read by ClusterShell's own `NodeSet`, as clush and `nodeset -e` read them:
`node[01-08]`, steps `gpu[01-16/2]`, several ranges and brackets `gpu[01-04,07],login[1-2]`,
`a[1-2]b[1-2]`, the operators `!` `&` `^`, and `@group`s, which are resolved here, at compile time,
with this machine's ClusterShell groups (groups.conf). `expand()` checks and expands them; `fold()`
is the set as the engines get it (groups and steps expanded, e.g. `gpu[01,03,05]`). resolve.py
expands the spec's node set once, into the Plan's `Fanout` group, and picks `FanOut`, the install
strategy of a spec with `fanout:`: its steps and what each runs (ACTIONS, the data actions.preview
makes their `--dry-run` lines from), its settings rows and partials, all made from the decisions
(the step summaries are steps.py's, as for every step). Slurm or clush is decided once
(ENGINES[engine]): each engine's options, partial and commands are its entry's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from .errors import Problem
from .steps import FANOUT, fixed_compression_note
from .view import Action, Array, Fanout, Setting

if TYPE_CHECKING:
    from .view import Decisions, Plan

# ClusterShell is imported where a node set is read (expand, _fold): a spec without `fanout:`
# compiles without loading it.

MAX_NODES = 4096
# clush without a topology sends the bundle once per node from this machine: above this many
# nodes the compile warns (docs/fanout.md, "clush tree mode": at 8 nodes flat costs 8 bundles,
# a tree with two gateways that are nodes too 4.7, so the tree starts to pay above 8)
FLAT_COPY_WARN_NODES = 8
GATEWAY_PYTHON = "/usr/bin/python3"  # where distribution packages put ClusterShell
SBCAST_FANOUT = 2
NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
BRACKET = re.compile(r"\[([^\[\]]*)\]")
RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+)(?:/([0-9]+))?)?$")
OPERATORS = ",!&^"  # ClusterShell's set operators: union, difference, intersection, xor


class _Groups:
    """A ClusterShell group resolver that remembers the groups that named no nodes."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.empty: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def group_nodes(self, group: str, namespace: Optional[str] = None) -> list[str]:
        from ClusterShell.NodeUtils import GroupResolverSourceError

        try:
            nodes: list[str] = self._inner.group_nodes(group, namespace)
        except GroupResolverSourceError:  # no such group source, or none at all (no groups.conf)
            nodes = []
        if not nodes:
            self.empty.append(f"@{namespace}:{group}" if namespace else f"@{group}")
        return nodes


def expand(nodeset: str, resolver: Any = None) -> list[str]:
    """`gpu[01-04,07],login[1-2]` -> the nodes, sorted as ClusterShell sorts them; `@group`s from
    `resolver` (default: this machine's ClusterShell groups). Raises ValueError, with
    ClusterShell's own message where it refused the text."""
    if not nodeset or any(c.isspace() for c in nodeset):
        raise ValueError("a node set is one word like node[01-08] (no spaces)")
    if _upper_bound(nodeset) > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} nodes")
    from ClusterShell.NodeSet import NodeSet, NodeSetException
    from ClusterShell.NodeUtils import GroupResolverError, GroupSourceError
    from ClusterShell.RangeSet import RangeSetException

    groups = _Groups(resolver if resolver is not None else std_group_resolver())
    try:
        nodes = NodeSet(nodeset, resolver=groups)
    except (NodeSetException, RangeSetException, GroupResolverError, GroupSourceError) as exc:
        raise ValueError(f"not a node set (ClusterShell: {exc})") from None
    if groups.empty:
        raise ValueError(
            f"ClusterShell group {groups.empty[0]} cannot be resolved at compile time: this "
            "machine's ClusterShell groups (groups.conf) name no nodes for it; `compile` expands "
            "the node set where it runs and writes the nodes into the runbook, so list the nodes "
            "(e.g. gpu[01-08]) or compile where the group is defined"
        )
    if len(nodes) > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} nodes ({len(nodes)})")
    names = [str(node) for node in nodes]
    if not names:
        raise ValueError(f"{nodeset!r} names no nodes")
    for name in names:
        if not NODE.match(name):
            raise ValueError(f"{name!r} is not a node name (letters, digits, '.', '_', '-')")
    return names


def std_group_resolver() -> Any:
    """This machine's ClusterShell groups (groups.conf)."""
    from ClusterShell.NodeSet import std_group_resolver as resolver

    return resolver()


def folded(nodeset: str, resolver: Any = None) -> str:
    """The node set as the engines get it: groups, steps and operators expanded, then folded
    (`gpu[01-16/2]` -> `gpu[01,03,05,07,09,11,13,15]`), which clush, srun and sbcast all read."""
    return fold(expand(nodeset, resolver))


def fold(nodes: list[str]) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(nodes))


def _upper_bound(nodeset: str) -> int:
    """At most how many nodes the text names, counted from its brackets before ClusterShell builds
    them (`n[1-999999999]` would take minutes and gigabytes); groups are counted once resolved."""
    total, item, depth = 0, "", 0
    for ch in nodeset + ",":
        depth += (ch == "[") - (ch == "]")
        if ch in OPERATORS and depth == 0:
            count = 1
            for body in BRACKET.findall(item):
                count *= max(1, sum(_range_size(part) for part in body.split(",")))
            total += count
            item = ""
        else:
            item += ch
    return total


def _range_size(text: str) -> int:
    found = RANGE.match(text)
    if not found:
        return 1  # ClusterShell says what is wrong with it
    first, last, step = found.group(1), found.group(2) or found.group(1), found.group(3) or "1"
    return max(0, int(last) - int(first)) // max(1, int(step)) + 1


# the bundle here, and its name on each node before the node moves it into a private directory
BUNDLE = "runs/{RB_NAME}/fanout/rbfan-{RB_NAME}.tar"
SCRATCH = "{RB_FAN_SCRATCH_BASE}-<random>"
# the node script (RB_FAN_NODE_SCRIPT) in short: the bundle moved into a new private directory,
# checked (owner, mode, links, sha256 against the pin), then unpacked and run
NODE_COMMAND = (
    f"sh -c 'D=$(mktemp -d {SCRATCH}.XXXXXX) && mv {SCRATCH}.tar $D/bundle.tar && <check it: "
    "owner, mode, one link, sha256 = <pin>, rbrules.private> && tar -xf $D/bundle.tar -C $D "
    "--exclude=./payload && cd $D && python3 {rules.flags} $D/kit/{rules.start} rbkit.fanout "
    "node --dir $D --dest {RB_DST_PATH} --old {RB_SRC_PATH} ...'"
)
CLUSH_WORDS = (
    "timeout {RB_FAN_TIMEOUT} {RB_FAN_CLUSH} -w {RB_FAN_NODES} -S -t {RB_FAN_CONNECT_TIMEOUT} "
    "-u {RB_FAN_TIMEOUT} {RB_FAN_ENGINE_OPTS}"
)


@dataclass(frozen=True)
class Engine:
    """What differs between the cluster's engines: the tools fan_preflight checks here, and the
    commands that copy the bundle to the nodes and run the node script there (`--dry-run`'s
    words, as actions.Action text; the bash is the engine's partial,
    partials/fanout_<name>.sh.j2)."""

    name: str
    tools: str
    copies: str
    installs: str

    @property
    def partial(self) -> str:
        return f"partials/fanout_{self.name}.sh.j2"


ENGINES: dict[str, Engine] = {
    "slurm": Engine(
        "slurm",
        "sbcast, srun, SLURM_JOB_ID",
        copies="timeout {RB_FAN_TIMEOUT} sbcast -t {RB_FAN_CONNECT_TIMEOUT} {RB_FAN_COPY_OPTS} "
        f"{BUNDLE} {SCRATCH}.tar",
        installs="timeout {RB_FAN_TIMEOUT} srun -N {RB_FAN_NODE_LIST:count} -n "
        "{RB_FAN_NODE_LIST:count} --ntasks-per-node=1 -w {RB_FAN_NODES} --chdir=/ "
        "--immediate={RB_FAN_CONNECT_TIMEOUT} --time={minutes} -K0 " + NODE_COMMAND,
    ),
    "clush": Engine(
        "clush",
        "clush, nodeset",
        copies=f"{CLUSH_WORDS} --copy {BUNDLE} --dest {SCRATCH}.tar",
        installs=f"{CLUSH_WORDS} {NODE_COMMAND}",
    ),
}
RERUN = ("RB_INCREMENTAL", "1")
# What each fan-out step runs, on which host (as steps.ACTIONS for one host); the engine's own
# commands are its entry's in ENGINES
ACTIONS: dict[str, tuple[Action, ...]] = {
    "fan_preflight": (
        Action("src", note="connect; ship the kit; rbkit engine scan {RB_SRC_PATH}"),
        Action(
            "here",
            note="{install.engine.tools} present; nodes {RB_FAN_NODES} ({RB_FAN_NODE_LIST:count})",
        ),
    ),
    "fan_pack": (
        Action("src", "rbkit manifest build {RB_SRC_PATH} --algo {RB_VERIFY}"),
        Action(
            "src",
            "tar -C {RB_SRC_PATH} {rules.tar_record} -cf - <names> | <compress: {compression}> "
            f"> here: {BUNDLE}",
            "with the manifest and the kit",
        ),
        Action(
            "note",
            note="re-run (runs/{RB_NAME}/fanout-base.jsonl, the last fan-out's manifest, exists): "
            "<names> are only what changed since (rbkit manifest delta)",
            when=RERUN,
        ),
    ),
    "fan_copy": tuple(
        Action("here", engine.copies, when=("RB_FAN_ENGINE", name))
        for name, engine in ENGINES.items()
    ),
    "fan_install": tuple(
        Action("here", engine.installs, when=("RB_FAN_ENGINE", name))
        for name, engine in ENGINES.items()
    )
    + (
        Action(
            "note",
            note="re-run: nodes that lack what the changes-only bundle leaves out (no earlier "
            "install, a file changed there) get the whole bundle: copy and install again, on "
            "them only",
            when=RERUN,
        ),
    ),
    "fan_compare": (
        Action(
            "here",
            "python3 {rules.flags} <kit>/{rules.start} rbkit.fanout compare",
            "nodes x checks, identical rows folded",
        ),
        Action("note", note="success: every node must pass", when=("RB_FAN_SUCCESS", "all")),
        Action(
            "note",
            note="success: at least {RB_FAN_SUCCESS} nodes must pass",
            unless=("RB_FAN_SUCCESS", "all"),
        ),
    ),
}


def warnings(source: Any, spec: Any) -> list[Problem]:
    """A flat clush copy to many nodes: the bundle leaves this machine once per node."""
    fan = spec.fanout
    if fan is None or fan.engine != "clush" or fan.topology:
        return []
    nodes = expand(fan.nodes)
    count = len(nodes)
    if count <= FLAT_COPY_WARN_NODES:
        return []
    return [
        source.problem(
            ("fanout", "nodes"),
            f"clush without a topology copies the bundle from this machine once per node ({count} "
            f"copies); set fanout.topology to a topology.conf whose [routes] start at this "
            f"machine's "
            f"short hostname and name gateways (e.g. `HEAD: gw[1-2]` and "
            f"`gw[1-2]: {fold(nodes)}`), so "
            f"it is sent once per gateway (docs/fanout.md, clush tree mode)",
        )
    ]


@dataclass(frozen=True)
class FanOut:
    """The install on every node through the cluster's engine: the source packed once into a
    bundle, the engine carries it, each node runs the install engine (the strategy resolve picks
    for a spec with `fanout:`)."""

    fanout: Fanout  # the nodes and the engine's options
    engine: Engine  # ENGINES[fanout.engine], decided once (resolve)
    # what `compression: auto` takes: a bundle is written once and copied to every node, zstd
    # first for the smaller bundle
    auto_compression = ("zstd", "lz4")
    streams = False  # the cluster's engine carries the bundle
    actions = ACTIONS  # each step's --dry-run lines, as data

    @property
    def partials(self) -> tuple[str, ...]:
        """The state and helpers of the install on the nodes, and of the spec's engine."""
        return (
            "partials/fanout_node.sh.j2",
            "partials/fanout.sh.j2",
            self.engine.partial,
            "partials/fanplan.sh.j2",
        )

    def step_ids(self, checks_run: bool) -> tuple[str, ...]:
        return FANOUT

    def compression_note(self, plan: Decisions) -> str:
        compression = plan.transfer.compression
        if compression == "auto":
            return (
                "decided at run time: "
                + ", else ".join(
                    f"{tool} -1 if both ends have {tool}" for tool in self.auto_compression
                )
                + ", else none"
            )
        return fixed_compression_note(compression)

    def installs_on(self, plan: Plan, code: Callable[[str], str]) -> str:
        return f"every node of {code(self.fanout.nodes_given)}"

    def checks_on(self, plan: Plan, code: Callable[[str], str]) -> str:
        return f"every node ({len(self.fanout.node_list)})"

    def route_lines(self, plan: Plan, code: Callable[[str], str]) -> list[str]:
        return [
            f"- fan-out: installed on every node of {code(self.fanout.nodes_given)} through "
            f"{code(self.fanout.engine)} (see the steps below), not only on "
            f"{code(plan.transfer.dst_host)}"
        ]

    def settings(self) -> list[Setting]:
        fan = self.fanout
        comment = f"{len(fan.node_list)} nodes"
        if fan.nodes != fan.nodes_given:
            comment += f" (fanout.nodes: {fan.nodes_given})"
        rows = [
            Setting("RB_FAN_ENGINE", fan.engine, "fanout: the cluster's engine"),
            Setting("RB_FAN_NODES", fan.nodes, comment),
            Setting("RB_FAN_SUCCESS", fan.success, "all, or how many nodes must pass"),
            Setting(
                "RB_FAN_TIMEOUT", str(fan.timeout_s), "seconds for each engine call (copy, install)"
            ),
            Setting("RB_FAN_CONNECT_TIMEOUT", str(fan.connect_timeout)),
            Setting(
                "RB_FAN_SCRATCH_BASE",
                fan.scratch_base,
                "on each node: the bundle, as BASE-<16 random hex digits, new for each copy>"
                ".tar, moved into a new private directory (mktemp -d) and checked there",
            ),
        ]
        if fan.topology is not None:
            rows.append(
                Setting(
                    "RB_FAN_TOPOLOGY",
                    fan.topology,
                    "clush tree mode (fanout.topology); empty: this machine sends to every node",
                )
            )
        return rows

    def arrays(self) -> list[Array]:
        """The node list, and the options only the spec's engine takes."""
        fan = self.fanout
        rows = [Array("RB_FAN_NODE_LIST", fan.node_list, "fanout.nodes, expanded")]
        if fan.copy_opts is not None:
            rows.append(Array("RB_FAN_COPY_OPTS", fan.copy_opts, "sbcast options"))
        if fan.engine_opts is not None:
            rows.append(Array("RB_FAN_ENGINE_OPTS", fan.engine_opts, "clush options"))
        if fan.clush is not None:
            rows.append(
                Array(
                    "RB_FAN_CLUSH",
                    fan.clush,
                    "how clush is started (tree mode: with the gateways' python)",
                )
            )
        return rows

    def preview_words(self, plan: Decisions) -> dict[str, object]:
        """Its own words for the previews: the compression as the run decides it, and srun's
        --time (the engine's timeout in whole minutes, as the slurm partial rounds it)."""
        return {
            "compression": self.compression_note(plan),
            "minutes": max(1, (self.fanout.timeout_s + 59) // 60),
        }
