"""Prompt sets: T2I-CompBench files (downloaded at a pinned commit and sha256-verified) or any text file.

The benchmark files are not shipped with the package; they are fetched from GitHub on first use and
cached. Offline machines point `GORS_DATA_DIR` at a folder holding the files (for example a copy of
`shared/benchmarks`), or pass their own prompt file.

A `.jsonl` file holds one JSON object per prompt, with the prompt under "prompt" and anything else
a reward needs to judge it (e.g. GenEval's clauses: tag, include, exclude, as in GenEval's
`evaluation_metadata.jsonl`); the rows travel with the prompt set as its per-prompt metadata.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gors.core.data import ChecksumError, DownloadError, PinnedSource, fetch_pinned_file  # noqa: F401 (re-exported)
from gors.core.paper import ALL_CATEGORIES, SELECTION_THRESHOLDS

T2I_COMPBENCH_REPOSITORY = "Karine-Huang/T2I-CompBench"
T2I_COMPBENCH_COMMIT = "1b7094991a57f3c22abdd4f6e8ba6c1a15517073"
T2I_COMPBENCH_FOLDER = "examples/dataset/"

# sha256 of every file in T2I-CompBench's examples/dataset/ at T2I_COMPBENCH_COMMIT (the files are
# CRLF text; the hashes are of the bytes as served by raw.githubusercontent.com).
T2I_COMPBENCH_SHA256: dict[str, str] = {
    "3d_spatial.txt": "1ae21ab1c669cca035f8ce27c83a312dd4ecddc0796a2d4a6910163b9a92fa3f",
    "3d_spatial_train.txt": "0bba7e9ad31b0ce7908f6cbf2426a4b7ef6e8b841c1b737d0ad2d5b8e688dd93",
    "3d_spatial_val.txt": "c9953597315f36a5fcb41291bb19bdc6ab5f64a0fa760d691b4854a73f5d1fe9",
    "LICENSE.txt": "905b2fb8de6611b855171c41985efc7a36698016c083f1b39485a6f9e9d4ae00",
    "color.txt": "e3034f86a70c3422dd7157c050dc9c8346a32162a3f1165302c9dba05c4f48f3",
    "color_train.txt": "db5d3287027d453f8c977f0c7315f8a01a770f02f61fa54ae19406762982393f",
    "color_val.txt": "1634259756dbc77d13093d907d414480080ec9790a8c97ad09efaea7b2534f2d",
    "color_val_seen.txt": "9b2859d9107b2ed4cae95808749de5ac3557a280eb79067a8ef55c4eec7711a9",
    "color_val_unseen.txt": "7fa6f76bb602df9624262ee819f0b1ede20c14880cbacfb7fe8ce79f8157b5c2",
    "complex.txt": "58c982554cfe40bedafe3fb495f18196bc0d3905f94b984e0580b24cb624f171",
    "complex_train.txt": "d214ac45cb3c5307dd14a144c8c69aa5ffdcc7be74ff71b5dac989f8ca9f924b",
    "complex_train_action.txt": "2bf41d7d857883a7344aed46c45343f5089a71cc394d81c00f4aab5348a81dc8",
    "complex_train_spatial.txt": "a7ccfa228a825497db4e6e688332a90f3b53da66a76da324390b597be92a0da0",
    "complex_train_spatialaction.txt": "933cdc3e6eeaa6564f762736dd32f5e74c4809381fc2c2787bec434bc6b0c7ea",
    "complex_val.txt": "1b808018b8d9916db3d47d5aa2ef18377a3549a56901a474156f799824cdf3b4",
    "complex_val_action.txt": "d49ee4c7f99e3f3379fb8704a54ff5288b83bb412971edf616a4721c2473308e",
    "complex_val_spatial.txt": "6c7ac0ab75c7c9080cfc7b421fb059b9b0febb98471707aeedf58771088abc02",
    "complex_val_spatialaction.txt": "e02ddc7fed812e6577e7386ec2137ce0a994a5ce19771661f68df7ac349a6ca9",
    "new_objects.txt": "f39a3d2ff6067d7738673cbf465dc659ccc750776162989a5d9916f1d5f3e231",
    "non_spatial.txt": "90ae0e995992768d8ddb862d821733103ebf822668a42c857862cc71018a0009",
    "non_spatial_train.txt": "dbac5a9ec83204dcd0c3538a12d3212e2ce66db6f7ba45b49a1d869b2d3f2430",
    "non_spatial_val.txt": "04c56cc9ac441dc9ea6c5157652058bd1635b5308526dd31bb29a1caab9a758d",
    "numeracy.txt": "ba97b876f32f6cac34507a085c7e7ecc6079641b5cbd0fc0c1eb5240ac4b64f0",
    "numeracy_train.txt": "f66bb8708cb0be23c0406e14d892b25661b2b71e3e72abddc79c38466ab629c6",
    "numeracy_val.txt": "dad8df141604b70ba7554bec724e3db0a80023680769b5c514854ea2d2527bbe",
    "shape.txt": "571dfc71ecbea33aa4e504acbe0a7519780920012d9ad360aa212e7e4b6eb6df",
    "shape_train.txt": "451bdfccd330d4cf979d45664817be7959e89250b93d5c591cc562b858175a87",
    "shape_val.txt": "37e1a276906c7ea9516cbd7ac8501be896006c0c17ca7344f260562834455bae",
    "shape_val_seen.txt": "5581f4c8904e11b00fe6e33d2cc21a5822f59f39f43fa51479bc30aa6d458a4d",
    "shape_val_unseen.txt": "35b17a7b015405c5c96c51c5cd969a786b3855c48e6f68c184626f5db444d987",
    "spatial.txt": "66f6b1dcf335389111a0379357fbf5233498e67ba15251ee0f7de2f1ac620ae1",
    "spatial_train.txt": "af14cdf2320057d98f94077e6211c2ddfaabfbb9e3842873657baabb17e00de6",
    "spatial_val.txt": "8707a1d7e42ce3002d95363cf55f74bd043c843ae27108f5125aaaa7840ca988",
    "texture.txt": "9957553c3e653ab54660454615ea5f3c9d4b807eca9c13b44cb9679d3f2c425e",
    "texture_train.txt": "4846315c5972f9e9cc82e4833099e8ec2c28b999ca77269512715f3f56bde54f",
    "texture_val.txt": "fbb5363515b4a28009e360afaaaf389d2dd2289e50dbb0c6ef4ea0c7fe4f3d4f",
    "texture_val_seen.txt": "5548a49c68efefbbc88b2eb6dffd0f141373235370659158a5d15fdbd82c8c96",
    "texture_val_unseen.txt": "6035f7dd8fd9efd6fbeedef64b04e1f651e977b2a1b9c47365c9e4eed0edc27b",
}

NAME_PREFIX = "t2i_compbench:"
# Names accepted by load_prompts: every prompt file stem (the licence is not a prompt list).
PROMPT_FILE_STEMS = tuple(sorted(f[: -len(".txt")] for f in T2I_COMPBENCH_SHA256 if f != "LICENSE.txt"))


T2I_COMPBENCH = PinnedSource(
    name="t2i_compbench",
    repository=T2I_COMPBENCH_REPOSITORY,
    commit=T2I_COMPBENCH_COMMIT,
    folder=T2I_COMPBENCH_FOLDER,
    sha256=T2I_COMPBENCH_SHA256,
    # Said by every command that takes a T2I-CompBench name (gors run's --train_prompts, gors questions' PROMPTS).
    offline_hint="(e.g. a copy of the T2I-CompBench examples/dataset/ folder), or give the path of a prompt file "
    "instead of the T2I-CompBench name",
)


def t2i_compbench_url(filename: str) -> str:
    """The raw GitHub URL of `filename` at the pinned T2I-CompBench commit."""
    return T2I_COMPBENCH.url(filename)


def fetch_t2i_compbench_file(filename: str) -> Path:
    """Return a local, sha256-verified copy of a T2I-CompBench file such as `color_train.txt`.

    With `GORS_DATA_DIR` set, only that folder is read (`<dir>/<filename>` or
    `<dir>/t2i_compbench/<filename>`); otherwise the file is cached under `$GORS_CACHE_DIR`
    (see `gors.core.data.fetch_pinned_file`).
    """
    return fetch_pinned_file(T2I_COMPBENCH, filename)


def _read_text(path: Path) -> str:
    """A prompt file's text, with errors that name the file: a folder, or not UTF-8 text."""
    if path.is_dir():
        raise FileNotFoundError(f"Prompt file {str(path)!r} is a folder: pass a text file with one prompt per line.")
    try:
        # utf-8-sig drops a byte-order mark that editors on Windows like to add.
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"Prompt file {str(path)!r} is not UTF-8 text (byte {err.start}): save it as UTF-8.") from None
    if "\x00" in text:  # UTF-8 that holds NULs: a binary file, or text saved as UTF-16 from ASCII
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ValueError(f"Prompt file {str(path)!r} holds a NUL byte (line {line}): it is a binary file or UTF-16 "
                         "text; save it as UTF-8 text")
    return text


# Whitespace (every character `str.isspace` counts, the highest being U+3000) and the invisible characters a
# prompt may carry at its ends from editors and concatenated files: byte-order marks (two Windows files joined
# by `cat`), zero-width spaces and joiners, the word joiner.
_EDGES = "".join(c for c in map(chr, range(0x3001)) if c.isspace()) + "\ufeff\u200b\u200c\u200d\u2060"


def clean_prompt(text: str) -> str:
    """`text` without whitespace and invisible characters at its ends, as gors reads a prompt from a file."""
    return text.strip(_EDGES)


def _lines(text: str) -> list[str]:
    """A file's lines at LF (CRLF's CR is stripped as whitespace), each `clean_prompt`. Only LF: `str.splitlines`
    would also cut a prompt at a form feed, U+0085 or U+2028."""
    return [clean_prompt(line) for line in text.split("\n")]


# Formats gors does not read as prompt files: read as lines, their syntax would become prompts.
_NOT_PROMPT_FILES = (".json", ".csv", ".tsv", ".yaml", ".yml", ".parquet")


def read_prompt_file(path: str | os.PathLike[str]) -> list[str]:
    """Read one prompt per line (CRLF or LF), stripping surrounding whitespace and skipping blank lines."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"Prompt file {str(path)!r} does not exist: pass an existing text file with one prompt per "
            f"line, or a T2I-CompBench name such as 'color'."
        )
    if path.suffix.lower() in _NOT_PROMPT_FILES:
        raise ValueError(f"Prompt file {str(path)!r} is a {path.suffix} file, which gors would read line by line as "
                         "prompts: pass a text file with one prompt per line, or a .jsonl file with one JSON object "
                         "per line, each with a 'prompt' (e.g. `jq -c '.[] | {prompt: .}'` turns a JSON list of "
                         "strings into one)")
    prompts = [line for line in _lines(_read_text(path)) if line]
    if not prompts:
        raise ValueError(f"Prompt file {str(path)!r} contains no prompts (only blank lines).")
    return prompts


def read_prompt_jsonl(path: str | os.PathLike[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """(prompts, metadata rows) of a JSON-lines file: one object per non-blank line, each with a
    non-empty "prompt" string; the rows are kept whole (prompt included)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Prompt file {str(path)!r} does not exist: pass an existing .jsonl file with one "
                                f"JSON object per line, each with a 'prompt'.")
    rows = []
    for number, line in enumerate(_lines(_read_text(path)), start=1):
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}, line {number}: not JSON ({err}); a .jsonl prompt file holds one JSON object "
                             f"per line, e.g. {{\"prompt\": \"a photo of a cat\", ...}}") from err
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not clean_prompt(row["prompt"]):
            raise ValueError(f"{path}, line {number}: {line.strip()[:80]!r} is not a JSON object with a non-empty "
                             f"'prompt' string")
        rows.append(row)
    if not rows:
        raise ValueError(f"Prompt file {str(path)!r} contains no prompts (only blank lines).")
    return [clean_prompt(row["prompt"]) for row in rows], rows


@dataclass
class PromptSet:
    """A list of prompts with where it came from, and per-prompt metadata when the source has any."""

    name: str
    prompts: list[str]
    category: str | None  # a T2I-CompBench category, or TOY_CATEGORY, when known (drives the reward and tau)
    source: str  # a file path, or the pinned URL for benchmark files
    metadata: list[dict[str, Any]] | None = None  # one row per prompt (a .jsonl file's), for the reward

    def __len__(self) -> int:
        return len(self.prompts)

    def info(self, max_prompts: int | None = None) -> dict[str, Any]:
        """What a sample store records of the set (`prompts.json`): name, category, source, and the
        metadata of the first `max_prompts` prompts when there is any (the score stage hands it to
        the reward)."""
        info: dict[str, Any] = {"name": self.name, "category": self.category, "source": self.source}
        if self.metadata is not None:
            info["metadata"] = self.metadata[:max_prompts]
        return info


def category_of(stem: str) -> str | None:
    """The T2I-CompBench category of an official file stem (`non_spatial_val` -> `non_spatial`)."""
    if stem + ".txt" not in T2I_COMPBENCH_SHA256:
        return None
    # A stem is `<category>` or `<category>_<split>`: `non_spatial_val` does not start with `spatial_`.
    for category in ALL_CATEGORIES:
        if stem == category or stem.startswith(category + "_"):
            return category
    return None


def _resolve_name(name: str, split: str) -> str | None:
    """Map a T2I-CompBench name to a file stem, or None if it is not one."""
    name = name.removesuffix(".txt")
    if name in ALL_CATEGORIES:
        name = f"{name}_{split}"
    return name if name in PROMPT_FILE_STEMS else None


TOY_PREFIX = "toy:"  # then a split name of gors.core.toy.world.SPLITS
# The category of every toy prompt set: its reward (`rewards.paper`: toy_oracle, unbiased
# toy_classifier) and tau, as a T2I-CompBench category's are the paper's.
TOY_CATEGORY = "toy"


def recorded_category(info: dict[str, Any]) -> str | None:
    """The category of a prompt set as a store recorded it (`PromptSet.info`, its `prompts.json`).

    A toy set recorded before toy sets had a category gets `TOY_CATEGORY` from its name, so that a
    run folder generated then scores and selects with the toy reward and tau, as one generated now.
    """
    if info.get("category") is None and str(info.get("name", "")).startswith(TOY_PREFIX):
        return TOY_CATEGORY
    return info.get("category")


def check_category(config: Any, prompts_category: str | None, prompts: str, tau: bool = True) -> None:
    """Refuse a `--category` (`config.category`, given or set by a recipe) other than the prompts' own where
    it would decide the reward (no `--reward`) or tau (`tau`: this stage selects; no `--reward_threshold`,
    `--select_top_fraction` or `--tau_schedule`): the other category's reward and tau would judge these
    prompts. `prompts` names them in the message. Prompts without a reward and tau of their own (a file,
    3d_spatial, numeracy) take any category: that is how they borrow one."""
    category = config.category
    if category is None or category == prompts_category or prompts_category not in (*SELECTION_THRESHOLDS,
                                                                                     TOY_CATEGORY):
        return
    decided = (["reward"] if config.reward is None else []) + (["tau"] if tau and all(
        getattr(config, name, None) is None for name in ("reward_threshold", "select_top_fraction", "tau_schedule"))
        else [])
    if decided:
        raise ValueError(f"--category={category!r} (given, or set by the recipe), but {prompts} are "
                         f"{prompts_category!r} prompts: {category}'s {' and '.join(decided)} would judge them. Drop "
                         f"--category (a recipe's: --category none, or run the {prompts_category} recipe), or give "
                         "--reward and --reward_threshold to judge them otherwise on purpose")


def load_prompts(spec: str, split: str = "train") -> PromptSet:
    """Load a prompt set from a T2I-CompBench name or a text file.

    `spec` is a category (`color` -> `color_{split}.txt`), a file stem (`color_val`,
    `complex_val_spatial`), either optionally prefixed `t2i_compbench:`, a path to a text file, or
    a path to a `.jsonl` file (one JSON object with a "prompt" per line: its rows become the set's
    metadata).
    Benchmark names win over a same-named file in the working directory (write `./color` for that),
    except a name with a suffix that is an existing path (`color.txt`): that file.
    `toy:train` and `toy:held_out` are the toy world's splits, and `toy:fit` / `toy:val` the train
    prompts split the same way for choosing settings, with two more folds `toy:fit_square` /
    `toy:val_square` and `toy:fit_triangle` / `toy:val_triangle` (see `gors.core.toy.world`); their
    category is `TOY_CATEGORY`.
    """
    if spec.startswith(TOY_PREFIX):
        from gors.core.toy.world import prompts_of_split  # numpy and PIL only when the toy world is asked for

        chosen = prompts_of_split(spec.removeprefix(TOY_PREFIX))  # an unknown split names the known ones
        return PromptSet(spec, [p.text for p in chosen], TOY_CATEGORY, "gors.core.toy.world.prompts_of_split")
    forced = spec.startswith(NAME_PREFIX)
    name = spec[len(NAME_PREFIX):] if forced else spec
    path = Path(name).expanduser()
    # A file name with its suffix that exists here is that file, not the benchmark's of the same stem.
    stem = None if not forced and path.suffix and path.exists() else _resolve_name(name, split)
    if stem is not None:
        filename = stem + ".txt"
        path = fetch_t2i_compbench_file(filename)
        return PromptSet(stem, read_prompt_file(path), category_of(stem), t2i_compbench_url(filename))
    if not forced and path.suffix.lower() == ".jsonl":
        prompts, metadata = read_prompt_jsonl(path)
        return PromptSet(path.stem, prompts, None, str(path), metadata)
    if not forced and path.exists():  # a folder or non-text file: `read_prompt_file` says which
        category = category_of(path.stem) if path.name in T2I_COMPBENCH_SHA256 else None
        return PromptSet(path.stem, read_prompt_file(path), category, str(path))
    what = f"{spec!r} is not a T2I-CompBench name" if forced else f"Prompt file {spec!r} does not exist"
    toy = [f"{TOY_PREFIX}train", f"{TOY_PREFIX}held_out"]
    close = difflib.get_close_matches(name, [*ALL_CATEGORIES, *PROMPT_FILE_STEMS, *toy], n=1)
    raise FileNotFoundError(
        f"{what}" + (f" (did you mean {close[0]!r}?)" if close else "") + ". Pass an existing text file with one "
        f"prompt per line, a .jsonl file of prompts with metadata, or one of the T2I-CompBench names: categories "
        f"{', '.join(ALL_CATEGORIES)} (a category reads its file <category>_{split}.txt) or files "
        f"{', '.join(PROMPT_FILE_STEMS)}; or the toy world's {' and '.join(toy)}."
    )
