"""Stage 2: the causal 4-step student the node runs, distilled from the stage-1 teacher.

``rynn-teleop world-model distill CONFIG.yaml [--set key=value ...]`` (or ``accelerate launch -m
rynn_teleop.world_model.training.distill CONFIG.yaml``); the keys are :class:`~.config.DistillConfig`'s.

Recipe: CausVid (Yin et al. 2025, "From Slow Bidirectional to Fast Autoregressive Video Diffusion Models"),
stage A, the ODE-pair initialisation of the causal student:

1. Pairs (once, before training; stored in ``output/ode_pairs``): for each training clip and noise draw the
   teacher solves its flow ODE from pure noise over the whole clip (:func:`~.flow.teacher_ode`:
   ``teacher_steps`` Euler steps, bidirectional attention, the anchor clean, classifier-free guidance
   ``guidance_scale`` on the condition with zero condition latents as the unconditional model). The states at
   the student's noise levels (the preset's timesteps 1000/750/500/250 on the shifted schedule, exactly the
   engine's sampler) and the final clean latent are recorded.
2. Regression: the student is the same :class:`~rynn_teleop.world_model.diffusion.dit.StreamingWanDiT`,
   initialised from the teacher, run with ``forward_full(..., block_frames=[1, k, k, ...],
   window_frames=W, sink_frames=S)`` with the preset's block k, window W and sink S: the block-causal mask
   of :func:`~rynn_teleop.world_model.diffusion.dit.block_causal_mask` equals what the
   :class:`~rynn_teleop.world_model.diffusion.cache.KVCache` holds when the engine streams, through the same
   attention processors. Each block gets one of the recorded noise levels at random (per block, as CausVid);
   the student's clean estimate ``x - sigma * v`` is regressed onto the teacher's clean latent (mean squared
   error over the noisy blocks; with ``change_loss_weight`` weighted as the teacher's loss by where the true clip
   differs from its anchor, the change map stored with the pairs). The anchor is clean at timestep 0.

Context during training versus serving: when serving, a block attends to the keys/values its predecessors
wrote in the commit pass, i.e. clean generated latents at timestep 0. With ``context: frontier`` (the
default) each clip picks a frontier block uniformly; the blocks before it are given clean (the teacher's
clean latents at timestep 0, which is what the commit pass writes) and carry no loss, the frontier block and
the later ones are noisy at their own levels. The frontier block thus trains in exactly the serving
situation, and the later ones with partly noisy context (CausVid's diffusion forcing), so every clip still
supervises several blocks. ``context: noisy`` is pure diffusion forcing (every block noisy), CausVid's
original ODE initialisation. The student's first-step input is pure noise as in the sampler; its later-step
inputs are the teacher's ODE states, whereas the sampler re-noises its own clean estimate with fresh noise
(the mismatch CausVid leaves to its stage B).

Stage B (``stage: dmd``): distribution matching distillation as in CausVid's second stage and DMD2 (Yin et al.
2024, "Improved Distribution Matching Distillation for Fast Image Synthesis"), without backward simulation
(:class:`DmdTask`). The student starts from ``init`` (normally the stage-A output; empty: the teacher).
Per step and clip:

1. The student's input is assembled exactly as in stage A (:func:`student_inputs`: per-block levels among
   the engine's 4, the anchor clean, the ``context`` rule), but from the clip's real clean latents noised with
   fresh noise (no teacher ODE); the student predicts ``x0_hat`` (block-causal, :func:`student_velocity`).
2. Generator loss: ``x0_hat`` (its frames before the first noisy block are the clean input itself) is noised
   again to one level sigma' per clip (u uniform in [``dmd_timestep_min``, ``dmd_timestep_max``], shifted like
   the teacher's training levels; the anchor clean). The frozen teacher gives the real clean estimate (one
   bidirectional block as it was trained, classifier-free guidance ``dmd_guidance_scale`` with zero
   condition latents as the unconditional model), the critic (a trainable copy of the teacher, the fake
   score, conditional only) the fake one. ``grad = (fake - real) / mean|x0_hat - real|`` (DMD's per-clip
   normaliser over the noisy frames) and the loss is ``0.5 * mse(x0_hat, (x0_hat - grad).detach())`` over
   the noisy frames: its gradient on ``x0_hat`` is the normalised score difference.
3. Critic: ``critic_steps_per_step`` AdamW updates (``critic_learning_rate``) with ``train``'s rectified-flow
   loss (:func:`~.train.teacher_loss`, no condition dropout) on the student's detached samples: the first
   update on the ``x0_hat`` of item 1, each further one on a fresh no-grad sample of the same clip (new noise,
   levels and frontier), at a constant learning rate (no warm-up or schedule). The generator loss uses the
   critic from before these updates. With the critic equal to the teacher and no guidance the gradient is
   exactly zero.

The critic and its optimiser are prepared with accelerate before the student, so the resumable checkpoints
(``save_state``) hold both (the critic as the first model and optimiser); the critic is not part of the served
weights folder. The run's command is ``distill-dmd`` (TensorBoard under ``logs/distill-dmd``, also the critic's
loss): a checkpoint of stage ``ode`` is not resumed by stage ``dmd`` (and the other way round).

Also as in ``train``: with probability ``anchor_black_condition`` the anchor's condition is that of a black
image (the node's first reset), the weights folder (``output``, kind ``full``, or ``lora`` continuing a LoRA
teacher's adapter) is written every ``checkpoint_every`` steps with resumable checkpoints, and sample videos
show the student streaming through :class:`~rynn_teleop.world_model.diffusion.engine.StreamEngine` (ground
truth | generated).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset, Subset

from rynn_teleop.world_model.diffusion.dit import StreamingWanDiT
from rynn_teleop.world_model.diffusion.engine import StreamEngine
from rynn_teleop.world_model.diffusion.model import WanWorldModel
from rynn_teleop.world_model.diffusion.presets import WanPreset, get_preset, latent_frames
from rynn_teleop.world_model.diffusion.sampler import FlowSampler
from rynn_teleop.world_model.diffusion.weights import LORA_ADAPTER_NAME, load_weights, save_weights

from .common import (
    ClipBatch,
    ClipItem,
    IndexedClips,
    LatentEncoder,
    collate_clips,
    cut_frames,
    load_parts,
    replace_anchor_condition,
    sample_clip,
    write_side_by_side,
)
from .config import DistillConfig, RunConfigError
from .flow import (
    anchored_sigmas,
    clean_from_velocity,
    euler_grid,
    grid_indices,
    model_timesteps,
    noised,
    shifted,
    teacher_ode,
)
from .loop import (
    ADAM_BETAS,
    RunResult,
    Task,
    add_run_arguments,
    find_resume,
    fit,
    module_main,
    read_state,
    run_from_cli,
)
from .train import teacher_loss, weighted_mse

_LOG = logging.getLogger(__name__)
PAIRS = "ode_pairs"  # folder of the teacher's ODE pairs in the output folder
PAIRS_INFO = "info.json"


# ---- the student's forward pass and loss ---------------------------------------------------------


def student_blocks(frames: int, preset: WanPreset) -> list[int]:
    """The blocks the engine generates a clip of ``frames`` latent frames in: the anchor, then blocks of
    ``preset.block_frames``.

    Raises:
        ValueError: ``frames - 1`` is not a whole number of blocks.
    """
    block = preset.block_frames
    if frames < 2 or (frames - 1) % block:
        raise ValueError(f"{frames} latent frames are not the anchor plus whole blocks of {block}")
    return [1] + [block] * ((frames - 1) // block)


def student_velocity(model: torch.nn.Module, latents: torch.Tensor, condition: torch.Tensor,
                     timesteps: torch.Tensor, preset: WanPreset, prompt: torch.Tensor) -> torch.Tensor:
    """The student's velocity of a whole clip in one pass, under the mask the engine's cache realises.

    ``forward_full`` with the preset's blocks, window and sink (the preset's
    :class:`~rynn_teleop.world_model.diffusion.cache.KVCache` shape): where the frames before a block are given
    clean at timestep 0, that block's output equals the engine's read pass of it after committing those frames.

    Args:
        model: :class:`StreamingWanDiT` (or its DDP wrapper).
        latents, condition: (B, C, F, h, w); timesteps: (B, F) in [0, 1000].
        prompt: (1, L, text_dim).
    """
    b, _, f = latents.shape[:3]
    return model(latents, condition, timesteps, student_blocks(f, preset), window_frames=preset.window_frames,
                 sink_frames=preset.sink_frames, prompt_embeds=prompt.expand(b, -1, -1))


class StudentInputs(NamedTuple):
    """One training input of the student: ``latents`` (B, C, F, h, w), per-frame noise levels ``sigma``
    (B, F) (0 on clean frames) and ``noisy`` (B, F) the frames that carry the loss."""

    latents: torch.Tensor
    sigma: torch.Tensor
    noisy: torch.Tensor


def student_inputs(states: torch.Tensor, clean: torch.Tensor, sigmas: torch.Tensor, preset: WanPreset,
                   context: str) -> StudentInputs:
    """Draw each block's noise level (and with ``context`` "frontier" the first noisy block) from the global
    RNG and assemble the input (see the module docstring).

    Args:
        states: (B, S, C, F, h, w) the teacher's states at the S student noise levels ``sigmas`` (S,).
        clean: (B, C, F, h, w) the teacher's clean latents.
    """
    b, s, c, f, h, w = states.shape
    blocks = student_blocks(f, preset)
    count = len(blocks)
    block_of = torch.repeat_interleave(torch.arange(count), torch.tensor(blocks))  # (F,)
    level = torch.randint(0, s, (b, count))
    if context == "frontier":
        frontier = torch.randint(1, count, (b, 1))
    elif context == "noisy":
        frontier = torch.ones(b, 1, dtype=torch.long)
    else:
        raise ValueError(f"context must be 'frontier' or 'noisy'; got {context!r}")
    noisy_block = torch.arange(count)[None, :] >= frontier  # the anchor (block 0) is never noisy
    device = clean.device
    noisy = noisy_block[:, block_of].to(device)  # (B, F)
    level = level[:, block_of].to(device)
    sigma = torch.where(noisy, sigmas.to(device)[level], torch.zeros((), device=device))
    index = level.view(b, 1, 1, f, 1, 1).expand(b, 1, c, f, h, w)
    picked = states.gather(1, index).squeeze(1)
    latents = torch.where(noisy.view(b, 1, f, 1, 1), picked, clean)
    return StudentInputs(latents, sigma, noisy)


def student_loss(model: torch.nn.Module, states: torch.Tensor, clean: torch.Tensor, condition: torch.Tensor,
                 prompt: torch.Tensor, preset: WanPreset, sigmas: torch.Tensor, context: str,
                 change: torch.Tensor | None = None, change_loss_weight: float = 0.0) -> torch.Tensor:
    """Mean squared error of the student's clean estimate over the noisy frames (CausVid stage A).

    Args:
        states: (B, S, C, F, h, w) teacher states at ``sigmas`` (S,); clean, condition: (B, C, F, h, w).
        prompt: (1, L, text_dim).
        context: "frontier" or "noisy" (see the module docstring).
        change, change_loss_weight: (B, 1, F, h, w) change map in [0, 1]; each cell's error counts
            ``1 + change_loss_weight * change`` (weights normalised to mean 1 over the noisy frames). None or 0:
            every cell of a noisy frame counts alike.
    """
    inputs = student_inputs(states, clean, sigmas, preset, context)
    velocity = student_velocity(model, inputs.latents, condition, model_timesteps(inputs.sigma), preset, prompt)
    estimate = clean_from_velocity(inputs.latents, velocity.float(), inputs.sigma)
    return weighted_mse((estimate - clean).square(), change, change_loss_weight,
                        mask=inputs.noisy[:, None, :, None, None])


def student_sigmas(preset: WanPreset) -> torch.Tensor:
    """(S,) the noise levels of the engine's sampler steps (the preset's timesteps on its shifted schedule)."""
    return torch.tensor(FlowSampler(preset.timesteps, preset.shift).sigmas, dtype=torch.float32)


# ---- the teacher's ODE pairs ---------------------------------------------------------------------


class PairBatch(NamedTuple):
    """ODE pairs of one batch, cut to the shortest: ``states`` (B, S, C, F, h, w), ``clean`` and ``condition``
    (B, C, F, h, w), float32; ``change`` (B, 1, F, h, w) when the pairs were stored with change maps."""

    states: torch.Tensor
    clean: torch.Tensor
    condition: torch.Tensor
    change: torch.Tensor | None = None


class OdePairs(Dataset):
    """The pair files (safetensors: ``states``, ``clean``, ``condition`` and, with a change-weighted loss,
    ``change`` of one clip and noise draw)."""

    def __init__(self, files: list[Path]) -> None:
        if not files:
            raise RunConfigError("dataset", "no training clip is long enough for one block after the anchor")
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return load_file(str(self.files[index]))


def collate_pairs(items: list[dict[str, torch.Tensor]], block_frames: int) -> PairBatch:
    """Stack pairs, each cut to the shortest (the anchor plus whole blocks of ``block_frames``)."""
    frames = min(item["clean"].shape[1] for item in items)
    frames = 1 + (frames - 1) // block_frames * block_frames
    change = (torch.stack([i["change"][:, :frames] for i in items])
              if all("change" in i for i in items) else None)
    return PairBatch(torch.stack([i["states"][:, :, :frames] for i in items]),
                     torch.stack([i["clean"][:, :frames] for i in items]),
                     torch.stack([i["condition"][:, :frames] for i in items]), change)


class PairCollator:
    """A picklable ``collate_fn``: :func:`collate_pairs` with ``block_frames``."""

    def __init__(self, block_frames: int) -> None:
        self.block_frames = block_frames

    def __call__(self, items: list[dict[str, torch.Tensor]]) -> PairBatch:
        return collate_pairs(items, self.block_frames)


def student_frames(length: int, clip_frames: int, preset: WanPreset) -> int:
    """Video frames of a clip of ``length`` frames the student trains on: at most ``clip_frames`` (0: all) and
    one chunk, the anchor plus whole blocks; 0 if not even one block fits."""
    count = min(latent_frames(cut_frames(length, clip_frames)), preset.chunk_latent_frames)
    count = 1 + (count - 1) // preset.block_frames * preset.block_frames
    return 0 if count < 2 else 1 + preset.temporal_compression * (count - 1)


def pair_seed(seed: int, clip: int, draw: int) -> int:
    """The noise seed of one pair: fixed by the run's seed, the clip and the draw (not by the process)."""
    return (seed * 1_000_003 + clip * 10_007 + draw) % (2**63)


# ---- the run ---------------------------------------------------------------------------------------


def _load_student(task: Task, source: str, parts, preset: WanPreset):
    """Load the student's starting weights ``source`` into the base ``parts`` and set the task's ``dit``,
    ``vae``, ``prompt``, ``latents`` and ``sigmas``; returns the weights' manifest.

    Raises:
        RunConfigError: a LoRA student (``mode: lora``) from weights that are not a LoRA adapter.
        FineTunedWeightsError: weights of another base model or preset.
    """
    cfg = task.config
    manifest = load_weights(source, parts.transformer, parts.control, preset)
    if cfg.mode == "lora" and manifest.kind != "lora":
        raise RunConfigError("mode", f"a LoRA student keeps training the adapter of its starting weights, but "
                             f"{source} is of kind {manifest.kind!r}: use mode full")
    task.dit = StreamingWanDiT(parts.transformer, parts.control)
    task.vae, task.prompt = parts.vae, parts.prompt
    task.latents = LatentEncoder(parts.vae, preset, cfg.cache_latents, cfg.dataset, cfg.change_settings)
    task.sigmas = student_sigmas(preset)
    return manifest


def _make_trainable(dit: StreamingWanDiT, start_kind: str, mode: str) -> None:
    """Set what the student trains: mode "full" (a LoRA start folded into the weights first) trains every
    transformer weight, mode "lora" only the adapter; the control branch always."""
    if start_kind == "lora" and mode == "full":
        dit.transformer.fuse_lora(adapter_names=[LORA_ADAPTER_NAME])
        dit.transformer.unload_lora()
    if mode == "lora":
        for name, parameter in dit.transformer.named_parameters():
            parameter.requires_grad_(".lora_" in name)
    else:
        dit.transformer.requires_grad_(True)
    dit.control.requires_grad_(True)


class StudentTask(Task):
    """The stage-2 run (see the module docstring)."""

    command = "distill"

    def __init__(self, config: DistillConfig) -> None:
        super().__init__(config)

    def load(self, accelerator) -> None:
        cfg = self.config
        self.preset = preset = get_preset(cfg.preset)
        # a bad dataset fails first; the change map needs the frames
        self.clips = IndexedClips(cfg.dataset, "train", preset, pixels=False,
                                  frames=cfg.change_loss_weight > 0)
        parts = load_parts(preset, cfg.base_dir, cfg.prompt_file, accelerator.device)
        self.teacher = _load_student(self, cfg.teacher, parts, preset)

    def prepare(self, accelerator) -> None:
        cfg, dit, teacher = self.config, self.dit, self.teacher
        self.fps = self.clips.clips.info.fps
        files = self._pairs(accelerator, self.clips, teacher.to_json())
        # the student starts as the teacher
        _make_trainable(dit, teacher.kind, cfg.mode)
        self.dataset = OdePairs(files)
        self.collate = PairCollator(self.preset.block_frames)

    @torch.no_grad()
    def _pairs(self, accelerator, clips: IndexedClips, teacher: dict) -> list[Path]:
        """The ODE pair files of every training clip, computed where missing (each process its share)."""
        from tqdm.auto import tqdm

        cfg, preset, dit = self.config, self.preset, self.dit
        folder = Path(cfg.output) / PAIRS
        info = {"teacher": teacher, "teacher_steps": cfg.teacher_steps, "guidance_scale": cfg.guidance_scale,
                "seed": cfg.seed, "pairs_per_clip": cfg.ode_pairs_per_clip, "clip_frames": cfg.clip_frames,
                "preset": preset.name, "timesteps": list(preset.timesteps), "shift": preset.shift,
                "block_frames": preset.block_frames, "clips": [clips.name(i) for i in range(len(clips))]}
        if cfg.change_settings is not None:  # pairs made without change maps keep their info (and are reused)
            info["change"] = dataclasses.asdict(cfg.change_settings)
        if accelerator.is_main_process:
            stored = folder / PAIRS_INFO
            if stored.is_file() and json.loads(stored.read_text()) != info:
                _LOG.info("distill: the ODE pairs in %s were made otherwise; making them again", folder)
                shutil.rmtree(folder)
            folder.mkdir(parents=True, exist_ok=True)
            stored.write_text(json.dumps(info, indent=1) + "\n")
        accelerator.wait_for_everyone()
        items, files = [], []
        for index in range(len(clips)):
            frames = student_frames(clips.length(index), cfg.clip_frames, preset)
            if not frames:
                _LOG.warning("distill: clip %s has no whole block after the anchor; skipped", clips.name(index))
                continue
            for draw in range(cfg.ode_pairs_per_clip):
                path = folder / f"{index:06d}_{draw:03d}.safetensors"
                files.append(path)
                items.append((index, draw, frames, path))
        mine = [item for item in items[accelerator.process_index::accelerator.num_processes] if not item[3].is_file()]
        if mine:
            device = accelerator.device
            grid = euler_grid(cfg.teacher_steps, preset.shift)
            record = grid_indices(preset.timesteps, cfg.teacher_steps)
            dit.eval()
            dit.set_prompt(self.prompt)
            for index, draw, frames, path in tqdm(mine, desc="distill: teacher ODE pairs", unit="pair",
                                                  disable=not accelerator.is_main_process):
                latents = self.latents(collate_clips([clips[index]], frames), device)
                generator = torch.Generator().manual_seed(pair_seed(cfg.seed, index, draw))
                noise = torch.randn(latents.video.shape, generator=generator).to(device)
                with accelerator.autocast():  # the run's mixed precision
                    solution = teacher_ode(dit, latents.video[:, :, :1], latents.condition, noise, grid,
                                           cfg.guidance_scale, record)
                partial = path.with_suffix(".partial")
                tensors = {"states": solution.states[0].float().cpu().contiguous(),
                           "clean": solution.clean[0].float().cpu().contiguous(),
                           "condition": latents.condition[0].float().cpu().contiguous()}
                if latents.change is not None:
                    tensors["change"] = latents.change[0].float().cpu().contiguous()
                save_file(tensors, str(partial))
                os.replace(partial, path)
        accelerator.wait_for_everyone()
        return files

    def loss(self, model: torch.nn.Module, batch: PairBatch, device: torch.device) -> torch.Tensor:
        cfg = self.config
        condition = replace_anchor_condition(batch.condition.to(device), self.latents.black_condition(device),
                                             cfg.anchor_black_condition)
        if cfg.change_loss_weight > 0 and batch.change is None:
            raise RunConfigError("change_loss_weight", "the ODE pairs hold no change maps (remove output/ode_pairs)")
        change = None if batch.change is None else batch.change.to(device)
        return student_loss(model, batch.states.to(device), batch.clean.to(device), condition, self.prompt,
                            self.preset, self.sigmas, cfg.context, change, cfg.change_loss_weight)

    def save_weights(self, dit: StreamingWanDiT, step: int) -> None:
        cfg = self.config
        save_weights(cfg.output, transformer=dit.transformer, control=dit.control, kind=cfg.mode,
                     preset=self.preset, base_model_id=cfg.base_model_id, training_step=step,
                     adapter_name=LORA_ADAPTER_NAME if cfg.mode == "lora" else None)

    def sample(self, dit: StreamingWanDiT, path: Path) -> Path:
        cfg = self.config
        clip, _ = sample_clip(cfg.dataset, self.preset, cfg.clip_frames)
        device = dit.control.conv.weight.device
        frames = stream_clip(WanWorldModel(self.preset, self.vae, dit, self.prompt), clip.frames[0],
                             clip.conditions[1:], device, cfg.seed)
        return write_side_by_side(path, list(clip.frames), [clip.frames[0], *frames], self.fps)


# ---- stage B: distribution matching ----------------------------------------------------------------


class StudentSample(NamedTuple):
    """The student's clean estimate ``x0`` (B, C, F, h, w) of one input (the given clean latents on the frames
    before the first noisy block) and ``noisy`` (B, F), the frames it generated."""

    x0: torch.Tensor
    noisy: torch.Tensor


def student_sample(model: torch.nn.Module, clean: torch.Tensor, condition: torch.Tensor, prompt: torch.Tensor,
                   preset: WanPreset, sigmas: torch.Tensor, context: str) -> StudentSample:
    """One clean estimate of the student from real ``clean`` latents and fresh noise (global RNG), the input
    assembled as in stage A (:func:`student_inputs`, the states being ``clean`` noised at each of ``sigmas``);
    gradients flow when enabled.

    Args:
        clean, condition: (B, C, F, h, w); prompt: (1, L, text_dim); sigmas: (S,) the engine's levels.
    """
    b, _, f = clean.shape[:3]
    noise = torch.randn_like(clean)
    states = torch.stack([noised(clean, noise, anchored_sigmas(torch.full((b,), float(s), device=clean.device), f))
                          for s in sigmas], dim=1)
    inputs = student_inputs(states, clean, sigmas, preset, context)
    velocity = student_velocity(model, inputs.latents, condition, model_timesteps(inputs.sigma), preset, prompt)
    # sigma 0 (the anchor and the context) gives back the input itself: the clean latents
    return StudentSample(clean_from_velocity(inputs.latents, velocity.float(), inputs.sigma), inputs.noisy)


def clean_estimate(dit: torch.nn.Module, x: torch.Tensor, condition: torch.Tensor, sigma: torch.Tensor,
                   prompt: torch.Tensor, guidance: float = 1.0) -> torch.Tensor:
    """A bidirectional model's clean estimate of ``x`` (B, C, F, h, w) at per-frame ``sigma`` (B, F): the whole
    clip one block (as the teacher was trained); ``guidance`` != 1 adds the unconditional pass (zero condition
    latents) and uses ``uncond + guidance * (cond - uncond)``."""
    b, _, f = x.shape[:3]
    t = model_timesteps(sigma)
    if guidance == 1.0:
        v = dit(x, condition, t, [f], prompt_embeds=prompt.expand(b, -1, -1))
    else:
        both = dit(torch.cat([x, x]), torch.cat([condition, torch.zeros_like(condition)]), torch.cat([t, t]), [f],
                   prompt_embeds=prompt.expand(2 * b, -1, -1))
        v_cond, v_uncond = both.chunk(2)
        v = v_uncond + guidance * (v_cond - v_uncond)
    return clean_from_velocity(x, v.float(), sigma)


def dmd_sigmas(batch: int, low: float, high: float, shift: float, device: torch.device | str) -> torch.Tensor:
    """(batch,) noise levels of the distribution-matching gradient: u uniform in [low, high) (global RNG),
    shifted by ``shift``."""
    u = low + (high - low) * torch.rand(batch)
    return shifted(u, shift).to(device)


def dmd_loss(x0: torch.Tensor, noisy: torch.Tensor, real: torch.Tensor, fake: torch.Tensor) -> torch.Tensor:
    """The DMD generator loss: ``0.5 * mse(x0, (x0 - grad).detach())`` over the ``noisy`` frames with
    ``grad = (fake - real) / mean|x0 - real|`` (the mean per clip over its noisy frames).

    Args:
        x0: (B, C, F, h, w) the student's estimate (with grad); noisy: (B, F) bool.
        real, fake: (B, C, F, h, w) the real and fake clean estimates of a noised copy of ``x0`` (no grad).

    Returns:
        scalar float32; exactly 0 with zero gradient where ``fake`` equals ``real``.
    """
    weight = noisy[:, None, :, None, None].to(x0.dtype).expand_as(x0)
    count = weight.sum(dim=(1, 2, 3, 4)).clamp(min=1.0)  # (B,)
    with torch.no_grad():
        scale = ((x0 - real).abs() * weight).sum(dim=(1, 2, 3, 4)) / count
        grad = (fake - real) / scale.clamp(min=1e-8).view(-1, 1, 1, 1, 1)
        grad = torch.nan_to_num(grad) * weight
        target = x0 - grad
    return 0.5 * ((x0 - target).square() * weight).sum() / count.sum()


class ClipFramesCollator:
    """A picklable ``collate_fn``: clips cut to the shortest's :func:`student_frames`."""

    def __init__(self, clip_frames: int, preset: WanPreset) -> None:
        self.clip_frames, self.preset = clip_frames, preset

    def __call__(self, items: list[ClipItem]) -> ClipBatch:
        frames = min(student_frames(item.length, self.clip_frames, self.preset) for item in items)
        return collate_clips(items, frames)


class DmdTask(StudentTask):
    """Stage B, distribution matching (see the module docstring)."""

    command = "distill-dmd"

    def load(self, accelerator) -> None:
        cfg = self.config
        self.preset = preset = get_preset(cfg.preset)
        self.clips = IndexedClips(cfg.dataset, "train", preset, pixels=False)  # a bad dataset fails first
        parts = load_parts(preset, cfg.base_dir, cfg.prompt_file, accelerator.device)
        # the real score (frozen) and the critic start as the teacher, fused; copies of the bare base first
        real_t, real_c = copy.deepcopy(parts.transformer), copy.deepcopy(parts.control)
        self.teacher = load_weights(cfg.teacher, real_t, real_c, preset)
        if self.teacher.kind == "lora":
            real_t.fuse_lora(adapter_names=[LORA_ADAPTER_NAME])
            real_t.unload_lora()
        critic_t, critic_c = copy.deepcopy(real_t), copy.deepcopy(real_c)
        self.real = StreamingWanDiT(real_t, real_c).eval().requires_grad_(False)
        self.critic = StreamingWanDiT(critic_t, critic_c)
        self.start = _load_student(self, cfg.init or cfg.teacher, parts, preset)

    def prepare(self, accelerator) -> None:
        cfg, dit = self.config, self.dit
        self.accelerator = accelerator
        self.fps = self.clips.clips.info.fps
        usable = []
        for index in range(len(self.clips)):
            if student_frames(self.clips.length(index), cfg.clip_frames, self.preset):
                usable.append(index)
            else:
                _LOG.warning("distill: clip %s has no whole block after the anchor; skipped", self.clips.name(index))
        if not usable:
            raise RunConfigError("dataset", "no training clip is long enough for one block after the anchor")
        self.dataset = Subset(self.clips, usable)
        self.collate = ClipFramesCollator(cfg.clip_frames, self.preset)
        _make_trainable(dit, self.start.kind, cfg.mode)
        # the critic: trained in full, prepared (and so checkpointed) before the student
        critic = self.critic.requires_grad_(True).train()
        if cfg.gradient_checkpointing:
            critic.transformer.enable_gradient_checkpointing()
        decayed = [*critic.transformer.parameters(), *critic.control.conv.parameters()]
        optimizer = torch.optim.AdamW([
            {"params": decayed, "weight_decay": cfg.weight_decay},
            {"params": [critic.control.scale], "weight_decay": 0.0}], lr=cfg.critic_learning_rate, betas=ADAM_BETAS)
        self.critic_model, self.critic_optimizer = accelerator.prepare(critic, optimizer)
        resume = find_resume(cfg)
        self.step = read_state(resume, self.identity()) if resume is not None else 0
        self.calls = 0
        self.critic_losses: list[float] = []

    def loss(self, model: torch.nn.Module, batch, device: torch.device) -> torch.Tensor:
        cfg, preset, accelerator = self.config, self.preset, self.accelerator
        latents = self.latents(batch, device)
        condition = replace_anchor_condition(latents.condition, self.latents.black_condition(device),
                                             cfg.anchor_black_condition)
        clean = latents.video
        # the critic's further samples first: a later student pass would drop the mask a checkpointed backward needs
        extra = []
        with torch.no_grad():
            for _ in range(cfg.critic_steps_per_step - 1):
                extra.append(student_sample(model, clean, condition, self.prompt, preset, self.sigmas, cfg.context).x0)
        sample = student_sample(model, clean, condition, self.prompt, preset, self.sigmas, cfg.context)
        x0 = sample.x0
        b, _, f = x0.shape[:3]
        sigma = anchored_sigmas(dmd_sigmas(b, cfg.dmd_timestep_min, cfg.dmd_timestep_max, preset.shift, device), f)
        x = noised(x0.detach(), torch.randn_like(x0), sigma)
        with torch.no_grad(), accelerator.autocast():
            real = clean_estimate(self.real, x, condition, sigma, self.prompt, cfg.real_guidance)
            fake = clean_estimate(accelerator.unwrap_model(self.critic_model), x, condition, sigma, self.prompt)
        loss = dmd_loss(x0, sample.noisy, real, fake)
        self._update_critic([x0.detach(), *extra], condition)
        return loss

    def _update_critic(self, samples: list[torch.Tensor], condition: torch.Tensor) -> None:
        """One critic update per sample (see the module docstring); logs the mean critic loss."""
        cfg, accelerator, critic = self.config, self.accelerator, self.critic_model
        losses = []
        for fake_clean in samples:
            loss = teacher_loss(critic, fake_clean, condition, self.prompt, self.preset.shift)
            accelerator.backward(loss)
            if cfg.max_grad_norm > 0:
                accelerator.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
            self.critic_optimizer.step()
            self.critic_optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        value = sum(losses) / len(losses)
        self.critic_losses.append(value)
        self.calls += 1
        if self.calls % cfg.gradient_accumulation == 0:
            step = self.step + self.calls // cfg.gradient_accumulation
            if step % cfg.log_every == 0 or step == cfg.steps:
                accelerator.log({"critic_loss": value}, step=step)


def stream_clip(model: WanWorldModel, reference, conditions, device: torch.device | str, seed: int) -> list:
    """Frames the streaming engine generates from ``reference`` (reset without a condition, as the node's
    first reset) and the condition images that follow it (whole blocks only), oldest first. The model's
    modules get back their training mode and ``requires_grad`` flags afterwards."""
    modules = (model.dit, model.vae.vae)
    modes = [m.training for m in modules]
    flags = [(p, p.requires_grad) for m in modules for p in m.parameters()]
    try:
        engine = StreamEngine(model, device=device, dtype=torch.float32, seed=seed)
        engine.reset(reference)
        per = engine.frames_per_block
        out = []
        for start in range(0, len(conditions) - per + 1, per):
            out += engine.generate_block(list(conditions[start: start + per]))
        return out
    finally:
        for module, mode in zip(modules, modes):
            module.train(mode)
        for parameter, flag in flags:
            parameter.requires_grad_(flag)


def distill(config: DistillConfig) -> RunResult:
    """Run stage 2 to ``config.steps`` (resuming per ``config.resume``); the weights folder is ``config.output``.

    Raises:
        ConfigurationError: a dataset, base folder, prompt file, teacher, checkpoint or output folder that
            cannot be used (``FineTunedWeightsError`` for a teacher or weights of another base model or preset).
    """
    return fit(DmdTask(config) if config.stage == "dmd" else StudentTask(config))


# ---- command line ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rynn-teleop world-model distill``."""
    add_run_arguments(parser, "config/world_model_distill.yaml", DistillConfig)


def run_cli(args: argparse.Namespace) -> int:
    """Run ``distill`` from parsed arguments; ConfigurationError propagates to the caller."""
    return run_from_cli(args, DistillConfig, distill, "student")


def main(argv: list[str] | None = None) -> int:
    """``python -m rynn_teleop.world_model.training.distill`` (the script ``accelerate launch`` runs)."""
    return module_main(argv, "distill", __doc__.split("\n\n")[0], add_arguments, run_cli)


if __name__ == "__main__":
    sys.exit(main())
