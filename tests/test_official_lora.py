"""The official GORS LoRA checkpoints, converted onto the SD 2 base architecture (offline).

The reference copies in ../shared/gors_checkpoints are mapped onto an SD 2 base U-Net and text
encoder built from their configs on the meta device (names and shapes without weights). The
numerical checks materialise uninitialised models and fill only the probed layers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from pinned_http import file_server, forbid_internet, github_url, local_source, record_retry_waits

from gors import official_lora
from gors.core.data import ChecksumError
from gors.lora import TEXT_ENCODER_TARGET_MODULES, UNET_TARGET_MODULES, add_lora, load_lora
from gors.lora_sources import resolve_lora
from gors.official_lora import (
    LORA_DIFFUSION_TEXT_ENCODER_SUFFIX,
    OFFICIAL_CHECKPOINT_STEMS,
    LoraConversionError,
    checkpoint_pair,
    convert_lora_diffusion,
    convert_official_lora,
    map_lora_pairs,
    official_lora_files,
    read_lora_diffusion,
)
from gors.sd2_architecture import (
    SD2_BASE,
    SD2_BASE_TEXT_ENCODER_CONFIG,
    SD2_BASE_UNET_CONFIG,
    architecture_configs,
    empty_models,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CHECKPOINTS = SHARED / "gors_checkpoints"
needs_checkpoints = pytest.mark.skipif(not CHECKPOINTS.is_dir(), reason="../shared/gors_checkpoints is absent")

# The pair order written out by hand (not by walking a model): lora_diffusion visited the U-Net's
# down blocks, then its up blocks, then the mid block (registration order), and inside each
# attention to_q, to_k, to_v, to_out.0; CLIP attention registers k, v, q, out.
_UNET_BLOCKS = (
    [f"down_blocks.{b}.attentions.{a}" for b in range(3) for a in range(2)]
    + [f"up_blocks.{b}.attentions.{a}" for b in (1, 2, 3) for a in range(3)]
    + ["mid_block.attentions.0"]
)
UNET_ORDER = [
    f"{block}.transformer_blocks.0.{attn}.{proj}"
    for block in _UNET_BLOCKS
    for attn in ("attn1", "attn2")
    for proj in ("to_q", "to_k", "to_v", "to_out.0")
]
TEXT_ORDER = [f"encoder.layers.{i}.self_attn.{p}" for i in range(23) for p in ("k_proj", "v_proj", "q_proj", "out_proj")]


@pytest.fixture(autouse=True)
def _offline_data(monkeypatch, tmp_path):
    monkeypatch.setenv("GORS_DATA_DIR", str(SHARED))
    monkeypatch.setenv("GORS_CACHE_DIR", str(tmp_path / "cache"))


def raw(category: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    unet_pt, text_pt = official_lora_files(category)
    return read_lora_diffusion(unet_pt), read_lora_diffusion(text_pt)


@pytest.fixture(scope="module")
def meta_models():
    return empty_models(SD2_BASE_UNET_CONFIG, SD2_BASE_TEXT_ENCODER_CONFIG)


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory) -> Path:
    if not CHECKPOINTS.is_dir():
        pytest.skip("../shared/gors_checkpoints is absent")
    out = tmp_path_factory.mktemp("converted_color")
    convert_official_lora((CHECKPOINTS / "color" / "lora_weight_e357_s124500.pt",
                           CHECKPOINTS / "color" / "lora_weight_e357_s124500.text_encoder.pt"), out)
    return out


def materialised_models():
    """SD 2 base models with real (uninitialised) CPU memory: only the probed layers get values."""
    unet, text_encoder = empty_models(SD2_BASE_UNET_CONFIG, SD2_BASE_TEXT_ENCODER_CONFIG)
    return unet.to_empty(device="cpu"), text_encoder.to_empty(device="cpu")


# --- the architecture ---------------------------------------------------------------------------


def test_sd2_base_configs_build_the_published_model_sizes(meta_models):
    unet, text_encoder = meta_models
    # SD 2 base: 865.9 M U-Net parameters, 340.4 M for the OpenCLIP-H text tower without its last layer.
    assert sum(p.numel() for p in unet.parameters()) == 865_910_724
    assert sum(p.numel() for p in text_encoder.parameters()) == 340_387_840
    assert unet.device.type == "meta"


def test_architecture_configs_read_a_local_folder_and_fall_back_offline(tmp_path):
    for sub, config in (("unet", SD2_BASE_UNET_CONFIG), ("text_encoder", SD2_BASE_TEXT_ENCODER_CONFIG)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "config.json").write_text(json.dumps({**config, "cross_attention_dim": 768}))
    unet_config, text_config = architecture_configs(str(tmp_path))
    assert unet_config["cross_attention_dim"] == 768 and text_config["num_hidden_layers"] == 23
    # The Hub is unreachable here (HF_HUB_OFFLINE=1): SD 2 base falls back to the built-in configs.
    unet_config, text_config = architecture_configs(SD2_BASE)
    assert unet_config["attention_head_dim"] == [5, 10, 20, 20] and text_config["hidden_size"] == 1024
    with pytest.raises(OSError, match="could not read unet/config.json"):
        architecture_configs("someone/not-a-cached-model")


# --- every pair lands on its module -------------------------------------------------------------


@needs_checkpoints
@pytest.mark.parametrize("category", sorted(OFFICIAL_CHECKPOINT_STEMS))
def test_every_pair_lands_on_the_intended_module(category, meta_models):
    unet, text_encoder = meta_models
    unet_raw, text_raw = raw(category)
    assert (len(unet_raw), len(text_raw)) == (256, 184)
    unet_state, text_state = convert_lora_diffusion(*official_lora_files(category), unet, text_encoder)
    for state, order, model, tensors in ((unet_state, UNET_ORDER, unet, unet_raw),
                                         (text_state, TEXT_ORDER, text_encoder, text_raw)):
        assert list(state) == [f"{n}.lora_{x}.weight" for n in order for x in ("A", "B")]
        for i, name in enumerate(order):
            down, up = state[f"{name}.lora_A.weight"], state[f"{name}.lora_B.weight"]
            assert torch.equal(up, tensors[2 * i].float()) and torch.equal(down, tensors[2 * i + 1].float())
            assert model.get_submodule(name).weight.shape == (up.shape[0], down.shape[1])
            assert up.shape[1] == down.shape[0] == 4


@needs_checkpoints
def test_the_forward_order_does_not_fit_the_checkpoint_shapes(meta_models):
    """Shapes rule out down-mid-up: the checkpoint's 10th transformer block (pairs 72-79) is 640 wide,
    where down-mid-up order has the 1280-wide up_blocks.1."""
    unet, _ = meta_models
    forward = [n for n in UNET_ORDER if n.startswith("down")] + [n for n in UNET_ORDER if n.startswith("mid")]
    forward += [n for n in UNET_ORDER if n.startswith("up")]
    layers = [(n, unet.get_submodule(n).in_features, unet.get_submodule(n).out_features) for n in forward]
    with pytest.raises(LoraConversionError, match=r"pair 72 .* up \(640, 4\) .* up_blocks.1"):
        map_lora_pairs(raw("color")[0], layers, "U-Net")


# --- the converted file behaves as W x + up(down(x)) ---------------------------------------------

PROBES_UNET = [
    "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",  # self-attention, 320
    "up_blocks.1.attentions.2.transformer_blocks.0.attn2.to_k",  # cross-attention, 1024 -> 1280
    "down_blocks.1.attentions.1.transformer_blocks.0.attn2.to_v",  # cross-attention, 1024 -> 640
    "up_blocks.3.attentions.1.transformer_blocks.0.attn1.to_out.0",
]
PROBES_TEXT = [f"encoder.layers.{i}.self_attn.{p}" for i, p in ((0, "q_proj"), (7, "k_proj"), (15, "v_proj"), (22, "out_proj"))]
FULL_CROSS_ATTENTION = "mid_block.attentions.0.transformer_blocks.0.attn2"
FULL_TEXT_ATTENTION = "encoder.layers.22.self_attn"


def _fill(linear: torch.nn.Linear, generator: torch.Generator) -> None:
    with torch.no_grad():
        linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * 0.02)
        if linear.bias is not None:
            linear.bias.copy_(torch.randn(linear.bias.shape, generator=generator) * 0.02)


def _prepare(unet, text_encoder) -> None:
    """Give the probed layers values (the rest of the uninitialised models is never run)."""
    generator = torch.Generator().manual_seed(0)
    names = PROBES_UNET + [f"{FULL_CROSS_ATTENTION}.{p}" for p in ("to_q", "to_k", "to_v", "to_out.0")]
    for name in names:
        _fill(unet.get_submodule(name), generator)
    for name in PROBES_TEXT + [f"{FULL_TEXT_ATTENTION}.{p}" for p in ("q_proj", "k_proj", "v_proj", "out_proj")]:
        _fill(text_encoder.get_submodule(name), generator)


def _merged(layer, lora: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    base = layer.base_layer  # peft keeps the original nn.Linear here
    up, down = (t.float() for t in lora)
    return base.weight + up @ down, base.bias


def _hand_attention(x, context, q, k, v, out, heads):
    """Multi-head attention written out: softmax(q k^T / sqrt(d)) v, then the output projection."""
    def split(t):
        return t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)

    query, key, value = split(F.linear(x, *q)), split(F.linear(context, *k)), split(F.linear(context, *v))
    weights = (query @ key.transpose(-1, -2) / query.shape[-1] ** 0.5).softmax(-1)
    return F.linear((weights @ value).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1), *out)


def _check_probes(unet, text_encoder, category: str = "color") -> None:
    unet_raw, text_raw = raw(category)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for model, probes, order, tensors in ((unet, PROBES_UNET, UNET_ORDER, unet_raw),
                                              (text_encoder, PROBES_TEXT, TEXT_ORDER, text_raw)):
            for name in probes:
                i = order.index(name)
                layer = model.get_submodule(name)
                x = torch.randn(2, 3, layer.base_layer.in_features, generator=generator)
                up, down = tensors[2 * i].float(), tensors[2 * i + 1].float()
                expected = F.linear(x, layer.base_layer.weight, layer.base_layer.bias) + (x @ down.T) @ up.T
                torch.testing.assert_close(layer(x), expected, rtol=1e-4, atol=1e-5)
                assert (x @ down.T @ up.T).abs().max() > 1e-4  # the LoRA term is not negligible

        def lora(order, tensors, name):
            i = order.index(name)
            return tensors[2 * i], tensors[2 * i + 1]

        attention = unet.get_submodule(FULL_CROSS_ATTENTION)
        x, context = torch.randn(1, 6, 1280, generator=generator), torch.randn(1, 5, 1024, generator=generator)
        projections = [
            _merged(attention.get_submodule(p), lora(UNET_ORDER, unet_raw, f"{FULL_CROSS_ATTENTION}.{p}"))
            for p in ("to_q", "to_k", "to_v", "to_out.0")
        ]
        expected = _hand_attention(x, context, *projections, heads=attention.heads)
        torch.testing.assert_close(attention(x, encoder_hidden_states=context), expected, rtol=1e-4, atol=1e-5)

        attention = text_encoder.get_submodule(FULL_TEXT_ATTENTION)
        x = torch.randn(1, 7, 1024, generator=generator)
        projections = [
            _merged(attention.get_submodule(p), lora(TEXT_ORDER, text_raw, f"{FULL_TEXT_ATTENTION}.{p}"))
            for p in ("q_proj", "k_proj", "v_proj", "out_proj")
        ]
        expected = _hand_attention(x, x, *projections, heads=16)
        torch.testing.assert_close(attention(x)[0], expected, rtol=1e-4, atol=1e-5)


def test_the_converted_text_encoder_lora_is_named_as_hub_loras_are(converted_dir):
    from safetensors import safe_open

    # diffusers' SD LoRA layout, as transformers 4's CLIPTextModel names its modules (CLIP ViT-H/14's text tower in
    # SD 2: 23 layers x q, k, v, out x up, down): what other tools read, whatever this transformers accepts.
    with safe_open(str(converted_dir / "pytorch_lora_weights.safetensors"), "pt") as handle:
        keys = [key for key in handle.keys() if key.startswith("text_encoder.")]
    assert len(keys) == 184
    assert all(key.startswith("text_encoder.text_model.encoder.layers.") for key in keys)
    assert "text_encoder.text_model.encoder.layers.0.self_attn.k_proj.lora_linear_layer.down.weight" in keys


def test_pipeline_load_lora_weights_applies_the_official_lora(converted_dir):
    from diffusers import DDIMScheduler, StableDiffusionPipeline

    unet, text_encoder = materialised_models()
    _prepare(unet, text_encoder)
    # Only the U-Net and the text encoder take part in LoRA loading.
    pipeline = StableDiffusionPipeline(
        vae=None, text_encoder=text_encoder, tokenizer=None, unet=unet, scheduler=DDIMScheduler(clip_sample=False),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
    )
    pipeline.load_lora_weights(str(converted_dir))
    _check_probes(pipeline.unet, pipeline.text_encoder)


def test_gors_load_lora_applies_the_official_lora(converted_dir):
    unet, text_encoder = materialised_models()
    _prepare(unet, text_encoder)
    add_lora(unet, UNET_TARGET_MODULES, rank=4)
    add_lora(text_encoder, TEXT_ENCODER_TARGET_MODULES, rank=4)
    load_lora(converted_dir, {"unet": unet, "text_encoder": text_encoder})
    _check_probes(unet, text_encoder)


# --- sources, downloads, cache ------------------------------------------------------------------


@needs_checkpoints
def test_official_files_download_once_with_sha256_check(monkeypatch, tmp_path):
    monkeypatch.delenv("GORS_DATA_DIR")
    forbid_internet(monkeypatch)
    waits = record_retry_waits(monkeypatch)
    with file_server() as server:
        monkeypatch.setattr(official_lora, "GORS_CHECKPOINTS", local_source(official_lora.GORS_CHECKPOINTS, server.url))
        for name in official_lora.OFFICIAL_LORA_SHA256:
            data = (CHECKPOINTS / name).read_bytes() if name.startswith("spatial/") else b"not the checkpoint"
            server.put(official_lora.GORS_CHECKPOINTS, name, data)
        unet_pt, text_pt = official_lora_files("spatial")
        assert [github_url(path) for path in server.requests] == [
            "https://raw.githubusercontent.com/Karine-Huang/T2I-CompBench/1b7094991a57f3c22abdd4f6e8ba6c1a15517073/"
            f"GORS_finetune/checkpoint/spatial/spatial{suffix}" for suffix in (".pt", LORA_DIFFUSION_TEXT_ENCODER_SUFFIX)
        ]
        assert unet_pt.read_bytes() == (CHECKPOINTS / "spatial" / "spatial.pt").read_bytes()
        assert str(text_pt).startswith(str(tmp_path / "cache"))
        official_lora_files("spatial")
        assert len(server.requests) == 2  # the cached copies are reused

        with pytest.raises(ChecksumError, match="sha256"):
            official_lora_files("complex")
        assert len(server.requests) == 2 + 4 and waits == [1, 2, 3]  # a bad download is retried, then refused
    # A bad download never lands in the cache, nor does its temporary file (pooch leaves the empty folder).
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "complex" in str(p)]


@needs_checkpoints
def test_a_corrupted_offline_copy_is_refused(monkeypatch, tmp_path):
    (tmp_path / "color").mkdir()
    for name in ("lora_weight_e357_s124500.pt", "lora_weight_e357_s124500.text_encoder.pt"):
        (tmp_path / "color" / name).write_bytes((CHECKPOINTS / "color" / name).read_bytes()[:-10])
    monkeypatch.setenv("GORS_DATA_DIR", str(tmp_path))
    with pytest.raises(ChecksumError, match="expected aa383a5a"):
        official_lora_files("color")


def test_unknown_category_is_a_clear_error():
    with pytest.raises(ValueError, match="official:color, official:shape"):
        official_lora_files("numeracy")
    with pytest.raises(ValueError, match="Unknown GORS category 'colour'"):
        resolve_lora("official:colour")


@needs_checkpoints
def test_checkpoint_pair_accepts_a_folder_or_either_file(tmp_path):
    folder = CHECKPOINTS / "texture"
    pair = (folder / "lora_weight_e118_s63000.pt", folder / "lora_weight_e118_s63000.text_encoder.pt")
    assert checkpoint_pair(folder) == pair
    assert checkpoint_pair(pair[0]) == pair == checkpoint_pair(pair[1])
    (tmp_path / "lonely.pt").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lonely.text_encoder.pt"):
        checkpoint_pair(tmp_path / "lonely.pt")
    with pytest.raises(FileNotFoundError, match="holds 0"):
        checkpoint_pair(tmp_path)


def test_a_diffusers_lora_folder_is_named_as_nothing_to_convert(tmp_path):
    (tmp_path / "pytorch_lora_weights.safetensors").write_bytes(b"")  # e.g. a gors run folder
    with pytest.raises(ValueError, match="already holds a diffusers LoRA .*nothing to convert. Pass the folder to --lora"):
        checkpoint_pair(tmp_path)


@needs_checkpoints
def test_resolve_lora_converts_once_and_reuses(monkeypatch, tmp_path):
    assert resolve_lora(None) is None
    assert resolve_lora("runs/color") == "runs/color"
    folder = Path(resolve_lora("official:shape"))
    assert (folder / "pytorch_lora_weights.safetensors").is_file()
    assert folder.is_relative_to(tmp_path / "cache")
    record = json.loads((folder / "gors_lora_source.json").read_text())
    assert (record["unet_pairs"], record["text_encoder_pairs"], record["rank"]) == (128, 92, 4)
    assert [p.name for p in folder.parent.iterdir()] == ["shape"]  # no staging folder left behind

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(official_lora, "convert_official_lora", no_conversion)
    assert resolve_lora("official:shape") == str(folder)


@needs_checkpoints
def test_cli_converts_and_explains(tmp_path, capsys):
    official_lora.main(["official:non_spatial", str(tmp_path / "out")])
    assert (tmp_path / "out" / "pytorch_lora_weights.safetensors").is_file()
    assert "--lora" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="Unknown GORS category"):
        official_lora.main(["official:numeracy", str(tmp_path / "bad")])
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit, match=r"OUT '.*file' is a file, not a folder"):  # before any download
        official_lora.main(["official:color", str(tmp_path / "file")])
    with pytest.raises(SystemExit) as exit_info:
        official_lora.main(["--help"])
    assert exit_info.value.code == 0
    assert "official:<category>" in capsys.readouterr().out


# --- bad checkpoints ----------------------------------------------------------------------------


@needs_checkpoints
def test_truncated_checkpoints_are_refused(meta_models):
    unet, text_encoder = meta_models
    unet_raw, text_raw = raw("color")
    with pytest.raises(LoraConversionError, match="holds 254 tensors .* 256 tensors"):
        convert_lora_diffusion(unet_raw[:-2], text_raw, unet, text_encoder)
    with pytest.raises(LoraConversionError, match="odd number"):
        convert_lora_diffusion(unet_raw, text_raw[:-1], unet, text_encoder)


@needs_checkpoints
def test_a_checkpoint_for_another_architecture_is_refused(meta_models):
    # SD 1.x: same block layout, but 768-wide cross-attention context and a 12-layer CLIP-L.
    unet_config = {**SD2_BASE_UNET_CONFIG, "cross_attention_dim": 768, "attention_head_dim": 8,
                   "use_linear_projection": False}
    text_config = {**SD2_BASE_TEXT_ENCODER_CONFIG, "hidden_size": 768, "num_hidden_layers": 12,
                   "num_attention_heads": 12, "intermediate_size": 3072}
    unet, text_encoder = empty_models(unet_config, text_config)
    unet_raw, text_raw = raw("color")
    with pytest.raises(LoraConversionError, match=r"attn2.to_k is Linear\(768 -> 320\)"):
        convert_lora_diffusion(unet_raw, text_raw, unet, text_encoder)
    _, sd1_text_encoder = empty_models(SD2_BASE_UNET_CONFIG, text_config)
    with pytest.raises(LoraConversionError, match="holds 184 tensors .* 96 tensors"):
        convert_lora_diffusion(unet_raw, text_raw, meta_models[0], sd1_text_encoder)


def test_a_file_that_is_not_a_lora_diffusion_checkpoint_is_refused(tmp_path):
    torch.save({"state_dict": torch.zeros(2)}, tmp_path / "model.pt")
    with pytest.raises(LoraConversionError, match="expected a list of 2-D tensors"):
        read_lora_diffusion(tmp_path / "model.pt")
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(LoraConversionError, match=r"text.pt is not a lora_diffusion checkpoint: torch.load cannot read "
                                                   r"it as tensors \(\w+; not a PyTorch file, or cut short\)$"):
        read_lora_diffusion(tmp_path / "text.pt")


def test_map_lora_pairs_checks_rank_and_names_the_layer():
    layers = [("a.to_q", 8, 6), ("a.to_k", 3, 6)]
    up, down = torch.ones(6, 2), torch.ones(2, 8)
    state = map_lora_pairs([up, down, torch.ones(6, 2), torch.ones(2, 3)], layers, "toy")
    assert state["a.to_q.lora_A.weight"].shape == (2, 8) and state["a.to_k.lora_B.weight"].dtype == torch.float32
    with pytest.raises(LoraConversionError, match=r"pair 1 \(tensors 2, 3\).*a.to_k is Linear\(3 -> 6\)"):
        map_lora_pairs([up, down, torch.ones(6, 4), torch.ones(4, 3)], layers, "toy")


def test_a_kill_while_writing_never_leaves_a_record_beside_other_weights(tmp_path, monkeypatch):
    import os

    from safetensors.torch import load_file

    import gors.official_lora as official

    key = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"
    text_key = "text_model.encoder.layers.0.self_attn.q_proj"

    def states(value: float) -> tuple[dict, dict]:
        return ({f"{key}.lora_A.weight": torch.full((4, 8), value), f"{key}.lora_B.weight": torch.zeros(8, 4)},
                {f"{text_key}.lora_A.weight": torch.full((4, 8), value), f"{text_key}.lora_B.weight": torch.zeros(8, 4)})

    official.write_diffusers_lora(tmp_path, *states(1.0), {"source": "first"})
    replace = os.replace

    def killed_before_the_record(source, destination):
        if Path(destination).name == official.SOURCE_RECORD:
            raise KeyboardInterrupt
        replace(source, destination)

    monkeypatch.setattr(official.os, "replace", killed_before_the_record)
    with pytest.raises(KeyboardInterrupt):
        official.write_diffusers_lora(tmp_path, *states(2.0), {"source": "second"})
    monkeypatch.undo()
    # The second weights are in place; the first record, which describes other weights, is gone with them.
    assert not (tmp_path / official.SOURCE_RECORD).exists()
    weights = load_file(tmp_path / official.LORA_WEIGHT_NAME)
    assert [float(tensor.max()) for name, tensor in weights.items() if name.endswith("down.weight")] == [2.0, 2.0]
    assert sorted(path.name for path in tmp_path.iterdir()) == [official.LORA_WEIGHT_NAME]  # no staging left
    official.write_diffusers_lora(tmp_path, *states(3.0), {"source": "third"})
    assert json.loads((tmp_path / official.SOURCE_RECORD).read_text()) == {"source": "third"}
    assert (tmp_path / official.LORA_WEIGHT_NAME).stat().st_mode & 0o044 == 0o044  # readable as any model file


def test_a_killed_conversions_staging_folder_goes_a_running_ones_stays(tmp_path):
    import os
    import time

    import gors.official_lora as official

    killed, running = tmp_path / ".convert.killed", tmp_path / ".convert.running"
    for folder in (killed, running):
        folder.mkdir()
        (folder / "pytorch_lora_weights.safetensors").write_bytes(b"half")
    two_hours_ago = time.time() - 7200
    os.utime(killed, (two_hours_ago, two_hours_ago))
    key = "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"
    text_key = "text_model.encoder.layers.0.self_attn.q_proj"
    official.write_diffusers_lora(
        tmp_path, {f"{key}.lora_A.weight": torch.ones(4, 8), f"{key}.lora_B.weight": torch.zeros(8, 4)},
        {f"{text_key}.lora_A.weight": torch.ones(4, 8), f"{text_key}.lora_B.weight": torch.zeros(8, 4)})
    assert not killed.exists() and running.is_dir()


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path):
    """The official files are downloaded: they are read as tensors only (`weights_only=True`), so a `.pt` whose
    pickle calls a function is refused before that function runs."""
    import os

    class Payload:
        def __reduce__(self):
            return os.makedirs, (str(tmp_path / "ran"),)

    torch.save([Payload()], tmp_path / "evil.pt")
    with pytest.raises(LoraConversionError, match="torch.load cannot read it as tensors"):
        read_lora_diffusion(tmp_path / "evil.pt")
    assert not (tmp_path / "ran").exists()


def test_a_list_of_other_than_2d_tensors_is_not_a_lora_diffusion_checkpoint(tmp_path):
    """Each tensor of a lora_diffusion file is a 2-D up or down matrix: a list of 1-D tensors (biases, an
    embedding's vectors) is refused as such, rather than failing later on its shapes."""
    torch.save([torch.zeros(4), torch.zeros(4)], tmp_path / "vectors.pt")
    with pytest.raises(LoraConversionError, match="expected a list of 2-D tensors"):
        read_lora_diffusion(tmp_path / "vectors.pt")


def test_a_missing_lora_diffusion_file_is_said_to_be_missing(tmp_path):
    """A path that does not exist is named as such (FileNotFoundError), not as a file torch cannot read."""
    with pytest.raises(FileNotFoundError, match=r"LoRA checkpoint '.*absent.pt' does not exist"):
        read_lora_diffusion(tmp_path / "absent.pt")


def test_map_lora_pairs_checks_the_up_matrix_against_the_layers_output_width():
    """A pair whose down fits a layer but whose up has another output width (a checkpoint for another model
    width) is refused, naming the layer."""
    layers = [("a.to_k", 8, 6)]
    with pytest.raises(LoraConversionError, match=r"pair 0 \(tensors 0, 1\) has up \(5, 2\).*a.to_k is "
                                                   r"Linear\(8 -> 6\)"):
        map_lora_pairs([torch.ones(5, 2), torch.ones(2, 8)], layers, "toy")


def test_converted_weights_are_float32_from_fp16_checkpoints():
    """The official files hold fp16 tensors; the converted LoRA holds them as float32 (exact: every fp16 is a
    float32), as `gors.lora.save_lora` writes adapters."""
    layers = [("a.to_q", 8, 6)]
    up, down = torch.randn(6, 2).half(), torch.randn(2, 8).half()
    state = map_lora_pairs([up, down], layers, "toy")
    assert {tensor.dtype for tensor in state.values()} == {torch.float32}
    assert torch.equal(state["a.to_q.lora_B.weight"], up.float())
    assert torch.equal(state["a.to_q.lora_A.weight"], down.float())


class Attention(torch.nn.Module):
    """A U-Net attention named as diffusers names it, with an extra projection (`added_kv_proj_dim`) that the
    GORS LoRA does not target."""

    def __init__(self, extra: bool):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(4, 4) for _ in range(3))
        self.to_out = torch.nn.ModuleList([torch.nn.Linear(4, 4)])
        if extra:
            self.add_k_proj = torch.nn.Linear(4, 4)


class CLIPAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (torch.nn.Linear(4, 4) for _ in range(4))


def test_an_attention_with_layers_the_lora_does_not_target_is_refused():
    """lora_diffusion adapted every Linear in an attention: one beyond the GORS targets (an SD 2 checkpoint onto
    another architecture) would shift every later pair onto the wrong layer, so it is refused by name."""
    unet = torch.nn.Sequential(Attention(extra=False), Attention(extra=True))
    text_encoder = torch.nn.Sequential(CLIPAttention())
    with pytest.raises(LoraConversionError, match=r"U-Net: attention layer 1.add_k_proj is not one of the GORS LoRA "
                                                   r"targets to_q, to_k, to_v, to_out.0"):
        convert_lora_diffusion([], [], unet, text_encoder)
    unet = torch.nn.Sequential(Attention(extra=False))
    pairs = [torch.ones(4, 1), torch.ones(1, 4)] * 4
    unet_state, text_state = convert_lora_diffusion(pairs, pairs, unet, text_encoder)
    assert list(unet_state)[::2] == [f"0.{p}.lora_A.weight" for p in ("to_q", "to_k", "to_v", "to_out.0")]
    assert list(text_state)[::2] == [f"0.{p}.lora_A.weight" for p in ("k_proj", "v_proj", "q_proj", "out_proj")]


def test_a_model_without_attention_modules_is_refused_even_with_empty_checkpoints():
    """A model with no attention of the expected classes gets an error naming them, never an empty LoRA."""
    with pytest.raises(LoraConversionError, match=r"U-Net: no CrossAttention / Attention module found in Linear"):
        convert_lora_diffusion([], [], torch.nn.Linear(2, 2), torch.nn.Sequential(CLIPAttention()))
    with pytest.raises(LoraConversionError, match=r"text encoder: no CLIPAttention module found in Linear"):
        convert_lora_diffusion([], [], torch.nn.Sequential(Attention(extra=False)), torch.nn.Linear(2, 2))


def _pair(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.pt").write_bytes(b"")
    (folder / f"{name}{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX}").write_bytes(b"")


def test_checkpoint_pair_refuses_a_folder_of_several_loras_and_files_of_other_formats(tmp_path):
    """A folder with two lora_diffusion pairs is ambiguous (none is picked); a file that is neither a `.pt` nor a
    folder (e.g. a `.safetensors`) is named as not a lora_diffusion source."""
    _pair(tmp_path / "two", "color")
    _pair(tmp_path / "two", "shape")
    with pytest.raises(FileNotFoundError, match=r"holds 2 '\*.text_encoder.pt' files; expected exactly one"):
        checkpoint_pair(tmp_path / "two")
    (tmp_path / "lora.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match=r"is not official:<category>, a folder or a lora_diffusion .pt file"):
        checkpoint_pair(tmp_path / "lora.safetensors")


def test_checkpoint_pair_expands_a_home_folder_tilde(tmp_path, monkeypatch):
    """`gors convert-lora '~/loras/color.pt' OUT` (quoted, so no shell expanded it) names the file in $HOME."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _pair(tmp_path / "loras", "color")
    assert checkpoint_pair("~/loras/color.pt") == (tmp_path / "loras" / "color.pt",
                                                   tmp_path / "loras" / f"color{LORA_DIFFUSION_TEXT_ENCODER_SUFFIX}")
    assert checkpoint_pair("~/loras")[0] == tmp_path / "loras" / "color.pt"


def test_cli_names_a_missing_lora_file_without_a_traceback(tmp_path):
    """`gors convert-lora missing.pt OUT` exits with the reason (an OSError), not a traceback."""
    with pytest.raises(SystemExit, match=r"^error: LoRA checkpoint '.*missing.pt' does not exist"):
        official_lora.main([str(tmp_path / "missing.pt"), str(tmp_path / "out")])


@needs_checkpoints
def test_the_cached_conversion_is_per_conversion_version_and_readable_by_all(tmp_path):
    """`official_lora_folder` converts into `official_lora/<commit>/<CONVERSION_VERSION>/<category>`: a
    conversion by an older gors (another version's folder) is never reused; the folder is as readable as the
    cache's other entries (mkdtemp's owner-only mode is not kept)."""
    import os

    from gors.core.prompts import T2I_COMPBENCH_COMMIT

    base = tmp_path / "cache" / "official_lora" / T2I_COMPBENCH_COMMIT
    stale = base / "diffusers-v1" / "shape"
    stale.mkdir(parents=True)
    (stale / "pytorch_lora_weights.safetensors").write_bytes(b"an older conversion")
    umask = os.umask(0o022)
    try:
        folder = Path(official_lora.official_lora_folder("shape"))
    finally:
        os.umask(umask)
    assert folder == base / official_lora.CONVERSION_VERSION / "shape"
    assert json.loads((folder / "gors_lora_source.json").read_text())["conversion"] == official_lora.CONVERSION_VERSION
    assert folder.stat().st_mode & 0o777 == 0o755


@needs_checkpoints
def test_a_cache_folder_in_the_way_is_an_error_not_a_folder_without_weights(tmp_path):
    """Where the category's cache folder exists without the converted weights (a stray file in it), the rename
    fails and is reported, rather than returning a folder `--lora` cannot load."""
    from gors.core.prompts import T2I_COMPBENCH_COMMIT

    folder = tmp_path / "cache" / "official_lora" / T2I_COMPBENCH_COMMIT / official_lora.CONVERSION_VERSION / "shape"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("in the way")
    with pytest.raises(OSError):
        official_lora.official_lora_folder("shape")
    assert [p.name for p in folder.parent.iterdir()] == ["shape"]  # no staging folder left behind
