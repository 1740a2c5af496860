"""GenEval's official detector (mmdetection 2.x Mask2Former Swin-S) converted to transformers, without mmdet.

`mmdet_layout` writes down every tensor name and shape of the official checkpoint from mmdetection
2.x's and mmcv 1.x's source (not from the converter). The `mm_*` functions are mmdet's forward
passes, written from the same source a few lines per layer (file and class named in each
docstring); each converted layer must compute what they compute on the same input, in float64.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import stat

import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from pinned_http import file_server, forbid_internet, local_source, record_retry_waits

import gors.core.data
from rewards import geneval, mmdet_mask2former
from rewards.geneval_rules import GENEVAL_CLASSES
from rewards.mmdet_mask2former import (
    MMDET_COCO_CLASSES,
    DetectorConversionError,
    MmdetMask2FormerArchitecture,
    convert_checkpoint,
    convert_state_dict,
    hf_config,
    infer_architecture,
    write_hf_folder,
)

SWIN_S = MmdetMask2FormerArchitecture()
# Small enough for CPU, with every kind of layer: two blocks per stage (one shifted), padded windows.
TINY = MmdetMask2FormerArchitecture(
    embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 2, 4), window_size=2, hidden_dim=32, encoder_layers=2,
    encoder_ffn=48, decoder_layers=4, decoder_ffn=40, num_queries=6,
)
HEADS, LEVELS, POINTS = 8, 3, 4  # the config's attention heads, feature levels and sampling points


# --- the official key layout --------------------------------------------------------------------


def mmdet_layout(a: MmdetMask2FormerArchitecture) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of mmdet 2.x's Mask2Former Swin checkpoint (`model.state_dict()`).

    backbone (mmdet/models/backbones/swin.py): PatchEmbed `projection` Conv2d + `norm`; per stage a
    SwinBlockSequence `blocks` of SwinBlock (norm1, ShiftWindowMSA `attn.w_msa` = WindowMSA with
    relative_position_bias_table, the persistent buffer relative_position_index, qkv, proj; norm2;
    mmcv FFN `ffn.layers.0.0` / `ffn.layers.1`), PatchMerging `downsample` (norm over 4C, reduction
    without bias) on all but the last stage, and `norm{i}` per output.
    panoptic_head (dense_heads/mask2former_head.py): MSDeformAttnPixelDecoder (input_convs as
    ConvModule conv + gn, a DetrTransformerEncoder of BaseTransformerLayer with attentions.0 =
    MultiScaleDeformableAttention, ffns.0, norms.0/1, level_encoding, lateral_convs / output_convs
    without conv bias, mask_feature); a DetrTransformerDecoder whose layers hold attentions.0
    (cross) and attentions.1 (self), each mmcv MultiheadAttention wrapping `attn` = nn.MultiheadAttention,
    ffns.0, norms.0-2, plus post_norm; query_embed, query_feat, level_embed, cls_embed, mask_embed
    (Linear, ReLU, Linear, ReLU, Linear). decoder_input_projs are nn.Identity (256 = 256): no tensor.
    """
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, n_out: int, n_in: int, bias: bool = True) -> None:
        shapes[f"{name}.weight"] = (n_out, n_in)
        if bias:
            shapes[f"{name}.bias"] = (n_out,)

    def norm(name: str, width: int) -> None:
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (width,), (width,)

    e, h = a.embed_dim, a.hidden_dim
    shapes["backbone.patch_embed.projection.weight"] = (e, 3, 4, 4)
    shapes["backbone.patch_embed.projection.bias"] = (e,)
    norm("backbone.patch_embed.norm", e)
    for s, depth in enumerate(a.depths):
        c = e * 2**s
        for b in range(depth):
            p = f"backbone.stages.{s}.blocks.{b}."
            norm(p + "norm1", c)
            shapes[p + "attn.w_msa.relative_position_bias_table"] = ((2 * a.window_size - 1) ** 2, a.num_heads[s])
            shapes[p + "attn.w_msa.relative_position_index"] = (a.window_size**2, a.window_size**2)
            linear(p + "attn.w_msa.qkv", 3 * c, c)
            linear(p + "attn.w_msa.proj", c, c)
            norm(p + "norm2", c)
            linear(p + "ffn.layers.0.0", a.mlp_ratio * c, c)
            linear(p + "ffn.layers.1", c, a.mlp_ratio * c)
        if s < len(a.depths) - 1:
            norm(f"backbone.stages.{s}.downsample.norm", 4 * c)
            linear(f"backbone.stages.{s}.downsample.reduction", 2 * c, 4 * c, bias=False)
        norm(f"backbone.norm{s}", c)
    pd = "panoptic_head.pixel_decoder."
    for i in range(LEVELS):
        shapes[f"{pd}input_convs.{i}.conv.weight"] = (h, e * 2 ** (3 - i), 1, 1)
        shapes[f"{pd}input_convs.{i}.conv.bias"] = (h,)
        norm(f"{pd}input_convs.{i}.gn", h)
    for layer in range(a.encoder_layers):
        p = f"{pd}encoder.layers.{layer}."
        linear(p + "attentions.0.sampling_offsets", HEADS * LEVELS * POINTS * 2, h)
        linear(p + "attentions.0.attention_weights", HEADS * LEVELS * POINTS, h)
        linear(p + "attentions.0.value_proj", h, h)
        linear(p + "attentions.0.output_proj", h, h)
        linear(p + "ffns.0.layers.0.0", a.encoder_ffn, h)
        linear(p + "ffns.0.layers.1", h, a.encoder_ffn)
        norm(p + "norms.0", h)
        norm(p + "norms.1", h)
    shapes[pd + "level_encoding.weight"] = (LEVELS, h)
    shapes[pd + "lateral_convs.0.conv.weight"] = (h, e, 1, 1)
    norm(pd + "lateral_convs.0.gn", h)
    shapes[pd + "output_convs.0.conv.weight"] = (h, h, 3, 3)
    norm(pd + "output_convs.0.gn", h)
    shapes[pd + "mask_feature.weight"], shapes[pd + "mask_feature.bias"] = (h, h, 1, 1), (h,)
    for layer in range(a.decoder_layers):
        p = f"panoptic_head.transformer_decoder.layers.{layer}."
        for attention in (0, 1):
            shapes[f"{p}attentions.{attention}.attn.in_proj_weight"] = (3 * h, h)
            shapes[f"{p}attentions.{attention}.attn.in_proj_bias"] = (3 * h,)
            linear(f"{p}attentions.{attention}.attn.out_proj", h, h)
        linear(p + "ffns.0.layers.0.0", a.decoder_ffn, h)
        linear(p + "ffns.0.layers.1", h, a.decoder_ffn)
        for n in range(3):
            norm(f"{p}norms.{n}", h)
    norm("panoptic_head.transformer_decoder.post_norm", h)
    shapes["panoptic_head.query_embed.weight"] = shapes["panoptic_head.query_feat.weight"] = (a.num_queries, h)
    shapes["panoptic_head.level_embed.weight"] = (LEVELS, h)
    linear("panoptic_head.cls_embed", a.num_classes + 1, h)
    for layer in (0, 2, 4):
        linear(f"panoptic_head.mask_embed.{layer}", h, h)
    return shapes


def mmdet_relative_position_index(window: int) -> torch.Tensor:
    """WindowMSA.__init__: double_step_seq(2 * Ww - 1, Wh, 1, Ww), plus its transpose, flipped."""
    step = 2 * window - 1
    seq = (torch.arange(0, step * window, step)[:, None] + torch.arange(window)[None]).reshape(1, -1)
    return (seq + seq.T).flip(1).contiguous()


def random_checkpoint(a: MmdetMask2FormerArchitecture, seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """A random state dict in the official layout; norms near 1, other weights with std 0.3."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in mmdet_layout(a).items():
        if name.endswith("relative_position_index"):
            state[name] = mmdet_relative_position_index(a.window_size)
        elif ".norm" in name or ".gn." in name or "post_norm" in name:
            base = 1.0 if name.endswith("weight") else 0.0
            state[name] = base + 0.1 * torch.randn(shape, generator=generator, dtype=dtype)
        else:
            state[name] = 0.3 * torch.randn(shape, generator=generator, dtype=dtype)
    return state


# --- full size ----------------------------------------------------------------------------------


def test_the_official_layout_converts_and_loads_strictly():
    from transformers import Mask2FormerForUniversalSegmentation

    state = random_checkpoint(SWIN_S)
    # backbone 4 + 24 blocks x 14 + 3 x 3 + 4 x 2, pixel decoder 12 + 6 x 16 + 9, decoder 9 x 18 + 13
    assert len(state) == 357 + 117 + 175
    assert infer_architecture(state) == SWIN_S
    converted = convert_state_dict(state)
    with torch.device("meta"):
        model = Mask2FormerForUniversalSegmentation(hf_config())
    result = model.load_state_dict(converted, strict=True, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    # Tensors land where they belong, transformed only where the layouts differ.
    hf = "model.pixel_level_module.encoder.swin.encoder.layers."
    qkv = state["backbone.stages.2.blocks.17.attn.w_msa.qkv.weight"]
    assert torch.equal(converted[hf + "2.blocks.17.attention.k_proj.weight"], qkv[384:768])
    assert torch.equal(converted["class_predictor.weight"], state["panoptic_head.cls_embed.weight"])
    assert torch.equal(converted["criterion.empty_weight"], torch.tensor([1.0] * 80 + [0.1]))  # mmdet's class_weight
    assert torch.equal(converted["model.transformer_module.queries_features.weight"],
                       state["panoptic_head.query_feat.weight"])
    order = converted[hf + "0.downsample.norm.weight"]
    assert not torch.equal(order, state["backbone.stages.0.downsample.norm.weight"])
    assert torch.equal(order.sort().values, state["backbone.stages.0.downsample.norm.weight"].sort().values)


def test_the_configs_sizes_are_mmdets():
    config = hf_config()
    swin = config.backbone_config
    assert (swin.embed_dim, swin.depths, swin.num_heads, swin.window_size, swin.mlp_ratio) == (
        96, [2, 2, 18, 2], [3, 6, 12, 24], 7, 4.0)
    assert (config.hidden_dim, config.encoder_layers, config.decoder_layers, config.num_queries) == (256, 6, 10, 100)
    assert (config.encoder_feedforward_dim, config.dim_feedforward, config.num_attention_heads) == (1024, 2048, 8)
    assert (swin.drop_path_rate, config.no_object_weight) == (0.3, 0.1)  # training only, but mmdet's config


def test_the_labels_are_mmdets_coco_order_which_geneval_reads():
    # mmdet 2.x CocoDataset.CLASSES, spot-checked where its names differ from GenEval's and at both ends.
    assert len(MMDET_COCO_CLASSES) == 80 and (MMDET_COCO_CLASSES[0], MMDET_COCO_CLASSES[-1]) == ("person", "toothbrush")
    assert MMDET_COCO_CLASSES[62:67] == ("tv", "laptop", "mouse", "remote", "keyboard")
    id2label = hf_config().id2label
    assert [id2label[i] for i in range(80)] == list(MMDET_COCO_CLASSES)
    assert geneval.geneval_label_names(id2label) == dict(enumerate(GENEVAL_CLASSES))


# --- layer by layer, against mmdet's forward ------------------------------------------------------


def mm_linear(x, w, name):
    return F.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))


def mm_norm(x, w, name):
    return F.layer_norm(x, x.shape[-1:], w[f"{name}.weight"], w[f"{name}.bias"])  # mmcv LN: eps 1e-5


def mm_group_norm(x, w, name):
    return F.group_norm(x, 32, w[f"{name}.weight"], w[f"{name}.bias"])  # norm_cfg GN, num_groups=32


def mm_ffn(x, w, name, activation, identity=None):
    """mmcv FFN: Sequential(Sequential(Linear, act), Linear), plus the identity (default: the input)."""
    identity = x if identity is None else identity
    return identity + mm_linear(activation(mm_linear(x, w, f"{name}.layers.0.0")), w, f"{name}.layers.1")


def mm_patch_embed(image, w):
    """utils/transformer.py PatchEmbed: Conv2d(kernel = stride = 4), flatten, LayerNorm."""
    name = "backbone.patch_embed.projection"
    x = F.conv2d(image, w[f"{name}.weight"], w[f"{name}.bias"], stride=4)
    return mm_norm(x.flatten(2).transpose(1, 2), w, "backbone.patch_embed.norm"), tuple(x.shape[-2:])


def mm_window_msa(x, w, name, heads, mask):
    """swin.py WindowMSA.forward: qkv reshaped (B, N, 3, heads, d), q scaled, relative position bias, mask."""
    batch, n, c = x.shape
    q, k, v = mm_linear(x, w, name + "qkv").reshape(batch, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
    attention = (q * (c // heads) ** -0.5) @ k.transpose(-2, -1)
    table = w[name + "relative_position_bias_table"]
    bias = table[w[name + "relative_position_index"].view(-1)].view(n, n, -1).permute(2, 0, 1)
    attention = attention + bias[None]
    if mask is not None:
        windows = mask.shape[0]
        attention = (attention.view(batch // windows, windows, heads, n, n) + mask[:, None][None]).view(-1, heads, n, n)
    return mm_linear((attention.softmax(-1) @ v).transpose(1, 2).reshape(batch, n, c), w, name + "proj")


def mm_windows(x, size):
    """ShiftWindowMSA.window_partition: (B, H, W, C) -> (B * windows, size, size, C)."""
    b, hh, ww, c = x.shape
    return x.view(b, hh // size, size, ww // size, size, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, size, size, c)


def mm_swin_block(x, hw, w, name, heads, window, shift):
    """swin.py SwinBlock + ShiftWindowMSA.forward: pad to whole windows, roll, masked window attention, FFN."""
    b, _, c = x.shape
    h, wd = hw
    y = mm_norm(x, w, name + "norm1").view(b, h, wd, c)
    y = F.pad(y, (0, 0, 0, (window - wd % window) % window, 0, (window - h % window) % window))
    hp, wp = y.shape[1:3]
    mask = None
    if shift:
        y = torch.roll(y, (-shift, -shift), (1, 2))
        regions = torch.zeros((1, hp, wp, 1), dtype=x.dtype)
        spans = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
        for count, (hs, ws) in enumerate((hs, ws) for hs in spans for ws in spans):
            regions[:, hs, ws, :] = count
        regions = mm_windows(regions, window).reshape(-1, window * window)
        mask = regions[:, None] - regions[:, :, None]
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
    out = mm_window_msa(mm_windows(y, window).reshape(-1, window * window, c), w, name + "attn.w_msa.", heads, mask)
    out = out.view(b, hp // window, wp // window, window, window, c).permute(0, 1, 3, 2, 4, 5).reshape(b, hp, wp, c)
    if shift:
        out = torch.roll(out, (shift, shift), (1, 2))
    x = x + out[:, :h, :wd].reshape(b, h * wd, c)
    return mm_ffn(mm_norm(x, w, name + "norm2"), w, name + "ffn", F.gelu, identity=x)


def mm_patch_merging(x, hw, w, name):
    """utils/transformer.py PatchMerging: corner padding, nn.Unfold(2, stride 2), LayerNorm(4C), reduction."""
    b, _, c = x.shape
    h, wd = hw
    x = F.pad(x.view(b, h, wd, c).permute(0, 3, 1, 2), (0, wd % 2, 0, h % 2))
    out_hw = (x.shape[2] // 2, x.shape[3] // 2)
    x = mm_norm(F.unfold(x, kernel_size=2, stride=2).transpose(1, 2), w, name + "norm")
    return F.linear(x, w[name + "reduction.weight"]), out_hw


def mm_backbone(image, w, a):
    """swin.py SwinTransformer.forward: stage outputs before downsampling, each through norm{i}, as (B, C, H, W)."""
    x, hw = mm_patch_embed(image, w)
    outs = []
    for s, depth in enumerate(a.depths):
        for block in range(depth):
            shift = a.window_size // 2 if block % 2 else 0
            x = mm_swin_block(x, hw, w, f"backbone.stages.{s}.blocks.{block}.", a.num_heads[s], a.window_size, shift)
        outs.append(mm_norm(x, w, f"backbone.norm{s}").view(x.shape[0], *hw, -1).permute(0, 3, 1, 2))
        if s < len(a.depths) - 1:
            x, hw = mm_patch_merging(x, hw, w, f"backbone.stages.{s}.downsample.")
    return outs


def mm_sine(batch, h, w, features, dtype):
    """mmdet SinePositionalEncoding(num_feats, normalize=True): offset 0, eps 1e-6, scale 2 pi, temperature 1e4."""
    y = torch.ones(batch, h, w, dtype=dtype).cumsum(1)
    x = torch.ones(batch, h, w, dtype=dtype).cumsum(2)
    y, x = y / (y[:, -1:, :] + 1e-6) * 2 * math.pi, x / (x[:, :, -1:] + 1e-6) * 2 * math.pi
    dim_t = 10000 ** (2 * (torch.arange(features, dtype=dtype) // 2) / features)
    pos_x, pos_y = x[..., None] / dim_t, y[..., None] / dim_t
    pos_x = torch.stack((pos_x[..., 0::2].sin(), pos_x[..., 1::2].cos()), dim=4).view(batch, h, w, -1)
    pos_y = torch.stack((pos_y[..., 0::2].sin(), pos_y[..., 1::2].cos()), dim=4).view(batch, h, w, -1)
    return torch.cat((pos_y, pos_x), dim=3).permute(0, 3, 1, 2)


def mm_deformable_attention(query, query_pos, reference, shapes, w, name):
    """mmcv ops/multi_scale_deform_attn.py MultiScaleDeformableAttention.forward (batch first here)
    with multi_scale_deformable_attn_pytorch; value = query, as in the pixel decoder's encoder."""
    b, nq, c = query.shape
    q = query + query_pos
    value = mm_linear(query, w, name + "value_proj").view(b, nq, HEADS, -1)
    offsets = mm_linear(q, w, name + "sampling_offsets").view(b, nq, HEADS, LEVELS, POINTS, 2)
    weights = mm_linear(q, w, name + "attention_weights").view(b, nq, HEADS, LEVELS * POINTS).softmax(-1)
    normalizer = torch.tensor([[wd, h] for h, wd in shapes], dtype=query.dtype)
    grids = 2 * (reference[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]) - 1
    samples = []
    for level, (value_level, (h, wd)) in enumerate(zip(value.split([h * wd for h, wd in shapes], 1), shapes)):
        value_level = value_level.flatten(2).transpose(1, 2).reshape(b * HEADS, c // HEADS, h, wd)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        samples.append(F.grid_sample(value_level, grid, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = weights.transpose(1, 2).reshape(b * HEADS, 1, nq, LEVELS * POINTS)
    out = (torch.stack(samples, dim=-2).flatten(-2) * weights).sum(-1).view(b, c, nq).transpose(1, 2)
    return query + mm_linear(out, w, name + "output_proj")


def mm_reference_points(shapes, strides, dtype):
    """MlvlPointGenerator.single_level_grid_priors (offset 0.5) divided by (w, h) * stride, per level."""
    points = []
    for (h, wd), stride in zip(shapes, strides):
        ys, xs = torch.meshgrid((torch.arange(h, dtype=dtype) + 0.5) * stride,
                                (torch.arange(wd, dtype=dtype) + 0.5) * stride, indexing="ij")
        points.append(torch.stack([xs.reshape(-1), ys.reshape(-1)], -1) / torch.tensor([wd * stride, h * stride]))
    return torch.cat(points)


def mm_pixel_decoder(feats, w, a):
    """plugins/msdeformattn_pixel_decoder.py MSDeformAttnPixelDecoder.forward (zero padding masks)."""
    p, b = "panoptic_head.pixel_decoder.", feats[0].shape[0]
    inputs, positions, shapes, strides = [], [], [], []
    for i in range(LEVELS):
        level = len(feats) - i - 1  # lowest resolution first
        feat = feats[level]
        conv = f"{p}input_convs.{i}."
        projected = mm_group_norm(F.conv2d(feat, w[conv + "conv.weight"], w[conv + "conv.bias"]), w, conv + "gn")
        level_embed = w[p + "level_encoding.weight"][i].view(1, -1, 1, 1)
        pos = mm_sine(b, *feat.shape[-2:], a.hidden_dim // 2, feat.dtype) + level_embed
        inputs.append(projected.flatten(2).transpose(1, 2))
        positions.append(pos.flatten(2).transpose(1, 2))
        shapes.append(tuple(feat.shape[-2:]))
        strides.append(4 * 2**level)
    x, pos = torch.cat(inputs, 1), torch.cat(positions, 1)
    reference = mm_reference_points(shapes, strides, x.dtype)[None, :, None].repeat(b, 1, LEVELS, 1)
    for layer in range(a.encoder_layers):
        name = f"{p}encoder.layers.{layer}."  # operation_order ('self_attn', 'norm', 'ffn', 'norm')
        x = mm_norm(mm_deformable_attention(x, pos, reference, shapes, w, name + "attentions.0."), w, name + "norms.0")
        x = mm_norm(mm_ffn(x, w, name + "ffns.0", F.relu), w, name + "norms.1")
    outs = [o.transpose(1, 2).reshape(b, -1, *s) for o, s in zip(x.split([h * wd for h, wd in shapes], 1), shapes)]
    lateral = mm_group_norm(F.conv2d(feats[0], w[p + "lateral_convs.0.conv.weight"]), w, p + "lateral_convs.0.gn")
    y = lateral + F.interpolate(outs[-1], size=lateral.shape[-2:], mode="bilinear", align_corners=False)
    outs.append(F.relu(mm_group_norm(F.conv2d(y, w[p + "output_convs.0.conv.weight"], padding=1), w,
                                     p + "output_convs.0.gn")))
    return F.conv2d(outs[-1], w[p + "mask_feature.weight"], w[p + "mask_feature.bias"]), outs[:LEVELS]


def mm_multihead_attention(query, key, value, w, name, query_pos, key_pos, mask):
    """mmcv MultiheadAttention.forward (batch_first=False): positions added to query and key, identity added."""
    out = F.multi_head_attention_forward(
        query + query_pos, key + key_pos, value, query.shape[-1], HEADS, w[name + "in_proj_weight"],
        w[name + "in_proj_bias"], None, None, False, 0.0, w[name + "out_proj.weight"], w[name + "out_proj.bias"],
        training=False, attn_mask=mask, need_weights=False,
    )[0]
    return query + out


def mm_prediction(query, mask_features, size, w):
    """mask2former_head.py Mask2FormerHead.forward_head: post_norm, cls_embed, mask_embed, attention mask."""
    p = "panoptic_head."
    x = mm_norm(query, w, p + "transformer_decoder.post_norm").transpose(0, 1)
    embed = mm_linear(F.relu(mm_linear(F.relu(mm_linear(x, w, p + "mask_embed.0")), w, p + "mask_embed.2")), w,
                      p + "mask_embed.4")
    masks = torch.einsum("bqc,bchw->bqhw", embed, mask_features)
    attention = F.interpolate(masks, size, mode="bilinear", align_corners=False).flatten(2).unsqueeze(1)
    return mm_linear(x, w, p + "cls_embed"), masks, attention.repeat(1, HEADS, 1, 1).flatten(0, 1).sigmoid() < 0.5


def mm_decoder_layer(query, memory, memory_pos, query_pos, mask, w, name):
    """mmcv BaseTransformerLayer with mmdet's operation_order
    ('cross_attn', 'norm', 'self_attn', 'norm', 'ffn', 'norm') and attn_masks [mask, None]."""
    query = mm_norm(mm_multihead_attention(query, memory, memory, w, name + "attentions.0.attn.", query_pos, memory_pos,
                                           mask), w, name + "norms.0")
    query = mm_norm(mm_multihead_attention(query, query, query, w, name + "attentions.1.attn.", query_pos, query_pos,
                                           None), w, name + "norms.1")
    return mm_norm(mm_ffn(query, w, name + "ffns.0", F.relu), w, name + "norms.2")


def mm_head(mask_features, multi_scale, w, a):
    """mask2former_head.py Mask2FormerHead.forward: class and mask logits after every decoder layer."""
    p, b = "panoptic_head.", mask_features.shape[0]
    memories, positions = [], []
    for i, feat in enumerate(multi_scale):
        memories.append(feat.flatten(2).permute(2, 0, 1) + w[p + "level_embed.weight"][i].view(1, 1, -1))
        positions.append(mm_sine(b, *feat.shape[-2:], a.hidden_dim // 2, feat.dtype).flatten(2).permute(2, 0, 1))
    query = w[p + "query_feat.weight"].unsqueeze(1).repeat(1, b, 1)
    query_pos = w[p + "query_embed.weight"].unsqueeze(1).repeat(1, b, 1)
    classes, masks, attention = mm_prediction(query, mask_features, multi_scale[0].shape[-2:], w)
    all_classes, all_masks = [classes], [masks]
    for layer in range(a.decoder_layers):
        level = layer % LEVELS
        attention[torch.where(attention.sum(-1) == attention.shape[-1])] = False
        query = mm_decoder_layer(query, memories[level], positions[level], query_pos, attention, w,
                                 f"{p}transformer_decoder.layers.{layer}.")
        classes, masks, attention = mm_prediction(query, mask_features, multi_scale[(layer + 1) % LEVELS].shape[-2:], w)
        all_classes.append(classes)
        all_masks.append(masks)
    return all_classes, all_masks


@pytest.fixture(scope="module")
def tiny():
    """(mmdet state dict, converted transformers model), both float64."""
    from transformers import Mask2FormerForUniversalSegmentation

    state = random_checkpoint(TINY, seed=1)
    model = Mask2FormerForUniversalSegmentation(hf_config(TINY)).double().eval()
    model.load_state_dict(convert_state_dict(state), strict=True)
    return {k: v if k.endswith("relative_position_index") else v.double() for k, v in state.items()}, model


def close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-9)


def test_patch_embedding_matches_mmdet(tiny):
    state, model = tiny
    image = torch.randn(2, 3, 24, 20, dtype=torch.float64)
    embeddings, hw = model.model.pixel_level_module.encoder.swin.embeddings(image)
    expected, expected_hw = mm_patch_embed(image, state)
    close(embeddings, expected)
    assert tuple(hw) == expected_hw


def test_mmdets_relative_position_index_is_swins(tiny):
    _, model = tiny
    for window in (2, 7):
        expected = mmdet_relative_position_index(window)
        assert torch.equal(mmdet_mask2former.swin_relative_position_index(window), expected)
    block = model.model.pixel_level_module.encoder.swin.encoder.layers[1].blocks[0]
    index = block.attention.relative_position_bias.relative_position_index
    assert torch.equal(index, mmdet_relative_position_index(2).view(-1))


@pytest.mark.parametrize("block, shift", [(0, 0), (1, 1)])
def test_swin_block_matches_mmdet_window_attention(tiny, block, shift):
    """qkv split, relative position bias, shifted-window mask and padding (a 5 x 3 map, windows of 2)."""
    state, model = tiny
    layer = model.model.pixel_level_module.encoder.swin.encoder.layers[1].blocks[block]
    x = torch.randn(2, 15, 32, dtype=torch.float64)
    out = layer(x, (5, 3), always_partition=True)[0]
    close(out, mm_swin_block(x, (5, 3), state, f"backbone.stages.1.blocks.{block}.", 2, 2, shift))


@pytest.mark.parametrize("hw", [(4, 6), (5, 3)])
def test_patch_merging_matches_mmdets_unfold_order(tiny, hw):
    state, model = tiny
    merging = model.model.pixel_level_module.encoder.swin.encoder.layers[0].downsample
    x = torch.randn(2, hw[0] * hw[1], 16, dtype=torch.float64)
    expected, _ = mm_patch_merging(x, hw, state, "backbone.stages.0.downsample.")
    close(merging(x, hw), expected)
    # Without the permutation the layer computes something else: the test can fail.
    unpermuted = dict(state, **{"backbone.stages.0.downsample.reduction.weight":
                                state["backbone.stages.0.downsample.reduction.weight"][:, torch.arange(64).flip(0)]})
    assert not torch.allclose(mm_patch_merging(x, hw, unpermuted, "backbone.stages.0.downsample.")[0], expected)


def test_backbone_matches_mmdet(tiny):
    state, model = tiny
    image = torch.randn(1, 3, 72, 56, dtype=torch.float64)  # odd maps and partial windows at every stage
    features = model.model.pixel_level_module.encoder(image).feature_maps
    for feature, expected in zip(features, mm_backbone(image, state, TINY), strict=True):
        close(feature, expected)


def test_deformable_attention_matches_mmcv(tiny):
    state, model = tiny
    shapes = [(2, 3), (3, 4), (5, 6)]
    n = sum(h * w for h, w in shapes)
    x, pos = torch.randn(2, n, 32, dtype=torch.float64), torch.randn(2, n, 32, dtype=torch.float64)
    reference = torch.rand(2, n, LEVELS, 2, dtype=torch.float64)
    attention = model.model.pixel_level_module.decoder.encoder.layers[1].self_attn
    out, _ = attention(x, encoder_hidden_states=x, position_embeddings=pos, reference_points=reference,
                       spatial_shapes_list=shapes, level_start_index=None)
    name = "panoptic_head.pixel_decoder.encoder.layers.1.attentions.0."
    close(x + out, mm_deformable_attention(x, pos, reference, shapes, state, name))


def test_decoder_layer_matches_mmcvs_operation_order(tiny):
    """Cross-attention (masked), then self-attention with the in_proj split into q, k, v, then FFN."""
    state, model = tiny
    queries, memory = torch.randn(6, 2, 32, dtype=torch.float64), torch.randn(12, 2, 32, dtype=torch.float64)
    query_pos, memory_pos = torch.randn_like(queries), torch.randn_like(memory)
    mask = torch.rand(2 * HEADS, 6, 12) < 0.3
    layer = model.model.transformer_module.decoder.layers[2]
    out = layer(queries, 0, None, [memory_pos], query_pos, [memory], encoder_attention_mask=mask)[0]
    name = "panoptic_head.transformer_decoder.layers.2."
    close(out, mm_decoder_layer(queries, memory, memory_pos, query_pos, mask, state, name))


def test_class_and_mask_heads_match_mmdet(tiny):
    state, model = tiny
    queries, pixels = torch.randn(6, 2, 32, dtype=torch.float64), torch.randn(2, 32, 8, 10, dtype=torch.float64)
    decoder = model.model.transformer_module.decoder
    normed = decoder.layernorm(queries)
    masks, attention = decoder.mask_predictor(normed, pixels, (4, 5))
    classes, expected_masks, expected_attention = mm_prediction(queries, pixels, (4, 5), state)
    close(model.class_predictor(normed.transpose(0, 1)), classes)
    close(masks, expected_masks)
    assert torch.equal(attention, expected_attention)


def test_the_whole_model_matches_mmdets_forward(tiny):
    """Level order, level embeddings and the query embedding/feature pair, which no single layer shows."""
    state, model = tiny
    image = torch.randn(2, 3, 64, 96, dtype=torch.float64)
    with torch.no_grad():
        outputs = model(pixel_values=image, output_auxiliary_logits=True)
        mask_features, multi_scale = mm_pixel_decoder(mm_backbone(image, state, TINY), state, TINY)
        classes, masks = mm_head(mask_features, multi_scale, state, TINY)
    close(outputs.pixel_decoder_last_hidden_state, mask_features)
    close(outputs.class_queries_logits, classes[-1])
    close(outputs.masks_queries_logits, masks[-1])
    assert len(outputs.auxiliary_logits) == TINY.decoder_layers
    for auxiliary, expected_classes, expected_masks in zip(outputs.auxiliary_logits, classes, masks):
        close(auxiliary["class_queries_logits"], expected_classes)
        close(auxiliary["masks_queries_logits"], expected_masks)


# --- files, folders and the official checkpoint -------------------------------------------------


def save_checkpoint(path, state, classes=MMDET_COCO_CLASSES):
    """An mmcv checkpoint file as mmdet's training saves it: meta (with the dataset's CLASSES) + state_dict."""
    torch.save({"meta": {"mmdet_version": "2.25.0", "CLASSES": classes, "epoch": 1, "iter": 368750},
                "state_dict": state}, path)
    return path


@pytest.fixture(scope="module")
def tiny_pth(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("mmdet") / "tiny.pth", random_checkpoint(TINY, seed=2))


def test_a_converted_folder_loads_with_from_pretrained_and_in_the_geneval_detector(tiny_pth, tmp_path):
    from transformers import Mask2FormerForUniversalSegmentation, Mask2FormerImageProcessor

    folder = convert_checkpoint(tiny_pth, tmp_path / "out")
    model = Mask2FormerForUniversalSegmentation.from_pretrained(folder)
    expected = convert_state_dict(torch.load(tiny_pth, weights_only=True)["state_dict"])
    loaded = model.state_dict()
    assert all(torch.equal(loaded[key], tensor) for key, tensor in expected.items())
    processor = Mask2FormerImageProcessor.from_pretrained(folder)
    assert (processor.size, processor.size_divisor) == ({"shortest_edge": 800, "longest_edge": 1333}, 32)
    record = json.loads((folder / mmdet_mask2former.SOURCE_RECORD).read_text())
    assert record["sha256"] == hashlib.sha256(tiny_pth.read_bytes()).hexdigest()
    assert record["architecture"]["depths"] == list(TINY.depths)

    detector = geneval.Mask2FormerDetector(str(folder), torch.device("cpu"), image_size=(64, 96))
    assert detector.class_names == dict(enumerate(GENEVAL_CLASSES))
    found = detector.detect([Image.new("RGB", (64, 64), "white")])[0]
    assert found and set(found) <= set(GENEVAL_CLASSES)
    assert all(obj.box[2] <= 64 and 0.0 < obj.score <= 1.0 for objects in found.values() for obj in objects)


def test_the_pinned_file_is_the_one_genevals_download_models_sh_fetches():
    assert mmdet_mask2former.OFFICIAL_CHECKPOINT.url(mmdet_mask2former.CHECKPOINT_FILE) == (
        "https://download.openmmlab.com/mmdetection/v2.0/mask2former/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco/"
        "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco_20220504_001756-743b7d99.pth"
    )
    # mmdetection's file names end with the first 8 hex digits of the file's sha256 (torch.hub's check_hash).
    assert mmdet_mask2former.OFFICIAL_CHECKPOINT.sha256 == {mmdet_mask2former.CHECKPOINT_FILE: "743b7d99"}


def serve_official(monkeypatch, server, data: bytes, pin: str) -> None:
    source = dataclasses.replace(local_source(mmdet_mask2former.OFFICIAL_CHECKPOINT, server.url),
                                 sha256={mmdet_mask2former.CHECKPOINT_FILE: pin})
    monkeypatch.setattr(mmdet_mask2former, "OFFICIAL_CHECKPOINT", source)
    server.put(source, mmdet_mask2former.CHECKPOINT_FILE, data)


def use_empty_cache(monkeypatch, tmp_path) -> None:
    """Downloads and conversions go to an empty cache under tmp_path; the internet is off."""
    monkeypatch.delenv("GORS_DATA_DIR", raising=False)
    monkeypatch.setenv("GORS_CACHE_DIR", str(tmp_path / "cache"))
    forbid_internet(monkeypatch)


def test_official_downloads_converts_once_and_scores(monkeypatch, tmp_path, tiny_pth):
    use_empty_cache(monkeypatch, tmp_path)
    data = tiny_pth.read_bytes()
    with file_server() as server:
        serve_official(monkeypatch, server, data, hashlib.sha256(data).hexdigest())
        detector = geneval.Mask2FormerDetector("official", torch.device("cpu"), image_size=(64, 96))
        folder = (tmp_path / "cache" / "geneval_detector" / mmdet_mask2former.CONVERSION_VERSION
                  / mmdet_mask2former.CHECKPOINT_STEM)
        assert detector.class_names == dict(enumerate(GENEVAL_CLASSES))
        assert server.requests == ["/mmdetection/v2.0/20220504_001756-743b7d99/mask2former/"
                                   f"{mmdet_mask2former.CHECKPOINT_STEM}/{mmdet_mask2former.CHECKPOINT_FILE}"]
        converted_at = (folder / "model.safetensors").stat().st_mtime_ns
        monkeypatch.setattr(mmdet_mask2former, "convert_checkpoint", lambda *args: pytest.fail("converted again"))
        assert mmdet_mask2former.official_detector_folder() == str(folder)
        assert len(server.requests) == 1 and (folder / "model.safetensors").stat().st_mtime_ns == converted_at
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no staging folder left
    (tmp_path / "made").mkdir()  # the shared cache's folder has mkdir's permissions, not mkdtemp's 0700
    assert stat.S_IMODE(folder.stat().st_mode) == stat.S_IMODE((tmp_path / "made").stat().st_mode)


def test_a_failed_conversion_leaves_no_staging_folder(monkeypatch, tmp_path):
    use_empty_cache(monkeypatch, tmp_path)
    data = b"not a checkpoint"
    with file_server() as server:
        serve_official(monkeypatch, server, data, hashlib.sha256(data).hexdigest())
        with pytest.raises(DetectorConversionError, match="not a PyTorch checkpoint"):
            mmdet_mask2former.official_detector_folder()
    assert list((tmp_path / "cache" / "geneval_detector" / mmdet_mask2former.CONVERSION_VERSION).iterdir()) == []


def test_the_official_pin_is_a_sha256_prefix_checked_like_torch_hub(monkeypatch, tmp_path, tiny_pth):
    use_empty_cache(monkeypatch, tmp_path)
    record_retry_waits(monkeypatch)
    data = tiny_pth.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    wrong = "0" * 8 if not digest.startswith("0" * 8) else "f" * 8
    with file_server() as server:
        serve_official(monkeypatch, server, data, wrong)
        with pytest.raises(gors.core.data.ChecksumError, match=wrong):
            mmdet_mask2former.official_detector_folder()
        serve_official(monkeypatch, server, data, digest[:8])
        folder = mmdet_mask2former.official_detector_folder()
        assert folder.endswith(mmdet_mask2former.CHECKPOINT_STEM) and len(server.requests) == 4 + 1
        # A corrupted cached download is fetched again, though pooch has no whole hash to notice it by.
        shutil.rmtree(folder)
        cached = next((tmp_path / "cache" / "geneval_detector").rglob(mmdet_mask2former.CHECKPOINT_FILE))
        cached.write_bytes(data[:-10])
        assert mmdet_mask2former.official_detector_folder() == folder
        assert len(server.requests) == 6 and cached.read_bytes() == data


def test_the_cli_converts_and_explains(tiny_pth, tmp_path, capsys):
    from gors import convert_detector

    convert_detector.main(["geneval", str(tiny_pth), str(tmp_path / "out")])
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert '{"geneval": {"model_name_or_path":' in capsys.readouterr().out
    with pytest.raises(SystemExit, match="error: .*does not exist"):
        convert_detector.main(["geneval", str(tmp_path / "missing.pth"), str(tmp_path / "bad")])
    with pytest.raises(SystemExit, match="invalid choice"):
        convert_detector.main(["t2i_compbench", str(tiny_pth), str(tmp_path / "bad")])
    with pytest.raises(SystemExit) as exit_info:
        convert_detector.main(["--help"])
    assert exit_info.value.code == 0 and "official" in capsys.readouterr().out


# --- the wrong checkpoint -----------------------------------------------------------------------


def with_changes(state, drop=(), **extra):
    return {**{k: v for k, v in state.items() if k not in drop}, **extra}


@pytest.mark.parametrize("change, message", [
    (lambda s: with_changes(s, drop=[k for k in s if k.startswith("backbone.")],
                            **{"backbone.conv1.weight": torch.zeros(64, 3, 7, 7),
                               "backbone.layer1.0.conv1.weight": torch.zeros(64, 64, 1, 1)}), "ResNet backbone"),
    (lambda s: {"model.pixel_level_module." + k: v for k, v in s.items()}, "already a transformers"),
    (lambda s: {"sem_seg_head.predictor." + k: v for k, v in s.items()}, "detectron2"),
    (lambda s: {"decode_head.conv_seg.weight": torch.zeros(150, 512, 1, 1)}, "not mmdetection 2.x's Mask2Former"),
    (lambda s: with_changes(s, drop=["panoptic_head.pixel_decoder.mask_feature.bias"]), "lacks .*mask_feature.bias"),
    (lambda s: with_changes(s, **{"panoptic_head.extra.weight": torch.zeros(1)}), "no place in the model"),
    (lambda s: with_changes(s, **{"backbone.stages.1.blocks.0.attn.w_msa.relative_position_index":
                                  torch.zeros(4, 4, dtype=torch.long)}), "not Swin's index"),
    (lambda s: with_changes(s, **{"panoptic_head.pixel_decoder.encoder.layers.0.attentions.0.attention_weights.weight":
                                  torch.zeros(48, 32)}), "4 points"),
    (lambda s: with_changes(s, drop=[k for k in s if k.startswith("panoptic_head.")],
                            **{"roi_head.bbox_head.fc_cls.weight": torch.zeros(81, 1024)}),
     r"no panoptic_head\.transformer_decoder\.\* tensors"),
    (lambda s: with_changes(s, **{"backbone.patch_embed.projection.weight": torch.zeros(16, 3, 2, 2)}), "4x4 RGB"),
    (lambda s: with_changes(s, **{"backbone.stages.4.blocks.0.norm1.weight": torch.ones(256)}), "5 Swin stages"),
    (lambda s: with_changes(s, **{"backbone.stages.3.blocks.0.attn.w_msa.relative_position_bias_table":
                                  torch.zeros(25, 4)}), "do not fit one square window"),
    (lambda s: with_changes(s, **{"panoptic_head.cls_embed.weight": torch.zeros(21, 32),
                                  "panoptic_head.cls_embed.bias": torch.zeros(21)}), "has 20 classes"),
    (lambda s: random_checkpoint(dataclasses.replace(TINY, hidden_dim=40)), "feature width 40"),
], ids=["resnet", "transformers", "detectron2", "segmentor", "truncated", "extra", "index", "heads", "mask-rcnn",
        "patch", "stages", "window", "voc", "width"])
def test_another_architecture_is_refused_with_its_reason(change, message):
    with pytest.raises(DetectorConversionError, match=message):
        convert_state_dict(change(random_checkpoint(TINY)))


def test_the_converted_tensors_are_float32_whatever_the_checkpoint_stores():
    converted = convert_state_dict(random_checkpoint(TINY, dtype=torch.float16))
    assert {tensor.dtype for tensor in converted.values()} == {torch.float32}


def test_a_state_dict_that_does_not_fit_the_config_writes_nothing(tmp_path):
    converted = convert_state_dict(random_checkpoint(TINY))
    del converted["class_predictor.bias"]
    with pytest.raises(RuntimeError, match="class_predictor.bias"):
        write_hf_folder(converted, hf_config(TINY), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_panoptic_checkpoint_is_refused_before_any_work(tmp_path):
    panoptic = save_checkpoint(tmp_path / "panoptic.pth",
                               random_checkpoint(dataclasses.replace(TINY, num_classes=133)), classes=("person",) * 133)
    with pytest.raises(DetectorConversionError, match=r"133 classes \(the COCO panoptic model\)"):
        convert_checkpoint(panoptic, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_files_that_are_no_mmdet_checkpoint_are_refused(tmp_path, tiny_pth):
    (tmp_path / "text.pth").write_text("not a checkpoint")
    with pytest.raises(DetectorConversionError, match=r"not a PyTorch checkpoint torch.load can read safely \(\w+: "
                                                     r"cut short, another format, or objects other than tensors\); "
                                                     r"pass mmdetection's Mask2Former checkpoint, e.g. https://\S+$"):
        convert_checkpoint(tmp_path / "text.pth", tmp_path / "out")  # one line, not torch's page
    torch.save([torch.zeros(2, 2)], tmp_path / "list.pth")
    with pytest.raises(DetectorConversionError, match="no state dict"):
        convert_checkpoint(tmp_path / "list.pth", tmp_path / "out")
    state = torch.load(tiny_pth, weights_only=True)["state_dict"]
    torch.save({"state_dict": {**state, "iteration": 3}}, tmp_path / "mixed.pth")
    with pytest.raises(DetectorConversionError, match="no state dict of tensors"):
        convert_checkpoint(tmp_path / "mixed.pth", tmp_path / "out")

    class RunsCode:  # a pickle that would create a folder if it were unpickled without weights_only
        def __reduce__(self):
            return os.makedirs, (str(tmp_path / "code ran"),)

    torch.save({"state_dict": {"x": RunsCode()}}, tmp_path / "code.pth")
    with pytest.raises(DetectorConversionError, match="not a PyTorch checkpoint torch.load can read safely"):
        convert_checkpoint(tmp_path / "code.pth", tmp_path / "out")
    assert not (tmp_path / "code ran").exists()
    # A bare state dict (no meta: mmdet's COCO classes), and a checkpoint whose meta is None, convert.
    torch.save(state, tmp_path / "bare.pth")
    torch.save({"state_dict": state, "meta": None}, tmp_path / "no_meta.pth")
    for name in ("bare", "no_meta"):
        assert (convert_checkpoint(tmp_path / f"{name}.pth", tmp_path / name) / "model.safetensors").is_file()
    legacy = tmp_path / "legacy.pth"  # torch's pre-zip format cannot be memory-mapped: read whole
    torch.save(torch.load(tiny_pth, weights_only=True), legacy, _use_new_zipfile_serialization=False)
    assert (convert_checkpoint(legacy, tmp_path / "legacy") / "model.safetensors").is_file()
    with pytest.raises(FileNotFoundError, match="download.openmmlab.com"):
        convert_checkpoint(tmp_path / "missing.pth", tmp_path / "out")
    renamed = save_checkpoint(tmp_path / "lvis.pth", torch.load(tiny_pth, weights_only=True)["state_dict"],
                              classes=tuple(reversed(MMDET_COCO_CLASSES)))
    with pytest.raises(DetectorConversionError, match="not mmdet's 80 COCO classes"):
        convert_checkpoint(renamed, tmp_path / "out")
    assert not (tmp_path / "out").exists()
