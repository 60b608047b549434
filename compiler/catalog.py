"""GPU models the compiler knows: model name -> compute capability and what that needs.

A first, small catalog; see the templating issue for the full one (family, minimum CUDA, count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GpuModel:
    name: str
    capability: str  # "10.3"
    arch_name: str  # "Blackwell Ultra"
    min_cuda: str  # first CUDA release that can target it

    @property
    def arch(self) -> str:
        major, minor = self.capability.split(".")
        return f"sm_{major}{minor}"


GPUS = {
    g.name.lower(): g
    for g in (
        GpuModel("A100", "8.0", "Ampere", "11.0"),
        GpuModel("H100", "9.0", "Hopper", "11.8"),
        GpuModel("H200", "9.0", "Hopper", "11.8"),
        GpuModel("GH200", "9.0", "Hopper", "12.0"),
        GpuModel("B200", "10.0", "Blackwell", "12.8"),
        GpuModel("GB200", "10.0", "Blackwell", "12.8"),
        GpuModel("B300", "10.3", "Blackwell Ultra", "12.9"),
        GpuModel("GB300", "10.3", "Blackwell Ultra", "12.9"),
        GpuModel("RTX-PRO-6000", "12.0", "Blackwell (workstation)", "12.8"),
    )
}


def lookup(model: str) -> Optional[GpuModel]:
    return GPUS.get(model.lower())


def arch_of(capability: str) -> str:
    major, minor = capability.split(".")
    return f"sm_{major}{minor}"


def version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)
