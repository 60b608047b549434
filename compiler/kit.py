"""The kit: the host-side packages a runbook ships (hostkit/rbkit, hostkit/rbprobes,
hostkit/rbrules), the controller-only one it extracts on the machine that runs it (hostkit/rbview,
the pictures), read as files, the runbooks' bash runtime (templates/runtime/, the same in every
runbook) as runtime.sh and the runbook's seal check as seal.py. The pinned tar holds them all; the
tar sent to the hosts is made from the extracted kit's HOST_PACKAGES only (runtime/kit_pinned.sh.j2,
partials/kit_embedded.sh.j2).

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

from rbrules.kittar import tar_bytes as kit_tar

HOST_PACKAGES = ("rbkit", "rbprobes", "rbrules")  # shipped to every host the runbook touches
CONTROLLER_PACKAGES = ("rbview",)  # only extracted here: the run's pictures
PACKAGES = HOST_PACKAGES + CONTROLLER_PACKAGES


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


def files() -> list[KitFile]:
    """Every Python file of the shipped packages, in a stable order: one kit for every runbook."""
    return list(_all_files())


RUNTIME_INLINE = "partials/runtime_inline.sh.j2"
RUNTIME_PINNED = "partials/runtime_pinned.sh.j2"
SEAL_CHECK = "partials/seal_check.py.j2"


@lru_cache(maxsize=None)
def runtime_text() -> str:
    """The runtime's bash, rendered without any spec value: what a --standalone runbook holds in
    place and a default runbook reads from the pinned kit's runtime.sh."""
    from . import render

    # the one value it reads: the kit's packages a host is sent (a runbook's Kit has them too)
    runtime = render.environment().get_template(RUNTIME_INLINE)
    return render.tidy(runtime.render(kit={"host_dirs": HOST_PACKAGES}))


@lru_cache(maxsize=None)
def seal_text() -> str:
    """The seal check (partials/seal_check.py.j2) as the pinned kit's seal.py: the runbook's start
    runs it from the bytes it checked, as it runs runtime.sh (a standalone runbook holds it in
    place, in rb::check_sealed)."""
    from . import render

    return render.environment().get_template(SEAL_CHECK).render()


def delimiter(text: str, seed: str) -> str:
    """A heredoc delimiter that no line of `text` equals."""
    base = "RB_PY_" + hashlib.sha256(seed.encode()).hexdigest()[:8].upper()
    word, tries = base, 0
    while word in text.split("\n"):
        tries += 1
        word = f"{base}_{tries}"
    return word


def separator(texts: list[str]) -> str:
    """The word that starts the line naming each file of an embedded kit (compile --standalone):
    one that no line of any file starts with, so that the files split apart where it stands."""
    lines = [line for text in texts for line in text.split("\n")]
    word, tries = "RB_KIT_FILE", 0
    while any(line.startswith(word + " ") or line == word for line in lines):
        tries += 1
        word = f"RB_KIT_FILE_{tries}"
    return word


def embedded(text: str) -> tuple[str, bool]:
    """(the text as an embedded kit shows it, ended by one newline; whether that newline is not
    the file's own): a file without a final newline is shown with one, which the runbook drops."""
    return (text, False) if text.endswith("\n") else (text + "\n", True)


def tar_bytes(packages: tuple[str, ...] = PACKAGES, runtime: bool = True) -> bytes:
    """The kit as a plain tar, byte for byte the same for the same files (sorted, mtime 0, owner
    root, modes 0644/0755, no compression: a compressor's output may differ between versions).
    `packages`, `runtime`: what it holds (the tar a standalone runbook sends its hosts is
    tar_bytes(HOST_PACKAGES, runtime=False), byte for byte: both made by rbrules.kittar)."""
    chosen = [
        (f.path, f.text.encode("utf-8")) for f in files() if f.path.split("/", 1)[0] in packages
    ]
    if runtime:
        chosen.append(("runtime.sh", runtime_text().encode("utf-8")))
        chosen.append(("seal.py", seal_text().encode("utf-8")))
    return kit_tar(chosen)


@lru_cache(maxsize=None)
def pinned() -> tuple[str, bytes]:
    """(sha256 of the kit's tar, the tar): what a default runbook pins, `generated/.kit/` holds."""
    data = tar_bytes()
    return hashlib.sha256(data).hexdigest(), data
