"""The installs kept beside the destination, asked for by hand: `restore` (a backup back in
place) and `list_backups`.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
from typing import Optional

from rbrules.units import human

from . import installs, swapfs
from .runner import Context, Result, require_lock


def restore(ctx: Context, number: Optional[int] = None) -> Result:
    """`--restore [N]`: backup N (default: the newest whose checks passed) back at the
    destination; says which and why, and what is in place now. The runbook runs the checks on it
    next (probe)."""
    require_lock(ctx)
    ctx.critical += 1
    try:
        result = swapfs.restore(
            ctx.dest, number, env_file=ctx.env_out, swap_atomic=ctx.choices.swap_atomic
        )
        if os.path.isdir(ctx.dest):
            # chosen by hand: the checks that follow are this install's, not a stale spec's
            installs.write_info(ctx.dest, put_back_after=None, failed_install=None)
    finally:
        ctx.critical -= 1
    for why in result.get("ignored") or []:
        ctx.log("ignored: " + why)
    env = result.get("env_file") or {}
    if env and not env.get("restored"):
        ctx.log("env file: " + env["why"])
    now = result.get("installed") or {}
    if now:
        ctx.log("in place now: %s" % _describe(now))
    if result["restored"] is None:
        return Result(
            "nothing restored: %s" % result["why"], {"restored": "", "kept_current_as": ""}
        )
    if result["kept_current_as"] is None:
        then = "nothing was in place"
    elif result.get("kept_failed"):
        then = (
            "the install that was in place failed its checks: kept apart at %s"
            % result["kept_current_as"]
        )
    else:
        then = "the install that was in place is now %s" % result["kept_current_as"]
    skipped = "; ".join(result.get("skipped") or []) or "none"
    return Result(
        "restored %s: %s (skipped: %s); %s" % (result["restored"], result["why"], skipped, then),
        {"restored": result["restored"], "kept_current_as": result["kept_current_as"] or ""},
    )


def _describe(doc: dict) -> str:
    """An install's record and stat check in words (describe_install's dict)."""
    info = doc.get("info") or {}
    parts = [
        "%s made %s by %s"
        % (
            doc.get("path"),
            info.get("installed", "at an unknown time"),
            info.get("origin", "an unknown run"),
        )
    ]
    fp = info.get("source_fingerprint") or doc.get("source_fingerprint")
    parts.append("source %s" % (fp[:16] if fp else "unknown"))
    parts.append(
        "checks %s"
        % ("failed: " + doc["failed"] if doc.get("failed") else info.get("checks", "not recorded"))
    )
    check = doc.get("tree_check") or {}
    if check.get("ok") is True:
        parts.append("its files are as installed (stat check against its manifest)")
    elif check.get("ok") is False:
        changed = check.get("changed") or check.get("missing") or []
        parts.append(
            "changed since installed: %s"
            % (", ".join(changed[:8]) if changed else check.get("why", "see its manifest"))
        )
    else:
        parts.append(check.get("why", "no stat check"))
    return "; ".join(parts)


def list_backups(ctx: Context) -> Result:
    """`--list-backups`: each backup of the destination, the failed install kept apart and the
    one in place: when it was installed, by which runbook and spec, the source's fingerprint,
    its checks, its size."""
    rows = installs.list_installs(ctx.dest)
    ctx.log(
        "installs of %s (keep_backups: %s counts the backups whose checks passed):"
        % (ctx.dest, ctx.choices.keep_backups or "-")
    )
    table = []
    for row in rows:
        info = row["info"]
        checks = "failed" if row["failed"] else info.get("checks", "unknown").split(":")[0]
        label = ("backup %d" % row["number"]) if row["kind"] == "backup" else row["kind"]
        fp = info.get("source_fingerprint") or ""
        table.append(
            (
                label,
                info.get("installed", "-"),
                checks,
                human(row["size"]),
                "source " + (fp[:12] or "-"),
                info.get("origin", "-"),
                row["path"],
            )
        )
    widths = [max(len(r[i]) for r in table) for i in range(6)] if table else []
    for cells, row in zip(table, rows):
        ctx.log("  " + "  ".join(cells[i].ljust(widths[i]) for i in range(6)) + "  " + cells[6])
        if row["failed"]:
            ctx.log("      why: %s" % row["failed"])
        if row["info"].get("put_back_after"):
            ctx.log(
                "      put back after %s failed (the failed install: %s)"
                % (row["info"]["put_back_after"], row["info"].get("failed_install", "-"))
            )
    if not rows:
        ctx.log("  nothing there yet")
    count = sum(1 for r in rows if r["kind"] == "backup")
    good = sum(1 for r in rows if r["kind"] == "backup" and not r["failed"])
    return Result(
        "%d backups (%d whose checks did not fail)%s"
        % (
            count,
            good,
            "; a failed install kept apart" if any(r["kind"] == "failed" for r in rows) else "",
        ),
        {"backups": count, "good": good},
    )
