"""The kit: the host-side packages a runbook ships (hostkit/rbkit, hostkit/rbprobes), read as files.

The compiler never imports them: it reads their source through the import system's locations
(`importlib.util.find_spec`, which finds a package without running it), so a checkout, an editable
install and a wheel all give the same files, hence the same runbook byte for byte.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PACKAGES = ("rbkit", "rbprobes")
FANOUT_ONLY = ("rbkit/fanout.py",)


@dataclass(frozen=True)
class KitFile:
    path: str  # "rbkit/manifest.py"
    text: str


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the host-side package {name} is not installed with the compiler")
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=None)
def _all_files() -> tuple[KitFile, ...]:
    files = []
    for name in PACKAGES:
        root = package_dir(name)
        for path in sorted(root.glob("*.py")):
            files.append(KitFile(f"{name}/{path.name}", path.read_text(encoding="utf-8")))
    return tuple(files)


def files(with_fanout: bool = False) -> list[KitFile]:
    """Every Python file of the shipped packages, in a stable order (rbkit/fanout.py only where
    the spec has `fanout:`)."""
    return [f for f in _all_files() if with_fanout or f.path not in FANOUT_ONLY]


def kit_id(with_fanout: bool = False) -> str:
    """The kit's content hash (16 hex digits of the sha256 of every path and text)."""
    h = hashlib.sha256()
    for f in files(with_fanout):
        h.update(f.path.encode() + b"\0" + f.text.encode() + b"\0")
    return h.hexdigest()[:16]


def delimiter(text: str, seed: str) -> str:
    """A heredoc delimiter that no line of `text` equals."""
    base = "RB_PY_" + hashlib.sha256(seed.encode()).hexdigest()[:8].upper()
    word, n = base, 0
    while word in text.split("\n"):
        n += 1
        word = f"{base}_{n}"
    return word
