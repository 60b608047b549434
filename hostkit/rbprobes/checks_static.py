"""L0 checks: read files only, need no GPU and no torch.

- kernel_audit: every file with GPU code in the venv, and whether it has a path to the target
  device (SASS that runs there, or PTX the driver can JIT for it).
- library_inventory: which CUDA libraries the venv ships, by CUDA major (used by `libraries`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from . import arch, cudalibs, fatbin
from .result import Context, failed, passed, short_list

_SUFFIXES = (".so", ".cubin", ".fatbin")


def _is_candidate(name: str) -> bool:
    return name.endswith(_SUFFIXES) or ".so." in name


def candidate_files(root: str) -> List[str]:
    """Shared objects, cubins and fatbins under root (or root itself if it is a file), each
    real file once: symlinks are skipped, hard links de-duplicated."""
    if os.path.isfile(root):
        return [root]
    seen = set()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not _is_candidate(name):
                continue
            full = os.path.join(dirpath, name)
            try:
                if os.path.islink(full):
                    continue
                st = os.stat(full)
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            if key not in seen:
                seen.add(key)
                out.append(full)
    return out


def file_verdict(
    scan: fatbin.Scan, target: Tuple[int, int], driver_ptx_max: Optional[Tuple[int, int]]
) -> Tuple[str, int]:
    """("sass" | "ptx" | "partial" | "none" | "empty", modules without a path) for one file.

    A module (one translation unit, or one device link with its units: `Scan.modules`) has a
    path when one of its SASS entries runs on the target ("sass") or else one of its PTX entries
    can be JIT-compiled for it ("ptx"). A file is "partial" when some modules have a path and
    some do not: with lazy module loading that only fails when a kernel of such a module is
    launched. "none" (no entry of the file can run there) does not depend on the grouping.
    Modules without any kernel (`Container.empty`) are left out; a file with nothing else is
    "empty" (it passes: there is nothing to launch).
    """
    paths = []
    for module in scan.modules:
        if all(container.empty for container in module):
            continue  # no kernel in it: nothing to launch, nothing to fail
        how = "none"
        for e in (e for container in module for e in container.entries):
            if e.kind == "sass" and arch.runs_on("sass", e.number, e.suffix, target):
                how = "sass"
                break
            if e.kind == "ptx" and arch.runs_on("ptx", e.number, e.suffix, target, e.version,
                                                driver_ptx_max):
                how = "ptx"
        if any(e.kind in ("sass", "ptx") for container in module for e in container.entries):
            paths.append(how)
    missing = paths.count("none")
    if not paths:
        return ("empty" if scan.modules else "none"), 0
    if missing == len(paths):
        return "none", missing
    if missing:
        return "partial", missing
    return ("ptx" if "ptx" in paths else "sass"), 0


def audit(
    root: str,
    target: Tuple[int, int],
    paths: Optional[List[str]] = None,
    driver_ptx_max: Optional[Tuple[int, int]] = None,
) -> Dict[str, Any]:
    """Scan root (a venv, a directory or one file), or the given paths inside it."""
    roots = [root] if not paths else [p if os.path.isabs(p) else os.path.join(root, p)
                                      for p in paths]
    missing_paths = [p for p in roots if not os.path.exists(p)]
    base = root if os.path.isdir(root) else os.path.dirname(root)
    files: List[Dict[str, Any]] = []
    errors: List[str] = []
    scanned = 0
    all_entries: List[fatbin.Entry] = []
    for r in roots:
        if not os.path.exists(r):
            continue
        for path in candidate_files(r):
            scan = fatbin.scan_file(path)
            if scan.kind == "not-elf":
                continue
            scanned += 1
            rel = os.path.relpath(path, base)
            if scan.error:
                errors.append("%s: %s" % (rel, scan.error))
                continue
            errors.extend("%s: %s" % (rel, c.error) for c in scan.containers if c.error)
            entries = [e for c in scan.runtime_containers + scan.embedded_containers
                       for e in c.entries]
            if not entries:
                continue
            all_entries.extend(entries)
            verdict, without = file_verdict(scan, target, driver_ptx_max)
            info: Dict[str, Any] = {"path": rel}
            info.update(fatbin.summarize(entries))
            info["containers"] = len(scan.runtime_containers)
            if scan.embedded_containers:
                info["embedded_containers"] = len(scan.embedded_containers)
            info["modules"] = len(scan.modules)
            if without:
                info["modules_without_path"] = without
            if any(c.section == fatbin.RELOCATABLE_SECTION for c in scan.containers):
                info["relocatable"] = sum(
                    len(c.entries) for c in scan.containers
                    if c.section == fatbin.RELOCATABLE_SECTION)
            info["verdict"] = verdict
            files.append(info)
    overall = fatbin.summarize(all_entries)
    return {
        "target": arch.capability_to_arch(target),
        "root": root,
        "files_scanned": scanned,
        "gpu_files": len(files),
        "no_path": [f["path"] for f in files if f["verdict"] == "none"],
        "partial": [f["path"] for f in files if f["verdict"] == "partial"],
        "ptx_only": [f["path"] for f in files if f["verdict"] == "ptx"],
        "kernel_free": [f["path"] for f in files if f["verdict"] == "empty"],
        "sass": overall["sass"],
        "ptx": overall["ptx"],
        "lto": overall["lto"],
        "ptx_versions": overall["ptx_versions"],
        "compressed_entries": overall["compressed"],
        "missing_paths": missing_paths,
        "errors": errors,
        "files": files,
    }


def kernel_audit(params: Dict[str, Any], ctx: Context):
    """Check: every file with GPU code has a path to the target arch."""
    target_text = params.get("arch") or ctx.gpu_value("arch") or ctx.gpu_value("capability")
    if not target_text:
        return failed("no target architecture: give params.arch (e.g. sm_103) or gpu.arch")
    try:
        target = arch.parse_target(str(target_text))
        driver_max = (arch.parse_version(params["driver_ptx_max"])
                      if params.get("driver_ptx_max") else None)
    except ValueError as exc:
        return failed(str(exc))
    root = ctx.venv_or_prefix()
    if not os.path.exists(root):
        return failed("%s does not exist" % root)
    values = audit(root, target, params.get("paths"), driver_max)
    values["driver_ptx_max"] = params.get("driver_ptx_max")
    name = values["target"]
    strict = bool(params.get("strict"))
    problems = []
    if values["missing_paths"]:
        problems.append("missing paths: %s" % short_list(values["missing_paths"]))
    if values["no_path"]:
        described = ["%s (%s)" % (f["path"], "+".join(f["sass"] + f["ptx"]))
                     for f in values["files"] if f["verdict"] == "none"]
        problems.append("%d of %d files with GPU code have no %s SASS and no PTX that can be "
                        "JIT-compiled for it: %s" % (len(described), values["gpu_files"], name,
                                                     short_list(described)))
    if strict and values["partial"]:
        problems.append("%d files have modules without a path to %s (strict): %s"
                        % (len(values["partial"]), name, short_list(values["partial"])))
    if values["errors"]:
        problems.append("unreadable: %s" % short_list(values["errors"], 3))
    if problems:
        return failed("; ".join(problems), values)
    notes = []
    if values["ptx_only"]:
        notes.append("%d only through PTX JIT (slow first launch%s)" % (
            len(values["ptx_only"]),
            "" if driver_max else "; driver must accept PTX ISA %s"
            % "/".join(values["ptx_versions"] or ["?"])))
    if values["partial"]:
        notes.append("%d with some modules lacking %s code" % (len(values["partial"]), name))
    if values["kernel_free"]:
        notes.append("%d without any kernel" % len(values["kernel_free"]))
    if values["gpu_files"]:
        summary = "%d files with GPU code (of %d scanned) all have a path to %s" % (
            values["gpu_files"], values["files_scanned"], name)
    else:
        summary = "no file with GPU code (%d shared objects scanned)" % values["files_scanned"]
    return passed(summary + ("; " + "; ".join(notes) if notes else ""), values)


def library_inventory(venv: str) -> Dict[str, Any]:
    """The CUDA libraries a venv ships, with the CUDA major of each."""
    libs = []
    for fam, path in cudalibs.find_in_tree(venv):
        major, how = cudalibs.cuda_major(path, fam)
        libs.append({"lib": fam, "file": os.path.relpath(path, venv), "cuda_major": major,
                     "source": how})
    majors = sorted({l["cuda_major"] for l in libs if l["cuda_major"] is not None})
    by_lib: Dict[str, List[int]] = {}
    for l in libs:
        if l["cuda_major"] is not None:
            by_lib.setdefault(l["lib"], [])
            if l["cuda_major"] not in by_lib[l["lib"]]:
                by_lib[l["lib"]].append(l["cuda_major"])
    found = {l["lib"] for l in libs}
    return {
        "venv": venv,
        "shipped": libs,
        "cuda_majors": majors,
        "mixed": len(majors) > 1,
        "majors_by_lib": {k: sorted(v) for k, v in sorted(by_lib.items())},
        "not_shipped": [m for m in cudalibs.MAIN if m not in found],
    }
