"""The config.pbtxt writer: what it writes, the --triton-config parser reads back unchanged."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.dynamic import QueuePolicy
from schedsim.errors import InputError
from schedsim.triton.config import load_triton_config, to_policy_kwargs
from schedsim.triton.repository import (config_text, model_config, triton_prefetches,
                                        write_repository)

pytest.importorskip("tritonclient.grpc.model_config_pb2")

queue_policies = st.builds(QueuePolicy, max_queue_size=st.integers(0, 1000),
                           default_timeout_us=st.integers(0, 10**7),
                           timeout_action=st.sampled_from(["REJECT", "DELAY"]),
                           allow_timeout_override=st.booleans())


@st.composite
def dynamic_settings(draw):
    mbs = draw(st.integers(1, 256))
    preferred = draw(st.lists(st.integers(1, mbs), max_size=4, unique=True))
    levels = draw(st.integers(0, 4))
    default_qp = draw(queue_policies)
    preserve = draw(st.booleans())
    # Triton refuses preserve_ordering with several levels or a DELAY timeout (config.py checks it).
    if preserve and (levels > 1 or (default_qp.default_timeout_us and default_qp.timeout_action == "DELAY")):
        preserve = False
    per_level = {}
    if levels:
        per_level = draw(st.dictionaries(st.integers(1, levels), queue_policies, max_size=levels))
        if preserve and any(q.default_timeout_us and q.timeout_action == "DELAY" for q in per_level.values()):
            preserve = False
    return {
        "max_batch_size": mbs,
        "preferred_batch_sizes": tuple(sorted(preferred)) or (mbs,),
        "max_queue_delay_us": draw(st.integers(0, 10**6)),
        "priority_levels": levels,
        "default_priority_level": draw(st.integers(1, levels)) if levels else 0,
        "preserve_ordering": preserve,
        "max_queue_size": default_qp.max_queue_size,
        "default_timeout_us": default_qp.default_timeout_us,
        "timeout_action": default_qp.timeout_action,
        "allow_timeout_override": default_qp.allow_timeout_override,
        "priority_queue_policy": per_level,
    }


@settings(max_examples=150, deadline=None)
@given(params=dynamic_settings(), instances=st.integers(1, 4), kind=st.sampled_from(["KIND_CPU", "KIND_GPU"]))
def test_written_config_parses_back_to_the_same_settings(tmp_path_factory, params, instances, kind):
    cfg = model_config("m", policy="dynamic", params=params, instances=instances, kind=kind)
    path = tmp_path_factory.mktemp("cfg") / "config.pbtxt"
    path.write_text(config_text(cfg))
    parsed = load_triton_config(path)
    back = to_policy_kwargs(parsed)
    assert back.pop("instances") == instances
    assert back.pop("prefetch") == triton_prefetches(params)
    assert back == params
    assert not parsed.assumes_one_gpu  # a GPU group names GPU 0
    assert parsed.instance_groups[0][:2] == (kind, instances)


def test_none_policy_has_no_dynamic_batching_block(tmp_path):
    cfg = model_config("m", policy="none", params={}, max_batch_size=4)
    text = config_text(cfg)
    assert "dynamic_batching" not in text
    (tmp_path / "config.pbtxt").write_text(text)
    parsed = load_triton_config(tmp_path / "config.pbtxt")
    assert (parsed.max_batch_size, parsed.has_dynamic_batching, parsed.instances) == (4, False, 1)


def test_parameters_and_io_are_written(tmp_path):
    cfg = model_config("enc", policy="dynamic", params={"max_batch_size": 8}, hidden=768,
                       parameters={"model": "bert-base", "seed": 3})
    folder = write_repository(tmp_path, "enc", cfg)
    text = (folder / "config.pbtxt").read_text()
    assert 'backend: "python"' in text and 'name: "INPUT_IDS"' in text and "dims: 768" in text
    assert cfg.parameters["seed"].string_value == "3"
    assert (folder / "1" / "model.py").read_text().startswith('"""Triton Python-backend model')


def test_policies_triton_cannot_express_are_refused():
    with pytest.raises(InputError, match="--policy static"):
        model_config("m", policy="static", params={})
    with pytest.raises(InputError, match="--instances"):
        model_config("m", policy="dynamic", params={}, instances=0)
