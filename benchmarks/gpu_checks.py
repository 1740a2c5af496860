"""Checks of the paths only a CUDA device exercises for real, in seconds (not speed measurements).

The test suite runs these paths on a CPU, where torch raises no real out-of-memory error, copies
never overlap and no loss scaler runs. On a GPU this script checks:

1. `gors.core.memory.in_batches_that_fit` meets a real CUDA out-of-memory error (a batch whose work
   allocates more than the device holds), halves, goes on, and leaves the device's allocated memory
   where it was (the failed attempt's tensors released before the retry).
   `largest_that_fits` (`--auto_train_batch_size`'s trial steps) does the same with sizes largest first.
2. `gors.core.transfer.to_device` and `HostValue` copy the right values without a host-device
   synchronisation (torch's sync debug mode set to "error" around them).
3. `gors.train.Updates` under a real fp16 `GradScaler` and fused AdamW, with an overflow injected:
   the same learning rates and weights as deciding right after each update (the plain path: read the
   scale at once), and no synchronisation in its updates.
4. The fused LoRA layers (`gors.core.fused_lora.FusedLoraLinear`) trained under fp16 autocast with a
   `GradScaler` and fused AdamW: with their weights cast at once (`AdapterCast`, whose gradients are
   views of one buffer) the same adapters bit for bit as with a cast per weight, the same as peft's
   layers up to fp16 rounding, and no synchronisation in a pass.

    python benchmarks/gpu_checks.py               # one PASS/FAIL line per check; exit status 1 on a failure
    python benchmarks/gpu_checks.py --device cpu  # checks 2 and 3 without their GPU parts (a dry run)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
from collections.abc import Iterator

import torch

from gors.core.memory import in_batches_that_fit, largest_that_fits
from gors.core.transfer import HostValue, to_device


@contextlib.contextmanager
def no_syncs(device: torch.device, enabled: bool = True) -> Iterator[None]:
    """A host-device synchronisation inside is an error (CUDA only)."""
    if device.type != "cuda" or not enabled:
        yield
        return
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def check_out_of_memory_halving(device: torch.device) -> str:
    """A batch of 4 items of 2/5 of the free memory each fails at its third, holding 4/5; the batches of
    2 after it fit only if those blocks were released before the retry."""
    free, _ = torch.cuda.mem_get_info(device)
    item_bytes = free * 2 // 5
    done: list[list[int]] = []

    def work(batch: list[int]) -> None:
        blocks = [torch.ones(item_bytes, dtype=torch.uint8, device=device) for _ in batch]
        done.append(batch)
        del blocks

    before = torch.cuda.memory_allocated(device)
    size = in_batches_that_fit(list(range(4)), 4, work, "checking", "items per call", None, "none")
    after = torch.cuda.memory_allocated(device)
    if done != [[0, 1], [2, 3]] or size != 2 or after != before:
        raise AssertionError(f"batches {done}, size {size}, allocated {before} -> {after} bytes")
    return (f"4 items of {item_bytes / 2**30:.1f} GiB failed at the third, halved to batches of 2 that fit; "
            f"allocated memory back to {before} bytes")


def check_largest_size_that_fits(device: torch.device) -> str:
    """Sizes 4, 2, 1 of items of 2/5 of the free memory each: 4 fails at its third, 2 fits, if the failed
    try's blocks were released before it."""
    free, _ = torch.cuda.mem_get_info(device)
    item_bytes = free * 2 // 5
    tried: list[int] = []

    def attempt(size: int) -> None:
        tried.append(size)
        blocks = [torch.ones(item_bytes, dtype=torch.uint8, device=device) for _ in range(size)]
        del blocks

    before = torch.cuda.memory_allocated(device)
    size = largest_that_fits([4, 2, 1], attempt, "checking")
    after = torch.cuda.memory_allocated(device)
    if tried != [4, 2] or size != 2 or after != before:
        raise AssertionError(f"tried {tried}, size {size}, allocated {before} -> {after} bytes")
    return f"4 items of {item_bytes / 2**30:.1f} GiB did not fit, 2 did; allocated memory back to {before} bytes"


def check_copies_without_syncs(device: torch.device) -> str:
    """A gathered host tensor to the device and a device sum back, queued without a synchronisation."""
    host = torch.arange(1000, dtype=torch.float32)
    with no_syncs(device):
        moved = to_device(host[torch.arange(0, 1000, 7)], device)
        total = HostValue((moved * 2).sum())
    expected = float((torch.arange(0, 1000, 7, dtype=torch.float32) * 2).sum())
    if total.get().item() != expected:
        raise AssertionError(f"sum {total.get().item()} != {expected}")
    if device.type != "cuda":
        return "values exact (synchronisations not checked off CUDA)"
    return "to_device and HostValue queued without a synchronisation; values exact"


def check_deferred_lr_decision(device: torch.device) -> str:
    """`Updates` against reading the loss scale at once, with overflows injected: same rates and weights."""
    from accelerate.optimizer import AcceleratedOptimizer
    from accelerate.scheduler import AcceleratedScheduler
    from diffusers.optimization import get_scheduler

    from gors.core.distributed import make_accelerator, reset_process_state
    from gors.train import Updates

    reset_process_state()
    make_accelerator()  # the process state Accelerate's wrappers read (the scaler here is the check's own)
    torch.manual_seed(0)
    base = torch.nn.Linear(64, 64, device=device)
    overflows = (False, True, False, False, True, False)

    def run(deferred: bool) -> tuple[list[float], torch.Tensor]:
        model = copy.deepcopy(base)
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)  # overflowing only where injected
        inner = torch.optim.AdamW(model.parameters(), lr=1.0, fused=True)
        optimizer = AcceleratedOptimizer(inner, scaler=scaler)
        scheduler = AcceleratedScheduler(get_scheduler("linear", optimizer=inner, num_warmup_steps=0,
                                                       num_training_steps=10), optimizer)
        updates, used = Updates(optimizer, scheduler), []
        for step, overflow in enumerate(overflows):
            x = torch.ones(4, 64, device=device)
            with torch.autocast(device.type, dtype=torch.float16):
                loss = model(x).float().sum() * (float("inf") if overflow else 1.0)
            scaler.scale(loss).backward()
            if deferred:
                with no_syncs(device, enabled=step > 0):  # the first update makes the optimizer's state
                    updates.step(scaler, update=True)
                used.append(updates.lrs[0])
            else:  # the plain path: the scale read at once, before and after the step
                used.append(scheduler.get_last_lr()[0])
                scale = scaler.get_scale()
                optimizer.step()
                if scaler.get_scale() >= scale:
                    scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        updates.settle()
        return used, model.weight.detach().clone()

    try:
        plain, deferred = run(False), run(True)
    finally:
        reset_process_state()
    # Linear decay by 0.1 per update that was not skipped, each update at the rate before its own step.
    expected = [round(1.0 - 0.1 * sum(not o for o in overflows[:k]), 6) for k in range(len(overflows))]
    if [round(lr, 6) for lr in deferred[0]] != expected or plain[0] != deferred[0]:
        raise AssertionError(f"learning rates {deferred[0]} (deferred), {plain[0]} (plain), expected {expected}")
    if not torch.equal(plain[1], deferred[1]):
        raise AssertionError("the weights after the plain and the deferred updates differ")
    syncs = "no synchronisation in its updates" if device.type == "cuda" else "synchronisations not checked off CUDA"
    return f"learning rates {expected} with overflows at {overflows}, as the plain path's; weights equal; {syncs}"


def check_fused_lora_layers(device: torch.device) -> str:
    """Three fp16 (bf16 off CUDA) training steps of a LoRA'd two-layer net: joint cast, cast per weight, peft."""
    from peft.tuners.lora.layer import Linear

    from gors.core.fused_lora import AdapterCast, fused_lora_linear_class
    from gors.lora import add_lora, lora_parameters

    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).to(device)
    add_lora(base, ["0", "2"], rank=4)
    for parameter in lora_parameters(base):
        parameter.data.normal_(0, 0.1)
    base[0].base_layer.to(dtype)  # frozen weights in half precision, adapters in fp32, as training holds them
    base[2].base_layer.to(dtype)
    inputs = torch.randn(3, 2, 77, 64, device=device)

    def train(layers: str) -> list[torch.Tensor]:
        model = copy.deepcopy(base)
        if layers == "peft":
            for layer in model.modules():
                if isinstance(layer, fused_lora_linear_class()):
                    layer.__class__ = Linear
        cast = AdapterCast([model], dtype) if layers == "joint" else None
        scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
        optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-2, fused=True)
        for step, x in enumerate(inputs):
            with no_syncs(device, enabled=step > 0 and layers != "peft"):
                with cast() if cast else contextlib.nullcontext(), torch.autocast(device.type, dtype=dtype):
                    loss = model(x).float().pow(2).mean()
                scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        return [p.detach().clone() for p in lora_parameters(model)]

    joint, each, peft = train("joint"), train("each"), train("peft")
    if not all(torch.equal(a, b) for a, b in zip(joint, each)):
        raise AssertionError("the adapters trained with their weights cast at once differ from a cast per weight")
    distance = max(((a - b).norm() / b.norm()).item() for a, b in zip(each, peft))
    if distance > 5e-2:
        raise AssertionError(f"the fused layers trained adapters {distance:.1e} (relative) from peft's layers'")
    syncs = "no synchronisation in a pass" if device.type == "cuda" else "synchronisations not checked off CUDA"
    return (f"joint cast equal to a cast per weight bit for bit; {distance:.1e} (relative) from peft's layers "
            f"after 3 {str(dtype).removeprefix('torch.')} steps; {syncs}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="gpu_checks.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    device = torch.device(parser.parse_args().device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_checks.py: no CUDA device here; --device cpu runs the checks that do not need one")
    checks = [check_copies_without_syncs, check_deferred_lr_decision, check_fused_lora_layers]
    if device.type == "cuda":
        checks[:0] = [check_out_of_memory_halving, check_largest_size_that_fits]
    failed = False
    for check in checks:
        try:
            print(f"PASS {check.__name__}: {check(device)}", flush=True)
        except Exception as err:  # every check runs; the exit status says whether one failed
            failed = True
            print(f"FAIL {check.__name__}: {type(err).__name__}: {err}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
