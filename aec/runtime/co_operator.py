"""KeyedCoProcessOperator: two keyed inputs in one key space (Flink's
``KeyedCoProcessOperator`` / ``AsyncKeyedCoProcessOperator``).

A ``KeyedProcessOperator`` whose records say which input they came from
(``RecordContext.input``): records of both inputs go through the same AEC, so
same-key order, buffers, back-pressure and epochs hold across both inputs. What
is its own:

- the entry a record calls: ``process_element1`` or ``process_element2``
  (``aec.runtime.user_code.CoEntryRunner``);
- the watermark: each input has its own, never regressing; the operator's is
  their minimum (-inf until both sent one), and only when that minimum advances
  does an epoch close (timers fire, the watermark is emitted). Flink:
  ``AbstractStreamOperator.processWatermark1/2`` with ``combinedWatermark``;
- checkpoints carry both inputs' watermarks (``OperatorState.input_watermarks``);
  a restore from several checkpoints takes, per input, the minimum
  (``aec.runtime.operator_rescale``);
- a function's mini-batch (``open_co_bundle()``: ``aec.runtime.bundle``, with
  ``offer_input(input, key, value, timestamp, watermark)`` in place of ``offer``) is
  offered each record with its input; the operator's bundling does the rest.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from aec.checkpoint.files import OperatorState
from aec.clock import Clock
from aec.config import AecConfig
from aec.elements import Record, Time, Watermark, check_timestamp
from aec.errors import describe
from aec.functions import KeyedCoProcessFunction, check_function_kind
from aec.keygroups import KeyGroupRange
from aec.native import mypyc_attr
from aec.runtime.bundle import BundleContext, BundleFlusher
from aec.runtime.executor import StateExecutor
from aec.runtime.operator import KeyedProcessOperator
from aec.runtime.user_code import CoEntryRunner

if TYPE_CHECKING:
    from aec.state.backend import StateBackend

INPUTS = (1, 2)


@mypyc_attr(allow_interpreted_subclasses=True)
class KeyedCoProcessOperator(KeyedProcessOperator):
    """Runs a ``KeyedCoProcessFunction`` over two keyed inputs with state in ``backend``.

    Arguments as ``KeyedProcessOperator``'s (``function`` must be a
    ``KeyedCoProcessFunction``). Input 1: ``process1(record)``,
    ``process_watermark1(w)``; input 2: ``process2``, ``process_watermark2``;
    ``process_input(n, element)`` takes either. Every other method is
    ``KeyedProcessOperator``'s (``open``, ``snapshot``, ``restore``, ``finish``,
    ``drain_outputs``, ``drain_side_outputs``, ``metrics``, ``close``);
    ``finish()`` ends both inputs (``Watermark(math.inf)``).

    Raises:
        TypeError: ``function`` is not a ``KeyedCoProcessFunction`` (a
            ``KeyedProcessFunction`` runs on ``KeyedProcessOperator``);
            ``process``/``process_watermark`` (which input?).
    """

    __slots__ = ("_input_watermarks", "offering")
    inputs = 2
    entry_runner = CoEntryRunner

    def __init__(
        self,
        function: KeyedCoProcessFunction,
        backend: StateBackend,
        config: AecConfig | None = None,
        executor: StateExecutor | None = None,
        clock: Clock | None = None,
        *,
        key_group_range: KeyGroupRange | None = None,
    ) -> None:
        base: Any = function  # the base checks the kind (_check_function) first
        super().__init__(base, backend, config, executor, clock, key_group_range=key_group_range)
        self._input_watermarks: list[Time] = [-math.inf, -math.inf]  # last watermark of each input
        self.offering = 0  # the input of the record being offered to the bundle

    def _check_function(self, function: object) -> None:  # compiled, a static one binds early
        """Raise TypeError unless ``function`` is a ``KeyedCoProcessFunction``."""
        check_function_kind(function, KeyedCoProcessFunction, "KeyedCoProcessOperator")

    def open(self) -> None:
        """``KeyedProcessOperator.open``; then the function's two-input mini-batch
        (``open_co_bundle()``), if any."""
        fresh = self.status == "new"
        super().open()
        make_bundle = getattr(self.function, "open_co_bundle", None)
        if not fresh or make_bundle is None:  # offered only to runs that may bundle
            return
        try:
            inner = make_bundle()
        except BaseException as exc:
            self._raise_failure(exc)
        if inner is not None:
            bundle = _InputBundle(inner, self)
            self._bundles = BundleFlusher(bundle, self.controller, self._bundle_context)
            self.entries.bundle = bundle

    # -- input ---------------------------------------------------------------------------------
    def process1(self, record: Record) -> None:
        """Admit one record of input 1 (as ``KeyedProcessOperator.process``)."""
        _check_record(record)
        unchecked: Any = record  # compiled, a field read through Any is not type-checked first
        self.process_fields(unchecked.key, unchecked.value, unchecked.timestamp, 1)

    def process2(self, record: Record) -> None:
        """Admit one record of input 2 (as ``KeyedProcessOperator.process``)."""
        _check_record(record)
        unchecked: Any = record  # compiled, a field read through Any is not type-checked first
        self.process_fields(unchecked.key, unchecked.value, unchecked.timestamp, 2)

    def process_watermark1(self, watermark: Watermark) -> None:
        """Input 1's watermark; see ``process_input_watermark``."""
        self.process_input_watermark(1, watermark)

    def process_watermark2(self, watermark: Watermark) -> None:
        """Input 2's watermark; see ``process_input_watermark``."""
        self.process_input_watermark(2, watermark)

    def process_input(self, input: int, element: object) -> None:
        """A record or watermark of input ``input`` (1 or 2).

        Raises TypeError for anything else (as ``process1``... do for bad elements).
        """
        unchecked: Any = element  # compiled, a field read through Any is not type-checked first
        if type(element) is Record:
            self.process_fields(unchecked.key, unchecked.value, unchecked.timestamp, input)
        elif isinstance(element, Watermark):
            self.process_input_watermark(input, element)
        else:
            raise TypeError(f"expected an aec.Record or aec.Watermark, got {describe(element)}")

    def process_fields(
        self, key: Hashable, value: object, timestamp: Time | None, input: int = 0
    ) -> None:
        """``KeyedProcessOperator.process_fields`` for input ``input`` (1 or 2; the
        Spark glue's per-row call). Raises ValueError for another input number, or for
        a record of an input that ended (its ``Watermark(math.inf)`` arrived)."""
        if input != 1 and input != 2:
            raise ValueError(f"a KeyedCoProcessOperator has inputs 1 and 2, got {input!r}")
        if self._input_watermarks[input - 1] == math.inf and self._state == "open":
            # a bad key or timestamp is named first, as on any record
            self._checked_key_group(key)
            if timestamp is not None:
                check_timestamp(timestamp)
            raise ValueError(
                f"a record of input {input} arrived after that input's Watermark(inf), its "
                "end: no record of an input may follow its final watermark"
            )
        self.offering = input
        super().process_fields(key, value, timestamp, input)

    def process(self, record: Record) -> None:
        """Always TypeError: a two-input operator takes ``process1`` or ``process2``."""
        raise TypeError("a KeyedCoProcessOperator has two inputs: use process1 or process2")

    def process_watermark(self, watermark: Watermark) -> None:
        """Always TypeError: a two-input operator takes ``process_watermark1`` or ``2``."""
        raise TypeError(
            "a KeyedCoProcessOperator has two inputs: use process_watermark1 or process_watermark2"
        )

    def process_input_watermark(self, input: int, watermark: Watermark) -> None:
        """Input ``input``'s watermark. The operator's watermark is the minimum of the
        inputs' latest (-inf while one has sent none); when that minimum advances, the
        epoch closes as on a ``KeyedProcessOperator.process_watermark`` (timers fire,
        the minimum is emitted; serial order waits until it left). Like every input
        element it reads the processing-time clock (due processing-time timers fire).

        Raises:
            TypeError: not a ``Watermark``, or a timestamp that is not a number.
            ValueError: NaN, a watermark below this input's previous one, or an input
                other than 1 and 2.
            JobFailure: user code or the backend failed.
        """
        if input != 1 and input != 2:
            raise ValueError(f"a KeyedCoProcessOperator has inputs 1 and 2, got {input!r}")
        if not isinstance(watermark, Watermark):
            raise TypeError(
                f"expected an aec.Watermark for input {input}, got {type(watermark).__name__}"
            )
        unchecked: Any = watermark  # compiled, a field read through Any is not type-checked first
        timestamp = unchecked.timestamp
        if timestamp is None:
            raise TypeError(f"watermark timestamp of input {input} must be a number, got None")
        check_timestamp(timestamp, f"watermark timestamp of input {input}")
        previous = self._input_watermarks[input - 1]
        if timestamp < previous:
            raise ValueError(
                f"watermark {timestamp!r} of input {input} arrived after {previous!r}: "
                "an input's watermarks must not go backwards"
            )
        self._require_open()
        self._restorable = False
        self._input_watermarks[input - 1] = timestamp
        combined = min(self._input_watermarks)
        if combined > self._watermark:
            super().process_watermark(Watermark(combined))  # reads the clock too
        elif self._poll:  # an input element reads the clock, advancing or not
            try:
                self._poll_clock()
            except BaseException as exc:
                self._raise_failure(exc)

    @property
    def current_watermark(self) -> float | int:
        """The operator's watermark: the minimum of the inputs' (seconds; -inf before)."""
        watermark: float | int = self._watermark
        return watermark

    @property
    def input_watermarks(self) -> tuple[float | int, float | int]:
        """The latest watermark of input 1 and of input 2 (-inf: none yet)."""
        first, second = self._input_watermarks
        return first, second

    def finish(self) -> None:
        """End of both inputs: ``KeyedProcessOperator.finish`` (``Watermark(math.inf)``)."""
        super().finish()
        self._input_watermarks = [math.inf, math.inf]

    # -- checkpoints ---------------------------------------------------------------------------
    def _checkpoint_state(self, in_flight: bytes = b"") -> OperatorState:
        state = super()._checkpoint_state(in_flight)
        return dataclasses.replace(state, input_watermarks=tuple(self._input_watermarks))

    def _apply_restored(self, state: OperatorState) -> None:
        super()._apply_restored(state)
        self._input_watermarks = list(state.input_watermarks or (-math.inf, -math.inf))


class _InputBundle:
    """The function's two-input bundle seen as an ``aec.runtime.bundle.Bundle``: the
    operator's ``offer`` passes on the input of the record it offers."""

    __slots__ = ("inner", "operator")

    def __init__(self, inner: Any, operator: KeyedCoProcessOperator) -> None:
        self.inner = inner
        self.operator = operator

    @property
    def size(self) -> int:
        size: int = self.inner.size
        return size

    def offer(
        self, key: Hashable, value: object, timestamp: float | int | None, watermark: float | int
    ) -> bool:
        offered: bool = self.inner.offer_input(
            self.operator.offering, key, value, timestamp, watermark
        )
        return offered

    def take(self, watermark: float | int) -> list[tuple[Hashable, object, int]]:
        taken: list[tuple[Hashable, object, int]] = self.inner.take(watermark)
        return taken

    def fold(self, share: object, context: BundleContext, ctx: Any) -> None:
        self.inner.fold(share, context, ctx)


def co_element(item: Any, position: int) -> tuple[int, Record | Watermark]:
    """``item`` of a two-input source as ``(input, element)``.

    Raises TypeError naming ``position`` unless ``item`` is a pair (tuple or list)
    ``(1 | 2, Record | Watermark)``.
    """
    if type(item) in (tuple, list) and len(item) == 2:
        input, element = item
        # exactly a Record (as process_input takes), or a Watermark
        if type(input) is int and input in INPUTS and (
            type(element) is Record or isinstance(element, Watermark)
        ):
            return input, element
    raise TypeError(
        f"source element #{position} must be a pair (1 or 2, aec.Record or aec.Watermark), "
        f"got {describe(item)}"
    )


def _check_record(record: Any) -> None:
    if type(record) is not Record:
        raise TypeError(f"expected an aec.Record, got {type(record).__name__}")
