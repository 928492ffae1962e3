"""Score predictions made anywhere with a dataset's official rules.

    python -m rag_lab.score data=musique data.path=musique_ans_v1.0_dev.jsonl predictions=preds.jsonl
    python -m rag_lab.score predictions=outputs/run/records.jsonl split=test     # the embedded world

``predictions`` is a jsonl of ``{"id", "prediction"}`` (optionally ``"support_ids"``: passage
ids, scored against the gold supports as paragraph-level support P / R / F1 / EM). Questions of
the gold split with no prediction score 0 and are counted as ``missing``, as the official
scripts do. Prints the metrics as JSON (fractions, with 95% bootstrap CIs). A predictions file
that repeats an id, or whose ids match no question of the split, is an error naming it. The judge
split is the claims' (``make claims``): refused without ``RAG_LAB_JUDGE=1``, before the data is read.
"""

import json
import sys
from pathlib import Path

from rag_lab.core.cli import cli_overrides
from rag_lab.core.config import compose
from rag_lab.core.errors import one_line_errors
from rag_lab.data.base import DataError
from rag_lab.data.jsonl import FieldError, read_jsonl, require
from rag_lab.eval.metrics import SCORERS
from rag_lab.eval.provenance import check_split
from rag_lab.eval.stats import bootstrap_ci


def _prediction(row: dict) -> tuple[str, str, list[str] | None]:
    prediction = require(row, "prediction", str)
    supports = row.get("support_ids")
    if supports is not None and not isinstance(supports, list):
        raise FieldError("field 'support_ids' should be a list")
    return str(require(row, "id", (str, int))), prediction, supports


def support_scores(predicted: list[str], gold: list[str]) -> dict[str, float]:
    """Set-based support precision / recall / F1 / EM (HotpotQA's sp_* rules at passage level)."""
    got, want = set(predicted), set(gold)
    tp = len(got & want)
    p = tp / len(got) if got else 0.0
    r = tp / len(want) if want else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return {"sp_precision": p, "sp_recall": r, "sp_f1": f1, "sp_em": float(got == want)}


def score(data, split: str, predictions_path: Path) -> dict:
    if not predictions_path.exists():
        raise DataError(f"predictions file not found: {predictions_path}")
    preds: dict[str, tuple[str, list[str] | None]] = {}
    for lineno, (qid, p, s) in enumerate(read_jsonl(predictions_path, _prediction), start=1):
        if qid in preds:
            raise DataError(f"{predictions_path}: id '{qid}' appears twice (prediction {lineno}); keep one")
        preds[qid] = (p, s)
    if not preds:
        raise DataError(f"{predictions_path}: no predictions (an empty file): one JSON line per question")
    golds = data.split(split)
    if not any(ex.id in preds for ex in golds):
        raise DataError(
            f"{predictions_path}: no prediction id matches a question of {data.name}/{split} "
            f"(ids like '{next(iter(preds))}' vs '{golds[0].id}'); check data=, data.path= and split="
        )
    metrics = SCORERS[data.scorer]
    per_metric: dict[str, list[float]] = {m: [] for m in metrics}
    with_supports = any(s is not None for _, s in preds.values())
    for ex in golds:
        prediction, supports = preds.get(ex.id, ("", None))
        for name, fn in metrics.items():
            per_metric[name].append(fn(prediction, list(ex.answers)) if ex.id in preds else 0.0)
        if with_supports:
            for name, value in support_scores(supports or [], list(ex.supporting_ids)).items():
                per_metric.setdefault(name, []).append(value)
    n = len(golds)
    out = {"dataset": data.name, "scorer": data.scorer, "split": split, "n": n}
    out["missing"] = sum(ex.id not in preds for ex in golds)
    out["extra"] = len(set(preds) - {ex.id for ex in golds})
    for name, values in per_metric.items():
        out[name] = sum(values) / n if n else None
    out["ci95"] = {m: list(bootstrap_ci(per_metric[m])) for m in ("em", "f1", "acc")} if n else {}
    return out


def main(argv: list[str] | None = None) -> None:
    from hydra.utils import instantiate

    with one_line_errors():
        overrides = cli_overrides(list(sys.argv[1:] if argv is None else argv), __doc__, "score")
        cfg = compose(overrides, config_name="score")
        check_split("split", cfg.split)
        result = score(instantiate(cfg.data), cfg.split, Path(cfg.predictions))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
