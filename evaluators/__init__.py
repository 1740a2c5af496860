"""Benchmarks as registered tasks: prompts, generation protocol, scorer and aggregation.

`evaluators.get_benchmark("toy", split="held_out")` builds one; `Benchmark.evaluate` runs it on
any checkpoint (with an optional LoRA).
"""

from __future__ import annotations

import importlib
from typing import Any

from evaluators.base import Benchmark

_BENCHMARKS = {
    "geneval": "evaluators.geneval:GenEvalBenchmark",
    "geneval2": "evaluators.geneval2:GenEval2Benchmark",
    "lpg_bench": "evaluators.lpg_bench:LPGBenchBenchmark",
    "t2i_compbench": "evaluators.t2i_compbench:T2ICompBenchBenchmark",
    "toy": "evaluators.toy:ToyBenchmark",
}


def available_benchmarks() -> list[str]:
    return sorted(_BENCHMARKS)


def get_benchmark(name: str, **kwargs: Any) -> Benchmark:
    if name not in _BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; known: {', '.join(available_benchmarks())}")
    module, _, cls = _BENCHMARKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)


__all__ = ["Benchmark", "available_benchmarks", "get_benchmark"]
