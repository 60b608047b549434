"""The CPUs a process may use (rbrules.cpus, issue 47): its affinity and its cgroup's quota (v2's
cpu.max, v1's cfs pair), read from fake /proc and /sys files under a root directory; and that
every place of the kit that sizes jobs, workers or streams counts them this one way."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from rbrules import compression, cpus

HOSTKIT = Path(__file__).resolve().parents[2] / "hostkit"


def fake_root(tmp_path: Path, cgroup: str, mountinfo: str, files: dict) -> str:
    root = tmp_path / "root"
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    (root / "proc" / "self" / "mountinfo").write_text(mountinfo)
    for rel, text in files.items():
        p = root / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(root)


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_a_host_with_4_usable_cpus_of_16_counts_4():
    """Pinned to CPUs 0-3 of 16 (taskset, a cpuset, a Slurm binding), no quota."""
    u = cpus.usable("/nonexistent", cpus=range(4), online=16)
    assert (u.count, u.share, u.cpus, u.online) == (4, 4.0, (0, 1, 2, 3), 16)
    assert u.why == "4 of 16 (affinity 0-3)"
    assert cpus.jobs("auto", u) == 4 and cpus.jobs("6", u) == 6


def test_a_cgroup_v2_quota_along_the_path_counts_the_tightest(tmp_path):
    """A Slurm job's cgroup holds cpu.max 250000 100000 (2.5 CPUs), its step none (max): 16 CPUs
    of affinity, 2.5 CPU seconds a second: 3 jobs, share 2.5."""
    root = fake_root(
        tmp_path,
        "0::/slurm/job7/step0\n",
        V2_MOUNT,
        {
            "/sys/fs/cgroup/slurm/job7/cpu.max": "250000 100000\n",
            "/sys/fs/cgroup/slurm/job7/step0/cpu.max": "max 100000\n",
            "/sys/fs/cgroup/slurm/cpu.max": "800000 100000\n",
        },
    )
    assert cpus.quota(root) == (2.5, "cgroup cpu.max 250000 100000")
    u = cpus.usable(root, cpus=range(16), online=16)
    assert (u.count, u.share) == (3, 2.5) and u.why == "2.5 of 16 (cgroup cpu.max 250000 100000)"


def test_a_container_sees_its_own_cgroup_as_the_mounts_root(tmp_path):
    """cgroup namespace: /proc/self/cgroup says `0::/`, the mount's root is the container's cgroup,
    whose cpu.max lies at the mount point itself."""
    root = fake_root(tmp_path, "0::/\n", V2_MOUNT, {"/sys/fs/cgroup/cpu.max": "200000 100000\n"})
    assert cpus.usable(root, cpus=range(8), online=8).count == 2


def test_a_cgroup_v1_quota_and_an_affinity_tighter_than_it(tmp_path):
    mounts = (
        "31 23 0:27 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
        "32 23 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    )
    root = fake_root(
        tmp_path,
        "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
        mounts,
        {
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_quota_us": "-1\n",
            "/sys/fs/cgroup/cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cpus.quota(root) == (3.0, "cgroup cpu.cfs_quota_us 300000 / cpu.cfs_period_us 100000")
    assert cpus.usable(root, cpus=range(32), online=32).count == 3
    u = cpus.usable(root, cpus=(0, 1), online=32)  # the affinity is tighter: it counts
    assert (u.count, u.share) == (2, 2.0) and u.why == "2 of 32 (affinity 0-1)"


def test_no_quota_and_a_mount_of_another_part_of_the_hierarchy_are_no_limit(tmp_path):
    mounts = V2_MOUNT.replace(" / /sys/fs/cgroup", " /other /sys/fs/cgroup")
    root = fake_root(tmp_path, "0::/mine\n", mounts, {"/sys/fs/cgroup/cpu.max": "100000 100000\n"})
    assert cpus.quota(root) is None
    root = fake_root(
        tmp_path / "b", "0::/mine\n", V2_MOUNT, {"/sys/fs/cgroup/mine/cpu.max": "max 100000\n"}
    )
    assert cpus.quota(root) is None
    assert cpus.usable(root, cpus=range(4), online=4).why == "4 of 4"


def test_a_mount_point_with_a_space_is_read(tmp_path):
    mounts = "30 23 0:26 / /sys/fs/my\\040cg rw - cgroup2 cgroup2 rw\n"
    root = fake_root(tmp_path, "0::/a\n", mounts, {"/sys/fs/my cg/a/cpu.max": "50000 100000\n"})
    assert cpus.quota(root)[0] == 0.5
    u = cpus.usable(root, cpus=range(4), online=4)
    assert (u.count, u.share) == (1, 0.5)


def test_the_token_between_hosts_and_the_cpu_lists():
    u = cpus.usable("/nonexistent", cpus=[0, 1, 2, 3, 8, 9, 10, 11, 13], online=16)
    assert cpus.token(u) == "9:9.00:0-3,8-11,13:16"
    back = cpus.read_token(cpus.token(u))
    assert back is not None and (back.count, back.share, back.cpus, back.online) == (
        u.count,
        u.share,
        u.cpus,
        u.online,
    )
    assert back.why == "9 of 16 (affinity 0-3,8-11,13)"
    assert cpus.read_token("4:2.50:0-3:16").why == "2.5 of 16 (affinity 0-3; a quota)"
    for bad in ("", "4", "x:1:0:1", "0:1.00:0:1", "4:4.00:3-1:16", "2:2.00:0-1"):
        assert cpus.read_token(bad) is None, bad
    assert cpus.parse_cpulist("0-2,5") == {0, 1, 2, 5} and cpus.cpulist([]) == ""


def test_this_process_counts_its_affinity(monkeypatch):
    """On this machine: the affinity, os.cpu_count not (the quota, where one is set, also)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cpus, "quota", lambda root="/": None)
    assert cpus.count() == 4 and cpus.jobs("auto") == 4
    from rbkit import __main__ as cli
    from rbkit import runner, sendside, source, statwalk
    from rbprobes import checks_static

    assert cli.jobs("auto") == 4 and runner.jobs("auto") == 4 and statwalk._cpus() == 4
    assert sendside.hash_jobs("auto", True) == 2  # the stream's processes take two
    monkeypatch.delenv("RBKIT_AUDIT_BESIDE", raising=False)
    assert source.spare_cores() is True
    assert checks_static.audit_jobs([1 << 30] * 8) == 3  # every usable core but one


def test_no_module_of_the_kit_counts_cpus_another_way():
    """os.cpu_count and os.sched_getaffinity only in rbrules/cpus.py (issue 47: the kit counted
    two ways, the machine's CPUs in most places); measure.idle_cpus reads the whole kernel's
    /proc/stat and scales by every CPU of it, on purpose."""
    found = []
    for path in sorted(HOSTKIT.rglob("*.py")):
        rel = path.relative_to(HOSTKIT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if (
                re.search(r"\bos\.(cpu_count|sched_getaffinity)\b", line)
                and rel != "rbrules/cpus.py"
            ):
                found.append("%s:%d: %s" % (rel, n, line.strip()))
    assert found == [
        "rbkit/measure.py:%d: %s"
        % (
            _line_of("rbkit/measure.py", "os.cpu_count"),
            _text_of("rbkit/measure.py", "os.cpu_count"),
        )
    ]


def _line_of(rel: str, what: str) -> int:
    return next(
        n for n, line in enumerate((HOSTKIT / rel).read_text().splitlines(), 1) if what in line
    )


def _text_of(rel: str, what: str) -> str:
    return next(line.strip() for line in (HOSTKIT / rel).read_text().splitlines() if what in line)


@pytest.mark.parametrize(
    "word,pack",
    [
        ("zstd-3-T2", ["zstd", "-q", "-3", "-T2"]),
        ("zstd-1-T1", ["zstd", "-q", "-1", "-T1"]),
        ("lz4", ["lz4", "-q", "-1", "-c"]),
        ("zstd", ["zstd", "-q", "-1", "-T0"]),
    ],
)
def test_the_words_compression_auto_may_choose(word, pack):

    assert compression.compression(word)["pack"] == pack
    assert compression.compression(word)["unpack"][0] == pack[0]


@pytest.mark.parametrize(
    "word",
    [
        "zstd-0-T1",
        "zstd-3-T0",
        "zstd-03-T2",
        "zstd-3",
        "lz4-1-T1",
        "zstd-20-T1",
        "zstd-3-T65",
        "zstd-3-T2 ",
        "none-1-T1",
    ],
)
def test_other_words_are_refused(word):

    assert compression.compression(word) is None
    with pytest.raises(ValueError):
        compression.compression_word(word)


@pytest.mark.parametrize(
    "a,b,relay,want",
    [
        ("0-3", "4-7", "", None),  # two machines of one kernel, apart
        ("0-3", "3-5", "", "1"),  # CPU 3 in both
        ("0-3,8", "1-2,8", "", "3"),
        ("-", "4-7", "", "-"),  # a set not known: one kernel is enough
        ("1000-1003", "1004-1007", "relay", None),  # and this machine's CPUs apart from both
        ("0-1003", "1004-1007", "relay", "*"),  # this machine's CPUs inside the source's
    ],
)
def test_the_machines_share_cpus_where_their_cpu_sets_overlap(tmp_path, a, b, relay, want):
    """rb::shared_cpus: one kernel (the same boot id) and CPU sets that overlap; three sshd
    pinned apart on one kernel (issue 47's device harness) are three machines."""
    import subprocess

    from compiler import kit

    runtime = tmp_path / "runtime.sh"
    runtime.write_text(kit.runtime_text())
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    script = (
        f"source {runtime}; declare -A RB_HOST_BOOT=([a]={boot} [b]={boot}) RB_HOST_CPUS; "
        f"RB_HOST_CPUS=([a]='{a}' [b]='{b}'); rb::shared_cpus a b {relay}"
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True)
    if want is None:
        assert r.returncode == 1 and r.stdout == "", r
    else:
        assert r.returncode == 0, r
        got_boot, n = r.stdout.split()
        assert got_boot == boot and (n == want or want == "*" and int(n) >= 1), r.stdout
    other = script.replace(f"[b]={boot}", "[b]=another")
    assert subprocess.run(["bash", "-c", other], capture_output=True).returncode == 1
