"""Fan-out to many nodes through the cluster's own engine (Slurm or ClusterShell): the compile side.

Node sets are read by ClusterShell's own `NodeSet`, as clush and `nodeset -e` read them: `node[01-08]`,
steps `gpu[01-16/2]`, several ranges and brackets `gpu[01-04,07],login[1-2]`, `a[1-2]b[1-2]`, the
operators `!` `&` `^`, and `@group`s, which are resolved here, at compile time, with this machine's
ClusterShell groups (groups.conf). `expand()` checks and expands them; `folded()` is the set as the
engines get it (groups and steps expanded, e.g. `gpu[01,03,05]`); `plan.build` asks this module for
the view model's `Fanout` group (`view`) and its settings, and steps.py for the `--dry-run` preview
when the spec has `fanout:` (the step list and every step's text are steps.py's).
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Optional

from rbrules import launch

from .errors import Problem
from .view import Array, Fanout, Setting

# ClusterShell is imported where a node set is read (expand, _fold): a spec without `fanout:`
# compiles without loading it.

MAX_NODES = 4096
# clush without a topology sends the bundle once per node from this machine: above this many
# nodes the compile warns (docs/fanout.md, "clush tree mode": at 8 nodes flat costs 8 bundles,
# a tree with two gateways that are nodes too 4.7, so the tree starts to pay above 8)
FLAT_COPY_WARN_NODES = 8
GATEWAY_PYTHON = "/usr/bin/python3"   # where distribution packages put ClusterShell
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
            "(e.g. gpu[01-08]) or compile where the group is defined")
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
    return _fold(expand(nodeset, resolver))


def _fold(nodes: list[str]) -> str:
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


def scratch(spec: Any) -> str:
    """The start of each node's scratch name; the run adds 16 random hex digits (fan_copy), so no
    other user of a node can make the path first."""
    return f"{spec.fanout.scratch.rstrip('/')}/rbfan-{spec.name}"


def view(spec: Any) -> Fanout:
    """What the runbook needs of `fanout:`: the nodes, expanded once, and the engine's options."""
    f = spec.fanout
    clush = f.engine == "clush"
    nodes = expand(f.nodes)
    return Fanout(
        engine=f.engine,
        nodes=_fold(nodes),
        nodes_given=f.nodes,
        node_list=tuple(nodes),
        success=str(f.success),
        timeout_s=f.timeout_s,
        connect_timeout=f.connect_timeout,
        scratch_base=scratch(spec),
        topology=(f.topology or "") if clush else None,
        copy_opts=None if clush else tuple(sbcast_opts(spec)),
        engine_opts=tuple(clush_opts(spec)) if clush else None,
        clush=tuple(clush_words(spec)) if clush else None,
    )


def settings(f: Fanout) -> list[Setting]:
    comment = f"{len(f.node_list)} nodes"
    if f.nodes != f.nodes_given:
        comment += f" (fanout.nodes: {f.nodes_given})"
    rows = [
        Setting("RB_FAN_ENGINE", f.engine, "fanout: the cluster's engine"),
        Setting("RB_FAN_NODES", f.nodes, comment),
        Setting("RB_FAN_SUCCESS", f.success, "all, or how many nodes must pass"),
        Setting("RB_FAN_TIMEOUT", str(f.timeout_s), "seconds for each engine call (copy, install)"),
        Setting("RB_FAN_CONNECT_TIMEOUT", str(f.connect_timeout)),
        Setting("RB_FAN_SCRATCH_BASE", f.scratch_base,
                "on each node: the bundle (.tar) and where it is unpacked, as BASE-<16 random "
                "hex digits made by each run's copy> (private: mkdir -m 700, never reused)"),
    ]
    if f.topology is not None:
        rows.append(Setting("RB_FAN_TOPOLOGY", f.topology,
                            "clush tree mode (fanout.topology); empty: this machine sends to every "
                            "node"))
    return rows


def arrays(f: Fanout) -> list[Array]:
    """The node list, and the options only the spec's engine takes."""
    rows = [Array("RB_FAN_NODE_LIST", f.node_list, "fanout.nodes, expanded")]
    if f.copy_opts is not None:
        rows.append(Array("RB_FAN_COPY_OPTS", f.copy_opts, "sbcast options"))
    if f.engine_opts is not None:
        rows.append(Array("RB_FAN_ENGINE_OPTS", f.engine_opts, "clush options"))
    if f.clush is not None:
        rows.append(Array("RB_FAN_CLUSH", f.clush,
                          "how clush is started (tree mode: with the gateways' python)"))
    return rows


def clush_opts(spec: Any) -> list[str]:
    f = spec.fanout
    opts: list[str] = []
    if f.ssh_config:
        opts += ["-o", f"-F {f.ssh_config}"]
    if f.width:
        opts += ["-f", str(f.width)]
    if f.topology:
        opts += [f"--topology={f.topology}"]
    return opts


def sbcast_opts(spec: Any) -> list[str]:
    """sbcast --fanout: how many nodes this machine sends the bundle to; they forward it through
    Slurm's message tree (measured: the head sends exactly fanout copies, whatever the node
    count). sbcast's own default is 8; ours is 2 (width sets it, at most 8)."""
    return [f"--fanout={min(spec.fanout.width or SBCAST_FANOUT, 8)}"]


def clush_words(spec: Any) -> list[str]:
    """How clush is started: in tree mode with the python the gateways run ClusterShell's gateway
    with (clush passes CLUSTERSHELL_GW_PYTHON_EXECUTABLE on to them; without it each gateway runs
    whatever `python3` its PATH finds)."""
    f = spec.fanout
    if f.engine == "clush" and f.topology:
        return ["env", f"CLUSTERSHELL_GW_PYTHON_EXECUTABLE={f.gateway_python or GATEWAY_PYTHON}",
                "clush"]
    return ["clush"]


def warnings(source: Any, spec: Any) -> list[Problem]:
    """A flat clush copy to many nodes: the bundle leaves this machine once per node."""
    f = spec.fanout
    if f is None or f.engine != "clush" or f.topology:
        return []
    n = len(expand(f.nodes))
    if n <= FLAT_COPY_WARN_NODES:
        return []
    return [source.problem(
        ("fanout", "nodes"),
        f"clush without a topology copies the bundle from this machine once per node ({n} "
        f"copies); set fanout.topology to a topology.conf whose [routes] start at this machine's "
        f"short hostname and name gateways (e.g. `HEAD: gw[1-2]` and "
        f"`gw[1-2]: {folded(f.nodes)}`), so "
        f"it is sent once per gateway (docs/fanout.md, clush tree mode)")]


def partials(spec: Any) -> list[str]:
    """The state and helpers of how the runbook installs: on the nodes, or on one destination."""
    if not spec.fanout:
        return ["partials/install.sh.j2"]
    return ["partials/fanout_node.sh.j2", "partials/fanout.sh.j2",
            f"partials/fanout_{spec.fanout.engine}.sh.j2"]


def preview(step: str, spec: Any, incremental: bool = False) -> list[str]:
    """`--dry-run` lines: the engine commands as one would type them."""
    f = spec.fanout
    src_host, src = spec.transfer.source
    _dst_host, dst = spec.transfer.target
    d = f"{scratch(spec)}-<random>"
    bundle = f"runs/{spec.name}/fanout/rbfan-{spec.name}.tar"
    opts = "".join(f" {shlex.quote(o)}" for o in clush_opts(spec)) if f.engine == "clush" else ""
    copy = "".join(f" {shlex.quote(o)}" for o in sbcast_opts(spec)) if f.engine == "slurm" else ""
    flags = " ".join(launch.FLAGS)
    node_cmd = (f"sh -c 'mkdir -m 700 {d} && tar -xf {d}.tar -C {d} --exclude=./payload && "
                f"cd {d} && python3 {flags} {d}/kit/{launch.START} rbkit.fanout "
                f"node --dir {d} --dest {dst} --old {src} ...'")
    t = f.timeout_s
    clush = "".join(f"{shlex.quote(w)} " for w in clush_words(spec))
    nodes = folded(f.nodes)
    if step == "fan_preflight":
        return [f"on {src_host}: connect; ship the kit; rbkit scan {src}",
                f"here: {'clush, nodeset' if f.engine == 'clush' else 'sbcast, srun, SLURM_JOB_ID'}"
                f" present; nodes {nodes} ({len(expand(f.nodes))})"]
    if step == "fan_pack":
        lines = [f"on {src_host}: rbkit manifest build {src} --algo {spec.transfer.verify}",
                 f"on {src_host}: tar -C {src} -b 256 -cf - <names> | <compress> > here: {bundle}"
                 " (with the manifest and the kit)"]
        if incremental:
            lines.append(f"re-run (runs/{spec.name}/fanout-base.jsonl, the last fan-out's "
                         "manifest, exists): <names> are only what changed since "
                         "(rbkit manifest delta)")
        return lines
    if step == "fan_copy":
        if f.engine == "slurm":
            return [f"timeout {t} sbcast -f -t {f.connect_timeout}{copy} {bundle} {d}.tar"]
        return [f"timeout {t} {clush}-w {nodes} -S -t {f.connect_timeout} -u {t}{opts} "
                f"--copy {bundle} --dest {d}.tar"]
    if step == "fan_install":
        again = ["re-run: nodes that lack what the changes-only bundle leaves out (no earlier "
                 "install, a file changed there) get the whole bundle: copy and install again, "
                 "on them only"] if incremental else []
        if f.engine == "slurm":
            return [f"timeout {t} srun -N {len(expand(f.nodes))} -n {len(expand(f.nodes))} "
                    f"--ntasks-per-node=1 -w {nodes} --chdir=/ "
                    f"--immediate={f.connect_timeout} "
                    f"--time={max(1, (t + 59) // 60)} -K0 {node_cmd}"] + again
        return [f"timeout {t} {clush}-w {nodes} -S -t {f.connect_timeout} -u {t}{opts} "
                f"{node_cmd}"] + again
    if step == "fan_compare":
        policy = "every node" if f.success == "all" else f"at least {f.success} nodes"
        return [f"here: python3 {flags} <kit>/{launch.START} rbkit.fanout compare: nodes x checks, "
                "identical rows folded",
                f"success: {policy} must pass"]
    return []
