"""Generation speed of the hf backend: tokens/s at batch 1 vs 64, and the serve + openai round trip.

The model is the embedded default LM (generator=tiny: trained on first use, then cached); the
prompts are real Stop-RAG follow-up prompts of synth dev questions. Greedy, 32 new tokens.

    python experiments/bench_generation.py      # writes experiments/results/bench_generation.md
"""

import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from benchlib import peak_rss_mb, publish, shipped_lm
from hydra.utils import instantiate

from rag_lab.core.config import build, compose
from rag_lab.env.protocols import State
from rag_lab.env.protocols.stoprag import StopRAGQuery
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.openai import OpenAIGenerator

N_PROMPTS, NEW_TOKENS = 64, 32


def measure(gen, prompts: list[str], batch: int) -> tuple[float, int]:
    """(seconds, generated tokens) for all prompts, ``batch`` per generate call."""
    sampling = Sampling(max_new_tokens=NEW_TOKENS)
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        tokens += sum(len(c[0].token_ids) for c in gen.generate(prompts[i : i + batch], sampling))
    return time.perf_counter() - start, tokens


def main() -> None:
    cfg = compose(["generator=tiny"])
    data = instantiate(cfg.data)
    tiny = build(cfg.generator, data=data)
    path = Path(tiny.model.name_or_path)
    query = StopRAGQuery()
    prompts = [query.prompt(State(ex.question)) for ex in data.split("dev")[:N_PROMPTS]]
    rows = []
    for batch in (1, 64):
        gen = HFGenerator(
            str(path), tokenizer=str(path / "tokenizer"), batch_size=batch, logprobs=True, chat=False
        )
        seconds, tokens = measure(gen, prompts, batch)
        rows.append({"what": f"hf, batch {batch}", "seconds": seconds, "tokens/s": tokens / seconds})
    model = [f"generator.model={path}", f"generator.tokenizer={path}/tokenizer"]
    cmd = [sys.executable, "-m", "rag_lab.serve", *model, "serve.port=0", "serve.model_name=bench"]
    server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    url = next(m.group(1) for line in server.stderr if (m := re.search(r"on (http://\S+/v1)", line)))
    try:
        remote = OpenAIGenerator(base_url=url, model="bench", concurrency=8)
        seconds, _ = measure(remote, prompts, 64)  # 64 requests of 1 prompt, 8 at a time
        rows.append({"what": "serve + openai, 64 requests (8 concurrent)", "seconds": seconds})
    finally:
        server.terminate()
    table = pd.DataFrame(rows).round(1).to_markdown(index=False)
    speedup = rows[1]["tokens/s"] / rows[0]["tokens/s"]
    overhead_ms = 1000 * (rows[2]["seconds"] - rows[0]["seconds"]) / N_PROMPTS
    publish(
        "bench_generation",
        f"{N_PROMPTS} Stop-RAG follow-up prompts, up to {NEW_TOKENS} new tokens, greedy; the tiny LM "
        f"({sum(p.numel() for p in tiny.model.parameters()):,} parameters)\n\n{table}\n\n"
        f"batch 64 vs 1: {speedup:.1f}x tokens/s; the HTTP round trip adds {overhead_ms:.1f} ms per request "
        f"over local batch-1 generation (the server runs one generate call at a time); "
        f"peak RSS {peak_rss_mb():.0f} MB",
        lm=shipped_lm(),
    )


if __name__ == "__main__":
    main()
