"""Cross-check the pure-Python fatbin reader against NVIDIA's cuobjdump (not a pytest module).

    python tests/probes/crosscheck_cuobjdump.py [--cuobjdump PATH] [--budget-s 150] FILE_OR_DIR...

For each shared object with GPU code: the SASS and PTX names (with counts) that
`cuobjdump --list-elf --list-ptx` lists, against those hostkit/rbprobes/fatbin.py reads from the
containers the runtime registers (`Scan.runtime_containers`: cuobjdump lists neither
`__nv_relfatbin` when a `.nv_fatbin` exists, nor fatbins kept in data sections, nor LTO-IR).
cuobjdump names a cubin by its ELF header, which does not mark family code, so our `sm_100f`
is compared as `sm_100` (counted in "f_normalised"); PTX keeps its suffix on both sides.
Prints one JSON document: per file the two multisets' differences and the time each side took.
Exit status 1 when any file differs.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "hostkit"))

from rbprobes import fatbin  # noqa: E402
from rbprobes.checks_static import candidate_files  # noqa: E402

_NAME = re.compile(r"(sm|compute)_([0-9]{2,3})([af]?)")


def find_cuobjdump(given):
    for c in [given, shutil.which("cuobjdump")] + sorted(
        glob.glob("/usr/local/cuda*/bin/cuobjdump"), reverse=True
    ):
        if c and os.access(c, os.X_OK):
            return c
    return None


def cuobjdump_names(tool, path, timeout_s=600.0):
    """Counter of "sm_90" / "compute_90" names that cuobjdump lists, and its raw output."""
    done = subprocess.run(
        [tool, "--list-elf", "--list-ptx", path], capture_output=True, text=True, timeout=timeout_s
    )
    names = collections.Counter()
    for line in done.stdout.splitlines():
        kind = "sass" if line.startswith("ELF file") else "ptx" if line.startswith("PTX") else None
        found = _NAME.findall(line.split(":", 1)[-1])
        if kind and found:
            _prefix, number, suffix = found[-1]
            names[("sm_" if kind == "sass" else "compute_") + number + suffix] += 1
    return names, done.stdout, done.stderr.strip()[-500:], done.returncode


def our_names(path):
    """Counter of names as cuobjdump would print them, the scan, and how many `f` were cut."""
    scan = fatbin.scan_file(path, embedded=False)
    names = collections.Counter()
    cut = 0
    for e in (e for c in scan.runtime_containers for e in c.entries):
        if e.kind == "sass" and e.suffix == "f":
            names["sm_%d" % e.number] += 1
            cut += 1
        elif e.kind in ("sass", "ptx"):
            names[e.name] += 1
    return names, scan, cut


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--cuobjdump")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=150.0,
        help="start no new cuobjdump run after this many seconds",
    )
    ap.add_argument("--raw-dir", help="save cuobjdump's output for each file here")
    ap.add_argument("--out", help="also write the JSON here, rewritten after every file")
    args = ap.parse_args(argv)
    tool = find_cuobjdump(args.cuobjdump)
    if not tool:
        print(json.dumps({"error": "cuobjdump not found"}))
        return 2
    files = []  # files in the order given; a directory's files smallest first
    for p in args.paths:
        for f in sorted(candidate_files(p), key=os.path.getsize):
            if f not in files:
                files.append(f)
    start = time.monotonic()
    results, differ, skipped = [], 0, []
    for path in files:
        t0 = time.monotonic()
        ours, scan, cut = our_names(path)
        t_ours = time.monotonic() - t0
        if not ours:
            continue
        if time.monotonic() - start > args.budget_s:
            skipped.append(path)
            continue
        t0 = time.monotonic()
        try:
            theirs, raw, err, rc = cuobjdump_names(
                tool, path, max(10.0, args.budget_s + 30 - (t0 - start))
            )
        except subprocess.TimeoutExpired:
            skipped.append(path + " (cuobjdump timed out)")
            continue
        t_theirs = time.monotonic() - t0
        if args.raw_dir:
            os.makedirs(args.raw_dir, exist_ok=True)
            with open(os.path.join(args.raw_dir, os.path.basename(path) + ".txt"), "w") as fh:
                fh.write(raw)
        only_ours = dict(ours - theirs)
        only_theirs = dict(theirs - ours)
        same = not only_ours and not only_theirs
        differ += not same
        results.append(
            {
                "file": path,
                "size_mb": round(os.path.getsize(path) / 2**20, 1),
                "entries": sum(ours.values()),
                "names": sorted(ours),
                "containers": len(scan.containers),
                "sections": sorted({c.section for c in scan.containers}),
                "same": same,
                "only_ours": only_ours,
                "only_cuobjdump": only_theirs,
                "f_normalised": cut,
                "cuobjdump_rc": rc,
                "cuobjdump_stderr": err,
                "ours_s": round(t_ours, 3),
                "cuobjdump_s": round(t_theirs, 3),
            }
        )
        if args.out:
            _write(args.out, tool, results, differ, skipped)
    doc = _write(args.out, tool, results, differ, skipped)
    print(json.dumps(doc, indent=1))
    return 1 if differ else 0


def _write(path, tool, results, differ, skipped):
    doc = {
        "cuobjdump": tool,
        "files_compared": len(results),
        "differ": differ,
        "not_compared_budget": skipped,
        "results": results,
    }
    if path:
        with open(path + ".tmp", "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(path + ".tmp", path)
    return doc


if __name__ == "__main__":
    sys.exit(main())
