"""The stream's receiving end: `receive` unpacks the tar stream into this run's staging, hashing
each file as the stream carries it, and keeps those digests (RECEIVED, in the state directory) for
verify (proof.py).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import Any, Dict, List, Optional

from rbrules.compression import compression
from rbrules.streams import TAR_RECORD
from rbrules.units import human

from . import hostfs, tarstream
from .runner import (
    KEPT,
    RECEIVED,
    Context,
    Result,
    StepError,
    identity_of,
    jobs,
    read_stamp,
    write_file,
)
from .stream import Progress, exit_words, pipeline, tail


def receive(ctx: Context, producer: Optional[List[str]] = None, need: int = 0) -> Result:
    """Unpack a tar stream into this run's staging: from stdin (the far end of the runbook's
    pipeline), or from `producer`'s output (a fan-out node reading its bundle). A reader between
    the decompressor and tar (tarstream.Digester) hashes each file as the stream carries it; when
    tar is done, the digests and each file's inode and ctime as tar left it go into the state
    directory (RECEIVED), for verify. A stream that is not a whole tar archive (truncated, a bad
    header) fails here, whatever tar says.

    What the tools say on stderr is shown capped (said_capped: the first lines, then how many
    more are in the run's log). A file system that filled is said as such (no_space: where, what
    is free, what is still to come of `need`, the bytes the whole staging holds once every stream
    arrived), not as tar's exit status (issue 45)."""
    doc = read_stamp(ctx)
    if doc is None or doc.get("stage") != "staged" or identity_of(ctx.staging) != doc["identity"]:
        raise StepError(
            "refusing to receive: %s is not the staging this run's stage step made" % ctx.staging
        )
    forget_received(ctx)
    # the spec's digest: the source's manifest is made with it, verify compares the two
    algo = ctx.choices.verify
    table = compression(ctx.compression)
    argvs: List[Any] = []
    names: List[str] = []
    if producer:
        argvs.append(producer)
        names.append("read")
    # the decompressor's stage, its bytes read wanted (pipeline's read_by): the packed stream
    unpack_at = len(argvs) if table["unpack"] else -1
    read_by: Dict[int, int] = {unpack_at: 0} if table["unpack"] else {}
    if table["unpack"]:
        argvs.append(table["unpack"])
        names.append(table["tool"])
    digester = None
    if algo != "none":
        # hashing threads for big files: the cores tar and the decompressor leave; none on two
        # (tarstream: there each hand-over costs more than the thread gives)
        cores = jobs(ctx.choices.jobs)
        if ctx.part is not None:
            cores = max(1, cores // ctx.part[1])  # several streams: the cores shared among them
        digester = tarstream.Digester(algo, min(8, cores - 1) if cores > 2 else 0)
        argvs.append(digester.stage)
        names.append("digest reader")
    # never a setuid, setgid, sticky or world-write bit made (as root, --no-same-owner alone keeps
    # them): umask 002 and --no-same-permissions, unless the spec keeps them (special_modes: keep)
    keep = ctx.choices.special_modes == "keep"
    argvs.append(
        ["tar", "-C", ctx.staging, *TAR_RECORD, "-xf", "-", "--no-same-owner"]
        + ([] if keep else ["--no-same-permissions"])
    )
    names.append("tar")
    watch = Progress(*ctx.progress) if ctx.progress else None
    codes, errs = pipeline(
        argvs,
        ctx.choices.timeout,
        capture=True,
        umask=None if keep else 0o002,
        started=watch.start if watch else None,
        read_by=read_by,
    )
    if watch is not None:
        watch.stop(digester.off if digester is not None else None)
    if len(errs) == len(names):  # one text a stage (an inline stage's is empty)
        for stage, text in zip(names, errs):
            said_capped(ctx, stage, text or "")
    else:  # a stage that could not start: said first
        said_capped(ctx, "the receiving end", "\n".join(e for e in errs if e))
    bad = ["%s %s" % (n, exit_words(c)) for n, c in zip(names, codes) if c != 0]
    broken = ""
    if digester is not None:
        digester.close()
        if digester.corrupt:
            broken = "the stream is not a good tar archive: %s" % digester.corrupt
        elif digester.truncated:
            broken = (
                "the stream ended at byte %d, before the end of the tar archive (cut short "
                "on the way?)" % digester.off
            )
    if bad or broken:
        full = no_space(ctx.staging, "\n".join(e for e in errs if e), need)
        if full is not None:
            raise StepError(
                full.pop("words"),
                dict(full, no_space=1),
                lines=tail("\n".join(e for e in errs if e), 3),
                rc=next((c for c in codes if c > 0), 1),
            )
        raise StepError(
            "unpacking into %s failed: %s"
            % (ctx.staging, "; ".join(bad + ([broken] if broken else []))),
            lines=tail("\n".join(e for e in errs if e)),
            rc=next((c for c in codes if c != 0), 1),
        )
    facts: dict = {"staging": ctx.staging}
    if digester is not None:
        facts["stream_bytes"] = digester.off  # what this end read of the tar stream
    if unpack_at in read_by:
        facts["packed_bytes"] = read_by[unpack_at]  # what came on the wire (report.moved_words)
    if ctx.choices.special_modes == "strip":
        # several streams: each strips the whole staging once its own tar is done (what another
        # stream's tar still writes, that stream strips)
        stripped = hostfs.strip_special(ctx.staging, racing=ctx.part is not None)
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


SHOWN_LINES = 3  # a tool's stderr lines on the terminal; every line goes to the run's log


def said_capped(ctx: Context, tool: str, text: str) -> None:
    """What `tool` said on stderr: its first SHOWN_LINES lines on the terminal (the engine's
    log, indented under its step), then how many more there are; every line into the run's log
    only (`log` lines). A disk that fills makes tar say one line a file (1,001 of a 1,032-line
    terminal, issue 45)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return
    for line in lines[:SHOWN_LINES]:
        ctx.log(line)
    if len(lines) > SHOWN_LINES:
        ctx.log(
            "(%d more lines of %s's in the run's log, run.log)" % (len(lines) - SHOWN_LINES, tool)
        )
        ctx.trace("%s said (every line):\n%s" % (tool, "\n".join(lines)))


def filesystem_of(path: str) -> tuple:
    """(mount point, file system type) of the file system that holds `path`: the longest mount
    point of /proc/self/mountinfo above it; (the nearest existing directory, "?") where that
    cannot be read."""
    probe = os.path.realpath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    best = (probe, "?")
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return best
    length = -1
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or not rest:
            continue
        mount = fields[4].replace("\\040", " ").replace("\\011", "\t")
        inside = probe == mount or probe.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= length:
            best, length = (mount, rest[0]), len(mount)
    return best


def staged_bytes(root: str) -> tuple:
    """(files, bytes, bytes on disk) of the regular files below `root` (a staging), links never
    followed; an entry gone while walked (another stream's) is left out."""
    from . import statwalk

    files = size = disk = 0
    try:
        for _rel, st in statwalk.walk(root, ordered=False, gone_ok=True):
            if stat.S_ISREG(st.st_mode):
                files += 1
                size += st.st_size
                disk += st.st_blocks * 512
    except OSError:
        pass
    return files, size, disk


def no_space(staging: str, said: str, need: int) -> Optional[dict]:
    """When the file system of `staging` filled (the tools said ENOSPC or EDQUOT, or it has no
    block or no inode left for this user): where it is, what is free, and what is still to come
    of `need`, in words (`words`) and as facts; else None."""
    try:
        st = os.statvfs(staging)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    quota = os.strerror(errno.EDQUOT) in said
    full = os.strerror(errno.ENOSPC) in said or quota or st.f_favail == 0 or free < 2 * st.f_frsize
    if not full:
        return None
    mount, kind = filesystem_of(staging)
    files, size, _disk = staged_bytes(staging)
    words = "the file system of the staging, %s (%s), is %s: %s free of %s" % (
        mount,
        kind,
        "at its quota for this user" if quota else "full",
        human(free),
        human(st.f_blocks * st.f_frsize),
    )
    if st.f_favail == 0:
        words += ", and no inode left of %d" % st.f_files
    more = max(0, need - size) if need else 0
    if need:
        words += "; %s more needed to finish (%s of %s staged, %d files)" % (
            human(more),
            human(size),
            human(need),
            files,
        )
    return {
        "words": words,
        "fs_mount": mount,
        "fs_type": kind,
        "free_bytes": free,
        "need_more": more,
        "staged_bytes": size,
        "staged_files": files,
        "quota": int(quota),
        "no_inodes": int(st.f_favail == 0),
    }


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
    return [
        os.path.join(ctx.state, n)
        for n in sorted(names)
        if n in (RECEIVED, KEPT) or _PART_RECEIVED.match(n)
    ]


_PART_RECEIVED = re.compile(r"received\.[0-9]+\.json\Z")


def forget_received(ctx: Context, every: bool = False) -> None:
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
    doc = {"algo": algo, "identity": identity_of(ctx.staging), "files": files}
    write_file(_received_path(ctx), json.dumps(doc, separators=(",", ":")).encode(), 0o600)
    return len(files)


def load_received(ctx: Context, identity: List[int], algo: str) -> Optional[dict]:
    """The files receive hashed from the stream, or from each of the streams, into this staging
    (None: no record; a record of another staging or algorithm counts as none: those files are
    read)."""
    files: Optional[dict] = None
    for path in _received_paths(ctx):
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("identity") != identity or doc.get("algo") != algo:
            continue
        got = doc.get("files") or {}
        if files is None:
            files = got
        else:
            files.update(got)
    return files
