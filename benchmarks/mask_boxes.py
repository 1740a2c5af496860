"""GenEval's mask boxes: the vectorised `mask_boxes` against a loop over the masks, same masks.

Mask2Former gives 100 query masks per image at image size; each needs its extent (mmdetection's
``mask2bbox``). This script times `rewards.geneval.mask_boxes` against a per-mask loop, checks
that they agree and prints the ratio.

    python benchmarks/mask_boxes.py                  # CPU, 100 masks of 512 x 512
    python benchmarks/mask_boxes.py --device cuda --repeats 50
"""

from __future__ import annotations

import argparse
import time

import torch

from rewards.geneval import mask_boxes


def loop_mask_boxes(masks: torch.Tensor) -> torch.Tensor:
    """The reference: one mask at a time."""
    boxes = torch.zeros(masks.shape[0], 4, device=masks.device)
    for k, mask in enumerate(masks):
        ys, xs = torch.where(mask)
        if len(xs):
            boxes[k] = torch.stack([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]).float()
    return boxes


def _timed(function, masks: torch.Tensor, repeats: int) -> tuple[torch.Tensor, float]:
    function(masks)  # warm-up
    if masks.is_cuda:
        torch.cuda.synchronize(masks.device)
    start = time.perf_counter()
    for _ in range(repeats):
        result = function(masks)
    if masks.is_cuda:
        torch.cuda.synchronize(masks.device)
    return result, (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--masks", type=int, default=100)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    # Blob-like masks: random boxes, some of them empty, as Mask2Former's queries give.
    masks = torch.zeros(args.masks, args.size, args.size, dtype=torch.bool)
    corners = torch.randint(0, args.size, (args.masks, 4), generator=generator)
    for k, (a, b, c, d) in enumerate(corners.tolist()):
        if k % 5:
            masks[k, min(a, b) : max(a, b) + 1, min(c, d) : max(c, d) + 1] = True
    masks = masks.to(args.device)

    reference, reference_s = _timed(loop_mask_boxes, masks, args.repeats)
    ours, ours_s = _timed(mask_boxes, masks, args.repeats)
    assert torch.equal(reference, ours), "the vectorised boxes differ from the loop's"
    print(f"{args.masks} masks of {args.size} x {args.size} on {args.device}:")
    print(f"  loop over masks  {1000 * reference_s:8.2f} ms")
    print(f"  vectorised       {1000 * ours_s:8.2f} ms")
    print(f"  speed-up {reference_s / ours_s:.1f}x (identical boxes)")


if __name__ == "__main__":
    main()
