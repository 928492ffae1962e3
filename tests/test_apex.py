"""APEX-Searcher's plan -> execute -> synthesise loop (policies/apex/pipeline.py) with a scripted
generator and a retriever over a fixed list: ``#n`` resolution, de-duplicated retrieval, the stop when a
search brings nothing new, the fallback when the plan does not parse."""

import pytest
from hydra.utils import instantiate

from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.generators.base import Completion
from rag_lab.policies.apex.pipeline import APEXPipeline
from rag_lab.retrievers.base import Hit, filter_hits

from conftest import undocumented_metrics


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from rag_lab.core.config import compose

    from conftest import TINY_DATA

    cfg = compose([*TINY_DATA, f"cache_dir={tmp_path_factory.mktemp('cache')}"])
    return instantiate(cfg.data).corpus


class Listed:
    """Every query gets the same ranking: the first ``n`` passages of the corpus."""

    def __init__(self, ids: list[str]):
        self.ids, self.queries = ids, []

    def search(self, queries, k, exclude=None):
        self.queries.extend(queries)
        exclude = exclude or [()] * len(queries)
        return [filter_hits([Hit(i, 1.0) for i in self.ids], skip, k) for skip in exclude]


class Scripted:
    """Replies with the next scripted text for each prompt, in order; records the prompts."""

    chat = False

    def __init__(self, *replies: str):
        self.replies, self.prompts = list(replies), []

    def generate(self, prompts, sampling):
        self.prompts.extend(prompts)
        return [[Completion(self.replies.pop(0) if self.replies else "")] for _ in prompts]


def episode(corpus, replies, n_passages=5, plan=True):
    generator, retriever = Scripted(*replies), Listed([p.id for p in list(corpus)[:n_passages]])
    env = Env(corpus, retriever, generator)
    ex = QAExample(id="q", question="Where was the director of Film X born?", answers=("Paris",))
    [ep] = APEXPipeline(plan=plan, hops=3, k=3).rollout(env, [ex])
    return ep, generator, retriever


def test_placeholder_resolved_from_the_knowledge_base(corpus):
    ep, generator, _ = episode(corpus, [
        "1. Who directed Film X?\n2. Where was #1 born?",
        "ANSWER: Ada Stone",
        "ANSWER: Paris",
        "ANSWER: Paris\nCONFIDENCE: 0.9",
    ])  # fmt: skip
    assert ep.prediction == "Paris"
    assert "Where was Ada Stone born?" in generator.prompts[2]
    assert "#1" not in generator.prompts[2]


def test_retrieval_skips_seen_passages_and_stops_when_nothing_new(corpus):
    # 5 passages, k=3: the first search brings 3, the second the other 2, the third nothing new; the
    # executor then gets one step to answer, and a fourth SEARCH is not run.
    ep, generator, retriever = episode(corpus, [
        "SEARCH: a", "SEARCH: b", "SEARCH: c", "SEARCH: d", "ANSWER: Paris\nCONFIDENCE: 0.5",
    ], plan=False)  # fmt: skip
    searches = [s.retrieved_ids for s in ep.steps if s.query is not None]
    assert [len(ids) for ids in searches] == [3, 2, 0]
    assert ep.to_record()["retrieval_count"] == 3  # each search counted once: its step holds its passages
    assert len({i for ids in searches for i in ids}) == 5
    assert retriever.queries == ["a", "b", "c"]
    assert ep.prediction == "Paris"


def test_an_answer_after_nothing_new_is_kept(corpus):
    ep, _, retriever = episode(corpus, ["SEARCH: a", "SEARCH: b", "ANSWER: Lyon", "ANSWER: Lyon"],
                               n_passages=3, plan=False)  # fmt: skip
    assert retriever.queries == ["a", "b"]
    assert ep.prediction == "Lyon"


def test_unparsable_plan_falls_back_to_the_question(corpus):
    ep, generator, _ = episode(corpus, ["no plan here", "ANSWER: Paris", "ANSWER: Paris"])
    assert ep.prediction == "Paris"
    assert "Where was the director of Film X born?" in generator.prompts[1]


class Words:
    """A tokenizer of whitespace-separated words, in a folder ``t``: the engine gives its generator ids."""

    name_or_path, chat_template = "t", None

    def __call__(self, texts, add_special_tokens=False):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[t.split() for t in texts])


def test_with_only_the_executor_fine_tuned_the_untrained_model_plans(corpus, tmp_path, monkeypatch):
    """Table 2's "plan + executor SFT" row: the fine-tuned model executes, the untrained one still plans."""
    from pathlib import Path
    from types import SimpleNamespace

    from rag_lab.policies.apex import policy as apex

    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "train.json").write_text('{"sft": {"losses": [{"step": 1, "loss": 2.0}]}}')
    base = Scripted("1. Who directed Film X?\n2. Where was #1 born?")
    base.model, base.tokenizer = SimpleNamespace(name_or_path="m"), Words()
    base.batch_size, base.seed = 2, 0
    tuned = Scripted("ANSWER: Ada Stone", "ANSWER: Paris", "ANSWER: Paris\nCONFIDENCE: 0.9")
    monkeypatch.setattr(apex, "cold_start", lambda *args, **kwargs: tmp_path / "sft")
    monkeypatch.setattr(apex, "load", lambda path, **kwargs: tuned)
    curves = []  # the rows the policy logs (write_curves: train_log.jsonl, the logger, curves.png)
    monkeypatch.setattr(apex, "write_curves", lambda rows, *args, **kwargs: curves.append(rows))
    policy = apex.APEX(plan=True, plan_rl=False, executor_sft=True, executor=object(), train_data=object())
    env = Env(corpus, Listed([p.id for p in list(corpus)[:5]]), base)
    policy.fit(env, [], [], Path(tmp_path / "run"))
    ex = QAExample(id="q", question="Where was the director of Film X born?", answers=("Paris",))
    # the policy acts with the fine-tuned executor (evaluation's view of the env); the base wrote the plan
    from rag_lab.eval.evaluate import acting_env

    [ep] = policy.rollout(acting_env(policy, env), [ex])
    assert policy.generator is tuned and env.generator is base
    assert len(base.prompts) == 1 and not base.replies
    assert len(tuned.prompts) == 3 and ep.prediction == "Paris"
    assert curves[0] == [{"stage": "executor", "step": 1, "sft_loss": 2.0}]
    assert not undocumented_metrics("apex", curves[0])  # on docs/methods/apex.md
