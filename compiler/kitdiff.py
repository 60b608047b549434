"""A kit change, made reviewable: which files of the pinned kit changed between two kits, by how
many lines, and the diff itself.

    compile --kit-diff OLD NEW     OLD, NEW: a kit's sha256 (or a unique prefix of one), a kit tar's
                                   path, or `current` (the kit this checkout compiles to)

A hash is looked up in the output directory's `.kit/`, then in the git history of that folder (a
kit no runbook pins any more is pruned from `generated/.kit/`, but the commit that pinned it
still holds it). `compile --plan` uses the same comparison when the kit a spec's runbook would pin
differs from the one its committed runbook pins (planmd's "Kit" section).
"""

from __future__ import annotations

import difflib
import io
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from . import kit, plan
from .errors import UsageError

SHA_LINE = re.compile(r"^readonly RB_KIT_SHA256=([0-9a-f]{64})$", re.M)
HEX = re.compile(r"^[0-9a-f]{6,64}$")
MAX_KIT_BYTES = 64 << 20  # a kit tar is under 1 MiB; anything much larger is not one
CURRENT = "current"


@dataclass(frozen=True)
class Kit:
    name: str  # how it is shown: a short hash, or the path given
    files: dict[str, str]  # path in the tar -> text


@dataclass(frozen=True)
class FileChange:
    path: str
    added: int  # lines
    removed: int
    status: str  # "changed", "added", "removed"


def _from_tar(data: bytes, name: str) -> Kit:
    """The regular files of a kit tar, as text (read in memory; nothing is extracted)."""
    files: dict[str, str] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar.getmembers():
                if member.isfile():
                    body = tar.extractfile(member)
                    text = body.read().decode("utf-8", errors="replace") if body else ""
                    files[member.name] = text
    except tarfile.TarError as exc:
        raise UsageError(f"{name}: not a kit tar ({exc})") from exc
    return Kit(name, files)


def _git(args: list[str], cwd: Path) -> Optional[bytes]:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _from_history(sha: str, kit_dir: Path) -> Optional[bytes]:
    """The tar `kit_dir/<sha...>.tar` as the last commit that held it has it (the one that
    removed it holds it no more: its first parent does), or None."""
    if not kit_dir.parent.is_dir():
        return None
    cwd = kit_dir.parent
    revs = _git(["log", "--all", "-m", "--format=%H", "--", f"{plan.KIT_DIR}/{sha}*.tar"], cwd)
    for rev in (revs or b"").decode().split()[:4]:
        for at in (rev, f"{rev}^"):
            listed = _git(["ls-tree", "--name-only", at, "--", f"{plan.KIT_DIR}/"], cwd)
            found = [
                n
                for n in (listed or b"").decode().split()
                if Path(n).name.startswith(sha) and n.endswith(".tar")
            ]
            if len(found) == 1:
                return _git(["show", f"{at}:./{found[0]}"], cwd)
    return None


def load(ref: str, out_dir: Path) -> Kit:
    """The kit `ref` names (see the module's doc); UsageError when none is found."""
    if ref == CURRENT:
        sha, data = kit.pinned()
        return _from_tar(data, f"{sha[:12]} (current)")
    path = Path(ref)
    if path.is_file():
        if path.stat().st_size > MAX_KIT_BYTES:
            raise UsageError(f"{ref}: {path.stat().st_size} bytes: too large to be a kit tar")
        return _from_tar(path.read_bytes(), ref)
    if not HEX.match(ref):
        raise UsageError(
            f"{ref}: neither a kit tar nor a kit's sha256 (6 to 64 hex digits), nor `{CURRENT}`"
        )
    kit_dir = out_dir / plan.KIT_DIR
    here = sorted(kit_dir.glob(f"{ref}*.tar")) if kit_dir.is_dir() else []
    if len(here) > 1:
        raise UsageError(
            f"{ref}: more than one kit in {kit_dir} starts so: " + ", ".join(p.name for p in here)
        )
    if here:
        return _from_tar(here[0].read_bytes(), ref[:12])
    if ref == kit.pinned()[0][: len(ref)]:
        return load(CURRENT, out_dir)
    data = _from_history(ref, kit_dir)
    if data is None:
        raise UsageError(f"{ref}: no kit of that sha256 in {kit_dir} nor in its git history")
    return _from_tar(data, ref[:12])


def changes(old: Kit, new: Kit) -> list[FileChange]:
    """Each file that differs, in path order, with its lines added and removed."""
    out = []
    for path in sorted(set(old.files) | set(new.files)):
        before, after = old.files.get(path), new.files.get(path)
        if before == after:
            continue
        old_lines = before.splitlines() if before is not None else []
        new_lines = after.splitlines() if after is not None else []
        added = removed = 0
        for line in difflib.unified_diff(old_lines, new_lines, lineterm="", n=0):
            if line.startswith("+") and not line.startswith("+++"):
                added += 1
            elif line.startswith("-") and not line.startswith("---"):
                removed += 1
        status = "added" if before is None else "removed" if after is None else "changed"
        out.append(FileChange(path, added, removed, status))
    return out


def summary(old: Kit, new: Kit) -> list[str]:
    """One line a changed file: `rbkit/engine.py: +12 -3`."""
    return [
        f"{c.path}: +{c.added} -{c.removed}" + ("" if c.status == "changed" else f" ({c.status})")
        for c in changes(old, new)
    ]


def diff(old: Kit, new: Kit) -> str:
    """The summary, then a unified diff of every changed file."""
    found = changes(old, new)
    if not found:
        return f"kits {old.name} and {new.name}: the same files\n"
    lines = [
        f"kit {old.name} -> {new.name}: {len(found)} file(s) changed",
        *("  " + line for line in summary(old, new)),
        "",
    ]
    for change in found:
        old_lines = old.files.get(change.path, "").splitlines(keepends=True)
        new_lines = new.files.get(change.path, "").splitlines(keepends=True)
        diff = difflib.unified_diff(old_lines, new_lines, f"a/{change.path}", f"b/{change.path}")
        lines.append("".join(diff).rstrip("\n"))
    return "\n".join(lines) + "\n"


def pinned_by(script: Path) -> Optional[str]:
    """The kit sha256 an existing runbook pins (None: no such runbook, or a standalone one)."""
    if not script.is_file():
        return None
    found = SHA_LINE.search(script.read_text(encoding="utf-8", errors="replace"))
    return found.group(1) if found else None


def plan_section(script: Path, out_dir: Path) -> str:
    """compile --plan's "Kit" section: empty when the committed runbook pins the kit this
    checkout makes (or there is none yet), else which kit files changed and by how many lines."""
    old_sha = pinned_by(script)
    new_sha = kit.pinned()[0]
    if old_sha is None or old_sha == new_sha:
        return ""
    head = (
        f"### Kit\n\nThe kit changes: {script.as_posix()} pins `{old_sha[:12]}`, this "
        f"compile pins `{new_sha[:12]}` (`compile --kit-diff {old_sha[:12]} current` prints "
        "the diff).\n"
    )
    try:
        old = load(old_sha, out_dir)
    except UsageError:
        return head + "\nThe old kit is not here to compare (neither in .kit/ nor in git).\n"
    lines = summary(old, load(CURRENT, out_dir))
    shown = lines[:40] + ([f"... and {len(lines) - 40} more"] if len(lines) > 40 else [])
    return (
        head
        + "\n"
        + "\n".join(f"- `{line.split(': ', 1)[0]}`: {line.split(': ', 1)[1]}" for line in shown)
        + "\n"
    )
