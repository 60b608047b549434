"""The engine's choices for a run: one JSON document, read once.

The compiler writes the spec's choices for the install engine as one JSON document (the runbook's
RB_ENGINE_CHOICES setting: compiler/engineconf.py makes it through
`Choices.from_dict(...).to_json()`, so the schema below is the only one), the way it writes the
checks' document (RB_PROBE_CONFIG, read by rbprobes); a runbook passes it whole, as one argument
(`--choices`), to `rbkit engine serve|run|receive` and to `rbkit.fanout node`, beside the facts of
the run itself (the destination and source paths as resolved on the hosts, the manifest's path
there, the compression this run measured). `Choices.from_json` reads it into a frozen Choices,
refusing a document that is not one (an unknown key, a value that is not one of a choice's words,
another schema), so a mistake is named before anything is done:

    {"schema": 1, "on_existing": "backup", "rerun": "quick", "verify": "sha256",
     "special_modes": "refuse", "keep_backups": 2, "swap_atomic": "allow",
     "shared_parent": "refuse", "on_failed_checks": "rollback", "jobs": "auto",
     "cuda_home": "/usr/local/cuda", "env_file": "", "library_path_first": ["nvidia/cu13/lib"],
     "env": {"NCCL_DEBUG": "WARN"}, "origin": "runbook b300 (specs/b300.yaml)", "timeout": null}

A key left out takes its default below (the safe word of each choice).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, Optional, Tuple, Union

# the words of the spec's fields that the engine takes (transfer.*, and the manifest's digest):
# compiler/spec.py types its fields with them
SPECIAL_MODES = ("refuse", "strip", "keep")  # transfer.special_modes
OUTSIDE_LINKS = ("refuse", "keep")  # transfer.outside_links
ON_EXISTING = ("refuse", "backup", "replace")  # transfer.on_existing
SHARED_PARENT = ("refuse", "allow")  # transfer.shared_parent
SWAP_ATOMIC = ("require", "allow")  # transfer.swap_atomic
RERUN = ("quick", "digest")  # transfer.rerun
ALGOS = ("sha256", "blake2b", "none")  # transfer.verify
ON_FAILED_CHECKS = ("rollback", "keep")  # on_failed_checks

SCHEMA = 1


class ChoicesError(ValueError):
    """The document is not the engine's choices: the message names the key and what it holds."""


@dataclass(frozen=True)
class Choices:
    """What the spec chose for the install engine (none of it depends on the run)."""

    on_existing: str = "refuse"  # what is at the destination: refused, backed up, replaced
    rerun: str = "quick"  # how a re-run decides the destination holds the tree
    verify: str = "sha256"  # the digest receive takes of each file (verify's)
    special_modes: str = "refuse"  # setuid/setgid/sticky/world-write entries
    keep_backups: Optional[int] = None  # backups kept whose checks passed (None: all)
    swap_atomic: str = "allow"  # a swap that cannot be one rename: refused, or two
    shared_parent: str = "refuse"  # a destination's parent other users can write
    on_failed_checks: str = "keep"  # after the swap: failed checks roll back, or stay
    jobs: Union[str, int] = "auto"  # hashing threads on each host (auto: one per CPU)
    cuda_home: str = ""  # the env file's CUDA_HOME ("" without cuda:)
    env_file: str = ""  # cuda.env_file ("": DEST.env.sh)
    library_path_first: Tuple[str, ...] = ()  # LD_LIBRARY_PATH's first dirs, in site-packages
    env: Tuple[Tuple[str, str], ...] = field(default=())  # the spec's env:, sorted by name
    origin: str = "a runbook"  # who installs: written in the install's record
    timeout: Optional[float] = None  # seconds for each child (a fan-out node's fanout.timeout_s)

    @classmethod
    def from_json(cls, text: str) -> "Choices":
        """The document `text` as Choices; ChoicesError naming what is wrong."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ChoicesError("the engine's choices are not JSON: %s" % exc) from None
        if not isinstance(doc, dict):
            raise ChoicesError("the engine's choices are not a JSON object")
        return cls.from_dict(doc)

    @classmethod
    def from_dict(cls, doc: Dict[str, Any]) -> "Choices":
        doc = dict(doc)
        schema = doc.pop("schema", SCHEMA)
        if schema != SCHEMA:
            raise ChoicesError(
                "the engine's choices are of schema %r; this kit reads schema %d" % (schema, SCHEMA)
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise ChoicesError(
                "the engine's choices hold keys this kit does not know: %s" % ", ".join(unknown)
            )
        for key, words in _WORDS.items():
            if key in doc and doc[key] not in words:
                raise ChoicesError(
                    "the engine's choice %s is %r, not one of %s"
                    % (key, doc[key], ", ".join(words))
                )
        for key in ("cuda_home", "env_file", "origin"):
            if key in doc and not isinstance(doc[key], str):
                raise ChoicesError("the engine's choice %s is %r, not a string" % (key, doc[key]))
        if "keep_backups" in doc:
            doc["keep_backups"] = _whole(doc, "keep_backups", allow_none=True)
        if "jobs" in doc and doc["jobs"] != "auto":
            doc["jobs"] = _whole(doc, "jobs")
        if doc.get("timeout") is not None:
            value = doc["timeout"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ChoicesError(
                    "the engine's choice timeout is %r, not a number of seconds" % (value,)
                )
        if "library_path_first" in doc:
            first = doc["library_path_first"]
            if not isinstance(first, list) or not all(isinstance(x, str) for x in first):
                raise ChoicesError(
                    "the engine's choice library_path_first is %r, not a list of strings" % (first,)
                )
            doc["library_path_first"] = tuple(first)
        if "env" in doc:
            env = doc["env"]
            if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise ChoicesError(
                    "the engine's choice env is %r, not an object of strings" % (env,)
                )
            doc["env"] = tuple(sorted(env.items()))
        return cls(**doc)

    def to_json(self) -> str:
        """The document (as the compiler writes it: keys sorted, no spaces)."""
        doc = asdict(self)
        doc["library_path_first"] = list(self.library_path_first)
        doc["env"] = dict(self.env)
        doc["schema"] = SCHEMA
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


_WORDS = {
    "on_existing": ON_EXISTING,
    "rerun": RERUN,
    "verify": ALGOS,
    "special_modes": SPECIAL_MODES,
    "swap_atomic": SWAP_ATOMIC,
    "shared_parent": SHARED_PARENT,
    "on_failed_checks": ON_FAILED_CHECKS,
}


def _whole(doc: Dict[str, Any], key: str, allow_none: bool = False) -> Optional[int]:
    value = doc[key]
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ChoicesError(
            "the engine's choice %s is %r, not a whole number above 0" % (key, value)
        )
    return value
