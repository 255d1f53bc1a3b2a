"""CPU topology from sysfs, for the Cores= of gres.conf: `read_topology`, `core_indexes`.

NVML's nvmlDeviceGetCpuAffinity names the CPUs near a GPU as a bitmask of OS
logical CPU ids, hyper-threads included. gres.conf's Cores= wants something
else: Slurm's *abstract* core indexes. Slurm counts physical cores socket by
socket (every core of the first socket, then every core of the next) and
ignores threads, so a core's sibling hyper-threads share one index. The two
numberings disagree on every hyper-threaded machine, and differently on
different machines:

- on many two-socket x86 servers OS CPUs 0..N-1 are the first thread of every
  core (socket 0's cores, then socket 1's) and N..2N-1 the second threads in
  the same order, so CPU 0 and CPU N are one core;
- on others siblings are adjacent: CPUs 2k and 2k+1 are one core.

Writing the OS ids into Cores= would bind GPUs to the wrong cores (or to
indexes past the end, which slurmd rejects), so the kernel's own answer is
read from /sys/devices/system/cpu and turned into Slurm's numbering here.

Slurm takes its numbering from hwloc, whose logical order sorts objects by the
CPUs they hold: packages, then dies within a package, then cores within a die,
each by its lowest OS CPU id. `read_topology` orders cores the same way; on
ordinary machines that is also package id, die id, core_id order.

`cpus_from_masks` unpacks NVML's affinity words, `ranges` writes Slurm's
"0-3,8-9" list syntax.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from slurm_ext.errors import SlurmExtError

__all__ = ["CpuTopology", "TopologyError", "read_topology", "core_indexes", "cpus_from_masks", "ranges"]

SYS = Path("/sys")

#: where the kernel lists CPUs, relative to the sysfs root
_CPU_DIR = Path("devices/system/cpu")


class TopologyError(SlurmExtError):
    """The kernel's CPU topology in sysfs is missing, unreadable or malformed.

    Without it no Cores= can be written for gres.conf, so the caller should
    say so rather than guess; `path` names the file that failed.
    """

    def __init__(self, path: Path, problem: str):
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem} (slurm-ext reads the CPU topology from sysfs to write gres.conf Cores=)")


@dataclass(frozen=True, slots=True)
class CpuTopology:
    """How the online OS CPUs fold into Slurm's abstract cores.

    `core_of` is a read-only mapping, so a `CpuTopology` compares by value but
    cannot be hashed.
    """

    #: OS logical CPU id -> Slurm abstract core index, for every online CPU
    core_of: Mapping[int, int]
    #: physical packages holding an online CPU (Slurm's Sockets=)
    sockets: int
    #: physical cores holding an online CPU, all sockets together (Slurm's core count)
    cores: int
    #: the most online hardware threads on any one core (Slurm's ThreadsPerCore=)
    threads_per_core: int


def read_topology(sys_root: Path = SYS) -> CpuTopology:
    """Read which core of which socket each online CPU is, and number the cores as Slurm does.

    Reads <sys_root>/devices/system/cpu/online, then for every online CPU N
    cpuN/topology/physical_package_id, core_id and die_id (taken as 0 where the
    kernel predates dies). A core is one (package, die, core_id); core_id is
    only unique within its package and die, and need not be contiguous (some
    Xeons give 0-3,8-11), so only its identity is used, never its value.
    Offline CPUs are skipped: their topology files may be absent, and Slurm
    does not count them either.

    Raises:
        TopologyError: a file is missing, unreadable or not what the kernel writes.
    """
    cpu_dir = sys_root / _CPU_DIR
    online_path = cpu_dir / "online"
    online = _parse_list(_read(online_path), online_path)
    if not online:
        raise TopologyError(online_path, "lists no online CPUs")

    # (package, die, core_id) of every online CPU
    place: dict[int, tuple[int, int, int]] = {}
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        package = _read_int(topo / "physical_package_id")
        die_path = topo / "die_id"
        die = _read_int(die_path) if die_path.exists() else 0
        place[cpu] = (package, die, _read_int(topo / "core_id"))

    # hwloc's order: each package, die and core by the lowest CPU it holds
    first: dict[tuple[int, ...], int] = {}
    for cpu in online:  # ascending, so the first CPU seen is the lowest
        package, die, core = place[cpu]
        for key in ((package,), (package, die), (package, die, core)):
            first.setdefault(key, cpu)
    distinct = {place[cpu] for cpu in online}
    ordered = sorted(distinct, key=lambda p: (first[p[:1]], first[p[:2]], first[p]))
    index = {p: i for i, p in enumerate(ordered)}

    threads: dict[tuple[int, int, int], int] = {}
    for p in place.values():
        threads[p] = threads.get(p, 0) + 1
    return CpuTopology(
        core_of=MappingProxyType({cpu: index[place[cpu]] for cpu in online}),
        sockets=len({p[0] for p in distinct}),
        cores=len(distinct),
        threads_per_core=max(threads.values()),
    )


def core_indexes(cpus: Iterable[int], topology: CpuTopology) -> list[int]:
    """The sorted, distinct Slurm core indexes that hold `cpus`.

    Both threads of a core give its one index. CPUs the topology does not know
    (offline now, or past the end of an NVML mask) are ignored: Slurm cannot
    schedule on them, so they belong in no Cores= list.
    """
    return sorted({topology.core_of[cpu] for cpu in cpus if cpu in topology.core_of})


def cpus_from_masks(words: Sequence[int], word_bits: int = 64) -> list[int]:
    """The OS CPU ids set in NVML's CPU affinity array, ascending.

    nvmlDeviceGetCpuAffinity returns unsigned longs, least significant word
    first: bit b of word w is CPU w * word_bits + b.

    Raises:
        ValueError: `word_bits` is not positive, or a word does not fit in it.
    """
    if word_bits <= 0:
        raise ValueError(f"word_bits must be positive, not {word_bits}")
    cpus = []
    for w, word in enumerate(words):
        if not 0 <= word < 1 << word_bits:
            raise ValueError(f"affinity word {w} is {word:#x}, not an unsigned {word_bits}-bit value")
        bit = 0
        while word:
            if word & 1:
                cpus.append(w * word_bits + bit)
            word >>= 1
            bit += 1
    return cpus


def ranges(numbers: Iterable[int]) -> str:
    """Numbers in Slurm's list syntax: [0, 1, 2, 3, 8, 9] -> "0-3,8-9"; none -> "".

    Duplicates and order do not matter; a lone number stays bare ("5").
    """
    out = []
    start = end = None
    for n in sorted(set(numbers)):
        if end is not None and n == end + 1:
            end = n
            continue
        if start is not None:
            out.append(_span(start, end))
        start = end = n
    if start is not None:
        out.append(_span(start, end))
    return ",".join(out)


def _span(start: int, end: int) -> str:
    return str(start) if start == end else f"{start}-{end}"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as err:
        raise TopologyError(path, f"cannot read: {err.strerror or err}") from err


def _read_int(path: Path) -> int:
    text = _read(path)
    try:
        return int(text.strip())
    except ValueError:
        raise TopologyError(path, f"holds {text.strip()!r}, not an integer") from None


def _parse_list(text: str, path: Path) -> list[int]:
    """The kernel's CPU list ("0-63,128-191"), expanded and ascending."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high if sep else low)
        except ValueError:
            raise TopologyError(path, f"holds {text.strip()!r}, not a CPU list like '0-63,128-191'") from None
        if first < 0 or last < first:
            raise TopologyError(path, f"holds the range {part!r}, which runs backwards or below 0")
        cpus.update(range(first, last + 1))
    return sorted(cpus)
