"""Hostile source trees and hostile hosts, against the kit's own functions (issue #15).

The kit runs as root on machines shared with other users, over trees we did not write. Each test
plants what such a user could plant (a setuid file, a link where the kit writes a temp file, a link
that leaves the tree, a symlinked destination, a sparse file, an alias of the source) and asserts
what reaches the host's files: nothing written outside the tree, no setuid-root file, the source
never replaced, the previous install and its env file recoverable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rbkit import exports, hostfs, manifest, relocate

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


# -- C3: relocation writes through symlinks ------------------------------------------------------


def test_relocation_never_writes_through_a_planted_temp_name(tmp_path):
    root = venv_tree(tmp_path / "venv")
    target = bait(tmp_path)
    (root / "bin" / "activate.rb-tmp").symlink_to(target)     # the old code's fixed temp name
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
    (root / "bin").symlink_to(elsewhere)                       # bin/ leads out of the tree
    cfg = elsewhere / "cfg"
    cfg.write_text("command = /old/venv\n")
    (root / "pyvenv.cfg").symlink_to(cfg)                      # and a config that is a link
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
    env_file.symlink_to(target)                                 # the env file itself a link
    exports.write(str(env_file), "export A=2\n")
    assert target.read_text() == "not yours\n"
    assert env_file.read_text() == "export A=2\n" and not env_file.is_symlink()


def test_names_and_manifest_files_are_never_written_through_a_link(tmp_path):
    root = venv_tree(tmp_path / "venv")
    target = bait(tmp_path)
    kit = tmp_path / "kit"
    kit.mkdir()
    names = kit / "x.names"
    Path(f"{names}.tmp").symlink_to(target)                     # the old code's temp name
    hostfs.scan(str(root), [], str(names))
    assert target.read_text() == "not yours\n"
    assert b"bin/tool\0" in names.read_bytes()
    out = root / ".rb-manifest.jsonl"
    out.symlink_to(target)
    manifest.save(manifest.build(str(root)), str(out))
    assert target.read_text() == "not yours\n" and not out.is_symlink()
    assert manifest.load(str(out))["totals"]["files"] == 4
