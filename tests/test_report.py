"""``python -m rag_lab.report`` and ReportCallback on tiny fake run dirs (no model runs), the column
legend, the token count of generators that count none, and the config-group table (the docs reference's)."""

import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from rag_lab import CONF_DIR
from rag_lab.core.config import group_options
from rag_lab.data.base import QAExample
from rag_lab.env.episode import Episode, Step
from rag_lab.eval.evaluate import aggregate, score_record
from rag_lab.eval.metrics import SCORERS
from rag_lab.eval.table import DESCRIPTIONS, MISSING
from rag_lab.report import ReportCallback, build_table, compare, main
from rag_lab.reporting.docs import config_groups_table


def record(qid: str, kind: str, score: float, tokens: int | None = 10) -> dict:
    """The fields of a records.jsonl line that the report and ``aggregate`` read."""
    return {"id": qid, "type": kind, "em": score, "f1": score, "acc": score, "format_failure": False,
            "retrieval_count": 1, "n_steps": 2, "tokens_total": tokens}  # fmt: skip


def write_run(run: Path, overrides: list[str], records: list[dict], finished: bool = True) -> Path:
    """A Hydra run dir; ``finished=False`` is a job killed before it wrote metrics.json."""
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if finished:
        (run / "metrics.json").write_text(json.dumps(aggregate(records)))
    return run


def demo_sweep(sweep: Path, killed: bool = False) -> list[Path]:
    """generator x policy, like conf/experiment/demo.yaml; with ``killed``, job 3 never finished."""
    runs = []
    for i, (generator, policy) in enumerate([("tiny", "direct"), ("tiny", "fixed_iter"),
                                             ("teacher", "direct"), ("teacher", "fixed_iter")]):  # fmt: skip
        records = [record(f"q{j}", "bridge", float(j < i)) for j in range(4)]
        overrides = ["experiment=demo", f"generator={generator}", f"policy={policy}"]
        runs.append(write_run(sweep / str(i), overrides, records, finished=not (killed and i == 3)))
    return runs


def report(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``python -m rag_lab.report`` in-process: (exit status, stdout, stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def cells(markdown: str) -> list[list[str]]:
    """The cells of the first markdown table in ``markdown``: header first, the rule line dropped."""
    lines = [line for line in markdown.splitlines() if line.startswith("|") and not line.startswith("|:")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def callback_report(sweep: Path, **config) -> str:
    ReportCallback(columns=["N", "EM", "Tokens"]).on_multirun_end(
        OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, **config})
    )
    return (sweep / "report.md").read_text()


# 1. Runs without metrics.json are named, not silently dropped.
def test_runs_without_metrics_are_named_and_counted(tmp_path, capsys):
    demo_sweep(tmp_path, killed=True)
    code, out, err = report(capsys, str(tmp_path))
    assert code == 0
    assert f"notice: {tmp_path / '3'} has no metrics.json" in err
    assert f"3 runs (1 without metrics.json left out: {tmp_path / '3'})" in out

    text = callback_report(tmp_path)
    assert f"3 runs (1 without metrics.json left out: {tmp_path / '3'})" in text
    assert f"notice: {tmp_path / '3'} has no metrics.json" in capsys.readouterr().err


def test_a_sweep_where_every_run_finished_leaves_nothing_out(tmp_path, capsys):
    demo_sweep(tmp_path)
    code, out, err = report(capsys, str(tmp_path))
    assert code == 0 and "4 runs; subset all" in out and "left out" not in out and err == ""


def test_a_folder_with_a_sweep_inside_a_sweep_is_one_table_in_natural_order(tmp_path, capsys):
    # make demo's layout: outputs/demo/{0..10} and outputs/demo/stoprag/{0,1}: numbers and names side by side
    for name in ["10", "2", "stoprag/1", "stoprag/0"]:
        write_run(tmp_path / name, [f"job={name}"], [record("q0", "t", 1.0)])
    code, out, err = report(capsys, str(tmp_path))
    assert code == 0 and "Traceback" not in err, err
    assert [row[0] for row in cells(out)[1:]] == ["2", "10", "stoprag/0", "stoprag/1"]


# 2. --compare --subset pairs only the subset's question ids.
@pytest.fixture
def two_runs(tmp_path) -> tuple[Path, Path]:
    # Type a: A scores [1, 1, 0, 1], B [0, 1, 0, 0]; type b: A all 0, B all 1. a4 is answered by A only.
    a = [record(f"a{i}", "a", s) for i, s in enumerate([1, 1, 0, 1])] + [
        record(f"b{i}", "b", 0) for i in range(4)
    ]
    b = [record(f"a{i}", "a", s) for i, s in enumerate([0, 1, 0, 0])] + [
        record(f"b{i}", "b", 1) for i in range(4)
    ]
    run_a = write_run(tmp_path / "A", ["policy=a"], [*a, record("a4", "a", 1)])
    run_b = write_run(tmp_path / "B", ["policy=b"], b)
    return run_a, run_b


def test_compare_uses_only_the_subset_ids(two_runs, capsys):
    run_a, run_b = two_runs
    subset = compare(run_a, run_b, "type=a").set_index("metric").loc["em"]
    assert subset["n"] == 4 and subset["delta"] == pytest.approx(3 / 4 - 1 / 4)
    everything = compare(run_a, run_b).set_index("metric").loc["em"]
    assert everything["n"] == 8 and everything["delta"] == pytest.approx(3 / 8 - 5 / 8)

    code, out, _ = report(capsys, str(run_a), str(run_b), "--subset", "type=a", "--compare", "--out",
                          str(run_a.parent / "r.csv"))  # fmt: skip
    assert code == 0
    assert "paired bootstrap over the 4 question ids of subset type=a that both runs answered" in out


def test_two_rows_of_a_sweep_compare_over_their_seeds_pairing_seed_and_question(tmp_path, capsys):
    # rows x=a and x=b, seeds 0 and 1, questions q0..q2; a seed's q0 is right only in row a's seed 0:
    # pairs (seed, q): deltas q0: +1 (seed 0), 0 (seed 1); q1, q2: 0. Seed 1 of row b also answers q9.
    for value, seed, right in [("a", 0, {"q0"}), ("a", 1, set()), ("b", 0, set()), ("b", 1, set())]:
        extra = [record("q9", "t", 1)] if (value, seed) == ("b", 1) else []
        records = [record(f"q{j}", "t", float(f"q{j}" in right)) for j in range(3)] + extra
        write_run(tmp_path / f"{value}{seed}", [f"x={value}", f"seed={seed}"], records)
    code, out, _ = report(capsys, str(tmp_path), "--by", "x", "--compare", "a", "b")
    assert code == 0 and "row x=a (A) vs row x=b (B), pairs matched on seed and question id" in out
    (row,) = [r for r in cells(out[out.index("paired bootstrap") :])[1:] if r[2] == "em"]
    header = cells(out[out.index("paired bootstrap") :])[0]
    got = dict(zip(header, row, strict=True))
    assert (got["A"], got["B"], got["n"], got["pairs"]) == ("a", "b", "3", "6")
    assert got["delta"] == "0.1667" and got["seed_deltas"] == "+0.3333 / +0.0000"
    for argv, message in [
        (["--compare", "a", "b"], "--compare A B needs --by KEY"),
        (["--by", "x", "--compare"], "--compare A B needs --by KEY"),
        (["--by", "x", "--compare", "a", "c"], "no run with x=c (the runs have x: a, b)"),
    ]:
        code, _, err = report(capsys, str(tmp_path), *argv)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_rows_of_two_sweeps_compare_by_key_value(tmp_path, capsys):
    # sweep one names its rows x=..., sweep two y=...; x=a right on q0 in both seeds, y=b never
    for sweep, key, value, right in [("one", "x", "a", 1.0), ("two", "y", "b", 0.0)]:
        for seed in (0, 1):
            records = [record("q0", "t", right), record("q1", "t", 0.0)]
            write_run(tmp_path / sweep / str(seed), [f"{key}={value}", f"seed={seed}"], records)
    code, out, _ = report(capsys, str(tmp_path / "one"), str(tmp_path / "two"), "--compare", "x=a", "y=b")
    assert code == 0 and "row x=a (A) vs row y=b (B)" in out, out
    header, *rows = cells(out[out.index("paired bootstrap") :])
    got = [dict(zip(header, r, strict=True)) for r in rows if r[2] == "em"][0]
    assert (got["n"], got["pairs"], got["delta"], got["seed_deltas"]) == (
        "2",
        "4",
        "0.5",
        "+0.5000 / +0.5000",
    )
    code, _, err = report(capsys, str(tmp_path), "--compare", "x=a", "y=c")
    assert code == 1 and "no run with y=c (the runs have y: b)" in err and len(err.strip().splitlines()) == 1


def test_compare_tests_any_record_field_and_skips_the_pairs_without_a_score(tmp_path, capsys):
    # retrieval precision is NaN where nothing was retrieved: those pairs are left out, not averaged as 0
    for value, precisions in [("a", [1.0, 0.5, float("nan")]), ("b", [0.0, 0.5, 0.25])]:
        records = [record(f"q{j}", "t", 1.0) | {"ret_precision": p} for j, p in enumerate(precisions)]
        write_run(tmp_path / value, [f"x={value}", "seed=0"], records)
    code, out, _ = report(
        capsys, str(tmp_path), "--by", "x", "--compare", "a", "b", "--metrics", "ret_precision"
    )
    header, *rows = cells(out[out.index("paired bootstrap") :])
    (got,) = [dict(zip(header, r, strict=True)) for r in rows]
    assert (got["metric"], got["n"], got["delta"]) == ("ret_precision", "2", "0.5")
    code, _, err = report(capsys, str(tmp_path), "--by", "x", "--compare", "a", "b", "--metrics", "rc")
    assert (
        code == 1
        and "--metrics: no record has rc (fields: acc, " in err
        and len(err.strip().splitlines()) == 1
    )


# 3. --help explains the command; errors are one line.
def test_help_says_what_it_does_with_options_and_an_example(capsys):
    code, out, _ = report(capsys, "--help")
    assert code == 0
    assert "Fold runs into one table" in out and "--subset" in out and "--compare" in out
    assert "examples:\n  python -m rag_lab.report multirun/" in out
    assert f"  Ans R: {DESCRIPTIONS['Ans R']}" in out


@pytest.mark.parametrize(
    ("breakage", "args", "message"),
    [
        ("metrics", [], "A/metrics.json:1: not JSON"),
        ("none", ["--subset", "type=nope"], "A/metrics.json has no subset 'type=nope'"),
        ("records", ["--compare"], "A/records.jsonl:2: malformed record"),
        ("none", ["--columns", "EM", "Nope"], "no column Nope"),
    ],
)
def test_errors_are_one_line(two_runs, capsys, breakage, args, message):
    run_a, run_b = two_runs
    if breakage == "metrics":
        (run_a / "metrics.json").write_text('{"all": ')
    if breakage == "records":
        lines = (run_a / "records.jsonl").read_text().splitlines(keepends=True)
        (run_a / "records.jsonl").write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    code, _, err = report(capsys, str(run_a), str(run_b), "--out", str(run_a.parent / "r.csv"), *args)
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err


# 4. Where the csv goes: DIR/report.csv for one DIR, ./report.csv for several, --out wins.
def test_csv_goes_where_readme_and_help_say(two_runs, tmp_path, monkeypatch, capsys):
    run_a, run_b = two_runs
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    report(capsys, str(run_a))
    assert (run_a / "report.csv").exists()
    report(capsys, str(run_a), str(run_b))
    assert (cwd / "report.csv").read_text().count("\n") == 3  # header + 2 runs
    report(capsys, str(run_a), str(run_b), "--out", str(tmp_path / "x.csv"))
    assert (tmp_path / "x.csv").exists()
    page = (Path(__file__).resolve().parents[1] / "docs" / "concepts" / "runner.md").read_text()
    assert "./report.csv" in page and "DIR/report.csv" in page


# 5. report.md: a title, rows named by the varying overrides, a legend of every column shown.
def test_callback_report_has_a_title_override_labels_and_a_legend(tmp_path):
    runs = demo_sweep(tmp_path)
    text = callback_report(tmp_path, experiment={"name": "demo"})
    assert text.startswith("# demo\n\nCommon overrides: `experiment=demo`\n")
    columns, *rows = cells(text)
    assert columns == ["generator", "policy", "N", "EM", "Tokens", "run"]
    # The label people read comes first; the run dir stays, last.
    assert [row[:2] + row[-1:] for row in rows] == [
        ["tiny", "direct", str(runs[0])], ["tiny", "fixed_iter", str(runs[1])],
        ["teacher", "direct", str(runs[2])], ["teacher", "fixed_iter", str(runs[3])],
    ]  # fmt: skip
    for column in columns[2:]:
        assert f"- **{column}**: {DESCRIPTIONS[column]}" in text
    assert callback_report(tmp_path).startswith(f"# {tmp_path.name}\n")  # no experiment name


def test_every_column_of_the_demo_report_has_a_description():
    demo = yaml.safe_load((CONF_DIR / "experiment" / "demo.yaml").read_text())
    columns = demo["hydra"]["callbacks"]["report"]["columns"]
    assert [c for c in columns if c not in DESCRIPTIONS] == []


# 6. A generator that counts no tokens: null in records, None in metrics, "—" in the table.
@pytest.mark.parametrize(
    ("steps", "prompt", "completion", "expected"),
    [
        ([Step(text="Paris", action="answer")], 0, 0, None),  # the teacher: text, no token counts
        ([Step(text="Paris", action="answer")], 5, 2, 7),  # an LM
        ([Step(action="search", query="Paris")], 0, 0, 0),  # LM-free: no generation, truly 0 tokens
    ],
)
def test_tokens_are_missing_when_the_generator_counts_none(steps, prompt, completion, expected):
    ex = QAExample(id="q", question="Where?", answers=("Paris",))
    episode = Episode("q", "Where?", steps=steps, prediction="Paris", prompt_tokens=prompt,
                      completion_tokens=completion)  # fmt: skip
    assert score_record(ex, episode, "squad", corpus=None)["tokens_total"] == expected


def test_tokens_column_shows_missing_for_the_teacher(tmp_path):
    tiny = [record("q0", "x", 1, tokens=30), record("q1", "x", 1, tokens=10)]
    teacher = [record("q0", "x", 1, tokens=None), record("q1", "x", 1, tokens=None)]
    mixed, alone = tmp_path / "mixed", tmp_path / "alone"
    write_run(mixed / "0", ["generator=tiny"], tiny)
    write_run(mixed / "1", ["generator=teacher"], teacher)
    write_run(alone / "0", ["generator=teacher"], teacher)
    assert json.loads((mixed / "1" / "metrics.json").read_text())["all"]["tokens_total"] is None
    table, _ = build_table([mixed / "0", mixed / "1"])
    assert table["Tokens"].iloc[0] == (30 + 10) / 2
    _, tiny_row, teacher_row = cells(callback_report(mixed))
    assert tiny_row[:4] == ["tiny", "2", "100", "20"] and teacher_row[:4] == ["teacher", "2", "100", MISSING]
    # A sweep of the teacher alone keeps the column it asks for, all missing (not an error).
    header, teacher_row = cells(callback_report(alone))
    assert header[:4] == ["generator", "N", "EM", "Tokens"] and teacher_row[3] == MISSING


# 7. Acc is FlashRAG's character-substring rule, quirk included, for every scorer.
@pytest.mark.parametrize("scorer", sorted(SCORERS))
@pytest.mark.parametrize(
    ("prediction", "golds", "acc"),
    [("unknown", ["no"], 1.0), ("no", ["unknown"], 0.0), ("The Eiffel Tower.", ["eiffel tower"], 1.0)],
)
def test_acc_is_flashrags_substring_rule(scorer, prediction, golds, acc):
    assert SCORERS[scorer]["acc"](prediction, golds) == acc
    assert "'unknown'" in DESCRIPTIONS["Acc"] and "FlashRAG" in DESCRIPTIONS["Acc"]


# 8. The config-group table (the docs reference's) lists every option of every group.
def test_config_group_table_lists_every_option():
    table = config_groups_table()
    for group in ["data", "experiment", "generator", "policy"]:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{group}` "))
        assert all(f"`{option}`" in row for option in group_options(group)), group


def test_refusals_are_scored_against_the_unanswerable_questions(tmp_path, capsys):
    """EVO-RAG's columns: refusal recall (unanswerable refused) 1/2, precision (refusals of unanswerable
    questions) 1/3, the BACKTRACK count from the steps, and the two answerable subsets apart."""
    ex = QAExample("q", "Q?", ("Paris",))
    ep = Episode(
        "q",
        "Q?",
        prediction="",
        stop_reason="refuse",
        steps=[Step(action="backtrack"), Step(action="refuse")],
    )
    scored = score_record(ex, ep, "squad", corpus=None)
    assert (scored["backtracks"], scored["refused"]) == (1, 1.0)
    rows = [(False, 1.0), (False, 0.0), (True, 1.0), (True, 1.0), (True, 0.0)]
    records = [record(f"q{i}", "a", 0.0) | {"answerable": a, "refused": r} for i, (a, r) in enumerate(rows)]
    metrics = aggregate(records)
    assert metrics["all"]["refusal_recall"] == 1 / 2 and metrics["all"]["refusal_precision"] == 1 / 3
    assert metrics["answerable=false"]["n"] == 2 and metrics["answerable=true"]["refused"] == 2 / 3
    assert "refusal_recall" not in metrics["answerable=true"]  # no unanswerable question there
    a = write_run(tmp_path / "a", ["seed=0"], records)
    b = write_run(tmp_path / "b", ["seed=0"], [r | {"refused": 0.0} for r in records])
    delta = compare(a, b, "answerable=false", metrics=("refused",)).set_index("metric").loc["refused"]
    assert delta["n"] == 2 and delta["delta"] == pytest.approx(1 / 2)


def test_by_type_gives_one_column_per_question_type(tmp_path, capsys):
    """--by-type Acc: each run's accuracy over all its questions and over each type's, hand-counted."""
    write_run(
        tmp_path / "s" / "0",
        ["policy.reader=qa"],
        [record("q1", "single_hop", 1.0), record("q2", "single_hop", 0.0), record("q3", "3hop", 0.0)],
    )
    write_run(
        tmp_path / "s" / "1",
        ["policy.reader=cot"],
        [record("q1", "single_hop", 1.0), record("q2", "single_hop", 1.0), record("q3", "3hop", 1.0)],
    )
    rc, out, _ = report(capsys, str(tmp_path / "s"), "--by-type", "Acc")  # fmt: skip
    assert rc == 0
    rows = {r[0]: [float(c) for c in r[1:4]] for r in cells(out) if r[0] in ("qa", "cot")}
    assert rows["qa"] == [33.3, 0.0, 50.0]  # all, 3hop, single_hop
    assert rows["cot"] == [100.0, 100.0, 100.0]
    # its csv has a name of its own: the sweep's report.csv (the callback's) is not replaced
    assert (tmp_path / "s" / "report_by_type_Acc.csv").exists()
    assert not (tmp_path / "s" / "report.csv").exists()
