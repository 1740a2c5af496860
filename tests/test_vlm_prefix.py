"""`ChatVLM`'s shared-prefix path on a tiny random Qwen3-VL: one prefix pass per image, the
questions as one packed prefix tree of continuations on its cache, the LM head across images,
the same numbers as the plain procedures."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gors.testing.qwen3_vl import CHAT_TEMPLATE, build_tiny_qwen3_vl
from rewards.atoms import QUESTION_SUFFIX, aggregate, answer_variants, variant_probability, variant_token_ids
from rewards.soft_tifa import SoftTIFAReward
from rewards.vlm import ChatVLM, QuestionTree, branch_cache, generation_prompt, image_outputs, load_chat_vlm

# Relative tolerance on every probability of the vocabulary (float32 round-off of differently
# shaped matrix products is about 1e-6 here).
RTOL = 1e-4
# Image shapes (height, width) in pixels: 4, 12, 16 and 4 image tokens (a 2 x 8 merged grid).
SHAPES = [(16, 16), (24, 32), (32, 32), (8, 32)]
# (image index, question): 1, 2, 4 and 3 questions of different lengths, images interleaved.
QUESTIONS = [
    (1, "How many cows are in the image? Answer in one word."),
    (0, "Is it red? Answer in one word."),
    (2, "Are the bicycles in front of the cows? Answer in one word."),
    (1, "Is it?"),
    (2, "a"),
    (3, "Are there any dogs in the image? Answer in one word."),
    (2, "How many cars are in the image? Answer in one word."),
    (3, "Yes"),
    (2, "Is the bench green?"),
    (3, "Does this show a white cat on the left of a black dog? Answer with Yes or No."),
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


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny_qwen3_vl"), seed=0)


@pytest.fixture(scope="module")
def vlm(model_dir: Path) -> ChatVLM:
    return load_chat_vlm(str(model_dir), torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def plain(model_dir: Path):
    """The model and processor as GenEval 2 loads them, for reference forwards."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return (
        AutoModelForImageTextToText.from_pretrained(model_dir).eval(),
        AutoProcessor.from_pretrained(model_dir),
    )


def images(seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (*shape, 3), dtype=np.uint8)) for shape in SHAPES]


def chat_inputs(plain, image: Image.Image, question: str) -> dict:
    model, processor = plain
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": question}]}
    ]
    return processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )


@torch.no_grad()
def forward_probabilities(plain, image: Image.Image, question: str) -> torch.Tensor:
    """A plain full forward of the question alone: softmax of the last position's logits."""
    return plain[0](**chat_inputs(plain, image, question)).logits[0, -1].float().softmax(-1)


@torch.no_grad()
def generate_probabilities(plain, image: Image.Image, question: str) -> torch.Tensor:
    """GenEval 2's procedure: greedy ``generate`` of one token, softmax of its scores."""
    output = plain[0].generate(
        **chat_inputs(plain, image, question), max_new_tokens=1, do_sample=False,
        output_scores=True, return_dict_in_generate=True,
    )
    return output.scores[0][0].float().softmax(-1)


@torch.no_grad()
def full_sequence_probabilities(vlm: ChatVLM, encoded, questions) -> list[torch.Tensor]:
    """gors' previous procedure: every question's whole prompt, image tokens included, through
    the language model in one right-padded batch, the vision features passed in (no cache)."""
    ids = [vlm.question_ids(question, encoded[i]) for i, question in questions]
    lengths = torch.tensor([len(x) for x in ids])
    width = int(lengths.max())
    input_ids = torch.tensor([x + [vlm.tokenizer.pad_token_id] * (width - len(x)) for x in ids])
    attention_mask = (torch.arange(width) < lengths[:, None]).long()
    rows = [encoded[i] for i, _ in questions]
    hidden = vlm.model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        image_grid_thw=torch.stack([row.grid_thw for row in rows]),
        mm_token_type_ids=torch.tensor(vlm.processor.create_mm_token_type_ids(input_ids.tolist())) * attention_mask,
        mm_encoder_outputs={"image": image_outputs(rows)},
        use_cache=False,
    ).last_hidden_state
    logits = vlm.model.get_output_embeddings()(hidden[torch.arange(len(ids)), lengths - 1])
    return list(logits.float().softmax(-1))


def relative_difference(got: torch.Tensor, reference: torch.Tensor) -> float:
    return float(((got - reference).abs() / reference).max())


def test_shared_prefix_ends_after_the_image(vlm: ChatVLM) -> None:
    """The split: the longest common token prefix of two rendered questions, at an added token."""
    tokens = vlm.tokenizer.convert_ids_to_tokens(
        vlm.tokenizer(vlm.chat_text("Is it red?"), add_special_tokens=False).input_ids
    )
    assert tokens[: vlm.prefix_tokens] == [
        "<|im_start|>", "user", "Ċ", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>"
    ]
    encoded = vlm.encode_images(images())
    for image in encoded:
        length = vlm.prefix_tokens + vlm.image_tokens(image) - 1
        first, second = (vlm.question_ids(q, image) for q, _ in VQA_LIST[:2])
        common = next(i for i, (a, b) in enumerate(zip(first, second)) if a != b)
        # Both questions start with "How"/"Are": the prefix still ends at <|vision_end|>.
        assert common == length
        assert vlm.tokenizer.convert_ids_to_tokens(first[length - 1]) == "<|vision_end|>"
        assert first[length - 1 - vlm.image_tokens(image) : length - 1] == [
            vlm.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        ] * vlm.image_tokens(image)


def test_prefix_path_equals_full_forward_and_generate(vlm: ChatVLM, plain) -> None:
    pictures = images(seed=1)
    encoded = vlm.encode_images(pictures)
    assert sorted({vlm.image_tokens(image) for image in encoded}) == [4, 12, 16]
    got = list(vlm.next_token_probabilities(encoded, QUESTIONS, batch_size=3))
    # Grouped by image (in order of first appearance), questions in order within an image.
    order = sorted(range(len(QUESTIONS)), key=lambda k: ([1, 0, 2, 3].index(QUESTIONS[k][0]), k))
    assert [k for k, _ in got] == order
    for k, probs in got:
        index, question = QUESTIONS[k]
        assert probs.dtype == torch.float32 and probs.sum().item() == pytest.approx(1.0, abs=1e-5)
        assert relative_difference(probs, forward_probabilities(plain, pictures[index], question)) <= RTOL
        assert relative_difference(probs, generate_probabilities(plain, pictures[index], question)) <= RTOL
        # The official procedure itself, for scores that must equal it in bfloat16 too (`generate_probabilities`
        # makes GenEval 2's evaluation.py call: max_new_tokens=1, do_sample=False, the softmax of scores[0]).
        assert torch.equal(vlm.generated_probabilities(pictures[index], question),
                           generate_probabilities(plain, pictures[index], question))


def test_question_tree_shares_leading_tokens() -> None:
    tails = [[1, 2, 3], [1, 2, 4], [1, 5], [1, 2], [6], [1, 2, 3]]
    tree = QuestionTree.from_tails(tails)
    assert tree.tokens == [1, 2, 3, 4, 5, 6]
    assert tree.parents == [-1, 0, 1, 1, 0, -1]
    # A repeated sequence ends where the first did; [1, 2] ends inside [1, 2, 3]'s path.
    assert tree.ends == [2, 3, 4, 1, 5, 2]
    assert tree.depths() == [0, 1, 2, 2, 1, 0]
    ancestry = tree.ancestry().int().tolist()
    assert ancestry == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],  # token 4 does not see its sibling 3
        [1, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],  # a new sequence sees nothing of the others
    ]
    with pytest.raises(ValueError, match="at least one token"):
        QuestionTree.from_tails([[1], []])


def continuation(vlm: ChatVLM, prefix, tails) -> torch.Tensor:
    return vlm.answer_probabilities(vlm.continuation_hidden(prefix, tails))


def test_shared_repeated_and_nested_questions_match_the_full_forward(vlm: ChatVLM, plain) -> None:
    """Questions that share leading tokens, repeat, or are the start of another, in one pass."""
    picture = images(seed=6)[1]
    image = vlm.encode_images([picture])[0]
    questions = ["Is it red?", "Is it red? Answer in one word.", "Is it blue?", "Is it red?", "How many?"]
    length = vlm.prefix_tokens + vlm.image_tokens(image) - 1
    ids = [vlm.question_ids(q, image) for q in questions]
    prefix = vlm.run_prefix(image, ids[0][:length])
    tails = [x[length:] for x in ids]
    tree = QuestionTree.from_tails(tails)
    assert len(tree.tokens) < sum(len(t) for t in tails) - len(tails[3])  # shared nodes, not just the repeat
    got = continuation(vlm, prefix, tails)
    for question, probs in zip(questions, got, strict=True):
        assert relative_difference(probs, forward_probabilities(plain, picture, question)) <= RTOL


def test_continuation_positions_matter(vlm: ChatVLM, plain) -> None:
    """A negative control: the continuation's M-RoPE start shifted by one changes the answer."""
    picture = images(seed=2)[2]
    image = vlm.encode_images([picture])[0]
    question = "How many cows are in the image? Answer in one word."
    ids = vlm.question_ids(question, image)
    length = vlm.prefix_tokens + vlm.image_tokens(image) - 1
    prefix = vlm.run_prefix(image, ids[:length])
    right = continuation(vlm, prefix, [ids[length:]])[0]
    reference = forward_probabilities(plain, picture, question)
    assert relative_difference(right, reference) <= RTOL
    # 4 text tokens, the 16 image tokens (a 4 x 4 merged grid: 4 positions), <|vision_end|>.
    assert prefix.next_position == 4 + 4 + 1
    prefix.next_position += 1
    assert relative_difference(continuation(vlm, prefix, [ids[length:]])[0], reference) > 1e-3


def test_continuation_mask_matters(vlm: ChatVLM, plain) -> None:
    """A negative control: were sibling questions visible to each other, answers would change."""
    picture = images(seed=2)[0]
    image = vlm.encode_images([picture])[0]
    questions = ["Is it red? Answer in one word.", "How many cows are in the image? Answer in one word."]
    ids = [vlm.question_ids(q, image) for q in questions]
    length = vlm.prefix_tokens + vlm.image_tokens(image) - 1
    prefix = vlm.run_prefix(image, ids[0][:length])
    tails = [x[length:] for x in ids]
    reference = forward_probabilities(plain, picture, questions[1])
    assert relative_difference(continuation(vlm, prefix, tails)[1], reference) <= RTOL
    # The second question read as a continuation of the first (what a plain causal mask over the
    # packed row would do).
    joined = continuation(vlm, prefix, [tails[0] + tails[1]])[0]
    assert relative_difference(joined, reference) > 1e-3


def test_prefix_runs_once_per_image_and_the_head_once(vlm: ChatVLM) -> None:
    """Language-model passes: one over each image's prefix (empty cache), then one packed row per
    batch of questions; the LM head once for all images' questions."""
    encoded = vlm.encode_images(images(seed=3))
    calls: list[tuple[int, int, int]] = []  # (batch, new tokens, cached tokens) of each pass
    head_rows: list[int] = []

    def record(module, args, kwargs) -> None:
        cache = kwargs["cache"]
        calls.append((*kwargs["inputs_embeds"].shape[:2], cache.get_seq_length()))

    hooks = [
        vlm.model.base_model.language_model.register_forward_pre_hook(record, with_kwargs=True),
        vlm.model.get_output_embeddings().register_forward_pre_hook(lambda m, a: head_rows.append(a[0].shape[0])),
    ]
    try:
        list(vlm.next_token_probabilities(encoded, QUESTIONS, batch_size=3))
    finally:
        for hook in hooks:
            hook.remove()
    prefix = {i: vlm.prefix_tokens + vlm.image_tokens(image) - 1 for i, image in enumerate(encoded)}
    # Images in order of first appearance (1, 0, 2, 3) with 2, 1, 4 and 3 questions: a prefix pass
    # (nothing cached), then rows of at most 3 questions on its cache; everything batch 1.
    assert [(batch, cached) for batch, _, cached in calls] == [
        (1, 0), (1, prefix[1]),
        (1, 0), (1, prefix[0]),
        (1, 0), (1, prefix[2]), (1, prefix[2]),
        (1, 0), (1, prefix[3]),
    ]
    assert [tokens for _, tokens, cached in calls if cached == 0] == [prefix[i] for i in (1, 0, 2, 3)]
    # Each continuation row holds the distinct tokens of its questions' tails.
    by_image = {i: [q for j, q in QUESTIONS if j == i] for i in (1, 0, 2, 3)}
    expected = []
    for i, asked in by_image.items():
        tails = [vlm.question_ids(q, encoded[i])[prefix[i]:] for q in asked]
        expected += [len(QuestionTree.from_tails(tails[s : s + 3]).tokens) for s in range(0, len(tails), 3)]
    assert [tokens for _, tokens, cached in calls if cached] == expected
    assert head_rows == [len(QUESTIONS)]


def test_eager_attention_gives_the_same_answers_and_flash_attention_is_refused(model_dir: Path, plain) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    eager = ChatVLM(AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="eager"), processor)
    pictures = images(seed=7)
    got = dict(eager.next_token_probabilities(eager.encode_images(pictures), QUESTIONS[:4], batch_size=3))
    for k, (index, question) in enumerate(QUESTIONS[:4]):
        assert relative_difference(got[k], forward_probabilities(plain, pictures[index], question)) <= RTOL
    flash = AutoModelForImageTextToText.from_pretrained(model_dir)
    flash.config.get_text_config()._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'.*load it with attn_implementation='sdpa'"):
        ChatVLM(flash, processor, "tiny")


def test_branch_cache_shares_and_the_prefix_stays(vlm: ChatVLM) -> None:
    image = vlm.encode_images(images(seed=4)[:1])[0]
    ids = vlm.question_ids("Is it red?", image)
    length = vlm.prefix_tokens + vlm.image_tokens(image) - 1
    prefix = vlm.run_prefix(image, ids[:length])
    keys = prefix.cache.layers[0].keys
    branch = branch_cache(prefix.cache, vlm.model.config)
    for layer, source in zip(branch.layers, prefix.cache.layers, strict=True):
        assert layer.keys is source.keys and layer.values is source.values  # shared, not copied
    # Two passes continue the same prefix: its cache is not extended by either.
    first = continuation(vlm, prefix, [ids[length:], ids[length:-2]])
    second = continuation(vlm, prefix, [ids[length:]])
    assert prefix.cache.get_seq_length() == length and prefix.cache.layers[0].keys is keys
    torch.testing.assert_close(first[0], second[0], rtol=RTOL, atol=0)


def test_soft_tifa_scores_unchanged(vlm: ChatVLM, model_dir: Path) -> None:
    """Soft-TIFA through the reward equals its scores from gors' previous full-sequence path."""
    reward = SoftTIFAReward(model_name_or_path=str(model_dir), device="cpu", batch_size=3)
    assert reward.vlm is vlm
    pictures = images(seed=5)
    prompts = ["four white bicycles in front of three plastic cows"] * 2 + ["a green bench and a red car"] * 2
    metadata = [{"vqa_list": VQA_LIST}, {"vqa_list": VQA_LIST[:4]}, {}, {}]
    output = reward.score(pictures, prompts, metadata)
    encoded = vlm.encode_images(pictures)
    for index, details in enumerate(output.details):
        questions = [(index, q + QUESTION_SUFFIX) for q in details["questions"]]
        reference = full_sequence_probabilities(vlm, encoded, questions)
        atom_scores = []
        for question, answer, probs in zip(details["questions"], details["expected_answers"], reference):
            encoded_variants = [
                vlm.tokenizer(v, add_special_tokens=False).input_ids for v in answer_variants(question, answer)
            ]
            atom_scores.append(variant_probability(probs, variant_token_ids(encoded_variants, "first")))
        np.testing.assert_allclose(details["atom_scores"], atom_scores, rtol=RTOL, atol=0)
        assert details["predicted"] == [vlm.tokenizer.decode([int(p.argmax())]) for p in reference]
        assert output.scores[index] == pytest.approx(aggregate(atom_scores, "gm"), rel=RTOL)


def thinking_template(block: str) -> str:
    """The tiny model's chat template with `block` after the generation prompt, as a thinking variant writes it."""
    prompt = "'<|im_start|>assistant\\n'"
    assert prompt in CHAT_TEMPLATE
    return CHAT_TEMPLATE.replace(prompt, prompt[:-1] + block + "'")


def test_a_thinking_checkpoint_is_refused_before_its_weights_load(model_dir: Path, tmp_path: Path) -> None:
    """Qwen3-VL-*-Thinking's template ends the generation prompt with an open <think> block."""
    thinking = tmp_path / "Qwen3-VL-2B-Thinking"
    shutil.copytree(model_dir, thinking)
    (thinking / "chat_template.jinja").write_text(thinking_template("<think>\\n"))
    (thinking / "model.safetensors").unlink()  # never read: the processor alone is refused
    with pytest.raises(ValueError, match=r"Qwen3-VL-2B-Thinking' is a thinking.*'<\|im_start\|>assistant\\n<think>\\n'"
                       r".*Give the Instruct variant instead, e.g. .*Qwen3-VL-2B-Instruct\."):
        ChatVLM.from_pretrained(str(thinking), torch.device("cpu"), torch.float32)


def test_a_model_built_in_code_with_a_thinking_template_is_refused(model_dir: Path, plain) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    assert generation_prompt(processor) == "<|im_start|>assistant\n"
    processor.chat_template = thinking_template("<think>\\n")
    assert generation_prompt(processor) == "<|im_start|>assistant\n<think>\n"
    with pytest.raises(ValueError, match="is a thinking.*e.g. Qwen/Qwen3-VL-8B-Instruct"):
        ChatVLM(plain[0], processor, "tiny")
    # An empty, closed block (thinking switched off) is answered right after: it is taken.
    processor.chat_template = thinking_template("<think>\\n\\n</think>\\n\\n")
    assert ChatVLM(plain[0], processor, "tiny").chat_text("Is it red?").endswith("</think>\n\n")


def test_the_lm_head_flushes_every_head_rows_questions_with_the_same_answers(vlm: ChatVLM, monkeypatch) -> None:
    import rewards.vlm

    encoded = vlm.encode_images(images(seed=3))
    whole = dict(vlm.next_token_probabilities(encoded, QUESTIONS, batch_size=3))
    head_rows: list[int] = []
    hook = vlm.model.get_output_embeddings().register_forward_pre_hook(lambda m, a: head_rows.append(a[0].shape[0]))
    monkeypatch.setattr(rewards.vlm, "HEAD_ROWS", 3)
    try:
        flushed = list(vlm.next_token_probabilities(encoded, QUESTIONS, batch_size=3))
    finally:
        hook.remove()
    # Flushed as soon as 3 rows are pending, checked after each batch of up to 3 questions: images 1 and 0
    # (2 + 1 questions), image 2's first batch (3), its last question with image 3's batch (1 + 3).
    assert head_rows == [3, 3, 4]
    assert sorted(k for k, _ in flushed) == list(range(len(QUESTIONS)))
    for k, probabilities in flushed:
        assert torch.allclose(probabilities, whole[k], atol=1e-6), k


def test_a_model_built_in_code_is_put_in_eval_mode_with_gradients_off(model_dir: Path) -> None:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(model_dir).train()
    vlm = ChatVLM(model, AutoProcessor.from_pretrained(model_dir), "tiny")
    assert not any(module.training for module in vlm.model.modules())
    assert not any(parameter.requires_grad for parameter in vlm.model.parameters())


def test_no_images_encode_to_nothing(vlm: ChatVLM) -> None:
    assert vlm.encode_images([]) == []


def test_a_prompt_without_exactly_one_image_placeholder_is_refused(vlm: ChatVLM, monkeypatch) -> None:
    """`question_ids` expands one placeholder; a rendering with none (or two) is an error, not a prompt without
    the image."""
    image = vlm.encode_images(images()[:1])[0]
    for count in (0, 2):
        monkeypatch.setattr(vlm, "chat_text", lambda question, count=count: vlm.image_token * count + question)
        with pytest.raises(ValueError, match=f"wrote {count} image placeholders"):
            vlm.question_ids("Is it red?", image)


def test_image_outputs_pass_each_images_own_deepstack_layers_in_order() -> None:
    """`image_outputs` hands the model row i's embeddings and its deepstack layer j as layer j (the tiny
    model cannot show it: its last deepstack layer is added after its last decoder layer)."""
    from rewards.vlm import EncodedImage

    rows = [
        EncodedImage(torch.tensor([1, 2, 2]), torch.full((1, 4), float(i)),
                     [torch.full((1, 4), 10.0 * i + j) for j in range(3)], 1)
        for i in range(2)
    ]
    output = image_outputs(rows)
    assert all(row.embeds is embeds for row, embeds in zip(rows, output.pooler_output, strict=True))
    assert len(output.deepstack_features) == 3
    for j, layer in enumerate(output.deepstack_features):
        assert [float(x[0, 0]) for x in layer] == [10.0 * i + j for i in range(2)]


def test_a_prompt_that_does_not_continue_the_shared_prefix_is_refused() -> None:
    """`_tail` refuses a question prompt that differs from the image's prefix or ends with it."""
    from rewards.vlm import PrefixState

    prefix = PrefixState([1, 2, 3], cache=None, next_position=3)
    assert ChatVLM._tail([1, 2, 3, 7, 8], prefix) == [7, 8]
    for ids in ([1, 2, 4, 7, 8], [1, 2, 3]):
        with pytest.raises(ValueError, match="does not continue the image's shared prefix"):
            ChatVLM._tail(ids, prefix)


def test_bfloat16_answers_are_float32_softmaxes(model_dir: Path) -> None:
    """In bfloat16 both procedures return a float32 softmax of the logits, not a bfloat16 one cast up."""
    vlm16 = load_chat_vlm(str(model_dir), torch.device("cpu"), torch.bfloat16)
    assert vlm16.model.dtype == torch.bfloat16
    picture = images(seed=8)[1]
    question = "Is it red? Answer in one word."
    one_pass = dict(vlm16.next_token_probabilities(vlm16.encode_images([picture]), [(0, question)], batch_size=1))[0]
    for probs in (one_pass, vlm16.generated_probabilities(picture, question)):
        assert probs.dtype == torch.float32
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
        # A bfloat16 softmax has only bfloat16 values; most float32 ones are not.
        assert int((probs != probs.bfloat16().float()).sum()) > probs.numel() // 2


def test_a_template_that_puts_the_image_after_the_question_is_refused(model_dir: Path, plain) -> None:
    """No shared prefix holds the image when the template writes the question first: `ChatVLM` refuses it."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    loop = "{%- for content in message['content'] %}"
    assert loop in CHAT_TEMPLATE
    processor.chat_template = CHAT_TEMPLATE.replace(loop, "{%- for content in message['content'] | reverse %}")
    from rewards.vlm import render_question

    render_text = render_question(processor, "Is it red?")
    assert render_text.index("Is it red?") < render_text.index("<|image_pad|>")
    with pytest.raises(ValueError, match="does not put the image before the question"):
        ChatVLM(plain[0], processor, "tiny")


def test_a_processor_without_chat_template_or_pad_token_is_refused(model_dir: Path, plain, tmp_path: Path) -> None:
    """A checkpoint without a chat template gets the "not a Qwen3-VL chat checkpoint" error (from the
    folder too, before the thinking check), and a tokenizer without a pad token its own error."""
    from transformers import AutoProcessor

    bare = tmp_path / "no_template"
    shutil.copytree(model_dir, bare)
    (bare / "chat_template.jinja").unlink()
    assert AutoProcessor.from_pretrained(bare).chat_template is None
    with pytest.raises(ValueError, match="is not a Qwen3-VL chat checkpoint"):
        ChatVLM.from_pretrained(str(bare), torch.device("cpu"), torch.float32)
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.chat_template = None
    with pytest.raises(ValueError, match="is not a Qwen3-VL chat checkpoint"):
        ChatVLM(plain[0], processor, "tiny")
    processor = AutoProcessor.from_pretrained(model_dir)
    processor.tokenizer.pad_token = None
    with pytest.raises(ValueError, match="'tiny': the tokenizer has no pad token"):
        ChatVLM(plain[0], processor, "tiny")


def test_a_think_block_reopened_after_a_closed_one_is_refused(model_dir: Path) -> None:
    """The last <think> of the generation prompt decides: one opened after a closed block is refused."""
    from transformers import AutoProcessor

    from rewards.vlm import check_answers_directly

    processor = AutoProcessor.from_pretrained(model_dir)
    processor.chat_template = thinking_template("<think>\\n\\n</think>\\n\\n<think>\\n")
    with pytest.raises(ValueError, match="is a thinking"):
        check_answers_directly(processor, "tiny")
    processor.chat_template = thinking_template("<think>\\n\\n</think>\\n\\n")
    check_answers_directly(processor, "tiny")
