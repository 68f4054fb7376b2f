"""Texts to token ids, as the scorer asks a model: without special tokens (the engine prepends the document
start), a context and its continuation split at their character boundary, an instruct model's prompts through
its chat template."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dcsjax.errors import ConfigError, InputError


@dataclass(frozen=True)
class Encoder:
    tokenizer: object  # a transformers tokenizer
    name: str = "model"
    variant: str | None = None  # "base" or "instruct": the card's, or what the caller said; None: not known

    @property
    def is_instruct(self) -> bool | None:
        return None if self.variant is None else self.variant == "instruct"

    def asks_through_chat_template(self, purpose: str) -> bool:
        """Whether a prompt for `purpose` goes through the chat template: an instruct model's does. An
        instruct model without a template is refused, naming how to give one, instead of being asked another
        way without a word (its letters and answers would change)."""
        if not self.is_instruct:
            return False
        if not self.tokenizer.chat_template:
            raise ConfigError(
                f"{self.name} is an instruct model without a chat template, which {purpose} asks it through: give "
                "its tokenizer one (chat_template in tokenizer_config.json, or chat_template.jinja in the model's "
                "folder), or load it as a base model (--variant base)")
        return True

    def chat_text(self, user: str, system: str | None = None) -> str:
        """A [system and] user turn through the tokenizer's chat template, the assistant's turn opened."""
        messages = ([{"role": "system", "content": system}] if system is not None else []) + \
            [{"role": "user", "content": user}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids without special tokens; an empty text is an error naming it."""
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise InputError(f"text {i} is a {type(text).__name__}, not a string")
            if not text:
                raise InputError(f"text {i} is empty: there is nothing to score")
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def split_encode(self, context: str, continuation: str, index: int = 0) -> tuple[list[int], list[int]]:
        """Context and continuation ids, tokenised together and split at the character boundary.

        Where a token would straddle the boundary (no such merge in the usual " answer" case), the two
        sides are tokenised apart instead, so no token ever merges across it.
        """
        if not continuation:
            raise InputError(f"continuation {index} is empty: there is nothing to score")
        enc = self.tokenizer(context + continuation, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        b = len(context)
        n_ctx = sum(1 for start, end in offsets if end <= b)
        aligned = all(end <= b for _, end in offsets[:n_ctx]) and all(start >= b for start, _ in offsets[n_ctx:])
        if aligned and n_ctx < len(ids):
            return ids[:n_ctx], ids[n_ctx:]
        ctx = list(self.tokenizer(context, add_special_tokens=False)["input_ids"]) if context else []
        return ctx, list(self.tokenizer(continuation, add_special_tokens=False)["input_ids"])
