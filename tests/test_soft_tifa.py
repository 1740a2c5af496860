"""Soft-TIFA, TIFA and VQAScore on a tiny random Qwen3-VL built in the test (offline)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.qwen3_vl import CHAT_TEMPLATE, build_tiny_qwen3_vl
from rewards import get_reward_class, load
from rewards.atoms import answer_variants, prompt_atoms, tifa_correct
from rewards.soft_tifa import SoftTIFAReward, TIFAReward, VQAScoreReward

PROMPTS = [
    "four white bicycles in front of three plastic cows",
    "a green bench and a red car",
    "a horse on the right of a man",
]
VQA_LIST = [
    ["How many bicycles are in the image?", "four"],
    ["Are the bicycles white?", "Yes"],
    ["Are there any bicycles in the image?", "Yes"],
    ["Are the bicycles in front of the cows?", "Yes"],
    ["How many cows are in the image?", "three"],
    ["Are the cows plastic?", "Yes"],
    ["Are there any cows in the image?", "Yes"],
]
SKILLS = ["count", "attribute", "object", "position", "count", "attribute", "object"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny_qwen3_vl"), seed=0)


@pytest.fixture(scope="module")
def reward(model_dir: Path) -> SoftTIFAReward:
    return SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=4)


@pytest.fixture(scope="module")
def plain(model_dir: Path):
    """The model and processor as GenEval 2 loads them, for reference forwards."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return (
        AutoModelForImageTextToText.from_pretrained(model_dir).eval(),
        AutoProcessor.from_pretrained(model_dir),
    )


def random_images(count: int, seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (24 + 8 * i, 40 - 8 * (i % 2), 3), dtype=np.uint8))
        for i in range(count)
    ]


def plain_probabilities(plain, image: Image.Image, text: str) -> torch.Tensor:
    """Softmax of the next-token logits of an ordinary full forward, as GenEval 2 builds it."""
    model, processor = plain
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]}
    ]
    inputs = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        return model(**inputs).logits[0, -1].float().softmax(-1)


def official_sum(processor, probs: torch.Tensor, variants: tuple[str, ...]) -> float:
    """GenEval 2's sum over `tokenizer.encode(variant)[0]`, each distinct id once."""
    ids = {processor.tokenizer.encode(v, add_special_tokens=False)[0] for v in variants}
    return float(sum(probs[i] for i in ids))


def test_registry_and_metadata() -> None:
    assert get_reward_class("soft_tifa") is SoftTIFAReward
    assert get_reward_class("tifa") is TIFAReward
    assert get_reward_class("vqascore") is VQAScoreReward
    for cls in (SoftTIFAReward, TIFAReward, VQAScoreReward):
        assert cls.default_model == "Qwen/Qwen3-VL-8B-Instruct"
        assert cls.description


def test_tiny_tokenizer_has_the_answer_variants(reward: SoftTIFAReward) -> None:
    tokenizer = reward.vlm.tokenizer
    for variant in (*answer_variants("How many?", "four")[:5], "Yes", "yes", " yes", " Yes"):
        assert len(tokenizer.encode(variant, add_special_tokens=False)) == 1, variant
    # As in Qwen's tokenizer, digits are split and " 4" is a space token then "4".
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(" 4", add_special_tokens=False)) == [
        "Ġ", "4"
    ]
    text = reward.vlm.chat_text("Is it red?")
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>")
    assert text.endswith("Is it red?<|im_end|>\n<|im_start|>assistant\n")


def test_encoded_image_path_equals_plain_forward(reward: SoftTIFAReward, plain) -> None:
    """Images encoded once, questions of different lengths and images in one padded batch."""
    images = random_images(3, seed=2)
    encoded = reward.vlm.encode_images(images)
    questions = [
        (0, "How many cows are in the image? Answer in one word."),
        (1, "Is it? Answer in one word."),
        (2, "Are the bicycles in front of the cows? Answer in one word."),
        (0, "Are there any cows in the image? Answer in one word."),
    ]
    got = dict(reward.vlm.next_token_probabilities(encoded, questions, batch_size=4))
    for k, (index, text) in enumerate(questions):
        reference = plain_probabilities(plain, images[index], text)
        torch.testing.assert_close(got[k], reference, rtol=1e-5, atol=1e-6)
        assert got[k].sum().item() == pytest.approx(1.0, abs=1e-5)
    # The deepstack features matter: without them the answer changes.
    for image in encoded:
        image.deepstack = [torch.zeros_like(x) for x in image.deepstack]
    without = dict(reward.vlm.next_token_probabilities(encoded, questions[:1], batch_size=1))
    assert (without[0] - got[0]).abs().max() > 1e-4


def test_soft_scores_sum_variant_probabilities(reward: SoftTIFAReward, plain) -> None:
    image = random_images(1, seed=5)[0]
    details = reward.score([image], [PROMPTS[0]], [{"vqa_list": VQA_LIST}]).details[0]
    processor = plain[1]
    for question, answer, score, predicted in zip(
        details["questions"], details["expected_answers"], details["atom_scores"],
        details["predicted"], strict=True,
    ):
        probs = plain_probabilities(plain, image, f"{question} Answer in one word.")
        expected = official_sum(processor, probs, answer_variants(question, answer))
        assert score == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert predicted == processor.tokenizer.decode([int(probs.argmax())])
    # A count atom includes the first token of " 4" (a space), as the official code does;
    # multi_token="skip" leaves it out and changes nothing else.
    space = processor.tokenizer.convert_tokens_to_ids("Ġ")
    # the same batch size: another one changes the kernels' blocking, hence float32 rounding
    skip = SoftTIFAReward(model_name_or_path=reward.model_name_or_path, device="cpu",
                          batch_size=reward.batch_size, multi_token="skip")
    skipped = skip.score([image], [PROMPTS[0]], [{"vqa_list": VQA_LIST}]).details[0]
    for (question, _), first, only_single in zip(
        VQA_LIST, details["atom_scores"], skipped["atom_scores"], strict=True
    ):
        if question.startswith("How many"):
            probs = plain_probabilities(plain, image, f"{question} Answer in one word.")
            assert first - only_single == pytest.approx(float(probs[space]), rel=1e-4)
        else:
            assert first == pytest.approx(only_single, rel=1e-6)


def test_am_gm_details_and_ranges(reward: SoftTIFAReward, model_dir: Path) -> None:
    images = random_images(3)
    output = reward.score(images, PROMPTS)
    am = SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", aggregation="am")
    am_scores = am.score(images, PROMPTS).scores
    for score, am_score, details in zip(output.scores, am_scores, output.details, strict=True):
        atoms = np.array(details["atom_scores"])
        assert set(details) == {
            "questions", "expected_answers", "skills", "source", "atom_scores", "predicted",
            "am", "gm", "score",
        }
        assert len(atoms) == len(details["questions"]) == len(details["expected_answers"]) > 0
        assert ((atoms >= 0) & (atoms <= 1)).all()
        assert details["am"] == pytest.approx(atoms.mean(), rel=1e-9)
        assert details["gm"] == pytest.approx(np.exp(np.log(atoms).mean()), rel=1e-9)
        assert score == details["gm"] and am_score == pytest.approx(details["am"], rel=1e-5)
        assert 0.0 <= score <= am_score <= 1.0
    all_atoms = [p for d in output.details for p in d["atom_scores"]]
    assert max(all_atoms) - min(all_atoms) > 1e-3  # the random model still tells atoms apart


def test_questions_from_vqa_list_or_parser(reward: SoftTIFAReward) -> None:
    images = random_images(2)
    metadata = [{"vqa_list": VQA_LIST, "skills": SKILLS}, {"seed": 3}]
    details = reward.score(images, [PROMPTS[0], PROMPTS[1]], metadata).details
    assert details[0]["source"] == "vqa_list"
    assert [[q, a] for q, a in zip(details[0]["questions"], details[0]["expected_answers"])] == VQA_LIST
    assert details[0]["skills"] == SKILLS
    atoms = prompt_atoms(PROMPTS[1])
    assert details[1]["source"] == "parser"
    assert details[1]["questions"] == [a.question for a in atoms]
    assert details[1]["questions"][:2] == ["How many benches are in the image?", "Is the bench green?"]
    # GenEval 2's own questions and the parser's agree on GenEval 2's prompts.
    parsed = reward.score(images[:1], [PROMPTS[0]]).details[0]
    assert parsed["questions"] == details[0]["questions"]
    assert parsed["atom_scores"] == pytest.approx(details[0]["atom_scores"], rel=1e-5)


def test_batched_equals_one_at_a_time(reward: SoftTIFAReward, model_dir: Path) -> None:
    images = random_images(3, seed=1)
    together = reward.score(images, PROMPTS)
    alone = SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=1)
    for image, prompt, details in zip(images, PROMPTS, together.details, strict=True):
        single = alone.score([image], [prompt]).details[0]
        assert single["questions"] == details["questions"]
        np.testing.assert_allclose(single["atom_scores"], details["atom_scores"], rtol=1e-4, atol=1e-7)


def test_the_official_generate_procedure_gives_the_one_pass_scores(reward: SoftTIFAReward, model_dir: Path) -> None:
    """`procedure="generate"` (GenEval 2's own `generate` per question, exact in any dtype) and the default one
    pass agree to float32 round-off, for the atoms and for VQAScore."""
    images = random_images(2, seed=3)
    exact = SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", procedure="generate").score(images, PROMPTS[:2])
    for one_pass, official in zip(reward.score(images, PROMPTS[:2]).details, exact.details, strict=True):
        assert one_pass["predicted"] == official["predicted"]
        np.testing.assert_allclose(one_pass["atom_scores"], official["atom_scores"], rtol=1e-4, atol=1e-7)
    vqascore = [VQAScoreReward(model_name_or_path=str(model_dir), device="cpu", procedure=procedure).score(
        images, PROMPTS[:2]).scores for procedure in ("one_pass", "generate")]
    np.testing.assert_allclose(*vqascore, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="procedure"):
        SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", procedure="official")


def test_rewards_on_one_checkpoint_share_one_model(reward: SoftTIFAReward, model_dir: Path) -> None:
    vqascore = VQAScoreReward(model_name_or_path=str(model_dir), device="cpu", batch_size=2)
    assert vqascore.vlm is reward.vlm  # GenEval 2's score and VQAScore column: one copy of the VLM
    other_dtype = VQAScoreReward(model_name_or_path=str(model_dir), device="cpu", torch_dtype=torch.float64)
    assert other_dtype.vlm is not reward.vlm and other_dtype.vlm.model.dtype == torch.float64


def score_counting_passes(scorer: SoftTIFAReward, images: list[Image.Image], prompts: list[str]):
    """`scorer.score(images, prompts)`, with the images of each vision-tower pass and the rows of each LM-head pass."""
    encoded_images: list[int] = []
    head_rows: list[int] = []
    hooks = [
        scorer.vlm.model.base_model.visual.register_forward_hook(
            lambda module, args, kwargs, out: encoded_images.append(len(kwargs["grid_thw"])), with_kwargs=True
        ),
        scorer.vlm.model.get_output_embeddings().register_forward_pre_hook(
            lambda module, args: head_rows.append(args[0].shape[0])
        ),
    ]
    try:
        output = scorer.score(images, prompts)
    finally:
        for hook in hooks:
            hook.remove()
    return output, encoded_images, head_rows


def test_vision_tower_runs_once_per_image(reward: SoftTIFAReward) -> None:
    output, encoded_images, _ = score_counting_passes(reward, random_images(6), [PROMPTS[1]] * 5 + [""])
    assert sum(len(d["questions"]) for d in output.details) == 30  # 6 questions x 5 images
    assert encoded_images == [4, 1]  # batches of 4; the image without questions is skipped
    assert output.scores[-1] == 1.0 and output.details[-1]["questions"] == []


def test_windows_of_four_batches_encode_each_image_once_and_share_the_lm_head(model_dir: Path) -> None:
    """With batch_size 1 the images go in windows of 4: each image through the vision tower once (none in two
    windows), the LM head once per window for all of its images' questions."""
    scorer = SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=1)
    _, encoded_images, head_rows = score_counting_passes(scorer, random_images(6), [PROMPTS[1]] * 5 + [""])
    assert encoded_images == [1] * 5
    assert head_rows == [4 * 6, 6]  # images 0-3, then image 4 (image 5 has no questions)


def test_non_rgb_images(reward: SoftTIFAReward) -> None:
    rgb = random_images(1, seed=7)[0]
    gray, rgba = rgb.convert("L"), rgb.convert("RGBA")
    scores = reward.score([gray, rgba], [PROMPTS[1]] * 2).scores
    assert scores[0] == pytest.approx(reward.score([gray.convert("RGB")], [PROMPTS[1]]).scores[0], rel=1e-5)
    assert scores[1] == pytest.approx(reward.score([rgb], [PROMPTS[1]]).scores[0], rel=1e-5)


def test_tifa_hard_decision_on_the_argmax(model_dir: Path, reward: SoftTIFAReward) -> None:
    tifa = TIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=4)
    image = random_images(1, seed=5)[0]
    soft = reward.score([image], [PROMPTS[0]], [{"vqa_list": VQA_LIST}]).details[0]
    hard = tifa.score([image], [PROMPTS[0]], [{"vqa_list": VQA_LIST}]).details[0]
    assert hard["predicted"] == soft["predicted"]
    expected = [
        float(tifa_correct(token, answer_variants(q, a)))
        for q, a, token in zip(hard["questions"], hard["expected_answers"],
                               hard["predicted"], strict=True)
    ]
    assert hard["atom_scores"] == expected and hard["score"] == pytest.approx(np.mean(expected))
    # An atom whose expected answer is the model's own first word scores 1.
    question, token = next(
        (q, t) for q, t in zip(hard["questions"], hard["predicted"]) if t.strip().isalpha()
    )
    right = tifa.score([image], [PROMPTS[0]], [{"vqa_list": [[question, token.strip()]]}])
    assert right.scores == [1.0]


def test_vqascore_is_p_yes_of_the_official_question(model_dir: Path, plain) -> None:
    vqascore = VQAScoreReward(model_name_or_path=str(model_dir), device="cpu", batch_size=2)
    images = random_images(3, seed=4)
    output = vqascore.score(images, PROMPTS)
    for image, prompt, score, details in zip(images, PROMPTS, output.scores, output.details, strict=True):
        question = f'Does this image show "{prompt}"? Answer the question with Yes or No.'
        assert details["question"] == question
        probs = plain_probabilities(plain, image, question)
        expected = official_sum(plain[1], probs, ("Yes", "yes", " yes", " Yes"))
        assert score == details["p_yes"] == details["score"] == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert 0.0 <= score <= 1.0


def test_bad_input(model_dir: Path, reward: SoftTIFAReward, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="--reward_model_name_or_path"):
        load("soft_tifa", model_name_or_path=str(tmp_path / "no_such_model"), device="cpu")
    with pytest.raises(ValueError, match="aggregation"):
        SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", aggregation="mean")
    with pytest.raises(ValueError, match=r"vqa_list\[0\]"):
        reward.score(random_images(1), [PROMPTS[0]], [{"vqa_list": [["no answer"]]}])


@pytest.mark.parametrize("reward_class", [SoftTIFAReward, TIFAReward, VQAScoreReward])
def test_a_thinking_checkpoint_is_refused_when_the_reward_is_built(
    reward_class: type, model_dir: Path, tmp_path: Path
) -> None:
    """A Qwen3-VL-*-Thinking template ends the generation prompt with "<think>\\n": the first token
    read would be reasoning, so the reward refuses the checkpoint before scoring (or loading) anything."""
    thinking = tmp_path / "Qwen3-VL-8B-Thinking"
    shutil.copytree(model_dir, thinking)
    prompt = "'<|im_start|>assistant\\n'"
    assert prompt in CHAT_TEMPLATE
    (thinking / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace(prompt, "'<|im_start|>assistant\\n<think>\\n'"))
    (thinking / "model.safetensors").unlink()  # never read
    with pytest.raises(ValueError, match=r"Qwen3-VL-8B-Thinking' is a thinking.*first token.*Qwen3-VL-8B-Instruct\."):
        reward_class(model_name_or_path=str(thinking), device="cpu")


def test_images_past_the_first_window_get_their_own_answers(reward: SoftTIFAReward, model_dir: Path) -> None:
    """With more images than one window (4 * batch_size), each image's atoms still score its own answers."""
    images = random_images(6, seed=8)
    prompts = [PROMPTS[i % 3] for i in range(6)]
    windowed = SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=1).score(images, prompts)
    whole = reward.score(images, prompts)  # batch_size 4: one window of 16 images
    for got, want in zip(windowed.details, whole.details, strict=True):
        assert got["questions"] == want["questions"] and got["predicted"] == want["predicted"]
        np.testing.assert_allclose(got["atom_scores"], want["atom_scores"], rtol=1e-4, atol=1e-7)


def test_tifa_scores_the_arithmetic_mean_by_default(model_dir: Path, reward: SoftTIFAReward) -> None:
    """TIFA's default aggregation is the official mean: one right and one wrong atom score 0.5, not GM's 0."""
    image = random_images(1, seed=5)[0]
    predicted = reward.score([image], [PROMPTS[0]], [{"vqa_list": VQA_LIST}]).details[0]["predicted"]
    question, token = next((q, t.strip()) for (q, _), t in zip(VQA_LIST, predicted) if t.strip().isalpha())
    vqa_list = [[question, token], [question, "zebra"]]
    tifa = TIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=4)
    details = tifa.score([image], [PROMPTS[0]], [{"vqa_list": vqa_list}]).details[0]
    assert details["atom_scores"] == [1.0, 0.0]
    assert details["score"] == details["am"] == 0.5 and details["gm"] == 0.0


@pytest.mark.parametrize("reward_class", [SoftTIFAReward, TIFAReward, VQAScoreReward])
def test_the_default_procedure_is_the_one_pass(reward_class: type, model_dir: Path, monkeypatch) -> None:
    """Without `procedure`, every GenEval 2 reward scores on the shared-prefix one pass, never `generate`."""
    scorer = reward_class(model_name_or_path=str(model_dir), device="cpu", batch_size=2)
    assert scorer.procedure == "one_pass"

    def refuse(*args, **kwargs):
        raise AssertionError("generate was run")

    monkeypatch.setattr(scorer.vlm, "generated_probabilities", refuse)
    assert len(scorer.score(random_images(2), PROMPTS[:2]).scores) == 2


@pytest.mark.parametrize("reward_class", [SoftTIFAReward, TIFAReward, VQAScoreReward])
def test_float16_runs_the_judges_in_bfloat16(reward_class: type) -> None:
    """Qwen3-VL was trained in bfloat16: a float16 request runs these rewards in bfloat16."""
    from rewards.combined import member_dtype

    assert member_dtype(reward_class, torch.float16) == torch.bfloat16
    assert member_dtype(reward_class, torch.float32) == torch.float32


def test_an_empty_vqa_list_asks_no_questions(reward: SoftTIFAReward) -> None:
    """A ``vqa_list`` that is present but empty is taken as is (no atoms, score 1.0), not replaced by the parser's."""
    details = reward.score(random_images(1), [PROMPTS[1]], [{"vqa_list": []}]).details[0]
    assert details["source"] == "vqa_list" and details["questions"] == [] and details["score"] == 1.0
