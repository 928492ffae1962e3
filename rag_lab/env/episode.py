"""What one question's rollout leaves behind: an ``Episode`` of ``Step``s."""

from dataclasses import asdict, dataclass, field
from typing import Any

IN_MEMORY = ("token_ids", "logprobs")


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
    # The policy's own tokens and their log-probs (never the environment's text): what trainers
    # need; kept in memory, not written to records.jsonl.
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
