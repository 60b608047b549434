"""Work spread over forked worker processes: the kernel audit's files (checks_static), and the
install engine's digests of the source (rbkit.manifest imports it from here: rbprobes imports
nothing outside itself, rbkit may import rbprobes, both ship in every kit). One process each,
where threads of one Python do not scale (sha256 in threads of one process runs at one thread's
pace; figures: docs/benchmarks.md, "Figures behind choices in the code").

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import marshal
import os
import struct
import sys
from typing import Any, Callable, List, Tuple


def forkable() -> bool:
    """Whether this process may fork workers: no threads in it (a fork copies the locks another
    thread holds, held for ever in the child), and a fork to call."""
    threaded = "threading" in sys.modules and sys.modules["threading"].active_count() > 1
    return hasattr(os, "fork") and not threaded


def over_workers(fn: Callable[[int], Any], sizes: List[int], jobs: int) -> Tuple[List[Any], int]:
    """([fn(0), fn(1), ...] for each of `sizes`' items, how many workers answered), computed by
    `jobs` forked workers that take the items largest first, each as soon as it is free; the
    results come back marshalled (plain data). An item no worker answered for (a worker that
    died, an answer that does not load) is computed here, so the list is always whole. With one
    job, or threads in this process (a fork would copy their locks held), everything is
    computed here."""
    count = len(sizes)
    if jobs <= 1 or count <= 1 or not forkable():
        return [fn(i) for i in range(count)], 0
    order = sorted(range(count), key=lambda i: -sizes[i])
    task_r, task_w = os.pipe()
    # every index is 4 bytes, written before any worker reads: a pipe hands each 4-byte read
    # whole to one reader (count * 4 bytes fit its buffer up to 16,384 items; more, chunk by chunk)
    children = []
    parent = os.getpid()
    todo = b"".join(struct.pack("<I", i) for i in order)
    for _ in range(min(jobs, count)):
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                os.close(task_w)
                os.close(out_r)
                done = []
                while os.getppid() == parent:
                    got = os.read(task_r, 4)
                    if len(got) != 4:
                        break
                    index = struct.unpack("<I", got)[0]
                    done.append((index, fn(index)))
                data = marshal.dumps(done)
                view = memoryview(data)
                while view:
                    view = view[os.write(out_w, view) :]
            except BaseException:  # noqa: B902 (the parent computes what is not answered)
                code = 1
            finally:
                os._exit(code)
        os.close(out_w)
        children.append((pid, out_r))
    os.close(task_r)
    try:
        view = memoryview(todo)
        while view:
            view = view[os.write(task_w, view) :]
    finally:
        os.close(task_w)
    results: List[Any] = [None] * count
    answered = [False] * count
    workers = 0
    for pid, out_r in children:
        with os.fdopen(out_r, "rb") as fh:
            data = fh.read()
        _pid, status = os.waitpid(pid, 0)
        if status != 0:
            continue
        try:
            got = marshal.loads(data)
            for index, rec in got:
                results[index] = rec
                answered[index] = True
        except (ValueError, EOFError, TypeError):
            continue
        workers += 1
    for index in range(count):
        if not answered[index]:
            results[index] = fn(index)
    return results, workers
