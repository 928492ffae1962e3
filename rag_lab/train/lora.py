"""LoRA adapters (PEFT) as every trainer of rag_lab takes them: the cold start's SFT, DAPO's GRPO, EVO-RAG's
DPO; and their checks before anything trains (:mod:`rag_lab.core.batches`' table): a ``lora`` node's ranges
and its target modules, which must be modules of the run's model (PEFT trains fewer adapters, or none, where a
name matches nothing)."""

from collections.abc import Mapping
from dataclasses import asdict, dataclass, is_dataclass
from typing import TYPE_CHECKING, Annotated, Any

from rag_lab.core.config import AtLeast, Dropout, PositiveInt, check_ranges

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


def lora_settings(lora: Any, prefix: str = "lora") -> list[tuple[str, str]]:
    """A ``lora`` node (a mapping, or null): its declared ranges (a plain mapping has no ``_target_`` to be
    checked by) and adapters with modules to sit on."""
    if not lora:
        return []
    node = {k: v for k, v in (asdict(lora) if is_dataclass(lora) else dict(lora)).items() if k[:1] != "_"}
    unknown = sorted(set(node) - set(LoRA.__dataclass_fields__))
    if unknown:
        return [(f"{prefix}.{unknown[0]}", f"not a LoRA setting ({', '.join(LoRA.__dataclass_fields__)})")]
    problems = check_ranges(LoRA, node, f"{prefix}.")
    if node.get("r", 0) and not list(node.get("target_modules", LoRA.target_modules)):
        problems.append((f"{prefix}.target_modules", f"[] with r={node['r']}: an adapter needs modules"))
    return problems


def lora_nodes(node: Any, path: str = "policy") -> list[tuple[str, dict]]:
    """(path, settings) of every ``lora`` node with adapters (r > 0) under a policy's settings."""
    out = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            where = f"{path}.{key}"
            if key == "lora" and isinstance(value, Mapping) and value.get("r"):
                out.append((where, dict(value)))
            else:
                out += lora_nodes(value, where)
    return out


def lora_targets(run: Mapping, model_dir: str | None) -> list[tuple[str, str]]:
    """Each LoRA target module of the run's policy names a module of the run's model (PEFT matches a name
    or a dotted name's suffix; ``all-linear`` matches any linear layer); ``model_dir`` None (the model not
    known before the run builds it) is not checked. The model is built on the meta device: no weights."""
    nodes = lora_nodes(run.get("policy") or {})
    if not nodes or model_dir is None:
        return []
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    names = [name for name, _ in model.named_modules() if name]
    problems = []
    for where, lora in nodes:
        for target in lora.get("target_modules") or ():
            if target != "all-linear" and not any(n == target or n.endswith(f".{target}") for n in names):
                kinds = sorted({n.rsplit(".", 1)[-1] for n in names if not n.rsplit(".", 1)[-1].isdigit()})
                why = f"{target!r} is no module of {type(model).__name__} ({', '.join(kinds)})"
                problems.append((f"{where}.target_modules", why))
    return problems
