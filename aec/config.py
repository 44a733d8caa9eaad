"""Engine configuration (`AecConfig`), after Flink's async-state options."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

WatermarkOrder = Literal["serial", "parallel"]
# the serializers ``aec.state.serialization.SERIALIZERS`` names (checked there by a test)
STATE_SERIALIZERS = ("msgpack", "pickle")


@dataclass(frozen=True, slots=True)
class AecConfig:
    """Options of one keyed operator; immutable.

    Attributes (Flink option in brackets):
        async_state: run state access asynchronously through the AEC; False runs the
            same user code synchronously, each record to completion before the next
            (FLIP-425's "synchronous execution with async APIs"; the reference run).
            [``execution.async-state.enabled``]
        in_flight_records_limit: records admitted and unfinished at once, >= 1.
            [``execution.async-state.in-flight-records-limit``]
        buffer_size: active-buffer size that triggers a flush; also the largest
            batch, in requests, >= 1. [``execution.async-state.buffer-size``]
        buffer_timeout: seconds after the first buffered request at which a partial
            batch is flushed, > 0. [``execution.async-state.buffer-timeout``]
        watermark_order: ``"serial"`` (records after a watermark wait until it has
            left; what Flink's state operators use) or ``"parallel"`` (FLIP-425's
            out-of-order epochs). [``AsyncExecutionController`` epoch parallel mode]
        executor_threads: I/O threads for blocking backends, >= 1.
            [``state.backend.forst.executor.read-io-parallelism``]
        max_parallelism: number of key groups, 1..32768. [``pipeline.max-parallelism``]
        state_ordered: advanced. FLIP-425's state-ordered mode: a record's code runs
            at once, before the previous record of its key finished; its first state
            request takes the key, so state requests and the callbacks after them keep
            same-key order, while code before the first state request (and what it
            outputs) may run out of order. Default False: record-ordered.
        state_serializer: how the values of states whose descriptor names no
            serializer are stored: ``"msgpack"`` (default: plain data, decoding
            cannot run code) or ``"pickle"`` (any object; an explicit opt-in, since
            unpickling runs code: trust whoever can write the checkpoint location
            and the store; ``docs/security.md``). [Flink: the state's
            ``TypeSerializer``; Kryo for generic types]
        checkpoints_retained: committed checkpoints ``process_keyed_stream`` keeps per
            partition, >= 2 (the newest and the one a replay of its micro-batch starts
            from); older ones are deleted after each micro-batch's commit, with the
            files no kept checkpoint references (``docs/checkpoints.md``).
            [``state.checkpoints.num-retained``]

    Raises:
        ValueError / TypeError: on construction, naming the option that is out of range.
    """

    async_state: bool = True
    in_flight_records_limit: int = 6000
    buffer_size: int = 1000
    buffer_timeout: float = 1.0
    watermark_order: WatermarkOrder = "serial"
    executor_threads: int = 4
    max_parallelism: int = 128
    state_ordered: bool = False
    state_serializer: str = "msgpack"
    checkpoints_retained: int = 2

    def __post_init__(self) -> None:
        for flag in ("async_state", "state_ordered"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"AecConfig.{flag} must be a bool, got {getattr(self, flag)!r}")
        for name, low, high in (
            ("in_flight_records_limit", 1, None),
            ("buffer_size", 1, None),
            ("executor_threads", 1, None),
            ("max_parallelism", 1, 32768),
            ("checkpoints_retained", 2, None),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"AecConfig.{name} must be an int, got {value!r}")
            if value < low or (high is not None and value > high):
                bound = f">= {low}" if high is None else f"in {low}..{high}"
                raise ValueError(f"AecConfig.{name} must be {bound}, got {value}")
        timeout = self.buffer_timeout
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool):
            raise TypeError(
                f"AecConfig.buffer_timeout must be a number of seconds, got {timeout!r}"
            )
        if not (timeout > 0) or math.isnan(timeout):
            raise ValueError(f"AecConfig.buffer_timeout must be > 0 seconds, got {timeout}")
        if self.state_serializer not in STATE_SERIALIZERS:
            raise ValueError(
                f"AecConfig.state_serializer must be one of {list(STATE_SERIALIZERS)}, "
                f"got {self.state_serializer!r}"
            )
        if self.watermark_order not in ("serial", "parallel"):
            raise ValueError(
                f"AecConfig.watermark_order must be 'serial' or 'parallel', got {self.watermark_order!r}"
            )
