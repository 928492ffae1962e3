"""Training speed of the tiny LM's reading stage: padding, and the loss on every or on labelled positions.

``tiny.train_loop`` scores only the labelled positions (``tiny.target_loss``); ``model(**batch).loss``
applies the LM head and the cross-entropy over the whole vocabulary at every position. Reading
items (the synth world's pages, renamed, answer-only labels) in two layouts of the reading stage:
the ``qa`` prompt with up to 5 pages, and Stop-RAG's one-page intermediate prompt; batches drawn at
random (as the items come) or regrouped by length over windows of 8 batches (``group_by_length``, what
``generator=tiny``'s reading stage does). The model is the embedded default's size, freshly
initialised; each row is forward + backward + AdamW over the same items.

    python experiments/bench_tiny_training.py      # writes experiments/results/bench_tiny_training.md
"""

import argparse
import random
import time

import pandas as pd
import torch
from benchlib import peak_rss_mb, publish

from rag_lab.data.synth import SynthDataset
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.tiny import model as tiny
from rag_lab.train.tiny.reading import (
    group_by_length,
    intermediate_reading_item,
    page_facts,
    page_kinds,
    page_neighbours,
    qa_reading_item,
    renamer,
)
from rag_lab.train.tiny.tokenizer import build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cache", default="~/.cache/rag_lab")
    args = parser.parse_args()
    torch.set_num_threads(2)
    data = SynthDataset(args.cache)
    facts = page_facts(data)
    neighbours = page_neighbours(facts, BM25Retriever(data.corpus, cache_dir=args.cache), 4)
    rename, rng = renamer(sorted(set(data.corpus.titles)), page_kinds(facts)), random.Random(0)
    layouts = {
        "qa, 1-5 pages": lambda: qa_reading_item(facts, rng.randrange(len(facts)), neighbours, rng, 5),
        "stoprag_intermediate": lambda: intermediate_reading_item(facts, rng.randrange(len(facts)), rng),
    }
    items = {
        name: [rename(draw(), rng) for _ in range(args.steps * args.batch)] for name, draw in layouts.items()
    }
    texts = [p.contents for p in data.corpus] + [
        x for batch in items.values() for item in batch for x in item
    ]
    tokenizer = build_tokenizer(texts)
    config = tiny.TinyConfig(hidden=64, layers=4, heads=4, kv_heads=2, intermediate=256, lr=3e-3)
    rows = []
    for layout, pool in items.items():
        drawn = [(layout, pool[i : i + args.batch]) for i in range(0, len(pool), args.batch)]
        grouped = group_by_length(drawn, random.Random(0))
        for batching, loss_name, loss_of, chunks in (
            ("random", "every position", lambda m, b: m(**b).loss, [items for _, items in drawn]),
            ("random", "labelled (target_loss)", tiny.target_loss, [items for _, items in drawn]),
            ("by length, window 8", "labelled (target_loss)", tiny.target_loss, grouped),
        ):
            batches = [tiny.reading_batch(tokenizer, chunk, config.max_length) for chunk in chunks]
            model = tiny.build_model(tokenizer, config)
            optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
            loss_of(model, batches[0]).backward()  # warm-up, untimed
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            for batch in batches:
                loss_of(model, batch).backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            seconds = time.perf_counter() - start
            tokens = sum(int(b["attention_mask"].sum()) for b in batches)
            rows.append(
                {
                    "layout": layout,
                    "batches": batching,
                    "loss on": loss_name,
                    "tokens/row": tokens / len(pool),
                    "padded/real tokens": sum(b["attention_mask"].numel() for b in batches) / tokens,
                    "steps/s": len(batches) / seconds,
                    "real tokens/s": tokens / seconds,
                }
            )
    table = pd.DataFrame(rows)
    body = (
        f"Reading stage, batch {args.batch}, {args.steps} steps per row, hidden 64, 4 layers, vocabulary "
        f"{len(tokenizer)}, names as their words; "
        f"torch {torch.__version__}, 2 threads.\n\n{table.to_markdown(index=False, floatfmt='.1f')}\n\n"
        f"Peak RSS {peak_rss_mb():.0f} MB.\n"
    )
    publish("bench_tiny_training", body, lm="none shipped: the recipe's reading stage timed on fresh models")


if __name__ == "__main__":
    main()
