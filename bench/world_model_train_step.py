"""What one training step and one teacher ODE step cost, float32 against bfloat16 autocast, on this machine.

    .venv/bin/python bench/world_model_train_step.py [--preset small8] [--frames 81] [--batch 2] [--rounds 4]

The two costs that set the interaction bench's training time (``bench/world_model_training.py --twin``): the
teacher's optimiser step (:func:`~rynn_teleop.world_model.training.train.teacher_loss`, backward, AdamW) on a
batch of whole clips, and one Euler step of the teacher ODE the student's pairs are made with
(:func:`~rynn_teleop.world_model.training.flow.teacher_ode`, classifier-free guidance: the conditional and the
unconditional pass batched). Both on the preset's real networks with seeded random weights and random latents
(what the weights hold does not change the work), ``--frames`` video frames a clip (81: 21 latent frames, as the
bench's clips). Each measurement is the median of ``--reps`` calls after one warm-up call; the float32 and
bfloat16 runs alternate for ``--rounds`` rounds so that both see the same machine load, and the ratio is of the
medians over the rounds.

bfloat16 here is the trainer's ``mixed_precision: bf16``: ``torch.autocast`` on the CPU, the weights and the
optimiser state in float32. It is faster only where the CPU has bfloat16 instructions (``avx512_bf16`` or AMX;
the line records whether ``/proc/cpuinfo`` lists them).

One JSON line: ``train_step_s`` and ``ode_step_s`` for ``fp32`` and ``bf16``, their ratios (fp32 / bf16: above 1
means bfloat16 is faster) and the settings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

ODE_GUIDANCE = 1.5  # config/world_model_distill.yaml's guidance_scale: != 1, so each step runs both passes


def _median_seconds(fn, reps: int) -> float:
    fn()  # warm-up: kernel selection, allocator
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _cpu_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small8", help="model size (tiny, small, small8)")
    parser.add_argument("--frames", type=int, default=81, help="video frames a clip (1 + 4k)")
    parser.add_argument("--batch", type=int, default=2, help="clips a training step (the trainer's batch_size)")
    parser.add_argument("--reps", type=int, default=5, help="timed calls per measurement")
    parser.add_argument("--rounds", type=int, default=4, help="alternating float32 / bfloat16 rounds")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: one per core)")
    args = parser.parse_args()

    from rynn_teleop.world_model.diffusion.model import untrained_model
    from rynn_teleop.world_model.diffusion.presets import get_preset
    from rynn_teleop.world_model.diffusion.presets import latent_frames as to_latent_frames
    from rynn_teleop.world_model.training.flow import teacher_ode
    from rynn_teleop.world_model.training.train import teacher_loss

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    preset = get_preset(args.preset)
    model = untrained_model(preset, seed=0)
    dit = model.dit
    latent_frames = to_latent_frames(args.frames, preset.temporal_compression)
    h, w = preset.latent_grid
    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, preset.latent_channels, latent_frames, h, w)
    clean = torch.randn(shape, generator=generator)
    condition = torch.randn(shape, generator=generator)
    prompt = model.prompt_embeds
    dit.requires_grad_(True)  # the teacher's full fine-tune (mode: full)
    optimizer = torch.optim.AdamW(dit.parameters(), lr=1e-4)

    def train_step(bf16: bool) -> None:
        dit.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = teacher_loss(dit, clean, condition, prompt, preset.shift)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def ode_step(bf16: bool) -> None:  # teacher_ode over one Euler step (sigma 1 -> 0): one guided pass
        dit.eval()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            teacher_ode(dit, clean[:1, :, :1], condition[:1], clean[:1], [1.0, 0.0], ODE_GUIDANCE)

    dit.set_prompt(prompt)
    results: dict[str, dict[str, list[float]]] = {"fp32": {"train": [], "ode": []}, "bf16": {"train": [], "ode": []}}
    for _ in range(args.rounds):
        for name, bf16 in (("fp32", False), ("bf16", True)):
            results[name]["train"].append(_median_seconds(lambda b=bf16: train_step(b), args.reps))
            results[name]["ode"].append(_median_seconds(lambda b=bf16: ode_step(b), args.reps))
    med = {name: {k: statistics.median(v) for k, v in parts.items()} for name, parts in results.items()}
    line = {
        "bench": "world_model_train_step", "preset": preset.name, "frames": args.frames,
        "latent_frames": latent_frames, "tokens_per_clip": latent_frames * preset.tokens_per_frame, "batch": args.batch,
        "threads": torch.get_num_threads(), "cpu_bf16": _cpu_bf16(), "rounds": args.rounds, "reps": args.reps,
        "train_step_s": {k: round(v["train"], 4) for k, v in med.items()},
        "ode_step_s": {k: round(v["ode"], 4) for k, v in med.items()},
        "train_ratio_fp32_over_bf16": round(med["fp32"]["train"] / med["bf16"]["train"], 3),
        "ode_ratio_fp32_over_bf16": round(med["fp32"]["ode"] / med["bf16"]["ode"], 3),
    }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
