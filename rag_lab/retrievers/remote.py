"""A retriever that queries a retrieval server: one index a node, every rank of a training job its client.

An 8-GPU node whose ranks each built their own retriever held nine copies of a 21M-passage index (eight
ranks and the runner). Instead, one ``rag_lab.serve`` process a node holds the index and each rank sends
it its batch (``retriever=remote``; ``conf/retriever/remote.yaml`` holds the command that starts it)::

    python -m rag_lab.serve retriever=e5 data=musique data.path=data/musique serve.port=8000
    python -m rag_lab.run retriever=remote retriever@retriever.serves=e5 data=musique data.path=...

The wire (``POST /v1/retrieve``): ``{"queries": [str], "k": int, "exclude": [[id]] | null, "timeout_s":
float | null}`` in, ``{"hits": [[[id, score], ...] per query]}`` out, the served retriever's own ``search``
answer; JSON writes a float as its shortest repr, which reads back to the same float, so a request's hits
equal the in-process retriever's answer to the same batch (ids, order and scores;
rag_lab/retrievers/coalesce.py says when the server merges requests and what that can change). ``timeout_s``
is how long the client waits: a request still queued after it is dropped, never searched, so a retry does not
make the server search twice.
``GET /v1/retriever`` says what the server serves: the retriever's resolved config and its corpus'
fingerprint (the hash every index cache is keyed by), and what its queue has done (``load``). The client
checks both when it is built (before anything trains): ``serves`` (the retriever config the run expects,
and its config hash records) must equal the server's, its cache dir, devices and progress bars aside, and the
run's corpus must be the server's, or the ids would name other passages. :meth:`check_settings` asks the
same at compose time, so ``python -m rag_lab.run`` stops before it launches any process.

A batch goes as requests of at most ``chunk`` queries, sent at once over a pool of ``connections``
kept-alive HTTP/1.1 connections (aiohttp's client, on an event loop of the client's own), and the hits are put
back in the batch's order. A server that does not answer (none started, killed, stuck) is one
``RagLabError`` naming ``retriever.url`` and the command to start it: every request has a timeout
(``timeout_s``) and a few retries (``retries``, ``backoff_s`` doubling; a server whose queue is full answers
503 and is asked again the same way), never a hang or a traceback.
"""

import asyncio
import json
import os
import threading
import urllib.parse
import weakref
from collections.abc import Collection, Sequence
from typing import Any

from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import NonNegative, NonNegativeInt, Positive, PositiveInt
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit

# Settings that differ between machines without changing a single hit.
LOCAL_KEYS = frozenset({"cache_dir", "show_progress", "index_device", "device", "_partial_", "_recursive_"})


def hits_to_wire(hits: list[list[Hit]]) -> list[list[list]]:
    """``search``'s answer as JSON-able ``[id, score]`` pairs.

    >>> hits_to_wire([[Hit("p1", 2.5)], []])
    [[['p1', 2.5]], []]
    """
    return [[[h.id, h.score] for h in per_query] for per_query in hits]


def hits_from_wire(wire: list[list[list]]) -> list[list[Hit]]:
    return [[Hit(str(pid), float(score)) for pid, score in per_query] for per_query in wire]


def comparable(config: Any) -> Any:
    """A retriever config less :data:`LOCAL_KEYS`, at every depth (a fusion's sub-retrievers)."""
    if isinstance(config, dict):
        return {k: comparable(v) for k, v in config.items() if k not in LOCAL_KEYS}
    if isinstance(config, list):
        return [comparable(v) for v in config]
    return config


def first_difference(ours: Any, theirs: Any, path: str = "") -> str | None:
    """The first key (dotted) whose value differs, with both values; None when they are equal.

    >>> first_difference({"k1": 1.5, "b": 0.75}, {"k1": 1.2, "b": 0.75})
    'k1: the server has 1.2, the run 1.5'
    """
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in theirs or key not in ours:
                side = "the run's config" if key not in theirs else "the server's"
                return f"{where}: only in {'the server' if key not in ours else side}"
            if (found := first_difference(ours[key], theirs[key], where)) is not None:
                return found
        return None
    return None if ours == theirs else f"{path or '<root>'}: the server has {theirs!r}, the run {ours!r}"


def check_servable(config: Any) -> None:
    """A one-line refusal of a retriever that reads each query's question (``takes_gold``: retriever=oracle,
    rag_lab/retrievers/controls.py): the wire carries query strings only, and the server merges requests from
    many ranks into one search, so the oracle runs in the run's own process."""
    from rag_lab.core.config import locate

    target = (_plain(config) or {}).get("_target_") if config is not None else None
    if target and getattr(locate(target), "takes_gold", False):
        raise RagLabError(
            "retriever=oracle: the retrieval server cannot serve it (a request carries queries, not the "
            "questions whose gold passages the oracle puts first): run it in-process, retriever=oracle"
        )


def base_url(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``; a RagLabError naming ``retriever.url`` if not http(s)."""
    parsed = urllib.parse.urlparse(str(url))
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise RagLabError(f"retriever.url: '{url}' is not an http(s) URL (e.g. http://127.0.0.1:8000)")
    return str(url).rstrip("/").removesuffix("/v1")


def start_hint(url: str) -> str:
    port = urllib.parse.urlparse(url).port or 80
    return (
        f"start it on this node with `python -m rag_lab.serve retriever=<the retriever of "
        f"retriever.serves> data=<this run's data> serve.port={port}` (conf/retriever/remote.yaml)"
    )


class Client:
    """JSON over HTTP/1.1 to one server, through a pool of kept-alive connections (aiohttp's), several
    requests at once, each with a timeout and retries; every failure is one RagLabError. A retriever's
    ``search`` is synchronous and aiohttp is not: the requests run on an event loop of the client's own, on a
    thread started at its first request (:class:`_Loop`), and the caller waits for their answers."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 60.0,
        retries: int = 2,
        backoff_s: float = 1.0,
        connections: int = 8,
    ):
        self.url = base_url(url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.answered = False  # whether the server ever answered: "stopped answering" rather than "none"
        self._loop = _Loop(connections, timeout_s)
        weakref.finalize(self, self._loop.close)

    def request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request: ``GET`` without a body, ``POST`` with one."""
        return self.requests(path, [body])[0]

    def requests(self, path: str, bodies: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
        """The answers to ``bodies``, sent at once (as many in flight as the pool has connections), in order.
        The first failure is raised, and the requests still in flight are cancelled (their connections
        closed: the server drops what it had queued of them)."""

        async def send_all() -> list[dict[str, Any]]:
            tasks = [asyncio.ensure_future(self._send(path, body)) for body in bodies]
            try:
                return await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()

        return self._loop.run(send_all())

    def close(self) -> None:
        self._loop.close()

    async def _send(self, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        import aiohttp

        error: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                session = self._loop.session()
                url = self.url + path
                call = session.get(url) if body is None else session.post(url, json=body)
                async with call as response:
                    status, payload = response.status, await response.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                error = e  # refused, reset, timed out, cut short (the server died while it wrote)
                continue
            self.answered = True
            if status == 503:  # its queue is full: nothing was queued, so asking again is safe
                error = _Busy(_detail(payload))
            elif status >= 400:  # the server answered: retrying would not change it
                raise RagLabError(f"retriever.url: {self.url}{path} answered {status}: {_detail(payload)}")
            else:
                try:
                    return json.loads(payload)
                except ValueError as e:  # unreadable
                    error = e
        raise self._failure(error)

    def _failure(self, error: BaseException | None) -> RagLabError:
        tries = f"{self.retries} retries, timeout {self.timeout_s:g} s"
        if isinstance(error, _Busy):
            return RagLabError(
                f"retriever.url: the retrieval server at {self.url} stayed busy ({error}; {tries}): give "
                "it a larger serve.max_queue, or send fewer queries at once (retriever.chunk, "
                "retriever.connections)"
            )
        what = "stopped answering" if self.answered else "does not answer"
        return RagLabError(
            f"retriever.url: the retrieval server at {self.url} {what} ({_reason(error)}; {tries}): "
            f"{start_hint(self.url)}"
        )


class _Busy(Exception):
    """The server's queue was full (503)."""


class _Loop:
    """An event loop on a daemon thread and its aiohttp session (the connection pool), both made on first use;
    :meth:`close` (called when the client is collected, or at exit) closes the connections and the loop."""

    def __init__(self, connections: int, timeout_s: float):
        self.connections = connections
        self.timeout_s = timeout_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._session = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self, coroutine):
        with self._lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=_run_forever, args=(self.loop,), daemon=True)
                self._thread.start()
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def session(self):
        """The session (on the loop's thread). A request's clock: connecting, and each wait for the server's
        bytes; not the wait for a free connection of the pool."""
        import aiohttp

        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s)
            connector = aiohttp.TCPConnector(limit=self.connections)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._session

    def close(self) -> None:
        with self._lock:
            loop, self.loop = self.loop, None
        if loop is None:
            return
        # (on the loop's own thread, as a collected client may be, waiting for the loop would never end)
        if self._session is not None and threading.current_thread() is not self._thread:
            asyncio.run_coroutine_threadsafe(self._session.close(), loop).result(timeout=5)
        self._session = None
        loop.call_soon_threadsafe(loop.stop)


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_forever()
    loop.close()


def _reason(error: BaseException | None) -> str:
    import aiohttp

    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, aiohttp.ClientConnectorError) and error.os_error.errno:
        return os.strerror(error.os_error.errno)  # "Connection refused"
    return str(error) or type(error).__name__


def _detail(payload: bytes) -> str:
    try:
        return str(json.loads(payload)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return payload.decode(errors="replace")[:300] or "no detail"


def check_served(client: Client, serves: Any) -> dict[str, Any]:
    """What the server at ``client.url`` serves (``GET /v1/retriever``), checked against ``serves``."""
    info = client.request("/v1/retriever")
    if serves is not None:
        found = first_difference(comparable(_plain(serves)), comparable(info.get("config")))
        if found is not None:
            raise RagLabError(
                f"retriever.serves.{found} (the server at {client.url} serves another retriever: start it "
                "with the retriever this run names, or set retriever.serves to the server's)"
            )
    return info


def _plain(node: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig | ListConfig) else node


class RemoteRetriever:
    def __init__(
        self,
        corpus: Corpus,
        # the node's server (python -m rag_lab.serve retriever=... serve.port=...)
        url: str = "http://127.0.0.1:8000",
        # the retriever config the server must serve (null: any; the run's config then does not say which)
        serves: Any = None,
        # seconds a request may wait for the server (queued, then searched) before it counts as failed; the
        # server drops a request still queued after it, so a retry is never searched twice
        timeout_s: Positive = 60.0,
        retries: NonNegativeInt = 2,
        # seconds before the first retry; doubled each time
        backoff_s: NonNegative = 1.0,
        # the most queries a request carries: a larger batch goes as several requests at once
        chunk: PositiveInt = 64,
        # the most requests in flight at once, each on a kept-alive connection
        connections: PositiveInt = 8,
    ):
        self.corpus = corpus
        self.chunk = chunk
        self.client = Client(url, timeout_s, retries, backoff_s, connections)
        self.served = check_served(self.client, serves)
        if self.served.get("corpus") != corpus.fingerprint:
            raise RagLabError(
                f"retriever.url: the server at {self.client.url} searches another corpus ("
                f"{self.served.get('passages')} passages, fingerprint {self.served.get('corpus')}) than this "
                f"run's ({len(corpus)} passages, {corpus.fingerprint}): start it with this run's data"
            )

    def search(
        self, queries: Sequence[str], k: int, exclude: Sequence[Collection[str]] | None = None
    ) -> list[list[Hit]]:
        """The batch in requests of ``chunk`` queries, sent at once; the hits put back in order."""
        queries, exclude = list(queries), None if exclude is None else list(exclude)
        bodies = [
            {
                "queries": queries[start : start + self.chunk],
                "k": int(k),
                "exclude": None
                if exclude is None
                else [sorted(skip) for skip in exclude[start : start + self.chunk]],
                # the server's deadline: past it, nobody waits for the answer
                "timeout_s": self.client.timeout_s,
            }
            for start in range(0, len(queries), self.chunk)
        ]
        hits: list[list[Hit]] = []
        for body, answer in zip(bodies, self.client.requests("/v1/retrieve", bodies), strict=True):
            part = hits_from_wire(answer["hits"])
            if len(part) != len(body["queries"]):
                raise RagLabError(
                    f"retriever.url: the server at {self.client.url} answered {len(part)} hit lists for "
                    f"{len(body['queries'])} queries"
                )
            hits.extend(part)
        return hits

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """At compose time (before the runner launches anything): a server answers at ``url`` and serves
        ``serves``. The corpus is checked when the retriever is built, with the run's corpus."""
        try:
            check_servable(s.get("serves"))
        except RagLabError as e:
            return [("serves", str(e))]
        client = None
        try:
            client = Client(s["url"], min(float(s["timeout_s"]), 10.0), s["retries"], s["backoff_s"])
            check_served(client, s.get("serves"))
        except RagLabError as e:
            key, _, why = str(e).partition(": ")
            return [(key.removeprefix("retriever."), why)]
        finally:
            if client is not None:
                client.close()
        return []
