"""GenEval's mask boxes: gors' vectorised `mask_boxes` against mmdetection's `mask2bbox`, same masks.

GenEval's detector is Mask2Former run through mmdetection; its instance post-processing
(`MaskFormerFusionHead.instance_postprocess`, mmdet 2.x
``mmdet/models/seg_heads/panoptic_fusion_heads/maskformer_fusion_head.py``) takes the boxes of
the (up to 100, one per query) binary masks at image size with ``mask2bbox(mask_pred_binary)``.

- **Reference, mmdetection's ``mask2bbox``** (open-mmlab/mmdetection, ``mmdet/core/mask/utils.py``
  in 2.x, the version GenEval installs, and ``mmdet/structures/mask/utils.py`` in 3.x, the same
  code; read as facts, not copied; mmdet is not installed): a float32 zero tensor of N x 4 on the
  masks' device; ``torch.any`` over the rows (one flag per column) and over the columns (one per
  row) of all masks at once; then a Python loop over the masks, each taking ``torch.where`` of its
  column and row flags and, when both are non-empty, writing ``new_tensor([x[0], y[0], x[-1] + 1,
  y[-1] + 1])``, so x2 and y2 are the last occupied index + 1 and an empty mask keeps (0, 0, 0, 0).
- **gors**: `rewards.geneval.mask_boxes`: the same two reductions, then the first and last
  occupied index of every mask at once with ``argmax`` (on the flipped flags for the last), no
  loop. Its convention is mmdetection's (x2 = last + 1, an empty mask (0, 0, 0, 0)), so the boxes
  are compared as they come, and must be identical.

Both reduce the whole N x H x W mask tensor, which is most of the work on either side; the
speed-up is what the loop over the masks costs (on a GPU, each ``new_tensor`` of a mask also waits
for the device). The masks are blob-like boxes, every fifth one empty, as Mask2Former's queries
give, 100 of 512 x 512 by default (its 100 queries at GenEval's image size).

    python benchmarks/mask_boxes.py                       # CPU, 100 masks of 512 x 512, 100 pairs
    python benchmarks/mask_boxes.py --device cuda --repeats 200
"""

from __future__ import annotations

import argparse
import statistics

import torch
from common import SpeedResult, paired_ratios, positive_int, print_table

from gors.core.threads import torch_threads
from rewards.geneval import mask_boxes


def mmdet_mask2bbox(masks: torch.Tensor) -> torch.Tensor:
    """mmdetection's ``mask2bbox`` as its code runs: (N, 4) float32 boxes (x1, y1, x2, y2) of the
    boolean (N, H, W) masks, x2 and y2 exclusive, an empty mask all zeros."""
    count = masks.shape[0]
    boxes = masks.new_zeros((count, 4), dtype=torch.float32)
    columns = torch.any(masks, dim=1)  # (N, W): any pixel in that column
    rows = torch.any(masks, dim=2)  # (N, H)
    for k in range(count):
        xs = torch.where(columns[k, :])[0]
        ys = torch.where(rows[k, :])[0]
        if len(xs) > 0 and len(ys) > 0:
            boxes[k, :] = boxes.new_tensor([xs[0], ys[0], xs[-1] + 1, ys[-1] + 1])
    return boxes


def blob_masks(count: int, size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """`count` boolean masks of `size` x `size`: random filled boxes, every fifth mask empty."""
    generator = torch.Generator().manual_seed(seed)
    masks = torch.zeros(count, size, size, dtype=torch.bool)
    corners = torch.randint(0, size, (count, 4), generator=generator)
    for k, (a, b, c, d) in enumerate(corners.tolist()):
        if k % 5:
            masks[k, min(a, b) : max(a, b) + 1, min(c, d) : max(c, d) + 1] = True
    return masks.to(device)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--full-size", action="store_true",
                        help="accepted for the common runner; the default sizes are already GenEval's")
    parser.add_argument("--masks", type=int, default=100, help="Mask2Former's 100 queries")
    parser.add_argument("--size", type=int, default=512, help="mask side in pixels (GenEval's images)")
    parser.add_argument("--repeats", type=positive_int, default=100, help="timed pairs")
    return parser.parse_args(argv)


def measure(argv: list[str] | None = None) -> list[SpeedResult]:
    """Time both on the same masks in interleaved pairs, check the boxes are identical; one row per
    thread count (on the CPU torch's default and, when that is more than one, one thread)."""
    args = parse(argv)
    device = torch.device(args.device)
    masks = blob_masks(args.masks, args.size, device)
    default_threads = torch.get_num_threads()
    thread_counts = [default_threads] + ([1] if device.type == "cpu" and default_threads > 1 else [])
    results = []
    for threads in thread_counts:
        with torch_threads(threads):
            ratios, reference, ours = paired_ratios(lambda: mmdet_mask2bbox(masks), lambda: mask_boxes(masks),
                                                    device, args.repeats, warmup=3)
            if not torch.equal(reference, ours):
                raise SystemExit("gors' boxes differ from mmdetection's mask2bbox")
            where = f"{device}, {threads} thread{'s' if threads > 1 else ''}" if device.type == "cpu" else str(device)
            print(f"{args.masks} masks of {args.size} x {args.size} on {where} "
                  f"({int(masks.flatten(1).any(1).sum())} non-empty), {args.repeats} interleaved pairs: "
                  f"mmdetection mask2bbox / gors mask_boxes min {min(ratios):.2f}x, "
                  f"median {statistics.median(ratios):.2f}x; boxes identical", flush=True)
            results.append(SpeedResult(
                stage="GenEval mask boxes",
                reference="mmdetection's `mask2bbox` (any over rows and columns, then a loop of `torch.where`)",
                sizes=f"{args.masks} masks of {args.size} x {args.size}, bool, {where}",
                ratios=ratios,
                agreement="identical",
            ))
    return results


def main() -> None:
    print_table(measure())


if __name__ == "__main__":
    main()
