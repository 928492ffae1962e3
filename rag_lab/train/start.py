"""The model a trained method starts from (DAPO, EVO-RAG, R3-RAG): the cold start of the run's model when one
is configured (:func:`rag_lab.train.cold_start.cold_start`, cached), else a copy of the run's model (the run's
generator is shared, so a method never trains it in place), or the run's generator itself when nothing trains.
With ``generator=vllm`` the copy is a transformers one of the same weights (the rollouts go through vLLM).
Once the method has its own model, the run's generator lets its weights go (:func:`released`).
"""

from pathlib import Path

from rag_lab.core.errors import RagLabError
from rag_lab.generators.base import vllm_backed
from rag_lab.train.cold_start import ColdStartConfig, cold_start, load
from rag_lab.train.resume import load_model

# the methods that train the run's model and roll it out (their packages under rag_lab/policies/), on vLLM
# with generator=vllm: DAPO and APEX's planner through TRL's GRPOTrainer, R3-RAG's PPO and EVO-RAG's cycles
# through rag_lab.train.vllm_engine; their held-out curves on the same engines (rag_lab.train.lockstep.acting)
ROLLS_OUT_ON_VLLM = ("apex", "dapo", "evorag", "r3rag")


def starting_model(
    method: str, base, config: ColdStartConfig | None, train_data, cache_dir: str, trains: bool
) -> tuple[Path, object]:
    """(the starting weights' directory, a generator acting with them) for ``policy=<method>`` from the run's
    generator ``base``; ``trains``: whether any stage will train (else the run's model is used as it is)."""
    run = base
    vllm = vllm_backed(base)
    if vllm:  # generator=vllm: train a transformers copy (rag_lab.generators.vllm)
        if method not in ROLLS_OUT_ON_VLLM:
            raise RagLabError(
                f"generator=vllm: policy={method} rolls out with transformers while it trains (the rollouts "
                f"of {', '.join(ROLLS_OUT_ON_VLLM)} go through vLLM); set generator=hf generator.model=<the "
                "same model>"
            )
        base = vllm.trainable()
    if not hasattr(base, "model") or not hasattr(base, "tokenizer"):
        raise RagLabError(f"policy={method} trains a transformers model: set generator=tiny, smollm2 or hf")
    start = Path(base.model.name_or_path)
    if config is not None:
        if train_data is None:
            raise RagLabError("policy.cold_start needs the training dataset (the runner hands it over)")
        start = cold_start(
            base.model.name_or_path,
            train_data,
            config,
            cache_dir,
            tokenizer=base.tokenizer.name_or_path,
            chat=base.chat,
        )
        return start, released(run, load(start, batch_size=base.batch_size, seed=base.seed))
    if trains:
        return start, released(run, base.with_model(load_model(start, like=base.model)))
    return start, run


def released(run, generator):
    """``generator`` (the method's own model), with the run's generator ``run`` holding no weights from here
    on: a trained method trains and acts with its own copy, so the run's would only take a second model's
    memory during training (15 GB on each GPU for a 7B model); it loads them again if anything asks it to
    generate (a judge that is the run's generator, an evaluation). A vLLM generator keeps its engine (the
    rollouts' engine)."""
    if hasattr(run, "release"):
        run.release()
    return generator
