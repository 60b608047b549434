"""One view of a tree on disk for rbrules.links (rbrules.links.tree_lookup): the transfer's scan
(rbkit.hostfs) and the `outside` check (rbprobes.venvfs) read links through the same function.
Before, each had its own near-identical copy (hostfs._lookup, venvfs.link_lookup), one of which
raised where the other said "nothing there"; this test failed there (no tree_lookup)."""

from __future__ import annotations

import os

from rbkit import hostfs
from rbprobes import venvfs
from rbrules import links


def test_a_tree_seen_through_one_lookup(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    os.symlink("../outside", tmp_path / "d" / "up")
    look = links.tree_lookup(str(tmp_path))
    assert look("f") == "" and look("d") == ""
    assert look("d/up") == "../outside"
    assert look("missing") is None
    assert look("f/through-a-file") is None
    assert venvfs.link_lookup is links.tree_lookup
    assert not hasattr(hostfs, "_lookup")


def test_the_scan_and_the_check_agree_on_a_link_that_leaves(tmp_path):
    os.makedirs(tmp_path / "lib")
    os.symlink("/etc/passwd", tmp_path / "lib" / "out")
    look = links.tree_lookup(str(tmp_path))
    assert links.leaves("lib/out", "/etc/passwd", look)
