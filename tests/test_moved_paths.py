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


@pytest.mark.parametrize(("old", "new"), [
    ("gors.score:load_scores", "gors.core.scoring:load_scores"),
    ("gors.score:read_score_rows", "gors.core.scoring:read_score_rows"),
    ("gors.score:check_settings", "gors.core.scoring:check_settings"),
    ("gors.score:SETTINGS_FILE", "gors.core.scoring:SETTINGS_FILE"),
    ("gors.select:SUMMARY_FILE", "gors.core.run_folder:SELECTION_SUMMARY_FILE"),
    ("gors.train:CHECKPOINTS", "gors.core.run_folder:CHECKPOINTS_DIR"),
    ("gors.training_data:CACHE_DIR", "gors.core.run_folder:LATENT_CACHE_DIR"),
    ("gors.cli:run_stages", "gors.run:run_stages"),
    ("gors.cli:run", "gors.run:run"),
    ("gors.official_lora:TEXT_ENCODER_SUFFIX", "gors.core.pipeline:LORA_DIFFUSION_TEXT_ENCODER_SUFFIX"),
    ("gors.official_lora:resolve_lora", "gors.lora_sources:resolve_lora"),
])
def test_names_moved_out_of_a_staying_module_warn_and_forward(old, new):
    (old_module, old_name), (new_module, new_name) = old.split(":"), new.split(":")
    module = importlib.import_module(old_module)
    with pytest.warns(DeprecationWarning, match=rf"{old_module}.{old_name} moved to {new_module}.{new_name}; the old "
                                                rf"path goes in gors {REMOVED_IN}"):
        value = getattr(module, old_name)
    assert value is getattr(importlib.import_module(new_module), new_name)
    with pytest.raises(AttributeError, match=rf"module '{old_module}' has no attribute 'nothing_here'"):
        module.nothing_here


def test_from_import_of_a_moved_name_works():
    with pytest.warns(DeprecationWarning, match="gors.cli.run_stages moved to gors.run.run_stages"):
        from gors.cli import run_stages
    import gors.run

    assert run_stages is gors.run.run_stages
