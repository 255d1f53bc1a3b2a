"""The CLI's help says what each command does (issue 29.7: `dev down` and `dev status` took --nodes, with up's
help, though they cover every node an earlier `dev up` made)."""

from __future__ import annotations

import subprocess
import sys


def _help(*words: str) -> str:
    done = subprocess.run([sys.executable, "-m", "slurm_ext.cli", *words, "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split())


def test_dev_down_and_status_say_what_they_do_and_take_no_node_count():
    up, down, status = _help("dev", "up"), _help("dev", "down"), _help("dev", "status")
    assert "--nodes N" in up
    assert "--nodes" not in down and "--nodes" not in status
    assert "every node" in down and "each node" in status
    descriptions = [text.split("options:")[0].split("]")[-1] for text in (up, down, status)]
    assert len(set(descriptions)) == 3, descriptions
