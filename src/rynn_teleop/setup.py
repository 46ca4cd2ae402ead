"""ament_python package rynn_teleop.

Data folders live at the repository root (launch/, urdf/, config/) and are
installed into share/rynn_teleop/ so that `ros2 launch rynn_teleop ...` works
after `colcon build`. In editable mode (pip install -e) they are found in the
source tree instead (rynn_teleop.paths).
"""

from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = "rynn_teleop"
HERE = Path(__file__).resolve().parent
ROOT = Path("..") / ".."  # relative globs: setuptools wants relative data_files paths

# Node executables (ros2 run rynn_teleop <name>); keep in sync with rynn_teleop.nodes.REGISTRY.
NODES = {
    "robot_description": "rynn_teleop.nodes.robot_description:main",
    "joint_sweep": "rynn_teleop.nodes.joint_sweep:main",
    "robot_markers": "rynn_teleop.nodes.robot_markers:main",
    "tracker": "rynn_teleop.nodes.tracker:main",
    "arm_ik": "rynn_teleop.nodes.arm_ik:main",
    "hand_retarget": "rynn_teleop.nodes.hand_retarget:main",
    "arm_driver": "rynn_teleop.nodes.arm_driver:main",
    "hand_driver": "rynn_teleop.nodes.hand_driver:main",
    "head_camera": "rynn_teleop.nodes.head_camera:main",
    "camera_switch": "rynn_teleop.nodes.camera_switch:main",
    "world_model": "rynn_teleop.nodes.world_model:main",
    "recorder": "rynn_teleop.nodes.recorder:main",
    "console": "rynn_teleop.nodes.console:main",
    "foxglove": "rynn_teleop.nodes.foxglove:main",
}


def _data(folder: str, pattern: str) -> list[str]:
    return sorted(glob(str(ROOT / folder / pattern)))


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "tests"]),
    package_data={PACKAGE: ["console/static/*"]},  # the operator console's page
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + PACKAGE]),
        ("share/" + PACKAGE, ["package.xml"]),
        ("share/" + PACKAGE + "/launch", _data("launch", "*.launch.py")),
        (
            "share/" + PACKAGE + "/config",
            [p for ext in ("yaml", "xml", "rviz", "json") for p in _data("config", "*." + ext)],
        ),
        ("share/" + PACKAGE + "/urdf", _data("urdf", "*.urdf") + _data("urdf", "*.yaml")),
    ],
    install_requires=["setuptools"],
    extras_require={"test": ["pytest", "hypothesis"]},
    zip_safe=False,  # the console page is read from the package folder
    maintainer="rynn_teleop developers",
    maintainer_email="rynn-teleop@example.com",
    description="Teleoperation of a bimanual dexterous robot, real and digital (world model).",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [f"{name} = {target}" for name, target in NODES.items()]
        + ["rynn-teleop = rynn_teleop.cli:main"],
    },
)
