"""Stage-1 training (world_model.training.train) on the tiny preset: config, flow convention, learning,
weights folders the backend loads, resuming, LoRA, refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.backend import DiffusionGenerator
from rynn_teleop.world_model.diffusion.model import save_model, untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.diffusion.sampler import FlowSampler
from rynn_teleop.world_model.diffusion.weights import FineTunedWeightsError, read_manifest, save_weights
from rynn_teleop.world_model.training.clips import Clip, DatasetInfo, write_clip
from rynn_teleop.world_model.training.config import RunConfigError, TrainConfig, describe
from rynn_teleop.world_model.training.flow import (
    clean_from_velocity,
    euler_grid,
    grid_indices,
    model_timesteps,
    noised,
    velocity_target,
)
from rynn_teleop.world_model.training.loop import StepSampler, complete_checkpoints
from rynn_teleop.world_model.training.train import train

ROOT = Path(__file__).resolve().parents[1]
H, W = TINY.height, TINY.width
SQUARE = 16  # [px] side of the moving square


# ---- a tiny base release and a synthetic dataset (shared with test_world_model_distill.py) -------------


def square_clip(frames: int, seed: int, episode: str = "ep") -> Clip:
    """A square sliding along x: the action's first joint is its position; the condition image marks it."""
    rng = np.random.default_rng(seed)
    start, speed = rng.uniform(0, W - SQUARE), rng.uniform(-3, 3)
    xs = np.clip(start + speed * np.arange(frames), 0, W - SQUARE).astype(int)
    background = np.zeros((H, W, 3), np.uint8)
    background[..., 2] = np.linspace(40, 120, W, dtype=np.uint8)[None, :]
    video = np.repeat(background[None], frames, axis=0)
    conditions = np.zeros_like(video)
    actions = np.zeros((frames, 54), np.float32)
    for i, x in enumerate(xs):
        video[i, 24:24 + SQUARE, x:x + SQUARE] = (230, 200, 40)
        conditions[i, 28:28 + 8, x + 4:x + 12] = 255
        actions[i, 0] = x
    return Clip(video, conditions, actions, np.arange(frames, dtype=np.int64) * 100_000_000, episode, 0)


def make_dataset(root: Path, train_clips: int = 2, frames: int = 9, val_clips: int = 1) -> Path:
    episodes = []
    for offset, split, count in ((0, "train", train_clips), (1000, "val", val_clips)):
        for i in range(count):
            name = f"{split}{i}"
            rel = f"clips/{split}/{i:06d}.safetensors"
            write_clip(root / rel, square_clip(frames, seed=offset + i, episode=name))
            episodes.append({"path": name, "name": name, "split": split, "frames": frames, "clips": [rel]})
    DatasetInfo(preset="tiny", width=W, height=H, fps=10.0, clip_frames=frames,
                joint_names=[f"joint_{i}" for i in range(54)], episodes=episodes).write(root)
    return root


def make_release(root: Path) -> tuple[Path, Path]:
    """A tiny base release and prompt file (seeded random weights), as the node would load them."""
    torch.set_num_threads(2)
    base, prompt = root / "base", root / "prompt.safetensors"
    save_model(untrained_model(TINY, seed=0), base, root / "untrained_weights", prompt)
    return base, prompt


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, Path]:
    return make_release(tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("dataset"))


def config(release, dataset, output: Path, **overrides) -> TrainConfig:
    values = {"dataset": str(dataset), "base_dir": str(release[0]), "prompt_file": str(release[1]),
              "output": str(output), "preset": "tiny", "steps": 4, "learning_rate": 3e-3,
              "checkpoint_every": 0, "log_every": 1, "seed": 0, "cpu": True, **overrides}
    return TrainConfig.from_mapping(values)


# ---- the flow convention ----------------------------------------------------------------------------------


def test_one_euler_step_with_the_true_velocity_recovers_the_clean_latent():
    g = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(2, 48, 3, 4, 6, generator=g), torch.randn(2, 48, 3, 4, 6, generator=g)
    sigma = torch.tensor([0.9375, 0.3])
    x = noised(clean, noise, sigma)
    v = velocity_target(clean, noise)
    torch.testing.assert_close(clean_from_velocity(x, v, sigma), clean)
    # an Euler step in sigma (x + (s' - s) v) lands on the same straight path
    torch.testing.assert_close(x + (0.1 - sigma.view(-1, 1, 1, 1, 1)) * v, noised(clean, noise, torch.full((2,), 0.1)))


def test_the_serving_sampler_integrates_the_trained_velocity():
    clean = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(1))
    seen = []

    def true_velocity(x: torch.Tensor, timestep: float) -> torch.Tensor:
        sigma = timestep / 1000.0  # the sampler passes 1000 * sigma, as model_timesteps does
        seen.append(timestep)
        noise = (x - (1 - sigma) * clean) / sigma  # the noise this x was made from
        return velocity_target(clean, noise)

    sampler = FlowSampler(TINY.timesteps, TINY.shift)
    out = sampler.sample(true_velocity, clean.shape, torch.Generator().manual_seed(2), "cpu", torch.float32)
    torch.testing.assert_close(out, clean, rtol=1e-4, atol=1e-4)
    expected = [float(model_timesteps(torch.tensor(s))) for s in sampler.sigmas]
    assert seen == pytest.approx(expected)


def test_the_teacher_grid_holds_the_student_timesteps():
    grid = euler_grid(8, TINY.shift)
    sampler = FlowSampler(TINY.timesteps, TINY.shift)
    positions = grid_indices(TINY.timesteps, 8)
    assert [grid[i] for i in positions] == pytest.approx(list(sampler.sigmas))
    assert grid[0] == 1.0 and grid[-1] == 0.0 and grid == sorted(grid, reverse=True)
    with pytest.raises(ValueError, match="750 is not on a uniform grid of 6"):
        grid_indices(TINY.timesteps, 6)


# ---- the config ---------------------------------------------------------------------------------------------


def test_unknown_key_names_the_file_the_key_and_the_allowed_keys(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("dataset: d\nbase_dir: b\nprompt_file: p\noutput: o\nlearning_rte: 0.1\n")
    with pytest.raises(RunConfigError, match=r"run\.yaml: unknown parameter 'learning_rte' for run config 'train'; "
                       r"known: dataset, base_dir, .*; did you mean 'learning_rate'\?") as info:
        TrainConfig.from_file(path)
    assert isinstance(info.value, ConfigurationError)


@pytest.mark.parametrize("text, key, message", [
    ("steps: 0", "steps", r"parameter 'steps' = 0 is out of range \[1, 1000000000\] steps"),
    ("steps: 2.5", "steps", "'steps' = 2.5 has type float, expected int"),
    ("mode: half", "mode", r"one of \['full', 'lora'\]"),
    ("condition_dropout: 2", "condition_dropout", r"out of range \[0.0, 1.0\]"),
    ("clip_frames: 8", "clip_frames", "'clip_frames': 8 is not 0 or 1 \\+ 4k"),
    ("gradient_checkpointing: maybe", "gradient_checkpointing", "has type str, expected bool or 'auto'"),
    ("lora_targets: to_q", "lora_targets", "has type str, expected list of str"),
    ("output: ''", "output", "'output' = '' is empty"),
])
def test_bad_values_name_the_key_and_the_range(tmp_path, text, key, message):
    path = tmp_path / "run.yaml"
    path.write_text(f"dataset: d\nbase_dir: b\nprompt_file: p\noutput: o\n{text}\n")
    with pytest.raises(RunConfigError, match=message) as info:
        TrainConfig.from_file(path)
    assert info.value.key == key and str(path) in str(info.value)


def test_missing_required_key_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("dataset: d\nbase_dir: b\nprompt_file: p\n")
    with pytest.raises(RunConfigError, match="parameter 'output' is required for run config 'train'"):
        TrainConfig.from_file(path)
    cfg = TrainConfig.from_file(path, ["output=o", "steps=7", "lora_targets=[to_q, to_v]"])
    assert (cfg.output, cfg.steps, cfg.lora_targets) == ("o", 7, ("to_q", "to_v"))
    with pytest.raises(RunConfigError, match="--set: parameter 'steps'"):
        TrainConfig.from_file(path, ["output=o", "steps=-1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("dataset: [\n")
    with pytest.raises(RunConfigError, match="line 2"):
        TrainConfig.from_file(bad)


def test_auto_values_follow_the_machine():
    cfg = TrainConfig(dataset="d", base_dir="b", prompt_file="p", output="o")
    assert (cfg.resolved(cuda=True).mixed_precision, cfg.resolved(cuda=True).gradient_checkpointing) == ("bf16", True)
    assert (cfg.resolved(cuda=False).mixed_precision, cfg.resolved(cuda=False).gradient_checkpointing) == ("no", False)


def test_example_config_lists_every_key():
    path = ROOT / "config" / "world_model_train.yaml"
    cfg = TrainConfig.from_file(path)  # valid as written
    import yaml

    assert set(yaml.safe_load(path.read_text())) == set(TrainConfig.schema().params)
    assert cfg.preset == "tiny"
    assert "learning_rate" in describe(TrainConfig)


def test_step_sampler_deals_every_clip_once_per_epoch_and_resumes():
    single = StepSampler(5, seed=3)
    first = [i for _, i in zip(range(10), single)]
    assert sorted(first[:5]) == sorted(first[5:]) == list(range(5))
    resumed = StepSampler(5, seed=3, skip=4)
    assert [i for _, i in zip(range(6), resumed)] == first[4:10]
    shards = [[i for _, i in zip(range(5), StepSampler(5, seed=3, rank=r, world=2))] for r in range(2)]
    assert sorted(shards[0] + shards[1][:0]) == sorted(first[0:10:2][:5])
    assert shards[0] == first[0:10:2] and shards[1] == first[1:10:2]


# ---- training ----------------------------------------------------------------------------------------------


def test_loss_goes_down_when_overfitting_one_clip(release, tmp_path):
    data = make_dataset(tmp_path / "one", train_clips=1)
    cfg = config(release, data, tmp_path / "out", steps=60, batch_size=2, learning_rate=1e-2,
                 condition_dropout=0.0, max_grad_norm=0.0)
    result = train(cfg)
    first, last = np.mean(result.losses[:10]), np.mean(result.losses[-10:])
    assert len(result.losses) == 60
    assert last < 0.9 * first, (first, last)


def test_saved_weights_load_into_the_backend_and_generate(release, dataset, tmp_path):
    out = tmp_path / "teacher"
    result = train(config(release, dataset, out, steps=3, sample_every=3))
    manifest = read_manifest(out)
    assert (manifest.kind, manifest.training_step, manifest.preset) == ("full", 3, "tiny")
    assert result.samples == [out / "samples" / "step_3.mp4"] and result.samples[0].stat().st_size > 0
    assert list((out / "logs").rglob("events.out.tfevents.*"))
    generator = DiffusionGenerator("tiny", release[0], out, release[1])
    frame = np.zeros((H, W, 3), np.uint8)
    generator.reset(frame)
    frames = []
    for _ in range(TINY.frames_per_block):
        frames += generator.step(np.zeros(54), condition=frame)
    assert len(frames) == TINY.frames_per_block and all(f.shape == (H, W, 3) and f.dtype == np.uint8 for f in frames)
    generator.close()


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = load_file(str(folder / "control.safetensors"))
    for file in sorted(folder.rglob("*.safetensors")):
        if file.name != "control.safetensors" and "checkpoints" not in file.parts:
            tensors.update({f"{file.parent.name}/{k}": v for k, v in load_file(str(file)).items()})
    return tensors


def test_resume_continues_from_the_saved_step_as_if_uninterrupted(release, dataset, tmp_path):
    whole = train(config(release, dataset, tmp_path / "whole", steps=4))
    part = train(config(release, dataset, tmp_path / "part", steps=2, checkpoint_every=1, keep_checkpoints=1))
    assert [s for s, _ in complete_checkpoints(tmp_path / "part")] == [2]  # older ones pruned
    resumed = train(config(release, dataset, tmp_path / "part", steps=4))
    assert (part.step, resumed.start_step, resumed.step) == (2, 2, 4)
    assert read_manifest(tmp_path / "part").training_step == 4
    assert resumed.losses == pytest.approx(whole.losses[2:], rel=1e-5)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "part")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)
    again = train(config(release, dataset, tmp_path / "part", steps=4))  # nothing left to do
    assert (again.start_step, again.losses) == (4, [])


def test_lora_mode_writes_a_lora_folder_the_backend_loads(release, dataset, tmp_path):
    out = tmp_path / "lora"
    result = train(config(release, dataset, out, mode="lora", lora_rank=4, steps=3, checkpoint_every=2))
    manifest = read_manifest(out)
    assert (manifest.kind, manifest.training_step) == ("lora", 3)
    assert (out / "lora" / "pytorch_lora_weights.safetensors").is_file() and not (out / "transformer").exists()
    assert result.step == 3
    generator = DiffusionGenerator("tiny", release[0], out, release[1])
    assert generator.engine.model.dit.transformer.active_adapters() == ["world_model"]
    generator.close()
    with pytest.raises(RunConfigError, match="mode"):  # its checkpoints are of mode lora
        train(config(release, dataset, out, steps=5))


def other_base_weights(folder: Path) -> None:
    """A weights folder written for a base transformer whose config differs from the tiny release's."""
    from diffusers import WanTransformer3DModel

    from rynn_teleop.world_model.diffusion.model import control_branch

    other = WanTransformer3DModel(**{**TINY.transformer_kwargs, "ffn_dim": 64})
    save_weights(folder, transformer=other, control=control_branch(TINY), kind="full", preset=TINY,
                 base_model_id="other", training_step=10)


def test_output_folder_of_another_base_is_refused(release, dataset, tmp_path):
    out = tmp_path / "other"
    other_base_weights(out)
    with pytest.raises(FineTunedWeightsError, match="another base model"):
        train(config(release, dataset, out))
    with pytest.raises(FineTunedWeightsError, match="base_config_hash"):
        DiffusionGenerator("tiny", release[0], out, release[1])


def test_checkpoint_of_another_base_is_refused_on_resume(release, dataset, tmp_path):
    out = tmp_path / "run"
    train(config(release, dataset, out, steps=2))
    state = out / "checkpoints" / "step_2" / "trainer_state.json"
    data = json.loads(state.read_text())
    state.write_text(json.dumps({**data, "base_config_hash": "0" * 64}))
    shutil.rmtree(out / "transformer")
    (out / "manifest.json").unlink()
    with pytest.raises(FineTunedWeightsError, match="another base model or preset"):
        train(config(release, dataset, out, steps=3))


def test_dataset_of_another_preset_is_refused(release, tmp_path):
    data = make_dataset(tmp_path / "data")
    info = json.loads((data / "dataset.json").read_text())
    (data / "dataset.json").write_text(json.dumps({**info, "preset": "paper"}))
    with pytest.raises(ConfigurationError, match="built for preset 'paper'"):
        train(config(release, data, tmp_path / "out"))


def test_stored_latents_are_used_and_checked(release, tmp_path):
    data = make_dataset(tmp_path / "data", frames=5)
    info = json.loads((data / "dataset.json").read_text())
    from rynn_teleop.world_model.training.clips import read_clip

    for shape in ((48, 2, 4, 6), (48, 2, 4, 5)):
        for episode in info["episodes"]:
            for rel in episode["clips"]:
                clip = read_clip(data / rel)
                latents = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                write_clip(data / rel, Clip(clip.frames, clip.conditions, clip.actions, clip.stamps_ns,
                                            clip.episode, clip.start, latents, latents.copy()))
        (data / "dataset.json").write_text(json.dumps({**info, "has_latents": True}))
        if shape[-1] == 6:
            assert train(config(release, data, tmp_path / "ok", steps=2)).step == 2
        else:
            with pytest.raises(ConfigurationError, match=r"stored latents \(48, 2, 4, 5\), expected \(48, 2, 4, 6\)"):
                train(config(release, data, tmp_path / "bad", steps=2))


def test_a_gathered_state_dict_rebuilds_the_model(release):
    """The FSDP path of the weights writer: a full state dict into a fresh copy of the architecture."""
    from rynn_teleop.world_model.diffusion.dit import StreamingWanDiT
    from rynn_teleop.world_model.diffusion.model import control_branch
    from rynn_teleop.world_model.diffusion.weights import load_base
    from rynn_teleop.world_model.training.loop import rebuilt
    from rynn_teleop.world_model.training.train import add_lora

    transformer = load_base(release[0], TINY).transformer
    add_lora(transformer, 4, 4.0, ("to_q", "to_v"))
    dit = StreamingWanDiT(transformer, control_branch(TINY))
    with torch.no_grad():
        for p in dit.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    copy = rebuilt(dit, dit.state_dict())
    assert copy is not dit and list(copy.transformer.peft_config) == ["world_model"]
    x = torch.randn(1, 48, 2, 4, 6, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([[0.0, 500.0]])
    prompt = torch.randn(1, 3, TINY.text_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(copy(x, x, t, [2], prompt_embeds=prompt), dit(x, x, t, [2], prompt_embeds=prompt))


def test_command_line_runs_a_config_file_with_overrides(release, dataset, tmp_path, capsys):
    from rynn_teleop.world_model.training.train import main

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"dataset": str(dataset), "base_dir": str(release[0]),
                                    "prompt_file": str(release[1]), "output": str(tmp_path / "out"), "cpu": True,
                                    "steps": 5}))
    assert main([str(path), "--set", "steps=1", "--set", "sample_every=1"]) == 0
    assert read_manifest(tmp_path / "out").training_step == 1
    assert "teacher at step 1" in capsys.readouterr().out
    import av

    with av.open(str(tmp_path / "out" / "samples" / "step_1.mp4")) as video:
        frames = [f.to_ndarray(format="rgb24") for f in video.decode(video=0)]
    assert len(frames) == 9 and frames[0].shape == (H, 2 * W, 3)  # ground truth | teacher
    assert main([str(path), "--set", "steps=zero"]) == 2
    assert "--set: parameter 'steps'" in capsys.readouterr().err


def test_two_processes_of_a_torchrun_launch_train_together_on_the_cpu(release, dataset, tmp_path):
    """The distributed path: ``torchrun`` with 2 processes on one CPU (gloo on the loopback interface). Both
    ranks join one run (each saves its RNG state into the shared checkpoint) instead of training alone."""
    import os
    import socket
    import subprocess
    import sys

    base, prompt = release
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ddp"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "-m", "rynn_teleop.world_model.training.train",
           str(Path(__file__).resolve().parents[1] / "config" / "world_model_train.yaml"),
           "--set", f"dataset={dataset}", "--set", f"base_dir={base}", "--set", f"prompt_file={prompt}",
           "--set", f"output={out}", "--set", "steps=2", "--set", "batch_size=1", "--set", "sample_every=0",
           "--set", "checkpoint_every=2", "--set", "warmup_steps=0"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    step = out / "checkpoints" / "step_2"
    assert (step / "random_states_0.pkl").is_file() and (step / "random_states_1.pkl").is_file()
    assert done.stdout.count("teacher at step 2") == 1  # one line per run, not per process
