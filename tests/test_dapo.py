"""DAPO training on a toy tiny LM: TRL's GRPOTrainer with the engine's multi-turn rollouts (retrieved
tokens out of the loss), dynamic sampling, the stages, the cache and the resume after a kill."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records
from rag_lab.env import Env
from rag_lab.env.protocols.tagged import INFORMATION
from rag_lab.generators.base import Completion, Sampling, as_text
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.dapo.policy import DAPO
from rag_lab.policies.dapo.rollout import SearchRollouts
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.rewards.dapo import format_reward
from rag_lab.train.heldout import HeldOut

from conftest import Killed, kill_at, undocumented_metrics, untrained_tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def base(data, tmp_path_factory) -> Path:
    """An untrained toy tiny LM whose word-level vocabulary covers the corpus and the dapo protocol."""
    from rag_lab.train.tiny.reading import TAGS

    return untrained_tiny_lm(data, ("dapo",), tmp_path_factory.mktemp("b") / "lm", TAGS)


class SearchesFirst(HFGenerator):
    """The toy LM, except that its first turn is a fixed search (an untrained model never writes the
    tags): every episode then holds an information block."""

    def generate(self, prompts, sampling):
        out = super().generate(prompts, sampling)
        first = "<think> a </think> <search> " + self.query + " </search>"
        ids = self.tokenizer(first, add_special_tokens=False).input_ids
        for prompt, completions in zip(prompts, out, strict=True):
            if "<information>" not in as_text(prompt):
                completions[:] = [Completion(self.tokenizer.decode(ids), ids, "stop", [0.0] * len(ids))]
        return out


def env_for(data, base: Path) -> Env:
    generator = SearchesFirst(str(base), str(base / "tokenizer"), chat=False, dtype="float32", batch_size=64)
    generator.query = data.corpus[0].title
    return Env(data.corpus, BM25Retriever(data.corpus), generator)


def length(completions, **_):
    """A reward that tells samples apart (an untrained model's rollouts differ in length)."""
    return [float(len(c)) for c in completions]


def answer(completions, answers, stage=1, **_):
    """Records the stage it was called with; 0 everywhere (leaves the total to ``length``)."""
    answer.stages.add(stage)
    return [0.0] * len(completions)


answer.stages = set()


def policy(**overrides) -> DAPO:
    """A DAPO of toy sizes; ``run_config={}`` (as the runner hands one) caches its stages in cache_dir."""
    settings = dict(
        reward={"answer": answer, "length": length},
        stages=[1],
        steps=2,
        questions_per_step=2,
        group_size=4,
        lr=1e-2,
        k=2,
        max_turns=2,
        max_new_tokens=12,
        save_steps=1,
        cold_start=None,
        run_config={},
    )
    return DAPO(**(settings | overrides))


def runs(pairs: list[tuple[int, int]]) -> list[tuple[int, list[int]]]:
    """(token, mask) pairs as maximal runs of one mask value: [(value, tokens), ...].

    >>> runs([(5, 1), (6, 0), (7, 0), (8, 1)])
    [(1, [5]), (0, [6, 7]), (1, [8])]
    """
    out: list[tuple[int, list[int]]] = []
    for token, value in pairs:
        if out and out[-1][0] == value:
            out[-1][1].append(token)
        else:
            out.append((value, [token]))
    return out


def bare(text: str) -> str:
    """Text without whitespace (a word-level tokenizer's decoding re-spaces punctuation)."""
    return "".join(text.split())


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path / "model.safetensors")


def stage_dirs(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "dapo").iterdir() if not p.name.endswith(".work"))


def test_two_dapo_steps_train_the_model_with_retrieved_tokens_masked(data, base, tmp_path, monkeypatch):
    from trl import GRPOTrainer

    seen = []
    original = GRPOTrainer._generate_and_score_completions

    def spy(self, inputs):
        out = original(self, inputs)
        seen.append(out)
        return out

    monkeypatch.setattr(GRPOTrainer, "_generate_and_score_completions", spy)
    env, cache = env_for(data, base), tmp_path / "cache"
    answer.stages.clear()
    trained = policy(cache_dir=str(cache), stages=[1, 2])
    trained.fit(env, data.split("train"), [], tmp_path / "run")

    assert answer.stages == {1, 2}
    dirs = stage_dirs(cache)
    assert len(dirs) == 2 and len(list((cache / "dapo").iterdir())) == 2  # published; no work dir left
    rows = read_records(tmp_path / "run" / "train_log.jsonl")
    assert [(r["stage"], r["step"]) for r in rows] == [("1", 1), ("1", 2), ("2", 3), ("2", 4)]
    assert all(math.isfinite(r["loss"]) for r in rows) and all("rc" in r and "acc" in r for r in rows)
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0
    # trained: each stage moved the weights; the policy's generator holds the last stage's, the env's is
    # untouched (a copy trained)
    start, one, two = weights(base), *(weights(d) for d in dirs)
    assert all(any(not torch.equal(start[n], w[n]) for n in start) for w in (one, two))
    assert Path(trained.generator.model.name_or_path) in dirs and trained.generator is not env.generator
    assert all(torch.equal(start[n], p) for n, p in env.generator.model.state_dict().items() if n in start)
    # the retrieved tokens reached TRL as environment tokens (mask 0, out of the loss), and only they: each
    # run of mask 0 is information blocks, no run of mask 1 holds one
    assert len(seen) == 4
    tokenizer, blocks = env.generator.tokenizer, 0
    for out in seen:
        rows = (out[k].cpu().tolist() for k in ("completion_ids", "tool_mask", "completion_mask"))
        for ids, mask, completion in zip(*rows, strict=True):
            kept = [(i, m) for i, m, c in zip(ids, mask, completion, strict=True) if c]
            for value, run in runs(kept):
                text = bare(tokenizer.decode(run))
                if value == 0:
                    assert text.startswith("<information>") and text.endswith("</information>"), text
                    blocks += 1
                else:
                    assert "<information>" not in text, text
    assert blocks > 0


def test_rollouts_mask_exactly_the_information_blocks(data, base):
    env = env_for(data, base)
    questions = data.split("train")[:3]
    rollouts = SearchRollouts(
        env,
        env.generator,
        questions,
        [(length, 1.0)],
        k=2,
        max_turns=3,
        sampling=Sampling(temperature=1.0, max_new_tokens=12),
        dynamic_sampling=True,
        max_rounds=4,
        seed=0,
    )
    trainer = SimpleNamespace(
        num_generations=2,
        state=SimpleNamespace(global_step=0),
        accelerator=SimpleNamespace(unwrap_model=lambda m: m),
        model=env.generator.model,
    )
    prompts = [rollouts.first_prompt(q) for q in questions for _ in range(2)]
    out = rollouts(prompts, trainer)
    tokenizer = env.generator.tokenizer
    assert len(out["completion_ids"]) == 6 and out["answers"][0] == list(questions[0].answers)
    searched = 0
    for ids, mask, logprobs, text, prompt_ids, prompt in zip(
        out["completion_ids"],
        out["env_mask"],
        out["logprobs"],
        out["rollouts"],
        out["prompt_ids"],
        prompts,
        strict=True,
    ):
        assert len(ids) == len(mask) == len(logprobs)
        assert prompt_ids == tokenizer(prompt, add_special_tokens=False).input_ids
        # mask 0: exactly the engine's information blocks; mask 1: exactly the policy's own turns
        blocks = INFORMATION.findall(text)
        env_text = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m == 0])
        assert bare(env_text) == bare("".join(f"<information>{b}</information>" for b in blocks))
        policy_ids = [i for i, m in zip(ids, mask, strict=True) if m == 1]
        assert bare(tokenizer.decode(policy_ids, skip_special_tokens=True)) == bare(INFORMATION.sub("", text))
        searched += bool(blocks)
    assert searched > 0


def test_dynamic_sampling_drops_and_refills_all_equal_groups(data, base):
    env = env_for(data, base)
    questions = data.split("train")[:6]
    flat = questions[0]

    def flat_for_one(completions, answers, **_):  # the first question's group is all equal
        return [
            0.0 if a == list(flat.answers) else float(len(c))
            for c, a in zip(completions, answers, strict=True)
        ]

    rollouts = SearchRollouts(
        env,
        env.generator,
        questions,
        [(flat_for_one, 1.0)],
        k=2,
        max_turns=2,
        sampling=Sampling(temperature=1.0, max_new_tokens=12),
        dynamic_sampling=True,
        max_rounds=4,
        seed=0,
    )
    batch = rollouts.play([flat, questions[1]], group=3, step=0)
    assert rollouts.stats["sampling/dropped_groups"] >= 1 and batch.questions[0] is not flat
    assert batch.questions[1] is questions[1]
    # the refilled group is the new question's: its episodes, its prompt and its golds reach TRL
    new = batch.questions[0]
    assert all(ep.question_id == new.id and ep.question == new.question for ep in batch.episodes[0])
    encoded = rollouts.encode(batch)
    prompt = env.generator.tokenizer(rollouts.first_prompt(new), add_special_tokens=False).input_ids
    assert encoded["prompt_ids"][:3] == [prompt] * 3 and encoded["answers"][:3] == [list(new.answers)] * 3
    off = SearchRollouts(
        env,
        env.generator,
        questions,
        [(flat_for_one, 1.0)],
        k=2,
        max_turns=2,
        sampling=Sampling(temperature=1.0, max_new_tokens=12),
        dynamic_sampling=False,
        max_rounds=4,
        seed=0,
    )
    kept = off.play([flat, questions[1]], group=3, step=0)
    assert kept.questions[0] is flat and off.stats == {
        "sampling/rounds": 1,
        "sampling/dropped_groups": 0,
        "sampling/flat_groups_kept": 1,
        "sampling/mixed_groups": 0,
    }


def test_a_killed_stage_resumes_to_the_uninterrupted_weights(data, base, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    policy(cache_dir=str(straight)).fit(env_for(data, base), data.split("train"), [], tmp_path / "a")
    killed = tmp_path / "killed"
    from trl import GRPOTrainer

    init = GRPOTrainer.__init__

    def with_kill(self, *args, callbacks=(), **kwargs):
        init(self, *args, callbacks=[*callbacks, kill_at(1)], **kwargs)

    monkeypatch.setattr(GRPOTrainer, "__init__", with_kill)
    with pytest.raises(Killed):
        policy(cache_dir=str(killed)).fit(env_for(data, base), data.split("train"), [], tmp_path / "b")
    monkeypatch.undo()
    policy(cache_dir=str(killed)).fit(env_for(data, base), data.split("train"), [], tmp_path / "b")
    [a], [b] = stage_dirs(straight), stage_dirs(killed)
    assert a.name == b.name  # the same stage key
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    assert [r["step"] for r in read_records(b / "log.jsonl")] == [1, 2]
    assert read_records(a / "log.jsonl")[-1]["loss"] == read_records(b / "log.jsonl")[-1]["loss"]


def test_bad_settings_are_one_line_errors():
    with pytest.raises(RagLabError, match="policy.stages: 3 is not a stage"):
        policy(stages=[3])
    with pytest.raises(RagLabError, match="reward: DAPO needs reward functions"):
        policy(reward={"answer": None}).fit(None, [], [], Path("unused"))


def test_format_reward_scores_a_broken_rollout_as_a_failure():
    broken = "<think>x</think>\n<search>q</search>"  # no answer: the engine ends it, the reward scores it
    assert format_reward([broken]) == [-1.0]


def test_the_stage_key_is_the_runs_config_but_the_stages(data, base, tmp_path):
    """A stage is reused by a run with the same config but for ``policy.stages`` (a sweep over stages) and
    for the evaluation's settings; any other setting, the retriever's included, trains it anew."""
    env, questions = env_for(data, base), data.split("train")[:3]

    def key(**config) -> str:
        return policy(run_config=config).stage_dir("start", 1, questions, env, tmp_path).name

    assert key(retriever={"k1": 1.2}) == key(retriever={"k1": 1.2}) != key(retriever={"k1": 0.9})
    assert key(policy={"stages": [1], "lr": 0.1}) == key(policy={"stages": [1, 2], "lr": 0.1})
    assert key(policy={"lr": 0.1}) != key(policy={"lr": 0.2}) != key(reward={"search": None})
    assert key(eval={"limit": 5}) == key(eval={"limit": 9}) == key()
    assert key() != policy(run_config={}).stage_dir("start", 1, questions[:2], env, tmp_path).name
    # built outside the runner (no run config): the stages stay in the run's directory
    alone = policy(run_config=None).stage_dir("start", 1, questions, env, tmp_path / "run")
    assert alone.parent.parent == tmp_path / "run" / "stages"


def test_the_paper_setup_is_its_table_5():
    """dapo_2wiki: 32 prompts x 32 rollouts a step (1,024 trajectories), 500 steps over the two stages,
    lr 1e-6, no KL term (the text's choice over the table's kl_loss_coef), one update per batch, in passes
    of one trajectory (ppo_micro_batch_size_per_gpu)."""
    from rag_lab.core.config import compose
    from rag_lab.policies.dapo.trainer import dapo_config

    p = compose(["experiment=dapo_2wiki"]).policy
    assert (p.questions_per_step * p.group_size, p.steps * len(p.stages), p.lr, p.kl_coef, p.micro_batch) == (
        1024,
        500,
        1e-6,
        0.0,
        1,
    )
    args = dapo_config(
        policy(kl_coef=1e-4, questions_per_step=32, group_size=32), Path("unused"), [1.0], "cpu"
    )
    assert (args.per_device_train_batch_size, args.num_generations, args.beta) == (1024, 32, 1e-4)
    assert (args.gradient_accumulation_steps, args.steps_per_generation, args.num_iterations) == (1, 1, 1)
    args = dapo_config(
        policy(questions_per_step=32, group_size=32, micro_batch=1), Path("unused"), [1.0], "cpu"
    )
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (1, 1024)
    assert (args.generation_batch_size, args.steps_per_generation) == (1024, 1024)


def test_a_damaged_stage_is_named_not_loaded_and_a_damaged_checkpoint_is_skipped(data, base, tmp_path):
    from safetensors.torch import save_file

    from rag_lab.train.resume import last_good_checkpoint

    env, cache = env_for(data, base), tmp_path / "cache"
    policy(cache_dir=str(cache)).fit(env, data.split("train"), [], tmp_path / "a")
    [stage] = stage_dirs(cache)
    weights_file = stage / "model.safetensors"
    weights_file.write_bytes(weights_file.read_bytes()[:100])  # a copy cut short
    with pytest.raises(
        RagLabError, match=rf"DAPO stage 1: {weights_file} is damaged .*: remove {stage} to train"
    ):
        policy(cache_dir=str(cache)).fit(env, data.split("train"), [], tmp_path / "b")
    # a Trainer checkpoint cut short is passed over for the one before it
    work = tmp_path / "work"
    for step in (1, 2):
        (work / f"checkpoint-{step}").mkdir(parents=True)
        save_file({"w": torch.ones(4)}, work / f"checkpoint-{step}" / "model.safetensors")
        (work / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert last_good_checkpoint(work) == str(work / "checkpoint-2")
    (work / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": ')
    assert last_good_checkpoint(work) == str(work / "checkpoint-1")
    # a checkpoint whose save was killed before its trainer state: every file it holds reads
    (work / "checkpoint-3").mkdir()
    (work / "checkpoint-3" / "README.md").write_text("a model card")
    save_file({"w": torch.ones(4)}, work / "checkpoint-3" / "model.safetensors")
    assert last_good_checkpoint(work) == str(work / "checkpoint-1")


def test_the_heldout_curve_measures_the_model_as_it_trains_and_changes_no_weight(
    data, base, tmp_path, monkeypatch
):
    """policy.heldout (n 3, every step): a row at steps 0, 1, 2 whose episodes are the greedy policy's with
    the model of that step (step 0: the start's, step 2: the published stage's), and the same weights as
    training without it (the measurement keeps every random stream)."""
    import rag_lab.train.heldout as heldout

    texts = []  # (step, every episode's generated text): the untrained model's answers are all empty
    row = heldout.heldout_row
    monkeypatch.setattr(
        heldout, "heldout_row", lambda s, q, eps, sc: texts.append((s, said(eps))) or row(s, q, eps, sc)
    )
    dev = data.split("dev")[:3]
    plain, measured = tmp_path / "plain", tmp_path / "measured"
    fast = {"lr": 0.5}  # two steps that change what the toy model writes
    policy(cache_dir=str(plain), **fast).fit(env_for(data, base), data.split("train"), dev, tmp_path / "a")
    trained = policy(cache_dir=str(measured), heldout=HeldOut(n=3, every=1), **fast)
    trained.fit(env_for(data, base), data.split("train"), dev, tmp_path / "b")
    [a], [b] = stage_dirs(plain), stage_dirs(measured)
    wa, wb = weights(a), weights(b)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)
    rows = read_records(tmp_path / "b" / "train_log.jsonl")
    assert [r["step"] for r in rows if "heldout/acc" in r] == [0, 1, 2]
    assert not undocumented_metrics("dapo", rows)  # every logged key is on docs/methods/dapo.md
    assert [s for s, _ in texts] == [0, 1, 2] and texts[0][1] != texts[2][1]
    env = env_for(data, base)  # the toy LM that searches first, around the start's and the trained weights
    start = trained.rollout(env, dev)
    greedy = trained.rollout(env.with_generator(env.generator.with_model(trained.generator.model)), dev)
    assert texts[0][1] == said(start) and texts[2][1] == said(greedy)


def test_a_later_stage_does_not_measure_its_start_again(data, base, tmp_path):
    """Two stages of one step, the held-out curve every step: rows at steps 0 and 1 (stage 1's start and end)
    and 2 (stage 2's end), no second row at 1: stage 2 starts from the model stage 1 measured last."""
    trained = policy(cache_dir=str(tmp_path / "c"), stages=[1, 2], steps=1, heldout=HeldOut(n=3, every=1))
    trained.fit(env_for(data, base), data.split("train"), data.split("dev")[:3], tmp_path / "out")
    rows = read_records(tmp_path / "out" / "train_log.jsonl")
    assert [(r["stage"], r["step"]) for r in rows if "heldout/acc" in r] == [("1", 0), ("1", 1), ("2", 2)]


def said(episodes) -> list[str]:
    return ["".join(step.text for step in ep.steps) for ep in episodes]


def test_micro_batches_make_the_update_of_one_pass(tiny_lm, tmp_path):
    """``policy.micro_batch``: each step's 8 episodes in 4 passes of 2 make the update of one pass of 8 (TRL's
    gradient accumulation over one generated batch: its "dapo" loss divides by the whole batch's tokens)."""
    from data_parallel import grpo
    from transformers import AutoModelForCausalLM

    one, _ = grpo(tiny_lm, tmp_path / "one")
    four, stats = grpo(tiny_lm, tmp_path / "four", micro_batch=2)
    assert stats["steps"] == 2
    initial = AutoModelForCausalLM.from_pretrained(tiny_lm).state_dict()
    mine = four.state_dict()
    for key, value in one.state_dict().items():
        # the key projection's bias gets rounding noise only, which Adam scales up (test_data_parallel.py)
        atol = 1e-4 if key.endswith("k_proj.bias") else 1e-5
        torch.testing.assert_close(mine[key], value, rtol=1e-4, atol=atol, msg=key)
    assert sum(not torch.equal(mine[k], v) for k, v in initial.items()), "no weight moved"
