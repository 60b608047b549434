"""The kernel audit's decoding limits, measured (issue 33 N8): not a test, a benchmark to run by
hand.

    .venv/bin/python tests/probes/bench_decode_budget.py [--hostkit DIR] [case ...]

--hostkit: another copy of hostkit/ to measure (e.g. `git archive 24efc9a hostkit | tar -x -C
/tmp/old` and --hostkit /tmp/old/hostkit: the code before the limits).

Each case is a venv-like directory of hand-made shared objects whose fatbin entries are LZ4 "bombs"
(one literal, then one match that repeats it: ~1 MB of input per 256 MiB of output), for sm_80, so
that an audit for sm_90 decodes them (a unit without a path is read for its kernels). Each audit
runs in a fresh process (one worker, RBPROBES_AUDIT_JOBS=1); printed: its wall time, its peak RSS
(ru_maxrss of the audit's process), and the failing file's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from probes_helpers import fatbin_container, fatbin_entry, tiny_so  # noqa: E402

LZ4 = 0x2011
MIB = 1 << 20


def lz4_bomb(out_size: int) -> bytes:
    """An LZ4 block that decodes to `out_size` bytes of "a": one literal, one match at offset 1."""
    rest = out_size - 1 - 4 - 15  # match length beyond the token's 15 + minimum 4
    return bytes([0x1F]) + b"a" + b"\x01\x00" + b"\xff" * (rest // 255) + bytes([rest % 255])


def build(d: Path, files: int, entries: int, out_size: int) -> None:
    bomb = lz4_bomb(out_size)
    for f in range(files):
        body = b"".join(
            fatbin_container(fatbin_entry(2, 80, LZ4, bomb, usize=out_size)) for _ in range(entries)
        )
        (d / ("libbomb%d.so" % f)).write_bytes(tiny_so(body))


CASES = {  # name: (files, entries per file, decoded size of each entry)
    "issue": (1, 10, 256 * MIB),  # the issue's: ten 1 MB entries of 256 MiB each
    "ten-files": (10, 1, 256 * MIB),  # the same, one entry per file
    "at-cap": (1, 20, 128 * MIB),  # twenty entries of 128 MiB (the new per-entry cap)
}

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
from rbprobes import auditverdict, checks_static
t = time.monotonic()
v = checks_static.audit(sys.argv[1], (9, 0))
out = auditverdict.judge_audit(v)
import resource
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"s": time.monotonic() - t, "peak": peak, "status": out.status,
                  "reason": out.reason[:400]}))
"""


def measure(name: str, hostkit: Path = ROOT / "hostkit") -> None:
    files, entries, size = CASES[name]
    with tempfile.TemporaryDirectory(prefix="rb-bench-decode-") as tmp:
        build(Path(tmp), files, entries, size)
        on_disk = sum(p.stat().st_size for p in Path(tmp).iterdir())
        t0 = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", CHILD, tmp, str(hostkit)],
            capture_output=True,
            text=True,
            env=dict(os.environ, RBPROBES_AUDIT_JOBS="1"),
        )
        wall = time.monotonic() - t0
    if done.returncode != 0:
        print(name, "failed:", done.stderr[-2000:])
        return
    got = json.loads(done.stdout.splitlines()[-1])
    print(
        "%-10s %d file(s) x %d entries of %d MiB (%.1f MB on disk): audit %.2f s, process %.2f s,"
        " peak RSS %.0f MiB, %s: %s"
        % (
            name,
            files,
            entries,
            size // MIB,
            on_disk / 1e6,
            got["s"],
            wall,
            got["peak"],
            got["status"],
            got["reason"],
        )
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    kit = ROOT / "hostkit"
    if args[:1] == ["--hostkit"]:
        kit, args = Path(args[1]).resolve(), args[2:]
    for case in args or list(CASES):
        measure(case, kit)
