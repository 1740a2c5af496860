"""Hub commits of the scorer's models: read from the Hugging Face cache, recorded in score folders,
another commit refused once a folder holds scores, reported in evaluation summaries (local models'
fingerprints: tests/test_local_model_versions.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from gors.core.distributed import make_accelerator
from gors.core.fingerprints import local_fingerprint
from gors.core.hub import from_pretrained, hub_commit, recording_loads
from gors.core.scoring import score_samples
from gors.core.store import MODELS as MODELS_FILE
from gors.core.store import StoreError, check_model_commits, recorded_model_commits
from rewards import RewardOutput

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def _cache(tmp_path: Path, repo_id: str, refs: dict[str, str]) -> Path:
    """A Hugging Face cache holding `repo_id` with branch (or tag) -> commit `refs`; returns the cache."""
    cache = tmp_path / "hub"
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    for ref, commit in refs.items():
        (folder / "refs" / ref).write_text(commit)
        (folder / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    return cache


def test_hub_commit_reads_the_cache_refs(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache(tmp_path, "org/model", {
        "main": COMMIT_A, "v2": COMMIT_B, COMMIT_B[:7]: COMMIT_B})))
    assert hub_commit("org/model") == COMMIT_A
    assert hub_commit("org/model", COMMIT_B[:7]) == COMMIT_B  # a short commit is no commit: its ref resolves it
    assert hub_commit("org/model", "v2") == COMMIT_B  # a tag or branch resolves through its ref
    assert hub_commit("org/model", COMMIT_B) == COMMIT_B  # a commit is itself
    assert hub_commit("org/model", "v3") is None  # a revision the cache does not hold
    assert hub_commit("org/other") is None  # a model the cache does not hold
    assert hub_commit(str(tmp_path)) is None  # a local folder has no commit


def test_a_folder_scored_at_a_revision_is_checked_against_that_revision_in_the_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from gors.core.store import check_cached_commits

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache(tmp_path, "org/model", {"main": COMMIT_A, "v2": COMMIT_B})))
    folder = tmp_path / "scores"
    folder.mkdir()
    (folder / MODELS_FILE).write_text(json.dumps({"org/model": COMMIT_B}))
    check_cached_commits(folder, True, "scores", {"org/model": "v2"})  # the revision asked for: the recorded commit
    with pytest.raises(StoreError, match=f"org/model was at commit {COMMIT_B}, now {COMMIT_A}"):
        check_cached_commits(folder, True, "scores")  # main: another commit


def test_loads_are_recorded_inside_a_recording_only(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache(tmp_path, "org/model", {"main": COMMIT_A})))
    load = lambda name, **kwargs: name  # noqa: E731
    from_pretrained(load, "org/model", "--flag")  # outside any recording: nothing to note, no error
    with recording_loads() as outer:
        with recording_loads() as inner:
            from_pretrained(load, "org/model", "--flag")
        from_pretrained(load, str(tmp_path), "--flag")
    assert inner == {"org/model": COMMIT_A}
    # The inner recording reports outward; a local folder is recorded by the fingerprint of its files.
    assert outer == {"org/model": COMMIT_A, str(tmp_path): local_fingerprint(tmp_path)}
    assert outer[str(tmp_path)].startswith("sha256:")


def _scorer(commits: dict[str, str | None], calls: list[int]) -> SimpleNamespace:
    def score(images, prompts, metadata=None):
        calls.append(len(images))
        return RewardOutput([0.5] * len(images))

    return SimpleNamespace(score=score, model_commits=commits)


class _Samples:
    def __init__(self, count: int) -> None:
        self.count = count

    def records(self):
        return [{"prompt_index": p, "image_index": 0, "prompt": f"prompt {p}", "path": f"{p}.png"}
                for p in range(self.count)]

    def open_image(self, record):
        return Image.new("RGB", (8, 8))


def test_a_score_folder_records_the_commits_and_refuses_another_once_scored(tmp_path):
    accelerator = make_accelerator()
    folder = tmp_path / "scores"
    calls: list[int] = []
    score_samples(_Samples(1), folder, lambda: _scorer({"org/model": COMMIT_A, "/local": None}, calls), 1, accelerator)
    assert json.loads((folder / MODELS_FILE).read_text()) == {"org/model": COMMIT_A, "/local": None}
    # A second prompt to score, by the model updated on the Hub: refused before any image is scored.
    with pytest.raises(StoreError, match=f"org/model was at commit {COMMIT_A}, now {COMMIT_B}.*delete {folder}"):
        score_samples(_Samples(2), folder, lambda: _scorer({"org/model": COMMIT_B}, calls), 1, accelerator)
    assert calls == [1] and recorded_model_commits(folder)["org/model"] == COMMIT_A
    # The same commit scores on; a commit unknown here (no cache entry) is no conflict and changes no record.
    score_samples(_Samples(3), folder, lambda: _scorer({"org/model": None}, calls), 1, accelerator)
    score_samples(_Samples(4), folder, lambda: _scorer({"org/model": COMMIT_A, "org/new": COMMIT_B}, calls), 1,
                  accelerator)
    assert calls == [1, 1, 1, 1]  # prompts 1 and 2 (batches of one), then 3
    assert recorded_model_commits(folder) == {"org/model": COMMIT_A, "/local": None, "org/new": COMMIT_B}


def test_a_folder_without_scores_takes_the_new_commits(tmp_path):
    (tmp_path / MODELS_FILE).write_text(json.dumps({"org/model": COMMIT_A}))  # left by a scorer that failed
    check_model_commits(tmp_path, {"org/model": COMMIT_B}, False, "scores")
    assert recorded_model_commits(tmp_path) == {"org/model": COMMIT_B}
    assert recorded_model_commits(tmp_path / "absent") == {}
    check_model_commits(tmp_path / "other", {}, True, "scores")  # a scorer without commits records none
    assert not (tmp_path / "other" / MODELS_FILE).exists()




def test_a_reward_loaded_by_hub_id_knows_its_commit(tmp_path, monkeypatch):
    """The real path: `build_reward` by Hub id, offline, from a Hugging Face cache holding one snapshot."""
    from huggingface_hub import constants

    from gors.testing.clip import build_tiny_clip
    from rewards.combined import build_reward

    cache = _cache(tmp_path, "gors-test/tiny-clip", {"main": COMMIT_A})
    snapshot = cache / "models--gors-test--tiny-clip" / "snapshots" / COMMIT_A
    shutil.rmtree(snapshot)
    build_tiny_clip(snapshot)
    # Where HF_HUB_CACHE and HF_HUB_OFFLINE=1 in the environment put them (huggingface_hub reads both per call).
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    reward = build_reward("clip_score", model_name_or_path="gors-test/tiny-clip", device="cpu")
    assert reward.model_commits == {"gors-test/tiny-clip": COMMIT_A}


def test_an_evaluation_summary_names_the_scorer_models(tmp_path):
    from dataclasses import dataclass

    from evaluators import Benchmark, BenchmarkPrompt, Metric
    from gors.core.toy import PRETRAINED_DIR

    @dataclass
    class Classified(Benchmark):  # the toy classifier loads from the packaged folder: a local model
        num_inference_steps: int = 2
        guidance_scale: float = 4.0
        resolution: int = 64
        official_images_per_prompt = 1
        scorer = "toy_classifier"
        name = "classified"
        primary_metric = "score"
        metrics = (Metric("score", help="mean classifier score"),)

        def prompts(self) -> list[BenchmarkPrompt]:
            return [BenchmarkPrompt("a red circle and a blue triangle")]

        def summarize(self, rows: list[dict]) -> dict:
            return {"score": sum(row["score"] for row in rows) / len(rows)}

    summary = Classified().evaluate(str(PRETRAINED_DIR / "pipeline"), tmp_path)
    # Local folders both, the pipeline's and the classifier's: no Hub commit, their files' fingerprints.
    assert summary["results"]["models"] == {str(PRETRAINED_DIR / "pipeline"): local_fingerprint(PRETRAINED_DIR / "pipeline"),
                                            str(PRETRAINED_DIR / "classifier"): local_fingerprint(PRETRAINED_DIR / "classifier")}
    assert json.loads((tmp_path / "summary.json").read_text())["results"]["models"] == summary["results"]["models"]


def test_overlapped_scoring_refuses_another_commit_before_generating(tmp_path):
    from gors.core.background_scoring import BackgroundScorer

    (tmp_path / MODELS_FILE).write_text(json.dumps({"org/model": COMMIT_A}))
    done = {(0, 0): {"prompt_index": 0, "image_index": 0, "reward": 0.5}}
    scorer = BackgroundScorer(tmp_path, lambda: _scorer({"org/model": COMMIT_B}, []), 1, 0, "cpu", done=done)
    with pytest.raises(StoreError, match="holds scores made with other versions of the models loaded now"):
        scorer.open()
    fresh = BackgroundScorer(tmp_path, lambda: _scorer({"org/model": COMMIT_B}, []), 1, 0, "cpu")
    fresh.open()  # nothing scored yet: the new commit is recorded
    fresh.close()
    assert recorded_model_commits(tmp_path) == {"org/model": COMMIT_B}


def test_a_sample_store_records_the_pipeline_commit_and_refuses_another(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from gors.core.sampling import SamplingProtocol, generate_samples
    from gors.core.store import SampleStore

    refs = _cache(tmp_path, "org/pipeline", {"main": COMMIT_A}) / "models--org--pipeline" / "refs" / "main"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    protocol = SamplingProtocol(images_per_prompt=1, num_inference_steps=2, guidance_scale=7.5, resolution=8)
    store = SampleStore(tmp_path / "samples")
    made: list[int] = []

    def pipeline(**kwargs):
        made.append(len(kwargs["prompt"]))
        return SimpleNamespace(images=[Image.new("RGB", (8, 8))] * len(kwargs["prompt"]))

    loads: list[str] = []

    def load():
        loads.append("org/pipeline")
        return from_pretrained(lambda name, **kwargs: pipeline, "org/pipeline", "--pretrained_model_name_or_path")

    def generate(prompts):
        generate_samples(store, prompts, protocol, load, make_accelerator(), settings={"model": "org/pipeline"})

    generate(["a red circle"])
    assert recorded_model_commits(store.root) == {"org/pipeline": COMMIT_A}
    refs.write_text(COMMIT_B)  # the model was updated on the Hub and downloaded again
    with pytest.raises(StoreError, match=f"holds images made with .*org/pipeline was at commit {COMMIT_A}, now"):
        generate(["a red circle", "a blue square"])
    assert made == [1] and len(store.records()) == 1  # nothing generated by the other version
    assert loads == ["org/pipeline"]  # refused from the cache's commit, before loading the pipeline again


def test_a_reward_sharing_a_loaded_vlm_records_its_model_too(monkeypatch):
    import torch

    import rewards.vlm as vlm

    class Loaded:  # stands in for a ChatVLM (weak-referenceable)
        pass

    def load(name, device, dtype, flag):
        return from_pretrained(lambda name, **kwargs: Loaded(), name, flag)

    monkeypatch.setattr(vlm.ChatVLM, "from_pretrained", staticmethod(load))
    with recording_loads() as first:
        held = vlm.load_chat_vlm("org/vlm", torch.device("cpu"), torch.float32)
    with recording_loads() as second:  # e.g. GenEval 2's VQAScore column beside its Soft-TIFA scorer
        shared = vlm.load_chat_vlm("org/vlm", torch.device("cpu"), torch.float32)
    assert shared is held and first == second == {"org/vlm": None}


def test_a_score_folder_of_another_cached_commit_is_refused_before_the_reward_loads(tmp_path, monkeypatch):
    from huggingface_hub import constants

    refs = _cache(tmp_path, "org/model", {"main": COMMIT_A}) / "models--org--model" / "refs" / "main"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    accelerator = make_accelerator()
    folder = tmp_path / "scores"
    calls: list[int] = []
    builds: list[int] = []

    def build():
        builds.append(1)
        return _scorer({"org/model": hub_commit("org/model")}, calls)

    score_samples(_Samples(1), folder, build, 1, accelerator)
    refs.write_text(COMMIT_B)  # a newer snapshot downloaded since
    with pytest.raises(StoreError, match=f"org/model was at commit {COMMIT_A}, now {COMMIT_B}"):
        score_samples(_Samples(2), folder, build, 1, accelerator)
    assert builds == [1] and calls == [1]


def test_the_training_caches_are_bound_to_the_base_models_commit(tmp_path):
    """Latents and frozen text encodings are computed by the base model's VAE and encoders: a model id whose
    Hub repository moved to another commit (or a local folder with another fingerprint) gets new caches.
    Without a known version the names are those of caches made before versions were recorded."""
    import torch

    from gors.training_data import latent_cache_path, text_cache_name

    selection = [{"prompt": "a red circle", "path": "0.png", "reward": 1.0}]
    tokens = torch.zeros(2, 77, dtype=torch.long)

    def names(commit: str | None) -> tuple:
        latents = latent_cache_path(selection, tmp_path, 512, True, "org/model", None, commit)
        text = text_cache_name("text_encoder", ["a red circle", ""], tokens, "org/model", None, torch.float16, commit)
        return latents, text

    assert names(None) == (latent_cache_path(selection, tmp_path, 512, True, "org/model"),
                           text_cache_name("text_encoder", ["a red circle", ""], tokens, "org/model", None,
                                           torch.float16))
    at_a, at_b = names(COMMIT_A), names(COMMIT_B)
    assert at_a[0] != at_b[0] and at_a[1] != at_b[1] and at_a != names(None)
    # A --revision other than the default (a branch or tag, without a known commit) gets its own latents.
    revisions = {revision: latent_cache_path(selection, tmp_path, 512, True, "org/model", revision)
                 for revision in (None, "a", "b")}
    assert len(set(revisions.values())) == 3 and revisions[None] == names(None)[0]


def test_an_empty_ref_in_the_cache_is_no_commit(tmp_path, monkeypatch):
    """A ref file left empty (a download killed while writing it) resolves to no commit, not to ""."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache(tmp_path, "org/model", {"main": COMMIT_A, "v4": ""})))
    assert hub_commit("org/model", "v4") is None
    assert hub_commit("org/model") == COMMIT_A


def test_a_load_at_a_revision_is_recorded_at_that_revisions_commit(tmp_path, monkeypatch):
    """`from_pretrained(..., revision=...)` records the commit of the revision loaded, not of the main branch."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_cache(tmp_path, "org/model", {"main": COMMIT_A, "v2": COMMIT_B})))
    with recording_loads() as loads:
        from_pretrained(lambda name, **kwargs: object(), "org/model", "--flag", revision="v2")
    assert loads == {"org/model": COMMIT_B}
