"""What runs in each bringup mode, and with which backends (ROS-free data).

One table serves ``rynn-teleop run --mode``, ``rynn-teleop demo`` and (mirrored
declaratively, a test keeps them in step) ``launch/bringup.launch.py``. A mode
only chooses backends; every other parameter comes from the same
``config/<node>.yaml`` files.

* ``digital``: simulated arm and hand drivers, the world model (render
  backend by default) generating the head camera, the feed switch on the
  generated stream. The physical camera node still runs (synthetic scene
  unless told otherwise) so the feed can be toggled.
* ``real``: vendor backends (Marvin arms, Wuji hands, RealSense camera), the
  feed switch on the physical stream; the world model may still run as a
  preview.

Operator input is chosen separately (``tracker_source``, ``glove_source``):
a lab runs ``openvr`` + ``manus`` in both modes; ``synthetic`` needs nothing.
"""

from __future__ import annotations

from typing import Any

MODES = ("digital", "real")
CAMERAS = ("generated", "real")  # the launch argument's words
SWITCH_SOURCE = {"generated": "generated", "real": "physical"}  # -> camera_switch active_source

#: every mode's nodes, in start order (the recorder is added with ``record``)
NODES: tuple[str, ...] = (
    "robot_description", "tracker", "arm_ik", "hand_retarget", "arm_driver", "hand_driver",
    "head_camera", "world_model", "camera_switch", "robot_markers",
)
RECORDER = "recorder"
CONSOLE = "console"  # the operator's web page (``console``)
FOXGLOVE = "foxglove"  # the topics on a Foxglove WebSocket, where foxglove_bridge is absent (``foxglove``)
#: nodes that talk to hardware: never respawned by a launch file (a device error must stay visible)
HARDWARE_NODES = ("arm_driver", "hand_driver", "head_camera")

_BACKENDS: dict[str, dict[str, dict[str, Any]]] = {
    "digital": {
        "arm_driver": {"backend": "sim"},
        "hand_driver": {"backend": "sim"},
        "head_camera": {"source": "synthetic"},
    },
    "real": {
        "arm_driver": {"backend": "marvin"},
        "hand_driver": {"backend": "wuji"},
        "head_camera": {"source": "realsense"},
    },
}


def mode_nodes(record: bool = False, console: bool = False, foxglove: bool = False) -> tuple[str, ...]:
    """The nodes a bringup starts (``record``: with the recorder; ``console``: with the operator console;
    ``foxglove``: with the Foxglove WebSocket server)."""
    return (NODES + ((RECORDER,) if record else ()) + ((CONSOLE,) if console else ())
            + ((FOXGLOVE,) if foxglove else ()))


def mode_overrides(
    mode: str,
    *,
    camera: str | None = None,
    tracker_source: str | None = None,
    glove_source: str | None = None,
    world_model_backend: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Per-node parameter overrides of ``mode`` (on top of the YAML files).

    Args:
        mode: "digital" or "real".
        camera: the feed shown first ("generated" or "real"; default: generated when digital, else real).
        tracker_source, glove_source, world_model_backend: None keeps the YAML's value. A given
            tracker_source also sets arm_ik's auto_calibrate/auto_engage (on only for "synthetic").

    Raises:
        ValueError: an unknown mode or camera.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes are {', '.join(MODES)}")
    camera = camera or ("generated" if mode == "digital" else "real")
    if camera not in CAMERAS:
        raise ValueError(f"unknown camera {camera!r}; cameras are {', '.join(CAMERAS)}")
    out = {node: dict(values) for node, values in _BACKENDS[mode].items()}
    out["camera_switch"] = {"active_source": SWITCH_SOURCE[camera]}
    if tracker_source is not None:
        out["tracker"] = {"source": tracker_source}
        # nobody can call ~/calibrate for a synthetic operator: it calibrates and engages on its own posture
        synthetic = tracker_source == "synthetic"
        out["arm_ik"] = {"auto_calibrate": synthetic, "auto_engage": synthetic}
    if glove_source is not None:
        out["hand_retarget"] = {"source": glove_source}
    if world_model_backend is not None:
        out["world_model"] = {"backend": world_model_backend}
    return out
