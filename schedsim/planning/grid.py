"""Parameter grids for ``schedsim sweep`` and ``schedsim plan``: ``--grid name=values``.

Values are ``a:b:step`` (an inclusive range), or ``v1,v2,...`` where each value is an
integer, a number, ``true``/``false``, ``none``, text, or a list written ``8/16/32``.
Names are policy parameters, written as the policy's constructor names them or as
``schedsim run``'s flag does (``preferred_batch_size``, ``max-queue-delay-us``); the
names in ``RUN_FIELDS`` set the run instead (``instances``, ``rate_scale``).
"""

from __future__ import annotations

import itertools
import math

from schedsim.errors import InputError

ALIASES = {"preferred_batch_size": "preferred_batch_sizes",
           "max_queue_delay_microseconds": "max_queue_delay_us",
           "default_timeout_microseconds": "default_timeout_us"}
"""Names users know (``schedsim run`` flags, Triton's config.pbtxt fields) whose policy parameter
is spelt differently."""
LIST_PARAMS = {"preferred_batch_sizes"}
"""Parameters that are lists: a single value ``8`` means ``(8,)``."""
RUN_FIELDS = {"instances": int, "rate_scale": float}
"""Grid names that set a ``RunSpec`` field rather than a policy parameter."""
MAX_CELLS = 100_000


def parse_value(text: str, flag: str):
    """One grid value: int, float, bool, None, a tuple (``8/16/32``) or text."""
    text = text.strip()
    if not text:
        raise InputError(f"{flag}: empty value")
    if text.lower() == "none":
        return None
    if "/" in text:
        return tuple(parse_value(v, flag) for v in text.split("/"))
    for convert in (int, float):
        try:
            value = convert(text)
        except ValueError:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(f"{flag}: {text!r} is not a finite number")
        return value
    return {"true": True, "false": False}.get(text.lower(), text)


def _range(text: str, flag: str) -> list:
    parts = text.split(":")
    if len(parts) != 3:
        raise InputError(f"{flag}: {text!r} is not a range start:stop:step")
    start, stop, step = (parse_value(p, flag) for p in parts)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (start, stop, step)):
        raise InputError(f"{flag}: {text!r}: a range needs numbers start:stop:step")
    if step <= 0 or stop < start:
        raise InputError(f"{flag}: {text!r}: expected start <= stop and step > 0")
    count = int(math.floor((stop - start) / step + 1e-9)) + 1
    if count > MAX_CELLS:
        raise InputError(f"{flag}: {text!r} has {count:,} values; at most {MAX_CELLS:,}")
    if all(isinstance(v, int) for v in (start, stop, step)):
        return list(range(start, stop + 1, step))
    # Multiply rather than accumulate so 0.1-steps do not drift.
    return [round(start + i * step, 12) for i in range(count)]


def parse_grid_item(item: str) -> tuple[str, list]:
    """``name=values`` as (policy or run parameter name, list of values)."""
    flag = f"--grid {item!r}"
    name, sep, values = item.partition("=")
    name = name.strip().replace("-", "_")
    if not sep or not name or not name.isidentifier():
        raise InputError(f"{flag}: expected name=a:b:step or name=v1,v2,...")
    name = ALIASES.get(name, name)
    values = values.strip()
    if not values:
        raise InputError(f"{flag}: no values after '='")
    if ":" in values and "," not in values:
        out = _range(values, flag)
    else:
        out = [parse_value(v, flag) for v in values.split(",")]
    if name in LIST_PARAMS:
        out = [() if v is None else (v,) if not isinstance(v, tuple) else v for v in out]
    if name in RUN_FIELDS:
        kind = RUN_FIELDS[name]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in out):
            raise InputError(f"{flag}: {name} takes numbers > 0")
        out = [kind(v) for v in out]
    if len(set(map(repr, out))) != len(out):
        raise InputError(f"{flag}: a value is repeated")
    return name, out


def parse_grid(items: list[str]) -> dict[str, list]:
    """All ``--grid`` options as {name: values}, in the order given."""
    if not items:
        raise InputError("--grid: give at least one, e.g. --grid max_queue_delay_us=0:2000:500")
    grid: dict[str, list] = {}
    for item in items:
        name, values = parse_grid_item(item)
        if name in grid:
            raise InputError(f"--grid: {name} is given twice")
        grid[name] = values
    size = math.prod(len(v) for v in grid.values())
    if size > MAX_CELLS:
        raise InputError(f"--grid: {size:,} cells; at most {MAX_CELLS:,}")
    return grid


def cells(grid: dict[str, list]) -> list[dict]:
    """Every combination, the last name varying fastest: the cell order of every output."""
    names = list(grid)
    return [dict(zip(names, combo)) for combo in itertools.product(*grid.values())]


def split_cell(cell: dict) -> tuple[dict, dict]:
    """(policy parameters, RunSpec fields) of one cell; None means 'leave at the default'."""
    params = {k: v for k, v in cell.items() if k not in RUN_FIELDS and v is not None}
    run = {k: v for k, v in cell.items() if k in RUN_FIELDS}
    return params, run


def label(value) -> str:
    """A value as the grid writes it (``none``, ``8/16/32``)."""
    if value is None or value == ():
        return "none"
    if isinstance(value, tuple):
        return "/".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
