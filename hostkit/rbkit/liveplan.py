"""The live plan (`bash RUNBOOK --plan`, `--apply PLAN`): what a run will change, read from the
real hosts without writing anything there, and the check that a saved plan still holds.

    liveplan state DEST --choices C [--against-install]    on the destination, read-only: a JSON
        line of facts (exists, installed, free space, backups; with --against-install, what
        differs from the install's manifest, compared there: nothing is compared when the
        walk's lines have the stat fingerprint the install recorded), then the stat line of
        every entry of DEST (statwalk.tree_stat's, the walk's order): its state, digested
    liveplan compose --dir DIR ...                         here: the plan from what the runbook
        fetched into DIR (source.scan, dest.state): plan.json, changes.txt, plan.md
        (--markdown), and the screen on stdout; exit 1 when something blocks the run
    liveplan drift --plan PLAN --side source|dest --now FILE   here: what moved since the plan
        (exit 1, naming the side, how many paths and the first few), exit 0 when nothing did
    liveplan installed DEST                                on the destination: its install's
        manifest on stdout, read by safefs (exit 2 for a link, a FIFO, a device, or none); the
        manifest step of a re-run copies it with this, as root
    liveplan read PLAN --name N --spec-sha S --kit-sha K   here: the plan's digests as
        `KEY<TAB>VALUE` lines, or why it is not this runbook's (exit 1)

The source's side is the scan preflight makes (hostfs.scan's record, NAMES.stat): its stat
fingerprint is the source's digest. The changes are judged as the engine judges a re-run (the
quick check: path, type, mode, size, link and mtime; rbkit.manifest.quick_check), against the
source as the install recorded it (manifest.source_of) and the destination as it is now.
Every name shown (the screen, changes.txt, plan.md, a refusal) is escaped (rbrules.shown: a file
name's ESC, BEL or newline never reaches a terminal raw); plan.json and the records keep them exact.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

from rbrules import paths, proven
from rbrules.choices import Choices
from rbrules.shown import shown
from rbrules.units import human

from . import planscreen, planstate, safefs

MARGIN = 10  # percent over the staging's bytes, as preflight asks


# -- here: the plan --------------------------------------------------------------------------------


def _flags(old: Optional[list], new: list) -> str:
    """An rsync -i like code of 11 characters for `new` against `old` (None: new there)."""
    kind = {"f": "f", "d": "d", "l": "L"}.get(new[1], "?")
    head = (">" if new[1] == "f" else "c") + kind
    if old is None:
        return head + "+++++++++"
    if old[1] != new[1]:
        return head + "T" * 9
    return (
        head
        + "."
        + ("s" if old[3] != new[3] else ".")
        + ("t" if old[5] != new[5] else ".")
        + ("p" if old[2] != new[2] else ".")
        + ("L" if old[4] != new[4] else ".")
        + "...."
    )


_ADDED = {"f": ">f+++++++++ ", "d": "cd+++++++++ ", "l": "cL+++++++++ "}  # _flags(None, row)


def changes(
    src: List[list], dest: List[list], installed: Optional[dict], same_source: bool = False
) -> dict:
    """What a run would change at the destination: `src` the source's scan rows, `dest` the
    destination's, `installed` what differs from its install's manifest (against_install; None:
    not an install of this tool). Each source entry is added, changed (against the source as the
    install recorded it, or a file changed at the destination since) or unchanged; what the
    destination holds that the source lacks is removed. `same_source`: the source's stat
    fingerprint is the one the install recorded, so with nothing moved at the destination every
    entry is unchanged, and none is compared."""
    out = {
        "added": 0,
        "added_bytes": 0,
        "changed": 0,
        "changed_bytes": 0,
        "removed": 0,
        "removed_bytes": 0,
        "unchanged": 0,
        "changed_there": 0,
    }
    if installed is not None and same_source and not installed["moved"]:
        out.update(unchanged=len(src), items=[])
        return out
    if installed is None and not dest:
        # nothing there (a first move): every entry is added, one line each, nothing compared
        out.update(
            added=len(src),
            added_bytes=sum(r[3] for r in src if r[1] == "f"),
            items=[_ADDED.get(r[1], "c?+++++++++ ") + shown(r[0]) for r in src],
        )
        return out
    now = {r[0]: r for r in dest}
    base: Dict[str, list] = dict(now)
    moved_there: set = set()
    if installed is not None:
        # the manifest's rows: the destination's where they are equal, else the one sent back
        moved_there = set(installed["moved"])
        for rel, row in installed["moved"].items():
            if row is None:
                base.pop(rel, None)
            else:
                base[rel] = row
        for row in installed["source_entries"]:
            # the source's own entries of what relocation rewrote (manifest.source_of)
            base[row[0]] = row
    items: List[str] = []
    have = set()
    for row in src:
        rel = row[0]
        have.add(rel)
        old = base.get(rel)
        size = row[3] if row[1] == "f" else 0
        if old is None:
            out["added"] += 1
            out["added_bytes"] += size
            items.append("%s %s" % (_flags(None, row), shown(rel)))
        elif old[1:] != row[1:] or rel in moved_there:
            code, why = _flags(old, row), ""
            if old[1:] == row[1:]:
                code, why = code[:2] + "?" * 9, " (changed at the destination since the install)"
                out["changed_there"] += 1
            out["changed"] += 1
            out["changed_bytes"] += size
            items.append("%s %s%s" % (code, shown(rel), why))
        else:
            out["unchanged"] += 1
    gone = sorted(set(base) | set(now)) if installed is not None else sorted(now)
    for rel in gone:
        if rel in have or rel == paths.INSTALLED_MANIFEST:
            continue
        row = now.get(rel) or base.get(rel)
        out["removed"] += 1
        out["removed_bytes"] += row[3] if row and row[1] == "f" else 0
        items.append("*deleting   %s" % shown(rel))
    out["items"] = items
    return out


def judged(
    src_stat: str, body: bytes, facts: dict, dest_body: bytes
) -> Tuple[List[list], dict, Optional[dict]]:
    """(source rows, changes, install) of one destination (the fan-out's per node too:
    rbkit.fanplan). The tree the install recorded, unmoved there: no row is parsed nor
    compared (the source's rows come back empty, its count in changes' `unchanged`)."""
    installed = facts.get("install")
    same = installed is not None and facts.get("installed_source_stat") == src_stat
    if same and not installed["moved"]:
        ch = changes([], [], installed, same)
        ch["unchanged"] = body.count(b"\n")
        return [], ch, installed
    src = planstate.body_rows(body)
    return src, changes(src, planstate.body_rows(dest_body), installed, same), installed


def assess(
    args: argparse.Namespace,
    facts: dict,
    src: List[list],
    src_stat: str,
    ch: dict,
    installed: Optional[dict],
) -> dict:
    """One destination's side of the plan (the fan-out's per node too: rbkit.fanplan): up to
    date or not, bytes to send, the disk it needs, and what blocks it there."""
    up_to_date = (
        installed is not None
        and facts.get("installed_source_stat") == src_stat
        and ch["changed"] == ch["added"] == ch["removed"] == 0
    )
    delta = installed is not None and args.incremental
    src_bytes = int(args.source_bytes or 0)
    # an incremental run also sends again what relocation rewrites (bin/*, pyvenv.cfg: their
    # installed copies are not the source's, never linked)
    rewritten = 0
    if src:
        # (loaded only where there are rows: an unchanged re-run's compose reads no manifest)
        from .manifest import relocatable

        rewritten = sum(r[3] for r in src if r[1] == "f" and relocatable(r[0]))
    ch["rewritten_bytes"] = rewritten
    send = (
        0
        if up_to_date
        else (ch["added_bytes"] + ch["changed_bytes"] + rewritten if delta else src_bytes)
    )
    staging = 0 if up_to_date else (send if delta else int(args.need_bytes or src_bytes))
    # a staging already there (issue 45): what a cut stream of this very source left is resumed
    # (only the rest is sent and needs room), any other is removed first (its room is free)
    kept = facts.get("staged") or {}
    this = "%s %s:%s" % (src_stat, args.src_host, args.src_path)
    resumable = bool(kept) and not delta and not up_to_date and kept.get("source") == this
    freed = 0
    if resumable:
        send = max(0, send - kept["bytes"])
        staging = max(0, staging - kept["bytes"])
    elif kept and not up_to_date:
        freed = kept.get("disk", 0)
    staging += staging * MARGIN // 100
    # with backup, the install in place stays as a backup; an incremental staging links its
    # unchanged files from it, and the swap gives the backup copies of its own (unshare_backup:
    # free where the file system has reflinks)
    backup = 0
    if args.policy == "backup" and facts["exists"] and delta and not up_to_date:
        backup = max(0, facts.get("bytes", 0) - ch["changed_bytes"])
    need = staging + backup
    blockers: List[str] = []
    if need > facts["free_bytes"] + freed:
        words = "not enough room at %s: %s needed (staging %s%s), %s free" % (
            facts["measured_at"],
            human(need),
            human(staging),
            ", kept backup " + human(backup) if backup else "",
            human(facts["free_bytes"]),
        )
        if kept:
            words += (
                "; the %s staged there are counted (%s); to give the move up and that room "
                "back: bash %s --discard-staging"
                % (
                    human(kept["bytes"]),
                    "a run resumes them" if resumable else "a run removes them first",
                    args.runbook or "RUNBOOK",
                )
            )
        blockers.append(words)
    if facts["exists"] and not facts["installed"] and args.policy == "refuse":
        blockers.append("the destination %s exists and on_existing is refuse" % facts["dest"])
    if facts.get("shared_parent") and args.shared_parent != "allow":
        blockers.append(facts["shared_parent"])
    return {
        "up_to_date": up_to_date,
        "delta": delta,
        "send": send,
        "staging": staging,
        "backup": backup,
        "need": need,
        "blockers": blockers,
        "freed": freed,
        "resumable": {"staged": kept["bytes"], "files": kept["files"], "of": src_bytes}
        if resumable
        else None,
    }


def compose(args: argparse.Namespace) -> int:
    work = args.dir
    src_stat, body = planstate.scan_body(os.path.join(work, "source.scan"))
    facts, dest_body = planstate.state_body(os.path.join(work, "dest.state"))
    src, ch, installed = judged(src_stat, body, facts, dest_body)
    safefs.write_private(os.path.join(work, "changes.txt"), "\n".join(ch["items"] + [""]))
    got = assess(args, facts, src, src_stat, ch, installed)
    up_to_date, delta, send = got["up_to_date"], got["delta"], got["send"]
    staging, backup, need, blockers = got["staging"], got["backup"], got["need"], got["blockers"]
    src_bytes = int(args.source_bytes or 0)
    audit = static_verdict(args)
    blockers += source_blockers(args, audit)
    checks = json.loads(args.checks or "{}").get("checks") or []
    plan = {
        "kind": "rb-plan",
        "schema": 1,
        "runbook": args.name,
        "spec_sha256": args.spec_sha,
        "kit_sha256": args.kit_sha,
        "made": args.made,
        "source": {
            "host": args.src_host,
            "path": args.src_path,
            "stat_fingerprint": src_stat,
            "files": int(args.source_files or 0),
            "bytes": src_bytes,
        },
        "destination": {
            "host": args.dst_host,
            "path": facts["dest"],
            "digest": facts["digest"],
            "exists": facts["exists"],
            "installed": facts["installed"],
            "free_bytes": facts["free_bytes"],
            "measured_at": facts["measured_at"],
        },
        "route": args.route,
        "compression": args.compression,
        "changes": {k: v for k, v in ch.items() if k != "items"},
        "up_to_date": up_to_date,
        "incremental": delta,
        "send_bytes": send,
        "resumable": got["resumable"],
        "disk": {
            "staging": staging,
            "backup": backup,
            "need": need,
            "free": facts["free_bytes"],
            "freed": got["freed"],
        },
        "policy": args.policy,
        "backups": facts["backups"],
        "evicts": facts["evicts"],
        "static": audit,
        "checks": [c.get("id") for c in checks],
        "blockers": blockers,
    }
    safefs.write_private(
        os.path.join(work, "plan.json"), json.dumps(plan, indent=1, sort_keys=True) + "\n"
    )
    lines = planscreen.screen(plan, ch["items"], args, checks, os.path.join(work, "changes.txt"))
    print("\n".join(lines))
    if args.markdown:
        safefs.write_private(
            os.path.join(work, "plan.md"), planscreen.markdown(plan, ch["items"], lines)
        )
    return 1 if blockers else 0


def source_blockers(args: argparse.Namespace, audit: str) -> List[str]:
    """What the source itself blocks, said the same by both composes (this one, rbkit.fanplan)."""
    out = []
    if audit.startswith("failed") and not args.force and not args.same_host:
        out.append("the static checks on the source failed (%s): fix the venv or --force" % audit)
    if args.library_missing:
        # what the exports step refuses after the swap, refused before anything moves
        out.append(
            "the source has no %s under its site-packages: the exports step would "
            "refuse it; fix cuda.library_path_first in the spec"
            % args.library_missing.replace(",", ", ")
        )
    return out


def static_verdict(args: argparse.Namespace) -> str:
    what = (
        "kernel audit for %s, references leaving the venv" % args.arch
        if args.arch
        else "references leaving the venv"
    )
    if args.audit_skipped == "1":
        return (
            "skipped: the source is the tree the destination's install recorded, and they "
            "passed for it here (%s)" % what
        )
    if args.audit_rc == "0" or (args.audit_rc == "1" and not args.audit_failed):
        return "passed (%s)" % what
    if args.audit_rc == "1":
        said = (
            " (both ends are this machine: said, not refused)"
            if args.same_host and args.audit_failed == "outside"
            else ""
        )
        return "failed: %s%s" % (args.audit_failed, said)
    return "could not run (exit %s)" % args.audit_rc


# -- here: the plan against what is there now -----------------------------------------------------


def drift(plan_path: str, side: str, now_path: str) -> Tuple[int, str]:
    """(number of paths, the first few) that differ between the plan's record of `side` and now."""
    plan_dir = os.path.dirname(os.path.abspath(plan_path))
    record = ""
    if side == "source":
        _fp, then = planstate.read_scan(os.path.join(plan_dir, "source.scan"))
        _fp, now = planstate.read_scan(now_path)
    else:
        was, then = planstate.read_state(os.path.join(plan_dir, "dest.state"))
        facts, now = planstate.read_state(now_path)
        if (was.get("exists"), was.get("installed_record")) != (
            facts.get("exists"),
            facts.get("installed_record"),
        ):
            record = (
                paths.INSTALLED_MANIFEST + " (the install's record)"
                if facts.get("exists")
                else facts["dest"] + " (gone)"
            )
    then_rows, now_rows = {r[0]: r for r in then}, {r[0]: r for r in now}
    moved = sorted(p for p in set(then_rows) | set(now_rows) if then_rows.get(p) != now_rows.get(p))
    said = []
    for rel in moved[:5]:
        said.append(
            shown(rel)
            + (
                " (new)"
                if rel not in then_rows
                else " (gone)"
                if rel not in now_rows
                else " (changed)"
            )
        )
    if record:
        moved.append(record)
        said.insert(0, shown(record))
    return len(moved), ", ".join(said[:5])


# What both composes (this one, rbkit.fanplan's) take from rb::plan_source and rb::plan_args.
COMPOSE_FIELDS = (
    "name",
    "spec-sha",
    "kit-sha",
    "made",
    "src-host",
    "src-path",
    "dst-host",
    "compression",
    "compression-why",
    "hosts",
    "choices",
    "source-files",
    "source-bytes",
    "need-bytes",
    "audit-rc",
    "audit-failed",
    "audit-skipped",
    "arch",
    "checks",
    "runbook",
    "library-missing",
)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="rbkit liveplan")
    sub = parser.add_subparsers(dest="cmd", required=True)
    state_cmd = sub.add_parser("state")
    state_cmd.add_argument("dest")
    state_cmd.add_argument(
        "--choices", required=True, help="the engine's choices (RB_ENGINE_CHOICES)"
    )
    state_cmd.add_argument(
        "--against-install",
        action="store_true",
        help="compare the entries with the install's manifest here (the plan's)",
    )
    compose_cmd = sub.add_parser("compose")
    compose_cmd.add_argument("--dir", required=True)
    for key in COMPOSE_FIELDS + ("route", "route-why"):
        compose_cmd.add_argument("--" + key, default="")
    for flag in ("incremental", "markdown", "force", "same-host"):
        compose_cmd.add_argument("--" + flag, action="store_true")
    drift_cmd = sub.add_parser("drift")
    drift_cmd.add_argument("--plan", required=True)
    drift_cmd.add_argument("--side", choices=("source", "dest"), required=True)
    drift_cmd.add_argument("--now", required=True)
    installed_cmd = sub.add_parser(
        "installed",
        help="the install's manifest, never through a link (the "
        "manifest step's re-run copies it as root)",
    )
    installed_cmd.add_argument("dest")
    read_cmd = sub.add_parser("read")
    read_cmd.add_argument("plan")
    read_cmd.add_argument("--name", required=True)
    read_cmd.add_argument("--spec-sha", required=True)
    read_cmd.add_argument("--kit-sha", required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd in ("state", "compose"):
            # the spec's choices for the destination, from the engine's one document
            ch = Choices.from_json(args.choices)
            args.policy, args.shared_parent = ch.on_existing, ch.shared_parent
            args.keep_backups = (
                ch.keep_backups or 0
                if args.cmd == "state"
                else ("" if ch.keep_backups is None else str(ch.keep_backups))
            )
        if args.cmd == "state":
            facts, lines = planstate.dest_state(
                args.dest, args.policy, args.keep_backups, args.against_install
            )
            out = sys.stdout.buffer
            out.write(json.dumps(facts, sort_keys=True).encode() + b"\n")
            out.write(b"".join(lines))
            return 0
        if args.cmd == "compose":
            return compose(args)
        if args.cmd == "installed":
            from .installs import why_not_ours_install

            why = why_not_ours_install(args.dest)
            if why:
                print(
                    "rbkit liveplan installed: the install at %s is not proven ours: %s"
                    % (args.dest, why),
                    file=sys.stderr,
                )
                return 2
            got = safefs.read_in(args.dest, paths.INSTALLED_MANIFEST)
            if got is None:
                print(
                    "rbkit liveplan installed: %s/%s is not a regular file of the install"
                    % (args.dest, paths.INSTALLED_MANIFEST),
                    file=sys.stderr,
                )
                return 2
            sys.stdout.buffer.write(got[0])
            return 0
        if args.cmd == "drift":
            count, first = drift(args.plan, args.side, args.now)
            if count:
                print("%d\t%s" % (count, first))
                return 1
            return 0
        return read_plan(args)
    except (OSError, ValueError, KeyError) as exc:
        print("rbkit liveplan %s: %s" % (args.cmd, exc), file=sys.stderr)
        return 2


def read_plan(args: argparse.Namespace) -> int:
    try:
        plan = json.loads(proven.read_record(args.plan).decode("utf-8"))
    except proven.NotOurs as exc:
        # refused before it is read: a plan another user could have written or swapped
        print(
            "refusing to apply %s: %s; another user could have written what it says: make a "
            "new plan with --plan" % (args.plan, exc),
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError) as exc:
        print(
            "the plan %s cannot be read (%s): make one with --plan" % (args.plan, exc),
            file=sys.stderr,
        )
        return 1
    why = ""
    if plan.get("kind") != "rb-plan" or plan.get("runbook") != args.name:
        why = "it is not a plan of runbook %s" % args.name
    elif plan.get("spec_sha256") != args.spec_sha or plan.get("kit_sha256") != args.kit_sha:
        why = "this runbook was compiled again since (another spec or kit)"
    elif plan.get("blockers"):
        why = "the plan is blocked: " + "; ".join(plan["blockers"])
    if why:
        print(
            "refusing to apply %s: %s; make a new one with --plan" % (args.plan, why),
            file=sys.stderr,
        )
        return 1
    for key, value in (
        ("source_stat", plan["source"]["stat_fingerprint"]),
        ("dest_digest", plan["destination"]["digest"]),
        ("route", plan.get("route", "")),
        ("compression", plan.get("compression", "")),
    ):
        print("%s\t%s" % (key, value))
    return 0


if __name__ == "__main__":
    sys.exit(main())
