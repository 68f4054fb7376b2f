"""dcsjax as a model backend of lm-evaluation-harness: lm-eval keeps its tasks, prompts and metrics, dcsjax
does the forward passes (packed, bucketed, jitted, sharded; never [B, T, V] logits).

    lm_eval.simple_evaluate(model=DcsjaxLM(pretrained="smollm2-135m-instruct"), tasks=[...])
    dcsjax lm-eval --model dcsjax --model_args pretrained=smollm2-135m-instruct --tasks arc_easy

The installed lm-eval (0.4.x) finds models in a registry that outside packages cannot extend from their
metadata (no entry point, no plugin hook), so `dcsjax lm-eval` registers this class and hands its arguments
to lm-eval's own command line; in Python, importing this module registers it.

Tokenisation follows lm-eval's hf backend on purpose, so that the two give the same numbers on the same
checkpoint: requests are encoded by lm-eval's `TemplateLM` (the context alone and context + continuation,
split by token count), the tokenizer adds BOS where it does by default (`add_bos_token` overrides), and an
empty context is conditioned on `prefix_token_id` (BOS, else EOS). dcsjax's own protocols condition on the
model's document-start token instead; that is not lm-eval's convention, so it is not used here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm.auto import tqdm

from dcsjax.errors import ConfigError

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's hf backend's default


@register_model("dcsjax")
class DcsjaxLM(TemplateLM):
    """lm-eval's `LM` over a dcsjax `Scorer`.

    pretrained: what `dcsjax.load` takes (a model card name, a GGUF file, an HF directory or a hub id), or a
    `Scorer` already loaded. dtype, mesh ("2x4"), document_start, variant: passed to `dcsjax.load`.
    rows_per_batch: rows per batch of the scorer (default 16; a batch's token budget bounds memory too).
    lm-eval's own --batch_size is accepted and ignored: its default, 1, would mean one row per batch, and
    dcsjax packs several requests into each row anyway. max_length: the longest sequence scored, truncation and rolling windows
    included (default: the model's context less one token: a row also holds the last scored token).
    add_bos_token, prefix_token_id: as in lm-eval's hf backend. device, max_batch_size: accepted from
    lm-eval's command line and ignored (JAX places the work; batches are sized by tokens).
    """

    def __init__(self, pretrained: Any = "smollm2-135m-instruct", *, dtype: str = "float32", mesh: str | None = None,
                 rows_per_batch: int | None = None, batch_size: int | str | None = None,
                 max_length: int | None = None, max_gen_toks: int | None = None,
                 add_bos_token: bool | None = None, prefix_token_id: int | None = None,
                 document_start: str | None = None, variant: str | None = None, progress: bool = True,
                 chat_template_args: dict | None = None, device: str | None = None,
                 max_batch_size: int | None = None, **unknown) -> None:
        super().__init__()
        if unknown:
            raise ConfigError(f"dcsjax's lm-eval backend has no model_args {sorted(unknown)}; it takes pretrained, "
                              "dtype, mesh, rows_per_batch, max_length, max_gen_toks, add_bos_token, prefix_token_id, "
                              "document_start, variant")
        from dcsjax.engine.scorer import Scorer

        options = {} if rows_per_batch is None else {"batch_size": int(rows_per_batch)}
        # lm-eval's own progress bars stand for the requests, so the scorer shows none; a Scorer passed in is
        # copied (same model and parameters), not changed under its owner
        if isinstance(pretrained, Scorer):
            self.scorer = dataclasses.replace(pretrained, progress=False, **options)
        else:
            import dcsjax

            self.scorer = dcsjax.load(str(pretrained), dtype=dtype, mesh=mesh, document_start=document_start,
                                      variant=variant, **options).replace(progress=False)
        self.tokenizer = self.scorer.tokenizer
        self.pretrained = self.scorer.name
        limit = self.scorer.max_length - 1
        if max_length is not None and not 1 < int(max_length) <= limit:
            raise ConfigError(f"max_length must be between 2 and {limit} for {self.scorer.name}, not {max_length}")
        self._max_length = int(max_length) if max_length is not None else limit
        self._max_gen_toks = int(max_gen_toks or DEFAULT_MAX_GEN_TOKS)
        self.add_bos_token = add_bos_token
        self.custom_prefix_token_id = prefix_token_id
        self.chat_template_args = chat_template_args or {}
        self.show_progress = progress

    # ------------------------------------------------------------------------------------ lm-eval's surface
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return self.scorer.name.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs) -> list[int]:
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token
        kwargs = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if add_special_tokens is None and string.startswith(self.tokenizer.decode(self.prefix_token_id)):
            kwargs = {"add_special_tokens": False}  # a chat template already wrote the BOS
        ids = self.tokenizer.encode(string, **kwargs)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt,
                                                  **self.chat_template_args)

    def get_model_info(self) -> dict:
        """What lm-eval writes into its results' config: the weights' identity as dcsjax records it."""
        import dcsjax

        return {"model_backend": "dcsjax", "dcsjax_version": dcsjax.__version__,
                "model_fingerprint": self.scorer.model_fingerprint, "max_length": self.max_length}

    # ------------------------------------------------------------------------------------ requests
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """Per ((context, continuation), context ids, continuation ids): (sum of the continuation's log-probs,
        whether every continuation token is the argmax). Too long a pair loses tokens from the left, as in
        the hf backend; pairs that share a context are scored in one group."""
        pairs = []
        for _, context_ids, continuation_ids in requests:
            whole = (list(context_ids) + list(continuation_ids))[-(self.max_length + 1):]
            n = len(continuation_ids)
            pairs.append((whole[:-n], whole[-n:]))
        results = []
        for lps, greedy in self._in_chunks(self.scorer.continuation_logprobs_of_ids, pairs, disable_tqdm,
                                           "loglikelihood"):
            results.append((float(np.sum(lps, dtype=np.float64)), bool(np.all(greedy))))
        for (strings, _, _), result in zip(requests, results):
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The whole document's log-likelihood over lm-eval's disjoint rolling windows of max_length tokens
        (the first conditioned on prefix_token_id)."""
        windows, owners = [], []
        for r, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(r)
        totals = [0.0] * len(requests)
        for r, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm)):
            totals[r] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations through dcsjax's jitted decode loop, cut at the first stop string (the
        request's `until` and the EOS text), at most max_gen_toks tokens; the context loses tokens from the
        left to leave room for them, as in the hf backend. Requests with the same settings share batches."""
        from dcsjax.engine.generate import generate

        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        settings: dict[tuple, list[int]] = {}
        prepared = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = int(kwargs.pop("max_gen_toks"))
            temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
            do_sample = bool(kwargs.pop("do_sample", False))
            top_p = float(kwargs.pop("top_p", 1.0) or 1.0)
            if not do_sample:
                temperature, top_p = 0.0, 1.0
            if max_gen >= self.max_length:
                raise ConfigError(f"request {i}: max_gen_toks {max_gen} must be below max_length {self.max_length}")
            ids = self.tok_encode(context, left_truncate_len=self.max_length - max_gen)
            prepared.append((ids, until))
            settings.setdefault((max_gen, temperature, top_p), []).append(i)
        out: list[str] = [""] * len(requests)
        bar = tqdm(total=len(requests), desc="generate_until", disable=disable_tqdm or not self.show_progress)
        for (max_gen, temperature, top_p), members in settings.items():
            for start in range(0, len(members), self.scorer.batch_size * 8):
                chunk = members[start:start + self.scorer.batch_size * 8]
                emitted = generate(self.scorer, [prepared[i][0] for i in chunk], max_gen, temperature=temperature,
                                   top_p=top_p, batch_size=min(self.scorer.batch_size, len(chunk)), key_ids=chunk)
                for i, tokens in zip(chunk, emitted):
                    text = self.tok_decode(tokens)
                    for stop in prepared[i][1]:
                        if stop:
                            text = text.split(stop)[0]
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(chunk))
        bar.close()
        return out

    def _in_chunks(self, fn, items: list, disable_tqdm: bool, desc: str):
        """fn over items in slices of a few batches, so lm-eval's progress bar moves; results in order."""
        step = max(self.scorer.batch_size * 16, 256)
        with tqdm(total=len(items), desc=desc, disable=disable_tqdm or not self.show_progress) as bar:
            for start in range(0, len(items), step):
                yield from fn(items[start:start + step])
                bar.update(min(step, len(items) - start))


def main(argv: list[str]) -> int:
    """`dcsjax lm-eval ARGS`: lm-eval's own command line with the dcsjax backend registered."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm-eval", *argv]
    cli_evaluate()
    return 0
