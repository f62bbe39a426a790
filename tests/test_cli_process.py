"""The `llm-assets` processes the tests start (tests/cli_process.py) behave as the command run
from a shell does: their own exit status, output, environment, working directory and pid to
kill, a terminal when given one, and llm_assets imported under their own environment."""

import os
import pty
import select
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from tests import cli_process
from tests.cli_process import CLI
from tests.harness import review_spec


def test_exit_status_and_output_are_the_commands(tmp_path: Path) -> None:
    env = {**os.environ, "LLM_ASSETS_HOME": str(tmp_path), "LLM_ASSETS_PIPELINES": str(tmp_path)}

    forked = cli_process.run(
        [CLI, "status", "nope", "--date", "2026-11-02"], env=env, capture_output=True, text=True
    )
    started = subprocess.run(
        [CLI, "status", "nope", "--date", "2026-11-02"], env=env, capture_output=True, text=True
    )

    assert (forked.returncode, forked.stdout, forked.stderr) == (
        started.returncode,
        started.stdout,
        started.stderr,
    )
    assert forked.returncode == 1 and "no pipeline specs" in forked.stderr


def test_environment_and_working_directory_are_the_childs(tmp_path: Path) -> None:
    """PYTHONPATH and the folder of one command reach that command only: a spec naming a
    pandera rule in a module on its PYTHONPATH, given by a path relative to its folder."""
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "rules_here.py").write_text(
        "import pandera.pandas as pa\n\n\nclass Model(pa.DataFrameModel):\n    pass\n"
    )
    spec = review_spec("openai", "gpt-4o-mini", output={"pandera_model": "rules_here:Model"})
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LLM_ASSETS_PRICES")}

    def check(**extra: str) -> subprocess.CompletedProcess[str]:
        return cli_process.run(
            [CLI, "validate-spec", "spec.yaml"],
            env=env | extra,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )

    found, missing = check(PYTHONPATH=str(rules)), check()

    assert found.returncode == 0, found.stdout + found.stderr
    assert missing.returncode == 1 and "rules_here" in missing.stdout + missing.stderr
    assert "rules_here" not in sys.modules


def test_a_killed_command_reports_the_signal_and_a_terminal_is_seen_as_one() -> None:
    main, child = pty.openpty()
    process = cli_process.Popen(
        [CLI, "eval", "--help"], stdin=child, stdout=child, stderr=child, env=dict(os.environ)
    )
    os.close(child)
    shown = b""
    while select.select([main], [], [], 60)[0]:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the terminal closed with the child
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    assert process.wait(timeout=60) == 0
    assert b"Usage: llm-assets eval" in shown

    waiting = cli_process.Popen(
        [CLI, "run", "support_tickets", "--date", "2026-11-02", "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "LLM_ASSETS_HOME": str(Path(sys.prefix) / "no-such-home")},
    )
    waiting.send_signal(signal.SIGKILL)
    assert waiting.wait(timeout=60) == -signal.SIGKILL
    waiting.communicate()
