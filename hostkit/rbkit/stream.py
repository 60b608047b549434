"""The stream between hosts and what runs beside it: the one compression table, the sending end
(`send`: tar of the names a manifest lists, compressed; on to ssh for the direct route), the
source's scan before anything is sent (`scan_source`), and how the engine runs children
(`pipeline`, every stage's exit code seen; `run_quiet`). The receiving end is receive.receive.

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
import time
from typing import Any, Callable, Dict, List, Optional

# the stream's rules are rbrules.common's (the compiler states them too); engine.py, serve.py,
# fanout.py, relay.py and measure.py still name them from here
from rbrules.common import (
    COMPRESSION,  # noqa: F401
    MAX_STREAMS,  # noqa: F401
    STREAMS_MIN_BYTES,  # noqa: F401
    TAR_RECORD,
    compression,
    compressors,
    human,
    stream_count,
)

from . import hostfs, manifestfile, pathid, statwalk


class SourceRefused(Exception):
    """The source must not be sent: the message says why."""


def child_env() -> Dict[str, str]:
    """The environment of what runs from the tree: ours without PYTHON* (the kit's PYTHONPATH
    must not reach the moved interpreter), no bytecode written into the tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_quiet(
    argv: List[str], timeout: Optional[float], env: Optional[Dict[str, str]] = None
) -> tuple:
    """(rc, stdout, stderr) of argv, output collected, from /; 124 when it timed out, 127 when
    it could not start."""
    try:
        p = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or child_env(),
            cwd="/",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, "", "timed out after %ss: %s" % (timeout, argv[0])
    except OSError as exc:
        return 127, "", "%s: %s" % (argv[0], exc.strerror)
    return (p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))


def pipeline(
    argvs: List[Any],
    timeout: Optional[float],
    capture: bool = False,
    stdin: Any = None,
    stdout: Any = None,
    umask: Optional[int] = None,
    started: Optional[Callable[[List[Any]], None]] = None,
) -> tuple:
    """Run argvs as one pipeline (each stage's stdout into the next; the first reads `stdin`,
    default ours; the last writes `stdout`, default ours), from /. Returns (one exit code per
    stage, stderr texts: only with `capture`, else they went to ours). A stage that cannot start
    counts 127 (and so do the stages after it); past `timeout` every stage is killed (124).
    `started` is called with the running stages once all have started (a `Progress` watch).

    A stage may be a function `fn(in_fd, out_fd) -> int` instead of an argv (not the last): it
    runs in a thread of this process between its neighbours (tarstream.Digester.stage), its
    return value is its exit code (1 when it raised), its stderr text empty."""
    procs: List[Any] = []
    errs: List[Any] = []
    prev = stdin
    not_started: Optional[str] = None
    for i, argv in enumerate(argvs):
        last = i == len(argvs) - 1
        if callable(argv):
            procs.append(_Inline(argv, prev))
            prev = procs[-1].stdout
            errs.append(None)
            continue
        err = tempfile.TemporaryFile() if capture else None
        try:
            p = subprocess.Popen(
                argv,
                stdin=prev,
                stdout=stdout if last else subprocess.PIPE,
                stderr=err,
                cwd="/",
                umask=-1 if umask is None else umask,
            )
        except OSError as exc:
            not_started = "%s: %s" % (argv[0], exc.strerror)
            if err is not None:
                err.close()
            break
        if i > 0:
            _close(prev)  # the previous stage's output is the child's now
        prev = p.stdout
        procs.append(p)
        errs.append(err)
    if not_started is not None:
        if procs and prev is not None:
            _close(prev)
        for p in procs:
            p.kill()
    elif started is not None:
        started(procs)
    codes: List[int] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    for p in procs:
        try:
            left = None if deadline is None else max(0.1, deadline - time.monotonic())
            codes.append(p.wait(left))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            codes.append(124)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    codes += [127] * (len(argvs) - len(procs))
    texts = [not_started] if not_started else []
    for err in errs:
        if err is not None:
            err.seek(0)
            texts.append(err.read().decode("utf-8", "replace"))
            err.close()
        elif capture:
            texts.append("")
    return codes, texts


def _close(stream: Any) -> None:
    if isinstance(stream, int):
        os.close(stream)
    elif stream is not None:
        stream.close()


class _Inline:
    """A pipeline stage that is a function in a thread (see `pipeline`), with a Popen's face:
    `stdout` (the read end of its output pipe, an fd for the next stage), wait, poll, kill."""

    def __init__(self, fn: Any, stdin: Any) -> None:
        import threading

        if stdin is None:
            self._in, self._own_in = 0, False
        elif isinstance(stdin, int):
            self._in, self._own_in = stdin, True
        else:
            self._in, self._own_in = os.dup(stdin.fileno()), True
            stdin.close()
        self.stdout, self._out = os.pipe()
        self._fn = fn
        self.returncode: Optional[int] = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.returncode = int(self._fn(self._in, self._out) or 0)
        except Exception as exc:  # the stage's own failure: named, counted as exit 1
            sys.stderr.write("rbkit: %s: %s\n" % (type(exc).__name__, exc))
            self.returncode = 1
        finally:
            os.close(self._out)
            if self._own_in:
                os.close(self._in)

    def wait(self, timeout: Optional[float] = None) -> int:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise subprocess.TimeoutExpired("inline stage", timeout or 0)
        return self.returncode if self.returncode is not None else 1

    def poll(self) -> Optional[int]:
        return None if self._thread.is_alive() else self.wait()

    def kill(self) -> None:
        pass  # it ends when its input ends or its reader goes: both are killed


class Progress:
    """How far the last stage of a pipeline (the receiving end's tar) has read its input: every
    `every` seconds, the bytes it read so far (rchar in /proc/PID/io, the uncompressed tar stream:
    no copy of the stream is made to count it) go to `say`. Nothing where /proc does not tell;
    never a figure of another process (a stage reaped, its pid free again, is read no more)."""

    def __init__(self, every: float, say: Callable[[int], None]) -> None:
        self.every, self.say = every, say
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, procs: List[Any]) -> None:
        """The `started` hook of `pipeline`."""
        last = procs[-1] if procs else None
        if last is None or not isinstance(getattr(last, "pid", None), int):
            return
        self._thread = threading.Thread(target=self._run, args=(last,), daemon=True)
        self._thread.start()

    def _run(self, proc: Any) -> None:
        path = "/proc/%d/io" % proc.pid
        while not self._stop.wait(self.every):
            if proc.returncode is not None:
                return
            try:
                with open(path, "rb") as f:
                    text = f.read()
            except OSError:
                return
            if proc.returncode is not None:
                return
            for line in text.splitlines():
                if line.startswith(b"rchar:"):
                    self.say(int(line.split()[1]))
                    break
            else:
                return

    def stop(self, final: Optional[int] = None) -> None:
        """No more samples; `final`: the stream's whole size, said last (when it is known)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if final is not None:
            self.say(final)


def tail(text: str, lines: int = 8) -> List[str]:
    return [ln for ln in (text or "").splitlines() if ln.strip()][-lines:]


def scan_source(
    root: str,
    excludes: List[str],
    names: Optional[str] = None,
    special_modes: str = "refuse",
    outside_links: str = "refuse",
    begun: Optional[hostfs.ScanWalk] = None,
) -> tuple:
    """The source before anything is sent: it exists, and what the excludes leave of it is a venv
    (pyvenv.cfg and bin/python are sent) with files in it. A tree the excludes empty, or one
    that is not a venv, is refused here (SourceRefused): `replace` would otherwise swap a working
    install for it. `begun`: its walk begun earlier (hostfs.scan). Returns (detail, facts)."""
    out = hostfs.scan(
        root, excludes, names, special_modes=special_modes, outside_links=outside_links, begun=begun
    )
    if not out["exists"]:
        raise SourceRefused("source %s does not exist" % root)
    if not out.get("is_dir"):
        raise SourceRefused("source %s is not a directory" % root)
    why = []
    for rel in ("pyvenv.cfg", "bin/python"):
        parts = rel.split("/")
        left_out = [
            p
            for p in ("/".join(parts[: i + 1]) for i in range(len(parts)))
            if statwalk.excluded(p, excludes)
        ]
        if left_out:
            why.append("transfer.exclude leaves out %s" % left_out[0])
        elif not os.path.exists(os.path.join(root, rel)):
            why.append("no %s" % rel)
    if not out.get("files"):
        why.append(
            "no files to send after the excludes (%d entries)"
            % (out.get("files", 0) + out.get("dirs", 0) + out.get("links", 0))
        )
    if why:
        raise SourceRefused(
            "source %s is not a venv after the excludes: %s; nothing was sent (an "
            "install there would not run)" % (root, "; ".join(why))
        )
    if out.get("refusal"):
        raise SourceRefused("source %s: %s" % (root, out["refusal"]))
    facts = {
        k: out.get(k)
        for k in ("files", "dirs", "links", "bytes", "disk_bytes", "need_bytes", "stat_fingerprint")
    }
    # what the destination compares itself with (never the source, nor inside it)
    facts["identity"] = json.dumps(pathid.identity(root), sort_keys=True, separators=(",", ":"))
    facts["compressors"] = ",".join(compressors(shutil.which))
    return "%d files, %s" % (out["files"], human(out["bytes"])), facts


def send_argvs(root: str, names: str, how: str) -> List[List[str]]:
    """The sending end of the stream: tar of the listed names (NUL-separated), compressed."""
    argvs = [["tar", "-C", root, *TAR_RECORD, "--null", "--no-recursion", "-T", names, "-cf", "-"]]
    pack = compression(how)["pack"]
    if pack:
        argvs.append(pack)
    return argvs


def split_names(names: str, n: int, into: str, min_bytes: int = 0) -> Optional[List[str]]:
    """The list `names` (the scan's, NUL-separated, its stat lines at NAMES.stat and its files of
    more than one link at NAMES.links) split into `n` lists in directory `into`, one per stream:
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
        with open(names, "rb") as f:
            listed = f.read().split(b"\0")
        with open(names + manifestfile.SCAN_SUFFIX, "rb") as f:
            rows = f.read().split(b"\n")[1:]
        with open(names + manifestfile.LINKS_SUFFIX, "rb") as f:
            multi = f.read().split(b"\n")
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
    for i, v in enumerate(values):
        if v[1] == "d":
            if not isinstance(v[2], int) or not v[2] & 0o200:
                return None
            continue
        key = group.get(i, i)
        items.setdefault(key, []).append(i)
        if key not in sizes:
            sizes[key] = (v[3] if v[1] == "f" and isinstance(v[3], int) else 0) + 512
    if len(items) < n or sum(sizes.values()) - 512 * len(sizes) < min_bytes:
        return None
    where = [-1] * len(listed)
    load = [0] * n
    for key in sorted(items, key=lambda k: -sizes[k]):
        j = load.index(min(load))
        load[j] += sizes[key]
        for i in items[key]:
            where[i] = j
    out: List[List[bytes]] = [[] for _ in range(n)]
    for i, name in enumerate(listed):
        if where[i] < 0:
            for part in out:
                part.append(name)
        else:
            out[where[i]].append(name)
    paths = []
    for j, part in enumerate(out):
        path = os.path.join(into, "names.%d" % j)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with open(fd, "wb") as f:
            f.write(b"\0".join(part) + b"\0")
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
    n = stream_count(jobs) if receiver else 1
    if n > 1:
        work = tempfile.mkdtemp(prefix="rbkit-send.")
        try:
            parts = split_names(names, n, work, STREAMS_MIN_BYTES)
            if parts:
                return _send_parts(root, parts, compression, remote, local)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    argvs = send_argvs(root, names, compression)
    labels = ["tar", compression][: len(argvs)]
    if receiver:
        argvs.append(receiver)
        labels.append("ssh" if remote else "receive")
    codes, _errs = pipeline(argvs, None, stdin=subprocess.DEVNULL)
    bad = [(label, c) for label, c in zip(labels, codes) if c != 0]
    if bad:
        sys.stderr.write(
            "rbkit engine send: %s\n"
            % "; ".join("%s %s" % (label, exit_words(c)) for label, c in bad)
        )
        return status_of([c for _, c in bad])
    return 0


def exit_words(code: int) -> str:
    """How a child ended, in words: `exited 2`, or `died of signal 9 (SIGKILL)` (subprocess's
    negative code, which as an exit status of ours would read 247)."""
    if code >= 0:
        return "exited %d" % code
    import signal

    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "?"
    return "died of signal %d (%s)" % (-code, name)


def status_of(codes: List[int]) -> int:
    """The exit status that stands for a failed stage's codes: its first own status, else the
    shell's 128+N for the first signal it died of; never a negative code (sys.exit(-9) is 247)."""
    own = [c for c in codes if c > 0]
    if own:
        return own[0]
    dead = [c for c in codes if c < 0]
    return 128 - dead[0] if dead else 1


def part_argv(receiver: List[str], remote: bool, part: int, n: int) -> List[str]:
    """The receiving end's command for stream `part` of `n`: --part I/N after its words (for
    ssh, the last word is the remote command line: the option is added to it)."""
    if remote:
        return receiver[:-1] + [receiver[-1] + " --part %d/%d" % (part, n)]
    return receiver + ["--part", "%d/%d" % (part, n)]


def _send_parts(
    root: str,
    parts: List[str],
    compression: str,
    remote: Optional[List[str]],
    local: Optional[List[str]],
) -> int:
    n = len(parts)
    receiver = local or remote or []
    merged = Merged(n, sys.stdout, compression)
    procs: List[List[Any]] = [[] for _ in range(n)]
    codes: List[Optional[List[int]]] = [None] * n
    first: List[int] = []
    stopped: set = set()  # streams killed here because another one failed
    mutex = threading.Lock()

    def started(i: int, running: List[Any]) -> None:
        with mutex:
            procs[i].extend(running)
            if first:
                # another stream failed before this one's stages had all started: stopped now
                stopped.add(i)
                for p in running:
                    if p.poll() is None:
                        p.kill()

    def one(i: int) -> None:
        argvs: List[Any] = send_argvs(root, parts[i], compression)
        argvs.append(part_argv(receiver, bool(remote), i, n))
        rfd, wfd = os.pipe()
        reader = threading.Thread(target=merged.read, args=(i, rfd), daemon=True)
        reader.start()
        try:
            got, _ = pipeline(
                argvs,
                None,
                stdin=subprocess.DEVNULL,
                stdout=wfd,
                started=lambda running: started(i, running),
            )
        finally:
            os.close(wfd)
            reader.join()
        codes[i] = got
        if not any(got):
            return
        with mutex:
            first.append(i)
            if len(first) > 1:
                return
            # one stream failed: the run fails; the others are stopped, not waited for
            for j, others in enumerate(procs):
                for p in others:
                    if p.poll() is None:
                        stopped.add(j)
                        p.kill()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    labels = ["tar", compression][: len(send_argvs(root, parts[0], compression))]
    labels.append("ssh" if remote else "receive")
    said, rc = [], 0
    for i, got in enumerate(codes):
        bad = [(label, c) for label, c in zip(labels, got or [1]) if c != 0]
        if not bad:
            continue
        if i in stopped and i != first[0]:
            # killed here (SIGKILL: -9, 247 as a status) because another stream failed: never
            # the cause (issue 45: `send and receive on here exited 247`)
            said.append("stream %d/%d: stopped (another stream failed)" % (i + 1, n))
            continue
        said.extend("stream %d/%d: %s %s" % (i + 1, n, label, exit_words(c)) for label, c in bad)
        if i == first[0]:
            rc = status_of([c for _, c in bad])
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

    def __init__(self, n: int, out: Any, compression: str) -> None:
        self.n, self.out, self.compression = n, out, compression
        self.mutex = threading.Lock()
        self.progress = [0] * n
        self.events: List[List[dict]] = [[] for _ in range(n)]
        self.done: List[Optional[List[str]]] = [None] * n

    def _write(self, text: str) -> None:
        with self.mutex:
            self.out.write(text)
            self.out.flush()

    def read(self, i: int, fd: int) -> None:
        with open(fd, "rb", closefd=True) as f:
            self.read_file(i, f)

    def read_file(self, i: int, f: Any) -> None:
        """Stream i's answer, lines from the binary file f."""
        for raw in f:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            kind, _, rest = line.partition("\t")
            if kind == "progress":
                try:
                    value = int(rest)
                except ValueError:
                    continue
                with self.mutex:
                    self.progress[i] = value
                    total = sum(self.progress)
                self._write("progress\t%d\n" % total)
            elif kind == "event":
                try:
                    event = json.loads(rest)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    self.events[i].append(event)
            elif kind == "done":
                self.done[i] = rest.split("\t", 1)
            elif kind == "log":
                self._write(line + "\n")  # for the run's log only: passed on as it came

    def answer(self, first: Optional[int] = None, more: Optional[dict] = None) -> None:
        """The one answer (after every stream ended); `first`: the stream that failed first
        (the others may have failed because they were stopped); `more`: facts of a failure the
        relay saw itself (`lost`: the hosts whose connection closed)."""
        failed = [
            i
            for i in range(self.n)
            if not self.done[i]
            or self.done[i][0] != "ok"
            or not any(e.get("step") == "receive" for e in self.events[i])
        ]
        lines: List[str] = []
        if failed:
            i = first if first is not None and first in failed else failed[0]
            why = (
                self.done[i][1]
                if self.done[i] and len(self.done[i]) > 1
                else "no answer from its receiving end"
            )
            detail = "stream %d of %d: %s" % (i + 1, self.n, why)
            # what the failed stream's end said of it (a full disk: where, what is free)
            said = next(
                (
                    dict(e.get("facts") or {})
                    for e in self.events[i]
                    if e.get("step") == "receive" and e.get("status") == "failed"
                ),
                {},
            )
            said.update(more or {})
            facts = dict(said, streams=self.n, failed_stream=i + 1)
            event = {
                "step": "receive",
                "status": "failed",
                "detail": detail,
                "duration_s": max(
                    (e.get("duration_s", 0) for es in self.events for e in es), default=0
                ),
                "facts": facts,
            }
            for k, v in sorted(said.items()):
                if isinstance(v, (str, int, float)) and k not in ("streams", "failed_stream"):
                    lines.append("set\t%s\t%s" % (k, str(v).replace("\t", " ").replace("\n", " ")))
            lines.append("set\tstreams\t%d" % self.n)
            lines.append("event\t" + json.dumps(event, sort_keys=True, separators=(",", ":")))
            lines.append("done\tfailed\t" + detail.replace("\t", " ").replace("\n", " "))
        else:
            got = [next(e for e in es if e.get("step") == "receive") for es in self.events]
            # the numbers summed; the rest (the staging) as the first stream says it
            facts: Dict[str, Any] = dict(got[0].get("facts") or {})
            for k in facts:
                if isinstance(facts[k], int) and not isinstance(facts[k], bool):
                    facts[k] = sum((e.get("facts") or {}).get(k, 0) for e in got)
            facts["streams"] = self.n
            detail = "unpacked into %s in %d streams side by side (compression %s)" % (
                facts.get("staging", "the staging"),
                self.n,
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
            for k, v in sorted(facts.items()):
                lines.append("set\t%s\t%s" % (k, v))
            lines.append("event\t" + json.dumps(event, sort_keys=True, separators=(",", ":")))
            lines.append("done\tok\t" + detail.replace("\t", " ").replace("\n", " "))
        self._write("".join(line + "\n" for line in lines))
