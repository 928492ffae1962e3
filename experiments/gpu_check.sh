#!/usr/bin/env bash
# make gpu-check: what a GPU machine checks in one go (issue 50), within ~8 minutes, each step under its own
# deadline so that what finished comes back: (1) the fast suite and the gpu set (`-m "not slow or gpu"`:
# SmolLM2's SFT / DPO / GRPO and the DAPO / APEX steps on CUDA in bf16), (2) bench_rollout with the tiny LM
# on the GPU (the batched engine against one question at a time, and its bound), (3) a short SmolLM2 run of
# a trained method with its held-out curve, (4) one FSDP step of it, (5) a vLLM rollout of it where vLLM
# imports. Then experiments/gpu_check_page.py writes the results page
# (experiments/results/gpu_check.md) from $OUT.
#
#   OUT=/tmp/gpu make gpu-check              # on a GPU machine with the project installed
#   OUT=$OUT PYTHON=python3 bash experiments/gpu_check.sh   # the lent device machine: wheels on PYTHONPATH
#                                                          # (experiments/results/gpu_suite.md: the wheel method)
#   SMOKE=1 OUT=/tmp/gpu bash experiments/gpu_check.sh   # the same plumbing at toy sizes, on a CPU
set -u
OUT=${OUT:?set OUT to a folder for the results}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10 RAG_LAB_CACHE=${RAG_LAB_CACHE:-$OUT/cache}
# dapo_synth starts from the default LM itself (no cold start, as the paper starts from an instruct model);
# SmolLM2 writes none of DAPO's tags zero-shot (smollm2_zero_shot.md), so this run gives it the cold start
# on the world teacher's dapo demonstrations (and the CPU smoke the same plumbing)
COLD=(+cold_start@experiment.cold_start=default experiment.cold_start.protocols=[dapo]
      'policy.cold_start=${experiment.cold_start}')
if [ "${SMOKE:-0}" = 1 ]; then
  # the tiny LM on the default world (its shipped checkpoint) for SmolLM2; no bench (it would rewrite the
  # CPU's page); the page stays in $OUT
  TESTS=(tests/test_launch.py) BENCH=()
  RUN=(generator=tiny "${COLD[@]}" experiment.cold_start.limit=8 experiment.cold_start.max_steps=2
       policy.steps=2 policy.questions_per_step=2 policy.group_size=2 policy.heldout.n=4 policy.heldout.every=1
       eval.limit=4)
else
  TESTS=() BENCH=(generator.device=cuda)
  RUN=(generator=smollm2 "${COLD[@]}" experiment.cold_start.max_steps=200 policy.steps=16 policy.questions_per_step=4
       policy.heldout.n=64 policy.heldout.every=4
       eval.limit=100)
fi
step() {  # step NAME DEADLINE COMMAND...: its output in NAME.log, its exit status and seconds in steps.tsv
  local name=$1 deadline=$2 start=$SECONDS
  shift 2
  timeout "$deadline" "$@" >"$OUT/$name.log" 2>&1
  printf '%s\t%s\t%s\n' "$name" "$?" "$((SECONDS - start))" >>"$OUT/steps.tsv"
}
{
  date -u
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name())'
  nproc
  git rev-parse HEAD 2>/dev/null || true
} >"$OUT/env.txt" 2>&1
: >"$OUT/steps.tsv"
step pytest 270 "$PYTHON" -m pytest -q -m "not slow or gpu" -n 8 -p no:cacheprovider "${TESTS[@]}"
if [ ${#BENCH[@]} -gt 0 ]; then
  step bench_rollout 90 "$PYTHON" experiments/bench_rollout.py "${BENCH[@]}"
  cp experiments/results/bench_rollout_cuda.md "$OUT/" 2>/dev/null || true
fi
# DAPO stage one from the cold start, its held-out Acc every 4 steps (checkpoints/train_log.jsonl)
step dapo_run 150 "$PYTHON" -m rag_lab.run +experiment=dapo_synth hydra.mode=RUN "policy.stages=[1]" \
  "hydra.run.dir=$OUT/dapo_run" "${RUN[@]}"
# (4) one sharded run (issue 66): the same DAPO stage, one step, under FSDP2 through accelerate (launch=fsdp
# with one process a GPU here; the CPU smoke runs launch=fsdp_cpu's two processes)
if [ "${SMOKE:-0}" = 1 ]; then SHARD=(launch=fsdp_cpu); else SHARD=(launch=fsdp launch.config.num_processes=1); fi
step fsdp_step 150 "$PYTHON" -m rag_lab.run +experiment=dapo_synth hydra.mode=RUN "policy.stages=[1]" \
  "hydra.run.dir=$OUT/fsdp_step" "${RUN[@]}" policy.steps=1 "${SHARD[@]}"
# (5) a vLLM rollout where vLLM imports: DAPO's step with its rollouts on TRL's colocated engine (SmolLM2's
# converted checkpoint, the folder generator=smollm2 made above)
if "$PYTHON" -c "import vllm" >/dev/null 2>&1 && [ "${SMOKE:-0}" != 1 ]; then
  MODEL=$("$PYTHON" -c "from rag_lab.generators.smollm2 import convert; import os; print(convert(os.environ['RAG_LAB_CACHE']))")
  step vllm_rollout 150 "$PYTHON" -m rag_lab.run +experiment=dapo_synth hydra.mode=RUN "policy.stages=[1]" \
    "hydra.run.dir=$OUT/vllm_rollout" "${RUN[@]}" policy.steps=1 generator=vllm "generator.model=$MODEL"
else
  printf 'vllm_rollout\tskipped (no vLLM)\t0\n' >>"$OUT/steps.tsv"
fi
"$PYTHON" experiments/gpu_check_page.py "$OUT"
[ "${SMOKE:-0}" = 1 ] || cp "$OUT/gpu_check.md" experiments/results/gpu_check.md
