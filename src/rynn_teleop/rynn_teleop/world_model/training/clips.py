"""The world-model dataset on disk: one folder of clips, shared by ``dataset`` (writes), ``train``,
``distill`` and ``eval`` (read). Torch-free.

Layout of a dataset folder::

    dataset.json                     DatasetInfo (format, preset size, fps, clip rule, split, episodes, skipped)
    clips/train/000000.safetensors   one Clip per file, numbered in episode order
    clips/val/000000.safetensors

A clip is ``T = 1 + 4k`` consecutive head-camera frames of one episode (the first is the anchor, Wan2.2's
4x temporal compression makes the rest whole latent frames), each with the 54-D action in force at the
frame's stamp (canonical joint order, :attr:`DatasetInfo.joint_names`) and the condition image drawn from
that action by the node's own conditioning code, both at the preset's size. Optional VAE latents
(normalised as the DiT sees them) let training skip the encoder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rynn_teleop.errors import ConfigurationError

DATASET_FORMAT = "rynn_teleop.world_model.dataset/1"
INFO_FILE = "dataset.json"
SPLITS = ("train", "val")


class DatasetError(ConfigurationError):
    """A dataset folder, clip file or episode that cannot be used; the message names it."""


@dataclass(frozen=True)
class Clip:
    """One training/evaluation clip (arrays are the file's; see the module docstring).

    Attributes:
        frames: (T, H, W, 3) uint8 RGB head-camera frames at the preset's size.
        conditions: (T, H, W, 3) uint8 RGB condition (skeleton) images of ``actions``.
        actions: (T, 54) float32 joint positions commanded at each frame's stamp [rad].
        stamps_ns: (T,) int64 header stamps of the frames [ns].
        episode: the episode folder's name.
        start: index of the clip's first frame among the episode's usable frames.
        latents, condition_latents: (C, 1 + (T - 1) / 4, h, w) float32 normalised VAE latents, or None.
    """

    frames: np.ndarray
    conditions: np.ndarray
    actions: np.ndarray
    stamps_ns: np.ndarray
    episode: str
    start: int
    latents: np.ndarray | None = None
    condition_latents: np.ndarray | None = None

    def __post_init__(self) -> None:
        t = len(self.frames)
        if t < 1 or (t - 1) % 4:
            raise DatasetError(f"clip of {self.episode} at frame {self.start}: {t} frames, not 1 + 4k")
        if self.frames.ndim != 4 or self.frames.shape[-1] != 3 or self.frames.dtype != np.uint8:
            raise DatasetError(f"clip of {self.episode}: frames must be (T, H, W, 3) uint8; got "
                               f"{self.frames.shape} {self.frames.dtype}")
        if self.conditions.shape != self.frames.shape or self.conditions.dtype != np.uint8:
            raise DatasetError(f"clip of {self.episode}: conditions must match frames {self.frames.shape} uint8; got "
                               f"{self.conditions.shape} {self.conditions.dtype}")
        if self.actions.shape[0] != t or self.actions.ndim != 2 or self.stamps_ns.shape != (t,):
            raise DatasetError(f"clip of {self.episode}: actions (T, n) and stamps (T,) must have T = {t}; got "
                               f"{self.actions.shape} and {self.stamps_ns.shape}")
        if (self.latents is None) != (self.condition_latents is None):
            raise DatasetError(f"clip of {self.episode}: latents and condition_latents come together")

    @property
    def length(self) -> int:
        """Frames in the clip, T."""
        return len(self.frames)


def write_clip(path: str | os.PathLike, clip: Clip) -> None:
    """Write ``clip`` as one safetensors file (arrays as tensors, episode and start in its metadata)."""
    from safetensors.numpy import save_file

    tensors = {"frames": clip.frames, "conditions": clip.conditions,
               "actions": np.ascontiguousarray(clip.actions, dtype=np.float32),
               "stamps_ns": np.ascontiguousarray(clip.stamps_ns, dtype=np.int64)}
    if clip.latents is not None:
        tensors["latents"] = np.ascontiguousarray(clip.latents, dtype=np.float32)
        tensors["condition_latents"] = np.ascontiguousarray(clip.condition_latents, dtype=np.float32)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
              metadata={"format": DATASET_FORMAT, "episode": clip.episode, "start": str(clip.start)})


def read_clip(path: str | os.PathLike) -> Clip:
    """The clip in ``path``.

    Raises:
        DatasetError: a missing file, or one that is not a clip of this format (named).
    """
    from safetensors import safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not a readable clip file ({exc})") from exc
    if meta.get("format") != DATASET_FORMAT:
        raise DatasetError(f"{path}: format {meta.get('format')!r}, expected {DATASET_FORMAT!r}")
    missing = {"frames", "conditions", "actions", "stamps_ns"} - set(arrays)
    if missing:
        raise DatasetError(f"{path}: missing {', '.join(sorted(missing))}")
    return Clip(arrays["frames"], arrays["conditions"], arrays["actions"], arrays["stamps_ns"],
                meta.get("episode", "?"), int(meta.get("start", 0)), arrays.get("latents"),
                arrays.get("condition_latents"))


@dataclass
class DatasetInfo:
    """``dataset.json``: what the clips are and where they came from.

    Attributes:
        preset: world-model preset the frames are sized for ("tiny", "paper").
        width, height: frame size [px].
        fps: frame rate of the clips [1/s] (the head camera's).
        clip_frames: frames of a full clip (1 + 4k; tail clips of an episode may be shorter, >= 5).
        joint_names: the 54 action joints, in the actions' column order.
        seed, val_fraction: the episode-level split.
        condition: the condition style's fields (``SkeletonStyle``) and camera intrinsics used.
        episodes: per episode: ``path``, ``name``, ``split``, ``frames`` (usable), ``clips`` (clip files,
            relative to the dataset folder).
        skipped: per skipped episode: ``path`` and ``reason``.
        has_latents: clips carry VAE latents.
        format: :data:`DATASET_FORMAT`.
    """

    preset: str
    width: int
    height: int
    fps: float
    clip_frames: int
    joint_names: list[str]
    seed: int = 0
    val_fraction: float = 0.05
    condition: dict[str, Any] = field(default_factory=dict)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    has_latents: bool = False
    format: str = DATASET_FORMAT

    def clip_files(self, split: str) -> list[str]:
        """Clip files of ``split`` ("train" or "val"), relative to the dataset folder, in episode order."""
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}; got {split!r}")
        return [c for e in self.episodes if e["split"] == split for c in e["clips"]]

    def write(self, root: str | os.PathLike) -> None:
        """Write ``root/dataset.json``."""
        Path(root).mkdir(parents=True, exist_ok=True)
        (Path(root) / INFO_FILE).write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def read(cls, root: str | os.PathLike) -> DatasetInfo:
        """``root/dataset.json``.

        Raises:
            DatasetError: no dataset there, another format, or unknown/missing fields (named).
        """
        path = Path(root) / INFO_FILE
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise DatasetError(f"{root}: no {INFO_FILE}: not a world-model dataset (rynn-teleop world-model "
                               "dataset EPISODES... --out DIR makes one)") from None
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{path}: unreadable ({exc})") from exc
        if not isinstance(doc, dict) or doc.get("format") != DATASET_FORMAT:
            found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise DatasetError(f"{path}: format {found!r}, expected {DATASET_FORMAT!r}")
        try:
            return cls(**doc)
        except TypeError as exc:
            raise DatasetError(f"{path}: {exc}") from exc


class ClipDataset(Sequence[Clip]):
    """The clips of one split of a dataset folder, read on access (a map-style dataset for a DataLoader:
    ``__getitem__`` returns a :class:`Clip`; convert to tensors in the collate function).

    Raises:
        DatasetError: no dataset at ``root`` (see :meth:`DatasetInfo.read`), or an empty split.
    """

    def __init__(self, root: str | os.PathLike, split: str = "train") -> None:
        self.root = Path(root)
        self.info = DatasetInfo.read(self.root)
        self.split = split
        self.files = self.info.clip_files(split)
        if not self.files:
            raise DatasetError(f"{self.root}: no {split} clips")

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> Clip:  # type: ignore[override]
        return read_clip(self.root / self.files[index])

    def __iter__(self) -> Iterator[Clip]:
        return (self[i] for i in range(len(self)))
