"""The training losses as pure functions: GORS's reward-weighted DDPM loss and the flow-matching pieces."""

import math

import pytest
import torch
from diffusers import DDPMScheduler, FlowMatchEulerDiscreteScheduler
from diffusers.training_utils import compute_density_for_timestep_sampling, compute_loss_weighting_for_sd3

from gors.loss import (
    diffusion_target,
    flow_matching_noisy,
    flow_matching_sigmas,
    flow_matching_weighting,
    reward_weighted_loss,
    timestep_density,
)


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
    # A target that would broadcast against the prediction (one channel for four) is refused, not averaged silently.
    with pytest.raises(ValueError, match=r"prediction \(2, 4, 2, 2\) and target \(2, 1, 2, 2\) differ in shape"):
        reward_weighted_loss(torch.zeros(2, 4, 2, 2), torch.zeros(2, 1, 2, 2), torch.ones(2))


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


# ---- flow matching (SD3, FLUX.1) ------------------------------------------------------------------

# Two samples of shape (1, 1, 2) at sigmas 0.25 and 0.5.
SIGMAS = torch.tensor([0.25, 0.5])
X0 = torch.tensor([[[[1.0, 2.0]]], [[[0.0, -2.0]]]])
NOISE = torch.tensor([[[[3.0, 0.0]]], [[[2.0, 2.0]]]])
PREDICTION = torch.tensor([[[[1.0, -1.0]]], [[[0.0, 4.0]]]])
REWARDS = torch.tensor([1.0, 0.5])


@pytest.mark.parametrize("scheme, expected", [
    # target noise - x0 = [2, -2] and [2, 4]; squared errors per sample: (1 + 1) / 2 = 1 and (4 + 0) / 2 = 2;
    # times the rewards 1 and 0.5: 1 and 1.
    ("none", (1.0 + 1.0) / 2),
    # weights sigma^-2 = 16 and 4
    ("sigma_sqrt", (16 * 1.0 + 4 * 1.0) / 2),
    # weights 2 / (pi (1 - 2 sigma + 2 sigma^2)) = 2 / (0.625 pi) and 2 / (0.5 pi)
    ("cosmap", (3.2 / math.pi * 1.0 + 4 / math.pi * 1.0) / 2),
], ids=["none", "sigma_sqrt", "cosmap"])
def test_flow_matching_loss_equals_formula_on_hand_made_batch(scheme, expected):
    weighting = flow_matching_weighting(scheme, SIGMAS)
    loss = reward_weighted_loss(PREDICTION, NOISE - X0, REWARDS, weighting)
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_flow_matching_noisy_interpolates_data_and_noise():
    # (1 - 0.25) [1, 2] + 0.25 [3, 0] = [1.5, 1.5]; (1 - 0.5) [0, -2] + 0.5 [2, 2] = [1, 0]
    expected = torch.tensor([[[[1.5, 1.5]]], [[[1.0, 0.0]]]])
    assert torch.allclose(flow_matching_noisy(X0, NOISE, SIGMAS), expected)
    assert torch.equal(flow_matching_noisy(X0, NOISE, torch.zeros(2)), X0)
    assert torch.equal(flow_matching_noisy(X0, NOISE, torch.ones(2)), NOISE)


def test_flow_matching_weighting_equals_diffusers_scripts():
    sigmas = torch.linspace(0.01, 1.0, 50)
    for scheme in ("none", "sigma_sqrt", "cosmap", "logit_normal", "mode"):
        assert torch.allclose(flow_matching_weighting(scheme, sigmas), compute_loss_weighting_for_sd3(scheme, sigmas))


def test_flow_matching_sigmas_index_the_shifted_training_table():
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    u = torch.tensor([0.0, 0.0015, 0.25, 0.5, 0.9999])
    timesteps, sigmas = flow_matching_sigmas(scheduler, u)
    indices = [0, 1, 250, 500, 999]  # floor(u * 1000)
    unshifted = torch.tensor([(1000 - i) / 1000 for i in indices])  # the table runs from t = 1000 down to 1
    assert torch.allclose(sigmas, 3.0 * unshifted / (1 + 2.0 * unshifted), atol=1e-6)
    assert torch.allclose(timesteps, sigmas * 1000, atol=1e-3)  # the timestep the denoiser sees
    assert sigmas[0] == 1.0 and torch.all(sigmas[1:] < sigmas[:-1])
    # u = 1 (the 'mode' density gives it at a uniform draw of 0) would index one past the end: the last entry.
    timesteps, sigmas = flow_matching_sigmas(scheduler, torch.tensor([1.0]))
    assert sigmas.item() == pytest.approx(3.0 * 0.001 / (1 + 2.0 * 0.001))
    assert timesteps.item() == scheduler.timesteps[-1]


def test_logit_normal_density_has_the_given_logit_mean_and_std():
    torch.manual_seed(0)
    u = timestep_density("logit_normal", 20000, logit_mean=0.5, logit_std=0.8)
    assert u.shape == (20000,) and torch.all((u > 0) & (u < 1))
    logits = torch.logit(u.double())
    # standard errors 0.8 / sqrt(20000) = 0.006 (mean) and about 0.004 (std)
    assert logits.mean().item() == pytest.approx(0.5, abs=0.03)
    assert logits.std().item() == pytest.approx(0.8, abs=0.02)


def test_mode_density_is_the_formula_of_a_uniform_draw():
    def seeded_uniform():
        torch.manual_seed(0)
        return torch.rand(20000)

    u = seeded_uniform()
    torch.manual_seed(0)
    assert torch.equal(timestep_density("mode", 20000, mode_scale=0.0), 1 - u)
    scale = 1.29
    torch.manual_seed(0)
    mode = timestep_density("mode", 20000, mode_scale=scale)
    assert torch.allclose(mode, 1 - u - scale * (torch.cos(math.pi * u / 2) ** 2 - 1 + u), atol=1e-6)
    assert torch.all((mode >= 0) & (mode <= 1))
    # mode - 1/2 = -(1 + s)(u - 1/2) - (s / 2) cos(pi u): mean 1/2, as uniform, but the mass gathers in the
    # middle: variance (1 + s)^2 / 12 + s^2 / 8 - 2 s (1 + s) / pi^2 = 0.0464 instead of 1 / 12.
    variance = (1 + scale) ** 2 / 12 + scale ** 2 / 8 - 2 * scale * (1 + scale) / math.pi ** 2
    assert mode.mean().item() == pytest.approx(0.5, abs=0.01)
    assert mode.var().item() == pytest.approx(variance, abs=0.002) and variance < 1 / 12 - 0.03
    # The scales --mode_scale takes map u monotonely into [0, 1] (the SD3 paper's condition); past them the map
    # turns back (above) or leaves [0, 1] (below -1), which the config refuses.
    from gors.config import MODE_SCALE_MAX

    order = u.argsort()
    for scale, defined in ((-1.0, True), (MODE_SCALE_MAX, True), (-1.1, False), (MODE_SCALE_MAX + 0.1, False)):
        torch.manual_seed(0)
        mode = timestep_density("mode", 20000, mode_scale=scale)
        monotone = bool(torch.all(mode[order].diff() <= 1e-6))
        assert (monotone and bool(torch.all((mode >= 0) & (mode <= 1)))) == defined, scale


@pytest.mark.parametrize("scheme", ["none", "uniform", "sigma_sqrt", "cosmap"])
def test_other_schemes_draw_uniform_positions(scheme):
    torch.manual_seed(0)
    expected = torch.rand(8)
    torch.manual_seed(0)
    assert torch.equal(timestep_density(scheme, 8), expected)


@pytest.mark.parametrize("scheme", ["logit_normal", "mode", "none", "cosmap"])
def test_densities_equal_diffusers_scripts_on_the_same_draw(scheme):
    torch.manual_seed(0)
    ours = timestep_density(scheme, 64, logit_mean=0.3, logit_std=1.2, mode_scale=1.29)
    torch.manual_seed(0)
    theirs = compute_density_for_timestep_sampling(scheme, 64, logit_mean=0.3, logit_std=1.2, mode_scale=1.29)
    assert torch.allclose(ours, theirs)
