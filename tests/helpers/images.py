"""slurm-ext's images, built from the checkout into the suite's own Docker engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]

#: the Debian suite the container tests build on (sid: Slurm 26.05, what Slinky 1.2 needs); trixie
#: (Slurm 24.11) with SLURM_EXT_TEST_IMAGE_SUITE=trixie
IMAGE_SUITE = os.environ.get("SLURM_EXT_TEST_IMAGE_SUITE", "sid")
#: the suite's mirror is a snapshot (sid's Release of 2026-10-30, whose Valid-Until is a week later): apt takes it
#: up to this many days after its Date, and nothing older (containers/Dockerfile's APT_RELEASE_MAX_AGE)
APT_RELEASE_MAX_AGE_DAYS = 365


class ImageBuild:
    """The suite's Docker engine (tests/docker_engine.py; with SLURM_EXT_TEST_DOCKER_HOST, that engine instead,
    left running) and the images built into it from this checkout, from a debootstrap base, as a user without a
    registry would.

    The build takes about two minutes, mostly downloads and disk: `pytest_collection_finish` starts it in the
    background when a selected test needs the images, so the tests that run meanwhile (the accounting clusters,
    first in the order, mostly waiting on Slurm and MariaDB) hide its time. Stopped at the session's end.
    """

    def __init__(self, suite: str = IMAGE_SUITE, engine_of: ImageBuild | None = None) -> None:
        #: the Debian suite the images are built on
        self.suite = suite
        #: another build whose engine this one builds into (and leaves to it to stop)
        self.engine_of = engine_of
        self.engine = None
        self.process: subprocess.Popen | None = None
        self.output = None
        self.started = 0.0
        #: under xdist: this worker collected a test that needs the images (started by the side's first test)
        self.wanted = False

    def start_engine(self):
        if self.engine_of is not None:
            return self.engine_of.start_engine()
        if self.engine is None:
            from docker_engine import Engine  # tests/docker_engine.py
            host = os.environ.get("SLURM_EXT_TEST_DOCKER_HOST")
            self.engine = Engine.existing(host) if host else Engine().start()
        return self.engine

    def start(self) -> None:
        if self.process is None:
            engine = self.start_engine()
            self.output = tempfile.TemporaryFile()
            self.started = time.monotonic()
            self.process = subprocess.Popen(
                [sys.executable, str(CHECKOUT / "containers" / "build.py"), "--suite", self.suite,
                 "--apt-release-max-age", str(APT_RELEASE_MAX_AGE_DAYS)],
                env=engine.environ(), stdout=self.output, stderr=subprocess.STDOUT, start_new_session=True)

    def images(self) -> dict[str, str]:
        """image name (containers/build.py's IMAGES) -> tag, once the build has ended well."""
        self.start()
        code = self.process.wait(timeout=1200)
        self.output.seek(0)
        said = self.output.read().decode(errors="replace")
        assert code == 0, said[-6000:]
        print(f"{self.suite}'s images built in {time.monotonic() - self.started:.0f} s (in the background)",
              file=sys.stderr)
        sys.path.insert(0, str(CHECKOUT / "containers"))
        from build import IMAGES  # containers/build.py
        return {name: f"slurm-ext-{name}:{self.suite}" for name in IMAGES}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:  # the session ended before it did
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.output is not None:
            self.output.close()
        if self.engine is not None:
            self.engine.stop()
