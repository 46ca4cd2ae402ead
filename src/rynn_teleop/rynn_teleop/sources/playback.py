"""Replaying recorded sessions: finding and opening the bag, and the playback clock (tracker and hand replays)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path

import numpy as np

from ..errors import ConfigurationError


class Playback:
    """Maps recorded sample times onto playback times.

    Sample ``i`` of pass ``p`` is due at
    ``t0 + (p * period + rel[i]) / rate_scale``: the first recorded sample
    plays at ``t0``, intervals shrink by ``rate_scale``, and with ``loop`` each
    pass starts ``period`` recorded seconds after the previous one (so playback
    time never goes backwards).
    """

    def __init__(self, rel: np.ndarray, period: float, t0: float, rate_scale: float, loop: bool) -> None:
        """
        Args:
            rel: (n,) recorded times relative to the first sample [s], sorted.
            period: recorded length of one pass, loop spacing included [s].
            t0: playback time of the first sample [s].
            rate_scale: playback speed factor (2 = twice as fast).
            loop: start again after the last sample.
        """
        self.rel = np.asarray(rel, dtype=float)
        self.period = float(period)
        self.t0 = float(t0)
        self.rate_scale = float(rate_scale)
        self.loop = loop
        self.index = 0  # next sample
        self.passes = 0  # loop pass of the next sample

    def due(self, now: float) -> list[tuple[int, float]]:
        """(recorded index, playback stamp [s]) of every sample due at ``now`` [s] not returned yet, in order."""
        out: list[tuple[int, float]] = []
        n = len(self.rel)
        while self.index < n:
            stamp = self.t0 + (self.passes * self.period + float(self.rel[self.index])) / self.rate_scale
            if stamp > now:
                break
            out.append((self.index, stamp))
            self.index += 1
            if self.index == n and self.loop:
                self.index = 0
                self.passes += 1
        return out

    @property
    def finished(self) -> bool:
        """True once every sample was returned (never while looping)."""
        return not self.loop and self.index >= len(self.rel)


class ReplayTiming:
    """``duration`` and ``finished`` of a replay source that keeps recorded times ``_rel`` and a ``_playback``."""

    _rel: np.ndarray
    _playback: Playback | None

    @property
    def duration(self) -> float:
        """Recorded span [s] between the first and last replayed samples (0 before start)."""
        return float(self._rel[-1]) if self._rel.size else 0.0

    @property
    def finished(self) -> bool:
        """True once every sample was returned (never while looping)."""
        return self._playback is not None and self._playback.finished


def loop_period(rel: np.ndarray, channels: Sequence[Hashable], default_spacing: float = 0.01) -> float:
    """Recorded length of one loop pass [s]: the last sample's time plus one sample spacing.

    The spacing is the median interval between consecutive samples of the same
    channel (tracker role, hand side), so a loop restarts as the recording
    would have continued; ``default_spacing`` [s] when no channel has two samples.

    Args:
        rel: (n,) recorded times relative to the first sample [s], sorted.
        channels: (n,) the channel of each sample.
    """
    rel = np.asarray(rel, dtype=float)
    by_channel: dict[Hashable, list[int]] = {}
    for i, channel in enumerate(channels):
        by_channel.setdefault(channel, []).append(i)
    gaps = np.concatenate([np.diff(rel[idx]) for idx in by_channel.values()] or [np.empty(0)])
    gaps = gaps[gaps > 0]
    return float(rel[-1]) + (float(np.median(gaps)) if gaps.size else default_spacing)


def bag_directory(path: Path, what: str) -> Path:
    """The rosbag2 directory of ``path`` (the folder, its metadata.yaml or a storage file).

    Raises ConfigurationError naming ``what`` (e.g. "replay hand source") when it is missing or not a bag.
    """
    path = Path(path).expanduser()
    if path.is_file() and (path.name == "metadata.yaml" or path.suffix in (".mcap", ".db3")):
        path = path.parent
    if not path.exists():
        raise ConfigurationError(f"{what}: rosbag2 directory {str(path)!r} does not exist")
    if not (path / "metadata.yaml").is_file():
        raise ConfigurationError(f"{what}: {str(path)!r} is not a rosbag2 directory (no metadata.yaml in it)")
    return path


def open_bag(bag: Path, what: str):
    """An opened ``rosbags`` AnyReader on ``bag`` (ROS 2 Jazzy types); ConfigurationError naming ``what``
    (also for a bag whose MCAP file is damaged: :func:`~rynn_teleop.recording.recover.refuse_damaged`)."""
    from rosbags.highlevel import AnyReader  # only replays need rosbags
    from rosbags.typesys import Stores, get_typestore

    from ..recording.recover import refuse_damaged

    refuse_damaged(bag, what)
    try:
        reader = AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_JAZZY))
        reader.open()
    except Exception as exc:  # rosbags raises its own reader errors for broken bags
        raise ConfigurationError(f"{what}: cannot open rosbag2 {str(bag)!r}: {exc}") from exc
    return reader
