"""Loading models by Hugging Face Hub id or local folder, with errors that say what to do."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, TypeVar

from gors.core.fingerprints import local_fingerprint

T = TypeVar("T")

# The models `from_pretrained` loads inside `recording_loads`, by name: their version (`model_version`).
_LOADS: ContextVar[dict[str, str | None] | None] = ContextVar("gors_model_loads", default=None)

# huggingface_hub's offline switches, in the order it reads them (`constants.HF_HUB_OFFLINE`).
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


class ModelLoadError(OSError):
    """A model named by a flag could not be loaded; the message names the flag and what to do.
    An expected error of the `gors` command (one line, no traceback): raise it for any model a
    flag names (`gors.core.backbones` for a pipeline's model_index.json)."""


def one_line(text: object) -> str:
    """`text` on one line: huggingface_hub's and diffusers' messages span several."""
    return " ".join(str(text).split())


def offline_setting() -> str | None:
    """The variable that puts huggingface_hub offline, as `NAME=value`, else None.

    Parsed as huggingface_hub parses it (`HF_HUB_OFFLINE`, else `TRANSFORMERS_OFFLINE`; 1/ON/YES/TRUE in
    any case), but read now: huggingface_hub reads it once at import, and tests set it after that.
    """
    from huggingface_hub.constants import ENV_VARS_TRUE_VALUES

    for variable in OFFLINE_VARIABLES:
        value = os.environ.get(variable)
        if value:  # the first one set decides, even "0": huggingface_hub's `or`
            return f"{variable}={value}" if value.upper() in ENV_VARS_TRUE_VALUES else None
    return None


def find_in_chain(err: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
                  ) -> BaseException | None:
    """The first exception of `kinds` among `err` and the errors it was raised from or while handling:
    diffusers and transformers re-raise the Hub's errors as their own, so only the chain names the cause."""
    pending: list[BaseException | None] = [err]
    seen: set[int] = set()
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kinds):
            return current
        pending += [current.__cause__, current.__context__]
    return None


def raise_if_gated(err: BaseException, name: str, flag: str, shown: str | None = None) -> None:
    """Raise a `ModelLoadError` saying what to do if `err` comes from a gated repository.

    diffusers reports a `GatedRepoError` (a `RepositoryNotFoundError`) as "not a valid model identifier":
    the user would never learn that the license must be accepted.
    `shown`: the option's value as typed, where it is not `name` (`hub:<name>`).
    """
    from huggingface_hub.errors import GatedRepoError

    gated = find_in_chain(err, GatedRepoError)
    if gated is None:
        return
    repo_id = getattr(gated, "repo_id", None) or name
    # A pipeline can take a component from another repository: name the one that is gated.
    what = "is a gated repository" if repo_id == name else f"needs the gated repository {repo_id}"
    raise ModelLoadError(
        f"{flag}={(shown or name)!r} {what}: accept its license at https://huggingface.co/{repo_id} while logged in there, "
        "then run `hf auth login` (or set HF_TOKEN) on this machine."
    ) from err


def _network_errors() -> tuple[type[BaseException], ...]:
    """The exception types of an unreachable Hub: Python's own and those of the HTTP clients
    huggingface_hub uses (httpx2 in this version, httpx or requests in others), where installed."""
    import importlib

    kinds: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module_name, names in (("httpx2", ("TransportError",)), ("httpx", ("TransportError",)),
                               ("requests", ("ConnectionError", "Timeout"))):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        kinds += [getattr(module, name) for name in names if hasattr(module, name)]
    return tuple(kinds)


def network_error(err: BaseException) -> BaseException | None:
    """The error in `err`'s chain that says the Hub could not be reached, else None (offline mode's own
    refusal, `OfflineModeIsEnabled`, is no network failure)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    found = find_in_chain(err, _network_errors())
    return None if isinstance(found, OfflineModeIsEnabled) else found


def load_hint(name: str, err: BaseException | None = None) -> str:
    """What to do when `name` could not be loaded (`err`: the failure, to tell a network one):
    for a local folder, check it; for a Hub id, offline mode, the network or the id."""
    if looks_like_local_path(name) or not is_repo_id(name):  # no Hub id ("runs/my run"): `hf download` of it is no fix
        return "Pass a local model folder with the files its loader needs, or a Hugging Face Hub id."
    offline = offline_setting()
    if offline:
        return (f"{offline} is set, so only the local cache is searched: download the model on a machine with "
                f"internet (`hf download {name}`) and copy its Hugging Face cache here, or pass a local folder.")
    unreachable = None if err is None else network_error(err)
    if unreachable is not None:
        return (f"The Hugging Face Hub could not be reached ({type(unreachable).__name__}): check your network. On a "
                f"machine without one, set HF_HUB_OFFLINE=1 and pass a local folder or a cached copy "
                f"(`hf download {name}` elsewhere); otherwise every file is retried before failing.")
    return ("Check the id on huggingface.co, your network, and `hf auth login` for gated models; "
            "on an offline machine set HF_HUB_OFFLINE=1 and pass a local folder.")


def is_repo_id(name: str) -> bool:
    """Whether `name` is a valid Hub repository id of the form `org/name`."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return name.count("/") == 1


def is_hub_id(name: str) -> bool:
    """Whether `name` reads as a Hub repository id (`org/name`) rather than a path on disk."""
    return is_repo_id(name) and not looks_like_local_path(name)


def snapshot_commit(path: str | Path) -> str:
    """The commit of a file at the top of a Hub cache snapshot (`.../snapshots/<commit>/<file>`)."""
    return Path(path).parent.name


def download_lora(repo_id: str, weight_name: str, pickle_name: str, flag: str = "--lora", shown: str | None = None,
                  revision: str | None = None) -> str:
    """A LoRA on the Hugging Face Hub (`org/name`; `revision`, default its main branch), downloaded once into the
    Hub cache (offline: the cached copy), as diffusers' `load_lora_weights(repo_id)` picks it: the file
    `weight_name` at the repository's top level, else its one top-level `.safetensors` file that is no
    optimizer's, scheduler's or checkpoint's, else the torch file `pickle_name`. `shown`: the option's value as
    typed, for messages (default `repo_id`)."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    given = f"{flag}={(shown or repo_id)!r}"
    unreachable: BaseException | None = None
    try:
        try:
            return hf_hub_download(repo_id, weight_name, revision=revision)
        except EntryNotFoundError as missing:  # not in the repository, or offline and not cached: its top-level file
            # With the Hub out of reach only the cache is read: a download would retry every file again, in vain.
            unreachable = missing if network_error(missing) is not None else None
            try:
                folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=["*.safetensors"],
                                                ignore_patterns=["*/*"], local_files_only=unreachable is not None))
            except EntryNotFoundError:
                if unreachable is None:
                    raise
                raise unreachable  # what the user must hear: the network (its cause)
        found = sorted(path.name for path in folder.glob("*.safetensors")
                       if not any(word in path.name for word in ("scheduler", "optimizer", "checkpoint")))
        if not found:
            try:
                return hf_hub_download(repo_id, pickle_name, revision=revision,
                                       local_files_only=unreachable is not None)
            except EntryNotFoundError:
                if unreachable is not None:
                    raise unreachable
    except Exception as err:  # the Hub's and the network's errors, of many types: each said in one line
        raise_if_gated(err, repo_id, flag, shown)
        raise ModelLoadError(f"{given}: the LoRA could not be read from the Hugging Face Hub ({one_line(err)}). "
                             f"{load_hint(repo_id, err)}") from err
    if len(found) == 1:
        return str(folder / found[0])
    if not found:
        offline = offline_setting() is not None  # then the cache may hold less than the repository
        where = "the local cache holds" if offline else "the repository holds"
        raise ModelLoadError(f"{given}: {where} no {weight_name}, no other LoRA .safetensors file at its top level "
                             f"and no {pickle_name}. " + (load_hint(repo_id) if offline else
                                                          "Pass a LoRA in diffusers' format"))
    raise ModelLoadError(f"{given}: the repository holds no {weight_name} and several LoRA-like .safetensors files "
                         f"({', '.join(found)}) at its top level: download the one to use (`hf download {repo_id} "
                         "FILE --local-dir DIR`) and pass its path DIR/FILE")


def looks_like_local_path(name: str) -> bool:
    """True when `name` is meant as a folder on disk rather than a Hub id such as `org/model`."""
    return (
        os.path.isabs(name)
        or name.startswith(("./", "../", "~"))
        or os.path.exists(name)
        or name.count("/") > 1
        or "\\" in name  # a Windows path (`runs\\sd2`); no Hub id has one
    )


def check_model_path(name: str, flag: str = "--pretrained_model_name_or_path",
                     example: str | None = "stabilityai/stable-diffusion-2-base") -> str:
    """Reject a local model path that does not exist before any loader tries the Hub with it (`example`:
    a Hub id the message suggests, None for none)."""
    expanded = os.path.expanduser(name)
    if looks_like_local_path(name) and not os.path.exists(expanded):
        such_as = f" such as {example!r}" if example else ""
        raise FileNotFoundError(
            f"{flag}={name!r}: no such folder. Pass an existing local model folder or a Hugging Face Hub id{such_as}."
        )
    return expanded if os.path.exists(expanded) else name


def hub_commit(name: str, revision: str | None = None) -> str | None:
    """The commit of Hub model `name` at `revision` (None: its default branch) that the local Hugging Face
    cache resolves it to, i.e. the snapshot a `from_pretrained` of it reads; None for a local folder or
    a model the cache does not hold. Read from the cache alone: nothing is downloaded."""
    if looks_like_local_path(name):
        return None
    if revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision):
        return revision
    ref = _cache_folder(name) / "refs" / (revision or "main")
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def cached_snapshot(name: str, commit: str) -> Path | None:
    """The folder of Hub model `name` at `commit` in the local Hugging Face cache, where it holds one: a
    local path that loads exactly that version, offline."""
    folder = _cache_folder(name) / "snapshots" / commit
    return folder if folder.is_dir() else None


def model_version(name: str, revision: str | None = None) -> str | None:
    """What identifies the weights a `from_pretrained(name, revision=revision)` reads, as run folders
    record it: a Hub model's commit (`hub_commit`), or a local file's or folder's fingerprint
    (`gors.core.fingerprints.local_fingerprint`, "sha256:..."), so that a model retrained in place is
    told from the old one; None where neither is known (a model the cache does not hold, a path that
    does not exist)."""
    if looks_like_local_path(name):
        return local_fingerprint(name)
    return hub_commit(name, revision)


def _cache_folder(name: str) -> Path:
    """The folder of Hub model `name` in the local Hugging Face cache (it may not exist)."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model")


def check_cached(name: str, what: str) -> None:
    """Raise a `ModelLoadError` when huggingface_hub is offline and Hub model `name` is not in the local
    cache: its loader would fail only when it first runs, after what came before it (hours of
    generating for a reward's model). `what` names the option that gave `name`, for the message. A local
    folder, or any model while online, passes."""
    offline = offline_setting()
    if offline is None or looks_like_local_path(name):
        return
    commit = hub_commit(name)
    if commit is not None and (_cache_folder(name) / "snapshots" / commit).is_dir():
        return
    from huggingface_hub import constants

    raise ModelLoadError(
        f"{what}={name!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and {offline} is set, "
        f"so it cannot be downloaded: on a machine with internet run `hf download {name}` (or `gors download` "
        "before the command and its flags, for all it loads) and copy the cache here, or pass a local folder."
    )


@contextmanager
def recording_loads() -> Iterator[dict[str, str | None]]:
    """Collect in the dict yielded the models loaded inside (by `from_pretrained` or `note_load`) on this
    thread: name -> its version (`model_version`: a Hub commit, a local folder's fingerprint). A recording
    inside another also reports to the outer one."""
    loads: dict[str, str | None] = {}
    token = _LOADS.set(loads)
    try:
        yield loads
    finally:
        _LOADS.reset(token)
        outer = _LOADS.get()
        if outer is not None:
            outer.update(loads)


def note_load(name: str, revision: str | None = None) -> None:
    """Tell a `recording_loads` around this call that model `name` was loaded (by a loader other than
    `from_pretrained`, e.g. open_clip's)."""
    loads = _LOADS.get()
    if loads is not None:
        loads[name] = model_version(name, revision)


def from_pretrained(loader: Callable[..., T], name: str, flag: str, **kwargs: Any) -> T:
    """Call `loader(name, **kwargs)` (a `from_pretrained`), turning load failures into one clear error.
    The load is noted for a `recording_loads` around the call."""
    name = check_model_path(name, flag)
    try:
        loaded = loader(name, **kwargs)
    except OSError as err:  # not found, not downloadable, not readable
        raise_if_gated(err, name, flag)
        reason = one_line(err).rstrip()
        reason += "" if reason.endswith((".", "!", "?")) else "."
        raise ModelLoadError(f"{flag}={name!r} could not be loaded: {reason} {load_hint(name, err)}") from err
    except ValueError as err:  # found, but not a checkpoint this loader reads (another class, a bad config)
        raise_if_gated(err, name, flag)
        raise ValueError(f"{flag}={name!r} was found but could not be loaded as {_loader_name(loader)}: {err}. "
                         "Check that it is a checkpoint of that kind.") from err
    note_load(name, kwargs.get("revision"))
    return loaded


def _loader_name(loader: Callable[..., Any]) -> str:
    owner = getattr(loader, "__self__", None)
    return getattr(owner, "__name__", None) or getattr(loader, "__qualname__", "this model class")
