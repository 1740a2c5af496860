"""Each trained family's reward-weighted loss against diffusers' own training loop for it, written out here.

The references follow diffusers' example scripts at their defaults, one micro-batch in float32:
`train_text_to_image_lora_sdxl.py` (SDXL: DDPM noise, the time ids from original size, crop and
target size, both CLIP encoders' penultimate states and bigG's pooled projection),
`train_dreambooth_lora_sd3.py` (SD3, without `--precondition_outputs`, which gors does not apply:
docs/model_families.md, "Training on each family") and `train_dreambooth_lora_flux.py` (FLUX.1: packed latents,
timestep / 1000, the guidance vector of dev, none for schnell). Both sides draw their own noise and
timesteps from the same seed, in the scripts' order (noise, then timesteps), and weight each
sample's loss by its reward (GORS' loss). They agree to float rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gors.config import TrainConfig
from gors.core.backbones import detect_backbone
from gors.families import Batch, resolve_training

PROMPTS = ["a red cube on a blue sphere", "a cat", ""]
REWARDS = torch.tensor([0.2, 0.7, 1.0])
SEED = 5


def family_of(model: Path, **settings):
    config = TrainConfig(pretrained_model_name_or_path=str(model), resolution=32, **settings)
    return resolve_training(config, detect_backbone(str(model)))[1]


def encoded(family) -> tuple[dict, dict, dict]:
    """The tokens, the loaded encoders and their encodings, by component."""
    tokens, encoders, encodings = {}, {}, {}
    with torch.no_grad():
        for encoder in family.text_encoders:
            tokens[encoder.component] = family.tokenize(encoder, family.load(encoder.tokenizer), PROMPTS)
            encoders[encoder.component] = family.load(encoder.component)
            encodings[encoder.component] = family.encode(encoder, encoders[encoder.component], tokens[encoder.component])
    return tokens, encoders, encodings


def raw_latents(vae) -> torch.Tensor:
    """VAE latents as the encoder gives them (before shift and scale)."""
    return torch.randn(len(PROMPTS), vae.config.latent_channels, 16, 16, generator=torch.Generator().manual_seed(1))


def ours(family, denoiser, scheduler, batch: Batch, encodings: dict) -> float:
    conditioning = family.condition(encodings, batch, torch.float32)
    with torch.no_grad():
        torch.manual_seed(SEED)
        noise, position = family.sample_noise(batch.latents, scheduler)
        return float(family.loss(denoiser, scheduler, batch, conditioning, noise, position, torch.float32))


def test_sdxl_loss_is_the_sdxl_lora_scripts(tiny_sdxl):
    family = family_of(tiny_sdxl)
    unet, vae, scheduler = family.load("unet").eval(), family.load("vae"), family.load_scheduler()
    tokens, encoders, encodings = encoded(family)
    raw = raw_latents(vae)
    sizes, crops = torch.tensor([[40, 56], [32, 32], [72, 40]]), torch.tensor([[0, 6], [0, 0], [12, 0]])
    loss = ours(family, unet, scheduler, Batch(family.scale_latents(raw, vae.config), REWARDS, sizes, crops), encodings)

    with torch.no_grad():
        torch.manual_seed(SEED)
        model_input = raw * vae.config.scaling_factor
        noise = torch.randn_like(model_input)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (len(raw),)).long()
        noisy = scheduler.add_noise(model_input, noise, timesteps)
        time_ids = torch.tensor([[*size, *crop, 32, 32] for size, crop in zip(sizes.tolist(), crops.tolist())],
                                dtype=torch.float32)
        states = []
        for component in ("text_encoder", "text_encoder_2"):
            output = encoders[component](tokens[component], output_hidden_states=True)
            states.append(output.hidden_states[-2])
            pooled = output[0]  # the last encoder's: bigG's projected text embedding
        prediction = unet(noisy, timesteps, torch.cat(states, dim=-1),
                          added_cond_kwargs={"time_ids": time_ids, "text_embeds": pooled}).sample
        if scheduler.config.prediction_type == "epsilon":
            target = noise
        else:
            target = scheduler.get_velocity(model_input, noise, timesteps)
        per_sample = F.mse_loss(prediction.float(), target.float(), reduction="none").mean(dim=[1, 2, 3])
    assert loss == pytest.approx(float((REWARDS * per_sample).mean()), rel=1e-5)


def flow_matching_reference(family, transformer, scheduler, raw: torch.Tensor, vae_config, conditioning: dict,
                            scheme: str, flux: bool) -> torch.Tensor:
    """Per-sample losses as `train_dreambooth_lora_{sd3,flux}.py` compute them."""
    from diffusers import FluxPipeline
    from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

    model_input = (raw - vae_config.shift_factor) * vae_config.scaling_factor
    noise = torch.randn_like(model_input)
    u = compute_density_for_timestep_sampling(weighting_scheme=scheme, batch_size=len(raw), logit_mean=0.0,
                                              logit_std=1.0, mode_scale=1.29)
    indices = (u * scheduler.config.num_train_timesteps).long()
    timesteps = scheduler.timesteps[indices]
    sigmas = scheduler.sigmas[[(scheduler.timesteps == t).nonzero().item() for t in timesteps]].view(-1, 1, 1, 1)
    noisy = (1.0 - sigmas) * model_input + sigmas * noise
    if flux:
        b, c, h, w = model_input.shape
        guidance = None
        if transformer.config.guidance_embeds:
            guidance = torch.full((b,), float(family.settings["guidance_scale"]))
        prediction = transformer(
            hidden_states=FluxPipeline._pack_latents(noisy, b, c, h, w), timestep=timesteps / 1000, guidance=guidance,
            pooled_projections=conditioning["pooled_projections"],
            encoder_hidden_states=conditioning["encoder_hidden_states"], txt_ids=conditioning["txt_ids"],
            img_ids=FluxPipeline._prepare_latent_image_ids(b, h // 2, w // 2, "cpu", torch.float32),
        ).sample
        prediction = FluxPipeline._unpack_latents(prediction, h * 8, w * 8, 8)
    else:
        prediction = transformer(hidden_states=noisy, timestep=timesteps,
                                 encoder_hidden_states=conditioning["encoder_hidden_states"],
                                 pooled_projections=conditioning["pooled_projections"]).sample
    weighting = compute_loss_weighting_for_sd3(weighting_scheme=scheme, sigmas=sigmas)
    return (weighting.float() * (prediction.float() - (noise - model_input).float()) ** 2).reshape(len(raw), -1).mean(1)


@pytest.mark.parametrize(("model", "scheme"), [
    ("tiny_sd3", "logit_normal"), ("tiny_sd3", "mode"), ("tiny_sd3", "none"), ("tiny_flux", "none"),
    ("tiny_flux", "logit_normal"), ("tiny_flux_schnell", "none"),
    # The loss weightings of the sigmas (sigma^-2, cosmap): the others weight every sample by 1.
    ("tiny_sd3", "sigma_sqrt"), ("tiny_sd3", "cosmap"), ("tiny_flux", "cosmap"),
])
def test_flow_matching_loss_is_the_dreambooth_lora_scripts(model, scheme, request, tmp_path):
    if model == "tiny_flux_schnell":
        from gors.testing.flux import build_tiny_flux_pipeline

        path = build_tiny_flux_pipeline(tmp_path / "schnell", seed=0, schnell=True)
    else:
        path = request.getfixturevalue(model)
    family = family_of(path, weighting_scheme=scheme)
    transformer, vae, scheduler = family.load("transformer").eval(), family.load("vae"), family.load_scheduler()
    _, _, encodings = encoded(family)
    raw = raw_latents(vae)
    no_sizes = torch.tensor([[32, 32]] * len(raw))
    batch = Batch(family.scale_latents(raw, vae.config), REWARDS, no_sizes, torch.zeros_like(no_sizes))
    loss = ours(family, transformer, scheduler, batch, encodings)
    with torch.no_grad():
        torch.manual_seed(SEED)
        per_sample = flow_matching_reference(family, transformer, scheduler, raw, vae.config,
                                             family.condition(encodings, batch, torch.float32), scheme,
                                             flux=model != "tiny_sd3")
    assert (model == "tiny_flux") == bool(getattr(transformer.config, "guidance_embeds", False))
    assert loss == pytest.approx(float((REWARDS * per_sample).mean()), rel=1e-5)
