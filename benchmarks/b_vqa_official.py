"""B-VQA: gors' reward against T2I-CompBench's own BLIP code, on the same random weights.

An agreement check, not a speed script (not in `python -m benchmarks`): `rewards/b_vqa.py`
reimplements T2I-CompBench's B-VQA metric on transformers' `BlipForQuestionAnswering`; this runs the
official code itself (``BLIPvqa_eval/`` of a T2I-CompBench checkout, ``--official``) next to it.

1. The official model: ``models/blip_vqa.py``'s `blip_vqa` with the arguments `VQA()` of
   ``BLIP/train_vqa_func.py`` passes (``configs/vqa.yaml``: ViT 'base' at 480 px, no checkpointing;
   ``configs/med_config.json``), without a checkpoint (none offline), its weights then refilled at
   random (seeded; every tensor, biases and LayerNorms included, so that a weight mapped to the
   wrong place shows; std 0.05, ``--init_std``: at BLIP's own 0.02 the image moves P(yes) so little
   that a wrong LayerNorm eps or resize stays within float32 noise, see ``--controls``). Its
   tokenizer is BLIP's `init_tokenizer` (BERT's, then [DEC] as bos, then [ENC]) on a local BERT
   vocabulary written here: 30522 entries with BERT's ids for what the code hard-codes ([PAD] 0,
   [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, "yes" 2748, "no" 2053; [DEC] and [ENC] come out
   as 30522 and 30523), the prompts' words, letters and "##" letters elsewhere.
2. Conversion, with this script's own key mapping, to a `BlipForQuestionAnswering` (vision LayerNorm
   eps 1e-6 as in BLIP's ViT), saved with a `BlipProcessor` (`BlipImageProcessor` at 480 px, the
   tokenizer with [DEC] as bos as on the Hub) into a model folder; every official tensor must land
   in exactly one transformers tensor and every transformers tensor must be filled (the one official
   key left out is explained where it is dropped). After gors loads the folder, each of its tensors
   is compared with the official one it came from.
3. Scoring, the official way: ``BLIP_vqa.py``'s loop of ``--np_num`` (8) passes, pass i asking each
   image its i-th question ('' when it has fewer, answer replaced by 1), each pass through the
   official pieces of `VQA_main`: an annotation file ``vqa_test.json``, ``data``'s
   `create_dataset('vqa', config)` (its ``transform_test``: PIL bicubic resize to 480, ToTensor,
   CLIP normalisation; ``vqa_dataset`` opening the PNG files and applying `pre_question`) and
   `create_loader` (test batch 32), then `evaluation` of ``train_vqa_func.py`` (`model.eval()`,
   `torch.no_grad`, ``inference='vqa_prob'``: [ENC] first, the questions padded to the longest of
   the batch, P(yes) / (P(yes) + P(no)) at the [DEC] position, written ``'{:.4f}'``); the answers go
   into a float32 tensor, multiplied pass by pass and written ``'{:.4f}'`` as ``BLIP_vqa.py``'s
   `main` does. The unrounded P(yes) are recorded on the way (the model's `vqa_prob` wrapped; it
   returns what it computed). The questions are gors' (``noun_phrase_backend="builtin"``): the
   comparison is of the model and the scoring, not of the noun-phrase parser.
   gors' way: `BVQAReward(model_name_or_path=<folder>, image_size=480, ...)` on the same images
   (read from the same PNG files) and prompts, with its default 4-decimal rounding.

What the official code needs that this environment lacks is shimmed here, without touching its files
(`install_shims`): ``fairscale`` (imported by ``models/vit.py`` for gradient checkpointing, which
vqa.yaml leaves off), ``cv2`` (imported by ``transform/randaugment.py`` for the training
augmentation only), ``ruamel_yaml`` (PyYAML stands in; this script reads vqa.yaml itself), the
transformers 4 helpers ``models/med.py`` imports from ``transformers.modeling_utils`` and the
``PreTrainedModel`` methods it calls (`invert_attention_mask`, `get_head_mask`) that transformers 5
removed, re-implemented as transformers 4.30.2 (T2I-CompBench's pin) has them, and the tokenizer's
``additional_special_tokens_ids`` (transformers 5: ``extra_special_tokens``), and `init_weights`,
which in transformers 5 needs state that only its own models set up: 4.30.2's is put in its place
(each module's `_init_weights`, then the answer decoder's output projection tied to its word
embeddings, as in the official environment and its checkpoint).
``--small`` keeps the widths and the vocabulary and cuts depth: a reduced copy of med_config.json
(2 text layers) and the ViT's block list cut to its first 2 after construction (``create_vit``
fixes 'base' at 12 blocks; no code is patched for it).

    python benchmarks/b_vqa_official.py --official /path/to/T2I-CompBench --controls  # full size, CPU
    python benchmarks/b_vqa_official.py --official /path/to/T2I-CompBench --small     # 2 + 2 layers

(with the repository root on PYTHONPATH and HF_HUB_OFFLINE=1: nothing is downloaded).

It prints each question's two P(yes) and their difference, each image's two scores, and exits
non-zero when they disagree beyond the tolerances (see `check`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageDraw

# ----- settings ------------------------------------------------------------------------------------
OFFICIAL_IMAGE_SIZE = 480  # configs/vqa.yaml: image_size
BERT_VOCAB_SIZE = 30522  # bert-base-uncased; BLIP adds [DEC] (30522) and [ENC] (30523): med_config's 30524
# Ids the official code relies on: BERT's specials, and vqa_prob's hard-coded "yes" / "no" (and 30522 = [DEC]).
BERT_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103, "yes": 2748, "no": 2053}
FIRST_WORD_ID = 1000  # where this script's other vocabulary words start (BERT's words start near there too)

# T2I-CompBench-style colour prompts, one per image; "teddy" and "kite" are not whole words of the
# vocabulary written here, so their questions are longer and the official batch pads the others.
PROMPTS = [
    "a green bench and a red car",
    "a blue cat and a brown dog",
    "a pink bag, a gray box and a blue ball",
    "A red apple and a green teddy bear.",
    "a white vase on the left of a black book",
    "a metallic spherical clock and a wooden triangular kite",
]

# Tolerances (see `check`): float32 P(yes) of the two implementations, and the 4-decimal outputs.
P_YES_TOLERANCE = 1e-5
ROUNDED_TOLERANCE = 1e-4


# ----- the official code, importable here -----------------------------------------------------------


def blip_folder(path: str | Path) -> Path:
    """The BLIPvqa_eval folder of a T2I-CompBench checkout (or that folder itself)."""
    path = Path(path).resolve()
    for candidate in (path, path / "BLIPvqa_eval"):
        if (candidate / "models" / "blip_vqa.py").is_file() and (candidate / "BLIP" / "train_vqa_func.py").is_file():
            return candidate
    raise SystemExit(f"--official {path}: no BLIPvqa_eval/models/blip_vqa.py there")


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def install_shims(tokenizer_dir: Path) -> None:
    """Make the official code importable here (see the module docstring); touches none of its files."""
    import transformers
    import transformers.modeling_utils as modeling_utils
    import transformers.pytorch_utils as pytorch_utils
    import yaml

    def unavailable(what: str):
        def call(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{what} is shimmed out by b_vqa_official.py; the B-VQA evaluation does not call it")
        return call

    # fairscale: models/vit.py imports checkpoint_wrapper, used only with vit_grad_ckpt=True (vqa.yaml: False).
    if "fairscale" not in sys.modules:
        _module("fairscale")
        _module("fairscale.nn")
        _module("fairscale.nn.checkpoint")
        _module("fairscale.nn.checkpoint.checkpoint_activations",
                checkpoint_wrapper=unavailable("fairscale's checkpoint_wrapper"))
    # cv2: transform/randaugment.py (imported by data/__init__.py) uses it in the training augmentation only.
    with contextlib.suppress(ImportError):
        import cv2  # noqa: F401
    if "cv2" not in sys.modules:
        _module("cv2")
    # ruamel_yaml: BLIP/train_vqa_func.py imports it for VQA_main's config file, which this script reads
    # itself (with PyYAML, the same plain YAML); PyYAML has the load(..., Loader=yaml.Loader) / dump it calls.
    if "ruamel_yaml" not in sys.modules:
        sys.modules["ruamel_yaml"] = yaml
    # transformers 5 moved or dropped what models/med.py imports from transformers.modeling_utils.
    for name in ("apply_chunking_to_forward", "prune_linear_layer"):
        if not hasattr(modeling_utils, name):
            setattr(modeling_utils, name, getattr(pytorch_utils, name))
    if not hasattr(modeling_utils, "find_pruneable_heads_and_indices"):  # head pruning only
        modeling_utils.find_pruneable_heads_and_indices = unavailable("find_pruneable_heads_and_indices")

    from models import blip, med  # the official modules (BLIPvqa_eval is on sys.path)

    # transformers 5's PreTrainedModel lacks two methods med.py's BertModel.forward calls: as in 4.30.2.
    def invert_attention_mask(self: Any, encoder_attention_mask: torch.Tensor) -> torch.Tensor:
        if encoder_attention_mask.dim() == 3:
            extended = encoder_attention_mask[:, None, :, :]
        else:
            extended = encoder_attention_mask[:, None, None, :]
        extended = extended.to(dtype=self.dtype)
        return (1.0 - extended) * torch.finfo(self.dtype).min

    def get_head_mask(self: Any, head_mask: Any, num_hidden_layers: int, is_attention_chunked: bool = False) -> Any:
        if head_mask is not None:
            raise NotImplementedError("head masks are shimmed out by b_vqa_official.py (B-VQA passes none)")
        return [None] * num_hidden_layers

    for method in (invert_attention_mask, get_head_mask):
        if not hasattr(med.BertPreTrainedModel, method.__name__):
            setattr(med.BertPreTrainedModel, method.__name__, method)

    # transformers 5's init_weights needs what its post_init sets up (med.py's models never call it). As in
    # 4.30.2: initialise every module with the class's _init_weights, then tie the output embeddings (the
    # answer decoder's LM projection) to the input word embeddings, which BertConfig's tie_word_embeddings asks.
    def init_weights(self: Any) -> None:
        self.apply(self._init_weights)
        output_embeddings = self.get_output_embeddings()
        if output_embeddings is not None and getattr(self.config, "tie_word_embeddings", True):
            output_embeddings.weight = self.get_input_embeddings().weight

    if int(transformers.__version__.split(".")[0]) >= 5:
        med.BertPreTrainedModel.init_weights = init_weights

    # init_tokenizer loads 'bert-base-uncased' from the Hub: the local vocabulary instead. Its
    # additional_special_tokens_ids is transformers 5's extra_special_tokens.
    base = blip.BertTokenizer

    class LocalBertTokenizer(base):  # type: ignore[misc, valid-type]
        @classmethod
        def from_pretrained(cls, name: str, *args: Any, **kwargs: Any) -> Any:
            if name != "bert-base-uncased":
                raise ValueError(f"unexpected tokenizer {name!r}")
            return super().from_pretrained(str(tokenizer_dir), *args, **kwargs)

        if not hasattr(base, "additional_special_tokens_ids"):
            @property
            def additional_special_tokens_ids(self) -> list[int]:
                return self.convert_tokens_to_ids(list(self.extra_special_tokens))

    blip.BertTokenizer = LocalBertTokenizer


def write_bert_vocab(folder: Path) -> Path:
    """A 30522-entry BERT WordPiece vocabulary with BERT's ids where the official code uses them."""
    from gors.testing.blip import tiny_vocab

    vocab: list[str | None] = [None] * BERT_VOCAB_SIZE
    for token, index in BERT_IDS.items():
        vocab[index] = token
    free = (i for i in range(FIRST_WORD_ID, BERT_VOCAB_SIZE) if vocab[i] is None)
    for token in tiny_vocab():
        if token not in BERT_IDS:
            vocab[next(free)] = token
    unused = iter(range(BERT_VOCAB_SIZE))
    vocab = [token if token is not None else f"[unused{next(unused)}]" for token in vocab]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return folder


# ----- the official model -----------------------------------------------------------------------------


def build_official(blip_dir: Path, workdir: Path, vision_layers: int, text_layers: int, seed: int,
                   init_std: float) -> torch.nn.Module:
    """`blip_vqa` as VQA() builds it (without its checkpoint), at the given depths, random weights."""
    from models.blip_vqa import blip_vqa

    med_config = blip_dir / "configs" / "med_config.json"
    config = json.loads(med_config.read_text())
    if text_layers != config["num_hidden_layers"]:
        config["num_hidden_layers"] = text_layers
        med_config = workdir / "med_config.json"
        med_config.write_text(json.dumps(config, indent=2))
    with contextlib.redirect_stdout(io.StringIO()):
        model = blip_vqa(pretrained="", image_size=OFFICIAL_IMAGE_SIZE, vit="base", vit_grad_ckpt=False,
                         vit_ckpt_layer=0, med_config=str(med_config))
    if vision_layers != len(model.visual_encoder.blocks):
        model.visual_encoder.blocks = model.visual_encoder.blocks[:vision_layers]
    decoder = model.text_decoder
    if decoder.cls.predictions.decoder.weight is not decoder.bert.embeddings.word_embeddings.weight:
        raise RuntimeError("the answer decoder's output projection is not tied to its word embeddings")
    randomise(model, seed, init_std)
    return model.eval()


@torch.no_grad()
def randomise(model: torch.nn.Module, seed: int, std: float) -> None:
    """Refill every parameter: weights and embeddings N(0, std), biases N(0, std), LayerNorm scales
    1 + N(0, 0.1) and shifts N(0, 0.1); shared tensors once."""
    generator = torch.Generator().manual_seed(seed)
    layer_norms = {id(p) for m in model.modules() if isinstance(m, torch.nn.LayerNorm) for p in m.parameters()}
    seen: set[int] = set()
    for name, parameter in model.named_parameters():
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        noise = torch.randn(parameter.shape, generator=generator)
        if id(parameter) in layer_norms:
            parameter.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
        else:
            parameter.copy_(std * noise)


# ----- conversion ------------------------------------------------------------------------------------------

VISION_FIXED = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
VISION_BLOCK = {"norm1": "layer_norm1", "attn.qkv": "self_attn.qkv", "attn.proj": "self_attn.projection",
                "norm2": "layer_norm2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
# BERT text towers: the same module names on both sides (BLIP's med.py is transformers' BlipText* model's origin).
TEXT_PREFIXES = ("text_encoder.", "text_decoder.")
# A buffer of med.py's BertEmbeddings (torch.arange, saved with the model); transformers' is not saved.
DROPPED_BUFFER = "embeddings.position_ids"


def transformers_key(key: str) -> str | None:
    """The `BlipForQuestionAnswering` key of an official `BLIP_VQA` state-dict key (None: dropped, see
    DROPPED_BUFFER); raises on a key it does not know."""
    if key.startswith("visual_encoder."):
        rest = key.removeprefix("visual_encoder.")
        if rest in VISION_FIXED:
            return f"vision_model.{VISION_FIXED[rest]}"
        parts = rest.split(".")
        module, leaf = ".".join(parts[2:-1]), parts[-1]
        if parts[0] == "blocks" and parts[1].isdigit() and module in VISION_BLOCK and leaf in ("weight", "bias"):
            return f"vision_model.encoder.layers.{parts[1]}.{VISION_BLOCK[module]}.{leaf}"
    elif key.startswith(TEXT_PREFIXES):
        return None if key.endswith(DROPPED_BUFFER) else key
    raise KeyError(f"no mapping for the official key {key!r}")


def convert(official: torch.nn.Module, vision_layers: int, text_layers: int) -> tuple[Any, dict[str, str]]:
    """A `BlipForQuestionAnswering` holding the official weights, and the key map (official -> transformers)."""
    from transformers import BlipConfig, BlipForQuestionAnswering
    from transformers.initialization import no_init_weights

    tokenizer = official.tokenizer
    vit, bert = official.visual_encoder, official.text_encoder.config
    config = BlipConfig(
        vision_config={
            "hidden_size": vit.embed_dim, "intermediate_size": vit.blocks[0].mlp.fc1.out_features,
            "num_hidden_layers": vision_layers, "num_attention_heads": vit.blocks[0].attn.num_heads,
            "patch_size": vit.patch_embed.proj.kernel_size[0], "image_size": OFFICIAL_IMAGE_SIZE,
            "hidden_act": "gelu", "layer_norm_eps": vit.norm.eps,  # BLIP's ViT: exact GELU, eps 1e-6
        },
        text_config={
            "vocab_size": bert.vocab_size, "hidden_size": bert.hidden_size, "encoder_hidden_size": vit.embed_dim,
            "intermediate_size": bert.intermediate_size, "num_hidden_layers": text_layers,
            "num_attention_heads": bert.num_attention_heads, "max_position_embeddings": bert.max_position_embeddings,
            "hidden_act": bert.hidden_act, "layer_norm_eps": bert.layer_norm_eps,
            "bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "sep_token_id": tokenizer.sep_token_id, "eos_token_id": tokenizer.sep_token_id,
        },
    )
    with no_init_weights():
        model = BlipForQuestionAnswering(config).eval()
    source = official.state_dict()
    key_map: dict[str, str] = {}
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in source.items():
        target = transformers_key(key)
        if target is None:
            if not torch.equal(tensor, torch.arange(tensor.shape[-1]).expand(1, -1)):
                raise ValueError(f"{key} is not the arange it should be")
            continue
        if target in converted:
            raise ValueError(f"two official keys map to {target}")
        key_map[key] = target
        converted[target] = tensor
    result = model.load_state_dict(converted, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise SystemExit(f"conversion: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    return model, key_map


def save_model_folder(model: Any, folder: Path, vocab_dir: Path) -> None:
    """The converted model with a `BlipProcessor` (BERT tokenizer with [DEC] as bos, as the Hub's BLIP VQA
    tokenizer; image processor at 480 px, bicubic, CLIP mean and std), loadable by `BVQAReward`."""
    from transformers import BertTokenizer, BlipImageProcessor, BlipProcessor

    tokenizer = BertTokenizer.from_pretrained(str(vocab_dir), bos_token="[DEC]")
    if tokenizer.bos_token_id != BERT_VOCAB_SIZE:
        raise RuntimeError(f"[DEC] got id {tokenizer.bos_token_id}")
    image_processor = BlipImageProcessor(size={"height": OFFICIAL_IMAGE_SIZE, "width": OFFICIAL_IMAGE_SIZE})
    model.save_pretrained(folder)
    BlipProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)


def compare_loaded(official: torch.nn.Module, loaded: torch.nn.Module, key_map: dict[str, str]) -> int:
    """Check that gors' loaded model holds each official tensor under its mapped key, and nothing else."""
    source, target = official.state_dict(), loaded.state_dict()
    for key, mapped in key_map.items():
        if mapped not in target or not torch.equal(source[key].cpu(), target[mapped].cpu()):
            raise SystemExit(f"gors' loaded model differs from the official {key} at {mapped}")
    unfilled = set(target) - set(key_map.values())
    if unfilled:
        raise SystemExit(f"gors' loaded model has tensors no official weight filled: {sorted(unfilled)}")
    return len(key_map)


# ----- inputs -------------------------------------------------------------------------------------------------


def make_images(seed: int = 0) -> list[Image.Image]:
    """Six varied RGB images: noise, gradients, shapes, sizes below, at and above 480 px and not square."""
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))]  # SD-2-base's size
    y, x = np.mgrid[0:512, 0:512] / 511.0
    images.append(Image.fromarray((np.stack([x, y, 1 - x], -1) * 255).round().astype(np.uint8)))
    y, x = np.mgrid[0:480, 0:480] / 479.0  # already 480: the resize leaves it as it is
    radial = np.sqrt((x - 0.5) ** 2 + (y - 0.5) ** 2)
    images.append(Image.fromarray((np.stack([radial, 1 - radial, x * y], -1).clip(0, 1) * 255).astype(np.uint8)))
    shapes = Image.new("RGB", (512, 512), "white")
    draw = ImageDraw.Draw(shapes)
    draw.rectangle((40, 60, 230, 250), fill=(220, 30, 30))
    draw.ellipse((260, 200, 480, 470), fill=(30, 180, 60))
    draw.polygon([(100, 480), (200, 300), (300, 480)], fill=(40, 60, 220))
    images.append(shapes)
    wide = Image.new("RGB", (640, 384), (20, 20, 30))  # not square: the resize changes the aspect
    draw = ImageDraw.Draw(wide)
    draw.ellipse((60, 60, 300, 300), fill=(250, 240, 240))
    draw.rectangle((380, 100, 600, 340), fill=(10, 10, 10), outline=(200, 200, 0), width=8)
    images.append(wide)
    coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)  # smooth noise, upscaled from 8 x 8 to 256
    images.append(Image.fromarray(coarse).resize((256, 256), Image.Resampling.BICUBIC))
    return images


def save_images(images: list[Image.Image], prompts: list[str], folder: Path) -> list[Path]:
    """PNG files named as T2I-CompBench's samples ("<prompt>_<index>.png")."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (image, prompt) in enumerate(zip(images, prompts, strict=True)):
        path = folder / f"{prompt}_{index:06d}.png"
        image.save(path)
        paths.append(path)
    return paths


# ----- the two procedures ----------------------------------------------------------------------------------


def official_scores(model: torch.nn.Module, blip_dir: Path, paths: list[Path], questions: list[list[str]],
                    np_num: int, device: torch.device, workdir: Path) -> tuple[list[str], list[list[float | None]],
                                                                               list[list[str | None]]]:
    """BLIP_vqa.py's main loop through the official VQA_main pieces (see the module docstring): each image's
    score string, its unrounded P(yes) per pass and its '{:.4f}' answer per pass (None where no question)."""
    import yaml
    from BLIP.train_vqa_func import evaluation
    from data import create_dataset, create_loader
    from data.vqa_dataset import vqa_collate_fn

    config = yaml.load((blip_dir / "configs" / "vqa.yaml").read_text(), Loader=yaml.Loader)
    config["inference"] = "vqa_prob"  # VQA_main's default
    recorded: list[torch.Tensor] = []
    vqa_prob = model.vqa_prob

    def recording_vqa_prob(question_states: torch.Tensor, question_atts: torch.Tensor) -> torch.Tensor:
        probabilities = vqa_prob(question_states, question_atts)
        recorded.append(probabilities.detach().float().cpu())
        return probabilities

    model.vqa_prob = recording_vqa_prob
    model.to(device)
    count = len(paths)
    reward = torch.zeros((count, np_num), device=device)
    raw: list[list[float | None]] = [[None] * np_num for _ in paths]
    answers: list[list[str | None]] = [[None] * np_num for _ in paths]
    try:
        for i in range(np_num):
            ann_root = workdir / f"annotation{i + 1}_blip"
            ann_root.mkdir(parents=True, exist_ok=True)
            annotation = [{"image": str(path), "question_id": k, "question": qs[i] if len(qs) > i else "",
                           "dataset": "color"} for k, (path, qs) in enumerate(zip(paths, questions, strict=True))]
            (ann_root / "vqa_test.json").write_text(json.dumps(annotation))
            config["ann_root"] = f"{ann_root}/"
            datasets = create_dataset("vqa", config)
            _, test_loader = create_loader(datasets, [None, None],
                                           batch_size=[config["batch_size_train"], config["batch_size_test"]],
                                           num_workers=[1, 1], is_trains=[True, False],
                                           collate_fns=[vqa_collate_fn, None])
            recorded.clear()
            with contextlib.redirect_stdout(io.StringIO()):
                result = evaluation(model, test_loader, device, config)
            probabilities = torch.cat(recorded).tolist()
            for k, row in enumerate(annotation):
                if row["question"] != "":
                    reward[k][i] = float(result[k]["answer"])
                    raw[k][i], answers[k][i] = probabilities[k], result[k]["answer"]
                else:
                    reward[k][i] = 1
    finally:
        model.vqa_prob = vqa_prob
    reward_final = reward[:, 0]
    for i in range(1, np_num):
        reward_final *= reward[:, i]
    return ["{:.4f}".format(reward_final[k].item()) for k in range(count)], raw, answers


def token_ids_agree(official: torch.nn.Module, reward: Any, questions: list[str]) -> bool:
    """Whether gors sends the official token ids: the official tokenizer on `pre_question`, [ENC] first, against
    gors' tokenizer on its `official_question`, [ENC] first."""
    from data.utils import pre_question

    from rewards.b_vqa import MAX_QUESTION_TOKENS, official_question

    ours = reward.processor.tokenizer([official_question(q) for q in questions], truncation=True,
                                      max_length=MAX_QUESTION_TOKENS).input_ids
    theirs = official.tokenizer([pre_question(q) for q in questions], truncation=True, max_length=35).input_ids
    ours = [[reward.question_start_id, *ids[1:]] for ids in ours]
    theirs = [[official.tokenizer.enc_token_id, *ids[1:]] for ids in theirs]
    return ours == theirs


def run_controls(reward: Any, folder: Path, images: list[Image.Image], prompts: list[str],
                 official_raw: list[list[float | None]]) -> dict[str, float]:
    """Max |P(yes) difference| from the official values of gors run with one known deviation at a time (each
    undone afterwards), to show that the set-up (random weights) tells such differences apart."""
    from transformers import BlipImageProcessor

    from rewards.b_vqa import BLIP_VIT_LAYER_NORM_EPS, set_vision_layer_norm_eps

    def difference() -> float:
        output = reward.score(images, prompts)
        return max(abs(p - official) for details, row in zip(output.details, official_raw, strict=True)
                   for p, official in zip(details["p_yes"], [v for v in row if v is not None], strict=True))

    results = {}
    start_id, reward.question_start_id = reward.question_start_id, None
    results["question_start='cls' ([CLS] first, transformers' generate)"] = difference()
    reward.question_start_id = start_id
    set_vision_layer_norm_eps(reward.model.vision_model, 1e-5)
    results["vision LayerNorm eps 1e-5 (transformers' BLIP default)"] = difference()
    set_vision_layer_norm_eps(reward.model.vision_model, BLIP_VIT_LAYER_NORM_EPS)
    pil_processor = reward.processor.image_processor
    reward.processor.image_processor = BlipImageProcessor.from_pretrained(str(folder))
    results["image resize on tensors (transformers' default BlipImageProcessor)"] = difference()
    reward.processor.image_processor = pil_processor
    return results


# ----- the comparison ------------------------------------------------------------------------------------


def check(rows: list[dict[str, Any]], images: list[dict[str, Any]]) -> list[str]:
    """What disagrees beyond the tolerances.

    Unrounded P(yes): within P_YES_TOLERANCE (1e-5). Both are float32 computations of the same function
    by different code (kernel order, batch composition and padding differ), which leaves differences of
    order 1e-7 to 1e-6 after ~30 float32 layers; 1e-5 is 100 x float32's resolution near 0.5, yet 10 x below
    the 4-decimal output's step, so any modelling difference (token, mask, transform, eps, position) that
    moves an answer's printed value would still be caught.
    4-decimal answers and image scores: equal, or 1e-4 apart (ROUNDED_TOLERANCE, one unit of the last
    place) where an unrounded value lies within the P(yes) tolerance of a rounding boundary, so that a
    1e-7 difference may round the other way. Unrounded image products: within the number of questions
    times the P(yes) tolerance (a product of numbers in [0, 1] moves by at most the sum of their moves).
    `--controls` shows the other side: deviations that gors corrected (the [CLS] start, the vision
    LayerNorm eps, the tensor resize) move P(yes) by 2e-5 to 1e-1 at the default weights' scale.
    """
    problems = []
    for row in rows:
        if row["diff"] > P_YES_TOLERANCE:
            problems.append(f"image {row['image']} {row['question']!r}: P(yes) differs by {row['diff']:.2e}")
        rounded_diff = abs(float(row["official_answer"]) - round(row["gors"], 4))
        near = abs((row["official"] * 1e4) % 1 - 0.5) * 1e-4 < P_YES_TOLERANCE
        if rounded_diff > 1e-9 and not (near and rounded_diff <= ROUNDED_TOLERANCE + 1e-9):
            problems.append(f"image {row['image']} {row['question']!r}: 4-decimal answers {row['official_answer']} "
                            f"and {round(row['gors'], 4)}")
    for image in images:
        if image["diff"] > ROUNDED_TOLERANCE + 1e-9 or (image["diff"] > 1e-9 and not image["near_boundary"]):
            problems.append(f"image {image['image']}: scores {image['official']} and {image['gors']}")
        if image["exact_diff"] > image["questions"] * P_YES_TOLERANCE:  # |prod a - prod b| <= sum |a - b| in [0, 1]
            problems.append(f"image {image['image']}: unrounded products differ by {image['exact_diff']:.2e}")
    return problems


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--official", required=True, help="a T2I-CompBench checkout or its BLIPvqa_eval folder")
    parser.add_argument("--small", action="store_true", help="2 vision + 2 text layers (widths and vocabulary kept)")
    parser.add_argument("--vision_layers", type=int, default=12, help="of BLIP ViT-B/16's 12")
    parser.add_argument("--text_layers", type=int, default=12, help="of med_config's 12 (encoder and decoder each)")
    parser.add_argument("--np_num", type=int, default=8, help="BLIP_vqa.py's passes (its default 8)")
    parser.add_argument("--batch_size", type=int, default=16, help="gors' question batch (gors score's default)")
    parser.add_argument("--init_std", type=float, default=0.05,
                        help="std of the random weights (BLIP's init: 0.02, under which the image barely moves P(yes))")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--controls", action="store_true",
                        help="also run gors with known deviations, to show that the set-up catches them")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.small:
        args.vision_layers, args.text_layers = 2, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()  # med.py's classes warn of transformers 5's API changes
    transformers_logging.disable_progress_bar()
    device = torch.device(args.device)
    blip_dir = blip_folder(args.official)
    sys.path.insert(0, str(blip_dir))
    from rewards.b_vqa import BVQAReward
    from rewards.noun_phrases import vqa_questions

    with tempfile.TemporaryDirectory(prefix="b_vqa_official_") as tmp:
        workdir = Path(tmp)
        vocab_dir = write_bert_vocab(workdir / "bert-base-uncased")
        install_shims(vocab_dir)
        official = build_official(blip_dir, workdir, args.vision_layers, args.text_layers, args.seed, args.init_std)
        tokenizer = official.tokenizer
        print(f"official BLIP_VQA from {blip_dir}: {args.vision_layers}/12 vision layers, {args.text_layers}/12 text "
              f"layers, {sum(p.numel() for p in official.parameters()) / 1e6:.0f} M parameters, random weights "
              f"(seed {args.seed}, std {args.init_std}); tokenizer: [DEC] {tokenizer.bos_token_id}, "
              f"[ENC] {tokenizer.enc_token_id}, yes {tokenizer.convert_tokens_to_ids('yes')}, "
              f"no {tokenizer.convert_tokens_to_ids('no')}")
        converted, key_map = convert(official, args.vision_layers, args.text_layers)
        folder = workdir / "model"
        save_model_folder(converted, folder, vocab_dir)
        del converted
        reward = BVQAReward(model_name_or_path=str(folder), device=device, torch_dtype=torch.float32,
                            batch_size=args.batch_size, noun_phrase_backend="builtin", image_size=OFFICIAL_IMAGE_SIZE)
        mapped = compare_loaded(official, reward.model, key_map)
        print(f"conversion: {mapped} official tensors mapped, each equal in gors' loaded model, none of its tensors "
              f"left unfilled; dropped: the {len(official.state_dict()) - mapped} '{DROPPED_BUFFER}' buffers "
              "(torch.arange, not saved by transformers)")

        prompts = PROMPTS
        paths = save_images(make_images(args.seed), prompts, workdir / "samples")
        questions = [vqa_questions(p, args.np_num, "builtin") for p in prompts]
        flat = [q for qs in questions for q in qs]
        lengths = [[len(tokenizer(q).input_ids) for q in qs] for qs in questions]
        padded = [i + 1 for i in range(args.np_num) if len({row[i] for row in lengths if len(row) > i}) > 1]
        print(f"token ids of the {len(flat)} questions ([ENC] first) equal on both sides: "
              f"{token_ids_agree(official, reward, flat)}; question lengths {lengths} tokens, so the official "
              f"batch pads questions in passes {padded}")

        start = time.perf_counter()
        official_out, official_raw, official_answers = official_scores(
            official, blip_dir, paths, questions, args.np_num, device, workdir)
        official_s = time.perf_counter() - start
        start = time.perf_counter()
        images = [Image.open(path).convert("RGB") for path in paths]
        output = reward.score(images, prompts)
        gors_s = time.perf_counter() - start
        controls = run_controls(reward, folder, images, prompts, official_raw) if args.controls else {}

    rows, image_rows = [], []
    print(f"\n{'img':>3} {'question':30s} {'official P(yes)':>16} {'gors P(yes)':>12} {'|diff|':>9} "
          f"{'official':>8} {'gors':>8}")
    for k, (qs, details) in enumerate(zip(questions, output.details, strict=True)):
        for i, (question, p) in enumerate(zip(qs, details["p_yes"], strict=True)):
            row = {"image": k, "question": question, "official": official_raw[k][i], "gors": p,
                   "official_answer": official_answers[k][i]}
            row["diff"] = abs(row["official"] - p)
            rows.append(row)
            print(f"{k:3d} {question:30s} {row['official']:16.8f} {p:12.8f} {row['diff']:9.1e} "
                  f"{row['official_answer']:>8} {round(p, 4):8.4f}")
    print(f"\n{'img':>3} {'official score':>14} {'gors score':>10} {'|diff|':>9} {'unrounded official':>18} "
          f"{'unrounded gors':>14} {'|diff|':>9}")
    for k, details in enumerate(output.details):
        exact_official = math.prod(p for p in official_raw[k] if p is not None)
        exact_gors = math.prod(details["p_yes"])
        score = float(official_out[k])
        near = any(abs((p * 1e4) % 1 - 0.5) * 1e-4 < P_YES_TOLERANCE for p in official_raw[k] if p is not None)
        image_rows.append({"image": k, "official": official_out[k], "gors": output.scores[k], "questions": len(questions[k]),
                           "diff": abs(score - output.scores[k]), "near_boundary": near,
                           "exact_diff": abs(exact_official - exact_gors)})
        print(f"{k:3d} {official_out[k]:>14} {output.scores[k]:10.4f} {image_rows[-1]['diff']:9.1e} "
              f"{exact_official:18.8f} {exact_gors:14.8f} {image_rows[-1]['exact_diff']:9.1e}")
    p_values = [row["official"] for row in rows]
    print(f"\nmax |diff|: per question P(yes) {max(r['diff'] for r in rows):.2e} (unrounded; {len(rows)} questions, "
          f"P(yes) {min(p_values):.4f}-{max(p_values):.4f}), 4-decimal answers "
          f"{max(abs(float(r['official_answer']) - round(r['gors'], 4)) for r in rows):.1e}; per image score "
          f"{max(r['diff'] for r in image_rows):.1e} (4 decimals), {max(r['exact_diff'] for r in image_rows):.2e} "
          f"(unrounded products)")
    print(f"time: official {official_s:.1f} s ({args.np_num} passes), gors {gors_s:.1f} s, whole run "
          f"{time.perf_counter() - started:.0f} s on {device}")
    problems = check(rows, image_rows)
    for name, difference in controls.items():
        seen = "caught" if difference > P_YES_TOLERANCE else "NOT caught: this set-up cannot tell it apart"
        print(f"control, gors {name}: max |P(yes) difference| {difference:.2e} ({seen})")
    for problem in problems:
        print(f"DISAGREEMENT: {problem}")
    if problems:
        return 1
    print(f"agreement: within {P_YES_TOLERANCE:g} per question (unrounded), official 4-decimal outputs reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
