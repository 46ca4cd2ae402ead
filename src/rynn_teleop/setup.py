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
    "policy": "rynn_teleop.nodes.policy:main",
    "arm_driver": "rynn_teleop.nodes.arm_driver:main",
    "hand_driver": "rynn_teleop.nodes.hand_driver:main",
    "twin": "rynn_teleop.nodes.twin:main",
    "head_camera": "rynn_teleop.nodes.head_camera:main",
    "camera_switch": "rynn_teleop.nodes.camera_switch:main",
    "world_model": "rynn_teleop.nodes.world_model:main",
    "recorder": "rynn_teleop.nodes.recorder:main",
    "console": "rynn_teleop.nodes.console:main",
    "foxglove": "rynn_teleop.nodes.foxglove:main",
}


# Installs by role, the same lists as requirements/<role>.txt at the repository root (tests/test_install_roles.py
# keeps them equal; this file cannot read them: a Docker or colcon build sees src/ only). The runtime is an
# extra too, not install_requires: a ROS workspace gets numpy, OpenCV... from Debian, whose packages pip
# does not see, and a console script would then refuse to start.
#   pip install -e "src/rynn_teleop[runtime]"               the robot runtime (requirements/core.txt)
#   pip install -e "src/rynn_teleop[runtime,vendor]"        + the lab's device SDKs
#   pip install -e "src/rynn_teleop[world-model]"           the diffusion backend (torch, diffusers)
RUNTIME = [
    "numpy", "scipy", "threadpoolctl", "pyyaml", "pin", "ruckig", "rosbags>=0.11", "mcap>=1.6", "mcap-ros2-support",
    "ruamel.yaml",
    "opencv-python-headless", "mujoco", "aiohttp", "foxglove-sdk",
]
WORLD_MODEL = ["torch==2.13.0", "diffusers==0.42.1", "peft", "transformers", "safetensors"]
EXTRAS = {
    "runtime": RUNTIME,
    "vendor": ["openvr", "wujihandpy>=1.8.0", "pyrealsense2"],
    "world-model": WORLD_MODEL,
    "training": [*WORLD_MODEL, "accelerate", "tqdm", "tensorboard", "torchmetrics", "matplotlib", "av"],
    "export": ["av", "pyarrow"],
    "test": ["pytest", "hypothesis"],
}


def _data(folder: str, pattern: str) -> list[str]:
    return sorted(glob(str(ROOT / folder / pattern)))


setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "tests"]),
    package_data={PACKAGE: ["console/static/*", "console/static/vendor/three/*"]},  # the operator console's page
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + PACKAGE]),
        ("share/" + PACKAGE, ["package.xml"]),
        ("share/" + PACKAGE + "/launch", _data("launch", "*.launch.py")),
        (
            "share/" + PACKAGE + "/config",
            [p for ext in ("yaml", "xml", "rviz", "json") for p in _data("config", "*." + ext)],
        ),
        ("share/" + PACKAGE + "/config/sim", _data("config/sim", "*.yaml")),  # the twin's task scenes
        ("share/" + PACKAGE + "/urdf", _data("urdf", "*.urdf") + _data("urdf", "*.yaml")),
    ],
    install_requires=["setuptools"],
    extras_require=EXTRAS,
    zip_safe=False,  # the console page is read from the package folder
    maintainer="rynn_teleop developers",
    maintainer_email="rynn-teleop@example.com",
    description="Teleoperation of a bimanual dexterous robot, real and digital (world model).",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [f"{name} = {target}" for name, target in NODES.items()]
        + ["rynn-teleop = rynn_teleop.cli:main",
           "lifecycle_manager = rynn_teleop.nodes.lifecycle_manager:main"],  # the launch file's (not a node of NODES)
    },
)
