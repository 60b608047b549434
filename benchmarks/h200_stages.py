"""Where the H200's transfer goes: each stage of the runbook's stream added to raw tar | tar,
one at a time
(run on the GPU host from the repository root: python3 benchmarks/h200_stages.py)."""

import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "hostkit"))
from rbkit import manifest, tarstream

SRC, DST = "/opt/torch/.venv", "/opt/rbstage"


def fresh():
    shutil.rmtree(DST, ignore_errors=True)
    os.makedirs(DST)
    subprocess.run(["sync"])


def sh(name, cmd):
    fresh()
    t = time.monotonic()
    rc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd]).returncode
    print("%-44s %6.2f s rc=%s" % (name, time.monotonic() - t, rc), flush=True)


HERE = os.path.dirname(os.path.abspath(__file__))
reader = "PYTHONPATH=%s/../hostkit python3 %s/h200_stages.py reader" % (HERE, HERE)
if sys.argv[1:2] == ["reader"]:
    algo, workers = sys.argv[2], int(sys.argv[3])
    p = subprocess.Popen(["tar", "-C", DST, "-xf", "-"], stdin=subprocess.PIPE)
    d = tarstream.Digester(algo, workers)
    d.stage(0, p.stdin.fileno())
    p.stdin.close()
    rc = p.wait()
    d.close()
    print("  reader: %d digests" % len([v for v in d.result().values() if v]), file=sys.stderr)
    sys.exit(rc)
subprocess.run("tar -C %s -cf - . | cat >/dev/null" % SRC, shell=True)
for _round in range(2):
    sh("raw tar c | tar x", "tar -C %s -cf - . | tar -C %s -xf -" % (SRC, DST))
    sh(
        "tar c | pv -n | tar x",
        "tar -C %s -cf - . | pv -f -n -b -i 5 2>/dev/null | tar -C %s -xf -" % (SRC, DST),
    )
    sh("tar c | reader(none) | tar x", "tar -C %s -cf - . | %s none 0" % (SRC, reader))
    sh(
        "tar c | reader(sha256, 8 workers) | tar x",
        "tar -C %s -cf - . | %s sha256 8" % (SRC, reader),
    )
    sh(
        "tar c | reader(sha256, 15 workers) | tar x",
        "tar -C %s -cf - . | %s sha256 15" % (SRC, reader),
    )
    sh(
        "tar c | cat | cat | tar x (two extra pipes)",
        "tar -C %s -cf - . | cat | cat | tar -C %s -xf -" % (SRC, DST),
    )
    t = time.monotonic()
    m = manifest.build(SRC, [], "sha256", 16)
    print("%-44s %6.2f s" % ("source manifest, sha256, 16 jobs", time.monotonic() - t), flush=True)
    t = time.monotonic()
    m = manifest.build(SRC, [], "none", 16)
    print("%-44s %6.2f s" % ("source walk, no digests", time.monotonic() - t), flush=True)
shutil.rmtree(DST, ignore_errors=True)
