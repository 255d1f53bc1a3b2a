#!/usr/bin/env python3
"""Benchmark: `accounting backup`, `verify` and `restore` against a bare `mariadb-dump --single-transaction`.

A scratch MariaDB (scratch.scratch_mariadb, TCP on a free port of 33300-33399)
is filled with N synthetic jobs shaped like slurmdbd's job table, and 3 steps
each (the test suite's tables and rows: quotes, parentheses, backslashes,
NULLs, binary). Then, in the same run and against the same database:

- bare: `mariadb-dump --single-transaction --quick` of it into a file beside
  the backups, the least any consistent dump costs;
- backup(): the same dump plus the row counter, gzip, sha256, fsync, the
  manifest and retention;
- verify(): the backup's checks, a new scratch MariaDB, the load, and
  SELECT COUNT(*) of every table;
- restore(): the backup's checks, the connection's grants and the target's
  emptiness, the load into a new database of the same server (as slurm, with
  rights on that database only), and the counts.

Each is the median of --runs runs. Printed: seconds, and the ratios
backup / bare and (backup + verify) / bare.

Run as root: python tests/benchmarks/bench_accounting_backup.py [--quick] [--jobs N] [--runs R]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_accounting_backup import (CLUSTER, DB, PASSWORD, add_user, as_slurm, fill_sql, free_port,  # noqa: E402
                                    make_config, programs_sql, schema_sql)

from slurm_ext.accounting import backups, scratch  # noqa: E402
from slurm_ext.accounting.sqlclient import quote_option  # noqa: E402


def note(text: str) -> None:
    """Progress, on stderr: stdout holds the figures."""
    print(f"# {time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def timed(fn, runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bare_dump(server: scratch.ScratchMariaDB, root: Path, target: Path) -> int:
    """mariadb-dump --single-transaction --quick into `target`, as slurm over TCP; its size."""
    options = root / "bare.cnf"
    options.write_text(f"[client]\nuser=slurm\npassword={quote_option(PASSWORD)}\nhost=127.0.0.1\n"
                       f"port={server.port}\nprotocol=TCP\n")
    options.chmod(0o600)
    with open(target, "wb") as out:
        subprocess.run(["mariadb-dump", f"--defaults-file={options}", "--single-transaction", "--quick", DB],
                       stdout=out, check=True, timeout=3600)
    return target.stat().st_size


def only_on(server: scratch.ScratchMariaDB, database: str) -> None:
    """slurm may write `database` and nothing else (what restore asks of its connection)."""
    server.sql("".join(f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM 'slurm'@'{host}';\n"
                       f"GRANT ALL ON `{database}`.* TO 'slurm'@'{host}';\nGRANT PROCESS ON *.* TO 'slurm'@'{host}';\n"
                       for host in ("127.0.0.1", "localhost", "%")))


def restore_into(server: scratch.ScratchMariaDB, root: Path, source: Path, database: str) -> object:
    only_on(server, database)
    return backups.restore(make_config(root, server, database=database), source, environ={})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 jobs, one run each")
    parser.add_argument("--jobs", type=int, help="jobs in the database (default 100,000; --quick 10,000)")
    parser.add_argument("--runs", type=int, help="runs of each, the median is printed (default 3; --quick 1)")
    args = parser.parse_args()
    jobs = args.jobs or (10_000 if args.quick else 100_000)
    runs = args.runs or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="slurm-ext-bench-backup-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # verify's scratch MariaDB, run as mysql, lives in it
        note(f"starting a scratch MariaDB and filling it with {jobs} jobs, {3 * jobs} steps")
        with scratch.scratch_mariadb(port=free_port(), buffer_pool_mib=512) as server:
            server.sql(f"CREATE DATABASE {DB};")
            add_user(server)
            server.sql(schema_sql(CLUSTER), DB)
            as_slurm(server, root, programs_sql(CLUSTER), DB)
            start = time.perf_counter()
            for first in range(1, jobs + 1, 50_000):
                server.sql(fill_sql(CLUSTER, first, min(jobs, first + 49_999), pad=0), DB, timeout=3600)
            note(f"filled in {time.perf_counter() - start:.1f}s")
            config = make_config(root, server)
            note("bare mariadb-dump")
            bare, text_size = timed(lambda: bare_dump(server, root, root / "bare.sql"), runs)
            (root / "bare.sql").unlink()
            note("backup()")
            ours, result = timed(lambda: backups.backup(config, root / "backups", keep=1, environ={}), runs)
            note("restore()")
            targets = iter(range(runs))
            back, restored = timed(lambda: restore_into(server, root, result.path, f"r_bench{next(targets)}"), runs)
            assert restored.tables == result.manifest.tables
        note("verify()")
        check, verified = timed(lambda: backups.verify(result.path, config.accounting.backup_key, workdir=root), runs)
        assert verified.ok, verified.problems
    tables = result.manifest.tables
    print(f"database: {tables[f'{CLUSTER}_job_table']:,} jobs, {tables[f'{CLUSTER}_step_table']:,} steps, "
          f"{result.manifest.rows:,} rows; dump {text_size / 2**20:.1f} MiB of text, backup "
          f"{result.manifest.size / 2**20:.1f} MiB gzip (level {backups.COMPRESS_LEVEL}); median of {runs}")
    print(f"{'':24} {'seconds':>8} {'ratio':>7}")
    print(f"{'bare mariadb-dump':24} {bare:8.2f} {1.0:7.2f}")
    print(f"{'backup()':24} {ours:8.2f} {ours / bare:7.2f}")
    print(f"{'verify()':24} {check:8.2f} {check / bare:7.2f}")
    print(f"{'backup() + verify()':24} {ours + check:8.2f} {(ours + check) / bare:7.2f}")
    print(f"{'restore()':24} {back:8.2f} {back / bare:7.2f}")


if __name__ == "__main__":
    main()
