"""The all-methods table (rag_lab/reporting/compare.py) and its Pareto plot (rag_lab/reporting/plots.py) on
hand-made runs."""

import json

import numpy as np
import pandas as pd
import pytest

from rag_lab.core.errors import RagLabError
from rag_lab.eval.stats import bootstrap_ci, paired_bootstrap
from rag_lab.reporting.compare import (
    CompareCallback,
    check_mechanisms,
    compare_table,
    display_table,
    write_compare,
)
from rag_lab.reporting.plots import pareto_front

from conftest import cli

BY = "experiment/compare_synth"


def make_run(root, name, row, seed, accs, rc, extra=None):
    """A run dir of row ``row``: question i right by ``accs[i]``, ``rc`` searches each; ``extra[i]``: more
    fields of question i's record (or ones that replace these)."""
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(f"- {BY}={row}\n- seed={seed}\n")
    records = [
        {"id": f"q{i}", "em": a, "f1": a, "acc": a, "retrieval_count": rc, "n_steps": rc + 1,
         "tokens_total": 100, "ret_precision": None if rc == 0 else 0.5, "ret_recall": 0.5 * a}
        | (extra[i] if extra else {})
        for i, a in enumerate(accs)
    ]  # fmt: skip
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.json").write_text(json.dumps({"all": {"n": len(accs)}}))
    return run


@pytest.fixture
def sweep(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2, 60).astype(float)
    better = np.maximum(base, rng.integers(0, 2, 60))  # right wherever the reference is, and more
    for seed in (0, 1):
        make_run(tmp_path, f"ref{seed}", "fixed_iter", seed, base.tolist(), 4)
        make_run(tmp_path, f"new{seed}", "stoprag", seed, better.tolist(), 2)
    make_run(tmp_path, "direct0", "direct", 0, [0.0] * 30 + [1.0] * 5, 0)  # one seed, fewer questions
    return tmp_path, base, better


def test_cells_are_question_means_with_a_bootstrap_over_questions(sweep):
    root, base, better = sweep
    runs = sorted(p for p in root.iterdir() if p.is_dir())
    table = compare_table(runs, BY, "fixed_iter").set_index("method")
    assert table.loc["stoprag", "acc"] == pytest.approx(100 * better.mean())
    # two identical seeds are the same questions, not twice as many: the CI of one seed
    low, high = bootstrap_ci(list(better))
    assert (table.loc["stoprag", "acc_low"], table.loc["stoprag", "acc_high"]) == pytest.approx(
        (100 * low, 100 * high)
    )
    assert table.loc["direct", "N"] == 35 and table.loc["direct", "seeds"] == 1
    assert table.loc["direct", "ret_precision"] != table.loc["direct", "ret_precision"]  # no retrieval: none


def test_each_row_is_tested_against_the_reference_by_a_paired_bootstrap(sweep):
    root, base, better = sweep
    table = compare_table(sorted(p for p in root.iterdir() if p.is_dir()), BY, "fixed_iter").set_index(
        "method"
    )
    expected = paired_bootstrap(list(better) * 2, list(base) * 2, questions=[f"q{i}" for i in range(60)] * 2,
                                seeds=["0"] * 60 + ["1"] * 60)  # fmt: skip
    assert table.loc["stoprag", "d"] == pytest.approx(100 * expected.delta)
    assert table.loc["stoprag", "d_low"] == pytest.approx(100 * expected.ci_low)
    assert table.loc["stoprag", "p"] == pytest.approx(expected.p_value)
    assert table.loc["stoprag", "seed_sd"] == 0  # the same difference in both seeds
    assert table.loc["fixed_iter", "d"] != table.loc["fixed_iter", "d"]  # the reference: no difference
    # direct shares 35 questions of seed 0 with the reference: only those pairs count
    direct = paired_bootstrap([0.0] * 30 + [1.0] * 5, list(base[:35]))
    assert table.loc["direct", "d"] == pytest.approx(100 * direct.delta)


def test_files_the_table_the_legend_latex_and_the_plot(sweep):
    root, _, _ = sweep
    text = write_compare([root], BY, "fixed_iter", "All methods", root / "out")
    assert text.startswith("# All methods") and "| stoprag " in text and "**Δ Acc vs fixed_iter**" in text
    shown = pd.read_csv(root / "out" / "compare.csv")
    assert list(shown["method"]) == ["direct", "stoprag", "fixed_iter"]  # in the order of the run dirs
    tex = (root / "out" / "compare.tex").read_text()
    assert r"\Delta$ Acc vs fixed\_iter" in tex and "\\toprule" in tex
    for ext in ("png", "svg"):
        assert (root / "out" / f"pareto.{ext}").stat().st_size > 1000


def test_trained_minus_start_pairs_each_row_with_its_own_start(sweep):
    """starts {stoprag: direct}: stoprag's "trained − start" is its paired bootstrap against direct, over
    the (question, seed) pairs both answered (direct: seed 0, the first 35 questions); other rows get none."""
    root, _, better = sweep
    runs = sorted(p for p in root.iterdir() if p.is_dir())
    table = compare_table(runs, BY, "fixed_iter", starts={"stoprag": "direct", "nope": "direct"})
    expected = paired_bootstrap(list(better[:35]), [0.0] * 30 + [1.0] * 5)
    row = table.set_index("method").loc["stoprag"]
    assert (row["s"], row["s_low"], row["s_high"], row["s_p"]) == pytest.approx(
        (100 * expected.delta, 100 * expected.ci_low, 100 * expected.ci_high, expected.p_value)
    )
    assert (
        table.set_index("method").loc["fixed_iter", "s"] != table.set_index("method").loc["fixed_iter", "s"]
    )
    assert table.attrs["starts"] == {"stoprag": "direct"}  # a row the sweep lacks is not listed
    shown = display_table(table).set_index("method")
    assert shown.loc["stoprag", "trained − start (Acc)"].startswith(f"{100 * expected.delta:+.1f} [")
    text = write_compare([root], BY, "fixed_iter", "t", root / "out", starts={"stoprag": "direct"})
    assert (
        "**trained − start (Acc)**: each trained row against its own start" in text
        and "stoprag − direct" in text
    )


def test_display_drops_columns_nobody_measured(sweep):
    root, _, _ = sweep
    shown = display_table(compare_table(sorted(p for p in root.iterdir() if p.is_dir()), BY, "fixed_iter"))
    assert "Judge" not in shown and "Acc" in shown and "p" in shown and "seed sd" in shown


def test_pareto_front():
    points = [(4.0, 30.0), (2.0, 35.0), (0.0, 10.0), (3.0, 35.0), (2.0, 20.0)]
    assert pareto_front(points) == [2, 1]


def test_the_oracle_row_is_a_ceiling_line_off_the_pareto_front(sweep, monkeypatch):
    """oracle_rag (gold passages, no search: RC 0, the best Acc) would be the whole front as a point; it is
    a row of the table and a line on the plot, and the front is the methods'."""
    root, _, _ = sweep
    make_run(root, "oracle0", "oracle_rag", 0, [1.0] * 60, 0)
    import rag_lab.reporting.plots as plots

    fronts = []
    monkeypatch.setattr(
        plots, "pareto_front", lambda points: fronts.append(points) or list(range(len(points)))
    )
    text = write_compare([root], BY, "fixed_iter", "All methods", root / "out")
    assert "| oracle_rag " in text and "Row **oracle_rag**: the gold supporting passages" in text
    assert (0.0, 100.0) not in fronts[0] and len(fronts[0]) == 3  # direct, stoprag, fixed_iter
    fronts.clear()
    text = write_compare([root], BY, "fixed_iter", "All methods", root / "out", ceiling=None)
    assert (0.0, 100.0) in fronts[0] and "Row **oracle_rag**" not in text


def test_an_unknown_row_key_is_one_line(sweep, repo_root, capfd, monkeypatch):
    root, _, _ = sweep
    rc, out = cli("reporting.compare", [str(root), "--by", "policy"], capfd, monkeypatch, cwd=repo_root)
    assert rc == 1 and out.strip().count("\n") == 0 and "--by policy" in out


def test_a_copied_run_is_not_another_seed(sweep):
    root, base, _ = sweep
    copy = make_run(root, "refcopy", "fixed_iter", 0, base.tolist(), 4)  # seed 0's results, copied
    (copy / "reused.json").write_text(json.dumps({"from": str((root / "ref0").resolve())}))
    table = compare_table(sorted(p for p in root.iterdir() if p.is_dir()), BY, "fixed_iter").set_index(
        "method"
    )
    assert table.loc["fixed_iter", "seeds"] == 2


MECHANISMS = {
    "apex": {"metric": "sepr", "against": "apex_start"},
    "dapo": {"metric": "retrieval_count", "against": "dapo_stage1"},
    "r3rag": {"metric": "format_failure", "against": "r3rag_start"},
}


@pytest.fixture
def trained(tmp_path):
    """Three trained rows and the rows before them, two seeds, four questions; per (row, seed) the field each
    mechanism reads, question by question."""
    fields = {
        ("apex", "sepr"): ([1.0, 0.5, 1.0, 0.5], [1.0, 1.0, 0.5, 0.5]),
        ("apex_start", "sepr"): ([0.5, 0.5, 0.0, 0.5], [0.5, 0.0, 0.5, 0.5]),
        ("dapo", "retrieval_count"): ([2, 2, 3, 1], [2, 1, 3, 1]),
        ("dapo_stage1", "retrieval_count"): ([3, 3, 3, 3], [3, 2, 3, 3]),
        ("r3rag", "format_failure"): ([False, False, True, False], [False, False, False, False]),
        ("r3rag_start", "format_failure"): ([True, True, True, False], [True, False, True, False]),
    }
    for (row, field), per_seed in fields.items():
        for seed, values in enumerate(per_seed):
            make_run(tmp_path, f"{row}{seed}", row, seed, [1.0] * 4, 2, [{field: v} for v in values])
    return tmp_path, fields


def expected_mechanism(fields, row, against, field):
    """The paired bootstrap over the four questions, each with its two seeds' pairs."""
    mine, theirs = fields[(row, field)], fields[(against, field)]
    return paired_bootstrap(
        [float(v) for values in mine for v in values],
        [float(v) for values in theirs for v in values],
        questions=[f"q{i}" for i in range(4)] * 2,
        seeds=["0"] * 4 + ["1"] * 4,
    )


def test_the_mechanism_column_is_each_rows_own_metric_against_its_own_row(trained):
    """APEX's SEPR against apex_start, DAPO's retrieval count against dapo_stage1, R3-RAG's format failures
    (a bool per record) against r3rag_start: each the paired bootstrap over questions with their seeds, in
    percentage points for a % metric, raw for a count."""
    root, fields = trained
    runs = sorted(p for p in root.iterdir() if p.is_dir())
    table = compare_table(runs, BY, "apex_start", mechanisms=MECHANISMS).set_index("method")
    # by hand: each question's mean over its two seeds, the difference, its mean over the four questions
    # apex − apex_start SEPR: (1, .75, .75, .5) − (.5, .25, .25, .5) = (.5, .5, .5, 0) -> 0.375, 37.5 pp
    # dapo − dapo_stage1 searches: (2, 1.5, 3, 1) − (3, 2.5, 3, 3) = (-1, -1, 0, -2) -> -1.0
    # r3rag − r3rag_start failures: (0, 0, .5, 0) − (1, .5, 1, 0) = (-1, -.5, -.5, 0) -> -0.5, -50 pp
    assert table.loc["apex", "mech"] == pytest.approx(37.5)
    assert table.loc["dapo", "mech"] == pytest.approx(-1.0)
    assert table.loc["r3rag", "mech"] == pytest.approx(-50.0)
    for row, scale in (("apex", 100), ("dapo", 1), ("r3rag", 100)):
        spec = MECHANISMS[row]
        res = expected_mechanism(fields, row, spec["against"], spec["metric"])
        got = table.loc[row, ["mech", "mech_low", "mech_high", "mech_p"]].tolist()
        assert got == pytest.approx([scale * res.delta, scale * res.ci_low, scale * res.ci_high, res.p_value])
        assert table.loc[row, "mech_against"] == spec["against"]
    shown = display_table(table.reset_index()).set_index("method")["mechanism (trained − against)"]
    sepr = expected_mechanism(fields, "apex", "apex_start", "sepr")
    rc = expected_mechanism(fields, "dapo", "dapo_stage1", "retrieval_count")
    assert shown["apex"] == f"SEPR +37.5 pp [{100 * sepr.ci_low:+.1f}, {100 * sepr.ci_high:+.1f}]"
    assert shown["dapo"] == f"RC -1.00 [{rc.ci_low:+.2f}, {rc.ci_high:+.2f}]"
    assert shown["r3rag"].startswith("Fmt -50.0 pp [")
    assert pd.isna(shown["apex_start"]) and pd.isna(shown["dapo_stage1"])  # rows without a mechanism


def test_a_mechanism_whose_against_row_is_missing_is_a_dash(sweep):
    """stoprag's retrieval count against a row the sweep lacks: no difference, "—" in compare.md, and the
    legend says so; the rest of the table is written as before."""
    root, _, _ = sweep
    mechanisms = {"stoprag": {"metric": "retrieval_count", "against": "dapo_stage1"}}
    text = write_compare([root], BY, "fixed_iter", "t", root / "out", mechanisms=mechanisms)
    lines = text.splitlines()
    header = [c.strip() for c in lines[2].split("|")]
    stoprag = next([c.strip() for c in line.split("|")] for line in lines if line.startswith("| stoprag "))
    assert stoprag[header.index("mechanism (trained − against)")] == "—"
    assert "stoprag: RC, stoprag − dapo_stage1 (not in the sweep)" in text
    table = pd.read_csv(root / "out" / "compare.csv").set_index("method")
    assert table.loc["stoprag", "mech_against"] == "dapo_stage1" and np.isnan(table.loc["stoprag", "mech"])


def test_a_malformed_mechanism_is_an_error_before_the_sweep_runs():
    with pytest.raises(RagLabError, match="mechanisms.apex: expected"):
        CompareCallback(BY, mechanisms={"apex": {"metric": "sepr", "againts": "apex_start"}})
    with pytest.raises(RagLabError, match="mechanisms.apex.metric spr: not a records field"):
        check_mechanisms({"apex": {"metric": "spr", "against": "apex_start"}})


def test_make_demos_callback_has_a_mechanism_for_each_trained_row():
    """compare_synth's callback as Hydra builds it: a mechanism for each row that has a start."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag_lab.core.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", ["experiment=compare_synth"], return_hydra_config=True)
    callback = instantiate(cfg.hydra.callbacks.compare)
    assert set(callback.mechanisms) == {"stoprag", "dapo", "evorag", "r3rag", "apex"}
    assert set(callback.starts) == set(callback.mechanisms) | {"dapo_stage1"}
    assert callback.mechanisms["dapo"] == {"metric": "retrieval_count", "against": "dapo_stage1"}


def test_the_command_line_takes_mechanisms(sweep, repo_root, capfd, monkeypatch):
    """``--mechanism ROW=METRIC:AGAINST``: stoprag searches 2 times a question, fixed_iter 4 (every question,
    both seeds), so the difference is -2 with no spread; a malformed one is one line naming it."""
    root, _, _ = sweep
    args = [str(root), "--mechanism", "stoprag=retrieval_count:fixed_iter", "--out", str(root / "out")]
    rc, out = cli("reporting.compare", args, capfd, monkeypatch, cwd=repo_root)
    assert rc == 0 and "| RC -2.00 [-2.00, -2.00] " in out
    rc, out = cli(
        "reporting.compare", [str(root), "--mechanism", "stoprag=retrieval_count"], capfd, monkeypatch
    )
    assert rc == 1 and out.strip().count("\n") == 0 and "--mechanism stoprag=retrieval_count: expected" in out
