"""The hf backend on a tiny random Qwen2 with a word-level tokenizer, both built here."""

import pytest
import torch

from rag_lab.generators.base import Sampling, render
from rag_lab.generators.hf import HFGenerator


@pytest.fixture(scope="module")
def gen(tiny_lm):
    return HFGenerator(tiny_lm, tokenizer=f"{tiny_lm}/tokenizer", batch_size=2)


PROMPTS = ["Q : where was ada born", "Q : paris", "Q : where was ada born city london paris"]


def test_greedy_is_deterministic_and_batch_independent(gen):
    greedy = Sampling(max_new_tokens=8)
    batched = gen.generate(PROMPTS, greedy)
    alone = [gen.generate([p], greedy)[0] for p in PROMPTS]
    assert [c[0].text for c in batched] == [c[0].text for c in alone]
    assert [c[0].token_ids for c in gen.generate(PROMPTS, greedy)] == [c[0].token_ids for c in batched]


def test_n_samples_seeded(gen):
    sampling = Sampling(n=4, temperature=1.0, max_new_tokens=6, seed=3)
    first, again = gen.generate(PROMPTS[:2], sampling), gen.generate(PROMPTS[:2], sampling)
    assert [len(c) for c in first] == [4, 4]
    assert [[x.token_ids for x in c] for c in first] == [[x.token_ids for x in c] for c in again]
    assert len({tuple(x.token_ids) for x in first[0]}) > 1  # samples differ


def test_logprobs_equal_a_forward_pass(gen):
    (completion,) = gen.generate(
        ["Q : where was ada born"], Sampling(n=1, temperature=1.0, max_new_tokens=6, seed=1)
    )[0]
    prompt_ids = gen.tokenizer("Q : where was ada born", add_special_tokens=False).input_ids
    ids = torch.tensor([prompt_ids + completion.token_ids], device=gen.model.device)
    with torch.no_grad():
        logits = gen.model(ids).logits[0, len(prompt_ids) - 1 : -1].float().cpu()
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
    assert completion.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_stop_strings_cut_the_text_exactly(gen):
    # A seeded sample with a word that first occurs after a few words: it becomes the stop string
    # (same seed: the same sample up to the stop).
    for seed in range(50):
        sampling = Sampling(temperature=1.0, seed=seed, max_new_tokens=12)
        (full,) = gen.generate(["Q : paris"], sampling)[0]
        words = full.text.split()
        stop = next((w for i, w in enumerate(words) if i >= 2 and w not in words[:i]), None)
        if stop:
            break
    (cut,) = gen.generate(["Q : paris"], Sampling(**{**sampling.__dict__, "stop": (stop,)}))[0]
    position = full.text.find(stop)
    assert position > 0 and cut.text == full.text[:position] and cut.finish_reason == "stop"
    (kept,) = gen.generate(
        ["Q : paris"], Sampling(**{**sampling.__dict__, "stop": (stop,), "include_stop": True})
    )[0]
    assert kept.text == full.text[: position + len(stop)]
    assert gen.tokenizer.decode(kept.token_ids).endswith(stop)
    assert len(kept.logprobs) == len(kept.token_ids)


def test_chat_prompts_use_the_chat_template(gen):
    chat = [{"role": "user", "content": "where was ada born"}]
    assert render(gen.tokenizer, chat) == "user : where was ada born assistant : "
    greedy = Sampling(max_new_tokens=5)
    text = render(gen.tokenizer, chat)
    assert gen.generate([chat], greedy)[0][0].text == gen.generate([text], greedy)[0][0].text
    assert gen.chat  # the tokenizer has a template: policies send chat messages


def test_a_trailing_assistant_message_is_continued(gen):
    partial = [{"role": "user", "content": "where was ada born"}]
    partial.append({"role": "assistant", "content": "<search>"})
    assert render(gen.tokenizer, partial) == "user : where was ada born assistant : <search>"


def test_length_finish_reason(gen):
    (c,) = gen.generate(["Q : paris"], Sampling(max_new_tokens=3))[0]
    assert c.finish_reason in ("length", "stop") and len(c.token_ids) <= 3


def test_decoding_ends_at_the_token_that_completes_a_stop_string(gen):
    """The stop check reads each row's last tokens only: a stop string of two words (several tokens) still
    ends decoding at the token completing it (one forward pass per token after the prefill)."""
    for seed in range(50):
        sampling = Sampling(temperature=1.0, seed=seed, max_new_tokens=12)
        (full,) = gen.generate(["Q : paris"], sampling)[0]
        words = full.text.split()
        pairs = [" ".join(words[i : i + 2]) for i in range(2, len(words) - 2)]
        stop = next((p for p in pairs if full.text.count(p) == 1), None)
        if stop:
            break
    calls = []
    hook = gen.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        (kept,) = gen.generate(
            ["Q : paris"], Sampling(**{**sampling.__dict__, "stop": (stop,), "include_stop": True})
        )[0]
    finally:
        hook.remove()
    assert kept.text.endswith(stop) and len(kept.token_ids) < len(full.token_ids)
    assert len(calls) == len(kept.token_ids)
