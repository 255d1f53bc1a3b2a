"""The kernel log: reading it from its current end, and turning its lines into records.

`KernelLog` reads /dev/kmsg (one record per read, "pri,seq,usec,flags;text")
or, for a simulated node that shares its host's kernel, a plain file of
kernel lines that grows (kmsg records, dmesg lines or syslog lines all
parse). Either way it starts at the end: a line the kernel wrote before the
monitor started is never judged, so a restarted monitor does not replay a
fault that was already handled (Azure's NHC kept nodes drained until
logrotate by grepping old lines).

`LineParser.parse` turns one line into an Xid, SXid or KernelHang record, or
None: garbage, truncated lines and lines of other drivers are None, never an
exception.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import time

from .records import KernelHang, SXid, Xid, normal_bus_id

__all__ = ["KernelLog", "LineParser", "message_of"]

_KMSG_HEAD = re.compile(r"^\d+,\d+,\d+,[^;]*;")
_DMESG_TIME = re.compile(r"^\[\s*\d+\.\d+\]\s*")
#: a PCI address as the driver writes it: domain:bus:device[.function] (with or without PCI:), or bus:device.function
_PCI = (r"(?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?"
        r"|[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])")
_XID = re.compile(r"NVRM: Xid \(" + _PCI + r"\):\s*(\d+)(.*)")
# the unit and Fatal/Nonfatal follow the number, or the "pid=..., name=..." some drivers put first
_NVLINK5 = re.compile(r"(?:,\s*pid=[^,]*,\s*name=[^,]*)?,\s*[A-Z_]+(?:/[A-Z_]+)?\s+(Fatal|Nonfatal)\s+XC[01]")
_RECOVERY = re.compile(r"to 0x[0-9a-fA-F]+ \(([^)]*)\)")
_OFF_BUS = re.compile(r"NVRM: GPU (?:at )?" + _PCI + r": GPU has fallen off the bus")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU " + _PCI)
_SXID = re.compile(r"SXid \(" + _PCI + r"\):\s*(\d+),\s*(Fatal|Non-fatal)", re.IGNORECASE)
_HUNG = re.compile(r"INFO: task .+ blocked for more than \d+ seconds")
_LOCKUP = re.compile(r"(?:BUG: )?soft lockup - CPU#\d+ stuck")
_MAX_LINE = 4096
#: how often a kernel log that is a plain file is looked at (/dev/kmsg wakes its reader itself)
_FILE_POLL = 0.2


def message_of(line: str) -> str:
    """A line's text without the kmsg record head or dmesg's timestamp."""
    return _DMESG_TIME.sub("", _KMSG_HEAD.sub("", line, count=1), count=1).rstrip("\n")


class LineParser:
    """Kernel lines to records; it remembers the GPU of a two-line "fallen off the bus" message."""

    def __init__(self):
        self._named_gpu = ""

    def parse(self, line: str, now: float | None = None) -> Xid | SXid | KernelHang | None:
        text = message_of(line[:_MAX_LINE])
        when = time.time() if now is None else now
        found = _XID.search(text)
        if found:
            rest = found.group(3)
            nvlink5 = _NVLINK5.match(rest)
            recovery = _RECOVERY.findall(rest)
            return Xid(int(found.group(2)), normal_bus_id(found.group(1)), text, "kernel", when,
                       fatal=(nvlink5.group(1) == "Fatal") if nvlink5 else None,
                       recovery=recovery[-1] if recovery else "")
        if "fallen off the bus" in text:
            named = _OFF_BUS.search(text) or _THE_GPU.search(text)
            bus = normal_bus_id(named.group(1)) if named else self._named_gpu
            self._named_gpu = ""
            return Xid(79, bus, text, "kernel", when, no_xid_line=True)
        named = _THE_GPU.search(text)
        if named:
            self._named_gpu = normal_bus_id(named.group(1))
            return None
        found = _SXID.search(text)
        if found:
            return SXid(int(found.group(2)), normal_bus_id(found.group(1)), found.group(3).lower() == "fatal", text,
                        when)
        if _LOCKUP.search(text):
            return KernelHang("soft-lockup", text, when)
        if _HUNG.search(text):
            return KernelHang("hung-task", text, when)
        return None


class KernelLog:
    """New kernel lines from `path` (/dev/kmsg or a file), from the end as it was at `open`.

    `lines(timeout)` waits up to `timeout` seconds and returns the lines that
    came (maybe none). A file that is replaced or truncated (a test, a log
    rotation) is read again from its start.
    """

    def __init__(self, path: str):
        self.path = path
        self.fd = -1
        self.device = False
        self._inode: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""

    def open(self) -> None:
        """Open at the current end.

        Raises:
            OSError: the path cannot be opened (missing, no permission: a container without /dev/kmsg).
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        info = os.fstat(fd)
        self.device = stat.S_ISCHR(info.st_mode)
        self._offset = os.lseek(fd, 0, os.SEEK_END)
        self._inode = (info.st_dev, info.st_ino)
        self.fd = fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def lines(self, timeout: float) -> list[str]:
        if self.device:
            return self._records(timeout)
        return self._file_lines(timeout)

    def _records(self, timeout: float) -> list[str]:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        out = []
        while ready:
            try:
                data = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno == errno.EPIPE:  # records overwritten before we read them: go on with the next
                    continue
                raise
            if not data:
                break
            # a record's continuation lines (" SUBSYSTEM=...") follow its first line: only that one is text
            out.append(data.split(b"\n", 1)[0].decode(errors="replace"))
        return out

    def _file_lines(self, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = self._read_file()
            if found or time.monotonic() >= deadline:
                return found
            time.sleep(min(_FILE_POLL, max(0.0, deadline - time.monotonic())))

    def _read_file(self) -> list[str]:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return []
        if (info.st_dev, info.st_ino) != self._inode or info.st_size < self._offset:
            self.close()  # replaced or truncated: the new content is all new
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self._inode, self._offset, self._partial = (info.st_dev, info.st_ino), 0, b""
        if info.st_size == self._offset:
            return []
        data = os.pread(self.fd, min(info.st_size - self._offset, 1 << 20), self._offset)
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > _MAX_LINE:  # a line without end: cut, not kept growing
            complete.append(self._partial)
            self._partial = b""
        return [line.decode(errors="replace") for line in complete if line]
