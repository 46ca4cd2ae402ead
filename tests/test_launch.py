"""Launch files: declarative, arguments described; loaded by launch_ros where it exists."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

LAUNCH_DIR = Path(__file__).resolve().parents[1] / "launch"
FILES = sorted(LAUNCH_DIR.glob("*.launch.py"))


def test_there_are_launch_files():
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_argument_has_a_description(path):
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "DeclareLaunchArgument"]
    assert calls, f"{path.name} declares no arguments"
    for call in calls:
        keywords = {k.arg for k in call.keywords}
        assert "description" in keywords and "default_value" in keywords, ast.unparse(call)
    # declarative: no imperative control flow in the file
    assert not any(isinstance(n, (ast.If, ast.For, ast.While)) for n in ast.walk(tree)), path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_launch_description_loads(path):
    pytest.importorskip("launch")
    pytest.importorskip("launch_ros", reason="launch_ros is not on PyPI; install ROS 2 to run this test")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    from launch.actions import DeclareLaunchArgument

    args = [e for e in description.entities if isinstance(e, DeclareLaunchArgument)]
    assert all(a.description for a in args)
