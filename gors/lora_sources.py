"""Where the weights of a `--lora` value come from: a local path, a release, or the Hugging Face Hub.

- a path (a LoRA folder or file, e.g. a run's `runs/gors_color`): read as it is;
- `official:<category>`: T2I-CompBench's GORS LoRA of that category, downloaded and converted once into the
  cache (`gors.official_lora`);
- `hub:<org>/<name>`: a diffusers-format LoRA on the Hugging Face Hub, downloaded into the Hub cache.

Remote values take a prefix rather than a bare `org/name`: gors' own run folders read like Hub ids, and a
folder missing from the working directory must not fetch someone's repository of that name.
"""

from __future__ import annotations

from pathlib import Path

from gors.core.distributed import main_process_decides, process_state
from gors.core.hub import download_lora, is_repo_id, snapshot_commit
from gors.core.pipeline import LORA_WEIGHT_FILES
from gors.official_lora import OFFICIAL_PREFIX, official_lora_folder

HUB_PREFIX = "hub:"
# The `--lora` values that name no local path: `resolve_lora` fetches them.
REMOTE_LORA_PREFIXES = (OFFICIAL_PREFIX, HUB_PREFIX)


def hub_lora(lora: str) -> str:
    """The LoRA file of `hub:<org>/<name>` (`gors.core.hub.download_lora`), the same commit on every process: the
    main process resolves the repository's main branch, the others download that commit (a push between their
    requests would otherwise give them other weights). A collective call under several processes."""
    repo_id = lora[len(HUB_PREFIX):]
    if not is_repo_id(repo_id):
        raise ValueError(f"--lora={lora!r}: after {HUB_PREFIX} give a Hugging Face Hub repository id, "
                         f"{HUB_PREFIX}<org>/<name>")
    state = process_state()
    path = main_process_decides(state, lambda: download_lora(repo_id, *LORA_WEIGHT_FILES, shown=lora))
    commit = snapshot_commit(path)
    if state.is_main_process:  # the main branch moves: say which weights the results are of
        print(f"note: --lora {lora} is read from the Hugging Face Hub: {Path(path).name} at commit {commit}")
    else:  # its own cache (another node's may not hold the main process's path)
        path = download_lora(repo_id, *LORA_WEIGHT_FILES, shown=lora, revision=commit)
    return path


def resolve_lora(lora: str | None) -> str | None:
    """A local path for `lora`: `official:<category>` -> a folder holding the converted official LoRA (for
    SD-2-base, which it was trained on; `official_lora_folder`); `hub:<org>/<name>` -> its LoRA file in the Hub
    cache (`hub_lora`); a local path, or None, unchanged."""
    if lora is not None and lora.startswith(HUB_PREFIX):
        return hub_lora(lora)
    if lora is not None and lora.startswith(OFFICIAL_PREFIX):
        return official_lora_folder(lora[len(OFFICIAL_PREFIX):])
    return lora
