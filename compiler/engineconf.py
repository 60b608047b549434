"""The install engine's choices for a runbook, as one JSON document (RB_ENGINE_CHOICES).

The plan writes the spec's choices for the engine once, as it writes the checks' document
(RB_PROBE_CONFIG): keys sorted, no spaces, one setting. The runbook passes it whole as
`--choices` to `rbkit engine serve` and `engine receive` on the destination and to
`rbkit.fanout node` on each node, where `rbrules.choices.Choices.from_json` reads it (and refuses
a key or a word it does not know). The document is made through that same Choices (`from_dict`,
then `to_json`): its schema, keys and words are written once, in rbrules/choices.py. What the run
itself finds out (the paths as resolved on the hosts, the compression it measured) stays in the
engine's other arguments.
"""

from __future__ import annotations

from typing import Any, Optional

from rbrules.choices import Choices

from .view import Checks, Destination, Fanout, Identity, Transfer


def choices(
    runbook: Identity,
    transfer: Transfer,
    destination: Destination,
    checks: Checks,
    fan: Optional[Fanout],
) -> dict[str, Any]:
    """The plan's groups as the document's keys (Choices' fields)."""
    return {
        "on_existing": destination.on_existing,
        "rerun": transfer.rerun,
        "verify": transfer.verify,
        "special_modes": destination.special_modes,
        "keep_backups": destination.keep_backups,
        "swap_atomic": destination.swap_atomic,
        "shared_parent": destination.shared_parent,
        # without checks nothing fails after the swap: the engine's default
        "on_failed_checks": checks.on_failed_checks if checks.run else "keep",
        "jobs": int(transfer.jobs) if transfer.jobs.isdigit() else "auto",
        "cuda_home": destination.cuda_home,
        "env_file": destination.env_file,
        "library_path_first": list(destination.library_path_first),
        "env": dict(item.split("=", 1) for item in destination.env),
        "origin": f"runbook {runbook.name} ({runbook.spec_path})",
        # a fan-out node's children (the stream, the checks) each get fanout.timeout_s
        "timeout": fan.timeout_s if fan is not None else None,
    }


def document(
    runbook: Identity,
    transfer: Transfer,
    destination: Destination,
    checks: Checks,
    fan: Optional[Fanout],
) -> str:
    """The document as the runbook holds it (RB_ENGINE_CHOICES): read through Choices (a key or a
    word it does not know is a compiler bug, refused here) and written by it."""
    return Choices.from_dict(choices(runbook, transfer, destination, checks, fan)).to_json()
