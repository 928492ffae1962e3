"""The comparison's figures (rag_lab/reporting/plots.py) on hand-made curves and tables: the held-out curves'
95% bands, their one y scale with each curve's own start line, the curves left out, and the Pareto plot's
labels kept apart."""

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


def curve(key: str, values: list[float], n: int | None = None, first_step: int = 0) -> list[dict]:
    """A training log's rows: ``key`` at steps first_step, first_step + 2, ..., each measured on ``n``."""
    return [
        {"step": first_step + 2 * i, key: v} | ({"heldout/n": n} if n else {}) for i, v in enumerate(values)
    ]


def test_each_curve_starts_at_its_own_first_point_on_one_scale(tmp_path, figures):
    """dapo's held-out Acc (64 questions a point), evorag's dev EM (no n), stoprag's loss, each at 4 steps:
    the two % panels share one y range (the values and the bands, 5% of their span either side), each with
    its start line at its own first point (the same questions), no line at a row's test Acc; the table's test
    Acc of the start row and the trained row title the panel; dapo's points have their Wilson bands; the loss
    keeps its own scale."""
    logs = {
        "dapo": write_log(tmp_path / "d.jsonl", curve("heldout/acc", [0.5, 0.25, 0.375, 0.5], n=64)),
        "evorag": write_log(tmp_path / "e.jsonl", curve("dev_em", [0.2, 0.3, 0.25, 0.1])),
        "stoprag": write_log(tmp_path / "s.jsonl", curve("loss", [3.0, 2.5, 2.0, 1.5], first_step=1)),
    }
    tests = {"dapo": ("dapo_start", 20.0, 15.0), "evorag": ("evorag_start", 10.0, 12.5)}
    drawn = curves_side_by_side(logs, tmp_path / "curves", "t", tests)
    assert drawn == ["dapo", "evorag", "stoprag"]
    dapo, evorag, stoprag = figures[0].axes[:3]
    # the lowest drawn: evorag's 10% (dapo's 25% point's band reaches 13.7), the highest: the top of dapo's
    # 50% points' bands (32 of 64)
    low, high = 10.0, 100 * wilson_ci(32, 64)[1]
    margin = 0.05 * (high - low)
    assert dapo.get_ylim() == evorag.get_ylim() == pytest.approx((low - margin, high + margin))
    assert stoprag.get_ylim()[1] < 4  # the loss on its own scale
    starts = {"dapo": ("start (step 0, 64 questions)", 50.0), "evorag": ("start (step 0)", 20.0)}
    for ax, method in ((dapo, "dapo"), (evorag, "evorag")):
        lines = {line.get_label(): set(line.get_ydata()) for line in ax.get_lines()}
        label, first = starts[method]
        assert lines[label] == {first} and len(lines) == 2  # the curve and its start, nothing else
        start, start_acc, acc = tests[method]
        assert ax.get_title() == f"{method}\ntest Acc: {start} {start_acc:.1f}, {method} {acc:.1f}"
    assert stoprag.get_title() == "stoprag"
    (bands,) = [c for c in dapo.collections if isinstance(c, PolyCollection)]
    at_zero = [y for x, y in bands.get_paths()[0].vertices if x == 0]
    assert (min(at_zero), max(at_zero)) == pytest.approx(tuple(100 * v for v in wilson_ci(32, 64)))
    assert not [c for c in evorag.collections if isinstance(c, PolyCollection)]  # no n: no band


def test_a_curve_of_too_few_steps_or_repeating_another_is_left_out_and_named(tmp_path, figures):
    """r3rag measured at 3 steps (fewer than 4), dapo_stage1 whose points are dapo's first three, r3rag_stop's
    the same as apex's (a stopper row reuses its method's model): only dapo and apex get a panel, and the
    figure says what it left out and why; a figure with no panel is not drawn."""
    acc = [0.1, 0.2, 0.3, 0.4, 0.5]
    logs = {
        "dapo_stage1": write_log(tmp_path / "d1.jsonl", curve("heldout/acc", acc[:3], n=64)),
        "dapo": write_log(tmp_path / "d.jsonl", curve("heldout/acc", acc, n=64)),
        "r3rag": write_log(tmp_path / "r.jsonl", curve("heldout/acc", acc[2:], n=64)),
        "apex": write_log(tmp_path / "a.jsonl", curve("heldout/acc", acc[1:], n=64)),
        "r3rag_stop": write_log(tmp_path / "s.jsonl", curve("heldout/acc", acc[1:], n=64)),
    }
    assert curves_side_by_side(logs, tmp_path / "curves", "t") == ["dapo", "apex"]
    fig = figures[0]
    (note,) = [t.get_text().replace("\n", " ") for t in fig.texts if t.get_text() != fig.get_suptitle()]
    assert note == (
        "left out: dapo_stage1 (the first points of dapo's); r3rag (3 steps measured, fewer than 4); "
        "r3rag_stop (the first points of apex's)"
    )
    figures.clear()
    assert curves_side_by_side({"r3rag": logs["r3rag"]}, tmp_path / "none", "t") == [] and not figures


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
