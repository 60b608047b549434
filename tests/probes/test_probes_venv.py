"""relocation, outside, the command check's PATH, and preflight: on real venvs made here
(python -m venv --without-pip), moved with os.rename and fixed with rbkit's relocate."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from probes_helpers import (
    ROOT,
    cli_json,
    fatbin_container,
    fatbin_entry,
    run_cli,
    tiny_cubin,
    tiny_ptx,
    tiny_so,
)
from rbprobes import run_check
from rbprobes.checks_hatch import command_names
from rbprobes.checks_venv import outside_refs, parse_interpreter
from rbprobes.result import Context

from tests.conftest import IN_CI


def make_venv(path):
    """A venv with the console scripts pip writes: a plain shebang, the '''exec' trampoline,
    a script through /usr/bin/env, and a shell script."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120
    )
    bindir = path / "bin"
    scripts = {
        "plain-tool": "#!%s/bin/python\nimport sys\nprint('plain', sys.prefix)\n" % path,
        "long-tool": "#!/bin/sh\n'''exec' \"%s/bin/python\" \"$0\" \"$@\"\n' '''\nprint(1)\n"
        % path,
        "env-tool": "#!/usr/bin/env python3\nprint('env')\n",
        "shell-tool": "#!/bin/sh\necho shell\n",
    }
    for name, text in scripts.items():
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    return path


@pytest.fixture
def venv(tmp_path):
    return make_venv(tmp_path / "src" / ".venv")


def reloc(path, **params):
    return run_check({"type": "relocation", "params": params}, Context(venv=str(path)))


def test_parse_interpreter_forms():
    assert parse_interpreter(b"#!/v/bin/python\n") == ("/v/bin/python", [], "shebang")
    assert parse_interpreter(b"#!/usr/bin/env -S python3 -u\n") == (
        "/usr/bin/env",
        ["-S", "python3", "-u"],
        "shebang",
    )
    tramp = b"#!/bin/sh\n'''exec' \"/a b/bin/python\" \"$0\" \"$@\"\n' '''\n"
    assert parse_interpreter(tramp) == ("/a b/bin/python", ["$0", "$@"], "trampoline")
    assert parse_interpreter(b"no shebang") is None


def test_a_fresh_venv_passes(venv):
    result = reloc(venv)
    assert result["status"] == "pass", result["reason"]
    v = result["values"]
    assert {s["script"] for s in v["scripts"]} >= {
        "bin/plain-tool",
        "bin/long-tool",
        "bin/env-tool",
        "bin/shell-tool",
    }
    forms = {s["script"]: s["form"] for s in v["scripts"]}
    assert forms["bin/long-tool"] == "trampoline"
    assert v["python"]["prefix"] == str(venv) and v["python"]["version"]
    assert set(v["activate"]) >= {"activate", "activate.fish", "Activate.ps1"}
    assert v["system_interpreters"] == ["bin/shell-tool: /bin/sh"]


def test_a_moved_venv_fails_until_relocated(venv, tmp_path):
    """Moved with a rename: every script still runs (or names) the old path; the activate
    scripts name it. rbkit's relocate fixes it and the proof passes."""
    new = tmp_path / "dst" / ".venv"
    new.parent.mkdir()
    os.rename(venv, new)
    result = reloc(new, old=str(venv))
    assert result["status"] == "fail"
    v = result["values"]
    assert {"bin/plain-tool", "bin/long-tool", "bin/activate"} <= set(v["names_old"])
    problems = {(p["file"], p["what"]) for p in v["problems"]}
    assert ("bin/plain-tool", "interpreter %s/bin/python does not exist" % venv) in problems
    env = dict(os.environ, PYTHONPATH=str(ROOT / "hostkit"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit",
            "relocate",
            str(new),
            "--old",
            str(venv),
            "--new",
            str(new),
        ],
        check=True,
        env=env,
        capture_output=True,
        timeout=120,
    )
    fixed = reloc(new, old=str(venv))
    assert fixed["status"] == "pass", fixed["reason"]
    assert "no file in bin/ names %s" % venv in fixed["reason"]


def test_old_prefix_is_matched_as_a_whole_path(venv, tmp_path):
    """/x/.venv must not match /x/.venv2 (the new path may extend the old one)."""
    longer = str(venv) + "2"
    os.rename(venv, longer)
    subprocess.run(
        [sys.executable, "-m", "rbkit", "relocate", longer, "--old", str(venv), "--new", longer],
        check=True,
        capture_output=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT / "hostkit")),
    )
    result = reloc(longer, old=str(venv))
    assert result["status"] == "pass", result["reason"]


def test_a_python_script_running_a_python_outside_the_venv_fails(venv):
    tool = venv / "bin" / "stray-tool"
    tool.write_text("#!%s\nprint(1)\n" % sys.executable)
    tool.chmod(0o755)
    result = reloc(venv)
    assert result["status"] == "fail"
    assert "bin/stray-tool runs %s, a python outside the venv" % sys.executable in result["reason"]


def test_env_to_a_missing_program_fails(venv):
    tool = venv / "bin" / "ghost-tool"
    tool.write_text("#!/usr/bin/env no-such-interpreter-qq\n")
    tool.chmod(0o755)
    result = reloc(venv)
    assert result["status"] == "fail" and "no-such-interpreter-qq" in result["reason"]


def test_pyvenv_home_must_exist(venv):
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("home = ", "home = /nowhere/qq"))
    result = reloc(venv)
    assert result["status"] == "fail" and "pyvenv.cfg home /nowhere/qq" in result["reason"]


def test_python_that_does_not_start_in_time_fails(venv):
    py = venv / "bin" / "python"
    py.unlink()
    py.write_text("#!/bin/sh\nsleep 30\n")
    py.chmod(0o755)
    result = reloc(venv, timeout_s=1)
    assert result["status"] == "fail" and "did not finish" in result["reason"]
    assert result["duration_s"] < 20


def test_relocation_cli(venv):
    done = run_cli("relocation", str(venv), "--old", "/somewhere/else")
    assert done.returncode == 0, done.stdout + done.stderr
    assert cli_json(done)["type"] == "relocation"
    done = run_cli("relocation", str(venv), "--old", str(venv))
    assert done.returncode == 1 and "the venv's own path" in cli_json(done)["reason"]


# the command check


def test_command_names():
    assert command_names("FOO=1 env BAR=2 python -c 'x' && nvidia-smi -L | grep H200") == [
        "env",
        "python",
        "nvidia-smi",
        "grep",
    ]
    assert command_names("torchrun --help") == ["torchrun"]


def test_command_runs_the_venvs_program_and_says_which(venv):
    """The venv's bin/ comes first in PATH, and the file that ran is reported."""
    result = run_check(
        {"type": "command", "params": {"run": "plain-tool"}}, Context(venv=str(venv))
    )
    assert result["status"] == "pass", result["reason"]
    assert result["values"]["executed"] == str(venv / "bin" / "plain-tool")
    assert "ran %s" % (venv / "bin" / "plain-tool") in result["reason"]
    assert "plain %s" % venv in result["values"]["output_tail"]


def test_command_fails_when_a_venv_name_resolves_elsewhere(venv):
    """bin/uname exists in the venv but is not executable: /bin/sh runs the system's."""
    (venv / "bin" / "uname").write_text("#!/bin/sh\necho venv-uname\n")
    result = run_check({"type": "command", "params": {"run": "uname -s"}}, Context(venv=str(venv)))
    assert result["status"] == "fail"
    assert "resolved outside the venv's bin/" in result["reason"] and "uname" in result["reason"]


@pytest.mark.skipif(
    not os.path.realpath("/bin/sh").endswith("dash") and not IN_CI,
    reason="needs dash as /bin/sh (it goes on down PATH when an exec fails)",
)
def test_command_fails_when_the_venvs_script_names_a_missing_interpreter(
    venv, tmp_path, monkeypatch
):
    """bin/tool's #! names an interpreter that is not there; dash then runs the tool of the same
    name further down PATH, which exits 0: the check must not pass saying it ran the venv's."""
    (venv / "bin" / "tool").write_text("#!%s/gone/bin/python\nprint('venv tool')\n" % tmp_path)
    (venv / "bin" / "tool").chmod(0o755)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "tool").write_text("#!/bin/sh\necho other tool\n")
    (other / "tool").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (other, os.environ["PATH"]))
    result = run_check(
        {"type": "command", "params": {"run": "tool --help"}}, Context(venv=str(venv))
    )
    assert result["status"] == "fail", result["reason"]
    assert (
        "the venv's %s cannot be executed: its #! line names the interpreter %s/gone/bin/python,"
        " which does not exist here" % (venv / "bin" / "tool", tmp_path)
    ) in result["reason"]
    assert "ran %s" % (venv / "bin" / "tool") not in result["reason"]


# outside


def site(venv):
    (path,) = list((venv / "lib").glob("python*/site-packages"))
    return path


def test_clean_venv_has_no_outside_refs(venv):
    assert outside_refs(str(venv)) == []
    result = run_check({"type": "outside", "params": {}}, Context(venv=str(venv)))
    assert result["status"] == "pass"


def test_every_kind_of_outside_reference(venv, tmp_path):
    sp = site(venv)
    src = tmp_path / "checkout" / "mypkg"
    src.mkdir(parents=True)
    (sp / "__editable___mypkg_1_0_finder.py").write_text(
        "MAPPING: dict[str, str] = {'mypkg': %r}\nNAMESPACES: dict[str, list[str]] = {}\n"
        % str(src)
    )
    (sp / "__editable__.mypkg-1.0.pth").write_text(
        "import __editable___mypkg_1_0_finder; __editable___mypkg_1_0_finder.install()\n"
    )
    (sp / "__editable__.other-2.0.pth").write_text("%s\n" % (tmp_path / "checkout" / "other"))
    (sp / "extra.pth").write_text(
        "# a comment\nimport os\n%s\ninside_dir\n../../../../../outrel\n"
        % (tmp_path / "shared-libs")
    )
    info = sp / "mypkg-1.0.dist-info"
    info.mkdir()
    (info / "direct_url.json").write_text(
        json.dumps({"url": "file://%s" % src.parent, "dir_info": {"editable": True}})
    )
    plain = sp / "plain-1.0.dist-info"
    plain.mkdir()
    (plain / "direct_url.json").write_text(
        json.dumps({"url": "file:///wheels/plain.whl", "archive_info": {}})
    )
    (sp / "data").mkdir()
    os.symlink("/etc/hostname", str(sp / "data" / "hostname"))
    os.symlink("../data", str(sp / "data" / "inside-link"))
    refs = outside_refs(str(venv))
    got = {(r["kind"], os.path.basename(r["file"]), r["target"]) for r in refs}
    rel_out = os.path.normpath(os.path.join(str(sp), "../../../../../outrel"))
    assert got == {
        ("editable", "__editable___mypkg_1_0_finder.py", str(src)),
        ("editable", "__editable__.other-2.0.pth", str(tmp_path / "checkout" / "other")),
        ("pth", "extra.pth", str(tmp_path / "shared-libs")),
        ("pth", "extra.pth", rel_out),
        ("editable", "direct_url.json", str(src.parent)),
        ("symlink", "hostname", "/etc/hostname"),
    }
    by_file = {os.path.basename(r["file"]): r for r in refs}
    assert by_file["__editable___mypkg_1_0_finder.py"]["package"] == "mypkg 1.0"
    assert by_file["direct_url.json"]["package"] == "mypkg 1.0"
    assert all(r["fix"] for r in refs)
    done = run_cli("outside", str(venv))
    assert done.returncode == 1
    result = cli_json(done)
    assert "fix:" in result["reason"] and str(src) in result["values"]["targets"]


def test_system_site_packages_is_an_outside_reference(venv):
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(
        cfg.read_text().replace(
            "include-system-site-packages = false", "include-system-site-packages = true"
        )
    )
    (ref,) = outside_refs(str(venv))
    assert ref["kind"] == "system_site_packages"


# preflight


def test_preflight_names_files_packages_and_fixes(venv, tmp_path):
    sp = site(venv)
    lib = sp / "fastops" / "libfastops.so"
    lib.parent.mkdir()
    lib.write_bytes(
        tiny_so(fatbin_container(fatbin_entry(2, 80, payload=tiny_cubin(["fast_kernel"], 80))))
    )
    info = sp / "fastops-0.3.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("fastops/libfastops.so,sha256=x,1\n")
    (sp / "extra.pth").write_text("/opt/elsewhere/lib\n")
    done = run_cli("preflight", "--venv", str(venv), "--arch", "sm_103")
    assert done.returncode == 1, done.stderr
    doc = cli_json(done)
    assert doc["kind"] == "preflight" and doc["schema"] == 1 and doc["ok"] is False
    assert doc["arch"] == "sm_103" and [c["type"] for c in doc["checks"]] == [
        "kernel_audit",
        "outside",
    ]
    assert doc["packages"] == ["fastops 0.3"]
    rel = os.path.relpath(lib, venv)
    assert set(doc["files"]) == {rel, os.path.relpath(sp / "extra.pth", venv)}
    (k,) = [p for p in doc["problems"] if p["check"] == "kernel_audit"]
    assert k["kernels"] == ["fast_kernel"] and "compute_103,code=sm_103" in k["fix"]
    assert "fastops 0.3" in done.stderr and "fix:" in done.stderr


def test_preflight_driver_limit_comes_from_the_arguments(venv):
    lib = site(venv) / "libjit.so"
    lib.write_bytes(
        tiny_so(
            fatbin_container(
                fatbin_entry(1, 80, payload=tiny_ptx(["jit_kernel"], "9.0"), version=(9, 0))
            )
        )
    )
    ok = run_cli("preflight", "--venv", str(venv), "--arch", "sm_90")
    assert ok.returncode == 0, ok.stdout
    assert "not checked" in cli_json(ok)["checks"][0]["reason"]
    old = run_cli("preflight", "--venv", str(venv), "--arch", "sm_90", "--driver-cuda", "12.8")
    assert old.returncode == 1 and "jit_kernel" in old.stdout


def test_preflight_with_old_runs_the_relocation_proof(venv, tmp_path):
    new = tmp_path / "moved"
    os.rename(venv, new)
    done = run_cli("preflight", "--venv", str(new), "--arch", "sm_90", "--old", str(venv))
    doc = cli_json(done)
    assert done.returncode == 1 and [c["type"] for c in doc["checks"]] == [
        "kernel_audit",
        "outside",
        "relocation",
    ]
    assert any(p["check"] == "relocation" and p["file"] == "bin/activate" for p in doc["problems"])


def test_preflight_usage_errors(venv):
    assert run_cli("preflight", "--venv", str(venv), "--arch", "compute_90").returncode == 2
    assert run_cli("preflight", "--venv", str(venv)).returncode == 2
