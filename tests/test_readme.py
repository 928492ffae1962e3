"""Every command in README.md parses, as written (issue 67): the shell blocks' command lines, each checked as
far as it can be without running it.

- ``python -m rag_lab.run ...``: what the runner does before any work, job by job: the overrides softened as
  the command softens them, composed by Hydra with its own config (launchers, sweep dirs), a sweep expanded
  as Hydra's basic sweeper expands it (every value of the command line's sweeps; an experiment's own rows are
  composed by tests/test_configs.py), then the runner's checks (an override a row sets too, one below an
  interpolated node, the judge split) and the schemas' validation. A sweep without ``-m`` fails, as Hydra
  refuses it. The machine's checks (GPUs, DeepSpeed, model files) are left out: they are not the command's.
- any other ``python -m rag_lab.<command> ...``: the command itself, run in this process until it builds its
  first component (Hydra's ``instantiate``) or has parsed its options (``argparse``), whichever comes first.
- ``make <target> [VAR=value]``: ``make -n`` (prints the recipe, runs nothing).
- the programs in :data:`SKIPPED` (pip, git, cd, ...) are named here and skipped; any other program fails
  the test until it is added there or given a check.

Hand-written: no library extracts shell commands from markdown; the parsing is the standard library's shlex.
"""

import argparse
import re
import shlex
import subprocess
from pathlib import Path

import hydra.utils
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException
from omegaconf import open_dict

from rag_lab import CONF_DIR
from rag_lab import run as runner  # the runner's own checks, wherever the package keeps them

from conftest import cli

ROOT = CONF_DIR.parent
README = ROOT / "README.md"
# Programs whose command lines run nothing of rag_lab's: each named, so an unknown one fails the test.
SKIPPED = {"pip", "git", "cd", "export", "source", "wandb", "ls", "cat", "nvidia-smi"}
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.S | re.M)


def readme_commands(text: str) -> list[list[str]]:
    """The command lines of ``text``'s shell blocks, each as its words: continuation lines joined, comments
    dropped, ``a && b`` and ``a; b`` as two commands, leading ``VAR=value`` assignments left out."""
    commands = []
    for block in SHELL_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, ";"]:
                if word in ("&&", "||", ";"):
                    while command and re.fullmatch(r"[A-Za-z_]\w*=.*", command[0]):
                        command.pop(0)
                    if command:
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


class Stop(Exception):
    """A command reached the point where it would start working: its options parsed."""


def sweep_jobs(overrides: list[str], rows: dict | None = None) -> list[list[str]]:
    """The jobs of a sweep, as Hydra's basic sweeper orders and merges them: an experiment's own rows
    (``hydra.sweeper.params``, first value only: tests/test_configs.py composes every row) first, then the
    command line's overrides, a later one of a key replacing the earlier in place. Job i takes value i of each
    command-line sweep (cycling the shorter ones), so every value of every sweep is composed once."""
    parser = OverridesParser.create()
    merged: dict[str, list[str]] = {}
    for first_only, lines in [(True, [f"{k}={v}" for k, v in (rows or {}).items()]), (False, overrides)]:
        for o in parser.parse_overrides(lines):
            key = o.get_key_element()
            sweep = o.is_sweep_override()
            values = list(o.sweep_string_iterator()) if sweep else [o.get_value_element_as_str()]
            merged[key] = [f"{key}={v}" for v in values[: 1 if first_only else None]]
    width = max((len(v) for v in merged.values()), default=1)
    return [[v[i % len(v)] for v in merged.values()] for i in range(width)]


def check_run(args: list[str]) -> None:
    """``python -m rag_lab.run *args`` up to its first piece of work (see the module's docstring)."""
    args = runner.soften(args)
    multirun = "-m" in args or "--multirun" in args
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    flags = [a for a in overrides if a.startswith("-")]
    assert not flags, f"no dry check for the runner's flag {flags[0]}"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        first = compose("config", overrides=sweep_jobs(overrides)[0], return_hydra_config=True)
        multirun = multirun or str(first.hydra.mode) == "RunMode.MULTIRUN"
        jobs = sweep_jobs(overrides, first.hydra.sweeper.params if multirun else None)
        if len(jobs) > 1 and not multirun:
            raise ValueError("a sweep needs -m: Hydra refuses a sweep in a single run")
        for job in jobs:
            cfg = compose("config", overrides=job, return_hydra_config=True)
            with open_dict(cfg):
                del cfg["hydra"]
            task = [o for o in job if not o.lstrip("+~").startswith("hydra")]
            runner.check_row_overrides([o.removeprefix("++") for o in task])
            runner.check_below_interpolations(task, lambda without: compose("config", overrides=without))
            runner.drop_inapplicable(cfg, task)
            runner.validate(cfg)
            runner.check_judge(cfg)


def check_command(module: str, args: list[str], capfd, monkeypatch) -> None:
    """``python -m rag_lab.<module> *args`` in this process until it builds a component or has parsed its
    options; its own error line (exit status not 0) fails the check."""
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *a, **k):
        parse_args(self, *a, **k)
        raise Stop

    def stop(*a, **k):
        raise Stop

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(hydra.utils, "instantiate", stop)
    try:
        code, out = cli(module.removeprefix("rag_lab."), args, capfd, monkeypatch)
    except Stop:
        return
    if code != 0:
        raise ValueError(out.strip().splitlines()[-1] if out.strip() else f"exit status {code}")


def check_make(args: list[str]) -> None:
    done = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ValueError(done.stderr.strip().splitlines()[-1])


def check(command: list[str], capfd, monkeypatch) -> None:
    program = Path(command[0]).name
    if program in SKIPPED:
        return
    if program == "make":
        return check_make(command[1:])
    if program == "rag-lab":  # the console script: rag-lab <command> ... is python -m rag_lab.<command> ...
        from rag_lab.__main__ import COMMANDS

        if command[1:2] and command[1] in COMMANDS:
            return check(["python", "-m", f"rag_lab.{command[1]}", *command[2:]], capfd, monkeypatch)
        return check_command("rag_lab.__main__", command[1:], capfd, monkeypatch)
    if re.fullmatch(r"python3?(\.\d+)?", program) and command[1:2] == ["-m"] and len(command) > 2:
        module, args = command[2], command[3:]
        if module == "rag_lab.run":
            return check_run(args)
        if module.startswith("rag_lab."):
            return check_command(module, args, capfd, monkeypatch)
    raise ValueError(f"no check for '{program}': give it one in tests/test_readme.py, or add it to SKIPPED")


COMMANDS = readme_commands(README.read_text())


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c)[:60] for c in COMMANDS])
def test_every_readme_command_parses(command, capfd, monkeypatch):
    try:
        check(command, capfd, monkeypatch)
    except Exception as e:  # noqa: BLE001 - the failure names the command and its first line of error
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        pytest.fail(f"README.md: `{shlex.join(command)}` does not parse: {type(e).__name__}: {message}")


def test_the_readme_has_the_commands_it_promises():
    """The set-up commands, the real-data / GPU / cluster block and the cluster command are there to check."""
    lines = [shlex.join(c) for c in COMMANDS]
    assert ["make", "demo"] in COMMANDS and ["make", "test"] in COMMANDS, lines
    cluster = [line for line in lines if "hydra/launcher=slurm" in line and "num_machines=2" in line]
    assert cluster, lines
    assert sum(c[0].endswith("python") for c in COMMANDS) >= 5, lines


def test_commands_are_read_as_the_shell_reads_them():
    text = (
        "```bash\nA=1 make demo   # comment\ncd x && .venv/bin/python -m rag_lab.run -m seed=0,1 \\\n"
        "    'policy=dapo'\n```\n```python\nnot = 'a command'\n```\n"
    )
    assert readme_commands(text) == [
        ["make", "demo"],
        ["cd", "x"],
        [".venv/bin/python", "-m", "rag_lab.run", "-m", "seed=0,1", "policy=dapo"],
    ]
    assert sweep_jobs(["seed=0,1,2", "policy=dapo", "data=synth,synth_easy"]) == [
        ["seed=0", "policy=dapo", "data=synth"],
        ["seed=1", "policy=dapo", "data=synth_easy"],
        ["seed=2", "policy=dapo", "data=synth"],
    ]
    # the experiment's rows first, at their first value; the command line's value of a row's key wins
    rows = {"policy": "fixed_iter,stoprag", "experiment/x": "a,b", "policy.stages": "[1,2],[]"}
    assert sweep_jobs(["experiment/x=b", "seed=1"], rows) == [
        ["policy=fixed_iter", "experiment/x=b", "policy.stages=[1,2]", "seed=1"]
    ]


def test_a_rag_lab_line_is_checked_as_its_command(capfd, monkeypatch):
    check(["rag-lab", "--help"], capfd, monkeypatch)
    check([".venv/bin/rag-lab", "score", "predictions=p.jsonl"], capfd, monkeypatch)  # up to its first build
    with pytest.raises(ValueError, match="^error: rag-lab: unknown command 'evaluate'"):
        check(["rag-lab", "evaluate"], capfd, monkeypatch)
    with pytest.raises(MissingConfigException, match="'policy/nope'"):  # checked as the runner's line
        check(["rag-lab", "run", "policy=nope"], capfd, monkeypatch)
