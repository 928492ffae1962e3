"""Does the tiny LM copy entity names from its prompt? A probe for issue 5 (minutes of training; not in
`make bench`).

A fresh tiny Qwen2 (``generator=tiny``'s tokenizer and model code, hidden 64, 4 layers) trains on the
world teacher's demonstrations of the chosen protocols only: renamed afresh at every draw
(``tiny_world.renamer``, kinds kept), the loss on the completion and its EOS (``tiny.reading_example``),
one protocol per batch, taking turns. Every ``--eval-every`` steps it writes its greedy completions for
dev demonstrations (real names, never seen renamed) and scores exact match against the teacher's,
and, for each completion that names an entity, whether that entity is the teacher's and whether it
occurs in the prompt at all (a model that does not copy writes a name of the right kind from its
prior).

The switches are the ways of representing names that were measured (results in
experiments/results/probe_tiny_names.md):

- ``--split-names``: multi-word names as their words (``generator.whole_names=false``), not one token;
- ``--name-std S --freeze``: the single-token names' embeddings drawn at std S and frozen
  (``generator.name_std`` / ``freeze_names``);
- ``--shared``: with ``--name-std``, the names of one kind move together (their gradient is the
  kind's mean gradient): a trainable kind vector plus a frozen identity per name. Scratch only.

    .venv/bin/python experiments/probe_tiny_names.py --protocols apex_plan --steps 800 --split-names
"""

import argparse
import random
import re
import tempfile
import time

import torch
from benchlib import probe_world, publish

from rag_lab.env.protocols.base import PROTOCOLS
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.teacher.demos import collect
from rag_lab.generators.teacher.generator import TeacherGenerator
from rag_lab.generators.tiny import (
    TinyConfig,
    anchor_names,
    build_model,
    build_tokenizer,
    reading_batch,
    train_loop,
)
from rag_lab.generators.tiny_world import TAGS, page_facts, page_kinds, renamer


def share_kind_gradients(model, groups: list[list[int]]) -> None:
    """Each group's rows of the (tied) embedding get the group's mean gradient."""
    rows = [torch.tensor(g) for g in groups if g]

    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        for r in rows:
            grad[r] = grad[r].mean(0, keepdim=True)
        return grad

    model.get_input_embeddings().weight.register_hook(hook)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--protocols", default="apex_plan", help="comma-separated protocol names")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--eval-every", type=int, default=400)
    parser.add_argument("--n-eval", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--split-names", action="store_true")
    parser.add_argument("--no-rename", action="store_true")
    parser.add_argument("--name-std", type=float, default=0.0)
    parser.add_argument("--freeze", action="store_true")
    parser.add_argument("--shared", action="store_true")
    args, data, retriever = probe_world(parser)
    teacher = TeacherGenerator(data)
    train = collect(teacher, data.corpus, retriever, data.split("train"), 3, 6)
    dev = collect(teacher, data.corpus, retriever, data.split("dev"), 3, 6)
    protocols = args.protocols.split(",")
    pools = {p: sorted(train[p].items()) for p in protocols}
    held = {
        p: random.Random(1).sample(sorted(dev[p].items()), min(args.n_eval, len(dev[p]))) for p in protocols
    }

    entities = sorted(set(data.corpus.titles))
    kinds = page_kinds(page_facts(data))
    rename = renamer(entities, kinds)
    names = [] if args.split_names else sorted(t for t in entities if " " in t)
    texts = [p.contents for p in data.corpus] + [
        x for demos in train.values() for pc in demos.items() for x in pc
    ]
    tok = build_tokenizer(texts, TAGS, names)
    config = TinyConfig(hidden=64, layers=4, heads=args.heads, kv_heads=args.kv_heads, intermediate=256,
                        lr=args.lr, name_std=args.name_std, freeze_names=args.freeze)  # fmt: skip
    model = build_model(tok, config)
    ids = tok(entities, add_special_tokens=False).input_ids
    single = {e: i[0] for e, i in zip(entities, ids, strict=True) if len(i) == 1 and i[0] != tok.unk_token_id}
    anchor_names(model, set(single.values()), config)
    if args.shared:
        groups: dict[tuple[str, bool], list[int]] = {}
        for entity, token in single.items():
            groups.setdefault((kinds.get(entity, ""), " " in entity), []).append(token)
        share_kind_gradients(model, [sorted(set(g)) for g in groups.values()])

    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(entities, key=len, reverse=True))) + r")\b")
    out_dir = tempfile.mkdtemp(prefix="probe_tiny_names_")

    def evaluate() -> dict[str, tuple[float, int, int, int]]:
        model.save_pretrained(out_dir)
        tok.save_pretrained(out_dir + "/tokenizer")
        generator = HFGenerator(out_dir, out_dir + "/tokenizer", batch_size=64, chat=False, dtype="float32",
                                logprobs=False)  # fmt: skip
        scores = {}
        for name in protocols:
            protocol, items = PROTOCOLS[name](), held[name]
            sampling = Sampling(max_new_tokens=60, stop=protocol.stop, include_stop=protocol.include_stop)
            said = [o[0].text.strip() for o in generator.generate([p for p, _ in items], sampling)]
            em = sum(s == c.strip() for s, (_, c) in zip(said, items, strict=True)) / len(items)
            naming = same = in_prompt = 0
            for s, (p, c) in zip(said, items, strict=True):
                if (mine := pattern.search(s)) and (wanted := pattern.search(c)):
                    naming += 1
                    same += mine.group(0) == wanted.group(0)
                    in_prompt += mine.group(0) in p
            scores[name] = (em, naming, same, in_prompt)
            print(f"  {name}: EM {em:.2f}, naming {naming}, teacher's entity {same}, in prompt {in_prompt}")
        model.train()
        return scores

    rng, rows, start = random.Random(0), [], time.perf_counter()

    def batches():
        for step in range(1, args.steps + 1):
            demos = [rng.choice(pools[protocols[step % len(protocols)]]) for _ in range(args.batch_size)]
            if not args.no_rename:
                demos = [rename(d, rng) for d in demos]
            yield reading_batch(tok, [(p, c + tok.eos_token) for p, c in demos], 1024)

    def on_step(step: int) -> None:
        if step % args.eval_every == 0 or step == args.steps:
            seconds = time.perf_counter() - start
            print(f"step {step}  {seconds:.0f} s", flush=True)
            rows.extend((step, seconds, name, *score) for name, score in evaluate().items())

    stats = train_loop(model, batches(), args.steps, config, "demos", on_step)
    body = (f"{vars(args)}; final loss {stats['final_loss']:.3f}\n\n"
            "| step | seconds | protocol | EM vs teacher "
            "| completions naming an entity | the teacher's entity | an entity of the prompt |\n"
            "|---|---|---|---|---|---|---|\n"
            + "".join(f"| {s} | {t:.0f} | {p} | {em:.2f} | {n} | {same} | {inp} |\n"
                      for s, t, p, em, n, same, inp in rows))  # fmt: skip
    publish("_".join(filter(None, ["probe_tiny_names", args.name])), body)


if __name__ == "__main__":
    main()
