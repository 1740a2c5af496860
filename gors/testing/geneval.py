"""The GenEval reward's models at tiny size, for offline tests: a tiny Mask2Former folder and a tiny
open_clip architecture registered under a name of its own, with a local random checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gors.testing.mask2former import build_tiny_mask2former

# The vocabulary is open_clip's real CLIP BPE (shipped with the package); only the widths are tiny.
TINY_OPEN_CLIP_CONFIG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def build_tiny_geneval_models(root: str | Path, clip_name: str, seed: int = 0) -> dict[str, str]:
    """Write the tiny detector and colour classifier under `root`; returns the GenEval reward's
    keyword arguments for them (`model_name_or_path`, `clip_model`, `clip_pretrained`)."""
    import open_clip

    root = Path(root)
    detector = build_tiny_mask2former(root / "mask2former", seed=seed)
    config_dir = root / "open_clip_configs"
    config_dir.mkdir(parents=True, exist_ok=True)
    (config_dir / f"{clip_name}.json").write_text(json.dumps(TINY_OPEN_CLIP_CONFIG))
    open_clip.add_model_config(config_dir)
    torch.manual_seed(seed)
    checkpoint = root / "tiny_clip.pt"
    torch.save(open_clip.create_model(clip_name).state_dict(), checkpoint)
    return {"model_name_or_path": str(detector), "clip_model": clip_name, "clip_pretrained": str(checkpoint)}
