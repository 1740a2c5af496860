"""`gors.core.fused_lora`: the LoRA linear layers' fused forward against peft's own on the same
inputs, and the cases it leaves to peft."""

from __future__ import annotations

import copy

import pytest
import torch

from gors.core.fused_lora import AdapterCast, fused_lora_linear_class
from gors.lora import adapters_disabled, add_lora, lora_parameters


def _net(seed: int = 0) -> torch.nn.Sequential:
    """Two linear layers with rank-4 adapters whose up-projections are non-zero (a trained LoRA's shape)."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
    add_lora(net, ["0", "2"], rank=4)
    with torch.no_grad():
        for parameter in lora_parameters(net):
            parameter.normal_(0, 0.5)
    return net


def _unfused(net: torch.nn.Module) -> torch.nn.Module:
    """A copy running peft's forward."""
    from peft.tuners.lora.layer import Linear

    plain = copy.deepcopy(net)
    for layer in plain.modules():
        if isinstance(layer, fused_lora_linear_class()):
            layer.__class__ = Linear
    return plain


def _forward_backward(net: torch.nn.Module, x: torch.Tensor, autocast: torch.dtype | None = None):
    """The output, the input's gradient and the adapters' gradients of a squared-sum loss."""
    x = x.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y = net(x)
    y.float().pow(2).sum().backward()
    grads = [p.grad.clone() for p in lora_parameters(net)]
    net.zero_grad(set_to_none=True)
    return y.float(), x.grad, grads


def test_add_lora_fuses_every_linear_adapter():
    net = _net()
    assert [type(m).__name__ for m in net if m.__class__ is not torch.nn.GELU] == ["FusedLoraLinear"] * 2


@pytest.mark.parametrize("shape", [(5, 64), (3, 10, 64)])
def test_in_float32_the_fused_forward_and_backward_are_peft_s(shape):
    net = _net()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    fused, plain = _forward_backward(net, x), _forward_backward(_unfused(net), x)
    assert fused[0].shape == (*shape[:-1], 32)
    for a, b in zip([fused[0], fused[1], *fused[2]], [plain[0], plain[1], *plain[2]]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert min(g.abs().max().item() for g in fused[2]) > 0  # every adapter weight got a gradient


def test_a_lora_scale_other_than_1_and_trained_base_weights_get_peft_s_gradients():
    net = _net()
    for layer in (net[0], net[2]):
        layer.scaling["default"] = 0.25
        layer.base_layer.requires_grad_(True)
    plain = _unfused(net)
    x = torch.randn(3, 10, 64, generator=torch.Generator().manual_seed(9))
    outputs = [layers(x).pow(2).sum() for layers in (net, plain)]
    for output in outputs:
        output.backward()
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(net.named_parameters(), plain.parameters()):
        assert a.grad is not None, name
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_under_autocast_the_fused_path_is_as_close_to_float64_as_peft_s():
    # The sum is rounded once instead of twice: no further from the exact values than peft's path.
    net = _net()
    x = torch.randn(4, 10, 64, generator=torch.Generator().manual_seed(2))
    exact = _forward_backward(copy.deepcopy(_unfused(net)).double(), x.double())
    fused = _forward_backward(net, x, autocast=torch.bfloat16)
    plain = _forward_backward(_unfused(net), x, autocast=torch.bfloat16)

    def error(result) -> float:
        return max(((a.double() - b).norm() / b.norm()).item()
                   for a, b in zip([result[0], result[1], *result[2]], [exact[0], exact[1], *exact[2]]))

    assert all(g.dtype == torch.float32 for g in fused[2])  # the fp32 adapters' own dtype
    assert error(fused) < 2e-2  # bf16's rounding, not a different computation
    assert error(fused) <= 1.1 * error(plain)


def test_without_autocast_a_half_precision_input_takes_peft_s_cast():
    # fp16 on a CPU: accelerate does not autocast there; peft casts the input to the fp32 adapters.
    net = _net()
    net[0].base_layer.half()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(3)).half()
    with torch.no_grad():
        torch.testing.assert_close(net[0](x), _unfused(net)[0](x))


def test_with_adapters_off_the_layers_are_their_base_layers():
    net = _net()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad(), adapters_disabled(net):
        torch.testing.assert_close(net[0](x), net[0].base_layer(x), rtol=0, atol=0)
        assert net[0](x).dtype == torch.float32


def test_hooks_on_the_adapter_layers_and_dropout_run_peft_s_forward():
    net = _net()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(5))
    seen = []
    handle = net[0].lora_B["default"].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        net[0](x)
    handle.remove()
    assert seen == [torch.Size([2, 96])]  # the hook saw the up-projection's output, as under peft
    net[0].lora_dropout["default"] = torch.nn.Dropout(0.5)
    net[0].train()
    with torch.no_grad():
        outputs = {net[0](x).sum().item() for _ in range(4)}
    assert len(outputs) > 1  # the dropout draws masks: peft's forward ran it


def test_the_fused_layers_save_and_load_as_peft_s(tmp_path):
    from peft.utils import get_peft_model_state_dict

    net = _net()
    plain = _unfused(net)
    assert get_peft_model_state_dict(net).keys() == get_peft_model_state_dict(plain).keys()
    # Merging (what a merged export does) gives the same weights.
    net[0].merge()
    plain[0].merge()
    torch.testing.assert_close(net[0].base_layer.weight, plain[0].base_layer.weight)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        torch.testing.assert_close(net[0](x), plain[0](x))


def test_adapter_weights_cast_at_once_give_autocast_s_values_and_gradients():
    net = _net()
    x = torch.randn(3, 10, 64, generator=torch.Generator().manual_seed(7))
    alone = _forward_backward(net, x, autocast=torch.bfloat16)
    cast = AdapterCast([net], torch.bfloat16)
    assert len(cast.layers) == 2
    with cast():
        assert all(layer.cast_weights[1].dtype == torch.bfloat16 for layer in cast.layers)
        x_ = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = net(x_)
    assert all(layer.cast_weights is None for layer in cast.layers)  # only inside the block
    y.float().pow(2).sum().backward()
    params = lora_parameters(net)
    # Bit for bit: the same roundings, once for all weights.
    assert torch.equal(y.float(), alone[0]) and torch.equal(x_.grad, alone[1])
    for param, grad in zip(params, alone[2]):
        assert param.grad.dtype == torch.float32 and torch.equal(param.grad, grad)
    # The gradients were kept as handed back: views of one buffer, no copy per weight.
    assert len({p.grad.untyped_storage().data_ptr() for p in params}) == 1


def test_a_weight_no_layer_used_keeps_no_gradient():
    net = _net()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(8))
    with AdapterCast([net], torch.bfloat16)(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = net[0](x)  # the second layer not run
    y.float().sum().backward()
    assert all(p.grad is not None for p in lora_parameters(net[0]))
    assert all(p.grad is None for p in lora_parameters(net[2]))  # as without the joint cast: AdamW skips it


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_the_output_may_be_changed_in_place_as_peft_s(autocast):
    net = _net()
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(10))
    with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        y = net[0](x)
        y.mul_(2.0)  # e.g. an attention processor scaling its query
    y.float().sum().backward()
    assert all(p.grad is not None for p in lora_parameters(net[0]))


def _with_other_adapter(net: torch.nn.Sequential) -> torch.nn.Sequential:
    """`net` whose first layer has a second adapter, "other" (its up-projection non-zero), the second layer none."""
    from peft import LoraConfig

    net[0].update_layer("other", 4, 4, config=LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian"))
    with torch.no_grad():
        net[0].lora_B["other"].weight.normal_(0, 0.5)
    return net


def test_an_adapter_switched_inside_the_cast_block_computes_with_its_own_weights():
    net = _with_other_adapter(_net())
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(11))
    with torch.no_grad(), AdapterCast([net], torch.bfloat16)(), torch.autocast("cpu", dtype=torch.bfloat16):
        net[0].set_adapter("other")
        switched = net[0](x)
    plain = _unfused(net)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = plain[0](x)
    torch.testing.assert_close(switched.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_several_active_adapters_add_each_one_s_output_as_peft_s():
    net = _with_other_adapter(_net())
    net[0].set_adapter(["default", "other"])
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(16))
    fused, plain = _forward_backward(net, x), _forward_backward(_unfused(net), x)
    assert len(fused[2]) == 6  # both adapters of the first layer are trained
    for a, b in zip([fused[0], fused[1], *fused[2]], [plain[0], plain[1], *plain[2]]):
        # float32 rounding of another summation order, relative to the tensor's scale: the gradients
        # reach 1e4 here, and an AVX2 CPU's kernels round elements near zero 1e-3 apart
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * float(b.abs().max()))


def test_a_layer_without_the_active_adapter_runs_its_base_layer_inside_the_cast_block():
    # peft's `set_adapter` makes an adapter active on layers it does not adapt: those compute their base layer.
    net = _with_other_adapter(_net())
    for layer in (net[0], net[2]):
        layer.set_adapter("other")
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(17))
    with torch.no_grad(), AdapterCast([net], torch.bfloat16)(), torch.autocast("cpu", dtype=torch.bfloat16):
        cast = net(x)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(cast, net(x), rtol=0, atol=0)  # autocast's own roundings
        hidden = net[1](net[0](x))
        torch.testing.assert_close(net[2](hidden), net[2].base_layer(hidden), rtol=0, atol=0)


def test_inputs_that_peft_treats_otherwise_take_peft_s_forward():
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(12))
    doubled = _net().double()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # autocast leaves float64 alone
        torch.testing.assert_close(doubled[0](x.double()), _unfused(doubled)[0](x.double()), rtol=0, atol=0)
        assert doubled[0](x.double()).dtype == torch.float64
    net = _net()
    net[0].base_layer.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="dtype"):  # fp32 input, bf16 base weight, no autocast: as peft, an error
        _unfused(net)[0](x)
    with pytest.raises(RuntimeError, match="dtype"):
        net[0](x)


_HOOKS = {  # (module, seen) -> a handle of a hook that appends `module` to `seen` when it runs on it
    "forward pre-hook": lambda module, seen: module.register_forward_pre_hook(lambda m, args: seen.append(m)),
    "backward pre-hook": lambda module, seen: module.register_full_backward_pre_hook(lambda m, grad: seen.append(m)),
    "global forward hook": lambda module, seen: torch.nn.modules.module.register_module_forward_hook(
        lambda m, args, out: seen.append(m) if m is module else None),
    "global forward pre-hook": lambda module, seen: torch.nn.modules.module.register_module_forward_pre_hook(
        lambda m, args: seen.append(m) if m is module else None),
    "global backward hook": lambda module, seen: torch.nn.modules.module.register_module_full_backward_hook(
        lambda m, grad_in, grad_out: seen.append(m) if m is module else None),
    "global backward pre-hook": lambda module, seen: torch.nn.modules.module.register_module_full_backward_pre_hook(
        lambda m, grad: seen.append(m) if m is module else None),
}


@pytest.mark.parametrize("hook", list(_HOOKS))
def test_every_kind_of_hook_on_an_adapter_layer_runs(hook):
    net = _net()
    down = net[0].lora_A["default"]
    seen = []
    handle = _HOOKS[hook](down, seen)
    try:
        net(torch.randn(2, 64, generator=torch.Generator().manual_seed(18), requires_grad=True)).sum().backward()
    finally:
        handle.remove()
    assert seen == [down]


def test_layers_of_other_lora_classes_keep_theirs():
    # peft's subclasses of its `Linear` (torchao's, Intel Neural Compressor's) merge otherwise, and the fused layers
    # are fused already: only peft's own `Linear` is swapped.
    from peft.tuners.lora.layer import Linear

    from gors.core.fused_lora import fuse_lora_forward

    class Subclassed(Linear):
        pass

    net = _net()
    net[2].__class__ = Subclassed
    assert fuse_lora_forward(net) == 0
    assert type(net[0]) is fused_lora_linear_class() and type(net[2]) is Subclassed


def test_a_backward_hook_on_the_base_layer_runs():
    net = _net()
    seen = []
    net[0].base_layer.register_full_backward_hook(lambda module, grad_in, grad_out: seen.append(grad_out[0].shape))
    net(torch.randn(2, 64, generator=torch.Generator().manual_seed(13), requires_grad=True)).sum().backward()
    assert seen == [torch.Size([2, 96])]


def test_a_second_derivative_is_refused_rather_than_wrong():
    net = _net()
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(14), requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = net[0](x).float().pow(2).sum()
    (grad,) = torch.autograd.grad(y, x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


def test_fused_layers_pickle_by_name(tmp_path):
    net = _net()
    torch.save(net, tmp_path / "net.pt")
    loaded = torch.load(tmp_path / "net.pt", weights_only=False)
    assert type(loaded[0]) is fused_lora_linear_class() and type(loaded[0]).__module__ == "gors.core.fused_lora"
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(15))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), net(x), rtol=0, atol=0)


def test_a_pipeline_samples_its_lora_with_fused_layers_and_peft_s_images(tiny_sd, tmp_path):
    from diffusers import UNet2DConditionModel

    from gors.core.pipeline import load_pipeline
    from gors.lora import UNET_TARGET_MODULES, save_lora

    unet = UNet2DConditionModel.from_pretrained(tiny_sd, subfolder="unet")
    add_lora(unet, UNET_TARGET_MODULES, rank=4)
    with torch.no_grad():
        for parameter in lora_parameters(unet):
            parameter.normal_(0, 0.5)
    lora = save_lora(tmp_path / "lora", {"unet": unet}).parent
    fused = load_pipeline(str(tiny_sd), torch.device("cpu"), lora=str(lora))
    assert any(isinstance(m, fused_lora_linear_class()) for m in fused.unet.modules())
    plain = load_pipeline(str(tiny_sd), torch.device("cpu"), lora=str(lora))
    plain.unet = _unfused(plain.unet)

    def images(pipeline):
        return pipeline(prompt=["a red circle"], num_inference_steps=2, height=32, width=32, output_type="np",
                        generator=torch.Generator().manual_seed(0)).images

    unloaded = load_pipeline(str(tiny_sd), torch.device("cpu"))
    assert abs(images(fused) - images(unloaded)).max() > 1e-2  # the LoRA changes the images
    assert abs(images(fused) - images(plain)).max() < 1e-5


def _peft_net(**config) -> torch.nn.Sequential:
    """One linear layer with a rank-2 adapter of peft's `LoraConfig(**config)`, fused, its LoRA weights non-zero."""
    from peft import LoraConfig, inject_adapter_in_model

    from gors.core.fused_lora import fuse_lora_forward

    torch.manual_seed(20)
    net = inject_adapter_in_model(LoraConfig(r=2, target_modules=["0"], **config),
                                  torch.nn.Sequential(torch.nn.Linear(8, 6)))
    with torch.no_grad():
        for name, parameter in net.named_parameters():
            if "lora" in name:
                parameter.normal_(0, 0.5)
    assert fuse_lora_forward(net) == 1
    return net


@pytest.mark.parametrize("config", [{"use_dora": True}, {"lora_bias": True}])
def test_dora_and_an_up_projection_bias_take_peft_s_forward(config):
    # DoRA (a LoRA variant) rescales the output and `lora_bias` adds the up-projection's bias: the fused
    # matmul computes neither, so these adapters must run peft's forward.
    net = _peft_net(**config)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(21))
    with torch.no_grad():
        torch.testing.assert_close(net(x), _unfused(net)(x), rtol=0, atol=0)


def test_per_sample_adapter_names_take_peft_s_forward():
    # `adapter_names` (peft's mixed-adapter batch) picks an adapter per sample: "__base__" rows get no LoRA.
    net = _peft_net()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(22))
    names = ["default", "__base__", "default"]
    with torch.no_grad():
        mixed = net[0](x, adapter_names=names)
        torch.testing.assert_close(mixed, _unfused(net)[0](x, adapter_names=names), rtol=0, atol=0)
        torch.testing.assert_close(mixed[1], net[0].base_layer(x[1:2])[0], rtol=1e-6, atol=1e-6)


def test_a_base_layer_with_a_forward_of_its_own_runs_it():
    # accelerate's offloading replaces a module's forward per instance, and a subclass of nn.Linear may compute
    # otherwise (e.g. diffusers' LoRACompatibleLinear): the fused path reads only the base weight, so it must not run.
    class Doubled(torch.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(23))
    net = _peft_net()
    plain = _unfused(net)
    net[0].base_layer.forward = lambda inputs: torch.zeros(*inputs.shape[:-1], 6)
    with torch.no_grad():
        expected = plain[0](x) - plain[0].base_layer(x)  # the adapter's part alone
        torch.testing.assert_close(net[0](x), expected, rtol=1e-6, atol=1e-6)
    net = _peft_net()
    base = net[0].base_layer
    net[0].base_layer = Doubled(8, 6)
    net[0].base_layer.load_state_dict(base.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(net[0](x), plain[0](x) + plain[0].base_layer(x), rtol=1e-6, atol=1e-6)
