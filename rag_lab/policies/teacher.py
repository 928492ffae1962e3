"""``policy=teacher``: the world teacher (a rule-based SIMULATOR, rag_lab.env.teacher) run as a
policy on the embedded world: the ceiling a learned policy can approach with the same retriever.

It follows each question's gold decomposition (sub-questions only, never answers) and reads
answers from what it retrieves; it only works on ``data=synth``, whose sentences it can parse.
"""

from pathlib import Path

from rag_lab.core.config import PositiveInt, takes
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode, Step
from rag_lab.env.teacher.agent import Noise, WorldTeacher


class TeacherPolicy:
    trains = False

    @takes(Noise, drop=["distraction"])
    def __init__(
        self,
        # passages per search
        k: PositiveInt = 5,
        # seeds the noise draws
        seed: int = 0,
        **noise: float,
    ):
        self.k = k
        self.teacher = WorldTeacher(k, Noise(**noise), seed)

    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        raise NotImplementedError("the teacher does not train")

    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        def search(queries, questions):
            return [env.passages(hits) for hits in env.search(queries, self.k, questions=questions)]

        episodes = []
        for ex, trace in zip(batch, self.teacher.solve(batch, search), strict=True):
            steps = [
                Step(text=s.answer or "", action="search", query=s.query, retrieved_ids=s.passage_ids)
                for s in trace.steps
            ]
            reason = "answer" if trace.answer else "no_evidence"
            episodes.append(Episode(ex.id, ex.question, steps, trace.answer, stop_reason=reason))
        return episodes
