"""The rows of the table: what is timed, what is prepared untimed before it, how its copy is
checked.

A row's `prepare` (untimed) sets up its destination, `run` is timed and returns samples, `check`
(untimed) says whether the destination equals the source, `cleanup` frees the disk. Commands are
bash lines with pipefail, so every stage of a pipeline counts.

Over 600 lines on purpose: one row per way users move a venv, side by side so that each row's
command can be compared with its neighbours'; the rows share the payload and check helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .env import AES, Env, q, run_bounded
from .tree import Verdict, compare, source_manifest

REPO = Path(__file__).resolve().parents[1]
SPEC_EXCLUDES = ("__pycache__", "*.pyc")  # as specs/b300.yaml


@dataclass
class Sample:
    seconds: float
    ok: bool = True
    error: str = ""
    steps: dict[str, float] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    note: str = ""  # said in the table (e.g. a tool's non-zero exit that still copied)


def _tail(text: str, n: int = 300) -> str:
    text = " ".join(text.strip().split())
    return text[-n:]


def timed(env: Env, cmd: str, timeout: float) -> Sample:
    t0 = time.monotonic()
    r = env.sh(cmd, timeout=timeout)
    dt = time.monotonic() - t0
    if r.returncode != 0:
        return Sample(dt, False, f"rc={r.returncode}: {_tail(r.stderr or r.stdout)}")
    return Sample(dt)


class Row:
    """Base row. Subclasses set the attributes and override run (and maybe prepare/check)."""

    id = ""
    group = ""
    label = ""
    payload: str | None = "torch"
    size = "stream"  # bytes for MB/s: "stream" (tar stream), "files" (file bytes), "" none
    limit: str | None = None  # the row whose speed is "the limit" for this one
    quick = False
    warmup = True
    repeat: int | None = None  # at most this many timed runs (None: every round)
    timeout = 300.0
    needs: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    default = True  # False: runs only when --only names it

    def setup(self, env: Env) -> None:
        """Once, before the warm-up (e.g. compile the runbook, so every round runs the same
        code)."""

    def dest(self, env: Env) -> Path:
        return env.scratch / self.id / "venv"

    def src(self, env: Env) -> Path:
        assert self.payload is not None
        return env.payloads[self.payload].root

    def prepare(self, env: Env) -> None:
        pass

    def run(self, env: Env) -> list[Sample]:
        raise NotImplementedError

    def check(self, env: Env) -> Verdict | None:
        return None

    def cleanup(self, env: Env) -> None:
        pass

    def nbytes(self, env: Env) -> int:
        if not self.payload or not self.size:
            return 0
        info = env.payloads[self.payload]
        if self.excludes:
            m = source_manifest(info.root, self.excludes)["totals"]["bytes"]
            return int(m * info.stream_bytes / info.file_bytes) if self.size == "stream" else m
        return info.stream_bytes if self.size == "stream" else info.file_bytes


class CopyRow(Row):
    """A row that copies the payload to its own destination: fresh each run, checked, removed."""

    relocates = False
    mkdir_dest = True

    def prepare(self, env: Env) -> None:
        env.fresh(self.dest(env).parent)
        if self.mkdir_dest:
            self.dest(env).mkdir()
        env.flush()

    def check(self, env: Env) -> Verdict:
        return compare(
            self.src(env),
            self.dest(env),
            excludes=self.excludes,
            relocated_to=str(self.dest(env)) if self.relocates else None,
        )

    def cleanup(self, env: Env) -> None:
        shutil.rmtree(self.dest(env).parent, ignore_errors=True)


# ---------------------------------------------------------------------------------------- the limit
# the runbook's rb::wide_pipe: the pipe on stdout widened to 1 MiB (F_SETPIPE_SZ)
WIDE_PIPE = (
    f"{q(sys.executable)} -S -c 'import fcntl; fcntl.fcntl(1, 1031, 1 << 20)' 2>/dev/null || true"
)


class NullRelay(Row):
    group = "limit"
    size = "stream"

    def __init__(
        self,
        rid: str,
        label: str,
        cipher: str | None,
        *,
        payload: str = "torch",
        plumbing: bool = False,
        quick: bool = False,
        group: str = "limit",
        streams: int = 1,
        default: bool = True,
    ) -> None:
        self.id, self.label, self.cipher, self.payload = rid, label, cipher, payload
        self.plumbing, self.quick, self.group = plumbing, quick, group
        self.streams, self.default = streams, default

    def run(self, env: Env) -> list[Sample]:
        n = env.payloads[self.payload].stream_bytes
        ssh = env.ssh(self.cipher, mux=self.plumbing)
        if self.streams > 1:
            # N pairs side by side, each its own two fresh connections and 1 MiB pipe, each
            # moving its share of the N bytes (the relay's streams: rbkit engine relay)
            part = -(-n // self.streams)
            pairs = " & ".join(
                f"{{ {{ {WIDE_PIPE}; {ssh} src 'head -c {part} /dev/zero'; }} | "
                f"{ssh} dst 'cat >/dev/null'; }}"
                for _ in range(self.streams)
            )
            return [timed(env, f"{pairs} & wait", self.timeout)]
        if self.plumbing:  # the masters are up before the clock starts, as in the runbook
            for h in ("src", "dst"):
                env.sh(f"{ssh} {h} true", timeout=30)
            # and the pipe between the two clients widened to 1 MiB, as rb::wide_pipe does
            return [
                timed(
                    env,
                    f"{{ {WIDE_PIPE}; {ssh} src 'head -c {n} /dev/zero'; }} | "
                    f"{ssh} dst 'cat >/dev/null'",
                    self.timeout,
                )
            ]
        return [
            timed(
                env, f"{ssh} src 'head -c {n} /dev/zero' | {ssh} dst 'cat >/dev/null'", self.timeout
            )
        ]


class OneLink(Row):
    group = "limit"

    def __init__(self, rid: str, label: str, cipher: str | None, quick: bool = False) -> None:
        self.id, self.label, self.cipher, self.quick = rid, label, cipher, quick

    def run(self, env: Env) -> list[Sample]:
        n = env.payloads["torch"].stream_bytes
        return [
            timed(
                env,
                f"head -c {n} /dev/zero | {env.ssh(self.cipher)} dst 'cat >/dev/null'",
                self.timeout,
            )
        ]


class LocalTar(CopyRow):
    group = "limit"
    id = "limit.local-tar"
    label = "tar c | tar x on this machine, no ssh (reads + writes alone)"

    def run(self, env: Env) -> list[Sample]:
        return [
            timed(
                env,
                f"tar cf - -C {q(self.src(env))} . | tar xf - -C {q(self.dest(env))}",
                self.timeout,
            )
        ]


# ------------------------------------------------------------------------------------ the runbook
HOST = """  {name}:
    ssh: root@{addr}
    identity_file: {identity}
    options: {{UserKnownHostsFile: {known_hosts}, GlobalKnownHostsFile: /dev/null}}
"""


class RunbookRow(Row):
    """Our runbook, compiled from a spec for the lab hosts, run whole; step times from report.json.
    state: "fresh" (nothing at the destination), "same" (an identical install: a re-run),
    "one" (an install with one small file changed)."""

    group = "runbook"
    size = "stream"

    def __init__(
        self,
        rid: str,
        label: str,
        *,
        compression: str = "none",
        verify: str = "sha256",
        route: str = "relay",
        excludes: tuple[str, ...] = (),
        payload: str = "torch",
        state: str = "fresh",
        dest_key: str | None = None,
        quick: bool = False,
        warmup: bool = False,
        group: str = "runbook",
        default: bool = True,
        extra: dict[str, str] | None = None,
        repeat: int | None = None,
        drop: bool = False,
        jobs: int = 2,
    ) -> None:
        self.id, self.label, self.payload, self.quick = rid, label, payload, quick
        self.compression, self.verify, self.route, self.excludes = (
            compression,
            verify,
            route,
            excludes,
        )
        self.state, self.dest_key, self.warmup, self.group = state, dest_key or rid, warmup, group
        self.default, self.extra, self.repeat = default, extra or {}, repeat
        self.drop = drop  # a re-run row that removes the install it re-ran after its round
        self.jobs = jobs  # 2: one stream; 4: two relay streams; 8: four (stream_count)
        self.script: Path | None = None
        self.runs = 0

    def dest(self, env: Env) -> Path:
        return env.scratch / self.dest_key / "venv"

    def spec(self, env: Env) -> str:
        lab = env.lab
        assert lab is not None
        hosts = "".join(
            HOST.format(
                name=n, addr=lab.host(n).addr, identity=lab.identity, known_hosts=lab.known_hosts
            )
            for n in ("src", "dst")
        )
        direct = ""
        if self.route == "direct":
            addr = lab.allow("src", "dst")
            env.apply_shape()
            direct = (
                f"  direct:\n    ssh: root@{addr}\n    identity_file: {lab.identity}\n"
                f"    options: {{UserKnownHostsFile: {lab.known_hosts}}}\n"
            )
        excl = json.dumps(list(self.excludes))
        from compiler.spec import Transfer

        for key in self.extra:
            if key not in Transfer.model_fields:
                raise RuntimeError(f"this compiler's transfer: has no {key!r} key")
        extra = "".join(f"  {k}: {v}\n" for k, v in self.extra.items())
        return (
            f"name: bench\ndescription: benchmark row {self.id}\nhosts:\n{hosts}transfer:\n"
            f"  from: src:{self.src(env)}\n  to: dst:{self.dest(env)}\n  route: {self.route}\n"
            f"  compression: {self.compression}\n  verify: {self.verify}\n  on_existing: replace\n"
            f"  exclude: {excl}\n  jobs: {self.jobs}\n{extra}{direct}"
        )

    def compile(self, env: Env) -> Path:
        from compiler import cli

        if self.script is None:
            d = env.work / self.id
            d.mkdir(parents=True, exist_ok=True)
            (d / "bench.yaml").write_text(self.spec(env))
            with open(os.devnull, "w") as null:
                old = sys.stdout
                sys.stdout = null
                try:
                    rc = cli.main([str(d / "bench.yaml"), "-o", str(d)])
                finally:
                    sys.stdout = old
            if rc != 0:
                raise RuntimeError(f"{self.id}: compile failed with exit {rc}")
            self.script = d / "bench.sh"
        return self.script

    def _run_once(self, env: Env) -> Sample:
        script = self.compile(env)
        self.runs += 1
        # one run directory per destination, as runs/NAME is for a user's runbook: what a run
        # leaves there for the next (the source audit's record) is there, as it would be
        run_dir = env.work / "runs" / self.dest_key
        (run_dir / "report.json").unlink(missing_ok=True)
        envv = dict(os.environ, RB_RUN_DIR=str(run_dir))
        t0 = time.monotonic()
        r = run_bounded(["bash", str(script)], cwd=script.parent, env=envv, timeout=self.timeout)
        rc, err = r.returncode, r.stderr
        dt = time.monotonic() - t0
        steps: dict[str, float] = {}
        details: dict[str, str] = {}
        report = run_dir / "report.json"
        if report.exists():
            doc = json.loads(report.read_text())
            steps = {s["id"]: s["duration_s"] for s in doc.get("steps", [])}
            details = {s["id"]: str(s.get("detail", ""))[:160] for s in doc.get("steps", [])}
            transfer = next((s for s in doc.get("steps", []) if s["id"] == "transfer"), {})
            if "skipped" in str(transfer.get("detail", "")):
                steps["transfer_skipped"] = 1.0
            if doc.get("outcome") != "ok" and rc == 0:
                rc = 1
        if rc != 0:
            lines = [
                ln for ln in err.splitlines() if "FAILED" in ln or "ERROR" in ln
            ] or err.splitlines()
            return Sample(
                dt, False, f"runbook exit {rc}: {_tail(' | '.join(lines[-3:]))}", steps, details
            )
        return Sample(dt, True, "", steps, details)

    def setup(self, env: Env) -> None:
        self.compile(env)

    def _installed(self, env: Env) -> bool:
        return (self.dest(env) / ".rb-manifest.jsonl").is_file()

    def prepare(self, env: Env) -> None:
        self.compile(env)
        if self.state == "fresh":
            env.fresh(self.dest(env).parent)
        else:
            if not self._installed(env):
                env.fresh(self.dest(env).parent)
                s = self._run_once(env)
                if not s.ok:
                    raise RuntimeError(
                        f"{self.id}: the untimed install before the re-run failed: {s.error}"
                    )
            if self.state == "one":
                change_one_file(env, self.payload or "torch", self.dest(env))
        env.flush()

    def run(self, env: Env) -> list[Sample]:
        return [self._run_once(env)]

    def check(self, env: Env) -> Verdict:
        return compare(
            self.src(env), self.dest(env), excludes=self.excludes, relocated_to=str(self.dest(env))
        )

    def cleanup(self, env: Env) -> None:
        if self.state == "fresh" or self.drop:
            shutil.rmtree(self.dest(env).parent, ignore_errors=True)


class ResumeRow(RunbookRow):
    """Issue 34: the move cut at about half (untimed: the receiving end on dst killed, kill -9,
    once the staging holds `at` of the tree), then the re-run that continues it, timed. Compare
    with runbook.relay.none, the whole move, of the same round."""

    def __init__(self, rid: str, label: str, at: float = 0.5, **kw) -> None:
        super().__init__(rid, label, **kw)
        self.at = at
        self.cut_note = ""

    def prepare(self, env: Env) -> None:
        import subprocess

        from tests.lab.netlab import netns_pids

        script = self.compile(env)
        env.fresh(self.dest(env).parent)
        staging = self.dest(env).parent / ".venv.rb-staging"
        total = env.payloads[self.payload or "torch"].file_bytes
        run_dir = env.work / "runs" / self.dest_key
        envv = dict(os.environ, RB_RUN_DIR=str(run_dir))
        t0 = time.monotonic()
        proc = subprocess.Popen(
            ["bash", str(script)],
            cwd=script.parent,
            env=envv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cut = 0
        while proc.poll() is None and time.monotonic() - t0 < self.timeout:
            got = (
                sum(
                    p.lstat().st_size
                    for p in staging.rglob("*")
                    if p.is_file() and not p.is_symlink()
                )
                if staging.is_dir()
                else 0
            )
            if got >= self.at * total:
                for pid in netns_pids(env.lab.host("dst").netns):
                    try:
                        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    except OSError:
                        continue
                    if b"engine" in argv and b"receive" in argv:
                        os.kill(pid, 9)
                        cut = got
                if cut:
                    break
            time.sleep(0.02)
        proc.wait(timeout=self.timeout)
        if not cut or proc.returncode == 0:
            raise RuntimeError(f"{self.id}: the move was not cut (it ended first)")
        self.cut_note = "cut at %.0f%% after %.1f s" % (100.0 * cut / total, time.monotonic() - t0)
        env.flush()

    def run(self, env: Env) -> list[Sample]:
        s = self._run_once(env)
        s.note = self.cut_note
        manifest = s.details.get("manifest", "")
        if s.ok and "resumed" not in manifest:
            return [
                Sample(
                    s.seconds, False, f"the re-run did not resume: {manifest}", s.steps, s.details
                )
            ]
        return [s]

    def cleanup(self, env: Env) -> None:
        shutil.rmtree(self.dest(env).parent, ignore_errors=True)


def small_file(env: Env, payload: str) -> str:
    """A small regular file of the payload (deterministic): the one-file change of the re-run
    rows."""
    entries = source_manifest(env.payloads[payload].root)["entries"]
    for rel in sorted(entries):
        e = entries[rel]
        if (
            e["t"] == "f"
            and "/site-packages/" in rel
            and 200 <= e["s"] <= 4096
            and rel.endswith(".py")
            and "__pycache__" not in rel
        ):
            return rel
    raise RuntimeError("no small .py file in the payload")


def change_one_file(env: Env, payload: str, root: Path) -> None:
    """Append a comment line to the chosen small file under root (its size and mtime change)."""
    path = root / small_file(env, payload)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"# changed by the benchmark at {time.time():.3f}\n")


# ------------------------------------------------------------------------------------------ peers
class PeerRow(CopyRow):
    """A peer's shell command, timed; with state "one" it keeps its copy between rounds."""

    state = "fresh"

    def command(self, env: Env) -> str:
        raise NotImplementedError

    def first_copy(self, env: Env) -> None:
        """The untimed full copy a re-run row starts from."""
        s = timed(env, self.command(env), self.timeout)
        if not s.ok:
            raise RuntimeError(f"{self.id}: the untimed first copy failed: {s.error}")

    def run(self, env: Env) -> list[Sample]:
        return [timed(env, self.command(env), self.timeout)]

    def cleanup(self, env: Env) -> None:
        if self.state == "fresh":
            super().cleanup(env)


class Seed(PeerRow):
    """The hand-typed pipeline: ssh src "tar c" | ssh dst "tar x"."""

    group = "peers"

    def __init__(
        self,
        rid: str,
        label: str,
        *,
        cipher: str | None = None,
        comp: str = "",
        payload: str = "torch",
        state: str = "fresh",
        quick: bool = False,
        group: str = "peers",
        warmup: bool = False,
        repeat: int | None = None,
    ) -> None:
        self.id, self.label, self.cipher, self.comp = rid, label, cipher, comp
        self.payload, self.state, self.quick, self.group = payload, state, quick, group
        self.warmup, self.repeat = warmup, repeat

    def command(self, env: Env) -> str:
        ssh = env.ssh(self.cipher)
        src, dst = q(self.src(env)), q(self.dest(env))
        if self.comp == "lz4":
            return (
                f"{ssh} src {q(f'tar cf - -C {src} . | lz4 -q -1 -c')} | "
                f"{ssh} dst {q(f'lz4 -q -d -c | tar xf - -C {dst}')}"
            )
        return f"{ssh} src {q(f'tar cf - -C {src} .')} | {ssh} dst {q(f'tar xf - -C {dst}')}"

    def prepare(self, env: Env) -> None:
        if self.state == "fresh":
            super().prepare(env)
            return
        if not self.dest(env).is_dir():  # the first time: an untimed full copy
            super().prepare(env)
            self.first_copy(env)
        change_one_file(env, self.payload or "torch", self.dest(env))
        env.flush()


class Rsync2Hop(PeerRow):
    """rsync -a src -> a directory on this machine -> dst (src cannot reach dst)."""

    group = "peers"
    needs = ("rsync",)

    def __init__(
        self,
        rid: str,
        label: str,
        *,
        payload: str = "torch",
        state: str = "fresh",
        quick: bool = False,
        group: str = "peers",
    ) -> None:
        self.id, self.label, self.payload, self.state = rid, label, payload, state
        self.quick, self.group, self.warmup = quick, group, False

    def hop(self, env: Env) -> Path:
        return env.scratch / self.id / "hop"

    def command(self, env: Env) -> str:
        e = q(env.ssh(None))
        src, hop, dst = self.src(env), self.hop(env), self.dest(env)
        return (
            f"rsync -a -e {e} src:{q(f'{src}/')} {q(f'{hop}/')} && "
            f"rsync -a -e {e} {q(f'{hop}/')} dst:{q(f'{dst}/')}"
        )

    def prepare(self, env: Env) -> None:
        if self.state == "fresh" or not self.dest(env).is_dir():
            super().prepare(env)
            self.hop(env).mkdir()
            if self.state != "fresh":
                self.first_copy(env)
        if self.state == "one":
            change_one_file(env, self.payload or "torch", self.hop(env))
            change_one_file(env, self.payload or "torch", self.dest(env))
        env.flush()


class Scp3(CopyRow):
    group = "peers"
    id = "peer.scp"
    label = "scp -3 -r (through this machine)"
    warmup = False
    repeat = 1
    timeout = 420.0
    mkdir_dest = False

    def run(self, env: Env) -> list[Sample]:
        """Timed to its end; a non-zero exit that still left a copy is a note (the check judges the
        copy), not a failed run: users see the time and the broken tree."""
        assert env.lab is not None
        cmd = (
            f"scp -3 -r -q -F {q(env.lab.ssh_config)} src:{q(self.src(env))} "
            f"dst:{q(self.dest(env))}"
        )
        s = timed(env, cmd, self.timeout)
        if not s.ok and self.dest(env).is_dir() and not s.error.startswith("rc=124"):
            first = s.error.split(":", 1)[1].strip().replace(str(self.src(env)), "SRC")
            first = first.split(" scp: ")[0][:140]
            return [
                Sample(s.seconds, True, note=f"scp exit {s.error.split(':', 1)[0][3:]}: {first}")
            ]
        return [s]


# ----------------------------------------------------------------------------------- verification
class KitManifest(Row):
    """The kit's manifest CLI, as the runbook runs it on a host (here, with this venv's python)."""

    group = "verify"
    size = "files"

    def __init__(
        self, rid: str, label: str, algo: str, mode: str = "build", quick: bool = False
    ) -> None:
        self.id, self.label, self.algo, self.mode, self.quick = rid, label, algo, mode, quick
        self.out: Path | None = None

    def prepare(self, env: Env) -> None:
        self.out = env.work / f"{self.id}.jsonl"
        if self.mode == "verify":
            copy = env.scratch / "verify-copy" / "venv"
            if not copy.is_dir():
                copy.mkdir(parents=True)
                env.sh(f"tar cf - -C {q(self.src(env))} . | tar xf - -C {q(copy)}", timeout=300)
                env.flush()
            if not self.out.exists():
                env.sh(self._build_cmd(env), timeout=300)

    def _build_cmd(self, env: Env) -> str:
        return (
            f"cd {q(REPO)} && {q(sys.executable)} -m rbkit manifest build "
            f"{q(self.src(env))} --algo {self.algo} --jobs 2 --out {q(self.out)}"
        )

    def run(self, env: Env) -> list[Sample]:
        if self.mode == "verify":
            copy = env.scratch / "verify-copy" / "venv"
            return [
                timed(
                    env,
                    f"cd {q(REPO)} && {q(sys.executable)} -m rbkit manifest verify "
                    f"{q(copy)} {q(self.out)} --jobs 2 >/dev/null",
                    self.timeout,
                )
            ]
        return [timed(env, self._build_cmd(env), self.timeout)]


class HashLib(Row):
    """hashlib over every regular file, one thread, in this process (the kit's digest())."""

    group = "verify"
    size = "files"

    def __init__(self, algo: str, quick: bool = False) -> None:
        self.id, self.algo, self.quick = f"hash.hashlib.{algo}", algo, quick
        self.label = f"hashlib {algo}, one thread, every file"
        self.result: dict[str, str] = {}

    def run(self, env: Env) -> list[Sample]:
        from rbkit import filehash

        root = self.src(env)
        files = [rel for rel, e in source_manifest(root)["entries"].items() if e["t"] == "f"]
        t0 = time.monotonic()
        self.result = {rel: filehash.digest(os.path.join(root, rel), self.algo) for rel in files}
        return [Sample(time.monotonic() - t0)]

    def check(self, env: Env) -> Verdict | None:
        if self.algo != "sha256":
            return None
        return _same_digests(env, self.result)


class HashTool(Row):
    """A command-line hasher over every regular file: find -print0 | xargs -0 TOOL."""

    group = "verify"
    size = "files"

    def __init__(self, tool: str, quick: bool = False) -> None:
        self.id, self.tool, self.quick, self.needs = f"hash.{tool}", tool, quick, (tool,)
        self.label = f"{tool} (find | xargs), every file"
        self.out: Path | None = None

    def run(self, env: Env) -> list[Sample]:
        self.out = env.work / f"{self.id}.txt"
        root = self.src(env)
        return [
            timed(
                env,
                f"cd {q(root)} && find . -type f -print0 | xargs -0 {self.tool} >{q(self.out)}",
                self.timeout,
            )
        ]

    def check(self, env: Env) -> Verdict | None:
        if self.tool != "sha256sum" or self.out is None:
            return None
        got = {}
        for line in self.out.read_text().splitlines():
            h, _, path = line.partition("  ")
            got[path[2:]] = h
        return _same_digests(env, got)


def _same_digests(env: Env, got: dict[str, str]) -> Verdict:
    entries = source_manifest(env.payloads["torch"].root)["entries"]
    want = {rel: e["h"] for rel, e in entries.items() if e["t"] == "f"}
    bad = [rel for rel in want if got.get(rel) != want[rel]]
    if bad or len(got) != len(want):
        return Verdict(
            False,
            f"no: {len(bad)} digests differ from the manifest's, {len(got)} of "
            f"{len(want)} files hashed",
        )
    return Verdict(True, "yes (digests = manifest's)")


# ---------------------------------------------------------------------------------------- compile
class Compile(Row):
    """`compile specs/b300.yaml` as a user runs it (a Python start included), or shellcheck
    alone."""

    group = "compile"
    payload = None
    size = ""
    inner = 3

    def __init__(self, rid: str, label: str, what: str, quick: bool = True, inner: int = 1) -> None:
        self.id, self.label, self.what, self.quick, self.inner = rid, label, what, quick, inner

    def run(self, env: Env) -> list[Sample]:
        out = env.work / "compile"
        out.mkdir(exist_ok=True)
        # as a user's shell runs it: Python keeps the compiler's bytecode (a PYTHONDONTWRITEBYTECODE
        # in this shell would make every run compile the compiler's modules again, ~30 ms)
        py = f"env -u PYTHONDONTWRITEBYTECODE {q(sys.executable)}"
        compile_cmd = f"cd {q(REPO)} && {py} -m compiler specs/b300.yaml -o {q(out)} >/dev/null"
        if self.what == "all":  # every spec of the repository, as `compile specs/` (cache warm)
            env.sh(f"cd {q(REPO)} && {py} -m compiler specs/ -o {q(out)} >/dev/null", timeout=120)
            cmd = f"cd {q(REPO)} && {py} -m compiler specs/ -o {q(out)} >/dev/null"
            return [timed(env, cmd, 120) for _ in range(self.inner)]
        if self.what == "cold":  # the lint cache (if this compiler has one) off: shellcheck runs
            cmd = f"export RB_LINT_CACHE=0 XDG_CACHE_HOME={q(env.work / 'xdg')}; {compile_cmd}"
        elif self.what == "warm":  # the default: a re-compile of an unchanged spec
            cmd = compile_cmd
        else:
            from compiler import lint

            script = out / "b300.sh"
            if not script.exists():
                env.sh(compile_cmd, timeout=120)
            flags = getattr(lint, "FLAGS", None) or (
                "--shell=bash",
                "--severity=style",
                "--enable=all",
                "--exclude=" + ",".join(lint.DISABLED),
                "--format=json1",
            )
            words = " ".join(q(f) for f in flags)
            cmd = f"{q(lint.shellcheck_binary())} {words} {q(script)} >/dev/null"
        return [timed(env, cmd, 120) for _ in range(self.inner)]


# ----------------------------------------------------------------------------------- the catalogue
def catalogue() -> list[Row]:
    """Every row, in the order they run within a round."""
    rows: list[Row] = [
        NullRelay(
            "limit.relay.aes",
            "null relay, aes128-gcm (the runbook's cipher) = THE LIMIT",
            AES,
            quick=True,
        ),
        NullRelay(
            "limit.relay.default",
            "null relay, OpenSSH default cipher (chacha20-poly1305)",
            None,
            quick=True,
        ),
        NullRelay(
            "limit.relay.plumbing",
            "null relay, aes128-gcm, multiplexed, 1 MiB relay pipe (runbook plumbing)",
            AES,
            plumbing=True,
        ),
        OneLink(
            "limit.link.aes",
            "one link alone: head -c N /dev/zero | ssh dst cat, aes128-gcm",
            AES,
            quick=True,
        ),
        LocalTar(),
        # no row leaves a tree it just wrote beside the next row's run: the row timed right after
        # one that did (its install kept for the re-run rows) ran 0.6-1.2 s slower here, in any
        # order (2026-12-05: the same runbook, auto choosing none, 7.15 s after it against 5.98 s)
        RunbookRow(
            "runbook.relay.none",
            "runbook relay, compression none, verify sha256",
            quick=True,
            warmup=True,
        ),
        RunbookRow(
            "runbook.relay.auto",
            "runbook relay, compression auto (the default), sha256",
            compression="auto",
            quick=True,
        ),
        RunbookRow("runbook.relay.lz4", "runbook relay, lz4, sha256", compression="lz4"),
        RunbookRow("runbook.relay.zstd", "runbook relay, zstd, sha256", compression="zstd"),
        RunbookRow(
            "runbook.relay.blake2b", "runbook relay, none, verify blake2b", verify="blake2b"
        ),
        RunbookRow("runbook.relay.noverify", "runbook relay, none, verify none", verify="none"),
        RunbookRow("runbook.direct.none", "runbook direct src->dst, none, sha256", route="direct"),
        # the relay in streams side by side (issue 37): jobs 4 and 8 give 2 and 4 streams, each
        # its own ssh clients here; beside them the null relay in as many fresh pairs
        NullRelay(
            "limit.relay.streams2",
            "null relay, aes128-gcm, 2 pairs side by side (fresh connections, 1 MiB pipes)",
            AES,
            streams=2,
            default=False,
        ),
        NullRelay(
            "limit.relay.streams4",
            "null relay, aes128-gcm, 4 pairs side by side (fresh connections, 1 MiB pipes)",
            AES,
            streams=4,
            default=False,
        ),
        RunbookRow(
            "runbook.relay.streams2",
            "runbook relay, none, sha256, jobs 4: 2 streams",
            jobs=4,
            default=False,
        ),
        RunbookRow(
            "runbook.relay.streams4",
            "runbook relay, none, sha256, jobs 8: 4 streams",
            jobs=8,
            default=False,
        ),
        RunbookRow(
            "runbook.relay.excludes",
            "runbook relay, none, sha256, excludes __pycache__ *.pyc",
            excludes=SPEC_EXCLUDES,
            default=False,
        ),
        Seed(
            "peer.seed",
            "seed: ssh src 'tar c' | ssh dst 'tar x' (default cipher)",
            quick=True,
            warmup=True,
        ),
        Seed("peer.seed.aes", "seed with -c aes128-gcm", cipher=AES),
        Seed(
            "peer.seed.aes.lz4",
            "seed with -c aes128-gcm and lz4 -1",
            cipher=AES,
            comp="lz4",
            quick=True,
        ),  # the best hand pipeline: the target's measure (issue #17)
        Rsync2Hop("peer.rsync", "rsync -a, two hops through this machine (default cipher)"),
        Scp3(),
        RunbookRow(
            "rerun.runbook.same",
            "runbook re-run, destination unchanged (rerun: default)",
            state="same",
            dest_key="rerun.install",
            group="rerun",
            quick=True,
        ),
        RunbookRow(
            "rerun.runbook.digest",
            "runbook re-run, unchanged, rerun: digest (re-hashes both ends)",
            state="same",
            dest_key="rerun.install",
            group="rerun",
            extra={"rerun": "digest"},
        ),
        RunbookRow(
            "rerun.runbook.one",
            "runbook re-run, one small file changed on the destination",
            state="one",
            dest_key="rerun.install",
            group="rerun",
            repeat=2,
            drop=True,
        ),
        ResumeRow(
            "rerun.runbook.resume50",
            "runbook re-run after a relay cut at 50% (resumes; "
            "compare runbook.relay.none, the whole move)",
            dest_key="rerun.resume",
            group="rerun",
            repeat=1,
        ),
        Rsync2Hop(
            "rerun.rsync.one",
            "rsync -a two hops, one small file changed",
            state="one",
            group="rerun",
        ),
        Seed(
            "rerun.seed.one",
            "seed tar relay, one small file changed (re-sends everything)",
            state="one",
            group="rerun",
            repeat=2,
        ),
        KitManifest("verify.manifest.sha256", "manifest build, sha256, 2 jobs (kit CLI)", "sha256"),
        KitManifest(
            "verify.manifest.blake2b", "manifest build, blake2b, 2 jobs (kit CLI)", "blake2b"
        ),
        KitManifest(
            "verify.manifest.none", "manifest build, no digests: walk + lstat (kit CLI)", "none"
        ),
        KitManifest(
            "verify.verify.sha256",
            "manifest verify of a copy, sha256, 2 jobs (kit CLI)",
            "sha256",
            mode="verify",
        ),
        HashLib("sha256", quick=True),
        HashLib("blake2b"),
        HashTool("sha256sum", quick=True),
        HashTool("b3sum"),
        HashTool("xxh128sum"),
        NullRelay(
            "many.limit.relay.aes",
            "null relay, aes128-gcm, many-files byte count (limit)",
            AES,
            payload="many",
            group="many",
        ),
        NullRelay(
            "many.limit.relay.plumbing",
            "null relay, many-files byte count, multiplexed, 1 MiB relay pipe",
            AES,
            payload="many",
            group="many",
            plumbing=True,
        ),
        RunbookRow(
            "many.runbook.relay.none",
            "runbook relay, none, sha256",
            payload="many",
            group="many",
            warmup=True,
        ),
        Seed(
            "many.peer.seed",
            "seed tar relay (default cipher)",
            payload="many",
            group="many",
            warmup=True,
        ),
        Rsync2Hop("many.peer.rsync", "rsync -a, two hops", payload="many", group="many"),
        Compile(
            "compile.b300.cold",
            "compile specs/b300.yaml, lint cache off (RB_LINT_CACHE=0)",
            "cold",
            inner=2,
        ),
        Compile(
            "compile.b300.warm",
            "compile specs/b300.yaml again, lint cache on (the default)",
            "warm",
            inner=2,
        ),
        Compile(
            "compile.all.warm", "compile specs/ (every spec) again, lint cache on", "all", inner=2
        ),
        Compile(
            "compile.shellcheck", "shellcheck alone on b300.sh (the lint's options)", "shellcheck"
        ),
    ]
    for r in rows:
        if r.group != "compile" and r.limit is None and r.payload:
            r.limit = "many.limit.relay.aes" if r.payload == "many" else "limit.relay.aes"
    return rows
