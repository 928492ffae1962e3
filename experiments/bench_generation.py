"""Generation speed of the hf backend: tokens/s at batch 1 vs 64, and the serve + openai round trip.

Until the tiny LM lands, the model is a randomly initialised Qwen2 of the tiny LM's planned size
(hidden 128, 4 layers, word-level vocabulary of 2,000) built here; random weights generate at the
same speed as trained ones. Greedy, 32 new tokens, 64 prompts.

    python experiments/bench_generation.py      # writes experiments/results/bench_generation.md
"""

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from benchlib import peak_rss_mb, publish

from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.openai import OpenAIGenerator

N_PROMPTS, NEW_TOKENS = 64, 32


def build_model(path: Path, vocab_size: int = 2000) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    vocab = {
        w: i for i, w in enumerate(["<pad>", "<eos>", "<unk>", *[f"w{i}" for i in range(vocab_size - 3)]])
    }
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(path / "tokenizer")
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         eos_token_id=1, pad_token_id=0, tie_word_embeddings=True)  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(path)


def measure(gen, prompts: list[str], batch: int) -> tuple[float, int]:
    """(seconds, generated tokens) for all prompts, ``batch`` per generate call."""
    sampling = Sampling(max_new_tokens=NEW_TOKENS)
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        tokens += sum(len(c[0].token_ids) for c in gen.generate(prompts[i : i + batch], sampling))
    return time.perf_counter() - start, tokens


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build_model(path)
        prompts = [" ".join(f"w{(i * 7 + j) % 1900 + 10}" for j in range(40)) for i in range(N_PROMPTS)]
        rows = []
        for batch in (1, 64):
            gen = HFGenerator(str(path), tokenizer=str(path / "tokenizer"), batch_size=batch, logprobs=True)
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
        f"{N_PROMPTS} prompts of 40 tokens, {NEW_TOKENS} new tokens, greedy; a random Qwen2 of the tiny LM's "
        f"size (hidden 128, 4 layers)\n\n{table}\n\n"
        f"batch 64 vs 1: {speedup:.1f}x tokens/s; the HTTP round trip adds {overhead_ms:.1f} ms per request "
        f"over local batch-1 generation (the server runs one generate call at a time); "
        f"peak RSS {peak_rss_mb():.0f} MB",
    )


if __name__ == "__main__":
    main()
