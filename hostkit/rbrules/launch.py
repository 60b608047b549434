"""How the runbook and the kit start a Python on a host (docs/design.md, "Threat model": other
users of the same hosts).

Every start is isolated (`-I`: no PYTHON* variable is read, no user site-packages, and neither the
working directory nor the started file's directory goes on sys.path), writes no bytecode (`-B`),
and names its code by absolute path inside this run's private kit directory: START, which puts
that directory, and nothing else, first on sys.path and runs the module named after it. Never
`-m`, never `-c` or `-` with code that imports from where it was started. The kit's own tools
also skip site (`-S`: the kit is stdlib only); the venv's interpreter keeps it (the checks import
the venv's packages). The runbook's bash gets these words from here (the compiler renders them),
and every start's working directory is private: the run's 0700 directory on the runbook's
machine, the kit's 0700 directory on an ssh host, `/` before either exists.
"""

from __future__ import annotations

import os
from typing import List

FLAGS = ("-I", "-S", "-B")  # the kit's tools: stdlib only
SITE_FLAGS = ("-I", "-B")  # the venv's interpreter: its own site-packages, nothing else
START = "rbrules/start.py"  # relative to the kit directory


def kit_dir() -> str:
    """The directory that holds this kit's packages (rbrules, rbprobes, rbkit)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def argv(python: str, module: str, *, site: bool = False, kit: str = "") -> List[str]:
    """The words that run `module` (as `python -m module` would) with `python`, isolated, from
    the kit at `kit` (default: this one). Start it with cwd set to a private directory."""
    kit = kit or kit_dir()
    return [python, *(SITE_FLAGS if site else FLAGS), os.path.join(kit, START), module]
