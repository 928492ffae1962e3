"""The multi-stage-reward DAPO paper's rewards (OpenReview XVtORJ0AXN sec. 3.3; docs/methods/dapo.md),
r_sum = r_a + r_s + r_f (eq. 12), each a pure function of TRL's reward signature over whole rollouts.

A completion is the rollout text: the policy's turns with the engine's ``<information>`` blocks between
them (:meth:`rag_lab.env.protocols.tagged.DAPOTagged.rollout_text`). The searches and the answer are read
from the policy's own text only (tags inside retrieved passages do not count).

Choices where the paper is silent, each a setting:

- "Concise" (eq. 9) is rule-based in the paper, its rules unpublished beyond "avoid redundant question
  words, prepositions, and irrelevant modifiers" (sec. 3.3). Ours (:func:`concise`): no question word,
  no preposition, no filler word (the modifiers), no question mark, at most ``max_words`` words; the
  word lists are settings. An empty query is not concise.
- Eq. (8) sums the cosine over the pairs i < j but divides by N(N−1), half the mean its text describes.
  ``normalization="mean"`` (default) is the mean over pairs; ``"eq8"`` the formula as printed.
- The paper's search reward embeds with Qwen3-Embedding; any encoder of the retriever registry plugs in
  (MiniLM offline by default), with its query prefix if it has one. The cosine is computed here (rows
  normalised), whatever the encoder does.
- "Correct" is the paper's LLM judge (``correct="judge"``, any ``judge(predictions, golds)`` callable,
  e.g. :class:`rag_lab.eval.judge.LLMJudge`) or a string rule: EM, or Acc (a normalised gold occurs in
  the answer), both SQuAD-normalised. The shipped yaml uses EM. No ``<answer>`` is wrong.
- The "unified" single-stage reward of its table 2 ("answer rewards for both correct and incorrect
  responses are directly tied to the number of retrievals"), in our reading: 1 − β·RC if correct,
  −1 + β·RC if not.
- RC counts the ``<search>`` tags of the policy's text, empty queries included.
"""

import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import numpy as np

from rag_lab.core.config import NonNegative, OneOf, PositiveInt, check_ranges
from rag_lab.core.errors import RagLabError
from rag_lab.env.protocols.tagged import INFORMATION, structure_ok
from rag_lab.eval.metrics import SCORERS
from rag_lab.rewards.answer import completion_text
from rag_lab.rewards.base import Reward
from rag_lab.rewards.embedding import default_encoder, query_vectors

SEARCH = re.compile(r"<search>(.*?)</search>", re.S)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
QUESTION_WORDS = ("what", "who", "whom", "whose", "when", "where", "which", "why", "how")
# the paper names prepositions among what a concise query avoids
PREPOSITIONS = tuple(
    "of in on at by for with from to about into onto over under between among through during before after "
    "near within without across along around behind beyond against toward towards upon".split()
)
FILLERS = (
    "please",
    "tell",
    "me",
    "find",
    "search",
    "information",
    "about",
    "some",
    "exactly",
    "really",
    "very",
)


def own_text(completion: Any) -> str:
    """The policy's own text of a rollout: the information blocks cut out."""
    return INFORMATION.sub("\n", completion_text(completion))


def searches(completion: Any) -> list[str]:
    """The policy's ``<search>`` queries, stripped, in order (RC is their number).

    >>> searches("<think>a</think>\\n<search> x y </search>"
    ...          "\\n<information>\\n<search>z</search>\\n</information>\\n<search>w</search>")
    ['x y', 'w']
    """
    return [q.strip() for q in SEARCH.findall(own_text(completion))]


def final_answer(completion: Any) -> str | None:
    """The last ``<answer>`` of the policy's own text, stripped (None: it never answered).

    >>> final_answer("<reflect>b</reflect>\\n<answer> Paris </answer>"), final_answer("<think>a</think>")
    ('Paris', None)
    """
    found = ANSWER.findall(own_text(completion))
    return found[-1].strip() if found else None


def format_reward(completions: list[Any], **_: Any) -> list[float]:
    """r_f, eq. (6): 1.0 when the rollout is one of the two allowed structures (``<think>`` then
    ``<reflect><answer>``, or ``<think>`` then rounds of ``<search><information><reflect>`` ending in
    ``<answer>``), else −1.0.

    >>> format_reward(["<think>a</think>\\n<reflect>b</reflect>\\n<answer>c</answer>",
    ...                "<think>a</think>\\n<answer>c</answer>"])
    [1.0, -1.0]
    """
    return [1.0 if structure_ok(completion_text(c)) else -1.0 for c in completions]


def concise(
    query: str,
    max_words: PositiveInt = 10,
    question_words: Sequence[str] = QUESTION_WORDS,
    fillers: Sequence[str] = FILLERS,
    prepositions: Sequence[str] = PREPOSITIONS,
) -> bool:
    """Eq. (9)'s "concise" query, our rule (the paper's is unpublished): keywords, not a sentence. At
    most ``max_words`` words, none of them (case-insensitively) a question word, a preposition or a filler,
    no '?'.

    >>> concise("Lia Kriaburg birthplace"), concise("Where was Lia Kriaburg born"), concise("Lia born?")
    (True, False, False)
    >>> concise("birthplace of Lia Kriaburg"), concise("birthplace of Lia", prepositions=())
    (False, True)
    >>> concise("Please find Lia"), concise("a b c d e f g h i j k"), concise(""), concise("a b", max_words=1)
    (False, False, False, False)
    """
    words = re.findall(r"[\w'-]+", query.lower())
    banned = {w.lower() for w in (*question_words, *fillers, *prepositions)}
    return 0 < len(words) <= max_words and "?" not in query and not banned.intersection(words)


class SearchReward:
    """r_s, eq. (9): RC ≤ 1: 0.0 when the query is concise (or there is none), −1.0 when not; RC > 1:
    minus the average pairwise cosine (eq. 7) of the queries' embeddings, averaged as ``normalization``
    says (eq. 8, see the module docstring). ``encoder``: anything with ``encode(texts) -> array``,
    MiniLM when None (built on first need); all queries of a batch are embedded in one call.

    >>> class Toy:  # fixed 2-d embeddings: cos(a, b) = 0.6, cos(a, c) = 0, cos(b, c) = 0.8
    ...     def encode(self, texts):
    ...         return np.array([{"a": [1.0, 0.0], "b": [0.6, 0.8], "c": [0.0, 2.0]}[t] for t in texts])
    >>> q = lambda *qs: "".join(f"<search>{x}</search>" for x in qs)
    >>> r = SearchReward(Toy())
    >>> [round(x, 6) for x in r(["<answer>x</answer>", q("a"), q("how a"), q("a", "b"), q("a", "b", "c")])]
    [0.0, 0.0, -1.0, -0.6, -0.466667]
    >>> [round(x, 6) for x in SearchReward(Toy(), normalization="eq8")([q("a", "b"), q("a", "b", "c")])]
    [-0.3, -0.233333]
    """

    def __init__(
        self,
        encoder: Any = None,
        # "mean": the mean over the N(N-1)/2 pairs; "eq8": eq. (8) as printed (divided by N(N-1))
        normalization: Annotated[str, OneOf("mean", "eq8")] = "mean",
        max_words: PositiveInt = 10,
        question_words: Sequence[str] = QUESTION_WORDS,
        fillers: Sequence[str] = FILLERS,
        prepositions: Sequence[str] = PREPOSITIONS,
    ):
        if normalization not in ("mean", "eq8"):
            raise RagLabError(f"reward.normalization: {normalization!r} is not mean or eq8")
        self.__name__ = "search"  # TRL logs a reward under its __name__: rewards/search/mean
        self.encoder = encoder
        self.normalization = normalization
        # plain attributes (not a dict): a policy's cache key reads them
        self.max_words = max_words
        self.question_words = tuple(question_words)
        self.fillers = tuple(fillers)
        self.prepositions = tuple(prepositions)

    def __call__(self, completions: list[Any], **_: Any) -> list[float]:
        queries = [searches(c) for c in completions]
        several = [q for qs in queries if len(qs) > 1 for q in qs]
        vectors = iter(self._vectors(several) if several else [])
        rule = {
            "max_words": self.max_words,
            "question_words": self.question_words,
            "fillers": self.fillers,
            "prepositions": self.prepositions,
        }
        out = []
        for qs in queries:
            n = len(qs)
            if n <= 1:
                out.append(0.0 if all(concise(q, **rule) for q in qs) else -1.0)
                continue
            m = np.stack([next(vectors) for _ in qs])
            pair_sum = float((m @ m.T)[np.triu_indices(n, k=1)].sum())
            pairs = n * (n - 1) / 2 if self.normalization == "mean" else n * (n - 1)
            out.append(-pair_sum / pairs)
        return out

    def _vectors(self, texts: list[str]) -> np.ndarray:
        if self.encoder is None:  # loaded on first use
            self.encoder = default_encoder()
        return query_vectors(self.encoder, texts)


def correctness(
    completions: list[Any],
    answers: list[list[str]],
    correct: Annotated[str, OneOf("em", "acc", "judge")] = "em",
    judge: Callable[[list[str], list[list[str]]], list[float]] | None = None,
) -> list[bool]:
    """Whether each rollout's final answer is right: EM or Acc (SQuAD rules), or ``judge(predictions,
    golds)`` (one batched call over the rollouts that answered). No ``<answer>``: wrong.

    >>> rollouts = ["<answer>Paris</answer>", "<answer>in Paris</answer>", "Paris"]
    >>> correctness(rollouts, [["Paris"]] * 3, "em"), correctness(rollouts, [["Paris"]] * 3, "acc")
    ([True, False, False], [True, True, False])
    """
    if correct not in ("em", "acc", "judge"):
        raise RagLabError(f"reward.correct: {correct!r} is not em, acc or judge")
    if correct == "judge" and judge is None:
        raise RagLabError("reward.correct: judge needs reward.judge (an LLM judge, e.g. judge=llm's)")
    predictions = [final_answer(c) for c in completions]
    asked = [i for i, p in enumerate(predictions) if p is not None]
    if correct == "judge":
        verdicts = judge([predictions[i] for i in asked], [list(answers[i]) for i in asked]) if asked else []
        right = {i for i, v in zip(asked, verdicts, strict=True) if v > 0}
    else:
        score = SCORERS["squad"][correct]
        right = {i for i in asked if score(predictions[i], list(answers[i])) > 0}
    return [i in right for i in range(len(completions))]


def multistage_answer(
    completions: list[Any],
    answers: list[list[str]],
    stage: Annotated[int | str, OneOf(1, 2, "unified")] = 1,
    beta: NonNegative = 0.3,
    correct: Annotated[str, OneOf("em", "acc", "judge")] = "em",
    judge: Callable[[list[str], list[list[str]]], list[float]] | None = None,
    **_: Any,
) -> list[float]:
    """r_a. Stage 1, eq. (10): 1.0 if correct, else −1.0 + β·RC. Stage 2, eq. (11): 1.0 − β·RC if
    correct, else −1.0. ``"unified"`` (table 2, our reading): 1 − β·RC if correct, −1 + β·RC if not.

    >>> right, wrong = "<search>q</search><search>r</search><answer>Paris</answer>", "<answer>Rome</answer>"
    >>> rollouts = [right, wrong, "<search>q</search><answer>Rome</answer>"]
    >>> [multistage_answer(rollouts, [["Paris"]] * 3, stage=s) for s in (1, 2, "unified")]
    [[1.0, -1.0, -0.7], [0.4, -1.0, -1.0], [0.4, -1.0, -0.7]]
    """
    if stage not in (1, 2, "unified"):
        raise RagLabError(f"reward.stage: {stage!r} is not 1, 2 or unified")
    out = []
    for ok, c in zip(correctness(completions, answers, correct, judge), completions, strict=True):
        rc = len(searches(c))
        if ok:
            r = 1.0 - (beta * rc if stage != 1 else 0.0)
        else:
            r = -1.0 + (beta * rc if stage != 2 else 0.0)
        # 1 - 0.3 * 3 is 0.10000000000000009 in floats: rewards that are equal on paper compare equal
        out.append(round(r, 10))
    return out


def check_answer_settings(s: dict, run) -> list[tuple[str, str]]:
    """r_a's settings, checked when the config is (:mod:`rag_lab.core.config`)."""
    problems = check_ranges(multistage_answer, s)  # the declared ones (a direct call has no config)
    if s["correct"] == "judge" and not s["judge"]:
        problems.append(
            ("judge", "correct=judge needs a judge (a judge config, e.g. rag_lab.eval.judge.LLMJudge)")
        )
    return problems


multistage_answer.check_settings = check_answer_settings


def reward_terms(beta: float | None = None, **terms: Reward | None) -> dict[str, Reward]:
    """r_sum, eq. (12), as its terms by name (``reward=dapo``: answer, search, format); the trainer sums
    them (a policy's weights per name). A null term is left out: the ablations' "w/o r_s", "w/o r_a".
    ``beta`` is the group's β, which the answer term reads from the config (``conf/reward/dapo.yaml``); it is
    no term.

    >>> sorted(reward_terms(format=format_reward, search=None))
    ['format']
    """
    return {name: fn for name, fn in terms.items() if fn is not None}


def retrieval_count(completions: list[Any], **_: Any) -> list[float]:
    """RC, a monitor (weight 0 in training): the number of searches.

    >>> retrieval_count(["<search>a</search><search>b</search>", "<answer>x</answer>"])
    [2.0, 0.0]
    """
    return [float(len(searches(c))) for c in completions]


def answer_correct(
    completions: list[Any],
    answers: list[list[str]],
    correct: Annotated[str, OneOf("em", "acc")] = "acc",
    **_: Any,
) -> list[float]:
    """Acc, a monitor (weight 0): 1.0 where the final answer is right (Acc by default, the paper's metric
    without its judge).

    >>> answer_correct(["<answer>the Paris</answer>", "<answer>in Paris</answer>", "<answer>Rome</answer>"],
    ...                [["Paris"]] * 3), answer_correct(["<answer>in Paris</answer>"], [["Paris"]], "em")
    ([1.0, 1.0, 0.0], [0.0])
    """
    return [float(ok) for ok in correctness(completions, answers, correct)]
