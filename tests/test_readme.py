"""The README's quickstart commands are the ones CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Quickstart.*?```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README.md has no Quickstart code block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_quickstart_has_exactly_two_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "triton-mla-sparse demo" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in [line.strip() for line in ci]
