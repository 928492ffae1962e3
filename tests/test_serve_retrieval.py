"""rag_lab.serve's retrieval queue (issue 72): concurrent requests coalesced into fewer ``search`` calls with
each request's own hits, one kept-alive connection for many requests, abandoned and expired requests never
searched, a bounded queue, and retriever=remote's batch in chunks put back in order. Every server binds
127.0.0.1 on a free port and stops when its test ends."""

import contextlib
import http.client
import json
import socket
import threading
import time

import pytest

from rag_lab.core.config import build
from rag_lab.core.errors import RagLabError
from rag_lab.retrievers.remote import RemoteRetriever
from rag_lab.serve import Server, retriever_info


class Gated:
    """The tiny world's BM25, recording each ``search`` call's queries; while ``gate`` is clear a search waits
    for it (the test holds the server's one search worker busy)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()

    def search(self, queries, k, exclude=None):
        self.calls.append(list(queries))
        self.entered.set()
        assert self.gate.wait(timeout=30)
        return self.inner.search(queries, k, exclude)


@pytest.fixture(scope="module")
def bm25(data):
    from rag_lab.core.config import compose

    return build(compose(["retriever=bm25"]).retriever, corpus=data.corpus)


@contextlib.contextmanager
def serving(retriever, data, **queue):
    server = Server(None, "", "127.0.0.1", 0, retriever, retriever_info({}, data.corpus), **queue)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        if isinstance(retriever, Gated):
            retriever.gate.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=30)


def post(port: int, body: dict, conn: http.client.HTTPConnection | None = None) -> tuple[int, dict]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/retrieve", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def questions(data, n: int) -> list[str]:
    return [ex.question for ex in data.split("test")[:n]]


def hold_the_worker(server: Server, gated: Gated, port: int, query: str) -> threading.Thread:
    """A first request whose search blocks on the gate: what arrives meanwhile waits in the queue."""
    gated.gate.clear()
    first = threading.Thread(target=post, args=(port, {"queries": [query], "k": 3}), daemon=True)
    first.start()
    assert gated.entered.wait(timeout=10)
    return first


def test_concurrent_requests_are_coalesced_into_one_search(bm25, data):
    """Six requests of two queries arrive while a search runs: the next search takes all twelve (one call,
    not six), and each request gets exactly the hits of its own queries searched alone."""
    gated = Gated(bm25)
    qs = questions(data, 13)
    with serving(gated, data) as server:
        port = server.server_address[1]
        first = hold_the_worker(server, gated, port, qs[0])
        answers: dict[int, tuple[int, dict]] = {}
        bodies = [{"queries": qs[1 + 2 * i : 3 + 2 * i], "k": 4} for i in range(6)]
        senders = [
            threading.Thread(target=lambda i=i: answers.update({i: post(port, bodies[i])})) for i in range(6)
        ]
        for t in senders:
            t.start()
        until(lambda: server.coalescer.queued == 12, "the six requests to queue")
        gated.gate.set()
        for t in [first, *senders]:
            t.join(timeout=30)
    assert [len(c) for c in gated.calls] == [1, 12]
    assert sorted(gated.calls[1]) == sorted(qs[1:13])
    for i, body in enumerate(bodies):
        status, reply = answers[i]
        assert status == 200
        assert reply["hits"] == [[[h.id, h.score] for h in hits] for hits in bm25.search(body["queries"], 4)]


def test_a_batch_stops_at_max_batch_and_another_k_is_another_call(bm25, data):
    gated = Gated(bm25)
    qs = questions(data, 8)
    with serving(gated, data, max_batch=4) as server:
        port = server.server_address[1]
        first = hold_the_worker(server, gated, port, qs[0])
        bodies = [{"queries": qs[1:3], "k": 2}, {"queries": qs[3:5], "k": 5}, {"queries": qs[5:8], "k": 2}]
        senders = []
        for n, body in enumerate(bodies):  # queued in this order
            senders.append(threading.Thread(target=post, args=(port, body), daemon=True))
            senders[-1].start()
            until(
                lambda n=n: server.coalescer.queued == sum(len(b["queries"]) for b in bodies[: n + 1]),
                "queue",
            )
        gated.gate.set()
        for t in [first, *senders]:
            t.join(timeout=30)
    # round 2 holds the first two requests (4 queries: the third would make 7), one call each k
    assert gated.calls[1:] == [qs[1:3], qs[3:5], qs[5:8]]
    assert server.coalescer.stats.summary()["searches"] == 4


def test_one_connection_serves_many_requests(bm25, data):
    """HTTP/1.1 keep-alive: the same socket (the same local port) carries every request."""
    qs = questions(data, 3)
    with serving(bm25, data) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", "/v1/retriever")
        response = conn.getresponse()
        assert response.version == 11 and response.status == 200
        response.read()
        local = conn.sock.getsockname()
        for q in qs:
            assert post(0, {"queries": [q], "k": 2}, conn)[0] == 200
            assert conn.sock is not None and conn.sock.getsockname() == local
        # the client's pool keeps its connection too: three searches, one connection open on the server
        remote = RemoteRetriever(data.corpus, f"http://127.0.0.1:{server.server_address[1]}")
        for q in qs:
            remote.search([q], 2)
        conn.close()
        until(lambda: server.open_connections() == 1, "one connection: the client's")


def test_an_expired_request_is_not_searched(bm25, data):
    gated = Gated(bm25)
    qs = questions(data, 2)
    with serving(gated, data) as server:
        port = server.server_address[1]
        first = hold_the_worker(server, gated, port, qs[0])
        late: list = []
        sender = threading.Thread(
            target=lambda: late.append(post(port, {"queries": [qs[1]], "k": 2, "timeout_s": 0.2}))
        )
        sender.start()
        until(lambda: server.coalescer.queued == 1, "the second request to queue")
        time.sleep(0.3)  # its deadline passes while the first search runs
        gated.gate.set()
        for t in (first, sender):
            t.join(timeout=30)
    assert gated.calls == [[qs[0]]]
    assert late[0][0] == 504 and "not searched" in late[0][1]["error"]["message"]
    assert server.coalescer.stats.expired == 1


def test_a_request_whose_client_went_away_is_not_searched(bm25, data):
    gated = Gated(bm25)
    qs = questions(data, 2)
    with serving(gated, data) as server:
        port = server.server_address[1]
        first = hold_the_worker(server, gated, port, qs[0])
        body = json.dumps({"queries": [qs[1]], "k": 2}).encode()
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(
                b"POST /v1/retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            until(lambda: server.coalescer.queued == 1, "the request to queue")
        # the client is gone: its handler is cancelled, and with it the queued request
        until(lambda: server.coalescer.waiting[0].future.cancelled(), "the handler's cancellation")
        gated.gate.set()
        first.join(timeout=30)
        until(lambda: not server.coalescer.waiting, "the queue to empty")
    assert gated.calls == [[qs[0]]]
    assert server.coalescer.stats.cancelled == 1


def test_a_full_queue_answers_busy_and_the_client_says_so_in_one_line(bm25, data):
    gated = Gated(bm25)
    qs = questions(data, 3)
    with serving(gated, data, max_queue=1) as server:
        port = server.server_address[1]
        first = hold_the_worker(server, gated, port, qs[0])
        queued = threading.Thread(target=post, args=(port, {"queries": [qs[1]], "k": 2}), daemon=True)
        queued.start()
        until(lambda: server.coalescer.queued == 1, "one request to queue")
        assert post(port, {"queries": [qs[2]], "k": 2})[0] == 503
        remote = RemoteRetriever(data.corpus, f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01)
        with pytest.raises(
            RagLabError, match=r"^retriever\.url: the retrieval server at .* stayed busy \(busy: "
        ):
            remote.search([qs[2]], 2)
        gated.gate.set()
        for t in (first, queued):
            t.join(timeout=30)
    assert [qs[2]] not in gated.calls


def test_the_client_chunks_its_batch_and_puts_the_hits_back_in_order(bm25, data):
    """Nine queries (and exclusions) in chunks of two: five requests, and the hits of the whole batch in
    order, exactly the local retriever's."""
    qs = [*questions(data, 7), "", "zzqx vvwk"]
    exclude = [set() for _ in qs]
    exclude[4] = {bm25.search([qs[4]], 1)[0][0].id}
    with serving(bm25, data) as server:
        remote = RemoteRetriever(data.corpus, f"http://127.0.0.1:{server.server_address[1]}", chunk=2)
        got = remote.search(qs, 3, exclude)
        assert server.coalescer.stats.requests == 5
    assert got == bm25.search(qs, 3, exclude)
    assert len({tuple(h.id for h in hits) for hits in got[:7]}) == 7  # distinct lists: an order to keep
