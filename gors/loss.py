"""GORS training maths, as pure functions (tested without models).

Two kinds of denoiser train here. Stable Diffusion 1/2 and SDXL are DDPM models: noise is added
at a uniform integer timestep and the model predicts the noise (or the velocity). SD3/3.5 and
FLUX.1 are rectified flows: `x_sigma = (1 - sigma) x0 + sigma noise` at a sigma of the
scheduler's table drawn from a timestep density, and the model predicts `noise - x0`. The
densities and loss weightings are those of diffusers' DreamBooth-LoRA SD3 and FLUX scripts
(`diffusers.training_utils`), written out here so they are tested against their formulas. The
target is the unpreconditioned `noise - x0` of the FLUX script and the SD3 paper. diffusers' SD3
script defaults instead to `--precondition_outputs 1`: it compares `x_sigma - sigma * pred` with
`x0`, which is this loss times sigma^2 per sample (less weight on the less noisy samples); gors does not.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from diffusers import SchedulerMixin


def reward_weighted_loss(model_pred: torch.Tensor, target: torch.Tensor, rewards: torch.Tensor,
                         weighting: torch.Tensor | None = None) -> torch.Tensor:
    """GORS loss: `mean_b( s_b * w_b * mean_{C,H,W} (target_b - pred_b)^2 )`.

    Args:
        model_pred: denoiser output, shape (B, ...): (B, C, H, W) latents, or (B, tokens, channels)
            for FLUX's packed latents.
        target: the noise (epsilon prediction), the velocity (v prediction) or `noise - x0` (flow
            matching), same shape.
        rewards: s_b in [0, 1], shape (B,); each sample's reward weights its denoising error.
        weighting: w_b >= 0, shape (B,): the flow-matching loss weighting of each sample's sigma
            (`flow_matching_weighting`); None for 1.

    Returns:
        A scalar tensor (float32).
    """
    if model_pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(model_pred.shape)} and target {tuple(target.shape)} differ in shape")
    if rewards.shape != model_pred.shape[:1]:
        raise ValueError(f"rewards must have shape ({model_pred.shape[0]},), got {tuple(rewards.shape)}")
    per_sample = (model_pred.float() - target.float()).pow(2).flatten(1).mean(dim=1)
    if weighting is not None:
        per_sample = weighting.float() * per_sample
    return (rewards.float() * per_sample).mean()


def diffusion_target(scheduler: SchedulerMixin, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """What the U-Net learns to predict, by the scheduler's `prediction_type` ('epsilon' or 'v_prediction')."""
    prediction_type = scheduler.config.prediction_type
    if prediction_type == "epsilon":
        return noise
    if prediction_type == "v_prediction":
        return scheduler.get_velocity(latents, noise, timesteps)
    raise ValueError(f"Unsupported prediction_type {prediction_type!r}: GORS trains 'epsilon' or 'v_prediction' models")


def timestep_density(scheme: str, batch_size: int, logit_mean: float = 0.0, logit_std: float = 1.0,
                     mode_scale: float = 1.29) -> torch.Tensor:
    """u in [0, 1], shape (batch_size,): where in the schedule each sample's sigma is taken.

    'logit_normal': sigmoid of N(logit_mean, logit_std) (SD3 paper, section 3.1); 'mode': the
    mode-centred density `1 - u - mode_scale (cos^2(pi u / 2) - 1 + u)` of a uniform u; otherwise
    uniform. Drawn from the global CPU generator, which `accelerate.set_seed` seeds.
    """
    if scheme == "logit_normal":
        return torch.sigmoid(torch.normal(logit_mean, logit_std, size=(batch_size,)))
    u = torch.rand(batch_size)
    if scheme == "mode":
        return 1 - u - mode_scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u)
    return u


def flow_matching_sigmas(scheduler: SchedulerMixin, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(timesteps, sigmas) of the scheduler's training table at the positions `u` in [0, 1].

    Index `floor(u * num_train_timesteps)` of the scheduler's `timesteps` and `sigmas`, as diffusers'
    scripts index them: with its static `shift` included (SD3, as the pipeline samples); a
    scheduler with `use_dynamic_shifting` (FLUX.1) holds unshifted sigmas here, where the pipeline
    shifts by resolution at sampling time, as in diffusers' FLUX script too.
    """
    indices = (u * scheduler.config.num_train_timesteps).long().clamp(0, len(scheduler.timesteps) - 1)
    return scheduler.timesteps[indices], scheduler.sigmas[indices]


def flow_matching_weighting(scheme: str, sigmas: torch.Tensor) -> torch.Tensor:
    """The per-sample loss weight of each sigma: 'sigma_sqrt' sigma^-2, 'cosmap' 2 / (pi (1 - 2 sigma + 2 sigma^2)),
    otherwise 1 (the densities carry the emphasis)."""
    if scheme == "sigma_sqrt":
        return sigmas.float() ** -2.0
    if scheme == "cosmap":
        return 2 / (math.pi * (1 - 2 * sigmas.float() + 2 * sigmas.float() ** 2))
    return torch.ones_like(sigmas, dtype=torch.float32)


def flow_matching_noisy(latents: torch.Tensor, noise: torch.Tensor, sigmas: torch.Tensor) -> torch.Tensor:
    """`x_sigma = (1 - sigma) x0 + sigma noise`, sigmas of shape (B,) broadcast over the rest."""
    sigmas = sigmas.view(-1, *([1] * (latents.dim() - 1))).to(latents.dtype)
    return (1.0 - sigmas) * latents + sigmas * noise
