"""Fan-out: the install on one node, and the comparison of every node's report.

`python -m rbkit.fanout node --dir DIR --dest DEST --old OLD --choices JSON ...` runs on each node
(started by the cluster engine: `srun` or `clush`). DIR is the private directory the node script
made for the bundle (RB_FAN_NODE_SCRIPT: the bundle moved there as BUNDLE, its owner, mode and
sha256 checked): it holds the unpacked bundle, `kit/` (this package), `manifest.jsonl`, and
`payload` (the tar stream, compressed as the run chose) unless the node script left it inside BUNDLE
(it does: the payload is then streamed from there into staging, written once on the node). It
installs through the install engine's steps (engine.install, the functions a single-host runbook's
destination runs too: stage, receive, verify, relocate, prove, swap with its post-swap proof,
exports, probe; a failure past the swap rolls back), holding the destination's lock, and
prints its report on stdout as `RBFAN NODE I/N CHUNK` lines: the compact JSON cut into chunks of
at most CHUNK characters, so every line is shorter than the 1 KiB messages in which slurmstepd
forwards task output (a longer line from one node could be cut and interleaved with another
node's output by srun; clush keeps nodes apart anyway).

A re-run's bundle carries only what changed since the last fan-out (`delta.names` lists it): the
node links its unchanged files from its install into staging and extracts the rest over them; a
node that lacks something the bundle does not carry (no earlier install, a file changed there, a
file that failed the digest check with `rerun: digest`) reports `needs_full` and installs
nothing. `nodes --which needs-full` names those nodes from the engine's output; the runbook sends
them the whole bundle in a second round.

`python -m rbkit.fanout compare --nodes N1,N2,... --engine-out OUT [--engine-out OUT2] --out-dir D
--success all|N` reads those lines back (any prefix such as clush's `node01: ` or srun's `3: ` is
ignored, chunks are put back together per node, in any order; a node's report in a later file
replaces its earlier one), writes each node's report, prints a nodes x checks table with identical
rows folded, names the odd nodes with what differs and the nodes that sent nothing, and exits 0
when the success policy holds.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import socket
import sys
from typing import Any, Dict, List, Optional

from rbrules import enginerules
from rbrules.shown import printable

from . import engine, fanreports, pathid, preflight, proof, runner
from .choices import add_run_options
from .lock import Lock

STEPS = enginerules.ENGINE_STEPS
PAYLOAD = "payload"  # the tar stream in the bundle, compressed as the run chose
BUNDLE = "bundle.tar"  # the bundle itself, in DIR (moved there by the node script)
LOCK_WAIT_S = float(enginerules.LOCK_WAIT_S)  # one rule: rbrules.enginerules
VOLATILE = re.compile(r"(duration|seconds|elapsed|_s$|^started$|^time|pid)")
SOURCE_IDENTITY = "source-identity.json"  # in the bundle: the source's pathid.identity
PRE = ("preflight",)  # a node's steps before the install's, in its report only when they fail


def check_source(ctx: runner.Context, path: str) -> runner.Result:
    """This node's destination is not the source, nor inside it, nor around it, whatever the
    names (a node that is the source host, or shares its file system): the source's identity
    (`path`, the bundle's SOURCE_IDENTITY, from the head's scan) against this node's
    pathid.identity of the destination, by pathid.same_or_nested; refused with the message of the
    single-host route's preflight. Nothing is written before it."""
    try:
        with open(path, encoding="utf-8") as fh:
            source = json.load(fh)
    except (OSError, ValueError) as exc:
        raise runner.StepError(
            "refusing to install %s: the bundle holds no source identity to "
            "compare it with (%s: %s); pack the bundle again: run the runbook "
            "from fan_pack" % (ctx.dest, path, exc)
        ) from None
    if not isinstance(source, dict) or not source.get("realpath"):
        raise runner.StepError(
            "refusing to install %s: %s is not a source identity; pack the "
            "bundle again: run the runbook from fan_pack" % (ctx.dest, path)
        )
    why = pathid.same_or_nested(source, pathid.identity(ctx.dest))
    if why:
        raise runner.StepError("refusing to install %s: %s" % (ctx.dest, why))
    return runner.Result("%s is apart from the source %s" % (ctx.dest, source["realpath"]))


def node(args: argparse.Namespace) -> int:
    """Install and probe on this node through the engine's steps (engine.install: the same
    functions a single-host runbook's destination runs); print the node's report. Exit 0 when
    every step passed, 3 when this node needs the whole bundle, else 1. With --state, the live
    plan's read-only look at the destination instead (rbkit.fanplan)."""
    if args.state:
        from . import fanplan

        return fanplan.node_state(args)
    dest = args.dest.rstrip("/")
    bundle = os.path.join(args.dir, BUNDLE)
    payload = os.path.join(args.dir, PAYLOAD)
    # the payload is read from inside the bundle file (the node script unpacked the rest), so a
    # node writes it once, into staging; a bundle unpacked whole has it as a file
    producer = (
        ["cat", "--", payload]
        if os.path.exists(payload)
        else ["tar", "-xOf", bundle, "./" + PAYLOAD]
    )
    delta = os.path.join(args.dir, "delta.names")
    # the engine's name for this node: Slurm's (it may differ from the hostname), else the hostname
    name = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    doc: Dict[str, Any] = {"node": name, "dest": dest, "steps": [], "ok": False, "probe": None}
    logs: List[str] = []
    ctx = runner.Context(
        dest,
        args.choices,
        old=args.old,
        compression=args.compression,
        manifest=os.path.join(args.dir, "manifest.jsonl"),
        probe_config=args.probe_config,
        capture=True,
        log=logs.append,
    )
    ctx.state = runner.make_state()
    lock = Lock(
        dest, "fan-out node %s (%s)" % (name, args.choices.origin), LOCK_WAIT_S, logs.append
    )
    try:
        # never into the source (before the lock: nothing is written beside a refused one)
        pre = runner.run(ctx, "preflight", check_source, os.path.join(args.dir, SOURCE_IDENTITY))
        if pre["status"] != "failed":
            runner.run(ctx, "lock", preflight.take_lock, lock)
        rc = (
            engine.install(ctx, producer, delta if os.path.exists(delta) else None)
            if ctx.locked
            else 1
        )
        engine.finish(ctx)
        _report(doc, ctx.events, rc)  # before the state goes: the checks' report is there
    finally:
        proof.stop_background(ctx)
        lock.release()
        shutil.rmtree(ctx.state, ignore_errors=True)
    # CPU seconds of this node's install (its children and itself): what the node's cores did
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_CHILDREN, resource.RUSAGE_SELF)]
    doc["cpu_s"] = round(sum(r.ru_utime + r.ru_stime for r in ru), 2)
    fanreports.emit(doc)
    if rc in (0, 3):
        # installed, or the whole bundle comes next (under a new name): the bundle and its
        # unpacked kit leave the node's scratch
        shutil.rmtree(args.dir, ignore_errors=True)
    else:
        # failed: the kit stays, for a restore by hand (docs/fanout.md); the bundle goes (a
        # re-run, --from fan_install too, sends a new one)
        try:
            os.unlink(bundle)
        except OSError:
            pass
    return rc


def _report(doc: Dict[str, Any], events: List[dict], rc: int) -> None:
    """The node's report from the engine's events: one entry per step (id, ok, rc, seconds, and
    the error or why it was skipped), and what the comparison and the re-run read."""
    for event in events:
        facts = event.get("facts") or {}
        if event["step"] in PRE + ("lock", "current", "finish"):
            if facts.get("up_to_date"):
                doc["up_to_date"] = event["detail"]
            if event["status"] != "failed":
                continue  # named in the report only when it failed
        entry: Dict[str, Any] = {
            "id": event["step"],
            "ok": event["status"] != "failed",
            "rc": facts.get("rc", 0) if event["status"] == "failed" else 0,
            "seconds": event["duration_s"],
        }
        if event["status"] == "failed":
            entry["error"] = event.get("error") or [event["detail"]]
        if event["status"] == "skipped":
            entry["skipped"] = event["detail"].replace("skipped: ", "", 1)
        doc["steps"].append(entry)
        if event["step"] == "stage" and facts.get("delta"):
            doc["delta"] = {
                k: facts.get(k) for k in ("linked", "linked_bytes", "send_files", "send_bytes")
            }
        if event["step"] == "stage" and facts.get("needs_full"):
            doc["needs_full"] = event["detail"].replace("needs the whole bundle: ", "", 1)
        if event["step"] == "verify":
            doc["verify"] = {k: facts.get(k) for k in ("checked", "hashed", "linked", "streamed")}
        if event["step"] == "swap" and facts.get("previous"):
            doc["previous"] = facts["previous"]
        if event["step"] == "rollback" and event["status"] == "ok":
            doc["rolled_back"] = facts
        if event["step"] == "probe" and facts.get("report"):
            try:
                with open(facts["report"], encoding="utf-8") as fh:
                    doc["probe"] = json.load(fh)
            except (OSError, ValueError):
                pass
    doc["ok"] = rc == 0


def _stable(values: Any) -> Any:
    if isinstance(values, dict):
        return {k: _stable(v) for k, v in sorted(values.items()) if not VOLATILE.search(str(k))}
    if isinstance(values, list):
        return [_stable(v) for v in values]
    return values


def cells(doc: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """One node's row: column -> {"status": pass|fail|skip|-, "detail": what to compare}."""
    row: Dict[str, Dict[str, Any]] = {}
    if doc is None:
        return row
    for step in doc.get("steps", []):
        if step["id"] == "probe":
            continue
        row[step["id"]] = {
            "status": "pass" if step["ok"] else "fail",
            "detail": None if step["ok"] else "; ".join(step.get("error", []))[:300],
        }
    probe = doc.get("probe") or {}
    for check in probe.get("checks", []):
        detail = check.get("reason") or ""
        row["check:" + str(check.get("id"))] = {
            "status": check.get("status", "?"),
            "detail": detail[:300],
            "values": _stable(check.get("values") or {}),
        }
    return row


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= 160 else text[:157] + "..."


def compare(
    nodes: List[str], reports: Dict[str, Dict[str, Any]], engine_err: List[str], success: str
) -> Dict[str, Any]:
    rows = {n: cells(reports.get(n)) for n in nodes}
    # a step before the install's is in a report only when it failed: every other node that
    # reported passed it
    pre = [s for s in PRE if any(s in r for r in rows.values())]
    for name in nodes:
        for step in pre:
            if name in reports:
                rows[name].setdefault(step, {"status": "pass", "detail": None})
    columns: List[str] = pre + [
        s for s in STEPS if s != "probe" and any(s in r for r in rows.values())
    ]
    for row in rows.values():
        for col in row:
            if col.startswith("check:") and col not in columns:
                columns.append(col)
    if any("rollback" in r for r in rows.values()):
        columns.append("rollback")  # last: what happened after the checks
    # fold identical rows (status and compared values per column)
    groups: Dict[str, List[str]] = {}
    for name in nodes:
        if name not in reports:
            continue
        key = json.dumps(
            {
                c: [rows[name].get(c, {}).get("status", "-"), rows[name].get(c, {}).get("values")]
                for c in columns
            },
            sort_keys=True,
        )
        groups.setdefault(key, []).append(name)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), nodes.index(g[0])))
    majority = ordered[0][0] if ordered else None
    odd: Dict[str, List[str]] = {}
    for name in nodes:
        if name not in reports or name == majority or (ordered and name in ordered[0]):
            continue
        diffs = []
        not_run = []
        for column in columns:
            mine, ref = rows[name].get(column, {}), rows[majority].get(column, {})
            if column not in rows[name] and column in rows[majority]:
                not_run.append(column)
            elif mine.get("status", "-") != ref.get("status", "-"):
                what = "%s: %s (others: %s)" % (
                    column,
                    mine.get("status", "not run"),
                    ref.get("status", "not run"),
                )
                if mine.get("detail"):
                    what += ": " + mine["detail"]
                diffs.append(what)
            elif mine.get("values") != ref.get("values"):
                mv, rv = mine.get("values") or {}, ref.get("values") or {}
                for field in sorted(set(mv) | set(rv)):
                    if mv.get(field) != rv.get(field):
                        diffs.append(
                            "%s.%s: %s (others: %s)"
                            % (column, field, _short(mv.get(field)), _short(rv.get(field)))
                        )
        if not_run:
            diffs.append("not run after that: " + ", ".join(not_run))
        odd[name] = diffs
    missing: Dict[str, List[str]] = {}
    for name in nodes:
        if name not in reports:
            said = [ln.strip() for ln in engine_err if re.search(r"\b%s\b" % re.escape(name), ln)]
            missing[name] = said[-3:] or ["no report came back (node unreachable or killed)"]
    good = [n for n in nodes if reports.get(n, {}).get("ok")]
    need = len(nodes) if success == "all" else int(success)
    return {
        "nodes": nodes,
        "columns": columns,
        "groups": ordered,
        "odd": odd,
        "missing": missing,
        "ok_nodes": good,
        "failed_nodes": [n for n in nodes if n in reports and n not in good],
        "success": success,
        "needed": need,
        "passed": len(good) >= need,
        "rolled_back": {
            n: reports[n]["rolled_back"]
            for n in nodes
            if n in reports and reports[n].get("rolled_back")
        },
        "rows": {
            n: {c: rows[n].get(c, {}).get("status", "-") for c in columns}
            for n in nodes
            if n in reports
        },
    }


def table(result: Dict[str, Any]) -> str:
    cols = result["columns"]
    short = [c[6:] if c.startswith("check:") else c for c in cols]
    head = ["nodes"] + short
    body = []
    for group in result["groups"]:
        body.append([fanreports.fold(group)] + [result["rows"][group[0]][c] for c in cols])
    for name in result["missing"]:
        body.append([name] + ["-"] * len(cols))
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in [head] + body]
    for name, diffs in result["odd"].items():
        lines.append("odd node %s: %s" % (name, "; ".join(diffs) or "differs"))
    for name, why in result["missing"].items():
        lines.append("no report from %s: %s" % (name, " | ".join(why)))
    for name, back in sorted(result.get("rolled_back", {}).items()):
        lines.append(
            "rolled back %s: its checks failed, the previous install is in place again; "
            "the one that failed is kept at %s" % (name, back.get("kept_current_as"))
        )
    lines.append(
        "%d/%d nodes passed; success policy %s needs %d: %s"
        % (
            len(result["ok_nodes"]),
            len(result["nodes"]),
            result["success"],
            result["needed"],
            "met" if result["passed"] else "NOT met",
        )
    )
    # what the nodes said may name their files: never raw to a terminal (rbrules.shown)
    return "\n".join(printable(line) for line in lines)


def cmd_nodes(args: argparse.Namespace) -> int:
    """The nodes whose report (in one engine output) asks for the whole bundle, or passed."""
    nodes = [n for n in args.nodes.split(",") if n]
    reports = fanreports.read_reports(nodes, [args.engine_out])
    if args.which == "passed":
        print(",".join(n for n in nodes if (reports.get(n) or {}).get("ok")))
    else:
        print(",".join(fanreports.pending(reports, nodes)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    nodes = [n for n in args.nodes.split(",") if n]
    reports = fanreports.read_reports(nodes, args.engine_out)
    err: List[str] = []
    for path in args.engine_err:
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as fh:
                err += fh.read().splitlines()
    result = compare(nodes, reports, err, args.success)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, doc in reports.items():
        with open(os.path.join(args.out_dir, "node-%s.json" % name), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=True)
        if doc.get("probe"):
            with open(
                os.path.join(args.out_dir, "probe-%s.json" % name), "w", encoding="utf-8"
            ) as fh:
                json.dump(doc["probe"], fh, indent=2, sort_keys=True)
    with open(os.path.join(args.out_dir, "fanout.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=2, sort_keys=True)
    print(table(result), file=sys.stderr)
    # for the runbook: `set KEY VALUE` lines, as the engine answers (serve.py)
    facts = {
        "passed": int(result["passed"]),
        "ok": len(result["ok_nodes"]),
        "nodes": len(nodes),
        "odd": fanreports.fold(sorted(result["odd"])) if result["odd"] else "",
        "missing": fanreports.fold(sorted(result["missing"])) if result["missing"] else "",
        "rolled_back": fanreports.fold(sorted(result["rolled_back"]))
        if result["rolled_back"]
        else "",
    }
    for key, value in sorted(facts.items()):
        print("set\t%s\t%s" % (key, value))
    print(
        "done\t%s\t%d/%d nodes passed"
        % ("ok" if result["passed"] else "failed", len(result["ok_nodes"]), len(nodes))
    )
    return 0 if result["passed"] else 1


def _verdict(doc: Dict[str, Any]) -> str:
    """A node's report in a few words: ok, needs the whole bundle, or the step that failed."""
    if doc.get("needs_full"):
        return "needs the whole bundle"
    if doc.get("ok"):
        return "up to date" if doc.get("up_to_date") else "ok"
    failed = [s["id"] for s in doc.get("steps") or [] if not s.get("ok")]
    checks = [
        str(c.get("id"))
        for c in (doc.get("probe") or {}).get("checks") or []
        if isinstance(c, dict) and c.get("status") == "fail"
    ]
    if failed and failed[0] != "probe" or not checks:
        return "failed in %s" % failed[0] if failed else "failed"
    return "failed check%s %s" % ("s" if len(checks) > 1 else "", ", ".join(checks[:3]))


def watch(
    nodes: List[str],
    path: str,
    stop: str,
    every: float,
    limit: float,
    out=None,
    clock=None,
    sleep=None,
) -> int:
    """Progress of one engine round, as its nodes finish: read the engine's output as it grows
    (whole lines only), and print a line when a node's report is complete (`node03 ok: 3/8 nodes
    done (1 failed), 5 running`) and, between those, every `every` seconds. Ends when the file
    `stop` exists (the round ended: a last line with the count), when every node reported, or
    after `limit` seconds. A bounded loop; it never fails the round it watches."""
    import time

    out = out or sys.stdout
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    parent = os.getppid()  # the runbook's job: gone (killed, ^C) ends the watch
    start = last = clock()
    seen: Dict[str, str] = {}
    lines: List[str] = []
    offset, rest = 0, ""

    def say(text: str) -> None:
        out.write(text + "\n")
        out.flush()

    def count() -> str:
        bad = sum(1 for v in seen.values() if v != "ok" and v != "up to date")
        running = len(nodes) - len(seen)
        return "%d/%d nodes done%s%s" % (
            len(seen),
            len(nodes),
            " (%d not ok)" % bad if bad else "",
            ", %d running" % running if running else "",
        )

    while True:
        stopped = os.path.exists(stop)  # before the read: what came before the stop is read
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
        except OSError:
            data = b""
        offset += len(data)
        text = rest + data.decode("utf-8", "replace")
        complete, _, rest = text.rpartition("\n")
        if complete:
            lines += complete.split("\n")
            for name, doc in sorted(
                fanreports.match_nodes(nodes, fanreports.parse_reports(lines)).items()
            ):
                if name not in seen:
                    seen[name] = _verdict(doc)
                    last = clock()
                    say("%s %s: %s, %.0f s" % (name, seen[name], count(), last - start))
        now = clock()
        if os.getppid() != parent:
            return 0
        if stopped or len(seen) == len(nodes) or now - start >= limit:
            if len(seen) < len(nodes):
                say("%s when the round ended, %.0f s" % (count(), now - start))
            return 0
        if now - last >= every:
            last = now
            say("%s, %.0f s" % (count(), now - start))
        sleep(min(1.0, every))


def cmd_watch(args: argparse.Namespace) -> int:
    return watch(
        [n for n in args.nodes.split(",") if n], args.engine_out, args.stop, args.every, args.limit
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rbkit.fanout", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    node_cmd = sub.add_parser("node")
    node_cmd.add_argument("--dir", required=True)
    add_run_options(node_cmd)  # --dest, --old, --compression, --probe-config, --choices
    node_cmd.add_argument(
        "--state",
        action="store_true",
        help="the live plan: this node's destination, read-only (rbkit.fanplan)",
    )
    node_cmd.set_defaults(fn=node)
    compare_cmd = sub.add_parser("compare")
    compare_cmd.add_argument("--nodes", required=True)
    compare_cmd.add_argument(
        "--engine-out",
        action="append",
        required=True,
        help="engine output; repeated: a later file's reports replace earlier ones",
    )
    compare_cmd.add_argument("--engine-err", action="append", default=[])
    compare_cmd.add_argument("--success", default="all")
    compare_cmd.add_argument("--out-dir", required=True)
    compare_cmd.set_defaults(fn=cmd_compare)
    nodes_cmd = sub.add_parser(
        "nodes", help="nodes of one engine output that need the whole bundle, or that passed"
    )
    nodes_cmd.add_argument("--which", choices=("needs-full", "passed"), required=True)
    nodes_cmd.add_argument("--nodes", required=True)
    nodes_cmd.add_argument("--engine-out", required=True)
    nodes_cmd.set_defaults(fn=cmd_nodes)
    watch_cmd = sub.add_parser("watch", help="print the round's progress as its nodes finish")
    watch_cmd.add_argument("--nodes", required=True)
    watch_cmd.add_argument("--engine-out", required=True)
    watch_cmd.add_argument("--stop", required=True, help="the round ended when this file exists")
    watch_cmd.add_argument("--every", type=float, default=10.0)
    watch_cmd.add_argument("--limit", type=float, default=3600.0)
    watch_cmd.set_defaults(fn=cmd_watch)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
