"""One resident model per role (issue 72): the run's generator lets its weights go once a method trains its
own copy; only a trained model loads under ZeRO-3's init or FSDP's RAM-efficient loading, every frozen one
whole and right in every process; PPO's reference is sharded like the policy; checkpoints for resume are
torch's distributed checkpoint, resumed into 2 processes or 1; the final save is gathered once, in the
loaded dtype."""

import gc
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rag_lab.generators.hf import HFGenerator

HERE = Path(__file__).parent


def generator_of(tiny_lm: str) -> HFGenerator:
    return HFGenerator(tiny_lm, f"{tiny_lm}/tokenizer", dtype="float32", chat=False)


def test_the_runs_generator_holds_no_weights_once_a_method_has_its_own_copy(tiny_lm, tmp_path):
    """R3-RAG's start (a copy of the run's model to train): the run's generator's model is freed (no reference
    to it is left), and the generator loads the same weights again when asked to generate."""
    from rag_lab.generators.base import Sampling
    from rag_lab.train.start import starting_model

    base = generator_of(tiny_lm)
    before = {k: v.clone() for k, v in base.model.state_dict().items()}
    first = weakref.ref(base.model)
    _, own = starting_model("r3rag", base, None, None, str(tmp_path), trains=True)
    gc.collect()
    assert first() is None and base._model is None  # nothing holds the run's model while the method trains
    assert own.model is not None and own.model is not base._model
    prompt = "where was ada born ?"
    greedy = Sampling(max_new_tokens=4)
    assert base.generate([prompt], greedy)[0][0].text == own.generate([prompt], greedy)[0][0].text
    assert all(torch.equal(base.model.state_dict()[k], v) for k, v in before.items())  # reloaded as it was


def test_a_method_that_trains_nothing_acts_with_the_runs_generator_itself(tiny_lm, tmp_path):
    from rag_lab.train.start import starting_model

    base = generator_of(tiny_lm)
    model = base.model
    assert starting_model("r3rag", base, None, None, str(tmp_path), trains=False)[1] is base
    assert base._model is model


class FakeZero3:
    """A registered DeepSpeed config as transformers sees it (``HfDeepSpeedConfig``; DeepSpeed is absent)."""

    config = {"zero_optimization": {"stage": 3}}

    def is_zero3(self) -> bool:
        return True


def test_only_the_trained_model_loads_under_zero3_init(tiny_lm, tmp_path, monkeypatch):
    """A ZeRO-3 launch (``zero3_init_flag``), a fake DeepSpeed registration: from the launched process's start
    (:func:`loading_on_purpose`) the run's generator and an encoder load whole; the trained model (the cold
    start's SFT model) loads under ZeRO-3's init and FSDP's efficient loading, both ending with the load. A
    TRL trainer's arguments register DeepSpeed's config again: a model TRL then loads itself (its reference,
    which its ``prepare_deepspeed`` shards) sees it, but the policy's copy and a reload still load whole."""
    from types import SimpleNamespace

    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations import deepspeed

    from rag_lab.core.loading import loading_on_purpose, trained_loading
    from rag_lab.train.resume import load_model
    from rag_lab.train.start import starting_model

    def registered(plugin) -> None:  # accelerate's registration, with a config transformers can read here
        plugin.dschf = FakeZero3()
        deepspeed.set_hf_deepspeed_config(plugin.dschf)

    launch = {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_ZERO3_INIT": "true",
        "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
        "FSDP_CPU_RAM_EFFICIENT_LOADING": "true",
    }
    for key, value in launch.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(DeepSpeedPlugin, "set_deepspeed_weakref", registered)
    plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True)
    fsdp = SimpleNamespace(cpu_ram_efficient_loading=True)  # the FSDP switch follows the same rule
    monkeypatch.setattr(AcceleratorState, "_shared_state", {"deepspeed_plugin": plugin, "fsdp_plugin": fsdp})
    monkeypatch.setattr(deepspeed, "_hf_deepspeed_config_weak_ref", None)
    seen, real = [], AutoModelForCausalLM.from_pretrained.__func__

    def recorded(cls, path, *args, **kwargs):
        seen.append((Path(path).name, deepspeed.is_deepspeed_zero3_enabled(), os.environ[EFFICIENT]))
        with monkeypatch.context() as m:  # then loaded for real (no DeepSpeed here)
            m.setattr(deepspeed, "_hf_deepspeed_config_weak_ref", None)
            return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(recorded))
    registered(plugin)  # as the accelerator state's plugin registers it when it is made
    loading_on_purpose()
    base = generator_of(tiny_lm)  # the run's generator
    AutoModelForCausalLM.from_pretrained(tiny_lm)  # e.g. an encoder
    with trained_loading():
        AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)  # rag_lab.train.sft's
    trainer_arguments = DeepSpeedPlugin(zero_stage=3)
    registered(trainer_arguments)  # a TRL trainer's TrainingArguments register again
    AutoModelForCausalLM.from_pretrained(tiny_lm)  # e.g. TRL's reference model, made by the trainer
    starting_model("r3rag", base, None, None, str(tmp_path), trains=True)  # the policy's copy
    load_model(tiny_lm, like=base.model)  # a reload (EVO-RAG's, a finished stage), also the released base
    name, whole = Path(tiny_lm).name, (Path(tiny_lm).name, False, "false")
    assert seen == [whole, whole, (name, True, "true"), (name, True, "false"), whole, whole, whole]
    assert deepspeed.is_deepspeed_zero3_enabled()  # the trainer's registration is back after each load
    import inspect

    import rag_lab.runner.launched

    launched = inspect.getsource(rag_lab.runner.launched.main)  # each launched process: before any model
    assert launched.index("loading_on_purpose()") < launched.index("components(cfg")


EFFICIENT = "FSDP_CPU_RAM_EFFICIENT_LOADING"


def test_the_sft_model_is_the_one_loaded_under_trained_loading():
    """The cold start's SFT (TRL's trainer prepares the model right after it loads) is the trained load."""
    import inspect

    import rag_lab.train.sft as sft

    source = inspect.getsource(sft.sft)
    assert "with trained_loading():" in source
    assert source.index("with trained_loading():") < source.index("AutoModelForCausalLM.from_pretrained")


def test_a_save_keeps_the_dtype_the_model_was_loaded_in(tiny_lm):
    """FSDP trains float32 master weights under bf16 mixed precision; the save is bf16, as loaded."""
    from rag_lab.train.sharded import as_loaded

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.bfloat16)
    weights = {k: v.float() for k, v in model.state_dict().items()}
    saved = as_loaded(weights, model)
    assert {v.dtype for v in saved.values()} == {torch.bfloat16}
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    plain = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    assert as_loaded(weights, plain)["lm_head.weight"].dtype == torch.float32


@pytest.fixture(scope="module")
def two_processes(tiny_lm, tmp_path_factory) -> Path:
    """tests/residency.py: two processes forked under launch=fsdp_cpu's variables with RAM-efficient loading,
    then one process resuming their checkpoint."""
    work = tmp_path_factory.mktemp("residency")
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, str(HERE / "residency.py"), tiny_lm, str(work)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return work


def test_every_frozen_model_is_whole_and_right_in_every_process_under_efficient_loading(
    tiny_lm, two_processes
):
    """``fsdp_cpu_ram_efficient_loading`` (finding 9): a plain ``from_pretrained`` (a TRL reference, an
    encoder), the run's generator (then released) and the policy's copy hold the checkpoint's weights in
    rank 1 too; only a trained model's load is empty there (accelerate's prepare broadcasts rank 0's). PPO's
    reference is sharded (each process holds part of it) and gives rank 1 the logits of the checkpoint."""
    from residency import IDS

    ranks = [torch.load(two_processes / f"rank{r}.pt") for r in (0, 1)]
    expected = AutoModelForCausalLM.from_pretrained(tiny_lm).eval()(input_ids=IDS).logits.detach()
    keys = ("plain", "generator", "copy", "released", "trained_zeros")
    holds = [{k: record[k] for k in keys} for record in ranks]
    assert holds == [dict.fromkeys(keys[:4], True) | {"trained_zeros": r == 1} for r in (0, 1)]
    for r, record in enumerate(ranks):
        torch.testing.assert_close(record["reference_logits"], expected, rtol=0, atol=1e-6, msg=f"rank {r}")
    assert all(local < 0.6 * whole for local, whole in (record["reference_share"] for record in ranks))


def test_a_sharded_ppo_checkpoint_resumes_into_two_processes_or_one(two_processes):
    """R3-RAG's checkpoint after an update (torch's distributed checkpoint: each process wrote its shards),
    resumed by a fresh start in two processes and in one: the weights and AdamW's state of the update."""
    trained = torch.load(two_processes / "trained.pt")
    two = torch.load(two_processes / "rank0.pt")["resumed"]
    one = torch.load(two_processes / "one.pt")["resumed"]
    assert not torch.load(two_processes / "rank1.pt")["resumed"][0]  # gathered on the main process only
    assert sorted((two_processes / "ppo" / "checkpoint-1" / "sharded").iterdir())[-2:] == [
        two_processes / "ppo" / "checkpoint-1" / "sharded" / f"__{r}_0.distcp" for r in (0, 1)
    ]
    for weights, optimizer in (two, one):
        assert weights.keys() == trained["weights"].keys()
        for key, value in trained["weights"].items():
            assert torch.equal(weights[key], value), key
        for key, state in trained["optimizer"]["state"].items():
            for name, value in state.items():
                assert torch.equal(optimizer["state"][key][name], value), (key, name)


def test_the_final_save_is_gathered_once_and_loads_back_as_one_checkpoint(two_processes):
    """The trained policy gathered onto the main process: an ordinary transformers checkpoint and value head,
    equal to the trained weights bit for bit."""
    trained = torch.load(two_processes / "trained.pt")["weights"]
    saved = AutoModelForCausalLM.from_pretrained(two_processes / "saved").state_dict()
    for key, value in saved.items():
        assert torch.equal(value, trained[f"lm.{key}"]), key
    head = torch.load(two_processes / "saved" / "value_head.pt")
    assert torch.equal(head["weight"], trained["head.weight"])


def test_an_incomplete_ppo_checkpoint_is_one_line_naming_it(tmp_path):
    """A checkpoint whose shards were cut short (no ``.metadata``, written last) is refused in one line."""
    from rag_lab.core.errors import RagLabError
    from rag_lab.policies.r3rag.trainer import SHARDED, PPOTrainer

    (tmp_path / "checkpoint-2" / SHARDED).mkdir(parents=True)
    (tmp_path / "checkpoint-2" / "state.json").write_text('{"iteration": 2, "rows": []}\n')
    (tmp_path / "checkpoint-2" / SHARDED / "__0_0.distcp").write_bytes(b"cut")
    says = r"checkpoint-2/sharded is incomplete: remove .*checkpoint-2 to resume"
    with pytest.raises(RagLabError, match=says):
        PPOTrainer.resume(PPOTrainer.__new__(PPOTrainer), tmp_path)


def test_a_sharded_runs_qnet_optimizer_state_resumes_in_one_process(tmp_path):
    """Stop-RAG's optimizer state as a sharded run writes it (torch's distributed checkpoint beside the
    checkpoint file, which names its folder), loaded by a resumed run in one process: AdamW's state as it
    was (a one-process run loaded nothing from it before)."""
    from rag_lab.policies.stoprag.trainer import shard, sharded_optimizer

    def network() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
        return net, torch.optim.AdamW(net.parameters(), lr=1e-2)

    net, opt = network()
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    name = sharded_optimizer(net, opt, tmp_path, 3)
    fresh, fresh_opt = network()
    fresh.load_state_dict(net.state_dict())
    assert shard(fresh, fresh_opt, {"sharded_optimizer": name}, tmp_path) is None  # not an FSDP launch
    for (_, a), (_, b) in zip(opt.state.items(), fresh_opt.state.items(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_trl_trainers_sharded_checkpoint_resumes_to_the_uninterrupted_weights(tiny_lm, tmp_path):
    """TRL's trainers under launch=fsdp_cpu (``fsdp_state_dict_type: SHARDED_STATE_DICT``): the cold start's
    SFT in two processes, killed after its checkpoint of step 2 (each process's shards of the model and the
    optimizer, no gathered model), resumes to the weights of a run never killed."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, str(HERE / "residency.py"), tiny_lm, str(tmp_path), "--sft"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = torch.load(tmp_path / "sft.pt")
    assert (out["straight_from"], out["resumed_from"]) == (None, 2)
    assert {"optimizer_0", "pytorch_model_fsdp_0"} <= set(out["checkpoint"])
    assert not any(name.endswith((".safetensors", ".bin")) for name in out["checkpoint"])
    for key, value in out["straight"].items():
        torch.testing.assert_close(out["resumed"][key], value, rtol=0, atol=1e-6, msg=key)
