"""APX: greedy decoding against transformers' generate (Gemma 3), the D.1 prompts, and the D.2 parser on real
generations of SmolLM2-135M-Instruct (BIG-bench hindu_knowledge), including multi-answer and unparsable ones."""

import pytest

from conftest import reference_for, scorer_for
from dcsjax.data.items import Item
from dcsjax.engine.generate import greedy_generate
from dcsjax.eval.protocols.apx import SYSTEM_PROMPT, parse_answer, prompt_ids, question_prompt

ITEM = Item(id="hk/2", question="Which of these texts is not a Hindu scripture?",
            choices=("Vedas", "Upanishads", "Koran", "Aranyakas"), correct=(2,))


# Gemma 3 here; SmolLM2's greedy decoding against transformers' generate is test_lm_eval.py's generate_until
# comparison (a batch of eight prompts of different lengths, the same decode loop), so it does not run twice.
@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["gemma3-270m"])
def test_greedy_generation_matches_transformers(model_name):
    import torch

    scorer = scorer_for(model_name)
    # a plain text and APX's own prompt (the chat template for SmolLM2), decoded in one batch of two rows of
    # different lengths (the right-padded prefill)
    texts = ["Once upon a time, in a small village,"]
    prompts = [[scorer.document_start_id, *ids] for ids in scorer.encode(texts)] + [prompt_ids(scorer, ITEM)]
    ours = greedy_generate(scorer, prompts, max_new_tokens=15, batch_size=2)
    model = reference_for(model_name)
    for prompt, generated in zip(prompts, ours):
        with torch.no_grad():
            ref = model.generate(torch.tensor([prompt]), max_new_tokens=15, do_sample=False)[0, len(prompt):].tolist()
        assert generated == ref[:len(generated)] and (len(generated) == 15 or len(ref) > len(generated))


def test_prompts_follow_d1():
    base, instruct = question_prompt(ITEM, instruct=False), question_prompt(ITEM, instruct=True)
    assert base.endswith("The correct answer is:") and instruct.endswith("What is the correct answer?")
    assert "A. Vedas\nB. Upanishads\nC. Koran\nD. Aranyakas" in base
    assert base == base.rstrip() and instruct == instruct.rstrip()  # no trailing whitespace
    smol = scorer_for("smollm2-135m-instruct")  # instruct, with a chat template
    text = smol.tokenizer.decode(prompt_ids(smol, ITEM))
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT) and text.endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("generation,expected", [
    ("B. Shiva", (1, None)),  # letter and its own text agree
    ("C", (2, None)),
    ("The answer is Koran.", (2, None)),
    ("A. Agni is associated with fire.\n\nThe correct answer is", (0, None)),
    ("A. Vedas\n\nThe correct answer is C. Koran.", (None, "names several options: A, C")),
    ("B. Ramayana", (None, "names several options: B, C")),  # a letter and another option's text
    ("I think it is the fourth one", (None, "no option letter or option text found")),
    ("**B**", (1, None)),  # Markdown emphasis
    ("The answer is **C**.", (2, None)),
    ("Option B", (1, None)),
    ("B is correct.", (1, None)),
    ("answer: b", (1, None)),  # a lower-case letter standing alone after "answer:"
    ("The answer is a dog.", (None, "no option letter or option text found")),  # an article, not option A
    ("", (None, "no option letter or option text found")),
])
def test_parser_on_real_generations(generation, expected):
    choices = {"B. Shiva": ("Vishnu", "Shiva", "Indra", "Brahma"),
               "A. Agni is associated with fire.\n\nThe correct answer is": ("Agni", "Vayu", "Varuna", "Indra"),
               "B. Ramayana": ("Mahabharata", "Dashavatara", "Ramayana", "Hitopadesha")}.get(generation, ITEM.choices)
    assert parse_answer(generation, choices) == expected
