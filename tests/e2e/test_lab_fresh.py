"""A freshly booted machine passes `make test` (issue 34): every lab makes what it needs under the
boot-emptied /run itself (tests/lab/rundirs.py), so none relies on a dir that another lab, an
earlier run or an installer left there. The fan-out clusters' sshds once exited at setup ("Missing
privilege separation directory: /run/sshd") on a fresh machine, because only the two-host lab made
that dir.

Each lab here starts in a private mount namespace with an empty tmpfs over /run (this machine's
/run, which live labs of other test runs use, stays as it is)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.lab import LabError, subnets
from tests.lab.cluster import cluster_unavailable_reason
from tests.lab.fanout import require
from tests.lab.fixtures import require_lab
from tests.lab.rundirs import LAB_LOCKS, RUN_DIRS, SSHD_PRIVSEP, empty_run_argv, ensure_run_dirs
from tests.lab.slurm import slurm_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
SUBNET = subnets.subnet("lab_fresh")

# Runs in the empty /run: says what was there, starts the lab, reaches each node over ssh, stops it.
_SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys
    from tests.lab.cluster import Cluster
    from tests.lab.netlab import Lab
    from tests.lab.slurm import SlurmCluster
    kind, subnet = sys.argv[1], sys.argv[2]
    out = {"before": sorted(os.listdir("/run"))}
    if kind == "lab":
        with Lab(("src", "dst"), prefix="rbfresh") as lab:
            out["hostnames"] = [
                lab.ssh(h, "hostname", check=True).stdout.strip() for h in lab.hosts
            ]
    else:
        cls = SlurmCluster if kind == "slurm" else Cluster
        with cls(2, subnet=subnet) as c:
            out["hostnames"] = [c.ssh(n, "hostname", check=True).stdout.strip() for n in c.names]
            if kind == "slurm":
                r = subprocess.run(c.salloc(["srun", "hostname"]), capture_output=True, text=True,
                                   env=c.env, timeout=120)
                out["srun"] = sorted(r.stdout.split())
    st = os.stat("/run/sshd")
    out["sshd_dir"] = [st.st_uid, st.st_gid, oct(st.st_mode & 0o7777)]
    out["after"] = sorted(os.listdir("/run"))
    print("RESULT " + json.dumps(out))
""")


def _start_on_empty_run(kind: str, share: tuple[str, ...] = ()) -> dict:
    r = subprocess.run(
        empty_run_argv([sys.executable, "-c", _SCRIPT, kind, SUBNET], share=share),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    assert r.returncode == 0 and line, (
        f"{kind} did not come up from an empty /run "
        f"(rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    )
    return json.loads(line[0][len("RESULT ") :])


@pytest.mark.e2e
def test_every_lab_comes_up_from_an_empty_run():
    """The cluster, the Slurm cluster and the two-host lab, each from an empty /run: no /run/sshd,
    no /run/rblab, no /run/netns. The Lab shares this machine's /run/rblab (its slot allocation
    lock, held by live labs of other runs); the clusters start from nothing at all."""
    require_lab()
    require(slurm_unavailable_reason() or cluster_unavailable_reason(), "the Slurm lab")
    for kind, share in (("cluster", ()), ("slurm", ()), ("lab", (LAB_LOCKS.path,))):
        if share:
            ensure_run_dirs([LAB_LOCKS])
        got = _start_on_empty_run(kind, share)
        assert "sshd" not in got["before"] and "netns" not in got["before"], got
        assert ("rblab" in got["before"]) == bool(share), got
        want = ["src", "dst"] if kind == "lab" else ["node01", "node02"]
        assert got["hostnames"] == want, got
        assert got.get("srun", want) == want, got
        assert got["sshd_dir"] == [0, 0, "0o755"], got
        assert {"sshd", "rblab", "netns"} <= set(got["after"]), got


def test_run_dirs_made_under_a_root(tmp_path):
    """ensure_run_dirs: the missing dirs made root:root with their mode (not the umask's), a dir
    that sshd would refuse (group/world writable) put right, nothing touched the second time, and a
    file in a dir's place named."""
    if os.geteuid() != 0 and not IN_CI:
        pytest.skip("chown to root needs root")
    old = os.umask(0o077)
    try:
        made = ensure_run_dirs(root=tmp_path)
    finally:
        os.umask(old)
    assert made == [tmp_path / d.path.lstrip("/") for d in RUN_DIRS]
    for d in RUN_DIRS:
        st = (tmp_path / d.path.lstrip("/")).stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, d.mode)
    sshd = tmp_path / "run" / "sshd"
    sshd.chmod(0o777)
    assert ensure_run_dirs(root=tmp_path) == [sshd]
    assert stat.S_IMODE(sshd.stat().st_mode) == 0o755
    assert ensure_run_dirs(root=tmp_path) == []
    sshd.rmdir()
    sshd.write_text("")
    with pytest.raises(
        LabError, match=r"run/sshd \(sshd's privilege separation dir.*not a directory"
    ):
        ensure_run_dirs([SSHD_PRIVSEP], root=tmp_path)
