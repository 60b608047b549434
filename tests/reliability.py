"""Regenerate docs/reliability.md from the hostile-input and fault tests' own results.

    .venv/bin/python -m tests.reliability        (or: make reliability)
    .venv/bin/python -m tests.reliability --only FILE...   (e.g. tests/e2e/test_safety.py)

Runs the tests below with a JUnit XML report, then writes one table row per hostile class or fault:
how many cases ran, how many passed, what the runbook did, and whether anything was lost (each of
these tests asserts that the destination that existed before is byte-identical, or that the canary
never ran). Two tables: hostile input and faults (ROWS), and hostile host and hostile source
(HOSTILE_ROWS: what other users of a shared machine can plant in the source tree or beside the
destination). With --only FILE..., only those files run; every other row keeps the counts the
page had, and the page says which rows ran when.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reliability.md"
FILES = [
    "tests/compiler/test_hostile.py",
    "tests/compiler/test_golden.py",
    "tests/e2e/test_faults.py",
    "tests/e2e/test_relay.py",
    "tests/e2e/test_local_runbook.py",
    "tests/compiler/test_render.py",
    "tests/e2e/test_fanout.py",
    "tests/e2e/test_fanout_slurm.py",
    "tests/e2e/test_fanout_tree.py",
    "tests/hostkit/test_fanout_delta.py",
    "tests/hostkit/test_safety.py",
    "tests/e2e/test_safety.py",
    "tests/hostkit/test_engine.py",
]

# (test-name prefix, row, what happens, what "nothing lost" means there)
ROWS = [
    (
        "test_nasty_value_is_refused",
        "hostile strings in every string field (27 classes: $( ), backticks, "
        "quotes, ;, newline, NUL, leading -, globs, unicode, jinja/heredoc markers)",
        "refused with path:line:col, or compiled shellcheck-clean and dry-run",
        "canary never ran",
    ),
    (
        "test_generated_strings_never_break_out",
        "hostile strings, generated (hypothesis: 15 examples per run)",
        "refused with a location, or compiled and dry-run",
        "no traceback, no crash",
    ),
    (
        "test_hostile_destination_and_values_are_inert",
        "hostile values in a real run (path, excludes, env, description)",
        "the runbook ran; values arrived byte for byte",
        "canary never ran",
    ),
    (
        "test_sh_quoted_words_come_back",
        "quoting filter round trip (hypothesis: 120 examples per run)",
        "every string comes back through bash unchanged",
        "-",
    ),
    ("test_unquoted_value_is_refused", "a template that forgets to quote", "render fails", "-"),
    (
        "test_invalid_case_fails",
        "invalid-spec corpus (golden errors)",
        "exit 2, every problem located, nothing written",
        "nothing written",
    ),
    (
        "test_killing_the_source_sshd",
        "source sshd killed mid-stream",
        "fails in transfer, names the stage",
        "destination byte-identical",
    ),
    (
        "test_target_link_down",
        "target's link down mid-stream",
        "fails in transfer; re-run completes",
        "destination byte-identical",
    ),
    (
        "test_target_filesystem_full",
        "target filesystem full partway",
        "fails in transfer: No space left",
        "destination byte-identical",
    ),
    (
        "test_a_byte_changed_in_staging",
        "a byte changed in the staging copy",
        "fails in verify, file named",
        "nothing installed",
    ),
    (
        "test_a_file_changed_in_staging",
        "a file changed in staging (ssh hosts)",
        "fails in verify, file named",
        "nothing installed",
    ),
    (
        "test_a_byte_flipped_in_transit",
        "a byte flipped in transit by the relay (ssh hosts)",
        "fails in verify on dst, file named",
        "previous install byte-identical",
    ),
    (
        "test_an_incremental_copy_that_fails",
        "a byte changed in an incremental re-run's staging "
        "(unchanged files hard-linked from the install)",
        "fails in verify, file named",
        "install byte-identical (nothing written through the links)",
    ),
    (
        "test_a_file_deleted_from_staging",
        "a file deleted from staging",
        "fails in verify: missing, named",
        "destination byte-identical; re-run completes",
    ),
    ("test_a_changed_host_key", "target host key changed", "refused in preflight", "nothing moved"),
    (
        "test_source_sshd_down_before_start",
        "source unreachable",
        "fails in preflight, host named",
        "destination byte-identical; re-run completes",
    ),
    (
        "test_a_failing_check_after_the_swap",
        "a check fails after the swap (backup)",
        "rolled back to the previous install",
        "previous install back in place",
    ),
    (
        "test_keep_policy_leaves",
        "a check fails after the swap (on_failed_checks: keep)",
        "new install kept, run fails",
        "previous install kept as backup",
    ),
    (
        "test_refuse_leaves",
        "existing destination, on_existing: refuse",
        "stops in preflight",
        "destination byte-identical",
    ),
    (
        "test_existing_destination_survives",
        "refuse, then backup and --restore (ssh hosts)",
        "refused; backed up; restored",
        "previous install restored",
    ),
    (
        "test_odd_nodes_are_named_and_a_node_down",
        "fan-out through clush, 8 nodes: a node whose disk "
        "corrupts a file, a node missing a module, a node killed mid-install",
        "odd nodes named with what differs, the dead node named; `success: 5` met",
        "the other 5 installed and probed",
    ),
    (
        "test_slurm_odd_node_named_and_node_down",
        "fan-out through Slurm (salloc, sbcast, srun), the same three faults",
        "the same, from srun's output",
        "the other 5 installed and probed",
    ),
    (
        "test_policy_all_fails_the_run_when_a_node_is_down",
        "fan-out, one node down, `success: all`",
        "the run fails, the node named",
        "-",
    ),
    (
        "test_a_node_whose_checks_fail_is_rolled_back",
        "fan-out: one node fails its checks after the swap (on_existing: backup)",
        "that node rolled back, named in the table",
        "its previous install back in place; others keep the new one",
    ),
    (
        "test_a_gateway_without_the_ssh_config",
        "clush tree mode: a gateway that cannot reach its nodes",
        "its nodes named without a report; the rest install",
        "-",
    ),
    (
        "test_a_gateway_that_dies_mid_run",
        "clush tree mode: a gateway killed mid-install",
        "the run ends within a second; the nodes behind it named without a report; the rest pass",
        "a node killed mid-extract holds no install, only a staging",
    ),
    (
        "test_an_allocation_without_every_node",
        "Slurm allocation lacking nodes of the spec",
        "refused in preflight, missing nodes named",
        "nothing moved",
    ),
    (
        "test_a_rerun_sends_only_the_change",
        "fan-out re-run where a node lost its install (clush, "
        "Slurm) or has a file changed on it (clush)",
        "the changes go to all; those nodes ask for and "
        "get the whole bundle in a second round; all pass",
        "a node that cannot take the changes installs nothing from them",
    ),
    (
        "test_a_file_changed_on_the_node_that_the_bundle_lacks",
        "fan-out node: a file changed there "
        "that the re-run's bundle does not carry (kit, no cluster)",
        "needs the whole bundle, says which file",
        "its install left as it was (the changed file too)",
    ),
    (
        "test_a_failed_step_fails_the_run_once",
        "a step fails after the swap (exports: a library dir the venv lacks)",
        "exit 1, outcome failed, the step recorded once (it used to end green)",
        "the previous install put back",
    ),
    (
        "test_only_swap_after_a_failed_verify",
        "`--only swap`, `--from relocate`, `--from prove` after a verify that failed",
        "refused: no stamp of this run's verify",
        "the previous install byte-identical",
    ),
    (
        "test_a_second_run_into_the_same_destination",
        "two runs into one destination at once",
        "the second is refused in preflight, naming the first (runbook, host, pid, run dir)",
        "the first installs; nothing mixed",
    ),
    (
        "test_a_source_the_excludes_empty",
        '`exclude: ["*"]` with `on_existing: replace`',
        "refused in preflight: not a venv after the excludes",
        "the working install byte-identical",
    ),
    (
        "test_a_venv_whose_interpreter_is_missing_at",
        "a venv whose base interpreter the destination lacks",
        "stops at prove, before the swap, naming the interpreter",
        "the previous install byte-identical",
    ),
    (
        ("test_a_venv_whose_interpreter_is_missing_here", "test_prove_refuses_an_interpreter"),
        "fan-out node: the venv's interpreter missing, or of another Python version",
        "stops at prove, before the swap",
        "the node's install untouched",
    ),
    (
        "test_a_node_proves_the_install_after_the_swap_and_rolls",
        "fan-out node: bin/pip runs from "
        "the wrong place after the swap (the post-swap proof, now on nodes too)",
        "swap fails, rolled back",
        "the previous install back in place",
    ),
    (
        "test_a_digest_rerun_never_links",
        "fan-out `rerun: digest`: a file corrupted on the node, size and mtime kept",
        "never linked into the new install: the node asks for the whole bundle",
        "the corrupted file replaced by the source's",
    ),
    (
        ("test_swap_and_relocate_refuse_a_staging", "test_a_staging_replaced_after_verify"),
        "the engine: steps after verify without its stamp, a staging replaced after verify",
        "refused",
        "the destination unchanged",
    ),
]


# Hostile host and hostile source (issue #15): tests/hostkit/test_safety.py (the kit's functions,
# on real trees) and tests/e2e/test_safety.py (real runs and real sshd hosts). A prefix may be a
# tuple.
HOSTILE_ROWS = [
    (
        "test_scan_lists_setuid_setgid",
        "a setuid, setgid or world-writable entry in the source "
        "(extracted by root with `--no-same-owner`, another user's setuid file becomes "
        "setuid-root)",
        "scan lists each with its mode; the refusal names them and `transfer.special_modes`",
        "-",
    ),
    (
        ("test_manifest_records_modes_without_special", "test_strip_special_leaves"),
        "`special_modes: strip`: the bits removed from the install",
        "manifest records modes without them; the extracted tree is stripped, links not followed; "
        "verify catches a bit the manifest lacks",
        "a link's target keeps its mode",
    ),
    (
        "test_tar_as_root_keeps_setuid",
        "GNU tar as root: `--no-same-owner` alone, and with "
        "`--no-same-permissions` under `umask 002`",
        "the first makes a setuid-root file (documented); the second never creates a special bit",
        "-",
    ),
    (
        "test_relocation_never_writes_through",
        "a link where relocation writes its temp file (`bin/activate.rb-tmp -> outside`)",
        "rewritten through a new temp file made with O_EXCL and O_NOFOLLOW",
        "the link's target byte-identical",
    ),
    (
        "test_relocation_does_not_follow",
        "`bin/` or `pyvenv.cfg` a link out of the tree",
        "not followed, not rewritten, not copied in",
        "outside files byte-identical",
    ),
    (
        ("test_env_file_write_never_follows", "test_names_and_manifest_files_are_never"),
        "a link at the env file, at its old temp name, at the names list's or the manifest's",
        "replaced, never written through",
        "the link's target byte-identical",
    ),
    (
        "test_scan_reports_links_that_leave",
        "symlinks that leave the tree (absolute, `..`, through another link in the tree)",
        "listed; refused unless `transfer.outside_links: keep`",
        "-",
    ),
    ("test_scan_refuses_device_nodes", "a device node in the source", "refused, always", "-"),
    (
        "test_a_setuid_file_is_refused_unless",
        "a setuid file in the source, in a real run",
        "refused in preflight; with `special_modes: strip` installed without the bit",
        "-",
    ),
    (
        "test_a_destination_inside_the_source_is_refused",
        "the destination inside the source through another name (a symlink alias), in a real run",
        "refused in preflight (the engine: `same_or_nested` of both ends)",
        "nothing written",
    ),
    (
        "test_a_planted_lock_file",
        "a symlink or a hard link planted at the destination's lock file",
        "refused, never written through",
        "the link's target byte-identical",
    ),
    (
        "test_a_link_where_relocation_writes",
        "the planted temp-name link in a real run over ssh (the spec allows outside links)",
        "the run passes; bin/activate relocated; the link moved as it was",
        "its target byte-identical",
    ),
    (
        ("test_same_or_nested", "test_identity_reads"),
        "source and destination one directory or "
        "nested: symlink alias, relative path, bind mount (one inode), the destination's backup, "
        "one NFS export on two machines",
        "`same_or_nested` says why (for preflight to refuse)",
        "-",
    ),
    (
        "test_two_hosts_that_are_one_machine",
        "two hosts (names, addresses) that are one machine, "
        "the destination an alias of the source (ssh hosts)",
        "seen as one directory, or nested; a sibling path is allowed",
        "-",
    ),
    (
        (
            "test_an_interrupted_two_rename_swap",
            "test_restore_after_an_interrupted_swap",
            "test_a_swap_finished_but_not_cleaned",
            "test_an_interrupted_restore_without",
        ),
        "a swap or restore without RENAME_EXCHANGE (NFS) interrupted between its renames",
        "journaled first; the next swap, restore or `recover_swap` finishes or undoes it",
        "the previous install back in place",
    ),
    (
        "test_swap_atomic_require",
        "no RENAME_EXCHANGE with `swap_atomic: require` / `allow`",
        "refused before anything moves / two journaled renames, `atomic: false`",
        "destination unchanged when refused",
    ),
    (
        "test_a_journal_we_did_not_write",
        "a swap journal someone else planted (names outside, a link)",
        "refused, never obeyed",
        "destination unchanged",
    ),
    (
        ("test_swap_and_restore_refuse_a_destination", "test_swap_refuses_a_staging"),
        "a destination or staging that is a symlink",
        "refused, the link's target named",
        "link, target and staging unchanged",
    ),
    (
        "test_scan_judges_room",
        "a sparse file in the source",
        "room judged at the apparent size (`need_bytes`); sparse files listed",
        "-",
    ),
    (
        "test_prune_backups_keeps",
        "backups piling up; a link named like a backup",
        "the `keep_backups` newest kept; the link neither counted nor followed",
        "the link's target kept",
    ),
    (
        "test_a_backup_never_shares_inodes",
        "an in-place write to the install after an "
        "incremental re-run (unchanged files were hard-linked)",
        "the backup holds its own copies (same content, mode, times)",
        "backup unchanged",
    ),
    (
        (
            "test_restore_puts_back_the_env_file",
            "test_the_versioned_env_file",
            "test_restore_says_when",
        ),
        "rollback and `--restore`: the env file, a build that failed its "
        "checks, a backup changed since",
        "the install's own env file put back; a failed build only "
        "when named; a stat check of what was put back",
        "env file matches the install",
    ),
]


def run_tests(xml: Path, files: list) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--junitxml={xml}",
        *files,
    ]
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def tally(xml: Path) -> dict:
    counts: dict = OrderedDict()
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        for prefix, *_ in ROWS + HOSTILE_ROWS:
            if name.startswith(prefix):
                c = counts.setdefault(prefix, {"ran": 0, "passed": 0, "skipped": 0})
                c["ran"] += 0 if skipped else 1
                c["passed"] += 0 if (failed or skipped) else 1
                c["skipped"] += 1 if skipped else 0
    return counts


HEADER = "| hostile class or fault | cases ran | passed | what the runbook did | nothing lost |"


def previous(text: str) -> tuple:
    """The counts of every row of an earlier page (by its row text), and its "Last run" line."""
    counts = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.match(r"^([0-9]+)(?: \(([0-9]+) skipped\))?$", cells[1]) if len(cells) == 5 else None
        if m and cells[2].isdigit():
            counts[cells[0]] = {
                "ran": int(m.group(1)),
                "passed": int(cells[2]),
                "skipped": int(m.group(2) or 0),
            }
    last = re.search(r"^Last run: ([0-9-]+)", text, re.MULTILINE)
    return counts, (last.group(1) if last else "never")


def table(rows: list, counts: dict, before: dict) -> list:
    lines = [HEADER, "|---|---|---|---|---|"]
    for prefix, row, what, lost in rows:
        c = counts.get(prefix) or before.get(row) or {"ran": 0, "passed": 0, "skipped": 0}
        skipped = f" ({c['skipped']} skipped)" if c["skipped"] else ""
        lines.append(f"| {row} | {c['ran']}{skipped} | {c['passed']} | {what} | {lost} |")
    return lines


def write(counts: dict, before: dict = None, last: str = "", only: list = None) -> str:
    today = datetime.date.today().isoformat()
    when = (
        f"Last run: {last}; the rows of {', '.join(only)} ran again on {today}."
        if only
        else f"Last run: {today}."
    )
    lines = [
        "# Reliability: hostile input and faults",
        "",
        "Generated by `make reliability` (`python -m tests.reliability`) from the tests' own "
        "results;",
        "do not edit by hand. Every fault runs end to end against real sshd hosts in network",
        "namespaces (tests/lab), with a real venv.",
        "",
        when,
        "",
        *table(ROWS, counts, before or {}),
        "",
        "## Hostile host and hostile source",
        "",
        "The kit runs as root on machines shared with other users, over trees it did not write",
        '(docs/design.md, "Threat model"). Each case plants what such a user could: in the source',
        "tree, beside the destination, or as a second name for the source. Most run against the",
        "kit's own functions on real trees (tests/hostkit/test_safety.py); the ssh rows are real "
        "runs",
        '(tests/e2e/test_safety.py). "Refused" means the kit\'s answer says so, named; the',
        "preflight that acts on it is wired by the install engine.",
        "",
        *table(HOSTILE_ROWS, counts, before or {}),
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m tests.reliability", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="FILE",
        help="run only these test files; the other rows keep the page's counts",
    )
    a = p.parse_args(argv)
    xml = ROOT / "runs" / "reliability.xml"
    xml.parent.mkdir(exist_ok=True)
    rc = run_tests(xml, a.only or FILES)
    before, last = previous(OUT.read_text()) if a.only and OUT.exists() else ({}, "")
    OUT.write_text(write(tally(xml), before, last, a.only))
    print(f"wrote {OUT} (pytest exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
