"""The staging beside the destination: `stage` (a fresh one, or one whose unchanged files are
hard-linked from the current install), its mark while a stream has not been verified into it,
the resume of what a cut stream left (`resumable`, `resume_stage`), and the source manifest a
re-run may keep (`kept_source`).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import stat
from typing import List, Optional, Tuple

from rbrules import owners, proven
from rbrules.units import human

from . import filehash, linkstage, manifest, manifestfile
from .receive import forget_received, staged_bytes
from .runner import (
    INCOMPLETE,
    KEPT,
    Context,
    Result,
    StepError,
    identity_of,
    jobs,
    remove_tree,
    require_lock,
    write_file,
    write_stamp,
)


def stage(
    ctx: Context,
    delta: bool = False,
    carried: Optional[str] = None,
    source_stat: str = "",
    algo: str = "",
    exclude: Optional[List[str]] = None,
    source: str = "",
    resume: bool = False,
) -> Result:
    """A fresh staging beside the destination. With `delta`, every unchanged file (same digest,
    mode, size and mtime as the install recorded, and still so at the destination) is hard-linked
    from the current install, and `send.names` in the state directory lists what the stream must
    still carry. `carried`: the names a payload holds (a fan-out re-run's bundle); a staging that
    needs more than that is removed and the step fails with needs_full.

    With `source_stat` (a re-run, before anything is hashed at the source): the source manifest
    this host holds for the run (ctx.manifest, the one the runbook's machine kept from its last
    run) is used only when it is the source's manifest as of the install (`kept_source`), so
    that nothing at the source needs hashing: `kept=1`. Otherwise nothing is staged (skipped,
    `kept=0` and why): the source is hashed and stage is asked again without it.

    `source` (a fresh staging): what the staging is for (`STAT-FINGERPRINT HOST:PATH`), written
    in its mark (INCOMPLETE, beside it) until verify passes: a stream cut short leaves a staging
    that is private (0700), marked, and never installed, which a later run for the same source
    may continue (`resume`: only the files missing or different are sent, see `resume_stage`).
    Any other staging left here is removed, saying why."""
    require_lock(ctx)
    write_stamp(ctx, None)
    forget_received(ctx, every=True)
    ctx.linked_inodes = None
    if resume:
        return resume_stage(ctx, source)  # refused unless resumable (the manifest step asks)
    if os.path.lexists(ctx.staging):
        why = resumable_why(ctx, source) if source else "not a fresh move's staging"
        ctx.log(
            "an earlier run's staging %s is removed (%s)"
            % (ctx.staging, why or "this run starts afresh")
        )
        remove_tree(ctx.staging)
    drop_mark(ctx)
    facts: dict = {"delta": int(bool(delta))}
    installed = None
    if delta:
        try:
            installed = ctx.installed()
        except (OSError, ValueError):
            why = "no earlier install at %s (or its manifest is unreadable)" % ctx.dest
            if carried is None:
                raise StepError("nothing to link from: " + why) from None
            raise StepError("needs the whole bundle: " + why, {"needs_full": 1}, rc=3) from None
    if source_stat:
        if installed is None:
            raise StepError("a kept source manifest is only for an incremental stage (delta=1)")
        why, rebuilt = kept_source(ctx, installed, source_stat, algo, exclude or [])
        if why:
            return Result("the source is hashed: " + why, {"kept": 0, "why": why}, status="skipped")
        mf = ctx.new_manifest()
        facts.update(
            kept=1,
            rebuilt=int(rebuilt),
            fingerprint=ctx.fingerprint(),
            files=mf["totals"]["files"],
            manifest=ctx.manifest,
        )
    if delta:
        if ctx.unlinkable:
            # what failed the digest check is not linked: it is sent (or the bundle is whole)
            installed = dict(
                installed, entries=[e for e in installed["entries"] if e["p"] not in ctx.unlinkable]
            )
        names = os.path.join(ctx.state, "send.names")
        got = linkstage.stage(ctx.dest, ctx.staging, ctx.new_manifest(), installed, names)
        facts.update(
            {
                k: got.get(k)
                for k in ("linked", "linked_bytes", "send_files", "send_bytes", "removed")
            }
        )
        facts["names"] = names
        if carried is not None:
            have = set(manifestfile.read_names(carried))
            lacking = [n for n in manifestfile.read_names(names) if n not in have]
            if lacking:
                remove_tree(ctx.staging)
                raise StepError(
                    "needs the whole bundle: %d files here differ from what the last fan-out "
                    "installed (changed here, or installed from another source), e.g. %s"
                    % (len(lacking), lacking[0]),
                    dict(facts, needs_full=1),
                    rc=3,
                )
        detail = "%d unchanged files linked from the current install, %d files to send" % (
            got["linked"],
            got["send_files"],
        )
        if source_stat:
            detail += "; the source is unchanged: its manifest as of the install stands for it"
    else:
        parent = os.path.dirname(ctx.staging)
        os.makedirs(parent, exist_ok=True)
        if source:
            # private and marked until verify passes: what a cut stream leaves is kept for a
            # re-run to continue, and is never taken for a whole staging
            os.mkdir(ctx.staging, 0o700)
            write_file(
                _mark_path(ctx),
                json.dumps(
                    {"source": source, "dest": ctx.dest, "identity": identity_of(ctx.staging)}
                ).encode(),
                0o600,
            )
        else:
            os.mkdir(ctx.staging, 0o755)
        detail = "fresh staging %s" % ctx.staging
    identity = identity_of(ctx.staging)
    if delta:
        # verify, in this engine, knows each linked file by the inode linked (not by a look at
        # the install's file of that name)
        ctx.linked_inodes = (identity, got["inodes"])
    write_stamp(ctx, {"stage": "staged", "identity": identity, "delta": bool(delta)})
    return Result(detail, facts)


def _mark_path(ctx: Context) -> str:
    return ctx.staging + INCOMPLETE


def drop_mark(ctx: Context) -> None:
    try:
        os.unlink(_mark_path(ctx))
    except FileNotFoundError:
        pass


def read_mark(ctx: Context) -> Optional[dict]:
    """The staging's mark, when it is a regular file of ours (this user's, one link, no bits for
    others: made by `stage` under the lock), else None."""
    try:
        got = proven.read_ours(_mark_path(ctx), limit=1 << 16)
    except OSError:  # proven.NotOurs among them: not ours, never obeyed
        return None
    if got is None or got[1].st_uid != os.geteuid() or got[1].st_mode & 0o077:
        return None
    try:
        doc = json.loads(got[0])
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def resumable_why(ctx: Context, source: str) -> str:
    """ "" when the staging beside the destination is what a cut stream of this very source left
    (a private directory of ours, marked by `stage` for `source`: STAT-FINGERPRINT HOST:PATH),
    else why not, in words."""
    try:
        st = os.lstat(ctx.staging)
    except FileNotFoundError:
        return "no staging at %s" % ctx.staging
    if (
        not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.geteuid()
        or owners.why_not_ours(ctx.staging, st) is not None
    ):
        return "%s is not a directory of ours" % ctx.staging
    mark = read_mark(ctx)
    if mark is None:
        return (
            "it is not marked as what a cut stream left (%s: a staging that passed verify, "
            "or an older kit's)" % _mark_path(ctx)
        )
    if mark.get("dest") != ctx.dest or mark.get("identity") != [st.st_dev, st.st_ino]:
        return "its mark %s is of another directory" % _mark_path(ctx)
    was, now = str(mark.get("source", "")), source
    if was.partition(" ")[2] != now.partition(" ")[2]:
        return "it was for another source (%s)" % was.partition(" ")[2]
    if was != now:
        return "the source changed since (its stat fingerprint differs)"
    return ""


def resumable(ctx: Context, source: str = "") -> Result:
    """Whether a cut stream of this source left a staging here that `stage resume=1` continues
    (resumable_why). Nothing is written."""
    require_lock(ctx)
    why = resumable_why(ctx, source)
    if why:
        if os.path.lexists(ctx.staging):
            return Result(
                "an earlier staging is not continued: %s" % why, {"resumable": 0, "why": why}
            )
        return Result(why, {"resumable": 0, "why": why})
    return Result("%s holds what a cut stream of this source left" % ctx.staging, {"resumable": 1})


def kept_room(ctx: Context, source: str, need: int) -> dict:
    """What a staging already beside the destination means for the room a run needs (`need`,
    for the whole tree): one that a cut stream of this `source` left is resumed (`resumable`:
    its files count as staged, `need` shrinks by them; the resume keeps those whose digest is
    the manifest's), any other is removed before the stream (`freed`: its blocks). `lines` say
    so, for the log and the plan: `resumable: 480.0 MB staged; 390.0 MB to send; needs 429.0
    MB` (the need with the run's margin)."""
    out = {"need": need, "freed": 0, "bytes": 0, "files": 0, "resumable": False, "lines": []}
    if not os.path.isdir(ctx.staging) or os.path.islink(ctx.staging):
        return out
    files, size, disk = staged_bytes(ctx.staging)
    out.update(bytes=size, files=files)
    why = resumable_why(ctx, source) if source else "no source given"
    if why:
        out["freed"] = disk
        out["lines"].append(
            "an earlier staging %s (%s, %d files) is removed before the stream "
            "(%s): its room counts as free" % (ctx.staging, human(size), files, why)
        )
        return out
    out["resumable"] = True
    # need carries the run's margin over the tree's bytes: what is staged comes off with it
    left = max(0, need - size - size // 10)
    out["need"] = left
    out["lines"].append(
        "resumable: %s staged (%d files, what a cut stream of this source left "
        "at %s); %s to send; needs %s"
        % (human(size), files, ctx.staging, human(max(0, need * 10 // 11 - size)), human(left))
    )
    return out


def discard_staging(ctx: Context) -> Result:
    """`--discard-staging`: remove the staging beside the destination (what a cut or failed
    stream kept there for a re-run to resume) and its mark, giving its room back; the
    destination itself is never touched. A staging that is not a directory of this user's is
    refused (never removed on another's behalf)."""
    require_lock(ctx)
    mark = read_mark(ctx)
    try:
        st = os.lstat(ctx.staging)
    except FileNotFoundError:
        drop_mark(ctx)
        return Result(
            "no staging at %s: nothing to discard" % ctx.staging,
            {"discarded": 0, "discarded_bytes": 0},
        )
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise StepError(
            "refusing to discard %s: it is not a directory of this user's (uid %d, "
            "mode %o): look at it and remove it by hand" % (ctx.staging, st.st_uid, st.st_mode)
        )
    files, size, _disk = staged_bytes(ctx.staging)
    remove_tree(ctx.staging)
    drop_mark(ctx)
    forget_received(ctx, every=True)
    of = (
        " (what a stream from %s left)" % str(mark.get("source", "")).partition(" ")[2]
        if mark
        else ""
    )
    return Result(
        "discarded the staging %s: %s in %d files%s; the destination %s is as it was"
        % (ctx.staging, human(size), files, of, ctx.dest),
        {"discarded": 1, "discarded_bytes": size},
    )


def resume_stage(ctx: Context, source: str) -> Result:
    """Continue a cut stream's staging (resumable_why must hold, and the source's manifest be
    here): every entry there that the manifest does not list as it is (a file of another size,
    mode or mtime: one cut mid-write; a link, a directory where a file belongs) is removed; each
    remaining file is read and kept only when its digest is the manifest's (the others are
    removed). The names the stream must still carry (every directory and symlink, and each file
    not kept) go to `send.names` in the state directory; the kept files' digests, with the
    inode, ctime and size they were read with, to KEPT (verify takes them as it takes the
    stream's). The staging stays marked until verify passes."""
    why = resumable_why(ctx, source)
    mf = ctx.new_manifest()
    algo = mf["header"].get("algo")
    if not why and algo in (None, "", "none"):
        why = "the manifest has no digests (verify: none) to compare what arrived with"
    if why:
        raise StepError("cannot continue the staging %s: %s" % (ctx.staging, why))
    chmod_dir(ctx.staging, 0o700)
    wanted = {e["p"]: e for e in mf["entries"]}
    candidates, removed = _resume_walk(ctx.staging, wanted)
    kept = _resume_hash(ctx.staging, candidates, algo, jobs(ctx.choices.jobs))
    removed += len(candidates) - len(kept)
    send: List[str] = []
    kept_bytes = send_bytes = send_files = total = 0
    for entry in mf["entries"]:
        if entry["t"] == "f":
            total += entry["s"]
            if entry["p"] in kept:
                kept_bytes += entry["s"]
                continue
            send_files += 1
            send_bytes += entry["s"]
        send.append(entry["p"])
    names = os.path.join(ctx.state, "send.names")
    write_file(names, b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in send), 0o600)
    identity = identity_of(ctx.staging)
    doc = {"algo": algo, "identity": identity, "files": kept}
    write_file(
        os.path.join(ctx.state, KEPT), json.dumps(doc, separators=(",", ":")).encode(), 0o600
    )
    write_stamp(ctx, {"stage": "staged", "identity": identity, "delta": False})
    detail = (
        "resuming: %s of %s already staged (%d files, read and matched); %s to send "
        "(%d files)" % (human(kept_bytes), human(total), len(kept), human(send_bytes), send_files)
    )
    return Result(
        detail,
        {
            "resumed": 1,
            "kept": len(kept),
            "kept_bytes": kept_bytes,
            "send_files": send_files,
            "send_bytes": send_bytes,
            "total_bytes": total,
            "removed": removed,
            "names": names,
            "delta": 0,
        },
    )


def chmod_dir(path: str, mode: int) -> None:
    """chmod the directory at `path` itself (a link there is refused, never followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _resume_walk(root: str, wanted: dict) -> Tuple[List[tuple], int]:
    """What a cut stream left in `root`, against the manifest's entries: (the files whose type,
    size, mode and mtime are the manifest's, to be read: (rel, entry, stat)), how many entries
    were removed. Nothing is followed: a link (at any name) is removed as a link, a directory the
    manifest does not list is removed whole, and so is any entry not proven ours (rbrules.proven).
    """
    candidates: List[tuple] = []
    removed = 0
    for here, dirs, files in os.walk(root, topdown=True, followlinks=False):
        rel_here = os.path.relpath(here, root)
        rel_here = "" if rel_here == "." else rel_here
        for name in list(dirs) + files:
            rel = rel_here + "/" + name if rel_here else name
            path = os.path.join(here, name)
            st = os.lstat(path)
            entry = wanted.get(rel)
            if (
                stat.S_ISDIR(st.st_mode)
                and entry is not None
                and entry["t"] == "d"
                and owners.why_not_ours(path, st) is None
            ):
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and entry is not None
                and entry["t"] == "f"
                and st.st_size == entry["s"]
                and stat.S_IMODE(st.st_mode) == entry.get("m")
                and int(st.st_mtime) == entry.get("mt")
                and owners.why_not_ours(path, st) is None
            ):
                candidates.append((rel, entry, st))
                continue
            remove_tree(path)
            removed += 1
            if name in dirs:
                dirs.remove(name)
    return candidates, removed


def _resume_hash(root: str, candidates: List[tuple], algo: str, threads: int) -> dict:
    """{rel: [digest, ino, ctime_ns, size]} of the candidates whose digest is the manifest's and
    that did not change while read; each other one is removed."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple) -> Optional[list]:
        rel, entry, st = item
        path = os.path.join(root, rel)
        try:
            got = filehash.digest(path, algo, size=entry["s"])
            after = os.lstat(path)
        except (OSError, filehash.Changed):
            got, after = None, None
        if (
            got == entry.get("h")
            and after is not None
            and after.st_ino == st.st_ino
            and after.st_ctime_ns == st.st_ctime_ns
            and after.st_size == st.st_size
        ):
            return [got, st.st_ino, st.st_ctime_ns, st.st_size]
        remove_tree(path)
        return None

    kept = {}
    with ThreadPoolExecutor(max_workers=max(1, min(8, threads))) as pool:
        for item, got in zip(candidates, pool.map(one, candidates)):
            if got is not None:
                kept[item[0]] = got
    return kept


def kept_source(
    ctx: Context, installed: dict, source_stat: str, algo: str, exclude: List[str]
) -> Tuple[str, bool]:
    """(why not, rebuilt): whether the source's manifest as of the install can stand for the
    source's now, and where it came from. It can when the install recorded `source_stat` as its
    source's stat fingerprint and that is the stat fingerprint of the manifest's entries (the
    source is unchanged since, by the quick check's trust: path, type, mode, size, link and mtime
    of every entry), the manifest is, by its fingerprint, the one the install recorded for its
    source, and it was made with this run's digest, excludes and special-modes rule. The manifest
    is the one this host was given for the run (ctx.manifest: the runbook's machine kept it from
    its last run) when that is it; else the one `manifest.source_of` rebuilds from the install's
    own manifest, written to ctx.manifest (rebuilt: True)."""
    header = installed["header"]
    if header.get("source_stat_fingerprint") != source_stat:
        return "the source changed since the install", False
    rebuilt, stat_fp = False, ""
    try:
        ok = ctx.fingerprint() == header.get("source_fingerprint")
    except (StepError, OSError, ValueError):
        ok = False
    if not ok:
        mf = manifest.source_of(installed)
        if mf is None:
            return (
                "the install did not record its source's manifest (an older kit), and none "
                "kept here is it"
            ), False
        if not ctx.manifest:
            raise StepError("no source manifest path was given to the engine")
        # the stat fingerprint its entries have (checked below), in its header as build puts
        # it there: relocate's record of the source takes it from there
        stat_fp = manifestfile.stat_fingerprint(mf["entries"])
        if stat_fp == source_stat:
            mf["header"]["stat_fingerprint"] = stat_fp
        fp = manifestfile.save(mf, ctx.manifest, 0o600, sync=False)
        if fp != header.get("source_fingerprint"):
            os.unlink(ctx.manifest)
            return "the install's record of its source's manifest does not add up", False
        ctx.wrote_manifest(mf, fp)
        rebuilt = True
    mf = ctx.new_manifest()
    kept = mf["header"]
    if (
        kept.get("algo") != algo
        or list(kept.get("excludes", ())) != list(exclude)
        or bool(kept.get("strip_special")) != (ctx.choices.special_modes == "strip")
    ):
        return "the install's source manifest has other digests, excludes or modes", rebuilt
    if (stat_fp if rebuilt else manifestfile.stat_fingerprint(mf["entries"])) != source_stat:
        return "the install's source manifest does not have its recorded stat", rebuilt
    return "", rebuilt
