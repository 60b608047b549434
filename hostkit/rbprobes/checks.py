"""The check types: function, level, accepted params, default deadline and lane of each.

The params are those of compiler/spec.py's check models (the config's `params`), plus a few
optional ones only the probes read (marked "probes-only" in docs/probes.md).

Lanes (runner.run_config): SERIAL checks use torch and CUDA in the probe's own process (torch is
imported once, by the first of them); they run there one after another, in the config's order,
because they share that process's state (what it has loaded, TF32 switches, the CUDA context).
PARALLEL checks touch nothing of the process that another check reads: they read files or run
their own child processes, and they start at once and overlap the serial ones.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, NamedTuple, Union

SERIAL = "serial"
PARALLEL = "parallel"


class CheckType(NamedTuple):
    run: Union[str, Callable[..., Any]]  # "module.function" in this package, imported when the
    #     check runs (a process that runs one check imports its module only: the source's
    #     `outside` does), or the function itself
    level: str
    params: Dict[str, str]  # name -> "str" | "int" | "bool" | "strs"
    deadline_s: int  # the runner stops waiting after this (params.timeout_s extends it)
    lane: str = PARALLEL  # SERIAL: uses torch/CUDA in the probe's process; see above

    def function(self) -> Callable[..., Any]:
        if callable(self.run):
            return self.run
        module, _, name = self.run.rpartition(".")
        return getattr(importlib.import_module("." + module, __package__), name)


CHECKS: Dict[str, CheckType] = {
    "kernel_audit": CheckType(
        "checks_static.kernel_audit",
        "L0",
        {
            "arch": "str",
            "paths": "strs",
            "driver_ptx_max": "str",
            "strict": "bool",
            "partial_ok": "strs",
        },
        1800,
    ),
    "relocation": CheckType(
        "checks_venv.relocation_check", "L0", {"old": "str", "timeout_s": "int"}, 300
    ),
    "outside": CheckType("checks_venv.outside_check", "L0", {}, 600),
    "libraries": CheckType(
        "checks_runtime.libraries_check",
        "L1",
        {"expect_dirs": "strs", "modules": "strs", "runtime": "bool"},
        600,
        SERIAL,
    ),
    "torch": CheckType(
        "checks_runtime.torch_check", "L1", {"version": "str", "cuda": "str"}, 300, SERIAL
    ),
    "devices": CheckType(
        "checks_runtime.devices_check",
        "L1",
        {"count": "int", "capability": "str", "names": "strs"},
        300,
        SERIAL,
    ),
    "imports": CheckType("checks_runtime.imports_check", "L1", {"modules": "strs"}, 600, SERIAL),
    "matmul": CheckType(
        "checks_numeric.matmul_check",
        "L2",
        {"dtype": "str", "size": "int", "every_device": "bool"},
        900,
        SERIAL,
    ),
    "nccl": CheckType(
        "checks_numeric.nccl_check", "L2", {"timeout_s": "int", "elements": "int"}, 240
    ),
    "python": CheckType(
        "checks_hatch.python_check", "L1", {"code": "str", "name": "str", "timeout_s": "int"}, 300
    ),
    "command": CheckType(
        "checks_hatch.command_check",
        "L1",
        {"run": "str", "name": "str", "expect_exit": "int", "timeout_s": "int"},
        300,
    ),
}


def deadline_for(check_type: str, params: Dict[str, Any]) -> float:
    """How long the runner waits for a check: its default, or params.timeout_s plus a margin."""
    spec = CHECKS[check_type]
    own = params.get("timeout_s")
    if isinstance(own, int) and not isinstance(own, bool):
        return max(spec.deadline_s, own + 90)
    return spec.deadline_s


def lane_for(check_type: str, params: Any) -> str:
    """SERIAL or PARALLEL (see above). A `libraries` check with runtime: false only reads files;
    an unknown type fails at once and runs nothing."""
    spec = CHECKS.get(check_type) if isinstance(check_type, str) else None
    if spec is None:
        return PARALLEL
    if check_type == "libraries" and isinstance(params, dict) and params.get("runtime") is False:
        return PARALLEL
    return spec.lane
