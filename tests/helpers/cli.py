"""The real `slurm-ext` command line, run as a child process (as root, or as nobody)."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `slurm-ext` CLI in a child process."""
    return subprocess.run([sys.executable, "-m", "slurm_ext.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def cli_as_nobody(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the CLI's main() as user nobody; return (exit status, standard error, with the traceback of anything it
    raised). `env`: added to its environment (a node's, so that it does not exec itself again to get it).

    It runs in a forked child: root bypasses file permissions, and nobody
    cannot reach a Python installed under /root to start a new one.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody, run the CLI, report on the pipe
        code = 99
        try:
            os.dup2(write_end, 2)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            os.environ.update(env or {})
            os.setgid(65534)
            os.setuid(65534)
            from slurm_ext import cli as slurm_ext_cli
            code = slurm_ext_cli.main(list(args))
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        stderr = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stderr
