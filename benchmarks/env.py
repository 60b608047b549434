"""The bench: lab hosts, the ext4 scratch disk, the payloads, shell helpers, tools, link shaping.

Everything a row needs lives on one `Env`. Destinations are written to the lab's loop-mounted ext4
(this machine's root file system has no journal; see docs/testing-lab.md). Network traffic goes only
to the lab's own namespace addresses.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.lab import Ext4Mount, Lab, build_payload, ensure_packages

from .tree import source_manifest

AES = "aes128-gcm@openssh.com"
# the runbook's own cipher list (compiler/resolve.py SSH_CIPHERS); imported when it is there
try:
    from compiler.resolve import SSH_CIPHERS as RUNBOOK_CIPHERS
except ImportError:  # pragma: no cover - the compiler is always in this repo
    RUNBOOK_CIPHERS = f"{AES},aes256-gcm@openssh.com,chacha20-poly1305@openssh.com"

# tools a row may need -> the Debian package that ships them
PACKAGES = {"rsync": "rsync", "b3sum": "b3sum", "xxh128sum": "xxhash"}


def log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} bench: {msg}", file=sys.stderr, flush=True)


@dataclass
class PayloadInfo:
    kind: str
    root: Path  # the venv
    stream_bytes: int  # bytes of `tar cf - -C root .`
    file_bytes: int  # sum of regular file sizes
    files: int
    entries: int
    links: int


def ensure_tools(tools: list[str], install: bool) -> dict[str, str]:
    """Install the Debian packages of missing tools (one apt-get call). Returns {tool: why missing}
    for those still missing afterwards."""
    missing = [t for t in tools if shutil.which(t) is None]
    if not missing:
        return {}
    pkgs = sorted({PACKAGES[t] for t in missing})
    if not install:
        return {
            t: f"{t} is not installed (apt-get install {PACKAGES[t]}; --no-install given)"
            for t in missing
        }
    log(f"installing {' '.join(pkgs)} with apt-get for the rows that use {', '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    argv = [
        "apt-get",
        "-q",
        "-y",
        "-o",
        "Dpkg::Use-Pty=0",
        "install",
        "--no-install-recommends",
        *pkgs,
    ]
    out = ""
    for attempt in range(2):
        r = subprocess.run(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        out = (r.stdout + r.stderr)[-400:]
        if r.returncode == 0 or attempt:
            break
        subprocess.run(
            ["apt-get", "-q", "update"],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    return {
        t: f"{t} is missing and apt-get install {PACKAGES[t]} failed: {out.strip()}"
        for t in missing
        if shutil.which(t) is None
    }


class Env:
    """The lab, the scratch disk and the payloads for one benchmark run."""

    def __init__(self, *, kinds: tuple[str, ...], scratch_mib: int = 16384) -> None:
        self.kinds = kinds
        self.scratch_mib = scratch_mib
        self.lab: Lab | None = None
        self.disk: Ext4Mount | None = None
        self.work = Path(tempfile.mkdtemp(prefix="rbbench-"))
        self.payloads: dict[str, PayloadInfo] = {}
        self.missing: dict[str, str] = {}
        self.shaped: str = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self, install: bool) -> Env:
        ensure_packages()
        self.missing = ensure_tools(["rsync", "b3sum", "xxh128sum"], install)
        for why in self.missing.values():
            log(why)
        for kind in self.kinds:
            t0 = time.monotonic()
            p = build_payload(kind)
            built = "" if p.build_seconds is None else f" (built in {p.build_seconds:.0f} s)"
            self.payloads[kind] = self._describe(kind, p.venv)
            info = self.payloads[kind]
            log(
                f"payload {kind}: {p.venv}{built}; {info.files} files, {info.links} symlinks, "
                f"{info.stream_bytes / 1e6:.0f} MB tar stream ({time.monotonic() - t0:.1f} s)"
            )
        self.disk = Ext4Mount(self.scratch_mib)
        self.disk.mount()
        self.lab = Lab(("src", "dst"), prefix="rbbench")
        self.lab.start()
        log(
            f"lab up: src {self.lab.host('src').addr}, dst {self.lab.host('dst').addr}; "
            f"scratch ext4 at {self.disk.path}"
        )
        return self

    def stop(self) -> None:
        if self.lab is not None:
            self.lab.stop()
        if self.disk is not None:
            self.disk.unmount()
        shutil.rmtree(self.work, ignore_errors=True)

    def _describe(self, kind: str, root: Path) -> PayloadInfo:
        r = self.sh(f"tar cf - -C {q(root)} . | wc -c", timeout=300)
        m = source_manifest(root)
        t = m["totals"]
        return PayloadInfo(
            kind, root, int(r.stdout.split()[0]), t["bytes"], t["files"], t["entries"], t["links"]
        )

    # ------------------------------------------------------------------ helpers
    @property
    def scratch(self) -> Path:
        assert self.disk is not None
        return self.disk.path

    def ssh(self, cipher: str | None = AES, mux: bool = False) -> str:
        """`ssh -F CONFIG [-c CIPHER] [multiplexing]` as shell words."""
        assert self.lab is not None
        words = ["ssh", "-F", str(self.lab.ssh_config)]
        if cipher:
            words += ["-c", cipher]
        if mux:
            words += [
                "-o",
                "ControlMaster=auto",
                "-o",
                f"ControlPath={self.work}/mux-%C",
                "-o",
                "ControlPersist=600",
            ]
        return shlex.join(words)

    def sh(self, cmd: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a bash command line (pipefail on); raise nothing, return the process."""
        return run_bounded(["bash", "-o", "pipefail", "-c", cmd], timeout=timeout)

    def fresh(self, path: Path) -> None:
        """Remove `path` (a row's directory) and make it again, empty, so the next run starts from
        nothing; the scratch disk is flushed by the caller once the row is set up."""
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)

    def flush(self) -> None:
        """Write back the scratch disk's dirty pages, so one run's writeback is not timed in the
        next."""
        subprocess.run(["sync", "-f", str(self.scratch)], check=False, timeout=300)

    # ------------------------------------------------------------------ link shaping
    def shape(self, spec: str) -> str:
        """Shape every lab link to RATE (tc tbf), optionally with a one-way DELAY (netem), e.g.
        "1gbit" or "1gbit,5ms". Applied on egress where the data flows: src's eth0 (src -> here),
        this machine's end of dst's link (here -> dst), and src's end of a direct link."""
        m = re.fullmatch(r"(\d+(?:\.\d+)?[kmg]?bit)(?:,(\d+(?:\.\d+)?ms))?", spec.strip().lower())
        if not m:
            raise SystemExit(f"--shape: {spec!r} is not RATE[,DELAY] like 1gbit or 1gbit,5ms")
        self.shaped = spec
        self._shape_spec = (m.group(1), m.group(2))
        self.apply_shape()
        return spec

    def apply_shape(self) -> None:
        if not self.shaped:
            return
        assert self.lab is not None
        rate, delay = self._shape_spec
        targets = [("src", "eth0"), (None, self.lab.host("dst").veth_root)]
        for (a, _b), k in self.lab.links.items():
            targets.append((a, f"rbd{k}"))
        for ns_host, dev in targets:
            prefix = (
                [] if ns_host is None else ["ip", "netns", "exec", self.lab.host(ns_host).netns]
            )
            subprocess.run(
                [*prefix, "tc", "qdisc", "del", "dev", dev, "root"],
                capture_output=True,
                check=False,
            )
            if delay:
                cmds = [
                    [
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "handle",
                        "1:",
                        "netem",
                        "delay",
                        delay,
                        "limit",
                        "100000",
                    ],
                    [
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "parent",
                        "1:",
                        "handle",
                        "10:",
                        "tbf",
                        "rate",
                        rate,
                        "burst",
                        "1mb",
                        "latency",
                        "100ms",
                    ],
                ]
            else:
                cmds = [
                    [
                        "tc",
                        "qdisc",
                        "add",
                        "dev",
                        dev,
                        "root",
                        "tbf",
                        "rate",
                        rate,
                        "burst",
                        "1mb",
                        "latency",
                        "100ms",
                    ]
                ]
            for c in cmds:
                r = subprocess.run([*prefix, *c], capture_output=True, text=True, check=False)
                if r.returncode != 0:
                    hint = (
                        " (this kernel has no netem: shape with a RATE alone)"
                        if "netem" in c and "unknown" in r.stderr
                        else ""
                    )
                    raise SystemExit(
                        f"--shape: {shlex.join(c)} failed on {dev}: {r.stderr.strip()}{hint}"
                    )


def run_bounded(
    argv: list[str], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv in its own process group; past `timeout`, end that group (the pipeline's ssh and tar
    too, not only the shell) and return exit 124 with the reason."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        proc.communicate()
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f} s")


def q(p: object) -> str:
    return shlex.quote(str(p))
