"""What NVML says this node's GPUs are, in the order Slurm numbers them: `read_inventory`.

Main API:

- `read_inventory(...)` asks NVML for every GPU: name, UUID, PCI bus id,
  device minor, CPU affinity, NVLinks and MIG devices, and returns an
  `Inventory` ordered by PCI bus id. That is the order Slurm's own
  AutoDetect=nvml uses and the order in which NVML numbers GPUs by default,
  so gres.conf index k, CUDA's device k and NVML's index k agree. Device
  minors need not follow it (/dev/nvidia0 can be the seventh GPU on the bus),
  which is why every GPU carries its own `device` path.
- `slurm_type(name, types)` is the gres Type= of a GPU name: the operator's
  mapping first, else Slurm's AutoDetect rule (lower-case, spaces to "_"),
  so a hand-written slurm.conf `Gres=gpu:<type>:N` can be matched either way.
- `to_json` / `from_json` persist an inventory between starts, so the next
  start can tell what changed.

The reader is forgiving about single GPUs and strict about NVML as a whole:
if NVML cannot start (no driver, no library) nothing can be said and
`GresError` is raised; a GPU that fails while being read (lost, Xid 79, reset
required) is left out and described in `Inventory.lost`, so the healthy GPUs
still reach gres.conf; things that make a line of gres.conf wrong without
hiding a GPU (a missing /dev file, an unmapped GPU name, no MIG caps file)
become `Inventory.problems` lines for the operator.

Every pynvml exception is translated here; none leaves this module. Loading
pynvml, its exception types, its strings and its init come from the core
adapter `slurm_ext.nvml`.

NVML is initialised for each read and shut down after it
(`slurm_ext.nvml.session`), unlike the per-job GPU checks, which keep it
initialised: the inventory is read once per slurmd start, so an init per read
costs little, and the read leaves no NVML state behind (NVML counts inits, so
the agent's own init stays in force). The reads run on the caller's thread,
without the per-job checks' worker and timeout: no job waits on a node start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurm_ext import nvml as nvml_adapter
from slurm_ext.errors import SlurmExtError

from .topology import CpuTopology, TopologyError, core_indexes, cpus_from_masks, read_topology

__all__ = [
    "MigDevice",
    "InventoryGpu",
    "Inventory",
    "GresError",
    "slurm_type",
    "read_inventory",
    "to_json",
    "from_json",
]

#: Words of 64 CPUs asked of nvmlDeviceGetCpuAffinity: 4096 CPUs, more than
#: any node has. A short array would silently drop the high CPUs.
_AFFINITY_WORDS = 64

#: Links tried when pynvml does not say (NVML_NVLINK_MAX_LINKS of older NVML).
_DEFAULT_MAX_LINKS = 18

#: MIG device names end in the profile: "NVIDIA H200 MIG 1g.18gb", "... MIG 1c.2g.35gb".
_MIG_PROFILE = re.compile(r"\bMIG\s+(.+?)\s*$")

#: "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F" or "BB:DD.F", hexadecimal (as NVML and sysfs write them)
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")

#: Version of the to_json layout; from_json refuses others.
_FORMAT = 1


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG device (a compute instance of a GPU instance) of a GPU in MIG mode."""

    #: GPU instance id (the "gi" of the nvidia-caps minors)
    gpu_instance: int
    #: compute instance id within that GPU instance
    compute_instance: int
    #: MIG UUID ("MIG-..."), what CUDA_VISIBLE_DEVICES names
    uuid: str
    #: profile from the device name, e.g. "1g.18gb"; gres Type= is "<gpu type>_<profile>"
    profile: str
    #: device files a job needs (gres.conf MultipleFiles=): the GPU's /dev/nvidia<minor>,
    #: then the GPU instance's and the compute instance's nvidia-caps access files
    files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """One GPU as gres.conf needs it."""

    #: NVML's index (may differ from the position in the inventory when NVML does not order by bus)
    nvml_index: int
    #: device minor number: the GPU is /dev/nvidia<minor>
    minor: int
    #: NVML's product name, e.g. "NVIDIA H200"
    name: str
    #: gres Type= (see `slurm_type`)
    type: str
    #: GPU UUID ("GPU-..."), the identity that survives reboots and renumbering
    uuid: str
    #: PCI bus id as NVML writes it, e.g. "00000000:18:00.0"
    pci_bus_id: str
    #: "<dev_dir>/nvidia<minor>"
    device: str
    #: OS CPU ids NVML names as close to the GPU (empty: NVML does not say)
    cpus: tuple[int, ...]
    #: Slurm abstract core indexes holding `cpus` (empty: unknown)
    cores: tuple[int, ...]
    #: per GPU of the inventory, in inventory order: -1 for itself, else active NVLinks to it (0: none)
    links: tuple[int, ...]
    #: MIG devices when MIG mode is on (empty otherwise); then they, not the GPU, are the GRES
    mig: tuple[MigDevice, ...] = ()
    #: MIG mode is on: the GPU itself is no GRES, only its MIG devices are (possibly none)
    mig_mode: bool = False


@dataclass(frozen=True, slots=True)
class Inventory:
    """The node's GPUs, ordered by PCI bus id, with what could not be read."""

    #: NVIDIA driver version, e.g. "550.54.15"
    driver_version: str
    #: the GPUs that could be read, by PCI bus id
    gpus: tuple[InventoryGpu, ...]
    #: GPUs NVML could not read (lost, reset required, ...), one line each naming what is known of them
    lost: tuple[str, ...] = ()
    #: things that make gres.conf wrong or incomplete without hiding a GPU, one line each
    problems: tuple[str, ...] = ()
    #: Slurm cores on the node (0: topology unknown); a GPU whose `cores` are all of them needs no Cores=
    core_count: int = 0
    #: sockets on the node (0: unknown); Slurm >= 24.11 takes a Cores= of one whole socket or none
    socket_count: int = 0


class GresError(SlurmExtError):
    """NVML as a whole cannot be used (no library, driver not loaded, ...), or
    a stored inventory cannot be read back.

    `problem` says what failed, `nvml_code` is NVML's return code when there
    is one; the message adds what to do about it.
    """

    def __init__(self, problem: str, nvml_code: int | None = None):
        self.problem = problem
        self.nvml_code = nvml_code
        super().__init__(f"gres: {nvml_adapter.describe(problem, nvml_code)}")


def slurm_type(name: str, types: Mapping[str, str]) -> tuple[str, bool]:
    """The gres Type= for a GPU called `name`, and whether `types` had it.

    `types` maps exact NVML names to the types slurm.conf uses ("NVIDIA H200"
    -> "h200"). Without an entry the type is what Slurm's AutoDetect=nvml
    would write: the name lower-cased, spaces to "_" ("NVIDIA H200" ->
    "nvidia_h200"), nothing dropped, so a cluster that switches between
    AutoDetect and this generator keeps its types.
    """
    if name in types:
        return types[name], True
    return name.lower().replace(" ", "_"), False


def read_inventory(
    *,
    nvml: Any = None,
    dev_dir: Path = Path("/dev"),
    proc_root: Path = Path("/proc"),
    topology: CpuTopology | None = None,
    sys_root: Path = Path("/sys"),
    types: Mapping[str, str] = {},  # never modified, so a shared default is safe
) -> Inventory:
    """Read every GPU through NVML; see the module docstring for what is kept.

    `nvml` is the pynvml module (the default) or a stand-in with its
    interface. NVML is initialised for this call and shut down after it (the
    inventory is read once per start; NVML counts inits, so a long-lived
    caller's own init is not disturbed). `topology` is read from `sys_root`
    when not given; if sysfs cannot be read, Cores= is left out and a
    problem line says why. Device files are looked up in `dev_dir`, the MIG
    capability minors in `<proc_root>/driver/nvidia-caps/mig-minors`.
    `types` maps NVML names to gres types (see `slurm_type`); when it is not
    empty, a GPU name it lacks is a problem line.

    Raises:
        GresError: pynvml is not installed, NVML cannot be initialised (no
            library, driver not loaded, no permission, ...), or it cannot
            count the GPUs or tell the driver version.
    """
    nvml = _default_nvml() if nvml is None else nvml
    with nvml_adapter.session(nvml, lambda err: _translate(err, "cannot initialise NVML")):
        return _read(nvml, nvml_adapter.errors(nvml), dev_dir, proc_root, topology, sys_root, types)


def to_json(inventory: Inventory) -> str:
    """The inventory as JSON (one object, keys sorted, ends with a newline), for `from_json`."""
    data = {"format": _FORMAT, **dataclasses.asdict(inventory)}
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def from_json(text: str) -> Inventory:
    """The inventory `to_json` wrote.

    Raises:
        GresError: the text is not JSON or not this layout (a damaged or
            foreign file: remove it, the next start writes a new one).
    """
    try:
        data = json.loads(text)
        if data.get("format") != _FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {_FORMAT}")
        gpus = tuple(_gpu_from_dict(gpu) for gpu in data["gpus"])
        return Inventory(
            driver_version=_str(data["driver_version"]),
            gpus=gpus,
            lost=tuple(_str(line) for line in data["lost"]),
            problems=tuple(_str(line) for line in data["problems"]),
            core_count=_int(data["core_count"]),
            socket_count=_int(data.get("socket_count", 0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise GresError(f"stored inventory is not slurm-ext's format ({type(err).__name__}: {err}); "
                        "remove the file, the next start writes a new one") from err


# ---------------------------------------------------------------------------
# NVML plumbing
# ---------------------------------------------------------------------------


def _default_nvml() -> Any:
    """pynvml, or the adapter's "not installed" as a GresError."""
    try:
        return nvml_adapter.load()
    except nvml_adapter.NvmlUnavailable as err:
        raise GresError(err.problem) from err


def _translate(err: BaseException, doing: str) -> GresError:
    return GresError(f"{doing}: {err}", nvml_adapter.error_code(err))


@dataclass(frozen=True, slots=True)
class _Read:
    """One GPU as read, before ordering: its NVLinks are still by remote bus."""

    gpu: InventoryGpu
    #: numeric PCI key of the GPU (None: NVML's bus id did not parse)
    key: tuple[int, int, int, int] | None
    #: remote PCI key -> active NVLinks to it
    peers: dict[tuple[int, int, int, int], int]


def _read(nvml, errors, dev_dir, proc_root, topology, sys_root, types) -> Inventory:
    try:
        driver = nvml_adapter.text(nvml.nvmlSystemGetDriverVersion())
        count = int(nvml.nvmlDeviceGetCount())
    except errors as err:
        raise _translate(err, "NVML started but cannot list the GPUs") from err

    problems: list[str] = []
    if topology is None and count:
        try:
            topology = read_topology(sys_root)
        except TopologyError as err:
            problems.append(f"Cores= left out of every GPU line: {err}")
    mig_minors: dict[str, int] | None = None  # read on first MIG GPU

    read: list[_Read] = []
    lost: list[str] = []
    unmapped: dict[str, str] = {}
    for index in range(count):
        mine: list[str] = []  # this GPU's problems, dropped if it turns out lost
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            item, mig_on = _read_gpu(nvml, handle, index, dev_dir, topology, types)
            if mig_on:
                if mig_minors is None:
                    mig_minors = _read_mig_minors(proc_root, problems)
                item = _with_mig(nvml, handle, item, mig_minors, proc_root, mine)
        except errors as err:
            lost.append(_describe_lost(nvml, index, err))
            continue
        read.append(item)
        problems.extend(mine)
        if types and item.gpu.name not in types:
            unmapped.setdefault(item.gpu.name, item.gpu.type)
        problems.extend(_device_problems(item.gpu))

    for name, kind in unmapped.items():
        problems.append(f"gres types: no type for GPU name {name!r}; using {kind!r} (Slurm's AutoDetect rule); "
                        f"add {name!r} to gres.types if slurm.conf's Gres= uses another type")
    for item in read:
        if item.key is None:
            problems.append(f"{item.gpu.uuid}: PCI bus id {item.gpu.pci_bus_id!r} does not parse; "
                            "it is listed last and its NVLinks are not counted")

    read.sort(key=lambda r: (r.key is None, r.key or (0, 0, 0, 0), r.gpu.nvml_index))
    keys = [r.key for r in read]
    gpus = []
    for i, item in enumerate(read):
        links = tuple(-1 if j == i else (item.peers.get(key, 0) if key is not None else 0)
                      for j, key in enumerate(keys))
        gpus.append(dataclasses.replace(item.gpu, links=links))
    core_count, sockets = (topology.cores, topology.sockets) if topology is not None else (0, 0)
    return Inventory(driver, tuple(gpus), tuple(lost), tuple(problems), core_count, sockets)


def _read_gpu(nvml, handle, index: int, dev_dir: Path, topology: CpuTopology | None,
              types: Mapping[str, str]) -> tuple[_Read, bool]:
    """One GPU, and whether its MIG mode is on; NVML errors other than "not
    supported" propagate (a lost GPU)."""
    name = nvml_adapter.text(nvml.nvmlDeviceGetName(handle))
    uuid = nvml_adapter.text(nvml.nvmlDeviceGetUUID(handle))
    minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
    bus_id = nvml_adapter.text(nvml.nvmlDeviceGetPciInfo(handle).busId)

    words = nvml_adapter.optional(nvml, nvml.nvmlDeviceGetCpuAffinity, handle, _AFFINITY_WORDS, default=[])
    cpus = tuple(cpus_from_masks([int(w) for w in words]))
    cores = tuple(core_indexes(cpus, topology)) if topology is not None else ()

    mode = nvml_adapter.optional(nvml, nvml.nvmlDeviceGetMigMode, handle, default=[0, 0])
    kind, _ = slurm_type(name, types)
    gpu = InventoryGpu(index, minor, name, kind, uuid, bus_id, str(dev_dir / f"nvidia{minor}"), cpus, cores, ())
    return _Read(gpu, _pci_key(bus_id), _nvlink_peers(nvml, handle)), int(mode[0]) == 1


def _nvlink_peers(nvml, handle) -> dict[tuple[int, int, int, int], int]:
    """Active NVLinks by remote PCI bus. Links are numbered from 0; the first
    one NVML calls not supported or invalid is past the GPU's last link (a
    PCIe card fails on link 0). Links to NVSwitches count toward the switch's
    bus, which is no GPU of the inventory, as in Slurm's AutoDetect."""
    peers: dict[tuple[int, int, int, int], int] = {}
    stop = (nvml_adapter.NOT_SUPPORTED, nvml_adapter.INVALID_ARGUMENT)
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS))):
        state = nvml_adapter.optional(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link, default=None, codes=stop)
        if state is None:
            break
        if int(state) != 1:
            continue
        remote = nvml_adapter.optional(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link, default=None)
        if remote is None:
            continue
        key = _pci_key(nvml_adapter.text(remote.busId)) or (int(remote.domain), int(remote.bus), int(remote.device), 0)
        peers[key] = peers.get(key, 0) + 1
    return peers


def _with_mig(nvml, handle, item: _Read, minors: dict[str, int] | None, proc_root: Path,
              problems: list[str]) -> _Read:
    """`item` with its MIG devices, in NVML's order."""
    gpu = item.gpu
    devices = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError as err:
            if nvml_adapter.error_code(err) == nvml_adapter.NOT_FOUND:
                continue  # a free slot
            if nvml_adapter.error_code(err) == nvml_adapter.INVALID_ARGUMENT:
                break
            raise
        name = nvml_adapter.text(nvml.nvmlDeviceGetName(mig))
        uuid = nvml_adapter.text(nvml.nvmlDeviceGetUUID(mig))
        gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        ci = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
        match = _MIG_PROFILE.search(name)
        profile = match.group(1).lower().replace(" ", "_") if match else ""
        if not profile:
            profile = f"gi{gi}ci{ci}"
            problems.append(f"{gpu.uuid}: MIG device {uuid} is named {name!r}, without a profile like "
                            f"'1g.18gb'; its type is {gpu.type}_{profile}")
        files = [gpu.device]
        if minors is not None:
            caps_dir = gpu.device.rsplit("/", 1)[0] + "/nvidia-caps"
            for cap in (f"gpu{gpu.minor}/gi{gi}/access", f"gpu{gpu.minor}/gi{gi}/ci{ci}/access"):
                if cap in minors:
                    files.append(f"{caps_dir}/nvidia-cap{minors[cap]}")
                else:
                    problems.append(f"{gpu.uuid}: MIG device {uuid}: no {cap!r} in "
                                    f"{_mig_minors_path(proc_root)}; jobs will not be given that capability")
        devices.append(MigDevice(gi, ci, uuid, profile, tuple(files)))
    if not devices:
        problems.append(f"{gpu.uuid} ({gpu.pci_bus_id}): MIG mode is on but it has no MIG devices; "
                        "it offers no GPU to Slurm until GPU and compute instances are created (nvidia-smi mig)")
    return _Read(dataclasses.replace(gpu, mig=tuple(devices), mig_mode=True), item.key, item.peers)


def _mig_minors_path(proc_root: Path) -> Path:
    return proc_root / "driver" / "nvidia-caps" / "mig-minors"


def _read_mig_minors(proc_root: Path, problems: list[str]) -> dict[str, int] | None:
    """The driver's "gpu0/gi1/ci0/access 13" table: capability -> nvidia-cap minor.
    None (and a problem line) when it cannot be read."""
    path = _mig_minors_path(proc_root)
    try:
        text = path.read_text()
    except OSError as err:
        problems.append(f"{path}: cannot read ({err.strerror or err}); MIG devices are listed without their "
                        "nvidia-caps files, so jobs cannot open them (is the driver loaded with MIG support?)")
        return None
    minors: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            minors[parts[0]] = int(parts[1])
    return minors


def _device_problems(gpu: InventoryGpu) -> list[str]:
    """Slurm rejects a job whose gres file does not exist or is no character device."""
    try:
        mode = os.stat(gpu.device).st_mode
    except FileNotFoundError:
        return [f"{gpu.uuid} ({gpu.pci_bus_id}): {gpu.device} is missing (expected a character device); "
                f"jobs given this GPU cannot open it: run nvidia-modprobe -c {gpu.minor} or check the dev dir "
                f"(in a container: --device {gpu.device}, or the NVIDIA container runtime)"]
    except OSError as err:
        return [f"{gpu.uuid} ({gpu.pci_bus_id}): cannot stat {gpu.device}: {err.strerror or err}"]
    if not stat.S_ISCHR(mode):
        return [f"{gpu.uuid} ({gpu.pci_bus_id}): {gpu.device} is not a character device "
                f"(expected the NVIDIA device, major 195)"]
    return []


def _describe_lost(nvml, index: int, err: BaseException) -> str:
    """"NVML GPU 3 (GPU-..., 00000000:18:00.0): GPU is lost (NVML error 15); <action>",
    with whatever identity NVML still gives."""
    known = []
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - best effort: the description must not fail
        handle = None
    if handle is not None:
        for call in (lambda: nvml_adapter.text(nvml.nvmlDeviceGetUUID(handle)),
                     lambda: nvml_adapter.text(nvml.nvmlDeviceGetPciInfo(handle).busId)):
            try:
                known.append(call())
            except Exception:  # noqa: BLE001 - best effort
                pass
    where = f"NVML GPU {index}" + (f" ({', '.join(known)})" if known else "")
    return f"{where}: {nvml_adapter.describe(str(err), nvml_adapter.error_code(err))}"


def _pci_key(bus_id: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of a bus id in any of NVML's spellings,
    so "00000000:18:00.0", "0000:18:00.0" and "18:00.0" compare equal."""
    match = _BUS_ID.match(bus_id.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return int(domain or "0", 16), int(bus, 16), int(device, 16), int(function, 16)


# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {value!r}")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, found {value!r}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, found {value!r}")
    return value


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(_int(v) for v in values)


def _gpu_from_dict(data: dict[str, Any]) -> InventoryGpu:
    mig = tuple(
        MigDevice(_int(m["gpu_instance"]), _int(m["compute_instance"]), _str(m["uuid"]), _str(m["profile"]),
                  tuple(_str(f) for f in m["files"]))
        for m in data["mig"]
    )
    return InventoryGpu(
        nvml_index=_int(data["nvml_index"]),
        minor=_int(data["minor"]),
        name=_str(data["name"]),
        type=_str(data["type"]),
        uuid=_str(data["uuid"]),
        pci_bus_id=_str(data["pci_bus_id"]),
        device=_str(data["device"]),
        cpus=_ints(data["cpus"]),
        cores=_ints(data["cores"]),
        links=_ints(data["links"]),
        mig=mig,
        mig_mode=_bool(data["mig_mode"]),
    )
