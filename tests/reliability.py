"""Regenerate docs/reliability.md from the hostile-input and fault tests' own results.

    .venv/bin/python -m tests.reliability        (or: make reliability)

Runs the tests below with a JUnit XML report, then writes one table row per hostile class or fault:
how many cases ran, how many passed, what the runbook did, and whether anything was lost (each of
these tests asserts that the destination that existed before is byte-identical, or that the canary
never ran).
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reliability.md"
FILES = ["tests/test_hostile.py", "tests/test_golden.py", "tests/e2e/test_faults.py",
         "tests/e2e/test_relay.py", "tests/e2e/test_local_runbook.py", "tests/test_render.py",
         "tests/e2e/test_fanout.py", "tests/e2e/test_fanout_slurm.py", "tests/e2e/test_fanout_tree.py",
         "tests/test_fanout_delta.py"]

# (test-name prefix, row, what happens, what "nothing lost" means there)
ROWS = [
    ("test_nasty_value_is_refused", "hostile strings in every string field (27 classes: $( ), backticks, "
     "quotes, ;, newline, NUL, leading -, globs, unicode, jinja/heredoc markers)",
     "refused with path:line:col, or compiled shellcheck-clean and dry-run", "canary never ran"),
    ("test_generated_strings_never_break_out", "hostile strings, generated (hypothesis: 15 examples per run)",
     "refused with a location, or compiled and dry-run", "no traceback, no crash"),
    ("test_hostile_destination_and_values_are_inert", "hostile values in a real run (path, excludes, "
     "env, description)", "the runbook ran; values arrived byte for byte", "canary never ran"),
    ("test_sh_quoted_words_come_back", "quoting filter round trip (hypothesis: 120 examples per run)",
     "every string comes back through bash unchanged", "-"),
    ("test_unquoted_value_is_refused", "a template that forgets to quote", "render fails", "-"),
    ("test_invalid_case_fails", "invalid-spec corpus (golden errors)",
     "exit 2, every problem located, nothing written", "nothing written"),
    ("test_killing_the_source_sshd", "source sshd killed mid-stream",
     "fails in transfer, names the stage", "destination byte-identical"),
    ("test_target_link_down", "target's link down mid-stream", "fails in transfer; re-run completes",
     "destination byte-identical"),
    ("test_target_filesystem_full", "target filesystem full partway", "fails in transfer: No space left",
     "destination byte-identical"),
    ("test_a_byte_changed_in_staging", "a byte changed in the staging copy", "fails in verify, file named",
     "nothing installed"),
    ("test_a_file_changed_in_staging", "a file changed in staging (ssh hosts)",
     "fails in verify, file named", "nothing installed"),
    ("test_a_byte_flipped_in_transit", "a byte flipped in transit by the relay (ssh hosts)",
     "fails in verify on dst, file named", "previous install byte-identical"),
    ("test_an_incremental_copy_that_fails", "a byte changed in an incremental re-run's staging "
     "(unchanged files hard-linked from the install)", "fails in verify, file named",
     "install byte-identical (nothing written through the links)"),
    ("test_a_file_deleted_from_staging", "a file deleted from staging", "fails in verify: missing, named",
     "destination byte-identical; re-run completes"),
    ("test_a_changed_host_key", "target host key changed", "refused in preflight",
     "nothing moved"),
    ("test_source_sshd_down_before_start", "source unreachable", "fails in preflight, host named",
     "destination byte-identical; re-run completes"),
    ("test_a_failing_check_after_the_swap", "a check fails after the swap (backup)",
     "rolled back to the previous install", "previous install back in place"),
    ("test_keep_policy_leaves", "a check fails after the swap (on_failed_checks: keep)",
     "new install kept, run fails", "previous install kept as backup"),
    ("test_refuse_leaves", "existing destination, on_existing: refuse", "stops in preflight",
     "destination byte-identical"),
    ("test_existing_destination_survives", "refuse, then backup and --restore (ssh hosts)",
     "refused; backed up; restored", "previous install restored"),
    ("test_odd_nodes_are_named_and_a_node_down", "fan-out through clush, 8 nodes: a node whose disk "
     "corrupts a file, a node missing a module, a node killed mid-install",
     "odd nodes named with what differs, the dead node named; `success: 5` met", "the other 5 "
     "installed and probed"),
    ("test_slurm_odd_node_named_and_node_down", "fan-out through Slurm (salloc, sbcast, srun), the "
     "same three faults", "the same, from srun's output", "the other 5 installed and probed"),
    ("test_policy_all_fails_the_run_when_a_node_is_down", "fan-out, one node down, `success: all`",
     "the run fails, the node named", "-"),
    ("test_a_node_whose_checks_fail_is_rolled_back", "fan-out: one node fails its checks after the "
     "swap (on_existing: backup)", "that node rolled back, named in the table",
     "its previous install back in place; others keep the new one"),
    ("test_a_gateway_without_the_ssh_config", "clush tree mode: a gateway that cannot reach its "
     "nodes", "its nodes named without a report; the rest install", "-"),
    ("test_a_gateway_that_dies_mid_run", "clush tree mode: a gateway killed mid-install",
     "the run ends within a second; the nodes behind it named without a report; the rest pass",
     "a node killed mid-extract holds no install, only a staging"),
    ("test_an_allocation_without_every_node", "Slurm allocation lacking nodes of the spec",
     "refused in preflight, missing nodes named", "nothing moved"),
    ("test_a_rerun_sends_only_the_change", "fan-out re-run where a node lost its install (clush, "
     "Slurm) or has a file changed on it (clush)", "the changes go to all; those nodes ask for and "
     "get the whole bundle in a second round; all pass", "a node that cannot take the changes "
     "installs nothing from them"),
    ("test_a_file_changed_on_the_node_that_the_bundle_lacks", "fan-out node: a file changed there "
     "that the re-run's bundle does not carry (kit, no cluster)", "needs the whole bundle, says "
     "which file", "its install left as it was (the changed file too)"),
]


def run_tests(xml: Path) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *FILES]
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def tally(xml: Path) -> dict:
    counts: dict = OrderedDict()
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        for prefix, *_ in ROWS:
            if name.startswith(prefix):
                c = counts.setdefault(prefix, {"ran": 0, "passed": 0, "skipped": 0})
                c["ran"] += 0 if skipped else 1
                c["passed"] += 0 if (failed or skipped) else 1
                c["skipped"] += 1 if skipped else 0
    return counts


def write(counts: dict) -> str:
    lines = [
        "# Reliability: hostile input and faults",
        "",
        "Generated by `make reliability` (`python -m tests.reliability`) from the tests' own results;",
        "do not edit by hand. Every fault runs end to end against real sshd hosts in network",
        "namespaces (tests/lab), with a real venv.",
        "",
        f"Last run: {datetime.date.today().isoformat()}.",
        "",
        "| hostile class or fault | cases ran | passed | what the runbook did | nothing lost |",
        "|---|---|---|---|---|",
    ]
    for prefix, row, what, lost in ROWS:
        c = counts.get(prefix, {"ran": 0, "passed": 0, "skipped": 0})
        skipped = f" ({c['skipped']} skipped)" if c["skipped"] else ""
        lines.append(f"| {row} | {c['ran']}{skipped} | {c['passed']} | {what} | {lost} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    xml = ROOT / "runs" / "reliability.xml"
    xml.parent.mkdir(exist_ok=True)
    rc = run_tests(xml)
    OUT.write_text(write(tally(xml)))
    print(f"wrote {OUT} (pytest exit {rc})")
    return rc


if __name__ == "__main__":
    sys.exit(main())
