"""The protocols, one registry that `dcsjax eval`, the CLI and the report all read.

A protocol scores a list of items (options in the order they are presented) into one JSON-able record per
item. `score(protocol, context, items, order, seed)` presents each item's options in the run's option
order (`options.py`), runs the protocol, maps rotations back, and adds to each record where its gold
options and its answer sat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from dcsjax.data.items import Item
from dcsjax.eval.protocols import options

# Wordings of "I don't know" that sequence DCS scores; the first is the IDK option's text where an item
# needs one written out (the letter prompt, the fine-tuning data). See `dcs.py` for why there are several.
IDK_PHRASINGS = ("I don't know.", "Unknown", "I do not know the answer to this question.")
IDK_CONTINUATION = IDK_PHRASINGS[0]  # the IDK option's text where an item needs one written out
# The control for the set of IDK phrasings summed as one class: each answer option as many wordings, summed
# the same way (bare like "Unknown", a short sentence, a long one), so neither side gains mass by being said
# more ways. Used for the first len(phrasings) phrasings and as many of these.
ANSWER_PARAPHRASES = ("{}", "The answer is {}.", "The answer to this question is {}.")


@dataclass(frozen=True)
class Context:
    """What a protocol needs besides the items."""
    scorer: object
    card: object  # BenchmarkCard
    lc: float = 1.0
    lw: float = 1.0
    statements: Callable[[Item], Sequence[str]] | None = None  # APS: from a statements file, else the card's rule
    statements_file: str | None = None
    idk_phrasings: tuple[str, ...] = IDK_PHRASINGS
    exemplars: Callable[[Item], list[Item]] | None = None  # few-shot (`fewshot.Exemplars`): MCQA-LL and APX
    log_samples: bool = False  # each record keeps the text the model was given (`prompt`)

    def fewshot_settings(self) -> dict:
        return self.exemplars.settings() if self.exemplars is not None and self.exemplars.k else {}


@dataclass(frozen=True)
class Protocol:
    name: str
    help: str
    run: Callable[[Context, list[Item]], list[dict]]
    summarise: Callable[[list[dict]], dict]  # -> {headline metric: value, companions...}
    headline: Callable[[dict], float]  # a record's value of the headline metric (for bootstrap intervals)
    answer: Callable[[dict], int | None]  # the record's answered option, in its presented order
    settings: Callable[[Context], dict] = lambda ctx: {}  # what, besides model, task and code, decides records
    letters: bool = False  # the model sees lettered options, so their order can change its answer
    idk_option: bool = False  # IDK is presented as one more option (and is shuffled with the others)
    merge_rotations: Callable | None = None  # (ctx, item, records, perms) -> the item's record
    unavailable: Callable[[Context], str | None] = field(default=lambda ctx: None)  # why it cannot run a task
    prompt: Callable[[Context, Item], object] | None = None  # the text(s) the model is given for a presented item
    # the headline a uniform answerer scores on the same presentations (records -> value); None: the share of
    # an item's presented options that are correct, the chance accuracy of a protocol that picks one option
    chance: Callable[[list[dict]], float | None] | None = None
    # a table of its own under the results table ((summary rows of this protocol, fmt) -> text)
    details: Callable[[list[dict], str], str] | None = None
    dcs_loadings: bool = False  # its headline is DCS under the run's loadings (lc, lw): eval names them beside it
    fewshot: bool = False  # it takes solved exemplars before the question (`--num-fewshot`)


def _aps_statements(ctx: Context):
    from dcsjax.data.tasks import declarative_statements

    return ctx.statements or declarative_statements(ctx.card)


def _aps_unavailable(card) -> str:
    from dcsjax.data.tasks import PARTIAL_RULES

    if card.statements in PARTIAL_RULES:
        # one wording for every task of the card, so a run over many subjects says it in one line naming them
        return (f"the card's statement rule ({card.statements!r}) reaches only the questions that each option "
                "completes as a sentence: write them with `dcsjax statements generate --task TASK --out FILE` (no "
                "model needed), then --statements FILE scores every protocol on those items")
    return ("no declarative statements (the card has no cloze blank, statement template or statement options): give "
            "--statements FILE from `dcsjax statements generate`, or use qa-ppl (question + option perplexity, which "
            "is not APS)")


def _aps_source(ctx: Context) -> str:
    from dcsjax.data.tasks import local_file

    return "file" if ctx.statements_file else ctx.card.statements or ("file rows" if local_file(ctx.card.source) else "none")


def mcqa_presentation(card) -> dict:
    """What, besides the context, decides MCQA-LL's records on a card with a presentation of its own (settings
    and so fingerprints stay as they were for the others)."""
    if card.presentation is None and card.mcqa_answer == "text" and not card.chat_template \
            and card.mcqa_normalisation == "sum":
        return {}
    return {"presentation": card.presentation, "continuation": card.mcqa_answer, "chat_template": card.chat_template,
            "headline": f"accuracy_{card.mcqa_normalisation}"}


def _build() -> dict[str, Protocol]:
    from dcsjax.eval.protocols import apx, aps, dcs, mcqa, stated

    def dcs_settings(ctx):
        return {"lc": ctx.lc, "lw": ctx.lw}

    def choice(record):
        return record["choice"]

    def idk_answer(record):  # an abstention is no option
        return None if record["abstained"] else record["choice"]

    return {p.name: p for p in [
        Protocol("aps", PROTOCOL_HELP["aps"],
                 run=lambda ctx, items: aps.run_aps(ctx.scorer, items, _aps_statements(ctx)),
                 prompt=lambda ctx, item: list(_aps_statements(ctx)(item)),
                 summarise=aps.summarise_aps, details=aps.validation_table, headline=lambda r: float(r["correct"]),
                 answer=choice,
                 settings=lambda ctx: {"statements": _aps_source(ctx),
                                       "template": ctx.card.statement_template if ctx.card.statements == "template" else None},
                 unavailable=lambda ctx: None if _aps_statements(ctx) else _aps_unavailable(ctx.card)),
        Protocol("qa-ppl", PROTOCOL_HELP["qa-ppl"],
                 run=lambda ctx, items: aps.run_qa_ppl(ctx.scorer, items, ctx.card.qa_template),
                 prompt=lambda ctx, item: aps.qa_texts(item, ctx.card.qa_template),
                 summarise=aps.summarise, headline=lambda r: float(r["correct"]), answer=choice,
                 settings=lambda ctx: {"template": ctx.card.qa_template}),
        Protocol("mcqa", PROTOCOL_HELP["mcqa"],
                 run=lambda ctx, items: mcqa.run_mcqa(ctx.scorer, items, ctx.card, ctx.exemplars),
                 summarise=mcqa.summarise, fewshot=True,
                 headline=lambda r: float(r["correct"][mcqa.headline(r)]),
                 answer=lambda r: r["choice"][mcqa.headline(r)],
                 settings=lambda ctx: {"context": "partial (cloze)" if ctx.card.cloze_blank else ctx.card.mcqa_context,
                                       **mcqa_presentation(ctx.card), **ctx.fewshot_settings()},
                 prompt=lambda ctx, item: mcqa.prompt_record(
                     item, ctx.card, ctx.exemplars(item) if ctx.exemplars else (), ctx.scorer)),
        Protocol("apx", PROTOCOL_HELP["apx"],
                 run=lambda ctx, items: apx.run_apx(ctx.scorer, items, ctx.exemplars), summarise=apx.summarise,
                 headline=lambda r: float(r["correct"]), answer=choice, letters=True, fewshot=True,
                 settings=lambda ctx: {"instruct": apx.is_instruct(ctx.scorer),
                                       "chat_template": apx.uses_chat_template(ctx.scorer),
                                       "max_new_tokens": apx.MAX_NEW_TOKENS, **ctx.fewshot_settings()},
                 prompt=lambda ctx, item: ctx.scorer.tokenizer.decode(apx.prompt_ids(
                     ctx.scorer, item, ctx.exemplars(item) if ctx.exemplars else ())),
                 merge_rotations=lambda ctx, item, records, perms: apx.merge_rotations(item, records, perms)),
        Protocol("dcs", PROTOCOL_HELP["dcs"],
                 run=lambda ctx, items: dcs.run_dcs_sequences(ctx.scorer, items, ctx.lc, ctx.lw, ctx.idk_phrasings,
                                                              ctx.card.mcqa_context),
                 prompt=lambda ctx, item: {"context": mcqa.mcqa_context(item, ctx.card.mcqa_context),
                                           "continuations": dcs.sequence_continuations(item, ctx.idk_phrasings)},
                 summarise=dcs.summarise, headline=lambda r: r["dcs"], answer=idk_answer, chance=dcs.chance,
                 dcs_loadings=True,
                 settings=lambda ctx: dcs_settings(ctx) | {
                     "context": ctx.card.mcqa_context, "idk_phrasings": list(ctx.idk_phrasings),
                     "answer_paraphrases": list(dcs.answer_forms(ctx.idk_phrasings)),  # the `paraphrased` control
                     "idk_headline": "one IDK response (the item's own IDK option, else the first phrasing), "
                                     "summed log-likelihood"}),
        Protocol("dcs-letters", PROTOCOL_HELP["dcs-letters"],
                 run=lambda ctx, items: dcs.run_dcs_letters(ctx.scorer, items, ctx.lc, ctx.lw,
                                                            ctx.card.dcs_instruction),
                 prompt=lambda ctx, item: dict(zip(("context", "continuations"),
                                                   dcs.letters_context(ctx.scorer, item, ctx.lc, ctx.lw,
                                                                       ctx.card.dcs_instruction)[:2])),
                 summarise=dcs.summarise, headline=lambda r: r["dcs"], answer=idk_answer, letters=True,
                 idk_option=True, chance=dcs.chance, dcs_loadings=True,
                 settings=lambda ctx: dcs_settings(ctx) | {"chat_template": dcs.letters_use_chat_template(ctx.scorer),
                                                           "idk_option": ctx.idk_phrasings[0]}
                 | ({"instruction": ctx.card.dcs_instruction} if ctx.card.dcs_instruction else {}),
                 merge_rotations=lambda ctx, item, records, perms: dcs.merge_letter_rotations(item, records, perms,
                                                                                           ctx.lc, ctx.lw)),
        Protocol("stated-risk", PROTOCOL_HELP["stated-risk"],
                 run=lambda ctx, items: stated.run_stated_risk(ctx.scorer, items, *_stated(ctx)),
                 prompt=lambda ctx, item: {
                     "contexts": [dcs.letters_context(ctx.scorer, item, 1.0, stated.penalty(t),
                                                      stated.instruction(t, stated.letters_wording(_stated(ctx)[1])))[0]
                                  for t in _stated(ctx)[0]],
                     "unstated": dcs.letters_context(ctx.scorer, item, 1.0, 1.0, stated.UNSTATED)[0]},
                 summarise=stated.summarise, headline=lambda r: r["dcs"], answer=lambda r: r["choice"],
                 letters=True, idk_option=True, chance=stated.chance, details=stated.table,
                 settings=lambda ctx: {"thresholds": list(_stated(ctx)[0]),
                                       "wording": stated.letters_wording(_stated(ctx)[1]),
                                       "unstated": stated.UNSTATED, "idk_option": ctx.idk_phrasings[0],
                                       "chat_template": dcs.letters_use_chat_template(ctx.scorer)},
                 merge_rotations=lambda ctx, item, records, perms: stated.merge_rotations(item, records, perms)),
        Protocol("stated-risk-sequences", PROTOCOL_HELP["stated-risk-sequences"],
                 run=lambda ctx, items: stated.run_stated_risk(ctx.scorer, items, *_stated(ctx), "sequences",
                                                               ctx.card.mcqa_context),
                 prompt=lambda ctx, item: {
                     "contexts": [stated.sequences_context(item, stated.instruction(t, _stated(ctx)[1]),
                                                           ctx.card.mcqa_context) for t in _stated(ctx)[0]],
                     "unstated": stated.sequences_context(item, None, ctx.card.mcqa_context),
                     "continuations": [" " + c for c in item.choices]},
                 summarise=stated.summarise, headline=lambda r: r["dcs"], answer=lambda r: r["choice"],
                 idk_option=True, chance=stated.chance, details=stated.table,
                 settings=lambda ctx: {"thresholds": list(_stated(ctx)[0]), "rule": _stated(ctx)[1],
                                       "context": ctx.card.mcqa_context, "idk_option": ctx.idk_phrasings[0],
                                       "readout": "summed log-likelihood of each option's text"}),
        Protocol("stated-risk-generate", PROTOCOL_HELP["stated-risk-generate"],
                 run=lambda ctx, items: stated.run_stated_risk(ctx.scorer, items, *_stated(ctx), "generation"),
                 prompt=lambda ctx, item: {
                     "contexts": [ctx.scorer.tokenizer.decode(apx.ask_ids(ctx.scorer, stated.generation_question(
                         item, apx.is_instruct(ctx.scorer), stated.instruction(t, _stated(ctx)[1]))))
                                  for t in _stated(ctx)[0]],
                     "unstated": ctx.scorer.tokenizer.decode(apx.ask_ids(ctx.scorer, stated.generation_question(
                         item, apx.is_instruct(ctx.scorer), None)))},
                 summarise=stated.summarise, headline=lambda r: r["dcs"], answer=lambda r: r["choice"],
                 letters=True, idk_option=True, chance=stated.chance, details=stated.table,
                 settings=lambda ctx: {"thresholds": list(_stated(ctx)[0]), "rule": _stated(ctx)[1],
                                       "idk_option": ctx.idk_phrasings[0], "instruct": apx.is_instruct(ctx.scorer),
                                       "chat_template": apx.uses_chat_template(ctx.scorer),
                                       "max_new_tokens": apx.MAX_NEW_TOKENS,
                                       "readout": "greedy reply parsed as APX parses; unparsed scored wrong"},
                 merge_rotations=lambda ctx, item, records, perms: stated.merge_rotations(item, records, perms)),
    ]}


def _stated(ctx: Context) -> tuple[tuple[float, ...], str]:
    """The stated-risk protocols' targets and rule: the card's, else the protocols' defaults."""
    from dcsjax.eval.protocols import stated

    card = ctx.card
    thresholds = tuple(float(t) for t in card.stated_thresholds) if card.stated_thresholds else stated.THRESHOLDS
    return thresholds, card.stated_wording or stated.RULE


_REGISTRY: dict[str, Protocol] | None = None


def registry() -> dict[str, Protocol]:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = _build()
    return _REGISTRY


# registry order, importable without jax
PROTOCOLS = ("aps", "qa-ppl", "mcqa", "apx", "dcs", "dcs-letters", "stated-risk", "stated-risk-sequences",
             "stated-risk-generate")
PROTOCOL_HELP = {  # one line each, for `--help` (which must not wait for jax to import)
    "aps": "perplexity ranking of declarative statements (002 §2)",
    "qa-ppl": "perplexity ranking of question + option texts (the card's qa_template; not APS)",
    "mcqa": "option log-likelihood after the question, four normalisations (002 App. B)",
    "apx": "the prompted answer letter, greedy, parsed as D.2 (002 §2, App. D)",
    "dcs": "DCS from option + IDK continuation likelihoods, under IDK phrasings and normalisations",
    "dcs-letters": "DCS from the next-token probabilities of the option letters, IDK a lettered option",
    "stated-risk": "dcs-letters with the scoring rule and target t stated in the prompt, at several t: does "
                   "abstention follow t?",
    "stated-risk-sequences": "stated-risk read by the options' sequence likelihoods (the dcs read-out) instead of "
                             "letters",
    "stated-risk-generate": "stated-risk read from the prompted answer: APX's prompt with the rule stated, greedy, "
                            "parsed as D.2",
}


def named(flag: str) -> tuple[str, ...]:
    """The protocols, in registry order, whose `flag` (a boolean field of `Protocol`) is set: for instance
    named("dcs_loadings"), the protocols whose headline is DCS under the run's loadings."""
    return tuple(name for name, protocol in registry().items() if getattr(protocol, flag))


def get(name: str) -> Protocol:
    from dcsjax.errors import ConfigError

    if name not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return registry()[name]


def score(protocol: Protocol, ctx: Context, items: Sequence[Item], order: str, seed: int) -> list[dict]:
    """Records of `items` in their order: each presented in the option order, scored, and (rotations)
    merged back into the item's own order. Each record's `order.presentations` says, per presentation, the
    permutation (source index by presented position), the gold letters and the answered letter."""
    if not items:  # a process whose share of a short last chunk is empty
        return []
    bases = [options.with_idk(item, ctx.idk_phrasings[0]) if protocol.idk_option else item for item in items]
    perms = [options.permutations_for(base, order, seed, protocol.letters) for base in bases]
    shown = [options.permute(base, perm) for base, ps in zip(bases, perms) for perm in ps]
    flat = protocol.run(ctx, shown)
    records, at = [], 0
    for base, ps in zip(bases, perms):
        group, views = flat[at:at + len(ps)], shown[at:at + len(ps)]
        at += len(ps)
        presentations = [options.order_record(view, perm, protocol.answer(rec))
                         for view, perm, rec in zip(views, ps, group)]
        if len(ps) == 1:
            record = {**group[0], "order": {"name": order, "presentations": presentations}}
        else:  # rotations: the merged record is in the item's own order
            record = {**protocol.merge_rotations(ctx, base, group, ps),
                      "order": {"name": order, "presentations": presentations}}
        if ctx.fewshot_settings() and protocol.fewshot:
            record["fewshot"] = [ex.id for ex in ctx.exemplars(base)]
        if ctx.log_samples and protocol.prompt is not None:  # one prompt per presentation (rotations: several)
            prompts = [protocol.prompt(ctx, view) for view in views]
            record["prompt"] = prompts[0] if len(prompts) == 1 else prompts
        records.append(record)
    return records
