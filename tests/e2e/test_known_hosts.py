"""Issue 33 N5: the known_hosts files a spec names are checked before ssh reads them. A file ssh
can neither read nor write knows no host key: with host_keys: accept-new every key was then taken,
a changed one too, without a word. Real sshd hosts (the lab); each case plants the file's fault."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_relay import build, run, spec_text


def with_known_hosts(lab, src: Path, dst: Path, known_hosts: str, host_keys: str) -> str:
    """The relay spec with dst's UserKnownHostsFile and host_keys replaced (src keeps the lab's)."""
    text = spec_text(lab, src, dst)
    dst_block = f"  dst:\n    ssh: root@{lab.host('dst').addr}\n"
    at = text.index(dst_block)
    head, tail = text[:at], text[at:]
    tail = tail.replace(
        f"UserKnownHostsFile: {lab.known_hosts}", f"UserKnownHostsFile: {known_hosts}", 1
    )
    tail = tail.replace(dst_block, f"{dst_block}    host_keys: {host_keys}\n", 1)
    return head + tail


@pytest.mark.e2e
@pytest.mark.parametrize(
    "host_keys, fault, said",
    [
        ("strict", "missing", "does not exist here: ssh would know no host key of dst"),
        ("accept-new", "no folder", "cannot make it there (TMP/keys must be a folder of this user"),
        ("accept-new", "folder others can write", "does not exist and ssh cannot make it there"),
        ("accept-new", "a folder, not a file", "is not a regular file here"),
    ],
)
def test_a_known_hosts_file_ssh_cannot_use_is_refused_before_ssh_runs(
    clean_lab, payload_small, tmp_path, host_keys, fault, said
):
    lab = clean_lab
    kh = tmp_path / "keys" / "known_hosts"
    if fault == "missing":
        kh.parent.mkdir(mode=0o700)
    elif fault == "folder others can write":
        kh.parent.mkdir()
        kh.parent.chmod(0o1777)  # like /tmp: ssh would write the key where anyone can swap it
    elif fault == "a folder, not a file":
        kh.mkdir(parents=True)
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, with_known_hosts(lab, payload_small.venv, dst, str(kh), host_keys))
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    line = next(
        (x for x in r.stderr.splitlines() if "UserKnownHostsFile" in x and "FAILED" in x), ""
    )
    said = said.replace("TMP", str(tmp_path))
    assert f"hosts.dst: UserKnownHostsFile {kh} " in line and said in line, r.stderr[-3000:]
    assert "FAILED in step preflight on host dst: hosts.dst: UserKnownHostsFile" in r.stderr
    # refused before ssh read the file: nothing recorded, no kit sent to dst
    assert not kh.is_file()
    assert not (tmp_path / "dst").exists()


@pytest.mark.e2e
def test_accept_new_makes_the_file_once_its_folder_is_private_and_records_the_key(
    clean_lab, payload_small, tmp_path
):
    """The first contact that accept-new is for: refused while others can write the folder ssh
    would make the file in; once it is private, ssh makes the file and records dst's key there."""
    lab = clean_lab
    kh = tmp_path / "keys" / "known_hosts"
    kh.parent.mkdir()
    kh.parent.chmod(0o777)
    script = build(
        tmp_path,
        with_known_hosts(lab, payload_small.venv, tmp_path / "dst" / "venv", str(kh), "accept-new"),
    )
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode != 0 and f"chmod go-w {kh.parent}" in r.stderr, r.stderr[-3000:]
    assert not kh.exists()
    kh.parent.chmod(0o700)
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # the key recorded for dst's address (hashed or not, as this machine's ssh_config says)
    found = subprocess.run(
        ["ssh-keygen", "-F", lab.host("dst").addr, "-f", str(kh)], capture_output=True, text=True
    )
    assert found.returncode == 0 and "ssh-ed25519" in found.stdout, kh.read_text()
