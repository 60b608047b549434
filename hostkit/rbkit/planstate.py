"""The live plan's two records (liveplan.py): the destination's state, read there without writing
anything (`dest_state`: a JSON line of facts, then the stat line of every entry, digested; with
`against_install`, what differs from the install's manifest), and the rows of both sides' stat
lines (`read_scan`, the source's scan record; `read_state`, the destination's).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Dict, List, Optional, Tuple

from rbrules import paths, proven

from . import safefs


def _row(entry: dict) -> list:
    return [
        entry["p"],
        entry.get("t"),
        entry.get("m"),
        entry.get("s"),
        entry.get("l"),
        entry.get("mt"),
    ]


def _header(data: bytes) -> Optional[dict]:
    """The header of a manifest's bytes (its first line), None when it is not one of this tool."""
    end = data.find(b"\n")
    try:
        head = json.loads(data[:end] if end >= 0 else data)
    except ValueError:
        return None
    return head if isinstance(head, dict) and head.get("kind") == "rb-manifest" else None


def _entries(data: bytes) -> List[dict]:
    rows = [ln for ln in data.split(b"\n") if ln.strip()]
    docs = json.loads(b"[" + b",".join(rows) + b"]") if rows else []
    return [d for d in docs[1:] if isinstance(d, dict) and "p" in d]


class Against:
    """The destination's entries compared with its install's manifest as the walk yields them
    (`see`, one entry's stat values), the manifest's rows never built for an entry that matches:
    `result` is what the plan needs of it. `moved`: each path whose entry differs from the
    manifest's or is not in it (-> the manifest's row, or None); `source_entries`: the source's
    own rows of what relocation rewrote (manifest.source_of). The manifest itself stays there:
    an unchanged destination sends back nothing of it."""

    def __init__(self, head: dict, entries: List[dict]) -> None:
        self._head = head
        self._want = {e["p"]: e for e in entries}
        self._moved: Dict[str, Optional[list]] = {}

    def see(self, seen: tuple) -> None:
        wanted = self._want.pop(seen[0], None)
        if wanted is None:
            if seen[0] != paths.INSTALLED_MANIFEST:
                self._moved[seen[0]] = None
        elif seen[1:] != (
            wanted.get("t"),
            wanted.get("m"),
            wanted.get("s"),
            wanted.get("l"),
            wanted.get("mt"),
        ):
            self._moved[seen[0]] = _row(wanted)

    def result(self) -> dict:
        moved = dict(self._moved)
        moved.update((p, _row(e)) for p, e in self._want.items())  # not at the destination
        return {
            "moved": moved,
            "source_entries": [_row(e) for e in self._head.get("source_entries") or ()],
        }


def against_install(head: dict, entries: List[dict], now: Dict[str, list]) -> dict:
    """Against's answer for the destination's entries `now` (path -> stat row) at once."""
    got = Against(head, entries)
    for row in now.values():
        got.see(tuple(row))
    return got.result()


def dest_state(
    dest: str, policy: str, keep_backups: int, against: bool = False
) -> Tuple[dict, List[bytes]]:
    """(facts, stat lines) of the destination; nothing is written, no lock is taken. With
    `against`, facts["install"] holds against_install's answer (an install of this tool only)."""
    # the destination's modules, loaded where the destination is read (compose needs none)
    from . import hostfs, installs, manifest, privacy, statwalk, swapfs

    dest = os.path.abspath(dest)
    parent = os.path.dirname(dest)
    staging = paths.staging(dest)
    facts: dict = {
        "dest": dest,
        "exists": os.path.lexists(dest),
        "is_dir": os.path.isdir(dest),
        "installed": os.path.isfile(os.path.join(dest, paths.INSTALLED_MANIFEST)),
        "staging_left": os.path.lexists(staging),
    }
    if facts["installed"]:
        # an install another user owns or can change is not this tool's (preflight's rule)
        why = installs.why_not_ours_install(dest)
        if why:
            facts.update(installed=False, not_ours=why)
    found = privacy.check_parent(dest, os.geteuid())
    if found is not None:
        # preflight refuses it unless transfer.shared_parent: allow (preflight.check_parent)
        facts["shared_parent"] = privacy.refusal(dest, found[0], found[1], os.geteuid())
    free = hostfs.free_bytes(staging)
    facts.update(free_bytes=free["free_bytes"], measured_at=free["measured_at"])
    if os.path.isdir(staging) and not os.path.islink(staging):
        facts["staged"] = staged_here(dest, staging)
    lines: List[bytes] = []
    size = 0
    head: Optional[dict] = None
    data = b""
    if facts["installed"] and not os.path.islink(dest):
        try:
            got = safefs.read_in(dest, paths.INSTALLED_MANIFEST)
            if got is not None:
                data = got[0]
                facts["installed_record"] = [got[1].st_size, got[1].st_mtime_ns]
                head = _header(data)
            if head is not None:
                facts["installed_source_stat"] = head.get("source_stat_fingerprint") or ""
        except (OSError, ValueError) as exc:
            facts["installed_error"] = str(exc)
    if facts["is_dir"] and not os.path.islink(dest):
        lines, size = statwalk.tree_stat(dest, list((head or {}).get("excludes") or ()))
    body = b"".join(lines)
    if against and head is not None and head.get("source_stat_fingerprint") is not None:
        if head.get(manifest.INSTALLED_STAT) == hashlib.sha256(body).hexdigest():
            # the walk's lines are the ones the install recorded (their sha256, in its
            # header): every entry is as installed, none compared, no entry of it parsed
            facts["install"] = {
                "moved": {},
                "source_entries": [_row(e) for e in head.get("source_entries") or ()],
            }
        else:
            try:
                compare = Against(head, _entries(data))
            except ValueError as exc:
                facts["installed_error"] = str(exc)
                facts.pop("installed_source_stat", None)
            else:
                for row in stat_rows(lines):
                    compare.see(tuple(row))
                facts["install"] = compare.result()
    del data
    facts["bytes"] = size
    facts["digest"] = hashlib.sha256(
        json.dumps([facts["exists"], facts.get("installed_record")]).encode() + body
    ).hexdigest()
    good: List[str] = []
    if os.path.isdir(parent):
        good = [p for _n, p in swapfs.backup_dirs(dest) if swapfs.failed_mark(p) is None]
    facts["backups"] = good
    # a swap under `backup` makes the install in place the newest backup; past keep_backups the
    # oldest go once the new install passed its checks (swapfs.prune_backups)
    after = good + ([dest] if policy == "backup" and facts["exists"] else [])
    facts["evicts"] = after[:-keep_backups] if keep_backups and len(after) > keep_backups else []
    return facts, lines


def staged_here(dest: str, staging: str) -> dict:
    """What a staging beside the destination holds (files, bytes, bytes on disk) and, when it is
    what a cut stream left (marked, private, of this destination: staging.resumable_why), the
    source it was for (`source`: STAT-FINGERPRINT HOST:PATH): a run from that source resumes it,
    any other removes it first (compose: `resumable`, or its room counted as free)."""
    import types

    from .receive import staged_bytes
    from .staging import read_mark, resumable_why

    files, size, disk = staged_bytes(staging)
    where = types.SimpleNamespace(staging=staging, dest=dest)
    mark = read_mark(where) or {}
    source = str(mark.get("source", ""))
    if source and resumable_why(where, source):
        source = ""
    return {"files": files, "bytes": size, "disk": disk, "source": source}


def stat_rows(lines: List[bytes]) -> List[list]:
    """The rows of stat lines (each ended by its newline)."""
    return body_rows(b"".join(lines))


def body_rows(body: bytes) -> List[list]:
    """The rows of a body of stat lines, parsed at once (a name's newline is escaped in its
    JSON: each line is one row; blank lines are none)."""
    body = body.strip(b"\n")
    if b"\n\n" in body or b"\r" in body:
        body = b"\n".join(ln for ln in body.split(b"\n") if ln.strip())
    return json.loads(b"[" + body.replace(b"\n", b",") + b"]") if body.strip() else []


def scan_body(path: str) -> Tuple[str, bytes]:
    """(stat fingerprint, stat lines) of a source scan record (hostfs.scan), not parsed; read
    only once it is proven this user's (proven.read_record)."""
    data = proven.read_record(path)
    _head, _, body = data.partition(b"\n")
    return hashlib.sha256(body).hexdigest(), body


def read_scan(path: str) -> Tuple[str, List[list]]:
    """(stat fingerprint, rows [p, t, m, s, l, mt]) of a source scan record (hostfs.scan)."""
    fp, body = scan_body(path)
    return fp, body_rows(body)


def state_body(path: str) -> Tuple[dict, bytes]:
    """(facts, stat lines not parsed) of a destination's state (liveplan state), read only once
    it is proven this user's (proven.read_record)."""
    head, _, body = proven.read_record(path).partition(b"\n")
    return json.loads(head), body


def read_state(path: str) -> Tuple[dict, List[list]]:
    facts, body = state_body(path)
    return facts, body_rows(body)
