"""APEX-Searcher's Set-Equivalence Plan Reward, SEPR (arXiv:2603.13853v3 sec. 2.2.1; docs/methods/apex.md).

The planner's sub-questions P and the gold ones G are embedded by a sentence-transformer; sim(p, g) is
their cosine; the Hungarian algorithm finds the one-to-one matching of least total cost 1 − sim; the
matched pairs with sim ≥ τ form M; the reward is F1 = 2·Prec·Rec / (Prec + Rec) with Prec = |M| / |P| and
Rec = |M| / |G| (= 2|M| / (|P| + |G|)), 0 when M is empty. The section's three formulas (cosine, cost
matrix, F1) are cited by the section, sec. 2.2.1.

Choices where the paper is silent, or where we deviate, each a setting when it can matter:

- A plan is read by the planner's own protocol (:class:`rag_lab.env.protocols.apex.APEXPlan`: numbered
  lines ``1. …``). No numbered line (INVALID) scores 0.0, and so does an empty gold plan (no signal).
  The paper's fallback to the question itself is the policy's business, not the reward's.
- τ (``threshold``, default 0.7) is "empirically tuned" in the paper, its value unpublished. A pair
  counts when its similarity exceeds τ, as the paper says (≥ would differ only at exactly τ, which real
  cosines do not hit).
- Hungarian first, threshold second (the paper's order): the assignment maximises the total similarity,
  not the number of pairs above τ.
- The encoder is "a sentence-transformer" in the paper; MiniLM (offline) by default, any encoder of the
  retriever registry plugs in. Both sides are embedded as queries (the encoder's ``query_prefix``), the
  cosine computed here (rows normalised), texts deduplicated, one ``encode`` call per batch.
- References to earlier answers (``#1``, ``# 1``, ``#1's``) are rewritten the same way on both sides
  (:func:`normalize_placeholders`). ``placeholders="mask"`` (default) turns every one into ``#``: an index
  says where a step sits in its plan, and SEPR is meant to be robust to step order (a plan that
  interleaves its steps differently from the gold one numbers its references differently). ``"keep"``
  writes them ``#n``. ``#n`` is a reference only at a later step than n: MuSiQue has titles such as
  "#9 Dream" (``#9 Dream >> performer`` is a first step).
- MuSiQue writes many gold steps as Wikidata triples, ``#1 >> spouse``. ``triples="question"`` (default)
  embeds them as ``What is the spouse of #1?`` (measured with MiniLM: "Who is the spouse of #?" has
  cosine 0.97 with "What is the spouse of #?", 0.75 with "# >> spouse", near τ); ``"keep"``: as written.
- Duplicate sub-questions are not merged: the one-to-one matching leaves the copies unmatched.
"""

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from scipy.optimize import linear_sum_assignment

from rag_lab.core.config import OneOf, Probability, check_ranges
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import QAExample
from rag_lab.env.protocols.apex import APEXPlan
from rag_lab.env.protocols.base import PLAN
from rag_lab.rewards.answer import completion_text
from rag_lab.rewards.embedding import default_encoder, query_vectors

REFERENCE = re.compile(r"#\s*(\d+)")
TRIPLE = re.compile(r"^\s*(.+?)\s*>>\s*(.+?)\s*$")
MODES = ("keep", "mask")
TRIPLE_MODES = ("question", "keep")
PLANNER = APEXPlan()


def _check(key: str, value: Any, options: Sequence[str]) -> None:
    if value not in options:
        raise RagLabError(f"reward.{key}: {value!r} is not {' or '.join(options)}")


def normalize_placeholders(
    sub_question: str, mode: Literal["keep", "mask"] = "mask", step: int | None = None
) -> str:
    """Every reference to an earlier answer (``#1``, ``# 1``, ``#01``; ``#1's`` keeps its ``'s``) as
    ``#1`` (``mode="keep"``) or ``#`` (``"mask"``). With ``step`` (the sub-question's 1-based place in
    its plan) only ``#n`` with n < step is a reference; any other ``#n`` is text and stays as written.

    >>> [normalize_placeholders(q, "keep") for q in ("When was #1 born?", "When was # 1 born?", "#2's wife?")]
    ['When was #1 born?', 'When was #1 born?', "#2's wife?"]
    >>> normalize_placeholders("Is #1 older than # 2?"), normalize_placeholders("#1 >> spouse", step=2)
    ('Is # older than #?', '# >> spouse')
    >>> normalize_placeholders("#9 Dream >> performer", step=1), normalize_placeholders("#2 of #1", step=2)
    ('#9 Dream >> performer', '#2 of #')
    """
    _check("placeholders", mode, MODES)

    def rewrite(m: re.Match) -> str:
        n = int(m.group(1))
        if step is not None and not 1 <= n < step:
            return m.group(0)
        return "#" if mode == "mask" else f"#{n}"

    return REFERENCE.sub(rewrite, sub_question)


def question_form(sub_question: str) -> str:
    """MuSiQue's triple form ``subject >> relation`` as a question; any other text as it is.

    >>> question_form("#1 >> spouse"), question_form("Green >> performer"), question_form("Who is #1?")
    ('What is the spouse of #1?', 'What is the performer of Green?', 'Who is #1?')
    """
    m = TRIPLE.match(sub_question)
    return f"What is the {m.group(2)} of {m.group(1)}?" if m else sub_question


def gold_plan(example: QAExample) -> list[str]:
    """The gold sub-questions of an example's decomposition, as its dataset writes them.

    >>> from rag_lab.data.base import SubQuestion
    >>> steps = (SubQuestion("Green >> performer", "Steve Hillage"), SubQuestion("#1 >> spouse", "M. G."))
    >>> gold_plan(QAExample("q", "Who is the Green performer's spouse?", ("M. G.",), decomposition=steps))
    ['Green >> performer', '#1 >> spouse']
    """
    return [step.question for step in example.decomposition]


def plan_f1(similarity: np.ndarray, threshold: float) -> float:
    """SEPR on a |P| × |G| similarity matrix: Hungarian matching on cost 1 − sim, the matched pairs with
    sim > ``threshold`` kept, F1 = 2|M| / (|P| + |G|). An empty side scores 0.0.

    >>> plan_f1(np.array([[0.9, 0.8], [0.8, 0.1]]), 0.7)  # greedy takes 0.9 then 0.1 (F1 0.5)
    1.0
    >>> plan_f1(np.array([[0.95, 0.2, 0.1], [0.3, 0.6, 0.9]]), 0.7)  # |M| 2, |P| 2, |G| 3: 4 / 5
    0.8
    >>> round(plan_f1(np.array([[0.95], [0.5]]), 0.7), 6)  # |M| 1, |P| 2, |G| 1: 2 / 3
    0.666667
    >>> plan_f1(np.array([[0.5]]), 0.7), plan_f1(np.array([[0.7]]), 0.7), plan_f1(np.array([[0.71]]), 0.7)
    (0.0, 0.0, 1.0)
    >>> plan_f1(np.zeros((0, 2)), 0.7)
    0.0
    """
    sim = np.asarray(similarity, dtype=np.float64)
    if sim.size == 0:
        return 0.0
    rows, cols = linear_sum_assignment(1.0 - sim)
    matched = int((sim[rows, cols] > threshold).sum())
    return 2 * matched / (sim.shape[0] + sim.shape[1])


class SEPR:
    """SEPR over a batch: ``gold_plans`` (a dataset column, :func:`gold_plan` of each example) holds one
    list of gold sub-questions per completion. ``encoder``: anything with ``encode(texts) -> array``,
    MiniLM when None (built on first need); every sub-question of a batch is embedded in one call.

    >>> class Toy:  # fixed 2-d embeddings: cos(a, b) = 0, cos(a, c) = 0.6, cos(b, c) = 0.8
    ...     def encode(self, texts):
    ...         return np.array([{"a?": [2.0, 0.0], "b?": [0.0, 1.0], "c #?": [0.6, 0.8]}[t] for t in texts])
    >>> gold = ["a?", "b?", "c #1?"]
    >>> plans = ["1. a?\\n2. b?\\n3. c #1?", "1. b?\\n2. a?\\n3. c # 2?", "1. a?\\n2. c #1?", "a? then b?",
    ...          [{"role": "assistant", "content": "1. b?\\n2. b?"}]]
    >>> SEPR(Toy())(plans, [gold, gold, gold, gold, ["a?", "c #1?"]])  # same, reordered, one missing, none
    [1.0, 1.0, 0.8, 0.0, 0.5]
    >>> SEPR(Toy())(["1. b?"], [["c #?"]]), SEPR(Toy(), threshold=0.9)(["1. b?"], [["c #?"]])
    ([1.0], [0.0])
    """

    def __init__(
        self,
        encoder: Any = None,
        threshold: Probability = 0.7,
        # mask: every reference to an earlier answer becomes "#" (step order free); keep: "#n"
        placeholders: Annotated[str, OneOf(*MODES)] = "mask",
        # question: MuSiQue's "#1 >> spouse" is embedded as "What is the spouse of #1?"; keep: as written
        triples: Annotated[str, OneOf(*TRIPLE_MODES)] = "question",
    ):
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise RagLabError(f"reward.threshold: {threshold!r} is not a number in [0, 1]")
        settings = {"threshold": threshold, "placeholders": placeholders, "triples": triples}
        for key, why in check_ranges(SEPR, settings):
            raise RagLabError(f"reward.{key}: {why}")
        self.__name__ = "sepr"  # TRL logs a reward under its __name__: rewards/sepr/mean
        self.encoder = encoder
        self.threshold = float(threshold)
        self.placeholders = placeholders
        self.triples = triples

    def __call__(self, completions: list[Any], gold_plans: list[Sequence[str]], **_: Any) -> list[float]:
        predicted = [self._plan(c) for c in completions]
        golds = [self._normalized(g) for g in gold_plans]
        pairs = [(p, g) if p and g else None for p, g in zip(predicted, golds, strict=True)]
        texts = list(dict.fromkeys(q for pair in pairs if pair for plan in pair for q in plan))
        vectors = dict(zip(texts, self._vectors(texts), strict=True)) if texts else {}
        out = []
        for pair in pairs:
            if pair is None:
                out.append(0.0)
                continue
            p, g = (np.stack([vectors[q] for q in plan]) for plan in pair)
            out.append(plan_f1(p @ g.T, self.threshold))
        return out

    def _plan(self, completion: Any) -> list[str]:
        action = PLANNER.parse(completion_text(completion))
        return self._normalized(action.plan) if action.kind == PLAN else []

    def _normalized(self, plan: Sequence[str]) -> list[str]:
        plan = [normalize_placeholders(q, self.placeholders, step=i) for i, q in enumerate(plan, 1)]
        return [question_form(q) for q in plan] if self.triples == "question" else plan

    def _vectors(self, texts: list[str]) -> np.ndarray:
        if self.encoder is None:  # loaded on first use
            self.encoder = default_encoder()
        return query_vectors(self.encoder, texts)
