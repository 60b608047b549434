"""The install engine: every destination-side step of a move, written once.

A single-host runbook drives these steps one request at a time through `python -m rbkit engine
serve` on the destination (one process for the whole run, holding the destination's lock: see
serve.py); a fan-out node runs the same functions in its own process (`rbkit.fanout node`, through
`install` below). Each step is a function taking the run's Context and returning a Result; `run`
times it and emits one event:

    {"step": "verify", "status": "ok|failed|skipped", "detail": "...", "facts": {...},
     "duration_s": 1.234, "error": ["...", ...]}        (error: only when it failed)

The steps, in order (STEPS): stage (a fresh staging beside the destination, or one whose unchanged
files are hard-linked from the current install), receive (a tar stream into it), verify (every
entry against the source's manifest; leaves the stamp), relocate (rewrites what names the old
path; updates the stamp), prove (the staged interpreter runs), swap (one rename, then the
post-swap proof), exports (the env file), probe (the checks, with the moved interpreter). Before
them `current` says whether the destination already holds the tree; after a failure past the swap
`after_failure` rolls back to what was there.

The stamp: verify writes it into the run's private state directory (made by this process, never a
place the tree controls): the manifest's fingerprint and the staging's identity (st_dev, st_ino).
relocate and swap refuse without it, so a staging that failed verification, or one another run
replaced, is never installed.

The engine is split at its seams: runner.py (Context, Result, StepError, `run`, the private state
and its stamp), staging.py (stage and resume), receive.py (the stream's receiving end), proof.py
(verify, prove, the post-swap proof) and backups.py (restore, list_backups); this module holds the
other steps, the order they run in (`install`) and what a failure past the swap does, and names
every step for its callers (serve.py, fanout.py).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from typing import Any, Callable, List, Optional

from rbrules import launch, paths
from rbrules.common import compressors, human
from rbrules.proven import NotOurs, not_ours_in_tree

from . import (
    exports,
    filehash,
    hostfs,
    manifest,
    manifestfile,
    privacy,
    relocate,
    staging,
    statwalk,
)
from .proof import (
    cancel_elsewhere,
    interpreter_prefix,
    prove,
    prove_scripts,
    report_elsewhere,
    verify,
)
from .receive import receive
from .runner import (
    Context,
    Result,
    StepError,
    jobs,
    load_keyed,
    os_error_words,
    remove_tree,
    require_lock,
    require_stamp,
    run,
    sha256_file,
    skipped,
    user_name,
    write_file,
    write_stamp,
)
from .staging import stage
from .stream import child_env, run_quiet, tail


def after_failure(ctx: Context, step: str) -> Optional[dict]:
    """After a failed step: a failure past this run's swap puts back what was there (the post-
    swap proof, the env file; failed checks only with on_failed_checks: rollback)."""
    if ctx.swapped is None:
        return None
    if step in ("swap", "exports") or (
        step == "probe" and ctx.choices.on_failed_checks == "rollback"
    ):
        return run(ctx, "rollback", rollback, step)
    if step == "probe":
        ctx.log(
            "checks failed; the new install stays in place (on_failed_checks: %s)"
            % ctx.choices.on_failed_checks
        )
    return None


# The steps that put the tree in place: each is skipped when `current` found that the destination
# already holds the tree. The one rule: a runbook's requests (serve.py) and a node's install ask it
# through `step`.
SKIPPED_WHEN_CURRENT = ("stage", "receive", "verify", "relocate", "prove", "swap")


def step(ctx: Context, name: str, fn: Callable[..., Result], **kw: Any) -> dict:
    """One step as a run asks for it: skipped when the destination holds the tree already and
    the step is one that puts it there (SKIPPED_WHEN_CURRENT); else run, a failure followed by
    what `after_failure` does."""
    if ctx.up_to_date and name in SKIPPED_WHEN_CURRENT:
        return skipped(ctx, name, ctx.up_to_date)
    event = run(ctx, name, fn, **kw)
    if event["status"] == "failed":
        after_failure(ctx, name)
    return event


def install(
    ctx: Context, producer: Optional[List[str]] = None, carried: Optional[str] = None
) -> int:
    """A whole install in this process (a fan-out node): current, then stage .. swap unless the
    destination holds the tree already, exports, probe. Returns 0, 1 (a step failed) or 3 (the
    payload lacks files this host needs: it needs the whole bundle)."""
    cur = run(ctx, "current", current, ctx.choices.rerun, linking=carried is not None)
    if cur["status"] == "failed":
        return 1
    steps: List[tuple] = [
        ("stage", stage, {"delta": carried is not None, "carried": carried}),
        ("receive", receive, {"producer": producer}),
        ("verify", verify, {}),
        ("relocate", relocate_staging, {}),
        ("prove", prove, {}),
        ("swap", swap, {}),
        ("exports", write_exports, {}),
    ]
    if ctx.probe_config:
        steps.append(("probe", probe, {}))
    for sid, fn, kw in steps:
        event = step(ctx, sid, fn, **kw)
        if event["status"] == "failed":
            return 3 if event["facts"].get("needs_full") else 1
    return 0


def finish(ctx: Context) -> Optional[dict]:
    """The run is over: under on_existing: replace, the install the swap replaced (kept until
    now, for a rollback) is removed."""
    if ctx.swapped is None or not ctx.swapped.get("transient"):
        return None
    return run(ctx, "finish", _drop_replaced)


def _drop_replaced(ctx: Context) -> Result:
    old = ctx.swapped["previous"]
    ctx.swapped = None
    remove_tree(old)
    return Result("removed the install it replaced (%s; on_existing: replace)" % old)


# -- the steps -----------------------------------------------------------------------------------


def take_lock(ctx: Context, lock: Any) -> Result:
    """Hold the destination's lock (rbkit.lock) for the run; then a swap or restore an earlier run
    left half done (two renames, journaled) is finished or undone, before anything here may
    remove the staging, where a previous install can sit until it has its backup name."""
    from .lock import Taken

    shared = check_parent(ctx)
    try:
        lock.acquire()
    except Taken as exc:
        raise StepError(str(exc)) from None
    except OSError as exc:
        parent, who = os.path.dirname(ctx.dest), user_name()
        raise StepError(
            "%s. The run keeps its lock and its staging beside the destination %s, in %s, so %s "
            "must be able to create files there: make %s writable for %s, or set transfer.to to "
            "a destination whose parent directory %s can write"
            % (os_error_words(exc, "create"), ctx.dest, parent, who, parent, who, who)
        ) from exc
    ctx.locked = True
    facts: dict = {
        "state": ctx.state,
        "lock": lock.path,
        "staging": ctx.staging,
        "pid": os.getpid(),
    }
    if shared:
        facts["shared_parent"] = shared
    recovered = hostfs.recover_swap(ctx.dest)
    if recovered:
        ctx.log("an earlier swap of %s was interrupted: %s" % (ctx.dest, recovered.get("detail")))
        facts["recovered"] = recovered.get("action")
    return Result("holding %s" % lock.path, facts)


def check_parent(ctx: Context) -> str:
    """The destination's parent, and every directory above it, before anything is written there
    (the lock is first): one another user can write, or the parent itself when others can add
    entries to it, sticky or not (privacy.check_parent), is refused, naming it, its owner and
    mode, and the fixes; with shared_parent: allow it is a warning, and returned."""
    uid = os.geteuid()
    found = privacy.check_parent(ctx.dest, uid)
    if found is None:
        return ""
    where, why = found
    if ctx.choices.shared_parent != "allow":
        raise StepError(privacy.refusal(ctx.dest, where, why, uid), {"shared_parent": where})
    ctx.log(
        "warning: %s; going on because %s is allow: every entry found there is used only "
        "when it is proven %s's (a backup, the failed install, the lock, the install's files "
        "and its own env file, never the public %s), but another user can still swap what "
        "this run puts in %s between two steps"
        % (why, privacy.SPEC_KEY, user_name(), ctx.env_out, os.path.dirname(ctx.dest))
    )
    return where


def preflight(ctx: Context, need: int = 0, source_identity: str = "", source: str = "") -> Result:
    """The destination before anything is sent: that it is not the source (nor inside it, nor
    the reverse, whatever the names: `source_identity`, the source's hostfs.identity), what is
    there, the policy for it, room for the staging, and which compressors this host has.

    A staging already there counts (issue 45: after a disk filled, its ~480 MB refused every
    retry): one a cut stream of this very `source` left (STAT-FINGERPRINT HOST:PATH) is resumed,
    so only the rest of `need` is needed; any other is removed before the stream, so its room
    counts as free. Refused when even so there is too little: `short_bytes` says how much."""
    if source_identity:
        why = hostfs.same_or_nested(json.loads(source_identity), hostfs.identity(ctx.dest))
        if why:
            raise StepError("refusing to install %s: %s" % (ctx.dest, why))
    exists = os.path.lexists(ctx.dest)
    installed = os.path.isfile(os.path.join(ctx.dest, paths.INSTALLED_MANIFEST))
    if installed:
        why = hostfs.why_not_ours_install(ctx.dest)
        if why:
            # never compared with, linked from or taken for this tool's install: sent whole
            ctx.log(
                "the destination %s is not proven an install of this tool: %s" % (ctx.dest, why)
            )
            installed = False
    if exists and ctx.choices.on_existing == "refuse" and not installed:
        raise StepError(
            "destination %s exists and on_existing is refuse; move it away or set "
            "on_existing: backup" % ctx.dest
        )
    free = hostfs.free_bytes(ctx.staging)
    kept = staging.kept_room(ctx, source, need)
    for line in kept["lines"]:
        ctx.log(line)
    room = free["free_bytes"] + kept["freed"]
    if need and room < kept["need"]:
        facts = {
            "short_bytes": kept["need"] - room,
            "free_bytes": free["free_bytes"],
            "staged_bytes": kept["bytes"],
            "resumable": int(kept["resumable"]),
        }
        said = "%s free" % human(free["free_bytes"])
        if kept["bytes"]:
            said += ", %s already staged there (%s)" % (
                human(kept["bytes"]),
                "resumed: only the rest is needed"
                if kept["resumable"]
                else "removed first: its room counts",
            )
        raise StepError(
            "not enough space for the staging at %s: %s; %s needed"
            % (free["measured_at"], said, human(kept["need"])),
            facts,
        )
    have = compressors(shutil.which)
    what = (
        ("exists (an earlier install: %s)" % paths.INSTALLED_MANIFEST if installed else "exists")
        if exists
        else "does not exist yet"
    )
    ctx.log("destination %s %s; on_existing is %s" % (ctx.dest, what, ctx.choices.on_existing))
    ctx.log(
        "free at %s: %s; the staging needs about %s"
        % (free["measured_at"], human(free["free_bytes"]), human(kept["need"]))
    )
    return Result(
        "%s; %s free" % (what, human(free["free_bytes"])),
        {
            "exists": int(exists),
            "installed": int(installed),
            "staging": ctx.staging,
            "free_bytes": free["free_bytes"],
            "compressors": ",".join(have),
        },
    )


class EarlyCheck:
    """The quick check's half that needs no source: the stat walk of the destination against its
    install, in a thread begun as soon as this run holds the destination's lock, while the
    runbook is still scanning the source. `current` (mode quick) takes it; nothing this run does
    writes to the destination before that. The walk is the live plan's (statwalk.tree_stat):
    when its lines' sha256 is the one the install recorded in its manifest's header
    (INSTALLED_STAT), the tree is as installed and only that header is read (`installed` holds
    only it, and nothing is kept for the steps: ctx.installed() reads the whole manifest if a
    step needs it); else the manifest is read and every entry compared
    (`manifest.check_tree`)."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self.installed: Optional[dict] = None
        self.key: Optional[tuple] = None
        self.tree: Optional[dict] = None
        head = manifestfile.read_header(os.path.join(dest, paths.INSTALLED_MANIFEST))
        self._walk: Optional[statwalk.StatWalk] = None
        if (
            head is not None
            and head.get("source_stat_fingerprint") is not None
            and head.get(manifest.INSTALLED_STAT)
        ):
            # begun here, before this check's thread: where the host has the cores, its
            # workers are forked while this process has one thread (serve: the lock's request)
            self._walk = statwalk.StatWalk(dest, head.get("excludes") or ())
        self._head = head
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        path = os.path.join(self.dest, paths.INSTALLED_MANIFEST)
        head = self._head
        if self._walk is not None and head is not None:
            try:
                lines: Optional[List[bytes]] = self._walk.result()[0]
            except OSError:
                lines = None
            if (
                lines is not None
                and hashlib.sha256(b"".join(lines)).hexdigest() == head[manifest.INSTALLED_STAT]
            ):
                self.installed = {"header": head}
                self.tree = {
                    "ok": True,
                    "why": "unchanged since the install (stat check: the "
                    "walk's stat fingerprint is the one the install recorded)",
                }
                return
        try:
            self.key, self.installed = load_keyed(path, None)
        except (OSError, ValueError):
            return
        if self.installed["header"].get("source_stat_fingerprint") is not None:
            self.tree = manifest.check_tree(self.dest, self.installed)

    def take(self) -> tuple:
        """(installed manifest or None, check_tree's result or None)."""
        self._thread.join()
        return self.installed, self.tree


def begin_early_check(ctx: Context) -> None:
    """Start EarlyCheck when a quick re-run check may follow (the lock is held)."""
    if (
        ctx.choices.rerun == "quick"
        and ctx.locked
        and os.path.isfile(os.path.join(ctx.dest, paths.INSTALLED_MANIFEST))
    ):
        ctx.early = EarlyCheck(ctx.dest)


def current(
    ctx: Context, mode: str = "quick", source_stat: str = "", linking: bool = False
) -> Result:
    """Does the destination already hold this tree? `quick`: the source's stat fingerprint
    (`source_stat`, else the manifest's) against the one the install recorded, and every entry
    there against the install's manifest (no reading); `digest`: the install came from a source
    with this manifest's fingerprint and every file there still has its recorded digest (with
    `linking`, a staging linked from the install follows: the files are hashed even when the
    source changed). A file that fails the digest check is never linked into a staging: it is
    sent again."""
    ctx.up_to_date = None
    ctx.unlinkable = set()
    early, ctx.early = ctx.early, None
    tree = None
    not_ours = hostfs.why_not_ours_install(ctx.dest) if os.path.lexists(ctx.dest) else None
    if not_ours:
        if early is not None:
            early.take()
        return _not_current(
            ctx,
            "the install there is not proven ours (%s): it is sent whole, "
            "nothing is linked from it" % not_ours,
            mode,
        )
    if early is not None and mode == "quick":
        installed, tree = early.take()
        ctx.keep_installed(early.key, installed)
    else:
        try:
            installed = ctx.installed()
        except (OSError, ValueError):
            installed = None
    if installed is None or installed["header"].get("source_stat_fingerprint") is None:
        return _not_current(
            ctx, "no earlier install at %s (or its manifest is unreadable)" % ctx.dest, mode
        )
    if mode == "digest":
        same_source = installed["header"].get("source_fingerprint") == ctx.fingerprint()
        if not same_source and not linking:
            return _not_current(
                ctx, "the destination holds an install of a different source tree", mode
            )
        result = manifest.verify(ctx.dest, installed, jobs(ctx.choices.jobs), limit=1 << 30)
        if not result["ok"]:
            ctx.unlinkable = set(result["missing"]) | {d["p"] for d in result["differ"]}
            for line in manifest.describe(
                dict(
                    result,
                    missing=result["missing"][:20],
                    extra=result["extra"][:20],
                    differ=result["differ"][:20],
                )
            ):
                ctx.log(line)
            return _not_current(
                ctx,
                "the destination has changed since it was installed (%d "
                "entries, listed above; they are sent again, never linked)"
                % sum(result["counts"].values()),
                mode,
            )
        theirs = not_ours_in_tree(ctx.dest)
        if theirs:
            # the bytes are right now; another user can change them the moment after
            for line in theirs:
                ctx.log("not proven ours at the destination (sent again, never linked): %s" % line)
            return _not_current(
                ctx,
                "the destination holds entries another user owns or can "
                "write (listed above; they are sent again, never linked)",
                mode,
            )
        if not same_source:
            return _not_current(ctx, "the source changed since the install", mode)
        why = "up to date (every file re-hashed)"
    else:
        stat_fp = source_stat or manifestfile.stat_fingerprint(ctx.new_manifest()["entries"])
        quick = manifest.quick_check(ctx.dest, installed, stat_fp, tree=tree)
        if not quick["ok"]:
            for why in quick.get("not_ours", []):
                ctx.log("not proven ours at the destination (sent again, never linked): %s" % why)
            for rel in quick.get("changed", []):
                ctx.log("changed at the destination: %s" % rel)
            return _not_current(ctx, quick["why"], mode)
        why = "up to date (quick check)"
    ctx.up_to_date = why
    return Result(why, {"up_to_date": 1})


def _not_current(ctx: Context, why: str, mode: str) -> Result:
    if mode == "digest" and ctx.choices.on_existing == "refuse" and os.path.lexists(ctx.dest):
        raise StepError(
            "destination %s holds a different install and on_existing is refuse (%s)"
            % (ctx.dest, why)
        )
    return Result(why, {"up_to_date": 0, "why": why})


def relocate_staging(ctx: Context) -> Result:
    """Rewrite what names the old path (shebangs, activate scripts, pyvenv.cfg) in the verified
    staging, write the install's manifest, and put the rewritten files' digests in the stamp."""
    require_lock(ctx)
    doc = require_stamp(ctx, ("verified",), "relocate")
    # from here the staging is being rewritten: nothing may install it until relocate says so
    write_stamp(ctx, dict(doc, stage="relocating"))
    result = relocate.relocate(ctx.staging, ctx.old, ctx.dest, scan_elsewhere=False)
    if ctx.elsewhere is None or ctx.elsewhere[1] != result["old_prefixes"]:
        cancel_elsewhere(ctx)
        ctx.elsewhere = (
            relocate.Elsewhere(ctx.staging, result["old_prefixes"]),
            result["old_prefixes"],
        )
    m = ctx.new_manifest()
    algo = m["header"]["algo"]
    changes, digests = {}, {}
    for rel, info in result["rewritten"].items():
        change = {"s": info["s"]}
        if algo != "none":
            change["h"] = filehash.digest(os.path.join(ctx.staging, rel), algo)
        changes[rel] = change
        digests[rel] = sha256_file(os.path.join(ctx.staging, rel))
    installed = manifest.relocated(m, changes, ctx.fingerprint())
    path = os.path.join(ctx.staging, paths.INSTALLED_MANIFEST)
    manifestfile.save(installed, path)
    digests[paths.INSTALLED_MANIFEST] = sha256_file(path)
    if result["remaining"]:
        raise StepError(
            "still naming %s under bin/ after relocation: %s"
            % (ctx.old, ", ".join(result["remaining"])),
            lines=result["remaining"],
        )
    ctx.log("rewritten: %s" % (", ".join(sorted(result["rewritten"])) or "nothing"))
    write_stamp(ctx, dict(doc, stage="relocated", relocated=digests))
    return Result(
        "%d files rewritten" % len(result["rewritten"]), {"rewritten": len(result["rewritten"])}
    )


def swap(ctx: Context) -> Result:
    """Put the proven staging at the destination in one rename, then prove it there: sys.prefix
    is the destination, and the console scripts start from it (prove_scripts). What was there is
    kept until the run ends (a backup with on_existing: backup, for good)."""
    require_lock(ctx)
    doc = require_stamp(ctx, ("proven",), "swap")
    transient = ctx.choices.on_existing == "replace" and os.path.lexists(ctx.dest)
    ctx.critical += 1
    try:
        if transient:
            # replace: what was there waits as a backup (not pruned, not unshared) until the run
            # ends, for a rollback
            result = hostfs.swap(
                ctx.staging, ctx.dest, "backup", swap_atomic=ctx.choices.swap_atomic, unshare=False
            )
        else:
            # keep_backups is applied once the new install passed its checks (prune_after_checks)
            result = hostfs.swap(
                ctx.staging, ctx.dest, ctx.choices.on_existing, swap_atomic=ctx.choices.swap_atomic
            )
        previous = result.get("previous")
        ctx.swapped = {
            "previous": previous,
            "transient": transient,
            "policy": ctx.choices.on_existing,
            "previous_id": _identity_of(previous),
        }
        write_stamp(ctx, None)
    finally:
        ctx.critical -= 1
    _record_install(ctx)
    kept = previous if previous not in (None, "none", "removed") and not transient else ""
    if result.get("previous_failed"):
        ctx.log(
            "the previous destination had failed its checks: kept apart at %s (not a backup; "
            "replaced by the next failure)" % kept
        )
        kept = ""
    facts = {"previous": previous, "backup": kept, "atomic": int(bool(result.get("atomic", True)))}
    if result.get("note"):
        ctx.log(result["note"])
    prefix, version = interpreter_prefix(os.path.join(ctx.dest, "bin", "python"), ctx.dest)
    if os.path.realpath(prefix) != os.path.realpath(ctx.dest):
        raise StepError(
            "the moved interpreter reports sys.prefix %s, expected %s" % (prefix, ctx.dest), facts
        )
    facts["prefix"] = prefix
    proven, failed = prove_scripts(ctx.dest, list(doc.get("relocated") or {}))
    facts["scripts"] = len(proven)
    if failed:
        raise StepError(failed[0], facts, lines=failed)
    if proven:
        ctx.log(
            "%d console scripts started from %s by their shebangs (sys.prefix there): %s%s"
            % (len(proven), ctx.dest, ", ".join(proven[:8]), ", ..." if len(proven) > 8 else "")
        )
    report_elsewhere(ctx, facts)
    if kept:
        ctx.log("the previous destination is kept at %s" % kept)
    what = "kept until the run ends (replace)" if transient else previous
    return Result("installed at %s; previous: %s" % (ctx.dest, what), facts)


def _identity_of(path: Optional[str]) -> Optional[list]:
    """[st_dev, st_ino] of the directory at `path` (what a swap moved aside: a rollback puts that
    very install back, proven by its identity), None when there is none."""
    if not path or path in ("none", "removed"):
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return [st.st_dev, st.st_ino] if stat.S_ISDIR(st.st_mode) else None


def _record_install(ctx: Context) -> None:
    """The new install's record (hostfs.read_info): when, from which runbook and spec, the
    source's manifest fingerprint; its checks not run yet."""
    try:
        fingerprint = ctx.fingerprint()
    except (StepError, OSError, ValueError):
        fingerprint = ""
    hostfs.write_info(
        ctx.dest,
        installed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        origin=ctx.choices.origin,
        source_fingerprint=fingerprint,
        checks="not run",
        put_back_after=None,
        failed_install=None,
    )


def prune_after_checks(ctx: Context) -> None:
    """keep_backups, applied once this run's new install proved itself (its checks passed, or
    the spec has none and its env file is written): an install that fails never evicts a good
    backup."""
    s = ctx.swapped
    if (
        s is None
        or s.get("transient")
        or s.get("policy") != "backup"
        or not ctx.choices.keep_backups
    ):
        return
    for gone in hostfs.prune_backups(ctx.dest, ctx.choices.keep_backups):
        ctx.log(
            "removed an older backup (keep_backups: %s): %s (the new install passed its "
            "checks)" % (ctx.choices.keep_backups, gone)
        )


def write_exports(ctx: Context) -> Result:
    """The env file: VIRTUAL_ENV, CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's dirs first."""
    require_lock(ctx)
    c = ctx.choices
    text, summary = exports.render(
        ctx.dest, c.cuda_home, list(c.library_path_first), dict(c.env), c.origin
    )
    if summary["missing_dirs"]:
        raise StepError(
            "library dirs do not exist in the venv: %s" % ", ".join(summary["missing_dirs"]),
            lines=summary["missing_dirs"],
        )
    exports.write(ctx.env_out, text, venv=ctx.dest)
    ctx.log(
        "env file %s; LD_LIBRARY_PATH: %s"
        % (ctx.env_out, library_words(ctx.dest, summary["library_dirs"]))
    )
    if not ctx.probe_config and ctx.swapped is not None:
        hostfs.write_info(ctx.dest, checks="none")
        prune_after_checks(ctx)
    return Result(ctx.env_out, {"file": ctx.env_out, "library_dirs": len(summary["library_dirs"])})


def library_words(venv: str, dirs: List[str]) -> str:
    """What the env file puts first on LD_LIBRARY_PATH, each dir said as what it is: the venv's
    (relative to it) and CUDA_HOME's (issue 45: `the venv's /usr/local/cuda-13.0/lib64 first`)."""
    if not dirs:
        return "unchanged (the venv has no library directory to put first)"
    inside = [os.path.relpath(d, venv) for d in dirs if d.startswith(venv.rstrip("/") + "/")]
    outside = [d for d in dirs if not d.startswith(venv.rstrip("/") + "/")]
    words = []
    if inside:
        words.append("the venv's %s" % ", ".join(inside))
    if outside:
        words.append("CUDA_HOME's %s" % ", ".join(outside))
    return "%s first" % ", then ".join(words)


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
    info = hostfs.read_info(ctx.dest)
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
        with open(report, encoding="utf-8") as f:
            doc = json.load(f)
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
        hostfs.set_checks(ctx.dest, False, "checks failed: " + ctx.failed_checks)
        raise StepError(
            "checks failed: " + detail if summary else "the checks did not run (exit %s)" % rc,
            facts,
            tail(err or out),
            rc=rc,
        )
    hostfs.set_checks(ctx.dest, True)
    prune_after_checks(ctx)
    return Result(detail, facts)


def rollback(ctx: Context, after: str = "") -> Result:
    """Put back what this run's swap replaced; the failed install is kept apart as
    `DEST.rb-failed` (removed under on_existing: replace), never as a backup. Nothing was there:
    the new install stays, without its manifest, so that no re-run takes it for a good install."""
    require_lock(ctx)
    s = ctx.swapped
    if s is None:
        return Result("nothing to roll back: no swap in this run", status="skipped")
    previous = s["previous"]
    what = (
        ctx.failed_checks
        if after == "probe" and ctx.failed_checks
        else "step %s" % (after or "a step")
    )
    ctx.critical += 1
    try:
        if previous in (None, "none", "removed"):
            ctx.swapped = None
            try:
                os.unlink(os.path.join(ctx.dest, paths.INSTALLED_MANIFEST))
            except FileNotFoundError:
                pass
            return Result(
                "nothing was at %s before this run: the new install stays, without "
                "its manifest (a re-run installs it again)" % ctx.dest,
                {
                    "install_stays": ctx.dest,
                    "previous": "none",
                    "stays_why": "nothing was there before this run to put back",
                },
            )
        from_failed = previous == hostfs.failed_path(ctx.dest)
        number = None if from_failed else int(previous.rsplit(".", 1)[1])
        got = hostfs.restore(
            ctx.dest,
            number,
            env_file=ctx.env_out,
            swap_atomic=ctx.choices.swap_atomic,
            failed="%s failed after the swap (runbook rollback)" % what,
            from_failed=from_failed,
            known=s.get("previous_id"),
        )
        ctx.swapped = None
        kept: Optional[str] = got["kept_current_as"]
        if s["transient"]:
            remove_tree(kept)
            kept = None
        hostfs.write_info(ctx.dest, put_back_after=what, failed_install=kept or "removed")
    finally:
        ctx.critical -= 1
    where = "kept at %s" % kept if kept else "removed (on_existing: replace)"
    ctx.log(
        "rolled back: %s failed; the previous install is at %s again; the failed one is %s"
        % (what, ctx.dest, where)
    )
    return Result(
        "rolled back: %s failed; failed install %s" % (what, where),
        {"restored": previous, "kept_current_as": kept, "rolled_back": 1},
    )
