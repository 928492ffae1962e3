"""The demonstration policies' registry (rag_lab/train/demonstrators.py): filled by rag_lab.policies, read by
the teacher's demonstrations, and part of their cache keys."""

import pytest

from rag_lab.core.errors import RagLabError
from rag_lab.train import demonstrations, demonstrators


def test_the_policies_register_the_demonstration_policies_in_their_order():
    from rag_lab.policies.demonstrators import demonstration_policies, gold_chains

    registered = demonstrators.registered()
    assert (registered.policies, registered.gold_chains) == (demonstration_policies, gold_chains)
    names = [type(p).__name__ for p in registered.policies(3, 6)]
    assert names == [
        "IterativePipeline",
        "IterativePipeline",
        "Agent",
        "Agent",
        "Agent",
        "APEXPipeline",
        "StandardRAG",
        "Direct",
        "ChainOfThought",
    ]
    assert [p.protocol.name for p in registered.policies(3, 6)[2:5]] == ["dapo", "evorag", "r3rag"]


def test_nothing_registered_is_one_line_naming_what_to_import(monkeypatch):
    monkeypatch.setattr(demonstrators, "_registered", [])
    with pytest.raises(
        RagLabError, match=r"^teacher demonstrations: no demonstration policies .* rag_lab\.policies"
    ):
        demonstrators.registered()


def test_the_demonstrations_cache_keys_hold_the_demonstration_policies_code(data, tmp_path, monkeypatch):
    """A changed prompt of a demonstration policy is never served from a cache its old code filled: the
    recipe's demonstrations and the cold start's both key on the registering module's code."""
    from rag_lab.core import cache

    assert demonstrators.registered().code_digest() == cache.code_digest("rag_lab.policies.demonstrators")
    config = demonstrations.DemoSettings(limit=4)
    before = [
        demonstrations.collected_path(tmp_path, "demonstrations", data, 3, 6),
        demonstrations.sampled_path(tmp_path, data, config, False),
    ]
    monkeypatch.setattr(demonstrators.Demonstrators, "code_digest", lambda self: "another policy code")
    after = [
        demonstrations.collected_path(tmp_path, "demonstrations", data, 3, 6),
        demonstrations.sampled_path(tmp_path, data, config, False),
    ]
    assert after[0] != before[0] and after[1] != before[1]
