"""``generator=openai``: any OpenAI-compatible endpoint (a vLLM server, ``rag_lab.serve``, a hosted API).

Text prompts go to ``/v1/completions``, chat prompts to ``/v1/chat/completions``; requests run
``concurrency`` at a time, each with a timeout and retries with exponential backoff on
connection errors, 429 and 5xx. An endpoint that stays unreachable is one ``RagLabError`` naming
it, after the retries. The API key comes from the environment variable ``api_key_env``.
Hand-written on the standard library (urllib), so no client SDK is needed. ``include_stop`` is
sent as vLLM's ``include_stop_str_in_output`` (hosted APIs ignore it).

Text in, text out: an endpoint tokenizes what it is sent and returns text, so a prompt given as token ids
(:class:`~rag_lab.generators.base.TokenPrompt`) is sent as the text it stands for, and completions carry no
token ids. That is enough for what it serves (evaluation, judges, a teacher); a trained policy generates
with ``generator=hf`` or ``vllm``, which keep the ids.
"""

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import NonNegative, NonNegativeInt, Positive, PositiveInt
from rag_lab.generators.base import Completion, Prompt, Sampling, TokenPrompt, as_text

RETRY_STATUS = {429, 500, 502, 503, 504}


class OpenAIGenerator:
    def __init__(
        self,
        # the endpoint's root, up to /v1 (requests go to <base_url>/chat/completions or /completions)
        base_url: str = "http://127.0.0.1:8000/v1",
        # the model name sent with each request (the server's own name for it)
        model: str = "default",
        # the environment variable holding the API key, sent as a Bearer token (unset or empty: none)
        api_key_env: str = "OPENAI_API_KEY",
        # requests in flight at once (one per prompt)
        concurrency: PositiveInt = 8,
        # seconds one request may take
        timeout: Positive = 60.0,
        # retries of a request that failed to connect, timed out or got 429 / 5xx, before the run fails
        max_retries: NonNegativeInt = 3,
        # seconds before the first retry; doubled each time
        backoff: NonNegative = 1.0,
        # prompts as chat messages (/v1/chat/completions) rather than text (/v1/completions)
        chat: bool = True,
    ):
        url = urllib.parse.urlparse(base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise RagLabError(
                f"generator.base_url: '{base_url}' is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)"
            )
        self.chat = chat
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = os.environ.get(api_key_env, "")
        self.concurrency = concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff

    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
            return list(pool.map(lambda p: self._one(p, sampling), prompts))

    def _one(self, prompt: Prompt | TokenPrompt, sampling: Sampling) -> list[Completion]:
        prompt = as_text(prompt)  # the endpoint reads text (module docstring)
        chat = not isinstance(prompt, str)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "n": sampling.n,
        }
        body["messages" if chat else "prompt"] = list(prompt) if chat else prompt
        if sampling.stop:
            body["stop"] = list(sampling.stop)
            body["include_stop_str_in_output"] = sampling.include_stop
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        reply = self._post("/chat/completions" if chat else "/completions", body)
        choices = sorted(reply["choices"], key=lambda c: c["index"])
        return [
            Completion(
                c["message"]["content"] if chat else c["text"], finish_reason=c.get("finish_reason") or "stop"
            )
            for c in choices
        ]

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        for attempt in range(self.max_retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as e:
                if e.code not in RETRY_STATUS or attempt == self.max_retries:
                    detail = e.read().decode(errors="replace")[:200]
                    raise RagLabError(f"endpoint {url} answered {e.code}: {detail}") from None
                error: Exception = e
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                error = e
            if attempt < self.max_retries:
                time.sleep(self.backoff * 2**attempt)
        reason = getattr(error, "reason", error)
        raise RagLabError(f"endpoint {url} unreachable after {self.max_retries} retries: {reason}")
