"""Fan-out to many nodes through the cluster's own engine (Slurm or ClusterShell): the compile side.

Node sets are read by ClusterShell's own `NodeSet`, as clush and `nodeset -e` read them:
`node[01-08]`, steps `gpu[01-16/2]`, several ranges and brackets `gpu[01-04,07],login[1-2]`,
`a[1-2]b[1-2]`, the operators `!` `&` `^`, and `@group`s, which are resolved here, at compile time,
with this machine's ClusterShell groups (groups.conf). `expand()` checks and expands them; `fold()`
is the set as the engines get it (groups and steps expanded, e.g. `gpu[01,03,05]`). resolve.py
expands the spec's node set once, into the Plan's `Fanout` group, and picks `FanOut`, the install
strategy of a spec with `fanout:`: its steps, their `--dry-run` previews, its settings rows and
partials, all made from the decisions (the step summaries are steps.py's, as for every step). Slurm
or clush is decided once (ENGINES[engine]): each engine's options, partial and commands are its
entry's.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from rbrules import common, launch

from .errors import Problem
from .steps import FANOUT, fixed_compression_note
from .view import Array, Fanout, Setting

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


@dataclass(frozen=True)
class Engine:
    """What differs between the cluster's engines: the tools fan_preflight checks here, and the
    commands that copy the bundle to the nodes and run the node script there (`--dry-run`'s
    words; the bash is the engine's partial, partials/fanout_<name>.sh.j2)."""

    name: str
    tools: str

    @property
    def partial(self) -> str:
        return f"partials/fanout_{self.name}.sh.j2"

    def copies(self, f: Fanout, bundle: str, scratch: str) -> str:
        raise NotImplementedError

    def installs(self, f: Fanout, node_cmd: str) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Slurm(Engine):
    def copies(self, f: Fanout, bundle: str, scratch: str) -> str:
        copy = "".join(f" {shlex.quote(o)}" for o in f.copy_opts or ())
        return f"timeout {f.timeout_s} sbcast -t {f.connect_timeout}{copy} {bundle} {scratch}.tar"

    def installs(self, f: Fanout, node_cmd: str) -> str:
        count = len(f.node_list)
        return (
            f"timeout {f.timeout_s} srun -N {count} -n {count} "
            f"--ntasks-per-node=1 -w {f.nodes} --chdir=/ "
            f"--immediate={f.connect_timeout} "
            f"--time={max(1, (f.timeout_s + 59) // 60)} -K0 {node_cmd}"
        )


@dataclass(frozen=True)
class Clush(Engine):
    @staticmethod
    def words(f: Fanout) -> str:
        """clush's start, nodes and options, as the engine's partial runs it."""
        clush = "".join(f"{shlex.quote(w)} " for w in f.clush or ())
        opts = "".join(f" {shlex.quote(o)}" for o in f.engine_opts or ())
        return (
            f"timeout {f.timeout_s} {clush}-w {f.nodes} -S -t {f.connect_timeout} "
            f"-u {f.timeout_s}{opts}"
        )

    def copies(self, f: Fanout, bundle: str, scratch: str) -> str:
        return f"{self.words(f)} --copy {bundle} --dest {scratch}.tar"

    def installs(self, f: Fanout, node_cmd: str) -> str:
        return f"{self.words(f)} {node_cmd}"


ENGINES: dict[str, Engine] = {
    "slurm": Slurm("slurm", "sbcast, srun, SLURM_JOB_ID"),
    "clush": Clush("clush", "clush, nodeset"),
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
        f = self.fanout
        comment = f"{len(f.node_list)} nodes"
        if f.nodes != f.nodes_given:
            comment += f" (fanout.nodes: {f.nodes_given})"
        rows = [
            Setting("RB_FAN_ENGINE", f.engine, "fanout: the cluster's engine"),
            Setting("RB_FAN_NODES", f.nodes, comment),
            Setting("RB_FAN_SUCCESS", f.success, "all, or how many nodes must pass"),
            Setting(
                "RB_FAN_TIMEOUT", str(f.timeout_s), "seconds for each engine call (copy, install)"
            ),
            Setting("RB_FAN_CONNECT_TIMEOUT", str(f.connect_timeout)),
            Setting(
                "RB_FAN_SCRATCH_BASE",
                f.scratch_base,
                "on each node: the bundle, as BASE-<16 random hex digits, new for each copy>"
                ".tar, moved into a new private directory (mktemp -d) and checked there",
            ),
        ]
        if f.topology is not None:
            rows.append(
                Setting(
                    "RB_FAN_TOPOLOGY",
                    f.topology,
                    "clush tree mode (fanout.topology); empty: this machine sends to every node",
                )
            )
        return rows

    def arrays(self) -> list[Array]:
        """The node list, and the options only the spec's engine takes."""
        f = self.fanout
        rows = [Array("RB_FAN_NODE_LIST", f.node_list, "fanout.nodes, expanded")]
        if f.copy_opts is not None:
            rows.append(Array("RB_FAN_COPY_OPTS", f.copy_opts, "sbcast options"))
        if f.engine_opts is not None:
            rows.append(Array("RB_FAN_ENGINE_OPTS", f.engine_opts, "clush options"))
        if f.clush is not None:
            rows.append(
                Array(
                    "RB_FAN_CLUSH",
                    f.clush,
                    "how clush is started (tree mode: with the gateways' python)",
                )
            )
        return rows

    def preview(self, step: str, plan: Decisions) -> list[str]:
        """`--dry-run` lines: the engine commands as one would type them."""
        f, t = self.fanout, plan.transfer
        name, src_host, src, dst = plan.runbook.name, t.src_host, t.src_path, t.dst_path
        d = f"{f.scratch_base}-<random>"
        bundle = f"runs/{name}/fanout/rbfan-{name}.tar"
        flags = " ".join(launch.FLAGS)
        # the node script (RB_FAN_NODE_SCRIPT) in short: the bundle moved into a new private
        # directory, checked (owner, mode, links, sha256 against the pin), then unpacked and run
        node_cmd = (
            f"sh -c 'D=$(mktemp -d {d}.XXXXXX) && mv {d}.tar $D/bundle.tar && <check "
            f"it: owner, mode, one link, sha256 = <pin>, rbrules.private> && tar -xf "
            f"$D/bundle.tar -C $D --exclude=./payload && cd $D && python3 {flags} "
            f"$D/kit/{launch.START} rbkit.fanout node --dir $D --dest {dst} --old {src} "
            "...'"
        )
        tar_b = " ".join(common.TAR_RECORD)
        if step == "fan_preflight":
            return [
                f"on {src_host}: connect; ship the kit; rbkit scan {src}",
                f"here: {self.engine.tools} present; nodes {f.nodes} ({len(f.node_list)})",
            ]
        if step == "fan_pack":
            lines = [
                f"on {src_host}: rbkit manifest build {src} --algo {t.verify}",
                f"on {src_host}: tar -C {src} {tar_b} -cf - <names> | <compress> > here: "
                f"{bundle} (with the manifest and the kit)",
            ]
            if t.incremental:
                lines.append(
                    f"re-run (runs/{name}/fanout-base.jsonl, the last fan-out's "
                    "manifest, exists): <names> are only what changed since "
                    "(rbkit manifest delta)"
                )
            return lines
        if step == "fan_copy":
            return [self.engine.copies(f, bundle, d)]
        if step == "fan_install":
            again = (
                [
                    "re-run: nodes that lack what the changes-only bundle leaves out (no earlier "
                    "install, a file changed there) get the whole bundle: copy and install again, "
                    "on them only"
                ]
                if t.incremental
                else []
            )
            return [self.engine.installs(f, node_cmd)] + again
        if step == "fan_compare":
            policy = "every node" if f.success == "all" else f"at least {f.success} nodes"
            return [
                f"here: python3 {flags} <kit>/{launch.START} rbkit.fanout compare: nodes x "
                "checks, identical rows folded",
                f"success: {policy} must pass",
            ]
        return []
