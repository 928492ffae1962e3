"""Where a run's numbers came from, and the claims' judge split and seeds.

A run writes ``provenance.json`` (:func:`rag_lab.run.provenance`,
:func:`rag_lab.runner.rundir.write_provenance`): the commit, the code's hash, its config hash and its row's
(the config less the seed), the LM's fingerprint, the split, the seed and N. The claims table
(:mod:`rag_lab.claims`) reads it back here and refuses, in one line naming the run or the row: a run off the
judge split or seeds, without provenance, from another commit or code than the rest, or resumed at another
version; a row that pools two configs; a (seed, question) twice.

The judge split and seeds are ``make claims``' alone (:func:`check_judge`, called before a run writes
anything). Hand-written: no library keeps a run's provenance in this form.
"""

import json
import subprocess
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf, open_dict

from rag_lab import CONF_DIR
from rag_lab.core import cache
from rag_lab.core.config import ConfigError
from rag_lab.core.errors import RagLabError
from rag_lab.data.synth import JUDGE_ENV as JUDGE_ENV  # re-exported: the runner's and tests' name
from rag_lab.data.synth import JUDGE_REFUSAL, JUDGE_SPLIT, judging
from rag_lab.eval.runs import records_of, results_config

# The claims' judgement (``make claims``, conf/claims.yaml): a split of the generated world (JUDGE_SPLIT,
# which the world writes and reads only under JUDGE_ENV: rag_lab.data.synth) and seeds that only it uses. A
# run touches them only with RAG_LAB_JUDGE=1 in its environment, which ``make claims`` sets; probes, the
# demo, the tests and rag_lab.score get a one-line refusal (issue 65: a claim is judged on questions and
# seeds no probe saw).
# the papers' claims (kinds H and M: conf/claims.yaml's judge.seeds)
JUDGE_SEEDS = (100, 101, 102)
# our own claim (kind E, issue 74: rag_lab.reporting.claims_evidence), judged on seeds of its own
EVIDENCE_SEEDS = (200, 201)
# the seeds a judged run may have, and no other run
RESERVED_SEEDS = JUDGE_SEEDS + EVIDENCE_SEEDS


def check_judge(cfg: DictConfig, environ: dict | None = None) -> None:
    """Refuse a run on the judge split or a judge seed outside ``make claims`` (``RAG_LAB_JUDGE=1``), and a
    policy that would train on the judge split anywhere; one line naming the key."""
    if cfg.get("train_split") == JUDGE_SPLIT:
        raise ConfigError(
            f"config 'train_split': '{JUDGE_SPLIT}' is the claims' judge split; nothing trains on it"
        )
    if judging(environ):
        return
    why = f"{JUDGE_REFUSAL}; probes use dev / test"
    check_split("eval.split", cfg.eval.split, environ)
    if cfg.seed in RESERVED_SEEDS:
        raise ConfigError(
            f"config 'seed': {cfg.seed} is a judge seed ({JUDGE_SEEDS[0]}-{JUDGE_SEEDS[-1]},"
            f" {EVIDENCE_SEEDS[0]}-{EVIDENCE_SEEDS[-1]}), {why} and other seeds"
        )


def check_split(key: str, split: str, environ: dict | None = None) -> None:
    """Refuse config ``key`` naming the judge split outside ``make claims`` (``RAG_LAB_JUDGE=1``); one line
    (the runner's ``eval.split``, rag_lab.score's ``split``)."""
    if split == JUDGE_SPLIT and not judging(environ):
        raise ConfigError(f"config '{key}': '{JUDGE_SPLIT}' is {JUDGE_REFUSAL}; probes use dev / test")


# The row hash's version, which provenance.json records beside it (``row_hash_version``; a run without one
# is of version 1). Version 1 kept the nested ``cache_dir`` keys, so it moved with $RAG_LAB_CACHE (the E
# judgement's runs, experiments/results/judgements/da63711, are of version 1); version 2 leaves every one
# out (rag_lab.eval.runs.LOCATIONS).
ROW_HASH_VERSION = 2


def row_hash(cfg: DictConfig, version: int = ROW_HASH_VERSION, cache_dir: str | None = None) -> str:
    """16 hex digits: the composed config less what cannot change results and less the seed (``${seed}``
    resolved as 0 wherever it is used): equal for the seeds of one row of a sweep, and only for them. Of the
    config as composed: building a run's components resolves some of its nodes in place (the runner takes
    it before, :func:`rag_lab.run.run`). ``version`` 1 recomputes a hash recorded before version 2, its
    ``cache_dir`` set to the one the run resolved (``cache_dir``; None: as this environment resolves it)."""
    if version not in (1, ROW_HASH_VERSION):
        raise RagLabError(f"row hash version {version}: this rag_lab knows versions 1 and {ROW_HASH_VERSION}")
    seedless = cfg.copy()
    with open_dict(seedless):
        seedless.seed = 0
        if cache_dir is not None:
            seedless.cache_dir = cache_dir
    resolved = OmegaConf.to_container(seedless, resolve=True)
    config = results_config(resolved, locations=version == 1)
    config.pop("seed", None)
    return cache.text_digest(json.dumps(config, sort_keys=True, default=str))[:16]


def _resolved_cache_dir(run: Path) -> str | None:
    """The ``cache_dir`` a run resolved, from its ``config.yaml`` (None where it has none)."""
    path = run / "config.yaml"
    if not path.exists():
        return None
    return (yaml.safe_load(path.read_text()) or {}).get("cache_dir")


def row_config_of(run: Path, provenance: dict) -> str | None:
    """A run's row hash, the one its provenance recorded once it is :func:`row_hash` of the config the run
    was composed with (``.hydra/config.yaml``, written before anything was built), at the hash's recorded
    version (``row_hash_version``, 1 where none: its ``cache_dir`` the run's own, from its ``config.yaml``); a
    RagLabError naming the run and both hashes where they differ (its config or its provenance changed after
    it ran). Without a composed config the recorded one stands; without a recorded one, the composed
    config's. The runs of commit 8993ad5 recorded it after their components had resolved their config in
    place (fixed since): the two differed by seed, and 698d530 took the composed config's; such a run is
    refused now."""
    recorded = provenance.get("row_config")
    path = run / ".hydra" / "config.yaml"
    if not path.exists():
        return recorded
    version = provenance.get("row_hash_version", 1)
    where = _resolved_cache_dir(run) if version == 1 else None
    composed = row_hash(OmegaConf.load(path), version, where)
    if recorded is not None and recorded != composed:
        raise RagLabError(
            f"run {run}: provenance.json records row hash {recorded}, but its composed config"
            f" ({path}) hashes to {composed}: the config or the provenance changed after the run"
        )
    return composed


def provenance_of(run: Path) -> dict:
    """A run's ``provenance.json``; a run without one (or with one unreadable) is refused in one line."""
    path = run / "provenance.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RagLabError(
            f"run {run}: no provenance.json (it ran before runs recorded their provenance)"
        ) from None
    except (OSError, ValueError) as e:
        raise RagLabError(f"run {run}: provenance.json unreadable ({e})") from None


# the checkout rag_lab runs from (the commits' tree)
ROOT = CONF_DIR.resolve().parent


def same_tree(commit: str, other: str, root: Path = ROOT) -> bool:
    """Whether ``commit`` and ``other`` hold the same ``rag_lab/`` and ``conf/`` (``git diff``): runs started
    at either ran one version, the checkout having moved on by other files only (a results page, the README)
    while a sweep ran. False where git cannot tell (no checkout, an unknown commit)."""
    if commit == other:
        return True
    try:
        diff = ["git", "-C", str(root), "diff", "--quiet", commit, other, "--", "rag_lab", "conf"]
        return subprocess.run(diff, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def check_runs(runs: list[Path], split: str, seeds: tuple[int, ...]) -> dict[Path, dict]:
    """Each run's provenance, once every run is on the judge ``split`` and ``seeds``, of one version (one
    code, and one commit or commits whose rag_lab/ and conf/ are the same: :func:`same_tree`), and not resumed
    at another version; else a RagLabError naming the first run that is not."""
    found = {run: provenance_of(run) for run in runs}
    for run, prov in found.items():  # the row hash of the config each run was composed with
        prov["row_config"] = row_config_of(run, prov)
    for run, prov in found.items():
        if prov.get("split") != split:
            raise RagLabError(
                f"run {run}: split {prov.get('split')}, not the judge split {split} (conf/claims.yaml: judge)"
            )
        if prov.get("seed") not in seeds:
            raise RagLabError(
                f"run {run}: seed {prov.get('seed')}, not a judge seed ({', '.join(map(str, seeds))})"
            )
        if prov.get("dirty"):
            raise RagLabError(
                f"run {run}: made from a tree whose rag_lab/ or conf/ differ from commit {prov.get('commit')}"
            )
        for later in prov.get("resumed", []):
            raise RagLabError(
                f"run {run}: resumed at commit {later.get('commit')} (code {later.get('code')},"
                f" LM {later.get('lm')}),"
                f" started at {prov.get('commit')} (code {prov.get('code')}, LM {prov.get('lm')})"
            )
    first, prov0 = next(iter(found.items()))
    for run, prov in found.items():
        code = prov.get("code") == prov0.get("code")
        if not code or not same_tree(str(prov.get("commit")), str(prov0.get("commit"))):
            raise RagLabError(
                f"run {run}: commit {prov.get('commit')} (code {prov.get('code')}), but {first} and the runs"
                f" before it: commit {prov0.get('commit')} (code {prov0.get('code')}); a table is one version"
            )
    return found


def row_scores(row: str, runs: list[Path], found: dict[Path, dict]) -> dict[tuple[str, str], dict]:
    """The records of one row's runs keyed by (seed, question id), once the runs share one config (seeds
    aside) and no (seed, question) comes twice; else a RagLabError naming the row and the two runs."""
    configs: dict[str, Path] = {}
    for run in runs:
        configs.setdefault(found[run].get("row_config"), run)
    if len(configs) > 1:
        (h1, r1), (h2, r2) = list(configs.items())[:2]
        raise RagLabError(f"row {row}: runs of two configs pooled: {r1} (config {h1}) and {r2} (config {h2})")
    scores: dict[tuple[str, str], dict] = {}
    owner: dict[tuple[str, str], Path] = {}
    for run in runs:
        seed = str(found[run].get("seed"))
        for rec in records_of(run):
            key = (seed, rec["id"])
            if key in scores:
                raise RagLabError(
                    f"row {row}: seed {seed}, question {rec['id']} twice: in {owner[key]} and in {run}"
                )
            scores[key], owner[key] = rec, run
    return scores


def line_provenance(a: list[Path], b: list[Path], found: dict[Path, dict]) -> dict:
    """A claims line's provenance from the runs of its rows A (``a``) and B (``b``), ``found`` by
    :func:`check_runs`: the seeds both rows ran (as text, sorted: the bootstrap's order), the first and last
    start, the commit and code, each row's config hash, the LMs and the split."""
    seeds = sorted({str(found[x].get("seed")) for x in a} & {str(found[x].get("seed")) for x in b})
    starts = sorted(s for x in a + b if (s := found[x].get("started")))
    first, other = found[a[0]], found[b[0]]
    return {
        "seeds": " ".join(seeds),
        "started": f"{starts[0]} {starts[-1]}" if starts else None,
        "commit": first.get("commit"),
        "code": first.get("code"),
        "config A": first.get("row_config"),
        "config B": other.get("row_config"),
        "lm": " ".join(sorted({found[x].get("lm") for x in a + b})),
        "split": first.get("split"),
    }
