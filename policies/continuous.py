"""``continuous``: Orca's iteration-level scheduling with a per-request KV reservation.

Every iteration runs one decode token for each running request and admits waiting
requests in arrival order (strict FCFS, up to ``max_num_seqs``) while their
reservations fit in the KV memory; an admitted request's whole prompt runs in its first
iteration. Nothing is preempted: a reservation holds until its request finishes.

Reservation modes (the vLLM paper's baselines, section 6.1):
``max``     the model's maximum length (``max_model_len``): what a real Orca reserves;
``pow2``    prompt + the next power of two at or above the true output length;
``oracle``  prompt + the true output length (a bound no real server reaches).

Memory is counted in the same blocks as ``paged-kv`` (a reservation rounds up to whole
blocks), so both policies given the same flags manage the same budget.
"""

from __future__ import annotations

from policies.llm_common import Progress, Waiting, check_token_columns, make_step, rejects
from schedsim.errors import InputError
from schedsim.core.llm_policy import LLMPolicy, Step, kv_budget

RESERVATIONS = ("max", "pow2", "oracle")


def reservation_tokens(mode: str, prompt: int, output: int, max_model_len: int) -> int:
    if mode == "max":
        return max_model_len
    if mode == "pow2":
        return prompt + (1 << (output - 1).bit_length())
    return prompt + output


class ReservingPolicy(LLMPolicy):
    """Shared by ``continuous`` and LLM ``static``: reservations against a KV budget."""

    def __init__(self, reservation: str = "max", model_spec: str = "llama-1b", block_size: int = 16,
                 num_gpu_blocks: int | None = None, gpu_memory_gb: float | None = None,
                 gpu_memory_utilization: float = 0.9, max_num_seqs: int = 256,
                 max_model_len: int | None = None):
        if reservation not in RESERVATIONS:
            raise InputError(f"--reservation: {reservation!r} is not valid; expected max, pow2 or oracle")
        if int(max_num_seqs) < 1:
            raise InputError(f"--max-num-seqs: {max_num_seqs} is not valid; expected an integer >= 1")
        self.budget = kv_budget(model_spec, block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                gpu_memory_gb=gpu_memory_gb,
                                gpu_memory_utilization=gpu_memory_utilization,
                                max_num_seqs=max_num_seqs, max_model_len=max_model_len)
        self.reservation = reservation
        self.block_size = int(block_size)
        self.max_num_seqs = int(max_num_seqs)
        self.kv_blocks_total = self.budget.num_blocks - 1

    def reset(self, requests) -> None:
        super().reset(requests)
        check_token_columns(requests, self.name)
        self.p = Progress(requests)
        self.waiting = Waiting()
        self.running: list[int] = []
        self.reserved_blocks = 0
        self.held: dict[int, int] = {}
        self.too_long: list[int] = []
        self.max_len = self.budget.max_model_len

    def on_arrivals(self, now_ns: int, first: int, stop: int) -> None:
        prompt, output, bs = self.p.prompt, self.p.output, self.block_size
        for r in range(first, stop):
            blocks = -(-reservation_tokens(self.reservation, prompt[r], output[r], self.max_len) // bs)
            if prompt[r] + output[r] > self.max_len or blocks > self.kv_blocks_total:
                self.too_long.append(r)
            else:
                self.waiting.append(r)

    def _admit(self, r: int) -> bool:
        """Reserve for ``r`` if its reservation fits (FCFS: the caller stops at the first that does not)."""
        p = self.p
        blocks = -(-reservation_tokens(self.reservation, p.prompt[r], p.output[r], self.max_len)
                   // self.block_size)
        if self.reserved_blocks + blocks > self.kv_blocks_total:
            return False
        self.reserved_blocks += blocks
        self.held[r] = blocks
        return True

    def _release(self, r: int) -> None:
        self.reserved_blocks -= self.held.pop(r)

    def stats(self) -> dict:
        return {"preemptions": 0, "kv_blocks_total": self.kv_blocks_total, "block_size": self.block_size,
                "reservation": self.reservation, "kv_budget": self.budget.describe()}


class Continuous(ReservingPolicy):
    name = "continuous"

    def schedule(self, now_ns: int) -> Step:
        p = self.p
        rows = list(self.running)
        ntok = [1] * len(rows)
        ctx = [p.computed[r] for r in rows]
        emit = [True] * len(rows)
        admitted = False
        while self.waiting and len(self.running) < self.max_num_seqs and self._admit(self.waiting[0]):
            r = self.waiting.popleft()
            self.running.append(r)
            rows.append(r); ntok.append(p.prompt[r]); ctx.append(0); emit.append(True)
            admitted = True
        repeat = 1
        if rows and not admitted:
            repeat = max(min(p.output[r] - p.generated[r] for r in rows), 1)
        step = make_step(rows, ntok, ctx, emit, repeat=repeat, rejects=rejects(self.too_long),
                         kv_blocks_used=self.reserved_blocks, waiting=len(self.waiting))
        self.too_long = []
        return step

    def on_step_done(self, now_ns: int, step: Step, repeats: int) -> None:
        p = self.p
        finished = False
        for r, n in zip(step.rows.tolist(), step.num_tokens.tolist()):
            p.computed[r] += n if repeats == 1 else repeats
            p.generated[r] += repeats
            if p.generated[r] >= p.output[r]:
                self._release(r)
                finished = True
        if finished:
            self.running = [r for r in self.running if r in self.held]
