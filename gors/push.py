"""`gors push`: a run's LoRA to the Hugging Face Hub, with a model card that says how it was made.

One commit, put together in `<output_dir>/hub_upload/` first (`--dry_run` stops
there, for a look before anything leaves the machine):

- `pytorch_lora_weights.safetensors`: the run's final LoRA (`--lora final`) or the best one of its
  validation (`--lora best`), as gors wrote it: diffusers' `load_lora_weights(repo_id)` reads it, and
  `gors evaluate --lora hub:<repo_id>` evaluates it;
- `README.md`: the model card: the base model, how the samples were made, scored and selected, the
  training, and with `--evaluation` the main metric of each `gors evaluate` result of this LoRA and of
  its base model (with the paper's numbers beside them, as `gors report` shows them);
- `gors_run.json`: the same facts as the run folder records them, for programs;
- `images/`: with an `--evaluation` of this LoRA, the first image of its first prompts (the Hub's widget).

Every fact comes from the run folder's own records (samples/settings.json, selection_summary.json,
the reward's scores/<reward>/settings.json, the checkpoint the LoRA was saved with); the card never
holds a number of another LoRA: an evaluation whose images were made with other weights is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gors import __version__
from gors.config import check_values
from gors.core.backbones import LORA_WEIGHT_NAME
from gors.core.hub import is_repo_id, looks_like_local_path, network_error, offline_setting, one_line
from gors.core.io import atomic_write_bytes, publish_folder, remove_stale_staging, set_usual_permissions
from gors.core.run_folder import BEST_DIR, CHECKPOINTS_DIR, best_folder
from gors.model_card import evaluation_rows, family_tags, lora_samples, model_card, run_facts

UPLOAD_DIR = "hub_upload"
CARD_FILE = "README.md"
RECORD_FILE = "gors_run.json"
SAMPLES_DIR = "images"  # a few images of the LoRA, from its evaluation
LORA_CHOICES = ("final", "best")


@dataclass
class PushConfig:
    """`gors push --output_dir RUN --repo_id ORG/NAME`: the run's LoRA and a model card to the Hugging Face Hub."""

    output_dir: str = field(metadata={"help": "The run folder (of `gors run`, a recipe or `gors train`; a --rounds "
                                              "folder too) whose LoRA is pushed."})
    repo_id: str = field(metadata={"help": "The Hub model repository, ORG/NAME (created if missing)."})
    lora: str = field(default="final", metadata={"help": "Which LoRA: `final` (the last step's) or `best` (the best "
                                                         "of --validation_benchmark, in best/).",
                                                 "choices": list(LORA_CHOICES)})
    evaluation: list[str] = field(default_factory=list, metadata={
        "help": "`gors evaluate` output folders of this LoRA and/or of its base model, whose main metrics the card "
                "tables."})
    base_model: str | None = field(default=None, metadata={
        "help": "The base model's Hub id for the card, where the run trained on a local folder (default: the "
                "model the run recorded)."})
    license: str | None = field(default=None, metadata={"help": "The card's license, usually the base model's "
                                                                "(SD 2: openrail++)."})
    private: bool = field(default=False, metadata={"help": "Make the repository private (created so, or an existing "
                                                           "public one made private before the upload)."})
    revision: str | None = field(default=None, metadata={"help": "Branch to push to (created if missing; default "
                                                                 "main)."})
    commit_message: str | None = field(default=None, metadata={"help": "Default: 'gors push: the <which> LoRA of "
                                                                       "<run folder name>'."})
    dry_run: bool = field(default=False, metadata={"help": f"Write the files into <output_dir>/{UPLOAD_DIR}/ and "
                                                           "stop, uploading nothing."})

    def __post_init__(self) -> None:
        check_values(self)  # each field's type and choices, as the flags are checked
        self.output_dir = os.path.expanduser(self.output_dir)
        self.evaluation = [os.path.expanduser(folder) for folder in self.evaluation]
        if not is_repo_id(self.repo_id):
            raise ValueError(f"--repo_id={self.repo_id!r}: give a Hugging Face Hub model repository, ORG/NAME")
        # By its form alone: a folder of the same name (`hf download X --local-dir X`) does not make a Hub id local.
        if self.base_model is not None and not is_repo_id(self.base_model):
            raise ValueError(f"--base_model={self.base_model!r}: give the base model's Hub id (ORG/NAME), which the "
                             "card links; a local folder means nothing on the Hub")


def lora_file(run: Path, which: str) -> Path:
    """The file of the run's `which` LoRA (`LORA_CHOICES`), or an error that says why there is none."""
    folder = best_folder(run) if which == "best" else run
    path = folder / LORA_WEIGHT_NAME if folder is not None else None
    if path is not None and path.is_file():
        return path
    if which == "best":
        raise FileNotFoundError(f"{run} holds no best LoRA ({BEST_DIR}/{LORA_WEIGHT_NAME}): it is kept by "
                                "--validation_benchmark during training; push the final LoRA (--lora final)")
    # A --rounds run keeps its checkpoints in its rounds' folders.
    started = any(run.glob(f"{CHECKPOINTS_DIR}/checkpoint-*")) or any(run.glob(f"round-*/{CHECKPOINTS_DIR}/checkpoint-*"))
    state = ("its training has not finished: run the command that trains it again (`gors run`, the recipe or "
             "`gors train`), which goes on from its checkpoints" if started else
             "it has not trained yet: run `gors run` (or the stage that comes next: `gors status` says which) first")
    best = best_folder(run)
    also = ", or push the best LoRA so far (--lora best)" if best is not None and (best / LORA_WEIGHT_NAME).is_file() \
        else ""
    raise FileNotFoundError(f"{run} holds no final LoRA ({LORA_WEIGHT_NAME}): {state}{also}")


def stage_upload(config: PushConfig) -> Path:
    """Put the pushed files together in `<output_dir>/hub_upload/` (replaced whole); returns the folder.

    They are written into a folder of this push's own first (another push of the same run at the same time
    must not empty it), removed when anything is refused, and published whole."""
    run = Path(config.output_dir)
    remove_stale_staging(run, f".{UPLOAD_DIR}.*.tmp")  # a killed push's
    staging = Path(tempfile.mkdtemp(prefix=f".{UPLOAD_DIR}.", suffix=".tmp", dir=run))
    try:
        _write_upload(config, run, staging)
        set_usual_permissions(staging)
        publish_folder(staging, run / UPLOAD_DIR)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return run / UPLOAD_DIR


def _write_upload(config: PushConfig, run: Path, staging: Path) -> None:
    """The LoRA, its card, its record and its sample images, into `staging`. The card states the facts of the
    staged copy of the LoRA (hashed after copying), so that a LoRA replaced meanwhile (a `best/` published by a
    training still running) is never described by another's records."""
    lora = staging / LORA_WEIGHT_NAME
    shutil.copyfile(lora_file(run, config.lora), lora)
    facts = run_facts(run, config.lora, lora)
    recorded = facts.generation.get("model")
    base_model = config.base_model or (recorded if recorded and not looks_like_local_path(recorded) else None)
    if base_model is None:
        print(f"note: the run's base model is a local folder ({recorded}): the card's metadata names no base model; "
              "pass --base_model ORG/NAME, its Hub id, to link it")
    for note in facts.notes:
        print(f"note: {note}")
    evaluation, notes = evaluation_rows(config.evaluation, facts)
    samples = []
    for index, (prompt, image) in enumerate(lora_samples(config.evaluation, facts)):
        (staging / SAMPLES_DIR).mkdir(exist_ok=True)
        shutil.copyfile(image, staging / SAMPLES_DIR / f"{index}{image.suffix}")
        samples.append((prompt, f"{SAMPLES_DIR}/{index}{image.suffix}"))
    card = model_card(config.repo_id, facts, evaluation, notes, base_model,
                      family_tags(recorded, facts.generation.get("revision")), config.license, config.revision,
                      samples)
    atomic_write_bytes(staging / CARD_FILE, card.encode("utf-8"))
    record = {"pushed_by": f"gors {__version__}", "base_model": base_model, **asdict(facts), "evaluation": evaluation}
    atomic_write_bytes(staging / RECORD_FILE, (json.dumps(record, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def _push_hint(err: BaseException, repo_id: str) -> str:
    """What to do after the Hub refused a push (`err`), by its HTTP status."""
    status = getattr(getattr(err, "response", None), "status_code", None)
    if status == 401:
        return "the token was refused: log in again (`hf auth login`) or set HF_TOKEN to a valid token"
    if status == 403:
        return (f"the token may not write to {repo_id.split('/')[0]}: use a token with write access to that user or "
                "organisation, or another --repo_id")
    if network_error(err) is not None:
        return "the Hugging Face Hub could not be reached: check your network, then run the same command again"
    if status is not None and status < 500 and status != 429:
        return f"the Hub refused the request (HTTP {status}): check --repo_id, --revision and --license"
    return "run the same command again"


def check_push_access(where: str, verify: bool = False) -> None:
    """Refuse a push that cannot start: offline mode on, or no Hugging Face token; with `verify`, also a token
    the Hub does not take, one that may only read, or a Hub out of reach (one request, `whoami`). `where`:
    what the user has meanwhile (the staged files, a run not started yet)."""
    offline = offline_setting()
    if offline:
        raise ValueError(f"{offline} is set: pushing needs the network. Unset it to push; {where}")
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise ValueError(f"no Hugging Face token: log in with `hf auth login` (a token with write access) or set "
                         f"HF_TOKEN; {where}")
    if not verify:
        return
    try:
        identity = HfApi().whoami()
    except Exception as err:  # the Hub's refusal of the token, or the network's failure
        if network_error(err) is None and getattr(err, "response", None) is None:
            raise
        raise ValueError(f"the Hugging Face token could not be checked ({one_line(err)}): "
                         f"{_push_hint(err, 'the repository')}; {where}") from err
    role = ((identity.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise ValueError(f"the Hugging Face token may only read: log in with a token with write access "
                         f"(`hf auth login`) or set HF_TOKEN to one; {where}")


def upload(config: PushConfig, folder: Path) -> str:
    """Upload `folder` as one commit to `config.repo_id` (created if missing; its visibility the namespace's
    default unless `--private`, which also makes an existing public one private), the sample images of an earlier
    push removed in it; returns the commit's URL."""
    check_push_access(f"the files are in {folder}")
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    message = config.commit_message or f"gors push: the {config.lora} LoRA of {Path(config.output_dir).name}"
    try:
        api.create_repo(config.repo_id, private=True if config.private else None, exist_ok=True)
        # An existing repository keeps its visibility through create_repo: a public one is made private before
        # anything of this run reaches it.
        if config.private and not api.model_info(config.repo_id).private:
            api.update_repo_settings(config.repo_id, private=True)
            print(f"note: {config.repo_id} existed and was public; it is private now (--private)")
        if config.revision:
            api.create_branch(config.repo_id, branch=config.revision, exist_ok=True)
        # The images of an earlier push (of another evaluation, or with none) go: the card shows this one's.
        info = api.upload_folder(repo_id=config.repo_id, folder_path=folder, commit_message=message,
                                 revision=config.revision, delete_patterns=[f"{SAMPLES_DIR}/*"])
    except ValueError as err:  # huggingface_hub's refusal of the card's metadata (an unknown --license)
        raise ValueError(f"pushing to {config.repo_id} failed ({one_line(err)}): check --license (a Hub license "
                         f"id); the files are in {folder}") from err
    except Exception as err:  # the Hub's refusals and the network's failures, with what to do
        if not isinstance(err, HfHubHTTPError) and network_error(err) is None:
            raise
        raise ValueError(f"pushing to {config.repo_id} failed ({one_line(err)}): {_push_hint(err, config.repo_id)}; "
                         f"the files are in {folder}") from err
    return info.commit_url


def push(config: PushConfig) -> Path:
    """`gors push`: stage the run's LoRA, card and record, and upload them unless `--dry_run`; returns the
    upload folder."""
    folder = stage_upload(config)
    files = ", ".join(sorted(path.name for path in folder.iterdir()))
    if config.dry_run:
        print(f"[push] --dry_run: {files} are in {folder}; nothing was uploaded")
        return folder
    commit_url = upload(config, folder)
    print(f"[push] the {config.lora} LoRA of {config.output_dir}, with {files}, is at {commit_url}")
    return folder
