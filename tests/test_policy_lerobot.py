"""The LeRobot policy runner (policies.lerobot): its wire format, its reading of a policy folder, and a tiny ACT
policy written by LeRobot's own save_pretrained run through the worker in LeRobot's environment.

The folder and spec tests need no LeRobot: they use a hand-written folder (config.json, empty weights, the
training dataset's meta/info.json). The others use LeRobot's environment (``scripts/lerobot_env.sh``, or
$RYNN_LEROBOT_PYTHON): a dataset exported from a recorded episode, tiny ACT policies written from it by
``tests/lerobot_tiny_policy.py`` (one right, one with a 53-D action, one whose dataset names two state joints in
another order), and a runner started on them.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from rynn_teleop.core.robot_model import CANONICAL_JOINT_NAMES
from rynn_teleop.errors import ConfigurationError, ParameterError
from rynn_teleop.policies import POLICY_BACKENDS, PolicyContext, wire
from rynn_teleop.policies.errors import PolicyError
from rynn_teleop.policies.lerobot import LeRobotPolicy, read_policy_folder, resolve_policy_folder
from rynn_teleop.policies.observation import ObservationBuilder

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "lerobot_tiny_policy.py"
CHUNK = 5  # the tiny policy's chunk_size and n_action_steps
H, W = 48, 64  # [px] the recorded episode's frames (recording_episodes)


# -- wire ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int16", "<i4", ">i8", "float16", "<f4", ">f8", "complex64"])
def test_wire_round_trip_keeps_dtype_shape_and_values(dtype):
    rng = np.random.default_rng(7)
    arrays = {}
    for n, shape in enumerate([(), (0,), (54,), (2, 3, 4), (H, W, 3)]):
        raw = rng.normal(size=shape) * 100
        arrays[f"a{n}"] = (raw > 0) if dtype == "bool" else raw.astype(dtype)
    arrays["strided"] = np.arange(40, dtype=dtype if dtype != "bool" else "int8")[::3]  # not contiguous
    stream = io.BytesIO()
    wire.write_message(stream, {"op": "act", "id": 3, "nested": {"x": [1.5, None]}}, arrays)
    wire.write_message(stream, {"op": "reset"})
    stream.seek(0)
    first, second = wire.read_message(stream), wire.read_message(stream)
    assert wire.read_message(stream) is None  # a clean end between messages
    assert first.header == {"op": "act", "id": 3, "nested": {"x": [1.5, None]}}
    assert second == wire.Message({"op": "reset"}, {})
    assert list(first.arrays) == list(arrays)
    for key, sent in arrays.items():
        got = first.arrays[key]
        assert got.shape == sent.shape and got.dtype == sent.dtype.newbyteorder("=") and got.dtype.isnative
        assert np.array_equal(got, sent) and got.flags.writeable


def test_wire_refuses_what_does_not_cross_and_broken_streams():
    with pytest.raises(wire.WireError, match="dtype object"):
        wire.encode({}, {"x": np.array([{}, 1], dtype=object)})
    with pytest.raises(wire.WireError, match="reserved"):
        wire.encode({"arrays": 1})
    with pytest.raises(wire.WireError, match="JSON"):
        wire.encode({"x": float("nan")})
    whole = b"".join(bytes(b) for b in wire.encode({"op": "act"}, {"s": np.zeros(54, np.float32)}))
    with pytest.raises(wire.WireError, match="ended inside a message"):
        wire.read_message(io.BytesIO(whole[:-1]))
    with pytest.raises(wire.WireError, match="not a message stream"):
        wire.read_message(io.BytesIO(b"\xff\xff\xff\xff{}"))
    with pytest.raises(wire.WireError, match="malformed"):
        wire.read_message(io.BytesIO(b"\x00\x00\x00\x02{}"))  # no "arrays"


# -- the folder, read in this process -----------------------------------------------------------------------


def _info(names=CANONICAL_JOINT_NAMES, action_names=None, fps=30) -> dict:
    action_names = list(names if action_names is None else action_names)
    return {"codebase_version": "v3.0", "robot_type": "rynn_m6_wuji", "fps": fps, "features": {
        "observation.images.consumer": {"dtype": "video", "shape": [H, W, 3], "names": ["height", "width", "channels"]},
        "observation.state": {"dtype": "float32", "shape": [len(names)], "names": list(names)},
        "action": {"dtype": "float32", "shape": [len(action_names)], "names": action_names}}}


def _fake_run(tmp: Path, *, info: dict | None = None, inputs: dict | None = None, action_dims: int = 54) -> Path:
    """A lerobot-train output folder as far as the main process reads it (the weights are an empty file)."""
    dataset = tmp / "dataset"
    (dataset / "meta").mkdir(parents=True)
    (dataset / "meta" / "info.json").write_text(json.dumps(info or _info()))
    folder = tmp / "run" / "checkpoints" / "000100" / "pretrained_model"
    folder.mkdir(parents=True)
    (tmp / "run" / "checkpoints" / "last").symlink_to("000100")
    inputs = inputs or {"observation.images.consumer": {"type": "VISUAL", "shape": [3, H, W]},
                        "observation.state": {"type": "STATE", "shape": [54]}}
    config = {"type": "act", "input_features": inputs, "chunk_size": 10, "n_action_steps": 10,
              "temporal_ensemble_coeff": None,
              "output_features": {"action": {"type": "ACTION", "shape": [action_dims]}}}
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"):
        (folder / name).write_text("{}")
    (folder / "train_config.json").write_text(json.dumps({"dataset": {"repo_id": "lab/x", "root": str(dataset)}}))
    return tmp / "run"


def test_every_layout_of_a_training_run_names_its_pretrained_model_folder(tmp_path):
    run = _fake_run(tmp_path)
    folder = run / "checkpoints" / "last" / "pretrained_model"
    for given in (run, run / "checkpoints", run / "checkpoints" / "000100", folder):
        assert resolve_policy_folder(given).resolve() == folder.resolve()
    got = read_policy_folder(run)
    assert got.spec.fps == 30.0 and got.spec.images == {"consumer": (H, W)}
    assert got.spec.state_names == got.spec.action_names == CANONICAL_JOINT_NAMES
    assert got.dataset_root == tmp_path / "dataset" and got.robot_type == "rynn_m6_wuji"


def test_a_missing_folder_file_or_dataset_is_named(tmp_path):
    with pytest.raises(ConfigurationError, match="policy folder '.*nowhere' does not exist"):
        read_policy_folder(tmp_path / "nowhere")
    with pytest.raises(ConfigurationError, match="not a LeRobot policy folder: no config.json"):
        read_policy_folder(tmp_path)
    run = _fake_run(tmp_path / "a")
    folder = resolve_policy_folder(run)
    (folder / "model.safetensors").unlink()
    with pytest.raises(ConfigurationError, match="lacks model.safetensors"):
        read_policy_folder(run)
    run = _fake_run(tmp_path / "b")
    shutil.rmtree(tmp_path / "b" / "dataset")
    with pytest.raises(ConfigurationError, match=r"meta/info.json' \(from train_config.json dataset.root\) does not "
                                                 r"exist: set the `dataset_root` setting"):
        read_policy_folder(run)
    assert read_policy_folder(run, dataset_root=str(tmp_path / "a" / "dataset")).spec.fps == 30
    (resolve_policy_folder(run) / "train_config.json").unlink()
    with pytest.raises(ConfigurationError, match="no train_config.json.*`dataset_root` setting"):
        read_policy_folder(run)


def test_a_policy_for_another_robot_is_refused_with_the_reason(tmp_path):
    names = list(CANONICAL_JOINT_NAMES)
    with pytest.raises(ConfigurationError, match="action has 53 dimensions, the robot has 54 joints"):
        read_policy_folder(_fake_run(tmp_path / "a", info=_info(action_names=names[:53]), action_dims=53))
    swapped = names[:10] + [names[11], names[10]] + names[12:]
    with pytest.raises(ConfigurationError, match="observation.state joint order differs .* at 2 place.*index 10: "
                                                 f"'{names[11]}' where the robot has '{names[10]}'"):
        read_policy_folder(_fake_run(tmp_path / "b", info=_info(swapped, names)))
    with pytest.raises(ConfigurationError, match=r"action has shape \[53\].*dataset names 54 action joints"):
        read_policy_folder(_fake_run(tmp_path / "c", action_dims=53))
    env = {"observation.environment_state": {"type": "ENV", "shape": [6]},
           "observation.state": {"type": "STATE", "shape": [54]}}
    with pytest.raises(ConfigurationError, match="takes 'observation.environment_state'.*does not provide"):
        read_policy_folder(_fake_run(tmp_path / "d", inputs=env))
    wrist = {"observation.images.wrist": {"type": "VISUAL", "shape": [3, H, W]},
             "observation.state": {"type": "STATE", "shape": [54]}}
    with pytest.raises(ConfigurationError, match="camera 'wrist', which is not a feed of this robot"):
        read_policy_folder(_fake_run(tmp_path / "e", inputs=wrist))


def test_a_missing_lerobot_python_names_the_script_that_makes_it(tmp_path, monkeypatch):
    run = _fake_run(tmp_path)
    with pytest.raises(ConfigurationError, match="LeRobot's Python '/no/such/python' .* does not exist: create "
                                                 "LeRobot's environment with scripts/lerobot_env.sh"):
        LeRobotPolicy(run, python="/no/such/python")
    monkeypatch.delenv("RYNN_LEROBOT_PYTHON", raising=False)
    monkeypatch.setenv("RYNN_LEROBOT_VENV", str(tmp_path / "venv"))
    with pytest.raises(ConfigurationError, match=r"venv/bin/python' \(\$RYNN_LEROBOT_VENV\) does not exist"):
        LeRobotPolicy(run)


def test_inference_settings_the_policy_cannot_take_are_refused(tmp_path):
    run = _fake_run(tmp_path)
    with pytest.raises(ParameterError, match="n_action_steps = 11 is more than the policy's chunk_size 10"):
        LeRobotPolicy(run, n_action_steps=11)
    with pytest.raises(ParameterError, match="temporal ensembling runs the model every step"):
        LeRobotPolicy(run, n_action_steps=4, temporal_ensemble_coeff=0.01)
    with pytest.raises(ParameterError, match="device = 'gpu'"):
        LeRobotPolicy(run, device="gpu")
    with pytest.raises(ParameterError, match="lerobot.path"):
        POLICY_BACKENDS.create("lerobot", {f"lerobot.{p.name}": p.default for p in LeRobotPolicy.SETTINGS}, None)


def test_registering_the_backend_imports_neither_torch_nor_lerobot():
    code = ("import sys; from rynn_teleop.policies import POLICY_BACKENDS; assert 'lerobot' in POLICY_BACKENDS; "
            "print(sorted(m for m in ('torch', 'lerobot', 'rynn_policy_wire') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# -- through LeRobot ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A LeRobot dataset exported from one recorded second (30 frames, consumer camera 48 x 64)."""
    from recording_episodes import FPS, build_episode

    from rynn_teleop.recording.export import export_lerobot

    root = tmp_path_factory.mktemp("policy_dataset")
    episode = build_episode(root / "episode", digital=False, seconds=1.0, task="pick the cube")
    export_lerobot([episode], root / "ds", "test/policy", fps=FPS, images=["consumer"], workers=1)
    return root / "ds"


@pytest.fixture(scope="module")
def policies(lerobot_python, dataset, tmp_path_factory) -> dict[str, Path]:
    """lerobot-train output folders of tiny ACT policies: "good", "action53", "permuted" (written at once)."""
    root = tmp_path_factory.mktemp("policies")
    variants = {"good": [], "action53": ["--action-dims", "53"], "permuted": ["--permute-state-names"]}
    procs = {name: subprocess.Popen([lerobot_python, str(TINY), "write", str(dataset), str(root / name),
                                     "--chunk-size", str(CHUNK), *extra], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, extra in variants.items()}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"writing the {name} policy failed:\n{err[-6000:]}"
    return {name: root / name for name in variants}


@pytest.fixture(scope="module")
def runner(policies, lerobot_python):
    with LeRobotPolicy(policies["good"], python=lerobot_python, timeout_s=60) as policy:
        yield policy


def _observation(k: int) -> dict[str, np.ndarray]:
    """Observation k: a state and a frame that change with k."""
    state = (0.3 * np.sin(0.2 * k + np.arange(54) * 0.1)).astype(np.float32)
    image = np.full((H, W, 3), (20 * k) % 256, np.uint8)
    image[: H // 2, :, 1] = 255 - (15 * k) % 256
    return {"observation.state": state, "observation.images.consumer": image}


def test_the_tiny_folder_is_laid_out_as_lerobot_train_writes_it(policies, dataset):
    folder = policies["good"] / "checkpoints" / "last" / "pretrained_model"
    assert os.readlink(policies["good"] / "checkpoints" / "last") == "000001"
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["config.json", "model.safetensors", "policy_postprocessor.json",
                     "policy_postprocessor_step_0_unnormalizer_processor.safetensors", "policy_preprocessor.json",
                     "policy_preprocessor_step_3_normalizer_processor.safetensors", "train_config.json"]
    train = json.loads((folder / "train_config.json").read_text())
    assert train["dataset"]["root"] == str(dataset.resolve()) and train["policy"]["type"] == "act"


def test_the_runner_gives_the_spec_and_finite_actions_deterministic_after_reset(runner):
    assert runner.spec.fps == 30.0 and runner.spec.images == {"consumer": (H, W)}
    assert runner.spec.action_names == runner.spec.state_names == CANONICAL_JOINT_NAMES
    assert runner.worker["type"] == "act" and runner.worker["device"] == "cpu" and runner.worker["threads"] == 1
    assert runner.worker["chunk_size"] == runner.worker["n_action_steps"] == CHUNK
    assert runner.worker["versions"]["lerobot"].startswith("0.6")
    runner.reset()
    first = [runner.act(_observation(k)) for k in range(2 * CHUNK + 2)]
    for action in first:
        assert action.shape == (54,) and action.dtype == np.float64 and np.isfinite(action).all()
    assert not np.allclose(first[0], first[1])  # the chunk's steps differ
    assert not np.allclose(first[0], first[CHUNK])  # a new chunk from another observation
    runner.reset()
    again = [runner.act(_observation(k)) for k in range(2 * CHUNK + 2)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_act_runs_the_model_once_per_chunk(runner):
    runner.reset()
    before = runner.inferences
    counts = []
    for k in range(3 * CHUNK):
        runner.act(_observation(k))
        counts.append(runner.inferences - before)
    assert counts == [1 + k // CHUNK for k in range(3 * CHUNK)]


@pytest.mark.parametrize("settings, runs", [({"n_action_steps": 2}, [1, 1, 2, 2, 3, 3]),
                                            ({"temporal_ensemble_coeff": 0.01}, [1, 2, 3, 4, 5, 6])])
def test_inference_settings_reach_the_policy(policies, lerobot_python, settings, runs):
    with LeRobotPolicy(policies["good"], python=lerobot_python, timeout_s=60, **settings) as policy:
        counts = []
        for k in range(6):
            assert np.isfinite(policy.act(_observation(k))).all()
            counts.append(policy.inferences)
        assert counts == runs


def test_an_observation_builder_s_observation_is_accepted(runner):
    builder = ObservationBuilder(runner.spec)
    builder.add_joint_state(CANONICAL_JOINT_NAMES, np.linspace(-0.5, 0.5, 54), 1_000)
    builder.add_image("consumer", np.full((96, 128, 3), 90, np.uint8), 2_000)  # resized to the spec's size
    observation = builder.build()
    assert np.isfinite(runner.act(observation.values)).all()
    with pytest.raises(ValueError, match=r"observation.state has shape \(53,\)"):
        runner.act({**observation.values, "observation.state": np.zeros(53, np.float32)})
    with pytest.raises(ValueError, match="has no 'observation.images.consumer'"):
        runner.act({"observation.state": np.zeros(54, np.float32)})


def test_normalized_matches_lerobot_s_preprocessing_of_the_dataset_frame(runner, policies, dataset, lerobot_python,
                                                                          tmp_path):
    folder = policies["good"] / "checkpoints" / "last" / "pretrained_model"
    for index in (0, 17):
        dump = tmp_path / f"frame{index}.npz"
        proc = subprocess.run([lerobot_python, str(TINY), "frame", str(folder), str(dataset), str(index), str(dump)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-6000:]
        frame = np.load(dump)
        observation = {k[len("raw."):]: frame[k] for k in frame.files if k.startswith("raw.")}
        assert set(observation) == {"observation.state", "observation.images.consumer"}
        got = runner.normalized(observation)
        want = {k[len("norm."):]: frame[k] for k in frame.files if k.startswith("norm.")}
        assert set(got) == set(want) == set(observation)
        for key in want:
            assert got[key].shape == want[key].shape and got[key].dtype == np.float32
            np.testing.assert_allclose(got[key], want[key], rtol=0, atol=1e-5, err_msg=key)
        assert np.abs(got["observation.images.consumer"]).max() > 0.5  # normalised, not raw [0, 1]


def test_a_policy_for_another_robot_is_refused_before_the_worker_starts(policies, lerobot_python, dataset):
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="action has 53 dimensions, the robot has 54 joints"):
        LeRobotPolicy(policies["action53"], python=lerobot_python)
    with pytest.raises(ConfigurationError, match=r"observation.state joint order differs from the robot's at 2 "
                                                 r"place\(s\), first at index 0"):
        LeRobotPolicy(policies["permuted"], python=lerobot_python)
    with pytest.raises(ConfigurationError, match=r"action has shape \[53\].*dataset names 54 action joints"):
        LeRobotPolicy(policies["action53"], python=lerobot_python, dataset_root=str(dataset))
    assert time.monotonic() - started < 5.0  # no worker was started


def test_a_policy_type_lerobot_cannot_load_is_refused_with_lerobot_s_message(policies, lerobot_python, tmp_path):
    folder = tmp_path / "pretrained_model"
    shutil.copytree(policies["good"] / "checkpoints" / "last" / "pretrained_model", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "type": "no_such_policy"}))
    with pytest.raises(ConfigurationError, match="LeRobot cannot load the policy .*no_such_policy.*not registered"):
        LeRobotPolicy(folder, python=lerobot_python)


def test_a_killed_or_hung_worker_gives_policy_error_not_a_hang(policies, lerobot_python):
    context = PolicyContext(robot=None, rate_hz=30.0)
    settings = {p.name: p.default for p in LeRobotPolicy.SETTINGS}
    settings.update(path=str(policies["good"]), python=lerobot_python, timeout_s=2.0)
    policy = LeRobotPolicy.from_settings(settings, context)
    try:
        assert np.isfinite(policy.act(_observation(0))).all()
        with pytest.raises(PolicyError, match="no_such_request failed in the LeRobot worker: ValueError") as failed:
            policy._request("no_such_request")
        assert failed.value.alive
        policy.act(_observation(1))  # a failed request leaves the worker serving
        os.kill(policy.worker_pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(PolicyError, match=r"exited with code -9; its last log lines") as died:
            policy.act(_observation(2))
        assert time.monotonic() - started < 5.0 and not died.value.alive
        with pytest.raises(PolicyError, match="exited with code -9"):
            policy.reset()  # and stays dead
    finally:
        policy.close()
    policy.close()  # idempotent
    with pytest.raises(PolicyError, match="closed"):
        policy.act(_observation(3))

    with LeRobotPolicy(policies["good"], python=lerobot_python, timeout_s=1.0) as hung:
        os.kill(hung.worker_pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(PolicyError, match=r"gave no reply to 'act' within 1 s: killed"):
            hung.act(_observation(0))
        assert time.monotonic() - started < 4.0
