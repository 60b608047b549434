"""The sending end of the stream (`send`): tar of the names a manifest lists, compressed, in one
stream or, for a large tree, in several (`split_names`, each part's tar on its own `--part I/N`
receiving end, their output merged on one channel: `Merged`); on to ssh for the direct route. The
children run through stream.py's `pipeline`; the receiving end is receive.receive.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional

from rbrules.compression import compression
from rbrules.streams import STREAMS_MIN_BYTES, TAR_RECORD, stream_count

from . import manifestfile, stream


def send_argvs(root: str, names: str, how: str) -> List[List[str]]:
    """The sending end of the stream: tar of the listed names (NUL-separated), compressed."""
    argvs = [["tar", "-C", root, *TAR_RECORD, "--null", "--no-recursion", "-T", names, "-cf", "-"]]
    pack = compression(how)["pack"]
    if pack:
        argvs.append(pack)
    return argvs


def split_names(names: str, count: int, into: str, min_bytes: int = 0) -> Optional[List[str]]:
    """The list `names` (the scan's, NUL-separated, its stat lines at NAMES.stat and its files of
    more than one link at NAMES.links) split into `count` lists in directory `into`, one per stream:
    each list keeps the scan's order and holds every directory (each stream's tar makes the
    directories it writes into before it writes there: parents first, as the scan lists them;
    two tars may both make one, tar takes a directory that is there); every other entry is in
    one list, the biggest first into the list with the fewest bytes so far; the names of one
    inode in one list (tar sends the second as a link to the first). None when the scan's
    record is not there or not of this list (one stream then), when its files hold fewer than
    `min_bytes`, when the split would leave a list with nothing but directories, or when a
    directory forbids its owner to write (one tar's setting its mode would stop another's
    writing there, for an owner who is not root)."""
    try:
        with open(names, "rb") as fh:
            listed = fh.read().split(b"\0")
        with open(names + manifestfile.SCAN_SUFFIX, "rb") as fh:
            rows = fh.read().split(b"\n")[1:]
        with open(names + manifestfile.LINKS_SUFFIX, "rb") as fh:
            multi = fh.read().split(b"\n")
    except OSError:
        return None
    if listed and listed[-1] == b"":
        listed.pop()
    rows = [r for r in rows if r]
    multi = [r for r in multi if r]
    try:
        values = json.loads(b"[" + b",".join(rows) + b"]")
        inodes = json.loads(b"[" + b",".join(multi) + b"]")
    except ValueError:
        return None
    if len(values) != len(listed) or any(
        not isinstance(v, list) or len(v) != 6 or os.fsencode(v[0]) != name
        for v, name in zip(values[:1] + values[-1:], listed[:1] + listed[-1:])
    ):
        return None
    group: Dict[int, tuple] = {}
    for item in inodes:
        if isinstance(item, list) and len(item) == 3 and 0 <= item[0] < len(listed):
            group[item[0]] = (item[1], item[2])
    # the entries that are not directories, by size, each inode's names as one item
    items: Dict[Any, List[int]] = {}
    sizes: Dict[Any, int] = {}
    for index, value in enumerate(values):
        if value[1] == "d":
            if not isinstance(value[2], int) or not value[2] & 0o200:
                return None
            continue
        key = group.get(index, index)
        items.setdefault(key, []).append(index)
        if key not in sizes:
            sizes[key] = (value[3] if value[1] == "f" and isinstance(value[3], int) else 0) + 512
    if len(items) < count or sum(sizes.values()) - 512 * len(sizes) < min_bytes:
        return None
    where = [-1] * len(listed)
    load = [0] * count
    for key in sorted(items, key=lambda k: -sizes[k]):
        slot = load.index(min(load))
        load[slot] += sizes[key]
        for index in items[key]:
            where[index] = slot
    out: List[List[bytes]] = [[] for _ in range(count)]
    for index, name in enumerate(listed):
        if where[index] < 0:
            for part in out:
                part.append(name)
        else:
            out[where[index]].append(name)
    paths = []
    for slot, part in enumerate(out):
        path = os.path.join(into, "names.%d" % slot)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as fh:
            fh.write(b"\0".join(part) + b"\0")
        paths.append(path)
    return paths


def send(
    root: str,
    names: str,
    compression: str,
    remote: Optional[List[str]] = None,
    local: Optional[List[str]] = None,
    jobs: int = 1,
) -> int:
    """Stream the tree to stdout; or with `remote` (an ssh argv) to the far end of that ssh, or
    with `local` (the receiving end's argv) into that command started here. With either, the
    tree goes in several streams (stream_count: --part I/N added to each receiving end's
    command) when the scan's record allows, and the receiving ends' answers are one answer on
    stdout (Merged). Each stage's failure is named on stderr; returns the first non-zero
    exit code."""
    receiver = local or remote
    count = stream_count(jobs) if receiver else 1
    if count > 1:
        work = tempfile.mkdtemp(prefix="rbkit-send.")
        try:
            parts = split_names(names, count, work, STREAMS_MIN_BYTES)
            if parts:
                return _send_parts(root, parts, compression, remote, local)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    argvs = send_argvs(root, names, compression)
    labels = ["tar", compression][: len(argvs)]
    if receiver:
        argvs.append(receiver)
        labels.append("ssh" if remote else "receive")
    codes, _errs = stream.pipeline(argvs, None, stdin=subprocess.DEVNULL)
    bad = [(label, c) for label, c in zip(labels, codes) if c != 0]
    if bad:
        sys.stderr.write(
            "rbkit engine send: %s\n"
            % "; ".join("%s %s" % (label, stream.exit_words(c)) for label, c in bad)
        )
        return stream.status_of([c for _, c in bad])
    return 0


def part_argv(receiver: List[str], remote: bool, part: int, count: int) -> List[str]:
    """The receiving end's command for stream `part` of `count`: --part I/N after its words (for
    ssh, the last word is the remote command line: the option is added to it)."""
    if remote:
        return receiver[:-1] + [receiver[-1] + " --part %d/%d" % (part, count)]
    return receiver + ["--part", "%d/%d" % (part, count)]


def _send_parts(
    root: str,
    parts: List[str],
    compression: str,
    remote: Optional[List[str]],
    local: Optional[List[str]],
) -> int:
    count = len(parts)
    receiver = local or remote or []
    merged = Merged(count, sys.stdout, compression)
    procs: List[List[Any]] = [[] for _ in range(count)]
    codes: List[Optional[List[int]]] = [None] * count
    first: List[int] = []
    stopped: set = set()  # streams killed here because another one failed
    mutex = threading.Lock()

    def started(slot: int, running: List[Any]) -> None:
        with mutex:
            procs[slot].extend(running)
            if first:
                # another stream failed before this one's stages had all started: stopped now
                stopped.add(slot)
                for child in running:
                    if child.poll() is None:
                        child.kill()

    def one(slot: int) -> None:
        argvs: List[Any] = send_argvs(root, parts[slot], compression)
        argvs.append(part_argv(receiver, bool(remote), slot, count))
        rfd, wfd = os.pipe()
        reader = threading.Thread(target=merged.read, args=(slot, rfd), daemon=True)
        reader.start()
        try:
            got, _ = stream.pipeline(
                argvs,
                None,
                stdin=subprocess.DEVNULL,
                stdout=wfd,
                started=lambda running: started(slot, running),
            )
        finally:
            os.close(wfd)
            reader.join()
        codes[slot] = got
        if not any(got):
            return
        with mutex:
            first.append(slot)
            if len(first) > 1:
                return
            # one stream failed: the run fails; the others are stopped, not waited for
            for other_slot, others in enumerate(procs):
                for other in others:
                    if other.poll() is None:
                        stopped.add(other_slot)
                        other.kill()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    labels = ["tar", compression][: len(send_argvs(root, parts[0], compression))]
    labels.append("ssh" if remote else "receive")
    said, rc = [], 0
    for index, got in enumerate(codes):
        bad = [(label, c) for label, c in zip(labels, got or [1]) if c != 0]
        if not bad:
            continue
        if index in stopped and index != first[0]:
            # killed here (SIGKILL: -9, 247 as a status) because another stream failed: never
            # the cause (issue 45: `send and receive on here exited 247`)
            said.append("stream %d/%d: stopped (another stream failed)" % (index + 1, count))
            continue
        said.extend(
            "stream %d/%d: %s %s" % (index + 1, count, label, stream.exit_words(c))
            for label, c in bad
        )
        if index == first[0]:
            rc = stream.status_of([c for _, c in bad])
    merged.answer(first[0] if first else None)
    if said:
        sys.stderr.write("rbkit engine send: %s\n" % "; ".join(said))
        return rc or 1
    return 0


class Merged:
    """The answers of the receiving ends of several streams as one (a runbook reads one): their
    progress lines summed as they come, and at the end one receive event: failed, naming the
    stream that failed first and in its own words, when one did; else of them all (its numbers
    summed, `streams` N)."""

    def __init__(self, count: int, out: Any, compression: str) -> None:
        self.count, self.out, self.compression = count, out, compression
        self.mutex = threading.Lock()
        self.progress = [0] * count
        self.events: List[List[dict]] = [[] for _ in range(count)]
        self.done: List[Optional[List[str]]] = [None] * count

    def _write(self, text: str) -> None:
        with self.mutex:
            self.out.write(text)
            self.out.flush()

    def read(self, index: int, fd: int) -> None:
        with open(fd, "rb", closefd=True) as fh:
            self.read_file(index, fh)

    def read_file(self, index: int, fh: Any) -> None:
        """Stream `index`'s answer, lines from the binary file `fh`."""
        for raw in fh:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            kind, _, rest = line.partition("\t")
            if kind == "progress":
                try:
                    value = int(rest)
                except ValueError:
                    continue
                with self.mutex:
                    self.progress[index] = value
                    total = sum(self.progress)
                self._write("progress\t%d\n" % total)
            elif kind == "event":
                try:
                    event = json.loads(rest)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events[index].append(event)
            elif kind == "done":
                self.done[index] = rest.split("\t", 1)
            elif kind == "log":
                self._write(line + "\n")  # for the run's log only: passed on as it came

    def answer(self, first: Optional[int] = None, more: Optional[dict] = None) -> None:
        """The one answer (after every stream ended); `first`: the stream that failed first
        (the others may have failed because they were stopped); `more`: facts of a failure the
        relay saw itself (`lost`: the hosts whose connection closed)."""
        failed = [
            i
            for i in range(self.count)
            if not self.done[i]
            or self.done[i][0] != "ok"
            or not any(e.get("step") == "receive" for e in self.events[i])
        ]
        lines: List[str] = []
        if failed:
            index = first if first is not None and first in failed else failed[0]
            why = (
                self.done[index][1]
                if self.done[index] and len(self.done[index]) > 1
                else "no answer from its receiving end"
            )
            detail = "stream %d of %d: %s" % (index + 1, self.count, why)
            # what the failed stream's end said of it (a full disk: where, what is free)
            said = next(
                (
                    dict(e.get("facts") or {})
                    for e in self.events[index]
                    if e.get("step") == "receive" and e.get("status") == "failed"
                ),
                {},
            )
            said.update(more or {})
            facts = dict(said, streams=self.count, failed_stream=index + 1)
            event = {
                "step": "receive",
                "status": "failed",
                "detail": detail,
                "duration_s": max(
                    (e.get("duration_s", 0) for es in self.events for e in es), default=0
                ),
                "facts": facts,
            }
            for fact, value in sorted(said.items()):
                if isinstance(value, (str, int, float)) and fact not in (
                    "streams",
                    "failed_stream",
                ):
                    lines.append(
                        "set\t%s\t%s" % (fact, str(value).replace("\t", " ").replace("\n", " "))
                    )
            lines.append("set\tstreams\t%d" % self.count)
            lines.append("event\t" + json.dumps(event, sort_keys=True, separators=(",", ":")))
            lines.append("done\tfailed\t" + detail.replace("\t", " ").replace("\n", " "))
        else:
            got = [next(e for e in es if e.get("step") == "receive") for es in self.events]
            # the numbers summed; the rest (the staging) as the first stream says it
            facts: Dict[str, Any] = dict(got[0].get("facts") or {})
            for fact in facts:
                if isinstance(facts[fact], int) and not isinstance(facts[fact], bool):
                    facts[fact] = sum((e.get("facts") or {}).get(fact, 0) for e in got)
            facts["streams"] = self.count
            detail = "unpacked into %s in %d streams side by side (compression %s)" % (
                facts.get("staging", "the staging"),
                self.count,
                self.compression,
            )
            if "streamed" in facts:
                detail += ", %d files hashed from the streams" % facts["streamed"]
            event = {
                "step": "receive",
                "status": "ok",
                "detail": detail,
                "duration_s": max(e.get("duration_s", 0) for e in got),
                "facts": facts,
            }
            for fact, value in sorted(facts.items()):
                lines.append("set\t%s\t%s" % (fact, value))
            lines.append("event\t" + json.dumps(event, sort_keys=True, separators=(",", ":")))
            lines.append("done\tok\t" + detail.replace("\t", " ").replace("\n", " "))
        self._write("".join(line + "\n" for line in lines))
