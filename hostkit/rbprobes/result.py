"""The small types every check shares: its context, its outcome, and a missing precondition."""

from __future__ import annotations

import sys
from typing import Any, Dict, List, NamedTuple, Optional

PASS = "pass"
FAIL = "fail"
SKIP = "skip"


class Context(NamedTuple):
    """What the config document says about the host (all optional for standalone runs)."""

    host: Optional[str] = None
    venv: Optional[str] = None
    gpu: Optional[Dict[str, Any]] = None  # {"model", "count", "capability", "arch", "names"}
    cuda: Optional[Dict[str, Any]] = None  # {"version", "home", "library_dirs",
    #                                          "library_path_first"}

    def gpu_value(self, key: str) -> Any:
        return (self.gpu or {}).get(key)

    def cuda_value(self, key: str) -> Any:
        return (self.cuda or {}).get(key)

    def venv_or_prefix(self) -> str:
        """The venv the check is about: the config's, else the running interpreter's (the
        runbook runs the probe with the moved venv's python and may leave venv null)."""
        return self.venv or sys.prefix


class Outcome(NamedTuple):
    status: str  # PASS or FAIL (SKIP only comes from Unavailable + allow_skip)
    reason: str
    values: Dict[str, Any]
    level: Optional[str] = None  # overrides the check type's level (libraries: L0 or L1)


def passed(reason: str, values: Optional[Dict[str, Any]] = None, level: Optional[str] = None):
    return Outcome(PASS, reason, values or {}, level)


def failed(reason: str, values: Optional[Dict[str, Any]] = None, level: Optional[str] = None):
    return Outcome(FAIL, reason, values or {}, level)


class Unavailable(Exception):
    """A precondition is missing (no CUDA device, torch not installed): the check fails with
    this reason, or is skipped when its config says allow_skip."""

    def __init__(self, reason: str, values: Optional[Dict[str, Any]] = None):
        super().__init__(reason)
        self.reason = reason
        self.values = values or {}


class ParamError(ValueError):
    """A check's params do not fit the check (unknown key, wrong type)."""


# Param types: "str", "int", "bool", "strs" (list of strings).
def check_params(check_type: str, params: Any, allowed: Dict[str, str]) -> Dict[str, Any]:
    """Validate `params` against `allowed` ({name: type}); raises ParamError naming the key."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ParamError(
            "params of a %s check must be a mapping, got %s" % (check_type, type(params).__name__)
        )
    for key, value in params.items():
        kind = allowed.get(key)
        if kind is None:
            known = ", ".join(sorted(allowed)) or "none"
            raise ParamError(
                "unknown parameter %r for a %s check (known: %s)" % (key, check_type, known)
            )
        if value is None:
            continue
        ok = {
            "str": isinstance(value, str),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "strs": isinstance(value, list) and all(isinstance(v, str) for v in value),
        }[kind]
        if not ok:
            want = {
                "str": "a string",
                "int": "an integer",
                "bool": "true or false",
                "strs": "a list of strings",
            }[kind]
            raise ParamError(
                "parameter %r of a %s check must be %s, got %r" % (key, check_type, want, value)
            )
    return {k: v for k, v in params.items() if v is not None}


def short_list(items: List[str], limit: int = 5) -> str:
    """'a, b, c' or 'a, b, c, d, e and 7 more'."""
    if len(items) <= limit:
        return ", ".join(items)
    return "%s and %d more" % (", ".join(items[:limit]), len(items) - limit)
