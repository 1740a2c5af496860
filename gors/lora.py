"""LoRA on a pipeline's denoiser and text encoders, saved and loaded in the diffusers format.

The Stable Diffusion targets are the official GORS ones (T2I-CompBench trained with
`lora_diffusion`): every attention projection of the U-Net (self- and cross-attention) and of the
CLIP text encoder. Other families name theirs in `gors.families`. Alpha equals the rank, so the
LoRA scale is 1 as in the released checkpoints.

A LoRA file holds one block of weights per component, prefixed by the component's name in the
pipeline (`unet.`, `transformer.`, `text_encoder.`, `text_encoder_2.`): the layout that the
family's `Pipeline.save_lora_weights` writes and `Pipeline.load_lora_weights` reads. A CLIP text
encoder's layers are named under `text_model.` as transformers 4 builds it, in Hub LoRAs and in
diffusers' loaders; transformers 5 builds `CLIPTextModel` without that wrapper, so its names get
the prefix on save and lose it on load (`TEXT_MODEL_PREFIX`).
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from gors.core.io import publish_files

UNET_TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
TEXT_ENCODER_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "out_proj")
LORA_WEIGHT_NAME = "pytorch_lora_weights.safetensors"
SD_PIPELINE = "StableDiffusionPipeline"
TEXT_MODEL_PREFIX = "text_model."


def _unwrapped_clip(module: torch.nn.Module) -> bool:
    """A `CLIPTextModel` built without its `text_model` wrapper (transformers 5)."""
    from transformers import CLIPTextModel

    return isinstance(module, CLIPTextModel) and not hasattr(module, "text_model")


def with_text_model_prefix(state: Mapping[str, torch.Tensor], module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s LoRA weights named as in a LoRA file (`text_model.encoder...` for a CLIP text encoder)."""
    prefix = TEXT_MODEL_PREFIX if _unwrapped_clip(module) else ""
    return {prefix + key: value for key, value in state.items()}


def _lora_config(rank: int, targets: Sequence[str]):
    from peft import LoraConfig

    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=list(targets))


def add_lora(module: torch.nn.Module, target_modules: Sequence[str], rank: int) -> None:
    """Inject rank-`rank` LoRA adapters into `module`; its base weights are frozen, only the adapters train.

    diffusers models take theirs through `add_adapter`; transformers models from peft directly,
    since transformers 5 refuses `PreTrainedModel.add_adapter` with current peft releases. The
    linear layers then run the fused forward (`fuse_lora_forward`).
    """
    from peft import inject_adapter_in_model

    module.requires_grad_(False)
    config = _lora_config(rank, target_modules)
    if _is_diffusers_model(module):
        module.add_adapter(config)
    else:
        inject_adapter_in_model(config, module)
    fuse_lora_forward(module)


@functools.cache
def fused_lora_linear_class() -> type:
    """`FusedLoraLinear`, built on first use: peft is imported only where LoRA is."""
    from peft.tuners.lora.layer import Linear

    class FusedLoraLinear(Linear):
        """peft's LoRA linear layer, its base and adapter matmuls one autograd operation (`_LoraLinear`).

        peft computes ``base(x) + up(down(x)) * scale`` as five operations, each a node of the autograd
        graph (and, under autocast, casts the input to the fp32 adapters and back); here the forward is
        ``addmm(base(x), down(x), up.T, alpha=scale)`` and the backward its five matmuls, the input's
        gradient summed inside the last: a step on a large GPU waits on kernel launches and on the
        autograd engine's work per node (benchmarks/README.md). The values are peft's in float32; in
        half precision the sums are rounded once instead of twice. Inside `AdapterCast`'s block the
        adapter weights come cast already. Anything else (adapters off or merged, several or variant
        adapters, dropout, a bias on the up-projection, hooks, a base layer other than `nn.Linear`,
        inputs autocast leaves alone, or mixed dtypes outside autocast) runs peft's forward.
        """

        # (adapter, down, up): the adapter's weights in the compute dtype, set by `AdapterCast` for one pass.
        cast_weights: tuple[str, torch.Tensor, torch.Tensor] | None = None

        def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            adapter = self.fusable_adapter()
            if adapter is None or args or kwargs:
                return super().forward(x, *args, **kwargs)
            cast = self.cast_weights
            down, up = (cast[1:] if cast is not None and cast[0] == adapter
                        else (self.lora_A[adapter].weight, self.lora_B[adapter].weight))
            base = self.base_layer
            if not _fusable_dtypes(x, base.weight, down):
                return super().forward(x, *args, **kwargs)
            return _LoraLinear.apply(x, base.weight, base.bias, down, up, self.scaling[adapter])

        def fusable_adapter(self) -> str | None:
            """The one adapter whose output the fused forward can add, or None."""
            if self.disable_adapters or self.merged or len(self.active_adapters) != 1:
                return None
            adapter = self.active_adapters[0]
            if adapter not in self.lora_A or adapter in self.lora_variant:
                return None
            down, up = self.lora_A[adapter], self.lora_B[adapter]
            if (not isinstance(self.lora_dropout[adapter], torch.nn.Identity) or up.bias is not None
                    or type(self.base_layer) is not torch.nn.Linear
                    or not all(_unhooked(m) for m in (down, up, self.base_layer))):
                return None
            return adapter

    FusedLoraLinear.__qualname__ = "FusedLoraLinear"  # pickled by name as `gors.lora.FusedLoraLinear`
    return FusedLoraLinear


def __getattr__(name: str) -> type:
    """`gors.lora.FusedLoraLinear`, built when first asked for (by name, or by unpickling a layer)."""
    if name == "FusedLoraLinear":
        return fused_lora_linear_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unhooked(module: torch.nn.Module) -> bool:
    """No hook of any kind would run on `module`'s call, and its forward is its class's (accelerate's
    offloading hooks replace it per instance): a fused forward that reads its weights skips nothing."""
    from torch.nn.modules import module as torch_module

    hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks,
             torch_module._global_forward_hooks, torch_module._global_forward_pre_hooks,
             torch_module._global_backward_hooks, torch_module._global_backward_pre_hooks)
    return not any(hooks) and "forward" not in module.__dict__ and not hasattr(module, "_hf_hook")


_AUTOCAST_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def _fusable_dtypes(x: torch.Tensor, weight: torch.Tensor, down: torch.Tensor) -> bool:
    """Under autocast, any input autocast itself would cast; outside it, one dtype for the input and both
    weights (peft casts a half-precision input to fp32 adapters, or refuses mixed dtypes: its forward does)."""
    if torch.is_autocast_enabled(x.device.type):
        return x.dtype in _AUTOCAST_INPUTS
    return x.dtype == weight.dtype == down.dtype


def fuse_lora_forward(module: torch.nn.Module) -> int:
    """Give `module`'s peft LoRA linear layers `FusedLoraLinear`'s forward (`fused_lora_linear_class`);
    returns how many.

    Only the forward changes (the class is swapped in place): weights, names, saving, loading and
    merging stay peft's. Layers of other LoRA classes (convolutions, embeddings, quantised linears) keep theirs.
    """
    from peft.tuners.lora.layer import Linear

    layers = [layer for layer in module.modules() if type(layer) is Linear]
    for layer in layers:
        layer.__class__ = fused_lora_linear_class()
    return len(layers)


def _is_diffusers_model(module: torch.nn.Module) -> bool:
    from diffusers import ModelMixin

    return isinstance(module, ModelMixin)


@contextmanager
def adapters_disabled(*modules: torch.nn.Module) -> Iterator[None]:
    """Run `modules` as their base models: every LoRA layer in them off inside the block, on again after."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [layer for module in modules for layer in module.modules() if isinstance(layer, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class _LoraLinear(torch.autograd.Function):
    """``x @ weight.T + bias + scale * (x @ down.T) @ up.T`` as one autograd operation, in the compute
    dtype: autocast's half dtype where it is on, else the input's (the weights must have it)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, down: torch.Tensor,
                up: torch.Tensor, scale: float) -> torch.Tensor:
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        x2, weight, down, up = (t.to(dtype) for t in (x.reshape(-1, x.shape[-1]), weight, down, up))
        hidden = x2 @ down.t()
        # Written into a tensor of the output's shape, so that the output is no view (callers may change it in place).
        out = torch.empty(*x.shape[:-1], weight.shape[0], dtype=dtype, device=x.device)
        flat = out.view(-1, weight.shape[0])
        if bias is None:
            torch.mm(x2, weight.t(), out=flat)
        else:
            torch.addmm(bias.to(dtype), x2, weight.t(), out=flat)
        flat.addmm_(hidden, up.t(), alpha=scale)
        ctx.save_for_backward(x2, weight, down, up, hidden)
        ctx.scale, ctx.shape, ctx.bias_dtype = scale, x.shape, None if bias is None else bias.dtype
        return out

    @staticmethod
    @once_differentiable  # the casts inside the forward are not recorded: a second derivative would miss them
    def backward(ctx, grad: torch.Tensor):
        x2, weight, down, up, hidden = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad = grad.reshape(-1, grad.shape[-1]).to(x2.dtype)
        grad_hidden = _scaled(torch.mm(grad, up), ctx.scale) if needs[0] or needs[3] else None
        grad_x = torch.addmm(grad @ weight, grad_hidden, down).view(ctx.shape) if needs[0] else None
        grad_weight = grad.t() @ x2 if needs[1] else None
        grad_bias = grad.sum(0).to(ctx.bias_dtype) if needs[2] else None
        grad_down = grad_hidden.t() @ x2 if needs[3] else None
        grad_up = _scaled(torch.mm(grad.t(), hidden), ctx.scale) if needs[4] else None
        return grad_x, grad_weight, grad_bias, grad_down, grad_up, None


def _scaled(tensor: torch.Tensor, scale: float) -> torch.Tensor:
    return tensor if scale == 1.0 else tensor.mul_(scale)


class _CastTogether(torch.autograd.Function):
    """Tensors cast to a dtype as one: a concatenation and one cast each way, instead of a cast per tensor.

    The values and gradients are those of casting each (an elementwise rounding either way); the
    outputs are views of one tensor, and so are the gradients handed back, which autograd keeps as
    the parameters' `.grad` without copying them.
    """

    @staticmethod
    def forward(ctx, dtype: torch.dtype, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.shapes, ctx.dtype = [t.shape for t in tensors], tensors[0].dtype
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not zeros
        return _split(torch.cat([t.reshape(-1) for t in tensors]).to(dtype), ctx.shapes)

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads: torch.Tensor | None):
        # A weight no layer used keeps no gradient (None), as with a cast of its own: AdamW skips it.
        used = [i for i, g in enumerate(grads) if g is not None]
        if not used:
            return None, *grads
        parts = _split(torch.cat([grads[i].reshape(-1) for i in used]).to(ctx.dtype), [ctx.shapes[i] for i in used])
        back: list[torch.Tensor | None] = [None] * len(grads)
        for i, part in zip(used, parts):
            back[i] = part
        return None, *back


def _split(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> tuple[torch.Tensor, ...]:
    return tuple(part.view(shape) for part, shape in zip(flat.split([s.numel() for s in shapes]), shapes))


class AdapterCast:
    """The fused LoRA layers of some modules, whose fp32 adapter weights a half-precision pass under
    autocast casts once for all layers (`with cast():` around the pass) instead of once per weight.

    Autocast casts each adapter weight at its use, and its gradient back: two operations per weight
    and pass, 880 of an SD 2 training step with both LoRAs. The same roundings happen in one
    concatenated cast each way, so the values and gradients are autocast's own. Outside the block
    (a gradient-checkpointed layer recomputed in the backward, validation) the layers cast as before.

    All gradients of the block's adapters arrive together, at the end of the backward. Under DDP
    that means no all-reduce overlaps the backward (the adapters' gradients are a few megabytes),
    and a weight no layer used reaches DDP's hook without a gradient: with `find_unused_parameters`
    (which gors turns on for the families that have such layers) it stays without one, as it would
    with a cast per weight; without it DDP takes it as zero instead of raising its unused-parameter error.
    """

    def __init__(self, modules: Sequence[torch.nn.Module], dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.layers = [layer for module in modules for layer in module.modules()
                       if isinstance(layer, fused_lora_linear_class())]

    @contextmanager
    def __call__(self) -> Iterator[None]:
        layers = [(layer, adapter) for layer in self.layers if (adapter := layer.fusable_adapter()) is not None]
        if not layers:
            yield
            return
        weights = [w for layer, adapter in layers for w in (layer.lora_A[adapter].weight, layer.lora_B[adapter].weight)]
        cast = _CastTogether.apply(self.dtype, *weights)
        for i, (layer, adapter) in enumerate(layers):
            layer.cast_weights = (adapter, cast[2 * i], cast[2 * i + 1])
        try:
            yield
        finally:
            for layer, _ in layers:
                layer.cast_weights = None


def lora_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for name, p in module.named_parameters() if "lora_" in name and p.requires_grad]


def _pipeline_class(name: str):
    import diffusers

    return getattr(diffusers, name)


def save_lora(save_dir: str | Path, modules: Mapping[str, torch.nn.Module], pipeline_class: str = SD_PIPELINE,
              peft_names: bool = False) -> Path:
    """Write `pytorch_lora_weights.safetensors` with the adapters of `modules` (component name -> module),
    as `pipeline_class.load_lora_weights` reads it.

    `peft_names`: keep peft's weight names (`lora_A`/`lora_B`), as diffusers' SD3 and FLUX scripts
    save; otherwise diffusers' older names (`lora.down`/`lora.up`), as its SD and SDXL scripts save.
    """
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
        state = get_peft_model_state_dict(module)
        return with_text_model_prefix(state if peft_names else convert_state_dict_to_diffusers(state), module)

    layers = {f"{name}_lora_layers": weights(module) for name, module in modules.items()}
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    for stale in save_dir.glob(".lora-*"):  # left by a save killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    # Written beside and then moved in, so a kill mid-write leaves the previous LoRA whole.
    with tempfile.TemporaryDirectory(dir=save_dir, prefix=".lora-") as staging:
        _pipeline_class(pipeline_class).save_lora_weights(staging, **layers)
        publish_files(staging, save_dir)
    return save_dir / LORA_WEIGHT_NAME


def load_lora(load_dir: str | Path, modules: Mapping[str, torch.nn.Module], pipeline_class: str = SD_PIPELINE) -> None:
    """Load a diffusers-format LoRA into modules that already carry adapters (see `add_lora`).

    Every adapter weight of `modules` must come from the file and every weight of the file must
    find its adapter: a `ValueError` names the first ones otherwise (peft alone would skip them).
    """
    from diffusers.utils import (
        convert_state_dict_to_diffusers,
        convert_state_dict_to_peft,
        convert_unet_state_dict_to_peft,
    )
    from peft.utils import set_peft_model_state_dict

    loaded = _pipeline_class(pipeline_class).lora_state_dict(str(load_dir))
    state_dict = loaded[0] if isinstance(loaded, tuple) else loaded  # some mixins also return the alphas

    for name, module in modules.items():
        prefix = f"{name}."
        part = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
        if not part:
            raise ValueError(f"{load_dir} has no LoRA weights for the {name}; it was saved by a run that did not "
                             f"train it")
        if _is_diffusers_model(module):
            converted = convert_unet_state_dict_to_peft(part)
        else:
            if _unwrapped_clip(module):
                part = {key.removeprefix(TEXT_MODEL_PREFIX): value for key, value in part.items()}
            converted = convert_state_dict_to_peft(convert_state_dict_to_diffusers(part))
        result = set_peft_model_state_dict(module, converted, adapter_name="default")
        missing = [key for key in result.missing_keys if "lora_" in key]
        if result.unexpected_keys or missing:
            found = ", ".join(f"{what} {keys[0]} ({len(keys)} in all)"
                              for what, keys in (("unexpected", result.unexpected_keys), ("missing", missing)) if keys)
            raise ValueError(f"{load_dir}: its {name} LoRA does not fit the {name}'s adapters: {found}. It was "
                             "saved for another model, other LoRA targets or another layer naming.")
