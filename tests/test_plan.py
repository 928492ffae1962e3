"""The memory plan (rag_lab.plan, rag_lab/train/memory; issue 72): its ledger's arithmetic, the shards it
reads by 8 and 16 ranks, faults planted in what it models (an unsharded reference, a full gather), the check
before a GPU launch trains, its one-line errors. Small architectures here; the paper experiments' 7B plans
are in the slow set (minutes each on 2 cores)."""

import json
import math
import sys
from dataclasses import replace

import pytest
import torch
import yaml

from rag_lab.core.config import compose
from rag_lab.core.errors import RagLabError
from rag_lab.policies.r3rag import memory as r3rag_memory
from rag_lab.train.memory import fake, phases
from rag_lab.train.memory.architectures import model_config, shipped
from rag_lab.train.memory.ledger import GIB, Ledger, Phase
from rag_lab.train.memory.planner import plan

# a causal LM whose layers outweigh its embeddings, and its weights its activations at a few tokens: the
# faults below show in its ledger
SMALL = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# a few tokens a sequence: a prompt of 8, one turn of 4 new tokens
SHORT = ["launch.memory.prompt_tokens=8", "launch.memory.passage_tokens=4"]
SHORT += ["policy.max_turns=1", "policy.max_new_tokens=4"]


def model_dir(factory, name: str, **changes) -> str:
    folder = factory.mktemp(name)
    (folder / "config.json").write_text(json.dumps(SMALL | changes))
    return str(folder)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return model_dir(tmp_path_factory, "small_lm")


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """The same, its output head the input embedding (SmolLM2's, Qwen3-4B's)."""
    return model_dir(tmp_path_factory, "tied_lm", tie_word_embeddings=True)


def dapo(model: str, processes: int, *more: str):
    """DAPO's GRPO on ``model`` over ``processes`` GPUs (its search reward's encoder on the CPU)."""
    machines = [f"launch.config.num_machines={processes // 8}"] if processes > 8 else []
    return compose(
        [
            "policy=dapo",
            "generator=hf",
            f"generator.model={model}",
            "launch=fsdp",
            "policy.cold_start=null",
            f"launch.config.num_processes={processes}",
            *machines,
            f"policy.questions_per_step={processes}",
            "policy.group_size=2",
            "+reward.search.encoder.device=cpu",
            *SHORT,
            *more,
        ]  # fmt: skip
    )


def r3rag(model: str, *more: str):
    """R3-RAG's PPO rolling out on a vLLM server (TRL's weight sync gathers each weight; no engine here)."""
    return compose(
        [
            "policy=r3rag",
            "generator=vllm",
            f"generator.model={model}",
            "generator.train_mode=server",
            "generator.server_url=http://127.0.0.1:8000",
            "launch=fsdp",
            "policy.cold_start=null",
            "policy.ppo.batch_size=8",
            "policy.ppo.micro_batch=1",
            "policy.ppo.minibatches=1",
            *SHORT,
            *more,
        ]  # fmt: skip
    )


def test_the_ledger_adds_its_lines_and_names_the_largest_of_the_peak_phase():
    update = Phase("GRPO", "update", {"policy shards": 2 * GIB, "activations": 40 * GIB})
    update.lines["generation engine"] = 24 * GIB
    rollout = Phase("GRPO", "rollout", {"policy shards": 2 * GIB, "generation engine": 24 * GIB})
    ledger = Ledger("run", 8, 80 * GIB, 0.1, [rollout, update])
    assert update.total == 66 * GIB and ledger.peak is update and ledger.bound == 72 * GIB
    assert ledger.over() is None  # 66 GiB under 90% of 80
    update.lines["temporaries / all-gather"] = 7 * GIB  # 73 GiB
    assert ledger.over() == (
        "the GRPO update phase peaks at 73.00 GiB a GPU, over 72.00 GiB (90% of 80.00 GiB); its largest "
        "line: activations 40.00 GiB"
    )
    assert ledger.columns() == [
        "policy shards",
        "generation engine",
        "activations",
        "temporaries / all-gather",
    ]
    assert ledger.rows()[0] == ["GRPO", "rollout", "2.00", "24.00", "", "", "26.00"]
    with pytest.raises(ValueError, match="not a line of the ledger: weights"):
        Phase("SFT", "update", {"weights": 1})


def meta_model(model: str):
    """The model of ``model``'s architecture on the meta device, in bf16 (as a GPU loads it)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(model_config(model, "x"), dtype=torch.bfloat16)


def rank0_shards(model: str, world: int) -> int:
    """Rank 0's float32 shards of every weight (a tied one once): FSDP2 gives rank 0 the first of ``world``
    chunks along the first dimension, ceil(d0 / world) rows, padded to that size on every rank."""
    weights = meta_model(model).parameters()
    return 4 * sum(math.ceil(p.shape[0] / world) * math.prod(p.shape[1:]) for p in weights)


def buffer_bytes(model: str) -> int:
    """The model's buffers (rotary frequencies), whole on every rank: FSDP does not shard them."""
    return sum(b.numel() * b.element_size() for b in meta_model(model).buffers())


@pytest.mark.parametrize("world, which", [(8, "small"), (16, "small"), (8, "tied")])
def test_the_policy_is_sharded_by_the_launchs_processes(world, which, request):
    """One node of 8 and two of 16: each GPU holds its float32 shard of every weight (accelerate upcasts the
    trained ones under bf16 mixed precision; a tied weight once) and AdamW's two moments of it, and a step
    counter a weight."""
    model = request.getfixturevalue(which)
    ledger = plan(dapo(model, world))
    save = next(p for p in ledger.phases if p.name == "save")
    shards, weights = rank0_shards(model, world), len(list(meta_model(model).parameters()))
    assert save.lines["policy shards"] == shards + buffer_bytes(model)
    assert save.lines["optimizer state"] == 2 * shards + 4 * weights
    assert ledger.world == world and [p.name for p in ledger.phases] == ["rollout", "update", "save"]


@pytest.fixture(scope="module")
def ppo_plan(small):
    """R3-RAG's plan as the code is, and a GPU just large enough for it (its peak 2% under the bound)."""
    clean = plan(r3rag(small))
    return clean, clean.peak.total * 1.02 / 0.9 / GIB


def test_a_reference_left_whole_on_every_gpu_exceeds_the_plan(small, ppo_plan, monkeypatch):
    """R3-RAG's initial model sharded like the policy fits; planted whole on every GPU (the deepcopy ppo.py
    made before issue 72), the plan exceeds the bound, the whole model on the reference's line."""
    clean, gpu = ppo_plan
    assert replace(clean, gpu_bytes=int(gpu * GIB)).over() is None
    assert clean.phases[1].name == "reference pass"
    monkeypatch.setattr(r3rag_memory, "initial_model", lambda reference, bench: fake.materialize(reference))
    planted = plan(r3rag(small, f"launch.memory.gpu_memory_gib={gpu}"))
    whole = sum(p.numel() * 2 for p in meta_model(small).parameters()) + buffer_bytes(small)
    assert all(p.lines["reference"] == whole for p in planted.phases)
    assert whole > 7 * clean.phases[1].lines["reference"]
    assert planted.over().startswith(f"the R3-RAG (PPO) {planted.peak.name} phase peaks at ")


def test_a_full_gather_on_the_gpu_exceeds_the_plan(small, ppo_plan, monkeypatch):
    """The final model gathered one weight at a time with CPU offload fits; planted as one full state dict
    on the GPU (torch's get_model_state_dict without cpu_offload, what sharded.py's full_state_dict did), the
    save phase exceeds the bound by every weight gathered at once."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    clean, gpu = ppo_plan
    largest = 4 * max(p.numel() for p in meta_model(small).parameters())  # one float32 weight, whole
    assert clean.phases[0].lines["temporaries / all-gather"] == largest  # TRL's sync: one weight at a time
    assert largest <= clean.phases[-1].lines["temporaries / all-gather"] < 2 * largest
    whole = StateDictOptions(full_state_dict=True, cpu_offload=False)
    monkeypatch.setattr(phases, "gather_each", lambda model: get_model_state_dict(model, options=whole))
    planted = plan(r3rag(small, f"launch.memory.gpu_memory_gib={gpu}"))
    save, weights = planted.phases[-1], sum(p.numel() for p in meta_model(small).parameters())
    gathered = save.lines["temporaries / all-gather"]
    assert planted.peak is save and save.largest()[0] == "temporaries / all-gather"
    assert gathered >= 4 * weights > 4 * clean.phases[-1].lines["temporaries / all-gather"]
    assert planted.over().startswith("the R3-RAG (PPO) save phase peaks at ")


def test_a_plan_over_the_gpu_stops_the_run_in_one_line_before_anything_trains(
    small, tmp_path, capfd, monkeypatch
):
    from tests.conftest import cli

    run_dir = tmp_path / "run"
    args = ["policy=dapo", "generator=hf", f"generator.model={small}", "launch=fsdp",
            "policy.cold_start=null", "policy.questions_per_step=8", "+reward.search.encoder.device=cpu",
            "launch.memory.gpu_memory_gib=0.001", *SHORT, f"hydra.run.dir={run_dir}"]  # fmt: skip
    rc, out = cli("run", args, capfd, monkeypatch)
    last = out.strip().splitlines()[-1]
    assert rc == 1
    assert last.startswith("error: config 'launch.memory.gpu_memory_gib': the DAPO (GRPO) ")
    assert "over 0.00 GiB (90% of 0.00 GiB); its largest line: " in last
    assert not (run_dir / "config.yaml").exists()


def test_cpu_launches_plan_nothing_before_they_train():
    from rag_lab.train.memory.planner import check

    for launch in ("cpu2", "fsdp_cpu"):
        cfg = compose(["policy=dapo", "generator=tiny", f"launch={launch}"])
        assert cfg.launch.get("memory") is None
        check(cfg)  # nothing to plan: returns at once


def test_an_unknown_model_and_an_unplanned_launch_are_one_line(capfd, monkeypatch):
    from tests.conftest import cli

    unknown = ["policy=dapo", "generator=hf", "generator.model=nobody/none", "launch=fsdp"]
    rc, out = cli("plan", [*unknown, "policy.questions_per_step=8"], capfd, monkeypatch)
    assert rc == 1
    assert out.strip().splitlines()[-1] == (
        "error: generator.model: 'nobody/none' has no architecture here (not a local folder, not in the HF "
        f"cache, not shipped: {', '.join(shipped())})"
    )
    ddp = ["policy=dapo", "generator=tiny", "launch=ddp", "policy.questions_per_step=8"]
    rc, out = cli("plan", ddp, capfd, monkeypatch)
    assert rc == 1 and out.strip().splitlines()[-1].startswith(
        "error: config 'launch': MULTI_GPU is not planned"
    )


# the parameters each model card gives (rounded as the card rounds them)
CARDS = {
    "Qwen/Qwen3-4B": 4.0e9,
    "Qwen/Qwen3-8B": 8.2e9,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 135e6,
    "Qwen/Qwen3-Embedding-0.6B": 0.6e9,
    "BAAI/bge-large-en-v1.5": 335e6,
    "intfloat/e5-base-v2": 109e6,
    "facebook/contriever-msmarco": 109e6,
    "BAAI/bge-reranker-v2-m3": 568e6,
    "microsoft/deberta-v3-large": 435e6,
}


def count(name: str) -> int:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    config = model_config(name, "x")
    arch = (getattr(config, "architectures", None) or [""])[0]
    cls = AutoModelForSequenceClassification if "Sequence" in arch else AutoModelForCausalLM
    cls = AutoModel if "Embedding" in name or arch.endswith("Model") or not arch else cls
    with torch.device("meta"):
        return sum(p.numel() for p in cls.from_config(config).parameters())


def test_the_shipped_architectures_are_the_models_the_papers_name():
    # Qwen2.5-7B(-Instruct), by hand: two 152064 x 3584 matrices (input and output), 28 layers of attention
    # (q, o 3584 x 3584; k, v 512 x 3584; biases on q, k, v), a SwiGLU of 3 x 3584 x 18944, two norms; a
    # final norm
    layer = 2 * 3584 * 3584 + 2 * 512 * 3584 + 3584 + 2 * 512 + 3 * 3584 * 18944 + 2 * 3584
    qwen = 2 * 152064 * 3584 + 28 * layer + 3584
    assert count("Qwen/Qwen2.5-7B-Instruct") == count("Qwen/Qwen2.5-7B") == qwen
    # Llama-3.1-8B(-Instruct): 128256 x 4096 twice, 32 layers (q, o 4096^2; k, v 1024 x 4096; no biases),
    # a SwiGLU of 3 x 4096 x 14336, two norms; a final norm
    layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    llama = 2 * 128256 * 4096 + 32 * layer + 4096
    assert count("meta-llama/Llama-3.1-8B") == count("meta-llama/Llama-3.1-8B-Instruct") == llama
    for name, card in CARDS.items():
        assert count(name) / card == pytest.approx(1, rel=0.01), name


def paper_overrides(name: str) -> list[str]:
    sys.path.insert(0, "experiments")
    from plan_memory import overrides

    return overrides(name)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["stoprag_musique", "dapo_2wiki", "evorag_hotpotqa", "r3rag_hotpotqa", "apex_musique"]
)
def test_each_paper_experiment_fits_an_h100(name):
    """The docs' table (make memory-plan): the experiment at its paper's model size on the H100s it names (one
    node of 8; R3-RAG's two) stays under 72 GiB a GPU in every phase."""
    ledger = plan(compose(paper_overrides(name)))
    assert ledger.over() is None, ledger.text()


@pytest.mark.slow
def test_the_gpu_checks_smollm2_step_has_its_plan():
    """make gpu-check's one launch=fsdp step of SmolLM2 on one GPU (experiments/gpu_check.sh's fsdp_step):
    the plan it compares with torch.cuda.max_memory_allocated."""
    ledger = plan(compose(["experiment=dapo_synth", "generator=smollm2", "policy.steps=1", "launch=fsdp",
                           "launch.config.num_processes=1", "policy.questions_per_step=4"]))  # fmt: skip
    assert ledger.world == 1 and 0 < ledger.peak.total < ledger.bound
    names = {p.trainer for p in ledger.phases}
    assert names == {"DAPO (GRPO)"}


def test_each_trained_policy_names_its_plan_and_one_without_is_one_line():
    """The planner imports no policy: each trained policy class names its plan (``memory_plan``)."""
    from rag_lab import CONF_DIR
    from rag_lab.core.config import locate
    from rag_lab.train.memory.methods import plan_of

    targets = {yaml.safe_load(p.read_text()).get("_target_") for p in (CONF_DIR / "policy").glob("*.yaml")}
    trained = [cls for cls in map(locate, filter(None, targets)) if getattr(cls, "trains", False)]
    assert {cls.__name__ for cls in trained} == {"APEX", "DAPO", "EvoRAG", "R3RAG", "StopRAG"}
    assert all(callable(plan_of(cls)) for cls in trained)
    with pytest.raises(RagLabError, match=r"^policy: Untrained trains, and names no memory plan"):
        plan_of(type("Untrained", (), {"trains": True}))
