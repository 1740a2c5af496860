"""GORS training maths, as pure functions (tested without models)."""

from __future__ import annotations

import torch


def reward_weighted_loss(model_pred: torch.Tensor, target: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """GORS loss: `mean_b( s_b * mean_{C,H,W} (target_b - pred_b)^2 )`.

    Args:
        model_pred: U-Net output, shape (B, C, H, W).
        target: the noise (epsilon prediction) or the velocity (v prediction), same shape.
        rewards: s_b in [0, 1], shape (B,); each sample's reward weights its denoising error.

    Returns:
        A scalar tensor (float32).
    """
    if model_pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(model_pred.shape)} and target {tuple(target.shape)} differ in shape")
    if rewards.shape != model_pred.shape[:1]:
        raise ValueError(f"rewards must have shape ({model_pred.shape[0]},), got {tuple(rewards.shape)}")
    per_sample = (model_pred.float() - target.float()).pow(2).flatten(1).mean(dim=1)
    return (rewards.float() * per_sample).mean()


def diffusion_target(scheduler, latents: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor) -> torch.Tensor:
    """What the U-Net learns to predict, by the scheduler's `prediction_type` ('epsilon' or 'v_prediction')."""
    prediction_type = scheduler.config.prediction_type
    if prediction_type == "epsilon":
        return noise
    if prediction_type == "v_prediction":
        return scheduler.get_velocity(latents, noise, timesteps)
    raise ValueError(f"Unsupported prediction_type {prediction_type!r}: GORS trains 'epsilon' or 'v_prediction' models")
