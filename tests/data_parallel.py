"""A few updates of each trainer on a fixed global batch, in however many processes launched it; rank 0 saves
the weights. Run by tests/test_data_parallel.py, which compares 1 process with 2.

    python tests/data_parallel.py TRAINERS MODEL_DIR WORK OUT
    python tests/data_parallel.py TRAINERS MODEL_DIR WORK OUT --fork 2   # 1 process, then 2 forked from it

TRAINERS, comma-separated, each saved to ``OUT/<trainer>.pt``: ``sft`` (rag_lab.train.sft: the cold
start's, APEX's executor's and the tiny LM's SFT), ``dpo`` (EVO-RAG's DPO epoch), ``grpo`` (DAPO's and
APEX's planner's GRPO, rollouts fixed), ``qnet`` (Stop-RAG's Q-network), ``preference``
(EVO-RAG's preference model), ``ppo`` (R3-RAG's PPO update), ``tiny`` (the tiny LM's own loop).
``--fork N``: the one-process runs, then the same on N processes forked from this one by accelerate's
``debug_launcher`` (gloo over a file store; the imports are not paid again) into ``OUT-N/``, each with its
own work dir. One thread each: a child forked from a process whose OpenMP pool ran can hang.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its sibling r3rag_data_parallel.py

import torch

# Prompts and completions in the conftest tiny LM's words; lengths vary, so length grouping matters.
WORDS = "Q : A S D where was ada born paris london city".split()


def pairs(n: int = 600) -> list[tuple[str, str]]:
    """``n`` pairs: 600 makes transformers' length-grouped megabatches (min(n / 4b, 50) batches of b)
    differ between a batch of 4 and one of 2, so a per-process grouping would train on other rows."""
    draw = torch.Generator().manual_seed(0)

    def text(lo: int, hi: int) -> str:
        length = int(torch.randint(lo, hi, (1,), generator=draw))
        return " ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (length,), generator=draw))

    return [(text(3, 12), text(1, 5)) for _ in range(n)]


def sft(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    from rag_lab.train.sft import SFTSettings
    from rag_lab.train.sft import sft as run

    settings = SFTSettings(max_steps=3, batch_size=4, lr=1e-2, warmup_steps=0, max_length=64, save_steps=100)
    trainer, stats = run(model_dir, f"{model_dir}/tokenizer", pairs(), settings, work)
    return trainer.model, {"loss": stats["mean_loss"]}


def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(f"{model_dir}/tokenizer")


def model_of(model_dir: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def dpo(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    """EVO-RAG's DPO epoch (rag_lab.policies.evorag.dpo.dpo_epoch) on 16 fixed pairs, a global batch of 4."""
    from types import SimpleNamespace

    from rag_lab.policies.evorag.dpo import dpo_epoch

    rows = [{"prompt": p, "chosen": c, "rejected": p.split()[0]} for p, c in pairs(16)]
    settings = SimpleNamespace(lora=None, beta=0.1, lr=1e-2, batch_size=4, grad_accum=1, dpo_epochs=1,
                               save_steps=100, bf16=False)  # fmt: skip
    generator = SimpleNamespace(device="cpu", tokenizer=tokenizer(model_dir), context_length=64, chat=False)
    model, stats = dpo_epoch(model_of(model_dir), generator, rows, settings, work, 0, "test DPO")
    return model, {"steps": stats["steps"]}


def grpo(model_dir: str, work: Path, micro_batch: int | None = None) -> tuple[torch.nn.Module, dict]:
    """TRL's GRPOTrainer in DAPO's setting (rag_lab.policies.dapo.trainer.dapo_config): 2 steps of 4 questions
    x 2 samples, rollouts fixed (a function of the prompt and the sample's place in its group, so one process
    and two play the same) with one token per completion masked out as retrieved, a reward that differs
    within each group; each step's forward and backward in passes of ``micro_batch`` sequences (null: one)."""
    from types import SimpleNamespace

    from datasets import Dataset
    from trl import GRPOTrainer

    from rag_lab.generators.base import Sampling
    from rag_lab.policies.dapo.trainer import dapo_config

    tok = tokenizer(model_dir)
    vocab, group = len(tok), 2

    def rollouts(prompts: list, trainer) -> dict:
        out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
        for i, prompt in enumerate(prompts):
            ids = tok(prompt, add_special_tokens=False).input_ids
            j = i % group
            completion = [(sum(ids) * 31 + j * 7 + t) % (vocab - 3) + 3 for t in range(2 + j + len(ids) % 3)]
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(completion)
            out["logprobs"].append([0.0] * len(completion))
            out["env_mask"].append([1] + [0] + [1] * (len(completion) - 2))
        return out

    def reward(completions, completion_ids, **_) -> list[float]:
        return [float(len(ids) % 3) + 0.1 * ids[0] / vocab for ids in completion_ids]

    sizes = dict(seed=0, save_steps=100, bf16=False, steps=2, questions_per_step=4, group_size=group, lr=1e-2)
    sampling = dict(
        train_sampling=Sampling(temperature=1.0), sampling=Sampling(max_new_tokens=8), max_turns=2
    )
    policy = SimpleNamespace(
        **sizes, **sampling, micro_batch=micro_batch, epsilon=0.2, epsilon_high=0.28, kl_coef=0.0
    )
    trainer = GRPOTrainer(
        model=model_of(model_dir),
        reward_funcs=[reward],
        args=dapo_config(policy, work, [1.0], "cpu"),
        train_dataset=Dataset.from_list([{"prompt": p} for p, _ in pairs(8)]),
        processing_class=tok,
        rollout_func=rollouts,
    )
    trainer.train()
    return trainer.model, {"steps": trainer.state.global_step}


def qnet(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    """Stop-RAG's Q(λ) training (rag_lab.policies.stoprag.trainer) with a tiny BERT encoder that trains too,
    on 12 toy trajectories, batches of 8 states; dropout 0, the heads' and the encoder's (its draws differ
    between 1 and 2 processes)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from rag_lab.policies.stoprag.offline import Trajectory
    from rag_lab.policies.stoprag.policy import StopRAG
    from rag_lab.policies.stoprag.qnet import QNetwork
    from rag_lab.retrievers.dense import resolve_model
    from rag_lab.train.parallel import main_first
    from rag_lab.train.sharded import fsdp_modules

    encoder = work / "encoder"
    with main_first():  # the processes share the work dir: the main one writes the encoder
        if not (encoder / "config.json").exists():
            tok = AutoTokenizer.from_pretrained(resolve_model("sentence-transformers/all-MiniLM-L6-v2"))
            tok.save_pretrained(encoder)
            torch.manual_seed(0)
            sizes = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
            config = BertConfig(vocab_size=tok.vocab_size, **sizes, max_position_embeddings=128,
                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
            BertModel(config).save_pretrained(encoder)
    trajs = []
    for i in range(12):
        rewards = [0.0] + [0.9 if t >= 1 + i % 3 else 0.1 for t in range(1, 5)]
        passages = [[f"Page {i}-{t}: fact number {t} about thing {i}."] for t in range(1, 5)]
        trajs.append(Trajectory(f"q{i}", f"Question {i} asks about thing {i}?", passages, rewards))
    policy = StopRAG(iterations=4, encoder=str(encoder), max_length=64, freeze_encoder=False, dropout=0.0,
                     batch_size=8, epochs=2, lr=1e-2, checkpoint_every=100, val_fraction=0.0)  # fmt: skip
    torch.manual_seed(1)  # the heads' initialisation, alike in every process
    policy.qnet = net = QNetwork(**policy.qnet_args)
    before = {k: v.clone() for k, v in policy.qnet.state_dict().items()}
    policy.train(trajs, work)
    moved = sorted(k for k, v in policy.qnet.state_dict().items() if not torch.equal(v, before[k]))
    # the main process logs the loss; under FSDP the network trained sharded (in place), then unsharded
    stats = {"loss": policy.stats.get("train", {}).get("loss"), "moved": len(moved)}
    return policy.qnet, stats | {"sharded": fsdp_modules(net)}


class ToyEncoder:
    """A fixed text encoder: 8 numbers drawn from a generator seeded by the text's words."""

    dim = 8

    def encode(self, texts: list[str]) -> torch.Tensor:
        seeds = [sum(ord(c) * (i + 1) for i, c in enumerate(t)) for t in texts]
        return torch.stack([torch.randn(8, generator=torch.Generator().manual_seed(s)) for s in seeds])


def preference(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    """EVO-RAG's preference model (rag_lab.policies.evorag.preference): 2 epochs over 20 pairs in batches
    of 8 (the last of 4)."""
    from rag_lab.policies.evorag.preference import Branch, PreferenceModel

    pm = PreferenceModel(ToyEncoder(), seed=0)
    before = pm.heads.weight.detach().clone()
    chosen = [Branch(p, "search", 1.0) for p, _ in pairs(20)]
    rejected = [Branch(c, "answer", 0.0) for _, c in pairs(20)]
    losses = pm.fit(list(zip(chosen, rejected, strict=True)), epochs=2, lr=1e-2, batch_size=8, seed=0)
    moved = int(not torch.equal(before, pm.heads.weight))
    return pm.heads, {"loss_first": losses[0], "loss_last": losses[1], "moved": moved}


def ppo(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    """R3-RAG's PPO update (tests/r3rag_data_parallel.py: six episodes, each process every N-th)."""
    from r3rag_data_parallel import update
    from transformers import AutoModelForCausalLM

    from rag_lab.train.sharded import full_state_dict

    model, stats, _ = update(model_dir)
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    weights = full_state_dict(model, everywhere=True)  # every process (a collective when sharded)
    moved = sum(not torch.equal(weights[f"lm.{k}"], v) for k, v in initial.items())
    keys = ("loss/policy", "loss/value", "kl", "clip_fraction", "ratio")
    return model, {k: stats[k] for k in keys} | {"moved": moved}


def tiny(model_dir: str, work: Path) -> tuple[torch.nn.Module, dict]:
    """The tiny LM's hand-written loop (rag_lab.train.tiny.model.train_loop: its reading, protocol and chain
    stages): 3 steps of 5 reading items (rows of different lengths and answer counts: the loss is a mean over
    the batch's labelled positions, not its rows); its SFT stage is ``sft``'s trainer."""
    from rag_lab.train.tiny.model import TinyConfig, reading_batch, train_loop

    tok, texts = tokenizer(model_dir), pairs(30)
    follow = zip(texts, texts[1:], strict=False)
    items = [(a, b, *((c, d) if i % 2 else ())) for i, ((a, b), (c, d)) in enumerate(follow)]
    batches = [reading_batch(tok, items[i * 5 : (i + 1) * 5], 64) for i in range(3)]
    config = TinyConfig(hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32, lr=1e-2, warmup_steps=1)
    model = model_of(model_dir)
    stats = train_loop(model, batches, 3, config, "test reading")
    return model, {"loss": stats["final_loss"]}


TRAINERS = {
    "sft": sft,
    "dpo": dpo,
    "grpo": grpo,
    "qnet": qnet,
    "preference": preference,
    "ppo": ppo,
    "tiny": tiny,
}


def main(trainers: str, model_dir: str, work: str, out: str) -> None:
    """Each of the comma-separated ``trainers`` in turn; rank 0 saves ``<out>/<trainer>.pt``."""
    from rag_lab.train.parallel import barrier, is_main, processes
    from rag_lab.train.sharded import fsdp_modules, full_state_dict, saveable

    for trainer in trainers.split(","):
        model, stats = TRAINERS[trainer](model_dir, Path(work) / f"{trainer}-p{processes()}")
        sharded = fsdp_modules(model) or stats.pop("sharded", False)
        weights = full_state_dict(model)  # every process: a collective when sharded
        if sharded and hasattr(model, "save_pretrained"):  # the sharded save, loaded back by the test
            plain = saveable(model)  # every process: a collective
            if is_main():
                plain.save_pretrained(Path(out) / f"{trainer}-saved")
        if is_main():
            record = {"weights": weights, "stats": stats, "processes": processes(), "sharded": sharded}
            torch.save(record, Path(out) / f"{trainer}.pt")
        barrier()


# accelerate's FSDP2 variables, as `accelerate launch --config_file` sets them from conf/launch/fsdp_cpu.yaml
FSDP_ENV = {
    "ACCELERATE_USE_FSDP": "true",
    "FSDP_VERSION": "2",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
    "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    "FSDP_RESHARD_AFTER_FORWARD": "true",
    "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
}


def forked(*args: str) -> None:
    import os

    from accelerate.state import AcceleratorState

    from rag_lab.core.loading import loading_on_purpose
    from rag_lab.train.parallel import state

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's one-process state came along
    # as rag_lab.runner.launched does first: the process group (FSDP on CPU where the launch asks for it),
    # then the loading switches; each process its LOCAL_RANK, as accelerate launch sets it (the debug
    # launcher leaves 0 in every process, which RAM-efficient loading reads)
    os.environ["LOCAL_RANK"] = str(state().process_index)
    loading_on_purpose()
    main(*args)


if __name__ == "__main__":
    args = sys.argv[1:5]
    torch.set_num_threads(1)
    Path(args[3]).mkdir(parents=True, exist_ok=True)
    main(*args)
    if "--fork" in sys.argv:
        import os

        from accelerate import debug_launcher

        n = int(sys.argv[sys.argv.index("--fork") + 1])
        if "--fsdp" in sys.argv:  # what `accelerate launch` sets for launch=fsdp_cpu
            os.environ.update(FSDP_ENV)
        Path(f"{args[3]}-{n}").mkdir(parents=True, exist_ok=True)
        debug_launcher(forked, (*args[:3], f"{args[3]}-{n}"), num_processes=n)
