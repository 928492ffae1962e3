"""R3-RAG's reward group on hand-worked trajectories (correct / wrong / no answer / format error), both forms,
the table 2 ablations, and the model judges through a fake generator (parsed, unparsable: scored and
counted)."""

import pytest

from rag_lab.core.config import ConfigError, compose
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Passage, QAExample
from rag_lab.env.episode import Episode, Step
from rag_lab.generators.base import Completion
from rag_lab.rewards.r3rag_judges import R3RAGReward, read_official, read_relevance

EXAMPLE = QAExample("q1", "Where was the founder of Acme born?", ("Paris",), supporting_ids=("p1", "p2"))


def search(*ids: str) -> Step:
    return Step(
        text="The problem analysis: a\nThe retrieval query: b",
        action="search",
        query="b",
        retrieved_ids=list(ids),
    )


def answer(text: str) -> Step:
    return Step(text=f"The problem analysis: a\nThe final answer: {text}", action="answer")


EPISODES = {
    # support: 1/3, 2/3, then the right answer
    "correct": Episode(
        "q1", "?", [search("p1", "x", "y"), search("p2", "p1", "z"), answer("Paris")], "Paris", "answer"
    ),
    # support 2/3, then a wrong answer
    "incorrect": Episode("q1", "?", [search("p1", "p2", "x"), answer("London")], "London", "answer"),
    # support 0, 1/3, and the step limit
    "no_answer": Episode("q1", "?", [search("x", "y", "z"), search("p1", "x", "y")], "", "max_turns"),
    # support 1/3, then a step that broke the format
    "format_error": Episode(
        "q1", "?", [search("p2", "x", "y"), Step(text="garbage", action="invalid", error="no analysis")],
        "", "format_error", format_failure=True,
    ),
}  # fmt: skip
THIRD, TWO_THIRDS = 1 / 3, 2 / 3
OFFICIAL = {
    "correct": [THIRD * 1.6, TWO_THIRDS * 1.6, 2.0],
    "incorrect": [TWO_THIRDS * 0.8, 0.0],
    "no_answer": [0.0, THIRD * 0.9],
    "format_error": [THIRD, -0.9],
}
# eq. 5 then λ_T: the answer step's Val·Acc + Val − 1 is 1 (right) or 0 (wrong); a broken step −1; the
# paper's no-answer trajectory takes the wrong answer's factor
PAPER = {
    "correct": [THIRD * 1.6, TWO_THIRDS * 1.6, 1.6],
    "incorrect": [TWO_THIRDS * 0.8, 0.0],
    "no_answer": [0.0, THIRD * 0.8],
    "format_error": [THIRD, -1.0],
}


def no_docs(i, j):
    return []


def scored(reward: R3RAGReward, names=tuple(EPISODES)):
    return reward.score([EPISODES[n] for n in names], [EXAMPLE] * len(names), no_docs)


@pytest.mark.parametrize(("form", "expected"), [("official", OFFICIAL), ("paper", PAPER)])
def test_step_rewards_of_four_trajectories_by_hand(form, expected):
    rows, parts = scored(R3RAGReward(form=form))
    for name, row in zip(EPISODES, rows, strict=True):
        assert row == pytest.approx(expected[name], abs=1e-12), name
    assert parts["rollout/acc"] == 0.25 and parts["rollout/format_failure"] == 0.25
    assert parts["reward/process"] == pytest.approx((THIRD + TWO_THIRDS + TWO_THIRDS + 0 + THIRD + THIRD) / 6)


def test_the_ablations_drop_the_process_or_the_outcome():
    (correct, wrong), _ = scored(R3RAGReward(parts=["outcome"]), ["correct", "incorrect"])
    assert correct == [0.0, 0.0, 2.0] and wrong == [0.0, 0.0]
    (correct, wrong), _ = scored(R3RAGReward(parts=["process"]), ["correct", "incorrect"])
    # no outcome signal: the answer step scores as a wrong one, λ_T 1
    assert correct == pytest.approx([THIRD, TWO_THIRDS, 0.0]) and wrong == pytest.approx([TWO_THIRDS, 0.0])


class Says:
    """A fake judge model: the reply of the first rule whose key is in the prompt (plain text when ``chat``
    is false, as the tiny LM reads)."""

    def __init__(self, rules: dict[str, str], chat: bool = True):
        self.rules, self.prompts, self.chat = rules, [], chat

    def generate(self, prompts, sampling):
        assert all(isinstance(p, list) == self.chat for p in prompts)
        self.prompts += prompts
        texts = [p[-1]["content"] if self.chat else p for p in prompts]
        return [[Completion(next((v for k, v in self.rules.items() if k in t), ""))] for t in texts]


def test_the_outcome_judge_can_only_turn_a_mismatch_right_and_an_unparsable_verdict_is_counted():
    reward = R3RAGReward(outcome_judge=True, judge_generator=Says({"London": "True."}, chat=False))
    (wrong,), parts = scored(reward, ["incorrect"])
    assert wrong == pytest.approx([TWO_THIRDS * 1.6, 2.0]) and parts["rollout/acc"] == 1.0
    # the exact match is not asked about; an unparsable verdict scores as wrong, counted
    reward = R3RAGReward(outcome_judge=True, judge_generator=Says({"London": "perhaps"}))
    (right, wrong), parts = scored(reward, ["correct", "incorrect"])
    assert wrong == pytest.approx(OFFICIAL["incorrect"]) and parts["judge/unparsed"] == 1
    assert len(reward.judge.generator.prompts) == 1


def test_model_process_judges_parse_and_count_what_they_cannot_read():
    docs = {(0, 0): [Passage("p1", "Acme", "Acme was founded by Ada.")], (0, 1): []}
    reward = R3RAGReward(process="relevance", judge_generator=Says({"Acme was": "0.7", "(none)": "high"}))
    (row,), parts = reward.score([EPISODES["correct"]], [EXAMPLE], lambda i, j: docs[(i, j)])
    assert row == pytest.approx([0.7 * 1.6, 0.0, 2.0]) and parts["judge/unparsed"] == 1
    line = "coherence: 1.0, rationality: 0.5, relevance: 0.5, fatal: no"
    reward = R3RAGReward(process="official", judge_generator=Says({"Acme was": line, "(none)": line}))
    (row,), _ = reward.score([EPISODES["correct"]], [EXAMPLE], lambda i, j: docs[(i, j)])
    # the second step retrieved nothing: its relevance counts 0 (0.3 + 0.15)
    assert row == pytest.approx([0.65 * 1.6, 0.45 * 1.6, 2.0])
    assert read_official(line.replace("no", "yes")) == (1.0, 0.5, 0.5, True)
    assert read_official("coherence: 2.0, rationality: 0.5, relevance: 0.5, fatal: no") is None
    assert read_relevance("1.5 then 0.34") == 0.3


def test_a_judge_without_a_generator_and_bad_settings_are_one_line_errors(tiny_cfg):
    with pytest.raises(RagLabError, match="judge_generator"):
        scored(R3RAGReward(process="relevance"), ["correct"])
    with pytest.raises(RagLabError, match=r"reward.process: 'vibes' is not one of"):
        R3RAGReward(process="vibes")
    with pytest.raises(ConfigError, match=r"parts"):
        compose(["reward=r3rag", "reward.parts=[style]"])


def test_the_readers_take_what_a_judge_writes_and_nothing_else():
    from rag_lab.rewards.r3rag_judges import read_truth

    assert [read_truth(t) for t in ("yes", "No.", "FALSE", '"True"', "", "  ")] == [True, False, False, True,
                                                                                    None, None]  # fmt: skip
    assert read_relevance("0.0") == 0.0 and read_relevance("1") == 1.0
    line = "Coherence: 0.2, Rationality: 0.0, Relevance: 0.9, Fatal: True"
    assert read_official(line) == (0.2, 0.0, 0.9, True)
    assert read_official(line.replace("0.2", "1.5")) is None


class Recorded(Says):
    """Says, keeping each call's sampling; ``fail``: the backend raises."""

    def __init__(self, rules, fail: bool = False):
        super().__init__(rules, chat=False)
        self.samplings, self.fail = [], fail

    def generate(self, prompts, sampling):
        if self.fail:
            raise RuntimeError("connection refused")
        self.samplings.append(sampling)
        return super().generate(prompts, sampling)


def test_a_judge_asks_greedily_once_per_prompt_and_counts():
    from rag_lab.rewards.r3rag_judges import Judge, read_truth

    judge = Judge(Recorded({"a": "True", "b": "?", "c": "??"}))
    assert judge.ask(["a", "b", "a"], read_truth) == [True, None, True]
    assert judge.ask(["a", "c"], read_truth) == [True, None]
    assert (judge.calls, judge.unparsed) == (3, 2) and judge.generator.prompts == ["a", "b", "c"]
    assert all(s.temperature == 0.0 and s.max_new_tokens == 32 for s in judge.generator.samplings)
    with pytest.raises(RagLabError, match=r"^r3rag judge \(Recorded\) failed: connection refused$"):
        Judge(Recorded({}, fail=True)).ask(["a"], read_truth)
    with pytest.raises(RagLabError, match=r"^reward.judge_generator: the r3rag judges need a generator"):
        Judge().ask(["a"], read_truth)


def test_the_batch_parts_and_the_settings_that_change_a_row():
    _, parts = scored(R3RAGReward())
    # the answer steps' rewards over episodes (2.0 and 0.0 of four), every step's mean, the shares
    assert parts["reward/outcome"] == 0.5 and parts["rollout/no_answer"] == 0.25
    assert parts["reward/step"] == pytest.approx(sum(map(sum, OFFICIAL.values())) / 9)
    assert scored(R3RAGReward(), ["incorrect"])[1]["reward/process"] == pytest.approx(TWO_THIRDS)
    (right,), _ = scored(R3RAGReward(factors={"correct": 2.0}), ["correct"])
    assert right == pytest.approx([THIRD * 2.0, TWO_THIRDS * 2.0, 2.0])
    # without the outcome part λ_T is 1 in the paper's form too; an unanswered episode gains no answer step
    (right, none), _ = scored(R3RAGReward(form="paper", parts=["process"]), ["correct", "no_answer"])
    assert right == pytest.approx([THIRD, TWO_THIRDS, 0.0]) and none == pytest.approx([0.0, THIRD])
    empty = Episode("q1", "?", [search(), answer("Paris")], "Paris", "answer")  # a search that found nothing
    assert R3RAGReward().score([empty], [EXAMPLE], no_docs)[0] == [[0.0, 2.0]]


def test_what_the_judges_are_asked():
    example = QAExample("q1", "Where was the founder of Acme born?", ("Paris", "Paris, France"))
    judge = Recorded(
        {"Prediction": "no", "Documents": "coherence: 1, rationality: 1, relevance: 1, fatal: yes"}
    )
    reward = R3RAGReward(outcome_judge=True, process="official", judge_generator=judge)
    pages = [Passage("p1", "Acme", "Acme was founded by Ada."), Passage("p2", "Ada", "Ada was born in Rome.")]
    (row,), _ = reward.score([EPISODES["incorrect"]], [example], lambda i, j: pages)
    assert row == [0.0, 0.0]  # a fatal step scores 0, the judge says wrong
    outcome, step = judge.prompts
    assert "Documents:\nAcme: Acme was founded by Ada.\nAda: Ada was born in Rome.\nScore this step" in step
    assert outcome == (
        "Question: Where was the founder of Acme born?\nStandard answers: Paris, Paris, France\n"
        "Prediction: London\nDoes the prediction give the same answer as one of the standard answers? "
        "Reply with one word: True or False."
    )
    judge = Recorded({"Documents": "unsure"})
    reward = R3RAGReward(process="relevance", judge_generator=judge)
    (row,), parts = reward.score([EPISODES["incorrect"]], [example], no_docs)
    assert row == [0.0, 0.0] and parts["judge/unparsed"] == 1
    assert judge.prompts[0].startswith(
        f"Question: {example.question}\nRetrieval query: b\nDocuments:\n(none)\n"
    )
    judge = Recorded({"Documents": "relevance"})
    reward = R3RAGReward(process="official", judge_generator=judge)
    assert reward.score([EPISODES["incorrect"]], [example], no_docs)[0] == [[0.0, 0.0]]


def test_the_official_prompt_and_each_bad_setting_named():
    from rag_lab.rewards.r3rag_judges import OFFICIAL_PROMPT

    judge = Recorded({"Documents": "?"})
    (row,), parts = R3RAGReward(process="official", judge_generator=judge).score(
        [EPISODES["correct"]], [EXAMPLE], no_docs
    )
    assert judge.prompts[1] == OFFICIAL_PROMPT.format(
        question=EXAMPLE.question, history="Step 1: The problem analysis: a\nThe retrieval query: b",
        analysis="a", query="b", documents="(none)",
    )  # fmt: skip
    assert "Earlier steps:\n(none)\n" in judge.prompts[0]
    three = Episode("q1", "?", [search("p1"), search("p2"), search("x"), answer("Paris")], "Paris", "answer")
    R3RAGReward(process="official", judge_generator=judge).score([three], [EXAMPLE], no_docs)
    assert "b\nStep 2: The problem analysis: a\nThe retrieval query: b\nThis step's" in judge.prompts[-1]
    one_step = Episode("q1", "?", [answer("Paris")], "Paris", "answer")
    assert R3RAGReward().score([one_step], [EXAMPLE], no_docs)[1]["reward/step"] == 2.0
    for setting, says in [
        ({"form": "x"}, "reward.form: 'x' is not one of official, paper"),
        ({"process": "x"}, "reward.process: 'x' is not one of support, relevance, official"),
        ({"parts": []}, "reward.parts: []: one or both of process, outcome"),
        ({"factors": {"bogus": 1.0}},
         "reward.factors: unknown outcomes ['bogus'] (settable: correct, incorrect, no_answer)"),
    ]:  # fmt: skip
        with pytest.raises(RagLabError) as e:
            R3RAGReward(**setting)
        assert str(e.value) == says
