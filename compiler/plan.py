"""The settings block of a runbook, made from its Plan (resolve.py) alone: the `readonly` values,
arrays and maps in the runbook's order (the one place that names an RB_* value; a mode's own rows,
the fan-out's, come from its strategy), the ShellCheck exclusions, and the lint view.

Templates only paste values; everything conditional was decided by resolve.
"""

from __future__ import annotations

import dataclasses
import json

from . import engineconf
from . import kit as kitfiles
from .view import Array, Decisions, Exclusion, Map, Plan, Setting, StepView

KIT_DIR = ".kit"  # beside the runbook: generated/.kit/<sha256>.tar
# ShellCheck checks a runbook turns off for the whole file, each with its reason (printed above the
# directive): a reviewer's plain `shellcheck generated/*.sh` agrees with compile's lint.
EXCLUSIONS = (
    Exclusion(
        "SC2016",
        ("`sh -c` scripts for a host are single-quoted so that `$1` expands there (rb::shq).",),
    ),
    Exclusion(
        "SC1003",
        ("spec values are single-quoted by the compiler (shlex.quote): a backslash is no escape.",),
    ),
)
# The default form reads its runtime from the pinned kit, so settings only the runtime reads look
# unused here, and the state it sets unset. compile lints the runbook with the runtime in place
# (`lint_view`), where these checks run.
PINNED_EXCLUSIONS = EXCLUSIONS + (
    Exclusion(
        "SC2034", ("settings only the runtime (the pinned kit's runtime.sh) reads look unused;",)
    ),
    Exclusion(
        "SC2154", ("the state it sets looks unset: compile lints with the runtime in place.",)
    ),
)


def lint_view(view: Plan) -> Plan:
    """The runbook as compile lints it: the runtime in place (as --standalone has it), with none
    of the exclusions that only the pinned form needs."""
    return dataclasses.replace(
        view,
        kit=dataclasses.replace(view.kit, runtime_partial=kitfiles.RUNTIME_INLINE),
        exclusions=EXCLUSIONS,
        exclusion_codes=",".join(x.code for x in EXCLUSIONS),
    )


def rows(
    plan: Decisions, steps: tuple[StepView, ...]
) -> tuple[tuple[Setting, ...], tuple[Array, ...], tuple[Map, ...]]:
    """The settings block of the runbook of `plan` and its `steps`: values, arrays, the steps'
    maps."""
    return _settings(plan), _arrays(plan, tuple(s.id for s in steps)), _maps(steps)


def values(plan: Decisions, ids: tuple[str, ...]) -> dict[str, object]:
    """Each `readonly` value and array of the settings block by its name, as the runbook holds it:
    what a step's --dry-run preview names (actions.preview)."""
    held: dict[str, object] = {row.name: row.value for row in _settings(plan)}
    held.update((row.name, row.words) for row in _arrays(plan, ids))
    return held


def _settings(plan: Decisions) -> tuple[Setting, ...]:
    """The runbook's `readonly` values, in its order: the one place that names them."""
    runbook, kit = plan.runbook, plan.kit
    transfer, destination, checks = plan.transfer, plan.destination, plan.checks
    rows = [
        Setting("RB_NAME", runbook.name, "The runbook and its spec."),
        Setting("RB_SPEC", runbook.spec_path),
        Setting("RB_SPEC_SHA256", runbook.spec_sha256),
        Setting("RB_COMPILER_VERSION", runbook.compiler_version),
        Setting(
            "RB_KIT_SHA256",
            kit.sha256,
            "The kit (hostkit/): "
            + (
                "embedded below (compile --standalone)."
                if kit.standalone
                else f"{KIT_DIR}/<sha256>.tar beside this runbook, checked against this hash."
            ),
        ),
        Setting("RB_KIT_FILE", kit.file),
        Setting("RB_SSH_CIPHERS", transfer.ssh_ciphers, "AES-GCM first: the relay is CPU-bound."),
        Setting("RB_SRC_HOST", transfer.src_host, f"transfer ({transfer.where})"),
        Setting("RB_SRC_PATH", transfer.src_path),
        Setting("RB_DST_HOST", transfer.dst_host),
        Setting("RB_DST_PATH", transfer.dst_path),
        *([] if transfer.route is None else [Setting("RB_ROUTE", transfer.route)]),
        Setting("RB_COMPRESSION", transfer.compression),
        Setting("RB_VERIFY", transfer.verify),
        Setting("RB_RERUN", transfer.rerun),
        Setting(
            "RB_SPECIAL_MODES",
            destination.special_modes,
            "the threat model's choices the source's scan reads (docs/design.md): "
            "setuid/setgid/world-write entries, links that leave the tree",
        ),
        Setting("RB_OUTSIDE_LINKS", destination.outside_links),
        Setting(
            "RB_GPU_DECLARED",
            "1" if checks.gpu_declared else "",
            "gpu: declared: the report says whether the checks proved it (a skip is not a pass)",
        ),
        Setting(
            "RB_AUDIT_ARCH",
            checks.audit_arch,
            "the static checks on the source before anything moves: the kernel audit for this "
            "arch (empty: no gpu:, or gpu.kernel_audit: false), and the references that leave "
            "the venv",
        ),
        Setting(
            "RB_INCREMENTAL",
            "1" if transfer.incremental else "0",
            "a re-run that finds changes sends only them (see docs/design.md)",
        ),
        Setting(
            "RB_JOBS",
            transfer.jobs,
            "hashing threads on each host (auto: one per CPU); one stream "
            "per two where the sending end starts the receiving ends (one host, direct)",
        ),
        Setting(
            "RB_ENGINE_CHOICES",
            keyed(engineconf.document(runbook, transfer, destination, checks, plan.fanout)),
            "The install engine's choices, as one JSON document for the engine on the target "
            "(rbkit/choices.py), one key a line.",
        ),
    ]
    rows += plan.install.settings()
    if checks.run:
        rows.append(
            Setting(
                "RB_PROBE_CONFIG",
                keyed(checks.config),
                "The checks, as one JSON document for the probe on the target, one key (and one "
                "check) a line.",
            )
        )
    return tuple(rows)


def keyed(document: str) -> str:
    """A JSON object printed one key a line, and a list of objects one object a line (the checks),
    so that a one-field change of the spec changes one line; each value is compact, keys sorted,
    as `document` has them: json.loads reads the same document (the runbook passes it whole)."""

    def compact(value: object) -> str:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))

    def item(key: str, value: object) -> str:
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            inner = ",\n".join("    " + compact(v) for v in value)
            return f"  {compact(key)}:[\n{inner}\n  ]"
        return f"  {compact(key)}:{compact(value)}"

    data = json.loads(document)
    if not isinstance(data, dict) or not data:
        return document
    return "{\n" + ",\n".join(item(key, data[key]) for key in sorted(data)) + "\n}"


def _arrays(plan: Decisions, ids: tuple[str, ...]) -> tuple[Array, ...]:
    """The runbook's `readonly -a` arrays, in its order."""
    runbook, transfer, checks = plan.runbook, plan.transfer, plan.checks
    rows = [
        Array(
            "RB_AUDIT_ARGS",
            checks.audit_args,
            "the kernel audit's options from the spec's kernel_audit check",
        ),
        Array(
            "RB_SPEC_FILES",
            tuple(word for file in runbook.spec_files for word in file),
            "Each file of the spec, three words each: its name, its path from this runbook's "
            "folder, its sha256: a run refuses to start when one changed.",
        ),
        Array("RB_HOSTS", tuple(h.id for h in plan.hosts), "Hosts this runbook touches."),
        Array("RB_STEPS", ids),
        Array("RB_EXCLUDE_ARGS", transfer.exclude_args, "transfer.exclude"),
        Array(
            "RB_LIBRARY_DIRS",
            plan.destination.library_path_first,
            "cuda.library_path_first: the exports step puts these dirs of site-packages "
            "first; preflight and --plan check that the source has them",
        ),
        Array(
            "RB_AUTO_COMPRESSION",
            transfer.auto_compression,
            "compression auto: the first of these every end of the stream has, else none",
        ),
    ]
    rows += plan.install.arrays()
    if transfer.direct_ssh is not None:
        rows.append(
            Array(
                "RB_DIRECT_SSH",
                transfer.direct_ssh,
                "route direct/auto: ssh arguments the source uses to reach the destination",
            )
        )
    return tuple(rows)


def _maps(steps: tuple[StepView, ...]) -> tuple[Map, ...]:
    """Each step's summary, --dry-run text and host, by its id (`--list`, `--dry-run`, the log)."""
    return (
        Map("RB_STEP_DOC", tuple((s.id, s.doc) for s in steps)),
        Map("RB_STEP_PREVIEW", tuple((s.id, s.preview) for s in steps)),
        Map("RB_STEP_HOST", tuple((s.id, s.host) for s in steps)),
    )
