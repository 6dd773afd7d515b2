"""Shared by the LLM policy tests: a tiny exact cost model and request builders."""

from __future__ import annotations

import numpy as np

from schedsim.core.policy import Requests
from schedsim.cost.protocols import StepCost
from schedsim.traces.table import Trace


class LinearCost(StepCost):
    """A step costs a + b*tokens + c*context, in integer ns: exact, so repeated decode
    runs equal step-by-step ones bit for bit."""

    def __init__(self, a=1_000_000, b=10_000, c=100):
        self.a, self.b, self.c = a, b, c

    def step_ns(self, num_tokens, context, swap_blocks=0):
        return self.a + self.b * int(num_tokens.sum()) + self.c * int(context.sum()) + 1000 * swap_blocks

    def decode_run_ns(self, context, k):
        n = context.size
        return self.a + self.b * n + self.c * (int(context.sum()) + n * np.arange(k, dtype=np.int64))


def llm_requests(arrival_s, prompt, output, hash_ids=None, hash_block_tokens=512, priority=None) -> Requests:
    trace = Trace.from_arrivals(arrival_s, input_tokens=prompt, output_tokens=output)
    req = Requests.from_trace(trace)
    if priority is not None:
        req.priority[:] = priority
    if hash_ids is not None:
        offsets = np.concatenate([[0], np.cumsum([len(h) for h in hash_ids])]).astype(np.int64)
        flat = np.array([x for h in hash_ids for x in h], dtype=np.int64)
        req = Requests(req.arrival_ns, req.samples, req.seq_len, req.priority, req.timeout_ns,
                       req.input_tokens, req.output_tokens, offsets, flat, hash_block_tokens)
    return req


def step_log(step) -> list[tuple]:
    """A step as [(row, tokens, context, emits), ...] for golden comparisons."""
    return [(int(r), int(n), int(c), bool(e))
            for r, n, c, e in zip(step.rows, step.num_tokens, step.context, step.emits)]


class OneStepAtATime:
    """The same policy with every step's repeat forced to 1 and no decode run after it
    (what a live engine runs)."""

    def __init__(self, policy):
        self.inner = policy
        self.holds_responses = getattr(policy, "holds_responses", False)
        self.kv_blocks_total = policy.kv_blocks_total

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def schedule(self, now_ns):
        step = self.inner.schedule(now_ns)
        step.repeat = 1
        step.then = None
        return step
