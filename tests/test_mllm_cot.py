"""T2I-CompBench's MLLM-CoT judge: the official questions and parser, and the batched chat on a tiny Qwen3-VL."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.qwen3_vl import CHAT_TEMPLATE, build_tiny_qwen3_vl
from rewards import get_reward_class
from rewards.mllm_cot import ChatJudge, MLLMCoTReward, check_chat_processor
from rewards.mllm_cot_prompts import (
    CATEGORIES,
    NO_NUMBER,
    category_questions,
    noun_and_attribute,
    parse_score,
)
from rewards.vlm import ChatVLM

MAX_NEW_TOKENS = 10


# ----------------------------------------------------------------------------------------------
# Questions and parser (no model).


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("Score: 85", 85.0),
        ("85/100", 85.0),
        ('{"score": 85, "explanation": "a red car"}', 85.0),
        ("```json\n{\n  \"score\": 100,\n  \"explanation\": \"...\"}\n```", 100.0),
        ("I rate it 0.", 0.0),
        ("85%", 85.0),
        ("8.5 out of 10", 8.0),  # the official split at non-word characters: "8", ".", "5"
        ("In 2024 I saw 3 cars; score 85", 3.0),  # the first whole number in [0, 100] anywhere wins
    ],
)
def test_parse_score_reads_the_first_number_as_the_official_script(answer: str, expected: float) -> None:
    value, reason = parse_score(answer)
    assert value == expected
    assert str(int(expected)) in reason


@pytest.mark.parametrize("answer", ["eighty-five", "", "score85", "score: 150", "It is good.", "½"])
def test_parse_score_without_a_number_gives_a_reason(answer: str) -> None:
    assert parse_score(answer) == (None, NO_NUMBER)


def test_attribute_questions_follow_the_official_script() -> None:
    questions = category_questions("color", "a green bench and a red car", backend="builtin")
    assert questions.describe == ("You are my assistant to identify any objects and their color in the image. "
                                  "Briefly describe what it is in the image within 50 words")
    assert questions.phrases == ("a green bench", "a red car")
    first, second = questions.rate
    # The official string concatenation has no space after "image?".
    assert first.startswith("According to the image and your previous answer, evaluate if there is a green bench "
                            "in the image?Give a score from 0 to 100, according the criteria:")
    assert "\n 100: there is bench, and bench is green.\n 75: there is bench, bench is mostly green." in first
    assert "\n 20: there is bench, but it is not green.\n 10: no bench in the image." in first
    assert second.startswith("Please evaluate if there is a red car in the image according to the same criteria.")
    assert category_questions("texture", "a wooden table", backend="builtin").describe.endswith(
        "their texture in the image. Briefly describe what it is in the image within 50 words")


def test_noun_and_attribute_split_as_the_official_replacements() -> None:
    assert noun_and_attribute("a green bench", "builtin") == ("bench", "green")
    assert noun_and_attribute("the big round table", "builtin") == ("table", "big round")


@pytest.mark.parametrize(
    ("category", "describe", "criteria"),
    [
        ("spatial", "their spatial layout in the image", "\n 80: basically, spatial layout of objects matches"),
        ("3d_spatial", "their spatial layout in the image", "\n 20: image almost irrelevant to the text"),
        ("non_spatial", "the actions, events, objects and their relationships",
         "\n 60: the image depicted some elements, but action relationships"),
        ("complex", "evaluate the correspondence of the image to a given text prompt",
         "\n 40: the image did not depict any actions or events that match the text."),
        ("numeracy", "their quantities in the image", "\n 100: correct numerical content in the image"),
    ],
)
def test_prompt_level_questions_quote_the_prompt_once(category: str, describe: str, criteria: str) -> None:
    prompt = "a dog on the left of a cat"
    questions = category_questions(category, prompt)
    assert describe in questions.describe and "Briefly describe the image within 50 words" in questions.describe
    (rate,) = questions.rate
    assert rate.count(f'"{prompt}"') == 1
    assert criteria in rate
    assert rate.endswith("score (e.g., 85), explanation (within 20 words).")
    assert questions.phrases == ()


def test_unknown_category_is_refused() -> None:
    with pytest.raises(ValueError, match="non_spatial"):
        category_questions("non-spatial", "a man riding a horse")
    assert set(CATEGORIES) == {"color", "shape", "texture", "spatial", "non_spatial", "complex", "3d_spatial",
                               "numeracy"}


# ----------------------------------------------------------------------------------------------
# The judge on a tiny random Qwen3-VL.


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny_qwen3_vl"), seed=0)


@pytest.fixture(scope="module")
def vlm(model_dir: Path) -> ChatVLM:
    return ChatVLM.from_pretrained(str(model_dir), torch.device("cpu"), torch.float32)


def random_images(sides: list[int], seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (side, side + 8 * (i % 2), 3), dtype=np.uint8))
            for i, side in enumerate(sides)]


def chat_inputs(vlm: ChatVLM, image: Image.Image, questions: list[str], answers: list[str]) -> dict:
    """The processor's inputs for the conversation so far, ready for the answer to ``questions[len(answers)]``:
    the image with the first question, then each answer and the next question."""
    messages: list[dict] = []
    for k, question in enumerate(questions[: len(answers) + 1]):
        content = ([{"type": "image"}] if k == 0 else []) + [{"type": "text", "text": question}]
        messages.append({"role": "user", "content": content})
        if k < len(answers):
            messages.append({"role": "assistant", "content": answers[k]})
    text = vlm.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return vlm.processor(text=[text], images=[image], return_tensors="pt")


def plain_generate_conversation(vlm: ChatVLM, image: Image.Image, questions: list[str], eos: list[int]) -> list[str]:
    """The official procedure: for every answer, render the whole conversation, preprocess the image
    again and run a plain greedy ``generate``."""
    answers: list[str] = []
    for _ in questions:
        inputs = chat_inputs(vlm, image, questions, answers)
        output = vlm.model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=eos,
                                    pad_token_id=vlm.tokenizer.pad_token_id)
        new_tokens = output[0, inputs["input_ids"].shape[1] :]
        answers.append(vlm.tokenizer.decode(new_tokens, skip_special_tokens=True).strip())
    return answers


TURNS = [
    ["Is it red?", "How many cars?"],
    ["Describe the image.", "Is there a dog?", "Are there any cats?"],
    ["How many?"],
]


@pytest.mark.parametrize("early_end", [False, True])
def test_batched_conversations_equal_plain_generate_per_image(vlm: ChatVLM, early_end: bool) -> None:
    """Different image sizes, question counts and (with `early_end`) answers ending at different steps."""
    images = random_images([32, 24, 32])
    original = vlm.model.generation_config.eos_token_id
    if early_end:
        # A frequent token of the random model as an extra end of answer, so rows stop at different steps.
        vlm.model.generation_config.eos_token_id = [vlm.tokenizer.convert_tokens_to_ids("word"),
                                                    vlm.tokenizer.eos_token_id]
    try:
        judge = ChatJudge(vlm, MAX_NEW_TOKENS)
        batched = judge.conversations(images, TURNS)
        reference = [plain_generate_conversation(vlm, image, turns, sorted(judge.eos_ids))
                     for image, turns in zip(images, TURNS)]
    finally:
        vlm.model.generation_config.eos_token_id = original
    assert batched == reference
    assert [len(answers) for answers in batched] == [2, 3, 1]
    if early_end:
        assert min(len(a) for answers in batched for a in answers) < max(len(a) for answers in batched for a in answers)


def test_every_answer_starts_from_the_logits_of_a_plain_forward_of_its_conversation(
    vlm: ChatVLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stricter than the answer texts (the tiny random model's greedy tokens hardly depend on the context):
    the first-token logits of every turn, with padded prompts and tails of different lengths in the batch.
    The first row, whose prompt and second turn are the shortest (padded), goes on to a third turn."""
    images = random_images([32, 24, 32])
    turns = [["How many?", "Is there a dog in the image?", "Is it red?"], TURNS[1], TURNS[0]]
    judge = ChatJudge(vlm, MAX_NEW_TOKENS)
    first_logits: list[dict[int, torch.Tensor]] = []  # per turn: row -> logits of its answer's first token
    decode = judge._decode

    def recording(batch, active, logits):
        first_logits.append({i: logits[i].clone() for i in active})
        decode(batch, active, logits)

    monkeypatch.setattr(judge, "_decode", recording)
    answers = judge.conversations(images, turns)
    assert [sorted(rows) for rows in first_logits] == [[0, 1, 2], [0, 1, 2], [0, 1]]
    for turn, rows in enumerate(first_logits):
        for i, logits in rows.items():
            with torch.no_grad():
                plain = vlm.model(**chat_inputs(vlm, images[i], turns[i], answers[i][:turn])).logits[0, -1]
            torch.testing.assert_close(logits, plain, atol=1e-4, rtol=1e-4)


def test_each_image_runs_the_vision_tower_once(vlm: ChatVLM, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    original = vlm.model.base_model.get_image_features

    def counted(pixel_values, grid, **kwargs):
        calls.append(int(grid.shape[0]))
        return original(pixel_values, grid, **kwargs)

    monkeypatch.setattr(vlm.model.base_model, "get_image_features", counted)
    ChatJudge(vlm, 3).conversations(random_images([32, 32, 24]), TURNS)
    assert calls == [3]  # one pass over the three images, none for the later turns


def test_judge_refuses_bad_arguments(vlm: ChatVLM) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        ChatJudge(vlm, 0)
    with pytest.raises(ValueError, match="every image at least one question"):
        ChatJudge(vlm, 4).conversations(random_images([32]), [[]])
    with pytest.raises(ValueError, match="give at least one image"):
        ChatJudge(vlm, 4).conversations([], [])


def test_an_answer_ends_at_the_configured_and_the_tokenizer_end_tokens(
    vlm: ChatVLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    eos, word = vlm.tokenizer.eos_token_id, vlm.tokenizer.convert_tokens_to_ids("word")
    monkeypatch.setattr(vlm.model.generation_config, "eos_token_id", None)
    assert ChatJudge(vlm, 4).eos_ids == {eos}
    monkeypatch.setattr(vlm.model.generation_config, "eos_token_id", word)  # one id, not a list
    assert ChatJudge(vlm, 4).eos_ids == {word, eos}


def test_the_end_token_ends_the_answer_and_is_not_part_of_it(vlm: ChatVLM, monkeypatch: pytest.MonkeyPatch) -> None:
    images, turns = random_images([32]), [["How many?"]]
    two_tokens = ChatJudge(vlm, 2).conversations(images, turns)
    judge = ChatJudge(vlm, MAX_NEW_TOKENS)
    logits_of = judge._logits
    steps = []

    def ending_at_the_third_token(hidden: torch.Tensor) -> torch.Tensor:
        logits = logits_of(hidden)
        steps.append(len(steps))
        if len(steps) == 3:
            logits[:, vlm.tokenizer.eos_token_id] = logits.max() + 1
        return logits

    monkeypatch.setattr(judge, "_logits", ending_at_the_third_token)
    assert judge.conversations(images, turns) == two_tokens
    assert len(steps) == 3  # no step after the end


def test_an_answer_of_n_tokens_runs_the_language_model_n_times(vlm: ChatVLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt's pass gives the first token, each later token one pass; the last token is not run."""
    base = vlm.model.base_model
    calls = []
    forward = base.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(base, "forward", counted)
    judge = ChatJudge(vlm, 4)
    judge.eos_ids = set()  # no end of answer: the answer takes all 4 tokens
    judge.conversations(random_images([32]), [["How many?"]])
    assert len(calls) == 4


@pytest.mark.parametrize(
    ("template", "error", "message"),
    [
        # No image placeholder: the image would not reach the model.
        (CHAT_TEMPLATE.replace("<|image_pad|>", ""), ValueError, "wrote 0 image placeholders"),
        # A system turn once there is an answer: the cached first turn is no longer a prefix.
        ("{%- if messages|length > 1 %}{{- '<|im_start|>system\\nGo on.<|im_end|>\\n' }}{%- endif %}"
         + CHAT_TEMPLATE, RuntimeError, "renders the conversation's earlier turns differently"),
        # Only the first turn rendered: the next question adds nothing to the cache.
        (CHAT_TEMPLATE.replace("for message in messages", "for message in messages[:1]"), RuntimeError,
         "cannot be continued"),
    ],
)
def test_a_chat_template_the_judge_cannot_follow_is_refused(
    vlm: ChatVLM, monkeypatch: pytest.MonkeyPatch, template: str, error: type[Exception], message: str
) -> None:
    monkeypatch.setattr(vlm.processor, "chat_template", template)
    with pytest.raises(error, match=message):
        ChatJudge(vlm, 2).conversations(random_images([32]), [["Is it red?", "How many?"]])


@pytest.fixture(scope="module")
def reward(model_dir: Path) -> MLLMCoTReward:
    return MLLMCoTReward(model_name_or_path=str(model_dir), device="cpu", batch_size=2, category="color",
                         max_new_tokens=MAX_NEW_TOKENS, noun_phrase_backend="builtin")


def test_reward_scores_in_range_with_answers_and_reasons(reward: MLLMCoTReward) -> None:
    prompts = ["a green bench and a red car", "a blue dog", "a white cat and a black cow", "a red car"]
    images = random_images([32, 24, 32, 16])
    output = reward.score(images, prompts)
    assert len(output.scores) == 4
    for prompt, score, details in zip(prompts, output.scores, output.details):
        assert 0.0 <= score <= 1.0
        questions = category_questions("color", prompt, backend="builtin")
        assert details["questions"] == list(questions.rate)
        assert len(details["answers"]) == len(questions.rate) == len(details["phrase_scores"])
        assert isinstance(details["description"], str)
        # The score is the mean of the parsed numbers / 100, an answer without one counting 0.
        assert score == pytest.approx(sum(v or 0.0 for v in details["phrase_scores"]) / len(questions.rate) / 100)
        for answer, value, reason in zip(details["answers"], details["phrase_scores"], details["reasons"]):
            assert (value, reason) == parse_score(answer)
        if None in details["phrase_scores"]:
            assert "no whole number from 0 to 100" in details["reason"]
            assert "counted as 0" in details["reason"]
        else:
            assert details["reason"].startswith("rated ")
    # Deterministic (greedy), and independent of how the images are batched.
    again = reward.score(images[::-1], prompts[::-1])
    assert again.scores == output.scores[::-1]
    assert [d["answers"] for d in again.details] == [d["answers"] for d in output.details][::-1]


def test_reward_of_a_prompt_without_noun_phrase_is_zero_with_a_reason(reward: MLLMCoTReward) -> None:
    output = reward.score(random_images([32, 32]), ["", "a red car"])
    assert output.scores[0] == 0.0
    assert output.details[0]["reason"] == "the prompt has no noun phrase to rate"
    assert output.details[1]["questions"]


def test_reward_loads_by_dotted_path_and_checks_its_options(model_dir: Path) -> None:
    assert get_reward_class("rewards.mllm_cot:MLLMCoTReward") is MLLMCoTReward
    with pytest.raises(ValueError, match="category=None.*color"):
        MLLMCoTReward(model_name_or_path=str(model_dir), device="cpu")
    with pytest.raises(ValueError, match="max_new_tokens"):
        MLLMCoTReward(model_name_or_path=str(model_dir), device="cpu", category="spatial", max_new_tokens=0)
    with pytest.raises(ValueError, match="noun_phrase_backend='nltk'"):
        MLLMCoTReward.check_options({"category": "color", "noun_phrase_backend": "nltk"})


def test_reward_defaults_are_the_official_scripts(model_dir: Path) -> None:
    reward = MLLMCoTReward(model_name_or_path=str(model_dir), device="cpu", category="complex")
    assert reward.judge.max_new_tokens == 300  # the official max_new_tokens
    assert reward.noun_phrase_backend == "auto"  # spaCy's noun chunks when installed, as the official script


def test_a_processor_without_image_token_is_refused(monkeypatch: pytest.MonkeyPatch, model_dir: Path) -> None:
    from transformers import AutoProcessor

    monkeypatch.setattr(AutoProcessor, "from_pretrained",
                        lambda name, **kwargs: SimpleNamespace(chat_template="{{ messages }}", image_token=None))
    with pytest.raises(ValueError, match="not a chat vision-language model: its processor has no image token"):
        check_chat_processor(str(model_dir))


def test_a_vlm_without_chat_template_is_refused_before_loading_weights(model_dir: Path, tmp_path: Path) -> None:
    plain = tmp_path / "no_chat"
    shutil.copytree(model_dir, plain)
    (plain / "chat_template.jinja").unlink()
    (plain / "model.safetensors").unlink()  # never read: the processor alone is refused
    with pytest.raises(ValueError, match="not a chat vision-language model.*no chat template.*Instruct"):
        MLLMCoTReward(model_name_or_path=str(plain), device="cpu", category="complex")


def test_a_thinking_checkpoint_is_refused_before_loading_weights(model_dir: Path, tmp_path: Path) -> None:
    """Its reasoning would come first and spend the answer's token budget before any rating."""
    thinking = tmp_path / "Qwen3-VL-8B-Thinking"
    shutil.copytree(model_dir, thinking)
    prompt = "'<|im_start|>assistant\\n'"
    assert prompt in CHAT_TEMPLATE
    (thinking / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace(prompt, "'<|im_start|>assistant\\n<think>\\n'"))
    (thinking / "model.safetensors").unlink()  # never read: the processor alone is refused
    with pytest.raises(ValueError, match=r"Qwen3-VL-8B-Thinking' is a thinking.*bounded length.*Qwen3-VL-8B-Instruct\."):
        MLLMCoTReward(model_name_or_path=str(thinking), device="cpu", category="complex")


def test_reward_averages_the_phrase_scores_and_counts_a_missing_number_as_zero(
    reward: MLLMCoTReward, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The random model never writes a number: the judge's answers are given here."""
    answers = {2: ["a bench and a car", '{"score": 85, "explanation": "green"}', "eighty, it is red"],
               1: ["a dog", "Score: 100/100"]}
    monkeypatch.setattr(reward.judge, "conversations",
                        lambda images, turns: [answers[len(t) - 1] for t in turns])
    output = reward.score(random_images([32, 32]), ["a green bench and a red car", "a blue dog"])
    assert output.scores == [pytest.approx(0.425), 1.0]
    first, second = output.details
    assert first["phrase_scores"] == [85.0, None]
    assert first["description"] == "a bench and a car"
    assert first["reason"] == ("scoring answer 2 of 2 had no whole number from 0 to 100 "
                               "(counted as 0, as the official script does)")
    assert first["reasons"] == ["read 85 from the answer", NO_NUMBER]
    assert second["reason"] == "rated 100 out of 100"


def test_a_rating_of_0_is_a_rating_not_a_missing_number(reward: MLLMCoTReward, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = ["a bench, a car and a dog", "Score: 0", "Score: 40", "Score: 60"]
    monkeypatch.setattr(reward.judge, "conversations", lambda images, turns: [answers for _ in turns])
    output = reward.score(random_images([32]), ["a green bench, a red car and a blue dog"])
    assert output.scores == [pytest.approx(1 / 3)]  # the mean of 0, 40 and 60, / 100
    assert output.details[0]["phrase_scores"] == [0.0, 40.0, 60.0]
    assert output.details[0]["reason"] == "rated 0, 40, 60 out of 100"
