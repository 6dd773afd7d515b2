"""Command-line options shared by ``schedsim run`` and ``schedsim live``.

Typer needs every parameter written out in each command's signature; declaring each
policy flag once here keeps the two commands' names, help and parsing identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from schedsim.errors import InputError

Policy = Annotated[str, typer.Option(
    help="none, static, dynamic, or a user's policy as module:Class or path/file.py:Class")]
MaxBatchSize = Annotated[Optional[int], typer.Option(help="dynamic: most samples in one batch.")]
PreferredBatchSize = Annotated[Optional[str], typer.Option(help="dynamic: preferred sizes, e.g. 8,16,32.")]
MaxQueueDelayUs = Annotated[Optional[int], typer.Option(
    help="dynamic: how long the oldest request may wait for a better batch.")]
Prefetch = Annotated[Optional[bool], typer.Option("--prefetch/--no-prefetch", help=(
    "dynamic: form batches while instances are busy (Triton) or only when one is idle (default)."))]
PriorityLevels = Annotated[Optional[int], typer.Option(help="dynamic: priority levels (1 is served first).")]
DefaultPriorityLevel = Annotated[Optional[int], typer.Option(help="dynamic: level of requests with priority 0.")]
MaxQueueSize = Annotated[Optional[int], typer.Option(help="dynamic: per-level queue limit; a full queue rejects.")]
DefaultTimeoutUs = Annotated[Optional[int], typer.Option(help="dynamic: queue timeout per request.")]
TimeoutAction = Annotated[Optional[str], typer.Option(help="dynamic: REJECT or DELAY.")]
AllowTimeoutOverride = Annotated[Optional[bool], typer.Option(
    "--allow-timeout-override/--no-timeout-override",
    help="dynamic: a request's timeout_us replaces the default when shorter.")]
PreserveOrdering = Annotated[Optional[bool], typer.Option(
    "--preserve-ordering/--no-preserve-ordering", help="dynamic: responses leave in dispatch order.")]
BatchSize = Annotated[Optional[int], typer.Option(help="static: requests per batch.")]
MaxWaitUs = Annotated[Optional[int], typer.Option(
    help="static: send a partial batch once its oldest request waited this long.")]
Param = Annotated[list[str], typer.Option(
    help="Extra policy parameter key=value (repeatable), for users' policies.")]
TritonConfig = Annotated[Optional[Path], typer.Option(
    help="Take dynamic-batcher settings from a Triton config.pbtxt; flags override.")]
Instances = Annotated[Optional[int], typer.Option(help="Model instances serving in parallel (default 1).")]
WarmupS = Annotated[float, typer.Option(help="Leave out requests arriving before this time.")]
RateScale = Annotated[float, typer.Option(help="Replay the trace at this multiple of its rate.")]
JsonOutput = Annotated[bool, typer.Option("--json", help="Print the summary as JSON instead of tables.")]


def int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    """``8,16,32`` (or ``8/16/32``) as a tuple; ``none`` or empty as ()."""
    if text is None:
        return None
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        return tuple(int(v) for v in text.replace("/", ",").split(",") if v.strip())
    except ValueError:
        raise InputError(f"{flag}: {text!r} is not a comma-separated list of integers") from None


def key_values(pairs: list[str]) -> dict:
    """``--param key=value`` for users' policies; values parsed as int, float, bool or text."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--param: {pair!r} is not key=value")
        for convert in (int, float):
            try:
                out[key.strip()] = convert(value)
                break
            except ValueError:
                continue
        else:
            out[key.strip()] = {"true": True, "false": False}.get(value.lower(), value)
    return out


def policy_params(*, preferred_batch_size, param, **flags) -> dict:
    """The policy parameters the user gave (flags left unset are not passed on)."""
    given = dict(flags, preferred_batch_sizes=int_list(preferred_batch_size, "--preferred-batch-size"))
    return {k: v for k, v in given.items() if v is not None} | key_values(param)


def print_json(summary: dict) -> None:
    from schedsim.files import json_safe

    print(json.dumps(json_safe(summary), indent=2, sort_keys=True))
