"""The e2e lab itself works: real sshd hosts that are isolated from each other, faults that bite,
real venvs whose console scripts run, scratch file systems, and a teardown that leaves nothing."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.lab import Lab, LabError, build_payload, list_netns, make_many_files, netns_pids
from tests.lab import payload as payload_mod
from tests.lab.fixtures import require_lab

pytestmark = pytest.mark.e2e


def _ssh_from(lab: Lab, host: str, target: str, command: str, timeout: float = 20):
    """ssh from inside `host` (its namespace) to `target`, with the lab's strict client config."""
    return lab.exec(
        host,
        ["ssh", "-F", str(lab.ssh_config), "-o", "ConnectTimeout=2", target, command],
        timeout=timeout,
    )


def test_each_host_answers_strict_ssh_with_its_own_address(lab):
    for name, host in lab.hosts.items():
        res = lab.ssh(
            name,
            "hostname; hostname -I; ip -4 -o addr show",
            options=["-o", "StrictHostKeyChecking=yes"],
            check=True,
        )
        lines = res.stdout.splitlines()
        assert lines[0] == name
        assert lines[1].split() == [host.addr]
        assert f"inet {host.addr}/30" in res.stdout
        others = [h.addr for h in lab.hosts.values() if h is not host]
        assert not any(a in res.stdout for a in others)
    known = lab.known_hosts.read_text()
    for host in lab.hosts.values():
        assert f"{host.name},{host.addr} {host.host_key_line()}" in known


def test_hosts_cannot_reach_each_other_but_this_machine_reaches_all(lab):
    flags = lab.forwarding()
    assert flags["ip_forward"] == "0", "this machine must not forward between the test hosts"
    assert set(flags.values()) == {"0"}
    for host in lab.hosts:
        assert lab.can_connect(host, timeout=2)
    t0 = time.monotonic()
    assert not lab.can_connect("dst", from_host="src", timeout=2)
    res = _ssh_from(lab, "src", "dst", "true")
    assert time.monotonic() - t0 < 10
    assert res.returncode == 255
    assert "unreachable" in res.stderr


def test_allow_gives_a_direct_route_and_disallow_takes_it_away(clean_lab):
    lab = clean_lab
    addr = lab.allow("src", "dst")
    assert addr == lab.hosts["dst"].direct["src"]
    res = _ssh_from(lab, "src", addr, "hostname; hostname -I")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["dst", lab.hosts["dst"].addr, addr]
    back = _ssh_from(lab, "dst", lab.hosts["src"].direct["dst"], "hostname")
    assert back.stdout.strip() == "src"
    assert not lab.can_connect("jump", from_host="src", timeout=1)  # only the pair allowed
    lab.disallow("src", "dst")
    assert not lab.can_connect(addr, from_host="src", timeout=1)


def test_killing_a_hosts_sshd_kills_its_sessions_and_refuses_ssh(clean_lab):
    lab = clean_lab
    session = subprocess.Popen(
        lab.ssh_argv("src", "sleep 60"),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(50):  # wait for the remote sleep (bounded)
            if any(
                Path(f"/proc/{p}/comm").read_text().strip() == "sleep"
                for p in netns_pids(lab.hosts["src"].netns)
                if Path(f"/proc/{p}").exists()
            ):
                break
            time.sleep(0.1)
        lab.kill_sshd("src")
        assert session.wait(timeout=10) == 255
    finally:
        session.kill()
        session.wait()
    assert netns_pids(lab.hosts["src"].netns) == []
    res = lab.ssh("src", "true", timeout=20)
    assert res.returncode == 255
    assert "Connection refused" in res.stderr
    assert lab.ssh("dst", "true").returncode == 0  # the other hosts are untouched
    lab.start_sshd("src")
    assert lab.ssh("src", "true").returncode == 0


def test_a_changed_host_key_is_refused(clean_lab):
    lab = clean_lab
    new_key = lab.replace_host_key("dst")
    assert new_key not in lab.known_hosts.read_text()
    res = lab.ssh("dst", "true", timeout=20)
    assert res.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr
    assert "Host key verification failed" in res.stderr
    lab.reset()
    assert lab.ssh("dst", "true").returncode == 0


def test_link_down_and_up(clean_lab):
    lab = clean_lab
    lab.link_down("src", side="root")  # this machine's end: no route, fails at once
    t0 = time.monotonic()
    res = lab.ssh("src", "true", options=["-o", "ConnectTimeout=2"], timeout=20)
    assert res.returncode == 255 and "No route to host" in res.stderr
    assert time.monotonic() - t0 < 2
    lab.link_up("src", side="root")
    assert lab.ssh("src", "true").returncode == 0
    lab.link_down("src")  # the host's end: a cut cable, connects time out
    t0 = time.monotonic()
    assert not lab.can_connect("src", timeout=1)
    assert time.monotonic() - t0 < 3
    lab.link_up("src")
    assert lab.ssh("src", "true").returncode == 0


def test_small_payload_runs_over_ssh(lab, payload_small):
    res = lab.ssh("src", [str(payload_small.bin("payload-hello"))], check=True)
    out = json.loads(res.stdout)
    assert out["prefix"] == str(payload_small.venv)
    assert out["greeting"] == "hello from rb_payload's package data"
    assert not (payload_small.venv / "bin" / "pip").exists()
    assert (payload_small.root / "READY").is_file()
    again = build_payload("small")
    assert again.venv == payload_small.venv and again.build_seconds is None


@pytest.mark.slow
def test_torch_payload_console_scripts_run(lab, payload_torch):
    res = lab.ssh("dst", [str(payload_torch.bin("payload-check"))], check=True, timeout=120)
    out = json.loads(res.stdout)
    assert out["torch"].startswith("2.13.0")
    assert out["sum"] == 45
    assert out["prefix"] == str(payload_torch.venv)
    hello = json.loads(lab.ssh("dst", [str(payload_torch.bin("payload-hello"))], check=True).stdout)
    assert hello["prefix"] == str(payload_torch.venv)
    assert (payload_torch.venv / "bin" / "pip").exists()


def test_a_killed_payload_build_is_never_reused(tmp_path, monkeypatch):
    calls = []

    def fake_build(venv: Path, kind: str, many_files: int) -> None:
        calls.append(venv)
        venv.mkdir()
        (venv / "built").write_text("ok")

    monkeypatch.setattr(payload_mod, "_build_into", fake_build)
    key = payload_mod.payload_key("small")
    leftover = tmp_path / f"rb-payload-small-{key}" / "venv"
    leftover.mkdir(parents=True)
    (leftover / "half-written").write_text("")
    p = build_payload("small", cache_dir=tmp_path)
    assert calls == [p.venv] and p.build_seconds is not None
    assert sorted(os.listdir(p.venv)) == ["built"]
    assert build_payload("small", cache_dir=tmp_path).build_seconds is None
    assert len(calls) == 1


def test_many_files_generator_is_deterministic(tmp_path):
    def digest(root: Path) -> list[tuple[str, int, str]]:
        out = []
        for p in sorted(root.rglob("*")):
            target = os.readlink(p) if p.is_symlink() else ""
            out.append(
                (str(p.relative_to(root)), 0 if p.is_symlink() else p.stat().st_mode, target)
            )
        return out

    a, b = tmp_path / "a", tmp_path / "b"
    assert make_many_files(a, 1000) == make_many_files(b, 1000)
    files = [p for p in a.rglob("*") if not p.is_dir()]
    assert len(files) == 1000
    assert any(p.is_symlink() for p in files) and any(os.access(p, os.X_OK) for p in files)
    assert digest(a) == digest(b)


def test_ext4_scratch_is_ext4_and_hosts_see_it(lab, ext4_dir):
    fstype = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "--target", str(ext4_dir)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert fstype == "ext4"
    lab.ssh("dst", f"echo written-on-dst > {ext4_dir}/f && sync", check=True)
    assert (ext4_dir / "f").read_text() == "written-on-dst\n"


def test_a_small_tmpfs_fills_up(tmpfs_factory):
    mnt = tmpfs_factory(256)
    with pytest.raises(OSError) as info, open(mnt.path / "big", "wb") as f:
        for _ in range(64):  # 64 x 8 KiB > 256 KiB
            f.write(b"\0" * 8192)
            f.flush()
            os.fsync(f.fileno())
    assert info.value.errno == errno.ENOSPC


def test_a_second_lab_runs_beside_and_tears_down_to_nothing(lab):
    require_lab()
    stale = "rbltest-abcdef-ghost"  # a dead run's namespace: no lock file holds it
    subprocess.run(["ip", "netns", "add", stale], check=True)
    other = Lab(("a", "b"), prefix="rbltest")
    with other:
        assert stale not in list_netns()
        assert other.slot != lab.slot
        assert other.ssh("a", "hostname", check=True).stdout.strip() == "a"
        assert lab.ssh("src", "true").returncode == 0
        names = [h.netns for h in other.hosts.values()]
        veths = [h.veth_root for h in other.hosts.values()]
        workdir = other.dir
        pids = [h.proc.pid for h in other.hosts.values() if h.proc]
    assert not [n for n in list_netns() if n.startswith("rbltest-")]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert not any(v in links for v in veths)
    assert not workdir.exists() and not other.lock_file.exists()
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    assert not any(n in list_netns() for n in names)
    other.stop()  # idempotent


def test_an_unavailable_lab_skips_here_but_fails_in_ci(monkeypatch):
    from tests.lab import fixtures

    monkeypatch.setattr(fixtures, "ensure_packages", lambda: None)
    monkeypatch.setattr(fixtures, "lab_unavailable_reason", lambda: "no netns here")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no netns here"):
        fixtures.require_lab()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="in CI: no netns here"):
        fixtures.require_lab()


def test_a_failed_start_leaves_nothing(monkeypatch):
    require_lab()

    def broken(self, hosts, **kw):
        raise LabError(f"injected: {hosts[0].name} never became ready")

    monkeypatch.setattr(Lab, "_wait_ready", broken)
    failing = Lab(("a",), prefix="rblfail")
    with pytest.raises(LabError, match="injected"):
        failing.start()
    assert not [n for n in list_netns() if n.startswith("rblfail-")]
    assert failing.dir is not None and not failing.dir.exists()
    assert not failing.lock_file.exists()


def test_every_cluster_takes_its_subnet_from_the_one_table():
    """tests/lab/subnets.py hands out the clusters' /24s: no test or benchmark writes one of its
    own (test_fanout.py's cluster shared the default 10.213.250 with any other default one), no
    two users share one, and a Lab's slots stay below them."""
    from tests.lab import subnets
    from tests.lab.cluster import SUBNET, Cluster

    root = Path(__file__).resolve().parents[2]
    # a /24 written out, or a cluster started with the default one
    literal = re.compile(r"[\"']10\.213\.\d+|(?<![\w.])(Slurm)?Cluster\(\s*\d+\s*\)")
    found = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for p in [*root.glob("tests/**/*.py"), *root.glob("benchmarks/**/*.py")]
        if p.name != "subnets.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert found == []
    assert len(set(subnets.FIXED.values())) == len(subnets.FIXED)
    assert SUBNET == subnets.subnet("cluster") and SUBNET not in {
        subnets.subnet(u) for u in subnets.FIXED if u != "cluster"
    }
    with pytest.raises(ValueError, match="a subnet of tests/lab/subnets.py"):
        Cluster(1, subnet=f"{subnets.NET_PREFIX}.{subnets.FIRST_FIXED - 1}")


def test_a_lab_never_takes_a_clusters_subnet(monkeypatch):
    from tests.lab import netlab, subnets

    used = "".join(
        f"9: lo inet 10.213.{s}.1/30 scope global\n" for s in range(1, subnets.FIRST_FIXED)
    )
    monkeypatch.setattr(
        netlab, "_run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, used, "")
    )
    with pytest.raises(LabError, match="no free /24"):
        Lab(("a",))._free_slot()


def test_two_slurm_clusters_run_at_once():
    """Each slurmctld listens on a port of its own, free on this machine (tests/lab/slurm.py): a
    fixed one made the second cluster's slurmctld fail to bind, and its readiness wait could take
    the first one's socket for its own."""
    from tests.lab import fanout, subnets
    from tests.lab.slurm import SlurmCluster, slurm_unavailable_reason

    fanout.require(slurm_unavailable_reason(), "slurm mini-cluster")
    with (
        SlurmCluster(1, subnet=subnets.subnet("lab_pair_first")) as first,
        SlurmCluster(1, subnet=subnets.subnet("lab_pair")) as second,
    ):
        assert first.ctld_port != second.ctld_port
        for c in (first, second):
            r = subprocess.run(
                ["sinfo", "-h", "-o", "%N %T"],
                env=c.env,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert r.returncode == 0 and r.stdout.split() == ["node01", "idle"], (
                r.stdout,
                r.stderr,
            )
