"""Recording demonstrations: rosbag2 (MCAP) episodes with drop accounting (ROS-free).

The recorder node feeds serialized messages (CDR bytes from raw subscriptions)
into an :class:`EpisodeRecorder`; everything here works on bytes, type names
and integer-nanosecond receive times, and never imports rclpy.

Modules: ``writer`` (a bag written by a thread behind a bounded queue, with
MCAP CRCs), ``episodes`` (numbered episode directories, start/stop/discard,
metadata), ``stats`` (counts, rates, gaps, drops), ``metadata``
(``episode.yaml`` and ``metadata.yaml`` custom data), ``mcapfile`` (MCAP
scanning, repair, index), ``integrity`` (whether a file is intact: CRCs,
structure, decoding, stamps; what a damaged one lost), ``recover`` (rebuild a
killed recorder's bag, salvage a damaged one into a new episode, and the
refusal every reader applies first), ``errors`` (the errors and their exit
codes) and ``inspect`` (list, info, check, joint plot, camera preview, and the
``rynn-teleop episodes`` command).
"""

from .episodes import (
    OPERATOR_INPUT_TOPICS,
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
from .errors import DamagedEpisodeError, EpisodeDataError, RecordingError
from .recover import RecoverResult, recover_bag, require_intact, salvage_bag, verify_episode
from .stats import GAP_FACTOR, EpisodeStats, Gap, TopicStats, episode_stats, topic_stats
from .writer import EpisodeWriter, TopicQos

__all__ = [
    "OPERATOR_INPUT_TOPICS",
    "GAP_FACTOR",
    "DamagedEpisodeError",
    "EpisodeDataError",
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
    "require_intact",
    "salvage_bag",
    "software_version",
    "split_at_window",
    "topic_stats",
    "verify_episode",
]
