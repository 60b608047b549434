"""L1 checks: facts of the running environment (torch, devices, imports, loaded libraries).

torch is imported inside the checks, never at module import: the package must load (and the L0
checks run) on a host without torch.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from . import arch, cudalibs, driver
from .checks_static import library_inventory
from .result import Context, Unavailable, failed, passed, short_list


def need_torch():
    """Import torch, or raise Unavailable saying why it cannot be."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise Unavailable("torch is not installed in %s (%s)" % (sys.prefix, exc)) from None
    return torch


def need_cuda():
    """torch with at least one CUDA device, or Unavailable naming what is missing."""
    torch = need_torch()
    if not torch.cuda.is_available():
        build = "CUDA %s" % torch.version.cuda if torch.version.cuda else "a CPU-only build"
        raise Unavailable(
            "no CUDA device visible: torch %s (%s) reports "
            "torch.cuda.is_available() == False" % (torch.__version__, build)
        )
    return torch


def version_matches(expected: str, actual: Optional[str]) -> bool:
    """Prefix match by components: '2.11' matches '2.11.0+cu130', not '2.110.0'."""
    if not actual:
        return False
    if "+" in expected:
        return actual.startswith(expected)
    want = expected.split(".")
    have = actual.split("+", 1)[0].split(".")
    return have[: len(want)] == want


def torch_check(params: Dict[str, Any], ctx: Context):
    """torch's version and CUDA version as expected, and a driver new enough for the wheel:
    a driver whose CUDA major is older than torch.version.cuda's fails (a cu130 wheel on a
    driver < 580); an older minor of the same major runs through CUDA's minor-version
    compatibility and is a note."""
    torch = need_torch()
    values: Dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "file": getattr(torch, "__file__", None),
        "cuda_available": bool(torch.cuda.is_available()),
    }
    host = driver.host_driver()
    values["driver"] = host.version
    values["driver_cuda"] = host.cuda
    values["driver_cuda_source"] = host.cuda_source
    problems = []
    notes = []
    want = params.get("version")
    if want and not version_matches(want, torch.__version__):
        problems.append("torch is %s, expected %s" % (torch.__version__, want))
    want_cuda = params.get("cuda") or None
    if want_cuda and not version_matches(want_cuda, torch.version.cuda):
        problems.append(
            "torch is built for CUDA %s, expected %s"
            % (torch.version.cuda or "none (CPU-only build)", want_cuda)
        )
    spec_cuda = ctx.cuda_value("version")
    if not want_cuda and spec_cuda:
        # the spec declares cuda: a torch without a CUDA expectation of its own is held to it:
        # a CPU build cannot use it, nor a wheel of another CUDA major (a minor apart runs)
        if not torch.version.cuda:
            problems.append(
                "torch is a CPU-only build (CUDA none), but the spec declares cuda: %s" % spec_cuda
            )
        elif not version_matches(str(spec_cuda).split(".")[0], torch.version.cuda):
            problems.append(
                "torch is built for CUDA %s, but the spec declares cuda: %s "
                "(another major)" % (torch.version.cuda, spec_cuda)
            )
    if torch.version.cuda and host.cuda:
        wheel = arch.parse_version(torch.version.cuda)
        have = arch.parse_version(host.cuda)
        need = [d for d, c in driver.DRIVER_TO_CUDA if arch.parse_version(c) >= wheel]
        least = need[-1] if need else "?"
        if have[0] < wheel[0]:
            problems.append(
                "torch %s is built for CUDA %s but the driver %s supports CUDA %s "
                "(CUDA %d needs a driver >= %s)"
                % (
                    torch.__version__,
                    torch.version.cuda,
                    host.version or "?",
                    host.cuda,
                    wheel[0],
                    least,
                )
            )
        elif have < wheel:
            notes.append(
                "driver CUDA %s is older than the wheel's %s: runs through CUDA "
                "minor-version compatibility (PTX from the newer toolkit cannot be "
                "JIT-compiled; kernel_audit checks that)" % (host.cuda, torch.version.cuda)
            )
    elif torch.version.cuda and not host.cuda:
        notes.append("no NVIDIA driver found")
    text = "torch %s, CUDA %s" % (torch.__version__, torch.version.cuda or "none")
    if host.version or host.cuda:
        text += ", driver %s (CUDA %s)" % (host.version or "?", host.cuda or "?")
    if problems:
        return failed("; ".join(problems), values)
    return passed("; ".join([text] + notes), values)


def _target(params: Dict[str, Any], ctx: Context) -> Tuple[Optional[str], Optional[int]]:
    cap = params.get("capability") or ctx.gpu_value("capability")
    if not cap and ctx.gpu_value("arch"):
        major, minor = arch.parse_target(ctx.gpu_value("arch"))
        cap = "%d.%d" % (major, minor)
    count = params.get("count")
    if count is None:
        count = ctx.gpu_value("count")
    return cap, count


def devices_check(params: Dict[str, Any], ctx: Context):
    try:
        expected_cap, expected_count = _target(params, ctx)
        if expected_cap:
            arch.parse_capability(expected_cap)
    except ValueError as exc:
        return failed("expected device: %s" % exc)
    torch = need_cuda()
    count = torch.cuda.device_count()
    devices = []
    for index in range(count):
        props = torch.cuda.get_device_properties(index)
        devices.append(
            {
                "index": index,
                "name": props.name,
                "capability": "%d.%d" % (props.major, props.minor),
                "memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count,
            }
        )
    arch_list = list(torch.cuda.get_arch_list())
    values: Dict[str, Any] = {
        "count": count,
        "devices": devices,
        "arch_list": arch_list,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    problems = []
    if expected_count is not None and count != expected_count:
        problems.append("%d device(s) visible, expected %d" % (count, expected_count))
    if expected_cap:
        wrong = [
            "%d: %s is %s" % (d["index"], d["name"], d["capability"])
            for d in devices
            if d["capability"] != expected_cap
        ]
        if wrong:
            problems.append(
                "capability %s expected, but device %s" % (expected_cap, short_list(wrong))
            )
    names = params.get("names")
    if names:
        wrong = [
            d["name"] for d in devices if not any(w.lower() in d["name"].lower() for w in names)
        ]
        if wrong:
            problems.append("device names %s match none of %s" % (short_list(wrong), names))
    # the spec's gpu.model: a device of the same capability but another model (an H100 for an
    # H200) is not the GPU the spec declared
    model, model_names = ctx.gpu_value("model"), ctx.gpu_value("names")
    if model_names:
        values["model"] = model
        wrong = [
            "%d: %s" % (d["index"], d["name"])
            for d in devices
            if not names_model(d["name"], model_names)
        ]
        if wrong:
            problems.append(
                "the spec's gpu.model is %s, but device %s is not one (its names: %s)"
                % (model, short_list(wrong), ", ".join(model_names))
            )
    # Does this torch build carry code (SASS, or PTX to JIT) for every device present?
    unserved = []
    for cap in sorted({d["capability"] for d in devices}):
        dev = arch.parse_capability(cap)
        usable = [a for a in arch_list if _arch_entry_runs(a, dev)]
        values.setdefault("arch_paths", {})[cap] = usable
        if not usable:
            unserved.append(cap)
    if unserved:
        problems.append(
            "this torch build has no SASS or PTX for capability %s (arch list: %s)"
            % (", ".join(unserved), " ".join(arch_list))
        )
    if problems:
        return failed("; ".join(problems), values)
    caps = sorted({d["capability"] for d in devices})
    names_seen = sorted({d["name"] for d in devices})
    return passed(
        "%d x %s (capability %s%s); torch carries %s"
        % (
            count,
            "/".join(names_seen),
            "/".join(caps),
            ", gpu.model %s" % model if model_names else "",
            ", ".join(a for c in caps for a in values["arch_paths"][c]),
        ),
        values,
    )


def names_model(device: str, names: List[str]) -> bool:
    """Whether a device's name as the driver reports it ("NVIDIA H100 80GB HBM3") names one of
    `names` (a model and its aliases, from the compiler's GPU catalog): a run of its words,
    joined without case or separators, is one of them. "NVIDIA GH200 480GB" names GH200, not
    H200; "NVIDIA RTX PRO 6000 Blackwell Server Edition" names RTX-PRO-6000."""
    words = [w for w in re.split(r"[\s._-]+", device.lower()) if w]
    keys = {re.sub(r"[\s._-]+", "", n).lower() for n in names}
    return any(
        "".join(words[i:j]) in keys for i in range(len(words)) for j in range(i + 1, len(words) + 1)
    )


def _arch_entry_runs(name: str, dev: Tuple[int, int]) -> bool:
    try:
        return arch.name_runs_on(name, dev)
    except ValueError:
        return False


def module_version(module: Any, name: str) -> Optional[str]:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    top = name.split(".")[0]
    for candidate in (top, top.replace("_", "-")):
        try:
            return metadata.version(candidate)
        except Exception:
            continue
    return None


def imports_check(params: Dict[str, Any], ctx: Context):
    modules = params.get("modules") or []
    if not modules:
        return failed("no modules to import: give params.modules")
    results = []
    missing = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # a module may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            text = "%s: %s" % (type(exc).__name__, exc)
            results.append({"module": name, "ok": False, "error": text[:500]})
            missing.append("%s (%s)" % (name, text[:200]))
            continue
        results.append(
            {
                "module": name,
                "ok": True,
                "version": module_version(module, name),
                "file": getattr(module, "__file__", None),
            }
        )
    values = {"modules": results}
    if missing:
        return failed("cannot import %s" % short_list(missing), values)
    return passed(
        ", ".join(
            "%s %s" % (r["module"], r["version"])
            if r["version"]
            else "%s (no version: neither __version__ nor package metadata)" % r["module"]
            for r in results
        ),
        values,
    )


def _expected_dirs(params: Dict[str, Any], ctx: Context, venv: str) -> List[str]:
    dirs = [venv]
    dirs.extend(ctx.cuda_value("library_dirs") or [])
    # cuda.library_path_first: directories relative to the venv's site-packages
    for rel in ctx.cuda_value("library_path_first") or []:
        dirs.extend(glob.glob(os.path.join(venv, "lib", "python*", "site-packages", rel)))
    if ctx.cuda_value("home"):
        dirs.append(ctx.cuda_value("home"))
    dirs.extend(params.get("expect_dirs") or [])
    return [d for d in dirs if d]


def _inside(path: str, dirs: List[str]) -> bool:
    real = os.path.realpath(path)
    for directory in dirs:
        for base in {directory.rstrip("/"), os.path.realpath(directory)}:
            if path.startswith(base + "/") or real.startswith(base + "/"):
                return True
    return False


def loaded_report(maps_text: str, expected: List[str]) -> Dict[str, Any]:
    """What the process has loaded, which of it is foreign, and which CUDA majors are mixed."""
    loaded = []
    for fam, path in cudalibs.loaded_libraries(maps_text):
        major, how = cudalibs.cuda_major(path, fam)
        loaded.append(
            {
                "lib": fam,
                "path": path,
                "cuda_major": major,
                "source": how,
                "expected_dir": _inside(path, expected),
            }
        )
    majors = sorted({lib["cuda_major"] for lib in loaded if lib["cuda_major"] is not None})
    return {
        "loaded": loaded,
        "loaded_majors": majors,
        "foreign": [lib["path"] for lib in loaded if not lib["expected_dir"]],
        "expected_dirs": expected,
        "not_loaded": [m for m in cudalibs.MAIN if m not in {lib["lib"] for lib in loaded}],
    }


def _load_cuda_libraries(modules: List[str]) -> Dict[str, Any]:
    """Import the modules; with a GPU, touch CUDA, cuBLAS and cuDNN (through torch, when it is
    one of them) so they load. `cuda_initialised`: a CUDA device was found and used."""
    info: Dict[str, Any] = {"imported": []}
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise Unavailable(
                "cannot import %s (%s): the runtime part needs it" % (name, exc)
            ) from None
        info["imported"].append(name)
    torch = sys.modules.get("torch")
    if torch is not None:
        if torch.cuda.is_available():
            torch.cuda.init()
            ones = torch.ones((64, 64), device="cuda")
            (ones @ ones).sum().item()
            info["cudnn"] = torch.backends.cudnn.version()
            info["cuda_initialised"] = True
            info["devices"] = torch.cuda.device_count()
        else:
            info["cuda_initialised"] = False
            info["why_not"] = "torch %s (CUDA %s) reports torch.cuda.is_available() == False" % (
                torch.__version__,
                torch.version.cuda or "none: a CPU-only build",
            )
        return info
    count, how = driver.cuda_device_count()
    info["devices"] = count
    info["cuda_initialised"] = bool(count)
    if not count:
        info["why_not"] = how if count is None else "libcuda sees no CUDA device"
    return info


def read_maps() -> str:
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        return fh.read()


def libraries_check(params: Dict[str, Any], ctx: Context):
    """Static: which CUDA libraries the venv ships (by CUDA major). Runtime (unless
    runtime: false): after importing `modules` (default torch) and touching CUDA, which were
    loaded from where; fails on a library from outside the expected dirs, or two CUDA majors."""
    venv = ctx.venv_or_prefix()
    values: Dict[str, Any] = {}
    notes = []
    if os.path.isdir(venv):
        values["static"] = library_inventory(venv)
        if values["static"]["mixed"]:
            notes.append(
                "venv ships CUDA majors %s (%s)"
                % (
                    "+".join(map(str, values["static"]["cuda_majors"])),
                    ", ".join(
                        "%s: %s" % (k, "/".join(map(str, v)))
                        for k, v in values["static"]["majors_by_lib"].items()
                        if len(v) > 1
                    )
                    or "different libraries",
                )
            )
    else:
        notes.append("venv %s not found: static part skipped" % venv)
    if params.get("runtime") is False:
        shipped = "+".join(map(str, values.get("static", {}).get("cuda_majors", [])))
        text = "static only; venv ships CUDA %s" % (shipped or "none")
        return passed("; ".join([text] + notes), values, level="L0")
    modules = params.get("modules")
    if modules is None:
        modules = ["torch"]
    try:
        values["runtime"] = _load_cuda_libraries(modules)
    except Unavailable as exc:
        raise Unavailable(exc.reason, values) from None
    values.update(loaded_report(read_maps(), _expected_dirs(params, ctx, venv)))
    problems = []
    if values["foreign"]:
        problems.append("loaded from outside the expected dirs: %s" % short_list(values["foreign"]))
    if len(values["loaded_majors"]) > 1:
        by_major = [
            "CUDA %s: %s"
            % (
                m,
                ", ".join(
                    os.path.basename(lib["path"])
                    for lib in values["loaded"]
                    if lib["cuda_major"] == m
                ),
            )
            for m in values["loaded_majors"]
        ]
        problems.append(
            "CUDA majors %s loaded together (%s)"
            % ("+".join(map(str, values["loaded_majors"])), "; ".join(by_major))
        )
    if problems:
        return failed("; ".join(problems + notes), values)
    loaded = values["loaded"]
    # Nothing wrong was seen; but without CUDA in use, nothing was proven either.
    if not values["runtime"]["cuda_initialised"]:
        raise Unavailable(
            "no CUDA device to load the CUDA libraries with (%s); %d tracked "
            "CUDA libraries were loaded by importing %s, none from elsewhere"
            % (values["runtime"].get("why_not", "?"), len(loaded), ", ".join(modules) or "nothing"),
            values,
        )
    if not loaded:
        raise Unavailable(
            "CUDA is initialised but no tracked CUDA library was loaded after "
            "importing %s" % (", ".join(modules) or "nothing"),
            values,
        )
    text = "%d CUDA libraries loaded, all from expected dirs, CUDA %s" % (
        len(loaded),
        "+".join(map(str, values["loaded_majors"])) or "?",
    )
    return passed("; ".join([text] + notes), values)
