"""Each method's trainers, with the sizes its config gives them (one GPU's share of each step).

Sequence lengths: where a config bounds a length it is used (SFT's ``max_length``, the Q-network's, the
planner's ``max_new_tokens``); a multi-turn sequence is the prompt, then each turn's output
(``max_new_tokens``) and, after every turn but the last, its ``k`` passages: ``launch.memory.prompt_tokens``
and ``passage_tokens`` (R3-RAG cuts each passage to ``max_doc_chars``, about 4 characters a token), at most
the model's positions.

Each plan returns its phases. A trained policy class names its plan in ``memory_plan`` (:func:`plan_of`):
the methods that train with TRL's trainers name one of this module's (:func:`dapo`, :func:`evorag`,
:func:`apex`); R3-RAG and Stop-RAG, whose loops are their own, name theirs (``rag_lab/policies/r3rag/
memory.py``, ``rag_lab/policies/stoprag/memory.py``), so the planner imports no policy.
"""

from collections.abc import Callable

from rag_lab.core.config import locate
from rag_lab.core.errors import RagLabError
from rag_lab.train.memory.context import Context
from rag_lab.train.memory.ledger import Phase
from rag_lab.train.memory.trainers import Shapes, dpo, grpo, sft

CHARS_PER_TOKEN = 4


def multi_turn(ctx: Context, turns: int, new: int, k: int, passage: int | None = None) -> int:
    """The longest multi-turn sequence (module docstring), at most the model's positions."""
    passage = ctx.memory.passage_tokens if passage is None else passage
    length = ctx.memory.prompt_tokens + turns * new + (turns - 1) * k * passage
    return min(length, ctx.positions)


def cold_start(ctx: Context, node: dict | None, name: str = "cold start (SFT)") -> list[Phase]:
    """SFT on demonstrations (a cold start config node): its share of ``batch_size`` rows of
    ``max_length``."""
    if not node:
        return []
    rows = ctx.share(node["batch_size"], "cold_start.batch_size")
    length = min(node["max_length"], ctx.positions)
    return sft(ctx.bench, ctx.model, Shapes(rows, 0, length), ctx.rollout(0, 0, trains=False), name)


def dapo(ctx: Context, s: dict) -> list[Phase]:
    """DAPO's stages (GRPO, one update a step over the process's share of ``questions_per_step`` x
    ``group_size`` episodes in passes of ``micro_batch``), after its cold start where it has one."""
    share = ctx.share(s["questions_per_step"], "policy.questions_per_step") * s["group_size"]
    micro = min(s.get("micro_batch") or share, share)
    completion = multi_turn(ctx, s["max_turns"], s["max_new_tokens"], s["k"]) - ctx.memory.prompt_tokens
    shapes = Shapes(
        micro, ctx.memory.prompt_tokens, completion, s["kl_coef"], ctx.vllm, s["train_temperature"]
    )
    rollout = ctx.rollout(share, shapes.length)
    return cold_start(ctx, s.get("cold_start")) + grpo(ctx.bench, ctx.model, shapes, rollout, "DAPO (GRPO)")


def evorag(ctx: Context, s: dict) -> list[Phase]:
    """EVO-RAG's DPO + LoRA epochs: the process's share of ``batch_size`` pairs a pass, a pair a state (its
    history, at most ``max_turns`` steps) and one action; its preference model's frozen encoder beside."""
    pairs = ctx.share(s["batch_size"], "policy.batch_size")
    state = multi_turn(ctx, s["max_turns"], s["max_new_tokens"], s["k"])
    shapes = Shapes(pairs, min(state, ctx.positions - s["max_new_tokens"]), s["max_new_tokens"])
    lora = {k: s["lora"][k] for k in ("r", "target_modules")} | {
        "lora_alpha": s["lora"]["alpha"],
        "lora_dropout": s["lora"]["dropout"],
    }
    rollout = ctx.rollout(
        s["rollout_batch"], shapes.length, extra=[("policy.preference.encoder", s["preference"]["encoder"])]
    )
    return cold_start(ctx, s.get("cold_start")) + dpo(
        ctx.bench, ctx.model, shapes, rollout, lora, "EVO-RAG (DPO + LoRA)"
    )


def apex(ctx: Context, s: dict) -> list[Phase]:
    """APEX's executor SFT (its cold start config) and planner GRPO (with its reference where ``beta`` > 0),
    each where its switch is on."""
    phases = []
    if s.get("executor_sft") and s.get("executor"):
        phases += cold_start(ctx, s["executor"], "executor (SFT)")
    if s.get("plan_rl") and s.get("plan", True):
        pl = s["planner"]
        share = ctx.share(pl["questions_per_step"], "policy.planner.questions_per_step") * pl["group_size"]
        micro = min(pl.get("micro_batch") or share, share)
        shapes = Shapes(
            micro, ctx.memory.prompt_tokens, pl["max_new_tokens"], pl["beta"], ctx.vllm, pl["temperature"]
        )
        phases += grpo(ctx.bench, ctx.model, shapes, ctx.rollout(share, shapes.length), "planner (GRPO)")
    return phases


def plan_of(cls: type) -> Callable[[Context, dict], list[Phase]]:
    """The plan a trained policy class names (``memory_plan``: the dotted path of a function taking the
    context and the policy's settings); a one-line error when it names none."""
    name = getattr(cls, "memory_plan", None)
    if not name:
        raise RagLabError(
            f"policy: {cls.__name__} trains, and names no memory plan of its trainers (a class attribute "
            "memory_plan: rag_lab/train/memory/methods.py)"
        )
    return locate(name)
