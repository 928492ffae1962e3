"""The claims table (rag_lab/claims.py) on hand-made runs: each test's Δ, CI and p are the paired bootstrap
over questions with their seeds, verdicts follow the CI's side, and the shipped spec names real rows."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import yaml

from rag_lab import CONF_DIR
from rag_lab.claims import BEGIN, END, Check, Claim, judge, read_spec, write_claims
from rag_lab.core.errors import RagLabError
from rag_lab.eval.stats import paired_bootstrap
from rag_lab.reporting.claims_page import TITLE

JUDGE = {"split": "judge", "seeds": [100, 101, 102]}


def make_run(root, experiment, by, row, seed, scores: dict[str, list[float]], provenance: dict | None = None):
    """A finished run of ``row`` with ``scores`` per question; seed ``i`` is judge seed ``100 + i``, and its
    provenance.json is one version's (``provenance`` changes fields)."""
    run = root / f"{experiment}-{row}-{seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"{by}={row}", f"seed={seed}"]))
    config = {"experiment": {"name": experiment}, "seed": seed, "row": row}  # runs of one config count once
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    n = len(next(iter(scores.values())))
    records = [{"id": f"q{i}"} | {k: v[i] for k, v in scores.items()} for i in range(n)]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "metrics.json").write_text("{}")
    prov = {"commit": "c0ffee", "dirty": False, "code": "k1", "config": f"{row}-{seed}",
            "row_config": f"{experiment}/{row}", "lm": "tiny_lm@f00d", "split": "judge", "seed": 100 + seed,
            "n": n} | (provenance or {})  # fmt: skip
    (run / "provenance.json").write_text(json.dumps(prov))
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
    assert acc["seeds"] == "100 101" and acc["questions"] == 80
    assert acc["seed deltas"] == " / ".join(
        f"{s}: {100 * d:+.2f}" for s, d in zip((100, 101), expected.seed_deltas, strict=True)
    )
    assert (acc["commit"], acc["code"], acc["lm"], acc["split"]) == ("c0ffee", "k1", "tiny_lm@f00d", "judge")
    assert (acc["config A"], acc["config B"]) == ("stop/stoprag", "stop/fixed_iter")
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


def test_a_new_judgement_leads_the_page_and_the_last_one_moves_under_history(runs, tmp_path):
    """claims.md opens with the latest judgement's table, then its stamp (its runs' commit and dates) and
    the reading; the same runs written again replace them in place, the notes written by hand kept; runs
    of another commit lead the page, and the judgement they replace, its notes with it, moves under
    History without its markers."""
    root, base, better = runs
    spec = tmp_path / "claims.yaml"
    spec.write_text(yaml.safe_dump({"judge": JUDGE, "claims": [
        {"paper": "Stop-RAG", "kind": "H", "claim": "c", "experiment": "stop", "by": "policy",
         "rows": ["stoprag", "fixed_iter"], "tests": [{"metric": "acc"}]},
        {"paper": "Stop-RAG", "kind": "M", "claim": "m", "experiment": "stop", "by": "policy",
         "rows": ["fixed_iter", "stoprag"], "tests": [{"metric": "acc"}]}]}))  # fmt: skip
    out = tmp_path / "claims.md"
    first = write_claims([root], out, spec)
    assert out.read_text().startswith(f"{TITLE}\n\n{first}\n**Judged** at commit `c0ffee` on an unrecorded")
    assert "Claims: 1 holds, 1 reversed." in first and "## History" not in out.read_text()
    # the line shows the difference and its CI, as the csv has them
    row = pd.read_csv(tmp_path / "claims.csv").iloc[0]
    assert f"{row.delta:+.2f} [{row.ci_low:+.2f}, {row.ci_high:+.2f}]" in first
    out.write_text(out.read_text() + "\n## Why\n\nnotes by hand\n")
    noted = out.read_text()
    write_claims([root], out, spec)
    assert out.read_text() == noted
    later = tmp_path / "later"
    for seed in (0, 1):  # other runs: another commit, the stopper no better than fixed T
        for row_name in ("stoprag", "fixed_iter"):
            make_run(later, "stop", "policy", row_name, seed, {"acc": base.tolist()},
                     {"commit": "beef", "started": f"2026-12-0{seed + 1}T10:00:00"})  # fmt: skip
    second = write_claims([later], out, spec)
    text = out.read_text()
    current, history = text.split("\n## History\n")
    assert current.startswith(
        f"{TITLE}\n\n{second}\n**Judged** at commit `beef` on 2026-12-01 to 2026-12-02 · "
    )
    assert current.count("## Reading the claims table") == 1 and "notes by hand" not in current
    assert "Claims: 2 not shown." in current and text.count(BEGIN) == text.count(END) == 1
    assert history.count("\n### Judged at commit c0ffee on an unrecorded date\n") == 1
    assert "Reading the claims table" not in history and "\n#### Why\n\nnotes by hand" in history
    assert all(line in history for line in first.splitlines()[1:-1])  # the first table, its markers aside
    write_claims([later], out, spec)
    assert out.read_text() == text


def test_keep_takes_only_the_claims_without_runs_from_the_earlier_table(runs, tmp_path):
    root, _, _ = runs
    spec = tmp_path / "claims.yaml"
    entries = [{"paper": "Stop-RAG", "kind": "H", "claim": "c", "experiment": "stop", "by": "policy",
                "rows": ["stoprag", "fixed_iter"], "tests": [{"metric": "acc"}]},
               {"paper": "Stop-RAG", "kind": "M", "claim": "x", "experiment": "other", "by": "policy",
                "rows": ["a", "b"], "tests": [{"metric": "acc"}, {"metric": "rc", "sign": "<"}]}]  # fmt: skip
    spec.write_text(yaml.safe_dump({"judge": JUDGE, "claims": entries}))
    cols = "paper,claim,rows,metric,delta,ci_low,ci_high,p,seeds,questions,verdict,claim verdict"
    prov = ",commit,code,config A,config B,lm,split"
    earlier = tmp_path / "earlier.csv"
    earlier.write_text(
        cols + prov + "\n"
        "Stop-RAG,c,stoprag − fixed_iter,acc,-9.0,-12.0,-6.0,0.0,100 101 102,80,reversed,reversed,"
        "c1,k0,h1,h2,lm,judge\n"
        "Stop-RAG,x,a − b,acc,4.0,1.0,7.0,0.01,100 101 102,300,holds,holds,c1,k0,h3,h4,lm,judge\n"
        "Stop-RAG,x,a − b,rc,-1.0,-2.0,-0.5,0.0,100 101 102,300,holds,holds,c1,k0,h3,h4,lm,judge\n"
    )
    out = tmp_path / "claims.md"
    write_claims([root], out, spec, keep=earlier)
    table = pd.read_csv(tmp_path / "claims.csv")
    # the claim with runs is judged on them, not taken from the earlier table; the other keeps its two lines
    assert list(table["verdict"]) == ["holds", "holds", "holds"] and table["delta"].iloc[0] > 0
    assert list(table["source"].isna()) == [True, False, False] and table["delta"].iloc[1] == 4.0
    assert list(table["commit"]) == ["c0ffee", "c1", "c1"] and list(table["kind"]) == ["H", "M", "M"]
    # the provenance table marks the kept line with the file it came from
    kept_line = [line for line in out.read_text().splitlines() if line.startswith("| Stop-RAG | M ")][-1]
    assert str(earlier) in kept_line and "| c1 " in kept_line
    # without --keep it has no runs; an earlier table that is not one is a line naming the file
    write_claims([root], out, spec)
    assert list(pd.read_csv(tmp_path / "claims.csv")["verdict"]) == ["holds", "no runs", "no runs"]
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(RagLabError, match=r"bad.csv: not a claims table \(no column claim, metric, rows"):
        write_claims([root], out, spec, keep=tmp_path / "bad.csv")
    # a line without its provenance is not kept
    bare = tmp_path / "bare.csv"
    bare.write_text(cols + "\nStop-RAG,x,a − b,acc,4.0,1.0,7.0,0.01,3,300,holds,holds\n"
                    "Stop-RAG,x,a − b,rc,-1.0,-2.0,-0.5,0.0,3,300,holds,holds\n")  # fmt: skip
    with pytest.raises(
        RagLabError, match=r"bare.csv: claim 'x' \(a − b\) has no commit: a line is kept only"
    ):
        write_claims([root], out, spec, keep=bare)


@pytest.mark.parametrize(
    "entry, says",
    [
        ({"paper": "P"}, r"claim 1: missing field 'kind'"),
        ({"paper": "P", "kind": "H"}, r"claim 1: missing field 'claim'"),
        ({"paper": "P", "kind": "X", "claim": "c", "experiment": "e", "by": "b", "rows": ["a", "b"],
          "tests": []},
         r"claim 1: field 'kind' is 'X', not H \(headline\) or M \(mechanism\)"),
        ({"paper": "P", "kind": "H", "claim": "c", "experiment": "e", "by": "b", "rows": ["a"], "tests": []},
         r"claim 1: field 'rows' needs two rows"),
        ({"paper": "P", "kind": "H", "claim": "c", "experiment": "e", "by": "b", "rows": ["a", "b"],
          "tests": [{"metric": "acc", "sign": ">="}]}, r"claim 1: tests: sign '>=' is not one of >, <"),
        ({"paper": "P", "kind": "H", "claim": "c", "experiment": "e", "by": "b", "rows": ["a", "b"],
          "tests": [{"metric": "acc"}]}, r"claims.yaml: P has 0 mechanism \(M\) claims, not one"),
    ],
)  # fmt: skip
def test_a_malformed_spec_is_one_line_naming_the_claim(tmp_path, entry, says):
    spec = tmp_path / "claims.yaml"
    spec.write_text(yaml.safe_dump({"judge": JUDGE, "claims": [entry]}))
    with pytest.raises(RagLabError, match=says):
        read_spec(spec)


def test_the_shipped_spec_names_rows_its_experiments_sweep():
    """Every claim of conf/claims.yaml: its experiment exists, sweeps ``by`` and has both rows (and each
    test's other B); the experiment runs on the judge split and seeds; one H and one M per paper."""
    spec = read_spec()
    papers = [c for c in spec.claims if c.kind in ("H", "M")]  # and our own, E: tests/test_claims_evidence.py
    assert len({c.paper for c in papers}) == 5 and len(papers) == 10 and len(spec.claims) == 11
    for claim in papers:
        config = yaml.safe_load((CONF_DIR / "experiment" / f"{claim.experiment}.yaml").read_text())
        assert config["experiment"]["name"] == claim.experiment
        assert config["eval"]["split"] == spec.split
        params = config["hydra"]["sweeper"]["params"]
        assert [int(s) for s in str(params["seed"]).split(",")] == list(spec.seeds)
        values = params[claim.by].split(",")
        wanted = {*claim.rows, *(t.against for t in claim.tests if t.against)}
        assert wanted <= set(values), (claim.claim, values)
        assert all((CONF_DIR / claim.by.lstrip("+") / f"{v}.yaml").exists() for v in wanted)


def test_a_judgement_commits_its_runs_provenance_and_the_table_is_checked_against_it(
    runs, tmp_path, capfd, monkeypatch
):
    """write_claims copies each judged run's provenance.json and configs (not its records) beside the page,
    under the runs' commit; --check reads them back without the runs and refuses, in one line, a table
    whose provenance they do not give, or a judgement with no committed provenance."""
    from conftest import cli

    root, base, _ = runs
    spec = tmp_path / "claims.yaml"
    spec.write_text(yaml.safe_dump({"judge": JUDGE, "claims": [
        {"paper": "Stop-RAG", "kind": "H", "claim": "c", "experiment": "stop", "by": "policy",
         "rows": ["stoprag", "fixed_iter"], "tests": [{"metric": "acc"}, {"metric": "rc", "sign": "<"}]},
        {"paper": "Stop-RAG", "kind": "M", "claim": "m", "experiment": "stop", "by": "policy",
         "rows": ["fixed_iter", "stoprag"], "tests": [{"metric": "acc"}]}]}))  # fmt: skip
    out = tmp_path / "results" / "claims.md"
    write_claims([root], out, spec)
    folder = tmp_path / "results" / "judgements" / "c0ffee"
    judged = sorted(p for p in root.iterdir() if (p / "metrics.json").exists())
    assert sorted(p.name for p in folder.iterdir()) == [run.name for run in judged]
    for run in judged:
        copied = sorted(str(p.relative_to(folder / run.name)) for p in (folder / run.name).rglob("*"))
        assert copied == [".hydra", ".hydra/overrides.yaml", "config.yaml", "provenance.json"]
        assert all((folder / run.name / f).read_bytes() == (run / f).read_bytes() for f in copied[1:])
    check = ["--check", "--out", str(out), "--spec", str(spec)]
    rc, said = cli("claims", check, capfd, monkeypatch)
    csv = out.with_suffix(".csv")
    assert (rc, said.strip()) == (
        0,
        f"{csv}: 3 lines, their provenance that of the runs committed under {folder.parent}",
    )
    table = pd.read_csv(csv, dtype=str)
    table.loc[2, "config A"] = "0" * 16  # the mechanism's line says another row hash than its runs recorded
    table.to_csv(csv, index=False)
    rc, said = cli("claims", check, capfd, monkeypatch)
    says = f"error: Stop-RAG (M) fixed_iter − stoprag: config A {'0' * 16} in the table, but stop/fixed_iter"
    assert (rc, said.strip()) == (1, f"{says} in the committed provenance ({folder})")
    write_claims([root], out, spec)
    later = tmp_path / "later"
    for seed in (0, 1):  # another judgement: the same rows at another commit
        for row_name in ("stoprag", "fixed_iter"):
            make_run(later, "stop", "policy", row_name, seed, {"acc": base.tolist(), "rc": [1.0] * 80},
                     {"commit": "beef"})  # fmt: skip
    write_claims([later], out, spec)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["beef", "c0ffee"]
    assert cli("claims", check, capfd, monkeypatch)[0] == 0
    shutil.rmtree(folder.parent / "beef")
    rc, said = cli("claims", check, capfd, monkeypatch)
    says = (
        f"error: {csv}: the judgement at commit beef has no committed provenance ({folder.parent / 'beef'};"
    )
    assert (rc, said.strip()) == (1, f"{says} {folder.parent}/README.md)")
    # a judgement whose runs were not kept says so in its folder: its lines are named unchecked, not checked
    (folder.parent / "beef").mkdir()
    (folder.parent / "beef" / "NOT_KEPT.md").write_text("not kept\n")
    rc, said = cli("claims", check, capfd, monkeypatch)
    assert rc == 0 and "unchecked: the judgement at beef, whose runs were not kept (NOT_KEPT.md)" in said
