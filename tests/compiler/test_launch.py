"""Every place a runbook starts Python on a host, enumerated: each is isolated and starts from a
private working directory (issue 33, "Safe as root on a shared cluster, round two").

The bash side is read from what actually runs: every generated runbook of specs/ with its runtime
in place (the kit's runtime.sh) and the fan-out node's script; the host side from the kit's Python
files. A new start that is not isolated, or that puts the working directory on sys.path (`-m`,
PYTHONPATH), fails here, naming the line.
"""

from __future__ import annotations

import ast
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rbrules import launch, private

from compiler import kit, plan
from compiler.cli import main as compile_main

ROOT = Path(__file__).resolve().parents[2]
FLAGS = " ".join(launch.FLAGS)

# a word that runs a Python, in the runbooks' bash, followed by its first argument
PYTHON_WORD = (
    r'(?:python3?|"\$\{RB_LOCAL_PY\}"|"\$\{RB_PY\[[^]]*\]:-python3\}"|(?<=&& )"\$1"'
    r'|"\$\{RB_KIT_ARGV\[@\]\}")'
)
START = re.compile(r"(?:^|[\s;&|(]|\$\()" + PYTHON_WORD + r'\s+(-\S*|"\$\S+|/\S+)')
HEREDOC = re.compile(r"<<'([A-Za-z_][A-Za-z0-9_]*)'\s*$")


def bash_lines(text: str):
    """(number, line) of the bash that runs: comments and quoted heredoc bodies (Python) left
    out."""
    end = None
    for n, line in enumerate(text.split("\n"), 1):
        if end is not None:
            if line == end:
                end = None
            continue
        m = HEREDOC.search(line)
        if m:
            end = m.group(1)
        if line.lstrip().startswith("#"):
            continue
        yield n, line


@pytest.fixture(scope="module")
def runbooks(tmp_path_factory) -> dict[str, str]:
    """Every spec's runbook, runtime in place (compile --standalone: what runs, in one text)."""
    out = tmp_path_factory.mktemp("standalone")
    texts = {}
    for spec in sorted((ROOT / "specs").glob("*.yaml")):
        if "abstract: true" in spec.read_text():
            continue
        assert compile_main([str(spec), "-o", str(out), "--standalone"]) == 0
        texts[spec.stem] = (out / f"{spec.stem}.sh").read_text()
    assert len(texts) >= 5
    return texts


def starts(text: str) -> list[tuple[int, str, str]]:
    # (rb::py_argv's arguments name the interpreter; the words it makes are checked below)
    return [
        (n, line.strip(), m.group(1))
        for n, line in bash_lines(text)
        for m in START.finditer(line)
        if not line.lstrip().startswith("rb::py_argv ")
    ]


def test_every_python_start_in_a_runbook_is_isolated(runbooks):
    for name, text in runbooks.items():
        found = starts(text)
        # the boot and seal (stdin), the local interpreter's path, the kit's sha256 fallback,
        # the wide pipe, the remote preparation, and every kit start through RB_KIT_ARGV
        assert len(found) >= 6, (name, found)
        for n, line, first in found:
            isolated = (
                first == '"${RB_PY_FLAGS[@]}"'
                or line.count(FLAGS)
                or ("RB_KIT_ARGV" in line and "RB_PY_FLAGS" not in line)
            )
            assert isolated, f"{name}.sh:{n}: a Python started without {FLAGS}: {line}"
        # RB_KIT_ARGV is made in one place, from the rule's words
        made = [
            line.strip()
            for _n, line in bash_lines(text)
            if "RB_KIT_ARGV=(" in line and "declare" not in line
        ]
        assert made == ['RB_KIT_ARGV=("$1" "${RB_PY_FLAGS[@]}" "$2/${RB_PY_START}" "$3")'], made
        assert f"readonly -a RB_PY_FLAGS=({FLAGS})" in text
        assert f"readonly RB_PY_START={launch.START}" in text


def test_no_runbook_puts_a_directory_on_sys_path_or_starts_a_module_by_name(runbooks):
    for name, text in runbooks.items():
        for n, line in bash_lines(text):
            for bad in ("PYTHONPATH", " -m rbkit", " -m rbprobes"):
                assert bad not in line, f"{name}.sh:{n}: {line.strip()}"
            assert not re.search(r"(^|\s)-S -[mc]?(\s|$)", line), f"{name}.sh:{n}: {line.strip()}"


def test_every_start_has_a_private_working_directory(runbooks):
    """Where each start runs from: the boot and the seal from /, every local command after
    rb::init from the run's 0700 scratch directory, every ssh command from the host's private
    kit directory (/ before it is made), the fan-out node from its own 0700 scratch directory
    (srun from /)."""
    for name, text in runbooks.items():
        lines = [line.strip() for _n, line in bash_lines(text)]
        for n, line, _first in (s for s in starts(text) if s[2] == '"${RB_PY_FLAGS[@]}"'):
            if line.endswith("<<'PY'"):  # the boot and the seal
                assert "cd / &&" in line, f"{name}.sh:{n}: {line}"
        init = text[text.index("rb::init() {") :]
        init = init[: init.index("\n}\n")]
        # the scratch directory made first, in a private parent (rb::scratch_dir, issue 44 R4)
        scratch = text[text.index("rb::scratch_dir() {") :]
        scratch = scratch[: scratch.index("\n}\n")]
        assert "RB_WORK=$(umask 077 && mktemp -d" in scratch and "rb::private_path" in scratch
        assert 'cd "${RB_WORK}"' in init
        assert (
            init.index("rb::scratch_dir")
            < init.index("rb::kit_write")
            < init.index('cd "${RB_WORK}"')
        )
        assert 'words=$(rb::shq cd "${RB_KIT_DIR[${host}]:-/}")' in lines
        assert "--chdir=/tmp" not in text and '--chdir="${RB_FAN_SCRATCH' not in text
        if "RB_FAN_NODE_SCRIPT=" in text:
            node = text[text.index("RB_FAN_NODE_SCRIPT=") :]
            node = node[: node.index("'\n") + 1]
            # the rule's check and the kit, each started by the kit's entry file from "$d"
            assert (
                'cd "$d" || no "cannot enter $d"\n'
                f'python3 {FLAGS} "$d/kit/{launch.START}" rbrules.private --file' in node
            ), node
            assert f'exec python3 {FLAGS} "$d/kit/{launch.START}" rbkit.fanout' in node, node
            assert (
                node.index('cd "$d"') < node.index("rbrules.private") < node.index("rbkit.fanout")
            )
            assert f"python3 {FLAGS} -c" not in node


CALLS = {
    "Popen",
    "run",
    "call",
    "check_call",
    "check_output",
    "run_bounded",
    "run_quiet",
    "execv",
    "execvp",
    "execve",
}


def _python_argv(node: ast.AST) -> ast.List | None:
    """The argv list literal of a call that starts a Python (its first word sys.executable, or
    a name or path ending in python/python3), else None."""
    if not isinstance(node, ast.List) or not node.elts:
        return None
    first = ast.unparse(node.elts[0])
    if first == "sys.executable" or re.search(r"python3?\b|\bexe\b", first):
        return node
    return None


def test_every_python_the_kit_starts_is_isolated():
    """In the kit's own code: a child Python is started by launch.argv (the entry file, -I) or
    with -I as its first option; never with -m, never with PYTHONPATH pointing anywhere but the
    post-swap proof's private hook directory (the console scripts it starts are started as a
    user starts them: that is the point of the proof)."""
    seen = 0
    for path in sorted((ROOT / "hostkit").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "-m":
                pytest.fail(f"{path.relative_to(ROOT)}:{node.lineno}: -m starts a module by name")
            argv = _python_argv(node)
            if argv is not None and path.name == "launch.py":
                seen += 1  # the rule itself
            elif argv is not None:
                seen += 1
                second = argv.elts[1] if len(argv.elts) > 1 else None
                assert isinstance(second, ast.Constant) and second.value == "-I", (
                    f"{path.relative_to(ROOT)}:{argv.lineno}: {ast.unparse(argv)}"
                )
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("launch.argv"):
                seen += 1
            if isinstance(node, ast.keyword) and node.arg == "PYTHONPATH":
                assert (path.name, ast.unparse(node.value)) == ("proof.py", "hook"), (
                    f"{path.relative_to(ROOT)}:{node.value.lineno}: PYTHONPATH"
                )
    assert seen >= 6


def test_the_entry_file_runs_only_the_kit_beside_it(tmp_path):
    """START from a directory full of planted modules, with PYTHONPATH naming it: the kit's
    module runs, nothing planted is imported."""
    planted = tmp_path / "cwd"
    (planted / "rbkit").mkdir(parents=True)
    marker = tmp_path / "ran"
    body = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for name in ("hashlib", "json", "runpy", "argparse", "sitecustomize", "os", "rbrules"):
        (planted / f"{name}.py").write_text(body)
    (planted / "rbkit" / "__init__.py").write_text(body)
    (planted / "rbkit" / "__main__.py").write_text(body)
    env = dict(os.environ, PYTHONPATH=str(planted), PYTHONSTARTUP=str(planted / "os.py"))
    r = subprocess.run(
        launch.argv(sys.executable, "rbkit") + ["--help"],
        cwd=planted,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "usage: rbkit" in r.stdout
    assert not marker.exists(), marker.read_text()


def test_the_kit_carries_the_rules_and_the_entry_file():
    paths = [f.path for f in kit.files()]
    assert "rbrules/start.py" in paths and "rbrules/launch.py" in paths
    assert "rbrules/private.py" in paths
    assert plan is not None


# --- rbrules.private: the rule for paths root writes to ---------------------------------------

NOBODY = 65534


def test_a_private_directory_and_what_is_not(tmp_path):
    base = tmp_path / "base"
    base.mkdir(mode=0o755)
    assert private.make_private(str(base / "a" / "run")) is None
    run = base / "a" / "run"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert stat.S_IMODE((base / "a").stat().st_mode) & 0o022 == 0
    # another user's directory along the way
    os.chown(base / "a", NOBODY, NOBODY)
    why = private.why_not_private(str(run))
    assert why == (
        f"directory {base / 'a'} is owned by nobody (uid {NOBODY}), mode 0755: that "
        "user can rename or replace what is in it"
    )
    os.chown(base / "a", 0, 0)
    # writable by others, without the sticky bit: anyone can rename `run` away
    (base / "a").chmod(0o777)
    why = private.why_not_private(str(run))
    assert why is not None and "mode 0777: writable by group and others without the sticky" in why
    # sticky: others cannot rename our entry, so the entry is the question
    (base / "a").chmod(0o1777)
    assert private.why_not_private(str(run)) is None
    os.chown(run, NOBODY, NOBODY)
    assert "run is owned by nobody (uid 65534), mode 0700" in private.why_not_private(str(run))
    os.chown(run, 0, 0)
    # the directory itself, group-writable
    run.chmod(0o770)
    assert "mode 0770: writable by group without" in private.why_not_private(str(run))
    run.chmod(0o700)
    # a link along the way is followed and its own directory checked; another user's link is not
    (base / "a").chmod(0o755)
    link = base / "link"
    link.symlink_to(base / "a")
    assert private.why_not_private(str(link / "run")) is None
    os.lchown(link, NOBODY, NOBODY)
    assert "the symlink" in private.why_not_private(str(link / "run"))
    # not a directory, missing
    (base / "f").write_text("")
    assert "not a directory" in private.why_not_private(str(base / "f"))
    assert private.why_not_private(str(base / "missing")) is not None


def test_the_private_command_refuses_naming_the_fix(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = subprocess.run(
        launch.argv(sys.executable, "rbrules.private")
        + ["--make", "--what", "the run directory", "--fix", "set RB_RUN_DIR", str(shared / "run")],
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 2
    assert r.stderr.startswith(
        f"refusing the run directory {shared / 'run'}: directory {shared} "
        "is owned by root (uid 0), mode 0777: writable by group and others"
    )
    assert r.stderr.rstrip().endswith(": set RB_RUN_DIR")
    assert not (shared / "run").exists()
