"""Does a trained tiny LM read in every layout the policies use? A probe for issue 5.

Reading learned in one prompt layout did not carry to another (experiments/results/
probe_tiny_layouts_*.md): so this scores one checkpoint on the same corpus facts (``page_facts``:
a page and a relation question about its entity → the value the page states) rendered as

- ``drill``: ``Document: <title>\\n<text>\\nQuestion: q\\nAnswer:`` (``reading_drills``);
- ``qa, n pages``: the ``qa`` protocol's own prompt (standard RAG, Iter-RetGen) with the page and
  n - 1 BM25 neighbours of the question, shuffled (what retrieval puts next to it);
- ``stoprag_intermediate``: Stop-RAG's intermediate-answer prompt, question first, one page.

Greedy decoding through ``HFGenerator`` (batched), exact match of the first line. The facts are the
corpus's own, so a model that trained on renamed copies of them (``rename_entities``, the reading
stage) has seen the pages but never these names on them.

    .venv/bin/python experiments/probe_tiny_layouts.py ~/.cache/rag_lab/tiny_lm/<hash> --name t7
"""

import argparse
import random
from pathlib import Path

from benchlib import publish

from rag_lab.data.synth import SynthDataset
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.tiny_world import intermediate_prompt, page_facts, qa_prompt
from rag_lab.retrievers.bm25 import BM25Retriever


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="a tiny LM directory (cache_dir/tiny_lm/<hash>)")
    parser.add_argument("--name", default="", help="suffix of the results file")
    parser.add_argument("--n", type=int, default=200, help="facts to score")
    parser.add_argument("--cache", default="~/.cache/rag_lab")
    args = parser.parse_args()
    data = SynthDataset(args.cache)
    facts = [(page, q, a) for page, qas in page_facts(data) for q, a in qas]
    random.Random(0).shuffle(facts)
    facts = facts[: args.n]
    by_id = {p.id: p for p in data.corpus}
    hits = BM25Retriever(data.corpus, cache_dir=args.cache).search([q for _, q, _ in facts], 5)
    model = str(Path(args.model).expanduser())
    generator = HFGenerator(model, model + "/tokenizer", batch_size=64, seed=0, chat=False, dtype="float32")

    def with_neighbours(i: int, n: int) -> list:
        page = facts[i][0]
        pages = [by_id[h.id] for h in hits[i] if h.id != page.id][: n - 1] + [page]
        random.Random(i).shuffle(pages)
        return pages

    layouts = {
        "drill": [f"Document: {p.contents}\nQuestion: {q}\nAnswer:" for p, q, _ in facts],
        **{
            f"qa, {n} page{'s' * (n > 1)}": [
                qa_prompt(q, with_neighbours(i, n)) for i, (_, q, _) in enumerate(facts)
            ]
            for n in (1, 3, 5)
        },
        "stoprag_intermediate, 1 page": [intermediate_prompt(q, p) for p, q, _ in facts],
    }
    rows = []
    for name, prompts in layouts.items():
        out = generator.generate(prompts, Sampling(n=1, temperature=0.0, max_new_tokens=12, stop=("\n",)))
        said = [o[0].text.strip().split("\n")[0] for o in out]
        accuracy = sum(s == a for s, (_, _, a) in zip(said, facts, strict=True)) / len(facts)
        rows.append((name, accuracy, said[:3]))
        print(f"{name:30s} {accuracy:.3f}  e.g. {said[:3]}", flush=True)
    body = (f"model `{args.model}`, {len(facts)} corpus facts, greedy, exact match\n\n"
            "| layout | accuracy | first answers |\n|---|---|---|\n"
            + "".join(f"| {n} | {a:.3f} | {', '.join(s)} |\n" for n, a, s in rows)
            + f"\nwanted: {', '.join(a for _, _, a in facts[:3])}\n")  # fmt: skip
    publish("_".join(filter(None, ["probe_tiny_layouts", args.name])), body)


if __name__ == "__main__":
    main()
