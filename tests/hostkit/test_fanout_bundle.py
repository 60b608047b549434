"""What a fan-out node does with the bundle the engine left at a scratch name (issue 44 R3: ours
means proven, never placed): the runbook's own node script (RB_FAN_NODE_SCRIPT, read from
generated/cluster8.sh) run here with `sh`, as root, on bundles another user could have put there.

A bundle is unpacked and its kit run only when it is a regular file of this user or root, one
link, not writable by group or others, hashes to the sha256 the run pinned, and lies (moved at
once into a new mktemp -d directory) where the rule of rbrules.private says no other user can
change it. Every other case is refused with its reason, and nothing of it runs. On 44a2c10 the
script took a scratch directory, tested the bundle with -f and -L only and ran any kit in it.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from compiler.readback import read_settings

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another user (root)")

# the kit's start.py in these bundles: the rule (rbrules.private) is run as the real entry file
# runs it; any other start records that it ran, as whom, with what and where
START = """import json, os, runpy, sys
if sys.argv[1:2] == ["rbrules.private"]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.argv = sys.argv[1:]
    runpy.run_module("rbrules.private", run_name="__main__", alter_sys=True)
    sys.exit(0)
with open(os.path.join({marks!r}, "ran-%d" % os.getpid()), "w") as f:
    json.dump({{"euid": os.geteuid(), "argv": sys.argv[1:], "cwd": os.getcwd()}}, f)
"""


def node_script() -> str:
    return read_settings((ROOT / "generated" / "cluster8.sh").read_text())["RB_FAN_NODE_SCRIPT"]


def make_bundle(path: Path, marks: Path) -> str:
    """A bundle as fan_pack makes one (kit/ with the real rule, a payload): returns its sha256."""
    with tarfile.open(path, "w") as t:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo("./" + name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, NOBODY, NOBODY
            t.addfile(info, io.BytesIO(data))

        add("kit/rbrules/start.py", START.format(marks=str(marks)).encode())
        for rule in sorted((ROOT / "hostkit" / "rbrules").glob("*.py")):
            if rule.name != "start.py":  # the real rules, the fake entry file
                add(f"kit/rbrules/{rule.name}", rule.read_bytes())
        add("manifest.jsonl", b"{}\n")
        add("payload", b"payload bytes")
    path.chmod(0o644)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(name: Path, pin: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", "-c", node_script(), "rb", str(name), pin, "--dest", "/x/venv"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def place(tmp_path):
    """(the scratch base: a sticky world-writable directory, as /tmp; the marks directory)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)
    marks = tmp_path / "marks"
    marks.mkdir()
    return scratch, marks


def ran(marks: Path) -> list[str]:
    return sorted(p.name for p in marks.iterdir())


def test_a_bundle_of_this_run_is_moved_into_a_new_private_directory_and_run(place):
    scratch, marks = place
    name = scratch / "rbfan-x-0123456789abcdef.tar"
    pin = make_bundle(name, marks)
    p = run(name, pin)
    assert p.returncode == 0, p.stderr
    (mark,) = marks.iterdir()
    import json

    doc = json.loads(mark.read_text())
    assert doc["euid"] == 0
    d = Path(doc["cwd"])
    # a new directory (mktemp -d) beside the name, 0700, root's; the name itself is gone
    assert d.parent == scratch and d.name.startswith(name.stem + ".") and d != scratch / name.stem
    st = d.stat()
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o700)
    assert not name.exists() and (d / "bundle.tar").is_file()
    assert doc["argv"] == ["rbkit.fanout", "node", "--dir", str(d), "--dest", "/x/venv"]
    # unpacked as root's (--no-same-owner), all but the payload (streamed from the bundle)
    assert (d / "kit" / "rbrules" / "start.py").stat().st_uid == 0
    assert not (d / "payload").exists()


def _nobody_owns(name: Path) -> None:
    os.chown(name, NOBODY, NOBODY)


def _group_writable(name: Path) -> None:
    name.chmod(0o664)


def _two_links(name: Path) -> None:
    os.link(name, name.parent.parent / "second-link")


@pytest.mark.parametrize(
    "plant, said",
    [
        (_nobody_owns, "owned by uid 65534, not by this user or root"),
        (_group_writable, "mode 664: group or others may write it"),
        (_two_links, "2 links to it"),
    ],
)
def test_a_bundle_another_user_could_change_is_refused(place, plant, said):
    scratch, marks = place
    name = scratch / "rbfan-x-0123456789abcdef.tar"
    pin = make_bundle(name, marks)
    plant(name)
    p = run(name, pin)
    assert p.returncode == 1 and not ran(marks), p.stderr
    assert f"refusing the bundle {name}: {said}; nothing of it was unpacked or run" in p.stderr
    assert os.listdir(scratch) == [], "a refused bundle's directory was left"


def test_a_bundle_that_is_not_the_pinned_one_is_refused(place):
    scratch, marks = place
    name = scratch / "rbfan-x-0123456789abcdef.tar"
    pin = make_bundle(name, marks)
    other = "0" * 64
    p = run(name, other)
    assert p.returncode == 1 and not ran(marks), p.stderr
    assert f"sha256 {pin}, not the pinned {other}; nothing of it was unpacked or run" in p.stderr


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "missing"])
def test_what_is_not_a_regular_file_at_the_name_is_never_opened(place, kind):
    scratch, marks = place
    name = scratch / "rbfan-x-0123456789abcdef.tar"
    real = scratch.parent / "real.tar"
    pin = make_bundle(real, marks)
    if kind == "symlink":
        name.symlink_to(real)
    elif kind == "fifo":
        os.mkfifo(name)  # opened, it would wait for a writer
    elif kind == "directory":
        name.mkdir()
    p = run(name, pin)
    assert p.returncode == 1 and not ran(marks), p.stderr
    assert f"refusing the bundle {name}: no regular file there" in p.stderr
    assert sorted(os.listdir(scratch)) == ([] if kind == "missing" else [name.name])


def test_a_scratch_directory_others_can_rename_in_is_refused_by_the_rule(tmp_path):
    """A scratch base writable by others without the sticky bit: another user could rename the
    new directory away and put its own there. The rule (rbrules.private, from the proven
    bundle) refuses it before anything is unpacked."""
    scratch = tmp_path / "open"
    scratch.mkdir()
    scratch.chmod(0o777)
    marks = tmp_path / "marks"
    marks.mkdir()
    name = scratch / "rbfan-x-0123456789abcdef.tar"
    pin = make_bundle(name, marks)
    p = run(name, pin)
    assert p.returncode == 1 and not ran(marks), p.stderr
    assert (
        f"directory {scratch} is owned by root (uid 0), mode 0777: writable by group and "
        "others without the sticky bit" in p.stderr
    ), p.stderr
    assert f"refusing the bundle {name}: (above); nothing of it was unpacked or run" in p.stderr
    assert os.listdir(scratch) == []
