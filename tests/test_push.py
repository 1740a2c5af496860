"""`gors push`: the staged files and model card of a finished tiny run, the refusals, and the upload
through huggingface_hub's own HTTP code to a local stand-in of the Hub's API."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from pinned_http import serving

from gors.cli import main
from gors.core.backbones import LORA_WEIGHT_NAME
from gors.core.io import files_sha256
from gors.model_card import BASE_ROW, LORA_ROW
from gors.push import CARD_FILE, RECORD_FILE, UPLOAD_DIR, PushConfig, push


@pytest.fixture(scope="module")
def trained_run(make_module_run_config):
    """A finished tiny GORS run (3 prompts x 2 images, 2 training steps), and `gors evaluate` folders of its
    base model and of its LoRA on the toy benchmark (2 prompts, 1 image each)."""
    from gors.core.distributed import reset_process_state
    from gors.run import run

    config = make_module_run_config()
    run(config)
    reset_process_state()
    folder = Path(config.output_dir)
    for name, lora in (("eval_base", []), ("eval_lora", ["--lora", str(folder)])):
        main(["evaluate", "--pretrained_model_name_or_path", config.pretrained_model_name_or_path, *lora,
              "--benchmarks", "toy", "--max_prompts", "2", "--images_per_prompt", "1", "--num_inference_steps", "2",
              "--resolution", "32", "--output_dir", str(folder.parent / name)])
        reset_process_state()
    return config


def front_matter(card: str) -> dict:
    _, metadata, _ = card.split("---\n", 2)
    return yaml.safe_load(metadata)


def test_a_dry_run_stages_the_lora_a_card_of_the_runs_records_and_its_evaluations(trained_run, capsys):
    run = Path(trained_run.output_dir)
    folder = push(PushConfig(output_dir=str(run), repo_id="me/tiny-gors", dry_run=True,
                             base_model="stabilityai/stable-diffusion-2-base", license="openrail++",
                             evaluation=[str(run.parent / "eval_base"), str(run.parent / "eval_lora")]))
    assert folder == run / UPLOAD_DIR
    assert sorted(path.name for path in folder.iterdir()) == [CARD_FILE, RECORD_FILE, "images", LORA_WEIGHT_NAME]
    assert (folder / LORA_WEIGHT_NAME).read_bytes() == (run / LORA_WEIGHT_NAME).read_bytes()
    assert "nothing was uploaded" in capsys.readouterr().out

    card = (folder / CARD_FILE).read_text()
    metadata = front_matter(card)
    assert metadata["base_model"] == "stabilityai/stable-diffusion-2-base"
    assert metadata["license"] == "openrail++" and metadata["library_name"] == "diffusers"
    assert {"lora", "gors", "stable-diffusion"} <= set(metadata["tags"])  # the family read from the local model
    selection = json.loads((run / "selection_summary.json").read_text())
    assert f"kept {selection['num_selected']} of {selection['num_samples']}" in card
    assert "| samples | 2 per prompt, 2 steps of DDIMScheduler" in card
    assert "the final one, step 2" in card
    assert f"| base model | stabilityai/stable-diffusion-2-base (the run read a local folder " \
        f"({Path(trained_run.pretrained_model_name_or_path).name})) |" in card
    assert "| LoRA | rank 4 on text_encoder (q_proj, k_proj, v_proj, out_proj, learning rate 5e-06); unet (to_q, " \
        "to_k, to_v, to_out.0) |" in card  # the components of the file itself
    assert trained_run.pretrained_model_name_or_path not in card  # a local path stays in gors_run.json only
    assert 'pipeline.load_lora_weights("me/tiny-gors")' in card
    assert "## Citation" in card and "@article{huang2023t2icompbench," in card
    # The first image of each of the LoRA's evaluation prompts (2 here), shown on the Hub's page.
    from gors.core.store import SampleStore

    store = SampleStore(run.parent / "eval_lora" / "toy" / "held_out" / "samples")
    firsts = sorted((r for r in store.records() if r["image_index"] == 0), key=lambda r: r["prompt_index"])
    assert metadata["widget"] == [{"text": r["prompt"], "output": {"url": f"images/{i}.png"}} for i, r in enumerate(firsts)]
    assert [(folder / "images" / f"{i}.png").read_bytes() for i in range(2)] == \
        [store.image_path(r).read_bytes() for r in firsts]
    assert "| ![0](images/0.png) | ![1](images/1.png) |" in card

    record = json.loads((folder / RECORD_FILE).read_text())
    assert record["lora_sha256"] == files_sha256([run / LORA_WEIGHT_NAME])
    assert record["step"] == 2 and record["training"]["rank"] == 4
    assert record["rounds"] is None and "| online rounds |" not in card  # no --rounds run
    assert record["prompts"]["prompts"] == ["a red circle and a blue square", "a green triangle", "a yellow circle"]
    base = json.loads((run.parent / "eval_base" / "summary.json").read_text())["summaries"][0]
    assert record["evaluation"][BASE_ROW]["toy:held_out"] == pytest.approx(base["binding_accuracy"])
    assert set(record["evaluation"]) == {BASE_ROW, LORA_ROW}
    assert f"| {LORA_ROW}" in card and f"| {BASE_ROW}" in card


def test_base_model_is_judged_a_hub_id_by_its_form(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "stabilityai" / "stable-diffusion-2-base").mkdir(parents=True)  # as `hf download --local-dir` makes
    config = PushConfig(output_dir="x", repo_id="me/x", base_model="stabilityai/stable-diffusion-2-base")
    assert config.base_model == "stabilityai/stable-diffusion-2-base"
    for local in ("/models/sd2", "./sd2", "~/sd2"):
        with pytest.raises(ValueError, match="a local folder means nothing on the Hub"):
            PushConfig(output_dir="x", repo_id="me/x", base_model=local)


def test_a_local_base_model_leaves_the_card_without_one_and_says_which_flag_links_it(trained_run, capsys):
    folder = push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors", dry_run=True))
    assert "base_model" not in front_matter((folder / CARD_FILE).read_text())
    assert "pass --base_model ORG/NAME" in capsys.readouterr().out


def test_an_evaluation_of_other_weights_is_refused(trained_run, tmp_path):
    run = Path(trained_run.output_dir)
    other = tmp_path / "run"
    shutil.copytree(run, other, ignore=shutil.ignore_patterns(UPLOAD_DIR))
    lora = other / LORA_WEIGHT_NAME
    lora.write_bytes(lora.read_bytes()[:-1] + b" ")  # the header's padding: still a LoRA, other bytes
    with pytest.raises(ValueError, match="of other weights than the pushed LoRA"):
        push(PushConfig(output_dir=str(other), repo_id="me/x", dry_run=True,
                        evaluation=[str(run.parent / "eval_lora")]))


def test_a_run_without_the_lora_asked_for_names_what_to_do(trained_run, tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no best LoRA.*--lora final"):
        push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/x", lora="best", dry_run=True))
    unfinished = tmp_path / "run"
    shutil.copytree(trained_run.output_dir, unfinished)
    (unfinished / LORA_WEIGHT_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=r"training has not finished: run the command that trains it again "
                                                r"\(`gors run`, the recipe or `gors train`\), which goes on from its "
                                                r"checkpoints$"):  # no best LoRA to offer instead
        push(PushConfig(output_dir=str(unfinished), repo_id="me/x", dry_run=True))
    shutil.rmtree(unfinished / "checkpoints")
    with pytest.raises(FileNotFoundError, match=r"it has not trained yet: run `gors run` \(or the stage that comes "
                                                r"next: `gors status` says which\) first$"):
        push(PushConfig(output_dir=str(unfinished), repo_id="me/x", dry_run=True))


def test_a_rounds_run_without_its_final_lora_says_its_training_has_not_finished_and_offers_the_best(tmp_path):
    # A --rounds run keeps its checkpoints in its rounds' folders: it has started training, not "not trained yet";
    # a best LoRA kept by validation is offered in its place.
    from gors.push import lora_file

    (tmp_path / "round-001" / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"its training has not finished: .*checkpoints$"):
        lora_file(tmp_path, "final")
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / LORA_WEIGHT_NAME).write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"training has not finished.*, or push the best LoRA so far "
                                                r"\(--lora best\)$"):
        lora_file(tmp_path, "final")
    assert lora_file(tmp_path, "best") == tmp_path / "best" / LORA_WEIGHT_NAME


@pytest.mark.parametrize("flags, message", [
    (["--repo_id", "not a repo"], "give a Hugging Face Hub model repository"),
    (["--repo_id", "me/x", "--base_model", "./sd"], "a local folder means nothing on the Hub"),
    (["--repo_id", "me/x", "--lora", "middle"], "invalid choice"),
])
def test_bad_flags_are_one_line(trained_run, flags, message, capsys):
    with pytest.raises(SystemExit):
        main(["push", "--output_dir", trained_run.output_dir, *flags])
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error


class HubServer(ThreadingHTTPServer):
    """The few endpoints of the Hugging Face Hub's API that an upload of small files calls: create a repository
    (409 where it exists, as the Hub answers) and a branch, read a repository's visibility and files and make it
    private, check a README's metadata, ask each file's upload mode (all "regular": inline in the commit) and
    commit; `whoami` names the token's role (`role`). Records the commits' files and every request, and keeps each
    repository's files (`repos`, one tree for all branches); `refuse` answers every POST with that status."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.requests: list[str] = []
        self.bodies: dict[str, dict] = {}
        self.commits: list[dict] = []
        self.refuse: int | None = None
        self.role = "write"
        self.repos: dict[str, dict] = {}  # "org/name" -> {"private": bool, "files": {path: bytes}}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(BaseHTTPRequestHandler):
    server: HubServer

    def do_GET(self) -> None:  # the name http.server dispatches GET requests to
        self.server.requests.append(f"GET {self.path}")
        path = self.path.split("?")[0]
        if path == "/api/whoami-v2":
            return self._json({"type": "user", "name": "me", "auth": {"accessToken": {"role": self.server.role}}})
        parts = path.split("/")  # "", "api", "models", org, name[, "tree", revision]
        repo = self.server.repos.get("/".join(parts[3:5])) if path.startswith("/api/models/") else None
        if repo is not None and len(parts) == 5:
            return self._json({"id": "/".join(parts[3:5]), "private": repo["private"], "sha": "a" * 40})
        if repo is not None and parts[5:6] == ["tree"]:
            return self._json([{"type": "file", "path": name, "oid": "b" * 40, "size": len(data)}
                               for name, data in sorted(repo["files"].items())])
        return self._json({"error": "unknown endpoint"}, 404)

    def do_PUT(self) -> None:  # the name http.server dispatches PUT requests to
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.server.requests.append(f"PUT {self.path}")
        parts = self.path.split("/")
        if self.path.endswith("/settings") and "/".join(parts[3:5]) in self.server.repos:
            self.server.repos["/".join(parts[3:5])]["private"] = body["visibility"] == "private"
            return self._json({})
        return self._json({"error": "unknown endpoint"}, 404)

    def do_POST(self) -> None:  # the name http.server dispatches POST requests to
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        path = self.path.split("?")[0]
        self.server.requests.append(f"POST {path}")
        if self.server.refuse is not None:
            return self._json({"error": "refused"}, self.server.refuse)
        if path == "/api/repos/create":
            request = self.server.bodies[path] = json.loads(body)
            name = f"{request['organization']}/{request['name']}"
            if name in self.server.repos:
                return self._json({"error": "You already created this model repo", "url": f"{self.server.url}/{name}"},
                                  409)
            self.server.repos[name] = {"private": request.get("visibility") == "private", "files": {}}
            return self._json({"url": f"{self.server.url}/{name}"})
        if path == "/api/validate-yaml":
            yaml.safe_load(json.loads(body)["content"].split("---\n")[1])
            return self._json({})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                         for f in files]})
        if "/branch/" in path:
            return self._json({})
        if "/commit/" in path:
            lines = [json.loads(line) for line in body.splitlines() if line]
            files = {line["value"]["path"]: base64.b64decode(line["value"]["content"])
                     for line in lines if line["key"] == "file"}
            deleted = [line["value"]["path"] for line in lines if line["key"] == "deletedFile"]
            self.server.commits.append({"path": path, "header": lines[0]["value"], "files": files, "deleted": deleted})
            tree = self.server.repos.setdefault("/".join(path.split("/")[3:5]), {"private": False, "files": {}})["files"]
            for name in deleted:
                tree.pop(name, None)
            tree.update(files)
            return self._json({"commitUrl": f"{self.server.url}/me/tiny-gors/commit/{'a' * 40}",
                               "commitOid": "a" * 40})
        return self._json({"error": "unknown endpoint"}, 404)

    def _json(self, data: dict, status: int = 200) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows the assertions, not an access log."""


@contextmanager
def hub_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A running `HubServer` that huggingface_hub's API calls go to, online (the suite is offline) with a token."""
    from huggingface_hub import constants

    with serving(HubServer()) as server:
        for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        yield server


def test_push_uploads_the_staged_files_as_one_commit_on_the_branch_asked(trained_run, monkeypatch, capsys):
    with hub_server(monkeypatch) as server:
        folder = push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors", revision="gors",
                                 base_model="stabilityai/stable-diffusion-2-base",
                                 evaluation=[str(Path(trained_run.output_dir).parent / "eval_lora")]))
    posts = [request for request in server.requests if request.startswith("POST")]
    assert posts[:2] == ["POST /api/repos/create", "POST /api/models/me/tiny-gors/branch/gors"]
    assert "visibility" not in server.bodies["/api/repos/create"]  # the namespace's default, unless --private
    (commit,) = server.commits
    assert commit["path"] == "/api/models/me/tiny-gors/commit/gors"
    assert commit["header"]["summary"] == f"gors push: the final LoRA of {Path(trained_run.output_dir).name}"
    assert commit["files"] == {path.relative_to(folder).as_posix(): path.read_bytes()
                               for path in folder.rglob("*") if path.is_file()}
    assert {CARD_FILE, RECORD_FILE, LORA_WEIGHT_NAME, "images/0.png", "images/1.png"} == set(commit["files"])
    assert f"is at {server.url}/me/tiny-gors/commit/" in capsys.readouterr().out
    assert 'pipeline.load_lora_weights("me/tiny-gors", revision="gors")' in commit["files"][CARD_FILE].decode()
    with hub_server(monkeypatch) as server:
        push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors", private=True,
                        commit_message="LoRA of run 1"))
    assert server.bodies["/api/repos/create"]["visibility"] == "private"
    assert [commit["header"]["summary"] for commit in server.commits] == ["LoRA of run 1"]  # --commit_message's


def test_a_second_push_removes_the_earlier_images_and_private_makes_an_existing_repository_private(
        trained_run, monkeypatch, capsys):
    evaluation = [str(Path(trained_run.output_dir).parent / "eval_lora")]
    with hub_server(monkeypatch) as server:
        push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors", evaluation=evaluation))
        assert {"images/0.png", "images/1.png"} <= set(server.repos["me/tiny-gors"]["files"])
        assert not server.repos["me/tiny-gors"]["private"]
        push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors", private=True))
    first, second = server.commits
    # The repository existed (409 to create_repo): it is made private before the second commit, which removes
    # the first push's images and keeps nothing else it did not write.
    assert server.repos["me/tiny-gors"]["private"]
    assert server.requests.index("PUT /api/models/me/tiny-gors/settings") < len(server.requests) - 1
    assert "it is private now (--private)" in capsys.readouterr().out
    assert sorted(second["deleted"]) == ["images/0.png", "images/1.png"] and not first["deleted"]
    assert set(server.repos["me/tiny-gors"]["files"]) == {CARD_FILE, RECORD_FILE, LORA_WEIGHT_NAME}


@pytest.mark.parametrize("status, hint", [(401, "the token was refused"), (403, "the token may not write to me")])
def test_a_refusal_of_the_hub_is_one_line_with_what_to_do_and_the_files_stay_staged(trained_run, monkeypatch,
                                                                                      status, hint):
    with hub_server(monkeypatch) as server:
        server.refuse = status
        with pytest.raises(ValueError, match=f"pushing to me/tiny-gors failed \\(.*\\): {hint}"):
            push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors"))
    assert (Path(trained_run.output_dir) / UPLOAD_DIR / LORA_WEIGHT_NAME).is_file()


def test_the_hint_after_a_refusal_tells_a_request_to_fix_from_a_busy_or_failing_hub():
    # A 4xx other than 429 is the request's fault (an unknown --license, a bad --revision); a 429 or a 5xx is the
    # Hub's, and the same command may pass later.
    from types import SimpleNamespace

    from gors.push import _push_hint

    def refused(status):
        err = RuntimeError(f"HTTP {status}")
        err.response = SimpleNamespace(status_code=status)  # as huggingface_hub's HfHubHTTPError carries it
        return _push_hint(err, "me/x")

    assert refused(404) == "the Hub refused the request (HTTP 404): check --repo_id, --revision and --license"
    assert refused(499).startswith("the Hub refused the request (HTTP 499)")
    assert refused(429) == refused(500) == refused(503) == "run the same command again"


def test_offline_or_without_a_token_nothing_is_sent(trained_run, monkeypatch):
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=1 is set: pushing needs the network"):
        push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors"))
    with hub_server(monkeypatch) as server:
        monkeypatch.delenv("HF_TOKEN")
        from huggingface_hub import constants

        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(Path(trained_run.output_dir).parent / "no-token"))
        with pytest.raises(ValueError, match="no Hugging Face token: log in with `hf auth login`"):
            push(PushConfig(output_dir=trained_run.output_dir, repo_id="me/tiny-gors"))
    assert [request for request in server.requests if "whoami" in request or request.startswith("POST")] == []


def test_the_help_imports_no_torch():
    import subprocess
    import sys

    code = "import sys; from gors.cli import main\ntry: main(['push', '--help'])\nexcept SystemExit: pass\n" \
           "assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_gors_run_push_to_hub_is_checked_before_any_work_and_pushes_the_finished_run(trained_run, monkeypatch,
                                                                                      tmp_path):
    from dataclasses import replace

    from gors.run import run

    fresh = replace(trained_run, output_dir=str(tmp_path / "fresh"), push_to_hub="me/tiny-gors")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=1 is set: pushing needs the network. Unset it to push; "
                                         "nothing has started"):
        run(fresh)
    assert not (tmp_path / "fresh").exists()
    with hub_server(monkeypatch) as server:
        server.role = "read"
        with pytest.raises(ValueError, match="the Hugging Face token may only read: .*; nothing has started"):
            run(replace(fresh, push_to_hub="me/tiny-gors"))
        assert not (tmp_path / "fresh").exists()
        server.role = "write"
        run(replace(trained_run, push_to_hub="me/tiny-gors"))  # every stage finished: only the push is left
        first_post = next(i for i, request in enumerate(server.requests) if request.startswith("POST"))
        assert "GET /api/whoami-v2" in server.requests[:first_post]  # the token checked before any work
        (commit,) = server.commits
        assert set(commit["files"]) == {CARD_FILE, RECORD_FILE, LORA_WEIGHT_NAME}
        server.refuse = 403
        with pytest.raises(ValueError, match=r"the run is finished, its push was not \(.*\)\. Push it with `gors push "
                                             r"--output_dir .* --repo_id me/tiny-gors`"):
            run(replace(trained_run, push_to_hub="me/tiny-gors"))


def test_push_to_hub_takes_a_repository_id(make_run_config):
    with pytest.raises(ValueError, match="--push_to_hub='me': give a Hugging Face Hub model repository"):
        make_run_config(push_to_hub="me")


def test_the_card_names_the_components_the_file_holds_and_leaves_out_a_selection_made_again(trained_run, tmp_path):
    """A LoRA without a U-Net part is stated so (the file's components, not the flags'), and a selection made
    again after the training is no longer the one it was trained on: the card leaves it out and says why."""
    from dataclasses import replace

    from gors.core.distributed import reset_process_state
    from gors.run import run
    from gors.select import select

    text_only = tmp_path / "text_only"
    shutil.copytree(trained_run.output_dir, text_only, ignore=shutil.ignore_patterns(
        "checkpoints", LORA_WEIGHT_NAME, "latent_cache", "text_embedding_cache", "logs", UPLOAD_DIR))
    run(replace(trained_run, output_dir=str(text_only), train_unet=False))
    reset_process_state()
    card = (push(PushConfig(output_dir=str(text_only), repo_id="me/x", dry_run=True)) / CARD_FILE).read_text()
    assert "| LoRA | rank 4 on text_encoder (q_proj, k_proj, v_proj, out_proj, learning rate 5e-06) |" in card

    reselected = tmp_path / "reselected"
    shutil.copytree(trained_run.output_dir, reselected, ignore=shutil.ignore_patterns(UPLOAD_DIR))
    select(replace(trained_run, output_dir=str(reselected), reward_threshold=0.25))
    card = (push(PushConfig(output_dir=str(reselected), repo_id="me/x", dry_run=True)) / CARD_FILE).read_text()
    assert "| selection |" not in card and "| reward |" not in card
    assert "is not the one this LoRA was trained on (selected again since)" in card


def test_an_evaluation_sampled_with_lora_dropout_gets_a_row_of_its_own(trained_run, tmp_path):
    run = Path(trained_run.output_dir)
    main(["evaluate", "--pretrained_model_name_or_path", trained_run.pretrained_model_name_or_path, "--lora", str(run),
          "--lora_dropout", "0.5", "--benchmarks", "toy", "--max_prompts", "2", "--images_per_prompt", "1",
          "--num_inference_steps", "2", "--resolution", "32", "--output_dir", str(tmp_path / "eval_dropout")])
    folder = push(PushConfig(output_dir=str(run), repo_id="me/x", dry_run=True,
                             evaluation=[str(run.parent / "eval_lora"), str(tmp_path / "eval_dropout")]))
    record = json.loads((folder / RECORD_FILE).read_text())
    assert set(record["evaluation"]) == {LORA_ROW, f"{LORA_ROW}, sampled with --lora_dropout 0.5"}
    # `gors report` notes it too: summary.json records the dropout once, beside its summaries.
    from gors.report import report

    text = report([run.parent / "eval_lora", tmp_path / "eval_dropout"], tmp_path / "report").read_text()
    assert "(LoRA dropout: eval_lora 0.0, eval_dropout 0.5)" in text
    # The card's images are the LoRA's own, without dropout: the first image of each prompt.
    from gors.model_card import lora_samples, run_facts

    main(["evaluate", "--pretrained_model_name_or_path", trained_run.pretrained_model_name_or_path, "--lora", str(run),
          "--benchmarks", "toy", "--max_prompts", "2", "--images_per_prompt", "2", "--num_inference_steps", "2",
          "--resolution", "32", "--output_dir", str(tmp_path / "eval_two")])
    facts = run_facts(run, "final", run / LORA_WEIGHT_NAME)
    from gors.core.store import SampleStore

    two = SampleStore(tmp_path / "eval_two" / "toy" / "held_out" / "samples")
    records = {two.image_path(r): r for r in two.records()}
    samples = lora_samples([str(tmp_path / "eval_dropout"), str(tmp_path / "eval_two")], facts)
    assert len(records) == 4 and [(records[path]["prompt_index"], records[path]["image_index"], records[path]["prompt"])
                                  for _, path in samples] == [(0, 0, samples[0][0]), (1, 0, samples[1][0])]
    assert lora_samples([str(tmp_path / "eval_dropout")], facts) == []
    # So does the benchmark's own folder, read alone: its samples were drawn with the dropout too.
    alone = tmp_path / "eval_dropout" / "toy" / "held_out"
    folder = push(PushConfig(output_dir=str(run), repo_id="me/x", dry_run=True, evaluation=[str(alone)]))
    assert set(json.loads((folder / RECORD_FILE).read_text())["evaluation"]) == \
        {f"{LORA_ROW}, sampled with --lora_dropout 0.5"}


def test_one_benchmarks_own_folder_serves_as_an_evaluation_as_the_toy_demos_do(trained_run, tmp_path):
    """The toy demo evaluates into one benchmark's folder (its own summary.json): push and report take it, with
    the label and main metric its benchmark gives."""
    from evaluators import get_benchmark
    from gors.report import report

    run = Path(trained_run.output_dir)
    benchmark = get_benchmark("toy", max_prompts=2, images_per_prompt=1, num_inference_steps=2, resolution=32)
    summary = benchmark.evaluate(trained_run.pretrained_model_name_or_path, tmp_path / "eval_gors", lora=str(run))
    folder = push(PushConfig(output_dir=str(run), repo_id="me/x", dry_run=True, evaluation=[str(tmp_path / "eval_gors")]))
    record = json.loads((folder / RECORD_FILE).read_text())
    assert record["evaluation"] == {LORA_ROW: {"toy:held_out": pytest.approx(summary["binding_accuracy"])}}
    assert (folder / "images" / "0.png").is_file()
    text = report([tmp_path / "eval_gors"], tmp_path / "report").read_text()
    assert "toy:held_out" in text and f"{summary['binding_accuracy']:.4f}" in text


def test_the_card_says_a_quick_run_does_not_compare_with_the_papers_rows(trained_run, tmp_path):
    from gors.model_card import evaluation_rows, run_facts

    run = Path(trained_run.output_dir)
    facts = run_facts(run, "final", run / LORA_WEIGHT_NAME)
    folder = tmp_path / "eval_quick"
    folder.mkdir()
    summary = {"label": "t2i_compbench:color", "primary_metric": "score", "score": 0.61, "benchmark": "t2i_compbench",
               "model": facts.generation["model"], "lora": None,
               "results": {"config": {"max_prompts": 10, "images_per_prompt": 2}, "samples": {"prompts": 10}}}
    (folder / "summary.json").write_text(json.dumps({"lora": None, "summaries": [summary]}))
    rows, notes = evaluation_rows([str(folder)], facts)
    assert list(rows) == ["base model"] and list(rows["base model"].values()) == [0.61]
    assert any("base model's t2i_compbench:color is a quick run (10 prompts x 2 images; the protocol's: 300 x 10)"
               in note for note in notes), notes


def test_an_evaluation_of_an_image_folder_or_of_another_commit_of_the_model_is_refused(trained_run, tmp_path):
    from gors.model_card import _same_model, evaluation_rows, run_facts

    run = Path(trained_run.output_dir)
    facts = run_facts(run, "final", run / LORA_WEIGHT_NAME)
    folder = tmp_path / "eval_images"
    folder.mkdir()
    summary = {"label": "toy:held_out", "primary_metric": "binding_accuracy", "binding_accuracy": 0.9,
               "benchmark": "toy", "model": None, "lora": None, "images": "/somewhere/images"}
    (folder / "summary.json").write_text(json.dumps({"lora": None, "summaries": [summary]}))
    with pytest.raises(ValueError, match=r"toy:held_out scored an image folder \(/somewhere/images\), whose images "
                                         r"may be any model's"):
        evaluation_rows([str(folder)], facts)
    # One name, two recorded versions: another commit's numbers are not this model's; a version recorded on one
    # side only leaves the name to decide.
    assert not _same_model("org/sd", "abc", "org/sd", "def")
    assert _same_model("org/sd", "abc", "org/sd", None) and _same_model("org/sd", None, "org/sd", "def")
    assert _same_model("org/sd", "abc", "./org/sd/", "abc") and not _same_model("org/sd", None, "org/other", None)


def test_the_family_tags_are_left_out_where_the_base_models_index_cannot_be_read(tmp_path):
    from gors.model_card import family_tags

    assert family_tags(None, None) == [] and family_tags(str(tmp_path / "gone"), None) == []
    assert family_tags(str(tmp_path), None) == []  # a folder without model_index.json: OSError
    (tmp_path / "model_index.json").write_text("{}")
    assert family_tags(str(tmp_path), None) == []  # no pipeline class: ValueError


def test_a_killed_pushs_staging_folder_is_removed_by_the_next_push(trained_run):
    import os
    import time

    run = Path(trained_run.output_dir)
    killed = run / ".hub_upload.killed.tmp"
    killed.mkdir()
    two_hours_ago = time.time() - 7200
    os.utime(killed, (two_hours_ago, two_hours_ago))
    push(PushConfig(output_dir=str(run), repo_id="me/tiny-gors", dry_run=True))
    assert not killed.exists() and not list(run.glob(".hub_upload.*"))


def run_facts_of(**changes):
    """RunFacts of a final LoRA of SD 2 base with the given fields changed; the rest recorded as nothing."""
    from gors.model_card import RunFacts

    fields = dict(lora="final", lora_sha256="0" * 64, components=["unet"], step=None, gors_version=None,
                  generation={"model": "stabilityai/stable-diffusion-2-base"}, model_commit=None, prompts=None,
                  selection=None, reward=None, training=None, best=None, rounds=None, trained_in="", notes=[])
    return RunFacts(**{**fields, **changes})


def test_the_cards_selection_row_gives_the_share_kept_and_both_means():
    from gors.model_card import card_rows

    facts = run_facts_of(selection={"threshold": 0.5, "num_selected": 250, "num_samples": 1000,
                                    "selected": {"mean": 0.8}, "all": {"mean": 0.5}})
    assert dict(card_rows(facts, None))["selection"] == (
        "0.5: kept 250 of 1000 (25 %) samples, mean reward 0.800 kept, 0.500 all")


def test_the_cards_rows_state_the_training_the_base_models_commit_and_the_samples_per_prompt():
    from gors.model_card import card_rows

    training = {"train_batch_size": 2, "gradient_accumulation_steps": 3, "num_processes": 4, "mixed_precision": "no",
                "learning_rate": 1e-4, "lr_scheduler": "constant", "rank": 8, "unet_target_modules": ["to_q"],
                "text_encoder_target_modules": ["q_proj"], "text_encoder_learning_rate": 5e-6,
                "anchor_below": 0.2, "timestep_range": [100, 900]}
    facts = run_facts_of(components=["unet", "text_encoder_2"], training=training, model_commit="abc123",
                         prompts={"prompts": ["a", "b", "c"], "category": "color"},
                         selection={"threshold": 0.5, "num_selected": 3, "num_samples": 7,
                                    "selected": {"mean": 0.8}, "all": {"mean": 0.5}})
    rows = dict(card_rows(facts, None))
    assert rows["base model"] == "stabilityai/stable-diffusion-2-base at abc123"
    assert rows["training"] == "24 samples per update, learning rate 0.0001 (constant), fp32, 4 processes"
    assert rows["LoRA"] == "rank 8 on unet (to_q); text_encoder_2 (q_proj, learning rate 5e-06)"
    assert rows["training options"] == "--anchor_below 0.2, --timestep_range 100 900"
    assert rows["samples"].startswith("None steps")  # 7 samples of 3 prompts: no count per prompt
    # The base model pushed beside the one the run read, a local folder by its name only; a local folder's
    # fingerprint is no Hub commit: the card gives none.
    assert dict(card_rows(run_facts_of(generation={"model": "/models/sd2"}), "org/sd2"))["base model"] == \
        "org/sd2 (the run read a local folder (sd2))"
    assert dict(card_rows(run_facts_of(model_commit="sha256:00"), None))["base model"] == \
        "stabilityai/stable-diffusion-2-base"
    best = run_facts_of(step=7, best={"step": 5, "benchmark": "toy:held_out", "metric": "binding_accuracy",
                                      "value": 0.5})
    assert dict(card_rows(best, None))["this LoRA"] == \
        "the best of validation: step 5, toy:held_out binding_accuracy 0.5000"


def test_the_card_at_a_revision_loads_that_revision_and_its_metadata_links_the_base_model():
    from gors.model_card import model_card

    card = model_card("me/x", run_facts_of(), {}, [], "stabilityai/stable-diffusion-2-base", ["stable-diffusion"],
                      license="mit", revision="v1")
    metadata = front_matter(card)
    assert metadata["base_model"] == "stabilityai/stable-diffusion-2-base"
    assert metadata["base_model_relation"] == "adapter" and metadata["license"] == "mit"
    assert "stable-diffusion" in metadata["tags"]
    assert 'pipeline.load_lora_weights("me/x", revision="v1")' in card
    assert "--lora hub:me/x" not in card  # `hub:` reads the main branch, not the revision pushed
    assert "base_model_relation" not in front_matter(model_card("me/x", run_facts_of(), {}, [], None, []))
