"""Speculative decoding in the live LLM engine (schedsim.live.speculative, schedsim.live.llm_driver)
on llama-tiny with its one-layer draft, CPU float32.

Every request arrives at t=0, so the live run's decisions do not depend on the CPU's speed
and must be the simulator's, step for step, acceptance draws included. The tokens are
checked against dense greedy decodes: each step's last token is the target's prediction,
the accepted drafts before it are the draft model's."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from schedsim.core.llm_simulate import simulate_llm  # noqa: E402
from schedsim.core.results import COMPLETED  # noqa: E402
from schedsim.live.engines.decoder import DRAFT_MODELS  # noqa: E402
from schedsim.live.engines.llm_engine import PagedLLMEngine, draft_engine  # noqa: E402
from schedsim.live.llm_driver import run_live_llm  # noqa: E402
from schedsim.live.llm_warmup import engine_context  # noqa: E402
from schedsim.live.speculative import lookup  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from live_llm_helpers import BS, models, one_thread  # noqa: E402,F401  (fixtures)
from llm_helpers import LinearCost, OneStepAtATime, llm_requests  # noqa: E402



class Recorder:
    """The policy, its steps kept (what the driver executed)."""

    def __init__(self, policy):
        self.inner, self.steps = policy, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def schedule(self, now_ns):
        step = self.inner.schedule(now_ns)
        if len(step):
            self.steps.append(step)
        return step


def spec_params(method="draft_model", k=3, rate=0.6, **extra):
    config = {"method": method, "num_speculative_tokens": k, "acceptance_rate": rate, "seed": 5}
    return dict(block_size=BS, num_gpu_blocks=24, max_num_seqs=8, max_num_batched_tokens=96,
                speculative_config=json.dumps(config)) | extra


def burst(n=12, seed=4, priority=False):
    rng = np.random.default_rng(seed)
    return llm_requests(np.zeros(n), rng.integers(10, 70, n), rng.integers(3, 25, n),
                        priority=rng.integers(0, 3, n) if priority else None)


def run(models, req, params, overlap=False):
    target, draft_model = models
    policy = Recorder(build_policy("paged-kv", params))
    with PagedLLMEngine("llama-tiny", 24, BS, "cpu", torch.float32, model=target, max_context=256) as eng:
        draft = PagedLLMEngine(DRAFT_MODELS["llama-tiny"], 24, BS, "cpu", torch.float32, model=draft_model,
                               max_context=256)
        with draft:
            result, extra = run_live_llm(req, policy, eng, keep_tokens=True, start_delay_s=0.0,
                                         draft=draft, overlap=overlap)
    return result, extra, policy.steps


def greedy_next(model, seq) -> np.ndarray:
    """The model's greedy next token after every prefix of ``seq`` (dense, contiguous cache)."""
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(seq, np.int64))[None], all_logits=True)[0]
    return logits.argmax(-1).numpy()


def emitted_by_step(steps, r):
    """Tokens request ``r`` emitted in each step it emitted in."""
    out = []
    for st in steps:
        at = np.flatnonzero(st.rows == r)
        if at.size and st.emits[at[0]]:
            out.append(int(st.emit_tokens[at[0]]) if st.emit_tokens is not None else 1)
    return out


@pytest.mark.parametrize("params", [
    spec_params(),                                                   # recompute preemptions under KV pressure
    spec_params(k=2, rate=0.9, scheduling_policy="priority"),
    spec_params(k=4, rate=0.5, scheduler_reserve_full_isl=False, vllm_compat="0.10"),
])
def test_live_speculative_steps_are_the_simulators_and_tokens_add_up(models, params):
    req = burst(priority=params.get("scheduling_policy") == "priority")
    result, extra, steps = run(models, req, params)
    sim = simulate_llm(req, OneStepAtATime(build_policy("paged-kv", params)), LinearCost())
    assert not extra["partial"] and extra["failed_steps"] == 0
    assert (result.status == COMPLETED).all() and (sim.status == COMPLETED).all()
    np.testing.assert_array_equal(result.tokens_out, req.output_tokens)   # exact token accounting
    for name in ("step_seqs", "step_tokens", "step_prefill_tokens", "step_preempted", "step_kv_blocks"):
        np.testing.assert_array_equal(getattr(result, name), getattr(sim, name), err_msg=name)
    np.testing.assert_array_equal(result.preemptions, sim.preemptions)
    for key in ("spec_draft_tokens", "spec_accepted_tokens"):
        assert result.stats[key] == sim.stats[key] > 0, key
    assert extra["draft_steps"] > 0 and extra["draft_ms"]["n"] > 0
    # A step emits its accepted drafts then one token: ITL has one gap per emitting step.
    assert result.itl_ns.size == sum(len(emitted_by_step(steps, r)) - 1 for r in range(len(req)))
    assert any(max(emitted_by_step(steps, r)) > 1 for r in range(len(req)))
    # Each step's last token is the target's greedy token after what came before; the accepted
    # drafts before it are the draft model's greedy tokens (its KV kept in step, preemptions too).
    target, draft = models
    tokens = extra["tokens"]
    for r in range(len(req)):
        p, o = int(req.input_tokens[r]), int(req.output_tokens[r])
        seq = tokens.tokens(r)[:p + o]
        want_t, want_d = greedy_next(target, seq), greedy_next(draft, seq)
        at = p
        for t in emitted_by_step(steps, r):
            for j in range(t - 1):
                assert seq[at + j] == want_d[at + j - 1], (r, at + j)
            assert seq[at + t - 1] == want_t[at + t - 2], (r, at + t - 1)
            at += t
        assert at == p + o


def test_ngram_drafts_on_the_host_with_the_simulators_steps(models):
    params = spec_params(method="ngram", k=3, rate=0.7)
    req = burst(n=8, seed=9)
    result, extra, _ = run(models, req, params)
    sim = simulate_llm(req, OneStepAtATime(build_policy("paged-kv", params)), LinearCost())
    np.testing.assert_array_equal(result.tokens_out, req.output_tokens)
    for name in ("step_seqs", "step_tokens", "step_kv_blocks"):
        np.testing.assert_array_equal(getattr(result, name), getattr(sim, name), err_msg=name)
    assert result.stats["spec_accepted_tokens"] == sim.stats["spec_accepted_tokens"] > 0
    assert extra["draft_steps"] == 0   # no model ran


def test_prompt_lookup_copies_what_followed_the_latest_match():
    seq = np.array([5, 6, 7, 9, 9, 5, 6, 7, 1, 2, 5, 6, 7])
    np.testing.assert_array_equal(lookup(seq, 3), [1, 2, 5])          # the later "5 6 7"
    np.testing.assert_array_equal(lookup(seq, 6), [1, 2, 5, 6, 7, 7])  # padded with the last token
    np.testing.assert_array_equal(lookup(np.array([3, 4, 8]), 2), [8, 8])   # no match
    np.testing.assert_array_equal(lookup(np.array([4, 1, 4]), 2), [1, 4])   # a one-token match


def test_a_model_method_needs_a_draft_engine_and_the_context_covers_the_drafts(models):
    params = spec_params(k=3)
    req = burst(n=3)
    policy = build_policy("paged-kv", params)
    with PagedLLMEngine("llama-tiny", 24, BS, "cpu", torch.float32, model=models[0], max_context=256) as eng:
        with pytest.raises(ValueError, match="draft engine"):
            run_live_llm(req, policy, eng, engine_warmup=False)
        d = draft_engine(eng)
        assert d.name == "llama-tiny-draft" and d.num_blocks == eng.num_blocks and d.seed == eng.seed + 1
    plain = build_policy("paged-kv", {k: v for k, v in params.items() if k != "speculative_config"})
    assert engine_context(req, policy) == engine_context(req, plain) + 3


@pytest.mark.parametrize("method,draft", [("draft_model", "builtin:llama-tiny-draft"), ("ngram", None)])
def test_cli_live_runs_speculative_decoding(tmp_path, method, draft):
    """``schedsim live --speculative-config``: the draft model beside the target (none for
    ngram), every request complete, the policy's drafted and accepted counts in the summary."""
    from cli_helpers import schedsim

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n"
                     + "".join(f"{i * 0.02:.3f},{20 + 13 * (i % 9)},{3 + 2 * (i % 7)}\n" for i in range(20)))
    config = json.dumps({"method": method, "num_speculative_tokens": 3, "acceptance_rate": 0.7})
    proc = schedsim("live", trace, "--policy", "paged-kv", "--backend", "torch-llm", "--model", "builtin:llama-tiny",
                    "--device", "cpu", "--num-gpu-blocks", "40", "--block-size", "16", "--max-num-seqs", "8",
                    "--speculative-config", config, "--out", tmp_path / "live")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert summary["completed"] == 20 and summary["config"]["draft_model"] == draft
    stats = summary["config"]["policy_stats"]
    assert stats["spec_draft_tokens"] > stats["spec_accepted_tokens"] > 0
    assert (summary["live"]["draft_steps"] > 0) == (draft is not None)
    live = json.loads((tmp_path / "live" / "live.json").read_text())
    assert (live["engine"].get("draft", {}).get("model")) == draft
