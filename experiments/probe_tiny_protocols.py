"""Which protocol step does a trained tiny LM get wrong? A probe for issue 5.

A dev EM says how often a pipeline ends right, not which of its steps fails. This replays the world
teacher's own rollouts on the first ``--questions`` dev questions (``teacher.demos.collect``: every
prompt a policy sent it, with the teacher's completion) and asks each checkpoint for the same
completion, greedy, up to the protocol's stop: exact match per protocol, and by the number of
follow-up steps already in the prompt (0 for a first query, 5 for "5 or more"). The teacher is a
simulator, not the truth: an answer the teacher would phrase otherwise counts as wrong. It found
that generator=tiny_reading's base model wrote the right first follow-up query for 0.37 of prompts and
a later one for 0.00-0.09, and that a protocol stage fixes most of that
(experiments/results/probe_tiny_protocols.md).

    .venv/bin/python experiments/probe_tiny_protocols.py ~/.cache/rag_lab/tiny_lm/<hash> [more dirs]
"""

import argparse
import random
from collections import defaultdict
from pathlib import Path

from benchlib import probe_world, publish

from rag_lab.env.protocols import PROTOCOLS
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.generators.teacher.demos import collect
from rag_lab.generators.teacher.generator import TeacherGenerator

STEPS = 5  # the last bucket: this many follow-up steps or more


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoints", nargs="+", help="tiny LM directories (cache_dir/tiny_lm/<hash>)")
    parser.add_argument("--protocols", default="stoprag_query,stoprag_intermediate,stoprag_final")
    parser.add_argument("--questions", type=int, default=150, help="the first dev questions")
    parser.add_argument("--prompts", type=int, default=240, help="prompts per protocol, drawn at random")
    parser.add_argument("--iterations", type=int, default=10, help="the teacher's Stop-RAG horizon")
    args, data, retriever = probe_world(parser)
    demos = collect(TeacherGenerator(data), data.corpus, retriever, data.split("dev")[: args.questions], 3,
                    args.iterations)  # fmt: skip
    rows = []
    for checkpoint in args.checkpoints:
        path = Path(checkpoint).expanduser()
        generator = HFGenerator(
            str(path), str(path / "tokenizer"), batch_size=32, chat=False, dtype="float32", logprobs=False
        )
        for name in args.protocols.split(","):
            items = sorted(demos[name].items())
            random.Random(0).shuffle(items)
            items = items[: args.prompts]
            protocol = PROTOCOLS[name]
            sampling = Sampling(max_new_tokens=40, stop=protocol.stop, include_stop=protocol.include_stop)
            said = [out[0].text.strip() for out in generator.generate([p for p, _ in items], sampling)]
            by_steps = defaultdict(list)
            for (prompt, wanted), text in zip(items, said, strict=True):
                by_steps[min(prompt.count("Follow up:"), STEPS)].append(text == wanted.strip())
            right = sum(sum(v) for v in by_steps.values()) / len(items)
            steps = ", ".join(f"{k}: {sum(v) / len(v):.2f} ({len(v)})" for k, v in sorted(by_steps.items()))
            rows.append(f"| {path.name} | {name} | {len(items)} | {right:.3f} | {steps} |")
            print(rows[-1], flush=True)
    header = "| checkpoint | protocol | prompts | exact match | by follow-up steps: match (prompts) |"
    body = f"{vars(args)}\n\n{header}\n|---|---|---|---|---|\n" + "\n".join(rows) + "\n"
    publish("_".join(filter(None, ["probe_tiny_protocols", args.name])), body)


if __name__ == "__main__":
    main()
