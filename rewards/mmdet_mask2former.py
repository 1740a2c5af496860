"""GenEval's official detector: mmdetection 2.x's Mask2Former Swin-S COCO checkpoint, as a `transformers` model.

GenEval (djghosh13/geneval, `evaluation/download_models.sh`) scores with mmdetection's
`mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco` checkpoint. mmdet/mmcv have no builds for current
PyTorch, so this module maps that checkpoint's tensors onto `Mask2FormerForUniversalSegmentation`
(same architecture, other module names), without mmdet:

- `infer_architecture` reads the sizes from the tensor shapes and refuses any other architecture
  (a ResNet backbone, the 133-class panoptic model, a detectron2 or transformers file) at once;
- `convert_state_dict` is the pure key and tensor mapping (mmdet 2.x names -> transformers names);
- `hf_config` / `write_hf_folder` give a folder that `from_pretrained` and the GenEval reward load;
- `official_detector_folder` downloads the pinned file once and converts it once into the cache.

The tensor transforms, all checked layer by layer against mmdet's forward in the tests:
- Swin attention `w_msa.qkv` (3C, C) is split into q, k, v; mmdet's `relative_position_index`
  buffer equals the original Swin index (it is verified, then dropped: transformers rebuilds it);
- Swin `PatchMerging` gathers each 2x2 patch with `nn.Unfold` (channel-major: c * 4 + 2 * row + col)
  where transformers concatenates the four sub-grids (x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
  x[1::2, 1::2]: (row + 2 * col) * C + c), so `downsample.reduction` columns and `downsample.norm`
  are permuted;
- the decoder self-attention's `nn.MultiheadAttention.in_proj` (3C, C) is split into q, k, v
  projections; its masked cross-attention stays an `nn.MultiheadAttention` in both.
The class order needs no permutation: mmdet's 80 COCO classes are the label ids of the converted
config (`id2label`, mmdet's names), which are also GenEval's `object_names.txt` order. Two tensors
have no mmdet counterpart and get fixed values: SwinModel's final LayerNorm (never used by the
backbone) and the training loss's class weights (mmdet's: 1 per class, 0.1 for "no object").

The download is pinned by URL and by the sha256 prefix in the file name (all mmdetection publishes,
checked as torch.hub's `check_hash` does); no full sha256 of the file is published.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gors.core.data import PinnedSource, cache_root, fetch_pinned_file
from gors.core.io import file_sha256, set_usual_permissions
from rewards.geneval_rules import GENEVAL_CLASSES

if TYPE_CHECKING:
    from transformers import Mask2FormerConfig

OFFICIAL = "official"
CHECKPOINT_STEM = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"
CHECKPOINT_FILE = f"{CHECKPOINT_STEM}_20220504_001756-743b7d99.pth"
# mmdetection names its released files <stem>_<date>-<first 8 hex digits of the file's sha256>
# (torch.hub's check_hash convention); no full sha256 of this file is published.
CHECKPOINT_SHA256_PREFIX = "743b7d99"
OFFICIAL_CHECKPOINT = PinnedSource(
    name="geneval_detector",
    repository="mmdetection/v2.0",
    commit="20220504_001756-743b7d99",
    folder=f"mask2former/{CHECKPOINT_STEM}/",
    sha256={CHECKPOINT_FILE: CHECKPOINT_SHA256_PREFIX},
    offline_hint=f"(the file GenEval's evaluation/download_models.sh fetches, under its released name "
    f"{CHECKPOINT_FILE})",
    url_pattern="https://download.openmmlab.com/{repository}/{path}",
)
# mmdet 2.x `CocoDataset.CLASSES`, the label order of the checkpoint's class head: GenEval's
# `object_names.txt` order (GenEval reads the labels by index), under mmdet's three shorter names.
MMDET_NAMES = {"computer mouse": "mouse", "tv remote": "remote", "computer keyboard": "keyboard"}
MMDET_COCO_CLASSES: tuple[str, ...] = tuple(MMDET_NAMES.get(name, name) for name in GENEVAL_CLASSES)
# Sizes the tensor shapes do not reveal: mmdet's Mask2Former config (attention heads of the pixel
# decoder's deformable attention and of the transformer decoder, sampling points, feature levels).
ATTENTION_HEADS = 8
DEFORMABLE_POINTS = 4
FEATURE_LEVELS = 3
NO_OBJECT_WEIGHT = 0.1  # mmdet's loss_cls class_weight of the "no object" class (used only in training)
PRETRAIN_IMAGE_SIZE = 224  # the Swin-S ImageNet pre-training size; no tensor depends on it
TEST_SIZE = (800, 1333)  # mmdet's test pipeline: Resize img_scale=(1333, 800), keep_ratio; Pad size_divisor=32
# Bump when the converted folder changes, so stale conversions in the cache are not reused.
CONVERSION_VERSION = "transformers-v1"
SOURCE_RECORD = "gors_detector_source.json"


class DetectorConversionError(ValueError):
    """A checkpoint is not mmdetection 2.x's Mask2Former with a Swin backbone and 80 COCO classes."""


@dataclass(frozen=True)
class MmdetMask2FormerArchitecture:
    """The sizes of an mmdet 2.x Mask2Former Swin checkpoint (defaults: GenEval's Swin-S).

    Attributes:
        embed_dim, depths, num_heads, window_size, mlp_ratio: the Swin backbone.
        hidden_dim: feature width of the pixel decoder and the transformer decoder.
        encoder_layers, encoder_ffn: the pixel decoder's deformable-attention layers and FFN width.
        decoder_layers, decoder_ffn: the transformer decoder's layers (mmdet's count, 9) and FFN width.
        num_queries, num_classes: object queries and classes (without "no object").
    """

    embed_dim: int = 96
    depths: tuple[int, ...] = (2, 2, 18, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    mlp_ratio: int = 4
    hidden_dim: int = 256
    encoder_layers: int = 6
    encoder_ffn: int = 1024
    decoder_layers: int = 9
    decoder_ffn: int = 2048
    num_queries: int = 100
    num_classes: int = 80


def _count(state: Mapping[str, torch.Tensor], prefix: str) -> int:
    """How many consecutive `<prefix><i>.` sub-modules the state dict holds."""
    count = 0
    while any(key.startswith(f"{prefix}{count}.") for key in state):
        count += 1
    return count


def _refuse_foreign_layouts(state: Mapping[str, torch.Tensor]) -> None:
    if any(key.startswith("model.pixel_level_module.") for key in state):
        raise DetectorConversionError(
            "this is already a transformers Mask2Former state dict: pass its folder as model_name_or_path directly."
        )
    if any(key.startswith("sem_seg_head.") for key in state):
        raise DetectorConversionError(
            "this is a detectron2 Mask2Former checkpoint (sem_seg_head.*), not mmdetection's; the transformers "
            "Hub checkpoints (facebook/mask2former-*) are those models already converted."
        )
    if any(key.startswith("backbone.layer1.") or key.startswith("backbone.conv1.") for key in state):
        raise DetectorConversionError(
            "the checkpoint has a ResNet backbone (backbone.layer1.*); GenEval's detector is the Swin-S one, "
            f"{CHECKPOINT_FILE}."
        )
    missing = [p for p in ("backbone.stages.0.blocks.0.", "panoptic_head.transformer_decoder.") if not any(
        key.startswith(p) for key in state)]
    if missing:
        raise DetectorConversionError(
            f"no {' and no '.join(p + '*' for p in missing)} tensors: not mmdetection 2.x's Mask2Former with a Swin "
            f"backbone (first keys: {list(state)[:3]}). Pass GenEval's {CHECKPOINT_FILE}."
        )


def infer_architecture(state: Mapping[str, torch.Tensor]) -> MmdetMask2FormerArchitecture:
    """The sizes of an mmdet 2.x Mask2Former Swin state dict, read from its tensor shapes only.

    Cheap (no tensor is read beyond its shape). Raises `DetectorConversionError` naming the problem
    for any other architecture: another backbone or layout, a class count other than COCO's 80
    (the panoptic model has 133), or sizes that contradict mmdet's Mask2Former config.
    """
    _refuse_foreign_layouts(state)

    def shape(key: str) -> tuple[int, ...]:
        if key not in state:
            raise DetectorConversionError(
                f"the checkpoint lacks {key}: not mmdetection 2.x's Mask2Former Swin layout (is it truncated?)"
            )
        return tuple(state[key].shape)

    embed_dim, channels, *patch = shape("backbone.patch_embed.projection.weight")
    if channels != 3 or patch != [4, 4]:
        raise DetectorConversionError(
            f"patch embedding {(embed_dim, channels, *patch)}: expected Swin's 4x4 RGB patches"
        )
    depths = tuple(_count(state, f"backbone.stages.{s}.blocks.") for s in range(_count(state, "backbone.stages.")))
    if len(depths) != 4:
        raise DetectorConversionError(f"{len(depths)} Swin stages; Mask2Former's Swin backbone has 4")
    tables = [shape(f"backbone.stages.{s}.blocks.0.attn.w_msa.relative_position_bias_table") for s in range(4)]
    window_size = (round(tables[0][0] ** 0.5) + 1) // 2
    if any(t[0] != (2 * window_size - 1) ** 2 for t in tables):
        raise DetectorConversionError(f"relative position tables {tables} do not fit one square window")
    hidden = shape("panoptic_head.query_feat.weight")
    classes = shape("panoptic_head.cls_embed.weight")[0] - 1
    if classes != len(MMDET_COCO_CLASSES):
        kind = " (the COCO panoptic model)" if classes == 133 else ""
        raise DetectorConversionError(
            f"the class head has {classes} classes{kind}; GenEval's detector is the 80-class COCO instance model "
            f"{CHECKPOINT_FILE}."
        )
    arch = MmdetMask2FormerArchitecture(
        embed_dim=embed_dim,
        depths=depths,
        num_heads=tuple(t[1] for t in tables),
        window_size=window_size,
        mlp_ratio=shape("backbone.stages.0.blocks.0.ffn.layers.0.0.weight")[0] // embed_dim,
        hidden_dim=hidden[1],
        encoder_layers=_count(state, "panoptic_head.pixel_decoder.encoder.layers."),
        encoder_ffn=shape("panoptic_head.pixel_decoder.encoder.layers.0.ffns.0.layers.0.0.weight")[0],
        decoder_layers=_count(state, "panoptic_head.transformer_decoder.layers."),
        decoder_ffn=shape("panoptic_head.transformer_decoder.layers.0.ffns.0.layers.0.0.weight")[0],
        num_queries=hidden[0],
        num_classes=classes,
    )
    _check_head_sizes(arch, shape)
    return arch


def _check_head_sizes(arch: MmdetMask2FormerArchitecture, shape) -> None:
    levels = shape("panoptic_head.level_embed.weight")[0]
    weights = shape("panoptic_head.pixel_decoder.encoder.layers.0.attentions.0.attention_weights.weight")[0]
    if levels != FEATURE_LEVELS or weights != ATTENTION_HEADS * FEATURE_LEVELS * DEFORMABLE_POINTS:
        raise DetectorConversionError(
            f"{levels} feature levels and {weights} deformable attention weights per query; transformers' "
            f"Mask2Former has {FEATURE_LEVELS} levels x {ATTENTION_HEADS} heads x {DEFORMABLE_POINTS} points = "
            f"{FEATURE_LEVELS * ATTENTION_HEADS * DEFORMABLE_POINTS}"
        )
    if arch.hidden_dim % 32 or arch.hidden_dim % ATTENTION_HEADS:
        raise DetectorConversionError(
            f"feature width {arch.hidden_dim}: the pixel decoder's GroupNorm(32) and {ATTENTION_HEADS} heads need a "
            "multiple of 32"
        )
    if arch.decoder_layers < 1 or arch.encoder_layers < 1:
        raise DetectorConversionError(
            f"{arch.encoder_layers} pixel-decoder and {arch.decoder_layers} transformer-decoder layers: "
            "the checkpoint is truncated"
        )


def hf_config(
    arch: MmdetMask2FormerArchitecture = MmdetMask2FormerArchitecture(), labels: Sequence[str] = MMDET_COCO_CLASSES
) -> Mask2FormerConfig:
    """The `Mask2FormerConfig` of the converted model; `id2label` is mmdet's class order and names."""
    from transformers import Mask2FormerConfig, SwinConfig

    backbone = SwinConfig(
        image_size=PRETRAIN_IMAGE_SIZE, patch_size=4, embed_dim=arch.embed_dim, depths=list(arch.depths),
        num_heads=list(arch.num_heads), window_size=arch.window_size, mlp_ratio=float(arch.mlp_ratio),
        qkv_bias=True, drop_path_rate=0.3, out_features=["stage1", "stage2", "stage3", "stage4"],
    )
    id2label = dict(enumerate(labels))
    return Mask2FormerConfig(
        backbone_config=backbone, feature_size=arch.hidden_dim, mask_feature_size=arch.hidden_dim,
        hidden_dim=arch.hidden_dim, encoder_feedforward_dim=arch.encoder_ffn, encoder_layers=arch.encoder_layers,
        # transformers counts the prediction from the bare queries as a decoder layer too.
        decoder_layers=arch.decoder_layers + 1, num_attention_heads=ATTENTION_HEADS,
        dim_feedforward=arch.decoder_ffn, num_queries=arch.num_queries, no_object_weight=NO_OBJECT_WEIGHT,
        id2label=id2label, label2id={name: i for i, name in id2label.items()},
    )


def unfold_to_concat_order(channels: int) -> torch.Tensor:
    """Index i: the position in mmdet's `nn.Unfold` 2x2 patch vector of transformers' merged channel i.

    transformers: (row + 2 * col) * C + c; mmdet: c * 4 + 2 * row + col, for the patch pixel at
    (row, col) and input channel c < C. So `hf_weight = mmdet_weight[:, order]`.
    """
    position = torch.arange(4 * channels)
    pixel, channel = position // channels, position % channels
    return channel * 4 + 2 * (pixel % 2) + pixel // 2


def swin_relative_position_index(window_size: int) -> torch.Tensor:
    """(W*W, W*W) index into the relative position table, as Swin (and mmdet's buffer) builds it."""
    coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing="ij")).flatten(1)
    relative = coords[:, :, None] - coords[:, None, :] + window_size - 1
    return relative[0] * (2 * window_size - 1) + relative[1]


class _Source:
    """The mmdet state dict, consumed key by key so that nothing is missed or left over."""

    def __init__(self, state: Mapping[str, torch.Tensor]) -> None:
        self.left = dict(state)

    def take(self, key: str) -> torch.Tensor:
        if key not in self.left:
            raise DetectorConversionError(f"the checkpoint lacks {key} (mmdetection 2.x Mask2Former Swin layout)")
        return self.left.pop(key)

    def linear(self, out: dict, source: str, target: str, bias: bool = True) -> None:
        out[f"{target}.weight"] = self.take(f"{source}.weight")
        if bias:
            out[f"{target}.bias"] = self.take(f"{source}.bias")


def _convert_backbone(src: _Source, arch: MmdetMask2FormerArchitecture, out: dict) -> None:
    swin = "model.pixel_level_module.encoder.swin."
    src.linear(out, "backbone.patch_embed.projection", swin + "embeddings.patch_embeddings.projection")
    src.linear(out, "backbone.patch_embed.norm", swin + "embeddings.norm")
    index = swin_relative_position_index(arch.window_size)
    for stage, depth in enumerate(arch.depths):
        for block in range(depth):
            mm, hf = f"backbone.stages.{stage}.blocks.{block}.", f"{swin}encoder.layers.{stage}.blocks.{block}."
            src.linear(out, mm + "norm1", hf + "layernorm_before")
            src.linear(out, mm + "norm2", hf + "layernorm_after")
            for part in ("weight", "bias"):  # qkv rows: [q; k; v], each head-major as in the split layers
                qkv = src.take(f"{mm}attn.w_msa.qkv.{part}").chunk(3)
                for proj, tensor in zip(("q_proj", "k_proj", "v_proj"), qkv):
                    out[f"{hf}attention.{proj}.{part}"] = tensor
            src.linear(out, mm + "attn.w_msa.proj", hf + "attention.o_proj")
            out[hf + "attention.relative_position_bias.relative_position_bias_table"] = src.take(
                mm + "attn.w_msa.relative_position_bias_table")
            if not torch.equal(src.take(mm + "attn.w_msa.relative_position_index").long(), index):
                raise DetectorConversionError(f"{mm}attn.w_msa.relative_position_index is not Swin's index")
            src.linear(out, mm + "ffn.layers.0.0", hf + "mlp.fc1")
            src.linear(out, mm + "ffn.layers.1", hf + "mlp.fc2")
        if stage < len(arch.depths) - 1:
            order = unfold_to_concat_order(arch.embed_dim * 2**stage)
            mm, hf = f"backbone.stages.{stage}.downsample.", f"{swin}encoder.layers.{stage}.downsample."
            out[hf + "reduction.weight"] = src.take(mm + "reduction.weight")[:, order]
            out[hf + "norm.weight"] = src.take(mm + "norm.weight")[order]
            out[hf + "norm.bias"] = src.take(mm + "norm.bias")[order]
        norms = "model.pixel_level_module.encoder.hidden_states_norms."
        src.linear(out, f"backbone.norm{stage}", f"{norms}stage{stage + 1}")
    # SwinModel's final LayerNorm: the backbone normalises each stage with hidden_states_norms and
    # never calls it; mmdet has no such tensor, so it keeps LayerNorm's initial values.
    width = arch.embed_dim * 2 ** (len(arch.depths) - 1)
    out[swin + "layernorm.weight"], out[swin + "layernorm.bias"] = torch.ones(width), torch.zeros(width)


def _convert_pixel_decoder(src: _Source, arch: MmdetMask2FormerArchitecture, out: dict) -> None:
    mm, hf = "panoptic_head.pixel_decoder.", "model.pixel_level_module.decoder."
    for level in range(FEATURE_LEVELS):  # lowest resolution first in both
        src.linear(out, f"{mm}input_convs.{level}.conv", f"{hf}input_projections.{level}.0")
        src.linear(out, f"{mm}input_convs.{level}.gn", f"{hf}input_projections.{level}.1")
    for layer in range(arch.encoder_layers):
        m, h = f"{mm}encoder.layers.{layer}.", f"{hf}encoder.layers.{layer}."
        for name in ("sampling_offsets", "attention_weights", "value_proj", "output_proj"):
            src.linear(out, f"{m}attentions.0.{name}", f"{h}self_attn.{name}")
        src.linear(out, m + "norms.0", h + "self_attn_layer_norm")
        src.linear(out, m + "ffns.0.layers.0.0", h + "fc1")
        src.linear(out, m + "ffns.0.layers.1", h + "fc2")
        src.linear(out, m + "norms.1", h + "final_layer_norm")
    out[hf + "level_embed"] = src.take(mm + "level_encoding.weight")
    # The one FPN level below the deformable encoder (stride 4); both convolutions have no bias before GroupNorm.
    src.linear(out, mm + "lateral_convs.0.conv", hf + "adapter_1.0", bias=False)
    src.linear(out, mm + "lateral_convs.0.gn", hf + "adapter_1.1")
    src.linear(out, mm + "output_convs.0.conv", hf + "layer_1.0", bias=False)
    src.linear(out, mm + "output_convs.0.gn", hf + "layer_1.1")
    src.linear(out, mm + "mask_feature", hf + "mask_projection")


def _convert_transformer_decoder(src: _Source, arch: MmdetMask2FormerArchitecture, out: dict) -> None:
    mm, hf = "panoptic_head.", "model.transformer_module."
    for layer in range(arch.decoder_layers):
        # mmdet's operation_order: ('cross_attn', 'norm', 'self_attn', 'norm', 'ffn', 'norm').
        m, h = f"{mm}transformer_decoder.layers.{layer}.", f"{hf}decoder.layers.{layer}."
        out[h + "cross_attn.in_proj_weight"] = src.take(m + "attentions.0.attn.in_proj_weight")
        out[h + "cross_attn.in_proj_bias"] = src.take(m + "attentions.0.attn.in_proj_bias")
        src.linear(out, m + "attentions.0.attn.out_proj", h + "cross_attn.out_proj")
        weights = src.take(m + "attentions.1.attn.in_proj_weight").chunk(3)
        biases = src.take(m + "attentions.1.attn.in_proj_bias").chunk(3)
        for proj, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases):
            out[f"{h}self_attn.{proj}.weight"], out[f"{h}self_attn.{proj}.bias"] = weight, bias
        src.linear(out, m + "attentions.1.attn.out_proj", h + "self_attn.out_proj")
        src.linear(out, m + "norms.0", h + "cross_attn_layer_norm")
        src.linear(out, m + "norms.1", h + "self_attn_layer_norm")
        src.linear(out, m + "norms.2", h + "final_layer_norm")
        src.linear(out, m + "ffns.0.layers.0.0", h + "fc1")
        src.linear(out, m + "ffns.0.layers.1", h + "fc2")
    src.linear(out, mm + "transformer_decoder.post_norm", hf + "decoder.layernorm")
    out[hf + "queries_embedder.weight"] = src.take(mm + "query_embed.weight")  # positional part of a query
    out[hf + "queries_features.weight"] = src.take(mm + "query_feat.weight")  # its content part
    out[hf + "level_embed.weight"] = src.take(mm + "level_embed.weight")
    for index, layer in enumerate((0, 2, 4)):  # mmdet's nn.Sequential: Linear, ReLU, Linear, ReLU, Linear
        src.linear(out, f"{mm}mask_embed.{layer}", f"{hf}decoder.mask_predictor.mask_embedder.{index}.0")
    src.linear(out, mm + "cls_embed", "class_predictor")
    weight = torch.ones(arch.num_classes + 1)
    weight[-1] = NO_OBJECT_WEIGHT
    out["criterion.empty_weight"] = weight


def convert_state_dict(
    state: Mapping[str, torch.Tensor], arch: MmdetMask2FormerArchitecture | None = None
) -> dict[str, torch.Tensor]:
    """mmdet 2.x Mask2Former Swin state dict -> `Mask2FormerForUniversalSegmentation` state dict.

    Pure: the input is not modified, every output tensor is float32 and contiguous. Every tensor of
    the input is used exactly once; a missing or unexpected one raises `DetectorConversionError`.
    """
    arch = arch or infer_architecture(state)
    src, out = _Source(state), {}
    _convert_backbone(src, arch, out)
    _convert_pixel_decoder(src, arch, out)
    _convert_transformer_decoder(src, arch, out)
    if src.left:
        raise DetectorConversionError(
            f"{len(src.left)} tensors of the checkpoint have no place in the model (first: {sorted(src.left)[:3]}): "
            "it is not mmdetection 2.x's Mask2Former Swin."
        )
    return {key: tensor.float().contiguous() for key, tensor in out.items()}


def read_mmdet_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, meta) of an mmcv checkpoint file (`{"state_dict": ..., "meta": ...}` or a bare state dict).

    Read with `weights_only=True` (a downloaded pickle cannot run code) and memory-mapped where the
    file format allows, so that `infer_architecture` can refuse a wrong file before reading its tensors.
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"detector checkpoint {str(path)!r} does not exist; GenEval's is {OFFICIAL_CHECKPOINT.url(CHECKPOINT_FILE)}"
        )
    try:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a file in torch's legacy (pre-zip) format cannot be memory-mapped
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several unrelated types for a file that is not a checkpoint
        # torch's own text is pages long and, for weights_only, suggests unpickling arbitrary code: not repeated.
        raise DetectorConversionError(f"{path} is not a PyTorch checkpoint torch.load can read safely "
                                      f"({type(err).__name__}: cut short, another format, or objects other than "
                                      "tensors); pass mmdetection's Mask2Former checkpoint, e.g. "
                                      f"{OFFICIAL_CHECKPOINT.url(CHECKPOINT_FILE)}") from err
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise DetectorConversionError(f"{path} holds no state dict of tensors (got {type(checkpoint).__name__})")
    meta = checkpoint.get("meta") if isinstance(checkpoint.get("meta"), dict) else {}
    return dict(state), meta


def checkpoint_labels(meta: Mapping) -> tuple[str, ...]:
    """The class names of the checkpoint's `meta["CLASSES"]` (mmdet stores its dataset's), else mmdet's COCO."""
    labels = tuple(meta.get("CLASSES") or MMDET_COCO_CLASSES)
    if labels != MMDET_COCO_CLASSES:
        raise DetectorConversionError(
            f"the checkpoint's classes ({len(labels)}, first {labels[:3]}) are not mmdet's 80 COCO classes in "
            "COCO order, which GenEval's object_names.txt follows"
        )
    return labels


def write_hf_folder(
    state: Mapping[str, torch.Tensor],
    config: Mask2FormerConfig,
    output_dir: str | os.PathLike[str],
    source_record: dict | None = None,
) -> Path:
    """Write a converted state dict as a transformers folder; returns it.

    The state dict is first loaded with `strict=True` into `Mask2FormerForUniversalSegmentation`
    (built on the meta device, so nothing is allocated twice): a missing or unexpected key, or a
    wrong shape, raises before anything is written. Writes `config.json`, `model.safetensors`,
    `preprocessor_config.json` (mmdet's test scale, shortest edge 800 / longest 1333, padding to a
    multiple of 32, ImageNet mean/std) and, when given, `source_record` as `gors_detector_source.json`.
    """
    from safetensors.torch import save_file
    from transformers import Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor

    with torch.device("meta"):
        model = Mask2FormerForUniversalSegmentation(config)
    model.load_state_dict(state, strict=True, assign=True)  # raises on any missing, unexpected or misshapen tensor
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config.architectures = [type(model).__name__]
    config.save_pretrained(output_dir)
    save_file(dict(state), output_dir / "model.safetensors", metadata={"format": "pt"})
    Mask2FormerImageProcessor(
        size={"shortest_edge": TEST_SIZE[0], "longest_edge": TEST_SIZE[1]}, size_divisor=32
    ).save_pretrained(output_dir)
    if source_record is not None:
        (output_dir / SOURCE_RECORD).write_text(json.dumps(source_record, indent=2) + "\n")
    return output_dir


def convert_checkpoint(path: str | os.PathLike[str], output_dir: str | os.PathLike[str]) -> Path:
    """Convert an mmdet 2.x Mask2Former Swin `.pth` file into a transformers folder (see `write_hf_folder`).

    The architecture is checked from the tensor shapes before anything is converted or written.
    """
    state, meta = read_mmdet_checkpoint(path)
    arch = infer_architecture(state)
    labels = checkpoint_labels(meta)
    converted = convert_state_dict(state, arch)
    record = {
        "source": str(path),
        "sha256": file_sha256(path),
        "format": "mmdetection 2.x Mask2Former (Swin)",
        "architecture": asdict(arch),
        "conversion": CONVERSION_VERSION,
    }
    return write_hf_folder(converted, hf_config(arch, labels), output_dir, record)


def official_detector_folder() -> str:
    """A folder holding GenEval's official detector as a transformers model, converted once.

    The checkpoint is fetched once (`gors.core.data.fetch_pinned_file`: from `GORS_DATA_DIR` when
    set, else downloaded from download.openmmlab.com into `$GORS_CACHE_DIR`, hash-checked), then
    converted into `$GORS_CACHE_DIR/geneval_detector/<version>/<stem>` and reused; concurrent
    processes each convert into a staging folder and the first rename wins.
    """
    folder = cache_root() / OFFICIAL_CHECKPOINT.name / CONVERSION_VERSION / CHECKPOINT_STEM
    if (folder / "model.safetensors").is_file():
        return str(folder)
    path = fetch_pinned_file(OFFICIAL_CHECKPOINT, CHECKPOINT_FILE)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{CHECKPOINT_STEM}."))
    try:
        convert_checkpoint(path, staging)
        set_usual_permissions(staging)  # mkdtemp makes it private; the cache is shared like any model cache
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / "model.safetensors").is_file():  # not another process winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(folder)
