"""Walks of big trees by child Pythons: the parent lists the tree and hands its entries out in
chunks; each child (`python -S -m rbkit SUBCOMMAND ...`) takes the lstat of its chunks' entries
and answers its part (the source's scan: hostfs.scan; the staging's verify: manifest.verify).
The parent puts the parts together in order, and takes itself any chunk no child answered for,
so the result is always the one of a single walk; the children only save time.

Chunks go to the children in turn, on their stdin: a 4-byte number, a 4-byte length and the
marshal of the chunk (plain data only). A child answers {number: part} (marshal) on stdout,
into a temporary file, when its stdin closes. A child that cannot start, dies or answers what
does not load answers nothing.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import marshal
import os
import struct
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional

JOBS_MAX = 6
CHUNK = 2048                      # entries per chunk


def jobs() -> int:
    """How many children: RBKIT_WALK_JOBS when set (0 or 1: none), else half the usable cores
    on a host of 4 or more (at most JOBS_MAX), else none."""
    forced = os.environ.get("RBKIT_WALK_JOBS", "")
    if forced.isdigit():
        return int(forced)
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(cores // 2, JOBS_MAX) if cores >= 4 else 0


class Workers:
    """`n` children running `python -S -m rbkit ARGS...` (this interpreter, this kit), started
    at once; give() hands them chunks in turn, take() their answers."""

    def __init__(self, args: List[str], n: int) -> None:
        self.answered = 0
        self._procs: List[tuple] = []
        self._dead: set = set()
        kit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME")}
        env.update(PYTHONPATH=kit, PYTHONDONTWRITEBYTECODE="1")
        argv = [sys.executable, "-S", "-m", "rbkit"] + list(args)
        for _ in range(n):
            out = tempfile.TemporaryFile()
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out,
                                        stderr=subprocess.DEVNULL, cwd="/", env=env)
            except OSError:
                out.close()
                break
            self._procs.append((proc, out))

    def give(self, number: int, chunk: Any) -> None:
        if not self._procs:
            return
        k = number % len(self._procs)
        if k in self._dead:
            return                                   # taken by the parent, in the end
        data = marshal.dumps(chunk)
        try:
            stdin = self._procs[k][0].stdin
            stdin.write(struct.pack("<II", number, len(data)) + data)
            stdin.flush()                            # the child starts on it now
        except OSError:
            self._dead.add(k)

    def take(self, timeout: float = 600.0) -> Dict[int, Any]:
        """{chunk number: part} of every child that exited 0 with an answer that loads."""
        got: Dict[int, Any] = {}
        for k, (proc, out) in enumerate(self._procs):
            try:
                proc.stdin.close()
            except OSError:
                self._dead.add(k)
            try:
                rc = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                continue
            out.seek(0)
            try:
                answer = marshal.loads(out.read()) if rc == 0 and k not in self._dead else None
            except (ValueError, EOFError, TypeError):
                answer = None
            if isinstance(answer, dict):
                got.update(answer)
                self.answered += 1
        return got

    def close(self) -> None:
        for proc, out in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            try:
                proc.stdin.close()
            except OSError:
                pass
            out.close()


def split(items, size: Optional[int] = None):
    """The items in lists of `size` (default CHUNK), the last one shorter."""
    size = size or CHUNK
    pending: List[Any] = []
    for item in items:
        pending.append(item)
        if len(pending) == size:
            yield pending
            pending = []
    if pending:
        yield pending


def by_children(chunks_of, args: List[str], n: int, here: Callable[[Any], Any]
                ) -> tuple:
    """([part of each chunk, in order], children that answered). `chunks_of` yields the
    chunks (as the parent lists them); once there are two, `n` children are started and every
    chunk but the last goes to them; `here(chunk)` takes the last one, and any one no child
    answered for, in this process."""
    chunks: List[Any] = []
    workers: Optional[Workers] = None
    got: Dict[int, Any] = {}
    try:
        for chunk in chunks_of:
            if chunks:
                if workers is None:
                    workers = Workers(args, n)
                workers.give(len(chunks) - 1, chunks[-1])
            chunks.append(chunk)
        last = here(chunks[-1]) if chunks else None
        if workers is not None:
            got = workers.take()
    finally:
        if workers is not None:
            workers.close()
    parts = [got[i] if i in got else here(c) for i, c in enumerate(chunks[:-1])]
    if chunks:
        parts.append(last)
    return parts, workers.answered if workers is not None else 0


def serve(fn: Callable[[Any], Any], stdin, stdout) -> int:
    """A child: fn(chunk) of each chunk from stdin until it closes, {number: part} to stdout."""
    done = {}
    while True:
        head = stdin.read(8)
        if len(head) != 8:
            break
        number, size = struct.unpack("<II", head)
        done[number] = fn(marshal.loads(stdin.read(size)))
    stdout.write(marshal.dumps(done))
    stdout.flush()
    return 0
