"""The live LLM driver (schedsim.live.llm_driver) on llama-tiny, CPU float32: the GPU run's code path.

Every request arrives at t=0 in the driver tests, so all are delivered before the first
step and the policy's decisions (admissions, preemptions, swaps) do not depend on how
fast the CPU is. The generated tokens are checked against a dense greedy decode of the
same prompt on :class:`~schedsim.live.engines.decoder.Decoder` with its contiguous KVCache.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from schedsim.live.engines.decoder import KVCache, build_decoder  # noqa: E402
from schedsim.live.engines.llm_engine import PagedLLMEngine  # noqa: E402
from schedsim.live.llm_driver import run_live_llm  # noqa: E402
from schedsim.core.llm_metrics import summarize_llm  # noqa: E402
from schedsim.registry import build_policy  # noqa: E402
from schedsim.core.results import COMPLETED, FAILED  # noqa: E402
from live_llm_helpers import BS, CASES  # noqa: E402
from llm_helpers import llm_requests  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
STEPS = ROOT / "tests" / "data" / "llm_steps_synthetic.csv"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)   # the tiny model: more threads only contend
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def model():
    return build_decoder("llama-tiny", "cpu", torch.float32, seed=0)


def burst(n=12, seed=0, prompt=(10, 70), output=(3, 25)):
    rng = np.random.default_rng(seed)
    return llm_requests(np.zeros(n), rng.integers(*prompt, n), rng.integers(*output, n))


def live(model, requests, policy_name, num_blocks=64, **params):
    params = {"block_size": BS, "num_gpu_blocks": num_blocks} | params
    policy = build_policy(policy_name, params)
    with PagedLLMEngine("llama-tiny", max(num_blocks, 2), BS, "cpu", torch.float32, model=model,
                        max_context=256) as eng:
        result, extra = run_live_llm(requests, policy, eng, keep_tokens=True, start_delay_s=0.0)
    return result, extra


def dense_greedy(model, prompt, n) -> list[int]:
    cache = KVCache(model.cfg, 1, dtype=torch.float32)
    out, pos = [], 0
    ids = torch.as_tensor(np.asarray(prompt, np.int64))[None]
    with torch.no_grad():
        for _ in range(n):
            logits = model(ids, cache, start=pos)[0]
            pos += ids.shape[1]
            out.append(int(logits.argmax()))
            ids = torch.tensor([[out[-1]]])
    return out


def assert_greedy(model, requests, tokens, row):
    p, o = int(requests.input_tokens[row]), int(requests.output_tokens[row])
    seq = tokens.tokens(row)
    assert seq.size >= p + o
    assert seq[p:p + o].tolist() == dense_greedy(model, seq[:p], o), f"row {row}"


@pytest.mark.parametrize("case", list(CASES))
def test_every_request_gets_its_tokens_and_they_are_the_dense_greedy_ones(model, case):
    name, params = CASES[case]
    req = burst()
    result, extra = live(model, req, name, **params)
    assert not extra["partial"] and extra["failed_steps"] == 0
    assert (result.status == COMPLETED).all()
    np.testing.assert_array_equal(result.tokens_out, req.output_tokens)
    tokens = extra["tokens"]
    for r in range(len(req)):
        assert tokens.length[r] >= req.input_tokens[r] + req.output_tokens[r]
    rows = {0}
    if case.startswith("paged-recompute"):
        pre = np.flatnonzero(result.preemptions)
        assert pre.size, "the small KV budget must preempt"
        assert extra["swaps"]["out_blocks"] == 0
        rows.add(int(pre[0]))
    if case == "paged-swap":
        assert extra["swapped_rows"], "the small KV budget must swap"
        assert extra["swaps"]["out_blocks"] == extra["swaps"]["in_blocks"] > 0
        rows.add(extra["swapped_rows"][0])
    if case == "static":   # padding rows ran past their output (in blocks of their own where they fit)
        rows.add(int(np.argmin(req.output_tokens)))
    for r in sorted(rows):
        assert_greedy(model, req, tokens, r)
    s = summarize_llm(result)
    assert s["completed"] == len(req) and s["ttft_p50_ms"] > 0
    assert len(extra["steps"]["gpu_ms"]) == result.step_start_ns.size
    assert (result.step_repeats == 1).all()


@pytest.mark.parametrize("params", [
    dict(scheduling_policy="priority"),                              # priority order and victims
    dict(scheduling_policy="priority", scheduler_reserve_full_isl=False),
    dict(vllm_compat="0.8"),
])
def test_the_live_engine_runs_the_policy_decisions_the_simulator_makes(model, params):
    """Priority scheduling and whole-prompt admission come from the policy object: with
    every request delivered before the first step, the live run takes the simulator's steps,
    step for step, and each request gets its dense greedy tokens."""
    from schedsim.core.llm_simulate import simulate_llm
    from llm_helpers import LinearCost, OneStepAtATime

    rng = np.random.default_rng(4)
    n = 12
    req = llm_requests(np.zeros(n), rng.integers(10, 70, n), rng.integers(3, 25, n), priority=rng.integers(0, 3, n))
    params = dict(block_size=BS, num_gpu_blocks=24, max_num_seqs=8, max_num_batched_tokens=96) | params
    result, extra = live(model, req, "paged-kv", num_blocks=24, **params)
    sim = simulate_llm(req, OneStepAtATime(build_policy("paged-kv", params)), LinearCost())
    assert (result.status == COMPLETED).all() and (sim.status == COMPLETED).all()
    for name in ("step_seqs", "step_tokens", "step_prefill_tokens", "step_preempted", "step_kv_blocks"):
        np.testing.assert_array_equal(getattr(result, name), getattr(sim, name), err_msg=name)
    np.testing.assert_array_equal(result.preemptions, sim.preemptions)
    assert result.preemptions.sum() > 0, "the small KV budget must preempt"
    if params.get("scheduling_policy") == "priority":   # the one most urgent request is never the victim
        assert (req.priority == 0).sum() == 1 and result.preemptions[req.priority == 0].sum() == 0
    for r in (0, int(np.flatnonzero(result.preemptions)[0])):
        assert_greedy(model, req, extra["tokens"], r)


@pytest.mark.parametrize("params", [
    dict(scheduling_policy="priority"),                              # whole-prompt admission (current)
    dict(scheduling_policy="priority", scheduler_reserve_full_isl=False),
    dict(scheduler_reserve_full_isl=True, enable_prefix_caching=False),
    dict(scheduling_policy="priority", enable_chunked_prefill=False, max_num_batched_tokens=None),
])
def test_live_and_simulated_steps_are_the_same_rows_tokens_and_contexts(model, params):
    """Step compositions, row by row: the same policy object makes the same decisions live
    as in the simulator (priority order and victims, whole-prompt admission, unchunked
    prompts), given the same arrivals."""
    from schedsim.core.llm_simulate import simulate_llm
    from llm_helpers import LinearCost, OneStepAtATime, step_log

    class Recorder(OneStepAtATime):
        def __init__(self, policy):
            super().__init__(policy)
            self.log = []

        def schedule(self, now_ns):
            step = super().schedule(now_ns)
            if len(step):
                self.log.append(step_log(step) + [("preempted", step.preempted.tolist())])
            return step

    rng = np.random.default_rng(7)
    n = 14
    req = llm_requests(np.zeros(n), rng.integers(10, 90, n), rng.integers(3, 25, n), priority=rng.integers(0, 4, n))
    params = dict(block_size=BS, num_gpu_blocks=24, max_num_seqs=8, max_num_batched_tokens=96, max_model_len=256) | params
    params = {k: v for k, v in params.items() if v is not None}
    live_policy = Recorder(build_policy("paged-kv", params))
    with PagedLLMEngine("llama-tiny", 24, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        result, _ = run_live_llm(req, live_policy, eng, start_delay_s=0.0)
    sim_policy = Recorder(build_policy("paged-kv", params))
    sim = simulate_llm(req, sim_policy, LinearCost())
    assert (result.status == COMPLETED).all() and (sim.status == COMPLETED).all()
    assert live_policy.log == sim_policy.log
    assert sum(len(p) for *_, (_, p) in live_policy.log) > 0, "the small KV budget must preempt"


def test_prefix_caching_shares_prompt_tokens_and_hits(model):
    # Two prompts of one shared 16-token hash block (hash_block_tokens=16), the second later.
    req = llm_requests([0.0, 0.0, 0.3], [40, 40, 40], [4, 4, 4], hash_ids=[[7, 8, 9], [7, 5, 6], [7, 8, 9]],
                       hash_block_tokens=16)
    result, extra = live(model, req, "paged-kv", num_blocks=40, enable_prefix_caching=True)
    tokens = extra["tokens"]
    assert tokens.tokens(0)[:16].tolist() == tokens.tokens(1)[:16].tolist()
    assert tokens.tokens(0)[:40].tolist() == tokens.tokens(2)[:40].tolist()
    assert tokens.tokens(0)[16:32].tolist() != tokens.tokens(1)[16:32].tolist()
    assert result.prefix_hit_tokens[2] >= 32
    assert (result.status == COMPLETED).all()
    assert_greedy(model, req, tokens, 2)   # computed over another request's cached blocks


def test_time_limit_ends_the_run_partial(model):
    req = llm_requests(np.linspace(0, 5, 40), np.full(40, 20), np.full(40, 4))
    policy = build_policy("paged-kv", {"block_size": BS, "num_gpu_blocks": 40})
    with PagedLLMEngine("llama-tiny", 40, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        result, extra = run_live_llm(req, policy, eng, time_limit_s=0.4)
    assert extra["partial"] and extra["partial_reason"] == "time limit"
    assert 0 < len(result.requests) < len(req)
    assert result.status.shape[0] == len(result.requests)
    assert summarize_llm(result)["completed"] >= 1


def test_stop_event_ends_the_run(model):
    req = llm_requests(np.linspace(0, 30, 20), np.full(20, 20), np.full(20, 4))
    policy = build_policy("continuous", {"block_size": BS, "num_gpu_blocks": 40, "reservation": "oracle"})
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with PagedLLMEngine("llama-tiny", 40, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        result, extra = run_live_llm(req, policy, eng, stop=stop)
    assert extra["partial"] and extra["partial_reason"] == "stopped"


class Flaky:
    """The engine, failing its third step."""

    def __init__(self, eng):
        self.eng, self.calls = eng, 0

    def __getattr__(self, name):
        return getattr(self.eng, name)

    def execute(self, rows):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.eng.execute(rows)


def test_an_engine_error_fails_the_steps_requests_and_the_run_goes_on(model):
    req = burst(n=10)
    policy = build_policy("paged-kv", {"block_size": BS, "num_gpu_blocks": 64, "max_num_seqs": 3})
    with PagedLLMEngine("llama-tiny", 64, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        flaky = Flaky(eng)
        result, extra = run_live_llm(req, policy, flaky, engine_warmup=False)
    assert extra["failed_steps"] == 1
    assert "illegal memory access" in extra["failures"][0]["error"]
    failed = np.flatnonzero(result.status == FAILED)
    assert failed.size and set(failed.tolist()) == set(extra["failures"][0]["rows"])
    assert (result.status[result.status != FAILED] == COMPLETED).all()
    s = summarize_llm(result)
    assert s["failed"] == failed.size and s["completed"] == len(req) - failed.size


class Spy:
    """The engine, keeping every step's rows (tokens, context, block table)."""

    def __init__(self, eng):
        self.eng, self.steps = eng, []

    def __getattr__(self, name):
        return getattr(self.eng, name)

    def execute(self, rows):
        self.steps.append([(len(r.tokens), int(r.context), list(r.block_table)) for r in rows])
        return self.eng.execute(rows)


def test_static_padding_rows_decode_over_their_own_blocks_until_the_batch_ends(model):
    # reservation max: every member reserves max_model_len tokens, so a padding row (a done
    # member still computed) always has room for blocks of its own, as the simulator prices it.
    req = burst(n=8, output=(2, 30))
    policy = build_policy("llm-static", {"block_size": BS, "num_gpu_blocks": 60, "batch_size": 4,
                                         "reservation": "max", "max_model_len": 120})
    with PagedLLMEngine("llama-tiny", 60, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        spy = Spy(eng)
        result, extra = run_live_llm(req, policy, spy, engine_warmup=False, keep_tokens=True)
    assert (result.status == COMPLETED).all() and extra["padding_null_writes"] == 0
    limit = req.input_tokens + req.output_tokens
    for step in spy.steps:
        owner = {}
        for i, (n, c, table) in enumerate(step):
            used = table[:-(-(c + n) // BS)]
            assert 0 not in used, "a row reads or writes the null block"
            for b in used:
                assert owner.setdefault(b, i) == i, "two rows of a step share a block"
    # Rows decoding past their own tokens (padding) ran, with their contexts growing.
    stepped = extra["tokens"]
    padding = sum(int(stepped.length[r]) > int(limit[r]) for r in range(len(req)))
    assert padding > 0
    for r in range(len(req)):
        assert_greedy(model, req, stepped, r)


def test_static_padding_falls_back_to_the_null_block_when_the_pool_is_full(model):
    # oracle reservations hold exactly prompt + output (8, 8, 8 and 13 blocks of 8 tokens):
    # the three short members' padding finds no free block past their own.
    req = llm_requests(np.zeros(4), np.full(4, 60), np.array([2, 2, 2, 40]))
    policy = build_policy("llm-static", {"block_size": BS, "num_gpu_blocks": 38, "batch_size": 4,
                                         "reservation": "oracle"})
    with PagedLLMEngine("llama-tiny", 38, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        result, extra = run_live_llm(req, policy, eng, engine_warmup=False, keep_tokens=True)
    assert (result.status == COMPLETED).all() and extra["failed_steps"] == 0
    assert extra["padding_null_writes"] > 0
    assert_greedy(model, req, extra["tokens"], 3)


def test_step_log_records_each_steps_composition(model):
    from schedsim.live.llm_driver import STEP_COLUMNS, composition

    assert composition([5, 1, 1, 3], [0, 7, 20, 4]) == (4, 10, 2, 8, 5 * 0 + 15 + 3 * 4 + 6, 4, 2, 20, 8 + 21)
    assert composition([1], [3]) == (1, 1, 0, 0, 0, 0, 1, 3, 4)
    assert composition([4], [0])[-2:] == (-1, 0)
    name, params = CASES["paged-recompute"]
    req = burst()
    result, extra = live(model, req, name, **params)
    steps = extra["steps"]
    assert set(STEP_COLUMNS) <= set(steps)
    n = result.step_start_ns.size
    np.testing.assert_array_equal(np.asarray(steps["n_rows"]), result.step_seqs)
    np.testing.assert_array_equal(np.asarray(steps["tokens"]), result.step_tokens)
    np.testing.assert_array_equal(np.asarray(steps["prefill_tokens"]), result.step_prefill_tokens)
    dec = np.asarray(steps["decode_rows"])
    np.testing.assert_array_equal(np.asarray(steps["prefill_rows"]) + dec, result.step_seqs)
    assert ((np.asarray(steps["decode_max_context"]) >= 0) == (dec > 0)).all()
    kv = np.asarray(steps["decode_kv_tokens"])
    assert ((kv > 0) == (dec > 0)).all() and (kv <= dec * (np.asarray(steps["decode_max_context"]) + 1)).all()
    assert (kv >= dec).all()
    assert len(steps["prefill_attention"]) == n and (np.asarray(steps["prefill_attention"]) >= 0).all()


def test_warm_up_runs_eager_shapes_and_leaves_every_block_but_the_null_one_alone(model):
    from schedsim.live.llm_warmup import prefill_lengths, warm_up

    assert prefill_lengths(100) == [100, 96, 81, 64, 48, 41, 32, 24, 21, 16, 9, 5, 2]
    assert prefill_lengths(3) == [3, 2]
    with PagedLLMEngine("llama-tiny", 40, BS, "cpu", torch.float32, model=model, max_context=256) as eng:
        torch.manual_seed(0)
        eng.kv.copy_(torch.randn_like(eng.kv))
        before = eng.kv[:, :, 1:].clone()
        spy = Spy(eng)
        info = warm_up(spy, max_seqs=8, max_context=200, prefill_tokens=300)
        assert torch.equal(eng.kv[:, :, 1:], before)
    assert info["warmup_eager_steps"] == len(spy.steps) - 1 and info["warmup_eager_s"] > 0
    sizes = sorted({sum(n for n, _, _ in step) for step in spy.steps})
    assert sizes[-1] >= 300 and {16, 32, 64, 128, 256} <= set(sizes)
    assert set(range(16, 200 + 1, 16)) <= set(sizes)    # the dense sweep, up to the context
    assert any(c > 0 and n > 1 for step in spy.steps for n, c, _ in step), "a chunk over cached context"
    assert any(len({n > 1 for n, _, _ in step}) == 2 for step in spy.steps), "a mixed step"
    assert all(n + c <= 200 for step in spy.steps for n, c, _ in step)
    assert all(b == 0 for step in spy.steps for _, _, t in step for b in t)


def test_block_size_mismatch_is_refused(model):
    policy = build_policy("paged-kv", {"block_size": 16, "num_gpu_blocks": 20})
    with PagedLLMEngine("llama-tiny", 20, BS, "cpu", torch.float32, model=model) as eng:
        with pytest.raises(ValueError, match="block size"):
            run_live_llm(burst(n=2), policy, eng)


# --- the CLI: schedsim live --backend torch-llm, then schedsim validate against schedsim run -------

@pytest.fixture(scope="module")
def token_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("llmlive") / "tokens.csv"
    rows = ["arrival_s,input_tokens,output_tokens"]
    rows += [f"{i * 0.02:.3f},{20 + 13 * (i % 9)},{3 + 2 * (i % 7)}" for i in range(30)]
    path.write_text("\n".join(rows) + "\n")
    return path


FLAGS = ["--num-gpu-blocks", "40", "--block-size", "16", "--max-num-seqs", "8"]


def test_cli_live_then_validate_against_run(tmp_path, token_trace):
    from cli_helpers import schedsim

    live_dir, sim_dir = tmp_path / "live", tmp_path / "sim"
    proc = schedsim("live", token_trace, "--policy", "paged-kv", "--backend", "torch-llm", "--model",
                    "builtin:llama-tiny", "--device", "cpu", *FLAGS, "--out", live_dir)
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout and "engine per step" in proc.stdout
    for name in ("requests.csv", "steps.csv", "summary.json", "live_steps.csv", "live.json"):
        assert (live_dir / name).stat().st_size > 0
    summary = json.loads((live_dir / "summary.json").read_text())
    assert summary["completed"] == 30 and summary["partial"] is False
    assert summary["config"]["driver"] == "live" and summary["config"]["backend"] == "torch-llm"
    # The live engine does not overlap steps: it says which prediction matches it.
    assert any("--no-async-scheduling" in w for w in summary["warnings"])
    assert summary["live"]["engine_ms"]["n"] == summary["steps"]
    header = (live_dir / "requests.csv").read_text().splitlines()[0].replace('"', "")
    assert header.startswith("request_id,arrival_s,scheduled_s,first_token_s,end_s,ttft_ms,tpot_ms,e2e_ms")

    proc = schedsim("run", token_trace, "--policy", "paged-kv", "--profile", STEPS, *FLAGS, "--out", sim_dir)
    assert proc.returncode == 0, proc.stderr
    proc = schedsim("validate", "--sim", sim_dir, "--live", live_dir, "--plot")
    assert proc.returncode == 0, proc.stderr
    assert "TTFT p99" in proc.stdout and "KS statistics" in proc.stdout
    report = json.loads((live_dir / "validation.json").read_text())
    assert report["kind"] == "llm" and report["trace_requests"] == 30
    for key in ("ttft_p50_err_pct", "ttft_p99_err_pct", "tpot_p50_err_pct", "tpot_p99_err_pct",
                "e2e_p50_err_pct", "e2e_p99_err_pct", "throughput_err_pct", "preemptions_err_pct",
                "ks_stat_ttft", "ks_stat_e2e", "targets_met"):
        assert key in report
    assert (live_dir / "llm_cdf_validation.png").stat().st_size > 0
    # Both ran the current preset: the prediction overlaps host time, the live engine did not.
    assert summary["config"]["effective"]["async_scheduling"] is True
    assert report["notes"] == [n for n in report["notes"] if "async scheduling" in n] and report["notes"]
    assert "note: the prediction hides" in proc.stdout

    # Several live runs are one measurement, their median: here the live run twice and the
    # prediction itself as a third "run", so the medians are the live run's values and the
    # prediction lies inside every range.
    proc = schedsim("validate", "--sim", sim_dir, "--live", live_dir, "--live", sim_dir, "--live", live_dir,
                    "--out", tmp_path / "v3")
    assert proc.returncode == 0, proc.stderr
    assert "the median of 3 live runs" in proc.stdout
    pooled = json.loads((tmp_path / "v3" / "validation.json").read_text())
    assert pooled["live_runs"] == 3 and pooled["kind"] == "llm"
    for key in ("ttft_p99", "tpot_p50", "e2e_p50"):
        row, single = pooled["metrics"][key], report["metrics"][key]
        assert row["measured"] == pytest.approx(single["measured"]) and row["err_pct"] == pytest.approx(single["err_pct"])
        assert row["measured_runs"][1] == pytest.approx(single["predicted"]) and row["predicted_in_measured_range"]


def test_validation_notes_settings_the_two_runs_do_not_share():
    from schedsim.live.llm_validate import setting_notes

    sim = {"effective": {"policy": "paged-kv", "async_scheduling": True, "max_num_seqs": 8, "profile": "a.csv"}}
    live = {"effective": {"policy": "paged-kv", "async_scheduling": True, "max_num_seqs": 16, "overlap": False}}
    notes = setting_notes(sim, live)
    assert notes[0] == "max_num_seqs: 8 in the prediction, 16 in the live run"
    assert "--no-async-scheduling" in notes[1] and len(notes) == 2
    live["effective"] |= {"overlap": True, "max_num_seqs": 8}
    assert setting_notes(sim, live) == []
    assert setting_notes(sim, {}) == []   # a live run recorded before live summaries kept its settings


@pytest.mark.parametrize("args,needle", [
    (["--policy", "dynamic"], "needs an LLM policy"),
    (["--policy", "paged-kv", "--block-size", "16"], "give --num-gpu-blocks"),
    (["--policy", "paged-kv", "--model", "builtin:bert-base", *FLAGS], "serves builtin:llama-1b"),
    (["--policy", "paged-kv", "--model", "builtin:llama-1b", "--model-spec", "llama-3-8b", *FLAGS],
     "describe another model"),
])
def test_cli_bad_input_is_one_line_exit_2(tmp_path, token_trace, args, needle):
    from cli_helpers import assert_one_line_error, schedsim

    model = [] if "--model" in args else ["--model", "builtin:llama-tiny"]
    trace = token_trace
    if args[1] == "dynamic":
        trace = tmp_path / "plain.csv"
        trace.write_text("arrival_s\n0.0\n0.1\n")
    proc = schedsim("live", trace, "--backend", "torch-llm", *model, "--device", "cpu", *args,
                    "--out", tmp_path / "o")
    assert_one_line_error(proc, needle)


def test_cli_llm_policy_on_the_request_level_backend_is_refused(tmp_path, token_trace):
    from cli_helpers import assert_one_line_error, schedsim

    proc = schedsim("live", token_trace, "--policy", "paged-kv", "--backend", "torch", "--out", tmp_path / "o")
    assert_one_line_error(proc, "--backend torch-llm")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_graphs_generate_the_dense_greedy_tokens():
    model = build_decoder("llama-tiny", "cuda", torch.float32, seed=0)
    req = burst(n=16)
    policy = build_policy("paged-kv", {"block_size": BS, "num_gpu_blocks": 24, "max_num_seqs": 8,
                                       "max_num_batched_tokens": 96})
    with PagedLLMEngine("llama-tiny", 24, BS, "cuda", torch.float32, model=model, cuda_graphs=True,
                        max_context=256) as eng:
        result, extra = run_live_llm(req, policy, eng, keep_tokens=True)
    assert (result.status == COMPLETED).all() and extra["graph_steps"] > 0
    assert np.isfinite(np.asarray(extra["steps"]["gpu_ms"], float)).all()
    cpu = build_decoder("llama-tiny", "cpu", torch.float32, seed=0)
    for r in (0, int(np.argmax(result.preemptions))):
        assert_greedy(cpu, req, extra["tokens"], r)


def test_a_request_longer_than_the_model_runs_to_the_limit_live(model):
    """Current vLLM stops a request at max_model_len; the live run does too, and completes it
    with the tokens the policy allowed (the simulator's count)."""
    req = llm_requests([0.0, 0.0], [20, 12], [50, 6])
    result, extra = live(model, req, "paged-kv", num_blocks=40, max_model_len=40)
    assert (result.status == COMPLETED).all()
    assert result.tokens_out.tolist() == [20, 6]
    assert extra["tokens"].length[0] >= 40
    from schedsim.core.llm_simulate import simulate_llm
    from llm_helpers import LinearCost

    sim = simulate_llm(req, build_policy("paged-kv", {"block_size": BS, "num_gpu_blocks": 40, "max_model_len": 40}),
                       LinearCost())
    assert sim.tokens_out.tolist() == [20, 6] and sim.stats["length_capped"] == 1
