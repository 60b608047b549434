"""`python -m benchmarks.node_rerun SOURCE --runbook generated/h200.sh --work DIR`: one fan-out
node's install of a real venv, whole, then as a re-run after one file changed on the source, then
once more with nothing changed (the node keeps its install and runs the checks).

It does on one machine what a fan-out runbook does for each node, with the same code: the source's
manifest (`rbkit manifest build`, then `--reuse` for the re-run), the payload as tar (+ zstd when
there), the bundle file, and on the "node" the runbook's node script (unpack the bundle, then
`rbkit.fanout node`: the install engine's steps, stage to probe). The
runbook named gives the checks, CUDA home, library order and env, as its fan-out would. The source
is a hard-link copy of SOURCE (`cp -al`, so SOURCE is never written) in which one small file is
then replaced. Prints each phase's seconds and the node's own step times; writes DIR/result.json.
Made for the lent GPU machine (docs/fanout.md, "A node on the H200"); runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rbkit import fanout, fanreports, manifest, manifestfile, pathid, sender, stream

from compiler.readback import read_settings

ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} node-rerun: {msg}", file=sys.stderr, flush=True)


def settings(runbook: Path) -> dict:
    """The runbook's settings (compiler.plan.read_settings)."""
    return read_settings(runbook.read_text())


class Timer:
    def __init__(self) -> None:
        self.phases: dict[str, float] = {}

    def run(self, name: str, fn):
        t0 = time.monotonic()
        result = fn()
        self.phases[name] = round(time.monotonic() - t0, 2)
        log(f"{name}: {self.phases[name]} s")
        return result


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, **kw)


def make_bundle(
    d: Path, src: Path, m: dict, names: list[str], comp: str, delta: bool = False
) -> Path:
    """What fan_pack makes: DIR/{manifest.jsonl, payload, kit/, delta.names} -> DIR.tar (payload:
    the engine's stream, compressed as `comp` says; delta.names, naming what the payload holds,
    only in a re-run's bundle), and the source's identity that each node checks its DEST with."""
    if d.exists():
        shutil.rmtree(d)
    (d / "kit").mkdir(parents=True)
    for package in ("rbrules", "rbkit", "rbprobes"):
        shutil.copytree(
            ROOT / "hostkit" / package,
            d / "kit" / package,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    with open(d / "manifest.jsonl", "w", encoding="utf-8") as f:
        manifestfile.dump(m, f)
    (d / fanout.SOURCE_IDENTITY).write_text(json.dumps(pathid.identity(str(src))))
    listing = d.parent / (d.name + ".names")
    lists = [listing, d / "delta.names"] if delta else [listing]
    for path in lists:
        with open(path, "wb") as f:
            manifestfile.write_names(names, f)
    with open(d / fanout.PAYLOAD, "wb") as out:
        codes, _ = stream.pipeline(
            sender.send_argvs(str(src), str(listing), comp),
            None,
            stdin=subprocess.DEVNULL,
            stdout=out,
        )
        if any(codes):
            raise SystemExit(f"the payload's stream failed: exit codes {codes}")
    sh(["tar", "-C", str(d), "-cf", str(d) + ".tar", "."])
    return Path(str(d) + ".tar")


def node(scratch: Path, dest: str, old: str, s: dict, comp: str) -> dict:
    """The runbook's node script on SCRATCH.tar (the bundle as the engine left it, its sha256
    pinned as a run pins it); returns the node's report."""
    script = s["RB_FAN_NODE_SCRIPT"]
    # the runbook's choices (CUDA, env), with this benchmark's policy, jobs, timeout and origin
    choices = dict(
        json.loads(s.get("RB_ENGINE_CHOICES") or "{}"),
        on_existing="replace",
        jobs="auto",
        timeout=900,
        origin="benchmarks.node_rerun",
    )
    args = [
        "--dest",
        dest,
        "--old",
        old,
        "--compression",
        comp,
        "--choices",
        json.dumps(choices),
        "--probe-config",
        s.get("RB_PROBE_CONFIG", ""),
    ]
    pin = subprocess.run(
        ["sha256sum", f"{scratch}.tar"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    p = subprocess.run(
        ["sh", "-c", script, "rb", f"{scratch}.tar", pin, *args],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    reports = fanreports.parse_reports(p.stdout.splitlines())
    if len(reports) != 1:
        raise SystemExit(
            f"no node report (exit {p.returncode}): {p.stdout[-2000:]} {p.stderr[-2000:]}"
        )
    doc = next(iter(reports.values()))
    if not doc["ok"]:
        raise SystemExit("node install failed: " + json.dumps(doc["steps"])[-3000:])
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.node_rerun",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("source")
    ap.add_argument("--runbook", type=Path, help="checks, CUDA and env from here (none without)")
    ap.add_argument("--work", type=Path, required=True, help="on the source's file system")
    ap.add_argument("--changed", default="", help="the file (relative) replaced for the re-run")
    a = ap.parse_args(argv)
    s = settings(a.runbook) if a.runbook else {}
    # the node script lives in fan-out runbooks; the other settings come from the runbook named
    s["RB_FAN_NODE_SCRIPT"] = settings(ROOT / "generated" / "cluster8.sh")["RB_FAN_NODE_SCRIPT"]
    excludes = s.get("RB_EXCLUDE_ARGS", [])[1::2]
    comp = "zstd" if shutil.which("zstd") else "none"
    jobs = os.cpu_count() or 4
    a.work.mkdir(parents=True, exist_ok=True)
    src = a.work / "src"
    dest = str(a.work / "node" / "venv")
    scratch = a.work / "scratch" / "rbfan-node"
    scratch.parent.mkdir(exist_ok=True)
    t = Timer()
    if src.exists():
        shutil.rmtree(src)
    if subprocess.run(["cp", "-al", a.source, str(src)], capture_output=True).returncode != 0:
        shutil.rmtree(src, ignore_errors=True)  # another file system: a real copy
        t.run("copy of the source", lambda: sh(["cp", "-a", a.source, str(src)]))
    m1 = t.run(
        "manifest (hash everything)", lambda: manifest.build(str(src), excludes, "sha256", jobs)
    )
    names = [e["p"] for e in m1["entries"]]
    b1 = t.run("pack the whole bundle", lambda: make_bundle(a.work / "b1", src, m1, names, comp))
    t.run("deliver the whole bundle (a copy)", lambda: shutil.copyfile(b1, f"{scratch}.tar"))
    first = t.run("node: whole install + checks", lambda: node(scratch, dest, a.source, s, comp))
    # one small, non-relocatable file changes on the source (a new file, not written through)
    rel = a.changed or next(
        e["p"]
        for e in m1["entries"]
        if e["t"] == "f"
        and e["p"].endswith("/__init__.py")
        and not manifest.relocatable(e["p"])
        and 0 < e["s"] < 4096
    )
    tmp = src / (rel + ".rb-new")
    shutil.copyfile(src / rel, tmp)
    with open(tmp, "a", encoding="utf-8") as f:
        f.write("\n# changed for benchmarks.node_rerun\n")
    os.replace(tmp, src / rel)
    m2 = t.run(
        "manifest again (reusing digests)",
        lambda: manifest.build(str(src), excludes, "sha256", jobs, reuse=m1),
    )
    d = manifest.delta(m2, m1)
    b2 = t.run(
        "pack the changes-only bundle",
        lambda: make_bundle(a.work / "b2", src, m2, d["send"], comp, delta=True),
    )
    t.run("deliver the changes-only bundle", lambda: shutil.copyfile(b2, f"{scratch}.tar"))
    second = t.run("node: re-run install + checks", lambda: node(scratch, dest, a.source, s, comp))
    assert (Path(dest) / rel).read_text().endswith("# changed for benchmarks.node_rerun\n")
    # the same bundle once more: nothing changed, the node keeps its install
    t.run("deliver it again", lambda: shutil.copyfile(b2, f"{scratch}.tar"))
    third = t.run("node: nothing changed + checks", lambda: node(scratch, dest, a.source, s, comp))
    assert third.get("up_to_date"), third
    result = {
        "source": a.source,
        "files": m1["totals"]["files"],
        "bytes": m1["totals"]["bytes"],
        "compression": comp,
        "changed": rel,
        "reused_digests": m2["reused"],
        "delta": {k: v for k, v in d.items() if k != "send"},
        "bundle_bytes": {"whole": b1.stat().st_size, "changes": b2.stat().st_size},
        "phases_s": t.phases,
        "node_steps_s": {
            "whole": {x["id"]: x["seconds"] for x in first["steps"]},
            "rerun": {x["id"]: x["seconds"] for x in second["steps"]},
            "unchanged": {x["id"]: x["seconds"] for x in third["steps"]},
        },
        "node_cpu_s": {
            "whole": first.get("cpu_s"),
            "rerun": second.get("cpu_s"),
            "unchanged": third.get("cpu_s"),
        },
        "rerun_linked": second.get("delta", {}),
        "checks": {c["id"]: c["status"] for c in (second.get("probe") or {}).get("checks", [])},
    }
    (a.work / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
