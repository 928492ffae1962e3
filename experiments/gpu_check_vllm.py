"""make gpu-check's vLLM step (issue 72): one rollout on TRL's colocated vLLM engine, one update, TRL's
weight sync, and a check that the engine then holds the trained weights, on one GPU.

SmolLM2-135M-Instruct (the package's checkpoint, converted once by ``rag_lab.generators.smollm2.convert``,
written here again as a bf16 safetensors folder, the dtype a training run holds) is loaded twice, as a
training run does with ``generator=vllm``: as the trained model (transformers, on the GPU) and in TRL's
colocated engine (``rag_lab.train.vllm_engine.RolloutEngine`` from ``generator=vllm``'s settings, asleep
between phases: ``generator.sleep``). Then:

1. a rollout phase on the engine: it wakes (the weights pushed again: TRL's sync), generates greedily, sleeps;
2. one update of the trained model (an AdamW step on that completion): its weights move;
3. TRL's sync, one tensor at a time, after which every weight of the engine equals the trained model's
   (vLLM's fused ``qkv_proj`` / ``gate_up_proj`` against transformers' q, k, v and gate, up concatenated),
   and a second phase in which the engine generates again, then sleeps.

The result is ``$OUT/vllm_check.json`` (the checks, the timings, the tokens both generated); the exit status
is 1 where a check failed. It needs vLLM and a CUDA GPU (``make install-gpu``):

    OUT=/tmp/gpu python experiments/gpu_check_vllm.py          # about 2 minutes on one H100, most of it
                                                             # vLLM's start-up (compile, CUDA graphs)
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
PROMPT = [{"role": "user", "content": "Where was Ada Lovelace born? Answer in one sentence."}]


def bf16_folder(out: Path) -> Path:
    """SmolLM2's converted folder (fp32) written again in bf16, with its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rag_lab.generators.smollm2 import convert

    source, target = convert(os.environ.get("RAG_LAB_CACHE", out / "cache")), out / "smollm2-bf16"
    if not (target / "config.json").exists():
        AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16).save_pretrained(target)
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def engine_model(engine) -> torch.nn.Module:
    """The model inside TRL's colocated engine (the one its sync loads weights into)."""
    return engine.backend.llm.llm_engine.model_executor.driver_worker.model_runner.model


def mismatches(engine, model: torch.nn.Module) -> dict[str, str]:
    """Each engine weight that differs from the trained model's (vLLM's name: why); {} when all equal."""
    mine = {n: p.detach() for n, p in model.named_parameters()}
    if "lm_head.weight" not in mine:  # tied to the embeddings
        mine["lm_head.weight"] = mine["model.embed_tokens.weight"]
    wrong = {}
    for name, param in engine_model(engine).named_parameters():
        fused = next((f for f in FUSED if f in name), None)
        parts = [name.replace(fused, p) for p in FUSED[fused]] if fused else [name]
        if any(p not in mine for p in parts):
            wrong[name] = "no such weight in the trained model"
            continue
        want = torch.cat([mine[p] for p in parts]) if fused else mine[name]
        got = param.detach()[: want.shape[0]]  # vLLM may pad the vocabulary's rows
        if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
            wrong[name] = f"max |diff| {float((got.float() - want.float()).abs().max()):.3g}"
    return wrong


def rollout(engine, sampling) -> list[int]:
    """One phase on the engine (awake for it, asleep after): a greedy completion of the prompt."""
    with engine.acting() as generator:
        [[completion]] = generator.generate([PROMPT], sampling)
    return list(completion.token_ids)


def update(model, tokenizer, completion: list[int]) -> float:
    """One AdamW step on the prompt and ``completion``: how far the weights moved (their largest change)."""
    from rag_lab.generators.base import render

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    prompt = tokenizer(render(tokenizer, PROMPT), add_special_tokens=False).input_ids
    ids = torch.tensor([prompt + completion], device=model.device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    model.eval()
    return max(float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters())


def main(out: Path) -> int:
    from rag_lab.generators.base import Sampling
    from rag_lab.generators.vllm import VLLMGenerator
    from rag_lab.train.vllm_engine import RolloutEngine

    out.mkdir(parents=True, exist_ok=True)
    folder, clock, report = bf16_folder(out), time.perf_counter(), {}
    run = VLLMGenerator(str(folder), train_memory=0.3, sleep=True, max_model_len=2048, chat=True)
    trained = run.trainable()  # transformers on the GPU, bf16: what a method trains
    engine = RolloutEngine(run.backend_settings(), trained.model, trained.tokenizer, chat=True)
    report["engine_start_s"] = time.perf_counter() - clock
    sampling = Sampling(max_new_tokens=32)
    first = rollout(engine, sampling)
    report["moved"] = update(trained.model, trained.tokenizer, first)
    clock = time.perf_counter()
    engine.sync()  # TRL's sync_weights, one tensor at a time (it wakes the weights first)
    report["sync_s"] = time.perf_counter() - clock
    report["mismatches"] = mismatches(engine, trained.model)
    with engine.acting() as generator:  # the KV cache woken for the phase, asleep after
        [[second]] = generator.generate([PROMPT], sampling)
    [[hf]] = trained.generate([PROMPT], sampling)
    report |= {"first": first, "second": list(second.token_ids), "transformers": hf.token_ids}
    report["agreeing_tokens"] = next(
        (i for i, (a, b) in enumerate(zip(second.token_ids, hf.token_ids, strict=False)) if a != b),
        min(len(second.token_ids), len(hf.token_ids)),
    )
    report["checks"] = {
        "the update moved the weights": report["moved"] > 0,
        "every engine weight equals the trained model's after the sync": not report["mismatches"],
        "the engine generated in both phases": bool(first) and bool(second.token_ids),
        "the engine sleeps after the phase": engine.backend._llm_weights_sleeping,
    }
    (out / "vllm_check.json").write_text(json.dumps(report, indent=1) + "\n")
    for check, ok in report["checks"].items():
        print(f"{'ok ' if ok else 'FAILED'} {check}")
    return 0 if all(report["checks"].values()) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "outputs/gpu_check"))
    sys.exit(main(Path(parser.parse_args().out)))
