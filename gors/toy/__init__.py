"""The toy world's trainer side: `gors toy pretrain` (the packaged toy model) and the GORS demo.

The toy world itself (prompts, renderer, packaged weights) is data in `gors.core.toy`; its exact
scorer and learned classifier are rewards (`rewards.toy_rules`, `rewards.toy_cnn`).
"""
