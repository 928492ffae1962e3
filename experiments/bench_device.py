"""Where a model runs fastest: the tiny LM and SmolLM2, generating and training, on the CPU and on a GPU.

The rule it backs (``rag_lab.generators.hf.default_device``, ``device=auto``): a GPU when there is one,
except a model under 20M parameters, which stays on the CPU. Per model and device: 64 Stop-RAG follow-up
prompts of synth dev questions, greedy, 32 new tokens, batch 64 (the evaluation's shape); and for the tiny
LM two DAPO steps (4 questions x 8 rollouts, no cold start: the embedded default's step). On a machine
without a GPU it measures the CPU only.

    python experiments/bench_device.py            # writes experiments/results/bench_device.md
    python experiments/bench_device.py --quick    # the tiny LM only (no SmolLM2 conversion)
"""

import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
from benchlib import peak_rss_mb, publish, shipped_lm
from hydra.utils import instantiate

from rag_lab.core.config import build, compose
from rag_lab.env import Env
from rag_lab.env.protocols import State
from rag_lab.env.protocols.stoprag import StopRAGQuery
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator

N_PROMPTS, NEW_TOKENS, DAPO_STEPS = 64, 32, 2


def generation(generator: HFGenerator, prompts: list[str]) -> dict:
    generator.generate(prompts[:2], Sampling(max_new_tokens=2))  # warm-up: kernels, caches
    start = time.perf_counter()
    out = generator.generate(prompts, Sampling(max_new_tokens=NEW_TOKENS))
    seconds = time.perf_counter() - start
    return {"generate 64 (s)": seconds, "tokens/s": sum(len(c[0].token_ids) for c in out) / seconds}


def dapo_steps(cfg, data, generator: HFGenerator) -> float:
    """Seconds per DAPO step of the tiny LM on ``generator``'s device (the stage trains a copy there)."""
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), generator)
    with tempfile.TemporaryDirectory() as tmp:
        policy = build(cfg.policy, reward=build(cfg.reward), train_data=data)
        policy.cache_dir = tmp
        start = time.perf_counter()
        policy.fit(env, data.split("train"), [], Path(tmp) / "run")
        return (time.perf_counter() - start) / DAPO_STEPS


def main(quick: bool) -> None:
    cfg = compose(
        [
            "generator=tiny",
            "policy=dapo",
            "policy.cold_start=null",
            "policy.stages=[1]",
            f"policy.steps={DAPO_STEPS}",
            "policy.save_steps=1000",
        ]
    )
    data = instantiate(cfg.data)
    prompts = [StopRAGQuery().prompt(State(ex.question)) for ex in data.split("dev")[:N_PROMPTS]]
    chats = [StopRAGQuery().prompt(State(ex.question), chat=True) for ex in data.split("dev")[:N_PROMPTS]]
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    rows = []
    for device in devices:
        tiny = build(compose(["generator=tiny", f"generator.device={device}"]).generator, data=data)
        row = {
            "model": "tiny LM",
            "parameters": sum(p.numel() for p in tiny.model.parameters()),
            "device": device,
        }
        rows.append(row | generation(tiny, prompts) | {"DAPO step (s)": dapo_steps(cfg, data, tiny)})
        if not quick:
            smol = build(
                compose(
                    ["generator=smollm2", "generator.batch_size=64", f"generator.device={device}"]
                ).generator
            )
            size = sum(p.numel() for p in smol.model.parameters())
            rows.append(
                {"model": "SmolLM2-135M", "parameters": size, "device": device} | generation(smol, chats)
            )
    table = pd.DataFrame(rows).round(2).to_markdown(index=False)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    publish(
        "bench_device",
        f"GPU: {gpu}; torch {torch.__version__}, {torch.get_num_threads()} CPU threads. {N_PROMPTS} Stop-RAG "
        f"follow-up prompts, greedy, {NEW_TOKENS} new tokens, batch 64; DAPO: {DAPO_STEPS} steps of "
        f"{cfg.policy.questions_per_step} questions x {cfg.policy.group_size} rollouts (bf16 on the GPU)\n\n"
        f"{table}\n\npeak RSS {peak_rss_mb():.0f} MB",
        lm=f"{shipped_lm()} in the tiny LM rows; SmolLM2-135M-Instruct (generator=smollm2) in the others",
    )


if __name__ == "__main__":
    main("--quick" in sys.argv)
