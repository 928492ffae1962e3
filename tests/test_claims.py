"""The claims table (rag_lab/claims.py) on hand-made runs: each test's Δ, CI and p are the paired bootstrap
over questions with their seeds, verdicts follow the CI's side, and the shipped spec names real rows."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from rag_lab import CONF_DIR
from rag_lab.claims import BEGIN, END, Check, Claim, judge, read_spec, write_claims
from rag_lab.errors import RagLabError
from rag_lab.eval.stats import paired_bootstrap


def make_run(root, experiment, by, row, seed, scores: dict[str, list[float]]):
    run = root / f"{experiment}-{row}-{seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{by}={row}", f"seed={seed}"]))
    config = {"experiment": {"name": experiment}, "seed": seed, "row": row}  # runs of one config count once
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    n = len(next(iter(scores.values())))
    records = [{"id": f"q{i}"} | {k: v[i] for k, v in scores.items()} for i in range(n)]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.json").write_text("{}")
    return run


@pytest.fixture
def runs(tmp_path):
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, 80).astype(float)
    better = np.maximum(base, rng.integers(0, 2, 80))
    for seed in (0, 1):
        make_run(tmp_path, "stop", "policy", "stoprag", seed, {"acc": better.tolist(), "rc": [2.0] * 80})
        make_run(tmp_path, "stop", "policy", "fixed_iter", seed, {"acc": base.tolist(), "rc": [10.0] * 80})
    return tmp_path, base, better


def test_each_test_is_the_paired_bootstrap_and_the_verdicts_follow_the_ci(runs):
    root, base, better = runs
    claims = [
        Claim("Stop-RAG", "better, fewer", "stop", "policy", ("stoprag", "fixed_iter"),
              (Check("acc", ">"), Check("rc", "<"))),
        Claim("Stop-RAG", "reversed", "stop", "policy", ("fixed_iter", "stoprag"), (Check("acc", ">"),)),
        Claim("X", "no runs", "other", "policy", ("a", "b"), (Check("acc", ">"),)),
    ]  # fmt: skip
    table = judge(claims, sorted(p for p in root.iterdir() if p.is_dir()))
    expected = paired_bootstrap(list(better) * 2, list(base) * 2, questions=[f"q{i}" for i in range(80)] * 2,
                                seeds=["0"] * 80 + ["1"] * 80)  # fmt: skip
    acc = table.iloc[0]
    assert acc["delta"] == pytest.approx(100 * expected.delta) and acc["p"] == pytest.approx(expected.p_value)
    assert (acc["ci_low"], acc["ci_high"]) == pytest.approx((100 * expected.ci_low, 100 * expected.ci_high))
    assert acc["seeds"] == 2 and acc["questions"] == 80
    assert list(table["verdict"]) == ["holds", "holds", "reversed", "no runs"]
    assert list(table["claim verdict"]) == ["holds", "holds", "reversed", "no runs"]
    assert (
        "stop has policy" not in table.iloc[3]["note"] and "other has policy: none" in table.iloc[3]["note"]
    )


def test_a_non_inferiority_margin_and_a_mixed_claim(runs):
    """A − B = −0.25 point (one question of 400 lost; the CI's low end, 3 lost in a draw, −0.75): not above
    0, but above −1 (the margin); a claim with one test not shown is not shown."""
    root, _, _ = runs
    ones = [1.0] * 400
    make_run(
        root, "dapo", "policy.stages", "[1,2]", 0, {"acc": [0.0] + ones[1:], "retrieval_count": [1.0] * 400}
    )
    make_run(root, "dapo", "policy.stages", "[1]", 0, {"acc": ones, "retrieval_count": [2.0] * 400})
    runs_ = sorted(p for p in root.iterdir() if p.is_dir())
    claim = Claim("DAPO", "stage 2", "dapo", "policy.stages", ("[1,2]", "[1]"),
                  (Check("retrieval_count", "<"), Check("acc", ">", -1.0)))  # fmt: skip
    table = judge([claim], runs_)
    assert list(table["verdict"]) == ["holds", "holds"]
    # the margin test's p is against the margin, not against 0: every draw loses less than 1 point
    ones_lost = paired_bootstrap([0.0] + ones[1:], ones, null=-0.01)
    assert table.iloc[1]["p"] == ones_lost.p_value and table.iloc[1]["p"] < 0.05
    assert paired_bootstrap([0.0] + ones[1:], ones).p_value > 0.05
    strict = Claim("DAPO", "stage 2", "dapo", "policy.stages", ("[1,2]", "[1]"),
                   (Check("retrieval_count", "<"), Check("acc", ">")))  # fmt: skip
    assert list(judge([strict], runs_)["claim verdict"]) == ["not shown", "not shown"]


def test_the_table_replaces_only_its_block(runs, tmp_path):
    root, _, _ = runs
    spec = tmp_path / "claims.yaml"
    spec.write_text(yaml.safe_dump({"claims": [{"paper": "Stop-RAG", "claim": "c", "experiment": "stop",
        "by": "policy", "rows": ["stoprag", "fixed_iter"], "tests": [{"metric": "acc"}]}]}))  # fmt: skip
    out = tmp_path / "claims.md"
    out.write_text(f"# Claims\n\nintro\n\n{BEGIN}\nSTALE\n{END}\n\n## Why\n\nnotes by hand\n")
    write_claims([root], out, spec)
    text = out.read_text()
    assert text.startswith("# Claims\n\nintro\n\n" + BEGIN) and text.endswith("## Why\n\nnotes by hand\n")
    assert "STALE" not in text and "| Stop-RAG " in text and "Claims: 1 holds." in text
    assert "Papers whose headline (the paper's first claim) holds: 1 of 1 (Stop-RAG)." in text
    # the line shows the difference and its CI, as the csv has them
    row = pd.read_csv(tmp_path / "claims.csv").iloc[0]
    assert f"{row.delta:+.2f} [{row.ci_low:+.2f}, {row.ci_high:+.2f}]" in text


def test_keep_takes_only_the_claims_without_runs_from_the_earlier_table(runs, tmp_path):
    root, _, _ = runs
    spec = tmp_path / "claims.yaml"
    entries = [{"paper": "Stop-RAG", "claim": "c", "experiment": "stop", "by": "policy",
                "rows": ["stoprag", "fixed_iter"], "tests": [{"metric": "acc"}]},
               {"paper": "X", "claim": "x", "experiment": "other", "by": "policy", "rows": ["a", "b"],
                "tests": [{"metric": "acc"}, {"metric": "rc", "sign": "<"}]}]  # fmt: skip
    spec.write_text(yaml.safe_dump({"claims": entries}))
    earlier = tmp_path / "earlier.csv"
    earlier.write_text(
        "paper,claim,rows,metric,delta,ci_low,ci_high,p,seeds,questions,verdict,claim verdict\n"
        "Stop-RAG,c,stoprag − fixed_iter,acc,-9.0,-12.0,-6.0,0.0,3,80,reversed,reversed\n"
        "X,x,a − b,acc,4.0,1.0,7.0,0.01,3,300,holds,holds\n"
        "X,x,a − b,rc,-1.0,-2.0,-0.5,0.0,3,300,holds,holds\n"
    )
    out = tmp_path / "claims.md"
    write_claims([root], out, spec, keep=earlier)
    table = pd.read_csv(tmp_path / "claims.csv")
    # the claim with runs is judged on them, not taken from the earlier table; the other keeps its two lines
    assert list(table["verdict"]) == ["holds", "holds", "holds"] and table["delta"].iloc[0] > 0
    assert list(table["source"].isna()) == [True, False, False] and table["delta"].iloc[1] == 4.0
    kept_from = f"Not run again, kept from the earlier table ({earlier}; its git history dates it): X, a − b."
    assert kept_from in out.read_text()
    # without --keep it has no runs; an earlier table that is not one is a line naming the file
    write_claims([root], out, spec)
    assert list(pd.read_csv(tmp_path / "claims.csv")["verdict"]) == ["holds", "no runs", "no runs"]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(RagLabError, match=r"bad.csv: not a claims table \(no column claim, metric, rows"):
        write_claims([root], out, spec, keep=tmp_path / "bad.csv")


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"paper": "P"}, r"claim 1: missing field 'claim'"),
        ({"paper": "P", "claim": "c", "experiment": "e", "by": "b", "rows": ["a"], "tests": []},
         r"claim 1: field 'rows' needs two rows"),
        ({"paper": "P", "claim": "c", "experiment": "e", "by": "b", "rows": ["a", "b"],
          "tests": [{"metric": "acc", "sign": ">="}]}, r"claim 1: tests: sign '>=' is not one of >, <"),
    ],
)  # fmt: skip
def test_a_malformed_spec_is_one_line_naming_the_claim(tmp_path, entry, says):
    spec = tmp_path / "claims.yaml"
    spec.write_text(yaml.safe_dump({"claims": [entry]}))
    with pytest.raises(RagLabError, match=says):
        read_spec(spec)


def test_the_shipped_spec_names_rows_its_experiments_sweep():
    """Every claim of conf/claims.yaml: its experiment exists, sweeps ``by`` and has both rows."""
    for claim in read_spec():
        config = yaml.safe_load((CONF_DIR / "experiment" / f"{claim.experiment}.yaml").read_text())
        assert config["experiment"]["name"] == claim.experiment
        swept = config["hydra"]["sweeper"]["params"][claim.by]
        values = (
            [v.strip() for v in swept.replace("],[", "]|[").split("|")] if "[" in swept else swept.split(",")
        )
        assert set(claim.rows) <= set(values), (claim.claim, values)
