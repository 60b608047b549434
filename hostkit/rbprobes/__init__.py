"""rbprobes: prove that a moved Python/CUDA environment works on its GPU host.

Shipped to hosts as the package `rbprobes` (stdlib only; torch imported inside the checks that
need it); in the repo it is `hostkit/rbprobes`, installed with the compiler as the package `rbprobes`. Public API:

- run_config(config) -> (report, stopped_early): run a config document's checks (docs/design.md)
- run_check(check, context) -> one report entry
- audit(root, target, paths=None, driver_ptx_max=None, partial_ok=None, strict=False) -> kernel
  audit values (every unit of GPU code judged for the target)
- scan_file(path) -> the fatbin containers and entries of one file
"""

from .checks_static import audit
from .fatbin import scan_file
from .result import Context
from .runner import run_check, run_config

__all__ = ["Context", "audit", "run_check", "run_config", "scan_file"]
