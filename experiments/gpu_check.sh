#!/usr/bin/env bash
# make gpu-check: what the first GPU at hand checks (issue 72), within 8 minutes on one H100 (the deadlines add up to 480 s), each step under
# its own deadline so that what finished comes back:
#   (1) plan       the memory plan of one launch=fsdp step of SmolLM2 (python -m rag_lab.plan: no GPU needed)
#   (2) fsdp_step  that step itself: SmolLM2's cold start and one DAPO step under launch=fsdp (one process,
#                  FSDP2 through accelerate, bf16), generating on the sharded model; the launched process
#                  reports its torch.cuda.max_memory_allocated (launch/ranks/rank0.json), set beside (1)
#   (3) vllm       one rollout on TRL's colocated vLLM engine, one update, TRL's weight sync, the engine's
#                  weights against the model's (experiments/gpu_check_vllm.py), where vLLM imports
# (The gpu test set, SmolLM2's trainers on CUDA in bf16, is `make test-gpu`: minutes of its own.)
# Then experiments/gpu_check_page.py writes the results page (experiments/results/gpu_check.md) from $OUT, this
# run's table first and the page's earlier run under its History.
#
#   OUT=/tmp/gpu make gpu-check              # on a GPU machine with the project installed (make install-gpu)
#   OUT=$OUT PYTHON=python3 bash experiments/gpu_check.sh   # the lent device machine: wheels on PYTHONPATH
#                                                          # (experiments/results/gpu_suite.md: the wheel method)
#   SMOKE=1 OUT=/tmp/gpu bash experiments/gpu_check.sh   # the same plumbing on a CPU: the plan for real, the
#                                                      # step under launch=fsdp_cpu with the tiny LM, no vLLM
set -u
OUT=${OUT:?set OUT to a folder for the results}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10 RAG_LAB_CACHE=${RAG_LAB_CACHE:-$OUT/cache}
# dapo_synth starts from the default LM itself; SmolLM2 writes none of DAPO's tags zero-shot
# (smollm2_zero_shot.md), so the step starts from the cold start on the world teacher's dapo demonstrations
COLD=(+cold_start@experiment.cold_start=default experiment.cold_start.protocols=[dapo]
      'policy.cold_start=${experiment.cold_start}')
# one DAPO step of SmolLM2 on one GPU; the plan's open lengths are the synth world's, counted with SmolLM2's
# tokenizer (a passage at most 142 tokens, DAPO's first prompt about 250)
STEP=(experiment=dapo_synth "policy.stages=[1]" generator=smollm2 "${COLD[@]}" experiment.cold_start.max_steps=200
      policy.steps=1 policy.questions_per_step=4 launch=fsdp launch.config.num_processes=1
      launch.memory.prompt_tokens=256 launch.memory.passage_tokens=142)
if [ "${SMOKE:-0}" = 1 ]; then
  RUN=(experiment=dapo_synth "policy.stages=[1]" generator=tiny "${COLD[@]}" experiment.cold_start.limit=8
       experiment.cold_start.max_steps=2 policy.steps=1 policy.questions_per_step=2 policy.group_size=2
       policy.heldout.n=4 policy.heldout.every=1 eval.limit=4 launch=fsdp_cpu)
else
  RUN=("${STEP[@]}" policy.heldout.n=16 policy.heldout.every=1 eval.limit=32)
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
  # the GPU's memory as torch reports it: launch.memory.gpu_memory_gib (79.1 for an H100 80GB) should equal it
  "$PYTHON" -c 'import torch; torch.cuda.is_available() and print("total_memory_gib", round(torch.cuda.get_device_properties(0).total_memory / 2**30, 2))'
  nproc
  git rev-parse HEAD 2>/dev/null || true
} >"$OUT/env.txt" 2>&1
: >"$OUT/steps.tsv"
step plan 90 "$PYTHON" -m rag_lab.plan "${STEP[@]}" --markdown
step fsdp_step 240 "$PYTHON" -m rag_lab.run hydra.mode=RUN "hydra.run.dir=$OUT/fsdp_step" "${RUN[@]}"
if "$PYTHON" -c "import vllm" >/dev/null 2>&1 && [ "${SMOKE:-0}" != 1 ]; then
  step vllm 150 env OUT="$OUT" "$PYTHON" experiments/gpu_check_vllm.py
else
  printf 'vllm\tskipped (no vLLM)\t0\n' >>"$OUT/steps.tsv"
fi
# the results page leads with this run; the run it held before moves under its History (not for the smoke)
INTO=(--into experiments/results/gpu_check.md)
[ "${SMOKE:-0}" = 1 ] && INTO=()
"$PYTHON" experiments/gpu_check_page.py "$OUT" ${INTO[@]+"${INTO[@]}"}
