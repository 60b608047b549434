"""The env file a moved venv is used through: CUDA_HOME, PATH, LD_LIBRARY_PATH (venv dirs first)."""

from __future__ import annotations

import glob
import os
import shlex

from . import safefs


def site_packages(venv: str) -> str:
    found = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    if not found:
        raise FileNotFoundError(f"{venv} has no lib/python3*/site-packages")
    return found[-1]


def render(venv: str, cuda_home: str, first: list, env: dict, origin: str) -> tuple[str, dict]:
    """The env file's text and a summary. `first` are dirs relative to site-packages."""
    site = site_packages(venv)
    lib_dirs = [os.path.join(site, d) for d in first]
    missing = [d for d in lib_dirs if not os.path.isdir(d)]
    q = shlex.quote
    lines = [
        f"# Environment for the venv at {venv}.",
        f"# Written by {origin}. Use: source this file (bash, zsh, sh).",
        f"export VIRTUAL_ENV={q(venv)}",
    ]
    path = [os.path.join(venv, "bin")]
    if cuda_home:
        lines.append(f"export CUDA_HOME={q(cuda_home)}")
        path.append(os.path.join(cuda_home, "bin"))
        lib_dirs = lib_dirs + [os.path.join(cuda_home, "lib64")]
    lines.append(f"export PATH={q(':'.join(path))}" + '"${PATH:+:${PATH}}"')
    if lib_dirs:
        lines.append(
            f"export LD_LIBRARY_PATH={q(':'.join(lib_dirs))}"
            + '"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"'
        )
    for key in sorted(env):
        lines.append(f"export {key}={q(env[key])}")
    summary = {"site_packages": site, "library_dirs": lib_dirs, "missing_dirs": missing,
               "cuda_home": cuda_home or None}
    return "\n".join(lines) + "\n", summary


def write(path: str, text: str) -> None:
    """Write the env file at `path` (mode 0644) through a new temp file and one rename
    (rbkit.safefs): a link at `path`, or at any temp name, is never written through."""
    safefs.write_file(path, text.encode("utf-8"), 0o644)
