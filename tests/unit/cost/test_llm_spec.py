"""Model specs and KV block budgets: published shapes, vLLM's block rule, spec files."""

from __future__ import annotations

import json

import pytest

from schedsim.errors import InputError
from schedsim.cost.llm_spec import (DEFAULT_MODEL, GIB, MODEL_SPECS, ModelSpec, activation_bytes, gpu_blocks,
                               load_model_spec)


def test_kv_bytes_per_token():
    assert MODEL_SPECS["llama-3-8b"].kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert MODEL_SPECS["llama-1b"].kv_bytes_per_token == 2 * 16 * 8 * 64 * 2 == 32768
    assert MODEL_SPECS["opt-13b"].kv_bytes_per_token == 2 * 40 * 40 * 128 * 2 == 819200  # vLLM paper: 800 KB


@pytest.mark.parametrize("name, params_b", [
    ("llama-1b", 1.236), ("llama-3-8b", 8.030), ("llama-3.1-70b", 70.554), ("mistral-7b", 7.242),
    ("qwen2.5-7b", 7.615), ("opt-13b", 12.841),
])
def test_parameter_counts_match_published_sizes(name, params_b):
    spec = MODEL_SPECS[name]
    assert spec.parameter_count() / 1e9 == pytest.approx(params_b, abs=0.002)
    assert spec.weight_bytes == spec.parameter_count() * spec.dtype_bytes


def test_default_is_the_measured_decoder_shape():
    spec = MODEL_SPECS[DEFAULT_MODEL]
    assert spec.max_model_len == 262144 and spec.tied_embeddings and spec.dtype_bytes == 2
    assert "Mooncake" in spec.description
    decoder = pytest.importorskip("schedsim.live.engines.decoder")
    cfg = decoder.CONFIGS["llama-1b"]
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim, spec.ffn, spec.vocab) == \
        (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn, cfg.vocab)
    assert spec.parameter_count() == decoder.parameter_count(cfg)


def test_blocks_derived_by_hand():
    spec = ModelSpec(name="toy", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=1000,
                     weight_bytes=100 * 2**20)
    # KV per token: 2 * 2 layers * 2 heads * 16 * 2 bytes = 256; a 16-token block = 4096 bytes.
    # Activations: 512 tokens * (2*64 + 3*128) * 2 bytes + 2 * 8 seqs * 1000 * 4 = 524288 + 64000 = 588288.
    assert activation_bytes(spec, max_num_batched_tokens=512, max_num_seqs=8) == 588288
    b = gpu_blocks(spec, block_size=16, gpu_memory_gb=1, gpu_memory_utilization=0.5,
                   max_num_batched_tokens=512, max_num_seqs=8)
    expect = (GIB // 2 - 100 * 2**20 - 588288) // 4096
    assert (b.num_blocks, b.bytes_per_block, b.how) == (expect, 4096, "derived")
    assert b.kv_tokens_capacity == expect * 16 and b.kv_bytes == expect * 4096
    assert b.weights_bytes == 100 * 2**20 and b.activation_bytes == 588288


def test_blocks_given_override():
    b = gpu_blocks(MODEL_SPECS["llama-3-8b"], block_size=16, gpu_memory_gb=1, num_gpu_blocks=1000)
    assert (b.num_blocks, b.how, b.kv_tokens_capacity, b.bytes_per_block) == (1000, "given", 16000, 16 * 131072)


def test_realistic_budget_h200_llama_8b():
    b = gpu_blocks(MODEL_SPECS["llama-3.1-8b"], block_size=16, gpu_memory_gb=140)
    # 126 GiB usable - 15 GiB weights - ~1 GiB activations ~ 110 GiB of KV at 2 MiB a block.
    assert 54_000 < b.num_blocks < 57_000


def test_zero_blocks_is_an_input_error():
    with pytest.raises(InputError, match=r"model spec llama-3.1-70b: weights 131\.\d\d GiB \+ activations .* exceed "
                                         r"gpu_memory_gb\*gpu_memory_utilization = 72\.00 GiB: no KV blocks.*"
                                         r"--gpu-memory-gb.*--num-gpu-blocks"):
        gpu_blocks(MODEL_SPECS["llama-3.1-70b"], block_size=16, gpu_memory_gb=80)
    with pytest.raises(InputError, match="gpu_memory_gb .*or num_gpu_blocks"):
        gpu_blocks(MODEL_SPECS["llama-1b"], block_size=16)
    with pytest.raises(InputError, match="gpu_memory_utilization"):
        gpu_blocks(MODEL_SPECS["llama-1b"], block_size=16, gpu_memory_gb=80, gpu_memory_utilization=1.5)
    with pytest.raises(InputError, match="block_size"):
        gpu_blocks(MODEL_SPECS["llama-1b"], block_size=0, gpu_memory_gb=80)


def test_load_builtin_and_unknown_name():
    assert load_model_spec("llama-3-8b") is MODEL_SPECS["llama-3-8b"]
    with pytest.raises(InputError, match="not a built-in"):
        load_model_spec("llama-9z")


LLAMA3_8B_HF = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256,
}


def test_load_hugging_face_config(tmp_path):
    d = tmp_path / "Meta-Llama-3-8B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B_HF))
    spec = load_model_spec(str(d / "config.json"))
    ref = MODEL_SPECS["llama-3-8b"]
    assert spec.name == "Meta-Llama-3-8B"
    for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "dtype_bytes", "max_model_len",
              "tied_embeddings", "gated_ffn", "weight_bytes"):
        assert getattr(spec, f) == getattr(ref, f), f


def test_load_opt_style_hf_config(tmp_path):
    p = tmp_path / "opt.json"
    p.write_text(json.dumps({"model_type": "opt", "hidden_size": 5120, "ffn_dim": 20480, "num_hidden_layers": 40,
                             "num_attention_heads": 40, "vocab_size": 50272, "max_position_embeddings": 2048,
                             "torch_dtype": "float16", "tie_word_embeddings": True}))
    spec = load_model_spec(str(p))
    assert not spec.gated_ffn and spec.kv_heads == 40 and spec.head_dim == 128
    assert spec.weight_bytes == MODEL_SPECS["opt-13b"].weight_bytes


def test_load_our_format(tmp_path):
    p = tmp_path / "mine.json"
    p.write_text(json.dumps({"name": "mine", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
                             "ffn": 128, "vocab": 1000, "weight_bytes": 12345}))
    spec = load_model_spec(str(p))
    assert (spec.name, spec.weight_bytes, spec.kv_bytes_per_token, spec.max_model_len) == ("mine", 12345, 256, 8192)


@pytest.mark.parametrize("content, expect", [
    ({**LLAMA3_8B_HF, "hidden_size": "big"}, r"bad\.json: hidden_size: 'big' must be an integer >= 1"),
    ({k: v for k, v in LLAMA3_8B_HF.items() if k != "vocab_size"}, r"bad\.json: vocab_size: missing"),
    ({**LLAMA3_8B_HF, "torch_dtype": "int3"}, r"bad\.json: torch_dtype: 'int3' is not one of"),
    ({**LLAMA3_8B_HF, "num_key_value_heads": 5}, r"bad\.json: kv_heads: 5 must divide heads \(32\)"),
    ({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "vocab": 10, "hiden": 1},
     r"bad\.json: hiden: unknown field"),
    ({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "vocab": 10,
      "tied_embeddings": "yes"}, r"bad\.json: tied_embeddings: 'yes' must be true or false"),
    ("{\n  \"layers\": 2,\n  oops\n}", r"bad\.json:3: invalid JSON"),
    ("[1, 2]", r"bad\.json: a model spec must be a JSON object"),
])
def test_bad_spec_file(tmp_path, content, expect):
    p = tmp_path / "bad.json"
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(InputError, match=expect) as e:
        load_model_spec(str(p))
    assert "\n" not in str(e.value)


def test_spec_validation_names_the_field():
    with pytest.raises(InputError, match="model spec x: layers: 0 must be an integer >= 1"):
        ModelSpec(name="x", layers=0, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=10)
