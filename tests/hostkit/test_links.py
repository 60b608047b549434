"""One rule for "a link leaves the venv" (rbrules.links): the transfer's scan (rbkit.hostfs, on the
source) and the `outside` check (rbprobes.checks_venv, on the destination) judge the same links
the same way; the only difference is stated: the probe knows the venv's own absolute path."""

from __future__ import annotations

import os

import pytest
from rbkit import hostfs
from rbprobes.checks_venv import outside_refs
from rbrules import links

from tests.hostkit.test_kit import make_tree


def tree(entries: dict):
    """A lookup over a tree given as {path: link text, or "" for a directory or file}."""
    return lambda rel: entries.get(rel)


@pytest.mark.parametrize(
    "rel, target, entries, names, leaves",
    [
        ("a", "/etc", {}, (), True),  # absolute: leaves
        ("a", "/v/lib", {"lib": ""}, ("/v",), False),  # absolute into the tree's own path
        ("a", "/v2/lib", {}, ("/v",), True),  # /v2 is not /v
        ("lib/a", "../../x", {"lib": ""}, (), True),  # `..` above the top
        ("lib/a", "../bin", {"lib": "", "bin": ""}, (), False),
        ("x", "dot/..", {"dot": "."}, (), True),  # lexically inside, really the parent
        ("via", "hop/hostname", {"hop": "/etc"}, (), True),  # through a link that leaves
        ("via", "hop/x", {"hop": "/v/lib", "lib": "", "lib/x": ""}, ("/v",), False),
        ("a", "missing/../../x", {}, (), False),  # dangling: resolves nowhere
        ("a", "loop", {"loop": "loop"}, (), False),  # ELOOP: reaches nothing
    ],
)
def test_the_rule(rel, target, entries, names, leaves):
    assert links.leaves(rel, target, tree(entries), names) is leaves


def test_interpreter_links():
    assert links.interpreter_link("bin/python3.12") and links.interpreter_link("bin/pypy3")
    assert not links.interpreter_link("lib/python3.12") and not links.interpreter_link("bin/pip")
    assert not links.interpreter_link("bin/sub/python")


def test_the_scan_and_the_outside_check_judge_links_alike(tmp_path):
    venv = tmp_path / "venv"
    make_tree(venv, python=True)  # bin/python -> this interpreter's base
    (venv / "dot").symlink_to(".")
    (venv / "sneaky").symlink_to("dot/..")  # the venv's parent
    (venv / "hop").symlink_to("/etc")
    (venv / "via").symlink_to("hop/hostname")  # inside by its name, /etc by its links
    (venv / "up").symlink_to("../elsewhere")
    (venv / "lib64-link").symlink_to("lib")
    (venv / "self-abs").symlink_to(str(venv / "lib"))  # the source's own path
    scanned = {e["p"] for e in hostfs.scan(str(venv), [])["outside_links"]}
    probed = {r["file"] for r in outside_refs(str(venv)) if r["kind"] == "symlink"}
    assert probed == {"sneaky", "hop", "via", "up"}
    # the scan runs on the source, where an absolute link into the tree names the source's path
    assert scanned == probed | {"self-abs"}
    shown = {r["file"]: r["target"] for r in outside_refs(str(venv))}
    assert shown["sneaky"] == os.path.realpath(tmp_path)
