"""The results page of ``make gpu-check`` (experiments/gpu_check.sh) from its output folder: the machine,
each step's exit status and seconds, the memory plan's prediction for SmolLM2's ``launch=fsdp`` step beside
what the step's launched process allocated at most (``torch.cuda.max_memory_allocated``, from its rank
report), and the vLLM rollout's checks, the stamp (commit, date, machine, ``make gpu-check``) under its
step table. Writes OUT/gpu_check.md and, with ``--into``, that results page with this run leading and the
run it held before under its History (rag_lab/reporting/pages.py; gpu_check.sh writes
experiments/results/gpu_check.md so on a GPU machine).

    python experiments/gpu_check_page.py OUT [--into experiments/results/gpu_check.md]
"""

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # rag_lab's stdlib-only page layout, where the package is not installed
from rag_lab.reporting import pages  # noqa: E402

GIB = 2**30


def tail(path: Path, lines: int = 1) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(text[-lines:]) if text else "(no output)"


def predicted(out: Path) -> float | None:
    """The plan's peak a GPU in GiB (its headline: "... peak 9.63 GiB a GPU in the ... phase ...")."""
    found = re.search(r"peak ([0-9.]+) GiB a GPU", tail(out / "plan.log", 200))
    return float(found.group(1)) if found else None


def measured(out: Path) -> float | None:
    """The step's launched process's ``max_memory_allocated`` in GiB (None: no GPU, or no report)."""
    reports = sorted((out / "fsdp_step").glob("**/ranks/rank0.json"))
    report = json.loads(reports[-1].read_text()) if reports else {}
    peak = report.get("max_memory_allocated")
    return peak / GIB if peak is not None else None


def gib(value: float | None, missing: str) -> str:
    return f"{value:.2f} GiB" if value is not None else missing


def memory_lines(out: Path) -> list[str]:
    plan, seen = predicted(out), measured(out)
    head = (
        "**The plan against the GPU** (SmolLM2, one DAPO step under `launch=fsdp`, one process; the plan "
        "assumes every sequence at its longest, so the step should stay at or under it): predicted "
        f"{gib(plan, '(no plan: ' + tail(out / 'plan.log') + ')')}, measured {gib(seen, '(no measurement)')}"
    )
    if plan is not None and seen is not None:
        verdict = "within the plan" if seen <= plan else "OVER the plan"
        head += f": {seen / plan:.2f} of the prediction, {verdict}"
    lines = [head + "\n"]
    ledger = [x for x in tail(out / "plan.log", 200).splitlines() if x.startswith("|")]
    if ledger:
        lines += ["The plan's ledger (GiB a GPU):\n", *ledger, ""]
    return lines


def vllm_lines(out: Path) -> list[str]:
    path = out / "vllm_check.json"
    if not path.exists():
        return [f"**vLLM rollout and weight sync**: no result ({tail(out / 'vllm.log')})\n"]
    checks = json.loads(path.read_text()).get("checks", {})
    marks = ", ".join(f"{name}: {'ok' if ok else 'FAILED'}" for name, ok in checks.items())
    return [f"**vLLM rollout and weight sync** (experiments/gpu_check_vllm.py): {marks}\n"]


def stamp(out: Path) -> pages.Stamp:
    """This run's stamp: the checkout's commit, today, the machine with the GPU torch named (env.txt)."""
    env = tail(out / "env.txt", 6).splitlines()
    gpu = next(
        (line.split(" cuda ", 1)[1] for line in env if line.startswith("torch ") and " cuda " in line), ""
    )
    machine = pages.machine() + (f", {gpu}" if gpu not in ("", "False") else ", no GPU")
    return pages.Stamp(pages.commit(ROOT), time.strftime("%Y-%m-%d"), machine, "`make gpu-check`")


def main(out: Path, into: Path | None = None) -> str:
    steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines() if line.strip()]

    def status(rc: str) -> str:
        if not rc.isdigit():  # a step that did not run says why
            return rc
        return "ok" if rc == "0" else f"exit {rc}" + (" (deadline)" if rc == "124" else "")

    table = "\n".join(f"| {name} | {status(rc)} | {secs} |" for name, rc, secs in steps)
    lines = [
        f"# make gpu-check\n\n```\n{tail(out / 'env.txt', 6)}\n```\n",
        f"| step | status | s |\n|---|---|---|\n{table}\n",
        f"{stamp(out).line()}\n",
    ]
    lines += memory_lines(out) + vllm_lines(out)
    page = "\n".join(lines)
    (out / "gpu_check.md").write_text(page)
    if into is not None:
        into.write_text(pages.publish(into.read_text() if into.exists() else None, page))
    return page


if __name__ == "__main__":
    into = Path(sys.argv[3]) if sys.argv[2:3] == ["--into"] else None
    print(main(Path(sys.argv[1]), into))
