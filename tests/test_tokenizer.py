"""The GGUF tokenizer dcsjax builds without torch equals transformers' own GGUF tokenizer (which reads the
file with torch), token for token, on both real models; so does the tests' kept copy of transformers' own."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from transformers import AutoTokenizer

from conftest import PASSAGE, reference_tokenizer
from dcsjax.checkpoints.cards import model_card
from dcsjax.checkpoints.gguf_file import gguf_vocab_size, open_gguf
from dcsjax.checkpoints.gguf_tokenizer import build_gguf_tokenizer, gguf_tokenizer
from dcsjax.checkpoints.fetch import fetch_model

pytestmark = pytest.mark.slow

SPECIAL = ["bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"]


def texts() -> list[str]:
    sentences = [s.strip() for s in PASSAGE.split(". ") if s.strip()]
    questions = [f"Question: {a}?\nAnswer: {b}" for a, b in zip(sentences, sentences[1:])]  # the prompts' shape
    tricky = ["", " ", "  two  spaces", "\n\nnew lines\n", "tabs\tand\r\nreturns", "émoji 🙂 数字 12345 ½",
              "<|im_start|>user\nhi<|im_end|>", "<bos>x<eos><pad>", "don't I'll we've", "a" * 300]
    return [PASSAGE, *PASSAGE.split(". "), *questions, *tricky]


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_torch_free_tokenizer_equals_transformers_own(name):
    """Ours, built from the GGUF file without torch, against transformers' own conversion of the same file. For
    SmolLM2 a fresh conversion, against which the tests' kept copy of it (conftest.reference_tokenizer: saved
    and read back) is checked too; for Gemma 3 the kept copy, which a fresh cache builds the same way (the
    conversion takes 30 s, and the other tests need the copy anyway). Beside the fresh conversion, the copy of
    it that dcsjax keeps in its cache and loads from."""
    path = fetch_model(name)
    kept = reference_tokenizer(name)
    file = open_gguf(path)
    # what `dcsjax.load` reads: the conversion kept in the cache (made here where the cache has none yet)
    ours_kept = gguf_tokenizer(path, model_card(name).sha256, gguf_vocab_size(file))
    if name == "gemma3-270m":
        theirs, candidates = kept, (build_gguf_tokenizer(file, str(path)), ours_kept)
    else:
        theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        candidates = (build_gguf_tokenizer(file, str(path)), ours_kept, kept)
    for ours in candidates:
        assert len(ours) == len(theirs)
        assert [getattr(ours, k) for k in SPECIAL] == [getattr(theirs, k) for k in SPECIAL]
        for text in texts():
            for special in (True, False):
                got = ours(text, add_special_tokens=special, return_offsets_mapping=True)
                want = theirs(text, add_special_tokens=special, return_offsets_mapping=True)
                assert got["input_ids"] == want["input_ids"], (text[:60], special)
                assert got["offset_mapping"] == want["offset_mapping"], (text[:60], special)
            ids = want["input_ids"]
            assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
        assert ours.chat_template == theirs.chat_template
        if theirs.chat_template:
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
            assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
                theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_loading_needs_no_torch(tmp_path):
    """A process in which torch cannot be imported loads SmolLM2 and scores a text (fresh tokenizer cache)."""
    path = fetch_model("smollm2-135m-instruct")
    code = textwrap.dedent(f"""
        import json, sys
        sys.modules["torch"] = None  # any `import torch` now fails
        import dcsjax
        scorer = dcsjax.load({str(path)!r}, document_start="<|endoftext|>")
        print(json.dumps(float(scorer.score(["The capital of France is Paris."])[0])))
        """)
    env = {**os.environ, "DCSJAX_CACHE": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == pytest.approx(-17.266, abs=1e-3)
