"""What every benchmark script shares: peak memory, the model's forward time, writing its result page.

No rag_lab imports at the top: ``experiments/peers/flashrag_side.py`` uses it from FlashRAG's environment."""

import resource
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB (Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def shipped_lm() -> str:
    """The results pages' name of the default LM as shipped now: ``generator=tiny``, its folder and the
    commit its card says it was trained at (a page measured with it names it, issue 64)."""
    import json

    from rag_lab.train.tiny.generator import SHIPPED

    card = json.loads((SHIPPED / "recipe.json").read_text())
    return f"generator=tiny (rag_lab/checkpoints/{SHIPPED.name}, trained at commit {card.get('commit')})"


def command() -> str:
    """The command line that ran this bench, as a reader types it from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else Path(script.name)
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def publish(name: str, body: str, lm: str) -> None:
    """Print the result and write experiments/results/<name>.md: ``body`` with, under its first table, the
    stamp (commit, date, machine, :func:`command`) and ``lm``, the LM it was measured with
    (:func:`shipped_lm`, or e.g. "none (retrieval only)"); the section the page held moves under its
    History (:func:`rag_lab.reporting.pages.publish`), so each run's table leads the page."""
    from rag_lab.reporting import pages

    stamp = pages.here(command(), ROOT)
    section = f"# {name}\n\n" + pages.after_first_table(body, f"{stamp.line()}\n\nLM: {lm}")
    print(section)
    path = RESULTS / f"{name}.md"
    old = path.read_text() if path.exists() else None
    RESULTS.mkdir(exist_ok=True)
    path.write_text(pages.publish(old, section))


class ForwardClock:
    """Seconds in the model's forward passes, split into prefill (more than one new token per row) and
    decode (one), through forward hooks; on a GPU each pass is waited for (CUDA kernels run asynchronously:
    without a synchronize the clock would read their launch, not their work)."""

    def __init__(self, model):
        self.seconds = {"prefill": 0.0, "decode": 0.0}
        self._start = 0.0
        self._cuda = next(model.parameters()).is_cuda
        self._handles = [
            model.register_forward_pre_hook(self._begin, with_kwargs=True),
            model.register_forward_hook(self._end, with_kwargs=True),
        ]

    def _sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    def _begin(self, module, args, kwargs):
        self._sync()
        self._start = time.perf_counter()

    def _end(self, module, args, kwargs, output):
        self._sync()
        ids = kwargs.get("input_ids", args[0] if args else None)
        kind = "prefill" if ids is not None and ids.shape[1] > 1 else "decode"
        self.seconds[kind] += time.perf_counter() - self._start

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
