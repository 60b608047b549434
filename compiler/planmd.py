"""`compile --plan SPEC`: what the runbook will do, on which host, in plain words, as markdown to
paste into a PR. Built from the runbook's own Plan (resolve.py) alone: its groups, and its steps'
summaries and `--dry-run` text, so it says what the runbook does, not a second opinion. Long lists
are cut, so the text stays well under a PR comment's 65,536 characters whatever the spec holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .errors import Problem
from .view import HostView, Plan

LIMIT = 60_000  # characters; GitHub refuses comments over 65,536
MAX_ITEMS = 40  # entries shown of any one list
MAX_TEXT = 160  # characters shown of any one value

ROUTES = {
    "relay": "the data streams through the machine running the runbook; {src} and {dst} need not "
    "reach each other",
    "direct": "{src} sends straight to {dst} over its own ssh; this machine only steers",
    "auto": "{src} sends straight to {dst} when it can reach it, else through this machine",
}
ON_EXISTING = {
    "refuse": "if something is already there, the runbook stops before changing anything",
    "backup": "what is already there is kept beside it as `{dst}.rb-backup.N`",
    "replace": "what is already there is removed once the new copy is in place",
}
FAILED_CHECKS = {
    "rollback": "a failed check puts the previous install back (from the backup)",
    "keep": "a failed check leaves the new install in place and the run fails",
}


def markdown(plan: Plan, script: Path, warnings: list[Problem]) -> str:
    parts = [
        _header(plan, script),
        _hosts(plan),
        _route(plan),
        _excludes(plan),
        _size(plan.transfer.src_host, plan.transfer.dst_host),
        _changes(plan),
        _checks(plan),
        _steps(plan, script),
        _warnings(warnings),
    ]
    text = "\n".join(p for p in parts if p)
    if len(text) > LIMIT:
        text = text[:LIMIT].rsplit("\n", 1)[0] + f"\n\n*(cut at {LIMIT} characters)*\n"
    return text


def _header(plan: Plan, script: Path) -> str:
    runbook = plan.runbook
    chain = (
        " (extends " + ", which extends ".join(_code(p) for p in runbook.spec_chain) + ")"
        if runbook.spec_chain
        else ""
    )
    lines = [f"## Runbook plan: {_code(runbook.name)}", ""]
    for description in runbook.description_lines:
        lines += [f"> {_cut(description)}", ""]
    lines += [
        f"- spec: {_code(runbook.spec_path)}{chain}, sha256 {_code(runbook.spec_sha256[:16])}",
        f"- runbook: {_code(script.as_posix())}; preview it with "
        f"`bash {script.as_posix()} --dry-run`",
        "",
    ]
    return "\n".join(lines)


def _hosts(plan: Plan) -> str:
    src_host, dst_host = plan.transfer.src_host, plan.transfer.dst_host
    lines = ["### Hosts", "", "| host | role | reached |", "|---|---|---|"]
    for host in plan.hosts:
        role = " and ".join(
            r for r, h in (("source", src_host), ("destination", dst_host)) if h == host.id
        )
        lines.append(f"| {_code(host.id)} | {role} | {_reach(host)} |")
    lines += ["", "Every command is started from the machine that runs the runbook.", ""]
    return "\n".join(lines)


def _reach(host: HostView) -> str:
    if host.local:
        return "this machine (no ssh)"
    out = [f"ssh {_code(host.target, table=True)}"]
    if host.port:
        out.append(f"port {host.port}")
    if host.identity_file:
        out.append(f"key {_code(host.identity_file, table=True)}")
    if host.jump:
        out.append(f"through {_code(host.jump, table=True)}")
    out.append(f"host keys {host.host_keys}")
    for key, value in host.options[:MAX_ITEMS]:
        out.append(_code(f"{key}={value}", table=True))
    return ", ".join(out)


def _route(plan: Plan) -> str:
    transfer = plan.transfer
    src_host, src, dst_host, dst = (
        transfer.src_host,
        transfer.src_path,
        transfer.dst_host,
        transfer.dst_path,
    )
    comp = {
        "auto": ", else ".join(
            f"{tool} where both ends have it" for tool in transfer.auto_compression
        )
        + ", else none",
        "none": "none",
    }.get(transfer.compression, transfer.compression)
    verify = (
        "none: files are not hashed (sizes and names are still checked)"
        if transfer.verify == "none"
        else f"every file's {transfer.verify} is taken on {src_host} and checked on {dst_host} "
        "before anything is put in place"
    )
    lines = [
        "### What moves, and how",
        "",
        f"- copy {_code(f'{src_host}:{src}')} to {_code(f'{dst_host}:{dst}')}",
        f"- route **{transfer.route_written}**: "
        + ROUTES[transfer.route_written].format(src=_code(src_host), dst=_code(dst_host)),
        f"- compression: {comp}; hashing: "
        + (
            f"{transfer.jobs} threads per host"
            if transfer.jobs != "auto"
            else "one thread per CPU on each host"
        ),
        f"- verification: {verify}",
        f"- already at the destination (**{plan.destination.on_existing}**): "
        + ON_EXISTING[plan.destination.on_existing].format(dst=dst),
    ]
    lines += plan.install.route_lines(plan, _code)
    if plan.checks.run:
        policy = plan.checks.on_failed_checks
        lines.append(f"- failed checks (**{policy}**): {FAILED_CHECKS[policy]}")
    return "\n".join(lines) + "\n"


def _excludes(plan: Plan) -> str:
    items = plan.transfer.exclude
    if not items:
        return "### Excluded from the copy\n\nNothing: every file of the source is copied.\n"
    return "### Excluded from the copy\n\n" + _list([_code(p) for p in items]) + "\n"


def _size(src_host: str, dst_host: str) -> str:
    return (
        "### Size\n\nNot known at compile time. The `preflight` step measures the source on "
        f"{_code(src_host)} (apparent size and size on disk) and checks that {_code(dst_host)} "
        "has room before anything is sent; the run's `report.json` records the bytes moved.\n"
    )


def _changes(plan: Plan) -> str:
    transfer, destination = plan.transfer, plan.destination
    src, dst = transfer.src_path, transfer.dst_path
    lines = [
        f"### What changes on {plan.install.installs_on(plan, _code)}",
        "",
        f"- {_code(dst)}: the verified copy is put in place with one rename (staged first in "
        f"{_code(destination.staging)})",
    ]
    if src != dst:
        lines.append(
            f"- files in the venv that name {_code(src)} (script shebangs, activate "
            f"scripts) are rewritten to name {_code(dst)}"
        )
    lines.append(
        f"- env file {_code(destination.env_path)} (to `source`): VIRTUAL_ENV, PATH with the "
        "venv's `bin` first" + (", CUDA_HOME" if destination.cuda_home else "")
    )
    if destination.cuda_home:
        first = [_code(p) for p in destination.library_path_first]
        lines.append(
            f"  - CUDA {destination.cuda_version}: CUDA_HOME={_code(destination.cuda_home)}; "
            "LD_LIBRARY_PATH: "
            + (
                ", ".join(first[:MAX_ITEMS]) + " (in the venv's site-packages), then "
                if first
                else ""
            )
            + _code("$CUDA_HOME/lib64")
        )
    if destination.env:
        lines.append("  - also exported: " + _inline([_code(pair) for pair in destination.env]))
    if not plan.hosts[-1].local:
        lines.append(
            "- the runbook's helper kit is copied to a private directory made for the run "
            "(`mktemp -d`) on each ssh host, checked there by its sha256"
        )
    return "\n".join(lines) + "\n"


def _checks(plan: Plan) -> str:
    checks = plan.checks
    lines = [f"### Checks on {plan.install.checks_on(plan, _code)}, with the moved interpreter", ""]
    if checks.gpu is not None:
        gpu = checks.gpu
        detail = f", compute capability {gpu.capability} ({gpu.arch}" if gpu.capability else ""
        detail += f", {gpu.arch_name})" if gpu.arch_name else (")" if gpu.capability else "")
        lines += [f"GPU expected: {gpu.count} x {_code(gpu.model)}{detail}.", ""]
    else:
        lines += ["No GPU expected (no `gpu:`).", ""]
    if not checks.listed:
        return "\n".join(lines + ["No checks: the run ends after the env file is written.", ""])
    lines += ["| # | check | with | if it cannot run |", "|---|---|---|---|"]
    for index, check in enumerate(checks.listed[:MAX_ITEMS], 1):
        params = ", ".join(f"{k}={_code(v, table=True)}" for k, v in check.params) or "defaults"
        lines.append(
            f"| {index} | {check.kind} | {_cell(params)} | "
            f"{'skipped (allow_skip)' if check.allow_skip else 'fails'} |"
        )
    if len(checks.listed) > MAX_ITEMS:
        lines.append(f"\n... and {len(checks.listed) - MAX_ITEMS} more checks")
    return "\n".join(lines) + "\n"


def _steps(plan: Plan, script: Path) -> str:
    """The runbook's own step list, host, summary and --dry-run text."""
    lines = [
        "### Steps",
        "",
        "<details><summary>"
        + " → ".join(s.id for s in plan.steps)
        + f" (what <code>bash {script.as_posix()} --dry-run</code> prints)</summary>",
        "",
    ]
    for index, step in enumerate(plan.steps, 1):
        body = [_cut(line, 240, one_line=False) for line in step.preview.splitlines()[:MAX_ITEMS]]
        fence = "`" * max(
            3, 1 + max((len(run) for line in body for run in re.findall("`+", line)), default=0)
        )
        lines.append(
            f"{index}. **{step.id}**"
            + (f" on {_code(step.host)}" if step.host else "")
            + f": {step.doc}"
        )
        lines += [f"   {fence}", *(f"   {line}" for line in body), f"   {fence}"]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _warnings(warnings: list[Problem]) -> str:
    if not warnings:
        return ""
    items = [
        f"{_code(f'{w.path}:{w.line}:{w.column}')} {w.field}: {_cut(w.message, 400)}"
        for w in warnings
    ]
    return "### Warnings\n\n" + _list(items) + "\n"


# -- markdown helpers ---------------------------------------------------------------------------


def _cut(text: str, limit: int = MAX_TEXT, *, one_line: bool = True) -> str:
    text = " ".join(str(text).split()) if one_line else str(text).replace("\n", " ").rstrip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code(text: Any, *, table: bool = False) -> str:
    """Inline code that survives backticks in the value (and pipes, in a table cell)."""
    text = _cut(str(text))
    if table:
        text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _cell(text: str) -> str:
    return text.replace("\n", " ")


def _list(items: list[str]) -> str:
    shown = [f"- {item}" for item in items[:MAX_ITEMS]]
    if len(items) > MAX_ITEMS:
        shown.append(f"- ... and {len(items) - MAX_ITEMS} more")
    return "\n".join(shown)


def _inline(items: list[str]) -> str:
    more = f", ... and {len(items) - MAX_ITEMS} more" if len(items) > MAX_ITEMS else ""
    return ", ".join(items[:MAX_ITEMS]) + more
