"""DAPO's rollout bookkeeping without a model: what reaches TRL's rows (ids, mask, log-probs, prompts),
dynamic sampling's rounds, drops and seeds, and the reward wrapper. The engine is replaced by a script
(the real one is exercised end to end in test_dapo.py)."""

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from rag_lab.data.base import Passage, QAExample
from rag_lab.env import Episode
from rag_lab.env.episode import Step
from rag_lab.generators.base import Sampling
from rag_lab.policies.dapo import rollout as rollout_module
from rag_lab.policies.dapo.rollout import OnRollouts, SearchRollouts, is_flat

BOS, EOS = 1, 2


class Tokenizer:
    """Characters as ids (ord + 10); a BOS in front when asked for special tokens (as many BPE
    tokenizers do), which must never happen inside a completion."""

    eos_token_id = EOS
    chat_template = "{{ messages }}"

    def __call__(self, text: str | list[str], add_special_tokens: bool = True):
        def ids(t: str) -> list[int]:
            return ([BOS] if add_special_tokens else []) + [ord(c) + 10 for c in t]

        return SimpleNamespace(input_ids=ids(text) if isinstance(text, str) else [ids(t) for t in text])

    def apply_chat_template(self, messages, tokenize, add_generation_prompt, continue_final_message):
        return "".join(f"[{m['role']}]{m['content']}" for m in messages) + (
            "[assistant]" * add_generation_prompt
        )


@dataclass
class Corpus:
    passages: dict[str, Passage] = field(default_factory=dict)

    def get(self, pid: str) -> Passage:
        return self.passages[pid]


class Env:
    def __init__(self):
        self.corpus = Corpus({"p1": Passage("p1", "Alpha", "alpha is first.")})

    def with_generator(self, generator):
        return self


def questions(n: int) -> list[QAExample]:
    return [QAExample(f"q{i}", f"question {i}?", (f"answer {i}",)) for i in range(n)]


def make(pool, rewards=(), chat=False, **settings) -> SearchRollouts:
    generator = SimpleNamespace(chat=chat, tokenizer=Tokenizer())
    defaults = dict(
        k=3,
        max_turns=4,
        sampling=Sampling(temperature=1.0, max_new_tokens=8),
        dynamic_sampling=True,
        max_rounds=4,
        seed=7,
    )
    return SearchRollouts(Env(), generator, pool, list(rewards), **(defaults | settings))


class Scripted(SearchRollouts):
    """``groups`` replaced: round r's totals come from ``flat_rounds``: the positions (in that round's
    questions) whose group is all equal; every call's questions and sampling seed are kept."""

    def groups(self, questions, group, sampling):
        self.calls.append(([q.id for q in questions], sampling.seed))
        flat = self.flat_rounds[len(self.calls) - 1] if len(self.calls) <= len(self.flat_rounds) else "all"
        totals = [
            np.zeros(group) if flat == "all" or i in flat else np.arange(group, dtype=float)
            for i in range(len(questions))
        ]
        return (
            [[Episode(q.id, q.question)] * group for q in questions],
            [[""] * group for _ in questions],
            totals,
        )


def scripted(pool, flat_rounds, **settings) -> Scripted:
    rollouts = make(pool, **settings)
    rollouts.__class__ = Scripted
    rollouts.calls, rollouts.flat_rounds = [], flat_rounds
    return rollouts


def test_a_group_is_flat_up_to_float_noise_only():
    assert (
        is_flat(np.array([0.5, 0.5, 0.5]))
        and is_flat(np.array([0.0, 1e-9]))
        and is_flat(np.array([0.0, 1e-6]))
    )
    assert (
        not is_flat(np.array([0.0, 0.1]))
        and not is_flat(np.array([0.0, 1.0]))
        and not is_flat(np.array([3.0, 0.0]))
    )


def test_the_reward_wrapper_scores_the_engine_texts_and_its_bound_settings_win():
    seen = []

    def reward(completions, stage=1, **columns):
        seen.append((completions, stage, columns))
        return [0.0] * len(completions)

    wrapped = OnRollouts("answer", reward, stage=2)
    assert wrapped.__name__ == "answer"
    wrapped(["decoded"], rollouts=["engine text"], stage=1, answers=[["a"]])
    wrapped(["decoded"], answers=[["a"]])
    assert seen == [(["engine text"], 2, {"answers": [["a"]]}), (["decoded"], 2, {"answers": [["a"]]})]


def test_rounds_drops_and_the_cap_are_counted():
    pool = questions(20)
    # round 1: the first group flat; round 2: the refill flat again; round 3: none flat
    rollouts = scripted(pool, [[0], [0], []])
    batch = rollouts.play(pool[:2], group=3, step=5)
    assert [ids for ids, _ in rollouts.calls][0] == ["q0", "q1"] and len(rollouts.calls[1][0]) == 1
    assert rollouts.stats == {
        "sampling/rounds": 3,
        "sampling/dropped_groups": 2,
        "sampling/flat_groups_kept": 0,
        "sampling/mixed_groups": 0,
    }
    assert batch.questions[1] is pool[1] and batch.questions[0].id == rollouts.calls[2][0][0]
    # always flat: max_rounds rounds, then the flat groups stay (counted)
    capped = scripted(pool, [], max_rounds=2)
    capped.play(pool[:2], group=3, step=0)
    assert len(capped.calls) == 2
    assert capped.stats == {
        "sampling/rounds": 2,
        "sampling/dropped_groups": 2,
        "sampling/flat_groups_kept": 2,
        "sampling/mixed_groups": 0,
    }
    off = scripted(pool, [], dynamic_sampling=False)
    off.play(pool[:2], group=3, step=0)
    assert len(off.calls) == 1 and off.stats["sampling/flat_groups_kept"] == 2
    assert make(pool).stats == {}  # before the first step: nothing to log


class Answers(SearchRollouts):
    """``groups`` replaced: every group's totals spread (0, 1, 2, ...); question i's episodes answer right
    in the first ``right[i]`` of them (by its id; a refill's: none)."""

    def groups(self, questions, group, sampling):
        self.calls.append([q.id for q in questions])
        texts = [
            [
                f"<answer>{q.answers[0] if j < self.right_of.get(q.id, 0) else 'wrong'}</answer>"
                for j in range(group)
            ]
            for q in questions
        ]
        episodes = [[Episode(q.id, q.question)] * group for q in questions]
        return episodes, texts, [np.arange(group, dtype=float) for _ in questions]


@pytest.mark.parametrize("flat_by", ["reward", "correct"])
def test_flat_by_correct_drops_the_groups_all_right_or_all_wrong_whatever_their_other_rewards(flat_by):
    pool = questions(30)
    rollouts = make(pool, flat_by=flat_by, max_rounds=2)
    rollouts.__class__, rollouts.calls = Answers, []
    rollouts.right_of = {"q0": 0, "q1": 1, "q2": 3}  # all wrong, mixed, all right
    batch = rollouts.play(pool[:3], group=3, step=0)
    if flat_by == "reward":  # every group's totals spread: none dropped
        assert rollouts.calls == [["q0", "q1", "q2"]] and batch.questions == pool[:3]
        assert rollouts.stats["sampling/dropped_groups"] == 0 and rollouts.stats["sampling/mixed_groups"] == 1
    else:  # q0 and q2 dropped and refilled (the refills all wrong: kept after the cap, counted)
        assert len(rollouts.calls) == 2 and len(rollouts.calls[1]) == 2 and batch.questions[1] is pool[1]
        assert batch.questions[0] is not pool[0] and batch.questions[2] is not pool[2]
        assert rollouts.stats == {
            "sampling/rounds": 2,
            "sampling/dropped_groups": 2,
            "sampling/flat_groups_kept": 2,
            "sampling/mixed_groups": 1,
        }


def test_sampling_seeds_differ_by_round_step_and_seed_and_replay_exactly():
    pool = questions(50)

    def run(seed, step):
        rollouts = scripted(pool, [[0, 1, 2], [0, 1, 2], [0, 1, 2]], seed=seed, max_rounds=4)
        rollouts.play(pool[:3], group=2, step=step)
        return rollouts.calls

    calls = run(7, 3)
    seeds = [seed for _, seed in calls]
    assert all(isinstance(s, int) for s in seeds) and len(set(seeds)) == len(seeds) == 4
    assert calls == run(7, 3)  # the same refills (questions drawn) and seeds on a replay
    others = {s for _, s in run(7, 4) + run(8, 3)}
    assert not others & set(seeds)


def test_groups_hand_the_engine_its_settings_and_sum_the_weighted_rewards(monkeypatch):
    seen = {}

    def run_agent(protocol, examples, env, sampling, k, max_turns):
        seen.update(ids=[e.id for e in examples], k=k, max_turns=max_turns)
        return [
            Episode(e.id, e.question, [Step(text=f"<answer> {e.id} {i} </answer>")])
            for i, e in enumerate(examples)
        ]

    monkeypatch.setattr(rollout_module, "run_agent", run_agent)

    def first(completions, answers, **_):
        return [float(len(a[0])) for a in answers]

    def second(completions, answers, **_):
        return [float(c.split()[2]) for c in completions]

    rollouts = make(questions(2), [(first, 0.5), (second, 2.0), (lambda c, **_: [1e9] * len(c), 0.0)])
    episodes, texts, totals = rollouts.groups(questions(2), 2, rollouts.sampling)
    assert seen == {"ids": ["q0", "q0", "q1", "q1"], "k": 3, "max_turns": 4}
    assert texts == [
        ["<answer> q0 0 </answer>", "<answer> q0 1 </answer>"],
        ["<answer> q1 2 </answer>", "<answer> q1 3 </answer>"],
    ]
    np.testing.assert_allclose(np.concatenate(totals), [0.5 * 8 + 2.0 * i for i in range(4)])
    assert [ep.question_id for ep in episodes[1]] == ["q1", "q1"]


def encode_one(steps, chat=False):
    rollouts = make(questions(1), chat=chat)
    question = questions(1)[0]
    episode = Episode(question.id, question.question, steps)
    batch = SimpleNamespace(
        questions=[question], episodes=[[episode]], texts=[[rollouts.rollout_text(episode)]]
    )
    return rollouts, {k: v[0] for k, v in rollouts.encode(batch).items()}


def test_rows_are_the_ids_each_turn_was_given_and_sampled_with_the_information_masked():
    """Token in, token out: the row is the engine's record (each step's prompt ids, as given, and its sampled
    ids), the block between the turns the ids the second turn was given, never the text tokenized again."""
    tokenizer = Tokenizer()
    first = [70, 71, 72]  # the first prompt's ids, as the engine gave them
    block = [80, 81]  # the information block, tokenized alone when the engine appended it
    steps = [
        Step(
            text="<search> alpha </search>",
            retrieved_ids=["p1"],
            prompt_ids=first,
            token_ids=[11, 12, 13],
            logprobs=[-0.5, -1.0, -2.0],
        ),
        # a policy without log-probs (an LM-free one)
        Step(text="<answer> a </answer>", prompt_ids=first + [11, 12, 13] + block, token_ids=[14, 15]),
    ]
    rollouts, row = encode_one(steps)
    assert row["prompt_ids"] == first and BOS not in row["completion_ids"]
    assert row["completion_ids"] == [11, 12, 13] + block + [14, 15]
    assert row["env_mask"] == [1, 1, 1, 0, 0, 1, 1]
    assert row["logprobs"] == [-0.5, -1.0, -2.0, 0.0, 0.0, 0.0, 0.0]
    assert row["rollouts"] == steps[0].text + rollouts.information(steps[0]) + steps[1].text
    assert row["answers"] == ["answer 0"]
    # a last turn that searched: its block, which no turn read, tokenized alone, appended and masked
    _, row = encode_one(steps[:1])
    info = tokenizer(rollouts.information(steps[0]), add_special_tokens=False).input_ids
    assert "alpha is first." in rollouts.information(steps[0])
    assert row["completion_ids"] == [11, 12, 13] + info and row["env_mask"] == [1, 1, 1] + [0] * len(info)
    # a turn not given the ids before it (its history tokenized anew) is a bug, never a row
    broken = [steps[0], Step(text="<answer> a </answer>", prompt_ids=first + [11, 99], token_ids=[14])]
    with pytest.raises(ValueError, match="not given the ids"):
        encode_one(broken)


def test_an_episode_without_tokens_is_one_eos_the_policy_owns():
    _, row = encode_one([])
    assert (row["completion_ids"], row["logprobs"], row["env_mask"]) == ([EOS], [0.0], [1])


def test_chat_prompts_are_found_again_and_rendered_with_the_template():
    pool = questions(3)
    rollouts = make(pool, chat=True)
    prompts = [rollouts.first_prompt(q) for q in pool]
    assert all(
        isinstance(p, list) and p[-1] == {"role": "user", "content": q.question}
        for p, q in zip(prompts, pool, strict=True)
    )
    assert [rollouts.by_prompt[rollouts.key(p)] for p in prompts] == pool
    _, row = encode_one([], chat=True)
    rendered = Tokenizer().apply_chat_template(rollouts.first_prompt(pool[0]), False, True, False)
    assert row["prompt_ids"] == Tokenizer()(rendered, add_special_tokens=False).input_ids


def test_settings_have_one_source_the_policy():
    with pytest.raises(TypeError):
        SearchRollouts(Env(), SimpleNamespace(chat=False, tokenizer=Tokenizer()), questions(1), [])
