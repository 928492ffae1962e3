"""What one question's rollout leaves behind: an ``Episode`` of ``Step``s."""

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Step:
    # The policy's generated text for this turn ("" for LM-free policies).
    text: str = ""
    # The parsed action: "search", "answer", "stop", "backtrack", "refuse", ...
    action: str = ""
    query: str | None = None
    retrieved_ids: list[str] = field(default_factory=list)
    rewards: dict[str, float] = field(default_factory=dict)


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
            "steps": [asdict(s) for s in self.steps],
            "n_steps": len(self.steps),
            "queries": self.queries,
            "retrieved_ids": self.retrieved_ids,
            "retrieval_count": len(self.queries),
            "stop_reason": self.stop_reason,
            "format_failure": self.format_failure,
            "tokens": {"prompt": self.prompt_tokens, "completion": self.completion_tokens},
            "rewards": [s.rewards for s in self.steps if s.rewards],
        }
