"""Installs by role: the robot runtime (requirements/core.txt) runs the stack without torch; the extras
(vendor, world-model, training, export) are the same lists in requirements/, setup.py and docker/Dockerfile;
the bootstrap (demo, tests, CI) installs every role and the lock covers every role.

The slow test builds a venv from the runtime requirements alone (one per checkout, cached under
``~/.cache/rynn_teleop/runtime-venv-<hash of the checkout's path>`` and rebuilt when those files change) and runs
``rynn-teleop run --mode digital`` in it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rclpy
import setuptools
from rclpy.node import Node
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState

ROOT = Path(__file__).resolve().parents[1]
REQ = ROOT / "requirements"
#: the files scripts/bootstrap.sh installs and scripts/lock.sh locks, every role
ROLES = ("ros-pypi", "core", "vendor", "world-model", "training", "export", "dev", "bench", "docs")
#: requirements files that are not a role of the stack's venv (apt packages, a CUDA extra, LeRobot's own venv)
NOT_ROLES = {"apt", "gpu", "lerobot", "constraints"}
#: setup.py extra -> requirements file
EXTRA_FILES = {"runtime": "core", "vendor": "vendor", "world-model": "world-model", "training": "training",
               "export": "export"}
#: pip packages of the runtime that the Docker image takes from Debian / ROS instead (its apt-get line)
DEBIAN_PROVIDED = {"numpy": "python3-numpy", "scipy": "python3-scipy", "pyyaml": "python3-yaml",
                   "opencv-python-headless": "python3-opencv", "pin": "ros-jazzy-pinocchio"}
#: the packages of the extras: none may be imported by the runtime path
EXTRA_MODULES = ("torch", "diffusers", "peft", "transformers", "safetensors", "accelerate", "tensorboard",
                 "torchmetrics", "matplotlib", "av", "pyarrow", "openvr", "wujihandpy", "pyrealsense2")
RUNTIME_VENV_FILES = ("requirements/ros-pypi.txt", "requirements/core.txt", "requirements/constraints.txt",
                      "src/rynn_teleop/setup.py", "src/rynn_teleop/setup.cfg")
VENV_BUILD_TIMEOUT_S = 900  # [s] a fresh runtime venv (measured: about 40 s from this machine's local indexes)
RUN_DURATION_S = 8.0  # [s] rynn-teleop run --duration in the runtime venv
CACHE_UNUSED_S = 86400.0  # [s] a cached runtime venv of another checkout unused this long is removed


def _name(requirement: str) -> str:
    """The normalized project name of a requirement line (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0]).lower()


def requirements(role: str) -> list[str]:
    """The requirement lines of ``requirements/<role>.txt``, ``-r`` includes resolved, comments dropped."""
    out = []
    for line in (REQ / f"{role}.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            out += requirements(line[3:].strip().removesuffix(".txt"))
        elif line:
            out.append(line)
    return out


def _setup_kwargs() -> dict:
    captured = {}
    real = setuptools.setup
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    cwd = os.getcwd()
    try:
        os.chdir(ROOT / "src" / "rynn_teleop")
        runpy.run_path("setup.py", run_name="__main__")
    finally:
        os.chdir(cwd)
        setuptools.setup = real
    return captured


def test_setup_extras_are_the_requirements_files():
    extras = _setup_kwargs()["extras_require"]
    for extra, role in EXTRA_FILES.items():
        assert sorted(extras[extra]) == sorted(requirements(role)), f"setup.py extra {extra!r} != {role}.txt"
    assert _setup_kwargs()["install_requires"] == ["setuptools"], "the runtime is an extra (see setup.py)"


def test_bootstrap_and_lock_install_every_role():
    roles = {p.stem for p in REQ.glob("*.txt")} - NOT_ROLES
    assert roles == set(ROLES), "a requirements file that is neither a role nor listed as not one"
    for script in ("bootstrap.sh", "lock.sh"):
        text = (ROOT / "scripts" / script).read_text()
        listed = re.search(r"for role in ([a-z -]+); do", text)
        assert listed and tuple(listed.group(1).split()) == ROLES, f"scripts/{script} installs other roles"


def test_the_lock_pins_every_package_of_every_role():
    pinned = {_name(line) for line in (REQ / "constraints.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    for role in ROLES:
        missing = sorted({_name(r) for r in requirements(role)} - pinned)
        assert not missing, f"requirements/{role}.txt: {missing} not in constraints.txt (run scripts/lock.sh)"


def test_the_runtime_has_no_torch_and_the_extras_hold_it():
    runtime = {_name(r) for r in requirements("core")}
    assert not runtime & {"torch", "diffusers", "peft", "transformers", "accelerate", "tensorboard",
                          "torchmetrics", "matplotlib", "openvr", "wujihandpy", "pyrealsense2"}
    assert "torch" in {_name(r) for r in requirements("world-model")}
    assert {_name(r) for r in requirements("world-model")} <= {_name(r) for r in requirements("training")}


def _dockerfile_packages() -> tuple[set[str], str]:
    text = (ROOT / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    packages = set()
    for command in re.findall(r"pip3 install ([^&;\n]*)", text):
        words = command.split()
        skip = False
        for word in words:
            if skip:
                skip = False
            elif word == "--index-url":
                skip = True
            elif not word.startswith("-") and not word.startswith("$") and not word.startswith('"$'):
                packages.add(_name(word.strip('"')))
    return packages, text


def test_the_docker_image_installs_the_runtime_vendor_and_torch_roles():
    packages, text = _dockerfile_packages()
    runtime = {_name(r) for r in requirements("core")}
    for pip_name, debian in DEBIAN_PROVIDED.items():
        assert pip_name in runtime and debian in text, f"the image's {debian} stands for {pip_name}"
    expected = (runtime - set(DEBIAN_PROVIDED)) | {_name(r) for r in requirements("vendor")}
    expected |= {_name(r) for r in requirements("training")} | {"torchao"}  # WITH_TORCH (+ gpu.txt on CUDA)
    assert packages == expected, (f"Dockerfile lacks {sorted(expected - packages)}, "
                                  f"has beyond the roles {sorted(packages - expected)}")


def test_the_runtime_path_imports_no_extra(ros_env, tmp_path):
    """Every node of the digital mode, with the recorder, the console and Foxglove, in this venv (which has
    every extra) with the extras' packages made unimportable: none is imported."""
    blocker = (
        "import sys, importlib.abc\n"
        f"BLOCKED = {EXTRA_MODULES!r}\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            print('IMPORTED EXTRA', name, file=sys.stderr)\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from rynn_teleop.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    args = ["run", "--mode", "digital", "--one-process", "--record", "--console", "--foxglove", "--duration", "1",
            "-p", f"recorder.output_dir={tmp_path}", "-p", "console.port=0", "-p", "foxglove.port=0"]
    out = subprocess.run([sys.executable, "-c", blocker, *args], env=ros_env, capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert "IMPORTED EXTRA" not in out.stderr, out.stderr[-4000:]
    assert out.returncode == 0, out.stderr[-4000:]


# ---------------------------------------------------------------------- a fresh venv of the runtime alone
def _runtime_venv() -> Path:
    """A venv with requirements/ros-pypi.txt + core.txt (under the lock) and rynn_teleop (editable, no deps): one
    per checkout under ~/.cache/rynn_teleop, rebuilt in place when those files or this Python change.

    Each venv is 1.2 GB, so the cache is bounded: a venv whose checkout is gone (a CI clone, a removed temporary
    clone) or that was not used for CACHE_UNUSED_S is removed, and so is any venv of the former per-content layout.
    """
    digest = hashlib.sha256()
    for name in RUNTIME_VENV_FILES:
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    digest.update(sys.version.encode())
    content = digest.hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rynn_teleop"
    venv = cache / f"runtime-venv-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:16]}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "runtime-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building or pruning
        for old in cache.glob("runtime-venv-*"):
            if old == venv or not old.is_dir():
                continue
            marker, root = old / ".complete", old / ".checkout"
            used = marker.stat().st_mtime if marker.exists() else old.stat().st_mtime
            gone = not root.exists() or not Path(root.read_text()).is_dir()
            if gone or time.time() - used > CACHE_UNUSED_S:
                shutil.rmtree(old, ignore_errors=True)
        marker = venv / ".complete"
        if marker.exists() and marker.read_text() == content:
            os.utime(marker)  # last used now
            return venv
        shutil.rmtree(venv, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
        (venv / ".checkout").write_text(str(ROOT))
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        subprocess.run([*pip, "-c", str(REQ / "constraints.txt"), "-r", str(REQ / "ros-pypi.txt"),
                        "-r", str(REQ / "core.txt")], check=True, timeout=VENV_BUILD_TIMEOUT_S, env=env)
        subprocess.run([*pip, "--no-deps", "-e", str(ROOT / "src" / "rynn_teleop")], check=True, timeout=300,
                       env=env)
        marker.write_text(content)
        return venv


@pytest.mark.slow
def test_the_runtime_install_alone_runs_the_digital_mode_without_torch(ros_env, tmp_path):
    venv = _runtime_venv()
    python = venv / "bin" / "python"
    present = subprocess.run(
        [str(python), "-c", "import importlib.util as u, sys; "
         f"print(' '.join(m for m in {EXTRA_MODULES!r} if u.find_spec(m)))"],
        capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert present == [], f"the runtime venv has extras: {present}"

    env = {k: v for k, v in ros_env.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen([str(venv / "bin" / "rynn-teleop"), "run", "--mode", "digital", "--world-model-backend",
                             "render", "--duration", str(RUN_DURATION_S)], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=int(ros_env["ROS_DOMAIN_ID"]))
    probe = Node("runtime_probe", context=context)
    seen = {"frames": 0, "joint_states": 0}
    probe.create_subscription(Image, "/head_camera/generated/color/image_raw",
                              lambda m: seen.__setitem__("frames", seen["frames"] + 1), qos_profile_sensor_data)
    probe.create_subscription(JointState, "/joint_states",
                              lambda m: seen.__setitem__("joint_states", seen["joint_states"] + 1), 50)
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(probe)
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
    finally:
        executor.shutdown()
        probe.destroy_node()
        rclpy.shutdown(context=context)
        if proc.poll() is None:
            proc.kill()
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert seen["joint_states"] > 0 and seen["frames"] > 0, f"{seen}; {output[-3000:]}"
