"""Errors a user can fix by changing their input.

Anything raised as :class:`InputError` is reported by the CLI as a single line
(``schedsim: error: <message>``) with exit status 2 and no traceback. The message
names the file, line or field and says what is wrong. Broken internal invariants
raise ordinary exceptions instead, because they are bugs, not bad input.
"""


class InputError(ValueError):
    """Bad user input: a file, a column, a flag or a configuration value."""


def where(path, line: int | None = None, field: str | None = None) -> str:
    """Format a location prefix such as ``trace.csv:12: arrival_s``."""
    out = str(path)
    if line is not None:
        out += f":{line}"
    if field is not None:
        out += f": {field}"
    return out
