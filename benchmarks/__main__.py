"""`python -m benchmarks` (or `make bench`): every speed script, one markdown table.

Each script's `measure(argv)` times gors against the reference procedure as the official code runs
it (see the script's docstring) and returns its rows; this runs them in turn with the same device
flags and writes the table with the date and the machine, as benchmarks/README.md's speed table shows it.

    python -m benchmarks                                   # CPU, reduced sizes (under 15 minutes on 2 cores)
    python -m benchmarks --device cuda --full-size         # the real architecture sizes on a GPU
    python -m benchmarks --device cuda --full-size --torch_compile inductor
    python -m benchmarks --only b_vqa_passes,mask_boxes --output speed.md   # and speed.json, the rows as data
    python -m benchmarks --device cuda --full-size --only train_step --gors_batch_size 16 --output train16.md
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# The scripts import each other's helpers as top-level modules, as they do when run by path.
sys.path.insert(0, str(HERE))

from common import TABLE_HEADER, SpeedResult, machine  # noqa: E402

SCRIPTS = ("b_vqa_passes", "soft_tifa_one_pass", "mllm_cot", "train_step", "generation", "overlap", "mask_boxes")
# On the CPU, generation runs at train_step's reduced sizes (the tiny default measures Python), shortened;
# MLLM-CoT's three procedures take two timed rotations, so that all scripts end within 15 minutes on 2 cores.
CPU_FLAGS = {"generation": ["--reduced", "--steps", "10", "--repeats", "3"], "mllm_cot": ["--repeats", "2"]}
COMPILING = ("train_step", "generation")  # the scripts whose gors side takes --torch_compile


def run(scripts: list[str], device: str, full_size: bool, torch_compile: str = "no",
        gors_batch_size: int | None = None) -> tuple[list[SpeedResult], dict[str, float]]:
    """Every script's rows and its wall seconds."""
    flags = ["--device", device] + (["--full-size"] if full_size else [])
    results, seconds = [], {}
    for name in scripts:
        start = time.perf_counter()
        module = importlib.import_module(name)
        extra = [] if full_size else CPU_FLAGS.get(name, [])
        if torch_compile != "no" and name in COMPILING:
            extra += ["--torch_compile", torch_compile]
        if gors_batch_size is not None and name == "train_step":
            extra += ["--gors_batch_size", str(gors_batch_size)]
        results += module.measure(flags + extra)
        seconds[name] = time.perf_counter() - start
        print(f"[bench] {name}: {seconds[name]:.0f} s", file=sys.stderr)
    return results, seconds


def table(results: list[SpeedResult], seconds: dict[str, float], device: str, full_size: bool) -> str:
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    sizes = "the real architecture sizes" if full_size else "reduced sizes (see each row)"
    lines = [f"Measured {when} on {machine(device)}, {sizes}; ratios are reference time / gors time of "
             "interleaved runs.", "", TABLE_HEADER, *(r.row() for r in results), "",
             f"Wall time: {', '.join(f'{k} {v:.0f} s' for k, v in seconds.items())}."]
    return "\n".join(lines)


def table_data(results: list[SpeedResult], seconds: dict[str, float], device: str, full_size: bool) -> dict[str, Any]:
    """The table as data, written beside it: `cost_model.py --speedups` reads the ratios that price its stages."""
    return {"machine": machine(device), "full_size": full_size, "seconds": seconds,
            "rows": [result.as_dict() for result in results]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--full-size", action="store_true", help="the real architecture sizes (a GPU)")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {', '.join(SCRIPTS)}")
    parser.add_argument("--output", default=None, help="also write the table to this markdown file")
    parser.add_argument("--torch_compile", default="no",
                        help=f"gors' torch.compile backend in {' and '.join(COMPILING)} (e.g. inductor on a GPU)")
    parser.add_argument("--gors_batch_size", type=int, default=None,
                        help="train_step's gors batch per process for a per-sample row against GORS' 2 (it then "
                             "prices `cost_model.py --train_batch_size` of the same size)")
    args = parser.parse_args(argv)
    scripts = SCRIPTS if args.only is None else args.only.split(",")
    unknown = sorted(set(scripts) - set(SCRIPTS))
    if unknown:
        parser.error(f"--only: unknown {unknown}; choose from {', '.join(SCRIPTS)}")
    if args.output and Path(args.output).suffix == ".json":
        parser.error("--output: name the markdown table (e.g. speed.md); its rows go beside it as speed.json")
    results, seconds = run(list(scripts), args.device, args.full_size, args.torch_compile, args.gors_batch_size)
    text = table(results, seconds, args.device, args.full_size)
    print(text)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
        data = table_data(results, seconds, args.device, args.full_size)
        Path(args.output).with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
