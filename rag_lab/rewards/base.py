"""The reward contract: TRL's reward-function signature, so any of ours plugs into a TRL trainer."""

from typing import Any, Protocol


class Reward(Protocol):
    def __call__(self, completions: list[Any], **columns: Any) -> list[float]:
        """One float per completion; dataset columns (e.g. ``answers``) arrive as keyword lists."""
        ...


def named(reward: Any) -> dict[str, Reward]:
    """The run's reward group as named terms: a dict of them as it is (``reward=dapo``: answer, search,
    format), one reward function under its own name (``reward=format``: ``format_reward``); None: none.

    >>> from functools import partial
    >>> def f1(completions, **_): ...
    >>> sorted(named(partial(f1))), sorted(named({"a": f1, "b": None})), named(None)
    (['f1'], ['a'], {})
    """
    if reward is None:
        return {}
    if isinstance(reward, dict):
        return {name: fn for name, fn in reward.items() if fn is not None}
    target = getattr(reward, "func", reward)  # a partial's function
    return {getattr(target, "__name__", type(target).__name__.lower()): reward}
