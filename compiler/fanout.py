"""Fan-out to many nodes through the cluster's own engine (Slurm or ClusterShell): the compile side.

Node sets use the bracket syntax Slurm and ClusterShell share: `node[01-08]`, `gpu[1-4,7]`,
`a[1-2]b[1-2]`, comma-separated items. `expand()` checks and expands them; `plan.build` asks this
module for the step list, the settings and the `--dry-run` preview when the spec has `fanout:`.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

MAX_NODES = 4096
# clush without a topology sends the bundle once per node from this machine: above this many
# nodes the compile warns (docs/fanout.md, "clush tree mode": at 8 nodes flat costs 8 bundles,
# a tree with two gateways that are nodes too 4.7, so the tree starts to pay above 8)
FLAT_COPY_WARN_NODES = 8
GATEWAY_PYTHON = "/usr/bin/python3"   # where distribution packages put ClusterShell
SBCAST_FANOUT = 2
ITEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RANGE = re.compile(r"^([0-9]{1,6})(?:-([0-9]{1,6}))?$")

STEPS = ["fan_preflight", "fan_pack", "fan_copy", "fan_install", "fan_compare"]
STEP_DOCS = {
    "fan_preflight": "Reach the source, check the engine and its tools here, list the nodes.",
    "fan_pack": "Pack the source once: manifest, tar with the chosen compression, the kit: one bundle"
                " (on a re-run: only what changed since the last fan-out).",
    "fan_copy": "Let the engine carry the bundle to every node (sbcast, or clush --copy).",
    "fan_install": "On every node at once: extract to staging, verify, relocate, swap, exports, probe"
                   " (a node the changes alone cannot serve gets the whole bundle).",
    "fan_compare": "Fetch every node's report and compare: nodes x checks, odd and missing nodes named.",
}
STEP_WHERE = {"fan_preflight": ("fanout",), "fan_pack": ("transfer",), "fan_copy": ("fanout",),
              "fan_install": ("fanout",), "fan_compare": ("fanout",)}


def _split(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError("unbalanced '['")
    out.append(cur)
    return out


def _ranges(body: str) -> list[str]:
    vals: list[str] = []
    for part in body.split(","):
        m = RANGE.match(part)
        if not m:
            raise ValueError(f"{part!r} is not a number or a range like 01-08")
        a, b = m.group(1), m.group(2) or m.group(1)
        if int(b) < int(a):
            raise ValueError(f"range {part!r} goes backwards")
        width = len(a) if a.startswith("0") or len(a) == len(b) else 0
        for i in range(int(a), int(b) + 1):
            vals.append(str(i).zfill(width))
            if len(vals) > MAX_NODES:
                raise ValueError(f"more than {MAX_NODES} nodes")
    return vals


def _expand_item(item: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if not m:
        if not ITEM.match(item):
            raise ValueError(f"{item!r} is not a node name")
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    out: list[str] = []
    for v in _ranges(m.group(1)):
        out += _expand_item(head + v + tail)
        if len(out) > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES} nodes")
    return out


def expand(nodeset: str) -> list[str]:
    """`node[01-03],gpu7` -> ['node01', 'node02', 'node03', 'gpu7']; raises ValueError."""
    if not nodeset or any(c.isspace() for c in nodeset):
        raise ValueError("a node set is one word like node[01-08] (no spaces)")
    out: list[str] = []
    for item in _split(nodeset):
        if not item:
            raise ValueError("empty item in the node set")
        out += _expand_item(item)
    if len(set(out)) != len(out):
        raise ValueError("names a node twice")
    if len(out) > MAX_NODES:
        raise ValueError(f"more than {MAX_NODES} nodes")
    return out


def scratch(spec: Any) -> str:
    return f"{spec.fanout.scratch.rstrip('/')}/rbfan-{spec.name}"


def settings(spec: Any) -> list[dict]:
    f = spec.fanout
    nodes = expand(f.nodes)
    return [
        {"name": "RB_FAN_ENGINE", "value": f.engine, "comment": "fanout: the cluster's engine"},
        {"name": "RB_FAN_NODES", "value": f.nodes, "comment": f"{len(nodes)} nodes"},
        {"name": "RB_FAN_SUCCESS", "value": str(f.success),
         "comment": "all, or how many nodes must pass"},
        {"name": "RB_FAN_TIMEOUT", "value": str(f.timeout_s),
         "comment": "seconds for each engine call (copy, install)"},
        {"name": "RB_FAN_CONNECT_TIMEOUT", "value": str(f.connect_timeout), "comment": ""},
        {"name": "RB_FAN_SCRATCH", "value": scratch(spec),
         "comment": "on each node: the bundle (.tar) and where it is unpacked"},
    ] + ([{"name": "RB_FAN_TOPOLOGY", "value": f.topology or "",
           "comment": "clush tree mode (fanout.topology); empty: this machine sends to every node"}]
         if f.engine == "clush" else [])


def arrays(spec: Any) -> list[dict]:
    """The node list, and the options only the spec's engine takes."""
    f = spec.fanout
    nodes = {"name": "RB_FAN_NODE_LIST", "words": expand(f.nodes),
             "comment": "fanout.nodes, expanded"}
    if f.engine == "slurm":
        return [nodes, {"name": "RB_FAN_COPY_OPTS", "words": sbcast_opts(spec),
                        "comment": "sbcast options"}]
    return [nodes,
            {"name": "RB_FAN_ENGINE_OPTS", "words": clush_opts(spec), "comment": "clush options"},
            {"name": "RB_FAN_CLUSH", "words": clush_words(spec),
             "comment": "how clush is started (tree mode: with the gateways' python)"}]


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


def warnings(source: Any, spec: Any) -> list:
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
        f"short hostname and name gateways (e.g. `HEAD: gw[1-2]` and `gw[1-2]: {f.nodes}`), so "
        f"it is sent once per gateway (docs/fanout.md, clush tree mode)")]


def partials(spec: Any) -> list[str]:
    """The state and helpers of how the runbook installs: on the nodes, or on one destination."""
    if not spec.fanout:
        return ["partials/install.sh.j2"]
    return ["partials/fanout.sh.j2", f"partials/fanout_{spec.fanout.engine}.sh.j2"]


def preview(step: str, spec: Any, incremental: bool = False) -> list[str]:
    """`--dry-run` lines: the engine commands as one would type them."""
    f = spec.fanout
    src_host, src = spec.transfer.source
    _dst_host, dst = spec.transfer.target
    d = scratch(spec)
    bundle = f"runs/{spec.name}/fanout/rbfan-{spec.name}.tar"
    opts = "".join(f" {shlex.quote(o)}" for o in clush_opts(spec)) if f.engine == "clush" else ""
    copy = "".join(f" {shlex.quote(o)}" for o in sbcast_opts(spec)) if f.engine == "slurm" else ""
    node_cmd = (f"sh -c 'tar -xf {d}.tar -C {d} --exclude=payload.tar* && python3 -m rbkit.fanout "
                f"node --dir {d} --dest {dst} --old {src} ...'")
    t = f.timeout_s
    clush = "".join(f"{shlex.quote(w)} " for w in clush_words(spec))
    if step == "fan_preflight":
        return [f"on {src_host}: connect; ship the kit; rbkit scan {src}",
                f"here: {'clush, nodeset' if f.engine == 'clush' else 'sbcast, srun, SLURM_JOB_ID'}"
                f" present; nodes {f.nodes} ({len(expand(f.nodes))})"]
    if step == "fan_pack":
        lines = [f"on {src_host}: rbkit manifest build {src} --algo {spec.transfer.verify}",
                 f"on {src_host}: tar -C {src} -cf - <names> | <compress> > here: {bundle}"
                 " (with the manifest and the kit)"]
        if incremental:
            lines.append(f"re-run (runs/{spec.name}/fanout-base.jsonl, the last fan-out's "
                         "manifest, exists): <names> are only what changed since "
                         "(rbkit manifest delta)")
        return lines
    if step == "fan_copy":
        if f.engine == "slurm":
            return [f"timeout {t} sbcast -f -t {f.connect_timeout}{copy} {bundle} {d}.tar"]
        return [f"timeout {t} {clush}-w {f.nodes} -S -t {f.connect_timeout} -u {t}{opts} "
                f"--copy {bundle} --dest {d}.tar"]
    if step == "fan_install":
        again = ["re-run: nodes that lack what the changes-only bundle leaves out (no earlier "
                 "install, a file changed there) get the whole bundle: copy and install again, "
                 "on them only"] if incremental else []
        if f.engine == "slurm":
            return [f"timeout {t} srun -N {len(expand(f.nodes))} -n {len(expand(f.nodes))} "
                    f"--ntasks-per-node=1 -w {f.nodes} --chdir={f.scratch} "
                    f"--immediate={f.connect_timeout} "
                    f"--time={max(1, (t + 59) // 60)} -K0 {node_cmd}"] + again
        return [f"timeout {t} {clush}-w {f.nodes} -S -t {f.connect_timeout} -u {t}{opts} "
                f"{node_cmd}"] + again
    if step == "fan_compare":
        policy = "every node" if f.success == "all" else f"at least {f.success} nodes"
        return ["here: python3 -m rbkit.fanout compare: nodes x checks, identical rows folded",
                f"success: {policy} must pass"]
    return []
