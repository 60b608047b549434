"""What killed lab runs left behind, removed once when a test session starts.

Every lab also cleans its own prefix when it starts, but only that prefix and only then: a crashed
fan-out cluster's namespaces would otherwise stay until the next cluster of the same kind started,
and a test lab's (`rbltest`, `rblfail`, ...) until that very test ran again. Live runs of any
process are never touched: a `Lab` lives while it holds its flock, a `Cluster` while it holds its
flock or its owner process lives, a mount while the process named in it lives.
"""

from __future__ import annotations

import os
import re
import shutil

from . import cluster, netlab
from .disk import cleanup_stale_mounts
from .errors import LabError

# A Lab's namespaces are PREFIX-RUNID-HOST; every prefix of this project starts with "rb". The
# fan-out clusters (rbfan-RUNID-nodeNN) look alike but have their own rule (cluster.cleanup_stale).
_LAB_NS = re.compile(r"^(rb[a-z0-9]{1,6})-[0-9a-f]{6}-")
_LAB_LOCK = re.compile(r"^(rb[a-z0-9]{1,6})-[0-9a-f]{6}\.lock$")


def lab_prefixes() -> set[str]:
    """Lab prefixes with a namespace or a lock file on this machine (the clusters' excluded)."""
    found = {m.group(1) for ns in netlab.list_netns() if (m := _LAB_NS.match(ns))}
    if netlab.LOCK_DIR.is_dir():
        found |= {m.group(1) for p in netlab.LOCK_DIR.iterdir() if (m := _LAB_LOCK.match(p.name))}
    found.discard(cluster.PREFIX)
    return found


def cleanup_all_stale() -> list[str]:
    """Remove the leftovers of dead lab runs of every kind: Lab namespaces, dirs and locks (each
    `rb*` prefix), fan-out/Slurm clusters (namespaces, daemons, bridges, dirs), scratch mounts.
    Returns one line per thing removed or that could not be removed; [] without root or `ip`."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return []
    notes: list[str] = []
    try:
        for prefix in sorted(lab_prefixes()):
            notes += [f"namespace {ns}" for ns in netlab.cleanup_stale(prefix)]
        notes += [f"cluster {runid}" for runid in cluster.cleanup_stale()]
        notes += [f"mount {p}" for p in cleanup_stale_mounts()]
    except (LabError, OSError) as exc:
        notes.append(f"could not finish: {exc}")
    return notes
