"""The live plan of a fan-out runbook (`--plan`, `--apply PLAN` with a `fanout:` block): every node
asked, through the cluster's own engine, read-only, for its destination's state; the nodes
grouped by what a run would do there.

    rbkit.fanout node --state --dir DIR --dest DEST --choices JSON    on each node (the node
        script of a fan-out run, started by clush / srun): planstate.dest_state of DEST and its
        install's manifest, printed as the node's report (`RBFAN NODE I/N CHUNK` lines, zlib and
        base64 inside); no lock, nothing written beside DEST; DIR and DIR.tar are removed after
    rbkit.fanplan compose --dir DIR --nodes N1,N2 --engine-out OUT ...    here: the plan from the
        source's scan (DIR/source.scan) and the nodes' reports: each node's state kept in
        DIR/nodes/, the nodes grouped, plan.json, changes-G.txt per group, plan.md (--markdown),
        the screen on stdout; exit 1 when a node is unreachable or something blocks the run
    rbkit.fanplan drift --plan PLAN --nodes ... --engine-out OUT [--source-now FILE]    here:
        what moved on the source or on any node since the plan (exit 1, `moved<TAB>WHAT` lines)

Each node is judged by the single-host plan's own functions (liveplan.changes, liveplan.assess);
nodes fall in one group when what a run would do there is the same: holding exactly this source's
install (nothing to send), holding an older one (the same itemized changes), needing everything
(no install of this tool: nothing there, or not a venv), or unreachable (no report).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import zlib
from typing import Any, Dict, List, Optional

from rbrules import paths, proven
from rbrules.choices import Choices
from rbrules.shown import printable, shown
from rbrules.units import human

from . import fanreports, liveplan, planscreen, planstate, safefs

UP_TO_DATE = "holds exactly this source's install: nothing to send"
OLDER = "holds an older install"
EVERYTHING = "needs everything"


def _pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 6)).decode("ascii")


def _unpack(text: str) -> bytes:
    return zlib.decompress(base64.b64decode(text.encode("ascii")))


# -- on each node ----------------------------------------------------------------------------------


def node_state(args: argparse.Namespace) -> int:
    """This node's destination, read-only, as its report; the plan's kit leaves the node."""
    dest = args.dest.rstrip("/")
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    doc: Dict[str, Any] = {"node": name, "dest": dest, "plan_state": True, "ok": True, "steps": []}
    try:
        # compared with the install's manifest here (planstate.against_install): only what
        # differs from it comes back
        facts, lines = planstate.dest_state(
            dest, args.choices.on_existing, args.choices.keep_backups or 0, against=True
        )
        doc["facts"] = facts
        doc["state"] = _pack(b"".join(lines))
    except (OSError, ValueError) as exc:
        doc.update(ok=False, error="cannot read %s: %s" % (dest, exc))
    fanreports.emit(doc)
    shutil.rmtree(args.dir, ignore_errors=True)  # the kit and the bundle (fanout.BUNDLE)
    return 0 if doc["ok"] else 1


# -- here: the nodes' reports -------------------------------------------------------------------


def save_states(states_dir: str, nodes: List[str], engine_out: List[str]) -> Dict[str, str]:
    """Each reporting node's state into D/NODE.state (planstate.read_state's form: its facts
    hold what differs from its install's manifest); {node: why} for the nodes without one."""
    reports = fanreports.read_reports(nodes, engine_out)
    os.makedirs(states_dir, mode=0o700, exist_ok=True)
    bad: Dict[str, str] = {}
    for node in nodes:
        doc = reports.get(node)
        if doc is None or not doc.get("plan_state"):
            continue
        if not doc.get("ok"):
            bad[node] = doc.get("error") or "no state"
            continue
        state = json.dumps(doc["facts"], sort_keys=True).encode() + b"\n" + _unpack(doc["state"])
        safefs.write_file(os.path.join(states_dir, node + ".state"), state, 0o600, sync=False)
    return bad


def missing(
    nodes: List[str], states_dir: str, engine_err: List[str], bad: Dict[str, str]
) -> Dict[str, str]:
    """{node: why} for every node without a state: what the engine said of it, or its error."""
    err: List[str] = []
    for path in engine_err:
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                err += fh.read().splitlines()
    out: Dict[str, str] = {}
    for node in nodes:
        if os.path.exists(os.path.join(states_dir, node + ".state")):
            continue
        said = [ln.strip() for ln in err if re.search(r"(^|[\s:])%s\b" % re.escape(node), ln)]
        said = [ln[len(node) + 2 :] if ln.startswith(node + ": ") else ln for ln in said]
        out[node] = bad.get(node) or " | ".join(said[-2:]) or "no answer (node down or unreachable)"
    return out


def judge(
    args: argparse.Namespace, states_dir: str, node: str, src: List[list], src_stat: str
) -> dict:
    """One node, as the single-host plan judges a destination: its changes and its side."""
    facts, rows = planstate.read_state(os.path.join(states_dir, node + ".state"))
    installed = facts.get("install")
    same = installed is not None and facts.get("installed_source_stat") == src_stat
    ch = liveplan.changes(src, rows, installed, same)
    # a node with a file changed there since its install takes the whole bundle (rbkit.fanout:
    # needs_full), not the changes alone
    whole = (
        argparse.Namespace(**dict(vars(args), incremental=False)) if ch["changed_there"] else args
    )
    got = liveplan.assess(whole, facts, src, src_stat, ch, installed)
    kind = UP_TO_DATE if got["up_to_date"] else OLDER if installed is not None else EVERYTHING
    return {"facts": facts, "changes": ch, "assess": got, "kind": kind}


def group(judged: Dict[str, dict], nodes: List[str]) -> List[dict]:
    """Nodes where a run does the same: the same kind, itemized changes, bytes and backups.
    Free space differs per node: each group names its least and the nodes short of room."""
    groups: Dict[str, dict] = {}
    for node in nodes:
        if node not in judged:
            continue
        judgement = judged[node]
        items = "\n".join(judgement["changes"]["items"])
        facts, got = judgement["facts"], judgement["assess"]
        key = json.dumps(
            [
                judgement["kind"],
                items,
                got["send"],
                got["need"],
                facts["evicts"],
                facts["exists"],
                facts["installed"],
            ],
            sort_keys=True,
        )
        group_doc = groups.setdefault(
            key,
            {
                "kind": judgement["kind"],
                "nodes": [],
                "items": judgement["changes"]["items"],
                "digest": hashlib.sha256(key.encode()).hexdigest(),
                "changes": {k: v for k, v in judgement["changes"].items() if k != "items"},
                "send_bytes": got["send"],
                "incremental": got["delta"],
                "disk": {"staging": got["staging"], "backup": got["backup"], "need": got["need"]},
                "exists": facts["exists"],
                "backups": facts["backups"],
                "evicts": facts["evicts"],
                "blockers": [],
                "short": [],
            },
        )
        group_doc["nodes"].append(node)
        free = facts["free_bytes"]
        if "free_min" not in group_doc or free < group_doc["free_min"]:
            group_doc.update(free_min=free, free_min_node=node, measured_at=facts["measured_at"])
        if got["need"] > free:
            group_doc["short"].append(node)
        for blocker in got["blockers"]:
            if not blocker.startswith("not enough room") and blocker not in group_doc["blockers"]:
                group_doc["blockers"].append(blocker)
    out = sorted(groups.values(), key=lambda g: nodes.index(g["nodes"][0]))
    for group_doc in out:
        group_doc["folded"] = fanreports.fold(group_doc["nodes"])
    return out


def compose(args: argparse.Namespace) -> int:
    work = args.dir
    nodes = [n for n in args.nodes.split(",") if n]
    sd = os.path.join(work, "nodes")
    src_stat, src = planstate.read_scan(os.path.join(work, "source.scan"))
    bad = save_states(sd, nodes, args.engine_out)
    down = missing(nodes, sd, args.engine_err, bad)
    judged = {n: judge(args, sd, n, src, src_stat) for n in nodes if n not in down}
    groups = group(judged, nodes)
    blockers: List[str] = []
    if down:
        blockers.append(
            "unreachable: %s (each named above, with what the engine said)"
            % fanreports.fold(sorted(down))
        )
    for number, group_doc in enumerate(groups, 1):
        group_doc["id"] = number
        group_doc["listing"] = os.path.join(work, "changes-%d.txt" % number)
        safefs.write_private(
            group_doc["listing"], "".join(line + "\n" for line in group_doc["items"])
        )
        if group_doc["short"]:
            blockers.append(
                "not enough room on %s: %s needed at %s, least free %s (%s)"
                % (
                    fanreports.fold(group_doc["short"]),
                    human(group_doc["disk"]["need"]),
                    group_doc["measured_at"],
                    human(group_doc["free_min"]),
                    group_doc["free_min_node"],
                )
            )
        blockers += ["%s: %s" % (group_doc["folded"], b) for b in group_doc["blockers"]]
    audit = liveplan.static_verdict(args)
    blockers += liveplan.source_blockers(args, audit)
    checks = json.loads(args.checks or "{}").get("checks") or []
    digests = {n: judged[n]["facts"]["digest"] for n in nodes if n in judged}
    plan = {
        "kind": "rb-plan",
        "schema": 1,
        "runbook": args.name,
        "spec_sha256": args.spec_sha,
        "kit_sha256": args.kit_sha,
        "made": args.made,
        "fanout": {"engine": args.engine, "nodes": fanreports.fold(nodes), "count": len(nodes)},
        "source": {
            "host": args.src_host,
            "path": args.src_path,
            "stat_fingerprint": src_stat,
            "files": int(args.source_files or 0),
            "bytes": int(args.source_bytes or 0),
        },
        # one digest over every node's state (what liveplan read answers), and each node's
        "destination": {
            "host": args.dst_host,
            "path": args.dest,
            "digest": hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest(),
            "nodes": digests,
        },
        "route": "",
        "compression": args.compression,
        "policy": args.policy,
        "groups": [{k: v for k, v in g.items() if k not in ("items",)} for g in groups],
        "unreachable": down,
        "static": audit,
        "checks": [c.get("id") for c in checks],
        "blockers": blockers,
    }
    safefs.write_private(
        os.path.join(work, "plan.json"), json.dumps(plan, indent=1, sort_keys=True) + "\n"
    )
    lines = screen(plan, groups, args, checks)
    print("\n".join(lines))
    if args.markdown:
        items: List[str] = []
        for group_doc in groups:
            items += ["# group %d: %s" % (group_doc["id"], group_doc["folded"])] + group_doc[
                "items"
            ]
        safefs.write_private(os.path.join(work, "plan.md"), planscreen.markdown(plan, items, lines))
    return 1 if blockers else 0


def screen(
    plan: dict, groups: List[dict], args: argparse.Namespace, checks: List[dict]
) -> List[str]:
    src, fan = plan["source"], plan["fanout"]
    out = [
        "plan for %s: %s:%s -> %d nodes %s:%s through %s"
        % (
            plan["runbook"],
            src["host"],
            src["path"],
            fan["count"],
            fan["nodes"],
            args.dest,
            fan["engine"],
        )
    ]
    out.append("  hosts:       %s" % args.hosts)
    out.append("  compression: %s" % args.compression_why)
    out.append(
        "  source:      %d files, %s (scan %s)"
        % (src["files"], human(src["bytes"]), src["stat_fingerprint"][:12])
    )
    out.append("  static:      %s" % plan["static"])
    names, head = [], True
    for check in checks:
        # the implied checks come first (compiler.implied), as the single-host plan says them
        head = head and check.get("type") in ("relocation", "kernel_audit")
        names.append(
            "%s%s%s"
            % (
                check.get("id"),
                " (implied)" if head else "",
                " (may skip)" if check.get("allow_skip") else "",
            )
        )
    out.append("  checks:      %s" % (", ".join(names) or "none"))
    answered = fan["count"] - len(plan["unreachable"])
    out.append(
        "  nodes:       %d answered, %d unreachable; on_existing %s"
        % (answered, len(plan["unreachable"]), plan["policy"])
    )
    pad = " " * 15
    for group_doc in groups:
        count = len(group_doc["nodes"])
        out.append(
            "  group %d:     %s (%d node%s): %s"
            % (
                group_doc["id"],
                group_doc["folded"],
                count,
                "" if count == 1 else "s",
                group_doc["kind"],
            )
        )
        ch = group_doc["changes"]
        if group_doc["kind"] == OLDER:
            out.append(
                pad
                + "%d added (%s), %d changed (%s), %d removed (%s); %d unchanged"
                % (
                    ch["added"],
                    human(ch["added_bytes"]),
                    ch["changed"],
                    human(ch["changed_bytes"]),
                    ch["removed"],
                    human(ch["removed_bytes"]),
                    ch["unchanged"],
                )
            )
            for line in group_doc["items"][: planscreen.SHOWN]:
                out.append(pad + "  " + line)
            if len(group_doc["items"]) > planscreen.SHOWN:
                out.append(pad + "  ... %d more" % (len(group_doc["items"]) - planscreen.SHOWN))
            out.append(pad + "every line: %s" % group_doc["listing"])
        elif group_doc["kind"] == EVERYTHING:
            out.append(
                pad
                + (
                    "exists, not an install of this tool"
                    if group_doc["exists"]
                    else "no install there"
                )
                + ": the whole tree"
            )
        if group_doc["kind"] == OLDER and ch["changed_there"]:
            out.append(
                pad + "%d changed there since the install: these nodes take the whole "
                "tree" % ch["changed_there"]
            )
        elif group_doc["kind"] == OLDER:
            out.append(
                pad
                + (
                    "only the changes, and %s of bin/ and pyvenv.cfg that relocation "
                    "rewrites (incremental)" % human(ch.get("rewritten_bytes", 0))
                    if group_doc["incremental"]
                    else "the whole tree"
                )
            )
        if group_doc["kind"] != UP_TO_DATE:
            room = (
                "NOT ENOUGH ROOM on " + fanreports.fold(group_doc["short"])
                if group_doc["short"]
                else "enough room"
            )
            out.append(
                pad
                + "to send %s; disk %s needed, least free %s (%s at %s): %s"
                % (
                    human(group_doc["send_bytes"]),
                    human(group_doc["disk"]["need"]),
                    human(group_doc["free_min"]),
                    group_doc["free_min_node"],
                    group_doc["measured_at"],
                    room,
                )
            )
        if plan["policy"] == "backup":
            out.append(
                pad
                + "backups: %d kept (keep_backups %s); evicts %s"
                % (
                    len(group_doc["backups"]),
                    args.keep_backups,
                    ", ".join(group_doc["evicts"]) if group_doc["evicts"] else "none",
                )
            )
    for node, why in sorted(plan["unreachable"].items()):
        out.append("  unreachable: %s: %s" % (node, why))
    for blocker in plan["blockers"]:
        out.append("  BLOCKED:     %s" % blocker)
    return [printable(line) for line in out]


# -- here: the plan against the nodes now ----------------------------------------------------------


def _moved(then_path: str, now_path: str) -> str:
    _f, then = planstate.read_state(then_path)
    facts, now = planstate.read_state(now_path)
    was, _r = planstate.read_state(then_path)
    then_rows, now_rows = {r[0]: r for r in then}, {r[0]: r for r in now}
    moved = sorted(p for p in set(then_rows) | set(now_rows) if then_rows.get(p) != now_rows.get(p))
    said = [
        shown(p)
        + (" (new)" if p not in then_rows else " (gone)" if p not in now_rows else " (changed)")
        for p in moved[:3]
    ]
    if (was.get("exists"), was.get("installed_record")) != (
        facts.get("exists"),
        facts.get("installed_record"),
    ):
        said.insert(
            0,
            paths.INSTALLED_MANIFEST + " (the install's record)"
            if facts.get("exists")
            else shown(facts["dest"]) + " (gone)",
        )
    return "%d paths (%s)" % (len(moved), ", ".join(said[:3]) or "its facts")


def drift(args: argparse.Namespace) -> int:
    plan = json.loads(proven.read_record(args.plan).decode("utf-8"))  # proven this user's
    plan_dir = os.path.dirname(os.path.abspath(args.plan))
    nodes = [n for n in args.nodes.split(",") if n]
    out: List[str] = []
    now_stat = planstate.read_scan(args.source_now)[0] if args.source_now else ""
    if now_stat and now_stat != plan["source"]["stat_fingerprint"]:
        count, first = liveplan.drift(args.plan, "source", args.source_now)
        out.append(
            "the source %s:%s: %d paths (%s)"
            % (plan["source"]["host"], plan["source"]["path"], count, first)
        )
    now_dir = os.path.join(args.dir, "nodes")
    bad = save_states(now_dir, nodes, args.engine_out)
    then = plan["destination"].get("nodes") or {}
    gone = []
    for node in nodes:
        now_state = os.path.join(now_dir, node + ".state")
        if not os.path.exists(now_state):
            gone.append(node + (" (%s)" % bad[node] if node in bad else ""))
            continue
        facts, _r = planstate.read_state(now_state)
        if facts["digest"] != then.get(node):
            was = os.path.join(plan_dir, "nodes", node + ".state")
            out.append(
                "node %s: %s"
                % (
                    node,
                    _moved(was, now_state)
                    if node in then and os.path.exists(was)
                    else "unreachable when planned",
                )
            )
    if gone:
        out.append("unreachable now: %s" % ", ".join(gone))
    for line in out:
        print("moved\t%s" % line)
    print("compression\t%s" % plan.get("compression", ""))
    return 1 if out else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="rbkit.fanplan")
    sub = parser.add_subparsers(dest="cmd", required=True)
    compose_cmd = sub.add_parser("compose")
    compose_cmd.add_argument("--dir", required=True)
    compose_cmd.add_argument("--nodes", required=True)
    compose_cmd.add_argument("--engine-out", action="append", required=True)
    compose_cmd.add_argument("--engine-err", action="append", default=[])
    for key in liveplan.COMPOSE_FIELDS + ("dest", "engine"):
        compose_cmd.add_argument("--" + key, default="")
    for flag in ("incremental", "markdown", "force"):
        compose_cmd.add_argument("--" + flag, action="store_true")
    drift_cmd = sub.add_parser("drift")
    drift_cmd.add_argument("--plan", required=True)
    drift_cmd.add_argument(
        "--dir", required=True, help="where this run keeps the nodes' states now"
    )
    drift_cmd.add_argument("--nodes", required=True)
    drift_cmd.add_argument("--engine-out", action="append", required=True)
    drift_cmd.add_argument("--source-now", default="")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "compose":
            ch = Choices.from_json(args.choices)
            args.policy, args.shared_parent = ch.on_existing, ch.shared_parent
            args.keep_backups = "" if ch.keep_backups is None else str(ch.keep_backups)
            args.same_host = False
            return compose(args)
        return drift(args)
    except (OSError, ValueError, KeyError) as exc:
        print("rbkit.fanplan %s: %s" % (args.cmd, exc), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
