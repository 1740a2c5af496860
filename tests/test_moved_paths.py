"""The 0.1 import paths of modules that moved into layers (gors._moved): they warn and forward."""

from __future__ import annotations

import importlib
import sys

import pytest

from gors._moved import MOVED, REMOVED_IN


@pytest.fixture
def fresh_aliases():
    """Forget any alias an earlier test imported, so that each import here makes (and warns of) its own."""
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] == "gors"
             and (name in MOVED or name.rpartition(".")[0] in MOVED)}
    yield
    for name in list(sys.modules):
        if name in MOVED or name.rpartition(".")[0] in MOVED:
            sys.modules.pop(name)
    sys.modules.update(saved)


@pytest.mark.parametrize("old", sorted(MOVED))
def test_each_old_path_warns_naming_its_new_one(old, fresh_aliases):
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {MOVED[old][0]}; the old path goes in gors "
                                                rf"{REMOVED_IN}"):
        importlib.import_module(old)


def test_old_paths_forward_to_the_same_objects(fresh_aliases):
    import gors.core.paper
    import gors.core.prompts
    import gors.core.store
    import gors.testing.sd

    with pytest.warns(DeprecationWarning):
        from gors.prompts import CATEGORIES, read_prompt_file  # two new homes, first match wins
        from gors.store import SampleStore
        from gors.tiny.sd import build_tiny_sd_pipeline  # a sub-module of a moved package
    assert SampleStore is gors.core.store.SampleStore
    assert read_prompt_file is gors.core.prompts.read_prompt_file and CATEGORIES is gors.core.paper.CATEGORIES
    assert build_tiny_sd_pipeline is gors.testing.sd.build_tiny_sd_pipeline
    with pytest.raises(AttributeError, match=r"'gors.store' \(moved to gors.core.store\) has no 'nothing_here'"):
        importlib.import_module("gors.store").nothing_here


def test_real_modules_are_never_shadowed(fresh_aliases):
    # gors.toy is a real package from which one module moved: its other modules import as themselves.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        demo = importlib.import_module("gors.toy.demo")
    assert demo.__file__.endswith("gors/toy/demo.py")
    with pytest.warns(DeprecationWarning, match="gors.toy.world moved to gors.core.toy.world"):
        importlib.import_module("gors.toy.world")
