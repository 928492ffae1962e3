"""The generated world: every question kind, correct kinship composition, near-name distractors."""

import random
import re

import pytest

from rag_lab.data.synth.questions import KINSHIP, make_questions
from rag_lab.data.synth.world import build_world, date_alias

SIZES = {"people": 80, "cities": 12, "countries": 4, "films": 20, "companies": 8, "bands": 5}


@pytest.fixture(scope="module")
def world_and_questions():
    rng = random.Random(0)
    world = build_world(rng, SIZES, withhold_rate=0.05)
    return world, make_questions(rng, world)


def test_every_kind_of_question(world_and_questions):
    _, questions = world_and_questions
    kinds = {q["type"] for q in questions}
    assert kinds == {
        "single_hop",
        "compositional",
        "inference",
        "comparison",
        "bridge_comparison",
        "3hop",
        "4hop",
    }
    answers = {q["answer"] for q in questions if q["type"] in ("comparison", "bridge_comparison")}
    assert {"yes", "no"} <= answers
    assert any(not q["answerable"] for q in questions) and any(q["answerable"] for q in questions)


def test_decompositions_chain_through_placeholders(world_and_questions):
    world, questions = world_and_questions
    for q in questions:
        steps = q["decomposition"]
        assert len(steps) == q["hops"]
        if q["type"] in ("compositional", "inference", "3hop", "4hop"):
            for i, step in enumerate(steps[1:], start=1):
                assert f"#{i}" in step["question"]
                # the subject of step i+1 is the answer of step i
                assert step["title"] == steps[i - 1]["answer"]
            assert steps[-1]["answer"] == q["answer"]


def test_kinship_is_the_composition_of_two_facts(world_and_questions):
    world, questions = world_and_questions
    inference = [q for q in questions if q["type"] == "inference"]
    assert inference
    by_term = {term: pair for pair, term in KINSHIP.items()}
    for q in inference:
        term, person = re.fullmatch(r"Who is the (.+) of (.+)\?", q["question"]).groups()
        first, second = by_term[term]
        assert q["answer"] == world.entities[world.entities[person].facts[first]].facts[second]


def test_withheld_entities_have_no_passage(world_and_questions):
    world, questions = world_and_questions
    titles = {t for t, _ in world.passages.values()}
    assert world.withheld and not world.withheld & titles
    for q in questions:
        needed = {s["title"] for s in q["decomposition"]}
        assert q["answerable"] == (not needed & world.withheld)


def test_near_name_distractors_and_no_reversed_names(world_and_questions):
    world, _ = world_and_questions
    people = [e.name for e in world.of_kind("person")]
    surnames = [n.split()[1] for n in people]
    assert len(set(surnames)) < len(people) / 2  # shared surnames: near-name distractors
    assert not {f"{b} {a}" for a, b in (n.split() for n in people)} & set(people)


def test_dates_have_an_alias():
    assert date_alias("3 December 1917") == "December 3, 1917"
