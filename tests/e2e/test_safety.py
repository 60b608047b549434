"""Hostile source and hostile host, end to end against real sshd hosts (issue #15).

The lab's hosts are network namespaces of this machine: separate hostnames and addresses, one
kernel and one file system, like two containers (or two host ids) for one machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rbkit import pathid

from tests.e2e.test_relay import build, moved_once, report, run, spec_text
from tests.lab.payload import build_payload

pytestmark = pytest.mark.e2e

KIT = str(Path(__file__).resolve().parents[2] / "hostkit")


def identity_on(lab, host: str, path: Path) -> dict:
    """pathid.identity(path) run on `host` over ssh (the kit from this checkout: one file
    system)."""
    r = lab.ssh(
        host,
        [
            "env",
            f"PYTHONPATH={KIT}",
            "python3",
            "-c",
            "import json, sys; from rbkit import pathid; "
            "print(json.dumps(pathid.identity(sys.argv[1])))",
            str(path),
        ],
        check=True,
    )
    return json.loads(r.stdout)


def test_two_hosts_that_are_one_machine_are_seen_as_one(clean_lab, tmp_path):
    lab = clean_lab
    src = tmp_path / "opt" / "venv"
    src.mkdir(parents=True)
    alias = tmp_path / "data"
    alias.symlink_to(tmp_path / "opt")
    a = identity_on(lab, "src", src)
    b = identity_on(lab, "dst", alias / "venv")
    assert a["hostname"] != b["hostname"], "two hosts by name and address"
    why = pathid.same_or_nested(a, b)
    assert why is not None and "one directory" in why
    inside = pathid.same_or_nested(a, identity_on(lab, "dst", alias / "venv" / "lib" / "new"))
    assert inside is not None and "inside the source" in inside
    assert pathid.same_or_nested(a, identity_on(lab, "dst", tmp_path / "opt" / "other")) is None


def test_a_link_where_relocation_writes_is_never_written_through(clean_lab, tmp_path):
    """The source ships `bin/activate.rb-tmp -> BAIT` (the name relocation once wrote its temp
    file under); the spec even allows links that leave the tree. The run installs, relocates
    bin/activate, and BAIT (a file of this machine, seen by dst) is untouched."""
    lab = clean_lab
    bait = tmp_path / "bait"
    bait.write_text("not yours\n")
    venv = build_payload("small", dest=tmp_path / "src" / "venv").venv
    (venv / "bin" / "activate.rb-tmp").symlink_to(bait)
    dst = tmp_path / "dst" / "venv"
    extra = "  outside_links: keep\n"
    script = build(tmp_path, spec_text(lab, venv, dst, extra=extra))
    r = run(tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    assert bait.read_text() == "not yours\n"
    activate = dst / "bin" / "activate"
    assert not activate.is_symlink()
    assert str(dst) in activate.read_text() and str(venv) not in activate.read_text()
    assert os.readlink(dst / "bin" / "activate.rb-tmp") == str(bait), "moved as it was"
    assert report(tmp_path)["outcome"] == "ok"


# -- N4 (issue 33): a destination parent another user can write ----------------------------------

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

# run as nobody: wait for root's env file to appear in the parent nobody owns, then rename nobody's
# own env file over it, again and again (bounded: 20 s or 200,000 renames once it appeared); the
# planted file leaves MARKER if root sources it
RACER = r"""
import os, sys, time
parent, marker = sys.argv[1], sys.argv[2]
env = os.path.join(parent, "venv.env.sh")
evil = ('if [ "$(id -u)" = 0 ]; then echo "sourced as uid 0" > %s; fi\n' % marker).encode()
deadline = time.monotonic() + 600
while not os.path.exists(env) and time.monotonic() < deadline:
    time.sleep(0.001)
end, n = time.monotonic() + 20, 0
while time.monotonic() < end and n < 200000:
    tmp = os.path.join(parent, ".evil.%d" % os.getpid())
    with open(tmp, "wb") as f:
        f.write(evil)
    os.rename(tmp, env)
    n += 1
print(n)
"""


@pytest.fixture
def nobodys_parent():
    """/tmp/rb-n4.XXXX (root's, 0755: nobody can reach in) / shared (nobody's, 0755)."""
    import pwd
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="rb-n4."))
    top.chmod(0o755)
    shared = top / "shared"
    shared.mkdir(mode=0o755)
    os.chown(shared, pwd.getpwnam("nobody").pw_uid, -1)
    yield shared
    shutil.rmtree(top, ignore_errors=True)


def test_a_destination_parent_of_another_user_is_refused_in_preflight(
    clean_lab, payload_small, nobodys_parent, tmp_path
):
    """At 24efc9a this run installed into nobody's directory (rc 0)."""
    lab = clean_lab
    dst = nobodys_parent / "venv"
    script = build(tmp_path, spec_text(lab, payload_small.venv, dst))
    r = run(tmp_path, script)
    assert r.returncode != 0, r.stderr[-3000:]
    assert (
        f"refusing to install {dst} as root: directory {nobodys_parent} is owned by nobody "
        f"(uid 65534), mode 0755: that user can rename or replace what is in it"
    ) in r.stderr
    assert f"chown root {nobodys_parent} && chmod go-w {nobodys_parent}" in r.stderr
    assert "transfer.shared_parent: allow" in r.stderr
    assert report(tmp_path)["steps"][0]["id"] == "preflight"
    assert report(tmp_path)["steps"][0]["status"] == "failed"
    assert os.listdir(nobodys_parent) == [], "nothing written there: no lock, staging, env file"


def test_with_shared_parent_allow_a_swapped_env_file_is_never_sourced_as_root(
    clean_lab, payload_small, nobodys_parent, tmp_path
):
    """shared_parent: allow; nobody, owning the parent, renames its own venv.env.sh over root's
    as soon as it appears, for 20 s. The checks source the install's own copy: the planted file
    never runs as root. At 24efc9a (checked with only the probe's change undone) the probe sourced
    venv.env.sh by name: the marker said `sourced as uid 0`, and the run passed."""
    import subprocess

    lab = clean_lab
    dst = nobodys_parent / "venv"
    marker = tmp_path / "sourced-as-root"
    checks = "checks:\n  - imports: [rb_payload]\n"
    script = build(
        tmp_path,
        spec_text(lab, payload_small.venv, dst, checks=checks, extra="  shared_parent: allow\n"),
    )
    racer = subprocess.Popen(
        [*NOBODY, "/usr/bin/python3", "-c", RACER, str(nobodys_parent), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        r = run(tmp_path, script)
    finally:
        out, err = racer.communicate(timeout=60)
    assert racer.returncode == 0 and int(out) > 0, err
    assert r.returncode == 0, r.stderr[-4000:]
    assert (
        f"warning: directory {nobodys_parent} is owned by nobody (uid 65534), mode 0755" in r.stderr
    )
    assert not marker.exists(), "the env file another user planted was sourced as root"
    doc = report(tmp_path)
    assert doc["outcome"] == "ok" and doc["checks"]["fail"] == 0
    assert "sourced as uid 0" not in r.stderr

    # --restore never installs a backup nobody planted beside it
    subprocess.run(
        [*NOBODY, "sh", "-c", f"mkdir {dst}.rb-backup.1 && echo planted > {dst}.rb-backup.1/tag"],
        check=True,
    )
    r = run(tmp_path, script, "--restore")
    assert r.returncode != 0
    assert (
        f"{dst}.rb-backup.1 is owned by nobody (uid 65534), not by root: not a backup this kit made"
    ) in r.stderr, r.stderr[-3000:]
    assert (dst / "bin" / "payload-hello").exists() and not (dst / "tag").exists()
    r = run(tmp_path, script, "--restore", "1")
    assert r.returncode != 0 and "refusing to restore backup 1" in r.stderr, r.stderr[-3000:]
    assert not (dst / "tag").exists()


def test_a_planted_link_for_the_installs_manifest_is_never_followed_on_a_rerun(
    clean_lab, payload_small, tmp_path
):
    """A re-run after a source change copies the install's manifest from the destination to the
    source (the manifest step's delta). With .rb-manifest.jsonl replaced by a link to a root-only
    file, the copy (once `cat` as root) never reads through it, and nothing of the linked file
    reaches this machine's run directory. Since issue 44 such an install is not proven ours:
    preflight does not take it for this tool's, the whole tree replaces it, nothing is read from
    it (`liveplan installed` refuses it too, closing the window between that check and a copy)."""
    src, dst, script = moved_once(clean_lab, payload_small, tmp_path, compression="none")
    manifest = dst / ".rb-manifest.jsonl"
    secret = tmp_path / "secret"
    secret.write_text(manifest.read_text() + '{"p": "ROOT-ONLY-SECRET"}\n')
    secret.chmod(0o600)
    manifest.unlink()
    manifest.symlink_to(secret)
    next(src.rglob("greeting.txt")).write_text("changed at the source\n")
    r = run(tmp_path, script)
    leaked = [
        p
        for p in (tmp_path / "run").rglob("*")
        if p.is_file() and "ROOT-ONLY-SECRET" in p.read_text(errors="replace")
    ]
    assert not leaked, leaked
    # an install whose manifest is a link is not proven ours (issue 44): not taken for an install
    # of this tool, it is replaced by the whole tree, and nothing is read through the link
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        f"the destination {dst} is not proven an install of this tool: {manifest} is not a "
        "regular file (a symlink)"
    ) in r.stderr, r.stderr[-3000:]
    assert "incremental:" not in r.stderr
    assert not manifest.is_symlink() and "ROOT-ONLY-SECRET" in secret.read_text()
