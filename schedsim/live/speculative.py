"""Draft proposers for speculative decoding in the live LLM engine.

The policy decides everything a speculative step is made of, as in the simulator
(:class:`~schedsim.core.llm_policy.SpeculativeConfig`, ``paged-kv``): which rows verify,
how many draft tokens each (``k``, fewer near ``max_model_len``), their KV slots, and how
many of the drafts are accepted, drawn from the config's seeded generator when the step is
formed. The live driver executes it: a proposer here writes the draft tokens, the target
engine computes all ``1 + d`` tokens of each verifying row in one step, and the row emits
its first ``t - 1`` draft tokens and then the target's greedy token after them, ``t`` being
the tokens the policy drew for it (the accepted drafts plus one).

Why acceptance is not decided by comparing tokens: the engines' weights are random, so a
draft model's greedy tokens almost never match the target's, and acceptance decided by
the tokens would be near zero whatever the config says. Following the policy's draws keeps
the live run's steps and token counts the simulator's, step for step, for the same trace
and seed, and the live engine still does all the work a real verification does (the
draft's forward passes, a target pass over ``1 + d`` tokens per row, KV written for every
draft, rejected drafts' slots overwritten by the next step: the policy keeps those blocks
and rolls its token count back, as vLLM does). The emitted tokens are a consistent
sequence: the accepted drafts are in the target's KV where they were verified, and the
last token of each step is the target's own prediction after them.

Two proposers:

- :class:`ModelProposer` (``draft_model``, ``eagle``, ``eagle3``, ``mtp``, ``medusa``): a
  small decoder (:data:`~schedsim.live.engines.decoder.DRAFT_MODELS`, one layer of the
  target's shape) on a paged engine of its own, reading and writing the target's block
  ids in its own pool. Per step it first catches up, in one row per request, on the tokens
  its KV lacks (the whole prompt the first time, then the accepted drafts and the target's
  token) and proposes the first draft, then one decode step per further draft. vLLM runs
  the proposer after the target's step, for the next one; here it runs before the step it
  drafts for (the policy allocates slots only for the step's own tokens), so the live
  draft time lands one step later than the simulator charges it.
- :class:`NgramProposer` (``ngram``, ``suffix``): prompt lookup on the host, as vLLM's
  ngram proposer: the tokens that followed the latest earlier occurrence of the
  request's last 3 (else 2, else 1) tokens; where nothing matches, the last token
  repeated. No model runs, as the simulator prices it (no draft cost).
"""

from __future__ import annotations

import numpy as np

from schedsim.live.engines.llm_rows import EngineRow

MODEL_METHODS = ("draft_model", "eagle", "eagle3", "mtp", "medusa")
"""Methods the live engine drafts for with a draft model."""
HOST_METHODS = ("ngram", "suffix")
"""Methods the live engine drafts for on the host (prompt lookup)."""


def proposer_for(spec, draft):
    """The proposer for ``spec`` (a :class:`~schedsim.core.llm_policy.SpeculativeConfig`, or
    None: no speculative decoding, None returned); ``draft`` is an entered draft engine,
    needed by the model methods."""
    if spec is None:
        return None
    if spec.method in HOST_METHODS:
        return NgramProposer()
    if draft is None:
        raise ValueError(f"speculative method {spec.method!r} drafts with a model: pass a draft engine "
                         "(schedsim.live.engines.llm_engine.draft_engine)")
    return ModelProposer(draft)


def verifying(rows: list, ntok: list, ctx: list, live: list, tokens) -> dict[int, int]:
    """Row index -> draft tokens of each row whose step computes past its known tokens."""
    out = {}
    for i in live:
        d = ctx[i] + ntok[i] - tokens.known(rows[i])
        if d > 0:
            out[i] = d
    return out


class ModelProposer:
    """Drafts with a model on its own paged engine; see the module docstring."""

    def __init__(self, engine):
        self.engine = engine
        self.steps = 0
        """Draft-engine steps run."""

    def propose(self, rows, ntok, ctx, live, tables, tokens, done: list) -> dict[int, np.ndarray]:
        """Draft tokens per verifying row index; ``done[r]``: tokens of ``r`` whose KV the
        draft has written (set here to what it writes; the driver lowers it to what the
        target accepted)."""
        need = verifying(rows, ntok, ctx, live, tokens)
        if not need:
            return {}
        out = {i: np.empty(d, np.int64) for i, d in need.items()}
        known = {i: tokens.known(rows[i]) for i in need}
        first = []
        for i in need:
            r, n = rows[i], known[i]
            s = min(done[r], n - 1)   # at least the last known token
            first.append(EngineRow(tokens.get(r, s, n - s), s, tables[i]))
            done[r] = n
        for i, tok in zip(need, self.engine.execute(first)):
            out[i][0] = tok
        self.steps += 1
        for j in range(1, max(need.values())):
            act = [i for i, d in need.items() if d > j]
            step = [EngineRow(out[i][j - 1:j], known[i] + j - 1, tables[i]) for i in act]
            for i, tok in zip(act, self.engine.execute(step)):
                out[i][j] = tok
                done[rows[i]] = known[i] + j
            self.steps += 1
        return out


class NgramProposer:
    """Prompt lookup on the host; see the module docstring."""

    steps = 0

    def propose(self, rows, ntok, ctx, live, tables, tokens, done: list) -> dict[int, np.ndarray]:
        return {i: lookup(tokens.tokens(rows[i]), d) for i, d in verifying(rows, ntok, ctx, live, tokens).items()}


def lookup(seq: np.ndarray, d: int, longest: int = 3) -> np.ndarray:
    """``d`` tokens that followed the latest earlier occurrence of the last ``longest``
    (down to 1) tokens of ``seq``, padded with the last token repeated."""
    out = np.full(d, seq[-1] if seq.size else 0, np.int64)
    for n in range(min(longest, seq.size - 1), 0, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            follow = seq[hits[-1] + n:hits[-1] + n + d]
            out[:follow.size] = follow
            return out
    return out
