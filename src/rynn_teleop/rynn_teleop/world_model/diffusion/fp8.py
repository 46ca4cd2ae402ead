"""FP8 weights and activations for the DiT's linear layers, through torchao (GPUs with FP8 tensor cores).

Contract: :func:`quantize_fp8` replaces, in place, the weights of the ``nn.Linear`` layers inside the
transformer blocks (self- and cross-attention projections, feed-forward) with torchao's float8 tensors and
quantizes their input activations dynamically per row (``Float8DynamicActivationFloat8WeightConfig``).
Everything else stays in the model's dtype: the patch and condition embeddings, the timestep and text
embeddings, the output head, the norms and the control branch (the first and last layers carry most of the
quantization error for the least work). The custom attention processors call the projections as modules, so
they work unchanged on the quantized layers.

FP8 matrix multiplies need CUDA compute capability 8.9 or higher (Ada, Hopper, Blackwell). torchao is not
part of the CPU install: ``.venv/bin/pip install -r requirements/gpu.txt`` on a GPU machine.
"""

from __future__ import annotations

import torch
from torch import nn

from rynn_teleop.errors import ConfigurationError

MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (8.9), Hopper (9.0) and later
FP8_ALIGNMENT = 16  # torchao's float8 matmul needs both feature sizes divisible by 16


def fp8_layer(module: nn.Module, name: str) -> bool:
    """Whether :func:`quantize_fp8` converts ``module`` (fully qualified ``name`` inside the transformer):
    a linear layer of a transformer block whose feature sizes are multiples of 16."""
    return (isinstance(module, nn.Linear) and name.startswith("blocks.")
            and module.in_features % FP8_ALIGNMENT == 0 and module.out_features % FP8_ALIGNMENT == 0)


def fp8_unavailable(device: torch.device | str) -> str | None:
    """None where FP8 can run on ``device``; otherwise why not (one sentence naming what is missing)."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"FP8 needs a CUDA GPU with compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}; " \
               f"the model is on {device.type}"
    if not torch.cuda.is_available():
        return f"FP8 needs CUDA; torch {torch.__version__} sees no CUDA device"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return (f"FP8 needs compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}; "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}")
    try:
        import torchao  # noqa: F401  (optional: GPU machines only)
    except ImportError:
        return "FP8 needs torchao: .venv/bin/pip install -r requirements/gpu.txt"
    return None


def quantize_fp8(transformer: nn.Module) -> int:
    """Convert ``transformer``'s block linear layers to FP8 in place (see the module docstring).

    Returns:
        The number of layers converted.

    Raises:
        ConfigurationError: the transformer is not on a GPU that runs FP8, or torchao is missing (the
            message says which).
    """
    device = next(transformer.parameters()).device
    reason = fp8_unavailable(device)
    if reason:
        raise ConfigurationError(reason)
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    chosen = {name for name, module in transformer.named_modules() if fp8_layer(module, name)}
    quantize_(transformer, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
              filter_fn=lambda module, name: name in chosen)
    return len(chosen)
