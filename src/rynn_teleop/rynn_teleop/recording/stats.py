"""Per-topic integrity of an episode: counts, rates, gaps and drops (ROS-free).

Times are integer nanoseconds. Counts, first/last, measured rates and the episode window use *receive times*
(the bag timestamps, one clock per episode). A *gap* is a silence longer than ``GAP_FACTOR`` periods of a
topic whose rate is configured:

* between consecutive messages: on the sorted *header stamps* (capture times; publishers interleaving on one
  topic merge) when the type starts with a std_msgs/Header and every stamp is set, else on receive times.
  Stamps, because a demonstration needs continuous data and receive times carry the subscriber's scheduling
  jitter, which can span several periods of a fast topic with no sample lost. A topic that publishers share
  at different rates measures gaps in periods of its *gap rate* (its fastest publisher's);
* from the episode start to the first message and from the last to the stop: on receive times.

A header-stamp gap keeps its stamps as ``start_ns``/``end_ns`` (``clock == "header"``) and the preceding
message's receive time as ``at_ns``. Topics without a configured rate get no gap detection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

GAP_FACTOR = 3.0
"""A silence longer than this many expected periods is a gap."""

RATE_SHORTFALL = 0.10
"""A measured rate more than this fraction below the expected one is a problem. It catches what gaps cannot:
one of several publishers of a shared topic stopping (the others keep its stream free of gaps), or a source
running slower than configured."""


@dataclass(frozen=True)
class Gap:
    """One silence of a topic, between two times [ns] on ``clock``."""

    start_ns: int  # time of the last message before it (or the episode start)
    end_ns: int  # time of the first message after it (or the episode stop)
    clock: str = "receive"  # "receive": receive times; "header": header stamps (see the module description)
    at_ns: int | None = None  # header gaps: receive time of the message before it (None: start_ns is one)

    @property
    def position_ns(self) -> int:
        """Where the gap starts on the receive clock [ns]."""
        return self.start_ns if self.at_ns is None else self.at_ns

    @property
    def duration_s(self) -> float:
        """Length of the silence [s]."""
        return (self.end_ns - self.start_ns) * 1e-9


@dataclass(frozen=True)
class TopicStats:
    """What one topic delivered during an episode."""

    topic: str
    type_name: str  # e.g. "sensor_msgs/msg/JointState" (several joined by ", " if the type changed)
    received: int  # messages written to the bag
    dropped: int = 0  # messages lost on the way to the bag (never delivered to the recorder, writer queue full...)
    expected_rate_hz: float | None = None  # configured rate [Hz]; None: no expectation, no gap detection
    gap_rate_hz: float | None = None  # rate whose periods measure gaps (fastest publisher); None: expected_rate_hz
    expected: int | None = None  # expected_rate_hz x episode duration, rounded; None without a rate
    rate_hz: float | None = None  # measured: (received - 1) / (last - first) [Hz]; None below 2 messages
    first_ns: int | None = None  # first receive time [ns]
    last_ns: int | None = None  # last receive time [ns]
    gaps: tuple[Gap, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON): times in ns, gaps as [start_ns, end_ns] (receive times) or
        [start_ns, end_ns, "header", at_ns] (header stamps)."""
        return {
            "type": self.type_name,
            "received": self.received,
            "dropped": self.dropped,
            "expected_rate_hz": self.expected_rate_hz,
            "gap_rate_hz": self.gap_rate_hz,
            "expected": self.expected,
            "rate_hz": None if self.rate_hz is None else round(self.rate_hz, 3),
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "gaps": [[g.start_ns, g.end_ns] if g.clock == "receive" else [g.start_ns, g.end_ns, g.clock, g.at_ns]
                     for g in self.gaps],
        }

    @classmethod
    def from_dict(cls, topic: str, d: Mapping[str, Any]) -> TopicStats:
        """Inverse of :meth:`to_dict`."""
        return cls(
            topic=topic,
            type_name=str(d.get("type", "")),
            received=int(d.get("received", 0)),
            dropped=int(d.get("dropped", 0)),
            expected_rate_hz=d.get("expected_rate_hz"),
            gap_rate_hz=d.get("gap_rate_hz"),
            expected=d.get("expected"),
            rate_hz=d.get("rate_hz"),
            first_ns=d.get("first_ns"),
            last_ns=d.get("last_ns"),
            gaps=tuple(
                Gap(int(g[0]), int(g[1]), *((str(g[2]), None if g[3] is None else int(g[3])) if len(g) > 2 else ()))
                for g in d.get("gaps", ())
            ),
        )


class SequenceGaps:
    """Messages published but never received, from each publisher's sequence numbers.

    ``observe`` is called with every message taken, in take order; a sequence number more than one past the
    newest seen from the same publisher on the same topic means the numbers between were lost (a best-effort
    loss, a full subscription queue). Not seen: losses before a publisher's first message received and after
    its last. A sequence number at or below the newest (a repaired reliable message) counts nothing.
    """

    def __init__(self) -> None:
        self._newest: dict[tuple[str, bytes], int] = {}  # (topic, publisher GID) -> newest sequence number

    def observe(self, topic: str, publisher: bytes, sequence: int | None) -> int:
        """The messages lost just before this one (0 if none, or if the middleware gave no sequence)."""
        if sequence is None:
            return 0
        key = (topic, publisher)
        last = self._newest.get(key)
        if last is None or sequence > last:
            self._newest[key] = sequence
        return sequence - last - 1 if last is not None and sequence > last + 1 else 0


def parse_topic_rates(entries: Iterable[str]) -> dict[str, float]:
    """``["/joint_states=200", ...]`` (``TOPIC=HZ``) -> {topic: rate [Hz]}.

    Raises:
        ValueError: an entry without an absolute topic name or a rate in (0, 10000] Hz.
    """
    out = {}
    for entry in entries:
        topic, _, rate = entry.partition("=")
        try:
            value = float(rate)
        except ValueError:
            value = float("nan")
        if not topic.strip().startswith("/") or not 0.0 < value <= 10000.0:
            raise ValueError(f"{entry!r}: expected TOPIC=HZ with an absolute topic name and a rate in (0, 10000] Hz, "
                             "e.g. /joint_states=200")
        out[topic.strip()] = value
    return out


def topic_stats(
    topic: str,
    type_name: str,
    times_ns: Iterable[int] | np.ndarray,
    *,
    start_ns: int,
    stop_ns: int,
    expected_rate_hz: float | None = None,
    dropped: int = 0,
    gap_factor: float = GAP_FACTOR,
    stamps_ns: Iterable[int] | np.ndarray | None = None,
    gap_rate_hz: float | None = None,
) -> TopicStats:
    """Counts, measured rate and gaps of one topic over the episode [start_ns, stop_ns].

    Args:
        times_ns: receive times [ns] of the messages written, any order.
        start_ns, stop_ns: the episode's start and stop [ns], same clock.
        expected_rate_hz: configured rate [Hz] (> 0) or None (no gap detection).
        dropped: messages lost on the way to the bag on this topic.
        gap_factor: a silence longer than this many periods of the gap rate is a gap.
        stamps_ns: header stamps [ns] of the same messages in the same order as ``times_ns``
            (0: unset), or None for a type without a header. Gaps between messages use them
            when all are set, receive times otherwise (see the module description).
        gap_rate_hz: the rate of the topic's fastest publisher when several share it [Hz]
            (None: ``expected_rate_hz``); only with an expected rate.
    """
    t = _int64(times_ns)
    order = np.argsort(t, kind="stable")
    t = t[order]
    n = int(t.size)
    stamps = None if stamps_ns is None else _int64(stamps_ns)
    if stamps is not None and (stamps.size != n or not np.all(stamps != 0)):
        stamps = None  # unset stamps (or a mismatch): receive times for the whole topic
    duration_ns = max(0, stop_ns - start_ns)
    rate = float((n - 1) / ((t[-1] - t[0]) * 1e-9)) if n >= 2 and t[-1] > t[0] else None
    expected = None
    gaps: tuple[Gap, ...] = ()
    if expected_rate_hz:
        expected = round(expected_rate_hz * duration_ns * 1e-9)
        if n:
            limit_ns = gap_factor * 1e9 / (gap_rate_hz or expected_rate_hz)
            found: list[Gap] = []
            if t[0] - start_ns > limit_ns:
                found.append(Gap(int(start_ns), int(t[0])))
            if stamps is None:
                found += [Gap(int(t[i]), int(t[i + 1])) for i in np.nonzero(np.diff(t) > limit_ns)[0]]
            else:
                by_stamp = np.argsort(stamps[order], kind="stable")
                s = stamps[order][by_stamp]
                found += [
                    Gap(int(s[i]), int(s[i + 1]), "header", int(t[by_stamp[i]]))
                    for i in np.nonzero(np.diff(s) > limit_ns)[0]
                ]
            if stop_ns - t[-1] > limit_ns:
                found.append(Gap(int(t[-1]), int(stop_ns)))
            gaps = tuple(found)
    return TopicStats(
        topic=topic,
        type_name=type_name,
        received=n,
        dropped=int(dropped),
        expected_rate_hz=float(expected_rate_hz) if expected_rate_hz else None,
        gap_rate_hz=float(gap_rate_hz) if gap_rate_hz and expected_rate_hz else None,
        expected=expected,
        rate_hz=rate,
        first_ns=int(t[0]) if n else None,
        last_ns=int(t[-1]) if n else None,
        gaps=gaps,
    )


def _int64(values: Iterable[int] | np.ndarray) -> np.ndarray:
    return np.asarray(values if isinstance(values, np.ndarray) else list(values), dtype=np.int64)


@dataclass(frozen=True)
class EpisodeStats:
    """Integrity of a whole episode: one :class:`TopicStats` per topic seen or configured."""

    start_ns: int  # episode start [ns] (receive-time clock)
    stop_ns: int  # episode stop [ns]
    topics: dict[str, TopicStats] = field(default_factory=dict)  # by topic name, sorted
    missing: tuple[str, ...] = ()  # configured topics that never delivered a message

    @property
    def duration_s(self) -> float:
        """Episode length [s]."""
        return max(0, self.stop_ns - self.start_ns) * 1e-9

    @property
    def message_count(self) -> int:
        """Messages written over all topics."""
        return sum(s.received for s in self.topics.values())

    def problems(self) -> list[str]:
        """One line per integrity problem: missing topics, gaps, drops, rates short of the expected ones.
        Empty when clean."""
        out = [f"{topic}: configured but never received" for topic in self.missing]
        for s in self.topics.values():
            if s.gaps:
                longest = max(s.gaps, key=lambda g: g.duration_s)
                gap_rate = s.gap_rate_hz or s.expected_rate_hz
                out.append(
                    f"{s.topic}: {len(s.gaps)} gap(s) longer than {GAP_FACTOR:g} periods of {gap_rate:g} Hz, "
                    f"longest {longest.duration_s:.3f} s at +{(longest.position_ns - self.start_ns) * 1e-9:.3f} s"
                    + (" (header stamps)" if longest.clock == "header" else "")
                )
            if s.dropped:
                out.append(f"{s.topic}: {s.dropped} message(s) published but not recorded (dropped)")
            if s.expected_rate_hz and s.rate_hz is not None and s.rate_hz < (1.0 - RATE_SHORTFALL) * s.expected_rate_hz:
                out.append(f"{s.topic}: {s.rate_hz:.1f} Hz, more than {RATE_SHORTFALL:.0%} below the expected "
                           f"{s.expected_rate_hz:g} Hz")
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (YAML/JSON)."""
        return {
            "start_ns": self.start_ns,
            "stop_ns": self.stop_ns,
            "duration_s": round(self.duration_s, 6),
            "missing_topics": list(self.missing),
            "topics": {name: s.to_dict() for name, s in self.topics.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EpisodeStats:
        """Inverse of :meth:`to_dict`."""
        return cls(
            start_ns=int(d["start_ns"]),
            stop_ns=int(d["stop_ns"]),
            topics={name: TopicStats.from_dict(name, s) for name, s in (d.get("topics") or {}).items()},
            missing=tuple(d.get("missing_topics") or ()),
        )


def episode_stats(
    received: Mapping[str, tuple[str, Iterable[int] | np.ndarray]],
    *,
    start_ns: int,
    stop_ns: int,
    expected_rates: Mapping[str, float | None] | None = None,
    dropped: Mapping[str, int] | None = None,
    gap_factor: float = GAP_FACTOR,
    stamps: Mapping[str, Iterable[int] | np.ndarray | None] | None = None,
    gap_rates: Mapping[str, float | None] | None = None,
) -> EpisodeStats:
    """Integrity of an episode from what each topic delivered.

    Args:
        received: topic -> (type name, receive times [ns]) of the messages written.
        start_ns, stop_ns: the episode's start and stop [ns].
        expected_rates: the configured topics -> rate [Hz] or None. A configured
            topic absent from ``received`` and ``dropped`` is reported missing.
        dropped: topic -> messages the recorder lost.
        gap_factor: see :func:`topic_stats`.
        stamps: topic -> header stamps [ns] in the order of its receive times in ``received``
            (0: unset), for topics whose type starts with a std_msgs/Header; see :func:`topic_stats`.
        gap_rates: topic -> its fastest publisher's rate [Hz] where several publishers share it.
    """
    expected_rates = dict(expected_rates or {})
    stamps = dict(stamps or {})
    dropped = dict(dropped or {})
    names = sorted(set(received) | {t for t, n in dropped.items() if n})
    topics = {}
    for name in names:
        type_name, times = received.get(name, ("", ()))
        topics[name] = topic_stats(
            name,
            type_name,
            times,
            start_ns=start_ns,
            stop_ns=stop_ns,
            expected_rate_hz=expected_rates.get(name),
            dropped=dropped.get(name, 0),
            gap_factor=gap_factor,
            stamps_ns=stamps.get(name),
            gap_rate_hz=(gap_rates or {}).get(name),
        )
    missing = tuple(sorted(t for t in expected_rates if t not in topics))
    return EpisodeStats(start_ns=start_ns, stop_ns=stop_ns, topics=topics, missing=missing)
