"""The teacher's reader recovers every sub-answer of the world from its gold support passage,
and nothing from passages that do not state it."""

import pytest

from rag_lab.data.synth import SynthDataset
from rag_lab.env.teacher.reader import answer_from, extract, parse_question


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    sizes = {"n_people": 80, "n_cities": 12, "n_countries": 4, "n_films": 20, "n_companies": 8, "n_bands": 5}
    return SynthDataset(str(tmp_path_factory.mktemp("w")), dev_size=20, test_size=40, **sizes)


def test_every_answerable_step_is_read_from_its_support(world):
    steps = 0
    for split in ["train", "dev", "test"]:
        for ex in world.split(split):
            answers: list[str] = []
            for step in ex.decomposition:
                question = step.question
                for i, previous in enumerate(answers, start=1):
                    question = question.replace(f"#{i}", previous)
                answers.append(step.answer)
                if step.support_id is None:
                    continue
                assert parse_question(question) is not None, question
                assert answer_from(question, [world.corpus.get(step.support_id)]) == step.answer, question
                steps += 1
    assert steps > 500


def test_other_passages_do_not_answer(world):
    ex = next(e for e in world.split("test") if e.type == "compositional" and e.answerable)
    step = ex.decomposition[0]
    others = [p for p in world.corpus if p.id != step.support_id][:50]
    ask = parse_question(step.question)
    assert all(extract(ask, p) is None or p.title == ask.subject for p in others)
    assert answer_from(step.question, others) is None
