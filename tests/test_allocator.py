"""The allocator settings every node process applies (nodes.process.tune_allocator).

Images pass through several fresh megabyte-sized buffers per hop; with glibc's
defaults those are returned to the system after use and page-faulted back in
on the next frame. The test counts minor page faults of the same allocation
pattern in fresh interpreters with and without the settings.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from rynn_teleop.nodes.process import tune_allocator

PATTERN = r"""
import json, resource, sys
from rynn_teleop.nodes.process import tune_allocator
applied = tune_allocator() if sys.argv[1] == "1" else False
def cycle():  # three image-sized buffers alive at once, touched, freed: one hop's worth
    bufs = [bytearray(921600) for _ in range(3)]
    for b in bufs:
        b[::4096] = b"\x01" * len(b[::4096])
cycle()  # the first frame may fault: the heap grows once
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    cycle()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")


def _faults(tuned: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", PATTERN, "1" if tuned else "0"], capture_output=True, text=True,
                         check=True, timeout=60)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_tuned_process_reuses_image_buffers_without_page_faults():
    default, tuned = _faults(False), _faults(True)
    assert tuned["applied"] is True and default["applied"] is False
    pages_per_cycle = 3 * 921600 // 4096
    # defaults: every cycle faults its buffers in again; tuned: they stay mapped
    assert default["faults"] > 10 * pages_per_cycle
    assert tuned["faults"] < pages_per_cycle


def test_opt_out_changes_nothing(monkeypatch):
    monkeypatch.setenv("RYNN_TELEOP_TUNE_MALLOC", "0")
    assert tune_allocator() is False

