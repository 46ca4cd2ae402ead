"""``rynn-teleop sim``: the physical twin's command line (wired into :mod:`rynn_teleop.cli` by :func:`add_parser`).

    rynn-teleop sim export-model [OUTPUT] [--scene NAME|PATH|none] [--seed N] [--config OVERLAY.yaml]
    rynn-teleop sim run [--scene NAME|PATH] [--seeds 0-19]    scripted episodes in the twin, judged by the task
    rynn-teleop sim scenes                                     the scenes in config/sim/

Also runnable on its own: ``python -m rynn_teleop.sim.cli export-model twin.xml``. Exit codes as
``rynn-teleop``'s: 0 done, 1 a scripted episode failed (``run --require-all``), 2 a bad request.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import ConfigurationError, run_command


def _scene_arg(value: str):
    from .scene import load_scene

    return None if value.lower() == "none" else load_scene(value)


def _seeds(text: str) -> list[int]:
    """``"0-19"``, ``"3"`` or ``"1,4,7"`` -> the seeds."""
    out: list[int] = []
    try:
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must look like 0-19, 3 or 1,4,7; got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("no seeds given")
    return out


def _cmd_export(args: argparse.Namespace) -> int:
    from .model import TwinSettings, export_mjcf

    scene = _scene_arg(args.scene)
    layout = scene.layout(args.seed) if scene is not None else None
    path = export_mjcf(args.output, scene, layout, TwinSettings(overlay=args.config))
    print(f"wrote {path} (scene {scene.name if scene else 'none'}, seed {args.seed}); view it with "
          f"`python -m mujoco.viewer --mjcf={path}`", file=sys.stderr)
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .physics import PhysicsWorld
    from .rollout import home_posture, run_scripted_episode

    scene = _scene_arg(args.scene)
    if scene is None:
        raise ConfigurationError("sim run needs a scene")
    world = PhysicsWorld(scene, args.seeds[0], initial=home_posture())
    successes = 0
    start = time.perf_counter()
    for seed in args.seeds:
        result = run_scripted_episode(scene, seed, world=world)
        successes += result.outcome.success
        print(f"seed {seed}: {result.outcome.label}: {result.outcome.reason} (max penetration "
              f"{1000 * result.max_penetration:.2f} mm, {result.sim_time:.1f} s simulated)")
    wall = time.perf_counter() - start
    print(json.dumps({"scene": scene.name, "episodes": len(args.seeds), "successes": successes,
                      "success_rate": round(successes / len(args.seeds), 3), "wall_s": round(wall, 1)}))
    return 1 if args.require_all and successes < len(args.seeds) else 0


def _cmd_scenes(args: argparse.Namespace) -> int:
    from .scene import available_scenes, load_scene

    for name in available_scenes():
        print(f"{name}: {load_scene(name).description}")
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``sim`` and its subcommands to ``rynn-teleop``'s subparsers; each sets ``func`` (args -> exit code)."""
    p = subparsers.add_parser("sim", help="the physical twin (MuJoCo): export its model, run scripted episodes")
    sub = p.add_subparsers(dest="sim_command", required=True)
    e = sub.add_parser("export-model", help="write the twin's MJCF (robot from the description, scene at a seed); "
                       "it opens in MuJoCo's viewer, no meshes needed")
    e.add_argument("output", nargs="?", default="rynn_twin.xml", help="the MJCF file to write (default rynn_twin.xml)")
    e.add_argument("--scene", default="pick_place", help="a scene in config/sim/, a scene YAML, or 'none' for the "
                   "robot alone (default pick_place)")
    e.add_argument("--seed", type=int, default=0, help="the layout seed of the objects (default 0)")
    e.add_argument("--config", default=None, help="YAML overriding urdf/robot.yaml (as `rynn-teleop urdf --config`)")
    e.set_defaults(func=_cmd_export)
    r = sub.add_parser("run", help="the scripted operator does the scene's task in the twin, once per seed; the "
                       "task's success predicate judges each episode (no ROS, no stack)")
    r.add_argument("--scene", default="pick_place", help="a scene in config/sim/ or a scene YAML")
    r.add_argument("--seeds", type=_seeds, default=_seeds("0-9"), help="e.g. 0-19, 3 or 1,4,7 (default 0-9)")
    r.add_argument("--require-all", action="store_true", help="exit 1 unless every episode succeeds")
    r.set_defaults(func=_cmd_run)
    s = sub.add_parser("scenes", help="list the scenes in config/sim/")
    s.set_defaults(func=_cmd_scenes)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``sim`` on its own: ``argv`` is what follows ``rynn-teleop sim``."""
    parser = argparse.ArgumentParser(prog="rynn-teleop")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
