"""EVO-RAG's preference data by branching (arXiv:2505.17391 sec. 3.3-3.4; docs/methods/evorag.md): at visited
states of the current policy's rollouts, every sibling action is rolled out to the end, each branch is
scored by its time-weighted return R(x) (:class:`rag_lab.rewards.evorag.EvoRAGReward`), and siblings whose
returns differ by a margin make preference pairs.

1. **Base rollouts**: the policy's episodes at its training temperature (:func:`rag_lab.env.engine.play`,
   the state before each step recorded).
2. **Visited states**: step t of episode i is node (i, t): its state, its actual action. ``per_episode``
   nodes of each episode are drawn (seeded; None: all). A node whose prompt did not fit the model is
   dropped (counted).
3. **Siblings**: every kind of ``actions`` other than the actual one; BACKTRACK only where a search
   still holds evidence (otherwise it undoes nothing: counted). SEARCH and ANSWER siblings are the
   model's own completions of a written ``"SEARCH:"`` / ``"ANSWER:"`` (one batched generate); BACKTRACK
   and REFUSE siblings are the bare action word. Each sibling then plays on under the policy, in one
   batch, until it ends or reaches T_max steps (its earlier steps counted).
4. **Returns**: every base episode and every branch in one reward call (one encoder pass); a branch
   holds its node's earlier steps, so its own steps are weighted from w(t).
5. **Pairs** (:func:`pairs_of`): per node, the actual branch and its siblings; ``preference_pairs`` with
   a margin (Δ 0.3 for the preference model, δ 0.2 and the widest pair per state for DPO).

Token in, token out: a node keeps the ids the policy was given at it (``Step.prompt_ids``: the prompt
rendered, fitted and tokenized once by the engine), and each branch its action as ids
(:func:`action_ids`): the ids the policy sampled, after the action word's ids where the word was written
for it (tokenized alone, as the engine appended them to the prompt); a written BACKTRACK or REFUSE is the
word tokenized alone and the end of the turn (the tokenizer's EOS, where the policy's own steps end). DPO
trains on those ids (:mod:`.dpo`), never on the texts tokenized again.

Deviations, written down: the paper branches every visited state and does not say how a sibling action
is produced; we draw ``per_episode`` states (CPU budget) and force the sibling's action word, the model
writing its query or answer (greedy decoding of the tiny LM never writes BACKTRACK or REFUSE, so sampling
alone would rarely give a sibling of each kind).

Hand-written: no library rolls out sibling branches of an agent episode.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from rag_lab.data.base import Passage, QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.engine import Live, advance, fork, full, generate, play, undoable
from rag_lab.env.episode import Step
from rag_lab.env.fit import TOO_LONG_ERROR
from rag_lab.env.protocols.base import ANSWER, BACKTRACK, REFUSE, SEARCH, Action, Protocol, State, Turn
from rag_lab.generators.base import Completion, Sampling, text_ids
from rag_lab.policies.evorag.preference import Branch, preference_pairs

ACTIONS = (SEARCH, BACKTRACK, ANSWER, REFUSE)
# the sibling's action word, written for the model to continue (SEARCH / ANSWER) or alone
PREFIX = {SEARCH: "SEARCH:", ANSWER: "ANSWER:"}


@dataclass
class Node:
    """A visited state: step ``t`` (1-based) of base episode ``index``, before the step was taken."""

    index: int
    t: int
    live: Live
    actual: str
    # (kind, the branch's live episode at its end) per sibling, filled by :func:`roll`
    siblings: list[tuple[str, Live]] = field(default_factory=list)
    # the ids the policy was given at this state (the actual step's; empty where the generator reads text)
    prompt_ids: list[int] = field(default_factory=list)


def evidence(x: Live) -> list[Passage]:
    """The passages an episode holds (D≤t: its searches' documents, less those a BACKTRACK abandoned)."""
    return [p for t in x.state.turns if not t.abandoned for p in t.passages]


def held_evidence(corpus, episode: Episode) -> list[Passage]:
    """:func:`evidence` of a finished episode, its state replayed from its steps: each SEARCH a turn of the
    passages it retrieved, each BACKTRACK abandoning what the engine's would (:func:`undoable`)."""
    state = State(episode.question)
    for step in episode.steps:
        if step.action == SEARCH:
            state.turns.append(Turn(Action(SEARCH), [corpus.get(pid) for pid in step.retrieved_ids]))
        elif step.action == BACKTRACK:
            undone = undoable(state)
            if undone is not None:
                undone.abandoned = True
            state.turns.append(Turn(Action(BACKTRACK)))
    return evidence(Live(episode, state, set()))


def base_rollouts(
    protocol: Protocol,
    env: Env,
    questions: Sequence[QAExample],
    sampling: Sampling,
    k: int,
    t_max: int,
    exclude_seen: bool = False,
) -> tuple[list[Live], list[list[Live]]]:
    """The policy's episodes (their final live state) and, per episode, the states it visited."""
    live = [Live.start(ex) for ex in questions]
    traces: list[list[Live]] = [[] for _ in live]
    play(protocol, live, env, sampling, k, t_max, exclude_seen, trace=traces)
    for x in live:
        x.episode.stop_reason = x.episode.stop_reason or "max_turns"
    return live, traces


def visited(
    base: Sequence[Live], traces: Sequence[Sequence[Live]], per_episode: int | None, seed: str, counts: dict
) -> list[Node]:
    """The nodes to branch at (module docstring, 2), drawn by ``random.Random(seed)``."""
    rng, nodes = random.Random(seed), []
    for i, (x, trace) in enumerate(zip(base, traces, strict=True)):
        steps = x.episode.steps
        fits = [t for t in range(1, len(trace) + 1) if steps[t - 1].error != TOO_LONG_ERROR]
        counts["prompt_too_long"] += len(trace) - len(fits)
        if per_episode is not None and len(fits) > per_episode:
            fits = sorted(rng.sample(fits, per_episode))
        nodes += [
            Node(i, t, trace[t - 1], steps[t - 1].action, prompt_ids=steps[t - 1].prompt_ids) for t in fits
        ]
    return nodes


def roll(
    protocol: Protocol,
    env: Env,
    nodes: Sequence[Node],
    actions: Sequence[str],
    sampling: Sampling,
    k: int,
    t_max: int,
    counts: dict,
    exclude_seen: bool = False,
) -> None:
    """Each node's sibling branches, rolled out to their ends (module docstring, 3): ``node.siblings``."""
    forks: list[Live] = []
    for node in nodes:
        for kind in actions:
            if kind == node.actual:
                continue
            if kind == BACKTRACK and undoable(node.live.state) is None:
                counts["noop_backtracks"] += 1
                continue
            x = fork(node.live)
            node.siblings.append((kind, x))
            forks.append(x)
    kinds = [kind for node in nodes for kind, _ in node.siblings]
    asked = [i for i, kind in enumerate(kinds) if kind in PREFIX]
    completions = [Completion(protocol.format(Action(kind))) for kind in kinds]
    written = generate(
        env, protocol, [forks[i].state for i in asked], sampling, [PREFIX[kinds[i]] for i in asked]
    )
    for i, c in zip(asked, written, strict=True):
        completions[i] = c
    still = [x for x in advance(protocol, forks, env, completions, k, exclude_seen) if not full(x, t_max)]
    play(protocol, still, env, replace_seed(sampling, 1), k, t_max, exclude_seen)
    for x in forks:
        x.episode.stop_reason = x.episode.stop_reason or "max_turns"
    counts["branches"] += len(forks)


def replace_seed(sampling: Sampling, offset: int) -> Sampling:
    """``sampling`` with its seed moved by ``offset`` (None stays None)."""
    return sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + offset)


def returns(reward, base: Sequence[Live], nodes: Sequence[Node], examples, stage: int, t_max: int):
    """R(x) of every base episode and of every node's siblings, in one reward call (module docstring, 4):
    (per base episode, per node the siblings' values)."""
    branches = [x for node in nodes for _, x in node.siblings]
    lives = [*base, *branches]
    owner = [*range(len(base)), *(node.index for node in nodes for _ in node.siblings)]
    values = reward.returns(
        [x.episode for x in lives], [examples[i] for i in owner], stage, t_max, [evidence(x) for x in lives]
    )
    per_node, at = [], len(base)
    for node in nodes:
        per_node.append(values[at : at + len(node.siblings)])
        at += len(node.siblings)
    return values[: len(base)], per_node


def node_branches(
    node: Node, base: Live, value: float, sibling_values: Sequence[float], tokenizer=None
) -> list[Branch]:
    """The node's branches: the base episode's (its actual action) first, then each sibling's; each action's
    text and ids (:func:`action_ids`; none without a ``tokenizer``: a generator that reads text)."""
    lives = [(node.actual, base), *node.siblings]
    values = [value, *sibling_values]
    steps = [x.episode.steps[node.t - 1] for _, x in lives]
    return [
        Branch(
            pm_text(x.episode, node.t),
            kind,
            v,
            completion=step.text,
            completion_ids=action_ids(node, step, tokenizer) if tokenizer is not None else [],
        )
        for (kind, x), v, step in zip(lives, values, steps, strict=True)
    ]


def action_ids(node: Node, step: Step, tokenizer) -> list[int]:
    """A branch's action at ``node`` as token ids (module docstring): what its step was given past the
    node's prompt (a written action word) and what it sampled; a step the policy never generated (a written
    BACKTRACK or REFUSE), its text tokenized alone and the end of the turn."""
    if not step.prompt_ids:
        return text_ids(tokenizer, [step.text])[0] + [tokenizer.eos_token_id]
    if step.prompt_ids[: len(node.prompt_ids)] != node.prompt_ids:
        raise ValueError("a sibling was not given the ids of its node's prompt")
    return step.prompt_ids[len(node.prompt_ids) :] + step.token_ids


def pm_text(episode: Episode, t: int) -> str:
    """What the preference model reads of a branch from step ``t``: the branch's own steps first (the
    encoder reads 256 tokens), then the question and the sub-queries before ``t``; no documents."""
    own = " | ".join(s.text.strip() for s in episode.steps[t - 1 :])
    before = "; ".join(s.query or s.action for s in episode.steps[: t - 1]) or "(none)"
    return f"{own}\nQuestion: {episode.question}\nEarlier: {before}"


def pairs_of(
    branches: Sequence[Sequence[Branch]], margin: float, per_state: int | None
) -> list[list[tuple[Branch, Branch]]]:
    """Per node, its (x⁺, x⁻) pairs with |ΔR| ≥ ``margin`` (``per_state``: the widest ones only)."""
    return [preference_pairs(b, margin, per_state) for b in branches]
