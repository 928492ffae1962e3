"""Our own claim, kind E (rag_lab/reporting/claims_evidence.py, rag_lab/eval/spreads.py), on hand-made runs of
its sweep: S_cov − S_meth on cases with a known answer, its CI the bootstrap over questions with every cell of
a question drawn together, the refusals, and the papers' judged lines kept as they are when its line joins
experiments/results/claims.csv."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from rag_lab import CONF_DIR
from rag_lab.claims import SPEC, Check, judge, read_spec, verdict, write_claims
from rag_lab.core.errors import RagLabError
from rag_lab.reporting.claims_evidence import side

BY, ACROSS = "experiment/evidence_synth", "experiment/evidence"
METHODS = ("stoprag", "dapo", "evorag", "r3rag", "apex")
LEVELS = {"cov100_d0": 1.0, "cov80_d0": 0.8, "cov60_d0": 0.6}
RESULTS = CONF_DIR.parent / "experiments" / "results"


def e_claim():
    """The shipped spec's E claim (conf/claims.yaml)."""
    return next(c for c in read_spec().claims if c.kind == "E")


def make_cell(root, method, level, seed, acc, corpus=None, provenance=None):
    """A finished run of ``method`` at coverage ``level`` on judge seed ``200 + seed``, Acc ``acc`` per
    question (ids q00, q01, ...)."""
    run = root / f"{method}-{level}-{seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{BY}={method}", f"{ACROSS}={level}",
                                                                    f"seed={200 + seed}"]))  # fmt: skip
    config = {"experiment": {"name": "evidence_claims"}, "seed": 200 + seed, "row": [method, level],
              "corpus": {"coverage": LEVELS.get(level, 1.0), "distractors": 0} | (corpus or {})}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    records = [{"id": f"q{i:02d}", "acc": float(a)} for i, a in enumerate(acc)]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.json").write_text("{}")
    prov = {"commit": "e1e1e1", "dirty": False, "code": "k74", "row_config": f"{method}@{level}",
            "lm": "tiny_lm@f00d", "split": "judge", "seed": 200 + seed, "n": len(acc),
            "started": f"2026-12-0{seed + 8}T10:00:00"} | (provenance or {})  # fmt: skip
    (run / "provenance.json").write_text(json.dumps(prov))
    return run


def sweep(root, right: dict[tuple[str, str], list[int]], n: int = 50, **cell):
    """The 15 cells × 2 seeds, the questions of ``right[(level, method)]`` answered (both seeds alike)."""
    for level in LEVELS:
        for method in METHODS:
            acc = np.zeros(n)
            acc[right[(level, method)]] = 1.0
            for seed in (0, 1):
                make_cell(root, method, level, seed, acc, **cell)
    return sorted(p for p in root.iterdir() if p.is_dir())


def nested(per_level: dict[str, int], per_method: list[int]) -> dict[tuple[str, str], list[int]]:
    """Method m at a level answers the first ``per_level[level] + per_method[m]`` questions."""
    return {
        (lv, m): list(range(k + d))
        for lv, k in per_level.items()
        for m, d in zip(METHODS, per_method, strict=True)
    }


def by_hand(right, n: int, joint: bool = True, draws: int = 10_000) -> tuple[float, float, float]:
    """S_cov − S_meth in points and its 95% percentile CI, written out here: questions drawn with
    replacement (numpy's generator, seed 0, as the tool's bootstrap), every cell's mean over the same draw
    (``joint``), or each cell over draws of its own."""
    x = np.zeros((n, len(LEVELS), len(METHODS)))
    for (lv, m), qs in right.items():
        x[qs, list(LEVELS).index(lv), METHODS.index(m)] = 1.0

    def stat(means):  # means: (draws, levels, methods)
        by_level = means.mean(axis=2)
        return (by_level.max(1) - by_level.min(1)) - (means[:, 0].max(1) - means[:, 0].min(1))

    rng = np.random.default_rng(0)
    if joint:
        means = x[rng.integers(0, n, size=(draws, n))].mean(axis=1)
    else:
        cells = [(i, j) for i in range(len(LEVELS)) for j in range(len(METHODS))]
        drawn = [x[rng.integers(0, n, size=(draws, n)), i, j].mean(axis=1) for i, j in cells]
        means = np.stack(drawn, 1).reshape(draws, len(LEVELS), len(METHODS))
    low, high = np.percentile(stat(means), [2.5, 97.5])
    return 100 * float(stat(x.mean(axis=0)[None])[0]), 100 * float(low), 100 * float(high)


@pytest.mark.parametrize(
    "per_level, per_method, s_cov, s_meth, says",
    [
        # coverage moves every method by 10 points a level (5 of 50 questions), the methods differ by 2
        ({"cov100_d0": 25, "cov80_d0": 20, "cov60_d0": 15}, [0, 1, 0, 1, 0], 20.0, 2.0, "holds"),
        # the opposite: coverage moves Acc by 2 points, the methods differ by 20
        ({"cov100_d0": 20, "cov80_d0": 19, "cov60_d0": 19}, [0, 10, 0, 10, 5], 2.0, 20.0, "reversed"),
        # m(c): 50.8, 40.8, 20 (S_cov 30.8); the methods 2 points apart at full coverage, 20 at 60%
        (None, None, 30.8, 2.0, "holds"),
    ],
)
def test_the_spreads_on_a_case_with_a_known_answer(tmp_path, per_level, per_method, s_cov, s_meth, says):
    right = nested(per_level or {}, per_method or [0] * 5)
    if per_level is None:  # the methods 2 points apart at full coverage, 20 at 60%: S_meth is full coverage's
        right = nested({"cov100_d0": 25, "cov80_d0": 20, "cov60_d0": 5}, [0, 1, 0, 1, 0])
        right |= {("cov60_d0", m): list(range(k)) for m, k in zip(METHODS, [5, 15, 5, 15, 10], strict=True)}
    line = judge([e_claim()], sweep(tmp_path, right)).iloc[0]
    assert (line["s_cov"], line["s_meth"]) == pytest.approx((s_cov, s_meth))
    delta, low, high = by_hand(right, 50)
    assert line["delta"] == pytest.approx(s_cov - s_meth) == pytest.approx(delta)
    assert (line["ci_low"], line["ci_high"]) == pytest.approx((low, high))
    assert line["verdict"] == line["claim verdict"] == says
    assert line["seeds"] == "200 201" and line["questions"] == 50 and line["rows"] == "S_cov − S_meth"
    each = f"{s_cov - s_meth:+.2f} ({s_cov:.2f} − {s_meth:.2f})"
    assert line["seed deltas"] == f"200: {each} / 201: {each}"
    # the provenance every line carries: config A the methods at full coverage, B the lower levels'
    assert line["config A"] == " ".join(f"{m}@cov100_d0" for m in METHODS)
    assert line["config B"] == " ".join(f"{m}@{lv}" for lv in ("cov80_d0", "cov60_d0") for m in METHODS)
    assert (line["commit"], line["code"], line["lm"], line["split"]) == (
        "e1e1e1",
        "k74",
        "tiny_lm@f00d",
        "judge",
    )


def test_the_ci_draws_each_question_with_all_its_cells(tmp_path):
    """Every method answers the same questions at full coverage (S_meth 0 in every draw) and each lower level
    loses the same 4 of 40 for all: drawn together, S_cov − S_meth's CI lies above 0; drawn cell by cell,
    five independent means spread by noise alone and the CI holds 0."""
    right = nested({"cov100_d0": 24, "cov80_d0": 20, "cov60_d0": 16}, [0] * 5)
    line = judge([e_claim()], sweep(tmp_path, right, n=40)).iloc[0]
    delta, low, high = by_hand(right, 40)
    assert (line["delta"], line["ci_low"], line["ci_high"]) == pytest.approx((20.0, low, high))
    assert line["verdict"] == "holds"
    _, apart_low, apart_high = by_hand(right, 40, joint=False)
    assert apart_low < 0 < apart_high  # the case tells the two apart


def test_the_papers_lines_are_kept_as_judged_when_ours_joins(tmp_path):
    """make claims-evidence: the E sweep judged with --keep experiments/results/claims.csv. Every H and M
    line of the shipped table comes back with the same values, cell for cell (csv and markdown), marked
    kept; the E line follows with its provenance."""
    shipped = pd.read_csv(RESULTS / "claims.csv", dtype=str, keep_default_na=False)
    # the papers' lines as judged
    shipped[shipped["kind"] != "E"].to_csv(tmp_path / "claims.csv", index=False)
    shutil.copy(RESULTS / "claims.md", tmp_path / "claims.md")
    old = pd.read_csv(tmp_path / "claims.csv", dtype=str, keep_default_na=False)
    runs = tmp_path / "outputs"
    sweep(runs, nested({"cov100_d0": 25, "cov80_d0": 20, "cov60_d0": 15}, [0, 1, 0, 1, 0]))
    block = write_claims([runs], tmp_path / "claims.md", SPEC, keep=tmp_path / "claims.csv")
    new = pd.read_csv(tmp_path / "claims.csv", dtype=str, keep_default_na=False)
    assert new.iloc[: len(old)][list(old.columns)].equals(old)
    # each marked kept: from this table, or from the one it was kept from before
    sources = {str(tmp_path / "claims.csv"), "experiments/results/claims.csv"}
    assert set(new.iloc[: len(old)]["source"]) <= sources
    assert all(new.iloc[: len(old)]["source"] != "")
    e = new.iloc[len(old) :]
    assert list(e["kind"]) == ["E"] and list(e["verdict"]) == ["holds"] and e["source"].iloc[0] == ""
    provenance = ["e1e1e1", "k74", "tiny_lm@f00d", "judge", "200 201"]
    assert list(e[["commit", "code", "lm", "split", "seeds"]].iloc[0]) == provenance

    def table_lines(text):  # the claims table's lines, each as its cells (the padding aside)
        lines = text[: text.index("\n\nClaims: ")].splitlines()
        return [[c.strip() for c in line.split("|")] for line in lines if line.startswith("| ")]

    before = (RESULTS / "claims.md").read_text()
    before = before[before.index("<!-- claims: begin") :]
    papers = [line for line in table_lines(before) if line[1] != "rag_lab"]
    assert table_lines(block)[: len(papers)] == papers
    ours = table_lines(block)[-1]
    assert ours[:6] == ["", "rag_lab", "E", e_claim().claim, "S_cov − S_meth", "acc"]
    assert ours[6].endswith("(S_cov 20.00, S_meth 2.00)") and ours[-2:] == ["holds", ""]
    assert "Our own claim (E): holds." in block and "## History" in (tmp_path / "claims.md").read_text()


def test_verdict_words_are_the_papers_claims_words():
    for low, high in [(0.5, 3.0), (-3.0, -0.5), (-0.5, 3.0), (0.0, 1.0), (-1.0, 0.0)]:
        assert side(low, high) == verdict(low, high, Check("acc"))


@pytest.mark.parametrize(
    "cell, says",
    [
        ({"corpus": {"distractors": 2}}, r"corpus.distractors 2, not 0"),
        ({"corpus": {"coverage": 0.9}}, r"level cov100_d0: corpus.coverage 0.9, not 1.0"),
        ({"provenance": {"seed": 101}}, r"seed 101, not a judge seed \(200, 201\)"),
        ({"provenance": {"split": "test"}}, r"split test, not the judge split"),
    ],
)
def test_a_sweep_off_the_claims_design_is_refused_in_one_line(tmp_path, cell, says):
    right = nested({"cov100_d0": 10, "cov80_d0": 8, "cov60_d0": 6}, [0] * 5)
    with pytest.raises(RagLabError, match=says):
        judge([e_claim()], sweep(tmp_path, right, n=20, **cell))


def test_cells_on_other_questions_and_missing_cells(tmp_path):
    right = nested({"cov100_d0": 10, "cov80_d0": 8, "cov60_d0": 6}, [0] * 5)
    runs = sweep(tmp_path, right, n=20)
    with (tmp_path / "apex-cov60_d0-1" / "records.jsonl").open("a") as f:
        f.write(json.dumps({"id": "q99", "acc": 1.0}) + "\n")
    with pytest.raises(RagLabError, match=r"row apex at cov60_d0: not the questions of stoprag at cov100_d0 "
                                          r"\(seed 201, question q99 is in one of them only\)"):  # fmt: skip
        judge([e_claim()], runs)
    line = judge(
        [e_claim()], [r for r in runs if r.name != "apex-cov60_d0-1" and "dapo-cov80" not in r.name]
    ).iloc[0]
    assert (
        line["verdict"] == "no runs"
        and line["note"] == "evidence_claims has no runs of 1 of 15 cells: dapo at cov80_d0"
    )


@pytest.mark.parametrize(
    "change, says",
    [
        ({"seeds": [100, 101, 102]}, r"claim 11: field 'seeds' must be \[200, 201\]"),
        ({"levels": ["cov100_d0"]}, r"claim 11: field 'levels' needs two or more"),
        ({"across": None}, r"claim 11: missing field 'across'"),
    ],
)
def test_a_malformed_e_claim_is_one_line(tmp_path, change, says):
    spec = yaml.safe_load(SPEC.read_text())
    entry = spec["claims"][-1]
    for key, value in change.items():
        entry.pop(key) if value is None else entry.update({key: value})
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(spec, allow_unicode=True))
    with pytest.raises(RagLabError, match=says):
        read_spec(tmp_path / "claims.yaml")


def test_the_shipped_e_claim_names_what_its_experiment_sweeps():
    """conf/experiment/evidence_claims.yaml: the claim's rows, levels and own seeds, the judge split and all
    its questions; the rows and levels are options of evidence_synth's groups."""
    claim = e_claim()
    config = yaml.safe_load((CONF_DIR / "experiment" / f"{claim.experiment}.yaml").read_text())
    assert config["experiment"]["name"] == claim.experiment and config["defaults"][0] == "evidence_synth"
    assert (config["eval"]["split"], config["eval"]["limit"]) == ("judge", None)
    params = config["hydra"]["sweeper"]["params"]
    assert params[claim.by].split(",") == list(claim.rows) == list(METHODS)
    assert params[claim.across].split(",") == list(claim.levels) == list(LEVELS)
    assert [int(s) for s in str(params["seed"]).split(",")] == list(claim.seeds) == [200, 201]
    for group, options in ((claim.by, claim.rows), (claim.across, claim.levels)):
        assert all((CONF_DIR / group / f"{o}.yaml").exists() for o in options), group


def test_the_judgement_sweeps_only_the_claims_cells():
    """Composed as `python -m rag_lab.run experiment=evidence_claims` composes it: the sweep is the 5 rows × 3
    levels × 2 seeds and nothing that evidence_synth (or an experiment under it) sweeps besides."""
    from hydra import compose, initialize_config_dir

    claim = e_claim()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[f"experiment={claim.experiment}"], return_hydra_config=True)
    params = {k: str(v).split(",") for k, v in cfg.hydra.sweeper.params.items()}
    assert params == {claim.by: list(claim.rows), claim.across: list(claim.levels), "seed": ["200", "201"]}
    assert (cfg.experiment.name, cfg.eval.split, cfg.eval.limit) == (claim.experiment, "judge", None)
