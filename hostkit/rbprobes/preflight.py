"""Preflight on the SOURCE host, before anything is sent: will this venv's GPU code run on the
destination's arch (kernel_audit), and does the venv reach outside itself (outside)? With
`old`, also the relocation proof of a tree (run it on a moved copy).

    python -m rbprobes preflight --venv V --arch sm_103 [--old OLD] [--driver-cuda 12.8]

One JSON document on stdout (schema 1, kind "preflight"; docs/probes.md), exit 0 when nothing
failed, 1 otherwise (the problems name the files and packages), 2 on usage errors. The local
driver is never read: it is not the destination's. Give the destination's driver CUDA version
(or PTX ISA limit) to hold PTX-only code against it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

from . import arch, auditverdict, checks_static, checks_venv, driver, report
from .checks import CHECKS
from .result import FAIL, PASS, Outcome

SCHEMA = 1


def _entry(check_type: str, outcome: Outcome, started: float) -> Dict[str, Any]:
    return report.result(
        check_type,
        check_type,
        CHECKS[check_type].level,
        outcome.status,
        outcome.reason,
        outcome.values,
        time.monotonic() - started,
    )


def _audit_problems(values: Dict[str, Any]) -> List[Dict[str, Any]]:
    out = []
    for path in values.get("missing_paths", []):
        out.append(
            {
                "check": "kernel_audit",
                "file": path,
                "package": None,
                "what": "path to audit does not exist",
                "fix": "fix the spec's paths",
            }
        )
    for record in values["files"]:
        if not record.get("fails"):
            continue
        what = "; ".join(record.get("problems", []))
        missing = record.get("missing") or []
        kernels = sorted({k for m in missing for k in (m.get("kernels") or [])})
        num = values["target"].split("_", 1)[1]
        fix = (
            "rebuild it with code for %s (-gencode arch=compute_%s,code=sm_%s, or PTX "
            "the destination's driver can JIT), or install a build of the package that "
            "has it" % (values["target"], num, num)
        )
        if record.get("verdict") == "unreadable" or record.get("unreadable"):
            fix = "reinstall the package (the file is damaged or truncated)"
        item = {
            "check": "kernel_audit",
            "file": record["path"],
            "package": record.get("package"),
            "what": what,
            "fix": fix,
        }
        if missing:
            item["units"] = [
                {
                    "unit": m["unit"],
                    "archs": m["archs"],
                    "why": m["why"],
                    "kernels": m.get("kernels"),
                }
                for m in missing
            ]
        if kernels:
            item["kernels"] = kernels[:50]
        out.append(item)
    return out


def run(
    venv: str,
    target: str,
    old: Optional[str] = None,
    driver_ptx_max: Optional[str] = None,
    driver_cuda: Optional[str] = None,
    partial_ok: Optional[List[str]] = None,
    strict: bool = False,
    paths: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """The preflight document for `venv` and a destination arch (raises ValueError for a bad
    arch or version)."""
    venv = os.path.abspath(venv)
    cap = arch.parse_target(target)
    limit = None
    drv: Dict[str, Any] = {
        "source": "not checked: the destination's driver is unknown here "
        "(give --driver-cuda or --driver-ptx-max)"
    }
    if driver_ptx_max:
        limit = arch.parse_version(driver_ptx_max)
        drv = {"ptx_max": driver_ptx_max, "source": "--driver-ptx-max"}
    elif driver_cuda:
        limit = driver.ptx_max_for_cuda(driver_cuda)
        drv = {
            "cuda": driver_cuda,
            "ptx_max": "%d.%d" % limit if limit else None,
            "source": "--driver-cuda %s" % driver_cuda,
        }
    checks: List[Dict[str, Any]] = []
    problems: List[Dict[str, Any]] = []

    started = time.monotonic()
    values = checks_static.audit(venv, cap, paths, limit, partial_ok, strict)
    values["driver"] = drv
    values["driver_ptx_max"] = drv.get("ptx_max")
    checks.append(_entry("kernel_audit", auditverdict.judge_audit(values), started))
    problems.extend(_audit_problems(values))

    started = time.monotonic()
    outcome = (
        checks_venv.outside_check({}, _ctx(venv))
        if os.path.isdir(venv)
        else Outcome(FAIL, "venv %s does not exist" % venv, {})
    )
    checks.append(_entry("outside", outcome, started))
    for ref in outcome.values.get("refs", []):
        problems.append(
            {
                "check": "outside",
                "file": ref["file"],
                "package": ref.get("package"),
                "what": "%s -> %s" % (ref["kind"], ref["target"]),
                "fix": ref["fix"],
            }
        )
    if not os.path.isdir(venv):
        problems.append(
            {
                "check": "outside",
                "file": venv,
                "package": None,
                "what": "venv does not exist",
                "fix": "check --venv",
            }
        )

    if old:
        started = time.monotonic()
        outcome = checks_venv.relocation_check({"old": old}, _ctx(venv))
        checks.append(_entry("relocation", outcome, started))
        for problem in outcome.values.get("problems", []):
            problems.append(
                {
                    "check": "relocation",
                    "file": problem["file"],
                    "package": None,
                    "what": problem["what"],
                    "fix": "python -m rbkit relocate %s --old %s --new %s" % (venv, old, venv),
                }
            )
    summary = {"pass": 0, "fail": 0, "skip": 0}
    for check in checks:
        summary[check["status"]] += 1
    return {
        "schema": SCHEMA,
        "kind": "preflight",
        "venv": venv,
        "arch": arch.capability_to_arch(cap),
        "old": old,
        "ok": all(c["status"] == PASS for c in checks),
        "problems": problems,
        "files": sorted({p["file"] for p in problems}),
        "packages": sorted({p["package"] for p in problems if p.get("package")}),
        "checks": checks,
        "summary": summary,
    }


def _ctx(venv: str):
    from .result import Context

    return Context(venv=venv)
