"""R3-RAG's rewards (arXiv:2505.23794 sec. 3.3.1, eqs. 2-6; docs/methods/r3rag.md): a scalar per step of a
trajectory, in two forms.

**The paper's** (:func:`paper_rewards`). Every step s gets eq. (5),

    r(s) = Val(s)·(Acc(a) + Rel(d)) + Val(s) − 1,

with Val the step's format validity (0/1), Acc the answer's correctness (eq. 2: match OR model judge)
on the final step only, Rel the judged relevance of the step's documents (0.0-1.0 in steps of 0.1,
eq. 3) on intermediate steps only; then eq. (6) scales every step by the trajectory's factor λ_T:
> 1 when the answer is correct, in (0, 1) when it is wrong, 1 on a format error.

**The official code's** (:func:`official_rewards`, github.com/Yuan-Li-FNLP/R3-RAG as we read it; the γ
values are the paper's appendix C): every step is its own PPO sample; the intermediate steps score their
process score × (1 + γ), γ = 0.6 correct, −0.2 incorrect, −0.1 when no answer came within the step limit;
the answer step scores 2.0 when correct, 0.0 when wrong; on a format error the earlier steps stay unscaled
and the failing step scores −0.9. Its process
score (:func:`process_score`) is a judge's coherence, rationality and relevance, 0.3 / 0.3 / 0.4, all
three 0 on a fatal error, relevance 0 with no documents; or the paper's Rel alone.

Choices where the paper is silent, each a setting:

- The paper gives γ (appendix C) but not how λ_T follows from it; the defaults are the official code's
  λ_T = 1 + γ (1.6 correct, 0.8 wrong), and a trajectory that ends without an answer at the step limit is
  "wrong" in the paper's form (it has no final step to score) unless ``factors["no_answer"]`` says otherwise.
- On a format error the paper's λ_T = 1, and eq. (5) gives the broken step Val = 0: r = −1.

The judges (correctness, relevance, process) are callables elsewhere (``rag_lab.eval.judge``); these
functions take their scores, so they are pure and exact. Hand-written: no library has these rewards.
"""

from collections.abc import Sequence
from typing import Literal

from rag_lab.core.errors import RagLabError

Outcome = Literal["correct", "incorrect", "no_answer", "format_error"]
OUTCOMES = ("correct", "incorrect", "no_answer", "format_error")
# λ_T = 1 + γ per outcome (the official code's γ_correct 0.6, γ_incorrect −0.2, γ_fail −0.1); a format
# error's λ_T is 1 by definition (eq. 6; the official code leaves those steps unscaled), not a setting.
FACTORS = {"correct": 1.6, "incorrect": 0.8, "no_answer": 0.9}
# The official code's answer-step rewards and its score of the step that broke the format.
ANSWER_RIGHT, ANSWER_WRONG, BROKEN_STEP = 2.0, 0.0, -0.9
# The official process score's weights: coherence, rationality, relevance.
PROCESS_WEIGHTS = (0.3, 0.3, 0.4)


def step_reward(valid: bool, final: bool, correct: bool = False, relevance: float = 0.0) -> float:
    """Eq. (5): Val·(Acc + Rel) + Val − 1, Acc on the final step only, Rel on intermediate steps only.

    >>> step_reward(True, final=False, relevance=0.7), step_reward(True, final=True, correct=True)
    (0.7, 1.0)
    >>> step_reward(True, final=True, correct=False), step_reward(False, final=False, relevance=0.9)
    (0.0, -1.0)
    """
    if not 0.0 <= relevance <= 1.0:
        raise RagLabError(f"r3rag reward: relevance must be in [0, 1], got {relevance}")
    val = 1.0 if valid else 0.0
    acc = float(correct) if final else 0.0
    rel = 0.0 if final else relevance
    return val * (acc + rel) + val - 1.0


def paper_rewards(
    relevances: Sequence[float],
    outcome: Outcome,
    factors: dict[str, float] | None = None,
) -> list[float]:
    """Eqs. (5)-(6) for a trajectory: its intermediate steps' judged ``relevances``, then, by
    ``outcome``, a final answer step (correct / incorrect), nothing (no_answer: the step limit came
    first) or a broken last step (format_error, the relevances being those of the valid steps before
    it). Each step's r(s) times λ_T (``factors``, default :data:`FACTORS`; format_error is 1, eq. 6).

    >>> [round(r, 6) for r in paper_rewards([0.5, 1.0], "correct")]
    [0.8, 1.6, 1.6]
    >>> [round(r, 6) for r in paper_rewards([0.5], "incorrect")], paper_rewards([0.5], "format_error")
    ([0.4, 0.0], [0.5, -1.0])
    """
    factor = _factor(outcome, factors, paper=True)
    rows = [step_reward(True, final=False, relevance=r) for r in relevances]
    if outcome in ("correct", "incorrect"):
        rows.append(step_reward(True, final=True, correct=outcome == "correct"))
    elif outcome == "format_error":
        rows.append(step_reward(False, final=False))
    return [r * factor for r in rows]


def process_score(
    coherence: float, rationality: float, relevance: float, fatal: bool = False, documents: bool = True
) -> float:
    """The official code's step score: 0.3·coherence + 0.3·rationality + 0.4·relevance, each in [0, 1];
    0 on a fatal error (a contradiction, illogical reasoning); relevance 0 when the step retrieved nothing.

    >>> round(process_score(1.0, 0.5, 0.5), 6), process_score(1.0, 1.0, 1.0, fatal=True)
    (0.65, 0.0)
    >>> round(process_score(1.0, 1.0, 1.0, documents=False), 6)
    0.6
    """
    scores = (coherence, rationality, relevance)
    if any(not 0.0 <= s <= 1.0 for s in scores):
        raise RagLabError(f"r3rag reward: process scores must be in [0, 1], got {scores}")
    if fatal:
        return 0.0
    c, r, rel = scores
    wc, wr, wrel = PROCESS_WEIGHTS
    return wc * c + wr * r + wrel * (rel if documents else 0.0)


def official_rewards(
    process: Sequence[float], outcome: Outcome, factors: dict[str, float] | None = None
) -> list[float]:
    """The official code's per-step rewards: the intermediate steps' ``process`` scores × λ_T, then
    the answer step (2.0 right, 0.0 wrong); no_answer has no answer step; format_error keeps the earlier
    steps unscaled and scores the broken step −0.9.

    >>> [round(r, 6) for r in official_rewards([0.5, 0.25], "correct")]
    [0.8, 0.4, 2.0]
    >>> [round(r, 6) for r in official_rewards([0.5], "no_answer")], official_rewards([0.5], "format_error")
    ([0.45], [0.5, -0.9])
    """
    if outcome == "format_error":
        return [*process, BROKEN_STEP]
    factor = _factor(outcome, factors, paper=False)
    rows = [p * factor for p in process]
    if outcome != "no_answer":
        rows.append(ANSWER_RIGHT if outcome == "correct" else ANSWER_WRONG)
    return rows


def _factor(outcome: str, factors: dict[str, float] | None, paper: bool) -> float:
    if outcome not in OUTCOMES:
        raise RagLabError(f"r3rag reward: outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
    unknown = sorted(set(factors or {}) - set(FACTORS))
    if unknown:
        raise RagLabError(f"reward.factors: unknown outcomes {unknown} (settable: {', '.join(FACTORS)})")
    table = FACTORS | (factors or {})
    if paper and outcome == "no_answer" and "no_answer" not in (factors or {}):
        outcome = "incorrect"
    return 1.0 if outcome == "format_error" else table[outcome]
