"""LoadGen (Server scenario) drives a dynamic batcher on the ORT bert-tiny engine; the
simulator predicts the same summary keys."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

lg = pytest.importorskip("mlperf_loadgen")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

from policies import DynamicBatcher  # noqa: E402
from schedsim.cost.model import CostModel  # noqa: E402
from schedsim.live.engines.ort_live import OrtRunner, build_encoder_onnx  # noqa: E402
from schedsim.live.loadgen import SUMMARY_PERCENTILES, predict_loadgen, run_loadgen  # noqa: E402
from schedsim.cost.profile import save_profile  # noqa: E402

SEQ, MAX_BATCH = 32, 8


def _quick_cost(model, out) -> CostModel:
    rows = []
    with OrtRunner(model, vocab=30522) as r:
        for b in range(1, MAX_BATCH + 1):
            ids = np.ones((b, SEQ), np.int64)
            for _ in range(5):
                r.infer(b, SEQ, ids)
            x = []
            for _ in range(30):
                t = time.perf_counter_ns()
                r.infer(b, SEQ, ids)
                x.append((time.perf_counter_ns() - t) / 1e6)
            x = np.array(x)
            rows.append({"batch": b, "seq_len": SEQ, "latency_ms_mean": x.mean(),
                         "latency_ms_p50": np.percentile(x, 50), "latency_ms_p90": np.percentile(x, 90),
                         "latency_ms_p99": np.percentile(x, 99), "latency_ms_std": x.std(), "n": len(x)})
    return CostModel.from_profile(save_profile(pd.DataFrame(rows), {"backend": "onnxruntime"},
                                               out / "bert-tiny.csv"))


def test_loadgen_server_run_parses_and_prediction_has_same_keys(tmp_path):
    model = build_encoder_onnx("bert-tiny", tmp_path / "bert-tiny.onnx")
    make = lambda: DynamicBatcher(max_batch_size=MAX_BATCH, max_queue_delay_us=500)  # noqa: E731
    measured = run_loadgen(200, 3.0, make(), lambda: OrtRunner(model, vocab=30522), seed=1,
                           out_dir=tmp_path / "lg", seq_len=SEQ)
    assert (tmp_path / "lg" / "mlperf_log_summary.txt").is_file()
    assert measured["result"] in ("VALID", "INVALID")
    assert measured["completed"] > 0 and measured["batches"] > 0
    for key in SUMMARY_PERCENTILES:
        assert np.isfinite(measured[key]) and measured[key] > 0, key
    assert measured["throughput_rps"] > 0
    assert len(measured["arrival_s"]) == measured["completed"]
    predicted = predict_loadgen(200, 3.0, make, _quick_cost(model, tmp_path), seed=1, seq_len=SEQ)
    for key in ("throughput_rps", "mean_ms", *SUMMARY_PERCENTILES, "scheduled_qps"):
        assert key in measured and key in predicted, key
        assert np.isfinite(predicted[key]), key
    print({k: (round(measured[k], 3), round(predicted[k], 3))
           for k in ("scheduled_qps", "throughput_rps", "mean_ms", "p50_ms", "p90_ms", "p99_ms")},
          "batch", measured["mean_batch_size"], predicted["mean_batch_size"])
