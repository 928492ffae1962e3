"""The paired tests between runs (rag_lab/eval/paired.py) and the bootstrap's edge cases
(rag_lab/eval/stats.py), pinned where `make mutate` found them loose: the subsets, how records pair (seed and
question id, the default seed), p against 0 by default, rows named KEY=VALUE, and each one-line error."""

import json

import pytest
import yaml

from rag_lab.core.errors import RagLabError
from rag_lab.eval.paired import bootstrap_rows, compare, compare_rows, in_subset, scores_of
from rag_lab.eval.stats import bootstrap_ci, paired_bootstrap


def run_of(root, name, overrides, records):
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def records(accs, types=None):
    return [{"id": f"q{i}", "acc": a, "type": (types or ["x"] * len(accs))[i]} for i, a in enumerate(accs)]


def test_subsets():
    assert in_subset({}, "all") and in_subset({}, "answerable=true") and not in_subset({}, "answerable=false")
    assert in_subset({"answerable": False}, "answerable=false")
    assert not in_subset({"answerable": False}, "answerable=true")
    assert in_subset({"type": "bridge"}, "type=bridge") and not in_subset({"type": "bridge"}, "type=x")
    with pytest.raises(RagLabError, match=r"^unknown subset 'kind=x' \(use 'all', 'type=<question type>'"):
        in_subset({}, "kind=x")


def test_constant_and_short_samples_need_no_resampling():
    assert bootstrap_ci([2.0] * 5) == (2.0, 2.0) and bootstrap_ci([3.0]) == (3.0, 3.0)
    low, high = bootstrap_ci([])
    assert low != low and high != high


def test_booleans_are_scores():
    a, b = [True, True, False, True] * 10, [False, True, False, False] * 10
    assert paired_bootstrap(a, b) == paired_bootstrap([float(x) for x in a], [float(x) for x in b])


def test_runs_pair_on_seed_and_question_and_compare_tests_against_zero(tmp_path):
    a = run_of(tmp_path, "a", ["policy=a", "seed=0"], records([1.0] * 30 + [0.0] * 10))
    b = run_of(tmp_path, "b", ["policy=b"], records([1.0] * 20 + [0.0] * 20))  # no seed override: seed 0
    c = run_of(tmp_path, "c", ["policy=b", "seed=1"], records([1.0] * 20 + [0.0] * 20))
    assert set(scores_of([a])) == set(scores_of([b])) == {("0", f"q{i}") for i in range(40)}
    # two single runs pair on the question id alone, whatever their seeds
    table = compare(a, c, metrics=("acc",))
    expected = paired_bootstrap([1.0] * 30 + [0.0] * 10, [1.0] * 20 + [0.0] * 20)
    assert table.iloc[0]["n"] == 40 and table.iloc[0]["p_value"] == pytest.approx(expected.p_value, abs=1e-4)
    assert expected.p_value < 0.05
    # rows of a sweep pair on (seed, question): a and b share seed 0; a and c none
    runs = [a, b]
    row = compare_rows(runs, "policy", "a", "b", metrics=("acc",)).iloc[0]
    assert row["n"] == 40 and row["delta"] == pytest.approx(0.25)
    with pytest.raises(
        RagLabError, match=r"^policy=a and policy=b share no \(seed, question id\) of subset 'all'$"
    ):
        compare_rows([a, c], "policy", "a", "b", metrics=("acc",))
    with pytest.raises(RagLabError, match=r"^\S*a and \S*c share no question id of subset 'type=y'$"):
        compare(a, c, subset="type=y", metrics=("acc",))


def test_rows_named_by_key_value_and_a_subset(tmp_path):
    types = ["x"] * 20 + ["y"] * 20
    a = run_of(tmp_path, "a", ["data.filter=kind=x"], records([1.0] * 40, types))
    b = run_of(tmp_path, "b", ["policy=b"], records([1.0] * 20 + [0.0] * 20, types))
    row = compare_rows([a, b], None, "data.filter=kind=x", "policy=b", metrics=("acc",)).iloc[0]
    assert row["A"] == "data.filter=kind=x" and row["delta"] == pytest.approx(0.5)
    only_x = compare_rows([a, b], None, "data.filter=kind=x", "policy=b", subset="type=x", metrics=("acc",))
    assert only_x.iloc[0]["n"] == 20 and only_x.iloc[0]["delta"] == 0.0
    with pytest.raises(RagLabError, match=r"^--compare: no run with policy=c \(the runs have policy: b\)$"):
        compare_rows([a, b], "policy", "b", "c", metrics=("acc",))
    with pytest.raises(RagLabError, match=r"^--compare: no run with seed=3 \(the runs have seed: none\)$"):
        compare_rows([a, b], "seed", "3", "4", metrics=("acc",))


def test_unknown_metrics_are_named_in_one_line():
    mine = {("0", "q0"): {"id": "q0", "acc": 1.0}}
    with pytest.raises(RagLabError, match=r"^--metrics: no record has em, f1 \(fields: acc, id\)$"):
        bootstrap_rows(mine, mine, ("acc", "em", "f1"))
