"""Benchmarks as registered tasks: prompts, generation protocol, scorer and aggregation.

`evaluators.get_benchmark("toy", split="held_out")` builds one; `Benchmark.evaluate` runs it on
any checkpoint (with an optional LoRA).
"""

from __future__ import annotations

import importlib
from typing import Any

from evaluators.base import Benchmark
from gors.core import paper

_BENCHMARKS = {
    "geneval": "evaluators.geneval:GenEvalBenchmark",
    "geneval2": "evaluators.geneval2:GenEval2Benchmark",
    "lpg_bench": "evaluators.lpg_bench:LPGBenchBenchmark",
    "t2i_compbench": "evaluators.t2i_compbench:T2ICompBenchBenchmark",
    "toy": "evaluators.toy:ToyBenchmark",
}


def available_benchmarks() -> list[str]:
    return sorted(_BENCHMARKS)


def benchmark_class(name: str) -> type[Benchmark]:
    if name not in _BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; known: {', '.join(available_benchmarks())}")
    module, _, cls = _BENCHMARKS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def get_benchmark(name: str, **kwargs: Any) -> Benchmark:
    return benchmark_class(name)(**kwargs)


# What "all" and a bare "t2i_compbench" stand for in a benchmark spec.
ALL_BENCHMARKS = ("t2i_compbench", "geneval", "geneval2", "lpg_bench")


def parse_benchmarks(spec: str) -> list[tuple[str, str | None]]:
    """``"all" | "t2i_compbench[:color,shape]" | "geneval,toy:train" ...`` -> [(benchmark, subset), ...].

    Items are comma-separated; after ``name:subset``, further items that are not benchmark names
    are more subsets of the same benchmark (``t2i_compbench:color,shape,geneval``). A bare
    ``t2i_compbench`` means all of its categories.
    """
    items = [item.strip() for item in spec.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--benchmarks={spec!r}: name at least one of all, {', '.join(available_benchmarks())}")
    parsed: list[tuple[str, str | None]] = []
    current: str | None = None
    for item in items:
        name, sep, subset = item.partition(":")
        if item == "all":
            parsed += [(b, None) for b in ALL_BENCHMARKS]
            current = None
        elif name in _BENCHMARKS:
            parsed.append((name, subset or None) if sep else (name, None))
            current = name if sep else None
        elif current is not None and not sep:
            parsed.append((current, item))
        else:
            raise ValueError(
                f"--benchmarks={spec!r}: unknown benchmark {item!r}; known: all, {', '.join(available_benchmarks())}"
            )
    expanded = []
    for name, subset in parsed:
        if name == "t2i_compbench" and subset is None:
            expanded += [(name, category) for category in paper.ALL_CATEGORIES]
        else:
            expanded.append((name, subset))
    return list(dict.fromkeys(expanded))


def build_benchmark(name: str, subset: str | None = None, **kwargs: Any) -> Benchmark:
    """One benchmark, its subset set on the class's `subset_field`; None-valued kwargs are dropped."""
    cls = benchmark_class(name)
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    if subset is not None:
        if cls.subset_field is None:
            raise ValueError(f"benchmark {name!r} has no subsets; drop ':{subset}'")
        kwargs[cls.subset_field] = subset
    return cls(**kwargs)


def benchmark_label(name: str, subset: str | None) -> str:
    return name if subset is None else f"{name}:{subset}"


__all__ = [
    "Benchmark",
    "available_benchmarks",
    "benchmark_label",
    "build_benchmark",
    "get_benchmark",
    "parse_benchmarks",
]
