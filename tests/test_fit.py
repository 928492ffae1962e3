"""Prompts fitted to the model on purpose (rag_lab.env.fit): the question kept, passages cut to the
most words that fit, a prompt that cannot fit refused as a scored failure, and each counted; the prompts
leave as token ids, a continued rollout's history as it was and only its new block cut."""

from types import SimpleNamespace

from rag_lab.data.base import Passage, QAExample
from rag_lab.env import Env
from rag_lab.env.engine import generate, record, run_agent
from rag_lab.env.fit import TOO_LONG, TOO_LONG_ERROR, fitted_prompts, with_passages_cut
from rag_lab.env.protocols.base import SEARCH, Action, State, Turn
from rag_lab.env.protocols.simple import QA
from rag_lab.env.protocols.tagged import DAPOTagged
from rag_lab.generators.base import Completion, Sampling, TokenPrompt, as_text


class Words:
    """A tokenizer of whitespace-separated words (no chat template)."""

    chat_template = None

    def __call__(self, texts, add_special_tokens=False):
        return SimpleNamespace(input_ids=[t.split() for t in texts])


class Echo:
    """A generator of ``context_length`` positions: answers "<answer> ok </answer>", keeps its prompts."""

    def __init__(self, context_length):
        self.context_length, self.tokenizer, self.chat, self.prompts = context_length, Words(), False, []

    def generate(self, prompts, sampling):
        self.prompts += prompts
        return [
            [Completion("<answer> ok </answer>", [5, 6], "stop", [-0.1, -0.2], prompt_tokens=3)]
            for _ in prompts
        ]


def state(question_words: int, passage_words: list[int]) -> State:
    passages = [
        Passage(f"p{i}", f"T{i}", " ".join(f"w{j}" for j in range(n))) for i, n in enumerate(passage_words)
    ]
    return State(" ".join(["q"] * question_words), [Turn(Action(SEARCH, query="x"), passages)])


def words(prompt: str) -> int:
    return len(prompt.split())


def test_a_prompt_that_fits_is_left_whole():
    s = state(3, [10, 20])
    prompts, cuts = fitted_prompts(Echo(1000), QA(), [s], False, Sampling(max_new_tokens=8))
    assert prompts == [TokenPrompt(QA().prompt(s).split(), QA().prompt(s))] and cuts == [0]
    # a generator whose context is unknown (the teacher, an API model) is not measured
    prompts, cuts = fitted_prompts(SimpleNamespace(), QA(), [state(3, [5000])], False, Sampling())
    assert cuts == [0] and words(prompts[0]) > 5000


def test_passages_are_cut_to_the_most_words_that_fit_and_the_question_is_kept():
    s = state(5, [10, 400, 300])
    whole = words(QA().prompt(s))
    budget = 120
    prompts, cuts = fitted_prompts(Echo(budget + 8), QA(), [s], False, Sampling(max_new_tokens=8))
    (given,) = prompts
    prompt = given.text
    assert given.ids == prompt.split()  # the ids of the text it stands for, measured once
    assert cuts == [1] and words(prompt) <= budget < whole
    assert "\nQuestion: " + s.question + "\n" in prompt  # the question whole
    # the most that fits: each passage cut to w words (the 10-word one whole), and w + 1 would not fit
    cut = [line for line in prompt.splitlines() if line.startswith("T")]
    w = len(cut[1].split()) - 1
    assert len(cut[0].split()) == 11 and len(cut[2].split()) - 1 == w and 10 < w < 300
    assert words(QA().prompt(with_passages_cut(s, w + 1))) > budget
    assert s.turns[0].passages[1].text.count("w") == 400  # the state itself is not touched


def test_a_prompt_that_cannot_fit_is_refused_as_a_scored_failure_and_counted():
    long_question = state(500, [50])
    short = state(3, [50])
    echo = Echo(100)
    completions = generate(
        Env([], None, echo), DAPOTagged(), [long_question, short], Sampling(max_new_tokens=8)
    )
    assert len(echo.prompts) == 1 and words(as_text(echo.prompts[0])) <= 92  # only the one that fits
    refused, answered = completions
    assert (refused.text, refused.finish_reason, refused.prompt_cut) == ("", TOO_LONG, 1)
    assert (answered.text, answered.prompt_cut) == ("<answer> ok </answer>", 0)
    from rag_lab.env import Episode

    episode = Episode("q", long_question.question)
    step = record(episode, refused, DAPOTagged().parse(refused.text))
    assert step.error == TOO_LONG_ERROR and episode.prompt_cuts == 1
    assert episode.to_record()["prompt_cuts"] == 1


def test_an_agent_run_counts_its_cut_prompts_in_the_records():
    example = QAExample("q1", " ".join(["why"] * 200), ("ok",))
    (episode,) = run_agent(DAPOTagged(), [example], Env([], None, Echo(150)), Sampling(max_new_tokens=8))
    assert episode.format_failure and episode.stop_reason == "format_error"
    assert episode.steps[0].error == TOO_LONG_ERROR and episode.to_record()["prompt_cuts"] == 1
    (fine,) = run_agent(
        DAPOTagged(), [QAExample("q2", "why?", ("ok",))], Env([], None, Echo(150)), Sampling()
    )
    assert fine.prediction == "ok" and fine.to_record()["prompt_cuts"] == 0


def test_a_continued_rollout_keeps_its_ids_and_only_its_new_block_is_cut():
    protocol, budget = DAPOTagged(), 60
    earlier = [Passage("e", "Early", " ".join(f"e{j}" for j in range(30)))]
    new = [Passage("n", "New", " ".join(f"n{j}" for j in range(80)))]
    s = State("why?", [Turn(Action(SEARCH, query="a"), earlier), Turn(Action(SEARCH, query="b"), new)])
    stream = [f"s{j}" for j in range(40)]  # the ids so far: never tokenized again, whatever they hold
    (given,), cuts = fitted_prompts(
        Echo(budget + 8), protocol, [s], False, Sampling(max_new_tokens=8), [stream]
    )
    block = given.ids[len(stream) :]
    assert cuts == [1] and given.ids[: len(stream)] == stream and len(given.ids) <= budget
    # the new block's passage cut to the most words that fit (one more would not), its text kept in the state
    kept = len(s.turns[1].passages[0].text.split())
    assert block == protocol.information(s.turns[1]).split() and 0 < kept < 80
    longer = Turn(Action(SEARCH), [Passage("n", "New", " ".join(f"n{j}" for j in range(kept + 1)))])
    assert len(stream) + len(protocol.information(longer).split()) > budget
    assert s.turns[0].passages == earlier  # what the model already read stays as it was
    assert given.text == protocol.prompt(s)
    # a block that does not fit even with its passages cut to their titles: refused, counted
    full = State("why?", [Turn(Action(SEARCH, query="b"), new)])
    prompts, cuts = fitted_prompts(
        Echo(budget + 8), protocol, [full], False, Sampling(max_new_tokens=8), [["s"] * (budget - 2)]
    )
    assert prompts == [None] and cuts == [1]
