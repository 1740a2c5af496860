"""Published numbers to print beside measured ones in `gors report` (never used as results).

T2I-CompBench (Huang et al., NeurIPS 2023), Table 2: Stable Diffusion v2 (`stable-diffusion-2-base`,
the model GORS fine-tunes) and GORS, each category's own metric (B-VQA for color/shape/texture,
UniDet spatial rule, CLIPScore for non-spatial, 3-in-1 for complex).
"""

from __future__ import annotations

PUBLISHED: dict[str, dict[str, float]] = {
    "SD-2-base (T2I-CompBench paper)": {
        "t2i_compbench:color": 0.5065,
        "t2i_compbench:shape": 0.4221,
        "t2i_compbench:texture": 0.4922,
        "t2i_compbench:spatial": 0.1342,
        "t2i_compbench:non_spatial": 0.3096,
        "t2i_compbench:complex": 0.3386,
    },
    "GORS (T2I-CompBench paper)": {
        "t2i_compbench:color": 0.6603,
        "t2i_compbench:shape": 0.4785,
        "t2i_compbench:texture": 0.6287,
        "t2i_compbench:spatial": 0.1815,
        "t2i_compbench:non_spatial": 0.3193,
        "t2i_compbench:complex": 0.3328,
    },
}
