"""The `llm-assets` processes the tests start (tests/cli_process.py) behave as the command run
from a shell does: their own exit status, output, environment, working directory and pid to
kill, and llm_assets imported under their own environment."""

import os
import signal
import socket
import subprocess
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


def test_a_killed_command_reports_the_signal(tmp_path: Path) -> None:
    """Killed while it waits for its ledger (a socket that takes the connection and never
    answers): -SIGKILL, as subprocess reports it. Commands on a terminal are
    tests/test_cli_width.py's."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        env = {
            **os.environ,
            "LLM_ASSETS_HOME": str(tmp_path),
            "LLM_ASSETS_DATABASE_URL": f"postgresql+psycopg2://nobody@127.0.0.1:{port}/ledger",
        }
        waiting = cli_process.Popen(
            [CLI, "status", "support_tickets", "--date", "2026-11-02"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        silent.settimeout(120)
        connection, _ = silent.accept()  # the command now waits for the ledger's answer
        waiting.kill()
        assert waiting.wait(timeout=60) == -signal.SIGKILL
        waiting.communicate()
        connection.close()
