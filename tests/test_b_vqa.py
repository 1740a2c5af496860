"""B-VQA reward on a tiny random BLIP VQA model built in the test (offline)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import gors.testing.blip as tiny_blip
import rewards.noun_phrases as noun_phrases
from gors.testing.blip import build_tiny_blip_vqa
from rewards import get_reward_class, load
from rewards.b_vqa import (
    OFFICIAL_IMAGE_SIZE,
    BVQAReward,
    image_score,
    official_question,
    resize_position_embeddings,
)
from rewards.noun_phrases import BUILTIN_PARSER_VERSION
from rewards.question_table import FORMAT, load_question_table, make_question_table, write_question_table

BUILTIN = {"name": "builtin", "version": BUILTIN_PARSER_VERSION}
PROMPTS = [
    "a green bench and a red car",
    "rubber gloves and a fluffy teddy bear",
    "a balloon on the top of a giraffe",
    "a triangular slice of pizza and a cylindrical pizza cutter",
    "a horse on the right of a man",
    "a blue cat and a red dog",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_blip_vqa(tmp_path_factory.mktemp("tiny_blip_vqa"), seed=0)


@pytest.fixture(scope="module")
def reward(model_dir: Path) -> BVQAReward:
    return BVQAReward(
        model_name_or_path=str(model_dir), device="cpu", batch_size=4, noun_phrase_backend="builtin"
    )


def random_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (24 + 8 * i, 40, 3), dtype=np.uint8))
        for i in range(count)
    ]


def test_registry_and_metadata() -> None:
    assert get_reward_class("b_vqa") is BVQAReward
    assert BVQAReward.name == "b_vqa"
    assert BVQAReward.default_model == "Salesforce/blip-vqa-capfilt-large"
    assert BVQAReward.categories == ("color", "shape", "texture", "complex")


def test_tiny_model_token_conventions(model_dir: Path, reward: BVQAReward) -> None:
    tokenizer, text_config = reward.processor.tokenizer, reward.model.config.text_config
    assert (model_dir / "vocab.txt").read_text().splitlines()[:5] == tiny_blip.SPECIAL_TOKENS
    assert tokenizer.bos_token == "[DEC]"
    assert text_config.bos_token_id == tokenizer.bos_token_id == len(tiny_blip.tiny_vocab())
    assert text_config.pad_token_id == tokenizer.pad_token_id == 0
    assert text_config.sep_token_id == tokenizer.sep_token_id
    assert "[UNK]" not in tokenizer.tokenize("a zebra quokka?")  # letters cover any word
    assert tokenizer.decode([reward.yes_id, reward.no_id]) == "yes no"


def test_build_is_deterministic_by_seed(tmp_path: Path, model_dir: Path) -> None:
    from safetensors.torch import load_file

    reference = load_file(model_dir / "model.safetensors")
    same = load_file(build_tiny_blip_vqa(tmp_path / "same", seed=0) / "model.safetensors")
    other = load_file(build_tiny_blip_vqa(tmp_path / "other", seed=1) / "model.safetensors")
    assert all(torch.equal(reference[k], same[k]) for k in reference)
    assert not all(torch.equal(reference[k], other[k]) for k in reference)


def test_scores_details_and_product_rule(reward: BVQAReward) -> None:
    images = random_images(len(PROMPTS))
    output = reward.score(images, PROMPTS)
    assert len(output.scores) == len(output.details) == len(PROMPTS)
    for score, details in zip(output.scores, output.details, strict=True):
        assert set(details) == {"questions", "phrases", "p_yes", "score", "question_source"}
        assert details["question_source"] == {"source": "parser", "parser": BUILTIN}
        assert details["questions"] == [f"{p}?" for p in details["phrases"]]
        assert len(details["p_yes"]) == len(details["questions"]) > 0
        assert all(0.0 <= p <= 1.0 for p in details["p_yes"])
        assert 0.0 <= score <= 1.0 and details["score"] == score
        # As the official code: each probability and the product written with 4 decimals.
        assert score == image_score(details["p_yes"])
    assert output.details[2]["phrases"] == ["a balloon", "the top", "a giraffe"]
    assert output.details[4]["phrases"] == ["a horse", "a man"]  # "the right" is filtered out
    # A random model still answers differently for different questions and images.
    all_p = [p for d in output.details for p in d["p_yes"]]
    assert max(all_p) - min(all_p) > 0.05


@pytest.mark.parametrize("question_start", ["enc", "cls"])
def test_p_yes_matches_blip_generate(model_dir: Path, question_start: str) -> None:
    """Recompute each question with transformers' own BLIP VQA inference, independently.

    With "enc" (the official BLIP code's behaviour) the question's first token is [ENC], the id after
    [DEC]; with "cls" it is the tokenizer's [CLS], as transformers' generate uses it.
    """
    from transformers import BlipForQuestionAnswering, BlipImageProcessorPil, BlipProcessor

    reward = BVQAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=4,
                        noun_phrase_backend="builtin", question_start=question_start)
    image = random_images(2, seed=3)[1]
    details = reward.score([image], ["a green bench and a red car"]).details[0]
    model = BlipForQuestionAnswering.from_pretrained(model_dir).eval()
    for module in model.vision_model.modules():  # BLIP's own ViT LayerNorms, as the official code builds them
        if isinstance(module, torch.nn.LayerNorm):
            module.eps = 1e-6
    # BLIP's own resize of the PIL image (the official transform; see test_images_are_resized_as_blips_transform)
    processor = BlipProcessor.from_pretrained(model_dir, image_processor=BlipImageProcessorPil.from_pretrained(model_dir))
    tokenizer = processor.tokenizer
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    for question, p_yes in zip(details["questions"], details["p_yes"], strict=True):
        inputs = processor(images=image, text=question, return_tensors="pt")
        if question_start == "enc":
            inputs["input_ids"][:, 0] = model.config.text_config.bos_token_id + 1
        with torch.no_grad():
            generated = model.generate(
                **inputs, max_new_tokens=1, output_logits=True, return_dict_in_generate=True
            )
        probs = generated.logits[0][0].softmax(-1)
        assert p_yes == pytest.approx((probs[yes] / (probs[yes] + probs[no])).item(), abs=1e-5)


def test_yes_probability_is_the_official_quotient_of_the_softmax() -> None:
    from rewards.b_vqa import yes_probability

    # The last two rows: yes and no far below the top token, their probabilities denormal, then both 0.
    logits = torch.tensor([[2.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.5, -5.0, 90.5],
                           [-200.0, -300.0, 0.0, 100.0]])
    probabilities = logits.softmax(-1)
    official = probabilities[:, 0] / (probabilities[:, 0] + probabilities[:, 1])
    got = yes_probability(logits, 0, 1)
    assert 0 < probabilities[2, 0] < torch.finfo(torch.float32).tiny  # a denormal
    assert torch.equal(got[:3], official[:3])  # the official float32 arithmetic, not merely close
    # Both underflow (the official quotient is NaN): the share of the two logits, 1 / (1 + e^-100).
    assert torch.isnan(official[3]) and got[3].item() == pytest.approx(1.0)


def test_images_are_resized_as_blips_transform(model_dir: Path) -> None:
    """BLIP's (and so the official metric's) transform: the PIL image resized bicubic, then normalised with
    CLIP's mean and std; transformers' default BLIP processor resizes a tensor instead. And BLIP's ViT
    LayerNorms take eps 1e-6."""
    from torchvision import transforms
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    reward = BVQAReward(model_name_or_path=str(model_dir), device="cpu", image_size=48)
    blip = transforms.Compose([transforms.Resize((48, 48), interpolation=transforms.InterpolationMode.BICUBIC),
                               transforms.ToTensor(), transforms.Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (61, 53, 3), dtype=np.uint8))
    pixels = reward.processor.image_processor([image], return_tensors="pt").pixel_values[0]
    assert torch.allclose(pixels, blip(image), atol=1e-6)
    norms = [m for m in reward.model.vision_model.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert norms and all(m.eps == 1e-6 for m in norms)


def test_official_question_start_changes_the_answers(model_dir: Path) -> None:
    images, prompts = random_images(2, seed=3), ["a green bench and a red car"] * 2
    scores = {
        start: BVQAReward(model_name_or_path=str(model_dir), device="cpu", noun_phrase_backend="builtin",
                          question_start=start).score(images, prompts).scores
        for start in ("enc", "cls")
    }
    assert not np.allclose(scores["enc"], scores["cls"])


def test_batched_equals_one_at_a_time(reward: BVQAReward, model_dir: Path) -> None:
    images = random_images(len(PROMPTS), seed=1)
    together = reward.score(images, PROMPTS)
    alone = BVQAReward(
        model_name_or_path=str(model_dir), device="cpu", batch_size=1, noun_phrase_backend="builtin"
    )
    for image, prompt, score, details in zip(
        images, PROMPTS, together.scores, together.details, strict=True
    ):
        single = alone.score([image], [prompt])
        assert single.details[0]["questions"] == details["questions"]
        np.testing.assert_allclose(
            single.details[0]["p_yes"], details["p_yes"], rtol=1e-4, atol=1e-6
        )
        assert single.scores[0] == pytest.approx(score, rel=5e-4, abs=1e-7)


def test_vision_once_per_image_and_questions_batched_across_images(reward: BVQAReward) -> None:
    vision_batches: list[int] = []
    decoder_batches: list[int] = []
    hooks = [
        reward.model.vision_model.register_forward_hook(
            lambda module, args, kwargs, out: vision_batches.append(
                kwargs["pixel_values"].shape[0]
            ),
            with_kwargs=True,
        ),
        reward.model.text_decoder.register_forward_hook(
            lambda module, args, kwargs, out: decoder_batches.append(kwargs["input_ids"].shape[0]),
            with_kwargs=True,
        ),
    ]
    try:
        # Six images x two same-length questions; one prompt without any question.
        prompts = ["a blue cat and a red dog"] * 6 + ["..."]
        output = reward.score(random_images(7), prompts)
    finally:
        for hook in hooks:
            hook.remove()
    assert output.scores[-1] == 1.0
    assert sum(vision_batches) == 6  # each image with questions exactly once
    assert vision_batches == [4, 2]
    assert decoder_batches == [4, 4, 4]  # 12 questions of 6 images in chunks of batch_size


def test_resized_position_embeddings_equal_transformers_interpolation(model_dir: Path) -> None:
    from transformers import BlipForQuestionAnswering

    model = BlipForQuestionAnswering.from_pretrained(model_dir).eval()
    pixels = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        interpolated = model.vision_model(pixel_values=pixels, interpolate_pos_encoding=True).last_hidden_state
        resize_position_embeddings(model.vision_model, 64)  # 4 x 4 patches of 8 px -> 8 x 8
        resized = model.vision_model(pixel_values=pixels).last_hidden_state
    assert model.vision_model.embeddings.position_embedding.shape == (1, 65, 32)
    assert model.config.vision_config.image_size == 64
    torch.testing.assert_close(resized, interpolated, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="multiple of the patch size 8"):
        resize_position_embeddings(model.vision_model, 60)


def test_image_size_default_is_480_for_the_official_checkpoint_only(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="rewards.b_vqa"):
        own = BVQAReward(model_name_or_path=str(model_dir), device="cpu", noun_phrase_backend="builtin")
    assert own.image_size == tiny_blip.IMAGE_SIZE  # another checkpoint: its processor's size, with a warning
    assert f"runs at its processor's {tiny_blip.IMAGE_SIZE} px" in caplog.text and "pass image_size=480" in caplog.text
    bigger = BVQAReward(model_name_or_path=str(model_dir), device="cpu", noun_phrase_backend="builtin",
                        image_size=64)
    image = Image.new("RGB", (100, 100), "red")
    assert bigger.processor.image_processor([image], return_tensors="pt").pixel_values.shape[-1] == 64
    assert 0.0 <= bigger.score([image], ["a red car"]).scores[0] <= 1.0
    # The default model (here the tiny one standing in for Salesforce/blip-vqa-capfilt-large) runs at 480 px.
    monkeypatch.setattr(BVQAReward, "default_model", str(model_dir))
    official = BVQAReward(device="cpu", noun_phrase_backend="builtin")
    assert official.image_size == OFFICIAL_IMAGE_SIZE
    assert official.model.vision_model.embeddings.position_embedding.shape[1] == (480 // 8) ** 2 + 1
    assert official.processor.image_processor([image], return_tensors="pt").pixel_values.shape[-2:] == (480, 480)


def test_prompt_without_noun_phrase_scores_one(reward: BVQAReward) -> None:
    output = reward.score(random_images(2), ["", "is very blue"])
    assert output.scores == [1.0, 1.0]
    assert output.details[0] == {"questions": [], "phrases": [], "p_yes": [], "score": 1.0,
                                 "question_source": {"source": "parser", "parser": BUILTIN}}


def test_non_rgb_images(reward: BVQAReward) -> None:
    rgb = random_images(1, seed=7)[0]
    gray, rgba = rgb.convert("L"), rgb.convert("RGBA")
    prompt = "a green bench and a red car"
    scores = reward.score([gray, rgba], [prompt, prompt]).scores
    assert scores[0] == pytest.approx(
        reward.score([gray.convert("RGB")], [prompt]).scores[0], rel=1e-5
    )
    assert scores[1] == pytest.approx(reward.score([rgb], [prompt]).scores[0], rel=1e-5)


def test_max_questions(model_dir: Path) -> None:
    capped = BVQAReward(
        model_name_or_path=str(model_dir),
        device="cpu",
        max_questions=1,
        noun_phrase_backend="builtin",
    )
    details = capped.score(random_images(1), ["a green bench and a red car"]).details[0]
    assert details["questions"] == ["a green bench?"]


def test_missing_local_model_path(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        load("b_vqa", model_name_or_path=str(missing), device="cpu")


def test_yes_must_be_a_single_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A vocabulary without "yes": the word splits into letters, which B-VQA cannot score.
    monkeypatch.setattr(tiny_blip, "_WORDS", tiny_blip._WORDS.replace("yes ", ""))
    path = build_tiny_blip_vqa(tmp_path / "no_yes")
    with pytest.raises(ValueError, match="'yes'"):
        BVQAReward(model_name_or_path=str(path), device="cpu")


def test_question_table_sets_what_blip_is_asked(reward: BVQAReward, model_dir: Path, tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """A table's questions reach the model for the prompts it holds; other prompts are parsed."""
    content = make_question_table(["a green bench and a red car", "a blue cat and a red dog"])
    # As if the official parser had asked one question only (as spaCy does on some prompts).
    content["questions"]["a green bench and a red car"] = ["a red car?"]
    path = tmp_path / "questions.json"
    sha256 = write_question_table(path, content)
    with_table = BVQAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=4,
                            noun_phrase_backend="builtin", questions=str(path))
    images = random_images(3, seed=5)
    prompts = ["a green bench and a red car", "a blue cat and a red dog", "rubber gloves and a fluffy teddy bear"]
    output = with_table.score(images, prompts)
    # A prompt the table lacks is named once: a table of another prompt set would otherwise change nothing unseen.
    assert caplog.text.count(f"the question table {path} (2 prompts) lacks 'rubber gloves and a fluffy teddy bear', "
                             "so its questions come from the parser (noun_phrase_backend=builtin)") == 1
    with_table.score(images[2:], prompts[2:])
    assert caplog.text.count("lacks") == 1
    from_table = {"source": "table", "table_sha256": sha256, "parser": BUILTIN}
    from_parser = {"source": "parser", "parser": BUILTIN}
    assert [d["questions"] for d in output.details] == [
        ["a red car?"], ["a blue cat?", "a red dog?"], ["rubber gloves?", "a fluffy teddy bear?"],
    ]
    assert [d["question_source"] for d in output.details] == [from_table, from_table, from_parser]
    # The table's question is what BLIP answered: the same as asking it through the parser.
    parsed = reward.score(images[:1], ["a red car"]).details[0]
    assert parsed["questions"] == ["a red car?"]
    assert output.details[0]["p_yes"] == pytest.approx(parsed["p_yes"], rel=1e-4, abs=1e-6)
    assert output.scores[0] == round(output.details[0]["p_yes"][0], 4)
    without = reward.score(images, prompts)
    assert without.details[0]["questions"] == ["a green bench?", "a red car?"]
    # The same rows, up to float noise between batch compositions (the first image asks more questions here;
    # some CPUs' kernels round differently by batch size).
    for row, expected in zip(without.details[1:], output.details[1:], strict=True):
        assert {k: v for k, v in row.items() if k not in ("p_yes", "score")} == {
            **{k: v for k, v in expected.items() if k not in ("p_yes", "score")}, "question_source": from_parser}
        assert row["p_yes"] == pytest.approx(expected["p_yes"], rel=1e-4, abs=1e-6)
        assert row["score"] == pytest.approx(expected["score"], rel=1e-4, abs=1e-6)
    assert load_question_table(path).sha256 == sha256


def test_question_table_is_capped_at_max_questions(model_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "questions.json"
    write_question_table(path, {"format": FORMAT, "format_version": 1, "parser": BUILTIN,
                                "questions": {"a blue cat and a red dog": ["a blue cat?", "a red dog?"]}})
    capped = BVQAReward(model_name_or_path=str(model_dir), device="cpu", max_questions=1,
                        noun_phrase_backend="builtin", questions=path)
    assert capped.score(random_images(1), ["a blue cat and a red dog"]).details[0]["questions"] == ["a blue cat?"]


def test_bad_table_fails_before_the_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"questions": {}}', encoding="utf-8")
    missing_model = str(tmp_path / "no_such_model")
    with pytest.raises(ValueError, match="not a gors question table"):
        BVQAReward(model_name_or_path=missing_model, device="cpu", questions=bad)
    with pytest.raises(FileNotFoundError, match="gors questions"):
        BVQAReward(model_name_or_path=missing_model, device="cpu", questions=tmp_path / "absent.json")
    monkeypatch.setattr(noun_phrases, "_spacy_pipeline", lambda: None)  # as where spaCy's model is missing
    with pytest.raises(ImportError, match="en_core_web_sm"):
        BVQAReward(model_name_or_path=missing_model, device="cpu", noun_phrase_backend="spacy")


def test_three_in_one_passes_the_table_to_b_vqa(monkeypatch: pytest.MonkeyPatch) -> None:
    import rewards.three_in_one as three_in_one

    built: dict[str, dict] = {}

    def recorder(name: str):
        class Member:  # records what the member is built with; its options are checked (nothing here)
            @classmethod
            def check_options(cls, options):
                pass

            def __init__(self, **kwargs):
                built[name] = kwargs
        return Member

    monkeypatch.setattr(three_in_one, "get_reward_class", recorder)
    three_in_one.ThreeInOneReward(device="cpu", subsplits="none", questions="table.json",
                                  b_vqa={"model_name_or_path": "blip"})
    assert built["b_vqa"] == {"device": torch.device("cpu"), "torch_dtype": torch.float32, "batch_size": 8,
                              "model_name_or_path": "blip", "questions": "table.json"}
    assert "questions" not in built["spatial_rule"] and "questions" not in built["clip_score"]
    with pytest.raises(ValueError, match="two question tables"):
        three_in_one.ThreeInOneReward(device="cpu", subsplits="none", questions="a.json",
                                      b_vqa={"questions": "b.json"})


def _official_scores(p_yes: list[list[float]], np_num: int = 8) -> list[float]:
    """T2I-CompBench's `BLIP_vqa.py` arithmetic: each answer written as '{:.4f}' and read into a float32
    tensor (1 where an image has no such question), the product over its columns in place, written again."""
    reward = torch.zeros((len(p_yes), np_num))
    for k, probs in enumerate(p_yes):
        for i in range(np_num):
            reward[k][i] = float("{:.4f}".format(probs[i])) if i < len(probs) else 1
    final = reward[:, 0]
    for i in range(1, np_num):
        final *= reward[:, i]
    return [float("{:.4f}".format(final[k].item())) for k in range(len(p_yes))]


def test_an_images_score_is_the_official_scripts_float32_product() -> None:
    rng = random.Random(0)
    p_yes = [[rng.random() ** rng.choice([1, 4]) for _ in range(rng.randint(1, 8))] for _ in range(20000)]
    assert [image_score(probs) for probs in p_yes] == _official_scores(p_yes)
    # 0.265 x 0.43 = 0.11395: in double precision it writes 0.114, in the official float32 0.1139.
    assert round(math.prod([0.265, 0.43]), 4) == 0.114 and image_score([0.26501, 0.42996]) == 0.1139
    assert image_score([]) == 1.0 and image_score([0.123456, 1.0], None) == 0.123456


def test_unrounded_scores_on_request(model_dir: Path) -> None:
    reward = BVQAReward(model_name_or_path=str(model_dir), device="cpu", noun_phrase_backend="builtin", decimals=None)
    output = reward.score(random_images(2), PROMPTS[:2])
    for score, details in zip(output.scores, output.details, strict=True):
        assert score == pytest.approx(math.prod(details["p_yes"]), rel=1e-12)
    with pytest.raises(ValueError, match="decimals must be >= 0 or None"):
        BVQAReward(model_name_or_path=str(model_dir), device="cpu", decimals=-1)


def test_questions_are_normalised_as_blips_pre_question(reward: BVQAReward) -> None:
    assert official_question('A "Stop" sign (red); the #1 bench: ok~.?') == "a stop sign red the 1 bench ok?"
    assert official_question("a bench?  ") == "a bench?"
    assert official_question(" ".join(["word"] * 60)) == " ".join(["word"] * 50)
    # Asked with or without the punctuation BLIP's dataset strips, the same question gets the same answer.
    image = random_images(1)
    plain = reward._answer_probabilities(image, [(0, "a stop sign?")])
    marked = reward._answer_probabilities(image, [(0, 'A "Stop" sign.?')])
    assert plain == marked


def test_question_blanks_count_as_words_before_the_cap() -> None:
    """BLIP's `pre_question` only strips trailing blanks: leading ones stay and each empty word counts
    toward the 50-word cap, so 49 leading blanks leave room for one word only."""
    assert official_question(" " * 49 + "a green bench?") == " " * 49 + "a"
    assert official_question("  a bench?") == "  a bench?"


def test_questions_are_truncated_to_35_tokens(reward: BVQAReward, monkeypatch: pytest.MonkeyPatch) -> None:
    """As BLIP's `tokenizer(..., truncation=True, max_length=35)`: a long question reaches the text encoder
    as 35 tokens ([ENC], its first 33 word pieces, [SEP]), a short one whole."""
    seen: list[torch.Tensor] = []
    original = reward._yes_probabilities

    def recording(input_ids: torch.Tensor, image_embeds: torch.Tensor) -> torch.Tensor:
        seen.append(input_ids)
        return original(input_ids, image_embeds)

    monkeypatch.setattr(reward, "_yes_probabilities", recording)
    long_question = " ".join(["green"] * 40) + " bench?"
    reward._answer_probabilities(random_images(1), [(0, long_question), (0, "a bench?")])
    lengths = sorted(ids.shape[1] for ids in seen)
    full = reward.processor.tokenizer(long_question).input_ids
    assert len(full) > 35 and lengths[-1] == 35
    long_ids = next(ids for ids in seen if ids.shape[1] == 35)[0].tolist()
    assert long_ids == [reward.question_start_id, *full[1:34], reward.processor.tokenizer.sep_token_id]
    assert lengths[0] == len(reward.processor.tokenizer("a bench?").input_ids)


def test_a_model_whose_vocabulary_ends_at_dec_is_refused(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """question_start='enc' needs the [ENC] id (bos + 1) inside the vocabulary: a vocabulary that ends at
    [DEC] is refused (naming 'cls' as the way out); question_start='cls' still loads it."""
    from transformers import BlipForQuestionAnswering

    original = BlipForQuestionAnswering.from_pretrained

    def without_enc(*args, **kwargs):
        model = original(*args, **kwargs)
        model.config.text_config.vocab_size = model.config.text_config.bos_token_id + 1
        return model

    monkeypatch.setattr(BlipForQuestionAnswering, "from_pretrained", without_enc)
    with pytest.raises(ValueError, match=r"no \[ENC\] token after \[DEC\].*question_start='cls'"):
        BVQAReward(model_name_or_path=str(model_dir), device="cpu")
    assert BVQAReward(model_name_or_path=str(model_dir), device="cpu", question_start="cls").question_start_id is None


def test_yes_and_no_must_be_exactly_one_token(reward: BVQAReward) -> None:
    """A word the tokenizer turns into no token at all is refused like one split into several."""
    assert reward._single_token_id("yes") == reward.yes_id
    with pytest.raises(ValueError, match="into 0 tokens"):
        reward._single_token_id("")


def test_question_windows_and_length_groups(reward: BVQAReward) -> None:
    """Images go in windows of 4 * batch_size (16 here): each image's vision features once, even at a
    window's edge, and within a window the questions of one token length share passes across images."""
    vision_batches: list[int] = []
    decoder_batches: list[int] = []
    hooks = [
        reward.model.vision_model.register_forward_hook(
            lambda module, args, kwargs, out: vision_batches.append(kwargs["pixel_values"].shape[0]),
            with_kwargs=True,
        ),
        reward.model.text_decoder.register_forward_hook(
            lambda module, args, kwargs, out: decoder_batches.append(kwargs["input_ids"].shape[0]),
            with_kwargs=True,
        ),
    ]
    # 17 images, one question each, short and long questions interleaved.
    questions = [(i, "a cat?" if i % 2 == 0 else "a green bench?") for i in range(17)]
    try:
        p_yes = reward._answer_probabilities(random_images(17), questions)
    finally:
        for hook in hooks:
            hook.remove()
    assert len(p_yes) == 17
    assert vision_batches == [4, 4, 4, 4, 1]
    # Window 1: 8 short + 8 long questions, 4 per pass; window 2: the 17th image's one question.
    assert decoder_batches == [4, 4, 4, 4, 1]
