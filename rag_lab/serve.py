"""An OpenAI-compatible HTTP server around any generator: ``python -m rag_lab.serve generator=<name>``.

    python -m rag_lab.serve generator=teacher serve.port=8000
    python -m rag_lab.serve generator=hf generator.model=/path/to/model serve.host=0.0.0.0

Endpoints: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (the
fields rag_lab's ``openai`` backend and common clients send: prompt / messages, max_tokens,
temperature, top_p, n, stop, seed, and vLLM's ``include_stop_str_in_output``). Bound to
127.0.0.1 unless ``serve.host`` says otherwise, so a judge or a black-box generator can be shared
between runs on one machine. Hand-written on the standard library's threading HTTP server (no
web framework in our dependencies); requests are served one generate call at a time.
"""

import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rag_lab.generators.base import Completion, Generator, Sampling

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

    def __init__(self, generator: Generator, model_name: str, host: str = "127.0.0.1", port: int = 8000):
        super().__init__((host, port), Handler)
        self.generator, self.model_name, self.lock = generator, model_name, threading.Lock()

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
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": self.server.model_name, "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:  # noqa: N802
        routes = {"/v1/completions": False, "/v1/chat/completions": True}
        path = self.path.rstrip("/")
        if path not in routes:
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            self._send(200, self.server.complete(body, routes[path]))
        except (KeyError, ValueError, TypeError) as e:
            self._send(400, {"error": {"message": f"bad request: {e}"}})

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        log.debug(format, *args)


def main(argv: list[str] | None = None) -> None:
    import sys

    from rag_lab.cli import cli_overrides
    from rag_lab.config import build, compose
    from rag_lab.errors import RagLabError, one_line_errors

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with one_line_errors():
        cfg = compose(cli_overrides(list(sys.argv[1:] if argv is None else argv), __doc__, "serve"), "serve")
        generator = build(cfg.generator)
        name = cfg.serve.model_name or cfg.generator.get("model", cfg.generator._target_)
        try:
            server = Server(generator, name, cfg.serve.host, cfg.serve.port)
        except (OSError, OverflowError) as e:  # port taken, out of range, or a host not of this machine
            where = f"{cfg.serve.host}:{cfg.serve.port}"
            raise RagLabError(f"serve.host / serve.port: cannot listen on {where} ({e})") from None
    log.info("serving %s on http://%s:%d/v1", name, *server.server_address[:2])
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        server.server_close()


if __name__ == "__main__":
    main()
