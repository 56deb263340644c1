"""Plain-text table that lines up Korean (double-width) text in a terminal."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence


def display_width(value: str) -> int:
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in value)


def shorten(value: str, width: int) -> str:
    """``value`` on one line, cut to ``width`` display columns with a trailing "…"."""
    flat = " ".join(value.split())
    if display_width(flat) <= width:
        return flat
    kept = ""
    for char in flat:
        if display_width(kept + char) > width - 1:
            break
        kept += char
    return kept + "…"


def _pad(value: str, width: int) -> str:
    return value + " " * (width - display_width(value))


def render(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is left ragged."""
    widths = [
        max(display_width(str(cell)) for cell in column)
        for column in zip(headers, *rows, strict=True)
    ]
    lines = []
    for cells in (headers, *rows):
        padded = [_pad(str(cell), width) for cell, width in zip(cells[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, str(cells[-1])]).rstrip())
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)
