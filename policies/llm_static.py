"""LLM ``static``: request-level batching of generation (FasterTransformer-style).

When the engine is idle, up to ``batch_size`` of the earliest waiting requests form a
batch, as many as their KV reservations (``reservation``, as in ``continuous``) fit.
The batch runs every prompt in one prefill step, then decode steps until its longest
request has all its tokens. Nobody joins and nobody leaves early: a request that is done
keeps its slot as padding (it is computed but emits nothing) and every member is
answered when the batch ends.
"""

from __future__ import annotations

from policies.continuous import ReservingPolicy
from policies.llm_common import make_step, rejects
from schedsim.errors import InputError
from schedsim.core.llm_policy import Step


class StaticLLM(ReservingPolicy):
    name = "static"
    holds_responses = True
    """The driver answers a batch's members together, when its last one finishes."""

    def __init__(self, batch_size: int = 8, **kwargs):
        if int(batch_size) < 1:
            raise InputError(f"--batch-size: {batch_size} is not valid; expected an integer >= 1")
        kwargs.setdefault("max_num_seqs", int(batch_size))
        super().__init__(**kwargs)
        self.batch_size = int(batch_size)

    def schedule(self, now_ns: int) -> Step:
        p = self.p
        if not self.running:
            while (self.waiting and len(self.running) < self.batch_size
                   and self._admit(self.waiting[0])):
                self.running.append(self.waiting.popleft())
            rows = list(self.running)
            step = make_step(rows, [p.prompt[r] for r in rows], [0] * len(rows), [True] * len(rows),
                             rejects=rejects(self.too_long), kv_blocks_used=self.reserved_blocks,
                             waiting=len(self.waiting))
        else:
            rows = self.running
            active = [p.generated[r] < p.output[r] for r in rows]
            repeat = max(min(p.output[r] - p.generated[r] for r, a in zip(rows, active) if a), 1)
            step = make_step(rows, [1] * len(rows), [p.computed[r] for r in rows], active,
                             repeat=repeat, rejects=rejects(self.too_long),
                             kv_blocks_used=self.reserved_blocks, waiting=len(self.waiting))
        self.too_long = []
        return step

    def on_step_done(self, now_ns: int, step: Step, repeats: int) -> None:
        p = self.p
        for r, n, e in zip(step.rows.tolist(), step.num_tokens.tolist(), step.emits.tolist()):
            p.computed[r] += n if repeats == 1 else repeats
            if e:
                p.generated[r] += repeats
        if all(p.generated[r] >= p.output[r] for r in self.running):
            for r in self.running:
                self._release(r)
            self.running = []
