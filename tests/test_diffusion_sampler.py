"""4-step shifted flow sampler: schedule, clean-latent recovery, fresh noise, determinism."""

from __future__ import annotations

import itertools

import pytest
import torch

from rynn_teleop.world_model.diffusion.sampler import FlowSampler, shifted_sigma

SHAPE = (1, 4, 1, 3, 5)


def test_shifted_schedule():
    assert shifted_sigma(1000, 5.0) == 1.0 and shifted_sigma(0, 5.0) == 0.0
    assert shifted_sigma(500, 1.0) == 0.5
    assert shifted_sigma(250, 5.0) == pytest.approx(5 * 0.25 / (1 + 4 * 0.25))
    sigmas = FlowSampler((1000, 750, 500, 250), 5.0).sigmas
    assert sigmas == pytest.approx((1.0, 15 / 16, 5 / 6, 5 / 8))
    with pytest.raises(ValueError, match="begin at 1000"):
        FlowSampler((750, 500), 5.0)


def test_exact_velocity_recovers_the_clean_latent_and_sees_fresh_noise():
    clean = torch.randn(SHAPE, generator=torch.Generator().manual_seed(9))
    sampler = FlowSampler((1000, 750, 500, 250), 5.0)
    calls: list[tuple[float, torch.Tensor]] = []

    def oracle(x: torch.Tensor, timestep: float) -> torch.Tensor:
        sigma = timestep / 1000
        noise = (x - (1 - sigma) * clean) / sigma
        calls.append((timestep, noise))
        return noise - clean  # the true flow velocity

    out = sampler.sample(oracle, SHAPE, torch.Generator().manual_seed(0), "cpu", torch.float32)
    torch.testing.assert_close(out, clean, rtol=1e-5, atol=1e-5)
    assert [t for t, _ in calls] == pytest.approx([1000 * s for s in sampler.sigmas])
    noises = [n for _, n in calls]
    assert all(not torch.allclose(a, b) for a, b in itertools.pairwise(noises))  # fresh noise at every step


def test_deterministic_under_a_seed():
    sampler = FlowSampler((1000, 750, 500, 250), 5.0)

    def model(x: torch.Tensor, timestep: float) -> torch.Tensor:
        return 0.5 * x + timestep / 1000

    def run(seed: int) -> torch.Tensor:
        return sampler.sample(model, SHAPE, torch.Generator().manual_seed(seed), "cpu", torch.float32)

    assert torch.equal(run(1), run(1))
    assert not torch.equal(run(1), run(2))
