"""Data folders are found in the source tree (editable install) and reject garbage names."""

from __future__ import annotations

from pathlib import Path

from rynn_teleop.paths import config_file, share_dir, urdf_file

ROOT = Path(__file__).resolve().parents[1]


def test_source_tree_is_the_share_dir_in_editable_mode():
    assert share_dir() == ROOT
    assert config_file("joint_sweep") == ROOT / "config" / "joint_sweep.yaml"
    assert config_file("joint_sweep.yaml").is_file()
    assert urdf_file("robot.yaml").is_file()
