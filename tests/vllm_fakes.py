"""A fake of vLLM's ``LLM`` under TRL's real vLLM backend (``trl.generation.vllm_generation.VLLMGeneration``),
so that the seams of the methods run TRL's own engine set-up, weight sync (PEFT merge, parameter names) and,
with tensor parallelism > 1, its prompt gather, on CPU. The fake generates with a transformers copy of the
weights it was built from, loaded as vLLM loads them (``load_weights`` by vLLM's names: an unknown name
fails), and records, at every ``generate``, whether its weights equal the live model's (``FakeLLM.live``).
Sleep mode as vLLM's: a level-2 sleep drops the weights (NaN here, so a generate before they are pushed
again is not ``synced``) and the KV cache; generating, or loading weights, while asleep fails."""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rag_lab.generators.base import Sampling, TokenPrompt
from rag_lab.generators.hf import HFGenerator


class FakeLLM:
    made: list = []
    tokenizer_dir: str = ""
    # the model the rollouts should see (a callable returning it), compared at every generate
    live = None

    def __init__(self, model: str, **settings):
        self.settings, self.syncs, self.calls, self.prompts = settings, 0, [], []
        # what sleeps now ("weights", "kv_cache"), and every sleep, wake-up and generate in order
        self.asleep: set[str] = set()
        self.events: list[tuple] = []
        self.generator = HFGenerator(model, self.tokenizer_dir, chat=False, dtype="float32", batch_size=64)
        self.model = self.generator.model.eval()
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self.load_weights))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)),
            model_config=SimpleNamespace(max_model_len=self.generator.context_length),
        )
        FakeLLM.made.append(self)

    def sleep(self, level: int = 1) -> None:
        self.events.append(("sleep", level))
        self.asleep = {"weights", "kv_cache"}
        if level == 2:  # the weights are dropped: pushed again before the next generate, or it is not synced
            for p in self.model.parameters():
                p.data.fill_(float("nan"))

    def wake_up(self, tags=None) -> None:
        tags = set(tags or ("weights", "kv_cache"))
        self.events.append(("wake", tuple(sorted(tags))))
        self.asleep -= tags

    def load_weights(self, pairs) -> None:
        assert "weights" not in self.asleep, "weights loaded into a sleeping engine (vLLM: unmapped memory)"
        params = dict(self.model.named_parameters())
        for name, tensor in pairs:
            assert name in params, f"vLLM has no parameter {name}"
            params[name].data.copy_(tensor)

    def reset_prefix_cache(self) -> None:  # TRL calls it at the end of every sync
        self.syncs += 1

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def synced(self) -> bool:
        live = dict(FakeLLM.live().named_parameters()) if FakeLLM.live else {}
        return bool(live) and all(torch.equal(p, live[n]) for n, p in self.model.named_parameters())

    def generate(self, prompts, sampling_params=None, use_tqdm=False):
        # vLLM's prompts: text (tokenized here, as vLLM does) or TokensPrompt ids (read as they are)
        tokenizer = self.generator.tokenizer
        ids = [
            tokenizer(p, add_special_tokens=False).input_ids
            if isinstance(p, str)
            else list(p["prompt_token_ids"])
            for p in prompts
        ]
        texts = [tokenizer.decode(i) for i in ids]
        assert not self.asleep, f"generate on a sleeping engine ({', '.join(sorted(self.asleep))} asleep)"
        self.prompts.append(texts)
        self.calls.append((self.synced(), self.syncs))
        self.events.append(("generate", len(texts)))
        self.generated_on = self.weights()  # the weights of the last generate (a sleep drops them after)
        sp = sampling_params
        sampling = Sampling(
            n=sp.n,
            temperature=sp.temperature,
            top_p=sp.top_p,
            max_new_tokens=sp.max_tokens,
            stop=tuple(getattr(sp, "stop", None) or ()),
            include_stop=getattr(sp, "include_stop_str_in_output", False),
            seed=getattr(sp, "seed", None),
        )
        outputs = self.generator.generate(
            [TokenPrompt(i, t) for i, t in zip(ids, texts, strict=True)], sampling
        )
        return [
            SimpleNamespace(
                prompt_token_ids=prompt,
                outputs=[
                    SimpleNamespace(
                        text=c.text,
                        token_ids=c.token_ids,
                        finish_reason=c.finish_reason,
                        logprobs=[
                            {t: SimpleNamespace(logprob=lp, rank=1)}
                            for t, lp in zip(c.token_ids, c.logprobs, strict=True)
                        ],
                    )
                    for c in completions
                ],
            )
            for prompt, completions in zip(ids, outputs, strict=True)
        ]


@pytest.fixture
def trl_vllm(monkeypatch):
    """TRL's vLLM backend on :class:`FakeLLM` (vLLM's module faked: its ``SamplingParams``); the process
    environment TRL's colocate set-up writes (RANK, MASTER_PORT, ...) restored afterwards."""
    import trl.generation.vllm_generation as backend
    import trl.trainer.grpo_trainer  # noqa: F401  (imported before the fake vLLM module: TRL probes vLLM)

    module = types.ModuleType("vllm")
    module.SamplingParams = lambda **kw: SimpleNamespace(**kw)
    module.LLM = lambda **kw: pytest.fail("the run's own engine is built only to evaluate")
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(backend, "is_vllm_available", lambda: True)
    monkeypatch.setattr(backend, "LLM", FakeLLM, raising=False)
    monkeypatch.setattr(backend, "SamplingParams", module.SamplingParams, raising=False)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # recorded as it was, restored at the end
        monkeypatch.delenv(key)
    monkeypatch.setattr(FakeLLM, "made", [])
    monkeypatch.setattr(FakeLLM, "live", None)
    return FakeLLM


def no_transformers_generation(monkeypatch, module) -> None:
    """Generating with transformers on the trained model (``module.generating``, rag_lab.train.lockstep's)
    fails the test: what must generate on the vLLM engine."""

    def refused(*args, **kwargs):
        raise AssertionError("generated with transformers on the trained model, not on the vLLM engine")

    monkeypatch.setattr(module, "generating", refused)
