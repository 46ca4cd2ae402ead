"""The optimisation loop ``train`` and ``distill`` share, on HF accelerate.

One process (``rynn-teleop world-model ...`` or ``python -m``) runs plain on a CPU or one GPU; ``accelerate
launch`` runs the same script on many GPUs or nodes (DDP; FSDP through ``accelerate config``). Each process
reads its own share of the clips (:class:`StepSampler`), so the clip order depends only on the seed, the step
and the process; the noise comes from the global RNGs, which accelerate seeds per process and checkpoints.

Files under the run's output folder::

    manifest.json, control.safetensors,      the weights folder the backend loads (every checkpoint_every steps
    transformer/ or lora/                    and at the end; manifest training_step = the step)
    checkpoints/step_N/                      accelerate save_state (model, optimiser, schedule, RNGs) and
                                             trainer_state.json (step, preset, base config hash, mode)
    samples/step_N.mp4                       ground truth | generated, every sample_every steps
    logs/<command>/                          TensorBoard: loss, lr, grad_norm

Resuming (``resume: auto``) restores the step, the weights, the optimiser, the schedule and the RNGs of the
newest checkpoint; a checkpoint or weights folder of another preset or base model is refused.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.dit import StreamingWanDiT
from rynn_teleop.world_model.diffusion.presets import WanPreset
from rynn_teleop.world_model.diffusion.weights import FineTunedWeightsError, control_dims, transformer_config_hash

from .common import check_output_folder
from .config import RunConfig, RunConfigError, keys_help

_LOG = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
SAMPLES = "samples"
LOGS = "logs"
STATE_NAME = "trainer_state.json"
ADAM_BETAS = (0.9, 0.999)


@dataclass
class RunResult:
    """What a run did.

    Attributes:
        weights_dir: the weights folder written (the run's output).
        step: optimiser steps done in total (a resumed run counts the earlier ones).
        start_step: the step this invocation started from (0, or the resumed checkpoint's).
        losses: this process's loss of each optimiser step of this invocation (mean over micro-batches).
        seconds: wall time of the optimisation steps of this invocation, reading the data included, writing
            checkpoints and samples not [s].
        samples: sample videos written.
    """

    weights_dir: Path
    step: int
    start_step: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    samples: list[Path] = field(default_factory=list)


class Task(ABC):
    """One kind of run (the teacher, the student): its model, data, loss and outputs.

    :func:`fit` calls :meth:`load` (then checks the output folder and the checkpoint against the loaded base)
    and :meth:`prepare` once, then :meth:`loss` per micro-batch, :meth:`save_weights` and :meth:`sample` at
    their intervals.

    Attributes:
        preset, dit: the model size and the model (set by :meth:`load`; :meth:`prepare` sets requires_grad on
            what is trained).
        dataset, collate: the training items and their ``collate_fn`` (set by :meth:`prepare`).
    """

    command: str = "run"

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.preset: WanPreset | None = None
        self.dit: StreamingWanDiT | None = None
        self.dataset: Dataset | None = None
        self.collate: Any = None

    @abstractmethod
    def load(self, accelerator: Any) -> None:
        """Load the model parts on ``accelerator.device``; set ``preset`` and ``dit``."""

    @abstractmethod
    def prepare(self, accelerator: Any) -> None:
        """Make the training data (``dataset``, ``collate``) and set what ``dit`` trains."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        """Scalar loss of ``batch``; ``model`` is the (possibly DDP-wrapped) :class:`StreamingWanDiT`."""

    @abstractmethod
    def save_weights(self, dit: StreamingWanDiT, step: int) -> None:
        """Write the weights folder (``config.output``) from the unwrapped ``dit`` at ``step``."""

    @abstractmethod
    def sample(self, dit: StreamingWanDiT, path: Path) -> Path:
        """Write a sample video to ``path`` from the unwrapped ``dit`` (no grad; restore its training state)."""

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must agree on to be resumed (stored in ``trainer_state.json``)."""
        return {"command": self.command, "preset": self.preset.name,
                "base_config_hash": transformer_config_hash(self.dit.transformer.config),
                "mode": getattr(self.config, "mode", "")}


class StepSampler(Sampler[int]):
    """Endless clip indices for one process: epoch after epoch a permutation of ``range(size)`` seeded by
    (``seed``, epoch), dealt round-robin to the ``world`` processes; starts after ``skip`` of this process's
    items (a resumed run continues the same order)."""

    def __init__(self, size: int, seed: int, rank: int = 0, world: int = 1, skip: int = 0) -> None:
        if size < 1:
            raise ValueError("a StepSampler needs at least one item")
        self.size, self.seed, self.rank, self.world, self.skip = size, seed, rank, world, skip

    def __iter__(self) -> Iterator[int]:
        position = self.skip * self.world + self.rank  # global position of this process's next item
        while True:
            epoch, offset = divmod(position, self.size)
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
            while offset < self.size:
                yield int(order[offset])
                position += self.world
                offset += self.world
            # the next epoch continues at the same global stride


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    """Learning-rate multiplier at optimiser ``step`` (0-based): linear warm-up over ``warmup`` steps, then 1
    (``constant``) or a cosine decay reaching 0 at ``total`` (``cosine``)."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine":
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def param_groups(dit: StreamingWanDiT, config: RunConfig) -> list[dict[str, Any]]:
    """AdamW groups: the trainable transformer weights (``learning_rate``, ``weight_decay``); the control
    branch's convolution (``control_lr``, ``weight_decay``); its scale (``control_lr``, no decay)."""
    transformer = [p for p in dit.transformer.parameters() if p.requires_grad]
    conv = [p for p in dit.control.conv.parameters() if p.requires_grad]
    groups = [
        {"params": transformer, "lr": config.learning_rate, "weight_decay": config.weight_decay, "name": "dit"},
        {"params": conv, "lr": config.control_lr, "weight_decay": config.weight_decay, "name": "control"},
        {"params": [dit.control.scale], "lr": config.control_lr, "weight_decay": 0.0, "name": "control_scale"},
    ]
    return [g for g in groups if g["params"]]


def grad_norm(parameters: list[torch.nn.Parameter]) -> float:
    """Total L2 norm of the gradients of ``parameters``."""
    norms = [p.grad.detach().float().norm() for p in parameters if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


# ---- checkpoints ---------------------------------------------------------------------------------


def checkpoint_dir(output: Path, step: int) -> Path:
    return output / CHECKPOINTS / f"step_{step}"


def complete_checkpoints(output: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint with a ``trainer_state.json`` (written last), oldest first."""
    found = []
    for folder in (output / CHECKPOINTS).glob("step_*"):
        if (folder / STATE_NAME).is_file() and folder.name[5:].isdigit():
            found.append((int(folder.name[5:]), folder))
    return sorted(found)


def find_resume(config: RunConfig) -> Path | None:
    """The checkpoint folder to resume from (see ``resume`` in :class:`~.config.RunConfig`), or None.

    Raises:
        RunConfigError: ``resume`` names a folder that is not a complete checkpoint.
    """
    if config.resume == "no":
        return None
    if config.resume == "auto":
        found = complete_checkpoints(Path(config.output))
        return found[-1][1] if found else None
    folder = Path(config.resume)
    if not (folder / STATE_NAME).is_file():
        raise RunConfigError("resume", f"{folder} is not a complete checkpoint (no {STATE_NAME}); use 'auto', "
                             "'no' or a folder under <output>/checkpoints")
    return folder


def read_state(folder: Path, identity: dict[str, Any]) -> int:
    """The step of checkpoint ``folder`` after checking it was written by a run of the same ``identity``.

    Raises:
        FineTunedWeightsError: another preset or base model.
        RunConfigError: another command or mode.
    """
    state = json.loads((folder / STATE_NAME).read_text())
    differences = [f"{key}: found {state.get(key)!r}, expected {identity[key]!r}"
                   for key in ("preset", "base_config_hash") if state.get(key) != identity[key]]
    if differences:
        raise FineTunedWeightsError(folder, differences + ["the checkpoint is of another base model or preset"])
    for key in ("command", "mode"):
        if state.get(key) != identity[key]:
            raise RunConfigError(key if key == "mode" else "resume", f"checkpoint {folder} was written with "
                                 f"{key} {state.get(key)!r}, this run has {identity[key]!r}; resume: no starts "
                                 "afresh")
    return int(state["step"])


# ---- the loop ------------------------------------------------------------------------------------


def make_accelerator(config: RunConfig) -> Any:
    """An ``accelerate.Accelerator`` for ``config`` (resolved for this machine), logging to TensorBoard under
    ``output/logs``."""
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    output = Path(config.output)
    project = ProjectConfiguration(project_dir=str(output), logging_dir=str(output / LOGS))
    # cpu=True also where there is no GPU: only then does accelerate join the processes of a torchrun launch
    # (gloo); with cpu=False each would run alone and write the same output
    cpu = config.cpu or not torch.cuda.is_available()
    return Accelerator(mixed_precision=config.mixed_precision, cpu=cpu, log_with="tensorboard",
                       project_config=project)


def _hparams(config: RunConfig) -> dict[str, Any]:
    """The config as TensorBoard hyper-parameters (numbers, strings and booleans only)."""
    return {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in config.to_dict().items()}


def fit(task: Task) -> RunResult:
    """Run ``task`` to ``config.steps`` (see the module docstring) and return what it did.

    Raises:
        ConfigurationError: any input the task refuses (dataset, base, prompt, teacher, checkpoint).
        FineTunedWeightsError: the output folder or the checkpoint holds weights of another base or preset.
    """
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    config = task.config.resolved(torch.cuda.is_available())
    task.config = config
    output = Path(config.output)
    accelerator = make_accelerator(config)
    set_seed(config.seed, device_specific=True)
    task.load(accelerator)
    dit = task.dit
    check_output_folder(output, dit.transformer, task.preset)
    resume_from = find_resume(config)
    start = read_state(resume_from, task.identity()) if resume_from is not None else 0
    task.prepare(accelerator)

    if config.gradient_checkpointing:
        dit.transformer.enable_gradient_checkpointing()
    dit.train()
    trainable = [p for p in dit.parameters() if p.requires_grad]
    if not trainable:
        raise RuntimeError(f"{task.command}: nothing to train (no parameter requires grad)")
    optimizer = torch.optim.AdamW(param_groups(dit, config), betas=ADAM_BETAS)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, config.warmup_steps, config.steps, config.lr_schedule))
    # the schedule is stepped here once per optimiser step (accelerate would step it once per process)
    model, optimizer = accelerator.prepare(dit, optimizer)
    accelerator.register_for_checkpointing(schedule)
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        _LOG.info("%s: resumed from %s at step %d", task.command, resume_from, start)

    micro = config.gradient_accumulation
    # its own generator: creating the iterator must not draw from the global RNG a checkpoint restores
    loader = DataLoader(task.dataset, batch_size=config.batch_size, collate_fn=task.collate,
                        num_workers=config.num_workers, generator=torch.Generator().manual_seed(config.seed),
                        sampler=StepSampler(len(task.dataset), config.seed, accelerator.process_index,
                                            accelerator.num_processes, skip=start * micro * config.batch_size))
    result = RunResult(weights_dir=output, step=start, start_step=start)
    if start >= config.steps:
        _LOG.info("%s: already at step %d of %d", task.command, start, config.steps)
        return result
    accelerator.init_trackers(task.command, config=_hparams(config))
    batches = iter(loader)
    bar = tqdm(total=config.steps, initial=start, desc=task.command, unit="step", dynamic_ncols=True,
               disable=not accelerator.is_main_process)
    begin = time.perf_counter()
    try:
        for step in range(start + 1, config.steps + 1):
            total = torch.zeros((), device=accelerator.device)
            for m in range(micro):
                sync = nullcontext() if m == micro - 1 else accelerator.no_sync(model)
                with sync:
                    loss = task.loss(model, next(batches), accelerator.device)
                    accelerator.backward(loss / micro)
                total += loss.detach() / micro
            if config.max_grad_norm > 0:
                norm = float(accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm))
            else:
                norm = grad_norm(trainable)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            value = float(total)
            result.losses.append(value)
            result.step = step
            bar.update(1)
            if step % config.log_every == 0 or step == config.steps:
                mean = float(accelerator.gather(total[None]).mean())
                accelerator.log({"loss": mean, "lr": schedule.get_last_lr()[0], "grad_norm": norm}, step=step)
                bar.set_postfix(loss=f"{mean:.4f}")
            final = step == config.steps
            if final or (config.checkpoint_every and step % config.checkpoint_every == 0):
                result.seconds += time.perf_counter() - begin
                save_checkpoint(accelerator, task, model, output, step)
                begin = time.perf_counter()
            if config.sample_every and (final or step % config.sample_every == 0):
                result.seconds += time.perf_counter() - begin
                path = write_sample(accelerator, task, model, output, step)
                if path is not None:
                    result.samples.append(path)
                begin = time.perf_counter()
        result.seconds += time.perf_counter() - begin
    finally:
        bar.close()
        accelerator.end_training()
    return result


def rebuilt(dit: StreamingWanDiT, state: dict[str, torch.Tensor]) -> StreamingWanDiT:
    """A new :class:`StreamingWanDiT` on the CPU with ``dit``'s architecture and peft adapters, holding ``state``
    (a full state dict of ``dit``, e.g. gathered from FSDP shards).

    Raises:
        RuntimeError: ``state`` does not fit (missing or unexpected keys, other shapes).
    """
    from diffusers import WanTransformer3DModel

    from rynn_teleop.world_model.diffusion.dit import ControlBranch

    transformer = WanTransformer3DModel.from_config(dict(dit.transformer.config))
    for name, adapter in (getattr(dit.transformer, "peft_config", None) or {}).items():
        transformer.add_adapter(adapter, adapter_name=name)
    dims = control_dims(dit.control)
    out = StreamingWanDiT(transformer, ControlBranch(dims.latent_channels, dims.inner_dim, dims.patch_size))
    out.load_state_dict({k: v.detach().to("cpu") for k, v in state.items()}, strict=True)
    return out


def weights_source(accelerator: Any, model: torch.nn.Module) -> StreamingWanDiT | None:
    """The model to write the weights folder from, on the main process (None on the others): the unwrapped
    model, or under FSDP a CPU copy of the gathered full state dict (every process must call this)."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.FSDP:
        state = accelerator.get_state_dict(model)  # a collective: every process takes part
        return rebuilt(accelerator.unwrap_model(model), state) if accelerator.is_main_process else None
    return accelerator.unwrap_model(model) if accelerator.is_main_process else None


def save_checkpoint(accelerator: Any, task: Task, model: torch.nn.Module, output: Path, step: int) -> Path:
    """Write the weights folder (main process) and a resumable checkpoint at ``step``; prune old checkpoints."""
    accelerator.wait_for_everyone()
    source = weights_source(accelerator, model)
    if source is not None:
        task.save_weights(source, step)
    folder = checkpoint_dir(output, step)
    accelerator.save_state(str(folder))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state = {"step": step, **task.identity()}
        (folder / STATE_NAME).write_text(json.dumps(state, indent=1) + "\n")
        keep = task.config.keep_checkpoints
        if keep:
            for _, old in complete_checkpoints(output)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    return folder


def write_sample(accelerator: Any, task: Task, model: torch.nn.Module, output: Path, step: int) -> Path | None:
    """Write ``samples/step_N.mp4`` on the main process (the others wait); not under FSDP (the weights are
    sharded; sample from the weights folder instead)."""
    from accelerate.utils import DistributedType

    path = None
    if accelerator.distributed_type == DistributedType.FSDP:
        _LOG.warning("%s: no sample video under FSDP (step %d)", task.command, step)
        return None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        path = task.sample(accelerator.unwrap_model(model), output / SAMPLES / f"step_{step}.mp4")
    accelerator.wait_for_everyone()
    return path


# ---- command line (train and distill) ----------------------------------------------------------


def add_run_arguments(parser: argparse.ArgumentParser, example: str, config_cls: type[RunConfig]) -> None:
    """``CONFIG`` and repeatable ``--set KEY=VALUE`` of a run command (``example``: the documented config); the
    help lists every key of ``config_cls`` from its declarations."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = keys_help(config_cls)
    parser.add_argument("config", help=f"the run's YAML file (keys: below; an example: {example})")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one key of the file (the value is read as YAML); repeatable")


def run_from_cli(args: argparse.Namespace, config_cls: type[RunConfig], run: Callable[[Any], RunResult],
                 what: str) -> int:
    """Read the run config of ``args``, ``run`` it and print one line about the weights written (``what``: the
    model's name); ConfigurationError propagates to the caller."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    result = run(config_cls.from_file(args.config, args.overrides))
    if int(os.environ.get("RANK", "0")) == 0:  # one line per run, not per process of a distributed launch
        print(f"{result.weights_dir}: {what} at step {result.step} (this run: steps {result.start_step + 1}.."
              f"{result.step}, {result.seconds:.1f} s)")
    return 0


def module_main(argv: list[str] | None, command: str, description: str,
                add_arguments: Callable[[argparse.ArgumentParser], None],
                run_cli: Callable[[argparse.Namespace], int]) -> int:
    """``python -m`` entry of a run command (the script ``accelerate launch`` runs): errors as one line, exit 2."""
    parser = argparse.ArgumentParser(prog=f"rynn-teleop world-model {command}", description=description)
    add_arguments(parser)
    try:
        return run_cli(parser.parse_args(argv))
    except ConfigurationError as error:
        print(f"rynn-teleop world-model {command}: error: {error}", file=sys.stderr)
        return 2
