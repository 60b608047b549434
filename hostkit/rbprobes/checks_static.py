"""L0 checks: read files only, need no GPU and no torch.

- kernel_audit: every unit of GPU code in the venv, and whether it has a path to the target
  device (SASS that runs there, or PTX this host's driver can JIT for it).
- library_inventory: which CUDA libraries the venv ships, by CUDA major (used by `libraries`).
"""

from __future__ import annotations

import fnmatch
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from rbrules import cpus

from . import arch, auditverdict, cudalibs, decompress, driver, fatbin, venvfs
from .result import Context, failed, short_list
from .workers import over_workers

_SUFFIXES = (".so", ".cubin", ".fatbin")
# Libraries whose vendor dispatches per arch by design: a unit without the target's code is
# a note there, not a failure (NVIDIA's math libraries: libcublasLt has no sm_103 code in many
# of its units and launches only the kernels it has for the device; docs/probes.md counts them).
DEFAULT_PARTIAL_OK = ["nvidia/*"]
UNITS_LISTED = 20  # units without a path listed per file


def _is_candidate(name: str) -> bool:
    return name.endswith(_SUFFIXES) or ".so." in name


def candidate_files(root: str, skipped: Optional[List[str]] = None) -> List[str]:
    """Shared objects, cubins and fatbins under root (or root itself if it is a file), each
    regular file once: symbolic links are not followed, hard links are de-duplicated, and
    anything else with such a name (a FIFO, a socket, a device) is listed in `skipped`."""
    return [path for path, _size in _candidates(root, skipped)]


def _candidates(root: str, skipped: Optional[List[str]]) -> List[Tuple[str, int]]:
    """candidate_files with each file's size (what the audit's workers are balanced by)."""
    if not os.path.isdir(root):
        if os.path.isfile(root):
            try:
                return [(root, os.stat(root).st_size)]
            except OSError:
                return [(root, 0)]  # gone since: its scan says so
        if skipped is not None and os.path.exists(root):
            skipped.append(root)
        return []
    seen = set()
    out = []
    for _top, entry in venvfs.walk(root):
        if not _is_candidate(entry.name):
            continue
        try:
            if entry.is_symlink() or entry.is_dir(follow_symlinks=False):
                continue
            if not entry.is_file(follow_symlinks=False):
                if skipped is not None:
                    skipped.append(entry.path)
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            out.append((entry.path, st.st_size))
    return out


def glob_match(path: str, globs: List[str]) -> Optional[str]:
    """The first glob that matches `path` or any end part of it that starts at a directory
    (`nvidia/*` matches .../site-packages/nvidia/cu13/lib/libcublasLt.so.13), else None."""
    parts = os.path.abspath(path).strip(os.sep).split(os.sep)
    tails = ["/".join(parts[i:]) for i in range(len(parts))]
    for glob in globs:
        if any(fnmatch.fnmatchcase(t, glob) for t in tails):
            return glob
    return None


def unit_path(
    unit: List[fatbin.Container], target: Tuple[int, int], ptx_max: Optional[Tuple[int, int]]
) -> Tuple[Optional[str], str]:
    """("sass" | "ptx" | None, what it has): SASS that runs on the target, else PTX that the
    driver can JIT for it (its ISA version at most `ptx_max`, when known)."""
    entries = [e for c in unit for e in c.entries]
    for entry in entries:
        if entry.kind == "sass" and arch.runs_on("sass", entry.number, entry.suffix, target):
            return "sass", entry.name
    ptx_fit = [
        e for e in entries if e.kind == "ptx" and arch.runs_on("ptx", e.number, e.suffix, target)
    ]
    for entry in ptx_fit:
        if ptx_max is None or entry.version <= ptx_max:
            return "ptx", entry.name
    names = sorted({e.name for e in entries}, key=fatbin.arch_key)
    code = [e for e in entries if e.kind in ("sass", "ptx")]
    if not code:
        if any(e.kind == "lto" for e in entries):
            return None, (
                "only LTO-IR (%s): input for nvJitLink, never loaded as it is" % "+".join(names)
            )
        return None, "no SASS or PTX (%s)" % ("+".join(names) or "no entries")
    why = "has %s" % "+".join(names)
    if ptx_fit:
        why += "; its PTX is ISA %s, the driver JITs up to %d.%d" % (
            "/".join(sorted({"%d.%d" % e.version for e in ptx_fit})),
            ptx_max[0],
            ptx_max[1],
        )
    return None, why


def judged_units(
    scan: fatbin.Scan, target: Tuple[int, int], ptx_max: Optional[Tuple[int, int]]
) -> List[List[fatbin.Container]]:
    """`Scan.units` as the runtime uses them on `target`: a device-linked (-rdc) container
    whose SASS runs there is one unit; one that does not is replaced by the relocatable units
    it was linked from, each on its own (on the H200 the runtime then loads each unit whose
    relocatable SASS runs, or whose PTX it can JIT, and only those)."""
    out = []
    for unit in scan.units:
        if fatbin.linked_group(unit) and unit_path(unit[:1], target, ptx_max)[0] is None:
            out.extend([c] for c in unit[1:])
        elif fatbin.linked_group(unit):
            out.append(unit[:1])
        else:
            out.append(unit)
    return out


def jit_versions(unit: List[fatbin.Container], target: Tuple[int, int]) -> List[str]:
    """PTX ISA versions of the entries a PTX-only unit would be JIT-compiled from."""
    return sorted(
        {
            "%d.%d" % e.version
            for c in unit
            for e in c.entries
            if e.kind == "ptx" and arch.runs_on("ptx", e.number, e.suffix, target)
        }
    )


def _arch_specific(unit: List[fatbin.Container]) -> bool:
    """A unit whose code is all arch- or family-specific (sm_100a, sm_90a, sm_100f, ...): built
    for those archs' own features, so a library calls it only on them (dispatch by design)."""
    code = [e for c in unit for e in c.entries if e.kind in ("sass", "ptx")]
    return bool(code) and all(e.suffix in ("a", "f") for e in code)


def _examine(
    scan: fatbin.Scan,
    buf,
    target: Tuple[int, int],
    ptx_max: Optional[Tuple[int, int]],
    waived: bool,
    strict: bool = False,
    run: Optional[decompress.DecodeBudget] = None,
) -> Dict[str, Any]:
    """Per-file facts: units with and without a path, the kernels of the latter, problems.
    Units without a path whose code is all arch-specific are listed apart (`arch_specific`)
    unless `strict`. `run`: the audit run's decoding budget and deadline (a fresh one when not
    given); a unit a limit left undecoded is `unproven`, a problem: it may hold kernels."""
    if run is None:
        run = decompress.DecodeBudget()
        try:
            return _examine(scan, buf, target, ptx_max, waived, strict, run)
        finally:
            run.close()
    units = judged_units(scan, target, ptx_max)
    with_path = {"sass": 0, "ptx": 0}
    missing: List[Dict[str, Any]] = []
    specific: List[Dict[str, Any]] = []
    kernel_free = 0
    problems: List[str] = []
    unreadable: List[str] = ["%s: %s" % (c.label, c.error) for c in scan.containers if c.error]
    unknown = sorted(
        {e.name for e in scan.entries if e.kind not in ("sass", "ptx", "lto")}, key=fatbin.arch_key
    )
    lacking = []
    jit = set()
    for unit in units:
        how, what = unit_path(unit, target, ptx_max)
        if how:
            with_path[how] += 1
            if how == "ptx":
                jit.update(jit_versions(unit, target))
        elif any(c.entries for c in unit):
            lacking.append((unit, what))
    # A waived file with some unit that runs needs no decoding: it is a note either way.
    decode = not (waived and (with_path["sass"] or with_path["ptx"]))
    budget = [decompress.FILE_INPUT_BUDGET]
    for unit, what in lacking:
        label = (
            unit[0].label
            if len(unit) == 1
            else "%s (%d embedded containers)" % (unit[0].section, len(unit))
        )
        item: Dict[str, Any] = {
            "unit": label,
            "why": what,
            "archs": sorted({e.name for c in unit for e in c.entries}, key=fatbin.arch_key),
        }
        has_code = any(e.kind in ("sass", "ptx") for c in unit for e in c.entries)
        if decode and has_code and buf is not None:
            found = fatbin.unit_kernels(buf, unit, budget, run)
            if found.error:
                unreadable.append(found.error)
            if found.kernel_free:
                kernel_free += 1
                continue
            item["kernels"] = found.names
            item["kernels_complete"] = found.complete
            if not found.complete:
                item["kernels_note"] = found.undecoded
            if found.limited:
                item["unproven"] = True
        elif has_code:
            item["kernels_note"] = "not decoded (partial_ok)" if not decode else "not decoded"
        (specific if not strict and _arch_specific(unit) else missing).append(item)
    if unknown:
        problems.append(
            "entries of a kind this reader does not know (%s): cannot judge" % ", ".join(unknown)
        )
    if unreadable:
        problems.append("unreadable: %s" % short_list(unreadable, 3))
    n_path = with_path["sass"] + with_path["ptx"]
    if not n_path and specific:  # nothing in the file runs here: arch-specific or not
        missing, specific = missing + specific, []
    # A unit without a path that a limit left undecoded may be free of kernels (then it would
    # not count): that was not shown, so it counts, and the file says why.
    unproven = [m["kernels_note"] for m in missing if m.get("unproven")]
    if unproven:
        problems.append(
            "not proven: %d units without a path not decoded, so not shown free of "
            "kernels (%s)" % (len(unproven), short_list(unproven, 2))
        )
    if missing:
        verdict = "partial" if n_path else "none"
    elif n_path:
        verdict = "ptx" if with_path["ptx"] else "sass"
    else:
        verdict = "empty"
    return {
        "units": len(units),
        "units_with_path": n_path,
        "units_ptx_only": with_path["ptx"],
        "units_kernel_free": kernel_free,
        "units_without_path": len(missing),
        "units_arch_specific": len(specific),
        "jit_ptx_versions": sorted(jit),
        "missing": missing,
        "arch_specific": specific,
        "verdict": verdict,
        "problems": problems,
        "unreadable": unreadable,
        "unproven": unproven,
        "unknown_kinds": unknown,
    }


def file_verdict(
    scan: fatbin.Scan,
    target: Tuple[int, int],
    driver_ptx_max: Optional[Tuple[int, int]],
    buf=None,
) -> Tuple[str, int]:
    """("sass" | "ptx" | "partial" | "none" | "empty", units without a path) for one file.

    Each unit (`Scan.units`) has a path when one of its SASS entries runs on the target, or
    else one of its PTX entries can be JIT-compiled for it. With `buf` (the file's bytes) the
    units without a path are decoded and those without any kernel left out (without it, the
    file at scan.path is read when there is one)."""
    if buf is None and os.path.isfile(scan.path):
        with fatbin.mapped(scan.path, follow=True) as (_again, mm):
            info = _examine(scan, mm, target, driver_ptx_max, False)
    else:
        info = _examine(scan, buf, target, driver_ptx_max, False)
    return info["verdict"], info["units_without_path"]


AUDIT_JOBS_MAX = 8
AUDIT_PARALLEL_BYTES = 64 << 20  # less to read than this: one process reads it all


class _Seen(NamedTuple):
    """What the audit's summary needs of a fatbin.Entry (a worker sends these back)."""

    kind: str
    name: str
    version: Tuple[int, int]
    compression: Optional[str]


def audit_jobs(sizes: List[int]) -> int:
    """How many processes read the audit's files: RBPROBES_AUDIT_JOBS when set, else one per
    usable core but one (at most AUDIT_JOBS_MAX) when there is at least AUDIT_PARALLEL_BYTES to
    read, and never more than the files. Only a process without threads forks workers."""
    forced = os.environ.get("RBPROBES_AUDIT_JOBS", "")
    if forced.isdigit():
        return max(1, min(int(forced), len(sizes)))
    if sum(sizes) < AUDIT_PARALLEL_BYTES:
        return 1
    cores = cpus.count()
    return max(1, min(cores - 1, AUDIT_JOBS_MAX, len(sizes)))


def _audit_file(
    path: str,
    follow: bool,
    base: str,
    target: Tuple[int, int],
    driver_ptx_max: Optional[Tuple[int, int]],
    globs: List[str],
    strict: bool,
    run: Optional[decompress.DecodeBudget] = None,
) -> Optional[Dict[str, Any]]:
    """One candidate file's part of `audit`: None (not ELF), {"skipped": path} (not a regular
    file), else {"errors": [...], "seen": [entry facts], "file": its row when it has GPU code}.
    Plain data only (a worker process marshals it back). `run`: the audit's decoding limits."""
    with fatbin.mapped(path, follow=follow) as (scan, buf):
        if scan.kind == "not-elf":
            return None
        if scan.kind == "not-regular":
            return {"skipped": path}
        rel = os.path.relpath(path, base)
        if scan.error:
            return {
                "errors": ["%s: %s" % (rel, scan.error)],
                "file": {
                    "path": rel,
                    "verdict": "unreadable",
                    "fails": True,
                    "problems": ["unreadable: %s" % scan.error],
                },
            }
        entries = [e for c in scan.runtime_containers + scan.embedded_containers for e in c.entries]
        if not entries and not any(c.error for c in scan.containers):
            return {}
        waived_by = None if strict else glob_match(path, globs)
        facts = _examine(scan, buf, target, driver_ptx_max, waived_by is not None, strict, run)
    info: Dict[str, Any] = {"path": rel}
    info.update(fatbin.summarize(entries))
    info["containers"] = len(scan.runtime_containers)
    if scan.embedded_containers:
        info["embedded_containers"] = len(scan.embedded_containers)
    if any(c.section == fatbin.RELOCATABLE_SECTION for c in scan.containers):
        info["relocatable"] = sum(
            len(c.entries) for c in scan.containers if c.section == fatbin.RELOCATABLE_SECTION
        )
    missing = facts.pop("missing")
    specific = facts.pop("arch_specific")
    info.update(facts)
    info["missing"] = missing[:UNITS_LISTED]
    if specific:
        info["arch_specific"] = specific[:UNITS_LISTED]
        info["arch_specific_archs"] = sorted(
            {a for u in specific for a in u["archs"]}, key=fatbin.arch_key
        )
    problems = list(facts["problems"])
    verdict = facts["verdict"]
    if verdict == "none":
        problems.append("no unit has a path to %s" % arch.capability_to_arch(target))
    elif verdict == "partial":
        if waived_by:
            info["waived_by"] = waived_by
        else:
            problems.append(
                "%d of %d units have no path to %s%s"
                % (
                    len(missing),
                    facts["units"] - facts["units_kernel_free"],
                    arch.capability_to_arch(target),
                    " (strict)" if strict else "",
                )
            )
    info["problems"] = problems
    info["fails"] = bool(problems)
    if problems:
        info["package"] = venvfs.owner(path)
    return {
        "errors": ["%s: %s" % (rel, u) for u in facts["unreadable"]],
        "seen": [(e.kind, e.name, e.version, e.compression) for e in entries],
        "file": info,
    }


def audit(
    root: str,
    target: Tuple[int, int],
    paths: Optional[List[str]] = None,
    driver_ptx_max: Optional[Tuple[int, int]] = None,
    partial_ok: Optional[List[str]] = None,
    strict: bool = False,
    jobs: Optional[int] = None,
) -> Dict[str, Any]:
    """Scan root (a venv, a directory or one file), or the given paths inside it, and judge
    every unit for `target`. A file fails when it is unreadable, holds entries of an unknown
    kind, has no unit with a path ("none"), or has units without a path ("partial") unless
    it matches a `partial_ok` glob (default DEFAULT_PARTIAL_OK; ignored with `strict`).

    The files are read by `jobs` worker processes (default: audit_jobs), the result the same
    as one process's, file for file and in the same order."""
    globs = DEFAULT_PARTIAL_OK if partial_ok is None else list(partial_ok)
    roots = (
        [root] if not paths else [p if os.path.isabs(p) else os.path.join(root, p) for p in paths]
    )
    missing_paths = [p for p in roots if not os.path.lexists(p)]
    base = root if os.path.isdir(root) else os.path.dirname(root)
    skipped: List[str] = []
    todo: List[Tuple[str, bool]] = []
    sizes: List[int] = []
    for root_path in roots:
        if os.path.lexists(root_path):
            for path, size in _candidates(root_path, skipped):
                todo.append((path, path == root_path))
                sizes.append(size)
    job_count = audit_jobs(sizes) if jobs is None else jobs
    run = decompress.DecodeBudget()  # decoded bytes and seconds for the whole run, all workers
    try:
        records, workers = over_workers(
            lambda i: _audit_file(
                todo[i][0], todo[i][1], base, target, driver_ptx_max, globs, strict, run
            ),
            sizes,
            job_count,
        )
    finally:
        run.close()
    files: List[Dict[str, Any]] = []
    errors: List[str] = []
    scanned = 0
    all_entries: List[Any] = []
    for rec in records:
        if rec is None:
            continue
        if "skipped" in rec:
            skipped.append(rec["skipped"])
            continue
        scanned += 1
        errors.extend(rec.get("errors", ()))
        all_entries.extend(_Seen(*e) for e in rec.get("seen", ()))
        if "file" in rec:
            files.append(rec["file"])
    overall = fatbin.summarize(all_entries)

    def having(cond) -> List[str]:
        return [f["path"] for f in files if cond(f)]

    return {
        "target": arch.capability_to_arch(target),
        "root": root,
        "files_scanned": scanned,
        "workers": workers,
        "gpu_files": len(files),
        "failing": having(lambda f: f["fails"]),
        "no_path": having(lambda f: f["verdict"] == "none"),
        "partial": having(lambda f: f["verdict"] == "partial"),
        "partial_waived": having(lambda f: f["verdict"] == "partial" and f.get("waived_by")),
        "ptx_only": having(lambda f: f["verdict"] == "ptx"),
        "kernel_free": having(lambda f: f["verdict"] == "empty"),
        "arch_specific": having(lambda f: f.get("units_arch_specific")),
        "unreadable": having(lambda f: f["verdict"] == "unreadable" or f.get("unreadable")),
        "unproven": having(lambda f: f.get("unproven")),
        "decode_limits": {
            "entry_cap": decompress.ENTRY_CAP,
            "output": run.output,
            "seconds": run.seconds,
            "file_input": decompress.FILE_INPUT_BUDGET,
        },
        "unknown_kinds": having(lambda f: f.get("unknown_kinds")),
        "partial_ok": globs,
        "strict": strict,
        "sass": overall["sass"],
        "ptx": overall["ptx"],
        "lto": overall["lto"],
        "ptx_versions": overall["ptx_versions"],
        "compressed_entries": overall["compressed"],
        "zstd_decoder": decompress.zstd_decoder(),
        "missing_paths": missing_paths,
        "skipped_not_regular": skipped,
        "errors": errors,
        "files": files,
    }


def resolve_ptx_limit(value: Optional[str]) -> Tuple[Optional[Tuple[int, int]], Dict[str, Any]]:
    """driver_ptx_max as given: "X.Y" (that), "none" (not checked), absent (this host's
    driver, when it has one). Returns (limit, what the report says about it)."""
    if value and value.lower() != "none":
        return arch.parse_version(value), {"ptx_max": value, "source": "params.driver_ptx_max"}
    if value:
        return None, {"ptx_max": None, "source": "not checked (driver_ptx_max: none)"}
    host = driver.host_driver()
    info = dict(host.as_dict())
    info["source"] = host.describe()
    return host.ptx_max, info


def kernel_audit(params: Dict[str, Any], ctx: Context):
    """Check: every unit of GPU code has a path to the target arch (see `audit`)."""
    target_text = params.get("arch") or ctx.gpu_value("arch") or ctx.gpu_value("capability")
    if not target_text:
        return failed("no target architecture: give params.arch (e.g. sm_103) or gpu.arch")
    try:
        target = arch.parse_target(str(target_text))
        driver_max, driver_info = resolve_ptx_limit(params.get("driver_ptx_max"))
    except ValueError as exc:
        return failed(str(exc))
    root = ctx.venv_or_prefix()
    if not os.path.exists(root):
        return failed("%s does not exist" % root)
    values = audit(
        root,
        target,
        params.get("paths"),
        driver_max,
        params.get("partial_ok"),
        bool(params.get("strict")),
    )
    values["driver"] = driver_info
    values["driver_ptx_max"] = driver_info.get("ptx_max")
    return auditverdict.judge_audit(values)


def library_inventory(venv: str) -> Dict[str, Any]:
    """The CUDA libraries a venv ships, with the CUDA major of each."""
    libs = []
    for fam, path in cudalibs.find_in_tree(venv):
        major, how = cudalibs.cuda_major(path, fam)
        libs.append(
            {"lib": fam, "file": os.path.relpath(path, venv), "cuda_major": major, "source": how}
        )
    majors = sorted({lib["cuda_major"] for lib in libs if lib["cuda_major"] is not None})
    by_lib: Dict[str, List[int]] = {}
    for lib in libs:
        if lib["cuda_major"] is not None:
            by_lib.setdefault(lib["lib"], [])
            if lib["cuda_major"] not in by_lib[lib["lib"]]:
                by_lib[lib["lib"]].append(lib["cuda_major"])
    found = {lib["lib"] for lib in libs}
    return {
        "venv": venv,
        "shipped": libs,
        "cuda_majors": majors,
        "mixed": len(majors) > 1,
        "majors_by_lib": {k: sorted(v) for k, v in sorted(by_lib.items())},
        "not_shipped": [m for m in cudalibs.MAIN if m not in found],
    }
