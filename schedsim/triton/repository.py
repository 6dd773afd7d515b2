"""Write a Triton model repository whose ``config.pbtxt`` says what the simulator's flags say.

The configuration is built as Triton's own ``ModelConfig`` protobuf message (from
``tritonclient[grpc]``) and printed with protobuf's text format, so it is exactly what
:func:`schedsim.triton.config.load_triton_config` (and Triton) parses back:
``to_policy_kwargs(load_triton_config(written)) == settings`` with Triton's defaults
applied (tested with hypothesis).

The ``dynamic`` policy becomes a ``dynamic_batching`` block (delay, preferred sizes,
priority levels, queue policies, preserve_ordering); ``none`` has no such block (Triton's
default scheduler runs each request alone). The ``prefetch`` setting is not written:
Triton decides it from the queue policies (see ``_triton_prefetches`` in config.py), and
:func:`triton_prefetches` says what it will do.
"""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

from schedsim.errors import InputError

INPUT_NAME = "INPUT_IDS"
"""The model's one input: int64 token ids, [batch, seq_len]."""
OUTPUT_NAME = "OUTPUT"
"""The model's one output: the pooled hidden state, float32 [batch, hidden]."""
TRITON_POLICIES = ("none", "dynamic")
"""Policies a Triton model configuration can express."""

_QUEUE_FIELDS = ("max_queue_size", "default_timeout_us", "timeout_action", "allow_timeout_override")


def _pb():
    try:
        return importlib.import_module("tritonclient.grpc.model_config_pb2")
    except ImportError as exc:
        raise InputError(f"writing a Triton config needs tritonclient's protobuf classes ({exc.name or exc}); "
                         "run: pip install 'tritonclient[grpc]'") from None


def _set_queue_policy(msg, pb, qp) -> None:
    """Fill a ModelQueuePolicy from a QueuePolicy or a dict with its fields."""
    get = qp.get if isinstance(qp, dict) else (lambda k, d=None: getattr(qp, k, d))
    msg.max_queue_size = int(get("max_queue_size", 0) or 0)
    msg.default_timeout_microseconds = int(get("default_timeout_us", 0) or 0)
    msg.timeout_action = pb.ModelQueuePolicy.TimeoutAction.Value(str(get("timeout_action", "REJECT") or "REJECT").upper())
    msg.allow_timeout_override = bool(get("allow_timeout_override", False))


def model_config(name: str, *, policy: str, params: dict, instances: int = 1, kind: str = "KIND_CPU",
                 max_batch_size: int | None = None, backend: str = "python", hidden: int = 128,
                 parameters: dict | None = None):
    """Triton's ``ModelConfig`` message for ``policy`` with ``params`` (the policy's keyword
    arguments, as :func:`schedsim.triton.config.to_policy_kwargs` returns them).

    ``max_batch_size`` is used for ``none`` (most samples one request carries; default 1);
    ``kind`` is KIND_CPU or KIND_GPU; ``parameters`` become the config's string parameters
    (what the Python model reads).
    """
    if policy not in TRITON_POLICIES:
        raise InputError(f"--policy {policy}: a Triton model configuration expresses "
                         f"{' or '.join(TRITON_POLICIES)}, not {policy!r}")
    if kind not in ("KIND_CPU", "KIND_GPU"):
        raise ValueError(f"kind {kind!r}: expected KIND_CPU or KIND_GPU")
    if instances < 1:
        raise InputError(f"--instances: {instances} is not valid; expected an integer >= 1")
    pb = _pb()
    cfg = pb.ModelConfig()
    cfg.name = name
    cfg.backend = backend
    inp = cfg.input.add()
    inp.name, inp.data_type = INPUT_NAME, pb.DataType.Value("TYPE_INT64")
    inp.dims.append(-1)
    out = cfg.output.add()
    out.name, out.data_type = OUTPUT_NAME, pb.DataType.Value("TYPE_FP32")
    out.dims.append(int(hidden))
    group = cfg.instance_group.add()
    group.count = int(instances)
    group.kind = pb.ModelInstanceGroup.Kind.Value(kind)
    if kind == "KIND_GPU":
        group.gpus.append(0)  # one GPU, as the simulator assumes; Triton would use every visible one
    for key, value in (parameters or {}).items():
        cfg.parameters[key].string_value = str(value)
    if policy == "none":
        cfg.max_batch_size = int(max_batch_size or 1)
        return cfg
    cfg.max_batch_size = int(params.get("max_batch_size", 64))
    db = cfg.dynamic_batching
    db.max_queue_delay_microseconds = int(params.get("max_queue_delay_us", 0) or 0)
    preferred = sorted({int(b) for b in params.get("preferred_batch_sizes") or ()})
    if preferred != [cfg.max_batch_size]:  # [max_batch_size] is what Triton fills in for none
        db.preferred_batch_size.extend(preferred)
    db.preserve_ordering = bool(params.get("preserve_ordering", False))
    levels = int(params.get("priority_levels", 0) or 0)
    db.priority_levels = levels
    default_level = int(params.get("default_priority_level", 0) or 0)
    db.default_priority_level = default_level or (1 if levels else 0)
    _set_queue_policy(db.default_queue_policy, pb, {k: params.get(k) for k in _QUEUE_FIELDS})
    for level, qp in sorted((params.get("priority_queue_policy") or {}).items()):
        _set_queue_policy(db.priority_queue_policy[int(level)], pb, qp)
    return cfg


def config_text(cfg) -> str:
    """The config.pbtxt text of a ``ModelConfig`` message (protobuf's text format)."""
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def triton_prefetches(params: dict) -> bool:
    """Whether Triton will form batches ahead for these dynamic-policy settings
    (no priority levels, no default timeout, no override, unbounded queue)."""
    return (int(params.get("priority_levels", 0) or 0) == 0 and not params.get("default_timeout_us")
            and not params.get("allow_timeout_override") and not params.get("max_queue_size"))


def write_repository(root: str | Path, name: str, cfg, model_py: str | Path | None = None) -> Path:
    """Write ``root/name/config.pbtxt`` and ``root/name/1/model.py`` (default: the Python
    model of :mod:`schedsim.triton.python_model`); return the model's folder."""
    root = Path(root)
    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(config_text(cfg), encoding="utf-8")
    src = Path(model_py) if model_py else Path(__file__).with_name("python_model.py")
    shutil.copyfile(src, folder / "1" / "model.py")
    return folder
