"""R3-RAG's PPO on a toy tiny LM: per-step samples mask exactly the policy's tokens (never the retrieved
documents); two iterations move the actor and the value head with finite losses; a killed run resumes to the
weights of an uninterrupted one; the policy caches its result; the configs compose and bad settings are one
line."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from rag_lab.core.config import ConfigError, compose
from rag_lab.env.engine import run_agent
from rag_lab.env.protocols.r3rag import R3RAGStep
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.r3rag import trainer as trainer_module
from rag_lab.policies.r3rag.policy import R3RAG
from rag_lab.policies.r3rag.ppo import PPOSettings
from rag_lab.policies.r3rag.samples import CutDocuments, rollouts, step_samples, tensors
from rag_lab.policies.r3rag.trainer import PPOTrainer, Rollout
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.rewards.r3rag_judges import R3RAGReward
from rag_lab.train.heldout import HeldOut

from conftest import Killed, undocumented_metrics, untrained_tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")
# two iterations of 2 questions x 1 temperature; rewards neither normalised nor whitened, so that an untrained
# toy's batch (every episode a format failure: equal rewards) still has advantages
TOY = PPOSettings(
    iterations=2, batch_size=2, temperatures=(1.0,), ppo_epochs=2, minibatches=2, micro_batch=4,
    actor_lr=1e-2, critic_lr=1e-2, normalize_rewards=False, whiten_advantages=False, max_doc_chars=60,
)  # fmt: skip


@pytest.fixture(scope="module")
def base(data, tmp_path_factory) -> Path:
    """An untrained toy tiny LM whose word-level vocabulary covers the corpus and the r3rag protocol."""
    return untrained_tiny_lm(data, ("r3rag",), tmp_path_factory.mktemp("b") / "lm")


def generator_of(base: Path) -> HFGenerator:
    return HFGenerator(str(base), str(base / "tokenizer"), chat=False, dtype="float32", batch_size=64)


class TokenizedTeacher:
    """The world teacher's steps, with the toy tokenizer's ids as the tokens "generated"."""

    def __init__(self, data, like: HFGenerator):
        self.teacher, self.tokenizer, self.context_length = TeacherGenerator(data), like.tokenizer, 1024

    def generate(self, prompts, sampling):
        out = self.teacher.generate(prompts, sampling)
        for c in (c for cs in out for c in cs):
            c.token_ids = self.tokenizer(c.text, add_special_tokens=False).input_ids
        return out


def test_a_samples_loss_mask_is_exactly_the_policys_tokens_never_the_documents(data, base):
    toy = generator_of(base)
    env = CutDocuments(data.corpus, BM25Retriever(data.corpus), TokenizedTeacher(data, toy), max_chars=60)
    sampling = Sampling(max_new_tokens=64)
    protocol = R3RAGStep()
    _, live, traces = rollouts(protocol, env, data.split("train")[:4], (0.0,), sampling, k=2, max_turns=4)
    samples = step_samples(live)
    assert len(samples) == sum(len(x.episode.steps) for x in live)
    batch = tensors(samples, toy.tokenizer.pad_token_id)
    for r, s in enumerate(samples):
        mask = batch["mask"][r].bool()
        assert batch["input_ids"][r, 1:][mask].tolist() == s.completion_ids
        assert mask.sum() == len(s.completion_ids) and batch["value_at"][r] == len(s.prompt_ids) - 1
    later = [s for s in samples if s.step > 0]
    assert later
    for s in later:
        # the previous step's documents are in this step's prompt, cut to 60 characters, with no loss
        passages = traces[s.episode][s.step].state.turns[-1].passages
        assert passages and all(len(p.text) <= 60 for p in passages)
        words = toy.tokenizer(passages[0].text, add_special_tokens=False).input_ids
        prompt = s.prompt_ids
        assert any(prompt[i : i + len(words)] == words for i in range(len(prompt)))


def test_a_steps_value_is_read_at_its_prompts_last_token(base):
    """The critic sees the state the step was generated from: its value does not depend on the completion."""
    from transformers import AutoModelForCausalLM

    from rag_lab.policies.r3rag.model import ActorCritic
    from rag_lab.policies.r3rag.samples import Sample

    model = ActorCritic(AutoModelForCausalLM.from_pretrained(base), "shared")
    torch.nn.init.normal_(model.head.weight)
    prompt = list(range(5, 15))
    batches = [tensors([Sample(prompt, completion, 0, 0)], 0) for completion in ([20, 21, 22], [30, 31])]
    (lp1, v1), (lp2, v2) = (model(b["input_ids"], b["attention_mask"], b["value_at"]) for b in batches)
    assert v1.item() == v2.item() and v1.item() != 0.0
    # the token log-probs of the prompt are the same too; the completions' differ
    assert torch.equal(lp1[0, :9], lp2[0, :9]) and not torch.equal(lp1[0, 9:11], lp2[0, 9:11])


def trainer(data, base, settings=TOY, seed=0) -> PPOTrainer:
    toy = generator_of(base)
    from rag_lab.env import Env

    env = Env(data.corpus, BM25Retriever(data.corpus), toy)
    rollout = Rollout(R3RAGStep(), k=2, max_turns=3, max_new_tokens=8)
    return PPOTrainer(toy, env, R3RAGReward(), data.split("train")[:8], settings, rollout, seed)


def weights(t: PPOTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.unwrapped.state_dict().items()}


def test_two_ppo_iterations_move_the_actor_and_the_value_head_with_finite_losses(data, base, tmp_path):
    t = trainer(data, base)
    before = weights(t)
    rows = t.run(tmp_path / "work", tmp_path / "out")
    after = weights(t)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("loss/policy", "loss/value", "kl", "clip_fraction", "ratio", "reward/step"):
        assert all(torch.isfinite(torch.tensor(r[key])) for r in rows), key
    assert not torch.equal(before["head.weight"], after["head.weight"])
    assert not torch.equal(
        before["lm.model.layers.0.mlp.up_proj.weight"], after["lm.model.layers.0.mlp.up_proj.weight"]
    )
    # the reference (the initial model) did not move; the saved policy is the trained one
    assert torch.equal(
        before["lm.model.layers.0.mlp.up_proj.weight"],
        t.reference.state_dict()["model.layers.0.mlp.up_proj.weight"],
    )
    assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "value_head.pt").exists()


def killed_after_first_iteration(t: PPOTrainer, work: Path, out: Path, monkeypatch) -> None:
    """``t.run`` killed right after the checkpoint of iteration 1 (as a SIGKILL would leave it)."""
    save = PPOTrainer.checkpoint

    def killed_after_first(self, work, iteration, rows):
        save(self, work, iteration, rows)
        if iteration == 1:
            raise Killed

    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(trainer_module.PPOTrainer, "checkpoint", killed_after_first)
        t.run(work, out)


def test_a_killed_run_resumes_to_the_weights_of_an_uninterrupted_one(data, base, tmp_path, monkeypatch):
    whole = trainer(data, base)
    whole.run(tmp_path / "whole", tmp_path / "whole_out")
    killed_after_first_iteration(trainer(data, base), tmp_path / "work", tmp_path / "out", monkeypatch)
    resumed = trainer(data, base)
    rows = resumed.run(tmp_path / "work", tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2]
    for key, value in weights(whole).items():
        torch.testing.assert_close(weights(resumed)[key], value, rtol=0, atol=1e-6, msg=key)


def test_the_heldout_curve_measures_the_policy_as_it_trains_and_survives_a_kill(
    data, base, tmp_path, monkeypatch
):
    """heldout (n 3, every iteration): rows at steps 0, 1, 2 whose greedy episodes are the model's of that
    step (0: the start's, 2: the trained one's), weights equal to training without it, and after a kill at
    iteration 1 each row once."""

    import rag_lab.train.heldout as heldout

    texts = []
    row = heldout.heldout_row
    monkeypatch.setattr(heldout, "heldout_row", lambda s, q, eps, sc: texts.append(
        (s, ["".join(x.text for x in e.steps) for e in eps])) or row(s, q, eps, sc))  # fmt: skip
    fast = replace(TOY, actor_lr=0.05)  # two iterations that change what the toy model writes
    dev = data.split("dev")[:3]

    def measured() -> PPOTrainer:
        t = trainer(data, base, fast)
        t.heldout, t.heldout_questions = HeldOut(n=3, every=1), dev
        return t

    plain = trainer(data, base, fast)
    plain.run(tmp_path / "plain", tmp_path / "plain_out")
    t = measured()
    start = greedy(t, dev)
    rows = t.run(tmp_path / "m", tmp_path / "m_out")
    assert [r["step"] for r in rows if "heldout/acc" in r] == [0, 1, 2]
    assert not undocumented_metrics("r3rag", rows)
    assert [s for s, _ in texts] == [0, 1, 2] and texts[0][1] == start and texts[2][1] == greedy(t, dev)
    assert texts[0][1] != texts[2][1]
    for key, value in weights(plain).items():
        torch.testing.assert_close(weights(t)[key], value, rtol=0, atol=1e-6, msg=key)
    killed_after_first_iteration(measured(), tmp_path / "k", tmp_path / "k_out", monkeypatch)
    resumed = measured().run(tmp_path / "k", tmp_path / "k_out")
    assert [(r["step"], "heldout/acc" in r) for r in resumed] == [(s, h) for s, h in [
        (0, True), (1, False), (1, True), (2, False), (2, True)]]  # fmt: skip


def greedy(t: PPOTrainer, questions) -> list[str]:
    """Every episode's generated text, greedy, with ``t``'s model as it is now."""
    r = t.rollout
    with t.acting() as env:
        episodes = run_agent(
            r.protocol, questions, env, Sampling(max_new_tokens=r.max_new_tokens), r.k, r.max_turns
        )
    return ["".join(x.text for x in e.steps) for e in episodes]


def test_the_policy_caches_ppo_and_writes_its_curves(data, base, tmp_path, monkeypatch):
    def policy():
        return R3RAG(reward=R3RAGReward(), ppo=TOY, cold_start=None, k=2, max_turns=3, max_new_tokens=8,
                     train_limit=8, cache_dir=str(tmp_path / "cache"), run_config={})  # fmt: skip

    from rag_lab.env import Env

    env = Env(data.corpus, BM25Retriever(data.corpus), generator_of(base))
    first = policy()
    first.fit(env, data.split("train"), data.split("dev"), tmp_path / "run1")
    assert (tmp_path / "run1" / "curves.png").exists() and (tmp_path / "run1" / "train_log.jsonl").exists()
    logged = [json.loads(line) for line in (tmp_path / "run1" / "train_log.jsonl").read_text().splitlines()]
    assert not undocumented_metrics("r3rag", logged)  # every logged key is on docs/methods/r3rag.md

    def no_training(*args, **kwargs):
        raise AssertionError("PPO ran again instead of reusing the cache")

    monkeypatch.setattr(trainer_module.PPOTrainer, "run", no_training)
    again = policy()
    again.fit(env, data.split("train"), data.split("dev"), tmp_path / "run2")
    assert len(list((tmp_path / "cache" / "r3rag").iterdir())) == 1
    a, b = first.generator.model.state_dict(), again.generator.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the run's generator was never trained in place
    assert env.generator.model is not first.generator.model


def test_the_experiments_compose_and_bad_settings_are_one_line_errors(tiny_cfg):
    cfg = compose(["experiment=r3rag_synth"])
    assert cfg.policy._target_.endswith("R3RAG") and cfg.reward._target_.endswith("R3RAGReward")
    paper = compose(["experiment=r3rag_hotpotqa"])
    assert paper.policy.ppo.actor_lr == 5e-7 and paper.policy.ppo.critic_lr == 9e-6
    assert paper.policy.ppo.batch_size == 64 and paper.policy.k == 5 and paper.policy.max_turns == 5
    with pytest.raises(ConfigError, match=r"'policy.ppo.critic': 'both' is not one of shared, separate"):
        compose(["policy=r3rag", "policy.ppo.critic=both"])
    with pytest.raises(ConfigError, match=r"policy=r3rag needs reward=r3rag"):
        compose(["policy=r3rag", "reward=evorag"])


def test_under_deepspeed_ppo_names_its_micro_batch_before_prepare(tiny_lm):
    """accelerate's DeepSpeed prepare without a data loader needs ``train_micro_batch_size_per_gpu`` in the
    config (it refuses "auto"): PPO's forward pass, ``ppo.micro_batch``, set before ``prepare``."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from rag_lab.policies.r3rag.ppo import build

    seen = {}
    plugin = SimpleNamespace(deepspeed_config={"train_micro_batch_size_per_gpu": "auto"}, zero_stage=2)

    def prepare(*objects):
        seen.update(plugin.deepspeed_config)
        return objects

    accelerator = SimpleNamespace(
        state=SimpleNamespace(deepspeed_plugin=plugin), prepare=prepare, num_processes=2,
        distributed_type="DEEPSPEED",
    )  # fmt: skip
    build(AutoModelForCausalLM.from_pretrained(tiny_lm), PPOSettings(micro_batch=3), accelerator)
    assert (seen["train_micro_batch_size_per_gpu"], seen["train_batch_size"]) == (3, 6)


def dropout_qwen2():
    """A toy Qwen2 whose every dropout is on (the attention's and the LM's), so that a train-mode forward
    differs from an eval-mode one unless PPO turns them off."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attention_dropout=0.5, max_position_embeddings=64,
    )  # fmt: skip
    lm = Qwen2ForCausalLM(config)
    # an nn.Dropout on the embeddings' output, as models with embedding dropout have one
    lm.model.embed_tokens.add_module("drop", torch.nn.Dropout(0.5))
    lm.model.embed_tokens.register_forward_hook(lambda m, i, out: m.drop(out))
    return lm


def ppo_step(monkeypatch, checkpointing: bool) -> tuple:
    """One PPO update (one epoch, one minibatch) of a toy actor-critic on a fixed batch, with
    ``launch.gradient_checkpointing`` as a launched process reads it; (the model, its stats, its weights)."""
    from rag_lab.policies.r3rag.ppo import advantages, build, make_accelerator, score, update
    from rag_lab.train.parallel import CHECKPOINTING_ENV

    monkeypatch.setenv(CHECKPOINTING_ENV, "1" if checkpointing else "0")
    settings = PPOSettings(ppo_epochs=1, minibatches=1, micro_batch=2, critic="separate")
    accelerator = make_accelerator()
    model, reference, optimizer = build(dropout_qwen2(), settings, accelerator)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21], [2, 6, 10, 14, 0, 0]])
    attention = (ids > 0).long()
    batch = {"input_ids": ids, "attention_mask": attention, "value_at": torch.tensor([2, 1])}
    batch["mask"] = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float32)
    batch = score(model, reference, batch, settings.micro_batch)
    samples = [type("S", (), {"episode": i, "step": 0})() for i in range(2)]
    batch = advantages(samples, [[1.0], [0.0]], batch, settings, accelerator)
    stats = update(model, optimizer, batch, settings, accelerator, seed=0)
    return model, stats, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_ppo_under_gradient_checkpointing_trains_in_train_mode_without_dropout_and_updates_alike(monkeypatch):
    """``launch.gradient_checkpointing`` (a 7B actor-critic's activations: ``python -m rag_lab.plan``): both
    trunks checkpoint, which transformers does in train mode only, so every dropout is off there; the first
    ratio is exactly 1 and the update equals the eval-mode one."""
    plain, plain_stats, plain_weights = ppo_step(monkeypatch, checkpointing=False)
    model, stats, weights = ppo_step(monkeypatch, checkpointing=True)
    assert not plain.training and not plain.is_gradient_checkpointing
    assert model.training and model.lm.is_gradient_checkpointing and model.critic_lm.is_gradient_checkpointing
    assert stats["ratio"] == 1.0 and plain_stats["ratio"] == 1.0
    for key, value in plain_weights.items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=1e-6, msg=key)
