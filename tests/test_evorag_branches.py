"""EVO-RAG's branch rollouts: siblings forced through the engine, forks independent, each branch scored by
its time-weighted return on a hand-built episode (values by hand), the margin's pairs, the verifier."""

import pytest
from test_engine import Scripted
from test_evorag_rewards import Toy

from rag_lab.data.base import Corpus, Passage, QAExample
from rag_lab.env import Env
from rag_lab.env.engine import Live, advance, fork, undoable
from rag_lab.env.episode import Episode, Step
from rag_lab.env.protocols.base import Action, State, Turn
from rag_lab.env.protocols.evorag import EVORAGStep
from rag_lab.generators.base import Completion, Sampling
from rag_lab.policies.evorag import branches as br
from rag_lab.policies.evorag.dpo import dpo_rows
from rag_lab.retrievers.base import Hit
from rag_lab.rewards.evorag import EvoRAGReward
from rag_lab.rewards.evorag_verifier import EvidenceVerifier

EXAMPLE = QAExample("q1", "Where?", ("Paris",), supporting_ids=("p2",))
P1, P2 = Passage("p1", "One", "x"), Passage("p2", "Two", "y")


def step(text, action, query=None, ids=(), error=None):
    return Step(text=text, action=action, query=query, retrieved_ids=list(ids), error=error)


def live(*steps: Step) -> Live:
    """An episode of ``steps`` (the question EXAMPLE's), its state holding each search's passages."""
    episode = Episode("q1", "Where?", steps=list(steps))
    turns = [Turn(Action(s.action, query=s.query), passages=[P1] if s.query == "a" else [P2]) for s in steps]
    return Live(episode, State("Where?", turns=[t for t in turns if t.action.kind == "search"]), set())


def ended(x: Live, prediction: str, reason: str) -> Live:
    x.episode.prediction, x.episode.stop_reason = prediction, reason
    return x


def hand_built():
    """Stage 2, T_max 10; the prefix t=1 SEARCH a (no gold). At t=2 the actual action A searches b (gold),
    then answers Paris; siblings B answer Paris, C refuse, D backtrack then answer Rome."""
    prefix = step("SEARCH: a", "search", "a", ["p1"])
    a = ended(
        live(prefix, step("SEARCH: b", "search", "b", ["p2"]), step("ANSWER: Paris", "answer")),
        "Paris",
        "answer",
    )
    node = br.Node(0, 2, live(prefix), "search")
    node.siblings = [
        ("answer", ended(live(prefix, step("ANSWER: Paris", "answer")), "Paris", "answer")),
        ("refuse", ended(live(prefix, step("REFUSE", "refuse")), "", "refuse")),
        ("backtrack", ended(live(prefix, step("BACKTRACK", "backtrack"), step("ANSWER: Rome", "answer")),
                            "Rome", "answer")),
    ]  # fmt: skip
    return a, node


def test_each_sibling_is_scored_by_its_time_weighted_return_and_the_margin_picks_the_pairs():
    a, node = hand_built()
    reward = EvoRAGReward(encoder=Toy())
    # a second base episode, of an unanswerable question, refused at once (no node branches from it)
    other = QAExample("q2", "Who?", ("Nobody",), answerable=False)
    refused = ended(live(step("REFUSE", "refuse")), "", "refuse")
    values, (siblings,) = br.returns(reward, [a, refused], [node], [EXAMPLE, other], stage=2, t_max=10)
    # The prefix, t=1 (p 0.1): −β 0.95 − η 0.055 = −1.005, in every branch.
    # A: t=2 (p 0.2) β 0.9 − γ 0.64·0.6 (cos(b, a)) − η 0.06; t=3 (p 0.3) κ 0.37 − η 0.065.
    assert values[0] == pytest.approx(-1.005 + 0.9 - 0.384 - 0.06 + 0.37 - 0.065)  # −0.244
    assert values[1] == pytest.approx(0.5 - 0.055)  # ρ 0.5 · +1 (unanswerable) − η(0.1)
    assert siblings == [
        pytest.approx(-1.005 + 0.28 - 0.06),  # B: κ(0.2) 0.28 · (EM + F1)/2 1 − η 0.06 = −0.785
        pytest.approx(-1.005 - 0.5 - 0.06),  # C: ρ 0.5 · −1 (answerable) − η = −1.565
        pytest.approx(-1.005 - 0.6 - 0.06 - 0.065),  # D: δ(0.2) 0.6 · −1 − η, then Rome: −η(0.3) = −1.73
    ]
    branches = br.node_branches(node, a, values[0], siblings)
    assert [(b.action, b.completion) for b in branches] == [
        ("search", "SEARCH: b"), ("answer", "ANSWER: Paris"), ("refuse", "REFUSE"),
        ("backtrack", "BACKTRACK"),
    ]  # fmt: skip
    assert branches[0].text.startswith("SEARCH: b | ANSWER: Paris\nQuestion: Where?\nEarlier: a")
    names = {b.action: n for b, n in zip(branches, "ABCD", strict=True)}

    def pairs(margin, per_state=None):
        (kept,) = br.pairs_of([branches], margin, per_state)
        return [names[p.action] + names[n.action] for p, n in kept]

    # |ΔR|: A−B 0.541, A−C 1.321, A−D 1.486, B−C 0.78, B−D 0.945, C−D 0.165 (widest first)
    assert pairs(0.2) == ["AD", "AC", "BD", "BC", "AB"]
    assert pairs(0.5) == pairs(0.2) and pairs(0.6) == ["AD", "AC", "BD", "BC"]
    assert pairs(0.1)[-1] == "CD" and pairs(0.2, per_state=1) == ["AD"]
    # DPO's row: the state's prompt ids, the better action's ids chosen (tests/test_token_ids.py: which ids);
    # a state given no ids (a generator that reads text) gives none
    widest = br.pairs_of([branches], 0.2, 1)
    ((good, bad),) = widest[0]
    assert (good.completion, bad.completion) == ("SEARCH: b", "BACKTRACK")
    assert dpo_rows([[7, 8]], widest) == [
        {"prompt_ids": [7, 8], "chosen_ids": good.completion_ids, "rejected_ids": bad.completion_ids}
    ]
    assert dpo_rows([[]], widest) == []


class Fixed:
    """A retriever that finds p2 for any query."""

    def search(self, queries, k, exclude=None):
        return [[Hit("p2", 1.0)] for _ in queries]


def test_siblings_are_forced_and_forks_are_independent():
    protocol = EVORAGStep()
    generator = Scripted(" Paris", " b", " Paris", "ANSWER: Paris")
    world = Env(Corpus(["p1", "p2"], ["One", "Two"], ["x", "y"]), Fixed(), generator)
    x = Live(Episode("q1", "Where?"), State("Where?"), set())
    advance(protocol, [x], world, [Completion("SEARCH: a")], k=1)
    first = br.Node(0, 1, Live(Episode("q1", "Where?"), State("Where?"), set()), "search")
    second = br.Node(0, 2, fork(x), "refuse")
    counts = {"noop_backtracks": 0, "branches": 0}
    br.roll(protocol, world, [first, second], br.ACTIONS, Sampling(), 1, 5, counts)
    # one batched call for the written siblings: node 1's ANSWER (SEARCH is its action; no BACKTRACK at t=1:
    # nothing to undo), node 2's SEARCH and ANSWER; the prefix ends each prompt
    (asked, *rest) = generator.prompts
    assert [p[-len("ANSWER:") :] if p.endswith("ANSWER:") else p[-len("SEARCH:") :] for p in asked] == [
        "ANSWER:", "SEARCH:", "ANSWER:",
    ]  # fmt: skip
    assert [k for k, _ in first.siblings] == ["answer", "refuse"] and counts["noop_backtracks"] == 1
    assert [k for k, _ in second.siblings] == ["search", "backtrack", "answer"]
    kinds = {k: x for k, x in second.siblings}
    assert (
        kinds["answer"].episode.steps[-1].text == "ANSWER: Paris"
        and kinds["answer"].episode.prediction == "Paris"
    )
    assert kinds["search"].episode.steps[1].text == "SEARCH: b"
    assert [x.episode.stop_reason for _, x in first.siblings] == ["answer", "refuse"]
    # the BACKTRACK fork abandoned its copy of the search, not the node's nor another fork's
    assert kinds["backtrack"].state.turns[0].abandoned
    assert not second.live.state.turns[0].abandoned and not kinds["answer"].state.turns[0].abandoned
    assert len(second.live.episode.steps) == 1 and counts["branches"] == 5
    assert len(rest) == 1  # the SEARCH fork played on: one more batched turn


def test_the_verifier_decides_a_refusal_and_an_unparsable_reply_is_a_scored_failure():
    verifier = EvidenceVerifier(Scripted("yes", "No.", "maybe"))
    reward = EvoRAGReward(
        refusal="verifier", verifier=verifier, encoder=Toy(), components=["ref"], schedule="flat"
    )
    refusals = [ended(live(step("REFUSE", "refuse")), "", "refuse") for _ in range(3)]
    questions = [QAExample(f"q{i}", f"Q{i}?", ("x",), answerable=False) for i in range(3)]
    values = reward.returns([r.episode for r in refusals], questions, 1, 10, [[P1], [P2], []])
    assert values == [
        -1.0,
        1.0,
        -1.0,
    ]  # enough evidence: refusing is wrong; not enough: right; unparsed: wrong
    assert (verifier.calls, verifier.unparsed) == (3, 1)
    assert "[1] One: x" in verifier.generator.prompts[0][0][0]["content"]
    reward.returns([refusals[0].episode], questions[:1], 1, 10, [[P1]])
    assert verifier.calls == 3  # asked once per (question, evidence)


def test_backtrack_undoes_the_latest_search_that_still_holds_evidence():
    first, second = Turn(Action("search", query="a"), [P1]), Turn(Action("search", query="b"), [P2])
    state = State("Where?", turns=[first, second, Turn(Action("search", query="c"))])  # c found nothing
    assert undoable(state) is second
    second.abandoned = True
    assert undoable(state) is first
    first.abandoned = True
    assert undoable(state) is None  # a BACKTRACK here undoes nothing: no sibling of that kind


class Recording(Fixed):
    """Fixed, keeping each search's k and exclusions."""

    def __init__(self):
        self.calls = []

    def search(self, queries, k, exclude=None):
        self.calls.append((k, exclude))
        return super().search(queries, k, exclude)


class Seeded(Scripted):
    def __init__(self, *replies):
        super().__init__(*replies)
        self.seeds = []

    def generate(self, prompts, sampling):
        self.seeds.append(sampling.seed)
        return super().generate(prompts, sampling)


def test_siblings_roll_on_with_the_runs_k_its_exclusions_and_the_next_seed():
    generator, retriever = Seeded(" b", " b", "SEARCH: c", "SEARCH: c", " e"), Recording()
    world = Env(Corpus(["p1", "p2"], ["One", "Two"], ["x", "y"]), retriever, generator)
    nodes = [br.Node(0, 1, Live(Episode("q1", "Where?"), State("Where?"), set()), "answer") for _ in range(2)]
    counts = {"noop_backtracks": 1, "branches": 3}  # carried over from an earlier call
    br.roll(EVORAGStep(), world, nodes, ("search", "backtrack"), Sampling(seed=7), 2, 2, counts, True)
    assert counts == {"noop_backtracks": 3, "branches": 5}
    # the forced siblings are written with the run's seed, the rest of each branch with the next one
    assert generator.seeds == [7, 8]
    assert [k for k, _ in retriever.calls] == [2, 2] and all(e is not None for _, e in retriever.calls)
    assert [len(x.episode.steps) for n in nodes for _, x in n.siblings] == [2, 2]
    assert {x.episode.stop_reason for n in nodes for _, x in n.siblings} == {"max_turns"}
    retriever.calls.clear()
    node = br.Node(0, 1, Live(Episode("q1", "Where?"), State("Where?"), set()), "answer")
    br.roll(EVORAGStep(), world, [node], ("search",), Sampling(), 2, 1, counts)
    assert retriever.calls == [(2, None)]  # exclude_seen is off unless asked
    assert br.replace_seed(Sampling(seed=7), 3).seed == 10 and br.replace_seed(Sampling(), 3).seed is None


def test_the_evidence_held_and_what_the_preference_model_reads():
    x = live(step("SEARCH: a", "search", "a"), step("SEARCH: b", "search", "b"))
    x.state.turns[0].abandoned = True
    assert br.evidence(x) == [P2]
    episode = Episode("q1", "Where?", [step("SEARCH: a", "search", "a"), step("BACKTRACK", "backtrack"),
                                       step("ANSWER: Paris", "answer")])  # fmt: skip
    assert br.pm_text(episode, 3) == "ANSWER: Paris\nQuestion: Where?\nEarlier: a; backtrack"
    assert br.pm_text(episode, 1).endswith("\nEarlier: (none)")


def test_returns_hand_each_episode_its_evidence_and_each_node_its_own_siblings():
    class Seen:
        def returns(self, episodes, examples, stage, t_max, evidence):
            self.evidence = evidence
            return [float(i) for i in range(len(episodes))]

    a, node = hand_built()
    other = br.Node(0, 1, live(), "search")
    other.siblings = [("answer", ended(live(step("ANSWER: Rome", "answer")), "Rome", "answer"))]
    reward = Seen()
    values, per_node = br.returns(reward, [a], [node, other], [EXAMPLE], stage=1, t_max=10)
    assert values == [0.0] and per_node == [[1.0, 2.0, 3.0], [4.0]]
    assert reward.evidence[0] == [P1, P2] and reward.evidence[-1] == []


def test_the_states_branched_at_fit_their_prompts_and_are_drawn_by_the_seed():
    from rag_lab.env.fit import TOO_LONG_ERROR

    def episode(n_steps, too_long=()):
        kinds, errors = ("search", "backtrack"), {t: TOO_LONG_ERROR for t in too_long}
        steps = [step(f"{kinds[t % 2]} s{t}", kinds[t % 2], f"s{t}", error=errors.get(t))
                 for t in range(1, n_steps + 1)]  # fmt: skip
        return live(*steps)

    base = [episode(5, too_long=(2,)), episode(1)]
    traces = [[f"state {t}" for t in range(1, 6)], ["only"]]
    counts = {"prompt_too_long": 1}
    nodes = br.visited(base, traces, None, "seed", counts)
    assert [(n.index, n.t, n.live, n.actual) for n in nodes] == [
        (0, 1, "state 1", "backtrack"), (0, 3, "state 3", "backtrack"), (0, 4, "state 4", "search"),
        (0, 5, "state 5", "backtrack"), (1, 1, "only", "backtrack"),
    ]  # fmt: skip
    assert counts["prompt_too_long"] == 2  # added to what was counted before
    drawn = [
        [(n.index, n.t) for n in br.visited(base, traces, 2, s, {"prompt_too_long": 0})] for s in "abcdef"
    ]
    assert all(
        d[:2] == sorted(d[:2]) and d[2] == (1, 1) and len(d) == 3 for d in drawn
    )  # two of four, in order
    again = [
        [(n.index, n.t) for n in br.visited(base, traces, 2, s, {"prompt_too_long": 0})] for s in "abcdef"
    ]
    assert len(set(map(tuple, drawn))) > 1 and drawn == again  # the seed draws them: the same seed, the same


def test_the_base_rollouts_play_each_question_and_trace_its_states():
    generator, retriever = Scripted("SEARCH: a", "ANSWER: Paris", "SEARCH: b", "SEARCH: c"), Recording()
    world = Env(Corpus(["p1", "p2"], ["One", "Two"], ["x", "y"]), retriever, generator)
    questions = [EXAMPLE, QAExample("q2", "Who?", ("Ada",))]
    lives, traces = br.base_rollouts(EVORAGStep(), world, questions, Sampling(), 2, 2, True)
    # a batched turn each: q1 searched twice and met the step limit; q2 answered at once
    assert [x.episode.stop_reason for x in lives] == ["max_turns", "answer"]
    assert [(x.episode.question_id, x.episode.question, x.state.question) for x in lives] == [
        ("q1", "Where?", "Where?"), ("q2", "Who?", "Who?"),
    ]  # fmt: skip
    assert [len(t) for t in traces] == [2, 1] and not traces[0][0].episode.steps
    assert len(traces[0][1].episode.steps) == 1  # the state before step 2: one step taken
    assert retriever.calls and all(k == 2 and e is not None for k, e in retriever.calls)
    lives, _ = br.base_rollouts(EVORAGStep(), world, questions[:1], Sampling(), 3, 1)
    assert retriever.calls[-1] == (3, None)
