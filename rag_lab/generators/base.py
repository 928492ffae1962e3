"""The generator contract shared by the hf, vllm, openai, tiny and teacher backends.

Token in, token out: a prompt may be given as the token ids the model reads (:class:`TokenPrompt`), which a
backend that tokenizes feeds the model as they are (never rendered and tokenized again). The engine gives
its prompts so where the generator has a tokenizer (:mod:`rag_lab.env.engine`), so that a multi-turn
rollout's history, the policy's sampled ids and the environment's text tokenized once, is what the model
reads at the next turn and what a trainer trains on (a BPE merge across a turn boundary would otherwise
change the ids). Backends that read text (the world teacher, an OpenAI-compatible endpoint) read the
text the ids stand for.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# A prompt is plain text or a chat (a list of {"role", "content"} messages).
Prompt = str | list[dict[str, str]]


@dataclass(frozen=True)
class TokenPrompt:
    """A prompt as token ids (``ids``: what the model reads, special tokens included where the chat template
    puts them), with ``text``, the prompt they stand for (what a backend that reads text gets)."""

    ids: list[int]
    text: Prompt


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
    # The token ids the model was given (a TokenPrompt's, with any prefix written for the model: the
    # engine's record, rag_lab.env.engine.generate); empty where the generator reads text.
    prompt_ids: list[int] = field(default_factory=list)


class Generator(Protocol):
    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt, in prompt order, in one batched call."""
        ...


@runtime_checkable
class VLLMBacked(Protocol):
    """A run's generator on a vLLM engine (generator=vllm, :class:`rag_lab.generators.vllm.VLLMGenerator`).
    A trained method trains a transformers copy of its model, rolls out on TRL's vLLM integration and
    evaluates on an engine of the trained weights."""

    def trainable(self) -> Any:
        """A transformers generator on the same weights and tokenizer: what the method trains."""
        ...

    def with_weights(self, path: str) -> Any:
        """These settings on other weights (the trained model's folder): what the run evaluates with."""
        ...

    def trl_settings(self) -> dict[str, Any]:
        """TRL's ``GRPOConfig`` keys (``use_vllm`` ...): TRL's trainer rolls out (DAPO, APEX's planner)."""
        ...

    def backend_settings(self) -> dict[str, Any]:
        """The keys of TRL's ``VLLMGeneration``, where a loop TRL does not run builds it (R3-RAG, EVO-RAG)."""
        ...


def vllm_backed(generator: Any) -> VLLMBacked | None:
    """``generator`` where it is on a vLLM engine (:class:`VLLMBacked`), else None (a method trains and rolls
    out with the transformers model itself): the one place a method asks. Before anything is built, a
    config's generator class is asked with ``issubclass(cls, VLLMBacked)``."""
    return generator if isinstance(generator, VLLMBacked) else None


def as_text(prompt: Prompt | TokenPrompt) -> Prompt:
    """The text or chat a prompt stands for (a :class:`TokenPrompt`'s ``text``)."""
    return prompt.text if isinstance(prompt, TokenPrompt) else prompt


def text_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """``texts`` tokenized, each alone, with no special tokens added (what a chat template writes stays)."""
    return tokenizer(list(texts), add_special_tokens=False).input_ids if texts else []


def prompt_ids(tokenizer, prompts: Sequence[Prompt | TokenPrompt]) -> list[list[int]]:
    """The ids the model reads for each prompt: a :class:`TokenPrompt`'s as given, any other rendered
    (:func:`render`) and tokenized, all of those in one call."""
    texts = [render(tokenizer, p) for p in prompts if not isinstance(p, TokenPrompt)]
    tokenized = iter(text_ids(tokenizer, texts))
    return [list(p.ids) if isinstance(p, TokenPrompt) else next(tokenized) for p in prompts]


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
