"""Synthetic runs for the pictures' tests and the README's example of a fan-out.

`python -m tests.picture_data OUT` writes OUT/two-host/ (a ct200 -> b300 move with progress samples
and a failed check; two-host-ok/ the same passing, two-host-interrupted/ stopped in its transfer)
and OUT/fanout/ (an 8-node fan-out, gpu05 odd, gpu07 missing): report.json,
events.tsv and, for the fan-out, fanout/fanout.json with node-*.json, as a runbook leaves them. Then
`python -m rbview --report OUT/fanout/report.json --events OUT/fanout/events.tsv --out DIR
--fanout OUT/fanout/fanout/fanout.json` draws them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rbkit import fanout, report

T0 = 1796300000000  # ms since the epoch: a fixed start, so the pictures are the same bytes


def events(lines: list[tuple]) -> str:
    return "".join("\t".join(str(f) for f in line) + "\n" for line in lines)


def check(cid: str, level: str, status: str, seconds: float, reason: str, **values) -> dict:
    return {
        "id": cid,
        "type": cid,
        "level": level,
        "status": status,
        "duration_s": seconds,
        "reason": reason,
        "values": values,
    }


def two_host(end: str = "failed") -> tuple[str, dict]:
    """(events.tsv text, {host: probe report}): preflight to probe, the transfer sampled every
    half second, the matmul check failing on b300. END "ok": every check passes; "interrupted":
    the run stops (SIGINT) in the transfer, 4 s in."""
    t, lines = T0, []
    plan = [
        ("preflight", "ct200->b300", 1400, "route relay, compression zstd"),
        ("manifest", "ct200", 5200, "16997 files hashed (sha256)"),
        ("transfer", "ct200->b300", 9600, "relay, compression zstd"),
        ("verify", "b300", 2100, "18353 entries match, 16997 files hashed (sha256)"),
        ("relocate", "b300", 700, "25 files rewritten"),
        ("swap", "b300", 400, "installed at /opt/sglang/.venv; previous: backup 1"),
        ("exports", "b300", 150, "/opt/sglang/.venv.env.sh"),
        ("probe", "b300", 6400, ""),
    ]
    for sid, host, ms, detail in plan:
        if end == "interrupted" and sid == "transfer":
            lines.append(("progress", sid, host, t, 0))
            lines.append(("progress", sid, host, t + 4000, 1_300_000_000))
            lines.append(("step", sid, "interrupted", t, t + 4000, host, "SIGINT"))
            return events(lines), {}
        if sid == "transfer":
            lines += [
                ("fact", sid, "bytes", 3_200_000_000),
                ("fact", sid, "files", 16997),
                ("fact", sid, "mb_s", 333),
            ]
            sent = 0
            for k in range(0, ms + 1, 500):  # slow start, a dip in the middle
                rate = 150 + 250 * min(1.0, k / 2500) - (180 if 5000 <= k < 6500 else 0)
                lines.append(("progress", sid, host, t + k, int(sent)))
                sent += rate * 1000 * 500
        status = "failed" if sid == "probe" and end == "failed" else "ok"
        if status == "failed":
            detail = "rc=1: 1 check failed on b300: matmul"
        lines.append(("step", sid, status, t, t + ms, host, detail))
        t += ms + 3
    probe = {
        "schema": 1,
        "host": "b300",
        "started": (t - 6403 + 800) / 1000.0,
        "duration_s": 5.2,
        "summary": {"pass": 3, "fail": 1, "skip": 0},
        "checks": [
            check("torch", "L1", "pass", 2.8, "torch 2.6.0+cu128, CUDA 12.8"),
            check("devices", "L1", "pass", 0.9, "8 x NVIDIA B300, driver 580.65"),
            check(
                "matmul",
                "L2",
                "fail",
                1.3,
                "sm_103 kernel image not found "
                "(torch built for sm_90): no kernel image is available",
            ),
            check("imports", "L1", "pass", 0.2, "sglang 0.5.2, flashinfer 0.3.1"),
        ],
    }
    if end == "ok":
        probe["checks"][2] = check("matmul", "L2", "pass", 1.3, "bf16 4096^3 matches on 8 devices")
        probe["summary"] = {"pass": 4, "fail": 0, "skip": 0}
    return events(lines), {"b300": probe}


NODES = ["gpu%02d" % i for i in range(1, 9)]


def node_report(i: int, name: str) -> dict:
    """One node's report as `rbkit.fanout node` prints it, times varying a little per node."""
    j = (i * 7) % 5 / 10.0
    steps = [
        ("stage", 0.1),
        ("receive", 6.1 + j),
        ("verify", 3.2 + j / 2),
        ("relocate", 0.6),
        ("prove", 0.1),
        ("swap", 0.2),
        ("exports", 0.1),
        ("probe", 5.4 + j),
    ]
    checks = [
        check(
            "torch",
            "L1",
            "pass",
            2.7 + j / 3,
            "torch 2.6.0+cu128, CUDA 12.8",
            version="2.6.0+cu128",
        ),
        check("devices", "L1", "pass", 0.4, "8 x NVIDIA H200", count=8, driver="570.124"),
        check("libraries", "L1", "pass", 0.1, "CUDA 12 libraries from the venv", foreign=[]),
        check("matmul", "L2", "pass", 1.1 + j / 4, "bf16 4096^3 matches on 8 devices"),
        check("imports", "L1", "pass", 0.2, "sglang 0.5.2, flashinfer 0.3.1"),
    ]
    ok = True
    if name == "gpu05":  # an old CUDA in LD_LIBRARY_PATH on one node
        checks[2] = check(
            "libraries",
            "L1",
            "fail",
            0.1,
            "libcudart.so.12 loaded from /usr/local/cuda-12.2/lib64, not the venv",
            foreign=["/usr/local/cuda-12.2/lib64/libcudart.so.12"],
        )
        ok = False
    return {
        "node": name,
        "ok": ok,
        "dest": "/opt/sglang/.venv",
        "cpu_s": 14.2,
        "steps": [
            {
                "id": s,
                "ok": s != "probe" or ok,
                "rc": 0 if s != "probe" or ok else 1,
                "seconds": round(sec, 3),
            }
            for s, sec in steps
        ],
        "probe": {
            "schema": 1,
            "host": name,
            "checks": checks,
            "summary": {"pass": 4 + ok, "fail": 1 - ok, "skip": 0},
        },
    }


def fanout_run() -> tuple[str, dict, dict]:
    """(events.tsv text, the comparison with the node reports under "reports", the reports)."""
    reports = {n: node_report(i, n) for i, n in enumerate(NODES, 1) if n != "gpu07"}
    err = [
        "gpu07: Connection to 10.0.3.17 closed by remote host.",
        "clush: gpu07: exited with exit code 255",
    ]
    result = fanout.compare(NODES, reports, err, "7")
    t, lines = T0, []
    plan = [
        ("fan_preflight", 1900, "8 nodes; source 3.2 GB in 16997 files; compression zstd"),
        ("fan_pack", 21400, "bundle 1.4 GB"),
        ("fan_copy", 14800, "clush --copy to 8 nodes (7 reached)"),
        ("fan_install", 17600, "7 nodes reported"),
        ("fan_compare", 300, "6/8 nodes passed (policy 7): NOT met"),
    ]
    for sid, ms, detail in plan:
        if sid == "fan_pack":
            lines += [("fact", sid, "bytes", 1_400_000_000), ("fact", sid, "mb_s", 65)]
        status = "failed" if sid == "fan_compare" else "ok"
        lines.append(("step", sid, status, t, t + ms, "login", detail))
        t += ms + 4
    return events(lines), result, reports


def _run_dir(
    d: Path, name: str, text: str, probes: dict, outcome: str = "failed", where: str = ""
) -> None:
    """events.tsv, the probe reports and report.json (built by rbkit.report) in D."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "events.tsv").write_text(text, encoding="utf-8")
    paths = {}
    for host, doc in probes.items():
        paths[host] = str(d / ("probe-%s.json" % host))
        Path(paths[host]).write_text(json.dumps(doc, indent=2, sort_keys=True), encoding="utf-8")
    doc = report.build(
        name, "specs/%s.yaml" % name, "0" * 64, str(d / "events.tsv"), paths, outcome, where=where
    )
    (d / "report.json").write_text(
        json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def write(out: Path) -> None:
    """The runs' files under OUT (see the module's docstring)."""
    _run_dir(out / "two-host", "b300", *two_host())
    _run_dir(out / "two-host-ok", "b300", *two_host("ok"), outcome="ok")
    _run_dir(
        out / "two-host-interrupted",
        "b300",
        *two_host("interrupted"),
        outcome="interrupted",
        where="in step transfer",
    )
    text, result, reports = fanout_run()
    _run_dir(out / "fanout", "cluster8", text, {n: r["probe"] for n, r in reports.items()})
    fan = out / "fanout" / "fanout"
    fan.mkdir(exist_ok=True)
    (fan / "fanout.json").write_text(json.dumps(result, indent=2, sort_keys=True), encoding="utf-8")
    for n, r in reports.items():
        (fan / ("node-%s.json" % n)).write_text(
            json.dumps(r, indent=2, sort_keys=True), encoding="utf-8"
        )


if __name__ == "__main__":
    write(Path(sys.argv[1]))
