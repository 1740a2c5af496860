"""LoRA on the U-Net and the text encoder, saved and loaded in the diffusers format.

The targets are the official GORS ones (T2I-CompBench trained with `lora_diffusion`): every
attention projection of the U-Net (self- and cross-attention) and of the CLIP text encoder.
Alpha equals the rank, so the LoRA scale is 1 as in the released checkpoints.
"""

from __future__ import annotations

from pathlib import Path

import torch

UNET_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
TEXT_ENCODER_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "out_proj")
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def _lora_config(rank: int, targets: tuple[str, ...]):
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=list(targets))


def add_lora(unet: torch.nn.Module | None, text_encoder: torch.nn.Module | None, rank: int) -> None:
    """Inject rank-`rank` LoRA adapters; base weights are frozen, only the adapters train.

    The text encoder gets its adapter from peft directly: transformers 5 refuses
    `PreTrainedModel.add_adapter` with current peft releases.
    """
    from peft import inject_adapter_in_model

    if unet is not None:
        unet.requires_grad_(False)
        unet.add_adapter(_lora_config(rank, UNET_TARGET_MODULES))
    if text_encoder is not None:
        text_encoder.requires_grad_(False)
        inject_adapter_in_model(_lora_config(rank, TEXT_ENCODER_TARGET_MODULES), text_encoder)


def lora_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for name, p in module.named_parameters() if "lora_" in name and p.requires_grad]


def _diffusers_layers(module: torch.nn.Module | None) -> dict[str, torch.Tensor] | None:
    if module is None:
        return None
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    return convert_state_dict_to_diffusers(get_peft_model_state_dict(module))


def save_lora(save_dir: str | Path, unet: torch.nn.Module | None, text_encoder: torch.nn.Module | None) -> Path:
    """Write `pytorch_lora_weights.safetensors` that `StableDiffusionPipeline.load_lora_weights` reads."""
    from diffusers import StableDiffusionPipeline

    StableDiffusionPipeline.save_lora_weights(
        save_dir, unet_lora_layers=_diffusers_layers(unet), text_encoder_lora_layers=_diffusers_layers(text_encoder)
    )
    return Path(save_dir) / LORA_WEIGHT_NAME


def load_lora(load_dir: str | Path, unet: torch.nn.Module | None, text_encoder: torch.nn.Module | None) -> None:
    """Load a diffusers-format LoRA into modules that already carry adapters (see `add_lora`)."""
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import (
        convert_state_dict_to_diffusers,
        convert_state_dict_to_peft,
        convert_unet_state_dict_to_peft,
    )
    from peft.utils import set_peft_model_state_dict

    state_dict, _alphas = StableDiffusionPipeline.lora_state_dict(str(load_dir))

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}

    if unet is not None:
        set_peft_model_state_dict(unet, convert_unet_state_dict_to_peft(part("unet.")), adapter_name="default")
    if text_encoder is not None:
        converted = convert_state_dict_to_peft(convert_state_dict_to_diffusers(part("text_encoder.")))
        set_peft_model_state_dict(text_encoder, converted, adapter_name="default")
