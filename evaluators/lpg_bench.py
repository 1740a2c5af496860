"""LPG-Bench: long prompts (over 250 words on average), one image each, scored with TIT-Score.

Prompts come from the Hugging Face dataset `Moyao001/LPG-Bench` (TIT-Score paper, arXiv
2510.02987; `IntMeGroup/TIT-Score`), loaded with `datasets`, or from a local copy (a folder such
as ``hf download --repo-type dataset Moyao001/LPG-Bench --local-dir LPG-Bench`` makes, or one
.json/.jsonl/.csv/.parquet/.txt file).

Assumed layout (the dataset card could not be read from here): one row per prompt with the
prompt text in a column named ``prompt`` (else the first of ``Prompt``, ``text``,
``long_prompt``, ``caption`` found; ``prompt_column`` names it explicitly); other scalar
columns (e.g. an id) travel as prompt metadata. If the repository mixes files (prompts and
generated images), ``data_files`` picks the prompt file.

The scorer is `rewards.tit_score` (TIT-Score by default, TIT-Score-LLM with ``metric="tit_score_llm"``
or the scorer option ``judge: llm``; the summary's ``metric`` names the judge that scored). It
follows the reference code: the prompt is embedded as given (not stripped; an empty one is
skipped) and each TIT-Score is rounded to 4 decimals. The summary reports the mean score in [0, 1]
and, for TIT-Score, the mean raw cosine. That cosine is comparable with the paper's numbers only
with the same describer: the reference describes with Qwen2.5-VL-72B-Instruct, gors by default
with Qwen3-VL-8B-Instruct (``vlm_model_name_or_path`` picks another). Note that CLIP-based text encoders (Stable Diffusion 1/2) read only
the first 77 tokens of these prompts. The sampling protocol is the project's evaluation
default (DDIM, 30 steps, guidance 7.5, the checkpoint's own side, seed 42 + 100000 * prompt +
image); LPG-Bench
itself collects one image per prompt and model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from evaluators.base import Benchmark, BenchmarkPrompt
from evaluators.results import Metric
from gors.core.data import DownloadError

DATASET = "Moyao001/LPG-Bench"
PROMPT_COLUMNS = ("prompt", "Prompt", "text", "long_prompt", "caption")
FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}
METRIC_JUDGES = {"tit_score": "embedding", "tit_score_llm": "llm"}  # metric -> TITScoreReward's judge


def load_lpg_rows(dataset: str = DATASET, split: str = "train", revision: str | None = None,
                  data_files: str | None = None) -> Any:
    """The `datasets.Dataset` of `dataset` (Hub id, local folder or one data file), split `split`."""
    from datasets import load_dataset

    path = Path(dataset).expanduser()
    try:
        if path.is_file():
            if path.suffix not in FILE_BUILDERS:
                raise ValueError(f"dataset={dataset!r}: use a {', '.join(FILE_BUILDERS)} file, or a folder")
            return load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split=split)
        return load_dataset(str(path) if path.is_dir() else dataset, data_files=data_files, split=split,
                            revision=revision)
    except (OSError, ConnectionError) as err:
        raise DownloadError(
            f"LPG-Bench prompts could not be loaded from {dataset!r} (split {split!r}): {err}\n"
            f"Offline, download the dataset elsewhere (`hf download --repo-type dataset {DATASET} "
            "--local-dir LPG-Bench`) and pass that folder (or its prompt file) as dataset: `gors evaluate "
            "--benchmark_options '{\"lpg_bench\": {\"dataset\": \"LPG-Bench\"}}'`."
        ) from err


def prompt_column_of(column_names: list[str], prompt_column: str | None = None) -> str:
    """The column holding the prompt text: `prompt_column`, else the first of PROMPT_COLUMNS present."""
    if prompt_column is not None:
        if prompt_column not in column_names:
            raise ValueError(f"prompt_column={prompt_column!r} is not a column; the columns are {column_names}")
        return prompt_column
    for name in PROMPT_COLUMNS:
        if name in column_names:
            return name
    raise ValueError(
        f"no prompt column among {column_names}; expected one of {PROMPT_COLUMNS}, or pass prompt_column"
    )


def judged_metric(rows: list[dict[str, Any]], default: str) -> str:
    """The metric the rows were scored for: "tit_score_llm" when the LLM judge replied (its rows carry
    `judge_reply`), "tit_score" when the embedding judge did; `default` without rows."""
    if not rows:
        return default
    return "tit_score_llm" if "judge_reply" in rows[0]["details"] else "tit_score"


@dataclass
class LPGBenchBenchmark(Benchmark):
    """LPG-Bench long prompts scored with TIT-Score (or TIT-Score-LLM).

    The protocol fields are `Benchmark`'s (1 image per prompt, the project's evaluation default
    DDIM 30 steps, guidance 7.5, the checkpoint's own side, seed per image), with 4 images per
    generation batch.

    Args:
        dataset: Hub id (default `Moyao001/LPG-Bench`), local folder or data file.
        split, revision, data_files: passed to `datasets.load_dataset` (revision pins a Hub commit).
        prompt_column: the prompt column (default: found among PROMPT_COLUMNS).
        vlm_model_name_or_path: describing VLM (default `Qwen/Qwen3-VL-8B-Instruct`).
        embedding_model_name_or_path: text-embedding model (default `Qwen/Qwen3-Embedding-8B`).
        metric: "tit_score" (embedding cosine) or "tit_score_llm" (LLM judge).
        judge_model_name_or_path: the LLM judge of TIT-Score-LLM (default `Qwen/Qwen3-8B`).
    """

    dataset: str = DATASET
    split: str = "train"
    revision: str | None = None
    data_files: str | None = None
    prompt_column: str | None = None
    vlm_model_name_or_path: str | None = None
    embedding_model_name_or_path: str | None = None
    metric: Literal["tit_score", "tit_score_llm"] = "tit_score"
    judge_model_name_or_path: str | None = None
    batch_size: int = 4

    name = "lpg_bench"
    scorer = "tit_score"
    primary_metric = "tit_score"
    official_images_per_prompt = 1
    metrics = (
        Metric("tit_score", help="TIT-Score (or TIT-Score-LLM with the LLM judge), mean over images"),
        Metric("tit_score_cosine", scale="[-1, 1] (cosine)",
               help="raw prompt-description cosine (4 decimals per image, as the reference code), mean over "
                    "images; comparable with the paper's only with its describer, Qwen2.5-VL-72B-Instruct"),
    )

    def __post_init__(self) -> None:
        if self.metric not in METRIC_JUDGES:
            raise ValueError(f"metric must be 'tit_score' or 'tit_score_llm', got {self.metric!r}")
        super().__post_init__()

    def prompts(self) -> list[BenchmarkPrompt]:
        rows = load_lpg_rows(self.dataset, self.split, self.revision, self.data_files)
        column = prompt_column_of(list(rows.column_names), self.prompt_column)
        prompts = []
        for row in rows:
            text = row[column]
            if not isinstance(text, str) or not text.strip():
                continue
            extra = {k: v for k, v in row.items() if k != column and isinstance(v, (str, int, float, bool))}
            prompts.append(BenchmarkPrompt(text, extra))  # as given: the reference embeds it unstripped
        if not prompts:
            raise ValueError(f"{self.dataset!r} (split {self.split!r}) has no non-empty prompts in column {column!r}")
        return self.subsample(prompts)

    def data_version(self) -> dict[str, Any]:
        # No revision reads the dataset's latest version: the prompts' sha256 beside it says which.
        return {"dataset": self.dataset, "revision": self.revision, "split": self.split,
                "data_files": self.data_files}

    def scorer_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"judge": METRIC_JUDGES[self.metric]}
        for key, value in (("model_name_or_path", self.vlm_model_name_or_path),
                           ("embedding_model_name_or_path", self.embedding_model_name_or_path),
                           ("judge_model_name_or_path", self.judge_model_name_or_path)):
            if value:
                options[key] = value
        return options

    def provenance(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """TIT-Score: `score_mapping`, how `tit_score` maps each cosine to [0, 1] ("clip", the default: the
        published TIT-Score wherever positive; "affine": (1 + cosine) / 2, another scale under the same name)."""
        mappings = sorted({row["details"]["mapping"] for row in rows if "mapping" in row["details"]})
        return {"score_mapping": mappings[0] if len(mappings) == 1 else mappings} if mappings else {}

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """tit_score: mean score in [0, 1] over the images (the reference code scores one image; the mean is
        gors'), the cosine mapped as `score_mapping` records; tit_score_cosine: mean raw cosine (TIT-Score only).

        `metric` names the judge that scored the rows, read from their details (an LLM judge's carry its
        reply), not the `metric` field: `--scorer_options '{"lpg_bench": {"judge": "llm"}}'` picks it too.
        """
        n = len(rows)
        metric = judged_metric(rows, self.metric)
        summary: dict[str, Any] = {"metric": metric, "tit_score": sum(row["score"] for row in rows) / n}
        cosines = [row["details"]["cosine"] for row in rows if "cosine" in row["details"]]
        if cosines:
            summary["tit_score_cosine"] = sum(cosines) / len(cosines)
        unparsed = sum(not row["details"].get("parsed", True) for row in rows)
        if metric == "tit_score_llm":
            summary["judge_replies_without_rating"] = unparsed
        summary.update({
            "mean_description_words": sum(row["details"]["description_words"] for row in rows) / n,
            "num_images": n, "num_prompts": len({row["prompt_index"] for row in rows}),
            "images_per_prompt": self.num_images,
        })
        return summary
