"""Each GPU's memory for a run, planned without a GPU (issue 72): ``python -m rag_lab.plan <overrides>``.

The run's own model, built from its real architecture (its ``config.json``: :mod:`.architectures`) with fake
weights, sharded over a fake process group of the launch's world size exactly as accelerate's FSDP2 path
shards it (:mod:`.fake`), runs one step of each trainer its method uses (:mod:`.trainers`: TRL's SFT, GRPO /
DAPO and DPO + LoRA; R3-RAG's PPO and Stop-RAG's Q-network in their own packages, ``rag_lab/policies/r3rag/
memory.py`` and ``rag_lab/policies/stoprag/memory.py``) with the config's batch sizes and lengths
(:mod:`.methods`; each trained policy class names its plan), beside the rest of what the GPU holds: the
generation engine's reservation, the reference, the encoders (:mod:`.context`, :mod:`.phases`). torch's own
trackers (``FSDPMemTracker``, ``MemTracker``) read each phase's peak (:mod:`.measure`); the ledger
(:mod:`.ledger`) prints it by line and phase, and a plan over the bound stops a GPU launch before it trains
(:func:`.planner.check`). torchtitan's memory estimator (``scripts/estimate/estimation.py``) is the model for
this: fake process group, fake tensors, FSDP2, the tracker around a step.

What the plan does not see: the CUDA context and the caching allocator's fragmentation (the headroom), NCCL's
buffers, and anything a library allocates outside torch's dispatcher (vLLM's engine is its reservation).
Hand-written: which model, trainer and sizes a config means, and the ledger; the sharding, the steps' tensor
work and the measuring are accelerate's, TRL's, rag_lab's own losses and torch's.
"""
