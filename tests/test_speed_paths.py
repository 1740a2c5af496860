"""The speed paths against the plain ones on the same inputs: a torch.compile'd denoiser in
generation and training, and AdamW's fused kernel.

The compiled runs use a backend registered here that counts the graphs dynamo hands it and
compiles them with `aot_eager` (dynamo's capture and AOTAutograd's forward and backward graphs,
the parts of `inductor` that decide what runs; inductor's own code generation takes minutes on a
CPU): so each test also shows that the denoiser really ran compiled.
"""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from gors.config import EvaluateConfig
from gors.core.compiling import compile_module, uses_cuda_graphs, without_cuda_graphs
from gors.core.distributed import reset_process_state
from gors.generate import generate
from gors.train import GORSTrainer, train

COMPILED: list[int] = []  # graphs compiled by the counting backend, over the whole test session


@pytest.fixture(scope="session")  # dynamo refuses a name registered twice: once per process, in any test order
def counting_backend() -> str:
    from torch._dynamo import register_backend
    from torch._dynamo.backends.registry import lookup_backend

    name = "gors_test_counting_aot_eager"

    def counting(graph_module, example_inputs):
        COMPILED.append(len(graph_module.graph.nodes))
        return lookup_backend("aot_eager")(graph_module, example_inputs)

    register_backend(counting, name=name)
    return name


def _pixels(run_dir) -> dict[str, np.ndarray]:
    return {p.name: np.asarray(Image.open(p)) for p in sorted((run_dir / "samples").rglob("*.png"))}


def test_compiled_generation_draws_the_plain_samples(make_run_config, counting_backend, tmp_path):
    plain_dir, compiled_dir = tmp_path / "plain", tmp_path / "compiled"
    generate(make_run_config(output_dir=str(plain_dir)))
    reset_process_state()
    before = len(COMPILED)
    generate(make_run_config(output_dir=str(compiled_dir), torch_compile=counting_backend))
    assert len(COMPILED) > before  # the U-Net ran through dynamo
    plain, compiled = _pixels(plain_dir), _pixels(compiled_dir)
    assert plain.keys() == compiled.keys() and len(plain) == 6
    for name, image in plain.items():  # the same samples, up to float rounding (a uint8 step at most)
        assert np.abs(image.astype(int) - compiled[name].astype(int)).max() <= 1, name


def _copy_selected(selected_run, destination):
    shutil.copytree(f"{selected_run.output_dir}/samples", destination / "samples")
    shutil.copytree(f"{selected_run.output_dir}/scores", destination / "scores")
    shutil.copy(f"{selected_run.output_dir}/selection.jsonl", destination / "selection.jsonl")
    return destination


def _train(selected_run, make_run_config, run_dir, **overrides) -> dict[str, torch.Tensor]:
    settings = dict(max_train_steps=2, checkpointing_steps=100, report_to="none", learning_rate=1e-2,
                    text_encoder_learning_rate=1e-2)
    config = make_run_config(output_dir=str(_copy_selected(selected_run, run_dir)), **(settings | overrides))
    weights = load_file(str(train(config)))
    reset_process_state()
    return weights


def _assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys() and actual
    for key, value in expected.items():
        assert torch.allclose(actual[key], value, atol=1e-5, rtol=1e-4), key


def test_training_compiles_the_text_encoders_that_run_every_step(selected_run, make_run_config, counting_backend,
                                                                 tmp_path):
    trainer = GORSTrainer(make_run_config(output_dir=str(_copy_selected(selected_run, tmp_path / "run")),
                                          torch_compile=counting_backend, report_to="none"))
    trainer._setup_models()
    assert trainer.config.train_text_encoder and trainer.text_encoders  # the trained encoder runs every step
    for module in (trainer.denoiser, *trainer.text_encoders.values()):
        assert module._compiled_call_impl is not None, type(module).__name__


def test_fused_adamw_updates_as_the_loop_over_parameters(selected_run, make_run_config, tmp_path):
    fused = _train(selected_run, make_run_config, tmp_path / "fused")
    looped = _train(selected_run, make_run_config, tmp_path / "looped", fused_adam=False)
    _assert_close(fused, looped)
    # Two steps at lr 1e-2 moved the adapters: the match is of trained weights, not of the initial ones.
    zero_init = {k: v for k, v in looped.items() if "lora_B" in k or "lora.up" in k}
    assert zero_init and max(v.abs().max().item() for v in zero_init.values()) > 1e-3


@pytest.mark.parametrize("fused_adam", [True, False])
def test_the_optimizer_is_fused_exactly_when_asked(fused_adam, selected_run, make_run_config, tmp_path):
    trainer = GORSTrainer(make_run_config(output_dir=str(_copy_selected(selected_run, tmp_path / "run")),
                                          fused_adam=fused_adam, report_to="none"))
    trainer._setup_models()
    trainer._setup_optimizer()
    assert all(group["fused"] is fused_adam or (group["fused"] is None and not fused_adam)
               for group in trainer.optimizer.param_groups)


def test_an_unknown_compile_backend_is_refused_before_any_work(make_run_config, tmp_path):
    with pytest.raises(ValueError, match=r"--torch_compile='inductr' is not a torch.compile backend.*inductor") as err:
        make_run_config(output_dir=str(tmp_path / "run"), torch_compile="inductr")
    assert "TESTING_ONLY" not in str(err.value)  # torch's test doubles are accepted, not offered
    assert not (tmp_path / "run").exists()


def test_evaluate_hands_the_compile_backend_to_the_pipeline_it_loads(tiny_sd, counting_backend, tmp_path, monkeypatch):
    import evaluators.base
    from gors.config import EvaluateConfig
    from gors.evaluate import evaluate

    class Loaded(Exception):
        pass

    def loading(*args, **kwargs):
        raise Loaded(kwargs.get("torch_compile"))

    monkeypatch.setattr(evaluators.base, "load_pipeline", loading)
    with pytest.raises(Loaded, match=counting_backend):
        evaluate(EvaluateConfig(output_dir=str(tmp_path), pretrained_model_name_or_path=str(tiny_sd),
                                benchmarks="toy", max_prompts=1, images_per_prompt=1, torch_compile=counting_backend))
    with pytest.raises(ValueError, match="not a torch.compile backend"):
        EvaluateConfig(torch_compile="inductr")



@pytest.mark.parametrize(("value", "message"), [
    ("inductor:fast", r"'fast' is not an inductor mode; use one of .*reduce-overhead"),
    ("eager:reduce-overhead", r"only inductor takes a mode; use 'eager' alone, or inductor:MODE"),
    ("inductor:", r"no mode after the colon; use 'inductor' alone, or inductor:MODE"),
])
def test_a_compile_mode_is_one_of_inductor_s(value, message, make_run_config, tmp_path):
    with pytest.raises(ValueError, match=message):
        make_run_config(output_dir=str(tmp_path / "run"), torch_compile=value)
    with pytest.raises(ValueError, match=message):
        EvaluateConfig(torch_compile=value)
    assert not (tmp_path / "run").exists()


def test_inductor_s_default_mode_may_be_named():
    from gors.core.compiling import torch_compile_error, uses_cuda_graphs

    assert torch_compile_error("inductor:default") is None and not uses_cuda_graphs("inductor:default")


def test_compile_module_compiles_with_inductor_s_mode(monkeypatch):
    """A real inductor compile (of a tiny module: seconds) in a CUDA-graph mode, which on a CPU compiles
    without the graphs; the mode reaches inductor, whose CUDA graphs only a GPU exercises (gpu_session.sh)."""
    modes = []
    wrapper = torch._TorchCompileInductorWrapper.__init__
    monkeypatch.setattr(torch._TorchCompileInductorWrapper, "__init__",
                        lambda self, mode, *args: (modes.append(mode), wrapper(self, mode, *args))[1])
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    compiled = copy.deepcopy(plain)
    compile_module(compiled, "inductor:reduce-overhead")
    assert modes == ["reduce-overhead"] and compiled._compiled_call_impl is not None
    x = torch.randn(3, 8)
    for model in (plain, compiled):
        model(x).square().sum().backward()
    for (name, a), b in zip(plain.named_parameters(), compiled.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-5), name
    assert torch.allclose(plain(x), compiled(x), atol=1e-6)


def test_modules_compile_for_their_own_shapes():
    """Two modules compiled alike share the code dynamo caches by: the second's first call must not be taken
    for a change of shape and compiled for any shape (inductor's bf16 graphs on the CPU failed on it)."""
    from torch._dynamo import register_backend
    from torch._dynamo.backends.registry import lookup_backend

    symbolic = []

    def recording(graph_module, example_inputs):
        symbolic.append([type(value).__name__ for value in example_inputs if not isinstance(value, torch.Tensor)])
        return lookup_backend("eager")(graph_module, example_inputs)

    register_backend(recording, name="gors_test_recording_eager")
    first, second = torch.nn.Linear(8, 4), torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.ReLU())
    for module in (first, second):
        compile_module(module, "gors_test_recording_eager")
    first(torch.randn(2, 8))
    second(torch.randn(5, 6))
    first(torch.randn(3, 8))  # another batch: compiled again, for that shape
    assert symbolic == [[], [], []]


def test_many_compiled_modules_stay_compiled():
    """The models a run compiles share the functions dynamo caches graphs by (a model class's forward, or
    accelerate's autocast wrapper of every model's): a three-round run made more graphs than torch's limit
    of 8 per function, and dynamo ran the rest uncompiled."""
    import torch._dynamo
    from torch._dynamo import register_backend
    from torch._dynamo.backends.registry import lookup_backend

    graphs = []

    def recording(graph_module, example_inputs):
        graphs.append(len(graph_module.graph.nodes))
        return lookup_backend("eager")(graph_module, example_inputs)

    register_backend(recording, name="gors_test_recording_many")
    with torch._dynamo.config.patch(recompile_limit=8):  # torch's default, whatever an earlier test set
        for width in range(1, 13):  # one code object (Linear.forward), twelve graphs
            module = torch.nn.Linear(width, 2)
            compile_module(module, "gors_test_recording_many")
            module(torch.randn(1, width))
    assert len(graphs) == 12


@pytest.mark.parametrize(("value", "graphs"), [
    ("no", False), ("eager", False), ("cudagraphs", True), ("inductor", False), ("inductor:reduce-overhead", True),
    ("inductor:max-autotune", True), ("inductor:max-autotune-no-cudagraphs", False), ("inductor:lite", False)])
def test_only_the_modes_that_replay_cuda_graphs_count_as_such(value, graphs):
    # A mode without CUDA graphs keeps AdapterCast and micro-batch accumulation: it must not be taken for one with them.
    assert uses_cuda_graphs(value) is graphs
    assert without_cuda_graphs(value) == ({"cudagraphs": "no", "inductor:reduce-overhead": "inductor",
                                           "inductor:max-autotune": "inductor:max-autotune-no-cudagraphs"}
                                          .get(value, value))


def test_compiling_never_lowers_a_recompile_limit_already_higher():
    # The limit is process-wide: a user's (or another library's) higher setting stays.
    import torch._dynamo

    with torch._dynamo.config.patch(recompile_limit=1000):
        compile_module(torch.nn.Linear(2, 2), "eager")
        assert torch._dynamo.config.recompile_limit == 1000
    with torch._dynamo.config.patch(recompile_limit=8):
        compile_module(torch.nn.Linear(2, 2), "eager")
        assert torch._dynamo.config.recompile_limit == 64


@pytest.mark.parametrize(("value", "encoders"), [
    ("inductor", "inductor"), ("inductor:reduce-overhead", "inductor"),
    ("inductor:max-autotune", "inductor:max-autotune-no-cudagraphs"), ("cudagraphs", "no")])
def test_only_the_denoiser_replays_as_cuda_graphs_and_casts_its_adapters_inside(value, encoders, selected_run,
                                                                                make_run_config, tmp_path, monkeypatch):
    # AdapterCast's cast weights would be fresh inputs of every replay, copied into the graph's buffers; an encoder's
    # outputs, read after other compiled calls, would be freed by them.
    import gors.train

    compiled = []
    compile_module_ = gors.train.compile_module
    monkeypatch.setattr(gors.train, "compile_module",
                        lambda module, how: (compiled.append((type(module).__name__, how)), compile_module_(module, how)))
    trainer = GORSTrainer(make_run_config(output_dir=str(_copy_selected(selected_run, tmp_path / "run")),
                                          torch_compile=value, mixed_precision="bf16", report_to="none"))
    trainer._setup_models()
    assert compiled == [("UNet2DConditionModel", value), ("CLIPTextModel", encoders)]
    assert without_cuda_graphs(value) == encoders
    assert (trainer.adapter_cast is not None) is not uses_cuda_graphs(value)
    assert trainer.denoiser._compiled_call_impl is not None  # compiled (lazily: nothing ran here)


@pytest.mark.parametrize("flags, one_batch", [
    ({"gradient_accumulation_steps": 4}, r"--train_batch_size 8 --gradient_accumulation_steps 1\)"),
    ({"global_batch_size": 8}, r"--train_batch_size 8, with --global_batch_size unchanged\) or on more processes"),
])
def test_cuda_graphs_refuse_to_accumulate_micro_batches(flags, one_batch, selected_run, make_run_config, tmp_path):
    config = make_run_config(output_dir=str(_copy_selected(selected_run, tmp_path / "run")), train_batch_size=2,
                             torch_compile="inductor:max-autotune", report_to="none", **flags)
    with pytest.raises(ValueError, match=r"does not accumulate 4 micro-batches per update into its gradients: train "
                                         rf"the update's 8 samples per process as one batch \({one_batch}, or compile "
                                         r"without CUDA graphs \(--torch_compile inductor:max-autotune-no-cudagraphs\)"):
        GORSTrainer(config)
    config.train_batch_size, config.gradient_accumulation_steps = 8, 1
    assert GORSTrainer(config).config.gradient_accumulation_steps == 1


def test_under_cuda_graphs_a_training_s_first_two_steps_are_warm_up(selected_run, make_run_config, tmp_path,
                                                                   monkeypatch):
    # The second step records the graphs: a one-off that `gors estimate` would otherwise scale as pace.
    import gors.train
    from gors.core.clock import listening

    monkeypatch.setattr(gors.train, "compile_module", lambda module, how: None)  # the marks, not the compiling
    for value, warmup in [("inductor:reduce-overhead", 2), ("inductor", 1)]:
        with listening() as marks:
            _train(selected_run, make_run_config, tmp_path / value.replace(":", "-"), torch_compile=value,
                   max_train_steps=3, train_batch_size=4)
        assert marks.warmup_units == warmup and marks.first[1] == warmup and marks.last[1] == 3


def _counting_casts(monkeypatch) -> list[bool]:
    """Whether each LoRA layer's forward cast its input to the adapters' dtype, in call order."""
    import peft.tuners.lora.layer

    casts: list[bool] = []
    cast = peft.tuners.lora.layer.LoraLayer._cast_input_dtype
    monkeypatch.setattr(peft.tuners.lora.layer.LoraLayer, "_cast_input_dtype",
                        lambda self, x, dtype: (casts.append(x.dtype != dtype and self.cast_input_dtype_enabled),
                                                cast(self, x, dtype))[1])
    return casts


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_fused_lora_layers_learn_peft_s_adapters(mixed_precision, selected_run, make_run_config, tmp_path,
                                                 monkeypatch):
    import gors.lora

    casts = _counting_casts(monkeypatch)
    fused = _train(selected_run, make_run_config, tmp_path / "fused", mixed_precision=mixed_precision)
    assert not casts  # no LoRA layer took peft's forward (under bf16 autocast it would cast its input)
    monkeypatch.setattr(gors.lora, "fuse_lora_forward", lambda module: 0)
    plain = _train(selected_run, make_run_config, tmp_path / "plain", mixed_precision=mixed_precision)
    assert casts  # peft's forward ran
    if mixed_precision == "no":
        _assert_close(fused, plain)
    else:  # bf16 rounds peft's sum twice and the fused one once: as far from float32's adapters as peft's
        exact = _train(selected_run, make_run_config, tmp_path / "fp32")

        def distance(weights: dict[str, torch.Tensor]) -> float:
            return max(((weights[k] - v).norm() / v.norm()).item() for k, v in exact.items())

        assert fused.keys() == plain.keys() == exact.keys()
        assert distance(fused) <= 1.5 * distance(plain)
    zero_init = [v for k, v in plain.items() if "lora_B" in k or "lora.up" in k]
    assert max(v.abs().max().item() for v in zero_init) > 1e-3  # trained weights, not the initial ones


def test_without_autocast_the_lora_inputs_are_still_cast(selected_run, make_run_config, tmp_path, monkeypatch):
    # fp16 on a CPU: accelerate does not autocast there, so the fp16 activations need peft's cast to meet
    # the fp32 adapters.
    casts = _counting_casts(monkeypatch)
    weights = _train(selected_run, make_run_config, tmp_path / "fp16", mixed_precision="fp16")
    assert any(casts) and weights and all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.parametrize("options", [{}, {"gradient_checkpointing": True}], ids=["plain", "checkpointed"])
def test_adapters_cast_at_once_learn_autocast_s_adapters_bit_for_bit(options, selected_run, make_run_config,
                                                                     tmp_path, monkeypatch):
    import gors.core.fused_lora
    import gors.train

    passes = []
    forward = gors.core.fused_lora._CastTogether.forward
    monkeypatch.setattr(gors.core.fused_lora._CastTogether, "forward",
                        staticmethod(lambda ctx, *args: (passes.append(len(args) - 1), forward(ctx, *args))[1]))
    joint = _train(selected_run, make_run_config, tmp_path / "joint", mixed_precision="bf16", **options)
    # One cast of all adapter weights per micro-batch: the U-Net's 4 and the text encoder's 4 projections
    # of each attention block, two weights each.
    assert len(passes) == 2 and passes[0] > 8 and len(set(passes)) == 1
    monkeypatch.setattr(gors.train, "AdapterCast", lambda modules, dtype: None)
    each = _train(selected_run, make_run_config, tmp_path / "each", mixed_precision="bf16", **options)
    assert joint.keys() == each.keys() and joint
    for key, value in each.items():
        assert torch.equal(joint[key], value), key


def test_compiled_training_learns_the_plain_adapters_and_casts_them_at_once(selected_run, make_run_config,
                                                                           counting_backend, tmp_path):
    # Under bf16, as compiled training runs on GPUs: the adapters' joint cast (`AdapterCast`) inside the graphs.
    before = len(COMPILED)
    compiled = _train(selected_run, make_run_config, tmp_path / "compiled", mixed_precision="bf16",
                      torch_compile=counting_backend)
    graphs = len(COMPILED) - before
    plain = _train(selected_run, make_run_config, tmp_path / "plain", mixed_precision="bf16")
    # Same file, same keys (the in-place compile adds no `_orig_mod.` prefix), same values.
    _assert_close(compiled, plain)
    # One graph each for the U-Net and the trained text encoder: compiled at the first step, not again at the
    # second's new cast weights.
    assert graphs == 2
