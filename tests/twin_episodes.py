"""Episodes of the physical twin's task built without ROS: the scripted operator's plan (``sim.rollout``) turned
into the commands a teleoperation session records (``/arms/command`` at 100 Hz, ``/hands/command`` one hand per
message), with the twin's scene and seed in ``episode.yaml`` as the recorder writes them."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from recording_episodes import MS, T0, _joint_state

from rynn_teleop.core.layout import SIDES
from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES, GROUPS
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder
from rynn_teleop.sim.rollout import run_scripted_episode

ARM = list(CANONICAL_JOINT_NAMES[:14])
JS = "sensor_msgs/msg/JointState"


@functools.cache
def scripted_targets(scene: str, seed: int) -> tuple[tuple[tuple[float, np.ndarray], ...], str]:
    """The scripted plan of ``scene`` at ``seed`` run in pure physics (once per test process): its 54 joint
    targets at every control period (plan time [s], targets [rad]) and its outcome label."""
    targets: list[tuple[float, np.ndarray]] = []

    def on_period(world, t):
        targets.append((t, world.targets().copy()))

    result = run_scripted_episode(scene, seed, on_period=on_period)
    return tuple(targets), result.outcome.label


def scripted_episode(output_dir: Path, scene: str = "pick_place", seed: int = 0,
                     names: list[str] | None = None) -> tuple[Path, str]:
    """Record the scripted plan's joint targets of ``scene`` at ``seed`` as an episode's commands (``names``:
    other arm joint names, to make an episode of another robot); returns its directory and the outcome the plan
    had in pure physics."""
    targets, label = scripted_targets(scene, seed)
    rec = EpisodeRecorder(output_dir, {"/arms/command": 100.0, "/hands/command": 200.0}, flush_period_s=10.0)
    meta = EpisodeMetadata(task="scripted", operator="rollout", extra={"twin": {"scene": scene, "seed": seed}})
    path = rec.start(meta, now_ns=T0)
    arm_names = names or ARM
    for t, q in targets:
        s = T0 + int(round(t * 1e9))
        rec.submit("/arms/command", JS, _joint_state(s, arm_names, q[:14]), s + 1 * MS)
        for k, side in enumerate(SIDES):
            group = GROUPS.hand(side)
            hand = list(CANONICAL_JOINT_NAMES[group])
            rec.submit("/hands/command", JS, _joint_state(s + k * MS, hand, q[group]), s + (2 + k) * MS)
    rec.stop(now_ns=T0 + int(round((targets[-1][0] + 0.01) * 1e9)))
    return path, label
