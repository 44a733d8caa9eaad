"""A small reference model of Flink's WindowOperator with the default event-time
trigger, written from the window rules of the public contract (not from aec's code), for
tests/test_contract_windows.py.

Semantics modelled (aec's real-second timestamps: a window fires at ``end``):
- a record's windows: tumbling / sliding on the ``offset + floor((t - offset)/size)*size``
  grid, or a session ``[t, t + gap)`` merged with every window it intersects or touches;
- a window with ``end + lateness <= W`` (W: last watermark before the record) is late
  and skipped; a record all of whose windows are late is a late record;
- a non-late window with ``end <= W`` fires at once (late firing, contents kept);
  otherwise it fires when a watermark ``>= end`` arrives, before that watermark leaves,
  a key's windows in order of end; its state goes at ``end + lateness``;
- end of input is ``Watermark(inf)``, emitted last.

Outputs are ``(key, start, end, tuple(sorted(values)))`` and ``Watermark``s.
"""

from __future__ import annotations

import math

from aec import Record, Watermark


class WindowModel:
    def __init__(self, kind, size=None, slide=None, gap=None, lateness=0.0, offset=0.0):
        self.kind, self.size, self.slide, self.gap = kind, size, slide, gap
        self.lateness, self.offset = lateness, offset
        self.outputs = []
        self.late = []
        self.watermark = -math.inf
        self.windows = {}  # key -> {(start, end): [values]}
        self.pending = {}  # key -> set of (start, end) with an on-time firing to come

    def assign(self, t):
        if self.kind == "session":
            return [(t, t + self.gap)]
        slide = self.size if self.kind == "tumbling" else self.slide
        last = self.offset + math.floor((t - self.offset) / slide) * slide
        starts = []
        s = last
        while s > t - self.size:
            starts.append(s)
            s -= slide
        return [(s, s + self.size) for s in starts]

    def _emit(self, key, w):
        self.outputs.append((key, w[0], w[1], tuple(sorted(self.windows[key][w]))))

    def record(self, key, value, t):
        w_now = self.watermark
        windows = self.windows.setdefault(key, {})
        pending = self.pending.setdefault(key, set())
        assigned = self.assign(t)
        if self.kind == "session":
            new = assigned[0]
            merged = [w for w in windows if w[0] <= new[1] and w[1] >= new[0]]
            cover = (min([new[0]] + [w[0] for w in merged]), max([new[1]] + [w[1] for w in merged]))
            if cover[1] + self.lateness <= w_now:
                self.late.append(value)
                return
            values = [v for w in merged for v in windows.pop(w)]
            for w in merged:
                pending.discard(w)
            windows[cover] = values + [value]
            self._place(key, cover)
            return
        live = [w for w in assigned if w[1] + self.lateness > w_now]
        if not live:
            self.late.append(value)
            return
        for w in sorted(live, key=lambda w: w[1]):
            windows.setdefault(w, []).append(value)
            self._place(key, w)

    def _place(self, key, w):
        if w[1] <= self.watermark:
            self._emit(key, w)  # late firing
        else:
            self.pending[key].add(w)

    def advance(self, watermark):
        self.watermark = watermark
        for key, windows in self.windows.items():
            pending = self.pending[key]
            for w in sorted((w for w in pending if w[1] <= watermark), key=lambda w: w[1]):
                self._emit(key, w)
                pending.discard(w)
            for w in [w for w in windows if w[1] + self.lateness <= watermark]:
                del windows[w]
        self.outputs.append(Watermark(watermark))

    def run(self, source):
        for element in source:
            if isinstance(element, Watermark):
                self.advance(element.timestamp)
            else:
                self.record(element.key, element.value, element.timestamp)
        self.advance(math.inf)
        return self.outputs


def segments(outputs):
    """Split at watermarks: ``[(watermark, [(key, start, end, values), ...]), ...]``."""
    parts, current = [], []
    for item in outputs:
        if isinstance(item, Watermark):
            parts.append((item.timestamp, current))
            current = []
        else:
            current.append(item)
    assert current == [], f"outputs after the last watermark: {current}"
    return parts


def assert_matches_model(actual, expected, one_window_per_record=True):
    """Same watermark sequence; between two watermarks, per key: the late firings
    (windows ending at or before the previous watermark) first, in record order (as a
    multiset when a record may fire several windows), then the on-time firings in
    order of end, exactly as the model."""
    got, want = segments(actual), segments(expected)
    assert [w for w, _ in got] == [w for w, _ in want], "watermark sequences differ"
    previous = -math.inf
    for (w, got_items), (_, want_items) in zip(got, want, strict=False):
        keys = {item[0] for item in got_items} | {item[0] for item in want_items}
        for key in keys:
            mine = [i for i in got_items if i[0] == key]
            theirs = [i for i in want_items if i[0] == key]
            late_mine = [i for i in mine if i[2] <= previous]
            late_theirs = [i for i in theirs if i[2] <= previous]
            assert mine[: len(late_mine)] == late_mine, (
                f"key {key!r} before watermark {w}: a late firing after an on-time one: {mine}"
            )
            if one_window_per_record:
                assert late_mine == late_theirs, f"late firings of {key!r} before {w}"
            else:
                assert sorted(late_mine) == sorted(late_theirs), f"late firings of {key!r} before {w}"
            assert mine[len(late_mine):] == theirs[len(late_theirs):], (
                f"on-time firings of key {key!r} at watermark {w}"
            )
        previous = w


def records(pairs):
    """``[(key, value, t) | ('W', t)]`` -> aec elements."""
    out = []
    for item in pairs:
        if item[0] == "W":
            out.append(Watermark(item[1]))
        else:
            out.append(Record(item[0], item[1], timestamp=item[2]))
    return out
