"""``TimeWindow`` as stored state: byte backends pickle windows (a session set) on
every access, so they must round-trip exactly and stay the checked, frozen type."""

from __future__ import annotations

import pickle

import pytest

from aec.windowing import TimeWindow


@pytest.mark.parametrize("window", [TimeWindow(0, 3600), TimeWindow(-1.5, 2.25), TimeWindow(7, 7)])
def test_a_pickled_time_window_comes_back_equal_and_frozen(window):
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps([window, {window: 1}], protocol))
        assert back[0] == window and type(back[0]) is TimeWindow
        assert repr(back[0]) == repr(window) and back[1] == {window: 1}
        with pytest.raises(AttributeError):
            back[0].start = 1  # type: ignore[misc]


def test_a_time_window_pickles_small():
    # by reference to a constructor and two numbers, not the dataclass field state
    assert len(pickle.dumps(TimeWindow(0.0, 3600.0))) < 90
