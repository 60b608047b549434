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

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, List, Optional, Tuple

from rbrules import launch, paths

from . import exports as kitexports
from . import hostfs, privacy, safefs
from . import manifest as kitmanifest
from . import relocate as kitrelocate
from . import tarstream
from .stream import (COMPRESSION, TAR_RECORD, Progress, child_env, human, pipeline, run_quiet,
                     tail)

# The install's steps, in order: what a fan-out node's report and the runbook's events name.
STEPS = ("stage", "receive", "verify", "relocate", "prove", "swap", "exports", "probe")
PROVE_TIMEOUT = 120.0      # seconds for the staged (and the installed) interpreter to answer
STAMP = "stamp.json"
RECEIVED = "received.json"   # what receive saw in the stream: each file's digest, and its inode
                             # (received.I.json: stream I's, when several streams ran)
BEFORE = {"relocate": "verify", "prove": "relocate", "swap": "prove"}   # what each stamp needs
INSTALLED = ".rb-manifest.jsonl"
INCOMPLETE = ".incomplete"   # beside the staging (STAGING.incomplete): what arrived of a stream
                             # that did not end in a verified staging, and the source it was for
KEPT = "received.kept.json"  # resume: the kept files' digests, as RECEIVED's, for verify


def staging_path(dest: str) -> str:
    """`.<name>.rb-staging` beside the destination: rbrules.paths.staging, the one rule."""
    return paths.staging(dest)


def jobs(value: Any) -> int:
    """--jobs N, or auto: one per CPU of this host (at most 32)."""
    if value in (None, "", "auto"):
        return max(1, min(32, os.cpu_count() or 1))
    return max(1, int(value))


class StepError(Exception):
    """A step failed: the message is the event's detail; `lines` what it listed (missing files)."""

    def __init__(self, message: str, facts: Optional[dict] = None,
                 lines: Optional[List[str]] = None, rc: int = 1) -> None:
        super().__init__(message)
        self.facts = facts or {}
        self.lines = lines or []
        self.rc = rc


class Result:
    def __init__(self, detail: str = "", facts: Optional[dict] = None, status: str = "ok") -> None:
        self.detail, self.facts, self.status = detail, facts or {}, status


class Context:
    """What the steps of one run share: the destination and the spec's choices (given), and
    what the run learned so far (the up-to-date verdict, what the swap did, files never to link).
    `emit` receives every event; `log` every human line (the runbook's stderr, or a node's
    report); `capture`: children's output is collected (a node) instead of passed through."""

    def __init__(self, dest: str, *, old: str = "", policy: str = "refuse", manifest: str = "",
                 jobs: Any = "auto", compression: str = "none", env_out: str = "",
                 cuda_home: str = "", first: Optional[List[str]] = None,
                 env: Optional[List[str]] = None, origin: str = "a runbook",
                 probe_config: str = "", on_failed_checks: str = "keep", rerun: str = "quick",
                 timeout: Optional[float] = None, state: str = "", capture: bool = False,
                 special_modes: str = "refuse", keep_backups: Optional[int] = None,
                 swap_atomic: str = "allow", shared_parent: str = "refuse", algo: str = "",
                 emit: Optional[Callable[[dict], None]] = None,
                 log: Optional[Callable[[str], None]] = None,
                 trace: Optional[Callable[[str], None]] = None,
                 progress: Optional[Tuple[float, Callable[[int], None]]] = None,
                 part: Optional[Tuple[int, int]] = None) -> None:
        self.dest = os.path.abspath(dest)
        self.staging = staging_path(self.dest)
        self.old, self.policy, self.manifest = old, policy, manifest
        self.jobs, self.compression = jobs, compression
        self.env_out = paths.env_file(self.dest, env_out or "")
        self.cuda_home, self.first, self.env = cuda_home, list(first or []), list(env or [])
        self.origin, self.probe_config = origin, probe_config
        self.on_failed_checks, self.rerun, self.timeout = on_failed_checks, rerun, timeout
        self.state, self.capture = state, capture
        # transfer.special_modes (receive), keep_backups and swap_atomic (swap, restore)
        self.special_modes, self.keep_backups, self.swap_atomic = \
            special_modes, keep_backups, swap_atomic
        # transfer.shared_parent: a destination's parent other users can write is refused
        # (check_parent), unless allow
        self.shared_parent = shared_parent
        # the digest the stream's receiving end computes (the manifest's, when it is here first)
        self.algo = algo
        self.emit = emit or (lambda event: None)
        self.log = log or (lambda line: None)
        # where a failure's traceback goes: the run's log file only, never the terminal
        self.trace = trace or self.log
        # (every so many seconds, where to) the bytes of the stream receive's tar has read so far
        self.progress = progress
        # receive: which stream of how many this one is (rbkit send --part I/N), None: the one
        self.part = part
        self.locked = False
        self.events: List[dict] = []
        self.up_to_date: Optional[str] = None   # why the destination already holds the tree
        self.unlinkable: set = set()             # failed the digest check: sent, never linked
        self.swapped: Optional[dict] = None      # this run's swap, until rolled back or finished
        self.failed_checks = ""                  # the checks that failed, named (probe)
        self.critical = 0                        # inside a rename sequence: signals wait
        self.elsewhere: Any = None               # (the scan of data files, its prefixes)
        self.early: Any = None                   # the quick check's walk, begun at the lock
        self._manifest_cache: Optional[tuple] = None
        self._installed_cache: Optional[tuple] = None   # (stat key, the install's manifest)
        self.linked_inodes: Optional[tuple] = None     # (staging identity, what stage linked)

    def new_manifest(self) -> dict:
        """The source's manifest for this run (loaded once per version of the file)."""
        if not self.manifest:
            raise StepError("no source manifest was given to the engine")
        try:
            st = os.stat(self.manifest)
        except OSError as exc:
            raise StepError("the source's manifest %s is not here (%s): run the manifest step "
                            "first" % (self.manifest, exc.strerror)) from None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._manifest_cache is None or self._manifest_cache[0] != key:
            m, fp = kitmanifest.load_fingerprinted(self.manifest)
            self._manifest_cache = (key, m, fp)
        return self._manifest_cache[1]

    def fingerprint(self) -> str:
        self.new_manifest()
        return self._manifest_cache[2]

    def wrote_manifest(self, m: dict, fp: str) -> None:
        """`m` (fingerprint `fp`) was just written to self.manifest: kept without reading it."""
        st = os.stat(self.manifest)
        self._manifest_cache = ((st.st_mtime_ns, st.st_size, st.st_ino), m, fp)

    def installed(self) -> dict:
        """The current install's manifest (raises OSError, ValueError), read once per version of
        the file: the quick check's read (EarlyCheck) serves the stage that follows it."""
        key, m = _load_keyed(os.path.join(self.dest, INSTALLED), self._installed_cache)
        self.keep_installed(key, m)
        return m

    def keep_installed(self, key: Optional[tuple], m: Optional[dict]) -> None:
        """Keep `m`, read from the install's manifest while it had stat `key` (_file_key), for
        `installed`; nothing is kept without both."""
        self._installed_cache = (key, m) if key is not None and m is not None else None


def _file_key(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _load_keyed(path: str, cache: Optional[tuple]) -> Tuple[Optional[tuple], dict]:
    """(stat key, manifest at `path`): `cache`'s manifest when the file has its key still; the
    key is None when the file changed while it was read (nothing to keep)."""
    key = _file_key(path)
    if cache is not None and cache[0] == key:
        return key, cache[1]
    m = kitmanifest.load(path)
    return (key if _file_key(path) == key else None), m


# -- the runner ----------------------------------------------------------------------------------


def run(ctx: Context, step: str, fn: Callable[..., Result], *args: Any, **kw: Any) -> dict:
    """Run one step, time it, emit its event (also kept in ctx.events); never raises for the
    step's own failure. An exception's text is never the detail: it is said in words
    (os_error_words), its traceback goes to ctx.trace (the run's log)."""
    start = time.monotonic()
    error: List[str] = []
    try:
        res = fn(ctx, *args, **kw)
        status, detail, facts = res.status, res.detail, res.facts
    except StepError as exc:
        status, detail, facts, error = "failed", str(exc), exc.facts, exc.lines
        facts = dict(facts, rc=exc.rc)
        if exc.__cause__ is not None:
            _trace(ctx, step, exc)
    except OSError as exc:
        status, detail, facts = "failed", os_error_words(exc), {"rc": 1}
        _trace(ctx, step, exc)
    except (ValueError, subprocess.SubprocessError) as exc:
        status, detail, facts = "failed", "%s on %s: %s" % (step, ctx.dest, exc), {"rc": 1}
        _trace(ctx, step, exc)
    except Exception as exc:             # a bug of the kit: the step fails, the run reports it
        status, detail, facts = "failed", (
            "the engine's %s step stopped on an error of its own (a bug of the kit: the "
            "traceback is in the run's log)" % step), {"rc": 1}
        _trace(ctx, step, exc)
    event = {"step": step, "status": status, "detail": detail, "facts": facts,
             "duration_s": round(time.monotonic() - start, 3)}
    if status == "failed":
        event["error"] = ([detail] + error)[:20]
    ctx.events.append(event)
    ctx.emit(event)
    return event


def _trace(ctx: Context, step: str, exc: BaseException) -> None:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    ctx.trace("the engine's %s step failed on %s; traceback:\n%s" % (step, ctx.dest, text))


def user_name() -> str:
    """Who this process acts as: the effective user's name (uid N when it has none)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


# what each errno means for who tried, where the system's own words say too little
_ERRNO_WHY = {
    errno.EROFS: "the file system that holds it is mounted read-only",
    errno.EPERM: "the system does not permit it to %s: an immutable or append-only attribute "
                 "(lsattr -d), or a capability %s lacks",
    errno.EACCES: "the permissions of the directory (or of one above it) do not let %s write",
    errno.ENOSPC: "the file system is full",
    errno.EDQUOT: "%s's disk quota is used up",
    errno.ENOENT: "it, or a directory above it, does not exist",
    errno.ENOTDIR: "a path above it is not a directory",
}


def os_error_words(exc: OSError, doing: str = "") -> str:
    """An OSError in words: who cannot do what where, why (the errno's meaning), e.g.
    `root cannot write /x/.venv.rb-lock: read-only file system (EROFS: the file system that
    holds it is mounted read-only)`; never the exception's own text."""
    if exc.errno is None and exc.args:
        return str(exc)          # raised by the kit with its own words (no errno): as it is
    if exc.filename is None and exc.strerror:
        return exc.strerror      # the kit's words with an errno (swapfs), or the system's alone
    who = user_name()
    # what was tried, where the caller does not say: only these errnos tell it was a write
    doing = doing or ("write" if exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT) else "use")
    where = exc.filename if exc.filename is not None else "a file"
    if exc.filename2 is not None:
        where = "%s to %s" % (where, exc.filename2)
    said = (exc.strerror or "").strip() or "error %s" % exc.errno
    said = said[:1].lower() + said[1:]
    name = errno.errorcode.get(exc.errno or -1, "")
    why = _ERRNO_WHY.get(exc.errno or -1, "")
    why = why.replace("%s", who)
    paren = ": ".join(x for x in (name, why) if x)
    return "%s cannot %s %s: %s%s" % (who, doing, where, said, " (%s)" % paren if paren else "")


def skipped(ctx: Context, step: str, why: str) -> dict:
    return run(ctx, step, lambda c: Result("skipped: " + why, status="skipped"))


def after_failure(ctx: Context, step: str) -> Optional[dict]:
    """After a failed step: a failure past this run's swap puts back what was there (the post-
    swap proof, the env file; failed checks only with on_failed_checks: rollback)."""
    if ctx.swapped is None:
        return None
    if step in ("swap", "exports") or (step == "probe" and ctx.on_failed_checks == "rollback"):
        return run(ctx, "rollback", rollback, step)
    if step == "probe":
        ctx.log("checks failed; the new install stays in place (on_failed_checks: %s)"
                % ctx.on_failed_checks)
    return None


def install(ctx: Context, producer: Optional[List[str]] = None,
            carried: Optional[str] = None) -> int:
    """A whole install in this process (a fan-out node): current, then stage .. swap unless the
    destination holds the tree already, exports, probe. Returns 0, 1 (a step failed) or 3 (the
    payload lacks files this host needs: it needs the whole bundle)."""
    cur = run(ctx, "current", current, ctx.rerun, linking=carried is not None)
    if cur["status"] == "failed":
        return 1
    steps: List[tuple] = []
    if ctx.up_to_date:
        for sid in ("stage", "receive", "verify", "relocate", "prove", "swap"):
            skipped(ctx, sid, ctx.up_to_date)
    else:
        steps += [("stage", stage, {"delta": carried is not None, "carried": carried}),
                  ("receive", receive, {"producer": producer}), ("verify", verify, {}),
                  ("relocate", relocate, {}), ("prove", prove, {}), ("swap", swap, {})]
    steps.append(("exports", exports, {}))
    if ctx.probe_config:
        steps.append(("probe", probe, {}))
    for sid, fn, kw in steps:
        event = run(ctx, sid, fn, **kw)
        if event["status"] == "failed":
            after_failure(ctx, sid)
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


# -- the private state and the stamp -------------------------------------------------------------


def make_state(parent: Optional[str] = None) -> str:
    """This run's private state directory (mkdtemp: 0700, ours)."""
    return tempfile.mkdtemp(prefix="rbengine.", dir=parent)


def _stamp_path(ctx: Context) -> str:
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    return os.path.join(ctx.state, STAMP)


def read_stamp(ctx: Context) -> Optional[dict]:
    try:
        with open(_stamp_path(ctx), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def _write_stamp(ctx: Context, doc: Optional[dict]) -> None:
    path = _stamp_path(ctx)
    if doc is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    write_file(path, json.dumps(doc, sort_keys=True).encode(), 0o600)


def _identity(path: str) -> List[int]:
    """(st_dev, st_ino) of a staging directory; a symlink or a file there is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise StepError("the staging %s does not exist" % path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StepError("the staging %s is not a directory (a symlink or a file is never "
                        "followed)" % path)
    return [st.st_dev, st.st_ino]


def _require(ctx: Context, want: tuple, step: str) -> dict:
    """The stamp, when it says the staging went through `want` in this run and is still the same
    directory with the same manifest; else the step is refused."""
    doc = read_stamp(ctx)
    if doc is None or doc.get("stage") not in ("verified", "relocated", "proven"):
        raise StepError(
            "refusing to %s: the staging %s was not verified in this run (a verify that failed, "
            "or one in an earlier run, leaves nothing to install); run again --from verify, or "
            "the whole runbook" % (step, ctx.staging))
    if doc.get("stage") not in want:
        raise StepError("refusing to %s: %s must pass first, in this run (the staging is %s)"
                        % (step, BEFORE[step], doc.get("stage")))
    if _identity(ctx.staging) != doc.get("identity"):
        raise StepError("refusing to %s: %s is not the staging directory this run verified "
                        "(it was replaced since: another run?)" % (step, ctx.staging))
    if doc.get("fingerprint") != ctx.fingerprint():
        raise StepError("refusing to %s: the staging was verified against another manifest"
                        % step)
    for rel, digest in sorted(doc.get("relocated", {}).items()):
        if _sha256(os.path.join(ctx.staging, rel)) != digest:
            raise StepError("refusing to %s: %s changed in the staging after relocation"
                            % (step, rel))
    return doc


def _require_lock(ctx: Context) -> None:
    if not ctx.locked:
        raise StepError("the engine does not hold the destination's lock (a bug)")


def _sha256(path: str) -> Optional[str]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    h = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `path` whole: a new temp file beside it (O_EXCL, O_NOFOLLOW), then one rename
    (safefs.write_file: a link at `path` is replaced, never written through)."""
    safefs.write_file(path, data, mode)


def remove_tree(path: str) -> None:
    """Remove a tree we made or replaced, if it is there (hostfs.remove: a link is removed, never
    followed)."""
    if os.path.lexists(path):
        hostfs.remove(path)


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
            % (os_error_words(exc, "create"), ctx.dest, parent, who, parent, who, who)) from exc
    ctx.locked = True
    facts: dict = {"state": ctx.state, "lock": lock.path, "staging": ctx.staging,
                   "pid": os.getpid()}
    if shared:
        facts["shared_parent"] = shared
    recovered = hostfs.recover_swap(ctx.dest)
    if recovered:
        ctx.log("an earlier swap of %s was interrupted: %s" % (ctx.dest, recovered.get("detail")))
        facts["recovered"] = recovered.get("action")
    return Result("holding %s" % lock.path, facts)


def check_parent(ctx: Context) -> str:
    """The destination's parent, and every directory above it, before anything is written there
    (the lock is first): a directory another user can write (privacy.why_not_private) is refused,
    naming it, its owner and mode, and the fixes; with shared_parent: allow it is a warning, and
    returned."""
    uid = os.geteuid()
    found = privacy.check_parent(ctx.dest, uid)
    if found is None:
        return ""
    where, why = found
    if ctx.shared_parent != "allow":
        raise StepError(privacy.refusal(ctx.dest, where, why, uid), {"shared_parent": where})
    ctx.log("warning: %s; going on because %s is allow: the checks source the install's own env "
            "file (not %s), and a backup of another user is never restored, but another user can "
            "still swap what this run puts in %s"
            % (why, privacy.SPEC_KEY, ctx.env_out, os.path.dirname(ctx.dest)))
    return where


def preflight(ctx: Context, need: int = 0, source_identity: str = "") -> Result:
    """The destination before anything is sent: that it is not the source (nor inside it, nor
    the reverse, whatever the names: `source_identity`, the source's hostfs.identity), what is
    there, the policy for it, room for the staging, and which compressors this host has."""
    if source_identity:
        why = hostfs.same_or_nested(json.loads(source_identity), hostfs.identity(ctx.dest))
        if why:
            raise StepError("refusing to install %s: %s" % (ctx.dest, why))
    exists = os.path.lexists(ctx.dest)
    installed = os.path.isfile(os.path.join(ctx.dest, INSTALLED))
    if exists and ctx.policy == "refuse" and not installed:
        raise StepError("destination %s exists and on_existing is refuse; move it away or set "
                        "on_existing: backup" % ctx.dest)
    free = hostfs.free_bytes(ctx.staging)
    if need and free["free_bytes"] < need:
        raise StepError("not enough space for the staging at %s: %s free, %s needed"
                        % (free["measured_at"], human(free["free_bytes"]), human(need)))
    have = [name for name, c in sorted(COMPRESSION.items())
            if c["tool"] is None or shutil.which(c["tool"])]
    what = ("exists (an earlier install: %s)" % INSTALLED if installed else "exists") if exists \
        else "does not exist yet"
    ctx.log("destination %s %s; on_existing is %s" % (ctx.dest, what, ctx.policy))
    ctx.log("free at %s: %s; the staging needs about %s" % (free["measured_at"],
                                                            human(free["free_bytes"]), human(need)))
    return Result("%s; %s free" % (what, human(free["free_bytes"])),
                  {"exists": int(exists), "installed": int(installed), "staging": ctx.staging,
                   "free_bytes": free["free_bytes"], "compressors": ",".join(have)})


class EarlyCheck:
    """The quick check's half that needs no source: the install's manifest, and the stat walk of
    the destination against it (`kitmanifest.check_tree`), in a thread begun as soon as this run
    holds the destination's lock, while the runbook is still scanning the source. `current`
    (mode quick) takes it; nothing this run does writes to the destination before that."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self.installed: Optional[dict] = None
        self.key: Optional[tuple] = None
        self.tree: Optional[dict] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.key, self.installed = _load_keyed(os.path.join(self.dest, INSTALLED), None)
        except (OSError, ValueError):
            return
        if self.installed["header"].get("source_stat_fingerprint") is not None:
            self.tree = kitmanifest.check_tree(self.dest, self.installed)

    def take(self) -> tuple:
        """(installed manifest or None, check_tree's result or None)."""
        self._thread.join()
        return self.installed, self.tree


def begin_early_check(ctx: Context) -> None:
    """Start EarlyCheck when a quick re-run check may follow (the lock is held)."""
    if ctx.rerun == "quick" and ctx.locked and os.path.isfile(os.path.join(ctx.dest, INSTALLED)):
        ctx.early = EarlyCheck(ctx.dest)


def current(ctx: Context, mode: str = "quick", source_stat: str = "",
            linking: bool = False) -> Result:
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
    if early is not None and mode == "quick":
        installed, tree = early.take()
        ctx.keep_installed(early.key, installed)
    else:
        try:
            installed = ctx.installed()
        except (OSError, ValueError):
            installed = None
    if installed is None or installed["header"].get("source_stat_fingerprint") is None:
        return _not_current(ctx, "no earlier install at %s (or its manifest is unreadable)"
                            % ctx.dest, mode)
    if mode == "digest":
        same_source = installed["header"].get("source_fingerprint") == ctx.fingerprint()
        if not same_source and not linking:
            return _not_current(ctx, "the destination holds an install of a different source "
                                "tree", mode)
        result = kitmanifest.verify(ctx.dest, installed, jobs(ctx.jobs), limit=1 << 30)
        if not result["ok"]:
            ctx.unlinkable = set(result["missing"]) | {d["p"] for d in result["differ"]}
            for line in kitmanifest.describe(dict(result, missing=result["missing"][:20],
                                                  extra=result["extra"][:20],
                                                  differ=result["differ"][:20])):
                ctx.log(line)
            return _not_current(ctx, "the destination has changed since it was installed (%d "
                                "entries, listed above; they are sent again, never linked)"
                                % sum(result["counts"].values()), mode)
        if not same_source:
            return _not_current(ctx, "the source changed since the install", mode)
        why = "up to date (every file re-hashed)"
    else:
        stat_fp = source_stat or kitmanifest.stat_fingerprint(ctx.new_manifest()["entries"])
        quick = kitmanifest.quick_check(ctx.dest, installed, stat_fp, tree=tree)
        if not quick["ok"]:
            for rel in quick.get("changed", []):
                ctx.log("changed at the destination: %s" % rel)
            return _not_current(ctx, quick["why"], mode)
        why = "up to date (quick check)"
    ctx.up_to_date = why
    return Result(why, {"up_to_date": 1})


def _not_current(ctx: Context, why: str, mode: str) -> Result:
    if mode == "digest" and ctx.policy == "refuse" and os.path.lexists(ctx.dest):
        raise StepError("destination %s holds a different install and on_existing is refuse (%s)"
                        % (ctx.dest, why))
    return Result(why, {"up_to_date": 0, "why": why})


def stage(ctx: Context, delta: bool = False, carried: Optional[str] = None,
          source_stat: str = "", algo: str = "", exclude: Optional[List[str]] = None,
          source: str = "", resume: bool = False) -> Result:
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
    _require_lock(ctx)
    _write_stamp(ctx, None)
    _forget_received(ctx, every=True)
    ctx.linked_inodes = None
    if resume:
        return resume_stage(ctx, source)     # refused unless resumable (the manifest step asks)
    if os.path.lexists(ctx.staging):
        why = resumable_why(ctx, source) if source else "not a fresh move's staging"
        ctx.log("an earlier run's staging %s is removed (%s)" % (ctx.staging, why or
                                                                 "this run starts afresh"))
        remove_tree(ctx.staging)
    _drop_mark(ctx)
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
            return Result("the source is hashed: " + why, {"kept": 0, "why": why},
                          status="skipped")
        m = ctx.new_manifest()
        facts.update(kept=1, rebuilt=int(rebuilt), fingerprint=ctx.fingerprint(),
                     files=m["totals"]["files"], manifest=ctx.manifest)
    if delta:
        if ctx.unlinkable:
            # what failed the digest check is not linked: it is sent (or the bundle is whole)
            installed = dict(installed, entries=[e for e in installed["entries"]
                                                 if e["p"] not in ctx.unlinkable])
        names = os.path.join(ctx.state, "send.names")
        got = hostfs.stage(ctx.dest, ctx.staging, ctx.new_manifest(), installed, names)
        facts.update({k: got.get(k) for k in ("linked", "linked_bytes", "send_files",
                                              "send_bytes", "removed")})
        facts["names"] = names
        if carried is not None:
            have = set(kitmanifest.read_names(carried))
            lacking = [n for n in kitmanifest.read_names(names) if n not in have]
            if lacking:
                remove_tree(ctx.staging)
                raise StepError(
                    "needs the whole bundle: %d files here differ from what the last fan-out "
                    "installed (changed here, or installed from another source), e.g. %s"
                    % (len(lacking), lacking[0]), dict(facts, needs_full=1), rc=3)
        detail = ("%d unchanged files linked from the current install, %d files to send"
                  % (got["linked"], got["send_files"]))
        if source_stat:
            detail += "; the source is unchanged: its manifest as of the install stands for it"
    else:
        parent = os.path.dirname(ctx.staging)
        os.makedirs(parent, exist_ok=True)
        if source:
            # private and marked until verify passes: what a cut stream leaves is kept for a
            # re-run to continue, and is never taken for a whole staging
            os.mkdir(ctx.staging, 0o700)
            write_file(_mark_path(ctx), json.dumps(
                {"source": source, "dest": ctx.dest,
                 "identity": _identity(ctx.staging)}).encode(), 0o600)
        else:
            os.mkdir(ctx.staging, 0o755)
        detail = "fresh staging %s" % ctx.staging
    identity = _identity(ctx.staging)
    if delta:
        # verify, in this engine, knows each linked file by the inode linked (not by a look at
        # the install's file of that name)
        ctx.linked_inodes = (identity, got["inodes"])
    _write_stamp(ctx, {"stage": "staged", "identity": identity, "delta": bool(delta)})
    return Result(detail, facts)


def _mark_path(ctx: Context) -> str:
    return ctx.staging + INCOMPLETE


def _drop_mark(ctx: Context) -> None:
    try:
        os.unlink(_mark_path(ctx))
    except FileNotFoundError:
        pass


def _read_mark(ctx: Context) -> Optional[dict]:
    """The staging's mark, when it is a regular file of ours (this user's, one link, no bits for
    others: made by `stage` under the lock), else None."""
    try:
        fd = os.open(_mark_path(ctx), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1
                or st.st_mode & 0o077):
            return None
        try:
            doc = json.loads(f.read(1 << 16))
        except ValueError:
            return None
    return doc if isinstance(doc, dict) else None


def resumable_why(ctx: Context, source: str) -> str:
    """"" when the staging beside the destination is what a cut stream of this very source left
    (a private directory of ours, marked by `stage` for `source`: STAT-FINGERPRINT HOST:PATH),
    else why not, in words."""
    try:
        st = os.lstat(ctx.staging)
    except FileNotFoundError:
        return "no staging at %s" % ctx.staging
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return "%s is not a directory of ours" % ctx.staging
    mark = _read_mark(ctx)
    if mark is None:
        return ("it is not marked as what a cut stream left (%s: a staging that passed verify, "
                "or an older kit's)" % _mark_path(ctx))
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
    _require_lock(ctx)
    why = resumable_why(ctx, source)
    if why:
        if os.path.lexists(ctx.staging):
            return Result("an earlier staging is not continued: %s" % why,
                          {"resumable": 0, "why": why})
        return Result(why, {"resumable": 0, "why": why})
    return Result("%s holds what a cut stream of this source left" % ctx.staging,
                  {"resumable": 1})


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
    m = ctx.new_manifest()
    algo = m["header"].get("algo")
    if not why and algo in (None, "", "none"):
        why = "the manifest has no digests (verify: none) to compare what arrived with"
    if why:
        raise StepError("cannot continue the staging %s: %s" % (ctx.staging, why))
    _chmod_dir(ctx.staging, 0o700)
    wanted = {e["p"]: e for e in m["entries"]}
    candidates, removed = _resume_walk(ctx.staging, wanted)
    kept = _resume_hash(ctx.staging, candidates, algo, jobs(ctx.jobs))
    removed += len(candidates) - len(kept)
    send: List[str] = []
    kept_bytes = send_bytes = send_files = total = 0
    for e in m["entries"]:
        if e["t"] == "f":
            total += e["s"]
            if e["p"] in kept:
                kept_bytes += e["s"]
                continue
            send_files += 1
            send_bytes += e["s"]
        send.append(e["p"])
    names = os.path.join(ctx.state, "send.names")
    write_file(names, b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in send), 0o600)
    identity = _identity(ctx.staging)
    doc = {"algo": algo, "identity": identity, "files": kept}
    write_file(os.path.join(ctx.state, KEPT), json.dumps(doc, separators=(",", ":")).encode(),
               0o600)
    _write_stamp(ctx, {"stage": "staged", "identity": identity, "delta": False})
    detail = ("resuming: %s of %s already staged (%d files, read and matched); %s to send "
              "(%d files)" % (human(kept_bytes), human(total), len(kept), human(send_bytes),
                              send_files))
    return Result(detail, {"resumed": 1, "kept": len(kept), "kept_bytes": kept_bytes,
                           "send_files": send_files, "send_bytes": send_bytes,
                           "total_bytes": total, "removed": removed, "names": names,
                           "delta": 0})


def _chmod_dir(path: str, mode: int) -> None:
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
    manifest does not list is removed whole."""
    candidates: List[tuple] = []
    removed = 0
    for here, dirs, files in os.walk(root, topdown=True, followlinks=False):
        rel_here = os.path.relpath(here, root)
        rel_here = "" if rel_here == "." else rel_here
        for name in list(dirs) + files:
            rel = rel_here + "/" + name if rel_here else name
            path = os.path.join(here, name)
            st = os.lstat(path)
            e = wanted.get(rel)
            if stat.S_ISDIR(st.st_mode) and e is not None and e["t"] == "d":
                continue
            if (stat.S_ISREG(st.st_mode) and e is not None and e["t"] == "f"
                    and st.st_size == e["s"] and stat.S_IMODE(st.st_mode) == e.get("m")
                    and int(st.st_mtime) == e.get("mt")):
                candidates.append((rel, e, st))
                continue
            remove_tree(path)
            removed += 1
            if name in dirs:
                dirs.remove(name)
    return candidates, removed


def _resume_hash(root: str, candidates: List[tuple], algo: str, n: int) -> dict:
    """{rel: [digest, ino, ctime_ns, size]} of the candidates whose digest is the manifest's and
    that did not change while read; each other one is removed."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item: tuple) -> Optional[list]:
        rel, e, st = item
        path = os.path.join(root, rel)
        try:
            got = kitmanifest.digest(path, algo, size=e["s"])
            after = os.lstat(path)
        except (OSError, kitmanifest.Changed):
            got, after = None, None
        if (got == e.get("h") and after is not None and after.st_ino == st.st_ino
                and after.st_ctime_ns == st.st_ctime_ns and after.st_size == st.st_size):
            return [got, st.st_ino, st.st_ctime_ns, st.st_size]
        remove_tree(path)
        return None

    kept = {}
    with ThreadPoolExecutor(max_workers=max(1, min(8, n))) as pool:
        for item, got in zip(candidates, pool.map(one, candidates)):
            if got is not None:
                kept[item[0]] = got
    return kept


def kept_source(ctx: Context, installed: dict, source_stat: str, algo: str,
                exclude: List[str]) -> Tuple[str, bool]:
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
        m = kitmanifest.source_of(installed)
        if m is None:
            return ("the install did not record its source's manifest (an older kit), and none "
                    "kept here is it"), False
        if not ctx.manifest:
            raise StepError("no source manifest path was given to the engine")
        # the stat fingerprint its entries have (checked below), in its header as build puts
        # it there: relocate's record of the source takes it from there
        stat_fp = kitmanifest.stat_fingerprint(m["entries"])
        if stat_fp == source_stat:
            m["header"]["stat_fingerprint"] = stat_fp
        fp = kitmanifest.save(m, ctx.manifest, 0o600, sync=False)
        if fp != header.get("source_fingerprint"):
            os.unlink(ctx.manifest)
            return "the install's record of its source's manifest does not add up", False
        ctx.wrote_manifest(m, fp)
        rebuilt = True
    m = ctx.new_manifest()
    kept = m["header"]
    if (kept.get("algo") != algo or list(kept.get("excludes", ())) != list(exclude)
            or bool(kept.get("strip_special")) != (ctx.special_modes == "strip")):
        return "the install's source manifest has other digests, excludes or modes", rebuilt
    if (stat_fp if rebuilt else kitmanifest.stat_fingerprint(m["entries"])) != source_stat:
        return "the install's source manifest does not have its recorded stat", rebuilt
    return "", rebuilt


def receive(ctx: Context, producer: Optional[List[str]] = None) -> Result:
    """Unpack a tar stream into this run's staging: from stdin (the far end of the runbook's
    pipeline), or from `producer`'s output (a fan-out node reading its bundle). A reader between
    the decompressor and tar (tarstream.Digester) hashes each file as the stream carries it; when
    tar is done, the digests and each file's inode and ctime as tar left it go into the state
    directory (RECEIVED), for verify. A stream that is not a whole tar archive (truncated, a bad
    header) fails here, whatever tar says."""
    doc = read_stamp(ctx)
    if doc is None or doc.get("stage") != "staged" or _identity(ctx.staging) != doc["identity"]:
        raise StepError("refusing to receive: %s is not the staging this run's stage step made"
                        % ctx.staging)
    _forget_received(ctx)
    algo = ctx.algo or (ctx.new_manifest()["header"]["algo"] if ctx.manifest else "sha256")
    table = COMPRESSION[ctx.compression]
    argvs: List[Any] = []
    names: List[str] = []
    if producer:
        argvs.append(producer)
        names.append("read")
    if table["unpack"]:
        argvs.append(table["unpack"])
        names.append(table["tool"])
    digester = None
    if algo != "none":
        # hashing threads for big files: the cores tar and the decompressor leave; none on two
        # (tarstream: there each hand-over costs more than the thread gives)
        n = jobs(ctx.jobs)
        if ctx.part is not None:
            n = max(1, n // ctx.part[1])     # several streams: the cores shared among them
        digester = tarstream.Digester(algo, min(8, n - 1) if n > 2 else 0)
        argvs.append(digester.stage)
        names.append("digest reader")
    # never a setuid, setgid, sticky or world-write bit made (as root, --no-same-owner alone keeps
    # them): umask 002 and --no-same-permissions, unless the spec keeps them (special_modes: keep)
    keep = ctx.special_modes == "keep"
    argvs.append(["tar", "-C", ctx.staging, *TAR_RECORD, "-xf", "-", "--no-same-owner"]
                 + ([] if keep else ["--no-same-permissions"]))
    names.append("tar")
    watch = Progress(*ctx.progress) if ctx.progress else None
    codes, errs = pipeline(argvs, ctx.timeout, capture=ctx.capture, umask=None if keep else 0o002,
                           started=watch.start if watch else None)
    if watch is not None:
        watch.stop(digester.off if digester is not None else None)
    bad = ["%s exited %s" % (n, c) for n, c in zip(names, codes) if c != 0]
    broken = ""
    if digester is not None:
        digester.close()
        if digester.corrupt:
            broken = "the stream is not a good tar archive: %s" % digester.corrupt
        elif digester.truncated:
            broken = ("the stream ended at byte %d, before the end of the tar archive (cut short "
                      "on the way?)" % digester.off)
    if bad or broken:
        raise StepError("unpacking into %s failed: %s" % (ctx.staging, "; ".join(
            bad + ([broken] if broken else []))), lines=tail("\n".join(e for e in errs if e)),
            rc=next((c for c in codes if c != 0), 1))
    facts: dict = {"staging": ctx.staging}
    if digester is not None:
        facts["stream_bytes"] = digester.off     # what this end read of the tar stream
    if ctx.special_modes == "strip":
        # several streams: each strips the whole staging once its own tar is done (what another
        # stream's tar still writes, that stream strips)
        stripped = hostfs.strip_special(ctx.staging)
        facts["stripped"] = len(stripped)
        for item in stripped[:20]:
            ctx.log("stripped %s: mode %s -> %s" % (item["p"], item["was"], item["now"]))
    detail = "unpacked into %s (compression %s)" % (ctx.staging, ctx.compression)
    if digester is not None:
        digests = digester.result()
        if digester.lost:
            ctx.log("no digests from the stream (verify reads every file): %s" % digester.lost)
        facts["streamed"] = _save_received(ctx, algo, digests)
        detail += ", %d files hashed from the stream (%s)" % (facts["streamed"], algo)
    return Result(detail, facts)


def _received_path(ctx: Context) -> str:
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    if ctx.part is not None:
        return os.path.join(ctx.state, "received.%d.json" % ctx.part[0])
    return os.path.join(ctx.state, RECEIVED)


def _received_paths(ctx: Context) -> List[str]:
    """Every stream's RECEIVED in the state directory (one, or one per stream)."""
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    try:
        names = os.listdir(ctx.state)
    except OSError:
        return []
    return [os.path.join(ctx.state, n) for n in sorted(names)
            if n in (RECEIVED, KEPT) or _PART_RECEIVED.match(n)]


_PART_RECEIVED = re.compile(r"received\.[0-9]+\.json\Z")


def _forget_received(ctx: Context, every: bool = False) -> None:
    for path in _received_paths(ctx) if every else [_received_path(ctx)]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _save_received(ctx: Context, algo: str, digests: dict) -> int:
    """RECEIVED: for each regular file of the staging that the stream carried, its digest and
    the inode, ctime and size tar left it with (an lstat each, no reading: a path through a
    link is never one verify's walk takes, so what it names is never looked up). Verify trusts
    a digest only for a file that still has them; returns how many files it lists."""
    files = {}
    for rel, digest in digests.items():
        try:
            st = os.lstat(os.path.join(ctx.staging, rel))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            files[rel] = [digest, st.st_ino, st.st_ctime_ns, st.st_size]
    doc = {"algo": algo, "identity": _identity(ctx.staging), "files": files}
    write_file(_received_path(ctx), json.dumps(doc, separators=(",", ":")).encode(), 0o600)
    return len(files)


def _load_received(ctx: Context, identity: List[int], algo: str) -> Optional[dict]:
    """The files receive hashed from the stream, or from each of the streams, into this staging
    (None: no record; a record of another staging or algorithm counts as none: those files are
    read)."""
    files: Optional[dict] = None
    for path in _received_paths(ctx):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if (not isinstance(doc, dict) or doc.get("identity") != identity
                or doc.get("algo") != algo):
            continue
        got = doc.get("files") or {}
        if files is None:
            files = got
        else:
            files.update(got)
    return files


def verify(ctx: Context) -> Result:
    """Every entry of the staging against the source's manifest, by a stat walk (type, mode, size,
    link target; every entry there, nothing extra). A file's content: by the digest receive took
    from the stream, when the file still has the inode and ctime tar left it with (RECEIVED);
    by stat when this run's stage linked it from the current install; else it is read and hashed.
    Leaves the stamp relocate and swap require."""
    _require_lock(ctx)
    doc = read_stamp(ctx) or {}
    _write_stamp(ctx, None)
    identity = _identity(ctx.staging)
    linked = ctx.dest if doc.get("delta") and doc.get("identity") == identity else None
    new = ctx.new_manifest()
    received = _load_received(ctx, identity, new["header"]["algo"])
    _scan_elsewhere(ctx)
    inodes = (ctx.linked_inodes[1] if linked and ctx.linked_inodes is not None
              and ctx.linked_inodes[0] == identity else None)
    result = kitmanifest.verify(ctx.staging, new, jobs(ctx.jobs), linked_from=linked,
                                received=received, linked_inodes=inodes)
    listed = kitmanifest.describe(result)
    for line in listed:
        ctx.log(line)
    facts = {k: result[k] for k in ("checked", "hashed", "linked", "streamed")}
    if not result["ok"]:
        _cancel_elsewhere(ctx)
        raise StepError("the copy in %s differs from the source manifest (listed above); the "
                        "destination was not touched" % ctx.staging, facts, listed)
    if _read_mark(ctx) is not None:
        # whole and verified: no longer what a cut stream left; the install's mode
        _chmod_dir(ctx.staging, 0o755)
        _drop_mark(ctx)
    _write_stamp(ctx, {"stage": "verified", "identity": identity, "fingerprint": ctx.fingerprint(),
                       "delta": bool(linked)})
    if result["streamed"]:
        # the files whose digests the stream's receiving end computed are not read again
        detail = "%d entries match, %d files checked by the stream's %s" % (
            result["checked"], result["streamed"], result["algo"])
        if result["hashed"]:
            detail += ", %d hashed again" % result["hashed"]
    else:
        detail = "%d entries match, %d files hashed (%s)" % (result["checked"], result["hashed"],
                                                              result["algo"])
    if linked:
        detail += ", %d linked unchanged" % result["linked"]
    return Result(detail, facts)


def relocate(ctx: Context) -> Result:
    """Rewrite what names the old path (shebangs, activate scripts, pyvenv.cfg) in the verified
    staging, write the install's manifest, and put the rewritten files' digests in the stamp."""
    _require_lock(ctx)
    doc = _require(ctx, ("verified",), "relocate")
    # from here the staging is being rewritten: nothing may install it until relocate says so
    _write_stamp(ctx, dict(doc, stage="relocating"))
    result = kitrelocate.relocate(ctx.staging, ctx.old, ctx.dest, scan_elsewhere=False)
    if ctx.elsewhere is None or ctx.elsewhere[1] != result["old_prefixes"]:
        _cancel_elsewhere(ctx)
        ctx.elsewhere = (kitrelocate.Elsewhere(ctx.staging, result["old_prefixes"]),
                         result["old_prefixes"])
    m = ctx.new_manifest()
    algo = m["header"]["algo"]
    changes, digests = {}, {}
    for rel, info in result["rewritten"].items():
        change = {"s": info["s"]}
        if algo != "none":
            change["h"] = kitmanifest.digest(os.path.join(ctx.staging, rel), algo)
        changes[rel] = change
        digests[rel] = _sha256(os.path.join(ctx.staging, rel))
    installed = kitmanifest.relocated(m, changes, ctx.fingerprint())
    path = os.path.join(ctx.staging, INSTALLED)
    kitmanifest.save(installed, path)
    digests[INSTALLED] = _sha256(path)
    if result["remaining"]:
        raise StepError("still naming %s under bin/ after relocation: %s"
                        % (ctx.old, ", ".join(result["remaining"])), lines=result["remaining"])
    ctx.log("rewritten: %s" % (", ".join(sorted(result["rewritten"])) or "nothing"))
    _write_stamp(ctx, dict(doc, stage="relocated", relocated=digests))
    return Result("%d files rewritten" % len(result["rewritten"]),
                  {"rewritten": len(result["rewritten"])})


def _scan_elsewhere(ctx: Context) -> None:
    """Data files outside bin/ that name the old path are only reported (swap, _report_elsewhere);
    that scan reads every .py, .txt, .json... of the staging, so it starts with verify, in a child
    Python beside verify's walk, on the prefixes relocate will replace (relocate starts it again
    in a thread if those differ)."""
    _cancel_elsewhere(ctx)
    olds = kitrelocate.old_prefixes(ctx.staging, ctx.old, ctx.dest) if ctx.old else []
    if olds:
        ctx.elsewhere = (kitrelocate.ElsewhereChild(ctx.staging, olds), olds)


def stop_background(ctx: Context) -> None:
    """The run's engine ends: what it started beside its steps is stopped (the scan of data
    files, when no swap took its result)."""
    _cancel_elsewhere(ctx)


def _cancel_elsewhere(ctx: Context) -> None:
    scan, ctx.elsewhere = ctx.elsewhere, None
    if scan is not None and hasattr(scan[0], "cancel"):
        scan[0].cancel()


def _report_elsewhere(ctx: Context, facts: dict) -> None:
    """What the scan begun at verify (or relocate) found: logged, counted in `facts`."""
    scan, ctx.elsewhere = ctx.elsewhere, None
    if scan is None:
        return
    found, why = scan[0].result()
    if why:
        ctx.log("the scan for data files that name %s did not finish: %s" % (ctx.old, why))
        return
    facts["elsewhere"] = len(found)
    if found:
        ctx.log("still naming %s outside bin/ (data, left as is): %s" % (ctx.old, ", ".join(found)))


def prove(ctx: Context) -> Result:
    """The staged interpreter runs here and knows where it is: bin/python -c 'sys.prefix' from
    the staging, within PROVE_TIMEOUT. A venv whose base interpreter this host lacks stops here,
    before anything is installed."""
    _require_lock(ctx)
    doc = _require(ctx, ("relocated",), "prove")
    python = os.path.join(ctx.staging, "bin", "python")
    try:
        prefix, version = interpreter_prefix(python, ctx.staging)
    except StepError as exc:
        raise StepError("%s; refused before the swap: nothing was installed" % exc,
                        lines=exc.lines) from None
    if os.path.realpath(prefix) != os.path.realpath(ctx.staging):
        raise StepError("the staged interpreter reports sys.prefix %s, not the staging %s"
                        % (prefix, ctx.staging))
    made = _cfg(ctx.staging, "version") or _cfg(ctx.staging, "version_info")
    if made and made.split(".")[:2] != version.split(".")[:2]:
        raise StepError("bin/python here is Python %s, the venv was made with %s (pyvenv.cfg): its "
                        "packages under lib/python%s are not seen; install Python %s here"
                        % (version, made, ".".join(made.split(".")[:2]),
                           ".".join(made.split(".")[:2])))
    _write_stamp(ctx, dict(doc, stage="proven"))
    return Result("bin/python %s runs from the staging" % version, {"python": version})


# the post-swap proof's hook: a console script's interpreter imports sitecustomize from
# PYTHONPATH at start-up (site), before the script; this one says where the interpreter runs
# from and ends it there, so no script's own code runs
EXEC_PROOF = "rb-exec-proof"
_PROOF_HOOK = (b"import os, sys\n"
               b"os.write(1, b'" + EXEC_PROOF.encode() + b" ' + os.fsencode(sys.prefix) + b'\\0'"
               b" + os.fsencode(sys.executable) + b'\\n')\n"
               b"os._exit(0)\n")


def _console_scripts(dest: str, rewritten: List[str]) -> List[Tuple[str, bytes]]:
    """(rel, header) for each executable regular file under bin/ that relocation rewrote, and
    bin/pip always: what the post-swap proof execs. `header`: the lines the kernel and the
    trampoline read to find the interpreter (the first two) when that is the venv's own python,
    else b"" (a script whose code would run if started)."""
    rels = sorted({r for r in rewritten if r.startswith("bin/") and r.count("/") == 1}
                  | {"bin/pip"})
    out = []
    for rel in rels:
        got = safefs.read_in(dest, rel, limit=1 << 24)
        if got is None or not got[1].st_mode & 0o111:
            continue
        head = got[0][:4096]
        own = kitrelocate.python_script(head, dest)
        out.append((rel, b"\n".join(head.split(b"\n", 2)[:2]) if own else b""))
    return out


def prove_scripts(dest: str, rewritten: List[str], timeout: float = PROVE_TIMEOUT
                  ) -> Tuple[List[str], List[str]]:
    """Exec the console scripts of `dest` through the kernel (their shebangs), at once: each
    whose interpreter is the venv's own python must report, through the hook above, sys.prefix
    == dest, and no code of the script runs. Scripts whose interpreter lines are the same bytes
    (every script in bin/, the same directory) start the same way: one of each such group is
    started for all (bin/pip always for itself). A bin/pip started otherwise (a wrapper) runs
    `--version`, which must name dest; other such scripts are not started. Returns (the scripts
    proven, the failures)."""
    groups: dict = {}
    for rel, head in _console_scripts(dest, rewritten):
        if head or rel == "bin/pip":
            groups.setdefault(head if rel != "bin/pip" else b"pip", []).append(rel)
    if not groups:
        return [], []
    runs = list(groups.values())
    results: List[Any] = [None] * len(runs)
    hook = tempfile.mkdtemp(prefix="rbkit-exec-proof.")     # 0700, this user's
    try:
        fd = os.open(os.path.join(hook, "sitecustomize.py"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_PROOF_HOOK)
        env = dict(child_env(), PYTHONPATH=hook, PYTHONDONTWRITEBYTECODE="1")

        def one(i: int) -> None:
            results[i] = run_quiet([os.path.join(dest, runs[i][0]), "--version"], timeout, env)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(runs))]
        width = max(1, min(16, os.cpu_count() or 1))
        for k in range(0, len(threads), width):
            for t in threads[k:k + width]:
                t.start()
            for t in threads[k:k + width]:
                t.join()
    finally:
        shutil.rmtree(hook, ignore_errors=True)
    real = os.path.realpath(dest)
    proven, failed = [], []
    for rels, (rc, out, err) in zip(runs, results):
        line = out.split("\n", 1)[0]
        if line.startswith(EXEC_PROOF + " "):
            prefix, _, exe = line[len(EXEC_PROOF) + 1:].partition("\0")
            # the interpreter in the venv's bin/, however reached (a trampoline beside
            # it runs it by its real path when dest is a link)
            ok = (rc == 0 and os.path.realpath(prefix) == real
                  and os.path.realpath(os.path.dirname(exe)) == os.path.join(real, "bin"))
            said = "sys.prefix %s, %s" % (prefix, exe)
        else:
            # no hook ran (not the venv's python, or one that skips site): what it printed
            ok = rc == 0 and dest + "/" in out
            said = out.strip() or err.strip() or "exit %s" % rc
        if ok:
            proven.extend(rels)
        else:
            same = " (and %d more with its interpreter lines: %s)" % (
                len(rels) - 1, ", ".join(rels[1:])) if len(rels) > 1 else ""
            failed.append("console script %s runs from the wrong place: %s%s"
                          % (rels[0], said, same))
    return sorted(proven), failed


def swap(ctx: Context) -> Result:
    """Put the proven staging at the destination in one rename, then prove it there: sys.prefix
    is the destination, and the console scripts start from it (prove_scripts). What was there is
    kept until the run ends (a backup with on_existing: backup, for good)."""
    _require_lock(ctx)
    doc = _require(ctx, ("proven",), "swap")
    transient = ctx.policy == "replace" and os.path.lexists(ctx.dest)
    ctx.critical += 1
    try:
        if transient:
            # replace: what was there waits as a backup (not pruned, not unshared) until the run
            # ends, for a rollback
            result = hostfs.swap(ctx.staging, ctx.dest, "backup", swap_atomic=ctx.swap_atomic,
                                 unshare=False)
        else:
            # keep_backups is applied once the new install passed its checks (prune_after_checks)
            result = hostfs.swap(ctx.staging, ctx.dest, ctx.policy, swap_atomic=ctx.swap_atomic)
        previous = result.get("previous")
        ctx.swapped = {"previous": previous, "transient": transient, "policy": ctx.policy}
        _write_stamp(ctx, None)
    finally:
        ctx.critical -= 1
    _record_install(ctx)
    kept = previous if previous not in (None, "none", "removed") and not transient else ""
    if result.get("previous_failed"):
        ctx.log("the previous destination had failed its checks: kept apart at %s (not a backup; "
                "replaced by the next failure)" % kept)
        kept = ""
    facts = {"previous": previous, "backup": kept, "atomic": int(bool(result.get("atomic", True)))}
    if result.get("note"):
        ctx.log(result["note"])
    prefix, version = interpreter_prefix(os.path.join(ctx.dest, "bin", "python"), ctx.dest)
    if os.path.realpath(prefix) != os.path.realpath(ctx.dest):
        raise StepError("the moved interpreter reports sys.prefix %s, expected %s"
                        % (prefix, ctx.dest), facts)
    facts["prefix"] = prefix
    proven, failed = prove_scripts(ctx.dest, list(doc.get("relocated") or {}))
    facts["scripts"] = len(proven)
    if failed:
        raise StepError(failed[0], facts, lines=failed)
    if proven:
        ctx.log("%d console scripts started from %s by their shebangs (sys.prefix there): %s%s"
                % (len(proven), ctx.dest, ", ".join(proven[:8]),
                   ", ..." if len(proven) > 8 else ""))
    _report_elsewhere(ctx, facts)
    if kept:
        ctx.log("the previous destination is kept at %s" % kept)
    what = "kept until the run ends (replace)" if transient else previous
    return Result("installed at %s; previous: %s" % (ctx.dest, what), facts)


def _record_install(ctx: Context) -> None:
    """The new install's record (hostfs.read_info): when, from which runbook and spec, the
    source's manifest fingerprint; its checks not run yet."""
    try:
        fingerprint = ctx.fingerprint()
    except (StepError, OSError, ValueError):
        fingerprint = ""
    hostfs.write_info(ctx.dest, installed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      origin=ctx.origin, source_fingerprint=fingerprint, checks="not run",
                      put_back_after=None, failed_install=None)


def prune_after_checks(ctx: Context) -> None:
    """keep_backups, applied once this run's new install proved itself (its checks passed, or
    the spec has none and its env file is written): an install that fails never evicts a good
    backup."""
    s = ctx.swapped
    if s is None or s.get("transient") or s.get("policy") != "backup" or not ctx.keep_backups:
        return
    for gone in hostfs.prune_backups(ctx.dest, ctx.keep_backups):
        ctx.log("removed an older backup (keep_backups: %s): %s (the new install passed its "
                "checks)" % (ctx.keep_backups, gone))


def exports(ctx: Context) -> Result:
    """The env file: VIRTUAL_ENV, CUDA_HOME, PATH, LD_LIBRARY_PATH with the venv's dirs first."""
    _require_lock(ctx)
    env = dict(item.split("=", 1) for item in ctx.env)
    text, summary = kitexports.render(ctx.dest, ctx.cuda_home, ctx.first, env, ctx.origin)
    if summary["missing_dirs"]:
        raise StepError("library dirs do not exist in the venv: %s"
                        % ", ".join(summary["missing_dirs"]), lines=summary["missing_dirs"])
    kitexports.write(ctx.env_out, text, venv=ctx.dest)
    ctx.log("env file %s; LD_LIBRARY_PATH: %s" % (ctx.env_out, (
        "the venv's %s first" % ":".join(summary["library_dirs"]) if summary["library_dirs"]
        else "unchanged (the venv has no library directory to put first)")))
    if not ctx.probe_config and ctx.swapped is not None:
        hostfs.write_info(ctx.dest, checks="none")
        prune_after_checks(ctx)
    return Result(ctx.env_out, {"file": ctx.env_out,
                                "library_dirs": len(summary["library_dirs"])})


ENV_COPY = "env.sh"     # in the state directory: what the checks source


def own_env_copy(ctx: Context) -> str:
    """The env file the checks source, as root: the install's own copy (DEST/.rb-env.sh, which
    exports wrote beside the public one), opened without following a link, a regular file of this
    user not writable by others, copied into this run's private state directory. Never the public
    env file by its name: that is in the destination's parent, where another user may swap it."""
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    got = safefs.read_in(ctx.dest, kitexports.IN_INSTALL, limit=1 << 20)
    if got is None:
        raise StepError("the install at %s holds no env file of its own (%s: missing, or not a "
                        "regular file): run the exports step again (--from exports)"
                        % (ctx.dest, kitexports.IN_INSTALL))
    data, st = got
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o022:
        raise StepError("refusing to source %s as %s: it is owned by %s, mode %04o (not written "
                        "by this kit); look at it, remove it and run the exports step again"
                        % (os.path.join(ctx.dest, kitexports.IN_INSTALL),
                           privacy.user_name(os.geteuid()), privacy.owner(st),
                           stat.S_IMODE(st.st_mode)))
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
        raise StepError("the install at %s is the previous one, put back after %s failed (the "
                        "failed install is kept at %s): checking it would not check what this spec "
                        "installs; run every step again" % (
                            ctx.dest, info["put_back_after"], info.get("failed_install", "-")),
                        {"put_back_after": info["put_back_after"]})
    own_env = own_env_copy(ctx)
    env = child_env()
    # the moved interpreter, isolated (rbrules.launch: the checks see the venv's own
    # site-packages and the env file's variables, never a PYTHON* variable or the working
    # directory), from /
    argv = (["bash", "-c", 'source "$1" && shift && exec "$@"', "rb", own_env]
            + launch.argv(os.path.join(ctx.dest, "bin", "python"), "rbprobes", site=True)
            + ["run", "--config-json", ctx.probe_config, "--report", report])
    if ctx.capture:
        rc, out, err = run_quiet(argv, ctx.timeout, env)
        ctx.log(err)
    else:
        # the checks' table goes to the runbook's log as it is printed
        rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=2, env=env, cwd="/",
                            timeout=ctx.timeout, check=False).returncode
        out = err = ""
    summary: dict = {}
    names: List[str] = []
    try:
        with open(report, encoding="utf-8") as f:
            doc = json.load(f)
        summary = doc.get("summary", {})
        names = [str((c.get("values") or {}).get("name") or c.get("id"))
                 for c in doc.get("checks", []) if c.get("status") == "fail"]
        # the checked packages' own warnings (rbprobes keeps them): the run's log only
        for warned in doc.get("warnings") or []:
            ctx.trace("a warning while the checks ran (from the checked packages): %s" % warned)
    except (OSError, ValueError, AttributeError):
        pass
    facts = {"report": report, "pass": summary.get("pass", 0), "skip": summary.get("skip", 0),
             "fail": summary.get("fail", 0)}
    detail = "%s passed, %s skipped, %s failed" % (facts["pass"], facts["skip"], facts["fail"])
    if rc != 0:
        ctx.failed_checks = ", ".join(names) or "the checks"
        hostfs.set_checks(ctx.dest, False, "checks failed: " + ctx.failed_checks)
        raise StepError("checks failed: " + detail if summary else
                        "the checks did not run (exit %s)" % rc, facts, tail(err or out), rc=rc)
    hostfs.set_checks(ctx.dest, True)
    prune_after_checks(ctx)
    return Result(detail, facts)


def rollback(ctx: Context, after: str = "") -> Result:
    """Put back what this run's swap replaced; the failed install is kept apart as
    `DEST.rb-failed` (removed under on_existing: replace), never as a backup. Nothing was there:
    the new install stays, without its manifest, so that no re-run takes it for a good install."""
    _require_lock(ctx)
    s = ctx.swapped
    if s is None:
        return Result("nothing to roll back: no swap in this run", status="skipped")
    previous = s["previous"]
    what = ctx.failed_checks if after == "probe" and ctx.failed_checks else \
        "step %s" % (after or "a step")
    ctx.critical += 1
    try:
        if previous in (None, "none", "removed"):
            ctx.swapped = None
            try:
                os.unlink(os.path.join(ctx.dest, INSTALLED))
            except FileNotFoundError:
                pass
            return Result("nothing was at %s before this run: the new install stays, without "
                          "its manifest (a re-run installs it again)" % ctx.dest)
        from_failed = previous == hostfs.failed_path(ctx.dest)
        number = None if from_failed else int(previous.rsplit(".", 1)[1])
        got = hostfs.restore(ctx.dest, number, env_file=ctx.env_out, swap_atomic=ctx.swap_atomic,
                             failed="%s failed after the swap (runbook rollback)" % what,
                             from_failed=from_failed)
        ctx.swapped = None
        kept: Optional[str] = got["kept_current_as"]
        if s["transient"]:
            remove_tree(kept)
            kept = None
        hostfs.write_info(ctx.dest, put_back_after=what, failed_install=kept or "removed")
    finally:
        ctx.critical -= 1
    where = "kept at %s" % kept if kept else "removed (on_existing: replace)"
    ctx.log("rolled back: %s failed; the previous install is at %s again; the failed one is %s"
            % (what, ctx.dest, where))
    return Result("rolled back: %s failed; failed install %s" % (what, where),
                  {"restored": previous, "kept_current_as": kept, "rolled_back": 1})


def restore(ctx: Context, number: Optional[int] = None) -> Result:
    """`--restore [N]`: backup N (default: the newest whose checks passed) back at the
    destination; says which and why, and what is in place now. The runbook runs the checks on it
    next (probe)."""
    _require_lock(ctx)
    ctx.critical += 1
    try:
        result = hostfs.restore(ctx.dest, number, env_file=ctx.env_out,
                                swap_atomic=ctx.swap_atomic)
        if os.path.isdir(ctx.dest):
            # chosen by hand: the checks that follow are this install's, not a stale spec's
            hostfs.write_info(ctx.dest, put_back_after=None, failed_install=None)
    finally:
        ctx.critical -= 1
    for why in result.get("ignored") or []:
        ctx.log("ignored: " + why)
    now = result.get("installed") or {}
    if now:
        ctx.log("in place now: %s" % _describe(now))
    if result["restored"] is None:
        return Result("nothing restored: %s" % result["why"], {"restored": "", "kept_current_as": ""})
    if result["kept_current_as"] is None:
        then = "nothing was in place"
    elif result.get("kept_failed"):
        then = ("the install that was in place failed its checks: kept apart at %s"
                % result["kept_current_as"])
    else:
        then = "the install that was in place is now %s" % result["kept_current_as"]
    skipped = "; ".join(result.get("skipped") or []) or "none"
    return Result("restored %s: %s (skipped: %s); %s"
                  % (result["restored"], result["why"], skipped, then),
                  {"restored": result["restored"], "kept_current_as": result["kept_current_as"] or ""})


def _describe(doc: dict) -> str:
    """An install's record and stat check in words (describe_install's dict)."""
    info = doc.get("info") or {}
    parts = ["%s made %s by %s" % (doc.get("path"), info.get("installed", "at an unknown time"),
                                   info.get("origin", "an unknown run"))]
    fp = info.get("source_fingerprint") or doc.get("source_fingerprint")
    parts.append("source %s" % (fp[:16] if fp else "unknown"))
    parts.append("checks %s" % ("failed: " + doc["failed"] if doc.get("failed")
                                else info.get("checks", "not recorded")))
    check = doc.get("tree_check") or {}
    if check.get("ok") is True:
        parts.append("its files are as installed (stat check against its manifest)")
    elif check.get("ok") is False:
        changed = check.get("changed") or check.get("missing") or []
        parts.append("changed since installed: %s" % (", ".join(changed[:8]) if changed
                                                       else check.get("why", "see its manifest")))
    else:
        parts.append(check.get("why", "no stat check"))
    return "; ".join(parts)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%d B" % n


def list_backups(ctx: Context) -> Result:
    """`--list-backups`: each backup of the destination, the failed install kept apart and the
    one in place: when it was installed, by which runbook and spec, the source's fingerprint,
    its checks, its size."""
    rows = hostfs.list_installs(ctx.dest)
    ctx.log("installs of %s (keep_backups: %s counts the backups whose checks passed):"
            % (ctx.dest, ctx.keep_backups or "-"))
    table = []
    for row in rows:
        info = row["info"]
        checks = "failed" if row["failed"] else info.get("checks", "unknown").split(":")[0]
        label = ("backup %d" % row["number"]) if row["kind"] == "backup" else row["kind"]
        fp = info.get("source_fingerprint") or ""
        table.append((label, info.get("installed", "-"), checks, _size(row["size"]),
                      "source " + (fp[:12] or "-"), info.get("origin", "-"), row["path"]))
    widths = [max(len(r[i]) for r in table) for i in range(6)] if table else []
    for r, row in zip(table, rows):
        ctx.log("  " + "  ".join(r[i].ljust(widths[i]) for i in range(6)) + "  " + r[6])
        if row["failed"]:
            ctx.log("      why: %s" % row["failed"])
        if row["info"].get("put_back_after"):
            ctx.log("      put back after %s failed (the failed install: %s)"
                    % (row["info"]["put_back_after"], row["info"].get("failed_install", "-")))
    if not rows:
        ctx.log("  nothing there yet")
    n = sum(1 for r in rows if r["kind"] == "backup")
    good = sum(1 for r in rows if r["kind"] == "backup" and not r["failed"])
    return Result("%d backups (%d whose checks did not fail)%s" % (
        n, good, "; a failed install kept apart" if any(r["kind"] == "failed" for r in rows)
        else ""), {"backups": n, "good": good})


# -- children ------------------------------------------------------------------------------------


def interpreter_prefix(python: str, root: str) -> tuple:
    """(sys.prefix, version) that `python` reports; fails naming what is missing."""
    if not os.path.lexists(python):
        raise StepError("%s has no bin/python: not a venv" % root)
    if not os.path.exists(python):
        target = os.readlink(python) if os.path.islink(python) else python
        raise StepError("bin/python -> %s: that interpreter does not exist on this host (the "
                        "venv's base interpreter%s must be installed here)" % (target, _home(root)))
    rc, out, err = run_quiet([python, "-I", "-B", "-c",
                              "import sys; print(sys.prefix); print(sys.version.split()[0])"],
                             PROVE_TIMEOUT)
    lines = out.splitlines()
    if rc != 0 or len(lines) < 2:
        raise StepError("%s does not run here (exit %s): %s" % (python, rc, " | ".join(
            tail(err or out, 3)) or "no output"), lines=tail(err or out))
    return lines[0], lines[1]


def _home(root: str) -> str:
    home = _cfg(root, "home")
    return ", pyvenv.cfg home = %s" % home if home else ""


def _cfg(root: str, key: str) -> str:
    """A value of the venv's pyvenv.cfg ('' when not there; a link there is not followed)."""
    try:
        got = safefs.read_in(root, "pyvenv.cfg", limit=1 << 20)
    except OSError:
        return ""
    for line in (got[0] if got else b"").decode("utf-8", "replace").splitlines():
        k, _, value = line.partition("=")
        if k.strip() == key:
            return value.strip()
    return ""
