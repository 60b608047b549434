"""Real venvs for the e2e tests to move: built once, cached on disk, reused across test runs.

    p = build_payload("small")    # venv (no pip) + tests/fixtures/payloadpkg (console scripts
                                  # payload-hello, payload-check); a few seconds
    p = build_payload("torch")    # venv with pip + the package + torch==2.13.0 (CPU wheel on this
                                  # disk); about a minute
    p = build_payload("many", many_files=20000)   # "small" + 20,000 small files, for benchmarks
    p.venv, p.python, p.bin("payload-hello")

Cache: <cache_dir>/rb-payload-<kind>-<key>/venv, where key hashes every input (kind, the base
interpreter, the torch pin, the package's files, the file count, FORMAT). A venv holds its own
absolute path (script shebangs, bin/activate), so it cannot be built elsewhere and renamed into
place; instead the build runs under an flock, in its final place, and the entry counts as built only
once the READY file beside the venv exists -- written last, by an atomic rename. An entry without
READY (a killed build) is deleted and rebuilt, never reused. READY is outside the venv, so the
venv's tree is exactly what pip made (plus the many-files tree for "many").

Treat a cached venv as read-only. A test that must change or break its source venv builds its own
with build_payload(kind, dest=PATH) (not cached).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import LabError

FORMAT = 1  # bump to invalidate every cached payload
TORCH_VERSION = "2.13.0"  # never unpinned: that would download a CUDA build
PKG_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "payloadpkg"
KINDS = ("small", "torch", "many")
_PIP_TIMEOUT_S = 600


def default_cache_dir() -> Path:
    return Path(os.environ.get("RB_PAYLOAD_CACHE", "/var/tmp"))


@dataclass(frozen=True)
class Payload:
    """A built venv. build_seconds is None when it came from the cache."""

    kind: str
    key: str
    root: Path  # the cache entry (holds venv/ and READY), or the dest's parent when uncached
    venv: Path
    build_seconds: float | None
    many_files: int = 0

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def bin(self, name: str) -> Path:
        return self.venv / "bin" / name

    @property
    def site_packages(self) -> Path:
        return (
            self.venv
            / "lib"
            / f"python{sys.version_info[0]}.{sys.version_info[1]}"
            / "site-packages"
        )

    @property
    def many_dir(self) -> Path:
        return self.site_packages / "rb_payload_many"


def _pkg_files() -> list[Path]:
    skip = {"__pycache__", "build", "dist"}
    return sorted(
        p
        for p in PKG_DIR.rglob("*")
        if p.is_file()
        and not (skip & set(p.relative_to(PKG_DIR).parts))
        and not any(part.endswith(".egg-info") for part in p.parts)
    )


def payload_key(kind: str, many_files: int = 20000) -> str:
    """sha256 (first 16 hex digits) over everything a build depends on."""
    if kind not in KINDS:
        raise LabError(f"payload kind must be one of {KINDS}, not {kind!r}")
    h = hashlib.sha256()
    base = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    meta = {
        "format": FORMAT,
        "kind": kind,
        "python": sys.version,
        "base": base,
        "torch": TORCH_VERSION if kind == "torch" else None,
        "many": many_files if kind == "many" else None,
        "pip": _with_pip(kind),
    }
    h.update(json.dumps(meta, sort_keys=True).encode())
    for p in _pkg_files():
        h.update(str(p.relative_to(PKG_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _run(argv: list[str], timeout: float = _PIP_TIMEOUT_S) -> None:
    try:
        res = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"timed out after {timeout}s: {' '.join(argv)}") from exc
    if res.returncode != 0:
        raise LabError(
            f"failed (rc={res.returncode}): {' '.join(argv)}\n"
            f"{res.stdout[-3000:]}{res.stderr[-3000:]}"
        )


def _outer_setuptools_builds_wheels() -> bool:
    """True when this interpreter's setuptools has bdist_wheel built in (>= 70.1)."""
    try:
        import setuptools
    except ImportError:
        return False
    parts = setuptools.__version__.split(".")
    try:
        return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0) >= (70, 1)
    except ValueError:
        return False


def _build_pkg_wheel(tmp: Path) -> Path:
    """Build tests/fixtures/payloadpkg into a wheel in tmp, from a copy (no build/ or egg-info in
    the repo). Offline with this interpreter's setuptools when it can; else pip's isolated build."""
    src = tmp / "src-copy"
    shutil.copytree(
        PKG_DIR, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    out = tmp / "wheels"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)]
    if _outer_setuptools_builds_wheels():
        cmd.insert(5, "--no-build-isolation")
    _run(cmd)
    wheels = sorted(out.glob("rb_payload-*.whl"))
    if len(wheels) != 1:
        raise LabError(f"expected one rb_payload wheel in {out}, found {wheels}")
    return wheels[0]


def make_many_files(root: Path, count: int = 20000, *, per_dir: int = 200) -> int:
    """Write count small files under root (deterministic names, sizes and contents; some executable,
    some symlinks to a sibling). Returns the bytes written. About 38 MB for 20,000 files."""
    sizes = (0, 64, 200, 512, 900, 1500, 3000, 4096, 9000, 100)
    root.mkdir(parents=True, exist_ok=True)
    total = 0
    for i in range(count):
        d = root / f"d{i // per_dir:04d}"
        if i % per_dir == 0:
            d.mkdir(exist_ok=True)
        name = d / f"m{i:06d}.py"
        if i % 499 == 498:
            os.symlink(f"m{i - 1:06d}.py", name)
            continue
        line = f"# rb_payload_many file {i}\n".encode()
        size = sizes[i % len(sizes)]
        data = (line * (size // len(line) + 1))[:size]
        name.write_bytes(data)
        if i % 97 == 0:
            name.chmod(0o755)
        total += size
    return total


def _with_pip(kind: str) -> bool:
    """Only the torch venv gets pip (ensurepip costs ~8 s here); the others are pip-less, like the
    venvs `uv venv` makes, and get their packages from this interpreter's pip (`pip --python`)."""
    return kind == "torch"


def _build_into(venv: Path, kind: str, many_files: int) -> None:
    with_pip = _with_pip(kind)
    _run(
        [sys.executable, "-m", "venv", *([] if with_pip else ["--without-pip"]), str(venv)],
        timeout=300,
    )
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip"] if with_pip else [sys.executable, "-m", "pip", "--python", py]
    with tempfile.TemporaryDirectory(prefix="rb-payload-build-") as tmp:
        wheel = _build_pkg_wheel(Path(tmp))
        _run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)])
    if kind == "torch":
        _run([*pip, "install", "-q", f"torch=={TORCH_VERSION}"])
    if kind == "many":
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        make_many_files(site / "rb_payload_many", many_files)


def build_payload(
    kind: str = "small",
    *,
    many_files: int = 20000,
    cache_dir: Path | None = None,
    dest: Path | None = None,
) -> Payload:
    """Return a built venv of this kind: from the cache when there, else built (then cached).
    With dest, build a private, uncached venv at dest (which must not exist)."""
    key = payload_key(kind, many_files)
    n = many_files if kind == "many" else 0
    if dest is not None:
        if dest.exists():
            raise LabError(f"{dest} exists: a private payload is built into a new path")
        dest.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        try:
            _build_into(dest, kind, many_files)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        return Payload(kind, key, dest.parent, dest, time.monotonic() - t0, n)

    cache = cache_dir if cache_dir is not None else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    root = cache / f"rb-payload-{kind}-{key}"
    ready = root / "READY"
    lock_fd = os.open(cache / f"rb-payload-{kind}-{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # a parallel build of the same key waits here
        if ready.is_file():
            return Payload(kind, key, root, root / "venv", None, n)
        shutil.rmtree(root, ignore_errors=True)  # a killed build's leftovers
        if root.exists():
            raise LabError(f"cannot remove the incomplete payload {root}")
        root.mkdir()
        t0 = time.monotonic()
        try:
            _build_into(root / "venv", kind, many_files)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        seconds = time.monotonic() - t0
        tmp_ready = root / ".READY.tmp"
        tmp_ready.write_text(
            json.dumps(
                {
                    "kind": kind,
                    "key": key,
                    "build_seconds": round(seconds, 2),
                    "many_files": n,
                    "python": sys.version.split()[0],
                }
            )
            + "\n"
        )
        os.replace(tmp_ready, ready)
        return Payload(kind, key, root, root / "venv", seconds, n)
    finally:
        with contextlib.suppress(OSError):
            os.close(lock_fd)
