"""Hostile source and hostile host, end to end against real sshd hosts (issue #15).

The lab's hosts are network namespaces of this machine: separate hostnames and addresses, one
kernel and one file system, like two containers (or two host ids) for one machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rbkit import hostfs
from tests.e2e.test_relay import build, report, run, spec_text
from tests.lab.payload import build_payload

pytestmark = pytest.mark.e2e

KIT = str(Path(__file__).resolve().parents[2] / "hostkit")


def identity_on(lab, host: str, path: Path) -> dict:
    """hostfs.identity(path) run on `host` over ssh (the kit from this checkout: one file system)."""
    r = lab.ssh(host, ["env", f"PYTHONPATH={KIT}", "python3", "-c",
                       "import json, sys; from rbkit import hostfs; "
                       "print(json.dumps(hostfs.identity(sys.argv[1])))", str(path)], check=True)
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
    why = hostfs.same_or_nested(a, b)
    assert why is not None and "one directory" in why
    inside = hostfs.same_or_nested(a, identity_on(lab, "dst", alias / "venv" / "lib" / "new"))
    assert inside is not None and "inside the source" in inside
    assert hostfs.same_or_nested(a, identity_on(lab, "dst", tmp_path / "opt" / "other")) is None


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
