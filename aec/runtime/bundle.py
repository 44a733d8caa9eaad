"""Mini-batches ("bundles") of records a function folds later, per key (Flink SQL's
mini-batch aggregation: ``MapBundleFunction`` with a ``BundleTrigger``).

A function may offer the operator a ``Bundle`` (``open_bundle()``, called once after
``open``). The operator then hands each record that passed its input checks to
``Bundle.offer`` first; a record the bundle accepts never becomes a ``RecordContext``
of its own: no key accounting, no state request of its own. The bundle gives its
records back per key (``take``) before the time they could be observed, and each
key's share is folded into state by one ``BundleContext``: a derived context of
that key (like a firing timer's) that waits for the key's in-flight records, makes
its requests through the AEC like any record and counts in the open epoch.

Which records a bundle may accept, and when it must give them back, is the
function's contract (see ``aec.windowing.bundles``): the operator only asks
for what is due before each watermark leaves, everything before a snapshot,
at the end of input and when ``Bundle.size`` reaches ``BUNDLE_LIMIT``. A function
offers a bundle only to runs where nothing can observe its records before their fold:
asynchronous, serial watermark order, record order (a flush context holds its key);
the synchronous run stays per record, the reference (``aec.windowing.path``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol

from aec.elements import Time
from aec.errors import describe
from aec.runtime.record_context import RecordContext

if TYPE_CHECKING:
    from aec.functions import Context
    from aec.runtime.controller import AsyncExecutionController
    from aec.runtime.epochs import Epoch

BUNDLE_LIMIT = 10_000  # records held before the bundle is folded whatever the time


class Bundle(Protocol):
    """What the operator asks of a function's bundle (mailbox thread only)."""

    @property
    def size(self) -> int:
        """Records held now."""
        ...

    def offer(
        self, key: Hashable, value: object, timestamp: Time | None, watermark: Time
    ) -> bool:
        """Take a record (``watermark``: the operator's current one, seconds); False
        to let it run as a record of its own. Never raises."""
        ...

    # the share is Any: each bundle has its own share type, which an ``object`` parameter
    # of ``fold`` would refuse (a protocol's parameters are contravariant)
    def take(self, watermark: Time) -> list[tuple[Hashable, Any, int]]:
        """Remove and return ``(key, share, records)`` for what must be in state
        before ``watermark`` leaves (``math.inf``: everything), one entry per key."""
        ...

    def fold(self, taken: Any, context: BundleContext, ctx: Context) -> None:
        """Fold one key's share (``taken``: what ``take`` gave for it) into state as
        the entry of ``context`` (``ctx``: the operator's ``aec.Context``). On a user
        function's error it sets ``context.value`` to the record whose value raised,
        then raises."""
        ...


class BundledRecords:
    """``BundleContext.value`` until a record is blamed: how messages name the flush."""

    __slots__ = ("records",)

    def __init__(self, records: int) -> None:
        self.records = records

    def __repr__(self) -> str:
        return f"<{self.records} bundled record(s)>"


class BundleContext(RecordContext):
    """The derived context folding one key's share of a bundle (``share``).

    ``firing``: while the fold fires a window its timer would have fired (a flush at a
    watermark), that timer's time (event time, seconds), else None: a failure then
    names the timer, as the window's firing by its timer would."""

    __slots__ = ("share", "firing")

    def __init__(
        self,
        share: object,
        records: int,
        key: Hashable,
        key_group: int,
        sequence: int,
        epoch: Epoch,
        watermark: Time,
        on_finished: Callable[[RecordContext], None],
        processing_time: Time,
    ) -> None:
        super().__init__(
            BundledRecords(records), key, key_group, None, sequence, epoch, watermark,
            on_finished, None, processing_time,
        )  # fmt: skip
        self.share = share
        self.firing: Time | None = None

    def describe(self) -> str:
        if self.firing is not None:
            return f"event-time timer@{self.firing!r} of key {describe(self.key)}"
        if type(self.value) is BundledRecords:
            return f"{self.value!r} of key {describe(self.key)}"
        return super().describe()

    def named(self) -> object:
        return super().named() if self.firing is None else f"timer@{self.firing!r}"


class BundleFlusher:
    """Folds the function's bundle into state for ``KeyedProcessOperator`` (its
    collaborator; the operator offers records in ``process`` and runs each fold as
    the entry of its ``BundleContext``).

    Args:
        bundle: the function's ``Bundle``.
        controller: the AEC that admits the folds.
        new_context: ``(key, share, records) -> BundleContext`` in the open epoch,
            seeing the operator's current watermark and clock reading.
    """

    __slots__ = ("bundle", "_controller", "_new_context")

    def __init__(
        self,
        bundle: Bundle,
        controller: AsyncExecutionController,
        new_context: Callable[[Hashable, object, int], BundleContext],
    ) -> None:
        self.bundle = bundle
        self._controller = controller
        self._new_context = new_context

    def flush(self, watermark: Time) -> None:
        """Fold what the bundle holds that is due at ``watermark`` (inf: all) into
        state: one derived context per key, admitted beyond the in-flight limit like
        a timer firing (it never waits for capacity)."""
        bundle = self.bundle
        if not bundle.size:
            return
        admit, new_context = self._controller.admit, self._new_context
        for key, share, records in bundle.take(watermark):
            admit(new_context(key, share, records), True)
