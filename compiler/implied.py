"""The checks a runbook runs whatever its spec lists (issue #16), decided once: plan.py puts them in
the probe's config and the source's preflight, steps.py describes them (--dry-run, --plan)."""

from __future__ import annotations

from . import catalog
from .spec import Spec


def audit_arch(spec: Spec) -> str:
    """The arch the source's kernel libraries are audited for before the move ('' for none)."""
    if not (spec.gpu and spec.gpu.kernel_audit):
        return ""
    listed = [c for c in spec.checks if c.kind == "kernel_audit"]
    if listed and listed[0].params.get("arch"):
        return listed[0].params["arch"]
    known = catalog.lookup(spec.gpu.model)
    capability = spec.gpu.capability or (known.capability if known else None)
    return catalog.arch_of(capability) if capability else ""


def audit_args(spec: Spec) -> list[str]:
    """`rbprobes preflight` options from the spec's own kernel_audit check (paths, partial_ok,
    strict): the audit before the move judges as the one after it."""
    words: list[str] = []
    listed = [c for c in spec.checks if c.kind == "kernel_audit"]
    if not listed:
        return words
    params = listed[0].params
    for path in params.get("paths") or []:
        words += ["--path", path]
    if params.get("partial_ok") == []:
        words.append("--no-partial-ok")
    for glob in params.get("partial_ok") or []:
        words += ["--partial-ok", glob]
    if params.get("strict"):
        words.append("--strict")
    return words


def implied_checks(spec: Spec, listed: list[dict]) -> list[dict]:
    """The checks every probe runs whatever the spec lists (issue #16): the relocation proof, and
    with `gpu:` the kernel audit of the whole venv for its arch (unless `gpu.kernel_audit: false`,
    or the spec lists its own). They run first: they read files and need no GPU."""
    kinds = {c["type"] for c in listed}
    out = []
    if "relocation" not in kinds:
        _src_host, src = spec.transfer.source
        params = {"old": src} if src.startswith("/") else {}
        out.append({"id": "relocation", "type": "relocation", "params": params, "allow_skip": False})
    if spec.gpu and spec.gpu.kernel_audit and "kernel_audit" not in kinds:
        out.append({"id": "kernel_audit", "type": "kernel_audit", "params": {}, "allow_skip": False})
    return out
