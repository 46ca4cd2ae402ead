"""Run configurations of ``train`` and ``distill``: one YAML file per run, every key declared once (torch-free).

A YAML file is a flat mapping of the keys below; ``--set key=value`` on the command line overrides one key
(the value is parsed as YAML). Each key is declared once with its type, default, units and range
(:func:`describe` prints them); an unknown key, a value of the wrong type or out of range raises a
:class:`RunConfigError` that names the file, the key and what is allowed. Relative paths are relative to the
working directory of the command.

Values that depend on the machine default to ``auto``: ``mixed_precision`` is ``bf16`` on CUDA and ``no``
on the CPU; ``gradient_checkpointing`` is on with CUDA and off on the CPU (:meth:`RunConfig.resolved`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import yaml

from rynn_teleop.core.yamlfile import read_yaml
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.presets import PRESETS

TIMESTEP_SCALE = 1000  # the DiT's timestep of pure noise
AUTO = "auto"
DEFAULT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2")


class RunConfigError(ConfigurationError):
    """A run configuration (YAML file or ``--set``) is invalid.

    Attributes:
        key: the key the message is about (None: the file as a whole).
        source: the file (or ``"--set"``) the value came from, when known.
    """

    def __init__(self, key: str | None, message: str, source: str | None = None) -> None:
        where = f"{source}: " if source else ""
        what = f"key {key!r}: " if key else ""
        super().__init__(f"{where}{what}{message}")
        self.key, self.source, self.detail = key, source, message


def option(default: Any = dataclasses.MISSING, doc: str = "", *, kind: str, units: str = "",
           min: float | None = None, max: float | None = None, choices: Sequence[Any] | None = None) -> Any:
    """A dataclass field with its declaration (see :class:`Spec`); no ``default``: the key is required."""
    spec = Spec(kind, doc, units, min, max, tuple(choices) if choices is not None else None)
    if isinstance(default, (list, tuple)):
        value = tuple(default)
        return field(default_factory=lambda: value, metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


@dataclass(frozen=True)
class Spec:
    """Declaration of one key.

    Attributes:
        kind: ``"str"``, ``"path"`` (a non-empty string), ``"int"``, ``"float"``, ``"bool"``, ``"bool|auto"``
            (true, false or "auto") or ``"list[str]"``.
        doc: what the key means.
        units: of the value, e.g. ``"steps"``, ``"1/step"``.
        min, max: inclusive bounds of a number.
        choices: the allowed values.
    """

    kind: str
    doc: str
    units: str = ""
    min: float | None = None
    max: float | None = None
    choices: tuple[Any, ...] | None = None

    def allowed(self) -> str:
        """What the key accepts, in words."""
        parts = [self.kind.replace("path", "str")]
        if self.min is not None or self.max is not None:
            low = "(-inf" if self.min is None else f"[{self.min:g}"
            high = "+inf)" if self.max is None else f"{self.max:g}]"
            parts.append(f"in {low}, {high}" + (f" {self.units}" if self.units else ""))
        elif self.units:
            parts.append(f"[{self.units}]")
        if self.choices is not None:
            parts.append(f"one of {list(self.choices)}")
        return " ".join(parts)

    def check(self, key: str, value: Any) -> Any:
        """``value`` coerced to this key's type.

        Raises:
            RunConfigError: wrong type, out of range, not a choice.
        """
        def bad(why: str) -> RunConfigError:
            return RunConfigError(key, f"{value!r} {why}; expected {self.allowed()}")

        kind = self.kind
        if kind == "bool|auto":
            if value == AUTO or isinstance(value, bool):
                return value
            raise bad("is neither true, false nor 'auto'")
        if kind == "bool":
            if not isinstance(value, bool):
                raise bad(f"has type {type(value).__name__}")
            return value
        if kind in ("str", "path"):
            if not isinstance(value, str):
                raise bad(f"has type {type(value).__name__}")
            if kind == "path" and not value:
                raise bad("is empty")
        elif kind == "list[str]":
            if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
                raise bad("is not a list of strings")
            value = tuple(value)
        elif kind in ("int", "float"):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise bad(f"has type {type(value).__name__}")
            if kind == "int":
                if not isinstance(value, numbers.Integral):
                    raise bad("is not an integer")
                value = int(value)
            else:
                value = float(value)
                if not math.isfinite(value):
                    raise bad("is not finite")
            if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
                raise bad("is out of range")
        else:  # a declaration error, not a user's
            raise TypeError(f"unknown kind {kind!r} of key {key!r}")
        if self.choices is not None and value not in self.choices:
            raise bad("is not allowed")
        return value


C = TypeVar("C", bound="RunConfig")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What every training run reads (see the module docstring); :class:`TrainConfig` and
    :class:`DistillConfig` add their own keys.

    Raises:
        RunConfigError: on construction, naming the first invalid key.
    """

    command: ClassVar[str] = "run"

    dataset: str = option(kind="path", doc="dataset folder (rynn-teleop world-model dataset ... --out DIR)")
    base_dir: str = option(kind="path", doc="the Wan2.2 base release folder (vae/, transformer/) of the preset")
    prompt_file: str = option(kind="path", doc="the fixed prompt's embedding (rynn-teleop world-model encode-prompt)")
    output: str = option(kind="path", doc="the weights folder this run writes (world_model's diffusion.weights_dir)"
                         "; it also holds checkpoints/, samples/ and logs/")
    preset: str = option("tiny", "model size; the dataset must be built for it", kind="str",
                         choices=("tiny", "paper"))
    base_model_id: str = option("Wan-AI/Wan2.2-TI2V-5B-Diffusers", "where the base came from (written to the "
                                "manifest; informative)", kind="str")
    steps: int = option(1000, "optimiser steps of the run (a resumed run continues up to this)", kind="int",
                        units="steps", min=1, max=10**9)
    batch_size: int = option(1, "clips per optimiser step and process", kind="int", units="clips", min=1, max=4096)
    gradient_accumulation: int = option(1, "micro-batches of batch_size accumulated per optimiser step",
                                        kind="int", min=1, max=4096)
    clip_frames: int = option(0, "train on the first N frames of each clip (1 + 4k, >= 5); 0: whole clips "
                              "(clips of a batch are cut to the shortest)", kind="int", units="frames", min=0,
                              max=10**6)
    learning_rate: float = option(1e-4, "AdamW learning rate of the transformer (or its LoRA adapter)",
                                  kind="float", min=0.0, max=1.0)
    control_learning_rate: float = option(0.0, "learning rate of the control branch; 0: learning_rate",
                                          kind="float", min=0.0, max=1.0)
    weight_decay: float = option(0.0, "AdamW weight decay (not on the control scale)", kind="float", min=0.0,
                                 max=1.0)
    warmup_steps: int = option(0, "linear warm-up of the learning rate from 0", kind="int", units="steps", min=0,
                               max=10**9)
    lr_schedule: str = option("constant", "after warm-up: constant, or cosine decay to 0 at `steps`", kind="str",
                              choices=("constant", "cosine"))
    max_grad_norm: float = option(1.0, "gradient clipping (total L2 norm); 0: no clipping", kind="float",
                                  min=0.0, max=1e6)
    seed: int = option(0, "seed of the noise, the timesteps and the clip order", kind="int", min=0,
                       max=2**31 - 1)
    mixed_precision: str = option(AUTO, "autocast dtype (weights stay float32); auto: bf16 on CUDA, no on the CPU",
                                  kind="str", choices=(AUTO, "no", "bf16"))
    gradient_checkpointing: Any = option(AUTO, "recompute the transformer's activations in the backward pass "
                                         "(memory for time); auto: on with CUDA", kind="bool|auto")
    anchor_black_condition: float = option(0.5, "probability that a clip's anchor (first frame) gets the condition "
                                           "latents of a black image, as the node's first reset gives the engine; "
                                           "otherwise its own, as a re-anchoring does", kind="float", min=0.0,
                                           max=1.0)
    cpu: bool = option(False, "run on the CPU even where CUDA is available", kind="bool")
    num_workers: int = option(0, "DataLoader worker processes reading clips (0: in the main process)",
                              kind="int", min=0, max=256)
    cache_latents: bool = option(True, "keep the VAE latents of clips without stored latents in host memory "
                                 "after their first encoding (the VAE is frozen); for a large dataset store the "
                                 "latents in it instead", kind="bool")
    log_every: int = option(10, "TensorBoard scalars (loss, lr, grad norm) every N steps", kind="int",
                            units="steps", min=1, max=10**9)
    checkpoint_every: int = option(500, "write the weights folder and a resumable checkpoint every N steps "
                                   "(and at the end); 0: only at the end", kind="int", units="steps", min=0,
                                   max=10**9)
    keep_checkpoints: int = option(2, "resumable checkpoints kept in output/checkpoints (older ones are "
                                   "deleted); 0: keep all", kind="int", min=0, max=10**6)
    sample_every: int = option(0, "write a sample video (ground truth | generated) of one held-out clip to "
                               "output/samples/step_N.mp4 every N steps (and at the end); 0: never", kind="int",
                               units="steps", min=0, max=10**9)
    resume: str = option(AUTO, "auto: continue from the newest checkpoint in output/checkpoints, if any; no: "
                         "start afresh (existing checkpoints are ignored); else a checkpoint folder",
                         kind="path")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            spec = f.metadata.get("spec")
            if spec is not None:
                object.__setattr__(self, f.name, spec.check(f.name, getattr(self, f.name)))
        for key, message in self._problems():
            raise RunConfigError(key, message)

    def _problems(self) -> Iterator[tuple[str, str]]:
        """(key, message) of each inconsistency between keys."""
        if self.clip_frames and (self.clip_frames < 5 or (self.clip_frames - 1) % 4):
            yield "clip_frames", f"{self.clip_frames} is not 0 or 1 + 4k with k >= 1 (5, 9, ..., 81)"

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
    def specs(cls) -> dict[str, Spec]:
        """key -> declaration, in declaration order."""
        return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls) if "spec" in f.metadata}

    @classmethod
    def required(cls) -> list[str]:
        """Keys without a default."""
        return [f.name for f in dataclasses.fields(cls) if "spec" in f.metadata
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]

    @classmethod
    def from_mapping(cls: type[C], values: Mapping[str, Any], source: str = "") -> C:
        """A config from ``values`` (key -> value); ``source`` names where they came from in messages.

        Raises:
            RunConfigError: an unknown key (the message lists the allowed ones), a missing required key, a
                value of the wrong type or out of range.
        """
        specs = cls.specs()
        for key in values:
            if key not in specs:
                close = difflib.get_close_matches(str(key), list(specs), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise RunConfigError(str(key), f"unknown key for `{cls.command}`{hint}; allowed keys: "
                                     f"{', '.join(specs)}", source)
        missing = [k for k in cls.required() if k not in values]
        if missing:
            raise RunConfigError(missing[0], f"required (missing: {', '.join(missing)})", source)
        try:
            return cls(**dict(values))
        except RunConfigError as error:
            raise RunConfigError(error.key, error.detail, source) from None

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

    mode: str = option("full", "full: every transformer weight is trained; lora: a LoRA adapter (peft) on the "
                       "frozen base; the control branch is trained in both", kind="str", choices=("full", "lora"))
    lora_rank: int = option(32, "LoRA rank (mode lora)", kind="int", min=1, max=4096)
    lora_alpha: float = option(32.0, "LoRA alpha (the update is scaled by alpha / rank)", kind="float", min=0.0,
                               max=1e6)
    lora_targets: tuple[str, ...] = option(DEFAULT_LORA_TARGETS, "transformer modules (name suffixes) that get "
                                           "a LoRA adapter", kind="list[str]")
    condition_dropout: float = option(0.1, "probability that a clip's condition latents are zeroed (the "
                                      "unconditional model of classifier-free guidance)", kind="float", min=0.0,
                                      max=1.0)
    sample_steps: int = option(24, "Euler steps of the teacher's sample videos", kind="int", units="steps",
                               min=1, max=10000)
    sample_guidance: float = option(1.0, "classifier-free guidance scale of the sample videos (1: none)",
                                    kind="float", min=0.0, max=100.0)

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

    teacher: str = option(kind="path", doc="the teacher's weights folder (the output of `train`)")
    mode: str = option("full", "full: every transformer weight is trained; lora: the teacher's LoRA adapter "
                       "(a LoRA teacher only) keeps training", kind="str", choices=("full", "lora"))
    stage: str = option("ode", "ode: CausVid's ODE-pair regression (stage A); dmd: distribution matching "
                        "distillation (stage B, DMD2 without backward simulation), normally from a stage-A "
                        "student given as `init`", kind="str", choices=("ode", "dmd"))
    init: str = option("", "the student's starting weights folder (normally the output of a stage-A run); "
                       "empty: the teacher's weights", kind="str")
    teacher_steps: int = option(48, "Euler steps of the teacher's ODE from noise, on a uniform timestep grid that "
                                "must hold every student timestep (a multiple of 4 for 1000/750/500/250)",
                                kind="int", units="steps", min=1, max=100000)
    guidance_scale: float = option(1.5, "classifier-free guidance of the teacher's ODE on the condition (zero "
                                   "condition latents = unconditional); 1: none", kind="float", min=0.0,
                                   max=100.0)
    ode_pairs_per_clip: int = option(1, "teacher trajectories (noise draws) per training clip, computed once "
                                     "before training into output/ode_pairs", kind="int", min=1, max=10000)
    critic_learning_rate: float = option(1e-4, "stage dmd: AdamW learning rate of the critic (the fake score, a "
                                         "trainable copy of the teacher); 0: the critic stays the teacher",
                                         kind="float", min=0.0, max=1.0)
    critic_steps_per_step: int = option(5, "stage dmd: critic updates per student update (DMD2's two time-scale "
                                        "rule: the critic tracks the moving student distribution)", kind="int",
                                        min=1, max=1000)
    dmd_guidance_scale: float = option(0.0, "stage dmd: classifier-free guidance of the real score (the frozen "
                                       "teacher; zero condition latents = unconditional); 0: guidance_scale",
                                       kind="float", min=0.0, max=100.0)
    dmd_timestep_min: float = option(0.02, "stage dmd: lowest noise level of the distribution-matching "
                                     "gradient, as a fraction of the unshifted schedule (the level is shifted by "
                                     "the preset's shift)", kind="float", min=0.0, max=1.0)
    dmd_timestep_max: float = option(0.98, "stage dmd: highest noise level of the distribution-matching "
                                     "gradient (fraction of the unshifted schedule)", kind="float", min=0.0,
                                     max=1.0)
    context: str = option("frontier", "how earlier blocks are shown during training: frontier (blocks before a "
                          "random block are clean at timestep 0, as the cache holds them when serving; later "
                          "ones noisy) or noisy (every block at its own noise level, CausVid's diffusion "
                          "forcing)", kind="str", choices=("frontier", "noisy"))

    def _problems(self) -> Iterator[tuple[str, str]]:
        yield from super()._problems()
        if os.path.abspath(self.output) == os.path.abspath(self.teacher):
            yield "output", f"{self.output!r} is the teacher's folder; the student needs its own"
        if self.init and os.path.abspath(self.output) == os.path.abspath(self.init):
            yield "output", f"{self.output!r} is the init folder; the student needs its own"
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
    """A commented YAML listing of every key of ``cls`` with its default (required keys commented out)."""
    lines = [f"# rynn-teleop world-model {cls.command} CONFIG.yaml: every key (defaults)"]
    required = set(cls.required())
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    for key, spec in cls.specs().items():
        lines.append(f"# {spec.doc} ({spec.allowed()})")
        f = defaults[key]
        if key in required:
            lines.append(f"{key}: ...  # required")
            continue
        value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        value = list(value) if isinstance(value, tuple) else value
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf).strip().removesuffix("...").strip()
        lines.append(f"{key}: {text}")
    return "\n".join(lines) + "\n"
