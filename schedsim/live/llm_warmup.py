"""What a live LLM run warms up before its clock starts, and the shapes it must cover.

A fresh engine's first step of a shape pays for kernel loading and selection and for the
allocator's growth; :func:`warm_up` runs the shapes a replay will meet (eager prefill and
mixed steps over a spread of shapes, then every captured decode graph) with rows that read
and write only the null block. :func:`warm_token_counts` tells the simulator which token
counts a live run has already run, so it charges no first call for them. Imports neither
simpy nor pyarrow (the device image may have neither).
"""

from __future__ import annotations

import math
import time

import numpy as np

from schedsim.core.policy import Requests
from schedsim.live.engines.llm_rows import EngineRow
from schedsim.live.engines.null_engine import NullLLMEngine


def engine_context(requests: Requests, policy) -> int:
    """The longest position the engine must cover for ``requests`` under ``policy``.

    Over the requests the policy can accept (prompt + output within its max_model_len):
    the longest prompt plus the longest output, plus one, since a static batch's padding
    rows compute past their own output up to the batch's longest. A policy that runs long
    requests up to its limit (``caps_long_requests``) needs the longest of them, limit
    included, plus one. Speculative decoding's verifications reach ``k`` draft tokens
    further (within the limit).
    """
    if not len(requests):
        return 2
    prompt = requests.input_tokens.astype(np.int64)
    output = requests.output_tokens.astype(np.int64)
    limit = _max_model_len(policy)
    k = policy.speculative.num_speculative_tokens if policy.speculative is not None else 0
    if limit and policy.caps_long_requests:   # every prompt that fits with one token runs, up to the limit
        ok = prompt < limit
        return int(np.minimum(prompt + output + k, limit)[ok].max() + 1) if ok.any() else 2
    ok = prompt + output <= limit if limit else np.ones(prompt.shape, bool)
    if not ok.any():
        return 2
    return int(prompt[ok].max() + output[ok].max() + 1 + k)


def prefill_lengths(top: int) -> list[int]:
    """Chunk lengths the eager warm-up runs, longest first: a few short ones (2, 5, 9), then
    for every power of two p from 16 up to ``top``: p, p + p/4 + 1 (odd) and p + p/2, and
    ``top`` itself; all within 2..top."""
    top = int(top)
    out = {2, 5, 9, top}
    p = 16
    while p <= top:
        out.update((p, p + p // 4 + 1, p + p // 2))
        p *= 2
    return sorted((n for n in out if 2 <= n <= top), reverse=True)


def _spread(top: int, first: int) -> list[int]:
    """first, 2 first, 4 first ... up to ``top`` (and ``top``); [] when top < 1."""
    out, v = [], max(int(first), 1)
    while v < top:
        out.append(v)
        v *= 2
    return out + [int(top)] if top >= 1 else []


DENSE_WARMUP_STEP = 16
"""Token-count stride of the warm-up's dense sweep of short prefills (:func:`warm_eager`)."""
DENSE_WARMUP_TOP = 2048
"""Where the dense sweep stops: twice the 1,024 tokens up to which the fidelity table's
launch-bound eager steps were priced low; a new count's first call cost 6.2 ms at the median
up to 1,024 tokens and 3.0 ms above (experiments/fidelity-llm/first_call_distance.json)."""


def warm_eager(engine, *, max_seqs: int, max_context: int, prefill_tokens: int,
               budget_s: float = 30.0, dense: bool = True) -> dict:
    """Run eager steps over a spread of shapes, so the replay does not pay first-call costs.

    On a fresh engine the first eager step of a shape pays for kernel loading and
    selection and for the allocator's growth (on the H200 a 389-token prefill took 66 ms
    the first time, 8 ms later). For every chunk length of :func:`prefill_lengths` up to
    ``prefill_tokens`` (longest first, so the allocator grows once; lengths beyond
    ``max_context`` are split over several rows, as several prompts in one step), it runs: the chunk
    alone over no cached context; the chunk over a cached context (a spread of lengths up to
    ``max_context``, cycled); and a mixed step, the chunk (over no context or a cached one,
    in turn) with some decodes (1, 2, 4 ... ``max_seqs``, cycled) over a spread of contexts.
    Decode-only steps that run eagerly (more rows than the largest captured graph, or no
    graphs) get a few shapes too. Then (``dense``; a run's ``setup`` without
    ``warmup_dense_steps`` had no such sweep) every multiple of :data:`DENSE_WARMUP_STEP` tokens up to
    ``min(prefill_tokens, DENSE_WARMUP_TOP)`` not run yet, alone: the first steps of a new
    token count early in a process cost the most (the GEMMs' kernels for a new M are chosen,
    and loaded on first use), and the fidelity table's first cell, at light load, paid it
    on its early prefills (`experiments/fidelity-llm/README.md`: eager steps of up
    to 1,024 tokens at new counts priced 28-38% low in the cell's first third, between 14%
    low and 12% high in its last). Every row reads and writes only the null block, so no
    request's KV changes. Stops starting steps after ``budget_s``.
    """
    from schedsim.live.engines.llm_rows import NULL_BLOCK

    t = time.perf_counter()
    bs, cap = engine.block_size, min(int(max_context), engine.max_context)
    top = max(2, int(prefill_tokens))
    lengths = prefill_lengths(top) if cap >= 2 else []
    contexts = _spread(cap - 2, bs)
    seqs = _spread(max(int(max_seqs), 1), 1)
    pool = max(engine.num_blocks, 1)

    def row(n, c):
        return EngineRow(np.ones(n, np.int64), c, [NULL_BLOCK] * -(-(c + n) // bs))

    def chunk(n, c):
        # Tokens beyond one row's reach (max_context) go to more rows (several prompts in a step).
        if c + n <= cap:
            return [row(n, c)]
        k = -(-n // cap)
        return [row(m, 0) for m in [n // k + (j < n % k) for j in range(k)] if m >= 2]

    def decodes(d, i):
        # Decode contexts cycle over the spread, kept to d rows x width <= the pool's blocks
        # (the gather a real step of d decodes could reach).
        c = contexts[(i * 3) % len(contexts)] if contexts else 0
        c = max(0, min(c, cap - 1, (pool // d) * bs - 1))
        return [row(1, c)] * d

    steps, timed_out = 0, False
    for i, n in enumerate(lengths):
        if time.perf_counter() - t > budget_s:
            timed_out = True
            break
        c = min(contexts[i % len(contexts)], cap - n) if contexts else 0
        batch = [chunk(n, 0)]
        if c > 0:
            batch.append([row(n, c)])
        d = seqs[i % len(seqs)]
        q = n - d if n - d >= 2 else n
        pc = c if i % 2 and c > 0 and c + q <= cap else 0
        batch.append(chunk(q, pc) + decodes(d, i))
        for rows in batch:
            engine.execute(rows)
            steps += 1
    graphs = getattr(engine, "cuda_graphs", False)
    largest = engine.graph_batch_sizes[-1] if graphs else 0
    eager_decode = [d for d in seqs if d > largest]
    for i, d in enumerate(eager_decode[::-1][:4]):
        if time.perf_counter() - t > budget_s:
            timed_out = True
            break
        engine.execute(decodes(d, i))
        steps += 1
    done = set(lengths)
    swept = [n for n in range(DENSE_WARMUP_STEP, min(top, DENSE_WARMUP_TOP, cap) + 1, DENSE_WARMUP_STEP)
             if dense and n not in done]
    for n in swept:
        if time.perf_counter() - t > budget_s:
            timed_out = True
            break
        engine.execute(chunk(n, 0))
        steps += 1
    return {"warmup_eager_s": time.perf_counter() - t, "warmup_eager_steps": steps,
            "warmup_prefill_lengths": len(lengths), "warmup_dense_steps": len(swept), "warmup_eager_cut": timed_out}


class _CountingEngine(NullLLMEngine):
    """A :class:`~schedsim.live.engines.null_engine.NullLLMEngine` with captured graph sizes that
    records each step's token count: what :func:`warm_eager` would run, run in no time."""

    def __init__(self, block_size: int, num_blocks: int, max_context: int, graph_batch_sizes: tuple[int, ...]):
        super().__init__(num_blocks, block_size, max_context)
        self.graph_batch_sizes, self.cuda_graphs = tuple(graph_batch_sizes), bool(graph_batch_sizes)
        self.counts: set[int] = set()

    def execute(self, rows) -> np.ndarray:
        self.counts.add(sum(len(r.tokens) for r in rows))
        return super().execute(rows)


def warm_token_counts(*, block_size: int, num_blocks: int, max_context: int, graph_batch_sizes: tuple[int, ...],
                      max_seqs: int, prefill_tokens: int, dense: bool = True) -> frozenset[int]:
    """Token counts of the eager steps :func:`warm_up` runs with these settings: what a live
    run's engine has run before its clock starts, so the simulator charges no first call
    for them (:attr:`schedsim.cost.step_model.StepCostModel.warm_tokens`). ``dense``: as
    :func:`warm_eager`'s (False for a run recorded before the dense sweep existed)."""
    engine = _CountingEngine(block_size, num_blocks, max_context, graph_batch_sizes)
    warm_eager(engine, max_seqs=max_seqs, max_context=max_context, prefill_tokens=prefill_tokens,
               budget_s=math.inf, dense=dense)
    return frozenset(engine.counts)


def live_warm_tokens(requests: Requests, policy, graph_batch_sizes: tuple[int, ...]) -> frozenset[int]:
    """:func:`warm_token_counts` for what :func:`run_live_llm` warms up before replaying
    ``requests`` under ``policy`` (its engine's own context limit aside)."""
    budget = policy.budget
    return warm_token_counts(block_size=budget.block_size, num_blocks=budget.num_blocks,
                             max_context=engine_context(requests, policy), graph_batch_sizes=graph_batch_sizes,
                             max_seqs=warm_rows(policy),
                             prefill_tokens=warmup_prefill_tokens(requests, policy))


def warm_up(engine, *, max_seqs: int, max_context: int, prefill_tokens: int, eager: bool = True) -> dict:
    """Run (and capture) the shapes the run will use before the clock starts.

    With ``eager``, :func:`warm_eager` (eager prefill and mixed steps over a spread of
    shapes, up to ``prefill_tokens`` per chunk, ``max_context`` and ``max_seqs``); without,
    one eager prefill of ``prefill_tokens`` tokens. Then, on CUDA with graphs, one decode
    step at every captured batch size up to ``max_seqs`` and every graph width up to
    ``max_context`` tokens whose batch x width fits the pool's blocks, largest first (the
    graphs' shared memory pool grows once). Rows read and write only the null block.
    Returns wall times (``engine_warmup_s`` in all, ``warmup_eager_s``) and shape counts.
    """
    from schedsim.live.engines.llm_rows import NULL_BLOCK
    from schedsim.cost.llm_shapes import context_blocks, graph_batch

    t = time.perf_counter()
    bs = engine.block_size
    if eager:
        info = warm_eager(engine, max_seqs=max_seqs, max_context=max_context, prefill_tokens=prefill_tokens)
    else:
        n = max(1, min(int(prefill_tokens), engine.max_context))
        engine.execute([EngineRow(np.ones(n, np.int64), 0, [NULL_BLOCK] * -(-n // bs))])
        info = {"warmup_eager_s": time.perf_counter() - t, "warmup_eager_steps": 1}
    engine.execute([EngineRow([1], 0, [NULL_BLOCK])])
    shapes = 0
    if getattr(engine, "cuda_graphs", False):
        top = graph_batch(max(int(max_seqs), 1), engine.graph_batch_sizes) or engine.graph_batch_sizes[-1]
        batches = [b for b in engine.graph_batch_sizes if b <= top]
        widest = context_blocks(max(int(max_context), 1), bs)
        widths, w = [], 16
        while w <= widest:
            widths.append(w)
            w *= 2
        for b in sorted(batches, reverse=True):
            for w in sorted(widths, reverse=True):
                # A context in (w/2, w] blocks pads to width w (w = 16 holds every shorter one).
                ctx = 0 if w <= 16 else (w // 2) * bs
                # Beyond the pool's tokens no step fits whole; a padded one is captured when met.
                if ctx + 1 > engine.max_context or b * w > engine.num_blocks:
                    continue
                engine.execute([EngineRow([1], ctx, [NULL_BLOCK] * w)] * b)
                shapes += 1
    return {"engine_warmup_s": time.perf_counter() - t, "warmup_decode_shapes": shapes} | info


def warmup_prefill_tokens(requests: Requests, policy) -> int:
    """The most prefill tokens one step of ``policy`` can hold on ``requests``: its
    ``max_num_batched_tokens`` when it has one, else (a policy that prefills whole prompts,
    several in a step) the longest prompt it accepts, or the sum of its ``max_num_seqs``
    longest up to 16,384 tokens if more."""
    cap = policy.max_num_batched_tokens
    if not len(requests):
        return int(cap or 2)
    prompt = requests.input_tokens.astype(np.int64)
    limit = _max_model_len(policy)
    ok = prompt + requests.output_tokens.astype(np.int64) <= limit if limit else np.ones(prompt.shape, bool)
    if limit and policy.caps_long_requests:
        ok = prompt < limit
    if cap:
        return int(cap)
    if not ok.any():
        return 2
    top = np.sort(prompt[ok])[::-1][:max(policy_max_seqs(policy, 1), 1)]
    return int(max(top[0], min(int(top.sum()), 16384)))


def _max_model_len(policy) -> int | None:
    """The longest request (prompt + output) the policy accepts; None: no limit it declares."""
    return None if policy.budget is None else policy.budget.max_model_len


def policy_max_seqs(policy, default: int) -> int:
    """The policy's ``max_num_seqs``, or ``default`` when it declares none."""
    return default if policy.max_num_seqs is None else int(policy.max_num_seqs)


def warm_rows(policy) -> int:
    """Most engine rows of one step: the policy's ``max_num_seqs`` (256 when it declares
    none), times ``1 + k`` under speculative decoding (a verification of ``1 + k`` tokens
    runs as that many decode rows)."""
    spec = policy.speculative
    return policy_max_seqs(policy, 256) * (1 + (spec.num_speculative_tokens if spec is not None else 0))
