"""Few-step flow-matching sampler (the distilled student's 4 steps).

Flow matching as in Wan: a latent at noise level sigma is
x = (1 - sigma) * clean + sigma * noise, and the model predicts the velocity
v = noise - clean, so the clean latent is x - sigma * v. Steps sit at the
preset's timesteps (1000, 750, 500, 250) on the shifted schedule
sigma = shift*t / (1 + (shift-1)*t), t = timestep / 1000; the model is given
the shifted timestep 1000 * sigma. Each step predicts the clean latent and,
except after the last, re-noises it to the next level with fresh noise (the
Self-Forcing / CausVid few-step sampler the paper uses). Noise comes from a
``torch.Generator``, so a seed fixes the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

#: velocity of a latent (B, z, k, h, w) at a shifted timestep [0, 1000]
Velocity = Callable[[torch.Tensor, float], torch.Tensor]


def shifted_sigma(timestep: float, shift: float) -> float:
    """Noise level of ``timestep`` (of 1000) on the shifted schedule: shift*t / (1 + (shift-1)*t)."""
    t = timestep / 1000.0
    return shift * t / (1.0 + (shift - 1.0) * t)


class FlowSampler:
    """Few-step sampler (see the module docstring).

    Args:
        timesteps: descending steps of 1000, e.g. (1000, 750, 500, 250).
        shift: schedule shift (> 0; 1 = no shift).
    """

    def __init__(self, timesteps: Sequence[int], shift: float) -> None:
        if not timesteps or timesteps[0] != 1000:
            raise ValueError(
                f"the sampler starts from pure noise: timesteps must begin at 1000; got {tuple(timesteps)}"
            )
        self.sigmas = tuple(shifted_sigma(t, shift) for t in timesteps)

    def sample(self, velocity: Velocity, shape: Sequence[int], generator: torch.Generator,
               device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
        """Clean latent of ``shape`` from pure noise in ``len(sigmas)`` model calls.

        Args:
            velocity: the model at one noise level: (latent, 1000 * sigma) -> velocity.
            shape: latent shape (B, z, k, h, w).
            generator: noise source (on ``device``).
        """
        def noise() -> torch.Tensor:
            return torch.randn(tuple(shape), generator=generator, device=device, dtype=dtype)

        x = noise()
        clean = x
        for i, sigma in enumerate(self.sigmas):
            clean = x - sigma * velocity(x, 1000.0 * sigma)
            if i + 1 < len(self.sigmas):
                following = self.sigmas[i + 1]
                x = (1.0 - following) * clean + following * noise()
        return clean
