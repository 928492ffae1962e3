"""Multi-turn search rollouts for TRL's ``GRPOTrainer`` (its ``rollout_func``), with DAPO's dynamic
sampling (papers/multi-stage-dapo.txt sec. 3.2; Yu et al. 2025, DAPO, sec. 3.2 "dynamic sampling").

Each training step TRL hands over its batch of prompts, every question repeated ``G`` times in a row.
:class:`SearchRollouts` plays each group of ``G`` episodes through the shared batched engine
(:func:`rag_lab.env.engine.run_agent`: one ``generate`` call per turn for every live episode of the
batch, one batched search), with the trainer's current model (the policy's generator around it, in a view
of the env: :meth:`rag_lab.env.Env.with_generator`), and returns one training sequence per episode:

- ``prompt_ids``: the first prompt (question and tag line, or the chat template's prompt);
- ``completion_ids``: the policy's sampled tokens of every turn with the engine's
  ``<information>`` blocks between them (tokenized alone), and ``env_mask`` 1 on the policy's tokens,
  0 on the engine's: TRL leaves the retrieved tokens out of the loss;
- ``logprobs``: the sampling log-probs of the policy's tokens (0 on the engine's; TRL uses them only
  for vLLM's importance correction);
- the extra columns the rewards read: ``rollouts`` (the rollout text the engine parsed, which the
  rewards score instead of TRL's re-decoding: see :class:`OnRollouts`) and ``answers`` (the golds).

Dynamic sampling (hand-written: TRL has none): a group whose total rewards are all equal has zero
advantage and gives no gradient (``flat_by="reward"``, METHODS.md's reading). Such a group is dropped and
refilled with a fresh group of a question drawn from the training pool, re-drawn while any group is
flat, for at most ``max_rounds`` rounds; groups still flat after that stay (their advantage is 0) and are
counted. ``flat_by="correct"`` is DAPO's own rule (Yu et al. 2025, sec. 3.2: prompts whose accuracy is 0
or 1 are filtered out): a group is flat when its episodes are all right or all wrong, whatever the other
reward terms say. Under multi-stage rewards the two differ: an all-wrong group still spreads by r_a's
β·RC, r_s and r_f, and trains on them without any signal of correctness.
Deviation, and why: DAPO over-samples until the batch is full with no cap; the cap keeps a step's
cost bounded where most questions are all-wrong (a weak start), and ``stats`` reports it. A refilled
row's ``answers`` column replaces the dataset's (TRL gives extra columns precedence); its prompt in
TRL's logged completion table stays the original one.

Deviation (tokens): the policy's turns are kept as sampled, the information blocks are tokenized on
their own, and the next turn was generated from the whole text re-tokenized. Where the text
re-tokenizes to its own tokens (the tiny LM's word-level tokenizer on well-formed turns) the two are
the same ids; with a BPE model a merge across a turn boundary can differ, as in Search-R1's and most
multi-turn RL code.
"""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.engine import run_agent
from rag_lab.env.protocols.base import State, Turn
from rag_lab.env.protocols.tagged import DAPOTagged
from rag_lab.generators.base import Sampling, render
from rag_lab.generators.hf import HFGenerator
from rag_lab.rewards.dapo import answer_correct
from rag_lab.train.parallel import own_key, own_seed


def is_flat(totals: np.ndarray) -> bool:
    """All rewards of a group equal, up to float noise (an encoder batch can move a cosine by 1e-9)."""
    return bool(np.ptp(totals) <= 1e-6)


class OnRollouts:
    """A reward of completions (TRL's signature) fed the engine's rollout texts (``rollouts``) instead
    of TRL's decoding of the token ids, which a word-level tokenizer does not invert exactly."""

    def __init__(self, name: str, reward: Callable[..., list[float]], **bound: Any):
        self.__name__, self.reward, self.bound = name, reward, bound

    def __call__(
        self, completions: list[Any], rollouts: list[str] | None = None, **columns: Any
    ) -> list[float]:
        return self.reward(completions if rollouts is None else rollouts, **(columns | self.bound))


@dataclass
class Batch:
    """The rows of one step, group by group: ``G`` episodes of one question each."""

    questions: list[QAExample] = field(default_factory=list)
    episodes: list[list[Episode]] = field(default_factory=list)
    texts: list[list[str]] = field(default_factory=list)
    totals: list[np.ndarray] = field(default_factory=list)


class SearchRollouts:
    """TRL's ``rollout_func``: ``env``'s corpus and retriever, ``generator``'s tokenizer and settings around
    the trainer's model (see the module docstring). The settings have no defaults here: the policy's
    (:class:`rag_lab.policies.dapo.DAPO`) are the only ones."""

    def __init__(
        self,
        env: Env,
        generator: HFGenerator,
        questions: Sequence[QAExample],
        rewards: Sequence[tuple[Callable[..., list[float]], float]],
        *,
        k: int,
        max_turns: int,
        sampling: Sampling,
        dynamic_sampling: bool,
        max_rounds: int,
        seed: int,
        flat_by: str = "reward",
    ):
        self.env, self.generator, self.protocol = env.with_generator(generator), generator, DAPOTagged()
        self.pool = list(questions)
        self.by_prompt = {self.key(self.first_prompt(q)): q for q in self.pool}
        self.rewards, self.k, self.max_turns, self.sampling = list(rewards), k, max_turns, sampling
        self.dynamic_sampling, self.max_rounds, self.seed = dynamic_sampling, max_rounds, seed
        self.flat_by = flat_by
        # the last step's counts (the training log reads them)
        self.stats: dict[str, float] = {}

    def first_prompt(self, example: QAExample):
        return self.protocol.prompt(State(example.question), bool(self.generator.chat))

    @staticmethod
    def key(prompt) -> str:
        return prompt if isinstance(prompt, str) else repr(prompt)

    # ---- TRL's entry point ----------------------------------------------------------------------
    def __call__(self, prompts: list, trainer) -> dict[str, list]:
        group = trainer.num_generations
        questions = [self.by_prompt[self.key(p)] for p in prompts[::group]]
        step = trainer.state.global_step
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        self.env = self.env.with_generator(self.generator.with_model(model.eval()))
        try:
            batch = self.play(questions, group, step)
        finally:
            model.train(was_training)
        return self.encode(batch)

    def play(self, questions: list[QAExample], group: int, step: int) -> Batch:
        """``group`` episodes of each question; flat groups re-drawn (dynamic sampling)."""
        # under launch each process plays its own groups: its own refill draws and sampling seeds
        rng = random.Random(own_key(f"{self.seed}/{step}"))
        n = len(questions)
        batch = Batch(list(questions), [[] for _ in range(n)], [[] for _ in range(n)], [np.zeros(0)] * n)
        rights: list[np.ndarray] = [np.zeros(0)] * n
        todo, rounds, dropped = list(range(n)), 0, 0
        while todo:
            sampling = replace(self.sampling, seed=own_seed(self.seed * 1_000_003 + step * 101 + rounds))
            episodes, texts, totals = self.groups([batch.questions[i] for i in todo], group, sampling)
            for slot, ep, tx, tot in zip(todo, episodes, texts, totals, strict=True):
                batch.episodes[slot], batch.texts[slot], batch.totals[slot] = ep, tx, tot
                rights[slot] = self.right(batch.questions[slot], tx)
            rounds += 1
            flat = [i for i in todo if self.flat(batch.totals[i], rights[i])]
            if not self.dynamic_sampling or not flat or rounds >= self.max_rounds:
                break
            dropped += len(flat)
            for i in flat:  # a fresh question for each flat group
                batch.questions[i] = self.pool[rng.randrange(len(self.pool))]
            todo = flat
        flat_left = sum(self.flat(t, r) for t, r in zip(batch.totals, rights, strict=True))
        self.stats = {
            "sampling/rounds": rounds,
            "sampling/dropped_groups": dropped,
            "sampling/flat_groups_kept": int(flat_left),
            # groups with right and wrong episodes: the ones whose advantage says something of correctness
            "sampling/mixed_groups": sum(bool(np.ptp(r)) for r in rights),
        }
        return batch

    def flat(self, totals: np.ndarray, rights: np.ndarray) -> bool:
        """Whether a group is dropped by dynamic sampling (``flat_by``: see the module docstring)."""
        return is_flat(totals) or (self.flat_by == "correct" and not np.ptp(rights))

    @staticmethod
    def right(question: QAExample, texts: list[str]) -> np.ndarray:
        """1 where an episode's answer is right (Acc, the monitor's rule), per episode of a group."""
        return np.asarray(answer_correct(texts, [list(question.answers)] * len(texts)), dtype=float)

    def groups(self, questions: list[QAExample], group: int, sampling: Sampling):
        """Episodes (``group`` per question, one batched engine run), their texts and total rewards."""
        repeated = [q for q in questions for _ in range(group)]
        episodes = run_agent(self.protocol, repeated, self.env, sampling, k=self.k, max_turns=self.max_turns)
        texts = [self.rollout_text(ep) for ep in episodes]
        answers = [list(q.answers) for q in repeated]
        total = np.zeros(len(episodes))
        for reward, weight in self.rewards:
            if weight:
                total += weight * np.asarray(reward(texts, answers=answers), dtype=float)
        cut = [slice(i * group, (i + 1) * group) for i in range(len(questions))]
        return [episodes[c] for c in cut], [texts[c] for c in cut], [total[c] for c in cut]

    def information(self, step) -> str:
        passages = [self.env.corpus.get(pid) for pid in step.retrieved_ids]
        return self.protocol.information(Turn(None, passages))

    def rollout_text(self, episode: Episode) -> str:
        """The text the engine built: each turn, then its information block (none after a turn that did not
        search: DAPOTagged.rollout_text)."""
        return "".join(s.text + self.information(s) for s in episode.steps)

    # ---- to TRL's rows --------------------------------------------------------------------------
    def encode(self, batch: Batch) -> dict[str, list]:
        tokenizer = self.generator.tokenizer
        out: dict[str, list] = {
            k: [] for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "rollouts", "answers")
        }
        for question, episodes, texts in zip(batch.questions, batch.episodes, batch.texts, strict=True):
            prompt = render(tokenizer, self.first_prompt(question))
            prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
            for episode, text in zip(episodes, texts, strict=True):
                ids, logprobs, mask = [], [], []
                for s in episode.steps:
                    ids += s.token_ids
                    logprobs += s.logprobs or [0.0] * len(s.token_ids)
                    mask += [1] * len(s.token_ids)
                    if s.retrieved_ids:
                        info = tokenizer(self.information(s), add_special_tokens=False).input_ids
                        ids, logprobs, mask = ids + info, logprobs + [0.0] * len(info), mask + [0] * len(info)
                if not ids:  # nothing generated at all: one EOS, so that the row has a token to score
                    ids, logprobs, mask = [tokenizer.eos_token_id], [0.0], [1]
                out["prompt_ids"].append(prompt_ids)
                out["completion_ids"].append(ids)
                out["logprobs"].append(logprobs)
                out["env_mask"].append(mask)
                out["rollouts"].append(text)
                out["answers"].append(list(question.answers))
        return out
