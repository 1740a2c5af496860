"""Tiny random zero-shot detectors of the real `transformers` classes, for offline tests.

- `build_tiny_grounding_dino`: `GroundingDinoForObjectDetection` (or, with ``mm=True``,
  `MMGroundingDinoForObjectDetection`) + `GroundingDinoProcessor`, with the token conventions of
  `IDEA-Research/grounding-dino-base`: an uncased BERT WordPiece vocabulary in which [CLS], [SEP],
  "." and "?" have BERT's ids 101, 102, 1012 and 1029 (the model hard-codes these ids to split the
  text into phrases), a Swin backbone with three output stages plus one extra feature level.
- `build_tiny_owlv2`: `Owlv2ForObjectDetection` + `Owlv2Processor` with the real CLIP BPE
  tokenizer (pad token "!", 16 tokens per query, as `google/owlv2-base-patch16-ensemble`).
- `build_tiny_owlvit`: the same for OWL-ViT v1, `OwlViTForObjectDetection` + `OwlViTProcessor`
  (model type "owlvit"; images resized without padding, as `google/owlvit-base-patch32`).

Only the sizes differ from the real checkpoints: images of 32-64 pixels, hidden sizes of 32,
one or two layers per block; each model saves in well under a second and runs in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gors.testing.blip import SPECIAL_TOKENS, tiny_vocab
from gors.testing.sd import write_clip_tokenizer_files

# BERT (bert-base-uncased) ids that Grounding DINO's text masking relies on.
_BERT_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, ".": 1012, "?": 1029}
GROUNDING_DINO_IMAGE_SIZE = 64
OWLV2_IMAGE_SIZE = 32  # OWLv2 and OWL-ViT v1


def grounding_dino_vocab() -> list[str]:
    """A WordPiece vocabulary with BERT's ids for the special tokens, "." and "?".

    Slots below 1030 that BERT uses for other words are filled with "[unusedN]" placeholders
    (never produced by the tokenizer); the words and letters of `gors.testing.blip.tiny_vocab`
    follow, so every lower-case word is tokenisable.
    """
    size = max(_BERT_IDS.values()) + 1
    vocab = [f"[unused{i}]" for i in range(size)]
    for token, index in _BERT_IDS.items():
        vocab[index] = token
    vocab += [t for t in tiny_vocab() if t not in _BERT_IDS and t not in SPECIAL_TOKENS]
    return vocab


def build_tiny_grounding_dino(save_dir: str | Path, seed: int = 0, mm: bool = False) -> Path:
    """Create and save a tiny random (MM-)Grounding DINO detector and its processor.

    `AutoModelForZeroShotObjectDetection.from_pretrained(save_dir)` and
    `AutoProcessor.from_pretrained(save_dir)` load it offline. Images are resized to a shortest
    edge of 64 pixels (longest 96). The same `seed` gives the same weights.

    Args:
        save_dir: the folder to write (created if missing); returned.
        seed: seed of the random initialisation.
        mm: build `MMGroundingDinoForObjectDetection` (model type "mm-grounding-dino") instead of
            `GroundingDinoForObjectDetection`.
    """
    from transformers import (
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessor,
        GroundingDinoProcessor,
        MMGroundingDinoConfig,
        MMGroundingDinoForObjectDetection,
    )

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    vocab = grounding_dino_vocab()
    tokenizer = BertTokenizer(vocab={token: i for i, token in enumerate(vocab)}, do_lower_case=True)
    for token, index in _BERT_IDS.items():
        if tokenizer.convert_tokens_to_ids(token) != index:
            raise RuntimeError(f"{token} got id {tokenizer.convert_tokens_to_ids(token)}, expected {index}")
    image_processor = GroundingDinoImageProcessor(
        size={"shortest_edge": GROUNDING_DINO_IMAGE_SIZE, "longest_edge": 96}
    )
    GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(save_dir)

    config_class, model_class = (
        (MMGroundingDinoConfig, MMGroundingDinoForObjectDetection)
        if mm
        else (GroundingDinoConfig, GroundingDinoForObjectDetection)
    )
    config = config_class(
        backbone_config={
            "model_type": "swin",
            "image_size": GROUNDING_DINO_IMAGE_SIZE,
            # Patches of 2 keep the smallest (extra) feature level at >= 2 x 2 pixels: its
            # GroupNorm(32 groups, 32 channels) needs more than one value per group.
            "patch_size": 2,
            "embed_dim": 8,
            "depths": [1, 1, 1, 1],
            "num_heads": [1, 1, 2, 2],
            "window_size": 4,
            "out_features": ["stage2", "stage3", "stage4"],
        },
        text_config={
            "model_type": "bert",
            "vocab_size": len(vocab),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "max_position_embeddings": 256,
            "pad_token_id": 0,
        },
        d_model=32,
        num_queries=30,
        encoder_layers=1,
        encoder_ffn_dim=64,
        encoder_attention_heads=2,
        decoder_layers=2,
        decoder_ffn_dim=64,
        decoder_attention_heads=2,
        encoder_n_points=2,
        decoder_n_points=2,
        num_feature_levels=4,
    )
    torch.manual_seed(seed)
    model = model_class(config).eval()
    model.save_pretrained(save_dir)
    return save_dir


def build_tiny_owlv2(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random OWLv2 detector (`Owlv2ForObjectDetection`) and its processor.

    Images are padded to a square and resized to 32 x 32 pixels (8 x 8 patches, so 16 boxes per
    image); queries are tokenised with the real CLIP BPE vocabulary. The same `seed` gives the
    same weights.
    """
    return _build_tiny_owl(save_dir, seed, version=2)


def build_tiny_owlvit(save_dir: str | Path, seed: int = 0) -> Path:
    """Create and save a tiny random OWL-ViT (v1) detector (`OwlViTForObjectDetection`) and its processor.

    Model type "owlvit". Unlike OWLv2, images are *not* padded: they are resized (stretched) to
    32 x 32 pixels (8 x 8 patches, so 16 boxes per image), so boxes are fractions of the image's
    width and height. Queries are tokenised as for `build_tiny_owlv2`. The same `seed` gives the
    same weights.
    """
    return _build_tiny_owl(save_dir, seed, version=1)


def _build_tiny_owl(save_dir: str | Path, seed: int, version: int) -> Path:
    """`build_tiny_owlv2` (version 2) or `build_tiny_owlvit` (version 1): the same sizes, other classes."""
    from transformers import CLIPTokenizer

    if version == 2:
        from transformers import Owlv2Config as Config
        from transformers import Owlv2ForObjectDetection as Model
        from transformers import Owlv2ImageProcessor as ImageProcessor
        from transformers import Owlv2Processor as Processor
    else:
        from transformers import OwlViTConfig as Config
        from transformers import OwlViTForObjectDetection as Model
        from transformers import OwlViTImageProcessor as ImageProcessor
        from transformers import OwlViTProcessor as Processor

    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = write_clip_tokenizer_files(save_dir / "_tokenizer_files")
    # OWL-ViT/OWLv2 tokenizers pad with "!" (id 0): a padded query starts with a real token.
    tokenizer = CLIPTokenizer(
        str(tokenizer_dir / "vocab.json"),
        str(tokenizer_dir / "merges.txt"),
        pad_token="!",
        model_max_length=16,
    )
    # OWL-ViT v1 resizes straight to this size (no centre crop, as the real checkpoints, whose
    # crop size equals the resize size); OWLv2 pads to a square first.
    image_processor = ImageProcessor(size={"height": OWLV2_IMAGE_SIZE, "width": OWLV2_IMAGE_SIZE})
    Processor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(save_dir)
    config = Config(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "max_position_embeddings": 16,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": OWLV2_IMAGE_SIZE,
            "patch_size": 8,
        },
        projection_dim=32,
    )
    torch.manual_seed(seed)
    model = Model(config).eval()
    model.save_pretrained(save_dir)
    return save_dir
