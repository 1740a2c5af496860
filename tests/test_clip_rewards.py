"""CLIPScore and BLIP-CLIP on tiny random CLIP / BLIP models built in the test (offline),
and the text rules they use (adjective removal, cosine -> score)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.blip import build_tiny_blip_captioner
from gors.testing.clip import build_tiny_clip
from rewards import get_reward_class, load
from rewards.blip_clip import CAPTION_PROMPT, BlipClipReward
from rewards.clip_score import CLIPScoreReward
from rewards.clip_text import (
    adjective_flags,
    cosine_to_score,
    remove_adjectives,
    spacy_like_tokens,
    tag_adjectives,
)

PROMPTS = [
    "a white cat sleeps on a soft sofa",
    "the round clock was hanging above the wooden door",
    "A person is laughing in the crowd.",
    "a white cat sleeps on a soft sofa",
    "red",
]
# 41 words + ", and" x 20: well over CLIP's 77 tokens.
LONG_PROMPT = ", and ".join(["a fluffy white cat sleeping on a soft red velvet sofa"] * 8)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_clip(tmp_path_factory.mktemp("tiny_clip"), seed=0)


@pytest.fixture(scope="module")
def blip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_blip_captioner(tmp_path_factory.mktemp("tiny_blip_caption"), seed=0)


@pytest.fixture(scope="module")
def clip_model(clip_dir: Path):
    from transformers import CLIPModel, CLIPTokenizer

    return CLIPModel.from_pretrained(clip_dir).eval(), CLIPTokenizer.from_pretrained(clip_dir)


@pytest.fixture(scope="module")
def clip_score(clip_dir: Path) -> CLIPScoreReward:
    return CLIPScoreReward(model_name_or_path=str(clip_dir), device="cpu", batch_size=2)


@pytest.fixture(scope="module")
def blip_clip(clip_dir: Path, blip_dir: Path) -> BlipClipReward:
    return BlipClipReward(
        model_name_or_path=str(blip_dir),
        clip_model_name_or_path=str(clip_dir),
        device="cpu",
        batch_size=2,
    )


def random_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    # Non-square sizes whose centre crops differ between rounding and flooring the offset.
    return [
        Image.fromarray(rng.integers(0, 256, (45 + 2 * i, 61, 3), dtype=np.uint8))
        for i in range(count)
    ]


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def text_embedding(clip_model, text: str) -> torch.Tensor:
    model, tokenizer = clip_model
    ids = tokenizer(text, return_tensors="pt").input_ids
    with torch.no_grad():
        return unit(model.get_text_features(input_ids=ids).pooler_output[0])


def openai_pixels(image: Image.Image) -> torch.Tensor:
    """CLIP's eval transform as open_clip (an independent implementation) builds it."""
    from open_clip.transform import image_transform

    mean, std = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
    return image_transform(32, is_train=False, mean=mean, std=std)(image)


# ----------------------------------------------------------------------------------------------
# Text rules


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a white cat sleeps on a soft sofa", "a cat sleeps on a sofa"),
        ("the round clock was hanging above the wooden door", "the clock was hanging above the door"),
        ("The fluffy cat is on the left of the soft pillow.", "The cat is on the left of the pillow ."),
        ("The square box was next to the circular canister.", "The box was next to the canister ."),
        ("The sleek black cat sat next to the fluffy white pillow.", "The cat sat next to the pillow ."),
        ("The oval plate was on top of the square placemat.", "The plate was on top of the placemat ."),
        ("The silver laptop was on top of the black desk.", "The laptop was on top of the desk ."),
        (
            "The tall, elegant giraffes gracefully strode across the savannah",
            "The , giraffes gracefully strode across the savannah",
        ),
        # No adjective: only the spaCy-style tokenisation shows.
        ("A person is laughing in the crowd.", "A person is laughing in the crowd ."),
        ("a vegetable garden", "a vegetable garden"),  # a noun with an adjective suffix
    ],
)
def test_remove_adjectives_on_compbench_prompts(prompt: str, expected: str) -> None:
    assert remove_adjectives(prompt) == expected


def test_spacy_like_tokens() -> None:
    assert spacy_like_tokens("Don't touch the cat's sun-drenched toy, it's 5 o'clock!") == [
        "Do", "n't", "touch", "the", "cat", "'s", "sun", "-", "drenched", "toy", ",",
        "it", "'s", "5", "o'clock", "!",
    ]  # fmt: skip
    assert spacy_like_tokens("  two   spaces ") == ["two", "spaces"]


@pytest.mark.parametrize(
    ("prompt", "adjectives"),
    [
        ("the bigger dog and the happiest child", ["bigger", "happiest"]),  # comparatives
        ("the clock is round", ["round"]),  # after a copula
        ("a round of applause", []),  # a noun
        ("an orange cat ate an orange", ["orange"]),  # only the first is an adjective
        ("the sky is blue and clear .", ["blue", "clear"]),  # predicative
        ("a tart on a plate", []),  # the head of its noun phrase is a noun
        ("only two cats and the most beautiful dog", ["beautiful"]),  # degree adverbs
        ("the only thing with more apples", ["only", "more"]),
        ("a comfortable chair", ["comfortable"]),  # by suffix
    ],
)
def test_adjective_rules(prompt: str, adjectives: list[str]) -> None:
    assert [token for token, adjective in tag_adjectives(prompt) if adjective] == adjectives


def test_adjective_flags_align_with_tokens() -> None:
    tokens = spacy_like_tokens("The red book was on top of the yellow bookshelf.")
    flags = adjective_flags(tokens)
    assert len(flags) == len(tokens)
    assert [t for t, f in zip(tokens, flags) if f] == ["red", "yellow"]


def test_cosine_to_score() -> None:
    assert cosine_to_score(0.3125) == 0.3125  # raw cosine kept, no x100 or x2.5
    assert cosine_to_score(-0.2) == 0.0
    assert cosine_to_score(1.0000002) == 1.0
    assert cosine_to_score(torch.tensor(0.5)) == 0.5


# ----------------------------------------------------------------------------------------------
# Tiny models and the registry


def test_registry_and_metadata() -> None:
    assert get_reward_class("clip_score") is CLIPScoreReward
    assert get_reward_class("blip_clip") is BlipClipReward
    assert CLIPScoreReward.default_model == "openai/clip-vit-base-patch32"
    assert CLIPScoreReward.categories == ("non_spatial", "complex")
    assert BlipClipReward.default_model == "Salesforce/blip-image-captioning-large"
    assert BlipClipReward.categories == ("non_spatial",)


def test_tiny_clip_uses_the_real_clip_tokens(clip_model) -> None:
    model, tokenizer = clip_model
    # The ids of openai/clip-vit-base-patch32: <|startoftext|> a white cat <|endoftext|>.
    assert tokenizer("a white cat").input_ids == [49406, 320, 1579, 2368, 49407]
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == 49407
    # Its config keeps the legacy eos id 2: pooling takes the first highest id, <|endoftext|>.
    assert model.config.text_config.eos_token_id == 2


def test_texts_are_cleaned_as_clips_own_tokenizer_cleans_them(clip_model) -> None:
    """The official scripts tokenise with CLIP's `simple_tokenizer` (ftfy, HTML entities, whitespace); open_clip's
    tokenizer is that one, an independent implementation of the official ids."""
    import open_clip

    from rewards.clip_text import clip_clean

    _, tokenizer = clip_model
    for text in ["a  cat’s toy &amp; ball", "a red\tbook &amp;amp; a “blue” cup ", "a white cat"]:
        official = [int(i) for i in open_clip.get_tokenizer("ViT-B-32")([text])[0] if i]
        assert tokenizer(clip_clean(text)).input_ids == official, text
    assert clip_clean("a  cat’s toy &amp; ball") == "a cat's toy & ball"


def test_empty_batch(clip_score: CLIPScoreReward, blip_clip: BlipClipReward) -> None:
    for reward in (clip_score, blip_clip):
        output = reward.score([], [])
        assert output.scores == [] and output.details == []


def test_tiny_blip_captioner_is_deterministic_by_seed(tmp_path: Path, blip_dir: Path) -> None:
    from safetensors.torch import load_file

    reference = load_file(blip_dir / "model.safetensors")
    same = load_file(build_tiny_blip_captioner(tmp_path / "same", seed=0) / "model.safetensors")
    other = load_file(build_tiny_blip_captioner(tmp_path / "other", seed=1) / "model.safetensors")
    assert all(torch.equal(reference[k], same[k]) for k in reference)
    assert not all(torch.equal(reference[k], other[k]) for k in reference)


# ----------------------------------------------------------------------------------------------
# CLIPScore


def test_clip_score_is_the_hand_computed_cosine(clip_score: CLIPScoreReward, clip_model) -> None:
    model, _ = clip_model
    images = random_images(len(PROMPTS))
    output = clip_score.score(images, PROMPTS)
    assert len(output.scores) == len(output.details) == len(PROMPTS)
    cosines = []
    for image, prompt, score, details in zip(images, PROMPTS, output.scores, output.details, strict=True):
        with torch.no_grad():
            features = model.get_image_features(pixel_values=openai_pixels(image)[None]).pooler_output
        cosine = float(unit(features[0]) @ text_embedding(clip_model, prompt))
        cosines.append(cosine)
        assert details["text"] == prompt and details["removed_adjectives"] == []
        # No adjectives removed, no parser run: the details do not name one.
        assert set(details) == {"text", "removed_adjectives", "truncated", "cosine", "score"}
        assert details["truncated"] is False
        assert details["cosine"] == pytest.approx(cosine, abs=1e-5)
        assert 0.0 <= score <= 1.0
        assert score == details["score"] == pytest.approx(max(0.0, cosine), abs=1e-5)
    assert max(cosines) > 0.05 and np.ptp(cosines) > 0.01  # the check is not vacuous


def test_openai_preprocessing_matches_clip_not_transformers(clip_dir: Path, clip_score) -> None:
    image = random_images(1)[0]  # 45x61 -> 32x43: the crop offset is 5.5
    ours = clip_score.clip.pixel_values([image])[0]
    torch.testing.assert_close(ours, openai_pixels(image), rtol=0, atol=1e-6)
    processor_reward = CLIPScoreReward(
        model_name_or_path=str(clip_dir), device="cpu", preprocess="transformers"
    )
    other = processor_reward.clip.pixel_values([image])[0]
    assert other.shape == ours.shape and not torch.allclose(other, ours, atol=1e-3)


def test_clip_score_batched_equals_one_at_a_time(clip_dir: Path, clip_score) -> None:
    images = random_images(len(PROMPTS), seed=1)
    together = clip_score.score(images, PROMPTS)
    alone = CLIPScoreReward(model_name_or_path=str(clip_dir), device="cpu", batch_size=1)
    for image, prompt, details in zip(images, PROMPTS, together.details, strict=True):
        single = alone.score([image], [prompt]).details[0]
        assert single["cosine"] == pytest.approx(details["cosine"], abs=1e-5)


def test_complex_mode_removes_adjectives(clip_dir: Path, clip_score) -> None:
    complex_reward = CLIPScoreReward(
        model_name_or_path=str(clip_dir), device="cpu", remove_adjectives=True
    )
    images = random_images(2, seed=2)
    prompts = PROMPTS[:2]
    details = complex_reward.score(images, prompts).details
    assert details[0]["text"] == "a cat sleeps on a sofa"
    assert details[0]["removed_adjectives"] == ["white", "soft"]
    assert details[1]["removed_adjectives"] == ["round", "wooden"]
    # The same as scoring the adjective-free text with the plain reward, not as the prompt.
    plain = clip_score.score(images, [d["text"] for d in details]).details
    unchanged = clip_score.score(images, prompts).details
    for d, p, u in zip(details, plain, unchanged, strict=True):
        assert d["cosine"] == pytest.approx(p["cosine"], abs=1e-6)
        assert d["cosine"] != pytest.approx(u["cosine"], abs=1e-4)


def test_long_prompt_is_truncated_to_77_tokens(clip_score, clip_model) -> None:
    _, tokenizer = clip_model
    ids = tokenizer(LONG_PROMPT).input_ids
    assert len(ids) > 77
    image = random_images(1, seed=3)[0]
    details = clip_score.score([image, image], [LONG_PROMPT, "a cat"]).details
    assert details[0]["truncated"] is True and details[1]["truncated"] is False
    # clip.tokenize(truncate=True): the first 76 tokens, then <|endoftext|>.
    kept = torch.tensor([ids[:76] + [tokenizer.eos_token_id]])
    model, _ = clip_model
    with torch.no_grad():
        text = unit(model.get_text_features(input_ids=kept).pooler_output[0])
        features = unit(model.get_image_features(pixel_values=openai_pixels(image)[None]).pooler_output[0])
    assert details[0]["cosine"] == pytest.approx(float(features @ text), abs=1e-5)


def test_clip_score_non_rgb_images(clip_score: CLIPScoreReward) -> None:
    rgb = random_images(1, seed=4)[0]
    gray, rgba, palette = rgb.convert("L"), rgb.convert("RGBA"), rgb.convert("P")
    prompt = PROMPTS[0]
    scores = clip_score.score([gray, rgba, palette], [prompt] * 3).details
    expected = clip_score.score(
        [gray.convert("RGB"), rgb, palette.convert("RGB")], [prompt] * 3
    ).details
    for got, want in zip(scores, expected, strict=True):
        assert got["cosine"] == pytest.approx(want["cosine"], abs=1e-6)


def test_bad_options_and_paths(tmp_path: Path, clip_dir: Path, blip_dir: Path) -> None:
    with pytest.raises(ValueError, match="preprocess"):
        CLIPScoreReward(model_name_or_path=str(clip_dir), device="cpu", preprocess="pil")
    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        load("clip_score", model_name_or_path=str(tmp_path / "missing"), device="cpu")
    with pytest.raises(FileNotFoundError, match="clip_model_name_or_path"):
        load(
            "blip_clip",
            model_name_or_path=str(blip_dir),
            clip_model_name_or_path=str(tmp_path / "missing"),
            device="cpu",
        )
    with pytest.raises(ValueError, match="no room for a caption"):
        BlipClipReward(
            model_name_or_path=str(blip_dir), clip_model_name_or_path=str(clip_dir),
            device="cpu", min_length=3, max_length=5,
        )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# BLIP-CLIP


def test_blip_clip_scores_and_details(blip_clip: BlipClipReward, clip_model, blip_dir: Path) -> None:
    from transformers import BlipForConditionalGeneration, BlipProcessor

    images = random_images(2, seed=5)
    prompts = ["a cat", "a dog on a sofa"]
    output = blip_clip.score(images, prompts)
    # BLIP's own decoding, by hand: prompt "a picture of", 3 beams, 10 to 30 tokens in all.
    model = BlipForConditionalGeneration.from_pretrained(blip_dir).eval()
    processor = BlipProcessor.from_pretrained(blip_dir)
    cosines = []
    for image, prompt, score, details in zip(images, prompts, output.scores, output.details, strict=True):
        assert set(details) == {"caption", "cosine", "score"}
        inputs = processor(images=image, text="a picture of", return_tensors="pt")
        with torch.no_grad():
            tokens = model.generate(**inputs, num_beams=3, max_length=30, min_length=10)
        assert 10 <= tokens.shape[1] <= 30
        text = processor.decode(tokens[0], skip_special_tokens=True)
        assert text.startswith("a picture of ") and details["caption"] == text[len("a picture of ") :]
        cosine = float(text_embedding(clip_model, details["caption"]) @ text_embedding(clip_model, prompt))
        cosines.append(cosine)
        assert details["cosine"] == pytest.approx(cosine, abs=1e-5)
        assert 0.0 <= score <= 1.0 and score == details["score"] == cosine_to_score(details["cosine"])
    assert len({d["caption"] for d in output.details}) > 1  # captions depend on the image
    assert max(cosines) > 0.05


def test_blip_clip_batched_equals_one_at_a_time(clip_dir: Path, blip_dir: Path) -> None:
    images = random_images(3, seed=6)
    prompts = ["a cat", "the round clock was hanging above the wooden door", "red"]
    rewards = [
        BlipClipReward(
            model_name_or_path=str(blip_dir),
            clip_model_name_or_path=str(clip_dir),
            device="cpu",
            batch_size=batch_size,
            min_length=12,
            max_length=16,
        )
        for batch_size in (3, 1)
    ]
    together = rewards[0].score(images, prompts).details
    for image, prompt, details in zip(images, prompts, together, strict=True):
        single = rewards[1].score([image], [prompt]).details[0]
        assert single["caption"] == details["caption"]
        assert single["cosine"] == pytest.approx(details["cosine"], abs=1e-5)


def test_blip_clip_unconditional_caption_and_non_rgb(clip_dir: Path, blip_dir: Path) -> None:
    reward = BlipClipReward(
        model_name_or_path=str(blip_dir), clip_model_name_or_path=str(clip_dir), device="cpu",
        caption_prompt="", max_length=12, min_length=4,
    )  # fmt: skip
    rgb = random_images(1, seed=7)[0]
    output = reward.score([rgb.convert("L"), rgb.convert("RGBA"), rgb], [LONG_PROMPT] * 3)
    captions = [d["caption"] for d in output.details]
    assert captions[1] == captions[2]  # RGBA of an opaque image is the RGB image
    assert all(0 < len(c.split()) <= 11 for c in captions)
    assert all(0.0 <= s <= 1.0 for s in output.scores)


def test_clip_score_in_float16_takes_the_cosine_in_float32(clip_dir: Path) -> None:
    """A float16 CLIP gives unit float32 embeddings, so its cosines are not float16-rounded; fp16 is the official dtype."""
    half = CLIPScoreReward(model_name_or_path=str(clip_dir), device="cpu", torch_dtype=torch.float16)
    assert half.official_dtype == torch.float16  # what the T2I-CompBench benchmark scores in on a GPU
    images = random_images(3, seed=8)
    embeddings = half.clip.image_embeddings(images, 2)
    assert embeddings.dtype == torch.float32
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(3), rtol=0, atol=1e-6)
    cosines = [d["cosine"] for d in half.score(images, PROMPTS[:3]).details]
    assert any(float(np.float16(c)) != c for c in cosines)


def test_truncation_flag_counts_cleaned_tokens_up_to_exactly_77(clip_score: CLIPScoreReward, clip_model) -> None:
    """A text of exactly 77 tokens (bos, 75, eos) after CLIP's cleaning is not truncated; one more token is."""
    _, tokenizer = clip_model
    fits = " ".join(["a"] * 74) + " &amp;"  # "&amp;" cleans to "&", one token
    assert len(tokenizer(fits).input_ids) > 77 and len(tokenizer(" ".join(["a"] * 74) + " &").input_ids) == 77
    assert clip_score.clip.truncated([fits, fits + " a", "a cat"]) == [False, True, False]


def test_clip_score_embeds_the_cleaned_text(clip_score: CLIPScoreReward) -> None:
    """The prompt is cleaned as CLIP's tokenizer cleans it (HTML entities, whitespace) before it is embedded."""
    image = random_images(1, seed=9)[0]
    messy, clean = clip_score.score([image, image], ["a  cat’s toy &amp; ball", "a cat's toy & ball"]).details
    assert messy["cosine"] == pytest.approx(clean["cosine"], abs=1e-6)


def test_complex_mode_flags_truncation_of_the_scored_text_and_names_its_parser(clip_dir: Path) -> None:
    """With adjectives removed, `truncated` is about the text that is embedded, and the details name the parser."""
    from rewards.noun_phrases import parser_record

    complex_reward = CLIPScoreReward(model_name_or_path=str(clip_dir), device="cpu", remove_adjectives=True)
    details = complex_reward.score(random_images(1, seed=3), [LONG_PROMPT]).details[0]
    assert len(complex_reward.clip.tokenizer(LONG_PROMPT).input_ids) > 77
    assert len(complex_reward.clip.tokenizer(details["text"]).input_ids) <= 77
    assert details["truncated"] is False
    assert details["parser"] == parser_record("auto")


def test_blip_generation_follows_blips_defaults(clip_dir: Path, blip_dir: Path) -> None:
    """3 beams, no sampling, 10 to 30 decoder tokens counting [DEC] and the prompt; a prompt that fills
    `max_length` is refused, one token fewer is not."""
    unconditional = BlipClipReward(
        model_name_or_path=str(blip_dir), clip_model_name_or_path=str(clip_dir), device="cpu", caption_prompt=""
    )
    assert unconditional.prompt_ids.shape[1] == 2  # [CLS] [SEP]: the prompt is [DEC] alone
    assert unconditional.generation == {"num_beams": 3, "do_sample": False, "max_new_tokens": 29, "min_new_tokens": 9}
    prompt_length = unconditional.processor.tokenizer(CAPTION_PROMPT, return_tensors="pt").input_ids.shape[1] - 1
    with pytest.raises(ValueError, match="no room for a caption"):
        BlipClipReward(model_name_or_path=str(blip_dir), clip_model_name_or_path=str(clip_dir), device="cpu",
                       min_length=0, max_length=prompt_length)
    fits = BlipClipReward(model_name_or_path=str(blip_dir), clip_model_name_or_path=str(clip_dir), device="cpu",
                          min_length=0, max_length=prompt_length + 1)
    assert fits.generation["max_new_tokens"] == 1 and fits.generation["min_new_tokens"] == 0


@pytest.mark.parametrize(
    "options", [{"num_beams": 0}, {"num_beams": True}, {"max_length": 5}, {"min_length": 31}, {"min_length": -1}]
)
def test_blip_options_refused_before_loading(options: dict) -> None:
    """num_beams >= 1 (a whole number, not a bool) and 0 <= min_length <= max_length, each against the other's default."""
    with pytest.raises(ValueError, match="0 <= min_length <= max_length"):
        BlipClipReward.check_options(options)


def test_clip_encoder_refuses_an_unknown_preprocess_itself(clip_dir: Path) -> None:
    """`CLIPEncoder` is shared (BLIP-CLIP builds one too), so it checks `preprocess` without the reward's help."""
    from rewards.clip_score import CLIPEncoder

    with pytest.raises(ValueError, match="preprocess='pil'; choose 'openai' or 'transformers'"):
        CLIPEncoder(str(clip_dir), "--clip", torch.device("cpu"), torch.float32, preprocess="pil")


def _stand_in_processor(size: dict, crop_size: dict | None):
    """The attributes of a `CLIPImageProcessor` that CLIP's own transform reads."""
    from types import SimpleNamespace

    return SimpleNamespace(
        size=size, crop_size=crop_size, image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )  # fmt: skip


def test_openai_transform_crops_height_by_width() -> None:
    """A non-square crop is (height, width) as the processor names them, not transposed."""
    from rewards.clip_score import _openai_transform

    transform = _openai_transform(_stand_in_processor({"shortest_edge": 32}, {"height": 24, "width": 32}))
    image = random_images(1)[0]  # 45 high, 61 wide -> 32 x 43 -> crop 24 x 32
    assert transform(image).shape == (3, 24, 32)


@pytest.mark.parametrize(
    ("size", "crop_size"),
    [
        ({"height": 32, "width": 32}, {"height": 32, "width": 32}),  # resizes to a fixed size, no shortest edge
        ({"shortest_edge": 32}, None),  # no centre crop
        ({"shortest_edge": 32}, {"shortest_edge": 32}),  # a crop without a height
    ],
)
def test_openai_transform_refuses_a_processor_unlike_clips(size: dict, crop_size: dict | None) -> None:
    """preprocess='openai' rebuilds CLIP's resize-shortest-edge + centre-crop; another processor is refused with a
    pointer to preprocess='transformers', not turned into a different transform or a KeyError."""
    from rewards.clip_score import _openai_transform

    with pytest.raises(ValueError, match="preprocess='openai' needs a processor .* use preprocess='transformers'"):
        _openai_transform(_stand_in_processor(size, crop_size))


def test_complex_mode_removes_the_adjectives_of_the_parser_it_names(clip_dir: Path, monkeypatch) -> None:
    """With spaCy's model installed, "auto" removes spaCy's ADJ tokens (the official parser's), the parser the
    details name, not the built-in rules' adjectives."""
    from types import SimpleNamespace

    from rewards import noun_phrases

    pytest.importorskip("spacy")  # the parser record reads spaCy's version

    def fake_nlp(text: str) -> list[SimpleNamespace]:
        # Tags no built-in rule gives: "cat" as the adjective, "white" not.
        return [SimpleNamespace(text=w, pos_="ADJ" if w == "cat" else "X", whitespace_=" ") for w in text.split()]

    fake_nlp.meta = {"lang": "en", "name": "core_web_sm", "version": "3.5.0"}
    monkeypatch.setattr(noun_phrases, "_spacy_pipeline", lambda: fake_nlp)
    reward = CLIPScoreReward(model_name_or_path=str(clip_dir), device="cpu", remove_adjectives=True)
    details = reward.score(random_images(1, seed=10), ["a white cat sleeps"]).details[0]
    assert details["parser"]["name"] == "spacy" and details["parser"]["model"] == "en_core_web_sm"
    assert details["removed_adjectives"] == ["cat"]
    assert details["text"] == "a white sleeps"
