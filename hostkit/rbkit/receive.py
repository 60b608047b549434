"""The stream's receiving end: `receive` unpacks the tar stream into this run's staging, hashing
each file as the stream carries it, and keeps those digests (RECEIVED, in the state directory) for
verify (proof.py).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, List, Optional

from . import hostfs
from . import tarstream
from .stream import COMPRESSION, TAR_RECORD, Progress, pipeline, tail
from .runner import (RECEIVED, KEPT, jobs, StepError, Result, Context, read_stamp, _identity,
                     write_file)


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
    # the spec's digest: the source's manifest is made with it, verify compares the two
    algo = ctx.choices.verify
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
        n = jobs(ctx.choices.jobs)
        if ctx.part is not None:
            n = max(1, n // ctx.part[1])     # several streams: the cores shared among them
        digester = tarstream.Digester(algo, min(8, n - 1) if n > 2 else 0)
        argvs.append(digester.stage)
        names.append("digest reader")
    # never a setuid, setgid, sticky or world-write bit made (as root, --no-same-owner alone keeps
    # them): umask 002 and --no-same-permissions, unless the spec keeps them (special_modes: keep)
    keep = ctx.choices.special_modes == "keep"
    argvs.append(["tar", "-C", ctx.staging, *TAR_RECORD, "-xf", "-", "--no-same-owner"]
                 + ([] if keep else ["--no-same-permissions"]))
    names.append("tar")
    watch = Progress(*ctx.progress) if ctx.progress else None
    codes, errs = pipeline(argvs, ctx.choices.timeout, capture=ctx.capture,
                           umask=None if keep else 0o002,
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
