"""A destination in a directory every user can write (issue 44, R1), with real runs of the
one-host runbook (the same install engine as a remote destination).

The destination is `TMP/venv` in a 1777 directory like /tmp. By default it is refused, in the run
and in `--plan`, naming the fix. With `transfer.shared_parent: allow`, what the other user (the
real `nobody`, planting with its own rights through setpriv) puts beside or inside the
destination is never used by root: a copy of the install at a backup's name with an edited module
and no env file is not restored; an env file planted in a backup is not copied to the public one;
a module another user owns, edited with its size and mtime kept, is not "up to date"; a file
another user owns is not hard-linked into root's new install as "unchanged". Each test failed on
44a2c10, where root ran nobody's module (the probe imports it) or kept nobody's inode.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.e2e.test_local_runbook import compile_, report

pytestmark = pytest.mark.e2e

NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
ALLOW = "  shared_parent: allow\n"
MODULE = "lib/python3.*/site-packages/rb_payload/__init__.py"


def as_nobody(*argv: str) -> None:
    subprocess.run([*SETPRIV, *argv], check=True, capture_output=True, text=True, timeout=60)


@pytest.fixture
def place():
    """A root-owned 0755 directory in /tmp holding `tmp` (1777, like /tmp) and `m` (1777:
    a planted module leaves a file there, named for the uid it ran as)."""
    base = Path(tempfile.mkdtemp(prefix="rbp.", dir="/tmp"))
    base.chmod(0o755)
    for name in ("tmp", "m"):
        (base / name).mkdir()
        (base / name).chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def run(tmp_path: Path, script: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))
    return subprocess.run(
        ["bash", str(script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def module_of(root: Path) -> Path:
    return next(root.glob(MODULE))


def plant_module(path: Path, marker: Path) -> None:
    """As nobody: the module at `path` (nobody's to write) becomes one that leaves `uN` in
    `marker` when imported, of the same size and with the same mtime (what a stat check sees)."""
    st = path.stat()
    code = f"import os;open('{marker}/u%d'%os.geteuid(),'w')"
    assert len(code) + 1 <= st.st_size, code
    text = code + "#" * (st.st_size - len(code) - 1) + "\n"
    as_nobody(
        "sh",
        "-c",
        'printf %s "$1" > "$2" && touch -d "@$3" "$2"',
        "sh",
        text,
        str(path),
        str(int(st.st_mtime)),
    )
    assert path.stat().st_size == st.st_size and int(path.stat().st_mtime) == int(st.st_mtime)


def test_a_destination_in_a_sticky_directory_is_refused_in_the_run_and_the_plan(
    payload_small, place, tmp_path
):
    dst = place / "tmp" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst, policy="backup")
    want = (
        f"refusing to install {dst} as root: directory {place / 'tmp'} is owned by root "
        "(uid 0), mode 1777: writable by group and others (sticky)"
    )
    fix = f"mkdir -m 755 {place / 'tmp'}/rb, then install into {place / 'tmp'}/rb/venv"
    r = run(tmp_path, script, "--plan")
    assert r.returncode == 1, r.stderr[-3000:] + r.stdout[-3000:]
    out = r.stdout + r.stderr
    assert "BLOCKED:" in out and want in out and fix in out, out[-3000:]
    r = run(tmp_path, script)
    assert r.returncode == 1, r.stderr[-3000:]
    assert want in r.stderr and fix in r.stderr and "transfer.shared_parent: allow" in r.stderr
    assert os.listdir(place / "tmp") == [], "nothing written there: not even the lock"


def test_restore_never_installs_a_copy_another_user_made_of_the_install(
    payload_small, place, tmp_path
):
    """The issue's reproduction: nobody copies TMP/venv to TMP/venv.rb-backup.99, edits a
    module (same size and mtime) and deletes its .rb-env.sh. `--restore` (and `--restore 99`)
    refuses it, naming its owner; the next run is not fooled either: nobody's module never
    runs as root."""
    dst = place / "tmp" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst, policy="backup", extra=ALLOW)
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    planted = place / "tmp" / "venv.rb-backup.99"
    as_nobody("cp", "-a", str(dst), str(planted))
    plant_module(module_of(planted), place / "m")
    as_nobody("rm", str(planted / ".rb-env.sh"))
    original = module_of(dst).read_bytes()

    r = run(tmp_path, script, "--restore")
    assert r.returncode != 0, r.stderr[-3000:]
    assert f"{planted} is owned by nobody (uid {NOBODY}), not by root" in r.stderr, r.stderr[-3000:]
    r = run(tmp_path, script, "--restore", "99")
    assert r.returncode != 0, r.stderr[-3000:]
    assert f"refusing to restore backup 99: {planted} is owned by nobody" in r.stderr
    assert module_of(dst).read_bytes() == original and module_of(dst).stat().st_uid == 0

    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert report(tmp_path)["outcome"] == "ok"
    assert os.listdir(place / "m") == []
    assert planted.is_dir(), "never removed: it is nobody's, to look at"
    assert f"warning: directory {place / 'tmp'} is owned by root (uid 0), mode 1777" in r.stderr
    assert "going on because transfer.shared_parent is allow" in r.stderr


def test_an_env_file_planted_in_a_backup_is_never_copied_to_the_public_one(
    payload_small, place, tmp_path
):
    dst = place / "tmp" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst, policy="backup", extra=ALLOW)
    assert run(tmp_path, script).returncode == 0
    public = Path(f"{dst}.env.sh")
    before = public.read_text()
    planted = place / "tmp" / "venv.rb-backup.98"
    as_nobody("mkdir", str(planted))
    as_nobody("sh", "-c", f"echo 'touch {place}/m/sourced' > {planted}/.rb-env.sh")
    r = run(tmp_path, script, "--restore", "98")
    assert r.returncode != 0, r.stderr[-3000:]
    assert f"refusing to restore backup 98: {planted} is owned by nobody" in r.stderr
    assert public.read_text() == before and public.stat().st_uid == 0
    assert os.listdir(place / "m") == []


def test_the_quick_check_never_calls_a_module_another_user_owns_up_to_date(
    payload_small, place, tmp_path
):
    """The state a restore of nobody's copy left at 44a2c10: a module of the install is
    nobody's, edited with its size and mtime kept. The next run does not say "destination up to
    date" (its probe ran nobody's module as uid 0, outcome ok): it names the file, sends it
    again and the install is root's."""
    dst = place / "tmp" / "venv"
    script = compile_(tmp_path, payload_small.venv, dst, policy="backup", extra=ALLOW)
    assert run(tmp_path, script).returncode == 0
    module = module_of(dst)
    original = module.read_bytes()
    os.chown(module, NOBODY, NOBODY)
    plant_module(module, place / "m")
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        "destination up to date" not in r.stderr and "already holds this exact tree" not in r.stderr
    ), r.stderr[-3000:]
    assert "not proven ours at the destination (sent again, never linked)" in r.stderr
    assert "rb_payload/__init__.py is owned by nobody" in r.stderr
    assert os.listdir(place / "m") == []
    now = module_of(dst)
    assert now.read_bytes() == original and now.stat().st_uid == 0


def test_an_incremental_run_never_links_a_file_another_user_owns(payload_small, place, tmp_path):
    """After a restore of nobody's tree (44a2c10), an incremental run hard-linked nobody's inodes
    into root's new install as "unchanged": they stayed nobody's, writable by nobody. Here one
    file of the install is nobody's (its bytes unchanged) and the source changed elsewhere."""
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(payload_small.venv), str(src)], check=True)
    dst = place / "tmp" / "venv"
    script = compile_(tmp_path, src, dst, policy="backup", extra=ALLOW)
    assert run(tmp_path, script).returncode == 0
    theirs = next(dst.glob("lib/python3.*/site-packages/rb_payload/cli.py"))
    os.chown(theirs, NOBODY, NOBODY)
    greeting = next(src.rglob("greeting.txt"))
    greeting.write_text("changed at the source\n")
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "incremental:" in r.stderr and "linked from the current install" in r.stderr, r.stderr[
        -3000:
    ]
    backup = place / "tmp" / "venv.rb-backup.1"
    kept = backup / theirs.relative_to(dst)
    new = dst / theirs.relative_to(dst)
    assert kept.stat().st_uid == NOBODY  # the backup is as it was
    assert new.stat().st_uid == 0 and new.stat().st_ino != kept.stat().st_ino
    assert not stat.S_IMODE(new.stat().st_mode) & 0o022
    assert next(dst.rglob("greeting.txt")).read_text() == "changed at the source\n"
