"""RRF on hand-made rankings; cross-encoder reranking with a tiny random model built here."""

import pytest
import torch

from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit
from rag_lab.retrievers.fusion import RRFRetriever, rrf
from rag_lab.retrievers.rerank import CrossEncoderReranker

CORPUS = Corpus(
    ["a", "b", "c", "d"], ["A", "B", "C", "D"], ["ada london", "paris city", "film ada", "city london"]
)


class Fixed:
    """A retriever with fixed best-first rankings (honours k and exclude)."""

    def __init__(self, ranking: list[str]):
        self.ranking = ranking

    def search(self, queries, k, exclude=None):
        exclude = exclude or [()] * len(queries)
        return [[Hit(p, 1.0) for p in self.ranking if p not in ex][:k] for ex in exclude]


def test_rrf_hand_computed():
    # bm25: a b c ; dense: c a d ; rrf_k = 60
    fused = RRFRetriever(CORPUS, {"bm25": Fixed(["a", "b", "c"]), "dense": Fixed(["c", "a", "d"])}, rrf_k=60)
    hits = fused.search(["q"], k=4)[0]
    expected = {"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63}
    assert [h.id for h in hits] == ["a", "c", "b", "d"]
    assert [h.score for h in hits] == pytest.approx([expected[h.id] for h in hits])
    # Exclusion is pushed down to every sub-retriever; weights scale each list.
    assert [h.id for h in fused.search(["q"], 2, exclude=[{"a"}])[0]] == ["c", "b"]
    weighted = rrf([[Hit("a", 0)], [Hit("b", 0)]], rrf_k=60, weights=[1.0, 2.0])
    assert [h.id for h in weighted] == ["b", "a"]


def test_rrf_builds_partials_with_the_corpus():
    built = []

    def make(corpus):
        built.append(corpus)
        return Fixed(["d"])

    RRFRetriever(CORPUS, {"x": make})
    assert built == [CORPUS]


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    path = tmp_path_factory.mktemp("tiny-ce")
    words = ["ada", "london", "paris", "city", "film", "where"]
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(path / "vocab.txt"))
    # transformers 5 ignores `vocab_file=`: every word became [UNK] and the scores tied by length
    assert tokenizer.tokenize("where ada") == ["where", "ada"]
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    # weights at 10x BERT's default scale: logits ~1e-2 apart rather than ~1e-5 (the margin below)
    config = BertConfig(
        vocab_size=11,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=1,
        initializer_range=0.2,
    )
    BertForSequenceClassification(config).save_pretrained(path)
    return str(path)


def test_reranker_orders_candidates_by_cross_encoder_score(tiny_cross_encoder):
    reranker = CrossEncoderReranker(
        CORPUS, Fixed(["a", "b", "c", "d"]), model=tiny_cross_encoder, depth=3, batch_size=2
    )
    hits = reranker.search(["where ada", "paris"], k=2)
    for query, got in zip(["where ada", "paris"], hits, strict=True):
        scores = reranker.score(
            [(query, CORPUS.get(p).contents) for p in "abc"]
        )  # only the top 3 are reranked
        # far apart next to float rounding: the order below is no near-tie's luck
        assert min(abs(x - y) for i, x in enumerate(scores) for y in scores[i + 1 :]) > 1e-3
        want = sorted(zip("abc", scores, strict=True), key=lambda t: -t[1])[:2]
        assert [(h.id, h.score) for h in got] == [(p, pytest.approx(s, abs=1e-6)) for p, s in want]
