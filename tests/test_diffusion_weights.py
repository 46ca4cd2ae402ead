"""Wan2.2 presets, base model loading, the trainer's weights folder and the prompt embedding.

Every model here is a tiny diffusers/transformers model with seeded random weights, saved in the layout of
the Wan2.2-TI2V-5B-Diffusers release; they test the loaders, they are not models.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rynn_teleop.errors import ConfigurationError
from rynn_teleop.world_model.diffusion.presets import PAPER, TINY, WanPresetError, get_preset
from rynn_teleop.world_model.diffusion.weights import (
    LORA_ADAPTER_NAME,
    BaseModelError,
    FineTunedWeightsError,
    PromptEmbeddingError,
    WeightsManifest,
    encode_prompt,
    load_base,
    load_prompt,
    load_weights,
    read_manifest,
    save_weights,
    transformer_config_hash,
)

BASE_ID = "Wan-AI/Wan2.2-TI2V-5B-Diffusers"
WORDS = ["<pad>", "</s>", "<unk>", *"a robot arm picks up the red cube from table".split()]


class StandInControl(torch.nn.Module):
    """The control branch's parameters (``conv.weight``, ``conv.bias``, ``scale``) with seeded values."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        inner_dim = TINY.inner_dim
        self.conv = torch.nn.Conv3d(TINY.latent_channels, inner_dim, kernel_size=TINY.patch, stride=TINY.patch)
        self.scale = torch.nn.Parameter(torch.tensor(0.1))
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))


def tiny_models(seed: int = 0) -> tuple[AutoencoderKLWan, WanTransformer3DModel]:
    torch.manual_seed(seed)
    return AutoencoderKLWan(**TINY.vae_kwargs).eval(), WanTransformer3DModel(**TINY.transformer_kwargs).eval()


def dit_output(transformer: WanTransformer3DModel) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    latents = torch.randn(1, TINY.latent_channels, 2, *TINY.latent_grid, generator=generator)
    prompt = torch.randn(TINY.prompt_shape, generator=generator)
    with torch.no_grad():
        return transformer(latents, torch.tensor([500]), prompt).sample


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, AutoencoderKLWan, WanTransformer3DModel]:
    """A tiny base model folder in the release's layout, and the models saved in it."""
    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("release") / "Wan2.2-TI2V-5B-Diffusers"
    vae, transformer = tiny_models()
    vae.save_pretrained(root / "vae")
    transformer.save_pretrained(root / "transformer")
    return root, vae, transformer


@pytest.fixture
def base_copy(release, tmp_path) -> Path:
    """A copy of the release folder that a test may damage."""
    return Path(shutil.copytree(release[0], tmp_path / "base"))


# ---- presets -----------------------------------------------------------------------------------


def test_paper_token_arithmetic():
    assert (PAPER.width, PAPER.height, PAPER.latent_channels) == (832, 480, 48)
    assert PAPER.latent_grid == (30, 52) and PAPER.token_grid == (15, 26) and PAPER.tokens_per_frame == 390
    assert PAPER.chunk_latent_frames == 21 and PAPER.inner_dim == 3072 and PAPER.prompt_shape == (1, 512, 4096)
    assert PAPER.timesteps == (1000, 750, 500, 250)
    assert get_preset("tiny") is TINY


def test_presets_module_is_torch_free():
    code = ("import sys; import rynn_teleop.world_model.diffusion.presets as p; "
            "assert 'torch' not in sys.modules and 'diffusers' not in sys.modules; print(p.PAPER.tokens_per_frame)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "390"


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"chunk_frames": 80}, "chunk_frames", "1 \\+ 4k"),
    ({"window_frames": 0}, "window_frames", "at least one block"),
    ({"width": 100}, "width", "multiple of 32"),
    ({"height": 48}, "height", "multiple of 32"),
    ({"text_dim": 7}, "text_dim", "differs from transformer_config text_dim"),
    ({"latent_channels": 16}, "latent_channels", "z_dim"),
    ({"timesteps": (750, 500)}, "timesteps", "start at 1000"),
    ({"transformer_config": {**TINY.transformer_config, "patch_size": (2, 2, 2)}}, "transformer_config", "(1, p, p)"),
    ({"vae_config": {"z_dim": 48}}, "vae_config", "every constructor argument"),
])
def test_inconsistent_preset_names_the_field(change, field, message):
    with pytest.raises(WanPresetError, match=message) as caught:
        dataclasses.replace(TINY, **change)
    assert caught.value.field == field and f"{field}:" in str(caught.value)
    assert isinstance(caught.value, ConfigurationError)


def test_preset_configs_build_the_models():
    vae, transformer = tiny_models()
    assert transformer.config.in_channels == TINY.latent_channels
    assert vae.config.z_dim == TINY.latent_channels
    assert dit_output(transformer).shape == (1, TINY.latent_channels, 2, *TINY.latent_grid)


# ---- the base model ------------------------------------------------------------------------------


def test_load_base_round_trip(release):
    root, vae, transformer = release
    loaded = load_base(root, TINY)
    for original, copy in ((vae, loaded.vae), (transformer, loaded.transformer)):
        state = copy.state_dict()
        assert state.keys() == original.state_dict().keys()
        for name, tensor in original.state_dict().items():
            assert torch.equal(tensor, state[name]), name
    # equal weights; the loaded tensors' memory layout may pick another BLAS path: equal to rounding
    torch.testing.assert_close(dit_output(transformer), dit_output(loaded.transformer), rtol=1e-5, atol=1e-5)
    assert not loaded.transformer.training


def test_config_keys_diffusers_does_not_know_are_ignored(base_copy):
    config_file = base_copy / "vae" / "config.json"
    config = json.loads(config_file.read_text())
    config["clip_output"] = False  # in the release's vae/config.json; not an AutoencoderKLWan argument
    config_file.write_text(json.dumps(config))
    assert load_base(base_copy, TINY).vae.config.z_dim == TINY.latent_channels


def test_paper_configs_agree_with_the_model_modules():
    from diffusion_configs import PAPER_TRANSFORMER_CONFIG, PAPER_VAE_CONFIG

    from rynn_teleop.world_model.diffusion.presets import TRANSFORMER_CONFIG_KEYS, VAE_CONFIG_KEYS

    assert {k: PAPER_TRANSFORMER_CONFIG[k] for k in TRANSFORMER_CONFIG_KEYS} == PAPER.transformer_kwargs
    assert {k: PAPER_VAE_CONFIG[k] for k in VAE_CONFIG_KEYS} == PAPER.vae_kwargs


def test_load_base_in_bfloat16(release):
    loaded = load_base(release[0], TINY, dtype=torch.bfloat16)
    assert loaded.transformer.patch_embedding.weight.dtype == torch.bfloat16
    assert loaded.vae.encoder.conv_in.weight.dtype == torch.bfloat16


def test_missing_base_folder(tmp_path):
    with pytest.raises(BaseModelError, match="no such folder") as caught:
        load_base(tmp_path / "absent", TINY)
    assert caught.value.path == tmp_path / "absent"
    assert isinstance(caught.value, ConfigurationError)


def test_missing_subfolder(base_copy):
    shutil.rmtree(base_copy / "transformer")
    with pytest.raises(BaseModelError, match=r"transformer:\n  no such folder"):
        load_base(base_copy, TINY)


def test_other_class_is_refused(base_copy):
    config_file = base_copy / "vae" / "config.json"
    config = json.loads(config_file.read_text())
    config["_class_name"] = "AutoencoderKLLTXVideo"
    config_file.write_text(json.dumps(config))
    with pytest.raises(BaseModelError, match="_class_name: found 'AutoencoderKLLTXVideo', expected 'AutoencoderKLWan'"):
        load_base(base_copy, TINY)


def test_changed_config_field_is_listed(base_copy):
    config_file = base_copy / "transformer" / "config.json"
    config = json.loads(config_file.read_text())
    config["num_layers"] = 3
    del config["rope_max_seq_len"]  # absent: diffusers' default 1024 applies
    config_file.write_text(json.dumps(config))
    with pytest.raises(BaseModelError) as caught:
        load_base(base_copy, TINY)
    assert str(base_copy / "transformer") in str(caught.value)
    assert caught.value.differences == ["num_layers: found 3, expected 2", "rope_max_seq_len: found 1024, expected 64"]


def test_absent_weights_file(base_copy):
    (base_copy / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(BaseModelError, match="no diffusion_pytorch_model.safetensors"):
        load_base(base_copy, TINY)


def edit_weights(folder: Path, edit) -> None:
    file = folder / "diffusion_pytorch_model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


@pytest.mark.parametrize(("edit", "difference"), [
    (lambda t: t.pop("proj_out.weight"), "missing weight proj_out.weight [192, 192]"),
    (lambda t: t.update(extra=torch.zeros(3)), "unexpected weight extra [3]"),
    (lambda t: t.update({"proj_out.bias": torch.zeros(5)}), "proj_out.bias: found shape [5], expected [192]"),
])
def test_weights_that_do_not_fit_are_listed(base_copy, edit, difference):
    edit_weights(base_copy / "transformer", edit)
    with pytest.raises(BaseModelError) as caught:
        load_base(base_copy, TINY)
    assert caught.value.differences == [difference]
    assert str(base_copy / "transformer") in str(caught.value)


def test_sharded_weights_load(release, tmp_path):
    root, _, transformer = release
    sharded = Path(shutil.copytree(root, tmp_path / "sharded"))
    shutil.rmtree(sharded / "transformer")
    transformer.save_pretrained(sharded / "transformer", max_shard_size="20KB")
    assert (sharded / "transformer" / "diffusion_pytorch_model.safetensors.index.json").is_file()
    loaded = load_base(sharded, TINY).transformer.state_dict()
    for name, tensor in transformer.state_dict().items():
        assert torch.equal(tensor, loaded[name]), name


def test_paper_preset_is_refused_for_a_tiny_release(release):
    with pytest.raises(BaseModelError, match="base_dim: found 4, expected 160"):
        load_base(release[0], PAPER)


# ---- the trainer's weights folder ----------------------------------------------------------------


def fine_tuned(transformer: WanTransformer3DModel, seed: int = 1) -> WanTransformer3DModel:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in transformer.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=generator))
    return transformer


def save(folder: Path, transformer, control, kind: str, **overrides) -> WeightsManifest:
    arguments = {"preset": TINY, "base_model_id": BASE_ID, "training_step": 1200, **overrides}
    return save_weights(folder, transformer=transformer, control=control, kind=kind, **arguments)


def test_full_fine_tune_round_trip(release, tmp_path):
    trained = fine_tuned(load_base(release[0], TINY).transformer)
    manifest = save(tmp_path / "weights", trained, StandInControl(seed=1), "full")
    base = load_base(release[0], TINY).transformer
    assert not torch.equal(dit_output(base), dit_output(trained))
    control = StandInControl(seed=2)
    assert load_weights(tmp_path / "weights", base, control, TINY) == manifest
    assert torch.equal(dit_output(base), dit_output(trained))
    for name, tensor in StandInControl(seed=1).state_dict().items():
        assert torch.equal(control.state_dict()[name], tensor), name

    data = json.loads((tmp_path / "weights" / "manifest.json").read_text())
    assert data == {
        "format_version": 1, "base_model_id": BASE_ID, "base_config_hash": transformer_config_hash(base.config),
        "control": {"latent_channels": 48, "inner_dim": 192, "patch_size": [1, 2, 2]},
        "preset": "tiny", "training_step": 1200, "kind": "full"}
    assert (tmp_path / "weights" / "transformer" / "config.json").is_file()


def test_lora_round_trip(release, tmp_path):
    from peft import LoraConfig

    trained = load_base(release[0], TINY).transformer
    base_output = dit_output(trained)
    torch.manual_seed(3)
    trained.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights=False,
                                   target_modules=["to_q", "to_k", "to_v", "to_out.0"]), adapter_name="teacher")
    trained_output = dit_output(trained)
    assert not torch.equal(trained_output, base_output)
    assert save(tmp_path / "weights", trained, StandInControl(seed=1), "lora").kind == "lora"
    assert not (tmp_path / "weights" / "transformer").exists()

    base = load_base(release[0], TINY).transformer
    load_weights(tmp_path / "weights", base, StandInControl(seed=2), TINY)
    assert base.active_adapters() == [LORA_ADAPTER_NAME]
    assert torch.allclose(dit_output(base), trained_output, atol=1e-6, rtol=0)


def test_lora_that_does_not_fit_is_refused(release, tmp_path):
    from peft import LoraConfig

    trained = load_base(release[0], TINY).transformer
    trained.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q"]))
    save(tmp_path / "weights", trained, StandInControl(seed=1), "lora")
    lora_file = tmp_path / "weights" / "lora" / "pytorch_lora_weights.safetensors"
    with safe_open(str(lora_file), framework="pt") as reader:
        metadata = reader.metadata()
    tensors = load_file(lora_file)
    tensors["blocks.0.attn1.to_q.lora_A.weight"] = torch.zeros(4, 5)
    tensors["blocks.9.attn1.to_q.lora_A.weight"] = torch.zeros(4, 192)
    save_file(tensors, lora_file, metadata=metadata)
    base = load_base(release[0], TINY).transformer
    with pytest.raises(FineTunedWeightsError) as caught:
        load_weights(tmp_path / "weights", base, StandInControl(seed=2), TINY)
    assert caught.value.differences == [
        "lora: blocks.0.attn1.to_q.lora_A.weight: found shape [4, 5], expected in_features 192",
        "lora: blocks.9.attn1.to_q.lora_A.weight: the transformer has no module 'blocks.9.attn1.to_q'"]
    assert not getattr(base, "peft_config", None)


def test_control_only_round_trip(release, tmp_path):
    transformer = release[2]
    save(tmp_path / "weights", transformer, StandInControl(seed=1), "control", training_step=5)
    control = StandInControl(seed=2)
    manifest = load_weights(tmp_path / "weights", transformer, control, TINY)
    assert (manifest.kind, manifest.training_step) == ("control", 5)
    assert torch.equal(control.conv.weight, StandInControl(seed=1).conv.weight)


def test_the_project_control_branch_round_trips(release, tmp_path):
    dit = pytest.importorskip("rynn_teleop.world_model.diffusion.dit")
    branch = dit.ControlBranch(TINY.latent_channels, TINY.inner_dim, TINY.patch)
    with torch.no_grad():
        branch.scale.fill_(0.25)
    save(tmp_path / "weights", release[2], branch, "control")
    fresh = dit.ControlBranch(TINY.latent_channels, TINY.inner_dim, TINY.patch)
    load_weights(tmp_path / "weights", release[2], fresh, TINY)
    assert float(fresh.scale.detach()) == 0.25


def test_save_refuses_unclear_requests(release, tmp_path):
    with pytest.raises(ValueError, match="kind must be one of"):
        save(tmp_path / "w", release[2], StandInControl(seed=1), "partial")
    with pytest.raises(ValueError, match="needs adapter_name"):
        save(tmp_path / "w", release[2], StandInControl(seed=1), "lora")


@pytest.fixture
def saved_full(release, tmp_path) -> Path:
    save(tmp_path / "weights", release[2], StandInControl(seed=1), "full")
    return tmp_path / "weights"


def edit_manifest(folder: Path, **changes) -> None:
    data = json.loads((folder / "manifest.json").read_text())
    data.update(changes)
    (folder / "manifest.json").write_text(json.dumps(data))


def test_manifest_of_another_preset_is_refused(release, saved_full):
    edit_manifest(saved_full, preset="paper")
    with pytest.raises(FineTunedWeightsError, match="preset: found 'paper', expected 'tiny'"):
        load_weights(saved_full, release[2], StandInControl(seed=2), TINY)


def test_manifest_of_another_base_is_refused(release, saved_full):
    edit_manifest(saved_full, base_config_hash="0" * 64)
    with pytest.raises(FineTunedWeightsError) as caught:
        load_weights(saved_full, release[2], StandInControl(seed=2), TINY)
    assert f"found {'0' * 64}, expected {transformer_config_hash(release[2].config)}" in str(caught.value)


def test_base_of_another_config_is_refused(release, saved_full):
    torch.manual_seed(0)
    other = WanTransformer3DModel(**{**TINY.transformer_kwargs, "ffn_dim": 40})
    with pytest.raises(FineTunedWeightsError, match="base_config_hash: found"):
        load_weights(saved_full, other, StandInControl(seed=2), TINY)


def test_unknown_format_version_is_refused(release, saved_full):
    edit_manifest(saved_full, format_version=2)
    with pytest.raises(FineTunedWeightsError, match="unknown format_version 2 \\(this code reads 1\\)"):
        load_weights(saved_full, release[2], StandInControl(seed=2), TINY)


@pytest.mark.parametrize(("remove", "message"), [
    ("manifest.json", "no manifest.json"),
    ("control.safetensors", "no control.safetensors"),
    ("transformer/diffusion_pytorch_model.safetensors", "no diffusion_pytorch_model.safetensors"),
])
def test_missing_file_is_refused(release, saved_full, remove, message):
    (saved_full / remove).unlink()
    with pytest.raises(FineTunedWeightsError, match=message):
        load_weights(saved_full, release[2], StandInControl(seed=2), TINY)


def test_missing_weights_folder(release, tmp_path):
    with pytest.raises(FineTunedWeightsError, match="no such folder"):
        load_weights(tmp_path / "absent", release[2], StandInControl(seed=2), TINY)


def test_nothing_changes_when_a_tensor_does_not_fit(release, saved_full):
    edit_weights(saved_full / "transformer", lambda t: t.pop("proj_out.bias"))
    base = load_base(release[0], TINY).transformer
    before = dit_output(base)
    control = StandInControl(seed=2)
    with pytest.raises(FineTunedWeightsError, match="transformer: missing weight proj_out.bias"):
        load_weights(saved_full, base, control, TINY)
    assert torch.equal(dit_output(base), before)
    assert torch.equal(control.conv.weight, StandInControl(seed=2).conv.weight)
    assert read_manifest(saved_full).kind == "full"


# ---- the prompt embedding --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_release(tmp_path_factory) -> Path:
    """A base folder with a tiny UMT5 encoder (text_dim 16) and a word-level tokenizer, as the release lays
    them out (text_encoder/, tokenizer/)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    root = tmp_path_factory.mktemp("text_release")
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(root / "tokenizer")
    torch.manual_seed(0)
    config = UMT5Config(vocab_size=len(WORDS), d_model=TINY.text_dim, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                        relative_attention_num_buckets=8, relative_attention_max_distance=16)
    UMT5EncoderModel(config).save_pretrained(root / "text_encoder")
    return root


def test_encode_prompt_pads_with_zeros(text_release, tmp_path):
    out = tmp_path / "prompt.safetensors"
    prompt = "a robot  arm picks up the red cube "  # cleaned to 8 words, + </s> = 9 tokens
    returned = encode_prompt(text_release, prompt, out, max_length=TINY.prompt_len)
    embeds = load_prompt(out, TINY)
    assert embeds.shape == (1, 16, 16) and torch.equal(embeds, returned)
    assert torch.all(embeds[0, 9:] == 0)
    assert torch.all(embeds[0, :9].abs().sum(dim=-1) > 0)
    with safe_open(str(out), framework="pt") as reader:
        metadata = reader.metadata()
    assert metadata["prompt"] == prompt and metadata["tokens"] == "9" and metadata["max_length"] == "16"


def test_encode_prompt_matches_the_encoder(text_release, tmp_path):
    from transformers import UMT5EncoderModel

    embeds = encode_prompt(text_release, "the red cube", tmp_path / "p.safetensors", max_length=16)
    ids = torch.tensor([[WORDS.index(w) for w in ("the", "red", "cube", "</s>")]])
    encoder = UMT5EncoderModel.from_pretrained(text_release / "text_encoder")
    with torch.no_grad():
        expected = encoder(ids, torch.ones_like(ids)).last_hidden_state
    assert torch.allclose(embeds[:, :4], expected, atol=1e-5)


def test_long_prompt_is_truncated_with_a_warning(text_release, tmp_path, caplog):
    embeds = encode_prompt(text_release, " ".join(WORDS[3:] * 3), tmp_path / "p.safetensors", max_length=16)
    assert "only the first 16 are embedded" in caplog.text
    assert torch.all(embeds.abs().sum(dim=-1) > 0)


def test_load_prompt_checks_the_shape(text_release, tmp_path):
    out = tmp_path / "prompt.safetensors"
    encode_prompt(text_release, "a red cube", out, max_length=8)
    with pytest.raises(PromptEmbeddingError, match=r"shape: found \[1, 8, 16\], expected \[1, 16, 16\]"):
        load_prompt(out, TINY)
    with pytest.raises(PromptEmbeddingError, match="no such file"):
        load_prompt(tmp_path / "absent.safetensors", TINY)


def test_encode_prompt_needs_the_text_encoder(tmp_path):
    with pytest.raises(PromptEmbeddingError, match="no such folder"):
        encode_prompt(tmp_path, "a red cube", tmp_path / "p.safetensors")
