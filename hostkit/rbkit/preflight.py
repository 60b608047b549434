"""Before the install's steps, on the destination: the lock (`take_lock`), the checks of the
destination's parent and free room (`preflight`), and the early check a re-run starts beside the
source's scan (`begin_early_check`: the walk `current` then reads). The engine's (engine.py);
serve.py runs them on request, a fan-out node through engine.install's caller (fanout.py).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from typing import Any, List, Optional

from rbrules import paths
from rbrules.compression import compressors
from rbrules.units import human

from . import (
    hostfs,
    installs,
    manifest,
    manifestfile,
    pathid,
    privacy,
    staging,
    statwalk,
    swapfs,
)
from .runner import (
    Context,
    Result,
    StepError,
    load_keyed,
    os_error_words,
    user_name,
)


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
    recovered = swapfs.recover_swap(ctx.dest)
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
    the reverse, whatever the names: `source_identity`, the source's pathid.identity), what is
    there, the policy for it, room for the staging, and which compressors this host has.

    A staging already there counts (issue 45: after a disk filled, its ~480 MB refused every
    retry): one a cut stream of this very `source` left (STAT-FINGERPRINT HOST:PATH) is resumed,
    so only the rest of `need` is needed; any other is removed before the stream, so its room
    counts as free. Refused when even so there is too little: `short_bytes` says how much."""
    if source_identity:
        why = pathid.same_or_nested(json.loads(source_identity), pathid.identity(ctx.dest))
        if why:
            raise StepError("refusing to install %s: %s" % (ctx.dest, why))
    exists = os.path.lexists(ctx.dest)
    installed = os.path.isfile(os.path.join(ctx.dest, paths.INSTALLED_MANIFEST))
    if installed:
        why = installs.why_not_ours_install(ctx.dest)
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
