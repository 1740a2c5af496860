"""Benchmarks as registered tasks: prompts, generation protocol, scorer and aggregation.

`evaluators.get_benchmark("toy", split="held_out")` builds one; `Benchmark.evaluate` runs it on
any checkpoint (with an optional LoRA). Name -> class, as for rewards (`rewards.registry`): the
built-in table below, the `@register_benchmark` decorator, and the `gors.benchmarks` entry-point
group of installed packages, e.g. in a plugin's pyproject.toml:

    [project.entry-points."gors.benchmarks"]
    my_benchmark = "my_package.benchmarks:MyBenchmark"
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import Counter
from collections.abc import Callable, Mapping
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from evaluators.base import Benchmark, BenchmarkPrompt, check_benchmark_class
from evaluators.results import Metric
from gors.core import paper
from rewards.registry import (
    check_entry_point_name,
    check_name,
    declared_entry_points,
    entry_point_path,
    import_class,
    import_error,
    is_missing,
)

_BENCHMARKS = {
    "geneval": "evaluators.geneval:GenEvalBenchmark",
    "geneval2": "evaluators.geneval2:GenEval2Benchmark",
    "lpg_bench": "evaluators.lpg_bench:LPGBenchBenchmark",
    "t2i_compbench": "evaluators.t2i_compbench:T2ICompBenchBenchmark",
    "toy": "evaluators.toy:ToyBenchmark",
}
_REGISTERED: dict[str, type[Benchmark]] = {}
ENTRY_POINT_GROUP = "gors.benchmarks"


def register_benchmark(name: str) -> Callable[[type[Benchmark]], type[Benchmark]]:
    """Class decorator that makes a `Benchmark` subclass available as `name` (its `name` is set too)."""

    def decorator(cls: type[Benchmark]) -> type[Benchmark]:
        if not (isinstance(cls, type) and issubclass(cls, Benchmark)):
            raise ValueError(f"@register_benchmark({name!r}) expects a Benchmark subclass, got {cls!r}")
        check_name("benchmark", name, cls, _REGISTERED.get(name), name in _BENCHMARKS)
        check_benchmark_class(cls)
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return decorator


def available_benchmarks() -> list[str]:
    """Names of the built-in, registered and entry-point benchmarks, sorted."""
    return sorted(set(_BENCHMARKS) | set(_REGISTERED) | set(declared_entry_points(ENTRY_POINT_GROUP)))


def benchmark_class(name: str) -> type[Benchmark]:
    """The `Benchmark` subclass of a name (importing its module), checked; unknown names are refused."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    plugin = entry_point_path("benchmark", name, ENTRY_POINT_GROUP, _BENCHMARKS)  # None for gors' own
    path = _BENCHMARKS.get(name) or plugin
    if path is None:
        raise ValueError(f"Unknown benchmark {name!r}; known: {', '.join(available_benchmarks())}. A benchmark of "
                         "your own is known once the module that registers it is imported (from Python), or, on "
                         "the command line, as an entry point of the gors.benchmarks group")
    module, _, cls = path.partition(":")
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as err:
        if name in _BENCHMARKS:  # gors' own: a broken install, with its traceback
            raise
        raise import_error(name, path, err, "benchmark") from err
    if not (isinstance(found, type) and issubclass(found, Benchmark)):
        raise ValueError(f"benchmark {name!r} ({path}) is not a Benchmark subclass")
    check_benchmark_class(found)
    if plugin is not None:
        check_entry_point_name("benchmark", name, found, path)
    return _named(found, name)


_NAMED: dict[tuple[type[Benchmark], str], type[Benchmark]] = {}


def _named(cls: type[Benchmark], name: str) -> type[Benchmark]:
    """`cls` where it carries `name` as its own; else a subclass of it that does, made once per name:
    summaries, folders and validation's best.json file a benchmark by its class's `name`, and a class
    without one of its own (an undecorated subclass, one in the built-in table) would give its parent's
    or none. The class itself is left as it is, so that each name it is reached by keeps its own."""
    if vars(cls).get("name") == name:
        return cls
    if (cls, name) not in _NAMED:
        _NAMED[cls, name] = type(cls.__name__, (cls,), {"name": name, "__module__": cls.__module__,
                                                       "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return _NAMED[cls, name]


def get_benchmark(name: str, **kwargs: Any) -> Benchmark:
    """An instance of the named benchmark, built with its options `kwargs`."""
    return benchmark_class(name)(**kwargs)


# What "all" and a bare "t2i_compbench" stand for in a benchmark spec.
ALL_BENCHMARKS = ("t2i_compbench", "geneval", "geneval2", "lpg_bench")


def parse_benchmarks(spec: str, flag: str = "--benchmarks") -> list[tuple[str, str | None]]:
    """``"all" | "t2i_compbench[:color,shape]" | "geneval,toy:train" ...`` -> [(benchmark, subset), ...].

    Items are comma-separated; after ``name:subset``, further items that are not benchmark names
    are more subsets of the same benchmark (``t2i_compbench:color,shape,geneval``). A bare
    ``t2i_compbench`` means all of its categories. `flag`: the option that gave `spec`, for messages
    (`--benchmarks`, which alone takes ``all``).
    """
    items = [item.strip() for item in spec.split(",") if item.strip()]
    known_names = ", ".join(["all"] * (flag == "--benchmarks") + available_benchmarks())
    if not items:
        raise ValueError(f"{flag}={spec!r}: name at least one of {known_names}")
    parsed: list[tuple[str, str | None]] = []
    current: str | None = None
    known = set(available_benchmarks())
    for item in items:
        name, sep, subset = item.partition(":")
        if item == "all":
            parsed += [(b, None) for b in ALL_BENCHMARKS]
            current = None
        elif name in known:
            parsed.append((name, subset or None) if sep else (name, None))
            current = name if sep else None
        elif current is not None and not sep:
            parsed.append((current, item))
        elif (by_path := class_path_benchmark(item, flag)) is not None:
            name, subset = by_path
            known.add(name)
            parsed.append(by_path)
            current = name if subset is not None else None
        else:
            raise ValueError(f"{flag}={spec!r}: unknown benchmark {item!r}; known: {known_names}; one of your own: "
                             f"'module:Class' (a Benchmark subclass), or an entry point of the {ENTRY_POINT_GROUP} "
                             "group (docs/extending.md)")
    expanded = []
    for name, subset in parsed:
        if name == "t2i_compbench" and subset is None:
            expanded += [(name, category) for category in paper.ALL_CATEGORIES]
        else:
            expanded.append((name, subset))
    # Each benchmark once, its default subset named or not (`toy,toy:held_out`): the first spelling is kept.
    # (The default is looked up only for a benchmark named twice: it imports the benchmark's module.)
    named = Counter(name for name, _ in expanded)
    once: dict[tuple[str, str | None], tuple[str, str | None]] = {}
    for name, subset in expanded:
        key = subset if subset is not None or named[name] == 1 else _default_subset(name)
        once.setdefault((name, key), (name, subset))
    return list(once.values())


def class_path_benchmark(item: str, flag: str) -> tuple[str, str | None] | None:
    """`module:Class` or `module:Class:subset` -> (the name the class is registered by, subset), the class
    registered under it; None where `item` is no such path, or names no module or no attribute of it to be
    found and reads as a mistyped benchmark name (`t2i_compbenh:color`, which the caller reports with the
    known ones). A dotted module or a CapWords class (`mybench:MyBench`) is meant as a path: one that does not
    import is refused with the fix. Results are filed by the class's own `name` (what `@register_benchmark`
    sets), so a class without one is refused."""
    module, _, rest = item.partition(":")
    attribute, _, subset = rest.partition(":")
    if not (attribute.isidentifier() and all(part.isidentifier() for part in module.split("."))):
        return None
    meant_as_path = "." in module or attribute[:1].isupper()
    path = f"{module}:{attribute}"
    builtin = next((name for name, class_path in _BENCHMARKS.items() if class_path == path), None)
    if builtin is not None:  # gors' own by its class: the name it goes by
        return builtin, subset or None
    try:
        cls = import_class(path)
    except ModuleNotFoundError as err:
        if is_missing(err, module) and not meant_as_path:
            return None
        raise import_error(path, path, err, "benchmark") from err
    except AttributeError:  # a module that holds no such name: more likely a mistyped benchmark (`gors:colour`)
        if not meant_as_path:
            return None
        raise ValueError(f"{flag}: the module {module} has no class {attribute!r}") from None
    except ImportError as err:
        raise import_error(path, path, err, "benchmark") from err
    if not (isinstance(cls, type) and issubclass(cls, Benchmark)):
        raise ValueError(f"{flag}: {path} is not a Benchmark subclass")
    name = vars(cls).get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{flag}: {path} has no name of its own, which its results are filed by: decorate the "
                         "class with @evaluators.register_benchmark('my_benchmark')")
    if _REGISTERED.get(name) is not cls:
        register_benchmark(name)(cls)
    return name, subset or None


def _default_subset(name: str) -> str | None:
    """The subset benchmark `name` evaluates when none is named (its `subset_field`'s default), or None."""
    cls = benchmark_class(name)
    field = next((f for f in dataclasses.fields(cls) if f.name == cls.subset_field), None)
    return field.default if field is not None and isinstance(field.default, str) else None


def build_benchmark(name: str, subset: str | None = None, **kwargs: Any) -> Benchmark:
    """One benchmark, its subset set on the class's `subset_field`; None-valued kwargs are dropped."""
    cls = benchmark_class(name)
    kwargs = {key: value for key, value in kwargs.items() if value is not None}
    if subset is not None:
        if cls.subset_field is None:
            # `geneval:MyBench` from a module of the user's named like gors' own benchmark reads as that one.
            shadowed = (f" (if {name} is a module of yours holding the class {subset}, rename the module: {name} is "
                        "gors' own benchmark)") if name in _BENCHMARKS and subset[:1].isupper() else ""
            raise ValueError(f"benchmark {name!r} has no subsets; drop ':{subset}'{shadowed}")
        kwargs[cls.subset_field] = subset
    return cls(**kwargs)


# The types of a field that `--benchmark_options` sets: text, a number, a flag, None, or a Literal of them.
_PLAIN_FIELD_TYPES = (str, int, float, bool, type(None))


def _plain(hint: Any) -> bool:
    """Whether a field's type hint is a plain one (`_PLAIN_FIELD_TYPES`, a union of them or a Literal)."""
    if get_origin(hint) is Literal:
        return True
    if get_origin(hint) in (Union, UnionType):
        return all(_plain(arg) for arg in get_args(hint))
    return hint in _PLAIN_FIELD_TYPES


def option_fields(cls: type[Benchmark]) -> list[str]:
    """The fields of benchmark class `cls` that `--benchmark_options` sets: its own plain ones (e.g. LPG-Bench's
    `dataset`, GenEval 2's `data_path`), not `Benchmark`'s protocol fields (flags of their own, or fixed by the
    protocol: the seed), nor its subset (named after the colon), nor a mapping (`--scorer_options` gives those)."""
    protocol = {f.name for f in dataclasses.fields(Benchmark)}
    try:
        hints: dict[str, Any] | None = get_type_hints(cls)
    except (NameError, TypeError):  # a plugin's annotations that do not resolve: its own fields, their types unread
        hints = None
    return [f.name for f in dataclasses.fields(cls) if f.name not in protocol and f.name != cls.subset_field
            and f.init and (hints is None or _plain(hints[f.name]))]


def build_benchmark_with_options(name: str, subset: str | None, options_by_key: Mapping[str, Any], flag: str,
                                 **protocol: Any) -> Benchmark:
    """`build_benchmark(name, subset, **protocol)` with the fields `options_by_key` (given by `flag`, e.g.
    "--benchmark_options") sets under its name or its label (`name:subset`, the default subset's too, the label
    winning), each checked first: a field the class has not, or a value of another type, is refused with the
    fields it has."""
    from rewards.combined import option_type_problem

    cls = benchmark_class(name)
    label = benchmark_label(name, subset if subset is not None else _default_subset(name))
    for key in dict.fromkeys((name, label)):
        if not isinstance(options_by_key.get(key, {}), Mapping):
            raise ValueError(f"{flag}: {key} maps to {options_by_key[key]!r}; give its fields as a mapping, e.g. "
                             f"'{{\"{key}\": {{\"field\": \"value\"}}}}'")
    options = {**options_by_key.get(name, {}), **options_by_key.get(label, {})}
    allowed = option_fields(cls)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        hint = ""
        if cls.subset_field in unknown:
            hint = f"; its {cls.subset_field} is named after a colon: --benchmarks {name}:{options[cls.subset_field]}"
        elif set(unknown) & {f.name for f in dataclasses.fields(Benchmark)}:
            hint = ("; the protocol's fields are set by flags of their own (--max_prompts, --images_per_prompt, "
                    "--num_inference_steps, --guidance_scale, --resolution, --generation_batch_size) or fixed by it")
        raise ValueError(f"{flag}: {label} has no field {', '.join(map(repr, unknown))}; its fields: "
                         f"{', '.join(allowed) or 'none'}{hint}")
    problem = option_type_problem(cls, options)
    if problem is not None:
        raise ValueError(f"{flag}: {label}: {problem}")
    if not options:
        return build_benchmark(name, subset, **protocol)
    try:
        return build_benchmark(name, subset, **protocol, **options)
    except ValueError as err:
        build_benchmark(name, subset, **protocol)  # a mistyped subset is the benchmark's error, not the options'
        raise ValueError(f"{flag}: {label}: {err}") from None


def benchmark_label(name: str, subset: str | None) -> str:
    """How results name a benchmark and its subset: `t2i_compbench:color`, or the name alone without one."""
    return name if subset is None else f"{name}:{subset}"


__all__ = [
    "Benchmark",
    "BenchmarkPrompt",
    "Metric",
    "available_benchmarks",
    "benchmark_label",
    "build_benchmark",
    "build_benchmark_with_options",
    "get_benchmark",
    "option_fields",
    "parse_benchmarks",
    "register_benchmark",
]
