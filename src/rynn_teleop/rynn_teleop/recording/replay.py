"""Replaying an episode's commands: what is sent and when (ROS-free).

``rynn-teleop episodes replay EPISODE`` sends an episode's recorded arm and hand commands (``/arms/command``,
``/hands/command``) to the drivers again: the twin's (``--twin``: a fresh twin on the episode's scene and
layout, which then judges the task) or a running stack's (the real robot, or a twin that is already running),
always through the drivers' safety layer. This module reads the commands (:func:`load_commands`), refuses an
episode whose joints are not the robot's (:func:`check_joint_names`), and plans the slow approach to the first
command (:func:`approach`); ``nodes.replay`` publishes them, ``rynn_teleop.replay`` is the command.

The sequence: the measured joints move to the first command of every joint at :attr:`ReplayOptions.approach_speed`
(a straight line in joint space, :func:`approach`), held until they arrive (or ``arrive_timeout_s``); then each
command goes out at its recorded receive time (divided by ``speed``), with the names and positions recorded;
then the last command of each topic is held for ``settle_s`` so the scene comes to rest before it is judged.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from rosbags.rosbag2 import Reader

from .cdr import joint_state
from .errors import EpisodeDataError, RecordingError
from .metadata import episode_doc

ARM_COMMAND_TOPIC, HAND_COMMAND_TOPIC = "/arms/command", "/hands/command"
COMMAND_TOPICS = (ARM_COMMAND_TOPIC, HAND_COMMAND_TOPIC)
JOINT_STATE_TYPE = "sensor_msgs/msg/JointState"


class JointNamesMismatchError(EpisodeDataError):
    """An episode commands joints the robot does not have (another robot, or a renamed description).

    Attributes:
        unknown: the commanded names that are not the robot's joints.
        known: the robot's joints.
    """

    def __init__(self, episode: Path, unknown: Sequence[str], known: Sequence[str]) -> None:
        self.unknown, self.known = tuple(unknown), tuple(known)
        shown = ", ".join(self.unknown[:8]) + (f" and {len(self.unknown) - 8} more" if len(self.unknown) > 8 else "")
        super().__init__(f"{episode}: its commands name joints this robot does not have ({shown}); the robot's "
                         f"joints are {', '.join(self.known[:3])} ... {', '.join(self.known[-2:])} "
                         f"({len(self.known)}): not replayed", episode=episode)


class Command(NamedTuple):
    """One recorded command."""

    time: float  # [s] after the episode's first command (its receive time)
    topic: str  # ARM_COMMAND_TOPIC or HAND_COMMAND_TOPIC
    names: tuple[str, ...]
    position: np.ndarray  # (len(names),) [rad]


class CommandTrack(NamedTuple):
    """An episode's commands, in receive order."""

    episode: Path
    commands: tuple[Command, ...]
    twin: Mapping[str, Any] | None  # the twin the episode was recorded on (scene, seed, task), if any

    @property
    def duration(self) -> float:
        """[s] from the first command to the last."""
        return self.commands[-1].time if self.commands else 0.0

    @property
    def joint_names(self) -> tuple[str, ...]:
        """Every joint commanded, in order of first appearance."""
        return tuple(dict.fromkeys(n for c in self.commands for n in c.names))

    def first_pose(self) -> dict[str, float]:
        """Joint -> its first commanded position [rad]."""
        out: dict[str, float] = {}
        for c in self.commands:
            for name, value in zip(c.names, c.position):
                out.setdefault(name, float(value))
        return out

    def last_commands(self) -> list[Command]:
        """The last command of each distinct (topic, names) stream (one per hand on /hands/command)."""
        last: dict[tuple[str, tuple[str, ...]], Command] = {}
        for c in self.commands:
            last[(c.topic, c.names)] = c
        return list(last.values())


class ReplayOptions(NamedTuple):
    """How an episode is replayed (units beside each field)."""

    speed: float = 1.0  # [-] recorded time is divided by this
    approach_speed: float = 0.25  # [rad/s] the largest joint speed of the approach to the first command
    min_approach_s: float = 2.0  # [s] the approach takes at least this long
    arrive_tolerance: float = 0.05  # [rad] every joint within this of the first command: arrived
    arrive_timeout_s: float = 10.0  # [s] after the approach, the replay starts anyway (with a warning)
    settle_s: float = 2.0  # [s] the last commands are held this long after the episode's end
    publish_hz: float = 100.0  # [Hz] rate of the approach and of the hold

    def check(self) -> ReplayOptions:
        """Raise ``RecordingError`` naming the first value out of its range; else return self."""
        bounds = {"speed": (0.05, 4.0), "approach_speed": (0.01, 2.0), "min_approach_s": (0.0, 60.0),
                  "arrive_tolerance": (0.001, 1.0), "arrive_timeout_s": (0.0, 120.0), "settle_s": (0.0, 60.0),
                  "publish_hz": (1.0, 1000.0)}
        for name, (lo, hi) in bounds.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise RecordingError(f"replay {name} = {value:g} is outside [{lo:g}, {hi:g}]")
        return self


def load_commands(episode: str | Path, topics: Sequence[str] = COMMAND_TOPICS) -> CommandTrack:
    """The arm and hand commands of ``episode`` (a directory) in receive order.

    Raises:
        RecordingError: ``episode`` is not a directory.
        EpisodeDataError: the bag cannot be read, or holds no command.
    """
    path = Path(episode)
    if not path.is_dir():
        raise RecordingError(f"{path}: not an episode directory")
    rows: list[tuple[int, str, tuple[str, ...], np.ndarray]] = []
    cache: dict[bytes, tuple[str, ...]] = {}
    try:
        with Reader(path) as reader:
            conns = [c for c in reader.connections if c.topic in topics and c.msgtype == JOINT_STATE_TYPE]
            for conn, t, data in reader.messages(connections=conns) if conns else ():
                _, names, position = joint_state(data, cache)
                rows.append((int(t), conn.topic, names, position.copy()))
    except RecordingError:
        raise
    except Exception as exc:  # rosbags raises its own errors for a bag it cannot read
        raise EpisodeDataError(f"cannot read {path}: {exc}; `rynn-teleop episodes check {path}` verifies it",
                               episode=path) from exc
    if not rows:
        raise EpisodeDataError(f"{path}: no commands to replay (none on {', '.join(topics)})", episode=path)
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    commands = tuple(Command((t - t0) * 1e-9, topic, names, pos) for t, topic, names, pos in rows)
    twin = (episode_doc(path).get("extra") or {}).get("twin")
    return CommandTrack(path, commands, twin if isinstance(twin, Mapping) else None)


def check_joint_names(track: CommandTrack, robot_joints: Sequence[str]) -> None:
    """Refuse ``track`` if it commands a joint that is not one of ``robot_joints``.

    Raises:
        JointNamesMismatchError: naming the unknown joints and the robot's.
    """
    known = set(robot_joints)
    unknown = [n for n in track.joint_names if n not in known]
    if unknown:
        raise JointNamesMismatchError(track.episode, unknown, robot_joints)


class Approach(NamedTuple):
    """A straight line in joint space from ``start`` to ``goal`` over ``duration``."""

    names: tuple[str, ...]
    start: np.ndarray  # (n,) [rad]
    goal: np.ndarray  # (n,) [rad]
    duration: float  # [s]

    def sample(self, t: float) -> np.ndarray:
        """(n,) [rad] at ``t`` [s] after the start (smooth in and out: minimum-jerk timing)."""
        s = min(max(t / self.duration, 0.0), 1.0) if self.duration > 0 else 1.0
        s = s * s * s * (10.0 - 15.0 * s + 6.0 * s * s)
        return self.start + s * (self.goal - self.start)


def approach(measured: Mapping[str, float], goal: Mapping[str, float], options: ReplayOptions) -> Approach:
    """The approach from the ``measured`` joints to ``goal`` (joint -> [rad]; the joints of ``goal``): its
    duration is the largest distance over ``approach_speed`` (times 15/8, the peak of minimum-jerk timing), at
    least ``min_approach_s``.

    Raises:
        RecordingError: a joint of ``goal`` has no measurement.
    """
    names = tuple(goal)
    missing = [n for n in names if n not in measured]
    if missing:
        raise RecordingError(f"replay: no measured position of {', '.join(missing[:6])}"
                             + (" ..." if len(missing) > 6 else "") + ": are their drivers running?")
    start = np.array([measured[n] for n in names], dtype=float)
    end = np.array([goal[n] for n in names], dtype=float)
    far = float(np.max(np.abs(end - start))) if names else 0.0
    duration = max(options.min_approach_s, 15.0 / 8.0 * far / options.approach_speed)
    return Approach(names, start, end, duration)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``episodes replay``."""
    d = ReplayOptions()
    parser.add_argument("episode", type=Path, help="the episode directory")
    parser.add_argument("--twin", action="store_true",
                        help="start a fresh twin with its drivers in this process (the episode's scene and layout "
                             "unless --scene/--seed say otherwise) and report the task's outcome; without it the "
                             "commands go to the drivers already running (the robot, or a running twin)")
    parser.add_argument("--scene", help="the twin's scene (default: the episode's, else pick_place)")
    parser.add_argument("--seed", type=int, help="the twin's layout (default: the episode's, else 0)")
    parser.add_argument("--speed", type=float, default=d.speed, help=f"replay speed factor (default {d.speed:g})")
    parser.add_argument("--approach-speed", type=float, default=d.approach_speed,
                        help=f"largest joint speed of the approach to the first command [rad/s] "
                             f"(default {d.approach_speed:g})")
    parser.add_argument("--settle", type=float, default=d.settle_s,
                        help=f"the last commands are held this long before the outcome is read [s] "
                             f"(default {d.settle_s:g})")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")


def options_from(args: argparse.Namespace) -> ReplayOptions:
    """The :class:`ReplayOptions` of parsed arguments (checked)."""
    return ReplayOptions(speed=args.speed, approach_speed=args.approach_speed, settle_s=args.settle).check()
