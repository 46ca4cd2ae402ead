"""Choosing a trained model's compositing settings on training clips (``rynn-teleop world-model tune-composite``).

Reference compositing (:mod:`~rynn_teleop.world_model.diffusion.composite`) has four settings (``low``, ``high``,
``blur_px``, ``reach_px``) whose best values depend on the VAE and the model: runs of the same recipe have chosen
different ones (docs: benchmarks, world model on twin episodes). This tool chooses them for one model, on clips of
the dataset's ``train`` split only, so that the held-out clips the evaluation scores play no part in the choice.

Steps:

1. ``decode``: every ``every``-th training clip, its frames 1..T-1 generated as the backend serves them (the
   serving loop of :func:`~.evaluate.stream`) without compositing, beside the static decode of its frame 0
   (:func:`~rynn_teleop.world_model.diffusion.composite.static_video`, which the engine's block-wise static
   decode equals), its condition images' skeleton sweep from frame 1 on, the ``render`` backend's frames and the
   clip's own frames; with the ``render`` reference also the static decode of the render backend's frames (frame 0
   first, as the engine streams them);
2. ``score``: each candidate of ``grid`` composited over its reference (frame 0, or the render backend's frames
   with ``reference`` ``render``: every candidate takes the run's reference), scored against the truth: whole-frame PSNR
   [dB] and SSIM, and the moved objects' box PSNR [dB] from their first move on (``object_psnr_after``) and
   from a first move inside the clip on (``object_psnr_moving``), as :mod:`~.evaluate` defines them, each the
   mean over the frames; the render backend the same way;
3. ``choose``: the candidate with the highest SSIM among those whose ``object_psnr_after`` and
   ``object_psnr_moving`` are both at least ``object_margin_db`` over the render backend's on the same frames
   (the interaction goal's margin; ``object_psnr_moving`` only where the clips have such frames); when none
   keeps both, the highest SSIM among those keeping ``object_psnr_after``'s; when none keeps that, the one with
   the highest ``object_psnr_after``.

Output: ``tune_composite.json`` in ``out_dir`` (the chosen settings, the criterion, every candidate's scores,
the render backend's and the clips used), and the chosen settings as ``diffusion`` backend parameters.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rynn_teleop.core.robot_model import RobotModel
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.conditioning import DEFAULT_CAMERA_FRAME
from rynn_teleop.world_model.diffusion.composite import REFERENCES, CompositeSettings

from .clips import ClipDataset, read_clip
from .evaluate import (
    _diffusion,
    _joint_order,
    add_model_arguments,
    dataset_intrinsics,
    object_scores,
    served_sweep,
    stream,
)
from .metrics import psnr, ssim
from .objects import read_clip_objects

TUNE_FORMAT = "rynn_teleop.world_model.tune_composite/1"
TUNE_FILE = "tune_composite.json"
#: (low, high) [8-bit levels] pairs tried, each with every blur [px] and reach [px] below
THRESHOLDS = ((3.0, 12.0), (6.0, 20.0), (9.0, 30.0), (14.0, 45.0), (20.0, 60.0))
BLURS_PX = (3.0, 7.0, 10.0)
REACHES_PX = (0.0, 10.0, 20.0)
#: the default grid: 45 candidates
GRID: tuple[CompositeSettings, ...] = tuple(CompositeSettings(low, high, blur, reach) for (low, high), blur, reach
                                            in itertools.product(THRESHOLDS, BLURS_PX, REACHES_PX))
OBJECT_MARGIN_DB = 1.0  # [dB] the interaction goal's margin of object_psnr_after over the render backend


class DecodedClip(NamedTuple):
    """One clip's inputs to :func:`score` (step ``decode``); frames are (T - 1, H, W, 3) uint8 for 1..T-1."""

    file: str
    truth: np.ndarray
    decoded: np.ndarray  # the model's frames, not composited
    static: np.ndarray  # the static decode of frame 0
    reference: np.ndarray  # (H, W, 3) frame 0
    swept: np.ndarray  # (T - 1, H, W) bool, the skeleton's sweep from frame 1 on
    render: np.ndarray
    objects: Any  # ClipObjects of frames 1..T-1, or None
    resting_at_anchor: np.ndarray | None
    static_render: np.ndarray | None = None  # the static decode of the render frames (``render`` reference only)


class Scores(NamedTuple):
    """Means over the scored frames (:func:`score`): PSNR [dB], SSIM, box PSNR after the first move and after a
    first move inside the clip [dB] (None: no such frames)."""

    psnr: float
    ssim: float
    object_psnr_after: float | None
    object_psnr_moving: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {k: (None if v is None else round(float(v), 4)) for k, v in self._asdict().items()}


def decode(dataset_dir: str | os.PathLike, *, base_dir, weights_dir, prompt_file, every: int = 4,
           device: str = "cpu", dtype: str = "float32", seed: int = 0, reference: str = "anchor",
           log: Callable[[str], None] | None = None) -> list[DecodedClip]:
    """Step ``decode`` (see the module docstring) on every ``every``-th clip of the ``train`` split; with
    ``reference`` ``render`` each clip also carries the static decode of its render frames.

    Raises:
        DatasetError: no dataset or no training clips.
        ConfigurationError: ``every`` < 1; a model that does not load (see :func:`~.evaluate.evaluate`).
    """
    import torch

    from rynn_teleop.world_model.diffusion import composite as compositing
    from rynn_teleop.world_model.diffusion.vae import pixels_to_rgb, rgb_to_pixels
    from rynn_teleop.world_model.render import RenderGenerator

    if every < 1:
        raise ConfigurationError(f"tune-composite: every must be at least 1; got {every}")
    dataset = ClipDataset(dataset_dir, "train")
    info = dataset.info
    robot = RobotModel.default()
    columns = _joint_order(info, robot)
    intrinsics, _ = dataset_intrinsics(info)
    camera_frame = str(info.condition.get("camera_frame", DEFAULT_CAMERA_FRAME))
    render = RenderGenerator(robot, intrinsics, width=info.width, height=info.height, camera_frame=camera_frame)
    out: list[DecodedClip] = []
    with _diffusion(info.preset, base_dir, weights_dir, prompt_file, device, dtype, seed, "weights_dir") as model:
        vae = model.engine.model.vae
        for file in dataset.files[::every]:
            clip = read_clip(dataset.root / file)
            actions = clip.actions[:, columns].astype(np.float64)
            model.engine.generator.manual_seed(seed)
            decoded = stream(model, clip, actions)
            rendered = stream(render, clip, actions)
            with torch.no_grad():
                anchor = rgb_to_pixels(clip.frames[:1], device=vae.device)
                static = np.stack(pixels_to_rgb(compositing.static_video(vae, anchor, clip.length))[1:])
                static_render = None
                if reference == "render":
                    painted = rgb_to_pixels(np.concatenate([clip.frames[:1], rendered]), device=vae.device)
                    static_render = np.stack(pixels_to_rgb(compositing.static_video(vae, painted, clip.length))[1:])
            objects = read_clip_objects(dataset.root / file)
            out.append(DecodedClip(
                file, clip.frames[1:], decoded, static, clip.frames[0],
                served_sweep(clip)[0, 0, 1:].numpy(), rendered,
                None if objects is None else objects.slice(1, clip.length),
                None if objects is None else ~objects.moved[0], static_render))
            if log:
                log(f"tune-composite: decoded {file} ({len(out)} clips)")
    return out


def composited(clip: DecodedClip, settings: CompositeSettings) -> np.ndarray:
    """``clip``'s model frames composited over its frame 0 (or its render frames: ``settings.reference``
    ``render``, which needs :func:`decode`'s ``reference`` ``render``) under ``settings``, (T - 1, H, W, 3) uint8.

    Raises:
        ValueError: the ``render`` reference on a clip decoded without its static decode.
    """
    import torch

    from rynn_teleop.world_model.diffusion import composite as compositing
    from rynn_teleop.world_model.diffusion.vae import pixels_to_rgb, rgb_to_pixels

    swept = torch.from_numpy(clip.swept)[None, None]
    if settings.reference == "render":
        if clip.static_render is None:
            raise ValueError(f"{clip.file}: decoded without the render reference's static decode")
        static, reference = rgb_to_pixels(clip.static_render), rgb_to_pixels(clip.render)
    else:
        static, reference = rgb_to_pixels(clip.static), rgb_to_pixels([clip.reference])
    frames = compositing.composite(rgb_to_pixels(clip.decoded), static, reference, settings, swept)
    return np.stack(pixels_to_rgb(frames))


def score(clips: Sequence[DecodedClip], frames_of: Callable[[DecodedClip], np.ndarray]) -> Scores:
    """Step ``score``: the means over ``clips``' frames of ``frames_of(clip)`` against the truth."""
    p, s, after, moving = [], [], [], []
    for clip in clips:
        frames = frames_of(clip)
        p.append(psnr(frames, clip.truth))
        s.append(ssim(frames, clip.truth))
        if clip.objects is not None:
            scores = object_scores(frames, clip.truth, clip.objects.boxes, clip.objects.moved, clip.objects.movers,
                                   clip.resting_at_anchor)
            after.append(scores.psnr_after[np.isfinite(scores.psnr_after)])
            moving.append(scores.psnr_moving[np.isfinite(scores.psnr_moving)])

    def mean(values: list[np.ndarray]) -> float | None:
        joined = np.concatenate(values) if values else np.empty(0)
        return float(joined.mean()) if len(joined) else None

    return Scores(float(np.concatenate(p).mean()), float(np.concatenate(s).mean()), mean(after), mean(moving))


def choose(candidates: Sequence[tuple[CompositeSettings, Scores]], render: Scores,
           object_margin_db: float = OBJECT_MARGIN_DB) -> tuple[CompositeSettings, str]:
    """Step ``choose`` (see the module docstring): the chosen settings and why.

    Raises:
        ValueError: no candidates.
    """
    if not candidates:
        raise ValueError("tune-composite: no candidates to choose from")

    def keeps(value: float | None, reference: float | None) -> bool:
        return value is not None and reference is not None and value >= reference + object_margin_db

    if render.object_psnr_after is not None:
        keeping = [c for c in candidates if keeps(c[1].object_psnr_after, render.object_psnr_after)]
        both = [c for c in keeping if keeps(c[1].object_psnr_moving, render.object_psnr_moving)]
        if both:
            best = max(both, key=lambda c: c[1].ssim)
            return best[0], (f"highest SSIM of the {len(both)} candidates whose object_psnr_after and "
                             f"object_psnr_moving are at least {object_margin_db:g} dB over the render backend's")
        if keeping:
            best = max(keeping, key=lambda c: c[1].ssim)
            return best[0], (f"highest SSIM of the {len(keeping)} candidates whose object_psnr_after is at least "
                             f"{object_margin_db:g} dB over the render backend's")
        best = max((c for c in candidates if c[1].object_psnr_after is not None),
                   key=lambda c: c[1].object_psnr_after, default=None)
        if best is not None:
            return best[0], (f"no candidate keeps object_psnr_after {object_margin_db:g} dB over the render "
                             "backend's: the highest object_psnr_after")
    best = max(candidates, key=lambda c: c[1].ssim)
    return best[0], "no moved objects in the clips: the highest SSIM"


def tune_composite(dataset_dir: str | os.PathLike, out_dir: str | os.PathLike, *, base_dir, weights_dir,
                   prompt_file, every: int = 4, grid: Sequence[CompositeSettings] = GRID,
                   object_margin_db: float = OBJECT_MARGIN_DB, device: str = "cpu", dtype: str = "float32",
                   seed: int = 0, reference: str = "anchor",
                   log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Run the three steps (see the module docstring); write and return ``tune_composite.json``'s content.
    ``reference`` (``anchor`` or ``render``) replaces every candidate's.

    Returns:
        ``format``, ``chosen`` (a :class:`CompositeSettings` as a dict), ``backend_settings`` (the ``diffusion``
        backend's ``composite*`` parameters for it), ``criterion`` (why it was chosen), ``candidates`` (each
        candidate's settings and :class:`Scores`), ``render`` and ``baseline`` (frame 0 repeated) scores,
        ``clips`` (the files used), ``frames`` (scored), ``inputs``.

    Raises:
        ConfigurationError: an empty grid; see :func:`decode`.
    """
    if not grid:
        raise ConfigurationError("tune-composite: the grid of candidates is empty")
    grid = [dataclasses.replace(s, reference=reference) for s in grid]  # validates the reference
    clips = decode(dataset_dir, base_dir=base_dir, weights_dir=weights_dir, prompt_file=prompt_file, every=every,
                   device=device, dtype=dtype, seed=seed, reference=reference, log=log)
    render = score(clips, lambda c: c.render)
    baseline = score(clips, lambda c: np.repeat(c.reference[None], len(c.truth), axis=0))
    candidates = []
    for settings in grid:
        candidates.append((settings, score(clips, lambda c, s=settings: composited(c, s))))
        if log:
            log(f"tune-composite: {settings}: {candidates[-1][1]}")
    chosen, criterion = choose(candidates, render, object_margin_db)
    result = {
        "format": TUNE_FORMAT, "chosen": dataclasses.asdict(chosen),
        "backend_settings": chosen.backend_settings(), "criterion": criterion,
        "candidates": [{**dataclasses.asdict(s), **sc.to_json()} for s, sc in candidates],
        "render": render.to_json(), "baseline": baseline.to_json(),
        "clips": [c.file for c in clips], "frames": int(sum(len(c.truth) for c in clips)),
        "inputs": {"dataset": str(Path(dataset_dir).resolve()), "split": "train", "every": every,
                   "base_dir": str(base_dir), "weights_dir": str(weights_dir), "prompt_file": str(prompt_file),
                   "object_margin_db": object_margin_db, "device": device, "dtype": dtype, "seed": seed,
                   "reference": reference},
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / TUNE_FILE).write_text(json.dumps(result, indent=1) + "\n")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``rynn-teleop world-model tune-composite DATASET --base-dir B --weights-dir W --prompt-file P --out DIR``."""
    parser.add_argument("dataset", help="the dataset folder the model was trained on (its train split is used)")
    parser.add_argument("--out", required=True, help="folder for tune_composite.json")
    add_model_arguments(parser)
    parser.add_argument("--every", type=int, default=4, help="use every N-th training clip (default 4)")
    parser.add_argument("--object-margin-db", type=float, default=OBJECT_MARGIN_DB,
                        help=f"object_psnr_after margin over render a candidate must keep [dB] (default "
                             f"{OBJECT_MARGIN_DB:g})")
    parser.add_argument("--composite-reference", choices=REFERENCES, default="anchor",
                        help="composite over the anchor frame or the render backend's frames (the diffusion "
                             "backend's composite_reference; default anchor)")


def run_cli(args: argparse.Namespace) -> int:
    """Tune and print the chosen settings as the diffusion backend's parameters (and the JSON's path)."""
    result = tune_composite(args.dataset, args.out, base_dir=args.base_dir, weights_dir=args.weights_dir,
                            prompt_file=args.prompt_file, every=args.every, grid=GRID,
                            object_margin_db=args.object_margin_db, reference=args.composite_reference,
                            device=args.device, dtype=args.dtype, seed=args.seed)
    print(f"chosen ({result['criterion']}): " + json.dumps(result["backend_settings"]))
    print(Path(args.out) / TUNE_FILE)
    return 0
