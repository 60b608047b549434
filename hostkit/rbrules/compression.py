"""The compression table, the only one, and the words compression auto measures and may choose:
each compression's tool, how it packs and unpacks (`compression`, a word such as `zstd-3-T2`
read), which a host has (`compressors`). Shared by the compiler and the kit.

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

# The compression table, the only one: the stream's sending end packs with `pack`, its receiving
# end unpacks with `unpack`; `tool` is what a host must have (None: nothing).
COMPRESSION: Dict[str, Dict[str, Any]] = {
    "none": {"tool": None, "pack": None, "unpack": None},
    "zstd": {
        "tool": "zstd",
        "pack": ["zstd", "-q", "-1", "-T0"],
        "unpack": ["zstd", "-q", "-d", "-c"],
    },
    "lz4": {"tool": "lz4", "pack": ["lz4", "-q", "-1", "-c"], "unpack": ["lz4", "-q", "-d", "-c"]},
    "gzip": {"tool": "gzip", "pack": ["gzip", "-1"], "unpack": ["gzip", "-d", "-c"]},
}


# the tools a host is asked for, sorted (the runbook's bash asks `command -v` for each)
COMPRESSOR_TOOLS = tuple(sorted(c["tool"] for c in COMPRESSION.values() if c["tool"]))


# compression auto measures each tool on one core (the stream's words with one thread): lz4 -1,
# zstd at each of ZSTD_LEVELS with -T1; its model (rbkit.model) may then choose zstd at a level
# with -T threads a stream: the word `zstd-LEVEL-TTHREADS` (`zstd-3-T2`), read by `compression`
ZSTD_LEVELS = (1, 3)


ZSTD_MOST_THREADS = 64


def zstd_pack(level: int, threads: int) -> List[str]:
    return ["zstd", "-q", "-%d" % level, "-T%d" % threads]


def measured_words(tool: str) -> List[tuple]:
    """(the measurement's name, the packing words on one core, whether -T applies) of each way
    compression auto measures `tool`."""
    if tool == "zstd":
        return [("zstd-%d" % lv, zstd_pack(lv, 1), True) for lv in ZSTD_LEVELS]
    return [(tool, COMPRESSION[tool]["pack"], False)]


def compression(word: str) -> Optional[Dict[str, Any]]:
    """The table's entry of a compression word: a name of COMPRESSION, or `zstd-LEVEL-TN`
    (level 1-19, 1-ZSTD_MOST_THREADS threads); None for anything else."""
    if word in COMPRESSION:
        return COMPRESSION[word]
    parts = word.split("-")
    if (
        len(parts) == 3
        and parts[0] == "zstd"
        and parts[1].isdigit()
        and parts[2][:1] == "T"
        and parts[2][1:].isdigit()
    ):
        level, threads = int(parts[1]), int(parts[2][1:])
        if (
            1 <= level <= 19
            and 1 <= threads <= ZSTD_MOST_THREADS
            and word == "zstd-%d-T%d" % (level, threads)
        ):
            return dict(COMPRESSION["zstd"], pack=zstd_pack(level, threads))
    return None


def compression_word(word: str) -> str:
    """An argparse type: the word where `compression` knows it, else ValueError."""
    if compression(word) is None:
        raise ValueError("not a compression: %r" % word)
    return word


def compressors(found: Callable[[str], Optional[str]]) -> List[str]:
    """The compressions a host has, sorted: none, and each whose tool `found` finds (on the host:
    shutil.which; the runbook's bash asks `command -v` for COMPRESSOR_TOOLS)."""
    return [
        name for name, c in sorted(COMPRESSION.items()) if c["tool"] is None or found(c["tool"])
    ]
