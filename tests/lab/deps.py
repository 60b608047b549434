"""The system tools the lab needs, and installing the missing ones with apt.

`ensure_packages()` is idempotent and quiet: when every tool is already there it returns at once
without touching apt; otherwise it runs `apt-get install` (and `apt-get update` once if the install
fails on stale lists) and raises `LabError` with the tail of apt's output when that does not work.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .errors import LabError

# tool -> Debian package that ships it. Absolute paths where the lab calls the absolute path.
TOOLS: dict[str, str] = {
    "/usr/sbin/sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "losetup": "mount",
    "mount": "mount",
    "mkfs.ext4": "e2fsprogs",
}

# What the CI command must install on a bare Debian 12 machine (the others come with the base image,
# but are listed in TOOLS so a slimmer image still works).
APT_PACKAGES: tuple[str, ...] = ("openssh-server", "openssh-client", "iproute2", "e2fsprogs")

_APT_TIMEOUT_S = 600


def _have(tool: str) -> bool:
    if tool.startswith("/"):
        return os.access(tool, os.X_OK)
    return shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is not None


def missing_packages() -> list[str]:
    """Debian packages whose tools are missing here, sorted, without duplicates."""
    return sorted({pkg for tool, pkg in TOOLS.items() if not _have(tool)})


def _apt(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    return subprocess.run(
        ["apt-get", "-q", "-y", "-o", "Dpkg::Use-Pty=0", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=_APT_TIMEOUT_S,
        check=False,
    )


def ensure_packages() -> None:
    """Install the Debian packages the lab needs when any of their tools is missing.

    Raises LabError (with apt's output) when not root or when apt cannot install them.
    """
    missing = missing_packages()
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(
            f"the lab needs the Debian packages {missing} and only root can install them"
        )
    if shutil.which("apt-get") is None:
        raise LabError(f"the lab needs the Debian packages {missing} and there is no apt-get here")
    res = _apt(["install", "--no-install-recommends", *missing])
    if res.returncode != 0:
        upd = _apt(["update"])
        if upd.returncode != 0:
            raise LabError(
                f"apt-get update failed (rc={upd.returncode}):\n{upd.stdout[-2000:]}"
                f"{upd.stderr[-2000:]}"
            )
        res = _apt(["install", "--no-install-recommends", *missing])
    still = missing_packages()
    if res.returncode != 0 or still:
        raise LabError(
            f"apt-get install {' '.join(missing)} failed (rc={res.returncode}, still missing: "
            f"{still}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        )
    # Debian's package would start a system sshd where services are allowed; ours never need it,
    # and policy-rc.d stops it here. /run/sshd (privilege separation dir) is made by every lab's
    # start (tests/lab/rundirs.py).


def lab_unavailable_reason() -> str | None:
    """Why the lab cannot run on this machine, or None when it can (after ensure_packages())."""
    if os.geteuid() != 0:
        return "the e2e lab needs root (network namespaces, loop mounts)"
    if shutil.which("ip") is None:
        return "the e2e lab needs iproute2's `ip` (ip netns)"
    try:
        res = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns list` did not run: {exc}"
    if res.returncode != 0:
        return f"`ip netns list` failed (rc={res.returncode}): {res.stderr.strip()}"
    if not Path("/proc/self/ns/net").exists():
        return "this kernel has no network namespaces"
    return None
