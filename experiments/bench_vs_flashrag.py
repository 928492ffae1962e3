"""rag_lab beside FlashRAG (``flashrag-dev`` 0.1.2, the release on PyPI), in one run on one machine:
standard RAG (our ``standard_rag`` policy, FlashRAG's ``SequentialPipeline``) and Iter-RetGen
(``iter_retgen``, ``IterativePipeline``) on the same synth test questions (FlashRAG's jsonl), the same
corpus and the same BM25 index (built once by our retriever with FlashRAG's query tokenization: bm25s's
English stop words, the Snowball English stemmer; saved with the corpus in bm25s's format, which FlashRAG
loads), the same generator (the tiny LM, SmolLM2-135M-Instruct; transformers, greedy, 32 new tokens, stop
at a newline, batch 64) and the same prompt text (our ``qa`` protocol's, given to FlashRAG's
``PromptTemplate``; the bench counts the prompts that match character for character).

    make bench-peers          # builds .venv-peers (FlashRAG, pinned), then runs this script
    python experiments/bench_vs_flashrag.py [--generators tiny,smollm2] [--questions 256] [--peer-python PY]

Each pipeline runs in its own process per side (peak RSS is that process's); the clock covers answering the
questions (retrieval, prompts, generation), not loading the model or the index. Each side's result is kept in
``--work`` (default outputs/bench_vs_flashrag/) and reused while its spec is the same: a killed bench
resumes; delete the folder to measure again. Both sides' predictions are scored by our scorer and by
FlashRAG's evaluator; where answers differ, examples say why (retrieval, prompt or decoding). Writes
experiments/results/bench_vs_flashrag.md.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from benchlib import ForwardClock, peak_rss_mb, publish, shipped_lm

ROOT = Path(__file__).resolve().parent.parent
SIDE = Path(__file__).resolve().parent / "peers" / "flashrag_side.py"
K, MAX_NEW_TOKENS, ITERATIONS, BATCH = 5, 32, 3, 64
# FlashRAG's BM25 query side: bm25s.tokenize (English stop words) + Snowball English; ours set to the same.
BM25_LIKE_FLASHRAG = {"stemmer": "english", "stopwords": "en"}
RETRIEVER = ["retriever=bm25", *(f"retriever.{key}={value}" for key, value in BM25_LIKE_FLASHRAG.items())]
GENERATORS = {
    # overrides, FlashRAG's model folder name (its chat detection reads the name), prompt token limit
    "tiny": (["generator=tiny"], "tiny_lm", 1024),
    "smollm2": (["generator=smollm2", f"generator.batch_size={BATCH}"], "SmolLM2-135M-Instruct", 2048),
}
QUESTIONS = {"tiny": 256, "smollm2": 64}
PIPELINES = {"sequential": "standard_rag", "iterative": "iter_retgen"}


def compose_for(generator: str):
    from rag_lab.core.config import compose

    return compose([*GENERATORS[generator][0], *RETRIEVER])


def qa_prompt(chat: bool) -> dict:
    """Our ``qa`` protocol's prompt as FlashRAG's PromptTemplate arguments (same text, checked per item)."""
    from rag_lab.env.protocols.simple import QA

    user = "Documents:\n{reference}Question: {question}"
    prompt = {"reference_template": "{title}: {text}\n"}
    if chat:
        return prompt | {
            "system_prompt": QA.system.replace("{", "{{").replace("}", "}}"),
            "user_prompt": user,
        }
    return prompt | {"system_prompt": "", "user_prompt": user + QA().tag}


def link_model(generator, folder: Path) -> Path:
    """The model's files under the name FlashRAG sees (its chat detection reads the folder's name)."""
    folder.mkdir(parents=True, exist_ok=True)
    for source in {generator.model.name_or_path, generator.tokenizer.name_or_path}:
        for f in Path(source).iterdir():
            if f.is_file() and not (folder / f.name).exists():
                (folder / f.name).symlink_to(f.resolve())
    return folder


def export_index(retriever, path: Path) -> None:
    """Our BM25 index in bm25s's format, the corpus beside it (``{id, contents}``), as FlashRAG loads it."""
    corpus = retriever.corpus
    rows = zip(corpus.ids, corpus.titles, corpus.texts, strict=True)
    retriever.index.save(
        str(path), corpus=[{"id": i, "contents": f"{t}\n{x}"} for i, t, x in rows], show_progress=False
    )


def prepare(generator: str, n: int, work: Path) -> dict:
    """The shared inputs: questions as FlashRAG jsonl, the BM25 index with the corpus, the model folder."""
    from hydra.utils import instantiate

    from rag_lab.core.config import build

    cfg = compose_for(generator)
    data = instantiate(cfg.data)
    examples = data.split("test")[:n]
    (work / "data" / "bench").mkdir(parents=True, exist_ok=True)
    rows = [{"id": ex.id, "question": ex.question, "golden_answers": list(ex.answers)} for ex in examples]
    (work / "data" / "bench" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = work / "index"
    if not (index / "corpus.jsonl").exists():
        export_index(build(cfg.retriever, corpus=data.corpus), index)
    gen = build(cfg.generator, data=data)
    name, max_len = GENERATORS[generator][1:]
    model = link_model(gen, work / "models" / name)
    settings = {
        "data_dir": str(work / "data"),
        "dataset_name": "bench",
        "index_path": str(index),
        "retrieval_topk": K,
        "generator_model": name,
        "generator_model_path": str(model),
        "generator_max_input_len": max_len,
        "generator_batch_size": BATCH,
        "generation_params": {"max_tokens": MAX_NEW_TOKENS, "do_sample": False, "stop": ["\n"]},
        "save_dir": str(work / "flashrag_runs"),
        "seed": 0,
    }
    golds = {r["id"]: r["golden_answers"] for r in rows}
    # a tokenizer in its own folder (the tiny LM's): FlashRAG is handed it (flashrag_side.use_tokenizer)
    own = gen.tokenizer.name_or_path != gen.model.name_or_path
    return {
        "tokenizer_path": gen.tokenizer.name_or_path if own else None,
        "config": settings,
        "chat": bool(gen.chat),
        "prompt": qa_prompt(bool(gen.chat)),
        "golds": golds,
    }


class Recorder:
    """Wraps a generator (``generate``) or a retriever (``search``) and keeps each call's inputs and outputs:
    the prompts as the model reads them and the answers' first lines, or the hits. The recording runs inside
    our side's clock (it only slows rag_lab's numbers)."""

    def __init__(self, inner):
        self.inner, self.calls, self.seconds = inner, [], 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, sampling):
        from rag_lab.env.protocols.base import first_line
        from rag_lab.generators.base import render

        out = self.inner.generate(prompts, sampling)
        rendered = [render(self.inner.tokenizer, p) for p in prompts]
        self.calls.append([(p, first_line(c[0].text)) for p, c in zip(rendered, out, strict=True)])
        return out

    def search(self, queries, k, exclude=None):
        start = time.perf_counter()
        hits = self.inner.search(queries, k, exclude)
        self.seconds += time.perf_counter() - start
        self.calls.append(hits)
        return hits


def run_ours(spec: dict) -> dict:
    """Our policy over the spec's questions in batches of 64 (the process ``--ours`` starts)."""
    from hydra.utils import instantiate

    from rag_lab.core.config import build
    from rag_lab.env import Env
    from rag_lab.policies.prompting import IterRetGen, StandardRAG

    start = time.perf_counter()
    cfg = compose_for(spec["generator"])
    data = instantiate(cfg.data)
    wanted = set(spec["golds"])
    examples = [ex for ex in data.split("test") if ex.id in wanted]
    generator = Recorder(build(cfg.generator, data=data))
    retriever = Recorder(build(cfg.retriever, corpus=data.corpus))
    env = Env(data.corpus, retriever, generator)
    if spec["pipeline"] == "sequential":
        policy = StandardRAG(k=K, max_new_tokens=MAX_NEW_TOKENS)
    else:
        policy = IterRetGen(iterations=ITERATIONS, k=K, max_new_tokens=MAX_NEW_TOKENS)
    retriever.inner.search(["warm up"], K)  # as FlashRAG's side does (its numba top-k compiles then)
    load = time.perf_counter() - start
    clock = ForwardClock(generator.inner.model)
    start = time.perf_counter()
    items = []
    for i in range(0, len(examples), BATCH):
        generator.calls, retriever.calls = [], []
        for row, ep in enumerate(policy.rollout(env, examples[i : i + BATCH])):
            items.append(
                {
                    "id": ep.question_id,
                    "prediction": ep.prediction,
                    "prompts": [call[row][0] for call in generator.calls],
                    "answers": [call[row][1] for call in generator.calls],
                    "retrieved": [[h.id for h in call[row]] for call in retriever.calls],
                    "scores": [[h.score for h in call[row]] for call in retriever.calls],
                }
            )
    seconds = time.perf_counter() - start
    clock.close()
    return {
        "seconds": seconds,
        "load_seconds": load,
        "peak_rss_mb": peak_rss_mb(),
        **clock.seconds,
        "retrieve": retriever.seconds,
        "items": items,
    }


REUSED: list[str] = []  # the side results this run found in --work instead of measuring


def side(command: list[str], spec: dict, out: Path) -> dict:
    """One side's process: writes the spec, runs, reads the result (stderr shown on failure). A result
    already there for the same spec is reused (a killed bench resumes; delete the work folder to measure
    again)."""
    spec_path, text = out.with_suffix(".spec.json"), json.dumps(spec)
    if out.exists() and spec_path.exists() and spec_path.read_text() == text:
        print(f"reusing {out} (same spec)", file=sys.stderr)
        REUSED.append(out.name)
        return json.loads(out.read_text())
    out.unlink(missing_ok=True)
    spec_path.write_text(text)
    done = subprocess.run([*command, str(spec_path), str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def why(ours: dict, theirs: dict) -> tuple[str, str]:
    """Why one question's answers differ: (cause, detail) at the first round where the two sides part (a
    later round's query holds the earlier answer, so the first difference is the cause of the rest)."""
    for r in range(len(ours["prompts"])):
        if ours["retrieved"][r] != theirs["retrieved"][r]:
            detail = f"round {r + 1}: ours {ours['retrieved'][r]}, FlashRAG {theirs['retrieved'][r]}"
            a, b = (sorted(round(x, 4) for x in side["scores"][r]) for side in (ours, theirs))
            if a == b:
                return "BM25 ties ordered differently (same scores)", detail
            return "different passages (different scores)", detail + f"; scores {a} vs {b}"
        x, y = ours["prompts"][r], theirs["prompts"][r]
        if x != y:
            at = next((i for i, (c, d) in enumerate(zip(x, y, strict=False)) if c != d), min(len(x), len(y)))
            return (
                "prompts differ",
                f"round {r + 1}, character {at}: ours {x[at : at + 40]!r}, FlashRAG {y[at : at + 40]!r}",
            )
        mine, flash = ours["answers"][r], theirs["answers"][r]
        if mine != flash:
            if mine.startswith(flash):
                return "same prompts, FlashRAG's answer cut short", f"round {r + 1}: its batch stopped early"
            return "same prompts, decoding differs", f"round {r + 1}: batch padding (float rounding)"
    return "same prompts, decoding differs", "the final answers' parsing"


def compare(ours: dict, theirs: dict, golds: dict, flashrag_scored: tuple[dict, dict]) -> dict:
    """Both sides' EM / F1 by our scorer and FlashRAG's, how often the two agree, and each difference."""
    from rag_lab.eval.metrics import accuracy, exact_match, f1_score

    pairs = list(zip(ours["items"], theirs["items"], strict=True))
    assert all(a["id"] == b["id"] for a, b in pairs), "the two sides answered different questions"
    n, same = len(pairs), [a["prompts"] == b["prompts"] for a, b in pairs]
    row = {}
    for name, result, fr in zip(("rag_lab", "FlashRAG"), (ours, theirs), flashrag_scored, strict=True):
        preds = [(r["prediction"], golds[r["id"]]) for r in result["items"]]
        em, f1 = (100 * sum(f(p, g) for p, g in preds) / n for f in (exact_match, f1_score))
        row[f"{name} EM (ours / FR's scorer)"] = f"{em:.1f} / {fr['em']:.1f}"
        row[f"{name} F1 (ours / FR's scorer)"] = f"{f1:.1f} / {fr['f1']:.1f}"
    alike = [a["prediction"] == b["prediction"] for (a, b), s in zip(pairs, same, strict=True) if s]
    row |= {
        "same passages": f"{sum(a['retrieved'] == b['retrieved'] for a, b in pairs)}/{n}",
        "same prompts": f"{sum(same)}/{n}",
        "same answers": f"{sum(a['prediction'] == b['prediction'] for a, b in pairs)}/{n}",
        "same answers where prompts are the same": f"{sum(alike)}/{len(alike)}",
    }
    # per item, our scorer against FlashRAG's on the same predictions (both sides')
    apart = {}
    for metric, ours_metric in (("em", exact_match), ("f1", f1_score), ("acc", accuracy)):
        apart[metric] = [
            (r["prediction"], golds[r["id"]], mine, theirs_score)
            for result, fr in zip((ours, theirs), flashrag_scored, strict=True)
            for r, theirs_score in zip(result["items"], fr[f"{metric}_per_item"], strict=True)
            if abs((mine := ours_metric(r["prediction"], golds[r["id"]])) - theirs_score) > 1e-9
        ]
    row["_scorers_apart"] = apart
    row["_examples"] = [
        {"id": a["id"], "ours": a["prediction"], "flashrag": b["prediction"], "why": why(a, b)}
        for a, b in pairs
        if a["prediction"] != b["prediction"]
    ]
    return row


def flashrag_scores(peer: str, result: dict, golds: dict, out: Path) -> dict:
    items = [{"id": r["id"], "prediction": r["prediction"], "golds": golds[r["id"]]} for r in result["items"]]
    return side([peer, str(SIDE), "score"], {"items": items}, out)


def padding(ours: dict, theirs: dict, tokenizer_path: str) -> str:
    """Prompt tokens each side's prefill reads per real prompt token: both generate each round's prompts in
    the same batches of 64; FlashRAG pads a batch to its longest prompt, our engine reads length groups
    (``rag_lab.generators.decode.prefill_groups``)."""
    from transformers import AutoTokenizer

    from rag_lab.generators.decode import prefill_groups

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    real = padded_ours = padded_theirs = 0
    for r in range(len(ours["items"][0]["prompts"])):
        for side_items, is_ours in ((ours["items"], True), (theirs["items"], False)):
            for b in range(0, len(side_items), BATCH):
                prompts = [item["prompts"][r] for item in side_items[b : b + BATCH]]
                lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=False).input_ids]
                if is_ours:
                    real += sum(lengths)
                    padded_ours += sum(max(lengths[i] for i in g) * len(g) for g in prefill_groups(lengths))
                else:
                    padded_theirs += max(lengths) * len(lengths)
    return f"{padded_ours / real:.2f} / {padded_theirs / real:.2f}"


def bench(generator: str, n: int, peer: str, work: Path) -> list[dict]:
    """Both pipelines on ``generator``: each side in its own process, then both scored by both scorers."""
    spec = prepare(generator, n, work)
    rows = []
    for pipeline, policy in PIPELINES.items():
        run = {**spec, "pipeline": pipeline, "iterations": ITERATIONS, "generator": generator}
        run["config"] = {**spec["config"], "save_note": f"{generator}_{pipeline}"}
        ours = side([sys.executable, __file__, "--ours"], run, work / f"ours_{pipeline}.json")
        theirs = side([peer, str(SIDE), "run"], run, work / f"flashrag_{pipeline}.json")
        tokenizer = spec["tokenizer_path"] or spec["config"]["generator_model_path"]
        scored = tuple(
            flashrag_scores(peer, result, spec["golds"], work / f"flashrag_scores_{name}_{pipeline}.json")
            for name, result in (("ours", ours), ("theirs", theirs))
        )
        rows.append(
            {
                "generator": generator,
                "pipeline": f"{policy} / {pipeline.capitalize()}Pipeline",
                "questions": n,
                "rag_lab q/s": n / ours["seconds"],
                "FlashRAG q/s": n / theirs["seconds"],
                "speed-up": theirs["seconds"] / ours["seconds"],
                "rag_lab peak MB": ours["peak_rss_mb"],
                "FlashRAG peak MB": theirs["peak_rss_mb"],
                "prefill s (rag_lab / FlashRAG)": f"{ours['prefill']:.1f} / {theirs['prefill']:.1f}",
                "decode s (rag_lab / FlashRAG)": f"{ours['decode']:.1f} / {theirs['decode']:.1f}",
                "prefill tokens per prompt token (rag_lab / FlashRAG)": padding(ours, theirs, tokenizer),
                "retrieve s (rag_lab / FlashRAG)": f"{ours['retrieve']:.2f} / {theirs['retrieve']:.2f}",
                "load s (rag_lab / FlashRAG)": f"{ours['load_seconds']:.1f} / {theirs['load_seconds']:.1f}",
                **compare(ours, theirs, spec["golds"], scored),
            }
        )
    return rows


NOTES = """## How FlashRAG was run

- Installed from PyPI into `.venv-peers` by `make bench-peers` (requirements:
  `experiments/peers/requirements-flashrag.txt`), every package both sides use at the main environment's
  version (torch, transformers, tokenizers, bm25s, numpy). `pip install flashrag-dev` itself **fails
  offline**: its `bm25s[full]` pulls `pytrec_eval`, whose build downloads trec_eval from GitHub; so
  `flashrag-dev` goes in with `--no-deps` beside the packages it imports on this path. `pip check` then
  lists fschat, rank-bm25, spacy and streamlit as missing: none is imported by the
  two pipelines with `framework: hf` and bm25s.
- Four workarounds, all in `experiments/peers/flashrag_side.py`, none in FlashRAG's code: (1) the 0.1.2 wheel
  leaves out `flashrag/config/basic_config.yaml`, so `Config()` raises FileNotFoundError: a `Config` subclass
  supplies the defaults (every key these pipelines read); (2) its bm25s retriever returns numpy arrays that
  `Dataset.save` cannot write: a subclass returns lists; (3) its BM25 index builder in 0.1.2 indexes
  characters, not words: the index is ours, built with FlashRAG's query tokenization and saved with the
  corpus in bm25s's format (a test checks that bm25s queried FlashRAG's way ranks and scores as our retriever
  does); (4) for the tiny LM, transformers 5 builds Qwen2's byte-level tokenizer from any folder whose config
  is `qwen2`, not the word-level one saved there: FlashRAG's generator and prompt template get the tokenizer
  from its own folder, padded as FlashRAG pads.
- Settings: `framework: hf`, `gpu_id: null` (CPU), `generation_params: {max_tokens: 32, do_sample: false,
  stop: ["\\n"]}`, `generator_batch_size: 64`, `retrieval_topk: 5`, `IterativePipeline(iter_num=3)`, the
  prompt as `PromptTemplate(system_prompt, user_prompt, reference_template="{title}: {text}\\n")` so that
  its text equals our `qa` protocol's (plain for the tiny LM, chat messages through SmolLM2's template, which
  FlashRAG applies because the model folder's name holds "Instruct").
- What differs by design: FlashRAG's stop rule halts a batch only when every row holds the stop string (rows
  that finished keep decoding) and cuts the text afterwards; FlashRAG pads each batch of 64 to its longest
  prompt and always computes the softmax of every step's scores; our engine reads prompts in length groups
  and drops each row when it ends. BM25 ties: ours are ordered by corpus position, bm25s's numba top-k orders
  them its own way, so on this templated corpus (many equal scores) a tie at the cut-off changes the passages.
- Where the time goes (the profile columns): on the prefill, FlashRAG pads each batch of 64 to its longest
  prompt, ours reads groups of similar length (`rag_lab/generators/decode.py`), so it reads fewer tokens
  and attention (quadratic in the padded length) costs less; on the decode, FlashRAG's rows keep decoding
  until every row of the batch has stopped and every step computes the softmax over the vocabulary of every
  row, while ours drop out as they end; retrieval is a rounding error on both sides.
- FlashRAG's stop rule has a bug that cuts answers short: `StopWordCriteria` is built with the prompts of
  the whole question list, and at each step reads row i's prompt length from prompt i of that list, not of
  the current batch (and ignores left padding); from the second batch of 64 on, a row's window can hold the
  end of its prompt, whose last character is the stop string (a newline), and when every row seems stopped
  the batch halts. Every answer that this cuts is counted below as "FlashRAG's answer cut short" (ours
  starts with FlashRAG's, same passages, same prompt, in that round).
- Scorers: EM and Acc agree item by item. FlashRAG's F1 applies HotpotQA's yes / no / noanswer rule (0 when
  either side normalises to one of them and the two differ) to every dataset; ours applies each dataset's
  official rules, for synth (a FlashRAG-format set) SQuAD v1.1's, which has no such rule.
"""

SPEED = ["generator", "pipeline", "questions", "rag_lab q/s", "FlashRAG q/s", "speed-up", "rag_lab peak MB"]
SPEED += ["FlashRAG peak MB", "prefill s (rag_lab / FlashRAG)", "decode s (rag_lab / FlashRAG)"]
SPEED += ["prefill tokens per prompt token (rag_lab / FlashRAG)", "retrieve s (rag_lab / FlashRAG)"]
SPEED += ["load s (rag_lab / FlashRAG)"]


def page(rows: list[dict], elapsed: float) -> str:
    frame = pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    answers = ["generator", "pipeline", *(c for c in frame.columns if c not in SPEED)]
    lines = [
        "rag_lab vs FlashRAG 0.1.2 (`flashrag-dev` from PyPI, in `.venv-peers`), same machine, same run: "
        f"synth test questions, BM25 top {K}, greedy, {MAX_NEW_TOKENS} new tokens, stop at a newline, batch "
        f"{BATCH}, Iter-RetGen with {ITERATIONS} rounds. q/s counts answering (retrieval, prompts, "
        "generation), not loading or a first warm-up search; peak MB is each side's process; speed-up = "
        "FlashRAG's seconds / ours; prefill and decode: seconds in the model's forward passes that read "
        "prompts and that add a token per row; the rest of the time is prompts, tokenizing, bookkeeping; "
        "prefill tokens per prompt token: what each side's prefill reads, padding included, per real token.",
        "",
        frame[SPEED].round(2).to_markdown(index=False),
        "",
        frame[answers].to_markdown(index=False),
        "",
        f"Whole bench {elapsed / 60:.1f} min"
        + (f" ({len(REUSED)} results reused from an earlier run in --work)" if REUSED else "")
        + ". Reproduce: `make bench-peers` (or, with .venv-peers built, "
        "`python experiments/bench_vs_flashrag.py --generators tiny`).",
    ]
    lines += ["", NOTES.rstrip()]
    for r in rows:
        lines += ["", f"## Differing answers: {r['generator']}, {r['pipeline']} ({len(r['_examples'])})", ""]
        causes = pd.Series([ex["why"][0] for ex in r["_examples"]], dtype=object).value_counts()
        if len(causes):
            lines += [
                "By cause: " + ", ".join(f"{cause} {count}" for cause, count in causes.items()) + ".",
                "",
            ]
        apart = r["_scorers_apart"]
        counts = ", ".join(f"{m.upper() if m != 'acc' else 'Acc'} {len(v)}" for m, v in apart.items())
        lines += [
            f"Our scorer and FlashRAG's on the same {2 * r['questions']} predictions differ on: {counts}."
        ]
        for metric, items in apart.items():
            for pred, golds, mine, theirs in items[:1]:
                lines.append(f"- {metric}: {pred!r} for {golds}: ours {mine:.2f}, FlashRAG's {theirs:.2f}")
        lines.append("")
        for cause in causes.index:  # up to two examples of each cause
            for ex in [ex for ex in r["_examples"] if ex["why"][0] == cause][:2]:
                lines.append(f"- `{ex['id']}` ({cause}): rag_lab {ex['ours']!r}, FlashRAG {ex['flashrag']!r}")
                lines.append(f"  ({ex['why'][1]})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--generators", default="tiny,smollm2")
    parser.add_argument(
        "--questions", type=int, default=None, help="per generator (default: tiny 256, smollm2 64)"
    )
    parser.add_argument("--peer-python", default=str(ROOT / ".venv-peers" / "bin" / "python"))
    parser.add_argument("--work", default=str(ROOT / "outputs" / "bench_vs_flashrag"))
    args = parser.parse_args()
    if args.ours:
        spec, out = (Path(p) for p in args.ours)
        result = run_ours(json.loads(spec.read_text()))
        out.with_suffix(".part").write_text(json.dumps(result))
        out.with_suffix(".part").rename(out)  # whole or absent: a killed side leaves no result to reuse
        return
    if not os.access(args.peer_python, os.X_OK):
        sys.exit(f"--peer-python: {args.peer_python} is missing; `make bench-peers` builds FlashRAG's venv")
    start, rows = time.perf_counter(), []
    for generator in args.generators.split(","):
        if generator not in GENERATORS:
            sys.exit(f"--generators: unknown generator '{generator}' (use {', '.join(GENERATORS)})")
        work = Path(args.work) / generator
        work.mkdir(parents=True, exist_ok=True)
        rows += bench(generator, args.questions or QUESTIONS[generator], args.peer_python, work)
    publish(
        "bench_vs_flashrag",
        page(rows, time.perf_counter() - start),
        lm=f"by row: tiny = {shipped_lm()}; smollm2 = SmolLM2-135M-Instruct (generator=smollm2)",
    )


if __name__ == "__main__":
    main()
