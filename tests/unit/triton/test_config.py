"""--triton-config: real config.pbtxt files parsed with protobuf into Triton's ModelConfig."""

import sys

import pytest

from schedsim.errors import InputError
from schedsim.triton.config import QueuePolicy, load_triton_config, to_policy_kwargs

pytest.importorskip("tritonclient.grpc.model_config_pb2")

# Triton tutorial, Conceptual Guide part 2 (text recognition, ONNX), with dynamic batching.
TEXT_RECOGNITION = """\
name: "text_recognition"
backend: "onnxruntime"
max_batch_size : 8
input [
  {
    name: "input.1"
    data_type: TYPE_FP32
    dims: [ 1, 32, 100 ]
  }
]
output [
  {
    name: "308"
    data_type: TYPE_FP32
    dims: [ 26, 37 ]
  }
]

dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
"""

PRIORITIES = """\
name: "ranker"
platform: "tensorrt_plan"
max_batch_size: 32
dynamic_batching {
  max_queue_delay_microseconds: 2000
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    max_queue_size: 64
    default_timeout_microseconds: 50000
    timeout_action: REJECT
  }
  priority_queue_policy {
    key: 1
    value {
      timeout_action: DELAY
      default_timeout_microseconds: 10000
      allow_timeout_override: true
      max_queue_size: 16
    }
  }
}
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
"""

TWO_INSTANCES = """\
name: "resnet50"
platform: "onnxruntime_onnx"
max_batch_size: 64
dynamic_batching { }
instance_group [
  {
    count: 2
    kind: KIND_GPU
  }
]
"""


def write(tmp_path, text, name="config.pbtxt"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_tutorial_text_recognition(tmp_path):
    cfg = load_triton_config(write(tmp_path, TEXT_RECOGNITION))
    assert cfg.name == "text_recognition"
    assert cfg.backend == "onnxruntime" and cfg.platform == ""
    assert cfg.max_batch_size == 8
    assert cfg.has_dynamic_batching
    assert cfg.preferred_batch_sizes == (4, 8)
    assert cfg.max_queue_delay_us == 100
    assert cfg.instances == 1 and cfg.assumes_one_gpu  # no instance_group: one KIND_AUTO group
    assert cfg.prefetch_applies
    assert to_policy_kwargs(cfg) == {
        "max_batch_size": 8,
        "preferred_batch_sizes": (4, 8),
        "max_queue_delay_us": 100,
        "instances": 1,
        "prefetch": True,
        "priority_levels": 0,
        "default_priority_level": 0,
        "preserve_ordering": False,
        "max_queue_size": 0,
        "default_timeout_us": 0,
        "timeout_action": "REJECT",
        "allow_timeout_override": False,
        "priority_queue_policy": {},
    }


def test_priority_levels_and_queue_policies(tmp_path):
    cfg = load_triton_config(write(tmp_path, PRIORITIES))
    assert cfg.priority_levels == 3 and cfg.default_priority_level == 2
    assert cfg.default_queue_policy == QueuePolicy(64, 50000, "REJECT", False)
    assert dict(cfg.priority_queue_policy) == {1: QueuePolicy(16, 10000, "DELAY", True)}
    assert cfg.instances == 1 and not cfg.assumes_one_gpu
    assert not cfg.prefetch_applies
    kw = to_policy_kwargs(cfg)
    assert kw["max_queue_size"] == 64 and kw["default_timeout_us"] == 50000
    assert kw["priority_queue_policy"] == {1: QueuePolicy(16, 10000, "DELAY", True)}
    assert kw["prefetch"] is False
    # No preferred sizes given: Triton's NormalizeModelConfig uses [max_batch_size].
    assert cfg.preferred_batch_sizes == ()
    assert kw["preferred_batch_sizes"] == (32,)


def test_gpu_instance_group_count(tmp_path):
    cfg = load_triton_config(write(tmp_path, TWO_INSTANCES))
    assert cfg.instances == 2 and cfg.assumes_one_gpu
    assert cfg.instance_groups == (("KIND_GPU", 2, (), False),)
    assert to_policy_kwargs(cfg)["preferred_batch_sizes"] == (64,)


@pytest.mark.parametrize("groups, instances", [
    # count is per listed GPU
    ("instance_group [ { count: 2 kind: KIND_GPU gpus: [ 0, 1, 2 ] } ]", 6),
    # several groups add up; passive instances are not given work by the scheduler
    ("instance_group [ { count: 2 kind: KIND_GPU gpus: [0] }, { count: 1 kind: KIND_GPU gpus: [1] },"
     " { count: 4 kind: KIND_GPU gpus: [1] passive: true } ]", 3),
    # count omitted means 1 ...
    ("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]", 1),
    # ... except KIND_CPU on onnxruntime/tensorflow, where Triton defaults to 2
    ("instance_group [ { kind: KIND_CPU } ]", 2),
    ("instance_group [ { count: 3 kind: KIND_CPU } ]", 3),
])
def test_instance_counting(tmp_path, groups, instances):
    text = 'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\ndynamic_batching { }\n' + groups + "\n"
    assert load_triton_config(write(tmp_path, text)).instances == instances


@pytest.mark.parametrize("policy, prefetch", [
    ("", True),
    ("default_queue_policy { timeout_action: DELAY }", True),  # the action alone does not matter
    ("default_queue_policy { max_queue_size: 100 }", False),
    ("default_queue_policy { default_timeout_microseconds: 1000 }", False),
    ("default_queue_policy { allow_timeout_override: true }", False),
    ("priority_levels: 2 default_priority_level: 1", False),
    # With priority_levels 0 Triton ignores per-level policies, so they do not turn prefetch off.
    ("priority_queue_policy { key: 1 value { max_queue_size: 4 } }", True),
])
def test_prefetch_condition_matches_triton(tmp_path, policy, prefetch):
    text = f'max_batch_size: 8\ndynamic_batching {{ {policy} }}\n'
    cfg = load_triton_config(write(tmp_path, text))
    assert cfg.prefetch_applies is prefetch
    assert to_policy_kwargs(cfg)["prefetch"] is prefetch


def test_typo_in_field_name_reports_line_and_column(tmp_path):
    text = TEXT_RECOGNITION.replace("preferred_batch_size:", "prefered_batch_size:")
    path = write(tmp_path, text)
    with pytest.raises(InputError) as exc:
        load_triton_config(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:20:3: ")
    assert 'has no field named "prefered_batch_size"' in msg
    assert "\n" not in msg


def test_singular_field_twice_is_a_parse_error(tmp_path):
    path = write(tmp_path, "max_batch_size: 8\nmax_batch_size: 16\n")
    with pytest.raises(InputError, match=r"config\.pbtxt:2:\d+: .*multiple \"max_batch_size\""):
        load_triton_config(path)


def test_preferred_size_above_max(tmp_path):
    text = 'name: "m"\nmax_batch_size: 64\ndynamic_batching { preferred_batch_size: [ 32, 128 ] }\n'
    path = write(tmp_path, text)
    with pytest.raises(InputError) as exc:
        load_triton_config(path)
    assert str(exc.value) == f"{path}: dynamic_batching.preferred_batch_size: 128 exceeds max_batch_size 64"


@pytest.mark.parametrize("text, field", [
    ("max_batch_size: -1\n", "max_batch_size"),
    ("max_batch_size: 8\ndynamic_batching { preferred_batch_size: 0 }\n",
     "dynamic_batching.preferred_batch_size"),
    ("max_batch_size: 8\ndynamic_batching { priority_levels: 2 }\n",
     "dynamic_batching.default_priority_level"),
    ("max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 3 }\n",
     "dynamic_batching.default_priority_level"),
    ("max_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 1"
     " priority_queue_policy { key: 5 value { } } }\n", "dynamic_batching.priority_queue_policy"),
    ("max_batch_size: 8\ndynamic_batching { preserve_ordering: true priority_levels: 2"
     " default_priority_level: 1 }\n", "dynamic_batching.preserve_ordering"),
    ("max_batch_size: 8\ndynamic_batching { preserve_ordering: true default_queue_policy"
     " { timeout_action: DELAY default_timeout_microseconds: 10 } }\n",
     "dynamic_batching.default_queue_policy"),
])
def test_values_triton_would_reject(tmp_path, text, field):
    path = write(tmp_path, text)
    with pytest.raises(InputError, match=f"^{path}: {field}: "):
        load_triton_config(path)


def test_model_without_batching_is_reported_not_rejected(tmp_path):
    cfg = load_triton_config(write(tmp_path, 'name: "m"\nmax_batch_size: 0\n'))
    assert cfg.max_batch_size == 0 and not cfg.has_dynamic_batching
    assert cfg.effective_preferred_batch_sizes == ()


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="cannot read Triton config"):
        load_triton_config(tmp_path / "nope.pbtxt")


def test_missing_tritonclient_says_what_to_install(tmp_path, monkeypatch):
    path = write(tmp_path, TEXT_RECOGNITION)
    monkeypatch.setitem(sys.modules, "tritonclient.grpc.model_config_pb2", None)
    with pytest.raises(InputError, match=r"pip install 'tritonclient\[grpc\]'"):
        load_triton_config(path)
