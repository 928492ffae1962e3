"""Cross-encoder reranking of a base retriever's top ``depth`` (e.g. ``BAAI/bge-reranker-v2-m3``).

Stop-RAG's pipeline retrieves 10, reranks, keeps 1: ``retriever=rerank retriever.depth=10`` and
search with k=1. Pairs are scored in batches with the model's relevance logit.
"""

from collections.abc import Callable, Collection, Sequence

import torch

from rag_lab.core.devices import local_gpu
from rag_lab.core.ranges import PositiveInt
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit, Retriever
from rag_lab.retrievers.dense import resolve_model
from rag_lab.retrievers.fusion import build


class CrossEncoderReranker:
    def __init__(
        self,
        corpus: Corpus,
        # the first-stage retriever (a retriever config) whose top depth passages are reranked
        base: Retriever | Callable[..., Retriever],
        # the cross-encoder: a hub name (in the local HF cache) or a local model directory
        model: str = "BAAI/bge-reranker-v2-m3",
        # passages of the base retriever reranked per query (k of them if a search asks for more)
        depth: PositiveInt = 10,
        # (query, passage) pairs scored together
        batch_size: PositiveInt = 32,
        # tokens of a (query, passage) pair the cross-encoder reads, at most
        max_length: PositiveInt = 512,
        # the reranker's device, e.g. cuda:0 (null: the GPU when there is one, else the CPU)
        device: str | None = None,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.corpus = corpus
        self.base = build(corpus, base)
        self.depth = depth
        self.batch_size = batch_size
        path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = device or (local_gpu() if torch.cuda.is_available() else "cpu")
        self.model = AutoModelForSequenceClassification.from_pretrained(path).to(self.device).eval()
        self.max_length = max_length

    @torch.inference_mode()
    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """The relevance logit of each (query, passage) pair (the last logit for 2-label heads)."""
        scores: list[float] = []
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start : start + self.batch_size]
            enc = self.tokenizer(
                [q for q, _ in chunk],
                [p for _, p in chunk],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            scores += self.model(**enc).logits[:, -1].float().cpu().tolist()
        return scores

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        candidates = self.base.search(queries, max(k, self.depth), exclude)
        pairs = [
            (q, self.corpus.get(h.id).contents)
            for q, hits in zip(queries, candidates, strict=True)
            for h in hits
        ]
        scores = iter(self.score(pairs))
        out = []
        for hits in candidates:
            rescored = [Hit(h.id, next(scores)) for h in hits]
            out.append(sorted(rescored, key=lambda h: -h.score)[:k])
        return out
