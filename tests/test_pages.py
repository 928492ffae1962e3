"""Results pages that lead with today (rag_lab/reporting/pages.py, issue 73): a bench page written twice opens
with the second run's table and its stamp, the first run under History; the History entry's headings go two
levels down, code blocks kept; and every committed page of experiments/results/ opens with its current
table, stamped with the commit, date, machine and the command that remakes it."""

import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from rag_lab.claims import render
from rag_lab.reporting import pages
from rag_lab.reporting.claims_page import claims_page, reading

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
sys.path.insert(0, str(ROOT / "experiments"))
import benchlib  # noqa: E402
import gpu_check_page  # noqa: E402


def _first_table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_a_bench_page_written_twice_leads_with_the_second_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(benchlib, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", [str(ROOT / "experiments" / "bench_x.py"), "--n", "2"])
    for run in (1, 2, 3):
        benchlib.publish(
            "bench_x", f"run {run}, 2 questions\n\n| n | s |\n|---|---|\n| 2 | {run}.5 |\n\npeak", "none"
        )
    page = (tmp_path / "bench_x.md").read_text()
    current, history = page.split("\n## History\n")
    stamp = pages.here("python experiments/bench_x.py --n 2", ROOT).line()
    table = "| n | s |\n|---|---|\n| 2 | {}.5 |"
    assert current == f"# bench_x\n\nrun 3, 2 questions\n\n{table.format(3)}\n\n{stamp}\n\nLM: none\n\npeak\n"
    assert _first_table(page) == ["| n | s |", "|---|---|", "| 2 | 3.5 |"]
    # the earlier runs, newest first, each under its own stamp
    entry = f"### {pages.stamp_of(stamp).heading()}\n\nrun {{}}, 2 questions\n\n{table}"
    assert history.index(entry.format(2, 2)) < history.index(entry.format(1, 1))
    assert history.startswith(f"\n{pages.HISTORY_LEAD}\n\n") and page.count("## History") == 1
    assert "# bench_x\n\nrun 3" in capsys.readouterr().out


def test_the_gpu_check_page_leads_with_the_latest_run(tmp_path):
    """make gpu-check's page (experiments/gpu_check_page.py --into): the latest run's step table first, the
    stamp naming the GPU torch saw under it, the run before under History."""
    out, page = tmp_path / "out", tmp_path / "gpu_check.md"
    out.mkdir()
    (out / "env.txt").write_text(
        "Mon Dec  7 04:30:00 UTC 2026\ntorch 2.13.0 cuda NVIDIA H100 80GB HBM3\n16\n"
    )
    for seconds in (58, 61):
        (out / "steps.tsv").write_text(f"plan\t0\t{seconds}\nfsdp_step\t124\t240\n")
        gpu_check_page.main(out, page)
    current, history = page.read_text().split(f"\n{pages.HISTORY}\n")
    assert _first_table(current) == [
        "| step | status | s |",
        "|---|---|---|",
        "| plan | ok | 61 |",
        "| fsdp_step | exit 124 (deadline) | 240 |",
    ]
    found = pages.stamp_of(current)
    assert found.machine.endswith(", NVIDIA H100 80GB HBM3") and found.command == "`make gpu-check`"
    assert "| plan | ok | 58 |" in history and "| plan | ok | 61 |" not in history


def test_history_entries_go_two_levels_down_code_blocks_kept_and_named_sections_dropped():
    old = "# Page\n\n| a |\n|---|\n\n## Notes\n\n```bash\n# a comment\n```\n\n## Regenerated\n\nx\n\n"
    old += "## Kept\n\ny\n"
    page = pages.publish(old, "# Page\n\n| b |\n|---|\n", drop=("Regenerated",))
    assert page == (
        f"# Page\n\n| b |\n|---|\n\n{pages.HISTORY}\n\n{pages.HISTORY_LEAD}\n\n### The page before stamps\n\n"
        "| a |\n|---|\n\n#### Notes\n\n```bash\n# a comment\n```\n\n#### Kept\n\ny\n"
    )
    # a first page: no History yet; a stamp goes under the first table, or last where there is none
    assert pages.publish(None, "# Page\n\nx\n") == "# Page\n\nx\n"
    assert pages.after_first_table("a\n| t |\n| 1 |\nb", "S") == "a\n| t |\n| 1 |\n\nS\n\nb\n"
    assert pages.after_first_table("a", "S") == "a\n\nS\n"


def test_the_claims_page_is_what_its_writer_writes_for_its_own_table():
    """claims.md rewritten from its own claims.csv and stamp is the same page: the table, the stamp and the
    reading where the writer puts them, the notes by hand and the History around them."""
    page = (RESULTS / "claims.md").read_text()
    table = pd.read_csv(RESULTS / "claims.csv")
    assert claims_page(page, render(table), pages.stamp_of(page), reading(table)) == page


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.md")), ids=lambda p: p.name)
def test_every_results_page_opens_with_its_current_table_and_its_stamp(path):
    current, _ = pages.split(path.read_text())
    lines = current.splitlines()
    assert lines[0].startswith("# "), "a title first"
    stamp = next((i for i, line in enumerate(lines) if pages.STAMP.match(line)), None)
    assert stamp is not None, "no stamp line (**Measured** at commit `...` on ... · machine · remake: ...)"
    tables = [i for i, line in enumerate(lines) if line.startswith("|")]
    assert not tables or tables[0] < stamp, "the stamp stands under the page's first table"
    assert not [line for line in lines[:stamp] if line.startswith("## ")], (
        "a section before the current table"
    )
    found = pages.stamp_of(current)
    assert re.fullmatch(r"[0-9a-f]{7,}( .*)?", found.commit) and "`" in found.command
