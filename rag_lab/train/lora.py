"""LoRA adapters (PEFT) as every trainer of rag_lab takes them: the cold start's SFT, DAPO's GRPO."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from rag_lab.config import AtLeast, Dropout, PositiveInt

if TYPE_CHECKING:
    from peft import LoraConfig


@dataclass(frozen=True)
class LoRA:
    # adapter rank; 0: no adapter (every weight trains)
    r: Annotated[int, AtLeast(0)] = 0
    alpha: PositiveInt = 16
    dropout: Dropout = 0.05
    # names of the modules that get an adapter (the last part of their dotted name)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))


def peft_config(lora: LoRA | None) -> "LoraConfig | None":
    """PEFT's config for ``lora`` (a causal LM's adapters); None when there is no adapter (null or r 0)."""
    if lora is None or not lora.r:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
