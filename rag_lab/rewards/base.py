"""The reward contract: TRL's reward-function signature, so any of ours plugs into a TRL trainer."""

from typing import Any, Protocol


class Reward(Protocol):
    def __call__(self, completions: list[Any], **columns: Any) -> list[float]:
        """One float per completion; dataset columns (e.g. ``answers``) arrive as keyword lists."""
        ...
