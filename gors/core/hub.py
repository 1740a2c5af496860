"""Loading models by Hugging Face Hub id or local folder, with errors that say what to do."""

from __future__ import annotations

import os
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class ModelLoadError(OSError):
    """A model named by a flag could not be loaded; the message names the flag and what to do.
    An expected error of the `gors` command (one line, no traceback): raise it for any model a
    flag names (`gors.core.backbones` for a pipeline's model_index.json)."""


def load_hint(name: str) -> str:
    """What to do when `name` could not be loaded: for a local folder, check it; for a Hub id, the network."""
    if looks_like_local_path(name):
        return "Pass a local model folder with the files its loader needs, or a Hugging Face Hub id."
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return ("HF_HUB_OFFLINE=1 is set, so only the local cache is searched: download the model on a "
                "machine with internet (`hf download NAME`) or pass a local folder.")
    return ("Check the id on huggingface.co, your network, and `hf auth login` for gated models; "
            "on an offline machine pass a local folder.")


def looks_like_local_path(name: str) -> bool:
    """True when `name` is meant as a folder on disk rather than a Hub id such as `org/model`."""
    return (
        os.path.isabs(name)
        or name.startswith(("./", "../", "~"))
        or os.path.exists(name)
        or name.count("/") > 1
    )


def check_model_path(name: str, flag: str = "--pretrained_model_name_or_path") -> str:
    """Reject a local model path that does not exist before any loader tries the Hub with it."""
    expanded = os.path.expanduser(name)
    if looks_like_local_path(name) and not os.path.exists(expanded):
        raise FileNotFoundError(
            f"{flag}={name!r}: no such folder. Pass an existing local model folder or a Hugging Face "
            f"Hub id such as 'stabilityai/stable-diffusion-2-base'."
        )
    return expanded if os.path.exists(expanded) else name


def from_pretrained(loader: Callable[..., T], name: str, flag: str, **kwargs: Any) -> T:
    """Call `loader(name, **kwargs)` (a `from_pretrained`), turning load failures into one clear error."""
    name = check_model_path(name, flag)
    try:
        return loader(name, **kwargs)
    except OSError as err:  # not found, not downloadable, not readable
        message = " ".join(str(err).split())  # one line: huggingface_hub's messages span several
        raise ModelLoadError(f"{flag}={name!r} could not be loaded: {message} {load_hint(name)}") from err
    except ValueError as err:  # found, but not a checkpoint this loader reads (another class, a bad config)
        raise ValueError(f"{flag}={name!r} was found but could not be loaded as {_loader_name(loader)}: {err}. "
                         "Check that it is a checkpoint of that kind.") from err


def _loader_name(loader: Callable[..., Any]) -> str:
    owner = getattr(loader, "__self__", None)
    return getattr(owner, "__name__", None) or getattr(loader, "__qualname__", "this model class")
