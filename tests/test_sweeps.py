"""Sweeps over rows of different policies (soft overrides) and runs keyed by their config's hash."""

import json
import shutil

from omegaconf import OmegaConf

from rag_lab.core.config import CONF_DIR, compose, validate
from rag_lab.eval.runs import find_runs, overrides_of
from rag_lab.runner.sweeps import config_hash, drop_inapplicable, soften

from conftest import cli


def test_soften_turns_component_settings_into_set_or_add_in_a_multirun_only():
    argv = ["-m", "experiment=x", "policy.lambda_end=0.1,0.3", "reward.beta=0.1", "seed=0,1", "eval.limit=5"]
    soft = ["++policy.lambda_end=0.1,0.3", "++reward.beta=0.1"]
    assert soften(argv) == ["-m", "experiment=x", *soft, "seed=0,1", "eval.limit=5"]
    assert soften(["policy.k=3"]) == ["policy.k=3"]  # a single run stays strict
    # an experiment that is a multirun by its own file (hydra.mode: MULTIRUN)
    assert soften(["experiment=stoprag_synth", "policy.lambda_end=0.3"])[1] == "++policy.lambda_end=0.3"


def composed(*overrides: str):
    """The config as Hydra composes it, before the runner validates it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def test_a_setting_is_left_out_where_the_component_has_no_such_field():
    override = "++policy.lambda_end=0.3"
    stop = composed("generator=teacher", "policy=stoprag", override)
    assert drop_inapplicable(stop, [override]) == [] and stop.policy.lambda_end == 0.3
    fixed = composed("generator=teacher", "policy=fixed_iter", override)
    assert (
        drop_inapplicable(fixed, [override]) == ["policy.lambda_end=0.3"] and "lambda_end" not in fixed.policy
    )
    validate(fixed)  # what is left is a valid config
    # a nested setting: the node it made where the policy has none goes, and stays where it has one
    nested, sibling = "++policy.ppo.batch_size=2", "++policy.ppo.clip=0.3"
    fixed = composed("generator=teacher", "policy=fixed_iter", nested, sibling)
    assert drop_inapplicable(fixed, [nested, sibling]) == ["policy.ppo.batch_size=2", "policy.ppo.clip=0.3"]
    assert "ppo" not in fixed.policy
    validate(fixed)
    r3 = composed("generator=teacher", "policy=r3rag", nested)
    assert drop_inapplicable(r3, [nested]) == [] and r3.policy.ppo.batch_size == 2
    # a reward key on a policy without a reward: the node the override made goes back to null
    plain = composed("policy=top_title", "++reward.beta=0.3")
    assert drop_inapplicable(plain, ["++reward.beta=0.3"]) == ["reward.beta=0.3"] and plain.reward is None
    validate(plain)


def test_the_hash_ignores_what_cannot_change_results_and_sees_what_can():
    config = OmegaConf.to_container(compose(["policy=top_title"]), resolve=True)
    same = json.loads(json.dumps(config)) | {"cache_dir": "/elsewhere"}
    same["eval"] |= {"batch_size": 7, "resume": False, "reuse": False}
    assert config_hash(config) == config_hash(same)
    assert config_hash(config) != config_hash(config | {"seed": 1})
    assert config_hash(config) != config_hash({**config, "policy": {**config["policy"], "k": 9}})


def test_identical_configs_in_a_sweep_and_across_sweeps_run_once(repo_root, tmp_path, capfd, monkeypatch):
    sizes = ["data.n_people=60", "data.n_films=20", "data.dev_size=20", "data.test_size=30"]
    # its own cache dir: the registry of finished runs holds no other test's runs
    env = {"RAG_LAB_REUSE": "true", "RAG_LAB_CACHE": str(tmp_path / "cache")}

    def sweep(name: str, *extra: str) -> list:
        args = ["-m", *sizes, *extra, f"hydra.sweep.dir={tmp_path / name}"]
        rc, out = cli("run", args, capfd, monkeypatch, cwd=repo_root, env=env)
        assert rc == 0, out[-2000:]
        return find_runs([tmp_path / name])

    # policy.bogus is no setting of top_title: both jobs are the same config, the second copies the first
    first = sweep("a", "policy=top_title", "policy.bogus=1,2")
    assert [overrides_of(r)["policy.bogus"] for r in first] == ["1", "2"]
    assert not (first[0] / "reused.json").exists()
    assert json.loads((first[1] / "reused.json").read_text())["from"] == str(first[0].resolve())
    assert (first[1] / "records.jsonl").read_bytes() == (first[0] / "records.jsonl").read_bytes()
    # another sweep with one of those configs and a new one: only the new one runs
    second = sweep("b", "policy.k=5,2")
    assert (second[0] / "reused.json").exists() and not (second[1] / "reused.json").exists()
    # eval.reuse=false runs it again
    third = sweep("c", "policy.k=5", "eval.reuse=false")
    assert not (third[0] / "reused.json").exists()
    # the last run of that config (c) removed and its dir used by another config: the registry entry names
    # a dir that now holds that other run, which must not be copied as the first config's
    shutil.rmtree(tmp_path / "c")
    sweep("c", "policy.k=7")
    again = sweep("d", "policy.k=5")
    assert not (again[0] / "reused.json").exists()


def test_a_swept_method_setting_names_the_methods_rows_and_a_reused_run_counts_once(tmp_path):
    from rag_lab.report import seed_tables

    def make(name, policy, lam, reused_from=None):
        run = tmp_path / name
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- policy={policy}\n- ++policy.lambda_end={lam}\n")
        config = {"policy": {"k": 1} | ({"lambda_end": lam} if policy == "stoprag" else {}), "seed": 0}
        (run / "config.yaml").write_text(json.dumps(config))
        accs = [float(i % (3 if policy == "stoprag" else 2) == 0) for i in range(20)]
        lines = [json.dumps({"id": f"q{i}", "em": a, "f1": a, "acc": a}) + "\n" for i, a in enumerate(accs)]
        (run / "records.jsonl").write_text("".join(lines))
        (run / "metrics.json").write_text(json.dumps({"all": {"n": 20, "em": sum(accs) / 20}}))
        if reused_from:
            (run / "reused.json").write_text(json.dumps({"from": str((tmp_path / reused_from).resolve())}))
        return run

    runs = [make("0", "fixed_iter", 0.1), make("1", "stoprag", 0.1)]
    runs += [make("2", "fixed_iter", 0.3, reused_from="0"), make("3", "stoprag", 0.3)]
    tables, tests = seed_tables(runs, "policy", "stoprag", {"t": ["EM"]})
    assert list(tables["t"]["policy"]) == [
        "fixed_iter",
        "stoprag (policy.lambda_end=0.1)",
        "stoprag (policy.lambda_end=0.3)",
    ]
    assert list(tables["t"]["seeds"]) == [1, 1, 1]  # the reused fixed_iter is not a second seed
    pairs = sorted(set(zip(tests["A"], tests["B"], strict=True)))
    assert pairs == [(f"stoprag (policy.lambda_end={lam})", "fixed_iter") for lam in (0.1, 0.3)]


def test_the_same_config_run_twice_beside_itself_counts_once(tmp_path):
    from rag_lab.eval.runs import distinct

    runs = []
    for name, batch, k in [("0", 64, 1), ("1", 8, 1), ("2", 64, 5)]:  # 0 and 1 differ in batch size alone
        (tmp_path / name).mkdir()
        config = {"policy": {"k": k}, "eval": {"batch_size": batch}, "seed": 0}
        (tmp_path / name / "config.yaml").write_text(json.dumps(config))
        runs.append(tmp_path / name)
    assert distinct(runs) == [runs[0], runs[2]]


def test_the_config_hash_and_the_package_digest_keep_their_values(tmp_path, monkeypatch):
    """The hex that reused runs' registry and provenance.json hold, for hand-worked inputs: sha256 of exactly
    these bytes (the hashing goes through rag_lab.core.cache; the values must not move)."""
    from rag_lab.runner import sweeps

    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "a.py").write_text("x")
    (tmp_path / "__pycache__" / "a.pyc").write_bytes(b"not counted")
    # sha256(b"a.py" b"x"): each file's path and bytes, __pycache__ left out
    digest = "eed2d11d407de357034a064a4b4223be7776544d764bd0b60ccef28559d55690"
    assert sweeps.package_digest(tmp_path) == digest
    monkeypatch.setattr(sweeps, "package_digest", lambda root=None: "P")
    # sha256('{"a": 1}' "P"): the config less what cannot change results, then the package's digest
    assert config_hash({"a": 1, "logger": {"x": 1}}) == "10af8577b9ec9552"
