"""A retriever that queries a retrieval server: one index a node, every rank of a training job its client.

An 8-GPU node whose ranks each built their own retriever held nine copies of a 21M-passage index (eight
ranks and the runner). Instead, one ``rag_lab.serve`` process a node holds the index and each rank sends
it its batch (``retriever=remote``; ``conf/retriever/remote.yaml`` holds the command that starts it)::

    python -m rag_lab.serve retriever=e5 data=musique data.path=data/musique serve.port=8000
    python -m rag_lab.run retriever=remote retriever@retriever.serves=e5 data=musique data.path=...

The wire (``POST /v1/retrieve``): ``{"queries": [str], "k": int, "exclude": [[id]] | null}`` in,
``{"hits": [[[id, score], ...] per query]}`` out, the served retriever's own ``search`` answer; JSON
writes a float as its shortest repr, which reads back to the same float, so a client's hits equal the
in-process retriever's (ids, order and scores). ``GET /v1/retriever`` says what the server serves: the
retriever's resolved config and its corpus' fingerprint (the hash every index cache is keyed by). The
client checks both when it is built (before anything trains): ``serves`` (the retriever config the run
expects, and its config hash records) must equal the server's, its cache dir and progress bars aside,
and the run's corpus must be the server's, or the ids would name other passages. :meth:`check_settings`
asks the same at compose time, so ``python -m rag_lab.run`` stops before it launches any process.

A server that does not answer (none started, killed, stuck) is one ``RagLabError`` naming
``retriever.url`` and the command to start it: every request has a timeout (``timeout_s``) and a few
retries (``retries``, ``backoff_s`` doubling), never a hang or a traceback. Hand-written on the standard
library (urllib), as the ``openai`` generator is: no HTTP client is among our dependencies.
"""

import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Collection, Sequence
from typing import Any

from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import NonNegative, NonNegativeInt, Positive
from rag_lab.data.base import Corpus
from rag_lab.retrievers.base import Hit

# Settings that differ between machines without changing a single hit.
LOCAL_KEYS = frozenset({"cache_dir", "show_progress", "_partial_", "_recursive_"})


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
    """JSON over HTTP to one server, with a timeout and retries; every failure is one RagLabError."""

    def __init__(self, url: str, timeout_s: float = 60.0, retries: int = 2, backoff_s: float = 1.0):
        self.url, self.timeout_s, self.retries, self.backoff_s = base_url(url), timeout_s, retries, backoff_s
        self.answered = False  # whether the server ever answered: "stopped answering" rather than "none"

    def request(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    reply = json.loads(response.read())
                self.answered = True
                return reply
            except urllib.error.HTTPError as e:  # the server answered: retrying would not change it
                self.answered = True
                raise RagLabError(
                    f"retriever.url: {self.url}{path} answered {e.code}: {_detail(e)}"
                ) from None
            except (OSError, http.client.HTTPException, ValueError) as e:
                # refused, reset, timed out; a reply cut short or unreadable (the server died while it wrote)
                error: Exception = e
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2**attempt)
        reason = str(getattr(error, "reason", None) or error) or type(error).__name__
        what = "stopped answering" if self.answered else "does not answer"
        raise RagLabError(
            f"retriever.url: the retrieval server at {self.url} {what} ({reason}; {self.retries} retries, "
            f"timeout {self.timeout_s:g} s): {start_hint(self.url)}"
        )


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read())["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError, OSError):
        return str(error.reason)


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
        # seconds a request may take (a batch searched on the server) before it counts as failed
        timeout_s: Positive = 60.0,
        retries: NonNegativeInt = 2,
        # seconds before the first retry; doubled each time
        backoff_s: NonNegative = 1.0,
    ):
        self.corpus, self.client = corpus, Client(url, timeout_s, retries, backoff_s)
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
        body = {
            "queries": list(queries),
            "k": int(k),
            "exclude": None if exclude is None else [sorted(skip) for skip in exclude],
        }
        hits = hits_from_wire(self.client.request("/v1/retrieve", body)["hits"])
        if len(hits) != len(queries):
            raise RagLabError(
                f"retriever.url: the server at {self.client.url} answered {len(hits)} hit lists for "
                f"{len(queries)} queries"
            )
        return hits

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """At compose time (before the runner launches anything): a server answers at ``url`` and serves
        ``serves``. The corpus is checked when the retriever is built, with the run's corpus."""
        try:
            client = Client(s["url"], min(float(s["timeout_s"]), 10.0), s["retries"], s["backoff_s"])
            check_served(client, s.get("serves"))
        except RagLabError as e:
            key, _, why = str(e).partition(": ")
            return [(key.removeprefix("retriever."), why)]
        return []
