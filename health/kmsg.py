"""The kernel log: reading it from its current end, and turning the kernel's own lines into records.

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

Only what the kernel itself logged is judged, because any user can put text
into the kernel log: a record written into /dev/kmsg from user space carries
facility user (1) or another it names, never facility kernel (0), which user
space cannot set; and another subsystem's message can quote a user's words
(a failed mount as an ordinary user logs "tmpfs: Unknown parameter 'NVRM:
Xid ...'"). So a record whose head gives a facility (a kmsg record, dmesg's
"<pri>" or "kern  :warn  :") counts only with facility kernel, and a message
counts only when it *begins* with the driver's prefix ("NVRM: ", or
"nvidia-nvswitchN: SXid ..."), never for a pattern found inside it. Lines of a
file that give no facility (dmesg or syslog text: a simulated node's input)
are judged by their message's prefix; a syslog line counts only under the tag
"kernel". A comm name, the one user-chosen text the kernel puts first in a
message (segfault and OOM lines), is at most 15 characters: too short for
any pattern here.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import time

from .records import KernelHang, SXid, Xid, normal_bus_id

__all__ = ["KernelLog", "LineParser", "message_of", "kernel_message", "facility_of"]

#: a /dev/kmsg record's head: priority (facility * 8 + level), sequence, microseconds, flags
_KMSG_HEAD = re.compile(r"^(\d{1,4}),\d+,\d+,[^;]*;")
#: dmesg -r, pstore and journal exports: "<pri>" before the text
_PRI_HEAD = re.compile(r"^<(\d{1,4})>")
_FACILITIES = {"kern": 0, "user": 1, "mail": 2, "daemon": 3, "auth": 4, "syslog": 5, "lpr": 6, "news": 7,
               "uucp": 8, "cron": 9, "authpriv": 10, "ftp": 11, **{f"local{n}": 16 + n for n in range(8)}}
#: dmesg -x ("kern  :warn  : "), after an optional source ("192.168.11.119: " from a log collector)
_NAMED_HEAD = re.compile(r"^(?:[^\s:]+:\s+)?(" + "|".join(_FACILITIES) + r")\s*:\s*"
                         r"(?:emerg|alert|crit|err|warn|warning|notice|info|debug)\s*:\s*")
#: syslog: "Nov 20 23:02:01 node1 kernel: " (host optional), "2026-11-20T23:02:01.1+00:00 node1 kernel: "
_SYSLOG = re.compile(r"^(?:[^\s:\[\]]+\s+\d{1,2}\s+\d{1,2}:\d{2}:\d{2}\s+(?:[^\s:\[\]]+\s+)?"
                     r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\S*\s+[^\s:\[\]]+\s+)([^\s:\[\]]+)(?:\[\d+\])?:\s")
_KERNEL_TAG = re.compile(r"^kernel:\s*")
#: time stamps before the text: dmesg "[ 12.345]", dmesg -T "[Sun Feb 23 16:24:18 2025]", ISO, a bare clock
_TIMES = re.compile(r"^(?:(?:\[\s*\d+(?:\.\d+)?\]|\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [\w: ]{10,30}\]"
                    r"|\[\d{4}-\d{2}-\d{2}T[\d:.,]+(?:Z|[+-]\d{2}:?\d{2})?\]:?)\s*"
                    r"|(?:\d{4}-\d{2}-\d{2}T[\d:.,]+(?:Z|[+-]\d{2}:?\d{2})?|\d{1,2}:\d{2}:\d{2})(?:\s+|$))")
#: a PCI address as the driver writes it: domain:bus:device[.function] (with or without PCI:), or bus:device.function
_PCI = (r"(?:PCI:)?([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?"
        r"|[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])")
#: "NVRM: Xid (PCI:0000:3b:00): 79, ...", with MIG's attribution "(PCI:0000:01:00 GPU-I:05 GPU-CI:02)"
_XID = re.compile(r"^NVRM: Xid \(" + _PCI + r"(?:\s+GPU-I:\s*(\d{1,3}))?(?:\s+GPU-CI:\s*(\d{1,3}))?\):\s*"
                  r"(\d{1,4})(?=,|\s|$)(.*)")
_PID = re.compile(r"^,\s*pid=(?:(\d+)|'?<unknown>'?)")
#: NVLink5 (144-150): the unit (digits since R575: TLW_RX_PIPE0) and Fatal/Nonfatal follow the number, or the
#: "pid=..., name=..." some drivers put first; then XC0/1, iN, Link N and (IntrInfo ErrorStatus ...)
_NVLINK5 = re.compile(r"(?:,\s*pid=[^,]*,\s*name=[^,]*)?,\s*([A-Z][A-Z0-9_]*(?:/[A-Z][A-Z0-9_]*)?)\s+"
                      r"(Fatal|Nonfatal|Non-fatal)\s+XC[01]\b(?:\s+i\d+\s+Link\s+-?\d+\s+"
                      r"\((0x[0-9a-fA-F]{1,8})\s+(0x[0-9a-fA-F]{1,8}))?")
_RECOVERY = re.compile(r"to 0x[0-9a-fA-F]+ \(([^)]*)\)")
#: the driver's own "fallen off the bus" lines, whole: one line, or the last of the three-line form
_OFF_BUS = re.compile(r"^NVRM: GPU (?:at )?" + _PCI + r": GPU has fallen off the bus")
_OFF_BUS_TAIL = re.compile(r"^NVRM: (?:\.\.\.\s*)?fallen off the bus and is not responding to commands")
_THE_GPU = re.compile(r"^NVRM: The NVIDIA GPU " + _PCI)
#: "nvidia-nvswitch3: SXid (PCI:0000:c1:00.0): 28006, Non-fatal, Link 46 ..."; "..., 26006, SOE HALTED"
_SXID = re.compile(r"^nvidia-nvswitch\d{1,3}: SXid \(" + _PCI + r"\):\s*(\d{1,6}),\s*(\S.*)$")
_SXID_SEVERITY = re.compile(r"^(Fatal|Non-fatal|Nonfatal)\b", re.IGNORECASE)
#: the lines that follow an SXid event with its details: not events themselves
_SXID_DETAIL = re.compile(r"^(?:Severity \d|Data \{)|\bdata\[\d+\]", re.IGNORECASE)
_HUNG = re.compile(r"^INFO: task .+ blocked for more than \d+ seconds")
_LOCKUP = re.compile(r"^(?:(?:NMI )?watchdog: )?BUG: soft lockup - CPU#\d+ stuck")
#: what a line that imitates the driver looks like (counted when refused, for the operator)
_LOOKS_LIKE = re.compile(r"NVRM: |nvidia-nvswitch\d+: SXid")
_MAX_LINE = 4096
#: how many driver lines after "NVRM: The NVIDIA GPU <bus>", and within how many seconds, its "fallen off the bus"
#: line may come (the driver writes the three lines at once); past them the GPU it named is forgotten
_NAMED_LINES = 2
_NAMED_SECONDS = 10.0
#: how often a kernel log that is a plain file is looked at (/dev/kmsg wakes its reader itself)
_FILE_POLL = 0.2


def _split(line: str) -> tuple[int | None, str | None]:
    """(facility, message) of one line: facility None when the line's format gives none; message None when the
    line is not the kernel's (a syslog line of another program)."""
    text = line.rstrip("\r\n")
    facility = None
    head = _KMSG_HEAD.match(text) or _PRI_HEAD.match(text)
    if head:
        facility = int(head.group(1)) >> 3
    elif named := _NAMED_HEAD.match(text):
        facility, head = _FACILITIES[named.group(1)], named
    elif tagged := _SYSLOG.match(text):
        if tagged.group(1) != "kernel":
            return None, None
        head = tagged
    elif tagged := _KERNEL_TAG.match(text):
        head = tagged
    if head:
        text = text[head.end():]
    for _ in range(2):  # "[ 12.3]" after a syslog head, "[2026-...Z]: " after a collector's
        found = _TIMES.match(text)
        if not found:
            break
        text = text[found.end():]
    return facility, text.strip()


def facility_of(line: str) -> int | None:
    """The syslog facility a line's head gives (0 kernel, 1 user, ...), or None when its format gives none."""
    return _split(line)[0]


def message_of(line: str) -> str:
    """A line's text without its head: kmsg record head, "<pri>", dmesg's time stamps, a syslog head."""
    message = _split(line)[1]
    return message if message is not None else line.strip()


def kernel_message(line: str) -> str | None:
    """The message of a line the kernel itself logged, or None: a record of another facility (user space's
    writes to /dev/kmsg), a syslog line of another program."""
    facility, message = _split(line)
    if message is None or facility not in (None, 0):
        return None
    return message


class LineParser:
    """Kernel lines to records; it remembers, for the next few lines, the GPU of the driver's three-line
    "fallen off the bus" message.

    `refused` counts the lines that looked like the driver's but were not the kernel's own (written from user
    space, or quoted inside another message): the monitor tells the operator about them.
    """

    def __init__(self):
        self._named_gpu = ""
        self._named_left = 0
        self._named_at = 0.0
        self.refused = 0
        self.last_refused = ""

    def parse(self, line: str, now: float | None = None) -> Xid | SXid | KernelHang | None:
        line = line[:_MAX_LINE]
        text = kernel_message(line)
        if text is None or not text.startswith(("NVRM", "nvidia-nvswitch", "INFO: task", "watchdog: ", "NMI ",
                                                "BUG: soft lockup")):
            if _LOOKS_LIKE.search(line):
                self.refused += 1
                self.last_refused = line
            return None
        when = time.time() if now is None else now
        fresh = self._named_left > 0 and 0 <= when - self._named_at <= _NAMED_SECONDS
        named, self._named_left = (self._named_gpu if fresh else ""), self._named_left - 1
        return (self._xid(text, when) or self._off_bus(text, when, named) or self._sxid(text, when)
                or _hang(text, when))

    def _xid(self, text: str, when: float) -> Xid | None:
        found = _XID.match(text)
        if not found:
            return None
        number, rest = int(found.group(4)), found.group(5)
        pid = _PID.match(rest)
        nvlink5 = _NVLINK5.match(rest) if 144 <= number <= 150 else None
        recovery = _RECOVERY.findall(rest) if number == 154 else []
        return Xid(number, normal_bus_id(found.group(1)), text, "kernel", when,
                   fatal=(nvlink5.group(2) == "Fatal") if nvlink5 else None,
                   recovery=recovery[-1] if recovery else "",
                   pid=int(pid.group(1)) if pid and pid.group(1) else None,
                   gpu_instance=_int(found.group(2)), compute_instance=_int(found.group(3)),
                   unit=nvlink5.group(1) if nvlink5 else "",
                   intrinfo=_int(nvlink5.group(3), 16) if nvlink5 else None,
                   error_status=_int(nvlink5.group(4), 16) if nvlink5 else None)

    def _off_bus(self, text: str, when: float, named: str) -> Xid | None:
        if found := _OFF_BUS.match(text):
            return Xid(79, normal_bus_id(found.group(1)), text, "kernel", when, no_xid_line=True)
        if _OFF_BUS_TAIL.match(text):
            self._named_left = 0
            return Xid(79, named, text, "kernel", when, no_xid_line=True)
        if found := _THE_GPU.match(text):
            self._named_gpu, self._named_left, self._named_at = normal_bus_id(found.group(1)), _NAMED_LINES, when
        return None

    def _sxid(self, text: str, when: float) -> SXid | None:
        found = _SXID.match(text)
        if not found:
            return None
        rest = found.group(3)
        severity = _SXID_SEVERITY.match(rest)
        if severity is None and _SXID_DETAIL.search(rest):
            return None  # the details of an event already reported
        fatal = severity.group(1).lower() == "fatal" if severity else None
        return SXid(int(found.group(2)), normal_bus_id(found.group(1)), fatal, text, when)


def _hang(text: str, when: float) -> KernelHang | None:
    if _LOCKUP.match(text):
        return KernelHang("soft-lockup", text, when)
    if _HUNG.match(text):
        return KernelHang("hung-task", text, when)
    return None


def _int(text: str | None, base: int = 10) -> int | None:
    return int(text, base) if text else None


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
