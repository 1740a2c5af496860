"""TIT-Score: the pure rules, the embedding (pooling, padding, cosine) on a tiny Qwen3 model, the
reward with a tiny Qwen3-VL describer, TIT-Score-LLM with a tiny chat LLM, and LPG-Bench end to end
on a tiny local dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from evaluators.lpg_bench import LPGBenchBenchmark, prompt_column_of
from gors.core.data import DownloadError
from rewards.tit_rules import (
    DESCRIPTION_PROMPT,
    JUDGE_TEMPLATE,
    cosine_similarities,
    cosine_to_score,
    last_token_pool,
    parse_judge_rating,
    query_text,
)

PROMPTS = ["a red cat on the house", "the sky is blue and the sun is white", "a dog with a car"]

# ---------------------------------------------------------------------------------------------
# Pure rules.


def test_cosine_to_score_mappings():
    assert cosine_to_score(0.73) == 0.73
    assert cosine_to_score(-0.2) == 0.0
    assert cosine_to_score(-0.2, "affine") == pytest.approx(0.4)
    assert cosine_to_score(1.0, "affine") == 1.0
    with pytest.raises(ValueError, match="cosine must lie in"):
        cosine_to_score(1.5)
    with pytest.raises(ValueError, match="mapping must be"):
        cosine_to_score(0.5, "sigmoid")


@pytest.mark.parametrize(
    ("reply", "rating"),
    [("85", 85.0), ("Score: 72/100", 72.0), ("<think>maybe 10?</think>\n90", 90.0), ("7.5", 7.5),
     ("I cannot tell.", None), ("150", None), ("0", 0.0),
     ("100", 100.0),  # the top of the scale is a rating
     ("Qwen3 rates it 85", 85.0),  # a digit inside a word is no number
     ("<think>1</think>70<think>2</think>", 70.0)],  # each thinking block ends at its own </think>
)
def test_parse_judge_rating(reply, rating):
    assert parse_judge_rating(reply) == rating


def test_last_token_pool_left_right_and_mixed_padding():
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    mixed = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])
    assert torch.equal(last_token_pool(hidden, right), torch.stack([hidden[0, 1], hidden[1, 3]]))
    assert torch.equal(last_token_pool(hidden, left), torch.stack([hidden[0, 3], hidden[1, 3]]))
    assert torch.equal(last_token_pool(hidden, mixed), torch.stack([hidden[0, 1], hidden[1, 3]]))
    with pytest.raises(ValueError, match="no real token"):
        last_token_pool(hidden, torch.zeros(2, 4, dtype=torch.long))


def test_cosine_and_query_text():
    a = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    b = torch.tensor([[6.0, 8.0], [-1.0, 1.0]])
    assert cosine_similarities(a, b).tolist() == pytest.approx([1.0, -1 / np.sqrt(2)])
    assert query_text("a cat", None) == "a cat"
    assert query_text("a cat", "Find the image description") == "Instruct: Find the image description\nQuery:a cat"


# ---------------------------------------------------------------------------------------------
# Tiny models.


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    from gors.testing.qwen3_embedding import build_tiny_qwen3_chat, build_tiny_qwen3_embedding
    from gors.testing.qwen3_vl import build_tiny_qwen3_vl

    root = tmp_path_factory.mktemp("tiny_tit")
    return {
        "vlm": build_tiny_qwen3_vl(root / "vlm", seed=0),
        "embedding": build_tiny_qwen3_embedding(root / "embedding", seed=0),
        "chat": build_tiny_qwen3_chat(root / "chat", seed=0),
    }


@pytest.fixture(scope="module")
def reward(tiny_models, one_torch_thread):
    from rewards.tit_score import TITScoreReward

    return TITScoreReward(str(tiny_models["vlm"]), device="cpu", batch_size=2, max_new_tokens=6,
                          embedding_model_name_or_path=str(tiny_models["embedding"]))


def _images(n: int) -> list[Image.Image]:
    return [Image.fromarray(np.random.RandomState(i).randint(0, 255, (32, 32, 3), dtype=np.uint8)) for i in range(n)]


def _alone(model, tokenizer, text: str) -> torch.Tensor:
    """The embedding of `text` by hand: a batch of one (no padding), last hidden state, L2 norm."""
    ids = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        hidden = model(**ids).last_hidden_state[0, -1]
    return hidden / hidden.norm()


def test_cosine_equals_hand_computed_from_the_same_embedding_model(reward, tiny_models):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["embedding"])
    model = AutoModel.from_pretrained(tiny_models["embedding"]).eval()
    assert tokenizer([PROMPTS[0]]).input_ids[0][-1] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    descriptions = ["a white dog", "yellow cars in the sky at night", "the sun"]
    by_hand = [float(_alone(model, tokenizer, p) @ _alone(model, tokenizer, d)) for p, d in zip(PROMPTS, descriptions)]
    # The three prompts and descriptions of different lengths share one left-padded batch.
    assert reward.similarities(PROMPTS, descriptions) == pytest.approx(by_hand, abs=1e-5)
    assert len({round(c, 4) for c in by_hand}) == 3  # the tiny model tells the texts apart


def test_left_and_right_padding_give_the_same_embeddings(reward):
    embedder = reward.embedder
    texts = ["a cat", "the sky is blue and the sun is white in the image"]
    left = embedder.embed(texts)
    embedder.tokenizer.padding_side = "right"
    try:
        right = embedder.embed(texts)
    finally:
        embedder.tokenizer.padding_side = "left"
    assert torch.allclose(left, right, atol=1e-5)
    assert torch.allclose(left.norm(dim=-1), torch.ones(2), atol=1e-5)


def test_reward_scores_in_unit_interval_with_generated_descriptions(reward):
    images = _images(3)
    output = reward.score(images, PROMPTS)
    assert len(output.scores) == 3 and all(0.0 <= s <= 1.0 for s in output.scores)
    descriptions = [d["description"] for d in output.details]
    for score, details in zip(output.scores, output.details):
        assert -1.0 <= details["cosine"] <= 1.0
        assert score == cosine_to_score(details["cosine"])
        assert details["description_words"] == len(details["description"].split())
    # The score is the cosine of the prompt and the description that was generated, to 4 decimals.
    assert [d["cosine"] for d in output.details] == [round(c, 4) for c in reward.similarities(PROMPTS, descriptions)]
    # Greedy generation: the same image gets the same description, alone or in a batch.
    assert reward.describer.describe(images[1:2]) == descriptions[1:2]
    assert reward.describer.instruction == DESCRIPTION_PROMPT


def test_describer_is_a_real_generate_call_matching_the_processor_path(reward):
    vlm = reward.describer.vlm
    image = _images(1)[0]
    inputs = vlm.processor(text=[vlm.chat_text(DESCRIPTION_PROMPT)], images=[image], return_tensors="pt")
    with torch.no_grad():
        output = vlm.model.generate(**inputs, max_new_tokens=6, do_sample=False, repetition_penalty=1.05)
    expected = vlm.tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()
    assert reward.describer.describe([image]) == [expected]


def _generating(monkeypatch, model, tokenizer, reply: str) -> None:
    """`model.generate` writes the tokens of `reply` after every row's input."""
    ids = tokenizer(reply, return_tensors="pt").input_ids
    monkeypatch.setattr(model, "generate",
                        lambda input_ids, **kwargs: torch.cat([input_ids, ids.expand(len(input_ids), -1)], dim=1))


def test_description_is_the_new_tokens_decoded_as_the_reference(reward, monkeypatch):
    """Special tokens skipped, no clean-up of tokenization spaces (`clean_up_tokenization_spaces=False`), stripped."""
    vlm = reward.describer.vlm
    _generating(monkeypatch, vlm.model, vlm.tokenizer, " a cat , a dog 's toy .<|im_end|>")
    assert reward.describer.describe(_images(2)) == ["a cat , a dog 's toy ."] * 2


def _generate_calls(monkeypatch, model) -> list[dict]:
    """The keyword arguments of every `model.generate` call from now on (the calls still run)."""
    calls: list[dict] = []
    generate = model.generate

    def recording(*args, **kwargs):
        calls.append(kwargs)
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording)
    return calls


def test_describer_decodes_as_the_reference_greedy_with_repetition_penalty_1_05(reward, monkeypatch):
    calls = _generate_calls(monkeypatch, reward.describer.vlm.model)
    reward.score(_images(2), PROMPTS[:2])
    assert len(calls) == 1  # one batch of 2
    assert calls[0]["do_sample"] is False and calls[0]["repetition_penalty"] == 1.05
    assert calls[0]["max_new_tokens"] == 6


def test_generation_kwargs_override_the_reference_decoding(reward, tiny_models, monkeypatch):
    from rewards.tit_score import Describer, TITScoreReward

    calls = _generate_calls(monkeypatch, reward.describer.vlm.model)
    plain = Describer(reward.describer.vlm, max_new_tokens=3, generation_kwargs={"repetition_penalty": 1.0})
    plain.describe(_images(1))
    assert calls[-1]["repetition_penalty"] == 1.0 and calls[-1]["do_sample"] is False
    # Through the reward's option too (the same tiny VLM, shared by `load_chat_vlm`).
    other = TITScoreReward(str(tiny_models["vlm"]), device="cpu", max_new_tokens=3,
                           embedding_model_name_or_path=str(tiny_models["embedding"]),
                           generation_kwargs={"repetition_penalty": 1.2, "no_repeat_ngram_size": 2})
    assert other.describer.vlm is reward.describer.vlm
    other.describer.describe(_images(1))
    assert calls[-1]["repetition_penalty"] == 1.2 and calls[-1]["no_repeat_ngram_size"] == 2
    assert calls[-1]["do_sample"] is False


def test_embedding_dtype_names():
    from rewards.tit_score import embedding_torch_dtype

    assert [embedding_torch_dtype(name) for name in ("float32", "bfloat16", "float16")] == [
        torch.float32, torch.bfloat16, torch.float16]


def test_max_length_truncates_the_embedded_texts_and_defaults_are_the_reference(reward, tiny_models):
    from rewards.tit_score import TITScoreReward

    assert reward.embedder.max_length == 8192
    short = TITScoreReward(str(tiny_models["vlm"]), device="cpu",
                           embedding_model_name_or_path=str(tiny_models["embedding"]), max_length=4)
    assert short.describer.max_new_tokens == 512
    # Three tokens and the appended <|endoftext|>: texts that differ only later embed alike.
    same_start = short.embedder.embed(["a red cat on the house", "a red cat in the sky at night"])
    assert torch.allclose(same_start[0], same_start[1], atol=1e-6)
    assert not torch.allclose(*reward.embedder.embed(["a red cat on the house", "a red cat in the sky at night"]))


def test_images_of_different_sizes_are_described_as_alone(reward):
    """Left padding: a batch of differently sized images (prompts of different lengths) describes each as alone."""
    images = [_images(1)[0], Image.fromarray(np.random.RandomState(5).randint(0, 255, (32, 64, 3), dtype=np.uint8))]
    describe = reward.describer.describe
    assert describe(images) == describe(images[:1]) + describe(images[1:])


def test_embedding_dtype_option_reaches_the_embedder(reward, tiny_models):
    from rewards.combined import check_reward_options
    from rewards.tit_score import TITScoreReward

    assert reward.embedder.model.dtype == torch.float32  # the default: the reference's
    check_reward_options("tit_score", {"embedding_dtype": "bfloat16"})  # a declared --reward_options key
    half = TITScoreReward(str(tiny_models["vlm"]), device="cpu", max_new_tokens=3,
                          embedding_model_name_or_path=str(tiny_models["embedding"]), embedding_dtype="bfloat16")
    assert half.embedder.model.dtype == torch.bfloat16
    assert half.describer.vlm.model.dtype == torch.float32  # the describer keeps the reward's dtype
    descriptions = ["a white dog", "yellow cars in the sky at night", "the sun"]
    # float32 cosines either way; bfloat16's round-off moves them a little on the tiny model.
    cosines = half.similarities(PROMPTS, descriptions)
    assert cosines == pytest.approx(reward.similarities(PROMPTS, descriptions), abs=0.05)
    assert half.embedder.embed(descriptions).dtype == torch.float32


def test_a_thinking_describer_is_refused_before_its_weights_load(tiny_models, tmp_path):
    import shutil

    from gors.testing.qwen3_vl import CHAT_TEMPLATE
    from rewards.tit_score import TITScoreReward

    thinking = tmp_path / "Qwen3-VL-8B-Thinking"
    shutil.copytree(tiny_models["vlm"], thinking)
    prompt = "'<|im_start|>assistant\\n'"
    assert prompt in CHAT_TEMPLATE
    (thinking / "chat_template.jinja").write_text(CHAT_TEMPLATE.replace(prompt, "'<|im_start|>assistant\\n<think>\\n'"))
    (thinking / "model.safetensors").unlink()  # never read: the processor alone is refused
    with pytest.raises(ValueError, match=r"Qwen3-VL-8B-Thinking' is a thinking.*TIT-Score.*Qwen3-VL-8B-Instruct\."):
        TITScoreReward(str(thinking), device="cpu", embedding_model_name_or_path=str(tiny_models["embedding"]))


@pytest.fixture(scope="module")
def judge(tiny_models, one_torch_thread):
    """TIT-Score-LLM with the tiny chat LLM; `embedding_dtype` (the embedder's) must not reach the judge."""
    from rewards.tit_score import TITScoreReward

    return TITScoreReward(str(tiny_models["vlm"]), device="cpu", batch_size=3, max_new_tokens=4, judge="llm",
                          judge_model_name_or_path=str(tiny_models["chat"]), embedding_dtype="bfloat16")


def test_llm_judge_option(judge):
    assert judge.embedder is None
    assert judge.llm.model.dtype == judge.describer.vlm.model.dtype == torch.float32  # the reward's dtype
    with pytest.raises(RuntimeError, match="need the embedding judge"):
        judge.similarities(PROMPTS, PROMPTS)
    output = judge.score(_images(3), PROMPTS)
    for score, details in zip(output.scores, output.details):
        rating = parse_judge_rating(details["judge_reply"])
        assert details["parsed"] == (rating is not None)
        assert score == (0.0 if rating is None else rating / 100)
        assert 0.0 <= score <= 1.0


def test_bad_options_are_clear_errors():
    from rewards.tit_score import TITScoreReward

    with pytest.raises(ValueError, match="judge='clip'; choose 'embedding' or 'llm'"):
        TITScoreReward("unused", device="cpu", judge="clip")
    with pytest.raises(ValueError, match="mapping='tanh'; choose 'clip' or 'affine'"):
        TITScoreReward("unused", device="cpu", mapping="tanh")
    with pytest.raises(ValueError, match="embedding_dtype='fp16' is not a dtype.*'float32', 'bfloat16', 'float16'"):
        TITScoreReward("unused", device="cpu", embedding_dtype="fp16")
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        TITScoreReward("unused", device="cpu", max_length=0)


def test_llm_judge_replies_equal_greedy_generate_per_pair(judge):
    """Pairs of different lengths share one left-padded batch; each reply is that of the pair alone."""
    llm = judge.llm
    descriptions = ["a white dog", "yellow cars in the sky at night and a red house", "the sun"]
    expected = []
    for prompt, description in zip(PROMPTS, descriptions):
        text = llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": JUDGE_TEMPLATE.format(prompt=prompt, description=description)}],
            tokenize=False, add_generation_prompt=True)
        ids = llm.tokenizer([text], add_special_tokens=False, return_tensors="pt").input_ids
        with torch.no_grad():
            output = llm.model.generate(ids, max_new_tokens=llm.max_new_tokens, do_sample=False)
        expected.append(llm.tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True).strip())
    assert llm.replies(PROMPTS, descriptions) == expected


def test_llm_judge_reads_the_prompt_and_description_without_thinking(judge, monkeypatch):
    """Qwen3's template writes an empty thinking block for ``enable_thinking=False``; the judge's text gets no
    special token of the tokenizer's own (the chat template writes them all)."""
    from tokenizers import processors

    tokenizer = judge.llm.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", tokenizer.chat_template + (
        "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking %}"
        "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"))
    bos = "<|endoftext|>"  # as a tokenizer that adds a BOS token
    monkeypatch.setattr(tokenizer.backend_tokenizer, "post_processor", processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.convert_tokens_to_ids(bos))]))
    calls = _generate_calls(monkeypatch, judge.llm.model)
    judge.llm.replies(["a red cat"], ["a dog"])
    (text,) = tokenizer.batch_decode(calls[0]["input_ids"])
    assert text.startswith("<|im_start|>user\n")
    assert text.endswith("Prompt:\na red cat\n\nImage description:\na dog<|im_end|>\n"
                         "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_llm_judge_reply_is_its_new_tokens_decoded_and_stripped(judge, monkeypatch):
    _generating(monkeypatch, judge.llm.model, judge.llm.tokenizer, " 85 \n<|im_end|>")
    assert judge.llm.replies(PROMPTS[:2], ["a white dog", "yellow cars in the sky at night"]) == ["85", "85"]


def test_llm_judge_rating_0_is_parsed(judge, monkeypatch):
    monkeypatch.setattr(judge.llm, "replies", lambda prompts, descriptions: ["0", "no idea"])
    rows = judge._compare(PROMPTS[:2], ["a", "b"])
    assert [(row["parsed"], row["judge_rating"], row["score"]) for row in rows] == [(True, 0.0, 0.0),
                                                                                   (False, None, 0.0)]


def _chat_copy(tiny_models, tmp_path, edit) -> Path:
    """A copy of the tiny chat LLM's folder with `edit(folder)` applied."""
    import shutil

    folder = tmp_path / "chat"
    shutil.copytree(tiny_models["chat"], folder)
    edit(folder)
    return folder


def test_llm_judge_without_chat_template_is_refused(tiny_models, tmp_path):
    from rewards.tit_score import LLMJudge

    folder = _chat_copy(tiny_models, tmp_path, lambda folder: (folder / "chat_template.jinja").unlink())
    with pytest.raises(ValueError, match="has no chat template; pass a chat"):
        LLMJudge(str(folder), torch.device("cpu"), torch.float32)


def test_llm_judge_without_pad_token_pads_with_its_end_token(tiny_models, tmp_path):
    from rewards.tit_score import LLMJudge

    def drop_pad_token(folder: Path) -> None:
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": None}))

    llm = LLMJudge(str(_chat_copy(tiny_models, tmp_path, drop_pad_token)), torch.device("cpu"), torch.float32)
    assert llm.tokenizer.pad_token == llm.tokenizer.eos_token == "<|im_end|>"
    assert len(llm.replies(PROMPTS[:2], ["a white dog", "yellow cars in the sky at night"])) == 2


# ---------------------------------------------------------------------------------------------
def test_each_tit_score_is_rounded_to_4_decimals_as_the_reference(reward):
    descriptions = ["a white dog", "yellow cars in the sky at night", "the sun"]
    raw = reward.similarities(PROMPTS, descriptions)
    compared = reward._compare(PROMPTS, descriptions)
    assert [row["cosine"] for row in compared] == [round(value, 4) for value in raw]
    assert [row["score"] for row in compared] == [max(round(value, 4), 0.0) for value in raw]


def test_affine_mapping_reaches_each_score(reward, monkeypatch):
    monkeypatch.setattr(reward, "mapping", "affine")
    compared = reward._compare(PROMPTS, ["a white dog", "yellow cars in the sky at night", "the sun"])
    assert [row["mapping"] for row in compared] == ["affine"] * 3
    assert [row["score"] for row in compared] == [cosine_to_score(row["cosine"], "affine") for row in compared]


def test_query_instruction_prefixes_the_prompts_only(reward, monkeypatch):
    descriptions = ["a white dog", "yellow cars in the sky at night", "the sun"]
    monkeypatch.setattr(reward, "query_instruction", "Find the image description")
    prompts = [query_text(p, "Find the image description") for p in PROMPTS]
    expected = cosine_similarities(reward.embedder.embed(prompts), reward.embedder.embed(descriptions)).tolist()
    assert reward.similarities(PROMPTS, descriptions) == pytest.approx(expected, abs=1e-5)


# LPG-Bench.


def _lpg_row(details: dict) -> dict:
    return {"prompt_index": 0, "score": 0.5, "details": {"description_words": 3, **details}}


def test_lpg_summary_names_the_judge_that_scored_the_rows():
    bench = LPGBenchBenchmark()  # metric "tit_score", while --scorer_options chose the LLM judge
    llm = bench.summarize([_lpg_row({"judge_reply": "no idea", "parsed": False, "judge_rating": None})])
    assert llm["metric"] == "tit_score_llm" and llm["judge_replies_without_rating"] == 1
    embedding = bench.summarize([_lpg_row({"cosine": 0.5, "mapping": "clip"})])
    assert embedding["metric"] == "tit_score" and "judge_replies_without_rating" not in embedding
    assert "comparable with the paper's only with its describer" in bench.declared_metric("tit_score_cosine").help


def test_lpg_summary_records_how_tit_score_maps_the_cosine():
    bench = LPGBenchBenchmark()
    assert bench.provenance([_lpg_row({"cosine": 0.5, "mapping": "clip"})]) == {"score_mapping": "clip"}
    assert bench.provenance([_lpg_row({"cosine": 0.5, "mapping": "affine"})]) == {"score_mapping": "affine"}
    assert bench.provenance([_lpg_row({"judge_reply": "80", "parsed": True, "judge_rating": 80})]) == {}  # LLM judge


def test_lpg_summary_means_over_the_images():
    """tit_score and mean_description_words are means over every image, tit_score_cosine over the images the
    embedding judge scored."""
    rows = [{"prompt_index": p, "score": score, "details": {"cosine": cosine, "mapping": "clip", "description_words": w}}
            for p, (score, cosine, w) in enumerate([(0.2, 0.2, 10), (0.6, 0.6, 20), (0.7, 0.7, 60)])]
    summary = LPGBenchBenchmark().summarize(rows)
    assert summary["tit_score"] == pytest.approx(0.5) and summary["tit_score_cosine"] == pytest.approx(0.5)
    assert summary["mean_description_words"] == pytest.approx(30.0)
    assert (summary["num_images"], summary["num_prompts"], summary["images_per_prompt"]) == (3, 3, 1)


def test_lpg_metric_picks_the_judge_and_an_unknown_one_is_refused():
    """metric="tit_score_llm" asks the scorer for its LLM judge, "tit_score" for the embedding cosine; any
    other metric is refused when the benchmark is made, before any image."""
    assert LPGBenchBenchmark().scorer_options() == {"judge": "embedding"}
    assert LPGBenchBenchmark(metric="tit_score_llm", judge_model_name_or_path="my/judge").scorer_options() == {
        "judge": "llm", "judge_model_name_or_path": "my/judge"}
    with pytest.raises(ValueError, match="metric must be 'tit_score' or 'tit_score_llm', got 'clip'"):
        LPGBenchBenchmark(metric="clip")


def test_lpg_prompts_skip_blank_ones_and_keep_scalar_columns_as_metadata(tmp_path):
    """A prompt of whitespace only is skipped (the reference embeds no empty prompt); columns of scalars travel
    as metadata, a list column does not; a data file of another kind is refused by name."""
    path = tmp_path / "prompts.jsonl"
    rows = [{"id": "p0", "prompt": "a long prompt about a cat", "tags": ["cat", "house"]},
            {"id": "p1", "prompt": "   ", "tags": []}, {"id": "p2", "prompt": "a long prompt about a dog", "tags": []}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    prompts = LPGBenchBenchmark(dataset=str(path)).prompts()
    assert [p.text for p in prompts] == ["a long prompt about a cat", "a long prompt about a dog"]
    assert [dict(p.metadata) for p in prompts] == [{"id": "p0"}, {"id": "p2"}]
    xml = tmp_path / "prompts.xml"
    xml.write_text("<prompts/>")
    with pytest.raises(ValueError, match=r"dataset=.*prompts.xml'?: use a .json, .jsonl, .csv, .parquet, .txt file"):
        LPGBenchBenchmark(dataset=str(xml)).prompts()


@pytest.fixture(scope="module")
def lpg_folder(tmp_path_factory) -> Path:
    """A local copy of an LPG-Bench-like dataset: one jsonl of {id, prompt} rows."""
    folder = tmp_path_factory.mktemp("lpg_bench")
    rows = [{"id": f"p{i}", "prompt": f"{prompt}. " * 3} for i, prompt in enumerate(PROMPTS + ["a green tree"])]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_lpg_prompts_from_folder_file_and_columns(lpg_folder, tmp_path):
    prompts = LPGBenchBenchmark(dataset=str(lpg_folder)).prompts()
    assert [p.metadata["id"] for p in prompts] == ["p0", "p1", "p2", "p3"]
    # As given, trailing space included: the reference embeds the prompt unstripped.
    assert prompts[0].text == "a red cat on the house. a red cat on the house. a red cat on the house. "
    assert [p.metadata["id"] for p in LPGBenchBenchmark(dataset=str(lpg_folder), max_prompts=2).prompts()] == ["p0", "p2"]
    csv = tmp_path / "prompts.csv"
    csv.write_text("Prompt,theme\nA long prompt about a cat,cats\n")
    assert [p.text for p in LPGBenchBenchmark(dataset=str(csv)).prompts()] == ["A long prompt about a cat"]
    assert prompt_column_of(["id", "text"]) == "text"
    with pytest.raises(ValueError, match="no prompt column among \\['id', 'body'\\]"):
        prompt_column_of(["id", "body"])
    with pytest.raises(ValueError, match="prompt_column='body' is not a column"):
        LPGBenchBenchmark(dataset=str(csv), prompt_column="body").prompts()
    # Offline and not cached: the one-line error of the `gors` command (an expected error), naming the fix.
    with pytest.raises(DownloadError, match=r"(?s)LPG-Bench prompts could not be loaded from 'nobody/no-such-dataset' .*"
                                            r"hf download --repo-type dataset"):
        LPGBenchBenchmark(dataset="nobody/no-such-dataset").prompts()


def test_lpg_bench_end_to_end(tmp_path, tiny_sd, tiny_models, lpg_folder, one_torch_thread):
    bench = LPGBenchBenchmark(
        dataset=str(lpg_folder), max_prompts=2, vlm_model_name_or_path=str(tiny_models["vlm"]),
        embedding_model_name_or_path=str(tiny_models["embedding"]), num_inference_steps=2, resolution=32,
    )
    summary = bench.evaluate(str(tiny_sd), tmp_path / "run", scorer_options={"max_new_tokens": 5},
                             scorer_batch_size=2)
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 == summary["num_images"] == summary["num_prompts"]  # 2 of 4 prompts
    assert all(0.0 <= row["score"] <= 1.0 for row in rows)
    assert summary["tit_score"] == pytest.approx(sum(row["score"] for row in rows) / 2)
    assert summary["tit_score_cosine"] == pytest.approx(sum(row["details"]["cosine"] for row in rows) / 2)
    assert summary["metric"] == "tit_score" and summary["images_per_prompt"] == 1
    results = summary["results"]
    assert results["data"]["dataset"] == str(lpg_folder) and results["data"]["revision"] is None
    assert set(results["metrics"]) == {"tit_score", "tit_score_cosine"}
    assert results["metrics"]["tit_score_cosine"]["scale"] == "[-1, 1] (cosine)"
    assert all("description" in row["details"] for row in rows)
