"""Quantities in words: `human`, a byte count (`786.4 MB`).

stdlib only; Python >= 3.9.
"""

from __future__ import annotations

from typing import Any


def human(size: Any) -> str:
    """`size` bytes in decimal units (`512 B`, `1.5 KB`, `786.4 MB`, up to TB); `-` for what is not
    a number (a size not measured)."""
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1000:
            return "%d B" % size if unit == "B" else "%.1f %s" % (size, unit)
        size /= 1000.0
    return "%.1f TB" % size
