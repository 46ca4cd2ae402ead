"""Weights of the diffusion world model: Wan2.2's published base, our fine-tuned weights, the prompt embedding.

* :func:`load_base`: diffusers' ``AutoencoderKLWan`` and ``WanTransformer3DModel`` from a local folder laid out
  as the ``Wan2.2-TI2V-5B-Diffusers`` release (``vae/``, ``transformer/``, ``text_encoder/``, ``tokenizer/``).
  Every config field, weight name and shape is checked against a :class:`~.presets.WanPreset` before any
  weight is read; any difference is an error, so a model is never left with random weights.
* :func:`save_weights` / :func:`load_weights`: the folder the trainer writes (``manifest.json``,
  ``control.safetensors``, and ``transformer/`` for a full fine-tune or ``lora/`` for a LoRA adapter).
* :func:`encode_prompt` / :func:`load_prompt`: the fixed prompt's UMT5 embedding, computed once offline, as a
  safetensors file ``{"prompt_embeds": (1, max_length, text_dim)}`` (float32, zero past the prompt's tokens).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from rynn_teleop.errors import ConfigurationError

from .presets import TRANSFORMER_CONFIG_KEYS, WanPreset, json_like

logger = logging.getLogger(__name__)

MAX_LISTED = 8  # differences listed in an error message
WEIGHTS_NAME = "diffusion_pytorch_model.safetensors"  # diffusers' weights file in a model folder
WEIGHTS_INDEX_NAME = WEIGHTS_NAME + ".index.json"  # diffusers' index of a sharded model folder
MANIFEST_NAME = "manifest.json"
CONTROL_NAME = "control.safetensors"
TRANSFORMER_DIR = "transformer"  # a full fine-tune, written with save_pretrained
LORA_DIR = "lora"  # a LoRA adapter, written with save_lora_adapter
LORA_WEIGHTS_NAME = "pytorch_lora_weights.safetensors"  # the file save_lora_adapter writes
LORA_ADAPTER_NAME = "world_model"  # the adapter name load_weights gives a loaded LoRA
FORMAT_VERSION = 1  # of manifest.json
KINDS = ("full", "lora", "control")  # what a weights folder holds besides the control branch
PROMPT_FORMAT = "rynn_teleop.prompt_embeds"
PROMPT_KEY = "prompt_embeds"


class WanWeightsError(ConfigurationError):
    """A weights folder or file cannot be used.

    Attributes:
        path: the folder or file the message is about.
        differences: every problem found, one line each (the message lists the first ``MAX_LISTED``).
    """

    what = "weights"

    def __init__(self, path: str | os.PathLike, differences: Iterable[str]) -> None:
        self.path = Path(path)
        self.differences = list(differences)
        listed = "\n  ".join(self.differences[:MAX_LISTED])
        more = len(self.differences) - MAX_LISTED
        tail = f"\n  ... and {more} more" if more > 0 else ""
        super().__init__(f"{self.what} {self.path}:\n  {listed}{tail}")


class BaseModelError(WanWeightsError):
    """The base model folder is missing, or is not the preset's Wan2.2 release (config, weights)."""

    what = "Wan2.2 base model folder"


class FineTunedWeightsError(WanWeightsError):
    """The trainer's weights folder is missing, incomplete, of another format, or for another base or preset."""

    what = "fine-tuned weights folder"


class PromptEmbeddingError(WanWeightsError):
    """A prompt embedding file (or the text encoder that writes it) is missing or of another shape."""

    what = "prompt embedding"


class BaseModel(NamedTuple):
    """Wan2.2's VAE and DiT as loaded by :func:`load_base`, in eval mode."""

    vae: AutoencoderKLWan
    transformer: WanTransformer3DModel


class ControlDims(NamedTuple):
    """Dimensions of a control branch: a Conv3d ``latent_channels`` -> ``inner_dim`` with kernel = stride
    = ``patch_size`` (t, h, w)."""

    latent_channels: int
    inner_dim: int
    patch_size: tuple[int, int, int]


@dataclass(frozen=True)
class WeightsManifest:
    """``manifest.json`` of a weights folder.

    Attributes:
        format_version: of this manifest (:data:`FORMAT_VERSION`).
        base_model_id: where the base came from (e.g. ``Wan-AI/Wan2.2-TI2V-5B-Diffusers``); informative.
        base_config_hash: :func:`transformer_config_hash` of the base transformer's config.
        control: the control branch's dimensions.
        preset: the :class:`~.presets.WanPreset` name trained at.
        training_step: optimiser steps taken when saved.
        kind: ``"full"`` (``transformer/`` holds every DiT weight), ``"lora"`` (``lora/`` holds a LoRA
            adapter on the base DiT) or ``"control"`` (only the control branch was trained).
    """

    format_version: int
    base_model_id: str
    base_config_hash: str
    control: ControlDims
    preset: str
    training_step: int
    kind: str

    def to_json(self) -> dict[str, Any]:
        """The manifest as JSON-ready values."""
        return {
            "format_version": self.format_version, "base_model_id": self.base_model_id,
            "base_config_hash": self.base_config_hash, "control": json_like(self.control._asdict()),
            "preset": self.preset, "training_step": self.training_step, "kind": self.kind,
        }

    @classmethod
    def from_json(cls, data: Any, folder: Path) -> WeightsManifest:
        """The manifest in ``data`` (parsed ``manifest.json`` of ``folder``).

        Raises:
            FineTunedWeightsError: another format version, a missing field, a value of the wrong type.
        """
        if not isinstance(data, dict):
            raise FineTunedWeightsError(folder, [f"{MANIFEST_NAME} must hold a JSON object"])
        if data.get("format_version") != FORMAT_VERSION:
            raise FineTunedWeightsError(folder, [
                f"{MANIFEST_NAME}: unknown format_version {data.get('format_version')!r} "
                f"(this code reads {FORMAT_VERSION})"])
        try:
            control = data["control"]
            patch = tuple(int(p) for p in control["patch_size"])
            manifest = cls(
                format_version=FORMAT_VERSION, base_model_id=str(data["base_model_id"]),
                base_config_hash=str(data["base_config_hash"]),
                control=ControlDims(int(control["latent_channels"]), int(control["inner_dim"]), patch),
                preset=str(data["preset"]), training_step=int(data["training_step"]), kind=str(data["kind"]))
        except (KeyError, TypeError, ValueError) as error:
            raise FineTunedWeightsError(folder, [f"{MANIFEST_NAME} is malformed: {error!r}"]) from error
        if manifest.kind not in KINDS or len(patch) != 3:
            raise FineTunedWeightsError(folder, [
                f"{MANIFEST_NAME} is malformed: kind must be one of {KINDS} and control patch_size 3 numbers"])
        return manifest


# ---- configs and tensors ---------------------------------------------------------------------


def _constructor_defaults(cls: type) -> dict[str, Any]:
    """Constructor argument -> default of a diffusers model class."""
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def transformer_config_hash(config: Mapping[str, Any]) -> str:
    """sha256 (hex) of a ``WanTransformer3DModel`` config as canonical JSON.

    The fixed argument set :data:`~.presets.TRANSFORMER_CONFIG_KEYS` (those ``config`` omits at the
    constructor's default; other keys ignored, so an argument a later diffusers adds does not change it),
    sorted, tuples as lists, no whitespace: equal for ``model.config`` and the ``config.json`` it was saved to
    or loaded from.
    """
    defaults = _constructor_defaults(WanTransformer3DModel)
    canonical = {key: config.get(key, defaults.get(key)) for key in sorted(TRANSFORMER_CONFIG_KEYS)}
    text = json.dumps(json_like(canonical), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _short(value: Any, limit: int = 60) -> str:
    text = repr(json_like(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _config_differences(found: Mapping[str, Any], expected: Mapping[str, Any], cls: type) -> list[str]:
    """``key: found X, expected Y`` for each field of ``expected`` that ``found`` (a config.json, where an
    absent field takes ``cls``'s constructor default) holds otherwise."""
    defaults = _constructor_defaults(cls)
    differences = []
    for key in sorted(expected):
        value = found[key] if key in found else defaults.get(key, "<absent>")
        if json_like(value) != json_like(expected[key]):
            differences.append(f"{key}: found {_short(value)}, expected {_short(expected[key])}")
    return differences


def _shape_differences(found: Mapping[str, tuple[int, ...]], expected: Mapping[str, tuple[int, ...]]) -> list[str]:
    """Missing, unexpected and mis-shaped tensors of ``found`` against ``expected`` (name -> shape)."""
    differences = [f"missing weight {k} {list(expected[k])}" for k in sorted(expected.keys() - found.keys())]
    differences += [f"unexpected weight {k} {list(found[k])}" for k in sorted(found.keys() - expected.keys())]
    differences += [f"{k}: found shape {list(found[k])}, expected {list(expected[k])}"
                    for k in sorted(expected.keys() & found.keys()) if tuple(found[k]) != tuple(expected[k])]
    return differences


def _read_shapes(files: Iterable[Path]) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in the safetensors ``files`` (headers only). Raises SafetensorError."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as reader:
            for key in reader.keys():
                shapes[key] = tuple(reader.get_slice(key).get_shape())
    return shapes


def _model_files(folder: Path, error: type[WanWeightsError]) -> list[Path]:
    """The safetensors files of a diffusers model folder (one file, or the shards its index names)."""
    index, single = folder / WEIGHTS_INDEX_NAME, folder / WEIGHTS_NAME
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as problem:
            raise error(folder, [f"{WEIGHTS_INDEX_NAME} is malformed: {problem!r}"]) from problem
        absent = [n for n in names if not (folder / n).is_file()]
        if absent:
            raise error(folder, [f"{WEIGHTS_INDEX_NAME} names shards that are absent: {', '.join(absent)}"])
        return [folder / n for n in names]
    if single.is_file():
        return [single]
    raise error(folder, [f"no {WEIGHTS_NAME} (nor {WEIGHTS_INDEX_NAME}); only safetensors weights are read"])


def _stored_shapes(folder: Path, error: type[WanWeightsError]) -> dict[str, tuple[int, ...]]:
    try:
        return _read_shapes(_model_files(folder, error))
    except SafetensorError as problem:
        raise error(folder, [f"not readable as safetensors: {problem}"]) from problem


def _state_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _read_config(folder: Path, cls: type, error: type[WanWeightsError]) -> dict[str, Any]:
    """``folder/config.json``, refused unless its ``_class_name`` is ``cls``'s."""
    if not folder.is_dir():
        raise error(folder, ["no such folder"])
    file = folder / "config.json"
    try:
        config = json.loads(file.read_text())
    except FileNotFoundError:
        raise error(folder, ["no config.json"]) from None
    except ValueError as problem:
        raise error(folder, [f"config.json is not JSON: {problem}"]) from problem
    if not isinstance(config, dict) or config.get("_class_name") != cls.__name__:
        found = config.get("_class_name") if isinstance(config, dict) else None
        raise error(folder, [f"_class_name: found {found!r}, expected {cls.__name__!r}"])
    return config


# ---- the base model --------------------------------------------------------------------------


def _check_base_component(folder: Path, cls: type, expected: Mapping[str, Any]) -> None:
    """Refuse ``folder`` unless its config and tensors are those of ``cls(**expected)``; reads headers only."""
    config = _read_config(folder, cls, BaseModelError)
    differences = _config_differences(config, expected, cls)
    if differences:
        raise BaseModelError(folder, differences)
    with torch.device("meta"):
        expected_shapes = _state_shapes(cls.from_config(json_like(expected)))
    differences = _shape_differences(_stored_shapes(folder, BaseModelError), expected_shapes)
    if differences:
        raise BaseModelError(folder, differences)


def _load_base_component(root: Path, subfolder: str, cls: type, device: torch.device, dtype: torch.dtype):
    folder = root / subfolder
    try:
        model, info = cls.from_pretrained(
            str(root), subfolder=subfolder, torch_dtype=dtype, device_map={"": device}, use_safetensors=True,
            local_files_only=True, output_loading_info=True)
    except (OSError, ValueError, RuntimeError, SafetensorError) as problem:
        raise BaseModelError(folder, [f"diffusers could not load it: {problem}"]) from problem
    differences = [f"{kind.replace('_', ' ')}: {', '.join(map(str, info[kind]))}"
                   for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs") if info.get(kind)]
    if differences:
        raise BaseModelError(folder, differences)
    return model.eval()


def load_base(base_dir: str | os.PathLike, preset: WanPreset, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32) -> BaseModel:
    """Wan2.2's VAE and DiT from ``base_dir`` (the layout of ``Wan2.2-TI2V-5B-Diffusers``), on ``device``.

    Both ``vae/`` and ``transformer/`` are checked before either is loaded: ``config.json``'s ``_class_name``
    and every field of ``preset.vae_config`` / ``preset.transformer_config`` (a field the file omits takes
    diffusers' default), then every tensor name and shape in the safetensors headers. Weights are loaded with
    diffusers' ``from_pretrained`` in ``dtype`` (diffusers keeps its float32 modules, e.g. norms and the time
    embedding, in float32); its loading info is checked again.

    Raises:
        BaseModelError: a missing folder, subfolder, config or weights file; another class; config fields that
            differ (``key: found X, expected Y``); missing, unexpected or mis-shaped weights (the message names
            the folder and lists the first differences).
    """
    root = Path(base_dir)
    if not root.is_dir():
        raise BaseModelError(root, ["no such folder (expected vae/ and transformer/ as in Wan2.2-TI2V-5B-Diffusers)"])
    parts = (("vae", AutoencoderKLWan, preset.vae_config),
             ("transformer", WanTransformer3DModel, preset.transformer_config))
    for subfolder, cls, expected in parts:
        _check_base_component(root / subfolder, cls, expected)
    device = torch.device(device)
    vae, transformer = (_load_base_component(root, subfolder, cls, device, dtype) for subfolder, cls, _ in parts)
    return BaseModel(vae, transformer)


# ---- the trainer's weights folder ------------------------------------------------------------


def control_dims(control: nn.Module) -> ControlDims:
    """The dimensions of a control branch, from its ``conv.weight`` (inner_dim, latent_channels, t, h, w).

    Raises:
        ValueError: ``control`` has no 5-D ``conv.weight``.
    """
    weight = control.state_dict().get("conv.weight")
    if weight is None or weight.dim() != 5:
        raise ValueError("a control branch needs a Conv3d named 'conv' (its 5-D 'conv.weight')")
    inner_dim, latent_channels, *patch = weight.shape
    return ControlDims(int(latent_channels), int(inner_dim), tuple(int(p) for p in patch))


def _adapters(transformer: nn.Module) -> list[str]:
    """Names of the peft adapters injected in ``transformer`` (PeftAdapterMixin's ``peft_config``)."""
    return list(getattr(transformer, "peft_config", None) or {})


def save_weights(weights_dir: str | os.PathLike, *, transformer: WanTransformer3DModel, control: nn.Module,
                 kind: str, preset: WanPreset, base_model_id: str, training_step: int,
                 adapter_name: str | None = None) -> WeightsManifest:
    """Write the trained weights to ``weights_dir`` (created if needed) and return the manifest written.

    ``control.safetensors`` holds ``control``'s state dict. ``kind`` says what else: ``"full"`` writes
    ``transformer`` with ``save_pretrained`` to ``transformer/`` (it must carry no peft adapter: fuse and
    unload it first); ``"lora"`` writes its peft adapter ``adapter_name`` (default: its only one) with
    ``save_lora_adapter`` to ``lora/``; ``"control"`` writes nothing else (the base DiT was frozen).
    ``manifest.json`` is removed first and written last, so a folder with a manifest is complete.
    ``base_config_hash`` is :func:`transformer_config_hash` of ``transformer.config`` (which fine-tuning
    leaves as the base's).

    Raises:
        ValueError: an unknown ``kind``; ``"lora"`` without (or with an ambiguous) adapter; ``"full"`` with one.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}; got {kind!r}")
    adapters = _adapters(transformer)
    if kind == "full" and adapters:
        raise ValueError(f"kind 'full' saves plain DiT weights, but the transformer carries peft adapters "
                         f"{adapters}: fuse_lora() and unload_lora() first, or save kind 'lora'")
    if kind == "lora":
        if adapter_name is None and len(adapters) != 1:
            raise ValueError(f"kind 'lora' needs adapter_name among the transformer's adapters {adapters}")
        adapter_name = adapter_name if adapter_name is not None else adapters[0]
        if adapter_name not in adapters:
            raise ValueError(f"the transformer has no adapter {adapter_name!r}; it has {adapters}")
    folder = Path(weights_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_NAME).unlink(missing_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in control.state_dict().items()}
    save_file(tensors, str(folder / CONTROL_NAME), metadata={"format": "pt"})
    if kind == "full":
        transformer.save_pretrained(str(folder / TRANSFORMER_DIR), safe_serialization=True)
    elif kind == "lora":
        transformer.save_lora_adapter(str(folder / LORA_DIR), adapter_name=adapter_name,
                                      weight_name=LORA_WEIGHTS_NAME)
    manifest = WeightsManifest(
        format_version=FORMAT_VERSION, base_model_id=base_model_id,
        base_config_hash=transformer_config_hash(transformer.config), control=control_dims(control),
        preset=preset.name, training_step=int(training_step), kind=kind)
    partial = folder / (MANIFEST_NAME + ".partial")
    partial.write_text(json.dumps(manifest.to_json(), indent=2, sort_keys=True) + "\n")
    os.replace(partial, folder / MANIFEST_NAME)
    return manifest


def read_manifest(weights_dir: str | os.PathLike) -> WeightsManifest:
    """The manifest of ``weights_dir``.

    Raises:
        FineTunedWeightsError: no such folder, no ``manifest.json``, not JSON, unknown format_version, malformed.
    """
    folder = Path(weights_dir)
    if not folder.is_dir():
        raise FineTunedWeightsError(folder, ["no such folder"])
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text())
    except FileNotFoundError:
        raise FineTunedWeightsError(folder, [f"no {MANIFEST_NAME} (an incomplete or foreign folder)"]) from None
    except ValueError as problem:
        raise FineTunedWeightsError(folder, [f"{MANIFEST_NAME} is not JSON: {problem}"]) from problem
    return WeightsManifest.from_json(data, folder)


def _lora_differences(shapes: Mapping[str, tuple[int, ...]], transformer: nn.Module) -> list[str]:
    """Tensors of a LoRA file (``<module>.lora_A.weight`` / ``.lora_B.weight``) that do not fit ``transformer``."""
    modules = dict(transformer.named_modules())
    differences = []
    for key in sorted(shapes):
        name, _, suffix = key.rpartition(".lora_")
        if suffix not in ("A.weight", "B.weight"):
            differences.append(f"unexpected tensor {key} (only lora_A/lora_B weights are read)")
        elif name not in modules:
            differences.append(f"{key}: the transformer has no module {name!r}")
        elif isinstance(modules[name], nn.Linear):
            linear, shape = modules[name], shapes[key]
            side, expected = ("in", linear.in_features) if suffix == "A.weight" else ("out", linear.out_features)
            if len(shape) != 2 or shape[1 if side == "in" else 0] != expected:
                differences.append(f"{key}: found shape {list(shape)}, expected {side}_features {expected}")
    return differences


def manifest_differences(manifest: WeightsManifest, transformer: WanTransformer3DModel, preset: WanPreset,
                         hint: str = "trained on another base model") -> list[str]:
    """``key: found X, expected Y`` where ``manifest`` is for another preset or base transformer config than
    ``transformer`` (the loaded base) and ``preset``; ``hint`` ends the base-config line."""
    differences = []
    if manifest.preset != preset.name:
        differences.append(f"preset: found {manifest.preset!r}, expected {preset.name!r}")
    base_hash = transformer_config_hash(transformer.config)
    if manifest.base_config_hash != base_hash:
        differences.append(f"base_config_hash: found {manifest.base_config_hash}, expected {base_hash} (the loaded "
                           f"base transformer's config): {hint}")
    return differences


def load_weights(weights_dir: str | os.PathLike, transformer: WanTransformer3DModel, control: nn.Module,
                 preset: WanPreset) -> WeightsManifest:
    """Load the weights folder ``weights_dir`` into the base ``transformer`` (from :func:`load_base`) and
    ``control``, in place, keeping their devices and dtypes; return its manifest.

    ``"full"`` overwrites every DiT weight; ``"lora"`` adds the adapter as :data:`LORA_ADAPTER_NAME` (active;
    ``transformer.fuse_lora()`` folds it into the weights); ``"control"`` leaves the DiT alone. Everything is
    checked before any weight changes.

    Raises:
        FineTunedWeightsError: no folder or manifest, unknown format_version; a manifest of another preset or
            base (its base_config_hash differs from ``transformer``'s config; both are named); control
            dimensions that differ from ``control``'s; a missing file; missing, unexpected or mis-shaped tensors;
            ``transformer`` already carrying peft adapters.
    """
    folder = Path(weights_dir)
    manifest = read_manifest(folder)
    differences = manifest_differences(manifest, transformer, preset)
    base_hash = transformer_config_hash(transformer.config)
    if manifest.control != control_dims(control):
        differences.append(f"control: found {manifest.control}, expected {control_dims(control)}")
    if _adapters(transformer):
        differences.append(f"the transformer already carries peft adapters {_adapters(transformer)}; "
                           "load into the base transformer")
    if differences:
        raise FineTunedWeightsError(folder, differences)

    control_file = folder / CONTROL_NAME
    if not control_file.is_file():
        raise FineTunedWeightsError(folder, [f"no {CONTROL_NAME}"])
    try:
        control_shapes = _read_shapes([control_file])
    except SafetensorError as problem:
        raise FineTunedWeightsError(folder, [f"{CONTROL_NAME} is not readable: {problem}"]) from problem
    differences = [f"{CONTROL_NAME}: {d}" for d in _shape_differences(control_shapes, _state_shapes(control))]
    if manifest.kind == "full":
        part = folder / TRANSFORMER_DIR
        config = _read_config(part, WanTransformer3DModel, FineTunedWeightsError)
        if transformer_config_hash(config) != base_hash:
            differences.append(f"{TRANSFORMER_DIR}/config.json differs from the base transformer's config")
        part_files = _model_files(part, FineTunedWeightsError)
        differences += [f"{TRANSFORMER_DIR}: {d}" for d in _shape_differences(
            _stored_shapes(part, FineTunedWeightsError), _state_shapes(transformer))]
    elif manifest.kind == "lora":
        lora_file = folder / LORA_DIR / LORA_WEIGHTS_NAME
        if not lora_file.is_file():
            raise FineTunedWeightsError(folder, [f"no {LORA_DIR}/{LORA_WEIGHTS_NAME}"])
        try:
            lora_shapes = _read_shapes([lora_file])
        except SafetensorError as problem:
            raise FineTunedWeightsError(folder, [f"{LORA_DIR}/{LORA_WEIGHTS_NAME} is not readable: {problem}"]
                                        ) from problem
        if not lora_shapes:
            differences.append(f"{LORA_DIR}/{LORA_WEIGHTS_NAME} holds no tensor")
        differences += [f"{LORA_DIR}: {d}" for d in _lora_differences(lora_shapes, transformer)]
    if differences:
        raise FineTunedWeightsError(folder, differences)

    if manifest.kind == "lora":  # first: peft may still refuse it, and then nothing has changed
        _load_lora(folder, transformer, set(lora_shapes))
    with torch.no_grad():
        if manifest.kind == "full":
            for file in part_files:
                transformer.load_state_dict(load_file(str(file)), strict=False)
        control.load_state_dict(load_file(str(control_file)), strict=True)
    return manifest


def _load_lora(folder: Path, transformer: WanTransformer3DModel, keys: set[str]) -> None:
    """Add the adapter of ``folder/lora`` with diffusers' ``load_lora_adapter``; refuse a partial load."""
    from peft.utils import get_peft_model_state_dict

    try:
        transformer.load_lora_adapter(str(folder / LORA_DIR), prefix=None, adapter_name=LORA_ADAPTER_NAME,
                                      weight_name=LORA_WEIGHTS_NAME, local_files_only=True)
    except (OSError, ValueError, RuntimeError, KeyError) as problem:
        raise FineTunedWeightsError(folder, [f"{LORA_DIR}: peft could not load it: {problem}"]) from problem
    loaded = set(get_peft_model_state_dict(transformer, adapter_name=LORA_ADAPTER_NAME))
    if loaded != keys:
        transformer.delete_adapters(LORA_ADAPTER_NAME)
        missing, unused = sorted(loaded - keys), sorted(keys - loaded)
        raise FineTunedWeightsError(folder, [f"{LORA_DIR}: adapter weights not in the file: {missing[:MAX_LISTED]}; "
                                             f"file tensors not used: {unused[:MAX_LISTED]}"])


# ---- the prompt embedding --------------------------------------------------------------------


def encode_prompt(base_dir: str | os.PathLike, prompt: str, out_path: str | os.PathLike, max_length: int = 512,
                  device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Embed ``prompt`` with the release's UMT5 encoder and save it to ``out_path`` (safetensors).

    As diffusers' ``WanPipeline`` does: the prompt is cleaned (``prompt_clean``), tokenised by
    ``base_dir/tokenizer`` padded and truncated to ``max_length`` tokens (end-of-sequence token included),
    encoded by ``base_dir/text_encoder`` (``UMT5EncoderModel``, in ``dtype`` on ``device``), and every position
    past the prompt's tokens is set to zero. The file holds ``prompt_embeds`` (1, max_length, text_dim) in
    float32, and the prompt text, its token count and ``max_length`` in its metadata. A prompt longer than
    ``max_length`` tokens is truncated with a warning.

    Returns:
        the embedding saved, (1, max_length, text_dim) float32 on the CPU.

    Raises:
        PromptEmbeddingError: a missing tokenizer or text encoder folder, or text encoder weights that are
            missing or mis-shaped.
    """
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean
    from transformers import AutoTokenizer, UMT5EncoderModel

    root = Path(base_dir)
    tokenizer_dir, encoder_dir = root / "tokenizer", root / "text_encoder"
    for folder in (tokenizer_dir, encoder_dir):
        if not folder.is_dir():
            raise PromptEmbeddingError(folder, ["no such folder (the release's tokenizer/ and text_encoder/)"])
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        encoder, info = UMT5EncoderModel.from_pretrained(str(encoder_dir), dtype=dtype, local_files_only=True,
                                                         output_loading_info=True)
    except (OSError, ValueError) as problem:
        raise PromptEmbeddingError(root, [f"transformers could not load the tokenizer or text encoder: {problem}"]
                                   ) from problem
    differences = [f"{kind.replace('_', ' ')}: {', '.join(map(str, info[kind]))}"
                   for kind in ("missing_keys", "mismatched_keys") if info.get(kind)]
    if differences:
        raise PromptEmbeddingError(encoder_dir, differences)
    if info.get("unexpected_keys"):
        logger.warning("text encoder %s: unused weights %s", encoder_dir, sorted(info["unexpected_keys"]))

    text = prompt_clean(prompt)
    tokens = len(tokenizer(text, add_special_tokens=True).input_ids)
    if tokens > max_length:
        logger.warning("the prompt has %d tokens; only the first %d are embedded", tokens, max_length)
    inputs = tokenizer([text], padding="max_length", max_length=max_length, truncation=True,
                       add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    length = int(inputs.attention_mask.gt(0).sum())
    encoder.to(device).eval()
    with torch.inference_mode():
        hidden = encoder(inputs.input_ids.to(device), inputs.attention_mask.to(device)).last_hidden_state
    embeds = torch.zeros(1, max_length, hidden.shape[-1], dtype=torch.float32)
    embeds[0, :length] = hidden[0, :length].float().cpu()
    save_prompt(embeds, out_path, prompt=prompt, tokens=length)
    return embeds


def save_prompt(embeds: torch.Tensor, out_path: str | os.PathLike, *, prompt: str, tokens: int) -> None:
    """Write a prompt embedding (1, max_length, text_dim) as :func:`load_prompt` reads it (float32 safetensors;
    the prompt text and its token count in the metadata)."""
    metadata = {"format": PROMPT_FORMAT, "prompt": prompt, "tokens": str(tokens), "max_length": str(embeds.shape[1])}
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    save_file({PROMPT_KEY: embeds.detach().float().cpu().contiguous()}, str(out_path), metadata=metadata)


def load_prompt(path: str | os.PathLike, preset: WanPreset, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The prompt embedding saved by :func:`encode_prompt`, (1, prompt_len, text_dim) in ``dtype`` on ``device``.

    Raises:
        PromptEmbeddingError: no such file, not safetensors, no ``prompt_embeds``, or a shape other than
            ``preset.prompt_shape``.
    """
    file = Path(path)
    if not file.is_file():
        raise PromptEmbeddingError(file, ["no such file (write it with encode_prompt)"])
    try:
        with safe_open(str(file), framework="pt") as reader:
            if PROMPT_KEY not in reader.keys():
                raise PromptEmbeddingError(file, [f"no {PROMPT_KEY!r} tensor; it holds {list(reader.keys())}"])
            embeds = reader.get_tensor(PROMPT_KEY)
    except SafetensorError as problem:
        raise PromptEmbeddingError(file, [f"not readable as safetensors: {problem}"]) from problem
    if tuple(embeds.shape) != preset.prompt_shape:
        raise PromptEmbeddingError(file, [
            f"shape: found {list(embeds.shape)}, expected {list(preset.prompt_shape)} "
            f"(1, prompt_len, text_dim of preset {preset.name!r})"])
    return embeds.to(device=device, dtype=dtype)
