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


class Generator(Protocol):
    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt, in prompt order, in one batched call."""
        ...
