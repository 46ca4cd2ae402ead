"""The camera feed switch's rules (core.feed_switch)."""

from __future__ import annotations

import pytest

from rynn_teleop.core.feed_switch import FeedSwitch
from rynn_teleop.errors import ConfigurationError


def feed(switch: FeedSwitch, t0: float, t1: float, sources: tuple[str, ...], dt: float = 1 / 30):
    """Frames of ``sources`` every dt in [t0, t1); returns (forwarded source list, watch messages)."""
    forwarded, events = [], []
    t = t0
    while t < t1:
        for s in sources:
            if switch.frame(s, t):
                forwarded.append(s)
        why = switch.watch(t)
        if why:
            events.append((round(t, 3), why))
        t += dt
    return forwarded, events


def test_only_the_active_source_is_forwarded_and_a_switch_is_immediate():
    sw = FeedSwitch("physical", 0.5)
    fwd, _ = feed(sw, 0.0, 1.0, ("physical", "generated"))
    assert set(fwd) == {"physical"}
    assert sw.select("generated", 1.0) and sw.switches == 1
    assert not sw.frame("physical", 1.001) and sw.frame("generated", 1.002)
    assert not sw.select("generated", 1.1)  # already showing it


def test_fallback_shows_the_other_source_while_the_chosen_one_is_silent_and_returns():
    sw = FeedSwitch("generated", 0.3, fallback=True)
    _, events = feed(sw, 0.0, 1.0, ("physical",))  # the generated stream never starts
    assert sw.active == "physical" and sw.preferred == "generated" and sw.fallen_back
    assert len(events) == 1 and "generated silent" in events[0][1]
    _, events = feed(sw, 1.0, 1.2, ("physical", "generated"))  # it starts: not back before it lasted a timeout
    assert sw.active == "physical"
    _, events = feed(sw, 1.2, 2.0, ("physical", "generated"))
    assert sw.active == "generated" and not sw.fallen_back
    assert events and "is back" in events[0][1]


def test_no_automatic_change_within_a_timeout_of_a_switch_and_no_flapping_without_fallback():
    sw = FeedSwitch("physical", 0.3, fallback=True)
    feed(sw, 0.0, 1.0, ("physical",))
    sw.select("generated", 1.0)  # nothing generated yet: the operator's choice gets a timeout to deliver
    _, events = feed(sw, 1.0, 1.25, ("physical",))
    assert sw.active == "generated" and not events
    plain = FeedSwitch("generated", 0.3)
    feed(plain, 0.0, 2.0, ("physical",))
    assert plain.active == "generated" and plain.silent("generated", 2.0)  # reported silent, not replaced


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigurationError):
        FeedSwitch("both", 0.3)
    with pytest.raises(ConfigurationError):
        FeedSwitch("physical", 0.0)
    with pytest.raises(ConfigurationError):
        FeedSwitch("physical", 0.3).select("stereo", 0.0)
