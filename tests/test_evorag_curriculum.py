"""EVO-RAG's curriculum bookkeeping (rag_lab/policies/evorag/curriculum.py), the cycles faked: a stage runs
cycles until dev EM stalls, each from the one before, reuses a cached cycle, hands over its best (the
earliest of ties) with that cycle's preference heads, and the training curve numbers steps across cycles
and stages."""

import json
from types import SimpleNamespace

import pytest

from rag_lab.policies.evorag import curriculum as cur


class Model:
    def __init__(self, name):
        self.name = name


class Generator:
    def __init__(self, model):
        self.model = model

    def with_model(self, model):
        return Generator(model)


class Heads:
    def __init__(self):
        self.loaded = []

    def load_state_dict(self, state):
        self.loaded.append(state)


@pytest.fixture
def faked(monkeypatch, tmp_path):
    """run_cycle writes a cycle.json with the next scripted dev EM; weights are their cycle's name."""
    ran, ems = [], []

    def run_cycle(policy, generator, env, stage, cycle, questions, dev, pm, done):
        assert (policy.tag, env, questions, dev, pm.tag) == ("policy", "env", "train", "dev", "pm")
        ran.append((stage, cycle, generator.model.name))
        done.mkdir(parents=True)
        (done / "cycle.json").write_text(json.dumps({"dev_em": ems[len(ran) - 1], "pairs": 3}))

    def load_model(path, like):
        assert isinstance(like, Model)  # the running generator's model, for its architecture
        return Model(path.name)

    monkeypatch.setattr(cur, "run_cycle", run_cycle)
    monkeypatch.setattr(
        cur, "readable", lambda done, what: done if what.startswith("EVO-RAG cycle") else None
    )
    monkeypatch.setattr(cur, "load_model", load_model)
    monkeypatch.setattr(cur, "load_torch", lambda path: f"{path.parent.name}/{path.name}")
    return ran, ems, tmp_path


STARTS = []  # the cycle each cycle starts from: its cache key is made from it


def policy(**settings):
    def cycle_dir(previous, stage, cycle, questions, dev, env, root):
        assert (questions, dev, env) == ("train", "dev", "env")
        STARTS.append(previous)
        return root / f"s{stage}c{cycle}"

    defaults = {"max_cycles": 6, "patience": 2, "min_delta": 0.0, "tag": "policy"}
    return SimpleNamespace(**(defaults | settings), cycle_dir=cycle_dir)


def stage(faked, ems, start_em=0.10, **settings):
    ran, scripted, root = faked
    scripted[:] = ems
    pm = SimpleNamespace(heads=Heads(), tag="pm")
    STARTS.clear()
    result = cur.run_stage(
        policy(**settings), Generator(Model("start")), "env", 1, "start", start_em, "train", "dev", pm, root
    )
    return result, pm, ran


def test_a_stage_stops_when_dev_em_stalls_and_hands_over_its_best_cycle(faked):
    result, pm, ran = stage(faked, [0.12, 0.15, 0.14, 0.13, 0.20, 0.20])
    # 0.15 is not beaten by the next two cycles: four cycles ran, each from the one before
    assert ran == [(1, 1, "start"), (1, 2, "s1c1"), (1, 3, "s1c2"), (1, 4, "s1c3")]
    assert result.chosen.name == "s1c2" and [s["dev_em"] for s in result.summaries] == [
        0.12,
        0.15,
        0.14,
        0.13,
    ]
    # each cycle's heads were loaded in turn, and the chosen cycle's last
    assert pm.heads.loaded == ["s1c1/pm.pt", "s1c2/pm.pt", "s1c3/pm.pt", "s1c4/pm.pt", "s1c2/pm.pt"]
    assert STARTS == ["start", "s1c1", "s1c2", "s1c3"]


def test_the_stall_rule_by_default():
    assert cur.stalled([0.10, 0.12, 0.12, 0.11]) and not cur.stalled([0.10, 0.12, 0.11, 0.13])
    assert not cur.stalled([0.10, 0.09]) and cur.best([0.1, 0.3, 0.3, 0.2]) == 1


def test_ties_the_margin_the_patience_the_budget_and_a_cached_cycle(faked):
    ran, _, root = faked
    result, _, _ = stage(faked, [0.12, 0.12, 0.12])
    assert result.chosen.name == "s1c1" and len(ran) == 3  # the earliest of ties; 0.12 then two not above
    ran.clear()
    # the run above left cycles 1-3 cached: they are reused, and a gain of 0.01 within min_delta 0.02 stalls
    for name, em in (("s1c1", 0.11), ("s1c2", 0.12), ("s1c3", 0.125)):
        (root / name / "cycle.json").write_text(json.dumps({"dev_em": em}))
    result, _, _ = stage(faked, [], start_em=0.10, min_delta=0.02)
    assert ran == [] and len(result.cycles) == 2
    result, _, _ = stage(faked, [], start_em=0.10, min_delta=0.03, patience=3)
    assert ran == [] and len(result.cycles) == 3  # 0.125 is within 0.03 of 0.10: three cycles stall
    ran.clear()
    result, _, _ = stage(faked, [], max_cycles=2, start_em=0.0, patience=5)
    assert ran == [] and len(result.cycles) == 2  # the budget


def test_the_curve_numbers_steps_across_cycles_and_stages(tmp_path):
    def cycle(name, steps, em):
        done = tmp_path / name
        done.mkdir()
        (done / "log.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in steps)
        )
        return done, {"dev_em": em, "stage": 1, "note": "text"}

    (a, sa), (b, sb), (c, sc) = cycle("a", [1, 2], 0.2), cycle("b", [], 0.3), cycle("c", [1, 2, 3], 0.4)
    one, two = cur.StageResult([a, b], [sa, sb]), cur.StageResult([c], [sc])
    rows = cur.curve_rows([(1, one), (2, two)], start_em=0.1)
    assert [(r["stage"], r["step"]) for r in rows] == [
        ("1", 0),
        ("1", 1),
        ("1", 2),
        ("1", 3),
        ("2", 4),
        ("2", 5),
        ("2", 6),
    ]
    assert rows[0]["dev_em"] == 0.1 and rows[2]["dev_em"] == 0.2 and rows[3]["dev_em"] == 0.3
    assert "dev_em" not in rows[1] and rows[-1]["dev_em"] == 0.4 and "note" not in rows[-1]
    assert [r.get("loss") for r in rows] == [None, 0.1, 0.2, None, 0.1, 0.2, 0.3]
    assert cur.curve_rows([(1, one)])[0]["step"] == 1 and cur.curve_rows([], start_em=0.1) == []
    # with the dev questions' count, each dev EM carries it (the plot's band), no other row
    counted = cur.curve_rows([(1, one), (2, two)], start_em=0.1, dev_n=64)
    assert [r.get("heldout/n") for r in counted] == [64, None, 64, 64, None, None, 64]
