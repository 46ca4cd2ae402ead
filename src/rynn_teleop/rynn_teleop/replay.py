"""``rynn-teleop episodes replay EPISODE``: an episode's commands sent through the drivers again.

How a digitally teleoperated episode is checked for physical feasibility: with ``--twin`` a fresh physical twin
(the episode's scene and layout, from its ``episode.yaml``) and its drivers start in this process
(``twin``, ``arm_driver``, ``hand_driver`` with the sim backend), the commands are replayed through the drivers'
safety layer, and the twin's judgement of the task is reported. Without ``--twin`` the commands go to the
drivers already running on the ROS domain (the real robot, or a twin that runs): nothing else may command
them (the replay refuses while arm_ik or hand_retarget publish commands). Either way the replay first moves
the joints slowly to the first command, and an e-stop (``/estop``, a driver's) or Ctrl-C ends it at once.

Exit codes: 0 replayed (and, on a twin, the task succeeded), 1 the task failed on the twin or the replay was
stopped by an e-stop, 2 the request (no such episode, joints of another robot, drivers missing), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from .core.robot_model import CANONICAL_JOINT_NAMES
from .nodes.replay import CommandConflictError, ReplayClient, ReplayResult
from .recording.replay import CommandTrack, ReplayOptions, check_joint_names, load_commands, options_from
from .runner import Composition

DEFAULT_SCENE = "pick_place"
TWIN_NODES = ("twin", "arm_driver", "hand_driver")
INTERRUPTED_EXIT_CODE = 130


class TwinChoice(NamedTuple):
    """The twin a replay runs on: scene and layout, and where they came from."""

    scene: str
    seed: int
    source: str  # "episode", "arguments" or "default"


def twin_for(track: CommandTrack, scene: str | None = None, seed: int | None = None) -> TwinChoice:
    """The scene and seed of the replay's twin: the arguments, else the episode's (``extra.twin``), else the
    default scene at seed 0."""
    recorded = track.twin or {}
    chosen_scene = scene or recorded.get("scene") or DEFAULT_SCENE
    chosen_seed = seed if seed is not None else recorded.get("seed")
    source = "arguments" if scene or seed is not None else ("episode" if recorded else "default")
    return TwinChoice(str(chosen_scene), int(chosen_seed or 0), source)


def replay_episode(episode: str | Path, *, twin: bool = False, scene: str | None = None, seed: int | None = None,
                   options: ReplayOptions | None = None, domain_id: int | None = None,
                   stop: threading.Event | None = None, log: Callable[[str], None] = lambda line: None,
                   config_dir: str | Path | None = None) -> tuple[ReplayResult, TwinChoice | None]:
    """Replay ``episode`` (see the module doc); returns the result and the twin it ran on (None: without one).

    Raises:
        JointNamesMismatchError: the episode commands joints the robot does not have (checked before anything
            starts).
        EpisodeDataError: the episode has no commands or cannot be read.
        CommandConflictError: other nodes command the drivers.
        RynnTeleopError: the drivers do not report their joints.
    """
    options = (options or ReplayOptions()).check()
    track = load_commands(episode)
    check_joint_names(track, CANONICAL_JOINT_NAMES)
    stop = stop or threading.Event()
    choice = twin_for(track, scene, seed) if twin else None
    nodes: list[str] = list(TWIN_NODES) if twin else []
    overrides: dict[str, dict[str, Any]] = {}
    if choice is not None:
        log(f"twin: scene {choice.scene}, layout {choice.seed} ({choice.source})")
        overrides = {"twin": {"scene": choice.scene, "seed": choice.seed},
                     "arm_driver": {"backend": "sim"}, "hand_driver": {"backend": "sim"}}
    with Composition(nodes, overrides=overrides, domain_id=domain_id, config_dir=config_dir) as comp:
        client = ReplayClient(context=comp.context)
        comp.add_node(client)
        client.wait_for_joints(track.joint_names, 15.0)  # the drivers are up and discovered
        others = client.other_commanders()
        if others:
            raise CommandConflictError(others)
        result = client.run(track, options, stop, log)
    return result, choice


def exit_code(result: ReplayResult, twin: bool) -> int:
    """0 replayed (on a twin: and succeeded), 1 failed or e-stopped, 130 interrupted."""
    if result.stopped_by == "interrupted":
        return INTERRUPTED_EXIT_CODE
    if not result.completed:
        return 1
    if twin:
        return 0 if result.outcome is not None and result.outcome.get("success") is True else 1
    return 0


def describe(result: ReplayResult, choice: TwinChoice | None) -> str:
    """One line for the operator."""
    if result.completed:
        text = f"replayed {result.commands_sent} commands in {result.seconds:.1f} s"
    else:
        text = f"stopped after {result.commands_sent} commands: {result.stopped_by}"
    outcome = result.outcome
    if outcome is not None:  # a fresh twin's, or the running twin's (the robot reports none)
        label = {True: "success", False: "failure", None: "undecided"}.get(outcome.get("success"), "?")
        where = f"the twin ({choice.scene}, layout {choice.seed})" if choice is not None else "the running twin"
        text += f"; outcome on {where}: {label} ({outcome.get('reason')})"
    elif choice is not None:
        text += "; the twin reported no outcome"
    return text


def main(args: argparse.Namespace) -> int:
    """``episodes replay`` with parsed arguments (``recording.replay.add_arguments``)."""
    stop = threading.Event()
    quiet = args.json

    def log(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    try:
        result, choice = replay_episode(args.episode, twin=args.twin, scene=args.scene, seed=args.seed,
                                        options=options_from(args), stop=stop, log=log)
    except KeyboardInterrupt:
        stop.set()
        print("replay interrupted (Ctrl-C): nothing more was sent", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except CommandConflictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"episode": str(args.episode), "completed": result.completed,
                          "stopped_by": result.stopped_by, "commands_sent": result.commands_sent,
                          "arrived": result.arrived, "seconds": round(result.seconds, 2),
                          "twin": choice._asdict() if choice else None, "outcome": result.outcome}))
    else:
        print(describe(result, choice))
    return exit_code(result, args.twin)
