"""One process of test_dense_node.py's launched job (``torchrun --nproc_per_node 2 dense_node.py <encoder dir>
<cache dir> <out dir>``): the dense retriever over 8 passages, 3 a shard, cached in the shared cache dir, its
encoder counting the passages it encodes. Writes ``<out>/rank<local rank>.json``: the node variables it saw,
the passages it encoded, its hits."""

import json
import os
import sys
from pathlib import Path

from rag_lab.data.base import Corpus
from rag_lab.retrievers.dense import DenseRetriever, Encoder

TEXTS = [
    "Ada was born in London.",
    "Paris is a city.",
    "The film was directed by Ada.",
    "London is a city.",
    "Who directed the film?",
    "Where was Ada born?",
    "Paris",
    "a city in London",
]
CORPUS = Corpus([f"p{i}" for i in range(len(TEXTS))], [f"T{i}" for i in range(len(TEXTS))], TEXTS)
QUERIES = ["where was ada born", "the film was directed by ada", "paris city", "london"]


def main(encoder_dir: str, cache_dir: str, out: str) -> None:
    encoder, encoded = Encoder(encoder_dir), []
    encode = encoder.encode

    def counting(texts, prefix="", show_progress=False):
        encoded.extend(texts)
        return encode(texts, prefix, show_progress)

    encoder.encode = counting
    retriever = DenseRetriever(CORPUS, encoder, shard_size=3, cache_dir=cache_dir, show_progress=False)
    passages = list(encoded)
    hits = retriever.search(QUERIES, 4)
    result = {
        "node": [os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")],
        "passages": passages,
        "hits": [[[h.id, h.score] for h in per_query] for per_query in hits],
    }
    Path(out, f"rank{os.environ.get('LOCAL_RANK', 0)}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:4])
