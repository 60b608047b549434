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
(verify, prove, the post-swap proof), backups.py (restore, list_backups), preflight.py (the lock,
preflight, the early check) and probestep.py (probe); this module holds the other steps
(current, relocate_staging, swap, write_exports, rollback), the order they run in (`install`) and
what a failure past the swap does. Callers import each step from the module that owns it.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import os
import stat
import time
from typing import Any, Callable, List, Optional

from rbrules import paths
from rbrules.proven import not_ours_in_tree

from . import (
    exports,
    filehash,
    installs,
    manifest,
    manifestfile,
    probestep,
    relocate,
    swapfs,
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
    remove_tree,
    require_lock,
    require_stamp,
    run,
    sha256_file,
    skipped,
    write_stamp,
)
from .staging import stage


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
        steps.append(("probe", probestep.probe, {}))
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
    not_ours = installs.why_not_ours_install(ctx.dest) if os.path.lexists(ctx.dest) else None
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
    mf = ctx.new_manifest()
    algo = mf["header"]["algo"]
    changes, digests = {}, {}
    for rel, info in result["rewritten"].items():
        change = {"s": info["s"]}
        if algo != "none":
            change["h"] = filehash.digest(os.path.join(ctx.staging, rel), algo)
        changes[rel] = change
        digests[rel] = sha256_file(os.path.join(ctx.staging, rel))
    installed = manifest.relocated(mf, changes, ctx.fingerprint())
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
            result = swapfs.swap(
                ctx.staging, ctx.dest, "backup", swap_atomic=ctx.choices.swap_atomic, unshare=False
            )
        else:
            # keep_backups is applied once the new install passed its checks (prune_after_checks)
            result = swapfs.swap(
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
    """The new install's record (installs.read_info): when, from which runbook and spec, the
    source's manifest fingerprint; its checks not run yet."""
    try:
        fingerprint = ctx.fingerprint()
    except (StepError, OSError, ValueError):
        fingerprint = ""
    installs.write_info(
        ctx.dest,
        installed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        origin=ctx.choices.origin,
        source_fingerprint=fingerprint,
        checks="not run",
        put_back_after=None,
        failed_install=None,
    )


def write_exports(ctx: Context) -> Result:
    """The env file: VIRTUAL_ENV, CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's dirs first."""
    require_lock(ctx)
    choices = ctx.choices
    text, summary = exports.render(
        ctx.dest,
        choices.cuda_home,
        list(choices.library_path_first),
        dict(choices.env),
        choices.origin,
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
        installs.write_info(ctx.dest, checks="none")
        probestep.prune_after_checks(ctx)
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


def rollback(ctx: Context, after: str = "") -> Result:
    """Put back what this run's swap replaced; the failed install is kept apart as
    `DEST.rb-failed` (removed under on_existing: replace), never as a backup. Nothing was there:
    the new install stays, without its manifest, so that no re-run takes it for a good install."""
    require_lock(ctx)
    swapped = ctx.swapped
    if swapped is None:
        return Result("nothing to roll back: no swap in this run", status="skipped")
    previous = swapped["previous"]
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
        from_failed = previous == installs.failed_path(ctx.dest)
        number = None if from_failed else int(previous.rsplit(".", 1)[1])
        got = swapfs.restore(
            ctx.dest,
            number,
            env_file=ctx.env_out,
            swap_atomic=ctx.choices.swap_atomic,
            failed="%s failed after the swap (runbook rollback)" % what,
            from_failed=from_failed,
            known=swapped.get("previous_id"),
        )
        ctx.swapped = None
        kept: Optional[str] = got["kept_current_as"]
        if swapped["transient"]:
            remove_tree(kept)
            kept = None
        installs.write_info(ctx.dest, put_back_after=what, failed_install=kept or "removed")
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
