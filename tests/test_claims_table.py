"""The claims table's bookkeeping (rag_lab/claims.py), pinned where `make mutate` found it loose: the verdict
on each side of a margin, raw units for a metric that is not a percentage, the rendered line and sentence,
the spec's defaults and its one-line errors, --keep across two earlier tables, the block replaced in the
README with nothing around it moved, and the reading section naming the claims whose tests disagree."""

import math

import pandas as pd
import pytest
import yaml
from test_claims import JUDGE, make_run

from rag_lab.claims import (
    BEGIN,
    END,
    Check,
    Claim,
    _p,
    headlines,
    judge,
    kept,
    read_spec,
    render,
    verdict,
    write_claims,
)
from rag_lab.core.errors import RagLabError
from rag_lab.reporting.claims_page import TITLE, reading
from rag_lab.reporting.pages import HISTORY_LEAD


def test_verdicts_on_both_sides_of_a_margin():
    # "<": A − B must lie below the margin; a CI wholly above it is reversed
    assert verdict(0.4, 2.0, Check("rc", "<")) == "reversed"
    assert verdict(-2.0, -0.4, Check("rc", "<")) == "holds"
    # "<" with a margin: A − B below +0.5 (searches at most half a retrieval more)
    assert verdict(0.1, 0.3, Check("rc", "<", 0.5)) == "holds"
    assert verdict(0.6, 0.9, Check("rc", "<", 0.5)) == "reversed"
    # a CI whose end touches the margin is not wholly on its side
    assert verdict(0.0, 1.0, Check("acc")) == "not shown"
    assert verdict(-1.0, 0.0, Check("acc")) == "not shown"
    assert verdict(-1.0, 0.3, Check("acc", ">", -1.0)) == "not shown"


def test_p_values_and_counts_as_written():
    assert [_p(None), _p(math.nan), _p(0.0004), _p(0.001), _p(0.25)] == ["—", "—", "<0.001", "0.001", "0.250"]
    t = pd.DataFrame({"paper": list("AABBCC"), "kind": list("HMHMHM"), "claim verdict": ["holds", "not shown",
                      "reversed", "holds", "not shown", "holds"]})  # fmt: skip
    assert headlines(t) == "Headlines (H) that hold: 1 of 3 (A). Mechanisms (M) that hold: 2 of 3 (B, C)."
    assert headlines(t.iloc[2:3]) == "Headlines (H) that hold: 0 of 1. Mechanisms (M) that hold: 0 of 0."
    t.loc[2, "claim verdict"] = "holds"
    assert headlines(t).startswith("Headlines (H) that hold: 2 of 3 (A, B).")


def _runs(root):
    ones = [1.0] * 40
    make_run(root, "e", "policy", "a", 0, {"acc": ones, "retrieval_count": [1.0] * 40})
    make_run(root, "e", "policy", "b", 0, {"acc": [0.0] * 10 + ones[10:], "retrieval_count": [3.5] * 40})
    make_run(root, "f", "policy", "a", 0, {"acc": ones, "retrieval_count": [1.0] * 40})
    make_run(root, "f", "policy", "c", 0, {"acc": ones, "retrieval_count": [1.0] * 40})
    make_run(root, "f", "other", "x", 0, {"acc": ones})  # no policy override: not a row of the claims
    (make_run(root, "g", "policy", "a", 0, {"acc": ones}) / "config.yaml").unlink()  # no experiment
    return sorted(p for p in root.iterdir() if p.is_dir())


def test_raw_units_the_margin_label_and_a_claim_with_one_row_missing(tmp_path):
    claims = [
        Claim("P", "fewer", "e", "policy", ("a", "b"),
              (Check("retrieval_count", "<"), Check("acc", ">", -1.0))),
        Claim("Q", "one row", "f", "policy", ("a", "b"), (Check("acc", ">"),)),
    ]  # fmt: skip
    table = judge(claims, _runs(tmp_path))
    rc, acc, missing = (table.iloc[i] for i in range(3))
    # retrieval counts stay in retrievals (every question 1.0 − 3.5); Acc is in points (10 of 40 lost: +25)
    assert (rc["delta"], rc["ci_low"], rc["ci_high"]) == (-2.5, -2.5, -2.5)
    assert acc["delta"] == pytest.approx(25.0) and acc["metric"] == "acc (margin -1)"
    assert rc["metric"] == "retrieval_count"
    # only A has runs: no runs, and the note says which rows the experiment has
    assert missing["verdict"] == "no runs" and missing["note"] == "f has policy: a, c"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_rendered_lines_and_sentence(tmp_path):
    claims = [
        Claim("P", "fewer", "e", "policy", ("a", "b"),
              (Check("retrieval_count", "<"), Check("acc", ">", 60.0))),
        Claim("Q", "one row", "f", "policy", ("a", "b"), (Check("acc", ">"),), kind="M",
              environment="frozen"),
    ]  # fmt: skip
    block = render(judge(claims, _runs(tmp_path)))
    lines = block.splitlines()
    assert lines[0] == BEGIN and lines[-1] == END
    header, _, first, margin, second = (_cells(x) for x in lines[1:6])
    assert header == ["paper", "kind", "claim", "A − B", "metric", "Δ [95% CI]", "p", "Δ per seed", "N",
                      "test", "claim verdict"]  # fmt: skip
    assert first == ["P", "H", "fewer", "a − b", "retrieval_count", "-2.50 [-2.50, -2.50]", "<0.001",
                     "100: -2.50", "40", "holds", "reversed"]  # fmt: skip
    assert margin[4] == "acc (margin +60)" and margin[5].startswith("+25.00 [")
    assert margin[8:] == ["40", "reversed", "reversed"]
    assert second == ["Q", "M", "one row", "a − b", "acc", "—", "—", "", "—", "no runs", "no runs"]
    assert lines[7] == (
        "Claims: 1 reversed, 1 no runs. Headlines (H) that hold: 0 of 1. Mechanisms (M) that hold: 0 of 1."
        " Δ is A − B (percentage points for EM / F1 / Acc / SEPR), its 95% CI and p from a paired bootstrap"
        " over questions, each draw a question with all its seeds; p is two-sided, against 0 or, for a test"
        " with a margin, against the margin; beside it each seed's own Δ (rag_lab/claims.py; the claims:"
        " conf/claims.yaml)."
    )
    # the provenance table: one line per claim and rows, its runs' versions and the environment
    assert lines[9].startswith("Provenance of each line (the runs' provenance.json: commit, code hash,")
    provenance = [_cells(x) for x in lines[13:-2]]
    assert _cells(lines[11])[:4] == ["paper", "kind", "A − B", "environment"] and len(provenance) == 2
    assert provenance[0][:6] == ["P", "H", "a − b", "default LM and world of make demo", "c0ffee", "k1"]
    assert provenance[0][6:] == ["e/a", "e/b", "tiny_lm@f00d", "judge", "100", "—"]
    assert provenance[1][:4] == ["Q", "M", "a − b", "frozen"] and provenance[1][4:-1] == [""] * 7


def test_the_reading_names_each_claim_whose_tests_part_from_its_verdict(tmp_path):
    claims = [
        Claim("P", "fewer", "e", "policy", ("a", "b"),
              (Check("retrieval_count", "<"), Check("acc", ">", 60.0))),
        Claim("Q", "one row", "f", "policy", ("a", "b"), (Check("acc", ">"),), kind="M"),
    ]  # fmt: skip
    text = reading(judge(claims, _runs(tmp_path)))
    assert text.startswith("## Reading the claims table\n\nOne line a test;")
    flat = " ".join(text.split())  # the paragraph is wrapped at 110 characters
    assert " Here: P (H): retrieval_count holds, acc (margin +60) reversed, so reversed. **A trained" in flat
    assert "Q (M)" not in text  # its one test's verdict is its claim's
    assert " Here:" not in reading(judge(claims[1:], _runs(tmp_path / "again")))


def test_the_spec_defaults_and_its_one_line_errors(tmp_path):
    spec = tmp_path / "claims.yaml"
    entry = {"paper": "P", "kind": "H", "claim": "c", "experiment": "e", "by": "b", "rows": ["a", "b"],
             "tests": [{"metric": "acc"}, {"metric": "rc", "sign": "<", "margin": 0.5}]}  # fmt: skip
    m = entry | {"kind": "M", "tests": [{"metric": "acc", "against": "c"}]}
    spec.write_text(yaml.safe_dump({"judge": JUDGE, "claims": [entry, m]}))
    read = read_spec(spec)
    assert read.claims[0].tests == (Check("acc", ">", 0.0), Check("rc", "<", 0.5))
    assert read.claims[1].tests == (Check("acc", ">", 0.0, "c"),) and read.claims[0].environment == ""
    assert (read.split, read.seeds) == ("judge", (100, 101, 102))
    spec.write_text(yaml.safe_dump({"judge": {"split": "test", "seeds": [0, 1, 2]}, "claims": [entry, m]}))
    with pytest.raises(
        RagLabError, match=r"claims.yaml: field 'judge' must be split judge, seeds \[100, 101"
    ):
        read_spec(spec)
    with pytest.raises(RagLabError, match=r"^\S*missing.yaml: No such file or directory$"):
        read_spec(tmp_path / "missing.yaml")
    spec.write_text("claims:\n  - paper: P\n    claim: [unclosed\n")
    with pytest.raises(
        RagLabError, match=r"^\S*claims.yaml:4: malformed yaml \(while parsing a flow sequence\)$"
    ):
        read_spec(spec)
    spec.write_text("claims: \x07\n")  # a reader error: no line to name
    with pytest.raises(RagLabError, match=r"^\S*claims.yaml: malformed yaml \(unacceptable character"):
        read_spec(spec)
    for text in ("- a list\n", "claims: []\n", "claims: 3\n"):
        spec.write_text(text)
        with pytest.raises(RagLabError, match=r"claims.yaml: not a claims spec \(a non-empty 'claims' list"):
            read_spec(spec)


def _earlier(tmp_path, name, lines, source=None):
    path = tmp_path / name
    cols = "paper,claim,rows,metric,delta,ci_low,ci_high,p,seeds,questions,verdict,claim verdict"
    prov = ",commit,code,config A,config B,lm,split"
    path.write_text(cols + prov + (",source" if source else "") + "\n" + "".join(
        f"{x},c1,k0,h1,h2,lm,judge" + (f",{source}" if source else "") + "\n" for x in lines))  # fmt: skip
    return path


def test_keep_across_two_earlier_tables_in_the_specs_order(tmp_path):
    named = (("Z", "z", ("c", "d")), ("X", "x", ("a", "b")), ("Y", "y", ("e", "f")))
    no_runs = [Claim(p, c, "none", "policy", rows, (Check("acc"),)) for p, c, rows in named]
    table = judge(no_runs, _runs(tmp_path))
    earlier = _earlier(tmp_path, "earlier.csv", [
        "X,x,a − b,acc,4.0,1.0,7.0,0.01,3,300,holds,holds",
        "Y,y,e − f,acc,,,,,,,no runs,no runs",
    ])  # fmt: skip
    older = _earlier(
        tmp_path,
        "chained.csv",
        ["Z,z,c − d,acc,-2.0,-3.0,-1.0,0.0,3,300,reversed,reversed"],
        source="older.csv",
    )
    both = pd.concat([pd.read_csv(earlier), pd.read_csv(older)])
    both.to_csv(tmp_path / "both.csv", index=False)
    out = kept(table, tmp_path / "both.csv")
    # the spec's order (Z, X, Y), each kept line naming the table it came from, a "no runs" line not kept
    assert list(out["paper"]) == ["Z", "X", "Y"] and list(out["verdict"]) == ["reversed", "holds", "no runs"]
    assert list(out["source"].iloc[:2]) == ["older.csv", str(tmp_path / "both.csv")]
    assert out["source"].isna().iloc[2]
    # the provenance table marks each kept line with the table it came from
    cells = [_cells(x) for x in render(out).splitlines() if x.startswith("| ")]
    provenance = {c[0]: c[-1] for c in cells if len(c) == 12 and c[0] != "paper"}
    assert provenance == {"Z": "older.csv", "X": str(tmp_path / "both.csv"), "Y": "—"}
    assert "both.csv" not in render(table)
    with pytest.raises(RagLabError, match=r"^\S*absent.csv: cannot read the earlier claims table"):
        kept(table, tmp_path / "absent.csv")


def test_a_page_before_stamps_goes_under_history_and_the_block_into_the_readme(tmp_path):
    root = tmp_path / "runs"
    _runs(root)
    spec = tmp_path / "claims.yaml"
    spec.write_text(yaml.safe_dump({"judge": JUDGE, "claims": [{"paper": "P", "kind": kind, "claim": "c",
        "experiment": "e", "by": "policy", "rows": ["a", "b"], "tests": [{"metric": "acc"}]}
        for kind in "HM"]}))  # fmt: skip
    out, readme = tmp_path / "claims.md", tmp_path / "README.md"
    readme.write_text(f"# Tool\n\n{BEGIN}\nOLD\n{END}\n## Next\n")
    out.write_text(f"# Claims\n{BEGIN}\nOLD\n{END}\n## Why\n")
    block = write_claims([root], out, spec, readme=readme)
    assert readme.read_text() == f"# Tool\n\n{block}## Next\n"
    assert list(pd.read_csv(tmp_path / "claims.csv").columns[:3]) == ["paper", "kind", "claim"]
    # a page without a stamp is not this judgement: it goes under History whole, its markers aside
    for before, kept_lines in ((f"# Claims\n{BEGIN}\nOLD\n{END}\n## Why\n", "OLD\n#### Why"),
                               (f"# Claims\n\n{BEGIN}\nhalf X\n", "half X")):  # fmt: skip
        out.write_text(before)
        write_claims([root], out, spec)
        current = f"{TITLE}\n\n{block}\n**Judged** at commit `c0ffee` on an unrecorded date · "
        assert out.read_text().startswith(current) and out.read_text().count(BEGIN) == 1
        assert out.read_text().endswith(
            f"## History\n\n{HISTORY_LEAD}\n\n### The page before stamps\n\n{kept_lines}\n"
        )
    readme.write_text(f"# Tool\n{END}\n")
    with pytest.raises(RagLabError, match=r"^\S*README.md: no claims block"):
        write_claims([root], out, spec, readme=readme)
    (tmp_path / "empty").mkdir(), (tmp_path / "also").mkdir()
    with pytest.raises(
        RagLabError, match=r"^no run \(a directory with metrics.json\) under \S*empty, \S*also$"
    ):
        write_claims([tmp_path / "empty", tmp_path / "also"], out, spec)
