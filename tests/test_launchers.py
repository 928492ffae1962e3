"""Sweeps through Hydra's launchers: joblib (jobs in parallel processes) and submitit's local executor
(the Slurm launcher's jobs without a cluster)."""

from datetime import datetime

import pytest

from rag_lab.eval.runs import find_runs, overrides_of

from conftest import cli

SIZES = ["data.n_people=60", "data.n_films=20", "data.dev_size=20", "data.test_size=30"]


@pytest.fixture
def sweep(repo_root, capfd, monkeypatch):
    """``python -m rag_lab.run -m ...`` (in this process; the launcher starts the jobs' processes)."""

    def run(sweep_dir, *args: str) -> list:
        argv = ["-m", *SIZES, *args, f"hydra.sweep.dir={sweep_dir}"]
        rc, out = cli("run", argv, capfd, monkeypatch, cwd=repo_root)
        assert rc == 0, out[-3000:]
        return find_runs([sweep_dir])

    return run


def span(run_dir) -> tuple[datetime, datetime]:
    """When a job started and ended, from the first and last time stamps of its run.log."""
    stamps = [line[1:24] for line in (run_dir / "run.log").read_text().splitlines() if line.startswith("[20")]
    return tuple(datetime.strptime(s, "%Y-%m-%d %H:%M:%S,%f") for s in (stamps[0], stamps[-1]))


def test_joblib_runs_two_jobs_at_once(sweep, tmp_path):
    # jobs of a few seconds each (the teacher answering 200 questions), both dispatched at once
    joblib = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    job = ["data.test_size=200", "generator=teacher", "policy=standard_rag", "policy.k=1,5"]
    runs = sweep(tmp_path / "s", *joblib, *job)
    assert [overrides_of(r)["policy.k"] for r in runs] == ["1", "5"]
    (a0, a1), (b0, b1) = span(runs[0]), span(runs[1])
    assert a0 < b1 and b0 < a1  # the two jobs ran at the same time


def test_submitit_local_finishes_a_two_point_sweep(sweep, tmp_path):
    runs = sweep(tmp_path / "s", "hydra/launcher=slurm_local", "policy=top_title", "policy.k=1,5")
    assert [overrides_of(r)["policy.k"] for r in runs] == ["1", "5"]
    assert all((r / "metrics.json").exists() for r in runs)
    assert any((tmp_path / "s" / ".submitit").iterdir())  # submitit's own job folders and logs
