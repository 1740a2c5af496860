"""LoRA files: the text encoder's layers are named as in Hub LoRAs (under `text_model.`), whichever
transformers builds the encoder, and a file that does not fit the adapters is refused, not skipped."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import CLIPTextConfig, CLIPTextModel

from gors.lora import LORA_WEIGHT_NAME, TEXT_ENCODER_TARGET_MODULES, add_lora, load_lora, save_lora


def _encoder(seed: int) -> CLIPTextModel:
    torch.manual_seed(seed)
    encoder = CLIPTextModel(CLIPTextConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2,
                                           num_hidden_layers=1, vocab_size=64, bos_token_id=0, eos_token_id=1,
                                           pad_token_id=1))
    add_lora(encoder, TEXT_ENCODER_TARGET_MODULES, rank=2)
    for name, parameter in encoder.named_parameters():
        if "lora_B" in name:  # peft starts B at zero: make the adapters do something
            parameter.data.normal_()
    return encoder


def _lora_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters() if "lora_" in name}


def test_text_encoder_layers_are_saved_under_text_model_and_load_back(tmp_path):
    trained = _encoder(0)
    path = save_lora(tmp_path, {"text_encoder": trained})
    keys = list(load_file(str(path)))
    assert keys and all(key.startswith("text_encoder.text_model.encoder.layers.") for key in keys), keys[:2]
    fresh = _encoder(1)
    load_lora(tmp_path, {"text_encoder": fresh})
    expected, loaded = _lora_weights(trained), _lora_weights(fresh)
    assert expected.keys() == loaded.keys() and all(torch.equal(expected[k], loaded[k]) for k in expected)


def test_a_lora_file_that_does_not_fit_the_adapters_is_refused(tmp_path):
    path = save_lora(tmp_path, {"text_encoder": _encoder(0)})
    weights = load_file(str(path))
    renamed = {key.replace("text_model.encoder", "text_model.decoder"): value for key, value in weights.items()}
    save_file(renamed, str(tmp_path / LORA_WEIGHT_NAME))
    with pytest.raises(ValueError, match=r"its text_encoder LoRA does not fit the text_encoder's adapters: unexpected "):
        load_lora(tmp_path, {"text_encoder": _encoder(1)})


def test_a_lora_file_without_a_component_or_with_fewer_layers_is_refused(tmp_path):
    # A file saved without the text encoder's LoRA (a U-Net-only run) names the component; one that lacks some of
    # the adapters' weights (a smaller model's) names the first missing one, where peft would leave them at init.
    path = save_lora(tmp_path, {"text_encoder": _encoder(0)})
    with pytest.raises(ValueError, match=r"has no LoRA weights for the text_encoder_2; it was saved by a run that "
                                         r"did not train it"):
        load_lora(tmp_path, {"text_encoder": _encoder(1), "text_encoder_2": _encoder(2)})
    weights = load_file(str(path))
    save_file({key: value for key, value in weights.items() if ".q_proj." not in key}, str(path))
    with pytest.raises(ValueError, match=r"does not fit the text_encoder's adapters: missing \S*q_proj\S* \(2 in all\)"):
        load_lora(tmp_path, {"text_encoder": _encoder(1)})


def test_add_lora_trains_only_the_adapters_at_scale_1():
    """Only the adapters train (the base weights are frozen), alpha equals the rank (scale 1, as the released
    LoRAs), and `lora_parameters` lists the adapters that train, not one frozen since."""
    from gors.lora import lora_parameters

    encoder = _encoder(0)
    trainable = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    scalings = {value for module in encoder.modules() for value in getattr(module, "scaling", {}).values()}
    assert scalings == {1.0}
    assert len(lora_parameters(encoder)) == len(trainable)
    frozen = next(p for name, p in encoder.named_parameters() if "lora_A" in name)
    frozen.requires_grad_(False)
    assert len(lora_parameters(encoder)) == len(trainable) - 1 and all(p is not frozen for p in lora_parameters(encoder))
