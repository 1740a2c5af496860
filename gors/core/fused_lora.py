"""Fused LoRA linear layers: peft's layers with their base and adapter matmuls as one autograd operation,
and the adapter weights of a half-precision pass cast at once.

A training step at GORS' batch of 2 on a large GPU waits on kernel launches and on the autograd
engine's work per node (benchmarks/README.md), and peft's LoRA layers were most of what a step
dispatched beyond the models' own forward and backward. The layers keep peft's weights, names and
files: only their forward changes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch.autograd.function import once_differentiable


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
    and a weight no layer used reaches DDP's hook without a gradient. DDP then gives it a zero gradient,
    as it does with a cast per weight to a LoRA layer that runs but whose output the loss does not read
    (SDXL's last CLIP-L layer; gors turns `find_unused_parameters` on for such encoders), where one
    process leaves it none: AdamW's weight decay alone steps it (tested, fp32 and bf16), and its output
    unused, the LoRA acts the same. Without `find_unused_parameters` DDP would take it as zero too,
    instead of raising its unused-parameter error.
    """

    def __init__(self, modules: Sequence[torch.nn.Module], dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.layers = [layer for module in modules for layer in module.modules()
                       if isinstance(layer, fused_lora_linear_class())]

    @contextmanager
    def __call__(self) -> Iterator[None]:
        # The active adapter of each layer that has one; the layer's forward decides whether it fuses (a cast
        # weight it does not use gets no gradient).
        layers = [(layer, layer.active_adapters[0]) for layer in self.layers
                  if len(layer.active_adapters) == 1 and layer.active_adapters[0] in layer.lora_A]
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

    FusedLoraLinear.__qualname__ = "FusedLoraLinear"  # pickled by name, as `gors.core.fused_lora.FusedLoraLinear`
    return FusedLoraLinear


def __getattr__(name: str) -> type:
    """`FusedLoraLinear`, built when first asked for (by name, or by unpickling a layer)."""
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
