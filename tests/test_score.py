"""The scoring CLI on hand-made gold and predictions."""

import json

import pytest

from rag_lab.data.hotpotqa import HotpotQADataset
from rag_lab.score import score

from conftest import cli


def hotpot_item(qid, answer, support):
    context = [[support, [f"{support} text."]], ["Other", ["o."]]]
    return {
        "_id": qid,
        "question": f"{qid}?",
        "answer": answer,
        "type": "bridge",
        "supporting_facts": [[support, 0]],
        "context": context,
    }


@pytest.fixture
def gold(tmp_path):
    items = [
        hotpot_item("q1", "yes", "A"),
        hotpot_item("q2", "New York City", "B"),
        hotpot_item("q3", "Paris", "C"),
    ]
    path = tmp_path / "gold.json"
    path.write_text(json.dumps(items))
    return path


def test_score_applies_official_rules_and_counts_missing(gold, tmp_path):
    preds = tmp_path / "preds.jsonl"
    rows = [
        {"id": "q1", "prediction": "yes"},
        {"id": "q2", "prediction": "New York"},
        {"id": "zz", "prediction": "x"},
    ]
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = score(HotpotQADataset(str(gold), split_files={}), "dev", preds)
    # q1 exact (1, 1); q2 EM 0, F1 0.8 (P 1, R 2/3); q3 missing -> 0.
    assert (out["n"], out["missing"], out["extra"]) == (3, 1, 1)
    assert out["em"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx((1 + 0.8) / 3)
    assert out["acc"] == pytest.approx(1 / 3)
    assert "sp_f1" not in out


def test_score_cli_with_support_ids(gold, tmp_path, repo_root, capfd, monkeypatch):
    ds = HotpotQADataset(str(gold), split_files={})
    support = {ex.id: list(ex.supporting_ids) for ex in ds.split("dev")}
    other = next(pid for pid in ds.corpus.ids if pid not in sum(support.values(), []))
    rows = [
        {"id": "q1", "prediction": "no", "support_ids": support["q1"]},
        {"id": "q2", "prediction": "new york city", "support_ids": support["q2"] + [other]},
        {"id": "q3", "prediction": "Paris", "support_ids": []},
    ]
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["data=hotpotqa", f"data.path={gold}", f"predictions={preds}"]
    rc, text = cli("score", args, capfd, monkeypatch, cwd=repo_root)
    assert rc == 0, text
    out = json.loads(text)
    assert out["em"] == pytest.approx(2 / 3)  # 'no' vs 'yes' scores 0
    # support: q1 exact (P=R=1), q2 P=1/2 R=1 F1=2/3, q3 none predicted (0).
    assert out["sp_em"] == pytest.approx(1 / 3)
    assert out["sp_f1"] == pytest.approx((1 + 2 / 3 + 0) / 3)


def test_score_cli_bad_prediction_line_is_one_line(gold, tmp_path, repo_root, capfd, monkeypatch):
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "q1", "prediction": "yes"}\n{"id": "q2"}\n')
    args = ["data=hotpotqa", f"data.path={gold}", f"predictions={preds}"]
    rc, out = cli("score", args, capfd, monkeypatch, cwd=repo_root)
    assert rc == 1
    assert out.strip() == f"error: {preds}:2: missing field 'prediction'"


REFUSAL = (
    "error: config 'split': 'judge' is reserved for the claims' judgement (make claims, which sets"
    " RAG_LAB_JUDGE=1); probes use dev / test"
)
SMALL_WORLD = ["data.n_people=60", "data.n_cities=12", "data.n_countries=4", "data.n_films=20",
               "data.dev_size=20", "data.test_size=40", "data.judge_size=40"]  # fmt: skip


def test_score_refuses_the_judge_split_outside_make_claims(tmp_path, repo_root, capfd, monkeypatch):
    """The judge split is make claims' (RAG_LAB_JUDGE=1): refused in one line before the world is read or
    written, whatever the dataset."""
    monkeypatch.delenv("RAG_LAB_JUDGE", raising=False)
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "judge-0", "prediction": "x"}\n')
    cache = tmp_path / "cache"
    for data in ([], ["data=hotpotqa", f"data.path={tmp_path}"]):
        args = [*data, "split=judge", f"predictions={preds}", f"cache_dir={cache}"]
        rc, out = cli("score", args, capfd, monkeypatch, cwd=repo_root)
        assert (rc, out.strip()) == (1, REFUSAL)
    assert not cache.exists()


def test_scoring_the_world_writes_no_judge_file_and_make_claims_scores_the_judge_split(
    tmp_path, repo_root, capfd, monkeypatch
):
    """Scoring the embedded world's test split leaves no file of the judge split in its cache entry; under
    RAG_LAB_JUDGE=1 (make claims) the same entry gets the judge split, and fabricated predictions score."""
    monkeypatch.delenv("RAG_LAB_JUDGE", raising=False)
    cache = tmp_path / "cache"
    preds = tmp_path / "preds.jsonl"
    preds.write_text('{"id": "test-0", "prediction": "x"}\n{"id": "judge-0", "prediction": "x"}\n')
    args = [*SMALL_WORLD, f"predictions={preds}", f"cache_dir={cache}"]
    rc, out = cli("score", [*args, "split=test"], capfd, monkeypatch, cwd=repo_root)
    assert rc == 0, out
    assert (json.loads(out)["n"], json.loads(out)["missing"]) == (40, 39)
    (entry,) = (cache / "synth").iterdir()
    assert sorted(p.name for p in entry.iterdir() if "judge" in p.name) == []
    judging = {"RAG_LAB_JUDGE": 1}
    rc, out = cli("score", [*args, "split=judge"], capfd, monkeypatch, cwd=repo_root, env=judging)
    assert rc == 0, out
    assert (json.loads(out)["split"], json.loads(out)["n"], json.loads(out)["missing"]) == ("judge", 40, 39)
    assert (entry / "judge.jsonl").exists() and [*(cache / "synth").iterdir()] == [entry]
