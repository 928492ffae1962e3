"""Does the tiny LM learn to read past distractor pages, and does size decide it? A probe for issue 5.

Standard RAG puts 5 retrieved pages in the ``qa`` prompt; the tiny LM reads one page (0.6-0.7 of
corpus facts) but not five (0.15): experiments/results/probe_tiny_layouts_*.md. This trains a fresh
model on ``qa`` reading items only (``tiny_world.qa_reading_item``: a page, 0 to ``--max-pages`` - 1
of its BM25 neighbours, up to 6 questions, renamed afresh; batches regrouped by length as the reading
stage does) through ``tiny.train_loop``, and every ``--eval-every`` steps scores greedy answers to
200 corpus facts (real names) as ``qa`` prompts with the fact's page and 0, 2 or 4 BM25 neighbours
of the question, shuffled: right when the answer (up to the protocol's stop) equals the fact's value.

    .venv/bin/python experiments/probe_tiny_distractors.py --steps 3000 --name h64

``--device cuda`` runs it on a GPU (sweeps of model shapes: results/probe_tiny_distractors_gpu_depth.md).
"""

import argparse
import random
import tempfile
import time

from benchlib import probe_world, publish

from rag_lab.env.protocols.simple import QA
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.tiny import (
    TinyConfig,
    anchor_names,
    build_model,
    build_tokenizer,
    reading_batch,
    train_loop,
)
from rag_lab.generators.tiny_world import (
    group_by_length,
    name_words,
    page_facts,
    page_kinds,
    page_neighbours,
    qa_prompt,
    qa_reading_item,
    renamer,
)

PAGES = (1, 3, 5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--eval-every", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-pages", type=int, default=5, help="pages per training item, at most")
    parser.add_argument("--max-questions", type=int, default=6, help="questions per training item, at most")
    parser.add_argument("--contrast", action="store_true", help="ask one relation of every page first")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--whole-names", action="store_true", help="names as one token each")
    parser.add_argument(
        "--name-pieces", action="store_true", help="names as their syllables (Lia ##kria ##burg)"
    )
    parser.add_argument(
        "--name-std", type=float, default=0.0, help="one-token names' embeddings drawn at this std"
    )
    parser.add_argument("--freeze-names", action="store_true", help="and kept as drawn")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (experiments only)")
    args, data, retriever = probe_world(parser)
    facts = page_facts(data)
    neighbours = page_neighbours(facts, retriever, 4)
    rename, rng = renamer(sorted(set(data.corpus.titles)), page_kinds(facts)), random.Random(0)

    held = [(page, q, a) for page, qas in facts for q, a in qas]
    random.Random(0).shuffle(held)
    held = held[:200]
    by_id = {p.id: p for p in data.corpus}
    hits = retriever.search([q for _, q, _ in held], 5)

    def with_neighbours(i: int, n: int) -> list:
        page = held[i][0]
        pages = [by_id[h.id] for h in hits[i] if h.id != page.id][: n - 1] + [page]
        random.Random(i).shuffle(pages)
        return pages

    prompts = {n: [qa_prompt(q, with_neighbours(i, n)) for i, (_, q, _) in enumerate(held)] for n in PAGES}

    def draw() -> tuple[str, ...]:
        return rename(
            qa_reading_item(
                facts,
                rng.randrange(len(facts)),
                neighbours,
                rng,
                args.max_pages,
                args.max_questions,
                args.contrast,
            ),
            rng,
        )

    drawn = [("qa", [draw() for _ in range(args.batch_size)]) for _ in range(args.steps)]
    items = group_by_length(drawn, random.Random(0))
    names = sorted({t for t in data.corpus.titles if " " in t}) if args.whole_names else []
    # vocabulary: the corpus and the first 1,000 batches (32,000 items: every question template many times)
    texts = [p.contents for p in data.corpus] + [x for batch in items[:1000] for item in batch for x in item]
    pieces = name_words(data.corpus.titles, texts) if args.name_pieces else ()
    tok = build_tokenizer([*texts, *prompts[5]], names=names, pieces=pieces)
    config = TinyConfig(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.heads // 2,
                        intermediate=4 * args.hidden, lr=args.lr, name_std=args.name_std,
                        freeze_names=args.freeze_names)  # fmt: skip
    model = build_model(tok, config).to(args.device)
    ids = tok(sorted(set(data.corpus.titles)), add_special_tokens=False).input_ids
    anchor_names(model, {i[0] for i in ids if len(i) == 1 and i[0] != tok.unk_token_id}, config)
    out_dir, rows, start = tempfile.mkdtemp(prefix="probe_tiny_distractors_"), [], time.perf_counter()
    protocol = QA()

    def on_step(step: int) -> None:
        if step % args.eval_every and step != args.steps:
            return
        seconds = time.perf_counter() - start
        model.save_pretrained(out_dir)
        tok.save_pretrained(out_dir + "/tokenizer")
        generator = HFGenerator(out_dir, out_dir + "/tokenizer", batch_size=64, chat=False, dtype="float32",
                                logprobs=False, device=args.device)  # fmt: skip
        sampling = Sampling(max_new_tokens=12, stop=protocol.stop, include_stop=protocol.include_stop)
        row = [step, seconds]
        for n in PAGES:
            said = [o[0].text.strip() for o in generator.generate(prompts[n], sampling)]
            row.append(sum(s == a for s, (_, _, a) in zip(said, held, strict=True)) / len(held))
        rows.append(row)
        print("step {}  {:.0f} s  1 page {:.3f}  3 pages {:.3f}  5 pages {:.3f}".format(*row), flush=True)
        model.train()

    batches = (reading_batch(tok, batch, config.max_length) for batch in items)
    stats = train_loop(model, batches, args.steps, config, "qa reading", on_step)
    body = (f"{vars(args)}; parameters {sum(p.numel() for p in model.parameters())}, "
            f"{stats['steps_per_s']:.2f} steps/s, final loss {stats['final_loss']:.3f}\n\n"
            "| step | seconds (with evaluation) | 1 page | 3 pages | 5 pages |\n|---|---|---|---|---|\n"
            + "".join("| {} | {:.0f} | {:.3f} | {:.3f} | {:.3f} |\n".format(*r) for r in rows))  # fmt: skip
    publish("_".join(filter(None, ["probe_tiny_distractors", args.name])), body)


if __name__ == "__main__":
    main()
