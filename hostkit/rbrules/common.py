"""The compiler's index of the rules it shares with the kit, each written once in the module of its
subject (the kit imports each from there):

    compression.py   the compression table, the words compression auto measures and may choose
    linkrate.py      compression auto's measurement of the link, and the compressors' sample
    streams.py       tar's record, the streams side by side, the stat walk's workers
    enginerules.py   the install engine's steps, the staged interpreter's time, the lock's wait
    choices.py       the engine's choices: the words of the spec's fields it takes, its document
    units.py         a byte count in words (`human`)

The compiler (compiler/*.py) still names them as `common.NAME`; this module goes when it imports
each from its module too.
"""

# ruff: noqa: F401
from __future__ import annotations

from .choices import (
    ALGOS,
    ON_EXISTING,
    ON_FAILED_CHECKS,
    OUTSIDE_LINKS,
    RERUN,
    SHARED_PARENT,
    SPECIAL_MODES,
    SWAP_ATOMIC,
)
from .compression import (
    COMPRESSION,
    COMPRESSOR_TOOLS,
    ZSTD_LEVELS,
    compression,
    compression_word,
    compressors,
    measured_words,
)
from .enginerules import ENGINE_STEPS, LOCK_WAIT_S, PROVE_TIMEOUT
from .linkrate import (
    LINK_BUSY,
    LINK_CPU_SECONDS,
    LINK_MIN_BYTES,
    LINK_MIN_SECONDS,
    LINK_SECONDS,
    LINK_SEND_SECONDS,
    LINK_STABLE,
    LINK_WAITED,
    LINK_WINDOW,
    MEASURE_SAMPLE,
    link_cpu_bound,
    link_stable,
    link_tail,
)
from .streams import (
    MAX_STREAMS,
    STREAMS_MIN_BYTES,
    TAR_BLOCKS,
    TAR_RECORD,
    WALK_WORKERS,
    relay_streams,
    stream_count,
    walk_workers,
)
from .units import human
