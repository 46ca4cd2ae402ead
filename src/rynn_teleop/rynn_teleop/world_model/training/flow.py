"""Rectified flow in the serving sampler's convention (:mod:`rynn_teleop.world_model.diffusion.sampler`).

A latent at noise level sigma in [0, 1] is ``x = (1 - sigma) * clean + sigma * noise``; the network, given
the timestep ``1000 * sigma`` per latent frame, predicts the velocity ``v = noise - clean`` = dx/dsigma, so
``clean = x - sigma * v`` and an Euler step from sigma to sigma' is ``x + (sigma' - sigma) * v``. Noise
levels lie on the preset's shifted schedule ``sigma = shift*u / (1 + (shift-1)*u)``, u in [0, 1] (u =
timestep / 1000 of the unshifted grid). The anchor (latent frame 0, TI2V's clean first frame) is always at
sigma 0.

:func:`teacher_ode` solves the teacher's ODE from noise on a uniform u grid (Euler, optional classifier-free
guidance on the condition, the whole clip in one bidirectional block): the sample videos of ``train`` and the
ODE pairs of ``distill``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from rynn_teleop.world_model.diffusion.dit import StreamingWanDiT
from rynn_teleop.world_model.diffusion.sampler import shifted_sigma

TIMESTEP_SCALE = 1000.0  # the DiT's timestep of sigma = 1


def shifted(u: torch.Tensor, shift: float) -> torch.Tensor:
    """Noise levels of unshifted positions ``u`` in [0, 1]: shift*u / (1 + (shift-1)*u) (as :func:`shifted_sigma`)."""
    return shift * u / (1.0 + (shift - 1.0) * u)


def sample_sigmas(batch: int, shift: float, device: torch.device | str = "cpu",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """(batch,) training noise levels: u uniform in [0, 1), shifted by ``shift`` (the schedule the sampler
    steps on)."""
    u = torch.rand(batch, generator=generator, device=generator.device if generator is not None else device)
    return shifted(u, shift).to(device)


def _per_frame(sigma: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``sigma`` (B,) or (B, F) broadcastable to ``x`` (B, C, F, h, w)."""
    if sigma.ndim == 1:
        return sigma.view(-1, 1, 1, 1, 1).to(x.dtype)
    return sigma[:, None, :, None, None].to(x.dtype)


def noised(clean: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``(1 - sigma) * clean + sigma * noise``; ``sigma`` (B,) or per frame (B, F)."""
    s = _per_frame(sigma, clean)
    return (1.0 - s) * clean + s * noise


def velocity_target(clean: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The velocity the network learns and the sampler integrates: ``noise - clean``."""
    return noise - clean


def clean_from_velocity(x: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """The clean latent implied by ``velocity`` at ``x``: ``x - sigma * v``; ``sigma`` (B,) or (B, F)."""
    return x - _per_frame(sigma, x) * velocity


def model_timesteps(sigma: torch.Tensor) -> torch.Tensor:
    """The DiT's timesteps of noise levels ``sigma``: ``1000 * sigma`` (what the sampler passes)."""
    return TIMESTEP_SCALE * sigma


def anchored_sigmas(sigma: torch.Tensor, frames: int) -> torch.Tensor:
    """(B, frames) per-frame noise levels: ``sigma`` (B,) on every frame but the anchor (frame 0), which is 0."""
    out = sigma[:, None].expand(-1, frames).clone()
    out[:, 0] = 0.0
    return out


def euler_grid(steps: int, shift: float) -> list[float]:
    """``steps + 1`` noise levels from 1 to 0: the shifted levels of the uniform timesteps
    ``1000 * (1 - i / steps)``, i = 0..steps."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1; got {steps}")
    return [shifted_sigma(TIMESTEP_SCALE * (1.0 - i / steps), shift) for i in range(steps)] + [0.0]


def grid_indices(timesteps: Sequence[int], steps: int) -> list[int]:
    """Positions of ``timesteps`` (of 1000, e.g. the student's 1000/750/500/250) on :func:`euler_grid` ``(steps)``.

    Raises:
        ValueError: a timestep is not on the grid (``steps`` must divide it: 4, 8, ... for multiples of 250).
    """
    out = []
    for t in timesteps:
        index, rest = divmod((1000 - int(t)) * steps, 1000)
        if rest or not 0 <= index < steps:
            raise ValueError(f"timestep {t} is not on a uniform grid of {steps} steps from 1000 to 0")
        out.append(index)
    return out


class OdeSolution(NamedTuple):
    """The teacher's trajectory: ``clean`` (B, C, F, h, w) at sigma 0 and ``states`` (B, S, C, F, h, w) at the
    recorded grid positions (S = 0 when none was asked for)."""

    clean: torch.Tensor
    states: torch.Tensor


@torch.no_grad()
def teacher_ode(dit: StreamingWanDiT, anchor: torch.Tensor, condition: torch.Tensor, noise: torch.Tensor,
                sigmas: Sequence[float], guidance: float = 1.0, record: Sequence[int] = ()) -> OdeSolution:
    """Solve the teacher's flow ODE from ``noise`` with Euler steps over ``sigmas`` (descending to 0).

    The whole clip is one bidirectional block (no mask); the anchor stays clean at sigma 0. With ``guidance``
    != 1 each step also runs the unconditional model (zero condition latents) and uses
    ``v_uncond + guidance * (v_cond - v_uncond)``. The cross-attention uses the keys/values of
    ``dit.set_prompt`` (call it first).

    Args:
        anchor: (B, C, 1, h, w) clean latent of the first frame.
        condition: (B, C, F, h, w) condition latents, the anchor's included.
        noise: (B, C, F, h, w) starting noise (frame 0 is ignored).
        sigmas: descending noise levels from 1 to 0 (e.g. :func:`euler_grid`).
        record: grid positions whose states to return (e.g. :func:`grid_indices` of the student's timesteps).

    Returns:
        :class:`OdeSolution`.
    """
    if not sigmas or sigmas[0] != 1.0 or sigmas[-1] != 0.0:
        raise ValueError(f"the ODE runs from pure noise (sigma 1) to clean (sigma 0); got {list(sigmas)[:1]} .. "
                         f"{list(sigmas)[-1:]}")
    b, _, f = condition.shape[:3]
    x = torch.cat([anchor, noise[:, :, 1:]], dim=2).to(condition.dtype)
    states = {}
    zeros = torch.zeros_like(condition)
    for i, (sigma, following) in enumerate(zip(sigmas[:-1], sigmas[1:])):
        if i in record:
            states[i] = x.clone()
        t = model_timesteps(anchored_sigmas(torch.full((b,), float(sigma), device=x.device), f))
        if guidance == 1.0:
            v = dit.forward_full(x, condition, t, [f])
        else:
            both = dit.forward_full(torch.cat([x, x]), torch.cat([condition, zeros]), torch.cat([t, t]), [f])
            v_cond, v_uncond = both.chunk(2)
            v = v_uncond + guidance * (v_cond - v_uncond)
        x = torch.cat([x[:, :, :1], x[:, :, 1:] + (following - sigma) * v[:, :, 1:].to(x.dtype)], dim=2)
    missing = [i for i in record if i not in states]
    if missing:
        raise ValueError(f"record positions {missing} are not steps of a grid of {len(sigmas)} levels")
    stacked = torch.stack([states[i] for i in record], dim=1) if record else x.new_zeros((b, 0) + x.shape[1:])
    return OdeSolution(x, stacked)
