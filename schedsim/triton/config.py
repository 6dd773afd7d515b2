"""Read a Triton model configuration (``config.pbtxt``) into the dynamic policy's settings.

The file is parsed by protobuf's own text-format parser into Triton's own
``ModelConfig`` message (from ``tritonclient[grpc]``), so anything Triton would
refuse to parse is refused here too, with protobuf's line:column. Defaults and
validation follow triton-inference-server/core ``src/model_config_utils.cc``
(``NormalizeModelConfig``, ``NormalizeInstanceGroup``, ``ValidateModelConfig``)
and the field comments in triton-inference-server/common
``protobuf/model_config.proto``.

What a config file cannot tell us is the machine: a ``KIND_GPU`` group without
``gpus`` runs ``count`` instances on *every* visible GPU. We then assume one GPU
and say so in :attr:`TritonBatchingConfig.assumes_one_gpu`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from policies.dynamic import QueuePolicy  # the dynamic policy's own type: one definition

from schedsim.errors import InputError, where

# Backends whose KIND_CPU groups default to 2 instances rather than 1
# (SetDefaultInstanceCount in core src/model_config_utils.cc).
_TWO_CPU_INSTANCE_BACKENDS = ("tensorflow", "onnxruntime")


@dataclass(frozen=True)
class TritonBatchingConfig:
    """The batching-related part of a Triton model configuration, with Triton's defaults applied."""

    source: str
    """The file it was read from, for messages."""
    name: str
    """Model name ('name:'), '' when the file leaves it to the directory name."""
    platform: str
    """'platform:' (e.g. 'tensorrt_plan'), '' when not given."""
    backend: str
    """'backend:' (e.g. 'onnxruntime', 'python'), '' when not given."""
    max_batch_size: int
    """Most samples in one execution; 0 means the model does not batch."""
    has_dynamic_batching: bool
    """Whether the file has a 'dynamic_batching { }' block."""
    preferred_batch_sizes: tuple[int, ...]
    """dynamic_batching.preferred_batch_size as written (may be empty; see effective_preferred_batch_sizes)."""
    max_queue_delay_us: int
    """dynamic_batching.max_queue_delay_microseconds; 0 = never wait for a better batch."""
    preserve_ordering: bool
    """dynamic_batching.preserve_ordering: responses leave in request order."""
    priority_levels: int
    """dynamic_batching.priority_levels; 0 = no priorities."""
    default_priority_level: int
    """Level of requests that name none, in 1..priority_levels (0 when priority_levels is 0)."""
    default_queue_policy: QueuePolicy
    """dynamic_batching.default_queue_policy (Triton's field defaults when absent)."""
    priority_queue_policy: Mapping[int, QueuePolicy]
    """dynamic_batching.priority_queue_policy as written: level -> policy for levels that override the default."""
    instances: int
    """Model instances that take batches: non-passive instance_group counts, KIND_GPU counts times len(gpus)."""
    assumes_one_gpu: bool
    """True when some GPU group lists no 'gpus' (Triton then uses every visible GPU) and one GPU was assumed."""
    prefetch_applies: bool
    """Whether Triton forms batches ahead while every instance is busy (see _triton_prefetches)."""
    instance_groups: tuple[tuple[str, int, tuple[int, ...], bool], ...] = field(default=())
    """Each instance_group as (kind, count after defaults, gpus, passive), for reports."""

    @property
    def effective_preferred_batch_sizes(self) -> tuple[int, ...]:
        """Preferred sizes as Triton's batcher sees them: sorted, unique, [max_batch_size] when none given.

        NormalizeModelConfig fills an empty list with max_batch_size (Triton
        releases before 2021 used [4, 8] instead), and the scheduler keeps them
        in a std::set.
        """
        if self.preferred_batch_sizes:
            return tuple(sorted(set(self.preferred_batch_sizes)))
        if self.has_dynamic_batching and self.max_batch_size > 0:
            return (self.max_batch_size,)
        return ()


def load_triton_config(path) -> TritonBatchingConfig:
    """Parse ``path`` (a Triton ``config.pbtxt``) and return its batching settings.

    Raises :class:`InputError` for a file that cannot be read, text that is not
    a valid ``ModelConfig`` (message ``file:line:col: <protobuf's message>``),
    or values Triton itself would reject when loading the model.
    """
    try:
        from google.protobuf import text_format

        model_config_pb2 = importlib.import_module("tritonclient.grpc.model_config_pb2")
    except ImportError as exc:
        raise InputError(
            f"{where(path)}: reading a Triton config needs tritonclient's protobuf classes "
            f"({exc.name or exc}); run: pip install 'tritonclient[grpc]'"
        ) from None

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where(path)}: cannot read Triton config: {exc}") from None

    msg = model_config_pb2.ModelConfig()
    try:
        # Parse, not Merge: like Triton, refuse a singular field given twice.
        text_format.Parse(text, msg)
    except text_format.ParseError as exc:
        line, col = exc.GetLine(), exc.GetColumn()
        detail = str(exc)
        if line is not None:
            # protobuf prefixes the message with "line:col : "; we put it in our own prefix.
            detail = detail.split(" : ", 1)[-1]
            raise InputError(f"{where(path, line)}:{col}: {detail}") from None
        raise InputError(f"{where(path)}: {detail}") from None

    return _extract(str(path), msg, model_config_pb2)


def _queue_policy(p, pb) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=int(p.max_queue_size),
        default_timeout_us=int(p.default_timeout_microseconds),
        timeout_action=pb.ModelQueuePolicy.TimeoutAction.Name(p.timeout_action),
        allow_timeout_override=bool(p.allow_timeout_override),
    )


def _triton_prefetches(priority_levels: int, default: QueuePolicy) -> bool:
    """Triton's condition for forming batches ahead (payload prefetching).

    From triton-inference-server/core src/scheduler_utils.cc, the
    PriorityQueue constructor that the DynamicBatchScheduler builds its queue with:

        if (priority_levels == 0) {
          ...
          support_prefetching_ =
              (default_policy_.default_timeout_microseconds() == 0) &&
              (!default_policy_.allow_timeout_override()) &&
              (default_policy_.max_queue_size() == 0);
        } else {
          ...
          support_prefetching_ = false;
        }

    src/dynamic_batch_scheduler.cc passes queue_.SupportPrefetching() to
    RateLimiter::PayloadSlotAvailable (src/rate_limiter.cc), which, when true,
    lets up to 2 x instances payloads queue up ("sets cap on the number of
    payloads that can be pre-fetched ... twice the number of model instances"),
    and otherwise waits for an idle instance (WaitForConsumer).

    Only the *default* policy is consulted: with priority_levels == 0 Triton
    ignores priority_queue_policy, and with levels > 0 prefetch is off anyway.
    timeout_action plays no part.
    """
    return (
        priority_levels == 0
        and default.default_timeout_us == 0
        and not default.allow_timeout_override
        and default.max_queue_size == 0
    )


def _extract(source: str, msg, pb) -> TritonBatchingConfig:
    if msg.max_batch_size < 0:
        raise InputError(f"{where(source, field='max_batch_size')}: {msg.max_batch_size} is negative; "
                         "use 0 for a model that does not batch, or a positive limit")

    has_db = msg.HasField("dynamic_batching")
    db = msg.dynamic_batching
    preferred = tuple(int(s) for s in db.preferred_batch_size)
    for size in preferred:
        if size <= 0:
            raise InputError(f"{where(source, field='dynamic_batching.preferred_batch_size')}: "
                             f"{size} is not positive; sizes must be in 1..{msg.max_batch_size}")
        if size > msg.max_batch_size:
            raise InputError(f"{where(source, field='dynamic_batching.preferred_batch_size')}: "
                             f"{size} exceeds max_batch_size {msg.max_batch_size}")

    levels = int(db.priority_levels)
    default_level = int(db.default_priority_level)
    if levels > 0:
        if not 1 <= default_level <= levels:
            raise InputError(f"{where(source, field='dynamic_batching.default_priority_level')}: "
                             f"{default_level} is outside 1..priority_levels ({levels})")
        for level in db.priority_queue_policy:
            if not 1 <= level <= levels:
                raise InputError(f"{where(source, field='dynamic_batching.priority_queue_policy')}: "
                                 f"level {level} is outside 1..priority_levels ({levels})")

    default_policy = _queue_policy(db.default_queue_policy, pb)
    level_policies = {int(k): _queue_policy(v, pb) for k, v in sorted(db.priority_queue_policy.items())}

    # Triton refuses these at load time (ValidateModelConfig): ordering cannot
    # be kept across priority levels or when expired requests are pushed back.
    if db.preserve_ordering:
        if levels > 1:
            raise InputError(f"{where(source, field='dynamic_batching.preserve_ordering')}: "
                             f"true needs at most one priority level, not {levels}")
        for label, qp in [("default_queue_policy", default_policy),
                          *((f"priority_queue_policy[{k}]", v) for k, v in level_policies.items())]:
            if qp.default_timeout_us != 0 and qp.timeout_action == "DELAY":
                raise InputError(f"{where(source, field='dynamic_batching.' + label)}: "
                                 "timeout_action DELAY cannot be used with preserve_ordering true")

    instances, assumes_one_gpu, groups = _instances(msg, pb)

    return TritonBatchingConfig(
        source=source,
        name=msg.name,
        platform=msg.platform,
        backend=msg.backend,
        max_batch_size=int(msg.max_batch_size),
        has_dynamic_batching=has_db,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=int(db.max_queue_delay_microseconds),
        preserve_ordering=bool(db.preserve_ordering),
        priority_levels=levels,
        default_priority_level=default_level,
        default_queue_policy=default_policy,
        priority_queue_policy=MappingProxyType(level_policies),
        instances=instances,
        assumes_one_gpu=assumes_one_gpu,
        prefetch_applies=_triton_prefetches(levels, default_policy),
        instance_groups=groups,
    )


def _backend_name(msg) -> str:
    if msg.backend:
        return msg.backend
    # AutoCompleteBackendFields derives the backend from these platforms.
    if msg.platform.startswith("tensorflow_"):
        return "tensorflow"
    if msg.platform == "onnxruntime_onnx":
        return "onnxruntime"
    return ""


def _instances(msg, pb):
    """Instances that take batches, following NormalizeInstanceGroup.

    model_config.proto: count is "for a group assigned to GPU, the number of
    instances created for each GPU listed in 'gpus'. For a group assigned to
    CPU the number of instances created"; "setting 'gpus' to empty (or not
    specifying at all) is equivalent to listing all available GPUs". No
    instance_group at all means one KIND_AUTO group (GPU when there is one).
    Passive instances are "not added to the scheduler", so they are not counted.
    """
    kinds = pb.ModelInstanceGroup.Kind
    backend = _backend_name(msg)
    groups_pb = list(msg.instance_group) or [pb.ModelInstanceGroup()]
    total, assumed, groups = 0, False, []
    for g in groups_pb:
        kind = kinds.Name(g.kind)
        count = int(g.count)
        if count < 1:  # Triton treats count < 1 as unset (proto3 cannot tell 0 from absent)
            count = 2 if (kind == "KIND_CPU" and backend in _TWO_CPU_INSTANCE_BACKENDS) else 1
        gpus = tuple(int(d) for d in g.gpus)
        groups.append((kind, count, gpus, bool(g.passive)))
        if g.passive:
            continue
        # KIND_AUTO becomes KIND_GPU on a machine with GPUs, which is what we simulate.
        if kind in ("KIND_GPU", "KIND_AUTO"):
            if gpus:
                total += count * len(gpus)
            else:
                total += count
                assumed = True
        else:
            total += count
    return total, assumed, tuple(groups)


def to_policy_kwargs(cfg: TritonBatchingConfig) -> dict:
    """Keyword arguments for the ``dynamic`` policy that reproduce ``cfg``.

    Queue-policy fields come from the default queue policy; ``priority_queue_policy``
    holds only the levels that override it (none when priority_levels is 0,
    since Triton then ignores per-level policies).
    """
    d = cfg.default_queue_policy
    return {
        "max_batch_size": cfg.max_batch_size,
        "preferred_batch_sizes": cfg.effective_preferred_batch_sizes,
        "max_queue_delay_us": cfg.max_queue_delay_us,
        "instances": cfg.instances,
        "prefetch": cfg.prefetch_applies,
        "priority_levels": cfg.priority_levels,
        "default_priority_level": cfg.default_priority_level,
        "preserve_ordering": cfg.preserve_ordering,
        "max_queue_size": d.max_queue_size,
        "default_timeout_us": d.default_timeout_us,
        "timeout_action": d.timeout_action,
        "allow_timeout_override": d.allow_timeout_override,
        "priority_queue_policy": dict(cfg.priority_queue_policy) if cfg.priority_levels > 0 else {},
    }
