"""Per-frame image metrics of generated video against ground truth: PSNR, SSIM and LPIPS (torch).

Images are RGB, (T, H, W, 3) (a batch of frames) or (H, W, 3) (one frame), uint8 or float, with values in
``[0, data_range]`` (255 for uint8). Every function returns one value per frame, a (T,) float64 array.

* PSNR [dB] = 10 log10(data_range**2 / MSE) over all pixels and channels of a frame
  (``torchmetrics.functional.image.peak_signal_noise_ratio``). Identical frames (MSE 0) give
  :data:`PSNR_CAP_DB` instead of infinity, everywhere (means over frames stay finite and JSON-writable).
* SSIM: Wang et al. 2004, the standard Gaussian window (11 x 11 taps, sigma 1.5 px), K1 = 0.01, K2 = 0.03,
  ``data_range`` as the dynamic range L, the mean of the SSIM map over each channel's valid area (the border of
  half a window left out), then over the channels
  (``torchmetrics.functional.image.structural_similarity_index_measure``; scikit-image's
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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from rynn_teleop.errors import ConfigurationError

PSNR_CAP_DB = 100.0  # [dB] PSNR reported for identical frames (MSE 0): 10 log10(1 / 1e-10)
SSIM_KERNEL = 11  # [px] Gaussian window size of SSIM (Wang et al. 2004)
SSIM_SIGMA = 1.5  # [px] its standard deviation
SSIM_K1, SSIM_K2 = 0.01, 0.03  # SSIM's stabilising constants, as fractions of the data range
BATCH_FRAMES = 8  # frames per torch call (bounds the memory of SSIM and LPIPS on large frames)

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
    """SSIM of each frame of ``pred`` against ``target`` (same shape; each side at least :data:`SSIM_KERNEL` px);
    computed in float64 on ``device`` (the variances are differences of large sums, which float32 resolves
    poorly on flat regions).

    Raises:
        ValueError: shapes that are not RGB images, differ, or are smaller than the window.
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
