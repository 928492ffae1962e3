"""``generator=vllm`` in the training of R3-RAG (PPO), EVO-RAG (DPO cycles) and APEX (the planner's GRPO), on
CPU: TRL's real vLLM backend (``VLLMGeneration``: its engine set-up, weight sync, LoRA merge and TP prompt
gather) on a fake engine (tests/vllm_fakes.py). The rollouts generate on the engine, and the engine holds the
trained weights after each update, before the next rollouts."""

from pathlib import Path

import pytest
import test_apex_planner
import test_evorag
import test_r3rag
import torch
import vllm_fakes
from safetensors.torch import load_file

from rag_lab.core.errors import RagLabError
from rag_lab.env import Env
from rag_lab.env.protocols.r3rag import R3RAGStep
from rag_lab.generators.base import Sampling
from rag_lab.generators.vllm import VLLMGenerator
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.rewards.r3rag_judges import R3RAGReward

pytestmark = pytest.mark.usefixtures("one_thread")
FakeLLM, trl_vllm = vllm_fakes.FakeLLM, vllm_fakes.trl_vllm  # the fake engine and its fixture
toy_preference_encoder = test_evorag.toy_preference_encoder  # autouse: EVO-RAG's toy preference encoder


def vllm_generator(base: Path, **settings):
    from rag_lab.generators.vllm import VLLMGenerator

    return VLLMGenerator(str(base), tokenizer=str(base / "tokenizer"), chat=False, **settings)


@pytest.fixture
def r3rag_base(data, tmp_path_factory):
    return test_r3rag.untrained_tiny_lm(data, ("r3rag",), tmp_path_factory.mktemp("r") / "lm")


def test_ppo_rolls_out_on_the_engine_that_trl_syncs_after_every_update(data, r3rag_base, trl_vllm, tmp_path):
    from rag_lab.policies.r3rag.trainer import PPOTrainer, Rollout

    base = r3rag_base
    trl_vllm.tokenizer_dir = str(base / "tokenizer")
    toy = test_r3rag.generator_of(base)
    env = Env(data.corpus, BM25Retriever(data.corpus), vllm_generator(base))
    rollout = Rollout(R3RAGStep(), k=2, max_turns=3, max_new_tokens=8)
    t = PPOTrainer(toy, env, R3RAGReward(), data.split("train")[:8], test_r3rag.TOY, rollout, 0)
    [engine] = FakeLLM.made
    FakeLLM.live = lambda: t.unwrapped.lm
    t.run(tmp_path / "work", tmp_path / "out")
    assert t.engine.syncs == 2 and engine.syncs == 2  # once after each of the 2 updates
    synced, versions = zip(*engine.calls, strict=True)
    assert all(synced)  # every rollout generated on the weights the policy had then
    assert set(versions) == {0, 1}  # iteration 1 on the start, iteration 2 on the first update's weights
    trained = load_file(tmp_path / "out" / "model.safetensors")
    assert all(torch.equal(trained[n], w) for n, w in engine.weights().items() if n in trained)
    start = load_file(base / "model.safetensors")
    assert any(not torch.equal(start[n], w) for n, w in engine.weights().items() if n in start)


def test_ppos_heldout_curve_generates_on_its_engine_asleep_between_phases(
    data, r3rag_base, trl_vllm, tmp_path, monkeypatch
):
    """generator.sleep: the engine sleeps between PPO's phases (held-out at 0, 1, 2 and the rollouts of the
    two iterations), every generate, the held-out curve's included, on the policy's weights of then."""
    from rag_lab.policies.r3rag import trainer as ppo
    from rag_lab.train.heldout import HeldOut

    vllm_fakes.no_transformers_generation(monkeypatch, ppo)
    base, dev = r3rag_base, data.split("dev")[:2]
    trl_vllm.tokenizer_dir = str(base / "tokenizer")
    env = Env(data.corpus, BM25Retriever(data.corpus), vllm_generator(base, sleep=True))
    rollout = ppo.Rollout(R3RAGStep(), k=2, max_turns=3, max_new_tokens=8)
    held = {"heldout": HeldOut(n=2, every=1), "heldout_questions": dev}
    t = ppo.PPOTrainer(
        test_r3rag.generator_of(base),
        env,
        R3RAGReward(),
        data.split("train")[:8],
        test_r3rag.TOY,
        rollout,
        0,
        **held,
    )
    [engine] = FakeLLM.made
    FakeLLM.live = lambda: t.unwrapped.lm
    rows = t.run(tmp_path / "work", tmp_path / "out")
    assert [r["step"] for r in rows if "heldout/acc" in r] == [0, 1, 2]
    synced, _ = zip(*engine.calls, strict=True)
    assert all(synced)  # NaN weights after a sleep otherwise
    assert sum(any(q.question in x for q in dev for x in texts) for texts in engine.prompts) >= 3
    assert [e for e in engine.events if e[0] == "sleep"] == [("sleep", 2)] * 6  # start-up, then 5 phases
    # pushed on waking where the weights slept (measure 0, both iterations' rollouts), after each update
    assert engine.syncs == 5 and engine.asleep == {"weights", "kv_cache"}


def test_evorag_rolls_out_on_the_engine_synced_with_each_cycles_merged_lora_weights(
    data, trl_vllm, tmp_path, monkeypatch
):
    from rag_lab.policies.evorag import trainer as cycle

    base = test_evorag.untrained_tiny_lm(data, ("evorag",), tmp_path / "lm")
    trl_vllm.tokenizer_dir = str(base / "tokenizer")
    synced_at_dev = []
    dev_em = cycle.dev_em

    def recorded(policy, generator, env, dev, work=None):  # the engine's weights when dev EM generates
        em = dev_em(policy, generator, env, dev, work)
        synced_at_dev.append(FakeLLM.made[0].generated_on)
        return em

    monkeypatch.setattr(cycle, "dev_em", recorded)
    env = Env(data.corpus, BM25Retriever(data.corpus), vllm_generator(base, sleep=True))
    policy = test_evorag.policy(cache_dir=str(tmp_path / "cache"))
    assert policy.lora is not None  # the cycles' DPO trains a LoRA adapter, merged before the sync
    policy.fit(env, data.split("train"), data.split("dev"), tmp_path / "out")
    [engine] = FakeLLM.made
    assert engine.calls and len(synced_at_dev) == 2  # both cycles' rollouts and dev EM on the engine
    for weights, done in zip(synced_at_dev, test_evorag.cycle_dirs(tmp_path / "cache"), strict=True):
        trained = load_file(done / "model.safetensors")
        assert all(torch.equal(trained[n], w) for n, w in weights.items() if n in trained)
    # before the start's dev EM; each cycle: before its rollouts, and after its DPO epoch (its dev EM)
    assert engine.syncs == 5
    # generator.sleep: asleep at start-up and after each of those 5 phases (the DPO epochs in between)
    assert [e for e in engine.events if e[0] == "sleep"] == [("sleep", 2)] * 6
    assert policy.generator.model_name in {str(p) for p in test_evorag.cycle_dirs(tmp_path / "cache")}


def test_the_apex_planner_generates_its_plans_on_trls_engine_synced_every_step(data, trl_vllm, tmp_path):
    from rag_lab.policies.apex.planner import train_planner

    base = test_apex_planner.untrained_tiny_lm(data, ("apex_*",), tmp_path / "lm")
    trl_vllm.tokenizer_dir = str(base / "tokenizer")
    questions = [q for q in data.split("train") if q.decomposition][:4]
    generator = test_apex_planner.planner(base)
    FakeLLM.live = lambda: generator.model
    vllm = vllm_generator(base, train_memory=0.2).trl_settings()
    config, reward = test_apex_planner.CONFIG, test_apex_planner.Recorded()
    train_planner(generator, questions, reward, config, tmp_path / "p", vllm=vllm)
    [engine] = FakeLLM.made
    synced, versions = zip(*engine.calls, strict=True)
    assert all(synced) and list(versions) == [1, 2]  # each step's plans on the weights of that step
    assert engine.settings["gpu_memory_utilization"] == 0.2


def test_the_apex_planners_heldout_plans_generate_on_its_trainers_engine_asleep_between_steps(
    data, trl_vllm, tmp_path, monkeypatch
):
    """The held-out curve's plans go through the planner trainer's engine, synced to the step they measure
    (not transformers), and with generator.sleep the engine sleeps after every phase: TRL's own plan
    generation of each step (its per-call sleep) and the held-out measurements at steps 0, 1, 2."""
    from rag_lab.data.base import QAExample
    from rag_lab.env import Episode
    from rag_lab.generators.vllm import VLLMGenerator
    from rag_lab.policies.apex.planner import train_planner
    from rag_lab.train import lockstep
    from rag_lab.train.heldout import HeldOut, HeldOutCallback

    vllm_fakes.no_transformers_generation(monkeypatch, lockstep)
    base = test_apex_planner.untrained_tiny_lm(data, ("apex_*",), tmp_path / "lm")
    trl_vllm.tokenizer_dir = str(base / "tokenizer")
    questions = [q for q in data.split("train") if q.decomposition][:4]
    generator = test_apex_planner.planner(base)
    FakeLLM.live = lambda: generator.model
    held, seen = data.split("dev")[:2], []

    def rollout(planner, share: list[QAExample]) -> list[Episode]:
        seen.append(type(planner))
        plans = planner.generate([q.question for q in share], Sampling(max_new_tokens=8))
        return [Episode(q.id, q.question, prediction=c[0].text) for q, c in zip(share, plans, strict=True)]

    callback = HeldOutCallback(HeldOut(n=2, every=1), held, rollout, generator=generator)
    vllm = vllm_generator(base, sleep=True).trl_settings()
    config, reward = test_apex_planner.CONFIG, test_apex_planner.Recorded()
    train_planner(generator, questions, reward, config, tmp_path / "p", vllm=vllm, heldout=callback)
    [engine] = FakeLLM.made
    synced, _ = zip(*engine.calls, strict=True)
    assert all(synced) and seen == [VLLMGenerator] * 3  # held-out at steps 0, 1, 2 on the engine
    assert sum(any(q.question in x for q in held for x in texts) for texts in engine.prompts) == 3
    # asleep at start-up, after each of the 2 steps' plans and each of the 3 held-out measurements
    assert [e for e in engine.events if e[0] == "sleep"] == [("sleep", 2)] * 6


def test_a_lora_models_sync_merges_the_adapter_into_the_engines_weights_and_unmerges_it(
    data, r3rag_base, trl_vllm
):
    import copy

    from peft import LoraConfig, get_peft_model

    from rag_lab.train.vllm_engine import rollout_engine

    trl_vllm.tokenizer_dir = str(r3rag_base / "tokenizer")
    toy = test_r3rag.generator_of(r3rag_base)
    model = get_peft_model(toy.model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for name, p in model.named_parameters():
        if "lora_B" in name:  # a trained adapter (peft starts B at 0: nothing to merge)
            torch.nn.init.normal_(p)
    engine = rollout_engine(vllm_generator(r3rag_base), model, toy.tokenizer, False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine.sync()
    merged = dict(copy.deepcopy(model).merge_and_unload().named_parameters())
    weights = FakeLLM.made[0].weights()
    assert set(weights) == set(merged) and all(torch.equal(weights[n], merged[n]) for n in weights)
    q = "model.layers.0.self_attn.q_proj"
    assert not torch.equal(weights[f"{q}.weight"], before[f"base_model.model.{q}.base_layer.weight"])
    # unmerged after (W + BA - BA: float rounding apart)
    assert all(torch.allclose(p, before[n], atol=1e-6) for n, p in model.named_parameters())


class Peer:
    """The other rank of a TP group of 2, scripted: what it hands each ``all_gather_object``."""

    def __init__(self, *gifts):
        self.gifts, self.seen = list(gifts), []

    def all_gather_object(self, out, obj, group=None):
        assert group == "tp group"
        self.seen.append(obj)
        out[0], out[1] = obj, self.gifts.pop(0)


def test_with_tensor_parallelism_the_prompts_go_through_trls_gather_of_the_tp_group(
    data, r3rag_base, trl_vllm, monkeypatch
):
    from rag_lab.generators.vllm import TPGroupGenerator, rollouts_done
    from rag_lab.train.vllm_engine import rollout_engine

    trl_vllm.tokenizer_dir = str(r3rag_base / "tokenizer")
    toy = test_r3rag.generator_of(r3rag_base)
    engine = rollout_engine(vllm_generator(r3rag_base), toy.model, toy.tokenizer, False)
    backend = engine.backend  # made a TP group of 2 after the fact: one process here plays rank 0 of it
    backend.tensor_parallel_size, backend.tp_group = 2, "tp group"
    from rag_lab.generators.vllm import engine_generator

    generator = engine_generator(backend, toy.tokenizer, False)
    assert isinstance(generator, TPGroupGenerator)
    sampling = Sampling(max_new_tokens=4)
    mine = [q.question for q in data.split("train")[:2]]
    theirs = [toy.tokenizer(q.question, add_special_tokens=False).input_ids for q in data.split("dev")[:3]]
    # round 1: the peer asks 3 prompts of the same sampling; TRL gathers prompts, then images; then finish
    peer = Peer((3, sampling), theirs, [None] * 3, (0, None))
    monkeypatch.setattr(torch.distributed, "all_gather_object", peer.all_gather_object)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda group=None: 0)
    out = generator.generate(mine, sampling)
    rollouts_done(generator)
    [texts] = FakeLLM.made[0].prompts  # one engine call, on both ranks' prompts: ours padded to the peer's 3
    decoded = [toy.tokenizer.decode(toy.tokenizer(m, add_special_tokens=False).input_ids) for m in mine]
    assert texts[:2] == decoded and texts[3:] == [toy.tokenizer.decode(t) for t in theirs]
    assert [c.text for [c] in out] == [c.text for [c] in toy.generate(decoded, sampling)]
    assert peer.gifts == [] and peer.seen[-1] == (0, None)  # this rank took part until no rank asked


def test_a_tp_group_that_cannot_form_or_serve_main_only_rollouts_is_one_line(monkeypatch):
    from rag_lab.train.vllm_engine import rollout_engine

    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(RagLabError, match="generator.tensor_parallel_size: 2 does not divide the 3 training"):
        rollout_engine(FakeRun(2), None, None, False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RagLabError, match="rolls out on the main process alone.*train_mode=server"):
        rollout_engine(FakeRun(2), None, None, False, main_only=True)


class FakeRun(VLLMGenerator):
    """generator=vllm's settings, nothing built."""

    def __init__(self, tp: int):
        self.tp = tp

    def backend_settings(self) -> dict:
        return {"mode": "colocate", "tensor_parallel_size": self.tp}


def test_stoprag_collects_its_trajectories_on_the_runs_vllm_engine(
    data, r3rag_base, trl_vllm, monkeypatch, tmp_path
):
    """Stop-RAG trains no LM: its rollouts (the offline trajectories its Q-network learns from) generate on
    the run's own vLLM engine (``generator=vllm``), and give what transformers gives on the same weights."""
    import sys

    from rag_lab.generators.hf import HFGenerator
    from rag_lab.policies.stoprag.offline import collect
    from rag_lab.policies.stoprag.pipeline import IterativePipeline

    monkeypatch.setattr(sys.modules["vllm"], "LLM", FakeLLM)
    trl_vllm.tokenizer_dir = str(r3rag_base / "tokenizer")
    questions, pipeline = data.split("train")[:3], IterativePipeline(iterations=2, max_new_tokens=8)
    env = Env(data.corpus, BM25Retriever(data.corpus), vllm_generator(r3rag_base))
    got = collect(pipeline, env, questions, tmp_path / "vllm.jsonl", samples=0, greedy_answers=True)
    [engine] = FakeLLM.made
    assert len(engine.calls) >= 2  # every iteration's queries and answers
    hf = HFGenerator(str(r3rag_base), str(r3rag_base / "tokenizer"), chat=False, dtype="float32")
    want = collect(
        pipeline, env.with_generator(hf), questions, tmp_path / "hf.jsonl", samples=0, greedy_answers=True
    )
    assert got == want
