"""GPU models the compiler knows: model name -> compute capability and what targeting it needs.

The data lives in `compiler/data/gpus.yaml` (documented there and in docs/templating.md); this
module reads it once and answers questions about it. Nothing here imports torch or touches a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Optional

from ruamel.yaml import YAML

from .lint import cache_dir  # one cache folder for the compiler, only this user's

DATA = ("data", "gpus.yaml")
FIELDS = ("model", "capability", "arch_name", "family", "min_cuda", "per_node")


@dataclass(frozen=True)
class GpuModel:
    name: str
    capability: str  # "10.3"
    arch_name: str  # "Blackwell Ultra"
    min_cuda: str  # first CUDA release that can target it
    family: str = ""  # "sm_10x": same major capability
    per_node: int = 1  # typical GPUs per node
    max_cuda: Optional[str] = None  # last CUDA release that can target it (None: still supported)
    aliases: tuple[str, ...] = field(default=())

    @property
    def arch(self) -> str:
        return arch_of(self.capability)


def _key(name: str) -> str:
    """Model names match without case or separators: "RTX PRO 6000" == "rtx-pro-6000"."""
    return re.sub(r"[\s._-]+", "", name).lower()


# Words of a name as nvidia-smi prints it ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB",
# "NVIDIA B300 SXM6 AC", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition") that say
# nothing about the compute capability: the vendor, the memory, the form factor, the board.
NOISE = re.compile(
    r"^(?:nvidia|tesla|[0-9]+g(?:b)?|hbm[0-9]*e?|gddr[0-9]+x?|sxm[0-9]*|pcie|nvl[0-9]*|ac|lc"
    r"|hgx|dgx|server|workstation|edition|max|q)$"
)


def _core(name: str) -> str:
    """The key of `name` without the words NOISE matches: "NVIDIA H100 80GB HBM3" -> "h100"."""
    words = [w for w in re.split(r"[\s._-]+", name.lower()) if w]
    kept = [w for w in words if not NOISE.match(w)]
    return "".join(kept or words)


def _read() -> list[GpuModel]:
    text = resources.files("compiler").joinpath(*DATA).read_text(encoding="utf-8")
    out = []
    for entry in _entries(text):
        missing = [k for k in FIELDS if k not in entry]
        if missing:
            raise ValueError(f"{'/'.join(DATA)}: {entry.get('model')}: missing {missing}")
        out.append(
            GpuModel(
                name=entry["model"],
                capability=str(entry["capability"]),
                arch_name=entry["arch_name"],
                min_cuda=str(entry["min_cuda"]),
                family=entry["family"],
                per_node=int(entry["per_node"]),
                max_cuda=str(entry["max_cuda"]) if entry.get("max_cuda") else None,
                aliases=tuple(entry.get("aliases") or ()),
            )
        )
    return out


def _entries(text: str) -> list[dict]:
    """The `gpus:` entries of the catalog's text. The pure-Python YAML reader is slow next to the
    json module, so what it read is kept in the cache as JSON, named by the sha256 of the text: an
    edited catalog is read afresh."""
    cache = cache_dir("catalog")
    kept = cache / f"{hashlib.sha256(text.encode()).hexdigest()}.json" if cache else None
    if kept is not None:
        try:
            return json.loads(kept.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass  # not kept yet (or unreadable): read the YAML
    entries = YAML(typ="safe").load(text)["gpus"]
    data = json.dumps(entries)
    if kept is not None and json.loads(data) == entries:  # JSON holds exactly what YAML gave
        _keep(kept, data)
    return entries


def _keep(path: Path, data: str) -> None:
    """Write `path` whole or not at all (a temp file beside it, then a rename)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError:
        return  # a read-only cache only costs speed
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


@lru_cache(maxsize=1)
def _index() -> dict[str, GpuModel]:
    index: dict[str, GpuModel] = {}
    for gpu in _read():
        for name in (gpu.name, *gpu.aliases):
            if _key(name) in index:
                raise ValueError(f"{'/'.join(DATA)}: {name!r} is listed twice")
            index[_key(name)] = gpu
    return index


def models() -> list[GpuModel]:
    """Every catalog entry, in file order."""
    return list(dict.fromkeys(_index().values()))


# `GPUS` stays for callers that iterate the catalog: lower-case model name -> entry.
GPUS = {g.name.lower(): g for g in models()}


def lookup(model: str) -> Optional[GpuModel]:
    """The entry for a model name as people write it or nvidia-smi prints it: the name or an
    alias without case or separators, else without the words that only name the vendor, memory or
    form factor ("NVIDIA H100 80GB HBM3", "b300 sxm6 ac")."""
    index = _index()
    return index.get(_key(model)) or _cores().get(_core(model))


def declared(model: str, capability: Optional[str]) -> tuple[str, str, str, list[str]]:
    """What a spec's `gpu:` comes to, derived once: (its compute capability: the spec's, else the
    catalog's, "" when neither says; its arch `sm_NN`, "" without a capability; the name of its
    architecture, "" when the catalog does not know it; the names a device's name must name)."""
    known = lookup(model)
    capability = capability or (known.capability if known else "")
    entry = resolve(model, capability or None)
    return (
        capability,
        arch_of(capability) if capability else "",
        entry.arch_name if entry and capability else "",
        model_names(model),
    )


def model_names(model: str) -> list[str]:
    """What a device's name must name to be `model` (the probes' devices check): its catalog
    name and aliases, or the model as written for one the catalog lacks."""
    known = lookup(model)
    return [known.name, *known.aliases] if known else [model]


@lru_cache(maxsize=1)
def _cores() -> dict[str, GpuModel]:
    """`_core` of every name and alias -> its entry (a core two models share is left out)."""
    cores: dict[str, Optional[GpuModel]] = {}
    for gpu in models():
        for name in (gpu.name, *gpu.aliases):
            core = _core(name)
            cores[core] = gpu if cores.get(core, gpu) is gpu else None
    return {core: gpu for core, gpu in cores.items() if gpu is not None}


def closest(model: str, count: int = 3) -> list[str]:
    """Up to `count` catalog model names nearest to `model` (for a did-you-mean), nearest first."""
    names = {}
    for gpu in models():
        for name in (gpu.name, *gpu.aliases):
            names.setdefault(_core(name), gpu.name)
    import difflib  # only a mistake needs it

    near = difflib.get_close_matches(_core(model), list(names), n=4 * count, cutoff=0.6)
    return list(dict.fromkeys(names[key] for key in near))[:count]


def by_capability(capability: str) -> list[GpuModel]:
    return [g for g in models() if g.capability == capability]


def resolve(model: str, capability: Optional[str] = None) -> Optional[GpuModel]:
    """The entry for `model`; for a model the catalog lacks, what it knows about `capability` (the
    widest CUDA range any known GPU of that capability has), named after `model`; else None."""
    known = lookup(model)
    if known is not None or not capability:
        return known
    same = by_capability(capability)
    if not same:
        return None
    first = min((g.min_cuda for g in same), key=version_tuple)
    lasts = [g.max_cuda for g in same]
    last = None if None in lasts else max((v for v in lasts if v), key=version_tuple)
    return GpuModel(model, capability, same[0].arch_name, first, same[0].family, 1, last)


def arch_of(capability: str) -> str:
    major, minor = capability.split(".")
    return f"sm_{major}{minor}"


def version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def cuda_gap(cuda: str, gpu: GpuModel) -> Optional[str]:
    """Why CUDA release `cuda` cannot target `gpu` ("needs 12.9 or later"), or None when it can."""
    have = version_tuple(cuda)
    if not have:
        return None
    if have < version_tuple(gpu.min_cuda):
        return f"needs {gpu.min_cuda} or later"
    if gpu.max_cuda and have[:2] > version_tuple(gpu.max_cuda)[:2]:
        return f"CUDA {gpu.max_cuda} was the last release to support it"
    return None


def cuda_problem(cuda: str, gpu: GpuModel) -> Optional[str]:
    """ "CUDA 12.4 cannot target sm_103 (B300); needs 12.9 or later", or None when it can."""
    gap = cuda_gap(cuda, gpu)
    return f"CUDA {cuda} cannot target {gpu.arch} ({gpu.name}); {gap}" if gap else None
