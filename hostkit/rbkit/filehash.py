"""Files' digests, as a manifest records them: one file's (`digest`, through a link never), and
many files' in parallel (`digests`: forked workers where this process has no threads, else
threads). Its callers import it as rbkit.filehash (filehash.digest, filehash.digests, ...).
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from typing import Any, Callable, Optional

from rbprobes import workers

CHUNK = 1 << 20


def hasher(algo: str) -> Callable[[], Any]:
    """A function making a new hash of `algo` (blake2b: 32 bytes; hashlib's named constructors
    are faster than hashlib.new)."""
    if algo == "blake2b":
        return functools.partial(hashlib.blake2b, digest_size=32)
    return getattr(hashlib, algo, None) or functools.partial(hashlib.new, algo)


class Changed(ValueError):
    """A file read for its digest did not have the size the walk (or the scan) saw: the source
    changed while it was being moved."""


def digest(
    path: str, algo: str, buf: Optional[bytearray] = None, size: Optional[int] = None
) -> str:
    """The file's digest; a link at `path` (made after the walk saw a file) is an error, not a
    path to another file. `buf`: a buffer of CHUNK bytes to read into (one per thread: no new
    1 MiB object, and no fresh pages, each read). `size`: what the walk saw; other than the bytes
    read, Changed is raised (the digest would not be of the entry's file)."""
    digester = hasher(algo)()
    if buf is None:
        buf = bytearray(CHUNK)
    view = memoryview(buf)
    total = 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    try:
        # os.readv on the fd, no file object a file: less CPU for the many small files of a venv
        # (the lab's figures: docs/benchmarks.md)
        while True:
            count = os.readv(fd, [buf])
            if not count:
                break
            total += count
            digester.update(view[:count])
    finally:
        os.close(fd)
    if size is not None and total != size:
        raise Changed(
            "%s: %d bytes read, %d when the tree was walked: it changed while being "
            "moved (stop what writes to the source, then run again)" % (path, total, size)
        )
    return digester.hexdigest()


def digests(root: str, rels: list, algo: str, jobs: int, sizes: Optional[list] = None) -> list:
    """digest() of each of `rels` (paths under `root`; `sizes`: each one's size as walked), in
    their order. Where this process has no threads, by `jobs` forked workers taking the biggest
    files first (_digests_forked): threads of one Python hash at one thread's pace, processes at
    one each. Else by `jobs` threads that take the next path from one shared iterator (no task
    object nor wake-up per file, which a thread pool's per-file futures cost). The figures:
    docs/benchmarks.md, "Figures behind choices in the code". The first error (in the order of
    `rels`) is raised once every worker stopped."""
    jobs_used = max(1, min(jobs, len(rels)))
    if jobs_used > 1 and workers.forkable():
        return _digests_forked(root, rels, algo, jobs_used, sizes)
    out: list = [None] * len(rels)
    todo = iter(enumerate(rels))
    errors: list = []

    def work() -> None:
        buf = bytearray(CHUNK)
        # errors looked at before a path is taken, never after: a path taken is hashed, so every
        # path before the first one that failed is (its error, if any, is the one raised)
        while not errors:
            try:
                index, rel = next(todo)  # a list iterator's next() is one step under the GIL
            except StopIteration:
                return
            try:
                out[index] = digest(
                    os.path.join(root, rel), algo, buf, None if sizes is None else sizes[index]
                )
            except BaseException as exc:  # re-raised below, in the caller
                errors.append((index, exc))
                return

    if jobs_used == 1:
        work()
    else:
        threads = [threading.Thread(target=work, daemon=True) for _ in range(jobs_used)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]
    return out


def _digests_forked(root: str, rels: list, algo: str, jobs: int, sizes: Optional[list]) -> list:
    """digests() by forked workers (rbprobes.workers.over_workers), the biggest files first: a file
    a worker could not hash (or that no worker answered for) is hashed here again, in order, so
    that the first error is raised here as the threads' is."""
    buf = bytearray(CHUNK)

    def fn(index: int) -> Optional[str]:
        try:
            return digest(
                os.path.join(root, rels[index]), algo, buf, None if sizes is None else sizes[index]
            )
        except Exception:
            return None

    got, _workers = workers.over_workers(
        fn, list(sizes) if sizes is not None else [0] * len(rels), jobs
    )
    for index, hexdigest in enumerate(got):
        if hexdigest is None:
            got[index] = digest(
                os.path.join(root, rels[index]), algo, buf, None if sizes is None else sizes[index]
            )
    return got
