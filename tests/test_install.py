"""Installed as a user installs it: the wheel into a fresh venv outside the checkout, and the
pre-commit hook through `pre-commit try-repo`. Both reach the package registry (pip), nothing else.

These run the real tools (pip, venv, pre-commit, the compiled runbook); no part is mocked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
# this checkout's compiler and kit (hostkit/), not an installed one (a worktree's may differ)
CHECKOUT = f"{ROOT / 'hostkit'}{os.pathsep}{ROOT}"
pytestmark = pytest.mark.slow


def sh(argv, *, cwd, env=None, timeout=600, check=True):
    r = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert r.returncode == 0, (
            f"{argv} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    return r


def clean_env(**extra) -> dict:
    """This machine's environment without the checkout on any path."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(ROOT))
    )
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout's files as git would carry them (tracked and not ignored),
    built from a copy: setuptools builds in the tree's own build/, where a module deleted since
    an earlier build is still there and would go into the wheel (a clean clone has no build/)."""
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
    )
    if listed.returncode != 0:  # not a git checkout: the tree as it is
        src = ROOT
    for rel in filter(None, listed.stdout.decode("utf-8", "surrogateescape").split("\0")):
        here = ROOT / rel
        if not here.is_symlink() and not here.is_file():
            continue  # deleted, and not yet committed
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        if here.is_symlink():  # compiler/templates -> ../templates
            os.symlink(os.readlink(here), src / rel)
        else:
            shutil.copy2(here, src / rel)
    sh(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--disable-pip-version-check",
            "-w",
            out,
            src,
        ],
        cwd=out,
    )
    found = list(out.glob("runbook_compiler-*.whl"))
    assert len(found) == 1, found
    return found[0]


def to_local_move(spec_path: Path, source: Path, dest: Path) -> None:
    """Edit a spec made by `compile --new` into a move on this machine (markers dropped)."""
    yaml = YAML()
    data = yaml.load(spec_path.read_text().replace("# TODO(change me)", ""))
    data["hosts"] = {"here": {"local": True}}
    data["transfer"]["from"] = f"here:{source}"
    data["transfer"]["to"] = f"here:{dest}"
    data["transfer"]["on_existing"] = "replace"
    for key in ("cuda", "gpu"):
        data.pop(key, None)
    data["checks"] = [{"imports": ["json", "sqlite3"]}]
    with spec_path.open("w") as f:
        yaml.dump(data, f)


def test_the_wheel_installs_a_compile_that_works_from_any_directory(wheel, tmp_path):
    venv = tmp_path / "tool"
    sh([sys.executable, "-m", "venv", venv], cwd=tmp_path)
    sh(
        [venv / "bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel],
        cwd=tmp_path,
        env=clean_env(),
    )
    compile_ = venv / "bin/compile"
    work = tmp_path / "infra"
    work.mkdir()
    env = clean_env()
    r = sh([compile_, "--version"], cwd=work, env=env)
    assert r.stdout.strip().startswith("runbook-compiler ")
    r = sh([compile_, "--new", "mine"], cwd=work, env=env)
    assert "specs/mine.yaml" in r.stdout and "TODO(change me)" in r.stdout
    assert (work / "specs/runbook-spec.schema.json").is_file()
    assert (
        (work / "specs/mine.yaml")
        .read_text()
        .startswith("# yaml-language-server: $schema=runbook-spec.schema.json\n")
    )
    # a source venv to move, and its destination, both on this machine
    source = tmp_path / "src-venv"
    sh([sys.executable, "-m", "venv", "--without-pip", source], cwd=tmp_path)
    dest = tmp_path / "moved" / "venv"
    to_local_move(work / "specs/mine.yaml", source, dest)
    r = sh([compile_, "specs/mine.yaml"], cwd=work, env=env)
    script = work / "generated/mine.sh"
    assert script.is_file() and list((work / "generated/.kit").glob("*.tar"))
    # byte for byte what the editable install in this checkout writes (beside generated/: a
    # runbook records its spec's path from its own folder)
    ref = work / "ref"
    sh(
        [sys.executable, "-m", "compiler", "specs/mine.yaml", "-o", ref],
        cwd=work,
        env=dict(os.environ, PYTHONPATH=CHECKOUT),
    )
    assert (ref / "mine.sh").read_bytes() == script.read_bytes()
    assert sorted(p.name for p in (ref / ".kit").iterdir()) == sorted(
        p.name for p in (work / "generated/.kit").iterdir()
    )
    # the runbook runs with nothing of the checkout around, and the moved venv works
    r = sh(["bash", script], cwd=work, env=env, timeout=300)
    assert "outcome: ok" in r.stderr
    r = sh([dest / "bin/python", "-c", "import sys; print(sys.prefix)"], cwd=tmp_path)
    assert r.stdout.strip() == str(dest)
    r = sh(["bash", script, "--version"], cwd=work, env=env)
    assert "runbook mine: compiled by runbook-compiler " in r.stdout
    assert sh([compile_, "--check"], cwd=work, env=env).returncode == 0


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_pre_commit_hook_fails_on_drift_then_passes_after_compile(tmp_path):
    pre_commit = Path(sys.executable).parent / "pre-commit"
    if not pre_commit.exists():
        pytest.fail("pre-commit is not installed: it is in the [test] extra (make setup)")
    repo = tmp_path / "infra"
    (repo / "specs").mkdir(parents=True)
    (repo / "specs/one.yaml").write_text(
        (ROOT / "specs/local.yaml").read_text().replace("name: local", "name: one")
    )
    env = clean_env(
        PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    sh(["git", "init", "-q"], cwd=repo, env=env)
    sh(
        [sys.executable, "-m", "compiler", "specs/"],
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=CHECKOUT),
    )
    # drift: the spec changes after its runbook was compiled
    spec = repo / "specs/one.yaml"
    spec.write_text(spec.read_text().replace("jobs: 2", "jobs: 3"))
    sh(["git", "add", "-A"], cwd=repo, env=env)
    try_repo = [pre_commit, "try-repo", ROOT, "runbook-drift", "--all-files"]
    r = sh(try_repo, cwd=repo, env=env, check=False, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "generated/ does not match specs/" in out and "generated/one.sh: differs" in out
    sh(
        [sys.executable, "-m", "compiler", "specs/"],
        cwd=repo,
        env=dict(os.environ, PYTHONPATH=CHECKOUT),
    )
    sh(["git", "add", "-A"], cwd=repo, env=env)
    r = sh(try_repo, cwd=repo, env=env, check=False, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
