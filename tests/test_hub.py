"""`--model org/name` through huggingface_hub, without a network: a Hub cache on disk
(offline), and the Hub's answers stubbed where the online path is under test."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import huggingface_hub
import pytest
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

from runtime import hub
from runtime.config.server import ServerConfig
from runtime.hub import NoSafetensors, NotCached, RepoGated, RepoNotFound, files_to_fetch
from runtime.model_config import resolve_model, spec_for
from runtime.model_errors import ModelNotFound, TokenizerError
from tests.hub_cache import tiny_llama_with_tokenizer, use_hub_cache, write_snapshot

REPO = "tiny-org/tiny-llama"
COMMIT, DEV_COMMIT = "a" * 40, "b" * 40
LISTING = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
           "README.md", ".gitattributes", "model.safetensors", "pytorch_model.bin",
           "original/consolidated.00.pth", "original/params.json", "onnx/model.onnx"]


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> dict[str, Path]:
    return tiny_llama_with_tokenizer(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture
def cache(tmp_path, monkeypatch, model_files) -> Path:
    """An offline Hub cache holding REPO at main (COMMIT) and at dev (DEV_COMMIT)."""
    cache = tmp_path / "hub"
    use_hub_cache(monkeypatch, cache)
    write_snapshot(cache, REPO, COMMIT, model_files)
    write_snapshot(cache, REPO, DEV_COMMIT, model_files, refs=("dev",))
    return cache


def snapshot(cache: Path, repo: str, commit: str) -> str:
    return str(cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit)


# ------------------------------------------------------------------ which files are fetched
def test_fetches_config_tokenizer_and_safetensors_never_bin_pth_or_subfolders():
    assert files_to_fetch(REPO, LISTING, None) == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "model.safetensors"]


def test_an_index_names_the_shards_to_fetch_not_other_safetensors_files():
    listing = ["config.json", "tokenizer.json", "consolidated.safetensors",
               "model.safetensors.index.json", "model-00001-of-00002.safetensors",
               "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors",
                            "b": "model-00002-of-00002.safetensors",
                            "c": "model-00001-of-00002.safetensors"}}
    assert files_to_fetch(REPO, listing, index) == [
        "config.json", "tokenizer.json", "model.safetensors.index.json",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_a_tokenizer_fetch_takes_no_weights_and_a_bin_only_repo_is_refused():
    assert files_to_fetch(REPO, LISTING, None, weights=False) == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    with pytest.raises(NoSafetensors, match=r"tiny-llama has no \.safetensors weights "
                                            r"\(it has original/consolidated.00.pth"):
        files_to_fetch(REPO, [f for f in LISTING if f != "model.safetensors"], None)


# ------------------------------------------------------------------ offline, from the cache
def test_offline_a_hub_id_resolves_to_its_cached_snapshot(cache):
    spec = resolve_model(REPO)
    assert spec.name == REPO and spec.path == snapshot(cache, REPO, COMMIT)
    assert spec.tokenizer_path == spec.path and spec.eos_token_ids == (2,)
    assert spec.hf_config().vocab_size == 49152


def test_revision_picks_another_snapshot_by_branch_or_commit(cache):
    for revision in ("dev", DEV_COMMIT):
        assert resolve_model(REPO, revision).path == snapshot(cache, REPO, DEV_COMMIT)


def test_offline_an_uncached_id_or_revision_is_a_clear_error(cache):
    with pytest.raises(NotCached, match=r"^tiny-org/other \(revision main\) is not in the "
                                        r"Hugging Face cache .*hub, and HF_HUB_OFFLINE is set$"):
        resolve_model("tiny-org/other")
    with pytest.raises(NotCached, match=r"revision v2\)"):
        resolve_model(REPO, "v2")
    assert issubclass(NotCached, ModelNotFound)


def test_a_cached_snapshot_without_safetensors_or_missing_a_shard_is_refused(cache, tmp_path,
                                                                             model_files):
    bin_only = {k: v for k, v in model_files.items() if not k.endswith(".safetensors")}
    write_snapshot(cache, "tiny-org/bin-only", COMMIT, bin_only)
    with pytest.raises(NoSafetensors, match="tiny-org/bin-only has no .safetensors weights"):
        resolve_model("tiny-org/bin-only")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00002.safetensors",
                                                "v": "model-00002-of-00002.safetensors"}}))
    write_snapshot(cache, "tiny-org/sharded", COMMIT, {
        **bin_only, index.name: index,
        "model-00001-of-00002.safetensors": model_files["model.safetensors"]})
    with pytest.raises(NotCached, match="lacks model-00002-of-00002.safetensors"):
        resolve_model("tiny-org/sharded")


def test_tokenizer_from_a_hub_id_or_folder_serves_a_dummy_preset(cache, model_files):
    write_snapshot(cache, "tiny-org/tokenizer", COMMIT,
                   {k: model_files[k] for k in ("config.json", "tokenizer.json",
                                                "tokenizer_config.json")})
    spec = resolve_model("dummy:tiny", tokenizer="tiny-org/tokenizer")
    assert spec.tokenizer_path == snapshot(cache, "tiny-org/tokenizer", COMMIT)
    # dummy:tiny embeds 1024 ids; the SmolLM2 tokenizer has 49152: refused at start-up
    with pytest.raises(TokenizerError, match=r"has 49152 ids, the model \(dummy:tiny\) "
                                             r"embeds only 1024"):
        spec.load_tokenizer()
    with pytest.raises(TokenizerError, match="no tokenizer in this folder"):
        resolve_model("dummy:tiny", tokenizer=str(cache))


def test_revision_of_a_model_that_is_not_a_hub_id_is_refused(model_files):
    folder = str(model_files["config.json"].parent)
    with pytest.raises(ModelNotFound, match="--revision dev applies to Hugging Face Hub ids"):
        resolve_model(folder, "dev")


# ------------------------------------------------------------------ online, the Hub stubbed
def hub_error(cls: type, message: str) -> Exception:
    return cls(message, response=SimpleNamespace(headers={}, request=None))


class FakeHub:
    """Stands in for huggingface_hub's network calls: a repo listing (or `error`), and a
    record of the files each download asked for (answered with `folder`)."""

    def __init__(self, listing: list[str], folder: str, error: Exception | None = None):
        self.listing, self.folder, self.error = listing, folder, error
        self.fetched: list[list[str]] = []
        self.listed = 0

    def list_repo_files(self, repo_id, revision=None):
        self.listed += 1
        if self.error is not None:
            raise self.error
        return self.listing

    def snapshot_download(self, repo_id, *, revision, allow_patterns, local_files_only=False):
        if local_files_only:  # the cache is real
            return huggingface_hub.snapshot_download(repo_id, revision=revision,
                                                     allow_patterns=allow_patterns,
                                                     local_files_only=True)
        self.fetched.append(list(allow_patterns))
        return self.folder


@pytest.fixture
def online(cache, monkeypatch):
    use_hub_cache(monkeypatch, cache, offline=False)

    def install(fake: FakeHub) -> FakeHub:
        monkeypatch.setattr(hub, "HfApi", lambda: fake)
        monkeypatch.setattr(hub, "snapshot_download", fake.snapshot_download)
        return fake
    return install


def test_online_only_the_chosen_files_are_requested(cache, online):
    fake = online(FakeHub(LISTING, snapshot(cache, REPO, COMMIT)))
    assert resolve_model(REPO).path == snapshot(cache, REPO, COMMIT)
    assert fake.fetched == [files_to_fetch(REPO, LISTING, None)]


def test_server_processes_resolve_from_the_cache_without_asking_the_hub(cache, online,
                                                                     tmp_path):
    fake = online(FakeHub(LISTING, ""))
    cfg = ServerConfig(model=REPO, revision="dev", ipc_dir=str(tmp_path))
    assert spec_for(cfg).path == snapshot(cache, REPO, DEV_COMMIT)  # as its processes do
    assert (fake.listed, fake.fetched) == (0, [])


@pytest.mark.parametrize("error, kind, message", [
    (hub_error(GatedRepoError, "403"), RepoGated,
     r"^tiny-org/tiny-llama is a gated model: request access on "
     r"https://huggingface.co/tiny-org/tiny-llama, then set HF_TOKEN"),
    (hub_error(RepositoryNotFoundError, "404"), RepoNotFound,
     r"^no model tiny-org/tiny-llama on the Hugging Face Hub"),
], ids=["gated", "unknown"])
def test_online_hub_refusals_are_one_line_errors(cache, online, monkeypatch, error, kind,
                                                message):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hub, "get_token", lambda: None)
    online(FakeHub(LISTING, snapshot(cache, REPO, COMMIT), error))
    with pytest.raises(kind, match=message) as info:
        resolve_model(REPO)
    assert "\n" not in str(info.value)


def test_an_unreachable_hub_falls_back_to_the_cache(cache, online):
    online(FakeHub(LISTING, "", ConnectionError("connection refused")))
    assert resolve_model(REPO).path == snapshot(cache, REPO, COMMIT)
    with pytest.raises(NotCached, match=r"the Hub could not be reached \(ConnectionError: "
                                        r"connection refused\)"):
        resolve_model("tiny-org/other")
