"""Every yaml of every config group composes, validates against its schema and instantiates."""

import re
import shlex

import pytest
from hydra.errors import ConfigCompositionException, InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from rag_lab import CONF_DIR
from rag_lab.core.cli import check_yaml_files
from rag_lab.core.config import ConfigError, build, compose, group_options, schema_for, validate
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus, QAExample
from rag_lab.env import Env
from rag_lab.runner.sweeps import soften

from conftest import cli, retrieval_server

# config group -> package (conf/<group>/ <-> rag_lab/<package>/)
PACKAGES = {
    "data": "data",
    "retriever": "retrievers",
    "generator": "generators",
    "policy": "policies",
    "reward": "rewards",
    "logger": "loggers",
}
GROUPS = list(PACKAGES)
OPTIONS = [(g, o) for g in GROUPS for o in group_options(g)]
CORPUS = Corpus(
    ["p1", "p2", "p3", "p4"],
    ["Ada Lovelace", "Paris", "Rome", "Oslo"],
    ["Ada was born in London.", "Paris is a city.", "Rome is a city.", "Oslo is a city."],
)
# a question whose gold passage is p1 (the one every ranking retriever puts first)
ADA = QAExample("q1", "Where was Ada Lovelace born?", ("London",), supporting_ids=("p1",))


def test_judge_group_composes_and_needs_a_generator(tiny_cfg):
    from hydra.errors import InstantiationException

    cfg = tiny_cfg("judge=llm")
    assert cfg.judge._target_ == "rag_lab.eval.judge.LLMJudge"
    with pytest.raises(InstantiationException, match="needs a generator"):
        instantiate(cfg.judge)


def test_every_group_has_a_package_and_an_option():
    for group in ["data", "retriever", "policy", "reward", "logger"]:
        assert group_options(group), group
    for group, package in PACKAGES.items():
        assert (CONF_DIR / group).is_dir(), group
        assert (CONF_DIR.parent / "rag_lab" / package / "base.py").exists(), package


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_compose_and_instantiate(group, option, tiny_cfg, tmp_path):
    # generator=tiny (tiny_t19, tiny_t48) on the tests' world would train a toy LM (test_tiny_world trains
    # them); on the default world it loads its shipped checkpoint, the option's own path
    shipped = group == "generator" and option in ("tiny", "tiny_t19", "tiny_t48")
    if (group, option) == ("retriever", "remote"):  # a retrieval server's client: compose checks it answers
        return check_remote(tiny_cfg)
    cfg = compose([f"{group}={option}"]) if shipped else tiny_cfg(f"{group}={option}")
    node = cfg[group]
    assert "_target_" in node
    if (group, option) == ("generator", "smollm2"):
        pytest.skip("a 538 MB conversion on first use: built by tests/test_smollm2.py in the slow set")
    try:
        if group == "retriever":
            obj = instantiate(node, corpus=CORPUS)
            # through the env, as a policy searches: each query with its question (retriever=oracle reads it)
            found = [h.id for h in Env(CORPUS, obj).search([ADA.question], 1, questions=[ADA])[0]]
            # the controls (rag_lab/retrievers/controls.py): random draws any one passage, empty none
            if option == "random":
                assert len(found) == 1 and found[0] in CORPUS, found
            else:
                assert found == ([] if option == "empty" else ["p1"]), found
        elif group == "logger":
            obj = instantiate(node, _partial_=True)(run_dir=str(tmp_path), run_config={"a": 1})
            obj.log_metrics({"em": 1.0})
            obj.finish()
        else:  # what the runner hands over: the dataset, the run's config
            data = instantiate(cfg.data)
            obj = build(node, data=data, train_data=data, run_config={})
    except InstantiationException as e:
        # Real hub models (E5, BGE, Contriever, Qwen) cannot be fetched here, and vLLM needs a GPU
        # install: the error must say so in one line.
        assert isinstance(e.__cause__, RagLabError)
        assert re.search(r"not available offline|needs vLLM: `make install-gpu`", str(e.__cause__))
        return
    assert obj is not None


def check_remote(tiny_cfg) -> None:
    """retriever=remote against a server of what its ``serves`` names (BM25) over CORPUS."""
    bm25 = tiny_cfg().retriever
    config = OmegaConf.to_container(bm25, resolve=True)
    with retrieval_server(build(bm25, corpus=CORPUS), config, CORPUS) as (url, _):
        obj = instantiate(tiny_cfg("retriever=remote", f"retriever.url={url}").retriever, corpus=CORPUS)
        assert obj.search(["Where was Ada Lovelace born?"], 1)[0][0].id == "p1"


@pytest.mark.parametrize("name", group_options("experiment"))
def test_experiments_compose(name):
    cfg = compose([f"experiment={name}"])
    assert cfg.experiment.name == name


def swept_rows() -> list[tuple[str, str]]:
    """(experiment, row) for every experiment that sweeps rows of its own (``experiment/<group>: a,b``)."""
    import yaml

    from rag_lab import CONF_DIR

    pairs = []
    for name in group_options("experiment"):
        text = yaml.safe_load((CONF_DIR / "experiment" / f"{name}.yaml").read_text()) or {}
        params = (((text.get("hydra") or {}).get("sweeper") or {}).get("params")) or {}
        for key, values in params.items():
            if key.startswith("experiment/"):
                pairs += [(name, f"{key}={row.strip()}") for row in str(values).split(",")]
    # compare_musique sweeps compare_synth's rows (its defaults include that experiment)
    pairs += [("compare_musique", row) for exp, row in list(pairs) if exp == "compare_synth"]
    return pairs


@pytest.mark.parametrize("name, row", swept_rows(), ids=[f"{n}:{r.split('=')[1]}" for n, r in swept_rows()])
def test_every_row_of_a_row_sweep_composes_and_validates(name, row):
    """Composed as the sweeper orders it (the row's override first), and every setting the row's file gives
    survives: an experiment's own body must not override its rows (a row labelled untrained that trains)."""
    import yaml

    from rag_lab import CONF_DIR

    cfg = compose([row, f"experiment={name}"])  # compose validates
    assert cfg.experiment.name == name
    group, option = row.removeprefix("+").split("=")
    given = yaml.safe_load((CONF_DIR / group / f"{option}.yaml").read_text()) or {}

    def leaves(node, prefix=""):
        for key, value in node.items():
            if key == "defaults":
                continue
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{prefix}{key}.")
            elif not (isinstance(value, str) and "${" in value):
                yield f"{prefix}{key}", value

    for key, value in leaves(given):
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if isinstance(got, (DictConfig, ListConfig)) else got
        assert got == value, f"{row}: {key} is {got!r} in the composed run, the row says {value!r}"


def test_unknown_override_fails_at_compose_naming_the_key():
    with pytest.raises(ConfigCompositionException, match=r"policy\.k1"):
        compose(["policy.k1=1.2"])


def test_yaml_typo_and_wrong_type_fail_validation_naming_the_key(tiny_cfg):
    cfg = tiny_cfg()
    with open_dict(cfg):
        cfg.retriever.k11 = 1.2
    with pytest.raises(ConfigError, match=r"config 'retriever\.k11' .*Key 'k11' not in"):
        validate(cfg)
    with pytest.raises(ConfigError, match=r"'abc'.*Float"):
        compose(["retriever.k1=abc"])
    with pytest.raises(ConfigError, match=r"Key 'k2' not in"):
        compose(["+retriever.k2=1"])


def test_schema_is_the_signature():
    schema = OmegaConf.structured(schema_for("rag_lab.retrievers.bm25.BM25Retriever"))
    assert schema.k1 == 1.5 and schema.method == "lucene"
    # what the runner hands over is not a config key
    assert "corpus" not in schema
    with pytest.raises(ConfigError, match="generator.data"):
        compose(["generator=teacher", "+generator.data=x"])


def test_forwarded_settings_are_declared_once():
    """SmolLM2's, Stop-RAG's and the teacher's settings are their targets' own (``config.takes``): the same
    defaults, checked the same way."""
    hf = OmegaConf.structured(schema_for("rag_lab.generators.hf.HFGenerator"))
    smol = OmegaConf.structured(schema_for("rag_lab.generators.smollm2.smollm2"))
    assert {k: smol[k] for k in ("dtype", "batch_size", "chat")} == {
        k: hf[k] for k in ("dtype", "batch_size", "chat")
    }
    stoprag = OmegaConf.structured(schema_for("rag_lab.policies.stoprag.policy.StopRAG"))
    qnet = OmegaConf.structured(schema_for("rag_lab.policies.stoprag.qnet.QNetwork"))
    assert stoprag.freeze_encoder == qnet.freeze_encoder and stoprag.iterations == 10
    with pytest.raises(ConfigError, match="policy.iterations"):
        compose(["policy=stoprag", "policy.iterations=0"])
    with pytest.raises(ConfigError, match="generator.batch_size"):
        compose(["generator=smollm2", "generator.batch_size=abc"])


def test_malformed_yaml_names_file_line(tmp_path):
    (tmp_path / "retriever").mkdir()
    (tmp_path / "retriever" / "bad.yaml").write_text("k1: 1\nb: [0.7\n")
    with pytest.raises(ConfigError, match=r"retriever/bad.yaml:3:1: malformed yaml"):
        check_yaml_files([tmp_path])
    check_yaml_files()  # the shipped tree is clean


def test_omegaconf_reads_every_config_file_with_libyaml_as_with_pyyaml():
    """rag_lab.core.config.use_libyaml: OmegaConf's own loader on libyaml's parser. Every yaml of conf/ loads
    to the same values (floats like 1e-3, no timestamps), and a duplicate key is still refused."""
    import yaml
    from omegaconf import _utils

    fast = _utils.get_yaml_loader()
    assert issubclass(fast, yaml.CSafeLoader)
    python = fast.pure_python
    assert issubclass(python, yaml.SafeLoader) and not issubclass(python, yaml.CSafeLoader)
    paths = sorted(CONF_DIR.rglob("*.yaml"))
    for path in paths:
        text = path.read_text()
        assert yaml.load(text, Loader=fast) == yaml.load(text, Loader=python), path
    text = "a: 1.0e-3\nb: 1e-3\nc: 2026-11-28\nd: .inf\ne: 1_000\n"
    assert OmegaConf.create(text) == {"a": 0.001, "b": 0.001, "c": "2026-11-28", "d": float("inf"), "e": 1000}
    for loader in (fast, python):
        with pytest.raises(yaml.constructor.ConstructorError, match="found duplicate key a"):
            yaml.load("a: 1\nb: [1]\na: 2\n", Loader=loader)


def test_cli_unknown_key_is_hydras_one_message(repo_root, tmp_path, capfd, monkeypatch):
    rc, out = cli("run", ["policy.k1=1.2", f"hydra.run.dir={tmp_path}"], capfd, monkeypatch, cwd=repo_root)
    assert rc == 1
    assert "Could not override 'policy.k1'" in out
    assert not (tmp_path / "records.jsonl").exists()


def test_an_override_that_a_sweep_row_also_sets_is_refused():
    """`experiment=dapo_ablation policy.stages=[1]` would run stage one in every row, the rows labelled
    "no stage one" and "no stage two" included: the job's overrides are checked against its row."""
    from rag_lab.core.cli import check_row_overrides

    with pytest.raises(ConfigError, match=r"'policy.stages=\[1\]' sets policy.stages, .* row 'experiment/"):
        check_row_overrides(["experiment/dapo_ablation=no_stage_one", "policy.stages=[1]", "seed=0"])
    check_row_overrides(["experiment/dapo_ablation=no_stage_one", "policy.steps=3", "seed=0"])
    check_row_overrides(["experiment/dapo_ablation=no_search", "reward.answer.beta=0.5"])
    with pytest.raises(ConfigError, match="reward.search"):
        check_row_overrides(["experiment/dapo_ablation=no_search", "reward.search=null"])


def test_the_gpu_checks_run_keeps_the_whole_cold_start(repo_root):
    """experiments/gpu_check.sh's run overrides (its plan's and FSDP step's, the CPU smoke's) on dapo_synth
    give it a whole cold start (dapo_synth has none; SmolLM2 needs one): an override of
    ``policy.cold_start.*`` there replaced ``${experiment.cold_start}`` with only the keys it set, and the run
    died without ``split``."""
    script = (repo_root / "experiments" / "gpu_check.sh").read_text()
    arrays = {name: shlex.split(body) for name, body in re.findall(r"(COLD|STEP)=\((.*?)\)\n", script, re.S)}

    def expanded(words: list[str]) -> list[str]:
        out = []
        for word in words:
            name = re.fullmatch(r"\$\{(\w+)\[@\]\}", word)
            out += expanded(arrays[name.group(1)]) if name else [word]
        return out

    blocks = [arrays["STEP"], *(shlex.split(b) for b in re.findall(r"RUN=\((.*?)\)\n", script, re.S))]
    assert len(blocks) == 3
    for block in blocks:
        args = expanded(block)
        # as the runner composes it: dapo_synth is a sweep, so its component overrides are soft (++)
        cfg = compose(soften(args))
        cold = OmegaConf.to_container(cfg.policy.cold_start, resolve=True)
        assert cold["split"] == "train" and cold["_target_"].endswith("ColdStartConfig"), cold
