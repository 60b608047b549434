"""Ours means proven, never placed (issue 44, R1): the rule (rbrules.proven) and each use of it
beside and inside a destination, against the kit's functions.

The other user is the real `nobody`: what it plants it plants with its own rights (setpriv), or,
where the state to test is one only root could have left (an install restored from a planted
backup by the kit of 44a2c10), root gives a file to nobody first. Each test of a use failed on
44a2c10: a sticky parent was private for what lay in it, a backup was judged by its parent only,
the quick check and the incremental links trusted a file by its stat alone, the env file kept in
an install was copied whoever owned it.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from rbkit import (
    exports,
    installs,
    linkstage,
    manifest,
    manifestfile,
    privacy,
    statwalk,
    swapfs,
)
from rbrules import paths

from tests.conftest import IN_CI

NOBODY = pwd.getpwnam("nobody").pw_uid
NOGROUP = pwd.getpwnam("nobody").pw_gid
ME = os.geteuid()
pytestmark = pytest.mark.skipif(ME != 0 and not IN_CI, reason="planting as nobody needs root")
PKG = "lib/python3.11/site-packages/pkg"


def as_nobody(*argv: str) -> None:
    subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOGROUP}", "--clear-groups", *argv],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def sticky():
    """A 1777 directory like /tmp, in a root-owned 0755 one nobody can reach."""
    base = Path(tempfile.mkdtemp(prefix="rb-proven."))
    base.chmod(0o755)
    (base / "tmp").mkdir()
    (base / "tmp").chmod(0o1777)
    yield base / "tmp"
    shutil.rmtree(base, ignore_errors=True)


def an_install(dest: Path) -> dict:
    """A small install at `dest` (root's, as a run leaves it: its own env file too) and its
    manifest."""
    (dest / "bin").mkdir(parents=True)
    (dest / PKG).mkdir(parents=True)
    (dest / PKG / "__init__.py").write_text("VALUE = 1\n")
    (dest / PKG / "data.txt").write_text("data\n")
    (dest / "bin" / "python").symlink_to("/usr/bin/python3")
    exports.write(str(dest) + ".env.sh", "export A=1\n", venv=str(dest))
    return manifest.build(str(dest), [], "sha256", jobs=1)


def edit_keeping_stat(path: Path, text: str) -> None:
    """As nobody: other bytes of the same size, the mtime put back."""
    st = path.stat()
    assert len(text.encode()) == st.st_size
    as_nobody(
        "sh",
        "-c",
        'printf %s "$1" > "$2" && touch -d "@$3" "$2"',
        "sh",
        text,
        str(path),
        str(int(st.st_mtime)),
    )


# -- the rule -----------------------------------------------------------------------------------


def test_an_entry_is_ours_only_when_owned_by_the_runner_or_root_and_writable_by_no_other(tmp_path):
    from rbrules import owners

    f = tmp_path / "f"
    f.write_text("x")
    f.chmod(0o644)
    assert owners.why_not_ours(str(f), f.lstat()) is None
    os.chown(f, NOBODY, -1)
    assert (
        owners.why_not_ours(str(f), f.lstat()) == f"{f} is owned by nobody (uid {NOBODY}), "
        "not by root"
    )
    os.chown(f, 0, NOGROUP)
    f.chmod(0o664)
    assert "is writable by its group nogroup (gid %d) (mode 0664)" % NOGROUP in owners.why_not_ours(
        str(f), f.lstat()
    )
    os.chown(f, 0, 0)  # root's group: as root's own, inside an install
    assert owners.why_not_ours(str(f), f.lstat()) is None
    # ... but never for a file read on its own (an env file, a mark, a config)
    assert (
        owners.why_not_ours(str(f), f.lstat(), alone=True)
        == f"{f} is writable by its group (mode 0664)"
    )
    f.chmod(0o646)
    assert owners.why_not_ours(str(f), f.lstat()) == f"{f} is writable by others (mode 0646)"
    f.chmod(0o644)
    os.link(f, tmp_path / "other-name")
    assert "has 2 links" in owners.why_not_ours(str(f), f.lstat(), alone=True)
    assert owners.why_not_ours(str(f), f.lstat()) is None  # an install's files may share


def test_a_file_read_on_its_own_is_judged_through_the_descriptor_it_is_read_from(tmp_path):
    from rbrules import proven

    (tmp_path / "target").write_text("secret")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(proven.NotOurs, match="not a regular file"):
        proven.read_ours(str(tmp_path / "link"))
    with pytest.raises(proven.NotOurs, match="not a regular file"):
        proven.read_ours(str(tmp_path / "fifo"))  # never blocks on a FIFO
    assert proven.read_ours(str(tmp_path / "missing")) is None
    assert proven.read_ours(str(tmp_path / "target"))[0] == b"secret"
    with pytest.raises(proven.NotOurs, match="larger than 3 bytes"):
        proven.read_ours(str(tmp_path / "target"), limit=3)


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o1775, 0o757])
def test_a_directory_others_can_add_entries_to_is_not_private_for_what_lies_in_it(tmp_path, mode):
    from rbrules import proven

    d = tmp_path / "d"
    d.mkdir()
    d.chmod(mode)
    why = proven.why_shared(str(d))
    assert why is not None and f"mode {mode:04o}" in why
    assert ("(sticky)" in why) == bool(mode & stat.S_ISVTX)
    d.chmod(0o755)
    assert proven.why_shared(str(d)) is None
    assert proven.why_shared(str(d / "not-yet")) is None  # made by the kit, 0755


def test_a_private_directory_is_made_where_no_other_user_can_rename_it(tmp_path, monkeypatch):
    """(a): mkdtemp in TMPDIR when it is private (a sticky one is, for an entry of ours); in an
    open TMPDIR (0777, not sticky: anyone renames root's directory away and puts theirs in its
    place) it is made in /tmp instead, saying so."""
    from rbrules import proven

    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    made = proven.fresh_dir("rb-test.", str(tmp_path))
    assert Path(made).parent == tmp_path and stat.S_IMODE(os.stat(made).st_mode) == 0o700
    with pytest.raises(
        PermissionError,
        match=f"refusing {open_dir} for this run's private "
        "directory: directory .* writable by group and others without the sticky",
    ):
        proven.fresh_dir("rb-test.", str(open_dir))
    monkeypatch.setattr(tempfile, "tempdir", str(open_dir))
    made = proven.fresh_dir("rb-test.")
    try:
        assert Path(made).parent == Path("/tmp")
    finally:
        os.rmdir(made)


# -- R1: the destination's parent ----------------------------------------------------------------


def test_a_destination_in_a_sticky_directory_is_refused_naming_the_fixes(sticky):
    where, why = privacy.check_parent(str(sticky / "venv"), ME)
    assert where == str(sticky) and "mode 1777: writable by group and others (sticky)" in why
    text = privacy.refusal(str(sticky / "venv"), where, why, ME)
    for part in (
        f"refusing to install {sticky}/venv as root: directory {sticky} is owned by "
        "root (uid 0), mode 1777",
        f"mkdir -m 755 {sticky}/rb, then install into {sticky}/rb/venv",
        "transfer.shared_parent: allow",
    ):
        assert part in text, text
    (sticky / "rb").mkdir(mode=0o755)  # the fix: a directory of root's in it
    assert privacy.check_parent(str(sticky / "rb" / "venv"), ME) is None


# -- R1: what lies beside the destination --------------------------------------------------------


def test_restore_never_puts_back_a_copy_another_user_made_of_the_install(sticky):
    """The issue's scenario: nobody copies /tmp/venv to venv.rb-backup.99, edits a module (same
    size and mtime) and deletes its .rb-env.sh. It is never restored, named or not; the install
    in place and the public env file stay root's."""
    dest = sticky / "venv"
    an_install(dest)
    planted = sticky / "venv.rb-backup.99"
    as_nobody("cp", "-a", str(dest), str(planted))
    edit_keeping_stat(planted / PKG / "__init__.py", "VALUE = 2\n")
    as_nobody("rm", str(planted / paths.ENV_IN_INSTALL))
    with pytest.raises(
        PermissionError,
        match=r"refusing to restore backup 99: .*venv\.rb-backup"
        r"\.99 is owned by nobody \(uid %d\), not by root" % NOBODY,
    ):
        swapfs.restore(str(dest), 99, env_file=str(dest) + ".env.sh")
    with pytest.raises(FileNotFoundError, match="no backup of .* owned by nobody"):
        swapfs.restore(str(dest), env_file=str(dest) + ".env.sh")
    assert (dest / PKG / "__init__.py").read_text() == "VALUE = 1\n"
    assert Path(str(dest) + ".env.sh").read_text() == "export A=1\n"
    assert swapfs.prune_backups(str(dest), 1) == [] and planted.is_dir()


def test_restore_refuses_a_backup_of_root_that_holds_a_file_another_user_owns(tmp_path):
    """A backup directory of root's whose tree holds nobody's inodes (what an incremental run
    linked from a planted restore at 44a2c10): every entry is judged, the first named."""
    dest = tmp_path / "venv"
    an_install(dest)
    backup = tmp_path / "venv.rb-backup.1"
    an_install(backup)
    os.chown(backup / PKG / "__init__.py", NOBODY, -1)
    with pytest.raises(
        PermissionError,
        match=r"refusing to restore .*venv\.rb-backup\.1: .*"
        rf"{PKG}/__init__\.py is owned by nobody",
    ):
        swapfs.restore(str(dest))
    assert (dest / PKG / "__init__.py").read_text() == "VALUE = 1\n"
    # the install this run's own swap moved aside goes back as it was (a rollback)
    st = backup.lstat()
    got = swapfs.restore(str(dest), 1, known=[st.st_dev, st.st_ino])
    assert got["restored"] == str(backup) and (dest / PKG / "__init__.py").stat().st_uid == NOBODY


def test_an_env_file_another_user_owns_in_a_backup_is_never_copied_to_the_public_one(tmp_path):
    dest = tmp_path / "venv"
    an_install(dest)
    public = Path(str(dest) + ".env.sh")
    own = dest / paths.ENV_IN_INSTALL
    own.write_text("touch /tmp/pwned-by-nobody\n")
    os.chown(own, NOBODY, -1)
    got = exports.restore_env(str(dest), str(public))
    assert got["restored"] is False and "is owned by nobody" in got["why"], got
    assert public.read_text() == "export A=1\n"
    own.unlink()
    own.symlink_to(public)
    assert exports.restore_env(str(dest), str(public))["restored"] is False


# -- R1: the install's own files: the quick check and the incremental links ----------------------


def test_the_quick_check_never_trusts_a_file_another_user_owns_or_can_write(tmp_path):
    dest = tmp_path / "venv"
    m = an_install(dest)
    lines, _size = statwalk.tree_stat(str(dest))
    assert manifest.check_tree(str(dest), m)["ok"]
    module = dest / PKG / "__init__.py"
    os.chown(module, NOBODY, -1)
    tree = manifest.check_tree(str(dest), m)
    assert not tree["ok"] and tree["changed"] == [f"{PKG}/__init__.py"], tree
    assert "owned by nobody" in tree["not_ours"][0]
    # the early check's walk: its lines no longer add up to what the install recorded
    assert (
        hashlib.sha256(b"".join(statwalk.tree_stat(str(dest))[0])).digest()
        != hashlib.sha256(b"".join(lines)).digest()
    )
    # writable by a group of other users, the same mode and stat as recorded
    os.chown(module, 0, 0)
    module.chmod(0o664)
    m = manifest.build(str(dest), [], "sha256", jobs=1)
    assert manifest.check_tree(str(dest), m)["ok"]
    os.chown(module, 0, NOGROUP)
    assert not manifest.check_tree(str(dest), m)["ok"]


def test_an_incremental_staging_never_links_a_file_another_user_owns(tmp_path):
    dest = tmp_path / "venv"
    m = an_install(dest)
    os.chown(dest / PKG / "data.txt", NOBODY, -1)
    staging = tmp_path / ".venv.rb-staging"
    got = linkstage.stage(str(dest), str(staging), m, m, str(tmp_path / "names"))
    assert not (staging / PKG / "data.txt").exists()
    linked = (staging / PKG / "__init__.py").stat()
    assert linked.st_ino == (dest / PKG / "__init__.py").stat().st_ino
    names = (tmp_path / "names").read_bytes().split(b"\0")
    assert f"{PKG}/data.txt".encode() in names and got["linked"] == 1
    # nor one a group of other users can write (its recorded mode and stat unchanged)
    module = dest / PKG / "__init__.py"
    module.chmod(0o664)
    os.chown(module, 0, NOGROUP)
    m = manifest.build(str(dest), [], "sha256", jobs=1)
    got = linkstage.stage(str(dest), str(staging), m, m, str(tmp_path / "names"))
    assert got["linked"] == 0 and not (staging / PKG / "__init__.py").exists()


def test_an_install_another_user_owns_is_not_taken_for_one_of_this_tool(tmp_path):
    dest = tmp_path / "venv"
    an_install(dest)
    manifestfile.save(
        manifest.build(str(dest), [], "sha256", jobs=1), str(dest / ".rb-manifest.jsonl")
    )
    assert installs.why_not_ours_install(str(dest)) is None
    os.chown(dest / ".rb-manifest.jsonl", NOBODY, -1)
    assert "rb-manifest.jsonl is owned by nobody" in installs.why_not_ours_install(str(dest))
    os.chown(dest / ".rb-manifest.jsonl", 0, -1)
    os.chown(dest, NOBODY, -1)
    assert f"{dest} is owned by nobody" in installs.why_not_ours_install(str(dest))
