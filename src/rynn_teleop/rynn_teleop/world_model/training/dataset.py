"""Clips from recorded episodes: ``rynn-teleop world-model dataset EPISODE_DIRS... --out DIR`` (ROS-free; torch
only for ``--latents``).

:func:`build_dataset` writes a dataset folder in the format of :mod:`.clips`. Per episode:

* **Frames**: the head camera's colour frames (``camera_topic``, default :data:`DEFAULT_CAMERA_TOPIC`, the
  camera key the LeRobot export uses by default) in header-stamp order, resized to the preset's size by
  :func:`~rynn_teleop.world_model.generator.as_rgb`, the function the diffusion backend resizes its inputs with.
* **Actions**: each frame's 54-D action is the command in force at its header stamp: per joint the newest value
  on ``/arms/command`` and ``/hands/command`` stamped at or before it (canonical joint order; the LeRobot
  export's ``action`` column, :func:`~rynn_teleop.recording.frames.command_rows`). Frames before every joint has
  been commanded are left out (``dropped_leading_frames`` of the episode entry).
* **Conditions**: :func:`condition_frames`, the node's own path: ``Conditioner(robot, intrinsics,
  style).condition_image(action)`` at the recorded camera's intrinsics, resized by ``as_rgb`` to the preset's
  size as :class:`~rynn_teleop.world_model.diffusion.backend.DiffusionGenerator` resizes it. Intrinsics: the
  episode's first ``CameraInfo`` on the camera's ``camera_info`` topic (rescaled to the frames' size if it is
  of another size), else :func:`~rynn_teleop.core.camera.default_intrinsics` of the frames' size (the law the
  node uses without ``camera.*`` parameters). Style: :class:`SkeletonStyle` defaults, which are the node's
  ``condition.*`` defaults. Both are recorded in :attr:`DatasetInfo.condition`; all episodes of a dataset must
  agree on the intrinsics at the preset's size (an episode that does not is skipped).
* **Clips**: consecutive frames cut into clips of ``clip_frames`` (1 + 4k) frames. Consecutive clips share one
  frame: a clip's anchor (first frame) is the previous clip's last frame, as a stream re-anchors on its newest
  frame, so every frame-to-frame transition of the episode is in exactly one clip. What is left at the end
  becomes one shorter clip of 1 + 4k frames (at least :data:`MIN_CLIP_FRAMES`) when long enough; the rest
  (at most 3 frames, or a whole episode shorter than 5 frames) is not used (``unused_frames``).
* **Split** (``split_by``): by episode (the default without objects): a seeded permutation of the usable
  episodes (in the order given) puts ``round(val_fraction * n)`` of them, at least one when there are two or
  more and ``val_fraction > 0``, and never all, in ``val``; the rest in ``train``. No episode is in both
  (repeated paths are read once). By layout (the default with objects): the same rule over the distinct
  object layouts (in order of first appearance) instead of the episodes, every episode going where its layout
  goes, so that held-out episodes show layouts never seen in training; ``val_fraction`` is then the share of
  layouts. An episode's layout is ``episode.yaml``'s ``extra.twin`` scene and seed
  (:func:`~.objects.episode_layout`; with objects, else the ``/twin/scene`` it recorded); one that names none
  is a layout of its own. Each episode entry records its ``layout`` and ``split_group`` (the key it was split by).
* **Objects** (``objects``, ``--objects``: twin episodes only): every clip also carries the twin's objects at
  each frame (:mod:`.objects`: poses sampled at the frame stamps like the commands, projected boxes at the
  preset's size through the dataset's camera, displaced / moved / lifted flags, each object's first move). An
  episode without ``/twin/objects`` is refused ("no /twin/objects recorded: not a twin episode"), as is one
  whose ``/twin/scene`` is missing or changes layout; frames stamped before the first object pose are left
  out like those before every joint was commanded (counted in ``dropped_leading_frames`` and in the entry's
  ``objects.dropped_before_poses``); a frame whose newest pose is older than
  :data:`~.objects.MAX_POSE_AGE_S` is warned about. The dataset folder gets ``objects.json``
  (:func:`~.objects.objects_doc`).
* **Checks**: an episode that ``rynn-teleop episodes check`` would fault (gaps, drops, missing topics, rates,
  failed recording) is skipped unless ``include_problems``; an unclosed one, one without frames on the camera
  topic or without commands for all 54 joints always is. Each skip is printed and kept in
  :attr:`DatasetInfo.skipped` with its reason; if no episode is usable nothing is written
  (:class:`NoUsableEpisodeError`). A *damaged* episode (its MCAP file fails
  :func:`~rynn_teleop.recording.recover.require_intact`: CRCs, structure, messages that do not decode) stops
  the build with one line naming it and the damage (``DamagedEpisodeError``), or is skipped with that line
  (``skip_damaged``, ``--skip-damaged``).
* **Latents** (optional): normalised VAE latents of the frames and of the conditions, one-shot per clip (the
  first frame alone, then 4 frames per latent frame: what the streaming encoder gives call by call), as the
  DiT sees them.

The folder is built beside ``out_dir`` and moved into place at the end: a failed run leaves nothing behind. The
staging folder is created before any episode is read, so an ``out_dir`` that cannot be created or written is
refused first, by name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rynn_teleop.core.camera import CameraIntrinsics, default_intrinsics
from rynn_teleop.core.camera_view import CameraView
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.recording.episodes import description_hash
from rynn_teleop.recording.errors import DATA_EXIT_CODE, DamagedEpisodeError, RecordingError
from rynn_teleop.recording.frames import (
    CAMERA_INFO,
    FEED_TOPICS,
    CommandRows,
    EpisodeScan,
    command_rows,
    first_message,
    read_images,
    scan_episode,
)
from rynn_teleop.recording.inspect import episodes_at
from rynn_teleop.recording.metadata import episode_doc, read_metadata
from rynn_teleop.recording.recover import require_intact
from rynn_teleop.world_model.conditioning import DEFAULT_CAMERA_FRAME, Conditioner, SkeletonStyle
from rynn_teleop.world_model.diffusion.presets import PRESETS, WanPreset, get_preset
from rynn_teleop.world_model.generator import as_rgb

from .clips import SPLITS, Clip, DatasetError, DatasetInfo, write_clip
from .objects import (
    MAX_POSE_AGE_S,
    OBJECTS_FILE,
    OBJECTS_TOPIC,
    ClipObjects,
    NotTwinEpisodeError,
    add_to_clip_file,
    episode_layout,
    episode_objects,
    objects_doc,
    read_twin_objects,
    with_boxes,
)

DEFAULT_CAMERA_TOPIC = FEED_TOPICS["consumer"]
"""The head camera's colour topic read by default (``/head_camera/color/image_raw``, what the recorder records)."""
MIN_CLIP_FRAMES = 5  # [frames] the shortest clip: the anchor and one latent frame of 4
RATE_TOLERANCE = 0.10  # an episode whose frame rate differs from the dataset's by more than this fraction: warned
INTRINSICS_TOLERANCE_PX = 0.01  # [px] at the preset's size: episodes whose intrinsics differ more are not mixed
SPLIT_BY = ("episode", "layout")  # what the train/val split keeps apart


class NoUsableEpisodeError(DatasetError):
    """None of the episodes given can be used (each one is named with its reason): the data is at fault."""

    exit_code = DATA_EXIT_CODE


# ---- the one conditioning path -------------------------------------------------------------------------------


def condition_frames(conditioner: Conditioner, actions: np.ndarray | Iterable[np.ndarray], width: int,
                     height: int) -> np.ndarray:
    """The condition images the world model sees for ``actions``: the node's drawing
    (:meth:`Conditioner.condition_image` at the conditioner's camera intrinsics and size), resized to
    ``width`` x ``height`` by :func:`~rynn_teleop.world_model.generator.as_rgb` as the diffusion backend
    resizes every condition it is given.

    Args:
        conditioner: the node's conditioner (robot, camera intrinsics, :class:`SkeletonStyle`).
        actions: (T, 54) joint vectors [rad], canonical joint order.
        width, height: the model's image size [px] (the preset's).

    Returns:
        (T, height, width, 3) uint8 RGB.
    """
    images = [as_rgb(conditioner.condition_image(np.asarray(q, dtype=float)), width, height) for q in actions]
    if not images:
        return np.zeros((0, height, width, 3), np.uint8)
    return np.stack(images)


def clip_bounds(frames: int, clip_frames: int) -> list[tuple[int, int]]:
    """(start, length) of each clip cut from ``frames`` consecutive frames (see the module docstring).

    Full clips of ``clip_frames`` frames, each starting at the previous one's last frame, then one tail clip of
    the longest 1 + 4k >= :data:`MIN_CLIP_FRAMES` frames that fits; none when ``frames`` < 5.

    Raises:
        DatasetError: ``clip_frames`` is not 1 + 4k with k >= 1.
    """
    check_clip_frames(clip_frames)
    bounds, start = [], 0
    while frames - start >= MIN_CLIP_FRAMES:
        length = min(clip_frames, 1 + 4 * ((frames - start - 1) // 4))
        bounds.append((start, length))
        start += length - 1
    return bounds


def check_clip_frames(clip_frames: int) -> int:
    """``clip_frames`` as an int once it is 1 + 4k with k >= 1.

    Raises:
        DatasetError: naming the value.
    """
    whole = isinstance(clip_frames, (int, np.integer)) and not isinstance(clip_frames, bool)
    if not whole or clip_frames < MIN_CLIP_FRAMES or (clip_frames - 1) % 4:
        raise DatasetError(f"clip_frames {clip_frames!r}: a clip is 1 + 4k frames with k >= 1 (5, 9, ..., 81), the "
                           "anchor then whole latent frames of 4")
    return int(clip_frames)


def split_episodes(count: int, val_fraction: float, seed: int) -> list[str]:
    """The split ("train" or "val") of each of ``count`` episodes (see the module docstring).

    Raises:
        DatasetError: ``val_fraction`` outside [0, 1).
    """
    check_val_fraction(val_fraction)
    n_val = 0
    if count >= 2 and val_fraction > 0:
        n_val = min(count - 1, max(1, round(val_fraction * count)))
    order = np.random.default_rng(seed).permutation(count)
    val = set(order[:n_val].tolist())
    return ["val" if i in val else "train" for i in range(count)]


def split_groups(groups: Sequence[str], val_fraction: float, seed: int) -> list[str]:
    """The split ("train" or "val") of each item, by group: :func:`split_episodes` over the distinct ``groups``
    (in order of first appearance), every item going where its group goes. With distinct groups this is
    :func:`split_episodes` of the items.

    Raises:
        DatasetError: ``val_fraction`` outside [0, 1).
    """
    keys = list(dict.fromkeys(groups))
    per_key = dict(zip(keys, split_episodes(len(keys), val_fraction, seed)))
    return [per_key[g] for g in groups]


def split_held_out(groups: Sequence[str], held_out: Sequence[str]) -> list[str]:
    """The split ("train" or "val") of each item, by group: "val" exactly for the groups in ``held_out``.

    Raises:
        DatasetError: a held-out key that no item has (named, with the keys there are), or every group held out.
    """
    keys = list(dict.fromkeys(groups))
    missing = [k for k in dict.fromkeys(held_out) if k not in keys]
    if missing:
        raise DatasetError(f"held out {', '.join(missing)}: no usable episode has it (the keys here: "
                           f"{', '.join(keys)})")
    if set(keys) <= set(held_out):
        raise DatasetError(f"held out {', '.join(keys)}: that is every group, nothing would be left to train on")
    return ["val" if g in set(held_out) else "train" for g in groups]


def check_split_by(split_by: str | None, objects: bool) -> str:
    """``split_by`` once it is one of :data:`SPLIT_BY`; None: "layout" with objects, else "episode".

    Raises:
        DatasetError: naming the value.
    """
    if split_by is None:
        return "layout" if objects else "episode"
    if split_by not in SPLIT_BY:
        raise DatasetError(f"split_by {split_by!r}: must be one of {', '.join(SPLIT_BY)} (what the train/val split "
                           "keeps apart)")
    return split_by


def check_val_fraction(val_fraction: float) -> float:
    """``val_fraction`` as a float once it is in [0, 1).

    Raises:
        DatasetError: naming the value.
    """
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)) \
            or not 0.0 <= float(val_fraction) < 1.0:
        raise DatasetError(f"val_fraction {val_fraction!r}: must be in [0, 1) (the share of episodes held out)")
    return float(val_fraction)


def episode_paths(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Each path as episode directories, as the ``rynn-teleop episodes`` commands read a path
    (:func:`~rynn_teleop.recording.inspect.episodes_at`).

    Raises:
        DatasetError: a path that is neither an episode nor a folder of episodes (named).
    """
    try:
        return [episode for path in paths for episode in episodes_at(path)]
    except RecordingError as exc:
        raise DatasetError(str(exc)) from None


def style_fields(style: SkeletonStyle) -> dict[str, Any]:
    """The fields of ``style`` as JSON-ready values (what :attr:`DatasetInfo.condition` records)."""
    out = {}
    for f in dataclasses.fields(style):
        if f.init:
            value = getattr(style, f.name)
            out[f.name] = [list(c) for c in value] if isinstance(value, tuple) else value
    return out


# ---- one episode ---------------------------------------------------------------------------------------------


class _Skip(Exception):
    """An episode that is not used; ``reason`` says why."""

    def __init__(self, reason: str, problems: Sequence[str] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.problems = list(problems)


@dataclass
class _EpisodeResult:
    path: Path
    name: str
    files: list[Path]  # staged clip files, in order
    entry: dict[str, Any]  # the episode entry (without split and clips)
    intrinsics: CameraIntrinsics
    fps: float | None
    warnings: list[str] = field(default_factory=list)
    layout: str | None = None  # the episode's object layout (objects.layout_key), None: unknown


def _reason(exc: BaseException, path: Path) -> str:
    return str(exc).removeprefix(f"{path}: ")


def _camera_intrinsics(scan: EpisodeScan, topic: str, size: tuple[int, int]) -> tuple[CameraIntrinsics, str, list[str]]:
    """(intrinsics at the frames' size ``size`` = (width, height), where they came from, warnings)."""
    from rynn_teleop.sources.camera.replay import intrinsics_from_camera_info

    info_topic = topic.rsplit("/", 1)[0] + "/camera_info"
    info = first_message(scan.bag, info_topic) if scan.bag.types.get(info_topic) == CAMERA_INFO else None
    if info is None:
        return default_intrinsics(*size), f"default_intrinsics (no {CAMERA_INFO} on {info_topic})", []
    try:
        intrinsics = intrinsics_from_camera_info(info)
    except ConfigurationError as exc:
        return (default_intrinsics(*size), f"default_intrinsics ({info_topic} unusable)",
                [f"{info_topic}: unusable camera info ({exc}); default intrinsics used"])
    if (intrinsics.width, intrinsics.height) != size:
        return (intrinsics.scaled(*size), f"{info_topic}, rescaled",
                [f"{info_topic} is for {intrinsics.width}x{intrinsics.height} but the frames are {size[0]}x{size[1]}; "
                 "rescaled"])
    return intrinsics, info_topic, []


def _frame_rate(stamps_ns: np.ndarray) -> float | None:
    """[Hz] from the median interval of the frames' stamps (a gap does not change it); None: too few frames."""
    intervals = np.diff(stamps_ns)
    if len(intervals) < 1 or np.median(intervals) <= 0:
        return None
    return 1e9 / float(np.median(intervals))


class _LatentEncoder:
    """The base release's VAE (float32), encoding RGB clips to normalised latents."""

    def __init__(self, base_dir: str | os.PathLike, preset: WanPreset, device: str) -> None:
        import torch

        from rynn_teleop.world_model.diffusion.vae import StreamingVAE, rgb_to_pixels
        from rynn_teleop.world_model.diffusion.weights import load_base

        try:
            device_obj = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise DatasetError(f"latents: device {device!r} is not a torch device ({exc})") from exc
        base = load_base(base_dir, preset, device_obj, torch.float32)
        self.vae = StreamingVAE(base.vae)
        del base  # the transformer is not needed
        self._torch, self._to_pixels, self.device = torch, rgb_to_pixels, device_obj

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        """(C, 1 + (T - 1) / 4, H / 16, W / 16) float32 latents of (T, H, W, 3) uint8 frames."""
        pixels = self._to_pixels(frames, self.device, self._torch.float32)
        return self.vae.encode(pixels)[0].float().cpu().numpy()


def _episode(path: Path, name: str, stage: Path, *, topic: str, preset: WanPreset, clip_frames: int,
             include_problems: bool, robot: RobotModel, style: SkeletonStyle,
             encode: Callable[[np.ndarray], np.ndarray] | None, objects: bool = False) -> _EpisodeResult:
    """Read, check and cut one episode into clip files under ``stage`` (with ``objects``: each with the twin's
    objects, see the module docstring).

    Raises:
        _Skip: the episode is not used (the reason).
    """
    if read_metadata(path) is None:
        raise _Skip(f"not closed (no metadata.yaml): still being recorded, or run `rynn-teleop episodes recover "
                    f"{path}`")
    try:
        doc = episode_doc(path)
        require_intact(path, doc=doc)
        scan = scan_episode(path)
        rows: CommandRows = command_rows(scan, topic)
    except DamagedEpisodeError:
        raise  # skipped or not by the caller (skip_damaged)
    except RecordingError as exc:
        raise _Skip(_reason(exc, path)) from exc
    problems = scan.problems(doc)
    if problems and not include_problems:
        raise _Skip(f"`episodes check` found {len(problems)} problem(s) (--include-problems uses it): "
                    + "; ".join(problems), problems)
    warnings: list[str] = []
    layout = episode_layout(doc)
    track: ClipObjects | None = None
    objects_entry: dict[str, Any] | None = None
    if objects:
        rows, track, objects_entry, layout = _episode_objects(scan, path, rows, layout, warnings)
    n = len(rows.stamps_ns)
    bounds = clip_bounds(n, clip_frames)
    if not bounds:
        after = "every joint was commanded" + (" and the objects were posed" if objects else "")
        raise _Skip(f"{n} frame(s) after {after}; a clip needs at least {MIN_CLIP_FRAMES}")
    feeds = sorted({s for _, s in scan.sources})
    if topic == FEED_TOPICS["consumer"] and "generated" in feeds:
        warnings.append(f"{topic} carried the generated feed for part of the episode (active sources: "
                        f"{', '.join(feeds)}): those frames are the world model's, not the camera's")
    recorded_hash = str(doc.get("robot_description_hash") or "")
    if recorded_hash and recorded_hash != description_hash(robot.urdf):
        warnings.append("recorded with another robot description than the one the conditions are drawn with "
                        "(robot_description_hash differs)")

    width, height = preset.width, preset.height
    end = bounds[-1][0] + bounds[-1][1]
    images = read_images(scan.bag, topic, rows.messages[:end])
    files: list[Path] = []
    conditioner: Conditioner | None = None
    box_view: CameraView | None = None  # the camera at the preset's size: the objects' boxes
    intrinsics: CameraIntrinsics | None = None
    source = ""
    size: tuple[int, int] | None = None
    pending: list[np.ndarray] = []
    clips = iter(bounds)
    start, length = next(clips)
    try:
        for r, image in enumerate(images):
            if size is None:
                size = (image.shape[1], image.shape[0])
                intrinsics, source, found = _camera_intrinsics(scan, topic, size)
                warnings += found
                try:
                    conditioner = Conditioner(robot, intrinsics, style)
                    if track is not None:
                        box_view = CameraView.from_robot(robot, intrinsics.scaled(width, height),
                                                         DEFAULT_CAMERA_FRAME)
                except ConfigurationError as exc:  # e.g. a distortion model the projection does not support
                    raise _Skip(f"camera intrinsics {tuple(intrinsics)} cannot be drawn through: {exc}") from exc
            elif (image.shape[1], image.shape[0]) != size:
                raise _Skip(f"{topic}: frame {r} is {image.shape[1]}x{image.shape[0]}, the first was "
                            f"{size[0]}x{size[1]}")
            pending.append(as_rgb(image, width, height))
            if len(pending) < length:
                continue
            assert conditioner is not None
            actions = rows.actions[start:start + length]
            conditions = condition_frames(conditioner, actions, width, height)
            frames = np.stack(pending)
            latents = condition_latents = None
            if encode is not None:
                latents, condition_latents = encode(frames), encode(conditions)
            clip = Clip(frames, conditions, actions.astype(np.float32), rows.stamps_ns[start:start + length].copy(),
                        name, start, latents, condition_latents)
            files.append(stage / f"{len(files):06d}.safetensors")
            write_clip(files[-1], clip)
            if track is not None:
                assert box_view is not None
                add_to_clip_file(files[-1], with_boxes(track.slice(start, start + length), box_view))
            nxt = next(clips, None)
            if nxt is None:
                break
            assert nxt[0] == start + length - 1  # the next clip starts at this one's last frame
            start, length = nxt
            pending = pending[-1:]
    except DamagedEpisodeError:
        raise
    except RecordingError as exc:
        raise _Skip(_reason(exc, path)) from exc
    finally:
        images.close()
    assert intrinsics is not None and size is not None
    fps = _frame_rate(rows.stamps_ns)
    entry = {
        "path": str(path), "name": name, "camera_topic": topic, "frames": n,
        "dropped_leading_frames": int(rows.dropped), "unused_frames": int(n - end),
        "fps": None if fps is None else round(fps, 3), "frame_size": list(size),
        "intrinsics": _intrinsics_doc(intrinsics), "intrinsics_source": source,
        "camera_sources": feeds, "problems": problems, "warnings": warnings, "layout": layout,
    }
    if objects_entry is not None:
        entry["objects"] = objects_entry
    return _EpisodeResult(path, name, files, entry, intrinsics, fps, warnings, layout)


def _episode_objects(scan: EpisodeScan, path: Path, rows: CommandRows, layout: str | None, warnings: list[str]
                     ) -> tuple[CommandRows, ClipObjects, dict[str, Any], str]:
    """The twin's objects at the episode's frames: (the rows from the first frame with object poses on, the
    objects at those rows without boxes, the entry's ``objects`` field, the layout).

    Raises:
        _Skip: no usable objects (the reason starts "no /twin/objects recorded: not a twin episode" for an
            episode without them), or no frame stamped at or after the first pose.
    """
    try:
        twin = read_twin_objects(scan.bag, path)
    except NotTwinEpisodeError as exc:
        raise _Skip(_reason(exc, path)) from exc
    before = int(np.searchsorted(rows.stamps_ns, twin.stamps_ns[0], side="left"))
    if before == len(rows.stamps_ns):
        raise _Skip(f"every frame is stamped before the first {OBJECTS_TOPIC} pose")
    rows = CommandRows(rows.messages[before:], rows.stamps_ns[before:], rows.actions[before:], rows.dropped + before)
    track, age_ns = episode_objects(twin, rows.stamps_ns)
    stale = int(np.sum(age_ns > MAX_POSE_AGE_S * 1e9))
    if stale:
        warnings.append(f"{stale} frame(s) whose newest {OBJECTS_TOPIC} pose is older than {MAX_POSE_AGE_S} s "
                        f"(up to {age_ns.max() / 1e9:.3f} s): their object poses are stale")
    if layout is not None and layout != twin.layout:
        warnings.append(f"episode.yaml names the layout {layout}, /twin/scene {twin.layout}; episode.yaml's is used")
    entry = {
        "scene": twin.scene, "seed": twin.seed, "objects": [o.doc() for o in twin.objects],
        "first_move": [int(f) for f in track.first_move],
        "dropped_before_poses": before, "max_pose_age_s": round(float(age_ns.max()) / 1e9, 6),
    }
    return rows, track, entry, layout if layout is not None else twin.layout


def _intrinsics_doc(intrinsics: CameraIntrinsics) -> dict[str, Any]:
    doc = intrinsics._asdict()
    doc["coeffs"] = [float(c) for c in intrinsics.coeffs]
    return doc


def _same_view(a: CameraIntrinsics, b: CameraIntrinsics, width: int, height: int) -> bool:
    """Whether ``a`` and ``b`` draw the same condition images at ``width`` x ``height``."""
    sa, sb = a.scaled(width, height), b.scaled(width, height)
    return sa.distortion_model == sb.distortion_model and np.allclose(sa.coeffs, sb.coeffs) and all(
        abs(getattr(sa, k) - getattr(sb, k)) <= INTRINSICS_TOLERANCE_PX for k in ("fx", "fy", "cx", "cy"))


def _unique_names(paths: Sequence[Path]) -> list[str]:
    """The episode folders' names; ``parent/name`` where two share a name."""
    names = [p.name for p in paths]
    return [f"{p.parent.name}/{p.name}" if names.count(p.name) > 1 else p.name for p in paths]


# ---- the dataset ---------------------------------------------------------------------------------------------


def build_dataset(
    episode_dirs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    preset: str = "tiny",
    clip_frames: int = 81,
    val_fraction: float = 0.05,
    seed: int = 0,
    latents: tuple[str | os.PathLike, str] | None = None,
    include_problems: bool = False,
    camera_topic: str | None = None,
    robot: RobotModel | None = None,
    style: SkeletonStyle | None = None,
    echo: Callable[[str], None] | None = print,
    progress: bool = False,
    skip_damaged: bool = False,
    objects: bool = False,
    split_by: str | None = None,
    held_out: Sequence[str] | None = None,
) -> DatasetInfo:
    """Write the world-model dataset of ``episode_dirs`` to ``out_dir`` (see the module docstring).

    Args:
        episode_dirs: episode directories, or folders of ``episode_NNNN`` episodes, in the order the split and
            the clip numbering use.
        out_dir: the dataset folder to create; it must not exist or be empty.
        preset: the world-model preset whose image size the frames and conditions get ("tiny", "paper").
        clip_frames: frames of a full clip, 1 + 4k (default 81, the paper's chunk).
        val_fraction: share of the usable episodes held out for validation, in [0, 1).
        seed: seed of the split.
        latents: (base release folder, torch device) to store normalised VAE latents with every clip; None: none.
        include_problems: use episodes whose integrity check fails too (their problems are recorded).
        camera_topic: the head camera's ``sensor_msgs/Image`` topic (default :data:`DEFAULT_CAMERA_TOPIC`).
        robot: the robot model the conditions are drawn with (default ``RobotModel.default()``, the node's
            without a ``description_overlay``).
        style: the skeleton style (default ``SkeletonStyle()``, the node's ``condition.*`` defaults).
        echo: where the per-episode lines, skips, warnings and the summary go (None: nowhere).
        progress: show a progress bar over the episodes (tqdm, on stderr).
        skip_damaged: leave out an episode whose MCAP file is damaged (printed and kept in ``skipped`` with its
            one-line reason) instead of stopping.
        objects: clips carry the twin's objects (:mod:`.objects`); an episode without them is skipped with the
            reason "no /twin/objects recorded: not a twin episode".
        split_by: "episode" or "layout" (held-out layouts, never seen in training); None: "layout" with
            ``objects``, else "episode".
        held_out: the split keys to hold out instead of a seeded choice (``val_fraction`` and ``seed`` are then
            unused): layouts as ``dataset.json`` records them in ``split_group`` (``pick_place/seed=2004``) when
            splitting by layout, episode directories when splitting by episode. Holding out the same layouts of
            a larger recording compares datasets on the same held-out frames. None: the seeded choice.

    Returns:
        The dataset's description, as written to ``out_dir/dataset.json``.

    Raises:
        DatasetError: a bad argument (named); a ``held_out`` key no usable episode has, or every key held out;
            ``out_dir`` exists and is not an empty folder, or cannot be created or written; a path that is no
            episode; no usable episode (:class:`NoUsableEpisodeError`, each one named with its reason). Nothing
            is written then.
        DamagedEpisodeError: an episode is damaged (without ``skip_damaged``); nothing is written.
        ConfigurationError: an unknown preset; with ``latents``, a base folder that is missing or not the
            preset's (``BaseModelError``).
    """
    config = get_preset(preset)
    clip_frames = check_clip_frames(clip_frames)
    val_fraction = check_val_fraction(val_fraction)
    split_by = check_split_by(split_by, bool(objects))
    if isinstance(held_out, (str, bytes)):
        raise DatasetError(f"held_out {held_out!r}: must be a list of keys, not one string")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DatasetError(f"seed {seed!r}: must be an integer >= 0")
    topic = camera_topic or DEFAULT_CAMERA_TOPIC
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DatasetError(f"{out}: exists and is not an empty folder; give a new --out (nothing is overwritten)")
    say = echo or (lambda _: None)
    paths: list[Path] = []
    for p in episode_paths(episode_dirs):
        if any(p.resolve() == q.resolve() for q in paths):
            say(f"{p}: given more than once; used once")
        else:
            paths.append(p)
    if not paths:
        raise DatasetError("no episode given")
    robot = robot if robot is not None else RobotModel.default()
    style = style if style is not None else SkeletonStyle()
    stage = out.parent / f".{out.name}.dataset-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    try:  # before the episodes are read: an output that cannot be written is refused first
        stage.mkdir(parents=True)
        (stage / ".write-test").touch()
        (stage / ".write-test").unlink()
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise DatasetError(f"cannot create the dataset folder {out}: {exc.strerror or exc} "
                           f"({exc.filename or stage})") from exc
    try:
        encode = None
        if latents is not None:
            base_dir, device = latents
            encode = _LatentEncoder(base_dir, config, str(device))
        used, skipped = _read_episodes(paths, stage, topic=topic, config=config, clip_frames=clip_frames,
                                       include_problems=include_problems, robot=robot, style=style, encode=encode,
                                       say=say, progress=progress, skip_damaged=skip_damaged, objects=bool(objects))
        if not used:
            listed = "\n  ".join(f"{s['path']}: {s['reason']}" for s in skipped)
            raise NoUsableEpisodeError(f"no usable episode among {len(paths)}:\n  {listed}")
        if len(used) == 1:
            say(f"warning: only one usable episode ({used[0].path}): all of it is train, no validation split")
        rates = [u.fps for u in used if u.fps is not None]
        fps = float(np.median(rates)) if rates else 0.0
        for u in used:
            if u.fps is not None and fps > 0 and abs(u.fps - fps) > RATE_TOLERANCE * fps:
                say(f"warning: {u.path}: camera at {u.fps:.2f} Hz, the dataset's median is {fps:.2f} Hz")
                u.entry["warnings"].append(f"camera at {u.fps:.2f} Hz, the dataset's median is {fps:.2f} Hz")
        groups = [(u.layout or f"episode:{u.path}") if split_by == "layout" else str(u.path) for u in used]
        if held_out is None:
            splits = split_groups(groups, val_fraction, int(seed))
        elif split_by == "layout":
            splits = split_held_out(groups, [str(k) for k in held_out])
        else:  # episode directories, however they were spelled
            resolved = {str(Path(k).resolve()): g for k, g in ((str(u.path.resolve()), str(u.path)) for u in used)}
            splits = split_held_out(groups, [resolved.get(str(Path(k).resolve()), str(k)) for k in held_out])
        if split_by == "layout" and len(used) > 1 and len(set(groups)) == 1:
            say(f"warning: every usable episode has the layout {groups[0]}: all of it is train, no validation split "
                "(split_by layout holds out whole layouts)")
        counters = dict.fromkeys(SPLITS, 0)
        episodes = []
        for u, split, group in zip(used, splits, groups):
            clips = []
            for f in u.files:
                rel = f"clips/{split}/{counters[split]:06d}.safetensors"
                counters[split] += 1
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, stage / rel)
                clips.append(rel)
            episodes.append({**u.entry, "split": split, "split_group": group, "clips": clips})
        shutil.rmtree(stage / "episodes", ignore_errors=True)
        first = used[0]
        info = DatasetInfo(
            preset=config.name, width=config.width, height=config.height, fps=round(fps, 3), clip_frames=clip_frames,
            joint_names=list(robot.joint_names), seed=int(seed), val_fraction=float(val_fraction),
            condition={
                "function": f"{__name__}.condition_frames", "style": style_fields(style),
                "intrinsics": _intrinsics_doc(first.intrinsics), "intrinsics_source": first.entry["intrinsics_source"],
                "camera_frame": DEFAULT_CAMERA_FRAME, "arms": True, "camera_topic": topic,
            },
            episodes=episodes, skipped=skipped, has_latents=encode is not None,
        )
        info.write(stage)
        if objects:
            layouts = {s: {str(u.layout) for u, sp in zip(used, splits) if sp == s} for s in SPLITS}
            doc = objects_doc(_intrinsics_doc(first.intrinsics.scaled(config.width, config.height)),
                              DEFAULT_CAMERA_FRAME, split_by, layouts)
            (stage / OBJECTS_FILE).write_text(json.dumps(doc, indent=1) + "\n")
        if out.exists():
            out.rmdir()
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(stage, out)
    except BaseException as exc:
        shutil.rmtree(stage, ignore_errors=True)
        if isinstance(exc, OSError):  # disk full, a folder removed under us...: named, nothing left behind
            raise DatasetError(f"building the dataset {out} failed: {exc.strerror or exc}"
                               + (f" ({exc.filename})" if exc.filename else "") + "; nothing was written") from exc
        raise
    _summary(info, out, say, split_by, bool(objects))
    return info


def _read_episodes(paths: Sequence[Path], stage: Path, *, topic: str, config: WanPreset, clip_frames: int,
                   include_problems: bool, robot: RobotModel, style: SkeletonStyle,
                   encode: Callable[[np.ndarray], np.ndarray] | None, say: Callable[[str], None],
                   progress: bool, skip_damaged: bool = False, objects: bool = False,
                   ) -> tuple[list[_EpisodeResult], list[dict[str, Any]]]:
    """Every episode read into staged clip files: (the used ones, the skipped ones' entries), in order."""
    used: list[_EpisodeResult] = []
    skipped: list[dict[str, Any]] = []
    bar = _progress(paths, progress)
    echo = (lambda line: bar.write(line, file=sys.stdout)) if progress and say is print else say
    for k, (path, name) in enumerate(zip(bar, _unique_names(paths))):
        try:
            result = _episode(path, name, stage / "episodes" / f"{k:05d}", topic=topic, preset=config,
                              clip_frames=clip_frames, include_problems=include_problems, robot=robot, style=style,
                              encode=encode, objects=objects)
        except _Skip as skip:
            shutil.rmtree(stage / "episodes" / f"{k:05d}", ignore_errors=True)
            skipped.append({"path": str(path), "reason": skip.reason, "problems": skip.problems})
            echo(f"{path}: skipped: {skip.reason}")
            continue
        except DamagedEpisodeError as exc:
            if not skip_damaged:
                raise DamagedEpisodeError(f"{exc} (--skip-damaged leaves it out)", episode=exc.episode,
                                          report=exc.report) from exc
            shutil.rmtree(stage / "episodes" / f"{k:05d}", ignore_errors=True)
            reason = _reason(exc, path)
            skipped.append({"path": str(path), "reason": reason, "problems": [], "damaged": True})
            echo(f"{path}: skipped: {reason}")
            continue
        if used and not _same_view(used[0].intrinsics, result.intrinsics, config.width, config.height):
            shutil.rmtree(stage / "episodes" / f"{k:05d}", ignore_errors=True)
            reason = (f"camera intrinsics {tuple(result.intrinsics)} differ from those of {used[0].path} "
                      f"{tuple(used[0].intrinsics)} at the preset's size; one dataset has one camera")
            skipped.append({"path": str(path), "reason": reason, "problems": []})
            echo(f"{path}: skipped: {reason}")
            continue
        used.append(result)
        e = result.entry
        posed = " and the objects were posed" if objects else ""
        extra = f", {e['dropped_leading_frames']} leading frame(s) before every joint was commanded{posed}" \
            if e["dropped_leading_frames"] else ""
        echo(f"{path}: {e['frames']} frames, {len(result.files)} clip(s){extra}")
        for w in result.warnings:
            echo(f"warning: {path}: {w}")
    return used, skipped


def _progress(paths: Sequence[Path], progress: bool) -> Any:
    """``paths``, behind a tqdm bar (with its ETA) when ``progress``."""
    if not progress:
        return iter(paths)
    from tqdm import tqdm

    return tqdm(paths, desc="episodes", unit="episode", file=sys.stderr)


def _summary(info: DatasetInfo, out: Path, say: Callable[[str], None], split_by: str = "episode",
             objects: bool = False) -> None:
    per_split = {s: sum(1 for e in info.episodes if e["split"] == s) for s in SPLITS}
    clips = {s: len(info.clip_files(s)) for s in SPLITS}
    frames = sum(e["frames"] for e in info.episodes)
    by = ""
    if split_by == "layout":
        layouts = {s: len({e["split_group"] for e in info.episodes if e["split"] == s}) for s in SPLITS}
        by = f", split by layout: {layouts['train']} train and {layouts['val']} held-out layout(s)"
    say(f"wrote {out}: {len(info.episodes)} episode(s) used ({per_split['train']} train, {per_split['val']} val"
        f"{by}), {len(info.skipped)} skipped; {clips['train']} train and {clips['val']} val clip(s); {frames} frames "
        f"at {info.width}x{info.height} px, {info.fps:.2f} fps" + ("; with VAE latents" if info.has_latents else "")
        + ("; with the twin's objects" if objects else ""))


# ---- command line --------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rynn-teleop world-model dataset``."""
    parser.add_argument("episodes", nargs="+", type=Path, metavar="EPISODE_DIRS",
                        help="episode directories, or folders of episode_NNNN episodes")
    parser.add_argument("--out", type=Path, required=True, help="the dataset folder to create (new or empty)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                        help="world-model size whose image size the clips get (default tiny)")
    parser.add_argument("--clip-frames", type=int, default=81,
                        help="frames per clip, 1 + 4k (default 81); the tail of an episode may be shorter (>= 5)")
    parser.add_argument("--val-fraction", type=float, default=0.05,
                        help="share of the episodes held out for validation, in [0, 1) (default 0.05; at least one "
                             "episode when there are two or more)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the episode split (default 0)")
    parser.add_argument("--latents", type=Path, metavar="BASE_DIR",
                        help="also store VAE latents, encoded with this base release's VAE (Wan2.2 layout)")
    parser.add_argument("--device", default="cpu", help="torch device of --latents (default cpu)")
    parser.add_argument("--include-problems", action="store_true",
                        help="use episodes whose `episodes check` fails too (skipped by default)")
    parser.add_argument("--camera-topic", default=DEFAULT_CAMERA_TOPIC,
                        help=f"the head camera's Image topic (default {DEFAULT_CAMERA_TOPIC})")
    parser.add_argument("--skip-damaged", action="store_true",
                        help="leave out an episode whose file is damaged (one line says why) instead of stopping")
    parser.add_argument("--objects", action="store_true",
                        help="twin episodes only: clips carry the twin's object poses, boxes and moved flags "
                             "(an episode without /twin/objects is skipped with the reason)")
    parser.add_argument("--split-by", choices=SPLIT_BY, default=None,
                        help="hold out whole episodes or whole object layouts (episode.yaml's twin scene and seed) "
                             "(default: layout with --objects, else episode)")
    parser.add_argument("--held-out", action="append", default=None, metavar="KEY",
                        help="hold out this layout (e.g. pick_place/seed=2004) or episode directory instead of a "
                             "seeded choice; repeat for more (--val-fraction and --seed are then unused)")


def run_cli(args: argparse.Namespace) -> int:
    """``rynn-teleop world-model dataset``; returns 0 once the dataset is written (errors are raised)."""
    build_dataset(
        args.episodes, args.out, preset=args.preset, clip_frames=args.clip_frames, val_fraction=args.val_fraction,
        seed=args.seed, latents=(args.latents, args.device) if args.latents else None,
        include_problems=args.include_problems, camera_topic=args.camera_topic, progress=sys.stderr.isatty(),
        skip_damaged=args.skip_damaged, objects=args.objects, split_by=args.split_by, held_out=args.held_out,
    )
    return 0


__all__ = [
    "DEFAULT_CAMERA_TOPIC",
    "MIN_CLIP_FRAMES",
    "SPLIT_BY",
    "NoUsableEpisodeError",
    "add_arguments",
    "build_dataset",
    "check_clip_frames",
    "check_val_fraction",
    "clip_bounds",
    "condition_frames",
    "episode_paths",
    "check_split_by",
    "run_cli",
    "split_episodes",
    "split_groups",
    "split_held_out",
    "style_fields",
]
