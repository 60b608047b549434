"""What the fan-out end-to-end tests share: the spec they compile (every engine, the same checks),
compiling it, the precondition that fails in CI instead of skipping, and the node faults they
plant (a tar that corrupts what it extracts, a slow tar, a system module taken away)."""

from __future__ import annotations

import _sqlite3
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Optional

import pytest

from compiler import cli

from .fixtures import in_ci
from .payload import build_payload


def require(reason: Optional[str], what: str) -> None:
    """Skip when the cluster cannot run here, but never in CI: there it is a failure."""
    if reason:
        if in_ci():
            pytest.fail(f"{what} unavailable in CI: {reason}", pytrace=False)
        pytest.skip(f"{what} unavailable: {reason}")


def spec(
    name: str,
    venv: Path,
    dest: str,
    *,
    engine: str,
    nodes: str,
    success="all",
    on_existing: str = "replace",
    connect_timeout: int = 5,
    extra: str = "",
) -> str:
    """A fan-out spec: this machine is source and head; every node installs at `dest` and checks
    `import rb_payload, sqlite3` and the payload's console script. `extra`: more `fanout:` lines."""
    return f"""name: {name}
hosts:
  here: {{local: true}}
transfer:
  from: here:{venv}
  to: here:{dest}
  compression: zstd
  exclude: [__pycache__, '*.pyc']
  on_existing: {on_existing}
  jobs: 2
fanout:
  engine: {engine}
  nodes: {nodes}
  success: {success}
  timeout_s: 120
  connect_timeout: {connect_timeout}
{extra}checks:
  - imports: [rb_payload, sqlite3]
  - command: {{name: hello, run: "payload-hello"}}
"""


def build(out: Path, text: str, name: str) -> Path:
    """Compile `text` into out/NAME.sh (through the compiler's own entry point)."""
    p = out / f"{name}.yaml"
    p.write_text(text)
    assert cli.main([str(p), "-o", str(out)]) == 0
    return out / f"{name}.sh"


def _tar_wrapper(d: Path, body: str) -> Path:
    d.mkdir(parents=True)
    (d / "tar").write_text("#!/bin/sh\n" + body)
    (d / "tar").chmod(0o755)
    return d


def corrupting_tar(d: Path) -> Path:
    """A dir holding a `tar` that appends a line to pyvenv.cfg of every staging copy it extracts
    (a bad disk): bind it over a node's /usr/local/sbin."""
    return _tar_wrapper(
        d,
        '/usr/bin/tar "$@"; rc=$?\nfor a in "$@"; do case "$a" in\n'
        '  *.rb-staging) printf "#bitrot\\n" >>"$a/pyvenv.cfg" ;; esac; done\n'
        "exit $rc\n",
    )


def slow_tar(d: Path, seconds: int) -> Path:
    """A dir holding a `tar` that waits before extracting a staging copy: time to take the node
    down while it installs."""
    return _tar_wrapper(
        d, f'case "$*" in *rb-staging*) sleep {seconds} ;; esac\nexec /usr/bin/tar "$@"\n'
    )


def sqlite_module() -> str:
    """The interpreter's _sqlite3 extension (the payload venvs' base python is this one): bind
    /dev/null over it in a node's mount namespace and `import sqlite3` fails there only."""
    return _sqlite3.__file__


def payload_with_blob(dest: Path, mib: int = 8) -> Path:
    """A private small payload venv at `dest` (tests change it) with `mib` MiB that no compressor
    shrinks in site-packages/rb_blob.bin, so a bundle's size is felt on the wire."""
    venv = build_payload("small", dest=dest).venv
    (site_packages(venv) / "rb_blob.bin").write_bytes(os.urandom(mib << 20))
    return venv


def site_packages(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def change_one_file(venv: Path) -> str:
    """Append a line to rb_payload/__init__.py on the source; returns the line."""
    line = "RB_RERUN_MARK = 1\n"
    with open(site_packages(venv) / "rb_payload" / "__init__.py", "a", encoding="utf-8") as f:
        f.write(line)
    return line


def step_facts(run_dir: Path, step: str) -> dict:
    """The facts a step recorded in the run's report.json."""
    steps = json.loads((run_dir / "report.json").read_text())["steps"]
    return next(s.get("facts", {}) for s in steps if s["id"] == step)


def tx_bytes(bridge: str) -> int:
    """What this machine has sent into a cluster's bridge (node-to-node traffic not counted)."""
    return int(Path(f"/sys/class/net/{bridge}/statistics/tx_bytes").read_text())


# Issue 44 R3: another user's bundle at a scratch name a run used. Its kit's start.py and rule
# (rbrules/private.py) each leave a file in /tmp/MARKS on the node when they run, named with the
# euid they ran as. Planted as nobody (setpriv: exactly nobody's rights) in the node's /tmp.
PLANT_BUNDLE = r"""
import io, os, sys, tarfile
tmp, marks, names = sys.argv[1], sys.argv[2], sys.argv[3:]
if not os.path.isdir(os.path.join(tmp, marks)):
    os.mkdir(os.path.join(tmp, marks))
    os.chmod(os.path.join(tmp, marks), 0o1777)
for name in names:
    with tarfile.open(os.path.join(tmp, name), "w") as t:
        for rel in ("kit/rbrules/start.py", "kit/rbrules/private.py"):
            code = ("import os\nopen(os.path.join('/tmp', %r, '%s-euid%%d-pid%%d' %% "
                    "(os.geteuid(), os.getpid())), 'w').close()\n" % (marks, rel.replace("/", "."))
                    ).encode()
            info = tarfile.TarInfo("./" + rel)
            info.size, info.mode = len(code), 0o644
            t.addfile(info, io.BytesIO(code))
    os.chmod(os.path.join(tmp, name), 0o644)
"""
BUNDLE_MARKS = "rbbundle-marks"


def scratch_names(said: str, name: str) -> set[str]:
    """Every scratch name (rbfan-NAME-<16 hex>) a run's log shows: what another user of a node can
    see while it runs (the engines' command lines), and its run directory keeps."""
    return set(re.findall(rf"\brbfan-{re.escape(name)}-[0-9a-f]{{16}}\b", said))


def plant_bundles_as_nobody(tmp: Path, names: set[str]) -> None:
    """As nobody, a bundle of its own at each NAME.tar in `tmp` (a node's /tmp seen from here)."""
    subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-I",
            "-c",
            PLANT_BUNDLE,
            str(tmp),
            BUNDLE_MARKS,
            *(f"{n}.tar" for n in sorted(names)),
        ],
        cwd="/",
        check=True,
        capture_output=True,
        timeout=30,
    )


def planted_bundles(tmp: Path, names: set[str]) -> tuple[list[str], list[str]]:
    """(what nobody's kits left in the marks directory, the planted bundles still there as
    nobody's), and both removed."""
    marks = tmp / BUNDLE_MARKS
    ran = sorted(p.name for p in marks.iterdir()) if marks.is_dir() else []
    shutil.rmtree(marks, ignore_errors=True)
    kept = []
    for n in names:
        p = tmp / f"{n}.tar"
        if p.exists() and p.stat().st_uid == 65534:
            kept.append(p.name)
        p.unlink(missing_ok=True)
    return ran, sorted(kept)


def assert_planted_bundles_never_run(
    node_tmp: Callable[[str], Path],
    nodes: list[str],
    name: str,
    run_dir: Path,
    first: str,
    again: Callable[[], tuple[int, str]],
) -> None:
    """After a run of runbook NAME (`first`: what it said), nobody plants a bundle of its own at
    every scratch name the run showed (and the one 44a2c10 kept in the run directory) on every
    node; `again()` runs `--from fan_install`. Nothing of nobody's may run, nobody's files are
    never moved nor opened, and every node installs from a new copy under a new name."""
    names = scratch_names(first, name)
    saved = run_dir / "fanout" / "scratch-name"
    if saved.exists():  # 44a2c10 kept it for a --from run
        names.add(Path(saved.read_text().strip()).name)
    assert names, first[-3000:]
    for node in nodes:
        plant_bundles_as_nobody(node_tmp(node), names)
    try:
        rc, err = again()
    finally:
        seen = {node: planted_bundles(node_tmp(node), names) for node in nodes}
    ran = {node: s[0] for node, s in seen.items() if s[0]}
    assert not ran, f"nobody's bundle ran on the nodes: {ran}"
    assert all(s[1] == sorted(f"{n}.tar" for n in names) for s in seen.values()), seen
    assert rc == 0, err[-6000:]
    assert "a new copy of the bundle for this run" in err
    assert not names & scratch_names(err, name)
    fan = json.loads((run_dir / "fanout" / "fanout.json").read_text())
    assert sorted(fan["ok_nodes"]) == nodes and not fan["odd"] and not fan["missing"]
    for node in nodes:  # installed: no bundle left in scratch
        assert not list(node_tmp(node).glob(f"rbfan-{name}*")), node
