"""Benchmark the scoring CLI: 10,000 predictions scored with MuSiQue's official rules.

python experiments/bench_score.py      # writes experiments/results/bench_score.md
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import publish

N = 10_000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        gold, preds = Path(tmp) / "gold.jsonl", Path(tmp) / "preds.jsonl"
        with open(gold, "w") as g, open(preds, "w") as p:
            for i in range(N):
                row = {
                    "id": f"2hop__{i}",
                    "question": f"Question {i}?",
                    "answer": f"Answer {i % 97}",
                    "answer_aliases": [f"Alias {i}"],
                    "answerable": True,
                    "question_decomposition": [],
                    "paragraphs": [
                        {"idx": 0, "title": f"T{i}", "paragraph_text": f"Text {i}.", "is_supporting": True}
                    ],
                }
                g.write(json.dumps(row) + "\n")
                p.write(json.dumps({"id": row["id"], "prediction": f"answer {i % 89}"}) + "\n")
        cmd = [
            sys.executable,
            "-m",
            "rag_lab.score",
            "data=musique",
            f"data.path={gold}",
            f"predictions={preds}",
        ]
        t0 = time.perf_counter()
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        seconds = time.perf_counter() - t0
    body = (
        f"{N} predictions (MuSiQue rules) scored by the CLI in {seconds:.2f} s "
        f"(process start included); EM {out['em']:.4f}, F1 {out['f1']:.4f}"
    )
    publish("bench_score", body, lm="none (scoring only)")


if __name__ == "__main__":
    main()
