"""The bringup table: every node of the stack, how it runs, and the launch arguments that choose it (ROS-free).

``launch/bringup.launch.py`` builds its arguments and Node actions from this table, ``rynn-teleop run --mode``
and ``rynn-teleop demo`` read the same one: adding a node or a mode is an edit here. A mode only chooses
backends; every other parameter comes from the same ``config/<node>.yaml`` files.

* ``digital``: the physical twin (``twin``: MuJoCo physics of the robot and a task scene) with the arm and hand
  drivers on it (their ``sim`` backend), the world model generating the head camera, the feed switch on the
  generated stream (the physical camera node still runs, synthetic scene, so the feed can be toggled). The twin
  and the drivers share one physics world, so they run in one process (:data:`COMPOSED`).
* ``real``: vendor backends (Marvin arms, Wuji hands, RealSense camera), the feed switch on the physical
  stream; the world model may still run as a preview.

Every node that can run different implementations has a ``backend`` parameter (its choices: the node's
backend registry, :mod:`rynn_teleop.core.plugins`); a mode sets the drivers' and the head camera's. The
operator input and the world model are chosen separately, each by the launch argument ``<node>_backend``
(:data:`BACKEND_ARGUMENTS`: ``tracker_backend``, ``hand_retarget_backend``, ``world_model_backend``), whose
choices are the registered backends; ``synthetic`` needs nothing. The feeds are named as the camera switch
names them: ``generated`` and ``physical``.

In either mode the ``policy`` argument (a policy's path: ``policy:=PATH``, ``rynn-teleop run --policy PATH``)
replaces the operator input (tracker, arm_ik, hand_retarget) by the ``policy`` node running that policy (backend:
``policy_backend``); the drivers, twin, camera, world model and recorder stay. It acts when started
(``rynn-teleop call policy start``, the console).

The managed nodes (:attr:`NodeSpec.managed`: the arm and hand drivers, lifecycle nodes) start unconfigured; the
launch file's ``lifecycle_manager`` (:data:`LIFECYCLE_MANAGER`) and ``rynn-teleop run`` bring them to the
``lifecycle`` argument's state (default active) in table order, every one configured before any is activated.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .core.lifecycle import GOALS as LIFECYCLE_GOALS
from .errors import ConfigurationError

MODES = ("digital", "real")
CAMERAS = ("generated", "physical")  # the camera argument's words ("" = by mode): the camera_switch's feeds
DEFAULT_CAMERA = {"digital": "generated", "real": "physical"}  # the feed shown first when no camera is given
SWITCH = ("true", "false")  # the choices of an on/off launch argument
RESPAWN_DELAY_S = 2.0  # [s] a launch file restarts a respawning node this long after it exited
LIFECYCLE_MANAGER = "lifecycle_manager"  # the executable that brings the managed nodes up (nodes.lifecycle_manager)
POLICY = "policy"  # the node, and the launch argument naming its policy (empty: the operator drives)
UNQUOTABLE, BACKSLASH = "'" * 3, chr(92)  # what a policy path may not hold (the launch file quotes it: r'''...''')

#: each mode's backends: node -> parameter -> value
BACKENDS: dict[str, dict[str, dict[str, Any]]] = {
    "digital": {
        "arm_driver": {"backend": "sim"},
        "hand_driver": {"backend": "sim"},
        "head_camera": {"backend": "synthetic"},
    },
    "real": {
        "arm_driver": {"backend": "marvin"},
        "hand_driver": {"backend": "wuji"},
        "head_camera": {"backend": "realsense"},
    },
}

#: launch arguments that choose a node's backend: ``<node>_backend`` -> node
BACKEND_ARGUMENTS: dict[str, str] = {
    "tracker_backend": "tracker",
    "hand_retarget_backend": "hand_retarget",
    "world_model_backend": "world_model",
    "policy_backend": "policy",
}

#: former launch arguments -> their names now (a launch given a former one stops, naming the new one)
RENAMED_ARGUMENTS: dict[str, str] = {
    "tracker_source": "tracker_backend",
    "glove_source": "hand_retarget_backend",
}


class Argument(NamedTuple):
    """A launch argument of the bringup (``name:=value``); ``rynn-teleop run --mode`` has the same options."""

    name: str
    default: str
    choices: tuple[str, ...]  # launch refuses any other value before a node starts; () any text (a path)
    description: str


def arguments() -> tuple[Argument, ...]:
    """Every launch argument (also :data:`ARGUMENTS`); a backend argument's choices are the node's registered
    backends (their modules are imported on the first call, not at import of this module)."""
    from .policies import POLICY_BACKENDS
    from .sources.hands import HAND_BACKENDS
    from .sources.trackers import TRACKER_BACKENDS
    from .world_model.generator import WORLD_MODEL_BACKENDS

    return _arguments(TRACKER_BACKENDS.names(), HAND_BACKENDS.names(), WORLD_MODEL_BACKENDS.names(),
                      POLICY_BACKENDS.names())


def __getattr__(name: str) -> Any:
    if name == "ARGUMENTS":  # the launch arguments, computed on first use (:func:`arguments`)
        return arguments()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _arguments(trackers: tuple[str, ...], hands: tuple[str, ...], world_models: tuple[str, ...],
               policies: tuple[str, ...]) -> tuple[Argument, ...]:
    return (
        Argument("mode", "digital", MODES, "digital: sim drivers, synthetic camera, world model feed; "
                 "real: Marvin arms, Wuji hands, RealSense camera"),
        Argument("camera", "", ("", *CAMERAS), "feed shown first: generated (world model) or physical (head camera); "
                 "empty: by mode (digital -> generated, real -> physical)"),
        Argument("record", "false", SWITCH, "start the recorder (episodes start and stop by its services)"),
        Argument("console", "false", SWITCH, "start the operator console: a web page (config/console.yaml: host, port; "
                 "default http://127.0.0.1:8080/) with the camera feeds, state and every operator control"),
        Argument("foxglove", "false", SWITCH, "serve the topics to the Foxglove app with this package's foxglove node "
                 "(config/foxglove.yaml; ws://127.0.0.1:8765), e.g. where foxglove_bridge is not installed"),
        Argument("tracker_backend", "synthetic", trackers, "tracker input (the tracker node's backend): synthetic "
                 "(no hardware), replay (replay.path in config/tracker.yaml), openvr (Vive trackers through "
                 "SteamVR), or another registered backend"),
        Argument("hand_retarget_backend", "synthetic", hands, "hand input (the hand_retarget node's "
                 "backend): synthetic (no hardware), replay, skeleton (PoseArray hand trackers), manus (Manus gloves), "
                 "or another registered backend"),
        Argument("world_model_backend", "render", world_models, "world model: render (robot drawn "
                 "over the reference frame), diffusion (needs diffusion.base_dir and diffusion.prompt_file in "
                 "config/world_model.yaml), or another registered backend"),
        Argument(POLICY, "", (), "a policy to run instead of the operator input: its path (the policy backend's path "
                 "setting: lerobot, a lerobot-train output folder; replay, an exported dataset); the policy node "
                 "replaces tracker, arm_ik and hand_retarget and acts once started (rynn-teleop call policy start, "
                 "the console); empty: the operator drives"),
        Argument("policy_backend", "lerobot", policies, "the policy node's backend (with policy): lerobot (a "
                 "lerobot-train policy, run in LeRobot's own Python), replay (one exported episode open-loop), "
                 "constant (a fixed posture, for dry runs), or another registered backend"),
        Argument("lifecycle", "active", LIFECYCLE_GOALS, "the state the managed nodes (arm_driver, then hand_driver) "
                 "are brought to: active (following commands), inactive (connected, commanding nothing) or "
                 "unconfigured (nothing connected; ros2 lifecycle set or rynn-teleop lifecycle by hand)"),
        Argument("rviz", "false", SWITCH, "start RViz (config/rynn_teleop.rviz: robot, camera feed, tracker poses)"),
        Argument("robot_state_publisher", "true", SWITCH, "use robot_state_publisher (tf + /robot_description; needs "
                 "a ROS install); false: this package's robot_description node"),
    )


@dataclass(frozen=True)
class NodeSpec:
    """One node of this package in the bringup.

    Attributes:
        name: its executable, ROS node name and parameter file ``config/<name>.yaml``.
        group: the process it shares when the bringup runs as several composed processes (the demo).
        hardware: it talks to a device; a launch file never restarts it (a device error stays visible).
        switch: the launch argument that starts it (None: always started).
        started_when: the value of ``switch`` that starts it (None: any value but empty: a path is given).
        overrides: parameter -> the launch arguments its value depends on (values: :func:`mode_overrides`).
        passed: parameter -> the launch argument whose value it takes as given (a path: no table of choices).
        managed: a lifecycle node (``nodes.lifecycle.ManagedNode``): started unconfigured, then brought to the
            ``lifecycle`` argument's state, in table order, by :data:`LIFECYCLE_MANAGER` (or ``rynn-teleop run``).
        modes: the modes that start it (the twin: digital only).
    """

    name: str
    group: str
    hardware: bool = False
    switch: str | None = None
    started_when: str | None = "true"
    overrides: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    passed: Mapping[str, str] = field(default_factory=dict)
    managed: bool = False
    modes: tuple[str, ...] = MODES

    def starts(self, values: Mapping[str, str]) -> bool:
        """Whether a launch with these argument values (every one given) starts it."""
        if values["mode"] not in self.modes:
            return False
        if self.switch is None:
            return True
        value = values[self.switch]
        return value != "" if self.started_when is None else value == self.started_when

    @property
    def started_by(self) -> str:
        """When a launch starts it, in words (for the reference pages)."""
        if self.switch is None:
            return "always"
        if self.started_when is None:
            return f"`{self.switch}:=PATH` (given)"
        if self.started_when == "":
            return f"`{self.switch}` empty"
        return f"`{self.switch}:={self.started_when}`"

    @property
    def respawn(self) -> bool:
        """Restarted by a launch file when it exits with any code but :data:`~.errors.REFUSED_EXIT_CODE`."""
        return not self.hardware


class OtherNode(NamedTuple):
    """A node of another package that the launch file starts when ``switch`` is true."""

    package: str
    executable: str
    switch: str
    arguments: tuple[str, ...] = ()


#: this package's nodes in start order
NODES: tuple[NodeSpec, ...] = (
    NodeSpec("robot_description", "drivers", switch="robot_state_publisher", started_when="false"),
    # the operator input: replaced by the policy node when a policy is given
    NodeSpec("tracker", "tracker", switch=POLICY, started_when="", overrides={"backend": ("tracker_backend",)}),
    NodeSpec("arm_ik", "arm_ik", switch=POLICY, started_when="",
             overrides={"auto_calibrate": ("tracker_backend",), "auto_engage": ("tracker_backend",)}),
    NodeSpec("hand_retarget", "hand_retarget", switch=POLICY, started_when="",
             overrides={"backend": ("hand_retarget_backend",)}),
    NodeSpec(POLICY, "policy", switch=POLICY, started_when=None, overrides={"backend": ("policy_backend",)},
             passed={"path": POLICY}),
    NodeSpec("twin", "drivers", modes=("digital",)),
    NodeSpec("arm_driver", "drivers", hardware=True, overrides={"backend": ("mode",)}, managed=True),
    NodeSpec("hand_driver", "drivers", hardware=True, overrides={"backend": ("mode",)}, managed=True),
    NodeSpec("head_camera", "camera", hardware=True, overrides={"backend": ("mode",)}),
    NodeSpec("world_model", "world_model", overrides={"backend": ("world_model_backend",)}),
    NodeSpec("camera_switch", "camera", overrides={"active_source": ("mode", "camera")}),
    NodeSpec("robot_markers", "robot_markers"),
    NodeSpec("recorder", "recorder", switch="record"),
    NodeSpec("console", "console", switch="console"),
    NodeSpec("foxglove", "foxglove", switch="foxglove"),
)
#: other packages' nodes, started before this package's (a missing one stops the launch before ours start)
OTHER_NODES: tuple[OtherNode, ...] = (
    OtherNode("rviz2", "rviz2", "rviz"),
    # display only: the tracking world frames placed at the robot's base, so RViz shows the trackers by the robot
    *(OtherNode("tf2_ros", "static_transform_publisher", "rviz", ("--frame-id", "base_link", "--child-frame-id", world))
      for world in ("synthetic_world", "vive_world", "xr_world")),
    OtherNode("robot_state_publisher", "robot_state_publisher", "robot_state_publisher"),
)
RECORDER, CONSOLE, FOXGLOVE = "recorder", "console", "foxglove"
HARDWARE_NODES = tuple(spec.name for spec in NODES if spec.hardware)
MANAGED_NODES = tuple(spec.name for spec in NODES if spec.managed)  # in bring-up order


class ComposedProcess(NamedTuple):
    """Nodes a launch file starts as one process in ``mode`` (``rynn-teleop run NODES``, :func:`composed_arguments`)
    instead of one process each, because they share what only one process can hold."""

    mode: str
    nodes: tuple[str, ...]  # in start order
    why: str


#: the processes a launch file composes: in the digital mode the drivers' sim backend sets and reads the joints
#: of the twin node's physics world (``sim.shared``), which lives in the twin's process
COMPOSED: tuple[ComposedProcess, ...] = (
    ComposedProcess("digital", ("twin", "arm_driver", "hand_driver"),
                    "the drivers' sim backend drives the twin node's physics world, held in that process"),
)


def separate_modes(name: str) -> tuple[str, ...]:
    """The modes in which a launch file starts node ``name`` as its own process (not in a :data:`COMPOSED` one)."""
    composed = {c.mode for c in COMPOSED if name in c.nodes}
    return tuple(m for m in node(name).modes if m not in composed)


def composed_arguments(process: ComposedProcess) -> list[str]:
    """The ``rynn-teleop`` arguments that run ``process``: its nodes with the mode's backends, managed nodes left
    unconfigured (the launch file's lifecycle manager brings them up)."""
    return ["run", *process.nodes, "--mode", process.mode, "--lifecycle", "unconfigured"]


def argument(name: str) -> Argument:
    """The launch argument called ``name`` (KeyError if there is none)."""
    for arg in arguments():
        if arg.name == name:
            return arg
    raise KeyError(name)


def check_renamed(arguments: Mapping[str, Any]) -> None:
    """Refuse former launch argument names.

    Raises:
        ConfigurationError: naming the former argument and its name now.
    """
    for old, new in RENAMED_ARGUMENTS.items():
        if old in arguments:
            raise ConfigurationError(f"launch argument {old!r} was renamed {new!r}: give {new}:={arguments[old]}")


def check_policy(arguments: Mapping[str, Any]) -> None:
    """Refuse a ``policy`` argument that names nothing: a path that does not exist (for a backend that loads its
    policy from a path), or one the launch file cannot quote (three single quotes in it, a trailing backslash).

    Raises:
        ConfigurationError: naming the argument, its value and why.
    """
    from pathlib import Path

    from .policies.controller import path_setting_of

    values = _with_defaults({k: str(v) for k, v in arguments.items()})
    path = values[POLICY]
    if not path:
        return
    if UNQUOTABLE in path or path.endswith(BACKSLASH):
        raise ConfigurationError(f"launch argument policy:={path!r}: a path holding three single quotes or ending "
                                 "in a backslash cannot be passed; rename it")
    backend = values["policy_backend"]
    if path_setting_of(backend) is not None and not Path(path).expanduser().exists():
        raise ConfigurationError(f"launch argument policy:={path!r}: no such file or folder (the {backend} "
                                 "backend's policy)")


def node(name: str) -> NodeSpec:
    """This package's bringup node called ``name`` (KeyError if there is none)."""
    for spec in NODES:
        if spec.name == name:
            return spec
    raise KeyError(name)


def _with_defaults(given: Mapping[str, str]) -> dict[str, str]:
    """Every launch argument's value: ``given``, then the defaults for the rest."""
    return {arg.name: arg.default for arg in arguments()} | dict(given)


def started_nodes(arguments: Mapping[str, str]) -> tuple[str, ...]:
    """This package's nodes a launch with these argument values starts, in start order (defaults for the rest)."""
    values = _with_defaults(arguments)
    return tuple(s.name for s in NODES if s.starts(values))


def mode_nodes(record: bool = False, console: bool = False, foxglove: bool = False,
               mode: str = "digital", policy: bool = False) -> tuple[str, ...]:
    """The nodes of a bringup without robot_state_publisher (``rynn-teleop run --mode``) in ``mode``: ``record``
    adds the recorder, ``console`` the operator console, ``foxglove`` the Foxglove WebSocket server, ``policy``
    the policy node in place of the operator input (tracker, arm_ik, hand_retarget)."""
    words = {True: "true", False: "false"}
    return started_nodes({"robot_state_publisher": "false", "record": words[record], "console": words[console],
                          "foxglove": words[foxglove], "mode": mode, POLICY: "given" if policy else ""})


def process_groups(nodes: tuple[str, ...] | list[str]) -> tuple[tuple[str, ...], ...]:
    """``nodes`` split into their processes (:attr:`NodeSpec.group`), groups and members in table order."""
    wanted = set(nodes)
    groups: dict[str, list[str]] = {}
    for spec in NODES:
        if spec.name in wanted:
            groups.setdefault(spec.group, []).append(spec.name)
    return tuple(tuple(members) for members in groups.values())


def mode_overrides(
    mode: str,
    *,
    camera: str | None = None,
    tracker_backend: str | None = None,
    hand_retarget_backend: str | None = None,
    world_model_backend: str | None = None,
    policy_backend: str | None = None,
    policy: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Per-node parameter overrides of ``mode`` (on top of the YAML files).

    Args:
        mode: "digital" or "real".
        camera: the feed shown first ("generated" or "physical"; None or "": :data:`DEFAULT_CAMERA` of the mode).
        tracker_backend, hand_retarget_backend, world_model_backend, policy_backend: the ``backend`` of that node
            (None keeps the YAML's value; the node checks the name against its registry). A given tracker_backend
            also sets arm_ik's auto_calibrate/auto_engage (on only for "synthetic").
        policy: the policy node's ``path`` (None or "": the YAML's).

    Raises:
        ValueError: an unknown mode or camera.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes are {', '.join(MODES)}")
    camera = camera or DEFAULT_CAMERA[mode]
    if camera not in CAMERAS:
        raise ValueError(f"unknown camera {camera!r}; cameras are {', '.join(CAMERAS)}")
    out = {name: dict(values) for name, values in BACKENDS[mode].items()}
    out["camera_switch"] = {"active_source": camera}
    if tracker_backend is not None:
        # nobody can call ~/calibrate for a synthetic operator: it calibrates and engages on its own posture
        synthetic = tracker_backend == "synthetic"
        out["arm_ik"] = {"auto_calibrate": synthetic, "auto_engage": synthetic}
    chosen = {"tracker_backend": tracker_backend, "hand_retarget_backend": hand_retarget_backend,
              "world_model_backend": world_model_backend, "policy_backend": policy_backend}
    for name, node_name in BACKEND_ARGUMENTS.items():
        if chosen[name] is not None:
            out[node_name] = {"backend": chosen[name]}
    if policy:
        out.setdefault(POLICY, {})["path"] = policy
    return out


def launch_overrides(arguments: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """:func:`mode_overrides` of a launch with these argument values (defaults for the rest)."""
    values = _with_defaults(arguments)
    return mode_overrides(values["mode"], camera=values["camera"], policy=values[POLICY] or None,
                          **{name: values[name] for name in BACKEND_ARGUMENTS})


class LookupTable(NamedTuple):
    """One parameter a launch file sets: ``values[(value of each of arguments, ...)]``."""

    node: str
    key: str
    arguments: tuple[str, ...]
    values: dict[tuple[str, ...], Any]


def lookup_tables() -> tuple[LookupTable, ...]:
    """Every parameter of :attr:`NodeSpec.overrides` as a table over its arguments' choices, computed with
    :func:`launch_overrides` (a launch file evaluates these tables: it cannot differ from ``run --mode``)."""
    tables = []
    for spec in NODES:
        for key, names in spec.overrides.items():
            rows = itertools.product(*(argument(name).choices for name in names))
            values = {row: launch_overrides(dict(zip(names, row)))[spec.name][key] for row in rows}
            tables.append(LookupTable(spec.name, key, names, values))
    return tuple(tables)
