"""The evidence sweep's report (rag_lab/reporting/evidence.py, evidence_tables.py; issue 74) on hand-made
sweeps: each (row, condition) a run dir with its overrides, its config's corpus block and a few records."""

import json
import re

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from rag_lab.core.errors import RagLabError
from rag_lab.eval.stats import paired_bootstrap
from rag_lab.reporting import evidence_tables as ev
from rag_lab.reporting import pages
from rag_lab.reporting.evidence import (
    FIGURE,
    EvidenceCallback,
    Settings,
    gain_figure,
    settings_of,
    write_evidence,
    write_page,
)

from conftest import cli

LEVELS = {
    "cov100_d0": (1.0, 0),
    "cov80_d0": (0.8, 0),
    "cov60_d0": (0.6, 0),
    "cov100_d2": (1.0, 2),
    "cov80_d2": (0.8, 2),
    "cov60_d2": (0.6, 2),
    "random": (1.0, 0),
    "empty": (1.0, 0),
    "oracle": (1.0, 0),
}


def make_run(root, row, condition, seed, records):
    """Run dir ``row``/``condition``/``seed``: the overrides a sweep records, a config whose corpus block says
    the condition's level, ``records`` (dicts; ``id`` q0, q1, ... added) and metrics.json."""
    run = root / f"{row}-{condition}-{seed}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(
        f"- {ev.ROWS}={row}\n- {ev.CONDITIONS}={condition}\n- seed={seed}\n"
    )
    coverage, distractors = LEVELS[condition]
    config = {
        "corpus": {"coverage": coverage, "distractors": distractors},
        "seed": seed,
        "row": [row, condition],
    }
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    lines = [json.dumps({"id": f"q{i}"} | r) + "\n" for i, r in enumerate(records)]
    (run / "records.jsonl").write_text("".join(lines))
    (run / "metrics.json").write_text(json.dumps({"all": {"n": len(records)}}))
    (run / "provenance.json").write_text(json.dumps({"commit": "abcdef0123456789", "dirty": False}))
    return run


def records(right: int, n: int = 10, rc: float = 2.0, **fields):
    """``n`` records, the first ``right`` of them right (acc, em, f1); ``fields``: more, each a value or a
    list (one per question)."""
    out = [{"acc": float(i < right), "em": float(i < right), "f1": float(i < right), "retrieval_count": rc}
           for i in range(n)]  # fmt: skip
    for key, value in fields.items():
        for i, rec in enumerate(out):
            rec[key] = value[i] if isinstance(value, list) else value
    return out


def cells(root):
    return ev.read_cells(sorted(p for p in root.iterdir() if p.is_dir()))


def test_trained_minus_start_is_the_paired_bootstrap_over_questions_with_their_seeds(tmp_path):
    """apex and its start under the plain index, two seeds, 10 questions: the start right on q0-q3 in both
    seeds, apex on q0-q6 in seed 0 and q0-q7 in seed 1 (+30 and +40 points: +35, seed sd 7.07); q7-q9 are
    unreachable, and the own reward and searches split by it."""
    reachable = [True] * 7 + [False] * 3
    for seed, right in ((0, 7), (1, 8)):
        trained = records(right, reachable=reachable, own_reward=[0.5] * 7 + [0.1, 0.2, 0.9],
                          retrieval_count=[2.0] * 7 + [5.0] * 3)  # fmt: skip
        make_run(tmp_path, "apex", "cov100_d0", seed, trained)
        start = records(4, reachable=reachable, own_reward=[0.0] * 7 + [0.3] * 3,
                        retrieval_count=[1.0] * 7 + [4.0] * 3)  # fmt: skip
        make_run(tmp_path, "apex_start", "cov100_d0", seed, start)
    table = ev.gains(cells(tmp_path)).set_index(["condition", "method"])
    row = table.loc[("cov100_d0", "apex")]
    assert (row["start_acc"], row["acc"], row["s"]) == pytest.approx((40.0, 75.0, 35.0))
    assert row["seed_sd"] == pytest.approx(100 * np.std([0.3, 0.4], ddof=1))
    expected = paired_bootstrap(
        [float(i < 7) for i in range(10)] + [float(i < 8) for i in range(10)],
        [float(i < 4) for i in range(10)] * 2,
        questions=[f"q{i}" for i in range(10)] * 2,
        seeds=["0"] * 10 + ["1"] * 10,
    )
    assert (row["s_low"], row["s_high"], row["s_p"]) == pytest.approx(
        (100 * expected.ci_low, 100 * expected.ci_high, expected.p_value)
    )
    # seeds are not extra questions: the interval of 10 questions, not 20 pairs
    pooled = paired_bootstrap([float(i < 7) for i in range(10)] + [float(i < 8) for i in range(10)],
                              [float(i < 4) for i in range(10)] * 2)  # fmt: skip
    assert row["s_high"] - row["s_low"] > 100 * (pooled.ci_high - pooled.ci_low)
    assert row["reachable"] == pytest.approx(70.0)
    assert (row["reward_unreachable"], row["reward_reachable"]) == pytest.approx((0.4, 0.5))
    assert (row["start_reward_unreachable"], row["start_reward_reachable"]) == pytest.approx((0.3, 0.0))
    assert (row["rc_reachable"], row["rc_unreachable"]) == pytest.approx((2.0, 5.0))
    assert (row["start_rc_reachable"], row["start_rc_unreachable"]) == pytest.approx((1.0, 4.0))
    # every other method of the condition is a line of its own, its cells missing
    dapo = table.loc[("cov100_d0", "dapo")]
    assert dapo[["start_acc", "acc", "reachable", "reward_unreachable", "rc_reachable"]].isna().all()
    shown = ev.show_gains(ev.gains(cells(tmp_path)))
    apex = shown.set_index("method").loc["apex"]
    assert apex[ev.GAIN] == f"+35.0 [{100 * expected.ci_low:+.1f}, {100 * expected.ci_high:+.1f}]"
    assert apex["own reward, unreachable"] == "0.300 → 0.400" and apex["seed sd"] == "7.1"


def ranked_sweep(root):
    """The five methods' trained rows right on k of 10 questions: apex 5, r3rag 4, evorag 3, dapo 2, stoprag 1
    under the plain index and at 80% coverage; at 60% r3rag and apex change places, and so do dapo and
    stoprag (2 of the 10 pairs discordant: τ = (8 - 2) / 10 = 0.6)."""
    plain = {"apex": 5, "r3rag": 4, "evorag": 3, "dapo": 2, "stoprag": 1}
    swapped = {"r3rag": 5, "apex": 4, "evorag": 3, "stoprag": 2, "dapo": 1}
    for condition, rights in (("cov100_d0", plain), ("cov80_d0", plain), ("cov60_d0", swapped)):
        for method, right in rights.items():
            make_run(root, method, condition, 0, records(right))


def test_the_ranking_and_kendalls_tau_against_the_plain_index(tmp_path):
    ranked_sweep(tmp_path)
    table = ev.ranking(cells(tmp_path), list(ev.STARTS)).set_index("condition")
    assert list(table.index) == ["cov100_d0", "cov80_d0", "cov60_d0"]
    assert [table.loc["cov60_d0", str(i)] for i in range(1, 6)] == [
        "r3rag 50.0", "apex 40.0", "evorag 30.0", "stoprag 20.0", "dapo 10.0"
    ]  # fmt: skip
    assert table.loc["cov100_d0", "tau"] == pytest.approx(1.0)
    assert table.loc["cov80_d0", "tau"] == pytest.approx(1.0)
    assert table.loc["cov60_d0", "tau"] == pytest.approx(0.6)
    # the exact two-sided test of n = 5: 1 + 4 + 9 of the 120 orders have at most 2 discordant pairs
    # (τ ≥ 0.6), and as many τ ≤ -0.6
    assert table.loc["cov60_d0", "tau_p"] == pytest.approx(2 * 14 / 120)
    shown = ev.show_ranking(ev.ranking(cells(tmp_path), list(ev.STARTS))).set_index("condition")
    assert shown.loc["cov60_d0", "τ vs cov100_d0"] == "+0.60"


def test_kendall_needs_two_methods_in_common():
    assert ev.kendall({"a": 1.0}, {"a": 2.0, "b": 1.0}) is None
    assert ev.kendall({"a": 1.0, "b": 1.0}, {"a": 2.0, "b": 1.0}) is None  # one ranking all ties
    tau, _ = ev.kendall({"a": 3.0, "b": 2.0, "c": 1.0}, {"c": 9.0, "a": 3.0, "b": 1.0})
    # matched by name: pairs ab concordant, ac and bc discordant (c is last, then first): (1 - 2) / 3
    assert tau == pytest.approx(-1 / 3)


def test_missing_rows_and_conditions_are_dashes_not_a_traceback(tmp_path):
    """A sweep with one trained method in two conditions, its start in one, fixed T without a reward of its
    own, no control: every table is written, the missing cells —, the summary names what is missing."""
    make_run(tmp_path, "apex", "cov100_d0", 0, records(6, reachable=True, own_reward=1.0))
    make_run(tmp_path, "apex", "cov60_d2", 0, records(3, reachable=[True] * 5 + [False] * 5))
    make_run(tmp_path, "apex_start", "cov100_d0", 0, records(2, reachable=True, own_reward=0.0))
    make_run(tmp_path, "stoprag", "cov100_d0", 0, records(5, reachable=True, own_reward=0.7))
    make_run(tmp_path, "fixed_iter", "cov100_d0", 0, records(4, reachable=True, own_reward=None))
    make_run(tmp_path, "dapo", "oracle", 0, records(9))  # no reachable field (an older run): —
    write_evidence([tmp_path], Settings(), tmp_path)
    text = (tmp_path / "evidence.md").read_text()
    summary = "Not in the sweep (—): rows dapo_start, evorag, evorag_start, r3rag, r3rag_start; "
    assert summary + "conditions random, empty." in text
    main = rows_of(text, "condition", "method")
    # start, trained, trained − start, p, reachable, own reward (unreachable, reachable), RC (the same)
    assert main[("cov60_d2", "apex")][:7] == ["—", "30.0", "—", "—", "50.0", "—", "—"]
    assert (
        main[("cov100_d0", "stoprag")][:2] == ["40.0", "50.0"]
        and main[("cov100_d0", "stoprag")][6] == "— → 0.700"
    )
    assert main[("oracle", "dapo")] == ["—", "90.0"] + ["—"] * 7
    assert set(main[("cov60_d2", "r3rag")]) == {"—"}
    controls = rows_of(text, "row")
    assert controls[("fixed_iter",)] == ["40.0", "2.00"] + ["—"] * 6
    assert controls[("dapo",)] == ["—"] * 6 + ["90.0", "2.00"] and set(controls[("r3rag_start",)]) == {"—"}
    # one grid level with a single method: its τ against the plain index is —
    assert rows_of(text, "condition", "coverage")[("cov60_d2", "0.6")] == ["2", "apex 30.0", "—", "—", "—"]


def rows_of(text: str, *key: str) -> dict[tuple[str, ...], list[str]]:
    """The markdown table of ``text`` whose header starts with columns ``key``: its rows by those cells."""
    lines = text.splitlines()
    start = next(
        i
        for i, line in enumerate(lines)
        if [c.strip() for c in line.split("|")[1:-1]][: len(key)] == list(key)
    )
    out = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")[1:-1]]
        out[tuple(cells[: len(key)])] = cells[len(key) :]
    return out


def test_the_figure_draws_each_method_with_a_start_against_coverage(tmp_path):
    """apex beside its start at two coverages without distractors and one with two, and under a control
    (full coverage, no distractors in its config too): three points, no control among them."""
    ranked_sweep(tmp_path)
    for condition, right in (("cov100_d0", 1), ("cov60_d0", 1), ("cov100_d2", 0), ("oracle", 0)):
        make_run(tmp_path, "apex_start", condition, 0, records(right))
    for condition in ("cov100_d2", "oracle"):
        make_run(tmp_path, "apex", condition, 0, records(4))
    drawn = gain_figure(ev.gains(cells(tmp_path)), tmp_path / FIGURE, "T")
    assert sorted(zip(drawn["method"], drawn["coverage"], drawn["distractors"], drawn["s"], strict=True)) == [
        ("apex", 0.6, 0, 30.0), ("apex", 1.0, 0, 40.0), ("apex", 1.0, 2, 40.0)
    ]  # fmt: skip
    assert (tmp_path / f"{FIGURE}.png").stat().st_size > 0
    svg = (tmp_path / f"{FIGURE}.svg").read_text()
    # matplotlib writes each text as a comment beside its glyphs: both panels, apex's line and no other
    assert (
        "<!-- 0 distractors per gold passage -->" in svg and "<!-- 2 distractors per gold passage -->" in svg
    )
    assert "<!-- apex -->" in svg and "<!-- r3rag -->" not in svg
    write_evidence([tmp_path], Settings(), tmp_path)
    assert f"![trained − start against coverage]({FIGURE}.png)" in (tmp_path / "evidence.md").read_text()


def test_no_figure_without_a_trained_row_beside_its_start(tmp_path):
    ranked_sweep(tmp_path)
    _, drawn = write_evidence([tmp_path], Settings(), tmp_path)
    assert not drawn and not (tmp_path / f"{FIGURE}.png").exists()
    assert "## Gain against coverage" not in (tmp_path / "evidence.md").read_text()


def test_the_controls_beside_bm25(tmp_path):
    for condition, (trained, start, rc) in {
        "cov100_d0": (6, 3, 2.0), "random": (1, 1, 0.5), "empty": (0, 0, 4.0), "oracle": (9, 7, 1.0)
    }.items():  # fmt: skip
        make_run(tmp_path, "r3rag", condition, 0, records(trained, rc=rc))
        make_run(tmp_path, "r3rag_start", condition, 0, records(start, rc=rc + 1))
    table = ev.show_controls(ev.controls_table(cells(tmp_path))).set_index("row")
    assert list(table.loc["r3rag"]) == ["60.0", "2.00", "10.0", "0.50", "0.0", "4.00", "90.0", "1.00"]
    assert list(table.loc["r3rag_start"]) == ["30.0", "3.00", "10.0", "1.50", "0.0", "5.00", "70.0", "2.00"]
    assert list(table.columns[:4]) == ["BM25 Acc", "BM25 RC", "random Acc", "random RC"]
    # the controls are not levels of the grid, though their config says full coverage, no distractors
    assert "random" not in list(ev.ranking(cells(tmp_path), list(ev.STARTS))["condition"])


def _layout(page: str) -> pages.Stamp:
    """tests/test_pages.py's checks of a results page: title first, the current table, its stamp under it."""
    current, _ = pages.split(page)
    lines = current.splitlines()
    assert lines[0].startswith("# ")
    stamp = next(i for i, line in enumerate(lines) if pages.STAMP.match(line))
    tables = [i for i, line in enumerate(lines) if line.startswith("|")]
    assert tables[0] < stamp and not [line for line in lines[:stamp] if line.startswith("## ")]
    return pages.stamp_of(current)


def test_the_results_page_opens_with_the_table_its_stamp_and_the_figure(tmp_path):
    sweep, results = tmp_path / "sweep", tmp_path / "results"
    ranked_sweep(sweep)
    make_run(sweep, "apex_start", "cov100_d0", 0, records(1))
    page = results / "evidence_synth.md"
    first = write_page([sweep], Settings(), sweep, page, "make evidence", wall=3125)
    stamp = _layout(first)
    # it opens with the command, the runs' commit (their provenance.json) and the machine, then the table
    opening = first.splitlines()[2]
    assert opening == f"`make evidence` at commit `abcdef0` on {stamp.date} · {pages.machine()}, 52 min 5 s."
    assert stamp.commit == "abcdef0"
    # the checkout moved on during the sweep (one process, one code): the first run's commit to the last's
    moved = sweep / "apex_start-cov100_d0-0" / "provenance.json"
    kept = moved.read_text()
    moved.write_text(json.dumps({"commit": "1234567abc", "dirty": False, "started": "9"}))
    other = write_page([sweep], Settings(), sweep, results / "other.md", "m")
    assert other.splitlines()[2].startswith("`m` at commit `abcdef0 to 1234567`")
    moved.write_text(kept)
    assert stamp.command == "`make evidence`" and stamp.machine == pages.machine()
    assert (results / "evidence_synth.png").exists()
    lines = first.splitlines()
    at = next(i for i, line in enumerate(lines) if pages.STAMP.match(line))
    assert lines[at + 2 :][:3] == ["## Gain against coverage", "", lines[at + 4]]
    assert "![trained − start against coverage](evidence_synth.png)" in first
    assert first.index("## Ranking") < first.index("## Controls") < first.index("## Columns")
    assert "## History" not in first
    # the next run: its table leads, the first one under History, less the figure (overwritten)
    make_run(sweep, "apex", "oracle", 0, records(8))
    second = write_page([sweep], Settings(), sweep, page, "make evidence")
    current, history = pages.split(second)
    _layout(second)
    assert "| oracle " in current and "| oracle " not in history.split("#### Ranking")[0]
    assert history.startswith(f"### {stamp.heading()}") and "Gain against coverage" not in history


def test_the_callback_writes_into_the_sweep_dir_and_the_command_reads_its_settings(
    tmp_path, capfd, monkeypatch
):
    ranked_sweep(tmp_path)
    make_run(tmp_path, "stoprag_start", "cov100_d0", 0, records(0))
    callback = EvidenceCallback(starts={"stoprag": "stoprag_start"}, controls=["oracle"], title="T")
    callback.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    text = (tmp_path / "evidence.md").read_text()
    main = text[: text.index("## ")]
    assert text.startswith("# T\n") and "| stoprag  | 0.0     | 10.0" in main and "| apex " not in main
    # the command: the callback's settings from the sweep's multirun.yaml
    spec = {"_target_": "rag_lab.reporting.evidence.EvidenceCallback", "starts": {"apex": "stoprag"},
            "title": "${data.name}"}  # fmt: skip
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"callbacks": {"evidence": spec}}}))
    assert settings_of(tmp_path) == Settings(starts={"apex": "stoprag"})
    rc, out = cli("reporting.evidence", [str(tmp_path)], capfd, monkeypatch)
    assert rc == 0 and "| apex     | 10.0    | 50.0" in out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"starts": ["apex"]}, "starts: expected {trained row: its start row}, got ['apex']"),
        ({"controls": "random"}, "controls: expected a list of conditions, got random"),
        ({"controls": ["cov100_d0"]}, "reference cov100_d0: a control too (controls: cov100_d0)"),
    ],
)
def test_bad_settings_are_one_line_naming_the_setting(kwargs, message):
    with pytest.raises(RagLabError, match="^" + re.escape(message) + "$"):
        EvidenceCallback(**kwargs)


def test_a_sweep_without_the_overrides_is_one_line(tmp_path, capfd, monkeypatch):
    run = make_run(tmp_path, "apex", "cov100_d0", 0, records(1))
    (run / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    rc, out = cli("reporting.evidence", [str(tmp_path)], capfd, monkeypatch)
    assert rc != 0 and "no run has both overrides experiment/evidence_synth and experiment/evidence" in out
    assert "Traceback" not in out


def test_make_evidences_callback_names_the_sweeps_rows_and_conditions():
    """experiment=evidence_synth's callback as Hydra builds it: every row it pairs and every condition it
    names is one the sweep runs, and every trained row of the sweep has its start."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from rag_lab.core.config import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", ["experiment=evidence_synth"], return_hydra_config=True)
    settings = instantiate(cfg.hydra.callbacks.evidence).settings
    params = cfg.hydra.sweeper.params
    rows = params[settings.rows].split(",")
    conditions = params[settings.conditions].split(",")
    assert sorted(r for pair in settings.starts.items() for r in pair) == sorted(rows)
    assert {settings.reference, *settings.controls} <= set(conditions)
    assert settings.controls == ("random", "empty", "oracle") and settings.reference == "cov100_d0"


@pytest.mark.parametrize(
    ("condition", "retriever"),
    [("cov60_d2", "bm25.BM25Retriever"), ("random", "controls.RandomRetriever"),
     ("empty", "controls.EmptyRetriever"), ("oracle", "controls.OracleRetriever")],
)  # fmt: skip
def test_each_condition_of_make_evidence_composes_its_own_retriever(condition, retriever):
    """A control's retriever reaches its runs (an `override /retriever` in the experiment's own file would win
    over the condition's, and eval.reuse would then copy the BM25 run's results into the control's dir)."""
    from hydra import compose, initialize_config_dir

    from rag_lab.core.config import CONF_DIR

    overrides = [
        "experiment=evidence_synth",
        f"experiment/evidence={condition}",
        "experiment/evidence_synth=apex",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides)
    assert cfg.retriever._target_ == f"rag_lab.retrievers.{retriever}"
    assert (cfg.corpus.coverage, cfg.corpus.distractors) == (
        (0.6, 2) if condition == "cov60_d2" else (1.0, 0)
    )


def test_the_page_lists_each_cells_row_hash_and_the_lm(tmp_path):
    """The provenance section: the row hash each cell's runs recorded, conditions down and rows across, two
    seeds of a row one hash; the LM fingerprints and the hashes' versions named; no section without hashes."""
    sweep = tmp_path / "sweep"
    for row, condition, seed in (("apex", "cov100_d0", 0), ("apex", "cov100_d0", 1), ("apex", "cov60_d0", 0),
                                 ("dapo", "cov100_d0", 0)):  # fmt: skip
        run = make_run(sweep, row, condition, seed, records(2))
        prov = {"commit": "abcdef0", "row_config": f"{row}-{condition}", "lm": "tiny_lm@00ff"}
        (run / "provenance.json").write_text(json.dumps(prov | ({"row_hash_version": 2} if seed else {})))
    text = write_page([sweep], Settings(), sweep, tmp_path / "page.md", "make evidence")
    section = text[text.index("## Provenance") :]
    assert "of versions 1, 2); the runs' LM: `tiny_lm@00ff`." in section
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert re.split(r"\s*\|\s*", table[0])[1:-1] == ["condition", "apex", "dapo"]
    assert re.split(r"\s*\|\s*", table[2])[1:-1] == ["cov100_d0", "apex-cov100_d0", "dapo-cov100_d0"]
    assert re.split(r"\s*\|\s*", table[3])[1:-1] == ["cov60_d0", "apex-cov60_d0", "—"]
    for path in sweep.glob("*/provenance.json"):
        path.write_text(json.dumps({"commit": "abcdef0"}))
    assert "## Provenance" not in write_page([sweep], Settings(), sweep, tmp_path / "new.md", "m")
