"""`gors convert-detector geneval PATH OUT`: a benchmark's official detector checkpoint as a transformers folder.

GenEval's is mmdetection 2.x's Mask2Former Swin-S (`rewards.mmdet_mask2former`); OUT loads with
`Mask2FormerForUniversalSegmentation.from_pretrained(OUT)` and scores GenEval with
`--scorer_options '{"geneval": {"model_name_or_path": "OUT"}}'`. `"model_name_or_path": "official"`
does the same without this command: it downloads and converts the file once into the cache.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from gors.cli import parse_config
from gors.config import check_values
from gors.core.data import fetch_pinned_file
from rewards.mmdet_mask2former import (
    CHECKPOINT_FILE,
    OFFICIAL,
    OFFICIAL_CHECKPOINT,
    DetectorConversionError,
    convert_checkpoint,
)

DETECTORS = ("geneval",)


@dataclass
class ConvertDetectorConfig:
    """Convert a benchmark's official detector checkpoint into a transformers folder (config.json,
    model.safetensors, preprocessor_config.json) for the benchmark's model_name_or_path scorer option."""

    benchmark: str = field(metadata={
        "positional": True, "metavar": "BENCHMARK", "choices": list(DETECTORS),
        "help": "Whose detector: geneval (mmdetection 2.x Mask2Former Swin-S, COCO instances).",
    })
    source: str = field(metadata={
        "positional": True, "metavar": "PATH",
        "help": f"The mmdetection .pth file (GenEval's download_models.sh fetches {CHECKPOINT_FILE}), or "
        f"'{OFFICIAL}' to download that file from {OFFICIAL_CHECKPOINT.url(CHECKPOINT_FILE)} (hash-checked; "
        "GORS_DATA_DIR for an offline copy).",
    })
    output_dir: str = field(metadata={
        "positional": True, "metavar": "OUT", "help": "Folder to write the transformers model into.",
    })

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        self.output_dir = os.path.expanduser(self.output_dir)  # `~` from a quoted argument, as a shell would


def convert(config: ConvertDetectorConfig) -> None:
    """`gors convert-detector geneval PATH OUT`: convert and say how to use the result; bad input exits with why."""
    try:
        path = fetch_pinned_file(OFFICIAL_CHECKPOINT, CHECKPOINT_FILE) if config.source == OFFICIAL else config.source
        folder = convert_checkpoint(path, config.output_dir)
    except (DetectorConversionError, OSError, ValueError) as err:
        raise SystemExit(f"error: {err}") from err
    option = '{"geneval": {"model_name_or_path": "%s"}}' % folder
    print(f"Wrote {folder}; score GenEval with it: --scorer_options '{option}'")


def main(argv: Sequence[str] | None = None) -> None:
    """`gors convert-detector geneval PATH OUT`."""
    convert(parse_config(ConvertDetectorConfig, argv, prog="gors convert-detector"))
