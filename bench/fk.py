"""Forward kinematics cost: RobotModel (canonical layout, named frames) vs raw Pinocchio.

Baseline: pinocchio.framesForwardKinematics on the Pinocchio configuration
vector plus reading the same frames, measured in the same run. The ratio
says what the canonical-order mapping and frame lookup cost on top.

    .venv/bin/python bench/fk.py [--n 5000]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pinocchio as pin

from rynn_teleop.core.robot_model import RobotModel

FRAMES = [f"{s}_arm_flange" for s in ("left", "right")] + [
    f"{s}_finger{f}_tip_link" for s in ("left", "right") for f in range(1, 6)
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    n = parser.parse_args().n
    robot = RobotModel.default()
    rng = np.random.default_rng(0)
    qs = rng.uniform(robot.limits.lower, robot.limits.upper, size=(n, 54))
    pin_qs = [robot.to_pinocchio(q) for q in qs]
    ids = [robot.frame_id(f) for f in FRAMES]
    data = robot.model.createData()

    t0 = time.perf_counter()
    for q in pin_qs:
        pin.framesForwardKinematics(robot.model, data, q)
        _ = [data.oMf[i].homogeneous for i in ids]
    base = (time.perf_counter() - t0) / n

    t0 = time.perf_counter()
    for q in qs:
        robot.forward_kinematics(q, FRAMES)
    ours = (time.perf_counter() - t0) / n
    print(f"raw pinocchio: {1e6 * base:.1f} us/call, RobotModel.forward_kinematics: {1e6 * ours:.1f} us/call "
          f"({len(FRAMES)} frames)")
    print(json.dumps({"frames": len(FRAMES), "baseline": "pinocchio.framesForwardKinematics",
                      "baseline_us": round(1e6 * base, 2), "ours_us": round(1e6 * ours, 2),
                      "ratio_ours_over_baseline": round(ours / base, 3)}))


if __name__ == "__main__":
    main()
