"""The probe step: the checks, run with the moved interpreter, sourcing the env file's copy this run
made in its private state (`own_env_copy`), and what a failed check keeps (`prune_after_checks`).
One of the engine's steps (engine.py runs it last).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import List

from rbrules import launch, paths
from rbrules.proven import NotOurs

from . import (
    exports,
    installs,
    swapfs,
)
from .runner import (
    Context,
    Result,
    StepError,
    user_name,
    write_file,
)
from .stream import child_env, run_quiet, tail


def prune_after_checks(ctx: Context) -> None:
    """keep_backups, applied once this run's new install proved itself (its checks passed, or
    the spec has none and its env file is written): an install that fails never evicts a good
    backup."""
    swapped = ctx.swapped
    if (
        swapped is None
        or swapped.get("transient")
        or swapped.get("policy") != "backup"
        or not ctx.choices.keep_backups
    ):
        return
    for gone in swapfs.prune_backups(ctx.dest, ctx.choices.keep_backups):
        ctx.log(
            "removed an older backup (keep_backups: %s): %s (the new install passed its "
            "checks)" % (ctx.choices.keep_backups, gone)
        )


ENV_COPY = "env.sh"  # in the state directory: what the checks source


def own_env_copy(ctx: Context) -> str:
    """The env file the checks source, as root: the install's own copy (DEST/.rb-env.sh, which
    exports wrote beside the public one), proven ours when it is read (exports.own_copy: opened
    without following a link, a regular file of one link, this user's or root's, writable by no
    other), copied into this run's private state directory. Never the public
    env file by its name: that is in the destination's parent, where another user may swap it."""
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    shown = os.path.join(ctx.dest, paths.ENV_IN_INSTALL)
    try:
        data = exports.own_copy(ctx.dest)
    except NotOurs as exc:
        raise StepError(
            "refusing to source %s as %s: %s (not written by this kit); look at it, "
            "remove it and run the exports step again (--from exports)"
            % (shown, user_name(), exc.why)
        ) from None
    if data is None:
        raise StepError(
            "the install at %s holds no env file of its own (%s: missing): run the "
            "exports step again (--from exports)" % (ctx.dest, paths.ENV_IN_INSTALL)
        )
    path = os.path.join(ctx.state, ENV_COPY)
    write_file(path, data, 0o600)
    return path


def probe(ctx: Context, report: str = "") -> Result:
    """The checks (rbprobes, from this kit) with the moved interpreter and the install's own env
    file sourced (own_env_copy); the report is written to `report` (default: the state
    directory)."""
    report = report or os.path.join(ctx.state, "probe-report.json")
    info = installs.read_info(ctx.dest)
    if ctx.swapped is None and ctx.up_to_date is None and info.get("put_back_after"):
        raise StepError(
            "the install at %s is the previous one, put back after %s failed (the "
            "failed install is kept at %s): checking it would not check what this spec "
            "installs; run every step again"
            % (ctx.dest, info["put_back_after"], info.get("failed_install", "-")),
            {"put_back_after": info["put_back_after"]},
        )
    own_env = own_env_copy(ctx)
    env = child_env()
    # the moved interpreter, isolated (rbrules.launch: the checks see the venv's own
    # site-packages and the env file's variables, never a PYTHON* variable or the working
    # directory), from /
    argv = (
        ["bash", "-c", 'source "$1" && shift && exec "$@"', "rb", own_env]
        + launch.argv(os.path.join(ctx.dest, "bin", "python"), "rbprobes", site=True)
        + ["run", "--config-json", ctx.probe_config, "--report", report]
    )
    if ctx.capture:
        rc, out, err = run_quiet(argv, ctx.choices.timeout, env)
        ctx.log(err)
    else:
        # the checks' table goes to the runbook's log as it is printed
        rc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=2,
            env=env,
            cwd="/",
            timeout=ctx.choices.timeout,
            check=False,
        ).returncode
        out = err = ""
    summary: dict = {}
    names: List[str] = []
    try:
        with open(report, encoding="utf-8") as fh:
            doc = json.load(fh)
        summary = doc.get("summary", {})
        names = [
            str((c.get("values") or {}).get("name") or c.get("id"))
            for c in doc.get("checks", [])
            if c.get("status") == "fail"
        ]
        # the checked packages' own warnings (rbprobes keeps them): the run's log only
        for warned in doc.get("warnings") or []:
            ctx.trace("a warning while the checks ran (from the checked packages): %s" % warned)
    except (OSError, ValueError, AttributeError):
        pass
    facts = {
        "report": report,
        "pass": summary.get("pass", 0),
        "skip": summary.get("skip", 0),
        "fail": summary.get("fail", 0),
    }
    detail = "%s passed, %s skipped, %s failed" % (facts["pass"], facts["skip"], facts["fail"])
    if rc != 0:
        ctx.failed_checks = ", ".join(names) or "the checks"
        installs.set_checks(ctx.dest, False, "checks failed: " + ctx.failed_checks)
        raise StepError(
            "checks failed: " + detail if summary else "the checks did not run (exit %s)" % rc,
            facts,
            tail(err or out),
            rc=rc,
        )
    installs.set_checks(ctx.dest, True)
    prune_after_checks(ctx)
    return Result(detail, facts)
