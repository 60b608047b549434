"""The engine's runner: the steps' Context (what the steps of one run share), Result and StepError,
`run` (times one step and emits its event), the errno words, and the run's private state with its
stamp (see engine.py for the steps and the event).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pwd
import stat
import subprocess
import time
import traceback
from typing import Any, Callable, List, Optional, Tuple

from rbrules import cpus, paths, proven
from rbrules.choices import Choices

from . import installs, manifestfile, safefs

STAMP = "stamp.json"
RECEIVED = "received.json"  # what receive saw in the stream: each file's digest, and its inode
# (received.I.json: stream I's, when several streams ran)
BEFORE = {"relocate": "verify", "prove": "relocate", "swap": "prove"}  # what each stamp needs
INCOMPLETE = ".incomplete"  # beside the staging (STAGING.incomplete): what arrived of a stream
# that did not end in a verified staging, and the source it was for
KEPT = "received.kept.json"  # resume: the kept files' digests, as RECEIVED's, for verify


def staging_path(dest: str) -> str:
    """`.<name>.rb-staging` beside the destination: rbrules.paths.staging, the one rule."""
    return paths.staging(dest)


def jobs(value: Any) -> int:
    """--jobs N, or auto: one per CPU this process may use (rbrules.cpus: its affinity and its
    cgroup's quota), at most 32."""
    return cpus.jobs(value)


class StepError(Exception):
    """A step failed: the message is the event's detail; `lines` what it listed (missing files)."""

    def __init__(
        self,
        message: str,
        facts: Optional[dict] = None,
        lines: Optional[List[str]] = None,
        rc: int = 1,
    ) -> None:
        super().__init__(message)
        self.facts = facts or {}
        self.lines = lines or []
        self.rc = rc


class Result:
    def __init__(self, detail: str = "", facts: Optional[dict] = None, status: str = "ok") -> None:
        self.detail, self.facts, self.status = detail, facts or {}, status


class Context:
    """What the steps of one run share: the destination, the spec's choices (`choices`, read from
    the runbook's document: choices.py) and the facts of this run (`old`: the source's path as it
    was there; `manifest`: the source's manifest on this host; `compression`: what the stream
    uses; `probe_config`: the checks' document; `state`: the private state directory), and what
    the run learned so far (the up-to-date verdict, what the swap did, files never to link).
    `emit` receives every event; `log` every human line (the runbook's stderr, or a node's
    report); `capture`: children's output is collected (a node) instead of passed through."""

    def __init__(
        self,
        dest: str,
        choices: Optional[Choices] = None,
        *,
        old: str = "",
        manifest: str = "",
        compression: str = "none",
        probe_config: str = "",
        state: str = "",
        capture: bool = False,
        emit: Optional[Callable[[dict], None]] = None,
        log: Optional[Callable[[str], None]] = None,
        trace: Optional[Callable[[str], None]] = None,
    ) -> None:
        self.dest = os.path.abspath(dest)
        self.staging = staging_path(self.dest)
        self.choices = choices or Choices()
        self.old, self.manifest, self.compression = old, manifest, compression
        self.probe_config, self.state, self.capture = probe_config, state, capture
        self.env_out = paths.env_file(self.dest, self.choices.env_file)
        self.emit = emit or (lambda event: None)
        self.log = log or (lambda line: None)
        # where a failure's traceback goes: the run's log file only, never the terminal
        self.trace = trace or self.log
        # receive only: (every so many seconds, where to) the bytes of the stream its tar has
        # read so far; which stream of how many this one is (rbkit send --part I/N), None: the one
        self.progress: Optional[Tuple[float, Callable[[int], None]]] = None
        self.part: Optional[Tuple[int, int]] = None
        self.locked = False
        self.events: List[dict] = []
        self.up_to_date: Optional[str] = None  # why the destination already holds the tree
        self.unlinkable: set = set()  # failed the digest check: sent, never linked
        self.swapped: Optional[dict] = None  # this run's swap, until rolled back or finished
        self.failed_checks = ""  # the checks that failed, named (probe)
        self.critical = 0  # inside a rename sequence: signals wait
        self.elsewhere: Any = None  # (the scan of data files, its prefixes)
        self.early: Any = None  # the quick check's walk, begun at the lock
        self._manifest_cache: Optional[tuple] = None
        self._installed_cache: Optional[tuple] = None  # (stat key, the install's manifest)
        self.linked_inodes: Optional[tuple] = None  # (staging identity, what stage linked)

    def new_manifest(self) -> dict:
        """The source's manifest for this run (loaded once per version of the file)."""
        if not self.manifest:
            raise StepError("no source manifest was given to the engine")
        try:
            st = os.stat(self.manifest)
        except OSError as exc:
            raise StepError(
                "the source's manifest %s is not here (%s): run the manifest step "
                "first" % (self.manifest, exc.strerror)
            ) from None
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if self._manifest_cache is None or self._manifest_cache[0] != key:
            doc, fp = manifestfile.load_fingerprinted(self.manifest)
            self._manifest_cache = (key, doc, fp)
        return self._manifest_cache[1]

    def fingerprint(self) -> str:
        self.new_manifest()
        return self._manifest_cache[2]

    def wrote_manifest(self, doc: dict, fp: str) -> None:
        """`doc` (fingerprint `fp`) was just written to self.manifest: kept without reading it."""
        st = os.stat(self.manifest)
        self._manifest_cache = ((st.st_mtime_ns, st.st_size, st.st_ino), doc, fp)

    def installed(self) -> dict:
        """The current install's manifest (raises OSError, ValueError), read once per version of
        the file: the quick check's read (EarlyCheck) serves the stage that follows it. An
        install not proven ours (installs.why_not_ours_install) has none to trust: ValueError."""
        why = installs.why_not_ours_install(self.dest)
        if why:
            raise ValueError("the install at %s is not proven ours: %s" % (self.dest, why))
        key, doc = load_keyed(
            os.path.join(self.dest, paths.INSTALLED_MANIFEST), self._installed_cache
        )
        self.keep_installed(key, doc)
        return doc

    def keep_installed(self, key: Optional[tuple], doc: Optional[dict]) -> None:
        """Keep `doc`, read from the install's manifest while it had stat `key` (_file_key), for
        `installed`; nothing is kept without both."""
        self._installed_cache = (key, doc) if key is not None and doc is not None else None


def _file_key(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def load_keyed(path: str, cache: Optional[tuple]) -> Tuple[Optional[tuple], dict]:
    """(stat key, manifest at `path`): `cache`'s manifest when the file has its key still; the
    key is None when the file changed while it was read (nothing to keep)."""
    key = _file_key(path)
    if cache is not None and cache[0] == key:
        return key, cache[1]
    mf = manifestfile.load(path)
    return (key if _file_key(path) == key else None), mf


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
    except Exception as exc:  # a bug of the kit: the step fails, the run reports it
        status, detail, facts = (
            "failed",
            (
                "the engine's %s step stopped on an error of its own (a bug of the kit: the "
                "traceback is in the run's log)" % step
            ),
            {"rc": 1},
        )
        _trace(ctx, step, exc)
    event = {
        "step": step,
        "status": status,
        "detail": detail,
        "facts": facts,
        "duration_s": round(time.monotonic() - start, 3),
    }
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
        return str(exc)  # raised by the kit with its own words (no errno): as it is
    if exc.filename is None and exc.strerror:
        return exc.strerror  # the kit's words with an errno (swapfs), or the system's alone
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


# -- the private state and the stamp -------------------------------------------------------------


def make_state(parent: Optional[str] = None) -> str:
    """This run's private state directory (mkdtemp: 0700, ours, where no other user can rename
    it: rbrules.proven.fresh_dir)."""
    return proven.fresh_dir("rbengine.", parent)


def _stamp_path(ctx: Context) -> str:
    if not ctx.state:
        raise StepError("the engine has no private state directory")
    return os.path.join(ctx.state, STAMP)


def read_stamp(ctx: Context) -> Optional[dict]:
    try:
        with open(_stamp_path(ctx), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def write_stamp(ctx: Context, doc: Optional[dict]) -> None:
    path = _stamp_path(ctx)
    if doc is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    write_file(path, json.dumps(doc, sort_keys=True).encode(), 0o600)


def identity_of(path: str) -> List[int]:
    """(st_dev, st_ino) of a staging directory; a symlink or a file there is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        # (no_staging: the runbook says what to run instead of a --from that cannot apply)
        raise StepError("the staging %s does not exist" % path, {"no_staging": 1}) from None
    if not stat.S_ISDIR(st.st_mode):
        raise StepError(
            "the staging %s is not a directory (a symlink or a file is never followed)" % path
        )
    return [st.st_dev, st.st_ino]


def require_stamp(ctx: Context, want: tuple, step: str) -> dict:
    """The stamp, when it says the staging went through `want` in this run and is still the same
    directory with the same manifest; else the step is refused."""
    doc = read_stamp(ctx)
    if doc is None and not os.path.lexists(ctx.staging):
        raise StepError(
            "refusing to %s: there is no staging at %s" % (step, ctx.staging), {"no_staging": 1}
        )
    if doc is None or doc.get("stage") not in ("verified", "relocated", "proven"):
        raise StepError(
            "refusing to %s: the staging %s was not verified in this run (a verify that failed, "
            "or one in an earlier run, leaves nothing to install); run again --from verify, or "
            "the whole runbook" % (step, ctx.staging)
        )
    if doc.get("stage") not in want:
        raise StepError(
            "refusing to %s: %s must pass first, in this run (the staging is %s)"
            % (step, BEFORE[step], doc.get("stage"))
        )
    if identity_of(ctx.staging) != doc.get("identity"):
        raise StepError(
            "refusing to %s: %s is not the staging directory this run verified "
            "(it was replaced since: another run?)" % (step, ctx.staging)
        )
    if doc.get("fingerprint") != ctx.fingerprint():
        raise StepError("refusing to %s: the staging was verified against another manifest" % step)
    for rel, digest in sorted(doc.get("relocated", {}).items()):
        if sha256_file(os.path.join(ctx.staging, rel)) != digest:
            raise StepError(
                "refusing to %s: %s changed in the staging after relocation" % (step, rel)
            )
    return doc


def require_lock(ctx: Context) -> None:
    if not ctx.locked:
        raise StepError("the engine does not hold the destination's lock (a bug)")


def sha256_file(path: str) -> Optional[str]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    digester = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digester.update(block)
    return digester.hexdigest()


def write_file(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write `path` whole: a new temp file beside it (O_EXCL, O_NOFOLLOW), then one rename
    (safefs.write_file: a link at `path` is replaced, never written through)."""
    safefs.write_file(path, data, mode)


def remove_tree(path: str) -> None:
    """Remove a tree we made or replaced, if it is there (installs.remove: a link is removed, never
    followed)."""
    if os.path.lexists(path):
        installs.remove(path)
