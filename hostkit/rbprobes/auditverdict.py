"""The kernel audit judged (checks_static.kernel_audit's verdict): what the audit of the venv's GPU
code found, against the spec's rules (partial_ok, the PTX limit), as the check's pass or fail with
the units that have no path to the target device named.
"""

from __future__ import annotations

import os
from typing import Any, Dict

from .result import failed, passed, short_list


def _describe_missing(item: Dict[str, Any]) -> str:
    kernels = item.get("kernels")
    if kernels:
        text = "kernels %s" % short_list(kernels, 3)
    else:
        text = "kernels not read: %s" % item.get("kernels_note", "?")
    return "%s: %s; %s" % (item["unit"], item["why"], text)


def judge_audit(values: Dict[str, Any]):
    """The kernel_audit outcome (pass/fail and its one-line reason) for audit() values."""
    name = values["target"]
    problems = []
    if values["missing_paths"]:
        problems.append("missing paths: %s" % short_list(values["missing_paths"]))
    failing = [f for f in values["files"] if f["fails"]]
    if failing:
        described = []
        for record in failing:
            text = record["path"]
            if record.get("package"):
                text += " [%s]" % record["package"]
            detail = "; ".join(record["problems"])
            if record.get("missing"):
                detail += "; " + _describe_missing(record["missing"][0])
                if record["units_without_path"] > 1:
                    detail += " (+%d more units)" % (record["units_without_path"] - 1)
            described.append("%s (%s)" % (text, detail))
        problems.append(
            "%d of %d files with GPU code fail for %s: %s"
            % (len(failing), values["gpu_files"], name, short_list(described, 3))
        )
    if problems:
        return failed("; ".join(problems), values)
    notes = []
    drv = values.get("driver") or {}
    if values["ptx_only"]:
        jit = sorted(
            {v for f in values["files"] for v in f.get("jit_ptx_versions", [])},
            key=lambda v: tuple(int(x) for x in v.split(".")),
        )
        if values.get("driver_ptx_max"):
            notes.append(
                "%d only through PTX JIT (slow first launch; ISA %s <= %s)"
                % (len(values["ptx_only"]), "/".join(jit or ["?"]), values["driver_ptx_max"])
            )
        else:
            notes.append(
                "%d only through PTX JIT (slow first launch; PTX ISA %s not checked: "
                "%s)"
                % (
                    len(values["ptx_only"]),
                    "/".join(jit or ["?"]),
                    drv.get("source", "no driver limit"),
                )
            )
    if values["partial_waived"]:
        waived = [f for f in values["files"] if f.get("waived_by")]
        notes.append(
            "%d with units lacking %s code, allowed by partial_ok (vendor dispatch): "
            "%s"
            % (
                len(waived),
                name,
                short_list(
                    [
                        "%s (%d of %d units)"
                        % (os.path.basename(f["path"]), f["units_without_path"], f["units"])
                        for f in waived
                    ],
                    3,
                ),
            )
        )
    if values.get("arch_specific"):
        spec = [f for f in values["files"] if f.get("units_arch_specific")]
        notes.append(
            "%d with arch-specific units for other archs, called only there: %s"
            % (
                len(spec),
                short_list(
                    [
                        "%s (%d units: %s)"
                        % (
                            os.path.basename(f["path"]),
                            f["units_arch_specific"],
                            "+".join(f["arch_specific_archs"][:4]),
                        )
                        for f in spec
                    ],
                    3,
                ),
            )
        )
    if values["kernel_free"]:
        notes.append("%d without any kernel" % len(values["kernel_free"]))
    if values["skipped_not_regular"]:
        notes.append("%d not regular files, skipped" % len(values["skipped_not_regular"]))
    if values["gpu_files"]:
        summary = "%d files with GPU code (of %d scanned) all have a path to %s" % (
            values["gpu_files"],
            values["files_scanned"],
            name,
        )
    else:
        summary = "no file with GPU code (%d shared objects scanned)" % values["files_scanned"]
    return passed(summary + ("; " + "; ".join(notes) if notes else ""), values)
