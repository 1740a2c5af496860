"""A LoRA file is checked against the pipeline's layers before it loads (gors.core.lora_shapes)."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from gors.core.lora_shapes import LoraLayer, lora_file_problem, lora_layers

TO_Q = "unet.down_blocks.1.attentions.0.transformer_blocks.0.attn1.to_q"


def test_lora_layers_pairs_every_diffusers_naming():
    shapes = {f"{TO_Q}.lora_A.weight": (4, 64), f"{TO_Q}.lora_B.weight": (64, 4), f"{TO_Q}.alpha": (),
              "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_linear_layer.down.weight": (4, 32),
              "text_encoder.text_model.encoder.layers.0.self_attn.q_proj.lora_linear_layer.up.weight": (32, 4),
              "unet.mid_block.attentions.0.proj_in.lora.down.weight": (4, 64, 1, 1),
              "unet.mid_block.attentions.0.proj_in.lora.up.weight": (64, 4, 1, 1)}
    assert lora_layers(shapes) == [
        LoraLayer("unet", TO_Q.removeprefix("unet."), (4, 64), (64, 4)),
        LoraLayer("text_encoder", "text_model.encoder.layers.0.self_attn.q_proj", (4, 32), (32, 4)),
        LoraLayer("unet", "mid_block.attentions.0.proj_in", (4, 64, 1, 1), (64, 4, 1, 1)),
    ]
    assert lora_file_problem(lora_layers(shapes)) is None


def test_scales_dora_magnitudes_and_up_projection_biases_are_no_projections():
    # A DoRA file, or one with `lora_bias`, is still diffusers' format: its pairs are checked, the other entries skipped.
    proj_in = "unet.mid_block.attentions.0.proj_in"
    shapes = {f"{TO_Q}.lora_A.weight": (4, 64), f"{TO_Q}.lora_B.weight": (64, 4), f"{TO_Q}.alpha": (),
              f"{TO_Q}.lora_magnitude_vector": (64,), f"{TO_Q}.lora_B.bias": (64,),
              f"{proj_in}.lora.down.weight": (4, 64), f"{proj_in}.lora.up.weight": (64, 4), f"{proj_in}.lora.up.bias": (64,)}
    assert lora_layers(shapes) == [LoraLayer("unet", TO_Q.removeprefix("unet."), (4, 64), (64, 4)),
                                   LoraLayer("unet", proj_in.removeprefix("unet."), (4, 64), (64, 4))]


@pytest.mark.parametrize("key", ["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight",  # kohya
                                 "unet.down_blocks.0.attentions.0.processor.to_q_lora.down.weight",  # attn processors
                                 "down_blocks.0.attentions.0.proj_in.lora_A.weight"])  # no component prefix
def test_other_formats_are_left_to_diffusers(key):
    assert lora_layers({key: (4, 32)}) is None


def test_a_projection_without_its_pair_or_with_another_rank_is_named():
    only_down = lora_layers({f"{TO_Q}.lora_A.weight": (4, 64)})
    assert lora_file_problem(only_down) == f"it holds the down-projection of {TO_Q} without its up-projection"
    only_up = lora_layers({f"{TO_Q}.lora.up.weight": (64, 4)})
    assert lora_file_problem(only_up) == f"it holds the up-projection of {TO_Q} without its down-projection"
    ranks = lora_layers({f"{TO_Q}.lora_A.weight": (4, 64), f"{TO_Q}.lora_B.weight": (64, 8)})
    assert lora_file_problem(ranks) == (f"its {TO_Q} has a down-projection of rank 4 and an up-projection of rank 8")


@pytest.fixture(scope="module")
def sd_lora(tiny_sd, tmp_path_factory):
    """A LoRA (U-Net and text encoder) trained on `tiny_sd` itself, in gors' own format."""
    from diffusers import StableDiffusionPipeline

    from gors.lora import add_lora, save_lora

    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    add_lora(pipeline.unet, ["to_q", "to_k", "to_v", "to_out.0"], rank=4)
    add_lora(pipeline.text_encoder, ["q_proj", "k_proj", "v_proj", "out_proj"], rank=4)
    folder = tmp_path_factory.mktemp("sd_lora")
    save_lora(folder, {"unet": pipeline.unet, "text_encoder": pipeline.text_encoder})
    return folder / "pytorch_lora_weights.safetensors"


def _edited(source, target, edit):
    weights = load_file(str(source))
    edit(weights)
    target.mkdir()
    save_file(weights, str(target / "pytorch_lora_weights.safetensors"))
    return str(target)


def _first(weights, *parts):
    return next(key for key in weights if all(part in key for part in parts))


def test_a_misfitting_lora_is_refused_before_it_loads(tiny_sd, sd_lora, tmp_path):
    from diffusers import StableDiffusionPipeline

    from gors.core.pipeline import load_lora

    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    load_lora(pipeline, str(sd_lora.parent))  # its own LoRA fits
    assert pipeline.get_list_adapters() == {"unet": ["default_0"], "text_encoder": ["default_0"]}

    def wider_cross_attention(weights):  # a model whose text encoder is 48 wide: only attn2.to_k/v differ
        key = _first(weights, "attn2.to_k", "down")
        weights[key] = torch.zeros(weights[key].shape[0], 48)

    def wider_text_encoder(weights):
        key = _first(weights, "text_encoder", "q_proj", "down")
        weights[key] = torch.zeros(weights[key].shape[0], 40)

    def more_blocks(weights):  # a deeper model: its extra layers would be skipped with a warning
        weights["unet.down_blocks.9.attentions.0.proj_in.lora.down.weight"] = torch.zeros(4, 64)
        weights["unet.down_blocks.9.attentions.0.proj_in.lora.up.weight"] = torch.zeros(64, 4)

    def down_only(weights):  # diffusers: IndexError
        for key in [key for key in weights if ".up." in key]:
            del weights[key]

    cases = {wider_cross_attention: r"its unet\.\S+attn2\.to_k maps 48 to 64 features, the model's layer 32 to 64",
             wider_text_encoder: r"its text_encoder\.\S+q_proj maps 40 to 32 features, the model's layer 32 to 32",
             more_blocks: r"it has weights for unet\.down_blocks\.9\.attentions\.0\.proj_in, a layer this "
                          r"StableDiffusionPipeline does not have"}
    for edit, problem in cases.items():
        fresh = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
        lora = _edited(sd_lora, tmp_path / edit.__name__, edit)
        with pytest.raises(ValueError, match=rf"^LoRA {lora} does not fit {tiny_sd}: {problem}\. It was trained on "
                                             r"another base model; pass the model it was trained on$"):
            load_lora(fresh, lora)
        assert fresh.get_list_adapters() == {}  # refused before anything loaded
    # `gors evaluate` refuses it from the configs alone, before it locks or writes its folder.
    from gors.config import EvaluateConfig
    from gors.evaluate import evaluate

    lora = _edited(sd_lora, tmp_path / "evaluated", wider_cross_attention)
    with pytest.raises(ValueError, match=rf"^LoRA {lora} does not fit {tiny_sd}: {cases[wider_cross_attention]}"):
        evaluate(EvaluateConfig(pretrained_model_name_or_path=str(tiny_sd), lora=lora, benchmarks="toy",
                                output_dir=str(tmp_path / "eval")))
    assert not (tmp_path / "eval").exists()
    lora = _edited(sd_lora, tmp_path / "down_only", down_only)
    with pytest.raises(ValueError, match=rf"^LoRA {lora} is not a whole LoRA: it holds the down-projection of \S+ "
                                         r"without its up-projection; pass the folder or file a training run wrote$"):
        load_lora(StableDiffusionPipeline.from_pretrained(str(tiny_sd)), lora)


def test_the_check_before_loading_leaves_other_files_and_unreadable_models_to_the_load(tiny_sd, sd_lora, tmp_path):
    # `gors evaluate`'s early check reads only safetensors headers, and only of models whose configs it can build.
    from gors.core.lora_shapes import check_lora_fits_before_loading

    misfit = _edited(sd_lora, tmp_path / "misfit", lambda weights: weights.update(
        {f"{TO_Q.replace('down_blocks.1', 'down_blocks.9')}.lora_A.weight": torch.zeros(4, 64),
         f"{TO_Q.replace('down_blocks.1', 'down_blocks.9')}.lora_B.weight": torch.zeros(64, 4)}))
    with pytest.raises(ValueError, match=r"does not fit .*down_blocks\.9"):
        check_lora_fits_before_loading(str(tiny_sd), misfit)
    (tmp_path / "no_pipeline").mkdir()
    check_lora_fits_before_loading(str(tmp_path / "no_pipeline"), misfit)  # no model_index.json: left to the load
    pickled = tmp_path / "pytorch_lora_weights.bin"
    torch.save(load_file(str(sd_lora)), str(pickled))
    check_lora_fits_before_loading(str(tiny_sd), str(pickled))  # not safetensors: left to diffusers


def _kohya(module_path: str, features: tuple[int, int], prefix: str = "lora_unet_") -> dict[str, torch.Tensor]:
    name = prefix + module_path.replace(".", "_")
    return {f"{name}.lora_down.weight": torch.zeros(4, features[0]),
            f"{name}.lora_up.weight": torch.zeros(features[1], 4), f"{name}.alpha": torch.tensor(4.0)}


def test_a_lora_that_diffusers_loads_in_part_or_not_at_all_is_said_or_refused(tiny_sd, sd_lora, tmp_path, caplog):
    """diffusers skips kohya names it cannot place without a word, and loads nothing from a file whose
    component the pipeline lacks (an SDXL LoRA's second text encoder)."""
    from diffusers import StableDiffusionPipeline

    from gors.core.lora_shapes import loaded_lora_layers
    from gors.core.pipeline import load_lora

    to_q = TO_Q.removeprefix("unet.")
    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    partial = tmp_path / "partial.safetensors"
    save_file(_kohya(to_q, (64, 64)) | _kohya("down_blocks.7.attentions.0.proj_in", (8, 8)), str(partial))
    with caplog.at_level("WARNING", logger="gors.core.pipeline"):
        load_lora(pipeline, str(partial))
    assert loaded_lora_layers(pipeline) == {"unet": 1}
    assert f"LoRA {partial} loaded in part (unet: 2 in the file, 1 loaded): diffusers left out" in caplog.text

    second_encoder = tmp_path / "te2.safetensors"
    save_file(_kohya("text_model.encoder.layers.0.self_attn.q_proj", (32, 32), "lora_te2_"), str(second_encoder))
    with pytest.raises(ValueError, match=rf"^LoRA {second_encoder} adapted no layer of {tiny_sd}: none of its "
                                         r"weight names is a layer of this model"):
        load_lora(StableDiffusionPipeline.from_pretrained(str(tiny_sd)), str(second_encoder))

    elsewhere = tmp_path / "elsewhere.safetensors"
    save_file(_kohya("down_blocks.7.attentions.0.proj_in", (8, 8)), str(elsewhere))
    with pytest.raises(ValueError, match=rf"^LoRA {elsewhere} matches no layer of {tiny_sd} \(Target modules "
                                         r".*\): it was trained on another model; pass the model it was trained on$"):
        load_lora(StableDiffusionPipeline.from_pretrained(str(tiny_sd)), str(elsewhere))


def test_other_load_errors_pass_through_as_they_are_and_diffusers_loggers_are_left_as_found(tmp_path):
    # Only a size mismatch or peft's no-matching-module error means "another base model": any other error (a device
    # assert, a corrupt tensor) is raised as it is, and the load's quieting of diffusers' loggers is undone.
    import logging

    from gors.core.pipeline import _not_a_component_warning, load_lora

    class Failing:
        def __init__(self, error):
            self.error = error

        def load_lora_weights(self, lora):
            raise self.error

    peft_logger, base_logger = logging.getLogger("diffusers.loaders.peft"), logging.getLogger("diffusers.loaders.lora_base")
    level = peft_logger.level
    try:
        peft_logger.setLevel(logging.INFO)
        lora = str(tmp_path / "not_local")  # no local file: nothing checked before the load
        for error in (RuntimeError("CUDA error: device-side assert triggered"), ValueError("bad dtype in the file")):
            with pytest.raises(type(error)) as raised:
                load_lora(Failing(error), lora)
            assert raised.value is error
            assert peft_logger.level == logging.INFO and _not_a_component_warning not in base_logger.filters
        # peft's error lists every target module on its first line (thousands of characters for a real model).
        from peft import NoMatchingPeftModuleError

        targets = ", ".join(f"down_blocks.{i}.attentions.0.proj_in" for i in range(40))
        error = NoMatchingPeftModuleError(f"Target modules {{{targets}}} not found in the base model.\nMore.")
        with pytest.raises(ValueError) as raised:
            load_lora(Failing(error), lora)
        message = str(raised.value)
        assert message.startswith(f"LoRA {lora} matches no layer of Failing (Target modules {{down_blocks.0.")
        assert f"{targets[:150]}" in message and targets not in message and " ...): it was trained on" in message
        assert "More." not in message and len(message) < 400
    finally:
        peft_logger.setLevel(level)


def test_a_unet_only_lora_loads_without_diffusers_text_encoder_warning(tiny_sd, sd_lora, tmp_path, caplog):
    from diffusers import StableDiffusionPipeline

    from gors.core.lora_shapes import loaded_lora_layers
    from gors.core.pipeline import load_lora

    unet_only = _edited(sd_lora, tmp_path / "unet_only", lambda weights: [
        weights.pop(key) for key in [key for key in weights if key.startswith("text_encoder.")]])
    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    with caplog.at_level("INFO"):
        load_lora(pipeline, unet_only)
    assert "No LoRA keys" not in caplog.text
    layers = loaded_lora_layers(pipeline)
    assert list(layers) == ["unet"] and f"LoRA {unet_only} loaded into {layers['unet']} layers of unet" in caplog.text


def test_a_component_left_out_is_named_where_diffusers_splits_others(tiny_flux, tmp_path, caplog):
    """FLUX's fused qkv loads as 3 layers, so a whole-file count would hide the T5 layers diffusers' kohya
    converter drops (`lora_te2_`): counted per component."""
    from diffusers import FluxPipeline

    from gors.core.lora_shapes import loaded_lora_layers
    from gors.core.pipeline import load_lora

    pipeline = FluxPipeline.from_pretrained(str(tiny_flux))
    width = pipeline.transformer.config.attention_head_dim * pipeline.transformer.config.num_attention_heads
    weights = _kohya("double_blocks.0.img_attn_qkv", (width, 3 * width))
    t5_queries = [name for name, module in pipeline.text_encoder_2.named_modules() if name.endswith("SelfAttention.q")]
    for name in t5_queries:
        module = pipeline.text_encoder_2.get_submodule(name)
        weights |= _kohya(name, (module.in_features, module.out_features), "lora_te2_")
    file = tmp_path / "flux_kohya.safetensors"
    save_file(weights, str(file))
    with caplog.at_level("WARNING", logger="gors.core.pipeline"):
        load_lora(pipeline, str(file))
    assert loaded_lora_layers(pipeline) == {"transformer": 3}  # as many as the file's 1 + len(t5_queries)
    assert len(t5_queries) == 2
    assert f"LoRA {file} loaded in part (text_encoder_2: 2 in the file, 0 loaded)" in caplog.text


def test_a_lora_saved_from_a_peft_models_state_dict_is_refused_with_the_fix(tiny_sd, tmp_path):
    """`model.state_dict()` keeps peft's adapter name in every LoRA weight's name; diffusers fails on it
    without saying why."""
    from diffusers import StableDiffusionPipeline

    from gors.core.lora_shapes import peft_adapter_names
    from gors.core.pipeline import load_lora
    from gors.lora import add_lora

    trained = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    add_lora(trained.unet, ["to_q", "to_k", "to_v", "to_out.0"], rank=4)
    weights = {f"unet.{key}": value for key, value in trained.unet.state_dict().items() if "lora_" in key}
    assert peft_adapter_names({key: value.shape for key, value in weights.items()}) == ["default"]
    (tmp_path / "peft").mkdir()
    save_file(weights, str(tmp_path / "peft" / "pytorch_lora_weights.safetensors"))
    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    with pytest.raises(ValueError, match=r"^LoRA \S+peft was saved from a peft model's state_dict\(\): its weight names "
                                         r"keep the adapter name 'default' \(unet\.\S+\.lora_A\.default\.weight\), "
                                         r"which diffusers does not read\. Save it with "
                                         r"peft\.get_peft_model_state_dict\(model\)"):
        load_lora(pipeline, str(tmp_path / "peft"))
    assert pipeline.get_list_adapters() == {}
    assert peft_adapter_names({f"{TO_Q}.lora_A.weight": (4, 64), f"{TO_Q}.lora.up.weight": (64, 4)}) == []
    assert peft_adapter_names({f"{TO_Q}.lora_B.other.weight": (64, 4)}) == ["other"]  # up-projections alone too


def test_weights_of_any_model_component_of_the_pipeline_are_checked(tiny_sd, sd_lora, tmp_path):
    """A family whose model components are named otherwise than `LORA_COMPONENTS` (here SD's `vae`, which no
    family's LoRA adapts) gets its file checked as well, rather than passed to diffusers unread."""
    from diffusers import StableDiffusionPipeline

    from gors.core.lora_shapes import lora_components
    from gors.core.pipeline import load_lora

    pipeline = StableDiffusionPipeline.from_pretrained(str(tiny_sd))
    assert lora_components(pipeline) == ("unet", "transformer", "text_encoder", "text_encoder_2", "text_encoder_3",
                                         "vae")
    shapes = {"vae.decoder.conv_in.lora_A.weight": (4, 8), "vae.decoder.conv_in.lora_B.weight": (8, 4)}
    assert lora_layers(shapes) is None
    assert lora_layers(shapes, lora_components(pipeline)) == [LoraLayer("vae", "decoder.conv_in", (4, 8), (8, 4))]

    def vae_layer(weights):
        weights["vae.decoder.up_blocks.9.conv.lora.down.weight"] = torch.zeros(4, 8)
        weights["vae.decoder.up_blocks.9.conv.lora.up.weight"] = torch.zeros(8, 4)

    lora = _edited(sd_lora, tmp_path / "vae", vae_layer)
    with pytest.raises(ValueError, match=rf"^LoRA {lora} does not fit {tiny_sd}: it has weights for "
                                         r"vae\.decoder\.up_blocks\.9\.conv, a layer this StableDiffusionPipeline "
                                         r"does not have\."):
        load_lora(pipeline, lora)
    assert pipeline.get_list_adapters() == {}


def _config_only(**components: torch.nn.Module):
    from gors.core.lora_shapes import ConfigOnlyPipeline

    return ConfigOnlyPipeline("tiny/model", "TinyPipeline", components)


def _pair(name: str, down: tuple[int, ...], up: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    return {f"{name}.lora_A.weight": down, f"{name}.lora_B.weight": up}


def test_the_widths_of_convolutions_and_of_layers_that_carry_an_adapter_are_checked_too():
    # A LoRA of another model misfits a 1x1 convolution (proj_in) as much as a linear layer, and a layer that already
    # carries an adapter (peft's wrapper, no nn.Linear itself) is checked by its base layer's widths.
    from gors.core.lora_shapes import lora_misfit
    from gors.lora import add_lora

    unet = torch.nn.Module()
    unet.proj_in = torch.nn.Conv2d(8, 16, 1)
    assert lora_misfit(_config_only(unet=unet), lora_layers(_pair("unet.proj_in", (4, 8, 1, 1), (16, 4, 1, 1)))) is None
    assert lora_misfit(_config_only(unet=unet), lora_layers(_pair("unet.proj_in", (4, 4, 1, 1), (16, 4, 1, 1)))) == (
        "its unet.proj_in maps 4 to 16 features, the model's layer 8 to 16")
    wrapped = torch.nn.Sequential(torch.nn.Linear(8, 16))
    add_lora(wrapped, ["0"], rank=2)
    assert type(wrapped[0]) is not torch.nn.Linear
    assert lora_misfit(_config_only(unet=wrapped), lora_layers(_pair("unet.0", (4, 8), (16, 4)))) is None
    assert lora_misfit(_config_only(unet=wrapped), lora_layers(_pair("unet.0", (4, 8), (32, 4)))) == (
        "its unet.0 maps 8 to 32 features, the model's layer 8 to 16")


@pytest.mark.parametrize("file_path", ["text_model.q_proj", "q_proj"])
@pytest.mark.parametrize("model_has_text_model", [True, False])
def test_a_text_encoder_s_layers_are_found_with_or_without_text_model(file_path, model_has_text_model):
    # transformers 5 dropped CLIP's `text_model.` level; LoRA files of either version name layers either way.
    from gors.core.lora_shapes import lora_misfit

    encoder = torch.nn.Module()
    if model_has_text_model:
        encoder.text_model = torch.nn.Module()
        encoder.text_model.q_proj = torch.nn.Linear(8, 8)
    else:
        encoder.q_proj = torch.nn.Linear(8, 8)
    pipeline = _config_only(text_encoder=encoder)
    assert lora_misfit(pipeline, lora_layers(_pair(f"text_encoder.{file_path}", (2, 8), (8, 2)))) is None
    assert "maps 8 to 4 features" in lora_misfit(pipeline, lora_layers(_pair(f"text_encoder.{file_path}", (2, 8), (4, 2))))


def test_only_components_with_fewer_layers_loaded_than_the_file_adapts_are_named():
    from gors.core.lora_shapes import UNPLACED, lora_layers_left_out

    assert lora_layers_left_out({"unet": 2, "text_encoder": 1}, {"unet": 2, "text_encoder": 1}) == []
    assert lora_layers_left_out({"unet": 2, "text_encoder": 1}, {"unet": 2}) == ["text_encoder: 1 in the file, 0 loaded"]
    # Names that say no component count against the whole: named only when fewer layers loaded in all.
    assert lora_layers_left_out({UNPLACED: 3}, {"unet": 3}) == []
    assert lora_layers_left_out({UNPLACED: 3}, {"unet": 2}) == ["unnamed layers: 3 in the file, 2 loaded"]


def test_a_peft_state_dict_with_several_adapters_is_told_to_save_one_per_file():
    from gors.core.lora_shapes import check_lora_shapes

    shapes = {f"{TO_Q}.lora_A.default.weight": (4, 64), f"{TO_Q}.lora_A.other.weight": (4, 64)}
    with pytest.raises(ValueError, match=r"adapter name 'default', 'other' .*drops the name, one adapter per file$"):
        check_lora_shapes(_config_only(), shapes, "x.safetensors")
    with pytest.raises(ValueError, match=r"drops the name$"):
        check_lora_shapes(_config_only(), {f"{TO_Q}.lora_A.default.weight": (4, 64)}, "x.safetensors")
