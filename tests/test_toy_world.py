"""The toy world's prompts, split, scenes, tokenizer, pretraining corpus and benchmark maths."""

import numpy as np
import pytest

from evaluators.toy import ToyBenchmark
from gors.core.prompts import load_prompts
from gors.core.toy import PRETRAINED_DIR
from gors.core.toy.world import (
    COLOURS,
    HELD_OUT_COMBINATIONS,
    RELATIONS,
    SHAPES,
    SPLITS,
    VALIDATION_FOLDS,
    ToyPrompt,
    prompts_of_split,
    relation_holds,
    sample_scene,
    split_prompts,
    split_train_for_validation,
)
from gors.toy.model import MAX_TOKENS, toy_words, write_toy_tokenizer_files
from gors.toy.pretrain import noisy_caption, pretraining_corpus
from rewards.toy_rules import BINDING_ERRORS


def test_prompts_round_trip_and_bad_prompts_are_explained():
    train, held_out = split_prompts()
    for prompt in train + held_out:
        assert ToyPrompt.parse(prompt.text) == prompt
    with pytest.raises(ValueError, match="not a toy-world prompt"):
        ToyPrompt.parse("a red circle beside a blue square")
    with pytest.raises(ValueError, match="unknown object"):
        ToyPrompt.parse("a purple circle")


def test_held_out_combinations_never_appear_in_train_prompts():
    train, held_out = split_prompts()
    train_combinations = {(o.colour, o.shape) for p in train for o in p.objects}
    assert not train_combinations & HELD_OUT_COMBINATIONS
    assert all(any((o.colour, o.shape) in HELD_OUT_COMBINATIONS for o in p.objects) for p in held_out)
    # every colour and every shape is still seen in training, only not in these pairings
    assert {c for c, _ in train_combinations} == {c for c, _ in HELD_OUT_COMBINATIONS} | {"yellow"}
    assert {s for _, s in train_combinations} == {s for _, s in HELD_OUT_COMBINATIONS}
    assert len(train) == 210 and len(held_out) == 150


@pytest.mark.parametrize("fold", list(VALIDATION_FOLDS))
def test_each_fold_splits_the_train_prompts_as_train_and_held_out_split_all(fold):
    train, _ = split_prompts()
    fit, val = split_train_for_validation(fold)
    pair = VALIDATION_FOLDS[fold]
    assert sorted(p.text for p in fit + val) == sorted(p.text for p in train) and not set(fit) & set(val)
    fit_combinations = {(o.colour, o.shape) for p in fit for o in p.objects}
    assert not fit_combinations & ({pair} | HELD_OUT_COMBINATIONS)
    assert all(any((o.colour, o.shape) == pair for o in p.objects) for p in val)
    # every colour has two shapes in the fit prompts, as in the train prompts (but yellow's three)
    shapes_per_colour = {c: len({s for cc, s in fit_combinations if cc == c}) for c in COLOURS}
    assert shapes_per_colour == dict.fromkeys(COLOURS, 2) and {s for _, s in fit_combinations} == set(SHAPES)
    assert (len(fit), len(val)) == (170, 40)
    assert load_prompts(f"toy:val{fold}").prompts == [p.text for p in prompts_of_split(f"val{fold}")] == [
        p.text for p in val]
    assert ToyBenchmark(split=f"fit{fold}").prompts()[0].text == fit[0].text


def test_the_folds_hold_out_each_yellow_shape_once_and_bad_names_are_refused():
    assert sorted(VALIDATION_FOLDS.values()) == [("yellow", s) for s in SHAPES]
    assert [load_prompts(f"toy:{s}").name for s in SPLITS] == [f"toy:{s}" for s in SPLITS]
    with pytest.raises(ValueError, match="toy split 'dev'; choose one of train, held_out, fit, val, fit_square"):
        load_prompts("toy:dev")
    with pytest.raises(ValueError, match="toy split 'dev'; choose one of train, held_out, fit, val, fit_square"):
        ToyBenchmark(split="dev").prompts()
    with pytest.raises(ValueError, match="validation fold '_circle'"):
        split_train_for_validation("_circle")


@pytest.mark.parametrize("relation", RELATIONS)
def test_sampled_scenes_satisfy_their_relation(relation):
    rng = np.random.default_rng(0)
    prompt = ToyPrompt.parse(f"a red circle {relation} a blue square")
    for _ in range(50):
        a, b = sample_scene(prompt, rng)
        assert relation_holds(relation, (a.cx, a.cy), (b.cx, b.cy), margin=12)


def test_toy_tokenizer_spells_every_word_as_one_token(tmp_path):
    from transformers import CLIPTokenizer

    vocab, merges = write_toy_tokenizer_files(tmp_path)
    tokenizer = CLIPTokenizer(str(vocab), str(merges), model_max_length=MAX_TOKENS)
    for word in toy_words():
        assert len(tokenizer(word, add_special_tokens=False).input_ids) == 1, word
    longest = max((p.text for p in split_prompts()[0]), key=lambda t: len(tokenizer(t).input_ids))
    assert len(tokenizer(longest).input_ids) <= MAX_TOKENS
    for prompt in [*split_prompts()[0], *split_prompts()[1]]:  # "and" too, which no relation has
        assert len(tokenizer(prompt.text, add_special_tokens=False).input_ids) == len(prompt.text.split()), prompt


def test_a_built_toy_model_has_the_packaged_models_architecture_and_follows_its_seed(tmp_path):
    """`build_toy_components` is what `gors toy pretrain` starts from: its configs are the packaged model's
    (but for what pretraining sets, the prediction type and the VAE's scaling factor, and what saving writes),
    one seed gives one set of weights, another seed others."""
    import json

    import torch

    from gors.toy.model import build_toy_components

    built = build_toy_components(tmp_path / "a", seed=0)
    packaged = PRETRAINED_DIR / "pipeline"
    for name, config, set_by_pretraining in [
            ("unet", built["unet"].config, ()),
            ("vae", built["vae"].config, ("scaling_factor",)),
            ("scheduler", built["scheduler"].config, ("prediction_type",)),
            ("text_encoder", built["text_encoder"].config.to_dict(), ("architectures", "dtype", "transformers_version"))]:
        shipped = json.loads((packaged / name / ("config.json" if name != "scheduler" else "scheduler_config.json"))
                             .read_text())
        for key, value in shipped.items():
            if not key.startswith("_") and key not in set_by_pretraining:
                assert json.loads(json.dumps(config[key])) == value, (name, key)
    assert built["noise_scheduler"].config.beta_schedule == built["scheduler"].config.beta_schedule
    assert len(built["tokenizer"]) == json.loads((packaged / "text_encoder" / "config.json").read_text())["vocab_size"]
    again, other = build_toy_components(tmp_path / "b", seed=0), build_toy_components(tmp_path / "c", seed=1)
    for part in ("unet", "vae", "text_encoder"):
        weights = list(built[part].state_dict().values())
        assert all(torch.equal(w, v) for w, v in zip(weights, again[part].state_dict().values())), part
        assert not all(torch.equal(w, v) for w, v in zip(weights, other[part].state_dict().values())), part


def test_pretraining_corpus_has_every_composition_under_noisy_captions():
    rng = np.random.default_rng(0)
    images, captions = pretraining_corpus(800, swap_rate=0.3, relation_noise_rate=0.3, rng=rng)
    assert len(images) == len(captions) == 800 and images[0].shape == (64, 64, 3)
    parsed = [ToyPrompt.parse(caption) for caption in captions]
    # Like web data, pretraining has seen the held-out combinations inside compositions too.
    composed = {(o.colour, o.shape) for p in parsed if len(p.objects) == 2 for o in p.objects}
    assert HELD_OUT_COMBINATIONS <= composed
    from rewards.toy_rules import judge_image

    wrong = [not judge_image(caption, image).correct for image, caption in zip(images, captions)]
    two_object = [len(p.objects) == 2 for p in parsed]
    wrong_share = sum(w for w, t in zip(wrong, two_object) if t) / sum(two_object)
    # 30% swapped colours, and 30% of the 80% relation captions name another relation, which the
    # random layout sometimes satisfies anyway: between 0.3 and 1 - 0.7 * (1 - 0.8 * 0.3) = 0.47.
    assert 0.33 < wrong_share < 0.47
    assert not any(w for w, t in zip(wrong, two_object) if not t)  # single objects are always right


def test_pretraining_scenes_draw_held_out_compositions_and_a_fifth_single_objects():
    """With exact captions a caption is its scene's prompt: the held-out combinations are drawn inside
    compositions (not only named by swapped captions), and about 20% of the scenes are single objects."""
    _, captions = pretraining_corpus(400, swap_rate=0.0, relation_noise_rate=0.0, rng=np.random.default_rng(1))
    parsed = [ToyPrompt.parse(caption) for caption in captions]
    assert HELD_OUT_COMBINATIONS <= {(o.colour, o.shape) for p in parsed if len(p.objects) == 2 for o in p.objects}
    assert 0.14 < sum(len(p.objects) == 1 for p in parsed) / len(parsed) < 0.26


def test_noisy_caption_rates():
    rng = np.random.default_rng(1)
    prompt = ToyPrompt.parse("a red circle on the left of a blue square")
    captions = [noisy_caption(prompt, 0.3, 0.3, rng) for _ in range(4000)]
    swapped = np.mean([c.objects[0].colour == "blue" for c in captions])
    moved = np.mean([c.relation != prompt.relation for c in captions])
    assert abs(swapped - 0.3) < 0.03 and abs(moved - 0.3) < 0.03
    assert noisy_caption(prompt, 0.0, 0.0, rng) == prompt


def test_toy_benchmark_summary_on_hand_made_rows():
    def row(prompt, score, bound, holds):
        details = {"bound": bound, "relation_holds": holds, "correct": bound and holds is not False,
                   "reasons": [] if bound and holds is not False else ["wrong"]}
        return {"prompt": prompt, "score": score, "details": details}

    rows = [
        row("a red circle and a blue triangle", 1.0, True, None),
        row("a red circle and a blue triangle", 0.5, False, None),
        row("a red triangle above a blue circle", 1.0, True, False),  # bound, relation wrong
        row("a red triangle above a blue circle", 0.5, False, None),  # an object missing
    ]
    benchmark = ToyBenchmark()
    summary = benchmark.summarize([{**r, **benchmark.judge(r)} for r in rows])
    assert summary["binding_accuracy"] == 0.5
    assert summary["binding_accuracy_and"] == 0.5 and summary["binding_accuracy_relation"] == 0.5
    assert summary["relation_accuracy"] == 0.0 and summary["full_accuracy"] == 0.25
    assert summary["mean_score"] == 0.75
    assert summary["prompts_with_a_correct_image"] == 1.0
    assert summary["binding_errors"] is None  # rows scored before the oracle named its errors
    assert benchmark.judge(rows[2]) == {"correct": True, "relation_correct": False, "all_correct": False,
                                        "reason": "wrong", "errors": None}
    named = [{**r, "details": {**r["details"], "errors": errors}}
             for r, errors in zip(rows, [[], ["exchanged", "extra"], [], ["missing"]])]
    errors = benchmark.summarize([{**r, **benchmark.judge(r)} for r in named])["binding_errors"]
    assert errors == {"exchanged": 0.25, "wrong_shape": 0.0, "shapeless": 0.0, "missing": 0.25, "extra": 0.25}
    assert list(errors) == list(BINDING_ERRORS)
    assert ToyBenchmark(max_prompts=10).prompts() == ToyBenchmark().prompts()[::15]


def test_pretraining_targets_follow_the_prediction_type(tmp_path, monkeypatch):
    """`gors toy pretrain --prediction_type v_prediction`: the U-Net learns the velocity, and the
    saved pipeline's scheduler samples with it."""
    import torch

    import gors.toy.pretrain as pretrain
    from gors.toy.model import build_toy_components
    from gors.toy.pretrain import ToyPretrainConfig, denoising_target, set_prediction_type, train_text_to_image

    components = build_toy_components(tmp_path, seed=0)
    scheduler = components["noise_scheduler"]
    x0, noise, t = torch.randn(3, 4, 8, 8), torch.randn(3, 4, 8, 8), torch.tensor([10, 500, 990])
    assert torch.equal(denoising_target(scheduler, x0, noise, t), noise)
    set_prediction_type(components, "v_prediction")
    assert components["scheduler"].config.prediction_type == "v_prediction"
    alpha = scheduler.alphas_cumprod[t].sqrt().view(-1, 1, 1, 1)
    sigma = (1 - scheduler.alphas_cumprod[t]).sqrt().view(-1, 1, 1, 1)
    torch.testing.assert_close(denoising_target(scheduler, x0, noise, t), alpha * noise - sigma * x0)

    # The training loop's loss target is that velocity.
    targets, losses = [], []
    monkeypatch.setattr(pretrain, "denoising_target", lambda *a: targets.append(denoising_target(*a)) or targets[-1])
    monkeypatch.setattr(torch.nn.functional, "mse_loss", lambda p, target: losses.append(target) or (p - target).pow(2).mean())
    config = ToyPretrainConfig(output_dir=str(tmp_path), unet_steps=1, batch_size=2, prediction_type="v_prediction")
    train_text_to_image(components, torch.randn(6, 4, 8, 8), ["a red circle"] * 6, config, torch.Generator().manual_seed(0))
    assert len(targets) == 1 and losses[0] is targets[0]

    with pytest.raises(ValueError, match="choose one of epsilon, v_prediction"):
        ToyPretrainConfig(prediction_type="sample")
    with pytest.raises(ValueError, match="must be > 0"):
        ToyPretrainConfig(token_embedding_std=0.0)
    (tmp_path / "afile").write_text("")
    for values, message in [({"output_dir": str(tmp_path / "afile")}, "is a file, not a folder"),
                            ({"num_scenes": 0}, "--num_scenes 0: must be >= 1"),
                            ({"unet_steps": 0}, "--unet_steps 0: must be >= 1"),
                            ({"classifier_steps": 0}, "--classifier_steps 0: must be >= 1"),
                            ({"vae_steps": -1}, "--vae_steps -1: must be >= 0"),
                            ({"vae_steps": 0}, "--vae_steps 0 without --vae would keep an untrained VAE"),
                            ({"seed": -1}, r"--seed -1: must be in \[0, 2147483647\]"),
                            ({"learning_rate": 0.0}, "--learning_rate 0.0: must be > 0"),
                            ({"caption_swap_rate": 1.5}, r"--caption_swap_rate 1.5: a rate, in \[0, 1\]"),
                            ({"relation_noise_rate": -0.1}, r"--relation_noise_rate -0.1: a rate, in \[0, 1\]"),
                            ({"seed": 2**31}, r"--seed 2147483648: must be in \[0, 2147483647\]"),
                            ({"batch_size": 0}, "--batch_size 0: must be >= 1")]:
        with pytest.raises(ValueError, match=message):  # before any scene is rendered
            ToyPretrainConfig(**values)
    # The bounds themselves are allowed: every caption noisy, numpy's largest seed.
    ToyPretrainConfig(output_dir=str(tmp_path), caption_swap_rate=1.0, relation_noise_rate=1.0, seed=2**31 - 1)


def test_pretraining_unet_channels_set_the_depth_of_the_toy_unet(tmp_path):
    """`gors toy pretrain --unet_channels 32 64 64`: one more cross-attention block, whose 2 x 2 grid
    is where the U-Net can tell left from right; bad widths are refused at parse time."""
    import torch

    from gors.cli import parse_config
    from gors.toy.model import build_toy_components
    from gors.toy.pretrain import ToyPretrainConfig

    config = parse_config(ToyPretrainConfig, ["--unet_channels", "32", "64", "64"])
    assert config.unet_channels == [32, 64, 64] and ToyPretrainConfig().unet_channels == [32, 64]
    unet = build_toy_components(tmp_path, seed=0, unet_channels=config.unet_channels)["unet"]
    assert len(unet.down_blocks) == 3 and unet.config.block_out_channels == (32, 64, 64)
    grids = []
    unet.mid_block.register_forward_hook(lambda module, args, out: grids.append(tuple(out.shape[-2:])))
    out = unet(torch.randn(1, 4, 8, 8), 10, torch.randn(1, 16, 64)).sample
    assert out.shape == (1, 4, 8, 8) and grids == [(2, 2)]
    for bad in ([], [32, 40], [32, 64, 64, 64, 64]):
        with pytest.raises(ValueError, match="--unet_channels"):
            ToyPretrainConfig(unet_channels=bad)


def test_pretraining_stages_draw_from_their_own_streams_on_fixed_threads(tmp_path, monkeypatch):
    """The U-Net stage's random stream does not depend on how long the VAE trained, pretraining
    runs on `--num_threads` threads, records them, and gives the caller's thread count back."""
    import json

    import torch

    import gors.toy.pretrain as pretrain
    from gors.toy.pretrain import ToyPretrainConfig
    from rewards.toy_cnn import ToyClassifier

    first_draws, threads_seen = [], []

    def record_stream(components, latents, captions, config, generator):
        threads_seen.append(torch.get_num_threads())
        first_draws.append(torch.randint(1 << 30, (4,), generator=generator))

    monkeypatch.setattr(pretrain, "train_text_to_image", record_stream)
    monkeypatch.setattr("rewards.toy_cnn.train_classifier", lambda steps, seed: ToyClassifier())
    for vae_steps in (1, 2):
        config = ToyPretrainConfig(output_dir=str(tmp_path / f"vae{vae_steps}"), num_scenes=40, vae_steps=vae_steps,
                                   num_threads=2)
        pretrain.pretrain(config)
    assert torch.equal(first_draws[0], first_draws[1])
    assert threads_seen == [2, 2] and torch.get_num_threads() == 1  # conftest's one thread, restored
    info = json.loads((tmp_path / "vae1" / "pretrain_info.json").read_text())
    assert info["config"]["num_threads"] == 2 and info["torch_threads"] == 2
    # Weights in half precision, but transformers loads the text encoder in float32, as diffusers the U-Net.
    text_encoder = tmp_path / "vae1" / "pipeline" / "text_encoder"
    assert json.loads((text_encoder / "config.json").read_text())["dtype"] == "float32"
    with pytest.raises(ValueError, match="--num_threads 0"):
        ToyPretrainConfig(num_threads=0)


def test_pretraining_keeps_a_given_vae_and_refuses_a_wrong_one(tmp_path, monkeypatch):
    """`gors toy pretrain --vae FOLDER`: no VAE training, the U-Net learns that VAE's latents and
    the saved pipeline ships it; a folder without a VAE, or one of other latents, is refused."""
    import torch
    from diffusers import AutoencoderKL

    import gors.toy.pretrain as pretrain
    from gors.toy.model import build_toy_components
    from gors.toy.pretrain import ToyPretrainConfig, encode_corpus
    from rewards.toy_cnn import ToyClassifier

    given = build_toy_components(tmp_path / "c", seed=3)["vae"]
    given.register_to_config(scaling_factor=0.5)
    given.to(torch.float16).save_pretrained(tmp_path / "vae")
    seen = {}
    monkeypatch.setattr(pretrain, "train_vae", lambda *a: pytest.fail("--vae must skip VAE training"))
    monkeypatch.setattr(pretrain, "train_text_to_image", lambda components, latents, *a: seen.update(latents=latents))
    monkeypatch.setattr("rewards.toy_cnn.train_classifier", lambda steps, seed: ToyClassifier())
    config = ToyPretrainConfig(output_dir=str(tmp_path / "out"), num_scenes=40, vae=str(tmp_path / "vae"))
    out = pretrain.pretrain(config)

    loaded = AutoencoderKL.from_pretrained(tmp_path / "vae", torch_dtype=torch.float32)
    shipped = AutoencoderKL.from_pretrained(out / "pipeline" / "vae", torch_dtype=torch.float16)
    assert shipped.config.scaling_factor == 0.5
    for (name, a), b in zip(loaded.state_dict().items(), shipped.state_dict().values()):
        assert torch.equal(a.half(), b), name
    images, _ = pretrain.pretraining_corpus(40, config.caption_swap_rate, config.relation_noise_rate,
                                            np.random.default_rng(config.seed))
    torch.testing.assert_close(seen["latents"], encode_corpus(loaded.eval(), pretrain._to_tensor(images), 0.5))

    with pytest.raises(ValueError, match="--vae .*no config.json"):
        ToyPretrainConfig(vae=str(tmp_path))
    with pytest.raises(ValueError, match="--vae .*unet: its config.json is of a UNet2DConditionModel, not a VAE"):
        ToyPretrainConfig(vae=str(PRETRAINED_DIR / "pipeline" / "unet"))
    AutoencoderKL(latent_channels=2, block_out_channels=(16,), norm_num_groups=8).save_pretrained(tmp_path / "wrong")
    with pytest.raises(ValueError, match="encodes 64 x 64 scenes to latents"):
        pretrain.pretrain(ToyPretrainConfig(output_dir=str(tmp_path / "out2"), num_scenes=40, vae=str(tmp_path / "wrong")))
    assert not (tmp_path / "out2").exists()  # nothing published by a failed run
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    with pytest.raises(ValueError, match="encodes 64 x 64 scenes to latents"):
        pretrain.pretrain(ToyPretrainConfig(output_dir=str(out), num_scenes=40, vae=str(tmp_path / "wrong")))
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # a model there stays whole
    with pytest.raises(ValueError, match="--output_dir='': give the folder"):
        ToyPretrainConfig(output_dir="")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files that are not a toy model"):  # it would be replaced whole
        pretrain.pretrain(ToyPretrainConfig(output_dir=str(tmp_path / "notes"), num_scenes=40, vae=str(tmp_path / "vae")))
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_the_packaged_pipeline_runs_in_plain_diffusers():
    """README: `StableDiffusionPipeline.from_pretrained` loads it (a float16 text encoder before a float32
    U-Net failed at the first call)."""
    import torch
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(str(PRETRAINED_DIR / "pipeline"))
    assert pipeline.text_encoder.dtype == pipeline.unet.dtype == torch.float32
    image = pipeline("a red circle", num_inference_steps=2, height=64, width=64,
                     generator=torch.Generator().manual_seed(0)).images[0]
    assert image.size == (64, 64)


@pytest.mark.parametrize("reward", ["toy_oracle", "toy_classifier", "toy_oracle:0.5,toy_classifier:0.5"])
def test_a_toy_reward_refuses_a_prompt_outside_the_toy_world_before_anything_is_generated(reward):
    from gors.score import check_prompt_metadata

    check_prompt_metadata(reward, ["a red circle and a blue square", "a green triangle"], None)
    with pytest.raises(ValueError, match=r"^the toy_\w+ reward judges toy-world prompts only; prompt 1: "
                                         r"'a red/blue circle' is not a toy-world prompt"):
        check_prompt_metadata(reward, ["a red circle", "a red/blue circle"], None)
