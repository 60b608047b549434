"""Hostile source trees and hostile hosts, against the kit's own functions (issue #15). Over 600
lines on purpose: one planted fault a test, all against the same hostile trees.

The kit runs as root on machines shared with other users, over trees we did not write. Each test
plants what such a user could plant (a setuid file, a link where the kit writes a temp file, a link
that leaves the tree, a symlinked destination, a sparse file, an alias of the source) and asserts
what reaches the host's files: nothing written outside the tree, no setuid-root file, the source
never replaced, the previous install and its env file recoverable.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from rbkit import (
    exports,
    hostfs,
    installs,
    linkstage,
    manifest,
    manifestfile,
    pathid,
    relocate,
    swapfs,
)

ROOT = os.geteuid() == 0


def venv_tree(root: Path, old: str = "/old/venv") -> Path:
    """A small venv-shaped tree whose scripts name `old`."""
    (root / "bin").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "pkg").mkdir(parents=True)
    (root / "lib" / "python3.11" / "site-packages" / "pkg" / "__init__.py").write_text("x = 1\n")
    (root / "pyvenv.cfg").write_text(f"home = /usr/bin\ncommand = /usr/bin/python3 -m venv {old}\n")
    (root / "bin" / "python").symlink_to("/usr/bin/python3")
    (root / "bin" / "activate").write_text(f'VIRTUAL_ENV="{old}"\nexport VIRTUAL_ENV\n')
    tool = root / "bin" / "tool"
    tool.write_text(f"#!{old}/bin/python\nimport sys\n")
    tool.chmod(0o755)
    return root


def bait(tmp_path: Path, name: str = "outside.txt") -> Path:
    """A file outside every tree that the kit must never write: its content is checked after."""
    target = tmp_path / "elsewhere" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("not yours\n")
    return target


# -- C2: setuid becomes setuid-root ------------------------------------------------------------


def special_tree(tmp_path: Path) -> Path:
    root = venv_tree(tmp_path / "src")
    (root / "bin" / "su-ish").write_text("#!/bin/sh\n")
    (root / "bin" / "su-ish").chmod(0o4755)
    (root / "bin" / "sg-ish").write_text("#!/bin/sh\n")
    (root / "bin" / "sg-ish").chmod(0o2755)
    (root / "share").mkdir()
    (root / "share" / "anyone-writes").write_text("x")
    (root / "share" / "anyone-writes").chmod(0o666)
    (root / "share" / "open-dir").mkdir()
    (root / "share" / "open-dir").chmod(0o777)
    return root


def test_scan_lists_setuid_setgid_and_world_writable_entries_and_refuses_them(tmp_path):
    root = special_tree(tmp_path)
    doc = hostfs.scan(str(root), [])
    listed = {e["p"]: e["m"] for e in doc["special_modes"]}
    assert listed == {
        "bin/su-ish": "4755",
        "bin/sg-ish": "2755",
        "share/anyone-writes": "0666",
        "share/open-dir": "0777",
    }
    assert doc["special_modes_count"] == 4
    assert "setuid" in doc["refusal"] and "bin/su-ish (4755)" in doc["refusal"]
    assert "special_modes" in doc["refusal"], "the refusal names the spec field that allows it"
    stripped = hostfs.scan(str(root), [], special_modes="strip")
    assert stripped["refusal"] == "" and len(stripped["special_modes"]) == 4
    assert stripped["special_modes_action"] == "strip"
    assert hostfs.scan(str(root), [], special_modes="keep")["refusal"] == ""
    with pytest.raises(ValueError):
        hostfs.scan(str(root), [], special_modes="sometimes")


def test_manifest_records_modes_without_special_bits_when_stripping(tmp_path):
    root = special_tree(tmp_path)
    m = manifest.build(str(root), [], "sha256", jobs=1, strip_special=True)
    modes = {e["p"]: e.get("m") for e in m["entries"]}
    assert modes["bin/su-ish"] == 0o755 and modes["bin/sg-ish"] == 0o755
    assert modes["share/anyone-writes"] == 0o664 and modes["share/open-dir"] == 0o775
    assert m["header"]["strip_special"] is True
    # the re-run's quick check compares the source's stat fingerprint (scan) with the one the
    # install recorded (from the manifest): both see the same stripped modes
    scanned = hostfs.scan(str(root), [], special_modes="strip")["stat_fingerprint"]
    assert scanned == manifestfile.stat_fingerprint(m["entries"])
    kept = manifest.build(str(root), [], "sha256", jobs=1)
    assert {e["p"]: e.get("m") for e in kept["entries"]}["bin/su-ish"] == 0o4755


def test_strip_special_leaves_no_special_bit_and_never_follows_a_link(tmp_path):
    root = special_tree(tmp_path)
    outside = bait(tmp_path)
    outside.chmod(0o4755)
    (root / "share" / "link-out").symlink_to(outside)
    removed = hostfs.strip_special(str(root))
    assert sorted(r["p"] for r in removed) == [
        "bin/sg-ish",
        "bin/su-ish",
        "share/anyone-writes",
        "share/open-dir",
    ]
    assert {r["p"]: (r["was"], r["now"]) for r in removed}["bin/su-ish"] == ("4755", "0755")
    for p in root.rglob("*"):
        if not p.is_symlink():
            assert stat.S_IMODE(p.lstat().st_mode) & manifestfile.SPECIAL_BITS == 0, p
    assert stat.S_IMODE(outside.stat().st_mode) == 0o4755, "a link's target is not ours to chmod"
    assert hostfs.strip_special(str(root)) == [], "a second pass finds nothing"
    # what verify then sees equals the stripped manifest of the source
    src = special_tree(tmp_path / "again")
    m = manifest.build(str(src), [], "sha256", jobs=1, strip_special=True)
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(src), str(copy)], check=True)
    assert not manifest.verify(str(copy), m)["ok"], "a setuid bit the manifest lacks is caught"
    hostfs.strip_special(str(copy))
    assert manifest.verify(str(copy), m)["ok"]


@pytest.mark.skipif(not ROOT, reason="tar keeps modes and drops owners only when run as root")
def test_tar_as_root_keeps_setuid_unless_told_not_to(tmp_path):
    """What the transfer's extraction does with a setuid file of another user (GNU tar, as root):
    `--no-same-owner` alone makes it a setuid-ROOT file; `--no-same-permissions` under `umask 002`
    never creates a special bit (the flags this issue recommends for the unpack end)."""
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "su-ish").write_text("#!/bin/sh\n")
    shutil.chown(src / "bin" / "su-ish", "nobody")
    (src / "bin" / "su-ish").chmod(0o4755)  # after chown: chown clears setuid
    (src / "share").mkdir()
    (src / "share" / "open").write_text("x")
    (src / "share" / "open").chmod(0o666)
    (src / "share" / "group").write_text("x")
    (src / "share" / "group").chmod(0o664)
    archive = tmp_path / "a.tar"
    subprocess.run(["tar", "-C", str(src), "-cf", str(archive), "."], check=True)

    def extract(flags: str) -> dict:
        out = tmp_path / f"x{len(list(tmp_path.iterdir()))}"
        out.mkdir()
        subprocess.run(
            [
                "sh",
                "-c",
                f'umask 002 && tar -C "$1" -xf "$2" {flags}',
                "sh",
                str(out),
                str(archive),
            ],
            check=True,
        )
        return {
            rel: (stat.S_IMODE((out / rel).lstat().st_mode), (out / rel).lstat().st_uid)
            for rel in ("bin/su-ish", "share/open", "share/group")
        }

    today = extract("--no-same-owner")  # templates/steps/transfer
    assert today["bin/su-ish"] == (0o4755, 0), "documented: setuid becomes setuid-root"
    safe = extract("--no-same-owner --no-same-permissions")
    assert safe == {"bin/su-ish": (0o755, 0), "share/open": (0o664, 0), "share/group": (0o664, 0)}


# -- C3: relocation writes through symlinks ------------------------------------------------------


def test_relocation_never_writes_through_a_planted_temp_name(tmp_path):
    root = venv_tree(tmp_path / "venv")
    target = bait(tmp_path)
    (root / "bin" / "activate.rb-tmp").symlink_to(target)  # the old code's fixed temp name
    (root / "bin" / "tool.rb-tmp").symlink_to(target)
    result = relocate.relocate(str(root), "/old/venv", "/new/venv")
    assert target.read_text() == "not yours\n"
    assert 'VIRTUAL_ENV="/new/venv"' in (root / "bin" / "activate").read_text()
    assert (root / "bin" / "tool").read_text().startswith("#!/new/venv/bin/python\n")
    assert stat.S_IMODE((root / "bin" / "tool").stat().st_mode) == 0o755
    assert sorted(result["rewritten"]) == ["bin/activate", "bin/tool", "pyvenv.cfg"]
    leftovers = [p.name for p in root.rglob("*") if ".rb-tmp." in p.name]
    assert leftovers == [], "no temp file is left behind"


def test_relocation_does_not_follow_a_bin_dir_or_a_script_that_is_a_link(tmp_path):
    root = tmp_path / "venv"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "script").write_text("#!/old/venv/bin/python\n")
    (root / "bin").symlink_to(elsewhere)  # bin/ leads out of the tree
    cfg = elsewhere / "cfg"
    cfg.write_text("command = /old/venv\n")
    (root / "pyvenv.cfg").symlink_to(cfg)  # and a config that is a link
    relocate.relocate(str(root), "/old/venv", "/new/venv")
    assert (elsewhere / "script").read_text() == "#!/old/venv/bin/python\n"
    assert cfg.read_text() == "command = /old/venv\n"
    assert (root / "pyvenv.cfg").is_symlink(), "a link is not replaced by a copy of its target"


def test_env_file_write_never_follows_a_planted_temp_or_writes_through_a_link(tmp_path):
    target = bait(tmp_path)
    env_file = tmp_path / "dst" / "venv.env.sh"
    env_file.parent.mkdir()
    # the old code's temp name: "<path>.rb-tmp.<pid>" (guessable)
    Path(f"{env_file}.rb-tmp.{os.getpid()}").symlink_to(target)
    exports.write(str(env_file), "export A=1\n")
    assert target.read_text() == "not yours\n"
    assert env_file.read_text() == "export A=1\n" and not env_file.is_symlink()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o644
    env_file.unlink()
    env_file.symlink_to(target)  # the env file itself a link
    exports.write(str(env_file), "export A=2\n")
    assert target.read_text() == "not yours\n"
    assert env_file.read_text() == "export A=2\n" and not env_file.is_symlink()


def test_names_and_manifest_files_are_never_written_through_a_link(tmp_path):
    root = venv_tree(tmp_path / "venv")
    target = bait(tmp_path)
    kit = tmp_path / "kit"
    kit.mkdir()
    names = kit / "x.names"
    Path(f"{names}.tmp").symlink_to(target)  # the old code's temp name
    hostfs.scan(str(root), [], str(names))
    assert target.read_text() == "not yours\n"
    assert b"bin/tool\0" in names.read_bytes()
    out = root / ".rb-manifest.jsonl"
    out.symlink_to(target)
    manifestfile.save(manifest.build(str(root)), str(out))
    assert target.read_text() == "not yours\n" and not out.is_symlink()
    assert manifestfile.load(str(out))["totals"]["files"] == 4


def test_scan_reports_links_that_leave_the_tree(tmp_path):
    root = venv_tree(tmp_path / "venv")
    (root / "lib64").symlink_to("lib")  # inside
    (root / "bin" / "python3").symlink_to("python")  # the interpreter
    (root / "etc-link").symlink_to("/etc")  # absolute
    (root / "lib" / "up").symlink_to("../../elsewhere")  # relative, out
    (root / "dot").symlink_to(".")
    (root / "sneaky").symlink_to("dot/..")  # lexically inside; really the tree's parent
    (root / "self-abs").symlink_to(str(root / "lib"))  # absolute into the tree: the source's path
    (root / "dangling").symlink_to("no/such/thing")
    doc = hostfs.scan(str(root), [])
    out = {e["p"]: e["l"] for e in doc["outside_links"]}
    assert out == {
        "etc-link": "/etc",
        "lib/up": "../../elsewhere",
        "sneaky": "dot/..",
        "self-abs": str(root / "lib"),
    }
    assert doc["outside_links_count"] == 4
    assert "4 symlinks point outside the tree" in doc["refusal"]
    assert "etc-link -> /etc" in doc["refusal"] and "outside_links" in doc["refusal"]
    assert hostfs.scan(str(root), [], outside_links="keep")["refusal"] == ""
    assert hostfs.link_escapes(str(root), "bin/python", "/usr/bin/python3")
    assert not hostfs.link_escapes(str(root), "lib64", "lib")


def test_scan_refuses_device_nodes_always(tmp_path):
    if not ROOT:
        pytest.skip("mknod needs root")
    root = venv_tree(tmp_path / "venv")
    try:
        os.mknod(root / "disk", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("this container may not make device nodes")
    doc = hostfs.scan(str(root), [], special_modes="keep", outside_links="keep")
    assert doc["devices"] == ["disk"] and "device" in doc["refusal"]


# -- H3: the source can be destroyed ----------------------------------------------------------


def test_same_or_nested_sees_through_aliases_relative_paths_and_nesting(tmp_path, monkeypatch):
    src = venv_tree(tmp_path / "opt" / "venv")
    alias = tmp_path / "alias"
    alias.symlink_to(tmp_path / "opt")
    ident = pathid.identity
    assert "one directory" in pathid.same_or_nested(ident(str(src)), ident(str(alias / "venv")))
    monkeypatch.chdir(tmp_path / "opt")
    assert "one directory" in pathid.same_or_nested(ident(str(src)), ident("venv"))
    assert "one directory" in pathid.same_or_nested(ident("./venv/../venv"), ident(str(src)))
    inside = pathid.same_or_nested(ident(str(src)), ident(str(src / "lib" / "new")))
    assert "inside the source" in inside
    around = pathid.same_or_nested(ident(str(src / "lib")), ident(str(tmp_path / "opt")))
    assert "inside the destination" in around
    # the destination's backup or staging named as the source: the install would remove it
    backup = pathid.same_or_nested(
        ident(str(tmp_path / "opt" / "v.rb-backup.3")), ident(str(tmp_path / "opt" / "v"))
    )
    assert "backup" in backup
    assert pathid.same_or_nested(ident(str(src)), ident(str(tmp_path / "opt" / "venv2"))) is None
    assert pathid.same_or_nested(ident(str(src)), ident(str(tmp_path / "venv"))) is None


def test_same_or_nested_compares_inodes_when_paths_differ(tmp_path):
    """A bind mount (or a path this host cannot resolve to the same text) shows the same
    (st_dev, st_ino) in the destination's parent chain: refused without relying on the text."""
    src = venv_tree(tmp_path / "src")
    a = pathid.identity(str(src))
    b = pathid.identity(str(src / "lib" / "deeper" / "dest"))
    b = dict(b, realpath="/mnt/elsewhere/dest")  # as a bind mount would show it
    assert "inside the source" in pathid.same_or_nested(a, b)
    a2 = dict(a, realpath="/mnt/also/elsewhere")
    assert "same directory" in pathid.same_or_nested(
        a2, dict(pathid.identity(str(src)), realpath="/x/y")
    )


def test_same_or_nested_needs_one_machine_and_compares_network_mounts_across_machines():
    def ident(real, boot, machine="m1", mount=None, chain=()):
        return {
            "realpath": real,
            "boot_id": boot,
            "machine_id": machine,
            "exists": True,
            "dev_ino": list(chain[0]) if chain else None,
            "chain": [list(c) for c in chain],
            "mount": mount,
        }

    # two machines (cloned images share a machine-id; the boot id tells them apart)
    assert pathid.same_or_nested(ident("/opt/v", "b1"), ident("/opt/v", "b2")) is None
    assert "one directory" in pathid.same_or_nested(ident("/opt/v", "b1"), ident("/opt/v", "b1"))
    # no boot id (not Linux): the machine id decides
    assert "one directory" in pathid.same_or_nested(ident("/opt/v", None), ident("/opt/v", None))
    assert pathid.same_or_nested(ident("/opt/v", None, "m1"), ident("/opt/v", None, "m2")) is None
    # one NFS export mounted on two machines, at different mount points
    nfs_a = {"fstype": "nfs4", "source": "filer:/export/envs", "root": "/", "point": "/nfs"}
    nfs_b = {"fstype": "nfs4", "source": "filer:/export/envs", "root": "/", "point": "/mnt/envs"}
    why = pathid.same_or_nested(
        ident("/nfs/team/v", "b1", mount=nfs_a), ident("/mnt/envs/team/v", "b2", mount=nfs_b)
    )
    assert why is not None and "filer:/export/envs" in why
    assert (
        pathid.same_or_nested(
            ident("/nfs/team/v", "b1", mount=nfs_a), ident("/mnt/envs/team/w", "b2", mount=nfs_b)
        )
        is None
    )
    local = dict(nfs_a, fstype="ext4", source="/dev/sda1")
    assert (
        pathid.same_or_nested(
            ident("/opt/v", "b1", mount=local), ident("/opt/v", "b2", mount=dict(local))
        )
        is None
    )


def test_identity_reads_this_machine(tmp_path):
    doc = pathid.identity(str(tmp_path / "not-yet" / "venv"))
    assert doc["exists"] is False and doc["realpath"] == str(
        tmp_path.resolve() / "not-yet" / "venv"
    )
    assert doc["chain"][0] == [os.stat(tmp_path).st_dev, os.stat(tmp_path).st_ino]
    assert doc["boot_id"] or doc["machine_id"]
    assert json.loads(json.dumps(doc)) == doc


# -- L2: swap without RENAME_EXCHANGE -----------------------------------------------------------


def staged(parent: Path, tag: str) -> Path:
    st = parent / ".venv.rb-staging"
    st.mkdir()
    (st / "tag").write_text(tag)
    return st


def installed(parent: Path, tag: str) -> Path:
    dest = parent / "venv"
    dest.mkdir()
    (dest / "tag").write_text(tag)
    return dest


@pytest.fixture
def no_exchange(monkeypatch):
    """A file system without RENAME_EXCHANGE (NFS): renameat2 reports it cannot."""
    real = swapfs._renameat2

    def fake(src, dst, flags):
        return False if flags == swapfs.RENAME_EXCHANGE else real(src, dst, flags)

    monkeypatch.setattr(swapfs, "_renameat2", fake)


def interrupt_rename(monkeypatch, at: int) -> None:
    """The `at`-th rename (1-based) of the swap raises KeyboardInterrupt, as a ^C would."""
    calls = {"n": 0}
    real = os.rename

    def rename(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)


@pytest.mark.parametrize("policy", ["backup", "replace"])
def test_an_interrupted_two_rename_swap_is_undone_by_the_next_run(
    tmp_path, monkeypatch, no_exchange, policy
):
    staging, dest = staged(tmp_path, "new"), installed(tmp_path, "old")
    with monkeypatch.context() as m:
        interrupt_rename(m, 2)
        with pytest.raises(KeyboardInterrupt):
            swapfs.swap(str(staging), str(dest), policy)
    assert not dest.exists(), "interrupted between the two renames"
    # what the next run (its swap, or --restore) does first: the previous install goes back
    done = swapfs.recover_swap(str(dest))
    assert done["action"] == "undone"
    assert (dest / "tag").read_text() == "old"
    assert swapfs.recover_swap(str(dest)) is None, "the journal is gone"
    assert not [p.name for p in tmp_path.iterdir() if "rb-swap" in p.name]


def test_restore_after_an_interrupted_swap_gives_back_the_previous_install(
    tmp_path, monkeypatch, no_exchange
):
    staging, dest = staged(tmp_path, "new"), installed(tmp_path, "old")
    with monkeypatch.context() as m:
        interrupt_rename(m, 2)
        with pytest.raises(KeyboardInterrupt):
            swapfs.swap(str(staging), str(dest), "backup")
    result = swapfs.restore(str(dest))
    assert (dest / "tag").read_text() == "old"
    assert result["recovered"]["action"] == "undone"


def test_a_swap_finished_but_not_cleaned_up_is_finished(tmp_path, monkeypatch, no_exchange):
    staging, dest = staged(tmp_path, "new"), installed(tmp_path, "old")
    with monkeypatch.context() as m:
        m.setattr(shutil, "rmtree", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            swapfs.swap(str(staging), str(dest), "replace")
    assert (dest / "tag").read_text() == "new"
    assert swapfs.recover_swap(str(dest))["action"] == "finished"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv"]


@pytest.mark.parametrize(
    "at,action,tags", [(2, "undone", ("current", "older")), (3, "finished", ("older", "current"))]
)
def test_an_interrupted_restore_without_rename_exchange_is_finished_or_undone(
    tmp_path, monkeypatch, no_exchange, at, action, tags
):
    dest = installed(tmp_path, "current")
    backup = tmp_path / "venv.rb-backup.1"
    backup.mkdir()
    (backup / "tag").write_text("older")
    with monkeypatch.context() as m:
        interrupt_rename(m, at)
        with pytest.raises(KeyboardInterrupt):
            swapfs.restore(str(dest))
    assert swapfs.recover_swap(str(dest))["action"] == action
    assert ((dest / "tag").read_text(), (backup / "tag").read_text()) == tags
    assert sorted(p.name for p in tmp_path.iterdir()) == ["venv", "venv.rb-backup.1"]
    result = swapfs.restore(str(dest))  # and once more, uninterrupted
    assert result["atomic"] is False
    # the install it replaced is the newest backup now, under a new number (issue 34)
    newest = tmp_path / "venv.rb-backup.2"
    assert ((dest / "tag").read_text(), (newest / "tag").read_text()) == tags[::-1]
    assert result["kept_current_as"] == str(newest) and not backup.exists()


def test_swap_atomic_require_refuses_and_allow_says_so(tmp_path, no_exchange):
    staging, dest = staged(tmp_path, "new"), installed(tmp_path, "old")
    with pytest.raises(OSError, match="RENAME_EXCHANGE"):
        swapfs.swap(str(staging), str(dest), "backup", swap_atomic="require")
    assert (dest / "tag").read_text() == "old" and (staging / "tag").read_text() == "new"
    result = swapfs.swap(str(staging), str(dest), "backup", swap_atomic="allow")
    assert result["atomic"] is False and result["swap_atomic"] == "allow"
    assert "two renames" in result["note"]
    assert (dest / "tag").read_text() == "new"
    assert (tmp_path / "venv.rb-backup.1" / "tag").read_text() == "old"


def test_a_journal_we_did_not_write_is_not_obeyed(tmp_path):
    dest = installed(tmp_path, "old")
    journal = Path(swapfs.journal_path(str(dest)))
    journal.write_text(json.dumps({"v": 1, "op": "swap", "policy": "replace", "old": "../../etc"}))
    with pytest.raises(ValueError, match="journal"):
        swapfs.recover_swap(str(dest))
    journal.unlink()
    journal.symlink_to(bait(tmp_path))
    with pytest.raises(ValueError, match="journal .* was not written by this kit .*a symlink"):
        swapfs.recover_swap(str(dest))
    assert (dest / "tag").read_text() == "old"


# -- L3: a destination that is a symlink ----------------------------------------------------------


def test_swap_and_restore_refuse_a_destination_that_is_a_symlink(tmp_path):
    (tmp_path / "data").mkdir()
    real = installed(tmp_path / "data", "old")
    dest = tmp_path / "venv"
    dest.symlink_to(real)
    staging = staged(tmp_path, "new")
    with pytest.raises(OSError, match=f"symlink to {real}"):
        swapfs.swap(str(staging), str(dest), "backup")
    assert dest.is_symlink() and os.readlink(dest) == str(real)
    assert (real / "tag").read_text() == "old" and (staging / "tag").read_text() == "new"
    (tmp_path / "venv.rb-backup.1").mkdir()
    with pytest.raises(OSError, match="symlink to"):
        swapfs.restore(str(dest))
    assert dest.is_symlink()
    doc = pathid.identity(str(dest))
    assert doc["is_link"] and doc["link_target"] == str(real)
    assert hostfs.scan(str(dest), [])["link_target"] == str(real)


def test_swap_refuses_a_staging_that_is_a_symlink(tmp_path):
    dest = installed(tmp_path, "old")
    elsewhere = tmp_path / "someone-elses"
    elsewhere.mkdir()
    (tmp_path / ".venv.rb-staging").symlink_to(elsewhere)
    with pytest.raises(OSError):
        swapfs.swap(str(tmp_path / ".venv.rb-staging"), str(dest), "backup")
    assert (dest / "tag").read_text() == "old" and not dest.is_symlink()


# -- L4: sparse files, backups that never expire, backups sharing inodes ---------------------------


def test_scan_judges_room_by_apparent_size_for_sparse_files(tmp_path):
    root = venv_tree(tmp_path / "venv")
    sparse = root / "lib" / "big.img"
    with open(sparse, "wb") as f:
        f.truncate(64 << 20)  # 64 MiB apparent, next to nothing on disk
    doc = hostfs.scan(str(root), [])
    assert doc["disk_bytes"] < (1 << 20)
    assert doc["need_bytes"] >= 64 << 20, "tar writes the zeros out: room for the apparent size"
    assert doc["sparse_files"] == ["lib/big.img"] and doc["sparse_count"] == 1


def backups_of(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".rb-backup." in p.name)


def test_prune_backups_keeps_the_newest_n_and_swap_applies_keep_backups(tmp_path):
    dest = installed(tmp_path, "live")
    for n in (1, 2, 3, 5):
        (tmp_path / f"venv.rb-backup.{n}").mkdir()
    outside = tmp_path / "not-a-backup"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (tmp_path / "venv.rb-backup.4").symlink_to(outside)  # named like one, but a link
    removed = swapfs.prune_backups(str(dest), 2)
    assert sorted(os.path.basename(p) for p in removed) == ["venv.rb-backup.1", "venv.rb-backup.2"]
    assert backups_of(tmp_path) == ["venv.rb-backup.3", "venv.rb-backup.4", "venv.rb-backup.5"]
    assert (outside / "keep").exists()
    with pytest.raises(ValueError):
        swapfs.prune_backups(str(dest), 0)
    result = swapfs.swap(str(staged(tmp_path, "new")), str(dest), "backup", keep_backups=2)
    assert result["previous"].endswith("venv.rb-backup.6")
    assert backups_of(tmp_path) == ["venv.rb-backup.4", "venv.rb-backup.5", "venv.rb-backup.6"]
    assert [os.path.basename(p) for p in result["pruned"]] == ["venv.rb-backup.3"]


def test_a_backup_never_shares_inodes_with_the_install_after_an_incremental_run(tmp_path):
    src = venv_tree(tmp_path / "src")
    big = src / "lib" / "python3.11" / "site-packages" / "pkg" / "data.bin"
    big.write_bytes(os.urandom(1 << 20))
    dest = tmp_path / "dst" / "venv"
    dest.parent.mkdir()
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    before = manifest.build(str(src), [], "sha256", jobs=1)
    (src / "bin" / "tool").write_text("#!/old/venv/bin/python\nprint(2)\n")
    new = manifest.build(str(src), [], "sha256", jobs=1)
    staging = dest.parent / ".venv.rb-staging"
    facts = linkstage.stage(str(dest), str(staging), new, before, str(tmp_path / "names"))
    assert facts["linked"] == 2  # data.bin and __init__.py
    names = (tmp_path / "names").read_bytes().split(b"\0")[:-1]
    subprocess.run(
        [
            "tar",
            "-C",
            str(src),
            "--null",
            "--no-recursion",
            "-T",
            str(tmp_path / "names"),
            "-cf",
            str(tmp_path / "d.tar"),
        ],
        check=True,
    )
    subprocess.run(["tar", "-C", str(staging), "-xf", str(tmp_path / "d.tar")], check=True)
    assert names
    result = swapfs.swap(str(staging), str(dest), "backup")
    backup = Path(result["previous"])
    rel = "lib/python3.11/site-packages/pkg/data.bin"
    live, kept = dest / rel, backup / rel
    assert os.stat(live).st_ino != os.stat(kept).st_ino
    assert kept.read_bytes() == big.read_bytes()
    assert os.stat(kept).st_mtime_ns == os.stat(live).st_mtime_ns
    assert stat.S_IMODE(os.stat(kept).st_mode) == stat.S_IMODE(os.stat(live).st_mode)
    assert result["unshared"]["files"] == 2
    with open(live, "r+b") as f:  # a later in-place write
        f.write(b"\0" * 16)
    assert kept.read_bytes() == big.read_bytes(), "the backup is not changed through the install"


# -- M2: the env file goes with its install --------------------------------------------------------


def test_restore_puts_back_the_env_file_of_the_install_it_restores(tmp_path):
    env_file = tmp_path / "venv.env.sh"
    staging = staged(tmp_path, "old")
    dest = tmp_path / "venv"
    swapfs.swap(str(staging), str(dest), "backup")
    exports.write(str(env_file), "export CUDA_HOME=/usr/local/cuda-12.8\n", venv=str(dest))
    with open(dest / ".rb-manifest.jsonl", "w") as f:
        manifestfile.dump(manifest.build(str(dest)), f)
    swapfs.swap(str(staged(tmp_path, "new")), str(dest), "backup")
    exports.write(str(env_file), "export CUDA_HOME=/usr/local/cuda-13.0\n", venv=str(dest))
    # the checks fail: the rollback puts the previous install back, with its env file
    result = swapfs.restore(str(dest), env_file=str(env_file), failed="checks failed: torch")
    assert (dest / "tag").read_text() == "old"
    assert env_file.read_text() == "export CUDA_HOME=/usr/local/cuda-12.8\n"
    assert result["env_file"]["restored"] is True
    assert result["installed"]["tree_check"]["ok"] is True
    # the build that failed its checks is kept apart, never a backup: a second --restore does not
    # bring it back, and says where it is (issue 34)
    failed = tmp_path / "venv.rb-failed"
    assert result["kept_current_as"] == str(failed) and (failed / "tag").read_text() == "new"
    assert installs.failed_mark(str(failed)) == "checks failed: torch"
    with pytest.raises(FileNotFoundError, match="kept apart at .*venv.rb-failed"):
        swapfs.restore(str(dest), env_file=str(env_file))
    assert (dest / "tag").read_text() == "old"


def test_the_versioned_env_file_and_failure_mark_are_not_part_of_the_tree(tmp_path):
    root = venv_tree(tmp_path / "venv")
    m = manifest.build(str(root))
    exports.write(str(tmp_path / "venv.env.sh"), "export A=1\n", venv=str(root))
    (root / ".rb-failed").write_text("x")
    assert manifest.verify(str(root), m)["ok"], "quick checks and verify do not see them as extra"


def test_restore_says_when_the_restored_install_changed_since_it_was_made(tmp_path):
    dest = installed(tmp_path, "old")
    with open(dest / ".rb-manifest.jsonl", "w") as f:
        manifestfile.dump(manifest.build(str(dest)), f)
    swapfs.swap(str(staged(tmp_path, "new")), str(dest), "backup")
    (tmp_path / "venv.rb-backup.1" / "tag").write_text("changed in the backup\n")
    result = swapfs.restore(str(dest))
    check = result["installed"]["tree_check"]
    assert check["ok"] is False and check["changed"] == ["tag"]
    assert result["env_file"] is None


# -- issue 34: an install whose checks failed is kept apart, never a backup ------------------------


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_an_install_that_failed_its_checks_goes_apart_and_a_rollback_brings_it_back(
    tmp_path, monkeypatch, exchange
):
    if not exchange:
        monkeypatch.setattr(swapfs, "_renameat2", lambda src, dst, flags: False)
    dest = installed(tmp_path, "kept after its checks failed")
    (tmp_path / "venv.rb-backup.1").mkdir()
    (tmp_path / "venv.rb-backup.1" / "tag").write_text("good")
    installs.set_checks(str(dest), False, "checks failed: torch")
    result = swapfs.swap(str(staged(tmp_path, "new")), str(dest), "backup")
    failed = tmp_path / "venv.rb-failed"
    assert result["previous"] == str(failed) and result["previous_failed"] is True
    assert backups_of(tmp_path) == ["venv.rb-backup.1"], "never counted as a backup"
    assert swapfs.prune_backups(str(dest), 1) == [], "nor does it evict the good one"
    # the new install's env file fails: the rollback puts back what was there, the new one apart
    got = swapfs.restore(str(dest), failed="step exports failed after the swap", from_failed=True)
    assert (dest / "tag").read_text() == "kept after its checks failed"
    assert (failed / "tag").read_text() == "new" and got["kept_current_as"] == str(failed)
    assert installs.failed_mark(str(failed)) == "step exports failed after the swap"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "venv",
        "venv.rb-backup.1",
        "venv.rb-failed",
    ]
