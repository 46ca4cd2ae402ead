"""An episode's physical twin as the head camera saw it, drawn after the fact from the recording (ROS-free).

The demo's ``preview.mp4`` shows the consumer feed: mostly the world model's frames, whose render backend draws
the commanded robot over a fixed tabletop and moves no object. What physics did is in the recording:
``/twin/scene`` (the layout), ``/twin/objects`` (every object's pose) and ``/joint_states`` (the measured
joints). :func:`twin_video` draws those with the synthetic camera (:class:`~.synthetic.SyntheticScene`, the same
renderer and view as the physical feed in the digital mode) at a fixed frame rate, each frame showing the newest
recorded state at its time.
"""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from ...core.robot_model import RobotModel
from ...recording.errors import RecordingError
from ...recording.inspect import partial_file
from ..playback import open_bag
from .synthetic import SyntheticScene, home_position

SCENE, OBJECTS, JOINTS = "/twin/scene", "/twin/objects", "/joint_states"


def twin_video(episode: str | Path, mp4: str | Path, *, width: int = 320, height: int = 240, fps: float = 30.0,
               robot: RobotModel | None = None) -> int:
    """Write an MP4 (``mp4v``) of ``episode``'s twin: the robot at the recorded ``/joint_states`` and the
    objects at the recorded ``/twin/objects``, in the head camera's view, ``fps`` frames per second of the
    recording (log time) from its first object pose to its end; returns the number of frames.

    Raises:
        RecordingError: the episode holds no ``/twin/scene`` or ``/twin/objects`` (no twin ran), or the video
            cannot be written.
    """
    episode, mp4 = Path(episode), Path(mp4)
    partial = partial_file(mp4)  # refused here, before the bag is read, if it cannot be written
    try:
        frames = _write(episode, partial, width, height, fps, robot or RobotModel.default())
        os.replace(partial, mp4)
    finally:
        partial.unlink(missing_ok=True)
    return frames


def _write(episode: Path, partial: Path, width: int, height: int, fps: float, robot: RobotModel) -> int:
    """:func:`twin_video` into ``partial``."""
    names = list(robot.joint_names)
    index = {n: i for i, n in enumerate(names)}
    events: list[tuple[int, str, object]] = []
    reader = open_bag(episode, "twin video")
    try:
        wanted = [c for c in reader.connections if c.topic in (SCENE, OBJECTS, JOINTS)]
        for conn, t, raw in reader.messages(connections=wanted):
            events.append((t, conn.topic, reader.deserialize(raw, conn.msgtype)))
    finally:
        reader.close()
    topics = {topic for _, topic, _ in events}
    if not {SCENE, OBJECTS} <= topics:
        raise RecordingError(f"{episode}: no twin in this episode (it has no {SCENE} and {OBJECTS}): the twin "
                             "runs in the digital mode")
    events.sort(key=lambda e: e[0])
    start = next(t for t, topic, _ in events if topic == OBJECTS)
    end = events[-1][0]
    scene = SyntheticScene(width, height, fps, depth=False, draw_robot=True, robot_model=robot,
                           twin_scene_topic=SCENE, twin_objects_topic=OBJECTS, twin_in_background=False)
    q = home_position(robot).copy()
    writer = cv2.VideoWriter(str(partial), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise RecordingError(f"{partial}: cannot write the video (mp4v)")
    frames, i = 0, 0
    try:
        scene.start(0.0)
        k = 0
        while True:
            t_ns = start + int(round(k * 1e9 / fps))
            if t_ns > end:
                break
            while i < len(events) and events[i][0] <= t_ns:  # the newest recorded state at this frame's time
                _, topic, msg = events[i]
                if topic == JOINTS:
                    for name, value in zip(msg.name, msg.position):
                        j = index.get(name)
                        if j is not None and np.isfinite(value):
                            q[j] = value
                else:
                    scene.feed(topic, msg)
                i += 1
            scene.set_joint_positions(q)
            for frame in scene.read(k / fps):
                image = cv2.cvtColor(frame.color, cv2.COLOR_RGB2BGR)
                cv2.putText(image, f"twin  t={k / fps:6.2f} s", (6, height - 8), cv2.FONT_HERSHEY_SIMPLEX, 0.4,
                            (255, 255, 255), 1, cv2.LINE_AA)
                writer.write(image)
                frames += 1
            k += 1
    finally:
        writer.release()
        scene.close()
    if frames == 0:
        raise RecordingError(f"{episode}: no frame to draw (the twin's poses span no time)")
    return frames
