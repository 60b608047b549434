"""rbprobes: prove that a moved Python/CUDA environment works on its GPU host.

Shipped to hosts as the package `rbprobes` (stdlib only; torch imported inside the checks that
need it); in the repo it is `hostkit/rbprobes`, installed with the compiler as the package
`rbprobes`. Public API:

- run_config(config) -> (report, stopped_early): run a config document's checks (docs/design.md)
- run_check(check, context) -> one report entry
- audit(root, target, paths=None, driver_ptx_max=None, partial_ok=None, strict=False) -> kernel
  audit values (every unit of GPU code judged for the target)
- scan_file(path) -> the fatbin containers and entries of one file
"""

import importlib

__all__ = ["Context", "audit", "run_check", "run_config", "scan_file"]

# imported when first asked for: `python -m rbprobes outside` needs none of the GPU code's modules
_WHERE = {
    "Context": "result",
    "audit": "checks_static",
    "run_check": "runner",
    "run_config": "runner",
    "scan_file": "fatbin",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    value = getattr(importlib.import_module("." + _WHERE[name], __name__), name)
    globals()[name] = value
    return value
