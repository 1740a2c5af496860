"""Loading a model by Hub id fails with an error that names the cause and the fix: a gated repository,
offline mode, or no network. The Hub is never reached: its errors are raised by mocks, built as
huggingface_hub builds them, and pass through diffusers' real loaders, which re-raise them as their own."""

from __future__ import annotations

from pathlib import Path

import diffusers.configuration_utils
import diffusers.pipelines.pipeline_utils
import httpx2
import pytest
import requests
from diffusers import DiffusionPipeline
from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, OfflineModeIsEnabled
from huggingface_hub.utils import hf_raise_for_status

from gors.core.backbones import component_config, detect_backbone
from gors.core.hub import ModelLoadError, from_pretrained, load_hint

FLUX_DEV = "black-forest-labs/FLUX.1-dev"
SD35 = "stabilityai/stable-diffusion-3.5-large"
FLAG = "--pretrained_model_name_or_path"


def gated_error(repo_id: str, status: int = 403) -> GatedRepoError:
    """The error huggingface_hub raises for a gated repository whose license was not accepted."""
    request = httpx2.Request("GET", f"https://huggingface.co/{repo_id}/resolve/main/model_index.json")
    try:
        hf_raise_for_status(httpx2.Response(status, headers={"X-Error-Code": "GatedRepo"}, request=request))
    except GatedRepoError as err:
        return err
    raise AssertionError("hf_raise_for_status raised no GatedRepoError")


def not_cached_after(cause: BaseException) -> LocalEntryNotFoundError:
    """What `hf_hub_download` raises when the file is not cached and the Hub refused or failed (`cause`)."""
    try:
        raise LocalEntryNotFoundError("An error happened while trying to locate the file on the Hub and we cannot "
                                      "find the requested files in the local cache.") from cause
    except LocalEntryNotFoundError as err:
        return err


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """No offline switch set (conftest sets HF_HUB_OFFLINE=1 for huggingface_hub itself, read at its import)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


def hub_download_raises(monkeypatch: pytest.MonkeyPatch, err: BaseException) -> None:
    """Make the download behind diffusers' `load_config` (model_index.json, a component's config) raise `err`."""
    def download(*args, **kwargs):
        raise err

    monkeypatch.setattr(diffusers.configuration_utils, "hf_hub_download", download)


def load_pipeline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, model_info_error: BaseException) -> None:
    """`hub.from_pretrained` over diffusers' real `DiffusionPipeline.from_pretrained`, whose first Hub call
    (`model_info`) raises `model_info_error`; an empty cache folder, so nothing is found locally."""
    def model_info(*args, **kwargs):
        raise model_info_error

    monkeypatch.setattr(diffusers.pipelines.pipeline_utils, "model_info", model_info)
    from_pretrained(DiffusionPipeline.from_pretrained, name, FLAG, local_files_only=False, cache_dir=str(tmp_path))


# ---- gated repositories -------------------------------------------------------------------------


def _assert_says_accept_the_license(err: ModelLoadError, repo_id: str) -> None:
    message = str(err)
    assert f"{FLAG}={repo_id!r} is a gated repository: accept its license at https://huggingface.co/{repo_id} " \
           "while logged in there, then run `hf auth login` (or set HF_TOKEN) on this machine." == message
    assert "not a valid model identifier" not in message and "\n" not in message
    assert isinstance(err.__cause__, OSError)  # the loader's own error stays in the traceback


@pytest.mark.parametrize("status", [401, 403])  # not logged in / logged in without access
def test_a_gated_pipeline_says_to_accept_its_license_not_that_the_id_is_invalid(monkeypatch, status) -> None:
    # diffusers' load_config catches RepositoryNotFoundError, of which GatedRepoError is a subclass, and
    # says "not a valid model identifier ... If this is a private repository, make sure to pass a token".
    hub_download_raises(monkeypatch, gated_error(FLUX_DEV, status))
    with pytest.raises(ModelLoadError) as refused:
        detect_backbone(FLUX_DEV)
    _assert_says_accept_the_license(refused.value, FLUX_DEV)


def test_a_gated_component_config_says_to_accept_its_license(monkeypatch) -> None:
    hub_download_raises(monkeypatch, gated_error(FLUX_DEV))
    with pytest.raises(ModelLoadError) as refused:
        component_config(FLUX_DEV, "transformer", None)
    _assert_says_accept_the_license(refused.value, FLUX_DEV)


def test_loading_a_gated_pipelines_weights_says_to_accept_its_license(monkeypatch, tmp_path) -> None:
    # DiffusionPipeline.download takes the refusal for a network failure, looks in the cache, and raises
    # "not fully cached locally" from it.
    with pytest.raises(ModelLoadError) as refused:
        load_pipeline(monkeypatch, tmp_path, SD35, gated_error(SD35))
    _assert_says_accept_the_license(refused.value, SD35)


def test_a_gated_repository_other_than_the_one_passed_is_named(monkeypatch, tmp_path) -> None:
    with pytest.raises(ModelLoadError) as refused:
        load_pipeline(monkeypatch, tmp_path, "org/finetune", gated_error(FLUX_DEV))
    assert str(refused.value).startswith(f"{FLAG}='org/finetune' needs the gated repository {FLUX_DEV}: accept its "
                                         f"license at https://huggingface.co/{FLUX_DEV} while logged in there")


# ---- offline mode -------------------------------------------------------------------------------


@pytest.mark.parametrize("variable, value", [("HF_HUB_OFFLINE", "1"), ("HF_HUB_OFFLINE", "yes"),
                                             ("HF_HUB_OFFLINE", "ON"), ("HF_HUB_OFFLINE", "true"),
                                             ("TRANSFORMERS_OFFLINE", "1")])
def test_every_offline_setting_huggingface_hub_accepts_is_recognised(online, monkeypatch, variable, value) -> None:
    monkeypatch.setenv(variable, value)
    hub_download_raises(monkeypatch, not_cached_after(OfflineModeIsEnabled("offline")))
    with pytest.raises(ModelLoadError) as refused:
        detect_backbone(FLUX_DEV)
    message = str(refused.value)
    assert f"{variable}={value} is set, so only the local cache is searched" in message
    assert f"(`hf download {FLUX_DEV}`)" in message and "NAME" not in message
    assert "could not be reached" not in message  # offline mode refused: no network failure


def test_offline_switches_off_are_not_offline(online, monkeypatch) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE: a set HF_HUB_OFFLINE=0 decides.
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert "is set" not in load_hint(FLUX_DEV)
    monkeypatch.setenv("HF_HUB_OFFLINE", "false")
    assert "is set" not in load_hint(FLUX_DEV)


# ---- no network ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cause", [httpx2.ConnectError("[Errno -3] Temporary failure in name resolution"),
                                   httpx2.ConnectTimeout("timed out"), requests.ConnectionError("refused"),
                                   ConnectionRefusedError(111, "Connection refused")])
def test_no_network_suggests_offline_mode_with_a_local_copy(online, monkeypatch, cause) -> None:
    # diffusers reports hf_hub_download's LocalEntryNotFoundError as "does not appear to have a file named
    # model_index.json"; only the chain says the Hub was not reached.
    hub_download_raises(monkeypatch, not_cached_after(cause))
    with pytest.raises(ModelLoadError) as refused:
        detect_backbone(FLUX_DEV)
    message = str(refused.value)
    assert f"The Hugging Face Hub could not be reached ({type(cause).__name__}): check your network." in message
    assert "set HF_HUB_OFFLINE=1 and pass a local folder or a cached copy" in message
    assert f"`hf download {FLUX_DEV}`" in message and "every file is retried before failing" in message
    assert "\n" not in message


def test_no_network_while_loading_weights_suggests_offline_mode(online, monkeypatch, tmp_path) -> None:
    with pytest.raises(ModelLoadError, match=r"could not be loaded: Cannot load model .* The Hugging Face Hub could "
                                             r"not be reached \(ConnectError\): .* set HF_HUB_OFFLINE=1"):
        load_pipeline(monkeypatch, tmp_path, SD35, httpx2.ConnectError("Temporary failure in name resolution"))


def test_other_failures_get_no_network_advice(online, monkeypatch) -> None:
    hub_download_raises(monkeypatch, OSError("disk full"))
    with pytest.raises(ModelLoadError) as refused:
        detect_backbone(FLUX_DEV)
    assert "could not be reached" not in str(refused.value) and "is a gated repository" not in str(refused.value)
    assert "Check the id on huggingface.co" in str(refused.value)


def test_a_hub_lora_out_of_reach_is_read_from_the_cache_not_downloaded_again(online, monkeypatch, tmp_path) -> None:
    import huggingface_hub

    from gors.core.hub import download_lora

    downloads = []

    def unreachable(*args, **kwargs):
        downloads.append(kwargs.get("local_files_only"))
        if kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError("not in the cache")
        raise not_cached_after(httpx2.ConnectError("Temporary failure in name resolution"))

    cached: list[str] = []
    snapshots = []

    def snapshot(*args, **kwargs):
        snapshots.append(kwargs)
        if not cached:
            raise LocalEntryNotFoundError("not in the cache")
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    with pytest.raises(ModelLoadError, match=r"could not be read from the Hugging Face Hub .* could not be reached"):
        download_lora("me/lora", "pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin", shown="hub:me/lora")
    assert [call["local_files_only"] for call in snapshots] == [True]  # the cache only: no second round of retries
    # A LoRA under another file name, cached earlier, is read from the cache.
    (tmp_path / "my_lora.safetensors").write_bytes(b"")
    cached.append("my_lora.safetensors")
    assert download_lora("me/lora", "pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin") == \
        str(tmp_path / "my_lora.safetensors")
    # A cached snapshot without a LoRA file: the torch file is looked for in the cache alone, and its absence is
    # told as the network's failure.
    (tmp_path / "my_lora.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"could not be read from the Hugging Face Hub .* could not be reached"):
        download_lora("me/lora", "pytorch_lora_weights.safetensors", "pytorch_lora_weights.bin")
    assert downloads[-2:] == [None, True]  # the LoRA file tried online, the torch file in the cache only


def test_a_name_that_is_no_hub_id_gets_no_download_advice() -> None:
    for name in ("runs/my run", "runs\\sd2"):
        assert load_hint(name).startswith("Pass a local model folder") and "hf download" not in load_hint(name)


def test_a_hub_id_is_org_slash_name_only(tmp_path, monkeypatch) -> None:
    """`org/name` is a Hub id; a bare name (`sd2`, a folder mistyped or not made yet) is none, and gets the
    advice for a local folder, not `hf download`. An `org/name` that is a folder here is that folder."""
    from gors.core.hub import is_hub_id, is_repo_id

    assert is_repo_id("org/model") and is_hub_id("org/model")
    assert not is_repo_id("sd2") and not is_hub_id("sd2")
    assert load_hint("sd2").startswith("Pass a local model folder")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)
    assert is_repo_id("org/model") and not is_hub_id("org/model")


def test_the_cause_an_error_was_raised_from_is_found_before_the_one_it_was_handling() -> None:
    """diffusers' error raised from the Hub's while handling another: the Hub's, its direct cause, names the failure."""
    from gors.core.hub import find_in_chain

    try:
        try:
            raise ConnectionError("handled before")
        except ConnectionError:
            raise OSError("diffusers' own") from ConnectionRefusedError(111, "Connection refused")
    except OSError as err:
        assert isinstance(find_in_chain(err, ConnectionError), ConnectionRefusedError)


def test_a_windows_path_that_does_not_exist_is_refused_as_a_folder() -> None:
    """`runs\\sd2` is meant as a folder (no Hub id has a backslash): one that does not exist is refused before
    any loader tries the Hub with it."""
    from gors.core.hub import check_model_path, looks_like_local_path

    assert looks_like_local_path("runs\\sd2") and not looks_like_local_path("org/model")
    with pytest.raises(FileNotFoundError, match=r"--pretrained_model_name_or_path='runs\\\\sd2': no such folder"):
        check_model_path("runs\\sd2")
    # A path of several folders is one on disk too (a Hub id has one slash).
    with pytest.raises(FileNotFoundError, match=r"--pretrained_model_name_or_path='runs/sd2/final': no such folder"):
        check_model_path("runs/sd2/final")


def test_offline_modes_refusal_is_no_network_failure_and_a_home_path_is_expanded(tmp_path, monkeypatch) -> None:
    """huggingface_hub's own refusal in offline mode (an `OfflineModeIsEnabled`, a ConnectionError) says nothing
    of the network; a `~` path that exists is passed on expanded, as loaders do not expand it."""
    from gors.core.hub import check_model_path, network_error

    assert network_error(OfflineModeIsEnabled("offline")) is None
    assert isinstance(network_error(requests.ConnectionError("unreachable")), requests.ConnectionError)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "model").mkdir()
    assert check_model_path("~/model") == str(tmp_path / "model")
    with pytest.raises(FileNotFoundError, match="'~/missing': no such folder"):  # no Hub id either
        check_model_path("~/missing")


def test_a_loader_gets_a_home_path_expanded_and_never_a_folder_that_is_not_there(tmp_path, monkeypatch) -> None:
    """`from_pretrained` checks a local path before its loader runs: `~` expanded, a missing folder refused as such
    (not tried on the Hub as an id)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "model").mkdir()
    loaded: list[str] = []
    assert from_pretrained(lambda name: loaded.append(name) or name, "~/model", FLAG) == str(tmp_path / "model")
    with pytest.raises(FileNotFoundError, match=rf"{FLAG}='./missing': no such folder"):
        from_pretrained(loaded.append, "./missing", FLAG)
    assert loaded == [str(tmp_path / "model")]
