"""The rules that judge what root reads back or hands to ssh (issue 44, round three), against the
kit's functions: rbrules.proven.read_record (a saved plan and the records beside it) and
rbrules.sshfiles (the files ssh reads for a host, as ssh -G names them). The runbook's own use of
them is tests/e2e/test_proven_ssh.py."""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import pytest
from rbrules import proven, sshfiles

from tests.conftest import IN_CI

NOBODY = pwd.getpwnam("nobody").pw_uid
ME = os.geteuid()
pytestmark = pytest.mark.skipif(ME != 0 and not IN_CI, reason="chown to another user needs root")


@pytest.fixture
def private_dir():
    d = Path(tempfile.mkdtemp(prefix="rb-proven-"))
    yield d
    for p in sorted(d.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() or p.is_symlink() else p.rmdir()
    d.rmdir()


def test_a_record_of_this_user_in_a_private_folder_is_read(private_dir):
    plan = private_dir / "plan.json"
    plan.write_text("{}")
    plan.chmod(0o664)  # a umask's group bit: no one else reaches a 0700 folder
    assert proven.read_record(str(plan)) == b"{}"


@pytest.mark.parametrize(
    "fault, said",
    [
        ("a symlink", "is a symbolic link"),
        ("a FIFO", "is not a regular file"),
        ("two links", "has 2 links"),
        ("nobody's", "is owned by nobody"),
        ("too big", "larger than a record can be (4 bytes at most)"),
        (
            "a folder others can reach, the file writable by all",
            "is writable by others (mode 0666)",
        ),
        ("a folder nobody owns", "is owned by nobody (uid %d)" % NOBODY),
    ],
)
def test_a_record_not_proven_this_users_is_refused_before_it_is_read(private_dir, fault, said):
    plan = private_dir / "plan.json"
    other = private_dir / "other.json"
    other.write_text("{}")
    if fault == "a symlink":
        plan.symlink_to(other)
    elif fault == "a FIFO":
        os.mkfifo(plan)
    elif fault == "two links":
        os.link(other, plan)
    else:
        plan.write_text("{   }" if fault == "too big" else "{}")
    if fault == "nobody's":
        os.chown(plan, NOBODY, NOBODY)
    elif fault.startswith("a folder others can reach"):
        private_dir.chmod(0o755)
        plan.chmod(0o666)
    elif fault == "a folder nobody owns":
        os.chown(private_dir, NOBODY, NOBODY)
    with pytest.raises(proven.NotOurs, match=said.replace("(", r"\(").replace(")", r"\)")):
        proven.read_record(str(plan), cap=4 if fault == "too big" else proven.RECORD_MAX_BYTES)
    os.chown(private_dir, ME, ME)


def test_ssh_g_decides_the_known_hosts_files_and_a_config_file_is_judged_first(private_dir):
    """Without any connection: the config's UserKnownHostsFile (ssh -G) is what is judged."""
    config = private_dir / "ssh_config"
    config.write_text("Host team\n  HostName 192.0.2.1\n  UserKnownHostsFile /dev/./null\n")
    config.chmod(0o600)
    words = ["-F", str(config), "-o", "StrictHostKeyChecking=accept-new"]
    with pytest.raises(sshfiles.Refused, match="UserKnownHostsFile /dev/null .*turns host key"):
        sshfiles.judge("dst", "team", words)
    kh = private_dir / "known_hosts"
    kh.write_text("")
    kh.chmod(0o666)
    config.write_text(
        f"Host team\n  HostName 192.0.2.1\n  UserKnownHostsFile {kh}\n"
        "  GlobalKnownHostsFile /dev/null\n"
    )
    with pytest.raises(sshfiles.Refused, match=f"refusing UserKnownHostsFile {kh} of hosts.dst"):
        sshfiles.judge("dst", "team", words)
    kh.chmod(0o600)
    sshfiles.judge("dst", "team", words)
    # a config file another user can change is refused before ssh reads it (-G runs Match exec)
    config.write_text(f'Match exec "touch {private_dir}/ran"\n')
    os.chown(config, NOBODY, NOBODY)
    with pytest.raises(sshfiles.Refused, match="refusing hosts.dst.ssh_config"):
        sshfiles.judge("dst", "team", words)
    assert not (private_dir / "ran").exists()
