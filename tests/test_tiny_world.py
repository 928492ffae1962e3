"""generator=tiny end to end on the tiny world with toy sizes: trains once, then reuses."""

from hydra.utils import instantiate

from rag_lab.run import run


def test_tiny_lm_trains_once_and_runs_a_policy(tiny_cfg, tmp_path):
    cfg = tiny_cfg("generator=tiny", "policy=fixed_iter", "policy.iterations=2", "eval.limit=4",
                   f"cache_dir={tmp_path}/cache")  # fmt: skip
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 4 and metrics["all"]["tokens_total"] > 0
    (checkpoint,) = (tmp_path / "cache" / "tiny_lm").iterdir()
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "train.json").exists()
    stamp = (checkpoint / "model.safetensors").stat().st_mtime_ns
    data = instantiate(cfg.data)
    generator = instantiate(cfg.generator, data=data)  # same sizes and world: reused, not retrained
    assert (checkpoint / "model.safetensors").stat().st_mtime_ns == stamp
    assert generator.chat is False and len(list((tmp_path / "cache" / "tiny_lm").iterdir())) == 1
