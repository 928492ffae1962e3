"""What every benchmark script shares: peak memory and writing its result page."""

import os
import resource
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def publish(name: str, body: str) -> None:
    """Print the result and write it to experiments/results/<name>.md under a header with the core count."""
    text = f"# {name} ({os.cpu_count()} cores)\n\n{body.rstrip()}\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(text)


def probe_world(parser):
    """The tiny-LM probes' common start: ``--threads``, ``--name`` (the results file's suffix) and
    ``--cache`` added to ``parser``, arguments parsed, torch's threads set, the synth world and its
    BM25 index loaded. Returns (args, data, retriever)."""
    import torch

    from rag_lab.data.synth import SynthDataset
    from rag_lab.retrievers.bm25 import BM25Retriever

    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--name", default="", help="suffix of the results file")
    parser.add_argument("--cache", default="~/.cache/rag_lab")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = SynthDataset(args.cache)
    return args, data, BM25Retriever(data.corpus, cache_dir=args.cache)
