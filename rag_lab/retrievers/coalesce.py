"""Concurrent searches merged into one batched ``search`` call: the retrieval server's queue
(rag_lab/serve.py, issue 72).

Every process of a node sends its batches to the node's one server. While a search runs, the requests that
arrive wait in a queue, and the next search takes all of them at once (up to ``max_batch`` queries; a larger
request goes alone, whole), then hands each request its own hits. One batched call costs little more than a
lone one (one forward pass of the query encoder, one faiss matrix product), so N waiting clients are served in
about the time of one, where a server that searched each request on its own would take N times as long.

- Requests with the same ``k`` share a call; another ``k`` gets a call of its own in the same round (a
  retriever's top k is its answer for that k). A request searched alone is the retriever's answer to exactly
  that call (ids, order and scores). Merged, a dense retriever's query embeddings come from a larger batch,
  and a CPU's or GPU's matrix kernels round by the batch's shape: scores may then differ in the last float
  bits (1e-7 for MiniLM here), as they already do in one process between batches; BM25 scores each query
  alone.
- A request whose client went away (its handler cancelled, aiohttp's ``handler_cancellation``) or whose
  deadline passed before its search began is dropped, never searched: a client that timed out and retries
  does not make the server search the same queries twice.
- The queue is bounded (``max_queue`` queries waiting): a request beyond it is refused at once (:class:`Busy`,
  HTTP 503) and its client retries after its backoff.
- Searches run one at a time on one worker thread (retrievers are not thread-safe), so the event loop goes on
  taking requests meanwhile.

Hand-written: Ray Serve's ``@serve.batch`` and Triton's dynamic batcher do this inside their own servers;
neither is a dependency here, and the merge is a few lines over asyncio.
"""

import asyncio
import math
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rag_lab.retrievers.base import Hit

Search = Callable[[Sequence[str], int, Sequence[Collection[str]] | None], list[list[Hit]]]


class Busy(Exception):
    """The queue is full: the request was not queued (HTTP 503; the client retries)."""


class Expired(Exception):
    """The request's deadline passed before its search began: it was dropped (HTTP 504)."""


@dataclass
class Pending:
    queries: list[str]
    k: int
    exclude: list[set[str]] | None
    # event-loop time after which the request is not searched (its client has given up)
    deadline: float
    future: asyncio.Future


@dataclass
class Stats:
    """What the queue did, for ``GET /v1/retriever`` (and experiments/bench_serve.py)."""

    # how many search calls took each number of queries
    batches: Counter = field(default_factory=Counter)
    requests: int = 0
    cancelled: int = 0
    expired: int = 0
    refused: int = 0

    def summary(self) -> dict:
        calls, queries = self.batches.total(), sum(size * n for size, n in self.batches.items())
        return {
            "requests": self.requests,
            "searches": calls,
            "queries": queries,
            "mean_batch": round(queries / calls, 2) if calls else 0,
            "max_batch": max(self.batches, default=0),
            # queries a call: calls (JSON keys are strings)
            "batch_sizes": {str(size): n for size, n in sorted(self.batches.items())},
            "cancelled": self.cancelled,
            "expired": self.expired,
            "refused": self.refused,
        }


class Coalescer:
    def __init__(self, search: Search, max_batch: int = 256, max_queue: int = 8192):
        self.search = search
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.waiting: deque[Pending] = deque()
        self.queued = 0  # queries waiting
        self.stats = Stats()
        self._wake = asyncio.Event()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="rag_lab-search")

    async def submit(
        self, queries: list[str], k: int, exclude: list[set[str]] | None, timeout_s: float | None = None
    ) -> list[list[Hit]]:
        """The hits of ``queries``, from the next search that takes them. :class:`Busy` when the queue is
        full, :class:`Expired` when ``timeout_s`` seconds pass before their search begins."""
        if self.waiting and self.queued + len(queries) > self.max_queue:
            self.stats.refused += 1
            raise Busy(f"{self.queued} queries are waiting (serve.max_queue={self.max_queue})")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s if timeout_s else math.inf
        pending = Pending(list(queries), k, exclude, deadline, loop.create_future())
        self.waiting.append(pending)
        self.queued += len(queries)
        self.stats.requests += 1
        self._wake.set()
        try:
            return await pending.future
        finally:  # cancelled (the client went away): the queue drops it when its turn comes
            pending.future.cancel()

    async def run(self) -> None:
        """The one loop that searches: every round takes what waits (:meth:`take`), until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while batch := self.take(loop.time()):
                    await self._search(batch)
        finally:
            self._worker.shutdown(wait=False, cancel_futures=True)

    def take(self, now: float) -> list[Pending]:
        """The requests of the next search, oldest first, up to ``max_batch`` queries (at least one request);
        the cancelled and expired ones on the way are dropped."""
        batch, size = [], 0
        while self.waiting:
            pending = self.waiting[0]
            if batch and size + len(pending.queries) > self.max_batch:
                break
            self.waiting.popleft()
            self.queued -= len(pending.queries)
            if pending.future.done():
                self.stats.cancelled += 1
            elif now > pending.deadline:
                self.stats.expired += 1
                pending.future.set_exception(Expired("its deadline passed while it waited: not searched"))
            else:
                batch.append(pending)
                size += len(pending.queries)
        return batch

    async def _search(self, batch: list[Pending]) -> None:
        """One ``search`` call a distinct k of ``batch``, on the worker thread; each request's share of the
        hits to its future (unless it was cancelled meanwhile)."""
        loop = asyncio.get_running_loop()
        for k in dict.fromkeys(p.k for p in batch):
            group = [p for p in batch if p.k == k]
            queries = [q for p in group for q in p.queries]
            exclude = None  # as a lone request sent it, where no request excludes anything
            if any(p.exclude is not None for p in group):
                exclude = [skip for p in group for skip in (p.exclude or [set()] * len(p.queries))]
            try:
                hits = await loop.run_in_executor(self._worker, self.search, queries, k, exclude)
            except Exception as e:  # noqa: BLE001 - the retriever's failure goes to each request of the call
                for p in group:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
            self.stats.batches[len(queries)] += 1
            start = 0
            for p in group:
                if not p.future.done():
                    p.future.set_result(hits[start : start + len(p.queries)])
                start += len(p.queries)
