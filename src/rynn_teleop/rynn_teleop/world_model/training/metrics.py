"""Per-frame image metrics of generated video against ground truth: PSNR, SSIM and LPIPS (torch).

Images are RGB, (T, H, W, 3) (a batch of frames) or (H, W, 3) (one frame), uint8 or float, with values in
``[0, data_range]`` (255 for uint8). Every function returns one value per frame, a (T,) float64 array.

* PSNR [dB] = 10 log10(data_range**2 / MSE) over all pixels and channels of a frame
  (``torchmetrics.functional.image.peak_signal_noise_ratio``). Identical frames (MSE 0) give
  :data:`PSNR_CAP_DB` instead of infinity, everywhere (means over frames stay finite and JSON-writable).
* SSIM: Wang et al. 2004, the standard Gaussian window (11 x 11 taps, sigma 1.5 px), K1 = 0.01, K2 = 0.03,
  ``data_range`` as the dynamic range L, the mean of the SSIM map over each channel's valid area (the border of
  half a window left out), then over the channels (computed with OpenCV's separable filter, :func:`ssim`;
  ``torchmetrics.functional.image.structural_similarity_index_measure`` gives the same number; scikit-image's
  ``structural_similarity(gaussian_weights=True, sigma=1.5, use_sample_covariance=False, channel_axis=-1)``
  defines the same number).
* LPIPS: Zhang et al. 2018 ("The unreasonable effectiveness of deep features as a perceptual metric"), the
  AlexNet variant: inputs scaled to [-1, 1] and shifted/scaled per channel by the published constants, the five
  ReLU outputs of AlexNet's convolutional trunk each unit-normalised along channels, their squared differences
  weighted per channel by the published linear layer ("lin" v0.1, the weights torchmetrics ships as
  ``torchmetrics/functional/image/lpips_models/alex.pth``), averaged over space and summed over the layers.
  0 for identical images, larger for less similar ones. The trunk's ImageNet weights are not shipped here and
  cannot be downloaded: :func:`load_lpips_backbone` reads them from a local file the user supplies (torchvision's
  ``alexnet-owt-7be5be79.pth``, or any state dict with torchvision's ``features.*`` keys). torchvision itself is
  never imported: :func:`alexnet_features` rebuilds its layer layout so that those keys load unchanged.

Regions (numpy and OpenCV, one frame at a time): a *box* is a half-open pixel rectangle ``(u0, v0, u1, v1)``
(columns u0..u1-1, rows v0..v1-1, clipped to the image), as :func:`~.objects.project_boxes` gives an object's.

* :func:`box_psnr`: PSNR [dB] over the box's pixels (all channels), capped like :func:`psnr`; NaN for an empty
  box.
* :func:`box_ssim`: the mean over the box's pixels of :func:`ssim_map`, the per-pixel SSIM map of the
  definition above (same window and constants, the channels' maps averaged), whose pixels within half a window
  of the image's border are left out as they are from :func:`ssim`; so the box of the whole image gives
  :func:`ssim`. NaN when no pixel of the box is outside that border.
* :func:`locate_patch`: where a frame puts what another frame shows in a masked patch (how the evaluation
  measures a hand's position error without a hand detector): the displacement (dx, dy) [px] of the best
  match, within ``search_px`` either way, of the target's masked patch in the prediction by zero-mean
  normalised cross-correlation over the mask's pixels (OpenCV ``matchTemplate``, ``TM_CCOEFF_NORMED`` with the
  mask, on luma), refined to sub-pixel by a parabola through the peak and its neighbours along each axis. The
  match is *found* when its correlation is at least ``min_score`` and it is not at the edge of the search
  range (the true displacement could lie beyond); *measurable* only when the target's patch is not flat (its
  masked luma's standard deviation at least :data:`PATCH_MIN_STD`): a flat patch matches anywhere.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import cv2
import numpy as np
import torch
from torch import nn

from rynn_teleop.errors import ConfigurationError

PSNR_CAP_DB = 100.0  # [dB] PSNR reported for identical frames (MSE 0): 10 log10(1 / 1e-10)
SSIM_KERNEL = 11  # [px] Gaussian window size of SSIM (Wang et al. 2004)
SSIM_SIGMA = 1.5  # [px] its standard deviation
SSIM_K1, SSIM_K2 = 0.01, 0.03  # SSIM's stabilising constants, as fractions of the data range
BATCH_FRAMES = 8  # frames per torch call (bounds the memory of SSIM and LPIPS on large frames)
PATCH_MIN_STD = 2.0  # [grey levels of 255] a target patch flatter than this cannot be located (locate_patch)
PATCH_MIN_SCORE = 0.5  # [-] normalised cross-correlation below which a patch counts as not found
LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601 weights of R, G, B (the grey image a patch is located in)

#: torchvision's ``alexnet().features`` indices that end at each of the 5 ReLUs LPIPS compares (end exclusive)
ALEXNET_SLICES = ((0, 2), (2, 5), (5, 8), (8, 10), (10, 12))
ALEXNET_CHANNELS = (64, 192, 384, 256, 256)  # channels of those 5 outputs
#: the trunk's weighted layers (index in ``features``) and their (weight, bias) shapes, as in torchvision
ALEXNET_CONVS = {0: (64, 3, 11, 11), 3: (192, 64, 5, 5), 6: (384, 192, 3, 3), 8: (256, 384, 3, 3),
                 10: (256, 256, 3, 3)}
LPIPS_MIN_SIZE = 31  # [px] the smallest image side AlexNet's trunk maps to a non-empty fifth layer
#: LPIPS's input normalisation (after scaling to [-1, 1]): (x - shift) / scale, per RGB channel
LPIPS_SHIFT = (-0.030, -0.088, -0.188)
LPIPS_SCALE = (0.458, 0.448, 0.450)
LPIPS_EPS = 1e-10  # added under the square root of the feature norm (the lpips package's normalize_tensor)


class LpipsBackboneError(ConfigurationError):
    """An LPIPS backbone file that is missing or is not AlexNet's trunk; the message names the file and key."""


class FrameMetrics(NamedTuple):
    """Per-frame metrics of T frames (each (T,) float64; ``lpips`` None when not measured)."""

    psnr: np.ndarray  # [dB], capped at PSNR_CAP_DB
    ssim: np.ndarray  # [-1, 1], 1 = identical
    lpips: np.ndarray | None  # >= 0, 0 = identical


def _as_batch(images: np.ndarray | torch.Tensor, name: str) -> torch.Tensor:
    """(T, 3, H, W) float64 tensor of ``images`` (see the module docstring for the accepted shapes)."""
    x = torch.as_tensor(np.asarray(images) if not isinstance(images, torch.Tensor) else images)
    if x.ndim == 3:
        x = x[None]
    if x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"{name}: expected RGB images (T, H, W, 3) or (H, W, 3); got shape {tuple(x.shape)}")
    return x.permute(0, 3, 1, 2).to(torch.float64)


def _pair(pred, target, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    a, b = _as_batch(pred, "pred").to(device), _as_batch(target, "target").to(device)
    if a.shape != b.shape:
        raise ValueError(f"pred and target must have the same shape; got {tuple(a.shape)} and {tuple(b.shape)} "
                         "(T, 3, H, W)")
    return a, b


def psnr(pred: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor, data_range: float = 255.0,
         device: torch.device | str = "cpu") -> np.ndarray:
    """PSNR [dB] of each frame of ``pred`` against ``target`` (same shape), capped at :data:`PSNR_CAP_DB`;
    computed in float64 on ``device``.

    Raises:
        ValueError: shapes that are not RGB images or differ.
    """
    from torchmetrics.functional.image import peak_signal_noise_ratio

    a, b = _pair(pred, target, device)
    if not len(a):
        return np.empty(0)
    values = peak_signal_noise_ratio(a, b, data_range=float(data_range), reduction="none", dim=(1, 2, 3))
    return values.clamp(max=PSNR_CAP_DB).reshape(-1).cpu().numpy().astype(np.float64)


def ssim(pred: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor, data_range: float = 255.0,
         device: torch.device | str = "cpu") -> np.ndarray:
    """SSIM of each frame of ``pred`` against ``target`` (same shape; each side at least :data:`SSIM_KERNEL` px):
    the mean over the valid area of :func:`ssim_map` (float64, OpenCV's separable Gaussian filter, on the CPU;
    ``device`` is accepted for :func:`frame_metrics`' signature and not used: tensors on another device are
    copied to the CPU).

    The same number as torchmetrics' ``structural_similarity_index_measure`` with the map's border of half a
    window left out (to 1e-15); computed here because torchmetrics' float64 11 x 11 convolution is far slower on
    the CPU, where it was most of an evaluation's time (``bench/world_model_metrics.py`` measures both).

    Raises:
        ValueError: shapes that are not RGB images, differ, or are smaller than the window.
    """
    a, b = _pair(pred, target, "cpu")
    a, b = a.permute(0, 2, 3, 1).numpy(), b.permute(0, 2, 3, 1).numpy()
    return np.array([np.nanmean(ssim_map(x, y, data_range)) for x, y in zip(a, b)], dtype=np.float64)


def ssim_torchmetrics(pred: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor, data_range: float = 255.0,
                      device: torch.device | str = "cpu") -> np.ndarray:
    """:func:`ssim` computed by torchmetrics on ``device`` (float64): the reference the benchmark and the tests
    compare :func:`ssim` with.

    Raises:
        ValueError: as :func:`ssim`.
    """
    from torchmetrics.functional.image import structural_similarity_index_measure

    a, b = _pair(pred, target, device)
    if min(a.shape[-2:]) < SSIM_KERNEL:
        raise ValueError(f"SSIM needs images of at least {SSIM_KERNEL} px a side; got {tuple(a.shape[-2:])}")
    half = SSIM_KERNEL // 2
    out = []
    for i in range(0, len(a), BATCH_FRAMES):
        # torchmetrics averages the whole map, its border computed over reflected pixels; Wang et al. (and
        # scikit-image) average only where the window lies inside the image
        _, full = structural_similarity_index_measure(
            a[i:i + BATCH_FRAMES], b[i:i + BATCH_FRAMES], gaussian_kernel=True, sigma=SSIM_SIGMA,
            kernel_size=SSIM_KERNEL, reduction="none", data_range=float(data_range), k1=SSIM_K1, k2=SSIM_K2,
            return_full_image=True)
        if full.shape[-2:] != a.shape[-2:]:
            raise RuntimeError(f"torchmetrics' SSIM map has shape {tuple(full.shape)}; expected the images' size")
        out.append(full[..., half:-half, half:-half].mean(dim=(1, 2, 3)).cpu())
    return torch.cat(out).numpy().astype(np.float64) if out else np.empty(0)


# ---- LPIPS ---------------------------------------------------------------------------------------------------


def alexnet_features() -> nn.Sequential:
    """AlexNet's convolutional trunk in torchvision's layout (``torchvision.models.alexnet().features``): the
    module indices, and so the state-dict keys ``0.weight`` ... ``10.bias``, are torchvision's. Weights are
    PyTorch's default initialisation (random): load real ones with :func:`load_lpips_backbone`."""
    return nn.Sequential(
        nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
        nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(),
        nn.MaxPool2d(kernel_size=3, stride=2),
    )


def check_lpips_backbone(state: Mapping[str, torch.Tensor], source: str = "backbone") -> dict[str, torch.Tensor]:
    """The trunk's ``features.*`` tensors of ``state`` (other keys, e.g. ``classifier.*``, are ignored).

    Raises:
        LpipsBackboneError: a missing or mis-shaped trunk weight (named, with ``source``).
    """
    out, problems = {}, []
    for index, shape in ALEXNET_CONVS.items():
        for part, expected in (("weight", shape), ("bias", shape[:1])):
            key = f"features.{index}.{part}"
            value = state.get(key)
            if not isinstance(value, torch.Tensor):
                problems.append(f"missing {key} {list(expected)}")
            elif tuple(value.shape) != expected:
                problems.append(f"{key}: shape {list(value.shape)}, expected {list(expected)}")
            else:
                out[key] = value
    if problems:
        raise LpipsBackboneError(f"LPIPS backbone {source}: not AlexNet's trunk in torchvision's layout "
                                 f"(alexnet-owt-7be5be79.pth): {'; '.join(problems[:6])}")
    return out


def load_lpips_backbone(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The ImageNet AlexNet trunk weights in ``path`` (``.pth``/``.pt`` read with ``torch.load(weights_only=True)``,
    ``.safetensors`` with safetensors): torchvision's ``alexnet-owt-7be5be79.pth`` or any state dict with its
    ``features.*`` keys.

    Raises:
        LpipsBackboneError: no such file, unreadable, or without AlexNet's trunk (named).
    """
    path = Path(path)
    if not path.is_file():
        raise LpipsBackboneError(f"LPIPS backbone {path}: no such file (give torchvision's alexnet-owt-7be5be79.pth "
                                 "or a state dict with its features.* keys)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load and safetensors raise many types: each means "not readable"
        raise LpipsBackboneError(f"LPIPS backbone {path}: not readable as a state dict ({exc})") from exc
    if isinstance(state, Mapping) and isinstance(state.get("state_dict"), Mapping):
        state = state["state_dict"]
    if not isinstance(state, Mapping):
        raise LpipsBackboneError(f"LPIPS backbone {path}: holds a {type(state).__name__}, not a state dict")
    return check_lpips_backbone(state, str(path))


def lpips_linear_weights() -> dict[str, torch.Tensor]:
    """The published LPIPS linear layers for AlexNet (v0.1) as torchmetrics ships them: ``lin{k}.model.1.weight``,
    (1, C_k, 1, 1) non-negative channel weights of layer k = 0..4.

    Raises:
        LpipsBackboneError: torchmetrics' file is missing or not of that form.
    """
    import torchmetrics.functional.image as image_metrics

    path = Path(image_metrics.__file__).parent / "lpips_models" / "alex.pth"
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as exc:
        raise LpipsBackboneError(f"LPIPS linear layers {path}: not readable ({exc})") from exc
    out = {}
    for k, channels in enumerate(ALEXNET_CHANNELS):
        key = f"lin{k}.model.1.weight"
        value = state.get(key) if isinstance(state, Mapping) else None
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != (1, channels, 1, 1):
            raise LpipsBackboneError(f"LPIPS linear layers {path}: {key} missing or not (1, {channels}, 1, 1)")
        out[key] = value
    return out


class Lpips(nn.Module):
    """LPIPS (AlexNet, linear v0.1; see the module docstring) with the given trunk weights.

    Args:
        backbone: the trunk's ``features.*`` tensors (:func:`load_lpips_backbone`; checked by
            :func:`check_lpips_backbone`).
        linear: the linear layers (default: :func:`lpips_linear_weights`).

    Raises:
        LpipsBackboneError: trunk or linear weights of the wrong form.
    """

    def __init__(self, backbone: Mapping[str, torch.Tensor], linear: Mapping[str, torch.Tensor] | None = None) -> None:
        super().__init__()
        self.features = alexnet_features()
        trunk = check_lpips_backbone(backbone)
        self.features.load_state_dict({k.removeprefix("features."): v for k, v in trunk.items()})
        linear = lpips_linear_weights() if linear is None else linear
        self.lins = nn.ModuleList(nn.Conv2d(c, 1, kernel_size=1, bias=False) for c in ALEXNET_CHANNELS)
        for k, conv in enumerate(self.lins):
            conv.weight.data.copy_(linear[f"lin{k}.model.1.weight"])
        self.register_buffer("shift", torch.tensor(LPIPS_SHIFT).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("scale", torch.tensor(LPIPS_SCALE).view(1, 3, 1, 1), persistent=False)
        self.eval().requires_grad_(False)

    def _layers(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for start, end in ALEXNET_SLICES:
            for module in self.features[start:end]:
                x = module(x)
            out.append(x / torch.sqrt(torch.sum(x * x, dim=1, keepdim=True) + LPIPS_EPS))
        return out

    def forward(self, x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
        """(N,) LPIPS of (N, 3, H, W) images ``x0`` against ``x1`` with values in [-1, 1]."""
        total = torch.zeros(len(x0), dtype=x0.dtype, device=x0.device)
        for lin, f0, f1 in zip(self.lins, self._layers((x0 - self.shift) / self.scale),
                               self._layers((x1 - self.shift) / self.scale)):
            total = total + lin((f0 - f1) ** 2).mean(dim=(1, 2, 3))
        return total

    def score(self, pred: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor,
              data_range: float = 255.0) -> np.ndarray:
        """LPIPS of each frame of ``pred`` against ``target`` (same shape; sides >= :data:`LPIPS_MIN_SIZE` px).

        Raises:
            ValueError: shapes that are not RGB images, differ, or are too small for AlexNet's trunk.
        """
        a, b = _pair(pred, target)
        if min(a.shape[-2:]) < LPIPS_MIN_SIZE:
            raise ValueError(f"LPIPS (AlexNet) needs images of at least {LPIPS_MIN_SIZE} px a side; got "
                             f"{tuple(a.shape[-2:])}")
        param = next(self.parameters())
        out = []
        with torch.no_grad():
            for i in range(0, len(a), BATCH_FRAMES):
                x0, x1 = (t[i:i + BATCH_FRAMES].to(device=param.device, dtype=param.dtype) * (2.0 / data_range) - 1.0
                          for t in (a, b))
                out.append(self(x0, x1).double().cpu())
        return torch.cat(out).numpy() if out else np.empty(0)


def frame_metrics(pred: np.ndarray | torch.Tensor, target: np.ndarray | torch.Tensor, lpips: Lpips | None = None,
                  data_range: float = 255.0, device: torch.device | str = "cpu") -> FrameMetrics:
    """PSNR, SSIM and (with an :class:`Lpips`) LPIPS of each frame of ``pred`` against ``target``; PSNR and SSIM
    on ``device``, LPIPS on the device of its weights.

    Raises:
        ValueError: see :func:`psnr`, :func:`ssim` and :meth:`Lpips.score`.
    """
    return FrameMetrics(psnr(pred, target, data_range, device), ssim(pred, target, data_range, device),
                        None if lpips is None else lpips.score(pred, target, data_range))


def masked_psnr(pred: np.ndarray, target: np.ndarray, mask: np.ndarray, data_range: float = 255.0) -> float:
    """PSNR [dB] of one frame over the pixels where ``mask`` (H, W) is true (all channels); NaN for an empty mask;
    capped at :data:`PSNR_CAP_DB`.

    Raises:
        ValueError: images (H, W, 3) of different shapes, or a mask of another size.
    """
    a, b = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    m = np.asarray(mask, dtype=bool)
    if a.shape != b.shape or a.ndim != 3 or m.shape != a.shape[:2]:
        raise ValueError(f"masked_psnr: images {a.shape}, {b.shape} and mask {m.shape} do not fit")
    if not m.any():
        return float("nan")
    mse = float(np.mean((a[m] - b[m]) ** 2))
    if mse == 0.0:
        return PSNR_CAP_DB
    return min(PSNR_CAP_DB, 10.0 * np.log10(data_range**2 / mse))


# ---- regions: boxes and patches ------------------------------------------------------------------------------


def _frame_pair(pred: np.ndarray, target: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(pred, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 3 or a.shape[-1] != 3:
        raise ValueError(f"{name}: expected two RGB images (H, W, 3) of one shape; got {a.shape} and {b.shape}")
    return a, b


def _box_slices(box: np.ndarray | tuple[int, int, int, int], height: int, width: int
                ) -> tuple[slice, slice] | None:
    """(rows, columns) of ``box`` clipped to the image; None when it covers no pixel."""
    u0, v0, u1, v1 = (int(v) for v in box)
    u0, u1 = max(0, u0), min(width, u1)
    v0, v1 = max(0, v0), min(height, v1)
    if u1 <= u0 or v1 <= v0:
        return None
    return slice(v0, v1), slice(u0, u1)


def box_psnr(pred: np.ndarray, target: np.ndarray, box: np.ndarray | tuple[int, int, int, int],
             data_range: float = 255.0) -> float:
    """PSNR [dB] of one frame over the pixels of ``box`` (see the module docstring), capped at
    :data:`PSNR_CAP_DB`; NaN for a box without pixels in the image.

    Raises:
        ValueError: images that are not (H, W, 3) of one shape.
    """
    a, b = _frame_pair(pred, target, "box_psnr")
    where = _box_slices(box, a.shape[0], a.shape[1])
    if where is None:
        return float("nan")
    mse = float(np.mean((a[where] - b[where]) ** 2))
    if mse == 0.0:
        return PSNR_CAP_DB
    return float(min(PSNR_CAP_DB, 10.0 * np.log10(data_range**2 / mse)))


def ssim_map(pred: np.ndarray, target: np.ndarray, data_range: float = 255.0) -> np.ndarray:
    """(H, W) float64 per-pixel SSIM of one frame (Wang et al. 2004 as :func:`ssim`: Gaussian window of
    :data:`SSIM_KERNEL` taps, sigma :data:`SSIM_SIGMA`, K1, K2; the mean over the RGB channels' maps); NaN
    within half a window of the border, where the window leaves the image.

    Raises:
        ValueError: images that are not (H, W, 3) of one shape, or smaller than the window.
    """
    a, b = _frame_pair(pred, target, "ssim_map")
    h, w = a.shape[:2]
    if min(h, w) < SSIM_KERNEL:
        raise ValueError(f"SSIM needs images of at least {SSIM_KERNEL} px a side; got {(h, w)}")
    taps = cv2.getGaussianKernel(SSIM_KERNEL, SSIM_SIGMA, cv2.CV_64F)

    def blur(x: np.ndarray) -> np.ndarray:  # inside the valid area the border mode does not matter
        return cv2.sepFilter2D(x, cv2.CV_64F, taps, taps, borderType=cv2.BORDER_REFLECT)

    c1, c2 = (SSIM_K1 * data_range) ** 2, (SSIM_K2 * data_range) ** 2
    out = np.zeros((h, w))
    for c in range(3):
        x, y = np.ascontiguousarray(a[..., c]), np.ascontiguousarray(b[..., c])
        mx, my = blur(x), blur(y)
        vx, vy, cxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        out += (2 * mx * my + c1) * (2 * cxy + c2) / ((mx * mx + my * my + c1) * (vx + vy + c2))
    out /= 3
    half = SSIM_KERNEL // 2
    out[:half], out[-half:], out[:, :half], out[:, -half:] = np.nan, np.nan, np.nan, np.nan
    return out


def box_ssim(pred: np.ndarray | None, target: np.ndarray | None, box: np.ndarray | tuple[int, int, int, int],
             data_range: float = 255.0, ssim_image: np.ndarray | None = None) -> float:
    """SSIM of one frame over the pixels of ``box`` (see the module docstring); NaN when none of them is
    outside the border band of :func:`ssim_map`.

    Args:
        pred, target: (H, W, 3) images (unused when ``ssim_image`` is given).
        box: ``(u0, v0, u1, v1)`` [px], half-open.
        ssim_image: their :func:`ssim_map`, when already computed (several boxes of one frame).

    Raises:
        ValueError: see :func:`ssim_map`.
    """
    m = ssim_map(pred, target, data_range) if ssim_image is None else np.asarray(ssim_image, dtype=np.float64)
    where = _box_slices(box, m.shape[0], m.shape[1])
    if where is None:
        return float("nan")
    values = m[where]
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


class PatchShift(NamedTuple):
    """Where :func:`locate_patch` found a target's patch in a prediction."""

    dx: float  # [px] the prediction shows the patch this far right of where the target does (NaN: not found)
    dy: float  # [px] ... and this far down
    score: float  # [-] normalised cross-correlation at the match, in [-1, 1] (NaN: no match)
    found: bool  # score >= min_score and not at the edge of the search range
    measurable: bool  # the target's patch has texture (otherwise nothing can be located)

    @property
    def distance(self) -> float:
        """[px] length of (dx, dy); NaN when not found."""
        return math.hypot(self.dx, self.dy) if self.found else float("nan")


def _luma(image: np.ndarray) -> np.ndarray:
    return np.asarray(image, dtype=np.float32) @ np.asarray(LUMA, dtype=np.float32)


def _parabola_peak(left: float, centre: float, right: float) -> float:
    """Sub-pixel offset in [-0.5, 0.5] of the vertex of the parabola through three equally spaced values."""
    curvature = left - 2 * centre + right
    if not (math.isfinite(left) and math.isfinite(right)) or curvature >= 0:
        return 0.0
    return float(np.clip(0.5 * (left - right) / curvature, -0.5, 0.5))


def locate_patch(pred: np.ndarray, target: np.ndarray, mask: np.ndarray, search_px: int,
                 min_score: float = PATCH_MIN_SCORE) -> PatchShift:
    """Where ``pred`` shows the part of ``target`` under ``mask`` (see the module docstring).

    Args:
        pred, target: (H, W, 3) RGB frames of one shape.
        mask: (H, W) bool: the target's pixels to locate (e.g. a hand's region).
        search_px: [px] the largest displacement looked for along each axis (>= 1).
        min_score: the least normalised cross-correlation of a found match.

    Returns:
        The displacement of the best match (NaN, ``found`` False when there is none: an empty mask, a flat
        prediction, a match below ``min_score`` or at the edge of the search range).

    Raises:
        ValueError: images that are not (H, W, 3) of one shape, a mask of another size, ``search_px`` < 1.
    """
    a, b = _frame_pair(pred, target, "locate_patch")
    m = np.asarray(mask, dtype=bool)
    if m.shape != a.shape[:2]:
        raise ValueError(f"locate_patch: mask {m.shape} does not fit images {a.shape[:2]}")
    if int(search_px) < 1:
        raise ValueError(f"locate_patch: search_px must be >= 1; got {search_px}")
    r = int(search_px)
    none = PatchShift(float("nan"), float("nan"), float("nan"), False, False)
    rows, cols = np.nonzero(m)
    if not len(rows):
        return none
    v0, v1, u0, u1 = int(rows.min()), int(rows.max()) + 1, int(cols.min()), int(cols.max()) + 1
    gp, gt = _luma(a), _luma(b)
    template, template_mask = gt[v0:v1, u0:u1], m[v0:v1, u0:u1]
    if float(template[template_mask].std()) < PATCH_MIN_STD:
        return none
    h, w = m.shape
    sv0, sv1, su0, su1 = max(0, v0 - r), min(h, v1 + r), max(0, u0 - r), min(w, u1 + r)
    window = np.ascontiguousarray(gp[sv0:sv1, su0:su1])
    scores = cv2.matchTemplate(window, np.ascontiguousarray(template), cv2.TM_CCOEFF_NORMED,
                               mask=template_mask.astype(np.uint8))
    scores = np.where(np.isfinite(scores), scores, -np.inf)  # flat parts of the prediction: no match there
    i, j = np.unravel_index(int(np.argmax(scores)), scores.shape)
    best = float(scores[i, j])
    if not math.isfinite(best):
        return PatchShift(float("nan"), float("nan"), float("nan"), False, True)
    dy, dx = sv0 + int(i) - v0, su0 + int(j) - u0
    at_edge = abs(dy) >= r or abs(dx) >= r
    if best < min_score or at_edge:
        return PatchShift(float("nan"), float("nan"), best, False, True)
    if 0 < i < scores.shape[0] - 1:
        dy += _parabola_peak(float(scores[i - 1, j]), best, float(scores[i + 1, j]))
    if 0 < j < scores.shape[1] - 1:
        dx += _parabola_peak(float(scores[i, j - 1]), best, float(scores[i, j + 1]))
    return PatchShift(float(dx), float(dy), best, True, True)
