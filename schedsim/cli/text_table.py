"""Plain-text tables and styled lines for a run's summary, without importing rich.

A run's summary is two or three borderless tables and a few lines; rich (its import, a
Console and the rendering) cost a small ``schedsim run`` about 0.04 s of CPU for them. The
layout is rich's ``box=None`` table, so piped output reads as it did: one space of padding on
each side of every cell, the first column left-justified and the others right-justified.
Bold headers and a yellow ``warning:`` only when stdout is a terminal (and ``NO_COLOR`` is
not set); no line is wrapped.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

BOLD, YELLOW, BOLD_YELLOW, RESET = "\x1b[1m", "\x1b[33m", "\x1b[1;33m", "\x1b[0m"


def styled() -> bool:
    """Whether stdout takes ANSI styles: a terminal, ``NO_COLOR`` unset, ``TERM`` not dumb."""
    stream = sys.stdout
    return (hasattr(stream, "isatty") and stream.isatty() and "NO_COLOR" not in os.environ
            and os.environ.get("TERM") != "dumb")


def style(text: str, code: str) -> str:
    """``text`` in the ANSI style ``code`` on a terminal, as it is otherwise."""
    return f"{code}{text}{RESET}" if styled() else text


def table_lines(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> list[str]:
    """The lines of a borderless table: column 0 left-justified, the rest right-justified,
    each cell padded to its column's width with one space on either side."""
    every = ([list(header)] if header is not None else []) + [list(r) for r in rows]
    if not every:
        return []
    widths = [max(len(r[i]) for r in every) for i in range(len(every[0]))]

    def line(cells: Sequence[str]) -> str:
        return "".join(f" {c.ljust(w) if i == 0 else c.rjust(w)} " for i, (c, w) in enumerate(zip(cells, widths)))

    lines = [line(r) for r in every]
    if header is not None:
        lines[0] = style(lines[0], BOLD)
    return lines


def print_table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None) -> None:
    """Print :func:`table_lines` to stdout."""
    for text in table_lines(rows, header):
        print(text)
