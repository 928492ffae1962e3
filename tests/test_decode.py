"""The batched decoding loop (rag_lab/generators/decode.py) on the tiny random Qwen2 of conftest."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rag_lab.generators.base import Sampling
from rag_lab.generators.decode import MAX_PADDING, _choose, decode, prefill_groups


@pytest.fixture(scope="module")
def model_and_ids(tiny_lm):
    tok = AutoTokenizer.from_pretrained(f"{tiny_lm}/tokenizer")
    model = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()
    texts = ["Q : where was ada born", "Q : paris", "Q : where was ada born city london paris", "Q : ada"]
    return model, [tok(t, add_special_tokens=False).input_ids for t in texts]


def test_groups_cover_every_prompt_once_within_budget_and_padding():
    lengths = [3, 40, 41, 500, 7, 7, 8, 39, 120, 2, 2000]
    groups = prefill_groups(lengths, budget=256)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        longest, real = max(lengths[i] for i in g), sum(lengths[i] for i in g)
        assert len(g) == 1 or (longest * len(g) <= 256 and longest * len(g) - real <= MAX_PADDING * real)
    assert [2000] in [[lengths[i] for i in g] for g in groups]  # too long for the budget: alone


def test_greedy_equals_transformers_generate_prompt_by_prompt(model_and_ids):
    model, prompts = model_and_ids
    ours = decode(model, prompts, Sampling(max_new_tokens=10), pad_id=0, end_ids={1}, logprobs=False)
    for p, row in zip(prompts, ours, strict=True):
        ids = torch.tensor([p])
        ref = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=10,
            eos_token_id=1,
            pad_token_id=0,
        )[0, len(p) :].tolist()
        assert row.tokens == ref[: len(row.tokens)] and len(row.tokens) == len(ref)


class RowCounter:
    """Wraps the model; records how many rows each forward pass reads."""

    def __init__(self, model):
        self.model, self.rows = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, **kwargs):
        self.rows.append(kwargs["input_ids"].shape[0])
        return self.model(**kwargs)


def test_finished_rows_leave_the_batch(model_and_ids):
    model, prompts = model_and_ids
    greedy = Sampling(max_new_tokens=12)
    free = decode(model, prompts, greedy, pad_id=0, end_ids={1}, logprobs=False)
    # row i stops after i + 2 tokens (a stop rule seeing its own tokens), so rows leave one by one
    ends = {tuple(row.tokens[: i + 2]) for i, row in enumerate(free)}
    counter = RowCounter(model)
    out = decode(
        counter, prompts, greedy, pad_id=0, end_ids={1}, stopped=lambda rows: [tuple(t) in ends for t in rows]
    )
    lengths = [len(r.tokens) for r in out]
    assert len(set(lengths)) > 2 and max(lengths) <= 5  # (rows whose prefixes coincide stop together)
    decoding = counter.rows[len(prefill_groups([len(p) for p in prompts])) :]
    # after token t, the batch holds exactly the rows that go on past it
    assert decoding == [sum(n > t for n in lengths) for t in range(1, max(lengths))]


def test_n_samples_read_each_prompt_once(model_and_ids):
    model, prompts = model_and_ids
    counter = RowCounter(model)
    out = decode(counter, prompts, Sampling(n=3, temperature=1.0, max_new_tokens=4), pad_id=0, end_ids={1})
    assert len(out) == 3 * len(prompts)
    groups = len(prefill_groups([len(p) for p in prompts]))
    assert sum(counter.rows[:groups]) == len(prompts) and counter.rows[groups] <= 3 * len(prompts)


def test_top_p_keeps_the_nucleus_only():
    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]]).repeat(2000, 1)
    torch.manual_seed(0)
    picked = _choose(logits, Sampling(temperature=1.0, top_p=0.5))
    assert set(picked.tolist()) == {0}  # the first token alone holds 0.71 of the mass
    picked = _choose(logits, Sampling(temperature=1.0, top_p=0.9))
    assert set(picked.tolist()) == {0, 1}


def test_logprobs_of_every_row_equal_a_forward_pass_over_it_alone(model_and_ids):
    """Rows of different lengths, prefilled in groups, stacked, trimmed and dropped: each row's log-probs
    are still those of one forward pass over its prompt + completion (positions, masks, cache order)."""
    model, prompts = model_and_ids
    torch.manual_seed(0)
    sampling = Sampling(n=2, temperature=1.0, max_new_tokens=8)
    out = decode(
        model,
        prompts,
        sampling,
        pad_id=0,
        end_ids={1},
        stopped=lambda rows: [len(t) >= 3 and t[-1] % 3 == 0 for t in rows],
    )
    assert len({len(r.tokens) for r in out}) > 1
    for k, row in enumerate(out):
        prompt = prompts[k // 2]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + row.tokens])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(row.tokens)[:, None])[:, 0]
        assert row.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
