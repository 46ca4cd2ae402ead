"""Evaluation on held-out clips: PSNR, SSIM and LPIPS per frame and per chunk of the learned model, the optional
teacher, the ``render`` backend and the repeat-the-first-frame baseline (``rynn-teleop world-model eval``).

Every model sees the same input and is scored on the same frames. For a clip of ``T = 1 + 4k`` frames, frame 0
(the anchor, a real camera frame) is given to every model and not scored; frames 1..T-1 are generated and
compared with the recorded ones (the "held-out frames"):

* ``student``: the weights folder through the node's serving path,
  :class:`~rynn_teleop.world_model.diffusion.backend.DiffusionGenerator`: ``reset(frame 0)``, then
  ``step(action_t, condition_t)`` for t = 1..T-1 with the clip's actions and condition images; frames come a block
  (4) at a time. Each clip's sampler noise starts from ``seed`` (results do not depend on the clip order).
  A clip longer than the preset's ``chunk_frames`` re-anchors on the model's own last frame, as a digital stream.
* ``teacher`` (optional, e.g. the stage-1 weights): the same serving path with the other weights folder. The
  teacher was trained bidirectionally on whole clips; here the streaming engine runs it block-causally (the
  sink + window key/value cache, the preset's 4 sampler steps, a commit pass per block), exactly as the node
  would run those weights. This measures the teacher as served, not its bidirectional many-step sampling.
* ``render``: :class:`~rynn_teleop.world_model.render.RenderGenerator` (the robot's primitives drawn at each
  action over frame 0) through the dataset's camera (``dataset.json``'s ``condition.intrinsics`` scaled to the
  preset's size, and ``condition.camera_frame``), as the node builds it.
* ``reconstruction`` (optional, on by default): the clip's own frames encoded and decoded by the base's VAE
  (``base_dir/vae``, the posterior mean), the whole clip at once. Not a model: the ceiling of every model that
  generates in this VAE's latent space (a DiT predicting the true latents exactly scores this).
* ``baseline``: frame 0 repeated.

With ``composite`` settings the student, the teacher and the reconstruction are composited over frame 0 as the
backend serves them with ``composite: true`` (:mod:`~rynn_teleop.world_model.diffusion.composite`: pixels whose
decode differs from the VAE's drawing of the unchanged frame 0 by at most ``low`` come from frame 0 itself,
blended up to ``high``), so the reconstruction stays the ceiling of the models as served. With the ``render``
reference (``composite.reference``) the reference is the render backend's frame for each action instead of frame 0,
and the reconstruction is composited over the same frames.

Metrics (:mod:`.metrics`): per frame PSNR [dB] (capped at :data:`~.metrics.PSNR_CAP_DB` for identical frames),
SSIM and LPIPS (null, with the reason, unless the user gives AlexNet's ImageNet trunk weights); means over all
held-out frames (the mean of the per-frame values), curves per frame index (mean over the clips that have that
frame) and per chunk (the 4-frame blocks the model generates at once: chunk b holds frames 4b+1..4b+4).

Hands: ``hand_psnr`` [dB] is the PSNR over the pixels within a margin of where forward kinematics of the
clip's action puts each robot hand (the convex hull of the projected 21 hand keypoints of
:meth:`~rynn_teleop.world_model.conditioning.Conditioner.keypoints`, grown by
:data:`HAND_MARGIN_FRACTION` of the image width): how well a model draws the region where the hands must be.

Hand position (``hand_shift_px``, ``hand_within_3px``): there is no hand detector for generated frames, so a
hand's position error is measured as the displacement of its appearance. For each hand whose keypoints project
into the frame, the ground-truth frame's pixels in the hand's region (the convex hull of its projected 21
keypoints, grown by :data:`HAND_PATCH_MARGIN_FRACTION` of the width, at least :data:`HAND_MARGIN_MIN_PX`) are
located in the generated frame within :data:`HAND_SEARCH_FRACTION` of the width either way
(:func:`~.metrics.locate_patch`: masked zero-mean normalised cross-correlation, sub-pixel peak). The
ground-truth frame shows the hand where its keypoints project (the twin's robot and the camera model are the
ones forward kinematics uses), so the displacement [px, at the evaluated frame size] is how far from its
projected keypoints the generated frame puts the hand. ``hand_shift_px`` is its mean over the hands found;
``hand_within_3px`` the share of measurable hands (textured in the ground truth) found within
:data:`HAND_SHIFT_THRESHOLD_PX` (a hand not found, e.g. blurred away, counts as outside). The threshold is the 3 px
end-effector projection error RynnWorld-Latent's appendix D accepts (with 5 mm and 5 deg, which need the
generated hand's 3-D pose and are not measured); it is applied in pixels of the evaluated size (the paper's is
832 x 480; ``hand.pixel_scale_to_paper`` converts).

Objects (datasets built with ``--objects``: clips carry the twin's object boxes, :mod:`.objects`): for each
object that moves during its episode (``first_move`` >= 0) and is in view, PSNR [dB] and SSIM over its projected
box in the ground-truth frame (:func:`~.metrics.box_psnr`, :func:`~.metrics.box_ssim`), per frame the mean over
such objects: ``object_psnr`` / ``object_ssim`` over every frame, ``object_psnr_before`` / ``_after`` (and
SSIM) over the frames before the object's first move (it still rests where it was laid out) and from it on (it
is being or has been moved: the interaction). ``object_psnr_moving`` / ``object_ssim_moving``: the ``_after``
frames of the objects whose first move lies inside the clip (they rest at the anchor frame, which every model is
given, so no model sees where they go): the interaction itself. In a clip that starts after an object was moved,
the anchor already shows it moved and repeating it scores well while the object rests; ``_after`` counts those
frames, ``_moving`` does not. Means are over the held-out frames that have a value.

Outputs in ``out_dir``: ``metrics.json`` (see :func:`evaluate`), ``psnr.png``, ``ssim.png`` (and ``lpips.png``
when measured, ``hand_psnr.png`` and ``hand_shift_px.png`` when any hand was in view, ``object_psnr.png`` and
``object_ssim.png`` when the clips carry objects): one line per model against the frame index, and
``side_by_side.mp4``: ground truth | model | teacher | render | repeat first, every evaluated clip in turn (with
objects: each moved object's box outlined on every panel, green before its first move, red from it on).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import cv2
import numpy as np

from rynn_teleop.core.camera import CameraIntrinsics, default_intrinsics
from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.conditioning import DEFAULT_CAMERA_FRAME, Conditioner
from rynn_teleop.world_model.diffusion.composite import REFERENCES, CompositeSettings
from rynn_teleop.world_model.generator import Generator

from .clips import SPLITS, Clip, ClipDataset, DatasetError, DatasetInfo, read_clip
from .metrics import (
    PATCH_MIN_SCORE,
    PSNR_CAP_DB,
    Lpips,
    box_psnr,
    box_ssim,
    frame_metrics,
    load_lpips_backbone,
    locate_patch,
    masked_psnr,
    ssim_map,
)
from .objects import ClipObjects, box_visible, read_clip_objects, read_objects_doc

if TYPE_CHECKING:
    import torch

EVAL_FORMAT = "rynn_teleop.world_model.eval/1"
METRICS_FILE = "metrics.json"
VIDEO_FILE = "side_by_side.mp4"
MODELS = ("student", "teacher", "reconstruction", "render", "baseline")  # JSON, table, plot and video order
OBJECT_METRICS = ("object_psnr", "object_ssim", "object_psnr_before", "object_psnr_after", "object_ssim_before",
                  "object_ssim_after", "object_psnr_moving", "object_ssim_moving")
METRICS = ("psnr", "ssim", "lpips", "hand_psnr", "hand_shift_px", "hand_within_3px", *OBJECT_METRICS)
PLOTTED = ("psnr", "ssim", "lpips", "hand_psnr", "hand_shift_px", "object_psnr", "object_ssim",
           "object_psnr_moving")  # <metric>.png
UNITS = {"psnr": "PSNR [dB]", "ssim": "SSIM", "lpips": "LPIPS", "hand_psnr": "hand-region PSNR [dB]",
         "hand_shift_px": "hand shift [px]", "hand_within_3px": "hands within 3 px [share]",
         "object_psnr": "moved objects' box PSNR [dB]", "object_ssim": "moved objects' box SSIM",
         "object_psnr_before": "box PSNR before first move [dB]", "object_psnr_after": "box PSNR after first move [dB]",
         "object_ssim_before": "box SSIM before first move", "object_ssim_after": "box SSIM after first move",
         "object_psnr_moving": "box PSNR after a first move inside the clip [dB]",
         "object_ssim_moving": "box SSIM after a first move inside the clip"}
LABELS = {"truth": "ground truth", "student": "model", "teacher": "teacher", "reconstruction": "VAE round trip",
          "render": "render", "baseline": "repeat first"}
HAND_MARGIN_FRACTION = 0.03  # hand regions grow by this fraction of the image width [px / px] ...
HAND_MARGIN_MIN_PX = 2  # ... and by at least this much [px]
HAND_PATCH_MARGIN_FRACTION = 0.01  # a hand's patch located for hand_shift_px: its hull grown by this share of the width
HAND_SEARCH_FRACTION = 0.1  # hand_shift_px looks this share of the image width either way [px / px] ...
HAND_SEARCH_MIN_PX = 4  # ... and at least this far [px]
HAND_SHIFT_THRESHOLD_PX = 3.0  # [px] RynnWorld-Latent appendix D: the accepted end-effector projection error
PAPER_WIDTH_PX = 832  # [px] the paper's frame width (its 3 px are at 832 x 480)
OBJECT_BOX_COLOURS = ((60, 220, 60), (230, 40, 40))  # RGB outline of a moved object's box: before, after its move
VIDEO_CODECS = ("libx264", "mpeg4")  # tried in this order
VIDEO_BIT_RATE = 4_000_000  # [bit/s] for mpeg4 (libx264 uses its default constant quality)
NO_LPIPS_REASON = ("no LPIPS backbone given: LPIPS needs AlexNet's ImageNet weights, which are not shipped and "
                   "cannot be downloaded here; pass --lpips-backbone PATH (torchvision's alexnet-owt-7be5be79.pth)")
NO_OBJECTS_REASON = ("the dataset's clips carry no object boxes: build it from twin episodes with `rynn-teleop "
                     "world-model dataset --objects`")


class ClipScores(NamedTuple):
    """Per-frame scores of one model on one clip: each (T - 1,) float64 (``lpips`` None when not measured;
    ``hand_*`` NaN on frames without a hand in view, ``hand_shift_px`` also where no hand was found; the
    ``object_*`` None for a clip without objects, NaN on frames without a moved object in view, or in that
    phase, see the module docstring)."""

    psnr: np.ndarray
    ssim: np.ndarray
    lpips: np.ndarray | None
    hand_psnr: np.ndarray
    hand_shift_px: np.ndarray | None = None  # [px] mean over the hands found
    hand_within_3px: np.ndarray | None = None  # [-] share of the measurable hands found within 3 px
    object_psnr: np.ndarray | None = None  # [dB] mean over the moved objects in view
    object_ssim: np.ndarray | None = None
    object_psnr_before: np.ndarray | None = None  # [dB] ... of those before their first move
    object_psnr_after: np.ndarray | None = None  # [dB] ... of those at or after it
    object_ssim_before: np.ndarray | None = None
    object_ssim_after: np.ndarray | None = None
    object_psnr_moving: np.ndarray | None = None  # [dB] ... of those whose first move is inside the clip, from it on
    object_ssim_moving: np.ndarray | None = None


# ---- inputs -------------------------------------------------------------------------------------------------


def dataset_intrinsics(info: DatasetInfo) -> tuple[CameraIntrinsics, str]:
    """The head camera's intrinsics at the dataset's frame size, and where they came from.

    ``dataset.json``'s ``condition.intrinsics`` (the fields of :class:`CameraIntrinsics`) when present, scaled
    to ``info.width`` x ``info.height`` if of another size; else the D435-like :func:`default_intrinsics` of
    that size (what the node uses without camera parameters).

    Raises:
        DatasetError: ``condition.intrinsics`` present but malformed.
    """
    given = info.condition.get("intrinsics") if isinstance(info.condition, dict) else None
    if given is None:
        return default_intrinsics(info.width, info.height), "default (dataset.json has no condition.intrinsics)"
    try:
        fields = {k: given[k] for k in CameraIntrinsics._fields if k in given}
        if "coeffs" in fields:
            fields["coeffs"] = tuple(float(c) for c in fields["coeffs"])
        intrinsics = CameraIntrinsics(**fields).check()
    except (TypeError, KeyError, ValueError, ConfigurationError) as exc:
        raise DatasetError(f"dataset.json: condition.intrinsics {given!r} is not camera intrinsics "
                           f"({', '.join(CameraIntrinsics._fields)}): {exc}") from exc
    if (intrinsics.width, intrinsics.height) != (info.width, info.height):
        return intrinsics.scaled(info.width, info.height), "dataset.json condition.intrinsics, scaled"
    return intrinsics, "dataset.json condition.intrinsics"


def _joint_order(info: DatasetInfo, robot: RobotModel) -> np.ndarray:
    """Column of the dataset's actions for each of the robot's joints."""
    names = list(info.joint_names)
    missing = [n for n in robot.joint_names if n not in names]
    if missing:
        raise DatasetError(f"dataset.json: joint_names lacks the robot's joints {missing[:6]}"
                           f"{' ...' if len(missing) > 6 else ''}")
    return np.array([names.index(n) for n in robot.joint_names], dtype=np.int64)


def _check_clip(clip: Clip, file: str, info: DatasetInfo, block: int) -> None:
    h, w = clip.frames.shape[1:3]
    if (w, h) != (info.width, info.height):
        raise DatasetError(f"{file}: frames of {w}x{h} px; dataset.json says {info.width}x{info.height}")
    if clip.length < 1 + block or (clip.length - 1) % block:
        raise DatasetError(f"{file}: {clip.length} frames; the model generates blocks of {block}, so a clip needs "
                           f"1 + {block}k frames (k >= 1)")
    if clip.actions.shape[1] != len(info.joint_names):
        raise DatasetError(f"{file}: actions have {clip.actions.shape[1]} columns; dataset.json names "
                           f"{len(info.joint_names)} joints")


# ---- models -------------------------------------------------------------------------------------------------


def stream(generator: Generator, clip: Clip, actions: np.ndarray) -> np.ndarray:
    """Frames 1..T-1 of ``clip`` generated by ``generator`` (the serving loop: reset on frame 0, one step per
    action with its condition image), (T - 1, H, W, 3) uint8.

    Args:
        actions: (T, 54) the clip's actions in the robot's joint order [rad].

    Raises:
        RuntimeError: the generator returned another number of frames (actions left pending).
    """
    generator.reset(clip.frames[0])
    out: list[np.ndarray] = []
    for t in range(1, clip.length):
        out += generator.step(actions[t], clip.conditions[t])
    if len(out) != clip.length - 1:
        raise RuntimeError(f"{type(generator).__name__} returned {len(out)} frames for {clip.length - 1} actions "
                           f"({generator.pending} pending)")
    return np.stack(out)


def served_sweep(clip: Clip, device: Any = "cpu") -> torch.Tensor:
    """(1, 1, T, H, W) bool: the reach gate's sweep over ``clip`` as the backend serves it here, from frame 1's
    condition image on (the stream starts from frame 0 without one; :func:`stream`)."""
    from rynn_teleop.world_model.diffusion import composite as compositing
    from rynn_teleop.world_model.diffusion.vae import rgb_to_pixels

    skeleton = compositing.skeleton_mask(rgb_to_pixels(clip.conditions, device=device))
    skeleton[:, :, 0] = False
    return compositing.sweep(skeleton)


def vae_round_trip(vae: Any, clip: Clip, composite: CompositeSettings | None = None,
                   rendered: np.ndarray | None = None) -> np.ndarray:
    """Frames 1..T-1 of ``clip`` encoded and decoded by ``vae`` (a
    :class:`~rynn_teleop.world_model.diffusion.vae.StreamingVAE`; the whole clip as one one-shot stream, the
    posterior mean), (T - 1, H, W, 3) uint8: what a model that predicted the clip's latents exactly would show;
    with ``composite``, composited over frame 0 as the backend serves it (the reach gate's :func:`served_sweep`),
    or with its ``render`` reference over ``rendered`` (T - 1, H, W, 3) uint8, the render backend's frames 1..T-1
    (their static decode streamed after frame 0, as the engine does).

    Raises:
        ValueError: the ``render`` reference without ``rendered``.
    """
    from rynn_teleop.world_model.diffusion import composite as compositing
    from rynn_teleop.world_model.diffusion.vae import pixels_to_rgb, rgb_to_pixels

    pixels = rgb_to_pixels(clip.frames, device=vae.device, dtype=vae.dtype)
    decoded = vae.decode(vae.encode(pixels))
    if composite is not None:
        swept = served_sweep(clip, vae.device) if composite.reach_px else None
        if composite.reference == "render":
            if rendered is None or len(rendered) != clip.length - 1:
                raise ValueError("the render reference needs the render backend's frames 1..T-1")
            reference = rgb_to_pixels(np.concatenate([clip.frames[:1], rendered]), device=vae.device,
                                      dtype=vae.dtype)
        else:
            reference = pixels[:, :, :1]
        static = compositing.static_video(vae, reference, clip.length)
        decoded = compositing.composite(decoded, static, reference, composite, swept)
    return np.stack(pixels_to_rgb(decoded)[1:])


def repeat_first(clip: Clip) -> np.ndarray:
    """The baseline: frame 0 repeated for frames 1..T-1, (T - 1, H, W, 3) uint8."""
    return np.repeat(clip.frames[:1], clip.length - 1, axis=0)


def hand_regions(conditioner: Conditioner, actions: np.ndarray, margin: int) -> list[list[np.ndarray]]:
    """Per action (N, 54) [rad] (robot order), one (H, W) bool mask per hand in view: the pixels within
    ``margin`` [px] of the convex hull of the hand's 21 keypoints projected through the conditioner's camera
    (hands behind the camera, with fewer than 3 points in front of it, or whose region misses the image, are
    left out)."""
    h, w = conditioner.height, conditioner.width
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * margin + 1, 2 * margin + 1))
    out: list[list[np.ndarray]] = []
    for q in actions:
        keypoints = conditioner.keypoints(q)
        hands = []
        for hand in (keypoints.left_hand, keypoints.right_hand):
            uv = conditioner.view.project(hand).uv
            uv = uv[np.isfinite(uv).all(axis=1)]
            if len(uv) < 3:
                continue
            # far outside the image the hull's exact shape does not matter; keep the coordinates in int32
            uv = np.clip(np.round(uv), [-4 * w, -4 * h], [5 * w, 5 * h]).astype(np.int32)
            mask = np.zeros((h, w), dtype=np.uint8)
            cv2.fillConvexPoly(mask, cv2.convexHull(uv), 1)
            mask = cv2.dilate(mask, kernel) > 0
            if mask.any():
                hands.append(mask)
        out.append(hands)
    return out


def hand_masks(conditioner: Conditioner, actions: np.ndarray, margin: int) -> np.ndarray:
    """(N, H, W) bool: per action (N, 54) [rad] (robot order), the union of its :func:`hand_regions`."""
    masks = np.zeros((len(actions), conditioner.height, conditioner.width), dtype=bool)
    for i, hands in enumerate(hand_regions(conditioner, actions, margin)):
        for mask in hands:
            masks[i] |= mask
    return masks


class HandShifts(NamedTuple):
    """Per-frame hand position error of one model (:func:`hand_shifts`): each (N,) float64."""

    shift_px: np.ndarray  # [px] mean distance over the hands found; NaN: none found (or none in view)
    within: np.ndarray  # [-] share of the measurable hands found within the threshold; NaN: none measurable


def hand_shifts(pred: np.ndarray, truth: np.ndarray, regions: Sequence[Sequence[np.ndarray]], search_px: int,
                threshold_px: float = HAND_SHIFT_THRESHOLD_PX) -> HandShifts:
    """How far from where ``truth`` shows each hand ``pred`` puts it (see the module docstring), per frame.

    Args:
        pred, truth: (N, H, W, 3) uint8 frames.
        regions: per frame, the hands' masks (:func:`hand_regions` with the patch margin).
        search_px: [px] the largest displacement looked for along each axis.
        threshold_px: [px] a hand found within this distance counts in ``within``.
    """
    shift = np.full(len(pred), np.nan)
    within = np.full(len(pred), np.nan)
    for t, (p, g, hands) in enumerate(zip(pred, truth, regions)):
        found, measurable, close = [], 0, 0
        for mask in hands:
            located = locate_patch(p, g, mask, search_px)
            if not located.measurable:
                continue
            measurable += 1
            if located.found:
                found.append(located.distance)
                close += located.distance <= threshold_px
        if found:
            shift[t] = float(np.mean(found))
        if measurable:
            within[t] = close / measurable
    return HandShifts(shift, within)


class ObjectScores(NamedTuple):
    """Per-frame box scores of one model over the moved objects (:func:`object_scores`): each (N,) float64, NaN
    where no moved object is in view (in that phase)."""

    psnr: np.ndarray
    ssim: np.ndarray
    psnr_before: np.ndarray
    psnr_after: np.ndarray
    ssim_before: np.ndarray
    ssim_after: np.ndarray
    psnr_moving: np.ndarray
    ssim_moving: np.ndarray


def object_scores(pred: np.ndarray, truth: np.ndarray, boxes: np.ndarray, moved: np.ndarray,
                  movers: np.ndarray, resting_at_anchor: np.ndarray | None = None) -> ObjectScores:
    """Box PSNR/SSIM of ``pred`` against ``truth`` (N, H, W, 3) over the objects ``movers`` (K,) bool (those that
    move in their episode) in view, per frame the mean over them, split by phase (see the module docstring).

    Args:
        boxes: (N, K, 4) int [px] the objects' boxes in ``truth`` (half-open u0, v0, u1, v1).
        moved: (N, K) bool: the object has moved by that frame (at or after its first move).
        movers: (K,) bool: the objects scored.
        resting_at_anchor: (K,) bool: the object had not moved yet at the clip's anchor frame (frame 0, given to
            every model), so its first move, if in ``moved``, happens inside the clip; the ``*_moving`` scores
            keep only those objects. None: every object rested at the anchor.
    """
    n = len(pred)
    values = {k: np.full(n, np.nan) for k in ObjectScores._fields}
    visible = box_visible(boxes) & np.asarray(movers, dtype=bool)[None]
    resting = np.ones(boxes.shape[1], dtype=bool) if resting_at_anchor is None else \
        np.asarray(resting_at_anchor, dtype=bool)
    for t in range(n):
        ks = np.nonzero(visible[t])[0]
        if not len(ks):
            continue
        smap = ssim_map(pred[t], truth[t])
        ps = np.array([box_psnr(pred[t], truth[t], boxes[t, k]) for k in ks])
        ss = np.array([box_ssim(None, None, boxes[t, k], ssim_image=smap) for k in ks])
        after = moved[t, ks]
        moving = after & resting[ks]
        for key, v, sel in (("psnr", ps, None), ("ssim", ss, None), ("psnr_before", ps, ~after),
                            ("psnr_after", ps, after), ("ssim_before", ss, ~after), ("ssim_after", ss, after),
                            ("psnr_moving", ps, moving), ("ssim_moving", ss, moving)):
            chosen = v if sel is None else v[sel]
            chosen = chosen[np.isfinite(chosen)]
            if len(chosen):
                values[key][t] = float(chosen.mean())
    return ObjectScores(**values)


def score(pred: np.ndarray, truth: np.ndarray, masks: np.ndarray, lpips: Lpips | None, device: str = "cpu", *,
          hands: Sequence[Sequence[np.ndarray]] | None = None, search_px: int = HAND_SEARCH_MIN_PX,
          objects: ClipObjects | None = None, resting_at_anchor: np.ndarray | None = None) -> ClipScores:
    """Per-frame scores of ``pred`` against ``truth`` (both (N, H, W, 3) uint8), hand regions ``masks`` (N, H, W);
    image metrics computed on ``device``.

    Args:
        hands: per frame, each hand's patch mask (:func:`hand_regions`) for :func:`hand_shifts` (with
            ``search_px``); None: the hand shift is not measured.
        objects: the clip's objects at frames 1..T-1 (N frames, :meth:`~.objects.ClipObjects.slice`) for
            :func:`object_scores`; None: no object scores.
        resting_at_anchor: (K,) bool, the objects not yet moved at the clip's frame 0 (``~moved[0]`` of the
            whole clip's objects), for the ``*_moving`` scores; None: all.
    """
    psnr, ssim, lp = frame_metrics(pred, truth, lpips, device=device)
    hand = np.array([masked_psnr(p, t, m) for p, t, m in zip(pred, truth, masks)], dtype=np.float64)
    shifts = None if hands is None else hand_shifts(pred, truth, hands, search_px)
    objs = None
    if objects is not None:
        objs = object_scores(pred, truth, objects.boxes, objects.moved, objects.movers, resting_at_anchor)
    return ClipScores(psnr, ssim, lp, hand,
                      None if shifts is None else shifts.shift_px, None if shifts is None else shifts.within,
                      *((None,) * len(OBJECT_METRICS) if objs is None else objs))


def outline_objects(frame: np.ndarray, objects: ClipObjects, t: int) -> np.ndarray:
    """A copy of ``frame`` (H, W, 3) uint8 with the box of each object of ``objects`` that moves in its episode
    outlined as at clip frame ``t`` (:data:`OBJECT_BOX_COLOURS`: before its first move, from it on)."""
    out = frame.copy()
    for k, obj in enumerate(objects.objects):
        box = objects.boxes[t, k]
        if obj.fixed or objects.first_move[k] < 0 or not box_visible(box):
            continue
        colour = OBJECT_BOX_COLOURS[int(objects.moved[t, k])]
        cv2.rectangle(out, (int(box[0]), int(box[1])), (int(box[2]) - 1, int(box[3]) - 1), colour, 1)
    return out


# ---- aggregation --------------------------------------------------------------------------------------------


def _finite_mean(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.mean()) if len(values) else None


def _json_list(values: np.ndarray | None) -> list[float | None] | None:
    if values is None:
        return None
    return [float(v) if math.isfinite(v) else None for v in np.asarray(values, dtype=np.float64)]


def summarise(per_clip: Sequence[ClipScores], block: int) -> dict[str, Any]:
    """One model's means over all held-out frames, and its curves per frame index and per chunk.

    Returns:
        ``{metric: mean, "hand_frames": n, "hand_shift_frames": n, "object_frames": n, "object_frames_before": n,
        "object_frames_after": n, "object_frames_moving": n, "per_frame": {"frame": [...], "count": [...],
        metric: [...]}, "per_chunk": {"chunk": [...], "first_frame": [...], "count": [...], metric: [...]}}`` for
        each metric of
        :data:`METRICS` (None where not measured or no frame has a value: for ``hand_*`` no hand in view, for
        ``object_*`` no moved object in view in that phase); the ``*_frames`` count the held-out frames with a
        value of ``hand_psnr``, ``hand_within_3px``, ``object_psnr``, ``object_psnr_before``,
        ``object_psnr_after`` and ``object_psnr_moving`` (0 where not measured).
    """
    index = np.concatenate([np.arange(1, len(s.psnr) + 1) for s in per_clip])
    frames = np.arange(1, int(index.max()) + 1)
    chunk_of = (index - 1) // block
    chunks = np.arange(int(chunk_of.max()) + 1)
    out: dict[str, Any] = {}
    per_frame: dict[str, Any] = {"frame": frames.tolist(), "count": [int((index == f).sum()) for f in frames]}
    per_chunk: dict[str, Any] = {"chunk": chunks.tolist(), "first_frame": (chunks * block + 1).tolist(),
                                 "count": [int((chunk_of == c).sum()) for c in chunks]}
    for metric in METRICS:
        parts = [getattr(s, metric) for s in per_clip]
        if any(p is None for p in parts):
            out[metric], per_frame[metric], per_chunk[metric] = None, None, None
            continue
        values = np.concatenate(parts)
        out[metric] = _finite_mean(values)
        per_frame[metric] = [_finite_mean(values[index == f]) for f in frames]
        per_chunk[metric] = [_finite_mean(values[chunk_of == c]) for c in chunks]
    for count, metric in (("hand_frames", "hand_psnr"), ("hand_shift_frames", "hand_within_3px"),
                          ("object_frames", "object_psnr"), ("object_frames_before", "object_psnr_before"),
                          ("object_frames_after", "object_psnr_after"),
                          ("object_frames_moving", "object_psnr_moving")):
        parts = [getattr(s, metric) for s in per_clip]
        out[count] = 0 if any(p is None for p in parts) else int(np.isfinite(np.concatenate(parts)).sum())
    out["per_frame"], out["per_chunk"] = per_frame, per_chunk
    return out


# ---- outputs ------------------------------------------------------------------------------------------------


class SideBySideWriter:
    """An MP4 of labelled panels side by side (PyAV; H.264, else MPEG-4 Part 2).

    Args:
        path: the file to write.
        labels: one label per panel, drawn in a strip above it.
        width, height: each panel's size [px].
        fps: frame rate [1/s].

    Raises:
        ConfigurationError: no codec of :data:`VIDEO_CODECS` can be opened.
    """

    def __init__(self, path: str | os.PathLike, labels: Sequence[str], width: int, height: int, fps: float) -> None:
        import av

        self.font, self.font_scale, self.thickness = cv2.FONT_HERSHEY_SIMPLEX, max(0.3, width / 320.0), 1
        text_h = max(cv2.getTextSize(label, self.font, self.font_scale, self.thickness)[0][1] for label in labels)
        self.strip = text_h + 6
        self.width, self.height, self.labels = width, height, list(labels)
        self.size = (len(labels) * width + (len(labels) * width) % 2, self.strip + height + (self.strip + height) % 2)
        self.container = av.open(str(path), mode="w")
        rate = Fraction(fps).limit_denominator(1001)
        self.stream, problems = None, []
        for codec in VIDEO_CODECS:
            try:
                stream = self.container.add_stream(codec, rate=rate)
            except (ValueError, av.FFmpegError) as exc:
                problems.append(f"{codec}: {exc}")
                continue
            stream.width, stream.height, stream.pix_fmt = self.size[0], self.size[1], "yuv420p"
            if codec == "mpeg4":
                stream.bit_rate = VIDEO_BIT_RATE
            self.stream, self.codec = stream, codec
            break
        if self.stream is None:
            self.container.close()
            raise ConfigurationError(f"{path}: no video codec available ({'; '.join(problems)})")
        self.frames = 0

    def write(self, panels: Sequence[np.ndarray]) -> None:
        """Add one frame: ``panels`` (H, W, 3) uint8 RGB, one per label, in label order."""
        import av

        canvas = np.zeros((self.size[1], self.size[0], 3), dtype=np.uint8)
        for k, (label, panel) in enumerate(zip(self.labels, panels)):
            x = k * self.width
            canvas[self.strip:self.strip + self.height, x:x + self.width] = panel
            cv2.putText(canvas, label, (x + 2, self.strip - 4), self.font, self.font_scale, (255, 255, 255),
                        self.thickness, cv2.LINE_AA)
        for packet in self.stream.encode(av.VideoFrame.from_ndarray(canvas, format="rgb24")):
            self.container.mux(packet)
        self.frames += 1

    def close(self) -> None:
        """Flush the encoder and close the file."""
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


def plot_curves(path: str | os.PathLike, metric: str, models: dict[str, dict[str, Any]], block: int) -> bool:
    """A PNG of ``metric`` against the frame index, one line per model of ``models`` (their :func:`summarise`);
    False (nothing written) when no model has a value of it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines = {name: m["per_frame"] for name, m in models.items() if m[metric] is not None}
    if not lines:
        return False
    figure = Figure(figsize=(7.0, 4.0))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    last = 1
    for name, curve in lines.items():
        y = [np.nan if v is None else v for v in curve[metric]]
        ax.plot(curve["frame"], y, marker=".", label=f"{LABELS[name]} (mean {models[name][metric]:.4g})")
        last = max(last, curve["frame"][-1])
    for edge in range(block, last, block):  # chunk boundaries
        ax.axvline(edge + 0.5, color="0.85", linewidth=0.8, zorder=0)
    ax.set_xlabel("frame index (0 = the anchor, given to every model)")
    ax.set_ylabel(UNITS[metric])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(str(path), dpi=100)
    return True


# ---- the evaluation -----------------------------------------------------------------------------------------


@contextmanager
def _diffusion(preset: str, base_dir, weights_dir, prompt_file, device: str, dtype: str, seed: int, what: str,
               composite: CompositeSettings | None = None, **camera: Any) -> Iterator[Generator]:
    """The diffusion backend as served; ``camera``: its ``robot``, ``intrinsics``, ``camera_frame`` (the render
    reference's)."""
    from rynn_teleop.world_model.diffusion.backend import DiffusionGenerator  # imports torch and diffusers

    if not weights_dir:
        raise ConfigurationError(f"eval: {what} is required (a weights folder written by train or distill)")
    serving = composite.backend_settings() if composite is not None else {}
    generator = DiffusionGenerator(preset, base_dir, weights_dir, prompt_file, device=device, dtype=dtype, seed=seed,
                                   **serving, **camera)
    try:
        yield generator
    finally:
        generator.close()


def _manifest(weights_dir) -> dict[str, Any] | None:
    from rynn_teleop.world_model.diffusion.weights import read_manifest

    return read_manifest(weights_dir).to_json() if weights_dir else None


def evaluate(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, *, base_dir: str | os.PathLike,
             weights_dir: str | os.PathLike, prompt_file: str | os.PathLike, preset: str | None = None,
             split: str = "val", teacher_weights_dir: str | os.PathLike | None = None, device: str = "cpu",
             dtype: str = "float32", seed: int = 0, lpips_backbone: str | os.PathLike | None = None,
             max_clips: int | None = None, render: bool = True, reconstruction: bool = True,
             composite: CompositeSettings | None = None,
             progress: Callable[[list[str]], Iterable[str]] | None = None) -> dict[str, Any]:
    """Score the model (and the teacher, the render backend, the repeat-first baseline) on ``split``'s clips.

    Args:
        dataset_dir: a dataset folder (``rynn-teleop world-model dataset``).
        out_dir: where ``metrics.json``, the plots and the MP4 go (created).
        base_dir, weights_dir, prompt_file: the model as the node loads it (the diffusion backend's parameters).
        preset: the model size; default (None) the dataset's, which it must equal.
        split: "val" (held-out episodes) or "train".
        teacher_weights_dir: a second weights folder scored the same way (see the module docstring), or None.
        device, dtype, seed: of the diffusion backend (``seed``: the sampler noise of every clip); the metrics
            are computed on ``device`` too.
        lpips_backbone: AlexNet's ImageNet weights file (:func:`~.metrics.load_lpips_backbone`); None: LPIPS is
            not measured (null in the results, with the reason).
        max_clips: score only the first ``max_clips`` clips of the split (dataset order); None: all.
        render: also score the ``render`` backend (needs the robot model).
        reconstruction: also score the base VAE's round trip of the true frames (the ceiling of every model on
            that VAE; see the module docstring).
        composite: reference compositing of the student, the teacher and the reconstruction (see the module
            docstring); None: none.
        progress: wraps the list of clip files iterated (e.g. ``tqdm``); None: no progress display.

    Returns:
        What ``metrics.json`` holds: ``format``; ``<model>_<metric>`` for every model of :data:`MODELS` and
        metric of :data:`METRICS` (``psnr``, ``ssim``, ``lpips``, ``hand_psnr``, ``hand_shift_px``,
        ``hand_within_3px``, ``object_psnr``, ``object_ssim``, ``object_psnr_before``, ``object_psnr_after``,
        ``object_ssim_before``, ``object_ssim_after``, ``object_psnr_moving``, ``object_ssim_moving``: means over
        the held-out frames with a value; None for a
        model not run or a metric not measured); ``held_out_frames``; ``models`` (per model run: the means, the
        frame counts, ``per_frame`` and ``per_chunk`` curves of every metric, see :func:`summarise`); ``clips``
        (file, episode, start, frames, with objects the moved objects' names and first moves, and per-frame
        scores of each model); ``lpips``, ``hand`` and ``objects`` (what was measured and how, or why not);
        ``psnr_cap_db``; ``chunk_frames`` (frames per chunk); ``inputs`` (every argument, the weights manifests,
        the intrinsics used and the dataset's fields); ``files`` (the plots and the video written, and its
        codec).

    Raises:
        DatasetError: no dataset, no clips in ``split``, a dataset of another preset or frame size, clips that
            are not 1 + whole blocks, actions without the robot's joints.
        ConfigurationError: unknown preset; a missing weights folder, base or prompt; a weights folder of
            another preset or base (``FineTunedWeightsError``); an unreadable LPIPS backbone
            (``LpipsBackboneError``); ``max_clips`` < 1.
    """
    from rynn_teleop.world_model.diffusion.presets import get_preset

    dataset = ClipDataset(dataset_dir, split)
    info = dataset.info
    name = preset or info.preset
    config = get_preset(name)
    if info.preset != name or (info.width, info.height) != (config.width, config.height):
        raise DatasetError(f"{Path(dataset_dir) / 'dataset.json'}: preset {info.preset!r} at {info.width}x"
                           f"{info.height} px; the model is {name!r} at {config.width}x{config.height} px")
    if max_clips is not None and max_clips < 1:
        raise ConfigurationError(f"eval: max_clips must be at least 1; got {max_clips}")
    files = dataset.files[:max_clips] if max_clips is not None else list(dataset.files)
    block = config.frames_per_block
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    lpips = None
    if lpips_backbone:
        import torch

        lpips = Lpips(load_lpips_backbone(lpips_backbone)).to(torch.device(device))
    robot = RobotModel.default()
    columns = _joint_order(info, robot)
    intrinsics, intrinsics_source = dataset_intrinsics(info)
    camera_frame = str(info.condition.get("camera_frame", DEFAULT_CAMERA_FRAME))
    conditioner = Conditioner(robot, intrinsics, camera_frame=camera_frame)
    margin = max(HAND_MARGIN_MIN_PX, round(HAND_MARGIN_FRACTION * info.width))
    patch_margin = max(HAND_MARGIN_MIN_PX, round(HAND_PATCH_MARGIN_FRACTION * info.width))
    search_px = max(HAND_SEARCH_MIN_PX, round(HAND_SEARCH_FRACTION * info.width))
    objects_doc = read_objects_doc(dataset.root)
    with_objects = False  # any clip carries objects

    inputs = {
        "dataset": str(Path(dataset_dir).resolve()), "split": split, "preset": name,
        "base_dir": str(base_dir), "weights_dir": str(weights_dir), "prompt_file": str(prompt_file),
        "teacher_weights_dir": str(teacher_weights_dir) if teacher_weights_dir else None,
        "device": device, "dtype": dtype, "seed": seed,
        "lpips_backbone": str(lpips_backbone) if lpips_backbone else None, "max_clips": max_clips, "render": render,
        "reconstruction": reconstruction,
        "composite": dataclasses.asdict(composite) if composite is not None else None,
        "intrinsics": {**intrinsics._asdict(), "coeffs": list(intrinsics.coeffs)},
        "intrinsics_source": intrinsics_source, "camera_frame": camera_frame,
        "dataset_info": {k: getattr(info, k) for k in ("preset", "width", "height", "fps", "clip_frames", "seed",
                                                       "val_fraction", "has_latents", "format")},
    }

    scores: dict[str, list[ClipScores]] = {m: [] for m in MODELS}
    clip_rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        camera = {"robot": robot, "intrinsics": intrinsics, "camera_frame": camera_frame}
        generators: dict[str, Generator] = {
            "student": stack.enter_context(_diffusion(name, base_dir, weights_dir, prompt_file, device, dtype, seed,
                                                      "weights_dir", composite, **camera))}
        if teacher_weights_dir:
            generators["teacher"] = stack.enter_context(_diffusion(
                name, base_dir, teacher_weights_dir, prompt_file, device, dtype, seed, "teacher_weights_dir",
                composite, **camera))
        inputs["weights_manifest"] = _manifest(weights_dir)
        inputs["teacher_weights_manifest"] = _manifest(teacher_weights_dir)
        # the render backend's frames: the model "render" and the render reference of the reconstruction
        painted = reconstruction and composite is not None and composite.reference == "render"
        if render or painted:
            from rynn_teleop.world_model.render import RenderGenerator

            renderer = RenderGenerator(robot, intrinsics, width=config.width, height=config.height,
                                       camera_frame=camera_frame)
            if render:
                generators["render"] = renderer
        vae = generators["student"].engine.model.vae if reconstruction else None
        run = [m for m in MODELS if m in generators or m == "baseline" or (m == "reconstruction" and vae is not None)]
        writer = SideBySideWriter(out / VIDEO_FILE, [LABELS["truth"]] + [LABELS[m] for m in run], config.width,
                                  config.height, info.fps)
        stack.callback(writer.close)
        for file in (progress(files) if progress is not None else files):
            clip = read_clip(dataset.root / file)
            _check_clip(clip, file, info, block)
            actions = clip.actions[:, columns].astype(np.float64)
            truth = clip.frames[1:]
            masks = hand_masks(conditioner, actions[1:], margin)
            hands = hand_regions(conditioner, actions[1:], patch_margin)
            clip_objects = read_clip_objects(dataset.root / file)
            held_objects = None if clip_objects is None else clip_objects.slice(1, clip.length)
            with_objects |= clip_objects is not None
            rendered = stream(renderer, clip, actions) if render or painted else None  # once per clip
            predictions = {}
            for model in run:
                if model == "baseline":
                    predictions[model] = repeat_first(clip)
                    continue
                if model == "reconstruction":
                    predictions[model] = vae_round_trip(vae, clip, composite, rendered if painted else None)
                    continue
                if model == "render":
                    predictions[model] = rendered
                    continue
                generator = generators[model]
                engine = getattr(generator, "engine", None)
                if engine is not None:  # each clip's noise starts from the seed
                    engine.generator.manual_seed(seed)
                predictions[model] = stream(generator, clip, actions)
            row: dict[str, Any] = {"file": file, "episode": clip.episode, "start": clip.start,
                                   "frames": clip.length, "scores": {}}
            if clip_objects is not None:
                row["moved_objects"] = {o.name: int(f) for o, f in zip(clip_objects.objects, clip_objects.first_move)
                                        if f >= 0 and not o.fixed}
            for model in run:
                s = score(predictions[model], truth, masks, lpips, device, hands=hands, search_px=search_px,
                          objects=held_objects,
                          resting_at_anchor=None if clip_objects is None else ~clip_objects.moved[0])
                scores[model].append(s)
                row["scores"][model] = {m: _json_list(getattr(s, m)) for m in METRICS}
            clip_rows.append(row)
            for t in range(clip.length):
                panels = [clip.frames[0]] * (1 + len(run)) if t == 0 else \
                    [truth[t - 1]] + [predictions[m][t - 1] for m in run]
                writer.write(panels if clip_objects is None else [outline_objects(p, clip_objects, t)
                                                                   for p in panels])
        codec = writer.codec

    models = {m: summarise(scores[m], block) for m in MODELS if scores[m]}
    result: dict[str, Any] = {"format": EVAL_FORMAT}
    for m in MODELS:
        for metric in METRICS:
            result[f"{m}_{metric}"] = models[m][metric] if m in models else None
    plots = [f"{metric}.png" for metric in PLOTTED if plot_curves(out / f"{metric}.png", metric, models, block)]
    result.update({
        "held_out_frames": int(sum(len(s.psnr) for s in scores["baseline"])),
        "clips": clip_rows,
        "models": models,
        "lpips": {"measured": lpips is not None, "reason": None if lpips is not None else NO_LPIPS_REASON,
                  "definition": "Zhang et al. 2018, AlexNet trunk, linear layers v0.1 (torchmetrics' alex.pth)"},
        "hand": {"hand_psnr": "PSNR over the pixels within margin_px of the convex hull of each hand's 21 keypoints "
                              "projected from forward kinematics of the frame's action; null on frames without a "
                              "hand in view", "margin_px": margin,
                 "hand_shift_px": "per hand in view: the ground-truth frame's pixels within patch_margin_px of the "
                                  "hull of its projected keypoints, located in the generated frame within "
                                  "search_px either way by masked zero-mean normalised cross-correlation (sub-pixel "
                                  "peak; found when the correlation is >= min_correlation and not at the search "
                                  "edge); the distance [px] from where the keypoints project; per frame the mean "
                                  "over the hands found",
                 "hand_within_3px": "per frame, the share of the hands with texture in the ground truth that were "
                                    "found within threshold_px (a hand not found counts as outside)",
                 "patch_margin_px": patch_margin, "search_px": search_px, "min_correlation": PATCH_MIN_SCORE,
                 "threshold_px": HAND_SHIFT_THRESHOLD_PX,
                 "threshold_source": "RynnWorld-Latent appendix D: 3 px end-effector projection error (with 5 mm and "
                                     "5 deg, which need the generated hand's 3-D pose: not measured)",
                 "pixel_scale_to_paper": PAPER_WIDTH_PX / info.width},
        "objects": {
            "measured": with_objects, "reason": None if with_objects else NO_OBJECTS_REASON,
            "definition": "per frame, the mean over the objects that move in their episode and are in view of PSNR "
                          "[dB] / SSIM over each object's projected box in the ground-truth frame; *_before: "
                          "frames before the object's first move, *_after: from it on, *_moving: from it on for "
                          "objects whose first move is inside the clip (at rest in the anchor frame)",
            "dataset": objects_doc,
        },
        "psnr_cap_db": PSNR_CAP_DB,
        "chunk_frames": block,
        "inputs": inputs,
        "files": {"metrics": METRICS_FILE, "plots": plots, "video": VIDEO_FILE, "video_codec": codec},
    })
    (out / METRICS_FILE).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
    return result


# ---- command line -------------------------------------------------------------------------------------------


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model as the node loads it, and how it runs: ``--base-dir``, ``--weights-dir``, ``--prompt-file``,
    ``--device``, ``--dtype``, ``--seed`` (``eval`` and ``tune-composite``)."""
    parser.add_argument("--base-dir", required=True, help="the base release folder (Wan2.2-TI2V-5B-Diffusers layout)")
    parser.add_argument("--weights-dir", required=True, help="the weights folder (train or distill output)")
    parser.add_argument("--prompt-file", required=True, help="the prompt embedding (encode-prompt output)")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--seed", type=int, default=0, help="sampler noise seed of every clip")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rynn-teleop world-model eval``."""
    parser.add_argument("dataset", help="dataset folder (rynn-teleop world-model dataset ... --out DIR)")
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, help="output folder: metrics.json, PNG plots, side_by_side.mp4")
    parser.add_argument("--teacher-weights-dir", default=None,
                        help="a second weights folder (e.g. the stage-1 teacher), run through the same streaming "
                             "engine")
    parser.add_argument("--split", default="val", choices=SPLITS, help="clips to score (default: val, held out)")
    parser.add_argument("--preset", default=None, help="model size (default: the dataset's)")
    parser.add_argument("--lpips-backbone", default=None, metavar="PATH",
                        help="AlexNet ImageNet weights (torchvision's alexnet-owt-7be5be79.pth); without it LPIPS "
                             "is not measured")
    parser.add_argument("--max-clips", type=int, default=None, help="score only the first N clips")
    parser.add_argument("--no-render", action="store_true", help="do not score the render backend")
    parser.add_argument("--no-reconstruction", action="store_true",
                        help="do not score the base VAE's round trip of the true frames (the ceiling)")
    defaults = CompositeSettings()
    parser.add_argument("--composite", action="store_true",
                        help="composite the student, teacher and reconstruction over frame 0 (or the render "
                             "frames: --composite-reference), as the diffusion backend serves them with "
                             "composite: true")
    parser.add_argument("--composite-low", type=float, default=defaults.low, metavar="LEVELS",
                        help=f"change [8-bit levels] below which a pixel is frame 0's (default {defaults.low})")
    parser.add_argument("--composite-high", type=float, default=defaults.high, metavar="LEVELS",
                        help=f"change above which a pixel is the generated one (default {defaults.high})")
    parser.add_argument("--composite-blur-px", type=float, default=defaults.blur_px, metavar="PX",
                        help=f"Gaussian sigma smoothing the change (default {defaults.blur_px})")
    parser.add_argument("--composite-reach-px", type=float, default=defaults.reach_px, metavar="PX",
                        help="farther than this from the robot's skeleton sweep, frame 0's pixel (default "
                             f"{defaults.reach_px}; 0: no gate)")
    parser.add_argument("--composite-reference", choices=REFERENCES, default=defaults.reference,
                        help="composite over frame 0 (anchor) or the render backend's frames (render; default "
                             f"{defaults.reference})")


def format_table(result: dict[str, Any]) -> str:
    """The means of :func:`evaluate`'s result as a text table, one row per model run."""
    def cell(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    rows = [f"{'model':<14} {'PSNR [dB]':>10} {'SSIM':>7} {'LPIPS':>7} {'hand PSNR [dB]':>15} {'hand shift [px]':>16} "
            f"{'<= 3 px':>8}"]
    for name, m in result["models"].items():
        rows.append(f"{name:<14} {cell(m['psnr'], 2):>10} {cell(m['ssim'], 4):>7} {cell(m['lpips'], 4):>7} "
                    f"{cell(m['hand_psnr'], 2):>15} {cell(m['hand_shift_px'], 2):>16} "
                    f"{cell(m['hand_within_3px'], 3):>8}")
    if result["objects"]["measured"]:
        rows.append(f"{'objects':<14} {'PSNR before':>12} {'PSNR after':>11} {'SSIM before':>12} {'SSIM after':>11} "
                    f"{'PSNR moving':>12} {'SSIM moving':>12}")
        for name, m in result["models"].items():
            rows.append(f"{name:<14} {cell(m['object_psnr_before'], 2):>12} {cell(m['object_psnr_after'], 2):>11} "
                        f"{cell(m['object_ssim_before'], 4):>12} {cell(m['object_ssim_after'], 4):>11} "
                        f"{cell(m['object_psnr_moving'], 2):>12} {cell(m['object_ssim_moving'], 4):>12}")
    rows.append(f"held-out frames: {result['held_out_frames']} in {len(result['clips'])} clips "
                f"(split {result['inputs']['split']})")
    if not result["lpips"]["measured"]:
        rows.append(f"LPIPS: {result['lpips']['reason']}")
    return "\n".join(rows)


def run_cli(args: argparse.Namespace) -> int:
    """Run :func:`evaluate` from parsed :func:`add_arguments`; print the table and the JSON's path."""
    from tqdm import tqdm

    composite = CompositeSettings(args.composite_low, args.composite_high, args.composite_blur_px,
                                  args.composite_reach_px, args.composite_reference)
    result = evaluate(args.dataset, args.out, base_dir=args.base_dir, weights_dir=args.weights_dir,
                      prompt_file=args.prompt_file, preset=args.preset, split=args.split,
                      teacher_weights_dir=args.teacher_weights_dir, device=args.device, dtype=args.dtype,
                      seed=args.seed, lpips_backbone=args.lpips_backbone, max_clips=args.max_clips,
                      render=not args.no_render, reconstruction=not args.no_reconstruction,
                      composite=composite if args.composite else None,
                      progress=lambda clips: tqdm(clips, desc="eval", unit="clip", disable=None))
    print(format_table(result))
    print(Path(args.out) / METRICS_FILE)
    return 0
