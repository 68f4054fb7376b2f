"""DCS (paper 000) from the model's distribution over an item's options plus "I don't know".

Two elicitations:
- `dcs` (sequences): a softmax over the options' continuation log-likelihoods after the question (in the
  card's `mcqa_context`, as MCQA-LL has it: HellaSwag's bare passage), with "I don't know" as one more
  continuation. Its pIDK depends on how IDK is worded and normalised: summed
  log-likelihoods favour short phrasings, per-token ones favour long predictable ones (0.97 for any
  phrasing on SmolLM2). So every record carries DCS and pIDK under each phrasing of `IDK_PHRASINGS` and
  under each normalisation (sum, per token, per byte). The headline is paper 000's: pIDK the probability
  of one abstention response, the item's own IDK option where it has one (known_unknowns' "Unknown"), else
  the first phrasing, under summed log-likelihoods (the only normalisation that is a probability of the
  text). The set of phrasings as one class (`any`, their summed probability) is a companion: its pIDK is
  at least each phrasing's, so its |DCS| is at most the smallest single phrasing's and it always sits
  nearest 0. Its control (`paraphrased`) says each answer option as many ways (`ANSWER_PARAPHRASES`: bare,
  "The answer is ...", "The answer to this question is ...") and sums them as IDK's phrasings are summed, so
  neither side gains mass by being said more ways. The summary shows the spread over single phrasings and
  warns where another phrasing moves the task's DCS outside its interval.
- `dcs-letters`: the options lettered in the prompt, IDK as a lettered option like the others, and the
  next-token probabilities of the letters renormalised over them (`letter_mass` keeps their share).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from scipy.special import logsumexp

from dcsjax.data.items import LETTERS, Item
from dcsjax.metrics.dcs import dcs as dcs_of_masses, dcs_parts, softmax_over_options
from dcsjax.eval.protocols import ANSWER_PARAPHRASES, IDK_CONTINUATION, IDK_PHRASINGS  # the registry holds the wordings
from dcsjax.eval.protocols.mcqa import MCQA_CONTEXT, mcqa_context, normalised

IDK_NORMALISATIONS = ("sum", "token", "byte")
ANY_PHRASING = "any"  # the IDK class as the set of phrasings: the sum of their probabilities
PARAPHRASED = "paraphrased"  # its control: each answer option as many wordings, summed likewise
CLASSES = (ANY_PHRASING, PARAPHRASED)  # companions that are not one phrasing


def dcs_records(items: Sequence[Item], probs: Sequence[np.ndarray], idk_index: Sequence[int], lc: float,
                lw: float, extra: Sequence[dict]) -> list[dict]:
    """One record per item from its distribution over options + IDK (IDK at `idk_index`)."""
    parts = _parts(items, probs, idk_index, lc, lw)
    records = []
    for r, item in enumerate(items):
        choice = int(parts["argmax"][r])
        abstained = choice == idk_index[r]
        records.append({
            "id": item.id, "dcs": float(parts["dcs"][r]), "p_correct": float(parts["p_correct"][r]),
            "p_wrong": float(parts["p_wrong"][r]), "p_idk": float(parts["p_idk"][r]),
            "probs": np.asarray(probs[r]).round(6).tolist(), "idk_index": int(idk_index[r]), "choice": choice,
            "abstained": abstained, "correct": (not abstained) and choice in item.correct,
            "correct_options": list(item.correct), "answerable": item.answerable, "lc": lc, "lw": lw, **extra[r],
        })
    return records


def _parts(items, probs, idk_index, lc, lw) -> dict[str, np.ndarray]:
    width = max(len(p) for p in probs)
    n = len(items)
    padded = np.zeros((n, width), np.float32)
    correct, idk, valid = (np.zeros((n, width), bool) for _ in range(3))
    for r, (item, p, k) in enumerate(zip(items, probs, idk_index)):
        padded[r, :len(p)] = p
        valid[r, :len(p)] = True
        correct[r, list(item.correct)] = True
        idk[r, k] = True
    parts = dcs_parts(jnp.asarray(padded), jnp.asarray(correct), jnp.asarray(idk), jnp.asarray(valid), lc, lw)
    return {k: np.asarray(v) for k, v in parts.items()}


def softmax(scores: np.ndarray) -> np.ndarray:
    return np.asarray(softmax_over_options(jnp.asarray(scores, jnp.float32)[None], jnp.ones((1, len(scores)), bool))[0])


# ------------------------------------------------------------------------------------------ sequences
def phrasings_for(item: Item, phrasings: Sequence[str]) -> list[str]:
    """The item's own IDK option (known_unknowns' "Unknown") first, then the configured phrasings."""
    own = [item.choices[item.idk]] if item.idk is not None else []
    seen = {p.strip().casefold() for p in own}
    return own + [p for p in phrasings if p.strip().casefold() not in seen]


def answer_forms(phrasings: Sequence[str]) -> tuple[str, ...]:
    """The answer wordings of the `paraphrased` control: as many as IDK phrasings (at most the kept ones)."""
    return ANSWER_PARAPHRASES[:len(phrasings)]


def sequence_continuations(item: Item, phrasings: Sequence[str] = IDK_PHRASINGS) -> list[str]:
    """The answer options (an IDK option of the item's own left out), then each IDK phrasing, then the answer
    options in each further wording of `answer_forms` (the control), option by option within a wording."""
    answers = [c for i, c in enumerate(item.choices) if i != item.idk]
    return ([" " + c for c in answers] + [" " + p for p in phrasings_for(item, phrasings)]
            + [" " + form.format(c) for form in answer_forms(phrasings)[1:] for c in answers])


def run_dcs_sequences(scorer, items: Sequence[Item], lc: float = 1.0, lw: float = 1.0,
                      phrasings: Sequence[str] = IDK_PHRASINGS, template: str = MCQA_CONTEXT) -> list[dict]:
    """Records in the item's option order with IDK at the item's own IDK index or appended last; each option
    and IDK phrasing continues `template` (the card's `mcqa_context`)."""
    answers = [[i for i in range(len(item.choices)) if i != item.idk] for item in items]
    idk_texts = [phrasings_for(item, phrasings) for item in items]
    conts = [sequence_continuations(item, phrasings) for item in items]
    per_token = scorer.option_logprobs([mcqa_context(i, template) for i in items], conts) if items else []
    idk_index = [item.idk if item.idk is not None else len(item.choices) for item in items]
    forms = len(answer_forms(phrasings))
    names = [ANY_PHRASING, *phrasings, *([PARAPHRASED] if forms > 1 else [])]
    variants = {}  # (normalisation, phrasing) -> per item: distribution over options + IDK
    for norm in IDK_NORMALISATIONS:
        for name in names:
            variants[norm, name] = []
    headline = []  # paper 000's pIDK: one IDK response, the item's own option or else the first phrasing
    for item, a, ps, lps, texts, k in zip(items, answers, idk_texts, per_token, conts, idk_index):
        scores = {norm: v for norm, v in normalised(lps, texts).items() if norm in IDK_NORMALISATIONS}
        for norm, s in scores.items():
            options, idk_scores, reworded = s[:len(a)], s[len(a):len(a) + len(ps)], s[len(a) + len(ps):]
            by_text = dict(zip([p.strip().casefold() for p in ps], idk_scores))
            if norm == "sum":
                headline.append(softmax(np.insert(options, k, idk_scores[0])))
            for name in names:
                if name == PARAPHRASED:  # [forms, options] summed over wordings, against as many IDK phrasings
                    options_said = logsumexp(np.vstack([options, reworded.reshape(forms - 1, len(a))]), axis=0)
                    full = np.insert(options_said, k, logsumexp(idk_scores[:forms]))
                else:
                    idk_score = logsumexp(idk_scores) if name == ANY_PHRASING else by_text[name.strip().casefold()]
                    full = np.insert(options, k, idk_score)  # IDK back at its index among the options
                variants[norm, name].append(softmax(full))
    sensitivity = {key: _parts(items, probs, idk_index, lc, lw) for key, probs in variants.items()}
    extra = [{"idk_phrasings": ps, "idk_sensitivity": {
        norm: {name: [round(float(sensitivity[norm, name]["dcs"][r]), 6), round(float(sensitivity[norm, name]["p_idk"][r]), 6)]
               for name in names} for norm in IDK_NORMALISATIONS}}
        for r, ps in enumerate(idk_texts)]
    return dcs_records(items, headline, idk_index, lc, lw, extra)


# ------------------------------------------------------------------------------------------ letters
def letters_prompt(item: Item, lc: float, lw: float, instruction: str | None = None) -> tuple[str, list[str], int]:
    """The options lettered, IDK among them (appended last where the item has none), and the cost of a
    wrong answer (or the card's own `instruction` in its place: the DCS paper's MMLU line)."""
    choices = list(item.choices)
    if item.idk is None:
        choices.append(IDK_CONTINUATION)
        idk = len(choices) - 1
    else:
        idk = item.idk
    letters = list(LETTERS[: len(choices)])
    cost = lw / lc
    lines = [f"Question: {item.question}", "Options:"] + [f"{letter}. {c}" for letter, c in zip(letters, choices)]
    lines.append(instruction or f"A correct answer earns 1 point, a wrong answer costs {cost:g} point"
                 f"{'s' if cost != 1 else ''}, and answering {letters[idk]} (I don't know) costs nothing. Answer with "
                 "the letter only.")
    lines.append("Answer:")
    return "\n".join(lines), letters, idk


def letters_use_chat_template(scorer) -> bool:
    """Only a model whose card says instruct is asked through its chat template (a base model's template,
    where it has one, is not what it was pretrained on); an instruct model without one is refused."""
    return bool(scorer.is_instruct) and scorer.asks_through_chat_template("DCS from letters")


def letters_context(scorer, item: Item, lc: float, lw: float, instruction: str | None = None
                    ) -> tuple[str, list[str], int]:
    """(context, letter continuations, IDK index). An instruct model with a chat template is asked through
    it, and its answer starts the assistant turn ("A"); others complete "Answer:" (" A")."""
    prompt, letters, idk = letters_prompt(item, lc, lw, instruction)
    if letters_use_chat_template(scorer):
        return scorer.chat_text(prompt.rsplit("\nAnswer:", 1)[0]), letters, idk
    return prompt, [" " + letter for letter in letters], idk


def run_dcs_letters(scorer, items: Sequence[Item], lc: float = 1.0, lw: float = 1.0,
                    instruction: str | None = None) -> list[dict]:
    prompts, letter_lists, idk_index = [], [], []
    for item in items:
        prompt, letters, idk = letters_context(scorer, item, lc, lw, instruction)
        prompts.append(prompt)
        letter_lists.append(letters)
        idk_index.append(idk)
    scores = scorer.score_options(prompts, letter_lists) if items else []
    extra = [{"letter_mass": float(sum(math.exp(s) for s in x))} for x in scores]
    return dcs_records(items, [softmax(x) for x in scores], idk_index, lc, lw, extra)


def merge_letter_rotations(item: Item, records: Sequence[dict], perms: Sequence[Sequence[int]], lc: float,
                           lw: float) -> dict:
    """The mean of the rotations' distributions, each mapped back to the item's own order; its DCS."""
    probs = np.zeros(len(perms[0]))
    for record, perm in zip(records, perms):
        probs[list(perm)] += np.asarray(record["probs"]) / len(records)
    extra = {"letter_mass": float(np.mean([r["letter_mass"] for r in records])),
             "rotations": [r["probs"] for r in records]}
    return dcs_records([item], [probs], [item.idk], lc, lw, [extra])[0]


# ------------------------------------------------------------------------------------------ summaries
def summarise(records: list[dict]) -> dict:
    def mean(values):
        return float(np.mean(values)) if len(values) else None

    answered = [r for r in records if not r["abstained"]]
    out = {"dcs": mean([r["dcs"] for r in records]), "accuracy": mean([r["correct"] for r in records]),
           "abstention": mean([r["abstained"] for r in records]),
           "accuracy_answered": mean([r["correct"] for r in answered]), "p_idk": mean([r["p_idk"] for r in records])}
    sens = [r["idk_sensitivity"] for r in records if "idk_sensitivity" in r]
    if sens and len(sens) == len(records):
        out["dcs_by_idk"] = {name: mean([s["sum"][name][0] for s in sens]) for name in sens[0]["sum"]}
        out["p_idk_by_idk"] = {name: mean([s["sum"][name][1] for s in sens]) for name in sens[0]["sum"]}
        out["dcs_by_normalisation"] = {norm: mean([s[norm][ANY_PHRASING][0] for s in sens]) for norm in sens[0]}
        singles = [v for k, v in out["dcs_by_idk"].items() if k not in CLASSES]
        out["idk_spread"] = max(singles) - min(singles)
    return out


def uniform_dcs(n: int, n_correct: int, lc: float, lw: float) -> float:
    """DCS of the uniform distribution over n presented options, IDK one of them and n_correct of the others
    correct: (lc |C| - lw |W|) / n x (1 - 1/n)."""
    return float(dcs_of_masses(n_correct / n, (n - 1 - n_correct) / n, 1 / n, lc, lw))


def chance(records: list[dict]) -> float | None:
    """The headline a uniform answerer scores on the same presentations: `uniform_dcs` per item with the
    record's loadings."""
    if not records:
        return None
    return float(np.mean([uniform_dcs(len(r["probs"]), len({c for c in r["correct_options"] if c != r["idk_index"]}),
                                      r["lc"], r["lw"]) for r in records]))
