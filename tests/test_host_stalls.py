"""The host probe (rynn_teleop.host_stalls): stall detection on injected times, and a real probe process
that is stopped by a signal for a while reports that stall."""

from __future__ import annotations

import os
import signal
import time
import types

import pytest

from rynn_teleop.host_stalls import (
    MEMORY_EVERY,
    PERIOD_S,
    HostProbes,
    PageWalker,
    Stall,
    StallDetector,
    overlaps,
    probe,
    rows,
    within,
)


def test_a_run_of_late_ticks_is_one_stall_reported_by_its_first_tick():
    d = StallDetector(cpu=1, period=0.005, threshold=0.010)
    assert d.tick(100.000, 0.001) is None  # on time
    stall = d.tick(100.050, 0.030)
    assert tuple(stall[:3]) == pytest.approx((100.020, 0.030, 1)) and stall.kind == "cpu"  # due at 100.020, 30 ms late
    assert d.tick(100.052, 0.027) is None  # the ticks swallowed by the same stall
    assert d.tick(100.053, 0.003) is None  # back on time
    assert tuple(d.tick(100.070, 0.012)[:3]) == pytest.approx((100.058, 0.012, 1))  # a new stall
    assert d.tick(100.080, 0.008) is None  # late, but less than the threshold


def test_the_probe_loop_on_injected_clocks_finds_a_stall_and_says_its_policy():
    now = [0.0]

    def sleep(s):
        now[0] += s + (0.040 if 0.5 <= now[0] < 0.505 else 0.0)  # the machine stops for 40 ms once

    system = types.SimpleNamespace(sched_setaffinity=lambda *a: None, SCHED_FIFO=1, sched_param=lambda p: p,
                                   sched_setscheduler=lambda *a: (_ for _ in ()).throw(PermissionError()))
    out = probe(1.0, 0, clock=lambda: now[0], wall=lambda: 1000.0 + now[0], sleep=sleep, system=system)
    assert out["policy"] == "normal (real-time refused)" and out["cpu"] == 0
    assert len(out["stalls"]) == 1
    start, length = out["stalls"][0]
    assert length == pytest.approx(0.040, abs=1e-6) and start == pytest.approx(1000.505, abs=1e-6)


def test_the_probe_stops_when_told():
    now = [0.0]
    out = probe(3600.0, 0, clock=lambda: now[0], wall=lambda: now[0],
                sleep=lambda s: now.__setitem__(0, now[0] + s), system=object(), stop=lambda: now[0] > 0.1)
    assert out["stalls"] == [] and now[0] < 0.2


def test_stalls_inside_a_window_and_gaps_that_overlap_them():
    stalls = [Stall(10.0, 0.030, 0), Stall(12.0, 0.015, 1)]
    assert within(stalls, 11.0, 13.0) == [stalls[1]]
    assert overlaps(stalls, 9_990_000_000, 10_010_000_000)  # a gap across the first stall's start
    assert overlaps(stalls, 10_020_000_000, 10_100_000_000)  # one that starts inside it
    assert not overlaps(stalls, 10_040_000_000, 11_000_000_000)  # after it
    assert not overlaps([], 0, 10**12)
    assert rows(stalls, 9.5) == [[0, 0.5, 30.0, "cpu"], [1, 2.5, 15.0, "cpu"]]
    assert rows([Stall(10.0, 0.111, 0, "memory")], 9.5) == [[0, 0.5, 111.0, "memory"]]


def test_a_slow_page_walk_is_a_memory_stall_and_not_also_a_late_tick():
    now = [0.0]
    walks = []

    class Walker:
        def walk(self):
            walks.append(now[0])
            now[0] += 0.111 if len(walks) == 10 else 0.0002  # one walk 111 ms (its pages' translation lost)

    system = types.SimpleNamespace(sched_setaffinity=lambda *a: None, SCHED_FIFO=1, sched_param=lambda p: p,
                                   sched_setscheduler=lambda *a: None)
    out = probe(1.0, 0, clock=lambda: now[0], wall=lambda: 1000.0 + now[0],
                sleep=lambda s: now.__setitem__(0, now[0] + s), system=system, walker=Walker())
    assert len(walks) >= (1.0 - 0.111) / PERIOD_S / MEMORY_EVERY - 2  # a walk every MEMORY_EVERY ticks
    assert len(out["memory_stalls"]) == 1 and out["stalls"] == []
    start, length = out["memory_stalls"][0]
    assert length == pytest.approx(0.111) and start == pytest.approx(1000.0 + walks[9])


def test_the_page_walker_reads_every_page_of_its_buffer():
    assert PageWalker(mib=1).walk() == 256  # one byte (1) of each 4 KiB page


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux CPU affinity")
def test_a_probe_process_held_by_a_signal_reports_that_stall():
    probes = HostProbes(60.0)
    try:
        time.sleep(1.5)  # the probes are up (a Python start each)
        victim = probes._procs[0]
        os.kill(victim.pid, signal.SIGSTOP)  # the CPU "does not run it" for 0.3 s
        time.sleep(0.3)
        os.kill(victim.pid, signal.SIGCONT)
        time.sleep(0.2)
        policy, stalls = probes.finish()
    finally:
        probes.stop()
    assert policy is not None
    held = [s for s in stalls if s.cpu == sorted(os.sched_getaffinity(0))[0] and s.length_s >= 0.25]
    assert held, stalls  # lateness is at least the time it was held (more on a loaded machine, never less)
