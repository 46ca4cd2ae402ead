"""What ``train`` and ``distill`` share: clips as tensors, their VAE latents, the model parts, sample videos.

Shapes: pixels (B, 3, T, H, W) in [-1, 1]; latents (B, C, F, h, w) normalised as the DiT sees them
(:class:`~rynn_teleop.world_model.diffusion.vae.StreamingVAE`), F = 1 + (T - 1) / 4 latent frames.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel
from safetensors import SafetensorError, safe_open
from torch.utils.data import Dataset

from rynn_teleop.world_model.diffusion.composite import CompositeSettings, change_weight
from rynn_teleop.world_model.diffusion.dit import ControlBranch
from rynn_teleop.world_model.diffusion.model import control_branch
from rynn_teleop.world_model.diffusion.presets import WanPreset, latent_frames
from rynn_teleop.world_model.diffusion.vae import StreamingVAE
from rynn_teleop.world_model.diffusion.weights import (
    FineTunedWeightsError,
    load_base,
    load_prompt,
    manifest_differences,
    read_manifest,
)

from .clips import Clip, ClipDataset, DatasetError, DatasetInfo

# ---- clips as tensors --------------------------------------------------------------------------


class ClipItem(NamedTuple):
    """One clip as a training item (arrays as in :class:`Clip`); ``frames`` and ``conditions`` are None when
    only the stored latents were read."""

    index: int
    length: int
    frames: np.ndarray | None
    conditions: np.ndarray | None
    latents: np.ndarray | None
    condition_latents: np.ndarray | None

    @classmethod
    def of(cls, clip: Clip, index: int) -> ClipItem:
        """The item of a whole :class:`Clip`."""
        return cls(index, clip.length, clip.frames, clip.conditions, clip.latents, clip.condition_latents)


class ClipBatch(NamedTuple):
    """Clips of one batch, cut to the same length (the shortest, or at most the configured ``clip_frames``).

    Attributes:
        index: (B,) the clips' indices (the keys of the latent cache).
        frames, conditions: (B, 3, T, H, W) float32 pixels in [-1, 1]; None when only latents were read.
        latents, condition_latents: (B, C, F, h, w) float32 stored latents; None unless every clip has them.
    """

    index: torch.Tensor
    length: int
    frames: torch.Tensor | None
    conditions: torch.Tensor | None
    latents: torch.Tensor | None
    condition_latents: torch.Tensor | None


def pixels(images: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> (3, T, H, W) float32 in [-1, 1] (``v / 127.5 - 1``, as the engine converts)."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(3, 0, 1, 2).float() / 127.5 - 1.0


class IndexedClips(Dataset):
    """A split of a dataset folder as :class:`ClipItem` s, checked against ``preset``.

    With ``pixels`` False and a dataset that stores latents, only the latents are read (the frames of a
    paper-size clip are far larger); with ``frames`` also the clip's frames (not its condition frames: what the
    change map needs).

    Raises:
        DatasetError: no dataset, an empty split, or a dataset built for another preset or frame size.
    """

    def __init__(self, root: str | os.PathLike, split: str, preset: WanPreset, pixels: bool = True,
                 frames: bool = False) -> None:
        self.clips = ClipDataset(root, split)
        check_dataset(self.clips.info, root, preset)
        self.latents_only = not pixels and self.clips.info.has_latents
        self.frames = frames

    def __len__(self) -> int:
        return len(self.clips)

    def __getitem__(self, index: int) -> ClipItem:
        if not self.latents_only:
            return ClipItem.of(self.clips[index], index)
        path = self.path(index)
        try:
            with safe_open(str(path), framework="numpy") as reader:
                length = int(reader.get_slice("frames").get_shape()[0])
                return ClipItem(index, length, reader.get_tensor("frames") if self.frames else None, None,
                                reader.get_tensor("latents"), reader.get_tensor("condition_latents"))
        except (OSError, SafetensorError) as error:
            raise DatasetError(f"{path}: not a readable clip file with latents ({error})") from error

    def path(self, index: int) -> Path:
        """The clip file of ``index``."""
        return self.clips.root / self.clips.files[index]

    def name(self, index: int) -> str:
        """The clip file of ``index``, relative to the dataset folder."""
        return self.clips.files[index]

    def length(self, index: int) -> int:
        """Frames of clip ``index`` (read from its file's header).

        Raises:
            DatasetError: the file is not a readable clip.
        """
        path = self.path(index)
        try:
            with safe_open(str(path), framework="numpy") as reader:
                return int(reader.get_slice("frames").get_shape()[0])
        except (OSError, SafetensorError) as error:
            raise DatasetError(f"{path}: not a readable clip file ({error})") from error


def check_dataset(info: DatasetInfo, root: str | os.PathLike, preset: WanPreset) -> None:
    """Refuse a dataset built for another preset or frame size.

    Raises:
        DatasetError: naming the dataset and both values.
    """
    if info.preset != preset.name or (info.width, info.height) != (preset.width, preset.height):
        raise DatasetError(f"{root}: built for preset {info.preset!r} at {info.width}x{info.height} px; this run "
                           f"trains preset {preset.name!r} at {preset.width}x{preset.height} px (rebuild the "
                           "dataset with --preset)")


def cut_frames(length: int, clip_frames: int) -> int:
    """Frames to use of a clip of ``length`` frames: all (``clip_frames`` 0) or at most ``clip_frames``."""
    return length if not clip_frames else min(length, clip_frames)


def collate_clips(items: Sequence[ClipItem], clip_frames: int = 0) -> ClipBatch:
    """Stack clips into a :class:`ClipBatch`, each cut to the shortest (and at most ``clip_frames``).

    Stored latents are used only when every clip of the batch has them (cut to the same latent frames).
    """
    frames = min(cut_frames(item.length, clip_frames) for item in items)
    count = latent_frames(frames)

    def stack(name: str, cut: int, convert) -> torch.Tensor | None:
        arrays = [getattr(item, name) for item in items]
        if any(a is None for a in arrays):
            return None
        return torch.stack([convert(a, cut) for a in arrays])

    def video(array: np.ndarray, cut: int) -> torch.Tensor:
        return pixels(array[:cut])

    def latent(array: np.ndarray, cut: int) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array[:, :cut], dtype=np.float32))

    batch = ClipBatch(torch.tensor([item.index for item in items], dtype=torch.long), frames,
                      stack("frames", frames, video), stack("conditions", frames, video),
                      stack("latents", count, latent), stack("condition_latents", count, latent))
    if batch.latents is None and batch.frames is None:
        raise DatasetError("a batch mixes clips with and without stored latents while only latents were read")
    return batch


class ClipCollator:
    """A picklable ``collate_fn`` (for DataLoader workers): :func:`collate_clips` with ``clip_frames``."""

    def __init__(self, clip_frames: int = 0) -> None:
        self.clip_frames = clip_frames

    def __call__(self, items: Sequence[ClipItem]) -> ClipBatch:
        return collate_clips(items, self.clip_frames)


# ---- latents -------------------------------------------------------------------------------------


class Latents(NamedTuple):
    """Normalised latents of clips and of their condition videos, each (B, C, F, h, w) float32; ``change``
    (B, 1, F, h, w) in [0, 1] the clips' change from their first frame on the latent grid
    (:func:`latent_change`), or None when the encoder was not asked for it."""

    video: torch.Tensor
    condition: torch.Tensor
    change: torch.Tensor | None = None


def latent_change(frames: torch.Tensor, preset: WanPreset, settings: CompositeSettings) -> torch.Tensor:
    """Where a clip differs from its first frame, on ``preset``'s latent grid: (B, 1, F, h, w) float32 in [0, 1].

    Per video frame the compositing ramp of :func:`~rynn_teleop.world_model.diffusion.composite.change_weight`
    (smoothed channel-mean change from the first frame, 0 at ``settings.low`` levels, 1 at ``settings.high``),
    then the largest value over each latent frame's video frames (the causal VAE's mapping: the first latent
    frame is the first video frame alone, so 0; then ``preset.temporal_compression`` frames each) and over each
    latent cell's pixels: a cell is as changed as its most changed pixel.

    Args:
        frames: (B, 3, T, H, W) in [-1, 1], T = 1 + k * the temporal compression, H x W the preset's size.

    Raises:
        ValueError: frames that do not map onto the preset's latent frames and grid.
    """
    batch, _, count, height, width = frames.shape
    step, (rows, cols) = preset.temporal_compression, preset.latent_grid
    if (count - 1) % step or (height, width) != (preset.height, preset.width):
        raise ValueError(f"frames {tuple(frames.shape)} do not map onto latent frames of preset {preset.name!r} "
                         f"(1 + {step}k frames of {preset.width}x{preset.height} px)")
    weight = change_weight(frames, frames[:, :, :1].expand_as(frames), settings)  # (B, 1, T, H, W)
    rest = weight[:, 0, 1:].reshape(batch, (count - 1) // step, step, height, width).amax(dim=2)
    per_frame = torch.cat([weight[:, 0, :1], rest], dim=1)  # (B, F, H, W)
    pooled = F.max_pool2d(per_frame, kernel_size=(height // rows, width // cols))
    return pooled.unsqueeze(1)


class LatentEncoder:
    """Latents of a :class:`ClipBatch`: the clips' stored latents, else the frozen VAE's encoding.

    With ``cache`` the latents a clip was encoded to are kept in host memory (keyed by its index and length),
    so each clip is encoded once per run. With ``change`` the latents carry the clips' change from their first
    frame (:func:`latent_change`), computed once per clip and length and kept alike (it is small: one value per
    latent cell); that needs the clips' frames in the batch.

    Args:
        vae: the frozen VAE (on the training device).
        preset: the latent shape is checked against it.
        source: the dataset folder (for messages).
        change: the ramp of the change map; None: no change map.
    """

    def __init__(self, vae: StreamingVAE, preset: WanPreset, cache: bool = True, source: str = "",
                 change: CompositeSettings | None = None) -> None:
        self.vae, self.preset, self.cache, self.source, self.change = vae, preset, cache, source, change
        self._memory: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._changes: dict[tuple[int, int], torch.Tensor] = {}
        self._black: torch.Tensor | None = None

    def _change(self, batch: ClipBatch, keys: list[tuple[int, int]], device: torch.device | str) -> torch.Tensor | None:
        """(B, 1, F, h, w) change maps of ``batch`` on ``device``: those not yet known computed from its frames."""
        if self.change is None:
            return None
        todo = [n for n, key in enumerate(keys) if key not in self._changes]
        if todo:
            if batch.frames is None:
                raise DatasetError(f"{self.source}: the change map needs the clips' frames; only latents were read")
            maps = latent_change(batch.frames[todo], self.preset, self.change).cpu()
            for row, n in enumerate(todo):
                self._changes[keys[n]] = maps[row].clone()
        return torch.stack([self._changes[key] for key in keys]).to(device)

    def __call__(self, batch: ClipBatch, device: torch.device | str) -> Latents:
        """(video, condition, change) latents of ``batch`` on ``device`` in float32.

        Raises:
            DatasetError: stored latents of a shape other than the preset's; a change map without frames.
        """
        keys = [(int(i), batch.length) for i in batch.index]
        change = self._change(batch, keys, device)
        if batch.latents is not None:
            video, condition = batch.latents, batch.condition_latents
            expected = (self.preset.latent_channels, latent_frames(batch.length), *self.preset.latent_grid)
            if tuple(video.shape[1:]) != expected or video.shape != condition.shape:
                raise DatasetError(f"{self.source}: stored latents {tuple(video.shape[1:])}, expected {expected} "
                                   f"for preset {self.preset.name!r} (rebuild the dataset's latents)")
            return Latents(video.to(device), condition.to(device), change)
        if not self.cache:
            return Latents(self.vae.encode(batch.frames).float().to(device),
                           self.vae.encode(batch.conditions).float().to(device), change)
        todo = [n for n, key in enumerate(keys) if key not in self._memory]
        if todo:
            video = self.vae.encode(batch.frames[todo]).float().cpu()
            condition = self.vae.encode(batch.conditions[todo]).float().cpu()
            for row, n in enumerate(todo):
                self._memory[keys[n]] = (video[row], condition[row])
        entries = [self._memory[key] for key in keys]
        return Latents(torch.stack([e[0] for e in entries]).to(device),
                       torch.stack([e[1] for e in entries]).to(device), change)

    def black_condition(self, device: torch.device | str) -> torch.Tensor:
        """(1, C, 1, h, w) latent of a black condition image: the anchor's condition when the engine is reset
        without one (as the node's first reset)."""
        if self._black is None:
            black = torch.full((1, 3, 1, self.preset.height, self.preset.width), -1.0)
            self._black = self.vae.encode(black).float().cpu()
        return self._black.to(device)


def replace_anchor_condition(condition: torch.Tensor, black: torch.Tensor, probability: float,
                             generator: torch.Generator | None = None) -> torch.Tensor:
    """``condition`` (B, C, F, h, w) whose anchor frame (frame 0) is ``black`` (1, C, 1, h, w) in each clip with
    ``probability`` (drawn from the global RNG, or ``generator``)."""
    if probability <= 0.0:
        return condition
    draw = torch.rand(condition.shape[0], generator=generator, device=generator.device if generator else "cpu")
    chosen = (draw < probability).to(condition.device).view(-1, 1, 1, 1)
    out = condition.clone()
    out[:, :, 0] = torch.where(chosen, black[:, :, 0].to(condition.dtype), condition[:, :, 0])
    return out


# ---- model parts ---------------------------------------------------------------------------------


class Parts(NamedTuple):
    """The base release's VAE (frozen, wrapped for encoding) and DiT, a zero control branch and the prompt."""

    vae: StreamingVAE
    transformer: WanTransformer3DModel
    control: ControlBranch
    prompt: torch.Tensor  # (1, prompt_len, text_dim)


def load_parts(preset: WanPreset, base_dir: str | os.PathLike, prompt_file: str | os.PathLike,
               device: torch.device | str) -> Parts:
    """The base release and the prompt in float32 on ``device`` (the DiT in eval mode, no gradients yet).

    Raises:
        BaseModelError, PromptEmbeddingError: a folder or file that does not fit ``preset``.
    """
    base = load_base(base_dir, preset, device, torch.float32)
    base.vae.requires_grad_(False)
    base.transformer.requires_grad_(False)
    control = control_branch(preset).to(device)
    prompt = load_prompt(prompt_file, preset, device, torch.float32)
    return Parts(StreamingVAE(base.vae), base.transformer, control, prompt)


def check_output_folder(folder: str | os.PathLike, transformer: WanTransformer3DModel, preset: WanPreset) -> None:
    """Refuse to write into a weights folder that holds weights of another base model or preset.

    Raises:
        FineTunedWeightsError: ``folder/manifest.json`` names another preset or base transformer config.
    """
    folder = Path(folder)
    if not (folder / "manifest.json").is_file():
        return
    differences = manifest_differences(read_manifest(folder), transformer, preset,
                                       "the folder holds weights of another base model; choose another output folder")
    if differences:
        raise FineTunedWeightsError(folder, differences)


# ---- sample videos -------------------------------------------------------------------------------


def to_rgb(video: torch.Tensor) -> list[np.ndarray]:
    """(3, T, H, W) pixels in [-1, 1] -> T RGB uint8 (H, W, 3) frames."""
    values = ((video.detach().float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return [np.ascontiguousarray(f) for f in values.permute(1, 2, 3, 0).cpu().numpy()]


def write_side_by_side(path: str | os.PathLike, left: Sequence[np.ndarray], right: Sequence[np.ndarray],
                       fps: float) -> Path:
    """Write an H.264 MP4 (PyAV) whose frame i is ``left[i] | right[i]`` (RGB uint8, same heights).

    The shorter sequence is padded with black frames; odd sizes are padded to even (yuv420p).
    """
    import av

    count = max(len(left), len(right))
    height = max(f.shape[0] for f in (*left, *right))
    width = left[0].shape[1] + right[0].shape[1]
    even_h, even_w = height + height % 2, width + width % 2
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rate = Fraction(fps).limit_denominator(1001)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = even_w, even_h, "yuv420p"
        for i in range(count):
            canvas = np.zeros((even_h, even_w, 3), np.uint8)
            x = 0
            for frames in (left, right):
                frame = frames[i] if i < len(frames) else np.zeros_like(frames[0])
                canvas[: frame.shape[0], x: x + frame.shape[1]] = frame
                x += frames[0].shape[1]
            for packet in stream.encode(av.VideoFrame.from_ndarray(canvas, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def sample_clip(root: str | os.PathLike, preset: WanPreset, clip_frames: int) -> tuple[Clip, str]:
    """The clip the sample videos show: the first held-out (``val``) clip, else the first training clip; cut
    to ``clip_frames`` and to the preset's chunk (the engine re-anchors after it). Returns it and its split."""
    for split in ("val", "train"):
        try:
            clips = ClipDataset(root, split)
        except DatasetError:
            continue
        clip = clips[0]
        frames = min(cut_frames(clip.length, clip_frames), preset.chunk_frames)
        count = latent_frames(frames)
        cut = Clip(clip.frames[:frames], clip.conditions[:frames], clip.actions[:frames], clip.stamps_ns[:frames],
                   clip.episode, clip.start,
                   None if clip.latents is None else clip.latents[:, :count],
                   None if clip.condition_latents is None else clip.condition_latents[:, :count])
        return cut, split
    raise DatasetError(f"{root}: no clips")
