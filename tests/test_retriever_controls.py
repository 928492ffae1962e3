"""The retriever controls (issue 74; rag_lab/retrievers/controls.py): random, empty and oracle retrieval,
each chosen as ``retriever=<name>`` and run through the runner's composition."""

import pytest
from hydra.utils import instantiate

from rag_lab.core.config import ConfigError, build, compose
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import read_records
from rag_lab.data.base import QAExample
from rag_lab.data.evidence import Evidence, index_corpus
from rag_lab.env import Env
from rag_lab.run import run

from conftest import TINY_DATA

# the methods' loops run the tiny LM: on one thread when another job holds a core (conftest.one_thread)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def world():
    """The tiny world's data and test questions."""
    data = instantiate(compose(TINY_DATA).data)
    return data, data.split("test")


def retriever(tiny_cfg, data, *overrides: str):
    return build(tiny_cfg(*overrides).retriever, corpus=data.corpus)


def ids(hits) -> list[list[str]]:
    return [[h.id for h in per_query] for per_query in hits]


def test_random_draws_other_pages_than_bm25_the_same_for_the_same_seed(tiny_cfg, world):
    data, test = world
    queries = [ex.question for ex in test]
    bm25 = ids(retriever(tiny_cfg, data, "retriever=bm25").search(queries, 5))
    drawn = ids(retriever(tiny_cfg, data, "retriever=random", "seed=3").search(queries, 5))
    # BM25's top 5 shares on average about 2 of its pages with the question's gold; 5 pages drawn from
    # the whole corpus share with BM25's top 5 about 5 * 5 / |corpus| (0.14 on 184 passages)
    shared = [len(set(a) & set(b)) for a, b in zip(drawn, bm25, strict=True)]
    assert sum(shared) / len(shared) < 0.5, shared
    assert all(len(set(d)) == 5 for d in drawn)
    assert drawn == ids(retriever(tiny_cfg, data, "retriever=random", "seed=3").search(queries, 5))
    assert drawn != ids(retriever(tiny_cfg, data, "retriever=random", "seed=4").search(queries, 5))


def test_random_excludes_and_keeps_the_rest_of_its_draw(tiny_cfg, world):
    data, test = world
    random = retriever(tiny_cfg, data, "retriever=random")
    first = random.search([test[0].question], 5)[0]
    again = random.search([test[0].question], 4, exclude=[{first[0].id}])[0]
    assert [h.id for h in again] == [h.id for h in first[1:]]  # the same draw, the excluded page left out
    assert random.search(["", "  "], 5) == [[], []]  # the contract: an empty query has no hits
    assert {h.id for h in random.search(["q"], len(data.corpus) + 3)[0]} == set(data.corpus.ids)


def test_empty_returns_nothing(tiny_cfg, world):
    data, test = world
    assert retriever(tiny_cfg, data, "retriever=empty").search([ex.question for ex in test], 5) == [
        [] for _ in test
    ]


def test_oracle_puts_the_gold_in_the_index_first_then_bm25(tiny_cfg, world):
    data, test = world
    oracle, bm25 = retriever(tiny_cfg, data, "retriever=oracle"), retriever(tiny_cfg, data, "retriever=bm25")
    env = Env(data.corpus, oracle)
    ex = next(ex for ex in test if ex.answerable and len(ex.supporting_ids) >= 2)
    gold = list(ex.supporting_ids)
    # a passage the index lacks (corpus.coverage < 1) is skipped; a seen one (exclude) too
    asked = QAExample(ex.id, ex.question, ex.answers, supporting_ids=("not-in-the-index", *gold))
    (hits,) = env.search([ex.question], 6, [{gold[0]}], [asked])
    fill = [h.id for h in bm25.search([ex.question], 10, [{gold[0]}])[0] if h.id not in gold]
    assert [h.id for h in hits] == gold[1:] + fill[: 6 - len(gold) + 1]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_an_oracle_search_without_its_questions_is_one_line(tiny_cfg, world):
    data, test = world
    env = Env(data.corpus, retriever(tiny_cfg, data, "retriever=oracle"))
    for questions in (None, [None]):
        with pytest.raises(RagLabError, match=r"^retriever=oracle: this search names no questions"):
            env.search([test[0].question], 3, questions=questions)


def test_the_retrieval_server_refuses_the_oracle(tiny_cfg):
    from rag_lab.serve import retrieval

    with pytest.raises(RagLabError, match=r"^retriever=oracle: the retrieval server cannot serve it"):
        retrieval(tiny_cfg("retriever=oracle"))
    refused = r"config 'retriever.serves': retriever=oracle: the retrieval server"
    with pytest.raises(ConfigError, match=refused):
        compose([*TINY_DATA, "retriever=remote", "retriever@retriever.serves=oracle"])


def test_oracle_precision_is_100_percent_on_answerable_questions(tiny_cfg, world, tmp_path):
    """A one-search loop (policy=retrieve_only) under retriever=oracle: the first passages of each test
    question's search are its gold passages that the index holds (all of them where the question is
    reachable: precision at |gold| is 1), at full coverage and at corpus.coverage=0.6, and nothing outside the
    index comes back; with k=1 the run's ret_precision (retrieved ids that are gold, over those retrieved;
    the answerable questions' mean) is 1."""
    data, test = world
    for coverage in (1.0, 0.6):
        out = tmp_path / f"k10_{coverage}"
        run(
            tiny_cfg(
                "policy=retrieve_only", "policy.k=10", "retriever=oracle", f"corpus.coverage={coverage}"
            ),
            out,
        )
        index = index_corpus(data, Evidence(coverage=coverage))
        records = read_records(out / "records.jsonl")
        assert len(records) == len(test) and any(r["reachable"] for r in records)
        for r in records:
            held = set(r["supporting_ids"]) & set(index.ids)
            assert set(r["retrieved_ids"]) <= set(index.ids), r["id"]
            assert set(r["retrieved_ids"][: len(held)]) == held, r["id"]
            assert not r["reachable"] or held == set(r["supporting_ids"]), r["id"]
        assert coverage == 1.0 or not all(r["reachable"] for r in records if r["answerable"])
    metrics = run(tiny_cfg("policy=retrieve_only", "policy.k=1", "retriever=oracle"), tmp_path / "k1")
    assert metrics["answerable=true"]["ret_precision"] == 1.0


# Each method's start, as conf/experiment/compare_synth/<row>.yaml configures it on the default world and the
# shipped tiny LM, shortened: fewer turns, four questions. R3-RAG's and APEX's executor start from the LM
# itself, not their cold starts (the same loops; the cold starts' demonstrations take ~15 s each to roll out).
STARTS = {
    "fixed_iter": ["policy.iterations=2"],
    "dapo_start": ["policy.max_turns=3"],
    "evorag_start": ["policy.max_turns=3"],
    "r3rag_start": ["policy.max_turns=3", "experiment.cold_start=null"],
    "apex_start": ["policy.hops=1", "experiment.apex_executor_sft=false"],
}
# and Stop-RAG itself, its Q-network trained on 4 questions' trajectories (no passage in any)
STOPRAG = ["policy.iterations=2", "policy.train_limit=4", "policy.samples=2", "policy.dev_limit=4",
           "policy.epochs=1"]  # fmt: skip


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache for the rows (the world's BM25 index is built once)."""
    return tmp_path_factory.mktemp("controls-cache")


@pytest.mark.parametrize("row, overrides", [*STARTS.items(), ("stoprag", STOPRAG)])
def test_every_methods_loop_answers_under_the_empty_retriever(row, overrides, shared_cache, tmp_path):
    cfg = compose(
        [
            "experiment=compare_synth",
            f"experiment/compare_synth={row}",
            "retriever=empty",
            *overrides,
            "eval.limit=4",
            f"cache_dir={shared_cache}",
        ]  # fmt: skip
    )
    metrics = run(cfg, tmp_path)
    records = read_records(tmp_path / "records.jsonl")
    assert len(records) == metrics["all"]["n"] == 4
    assert metrics["all"]["retrieval_count"] > 0  # the loop searched, and found nothing
    for r in records:
        assert r["retrieved_ids"] == [] and isinstance(r["prediction"], str)
        assert all(isinstance(r[m], float) for m in ("em", "f1", "acc")), r


def first_search(record: dict) -> dict | None:
    """The record's first search step with a query (a blank query has no hits, whatever the retriever)."""
    return next((s for s in record["steps"] if s["action"] == "search" and (s["query"] or "").strip()), None)


@pytest.mark.parametrize("row", ["fixed_iter", "dapo_start", "apex_start"])
def test_every_kind_of_loop_hands_the_oracle_its_questions(row, shared_cache, tmp_path):
    """Stop-RAG's pipeline, the multi-turn engine (DAPO, EVO-RAG, R3-RAG) and the prompting loops (APEX):
    each search names its question, so the first search of every answerable question starts with its gold
    passages (as many as the search keeps)."""
    cfg = compose(
        [
            "experiment=compare_synth",
            f"experiment/compare_synth={row}",
            "retriever=oracle",
            *STARTS[row],
            "eval.limit=4",
            f"cache_dir={shared_cache}",
        ]  # fmt: skip
    )
    run(cfg, tmp_path)
    searched = 0
    for r in read_records(tmp_path / "records.jsonl"):
        step, gold = first_search(r), set(r["supporting_ids"])
        if step is not None and r["answerable"]:
            top = step["retrieved_ids"][: min(cfg.policy.k, len(gold))]
            assert top and set(top) <= gold, (r["id"], step)
            searched += 1
    assert searched > 0


def test_the_world_teacher_searches_the_oracle_with_its_questions(tiny_cfg, world, tmp_path):
    data, test = world
    metrics = run(tiny_cfg("policy=teacher", "retriever=oracle"), tmp_path)
    records = read_records(tmp_path / "records.jsonl")
    for r in records:
        if r["answerable"] and r["steps"]:
            assert r["steps"][0]["retrieved_ids"][0] in r["supporting_ids"], r["id"]
    assert metrics["answerable=true"]["acc"] > 0.5
