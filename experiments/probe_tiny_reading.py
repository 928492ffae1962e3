"""Can the tiny LM learn to *read*? A probe for issue 5 (not part of `make bench`: minutes of training).

Reading drills from the embedded world: for every corpus page and every relation the sub-questions
ask, ``Document: <page>\\nQuestion: <relation question about the page's entity>\\nAnswer:`` → the
value the world teacher's reader finds in the page (``answer_from``). 200 drills are held out. A
fresh tiny Qwen2 (``generator=tiny``'s tokenizer and model code) trains with the loss on the answer
only, and reports greedy first-word accuracy on held-out and training drills.

``--rename`` re-maps every entity title in each training drill to a random other title (consistent
within the drill; ``tiny_world.renamer``, entity anonymisation, Hermann et al. 2015). With names
as single tokens a model can lower its loss by storing facts in the name embeddings instead of
reading; renamed drills leave reading as the only way. Held-out drills keep their real names.

    .venv/bin/python experiments/probe_tiny_reading.py --rename --steps 3000

The other switches try ways past the plateau (experiments/results/probe_tiny_reading.md has the
results): ``--typed`` renames within an entity kind (a country for a country), ``--copy N`` runs
generator=tiny's copy warm-up first, ``--qfirst`` puts the question before the page, ``--dense``
puts the loss on every token, ``--curriculum N`` grows the page from the answer's sentence to all
of it over the first N steps, ``--evidence F`` asks for the sentence that states the answer (a
span to copy) instead of the answer in a fraction F of the drills, ``--pages`` trains on whole pages
with every question the page answers (``tiny_world.reading_pages``: the loss on each answer), not
one question per page.
"""

import argparse
import random
import time
from dataclasses import replace

import torch
from benchlib import publish
from transformers import get_cosine_schedule_with_warmup

from rag_lab.data.synth import SynthDataset
from rag_lab.generators.tiny import (
    TinyConfig,
    build_model,
    build_tokenizer,
    copy_texts,
    pretrain,
    reading_batch,
)
from rag_lab.generators.tiny_world import (
    TAGS,
    page_facts,
    page_kinds,
    reading_drills,
    reading_pages,
    renamer,
    shuffle_questions,
)


def evidence(prompt: str, completion: str) -> tuple[str, str]:
    """The drill asking for the page's sentence that states the answer, instead of the answer."""
    head, question = prompt.removesuffix("\nAnswer:").rsplit("\nQuestion: ", 1)
    text = head.split("\n", 1)[1]
    sentence = next((x for x in text.split(". ") if completion.strip() in x), None)
    if sentence is None:
        return prompt, completion
    return f"{head}\nQuestion: {question}\nEvidence:", " " + sentence.rstrip(".") + "."


def question_first(prompt: str) -> str:
    document, question = prompt.removesuffix("\nAnswer:").rsplit("\nQuestion: ", 1)
    return f"Question: {question}\n{document}\nAnswer:"


def shorten(prompt: str, completion: str, rng: random.Random, n: int) -> tuple[str, str]:
    """The drill with its page cut to the answer's sentence and n - 1 other sentences of it."""
    head, question = prompt.rsplit("\nQuestion: ", 1)
    title, text = head.removeprefix("Document: ").split("\n", 1)
    sentences = [x for x in text.split(". ") if x]
    keep = [x for x in sentences if completion.strip() in x][:1]
    others = [x for x in sentences if x not in keep]
    keep += rng.sample(others, min(len(others), n - 1))
    rng.shuffle(keep)
    return f"Document: {title}\n" + ". ".join(keep).rstrip(".") + ".\nQuestion: " + question, completion


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rename", action="store_true")
    parser.add_argument("--typed", action="store_true")
    parser.add_argument("--curriculum", type=int, default=0)
    parser.add_argument("--dense", action="store_true")
    parser.add_argument("--qfirst", action="store_true")
    parser.add_argument("--copy", type=int, default=0)
    parser.add_argument("--evidence", type=float, default=0.0)
    parser.add_argument("--pages", action="store_true")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--cache", default="~/.cache/rag_lab")
    args = parser.parse_args()
    if args.pages and (args.qfirst or args.evidence or args.curriculum):
        parser.error("--pages goes with --rename, --typed, --copy, --dense only")
    torch.set_num_threads(2)
    data = SynthDataset(args.cache)
    facts = page_facts(data)
    pairs = reading_drills(facts)
    if args.qfirst:
        pairs = [(question_first(p), c) for p, c in pairs]
    random.Random(0).shuffle(pairs)
    held, train = pairs[:200], pairs[200:]
    # --pages: every page with the questions of its training drills (the held-out ones left out)
    held_out = set(held)
    pages = reading_pages(
        [
            (page, kept)
            for page, qas in facts
            if (kept := [qa for qa in qas if reading_drills([(page, [qa])])[0] not in held_out])
        ]
    )
    names = sorted({t for t in data.corpus.titles if " " in t})
    tok = build_tokenizer([p.contents for p in data.corpus] + [p + c for p, c in pairs], TAGS, names)
    config = TinyConfig(hidden=args.hidden, layers=args.layers, heads=4, kv_heads=2,
                        intermediate=4 * args.hidden, batch_size=args.batch_size, lr=args.lr)  # fmt: skip
    model = build_model(tok, config)
    if args.copy:  # generator=tiny's copy warm-up: induction heads first
        start = time.perf_counter()
        warm = replace(config, pretrain_steps=args.copy, batch_size=8, pretrain_length=256, lr=1e-3)
        stats = pretrain(model, tok, copy_texts(names, 0), warm)
        seconds = time.perf_counter() - start
        print(f"copy warm-up: {args.copy} steps, {seconds:.0f} s, loss {stats['final_loss']:.3f}", flush=True)
    rename = renamer(sorted(set(data.corpus.titles)), page_kinds(facts) if args.typed else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = get_cosine_schedule_with_warmup(opt, 50, args.steps)
    rng = random.Random(0)

    def accuracy(items) -> float:
        model.eval()
        ok = 0
        for p, c in items:
            ids = tok(p, add_special_tokens=False).input_ids
            with torch.no_grad():
                out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                                     pad_token_id=tok.pad_token_id)  # fmt: skip
            ok += tok.decode(out[0, len(ids) :]).strip().startswith(c.split()[0])
        model.train()
        return ok / len(items)

    rows, start = [], time.perf_counter()
    model.train()
    for step in range(1, args.steps + 1):
        batch = [
            rename((p, c), rng) if args.rename else (p, c) for p, c in rng.sample(train, args.batch_size)
        ]
        if args.evidence:
            batch = [evidence(p, c) if rng.random() < args.evidence else (p, c) for p, c in batch]
        if args.curriculum and step <= args.curriculum:
            batch = [shorten(p, c, rng, 1 + 6 * step // args.curriculum) for p, c in batch]
        if args.pages:
            batch = [shuffle_questions(item, rng) for item in rng.sample(pages, args.batch_size)]
            batch = [rename(item, rng) if args.rename else item for item in batch]
        inputs = reading_batch(tok, batch, 1024)  # the loss on the answers only ...
        if args.dense:  # ... or on every token
            inputs["labels"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        loss = model(**inputs).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if step % 200 == 0 or step == args.steps:
            row = (step, time.perf_counter() - start, loss.item(), accuracy(held), accuracy(train[:100]))
            rows.append(row)
            print("step {}  {:.0f} s  loss {:.3f}  held-out {:.3f}  train {:.3f}".format(*row), flush=True)
    flags = [k for k in ("rename", "typed", "qfirst", "dense", "pages") if getattr(args, k)]
    flags += [f"{k}{getattr(args, k)}" for k in ("copy", "curriculum", "evidence") if getattr(args, k)]
    body = (f"{len(train)} training drills, 200 held out; {vars(args)}\n\n"
            "| step | seconds | loss | held-out acc | train acc |\n|---|---|---|---|---|\n"
            + "".join(f"| {s} | {t:.0f} | {lo:.3f} | {h:.3f} | {tr:.3f} |\n"
                      for s, t, lo, h, tr in rows))  # fmt: skip
    publish("_".join(["probe_tiny_reading", *flags]), body)


if __name__ == "__main__":
    main()
