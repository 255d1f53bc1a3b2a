"""One acceptance test run as the runner runs it: `python -I -m slurm_ext.acceptance.child`, a request on its
stdin, its JSON answer on its stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: the child's command line, as slurm_ext.acceptance.runner starts it
CHILD = (sys.executable, "-I", "-m", "slurm_ext.acceptance.child")


def ask_child(config: Path, test: str, level: str, deadline: float, env: dict, *, command=CHILD,
              cwd: Path | None = None, timeout: float = 120) -> dict:
    """The child's answer to `test` at `level` under the config file `config`, in environment `env`; it must exit
    0 (it answers its errors in JSON) and must not have crashed."""
    request = {"test": test, "level": level, "config": str(config), "deadline": deadline}
    proc = subprocess.run(list(command), input=json.dumps(request), env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert "crashed" not in answer.get("error", ""), proc.stderr
    return answer


def by_target(answer: dict) -> dict[str, dict]:
    """An answer's results by their target ("gpu 0", an interface, a path)."""
    assert "results" in answer, answer
    return {r["target"]: r for r in answer["results"]}


def figure(result: dict, name: str) -> dict:
    return next(f for f in result["figures"] if f["name"] == name)
