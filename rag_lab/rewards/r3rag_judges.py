"""R3-RAG's judges and its reward group, ``reward=r3rag`` (arXiv:2505.23794 sec. 3.3.1, eqs. 2-6;
docs/methods/r3rag.md): the scalar reward of every step of a finished episode, from an outcome judge and a
process judge.

- **Outcome** (eq. 2): the answer is correct when it matches a gold answer (EM under the dataset's official
  scorer) OR, with ``outcome_judge`` set, when a model says so. The official judge's question: does the
  prediction agree with the standard-answer list, True / False (:data:`OUTCOME_PROMPT`).
- **Process**, per search step, selectable (``process``):
  - ``support``: the share of the step's documents that are the question's gold supporting passages (the
    embedded world knows them: a judge-free stand-in for the relevance judge);
  - ``relevance``: the paper's eq. 3, a model rates the documents' relevance to the question, 0.0-1.0 in
    steps of 0.1 (:data:`RELEVANCE_PROMPT`);
  - ``official``: the official code's coherence / rationality / relevance, each 0.0-1.0, all 0 on a fatal
    error, combined 0.3 / 0.3 / 0.4 (:func:`rag_lab.rewards.r3rag.process_score`; :data:`OFFICIAL_PROMPT`).
- **Form** (``form``): ``official`` (λ_T = 1 + γ on the process scores, the answer step 2.0 / 0.0, a broken
  step −0.9: :func:`rag_lab.rewards.r3rag.official_rewards`) or ``paper`` (eqs. 5-6: ``paper_rewards``).
- **Parts** (``parts``): the paper's table 2 ablations drop one. Without ``process`` every process score is
  0; without ``outcome`` the answer step scores as a wrong one and λ_T is 1 (no trajectory factor).

A judge runs through any generator (``judge_generator``: null is the run's own; an OpenAI-compatible
endpoint or vLLM in the paper setup). An unparsable reply is a scored failure (outcome: wrong; process: 0),
counted in ``unparsed``, never a crash; a backend that fails is a one-line error naming it. The prompts are
ours (deviation: the official prompts are long; these ask the same questions). Each (question, documents)
and (prediction, golds) is asked once per judge (memo). Hand-written: prompts, a batched call, parsers.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Passage, QAExample
from rag_lab.env.episode import Episode
from rag_lab.env.protocols.base import ANSWER, SEARCH, passage_text
from rag_lab.eval.judge import ask_model
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.base import Sampling
from rag_lab.rewards.r3rag import FACTORS, official_rewards, paper_rewards, process_score

PROCESSES = ("support", "relevance", "official")
FORMS = ("official", "paper")
PARTS = ("process", "outcome")

OUTCOME_PROMPT = (
    "Question: {question}\nStandard answers: {golds}\nPrediction: {prediction}\n"
    "Does the prediction give the same answer as one of the standard answers? "
    "Reply with one word: True or False."
)
RELEVANCE_PROMPT = (
    "Question: {question}\nRetrieval query: {query}\nDocuments:\n{documents}\n"
    "How relevant are the documents to answering the question? Reply with one number from 0.0 to 1.0 in "
    "steps of 0.1."
)
OFFICIAL_PROMPT = (
    "Question: {question}\nEarlier steps:\n{history}\nThis step's analysis: {analysis}\n"
    "This step's query: {query}\nDocuments:\n{documents}\n"
    "Score this step, each from 0.0 to 1.0: coherence (consistent with the earlier steps), rationality (a "
    "sound decomposition of the question), relevance (of the documents to the query and the question); "
    "fatal: yes if the step contradicts itself or reasons illogically. Reply in one line as "
    "'coherence: X, rationality: Y, relevance: Z, fatal: yes/no'."
)
NUMBER = r"([01](?:\.\d+)?|\.\d+)"


def read_truth(text: str) -> bool | None:
    """True / False as the official outcome judge answers (also yes / no); None: unparsable.

    >>> read_truth(" True."), read_truth("false"), read_truth("maybe")
    (True, False, None)
    """
    word = text.strip().split()[0].strip(".,!:;\"'").lower() if text.strip() else ""
    return {"true": True, "yes": True, "false": False, "no": False}.get(word)


def read_relevance(text: str) -> float | None:
    """The first number in [0, 1], rounded to a tenth (eq. 3's scale); None: none there.

    >>> read_relevance("0.7"), read_relevance("Relevance: 1.0"), read_relevance("high")
    (0.7, 1.0, None)
    """
    for m in re.finditer(NUMBER, text):
        value = float(m.group(1))
        if 0.0 <= value <= 1.0:
            return round(value, 1)
    return None


def read_official(text: str) -> tuple[float, float, float, bool] | None:
    """(coherence, rationality, relevance, fatal) from one line of the official judge; None: unparsable.

    >>> read_official("coherence: 0.8, rationality: 0.5, relevance: 1.0, fatal: no")
    (0.8, 0.5, 1.0, False)
    """
    scores = [
        re.search(rf"{name}\s*[:=]\s*{NUMBER}", text, re.I)
        for name in ("coherence", "rationality", "relevance")
    ]
    fatal = re.search(r"fatal\s*[:=]\s*(yes|no|true|false)", text, re.I)
    if not all(scores) or fatal is None:
        return None
    values = [float(m.group(1)) for m in scores]
    if any(not 0.0 <= v <= 1.0 for v in values):
        return None
    return values[0], values[1], values[2], fatal.group(1).lower() in ("yes", "true")


def documents_text(passages: Sequence[Passage]) -> str:
    return "\n".join(passage_text(p) for p in passages) or "(none)"


@dataclass
class Judge:
    """Asks a generator batched questions, each once (memo), and counts the replies it could not read."""

    generator: Any = None
    max_new_tokens: int = 32
    memo: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    unparsed: int = 0

    def ask(self, prompts: Sequence[str], read) -> list[Any]:
        """``read(reply)`` per prompt (None where unparsable: counted)."""
        todo = list(dict.fromkeys(p for p in prompts if p not in self.memo))
        if todo:
            if self.generator is None:
                raise RagLabError(
                    "reward.judge_generator: the r3rag judges need a generator (null: the run's)"
                )
            sampling = Sampling(temperature=0.0, max_new_tokens=self.max_new_tokens)
            out = ask_model(self.generator, todo, sampling, "r3rag judge", RagLabError)
            self.calls += len(todo)
            for p, completions in zip(todo, out, strict=True):
                self.memo[p] = read(completions[0].text)
                self.unparsed += self.memo[p] is None
        return [self.memo[p] for p in prompts]


@dataclass
class R3RAGReward:
    """``reward=r3rag`` (module docstring): :meth:`score` gives each episode's per-step rewards."""

    form: str = "official"
    process: str = "support"
    # the ablations of table 2: which of process / outcome count
    parts: Sequence[str] = PARTS
    # λ_T per outcome (1 + γ; null: the official code's 1.6 / 0.8 / 0.9)
    factors: dict[str, float] | None = None
    # a model judge of the answer besides the match (eq. 2's OR); false: the match alone
    outcome_judge: bool = False
    # the generator the model judges ask (null: the run's own, set by the policy)
    judge_generator: Any = None
    scorer: str = "squad"

    def __post_init__(self):
        settings = {"form": self.form, "process": self.process, "parts": list(self.parts)}
        for key, why in self.check_settings(settings | {"factors": self.factors}, None):
            raise RagLabError(f"reward.{key}: {why}")
        self.parts = list(self.parts)
        self.judge = Judge(self.judge_generator)

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """Unknown form, process judge, parts or outcomes (:mod:`rag_lab.core.config`)."""
        problems = []
        if s["form"] not in FORMS:
            problems.append(("form", f"{s['form']!r} is not one of {', '.join(FORMS)}"))
        if s["process"] not in PROCESSES:
            problems.append(("process", f"{s['process']!r} is not one of {', '.join(PROCESSES)}"))
        if any(p not in PARTS for p in s["parts"]) or not s["parts"]:
            problems.append(("parts", f"{list(s['parts'])}: one or both of {', '.join(PARTS)}"))
        unknown = sorted(set(s.get("factors") or {}) - set(FACTORS))
        if unknown:
            problems.append(("factors", f"unknown outcomes {unknown} (settable: {', '.join(FACTORS)})"))
        return problems

    def score(self, episodes: Sequence[Episode], examples: Sequence[QAExample], docs) -> tuple[list, dict]:
        """(per episode, its steps' rewards; the batch's reward parts: process, outcome, accuracy, the
        outcomes' shares, the judges' unparsed replies). ``docs(episode_index, step_index)``: the passages a
        search step brought (what the judges read)."""
        outcomes = self.outcomes(episodes, examples)
        process = self.process_scores(episodes, examples, docs)
        rows = [self.rewards(ps, o) for ps, o in zip(process, outcomes, strict=True)]
        n = max(len(episodes), 1)
        searches = [p for ps in process for p in ps]
        parts = {
            "reward/process": sum(searches) / max(len(searches), 1),
            "reward/outcome": sum(
                r[-1] for r, o in zip(rows, outcomes, strict=True) if o in ("correct", "incorrect")
            )
            / n,
            "reward/step": sum(map(sum, rows)) / max(sum(map(len, rows)), 1),
            "rollout/acc": sum(o == "correct" for o in outcomes) / n,
            "rollout/format_failure": sum(o == "format_error" for o in outcomes) / n,
            "rollout/no_answer": sum(o == "no_answer" for o in outcomes) / n,
            "judge/unparsed": self.judge.unparsed,
        }
        return rows, parts

    def rewards(self, process: list[float], outcome: str) -> list[float]:
        """One episode's step rewards from its search steps' process scores and its outcome."""
        if "process" not in self.parts:
            process = [0.0] * len(process)
        factors = self.factors
        if "outcome" not in self.parts:
            factors = dict.fromkeys(FACTORS, 1.0)
            # every answer scores as a wrong one (0.0 in both forms) and λ_T is 1: no outcome signal
            outcome = "incorrect" if outcome == "correct" else outcome
        if self.form == "paper":
            return paper_rewards(process, outcome, factors)
        return official_rewards(process, outcome, factors)

    def outcomes(self, episodes: Sequence[Episode], examples: Sequence[QAExample]) -> list[str]:
        """correct / incorrect / no_answer / format_error per episode (eq. 2: match OR judge)."""
        em = SCORERS[self.scorer]["em"]
        out = []
        for ep, ex in zip(episodes, examples, strict=True):
            if ep.format_failure:
                out.append("format_error")
            elif ep.stop_reason != ANSWER:
                out.append("no_answer")
            else:
                out.append("correct" if em(ep.prediction, list(ex.answers)) == 1.0 else "incorrect")
        if self.outcome_judge:
            ask = [i for i, o in enumerate(out) if o == "incorrect" and episodes[i].prediction.strip()]
            prompts = [
                OUTCOME_PROMPT.format(
                    question=examples[i].question,
                    golds=", ".join(examples[i].answers),
                    prediction=episodes[i].prediction,
                )
                for i in ask
            ]
            for i, said in zip(ask, self.judge.ask(prompts, read_truth), strict=True):
                out[i] = "correct" if said else "incorrect"
        return out

    def process_scores(self, episodes, examples, docs) -> list[list[float]]:
        """Per episode, each search step's process score (the steps before an answer or a broken step)."""
        where = [
            (i, j) for i, ep in enumerate(episodes) for j, s in enumerate(ep.steps) if s.action == SEARCH
        ]
        if self.process == "support":
            values = [support(episodes[i].steps[j].retrieved_ids, examples[i]) for i, j in where]
        elif self.process == "relevance":
            prompts = [
                RELEVANCE_PROMPT.format(
                    question=examples[i].question,
                    query=episodes[i].steps[j].query,
                    documents=documents_text(docs(i, j)),
                )
                for i, j in where
            ]
            values = [v or 0.0 for v in self.judge.ask(prompts, read_relevance)]
        else:
            prompts = [self.official_prompt(episodes[i], examples[i], j, docs(i, j)) for i, j in where]
            values = [
                0.0 if v is None else process_score(*v[:3], fatal=v[3], documents=bool(docs(i, j)))
                for v, (i, j) in zip(self.judge.ask(prompts, read_official), where, strict=True)
            ]
        scores: list[list[float]] = [[] for _ in episodes]
        for (i, _), v in zip(where, values, strict=True):
            scores[i].append(v)
        return scores

    @staticmethod
    def official_prompt(ep: Episode, ex: QAExample, j: int, passages: Sequence[Passage]) -> str:
        history = "\n".join(f"Step {n + 1}: {s.text.strip()}" for n, s in enumerate(ep.steps[:j])) or "(none)"
        step = ep.steps[j]
        analysis = step.text.split("\n")[0].removeprefix("The problem analysis:").strip()
        return OFFICIAL_PROMPT.format(
            question=ex.question,
            history=history,
            analysis=analysis,
            query=step.query,
            documents=documents_text(passages),
        )


def support(retrieved: Sequence[str], example: QAExample) -> float:
    """The share of ``retrieved`` that are ``example``'s gold supporting passages (0 with none retrieved).

    >>> support(["a", "b", "c", "d"], QAExample("q", "?", ("x",), supporting_ids=("b", "d")))
    0.5
    """
    if not retrieved:
        return 0.0
    gold = set(example.supporting_ids)
    return sum(pid in gold for pid in retrieved) / len(retrieved)
