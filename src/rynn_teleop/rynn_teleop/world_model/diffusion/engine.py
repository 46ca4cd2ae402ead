"""The streaming engine: block-wise generation with a fixed cache, a commit pass and re-anchoring.

One stream, as in the paper, on diffusers' Wan2.2 model (:class:`~.model.WanWorldModel`):

1. :meth:`StreamEngine.reset` encodes the reference frame alone (1 frame -> 1 latent frame, the anchor) and
   commits it at timestep 0 at latent position 0: it becomes the cache's sink. The stream follows the causal
   VAE's 1 + 4k rule with 4 * ``block_frames`` frames per block.
2. :meth:`StreamEngine.generate_block` takes the block's condition (skeleton) frames and runs the stages
   ``encode_condition`` (streaming VAE encoder), ``denoise`` (the 4-step flow sampler, each step one read
   pass of the DiT against the cache), ``commit`` (one pass on the clean block at timestep 0 writes its
   keys/values into the cache) and ``decode`` (streaming VAE decoder, which keeps its causal cache).
3. Every ``chunk_frames`` frames (81: the anchor plus 80 generated ones) it re-anchors (stage ``reanchor``):
   cache, VAE streams and positions restart from the newest real frame given to :meth:`observe` since the
   last anchoring, else from its own last generated frame as returned (uint8).
4. With ``composite`` settings (:mod:`.composite`), each block's decoded frames are composited over the anchor
   frame (stage ``composite``: the static decode and the blend): a second pair of VAE
   streams encodes and decodes the anchor repeated (the static decode), and pixels the model left unchanged come
   from the anchor itself. Once :data:`STATIC_SETTLED_BLOCKS` consecutive static blocks each differ from the one
   before by less than :data:`STATIC_TOLERANCE` everywhere, the last is reused until the next anchoring.
   With a ``reach_px``, the sweep of the robot's skeleton (the anchor's condition image and every block's since)
   gates the blend: farther than ``reach_px`` from it every pixel is the anchor's. With the ``render`` reference
   the block's actions are painted over the anchor (the engine's ``painter``, the render backend's drawing) and
   the static decode is those frames' own (never reused): the model's frames are composited over them.

Shapes are static (the cache is allocated once); per-stage wall times go to a
:class:`~rynn_teleop.world_model.generator.StageTimer` (on CUDA each stage ends with a synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from rynn_teleop.world_model.generator import StageTimer

from .composite import LEVEL, CompositeSettings, composite, skeleton_mask, sweep
from .model import WanWorldModel, resolve_dtype
from .sampler import FlowSampler
from .vae import pixels_to_rgb, rgb_to_pixels

STAGES = ("encode_condition", "denoise", "commit", "decode", "composite", "reanchor")

#: a static block closer than this to the one before [pixel units: a tenth of an 8-bit level] is quiet
STATIC_TOLERANCE = 0.1 * LEVEL
#: quiet static blocks in a row after which the static decode is taken as settled and reused
STATIC_SETTLED_BLOCKS = 2


class StreamEngine:
    """Streaming generation with one model (see the module docstring).

    Args:
        model: the world model with its prompt; moved to ``device``/``dtype``, eval mode.
        device: "cpu", "cuda", "cuda:1", ...
        dtype: the DiT's torch dtype or its name ("float32", "bfloat16", "float16").
        vae_dtype: the VAE's dtype (float32 by default, as diffusers' Wan2.2 pipelines run it); the
            sampler's latents and noise are float32 too.
        seed: seed of the sampler's noise (same seed and inputs -> same frames).
        timer: where the stage times go (a new one if None).
        composite: reference compositing (:mod:`.composite`); None: the decoded frames as they are.
        painter: with the ``render`` reference (required then): ``painter(anchor, action)``, the anchor (H, W, 3)
            uint8 at the preset's size with the robot painted at ``action`` (54,) [rad], same shape and type
            (:meth:`~rynn_teleop.world_model.render.RenderGenerator.render`).

    Raises:
        ValueError: the ``render`` reference without a painter.
    """

    def __init__(self, model: WanWorldModel, device: torch.device | str = "cpu",
                 dtype: torch.dtype | str = torch.float32, seed: int = 0, timer: StageTimer | None = None,
                 vae_dtype: torch.dtype | str = torch.float32, composite: CompositeSettings | None = None,
                 painter: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> None:
        if composite is not None and composite.reference == "render" and painter is None:
            raise ValueError("compositing over the render reference needs a painter (the robot's renderer)")
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype)
        self.vae_dtype = resolve_dtype(vae_dtype)
        self.model = model.to(self.device, self.dtype, self.vae_dtype)
        self.preset = model.preset
        self.timer = timer if timer is not None else StageTimer()
        self.sampler = FlowSampler(self.preset.timesteps, self.preset.shift)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.model.dit.set_prompt(self.model.prompt_embeds)
        self.cache = self.model.dit.new_cache(self.preset.window_frames, self.preset.block_frames,
                                              self.preset.tokens_per_frame, sink_frames=self.preset.sink_frames)
        self._condition_stream = self.model.vae.new_stream()
        self._decoder_stream = self.model.vae.new_stream()
        self._composite = composite
        self._painter = painter
        self._static_encoder = self.model.vae.new_stream()  # the reference (anchor repeated, or painted) frames
        self._static_decoder = self.model.vae.new_stream()
        self._static_block: torch.Tensor | None = None  # the newest static block; reused once converged
        self._static_quiet = 0  # consecutive quiet static blocks (see STATIC_SETTLED_BLOCKS)
        self._swept: torch.Tensor | None = None  # (1, 1, 1, H, W) bool: the robot's sweep since the anchor (reach)
        self._reference: torch.Tensor | None = None  # (1, 3, 1, H, W) the anchor frame, float32 in [-1, 1]
        self._anchor_rgb: np.ndarray | None = None  # (H, W, 3) uint8, the anchor frame (the painter's canvas)
        self._position = 0  # absolute latent-frame position of the next committed frame (RoPE)
        self._frames_since_anchor = 0  # generated video frames since the anchor (the anchor not counted)
        self._last_frame: torch.Tensor | None = None  # (1, 3, 1, H, W), the newest frame as returned (uint8 values)
        self._last_condition: torch.Tensor | None = None  # (1, 3, 1, H, W), the newest condition frame
        self._observed: np.ndarray | None = None  # newest real frame since the last anchoring
        self._broken = False  # a block failed part-way: cache and VAE streams are inconsistent until re-anchored

    # ---- public API ---------------------------------------------------------
    @property
    def composite(self) -> CompositeSettings | None:
        """The reference compositing settings, fixed at construction (None: off)."""
        return self._composite

    @property
    def static_settled(self) -> bool:
        """Whether the static decode has settled and is reused until the next anchoring (compositing only)."""
        return self._static_quiet >= STATIC_SETTLED_BLOCKS

    @property
    def frames_per_block(self) -> int:
        """Condition frames per block = video frames generated per block (4 per latent frame)."""
        return self.preset.frames_per_block

    @property
    def frames_since_anchor(self) -> int:
        """Video frames generated since the last (re-)anchoring [frames]."""
        return self._frames_since_anchor

    @property
    def started(self) -> bool:
        return self._last_frame is not None

    def reset(self, reference: np.ndarray, condition: np.ndarray | None = None) -> None:
        """Start a stream from ``reference`` (RGB uint8 at the preset's size), the anchor.

        Args:
            condition: the condition image of the reference frame; None = a black image.
        """
        self._observed = None
        cond = self._image(condition) if condition is not None else self._black()
        with torch.no_grad(), self._stage("reanchor"):
            self._anchor(self._image(reference), cond)

    def observe(self, frame: np.ndarray) -> None:
        """Offer the newest real camera frame (RGB uint8 at the preset's size) for the next re-anchoring."""
        self._check_image(frame)
        self._observed = np.array(frame, copy=True)

    def reanchor(self, frame: np.ndarray | None = None) -> None:
        """Re-anchor now on ``frame``, else the newest observed real frame, else the last generated frame.

        Raises:
            RuntimeError: no stream was started (call :meth:`reset`).
        """
        self._require_started()
        if frame is not None:
            self._check_image(frame)
        with torch.no_grad(), self._stage("reanchor"):
            self._reanchor(frame)

    def generate_block(self, condition_frames: Sequence[np.ndarray] | np.ndarray,
                       actions: Sequence[np.ndarray] | np.ndarray | None = None) -> list[np.ndarray]:
        """The next block's frames from its condition frames.

        Args:
            condition_frames: ``frames_per_block`` RGB uint8 (H, W, 3) images at the preset's size, oldest first.
            actions: the block's (54,) joint vectors [rad], one per condition frame; read (and required) only
                when compositing over the ``render`` reference.

        Returns:
            ``frames_per_block`` generated RGB uint8 (H, W, 3) frames, oldest first.

        Raises:
            RuntimeError: no stream was started (call :meth:`reset`).
            ValueError: another number or size of condition frames; missing actions (``render`` reference).
        """
        self._require_started()
        if len(condition_frames) != self.frames_per_block:
            raise ValueError(f"a block takes {self.frames_per_block} condition frames; got {len(condition_frames)}")
        if self._painted and (actions is None or len(actions) != self.frames_per_block):
            raise ValueError(f"compositing over the render reference needs the block's {self.frames_per_block} "
                             f"actions; got {'none' if actions is None else len(actions)}")
        for frame in condition_frames:
            self._check_image(frame)
        try:
            return self._generate_block(condition_frames, actions)
        except BaseException:
            self._broken = True  # the cache or a VAE stream may hold part of the block: re-anchor before the next
            raise

    @property
    def _painted(self) -> bool:
        """Whether the frames are composited over the render reference."""
        return self._composite is not None and self._composite.reference == "render"

    def _generate_block(self, condition_frames: Sequence[np.ndarray] | np.ndarray,
                        actions: Sequence[np.ndarray] | np.ndarray | None) -> list[np.ndarray]:
        with torch.no_grad():
            if self._broken or self._frames_since_anchor >= self.preset.chunk_frames - 1:
                with self._stage("reanchor"):
                    self._reanchor(None)
            with self._stage("encode_condition"):
                condition_pixels = rgb_to_pixels(condition_frames, self.device, self.dtype)
                condition = self.model.vae.encode(condition_pixels, self._condition_stream).to(self.dtype)
            with self._stage("denoise"):
                latents = self._denoise(condition)
            with self._stage("commit"):
                self._commit(latents, condition)
            with self._stage("decode"):
                decoded = self.model.vae.decode(latents, self._decoder_stream)
            if self._composite is not None:
                with self._stage("composite"):
                    swept = sweep(skeleton_mask(condition_pixels), self._swept) if self._composite.reach_px else None
                    if self._painted:
                        reference = self._painted_reference(actions)
                        static = self._static_of(reference)
                    else:
                        reference, static = self._reference, self._static(decoded.shape[2])
                    decoded = composite(decoded, static, reference, self._composite, swept)
            frames = pixels_to_rgb(decoded)  # uint8 on the host, outside the stages (a copy of one block)
            last_frame = rgb_to_pixels(frames[-1:], self.device, self.dtype)  # as returned, in uint8
        # only once the block succeeded: a failed block leaves the re-anchoring inputs as they were
        self._last_frame, self._last_condition = last_frame, condition_pixels[:, :, -1:]
        if self._composite is not None and self._composite.reach_px:
            self._swept = swept[:, :, -1:]
        self._frames_since_anchor += self.frames_per_block
        return frames

    # ---- the stages ---------------------------------------------------------
    def _denoise(self, condition: torch.Tensor) -> torch.Tensor:
        def velocity(x: torch.Tensor, timestep: float) -> torch.Tensor:
            timesteps = torch.full(x.shape[:1] + x.shape[2:3], timestep, device=self.device)
            v = self.model.dit.forward_block(x.to(self.dtype), condition, timesteps, self.cache, self._position,
                                             commit=False)
            return v.float()

        # the sampler's latents and noise stay float32 (as diffusers' Wan pipelines keep them)
        return self.sampler.sample(velocity, condition.shape, self.generator, self.device, torch.float32
                                   ).to(self.dtype)

    def _commit(self, latents: torch.Tensor, condition: torch.Tensor) -> None:
        timesteps = torch.zeros(latents.shape[:1] + latents.shape[2:3], device=self.device)
        self.model.dit.forward_block(latents, condition, timesteps, self.cache, self._position, commit=True)
        self._position += latents.shape[2]

    def _anchor(self, frame: torch.Tensor, condition: torch.Tensor) -> None:
        """Restart cache, VAE streams and positions from ``frame`` (1, 3, 1, H, W, uint8 values in the DiT's
        dtype) and its condition."""
        self._broken = True  # until the anchoring completes: a failure part-way re-anchors before the next block
        self.model.dit.reset(self.cache)
        self._condition_stream.reset()
        self._decoder_stream.reset()
        self._position = 0
        latent = self.model.vae.encode(frame).to(self.dtype)
        condition_latent = self.model.vae.encode(condition, self._condition_stream).to(self.dtype)
        self._commit(latent, condition_latent)
        self.model.vae.decode(latent, self._decoder_stream)  # the decoder's causal past starts at the anchor
        if self._composite is not None:
            self._static_encoder.reset()
            self._static_decoder.reset()
            # exact uint8 levels in float32 (frame is in the DiT's dtype; bfloat16 is off by < half a level)
            self._reference = torch.round((frame.float() + 1.0) * 127.5) / 127.5 - 1.0
            self._anchor_rgb = pixels_to_rgb(self._reference)[0]
            self._static_block, self._static_quiet = None, 0
            self._swept = skeleton_mask(condition)  # the reach gate's sweep starts at the anchor's skeleton
            self.model.vae.decode(self.model.vae.encode(self._reference, self._static_encoder).to(self.dtype),
                                  self._static_decoder)
        self._last_frame, self._last_condition = frame, condition
        self._frames_since_anchor = 0
        self._broken = False

    def _reanchor(self, frame: np.ndarray | None) -> None:
        chosen = frame if frame is not None else self._observed
        self._observed = None
        pixels = self._image(chosen) if chosen is not None else self._last_frame
        self._anchor(pixels, self._last_condition)

    def _painted_reference(self, actions: Sequence[np.ndarray] | np.ndarray) -> torch.Tensor:
        """The render reference of a block: the robot painted at each action over the anchor, (1, 3, T, H, W)
        float32 in [-1, 1]."""
        painted = [self._painter(self._anchor_rgb, np.asarray(a, dtype=np.float64)) for a in actions]
        return rgb_to_pixels(painted, self.device, torch.float32)

    def _static_of(self, reference: torch.Tensor) -> torch.Tensor:
        """The static decode of a block's reference frames (1, 3, T, H, W): the static VAE streams, which began at
        the anchor."""
        vae = self.model.vae
        # the static latents take the DiT's dtype as the generated ones do, so both decoders see the same rounding
        return vae.decode(vae.encode(reference, self._static_encoder).to(self.dtype), self._static_decoder)

    def _static(self, frames: int) -> torch.Tensor:
        """The static decode of the next ``frames`` video frames (the anchor repeated), (1, 3, frames, H, W)."""
        if self.static_settled:
            return self._static_block
        block = self._static_of(self._reference.expand(-1, -1, frames, -1, -1))
        quiet = self._static_block is not None and bool((block - self._static_block).abs().max() < STATIC_TOLERANCE)
        self._static_quiet = self._static_quiet + 1 if quiet else 0
        self._static_block = block
        return block

    # ---- helpers ------------------------------------------------------------
    def _image(self, frame: np.ndarray) -> torch.Tensor:
        self._check_image(frame)
        return rgb_to_pixels([frame], self.device, self.dtype)

    def _black(self) -> torch.Tensor:
        return torch.full((1, 3, 1, self.preset.height, self.preset.width), -1.0, device=self.device,
                          dtype=self.dtype)

    def _check_image(self, frame: np.ndarray) -> None:
        expected = (self.preset.height, self.preset.width, 3)
        if np.shape(frame) != expected or np.asarray(frame).dtype != np.uint8:
            raise ValueError(f"expected an RGB uint8 image of shape {expected}, got "
                             f"{np.asarray(frame).dtype} {np.shape(frame)}")

    def _require_started(self) -> None:
        if not self.started:
            raise RuntimeError("no stream: call reset(reference) first")

    @contextmanager
    def _stage(self, name: str) -> Iterator[None]:
        with self.timer.stage(name):
            yield
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
