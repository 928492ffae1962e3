"""OmegaConf (and so Hydra's compose) on libyaml's C parser. Hand-written: neither OmegaConf nor Hydra
offers a faster loader, and a compose re-reads every yaml it composes each time; this module is the
loader OmegaConf builds, on ``yaml.CSafeLoader``. :mod:`rag_lab.core.config` applies it on import."""

import yaml


def use_libyaml() -> bool:
    """Make OmegaConf (and so Hydra's compose) parse yaml with libyaml's C parser: the same loader
    OmegaConf builds (its float and no-timestamp resolvers, its duplicate-key check, its path tags) on
    ``yaml.CSafeLoader`` instead of the pure-Python ``SafeLoader``. A compose reads every yaml it
    composes, each time: 0.29 s -> 0.21 s for a run's config on 2 cores (warm), paid by every command
    line, every job of a sweep and every test. False (nothing changed) where PyYAML was built without libyaml.
    ``tests/test_configs.py`` checks both loaders read every yaml of ``conf/`` alike."""
    from omegaconf import _utils

    if not getattr(yaml, "__with_libyaml__", False):
        return False
    python = _utils.get_yaml_loader()
    if hasattr(python, "pure_python"):  # applied already
        return True

    class OmegaConfCLoader(yaml.CSafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"found duplicate key {key_node.value}",
                        key_node.start_mark,
                    )
                seen.add(key_node.value)
            return super().construct_mapping(node, deep=deep)

    OmegaConfCLoader.yaml_implicit_resolvers = {k: list(v) for k, v in python.yaml_implicit_resolvers.items()}
    OmegaConfCLoader.yaml_constructors = dict(python.yaml_constructors)
    OmegaConfCLoader.pure_python = python  # OmegaConf's own, kept for the test that they agree
    _utils.get_yaml_loader = lambda: OmegaConfCLoader  # OmegaConf.load and .create import it from there
    return True
