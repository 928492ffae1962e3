"""An OpenAI-compatible HTTP server around any generator, and a retrieval server around any retriever.

    python -m rag_lab.serve generator=teacher serve.port=8000
    python -m rag_lab.serve generator=hf generator.model=/path/to/model serve.host=0.0.0.0
    python -m rag_lab.serve retriever=e5 data=musique data.path=data/musique serve.port=8001

It serves what it is given: a generator, a retriever, or both (``generator=`` and ``retriever=``).

Generation: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (the
fields rag_lab's ``openai`` backend and common clients send: prompt / messages, max_tokens,
temperature, top_p, n, stop, seed, and vLLM's ``include_stop_str_in_output``).

Retrieval (``retriever=<name>``, over ``data``'s corpus, the runner's data by default):
``POST /v1/retrieve`` takes ``{"queries": [...], "k": int, "exclude": [[id, ...], ...] | null}`` and
answers ``{"hits": [[[id, score], ...], ...]}``, the retriever's own batched ``search``; ``GET
/v1/retriever`` says what is served (the retriever's resolved config, the corpus' fingerprint and size).
One such process a node holds the node's one copy of the index (a faiss index read with mmap), and every
rank of a training job queries it through ``retriever=remote`` (rag_lab/retrievers/remote.py, which
defines the wire and checks the config and corpus it meets).

Bound to 127.0.0.1 unless ``serve.host`` says otherwise, so a judge, a black-box generator or a node's
index can be shared between runs and ranks on one machine.

Asynchronous (aiohttp, issue 72): HTTP/1.1 with keep-alive (a client's connection serves its every request),
one event loop taking requests while the backends work on threads of their own. Retrieval requests are
queued and coalesced (rag_lab/retrievers/coalesce.py): the requests that arrive while a search runs are merged
into the next batched ``search`` call (up to ``serve.max_batch`` queries), and each gets its own hits back; a
request whose client went away, or whose ``timeout_s`` (the client's, sent with it) passed while it waited, is
dropped unsearched; the queue holds at most ``serve.max_queue`` queries (beyond: 503, and the client retries).
The query encoder sits where ``retriever.encoder.device`` says (a GPU of its own, away from training rank
0's), the index where ``retriever.index_device`` says. Generation runs one ``generate`` call at a time on a
thread of its own (backends are not thread-safe), beside retrieval. aiohttp rather than the standard
library's threading server (HTTP/1.0, a connection a request, a thread a request): keep-alive, an event loop
that holds thousands of waiting requests, and a handler cancelled when its client disconnects, which is what
a queue that drops abandoned work needs.
"""

import asyncio
import json
import logging
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from rag_lab.generators.base import Completion, Generator, Sampling
from rag_lab.retrievers.base import Retriever
from rag_lab.retrievers.coalesce import Busy, Coalescer, Expired
from rag_lab.retrievers.remote import hits_to_wire

log = logging.getLogger("rag_lab.serve")


def sampling_from(body: dict[str, Any]) -> Sampling:
    stop = body.get("stop") or ()
    return Sampling(
        n=int(body.get("n", 1)),
        temperature=float(body.get("temperature", 1.0)),
        top_p=float(body.get("top_p", 1.0)),
        max_new_tokens=int(body.get("max_tokens") or 128),
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        include_stop=bool(body.get("include_stop_str_in_output", False)),
        seed=body.get("seed"),
    )


def _choice(i: int, c: Completion, chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"index": i, "finish_reason": c.finish_reason}
    if chat:
        out["message"] = {"role": "assistant", "content": c.text}
    else:
        out["text"] = c.text
    return out


def retrieve_request(body: dict[str, Any]) -> tuple[list[str], int, list[set[str]] | None, float | None]:
    """``POST /v1/retrieve``'s body checked: queries, k, exclude (a set a query, or None) and the client's
    ``timeout_s`` (None: none); a ValueError says what is wrong (HTTP 400)."""
    queries, k, exclude, timeout_s = body["queries"], body["k"], body.get("exclude"), body.get("timeout_s")
    if not (isinstance(queries, list) and all(isinstance(q, str) for q in queries)):
        raise ValueError("'queries' must be a list of strings")
    if not isinstance(k, int) or isinstance(k, bool):
        raise ValueError("'k' must be an integer")
    if exclude is not None and not (isinstance(exclude, list) and len(exclude) == len(queries)):
        raise ValueError("'exclude' must be null or one list of ids per query")
    if timeout_s is not None and not (isinstance(timeout_s, int | float) and timeout_s > 0):
        raise ValueError("'timeout_s' must be null or a positive number of seconds")
    return queries, k, None if exclude is None else [set(ids) for ids in exclude], timeout_s


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


class Server:
    """The HTTP server: bound when built (``server_address``), serving from :meth:`serve_forever` on the
    calling thread until :meth:`shutdown` (from another thread), as the standard library's servers do."""

    def __init__(
        self,
        generator: Generator | None,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        retriever: Retriever | None = None,
        retriever_info: dict[str, Any] | None = None,
        max_batch: int = 256,
        max_queue: int = 8192,
    ):
        # every process of a node may connect at once
        self.socket = socket.create_server((host, port), backlog=1024)
        self.server_address = self.socket.getsockname()
        self.generator = generator
        self.model_name = model_name
        self.retriever = retriever
        self.retriever_info = retriever_info
        self.coalescer = None if retriever is None else Coalescer(retriever.search, max_batch, max_queue)
        self._generation = ThreadPoolExecutor(1, thread_name_prefix="rag_lab-generate")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._serving = threading.Event()
        self._done = threading.Event()

    def serve_forever(self) -> None:
        asyncio.run(self._serve())

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` (called from another thread) and wait until it returned."""
        if self._serving.wait(timeout=30) and self._loop is not None and not self._done.is_set():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._done.wait()

    def open_connections(self) -> int:
        """How many client connections are open now (kept alive between requests)."""
        return len(self._runner.server.connections) if self._runner and self._runner.server else 0

    def server_close(self) -> None:
        self.socket.close()
        self._generation.shutdown(wait=False, cancel_futures=True)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{path:.*}", self._dispatch)
        # handler_cancellation: the handler of a client that disconnected is cancelled (its search dropped)
        runner = self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        await web.SockSite(runner, self.socket).start()
        coalescing = asyncio.create_task(self.coalescer.run()) if self.coalescer else None
        self._serving.set()
        try:
            await self._stop.wait()
        finally:
            if coalescing is not None:
                coalescing.cancel()
            await runner.cleanup()
            self._done.set()

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        routes = {
            ("GET", "/v1/models"): (self.generator, self.models),
            ("POST", "/v1/completions"): (self.generator, lambda r: self.complete(r, chat=False)),
            ("POST", "/v1/chat/completions"): (self.generator, lambda r: self.complete(r, chat=True)),
            ("GET", "/v1/retriever"): (self.retriever, self.describe),
            ("POST", "/v1/retrieve"): (self.retriever, self.retrieve),
        }
        serves, handler = routes.get((request.method, request.path.rstrip("/")), (None, None))
        if serves is None:
            return _error(404, f"no route {request.path} on this server{self._serves()}")
        try:
            return await handler(request)
        except (KeyError, ValueError, TypeError) as e:
            return _error(400, f"bad request: {e}")
        except Exception as e:  # noqa: BLE001 - a backend's failure answers 500 instead of a dropped connection
            log.exception("%s failed", request.path)
            return _error(500, f"{type(e).__name__}: {e}")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def describe(self, request: web.Request) -> web.Response:
        """What is served (checked by every client) and what the queue has done so far."""
        return web.json_response((self.retriever_info or {}) | {"load": self.coalescer.stats.summary()})

    async def retrieve(self, request: web.Request) -> web.Response:
        queries, k, exclude, timeout_s = retrieve_request(json.loads(await request.read() or b"{}"))
        if not queries:
            return web.json_response({"hits": []})
        try:
            hits = await self.coalescer.submit(queries, k, exclude, timeout_s)
        except Busy as e:
            return _error(503, f"busy: {e}")
        except Expired as e:
            return _error(504, f"expired: {e}")
        return web.json_response({"hits": hits_to_wire(hits)})

    async def complete(self, request: web.Request, chat: bool) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        loop = asyncio.get_running_loop()
        return web.json_response(await loop.run_in_executor(self._generation, self.completion, body, chat))

    def completion(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        if chat:
            prompts: list = [body["messages"]]
        else:
            prompt = body["prompt"]
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        outputs = self.generator.generate(prompts, sampling_from(body))
        flat = [c for per_prompt in outputs for c in per_prompt]  # prompt-major, n per prompt
        choices = [_choice(i, c, chat) for i, c in enumerate(flat)]
        tokens = sum(len(c.token_ids) for c in flat)
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {"completion_tokens": tokens},
        }

    def _serves(self) -> str:
        parts = [("generation", self.generator), ("retrieval", self.retriever)]
        served = [what for what, obj in parts if obj is not None]
        return f" (it serves {' and '.join(served)})"


def retriever_info(config: dict[str, Any], corpus) -> dict[str, Any]:
    """What ``GET /v1/retriever`` answers: the served retriever's resolved config and its corpus."""
    return {"config": config, "corpus": corpus.fingerprint, "passages": len(corpus)}


def retrieval(cfg) -> tuple[Retriever | None, dict[str, Any] | None]:
    """The served retriever over ``cfg.data``'s corpus, and what ``GET /v1/retriever`` says of it."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_lab.core.config import build
    from rag_lab.retrievers.remote import check_servable

    if not cfg.get("retriever"):
        return None, None
    from rag_lab.data.evidence import Evidence, index_corpus

    check_servable(cfg.retriever)
    corpus = index_corpus(instantiate(cfg.data), Evidence(**cfg.corpus))
    config = OmegaConf.to_container(cfg.retriever, resolve=True)  # before build resolves nodes in place
    return build(cfg.retriever, corpus=corpus), retriever_info(config, corpus)


def main(argv: list[str] | None = None) -> None:
    import sys

    from rag_lab.core.cli import cli_overrides
    from rag_lab.core.config import build, compose
    from rag_lab.core.errors import RagLabError, one_line_errors

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        cfg = compose(cli_overrides(list(sys.argv[1:] if argv is None else argv), __doc__, "serve"), "serve")
        if not cfg.get("generator") and not cfg.get("retriever"):
            raise RagLabError(
                "generator / retriever: nothing to serve (set generator=<name>, retriever=<name>)"
            )
        generator = build(cfg.get("generator"))
        name = cfg.serve.model_name or (
            cfg.generator.get("model", cfg.generator._target_) if generator else ""
        )
        retriever, info = retrieval(cfg)
        try:
            queue = (cfg.serve.max_batch, cfg.serve.max_queue)
            server = Server(generator, name, cfg.serve.host, cfg.serve.port, retriever, info, *queue)
        except (OSError, OverflowError) as e:  # port taken, out of range, or a host not of this machine
            where = f"{cfg.serve.host}:{cfg.serve.port}"
            raise RagLabError(f"serve.host / serve.port: cannot listen on {where} ({e})") from None
    host, port = server.server_address[:2]
    if generator is not None:
        log.info("serving %s on http://%s:%d/v1", name, host, port)
    if retriever is not None:
        what, url = (
            f"{cfg.retriever._target_.rsplit('.', 1)[-1]} over {info['passages']} passages",
            f"http://{host}:{port}",
        )
        log.info(
            "serving retrieval (%s) at %s (a run queries it: retriever=remote retriever.url=%s)",
            what,
            url,
            url,
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
