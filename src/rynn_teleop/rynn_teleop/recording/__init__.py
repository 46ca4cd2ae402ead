"""Recording demonstrations: rosbag2 (MCAP) episodes with drop accounting (ROS-free).

The recorder node feeds serialized messages (CDR bytes from raw subscriptions)
into an :class:`EpisodeRecorder`; everything here works on bytes, type names
and integer-nanosecond receive times, and never imports rclpy.

Modules: ``writer`` (a bag written by a thread behind a bounded queue),
``episodes`` (numbered episode directories, start/stop/discard, metadata),
``stats`` (counts, rates, gaps, drops), ``metadata`` (``episode.yaml`` and
``metadata.yaml`` custom data), ``mcapfile`` (MCAP scanning, repair, index),
``recover`` (rebuild a killed recorder's bag) and ``inspect`` (list, info,
check, joint plot, camera preview, and the ``rynn-teleop episodes`` command).
"""

from .episodes import (
    OUTCOMES,
    EpisodeMetadata,
    EpisodeProgress,
    EpisodeRecorder,
    EpisodeSummary,
    description_hash,
    episode_dirs,
    next_episode_dir,
    software_version,
    split_at_window,
)
from .errors import RecordingError
from .recover import RecoverResult, recover_bag
from .stats import GAP_FACTOR, EpisodeStats, Gap, TopicStats, episode_stats, topic_stats
from .writer import EpisodeWriter, TopicQos

__all__ = [
    "GAP_FACTOR",
    "OUTCOMES",
    "EpisodeMetadata",
    "EpisodeProgress",
    "EpisodeRecorder",
    "EpisodeStats",
    "EpisodeSummary",
    "EpisodeWriter",
    "Gap",
    "RecordingError",
    "RecoverResult",
    "TopicQos",
    "TopicStats",
    "description_hash",
    "episode_dirs",
    "episode_stats",
    "next_episode_dir",
    "recover_bag",
    "software_version",
    "split_at_window",
    "topic_stats",
]
