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

from rbrules.compression import compressors
from rbrules.units import human

from . import hostfs, pathid, statwalk


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
        done = subprocess.run(
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
    return (
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def pipeline(
    argvs: List[Any],
    timeout: Optional[float],
    capture: bool = False,
    stdin: Any = None,
    stdout: Any = None,
    umask: Optional[int] = None,
    started: Optional[Callable[[List[Any]], None]] = None,
    read_by: Optional[Dict[int, int]] = None,
) -> tuple:
    """Run argvs as one pipeline (each stage's stdout into the next; the first reads `stdin`,
    default ours; the last writes `stdout`, default ours), from /. Returns (one exit code per
    stage, stderr texts: only with `capture`, else they went to ours). A stage that cannot start
    counts 127 (and so do the stages after it); past `timeout` every stage is killed (124).
    `started` is called with the running stages once all have started (a `Progress` watch).

    A stage may be a function `fn(in_fd, out_fd) -> int` instead of an argv (not the last): it
    runs in a thread of this process between its neighbours (tarstream.Digester.stage), its
    return value is its exit code (1 when it raised), its stderr text empty.

    `read_by`: {stage index: 0} for stages whose bytes read are wanted (the receiving end's
    decompressor: the stream's packed bytes); each such stage's rchar (/proc/PID/io) once it
    exited, read before it is reaped, replaces the 0; a stage /proc does not tell of is
    removed."""
    procs: List[Any] = []
    errs: List[Any] = []
    prev = stdin
    not_started: Optional[str] = None
    for index, argv in enumerate(argvs):
        last = index == len(argvs) - 1
        if callable(argv):
            procs.append(_Inline(argv, prev))
            prev = procs[-1].stdout
            errs.append(None)
            continue
        err = tempfile.TemporaryFile() if capture else None
        try:
            child = subprocess.Popen(
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
        if index > 0:
            _close(prev)  # the previous stage's output is the child's now
        prev = child.stdout
        procs.append(child)
        errs.append(err)
    if not_started is not None:
        if procs and prev is not None:
            _close(prev)
        for child in procs:
            child.kill()
    elif started is not None:
        started(procs)
    codes: List[int] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    for index, child in enumerate(procs):
        try:
            left = None if deadline is None else max(0.1, deadline - time.monotonic())
            if read_by is not None and index in read_by:
                got = _read_at_exit(child, left)
                if got is None:
                    del read_by[index]
                else:
                    read_by[index] = got
                left = None if deadline is None else max(0.1, deadline - time.monotonic())
            codes.append(child.wait(left))
        except subprocess.TimeoutExpired:
            for stage in procs:
                stage.kill()
            codes.append(124)
    for child in procs:
        if child.poll() is None:
            child.kill()
        child.wait()
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


def _read_at_exit(child: Any, timeout: Optional[float]) -> Optional[int]:
    """The bytes `child` read in all (rchar of /proc/PID/io), once it exited and before it is
    reaped (waitid WNOWAIT: its pid is not free yet, the figure is its own); None where this
    is not Linux, the child is a thread stage, or it did not exit within `timeout`."""
    pid = getattr(child, "pid", None)
    if not isinstance(pid, int) or not hasattr(os, "waitid"):
        return None
    end = None if timeout is None else time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
        except ChildProcessError:
            return None  # reaped already
        if exited is not None:
            break
        if end is not None and time.monotonic() >= end:
            return None
        time.sleep(pause)
        pause = min(0.05, pause * 2)
    try:
        with open("/proc/%d/io" % pid, "rb") as fh:
            for line in fh.read().splitlines():
                if line.startswith(b"rchar:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


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
                with open(path, "rb") as fh:
                    text = fh.read()
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
