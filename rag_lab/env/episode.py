"""What one question's rollout leaves behind: an ``Episode`` of ``Step``s."""

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

IN_MEMORY = ("prompt_ids", "token_ids", "logprobs")


@dataclass
class Step:
    # The policy's generated text for this turn ("" for LM-free policies).
    text: str = ""
    # The parsed action: "search", "answer", "stop", "backtrack", "refuse", ...
    action: str = ""
    query: str | None = None
    retrieved_ids: list[str] = field(default_factory=list)
    # The intermediate answer of pipelines that answer each follow-up (Stop-RAG, APEX).
    answer: str | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    # Why the text broke the protocol's format (the step that ended the episode).
    error: str = ""
    # The token ids the model was given for this step (its whole context: for a continued rollout, every
    # earlier turn and the environment's blocks; a prefix written for the model included), the policy's own
    # tokens as sampled (never the environment's text) and their log-probs: what trainers train on, never
    # a re-tokenization (rag_lab.env.engine). Empty where the generator reads text (the world teacher, an
    # API model) or the prompt did not fit. Kept in memory, not written to records.jsonl.
    prompt_ids: list[int] = field(default_factory=list, repr=False)
    token_ids: list[int] = field(default_factory=list, repr=False)
    logprobs: list[float] | None = field(default=None, repr=False)


@dataclass
class Episode:
    question_id: str
    question: str
    steps: list[Step] = field(default_factory=list)
    prediction: str = ""
    # Why the episode ended: "answer", "stop", "max_steps", "format_error", ...
    stop_reason: str = ""
    format_failure: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # How many of the episode's prompts were cut to fit the model (rag_lab.env.fit).
    prompt_cuts: int = 0

    @property
    def queries(self) -> list[str]:
        return [s.query for s in self.steps if s.query is not None]

    @property
    def retrieved_ids(self) -> list[str]:
        return [pid for s in self.steps for pid in s.retrieved_ids]

    def to_record(self) -> dict[str, Any]:
        """The flat per-question fields of ``records.jsonl``."""
        return {
            "prediction": self.prediction,
            "steps": [{k: v for k, v in asdict(s).items() if k not in IN_MEMORY} for s in self.steps],
            "n_steps": len(self.steps),
            "queries": self.queries,
            "retrieved_ids": self.retrieved_ids,
            "retrieval_count": len(self.queries),
            "stop_reason": self.stop_reason,
            "format_failure": self.format_failure,
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
            "prompt_cuts": self.prompt_cuts,
            "rewards": [s.rewards for s in self.steps if s.rewards],
        }


def token_stream(steps: Sequence[Step]) -> tuple[list[int], list[int], list[int], list[float]]:
    """A continued rollout (``Protocol.continues``) as one training sequence, token in, token out: the first
    prompt's ids, then every id after them as the model read or wrote them, the mask (1 on the policy's
    sampled ids; 0 on the environment's blocks and on a prefix written for the model) and the log-probs (0
    on the environment's). Steps with no ids (a prompt that did not fit) are skipped. Each step's prompt
    ids extend the sequence so far; one that does not (a history tokenized anew) is a bug, and raises."""
    generated = [s for s in steps if s.prompt_ids]
    if not generated:
        return [], [], [], []
    prompt = list(generated[0].prompt_ids)
    ids, mask, logprobs = list(prompt), [], []
    for s in generated:
        if s.prompt_ids[: len(ids)] != ids:
            raise ValueError("a continued rollout's step was not given the ids of the turns before it")
        given = len(s.prompt_ids) - len(ids)
        ids += s.prompt_ids[len(ids) :] + s.token_ids
        mask += [0] * given + [1] * len(s.token_ids)
        logprobs += [0.0] * given + (s.logprobs or [0.0] * len(s.token_ids))
    return prompt, ids[len(prompt) :], mask, logprobs
