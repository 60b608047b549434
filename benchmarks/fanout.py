"""`python -m benchmarks.fanout [--blob-mib 32] [--nodes 8]`: fan-out to many nodes, measured on the
mini-cluster of tests/lab/slurm.py (namespace nodes running sshd and slurmd; needs root).

Rows, each a whole runbook run from compile to the comparison:
  slurm 1 node / slurm N nodes   (sbcast --fanout 2 + one srun), inside salloc
  slurm N nodes re-run           (after one small file changed: the changes-only bundle)
  slurm N nodes again            (nothing changed: every node keeps its install, runs the checks)
  clush 1 node / clush N nodes   (flat: clush --copy, then one clush command), and its re-run
  ssh 1 node / ssh N sequential  (today's single-host runbook, one per node, one after the other)
For each: wall seconds, the runbook's step times, and the bytes this machine sent into the cluster
(the bridge's tx counter: node-to-node traffic is not counted). Prints a table and stores JSON in
benchmarks/results-fanout/fanout.json. The payload is the small test venv plus a blob of random
bytes (incompressible), so the copy is not free.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from compiler import cli
from tests.lab import subnets
from tests.lab.fanout import change_one_file, payload_with_blob, tx_bytes
from tests.lab.slurm import SlurmCluster, slurm_unavailable_reason

# not results/: docs/benchmarks.md is written from every JSON there (the transfer benchmark)
RESULTS = Path(__file__).resolve().parent / "results-fanout"
# each run installs at a path of its own: a node (or the single-host runbook) that already holds
# the tree keeps it, and the next row would measure nothing; a re-run row reuses its run's path
DEST = "/tmp/rbfan-bench/{name}/venv"
SSH_DEST = "/tmp/rbfan-bench/ssh-{name}/venv"


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} fanout-bench: {msg}", file=sys.stderr, flush=True)


def fan_spec(name: str, venv: Path, engine: str, nodes: str, c: SlurmCluster) -> str:
    extra = f"  ssh_config: {c.ssh_config}\n" if engine == "clush" else ""
    return f"""name: {name}
hosts:
  here: {{local: true}}
transfer:
  from: here:{venv}
  to: here:{DEST.format(name=name)}
  compression: zstd
  on_existing: replace
fanout:
  engine: {engine}
  nodes: {nodes}
  timeout_s: 600
{extra}checks:
  - imports: [rb_payload]
  - command: {{name: hello, run: "payload-hello"}}
"""


def ssh_spec(name: str, venv: Path, node: str, c: SlurmCluster) -> str:
    return f"""name: {name}
hosts:
  here: {{local: true}}
  node: {{ssh: root@{c.addr(node)}, identity_file: {c.dir}/id_ed25519,
          options: {{UserKnownHostsFile: {c.dir}/known_hosts}}}}
transfer:
  from: here:{venv}
  to: node:{SSH_DEST.format(name=name)}
  compression: zstd
  on_existing: replace
checks:
  - imports: [rb_payload]
  - command: {{name: hello, run: "payload-hello"}}
"""


class Bench:
    def __init__(self, c: SlurmCluster, work: Path) -> None:
        self.c, self.work = c, work

    def tx(self) -> int:
        return tx_bytes(self.c.bridge)

    def run(self, name: str, text: str, *, salloc: str | None = None) -> dict:
        d = self.work / name
        d.mkdir()
        (d / f"{name}.yaml").write_text(text)
        if cli.main([str(d / f"{name}.yaml"), "-o", str(d)]) != 0:
            raise SystemExit(f"{name}: does not compile")
        return self.again(name, salloc=salloc)

    def rerun(self, name: str, venv: Path, *, salloc: str | None = None) -> dict:
        """One small file changes on the source, then the runbook runs again."""
        change_one_file(venv)
        return self.again(name, salloc=salloc)

    def again(self, name: str, *, salloc: str | None = None) -> dict:
        """Run a compiled runbook (again: its run dir keeps the last fan-out's manifest)."""
        d = self.work / name
        argv = ["bash", str(d / f"{name}.sh")]
        if salloc:
            argv = self.c.salloc(argv, nodes=salloc)
        env = dict(self.c.env, RB_RUN_DIR=str(d / "run"))
        before, t0 = self.tx(), time.monotonic()
        p = subprocess.run(argv, cwd=d, env=env, capture_output=True, text=True, timeout=900)
        wall, sent = time.monotonic() - t0, self.tx() - before
        (d / "stderr.txt").write_text(p.stderr)
        if p.returncode != 0:
            raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}")
        doc = json.loads((d / "run" / "report.json").read_text())
        steps = {s["id"]: round(s.get("duration_s", 0.0), 2) for s in doc["steps"]}
        row = {"wall_s": round(wall, 2), "sent_bytes": sent, "steps": steps}
        pack = next((s.get("facts", {}) for s in doc["steps"] if s["id"] == "fan_pack"), {})
        if "bundle_bytes" in pack:
            row["bundle_bytes"] = int(pack["bundle_bytes"])
        nodes = [json.loads(f.read_text()) for f in (d / "run" / "fanout").glob("node-*.json")]
        if nodes:  # each node's own step times: their sum is the work the shared cores did
            per = [sum(s["seconds"] for s in n["steps"]) for n in nodes]
            row["node_work_s"] = {
                "sum": round(sum(per), 2),
                "max": round(max(per), 2),
                "cpu": round(sum(n.get("cpu_s", 0.0) for n in nodes), 2),
            }
        return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--blob-mib", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="print only")
    a = ap.parse_args(argv)
    reason = slurm_unavailable_reason()
    if reason:
        raise SystemExit(f"fanout benchmark: {reason}")
    n = a.nodes
    with tempfile.TemporaryDirectory(prefix="rbfan-bench-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        venv = payload_with_blob(work / "src" / "venv", a.blob_mib)
        with SlurmCluster(n, subnet=subnets.subnet("bench_fanout")) as c:
            log(f"{n} nodes up in {c.start_seconds:.1f} s")
            b = Bench(c, work)
            rows: dict[str, dict] = {}
            one = c.names[0]
            plan = [
                (
                    "slurm-1",
                    lambda: b.run("slurm1", fan_spec("slurm1", venv, "slurm", one, c), salloc=one),
                ),
                (
                    f"slurm-{n}",
                    lambda: b.run(
                        "slurmn", fan_spec("slurmn", venv, "slurm", c.nodeset, c), salloc=c.nodeset
                    ),
                ),
                ("clush-1", lambda: b.run("clush1", fan_spec("clush1", venv, "clush", one, c))),
                (
                    f"clush-{n}",
                    lambda: b.run("clushn", fan_spec("clushn", venv, "clush", c.nodeset, c)),
                ),
            ]
            # a re-run after one small file changed on the source: the changes-only bundle
            plan.insert(
                2,
                (
                    f"slurm-{n} re-run, 1 file changed",
                    lambda: b.rerun("slurmn", venv, salloc=c.nodeset),
                ),
            )
            plan.insert(
                3,
                (f"slurm-{n} again, nothing changed", lambda: b.again("slurmn", salloc=c.nodeset)),
            )
            plan.append((f"clush-{n} re-run, 1 file changed", lambda: b.rerun("clushn", venv)))
            for key, fn in plan:
                log(f"{key} ...")
                rows[key] = fn()
                log(f"{key}: {rows[key]['wall_s']} s, sent {rows[key]['sent_bytes'] / 1e6:.1f} MB")
            seq = []
            for i, node in enumerate(c.names):
                log(f"ssh {node} ...")
                seq.append(b.run(f"ssh{i}", ssh_spec(f"ssh{i}", venv, node, c)))
            rows["ssh-1"] = seq[0]
            rows[f"ssh-{n}-sequential"] = {
                "wall_s": round(sum(r["wall_s"] for r in seq), 2),
                "sent_bytes": sum(r["sent_bytes"] for r in seq),
                "steps": {"each_s": [r["wall_s"] for r in seq]},
            }
    result = {
        "nodes": n,
        "blob_mib": a.blob_mib,
        "bundle_bytes": rows[f"slurm-{n}"]["bundle_bytes"],
        "cores": os.cpu_count(),
        "rows": rows,
        "when": time.strftime("%Y-%m-%d"),
    }
    print(table(result))
    if not a.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "fanout.json").write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {RESULTS / 'fanout.json'}")
    return 0


def table(result: dict) -> str:
    rows, n = result["rows"], result["nodes"]
    bundle = result["bundle_bytes"]
    base = {
        "slurm": rows["slurm-1"]["wall_s"],
        "clush": rows["clush-1"]["wall_s"],
        "ssh": rows["ssh-1"]["wall_s"],
    }
    out = [
        f"bundle {bundle / 1e6:.1f} MB ({result['blob_mib']} MiB random + the small venv + the "
        f"kit), {n} nodes on {result['cores']} shared cores",
        "",
        "| run | wall s | x one node | bundle | sent by this machine | in whole bundles | "
        "nodes' CPU s | longest node s | slowest steps |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for key, r in rows.items():
        engine = key.split("-")[0]  # "x one node": against that engine's first, whole run
        steps = r["steps"]
        top = (
            ", ".join(
                f"{k} {v}"
                for k, v in sorted(
                    ((k, v) for k, v in steps.items() if isinstance(v, (int, float))),
                    key=lambda kv: -kv[1],
                )[:3]
            )
            if "each_s" not in steps
            else "each " + " ".join(f"{x:.1f}" for x in steps["each_s"])
        )
        w = r.get("node_work_s")
        work = f"{w.get('cpu', 0):.1f} | {w['max']:.1f}" if w else "- | -"
        size = f"{r['bundle_bytes'] / 1e6:.2f} MB" if "bundle_bytes" in r else "-"
        out.append(
            f"| {key} | {r['wall_s']:.1f} | {r['wall_s'] / base[engine]:.2f} | {size} | "
            f"{r['sent_bytes'] / 1e6:.1f} MB | {r['sent_bytes'] / bundle:.2f} | "
            f"{work} | {top} |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
