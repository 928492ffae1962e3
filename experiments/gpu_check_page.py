"""The results page of ``make gpu-check`` (experiments/gpu_check.sh) from its output folder: the machine,
each step's exit status and seconds, the suite's counts, bench_rollout's ratio and bound, the trained run's
held-out curve (first and last point) and its metrics. Writes OUT/gpu_check.md (gpu_check.sh copies it to
experiments/results/ on a GPU machine).

    python experiments/gpu_check_page.py OUT
"""

import json
import re
import sys
from pathlib import Path


def tail(path: Path, lines: int = 1) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(text[-lines:]) if text else "(no output)"


def main(out: Path) -> str:
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines() if line.strip()]

    def status(rc: str) -> str:
        if not rc.isdigit():  # a step that did not run says why
            return rc
        return "ok" if rc == "0" else f"exit {rc}" + (" (deadline)" if rc == "124" else "")

    table = "\n".join(f"| {name} | {status(rc)} | {secs} |" for name, rc, secs in steps)
    lines = [f"# make gpu-check\n\n```\n{tail(out / 'env.txt', 5)}\n```\n",
             f"| step | status | s |\n|---|---|---|\n{table}\n",
             f"**Suite** (`-m \"not slow or gpu\"`): {tail(out / 'pytest.log')}\n"]  # fmt: skip
    bench = out / "bench_rollout_cuda.md"
    found = re.findall(r"\*\*([0-9.]+)x\*\*", bench.read_text()) if bench.exists() else []
    if len(found) == 2:
        lines.append(f"**bench_rollout on the GPU**: batched {found[0]}x one question at a time (bound "
                     f"{found[1]}x; the goal: 8x); its page: bench_rollout_cuda.md\n")  # fmt: skip
    else:
        lines.append(f"**bench_rollout on the GPU**: no result ({tail(out / 'bench_rollout.log')})\n")
    log = out / "dapo_run" / "checkpoints" / "train_log.jsonl"
    curve = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    curve = [(r["step"], r["heldout/acc"]) for r in curve if "heldout/acc" in r]
    metrics = out / "dapo_run" / "metrics.json"
    if curve:
        points = ", ".join(f"{s}: {100 * a:.1f}" for s, a in curve)
        verdict = "rises" if curve[-1][1] > curve[0][1] else "does not rise"
        lines.append(f"**DAPO stage one** (the trained run): held-out Acc by step {points}: {verdict}\n")
    else:
        lines.append(f"**DAPO stage one**: no held-out curve ({tail(out / 'dapo_run.log')})\n")
    if metrics.exists():
        acc = json.loads(metrics.read_text())["all"].get("acc")
        lines.append(f"test Acc after training: {acc}\n")
    page = "\n".join(lines)
    (out / "gpu_check.md").write_text(page)
    return page


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
