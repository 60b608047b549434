"""The env file a moved venv is used through: CUDA_HOME, PATH, LD_LIBRARY_PATH (venv dirs first).

The env file belongs to the install it was written for: `write(..., venv=DEST)` keeps a copy inside
the install (`DEST/.rb-env.sh`, which manifests skip), and `restore_env` puts that copy back at the
public path when a restore or a rollback brings the install back. Both are written through a new
temp file and one rename (rbkit.safefs): a link at either name is replaced, never written through.
"""

from __future__ import annotations

import glob
import os
import shlex
from typing import Optional

from rbrules import paths, proven

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
    quote = shlex.quote
    lines = [
        f"# Environment for the venv at {venv}.",
        f"# Written by {origin}. Use: source this file (bash, zsh, sh).",
        f"export VIRTUAL_ENV={quote(venv)}",
    ]
    path = [os.path.join(venv, "bin")]
    if cuda_home:
        lines.append(f"export CUDA_HOME={quote(cuda_home)}")
        path.append(os.path.join(cuda_home, "bin"))
        lib_dirs = lib_dirs + [os.path.join(cuda_home, "lib64")]
    lines.append(f"export PATH={quote(':'.join(path))}" + '"${PATH:+:${PATH}}"')
    if lib_dirs:
        lines.append(
            f"export LD_LIBRARY_PATH={quote(':'.join(lib_dirs))}"
            + '"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"'
        )
    for key in sorted(env):
        lines.append(f"export {key}={quote(env[key])}")
    summary = {
        "site_packages": site,
        "library_dirs": lib_dirs,
        "missing_dirs": missing,
        "cuda_home": cuda_home or None,
    }
    return "\n".join(lines) + "\n", summary


def write(path: str, text: str, *, venv: Optional[str] = None) -> None:
    """Write the env file at `path` (mode 0644). With `venv` (the install it is for), first keep
    the same text inside the install as `venv/.rb-env.sh`, so that a restore of this install can
    put its own env file back."""
    data = text.encode("utf-8")
    if venv is not None:
        safefs.write_in(venv, paths.ENV_IN_INSTALL, data, 0o644)
    safefs.write_file(path, data, 0o644)


def own_copy(venv: str) -> Optional[bytes]:
    """The env file kept inside the install at `venv` (paths.ENV_IN_INSTALL), None when there is
    none; rbrules.proven.NotOurs when it is there and not proven ours (opened O_NOFOLLOW and judged
    through the descriptor: owned by this user or root, writable by no other, a regular file of
    one link): such a file is never copied, sourced or read further."""
    dir_fd = safefs.open_dir(venv)
    try:
        got = proven.read_ours(
            paths.ENV_IN_INSTALL, dir_fd, 1 << 20, shown=os.path.join(venv, paths.ENV_IN_INSTALL)
        )
    finally:
        os.close(dir_fd)
    return got[0] if got is not None else None


def restore_env(venv: str, path: str) -> dict:
    """Put the env file kept inside the install at `venv` back at `path`. When the install has
    none (made before env files were versioned), or one not proven ours (own_copy), `path` is
    left alone and the result says so."""
    try:
        got = own_copy(venv)
    except proven.NotOurs as exc:
        return {
            "path": path,
            "restored": False,
            "why": f"refusing to copy {os.path.join(venv, paths.ENV_IN_INSTALL)}: {exc.why}; "
            f"{path} still belongs to the install it replaced: run the exports step again",
        }
    if got is None:
        return {
            "path": path,
            "restored": False,
            "why": f"{venv} holds no {paths.ENV_IN_INSTALL}; {path} still belongs to the install "
            "it replaced: run the exports step again",
        }
    safefs.write_file(path, got, 0o644)
    return {"path": path, "restored": True, "from": os.path.join(venv, paths.ENV_IN_INSTALL)}
