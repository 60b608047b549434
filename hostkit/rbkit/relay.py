"""The relay in streams side by side (issue 37): `rbkit engine relay`, run on THIS machine (the
runbook's local kit) when the source cannot reach the destination. Each stream is a pair of ssh
processes here, `ssh SRC <send part I>` piped (1 MiB) into `ssh DST <receive --part I/N>`: one
ssh client is one cipher process, so N pairs use N times the cores of one.

Stream 0 goes over the run's multiplexed connections (its ControlMaster); every other stream
opens its own connections (-o ControlPath=none -o ControlMaster=no, the host's own options and
known_hosts otherwise). Each end starts gated (`send --gate`, `receive --gate`): it says
`ready JOBS CPUS` (its jobs, and the CPUs it may use: rbrules.cpus.token) and waits for one line
on stdin before anything moves:

    split N     (the source end of stream 0 only) split the scan's list into N parts by bytes
                (sender.split_names, the other routes' split); it says `parts M` (M = 1: not split)
    go I N      send / receive part I of N (N = 1: the whole list, no --part)

so a pair whose connection a host refused (sshd's MaxStartups, a firewall) is known before any
byte moves; it is stopped (its ends exit 3, nothing received) and the tree goes in fewer
streams, said on stderr. How many: the count compression auto's model chose (--streams N,
rbkit.model: where more streams carry no more it takes fewer), never more than streams.relay_most
(one a job and a CPU of the fewest); else streams.relay_streams: stream_count of the fewest jobs of
the three machines (each stream costs two ssh cipher processes here), never more than the fewest
CPUs any of them may use (rbrules.cpus; each end says its own on its gate line), at most
streams.MAX_STREAMS, none below streams.STREAMS_MIN_BYTES (the split says so). The receiving ends'
answers are one answer on stdout (sender.Merged): their progress summed, one receive event with
`streams: N`, or the stream that failed first, named; the others are stopped.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import subprocess
import sys
import threading
from typing import Any, List, Optional

from rbrules import cpus, streams

from . import sender, stream

GATE = "rbkit-gate"  # the source end's gate lines on its stderr: `rbkit-gate ready 16`
READY_S = 60.0  # a connection (and the kit's start) that says nothing by then: refused
FRESH = ["-o", "ControlPath=none", "-o", "ControlMaster=no", "-o", "ConnectTimeout=15"]


def fresh_ssh(words: List[str]) -> List[str]:
    """The host's ssh words for a connection of its own: not the run's ControlMaster (the first
    value of an ssh option wins, so these go first)."""
    return words[:1] + FRESH + words[1:] if words else []


def shq(word: str) -> str:
    """A word quoted for the far side's shell as rb::shq quotes it: always in single quotes."""
    return "'%s'" % word.replace("'", "'\\''")


def read_line(fd: int, limit: int = 256) -> str:
    """One line from fd, a byte at a time: nothing past it is taken (the stream follows)."""
    got = b""
    while len(got) < limit:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            break
        got += byte
    return got.decode("ascii", "replace")


def widen(fd: int) -> None:
    """A 1 MiB pipe between the two ssh clients (as rb::wide_pipe): else they take turns."""
    if sys.platform.startswith("linux"):
        try:
            import fcntl

            fcntl.fcntl(fd, 1031, 1 << 20)
        except OSError:
            pass


class End:
    """How to start the kit on one host: its ssh words (empty: this machine), its kit dir and the
    kit's words there."""

    def __init__(self, name: str, ssh: str, kit: str, words: str) -> None:
        self.name, self.ssh, self.kit = name, shlex.split(ssh), kit
        self.words = shlex.split(words)

    def argv(self, extra: List[str], fresh: bool) -> tuple:
        """(argv, cwd) of the kit words + extra on this host, in its private kit dir."""
        words = self.words + extra
        if not self.ssh:
            return words, self.kit
        line = "cd %s && %s" % (shq(self.kit), " ".join(shq(w) for w in words))
        return (fresh_ssh(self.ssh) if fresh else self.ssh) + [line], "/"


class Pair:
    """One stream: `ssh SRC send --gate` | `ssh DST receive --gate`, started, not yet told to go."""

    def __init__(self, relay: "Relay", number: int, fresh: bool) -> None:
        self.number, self.relay, self.fresh = number, relay, fresh
        relay.pairs.append(self)
        self.index = -1
        self.src_jobs: Optional[int] = None
        self.dst_jobs: Optional[int] = None
        self.src_cpus: Optional[cpus.Usable] = None  # as the ends said them (gate lines)
        self.dst_cpus: Optional[cpus.Usable] = None
        self.said: "queue.Queue[str]" = queue.Queue()
        self.live = threading.Event()  # told to go: its stderr passes through from now on
        self.over = threading.Event()  # go or stop decided
        self.held: List[str] = []  # its stderr until then (why a connection failed)
        self.refused: List[str] = []
        self.timed_out = False
        self.stopped = False  # killed here: another stream failed
        p_r, self.p_w = os.pipe()
        widen(self.p_w)
        g_r, self.g_w = os.pipe()
        e_r, e_w = os.pipe()
        f_r, f_w = os.pipe()
        argv, cwd = relay.src.argv(relay.send + ["--gate", relay.prefix], fresh)
        try:
            self.src = subprocess.Popen(argv, stdin=g_r, stdout=self.p_w, stderr=e_w, cwd=cwd)
            argv, cwd = relay.dst.argv(relay.receive + ["--gate"], fresh)
            self.dst = subprocess.Popen(
                argv, stdin=p_r, stdout=subprocess.PIPE, stderr=f_w, cwd=cwd
            )
        finally:
            for fd in (p_r, g_r, e_w, f_w):
                os.close(fd)
        self.threads = [
            threading.Thread(target=self._src_err, args=(e_r,), daemon=True),
            threading.Thread(target=self._dst_err, args=(f_r,), daemon=True),
            threading.Thread(target=self._dst_out, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _pass(self, line: str) -> None:
        if self.live.is_set():
            sys.stderr.write(line)
            sys.stderr.flush()
        else:
            self.held.append(line)

    def _src_err(self, fd: int) -> None:
        with open(fd, "r", encoding="utf-8", errors="replace", closefd=True) as fh:
            for line in fh:
                words = line.split()
                if words[:1] == [GATE] and len(words) in (3, 4) and words[2].isdigit():
                    if words[1] == "ready":
                        self.src_cpus = cpus.read_token(words[3]) if len(words) == 4 else None
                        self.src_jobs = int(words[2])
                    self.said.put("%s %s" % (words[1], words[2]))
                    continue
                self._pass(line)
        self.said.put("end")

    def _dst_err(self, fd: int) -> None:
        with open(fd, "r", encoding="utf-8", errors="replace", closefd=True) as fh:
            for line in fh:
                self._pass(line)

    def _dst_out(self) -> None:
        out = self.dst.stdout
        first = out.readline().decode("utf-8", "replace").rstrip("\n").split("\t")
        if first[:2] == ["gate", "ready"] and len(first) in (3, 4) and first[2].isdigit():
            self.dst_cpus = cpus.read_token(first[3]) if len(first) == 4 else None
            self.dst_jobs = int(first[2])
        self.said.put("dst")
        self.over.wait()
        if self.live.is_set() and self.dst_jobs is not None:
            self.relay.merged.read_file(self.index, out)
        else:
            out.read()

    def ready(self, timeout: float) -> bool:
        """Both ends said ready (their connections made, their kits started); else `refused`
        names the end that ended first, or both when neither answered in time."""
        import time

        deadline = time.monotonic() + timeout
        while self.src_jobs is None or self.dst_jobs is None:
            try:
                got = self.said.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                self.timed_out = True
                self.refused = [
                    e.name
                    for e, j in ((self.relay.src, self.src_jobs), (self.relay.dst, self.dst_jobs))
                    if j is None
                ]
                return False
            if got == "end" and self.src_jobs is None:
                self.refused = [self.relay.src.name]
                return False
            if got == "dst" and self.dst_jobs is None:
                self.refused = [self.relay.dst.name]
                return False
        return True

    def why(self) -> str:
        """The last words of its ends' stderr (ssh's reason), or that they said nothing."""
        lines = [ln.strip() for ln in self.held if ln.strip()]
        if lines:
            return lines[-1]
        return "no answer within %d s" % READY_S if self.timed_out else "it ended without a word"

    def split(self, count: int) -> int:
        """Ask the source end (stream 0's) to split the list into `count`: the parts it made."""
        os.write(self.g_w, b"split %d\n" % count)
        while True:
            try:
                got = self.said.get(timeout=READY_S)
            except queue.Empty:
                return 1
            if got.startswith("parts "):
                return int(got.split()[1])
            if got == "end":
                return 1

    def go(self, index: int, count: int) -> None:
        self.index = index
        self.live.set()
        for line in self.held:
            sys.stderr.write(line)
        self.held = []
        line = b"go %d %d\n" % (index, count)
        # the destination's gate line first, then the tar; an end gone by now (its ssh died: a
        # signal, a closed connection) shows in its exit status, which the relay reports
        for fd in (self.p_w, self.g_w):
            try:
                os.write(fd, line)
            except OSError:
                pass
            finally:
                os.close(fd)
            if fd == self.p_w:
                self.over.set()

    def stop(self) -> None:
        """No go: both ends exit without sending or receiving anything."""
        self.over.set()
        for fd in (self.p_w, self.g_w):
            try:
                os.close(fd)
            except OSError:
                pass
        for child in (self.src, self.dst):
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        for thread in self.threads:
            thread.join(5)

    def kill(self) -> None:
        self.stopped = True
        for child in (self.src, self.dst):
            if child.poll() is None:
                child.kill()


class Relay:
    def __init__(
        self,
        src: End,
        dst: End,
        send: List[str],
        receive: List[str],
        prefix: str,
        jobs: int,
        compression: str,
        most: int = streams.MAX_STREAMS,
        here: Optional[cpus.Usable] = None,
        chosen: int = 0,
    ) -> None:
        self.src, self.dst, self.send, self.receive = src, dst, send, receive
        self.prefix, self.jobs, self.compression, self.most = prefix, jobs, compression, most
        self.chosen = chosen  # the streams compression auto's model chose; 0: the rule's
        self.here = here or cpus.usable()  # the CPUs this machine may use
        self.merged: Any = None
        self.pairs: List[Pair] = []

    def say(self, text: str) -> None:
        sys.stderr.write("    relay: %s\n" % text)
        sys.stderr.flush()

    def run(self) -> int:
        """The relay; its streams end with it: on SIGTERM/SIGHUP, or once the runbook that
        started it is gone (its parent changed), every pair is killed (the streams that do not
        use the run's connections would outlive them otherwise)."""
        import signal

        self.pairs = []
        parent = os.getppid()

        def end(signum: int = signal.SIGTERM, _frame: Any = None) -> None:
            for pair in list(self.pairs):
                pair.kill()
            os._exit(128 + signum)

        done = threading.Event()

        def watch() -> None:
            while os.getppid() == parent:
                if done.wait(1.0):
                    return  # the relay is over: no thread of it is left behind
            end()

        signal.signal(signal.SIGTERM, end)
        signal.signal(signal.SIGHUP, end)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # the terminal's Ctrl-C reaches the run's whole group: the relay ends its streams and
            # exits 130, the runbook says where it stopped (issue 45: a Python traceback of 32
            # lines on the terminal); where SIGINT was ignored on entry it stays ignored
            signal.signal(signal.SIGINT, end)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            return self._run()
        finally:
            done.set()
            watcher.join()

    def _run(self) -> int:
        first = Pair(self, 0, False)
        if not first.ready(READY_S):
            first.kill()
            first.stop()
            why = "the stream did not start: %s on %s (%s)" % (
                "no answer from the kit" if first.timed_out else "it ended",
                " and ".join(first.refused),
                first.why(),
            )
            sys.stderr.write("rbkit engine relay: %s\n" % why)
            event = {
                "step": "receive",
                "status": "failed",
                "detail": why,
                "duration_s": 0,
                "facts": {},
            }
            sys.stdout.write(
                "event\t%s\ndone\tfailed\t%s\n"
                % (json.dumps(event, sort_keys=True, separators=(",", ":")), why)
            )
            sys.stdout.flush()
            return 255
        jobs = min(self.jobs, first.src_jobs or 1, first.dst_jobs or 1)
        usable = [
            (name, u)
            for name, u in (
                ("here", self.here),
                (self.src.name, first.src_cpus),
                (self.dst.name, first.dst_cpus),
            )
            if u is not None
        ]
        fewest = min(u.count for _n, u in usable)
        if self.chosen > 0:
            want = min(self.most, self.chosen, streams.relay_most(jobs, fewest))
        else:
            want = min(self.most, streams.relay_streams(jobs, fewest))
        cpus_said = "CPUs usable: %s" % ", ".join("%s %s" % (n, u.why) for n, u in usable)
        pairs = [first]
        count = first.split(want) if want > 1 else 1
        if want > 1:
            why = "below %d MB or no scan record to split" % (streams.STREAMS_MIN_BYTES >> 20)
        elif self.chosen == 1:
            why = "compression auto's model: more streams carry no more; %s" % cpus_said
        elif streams.stream_count(jobs) > 1 or self.chosen > 1:
            why = "no more streams than the fewest CPUs a machine may use, %d; %s" % (
                fewest,
                cpus_said,
            )
        else:
            why = "the fewest jobs of the three machines is %d; %s" % (jobs, cpus_said)
        if count > 1:
            extra = [Pair(self, k, True) for k in range(1, count)]
            for pair in extra:
                if pair.ready(READY_S):
                    pairs.append(pair)
                else:
                    pair.kill()
                    pair.stop()
                    self.say(
                        "stream %d: %s refused its own connection (%s)"
                        % (pair.number + 1, " and ".join(pair.refused), pair.why())
                    )
            if len(pairs) < count:
                got = first.split(len(pairs)) if len(pairs) > 1 else 1
                for pair in pairs[got:]:
                    pair.stop()
                why = "%d stream%s instead of %d: %d extra connection%s refused" % (
                    got,
                    "s" if got > 1 else "",
                    count,
                    count - len(pairs),
                    "s" if count - len(pairs) > 1 else "",
                )
                pairs, count = pairs[:got], got
            else:
                why = ""
        if count > 1:
            self.say(
                "%d streams side by side (the fewest jobs of here %d, %s %d, %s %d: %s; %s), "
                "stream 1 over the run's ssh connections, the others over their own%s"
                % (
                    count,
                    self.jobs,
                    self.src.name,
                    first.src_jobs or 0,
                    self.dst.name,
                    first.dst_jobs or 0,
                    (
                        "compression auto's model chose %d" % self.chosen
                        if self.chosen
                        else "one stream per two"
                    ),
                    cpus_said,
                    "; " + why if why else "",
                )
            )
        else:
            self.say("1 stream (%s)" % why if "instead" not in why else why)
        return self._go(pairs)

    def _go(self, pairs: List[Pair]) -> int:
        count = len(pairs)
        self.merged = sender.Merged(count, sys.stdout, self.compression) if count > 1 else Through()
        failed: List[int] = []
        mutex = threading.Lock()
        codes: List[List[int]] = [[] for _ in range(count)]

        def wait(slot: int) -> None:
            pair = pairs[slot]
            codes[slot] = [pair.src.wait(), pair.dst.wait()]
            for thread in pair.threads:
                thread.join()
            if any(codes[slot]):
                with mutex:
                    failed.append(slot)
                    if len(failed) == 1:
                        for other in pairs:  # one stream failed: the others are stopped
                            other.kill()

        for index, pair in enumerate(pairs):
            pair.go(index, count)
        threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        said = []
        lost: List[str] = []
        for index in range(count):
            why = "; ".join(
                "%s %s" % (label, stream.exit_words(c))
                for label, c in zip(
                    ("pack on %s" % self.src.name, "unpack on %s" % self.dst.name), codes[index]
                )
                if c
            )
            if why and pairs[index].stopped and index != (failed or [-1])[0]:
                why = "stopped here (another stream failed)"
            elif why:
                # ssh's 255: the connection to that host closed (a killed sshd, a cut link), or
                # the far command died of a signal: the runbook tells them apart (is the
                # host's connection still up?) and says which (`lost`: the hosts)
                lost += [
                    end.name
                    for end, c in zip((self.src, self.dst), codes[index])
                    if c == 255 and end.ssh and end.name not in lost
                ]
            if why:
                said.append(("stream %d/%d: " % (index + 1, count) if count > 1 else "") + why)
                if not self.merged.done[index]:  # its receiving end said nothing of it
                    self.merged.done[index] = ["failed", why]
        self.merged.answer(
            failed[0] if failed else None, {"lost": " ".join(lost)} if lost else None
        )
        if said:
            sys.stderr.write("rbkit engine relay: %s\n" % "; ".join(said))
            return 1
        return 0


class Through:
    """The one stream's answer, passed on as its receiving end wrote it (Merged's face): its
    progress as it comes, its event and `done` at the end, unless the relay saw the cause itself
    (a connection that closed: `facts` with `lost`); a failed answer of its own when that end
    said none."""

    def __init__(self) -> None:
        self.done: List[Optional[List[str]]] = [None]
        self.heard = False
        self.held: List[str] = []

    def read_file(self, index: int, fh: Any) -> None:
        for raw in fh:
            line = raw.decode("utf-8", "replace")
            if line.startswith("done\t"):
                self.heard = True
                self.done[0] = line.rstrip("\n").split("\t")[1:]
            if line.startswith(("done\t", "event\t", "set\t")) or self.heard:
                self.held.append(line)  # the end of its answer: said in `answer`
                continue
            sys.stdout.write(line)
            sys.stdout.flush()

    def answer(self, first: Optional[int] = None, facts: Optional[dict] = None) -> None:
        got = self.done[0]
        sets = "".join("set\t%s\t%s\n" % kv for kv in sorted((facts or {}).items()))
        if self.heard:
            sys.stdout.write(sets + "".join(self.held))
            sys.stdout.flush()
            return
        if got and got[0] == "failed":
            event = {
                "step": "receive",
                "status": "failed",
                "detail": got[1],
                "duration_s": 0,
                "facts": facts or {},
            }
            sys.stdout.write(
                "%sevent\t%s\ndone\tfailed\t%s\n"
                % (sets, json.dumps(event, sort_keys=True, separators=(",", ":")), got[1])
            )
            sys.stdout.flush()
        elif self.held:
            sys.stdout.write("".join(self.held))
            sys.stdout.flush()


def gate_send(root: str, names: str, compression: str, prefix: str, jobs: int) -> int:
    """`engine send --gate PREFIX`: say ready, then split (`split N`: the parts in PREFIX.N/)
    as asked, and send what `go I N` names. 3: told nothing (stopped)."""
    import shutil

    sys.stderr.write("%s ready %d %s\n" % (GATE, jobs, cpus.token(cpus.usable())))
    sys.stderr.flush()
    while True:
        words = read_line(0).split()
        if words[:1] == ["split"] and len(words) == 2 and words[1].isdigit():
            count = int(words[1])
            into = "%s.%d" % (prefix, count)
            shutil.rmtree(into, ignore_errors=True)
            os.mkdir(into, 0o700)
            parts = (
                sender.split_names(names, count, into, streams.STREAMS_MIN_BYTES)
                if count > 1
                else None
            )
            sys.stderr.write("%s parts %d\n" % (GATE, len(parts) if parts else 1))
            sys.stderr.flush()
            continue
        if words[:1] == ["go"] and len(words) == 3 and all(w.isdigit() for w in words[1:]):
            index, count = int(words[1]), int(words[2])
            if count > 1:
                names = os.path.join("%s.%d" % (prefix, count), "names.%d" % index)
            return sender.send(root, names, compression)
        return 3


def gate_receive(jobs: int) -> Optional[tuple]:
    """`engine receive --gate`: say ready on stdout, then the part `go I N` names: (I, N), None
    for the one stream; False when told nothing (stopped)."""
    sys.stdout.write("gate\tready\t%d\t%s\n" % (jobs, cpus.token(cpus.usable())))
    sys.stdout.flush()
    words = read_line(0).split()
    if words[:1] == ["go"] and len(words) == 3 and all(w.isdigit() for w in words[1:]):
        index, count = int(words[1]), int(words[2])
        return (index, count) if count > 1 else None
    return False
