"""A policy folder written by LeRobot 0.6's ``lerobot-train``, run in LeRobot's own Python (ROS-free).

LeRobot 0.6 needs Python 3.12 and older torch and numpy than the stack's environment, so the policy runs in a
worker process (``lerobot_worker.py``) started with the Python of LeRobot's environment
(``scripts/lerobot_env.sh``: ``.venv-lerobot/``); the two exchange :mod:`.wire` messages over the worker's
stdin and stdout. This module imports neither torch nor LeRobot: building :class:`LeRobotPolicy` reads the
policy folder's JSON files and the training dataset's ``meta/info.json`` here, refuses a policy that is not for
this robot before any worker starts, then starts the worker and waits until it has loaded the policy.

What the worker does per :meth:`LeRobotPolicy.act` is LeRobot's own inference (``predict_action``), so action
chunking (ACT runs its model once per ``n_action_steps`` calls and pops the queued actions in between) and
temporal ensembling are the policy's own; see ``lerobot_worker.py``.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ..core.params import Param
from ..core.robot_model import CANONICAL_JOINT_NAMES
from ..errors import ConfigurationError, ParameterError
from . import wire
from .base import ACTION_KEY, IMAGE_PREFIX, POLICY_BACKENDS, STATE_KEY, PolicyContext, PolicyRunner, PolicySpec
from .errors import PolicyError

log = logging.getLogger(__name__)

WORKER_SCRIPT = Path(__file__).with_name("lerobot_worker.py")
PYTHON_ENV = "RYNN_LEROBOT_PYTHON"  # LeRobot's python, when set and the `python` setting is empty
VENV_ENV = "RYNN_LEROBOT_VENV"  # LeRobot's environment folder (as scripts/lerobot_env.sh reads it)
ENV_SCRIPT = "scripts/lerobot_env.sh"
CONFIG_FILE = "config.json"  # huggingface_hub CONFIG_NAME: the policy config
WEIGHTS_FILE = "model.safetensors"
TRAIN_CONFIG_FILE = "train_config.json"
PROCESSOR_FILES = ("policy_preprocessor.json", "policy_postprocessor.json")
PRETRAINED_DIR = "pretrained_model"  # lerobot-train: <output_dir>/checkpoints/<step>|last/pretrained_model
STDERR_LINES = 30  # worker log lines kept for error messages
_EXIT_GRACE_S = 3.0  # [s] a closed worker may take this long to exit before it is killed


def _device_problem(device: str) -> str | None:
    kind, colon, index = device.partition(":")
    ok = device in ("cpu", "mps", "xpu") or (kind == "cuda" and (not colon or index.isdigit()))
    return None if ok else "is not cpu, cuda, cuda:N, mps or xpu"


# ---------------------------------------------------------------------------------------------- the folder
class PolicyFolder(NamedTuple):
    """What the main process knows of a policy folder without loading it."""

    path: Path  # the pretrained_model folder (config.json, model.safetensors, policy_*processor*)
    config: dict[str, Any]  # config.json
    spec: PolicySpec  # what it takes and gives (source: path)
    dataset_root: Path  # the training dataset (its meta/ gave fps and joint names)
    robot_type: str  # the dataset's robot_type ("" if none)


def resolve_policy_folder(path: str | os.PathLike) -> Path:
    """The ``pretrained_model`` folder ``path`` names: a ``lerobot-train`` output folder (its
    ``checkpoints/last/pretrained_model``), its ``checkpoints`` folder, one checkpoint (``<step>/pretrained_model``)
    or the ``pretrained_model`` folder itself.

    Raises:
        ConfigurationError: no such folder, or none of these layouts.
    """
    given = Path(path).expanduser()
    if not str(path):
        raise ConfigurationError("no policy folder given")
    if not given.is_dir():
        raise ConfigurationError(f"policy folder {str(given)!r} does not exist" if not given.exists()
                                 else f"policy folder {str(given)!r} is not a folder")
    candidates = (given, given / PRETRAINED_DIR, given / "last" / PRETRAINED_DIR,
                  given / "checkpoints" / "last" / PRETRAINED_DIR)
    for folder in candidates:
        if (folder / CONFIG_FILE).is_file():
            return folder
    raise ConfigurationError(f"{str(given)!r} is not a LeRobot policy folder: no {CONFIG_FILE} in it nor in "
                             f"{PRETRAINED_DIR}/, last/{PRETRAINED_DIR}/ or checkpoints/last/{PRETRAINED_DIR}/ "
                             "(give a lerobot-train output folder, a checkpoint or its pretrained_model folder)")


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read {what} {str(path)!r}: {exc}") from exc


def _lerobot_home() -> Path:
    """LeRobot's dataset cache ($HF_LEROBOT_HOME, else $HF_HOME/lerobot): where a dataset given only by repo id
    lives (lerobot.utils.constants)."""
    if os.environ.get("HF_LEROBOT_HOME"):
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(hf_home).expanduser() / "lerobot"


def _dataset_root(folder: Path, dataset_root: str) -> Path:
    """The training dataset's root: ``dataset_root``, else train_config.json's dataset.root (or LeRobot's cache
    folder of its dataset.repo_id)."""
    hint = "set the `dataset_root` setting to the dataset the policy was trained on"
    if dataset_root:
        root, source = Path(dataset_root).expanduser(), "the dataset_root setting"
    else:
        train_path = folder / TRAIN_CONFIG_FILE
        if not train_path.is_file():
            raise ConfigurationError(f"policy folder {str(folder)!r} has no {TRAIN_CONFIG_FILE}, so the dataset it "
                                     f"was trained on (frame rate, joint names) is unknown: {hint}")
        dataset = _read_json(train_path, "the training config").get("dataset") or {}
        if dataset.get("root"):
            root, source = Path(dataset["root"]).expanduser(), f"{TRAIN_CONFIG_FILE} dataset.root"
        elif isinstance(dataset.get("repo_id"), str) and dataset["repo_id"]:
            root = _lerobot_home() / dataset["repo_id"]
            source = f"LeRobot's cache folder of {TRAIN_CONFIG_FILE} dataset.repo_id {dataset['repo_id']!r}"
        else:
            raise ConfigurationError(f"{str(train_path)!r} names no dataset (dataset.root, dataset.repo_id): {hint}")
    if not (root / "meta" / "info.json").is_file():
        raise ConfigurationError(f"the training dataset's metadata {str(root / 'meta' / 'info.json')!r} (from "
                                 f"{source}) does not exist: {hint}")
    return root


def _names(info: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    feature = (info.get("features") or {}).get(key)
    if not isinstance(feature, Mapping):
        raise ConfigurationError(f"{where} has no feature {key!r}")
    names = feature.get("names")
    if isinstance(names, Mapping) and len(names) == 1:  # older datasets: {"motors": [...]}
        names = next(iter(names.values()))
    if not isinstance(names, Sequence) or isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise ConfigurationError(f"{where}: feature {key!r} has no joint names (features.{key}.names)")
    return tuple(names)


def _shape(feature: Any, key: str, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in feature["shape"])
    except (TypeError, KeyError, ValueError):
        raise ConfigurationError(f"{where}: feature {key!r} has no shape") from None


def read_policy_folder(path: str | os.PathLike, *, dataset_root: str = "",
                       joint_names: Sequence[str] = CANONICAL_JOINT_NAMES) -> PolicyFolder:
    """The policy folder ``path`` names (see :func:`resolve_policy_folder`) and its :class:`PolicySpec`, checked
    against the robot whose joints are ``joint_names``, without starting torch.

    The spec: ``fps`` and the joint names of ``observation.state`` and ``action`` from the training dataset's
    ``meta/info.json`` (``dataset_root``, else train_config.json's ``dataset.root``); the cameras and their
    (height, width) from config.json's ``input_features`` (``observation.images.<camera>``: [3, H, W]).

    Raises:
        ConfigurationError: a missing folder or file (config.json, model.safetensors, the processors, the
            dataset's meta/info.json), a config.json without ``type`` or with inputs this robot does not provide,
            dimensions that differ from the dataset's joint names, or a policy for another robot (the dimension
            or joint order of its action or state differs from ``joint_names``: the message names the first
            difference).
    """
    folder = resolve_policy_folder(path)
    missing = [f for f in (WEIGHTS_FILE, *PROCESSOR_FILES) if not (folder / f).is_file()]
    if missing:
        raise ConfigurationError(f"policy folder {str(folder)!r} lacks {', '.join(missing)} (a lerobot-train "
                                 "checkpoint's pretrained_model folder has config.json, model.safetensors and the "
                                 "policy_preprocessor/policy_postprocessor files)")
    where = f"{str(folder / CONFIG_FILE)!r}"
    config = _read_json(folder / CONFIG_FILE, "the policy config")
    if not isinstance(config, dict) or not isinstance(config.get("type"), str):
        raise ConfigurationError(f"{where} has no policy 'type'")
    root = _dataset_root(folder, dataset_root)
    info_path = root / "meta" / "info.json"
    info = _read_json(info_path, "the dataset metadata")
    meta = f"{str(info_path)!r}"
    state_names, action_names = _names(info, STATE_KEY, meta), _names(info, ACTION_KEY, meta)
    try:
        fps = float(info["fps"])
    except (KeyError, TypeError, ValueError):
        raise ConfigurationError(f"{meta} has no fps") from None

    images: dict[str, tuple[int, int]] = {}
    takes_state = False
    for key, feature in (config.get("input_features") or {}).items():
        kind = feature.get("type") if isinstance(feature, Mapping) else None
        shape = _shape(feature, key, where)
        if kind == "VISUAL" and key.startswith(IMAGE_PREFIX) and len(shape) == 3 and shape[0] == 3:
            images[key[len(IMAGE_PREFIX):]] = (shape[1], shape[2])
        elif kind == "STATE" and key == STATE_KEY:
            takes_state = True
            if shape != (len(state_names),):
                raise ConfigurationError(f"the policy's {STATE_KEY} has shape {list(shape)} ({where}) but the "
                                         f"dataset names {len(state_names)} state joints ({meta}): "
                                         "not the dataset this policy was trained on (setting dataset_root)")
        else:
            raise ConfigurationError(f"the policy takes {key!r} ({kind}, shape {list(shape)}; {where}), which this "
                                     f"robot does not provide (it gives {STATE_KEY} and "
                                     f"{IMAGE_PREFIX}<camera> colour images [3, H, W])")
    if not takes_state:
        raise ConfigurationError(f"the policy takes no {STATE_KEY} ({where}): not a policy for this robot")
    action = (config.get("output_features") or {}).get(ACTION_KEY)
    if not isinstance(action, Mapping):
        raise ConfigurationError(f"the policy gives no {ACTION_KEY!r} ({where} output_features)")
    action_shape = _shape(action, ACTION_KEY, where)
    if action_shape != (len(action_names),):
        raise ConfigurationError(f"the policy's {ACTION_KEY} has shape {list(action_shape)} ({where}) but the "
                                 f"dataset names {len(action_names)} action joints ({meta}): not the dataset "
                                 "this policy was trained on (setting dataset_root)")
    spec = PolicySpec(fps, state_names, action_names, images, source=str(folder))
    spec.check(joint_names)
    return PolicyFolder(folder, config, spec, root, str(info.get("robot_type") or ""))


def lerobot_python(python: str = "") -> Path:
    """LeRobot's Python: ``python``, else $RYNN_LEROBOT_PYTHON, else $RYNN_LEROBOT_VENV/bin/python, else
    ``<repository>/.venv-lerobot/bin/python`` (what ``scripts/lerobot_env.sh`` creates).

    Raises:
        ConfigurationError: that file does not exist or cannot be run (the message says how to make it).
    """
    if python:
        candidate, source = Path(python).expanduser(), "the python setting"
    elif os.environ.get(PYTHON_ENV):
        candidate, source = Path(os.environ[PYTHON_ENV]).expanduser(), f"${PYTHON_ENV}"
    elif os.environ.get(VENV_ENV):
        candidate, source = Path(os.environ[VENV_ENV]).expanduser() / "bin" / "python", f"${VENV_ENV}"
    else:
        from ..paths import share_dir

        try:
            root = share_dir()
        except ConfigurationError:
            root = Path(__file__).resolve().parents[4]
        candidate, source = root / ".venv-lerobot" / "bin" / "python", "the default"
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        raise ConfigurationError(f"LeRobot's Python {str(candidate)!r} ({source}) "
                                 f"{'does not exist' if not candidate.exists() else 'cannot be run'}: create "
                                 f"LeRobot's environment with {ENV_SCRIPT} (it prints its python), or give its "
                                 f"python in the python setting or ${PYTHON_ENV}")
    return candidate


# ---------------------------------------------------------------------------------------------- the worker
class _Watchdog:
    """Calls ``expire(what)`` when a request is still running at its deadline (one request at a time)."""

    def __init__(self, expire: Callable[[str], None]) -> None:
        self._expire = expire
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._what = ""
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="lerobot-policy-watchdog", daemon=True)
        self._thread.start()

    def arm(self, seconds: float, what: str) -> None:
        with self._cond:
            self._deadline, self._what = time.monotonic() + seconds, what
            self._cond.notify()

    def disarm(self) -> None:
        with self._cond:
            self._deadline = None

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._deadline = None
                self._expire(self._what)


_GONE = object()  # the reply queue's end: the worker's stdout closed


@POLICY_BACKENDS.register
class LeRobotPolicy(PolicyRunner):
    """A LeRobot 0.6 policy folder run by a worker process in LeRobot's own Python.

    Built in two steps, each refusing with a :class:`~rynn_teleop.errors.ConfigurationError` that names what is
    wrong: :func:`read_policy_folder` (the folder, its files, the training dataset's metadata, and whether it is
    a policy for this robot: ``spec.check``), then the worker is started and waits until it has loaded the
    policy (a policy type or file LeRobot cannot load is refused with LeRobot's message).

    Thread-safe for one caller at a time (concurrent calls wait for each other). Once the worker dies or hangs
    (no reply within ``timeout_s``: it is killed), every call raises :class:`~.errors.PolicyError` naming the
    worker's last log lines; build a new runner to go on. :meth:`close` (also at interpreter exit) ends it.

    Args:
        path: the policy folder (see :func:`resolve_policy_folder`).
        python: LeRobot's Python ("" : see :func:`lerobot_python`).
        device: torch device of the worker ("cpu", "cuda", "cuda:N", "mps", "xpu"); refused if not available.
        n_action_steps: actions per model run (<= the policy's chunk_size); 0: the policy's own.
        temporal_ensemble_coeff: ACT's temporal ensembling coefficient (the ACT paper: 0.01; the model then
            runs at every step); 0: the policy's own.
        dataset_root: the training dataset ("" : train_config.json's dataset.root).
        threads: torch threads in the worker.
        seed: torch's seed in the worker, set at start and at every :meth:`reset`.
        task: the task instruction (language-conditioned policies; ACT ignores it).
        timeout_s: [s] how long one request may take before the worker is declared hung.
        start_timeout_s: [s] how long the worker may take to load the policy.
        joint_names: the robot's joints, in order (what the policy's state and action must be).

    Attributes:
        spec: what the policy takes and gives (from the folder; see :func:`read_policy_folder`).
        folder: the policy folder as read here (its config.json, the training dataset's root).
        worker: what the worker loaded (its ``ready`` message: ``type``, ``device``, ``input_features``,
            ``output_features``, ``chunk_size``, ``n_action_steps``, ``temporal_ensemble_coeff``, ``threads``,
            ``load_s`` [s], ``warnings``, ``versions``).
        inferences: how many times the worker ran the model (predicted an action chunk) since it started.
        last_worker_s: [s] the last request's time inside the worker (the rest of a call is the pipe).
    """

    name = "lerobot"
    SETTINGS = (
        Param("path", str, "", "the policy folder: a lerobot-train output folder (its checkpoints/last/"
              "pretrained_model), a checkpoint folder or its pretrained_model folder (required)"),
        Param("python", str, "", f"LeRobot's Python; empty: ${PYTHON_ENV}, else ${VENV_ENV}/bin/python, else "
              f"<repository>/.venv-lerobot/bin/python (made by {ENV_SCRIPT})"),
        Param("device", str, "cpu", "torch device of the worker (cpu, cuda, cuda:N, mps, xpu)", check=_device_problem),
        Param("n_action_steps", int, 0, "actions executed per model run (at most the policy's chunk_size); 0: the "
              "policy's own", "steps", min=0, max=100000),
        Param("temporal_ensemble_coeff", float, 0.0, "ACT temporal ensembling coefficient (0.01 in the ACT paper; "
              "runs the model every step); 0: the policy's own (off unless trained with it)", min=0.0, max=100.0),
        Param("dataset_root", str, "", "the dataset the policy was trained on (its meta/info.json gives fps and "
              "joint names); empty: train_config.json's dataset.root"),
        Param("threads", int, 1, "torch threads in the worker", "threads", min=1, max=256),
        Param("seed", int, 0, "torch seed in the worker, set at start and at every reset", min=0, max=2**31 - 1),
        Param("task", str, "", "task instruction for language-conditioned policies (ACT ignores it)"),
        Param("timeout_s", float, 10.0, "longest one request may take before the worker is declared hung and "
              "killed", "s", min=0.1, max=3600.0),
        Param("start_timeout_s", float, 180.0, "longest the worker may take to start and load the policy", "s",
              min=1.0, max=3600.0),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: PolicyContext | None) -> LeRobotPolicy:
        """The runner for the robot of ``context`` (its joint order)."""
        if not settings.get("path"):
            raise ParameterError("path", "path is empty: give the policy folder")
        robot = getattr(context, "robot", None)
        names = tuple(robot.joint_names) if robot is not None else CANONICAL_JOINT_NAMES
        runner = cls(**settings, joint_names=names)
        rate = getattr(context, "rate_hz", None)
        if rate and abs(rate - runner.spec.fps) > 0.01 * runner.spec.fps:
            log.warning("policy %s was trained at %g fps but act() is called at %g Hz: each of its actions "
                        "lasts %.1f%% of a training step", runner.folder.path, runner.spec.fps, rate,
                        100.0 * runner.spec.fps / rate)
        return runner

    def __init__(self, path: str | os.PathLike, *, python: str = "", device: str = "cpu", n_action_steps: int = 0,
                 temporal_ensemble_coeff: float = 0.0, dataset_root: str = "", threads: int = 1, seed: int = 0,
                 task: str = "", timeout_s: float = 10.0, start_timeout_s: float = 180.0,
                 joint_names: Sequence[str] = CANONICAL_JOINT_NAMES) -> None:
        problem = _device_problem(device)
        if problem:
            raise ParameterError("device", f"device = {device!r} {problem}")
        self.folder = read_policy_folder(path, dataset_root=dataset_root, joint_names=joint_names)
        self.spec = self.folder.spec
        self._check_inference_settings(n_action_steps, temporal_ensemble_coeff)
        self.python = lerobot_python(python)
        self.timeout_s = float(timeout_s)
        self.inferences = 0  # model runs (action chunks predicted) in the worker since it started
        self.last_worker_s = 0.0  # [s] the last request's time inside the worker
        self._inputs = dict(self.folder.config.get("input_features") or {})
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._failure: str | None = None  # why the worker is unusable (None while it is fine)
        self._hung: str | None = None
        self._request_id = 0
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._replies: queue.Queue = queue.Queue()
        command = [str(self.python), str(WORKER_SCRIPT), str(self.folder.path), "--device", device,
                   "--n-action-steps", str(n_action_steps), "--temporal-ensemble-coeff", repr(temporal_ensemble_coeff),
                   "--threads", str(threads), "--seed", str(seed), "--task", task,
                   "--robot-type", self.folder.robot_type]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", PYTHONUNBUFFERED="1",
                   OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self._watchdog = _Watchdog(self._expire)
        try:
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            self._watchdog.stop()
            raise ConfigurationError(f"cannot start LeRobot's Python {str(self.python)!r}: {exc}") from exc
        atexit.register(self.close)
        self._threads = [threading.Thread(target=self._read_replies, name="lerobot-policy-replies", daemon=True),
                         threading.Thread(target=self._read_log, name="lerobot-policy-log", daemon=True)]
        for thread in self._threads:
            thread.start()
        try:
            self.worker = self._wait_ready(start_timeout_s)
        except BaseException:
            self.close()
            raise
        for line in self.worker.get("warnings", ()):
            log.warning("policy %s: %s", self.folder.path, line)

    def _check_inference_settings(self, n_action_steps: int, coeff: float) -> None:
        config, kind = self.folder.config, self.folder.config["type"]
        for key, value in (("n_action_steps", n_action_steps), ("temporal_ensemble_coeff", coeff)):
            if value and key not in config:
                raise ParameterError(key, f"{key} = {value}: policy type {kind!r} has no such setting")
        chunk = config.get("chunk_size")
        if n_action_steps and isinstance(chunk, int) and n_action_steps > chunk:
            raise ParameterError("n_action_steps", f"n_action_steps = {n_action_steps} is more than the policy's "
                                                   f"chunk_size {chunk}")
        if coeff and n_action_steps > 1:
            raise ParameterError("n_action_steps", f"n_action_steps = {n_action_steps}: temporal ensembling runs "
                                                   "the model every step (n_action_steps 1 or 0)")

    # ------------------------------------------------------------------ PolicyRunner
    def reset(self) -> None:
        """Start a new episode: the policy's queued actions and ensemble are dropped, the seed set again.

        Raises:
            PolicyError: the worker died, hung or failed.
        """
        self._request("reset")

    def act(self, observation: Mapping[str, np.ndarray]) -> np.ndarray:
        """The (54,) float64 joint position action [rad] for ``observation`` (see :meth:`PolicyRunner.act`; keys
        the policy does not take are ignored).

        Raises:
            ValueError: an observation without a key the policy takes, or with a wrong shape or dtype.
            PolicyError: the worker died, hung or failed.
        """
        reply = self._request("act", self._observation(observation))
        action = reply.arrays.get("action")
        n = len(self.spec.action_names)
        if action is None or action.shape != (n,):
            got = None if action is None else action.shape
            raise PolicyError(f"the LeRobot worker's action has shape {got}, expected ({n},)", alive=True)
        return action.astype(np.float64)

    def normalized(self, observation: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The preprocessed batch the policy's model would get for ``observation`` (LeRobot feature name ->
        array with the batch dimension, normalised as in training); no action is taken.

        Raises:
            ValueError, PolicyError: as :meth:`act`.
        """
        return dict(self._request("normalized", self._observation(observation)).arrays)

    def close(self) -> None:
        """End the worker (it exits when its stdin closes; killed if it has not within a few seconds). Idempotent;
        also run at interpreter exit."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        proc = self._proc
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("policy %s: the LeRobot worker did not exit within %.0f s of close(): killed",
                        self.folder.path, _EXIT_GRACE_S)
            proc.kill()
            proc.wait()
        self._watchdog.stop()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=1.0)
        for stream in (proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass

    def __enter__(self) -> LeRobotPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker_pid(self) -> int:
        """The worker process's id."""
        return self._proc.pid

    # ------------------------------------------------------------------ requests
    def _observation(self, observation: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays of ``observation`` the policy takes, checked (state as float32, images uint8 (H, W, 3))."""
        out = {}
        for key in self._inputs:
            if key not in observation:
                raise ValueError(f"the observation has no {key!r} (it has {', '.join(observation) or 'nothing'})")
            value = np.asarray(observation[key])
            if key == STATE_KEY:
                want = (len(self.spec.state_names),)
                value = value.astype(np.float32, copy=False)
            else:
                height, width = self.spec.images[key[len(IMAGE_PREFIX):]]
                want = (height, width, 3)
                if value.dtype != np.uint8:
                    raise ValueError(f"{key} has dtype {value.dtype}, the policy takes uint8 RGB")
            if value.shape != want:
                raise ValueError(f"{key} has shape {value.shape}, the policy takes {want}")
            out[key] = value
        return out

    def _request(self, op: str, arrays: Mapping[str, np.ndarray] | None = None) -> wire.Message:
        with self._lock:
            if self._closed:
                raise PolicyError(f"policy {self.folder.path}: the runner is closed")
            if self._failure is not None:
                raise PolicyError(self._failure)
            self._request_id += 1
            rid = self._request_id
            self._watchdog.arm(self.timeout_s, f"gave no reply to {op!r} within {self.timeout_s:g} s")
            try:
                try:
                    wire.write_message(self._proc.stdin, {"op": op, "id": rid}, arrays)
                except (OSError, ValueError):  # a closed pipe: the worker is gone (its reader says why)
                    pass
                try:
                    reply = self._replies.get(timeout=self.timeout_s + _EXIT_GRACE_S)
                except queue.Empty:
                    reply = _GONE
                    self._expire(f"gave no reply to {op!r} within {self.timeout_s:g} s")
            finally:
                self._watchdog.disarm()
            if reply is _GONE:
                raise PolicyError(self._fail())
            self.inferences = int(reply.header.get("chunks", self.inferences))
            self.last_worker_s = float(reply.header.get("seconds", 0.0))
            if reply.header.get("id") != rid:
                self._expire(f"answered request {reply.header.get('id')!r} to request {rid} (a protocol error)")
                raise PolicyError(self._fail())
            if not reply.header.get("ok"):
                log.debug("policy worker traceback:\n%s", reply.header.get("traceback", ""))
                raise PolicyError(f"policy {self.folder.path}: {op} failed in the LeRobot worker: "
                                  f"{reply.header.get('error')}", alive=True)
            return reply

    def _wait_ready(self, timeout_s: float) -> dict[str, Any]:
        self._watchdog.arm(timeout_s, f"did not load the policy within {timeout_s:g} s")
        try:
            reply = self._replies.get(timeout=timeout_s + _EXIT_GRACE_S)
        except queue.Empty:
            reply = _GONE
            self._expire(f"did not load the policy within {timeout_s:g} s")
        finally:
            self._watchdog.disarm()
        if reply is not _GONE and reply.header.get("op") == "ready":
            return reply.header
        if reply is not _GONE and reply.header.get("op") == "error":
            error = str(reply.header.get("error"))
            hint = ""
            if error.startswith(("ModuleNotFoundError", "ImportError")):
                hint = f" (is {str(self.python)!r} LeRobot's environment? {ENV_SCRIPT} makes it)"
            self._proc.wait(timeout=_EXIT_GRACE_S)
            raise ConfigurationError(f"LeRobot cannot load the policy {str(self.folder.path)!r} (type "
                                     f"{self.folder.config['type']!r}): {error}{hint}")
        raise ConfigurationError(self._fail(starting=True))

    # ------------------------------------------------------------------ the worker's streams and end
    def _expire(self, what: str) -> None:
        """The worker is hung: kill it (the reply reader then sees its stdout end)."""
        self._hung = what
        try:
            self._proc.kill()
        except OSError:
            pass

    def _fail(self, *, starting: bool = False) -> str:
        """Mark the worker unusable; the message says why, with its last log lines."""
        if self._failure is not None:
            return self._failure
        try:
            code = self._proc.wait(timeout=_EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            code = self._proc.wait()
        self._threads[1].join(timeout=1.0)  # the log to its end
        if self._hung:
            how = f"{self._hung}: killed"
        else:
            how = f"exited with code {code}" + (" while loading the policy" if starting else "")
        lines = list(self._stderr)
        tail = ("; its last log lines:\n    " + "\n    ".join(lines)) if lines else "; it logged nothing"
        self._failure = f"the LeRobot worker of policy {self.folder.path} (pid {self._proc.pid}) {how}{tail}"
        return self._failure

    def _read_replies(self) -> None:
        stream = self._proc.stdout
        try:
            while True:
                message = wire.read_message(stream)
                if message is None:
                    break
                self._watchdog.disarm()
                self._replies.put(message)
        except (wire.WireError, OSError, ValueError) as exc:
            self._stderr.append(f"(runner: the worker's reply stream broke: {exc})")
        self._replies.put(_GONE)

    def _read_log(self) -> None:
        try:
            for raw in self._proc.stderr:
                line = raw.decode("utf-8", "replace").rstrip()
                if line:
                    self._stderr.append(line)
                    log.info("lerobot worker %d: %s", self._proc.pid, line)
        except (OSError, ValueError):
            pass


__all__ = ["LeRobotPolicy", "PolicyError", "PolicyFolder", "lerobot_python", "read_policy_folder",
           "resolve_policy_folder"]
