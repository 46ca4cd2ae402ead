"""Run configurations of ``train`` and ``distill``: one YAML file per run, every key declared once (torch-free).

A YAML file is a flat mapping of the keys below; ``--set key=value`` on the command line overrides one key
(the value is parsed as YAML). Each key is declared once, as a node parameter is: a
:class:`~rynn_teleop.core.params.Param` with its type, default, units and range (:func:`describe` prints
them, the ``--help`` of ``train`` and ``distill`` lists them); an unknown key ("did you mean"), a missing
required key, a value of the wrong type or out of range raises a :class:`RunConfigError` that names the file,
the key and what is allowed, in the words a bad node parameter gets. Relative paths are relative to the
working directory of the command.

Values that depend on the machine default to ``auto``: ``mixed_precision`` is ``bf16`` on CUDA and ``no``
on the CPU; ``gradient_checkpointing`` is on with CUDA and off on the CPU (:meth:`RunConfig.resolved`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import yaml

from rynn_teleop.core.params import nonempty
from rynn_teleop.core.settings import Settings, setting
from rynn_teleop.core.yamlfile import read_yaml
from rynn_teleop.errors import ParameterError
from rynn_teleop.world_model.diffusion.composite import CompositeSettings
from rynn_teleop.world_model.diffusion.presets import PRESETS

#: the ramp of the change map ``change_loss_weight`` weights the loss by (0 at ``low`` levels of smoothed change
#: from the clip's first frame, 1 at ``high``): the compositing thresholds the measured runs were trained with,
#: fixed here so that retuning the serving thresholds (:class:`CompositeSettings`' defaults) leaves training as is
CHANGE_RAMP = CompositeSettings(low=9.0, high=30.0, blur_px=1.5)

TIMESTEP_SCALE = 1000  # the DiT's timestep of pure noise
AUTO = "auto"
DEFAULT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2")


class RunConfigError(ParameterError):
    """A run configuration (YAML file or ``--set``) is invalid.

    Attributes:
        key: the key the message is about (None: the file as a whole).
        source: the file (or ``"--set"``) the value came from, when known.
        detail: the message without the source.
    """

    def __init__(self, key: str | None, message: str, source: str | None = None) -> None:
        if key is not None and repr(key) not in message:  # the message names its key
            message = f"parameter {key!r}: {message}"
        super().__init__(key, f"{source}: {message}" if source else message)
        self.source, self.detail = source, message


def _path(doc: str, default: Any = dataclasses.MISSING) -> Any:
    """A key holding a path (a non-empty string); no default: the key is required."""
    if default is dataclasses.MISSING:
        return setting(description=doc, type=str, check=nonempty)
    return setting(default, doc, check=nonempty)


C = TypeVar("C", bound="RunConfig")


@dataclass(frozen=True, kw_only=True)
class RunConfig(Settings):
    """What every training run reads (see the module docstring); :class:`TrainConfig` and
    :class:`DistillConfig` add their own keys.

    Raises:
        RunConfigError: on construction, naming the first invalid key.
    """

    command: ClassVar[str] = "run"
    SETTINGS_NAME: ClassVar[str] = "run"  # the command, in messages
    SETTINGS_WHAT: ClassVar[str] = "run config"

    dataset: str = _path("dataset folder (rynn-teleop world-model dataset ... --out DIR)")
    base_dir: str = _path("the Wan2.2 base release folder (vae/, transformer/) of the preset")
    prompt_file: str = _path("the fixed prompt's embedding (rynn-teleop world-model encode-prompt)")
    output: str = _path("the weights folder this run writes (world_model's diffusion.weights_dir); it also holds "
                        "checkpoints/, samples/ and logs/")
    preset: str = setting("tiny", "model size; the dataset must be built for it", choices=tuple(PRESETS))
    base_model_id: str = setting("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "where the base came from (written to the "
                                 "manifest; informative)")
    steps: int = setting(1000, "optimiser steps of the run (a resumed run continues up to this)", units="steps",
                         min=1, max=10**9)
    batch_size: int = setting(1, "clips per optimiser step and process", units="clips", min=1, max=4096)
    gradient_accumulation: int = setting(1, "micro-batches of batch_size accumulated per optimiser step", min=1,
                                         max=4096)
    clip_frames: int = setting(0, "train on the first N frames of each clip (1 + 4k, >= 5); 0: whole clips "
                               "(clips of a batch are cut to the shortest)", units="frames", min=0, max=10**6)
    learning_rate: float = setting(1e-4, "AdamW learning rate of the transformer (or its LoRA adapter)", min=0.0,
                                   max=1.0)
    control_learning_rate: float = setting(0.0, "learning rate of the control branch; 0: learning_rate", min=0.0,
                                           max=1.0)
    weight_decay: float = setting(0.0, "AdamW weight decay (not on the control scale)", min=0.0, max=1.0)
    warmup_steps: int = setting(0, "linear warm-up of the learning rate from 0", units="steps", min=0, max=10**9)
    lr_schedule: str = setting("constant", "after warm-up: constant, or cosine decay to 0 at `steps`",
                               choices=("constant", "cosine"))
    max_grad_norm: float = setting(1.0, "gradient clipping (total L2 norm); 0: no clipping", min=0.0, max=1e6)
    seed: int = setting(0, "seed of the noise, the timesteps and the clip order", min=0, max=2**31 - 1)
    mixed_precision: str = setting(AUTO, "autocast dtype (weights stay float32); auto: bf16 on CUDA, no on the "
                                   "CPU", choices=(AUTO, "no", "bf16"))
    gradient_checkpointing: Any = setting(AUTO, "recompute the transformer's activations in the backward pass "
                                          "(memory for time); auto: on with CUDA", type=bool, also=(AUTO,))
    anchor_black_condition: float = setting(0.5, "probability that a clip's anchor (first frame) gets the "
                                            "condition latents of a black image, as the node's first reset gives "
                                            "the engine; otherwise its own, as a re-anchoring does", min=0.0,
                                            max=1.0)
    change_loss_weight: float = setting(0.0, "extra loss weight where a clip differs from its first frame: a "
                                        "latent cell's error counts 1 + w * change, change in [0, 1] on the "
                                        "change ramp (CHANGE_RAMP: 9 to 30 levels, 1.5 px blur) from the true "
                                        "frames; weights normalised to mean 1; 0: a plain mean (when > 0 the clips' "
                                        "frames are read beside stored latents)", min=0.0, max=100.0)
    cpu: bool = setting(False, "run on the CPU even where CUDA is available")
    num_workers: int = setting(0, "DataLoader worker processes reading clips (0: in the main process)", min=0,
                               max=256)
    cache_latents: bool = setting(True, "keep the VAE latents of clips without stored latents in host memory "
                                  "after their first encoding (the VAE is frozen); for a large dataset store the "
                                  "latents in it instead")
    log_every: int = setting(10, "TensorBoard scalars (loss, lr, grad norm) every N steps", units="steps", min=1,
                             max=10**9)
    checkpoint_every: int = setting(500, "write the weights folder and a resumable checkpoint every N steps (and at "
                                    "the end); 0: only at the end", units="steps", min=0, max=10**9)
    keep_checkpoints: int = setting(2, "resumable checkpoints kept in output/checkpoints (older ones are deleted); "
                                    "0: keep all", min=0, max=10**6)
    sample_every: int = setting(0, "write a sample video (ground truth | generated) of one held-out clip to "
                                "output/samples/step_N.mp4 every N steps (and at the end); 0: never", units="steps",
                                min=0, max=10**9)
    resume: str = _path("auto: continue from the newest checkpoint in output/checkpoints, if any; no: start "
                        "afresh (existing checkpoints are ignored); else a checkpoint folder", AUTO)

    def _error(self, key: str, message: str) -> RunConfigError:
        return RunConfigError(key, message)

    def _problems(self) -> Iterator[tuple[str, str]]:
        """(key, message) of each inconsistency between keys."""
        if self.clip_frames and (self.clip_frames < 5 or (self.clip_frames - 1) % 4):
            yield "clip_frames", f"{self.clip_frames} is not 0 or 1 + 4k with k >= 1 (5, 9, ..., 81)"

    @property
    def change_settings(self) -> CompositeSettings | None:
        """The ramp of the change map the loss is weighted by (:data:`CHANGE_RAMP`); None when
        ``change_loss_weight`` is 0."""
        return CHANGE_RAMP if self.change_loss_weight > 0 else None

    # ---- machine-dependent values --------------------------------------------------------------------
    def resolved(self, cuda: bool) -> RunConfig:
        """This config with ``auto`` values decided for a machine with (``cuda``) or without CUDA."""
        on_cuda = cuda and not self.cpu
        precision = self.mixed_precision if self.mixed_precision != AUTO else ("bf16" if on_cuda else "no")
        checkpointing = self.gradient_checkpointing
        if checkpointing == AUTO:
            checkpointing = on_cuda
        return dataclasses.replace(self, mixed_precision=precision, gradient_checkpointing=checkpointing)

    @property
    def control_lr(self) -> float:
        """Learning rate of the control branch."""
        return self.control_learning_rate or self.learning_rate

    # ---- files ----------------------------------------------------------------------------------------
    @classmethod
    def required(cls) -> list[str]:
        """Keys without a default."""
        return [p.name for p in cls.params() if p.required]

    @classmethod
    def from_mapping(cls: type[C], values: Mapping[str, Any], source: str = "") -> C:
        """A config from ``values`` (key -> value); ``source`` names where they came from in messages.

        Raises:
            RunConfigError: an unknown key (the message lists the allowed ones and the closest), a missing
                required key, a value of the wrong type or out of range, inconsistent keys.
        """
        try:
            validated = cls.schema().validate(values)
        except ParameterError as error:
            raise RunConfigError(error.key, str(error), source or None) from None
        try:
            return cls(**validated)
        except RunConfigError as error:
            raise RunConfigError(error.key, error.detail, source or None) from None

    @classmethod
    def from_file(cls: type[C], path: str | os.PathLike, overrides: Sequence[str] = ()) -> C:
        """The config in the YAML file ``path``, with ``overrides`` (``key=value``, value parsed as YAML).

        Raises:
            RunConfigError: a missing or malformed file (with the line), an override without ``=``, or any
                problem of :meth:`from_mapping` (naming the file, or ``--set`` for an override).
        """
        shown = os.fspath(path)
        data = read_yaml(path, f"{cls.command} config", error=functools.partial(RunConfigError, None))
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RunConfigError(None, f"expected a mapping of keys at the top level, got {type(data).__name__}",
                                 shown)
        values = {str(k): v for k, v in data.items()}
        set_keys = set()
        for item in overrides:
            key, sep, text = item.partition("=")
            if not sep or not key.strip():
                raise RunConfigError(None, f"{item!r} is not key=value", "--set")
            try:
                values[key.strip()] = yaml.safe_load(text)
            except yaml.YAMLError as error:
                raise RunConfigError(key.strip(), f"value {text!r} is not YAML: {error}", "--set") from None
            set_keys.add(key.strip())
        try:
            return cls.from_mapping(values)
        except RunConfigError as error:
            where = "--set" if error.key in set_keys else shown
            raise RunConfigError(error.key, error.detail, where) from None

    def to_dict(self) -> dict[str, Any]:
        """Key -> value (tuples as lists), as a YAML file would hold it."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class TrainConfig(RunConfig):
    """``rynn-teleop world-model train``: the stage-1 teacher (see :mod:`.train`)."""

    command: ClassVar[str] = "train"
    SETTINGS_NAME: ClassVar[str] = "train"

    mode: str = setting("full", "full: every transformer weight is trained; lora: a LoRA adapter (peft) on the "
                        "frozen base; the control branch is trained in both", choices=("full", "lora"))
    lora_rank: int = setting(32, "LoRA rank (mode lora)", min=1, max=4096)
    lora_alpha: float = setting(32.0, "LoRA alpha (the update is scaled by alpha / rank)", min=0.0, max=1e6)
    lora_targets: tuple[str, ...] = setting(DEFAULT_LORA_TARGETS, "transformer modules (name suffixes) that get "
                                            "a LoRA adapter")
    condition_dropout: float = setting(0.1, "probability that a clip's condition latents are zeroed (the "
                                       "unconditional model of classifier-free guidance)", min=0.0, max=1.0)
    sample_steps: int = setting(24, "Euler steps of the teacher's sample videos", units="steps", min=1, max=10000)
    sample_guidance: float = setting(1.0, "classifier-free guidance scale of the sample videos (1: none)", min=0.0,
                                     max=100.0)

    def _problems(self) -> Iterator[tuple[str, str]]:
        yield from super()._problems()
        if self.mode == "lora" and not self.lora_targets:
            yield "lora_targets", "mode lora needs at least one target module"


@dataclass(frozen=True, kw_only=True)
class DistillConfig(RunConfig):
    """``rynn-teleop world-model distill``: the causal 4-step student (see :mod:`.distill`).

    The student's timesteps, block, window and sink are the preset's (what the node runs).
    """

    command: ClassVar[str] = "distill"
    SETTINGS_NAME: ClassVar[str] = "distill"

    teacher: str = _path("the teacher's weights folder (the output of `train`)")
    mode: str = setting("full", "full: every transformer weight is trained; lora: the teacher's LoRA adapter (a "
                        "LoRA teacher only) keeps training", choices=("full", "lora"))
    stage: str = setting("ode", "ode: CausVid's ODE-pair regression (stage A); dmd: distribution matching "
                         "distillation (stage B, DMD2 without backward simulation), normally from a stage-A "
                         "student given as `init`", choices=("ode", "dmd"))
    init: str = setting("", "the student's starting weights folder (normally the output of a stage-A run); "
                        "empty: the teacher's weights")
    teacher_steps: int = setting(48, "Euler steps of the teacher's ODE from noise, on a uniform timestep grid that "
                                 "must hold every student timestep (a multiple of 4 for 1000/750/500/250)",
                                 units="steps", min=1, max=100000)
    guidance_scale: float = setting(1.5, "classifier-free guidance of the teacher's ODE on the condition (zero "
                                    "condition latents = unconditional); 1: none", min=0.0, max=100.0)
    ode_pairs_per_clip: int = setting(1, "teacher trajectories (noise draws) per training clip, computed once "
                                      "before training into output/ode_pairs", min=1, max=10000)
    critic_learning_rate: float = setting(1e-4, "stage dmd: AdamW learning rate of the critic (the fake score, a "
                                          "trainable copy of the teacher); 0: the critic stays the teacher",
                                          min=0.0, max=1.0)
    critic_steps_per_step: int = setting(5, "stage dmd: critic updates per student update (DMD2's two time-scale "
                                         "rule: the critic tracks the moving student distribution)", min=1,
                                         max=1000)
    dmd_guidance_scale: float = setting(0.0, "stage dmd: classifier-free guidance of the real score (the frozen "
                                        "teacher; zero condition latents = unconditional); 0: guidance_scale",
                                        min=0.0, max=100.0)
    dmd_timestep_min: float = setting(0.02, "stage dmd: lowest noise level of the distribution-matching gradient, "
                                      "as a fraction of the unshifted schedule (the level is shifted by the "
                                      "preset's shift)", min=0.0, max=1.0)
    dmd_timestep_max: float = setting(0.98, "stage dmd: highest noise level of the distribution-matching gradient "
                                      "(fraction of the unshifted schedule)", min=0.0, max=1.0)
    context: str = setting("frontier", "how earlier blocks are shown during training: frontier (blocks before a "
                           "random block are clean at timestep 0, as the cache holds them when serving; later "
                           "ones noisy) or noisy (every block at its own noise level, CausVid's diffusion "
                           "forcing)", choices=("frontier", "noisy"))

    def _problems(self) -> Iterator[tuple[str, str]]:
        yield from super()._problems()
        if os.path.abspath(self.output) == os.path.abspath(self.teacher):
            yield "output", f"{self.output!r} is the teacher's folder; the student needs its own"
        if self.init and os.path.abspath(self.output) == os.path.abspath(self.init):
            yield "output", f"{self.output!r} is the init folder; the student needs its own"
        if self.change_loss_weight and self.stage != "ode":
            yield "change_loss_weight", "only stage ode weights its loss by the change map (stage dmd: leave it 0)"
        if self.init and self.stage != "dmd":
            yield "init", "only stage dmd starts from other weights than the teacher's (stage ode: leave it empty)"
        if self.dmd_timestep_min >= self.dmd_timestep_max:
            yield "dmd_timestep_min", (f"{self.dmd_timestep_min:g} is not below dmd_timestep_max "
                                       f"{self.dmd_timestep_max:g}")
        timesteps = PRESETS[self.preset].timesteps
        if any((TIMESTEP_SCALE - t) * self.teacher_steps % TIMESTEP_SCALE for t in timesteps):
            yield "teacher_steps", (f"{self.teacher_steps} steps from 1000 to 0 miss some of the student's timesteps "
                                    f"{list(timesteps)} (preset {self.preset!r}); the grid must hold each of them")

    @property
    def real_guidance(self) -> float:
        """The classifier-free guidance of the real score (stage dmd)."""
        return self.dmd_guidance_scale or self.guidance_scale


def describe(cls: type[RunConfig]) -> str:
    """A commented YAML listing of every key of ``cls`` with its default (required keys commented out), from
    the same declarations that validate a run's file."""
    return cls.schema().to_yaml(ros=False)


def keys_help(cls: type[RunConfig]) -> str:
    """One line per key of ``cls``: its name and description with units, range and default (``--help``)."""
    lines = [f"keys of a {cls.command} CONFIG.yaml (--set KEY=VALUE overrides one):"]
    for param in cls.params():
        default = "" if param.required else f"; default {param.default!r}"
        lines.append(f"  {param.name}: {param.describe()}{default}")
    return "\n".join(lines)
