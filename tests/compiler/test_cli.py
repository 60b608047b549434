"""The compile command as a user meets it: exit codes, messages, what is (not) written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GOOD = """name: {name}
hosts:
  here: {{local: true}}
transfer:
  from: here:.venv
  to: here:runs/{name}/venv
"""


def compile_(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # this checkout's compiler and kit (hostkit/), not an installed one
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'hostkit'}{os.pathsep}{ROOT}")
    return subprocess.run(
        [sys.executable, "-m", "compiler", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def project(tmp_path):
    (tmp_path / "specs").mkdir()
    for name in ("one", "two"):
        (tmp_path / "specs" / f"{name}.yaml").write_text(GOOD.format(name=name))
    return tmp_path


def test_compiles_several_specs_into_generated(project):
    r = compile_("specs/one.yaml", "specs/two.yaml", cwd=project)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (project / "generated").iterdir()) == [".kit", "one.sh", "two.sh"]
    kits = list((project / "generated" / ".kit").iterdir())
    assert len(kits) == 1 and kits[0].suffix == ".tar"  # one kit, pinned by both runbooks
    text = (project / "generated" / "one.sh").read_text()
    assert f"readonly RB_KIT_SHA256={kits[0].stem}\n" in text
    assert text.startswith("#!/usr/bin/env bash\n# @generated from specs/one.yaml (sha256 ")
    assert os.access(project / "generated" / "one.sh", os.X_OK)


def test_output_is_deterministic(project):
    compile_("specs/one.yaml", cwd=project)
    first = (project / "generated" / "one.sh").read_bytes()
    compile_("specs/one.yaml", cwd=project)
    assert (project / "generated" / "one.sh").read_bytes() == first


def test_output_does_not_depend_on_the_directory_compile_runs_in(project):
    """Issue 33 N6: the runbook names its spec, and records where its seal finds it, the same way
    whether compile ran in the project, in specs/, or at / with absolute paths."""
    assert compile_("specs/one.yaml", cwd=project).returncode == 0
    first = (project / "generated" / "one.sh").read_bytes()
    assert b"readonly -a RB_SPEC_FILES=(specs/one.yaml ../specs/one.yaml " in first
    for args, cwd in (
        (["one.yaml", "-o", "../generated"], project / "specs"),
        ([str(project / "specs" / "one.yaml"), "-o", str(project / "generated")], Path("/")),
    ):
        r = compile_(*args, cwd=cwd)
        assert r.returncode == 0, r.stderr
        assert (project / "generated" / "one.sh").read_bytes() == first, (args, cwd)


def test_directory_argument_and_output_dir(project):
    r = compile_("specs", "-o", "out", cwd=project)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (project / "out").iterdir()) == [".kit", "one.sh", "two.sh"]


def test_one_bad_spec_means_nothing_is_written(project):
    (project / "specs" / "two.yaml").write_text(GOOD.format(name="two") + "  rout: relay\n")
    r = compile_("specs", cwd=project)
    assert r.returncode == 2
    assert (
        "specs/two.yaml:7:3: transfer.rout: unknown key 'rout'; did you mean 'route'?" in r.stderr
    )
    assert "Traceback" not in r.stderr
    assert not (project / "generated").exists()


def test_check_names_every_drifted_file_and_exits_4(project):
    assert compile_("specs", cwd=project).returncode == 0
    assert compile_("--check", cwd=project).returncode == 0
    (project / "specs" / "one.yaml").write_text(
        GOOD.format(name="one").replace("runs/one", "runs/x")
    )
    (project / "generated" / "stray.sh").write_text("#!/bin/sh\n")
    r = compile_("--check", cwd=project)
    assert r.returncode == 4
    assert "generated/one.sh: differs from specs/one.yaml" in r.stderr
    assert "generated/stray.sh: no spec in specs/ compiles to it" in r.stderr
    assert "two.sh" not in r.stderr


def test_usage_errors_exit_64(project):
    r = compile_("specs/nope.yaml", cwd=project)
    assert r.returncode == 64
    assert "no such file" in r.stderr


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "compile"
    assert exe.exists(), "pip install -e . provides the `compile` command"


def test_repository_specs_match_generated():
    """specs/*.yaml must recompile to the committed generated/*.sh byte for byte."""
    r = compile_("--check", cwd=ROOT)
    assert r.returncode == 0, r.stderr + r.stdout


def test_generated_runbooks_pass_shellcheck_on_their_own():
    from compiler import lint

    for script in sorted((ROOT / "generated").glob("*.sh")):
        assert lint.shellcheck(script.read_text()) == [], script


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is needed")
def test_runbook_list_help_and_dry_run_run_nothing(project):
    compile_("specs/one.yaml", cwd=project)
    script = project / "generated" / "one.sh"
    for flag, expect in (
        ("--list", "1. preflight"),
        ("--help", "--dry-run"),
        ("--dry-run", "on here: tar -C .venv"),
    ):
        r = subprocess.run(["bash", str(script), flag], cwd=project, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert expect in r.stdout
    assert not (project / "runs").exists(), "--list/--help/--dry-run must not start a run"
    r = subprocess.run(
        ["bash", str(script), "--only", "nope"], cwd=project, capture_output=True, text=True
    )
    assert r.returncode == 2 and "unknown step: nope" in r.stderr


def test_a_runbook_starts_python_without_a_version_managers_shim(project, tmp_path):
    """The local Python is the first python3 on PATH that is a program: a shim script before it
    (pyenv's costs 0.15 s a start) is not run. A program that is no working Python (here `true`)
    is passed over for plain `python3`; one the shim leads to still works."""
    compile_("specs/one.yaml", cwd=project)
    script = project / "generated" / "one.sh"
    real = os.path.realpath(sys.executable)
    shims, broken = tmp_path / "shims", tmp_path / "broken"
    shims.mkdir()
    broken.mkdir()
    calls = tmp_path / "shim-calls"
    (shims / "python3").write_text(f'#!/bin/sh\necho x >>"{calls}"\nexec "{real}" "$@"\n')
    (shims / "python3").chmod(0o755)
    (broken / "python3").symlink_to(shutil.which("true"))
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / "python3").symlink_to(real)
    base = os.environ.get("PATH", "")
    for path, shim_runs in ((f"{shims}:{real_dir}:{base}", 0), (f"{shims}:{broken}:{base}", 1)):
        calls.unlink(missing_ok=True)
        r = subprocess.run(
            ["bash", str(script), "--list"],
            cwd=project,
            capture_output=True,
            text=True,
            env=dict(os.environ, PATH=path),
        )
        assert r.returncode == 0, r.stderr
        assert "1. preflight" in r.stdout
        assert (calls.read_text().count("x") if calls.exists() else 0) == shim_runs, path


def test_no_key_material_in_any_generated_script():
    scripts = sorted((ROOT / "generated").glob("*.sh")) + sorted(
        (ROOT / "tests" / "cases" / "valid").glob("*.sh")
    )
    assert scripts
    for script in scripts:
        text = script.read_text()
        assert "PRIVATE KEY-----" not in text, script
        assert "sshpass" not in text and "PuTTY-User-Key-File" not in text, script


def test_a_reviewers_plain_shellcheck_passes_on_every_generated_runbook():
    """No options, default severity: the runbook's own directives (with their reasons) are all a
    reviewer needs; lint.py leaves off only optional checks."""
    from compiler import lint

    scripts = sorted(str(p) for p in (ROOT / "generated").glob("*.sh"))
    assert scripts
    r = subprocess.run(
        [lint.shellcheck_binary(), *scripts], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-3000:]


def test_check_reports_the_mistakes_of_every_spec_at_once(project):
    """--check compiles each spec in the form its runbook has (pinned or --standalone) and still
    lists every spec's mistakes, not the first spec's only."""
    assert compile_("specs", cwd=project).returncode == 0
    for name in ("one", "two"):
        spec = project / "specs" / f"{name}.yaml"
        spec.write_text(spec.read_text() + "bogus_key: 1\n")
    r = compile_("--check", cwd=project)
    assert r.returncode == 2
    assert "specs/one.yaml" in r.stderr and "specs/two.yaml" in r.stderr


def test_new_from_the_example_holds_placeholders_that_compile_names_all_at_once(tmp_path):
    """Issue 36: `compile --new mine` leaves no real-looking host or path; each value that is the
    example's own is a placeholder, and compile refuses the spec naming every one of them."""
    r = compile_("--new", "mine", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "specs/mine.yaml").read_text()
    assert "old-gpu.example" not in text and "/opt/venv" not in text
    # issue 45: the example's library dirs are no venv's: `[nvidia/cu13/lib]` passed --plan and
    # failed the exports step after the swap; it is a placeholder too
    assert "library_path_first: [nvidia/cu13/lib]" not in text
    listed = [line.split(": ")[-1] for line in r.stdout.splitlines()[1:]]
    assert listed == [
        "description",
        "hosts.old.ssh",
        "hosts.new.ssh",
        "transfer.from",
        "transfer.to",
        "cuda.version",
        "cuda.home",
        "cuda.library_path_first[0]",
        "gpu.model",
    ]
    r = compile_("specs/mine.yaml", cwd=tmp_path)
    assert r.returncode == 2 and not (tmp_path / "generated").exists()
    lines = r.stderr.splitlines()
    assert lines[-1] == "9 problems; nothing was written"
    assert lines[1] == (
        "specs/mine.yaml:11:10: hosts.old.ssh: still the placeholder "
        "'<source host, e.g. root@gpu-old.example.org: CHANGE ME>' of compile "
        "--new: write this spec's value there"
    )
    assert lines[3].startswith(
        "specs/mine.yaml:15:9: transfer.from: still the placeholder "
        "'<path of the venv on the source host: CHANGE ME>'"
    )
    assert sum("still the placeholder" in line for line in lines) == 8
    # the placeholder is the only problem of its entry, not also "not a valid host name"
    assert "valid" not in r.stderr and "absolute" not in r.stderr


def test_a_placeholder_left_in_a_base_is_named_in_the_base(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/base.yaml").write_text(
        "abstract: true\nhosts:\n  here: {local: true}\n  far: {ssh: '<host: CHANGE ME>'}\n"
    )
    (tmp_path / "specs/child.yaml").write_text(
        "extends: base.yaml\nname: child\ntransfer:\n  from: here:.venv\n"
        "  to: 'far:/opt/<dir: CHANGE ME>/venv'\n"
    )
    r = compile_("specs/child.yaml", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[:2] == [
        "specs/base.yaml:4:14: hosts.far.ssh: still the placeholder '<host: CHANGE ME>' of "
        "compile --new: write this spec's value there",
        "specs/child.yaml:5:7: transfer.to: still the placeholder '<dir: CHANGE ME>' of "
        "compile --new: write this spec's value there",
    ]


@pytest.mark.parametrize(
    "checks, said",
    [
        ("checks: []\n", "checks is empty"),
        ("checks:\n  - imports: [json]\n", "checks lists only imports"),
        ("", "checks is empty"),
    ],
)
def test_a_gpu_that_no_check_runs_on_is_a_warning(project, checks, said):
    """Issue 36: `checks: []` with `gpu:` compiled silently; now a warning on stderr at the input,
    and the runbook is written (exit 0)."""
    spec = project / "specs/one.yaml"
    spec.write_text(GOOD.format(name="one") + "gpu: {model: H100}\n" + checks)
    r = compile_("specs/one.yaml", cwd=project)
    assert r.returncode == 0, r.stderr
    assert (project / "generated/one.sh").is_file()
    line = 8 if checks else 7
    where = f"specs/one.yaml:{line}:1: warning: {'checks' if checks else 'gpu'}: "
    assert r.stderr.startswith(
        where + f"gpu: H100 is declared but {said}: nothing will prove the GPU"
    ), r.stderr
    spec.write_text(GOOD.format(name="one") + "gpu: {model: H100}\nchecks:\n  - devices: {}\n")
    assert compile_("specs/one.yaml", cwd=project).stderr == ""
