"""A fan-out node never installs into the source (issue 33, "fan-out nodes skip the same-or-nested
source check"): the real `rbkit.fanout node` command, and its check on identities made here.

The single-host route refuses a destination that is the source, inside it, or around it, whatever
the names (preflight.preflight with the source's pathid.identity). On 24efc9a a fan-out node had no
such check: `rbkit.fanout node` took the lock and installed, so a node that is the source host (or
shares its file system) staged beside the source and swapped its copy in over it. These tests fail
there: rbkit.fanout has no check_source nor SOURCE_IDENTITY, and the node installs into the alias.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from rbkit import fanout, pathid, runner

from tests.hostkit.test_fanout_delta import bundle, node


def state(root: Path) -> dict:
    """Every entry under root (and root itself): type, mode, inode, and a file's sha256."""
    out = {".": os.lstat(root).st_ino}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            digest = None
            if os.path.islink(p):
                digest = os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_ino, digest)
    return out


@pytest.fixture
def source(tmp_path):
    """A source venv at tmp_path/src/venv, and a bundle of it (with the source's identity)."""
    from rbkit import manifest

    from tests.hostkit.test_kit import make_tree

    src = tmp_path / "src" / "venv"
    make_tree(src, python=True)
    m = manifest.build(str(src), [], "sha256", jobs=2)
    return src, bundle(tmp_path / "b", src, m)


@pytest.mark.parametrize(
    "where,said",
    [
        ("alias/venv", "source and destination are one directory: {src}"),
        ("alias/venv/lib/new", "the destination {src}/lib/new is inside the source {src}"),
        ("alias", "the source {src} is inside the destination {parent}"),
    ],
)
def test_a_node_whose_destination_is_the_source_under_another_name_is_refused(
    source, tmp_path, where, said
):
    """The destination names the source through a symlink to its parent (alias -> src): the node
    refuses it with the single-host route's message, before the lock (nothing is written beside
    it), and the source is untouched."""
    src, d = source
    (tmp_path / "alias").symlink_to(src.parent)
    dest = tmp_path / where
    before, beside = state(src), sorted(os.listdir(src.parent))
    rc, doc = node(d, dest)
    assert rc == 1 and not doc["ok"]
    first = doc["steps"][0]
    assert first["id"] == "preflight" and not first["ok"], doc
    assert first["error"] == [
        "refusing to install %s: %s" % (dest, said.format(src=src, parent=src.parent))
    ]
    assert [s["id"] for s in doc["steps"]] == ["preflight"]  # no lock, no stage
    assert state(src) == before and sorted(os.listdir(src.parent)) == beside
    assert fanout._verdict(doc) == "failed in preflight"


def test_a_bundle_without_the_source_identity_is_refused(source, tmp_path):
    src, d = source
    (d / fanout.SOURCE_IDENTITY).unlink()
    rc, doc = node(d, tmp_path / "node" / "venv")
    assert rc == 1
    assert "the bundle holds no source identity" in doc["steps"][0]["error"][0]
    assert "run the runbook from fan_pack" in doc["steps"][0]["error"][0]
    assert not (tmp_path / "node").exists()


def check(tmp_path: Path, source_identity: dict, dest: Path) -> dict:
    path = tmp_path / "source-identity.json"
    path.write_text(json.dumps(source_identity))
    ctx = runner.Context(str(dest), capture=True, log=lambda line: None)
    return runner.run(ctx, "preflight", fanout.check_source, str(path))


def test_the_node_check_on_identities_of_another_mount_namespace(source, tmp_path):
    """The source scanned in another mount namespace of this machine (a lab node, a container),
    where the same directory has another path: its device and inode give it away. The same path
    on another machine (another boot id, a local file system) is apart."""
    src, _d = source
    (tmp_path / "alias").symlink_to(src.parent)
    there = dict(
        pathid.identity(str(src)),
        mnt_ns="mnt:[1]",
        path="/data/venv",
        abspath="/data/venv",
        realpath="/data/venv",
    )
    got = check(tmp_path, there, tmp_path / "alias" / "venv")
    assert got["status"] == "failed"
    assert got["detail"] == (
        "refusing to install %s/alias/venv: source and destination are the same directory under "
        "two names (/data/venv, %s: one device and inode)" % (tmp_path, src)
    )
    inside = check(tmp_path, there, tmp_path / "alias" / "venv" / "lib" / "x")
    assert "is inside the source /data/venv" in inside["detail"]
    other = dict(pathid.identity(str(src)), boot_id="another-machine", mount=None)
    assert check(tmp_path, other, src)["status"] == "ok"
    assert check(tmp_path, pathid.identity(str(src)), tmp_path / "elsewhere")["status"] == "ok"


def test_the_comparison_names_the_refused_node_and_its_reason():
    ok = {"node": "n1", "ok": True, "steps": [{"id": "stage", "ok": True, "rc": 0}]}
    refused = {
        "node": "n2",
        "ok": False,
        "steps": [
            {
                "id": "preflight",
                "ok": False,
                "rc": 1,
                "error": [
                    "refusing to install /opt/v: source and destination are one directory: /o/v"
                ],
            }
        ],
    }
    reports = {"n1": ok, "n2": refused, "n3": dict(ok, node="n3")}
    result = fanout.compare(["n1", "n2", "n3"], reports, [], "2")
    assert result["columns"][0] == "preflight" and result["passed"]
    assert result["rows"]["n1"]["preflight"] == "pass"
    assert result["rows"]["n2"]["preflight"] == "fail"
    assert result["odd"]["n2"][0] == (
        "preflight: fail (others: pass): refusing to install /opt/v: "
        "source and destination are one directory: /o/v"
    )
    assert "not run after that: stage" in result["odd"]["n2"]
    assert "2/3 nodes passed" in fanout.table(result)
