"""EM / F1 / Acc with each dataset's official rules, and retrieval precision / recall.

Every scorer normalises answers as SQuAD v1.1 does (lower-case, drop punctuation, drop the
articles a / an / the, collapse whitespace) and computes token F1 over the multiset of shared
tokens; they differ in three rules, each taken from the dataset's official evaluation script:

- ``squad`` (SQuAD v1.1 ``evaluate-v1.1.py``; FlashRAG-format sets): best over gold answers.
- ``hotpotqa`` (``hotpot_evaluate_v1.py``): the single gold answer only; F1 (and P, R) is 0 when
  either side normalises to yes / no / noanswer and the two differ.
- ``2wiki`` (``2wikimultihop_evaluate_v1.1.py``): the yes / no / noanswer rule, and EM, F1, P and R
  each maximised *separately* over the gold answer and its aliases.
- ``musique`` (``metrics/answer.py``, SQuAD 2.0 style): best over answer + aliases; when either
  token list is empty, F1 is 1 if both are, else 0.

``acc`` is the same everywhere (FlashRAG / Search-R1 "acc"): a normalised gold occurs in the
normalised prediction, best over golds. This is FlashRAG's official rule
(``flashrag/evaluator/metrics.py``, ``Sub_ExactMatch``: ``golden_answer in normalized_prediction``),
kept as is: the test is on characters, not tokens, so a prediction "unknown" contains the gold "no"
and scores 1.
"""

import re
import string
from collections import Counter
from collections.abc import Callable, Iterator, Mapping

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_YES_NO = {"yes", "no", "noanswer"}

Metric = Callable[[str, list[str]], float]


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and the articles a / an / the, collapse whitespace.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def token_prf(
    prediction: str, gold: str, yes_no_rule: bool = False, empty_rule: bool = False
) -> tuple[float, ...]:
    """(F1, precision, recall) of normalised tokens, with the optional official special cases.

    >>> token_prf("yes", "no", yes_no_rule=True)
    (0.0, 0.0, 0.0)
    >>> token_prf("", "", empty_rule=True)
    (1.0, 1.0, 1.0)
    """
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if yes_no_rule and pred != ref and (pred in _YES_NO or ref in _YES_NO):
        return 0.0, 0.0, 0.0
    pred_toks, ref_toks = pred.split(), ref.split()
    if empty_rule and (not pred_toks or not ref_toks):
        same = float(pred_toks == ref_toks)
        return same, same, same
    common = sum((Counter(pred_toks) & Counter(ref_toks)).values())
    if common == 0:
        return 0.0, 0.0, 0.0
    precision, recall = common / len(pred_toks), common / len(ref_toks)
    return 2 * precision * recall / (precision + recall), precision, recall


def _em(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _acc(prediction: str, gold: str) -> float:
    """FlashRAG's ``acc``: a character substring test (so "unknown" contains "no").

    >>> _acc("It was Paris.", "paris"), _acc("unknown", "no"), _acc("no", "unknown")
    (1.0, 1.0, 0.0)
    """
    return float(normalize_answer(gold) in normalize_answer(prediction))


def _best(fn: Callable[[str, str], float], first_gold_only: bool) -> Metric:
    def score(prediction: str, golds: list[str]) -> float:
        used = golds[:1] if first_gold_only else golds
        return max((fn(prediction, g) for g in used), default=0.0)

    return score


def _prf_metric(index: int, **rules: bool) -> Callable[[str, str], float]:
    return lambda prediction, gold: token_prf(prediction, gold, **rules)[index]


def _scorer(first_gold_only: bool = False, **rules: bool) -> dict[str, Metric]:
    return {
        "em": _best(_em, first_gold_only),
        "f1": _best(_prf_metric(0, **rules), first_gold_only),
        "acc": _best(_acc, first_gold_only),
        "precision": _best(_prf_metric(1, **rules), first_gold_only),
        "recall": _best(_prf_metric(2, **rules), first_gold_only),
    }


# Each dataset's official rules (``Dataset.scorer``): the keyword arguments of :func:`_scorer`.
RULES: dict[str, dict[str, bool]] = {
    "squad": {},
    "hotpotqa": {"first_gold_only": True, "yes_no_rule": True},
    "2wiki": {"yes_no_rule": True},
    "musique": {"empty_rule": True},
}


class Scorers(Mapping):
    """Dataset scorer name -> metric name -> f(prediction, golds), built when asked for (a few closures):
    nothing is computed at import, so every line of the rules is what a test calls (mutation testing,
    ``make mutate``, cannot see code that ran at import)."""

    def __getitem__(self, name: str) -> dict[str, Metric]:
        return _scorer(**RULES[name])

    def __iter__(self) -> Iterator[str]:
        return iter(RULES)

    def __len__(self) -> int:
        return len(RULES)


SCORERS = Scorers()


def exact_match(prediction: str, golds: list[str]) -> float:
    return SCORERS["squad"]["em"](prediction, golds)


def f1_score(prediction: str, golds: list[str]) -> float:
    return SCORERS["squad"]["f1"](prediction, golds)


def accuracy(prediction: str, golds: list[str]) -> float:
    return SCORERS["squad"]["acc"](prediction, golds)


# The per-question answer metrics that go into records and tables.
ANSWER_METRICS = ("em", "f1", "acc")


def retrieval_pr(retrieved: list[str], gold: list[str]) -> tuple[float, float]:
    """Precision and recall of the retrieved passage ids (de-duplicated) against gold supports."""
    got, want = set(retrieved), set(gold)
    if not want:
        return float("nan"), float("nan")
    hit = len(got & want)
    return (hit / len(got) if got else 0.0), hit / len(want)


def answer_recall(passages: list[str], golds: list[str]) -> float:
    """FlashRAG's answer-string recall: 1 if any normalised gold occurs in any retrieved passage.

    >>> answer_recall(["Paris\\nParis is the capital of France."], ["France"]), answer_recall([], ["France"])
    (1.0, 0.0)
    """
    texts = [normalize_answer(p) for p in passages]
    return float(any(normalize_answer(g) in t for g in golds if normalize_answer(g) for t in texts))
