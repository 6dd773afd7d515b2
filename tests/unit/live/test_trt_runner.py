"""TensorRT backend: every part that runs without the TensorRT library."""

from __future__ import annotations

import enum
from pathlib import Path

import numpy as np
import pytest

from schedsim.live.engines.onnx_export import InputSpec
from schedsim.live.engines.trt_runner import (CudaError, TrtSettings, calibration_batches,
                                         calibration_shapes, check_in_profile, cuda_check,
                                         engine_cache_key, engine_path, import_tensorrt,
                                         profile_shapes)
from schedsim.errors import InputError

IDS = InputSpec("input_ids", np.dtype(np.int64), (None, None), vocab=30522)
MASK = InputSpec("attention_mask", np.dtype(np.int64), (None, None))
FIXED = InputSpec("input_ids", np.dtype(np.int64), (None, 128))


def test_cache_key_is_stable_and_covers_every_part():
    shapes = profile_shapes([IDS], (1, 8, 64), (128,))
    base = dict(model_sha256="a" * 64, trt_version="10.7.0", gpu_name="NVIDIA H200",
                settings=TrtSettings(), shapes=shapes)
    key = engine_cache_key(**base)
    assert key == engine_cache_key(**base) and len(key) == 24
    variants = [dict(model_sha256="b" * 64), dict(trt_version="10.8.0"),
                dict(gpu_name="NVIDIA H100"), dict(settings=TrtSettings(precision="int8")),
                dict(settings=TrtSettings(workspace_gib=8)),
                dict(settings=TrtSettings(strongly_typed=True)),
                dict(shapes=profile_shapes([IDS], (1, 8, 32), (128,)))]
    keys = {engine_cache_key(**(base | v)) for v in variants}
    assert key not in keys and len(keys) == len(variants)
    assert engine_path("/c", "/m/bert.onnx", key) == Path(f"/c/bert-{key}.engine")


def test_profile_shapes_from_requested_sizes():
    shapes = profile_shapes([IDS, MASK], (1, 2, 4, 8, 64), (32, 128, 384))
    assert shapes["input_ids"] == ((1, 32), (64, 384), (64, 384))
    assert shapes["attention_mask"] == shapes["input_ids"]
    med = profile_shapes([IDS], (1, 2, 4, 8, 64), (32, 128, 384), opt="median")
    assert med["input_ids"][1] == (4, 128)
    fixed = profile_shapes([FIXED], (1, 16), (128,))
    assert fixed["input_ids"] == ((1, 128), (16, 128), (16, 128))


def test_profile_shapes_refuse_what_the_model_cannot_take():
    with pytest.raises(InputError, match="fixed sequence length 128"):
        profile_shapes([FIXED], (1,), (64,))
    odd = InputSpec("x", np.dtype(np.float32), (None, None, None))
    with pytest.raises(InputError, match="dynamic axes other than batch"):
        profile_shapes([odd], (1,), (8,))
    with pytest.raises(InputError, match="opt="):
        profile_shapes([IDS], (1,), (8,), opt="mean")


def test_shape_outside_the_profile():
    shapes = profile_shapes([IDS], (1, 32), (128,))
    check_in_profile(shapes, "input_ids", (32, 128))
    with pytest.raises(InputError, match=r"\(33, 128\) is outside the engine's optimization profile"):
        check_in_profile(shapes, "input_ids", (33, 128))
    with pytest.raises(InputError, match="outside"):
        check_in_profile(shapes, "input_ids", (4, 256))


def test_calibration_batches_are_full_and_wrap():
    data = np.arange(10 * 3).reshape(10, 3)
    batches = list(calibration_batches(data, 4, 3))
    assert [b.shape for b in batches] == [(4, 3)] * 3
    rows = np.concatenate(batches)[:, 0] // 3
    assert rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert all(b.flags["C_CONTIGUOUS"] for b in batches)
    assert list(calibration_batches(data, 4, 0)) == []
    with pytest.raises(InputError, match="empty"):
        list(calibration_batches(np.zeros((0, 3)), 4, 1))


def test_calibration_runs_on_one_shape_at_the_opt_seq_len():
    shapes = profile_shapes([IDS], (1, 64), (32, 128, 384), opt="median")
    assert calibration_shapes(shapes, 8) == {"input_ids": (8, 128)}


class FakeCudart:
    """What cuda_check uses of cuda.bindings.runtime."""

    class cudaError_t(enum.IntEnum):
        cudaSuccess = 0
        cudaErrorMemoryAllocation = 2

    @staticmethod
    def cudaGetErrorName(err):
        return (FakeCudart.cudaError_t.cudaSuccess, err.name.encode())


def test_cuda_check_unwraps_and_raises():
    ok, oom = FakeCudart.cudaError_t.cudaSuccess, FakeCudart.cudaError_t.cudaErrorMemoryAllocation
    assert cuda_check((ok,), cudart=FakeCudart) is None
    assert cuda_check((ok, 1234), cudart=FakeCudart) == 1234
    assert cuda_check((ok, 1, 2), cudart=FakeCudart) == (1, 2)
    with pytest.raises(CudaError, match=r"cudaMalloc failed: cudaErrorMemoryAllocation \(2\)"):
        cuda_check((oom, 0), "cudaMalloc", cudart=FakeCudart)


def test_missing_tensorrt_names_the_package():
    try:
        import tensorrt  # noqa: F401
        pytest.skip("tensorrt is installed here")
    except ImportError:
        pass
    with pytest.raises(InputError, match="'tensorrt'"):
        import_tensorrt()
