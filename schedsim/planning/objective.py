"""SLOs and objectives over summary.json metrics, and the ranking of sweep cells.

An SLO is a list of constraints on summary keys (``p99_ms<=50``, ``throughput_rps>=9000``);
any numeric key of summary.json works, so LLM keys such as ``ttft_p99_ms`` plug in as they
appear. A row that carries a prediction band for a bounded metric (``KEY_lo``/``KEY_hi``, from
``schedsim run``'s band, :mod:`schedsim.run.bands`) is judged on the band's edge on the
SLO's side (the upper edge for ``<=``), never on the better side of the point estimate: a
setting meets the SLO when one live run would meet it at the band's confidence, not just
the run at one seed. The objective is ``max:KEY`` or ``min:KEY`` (default: most throughput); values
within ``tie_tolerance`` of the best count as a tie, broken by the lower tail latency,
because on an open-loop trace every stable setting serves the offered rate and the
throughputs differ only by where the last batch happens to end.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from schedsim.errors import InputError

_OPS = {"<=": lambda v, x: v <= x, "<": lambda v, x: v < x,
        ">=": lambda v, x: v >= x, ">": lambda v, x: v > x}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Constraint:
    """One SLO term: ``key op limit`` on a summary.json metric."""

    key: str
    """summary.json key, e.g. p99_ms."""
    op: str
    """<=, <, >= or >."""
    limit: float
    """The bound."""

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.limit:g}"

    def holds(self, value: float) -> bool:
        return value is not None and math.isfinite(value) and _OPS[self.op](value, self.limit)

    def margin(self, value: float) -> float:
        """How far inside the bound ``value`` is, in the metric's unit (negative: violated)."""
        if value is None or not math.isfinite(value):
            return -math.inf
        return self.limit - value if self.op[0] == "<" else value - self.limit

    def relative_margin(self, value: float) -> float:
        return self.margin(value) / abs(self.limit) if self.limit else self.margin(value)


def parse_slo(items: list[str], p99_ms: float | None = None) -> tuple[Constraint, ...]:
    """``--slo KEY<=X`` (repeatable) plus the ``--slo-p99-ms X`` shorthand."""
    out = []
    if p99_ms is not None:
        if not p99_ms > 0:
            raise InputError(f"--slo-p99-ms: {p99_ms} is not valid; expected a number > 0")
        out.append(Constraint("p99_ms", "<=", float(p99_ms)))
    for item in items:
        m = _CONSTRAINT.match(item)
        if not m:
            raise InputError(f"--slo: {item!r} is not KEY<=NUMBER (or <, >=, >), e.g. p99_ms<=50")
        try:
            limit = float(m[3])
        except ValueError:
            raise InputError(f"--slo: {item!r}: {m[3]!r} is not a number") from None
        if not math.isfinite(limit):
            raise InputError(f"--slo: {item!r}: the bound must be finite")
        out.append(Constraint(m[1], m[2], limit))
    keys = [c.key for c in out]
    if len(set(zip(keys, (c.op[0] for c in out)))) != len(out):
        raise InputError("--slo: the same metric is bounded twice from the same side")
    return tuple(out)


@dataclass(frozen=True)
class Objective:
    """What the best setting maximises or minimises among those meeting the SLO."""

    key: str = "throughput_rps"
    """summary.json key."""
    sense: str = "max"
    """max or min."""
    tie_tolerance: float = 0.01
    """Values within this fraction of the best are a tie, broken by ``tiebreak``."""
    tiebreak: str = "p99_ms"
    """Lower is better; the first SLO metric bounded from above, else p99_ms."""

    def __str__(self) -> str:
        return f"{self.sense}:{self.key}"


def parse_objective(text: str, tie_tolerance: float, slo: tuple[Constraint, ...]) -> Objective:
    sense, sep, key = text.partition(":")
    if not sep or sense not in ("max", "min") or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise InputError(f"--objective: {text!r} is not max:KEY or min:KEY, e.g. max:throughput_rps")
    if not 0 <= tie_tolerance < 1:
        raise InputError(f"--tie-tolerance: {tie_tolerance} is not valid; expected 0 <= x < 1")
    upper = [c.key for c in slo if c.op[0] == "<"]
    return Objective(key, sense, float(tie_tolerance), upper[0] if upper else "p99_ms")


def metric_keys(slo: tuple[Constraint, ...], objective: Objective) -> list[str]:
    """The metrics a ranking reads."""
    keys = [c.key for c in slo] + [objective.key, objective.tiebreak]
    return list(dict.fromkeys(keys))


def check_keys(summary: dict, keys: list[str], flag: str = "--slo/--objective") -> None:
    """An unknown metric is bad input; say which keys exist."""
    for key in keys:
        if not isinstance(summary.get(key, ""), (int, float)) or isinstance(summary.get(key), bool):
            known = sorted(k for k, v in summary.items()
                           if isinstance(v, (int, float)) and not isinstance(v, bool) and not k.endswith("_ci"))
            raise InputError(f"{flag}: summary.json has no numeric metric {key!r}; it has: {', '.join(known)}")


def judged(row: dict, c: Constraint) -> float | None:
    """The value ``c`` is judged on: the point estimate, or where ``row`` has a band for
    ``c.key`` its edge on the SLO's side (the worse of the edge and the point)."""
    value = row.get(c.key)
    edge = row.get(f"{c.key}_hi" if c.op[0] == "<" else f"{c.key}_lo")
    if edge is None or value is None or not (math.isfinite(edge) and math.isfinite(value)):
        return value
    return max(value, edge) if c.op[0] == "<" else min(value, edge)


def meets(row: dict, slo: tuple[Constraint, ...]) -> bool:
    return all(c.holds(judged(row, c)) for c in slo)


def violation(row: dict, slo: tuple[Constraint, ...]) -> float:
    """The largest relative shortfall against any constraint (<= 0 when the SLO is met)."""
    return max((-c.relative_margin(judged(row, c)) for c in slo), default=0.0)


def band_level(confidence: float) -> float:
    """The two-sided band whose edge is a one-sided bound at ``confidence``: 2 x confidence - 1
    (0.95 -> the 90% band's upper edge). 0 = judge the point estimate."""
    if confidence == 0:
        return 0.0
    if not 0.5 < confidence < 1:
        raise InputError(f"--slo-confidence: {confidence} is not valid; expected 0 (the point estimate) "
                         "or a confidence in (0.5, 1), such as 0.95")
    return 2 * confidence - 1


def slo_basis(confidence: float, judged_on_band: bool) -> str:
    """What the SLO was judged on, in words, for the outputs."""
    if judged_on_band:
        level = band_level(confidence)
        return (f"the edge of each setting's {level:.0%} prediction band on the SLO's side (one live run "
                f"meets the SLO with {confidence:.0%} confidence)")
    return "the point estimate (one run at --seed)" + (
        "" if confidence == 0 else "; no band was computed (see the notes)")


def _num(value) -> float:
    return value if value is not None and math.isfinite(value) else math.nan


def rank(rows: list[dict], slo: tuple[Constraint, ...], objective: Objective) -> list[int]:
    """Indices of ``rows`` best first: SLO-meeting cells by objective (ties by ``tiebreak``),
    then the others closest to the SLO first. ``row['cell']`` breaks any remaining tie, so
    the order never depends on the order cells finished in."""
    sign = -1.0 if objective.sense == "max" else 1.0
    good = [i for i, r in enumerate(rows) if meets(r, slo)]
    values = [_num(rows[i].get(objective.key)) for i in good]
    finite = [v for v in values if math.isfinite(v)]
    best = (max(finite) if objective.sense == "max" else min(finite)) if finite else math.nan

    def key(i):
        r = rows[i]
        if i in good_set:
            v, tb = _num(r.get(objective.key)), _num(r.get(objective.tiebreak))
            tied = math.isfinite(v) and abs(v - best) <= objective.tie_tolerance * abs(best)
            if tied:
                return (0, 0, tb if math.isfinite(tb) else math.inf, r["cell"])
            return (0, 1, sign * v if math.isfinite(v) else math.inf, r["cell"])
        over = violation(r, slo)
        return (1, 0, over if math.isfinite(over) else math.inf, r["cell"])

    good_set = set(good)
    return sorted(range(len(rows)), key=key)


def pareto(rows: list[dict], x: str = "p99_ms", y: str = "throughput_rps") -> list[int]:
    """Indices of rows no other row beats on both lower ``x`` and higher ``y``."""
    pts = [(i, _num(r.get(x)), _num(r.get(y))) for i, r in enumerate(rows)]
    pts = [p for p in pts if math.isfinite(p[1]) and math.isfinite(p[2])]
    pts.sort(key=lambda p: (p[1], -p[2], rows[p[0]]["cell"]))
    front, best_y = [], -math.inf
    for i, _, yv in pts:
        if yv > best_y:
            front.append(i)
            best_y = yv
    return front
