"""The live plan in words (liveplan.py): the screen `--plan` prints and the PR's plan.md, both made
from plan.json; every name shown escaped (rbrules.shown).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
from typing import List

from rbrules.shown import printable
from rbrules.units import human

SHOWN = 8  # itemized lines shown on the screen (all in changes.txt)


def screen(
    plan: dict, items: List[str], args: argparse.Namespace, checks: List[dict], listing: str
) -> List[str]:
    ch, disk = plan["changes"], plan["disk"]
    src, dst = plan["source"], plan["destination"]
    out = [
        "plan for %s: %s:%s -> %s:%s"
        % (plan["runbook"], src["host"], src["path"], dst["host"], dst["path"])
    ]
    out.append("  hosts:       %s" % args.hosts)
    out.append("  route:       %s" % args.route_why)
    out.append("  compression: %s" % args.compression_why)
    out.append(
        "  source:      %d files, %s (scan %s)"
        % (src["files"], human(src["bytes"]), src["stat_fingerprint"][:12])
    )
    state = (
        "holds an install of this tool"
        if dst["installed"]
        else "exists (not installed by this tool)"
        if dst["exists"]
        else "does not exist yet"
    )
    out.append("  destination: %s; on_existing %s" % (state, plan["policy"]))
    if plan["up_to_date"]:
        out.append("  changes:     nothing to send: the destination already holds this exact tree")
    else:
        out.append(
            "  changes:     %d added (%s), %d changed (%s), %d removed (%s); %d unchanged"
            % (
                ch["added"],
                human(ch["added_bytes"]),
                ch["changed"],
                human(ch["changed_bytes"]),
                ch["removed"],
                human(ch["removed_bytes"]),
                ch["unchanged"],
            )
        )
        for line in items[:SHOWN]:
            out.append("               " + line)
        if len(items) > SHOWN:
            out.append("               ... %d more" % (len(items) - SHOWN))
        out.append("               every line: %s" % listing)
        resumed = plan.get("resumable")
        if resumed:
            out.append(
                "  resumable:   %s of %s staged (%d files a cut stream of this source "
                "left); %s to send"
                % (
                    human(resumed["staged"]),
                    human(resumed["of"]),
                    resumed["files"],
                    human(plan["send_bytes"]),
                )
            )
        if plan["incremental"]:
            # one sum, its two parts named as parts (issue 45: `14.9 KB, only the changes, and
            # 14.9 KB of bin/...` read as 29.8 KB)
            how = (
                "in all: %s of changes and %s of bin/ and pyvenv.cfg, which relocation "
                "rewrites (incremental)"
                % (human(ch["added_bytes"] + ch["changed_bytes"]), human(ch["rewritten_bytes"]))
            )
        else:
            how = "the rest of the tree (resumed)" if resumed else "the whole tree"
        out.append("  to send:     %s, %s" % (human(plan["send_bytes"]), how))
    free = disk["free"] + disk.get("freed", 0)
    room = "enough room" if disk["need"] <= free else "NOT ENOUGH ROOM"
    freed = (
        " (and %s of an earlier staging, removed first)" % human(disk["freed"])
        if disk.get("freed")
        else ""
    )
    out.append(
        "  disk:        %s needed (staging %s%s) of %s free%s at %s: %s"
        % (
            human(disk["need"]),
            human(disk["staging"]),
            ", kept backup " + human(disk["backup"]) if disk["backup"] else "",
            human(disk["free"]),
            freed,
            dst["measured_at"],
            room,
        )
    )
    if plan["policy"] == "backup":
        count = len(plan["backups"])
        kept = "%d backup%s kept" % (count, "" if count == 1 else "s")
        evict = (
            ("; evicts %s once the new install passes its checks" % ", ".join(plan["evicts"]))
            if plan["evicts"]
            else "; evicts none"
        )
        out.append("  backups:     %s (keep_backups %s)%s" % (kept, args.keep_backups, evict))
    out.append("  static:      %s" % plan["static"])
    names = []
    head = True
    for check in checks:
        # the implied checks come first (compiler.implied: relocation, and kernel_audit for a gpu)
        head = head and check.get("type") in ("relocation", "kernel_audit")
        implied = " (implied)" if head else ""
        skip = " (may skip)" if check.get("allow_skip") else ""
        names.append("%s%s%s" % (check.get("id"), implied, skip))
    out.append("  checks:      %s" % (", ".join(names) or "none"))
    for blocker in plan["blockers"]:
        out.append("  BLOCKED:     %s" % blocker)
    return [printable(line) for line in out]


def markdown(plan: dict, items: List[str], lines: List[str]) -> str:
    text = [
        "# Live plan: %s" % plan["runbook"],
        "",
        "Made %s against the real hosts (spec sha256 %s)."
        % (plan["made"], plan["spec_sha256"][:12]),
        "",
        "```",
        *lines[1:],
        "```",
        "",
    ]
    if items:
        text += [
            "<details><summary>%d itemized changes</summary>" % len(items),
            "",
            "```",
            *items,
            "```",
            "</details>",
            "",
        ]
    return "\n".join(text)
