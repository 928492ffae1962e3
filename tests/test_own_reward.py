"""Each method's own training reward of its evaluated episodes (records.jsonl's ``own_reward``: the policies'
``own_rewards``, written by rag_lab.eval.evaluate). Every expected value is computed here from the record
alone, through the reward functions' public pieces (not the policy's hook): DAPO's r_f + r_s + r_a of its
last stage (stage 2 for the start, as the dapo row ends), EVO-RAG's R(x) under Refinement's weights, R3-RAG's
summed official step rewards, APEX's plan SEPR, Stop-RAG's r(s_t, STOP). The rows are composed as a user's
``experiment=compare_synth experiment/compare_synth=<row>`` is; the world teacher acts in them (it speaks
every protocol: right answers, several searches, so every term of a reward moves), evaluated through the
runner's own evaluation stage (``fit`` skipped: a start row trains nothing)."""

import math

import pytest

from rag_lab.env.episode import Episode, Step
from rag_lab.env.protocols.base import Turn
from rag_lab.env.protocols.tagged import DAPOTagged
from rag_lab.eval.metrics import SCORERS
from rag_lab.rewards.dapo import SearchReward, format_reward, multistage_answer
from rag_lab.rewards.evorag import episode_return, step_rewards
from rag_lab.rewards.r3rag import official_rewards
from rag_lab.rewards.r3rag_judges import support
from rag_lab.rewards.sepr import gold_plan
from rag_lab.run import run
from rag_lab.runner.stages import components, evaluate_run

ROW = ["experiment=compare_synth", "eval.limit=12", "eval.batch_size=5"]
# each row's sentence encoder (r_s, r_dup, SEPR): the conftest's tiny BERT, not MiniLM (seconds to load)
ENCODER = {
    "dapo_start": "reward.search.encoder.model",
    "evorag_start": "reward.encoder.model",
    "apex_start": "reward.encoder.model",
}
# an encoder's batch moves a cosine by ~1e-7 in float32 (the evaluation embeds a batch, the test them all)
TOL = 1e-6


def evaluated(tiny_cfg, tmp_path, encoder: str, row: str, *more: str):
    """The row's records (the teacher acting), its policy, its questions by id and its corpus."""
    from hydra.utils import instantiate

    small = [f"{ENCODER[row]}={encoder}"] if row in ENCODER else []
    cfg = tiny_cfg(*ROW, f"experiment/compare_synth={row}", "generator=teacher", *small, *more)
    data = instantiate(cfg.data)
    env, policy = components(cfg, {}, data, data)
    records = evaluate_run(cfg, policy, env, data, tmp_path, None, resume=False)
    return records, policy, {q.id: q for q in data.split("test")}, data.corpus


def episode_of(record: dict) -> Episode:
    steps = [Step(**{k: v for k, v in s.items()}) for s in record["steps"]]
    keys = ("prediction", "stop_reason", "format_failure")
    return Episode(record["id"], record["question"], steps, **{k: record[k] for k in keys})


def dapo_text(record: dict, corpus) -> str:
    """The rollout text as the engine built it: each turn, then the information block of what it retrieved."""
    blocks = [
        DAPOTagged.information(Turn(None, [corpus.get(p) for p in s["retrieved_ids"]]))
        for s in record["steps"]
    ]
    return "".join(s["text"] + b for s, b in zip(record["steps"], blocks, strict=True))


def dapo_r_sum(records: list[dict], corpus, encoder, stage) -> list[float]:
    """r_f + r_s + r_a (eq. 12) of each record's rollout, r_a of ``stage``."""
    texts = [dapo_text(r, corpus) for r in records]
    answer = multistage_answer(texts, [r["answers"] for r in records], stage=stage)
    parts = zip(format_reward(texts), SearchReward(encoder)(texts), answer, strict=True)
    return [f + s + a for f, s, a in parts]


@pytest.mark.parametrize(
    "more, stage", [([], 2), (["policy.reward_stage=1"], 1)], ids=["start_as_stage_2", "reward_stage_1"]
)
def test_dapo_start_scores_r_sum_with_its_rows_last_stage(more, stage, tiny_cfg, tmp_path, tiny_encoder_dir):
    records, policy, _, corpus = evaluated(tiny_cfg, tmp_path, tiny_encoder_dir, "dapo_start", *more)
    encoder = policy.reward["search"].encoder
    assert all(type(r["own_reward"]) is float for r in records)
    assert [r["own_reward"] for r in records] == pytest.approx(
        dapo_r_sum(records, corpus, encoder, stage), abs=TOL
    )
    # the teacher searches and is right: the two stages' r_a differ on these episodes
    other = dapo_r_sum(records, corpus, encoder, 3 - stage)
    assert any(abs(a - b) > 0.1 for a, b in zip(other, [r["own_reward"] for r in records], strict=True))


def test_evorag_start_scores_the_return_under_refinement(tiny_cfg, tmp_path, tiny_encoder_dir):
    records, policy, questions, _ = evaluated(tiny_cfg, tmp_path, tiny_encoder_dir, "evorag_start")
    episodes = [episode_of(r) for r in records]
    rows = step_rewards(episodes, [questions[r["id"]] for r in records], policy.reward.encoder, t_max=20)
    expected = [episode_return(row, stage=2, t_max=20) for row in rows]
    assert all(type(r["own_reward"]) is float for r in records)
    assert [r["own_reward"] for r in records] == pytest.approx(expected, abs=TOL)
    discovery = [episode_return(row, stage=1, t_max=20) for row in rows]
    assert any(abs(a - b) > 1e-6 for a, b in zip(expected, discovery, strict=True))  # the stage shows


def r3rag_outcome(record: dict) -> str:
    if record["format_failure"]:
        return "format_error"
    if record["stop_reason"] != "answer":
        return "no_answer"
    return "correct" if record["em"] == 1.0 else "incorrect"


def test_r3rag_start_scores_the_summed_step_rewards(tiny_cfg, tmp_path, tiny_encoder_dir):
    records, _, questions, _ = evaluated(
        tiny_cfg, tmp_path, tiny_encoder_dir, "r3rag_start", "experiment.cold_start=null"
    )
    expected = []
    for r in records:
        process = [
            support(s["retrieved_ids"], questions[r["id"]]) for s in r["steps"] if s["action"] == "search"
        ]
        expected.append(sum(official_rewards(process, r3rag_outcome(r))))
    assert all(type(r["own_reward"]) is float for r in records)
    assert [r["own_reward"] for r in records] == pytest.approx(expected, abs=TOL)
    assert {r3rag_outcome(r) for r in records} >= {"correct"} and any(e != 2.0 for e in expected)


def test_apex_start_scores_its_plans_sepr(tiny_cfg, tmp_path, tiny_encoder_dir):
    more = ["experiment.apex_executor_sft=false"]
    records, policy, questions, _ = evaluated(tiny_cfg, tmp_path, tiny_encoder_dir, "apex_start", *more)
    for r in records:
        q = questions[r["id"]]
        plan = r["steps"][0]["text"]
        want = policy.sepr([plan], [gold_plan(q)])[0] if q.decomposition else None
        assert r["own_reward"] == want and (want is None or type(r["own_reward"]) is float)
    assert any(r["own_reward"] is not None for r in records)


def test_a_baseline_has_no_own_reward(tiny_cfg, tmp_path, tiny_encoder_dir):
    records, *_ = evaluated(tiny_cfg, tmp_path, tiny_encoder_dir, "standard_rag")
    assert records and all(r["own_reward"] is None for r in records)


class StopAt:
    """Stops each question after 1, 2 or 3 iterations (by its position), never before the first."""

    def __init__(self, ids: list[str]):
        self.at = {q: 1 + i % 3 for i, q in enumerate(ids)}

    def should_stop(self, env, states, episodes):
        return [len(s.turns) >= self.at[e.question_id] for s, e in zip(states, episodes, strict=True)]


def test_stoprag_scores_the_stop_reward_of_the_state_it_answered_from(tiny_cfg, tmp_path):
    """Unit level (a fitted Q-network is a training run): the pipeline stopped by a fixed rule after 1, 2 or
    3 iterations. Its offline data (the same questions run to the horizon, r(s_t, STOP) at every prefix) holds
    the expected value: the teacher's queries are greedy, so the prefix is the stopped state, and its sampled
    answers are seeded by the prompt (eq. 13's samples of the same state are the same samples)."""
    from hydra.utils import instantiate

    from rag_lab.policies.stoprag.offline import collect

    cfg = tiny_cfg(
        "experiment=compare_synth",
        "experiment/compare_synth=stoprag",
        "generator=teacher",
        "policy.iterations=3",
    )
    data = instantiate(cfg.data)
    env, policy = components(cfg, {}, data, data)
    batch = data.split("test")[:12]
    offline = collect(
        policy.pipeline,
        env,
        batch,
        tmp_path / "offline.jsonl",
        policy.samples,
        policy.temperature,
        policy.top_p,
    )
    policy.pipeline.stopper = StopAt([q.id for q in batch])
    episodes = policy.pipeline.rollout(env, batch)
    stopped_at = [sum(s.query is not None for s in ep.steps) for ep in episodes]
    assert set(stopped_at) == {1, 2, 3}
    expected = [traj.rewards[t] for traj, t in zip(offline, stopped_at, strict=True)]
    got = policy.own_rewards(env, batch, episodes)
    assert got == pytest.approx(expected, abs=TOL) and len(set(expected)) > 2
    # a mean of F1 over the N samples: not just the greedy answer's
    f1 = SCORERS["squad"]["f1"]
    greedy = [f1(ep.prediction, list(q.answers)) for ep, q in zip(episodes, batch, strict=True)]
    assert all(isinstance(x, float) and not math.isnan(x) for x in got) and got != greedy


def test_the_runner_writes_own_reward_for_a_start_row(tiny_cfg, tiny_lm, tiny_encoder_dir, tmp_path):
    """Through ``python -m rag_lab.run``'s path: the dapo start on a transformers model (the conftest's
    untrained one), every record's own reward DAPO's r_sum of its rollout."""
    from hydra.utils import instantiate

    from rag_lab.core.records import read_records

    lm = ["generator=hf", f"generator.model={tiny_lm}", f"generator.tokenizer={tiny_lm}/tokenizer"]
    small = f"{ENCODER['dapo_start']}={tiny_encoder_dir}"
    cfg = tiny_cfg(ROW[0], "experiment/compare_synth=dapo_start", "eval.limit=3", small, *lm)
    run(cfg, tmp_path)
    records = read_records(tmp_path / "records.jsonl")
    encoder = instantiate(cfg.reward.search.encoder)
    expected = dapo_r_sum(records, instantiate(cfg.data).corpus, encoder, 2)
    assert len(records) == 3 and [r["own_reward"] for r in records] == pytest.approx(expected, abs=TOL)
