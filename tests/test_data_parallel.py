"""Every data-parallel trainer (issue 50): two CPU processes (gloo), each with half of every global batch,
make the same update as one process with all of it (tests/data_parallel.py runs the trainer)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

HERE = Path(__file__).parent
SCRIPT = HERE / "data_parallel.py"


TRAINERS = ["sft", "dpo", "grpo", "qnet", "preference", "ppo", "tiny"]


def test_two_processes_make_the_updates_of_one(tiny_lm, tmp_path):
    """Every trainer in one process, then in two forked from it (accelerate's debug launcher: gloo, the code
    path of ``accelerate launch`` without paying more interpreters' imports): one subprocess for all."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [
        sys.executable,
        str(SCRIPT),
        ",".join(TRAINERS),
        tiny_lm,
        str(tmp_path / "work"),
        str(tmp_path / "out"),
    ]
    done = subprocess.run([*command, "--fork", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict()
    for trainer in TRAINERS:
        one, two = (torch.load(tmp_path / out / f"{trainer}.pt") for out in ("out", "out-2"))
        assert (one["processes"], two["processes"]) == (1, 2)
        for key, value in one["weights"].items():
            # Attention is invariant to the key projection's bias (it shifts every score of a query alike), so
            # its gradient is rounding noise, which Adam scales up to steps of the learning rate's size.
            atol = 1e-4 if key.endswith(("k_proj.bias", "key.bias")) else 1e-5
            torch.testing.assert_close(
                two["weights"][key], value, rtol=1e-4, atol=atol, msg=f"{trainer}: {key}"
            )
        assert two["stats"] == pytest.approx(one["stats"], rel=1e-4), trainer
        # it trained: weights moved from the tiny LM's (the Q-network counts its own)
        moved = one["stats"].get("moved") or sum(
            not torch.equal(one["weights"][k], v) for k, v in initial.items() if k in one["weights"]
        )
        assert moved, trainer
    ppo = torch.load(tmp_path / "out" / "ppo.pt")["stats"]
    assert ppo["clip_fraction"] > 0  # the clip bound on some tokens over PPO's three passes


def test_a_checkpoint_loads_at_an_indexed_cpu_as_transformers_asks_under_several_cpu_processes(tmp_path):
    """transformers resumes an optimiser with ``map_location=args.device``, ``cpu:<i>`` in a multi-process CPU
    run; torch alone refuses that location (the killed 2-process run failed to resume on it)."""
    import rag_lab.train.parallel  # noqa: F401 (registers the location)

    torch.save({"exp_avg": torch.arange(3.0)}, tmp_path / "optimizer.pt")
    state = torch.load(tmp_path / "optimizer.pt", map_location=torch.device("cpu", 1), weights_only=True)
    assert torch.equal(state["exp_avg"], torch.arange(3.0))


# each method's paper-scale-free run under launch=cpu2: SHORT_TRAINING's sizes with two questions a step
LAUNCHED = {
    # dapo_synth starts from the LM itself (no cold start, issue 64)
    "dapo_synth": ["policy.steps=2", "policy.questions_per_step=2", "policy.group_size=2",
                   "policy.micro_batch=null", "policy.max_new_tokens=16"],
    "evorag_synth": ["policy.max_cycles=1", "policy.questions_per_cycle=2", "policy.states_per_episode=1",
                     "policy.dev_limit=2", "policy.max_turns=3", "policy.max_new_tokens=16",
                     "policy.batch_size=2", "policy.cold_start.limit=4", "policy.cold_start.max_steps=2"],
    "apex_synth": ["policy.planner.train_limit=4", "policy.planner.questions_per_step=2",
                   "policy.planner.group_size=2", "policy.planner.epochs=1",
                   "policy.planner.max_new_tokens=16", "policy.executor.limit=4",
                   "policy.executor.max_steps=2"],
    "stoprag_synth": ["policy.iterations=3", "policy.samples=2", "policy.train_limit=20", "policy.epochs=1",
                      "policy.dev_limit=4", "generator=teacher"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(LAUNCHED))
def test_a_method_trains_sharded_under_launch_fsdp_cpu(experiment, tiny_cfg, tmp_path):
    """``launch=fsdp_cpu``: the method's whole training with every model FSDP-sharded over two CPU processes
    (the tiny LM's SFT, the cold start, the method's trainer; rollouts on the sharded models, every process in
    step: rag_lab/train/lockstep.py; the results saved from the gathered weights), then the runner evaluates
    what was published."""
    from rag_lab.run import run

    launch = ["launch=fsdp_cpu"]  # a free port of its own (rag_lab.runner.launch.Launch.write_config)
    cfg = tiny_cfg(f"experiment={experiment}", "hydra.mode=RUN", *LAUNCHED[experiment], *launch,
                   "eval.limit=2", f"cache_dir={tmp_path / 'cache'}")  # fmt: skip
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    assert "FSDP" in (tmp_path / "run" / "launch" / "accelerate.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("experiment", sorted(LAUNCHED))
def test_a_method_trains_under_launch_cpu2(experiment, tiny_cfg, tmp_path):
    """``launch=cpu2``: the runner starts the method's whole training in two CPU processes
    (rag_lab.runner.launched: the cold start's SFT and the method's own trainer), then finds the published
    results and evaluates; each published model says it was trained by two processes."""
    import json

    from rag_lab.run import run

    launch = ["launch=cpu2"]
    cfg = tiny_cfg(f"experiment={experiment}", "hydra.mode=RUN", *LAUNCHED[experiment], *launch,
                   "eval.limit=2", f"cache_dir={tmp_path / 'cache'}")  # fmt: skip
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 2
    # the trained models' cards (the tiny LM, the generator, was trained by the runner before the job)
    cache = tmp_path / "cache"
    trained = [
        p for p in [*cache.glob("*/*/train.json"), *cache.glob("*/*/cycle.json")] if p.parts[-3] != "tiny_lm"
    ]
    cards = {p.parts[-3]: json.loads(p.read_text()) for p in trained}
    if experiment == "stoprag_synth":  # no cold start; the fit's card
        cards = {"stoprag_fit": json.loads(next(cache.glob("stoprag_fit/*/stoprag.json")).read_text())}
    elif experiment == "dapo_synth":  # no cold start: its stages' cards
        assert "cold_start" not in cards and cards, sorted(cards)
    else:
        assert "cold_start" in cards and len(cards) >= 2, sorted(cards)
    assert all(c.get("processes", c.get("sft", {}).get("processes")) == 2 for c in cards.values()), cards


@pytest.mark.slow
def test_a_killed_two_process_run_resumes_to_the_uninterrupted_numbers(tiny_cfg, tmp_path):
    """``launch=cpu2`` DAPO killed (SIGKILL to the runner and every process under it) once its stage has a
    checkpoint, then run again: it resumes from that checkpoint, and its trained weights and metrics are
    those of a run never killed."""
    import json

    from safetensors.torch import load_file

    from rag_lab.run import run

    from conftest import TINY_DATA, TINY_LM, killed_run

    overrides = [*TINY_DATA, *TINY_LM, "generator.reading_steps=4", "generator.tune_steps=2",
                 "experiment=dapo_synth", "hydra.mode=RUN", *LAUNCHED["dapo_synth"], "policy.stages=[1]",
                 "policy.steps=8", "policy.save_steps=1", "policy.heldout.n=2", "eval.limit=2",
                 "launch=cpu2"]  # fmt: skip
    straight = run(tiny_cfg(*overrides, f"cache_dir={tmp_path / 'a'}"), tmp_path / "run_a")

    killed = [*overrides, f"cache_dir={tmp_path / 'b'}"]
    # a checkpoint cut short is skipped on resume (resume.py)
    killed_run(killed, tmp_path / "run_b", "dapo/*.work/checkpoint-1/trainer_state.json", tmp_path / "b")
    assert not list((tmp_path / "b").glob("dapo/*/model.safetensors")), "killed after the stage ended"
    resumed = run(tiny_cfg(*killed), tmp_path / "run_b")

    [a], [b] = (sorted((tmp_path / x).glob("dapo/*/model.safetensors")) for x in "ab")
    wa, wb = load_file(a), load_file(b)
    for name, value in wa.items():
        torch.testing.assert_close(wb[name], value, rtol=0, atol=1e-6, msg=name)
    assert resumed["all"] == straight["all"]
    cards = [json.loads((p.parent / "train.json").read_text()) for p in (a, b)]
    assert cards[0]["resumed_from"] is None and 1 <= cards[1]["resumed_from"] < 8, cards  # from the kill's
    assert cards[1]["processes"] == 2
    rows = [json.loads(line) for line in (b.parent / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, 9))  # each training step logged once


@pytest.mark.slow
def test_the_tiny_lms_recipe_trains_under_launch_cpu2(tiny_cfg, tmp_path):
    """``generator=tiny`` with settings no shipped checkpoint has, ``launch=cpu2``: the runner trains the
    recipe in two processes first (a launched job of the generator alone), then builds the generator from the
    cache and evaluates; every stage's card says two processes."""
    import json

    from rag_lab.run import run

    cfg = tiny_cfg("generator=tiny", "generator.reading_steps=4", "generator.tune_steps=2", "policy=direct",
                   "launch=cpu2", "eval.limit=2",
                   f"cache_dir={tmp_path / 'cache'}")  # fmt: skip
    assert run(cfg, tmp_path / "run")["all"]["n"] == 2
    cards = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("tiny_lm/*/train.json")]
    assert len(cards) >= 2 and all(card["processes"] == 2 for card in cards)  # base and protocol stage
    assert (tmp_path / "run" / "launch" / "generator" / "job.json").exists()


def _measure_a_share(out: str) -> None:
    """In each of the debug launcher's processes: the held-out row of 7 questions, each process rolling out
    its share (recorded), the main process writing the row."""
    import json

    from rag_lab.data.base import QAExample
    from rag_lab.env import Episode
    from rag_lab.train.heldout import measured
    from rag_lab.train.parallel import rank

    questions = [QAExample(f"q{i}", "?", ("yes",)) for i in range(7)]

    def rollout(share):
        Path(out, f"share{rank()}.json").write_text(json.dumps([q.id for q in share]))
        return [Episode(q.id, "?", prediction="yes" if int(q.id[1:]) % 3 else "no",
                        format_failure=q.id == "q4") for q in share]  # fmt: skip

    row = measured(5, questions, rollout, "squad")
    if row is not None:
        Path(out, "row.json").write_text(json.dumps(row))


def test_the_heldout_curve_is_measured_by_every_process_and_gathered(tmp_path):
    """Two processes each roll out their share of the held-out questions (every second one); the main
    process's row is the one process's row (issue 66: no rank waits while the main one measures alone)."""
    import json
    from functools import partial

    from accelerate import debug_launcher

    from rag_lab.data.base import QAExample
    from rag_lab.env import Episode
    from rag_lab.train.heldout import heldout_row

    debug_launcher(partial(_measure_a_share, str(tmp_path)), num_processes=2)
    shares = [json.loads((tmp_path / f"share{r}.json").read_text()) for r in (0, 1)]
    assert shares == [["q0", "q2", "q4", "q6"], ["q1", "q3", "q5"]]
    row = json.loads((tmp_path / "row.json").read_text())
    questions = [QAExample(f"q{i}", "?", ("yes",)) for i in range(7)]
    episodes = [Episode(q.id, "?", prediction="yes" if i % 3 else "no", format_failure=i == 4)
                for i, q in enumerate(questions)]  # fmt: skip
    one = heldout_row(5, questions, episodes, "squad")
    assert {k: v for k, v in row.items() if k != "time"} == {k: v for k, v in one.items() if k != "time"}
    assert row["heldout/acc"] == pytest.approx(4 / 7) and row["heldout/n"] == 7


def _check_samples_in_each(out: str) -> None:
    """In each of the debug launcher's processes: R3-RAG's sample check with rank 1 holding none."""
    from accelerate import Accelerator

    from rag_lab.core.errors import RagLabError
    from rag_lab.policies.r3rag.ppo import check_samples
    from rag_lab.train.parallel import rank

    accelerator = Accelerator(cpu=True)
    try:
        check_samples(0 if rank() == 1 else 3, accelerator)
        said = "trained on"
    except RagLabError as e:
        said = str(e)
    Path(out, f"rank{rank()}.txt").write_text(said)


def test_a_process_without_a_ppo_sample_stops_every_process_with_one_line(tmp_path):
    """Rank 1 has no sample: both ranks raise the same line (rank 0 does not go on to wait for rank 1 in the
    update's first collective, issue 66)."""
    from functools import partial

    from accelerate import debug_launcher

    debug_launcher(partial(_check_samples_in_each, str(tmp_path)), num_processes=2)
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert (
        said[0]
        == said[1]
        == ("r3rag PPO: 1 of 2 process(es) have no sample (every prompt was too long for the model)")
    )


SHARDED = ["sft", "grpo", "ppo", "qnet"]


@pytest.mark.parametrize(
    "trainers",
    [pytest.param(["sft"], id="sft"), pytest.param(SHARDED, id="all", marks=pytest.mark.slow)],
)
def test_two_fsdp_processes_make_the_updates_of_one_and_save_one_checkpoint(trainers, tiny_lm, tmp_path):
    """FSDP2 on CPU (``launch=fsdp_cpu``: torch's ``fully_shard`` through accelerate, over gloo): SFT, GRPO,
    PPO and the Q-network, each sharded over two processes, make the update of one unsharded process, and
    the sharded save (the full weights gathered, written by the main process) loads back as one ordinary
    checkpoint equal to the one process's weights. In make test: SFT (TRL's trainers, the path the
    others share); all four in the slow set."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, str(SCRIPT), ",".join(trainers), tiny_lm, str(tmp_path / "work"),
               str(tmp_path / "out"), "--fork", "2", "--fsdp"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for trainer in trainers:
        one, two = (torch.load(tmp_path / out / f"{trainer}.pt") for out in ("out", "out-2"))
        assert (one["sharded"], two["sharded"]) == (False, True), trainer
        assert one["weights"].keys() == two["weights"].keys(), trainer
        for key, value in one["weights"].items():
            atol = 1e-4 if key.endswith(("k_proj.bias", "key.bias")) else 1e-5
            torch.testing.assert_close(
                two["weights"][key], value, rtol=1e-4, atol=atol, msg=f"{trainer}: {key}"
            )
        assert two["stats"] == pytest.approx(one["stats"], rel=1e-4), trainer
        if trainer in ("sft", "grpo"):  # causal LMs: the saved folder is an ordinary checkpoint
            loaded = AutoModelForCausalLM.from_pretrained(
                tmp_path / "out-2" / f"{trainer}-saved"
            ).state_dict()
        elif trainer == "qnet":  # the Q-network's last checkpoint, written from its gathered weights
            loaded = torch.load(tmp_path / "work" / "qnet-p2" / "qnet_checkpoint.pt")["model"]
        else:  # PPO's actor-critic: its full weights, gathered (its save is the LM's save_pretrained)
            loaded = {}
        for key, value in loaded.items():
            torch.testing.assert_close(value, two["weights"][key], rtol=0, atol=0, msg=f"{trainer}: {key}")
