"""One acceptance test in a process of its own: `python -I -m slurm_ext.acceptance.child`.

The parent (slurm_ext.acceptance.runner) writes the request as JSON on stdin and kills this
process's group at the test's deadline; the answer is one JSON object on stdout. A GPU fault, a
crashing libcuda or a hung driver call ends this process, never the node agent.

Request: {"test", "level", "config", "deadline"} (the profile comes from the config); answer: {"profile", "profile_note", "results"} or
{"not_applicable": why} or {"error": why}.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback

__all__ = ["main"]


def _answer(request: dict) -> dict:
    from slurm_ext import config as config_module

    from .catalog import TESTS, Given
    from .profiles import choose
    from .records import NotApplicable, TestError

    spec = TESTS[request["test"]]
    loaded = config_module.load(request["config"] or None)
    settings = loaded.acceptance
    profile, note = choose(settings.profile)
    given = Given(request["level"], settings.limits(spec.name, profile.limits), settings, profile.name,
                  float(request["deadline"]), loaded.node.state_dir)
    module, function = spec.entry.split(":")
    try:
        results = getattr(importlib.import_module(f"slurm_ext.acceptance.{module}"), function)(given)
    except NotApplicable as why:
        return {"profile": profile.name, "profile_note": note, "not_applicable": str(why)}
    except TestError as why:
        return {"profile": profile.name, "profile_note": note, "error": str(why)}
    return {"profile": profile.name, "profile_note": note, "results": [r.to_json() for r in results]}


#: how often the child looks whether its parent (the runner) is still there
_ORPHAN_CHECK = 0.5


def _die_with_parent() -> None:
    """The runner kills this test's process group at its deadline; if the runner itself dies first (the agent
    killed, slurmd's HealthCheckTimeout), nothing would: the test and what it started then kill their own group.
    A thread, not a signal handler: the main thread may be stuck in a driver call that no handler interrupts."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_ORPHAN_CHECK)
        if os.getpgrp() == os.getpid():  # the runner made it a group of its own: all of it
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def main() -> int:
    _die_with_parent()
    try:
        answer = _answer(json.loads(sys.stdin.read()))
    except Exception as err:  # the test's own bug or a library's: an error result, with its traceback for the log
        traceback.print_exc(file=sys.stderr)
        answer = {"error": f"the test crashed: {type(err).__name__}: {err}"}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
