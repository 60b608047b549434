"""rbkit.liveplan without hosts: the destination's state read without writing, the itemized
changes (rsync -i like) against the source as the install recorded it, the plan's drift check."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rbkit import liveplan, manifest, manifestfile, planstate, statwalk
from rbrules import paths


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        os.utime(p, (1_700_000_000, 1_700_000_000))
    return root


def scan_rows(root: Path) -> list[list]:
    return [
        list(manifestfile.stat_values(str(root), rel, st)) for rel, st in statwalk.walk(str(root))
    ]


def installed_of(root: Path) -> dict:
    m = manifest.build(str(root), algo="sha256", jobs=1)
    return manifest.relocated(m, {}, manifestfile.fingerprint(m))


def against(installed: dict, root: Path) -> dict:
    """What the destination's `liveplan state --against-install` sends back of the manifest."""
    return planstate.against_install(
        installed["header"], installed["entries"], {r[0]: r for r in scan_rows(root)}
    )


def test_a_first_move_adds_every_entry(tmp_path):
    src = tree(tmp_path / "src", {"a.py": "a", "pkg/b.py": "bb"})
    ch = liveplan.changes(scan_rows(src), [], None)
    assert ch["added"] == 3 and ch["added_bytes"] == 3 and ch["changed"] == ch["removed"] == 0
    assert ch["items"] == [">f+++++++++ a.py", "cd+++++++++ pkg", ">f+++++++++ pkg/b.py"]
    os.symlink("a.py", src / "ln")
    rows = scan_rows(src) + [["dev", "?", 0o600, None, None, None]]
    # nothing there: each line written without a comparison, as the comparison writes it
    ch = liveplan.changes(rows, [], None)
    assert ch["items"] == ["%s %s" % (liveplan._flags(None, r), r[0]) for r in rows]
    assert "cL+++++++++ ln" in ch["items"] and ch["items"][-1] == "c?+++++++++ dev"
    assert ch["added"] == 5


def test_a_rerun_names_exactly_the_file_that_changed_and_what_is_gone(tmp_path):
    src = tree(tmp_path / "src", {"a.py": "a", "pkg/b.py": "bb", "old.py": "o"})
    dst = tree(tmp_path / "dst", {"a.py": "a", "pkg/b.py": "bb", "old.py": "o"})
    installed = installed_of(dst)
    (src / "old.py").unlink()
    (src / "pkg" / "b.py").write_text("bbb")
    ch = liveplan.changes(scan_rows(src), scan_rows(dst), against(installed, dst))
    assert [i for i in ch["items"] if not i.startswith("cd")] == [
        ">f.st...... pkg/b.py",
        "*deleting   old.py",
    ]
    assert (ch["changed"], ch["changed_bytes"], ch["removed"], ch["removed_bytes"]) == (1, 3, 1, 1)


def test_a_file_changed_at_the_destination_since_the_install_is_sent_again(tmp_path):
    src = tree(tmp_path / "src", {"a.py": "a"})
    dst = tree(tmp_path / "dst", {"a.py": "a"})
    installed = installed_of(dst)
    (dst / "a.py").write_text("edited there")
    ch = liveplan.changes(scan_rows(src), scan_rows(dst), against(installed, dst))
    assert ch["items"] == [">f????????? a.py (changed at the destination since the install)"]
    assert ch["changed_there"] == 1


def test_the_destination_state_is_read_without_writing_and_names_the_backup_to_evict(tmp_path):
    dest = tree(tmp_path / "venv", {"a.py": "a"})
    for n in (1, 2):
        tree(tmp_path / f"venv.rb-backup.{n}", {"a.py": "a"})
    before = sorted(os.listdir(tmp_path))
    facts, lines = planstate.dest_state(str(dest), "backup", 2)
    assert sorted(os.listdir(tmp_path)) == before
    assert facts["exists"] and not facts["installed"] and facts["bytes"] == 1
    assert facts["evicts"] == [str(tmp_path / "venv.rb-backup.1")]
    assert planstate.dest_state(str(dest), "replace", 2)[0]["evicts"] == []
    assert (
        len(lines) == 1
        and facts["digest"] == planstate.dest_state(str(dest), "backup", 2)[0]["digest"]
    )
    (dest / "a.py").write_text("b")
    assert planstate.dest_state(str(dest), "backup", 2)[0]["digest"] != facts["digest"]


def installed_at(dest: Path) -> dict:
    """An install of this tool at `dest`: its manifest where the engine's relocate puts it."""
    installed = installed_of(dest)
    manifestfile.save(installed, str(dest / paths.INSTALLED_MANIFEST))
    return installed


def test_an_unchanged_install_is_proven_by_one_walk_without_parsing_its_entries(
    tmp_path, monkeypatch
):
    dest = tree(tmp_path / "venv", {"a.py": "a", "pkg/b.py": "bb", "bin/tool": "t"})
    os.symlink("a.py", dest / "link")
    installed = installed_at(dest)
    lines, _size = statwalk.tree_stat(str(dest))
    assert (
        installed["header"][manifest.INSTALLED_STAT]
        == manifestfile.stat_fingerprint(installed["entries"])
        == __import__("hashlib").sha256(b"".join(lines)).hexdigest()
    )
    full = planstate.dest_state(str(dest), "replace", 0, against=True)

    def unread(_data):
        raise AssertionError("the manifest's entries were parsed")

    monkeypatch.setattr(planstate, "_entries", unread)
    facts, fast_lines = planstate.dest_state(str(dest), "replace", 0, against=True)
    assert facts["install"] == {"moved": {}, "source_entries": []}
    assert (facts, fast_lines) == full
    assert facts["installed_source_stat"] == installed["header"]["source_stat_fingerprint"]


@pytest.mark.parametrize(
    "change, moved",
    [
        (lambda d: (d / "pkg" / "b.py").write_text("edited"), ["pkg/b.py"]),
        (lambda d: os.symlink("/etc/passwd", d / "pkg" / "planted"), ["pkg/planted"]),
        (lambda d: (d / "a.py").unlink(), ["a.py"]),
        (lambda d: os.chmod(d / "a.py", 0o755), ["a.py"]),
    ],
)
def test_an_install_changed_since_falls_back_to_the_full_comparison(tmp_path, change, moved):
    dest = tree(tmp_path / "venv", {"a.py": "a", "pkg/b.py": "bb"})
    installed_at(dest)
    change(dest)
    facts, lines = planstate.dest_state(str(dest), "replace", 0, against=True)
    assert sorted(facts["install"]["moved"]) == moved
    src = tree(tmp_path / "src", {"a.py": "a", "pkg/b.py": "bb"})
    ch = liveplan.changes(scan_rows(src), planstate.stat_rows(lines), facts["install"])
    assert ch["changed"] + ch["removed"] + ch["added"] >= 1


def wide_tree(root: Path) -> Path:
    """Directories several levels deep, excluded caches, links, a name that is not UTF-8."""
    for a in range(3):
        for b in range(12):
            d = root / "lib" / f"p{a}" / f"m{b:02d}"
            tree(d, {f"f{c}.py": "x" * c for c in range(3)})
            (d / "__pycache__").mkdir()
            (d / "__pycache__" / "f0.pyc").write_text("c")
            os.symlink("f1.py", d / "ln")
    tree(root, {"pyvenv.cfg": "home = /usr/bin\n", "bin/python": ""})
    os.mkdir(os.path.join(os.fsencode(root / "lib"), b"bad\xff"))
    return root


@pytest.mark.parametrize("workers", [2, 3, 8, 200])
def test_the_forked_walk_gives_the_walks_own_lines(tmp_path, workers):
    root = wide_tree(tmp_path / "venv")
    pats = ("__pycache__", "*.pyc")
    alone = statwalk.tree_stat(str(root), pats, workers=1)
    assert len(alone[0]) == 4 + 3 + 3 * 12 * 5 and alone[1] == 3 * 12 * 3 + 16  # bad\xff: none
    walked = []
    for rel, st in statwalk.walk(str(root), pats):
        try:
            walked.append(manifestfile.values_line(manifestfile.stat_values(str(root), rel, st)))
        except UnicodeEncodeError:
            pass
    assert alone[0] == walked  # the walk's own lines, in its order
    forked = statwalk.tree_stat(str(root), pats, workers=workers)
    assert b"".join(forked[0]) == b"".join(alone[0]) and forked[1] == alone[1]


def test_a_failed_worker_leaves_the_walk_to_this_process(tmp_path, monkeypatch):
    root = wide_tree(tmp_path / "venv")
    alone = statwalk.tree_stat(str(root), workers=1)
    real = statwalk._stat_lines

    def dies(root_, patterns, top, lines):
        if top:  # in a worker: a subtree
            os._exit(3)
        return real(root_, patterns, top, lines)

    monkeypatch.setattr(statwalk, "_stat_lines", dies)
    assert statwalk.tree_stat(str(root), workers=4) == alone


def write_state(path: Path, dest: Path) -> None:
    facts, lines = planstate.dest_state(str(dest), "replace", 0)
    path.write_bytes(json.dumps(facts).encode() + b"\n" + b"".join(lines))


def test_drift_names_the_side_count_and_first_paths(tmp_path):
    dest = tree(tmp_path / "venv", {"a.py": "a", "b.py": "b"})
    plan = tmp_path / "plan"
    plan.mkdir()
    write_state(plan / "dest.state", dest)
    write_state(tmp_path / "now.state", dest)
    assert liveplan.drift(str(plan / "plan.json"), "dest", str(tmp_path / "now.state"))[0] == 0
    (dest / "b.py").unlink()
    (dest / "c.py").write_text("c")
    write_state(tmp_path / "now.state", dest)
    assert liveplan.drift(str(plan / "plan.json"), "dest", str(tmp_path / "now.state")) == (
        2,
        "b.py (gone), c.py (new)",
    )


@pytest.mark.parametrize(
    "doc, said",
    [
        ({"kind": "rb-plan", "runbook": "other"}, "it is not a plan of runbook t"),
        (
            {"kind": "rb-plan", "runbook": "t", "spec_sha256": "x", "kit_sha256": "k"},
            "this runbook was compiled again since",
        ),
        (
            {
                "kind": "rb-plan",
                "runbook": "t",
                "spec_sha256": "s",
                "kit_sha256": "k",
                "blockers": ["not enough room at /x"],
            },
            "the plan is blocked: not enough room at /x",
        ),
    ],
)
def test_a_plan_of_another_runbook_or_a_blocked_one_is_refused(tmp_path, capsys, doc, said):
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    rc = liveplan.main(
        ["read", str(tmp_path / "plan.json"), "--name", "t", "--spec-sha", "s", "--kit-sha", "k"]
    )
    assert rc == 1 and said in capsys.readouterr().err


def test_compose_writes_the_plan_says_what_blocks_it_and_marks_the_implied_checks(tmp_path, capsys):
    src = tree(tmp_path / "src", {"pyvenv.cfg": "home = /usr/bin", "bin/python": "x"})
    d = tmp_path / "run"
    d.mkdir()
    names = tmp_path / "names"
    from rbkit import hostfs

    hostfs.scan(str(src), [], str(names))
    (d / "source.scan").write_bytes((tmp_path / "names.stat").read_bytes())
    facts, lines = planstate.dest_state(str(tmp_path / "dst" / "venv"), "replace", 0)
    facts["free_bytes"] = 10
    (d / "dest.state").write_bytes(json.dumps(facts).encode() + b"\n" + b"".join(lines))
    checks = {
        "checks": [
            {"id": "relocation", "type": "relocation"},
            {"id": "kernel_audit", "type": "kernel_audit"},
            {"id": "torch", "type": "torch", "allow_skip": True},
        ]
    }
    rc = liveplan.main(
        [
            "compose",
            "--dir",
            str(d),
            "--name",
            "t",
            "--choices",
            '{"schema": 1, "on_existing": "replace"}',
            "--source-bytes",
            "17",
            "--need-bytes",
            "8192",
            "--audit-rc",
            "0",
            "--checks",
            json.dumps(checks),
            "--markdown",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert "checks:      relocation (implied), kernel_audit (implied), torch (may skip)" in out
    assert "NOT ENOUGH ROOM" in out and "BLOCKED:     not enough room at" in out
    plan = json.loads((d / "plan.json").read_text())
    assert plan["blockers"] and plan["disk"]["need"] == 8192 + 819 and plan["send_bytes"] == 17
    assert (d / "changes.txt").read_text().splitlines() == [
        "cd+++++++++ bin",
        ">f+++++++++ pyvenv.cfg",
        ">f+++++++++ bin/python",
    ]
    assert "# Live plan: t" in (d / "plan.md").read_text()


@pytest.mark.parametrize(
    "runbook, args",
    [
        ("cluster8", ["--plan", "--from", "fan_pack"]),
        ("local", ["--apply", "x.json", "--only", "probe"]),
    ],
)
def test_plan_and_apply_are_refused_where_they_do_not_apply_yet(runbook, args):
    import subprocess

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        ["bash", str(root / "generated" / f"{runbook}.sh"), *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "--plan and --apply are for every step of a run (not with --only or --from)" in r.stderr


def test_a_destination_parent_other_users_can_write_is_said_by_the_state(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    facts, _lines = planstate.dest_state(str(shared / "venv"), "replace", 0)
    assert "shared_parent" in facts and str(shared) in facts["shared_parent"]
    shared.chmod(0o755)
    assert "shared_parent" not in planstate.dest_state(str(shared / "venv"), "replace", 0)[0]


def test_the_installs_manifest_is_never_read_through_a_link(tmp_path, capsys):
    """--plan reads the install's manifest as root: a .rb-manifest.jsonl that is a link (to a
    root-only file, here one that looks like a manifest) is not read, and nothing of the file it
    names is printed or taken as the install's."""
    dest = tmp_path / "venv"
    dest.mkdir()
    secret = tmp_path / "secret"
    secret.write_text('{"kind": "rb-manifest", "source_stat_fingerprint": "root only"}\n')
    (dest / ".rb-manifest.jsonl").symlink_to(secret)
    choices = '{"schema": 1, "on_existing": "replace"}'
    assert liveplan.main(["state", str(dest), "--choices", choices, "--against-install"]) == 0
    out = capsys.readouterr().out
    facts = json.loads(out.splitlines()[0])
    assert "root only" not in out and "install" not in facts and "installed_record" not in facts


def test_the_destination_compares_its_entries_with_the_install_and_sends_back_only_what_differs(
    tmp_path,
):
    """`state --against-install`: the manifest stays at the destination; an unchanged install
    sends back nothing of it, an edited file its manifest row, a new file None."""
    dest = tree(tmp_path / "venv", {"pyvenv.cfg": "home = /usr/bin", "lib/a.py": "a"})
    m = installed_of(dest)
    m["header"]["source_stat_fingerprint"] = "f" * 64
    manifestfile.save(m, str(dest / ".rb-manifest.jsonl"), sync=False)
    facts, _lines = planstate.dest_state(str(dest), "replace", 0, True)
    assert facts["installed_source_stat"] == "f" * 64 and facts["install"]["moved"] == {}
    src = [r for r in scan_rows(dest) if r[0] != ".rb-manifest.jsonl"]
    ch = liveplan.changes(src, [], facts["install"], same_source=True)
    assert ch["unchanged"] == len(src) and ch["items"] == []
    (dest / "lib" / "a.py").write_text("edited there")
    (dest / "lib" / "new.py").write_text("n")
    facts, lines = planstate.dest_state(str(dest), "replace", 0, True)
    moved = facts["install"]["moved"]
    assert sorted(moved) == ["lib/a.py", "lib/new.py"] and moved["lib/new.py"] is None
    assert moved["lib/a.py"][3] == 1
    rows = [json.loads(ln) for ln in lines]
    ch = liveplan.changes(src, rows, facts["install"], same_source=True)
    assert ch["items"] == [
        ">f????????? lib/a.py (changed at the destination since the install)",
        "*deleting   lib/new.py",
    ]


def test_the_manifest_step_reads_the_installs_manifest_never_through_a_link(tmp_path, capsys):
    """A re-run's manifest step copies the install's manifest as root (`liveplan installed`): a
    .rb-manifest.jsonl that is a link to a root-only file is refused, exit 2, and nothing of the
    file it names is printed (`cat` followed it)."""
    dest = tmp_path / "venv"
    dest.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    (dest / ".rb-manifest.jsonl").symlink_to(secret)
    assert liveplan.main(["installed", str(dest)]) == 2
    out = capsys.readouterr()
    assert "root only" not in out.out and "not a regular file" in out.err
    (dest / ".rb-manifest.jsonl").unlink()
    (dest / ".rb-manifest.jsonl").write_text('{"path": "x"}\n')
    assert liveplan.main(["installed", str(dest)]) == 0
    assert capsys.readouterr().out == '{"path": "x"}\n'


def test_the_manifest_step_copies_the_installs_manifest_through_the_kit():
    """templates/steps/manifest.sh.j2: the copy goes through `liveplan installed`, no `cat` of
    the destination's manifest (a planted link was followed as root)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "templates/steps/manifest.sh.j2").read_text()
    assert "liveplan installed" in text and 'cat "${RB_DST_ABS}/.rb-manifest.jsonl"' not in text


@pytest.mark.parametrize("kept, said", [(1, "1 backup kept"), (2, "2 backups kept")])
def test_the_plan_counts_the_kept_backups_in_words(tmp_path, capsys, kept, said):
    src = tree(tmp_path / "src", {"a.py": "a"})
    dest = tree(tmp_path / "dst" / "venv", {"a.py": "a"})
    for n in range(1, kept + 1):
        tree(tmp_path / "dst" / f"venv.rb-backup.{n}", {"a.py": "a"})
    d = tmp_path / "run"
    d.mkdir()
    from rbkit import hostfs

    hostfs.scan(str(src), [], str(tmp_path / "names"))
    (d / "source.scan").write_bytes((tmp_path / "names.stat").read_bytes())
    facts, lines = planstate.dest_state(str(dest), "backup", kept)
    (d / "dest.state").write_bytes(json.dumps(facts).encode() + b"\n" + b"".join(lines))
    liveplan.main(
        [
            "compose",
            "--dir",
            str(d),
            "--name",
            "t",
            "--choices",
            '{"schema": 1, "on_existing": "backup", "keep_backups": %d}' % kept,
            "--source-bytes",
            "1",
            "--need-bytes",
            "1",
            "--audit-rc",
            "0",
            "--checks",
            '{"checks": []}',
        ]
    )
    assert "backups:     %s (keep_backups %d)" % (said, kept) in capsys.readouterr().out


def test_compose_loads_no_walk_of_the_destination():
    """The plan's compose runs here on every --plan: loading rbkit.liveplan loads neither the
    manifest's walk nor the destination's modules (the state call loads them, on its host)."""
    import subprocess
    import sys

    hostkit = Path(liveplan.__file__).resolve().parents[1]
    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "import rbkit.liveplan; print(sorted(m for m in sys.modules if m in "
            "('rbkit.manifest', 'rbkit.hostfs', 'rbkit.swapfs', 'rbkit.privacy')))",
            str(hostkit),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "[]"
