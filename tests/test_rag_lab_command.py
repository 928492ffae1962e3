"""``rag-lab <command>``: the console script runs each command as ``python -m rag_lab.<command>`` does."""

import subprocess
import sys

import pytest

from rag_lab.__main__ import COMMANDS, main
from rag_lab.core.cache import PACKAGE_DIR

from conftest import TINY_DATA


def test_help_lists_every_command_with_its_line():
    done = subprocess.run([sys.executable, "-m", "rag_lab", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == ""
    listed = {
        line.split()[0]: line.split(None, 1)[1] for line in done.stdout.splitlines() if line.startswith("  ")
    }
    assert listed == COMMANDS
    # every command module of the top level has its subcommand
    modules = {p.stem for p in PACKAGE_DIR.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert modules <= set(COMMANDS), modules - set(COMMANDS)


def test_run_prints_the_same_config_as_python_m(tmp_path):
    """Hydra's command line through ``rag-lab run``: the composed job, and Hydra's own config (the job's
    name, the config sources, the run dir), equal ``python -m rag_lab.run``'s."""
    args = [
        *TINY_DATA,
        "policy=fixed_iter",
        "generator=teacher",
        f"hydra.run.dir={tmp_path}/run",
        "--cfg",
        "all",
    ]
    both = [
        subprocess.Popen(
            [sys.executable, *prefix, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for prefix in (["-m", "rag_lab", "run"], ["-m", "rag_lab.run"])
    ]
    (script, script_err), (module, module_err) = (p.communicate(timeout=120) for p in both)
    assert [p.returncode for p in both] == [0, 0], script_err + module_err
    assert script == module
    assert "  job:\n    name: run\n" in script and "policy:\n  _target_: rag_lab.policies" in script


def test_an_unknown_command_is_one_line(capsys):
    with pytest.raises(SystemExit) as done:
        main(["evaluate", "x=1"])
    err = capsys.readouterr().err
    assert done.value.code == 1 and err.count("\n") == 1
    assert err.startswith("error: rag-lab: unknown command 'evaluate' (commands: quickstart, run, report")


def test_a_command_this_install_lacks_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(COMMANDS, "absent", "a command whose module is not here")
    with pytest.raises(SystemExit) as done:
        main(["absent"])
    err = capsys.readouterr().err
    assert done.value.code == 1
    lacks = "'absent' is not in this install of rag_lab (no module rag_lab.absent); update rag_lab"
    assert err == f"error: rag-lab: {lacks}\n"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # runpy: rag_lab.report may be imported already
def test_the_command_gets_its_own_arguments_and_argv_is_restored(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rag-lab", "report", "--help"])
    with pytest.raises(SystemExit) as done:
        main()
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: python -m rag_lab.report [-h]")
    assert sys.argv == ["rag-lab", "report", "--help"]
