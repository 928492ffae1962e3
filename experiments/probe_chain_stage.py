"""Probe (issue 48, route 1): a chain stage on the shipped tiny LM, scored by the oracle row.

The shipped LM reads one gold page (oracle ``qa`` reader, single-hop Acc 84.4) but not a chain of them
(all questions 25.6; ``cot`` never reaches ``So the answer is:``). This probe continues the shipped
checkpoint (``tune_tiny_lm``, the protocol stage's loop) on the world teacher's chain-of-thought over each
training question's gold passages (``policy=oracle_rag policy.reader=cot`` behind the teacher: one
"sub-question? answer." sentence a hop), renamed, taking turns with the recipe's other layouts so the
protocols are not forgotten; then scores the oracle row (both readers) and standard RAG on the synth test
split, per question type.

    python experiments/probe_chain_stage.py --steps 2000 --out experiments/results/probe_chain_stage.json

Each tuned model is cached (``RAG_LAB_CACHE``/tiny_lm/<key>) like the recipe's stages.
"""

import argparse
import json
import random
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from rag_lab import cache
from rag_lab.data.synth import SynthDataset
from rag_lab.env import Env
from rag_lab.env.protocols.base import identify
from rag_lab.env.teacher.generator import TeacherGenerator
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.oracle import OracleRAG
from rag_lab.policies.prompting import StandardRAG
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.demonstrations import Recorder, collect
from rag_lab.train.tiny.generator import SHIPPED
from rag_lab.train.tiny.model import TinyConfig
from rag_lab.train.tiny.reading import page_facts, page_kinds, renamer
from rag_lab.train.tiny.recipe import Recipe, _reading
from rag_lab.train.tiny.trainer import fingerprint, tune_tiny_lm


def oracle_demos(data, corpus, questions) -> dict[str, str]:
    """The teacher's cot over each question's gold passages: {prompt: completion}."""
    recorder = Recorder(TeacherGenerator(data))
    env = Env(corpus, None, recorder)
    policy = OracleRAG(reader="cot")
    for start in range(0, len(questions), 256):
        policy.rollout(env, list(questions[start : start + 256]))
    return {p: t for p, t in recorder.pairs if (f := identify(p)) and f[0].name == "cot"}


def score(generator, corpus, retriever, questions, policy) -> dict:
    env = Env(corpus, retriever, generator)
    acc = SCORERS["squad"]["acc"]
    by_type = defaultdict(list)
    for start in range(0, len(questions), 64):
        batch = questions[start : start + 64]
        for ex, ep in zip(batch, policy.rollout(env, batch), strict=True):
            right = acc(ep.prediction, list(ex.answers))
            by_type[ex.type].append(right)
            by_type["all"].append(right)
    return {t: round(100 * sum(v) / len(v), 1) for t, v in sorted(by_type.items())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layout", default="demos:cot,demos:cot,qa,stoprag_intermediate,demos")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default=str(Path("~/.cache/rag_lab").expanduser()))
    ap.add_argument("--out", type=Path, default=Path("experiments/results/probe_chain_stage.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    data = SynthDataset(cache_dir=args.cache)
    corpus, train, test = data.corpus, data.split("train"), data.split("test")
    retriever = BM25Retriever(corpus, cache_dir=args.cache)
    shipped = json.loads((SHIPPED / "recipe.json").read_text())["recipe"]
    recipe = Recipe(**shipped)
    t0 = time.perf_counter()
    pools = collect(TeacherGenerator(data), corpus, retriever, train, recipe.k, recipe.iterations)
    pools["cot"] = oracle_demos(data, corpus, train)  # the oracle chains replace IRCoT's retrieved ones
    facts = page_facts(data)
    entities = sorted(set(corpus.titles))
    rename = renamer(entities, page_kinds(facts))
    layouts = args.layout.split(",")
    source = _reading(facts, retriever, pools, rename, layouts, recipe)
    rng = random.Random(recipe.train_seed + 2)
    items = source.items(layouts, args.steps, recipe.reading_batch_size, rng, recipe.train_seed, stops=True)
    print(f"data: {len(pools['cot'])} oracle cot pairs, {len(items)} items, {time.perf_counter() - t0:.0f} s")

    sizes = {k: shipped[k] for k in ("hidden", "layers", "heads", "kv_heads", "intermediate", "max_length")}
    config = TinyConfig(
        **sizes,
        reading_steps=args.steps,
        reading_batch_size=recipe.reading_batch_size,
        lr=args.lr,
        warmup_steps=recipe.warmup_steps,
        seed=recipe.train_seed,
    )
    digest = fingerprint([], [], (), reading=items, entities=entities)
    out = cache.path(args.cache, "tiny_lm", "chain_probe", config, digest, code="rag_lab.train.tiny.trainer")
    t0 = time.perf_counter()
    path = tune_tiny_lm(SHIPPED, items, replace(config), out, digest, entities)
    train_s = time.perf_counter() - t0

    results = {
        "steps": args.steps,
        "lr": args.lr,
        "layout": layouts,
        "threads": args.threads,
        "train_s": round(train_s),
        "model": str(path),
    }
    for name, model_dir in (("shipped", SHIPPED), ("chain", path)):
        gen = HFGenerator(
            str(model_dir),
            str(Path(model_dir) / "tokenizer"),
            batch_size=64,
            chat=False,
            dtype="float32",
            device="cpu",
        )
        results[name] = {
            "oracle_qa": score(gen, corpus, retriever, test, OracleRAG(reader="qa")),
            "oracle_cot": score(gen, corpus, retriever, test, OracleRAG(reader="cot", max_new_tokens=48)),
            "standard_rag": score(gen, corpus, retriever, test, StandardRAG(k=5)),
        }
        print(name, json.dumps(results[name]))
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
