"""The FlashRAG bench (experiments/bench_vs_flashrag.py) without FlashRAG: the index it hands FlashRAG,
queried the way FlashRAG 0.1.2's BM25 retriever queries it, ranks and scores as our retriever does; and
each difference between the two sides' answers gets its cause."""

import sys
from pathlib import Path

import bm25s
import pytest
import Stemmer

from rag_lab.data.base import Corpus
from rag_lab.retrievers.bm25 import BM25Retriever

sys.path.insert(0, str(Path(__file__).parent.parent / "experiments"))
import bench_vs_flashrag as bench  # noqa: E402

CORPUS = Corpus(
    ["a", "b", "c", "d"],
    ["Ada Lovelace", "The Directors", "Film Festival", "Harbor"],
    [
        "Ada directed two films and directs a festival of films.",
        "The directors of the city directed many films; a director directs.",
        "A festival shows films.",
        "Boats rest in the harbor.",
    ],
)


def test_flashrag_reads_our_exported_index_with_our_ranking_and_scores(tmp_path):
    ours = BM25Retriever(CORPUS, show_progress=False, **bench.BM25_LIKE_FLASHRAG)
    bench.export_index(ours, tmp_path)
    index = bm25s.BM25.load(str(tmp_path), mmap=True, load_corpus=True)
    query = "Which directors directed the films?"
    # FlashRAG's query side: bm25s.tokenize with its default (English) stop words and the Snowball stemmer
    tokens = bm25s.tokenize([query], stemmer=Stemmer.Stemmer("english"), show_progress=False)
    docs, scores = index.retrieve(tokens, k=3, show_progress=False)
    hits = ours.search([query], 3)[0]
    assert [d["id"] for d in docs[0]] == [h.id for h in hits] == ["b", "a", "c"]
    assert list(scores[0]) == pytest.approx([h.score for h in hits], rel=1e-5)
    assert docs[0][0]["contents"] == "The Directors\n" + CORPUS.texts[1]


def item(ids, scores, prompt="p", answer="x"):
    return {
        "retrieved": [ids],
        "scores": [scores],
        "prompts": [prompt],
        "answers": [answer],
        "prediction": answer,
    }


@pytest.mark.parametrize(
    ("ours", "theirs", "cause"),
    [
        (item(["a", "b"], [2.0, 1.0]), item(["a", "c"], [2.0, 1.0]), "BM25 ties ordered differently"),
        (item(["a", "b"], [2.0, 1.0]), item(["a", "c"], [2.0, 0.5]), "different passages (different scores)"),
        (item(["a"], [1.0], prompt="Q: x"), item(["a"], [1.0], prompt="Q: y"), "prompts differ"),
        (
            item(["a"], [1.0], answer="Theo Zistad"),
            item(["a"], [1.0], answer="Theo"),
            "same prompts, FlashRAG's",
        ),
        (
            item(["a"], [1.0], answer="Theo"),
            item(["a"], [1.0], answer="Rao"),
            "same prompts, decoding differs",
        ),
    ],
)
def test_each_difference_gets_its_cause(ours, theirs, cause):
    assert bench.why(ours, theirs)[0].startswith(cause)


def rounds(retrieved, answers):
    return {"retrieved": retrieved, "scores": [[1.0]] * 2, "prompts": ["p", "q"], "answers": answers}


def test_a_difference_is_traced_to_the_first_round_where_the_sides_part():
    ours = rounds([["a"], ["b"]], ["Theo Zistad", "y"])
    # round 2 retrieved other passages because round 1's answer (in its query) was cut short
    assert (
        bench.why(ours, rounds([["a"], ["c"]], ["Theo", "w"]))[0]
        == "same prompts, FlashRAG's answer cut short"
    )
    assert bench.why(ours, rounds([["a"], ["c"]], ["Theo Zistad", "w"]))[0].startswith("BM25 ties")


def test_prefill_padding_per_side():
    """FlashRAG pads a batch to its longest prompt; our engine reads a 1-token and a 3-token prompt apart."""
    tokenizer = str(Path(__file__).parent.parent / "rag_lab" / "checkpoints" / "tiny_lm" / "tokenizer")
    items = {"items": [{"prompts": ["Ada"]}, {"prompts": ["Ada Ada Ada"]}]}
    assert bench.padding(items, items, tokenizer) == "1.00 / 1.50"
