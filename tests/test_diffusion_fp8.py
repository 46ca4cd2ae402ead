"""FP8 switch of the DiT: which layers it converts, and a clear refusal where it cannot run (CPU here)."""

from __future__ import annotations

import pytest
import torch
from diffusers import WanTransformer3DModel

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.bench_support import measure_stream
from rynn_teleop.world_model.diffusion.fp8 import fp8_layer, fp8_unavailable, quantize_fp8
from rynn_teleop.world_model.diffusion.presets import PAPER, TINY


def chosen(preset) -> list[str]:
    with torch.device("meta"):
        transformer = WanTransformer3DModel(**preset.transformer_kwargs)
    return [name for name, module in transformer.named_modules() if fp8_layer(module, name)]


def test_only_the_block_linear_layers_of_the_paper_dit_are_converted():
    names = chosen(PAPER)
    per_block = {name.split(".", 2)[2] for name in names}
    assert per_block == {"attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                         "attn2.to_v", "attn2.to_out.0", "ffn.net.0.proj", "ffn.net.2"}
    assert len(names) == 10 * PAPER.transformer_kwargs["num_layers"]
    assert not [n for n in names if not n.startswith("blocks.")]  # embeddings, head and control stay as they are


def test_layers_whose_sizes_are_not_multiples_of_16_stay_as_they_are():
    layer = torch.nn.Linear(24, 32)
    assert not fp8_layer(layer, "blocks.0.ffn.net.2")
    assert fp8_layer(torch.nn.Linear(32, 48), "blocks.0.ffn.net.2")
    assert not fp8_layer(torch.nn.Linear(32, 48), "proj_out")


def test_the_cpu_is_refused_with_the_reason():
    reason = fp8_unavailable("cpu")
    assert "compute capability >= 8.9" in reason and "cpu" in reason
    with pytest.raises(ConfigurationError, match="compute capability"):
        quantize_fp8(torch.nn.Sequential(torch.nn.Linear(16, 16)))
    with pytest.raises(ConfigurationError, match="compute capability"):
        measure_stream(TINY, random_weights=True, fp8=True)
