"""Issue 36 (Authoring): `ssh_config:` for any host, a file given to ssh as -F for every connection
the runbook makes to it (control master, relay streams, the measurement, the failure diagnosis).
Real sshd hosts (the lab): dst is reached only through an alias that the file defines (HostName,
Port, User, IdentityFile, known_hosts: none of them in the spec), and the file is checked before
ssh reads it (ssh runs what it says on this machine)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from compiler import cli
from tests.e2e.test_relay import build, report, run, spec_text


def team_config(lab, path: Path, *, extra: str = "") -> Path:
    """A team's ssh config: dst as the alias `team-dst`, with its own connection sharing."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    path.write_text(
        "Host team-dst\n"
        f"  HostName {lab.host('dst').addr}\n"
        "  Port 22\n"
        "  User root\n"
        f"  IdentityFile {lab.identity}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {lab.known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        # what a team's file often holds: the runbook's own sharing (given first) wins over it
        "  ControlMaster auto\n"
        f"  ControlPath {path.parent}/cm-%C\n"
        "  ControlPersist 60\n" + extra
    )
    path.chmod(0o600)
    return path


def aliased(lab, src: Path, dst: Path, config: Path | str) -> str:
    """The relay spec with dst given as `ssh: team-dst` and the file, nothing else of ssh."""
    text = spec_text(lab, src, dst)
    dst_block = text[text.index("  dst:\n") : text.index("transfer:\n")]
    return text.replace(dst_block, f"  dst:\n    ssh: team-dst\n    ssh_config: {config}\n")


@pytest.mark.e2e
def test_a_host_reached_only_through_an_alias_of_its_ssh_config_gets_a_whole_run(
    clean_lab, payload_small, tmp_path
):
    lab = clean_lab
    config = team_config(lab, tmp_path / "team" / "ssh_config")
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, aliased(lab, payload_small.venv, dst, config))
    text = script.read_text()
    assert f"-F {config}" in text and "team-dst" in text and lab.host("dst").addr not in text
    r = run(tmp_path, script, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert report(tmp_path)["outcome"] == "ok"
    assert (dst / "bin" / "python").exists() and (dst / "pyvenv.cfg").is_file()
    # the runbook's connection sharing won over the file's: no master of the file's left behind
    assert not list(config.parent.glob("cm-*"))


@pytest.mark.e2e
def test_a_relative_ssh_config_is_found_from_the_runbooks_folder_wherever_it_runs_from(
    clean_lab, payload_small, tmp_path
):
    """Issue 36: `ssh_config: ssh/config` in proj/specs/relay.yaml is proj/specs/ssh/config; the
    runbook compiled into proj/generated/ holds no absolute path of the checkout and finds the
    file from its own folder, run by a relative path from elsewhere; the owner/mode check
    judges that file (a group-writable one is refused by its real name), then the run passes."""
    lab = clean_lab
    proj = tmp_path / "proj"
    (proj / "specs").mkdir(parents=True)
    config = team_config(lab, proj / "specs" / "ssh" / "config")
    (proj / "specs" / "ssh").chmod(0o700)
    spec = proj / "specs" / "relay.yaml"
    spec.write_text(aliased(lab, payload_small.venv, tmp_path / "dst" / "venv", "ssh/config"))
    assert cli.main([str(spec), "-o", str(proj / "generated")]) == 0
    script = proj / "generated" / "relay.sh"
    assert str(tmp_path) not in "".join(
        x for x in script.read_text().splitlines() if "RB_HOST_SSH=(" in x
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = dict(os.environ, RB_RUN_DIR=str(tmp_path / "run"))

    def preflight() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "../proj/generated/relay.sh", "--only", "preflight"],
            cwd=elsewhere,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    config.chmod(0o660)
    r = preflight()
    assert r.returncode != 0, r.stderr[-3000:]
    line = next(
        (x for x in r.stderr.splitlines() if "FAILED in step preflight on host dst" in x), ""
    )
    assert (
        f"refusing hosts.dst.ssh_config {config}: the file {config} is writable by its group"
        in line
    ), r.stderr[-3000:]
    # ssh's own complaint names the file by the path it was given: from the runbook's folder as
    # the kernel reaches it, not `elsewhere/../proj/generated/...`
    team_config(lab, config, extra="  NoSuchOption yes\n")
    r = preflight()
    assert r.returncode != 0, r.stderr[-3000:]
    given = proj / "generated" / ".." / "specs" / "ssh" / "config"
    assert f"dst: {given}: line 12: Bad configuration option" in r.stderr, r.stderr[-3000:]
    assert "elsewhere/.." not in r.stderr, r.stderr[-3000:]
    team_config(lab, config)
    r = preflight()
    assert r.returncode == 0, r.stderr[-3000:]  # dst is reached only through the file's alias


@pytest.mark.e2e
@pytest.mark.parametrize(
    "fault, said",
    [
        ("missing", "No such file or directory"),
        ("writable by its group", "is writable by its group (mode 0660); another user could"),
        (
            "a folder others can write",
            "mode 0777: writable by group and others without the sticky bit",
        ),
    ],
)
def test_an_ssh_config_another_user_could_change_is_refused_before_ssh_reads_it(
    clean_lab, payload_small, tmp_path, fault, said
):
    lab = clean_lab
    config = tmp_path / "team" / "ssh_config"
    if fault != "missing":
        team_config(lab, config)
    if fault == "writable by its group":
        config.chmod(0o660)
    elif fault == "a folder others can write":
        config.parent.chmod(0o777)
    dst = tmp_path / "dst" / "venv"
    script = build(tmp_path, aliased(lab, payload_small.venv, dst, config))
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    line = next(
        (x for x in r.stderr.splitlines() if "FAILED in step preflight on host dst" in x), ""
    )
    assert "refusing hosts.dst.ssh_config" in line and said in line, r.stderr[-3000:]
    assert not (tmp_path / "dst").exists()  # nothing reached dst


def unknown_key_preflight(
    lab, payload, tmp_path: Path, *, extra: str = ""
) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """dst's alias in a team's file whose known_hosts file is empty: the preflight, failed on
    dst's unknown key, the empty file and the runbook."""
    config = team_config(lab, tmp_path / "team" / "ssh_config", extra=extra)
    empty = tmp_path / "team" / "known_hosts"
    empty.write_text("")
    config.write_text(config.read_text().replace(str(lab.known_hosts), str(empty)))
    script = build(tmp_path, aliased(lab, payload.venv, tmp_path / "dst" / "venv", config))
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode != 0, r.stderr[-3000:]
    return r, empty, script


@pytest.mark.e2e
def test_an_unknown_host_key_behind_an_alias_gets_a_hint_with_the_address_and_file_ssh_used(
    clean_lab, payload_small, tmp_path
):
    """The host-key hint resolves the alias as ssh does (ssh -F FILE -G): ssh-keyscan of the
    address the file names, added to the known_hosts file the file names."""
    lab = clean_lab
    r, empty, _script = unknown_key_preflight(lab, payload_small, tmp_path)
    assert f"ssh-keyscan {lab.host('dst').addr} >> {empty}" in r.stderr, r.stderr[-3000:]
    assert "ssh-keyscan team-dst" not in r.stderr


@pytest.mark.e2e
def test_an_unknown_host_key_behind_a_host_key_alias_is_recorded_under_the_alias(
    clean_lab, payload_small, tmp_path
):
    """With HostKeyAlias, ssh looks the host's key up under the alias: the hint's keyscan line
    records it so (before, it recorded the address, which ssh never looks up, and the next run
    failed the same way). The hint's command, run as given, makes the next preflight pass."""
    lab = clean_lab
    r, empty, script = unknown_key_preflight(
        lab, payload_small, tmp_path, extra="  HostKeyAlias team-dst-key\n"
    )
    addr = lab.host("dst").addr
    record = f"ssh-keyscan {addr} | sed 's/^[^ ]*/team-dst-key/' >> {empty}"
    assert record in r.stderr, r.stderr[-3000:]
    subprocess.run(["sh", "-c", record], check=True, capture_output=True)
    r = run(tmp_path, script, "--only", "preflight", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
