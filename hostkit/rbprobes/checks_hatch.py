"""Escape hatches: the spec author's own Python snippet or shell command, judged by exit status."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any, Dict, List

from . import proc, venvfs
from .result import Context, failed, passed

DEFAULT_TIMEOUT_S = 300


def _judge(
    label: str, finished: proc.Finished, expect: int, timeout_s: float, values: Dict[str, Any]
):
    values.update(
        {
            "exit": finished.returncode,
            "output_tail": finished.output,
            "seconds": round(finished.duration_s, 3),
        }
    )
    last = finished.output.strip().splitlines()[-1:] or [""]
    if finished.timed_out:
        return failed("%s timed out after %gs" % (label, timeout_s), values)
    if finished.returncode != expect:
        return failed(
            "%s exited %d, expected %d: %s" % (label, finished.returncode, expect, last[0][:200]),
            values,
        )
    return passed(
        "%s exited %d%s" % (label, expect, (": " + last[0][:120]) if last[0] else ""), values
    )


def python_check(params: Dict[str, Any], ctx: Context):
    """Run params.code with this interpreter in a child process; pass when it exits 0."""
    code = params.get("code")
    if not code:
        return failed("no code to run: give params.code")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    label = "python snippet %s" % (params.get("name") or "")
    # isolated, from / (proc.run_bounded): the snippet sees the venv, not where the run started
    finished = proc.run_bounded([sys.executable, "-I", "-c", code], timeout_s, env=proc.child_env())
    return _judge(
        label.strip(),
        finished,
        0,
        timeout_s,
        {"name": params.get("name"), "python": sys.executable},
    )


# Words after which the next word is run as a command too (`env FOO=1 torchrun ...`).
_PREFIX_COMMANDS = {"exec", "command", "env", "nohup", "time", "builtin"}
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "!", ";;", "|&"}


def command_names(run: str) -> List[str]:
    """The programs a shell command line starts: the first word of each simple command
    (after VAR=value assignments, and after env/exec/command/nohup/time), in order, once."""
    lex = shlex.shlex(run, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    names: List[str] = []
    expect = True
    for word in lex:
        if word in _OPERATORS or (word and set(word) <= set(";&|()")):
            expect = True
            continue
        if not expect:
            continue
        if "=" in word and not word.startswith("=") and "/" not in word.split("=", 1)[0]:
            continue  # an assignment before the command
        if word.startswith("-"):
            continue  # an option of env/time/command
        if word not in names:
            names.append(word)
        expect = word in _PREFIX_COMMANDS
    return names


def resolve_names(names: List[str], env: Dict[str, str], venv_bin: str) -> List[Dict[str, Any]]:
    """How /bin/sh, with `env` (its PATH), resolves each name: `command -v` in the same
    shell the command runs in (a builtin resolves to its own name)."""
    bare = [n for n in names if "/" not in n]
    found: Dict[str, str] = {}
    if bare:
        script = 'for n in "$@"; do p=$(command -v -- "$n") || p=; printf "%s\\n" "$p"; done'
        done = proc.run_bounded(["/bin/sh", "-c", script, "sh"] + bare, 30, env=env)
        if done.timed_out or done.returncode != 0:
            raise ValueError(
                "resolving %s with /bin/sh failed: %s"
                % (" ".join(bare), done.output.strip()[-200:] or "timed out")
            )
        lines = done.stdout.split("\n")
        found = {n: (lines[i] if i < len(lines) else "") for i, n in enumerate(bare)}
    out = []
    for name in names:
        item: Dict[str, Any] = {"name": name}
        if "/" in name:
            item["path"] = name
        else:
            item["path"] = found.get(name) or None
            if item["path"] and "/" not in item["path"]:
                item["builtin"] = True
            own = os.path.join(venv_bin, name)
            item["in_venv_bin"] = os.path.lexists(own)
        if item.get("path") and "/" in item["path"]:
            item["realpath"] = os.path.realpath(item["path"])
            item["from_venv"] = venvfs.inside(
                os.path.normpath(os.path.abspath(item["path"])), [os.path.normpath(venv_bin)]
            )
        out.append(item)
    return out


def _cannot_exec(item: Dict[str, Any]) -> str:
    """Why the venv's file `item` (resolve_names) cannot be executed: the interpreter its #!
    line names is missing or not executable here; "" when it can (or is not a script)."""
    path = item.get("realpath") or item.get("path") or ""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return ""
    if not first.startswith(b"#!"):
        return ""
    words = first[2:].decode("utf-8", "replace").split()
    if not words:
        return "%s cannot be executed: its #! line names no interpreter" % item["path"]
    interp = words[0]
    if os.path.isfile(interp) and os.access(interp, os.X_OK):
        return ""
    return (
        "the venv's %s cannot be executed: its #! line names the interpreter %s, which %s "
        "here (re-run the relocate step, or reinstall the package that made it)"
        % (
            item["path"],
            interp,
            "is not executable" if os.path.exists(interp) else "does not exist",
        )
    )


def command_check(params: Dict[str, Any], ctx: Context):
    """Run params.run with /bin/sh -c, the venv's bin/ first in PATH; pass when it exits with
    params.expect_exit (0). Reports the file each command name resolved to, and fails when a
    name the venv's bin/ has resolved to something else."""
    command = params.get("run")
    if not command:
        return failed("no command to run: give params.run")
    timeout_s = params.get("timeout_s", DEFAULT_TIMEOUT_S)
    expect = params.get("expect_exit", 0)
    label = ("command %s" % (params.get("name") or "")).strip()
    venv = ctx.venv_or_prefix()
    venv_bin = os.path.join(venv, "bin")
    env = proc.child_env()
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", os.defpath)
    values: Dict[str, Any] = {
        "name": params.get("name"),
        "expect_exit": expect,
        "path": env["PATH"],
        "venv_bin": venv_bin,
    }
    try:
        resolved = resolve_names(command_names(command), env, venv_bin)
    except ValueError as exc:  # unbalanced quotes (the shell will say so when it runs)
        resolved = []
        values["resolve_error"] = str(exc)
    values["resolved"] = resolved
    if resolved and resolved[0].get("path"):
        values["executed"] = resolved[0].get("realpath") or resolved[0]["path"]
    finished = proc.run_bounded(["/bin/sh", "-c", command], timeout_s, env=env)
    outcome = _judge(label, finished, expect, timeout_s, values)
    elsewhere = [
        "%s -> %s (the venv has %s)"
        % (r["name"], r.get("path") or "not found", os.path.join(venv_bin, r["name"]))
        for r in resolved
        if r.get("in_venv_bin") and not r.get("from_venv")
    ]
    if elsewhere:
        return failed(
            "%s: %s resolved outside the venv's bin/; %s"
            % (label, "; ".join(elsewhere), outcome.reason),
            outcome.values,
        )
    # a venv script whose interpreter is missing: /bin/sh (dash) goes on down PATH when the exec
    # fails, and runs a program of the same name elsewhere, which the outcome would be taken for
    broken = [why for why in (_cannot_exec(r) for r in resolved if r.get("from_venv")) if why]
    if broken:
        return failed(
            "%s: %s; the shell ran what it found further down PATH, or nothing (%s)"
            % (label, "; ".join(broken), outcome.reason),
            outcome.values,
        )
    if outcome.status == "pass" and values.get("executed"):
        return passed("%s (ran %s)" % (outcome.reason, values["executed"]), outcome.values)
    return outcome
