"""A fan-out re-run on one node, without a cluster: the real `rbkit.fanout node` command on bundles
made here. The first bundle carries everything; after one file changes on the source, the
re-run's bundle carries only what `manifest delta` lists, and a node installed from the first
links the rest from its install. A node with no install, or with a file changed there that the
bundle does not carry, asks for the whole bundle and leaves its install as it was."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rbkit import fanout, fanreports, manifest, manifestfile, pathid
from rbrules.choices import Choices

from tests.hostkit.test_kit import make_tree

KIT = Path(__file__).resolve().parents[2] / "hostkit" / "rbkit"
PKG = "lib/python3.11/site-packages/pkg"


def bundle(d: Path, src: Path, m: dict, base: dict | None = None) -> Path:
    """A node's unpacked bundle: kit/rbkit, manifest.jsonl, the source's identity, payload (a tar
    of everything, or of only what changed since `base`, then with delta.names)."""
    (d / "kit").mkdir(parents=True)
    (d / "kit" / "rbkit").symlink_to(KIT)
    (d / fanout.SOURCE_IDENTITY).write_text(json.dumps(pathid.identity(str(src))))
    with open(d / "manifest.jsonl", "w", encoding="utf-8") as f:
        manifestfile.dump(m, f)
    names = d / "delta.names" if base is not None else d / "all.names"
    with open(names, "wb") as f:
        if base is None:
            manifestfile.names(m, f)
        else:
            manifestfile.write_names(manifest.delta(m, base)["send"], f)
    subprocess.run(
        [
            "tar",
            "-C",
            str(src),
            "--null",
            "--no-recursion",
            "-T",
            str(names),
            "-cf",
            str(d / "payload"),
        ],
        check=True,
    )
    return d


def node(d: Path, dest: Path) -> tuple[int, dict]:
    env = dict(os.environ, PYTHONPATH=str(d / "kit"), PYTHONDONTWRITEBYTECODE="1")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "rbkit.fanout",
            "node",
            "--dir",
            str(d),
            "--dest",
            str(dest),
            "--old",
            "/old/venv",
            "--choices",
            Choices(on_existing="replace", jobs=2, timeout=60).to_json(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    reports = fanreports.parse_reports(p.stdout.splitlines())
    assert len(reports) == 1, p.stdout + p.stderr
    return p.returncode, next(iter(reports.values()))


def _lines(doc: dict) -> list[str]:
    buf = io.StringIO()
    fanreports.emit(doc, buf)
    return buf.getvalue().splitlines()


@pytest.fixture
def first(tmp_path):
    """The source, its manifest, and one node (dest) installed from the first, whole bundle."""
    src = tmp_path / "src" / "venv"
    make_tree(src, python=True)
    m1 = manifest.build(str(src), [], "sha256", jobs=2)
    dest = tmp_path / "node1" / "venv"
    dest.parent.mkdir()
    rc, doc = node(bundle(tmp_path / "b1", src, m1), dest)
    assert rc == 0 and doc["ok"], doc
    assert "delta" not in doc
    return src, m1, dest


def change_one_file(src: Path) -> None:
    (src / PKG / "__init__.py").write_text("x = 2222\n")


def test_a_rerun_bundle_carries_only_the_change_and_the_node_links_the_rest(first, tmp_path):
    src, m1, dest = first
    data = dest / PKG / "data.bin"
    inode = data.stat().st_ino
    change_one_file(src)
    m2 = manifest.build(str(src), [], "sha256", jobs=2, reuse=m1)
    d = manifest.delta(m2, m1)
    assert (
        d["send_files"] == 3 and d["unchanged_files"] == 2
    )  # sent: __init__, bin/tool, pyvenv.cfg
    b2 = bundle(tmp_path / "b2", src, m2, base=m1)
    assert (b2 / "payload").stat().st_size < 100_000  # data.bin (3 MiB) stays home
    rc, doc = node(b2, dest)
    assert rc == 0 and doc["ok"], doc
    assert doc["delta"]["linked"] == 2 and doc["delta"]["send_files"] == 3
    assert [s["id"] for s in doc["steps"]] == [
        "stage",
        "receive",
        "verify",
        "relocate",
        "prove",
        "swap",
        "exports",
    ]
    assert (dest / PKG / "__init__.py").read_text() == "x = 2222\n"
    assert data.stat().st_ino == inode  # linked, not sent again
    assert "/node1/venv/bin/python" in (dest / "bin" / "tool").read_text()  # relocated
    assert doc["verify"]["linked"] == 2


def test_a_node_without_an_install_asks_for_the_whole_bundle(first, tmp_path):
    src, m1, _dest = first
    change_one_file(src)
    m2 = manifest.build(str(src), [], "sha256", jobs=2, reuse=m1)
    fresh = tmp_path / "node2" / "venv"
    fresh.parent.mkdir()
    rc, doc = node(bundle(tmp_path / "b2", src, m2, base=m1), fresh)
    assert rc == 3 and not doc["ok"]
    assert doc["needs_full"].startswith("no earlier install")
    assert doc["steps"][0]["error"][0].startswith("needs the whole bundle")
    assert not fresh.exists() and not (fresh.parent / ".venv.rb-staging").exists()


def test_a_file_changed_on_the_node_that_the_bundle_lacks_means_the_whole_bundle(first, tmp_path):
    src, m1, dest = first
    local = dest / PKG / "data.bin"
    local.write_bytes(b"changed on this node")  # not what the last fan-out installed
    change_one_file(src)
    m2 = manifest.build(str(src), [], "sha256", jobs=2, reuse=m1)
    rc, doc = node(bundle(tmp_path / "b2", src, m2, base=m1), dest)
    assert (
        rc == 3 and "1 files here differ" in doc["needs_full"] and "data.bin" in doc["needs_full"]
    )
    assert local.read_bytes() == b"changed on this node"  # the install is left alone
    # the whole bundle comes under a new name (issue 44 R3): this one's directory goes
    assert not (tmp_path / "b2").exists()
    assert (dest / PKG / "__init__.py").read_text() == "x = 1\n"
    assert not (dest.parent / ".venv.rb-staging").exists()
    # and the whole bundle then installs it
    rc, doc = node(bundle(tmp_path / "b3", src, m2), dest)
    assert rc == 0 and doc["ok"] and local.stat().st_size == 3 << 20


def test_pending_and_a_later_round_replacing_a_nodes_report(tmp_path):
    asks = {
        "node": "n2",
        "ok": False,
        "needs_full": "no earlier install at /x",
        "steps": [{"id": "extract", "ok": False, "rc": 3, "error": ["needs the whole bundle"]}],
    }
    fine = {"node": "n1", "ok": True, "steps": [{"id": "extract", "ok": True, "rc": 0}]}
    first = tmp_path / "install.out"
    first.write_text("\n".join(f"{d['node']}: {ln}" for d in (fine, asks) for ln in _lines(d)))
    assert fanreports.pending(
        fanreports.read_reports(["n1", "n2"], [str(first)]), ["n1", "n2"]
    ) == ["n2"]
    second = tmp_path / "install-full.out"
    second.write_text("\n".join("n2: " + ln for ln in _lines(dict(fine, node="n2"))))
    reports = fanreports.read_reports(["n1", "n2"], [str(first), str(second)])
    assert reports["n2"]["ok"] and not fanreports.pending(reports, ["n1", "n2"])
    result = fanout.compare(["n1", "n2"], reports, [], "all")
    assert result["passed"] and result["groups"] == [["n1", "n2"]]
    json.dumps(result)


def test_a_base_with_digests_of_another_algorithm_is_not_used(tmp_path):
    src = tmp_path / "venv"
    make_tree(src)
    old = manifest.build(str(src), [], "blake2b", jobs=2)
    d = manifest.delta(manifest.build(str(src), [], "sha256", jobs=2), old)
    assert not d["usable"] and "another algorithm" in d["why"]


def test_a_node_that_holds_the_tree_keeps_it_and_an_installed_node_drops_its_bundle(
    first, tmp_path
):
    src, m1, dest = first
    assert not (tmp_path / "b1").exists()  # installed: its bundle left the scratch
    inode = (dest / PKG / "data.bin").stat().st_ino
    rc, doc = node(bundle(tmp_path / "again", src, m1), dest)
    assert rc == 0 and doc["ok"] and doc["up_to_date"] == "up to date (quick check)"
    assert all(s.get("skipped") for s in doc["steps"] if s["id"] != "exports")
    assert (dest / PKG / "data.bin").stat().st_ino == inode
    # a file changed at the destination (another size: the quick check, like rsync's, cannot see
    # a same-size change within the same second): not up to date any more, installed again
    (dest / PKG / "__init__.py").write_text("x = 333\n")
    rc, doc = node(bundle(tmp_path / "third", src, m1), dest)
    assert rc == 0 and "up_to_date" not in doc
    assert (dest / PKG / "__init__.py").read_text() == "x = 1\n"
