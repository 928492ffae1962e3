"""``generator=vllm`` in training, on CPU: vLLM replaced by a fake engine (a transformers copy of the model,
tests/vllm_fakes.py) under TRL's real vLLM backend, TRL's ``GRPOTrainer`` with ``use_vllm`` as DAPO runs
it. Before each step's rollouts TRL loads the trained weights into the engine, DAPO's multi-turn rollouts
generate through that engine, and the run then evaluates on an engine of the trained weights."""

from types import SimpleNamespace

import pytest
import test_dapo
import vllm_fakes

from rag_lab.core.records import read_records
from rag_lab.env import Env
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.retrievers.bm25 import BM25Retriever
from rag_lab.train.heldout import HeldOut

pytestmark = pytest.mark.usefixtures("one_thread")
base, policy = test_dapo.base, test_dapo.policy  # the toy LM fixture, DAPO of toy sizes
FakeLLM, trl_vllm = vllm_fakes.FakeLLM, vllm_fakes.trl_vllm  # the fake engine and its fixture


@pytest.fixture
def fake_vllm(monkeypatch, base, trl_vllm):
    """TRL's real vLLM backend on the fake engine (tests/vllm_fakes.py), which compares its weights at every
    generate with the model TRL's backend was built around (the trainer's live one)."""
    import trl.trainer.grpo_trainer as grpo
    from trl.generation.vllm_generation import VLLMGeneration

    class Watched(VLLMGeneration):
        made: list = []

        def __init__(self, model, *args, **kwargs):
            super().__init__(model, *args, **kwargs)
            trl_vllm.live = lambda: model
            Watched.made.append(self)

    monkeypatch.setattr(grpo, "VLLMGeneration", Watched)
    trl_vllm.tokenizer_dir = str(base / "tokenizer")
    return Watched


def test_dapo_rolls_out_through_the_vllm_engine_that_trl_syncs_after_every_update(
    data, base, fake_vllm, tmp_path
):
    from rag_lab.generators.vllm import VLLMGenerator

    run_generator = VLLMGenerator(str(base), tokenizer=str(base / "tokenizer"), chat=False, train_memory=0.2)
    env = Env(data.corpus, BM25Retriever(data.corpus), run_generator)
    dapo = policy(steps=3, heldout=HeldOut(n=0), cache_dir=str(tmp_path / "cache"))
    dapo.fit(env, data.split("train"), [], tmp_path / "out")

    [backend], [engine] = fake_vllm.made, FakeLLM.made
    assert backend.mode == "colocate" and engine.syncs == 3  # TRL's sync, once before each step's rollouts
    assert engine.settings["gpu_memory_utilization"] == 0.2
    synced, versions = zip(*engine.calls, strict=True)
    assert all(synced)  # every rollout generated on the weights the trainer had then
    assert set(versions) == {1, 2, 3}  # each step's rollouts after that step's sync
    # evaluation: an engine of the trained weights, with the run's tokenizer and settings, built when used
    assert isinstance(dapo.generator, VLLMGenerator) and dapo.generator._llm is None
    assert dapo.generator.model_name.startswith(str(tmp_path / "cache"))
    assert dapo.generator.tokenizer_name == str(base / "tokenizer") and dapo.generator.chat is False


@pytest.mark.parametrize("sleep", [False, True], ids=["awake", "sleep"])
def test_dapos_heldout_curve_generates_on_trls_engine_synced_and_asleep_between_phases(
    data, base, fake_vllm, tmp_path, monkeypatch, sleep
):
    """The held-out curve goes through the trainer's vLLM engine, synced to the weights of the step it
    measures (never transformers on the model); with generator.sleep the engine sleeps between every
    phase (held-out at steps 0, 1, 2; the rollouts of the two steps), its weights pushed again on waking."""
    from rag_lab.generators.vllm import VLLMGenerator
    from rag_lab.train import lockstep

    vllm_fakes.no_transformers_generation(monkeypatch, lockstep)
    run_generator = VLLMGenerator(str(base), tokenizer=str(base / "tokenizer"), chat=False, sleep=sleep)
    env = Env(data.corpus, BM25Retriever(data.corpus), run_generator)
    dapo = policy(steps=2, heldout=HeldOut(n=2, every=1), cache_dir=str(tmp_path / "cache"))
    dev = data.split("dev")[:2]
    dapo.fit(env, data.split("train"), dev, tmp_path / "out")

    [engine] = FakeLLM.made
    synced, versions = zip(*engine.calls, strict=True)
    assert all(synced)  # every generate on the weights the trainer had then (NaN after a sleep otherwise)
    asked = [texts for texts in engine.prompts if any(q.question in t for q in dev for t in texts)]
    assert len(asked) >= 3  # the held-out questions, at steps 0, 1 and 2, on the engine
    rows = [r for r in read_records(next(tmp_path.glob("cache/**/log.jsonl"))) if "heldout/acc" in r]
    assert [r["step"] for r in rows] == [0, 1, 2]
    sleeps = [e for e in engine.events if e[0] == "sleep"]
    if sleep:  # asleep at start-up, then after each of the 5 phases; each phase pushes the weights again
        assert sleeps == [("sleep", 2)] * 6 and engine.syncs == 5
        assert engine.asleep == {"weights", "kv_cache"}
    else:  # the held-out measurements push each step's weights, and TRL's own sync then skips that step
        assert sleeps == [] and engine.syncs == 3


def test_the_grpo_config_asks_trl_for_vllm_as_the_generator_says(fake_vllm):
    from rag_lab.core.errors import RagLabError
    from rag_lab.generators.vllm import VLLMGenerator

    colocated = VLLMGenerator("m", train_memory=0.25, tensor_parallel_size=2, sleep=True).trl_settings()
    assert colocated == {"use_vllm": True, "vllm_mode": "colocate", "vllm_tensor_parallel_size": 2,
                         "vllm_gpu_memory_utilization": 0.25, "vllm_max_model_length": None,
                         "vllm_enable_sleep_mode": True}  # fmt: skip
    assert not VLLMGenerator("m").trl_settings()["vllm_enable_sleep_mode"]  # TRL's default: awake
    served = VLLMGenerator("m", train_mode="server", server_url="http://n1:8000").trl_settings()
    assert served["vllm_mode"] == "server" and served["vllm_server_base_url"] == "http://n1:8000"
    with pytest.raises(RagLabError, match="generator.server_url: train_mode=server needs"):
        VLLMGenerator("m", train_mode="server").trl_settings()


def test_every_method_asks_the_one_seam_whether_the_run_is_on_vllm(fake_vllm, tmp_path):
    """generators.base.vllm_backed: the vLLM generator is, a transformers model or the teacher is not; the
    same protocol answers for a config's class before anything is built (rag_lab.train.lockstep)."""
    from rag_lab.env.teacher.generator import TeacherGenerator
    from rag_lab.generators.base import VLLMBacked, vllm_backed
    from rag_lab.generators.vllm import VLLMGenerator

    engine = VLLMGenerator("m")
    assert vllm_backed(engine) is engine
    assert vllm_backed(HFGenerator.__new__(HFGenerator)) is None and vllm_backed(object()) is None
    assert issubclass(VLLMGenerator, VLLMBacked) and not issubclass(TeacherGenerator, VLLMBacked)


class Words:
    """A tokenizer of words ``w<id>``."""

    chat_template = None

    def __call__(self, texts, add_special_tokens=True):
        return SimpleNamespace(input_ids=[[int(w[1:]) for w in t.split()] for t in texts])

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


def test_the_engine_is_given_token_ids_a_token_prompts_as_they_are(trl_vllm):
    """vLLM's TokensPrompt: a text prompt tokenized once here (no special tokens added), a TokenPrompt's ids
    as they are; the engine never tokenizes."""
    from rag_lab.generators.base import TokenPrompt
    from rag_lab.generators.vllm import VLLMGenerator

    class Engine:
        def generate(self, prompts, params, use_tqdm=False):
            self.prompts = prompts
            done = SimpleNamespace(text="w9", token_ids=[9], finish_reason="stop", logprobs=None)
            return [SimpleNamespace(outputs=[done]) for _ in prompts]

    engine = Engine()
    generator = VLLMGenerator.around(engine, Words(), chat=False, logprobs=False)
    out = generator.generate(["w1 w2", TokenPrompt([5, 6, 7], "w5 w6")], Sampling(max_new_tokens=4))
    assert engine.prompts == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [5, 6, 7]}]
    assert [(c.text, c.token_ids, c.prompt_tokens) for [c] in out] == [("w9", [9], 2), ("w9", [9], 3)]


def test_the_server_generator_sends_the_stops_and_cuts_at_them(fake_vllm):
    from rag_lab.generators.vllm import VLLMServerGenerator

    sent = {}

    class Client:
        def generate(self, prompts, n, **kw):
            sent.update(kw, prompts=prompts, n=n)
            return {
                "completion_ids": [[1, 2, 3], [4, 5]],
                "logprobs": [[[-0.1], [-0.2], [-0.3]], [[-1.0], [-2.0]]],
            }

    generator = VLLMServerGenerator(Client(), Words(), chat=False, seed=3)
    [out] = generator.generate(["w7 w8"], Sampling(n=2, max_new_tokens=3, stop=("w2",), include_stop=True))
    assert sent["prompts"] == [[7, 8]]  # token ids: the server reads them as they are
    assert sent["generation_kwargs"] == {"stop": ["w2"], "include_stop_str_in_output": True, "seed": 3}
    assert [c.text for c in out] == ["w1 w2", "w4 w5"] and out[0].logprobs == [-0.1, -0.2, -0.3]
    assert [c.finish_reason for c in out] == ["stop", "stop"]


def test_the_methods_train_a_transformers_copy_and_any_other_is_one_line(fake_vllm, base):
    from rag_lab.core.errors import RagLabError
    from rag_lab.generators.vllm import VLLMGenerator
    from rag_lab.train.start import starting_model

    run = VLLMGenerator(str(base), tokenizer=str(base / "tokenizer"), chat=False)
    for method in ("dapo", "evorag", "r3rag"):  # their rollouts go through vLLM (tests/test_vllm_methods.py)
        start, copy = starting_model(method, run, None, None, "unused", trains=True)
        assert isinstance(copy, HFGenerator) and start == base
        assert starting_model(method, run, None, None, "unused", trains=False)[1] is run  # nothing trains
    with pytest.raises(RagLabError, match="generator=vllm: policy=other rolls out with transformers"):
        starting_model("other", run, None, None, "unused", trains=True)


def test_the_rollouts_build_trls_engine_with_the_generators_tokenizer_and_chat(data, base, monkeypatch):
    """The engine around TRL's vLLM backend speaks as the run's generator does (its tokenizer; chat or
    plain text), and the episodes go through it."""
    from rag_lab.policies.dapo import rollout
    from rag_lab.train import vllm_engine

    env = test_dapo.env_for(data, base)
    seen = {}

    def engine(vllm_generation, tokenizer, chat):
        seen.update(backend=vllm_generation, tokenizer=tokenizer, chat=chat)
        return env.generator

    monkeypatch.setattr(vllm_engine, "engine_generator", engine)
    questions = data.split("train")[:2]
    rollouts = rollout.SearchRollouts(
        env, env.generator, questions, [(test_dapo.length, 1.0)], k=2, max_turns=2,
        sampling=Sampling(temperature=1.0, max_new_tokens=8), dynamic_sampling=False, max_rounds=1, seed=0,
    )  # fmt: skip
    backend = SimpleNamespace(mode="server", enable_sleep_mode=False)  # TRL's backend as the rollouts read it
    trainer = SimpleNamespace(num_generations=2, state=SimpleNamespace(global_step=0), use_vllm=True,
                              vllm_generation=backend)  # fmt: skip
    out = rollouts([rollouts.first_prompt(q) for q in questions for _ in range(2)], trainer)
    assert seen == {"backend": backend, "tokenizer": env.generator.tokenizer, "chat": False}
    assert len(out["completion_ids"]) == 4 and rollouts.env.generator is env.generator
