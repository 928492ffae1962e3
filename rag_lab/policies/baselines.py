"""LM-free retrieval baselines: a floor every method must beat, runnable with no generator.

``RetrieveOnly`` retrieves once with the question and answers nothing: the policy behind
``+experiment=retrieval_eval`` (recall@k / precision@k of gold supports per retriever).

``TopTitle`` retrieves once with the question and answers with the title of the best passage
whose title the question does not already mention: right whenever the answer is an entity
with its own passage that retrieval ranks first (a retrieval-only reader, as in FlashRAG's
"retrieval only" sanity rows).
"""

from pathlib import Path

from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode, Step


class TopTitle:
    trains = False

    def __init__(self, k: int = 5):
        self.k = k

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path) -> None:
        raise NotImplementedError("TopTitle does not train")

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        hits = env.search([ex.question for ex in batch], self.k)
        episodes = []
        for ex, found in zip(batch, hits, strict=True):
            titles = [p.title for p in env.passages(found)]
            answer = next((t for t in titles if t.lower() not in ex.question.lower()), "")
            step = Step(action="search", query=ex.question, retrieved_ids=[h.id for h in found])
            episodes.append(Episode(ex.id, ex.question, [step], answer, stop_reason="answer"))
        return episodes


class RetrieveOnly:
    trains = False

    def __init__(self, k: int = 20):
        self.k = k

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path) -> None:
        raise NotImplementedError("RetrieveOnly does not train")

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        hits = env.search([ex.question for ex in batch], self.k)
        return [
            Episode(
                ex.id,
                ex.question,
                [Step(action="search", query=ex.question, retrieved_ids=[h.id for h in found])],
                stop_reason="retrieve_only",
            )  # fmt: skip
            for ex, found in zip(batch, hits, strict=True)
        ]
