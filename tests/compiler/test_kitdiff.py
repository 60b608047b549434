"""A kit change, made reviewable: `compile --kit-diff OLD NEW` and compile --plan's "Kit" section
(issue 46): which kit files changed and by how many lines, from a hash, a tar or git history."""

from __future__ import annotations

import hashlib
import subprocess

from rbrules.kittar import tar_bytes

from compiler import kit, kitdiff

from .test_cli import GOOD, compile_


def _tar(files: dict[str, str]) -> bytes:
    return tar_bytes([(p, t.encode()) for p, t in sorted(files.items())])


OLD = {"rbkit/a.py": "one\ntwo\nthree\n", "rbkit/gone.py": "x\n", "runtime.sh": "echo hi\n"}
NEW = {"rbkit/a.py": "one\n2\nthree\nfour\n", "rbkit/new.py": "y\nz\n", "runtime.sh": "echo hi\n"}


def test_changes_count_lines_per_file_and_name_added_and_removed_files(tmp_path):
    (tmp_path / "old.tar").write_bytes(_tar(OLD))
    (tmp_path / "new.tar").write_bytes(_tar(NEW))
    old = kitdiff.load(str(tmp_path / "old.tar"), tmp_path)
    new = kitdiff.load(str(tmp_path / "new.tar"), tmp_path)
    assert kitdiff.summary(old, new) == [
        "rbkit/a.py: +2 -1",
        "rbkit/gone.py: +0 -1 (removed)",
        "rbkit/new.py: +2 -0 (added)",
    ]
    text = kitdiff.diff(old, new)
    assert text.startswith(f"kit {tmp_path / 'old.tar'} -> {tmp_path / 'new.tar'}: 3 file(s)")
    assert "+++ b/rbkit/a.py" in text and "-two" in text and "+2" in text
    assert "runtime.sh" not in text


def test_kit_diff_command_takes_hash_prefixes_from_the_output_directory(tmp_path):
    kits = tmp_path / "generated" / ".kit"
    kits.mkdir(parents=True)
    shas = []
    for files in (OLD, NEW):
        data = _tar(files)
        sha = hashlib.sha256(data).hexdigest()
        (kits / f"{sha}.tar").write_bytes(data)
        shas.append(sha)
    r = compile_("--kit-diff", shas[0][:10], shas[1], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rbkit/a.py: +2 -1" in r.stdout and "@@" in r.stdout
    bad = compile_("--kit-diff", "abcdef0123", shas[1], cwd=tmp_path)
    assert bad.returncode == 64
    assert "abcdef0123: no kit of that sha256" in bad.stderr


def test_a_kit_pruned_from_the_folder_is_read_from_git_history(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(tmp_path)], check=True)
    kits = tmp_path / "generated" / ".kit"
    kits.mkdir(parents=True)
    data = _tar(OLD)
    sha = hashlib.sha256(data).hexdigest()
    (kits / f"{sha}.tar").write_bytes(data)
    subprocess.run([*git, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-qm", "pin"], cwd=tmp_path, check=True)
    (kits / f"{sha}.tar").unlink()
    subprocess.run([*git, "commit", "-qam", "prune"], cwd=tmp_path, check=True)
    found = kitdiff.load(sha[:12], tmp_path / "generated")
    assert found.files == OLD


def test_plan_lists_the_kit_files_changed_since_the_committed_runbook(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "one.yaml").write_text(GOOD.format(name="one"))
    assert compile_("specs/one.yaml", cwd=tmp_path).returncode == 0
    plan = compile_("--plan", "specs/one.yaml", cwd=tmp_path)
    assert plan.returncode == 0 and "### Kit" not in plan.stdout
    # the committed runbook pins an older kit: one file of it differs from today's
    sha, data = kit.pinned()
    files = kitdiff._from_tar(data, "now").files
    files["rbkit/engine.py"] = files["rbkit/engine.py"] + "# an older line\n"
    old = _tar(files)
    old_sha = hashlib.sha256(old).hexdigest()
    (tmp_path / "generated" / ".kit" / f"{old_sha}.tar").write_bytes(old)
    script = tmp_path / "generated" / "one.sh"
    script.write_text(script.read_text().replace(sha, old_sha))
    plan = compile_("--plan", "specs/one.yaml", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert "### Kit" in plan.stdout
    assert f"pins `{old_sha[:12]}`, this compile pins `{sha[:12]}`" in plan.stdout
    assert "- `rbkit/engine.py`: +0 -1" in plan.stdout
