import pytest
import torch
from diffusers import DDPMScheduler

from gors.loss import diffusion_target, reward_weighted_loss


def test_loss_equals_formula_on_hand_made_batch():
    pred = torch.zeros(2, 1, 1, 2)
    target = torch.tensor([[[[1.0, 3.0]]], [[[2.0, 0.0]]]])
    rewards = torch.tensor([0.5, 1.0])
    # per-sample MSE over C,H,W: (1 + 9) / 2 = 5 and (4 + 0) / 2 = 2; weighted: 2.5, 2.0; batch mean 2.25
    assert reward_weighted_loss(pred, target, rewards).item() == pytest.approx(2.25)


def test_zero_reward_sample_contributes_nothing():
    pred, target = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8)
    rewards = torch.tensor([1.0, 0.0, 1.0])
    full = reward_weighted_loss(pred, target, rewards)
    changed = target.clone()
    changed[1] += 100.0
    assert torch.equal(full, reward_weighted_loss(pred, changed, rewards))


def test_unit_rewards_give_plain_mse():
    pred, target = torch.randn(4, 4, 8, 8), torch.randn(4, 4, 8, 8)
    loss = reward_weighted_loss(pred, target, torch.ones(4))
    assert loss.item() == pytest.approx(torch.nn.functional.mse_loss(pred, target).item(), rel=1e-6)


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="rewards must have shape"):
        reward_weighted_loss(torch.zeros(2, 4, 2, 2), torch.zeros(2, 4, 2, 2), torch.ones(3))


def test_target_follows_prediction_type():
    latents, noise = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
    timesteps = torch.tensor([10, 500])
    eps = DDPMScheduler(prediction_type="epsilon")
    assert torch.equal(diffusion_target(eps, latents, noise, timesteps), noise)
    v = DDPMScheduler(prediction_type="v_prediction")
    alpha = v.alphas_cumprod[timesteps].sqrt().view(-1, 1, 1, 1)
    sigma = (1 - v.alphas_cumprod[timesteps]).sqrt().view(-1, 1, 1, 1)
    assert torch.allclose(diffusion_target(v, latents, noise, timesteps), alpha * noise - sigma * latents, atol=1e-6)
    with pytest.raises(ValueError, match="sample"):
        diffusion_target(DDPMScheduler(prediction_type="sample"), latents, noise, timesteps)
