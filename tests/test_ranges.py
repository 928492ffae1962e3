"""Every method setting with a valid range or a set of choices declares it beside the setting
(rag_lab/core/ranges.py), and the config refuses a value outside it when it is composed: one line naming the
key, before anything is built or trained."""

import dataclasses
import typing

import pytest
import yaml

from rag_lab import CONF_DIR
from rag_lab.core.config import ConfigError, compose, schema_for
from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import OneOf, Range, check_ranges, field_checks, problems, strip_annotated

# Numeric settings of the methods that take any value, each with the reason.
UNBOUNDED = {
    "seed": "any integer seeds",
    "sample_seed": "any integer seeds (a dataset's sample of questions)",
    "train_seed": "any integer seeds (the tiny LM's recipe)",
    "StopRAG.tau": "a margin of Q-values (or logits): any real; null tunes it",
    "EvoRAG.stages": "a list checked as a whole (check_settings: a subset of [1, 2] in order)",
}


def numeric(hint) -> bool:
    return hint in (int, float) or any(a in (int, float) for a in typing.get_args(hint))


def targets(node) -> set[str]:
    """Every ``_target_`` in a config file's (nested) mapping."""
    if isinstance(node, dict):
        return ({node["_target_"]} if "_target_" in node else set()) | {
            t for value in node.values() for t in targets(value)
        }
    return {t for value in node for t in targets(value)} if isinstance(node, list) else set()


def method_settings() -> list[tuple[str, dataclasses.Field]]:
    """(target's class, field) for every setting of the policies', the rewards', the cold start's, the
    retrievers', the generators', the judges' and the datasets' config files (read as files: composing each
    would take seconds)."""
    found = set()
    for group in ("policy", "reward", "cold_start", "retriever", "generator", "judge", "data"):
        for path in sorted((CONF_DIR / group).glob("*.yaml")):
            found |= targets(yaml.safe_load(path.read_text()) or {})
    out = []
    for target in sorted(found):
        schema = schema_for(target)
        if schema is not dict:
            out += [(target.rsplit(".", 1)[-1], f) for f in dataclasses.fields(schema)]
    return out


def test_every_numeric_method_setting_declares_its_range():
    settings = method_settings()
    assert {
        "EvoRAG",
        "PPOSettings",
        "ColdStartConfig",
        "PlannerRL",
        "StopRAG",
        "multistage_answer",
        "BM25Retriever",
        "DenseRetriever",
        "HFGenerator",
        "tiny_lm",
        "VLLMGenerator",
        "SynthDataset",
    } <= {target for target, _ in settings}
    undeclared = sorted(
        f"{target}.{f.name}"
        for target, f in settings
        if numeric(f.type)
        and not field_checks(f)
        and not f.name.startswith("_")
        and f.name not in UNBOUNDED
        and f"{target}.{f.name}" not in UNBOUNDED
    )
    assert undeclared == [], (
        f"numeric settings without a declared range: {undeclared} (rag_lab/core/ranges.py)"
    )


# One out-of-range value per setting family: composing it fails naming the key.
OUT_OF_RANGE = [
    # EVO-RAG: DPO, the preference model, sampling, LoRA, its cold start and the teacher's noise
    (["policy=evorag", "policy.beta=0"], r"'policy\.beta' must be > 0, got 0"),
    (["policy=evorag", "policy.lr=-1e-3"], r"'policy\.lr' must be > 0"),
    (["policy=evorag", "policy.top_p=1.5"], r"'policy\.top_p' must be in \(0, 1\], got 1\.5"),
    (["policy=evorag", "policy.preference.lr=0"], r"'policy\.preference\.lr' must be > 0, got 0"),
    (["policy=evorag", "policy.preference.margin=-0.3"], r"'policy\.preference\.margin' must be >= 0"),
    (
        ["policy=evorag", "policy.lora.dropout=1.0"],
        r"'policy\.lora\.dropout':? must be in \[0, 1\), got 1\.0",
    ),  # noqa: E501
    (["policy=evorag", "policy.dev_limit=0"], r"'policy\.dev_limit' must be >= 1, got 0"),
    # R3-RAG's PPO
    (["policy=r3rag", "policy.ppo.gamma=1.5"], r"'policy\.ppo\.gamma' must be in \[0, 1\], got 1\.5"),
    (["policy=r3rag", "policy.ppo.lam=-0.1"], r"'policy\.ppo\.lam' must be in \[0, 1\]"),
    (["policy=r3rag", "policy.ppo.clip=1.0"], r"'policy\.ppo\.clip' must be in \(0, 1\), got 1\.0"),
    (["policy=r3rag", "policy.ppo.actor_lr=0"], r"'policy\.ppo\.actor_lr' must be > 0"),
    (["policy=r3rag", "policy.ppo.temperatures=[0.5,-1]"], r"ppo\.temperatures' must be >= 0, got -1"),
    (["policy=r3rag", "policy.ppo.critic=both"], r"ppo\.critic': 'both' is not one of shared, separate"),
    # the cold start (SFT and the demonstrations)
    (["policy=r3rag", "policy.cold_start.lr=0"], r"'policy\.cold_start\.lr' must be > 0, got 0"),
    (["policy=dapo", "policy.cold_start.noise.miscopy=2"], r"cold_start\.noise\.miscopy' must be in \[0, 1"),
    (["policy=dapo", "policy.cold_start.temperatures=[-0.5]"], r"cold_start\.temperatures' must be >= 0"),
    # DAPO and APEX's planner
    (["policy=dapo", "policy.epsilon=0"], r"'policy\.epsilon' must be in \(0, 1\), got 0"),
    (["policy=dapo", "policy.kl_coef=-1"], r"'policy\.kl_coef' must be >= 0"),
    (["policy=apex", "policy.planner.epsilon=1"], r"'policy\.planner\.epsilon' must be in \(0, 1\)"),
    (["policy=apex", "policy.planner.loss_type=mean"], r"'policy\.planner\.loss_type': 'mean' is not one of"),
    # Stop-RAG and its Q-network
    (["policy=stoprag", "policy.lambda_end=2"], r"'policy\.lambda_end' must be in \[0, 1\], got 2"),
    (["policy=stoprag", "policy.val_fraction=1"], r"'policy\.val_fraction' must be in \[0, 1\), got 1"),
    (["policy=stoprag", "policy.score=bleu"], r"'policy\.score': 'bleu' is not one of"),
    (["policy=stoprag", "policy.dropout=-0.1"], r"'policy\.dropout' must be in \[0, 1\)"),
    (["policy=stoprag", "policy.pooling=max"], r"'policy\.pooling': 'max' is not one of mean, cls"),
    # the rewards
    (["policy=dapo", "reward.answer.beta=-0.3"], r"'reward\.answer\.beta' must be >= 0"),
    (["policy=dapo", "reward.answer.correct=f1"], r"answer\.correct': 'f1' is not one of em, acc, judge"),
    (["policy=apex", "reward=sepr", "reward.threshold=1.5"], r"'reward\.threshold' must be in \[0, 1\]"),
    # the agents' greedy temperature
    (["policy=agent", "policy.temperature=-1"], r"'policy\.temperature' must be >= 0"),
    # the retrievers, the generators, the generated world
    (["retriever=bm25", "retriever.k1=-1"], r"'retriever\.k1' must be >= 0, got -1"),
    (["retriever=bm25", "retriever.b=1.5"], r"'retriever\.b' must be in \[0, 1\], got 1\.5"),
    (["generator=hf", "generator.model=x", "generator.batch_size=0"], r"generator\.batch_size. must be >= 1"),
    (["generator=tiny", "generator.hidden=0"], r"'generator\.hidden' must be >= 1, got 0"),
    (["generator=tiny", "generator.lr=0"], r"'generator\.lr' must be > 0, got 0"),
    (["data.withhold_rate=1.5"], r"'data\.withhold_rate' must be in \[0, 1\], got 1\.5"),
]


@pytest.mark.parametrize("overrides, message", OUT_OF_RANGE, ids=[o[-1] for o, _ in OUT_OF_RANGE])
def test_an_out_of_range_setting_fails_at_compose_naming_it(overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        compose(overrides)
    assert "\n" not in str(error.value)


def test_ranges_and_choices():
    assert Range(0, 1).why(1) is None and Range(0, 1, open_max=True).why(1) == "must be in [0, 1), got 1"
    assert (
        Range(0, open_min=True).why(0.0) == "must be > 0, got 0.0"
        and Range(max=1).why(2) == "must be <= 1, got 2"
    )
    assert Range(0).why(True) is None and Range(0).why("x") is None  # the schema's type check says those
    assert OneOf("a", "b").why("c") == "'c' is not one of a, b" and OneOf(1, "x").why(1) is None
    # a list's items one by one, None passes
    assert (
        problems((Range(0),), [1, -2]) == "must be >= 0, got -2 (in [1, -2])"
        and problems((Range(0),), None) is None
    )
    # inside X | None and list[X]
    hint = typing.Annotated[int, Range(1)] | None
    assert strip_annotated(hint) == (int | None, [Range(1)])
    assert strip_annotated(list[typing.Annotated[float, Range(0)]]) == (list[float], [Range(0)])


def test_a_component_built_outside_a_config_checks_the_same_declarations():
    from rag_lab.policies.apex.planner import PlannerRL
    from rag_lab.policies.evorag.policy import EvoRAG, PreferenceSettings
    from rag_lab.policies.r3rag.policy import R3RAG
    from rag_lab.policies.r3rag.ppo import PPOSettings

    assert check_ranges(PPOSettings, {"gamma": 2.0, "clip": 0.2}) == [("gamma", "must be in [0, 1], got 2.0")]
    with pytest.raises(RagLabError, match=r"policy\.preference\.lr: must be > 0, got -1"):
        EvoRAG(preference=PreferenceSettings(lr=-1))
    with pytest.raises(RagLabError, match=r"policy\.ppo\.lam: must be in \[0, 1\], got 1\.5"):
        R3RAG(ppo=PPOSettings(lam=1.5))
    with pytest.raises(RagLabError, match=r"policy\.planner\.loss_type: 'mean' is not one of dapo"):
        PlannerRL(loss_type="mean")


@pytest.mark.parametrize(
    "target, settings, changed",
    [
        ("rag_lab.policies.dapo.policy.DAPO", "DAPOSettings", {"steps": 3, "k": 2}),
        ("rag_lab.policies.evorag.policy.EvoRAG", "EvoRAGSettings", {"max_cycles": 1, "k": 2}),
        ("rag_lab.policies.stoprag.policy.StopRAG", "StopRAGSettings", {"epochs": 2.0, "iterations": 3}),
    ],
)
def test_a_methods_settings_dataclass_is_its_schema_and_its_attributes(target, settings, changed):
    """A method's training settings are declared once, in its settings dataclass: the config schema lists
    each with its declared range, and the policy holds each as an attribute. An agent's key that neither
    part takes is a TypeError, as any constructor's unknown keyword (Stop-RAG hands its other keys on to
    its pipeline and Q-network, each taking its own, as before)."""
    from rag_lab.core.config import locate

    cls, declared = locate(target), locate(f"{target.rpartition('.')[0]}.{settings}")
    hints = typing.get_type_hints(declared, include_extras=True)
    schema = {f.name: f for f in dataclasses.fields(schema_for(target))}
    for f in dataclasses.fields(declared):
        assert field_checks(schema[f.name]) == tuple(strip_annotated(hints[f.name])[1]), f.name
    policy = cls(**changed)
    first = next(iter(changed))
    assert getattr(policy, first) == changed[first] != declared.__dataclass_fields__[first].default
    if settings != "StopRAGSettings":
        with pytest.raises(TypeError):
            cls(no_such_setting=1)
