"""rewards.base on its own: the Reward class's defaults, its model list, its checks of what `_score` returns,
and the batching helper for models that pad their batches."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from gors.core.scoring import RewardError
from rewards.base import Reward, RewardOutput, same_size_batches


def test_batches_hold_one_image_size_each_smallest_first():
    sizes = [(8, 8), (4, 4), (8, 8), (4, 4), (4, 4), (6, 4)]
    images = [Image.new("RGB", size) for size in sizes]
    assert same_size_batches(images, range(len(images)), 2) == [[1, 3], [4], [5], [0, 2]]
    assert same_size_batches(images, [2, 0], 8) == [[2, 0]]  # the indices given, in their order within a size


class _Models(Reward):
    default_model = "org/main"
    default_detector_model = "org/detector"  # wins over the argument's own default, as `default_model` does
    model_objects = {"detector_model_name_or_path": "detector"}

    def __init__(self, model_name_or_path=None, detector_model_name_or_path="org/detector-argument", detector=None,
                 depth_model_name_or_path="org/depth", threshold=0.5):
        super().__init__(model_name_or_path)

    def _score(self, images, prompts, metadata):
        return RewardOutput([0.5] * len(images))


def test_models_are_each_model_option_with_its_default_unless_a_ready_model_replaces_it():
    assert _Models.models({}) == {"model_name_or_path": "org/main", "detector_model_name_or_path": "org/detector",
                                  "depth_model_name_or_path": "org/depth"}
    assert _Models.models({"model_name_or_path": "mine", "detector": object()}) == {
        "model_name_or_path": "mine", "depth_model_name_or_path": "org/depth"}


def test_a_reward_defaults_to_float32_and_refuses_an_empty_batch_size():
    assert Reward(device="cpu").torch_dtype == torch.float32  # fp16 only when asked (a benchmark on CUDA)
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        Reward(device="cpu", batch_size=0)


class _Recording(Reward):
    def __init__(self, output=None):
        super().__init__(device="cpu")
        self.modes: list[str] = []
        self.output = output

    def _score(self, images, prompts, metadata):
        self.modes += [image.mode for image in images]
        return self.output or RewardOutput([0.5] * len(images))


def test_score_hands_rgb_images_to_score_and_checks_what_it_returns():
    reward = _Recording()
    reward.score([Image.new("L", (4, 4)), Image.new("RGBA", (4, 4)), Image.new("RGB", (4, 4))], ["a", "b", "c"])
    assert reward.modes == ["RGB", "RGB", "RGB"]
    with pytest.raises(RewardError, match=r"_Recording._score returned a tuple; return a RewardOutput"):
        _Recording(output=([0.5], [{}])).score([Image.new("RGB", (4, 4))], ["a"])
    with pytest.raises(ValueError, match="1 images but 2 prompts"):
        reward.score([Image.new("RGB", (4, 4))], ["a", "b"])
    with pytest.raises(ValueError, match="1 prompts but 2 metadata entries"):
        reward.score([Image.new("RGB", (4, 4))], ["a"], metadata=[{}, {}])
    assert reward.score([], []).scores == [] and len(reward.modes) == 3  # no image: `_score` is not called
