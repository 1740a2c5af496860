"""`--torch_compile`: a `torch.compile` backend, and for inductor a mode, as one value ("BACKEND[:MODE]").

"no" leaves the models as they are; "inductor" compiles with inductor's default mode;
"inductor:reduce-overhead" (or "inductor:max-autotune") also replays each compiled graph as a CUDA
graph, so that a step at a small batch no longer waits on the host launching its kernels one by one
(benchmarks/README.md: GORS' batch of 2 per GPU leaves an H200 waiting). Other backends take no mode.
What gors does for CUDA graphs (`uses_cuda_graphs`) it does on any device, though inductor replays
graphs only on a GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a value is checked or used: the configs that check it parse without it
    import torch

NO_COMPILE = "no"
# Graphs dynamo keeps per function before it runs that function uncompiled (torch's default: 8). The modules gors
# compiles share the functions it caches by (under mixed precision accelerate's autocast wrapper of every model's
# forward; otherwise each model class's forward), and a run compiles the U-Net and the text encoder for training,
# validation and generation, with and without a LoRA, each round of `--rounds` anew: a three-round run reached 8.
RECOMPILE_LIMIT = 64


def parse_torch_compile(value: str) -> tuple[str, str | None]:
    """("inductor", "reduce-overhead") for "inductor:reduce-overhead"; (backend, None) without a mode."""
    backend, _, mode = value.partition(":")
    return backend, mode or None


def torch_compile_error(value: str) -> str | None:
    """What is wrong with a `--torch_compile` value, as a message that names the fix; None if it is usable."""
    if value == NO_COMPILE:
        return None
    from torch._dynamo import list_backends
    from torch._inductor import list_mode_options

    backend, mode = parse_torch_compile(value)
    backends = list_backends(exclude_tags=())
    if backend not in backends:
        shown = [name for name in backends if not name.endswith("_TESTING_ONLY")]  # torch's own test doubles
        return (f"--torch_compile={value!r} is not a torch.compile backend; use 'no' or one of {', '.join(shown)}, "
                "and for inductor a mode after a colon, e.g. inductor:reduce-overhead")
    modes = list(list_mode_options())  # "default" too: torch.compile's own spelling of plain inductor
    if value.endswith(":"):
        return f"--torch_compile={value!r}: no mode after the colon; use {backend!r} alone, or {backend}:MODE"
    if mode is not None and backend != "inductor":
        return (f"--torch_compile={value!r}: only inductor takes a mode; use {backend!r} alone, or "
                f"inductor:MODE with MODE one of {', '.join(modes)}")
    if mode is not None and mode not in modes:
        return f"--torch_compile={value!r}: {mode!r} is not an inductor mode; use one of {', '.join(modes)}"
    return None


def uses_cuda_graphs(value: str) -> bool:
    """Whether models compiled with this `--torch_compile` value replay as CUDA graphs on a GPU: their inputs
    are then copied into the graphs' own buffers at every call (parameters and buffers stay where they are)."""
    if value == NO_COMPILE:
        return False
    backend, mode = parse_torch_compile(value)
    if backend == "cudagraphs":
        return True
    if backend != "inductor" or mode is None:
        return False
    from torch._inductor import list_mode_options

    return bool(list_mode_options(mode).get("triton.cudagraphs", False))


def without_cuda_graphs(value: str) -> str:
    """The same compiling without CUDA graphs: "inductor" for "inductor:reduce-overhead",
    "inductor:max-autotune-no-cudagraphs" for "inductor:max-autotune", "no" for the `cudagraphs` backend."""
    if not uses_cuda_graphs(value):
        return value
    backend, mode = parse_torch_compile(value)
    if backend != "inductor":
        return NO_COMPILE
    return "inductor:max-autotune-no-cudagraphs" if mode == "max-autotune" else "inductor"


def compile_module(module: torch.nn.Module, value: str) -> None:
    """`torch.compile` the module in place as `value` says ("BACKEND[:MODE]"; "no": leave it as it is).

    In place (`nn.Module.compile`), not wrapped: its class, state-dict keys and LoRA file names stay
    the same, so saving adapters, DDP and pipelines see the module they know. Call it after the
    adapters are added: the graph is traced on the first call.

    For static shapes: a batch of another size (a run's last, shorter one) compiles once more. The
    modules compiled so share the code dynamo caches by (`Module._call_impl`, accelerate's autocast
    wrapper), so with dynamic shapes allowed a second module's first call would look like a change of
    shape and be compiled for any shape: slower kernels, and inductor's bf16 graphs on the CPU fail on it.
    Dynamo's limit of graphs per function is raised to `RECOMPILE_LIMIT` (a process-wide setting).
    """
    if value != NO_COMPILE:
        import torch._dynamo

        config = torch._dynamo.config
        limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.7's name
        setattr(config, limit, max(getattr(config, limit), RECOMPILE_LIMIT))
        backend, mode = parse_torch_compile(value)
        module.compile(backend=backend, mode=mode, dynamic=False)
