"""Reference compositing: pixels a generated frame leaves unchanged come from the reference frame itself.

A model that generates in a VAE's latents can draw the unchanged part of the scene no sharper than the VAE
reconstructs it, and a small VAE blurs it (the CPU stand-in of ``small`` reconstructs twin frames at about
21 dB, below simply repeating the reference). Compositing keeps what the model changes and takes everything
else from the reference (anchor) frame:

* the *static decode* ``S`` is the VAE's own drawing of the unchanged scene: the reference frame repeated,
  encoded and decoded by the same causal VAE streams as the generated video (frame for frame, so the VAE's
  drift over a stream cancels);
* per pixel, the change ``d`` = the mean over the colour channels of ``|decoded - S|`` [8-bit levels], smoothed
  by a Gaussian of ``blur_px`` [px] (so a changed region's edge does not flicker);
* the weight of the generated pixel ``m`` ramps linearly from 0 at ``d <= low`` to 1 at ``d >= high``; the
  output is ``m * decoded + (1 - m) * reference``.

Where the model moves nothing the frame is the reference; where it moves the robot or an object the frame is
the model's; where the whole scene changes (a moving camera, another light) ``m`` is 1 everywhere and the
frame is the model's. The thresholds are settings of the ``diffusion`` backend (``composite*``).

*Reach* (``reach_px`` > 0): only the robot changes the scene, directly or through what it touches, so a change
the model draws far from everywhere the robot has been since the anchor is the model's invention (a small
model paints blots on walls it has never seen). The condition (skeleton) images say where the robot is: a
pixel's weight ``m`` is kept only within ``reach_px`` [px] of a skeleton pixel of the anchor's condition or of
any condition image since (their running union, the *sweep*), and is 0 beyond. An object the hand carries stays
inside the sweep; one that rolls or falls farther than ``reach_px`` from everywhere the hand has been is drawn
where it rested in the anchor frame, and a changing scene (a moving camera) changes only near the robot: serve
with ``reach_px`` 0 (no gate) there.

*Reference* (``reference``): ``anchor`` (the default) is the anchor frame, as above. ``render`` is, per frame, the
``render`` backend's frame for that frame's action (:class:`~rynn_teleop.world_model.render.RenderGenerator`: the
robot's primitives painted at the action over the anchor), and the static decode is the VAE's drawing of those
frames (their own encoder/decoder streams, the anchor first). The robot where the model draws it as the renderer
does comes from the renderer, drawn sharp from the kinematics; what the renderer cannot know comes from the model:
an object moved or carried, the table it uncovered, the anchor's robot the renderer paints over but does not erase.
Where the camera does not show the renderer's primitives (a real robot), the model's drawing differs from theirs
and the frame is the model's there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from rynn_teleop.errors import ConfigurationError

if TYPE_CHECKING:
    import torch

#: pixel values in [-1, 1] per 8-bit level (``rgb_to_pixels``: v / 127.5 - 1)
LEVEL = 1.0 / 127.5
#: the largest change threshold [8-bit levels] and smoothing sigma [px] accepted
MAX_LEVEL = 255.0
MAX_BLUR_PX = 20.0
#: the largest reach [px] accepted
MAX_REACH_PX = 200.0
#: what the model's frames are composited over (see the module docstring)
REFERENCES = ("anchor", "render")
#: a condition-image pixel brighter than this in any channel [8-bit levels] is the skeleton's (the condition
#: image is black elsewhere)
SKELETON_LEVEL = 0.5


@dataclass(frozen=True)
class CompositeSettings:
    """The change ramp (see the module docstring).

    The defaults were chosen on training clips only, those of the 12-layout twin run of
    ``bench/world_model_training.py --twin`` (the ``small`` preset, its CPU stand-in VAE and its trained student): of
    ``low`` in {9, 14, 20, 30}, ``high`` in {35, 45, 60, 80} and ``blur_px`` in {2, 3, 5, 7, 10}, the setting under
    which the student's composited frames score the highest whole-frame SSIM on every 4th training clip (24 of 114).
    A wider blur keeps the edge of a changed region from picking up the VAE's speckle where nothing moved; the
    higher thresholds keep more of the sharp anchor. The training loss's change map has its own, fixed ramp
    (:data:`~rynn_teleop.world_model.training.config.CHANGE_RAMP`). A sharper VAE (the paper's) leaves less change
    where nothing moves and can take lower thresholds; the best thresholds vary between runs of the same recipe
    (docs: benchmarks, world model on twin episodes).

    Attributes:
        low: a pixel whose smoothed change is at most this is the reference's [8-bit levels, 0-255].
        high: at least this, the generated one [levels]; in between, linearly blended.
        blur_px: Gaussian sigma of the smoothing [px of the model's frames]; 0: none.
        reach_px: farther than this from the robot's sweep [px of the model's frames], the reference's pixel
            (see the module docstring); 0: no gate.
        reference: ``anchor`` or ``render`` (:data:`REFERENCES`; see the module docstring).
    """

    low: float = 14.0
    high: float = 45.0
    blur_px: float = 7.0
    reach_px: float = 0.0
    reference: str = "anchor"

    def __post_init__(self) -> None:
        if not 0.0 <= self.low < self.high <= MAX_LEVEL:
            raise ConfigurationError(f"compositing needs 0 <= composite_low < composite_high <= {MAX_LEVEL:g} "
                                     f"[levels]; got {self.low} and {self.high}")
        if not 0.0 <= self.blur_px <= MAX_BLUR_PX:
            raise ConfigurationError(f"composite_blur_px must be in [0, {MAX_BLUR_PX:g}] px; got {self.blur_px}")
        if not 0.0 <= self.reach_px <= MAX_REACH_PX:
            raise ConfigurationError(f"composite_reach_px must be in [0, {MAX_REACH_PX:g}] px; got {self.reach_px}")
        if self.reference not in REFERENCES:
            raise ConfigurationError(f"composite_reference must be one of {', '.join(REFERENCES)}; got "
                                     f"{self.reference!r}")

    def backend_settings(self, enabled: bool = True) -> dict[str, float | bool | str]:
        """The ``diffusion`` backend's keyword arguments (``composite``, ``composite_low``, ...) for these."""
        return {"composite": enabled, "composite_low": self.low, "composite_high": self.high,
                "composite_blur_px": self.blur_px, "composite_reach_px": self.reach_px,
                "composite_reference": self.reference}


def _gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """(N, 1, H, W) smoothed by a separable Gaussian of ``sigma`` [px], borders replicated, on the tensor's device.

    Written here: torchvision does not work with the project's torch build, and OpenCV would move every block
    off the GPU and back."""
    import torch
    import torch.nn.functional as F

    radius = max(1, math.ceil(3.0 * sigma))
    x = torch.arange(-radius, radius + 1, device=images.device, dtype=images.dtype)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    kernel = kernel / kernel.sum()
    padded = F.pad(images, (radius, radius, radius, radius), mode="replicate")
    rows = F.conv2d(padded, kernel.view(1, 1, 1, -1))
    return F.conv2d(rows, kernel.view(1, 1, -1, 1))


def skeleton_mask(conditions: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, H, W) bool: the pixels of the condition images ``conditions`` (B, 3, T, H, W) in [-1, 1] the
    skeleton is drawn on (brighter than :data:`SKELETON_LEVEL` in any channel)."""
    return (conditions.float() + 1.0 > SKELETON_LEVEL * LEVEL).any(dim=1, keepdim=True)


def sweep(skeleton: torch.Tensor, previous: torch.Tensor | None = None) -> torch.Tensor:
    """(B, 1, T, H, W) bool: per frame, the union of ``skeleton`` (B, 1, T, H, W) bool up to that frame and
    ``previous`` (B, 1, 1, H, W) bool, the sweep before the first frame (None: empty)."""
    import torch

    if previous is not None:
        skeleton = torch.cat([previous.to(skeleton.device), skeleton], dim=2)
    swept = torch.cummax(skeleton.to(torch.uint8), dim=2).values.bool()
    return swept[:, :, 1:] if previous is not None else swept


def _disk(radius_px: float) -> np.ndarray:
    """(2r + 1, 2r + 1) uint8, r = floor(``radius_px``): 1 where the offset is within ``radius_px`` [px]."""
    radius = int(math.floor(radius_px))
    x = np.arange(-radius, radius + 1, dtype=np.float64)
    return ((x[:, None] ** 2 + x[None, :] ** 2) <= radius_px ** 2).astype(np.uint8)


def reach(swept: torch.Tensor, radius_px: float) -> torch.Tensor:
    """(B, 1, T, H, W) float32 in {0, 1}: the pixels within ``radius_px`` [px] (Euclidean) of a pixel of
    ``swept`` (B, 1, T, H, W) bool, frame by frame, on ``swept``'s device (on the CPU OpenCV's dilation, which
    torch's single-channel convolution there is far slower than; elsewhere a convolution with the disc)."""
    import torch

    disk = _disk(radius_px)
    batch, _, frames, rows, cols = swept.shape
    flat = swept.reshape(batch * frames, rows, cols)
    if swept.device.type == "cpu":
        grown = np.stack([cv2.dilate(f, disk, borderType=cv2.BORDER_CONSTANT, borderValue=0)
                          for f in flat.to(torch.uint8).numpy()])
        return torch.from_numpy(grown).float().reshape(batch, 1, frames, rows, cols)
    return _reach_convolved(flat, disk).reshape(batch, 1, frames, rows, cols)


def _reach_convolved(flat: torch.Tensor, disk: np.ndarray) -> torch.Tensor:
    """(N, H, W) float32 in {0, 1}: ``flat`` (N, H, W) bool dilated by ``disk`` with a convolution."""
    import torch
    import torch.nn.functional as F

    kernel = torch.from_numpy(disk).to(flat.device, torch.float32)
    radius = kernel.shape[0] // 2
    grown = F.conv2d(flat[:, None].float(), kernel[None, None], padding=radius) > 0.5
    return grown[:, 0].float()


def change_weight(decoded: torch.Tensor, static: torch.Tensor, settings: CompositeSettings,
                  swept: torch.Tensor | None = None) -> torch.Tensor:
    """The generated pixels' weight ``m`` in [0, 1], (B, 1, T, H, W) float32.

    Args:
        decoded: (B, 3, T, H, W) generated video in [-1, 1].
        static: the static decode of the same frames, same shape.
        swept: (B, 1, T, H, W) bool, the robot's sweep at each frame (:func:`sweep`), for ``settings.reach_px``;
            None or ``reach_px`` 0: no gate.
    """
    if decoded.shape != static.shape:
        raise ValueError(f"decoded {tuple(decoded.shape)} and static {tuple(static.shape)} differ in shape")
    batch, _, frames, rows, cols = decoded.shape
    change = (decoded.float() - static.float()).abs().mean(dim=1) / LEVEL  # (B, T, H, W) [levels]
    if settings.blur_px > 0:
        change = _gaussian_blur(change.reshape(batch * frames, 1, rows, cols), settings.blur_px)
    change = change.reshape(batch, 1, frames, rows, cols)
    weight = ((change - settings.low) / (settings.high - settings.low)).clamp(0.0, 1.0)
    if swept is not None and settings.reach_px > 0:
        if swept.shape != weight.shape:
            raise ValueError(f"swept {tuple(swept.shape)} is not the frames' mask shape {tuple(weight.shape)}")
        weight = weight * reach(swept, settings.reach_px)
    return weight


def composite(decoded: torch.Tensor, static: torch.Tensor, reference: torch.Tensor,
              settings: CompositeSettings, swept: torch.Tensor | None = None) -> torch.Tensor:
    """``m * decoded + (1 - m) * reference`` (see the module docstring), in ``decoded``'s dtype.

    Args:
        decoded: (B, 3, T, H, W) generated video in [-1, 1].
        static: (B, 3, T, H, W) the static decode of those frames (of the reference's frames).
        reference: (B, 3, 1, H, W) the anchor frame, or (B, 3, T, H, W) a reference per frame (the ``render``
            reference), in [-1, 1].
        swept: the robot's sweep per frame (:func:`change_weight`); None: no reach gate.
    """
    if (reference.shape[:2] != decoded.shape[:2] or reference.shape[2] not in (1, decoded.shape[2])
            or reference.shape[3:] != decoded.shape[3:]):
        raise ValueError(f"reference {tuple(reference.shape)} is neither one frame nor every frame of decoded "
                         f"{tuple(decoded.shape)}")
    weight = change_weight(decoded, static, settings, swept)
    out = weight * decoded.float() + (1.0 - weight) * reference.float()
    return out.to(decoded.dtype)


def static_video(vae, reference: torch.Tensor, frames: int) -> torch.Tensor:
    """The static decode of a one-shot clip: ``reference`` (1, 3, 1, H, W) repeated ``frames`` (1 + 4k) times, or
    a reference per frame (1, 3, frames, H, W: the anchor, then the ``render`` reference's painted frames) as it
    is, encoded and decoded by ``vae`` (a :class:`~.vae.StreamingVAE`), (1, 3, frames, H, W) in [-1, 1]."""
    return vae.decode(vae.encode(reference.expand(-1, -1, frames, -1, -1)))
