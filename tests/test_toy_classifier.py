"""The toy-world presence classifier and its reward, on classifiers trained for a few steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.core.toy import world
from rewards import get_reward_class, load
from rewards.toy_classifier import ToyClassifierReward
from rewards.toy_cnn import (
    COMBINATIONS,
    ToyClassifier,
    images_to_tensor,
    predict_presence,
    random_scene_batch,
    sample_random_scene,
    scene_labels,
    train_classifier,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("toy_classifier")
    train_classifier(steps=30, batch_size=16, progress=False).save_pretrained(path)
    return path


class StubClassifier(torch.nn.Module):
    """Returns the logits of fixed probabilities for every image."""

    def __init__(self, probabilities: dict[tuple[str, str], float], default: float = 0.05) -> None:
        super().__init__()
        values = [probabilities.get(c, default) for c in COMBINATIONS]
        self.logits = torch.nn.Parameter(torch.logit(torch.tensor(values, dtype=torch.float64)).float())

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.logits.expand(images.shape[0], -1)


def test_combinations_follow_world_order() -> None:
    assert COMBINATIONS == [(o.colour, o.shape) for o in world.all_objects()]
    assert len(COMBINATIONS) == 12


def test_save_load_round_trip(model_dir: Path, tmp_path: Path) -> None:
    trained = train_classifier(steps=2, batch_size=4, progress=False).eval()
    assert sum(p.numel() for p in trained.parameters()) < 100_000
    trained.save_pretrained(tmp_path)
    again = ToyClassifier.from_pretrained(tmp_path)
    assert list(again.config.channels) == list(trained.config.channels)
    images, _ = random_scene_batch(np.random.default_rng(1), 8)
    model = ToyClassifier.from_pretrained(model_dir)
    with torch.no_grad():
        assert model(images).shape == (8, 12)
        assert torch.equal(trained(images), again(images))
        assert not torch.equal(model(images), again(images))


def test_same_seed_same_weights() -> None:
    first = train_classifier(steps=3, batch_size=8, progress=False).state_dict()
    second = train_classifier(steps=3, batch_size=8, progress=False).state_dict()
    other = train_classifier(steps=3, batch_size=8, seed=1, progress=False).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_random_scene_labels_match_rendering() -> None:
    images, labels = random_scene_batch(np.random.default_rng(3), 48, augment=False)
    replay = np.random.default_rng(3)
    scenes = [sample_random_scene(replay) for _ in range(48)]
    assert torch.equal(images, images_to_tensor([world.render(s) for s in scenes]))
    assert torch.equal(labels, torch.from_numpy(np.stack([scene_labels(s) for s in scenes])))
    assert {len(s) for s in scenes} == {0, 1, 2, 3}
    for scene, image in zip(scenes, images):
        assert len({(o.colour, o.shape) for o in scene}) == len(scene)  # distinct combinations
        assert all(14 <= o.size <= 26 for o in scene)
        pixels = (image.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        # No overlap: every object's whole mask shows its own colour.
        for obj in scene:
            mask = world.shape_mask(obj.shape, obj.cx, obj.cy, obj.size)
            assert (pixels[mask] == world.COLOURS[obj.colour]).all()
        drawn = sum(int(world.shape_mask(o.shape, o.cx, o.cy, o.size).sum()) for o in scene)
        assert int((pixels != world.BACKGROUND).any(axis=-1).sum()) == drawn


def test_augmented_batch_is_seeded_and_in_range() -> None:
    images, labels = random_scene_batch(np.random.default_rng(5), 16)
    again, labels_again = random_scene_batch(np.random.default_rng(5), 16)
    clean, clean_labels = random_scene_batch(np.random.default_rng(5), 16, augment=False)
    assert images.shape == (16, 3, 64, 64) and labels.shape == (16, 12)
    assert torch.equal(images, again) and torch.equal(labels, labels_again)
    assert torch.equal(labels, clean_labels)  # augmentation draws come after the scenes
    assert images.min() >= 0 and images.max() <= 1
    assert not torch.equal(images, clean)


def test_predict_presence_any_mode_and_size(model_dir: Path) -> None:
    model = ToyClassifier.from_pretrained(model_dir)
    scene = world.render(world.sample_scene(world.ToyPrompt.parse("a red circle"), np.random.default_rng(0)))
    images = [scene, scene.convert("L"), scene.convert("RGBA").resize((128, 96))]
    probabilities = predict_presence(model, images)
    assert probabilities.shape == (3, 12)
    assert ((probabilities >= 0) & (probabilities <= 1)).all()
    np.testing.assert_allclose(probabilities[0], predict_presence(model, [scene])[0], rtol=1e-5, atol=1e-6)
    assert predict_presence(model, []).shape == (0, 12)


def test_reward_loads_and_scores(model_dir: Path) -> None:
    assert get_reward_class("toy_classifier") is ToyClassifierReward
    assert ToyClassifierReward.categories == ("toy",)
    assert ToyClassifierReward.default_model.endswith(str(Path("gors", "core", "toy", "pretrained", "classifier")))
    reward = load("toy_classifier", model_name_or_path=str(model_dir), device="cpu", batch_size=2)
    rng = np.random.default_rng(0)
    prompt = world.ToyPrompt.parse("a red circle on the left of a blue square")
    scene = world.render(world.sample_scene(prompt, rng))
    images = [scene, scene.convert("L"), scene.resize((100, 100)).convert("RGBA")]
    output = reward.score(images, [prompt.text, "a yellow triangle", "a green circle and a red square"])
    assert len(output.scores) == 3 and all(0.0 <= s <= 1.0 for s in output.scores)
    assert set(output.details[0]["present"]) == {"red circle", "blue square"}
    assert set(output.details[1]["present"]) == {"yellow triangle"}
    assert all(len(d["confusions"]) == 1 for d in output.details)
    with pytest.raises(ValueError, match="not a toy-world prompt"):
        reward.score([scene], ["a photo of a cat"])


def test_score_formula_against_hand_computation(model_dir: Path) -> None:
    reward = ToyClassifierReward(model_name_or_path=str(model_dir), device="cpu")
    reward.model = StubClassifier(
        {
            ("red", "circle"): 0.9,
            ("blue", "square"): 0.7,
            ("red", "square"): 0.2,  # swapped bindings: share a colour or a shape with the prompt
            ("blue", "circle"): 0.4,
            ("green", "circle"): 0.1,
            ("green", "triangle"): 0.95,  # shares neither colour nor shape: not a confusion
        }
    )
    image = Image.new("RGB", (64, 64), "white")
    output = reward.score([image, image], ["a red circle and a blue square", "a red circle above a blue square"])
    expected = (0.9 + 0.7) / 2 * (1 - 0.4)
    assert output.scores == pytest.approx([expected, expected], abs=1e-6)
    assert output.details[0]["present"] == pytest.approx({"red circle": 0.9, "blue square": 0.7}, abs=1e-6)
    assert output.details[0]["confusions"] == pytest.approx({"blue circle": 0.4}, abs=1e-6)
    # One object: the confusions are the other red shapes and the other circles.
    single = reward.score([image], ["a red circle"])
    assert single.scores[0] == pytest.approx(0.9 * (1 - 0.4), abs=1e-6)
    assert single.details[0]["confusions"] == pytest.approx({"blue circle": 0.4}, abs=1e-6)
    # Green triangle 0.95 present; green circle 0.1 is its likeliest confusion (others 0.05).
    triangle = reward.score([image], ["a green triangle"])
    assert triangle.scores[0] == pytest.approx(0.95 * (1 - 0.1), abs=1e-6)


def test_missing_default_weights_say_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ToyClassifierReward, "default_model", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="gors toy pretrain"):
        ToyClassifierReward(device="cpu")
    with pytest.raises(FileNotFoundError, match="no such folder"):
        ToyClassifierReward(model_name_or_path=str(tmp_path / "elsewhere"), device="cpu")


def test_reward_refuses_non_toy_prompts_before_loading() -> None:
    """`check_prompts` is a class method: a non-toy prompt is refused before the classifier is loaded or an image
    generated, naming the first bad prompt."""
    ToyClassifierReward.check_prompts(["a red circle", "a blue square above a green triangle"], None)
    with pytest.raises(ValueError, match="toy_classifier reward judges toy-world prompts only; prompt 1: 'a cat'"):
        ToyClassifierReward.check_prompts(["a red circle", "a cat", "a dog"], None)


def test_a_confusion_need_share_only_with_one_prompt_object(model_dir: Path) -> None:
    """The combination "green circle" shares only the circle's shape with "a red circle and a blue square", yet it is a swapped
    binding of the circle: the penalty counts it, not only combinations sharing with both objects."""
    reward = ToyClassifierReward(model_name_or_path=str(model_dir), device="cpu")
    reward.model = StubClassifier({("red", "circle"): 0.9, ("blue", "square"): 0.7, ("green", "circle"): 0.6})
    output = reward.score([Image.new("RGB", (64, 64), "white")], ["a red circle and a blue square"])
    assert output.scores[0] == pytest.approx((0.9 + 0.7) / 2 * (1 - 0.6), abs=1e-6)
    assert output.details[0]["confusions"] == pytest.approx({"green circle": 0.6}, abs=1e-6)


def test_reward_runs_in_the_dtype_it_is_given(model_dir: Path) -> None:
    """`torch_dtype` reaches the loaded classifier (as for every reward), and the scores agree with float32's."""
    scene = world.render(world.sample_scene(world.ToyPrompt.parse("a red circle"), np.random.default_rng(1)))
    double = ToyClassifierReward(model_name_or_path=str(model_dir), device="cpu", torch_dtype=torch.float64)
    assert {p.dtype for p in double.model.parameters()} == {torch.float64}
    single = ToyClassifierReward(model_name_or_path=str(model_dir), device="cpu")
    assert double.score([scene], ["a red circle"]).scores == pytest.approx(
        single.score([scene], ["a red circle"]).scores, abs=1e-5
    )


def test_the_packaged_classifier_recognises_clean_and_augmented_random_scenes() -> None:
    """The shipped weights (about 99% exact match) pin the forward pass (input centring, average pool) and the
    augmentation they were trained on: a changed forward or a harsher augmentation drops the exact-match rate."""
    from gors.core.toy import PRETRAINED_DIR

    model = ToyClassifier.from_pretrained(PRETRAINED_DIR / "classifier")
    rng = np.random.default_rng(7)
    scenes = [sample_random_scene(rng) for _ in range(48)]
    labels = np.stack([scene_labels(s) for s in scenes]) > 0.5
    clean = predict_presence(model, [world.render(s) for s in scenes]) > 0.5
    assert (clean == labels).all(axis=1).mean() >= 0.95
    images, augmented_labels = random_scene_batch(np.random.default_rng(8), 48)
    with torch.no_grad():
        augmented = torch.sigmoid(model.eval()(images)).numpy() > 0.5
    assert (augmented == (augmented_labels.numpy() > 0.5)).all(axis=1).mean() >= 0.9


def test_gaussian_blur_matches_a_replicate_padded_convolution() -> None:
    """The blur-matrix products must equal the plain separable convolution with edges replicated, per image sigma:
    normalised kernels (a constant image stays constant), y then x, sigma 0 leaves the image unchanged."""
    import torch.nn.functional as F

    from rewards.toy_cnn import _gaussian_blur

    images = torch.rand(3, 3, 20, 20, generator=torch.Generator().manual_seed(0))
    sigmas = np.array([0.0, 0.7, 1.5])
    blurred = _gaussian_blur(images, sigmas)
    offsets = torch.arange(-3, 4, dtype=torch.float32)
    for image, sigma, result in zip(images, sigmas, blurred):
        kernel = torch.exp(-(offsets**2) / (2 * max(sigma, 1e-3) ** 2))
        kernel = kernel / kernel.sum()
        padded = F.pad(image[None], (3, 3, 3, 3), mode="replicate")
        along_y = F.conv2d(padded, kernel.view(1, 1, 7, 1).expand(3, 1, 7, 1), groups=3)
        expected = F.conv2d(along_y, kernel.view(1, 1, 1, 7).expand(3, 1, 1, 7), groups=3)[0]
        torch.testing.assert_close(result, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(blurred[0], images[0], atol=1e-6, rtol=0)
    white = torch.ones(2, 3, 16, 16)
    torch.testing.assert_close(_gaussian_blur(white, np.array([0.5, 1.5])), white, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="square images expected"):
        _gaussian_blur(torch.ones(1, 3, 16, 20), np.array([1.0]))


def test_augmentation_keeps_images_close_to_their_clean_renders() -> None:
    """The colour shift is at most 25/255 per channel, the blur sigma at most 1.5 and the noise small: with no shape
    distortion an augmented image stays close to its clean render."""
    images, _ = random_scene_batch(np.random.default_rng(5), 16, distort_probability=0.0)
    clean, _ = random_scene_batch(np.random.default_rng(5), 16, augment=False)
    assert (images - clean).abs().mean() < 0.08
    # With no distortion each image is its exact render, then blurred, shifted and noised (the two distortion draws
    # per scene still come from rng, before the pixel-level ones).
    from rewards.toy_cnn import augment_batch

    replay = np.random.default_rng(5)
    scenes = [sample_random_scene(replay) for _ in range(16)]
    replay.random(2 * len(scenes))
    torch.testing.assert_close(images, augment_batch(images_to_tensor([world.render(s) for s in scenes]), replay))


def test_bad_sizes_are_refused_with_their_names() -> None:
    # Without the checks a batch of 0 scenes fails inside numpy, and 0 steps returns an untrained model.
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        random_scene_batch(np.random.default_rng(0), 0)
    with pytest.raises(ValueError, match="steps and batch_size must be >= 1"):
        train_classifier(steps=0, progress=False)


def test_training_returns_an_eval_model_with_its_learning_rate_decayed_to_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An eval-mode model (BatchNorm running statistics) comes back, and the cosine schedule spans exactly `steps`."""
    optimizers: list[torch.optim.Optimizer] = []
    adamw = torch.optim.AdamW

    def recording_adamw(*args: object, **kwargs: object) -> torch.optim.Optimizer:
        optimizers.append(adamw(*args, **kwargs))
        return optimizers[-1]

    monkeypatch.setattr(torch.optim, "AdamW", recording_adamw)
    model = train_classifier(steps=4, batch_size=4, progress=False)
    assert not model.training
    assert optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)


def test_predict_presence_uses_running_statistics_and_restores_the_training_mode(model_dir: Path) -> None:
    """A model in training mode would normalise a batch of one image by its own statistics; predict_presence must
    give the eval-mode answer and leave the model training."""
    model = ToyClassifier.from_pretrained(model_dir)
    scene = world.render(world.sample_scene(world.ToyPrompt.parse("a red circle"), np.random.default_rng(0)))
    expected = predict_presence(model, [scene])
    model.train()
    np.testing.assert_allclose(predict_presence(model, [scene]), expected, rtol=1e-6, atol=1e-7)
    assert model.training
