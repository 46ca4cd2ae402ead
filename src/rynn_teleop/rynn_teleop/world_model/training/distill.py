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
   error over the noisy blocks). The anchor is clean at timestep 0.

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

Stage B (DMD distribution matching with a Self-Forcing-style rollout) is not implemented: ``stage`` has the
single choice ``ode``.

Also as in ``train``: with probability ``anchor_black_condition`` the anchor's condition is that of a black
image (the node's first reset), the weights folder (``output``, kind ``full``, or ``lora`` continuing a LoRA
teacher's adapter) is written every ``checkpoint_every`` steps with resumable checkpoints, and sample videos
show the student streaming through :class:`~rynn_teleop.world_model.diffusion.engine.StreamEngine` (ground
truth | generated).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import Dataset

from rynn_teleop.world_model.diffusion.dit import StreamingWanDiT
from rynn_teleop.world_model.diffusion.engine import StreamEngine
from rynn_teleop.world_model.diffusion.model import WanWorldModel
from rynn_teleop.world_model.diffusion.presets import WanPreset, get_preset, latent_frames
from rynn_teleop.world_model.diffusion.sampler import FlowSampler
from rynn_teleop.world_model.diffusion.weights import LORA_ADAPTER_NAME, load_weights, save_weights

from .common import (
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
from .flow import clean_from_velocity, euler_grid, grid_indices, model_timesteps, teacher_ode
from .loop import RunResult, Task, add_run_arguments, fit, module_main, run_from_cli

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
                 prompt: torch.Tensor, preset: WanPreset, sigmas: torch.Tensor, context: str) -> torch.Tensor:
    """Mean squared error of the student's clean estimate over the noisy frames (CausVid stage A).

    Args:
        states: (B, S, C, F, h, w) teacher states at ``sigmas`` (S,); clean, condition: (B, C, F, h, w).
        prompt: (1, L, text_dim).
        context: "frontier" or "noisy" (see the module docstring).
    """
    inputs = student_inputs(states, clean, sigmas, preset, context)
    velocity = student_velocity(model, inputs.latents, condition, model_timesteps(inputs.sigma), preset, prompt)
    estimate = clean_from_velocity(inputs.latents, velocity.float(), inputs.sigma)
    error = (estimate - clean).square().mean(dim=(1, 3, 4))  # (B, F)
    weight = inputs.noisy.to(error.dtype)
    return (error * weight).sum() / weight.sum().clamp(min=1.0)


def student_sigmas(preset: WanPreset) -> torch.Tensor:
    """(S,) the noise levels of the engine's sampler steps (the preset's timesteps on its shifted schedule)."""
    return torch.tensor(FlowSampler(preset.timesteps, preset.shift).sigmas, dtype=torch.float32)


# ---- the teacher's ODE pairs ---------------------------------------------------------------------


class PairBatch(NamedTuple):
    """ODE pairs of one batch, cut to the shortest: ``states`` (B, S, C, F, h, w), ``clean`` and ``condition``
    (B, C, F, h, w), float32."""

    states: torch.Tensor
    clean: torch.Tensor
    condition: torch.Tensor


class OdePairs(Dataset):
    """The pair files (safetensors: ``states``, ``clean``, ``condition`` of one clip and noise draw)."""

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
    return PairBatch(torch.stack([i["states"][:, :, :frames] for i in items]),
                     torch.stack([i["clean"][:, :frames] for i in items]),
                     torch.stack([i["condition"][:, :frames] for i in items]))


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


class StudentTask(Task):
    """The stage-2 run (see the module docstring)."""

    command = "distill"

    def __init__(self, config: DistillConfig) -> None:
        super().__init__(config)

    def load(self, accelerator) -> None:
        cfg = self.config
        self.preset = preset = get_preset(cfg.preset)
        self.clips = IndexedClips(cfg.dataset, "train", preset, pixels=False)  # a bad dataset fails first
        parts = load_parts(preset, cfg.base_dir, cfg.prompt_file, accelerator.device)
        self.teacher = load_weights(cfg.teacher, parts.transformer, parts.control, preset)
        if cfg.mode == "lora" and self.teacher.kind != "lora":
            raise RunConfigError("mode", f"a LoRA student keeps training the teacher's adapter, but teacher "
                                 f"{cfg.teacher} is of kind {self.teacher.kind!r}: use mode full")
        self.dit = StreamingWanDiT(parts.transformer, parts.control)
        self.vae, self.prompt = parts.vae, parts.prompt
        self.latents = LatentEncoder(parts.vae, preset, cfg.cache_latents, cfg.dataset)
        self.sigmas = student_sigmas(preset)

    def prepare(self, accelerator) -> None:
        cfg, dit, teacher = self.config, self.dit, self.teacher
        self.fps = self.clips.clips.info.fps
        files = self._pairs(accelerator, self.clips, teacher.to_json())
        # the student starts as the teacher
        if teacher.kind == "lora" and cfg.mode == "full":
            dit.transformer.fuse_lora(adapter_names=[LORA_ADAPTER_NAME])
            dit.transformer.unload_lora()
        if cfg.mode == "lora":
            for name, parameter in dit.transformer.named_parameters():
                parameter.requires_grad_(".lora_" in name)
        else:
            dit.transformer.requires_grad_(True)
        dit.control.requires_grad_(True)
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
                save_file({"states": solution.states[0].float().cpu().contiguous(),
                           "clean": solution.clean[0].float().cpu().contiguous(),
                           "condition": latents.condition[0].float().cpu().contiguous()}, str(partial))
                os.replace(partial, path)
        accelerator.wait_for_everyone()
        return files

    def loss(self, model: torch.nn.Module, batch: PairBatch, device: torch.device) -> torch.Tensor:
        cfg = self.config
        condition = replace_anchor_condition(batch.condition.to(device), self.latents.black_condition(device),
                                             cfg.anchor_black_condition)
        return student_loss(model, batch.states.to(device), batch.clean.to(device), condition, self.prompt,
                            self.preset, self.sigmas, cfg.context)

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
    return fit(StudentTask(config))


# ---- command line ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rynn-teleop world-model distill``."""
    add_run_arguments(parser, "config/world_model_distill.yaml")


def run_cli(args: argparse.Namespace) -> int:
    """Run ``distill`` from parsed arguments; ConfigurationError propagates to the caller."""
    return run_from_cli(args, DistillConfig, distill, "student")


def main(argv: list[str] | None = None) -> int:
    """``python -m rynn_teleop.world_model.training.distill`` (the script ``accelerate launch`` runs)."""
    return module_main(argv, "distill", __doc__.split("\n\n")[0], add_arguments, run_cli)


if __name__ == "__main__":
    sys.exit(main())
