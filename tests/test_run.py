"""The runner end to end on the tiny world: files, determinism, resume after a kill, report."""

import json
import subprocess
import sys

import pytest
from hydra.utils import instantiate

from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records
from rag_lab.env import Env, Episode
from rag_lab.eval.evaluate import evaluate
from rag_lab.report import build_table, find_runs
from rag_lab.run import run

from conftest import cli

RUN_FILES = ["config.yaml", "records.jsonl", "metrics.json", "table.md", "table.csv"]


def test_run_writes_the_run_records(tiny_cfg, tmp_path):
    metrics = run(tiny_cfg(), tmp_path)
    for name in RUN_FILES:
        assert (tmp_path / name).exists(), name
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == metrics["all"]["n"] == 40
    for key in [
        "id",
        "question",
        "answers",
        "prediction",
        "steps",
        "queries",
        "retrieved_ids",
        "tokens",
        "rewards",
    ]:
        assert key in records[0], key
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert "| all " in (tmp_path / "table.md").read_text()


def test_same_config_and_seed_give_identical_metrics(tiny_cfg, tmp_path):
    run(tiny_cfg(), tmp_path / "a")
    run(tiny_cfg(), tmp_path / "b")
    assert (tmp_path / "a" / "metrics.json").read_bytes() == (tmp_path / "b" / "metrics.json").read_bytes()


def test_killed_evaluation_resumes_to_the_same_metrics(tiny_cfg, tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    run(tiny_cfg("eval.batch_size=8"), full)
    # Simulate a kill after 2 flushed batches and a torn third append.
    run(tiny_cfg("eval.batch_size=8"), killed)
    lines = (killed / "records.jsonl").read_text().splitlines(keepends=True)
    (killed / "records.jsonl").write_text("".join(lines[:16]) + lines[16][:25])
    (killed / "metrics.json").unlink()

    done_before = [r["id"] for r in read_records(killed / "records.jsonl", repair=False)]
    run(tiny_cfg("eval.batch_size=16"), killed)  # batch size may change on resume
    records = read_records(killed / "records.jsonl")
    assert [r["id"] for r in records][:16] == done_before  # nothing already written was redone or lost
    assert len(records) == len({r["id"] for r in records}) == 40
    assert (killed / "metrics.json").read_bytes() == (full / "metrics.json").read_bytes()


def test_resume_refuses_records_of_another_config(tiny_cfg, tmp_path):
    run(tiny_cfg(), tmp_path)
    with pytest.raises(RagLabError, match=r"different config \(changed: policy.k\)"):
        run(tiny_cfg("policy.k=3"), tmp_path)
    run(tiny_cfg("policy.k=3", "eval.resume=false"), tmp_path)  # explicit restart
    assert len(read_records(tmp_path / "records.jsonl")) == 40


def test_limit_evaluates_a_prefix(tiny_cfg, tmp_path):
    assert run(tiny_cfg("eval.limit=7"), tmp_path)["all"]["n"] == 7


def test_multirun_and_report(repo_root, tmp_path, capfd, monkeypatch):
    sweep = tmp_path / "sweep"
    sizes = ["data.n_people=60", "data.n_films=20", "data.dev_size=20", "data.test_size=30"]
    rc, out = cli(
        "run", ["-m", *sizes, "policy.k=1,5", f"hydra.sweep.dir={sweep}"], capfd, monkeypatch, cwd=repo_root
    )
    assert rc == 0, out[-2000:]
    runs = find_runs([sweep])
    assert [r.name for r in runs] == ["0", "1"]
    table, common = build_table(runs)
    assert list(table["policy.k"]) == ["1", "5"]
    assert common["data.n_people"] == "60"
    assert list(table["N"]) == [30, 30]

    rc, out = cli("report", [str(sweep)], capfd, monkeypatch, cwd=repo_root)
    assert rc == 0, out[-2000:]
    rows = [line for line in out.splitlines() if line.startswith("| ") and str(sweep) in line]
    assert [row.split("|")[1].strip() for row in rows] == ["1", "5"]  # named by policy.k; the dir is last
    assert (sweep / "report.csv").read_text().count("\n") == 3

    rc, paired = cli("report", [str(sweep), "--compare"], capfd, monkeypatch, cwd=repo_root)
    assert rc == 0 and "paired bootstrap" in paired
    assert sum(line.startswith(("| em", "| f1", "| acc")) for line in paired.splitlines()) == 3


def test_missing_dataset_is_one_line(repo_root, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rag_lab.run",
            "data=flashrag",
            f"data.path={tmp_path}/none",
            f"data.corpus_path={tmp_path}/c.jsonl",
            f"hydra.run.dir={tmp_path}/run",
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: flashrag split 'test' not found at")
    assert "Traceback" not in proc.stderr


def test_retrieval_eval_sweeps_retrievers_into_one_table(repo_root, tmp_path, capfd, monkeypatch):
    sweep = tmp_path / "sweep"
    sizes = ["data.n_people=60", "data.n_films=20", "data.dev_size=20", "data.test_size=30"]
    args = ["experiment=retrieval_eval", *sizes, "retriever=bm25,bm25_rank", f"hydra.sweep.dir={sweep}"]
    rc, out = cli("run", args, capfd, monkeypatch, cwd=repo_root)
    assert rc == 0, out[-2000:]
    table = [line for line in (sweep / "report.md").read_text().splitlines() if line.startswith("|")]
    assert table[0].split("|")[1].strip() == "retriever"
    assert "R@10" in table[0] and len(table) == 4  # header, rule, 2 rows
    records = read_records(sweep / "0" / "records.jsonl")
    r = records[0]
    gold = set(r["supporting_ids"])
    ranked = list(dict.fromkeys(r["retrieved_ids"]))
    assert r["recall@5"] == len(set(ranked[:5]) & gold) / len(gold)
    assert r["precision@5"] == len(set(ranked[:5]) & gold) / 5


class BatchEcho:
    """A policy whose answer depends on its batch (as batched generation can): the batch's first id."""

    trains = False

    def __init__(self):
        self.calls: list[list[str]] = []

    def rollout(self, env, batch):
        self.calls.append([ex.id for ex in batch])
        return [Episode(ex.id, ex.question, prediction=batch[0].id) for ex in batch]


def test_resumed_evaluation_rolls_out_the_uninterrupted_batches(tiny_cfg, tmp_path):
    cfg = tiny_cfg()
    data = instantiate(cfg.data)
    examples, env = data.split("test")[:10], Env(data.corpus)
    full = evaluate(BatchEcho(), env, examples, tmp_path / "full.jsonl", data.scorer, batch_size=4)
    # killed after the first batch and two records of the second
    lines = (tmp_path / "full.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "killed.jsonl").write_text("".join(lines[:6]))
    policy = BatchEcho()
    resumed = evaluate(policy, env, examples, tmp_path / "killed.jsonl", data.scorer, batch_size=4)
    ids = [ex.id for ex in examples]
    assert policy.calls == [ids[4:8], ids[8:]]  # the second batch again, whole
    assert resumed == full
    assert (tmp_path / "killed.jsonl").read_text() == (tmp_path / "full.jsonl").read_text()


def test_a_run_dir_in_use_by_another_process_is_refused(tmp_path):
    """Two runs in one directory at once would interleave their records under one label: the second one is
    refused before it writes anything, and the directory is free again once the first process ends."""
    from rag_lab.core.config import compose

    from conftest import TINY_DATA

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    hold = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    hold += "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)"
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(run_dir / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RagLabError, match="is in use by another run"):
            run(compose([*TINY_DATA, "eval.limit=4"]), run_dir)
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait()
    assert run(compose([*TINY_DATA, "eval.limit=4"]), run_dir)["all"]["n"] == 4
