"""Hugging Face hub ids: `org/name` or `org/name@revision`, resolved to a local snapshot by huggingface_hub.

Only what scoring needs is fetched (config, tokenizer, safetensors and their index), into huggingface_hub's
own cache (`HF_HOME`, `HF_HUB_CACHE`); with `HF_HUB_OFFLINE=1`, or without a network, the cache alone is
used, and a model that is not there is a clear error saying how to fetch it.
"""

from __future__ import annotations

import re
from pathlib import Path

from dcsjax.errors import FetchError

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
FILES = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "chat_template.jinja",
         "chat_template.json", "vocab.json", "merges.txt"]


def is_hub_id(text: str) -> bool:
    """`org/name[@revision]` that is not a local path (nor a .gguf file's)."""
    return bool(HUB_ID.match(text)) and not text.endswith(".gguf") and not Path(text.split("@")[0]).exists()


def hub_snapshot(hub_id: str) -> tuple[Path, dict]:
    """(the snapshot folder, {"hub": repo, "revision": commit}) of `org/name[@revision]`."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    from dcsjax.cache import hub_offline

    hub_offline()  # out of reach: the cache alone, at once
    repo, _, revision = hub_id.partition("@")
    try:
        path = Path(snapshot_download(repo, revision=revision or None, allow_patterns=FILES))
    except LocalEntryNotFoundError as err:
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
        pin = f" --revision {revision}" if revision else ""
        raise FetchError(
            f"{hub_id}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the hub cannot be reached"
            f"{offline}. Fetch it once where the hub is reachable, into the same cache: `hf download {repo}{pin} "
            "--include 'config.json' '*.safetensors*' 'tokenizer*' 'special_tokens_map.json'`") from err
    except HfHubHTTPError as err:  # no such repository or revision, gated, ...
        raise FetchError(f"{hub_id}: {err}") from err
    if not (path / "config.json").is_file():
        raise FetchError(f"{hub_id}: the snapshot {path} holds no config.json: not a transformers model")
    return path, {"hub": repo, "revision": path.name}  # a snapshot's folder is named by its commit


def hub_config(hub_id: str) -> Path:
    """The `config.json` alone of `org/name[@revision]` (what `dcsjax plan` needs: no weights)."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError

    from dcsjax.cache import hub_offline

    hub_offline()
    repo, _, revision = hub_id.partition("@")
    try:
        return Path(hf_hub_download(repo, "config.json", revision=revision or None))
    except LocalEntryNotFoundError as err:
        offline = " (HF_HUB_OFFLINE is set)" if constants.HF_HUB_OFFLINE else ""
        raise FetchError(f"{hub_id}: its config.json is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and "
                         f"the hub cannot be reached{offline}; `hf download {repo} config.json` where it can") from err
    except (EntryNotFoundError, HfHubHTTPError) as err:
        raise FetchError(f"{hub_id}: {err}") from err
