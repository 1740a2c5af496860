"""A benchmark = prompts + generation protocol + scorer + aggregation, run on any checkpoint.

`Benchmark.evaluate` generates the benchmark's images with its own protocol (resumable, sharded
over Accelerate processes, with an optional LoRA), scores them with the benchmark's reward,
and writes per-image rows (`results.jsonl`) and a summary (`summary.json`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from accelerate import Accelerator

import rewards
from gors.distributed import make_accelerator
from gors.generate import SamplingProtocol, generate_samples
from gors.io import atomic_write_json, atomic_write_jsonl
from gors.pipeline import inference_dtype, load_pipeline
from gors.score import score_samples
from gors.store import SampleStore


class Benchmark:
    """Subclasses set `name` and `reward`, and implement `prompts`, `protocol` and `summarize`."""

    name: ClassVar[str] = ""
    reward: ClassVar[str] = ""  # the scorer: a name in the rewards registry
    higher_is_better: ClassVar[bool] = True

    def prompts(self) -> list[str]:
        raise NotImplementedError

    def protocol(self) -> SamplingProtocol:
        raise NotImplementedError

    def summarize(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Aggregate per-image score rows into the benchmark's reported numbers."""
        raise NotImplementedError

    def evaluate(
        self,
        pretrained_model_name_or_path: str,
        output_dir: str | Path,
        lora: str | None = None,
        accelerator: Accelerator | None = None,
        reward_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Generate, score and summarise; returns the summary (also in `output_dir/summary.json`)."""
        accelerator = accelerator or make_accelerator()
        output_dir = Path(output_dir)
        store = SampleStore(output_dir / "samples")

        def loader():
            dtype = inference_dtype(accelerator, None)
            return load_pipeline(pretrained_model_name_or_path, accelerator.device, dtype, lora=lora)

        generate_samples(store, self.prompts(), self.protocol(), loader, accelerator,
                         prompt_info={"benchmark": self.name, "model": pretrained_model_name_or_path, "lora": lora},
                         desc=f"{self.name}: generate")
        reward_class = rewards.get_reward_class(self.reward)
        scores = score_samples(
            store, output_dir / "scores", lambda: reward_class(device=accelerator.device, **(reward_kwargs or {})),
            batch_size=16, accelerator=accelerator, desc=f"{self.name}: score",
        )
        rows = [scores[key] for key in sorted(scores)]
        summary = {"benchmark": self.name, "model": pretrained_model_name_or_path, "lora": lora,
                   "higher_is_better": self.higher_is_better, **self.summarize(rows)}
        if accelerator.is_main_process:
            atomic_write_jsonl(output_dir / "results.jsonl", rows)
            atomic_write_json(output_dir / "summary.json", summary)
        accelerator.wait_for_everyone()
        return summary
