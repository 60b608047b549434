"""The end-to-end test lab: real hosts (network namespaces running sshd), real venvs, real disks.

See docs/testing-lab.md. Fixtures for pytest live in tests.lab.fixtures.
"""

from __future__ import annotations

from .deps import APT_PACKAGES, ensure_packages, lab_unavailable_reason, missing_packages
from .disk import Ext4Mount, TmpfsMount, cleanup_stale_mounts
from .errors import LabError
from .netlab import Host, Lab, cleanup_stale, ensure_guard_route, list_netns, netns_pids
from .payload import Payload, build_payload, make_many_files
from .rundirs import RUN_DIRS, empty_run_argv, ensure_run_dirs

__all__ = [
    "APT_PACKAGES",
    "RUN_DIRS",
    "Ext4Mount",
    "Host",
    "Lab",
    "LabError",
    "Payload",
    "TmpfsMount",
    "build_payload",
    "cleanup_stale",
    "cleanup_stale_mounts",
    "empty_run_argv",
    "ensure_guard_route",
    "ensure_packages",
    "ensure_run_dirs",
    "lab_unavailable_reason",
    "list_netns",
    "make_many_files",
    "missing_packages",
    "netns_pids",
]
