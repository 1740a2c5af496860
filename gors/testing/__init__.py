"""Builders of tiny random-initialised models of the real classes, for tests and speed scripts.

As `diffusers.utils.testing_utils` and `transformers.testing_utils`: nothing in the product
imports this package. Each builder writes a folder that the real loaders read
(`from_pretrained`), so the tests exercise the same code paths as the Hub checkpoints.
"""
