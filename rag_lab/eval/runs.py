"""Finished runs read back: the run dirs under a folder, their metrics, records and Hydra overrides
(``rag_lab.report`` folds them into tables and paired tests)."""

import json
import sys
from pathlib import Path

import yaml

from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records


def _natural(paths: list[Path]) -> list[Path]:
    """Sorted with numeric parts as numbers (sweep job 10 after job 9)."""
    return sorted(paths, key=lambda p: [(0, int(s), "") if s.isdigit() else (1, 0, s) for s in p.parts])


def _check_roots(roots: list[Path]) -> None:
    for root in roots:
        if not root.exists():
            raise RagLabError(f"{root} does not exist")


def find_runs(roots: list[Path]) -> list[Path]:
    """Every directory under ``roots`` that holds a ``metrics.json``, in natural order."""
    _check_roots(roots)
    runs = [run for root in roots for run in _natural([p.parent for p in root.rglob("metrics.json")])]
    return list(dict.fromkeys(runs))


def unfinished_runs(roots: list[Path]) -> list[Path]:
    """Run directories under ``roots`` (a ``.hydra/`` or a ``records.jsonl``: written when a run starts)
    that have no ``metrics.json`` (written when it ends)."""
    _check_roots(roots)
    dirs = [p.parent for root in roots for name in (".hydra", "records.jsonl") for p in root.rglob(name)]
    return list(dict.fromkeys(d for d in _natural(dirs) if not (d / "metrics.json").exists()))


def left_out(missing: list[Path]) -> str:
    """A notice on stderr per run without metrics.json; returns the summary line's note on them."""
    for run in missing:
        print(f"notice: {run} has no metrics.json (killed, failed or running): left out", file=sys.stderr)
    names = ", ".join(map(str, missing))
    return f" ({len(missing)} without metrics.json left out: {names})" if missing else ""


def records_of(run: Path) -> list[dict]:
    """The records of a finished run, read without changing the file. A finished run (its metrics.json
    written) whose records.jsonl is cut short (a torn last line, or fewer questions than metrics.json
    counts) is damaged: a RagLabError naming the file, not a table of the questions that are left."""
    path = run / "records.jsonl"
    try:
        records = read_records(path, repair=False)
    except ValueError as e:  # a malformed line in the middle (read_records names file and line)
        raise RagLabError(str(e)) from None
    if not (run / "metrics.json").exists() or not path.exists():
        return records
    raw = path.read_bytes()
    counted = (read_metrics(run).get("all") or {}).get("n")
    questions = len({str(r.get("id", "")).split("#s")[0] for r in records})
    if (raw and not raw.endswith(b"\n")) or (isinstance(counted, int) and questions < counted):
        raise RagLabError(
            f"{path}: cut short ({questions} questions, metrics.json counts {counted}) although the run "
            "finished: the file was damaged or copied in part; copy it again, or run it again"
        )
    return records


def read_metrics(run: Path) -> dict:
    path = run / "metrics.json"
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RagLabError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None


def overrides_of(run: Path) -> dict[str, str]:
    path = run / ".hydra" / "overrides.yaml"
    try:
        items = yaml.safe_load(path.read_text()) if path.exists() else []
    except yaml.YAMLError as e:
        raise RagLabError(f"{path}: malformed yaml ({str(e).splitlines()[0]})") from None
    # a component's setting in a multirun is recorded as ++key=value (rag_lab/runner/sweeps.py: soften); the
    # runs of 0.1.0 selected experiments and their rows with a + (+experiment/compare_synth=dapo)
    return dict(item.lstrip("+").split("=", 1) for item in items or [] if "=" in item)


def _config_keys(run: Path) -> set[str]:
    """The dotted keys of a run's resolved ``config.yaml`` (empty when it has none)."""
    path = run / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.exists() else None

    def walk(node, prefix: str) -> set[str]:
        if not isinstance(node, dict):
            return {prefix}
        return {prefix} | {
            k for key, value in node.items() for k in walk(value, f"{prefix}.{key}" if prefix else str(key))
        }

    return walk(config or {}, "")


# Config keys that cannot change a run's results (rag_lab.runner.sweeps hashes the config without them).
NOT_RESULTS = ("logger", "eval.batch_size", "eval.resume", "eval.reuse", "cache_dir")
# The index's corpus at its default, the dataset's whole corpus (corpus: rag_lab/data/evidence.py), is left
# out of the hashes too: a config written before the knob existed keeps its hash (and its reusable results).
WHOLE_CORPUS = {"coverage": 1.0, "distractors": 0, "seed": 0}


# Keys that say where a component keeps its cache (data.cache_dir, retriever.cache_dir, policy.cache_dir: each
# ``${cache_dir}``, so $RAG_LAB_CACHE), left out at every depth: every cache is keyed by content, so where it
# lives cannot change results. Hashes before issue 74 kept the nested ones (rag_lab.eval.provenance.row_hash's
# version 1). A dataset's ``path`` stays in: it names what is read.
LOCATIONS = ("cache_dir",)


def _drop_locations(node):
    if isinstance(node, dict):
        return {k: _drop_locations(v) for k, v in node.items() if k not in LOCATIONS}
    if isinstance(node, list):
        return [_drop_locations(v) for v in node]
    return node


def results_config(config: dict, locations: bool = False) -> dict:
    """A resolved config less :data:`NOT_RESULTS` and every :data:`LOCATIONS` key (a copy); with
    ``locations`` the nested location keys stay, as the row hashes of version 1 kept them."""
    kept = json.loads(json.dumps(config, default=str))
    for key in NOT_RESULTS:
        *parents, leaf = key.split(".")
        node = kept
        for part in parents:
            node = node.get(part) or {}
        node.pop(leaf, None)
    if kept.get("corpus") == WHOLE_CORPUS:
        kept.pop("corpus")
    return kept if locations else _drop_locations(kept)


def applies(run: Path, key: str) -> bool:
    """Whether override ``key`` is a setting of ``run``'s config (a component's setting swept over rows of
    several policies reaches only those that have it: rag_lab.runner.sweeps); True without a config.yaml."""
    if not key.startswith(("policy.", "reward.", "generator.", "retriever.", "judge.")):
        return True
    keys = _config_keys(run)
    return not keys - {""} or key in keys


def distinct(runs: list[Path]) -> list[Path]:
    """``runs`` less those that repeat an earlier one of them: results copied from it (``reused.json``:
    :mod:`rag_lab.runner.sweeps`), or the same config run again beside it (two jobs of a parallel sweep) —
    counting them would count one run twice."""
    here, seen, out = {str(r.resolve()) for r in runs}, set(), []
    for run in runs:
        reused = run / "reused.json"
        if reused.exists() and json.loads(reused.read_text()).get("from") in here:
            continue
        path = run / "config.yaml"
        if path.exists():
            key = json.dumps(results_config(yaml.safe_load(path.read_text()) or {}), sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
        out.append(run)
    return out


def row_labels(runs: list[Path], by: str) -> list[str]:
    """Each run's row name in a sweep whose rows are the values of ``by``: the value, and the other
    overrides that vary over the sweep (not the seed) where the run's config has that key (a swept
    ``policy.lambda_end`` names Stop-RAG's rows, not the rows of policies without it)."""
    overrides = [overrides_of(r) for r in runs]
    varying = [
        k
        for k in dict.fromkeys(k for o in overrides for k in o)
        if k not in (by, "seed") and len({o.get(k) for o in overrides}) > 1
    ]
    labels = []
    for run, over in zip(runs, overrides, strict=True):
        extra = [f"{k}={over[k]}" for k in varying if k in over and applies(run, k)]
        labels.append(over.get(by, "?") + (f" ({', '.join(extra)})" if extra else ""))
    return labels
