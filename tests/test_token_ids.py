"""Token in, token out (issue 72, finding 11), with a real BPE tokenizer, SmolLM2's: over every method's
protocol the ids a trainer trains on are the ids the model was given and sampled, never its text tokenized
again, and each loss mask is exactly the policy's tokens.

The model is scripted (:class:`Scripted`: ``generator=hf``'s own generate and completion code around a model
that emits chosen ids), so no weights load; the tokenizer alone is read from the packaged GGUF file once.
Its turns are chosen so that their text tokenizes to OTHER ids: a word sampled in two pieces that BPE merges
(``ĠPar`` ``is`` → ``ĠParis``), and a turn that opens with spaces right after the information block's closing
newline (``Ċ`` | ``Ġ`` → ``ĊĠ``: a merge across the turn boundary); the first test shows both. A rollout that
tokenizes its text again trains on ids its model never read (each test but the first, and those of R3-RAG
and APEX, which were already exact on this path, was seen failing on the code before this change).

Each method's own path from episodes to training rows runs: DAPO's ``encode`` (TRL's GRPO rows with
``env_mask``), R3-RAG's per-step PPO samples and their mask, EVO-RAG's branches to TRL's DPO rows and its
collator's mask, APEX's planner prompts as TRL's GRPO tokenizes them and its executor's SFT rows, the cold
start's SFT rows of a continued DAPO rollout, Stop-RAG's episodes (its generator is a black box and its
Q-network reads the state's text: no token-level loss trains on them, but the ids are kept all the same).
"""

from types import SimpleNamespace

import pytest

from rag_lab.data.base import Corpus, QAExample
from rag_lab.env import Env
from rag_lab.env.engine import generate
from rag_lab.env.protocols.apex import APEXExecute, APEXPlan
from rag_lab.env.protocols.base import SEARCH, Action, State, Turn
from rag_lab.env.protocols.evorag import EVORAGStep
from rag_lab.env.protocols.r3rag import R3RAGStep
from rag_lab.env.protocols.tagged import DAPOTagged
from rag_lab.generators.base import Sampling, render
from rag_lab.generators.decode import Decoded
from rag_lab.generators.hf import HFGenerator
from rag_lab.retrievers.base import Hit

QUESTION = QAExample("q1", "Where was Ada born?", ("Paris",))
CORPUS = Corpus(["p1"], ["Ada"], ["Ada Lovelace was born in Paris."])


@pytest.fixture(scope="module")
def tok():
    from rag_lab.generators.smollm2 import gguf_tokenizer

    return gguf_tokenizer()


def ids(tok, *pieces) -> list[int]:
    """Each piece tokenized alone (a string) or given as token names (a list), joined."""
    out = []
    for piece in pieces:
        out += (
            tok.convert_tokens_to_ids(piece)
            if isinstance(piece, list)
            else tok(piece, add_special_tokens=False).input_ids
        )
    return out


def retokenized(tok, token_ids: list[int]) -> list[int]:
    return tok(tok.decode(token_ids), add_special_tokens=False).input_ids


class Scripted(HFGenerator):
    """``generator=hf`` (its generate: prompt ids, order, the cut at a stop string) around a scripted model:
    each prompt gets ``script(its decoded text)``'s ids; ``calls`` keeps (the ids given, the ids emitted)."""

    def __init__(self, tokenizer, script, chat: bool = True):
        self.tokenizer, self.script, self.chat, self.context_length = tokenizer, script, chat, 2048
        # no weights (_decode is scripted): a stand-in the generator's model property returns as it is
        self.model, self.batch_size, self.seed, self.want_logprobs = SimpleNamespace(), 64, 0, True
        self.calls: list[tuple[list[int], list[int]]] = []

    def _decode(self, prompts, sampling):
        out = []
        for given in prompts:
            emitted = self.script(self.tokenizer.decode(given))
            self.calls.append((list(given), emitted))
            out += [Decoded(list(emitted), [-0.5] * len(emitted)) for _ in range(sampling.n)]
        return out


class Fixed:
    """A retriever that finds p1 for any query."""

    def search(self, queries, k, exclude=None):
        return [[Hit("p1", 1.0)] for _ in queries]


def env_of(generator) -> Env:
    return Env(CORPUS, Fixed(), generator)


def spans(length: int, *ranges: tuple[int, int]) -> list[int]:
    """A mask of ``length``: 1 on each [start, end) of ``ranges``, 0 elsewhere."""
    mask = [0] * length
    for start, end in ranges:
        mask[start:end] = [1] * (end - start)
    return mask


# ---- DAPO: one growing rollout, TRL's GRPO rows -----------------------------------------------------------


def dapo_turns(tok) -> list[list[int]]:
    """Three tagged turns: a search whose query word is sampled in two pieces, a second search whose turn
    opens with two spaces (merged with the block's newline when re-tokenized), the answer."""
    return [
        ids(tok, "<think>Where was Ada born?</think>\n<search>Ada born in", ["ĠPar", "is"], "</search>"),
        ids(tok, "  <reflect>Paris.</reflect>\n<search>Ada Lovelace</search>"),
        ids(tok, "<reflect>Paris.</reflect>\n<answer>Paris</answer>"),
    ]


def test_the_scripted_turns_tokenize_to_other_ids(tok):
    first, second, _ = dapo_turns(tok)
    assert retokenized(tok, first) != first  # ĠPar is → ĠParis, within the policy's own turn
    block = ids(tok, DAPOTagged().information(Turn(Action(SEARCH), [CORPUS.get("p1")])))
    assert retokenized(tok, block) == block and retokenized(tok, second) == second  # each alone: canonical
    joined = block + second
    assert retokenized(tok, joined) != joined  # ... but Ċ | Ġ merge across the boundary into ĊĠ
    assert "ĊĠ" in tok.convert_ids_to_tokens(retokenized(tok, joined))


def test_dapo_trains_on_the_ids_each_turn_was_given_and_sampled(tok):
    from rag_lab.policies.dapo.rollout import SearchRollouts

    turns = dapo_turns(tok)
    model = Scripted(tok, lambda text: turns[text.count("<information>\n")])  # blocks so far
    rollouts = SearchRollouts(
        env_of(model), model, [QUESTION], [], k=1, max_turns=4, dynamic_sampling=False, max_rounds=1, seed=0,
        sampling=Sampling(temperature=1.0, max_new_tokens=64),
    )  # fmt: skip
    row = {k: v[0] for k, v in rollouts.encode(rollouts.play([QUESTION], group=1, step=0)).items()}
    (g1, e1), (g2, e2), (g3, e3) = model.calls
    block = ids(tok, DAPOTagged().information(Turn(Action(SEARCH), [CORPUS.get("p1")])))
    # the history is never tokenized again: each turn is given the last one's ids, its samples, the block
    assert (e1, e2, e3) == tuple(turns) and g2 == g1 + e1 + block and g3 == g2 + e2 + block
    # the row is exactly what the model read and wrote; the mask is 1 on its three turns only
    assert row["prompt_ids"] == g1 and row["prompt_ids"] + row["completion_ids"] == g3 + e3
    n1, n2 = len(e1) + len(block), len(e1) + len(block) + len(e2) + len(block)
    assert row["env_mask"] == spans(
        len(row["completion_ids"]), (0, len(e1)), (n1, n1 + len(e2)), (n2, n2 + len(e3))
    )
    assert row["logprobs"] == [-0.5 if m else 0.0 for m in row["env_mask"]]
    assert retokenized(tok, g3 + e3) != g3 + e3  # the rollout's text would have trained on other ids


# ---- R3-RAG: per-step PPO samples --------------------------------------------------------------------


def r3rag_samples(live, env, protocol, traces, sampling):
    """R3-RAG's samples of played episodes (its trainer's call)."""
    from rag_lab.policies.r3rag.samples import step_samples

    return step_samples(live)


def test_r3rag_samples_are_each_steps_ids_as_given_and_sampled_and_mask_only_the_step(tok):
    from rag_lab.policies.r3rag.samples import rollouts, tensors

    end = ["<|im_end|>"]
    steps = [
        ids(
            tok,
            "The problem analysis: Ada's birthplace.\nThe retrieval query: Ada born in",
            ["ĠPar", "is"],
            end,
        ),
        ids(tok, "The problem analysis: found.\nThe final answer:", ["ĠPar", "is"], end),
    ]
    model = Scripted(tok, lambda text: steps[text.count("The retrieval documents:")])
    env, protocol, sampling = env_of(model), R3RAGStep(), Sampling(max_new_tokens=64)
    _, live, traces = rollouts(protocol, env, [QUESTION], (0.0,), sampling, k=1, max_turns=3)
    samples = r3rag_samples(live, env, protocol, traces, sampling)
    assert [(s.prompt_ids, s.completion_ids) for s in samples] == model.calls  # as given, as sampled
    batch = tensors(samples, tok.pad_token_id)
    for r, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        assert batch["input_ids"][r, : p + c].tolist() == s.prompt_ids + s.completion_ids
        # position j predicts token j + 1: the loss is on exactly the positions that predict the step
        assert batch["mask"][r].tolist() == spans(batch["mask"].shape[1], (p - 1, p + c - 1))
    assert retokenized(tok, samples[0].completion_ids) != samples[0].completion_ids


# ---- EVO-RAG: branches to DPO rows ------------------------------------------------------------------------


def evorag_dataset(tok, env, protocol, base, nodes, sampling):
    """EVO-RAG's DPO dataset of branched nodes as TRL's trainer prepares it (every pair, margin 0)."""
    from datasets import Dataset

    from rag_lab.policies.evorag import branches as br
    from rag_lab.policies.evorag.dpo import dpo_rows, trainer_class

    branches = [
        br.node_branches(n, base[n.index], 0.0, [1.0 + i for i in range(len(n.siblings))], tok) for n in nodes
    ]
    rows = dpo_rows([n.prompt_ids for n in nodes], br.pairs_of(branches, 0.0, None))
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    return trainer_class()._prepare_dataset(
        SimpleNamespace(_tokenizer=tok), Dataset.from_list(rows), tok, args, "train"
    )


def test_evorag_dpo_rows_are_the_node_prompt_and_each_action_as_given_and_sampled(tok):
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from rag_lab.policies.evorag import branches as br

    end = ["<|im_end|>"]
    wrote = {  # what the policy writes after each prompt: its own step, or the forced action word's rest
        "base": ids(tok, "SEARCH: Ada born in", ["ĠPar", "is"], end),
        "SEARCH:": ids(tok, ["ĠAd", "a"], end),  # " Ada" in two pieces
        "ANSWER:": ids(tok, ["ĠPar", "is"], end),
    }

    def script(text: str) -> list[int]:
        return next((v for k, v in wrote.items() if text.endswith(k)), wrote["base"])

    model = Scripted(tok, script)
    env, protocol, sampling = env_of(model), EVORAGStep(), Sampling(max_new_tokens=32)
    base, traces = br.base_rollouts(protocol, env, [QUESTION], sampling, 1, 1)
    counts = {"prompt_too_long": 0, "noop_backtracks": 0, "branches": 0}
    nodes = br.visited(base, traces, None, "s", counts)
    br.roll(protocol, env, nodes, br.ACTIONS, sampling, 1, 1, counts)
    given = {tuple(g): e for g, e in model.calls}
    (node_prompt, _), *_ = model.calls  # the base step's prompt: the node's
    action = {  # each action as the ids the policy was given past the node's prompt, then sampled
        "search": wrote["base"],
        "answer": ids(tok, "ANSWER:") + wrote["ANSWER:"],
        "refuse": ids(tok, "REFUSE") + [tok.eos_token_id],  # written for it: the word, then its end of turn
    }
    assert given[tuple(node_prompt + ids(tok, "ANSWER:"))] == wrote["ANSWER:"]  # the model read those ids
    dataset = evorag_dataset(tok, env, protocol, base, nodes, sampling)
    assert len(dataset) == 3  # search > answer > refuse (returns 1, 2, 3 in sibling order: answer, refuse)
    collate = DataCollatorForPreference(pad_token_id=tok.pad_token_id)
    kinds = {tuple(v): k for k, v in action.items()}
    for row in dataset:
        assert row["prompt_ids"] == node_prompt
        assert tuple(row["chosen_ids"]) in kinds and tuple(row["rejected_ids"]) in kinds
        batch = collate.torch_call([row])
        p = len(node_prompt)
        for side, at in (("chosen_ids", 0), ("rejected_ids", 1)):
            n = len(row[side])
            assert batch["input_ids"][at, : p + n].tolist() == node_prompt + row[side]
            assert batch["completion_mask"][at].tolist() == spans(
                batch["completion_mask"].shape[1], (p, p + n)
            )
    assert retokenized(tok, action["answer"]) != action["answer"]


# ---- APEX: the planner's GRPO prompts, the executor's SFT rows ----------------------------------------


def test_apex_planner_trains_on_the_prompt_ids_its_plans_are_sampled_from(tok):
    """TRL's GRPO tokenizes the planner's prompts itself and trains on the plans it samples from them (one
    turn: its own sampled ids, masked to their end by TRL); those prompt ids are the ones the engine gives
    the planner at inference."""
    from trl import GRPOTrainer

    from rag_lab.data.base import SubQuestion
    from rag_lab.policies.apex.planner import PlannerRL, planner_rows

    model = Scripted(tok, lambda text: ids(tok, "1. Who is Ada?", ["<|im_end|>"]))
    generate(env_of(model), APEXPlan(), [State(QUESTION.question)], Sampling(max_new_tokens=32))
    ((given, _),) = model.calls
    planned = QAExample(
        "q1", QUESTION.question, ("Paris",), decomposition=(SubQuestion("Who is Ada?", "Ada"),)
    )
    (row,) = planner_rows(model, [planned], PlannerRL(), chat=True)
    trl = SimpleNamespace(processing_class=tok, tools=None, chat_template=None, chat_template_kwargs={},
                          _is_vlm=False, environment_factories=None)  # fmt: skip
    trained, _, _ = GRPOTrainer._tokenize_prompts(trl, [row["prompt"]])
    assert list(trained[0]) == given


def sft_of(tok, pairs):
    """The cold start's SFT rows of (prompt, completion) pairs (its ``sft``'s)."""
    from rag_lab.train.sft import sft_rows

    return sft_rows(pairs, tok, max_length=1024)


def assert_sft_row(row, given: list[int], completion: list[int], eos: int) -> None:
    """An SFT row: the prompt as the engine gave it, then the completion and its EOS, the loss on those."""
    assert row["input_ids"] == given + completion + [eos]
    assert row["completion_mask"] == spans(len(row["input_ids"]), (len(given), len(row["input_ids"])))


def test_apex_executor_sft_rows_are_the_prompt_the_executor_is_given(tok):
    state = State(QUESTION.question, focus="Where was Ada born?", notes=[("Who is Ada?", "Ada Lovelace")])
    state.turns.append(Turn(Action(SEARCH, query="Ada birthplace"), [CORPUS.get("p1")]))
    completion = "ANSWER: Paris"
    model = Scripted(tok, lambda text: ids(tok, completion, ["<|im_end|>"]))
    generate(env_of(model), APEXExecute(), [state], Sampling(max_new_tokens=32))
    ((given, _),) = model.calls
    (row,) = sft_of(tok, [(APEXExecute().prompt(state, True), completion)])
    assert_sft_row(row, given, ids(tok, completion), tok.eos_token_id)


def test_cold_start_sft_rows_of_a_continued_rollout_are_the_ids_the_engine_gives(tok):
    """A demonstration of DAPO's third turn: SFT trains on the ids the engine gives the model once it wrote
    the first two turns as SFT teaches them (each turn's text tokenized alone), not the whole text tokenized
    (whose block newline and second turn's spaces merge)."""
    texts = ["<think>Where was Ada born?</think>\n<search>Ada</search>",
             "  <reflect>Paris.</reflect>\n<search>Ada Lovelace</search>",
             "<reflect>Paris.</reflect>\n<answer>Paris</answer>"]  # fmt: skip
    model = Scripted(tok, lambda text: ids(tok, texts[text.count("<information>\n")]))
    from rag_lab.env.engine import run_agent

    (episode,) = run_agent(DAPOTagged(), [QUESTION], env_of(model), Sampling(max_new_tokens=64), k=1)
    assert episode.prediction == "Paris" and len(model.calls) == 3
    given = model.calls[2][0]
    block = ids(tok, DAPOTagged().information(Turn(Action(SEARCH), [CORPUS.get("p1")])))
    first = ids(tok, render(tok, DAPOTagged().prompt(State(QUESTION.question), True)))
    assert given == first + ids(tok, texts[0]) + block + ids(tok, texts[1]) + block  # each piece alone
    turns = [Turn(Action(SEARCH), [CORPUS.get("p1")], text=t) for t in texts[:2]]
    demonstration = DAPOTagged().prompt(State(QUESTION.question, turns), True)
    (row,) = sft_of(tok, [(demonstration, texts[2])])
    assert_sft_row(row, given, ids(tok, texts[2]), tok.eos_token_id)
    whole = ids(tok, render(tok, demonstration))
    assert whole != given  # the demonstration's text tokenized whole: Ċ | ĠĠ merged, a context never read


# ---- Stop-RAG: a black box's episodes keep their ids ----------------------------------------------------


def test_stoprag_episodes_keep_the_ids_of_each_generation(tok):
    from rag_lab.policies.stoprag.pipeline import IterativePipeline

    def script(text: str) -> list[int]:
        if "Wikipedia snippet, generate an answer" in text:  # the intermediate answer (counted, not a step)
            return ids(tok, "Paris\n")
        if "Final answer to the main question:" in text:
            return ids(tok, ["Par", "is"], "\n")
        return ids(tok, "Where was Ada", ["Ġbor", "n"], "?\n")

    model = Scripted(tok, script)
    (episode,) = IterativePipeline(iterations=2).rollout(env_of(model), [QUESTION])
    steps = [(s.prompt_ids, s.token_ids) for s in episode.steps]
    recorded = [c for c in model.calls if not c[1] == ids(tok, "Paris\n")]  # the queries and the final answer
    assert len(steps) == 3 and steps == recorded
    assert episode.prediction == "Paris" and retokenized(tok, steps[0][1]) != steps[0][1]
