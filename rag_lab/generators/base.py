"""The generator contract shared by the hf, vllm, openai, tiny and teacher backends."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

# A prompt is plain text or a chat (a list of {"role", "content"} messages).
Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    # 0 means greedy.
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    # Keep the matched stop string at the end of the text (protocols that pause at `</search>`).
    include_stop: bool = False
    seed: int | None = None


@dataclass
class Completion:
    text: str
    token_ids: list[int] = field(default_factory=list)
    # "stop" (a stop string or EOS), "length" (max_new_tokens reached)
    finish_reason: str = "stop"
    # Per-token log-probs of token_ids under the sampling model (trainable backends only).
    logprobs: list[float] | None = None
    # Length of the rendered prompt in tokens (0 where the backend does not tokenise).
    prompt_tokens: int = 0
    # 1 when the prompt was cut to fit the model (rag_lab.env.fit), else 0.
    prompt_cut: int = 0


class Generator(Protocol):
    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt, in prompt order, in one batched call."""
        ...


def render(tokenizer, prompt: Prompt) -> str:
    """A chat prompt through the tokenizer's chat template (assistant turn opened, or a trailing
    partial assistant message continued: multi-turn rollouts); a text prompt as it is."""
    if isinstance(prompt, str):
        return prompt
    if not tokenizer.chat_template:
        raise ValueError("a chat prompt needs a tokenizer with a chat template")
    partial = prompt[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        list(prompt), tokenize=False, add_generation_prompt=not partial, continue_final_message=partial
    )


def cut_at_stop(text: str, sampling: Sampling) -> tuple[str, int | None]:
    """``text`` cut at its first stop string (kept when ``sampling.include_stop``), and the number of
    characters through the end of that stop (None when no stop string occurs)."""
    cut = min(((text.find(s), s) for s in sampling.stop if s in text), default=None)
    if cut is None:
        return text, None
    position, stop = cut
    return text[: position + (len(stop) if sampling.include_stop else 0)], position + len(stop)
