"""A reward or benchmark of one's own that breaks the extension rules (docs/extending.md) is refused
when it is registered or looked up, or before any image is generated, with a message that says what to
change, instead of failing after generation and scoring or being silently misread."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

import pytest

import evaluators
import gors.core.logs
import rewards.registry
from evaluators import Benchmark, BenchmarkPrompt, Metric, register_benchmark
from gors.core.toy import PRETRAINED_DIR
from rewards import Reward, RewardOutput, register_reward
from rewards.combined import check_options


@pytest.fixture(autouse=True)
def empty_registries(monkeypatch):
    """Registrations stay in the test that makes them."""
    monkeypatch.setattr(rewards.registry, "_REGISTERED", {})
    monkeypatch.setattr(evaluators, "_REGISTERED", {})


class Constant(Reward):
    def _score(self, images, prompts, metadata):
        return RewardOutput([0.5] * len(images))


def test_reward_names_that_are_taken_or_unparseable_are_refused():
    with pytest.raises(ValueError, match="reward name 'b_vqa' is gors' own; register Constant under another name"):
        register_reward("b_vqa")(Constant)
    for name in ("a:b", "a,b", ""):
        with pytest.raises(ValueError, match="give a non-empty name without ':' or ','"):
            register_reward(name)(Constant)
    for not_a_reward in (object, Constant.score, Constant()):
        with pytest.raises(ValueError, match=r"@register_reward\('constant'\) expects a Reward subclass, got"):
            register_reward("constant")(not_a_reward)
    register_reward("constant")(Constant)
    register_reward("constant")(Constant)  # the same class again: a module imported twice

    class Other(Constant):
        pass

    with pytest.raises(ValueError, match=r"'constant' is already registered to .*Constant; register "
                                         r".*Other under another name"):
        register_reward("constant")(Other)
    assert rewards.registry.get_reward_class("constant") is Constant


def test_an_empty_batch_has_no_scores_without_running_the_model():
    import torch

    class Stacking(Reward):  # as a model's forward: an empty batch cannot be stacked
        def _score(self, images, prompts, metadata):
            return RewardOutput(torch.stack([torch.zeros(()) for _ in images]).tolist())

    output = Stacking().score([], [], None)
    assert output.scores == [] and output.details == []


def test_reward_classes_without_score_or_with_another_range_are_refused():
    class NoScore(Reward):
        pass

    class Raw255(Constant):
        score_range = (0.0, 255.0)

    with pytest.raises(ValueError, match=r"NoScore does not implement _score\(images, prompts, metadata\)"):
        register_reward("no_score")(NoScore)
    with pytest.raises(ValueError, match=r"Raw255 declares score_range \(0.0, 255.0\): every reward scores in \[0, 1\]"):
        register_reward("raw")(Raw255)


def test_an_init_that_does_not_take_what_gors_passes_is_refused_before_generating():
    class Narrow(Constant):
        def __init__(self, gain: float = 1.0):
            super().__init__()
            self.gain = gain

    class Wide(Constant):
        def __init__(self, gain: float = 1.0, **kwargs):
            super().__init__(**kwargs)

    with pytest.raises(ValueError, match=r"^reward 'narrow': Narrow.__init__ does not take device, "
                                         r"torch_dtype, batch_size; gors passes device, torch_dtype, batch_size to "
                                         r"every reward: take them \(or \*\*kwargs\)"):
        check_options(Narrow, {"gain": 2.0}, "reward 'narrow'", "--reward_options")
    check_options(Wide, {"gain": 2.0}, "reward 'wide'", "--reward_options")


def test_a_reward_output_of_mismatched_lengths_names_itself():
    with pytest.raises(ValueError, match="RewardOutput of 1 scores but 6 details; give one details dict per score"):
        RewardOutput([0.5], [{}] * 6)


class TwoPrompts(Benchmark):
    """No dataclass: the tests below add one where they need it."""

    scorer = "toy_oracle"
    primary_metric = "accuracy"
    metrics = (Metric("accuracy"),)

    def prompts(self):
        return self.subsample([BenchmarkPrompt("a red circle"), BenchmarkPrompt("a blue square")])

    def summarize(self, rows):
        return {"accuracy": sum(row["details"]["bound"] for row in rows) / len(rows)}


@pytest.mark.parametrize("body, message", [
    ({"prompts": Benchmark.prompts}, "does not implement prompts"),
    ({"summarize": Benchmark.summarize}, "does not implement summarize"),
    ({"primary_metric": "acc"}, r"primary_metric='acc' is not among its metrics \['accuracy'\]"),
    ({"seed_fn": lambda base, p, i: base + p}, r"seed_fn: wrap the function in staticmethod\(\.\.\.\)"),
    ({"scorer": "toy_oracle:0.5,toy_classifier:0.5"}, r"is a weighted list; a benchmark's scorer is one reward"),
])
def test_benchmark_classes_that_break_the_rules_are_refused_when_registered(body, message):
    broken = dataclass(type("Broken", (TwoPrompts,), body))
    with pytest.raises(ValueError, match=message):
        register_benchmark("broken")(broken)


def test_protocol_defaults_in_a_class_that_is_no_dataclass_are_refused():
    class Undecorated(TwoPrompts):
        num_inference_steps = 20

    with pytest.raises(ValueError, match=r"Undecorated sets num_inference_steps but is not a dataclass, so the values "
                                         r"would be ignored: put @dataclass"):
        register_benchmark("undecorated")(Undecorated)
    register_benchmark("decorated")(dataclass(type("Decorated", (TwoPrompts,), {"num_inference_steps": 20,
                                                                             "__annotations__": {
                                                                                 "num_inference_steps": int}})))
    assert evaluators.get_benchmark("decorated").num_inference_steps == 20
    with pytest.raises(ValueError, match="benchmark name 'toy' is gors' own"):
        register_benchmark("toy")(dataclass(TwoPrompts))


def test_an_unknown_scorer_stops_an_evaluation_before_any_image(tmp_path):
    benchmark = dataclass(type("Misnamed", (TwoPrompts,), {"scorer": "toy_orcale"}))()
    with pytest.raises(ValueError, match=r"^benchmark class Misnamed \(.*scorer 'toy_orcale'\): Unknown reward "
                                         r"'toy_orcale'"):
        benchmark.evaluate(str(PRETRAINED_DIR / "pipeline"), tmp_path / "eval")
    assert not (tmp_path / "eval" / "samples").exists()


def test_prompts_that_are_not_benchmark_prompts_and_a_summary_without_its_metric_are_named(tmp_path):
    texts = dataclass(type("Texts", (TwoPrompts,), {"prompts": lambda self: ["a red circle"]}))()
    with pytest.raises(ValueError, match=r"Texts.prompts\(\) gave 'a red circle'; it returns BenchmarkPrompt objects"):
        texts.cached_prompts()
    flags = {"num_inference_steps": 1, "resolution": 32, "max_prompts": 1}
    wrong_key = dataclass(type("WrongKey", (TwoPrompts,), {"summarize": lambda self, rows: {"acc": 1.0}}))(**flags)
    with pytest.raises(ValueError, match=r"WrongKey.summarize returned no 'accuracy' \(its primary_metric\), only "
                                         r"\['acc'\]; the images and scores in .* are kept"):
        wrong_key.evaluate(str(PRETRAINED_DIR / "pipeline"), tmp_path / "eval")
    assert len(list((tmp_path / "eval" / "scores").glob("*.jsonl"))) == 1  # kept for the fixed class
    import numpy as np

    for summary, problem in [
        ({"accuracy": np.float32(1.0)}, r"returned a value JSON cannot hold \(Object of type float32 is not JSON "
                                        r"serializable\); return plain numbers \(float\(x\), array.tolist\(\)\)"),
        ({"accuracy": 93.2}, r"returned 93.2 for 'accuracy', outside its declared scale \[0, 1\]; rescale it, or "
                             r"declare its scale"),
        ({"accuracy": "high"}, r"returned 'high' for 'accuracy', not a finite number"),
    ]:
        broken = dataclass(type("Broken", (TwoPrompts,), {"summarize": lambda self, rows, s=summary: s}))(**flags)
        with pytest.raises(ValueError, match=rf"^Broken.summarize {problem}.*; the images and scores in .* are kept"):
            broken.evaluate(str(PRETRAINED_DIR / "pipeline"), tmp_path / "eval")
    assert not (tmp_path / "eval" / "results.jsonl").exists()  # nothing half-written
    undefined = dataclass(type("Undefined", (TwoPrompts,), {"summarize": lambda self, rows: {"accuracy": None}}))
    assert undefined(**flags).evaluate(str(PRETRAINED_DIR / "pipeline"), tmp_path / "eval")["accuracy"] is None


def test_a_reward_that_overrides_score_is_held_to_the_protocol_when_its_scores_are_written():
    from PIL import Image

    from gors.core.scoring import RewardError, score_rows

    class Overriding(Reward):  # `score` itself, not `_score`: the base's own check never runs
        def score(self, images, prompts, metadata=None):
            return RewardOutput([5.0] * len(images), [{}] * len(images))

    register_reward("overriding")(Overriding)
    records = [{"prompt_index": 0, "image_index": 0, "path": "a.png", "prompt": "a red circle"}]
    with pytest.raises(RewardError, match=r"Overriding returned 5.0 for image 0 \('a red circle'\), outside "
                                          r"\[0.0, 1.0\]; clip or rescale"):
        score_rows(Overriding(), records, [Image.new("RGB", (8, 8))])



def test_a_score_may_leave_its_range_by_rounding_error_only():
    from gors.core.scoring import RewardError, checked_scores

    assert checked_scores("r", RewardOutput([1.0 + 1e-9, -1e-9], [{}, {}]), ["a", "b"]) == [1.0 + 1e-9, -1e-9]
    for value in (1.001, -0.001):
        with pytest.raises(RewardError, match="outside"):
            checked_scores("r", RewardOutput([value], [{}]), ["a"])
    with pytest.raises(RewardError, match=r"returned inf for image 0 \('a'\), not a finite number"):
        checked_scores("r", RewardOutput([float("inf")], [{}]), ["a"])  # no score, not one to clip into range


def test_the_models_a_reward_of_ones_own_declares_are_recorded_however_it_loads_them(tmp_path):
    from gors.core.fingerprints import local_fingerprint
    from rewards.combined import build_reward

    model = tmp_path / "my_model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    class PlainLoad(Constant):  # reads its model without gors.core.hub.from_pretrained: nothing noted
        def __init__(self, model_name_or_path=None, **kwargs):
            super().__init__(model_name_or_path, **kwargs)
            self.config = (tmp_path / "my_model" / "config.json").read_text()

    register_reward("plain_load")(PlainLoad)
    alone = build_reward("plain_load", model_name_or_path=str(model))
    assert alone.model_commits == {str(model): local_fingerprint(model)}
    listed = build_reward("plain_load:0.5,toy_oracle:0.5", options={"plain_load": {"model_name_or_path": str(model)}})
    assert listed.model_commits == {str(model): local_fingerprint(model)}


def test_an_installed_benchmark_that_does_not_import_is_one_line_and_spares_other_messages(monkeypatch):
    def declared(group):
        return {"broken": ["no_such_package.benchmarks:Broken"]} if group == evaluators.ENTRY_POINT_GROUP else {}

    monkeypatch.setattr(rewards.registry, "declared_entry_points", declared)
    monkeypatch.setattr(evaluators, "declared_entry_points", declared)
    with pytest.raises(ValueError, match=r"^Could not import benchmark 'broken' \(entry point "
                                         r"no_such_package.benchmarks:Broken\): No module named 'no_such_package'.* "
                                         r"Add the folder that holds it to PYTHONPATH"):
        evaluators.benchmark_class("broken")
    # Listing the benchmarks that read image folders, for another's refusal, passes over it.
    register_benchmark("two_prompts")(dataclass(TwoPrompts))
    with pytest.raises(ValueError, match=r"^--images: two_prompts cannot read an image folder; use --images with "
                                         r"geneval, "):
        evaluators.get_benchmark("two_prompts").check_images_readable()


def test_scores_may_come_as_an_array_or_a_tensor_and_are_written_as_floats():
    import numpy as np
    import torch
    from PIL import Image

    for make in (np.array, torch.tensor):
        class Arrays(Reward):
            def _score(self, images, prompts, metadata, make=make):
                return RewardOutput(make([0.25] * len(images)), [{}] * len(images))

        output = Arrays().score([Image.new("RGB", (8, 8))] * 2, ["a", "b"])
        assert output.scores == [0.25, 0.25] and all(type(score) is float for score in output.scores)


PLUGIN = """
from dataclasses import dataclass
from evaluators import Benchmark, BenchmarkPrompt, Metric, register_benchmark
from rewards import Reward, RewardOutput, register_reward

class Half(Reward):
    def _score(self, images, prompts, metadata):
        return RewardOutput([0.5] * len(images))

class Quarter(Half):
    def _score(self, images, prompts, metadata):
        return RewardOutput([0.25] * len(images))

@register_reward("registered_half")
class RegisteredHalf(Half):
    pass

@register_benchmark("two_prompts_plugin")
@dataclass
class TwoPrompts(Benchmark):
    scorer = "toy_oracle"
    metrics = (Metric("accuracy", "share of images scored 1", "[0, 1]"),)
    primary_metric = "accuracy"

    def prompts(self):
        return [BenchmarkPrompt("a red circle"), BenchmarkPrompt("a blue square")]

    def summarize(self, rows):
        return {"accuracy": sum(row["score"] == 1.0 for row in rows) / len(rows)}

@dataclass
class Undecorated(TwoPrompts):
    pass
"""


def installed(tmp_path, monkeypatch, packages: dict[str, str]):
    """Packages that declare entry points (`packages`: distribution name -> entry_points.txt), all of them
    pointing into one module `ep_plugin` on the Python path."""
    (tmp_path / "ep_plugin.py").write_text(PLUGIN)
    for name, points in packages.items():
        dist = tmp_path / f"{name}-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text(points)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ep_plugin", raising=False)


def test_an_entry_point_named_like_a_builtin_is_said_to_be_ignored_and_the_builtin_kept(tmp_path, monkeypatch, caplog):
    installed(tmp_path, monkeypatch, {"shadowing": "[gors.rewards]\nb_vqa = ep_plugin:Half\n"
                                                   "[gors.benchmarks]\ntoy = ep_plugin:Undecorated\n"})
    monkeypatch.setattr(gors.core.logs, "_said", set())  # each warning said anew
    with caplog.at_level("WARNING"):
        assert rewards.registry.get_reward_class("b_vqa").__name__ == "BVQAReward"
        assert rewards.registry.get_reward_class("b_vqa").__name__ == "BVQAReward"
        assert evaluators.benchmark_class("toy").__name__ == "ToyBenchmark"
    said = [record.getMessage() for record in caplog.records]
    assert said == [
        "the gors.rewards entry point b_vqa = ep_plugin:Half is ignored: 'b_vqa' is gors' own reward, which it keeps "
        "naming; give the entry point another name",
        "the gors.benchmarks entry point toy = ep_plugin:Undecorated is ignored: 'toy' is gors' own benchmark, which "
        "it keeps naming; give the entry point another name",
    ]  # once per name


def test_a_name_two_packages_declare_as_different_classes_is_refused(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, {"first": "[gors.rewards]\nhalf = ep_plugin:Half\nsame = ep_plugin:Half\n",
                                      "second": "[gors.rewards]\nhalf = ep_plugin:Quarter\nsame = ep_plugin:Half\n"})
    with pytest.raises(ValueError, match=r"reward 'half' is declared by installed packages as 2 classes "
                                         r"\(ep_plugin:(Half|Quarter), ep_plugin:(Half|Quarter)\) in the gors.rewards "
                                         r"entry points: uninstall all but one"):
        rewards.registry.get_reward_class("half")
    assert rewards.registry.get_reward_class("same").__name__ == "Half"  # the same class twice is one


def test_an_entry_point_is_the_name_of_its_class(tmp_path, monkeypatch):
    installed(tmp_path, monkeypatch, {"plugin": "[gors.rewards]\nhalf2 = ep_plugin:RegisteredHalf\n"
                                                "[gors.benchmarks]\nplain = ep_plugin:Undecorated\n"
                                                "alias = ep_plugin:Undecorated\nrenamed = ep_plugin:TwoPrompts\n"})
    with pytest.raises(ValueError, match=r"reward entry point 'half2' \(ep_plugin:RegisteredHalf\) names a class "
                                         r"registered as 'registered_half': name the entry point 'registered_half'"):
        rewards.registry.get_reward_class("half2")
    with pytest.raises(ValueError, match=r"benchmark entry point 'renamed' .* registered as 'two_prompts_plugin'"):
        evaluators.benchmark_class("renamed")
    # An undecorated subclass takes its entry point's name, not its parent's: summaries and folders name it so.
    plain = evaluators.benchmark_class("plain")
    assert (plain.name, plain.__mro__[1].name) == ("plain", "two_prompts_plugin")
    assert evaluators.get_benchmark("plain").name == "plain" and evaluators.benchmark_class("plain") is plain
    # Two names for one undecorated class: each keeps its own, whichever is looked up first.
    assert [evaluators.get_benchmark(name).name for name in ("alias", "plain", "alias")] == ["alias", "plain", "alias"]


def test_a_benchmark_class_in_the_builtin_table_takes_its_key_as_name(monkeypatch, tmp_path):
    (tmp_path / "table_bench.py").write_text(PLUGIN.replace('@register_benchmark("two_prompts_plugin")\n', ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(evaluators._BENCHMARKS, "table_bench", "table_bench:TwoPrompts")
    assert evaluators.get_benchmark("table_bench").name == "table_bench"


def test_a_value_error_inside_score_names_the_reward_and_its_batch():
    from PIL import Image

    class Picky(Reward):
        def _score(self, images, prompts, metadata):
            raise ValueError("bad input on a yellow prompt")

    with pytest.raises(ValueError, match=r"^Picky on a batch of 2 from 'a yellow star': bad input on a yellow prompt$"):
        Picky().score([Image.new("RGB", (4, 4))] * 2, ["a yellow star", "a red circle"])
    register_reward("picky")(Picky)
    from rewards.combined import build_reward

    mixed = build_reward("picky:0.5,toy_oracle:0.5")  # named once, by the member that raised it
    with pytest.raises(ValueError, match=r"^Picky on a batch of 1 from 'a yellow star': bad input on a yellow prompt$"):
        mixed.score([Image.new("RGB", (4, 4))], ["a yellow star"])
    with pytest.raises(ValueError, match=r"^Picky on a batch of 1 from '(long ){15}lo\.\.\.': bad input"):
        Picky().score([Image.new("RGB", (4, 4))], ["long " * 40])

    class NotText(Reward):  # a ValueError of its own type passes as it is
        def _score(self, images, prompts, metadata):
            raise UnicodeError("not text")

    with pytest.raises(UnicodeError, match="^not text$"):
        NotText().score([Image.new("RGB", (4, 4))], ["a"])


def test_listings_show_a_plugin_that_raises_on_import_and_the_others(tmp_path, monkeypatch, capsys):
    from gors.cli import main

    installed(tmp_path, monkeypatch, {"plugin": "[gors.benchmarks]\nraising = ep_raising:Anything\n"
                                                "[gors.rewards]\nraising = ep_raising:Anything\n"})
    (tmp_path / "ep_raising.py").write_text("raise RuntimeError('needs a GPU at import')\n")
    main(["benchmarks"])
    main(["rewards"])
    out = capsys.readouterr().out
    assert out.count("cannot be imported: needs a GPU at import") == 2
    assert "toy_oracle" in out and "t2i_compbench" in out


PLUGIN_BENCHMARK = '''
from dataclasses import dataclass

from evaluators import Benchmark, BenchmarkPrompt, Metric, register_benchmark


@register_benchmark("path_bench")
@dataclass
class PathBenchmark(Benchmark):
    num_inference_steps: int = 2
    guidance_scale: float = 4.0
    resolution: int = 64
    official_images_per_prompt = 1
    scorer = "toy_oracle"
    primary_metric = "accuracy"
    metrics = (Metric("accuracy", higher_is_better=True, scale="[0, 1]", help="share bound"),)

    def prompts(self):
        return self.subsample([BenchmarkPrompt("a red circle and a blue triangle")])

    def summarize(self, rows):
        return {"accuracy": sum(row["details"]["bound"] for row in rows) / len(rows), "num_images": len(rows)}


@dataclass
class Unnamed(PathBenchmark):
    pass
'''


def test_a_benchmark_of_ones_own_runs_from_the_command_line_by_its_module_class_path(tmp_path, monkeypatch):
    """`gors evaluate --benchmarks module:Class` imports the module from the working directory and files the
    results under the name the class registers; one without a name, or no Benchmark, is refused."""
    from gors.cli import main
    from gors.core.toy import PRETRAINED_DIR
    from gors.evaluate import evaluate

    (tmp_path / "plugin_bench.py").write_text(PLUGIN_BENCHMARK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "plugin_bench", raising=False)  # imported here only: gone after the test
    main(["evaluate", "--pretrained_model_name_or_path", str(PRETRAINED_DIR / "pipeline"),
          "--benchmarks", "plugin_bench:PathBenchmark,toy", "--max_prompts", "1", "--output_dir", "eval"])
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert [entry["label"] for entry in summary["summaries"]] == ["path_bench", "toy:held_out"]
    assert (tmp_path / "eval" / "path_bench" / "summary.json").is_file()
    from gors.config import EvaluateConfig

    for spec, message in [("plugin_bench:Unnamed", "has no name of its own, which its results are filed by"),
                          ("plugin_bench:dataclass", "plugin_bench:dataclass is not a Benchmark subclass"),
                          # A class (CapWords) or a dotted module is meant as a path: what is missing is named.
                          ("plugin_bench:Missing", "the module plugin_bench has no class 'Missing'"),
                          ("no_such_module:Thing", "Could not import benchmark 'no_such_module:Thing'.* PYTHONPATH"),
                          ("no_such.module:thing", "Could not import benchmark 'no_such.module:thing'"),
                          # Otherwise more likely a mistyped benchmark name and its subset: the known ones are listed.
                          ("plugin_bench:missing", "unknown benchmark 'plugin_bench:missing'; known: "),
                          ("t2i_compbenh:color", "unknown benchmark 't2i_compbenh:color'; known: .*'module:Class'")]:
        with pytest.raises(ValueError, match=message):
            evaluate(EvaluateConfig(benchmarks=spec, output_dir=str(tmp_path / "refused")))
    assert not (tmp_path / "refused").exists()
    assert evaluators.parse_benchmarks("evaluators.toy:ToyBenchmark:train") == [("toy", "train")]  # gors' own
