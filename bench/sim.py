"""The physical twin's cost: physics step, real-time factor, camera frames (MuJoCo vs the project's renderer).

Baseline: MuJoCo's plain ``mj_step`` on the same model and a copy of the same state, timed in the same run;
the ratio says what :class:`~rynn_teleop.sim.physics.PhysicsWorld` (lock, bookkeeping, Python call) adds.
The state timed is the pick-and-place mid-grasp (the cube held in the air by the right hand: hand-object
contacts active) and at rest (the arms at home, the objects on the table). Camera: MuJoCo's ``Renderer``
from the head camera (colour, then depth) and the project's own :class:`~rynn_teleop.core.robot_render.
RobotRenderer` (the robot only, colour and depth) at 320x240 and 640x480; MuJoCo's colour also without shadows.
With the twin's objects (``own_objects_colour_depth``: robot and movable objects in one painter pass) and the
synthetic head camera's whole frame as it follows the twin (``own_twin_frame``: the static layer copied, the
robot and the objects drawn over it, colour and aligned depth; ``own_twin_static_layer_s``: the twin's table,
platform and targets ray-cast once per scene or reset, off the frame path).

    MUJOCO_GL=egl .venv/bin/python bench/sim.py [--steps 4000] [--frames 60]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from types import SimpleNamespace

os.environ.setdefault("MUJOCO_GL", "egl")

import mujoco
import numpy as np

from rynn_teleop.core.camera import default_intrinsics
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.core.robot_render import RobotRenderer
from rynn_teleop.core.trackers import frame_matrices
from rynn_teleop.sim.model import HEAD_CAMERA
from rynn_teleop.sim.monitor import object_poses, scene_description
from rynn_teleop.sim.physics import PhysicsWorld
from rynn_teleop.sim.rollout import home_posture, run_scripted_episode

SIZES = ((320, 240), (640, 480))


def _per_call_us(fn, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.perf_counter() - t0) / n


def bench_step(world: PhysicsWorld, steps: int) -> dict:
    """[us] per step: PhysicsWorld.step vs mj_step on a copy of the same state (alternating blocks)."""
    state = world.state()
    model, data = world.model, copy.copy(world.data)
    ours, base = [], []
    for _ in range(4):
        world.set_state(state)
        mujoco.mj_setState(model, data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
        base.append(_per_call_us(lambda: mujoco.mj_step(model, data), steps // 4))
        ours.append(_per_call_us(world.step, steps // 4))
    b, o = float(np.median(base)), float(np.median(ours))
    return {"mj_step_us": round(b, 1), "world_step_us": round(o, 1), "ratio_world_over_mj_step": round(o / b, 3),
            "contacts": int(world.data.ncon), "real_time_factor": round(1e6 * world.timestep / o, 1)}


def bench_camera(world: PhysicsWorld, frames: int) -> dict:
    out = {}
    robot = RobotModel.default()
    q = world.joint_state().position
    for w, h in SIZES:
        key = f"{w}x{h}"
        renderer = mujoco.Renderer(world.model, h, w)
        data = mujoco.MjData(world.model)
        world.copy_kinematics(data)
        renderer.update_scene(data, HEAD_CAMERA)
        renderer.render()  # warm-up (context, textures)

        def colour(renderer=renderer, data=data) -> None:
            world.copy_kinematics(data)
            renderer.update_scene(data, HEAD_CAMERA)
            renderer.render()

        out[f"mujoco_colour_{key}_ms"] = round(_per_call_us(colour, frames) / 1e3, 2)
        renderer.enable_depth_rendering()
        renderer.render()
        out[f"mujoco_depth_{key}_ms"] = round(_per_call_us(colour, frames) / 1e3, 2)
        renderer.disable_depth_rendering()
        shadows = world.model.light_castshadow.copy()
        world.model.light_castshadow[:] = 0
        out[f"mujoco_colour_no_shadows_{key}_ms"] = round(_per_call_us(colour, frames) / 1e3, 2)
        world.model.light_castshadow[:] = shadows
        renderer.close()
        own = RobotRenderer(robot, default_intrinsics(w, h))
        image = np.zeros((h, w, 3), np.uint8)
        out[f"own_colour_{key}_ms"] = round(_per_call_us(lambda own=own, image=image: own.draw(image, q), frames)
                                            / 1e3, 2)
        out[f"own_colour_depth_{key}_ms"] = round(
            _per_call_us(lambda own=own, image=image: own.draw_depth(image, q), frames) / 1e3, 2)
        out.update(bench_twin_camera(world, robot, q, w, h, frames))
    return out


def bench_twin_camera(world: PhysicsWorld, robot: RobotModel, q: np.ndarray, w: int, h: int, frames: int) -> dict:
    """The project's renderer with the twin's objects, and the synthetic camera's frame following the twin."""
    from rynn_teleop.sources.camera.synthetic import SyntheticScene

    key = f"{w}x{h}"
    poses = object_poses(world)
    T = frame_matrices(np.array([p.position for p in poses]), np.array([p.quaternion for p in poses]))
    cam = SyntheticScene(w, h, 30.0, draw_robot=True, robot_model=robot, twin_scene_topic="/twin/scene",
                         twin_in_background=False)
    cam.start(0.0)
    cam.feed("/twin/scene", SimpleNamespace(data=json.dumps(scene_description(world))))
    t0 = time.perf_counter()
    cam.read(0.0)  # takes the scene: the static layer is ray-cast here
    static_s = time.perf_counter() - t0
    cam.set_joint_positions(q)
    cam.set_object_poses(T)
    movable = T[list(cam.twin.movable)]
    image = np.zeros((h, w, 3), np.uint8)
    painter = cam.painter
    return {
        f"own_objects_colour_depth_{key}_ms": round(
            _per_call_us(lambda: painter.draw_depth(image, q, movable), frames) / 1e3, 2),
        f"own_twin_frame_{key}_ms": round(_per_call_us(lambda: cam.render(0.5), frames) / 1e3, 2),
        f"own_twin_static_layer_{key}_s": round(static_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4000, help="physics steps timed per state")
    parser.add_argument("--frames", type=int, default=60, help="camera frames timed per size and kind")
    parser.add_argument("--scene", default="pick_place")
    args = parser.parse_args()
    world = PhysicsWorld(args.scene, 0, initial=home_posture())
    out: dict = {"scene": args.scene, "timestep_s": world.timestep, "nq": world.model.nq, "ngeom": world.model.ngeom,
                 "machine": platform.processor() or platform.machine(), "mujoco": mujoco.__version__,
                 "gl": os.environ.get("MUJOCO_GL")}
    out["rest"] = bench_step(world, args.steps)
    t0 = time.perf_counter()
    result = run_scripted_episode(args.scene, 0, world=world)
    wall = time.perf_counter() - t0
    out["episode"] = {"outcome": result.outcome.label, "sim_s": round(result.sim_time, 2), "wall_s": round(wall, 2),
                      "real_time_factor_with_ik": round(result.sim_time / wall, 2)}
    holding = {}

    def grab(w: PhysicsWorld, t: float) -> None:  # the state mid-carry, the object in the hand
        if not holding and t >= result.plan.phase_time("lift"):
            holding["state"] = w.state()

    run_scripted_episode(args.scene, 0, world=world, on_period=grab)
    world.set_state(holding["state"])
    out["holding"] = bench_step(world, args.steps)
    out["holding"]["cube_in_hand"] = world.object_contacts("red_cube").hands == ("right",)
    try:
        out["camera"] = bench_camera(world, args.frames)
    except Exception as exc:  # noqa: BLE001  (no GL context here: report it, keep the physics numbers)
        out["camera"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
