"""What the GPU catalog says about a spec: impossible combinations (errors) and doubtful ones
(warnings). Called by validate.py; reads the raw data defensively, like the rest of its second
pass."""

from __future__ import annotations

from typing import Any

from . import catalog
from .errors import Problem
from .loader import Source
from .spec import Spec


def problems(source: Source, data: dict[str, Any]) -> list[Problem]:
    """Errors: an unknown model, a capability that contradicts the model, a CUDA that cannot target
    the GPU."""
    gpu = data.get("gpu")
    if not isinstance(gpu, dict) or not isinstance(gpu.get("model"), str):
        return []
    capability = gpu.get("capability") if isinstance(gpu.get("capability"), str) else None
    known = catalog.lookup(gpu["model"])
    out = []
    if known is None and not gpu.get("capability"):
        near = catalog.closest(gpu["model"])
        either = " or ".join([", ".join(near[:-1]), near[-1]] if len(near) > 1 else near)
        hint = (
            f"; did you mean {either}?"
            if near
            else f" (known: {', '.join(g.name for g in catalog.models())})."
        )
        out.append(
            source.problem(
                ("gpu", "model"),
                f"unknown GPU model {gpu['model']!r}{hint} Or give `capability:` yourself.",
            )
        )
    if known is not None and capability and capability != known.capability:
        out.append(
            source.problem(
                ("gpu", "capability"),
                f"{known.name} has compute capability {known.capability}, not {capability}",
            )
        )
    target = known or catalog.resolve(gpu["model"], capability)
    cuda = data.get("cuda")
    if target is not None and isinstance(cuda, dict) and isinstance(cuda.get("version"), str):
        why = catalog.cuda_problem(cuda["version"], target)
        if why:
            out.append(source.problem(("cuda", "version"), why))
    return out


def warnings(source: Source, spec: Spec) -> list[Problem]:
    """Warnings: a torch check that expects a torch built for a CUDA which cannot serve the GPU."""
    if spec.gpu is None:
        return []
    target = catalog.resolve(spec.gpu.model, spec.gpu.capability)
    if target is None:
        return []
    where = "every node" if spec.fanout is not None else spec.transfer.target[0]
    out = []
    for index, check in enumerate(spec.checks):
        if check.kind != "torch" or not check.torch or not check.torch.cuda:
            continue
        gap = catalog.cuda_gap(check.torch.cuda, target)
        if gap:
            out.append(
                source.problem(
                    ("checks", index, "torch", "cuda"),
                    f"a torch built for CUDA {check.torch.cuda} has no code for {target.arch} "
                    f"({target.name}): {gap}; expect the checks to fail on {where}",
                )
            )
    return out
