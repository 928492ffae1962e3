"""EVO-RAG's evidence verifier (rag_lab/rewards/evorag_verifier.py) through a recording fake model: what it is
asked, greedily, once per (question, evidence), what it counts across batches, and its one-line errors."""

import pytest

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Passage, QAExample
from rag_lab.env.episode import Episode
from rag_lab.generators.base import Completion
from rag_lab.rewards.evorag_verifier import EvidenceVerifier, prompt


class Model:
    """Replies by the first rule whose key is in the prompt; keeps the prompts and each call's sampling."""

    chat = False

    def __init__(self, rules, fail=False):
        self.rules, self.fail, self.prompts, self.samplings = rules, fail, [], []

    def generate(self, prompts, sampling):
        if self.fail:
            raise ConnectionError("endpoint down")
        self.prompts += prompts
        self.samplings.append(sampling)
        return [[Completion(next((v for k, v in self.rules.items() if k in p), "hm"))] for p in prompts]


PAGES = [Passage("p1", "One", "x."), Passage("p2", "Two", "y.")]


def test_the_prompt_names_each_page_or_none():
    assert prompt("Who?", PAGES) == (
        "Question: Who?\nEvidence:\n[1] One: x.\n[2] Two: y.\n"
        "Is this evidence enough to answer the question? Reply with one word: yes or no."
    )
    assert "Evidence:\n(none)\nIs this" in prompt("Who?", [])


def test_asked_greedily_once_per_question_and_evidence_and_counted_across_batches():
    verifier = EvidenceVerifier(Model({"Q1": "yes", "Q2": "no"}))
    assert verifier.enough(["Q1?", "Q2?", "Q4?", "Q1?"], [PAGES, [], [], PAGES]) == [True, False, None, True]
    assert verifier.enough(["Q3?", "Q1?"], [PAGES[:1], PAGES]) == [None, True]
    assert (verifier.calls, verifier.unparsed) == (4, 2)
    assert [s.temperature for s in verifier.generator.samplings] == [0.0, 0.0]
    assert {s.max_new_tokens for s in verifier.generator.samplings} == {4}
    assert verifier.generator.prompts[0].startswith("Question: Q1?\nEvidence:\n[1] One: x.")


def test_only_refusals_are_verified_and_the_errors_are_one_line():
    examples = [QAExample("a", "Q1?", ("x",)), QAExample("b", "Q2?", ("y",), answerable=False)]
    episodes = [Episode("a", "Q1?", [], "", "refuse"), Episode("b", "Q2?", [], "y", "answer")]
    verifier = EvidenceVerifier(Model({"Q1": "no"}))
    # the refusal's flag is the verifier's ("not enough": unanswerable); the answer keeps the data set's
    assert verifier.answerable(episodes, examples, [PAGES, PAGES]) == [False, False]
    with pytest.raises(
        RagLabError, match=r"^reward.refusal=verifier: the trainer passed no evidence to verify$"
    ):
        verifier.answerable(episodes, examples, None)
    with pytest.raises(
        RagLabError, match=r"^reward.verifier.generator: the evidence verifier has no generator$"
    ):
        EvidenceVerifier().enough(["Q?"], [PAGES])
    with pytest.raises(RagLabError, match=r"^reward.verifier \(Model\) failed: endpoint down$"):
        EvidenceVerifier(Model({}, fail=True)).enough(["Q?"], [PAGES])
