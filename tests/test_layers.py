"""The package's layers: every import, at module level or inside a function, points down.

errors, paths <- core <- sim <- recording <- sources / hardware / world_model / console / host_stalls <- policies
<- nodes, world_model.training <- runner, bringup <- replay <- demo <- cli (:data:`RANKS`). A package may import its
own modules, and any layer below its own; never a sibling of its layer or one above. ``world_model.training``
(datasets from recorded episodes, training, evaluation) is a layer of its own above ``world_model`` and
``recording``, because it reads both; ``world_model`` never imports it. Middleware and model libraries stay at their
edges: rclpy and ROS message packages only in nodes and above, torch only in world_model (training included) and in
the LeRobot worker (policies; it runs in LeRobot's own Python), mujoco only in sim (the physical twin, which the
hardware backends and the camera sources build on).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rynn_teleop

PACKAGE = Path(rynn_teleop.__file__).resolve().parent
RANKS = {
    "": 0, "errors": 0, "paths": 1,
    "core": 2,
    "sim": 2.5,  # between core and the layer that uses it (hardware, sources)
    "sources": 3, "hardware": 3, "world_model": 3, "console": 3, "host_stalls": 3,
    "recording": 2.75,  # episodes on disk: the replay sources read them
    "policies": 3.5,  # learned controllers and their evaluation on the twin, drawn by the camera source's renderer
    "nodes": 4, "world_model.training": 4,
    "runner": 5, "bringup": 5, "supervisor": 5, "replay": 5.5, "demo": 6, "cli": 7,
}
#: third-party top-level modules -> the packages that may import them
EDGES = {
    "rclpy": {"nodes", "runner", "cli", "demo"},
    "torch": {"world_model", "world_model.training", "policies"},  # policies: only lerobot_worker, in LeRobot's Python
    "lerobot": {"policies"},
    "mujoco": {"sim"},
}


def _module(path: Path) -> list[str]:
    """Dotted module path of ``path`` inside the package, as a list (``[]`` for the root ``__init__``)."""
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in ``path``, relative ones resolved."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                name = ".".join(["rynn_teleop", *base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            out.append((node.lineno, name))
            if name == "rynn_teleop" or (node.level and not node.module):  # from . import x: x may be a module
                out += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return out


def _layer(dotted: list[str]) -> str:
    if dotted[:2] == ["world_model", "training"]:
        return "world_model.training"
    return dotted[0] if dotted else ""


def _violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = _layer(_module(path))
        assert own in RANKS, f"{path.relative_to(PACKAGE)}: package {own!r} has no layer in RANKS"
        for line, name in _imports(path):
            where = f"{path.relative_to(PACKAGE)}:{line} imports {name}"
            top = name.split(".")[0]
            if top.endswith("_msgs") and own not in EDGES["rclpy"]:  # ROS message packages: with rclpy
                found.append(f"{where} (only {', '.join(sorted(EDGES['rclpy']))} may)")
            if top in EDGES and own not in EDGES[top]:
                found.append(f"{where} (only {', '.join(sorted(EDGES[top]))} may)")
            if top != "rynn_teleop":
                continue
            target = _layer(name.split(".")[1:])
            if target not in RANKS:
                target = ""  # a name imported from the package root
            if target != own and RANKS[target] >= RANKS[own]:
                found.append(f"{where} (layer {RANKS[target]} from layer {RANKS[own]})")
    return found


def test_every_import_points_down() -> None:
    assert _violations() == []


@pytest.mark.parametrize("source, expected", [
    ("from ..nodes import base\n", "imports rynn_teleop.nodes"),
    ("from ..sources.camera import replay\n", "imports rynn_teleop.sources.camera"),
    ("def f():\n    from ..runner import Composition\n", "imports rynn_teleop.runner"),
    ("import rclpy\n", "imports rclpy"),
    ("from sensor_msgs.msg import Image\n", "imports sensor_msgs.msg"),
])
def test_an_upward_import_is_found(tmp_path, monkeypatch, source, expected) -> None:
    """The check itself: an upward, sideways, local or edge import placed in ``recording`` is reported."""
    fake = tmp_path / "rynn_teleop"
    (fake / "recording").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "recording" / "__init__.py").write_text("")
    (fake / "recording" / "bad.py").write_text(source)
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    found = _violations()
    assert len(found) == 1 and expected in found[0] and found[0].startswith("recording/bad.py:")
