"""The ``diffusion`` world-model backend: :class:`~rynn_teleop.world_model.generator.Generator`
over the :class:`~.engine.StreamEngine`.

The network sees the action only through its condition image (the depth-aware
skeleton drawn from the action), so :meth:`DiffusionGenerator.step` needs the
condition; it reads the action itself only to composite over the ``render``
reference (``composite_reference: render``: the robot's primitives painted at
the action over the anchor, :mod:`.composite`). Condition images are buffered
(resized to the preset's size) until a block is complete; that block's frames
are then returned at once (resized to the output size), oldest first, one per
buffered action.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from rynn_teleop.core.params import Param
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.generator import WORLD_MODEL_BACKENDS, Generator, WorldModelContext, as_rgb

from .composite import MAX_BLUR_PX, MAX_LEVEL, MAX_REACH_PX, REFERENCES, CompositeSettings
from .presets import PRESETS, get_preset

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
_COMPOSITE = CompositeSettings()  # the compositing defaults


def _device_problem(device: str) -> str | None:
    kind, colon, index = device.partition(":")
    ok = device == "cpu" or (kind == "cuda" and (not colon or index.isdigit()))
    return None if ok else "is not cpu, cuda or cuda:N"


@WORLD_MODEL_BACKENDS.register
class DiffusionGenerator(Generator):
    """The learned world model as a backend.

    Args:
        preset: preset name ("tiny", "paper").
        base_dir: the base release folder (the layout of ``Wan2.2-TI2V-5B-Diffusers``: ``vae/``,
            ``transformer/``) whose configs are the preset's (required).
        weights_dir: the trainer's folder (control branch and fine-tuned DiT, ``manifest.json``); None or "":
            the base model with a zero control branch (the actions have no effect).
        prompt_file: the fixed prompt's embedding (``rynn-teleop world-model encode-prompt``) (required).
        device: torch device ("cpu", "cuda", ...).
        dtype: the DiT's dtype: "float32", "bfloat16" or "float16".
        vae_dtype: the VAE's dtype (same choices).
        seed: sampler noise seed.
        threads: torch's intra-op CPU threads, set for the whole process (torch has one pool per process); 0
            (the keyword's default, for library use): leave torch's as it is. The node's parameter defaults to 1.
        chunk_frames: frames per chunk, anchor included (re-anchoring period); default the preset's
            (81). Must be 1 + a whole number of blocks.
        composite, composite_low, composite_high, composite_blur_px, composite_reach_px, composite_reference:
            reference compositing (:mod:`.composite`; off by default).
        robot, intrinsics, camera_frame: the robot and the camera the ``render`` reference paints through
            (default: :meth:`RobotModel.default`, the D435-like intrinsics of the preset's size, the head
            camera's optical frame); read only with ``composite_reference`` ``render``.
        width, height: output frame size [px]; default the preset's.

    Raises:
        ConfigurationError: unknown preset or a ``chunk_frames`` that is not 1 + whole blocks; compositing
            thresholds with ``composite_low >= composite_high``; a missing
            base folder or prompt file, or one that does not fit the preset (the message names the folder or
            file and the first differences).
    """

    name = "diffusion"
    uses_real_frames = True  # observe() frames re-anchor the stream
    SETTINGS = (
        Param("preset", str, "tiny", "model size", choices=tuple(PRESETS)),
        Param("base_dir", str, "", "the base model folder in the layout of the public Wan2.2-TI2V-5B-Diffusers "
              "release (vae/, transformer/), configs matching the preset (required)"),
        Param("weights_dir", str, "", "the trainer's weights folder (control branch, fine-tuned DiT, "
              "manifest.json); empty: the base model, which ignores the actions"),
        Param("prompt_file", str, "", "the fixed prompt's embedding, written by rynn-teleop world-model "
              "encode-prompt (required)"),
        Param("device", str, "cpu", "torch device (cpu, cuda, cuda:1...)", check=_device_problem),
        Param("dtype", str, "float32", "compute dtype of the DiT (bfloat16 on a GPU)", choices=DTYPES),
        Param("vae_dtype", str, "float32", "compute dtype of the VAE (float32, as diffusers' Wan2.2 pipelines "
              "run it)", choices=DTYPES),
        Param("seed", int, 0, "noise seed", min=0, max=2**31 - 1),
        Param("threads", int, 1, "torch's CPU threads in the node's process (intra-op; the world model runs in "
              "its own process); 0: torch's default, one per core. One leaves the other cores to the operator "
              "pipeline: on 2 cores torch's default put gaps in the arm commands (docs: benchmarks, world model on "
              "twin episodes); raise it where cores are spare and the model runs on the CPU", "threads", min=0,
              max=1024),
        Param("composite", bool, False, "composite the generated frames over a reference (composite_reference): "
              "pixels the model leaves as the VAE draws the reference come from the reference itself (docs: "
              "concepts, world model, reference compositing)"),
        Param("composite_low", float, _COMPOSITE.low, "change below which a pixel is the reference's (the "
              "generated frame against the VAE's drawing of the reference, channel mean, smoothed); must be below "
              "composite_high", "8-bit levels", min=0.0, max=MAX_LEVEL),
        Param("composite_high", float, _COMPOSITE.high, "change above which a pixel is the generated one (linear "
              "blend between low and high)", "8-bit levels", min=0.0, max=MAX_LEVEL),
        Param("composite_blur_px", float, _COMPOSITE.blur_px, "Gaussian sigma smoothing the change before the "
              "blend", "px", min=0.0, max=MAX_BLUR_PX),
        Param("composite_reach_px", float, _COMPOSITE.reach_px, "farther than this from everywhere the robot's "
              "skeleton has been since the anchor, the reference's pixel (0: no gate)", "px", min=0.0,
              max=MAX_REACH_PX),
        Param("composite_reference", str, _COMPOSITE.reference, "what the generated frames are composited over: "
              "anchor (the anchor frame) or render (per frame, the robot's primitives painted at the action over "
              "the anchor, as the render backend draws it: the robot sharp where the model draws it the same; "
              "docs: concepts, world model, reference compositing)", choices=REFERENCES),
        Param("chunk_frames", int, 81, "frames per chunk; each chunk re-anchors on the newest real frame (else "
              "its own last frame)", "frames", min=5, max=100000),
    )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], context: WorldModelContext) -> DiffusionGenerator:
        """The model on the node's camera size (loads the model: imports torch)."""
        return cls(**settings, width=context.intrinsics.width, height=context.intrinsics.height,
                   robot=context.robot, intrinsics=context.intrinsics)

    def __init__(self, preset: str, base_dir: str | os.PathLike | None, weights_dir: str | os.PathLike | None,
                 prompt_file: str | os.PathLike | None, device: str = "cpu", dtype: str | torch.dtype = "float32",
                 vae_dtype: str | torch.dtype = "float32", seed: int = 0, chunk_frames: int | None = None,
                 width: int | None = None, height: int | None = None, composite: bool = False,
                 composite_low: float = _COMPOSITE.low, composite_high: float = _COMPOSITE.high,
                 composite_blur_px: float = _COMPOSITE.blur_px, composite_reach_px: float = _COMPOSITE.reach_px,
                 composite_reference: str = _COMPOSITE.reference, threads: int = 0, robot: Any = None,
                 intrinsics: Any = None, camera_frame: str | None = None) -> None:
        from .engine import StreamEngine  # torch: only when a backend is built
        from .model import load_model, resolve_dtype

        super().__init__()
        config = get_preset(preset)
        if chunk_frames is not None:
            config = dataclasses.replace(config, chunk_frames=chunk_frames)  # validated by the preset
        # checked even when off
        settings = CompositeSettings(composite_low, composite_high, composite_blur_px, composite_reach_px,
                                     composite_reference)
        resolved = resolve_dtype(dtype)
        if threads:
            import torch

            torch.set_num_threads(threads)
        for name, value in (("base_dir", base_dir), ("prompt_file", prompt_file)):
            if not value:
                raise ConfigurationError(f"diffusion backend: {name} is required (see the README, World model)")
        painter = None
        # the render reference's action check (the renderer's own), run before an action is buffered
        self._joint_vector: Callable[[np.ndarray], np.ndarray] | None = None
        if composite and settings.reference == "render":
            from rynn_teleop.core.camera_view import DEFAULT_CAMERA_FRAME
            from rynn_teleop.world_model.render import RenderGenerator

            renderer = RenderGenerator(robot, intrinsics, width=config.width, height=config.height,
                                       camera_frame=camera_frame or DEFAULT_CAMERA_FRAME)
            self._joint_vector = renderer.painter.joint_vector

            def painter(anchor: np.ndarray, action: np.ndarray) -> np.ndarray:
                return renderer.render(action, anchor)
        model = load_model(config, base_dir, weights_dir, prompt_file, device, resolved)
        self.engine = StreamEngine(model, device=device, dtype=resolved, seed=seed, timer=self.timer,
                                   vae_dtype=vae_dtype, composite=settings if composite else None, painter=painter)
        self.preset = config
        self.width = width if width is not None else config.width
        self.height = height if height is not None else config.height
        self._conditions: list[np.ndarray] = []
        self._actions: list[np.ndarray] = []  # beside the conditions (the render reference's)

    @property
    def pending(self) -> int:
        return len(self._conditions)

    def reset(self, reference: np.ndarray) -> None:
        """Start a stream from ``reference``; actions still pending are dropped."""
        self._conditions.clear()
        self._actions.clear()
        self.engine.reset(as_rgb(reference, self.preset.width, self.preset.height))

    def step(self, action: np.ndarray, condition: np.ndarray | None = None) -> list[np.ndarray]:
        """Buffer ``condition`` (and ``action``, read only by the ``render`` reference); return a block's frames
        when complete.

        Raises:
            ValueError: no condition image (this backend cannot draw one); with the ``render`` reference, an
                action that is not a finite joint vector of the robot's size (nothing is buffered then).
            RuntimeError: :meth:`reset` was never called.
        """
        if condition is None:
            raise ValueError("the diffusion backend needs the condition (skeleton) image of every action")
        if not self.engine.started:
            raise RuntimeError("no stream: call reset(reference) first")
        # checked before anything is buffered, so that the two lists stay in step
        q = self._joint_vector(action) if self._joint_vector else np.array(action, dtype=np.float64, copy=True)
        self._conditions.append(as_rgb(condition, self.preset.width, self.preset.height))
        self._actions.append(q)
        if len(self._conditions) < self.engine.frames_per_block:
            return []
        n = self.engine.frames_per_block
        block, self._conditions = self._conditions[:n], self._conditions[n:]
        actions, self._actions = self._actions[:n], self._actions[n:]
        try:
            frames = self.engine.generate_block(block, actions)
        except BaseException:
            self._conditions = block + self._conditions  # kept: the next step retries (the engine re-anchors first)
            self._actions = actions + self._actions
            raise
        return [as_rgb(frame, self.width, self.height) for frame in frames]

    def observe(self, frame: np.ndarray) -> None:
        self.engine.observe(as_rgb(frame, self.preset.width, self.preset.height))

    def reanchor(self, frame: np.ndarray) -> None:
        """Re-anchor on ``frame`` now; pending actions keep their place and continue from it."""
        self.engine.reanchor(as_rgb(frame, self.preset.width, self.preset.height))

    def close(self) -> None:
        """Free the model and cache; the generator cannot be used afterwards."""
        engine = self.__dict__.pop("engine", None)
        if engine is not None and engine.device.type == "cuda":
            import torch

            del engine
            torch.cuda.empty_cache()
