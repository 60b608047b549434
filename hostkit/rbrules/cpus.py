"""The CPUs this process may use (issue 47): the one count every place that sizes jobs, workers or
streams takes, on the hosts and here. stdlib only, no state; Python >= 3.9.

    usable(root)   Usable: how many CPUs (`count`, whole), how much CPU time a second (`share`:
                   a cgroup quota may say 2.5), which CPUs (`cpus`, the affinity), of how many
                   online, and why in words
    count(root)    usable(root).count
    jobs(value)    a --jobs word: `auto` is count() (at most MAX_JOBS), else the number given
    cpulist, parse_cpulist   a set of CPUs as the kernel writes it (`0-3,8-11`) and back
    token, read_token        Usable as one word for a line between hosts (`4:2.50:0-3`) and back

Two limits count, the tighter wins: the affinity (os.sched_getaffinity: taskset, cpusets, a
Slurm job's binding) and the cgroup's CPU quota (cgroup v2's cpu.max, v1's cpu.cfs_quota_us over
cpu.cfs_period_us; containers, Slurm's cgroup plugin), read for this process's cgroup and every
cgroup above it up to the mount's root. os.cpu_count() counts the machine's CPUs, which is what
a process limited to 4 of 16 must not take for its own (issue 47: a relay through three machines
of 4 usable CPUs each counted 16 at each end and sized its streams and its choice for them).

`root` is where the /proc and /sys files are read from ("/": this machine; the tests give a
directory of fake ones): ROOT/proc/self/cgroup, ROOT/proc/self/mountinfo, ROOT/<the cgroup mount
point>/<the cgroup's path>/cpu.max and the v1 pair.
"""

from __future__ import annotations

import math
import os
from typing import Iterable, List, NamedTuple, Optional, Set, Tuple

MAX_JOBS = 32  # --jobs auto: never more workers than this, whatever the host


class Usable(NamedTuple):
    count: int  # CPUs to size jobs by: min(affinity, the quota rounded up), 1 at least
    share: float  # CPU seconds a second: min(affinity, the quota)
    cpus: Tuple[int, ...]  # the CPUs of the affinity, sorted (the quota names none)
    online: int  # the machine's (os.cpu_count)
    why: str  # `4 of 16 (affinity 0-3)`, `2.5 of 16 (cgroup cpu.max 250000 100000)`


def cpulist(cpus: Iterable[int]) -> str:
    """A set of CPUs as the kernel lists them: `0-3,8-11`, `5`, `` for none."""
    out: List[str] = []
    run: List[int] = []
    for cpu in sorted(set(cpus)):
        if run and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
        run = [cpu]
    if run:
        out.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
    return ",".join(out)


def parse_cpulist(text: str) -> Set[int]:
    """The CPUs of a list as the kernel writes it (/proc/PID/status's Cpus_allowed_list,
    cpuset.cpus): `0-3,8-11`; ValueError for anything else."""
    got: Set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi) if hi else int(lo)
        if first < 0 or last < first or last - first > 1 << 16:
            raise ValueError("not a CPU list: %r" % text)
        got.update(range(first, last + 1))
    return got


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as fh:
            return fh.read(1 << 20)
    except OSError:
        return None


def _unescape(field: str) -> str:
    """A mountinfo field: spaces, tabs, newlines and backslashes as octal escapes (`\\040`)."""
    if "\\" not in field:
        return field
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1 : index + 4].isdigit():
            out.append(chr(int(field[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def _mounts(root: str) -> List[Tuple[str, str, str, Tuple[str, ...]]]:
    """(fstype, the mount's root in its file system, its mount point, its super options) of the
    cgroup and cgroup2 mounts of ROOT/proc/self/mountinfo; where there is none to read, the
    usual places (v2 at /sys/fs/cgroup, v1's cpu controller at /sys/fs/cgroup/cpu,cpuacct and
    /sys/fs/cgroup/cpu)."""
    text = _read(os.path.join(root, "proc/self/mountinfo"))
    out = []
    for line in (text or "").splitlines():
        pre, sep, post = line.partition(" - ")
        words, tail = pre.split(), post.split()
        if not sep or len(words) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((tail[0], _unescape(words[3]), _unescape(words[4]), tuple(tail[2].split(","))))
    if text is None:
        out = [
            ("cgroup2", "/", "/sys/fs/cgroup", ()),
            ("cgroup", "/", "/sys/fs/cgroup/cpu,cpuacct", ("cpu",)),
            ("cgroup", "/", "/sys/fs/cgroup/cpu", ("cpu",)),
        ]
    return out


def _dirs(root: str, mount: Tuple[str, str, str, Tuple[str, ...]], path: str) -> List[str]:
    """The directories of a cgroup at `path` (its hierarchy's, /proc/self/cgroup) and of every
    cgroup above it inside `mount`, this one first."""
    _kind, mroot, point, _opts = mount
    if mroot != "/" and path != mroot and not path.startswith(mroot.rstrip("/") + "/"):
        return []  # this mount shows another part of the hierarchy
    rel = path[len(mroot.rstrip("/")) :] if mroot != "/" else path
    parts = [p for p in rel.split("/") if p and p not in (".", "..")]
    base = os.path.join(root, point.lstrip("/"))
    return [os.path.join(base, *parts[:k]) for k in range(len(parts), -1, -1)]


def quota(root: str = "/") -> Optional[Tuple[float, str]]:
    """(CPUs, its source in words) of the tightest CPU quota on this process's cgroup and those
    above it, v2 (cpu.max: `QUOTA PERIOD`, `max` for none) and v1 (cpu.cfs_quota_us, -1 for none,
    over cpu.cfs_period_us); None where no quota is set or none can be read."""
    text = _read(os.path.join(root, "proc/self/cgroup")) or ""
    v2_path, v1_path = None, None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2_path = path
        elif "cpu" in controllers.split(","):
            v1_path = path
    best: Optional[Tuple[float, str]] = None
    for mount in _mounts(root):
        kind, opts = mount[0], mount[3]
        if kind == "cgroup2" and v2_path is not None:
            for cgroup_dir in _dirs(root, mount, v2_path):
                words = (_read(os.path.join(cgroup_dir, "cpu.max")) or "").split()
                if (
                    len(words) == 2
                    and words[0] != "max"
                    and words[0].isdigit()
                    and words[1].isdigit()
                    and int(words[1]) > 0
                ):
                    cpus = int(words[0]) / int(words[1])
                    if best is None or cpus < best[0]:
                        best = (cpus, "cgroup cpu.max %s %s" % (words[0], words[1]))
        elif kind == "cgroup" and "cpu" in opts and v1_path is not None:
            for cgroup_dir in _dirs(root, mount, v1_path):
                limit = (_read(os.path.join(cgroup_dir, "cpu.cfs_quota_us")) or "").strip()
                period = (_read(os.path.join(cgroup_dir, "cpu.cfs_period_us")) or "").strip()
                if limit.isdigit() and period.isdigit() and int(period) > 0 and int(limit) > 0:
                    cpus = int(limit) / int(period)
                    if best is None or cpus < best[0]:
                        best = (
                            cpus,
                            "cgroup cpu.cfs_quota_us %s / cpu.cfs_period_us %s" % (limit, period),
                        )
    return best


def affinity() -> Tuple[int, ...]:
    """The CPUs this process may run on (sorted), or every online one where the platform does
    not say (no sched_getaffinity)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return tuple(range(os.cpu_count() or 1))


def usable(
    root: str = "/", cpus: Optional[Iterable[int]] = None, online: Optional[int] = None
) -> Usable:
    """The CPUs this process may use (`cpus`, `online`: given by the tests, else this process's
    affinity and os.cpu_count)."""
    mine = tuple(sorted(set(cpus))) if cpus is not None else affinity()
    total = online if online is not None else (os.cpu_count() or len(mine) or 1)
    share = float(max(1, len(mine)))
    whys = []
    if len(mine) < total:
        whys.append("affinity %s" % cpulist(mine))
    got = quota(root)
    if got is not None and got[0] < share:
        share = got[0]
        whys.append(got[1])
    # a quota of 2.5 CPUs runs 3 workers (each gets its part), never fewer than one
    count = max(1, min(len(mine) or 1, int(math.ceil(round(share, 2)))))
    said = ("%d" % share if share == int(share) else "%.2g" % share) + " of %d" % total
    return Usable(
        count, round(share, 3), mine, total, said + (" (%s)" % "; ".join(whys) if whys else "")
    )


def count(root: str = "/") -> int:
    return usable(root).count


def jobs(value: object, of: Optional[Usable] = None) -> int:
    """--jobs N, or auto (None, ``): one per CPU this process may use (count; of another
    machine's: `of`, its Usable), at most MAX_JOBS."""
    if value in (None, "", "auto"):
        return max(1, min(MAX_JOBS, of.count if of is not None else count()))
    return max(1, int(str(value)))


def token(allowed: Usable) -> str:
    """Usable as one word for a line between hosts: `COUNT:SHARE:CPULIST:ONLINE`."""
    return "%d:%.2f:%s:%d" % (
        allowed.count,
        allowed.share,
        cpulist(allowed.cpus) or "-",
        allowed.online,
    )


def read_token(word: str) -> Optional[Usable]:
    """token's word back (its why rebuilt), or None where it is not one."""
    parts = word.split(":")
    if len(parts) != 4:
        return None
    try:
        cpu_count, share, online = int(parts[0]), float(parts[1]), int(parts[3])
        cpus = tuple(sorted(parse_cpulist(parts[2]))) if parts[2] != "-" else ()
    except ValueError:
        return None
    if cpu_count < 1 or share <= 0 or online < 1:
        return None
    said = ("%d" % share if share == int(share) else "%.2g" % share) + " of %d" % online
    if cpus and len(cpus) < online:
        said += " (affinity %s%s)" % (cpulist(cpus), "; a quota" if share < len(cpus) else "")
    elif share < online:
        said += " (a quota)"
    return Usable(cpu_count, share, cpus, online, said)
