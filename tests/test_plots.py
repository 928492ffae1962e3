"""The comparison's figures (rag_lab/reporting/plots.py) on hand-made curves and tables: the held-out curves'
95% bands, their one y scale with the start and oracle lines, and the Pareto plot's labels kept apart."""

import itertools
import json
import math

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.text import Annotation

import rag_lab.reporting.plots as plots
from rag_lab.eval.stats import wilson_ci
from rag_lab.reporting.plots import band, curves_side_by_side, pareto, text_box


@pytest.fixture
def figures(monkeypatch):
    """The figures the plots save, kept open for the test to read."""
    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, stem: saved.append(fig))
    return saved


def test_the_band_is_the_wilson_interval_of_the_right_answers():
    """32 right of 64, by hand: p = 0.5, z = 1.95996, z²/n = 0.060023; centre (p + z²/2n) / (1 + z²/n) = 0.5,
    half-width z / (1 + z²/n) * sqrt(p(1 − p)/n + z²/4n²) = 1.848983 * sqrt(0.00390625 + 0.00023447)
    = 0.118979."""
    assert wilson_ci(32, 64) == pytest.approx((0.5 - 0.118979, 0.5 + 0.118979), abs=1e-6)
    assert band([(0, 0.5, 64)])[0] == pytest.approx((38.1021, 61.8979), abs=1e-4)
    # 0 of 64: the interval starts at 0 and is not empty (the normal approximation's would be [0, 0])
    low, high = wilson_ci(0, 64)
    assert low == 0.0 and high == pytest.approx(1.95996**2 / (64 + 1.95996**2), abs=1e-6)
    assert all(math.isnan(v) for v in band([(2, 0.5, None)])[0])  # n not known: no band


def write_log(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_curves_share_one_scale_between_the_start_and_the_oracle(tmp_path, figures):
    """dapo's held-out Acc (64 questions per point), evorag's dev EM (no n), stoprag's loss: the two % panels
    share one y range, from the lowest start (evorag_start, 10%) to the oracle (70%), each with its start's
    and the oracle's line; dapo's points have their Wilson bands; the loss keeps its own scale."""
    logs = {
        "dapo": write_log(
            tmp_path / "d.jsonl",
            [
                {"step": 0, "heldout/acc": 0.5, "heldout/n": 64},
                {"step": 2, "heldout/acc": 0.25, "heldout/n": 64},
            ],
        ),
        "evorag": write_log(tmp_path / "e.jsonl", [{"step": 0, "dev_em": 0.2}, {"step": 4, "dev_em": 0.3}]),
        "stoprag": write_log(tmp_path / "s.jsonl", [{"step": 1, "loss": 3.0}, {"step": 2, "loss": 2.0}]),
    }
    starts = {"dapo": ("dapo_start", 20.0), "evorag": ("evorag_start", 10.0)}
    drawn = curves_side_by_side(logs, tmp_path / "curves", "t", starts, ("oracle_rag", 70.0))
    assert drawn == ["dapo", "evorag", "stoprag"]
    dapo, evorag, stoprag = figures[0].axes[:3]
    # every value drawn lies in [10, 70]: the limits are those with 5% of the 60-point span either side
    assert dapo.get_ylim() == evorag.get_ylim() == pytest.approx((7.0, 73.0))
    assert stoprag.get_ylim()[1] < 4  # the loss on its own scale
    for ax, start in ((dapo, "dapo_start"), (evorag, "evorag_start")):
        lines = {line.get_label(): set(line.get_ydata()) for line in ax.get_lines()}
        assert lines[f"start: {start}, test Acc"] == {starts[ax.get_title()][1]}
        assert lines["oracle_rag, test Acc"] == {70.0}
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert f"start: {start}, test Acc" in legend and "oracle_rag, test Acc" in legend
    (bands,) = [c for c in dapo.collections if isinstance(c, PolyCollection)]
    at_zero = [y for x, y in bands.get_paths()[0].vertices if x == 0]
    assert (min(at_zero), max(at_zero)) == pytest.approx(tuple(100 * v for v in wilson_ci(32, 64)))
    assert not [c for c in evorag.collections if isinstance(c, PolyCollection)]  # no n: no band


def boxes_overlap(fig) -> list[tuple[str, str]]:
    """The pairs of labels whose boxes overlap, drawn on an Agg canvas (a closed figure has none)."""
    renderer = FigureCanvasAgg(fig).get_renderer()
    labels = [t for t in fig.axes[0].texts if isinstance(t, Annotation)]
    boxes = [(t.get_text(), text_box(t, renderer)) for t in labels]
    return [(a, b) for (a, box_a), (b, box_b) in itertools.combinations(boxes, 2) if box_a.overlaps(box_b)]


def test_pareto_labels_do_not_overlap_for_points_nearly_at_one_place(tmp_path, figures):
    """Eight rows at RC 2.40–2.47 and Acc 30.0–30.7 (make demo's cluster, tighter) beside direct at (0, 5),
    with make demo's intervals: every label drawn once, pointing at its own row, no two label boxes
    overlapping, at the figure's dpi and at the png's."""
    rows = [{"method": "direct", "retrieval_count": 0.0, "acc": 5.0}]
    rows += [
        {"method": f"row{i}", "retrieval_count": 2.4 + 0.01 * i, "acc": 30.0 + 0.1 * i} for i in range(8)
    ]
    table = pd.DataFrame(rows)
    for key, spread in (("retrieval_count", 0.3), ("acc", 6.0)):
        table[f"{key}_low"], table[f"{key}_high"] = table[key] - spread, table[key] + spread
    pareto(table, tmp_path / "pareto", "t")
    (fig,) = figures
    labels = {t.get_text(): t.xy for t in fig.axes[0].texts if isinstance(t, Annotation)}
    assert labels == {r["method"]: pytest.approx((r["retrieval_count"], r["acc"])) for r in rows}
    assert boxes_overlap(fig) == []
    fig.set_dpi(130)  # plots._save's dpi: the offsets are in points, the boxes scale with the text
    assert boxes_overlap(fig) == []
