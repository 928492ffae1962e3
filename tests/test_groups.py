"""eval.samples: every question rolled out n times side by side, and the share of mixed groups."""

from rag_lab.core.records import read_records
from rag_lab.data.base import QAExample
from rag_lab.eval.groups import group_stats, repeat
from rag_lab.run import run


def test_repeat_gives_each_question_n_ids_in_a_row():
    examples = [QAExample("a", "qa?", ("x",)), QAExample("b", "qb?", ("y",))]
    assert [e.id for e in repeat(examples, 3)] == ["a#s0", "a#s1", "a#s2", "b#s0", "b#s1", "b#s2"]
    assert repeat(examples, 1) == examples
    assert {e.question for e in repeat(examples, 2)[:2]} == {"qa?"}


def test_group_stats_count_mixed_and_solved_groups():
    ems = {"a": [1.0, 0.0, 1.0], "b": [0.0, 0.0, 0.0], "c": [1.0, 1.0, 1.0], "d#x": [0.0, 1.0, 0.0]}
    records = [{"id": f"{q}#s{j}", "em": em} for q, group in ems.items() for j, em in enumerate(group)]
    assert group_stats(records) == {"mixed_groups": 0.5, "solved_groups": 0.75}


def test_a_sampled_run_scores_every_sample_and_reports_its_groups(tiny_cfg, tiny_lm, tmp_path):
    """An (untrained) LM sampled at temperature 1.0 on 8 questions, 4 samples each: the copies of a
    question are rolled out side by side, so they are different samples."""
    lm = ["generator=hf", f"generator.model={tiny_lm}", f"generator.tokenizer={tiny_lm}/tokenizer"]
    cfg = tiny_cfg(
        *lm,
        "policy=agent",
        "policy.temperature=1.0",
        "policy.max_turns=2",
        "policy.max_new_tokens=16",
        "eval.limit=8",
        "eval.samples=4",
        "eval.batch_size=16",
    )
    metrics = run(cfg, tmp_path)
    records = read_records(tmp_path / "records.jsonl")
    assert [r["id"] for r in records[:5]] == ["test-0#s0", "test-0#s1", "test-0#s2", "test-0#s3", "test-1#s0"]
    assert metrics["all"]["n"] == 32
    groups, answers = {}, {}
    for r in records:
        groups.setdefault(r["id"].rpartition("#s")[0], []).append(r["em"])
        answers.setdefault(r["id"].rpartition("#s")[0], set()).add(str(r["steps"]))
    assert max(len(a) for a in answers.values()) > 1  # samples, not copies
    assert metrics["all"]["mixed_groups"] == sum(0 < sum(g) < 4 for g in groups.values()) / 8
    assert metrics["all"]["solved_groups"] == sum(sum(g) > 0 for g in groups.values()) / 8
    assert "Mixed" in (tmp_path / "table.md").read_text()
