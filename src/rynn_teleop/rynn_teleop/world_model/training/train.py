"""Stage 1: the teacher, Wan2.2's transformer plus the control branch fine-tuned on the dataset's clips.

``rynn-teleop world-model train CONFIG.yaml [--set key=value ...]`` (or, on many GPUs, ``accelerate launch -m
rynn_teleop.world_model.training.train CONFIG.yaml``); the keys are :class:`~.config.TrainConfig`'s.

Objective: rectified flow in the serving sampler's convention (:mod:`.flow`). Per clip a noise level sigma is
drawn on the preset's shifted schedule; every latent frame but the first is ``(1 - sigma) * clean + sigma *
noise`` at timestep ``1000 * sigma``; the first (the anchor, TI2V's conditioning frame) stays clean at
timestep 0 and carries no loss; the loss is the mean squared error between the predicted and the true
velocity ``noise - clean`` over the other frames; with ``change_loss_weight`` w > 0 each latent cell's error
is weighted ``1 + w * change`` (where the clip differs from its anchor, :func:`~.common.latent_change` on the
compositing ramp; weights normalised to mean 1), so the model spends its capacity on what moves: the robot and
the objects it touches, the pixels compositing takes from the model. With probability ``condition_dropout`` a
clip's condition latents are zeroed (the unconditional model that classifier-free guidance subtracts), and with
probability ``anchor_black_condition`` the anchor's condition is that of a black image (what the node's first
reset gives the engine).

The teacher attends bidirectionally within a clip (``forward_full`` with one block, no mask): it is the
many-step model whose ODE the causal student (:mod:`.distill`) learns to shortcut, and bidirectional context
is what makes its samples the best targets; causality is the student's job. It runs through the same
:class:`~rynn_teleop.world_model.diffusion.dit.StreamingWanDiT` processors as serving. Inputs are the clips'
stored latents, else the frozen VAE's encoding of their frames and condition images.

``mode: full`` trains every transformer weight; ``mode: lora`` a peft LoRA adapter on the frozen base
(diffusers' ``add_adapter``); the control branch (convolution and scale) is trained in both. Sample videos
show the teacher's own sampler: the Euler ODE of :func:`~.flow.teacher_ode` over the whole clip from the
clip's first frame and conditions (the streaming engine runs the student).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.dit import StreamingWanDiT
from rynn_teleop.world_model.diffusion.presets import get_preset
from rynn_teleop.world_model.diffusion.weights import LORA_ADAPTER_NAME, save_weights

from .common import (
    ClipCollator,
    ClipItem,
    IndexedClips,
    LatentEncoder,
    collate_clips,
    load_parts,
    replace_anchor_condition,
    sample_clip,
    to_rgb,
    write_side_by_side,
)
from .config import TrainConfig
from .flow import anchored_sigmas, euler_grid, model_timesteps, noised, sample_sigmas, teacher_ode, velocity_target
from .loop import RunResult, Task, add_run_arguments, fit, module_main, run_from_cli

SAMPLE_INDEX = -1  # latent-cache key of the sample clip (training clips are 0..n-1)


def weighted_mse(error: torch.Tensor, change: torch.Tensor | None, change_loss_weight: float,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of ``error`` (B, C, F, h, w) squared errors, each cell weighted ``1 + change_loss_weight * change``.

    ``change`` (B, 1, F, h, w) in [0, 1] (:func:`~.common.latent_change`); the weights are normalised to mean 1
    over the batch, so the loss keeps its scale and only its emphasis moves to where the clip changes. With no
    ``change`` or a weight of 0 this is the plain mean. ``mask`` (broadcastable to ``error``, 0 or 1) keeps only
    the cells that carry a loss (the student's noisy frames); none kept: 0.
    """
    weight = torch.ones((), dtype=error.dtype, device=error.device)
    if change is not None and change_loss_weight > 0.0:
        weight = 1.0 + change_loss_weight * change.to(error.dtype)
    if mask is not None:
        weight = weight * mask.to(error.dtype)
    if weight.dim() == 0:
        return error.mean()
    weight = weight.expand_as(error)
    return (error * weight).sum() / weight.sum().clamp(min=1.0)


def teacher_loss(model: torch.nn.Module, clean: torch.Tensor, condition: torch.Tensor, prompt: torch.Tensor,
                 shift: float, condition_dropout: float = 0.0, change: torch.Tensor | None = None,
                 change_loss_weight: float = 0.0) -> torch.Tensor:
    """The rectified-flow loss of one batch (see the module docstring); noise from the global RNG.

    Args:
        model: a :class:`StreamingWanDiT` (or its DDP wrapper): called as ``forward_full``.
        clean, condition: (B, C, F, h, w) normalised latents, F >= 2 (frame 0 the anchor).
        prompt: (1, L, text_dim) prompt embedding (gradients reach the cross-attention).
        shift: the preset's schedule shift.
        condition_dropout: probability of zeroing a clip's condition latents.
        change, change_loss_weight: the squared errors are weighted by :func:`weighted_mse`.

    Returns:
        scalar float32 loss.
    """
    b, _, f = clean.shape[:3]
    if f < 2:
        raise ValueError(f"a clip needs the anchor and at least one more latent frame; got {f}")
    noise = torch.randn_like(clean)
    sigma = anchored_sigmas(sample_sigmas(b, shift, clean.device), f)
    x = noised(clean, noise, sigma)
    if condition_dropout > 0:
        keep = (torch.rand(b, device=clean.device) >= condition_dropout).to(condition.dtype)
        condition = condition * keep.view(-1, 1, 1, 1, 1)
    velocity = model(x, condition, model_timesteps(sigma), [f], prompt_embeds=prompt.expand(b, -1, -1))
    target = velocity_target(clean, noise)
    error = (velocity[:, :, 1:].float() - target[:, :, 1:].float()).square()
    return weighted_mse(error, None if change is None else change[:, :, 1:], change_loss_weight)


def add_lora(transformer: torch.nn.Module, rank: int, alpha: float, targets: tuple[str, ...]) -> None:
    """Add a trainable LoRA adapter (:data:`LORA_ADAPTER_NAME`, zero update at the start) to ``transformer``;
    freeze everything else of it.

    Raises:
        ConfigurationError: no module of the transformer matches ``targets``.
    """
    from peft import LoraConfig

    transformer.requires_grad_(False)
    try:
        transformer.add_adapter(LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                           init_lora_weights=True), adapter_name=LORA_ADAPTER_NAME)
    except ValueError as error:
        raise ConfigurationError(f"lora_targets {list(targets)}: {error}") from error
    for name, parameter in transformer.named_parameters():
        parameter.requires_grad_(".lora_" in name)


class TeacherTask(Task):
    """The stage-1 run (see the module docstring)."""

    command = "train"

    def __init__(self, config: TrainConfig) -> None:
        super().__init__(config)

    def load(self, accelerator) -> None:
        cfg = self.config
        self.preset = preset = get_preset(cfg.preset)
        # a bad dataset fails first; the change map needs the frames
        self.clips = IndexedClips(cfg.dataset, "train", preset, pixels=False,
                                  frames=cfg.change_loss_weight > 0)
        parts = load_parts(preset, cfg.base_dir, cfg.prompt_file, accelerator.device)
        if cfg.mode == "lora":
            add_lora(parts.transformer, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
        self.dit = StreamingWanDiT(parts.transformer, parts.control)
        self.vae, self.prompt = parts.vae, parts.prompt
        self.latents = LatentEncoder(parts.vae, preset, cfg.cache_latents, cfg.dataset, cfg.change_settings)

    def prepare(self, accelerator) -> None:
        cfg = self.config
        self.dataset, self.collate = self.clips, ClipCollator(cfg.clip_frames)
        self.fps = self.clips.clips.info.fps
        if cfg.mode == "full":
            self.dit.transformer.requires_grad_(True)  # (lora: add_lora made only the adapter trainable)
        self.dit.control.requires_grad_(True)

    def loss(self, model: torch.nn.Module, batch, device: torch.device) -> torch.Tensor:
        cfg = self.config
        latents = self.latents(batch, device)
        condition = replace_anchor_condition(latents.condition, self.latents.black_condition(device),
                                             cfg.anchor_black_condition)
        return teacher_loss(model, latents.video, condition, self.prompt, self.preset.shift, cfg.condition_dropout,
                            latents.change, cfg.change_loss_weight)

    def save_weights(self, dit: StreamingWanDiT, step: int) -> None:
        cfg = self.config
        save_weights(cfg.output, transformer=dit.transformer, control=dit.control, kind=cfg.mode,
                     preset=self.preset, base_model_id=cfg.base_model_id, training_step=step,
                     adapter_name=LORA_ADAPTER_NAME if cfg.mode == "lora" else None)

    @torch.no_grad()
    def sample(self, dit: StreamingWanDiT, path: Path) -> Path:
        cfg = self.config
        clip, _ = sample_clip(cfg.dataset, self.preset, cfg.clip_frames)
        device = dit.control.conv.weight.device
        latents = self.latents(collate_clips([ClipItem.of(clip, SAMPLE_INDEX)]), device)
        training = dit.training
        dit.eval()
        try:
            dit.set_prompt(self.prompt)
            noise = torch.randn(latents.video.shape, generator=torch.Generator().manual_seed(cfg.seed)).to(device)
            solution = teacher_ode(dit, latents.video[:, :, :1], latents.condition, noise,
                                   euler_grid(cfg.sample_steps, self.preset.shift), cfg.sample_guidance)
            video = self.vae.decode(solution.clean)
        finally:
            dit.train(training)
        return write_side_by_side(path, list(clip.frames), to_rgb(video[0]), self.fps)


def train(config: TrainConfig) -> RunResult:
    """Run stage 1 to ``config.steps`` (resuming per ``config.resume``); the weights folder is ``config.output``.

    Raises:
        ConfigurationError: a dataset, base folder, prompt file, checkpoint or output folder that cannot be
            used (``FineTunedWeightsError`` for weights of another base model or preset).
    """
    return fit(TeacherTask(config))


# ---- command line ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rynn-teleop world-model train``."""
    add_run_arguments(parser, "config/world_model_train.yaml", TrainConfig)


def run_cli(args: argparse.Namespace) -> int:
    """Run ``train`` from parsed arguments; ConfigurationError propagates to the caller."""
    return run_from_cli(args, TrainConfig, train, "teacher")


def main(argv: list[str] | None = None) -> int:
    """``python -m rynn_teleop.world_model.training.train`` (the script ``accelerate launch`` runs)."""
    return module_main(argv, "train", __doc__.split("\n\n")[0], add_arguments, run_cli)


if __name__ == "__main__":
    sys.exit(main())
