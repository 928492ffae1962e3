"""Every setting a trainer reads, checked at compose against what it will meet: the batch and the ranks
(rag_lab/core/batches.py's table), each violation one line naming the keys and their values."""

import re

import pytest

from rag_lab.core.config import ConfigError, compose

CPU2 = ["launch=cpu2"]
# a step of 8 questions x G 6 = 48 sequences: a micro-batch of 16 divides it in one process (3 passes), not
# each of 2 processes' 24
SPLIT_BY_RANKS = ["questions_per_step=8", "group_size=6", "micro_batch=16"]


@pytest.mark.parametrize(
    "policy, prefix, unit",
    [("dapo", "policy.", "episodes"), ("apex", "policy.planner.", "plans")],
)
def test_a_micro_batch_divides_each_processs_share_of_a_step(policy, prefix, unit):
    settings = [f"{prefix}{s}" for s in SPLIT_BY_RANKS]
    compose([f"policy={policy}", *settings])  # 48 in one process: passes of 16
    says = (
        rf"^config '{re.escape(prefix)}micro_batch': 16 does not divide each process's 24 {unit} of a step "
        r"\(questions_per_step 8 x group_size 6 / 2 processes\)$"
    )
    with pytest.raises(ConfigError, match=says):
        compose([f"policy={policy}", *settings, *CPU2])
    compose([f"policy={policy}", *settings, f"{prefix}micro_batch=12", *CPU2])  # 24 = 2 passes of 12


def test_the_compose_rule_is_the_split_that_training_makes():
    """Over small sizes, the micro-batch rule at compose refuses exactly what the training-time split
    (rag_lab.train.grpo.passes, on a process's share) refuses; and what it accepts gives TRL a generation
    batch of whole groups (TRL's own rule: generation_batch_size % num_generations == 0)."""
    from rag_lab.core.batches import micro_batch
    from rag_lab.core.errors import RagLabError
    from rag_lab.train.grpo import passes

    checked = 0
    for processes in (1, 2, 4):
        for questions in range(processes, 13, processes):  # divides' rule holds
            for group in (2, 3, 6):
                for micro in range(1, 40):
                    s = {"questions_per_step": questions, "group_size": group, "micro_batch": micro}
                    refused = bool(micro_batch(s, "episodes", processes))
                    try:
                        keys = passes(questions // processes * group, micro, "policy.micro_batch")
                    except RagLabError:
                        assert refused, s | {"processes": processes}
                        continue
                    assert not refused, s | {"processes": processes}
                    generation = (
                        keys["per_device_train_batch_size"] * processes * keys["steps_per_generation"]
                    )
                    assert generation == questions * group and generation % group == 0
                    checked += 1
    assert checked > 500


@pytest.mark.parametrize(
    "policy, key", [("dapo", "policy.train_limit"), ("apex", "policy.planner.train_limit")]
)
def test_a_grpo_step_finds_its_questions(policy, key):
    """TRL's RepeatSampler drops a generation batch it cannot fill: 3 questions train no step of 4."""
    with pytest.raises(ConfigError, match=rf"^config '{key}': 3 training questions fill no step of "
                       r"questions_per_step=4$"):  # fmt: skip
        compose([f"policy={policy}", f"{key}=3"])
    compose([f"policy={policy}", f"{key}=4"])


def test_every_ppo_minibatch_has_a_sample_in_each_process():
    """8 questions x 4 temperatures: at least 32 samples an iteration, 16 in each of 2 processes."""
    ppo = ["policy=r3rag", "policy.ppo.batch_size=8", "policy.ppo.minibatches=20"]
    compose(ppo)  # 32 samples in one process
    says = (
        r"^config 'policy\.ppo\.minibatches': 20 minibatches and as few as 16 samples an iteration in each "
        r"process \(ppo\.batch_size 8 / 2 processes x 4 temperatures\): at most 16$"
    )
    with pytest.raises(ConfigError, match=says):
        compose([*ppo, *CPU2])
    compose(["policy=r3rag", "policy.ppo.batch_size=8", "policy.ppo.minibatches=16", *CPU2])
    with pytest.raises(ConfigError, match=r"'policy\.ppo\.minibatches': 40 minibatches and as few as 32"):
        compose(["policy=r3rag", "policy.ppo.batch_size=8", "policy.ppo.minibatches=40"])


@pytest.mark.parametrize(
    "overrides, says",
    [
        # DAPO's lora is null in its yaml: a mapping given here has no _target_, and is checked all the same
        (["policy=dapo", "+policy.lora={r:-1}"], r"'policy\.lora\.r': must be >= 0, got -1"),
        (["policy=dapo", "+policy.lora={r:4,alpha:0}"], r"'policy\.lora\.alpha': must be >= 1, got 0"),
        (["policy=dapo", "+policy.lora={r:4,rank:2}"], r"'policy\.lora\.rank': not a LoRA setting"),
        (["policy=dapo", "+policy.lora={r:4,target_modules:[]}"],
         r"'policy\.lora\.target_modules': \[\] with r=4: an adapter needs modules"),
        (["policy=evorag", "policy.lora.target_modules=[]"],
         r"'policy\.lora\.target_modules': \[\] with r=8: an adapter needs modules"),
        (["policy=dapo", "policy.cold_start.lora.r=4", "policy.cold_start.lora.target_modules=[]"],
         r"'policy\.cold_start\.lora\.target_modules': \[\] with r=4"),
        (["policy=apex", "policy.executor.lora.r=4", "policy.executor.lora.target_modules=[]"],
         r"'policy\.executor\.lora\.target_modules': \[\] with r=4"),
    ],
)  # fmt: skip
def test_lora_settings_are_checked_wherever_a_trainer_takes_them(overrides, says):
    with pytest.raises(ConfigError, match=rf"^config {says}"):
        compose(overrides)


def test_lora_targets_are_modules_of_the_runs_model_before_the_run_dir_is_touched(tmp_path):
    """The shipped tiny LM (Qwen2) has q_proj and gate_proj; 'gate_prj' is none of its modules: PEFT would
    train the others' adapters only (or none) without a word."""
    from rag_lab.run import check_lora, run

    lora = ["policy=evorag", "generator=tiny", "policy.lora.target_modules=[q_proj,gate_proj]"]
    check_lora(compose(lora))
    says = r"^config 'policy\.lora\.target_modules': 'gate_prj' is no module of Qwen2ForCausalLM \(.*q_proj"
    with pytest.raises(ConfigError, match=says):
        run(compose(["policy=evorag", "generator=tiny", "policy.lora.target_modules=[q_proj,gate_prj]"]),
            tmp_path / "run")  # fmt: skip
    assert not (tmp_path / "run").exists()
    cold = [
        "policy=dapo",
        "generator=tiny",
        "policy.cold_start.lora.r=4",
        "policy.cold_start.lora.target_modules=[proj]",
    ]
    with pytest.raises(
        ConfigError, match=r"^config 'policy\.cold_start\.lora\.target_modules': 'proj' is no"
    ):
        check_lora(compose(cold))


def test_a_colocated_vllm_engines_tensor_parallel_group_splits_the_training_ranks():
    """TRL's colocate mode groups the ranks tensor_parallel_size at a time: 2 cannot group 1 process."""
    vllm = ["generator=vllm", "generator.tensor_parallel_size=2"]
    says = (
        r"^config 'generator\.tensor_parallel_size': 2 does not divide the 1 training process\(es\) "
        r"\(launch\.config\.num_processes\)"
    )
    with pytest.raises(ConfigError, match=says):
        compose(["policy=dapo", *vllm])
    compose(["policy=dapo", *vllm, *CPU2])  # 2 processes, one group
    compose(["policy=dapo", *vllm, "generator.train_mode=server", "generator.server_url=http://h:8000"])
    compose(["policy=standard_rag", *vllm])  # nothing trains: the engine's own TP only


def test_ppo_settings_built_by_hand_check_the_same_relations():
    """R3-RAG's PPO settings are checked where their dataclass is built: the same one line as at compose."""
    from rag_lab.core.errors import RagLabError
    from rag_lab.policies.r3rag.ppo import PPOSettings

    with pytest.raises(RagLabError, match=r"^policy\.ppo\.temperatures: \[\]: one temperature or more"):
        PPOSettings(temperatures=())
    with pytest.raises(RagLabError, match=r"^policy\.ppo\.minibatches: 40 minibatches and as few as 32"):
        PPOSettings(batch_size=8, minibatches=40)
    assert PPOSettings(batch_size=8, minibatches=32).minibatches == 32
