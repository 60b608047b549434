"""The kit's tar, one rule for the compiler (compiler/kit.py: the pinned kit, generated/.kit/) and
for a standalone runbook (partials/kit_embedded.sh.j2: the tar it sends its hosts): byte for byte
the same for the same files (sorted directories first, mtime 0, owner root, modes 0644/0755,
ustar, no compression: a compressor's output may differ between versions).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

import io
import tarfile
from typing import Iterable, Tuple


def tar_bytes(files: Iterable[Tuple[str, bytes]]) -> bytes:
    """A tar of `files` ((path, data) in this order), each top directory first (sorted)."""
    files = list(files)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for top in sorted({p.split("/", 1)[0] for p, _ in files if "/" in p}):
            info = tarfile.TarInfo(top)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, data in files:
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
