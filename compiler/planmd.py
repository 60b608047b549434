"""`compile --plan SPEC`: what the runbook will do, on which host, in plain words, as markdown to
paste into a PR. Built from the validated spec and the runbook's own step texts (steps.py: `DOCS`,
`preview`), so it says what the runbook does, not a second opinion. Long lists are cut, so the text
stays well under a PR comment's 65,536 characters whatever the spec holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rbrules import paths

from . import catalog, fanout, plan, steps as stepdocs
from .errors import Problem
from .loader import Source
from .spec import Host, Spec, failed_checks_policy

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


def markdown(spec: Spec, source: Source, script: Path, warnings: list[Problem]) -> str:
    src_host, src = spec.transfer.source
    dst_host, dst = spec.transfer.target
    parts = [
        _header(spec, source, script),
        _hosts(spec, src_host, dst_host),
        _route(spec, src_host, src, dst_host, dst),
        _excludes(spec),
        _size(src_host, dst_host),
        _changes(spec, dst_host, src, dst),
        _checks(spec, dst_host),
        _steps(spec, source, script),
        _warnings(warnings),
    ]
    text = "\n".join(p for p in parts if p)
    if len(text) > LIMIT:
        text = text[:LIMIT].rsplit("\n", 1)[0] + f"\n\n*(cut at {LIMIT} characters)*\n"
    return text


def _header(spec: Spec, source: Source, script: Path) -> str:
    chain = " (extends " + ", which extends ".join(_code(p) for p in source.chain[1:]) + ")" \
        if len(source.chain) > 1 else ""
    lines = [f"## Runbook plan: {_code(spec.name)}", ""]
    if spec.description:
        lines += [f"> {_cut(spec.description)}", ""]
    lines += [
        f"- spec: {_code(source.path)}{chain}, sha256 {_code(source.sha256[:16])}",
        f"- runbook: {_code(script.as_posix())}; preview it with "
        f"`bash {script.as_posix()} --dry-run`",
        "",
    ]
    return "\n".join(lines)


def _hosts(spec: Spec, src_host: str, dst_host: str) -> str:
    lines = ["### Hosts", "", "| host | role | reached |", "|---|---|---|"]
    for hid in dict.fromkeys([src_host, dst_host]):
        role = " and ".join(r for r, h in (("source", src_host), ("destination", dst_host))
                            if h == hid)
        lines.append(f"| {_code(hid)} | {role} | {_reach(spec.hosts[hid])} |")
    lines += ["", "Every command is started from the machine that runs the runbook.", ""]
    return "\n".join(lines)


def _reach(host: Host) -> str:
    if host.local:
        return "this machine (no ssh)"
    out = [f"ssh {_code(host.ssh, table=True)}"]
    if host.port:
        out.append(f"port {host.port}")
    if host.identity_file:
        out.append(f"key {_code(host.identity_file, table=True)}")
    if host.jump:
        out.append(f"through {_code(host.jump, table=True)}")
    out.append(f"host keys {host.host_keys}")
    for key in sorted(host.options)[:MAX_ITEMS]:
        out.append(_code(f"{key}={host.options[key]}", table=True))
    return ", ".join(out)


def _route(spec: Spec, src_host: str, src: str, dst_host: str, dst: str) -> str:
    t = spec.transfer
    comp = {"auto": ", else ".join(f"{tool} where both ends have it" for tool in
                                   stepdocs.auto_compression(spec)) + ", else none",
            "none": "none"}.get(t.compression, t.compression)
    verify = ("none: files are not hashed (sizes and names are still checked)" if t.verify == "none"
              else f"every file's {t.verify} is taken on {src_host} and checked on {dst_host} "
              "before anything is put in place")
    lines = [
        "### What moves, and how", "",
        f"- copy {_code(f'{src_host}:{src}')} to {_code(f'{dst_host}:{dst}')}",
        f"- route **{t.route}**: " + ROUTES[t.route].format(src=_code(src_host), dst=_code(dst_host)),
        f"- compression: {comp}; hashing: "
        + (f"{t.jobs} threads per host" if t.jobs else "one thread per CPU on each host"),
        f"- verification: {verify}",
        f"- already at the destination (**{t.on_existing}**): "
        + ON_EXISTING[t.on_existing].format(dst=dst),
    ]
    fan = getattr(spec, "fanout", None)
    if fan is not None:
        lines.append(f"- fan-out: installed on every node of {_code(fan.nodes)} through "
                     f"{_code(fan.engine)} (see the steps below), not only on {_code(dst_host)}")
    if spec.checks:
        policy = failed_checks_policy(spec)
        lines.append(f"- failed checks (**{policy}**): {FAILED_CHECKS[policy]}")
    return "\n".join(lines) + "\n"


def _excludes(spec: Spec) -> str:
    items = spec.transfer.exclude
    if not items:
        return "### Excluded from the copy\n\nNothing: every file of the source is copied.\n"
    return "### Excluded from the copy\n\n" + _list([_code(p) for p in items]) + "\n"


def _size(src_host: str, dst_host: str) -> str:
    return ("### Size\n\nNot known at compile time. The `preflight` step measures the source on "
            f"{_code(src_host)} (apparent size and size on disk) and checks that {_code(dst_host)} "
            "has room before anything is sent; the run's `report.json` records the bytes moved.\n")


def _changes(spec: Spec, dst_host: str, src: str, dst: str) -> str:
    env_file = paths.env_file(dst, spec.cuda.env_file if spec.cuda and spec.cuda.env_file else "")
    fan = getattr(spec, "fanout", None)
    where = f"every node of {_code(fan.nodes)}" if fan is not None else _code(dst_host)
    lines = [
        f"### What changes on {where}", "",
        f"- {_code(dst)}: the verified copy is put in place with one rename (staged first in "
        f"{_code(stepdocs.staging(dst))})",
    ]
    if src != dst:
        lines.append(f"- files in the venv that name {_code(src)} (script shebangs, activate "
                     f"scripts) are rewritten to name {_code(dst)}")
    lines.append(f"- env file {_code(env_file)} (to `source`): VIRTUAL_ENV, PATH with the venv's "
                 "`bin` first" + (", CUDA_HOME" if spec.cuda else ""))
    if spec.cuda:
        first = [_code(d) for d in spec.cuda.library_path_first]
        lines.append(f"  - CUDA {spec.cuda.version}: CUDA_HOME={_code(spec.cuda.home)}; "
                     "LD_LIBRARY_PATH: " + (", ".join(first[:MAX_ITEMS]) + " (in the venv's "
                                            "site-packages), then " if first else "")
                     + _code("$CUDA_HOME/lib64"))
    if spec.env:
        pairs = [_code(f"{k}={v}") for k, v in sorted(spec.env.items())]
        lines.append("  - also exported: " + _inline(pairs))
    if not spec.hosts[dst_host].local:
        lines.append("- the runbook's helper kit is copied to a private directory made for the run "
                     "(`mktemp -d`) on each ssh host, checked there by its sha256")
    return "\n".join(lines) + "\n"


def _checks(spec: Spec, dst_host: str) -> str:
    fan = getattr(spec, "fanout", None)
    where = (f"every node ({len(fanout.expand(fan.nodes))})" if fan is not None
             else _code(dst_host))
    lines = [f"### Checks on {where}, with the moved interpreter", ""]
    if spec.gpu:
        known = catalog.resolve(spec.gpu.model, spec.gpu.capability)
        cap = spec.gpu.capability or (known.capability if known else None)
        detail = f", compute capability {cap} ({catalog.arch_of(cap)}" if cap else ""
        detail += f", {known.arch_name})" if known and cap else (")" if cap else "")
        lines += [f"GPU expected: {spec.gpu.count} x {_code(spec.gpu.model)}{detail}.", ""]
    else:
        lines += ["No GPU expected (no `gpu:`).", ""]
    if not spec.checks:
        return "\n".join(lines + ["No checks: the run ends after the env file is written.", ""])
    lines += ["| # | check | with | if it cannot run |", "|---|---|---|---|"]
    for i, check in enumerate(spec.checks[:MAX_ITEMS], 1):
        params = ", ".join(f"{k}={_short(v)}" for k, v in check.params.items()) or "defaults"
        lines.append(f"| {i} | {check.kind} | {_cell(params)} | "
                     f"{'skipped (allow_skip)' if check.allow_skip else 'fails'} |")
    if len(spec.checks) > MAX_ITEMS:
        lines.append(f"\n... and {len(spec.checks) - MAX_ITEMS} more checks")
    return "\n".join(lines) + "\n"


def _steps(spec: Spec, source: Source, script: Path) -> str:
    """The runbook's own step list, host, summary and --dry-run text (steps.DOCS and
    steps.preview, through the view model plan.build makes for the runbook)."""
    view = plan.build(spec, source, script_name=script.name)
    lines = ["### Steps", "", "<details><summary>" + " → ".join(s.id for s in view.steps)
             + f" (what <code>bash {script.as_posix()} --dry-run</code> prints)</summary>", ""]
    for i, step in enumerate(view.steps, 1):
        body = [_cut(line, 240, one_line=False) for line in step.preview.splitlines()[:MAX_ITEMS]]
        fence = "`" * max(3, 1 + max((len(run) for line in body for run in re.findall("`+", line)),
                                     default=0))
        lines.append(f"{i}. **{step.id}**" + (f" on {_code(step.host)}" if step.host else "")
                     + f": {step.doc}")
        lines += [f"   {fence}", *(f"   {line}" for line in body), f"   {fence}"]
    lines += ["", "</details>", ""]
    return "\n".join(lines)


def _warnings(warnings: list[Problem]) -> str:
    if not warnings:
        return ""
    items = [f"{_code(f'{w.path}:{w.line}:{w.column}')} {w.field}: {_cut(w.message, 400)}"
             for w in warnings]
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


def _short(value: Any) -> str:
    if isinstance(value, list):
        shown = ", ".join(str(v) for v in value[:8]) + (", ..." if len(value) > 8 else "")
        return _code(f"[{shown}]", table=True)
    if isinstance(value, bool):
        return _code("true" if value else "false", table=True)
    text = value.splitlines()[0] if isinstance(value, str) and value else value
    return _code(text, table=True)


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
