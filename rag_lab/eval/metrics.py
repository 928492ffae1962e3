"""EM / F1 / Acc after SQuAD normalisation, as the SQuAD v1.1 official script computes them.

``normalize_answer``, ``exact_match`` and ``f1`` follow the SQuAD v1.1 evaluation script
(lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace; F1 over the
multiset of shared tokens); each is maximised over the gold answers. ``acc`` is FlashRAG's /
Search-R1's: a normalised gold occurs in the normalised prediction.
"""

import re
import string
from collections import Counter
from collections.abc import Callable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-case, drop punctuation and the articles a / an / the, collapse whitespace.

    >>> normalize_answer("The  Eiffel-Tower!")
    'eiffeltower'
    """
    s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", s).split())


def _em(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1(prediction: str, gold: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def _acc(prediction: str, gold: str) -> float:
    return float(normalize_answer(gold) in normalize_answer(prediction))


def best_over_golds(fn: Callable[[str, str], float]) -> Callable[[str, list[str]], float]:
    def score(prediction: str, golds: list[str]) -> float:
        return max((fn(prediction, g) for g in golds), default=0.0)

    score.__name__ = fn.__name__.lstrip("_")
    return score


exact_match, f1_score, accuracy = best_over_golds(_em), best_over_golds(_f1), best_over_golds(_acc)

# Per dataset scorer: metric name -> f(prediction, golds). Datasets name theirs in `Dataset.scorer`.
SCORERS: dict[str, dict[str, Callable[[str, list[str]], float]]] = {
    "squad": {"em": exact_match, "f1": f1_score, "acc": accuracy},
}


def retrieval_pr(retrieved: list[str], gold: list[str]) -> tuple[float, float]:
    """Precision and recall of the retrieved passage ids (de-duplicated) against gold supports."""
    got, want = set(retrieved), set(gold)
    if not want:
        return float("nan"), float("nan")
    hit = len(got & want)
    return (hit / len(got) if got else 0.0), hit / len(want)
