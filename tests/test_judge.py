"""The LLM judge's prompt, votes, cache and failure, with small rule-based generators."""

import pytest

from rag_lab.eval.judge import JUDGE_PROMPT, JudgeError, LLMJudge
from rag_lab.generators.base import Completion, Sampling


class SubstringJudge:
    """Says YES when the prompt's prediction contains a reference answer; counts prompts."""

    def __init__(self, replies=None):
        self.prompts: list = []
        self.replies = replies

    def generate(self, prompts, sampling: Sampling):
        out = []
        for p in prompts:
            self.prompts.append(p)
            text = p[0]["content"]
            pred = text.split("Prediction: ")[1].split(" Reference Answers: ")[0]
            golds = text.split("Reference Answers: ")[1].split(" Please answer")[0].split(", ")
            yes = any(g and g in pred for g in golds)
            replies = self.replies or ["YES" if yes else "NO"] * sampling.n
            out.append([Completion(r) for r in replies[: sampling.n]])
        return out


class Unreachable:
    def generate(self, prompts, sampling):
        raise ConnectionError("[Errno 111] Connection refused (http://127.0.0.1:9/v1)")


def test_judge_scores_and_caches(tmp_path):
    gen = SubstringJudge()
    judge = LLMJudge(gen, cache_path=str(tmp_path / "judge.jsonl"))
    preds, golds = (
        ["The city of Paris", "Lyon", "", "the Paris city"],
        [["Paris"], ["Paris"], ["Paris"], ["paris"]],
    )
    assert judge(preds, golds) == [1.0, 0.0, 0.0, 1.0]
    # 'The city of Paris' and 'the Paris city' normalise differently: 2 distinct + 'lyon'; '' is not asked.
    assert judge.calls == 3
    assert "Prediction: city of paris Reference Answers: paris" in gen.prompts[0][0]["content"]
    assert gen.prompts[0][0]["content"].startswith(JUDGE_PROMPT.split("Prediction")[0])
    again = LLMJudge(SubstringJudge(), cache_path=str(tmp_path / "judge.jsonl"))
    assert again(preds, golds) == [1.0, 0.0, 0.0, 1.0] and again.calls == 0


@pytest.mark.parametrize(
    "replies, expected",
    [(["YES", "YES", "NO"], 1.0), (["YES", "NO", "maybe"], 0.0), (["yes.", "Yes", "NO"], 1.0)],
)
def test_majority_vote(replies, expected):
    assert LLMJudge(SubstringJudge(replies), n=3, temperature=0.7)(["x"], [["y"]]) == [expected]


def test_unreachable_judge_is_an_error_not_a_zero():
    with pytest.raises(
        JudgeError, match=r"LLM judge \(Unreachable\) failed: \[Errno 111\] Connection refused"
    ):
        LLMJudge(Unreachable())(["Paris"], [["Paris"]])


def test_evaluation_with_a_judge_adds_judge_acc(tiny_cfg, tmp_path):
    from hydra.utils import instantiate

    from rag_lab.env import Env
    from rag_lab.eval.evaluate import aggregate, evaluate

    cfg = tiny_cfg()
    data = instantiate(cfg.data)
    env = Env(data.corpus, instantiate(cfg.retriever, corpus=data.corpus))
    examples = data.split("test")[:10]
    judge = LLMJudge(SubstringJudge())
    records = evaluate(instantiate(cfg.policy), env, examples, tmp_path / "r.jsonl", data.scorer, judge=judge)
    assert all(r["judge_acc"] == float(r["acc"] and bool(r["prediction"])) for r in records)
    assert aggregate(records)["all"]["judge_acc"] is not None


def test_runner_judge_shares_the_run_generator(tiny_cfg, tiny_lm, tmp_path):
    from rag_lab.core.records import read_records
    from rag_lab.run import run

    cfg = tiny_cfg(
        "judge=llm",
        "generator=hf",
        f"generator.model={tiny_lm}",
        f"generator.tokenizer={tiny_lm}/tokenizer",
        "eval.limit=6",
    )
    metrics = run(cfg, tmp_path)
    records = read_records(tmp_path / "records.jsonl")
    # A random tiny LM answers neither YES nor NO: no votes, so every verdict is 0, never an error.
    assert [r["judge_acc"] for r in records] == [0.0] * 6
    assert metrics["all"]["judge_acc"] == 0.0
    assert (tmp_path / "judge_cache.jsonl").exists()  # verdicts cached for a resumed run
