"""Data folders are found in the source tree (editable install) or the install space (colcon)."""

from __future__ import annotations

from pathlib import Path

import rynn_teleop
from rynn_teleop.paths import config_file, share_dir, urdf_file

ROOT = Path(__file__).resolve().parents[1]


def test_data_folders_resolve():
    from_source = ROOT / "src" in Path(rynn_teleop.__file__).resolve().parents
    if from_source:  # pip install -e / PYTHONPATH: the repository's own folders
        assert share_dir() == ROOT
    else:  # colcon install: share/rynn_teleop
        assert share_dir().parts[-2:] == ("share", "rynn_teleop")
    assert config_file("joint_sweep") == share_dir() / "config" / "joint_sweep.yaml"
    assert config_file("joint_sweep.yaml").is_file()
    assert urdf_file("robot.yaml").is_file()
    assert (share_dir() / "launch" / "description.launch.py").is_file()
