"""EVO-RAG's seven step rewards and their time-dynamic weights (arXiv:2505.17391 sec. 3.2, 3.6 and table 1;
docs/methods/evorag.md): R_t = Σ_k w_k(t) r_k(s_t, a_t), with w_k(t) = (1 − p) w_k^start + p w_k^end,
p = t / T_max, and each stage's start / end from table 1 (stage 1 Discovery, stage 2 Refinement).

Per step t of an episode (1-based), with a_t the step's action:

- ``ret``  r_ret = +1 if a_t is SEARCH and its documents hold a gold supporting passage, −1 if they
  hold none, 0 for other actions;
- ``act``  r_act = −1[r_dup < 0] for a SEARCH with p(t) ≥ 0.3, else 0;
- ``dup``  r_dup = −max_{j<t} cos(q_t, q_j) over the episode's earlier sub-queries (all-MiniLM-L6-v2
  in the paper; any encoder of the retriever registry here), for a SEARCH;
- ``bt``   r_bt = −1 on BACKTRACK;
- ``ref``  r_ref = +1 for REFUSE on an unanswerable question, −1 on an answerable one;
- ``step`` r_step = −1 every step;
- ``ans``  r_ans = (EM + F1) / 2 of the final answer, at the ANSWER step (the official scorer of the
  data set, ``rag_lab.eval.metrics``).

Choices where the paper is silent or reads two ways, each written down:

- The first SEARCH has no earlier query: r_dup = 0 there (the max over an empty set), so it never
  pays r_act. A step that is not a SEARCH scores 0 for ``ret``, ``dup`` and ``act``.
- r_act's p(t) = t / T (its sec. 3.2) is read as t / T_max, the scheduler's p (sec. 3.6): T, the
  episode's last step, is unknown when the step is taken.
- With cosine r_dup, ``r_dup < 0`` holds for any earlier query at positive similarity, which with a
  sentence encoder is nearly every one: r_act is then −1 for almost every late SEARCH, as written.
- Sec. 3.2's text says λ "increases linearly from 0.4 to 1.2"; its table 1 has λ fall 1.5 → 0.8 → 0.4.
  We follow table 1, where every weight's schedule is given.
- "Unanswerable" is the paper's LLM verifier's judgement of the evidence; on the synthetic world the
  question's own flag (``QAExample.answerable``: a withheld fact) is exact, and any data set with the
  flag uses it. A broken step (the protocol could not parse it) scores only r_step.
- ``schedule="fixed"``, its table 4's two-stage curriculum without the in-episode schedule: each
  weight is the mean of its stage's start and end (the paper does not give the fixed values).
  ``schedule="flat"``: every weight 1, for table 4's "No Reward" row (``components=["ans"]``: R is the
  answer's (EM + F1) / 2; under table 1's κ ≤ 0.1 of Discovery no two branches would differ by δ).
- "Unanswerable" comes from the data set's flag (``refusal="flag"``) or from an LLM verifier of the
  evidence (``refusal="verifier"``: :mod:`rag_lab.rewards.evorag_verifier`), asked only about episodes
  that end in REFUSE (r_ref is 0 on every other step); its unparsable reply counts as "answerable"
  (the refusal scores −1: a scored failure, counted).

Hand-written: no library has these rewards. They score finished episodes (``rag_lab.env.Episode``),
all of a batch's sub-queries embedded in one encoder call.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from rag_lab.core.errors import RagLabError
from rag_lab.data.base import QAExample
from rag_lab.env.episode import Episode
from rag_lab.env.protocols.base import ANSWER, BACKTRACK, REFUSE, SEARCH
from rag_lab.eval.metrics import SCORERS
from rag_lab.rewards.embedding import default_encoder, query_vectors

# The order of the paper's weight vector w(t) = (β, λ, γ, δ, ρ, η, κ).
COMPONENTS = ("ret", "act", "dup", "bt", "ref", "step", "ans")
# Table 1: each weight's (start, end) in stage 1 (Discovery: Start → Mid) and stage 2 (Refinement: Mid → End).
TABLE_1 = {
    1: {
        "ret": (2.0, 1.0),
        "act": (1.5, 0.8),
        "dup": (0.1, 0.5),
        "bt": (0.3, 0.5),
        "ref": (0.5, 0.5),
        "step": (0.02, 0.05),
        "ans": (0.05, 0.10),
    },
    2: {
        "ret": (1.0, 0.5),
        "act": (0.8, 0.4),
        "dup": (0.5, 1.2),
        "bt": (0.5, 1.0),
        "ref": (0.5, 0.5),
        "step": (0.05, 0.10),
        "ans": (0.10, 1.00),
    },
}
# r_act charges late searches from this share of T_max on.
LATE = 0.3
SCHEDULES = ("dynamic", "fixed", "flat")


def weights(
    stage: int, t: int, t_max: int = 20, schedule: Literal["dynamic", "fixed", "flat"] = "dynamic"
) -> dict:
    """w_k(t) of every component at step ``t`` (1-based) of a ``stage`` episode (sec. 3.6); p is capped at 1.

    >>> w = weights(1, 10)
    >>> w["ret"], w["dup"], w["ref"]
    (1.5, 0.3, 0.5)
    >>> round(weights(2, 20)["ans"], 6), round(weights(2, 5, schedule="fixed")["ans"], 6)
    (1.0, 0.55)
    >>> weights(1, 3, schedule="flat")["ans"]
    1.0
    """
    if stage not in TABLE_1:
        raise RagLabError(f"reward.stage must be 1 or 2 (table 1's stages), got {stage!r}")
    if schedule not in SCHEDULES:
        raise RagLabError(f"reward.schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if schedule == "flat":
        return dict.fromkeys(TABLE_1[stage], 1.0)
    p = 0.5 if schedule == "fixed" else min(t / t_max, 1.0)
    return {k: (1 - p) * start + p * end for k, (start, end) in TABLE_1[stage].items()}


def retrieval_bonus(action: str, retrieved_ids: Sequence[str], gold_ids: Sequence[str]) -> float:
    """r_ret: +1 / −1 for a SEARCH that does / does not bring back a gold supporting passage, else 0.

    >>> retrieval_bonus("search", ["p1", "p7"], ["p7"]), retrieval_bonus("search", ["p1"], ["p7"])
    (1.0, -1.0)
    >>> retrieval_bonus("answer", [], ["p7"])
    0.0
    """
    if action != SEARCH:
        return 0.0
    return 1.0 if set(retrieved_ids) & set(gold_ids) else -1.0


def overlap_penalty(similarities: Sequence[float]) -> float:
    """r_dup: minus the largest cosine to an earlier sub-query; 0 with none.

    >>> overlap_penalty([0.2, 0.9, -0.1]), overlap_penalty([])
    (-0.9, 0.0)
    """
    return -float(max(similarities)) if len(similarities) else 0.0


def action_penalty(action: str, p: float, dup: float) -> float:
    """r_act: −1 for a SEARCH from p = 0.3 on that overlaps an earlier one (r_dup < 0), else 0.

    >>> action_penalty("search", 0.3, -0.4), action_penalty("search", 0.25, -0.4)
    (-1.0, 0.0)
    >>> action_penalty("search", 0.5, 0.0), action_penalty("backtrack", 0.5, -0.4)
    (0.0, 0.0)
    """
    return -1.0 if action == SEARCH and p >= LATE and dup < 0 else 0.0


def refusal_reward(action: str, answerable: bool) -> float:
    """r_ref: +1 refusing an unanswerable question, −1 refusing an answerable one, 0 otherwise.

    >>> refusal_reward("refuse", False), refusal_reward("refuse", True), refusal_reward("answer", False)
    (1.0, -1.0, 0.0)
    """
    if action != REFUSE:
        return 0.0
    return -1.0 if answerable else 1.0


def answer_reward(action: str, prediction: str, answers: Sequence[str], scorer: str = "squad") -> float:
    """r_ans: (EM + F1) / 2 of ``prediction`` against the gold ``answers`` on the ANSWER step, else 0.

    >>> answer_reward("answer", "Paris", ["Paris"]), answer_reward("answer", "Paris France", ["Paris"])
    (1.0, 0.3333333333333333)
    >>> answer_reward("refuse", "", ["Paris"])
    0.0
    """
    if action != ANSWER:
        return 0.0
    metrics = SCORERS[scorer]
    return (
        float(metrics["em"](prediction, list(answers))) + float(metrics["f1"](prediction, list(answers)))
    ) / 2


def step_rewards(
    episodes: Sequence[Episode],
    examples: Sequence[QAExample],
    encoder: Any = None,
    t_max: int = 20,
    scorer: str = "squad",
    answerable: Sequence[bool] | None = None,
) -> list[list[dict[str, float]]]:
    """The raw seven-component vector r_t of every step of every episode (``examples`` in the same
    order). The sub-queries of all the episodes are embedded in one call (``encoder``: any with
    ``encode(texts)``; MiniLM when None). ``answerable[i]`` (a verifier's verdict) replaces example i's
    flag in r_ref."""
    if len(episodes) != len(examples):
        raise RagLabError(f"step_rewards: {len(episodes)} episodes for {len(examples)} examples")
    flags = list(answerable) if answerable is not None else [ex.answerable for ex in examples]
    queries = sorted({s.query or "" for ep in episodes for s in ep.steps if s.action == SEARCH})
    vectors = {}
    if queries:
        rows = query_vectors(encoder if encoder is not None else default_encoder(), queries)
        vectors = dict(zip(queries, rows, strict=True))
    out = []
    for episode, example, flag in zip(episodes, examples, flags, strict=True):
        earlier: list[np.ndarray] = []
        rows = []
        for t, step in enumerate(episode.steps, start=1):
            dup = 0.0
            if step.action == SEARCH:
                q = vectors[step.query or ""]
                dup = overlap_penalty([float(q @ v) for v in earlier])
                earlier.append(q)
            rows.append(
                {
                    "ret": retrieval_bonus(step.action, step.retrieved_ids, example.supporting_ids),
                    "act": action_penalty(step.action, t / t_max, dup),
                    "dup": dup,
                    "bt": -1.0 if step.action == BACKTRACK else 0.0,
                    "ref": refusal_reward(step.action, flag),
                    "step": -1.0,
                    "ans": answer_reward(
                        step.action, step.answer or episode.prediction, example.answers, scorer
                    ),
                }
            )
        out.append(rows)
    return out


def weighted(
    rows: Sequence[dict[str, float]],
    stage: int,
    t_max: int = 20,
    schedule: Literal["dynamic", "fixed", "flat"] = "dynamic",
    components: Sequence[str] = COMPONENTS,
) -> list[float]:
    """R_t = Σ_k w_k(t) r_k for each step of one episode (``components``: the ones switched on, for
    the paper's reward-combination ablations, its tables 5 and 6).

    >>> rows = [dict.fromkeys(COMPONENTS, 0.0) | {"ret": 1.0, "step": -1.0}]
    >>> [round(r, 6) for r in weighted(rows, stage=1, t_max=10)]
    [1.877]
    >>> [round(r, 6) for r in weighted(rows, stage=1, t_max=10, components=["step"])]
    [-0.023]
    """
    unknown = sorted(set(components) - set(COMPONENTS))
    if unknown:
        raise RagLabError(f"reward.components: unknown {unknown} (known: {', '.join(COMPONENTS)})")
    out = []
    for t, row in enumerate(rows, start=1):
        w = weights(stage, t, t_max, schedule)
        out.append(sum(w[k] * row[k] for k in components))
    return out


def episode_return(
    rows: Sequence[dict[str, float]],
    stage: int,
    t_max: int = 20,
    schedule: str = "dynamic",
    components: Sequence[str] = COMPONENTS,
) -> float:
    """R(x) = Σ_t w(t)·r_t of a whole branch (sec. 3.3): a sibling forked at step t of an episode holds
    the episode's first t − 1 steps, so its own steps are weighted from w(t), and the shared prefix adds
    the same to every sibling of the state.

    >>> rows = [dict.fromkeys(COMPONENTS, 0.0) | {"step": -1.0}] * 2
    >>> round(episode_return(rows, stage=1, t_max=10), 6)  # -(0.023 + 0.026)
    -0.049
    """
    return sum(weighted(rows, stage, t_max, schedule, components))


@dataclass
class EvoRAGReward:
    """``reward=evorag``: which of the seven components count, under which weight schedule, and where
    "unanswerable" comes from (module docstring). It scores whole episodes (:meth:`returns`), not TRL
    completions: EVO-RAG's trainer compares rolled-out branches."""

    schedule: str = "dynamic"
    components: Sequence[str] = COMPONENTS
    # flag: the data set's answerable flag; verifier: an LLM's verdict on the evidence (evorag_verifier)
    refusal: str = "flag"
    verifier: Any = None
    # r_dup's sentence encoder (MiniLM when None)
    encoder: Any = None
    scorer: str = "squad"

    def __post_init__(self):
        for key, why in self.check_settings(
            {"schedule": self.schedule, "components": list(self.components), "refusal": self.refusal}, None
        ):
            raise RagLabError(f"reward.{key}: {why}")
        self.components = list(self.components)
        if self.refusal == "verifier" and self.verifier is None:
            from rag_lab.rewards.evorag_verifier import EvidenceVerifier

            self.verifier = EvidenceVerifier()

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """An unknown schedule, component or refusal source; no component (:mod:`rag_lab.core.config`)."""
        problems = []
        if s["schedule"] not in SCHEDULES:
            problems.append(("schedule", f"{s['schedule']!r} is not a schedule ({', '.join(SCHEDULES)})"))
        unknown = [c for c in s["components"] if c not in COMPONENTS]
        if unknown:
            problems.append(("components", f"unknown {unknown} (known: {', '.join(COMPONENTS)})"))
        if not s["components"]:
            problems.append(("components", "empty: no component would score a branch"))
        if s["refusal"] not in ("flag", "verifier"):
            problems.append(("refusal", f"{s['refusal']!r} is not 'flag' or 'verifier'"))
        return problems

    def returns(
        self,
        episodes: Sequence[Episode],
        examples: Sequence[QAExample],
        stage: int,
        t_max: int,
        evidence: Sequence[Sequence] | None = None,
    ) -> list[float]:
        """R(x) of each episode. With ``refusal="verifier"``, ``evidence[i]`` is the passages episode i
        held when it ended (D≤t)."""
        answerable = None
        if self.refusal == "verifier":
            answerable = self.verifier.answerable(episodes, examples, evidence)
        rows = step_rewards(episodes, examples, self.encoder, t_max, self.scorer, answerable)
        return [episode_return(r, stage, t_max, self.schedule, self.components) for r in rows]
