"""What a new user types wrong, one row each: every entry point ends in one line naming the culprit.

Each row runs a command line in-process (``python -m rag_lab.<module> ARGS``, ``__main__`` and
all) and asserts its exit status, that no traceback is printed, that the output names the culprit
(file and line, config key, option), and that a run dir that already held a finished run is byte
for byte unchanged. A few rows are inputs that are handled rather than refused (skipped lines,
repeated ids): they exit 0 and report what they dropped.
"""

import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import TINY_DATA, cli

# Every `run` row composes on the tiny world (or its own data=) with an LM-free policy, plus its overrides.
BASE = [*TINY_DATA, "policy=top_title", "eval.limit=6"]


def base_for(args: list[str]) -> list[str]:
    return [a for a in BASE if a not in TINY_DATA] if any(a.startswith("data=") for a in args) else BASE


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---- files the rows write ------------------------------------------------------------------------
PASSAGES = [("p1", "Ada Lovelace", "Ada Lovelace was born in London."),
            ("p2", "London", "London is a city in England."),
            ("p3", "Paris", "Paris is a city in France.")]  # fmt: skip


def question(qid: str, **change) -> dict:
    steps = [{"question": "Where was Ada born?", "answer": "London"}]
    meta = {"type": "single", "hops": 1, "supporting_ids": ["p1"], "decomposition": steps}
    row = {
        "id": qid,
        "question": "Where was Ada Lovelace born?",
        "golden_answers": ["London"],
        "metadata": meta,
    }
    for key, value in change.items():
        if key.startswith("meta_"):
            row["metadata"][key[5:]] = value
        else:
            row[key] = value
    return row


def write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def flashrag(tmp: Path, test: list | None = None, corpus: list | None = None) -> None:
    """A FlashRAG-format dataset under tmp/data: three good questions per split unless replaced."""
    good = [question(f"q{i}") for i in range(3)]
    for split in ("train", "dev"):
        write_jsonl(tmp / "data" / f"{split}.jsonl", good)
    write_jsonl(tmp / "data" / "test.jsonl", good if test is None else test)
    rows = [{"id": i, "contents": f"{t}\n{x}"} for i, t, x in PASSAGES] if corpus is None else corpus
    write_jsonl(tmp / "data" / "corpus.jsonl", rows)


DATA = ["data=flashrag", "data.path={tmp}/data", "data.corpus_path={tmp}/data/corpus.jsonl"]


def predictions(tmp: Path, rows: list) -> None:
    write_jsonl(tmp / "preds.jsonl", rows)


def broken_yaml(tmp: Path) -> None:
    (tmp / "mine" / "policy").mkdir(parents=True)
    # line 3 is where the yaml parser notices the unclosed list
    (tmp / "mine" / "policy" / "mine.yaml").write_text(
        "_target_: rag_lab.policies.baselines.TopTitle\nk: [1,\n"
    )


def corrupt_records(tmp: Path) -> None:
    path = tmp / "run" / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + '{"id": "damaged\n' + "".join(lines[1:]))


def qwen_7b(tmp: Path) -> None:
    """Qwen2.5-7B's config.json (its architecture, 7.6B parameters) in tmp/qwen7b, no weights."""
    config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
              "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
              "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
              "hidden_act": "silu", "torch_dtype": "bfloat16"}  # fmt: skip
    (tmp / "qwen7b").mkdir()
    (tmp / "qwen7b" / "config.json").write_text(json.dumps(config))


def fake_sweep(tmp: Path) -> None:
    """A sweep of two jobs, the second killed before it wrote metrics.json."""
    for job, metrics in (("0", True), ("1", False)):
        d = tmp / "sweep" / job
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text(f"- policy={['direct', 'standard_rag'][int(job)]}\n")
        if metrics:
            summary = {"n": 1, "em": 1.0, "f1": 1.0, "acc": 1.0, "ci95": {}}
            (d / "metrics.json").write_text(json.dumps({"all": summary}))


def two_runs(tmp: Path) -> None:
    """Two finished runs over 4 questions, 2 of them of type x."""
    for name, em in (("A", [1, 1, 0, 1]), ("B", [0, 1, 0, 0])):
        d = tmp / "runs" / name
        d.mkdir(parents=True)
        records = [{"id": f"q{i}", "type": "xy"[i % 2], "em": float(v), "f1": float(v), "acc": float(v)}
                   for i, v in enumerate(em)]  # fmt: skip
        write_jsonl(d / "records.jsonl", records)
        summary = {"n": 4, "em": sum(em) / 4, "f1": sum(em) / 4, "acc": sum(em) / 4, "ci95": {}}
        (d / "metrics.json").write_text(json.dumps({"all": summary, "type=x": summary | {"n": 2}}))


def compare_sweep(tmp: Path, cut: str | None = None, killed: str | None = None) -> None:
    """A compare sweep under tmp/sweep: rows fixed_iter, dapo_start and dapo, 4 questions each; ``cut``:
    that row's records.jsonl cut mid-line after a finished run; ``killed``: that row without metrics.json."""
    for job, row in enumerate(("fixed_iter", "dapo_start", "dapo")):
        d = tmp / "sweep" / str(job)
        (d / ".hydra").mkdir(parents=True)
        (d / ".hydra" / "overrides.yaml").write_text(f"- experiment/compare_synth={row}\n- seed=0\n")
        records = [{"id": f"q{i}", "em": float(i % 2), "f1": 0.5, "acc": float(i % 2), "retrieval_count": 2}
                   for i in range(4)]  # fmt: skip
        write_jsonl(d / "records.jsonl", records)
        if row == cut:
            text = (d / "records.jsonl").read_text()
            (d / "records.jsonl").write_text(text[: len(text) // 2])
        if row != killed:
            (d / "metrics.json").write_text(json.dumps({"all": {"n": 4, "em": 0.5, "f1": 0.5, "acc": 0.5}}))


def claims_inputs(tmp: Path) -> None:
    """A README without a claims block, and claims specs: malformed, empty."""
    (tmp / "readme.md").write_text("# a page without a claims block\n")
    (tmp / "bad_spec.yaml").write_text("claims:\n  - paper: x\n    claim: [unclosed\n")
    (tmp / "empty_spec.yaml").write_text("")


def shipped_copy(tmp: Path, change: Callable[[Path], None]) -> None:
    """The shipped tiny LM copied to tmp/ckpt, then ``change``d."""
    from rag_lab.train.tiny.generator import SHIPPED

    shutil.copytree(SHIPPED, tmp / "ckpt")
    change(tmp / "ckpt")


def touch_weights(ckpt: Path) -> None:
    with open(ckpt / "model.safetensors", "ab") as f:
        f.write(b"\0")


def card_says_hidden_48(ckpt: Path) -> None:
    card = json.loads((ckpt / "recipe.json").read_text())
    card["recipe"]["hidden"] = 48
    (ckpt / "recipe.json").write_text(json.dumps(card))


def busy_port(tmp: Path) -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    busy_port.sock = sock  # kept open for the row; closed at exit
    (tmp / "port").write_text(str(sock.getsockname()[1]))


@dataclass
class Case:
    name: str
    module: str
    args: list[str]
    # the exit status, and a regex the output must match (the culprit it names)
    rc: int
    says: str
    setup: Callable[[Path], None] | None = None
    # run rows: "finished" = the dir holds a finished run (which must stay byte for byte unchanged),
    # "fresh" = an empty dir (the failure comes after the run dir is prepared)
    run_dir: str = "finished"
    extra: list[str] = field(default_factory=list)


# 0.1.0 selected an experiment with a + (+group=option), refused since in one line naming the form to write
PLUS = "+"

# fmt: off
CASES = [
    # ---- run: config keys, groups and values --------------------------------------------------
    Case("appended key typo", "run", ["+eval.limt=5"], 1, r"'eval\.limt'"),
    Case("appended top-level key", "run", ["+bogus_key=1"], 1, r"'bogus_key'"),
    Case("appended component key", "run", ["+data.foo=1"], 1, r"'data\.foo'"),
    Case("unknown key without +", "run", ["policy.kk=3"], 1, r"policy\.kk"),
    Case("batch size 0", "run", ["eval.batch_size=0"], 1, r"'eval\.batch_size' must be >= 1"),
    Case("limit -1", "run", ["eval.limit=-1"], 1, r"'eval\.limit' must be >= 1, got -1"),
    Case("limit 0", "run", ["eval.limit=0"], 1, r"'eval\.limit' must be >= 1, got 0"),
    Case("coverage 0", "run", ["corpus.coverage=0"], 1, r"'corpus\.coverage' must be in \(0, 1\], got 0"),
    Case("coverage above 1", "run", ["corpus.coverage=1.5"], 1, r"'corpus\.coverage' must be in \(0, 1\]"),
    Case("distractors negative", "run", ["corpus.distractors=-1"], 1, r"'corpus\.distractors' must be >= 0"),
    Case("limit not a number", "run", ["eval.limit=abc"], 1, r"eval\.limit.*'abc'"),
    Case("seed not a number", "run", ["seed=abc"], 1, r"seed.*'abc'"),
    Case("k = 0", "run", ["policy=standard_rag", "policy.k=0"], 1, r"'policy\.k' must be >= 1, got 0"),
    Case("k negative", "run", ["policy=retrieve_only", "policy.k=-3"], 1, r"'policy\.k' must be >= 1"),
    Case("iterations 0", "run", ["policy=iter_retgen", "policy.iterations=0"], 1, r"'policy\.iterations'"),
    Case("unknown group option", "run", ["policy=nope"], 1, r"policy/nope.*options: agent, .*stoprag"),
    # ---- run: settings that reach TRL or torch, checked when the config is (check_settings) --------
    Case("dapo clip range inverted", "run", ["policy=dapo", "policy.epsilon_high=0.1"], 1,
         r"'policy\.epsilon_high': the clip range needs 0 < epsilon \(0\.2\) <= epsilon_high \(0\.1\)"),
    Case("dapo group of one", "run", ["policy=dapo", "policy.group_size=1"], 1,
         r"'policy\.group_size' must be >= 2, got 1"),
    Case("dapo greedy training", "run", ["policy=dapo", "policy.train_temperature=0"], 1,
         r"'policy\.train_temperature' must be > 0, got 0"),
    Case("dapo weight of no reward", "run", ["policy=dapo", "+policy.weights={{serch: 0.5}}"], 1,
         r"'policy\.weights': 'serch' is no term of the reward group \(answer, search, format\)"),
    Case("dapo answer stage", "run", ["policy=dapo", "reward.answer.stage=3"], 1,
         r"'reward\.answer\.stage': 3"),
    Case("judge without a judge", "run", ["policy=dapo", "reward.answer.correct=judge"], 1,
         r"'reward\.answer\.judge': correct=judge needs a judge"),
    Case("apex plan RL without a plan", "run", ["policy=apex", "policy.plan=false"], 1,
         r"'policy\.plan_rl': plan RL trains the planner, but plan=false"),
    Case("apex planner group of one", "run", ["policy=apex", "policy.planner.group_size=1"], 1,
         r"'policy\.planner\.group_size'"),
    Case("planner loss unknown", "run", ["policy=apex", "policy.planner.loss_type=mean"], 1,
         r"policy\.planner\.loss_type"),
    Case("hf dtype", "run", ["generator=hf", "generator.dtype=fp8"], 1, r"'generator\.dtype': 'fp8'"),
    Case("smollm2 device", "run", ["generator=smollm2", "generator.device=gpu"], 1,
         r"'generator\.device': 'gpu'"),
    Case("dapo micro batch", "run", ["policy=dapo", "policy.micro_batch=5"], 1,
         r"'policy\.micro_batch': 5 does not divide each process's 32 episodes of a step"),
    Case("planner micro batch", "run", ["policy=apex", "policy.planner.micro_batch=5"], 1,
         r"'policy\.planner\.micro_batch': 5 does not divide each process's 32 plans of a step"),
    Case("cold start without steps", "run", ["policy=dapo", "policy.cold_start.epochs=0"], 1,
         r"'policy\.cold_start\.epochs': 0 with max_steps 0"),
    Case("malformed override", "run", ["eval.limit=["], 1, r"malformed override 'eval\.limit=\['"),
    Case("unknown flag", "run", ["--bogus"], 2, r"--bogus"),
    Case("unknown split", "run", ["eval.split=tset"], 1, r"no split 'tset' \(has: train, dev, test\)$"),
    Case("target not importable", "run", ["policy._target_=rag_lab.nope.Nope"], 1,
         r"policy.*_target_ 'rag_lab\.nope\.Nope' cannot be imported"),
    Case("unknown protocol", "run", ["policy=agent", "policy.protocol=nope", "generator=teacher"], 1,
         r"policy\.protocol: unknown protocol 'nope'", run_dir="fresh"),
    Case("unknown stop-word list", "run", ["retriever.stopwords=xx"], 1, r"retriever\.stopwords.*'xx'",
         run_dir="fresh"),
    Case("malformed yaml via --config-dir", "run", ["--config-dir", "{tmp}/mine", "policy=mine"], 1,
         r"mine/policy/mine\.yaml:3:1: malformed yaml", broken_yaml),
    Case("malformed yaml via searchpath", "run", ["hydra.searchpath=[file://{tmp}/mine]", "policy=mine"], 1,
         r"mine/policy/mine\.yaml:3:1: malformed yaml", broken_yaml),
    # ---- run: components that fail when built or used (the run dir is prepared by then) -----------
    Case("base_url not a URL", "run", ["policy=direct", "generator=openai", "generator.base_url=notaurl"],
         1, r"generator\.base_url: 'notaurl' is not an http", run_dir="fresh"),
    Case("hf model path missing", "run", ["policy=direct", "generator=hf", "generator.model=/no/such/model"],
         1, r"model directory /no/such/model not found", run_dir="fresh"),
    Case("hf folder without a model", "run", ["policy=direct", "generator=hf", "generator.model={tmp}"],
         1, r"holds no model: none of config\.json", run_dir="fresh"),
    Case("hf folder with a model but no tokenizer", "run", ["policy=direct", "generator=hf",
         "generator.model={tiny_lm}"], 1, r"generator\.model: \S*tiny-lm\S* holds no tokenizer",
         run_dir="fresh"),
    Case("tiny LM weights changed after shipping", "run", ["policy=direct", "generator=tiny",
         "generator.checkpoint={tmp}/ckpt"], 1, r"ckpt/model\.safetensors: sha256 \w+… is not the card's",
         lambda t: shipped_copy(t, touch_weights), run_dir="fresh"),
    Case("tiny LM card unlike its config", "run", ["policy=direct", "generator=tiny",
         "generator.checkpoint={tmp}/ckpt"], 1,
         r"ckpt/config\.json: hidden_size is 64, but the card \S+ says hidden 48",
         lambda t: shipped_copy(t, card_says_hidden_48), run_dir="fresh"),
    Case("tiny LM checkpoint unknown", "run", ["policy=direct", "generator=tiny",
         "generator.checkpoint=nope"], 1,
         r"generator\.checkpoint: \S+/checkpoints/nope holds no shipped checkpoint \(recipe\.json\)",
         run_dir="fresh"),
    Case("tiny LM on data it was not made for", "run", [*DATA, "policy=standard_rag", "generator=tiny"], 1,
         r"generator=tiny on data=flashrag: .*use generator=smollm2", lambda t: flashrag(t), run_dir="fresh"),
    Case("distractors without a world", "run", [*DATA, "corpus.distractors=2"], 1,
         r"corpus\.distractors: 2 needs data=synth .*data=flashrag has no world", lambda t: flashrag(t),
         run_dir="fresh"),
    Case("policy needs a generator", "run", ["policy=direct"], 1, r"generator: this policy needs a generator",
         run_dir="fresh"),
    Case("policy needs a retriever", "run", ["policy=retrieve_only", "~retriever"], 1,
         r"retriever: this policy searches", run_dir="fresh"),
    Case("stoprag target", "run", ["policy=stoprag", "policy.target=nope"], 1,
         r"'policy\.target': 'nope' is not one of qlambda, mc, q0, binary"),
    Case("stoprag lambda schedule", "run", ["policy=stoprag", "policy.lambda_schedule=nope"], 1,
         r"'policy\.lambda_schedule': 'nope' is not one of cosine, linear, constant"),
    # ---- run: the run dir ------------------------------------------------------------------------
    Case("resume with another config", "run", ["policy=retrieve_only"], 1,
         r"holds results of a different config \(changed: policy"),
    Case("records damaged mid-file", "run", [], 1, r"records\.jsonl:2: malformed record", corrupt_records),
    Case("output dir is a file", "run", ["hydra.run.dir={tmp}/afile"], 1, r"afile",
         lambda tmp: (tmp / "afile").write_text("x"), run_dir="none"),
    # ---- run: data files -------------------------------------------------------------------------
    Case("empty data file", "run", DATA, 1, r"data/test\.jsonl: no questions",
         lambda t: flashrag(t, test=[])),
    Case("duplicate question ids", "run", DATA, 1, r"test\.jsonl: 1 duplicate question id\(s\): q0",
         lambda t: flashrag(t, test=[question("q0"), question("q1"), question("q0")])),
    Case("empty question", "run", DATA, 1, r"test\.jsonl:2: field 'question' is empty",
         lambda t: flashrag(t, test=[question("q0"), question("q1", question="  ")])),
    Case("decomposition without question", "run", DATA, 1,
         r"test\.jsonl:1: metadata: missing field 'question'",
         lambda t: flashrag(t, test=[question("q0", meta_decomposition=[{"answer": "x"}])])),
    Case("lone surrogate in a question", "run", DATA, 1,
         r"test\.jsonl:2: field 'question' holds text that is not valid Unicode \('\\ud83d' at character 7\)",
         lambda t: flashrag(t, test=[question("q0"), question("q1", question="Who is \ud83d here?")])),
    Case("lone surrogate in a passage", "run", DATA, 1, r"corpus\.jsonl:3: field 'contents' holds text",
         lambda t: flashrag(t, corpus=[{"id": i, "contents": f"{a}\n{b}"} for i, a, b in PASSAGES[:2]]
                            + [{"id": "p3", "contents": "Paris\n\udc00 is a city."}]), run_dir="fresh"),
    Case("hops not a number", "run", DATA, 1, r"test\.jsonl:1: metadata: field 'hops'.*'four'",
         lambda t: flashrag(t, test=[question("q0", meta_hops="four")])),
    Case("malformed json line", "run", DATA, 1, r"test\.jsonl:2: malformed JSON",
         lambda t: flashrag(t, test=[question("q0"), '{"id": "q1",', question("q2")])),
    Case("answers not a list", "run", DATA, 1, r"test\.jsonl:1: field 'golden_answers' should be list",
         lambda t: flashrag(t, test=[question("q0", golden_answers="London")])),
    Case("missing id", "run", DATA, 1, r"test\.jsonl:1: missing field 'id'",
         lambda t: flashrag(t, test=[{k: v for k, v in question("q0").items() if k != "id"}])),
    Case("empty corpus", "run", DATA, 1, r"corpus\.jsonl: the corpus has no passages",
         lambda t: flashrag(t, corpus=[]), run_dir="fresh"),
    Case("corpus line without contents", "run", DATA, 1, r"corpus\.jsonl:2: missing field 'contents'",
         lambda t: flashrag(t, corpus=[{"id": "p1", "contents": "A\nB"}, {"id": "p2"}]),
         run_dir="fresh"),
    Case("oracle row without gold supports", "run", [*DATA, "policy=oracle_rag", "generator=teacher"], 1,
         r"policy=oracle_rag: data=flashrag \(\S*data, split test\) names no gold supporting passages",
         lambda t: flashrag(t, test=[question(f"q{i}", meta_supporting_ids=[]) for i in range(3)]),
         run_dir="fresh"),
    Case("dataset not downloaded", "run", ["data=flashrag", "data.path={tmp}/none"], 1,
         r"none/test\.jsonl.*make data-flashrag"),
    # ---- run: the newer methods, launchers and sweeps (the round of issue 49) ---------------------
    Case("evorag with dapo's reward", "run", ["policy=evorag", "reward=dapo"], 1,
         r"'policy\.reward': policy=evorag needs reward=evorag"),
    Case("evorag stages reversed", "run", ["policy=evorag", "policy.stages=[2,1]"], 1,
         r"'policy\.stages': \[2, 1\]: a subset of \[1, 2\] in order"),
    Case("evorag one action", "run", ["policy=evorag", "policy.actions=[search]"], 1,
         r"'policy\.actions': \['search'\]: two or more of"),
    Case("r3rag no temperature", "run", ["policy=r3rag", "policy.ppo.temperatures=[]"], 1,
         r"'policy\.ppo\.temperatures': \[\]: one temperature or more"),
    Case("launcher not installed", "run", ["policy=r3rag", "launch=cpu2", "launch.program=nolauncher"],
         1, r"'launch\.program': 'nolauncher' is not installed"),
    Case("launch config unread", "run", ["policy=r3rag", "launch=cpu2", "+launch.config.gpus=2"],
         1, r"'launch\.config': accelerate does not read it: .*unknown keys \(\['gpus'\]\)"),
    Case("launch on no processes", "run", ["policy=r3rag", "launch=cpu2", "launch.config.num_processes=0"],
         1, r"'launch\.config\.num_processes': 0: a whole number, 1 or more"),
    Case("more processes than the batch divides into", "run", ["policy=r3rag", "launch=cpu2",
         "launch.config.num_processes=3", "policy.ppo.batch_size=16"], 1,
         r"'launch\.config\.num_processes': 3 processes do not divide policy\.ppo\.batch_size=16"),
    Case("ZeRO-3 on a machine without GPUs", "run", ["policy=stoprag", "generator=teacher", "launch=zero3"],
         1, r"'launch\.config\.distributed_type': DEEPSPEED needs GPUs and this machine has none"),
    Case("a 7B model rolled out with transformers under FSDP", "run", ["policy=dapo", "generator=hf",
         "generator.model={tmp}/qwen7b", "launch=fsdp", "launch.config.num_processes=2"], 1,
         r"'launch\.hf_generate_max_params': generator=hf: \S*qwen7b has 7\.6B parameters, above "
         r"launch\.hf_generate_max_params=1,000,000,000; under FSDP its rollouts would generate through "
         r"FSDP's per-layer gathers, every rank in step: set generator=vllm", qwen_7b),
    Case("a 7B model rolled out with transformers under ZeRO-3", "run", ["policy=r3rag", "generator=hf",
         "generator.model={tmp}/qwen7b", "launch=zero3", "launch.config.num_processes=2"], 1,
         r"'launch\.hf_generate_max_params': generator=hf: \S*qwen7b has 7\.6B parameters, .*; under ZeRO-3 "
         r"its rollouts would generate through ZeRO-3's per-layer gathers", qwen_7b),
    # the same with the limit raised above it: the next check speaks (this machine's GPUs)
    Case("a 7B model under a raised limit", "run", ["policy=r3rag", "generator=hf",
         "generator.model={tmp}/qwen7b", "launch=zero3", "launch.hf_generate_max_params=8000000000",
         "launch.config.num_processes=2"], 1,
         r"'launch\.config\.distributed_type': DEEPSPEED needs GPUs", qwen_7b),
    Case("held-out every 0 steps", "run", ["policy=dapo", "policy.heldout.every=0"], 1,
         r"'policy\.heldout\.every' must be >= 1, got 0"),
    Case("cold start protocol unknown", "run", ["policy=dapo", "policy.cold_start.protocols=[nope]"], 1,
         r"'policy\.cold_start\.protocols': 'nope' names no protocol \(known: apex_exec"),
    Case("samples 0", "run", ["eval.samples=0"], 1, r"'eval\.samples' must be >= 1, got 0"),
    Case("tiny LM checkpoint a file", "run", ["policy=direct", "generator=tiny",
         "generator.checkpoint={tmp}/readme.md"], 1, r"readme\.md holds no shipped checkpoint", claims_inputs,
         run_dir="fresh"),
    Case("launcher unknown", "run", ["hydra.mode=MULTIRUN", "hydra/launcher=nope"], 1,
         r"Could not find 'hydra/launcher/nope' \(options: basic, joblib", run_dir="none"),
    Case("joblib with no jobs", "run", ["hydra.mode=MULTIRUN", "hydra/launcher=joblib", "seed=0,1",
         "hydra.launcher.n_jobs=0", "hydra.sweep.dir={tmp}/sw"], 1, r"hydra\.launcher: n_jobs == 0",
         run_dir="none"),
    Case("compare row unknown", "run", ["experiment=compare_synth", "experiment/compare_synth=nope",
         "hydra.sweep.dir={tmp}/sw"], 1, r"Could not find 'experiment/compare_synth/nope' \(options: apex",
         run_dir="none"),
    Case("experiment with a +", "run", [f"{PLUS}experiment=stoprag_synth"], 1,
         r"override '\+experiment=stoprag_synth': write experiment=stoprag_synth \(no '\+'", run_dir="none"),
    Case("row with a +", "run", ["experiment=compare_synth", f"{PLUS}experiment/compare_synth=dapo"],
         1, r"'\+experiment/compare_synth=dapo': write experiment/compare_synth=dapo", run_dir="none"),
    Case("plan experiment with a +", "plan", [f"{PLUS}experiment=dapo_2wiki"], 1,
         r"override '\+experiment=dapo_2wiki': write experiment=dapo_2wiki", run_dir="none"),
    # ---- compare ----------------------------------------------------------------------------------
    Case("compare missing dir", "reporting.compare", ["{tmp}/nope"], 1, r"nope does not exist"),
    Case("compare no runs", "reporting.compare", ["{tmp}"], 1, r"no run \(a directory with metrics\.json\)"),
    Case("compare start malformed", "reporting.compare", ["{tmp}/sweep", "--start", "dapo"], 1,
         r"--start dapo: expected ROW=START", compare_sweep),
    Case("compare start unknown", "reporting.compare", ["{tmp}/sweep", "--start", "dapo=dapo_strat"], 1,
         r"--start dapo_strat: no such row \(the rows by experiment/compare_synth: fixed_iter, dapo_start",
         compare_sweep),
    Case("compare reference unknown", "reporting.compare", ["{tmp}/sweep", "--reference", "fixed"], 1,
         r"--reference fixed: no such row", compare_sweep),
    Case("compare ceiling unknown", "reporting.compare", ["{tmp}/sweep", "--ceiling", "oracle"], 1,
         r"--ceiling oracle: no such row", compare_sweep),
    Case("compare by an override no run has", "reporting.compare", ["{tmp}/sweep", "--by", "policy"], 1,
         r"--by policy: no run has that override", compare_sweep),
    Case("compare records cut short", "reporting.compare", ["{tmp}/sweep"], 1,
         r"sweep/2/records\.jsonl: cut short \(\d questions, metrics\.json counts 4\)",
         lambda t: compare_sweep(t, cut="dapo")),
    Case("compare over a killed row", "reporting.compare", ["{tmp}/sweep"], 0,
         r"notice: \S*sweep/2 has no metrics\.json", lambda t: compare_sweep(t, killed="dapo")),
    # ---- claims -----------------------------------------------------------------------------------
    Case("claims missing dir", "claims", ["{tmp}/nope", "--out", "{tmp}/c.md"], 1, r"nope does not exist"),
    Case("claims no runs", "claims", ["{tmp}", "--out", "{tmp}/c.md"], 1, r"no run \(a directory"),
    Case("claims readme without its block", "claims", ["{tmp}/sweep", "--out", "{tmp}/c.md", "--readme",
         "{tmp}/readme.md"], 1, r"readme\.md: no claims block",
         lambda t: (compare_sweep(t), claims_inputs(t))),
    Case("claims spec malformed", "claims", ["{tmp}/sweep", "--spec", "{tmp}/bad_spec.yaml", "--out",
         "{tmp}/c.md"], 1, r"bad_spec\.yaml:4: malformed yaml",
         lambda t: (compare_sweep(t), claims_inputs(t))),
    Case("claims spec empty", "claims", ["{tmp}/sweep", "--spec", "{tmp}/empty_spec.yaml", "--out",
         "{tmp}/c.md"], 1, r"empty_spec\.yaml: not a claims spec",
         lambda t: (compare_sweep(t), claims_inputs(t))),
    Case("claims spec missing", "claims", ["{tmp}/sweep", "--spec", "{tmp}/none.yaml", "--out", "{tmp}/c.md"],
         1, r"none\.yaml: No such file", compare_sweep),
    # ---- score ----------------------------------------------------------------------------------
    Case("score --help", "score", ["--help"], 0, r"Score predictions(.|\n)*python -m rag_lab\.score data="),
    Case("score without arguments", "score", [], 1, r"'predictions' is required"),
    Case("score unknown flag", "score", ["-x"], 1, r"unknown option '-x'"),
    Case("score file missing", "score", [*DATA, "predictions={tmp}/nope.jsonl"], 1,
         r"predictions file not found: .*nope\.jsonl", flashrag),
    Case("score no id matches", "score", [*DATA, "predictions={tmp}/preds.jsonl"], 1,
         r"preds\.jsonl: no prediction id matches a question of flashrag/test",
         lambda t: (flashrag(t), predictions(t, [{"id": "x1", "prediction": "London"}]))),
    Case("score duplicate ids", "score", [*DATA, "predictions={tmp}/preds.jsonl"], 1,
         r"preds\.jsonl: id 'q0' appears twice",
         lambda t: (flashrag(t), predictions(t, [{"id": "q0", "prediction": "a"}] * 2))),
    Case("score malformed line", "score", [*DATA, "predictions={tmp}/preds.jsonl"], 1,
         r"preds\.jsonl:2: missing field 'prediction'",
         lambda t: (flashrag(t), predictions(t, [{"id": "q0", "prediction": "a"}, {"id": "q"}]))),
    Case("score empty predictions", "score", [*DATA, "predictions={tmp}/preds.jsonl"], 1,
         r"preds\.jsonl: no predictions \(an empty file\)", lambda t: (flashrag(t), predictions(t, []))),
    Case("score prediction a number", "score", [*DATA, "predictions={tmp}/preds.jsonl"], 1,
         r"preds\.jsonl:1: field 'prediction' should be str, got int",
         lambda t: (flashrag(t), predictions(t, [{"id": "q0", "prediction": 42}]))),
    Case("score predictions a folder", "score", [*DATA, "predictions={tmp}"], 1, r"Is a directory", flashrag),
    # ---- serve, index ---------------------------------------------------------------------------
    Case("serve --help", "serve", ["--help"], 0,
         r"OpenAI-compatible HTTP server(.|\n)*python -m rag_lab\.serve generator="),
    Case("serve nothing to serve", "serve", [], 1, r"generator / retriever: nothing to serve"),
    Case("serve model path missing", "serve", ["generator=hf", "generator.model=/no/such/model"], 1,
         r"/no/such/model not found"),
    Case("serve port taken", "serve", ["generator=hf", "generator.model={tiny_lm}",
                                       "generator.tokenizer={tiny_lm}/tokenizer", "serve.port={port}"], 1,
         r"serve\.host / serve\.port: cannot listen on 127\.0\.0\.1:\d+", busy_port),
    Case("index --help", "index", ["--help"], 0,
         r"Build a retriever's index(.|\n)*python -m rag_lab\.index retriever="),
    Case("index unknown retriever", "index", ["retriever=nope"], 1, r"retriever/nope.*options: bge, bm25"),
    Case("index dataset missing", "index", ["data=flashrag", "data.path={tmp}/none",
         "data.corpus_path={tmp}/none/c.jsonl"], 1, r"none/c\.jsonl.*make data-flashrag"),
    Case("serve port negative", "serve", ["generator=hf", "generator.model={tiny_lm}", "serve.port=-1"], 1,
         r"'serve\.port' must be >= 0, got -1"),
    # ---- report ---------------------------------------------------------------------------------
    Case("report --help", "report", ["--help"], 0, r"usage: python -m rag_lab\.report(.|\n)*example"),
    Case("report missing dir", "report", ["{tmp}/nope"], 1, r"nope does not exist"),
    Case("report no runs", "report", ["{tmp}"], 1, r"no run \(a directory with metrics\.json\)"),
    Case("report over a sweep with a killed job", "report", ["{tmp}/sweep"], 0,
         r"(?s)(?=.*notice: \S*sweep/1 has no metrics\.json)(?=.*1 without metrics\.json left out)",
         fake_sweep),
    Case("report --compare --subset", "report", ["{tmp}/runs", "--compare", "--subset", "type=x"], 0,
         r"over the 2 question ids of subset type=x", two_runs),
    Case("report --compare with one run", "report", ["{tmp}/runs/A", "--compare"], 1,
         r"--compare needs two runs", two_runs),
    Case("report --by-type unknown column", "report", ["{tmp}/runs", "--by-type", "Nope"], 1,
         r"no column Nope \(have: ", two_runs),
    Case("report --compare records cut short", "report", ["{tmp}/sweep", "--by", "experiment/compare_synth",
         "--compare", "dapo", "fixed_iter"], 1,
         r"records\.jsonl: cut short", lambda t: compare_sweep(t, cut="dapo")),
    Case("report unknown subset", "report", ["{tmp}/runs", "--subset", "type=z"], 1, r"type=z", two_runs),
]
# fmt: on


def expand(args: list[str], tmp: Path, extra: dict[str, str]) -> list[str]:
    return [a.format(tmp=tmp, **extra) for a in args]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished run of BASE, copied into each row's run dir."""
    path = tmp_path_factory.mktemp("finished") / "run"
    from rag_lab.core.config import compose
    from rag_lab.run import run

    cfg = compose(BASE)
    run(cfg, path, {"config": cfg, "overrides": [*BASE]})
    assert (path / "metrics.json").exists()
    return path


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_ends_in_one_line(case: Case, tmp_path, finished_run, tiny_lm, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Hydra's default outputs/ and report.csv land here
    run_dir = tmp_path / "run"
    if case.module == "run" and case.run_dir == "finished":
        shutil.copytree(finished_run, run_dir)
    if case.setup:
        case.setup(tmp_path)
    port = (tmp_path / "port").read_text() if (tmp_path / "port").exists() else "0"
    args = expand(case.args, tmp_path, {"tiny_lm": tiny_lm, "port": port})
    if case.module == "run":
        args = [*base_for(args), *args] + ([] if case.run_dir == "none" else [f"hydra.run.dir={run_dir}"])
    before = snapshot(run_dir) if run_dir.exists() else {}

    rc, output = cli(case.module, args, capfd, monkeypatch)
    if getattr(busy_port, "sock", None):
        busy_port.sock.close()
        busy_port.sock = None

    assert rc == case.rc, output
    assert "Traceback" not in output, output
    assert re.search(case.says, output), output
    if rc != 0:
        errors = [line for line in output.splitlines() if line.startswith("error:")]
        assert case.rc == 2 or len(errors) == 1, output  # argparse's usage + one error line
        after = snapshot(run_dir) if run_dir.exists() else {}
        assert {k: v for k, v in after.items() if k in before} == before, "a failed run changed the run dir"
        assert not (set(after) - set(before)) & {"records.jsonl", "metrics.json"}


def test_a_sweeps_override_below_an_interpolated_node_is_refused(repo_root, tmp_path, capfd, monkeypatch):
    """r3rag_ablation sets ``policy.cold_start: ${experiment.cold_start}``; in its sweep ``policy.cold_start.
    max_steps=3`` becomes ``++`` (soft) and would replace the interpolation with ``{max_steps: 3}``: the run
    died later with a traceback (``Missing key split``). It is refused at once, naming the key to set."""
    from rag_lab.core.cli import check_below_interpolations
    from rag_lab.core.config import compose

    args = ["experiment=r3rag_ablation", "policy.cold_start.max_steps=3", f"hydra.sweep.dir={tmp_path}"]
    rc, out = cli("run", args, capfd, monkeypatch, cwd=repo_root)
    assert rc == 1
    assert out.splitlines()[-1] == (
        "error: override '++policy.cold_start.max_steps=3': policy.cold_start is ${experiment.cold_start} in "
        "this config, and the override would replace it with a node holding only max_steps; set "
        "experiment.cold_start.max_steps=3 instead"
    )
    assert not list(tmp_path.rglob("records.jsonl"))
    # what the error says to set, soft overrides beside it and a group placed with a package pass
    check_below_interpolations(
        ["experiment=r3rag_ablation", "++policy.lr=3e-4", "experiment.cold_start.max_steps=3"], compose
    )
    check_below_interpolations(
        [
            "experiment=stoprag_synth",
            "+cold_start@experiment.cold_start=r3rag_cs",
            "experiment.cold_start.limit=4",
        ],
        compose,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /sys, read-only even for root")
def test_read_only_output_dir_is_one_line(tmp_path, capfd, monkeypatch):
    if os.geteuid() == 0:
        target = "/sys"  # an existing dir root cannot write into (chmod does not stop root)
    else:
        target = str(tmp_path / "ro")
        os.mkdir(target, 0o555)
    rc, output = cli("run", [*BASE, f"hydra.run.dir={target}"], capfd, monkeypatch)
    assert rc == 1 and "Traceback" not in output, output
    assert re.search(rf"error: {re.escape(target)}/run\.log: Permission denied", output), output


def test_skipped_lines_and_duplicates_are_counted(tmp_path, capfd, monkeypatch):
    """data.skip_malformed=true: the run goes on, and says what it dropped (log and metrics.json)."""
    flashrag(tmp_path, test=[question("q0"), '{"id": ', question("q1"), question("q0")])
    data = [*expand(DATA, tmp_path, {}), "data.skip_malformed=true"]
    args = [*base_for(data), *data, f"hydra.run.dir={tmp_path / 'run'}"]
    rc, output = cli("run", args, capfd, monkeypatch)
    assert rc == 0, output
    assert re.search(r"data\.skip_malformed dropped 1 skipped_lines, 1 duplicate_ids", output), output
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["all"]["n"] == 2
    assert (metrics["all"]["skipped_lines"], metrics["all"]["duplicate_ids"]) == (1, 1)


def test_resume_false_sets_the_old_run_aside(finished_run, tmp_path, capfd, monkeypatch):
    """eval.resume=false, then a failure: the old run's files are all kept, together, under replaced/,
    so no report shows the old numbers under the new config."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    before = snapshot(run_dir)
    args = [*BASE, "policy=direct", "eval.resume=false", f"hydra.run.dir={run_dir}"]
    rc, output = cli("run", args, capfd, monkeypatch)
    assert rc == 1 and "generator: this policy needs a generator" in output, output
    (aside,) = (run_dir / "replaced").iterdir()
    # all but Hydra's log and the directory's lock (neither is the run's result)
    assert snapshot(aside) == {k: v for k, v in before.items() if k not in ("run.log", ".lock")}
    assert not (run_dir / "metrics.json").exists() and not (run_dir / "records.jsonl").exists()


def test_refused_resume_keeps_the_old_labels(finished_run, tmp_path, capfd, monkeypatch):
    """A refused run leaves .hydra/overrides.yaml as it was, so report still labels the old run right."""
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    labels = (run_dir / ".hydra" / "overrides.yaml").read_text()
    rc, output = cli("run", [*BASE, "policy=retrieve_only", f"hydra.run.dir={run_dir}"], capfd, monkeypatch)
    assert rc == 1 and "different config" in output
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == labels


def test_a_10000_word_question_is_a_scored_failure_and_long_passages_are_cut(
    tmp_path, tiny_lm, capfd, monkeypatch
):
    """Against a 1,024-position model: the question that cannot fit is refused (a scored failure, not
    transformers' silent truncation), the long passage is cut to fit; both are counted in the records."""
    long_text = " ".join(["London"] * 10_000)
    corpus = [{"id": i, "contents": f"{t}\n{x}"} for i, t, x in PASSAGES] + [
        {"id": "p4", "contents": f"Long\n{long_text}"}
    ]
    test = [question("q0", question=long_text), question("q1", question="Long London London")]
    flashrag(tmp_path, test=test, corpus=corpus)
    data = expand(DATA, tmp_path, {})
    args = [*data, "policy=standard_rag", "policy.k=2", "policy.max_new_tokens=4", "eval.limit=2",
            "generator=hf", f"generator.model={tiny_lm}", f"generator.tokenizer={tiny_lm}/tokenizer",
            f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    rc, output = cli("run", args, capfd, monkeypatch)
    assert rc == 0 and "Traceback" not in output, output
    assert re.search(
        r"100\.0% of the questions had a prompt longer (.|\n)*nothing was generated \(a scored failure\)",
        output,
    ), output
    records = {
        r["id"]: r for r in map(json.loads, (tmp_path / "run" / "records.jsonl").read_text().splitlines())
    }
    assert records["q0"]["prompt_cuts"] == 1 and records["q0"]["prediction"] == ""
    assert records["q1"]["prompt_cuts"] == 1 and records["q1"]["em"] in (0.0, 1.0)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["all"]["prompt_cut_rate"] == 1.0
