"""Distillation into the causal 4-step student (world_model.training.distill) on the tiny preset: the training
pass equals streaming through the cache, the ODE pairs, stage A learns, the student folder loads; stage B
(distribution matching) trains student and critic, resumes, and its gradient vanishes where fake equals real."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_world_model_train import make_dataset, make_release, other_base_weights

from rynn_teleop.world_model.diffusion.backend import DiffusionGenerator
from rynn_teleop.world_model.diffusion.model import untrained_model
from rynn_teleop.world_model.diffusion.presets import TINY
from rynn_teleop.world_model.diffusion.weights import FineTunedWeightsError, read_manifest
from rynn_teleop.world_model.training.config import DistillConfig, RunConfigError, TrainConfig
from rynn_teleop.world_model.training.distill import (
    distill,
    dmd_loss,
    student_blocks,
    student_frames,
    student_inputs,
    student_sigmas,
    student_velocity,
)
from rynn_teleop.world_model.training.flow import model_timesteps
from rynn_teleop.world_model.training.train import train

ROOT = Path(__file__).resolve().parents[1]
C, (LH, LW) = TINY.latent_channels, TINY.latent_grid


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict[str, Path]:
    """A tiny release, a dataset and a briefly trained full and LoRA teacher."""
    root = tmp_path_factory.mktemp("distill")
    base, prompt = make_release(root)
    data = make_dataset(root / "data", train_clips=1)
    common = {"dataset": str(data), "base_dir": str(base), "prompt_file": str(prompt), "steps": 2, "cpu": True,
              "checkpoint_every": 0, "learning_rate": 1e-3}
    train(TrainConfig.from_mapping({**common, "output": str(root / "teacher")}))
    train(TrainConfig.from_mapping({**common, "output": str(root / "lora_teacher"), "mode": "lora",
                                    "lora_rank": 4}))
    return {"root": root, "base": base, "prompt": prompt, "data": data, "teacher": root / "teacher",
            "lora_teacher": root / "lora_teacher"}


def config(setup, output: Path, **overrides) -> DistillConfig:
    values = {"dataset": str(setup["data"]), "base_dir": str(setup["base"]), "prompt_file": str(setup["prompt"]),
              "teacher": str(setup["teacher"]), "output": str(output), "steps": 3, "teacher_steps": 8,
              "learning_rate": 3e-3, "checkpoint_every": 0, "log_every": 1, "cpu": True, **overrides}
    return DistillConfig.from_mapping(values)


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- the student's pass is the engine's ------------------------------------------------------------------


@pytest.mark.parametrize("frames", [4, 6])  # 6: the window (2) evicts frames 1 and 2 before frame 5
def test_training_pass_equals_streaming_through_the_cache(frames):
    torch.set_num_threads(2)
    model = untrained_model(TINY, seed=0)
    dit = model.dit
    with torch.no_grad():
        dit.control.conv.weight.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
    clean, noisy, cond = (randn(1, C, frames, LH, LW, seed=s) for s in (1, 2, 3))
    sigma = float(student_sigmas(TINY)[1])
    last = frames - 1
    # the training input: the context clean at timestep 0 (the frontier at the last frame), the last frame noisy
    x = torch.cat([clean[:, :, :last], noisy[:, :, last:]], dim=2)
    timesteps = torch.zeros(1, frames)
    timesteps[0, last] = model_timesteps(torch.tensor(sigma))
    with torch.no_grad():
        full = student_velocity(dit, x, cond, timesteps, TINY, model.prompt_embeds)
        # the engine: commit each clean frame at timestep 0, then a read pass of the last one
        dit.set_prompt(model.prompt_embeds)
        cache = dit.new_cache(TINY.window_frames, TINY.block_frames, TINY.tokens_per_frame,
                              sink_frames=TINY.sink_frames)
        for i in range(last):
            dit.forward_block(clean[:, :, i:i + 1], cond[:, :, i:i + 1], torch.zeros(1, 1), cache, i, commit=True)
        streamed = dit.forward_block(noisy[:, :, last:], cond[:, :, last:], timesteps[:, last:], cache, last,
                                     commit=False)
    torch.testing.assert_close(full[:, :, last:], streamed, rtol=1e-5, atol=1e-5)
    if frames > 1 + TINY.sink_frames + TINY.window_frames:  # eviction happened: the mask is not plain causal
        unwindowed = dit.forward_full(x, cond, timesteps, student_blocks(frames, TINY),
                                      prompt_embeds=model.prompt_embeds)
        assert not torch.allclose(unwindowed[:, :, last:], streamed, atol=1e-4)



def assert_serves_frames(setup, weights_dir) -> None:
    """The weights folder loads into the node's backend, which returns a frame per action."""
    generator = DiffusionGenerator("tiny", setup["base"], weights_dir, setup["prompt"])
    frame = np.zeros((TINY.height, TINY.width, 3), np.uint8)
    generator.reset(frame)
    frames = []
    for _ in range(2 * TINY.frames_per_block):
        frames += generator.step(np.zeros(54), condition=frame)
    assert len(frames) == 2 * TINY.frames_per_block and all(f.shape == frame.shape for f in frames)
    generator.close()

def test_student_inputs_follow_the_context_rule():
    torch.manual_seed(0)
    frames, levels = 6, len(TINY.timesteps)
    states = torch.stack([torch.full((2, C, frames, LH, LW), float(k + 1)) for k in range(levels)], dim=1)
    clean = torch.zeros(2, C, frames, LH, LW)
    sigmas = student_sigmas(TINY)
    for context in ("frontier", "noisy"):
        for _ in range(20):
            inputs = student_inputs(states, clean, sigmas, TINY, context)
            noisy = inputs.noisy
            assert not noisy[:, 0].any()  # the anchor is clean
            if context == "noisy":
                assert noisy[:, 1:].all()
            # once noisy, every later frame is noisy (clean context only before the frontier)
            assert torch.equal(noisy.cummax(dim=1).values, noisy)
            level = inputs.latents[:, 0, :, 0, 0].long() - 1  # which state each frame was taken from
            assert torch.equal(inputs.sigma[noisy], sigmas[level[noisy]])
            assert (inputs.sigma[~noisy] == 0).all() and (inputs.latents[:, 0, :, 0, 0][~noisy] == 0).all()


def test_student_frames_are_the_anchor_plus_whole_blocks_within_a_chunk():
    assert student_frames(9, 0, TINY) == 9
    assert student_frames(161, 0, TINY) == TINY.chunk_frames
    assert student_frames(81, 17, TINY) == 17
    wide = dataclasses.replace(TINY, block_frames=2, window_frames=2, chunk_frames=81)
    assert student_frames(13, 0, wide) == 9 and student_frames(5, 0, wide) == 0
    assert student_blocks(9, wide) == [1, 2, 2, 2, 2]


# ---- runs ----------------------------------------------------------------------------------------------------


def test_stage_a_loss_goes_down_and_the_student_loads_into_the_backend(setup, tmp_path):
    out = tmp_path / "student"
    result = distill(config(setup, out, steps=40, batch_size=2, ode_pairs_per_clip=2, max_grad_norm=0.0,
                            learning_rate=1e-2, sample_every=40, anchor_black_condition=0.0))
    first, last = np.mean(result.losses[:8]), np.mean(result.losses[-8:])
    assert last < 0.8 * first, (first, last)
    assert sorted(p.name for p in (out / "ode_pairs").glob("*.safetensors")) == ["000000_000.safetensors",
                                                                                 "000000_001.safetensors"]
    manifest = read_manifest(out)
    assert (manifest.kind, manifest.training_step) == ("full", 40)
    assert result.samples and result.samples[0].stat().st_size > 0
    assert_serves_frames(setup, out)


def test_pairs_are_reused_on_resume_and_remade_when_the_teacher_run_changes(setup, tmp_path):
    out = tmp_path / "student"
    distill(config(setup, out, steps=2))
    pair = out / "ode_pairs" / "000000_000.safetensors"
    stamp = pair.stat().st_mtime_ns
    resumed = distill(config(setup, out, steps=3))
    assert (resumed.start_step, resumed.step) == (2, 3) and pair.stat().st_mtime_ns == stamp
    remade = distill(config(setup, out, steps=3, guidance_scale=1.0, resume="no"))
    assert remade.start_step == 0 and pair.stat().st_mtime_ns != stamp


def test_lora_student_continues_the_lora_teacher(setup, tmp_path):
    out = tmp_path / "lora_student"
    distill(config(setup, out, mode="lora", teacher=str(setup["lora_teacher"]), steps=2))
    assert read_manifest(out).kind == "lora"
    DiffusionGenerator("tiny", setup["base"], out, setup["prompt"]).close()
    full = tmp_path / "full_from_lora"
    distill(config(setup, full, teacher=str(setup["lora_teacher"]), steps=1))
    assert read_manifest(full).kind == "full"
    with pytest.raises(RunConfigError, match="mode full"):
        distill(config(setup, tmp_path / "x", mode="lora", steps=1))


def test_teacher_of_another_base_is_refused(setup, tmp_path):
    other_base_weights(tmp_path / "other_teacher")
    with pytest.raises(FineTunedWeightsError, match="another base model"):
        distill(config(setup, tmp_path / "student", teacher=str(tmp_path / "other_teacher")))


def test_config_checks_the_teacher_grid_and_the_example_file(tmp_path):
    with pytest.raises(RunConfigError, match="teacher_steps.*miss some of the student's timesteps"):
        DistillConfig(dataset="d", base_dir="b", prompt_file="p", output="o", teacher="t", teacher_steps=6)
    with pytest.raises(RunConfigError, match="parameter 'output'.*the teacher's folder"):
        DistillConfig(dataset="d", base_dir="b", prompt_file="p", output="t/", teacher="t")
    with pytest.raises(RunConfigError, match="parameter 'stage'.*one of \\['ode', 'dmd'\\]"):
        DistillConfig(dataset="d", base_dir="b", prompt_file="p", output="o", teacher="t", stage="dmd2")
    path = ROOT / "config" / "world_model_distill.yaml"
    DistillConfig.from_file(path)
    assert set(yaml.safe_load(path.read_text())) == set(DistillConfig.schema().params)


class TrueVelocity:
    """A stand-in DiT whose velocity is the exact one of a known clean latent (the flow's straight path)."""

    def __init__(self, clean: torch.Tensor) -> None:
        self.clean = clean

    def forward_full(self, x, condition, timesteps, block_frames):
        sigma = (timesteps / 1000.0)[:, None, :, None, None].clamp(min=1e-6)
        clean = self.clean.expand(x.shape[0], -1, -1, -1, -1)
        return (x - clean) / sigma  # = noise - clean for x on the path


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_the_teacher_ode_records_the_states_the_sampler_visits(guidance):
    from rynn_teleop.world_model.training.flow import euler_grid, grid_indices, noised, teacher_ode

    clean, noise = randn(1, C, 3, LH, LW, seed=1), randn(1, C, 3, LH, LW, seed=2)
    noise[:, :, 0] = clean[:, :, 0]  # the anchor is clean
    grid = euler_grid(8, TINY.shift)
    solution = teacher_ode(TrueVelocity(clean), clean[:, :, :1], clean, noise, grid, guidance,
                           grid_indices(TINY.timesteps, 8))
    torch.testing.assert_close(solution.clean, clean, rtol=1e-4, atol=1e-4)
    for k, sigma in enumerate(student_sigmas(TINY)):
        expected = noised(clean, noise, torch.full((1, 3), float(sigma)).index_fill(1, torch.tensor([0]), 0.0))
        torch.testing.assert_close(solution.states[:, k], expected, rtol=1e-4, atol=1e-4)


# ---- stage B: distribution matching ----------------------------------------------------------------------


def test_dmd_keys_are_checked():
    required = {"dataset": "d", "base_dir": "b", "prompt_file": "p", "output": "o", "teacher": "t"}
    dmd = DistillConfig(**required, stage="dmd", init="a", guidance_scale=2.5)
    assert (dmd.critic_steps_per_step, dmd.real_guidance) == (5, 2.5)  # dmd_guidance_scale 0: guidance_scale
    assert DistillConfig(**required, stage="dmd", dmd_guidance_scale=1.0).real_guidance == 1.0
    for values, match in (({"dmd_timestep_min": 0.5, "dmd_timestep_max": 0.5}, "dmd_timestep_min.*not below"),
                          ({"dmd_timestep_max": 1.5}, "dmd_timestep_max.*out of range"),
                          ({"critic_steps_per_step": 0}, "critic_steps_per_step.*out of range"),
                          ({"critic_learning_rate": -1e-4}, "critic_learning_rate.*out of range"),
                          ({"init": "o/"}, "parameter 'output'.*the init folder")):
        with pytest.raises(RunConfigError, match=match):
            DistillConfig(**required, stage="dmd", **values)
    with pytest.raises(RunConfigError, match="parameter 'init'.*only stage dmd"):
        DistillConfig(**required, init="a")


def test_dmd_loss_gradient_is_the_normalised_score_difference():
    x0 = randn(2, C, 3, LH, LW, seed=1).requires_grad_(True)
    real, fake = randn(2, C, 3, LH, LW, seed=2), randn(2, C, 3, LH, LW, seed=3)
    noisy = torch.tensor([[False, True, True], [False, False, True]])
    dmd_loss(x0, noisy, real, fake).backward()
    weight = noisy[:, None, :, None, None].float().expand_as(x0)
    scale = ((x0.detach() - real).abs() * weight).sum(dim=(1, 2, 3, 4)) / weight.sum(dim=(1, 2, 3, 4))
    expected = (fake - real) / scale.view(-1, 1, 1, 1, 1) * weight / weight.sum()
    torch.testing.assert_close(x0.grad, expected)
    assert torch.count_nonzero(x0.grad[~noisy[:, None, :, None, None].expand_as(x0)]) == 0


@pytest.fixture(scope="module")
def stage_a(setup) -> Path:
    """A briefly trained stage-A student (the usual start of stage B)."""
    out = setup["root"] / "stage_a"
    distill(config(setup, out, steps=2))
    return out


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return {**load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors")),
            **{f"control.{k}": v for k, v in load_file(str(folder / "control.safetensors")).items()}}


def dmd_config(setup, output: Path, start: Path, **overrides) -> DistillConfig:
    return config(setup, output, **{"stage": "dmd", "init": str(start), "critic_steps_per_step": 1, **overrides})


def test_dmd_trains_student_and_critic_resumes_and_loads_into_the_backend(setup, stage_a, tmp_path):
    out = tmp_path / "dmd"
    first = distill(dmd_config(setup, out, stage_a, steps=4, critic_steps_per_step=2, learning_rate=1e-3,
                               critic_learning_rate=1e-3))
    assert first.step == 4 and all(np.isfinite(first.losses)) and max(first.losses) > 0
    resumed = distill(dmd_config(setup, out, stage_a, steps=6, critic_steps_per_step=2, learning_rate=1e-3,
                                 critic_learning_rate=1e-3))
    assert (resumed.start_step, resumed.step, len(resumed.losses)) == (4, 6, 2)
    assert read_manifest(out).training_step == 6
    start, student = weights(stage_a), weights(out)
    assert start.keys() == student.keys() and any(not torch.equal(start[k], student[k]) for k in start)
    # the checkpoint holds the critic (prepared first) and the student
    checkpoint = out / "checkpoints" / "step_6"
    critic, saved_student = load_file(str(checkpoint / "model.safetensors")), load_file(
        str(checkpoint / "model_1.safetensors"))
    teacher = weights(setup["teacher"])
    assert any(not torch.equal(critic["transformer." + k], v) for k, v in teacher.items()
               if not k.startswith("control."))
    torch.testing.assert_close(saved_student["transformer.proj_out.weight"], student["proj_out.weight"])
    assert_serves_frames(setup, out)
    with pytest.raises(RunConfigError, match="written with command 'distill-dmd'"):  # stage A does not resume it
        distill(config(setup, out, steps=8))


def test_dmd_gradient_vanishes_where_the_critic_is_the_teacher(setup, stage_a, tmp_path):
    # critic == teacher and never updated, real score without guidance: fake == real, the student stays put
    same = tmp_path / "same"
    result = distill(dmd_config(setup, same, stage_a, steps=1, critic_learning_rate=0.0, dmd_guidance_scale=1.0,
                                learning_rate=1e-2))
    assert result.losses == [0.0]
    start, student = weights(stage_a), weights(same)
    assert all(torch.equal(start[k], student[k]) for k in start)
    # the same step with a guided real score moves it
    guided = tmp_path / "guided"
    result = distill(dmd_config(setup, guided, stage_a, steps=1, critic_learning_rate=0.0, dmd_guidance_scale=3.0,
                                learning_rate=1e-2))
    assert result.losses[0] > 0
    student = weights(guided)
    assert any(not torch.equal(start[k], student[k]) for k in start)
