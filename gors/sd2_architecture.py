"""The Stable Diffusion 2 base architecture (U-Net and text encoder) as configs, built without weights.

The official GORS LoRA checkpoints are lists of tensors whose meaning is the position of a layer
in the model, so converting them needs the module tree of the base model but none of its
weights. The tree comes from the model's own config files (`unet/config.json`,
`text_encoder/config.json`), read from the Hub or a local folder. For
`stabilityai/stable-diffusion-2-base` the same configs are written below, so the conversion also
runs on a machine that has neither the network nor a cached copy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gors.core.hub import check_model_path, load_hint, one_line, raise_if_gated

if TYPE_CHECKING:
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel

logger = logging.getLogger(__name__)

SD2_BASE = "stabilityai/stable-diffusion-2-base"

# stabilityai/stable-diffusion-2-base, unet/config.json (865.9 M parameters). `attention_head_dim`
# is, despite its name, the number of heads per block (diffusers keeps the historical key).
SD2_BASE_UNET_CONFIG: dict[str, Any] = {
    "act_fn": "silu",
    "attention_head_dim": [5, 10, 20, 20],
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 1024,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1,
    "dual_cross_attention": False,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 4,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "use_linear_projection": True,
}

# stabilityai/stable-diffusion-2-base, text_encoder/config.json: the OpenCLIP ViT-H/14 text tower
# with its last layer dropped (SD 2 conditions on the penultimate layer), hence 23 layers.
SD2_BASE_TEXT_ENCODER_CONFIG: dict[str, Any] = {
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "dropout": 0.0,
    "eos_token_id": 2,
    "hidden_act": "gelu",
    "hidden_size": 1024,
    "initializer_factor": 1.0,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77,
    "num_attention_heads": 16,
    "num_hidden_layers": 23,
    "pad_token_id": 1,
    "projection_dim": 512,
    "vocab_size": 49408,
}


def architecture_configs(pretrained_model_name_or_path: str = SD2_BASE) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (U-Net, text encoder) configs of a Stable Diffusion model folder or Hub id; no weights are read.

    For `stabilityai/stable-diffusion-2-base`, when its config files cannot be read (offline, not
    cached), the configs written in this module are used instead.
    """
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig

    name = check_model_path(pretrained_model_name_or_path)
    try:
        unet_config = dict(UNet2DConditionModel.load_config(name, subfolder="unet"))
        text_config = CLIPTextConfig.from_pretrained(name, subfolder="text_encoder").to_dict()
    except (OSError, ValueError) as err:
        raise_if_gated(err, name, "--pretrained_model_name_or_path")
        if pretrained_model_name_or_path == SD2_BASE:
            logger.info("Config of %s not readable (%s); using the SD 2 base configs written in gors.", SD2_BASE, err)
            return dict(SD2_BASE_UNET_CONFIG), dict(SD2_BASE_TEXT_ENCODER_CONFIG)
        raise OSError(
            f"--pretrained_model_name_or_path={pretrained_model_name_or_path!r}: could not read "
            f"unet/config.json and text_encoder/config.json ({one_line(err)}). Pass a Stable Diffusion folder or "
            f"Hub id whose configs are reachable (only the configs are needed, not the weights). {load_hint(name, err)}"
        ) from err
    return unet_config, text_config


def empty_models(unet_config: dict[str, Any], text_encoder_config: dict[str, Any]
                 ) -> tuple[UNet2DConditionModel, CLIPTextModel]:
    """A `UNet2DConditionModel` and a `CLIPTextModel` with their parameters on the meta device.

    Building them this way allocates no memory and takes about a second, against tens of seconds
    and 5 GB for a random initialisation of the full SD 2 models; names and shapes are exact.
    Call `.to_empty(device=...)` to materialise (uninitialised) parameters.
    """
    from accelerate import init_empty_weights
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    with init_empty_weights():
        unet = UNet2DConditionModel.from_config(unet_config)
        text_encoder = CLIPTextModel(CLIPTextConfig(**text_encoder_config))
    return unet.eval(), text_encoder.eval()

