"""The kernel log: `LineParser` on the line formats the NVIDIA driver, NVSwitch and the kernel write (in kmsg,
dmesg and syslog dress), bus ids in NVML's form, garbage never raising; `KernelLog` on a growing file and on
the real /dev/kmsg, read from its end."""

from __future__ import annotations

import os
import random
import subprocess
import time
import uuid

import pytest

from slurm_ext.health.kmsg import KernelLog, LineParser, facility_of, kernel_message, message_of
from slurm_ext.health.records import KernelHang, SXid, Xid, normal_bus_id

NOW = 1_700_000_000.0


def parse(line: str, parser: LineParser | None = None):
    return (parser or LineParser()).parse(line, now=NOW)


# -- bus ids ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,bus", [("PCI:0000:17:00", "00000000:17:00.0"),
                                      ("0000:17:00.0", "00000000:17:00.0"),
                                      ("17:00.0", "00000000:17:00.0"),
                                      ("PCI:0000:b5:00", "00000000:B5:00.0"),
                                      ("pci:0001:ab:cd", "00000001:AB:CD.0"),
                                      ("00000000:B5:00.0", "00000000:B5:00.0"),
                                      ("0018:01:00.1", "00000018:01:00.1"),
                                      (" PCI:0000:0a:00.0 ", "00000000:0A:00.0")])
def test_normal_bus_id(text, bus):
    assert normal_bus_id(text) == bus


def test_normal_bus_id_leaves_other_text():
    assert normal_bus_id("Not A Bus") == "not a bus"
    assert normal_bus_id("zz:yy:xx") == "zz:yy:xx"
    assert normal_bus_id("") == ""


# -- Xid lines ------------------------------------------------------------------------------------

XID_LINES = [
    ("NVRM: Xid (PCI:0000:17:00): 79, pid=123456, name=test, GPU has fallen off the bus.", 79, "00000000:17:00.0"),
    ("NVRM: Xid (PCI:0000:03:00): 48, pid=91237, name=nv-hostengine, Ch 00000076, errorString CTX SWITCH TIMEOUT, "
     "Info 0x3c046", 48, "00000000:03:00.0"),
    ("NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 1, TPC 3, "
     "SM 0): Out Of Range Address", 13, "00000000:B5:00.0"),
    ("NVRM: Xid (PCI:0000:b5:00): 31, pid=2079991, name=pt_main_thread, Ch 00000007, intr 00000000.", 31,
     "00000000:B5:00.0"),
    ("NVRM: Xid (PCI:0000:66:00): 32, pid=2280636, name=train.3, Channel ID 0000000d intr0 00040000", 32,
     "00000000:66:00.0"),
    ("NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008", 43, "00000000:38:00.0"),
    ("NVRM: Xid (PCI:0001:ab:cd): 69, pid=1310987, name=train.3, Class Error: ChId 0008, Class 0000cbc0, Offset "
     "00000184, Data ffffffff, ErrorCode 00000004", 69, "00000001:AB:CD.0"),
    ("NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link "
     "14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)", 74, "00000003:00:00.0"),
    ("NVRM: Xid (PCI:0000:17:00): 94, pid=789012, name=process, Contained ECC error.", 94, "00000000:17:00.0"),
    ("NVRM: Xid (PCI:0000:17:00): 119, pid=15822502, name=nvc:[driver], Timeout after 6s of waiting for RPC "
     "response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).", 119, "00000000:17:00.0"),
    ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
     63, "00000000:10:1C.0"),
    # older drivers: no "PCI:"
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", 14, "00000000:03:00.0"),
]


@pytest.mark.parametrize("line,number,bus", XID_LINES, ids=[f"xid{n}" for _, n, _ in XID_LINES])
def test_xid_lines(line, number, bus):
    record = parse(line)
    assert isinstance(record, Xid)
    assert (record.xid, record.pci_bus_id, record.source, record.time) == (number, bus, "kernel", NOW)
    assert record.text == line
    assert (record.fatal, record.recovery, record.no_xid_line, record.uuid) == (None, "", False, "")


XID13 = "NVRM: Xid (PCI:0000:17:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x405840=0x80000000"


@pytest.mark.parametrize("line", [
    "6,123,456,-;" + XID13,  # /dev/kmsg record head
    "4,9876,123456789,c;" + XID13,  # a continuation flag
    "[   12.345678] " + XID13,  # dmesg
    "[123456.000001]" + XID13,
    "Nov 20 23:02:01 node1 kernel: " + XID13,  # syslog
    "Nov 20 23:02:01 node1 kernel: [  12.345678] " + XID13,
    "2026-11-20T23:02:01.123456+00:00 node1 kernel: " + XID13,  # rsyslog RFC 3339
    "<4>" + XID13,
    XID13 + "\n",
])
def test_xid_in_kmsg_dmesg_and_syslog_dress(line):
    record = parse(line)
    assert isinstance(record, Xid)
    assert (record.xid, record.pci_bus_id) == (13, "00000000:17:00.0")
    assert "6,123,456" not in record.text and not record.text.startswith("[") and not record.text.endswith("\n")


def test_message_of_strips_heads():
    assert message_of("6,123,456,-;hello\n") == "hello"
    assert message_of("[  12.3] hello") == "hello"
    assert message_of("6,1,2,-;[  12.3] hello") == "hello"
    assert message_of("hello") == "hello"


@pytest.mark.parametrize("line,number,bus,fatal", [
    ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 149, "00000018:01:00.0", True),
    ("NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", 144, "00000000:01:00.0", False),
    ("NVRM: Xid (PCI:0000:01:00): 145, RLW_REMAP Nonfatal XC1 i0 Link 17 (0x00000004 0x00000000 0x00000000 "
     "0x00000000 0x00000000 0x00000000)", 145, "00000000:01:00.0", False),
    ("NVRM: Xid (PCI:0000:01:00): 147, TREX/MSE Fatal XC1 i1 Link -1 (0x00000004 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", 147, "00000000:01:00.0", True),
    # with pid and name before the unit (gpud's extended regex allows them)
    ("NVRM: Xid (PCI:0000:01:00): 150, pid=12, name=train.3, MSE_WATCHDOG Fatal XC0 i0 Link 2 (0x00000001 "
     "0x00000000)", 150, "00000000:01:00.0", True),
    ("NVRM: Xid (PCI:0000:01:00): 144, pid='<unknown>', name=<unknown>, SAW_MVB Nonfatal XC0 i0 Link 0 "
     "(0x00000001 0x00000008)", 144, "00000000:01:00.0", False),
    # a 144-150 line that does not say: left to the catalog
    ("NVRM: Xid (PCI:0000:01:00): 146, TLW error on link 3", 146, "00000000:01:00.0", None),
])
def test_nvlink5_xids(line, number, bus, fatal):
    record = parse(line)
    assert (record.xid, record.pci_bus_id, record.fatal) == (number, bus, fatal)


@pytest.mark.parametrize("line,recovery", [
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     "GPU Reset Required"),
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x2 "
     "(Node Reboot Required)", "Node Reboot Required"),
    ("NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
     "None"),
])
def test_xid_154_recovery(line, recovery):
    record = parse(line)
    assert (record.xid, record.pci_bus_id, record.recovery) == (154, "00000008:01:00.0", recovery)


# -- fallen off the bus without an Xid ---------------------------------------------------------------

def test_fallen_off_the_bus_one_line():
    record = parse("NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.")
    assert isinstance(record, Xid)
    assert (record.xid, record.pci_bus_id, record.no_xid_line) == (79, "00000000:29:00.0", True)
    record = parse("[  88.1] NVRM: GPU at PCI:0000:29:00: GPU has fallen off the bus.")
    assert (record.xid, record.pci_bus_id, record.no_xid_line) == (79, "00000000:29:00.0", True)


def test_fallen_off_the_bus_two_lines():
    parser = LineParser()
    assert parser.parse("NVRM: The NVIDIA GPU 0000:18:00.0", now=NOW) is None
    record = parser.parse("NVRM: ... fallen off the bus and is not responding to commands.", now=NOW)
    assert (record.xid, record.pci_bus_id, record.no_xid_line) == (79, "00000000:18:00.0", True)
    # the GPU it named is used once
    again = parser.parse("NVRM: ... fallen off the bus and is not responding to commands.", now=NOW)
    assert (again.xid, again.pci_bus_id) == (79, "")


def test_fallen_off_the_bus_as_the_driver_writes_it_in_kmsg():
    parser = LineParser()
    lines = ["6,2201,9123456789,-;NVRM: The NVIDIA GPU 0000:3b:00.0",
             "6,2202,9123456790,c;NVRM: (PCI ID: 10de:2335) installed in this system has",
             "6,2203,9123456791,c;NVRM: fallen off the bus and is not responding to commands."]
    records = [parser.parse(line, now=NOW) for line in lines]
    assert records[:2] == [None, None]
    assert (records[2].xid, records[2].pci_bus_id) == (79, "00000000:3B:00.0")


def test_fallen_off_the_bus_without_a_gpu_is_still_xid_79():
    record = parse("NVRM: fallen off the bus and is not responding to commands.")
    assert (record.xid, record.pci_bus_id, record.no_xid_line) == (79, "", True)


# -- SXid, hung tasks, soft lockups -------------------------------------------------------------------

@pytest.mark.parametrize("line,number,bus,fatal", [
    ("nvidia-nvswitch1: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 57 Minion Link DLREQ interrupt", 22013,
     "00000000:0A:00.0", False),
    ("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 33 sourcetrack TCEN0 crumbstore ECC DBE Error",
     24007, "00000000:86:00.0", True),
    ("6,55,66,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 4 egress non-posted PRIV error",
     12028, "00000000:05:00.0", False),
    ("Nov 20 23:02:01 node1 kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
     20034, "00000000:05:00.0", True),
])
def test_sxid_lines(line, number, bus, fatal):
    record = parse(line)
    assert isinstance(record, SXid)
    assert (record.sxid, record.pci_bus_id, record.fatal, record.time) == (number, bus, fatal, NOW)


@pytest.mark.parametrize("line,kind", [
    ("INFO: task foo:123 blocked for more than 120 seconds.", "hung-task"),
    ("[ 7380.123] INFO: task kworker/u64:2:1234 blocked for more than 122 seconds.", "hung-task"),
    ("3,991,7380123456,-;INFO: task jbd2/nvme0n1p1-8:811 blocked for more than 245 seconds.", "hung-task"),
    ("watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [kworker:12]", "soft-lockup"),
    ("0,1234,5678,-;watchdog: BUG: soft lockup - CPU#101 stuck for 22s! [python3:999]", "soft-lockup"),
    ("BUG: soft lockup - CPU#0 stuck for 67s! [swapper/0:1]", "soft-lockup"),
])
def test_kernel_hangs(line, kind):
    record = parse(line)
    assert isinstance(record, KernelHang)
    assert (record.kind, record.time) == (kind, NOW)


# -- only the kernel's own lines --------------------------------------------------------------------

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


@pytest.mark.parametrize("line", [
    "0," + "12,34,-;" + XID79, "3,12,34,-;" + XID79, "7,12,34,c;" + XID79,  # facility kernel, any level
    "<0>" + XID79, "<6>[ 12.3] " + XID79,
    "kern  :err   : 2025-01-25T10:34:54,859532+00:00 " + XID79,  # dmesg -x
    "192.168.11.119: kern: warning: [2026-04-22T21:27:51.291660856Z]: " + XID79,  # a log collector's
    "Nov 20 23:02:01 node1 kernel: " + XID79, "Mar 29 15:38:59 kernel: " + XID79, "kernel: " + XID79,
    "[Sun Feb 23 16:24:18 2025] " + XID79, "19:14:43  " + XID79, XID79,
])
def test_the_kernels_lines_are_judged(line):
    record = parse(line)
    assert isinstance(record, Xid) and (record.xid, record.pci_bus_id) == (79, "00000000:3B:00.0")
    assert record.text == XID79


@pytest.mark.parametrize("line", [
    # written into /dev/kmsg from user space: facility user (echo > /dev/kmsg, "<6>..."), or another it names
    "14,341,129935618,-;" + XID79, "8,1,2,-;" + XID79, "30,1,2,-;" + XID79, "191,1,2,-;" + XID79,
    "<14>" + XID79, "<30>[ 12.3] " + XID79, "user  :warn  : " + XID79, "daemon:err: " + XID79,
    # another subsystem's message with the user's text in it: the failed-mount trick, as the kernel logged it
    "3,341,129935618,-;tmpfs: Unknown parameter 'NVRM: Xid (PCI:0000:3b:00): 79'",
    "3,342,129935619,-;tmpfs: Unknown parameter 'nvidia-nvswitch0: SXid (PCI:0000:0a:00.0): 20034, Fatal, Link 30'",
    "3,343,129935620,-;tmpfs: Unknown parameter 'NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.'",
    "3,344,1,-;tmpfs: Unknown parameter 'INFO: task foo:123 blocked for more than 120 seconds.'",
    "3,345,1,-;tmpfs: Unknown parameter 'watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [x:1]'",
    # another program's syslog line, or one quoting the driver
    "Nov 20 23:02:01 node1 logger[99]: " + XID79, "Nov 20 23:02:01 node1 myjob: " + XID79,
    "2026-11-20T23:02:01.1+00:00 node1 python3[7]: " + XID79,
    "[gpu-health] [CRITICAL] GPU-1234: XID: " + XID79, "job 42 saw: " + XID79,
    "6,1,2,-;mlx5_core 0000:41:00.0: fallen off the bus and is not responding to commands.",
])
def test_lines_that_are_not_the_kernels_own_are_never_records(line):
    parser = LineParser()
    assert parser.parse(line, now=NOW) is None
    assert parser.refused == (1 if ("NVRM: " in line or "SXid" in line) else 0)


@pytest.mark.parametrize("line", [
    "6,346,1,-;NVRM: Xid (PCI:[4242]: segfault at 0 ip 0000 sp 0000 error 4 in fallen off the bus.so[7f00+1000]",
    "4,347,1,-;NVRM: fallen of invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "4,348,1,-;nvidia-nvswitch[77]: segfault at 0 ip 0000 sp 0000 error 4 in libSXid (PCI:0000:0a:00.0): 20034,",
    "6,349,1,-;NVRM: The NVIDI[5]: segfault at 0 ip 0 sp 0 error 4",
])
def test_a_users_comm_leading_a_kernel_message_is_too_short_to_forge_a_driver_line(line):
    """Segfault and OOM lines begin with the process's comm, the one user-chosen text the kernel puts first: at
    most 15 characters, too few for any driver line (and for the GPU the three-line form names)."""
    parser = LineParser()
    assert parser.parse(line, now=NOW) is None
    assert parser.parse("6,350,1,-;NVRM: ... fallen off the bus and is not responding to commands.", now=NOW) \
        .pci_bus_id == ""


def test_facility_and_message_of_a_line():
    from slurm_ext.health.kmsg import facility_of, kernel_message
    assert (facility_of("14,1,2,-;x"), facility_of("3,1,2,-;x"), facility_of("<30>x"), facility_of("x")) == \
        (1, 0, 3, None)
    assert facility_of("kern  :warn  : x") == 0 and facility_of("user  :warn  : x") == 1
    assert kernel_message("14,1,2,-;" + XID79) is None and kernel_message("3,1,2,-;" + XID79) == XID79
    assert kernel_message("Nov 20 23:02:01 node1 sshd[1]: x") is None
    assert message_of("Nov 20 23:02:01 node1 sshd[1]: x") == "Nov 20 23:02:01 node1 sshd[1]: x"


def test_a_gpu_named_by_the_driver_is_forgotten_after_its_message():
    """The driver's three-line "fallen off the bus" names the GPU first; a GPU named by any other driver message
    ("... requires use of the NVIDIA open kernel modules") is forgotten after two lines or ten seconds."""
    parser = LineParser()
    assert parser.parse("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2b85)", now=NOW) is None
    assert parser.parse("NVRM: installed in this system requires use of the NVIDIA open kernel modules.", now=NOW) \
        is None
    assert parser.parse("NVRM: GPU 0000:01:00.0: RmInitAdapter failed! (0x22:0x56:1017)", now=NOW) is None
    late = parser.parse("NVRM: fallen off the bus and is not responding to commands.", now=NOW)
    assert (late.xid, late.pci_bus_id) == (79, "")
    parser.parse("NVRM: The NVIDIA GPU 0000:18:00.0", now=NOW)
    slow = parser.parse("NVRM: fallen off the bus and is not responding to commands.", now=NOW + 11)
    assert (slow.xid, slow.pci_bus_id) == (79, "")
    # a user's record naming a GPU is not the driver's: it names nothing
    parser.parse("14,1,2,-;NVRM: The NVIDIA GPU 0000:18:00.0", now=NOW)
    assert parser.parse("6,2,3,c;NVRM: fallen off the bus and is not responding to commands.", now=NOW) \
        .pci_bus_id == ""


@pytest.mark.parametrize("line,bus,gi,ci,pid", [
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     "00000000:01:00.0", 5, None, 7194),
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:01 GPU-CI:02): 31, pid=42, name=python, Ch 00000008", "00000000:01:00.0", 1, 2,
     42),
    ("NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No",
     "00000000:01:00.0", None, None, 7062),
    ("NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception", "00000000:B5:00.0",
     None, None, None),
])
def test_mig_attribution_and_the_process(line, bus, gi, ci, pid):
    record = parse(line)
    assert (record.pci_bus_id, record.gpu_instance, record.compute_instance, record.pid) == (bus, gi, ci, pid)


@pytest.mark.parametrize("line,unit,fatal,intrinfo,status", [
    ("NVRM: Xid (PCI:0000:01:00): 146, TLW_RX_PIPE0 Fatal XC0 i0 Link 3 (0x0000000a 0x00000004 0x0 0x0 0x0 0x0)",
     "TLW_RX_PIPE0", True, 0xA, 0x4),
    ("NVRM: Xid (PCI:0000:01:00): 146, TLW_TX_PIPE1 Nonfatal XC1 i0 Link 3 (0x0000000d 0x00000002 0x0 0x0 0x0 0x0)",
     "TLW_TX_PIPE1", False, 0xD, 0x2),
    ("NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
     "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)", "RLW_RXPIPE", False, 0x0409A0C2, 0x8),
    ("NVRM: Xid (PCI:0000:01:00): 148, NVLPW_CTRL/NVLPW Nonfatal XC0 i0 Link 1 (0x0000000f 0x80000000)",
     "NVLPW_CTRL/NVLPW", False, 0xF, 0x80000000),
])
def test_nvlink5_units_with_digits_and_their_status(line, unit, fatal, intrinfo, status):
    record = parse(line)
    assert (record.unit, record.fatal, record.intrinfo, record.error_status) == (unit, fatal, intrinfo, status)


@pytest.mark.parametrize("line,number,fatal", [
    ("nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26008, SOE Watchdog error", 26008, None),
    ("nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED", 26006, None),
    ("[38889.018130] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Li", 20009, False),
])
def test_sxid_lines_without_severity_or_cut(line, number, fatal):
    record = parse(line)
    assert isinstance(record, SXid) and (record.sxid, record.fatal) == (number, fatal)


@pytest.mark.parametrize("line", [
    "nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALT data[0] = 0x               0",
    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 12033, Severity 1 Engine instance 00 Sub-engine instance 00",
    "nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500}",
])
def test_sxid_detail_lines_are_not_events(line):
    assert parse(line) is None


# -- garbage, truncation, fuzz ------------------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "", "\n", "   ", "\x00\x00\x00", "6,123,456,-;", "[  12.3] ", "6,123,456,-;\n",
    "NVRM: Xid (PCI:0000:1", "NVRM: Xid (PCI:0000:17:00): ", "NVRM: Xid (PCI:0000:17:00", "NVRM: Xid (",
    "NVRM: Xid (PCI:zzzz:17:00): 13, pid=1", "NVRM: Xid (PCI:0000:17:00): abc", "NVRM: Xid", "NVRM:",
    "nvidia-nvswitch1: SXid (PCI:0000:0a:00.0): 22013", "nvidia-nvswitch1: SXid (PCI:0000:0a", "SXid (",
    "INFO: task foo:123 blocked for more than", "watchdog: BUG: soft lock",
    "NVRM: The NVIDIA GPU 0000:18:00.0",  # the first half of the two-line form says nothing yet
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
    "mlx5_core 0000:41:00.0: mlx5_cmd_out_err:808: QUERY_VPORT_COUNTER(0x770) op_mod(0x0) failed",
    "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode",
    "\udcff\udcfe binary \x7f\x1b[31m",
    "\ufffd\ufffd\ufffdNVRM\ufffd Xid\ufffd",
])
def test_garbage_is_none(line):
    assert parse(line) is None


def test_a_very_long_line_is_cut_not_an_error():
    assert parse("x" * 1_000_000) is None
    record = parse(XID13 + " " + "A" * 100_000)
    assert (record.xid, record.pci_bus_id) == (13, "00000000:17:00.0")
    assert len(record.text) <= 4096


ALL_LINES = ([line for line, *_ in XID_LINES] + [
    "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000)",
    "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
    "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.", "NVRM: The NVIDIA GPU 0000:18:00.0",
    "NVRM: ... fallen off the bus and is not responding to commands.",
    "nvidia-nvswitch1: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 57 Minion Link DLREQ interrupt",
    "INFO: task foo:123 blocked for more than 120 seconds.",
    "watchdog: BUG: soft lockup - CPU#3 stuck for 23s! [kworker:12]"])


def test_fuzz_never_raises():
    rng = random.Random(20261120)
    parser = LineParser()  # one parser throughout: its two-line memory must survive any input
    records = (Xid, SXid, KernelHang)
    for _ in range(3000):
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
        assert parser.parse(raw.decode(errors="replace"), now=NOW) is None
        assert parser.parse(raw.decode("latin-1"), now=NOW) is None
    for line in ALL_LINES:
        for cut in range(len(line) + 1):
            for dress in ("", "6,1,2,-;", "[  1.0] "):
                result = parser.parse(dress + line[:cut], now=NOW)
                assert result is None or isinstance(result, records)
        for _ in range(200):  # a byte flipped, dropped or doubled somewhere
            chars = list(line)
            at = rng.randrange(len(chars))
            choice = rng.randrange(3)
            if choice == 0:
                chars[at] = chr(rng.randrange(0x110000) if rng.random() < 0.2 else rng.randrange(256))
            elif choice == 1:
                del chars[at]
            else:
                chars.insert(at, chars[at])
            try:
                mangled = "".join(chars)
                mangled.encode("utf-8", "surrogatepass")
            except UnicodeError:
                continue
            result = parser.parse(mangled, now=NOW)
            assert result is None or isinstance(result, records)
    # and it still parses a good line after all that
    assert parser.parse(XID13, now=NOW).xid == 13


def test_parse_without_now_uses_wall_clock():
    before = time.time()
    record = LineParser().parse(XID13)
    assert before <= record.time <= time.time()


# -- KernelLog on a file ------------------------------------------------------------------------------

@pytest.fixture
def log_file(tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("6,1,1,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=old, GPU has fallen off the bus.\n"
                    "an old line\n")
    return path


@pytest.fixture
def opened(log_file):
    log = KernelLog(str(log_file))
    log.open()
    yield log
    log.close()


def append(path, text: str) -> None:
    with open(path, "a") as file:
        file.write(text)


def test_file_starts_at_the_end(opened, log_file):
    assert not opened.device
    assert opened.lines(0.0) == []
    assert opened.lines(0.2) == []


def test_file_returns_appended_lines(opened, log_file):
    append(log_file, XID13 + "\nsecond line\n")
    assert opened.lines(1.0) == [XID13, "second line"]
    assert opened.lines(0.0) == []
    append(log_file, "third\n")
    assert opened.lines(1.0) == ["third"]


def test_file_waits_up_to_the_timeout():
    # nothing comes: lines() waits about `timeout` and returns nothing
    import tempfile
    with tempfile.NamedTemporaryFile() as file:
        log = KernelLog(file.name)
        log.open()
        start = time.monotonic()
        assert log.lines(0.3) == []
        assert 0.25 <= time.monotonic() - start < 2.0
        log.close()


def test_file_holds_a_partial_line(opened, log_file):
    append(log_file, "NVRM: Xid (PCI:0000:17")
    assert opened.lines(0.2) == []
    append(log_file, ":00): 13, pid=1, name=x, late\nnext")
    assert opened.lines(1.0) == ["NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=x, late"]
    append(log_file, "\n")
    assert opened.lines(1.0) == ["next"]


def test_file_skips_empty_lines(opened, log_file):
    append(log_file, "\n\none\n\n")
    assert opened.lines(1.0) == ["one"]


def test_truncated_file_is_read_from_its_start(opened, log_file):
    append(log_file, "before truncation\n")
    assert opened.lines(1.0) == ["before truncation"]
    log_file.write_text("after\n")  # shorter than what was read
    assert opened.lines(1.0) == ["after"]
    append(log_file, "more\n")
    assert opened.lines(1.0) == ["more"]


def test_replaced_file_is_read_from_its_start(opened, log_file, tmp_path):
    new = tmp_path / "kern.log.new"
    new.write_text("new one\nnew two\n" + "x" * 500 + "\n")
    os.replace(new, log_file)  # a new inode, longer than the old offset
    assert opened.lines(1.0) == ["new one", "new two", "x" * 500]
    append(log_file, "appended to the new one\n")
    assert opened.lines(1.0) == ["appended to the new one"]


def test_removed_file_gives_nothing_until_it_returns(opened, log_file):
    log_file.unlink()
    assert opened.lines(0.2) == []
    log_file.write_text("back\n")
    assert opened.lines(1.0) == ["back"]


def test_missing_file_cannot_be_opened(tmp_path):
    with pytest.raises(OSError):
        KernelLog(str(tmp_path / "absent")).open()


def test_file_lines_parse(opened, log_file):
    append(log_file, "[  12.1] NVRM: Xid (PCI:0000:b5:00): 31, pid=2079991, name=pt_main_thread, Ch 00000007\n")
    parser = LineParser()
    records = [parser.parse(line, now=NOW) for line in opened.lines(1.0)]
    assert [(r.xid, r.pci_bus_id) for r in records] == [(31, "00000000:B5:00.0")]


# -- KernelLog on the real /dev/kmsg ----------------------------------------------------------------

def _kmsg_write(text: str) -> None:
    fd = os.open("/dev/kmsg", os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_until(log: KernelLog, tokens: list[str], timeout: float = 5.0) -> dict[str, str]:
    """The records of `log` holding each token, waiting up to `timeout` for all of them."""
    found: dict[str, str] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(found) < len(tokens):
        for line in log.lines(max(0.0, min(0.5, deadline - time.monotonic()))):
            for token in tokens:
                if token in line:
                    found.setdefault(token, line)
    return found


def _unique_domain() -> str:
    """A PCI domain no GPU has, unique to this run: a monitor reading the same kernel log can tell it apart."""
    return f"{random.Random(uuid.uuid4().hex).randrange(0x1000, 0xFFFF):04x}"


def test_dev_kmsg_from_its_end():
    """A line written before open is not returned; one written after is, within a second, with its record head."""
    tag = uuid.uuid4().hex
    _kmsg_write(f"<6>slurm-ext-test {tag} before open\n")
    log = KernelLog("/dev/kmsg")
    log.open()
    try:
        assert log.device
        _kmsg_write(f"<6>slurm-ext-test {tag} after open\n")
        found = _read_until(log, [f"{tag} after open"], timeout=1.0)
        assert not _read_until(log, [f"{tag} before open"], timeout=0.2)
    finally:
        log.close()
    assert list(found) == [f"{tag} after open"], found
    assert found[f"{tag} after open"].startswith("14,")  # facility user, level 6: written from user space


def test_a_user_space_record_in_dev_kmsg_is_read_and_never_judged():
    """root's `echo '<3>NVRM: Xid ...' > /dev/kmsg`: the record reaches /dev/kmsg (KernelLog reads it, its unique
    bus id in it) with facility user, which the kernel gives every write from user space: no record."""
    domain = _unique_domain()
    line = f"NVRM: Xid (PCI:{domain}:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    log = KernelLog("/dev/kmsg")
    log.open()
    try:
        for head in ("<3>", "<0>", "<11>", ""):  # level 3, "facility 0" (user space cannot), user, none
            _kmsg_write(f"{head}{line} {head or 'plain'}\n")
        tails = [f"{head or 'plain'}" for head in ("<3>", "<0>", "<11>", "")]
        found = _read_until(log, [f"fallen off the bus. {tail}" for tail in tails])
    finally:
        log.close()
    assert len(found) == 4, found
    parser = LineParser()
    for record in found.values():
        assert f"PCI:{domain}:3b:00" in record and facility_of(record) == 1, record
        assert parser.parse(record, now=NOW) is None
    assert parser.refused == 4
    # the same text as the kernel's own record would be an Xid: it is the facility that tells them apart
    head, text = next(iter(found.values())).split(";", 1)
    assert parser.parse("3" + head[head.index(","):] + ";" + text, now=NOW).xid == 79


def test_the_failed_mount_trick_as_nobody_is_read_and_never_judged():
    """An ordinary user's failed mount makes the kernel log (facility kernel) a message with the user's text in
    it: "tmpfs: Unknown parameter 'NVRM: Xid (PCI:....:3b:00): 79'". The record reaches /dev/kmsg (KernelLog reads
    it, its unique bus id in it) and is no record: the driver's prefix does not begin the message."""
    domain = _unique_domain()
    option = f"NVRM: Xid (PCI:{domain}:3b:00): 79, pid=1, GPU has fallen off the bus."
    log = KernelLog("/dev/kmsg")
    log.open()
    try:
        done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "unshare", "-Urm",
                               "mount", "-t", "tmpfs", "-o", option, "none", "/mnt"],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode != 0, done  # the mount fails: that is the trick
        found = _read_until(log, [f"PCI:{domain}:3b:00"])
    finally:
        log.close()
    record = found.get(f"PCI:{domain}:3b:00")
    assert record is not None, (done.stderr, "the kernel logged no record of the failed mount")
    assert facility_of(record) == 0 and kernel_message(record).startswith("tmpfs: "), record
    parser = LineParser()
    assert parser.parse(record, now=NOW) is None
    assert parser.refused == 1
