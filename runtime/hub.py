"""Hugging Face Hub ids (`org/name`) as local folders, through `huggingface_hub`'s cache.

Only what serving reads is fetched: the config and generation config, the tokenizer's files
and the safetensors weights (the shards the index names, when there is one). `.bin` and
`.pth` weights are never fetched. The cache is huggingface_hub's own: `HF_HOME` /
`HF_HUB_CACHE` place it, `HF_HUB_OFFLINE=1` forbids the network, `HF_TOKEN` opens gated
and private repos. The first download shows huggingface_hub's progress bars.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from huggingface_hub import (
    HfApi,
    constants,
    get_token,
    hf_hub_download,
    snapshot_download,
)
from huggingface_hub.errors import (
    GatedRepoError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from runtime.model_errors import ModelNotFound

log = logging.getLogger(__name__)

INDEX = "model.safetensors.index.json"
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "vocab.txt", "chat_template.jinja", "chat_template.json")


class HubModelError(ModelNotFound):
    """A Hub id that cannot be served (the subclasses say why)."""


class RepoNotFound(HubModelError):
    """No such repo or revision on the Hub (or a private repo without access)."""


class RepoGated(HubModelError):
    """A gated repo, and no token with access to it."""


class NotCached(HubModelError):
    """The Hub may not (`HF_HUB_OFFLINE=1`) or cannot be reached, and the cache lacks the
    model (or part of it)."""


class NoSafetensors(HubModelError):
    """The repo has no safetensors weights (only `.bin` / `.pth`, which are not loaded)."""


def files_to_fetch(repo_id: str, files: Iterable[str], index: dict | None,
                   weights: bool = True) -> list[str]:
    """The files of a repo listing that serving reads: config and generation config, the
    tokenizer's files and, with `weights`, the safetensors weights: the shards `index`
    (the parsed `model.safetensors.index.json`) names, else every top-level `.safetensors`
    file. Files in subfolders are never fetched. Raise `NoSafetensors` when weights are
    wanted and there are none."""
    top = [f for f in files if "/" not in f]
    fetch = [f for f in top if f in CONFIG_FILES or f in TOKENIZER_FILES]
    if not weights:
        return fetch
    if index is not None:
        shards = sorted(set(index.get("weight_map", {}).values()))
        return fetch + [INDEX, *shards]
    safetensors = [f for f in top if f.endswith(".safetensors")]
    if not safetensors:
        others = sorted(f for f in files if f.endswith((".bin", ".pth", ".pt", ".gguf")))
        found = f" (it has {', '.join(others[:3])}{', ...' if len(others) > 3 else ''})" \
            if others else ""
        raise NoSafetensors(f"{repo_id} has no .safetensors weights{found}; only "
                            "safetensors checkpoints are loaded")
    return fetch + safetensors


def hub_snapshot(repo_id: str, revision: str = "main", *, weights: bool = True,
                 offline: bool = False) -> Path:
    """The local folder of `repo_id` at `revision` (a branch, tag or commit) in the Hub
    cache, with the files `files_to_fetch` chooses, downloaded when missing unless
    `offline` or `HF_HUB_OFFLINE` is set. Raise a `HubModelError` saying what is wrong."""
    reason = "HF_HUB_OFFLINE is set"
    if not (offline or constants.HF_HUB_OFFLINE):
        try:
            files = HfApi().list_repo_files(repo_id, revision=revision)
            return _download(repo_id, revision, files, weights)
        except (RepositoryNotFoundError, RevisionNotFoundError, HFValidationError) as exc:
            raise _repo_error(repo_id, revision, exc) from None  # gated repos included
        except HubModelError:
            raise
        # a connection failure raises the HTTP library's own error: the cache may still
        # hold the model, as snapshot_download itself assumes
        except Exception as exc:
            first = (str(exc).splitlines() or [""])[0]
            reason = f"the Hub could not be reached ({type(exc).__name__}: {first})"
            log.warning("%s: %s; looking in the cache", repo_id, reason)
    return _cached(repo_id, revision, weights, reason)


def _download(repo_id: str, revision: str, files: list[str], weights: bool) -> Path:
    index = None
    if weights and INDEX in files:
        index = json.loads(Path(hf_hub_download(repo_id, INDEX, revision=revision)).read_text())
    fetch = files_to_fetch(repo_id, files, index, weights)
    folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=fetch))
    return _complete(repo_id, folder, fetch)


def _cached(repo_id: str, revision: str, weights: bool, reason: str) -> Path:
    """The cached snapshot, its files chosen from what the cache holds."""
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, local_files_only=True,
                                        allow_patterns=[CONFIG_FILES[0]]))
    except (LocalEntryNotFoundError, HFValidationError):
        raise NotCached(f"{repo_id} (revision {revision}) is not in the Hugging Face cache "
                        f"{constants.HF_HUB_CACHE}, and {reason}") from None
    files = [p.name for p in folder.iterdir()]
    index = json.loads((folder / INDEX).read_text()) if weights and INDEX in files else None
    return _complete(repo_id, folder, files_to_fetch(repo_id, files, index, weights))


def _complete(repo_id: str, folder: Path, fetch: list[str]) -> Path:
    missing = [f for f in fetch if not (folder / f).exists()]
    if missing:
        raise NotCached(f"{repo_id}: the cached snapshot {folder} lacks {', '.join(missing[:3])}"
                        f"{', ...' if len(missing) > 3 else ''}; download it again online")
    return folder


def _repo_error(repo_id: str, revision: str, exc: Exception) -> HubModelError:
    if isinstance(exc, GatedRepoError):
        how = ("the token in use has no access to it" if get_token() is not None
               else "set HF_TOKEN (or run `hf auth login`)")
        return RepoGated(f"{repo_id} is a gated model: request access on "
                         f"https://huggingface.co/{repo_id}, then {how}")
    if isinstance(exc, RevisionNotFoundError):
        return RepoNotFound(f"{repo_id} has no revision {revision!r} on the Hub")
    if isinstance(exc, HFValidationError):
        return RepoNotFound(f"{repo_id!r} is not a valid Hugging Face Hub id")
    return RepoNotFound(f"no model {repo_id} on the Hugging Face Hub (a private one needs "
                        "HF_TOKEN), nor a local folder of that name")
