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
index can be shared between runs and ranks on one machine. Hand-written on the standard library's
threading HTTP server (no web framework in our dependencies); a request is served on its own thread,
one generate call and one search call at a time (backends are not thread-safe).
"""

import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rag_lab.generators.base import Completion, Generator, Sampling
from rag_lab.retrievers.base import Retriever
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


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # every rank of a node may connect at once (the standard library's default queue is 5)
    request_queue_size = 128

    def __init__(
        self,
        generator: Generator | None,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        retriever: Retriever | None = None,
        retriever_info: dict[str, Any] | None = None,
    ):
        super().__init__((host, port), Handler)
        self.generator, self.model_name, self.lock = generator, model_name, threading.Lock()
        self.retriever, self.retriever_info, self.search_lock = retriever, retriever_info, threading.Lock()

    def retrieve(self, body: dict[str, Any]) -> dict[str, Any]:
        queries, k, exclude = body["queries"], body["k"], body.get("exclude")
        if not (isinstance(queries, list) and all(isinstance(q, str) for q in queries)):
            raise ValueError("'queries' must be a list of strings")
        if not isinstance(k, int) or isinstance(k, bool):
            raise ValueError("'k' must be an integer")
        if exclude is not None and not (isinstance(exclude, list) and len(exclude) == len(queries)):
            raise ValueError("'exclude' must be null or one list of ids per query")
        skip = None if exclude is None else [set(ids) for ids in exclude]
        with self.search_lock:
            return {"hits": hits_to_wire(self.retriever.search(queries, k, skip))}

    def complete(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        if chat:
            prompts: list = [body["messages"]]
        else:
            prompt = body["prompt"]
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        sampling = sampling_from(body)
        with self.lock:  # one generate call at a time: backends are not thread-safe
            outputs = self.generator.generate(prompts, sampling)
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


class Handler(BaseHTTPRequestHandler):
    server: Server

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.rstrip("/")
        if path == "/v1/models" and self.server.generator is not None:
            self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model"}]})
        elif path == "/v1/retriever" and self.server.retriever is not None:
            self._send(200, self.server.retriever_info or {})
        else:
            self._send(404, {"error": {"message": f"no route {self.path} on this server{self._serves()}"}})

    def do_POST(self) -> None:  # noqa: N802
        routes = {
            "/v1/completions": (self.server.generator, lambda body: self.server.complete(body, False)),
            "/v1/chat/completions": (self.server.generator, lambda body: self.server.complete(body, True)),
            "/v1/retrieve": (self.server.retriever, self.server.retrieve),
        }
        path = self.path.rstrip("/")
        if path not in routes or routes[path][0] is None:
            self._send(404, {"error": {"message": f"no route {self.path} on this server{self._serves()}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            self._send(200, routes[path][1](body))
        except (KeyError, ValueError, TypeError) as e:
            self._send(400, {"error": {"message": f"bad request: {e}"}})
        except Exception as e:  # noqa: BLE001 - a backend's failure answers 500 instead of a dropped connection
            log.exception("%s failed", path)
            self._send(500, {"error": {"message": f"{type(e).__name__}: {e}"}})

    def _serves(self) -> str:
        parts = [("generation", self.server.generator), ("retrieval", self.server.retriever)]
        served = [what for what, obj in parts if obj is not None]
        return f" (it serves {' and '.join(served)})"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug(format, *args)


def retriever_info(config: dict[str, Any], corpus) -> dict[str, Any]:
    """What ``GET /v1/retriever`` answers: the served retriever's resolved config and its corpus."""
    return {"config": config, "corpus": corpus.fingerprint, "passages": len(corpus)}


def retrieval(cfg) -> tuple[Retriever | None, dict[str, Any] | None]:
    """The served retriever over ``cfg.data``'s corpus, and what ``GET /v1/retriever`` says of it."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rag_lab.core.config import build

    if not cfg.get("retriever"):
        return None, None
    corpus = instantiate(cfg.data).corpus
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
            server = Server(generator, name, cfg.serve.host, cfg.serve.port, retriever, info)
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
        server.server_close()


if __name__ == "__main__":
    main()
