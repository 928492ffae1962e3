"""LM-free retrieval baselines: a floor every method must beat, runnable with no generator.

``RetrieveOnly`` retrieves once with the question and answers nothing: the policy behind
``experiment=retrieval_eval`` (recall@k / precision@k of gold supports per retriever).

``TopTitle`` retrieves once with the question and answers with the title of the best passage
whose title the question does not already mention: right whenever the answer is an entity
with its own passage that retrieval ranks first (a retrieval-only reader, as in FlashRAG's
"retrieval only" sanity rows).
"""

from pathlib import Path

from rag_lab.core.config import PositiveInt
from rag_lab.data.base import Passage, QAExample
from rag_lab.env import Env, Episode, Step


class RetrieveOnly:
    """Retrieve the top ``k`` once with the question; answer with :meth:`answer` ('' here)."""

    trains = False

    def __init__(
        self,
        # passages retrieved with the question, once
        k: PositiveInt = 20,
    ):
        self.k = k

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not train")

    def answer(self, ex: QAExample, passages: list[Passage]) -> str:
        return ""

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        hits = env.search([ex.question for ex in batch], self.k, questions=batch)
        episodes = []
        for ex, found in zip(batch, hits, strict=True):
            step = Step(action="search", query=ex.question, retrieved_ids=[h.id for h in found])
            answer = self.answer(ex, env.passages(found))
            episodes.append(Episode(ex.id, ex.question, [step], answer, stop_reason="answer"))
        return episodes


class TopTitle(RetrieveOnly):
    def __init__(
        self,
        # passages retrieved with the question, once; the answer is the best title among them
        k: PositiveInt = 5,
    ):
        super().__init__(k)

    def answer(self, ex: QAExample, passages: list[Passage]) -> str:
        """The best passage title that the question does not already mention."""
        return next((p.title for p in passages if p.title.lower() not in ex.question.lower()), "")
