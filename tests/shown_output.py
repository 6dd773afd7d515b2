"""Matching the output a page shows against what a command prints (docs tests)."""

from __future__ import annotations

import re


def missing_line(expected: list[str], output: str) -> str | None:
    """The first shown line that ``output`` does not print, in order ("..." matches any
    text; a line that is only "..." stands for lines left out); None if all are there."""
    printed = [line.strip() for line in output.splitlines()]
    at = 0
    for want in expected:
        if want == "...":
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in want.split("...")))
        while at < len(printed) and not pattern.search(printed[at]):
            at += 1
        if at == len(printed):
            return want
        at += 1
    return None
