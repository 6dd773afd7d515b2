"""The paged-KV engine against the dense decoder with its static KVCache (CPU, float32).

Every comparison feeds the same tokens to both: the dense :class:`Decoder` one request at
a time with a contiguous cache, the paged engine with block tables, chunks and mixed
steps. Equal last-position logits mean the paged writes, gathers and masks are right.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from schedsim.live.engines.decoder import KVCache, build_decoder  # noqa: E402
from schedsim.live.engines.llm_engine import EngineRow, PagedLLMEngine  # noqa: E402
from schedsim.cost.llm_shapes import context_blocks, graph_batch  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
BS = 8  # small blocks: every test crosses block boundaries


@pytest.fixture(scope="module")
def model():
    return build_decoder("llama-tiny", "cpu", torch.float32, seed=0)


class Dense:
    """One request on the dense decoder: feed tokens, read last-position logits."""

    def __init__(self, model):
        w = model.embed.weight
        self.model, self.len = model, 0
        self.cache = KVCache(model.cfg, 1, device=w.device, dtype=w.dtype)

    def feed(self, tokens) -> torch.Tensor:
        ids = torch.as_tensor(np.asarray(tokens, np.int64), device=self.model.embed.weight.device)[None]
        with torch.no_grad():
            out = self.model(ids, self.cache, start=self.len)[0]
        self.len += ids.shape[1]
        return out


def _engine(model, num_blocks=64, **kw):
    return PagedLLMEngine("llama-tiny", num_blocks, BS, "cpu", torch.float32, model=model, **kw)


def _tokens(rng, n):
    return rng.integers(1, 512, size=n)


def test_prefill_then_decode_over_a_scattered_block_table(model):
    rng = np.random.default_rng(0)
    prompt = _tokens(rng, 21)                     # 3 blocks, the last one partly filled
    table = [9, 3, 17, 5, 30, 2]                  # non-contiguous, out of order
    dense = Dense(model)
    with _engine(model) as eng:
        want = dense.feed(prompt)
        nxt = eng.execute([EngineRow(prompt, 0, table)])
        torch.testing.assert_close(eng.last_logits[0], want, **TOL)
        assert nxt[0] == int(want.argmax())
        ctx = prompt.size
        for _ in range(7):                         # crosses from block 3 into block 4
            tok = [int(nxt[0])]
            want = dense.feed(tok)
            nxt = eng.execute([EngineRow(tok, ctx, table)])
            torch.testing.assert_close(eng.last_logits[0], want, **TOL)
            ctx += 1
        assert ctx > 3 * BS


def test_prefill_split_in_chunks_equals_one_prefill(model):
    rng = np.random.default_rng(1)
    prompt = _tokens(rng, 37)
    table = list(range(40, 46))
    dense = Dense(model)
    want = dense.feed(prompt)
    with _engine(model) as eng:
        ctx = 0
        for chunk in (prompt[:5], prompt[5:21], prompt[21:36], prompt[36:]):   # a 1-token tail too
            eng.execute([EngineRow(chunk, ctx, table)])
            ctx += len(chunk)
        torch.testing.assert_close(eng.last_logits[0], want, **TOL)


def test_mixed_step_of_rows_of_different_lengths(model):
    rng = np.random.default_rng(2)
    # Four requests with their own tables; bring each to its state, then one mixed step.
    prompts = [_tokens(rng, n) for n in (13, 30, 3, 9)]
    tables = [[1, 2], [10, 4, 11, 12, 13], [20], [33, 31, 32]]
    dense = [Dense(model) for _ in prompts]
    with _engine(model) as eng:
        # Step 1: rows 0, 1 (first chunk of 17) and 2 prefill together; row 3 waits.
        rows = [EngineRow(prompts[0], 0, tables[0]), EngineRow(prompts[1][:17], 0, tables[1]),
                EngineRow(prompts[2], 0, tables[2])]
        eng.execute(rows)
        want = [dense[0].feed(prompts[0]), dense[1].feed(prompts[1][:17]), dense[2].feed(prompts[2])]
        for i in range(3):
            torch.testing.assert_close(eng.last_logits[i], want[i], **TOL)
        # Step 2: decode row 0, finish row 1's prefill (context 17), decode row 2, start row 3.
        t0, t2 = _tokens(rng, 1), _tokens(rng, 1)
        rows = [EngineRow(t0, 13, tables[0]), EngineRow(prompts[1][17:], 17, tables[1]),
                EngineRow(t2, 3, tables[2]), EngineRow(prompts[3], 0, tables[3])]
        eng.execute(rows)
        want = [dense[0].feed(t0), dense[1].feed(prompts[1][17:]), dense[2].feed(t2),
                dense[3].feed(prompts[3])]
        for i in range(4):
            torch.testing.assert_close(eng.last_logits[i], want[i], **TOL)
        # Step 3: decode-only batch of rows with contexts 14, 30, 4, 9.
        toks = [_tokens(rng, 1) for _ in range(4)]
        ctxs = [14, 30, 4, 9]
        nxt = eng.execute([EngineRow(t, c, tb) for t, c, tb in zip(toks, ctxs, tables)])
        for i in range(4):
            want = dense[i].feed(toks[i])
            torch.testing.assert_close(eng.last_logits[i], want, **TOL)
            assert nxt[i] == int(want.argmax())


@pytest.mark.parametrize("min_split_blocks", [1, 4, 10_000])
def test_split_kv_decode_equals_dense(model, min_split_blocks):
    """Decode attention cut into key/value segments (flash-decoding) and merged by log-sum-exp."""
    rng = np.random.default_rng(7)
    lengths = (250, 30, 3)                          # the short rows leave whole segments empty
    prompts = [_tokens(rng, n) for n in lengths]
    tables = [list(range(1, 33)), list(range(40, 44)), [50]]
    dense = [Dense(model) for _ in prompts]
    with _engine(model, min_split_blocks=min_split_blocks) as eng:
        assert eng.decode_splits(3, 32) == {1: 32, 4: 8, 10_000: 1}[min_split_blocks]
        eng.execute([EngineRow(p, 0, t) for p, t in zip(prompts, tables)])
        for d, p in zip(dense, prompts):
            d.feed(p)
        toks = [_tokens(rng, 1) for _ in prompts]
        nxt = eng.execute([EngineRow(t, n, tb) for t, n, tb in zip(toks, lengths, tables)])
        for i in range(3):
            want = dense[i].feed(toks[i])
            torch.testing.assert_close(eng.last_logits[i], want, **TOL)
            assert nxt[i] == int(want.argmax())


def test_swap_out_and_in_round_trip(model):
    rng = np.random.default_rng(3)
    prompt = _tokens(rng, 19)
    dense = Dense(model)
    dense.feed(prompt)
    with _engine(model) as eng:
        eng.execute([EngineRow(prompt, 0, [5, 6, 7])])
        handle = eng.swap_out([5, 6, 7])
        assert handle.num_blocks == 3 and handle.data.shape[2] == 3
        # Another request overwrites those blocks while ours is swapped out.
        eng.execute([EngineRow(_tokens(rng, 24), 0, [6, 7, 5])])
        eng.swap_in(handle, [20, 8, 21])           # back into different blocks
        tok = _tokens(rng, 1)
        eng.execute([EngineRow(tok, 19, [20, 8, 21])])
        torch.testing.assert_close(eng.last_logits[0], dense.feed(tok), **TOL)
        with pytest.raises(ValueError, match="2 block ids"):
            eng.swap_in(handle, [1, 2])


def test_long_context_beyond_the_config_positions(model):
    """RoPE tables follow max_context, not the decoder's max_positions (256 for llama-tiny)."""
    rng = np.random.default_rng(4)
    prompt = _tokens(rng, 300)
    table = list(range(1, 40))
    with _engine(model, max_context=320) as eng:
        eng.execute([EngineRow(prompt[:150], 0, table)])
        eng.execute([EngineRow(prompt[150:], 150, table)])
        chunked = eng.last_logits[0].clone()
        eng.execute([EngineRow(prompt, 0, table)])
        torch.testing.assert_close(eng.last_logits[0], chunked, **TOL)
        assert torch.isfinite(chunked).all()


def test_bad_inputs_are_reported(model):
    with _engine(model, num_blocks=8) as eng:
        with pytest.raises(ValueError, match="blocks needed|needed for"):
            eng.execute([EngineRow([1] * 9, 0, [1])])
        with pytest.raises(ValueError, match="block ids"):
            eng.execute([EngineRow([1, 2], 0, [8])])
        with pytest.raises(ValueError, match="max_context"):
            eng.execute([EngineRow([1], 256, list(range(1, 8)) * 6)])
    with pytest.raises(ValueError, match="null block"):
        _engine(model, num_blocks=1)
    with pytest.raises(ValueError, match="builtin"):
        PagedLLMEngine("llama-70b", 8)


def test_padding_rules_the_graphs_use():
    assert graph_batch(3) == 4 and graph_batch(256) == 256 and graph_batch(257) == 0
    assert context_blocks(1, 16) == 16 and context_blocks(4001, 16) == 256
    assert context_blocks(4097, 16) == 512


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_decode_equals_eager():
    rng = np.random.default_rng(5)
    model = build_decoder("llama-tiny", "cuda", torch.float32, seed=0)
    prompts = [_tokens(rng, n) for n in (40, 7, 100)]
    tables = [list(range(1 + 20 * i, 21 + 20 * i)) for i in range(3)]
    out = {}
    for graphs in (False, True):
        with PagedLLMEngine("llama-tiny", 128, BS, "cuda", torch.float32, cuda_graphs=graphs,
                            model=model) as eng:
            eng.execute([EngineRow(p, 0, t) for p, t in zip(prompts, tables)])
            ctx = [len(p) for p in prompts]
            toks = [[1], [2], [3]]
            logits = []
            for _ in range(12):
                nxt = eng.execute([EngineRow(t, c, tb) for t, c, tb in zip(toks, ctx, tables)])
                assert eng.last_graph == graphs, eng.warnings
                assert eng.last_gpu_ms > 0
                logits.append(eng.last_logits.float().cpu())
                toks = [[int(x)] for x in nxt]
                ctx = [c + 1 for c in ctx]
            out[graphs] = torch.stack(logits)
    torch.testing.assert_close(out[True], out[False], rtol=1e-4, atol=1e-4)


def _close_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """bf16 logits of two different kernels: near in relative max error and in direction."""
    got, want = got.float().cpu(), want.float().cpu()
    rel = float((got - want).abs().max() / want.abs().max())
    cos = float(torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0))
    assert rel < 0.05 and cos > 0.999, (rel, cos)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_llama_1b_bf16_paged_equals_dense_on_cuda():
    """The kernels the profile times (flash prefill, gathered decode, graphs) against the dense decoder."""
    rng = np.random.default_rng(6)
    model = build_decoder("llama-1b", "cuda", torch.bfloat16, seed=0)
    prompts = [_tokens(rng, 700), _tokens(rng, 45)]
    tables = [list(range(200, 150, -1)), list(range(300, 310))]    # 16-token blocks
    dense = [Dense(model), Dense(model)]
    want = [dense[0].feed(prompts[0][:300]), dense[1].feed(prompts[1])]
    eager = []
    for graphs in (False, True):
        with PagedLLMEngine("llama-1b", 512, 16, "cuda", torch.bfloat16, cuda_graphs=graphs,
                            model=model) as eng:
            assert eng.describe()["prefill_with_context"]
            # A two-row prefill step, then the long prompt's second chunk over 300 cached tokens.
            eng.execute([EngineRow(prompts[0][:300], 0, tables[0]), EngineRow(prompts[1], 0, tables[1])])
            for i in range(2):
                _close_bf16(eng.last_logits[i], want[i])
            eng.execute([EngineRow(prompts[0][300:], 300, tables[0])])
            if not graphs:
                want_700 = dense[0].feed(prompts[0][300:])
            _close_bf16(eng.last_logits[0], want_700)
            # Decodes: three rows padded to a graph of 4, contexts across a block boundary.
            ctx = [700, 45]
            toks = [[7], [9]]
            for step in range(4):
                rows = [EngineRow(t, c, tb) for t, c, tb in zip(toks, ctx, tables)]
                rows.append(EngineRow([11], 10 + step, tables[1][5:]))   # a short third row
                eng.execute(rows)
                assert eng.last_graph == graphs, eng.warnings
                if not graphs:
                    eager.append(eng.last_logits.float().cpu())
                    for i in range(2):
                        _close_bf16(eng.last_logits[i], dense[i].feed(toks[i]))
                else:
                    _close_bf16(eng.last_logits, eager[step])   # other widths, other kernels
                ctx = [c + 1 for c in ctx]
            if graphs:
                assert eng.graph_shapes == [(4, 64)]
            handle = eng.swap_out(tables[1][:3])
            assert handle.data.is_pinned()
            eng.swap_in(handle, [400, 401, 402])
            assert torch.equal(eng.kv[:, :, [400, 401, 402]], eng.kv[:, :, tables[1][:3]])


def test_steps_run_in_inference_mode_as_the_profiler_measures_them(model, monkeypatch):
    """The step profiler times the engine under torch.inference_mode(); a live step must run
    the same way, or an eager step's host-side dispatch costs differ between the two."""
    seen = []
    with _engine(model) as eng:
        forward = eng._forward

        def spy(*args, **kw):
            seen.append(torch.is_inference_mode_enabled())
            return forward(*args, **kw)

        monkeypatch.setattr(eng, "_forward", spy)
        assert not torch.is_inference_mode_enabled()
        eng.execute([EngineRow(_tokens(np.random.default_rng(1), 5), 0, [1])])
    assert seen == [True]


def test_two_steps_packed_before_either_runs_and_tokens_written_in_later(model):
    """The two staging buffers: a step packed while the one before is still to run keeps
    its inputs, and a placeholder token written in with set_tokens before run() is the one
    computed (what the live driver does under async scheduling)."""
    rng = np.random.default_rng(3)
    a, b = _tokens(rng, 12), _tokens(rng, 9)
    with _engine(model) as eng:
        want_a = eng.execute([EngineRow(a, 0, [1, 2])])
        want_b = eng.execute([EngineRow(b, 0, [3, 4])])
        held = b.copy()
        held[-1] = 0                                   # not known yet when packed
        pa = eng.prepare([EngineRow(a, 0, [5, 6])])
        pb = eng.prepare([EngineRow(held, 0, [7, 8])])
        np.testing.assert_array_equal(eng.run(pa), want_a)
        eng.set_tokens(pb, [b.size - 1], [b[-1]])
        np.testing.assert_array_equal(eng.run(pb), want_b)
