"""What a fixed-rate loop's tick costs on this machine, beyond its own work.

    .venv/bin/python bench/control_loop.py [--rate 200] [--ticks 1000] [--rounds 4]
    .venv/bin/python bench/control_loop.py --reference SECONDS [--rate 100]   # bench/stack.py's third baseline

Two measurements, each in interleaved rounds (the host's speed drifts within minutes; interleaving gives each
variant the same conditions):

* the wait between ticks: CPU time per tick [us] of an empty deadline loop that waits with ``Event.wait``
  (what ``nodes.base.ControlLoop`` did) and with ``time.sleep`` (what it does for waits up to
  ``SLEEP_MAX_S``); ``wait_ratio`` = event / sleep;
* the machine's penalty on short bursts: CPU time [us] of one fixed unit of Python and numpy work (about
  0.1 ms), run back to back (``work_hot_us``) and once per tick of a ``--rate`` loop (``work_in_loop_us``);
  ``cold_factor`` = in loop / hot. On a virtual machine whose cores other tenants share, the caches a tick
  finds are cold and this factor moves with the host's load (1.0 would be a machine of one's own); every
  loop of the stack pays it, so ``bench/stack.py``'s CPU figures move with it.

``--reference SECONDS`` measures only the second, for ``SECONDS`` while something else runs (``bench/stack.py``
runs it beside the stack, at the normal priority: it then also pays for what the stack does to the caches):
``work_in_loop_us`` over the run, ``work_hot_us`` (the lower of right before and right after), ``cold_factor``.

Prints one JSON line. No ROS.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np

_A = np.linspace(0.0, 1.0, 14)
_B = np.linspace(1.0, 0.0, 14)


def work() -> float:
    """A fixed unit of small-array numpy and interpreter work (the shape of a control tick's)."""
    x = _A
    for _ in range(40):
        x = np.clip(x + _B * 0.01, -1.0, 1.0)
    return float(x[0])


def loop_cpu_us(rate_hz: float, ticks: int, wait: str, with_work: bool) -> float:
    """Median CPU time [us] per tick (wait + work) of a deadline loop, or of the work alone when ``with_work``."""
    stop = threading.Event()
    period = 1.0 / rate_hz
    due = time.monotonic() + period
    per_tick = []
    for _ in range(ticks):
        c0 = time.thread_time_ns()
        delay = due - time.monotonic()
        if delay > 0:
            if wait == "event":
                stop.wait(delay)
            else:
                time.sleep(delay)
        due += period
        c1 = time.thread_time_ns()
        if with_work:
            work()
            per_tick.append((time.thread_time_ns() - c1) / 1e3)
        else:
            per_tick.append((c1 - c0) / 1e3)
    return statistics.median(per_tick[ticks // 10:])


def hot_us(n: int) -> float:
    """Median CPU time [us] of the work unit run back to back."""
    out = []
    for _ in range(n):
        c = time.thread_time_ns()
        work()
        out.append((time.thread_time_ns() - c) / 1e3)
    return statistics.median(out[n // 10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, help="loop rate [Hz] (default 200; --reference: 100)")
    parser.add_argument("--ticks", type=int, default=1000, help="ticks per round and variant")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    parser.add_argument("--reference", type=float, metavar="SECONDS",
                        help="only the work unit's cold factor, over SECONDS (default rate 100 Hz)")
    args = parser.parse_args()
    if args.reference is not None:
        rate = args.rate or 100.0
        before = hot_us(2000)
        w = loop_cpu_us(rate, max(int(args.reference * rate), 20), "sleep", True)
        h = min(before, hot_us(2000))  # the lower of before and after: a burst of the others' lasts less
        print(json.dumps({"rate_hz": rate, "seconds": args.reference, "work_hot_us": round(h, 1),
                          "work_in_loop_us": round(w, 1), "cold_factor": round(w / h, 2)}))
        return
    args.rate = args.rate or 200.0
    event, sleep, hot, in_loop = [], [], [], []
    for _ in range(args.rounds):
        event.append(loop_cpu_us(args.rate, args.ticks, "event", False))
        sleep.append(loop_cpu_us(args.rate, args.ticks, "sleep", False))
        hot.append(hot_us(args.ticks))
        in_loop.append(loop_cpu_us(args.rate, args.ticks, "sleep", True))
    e, s, h, w = (statistics.median(v) for v in (event, sleep, hot, in_loop))
    print(json.dumps({
        "rate_hz": args.rate, "ticks": args.ticks, "rounds": args.rounds,
        "wait_event_us": round(e, 1), "wait_sleep_us": round(s, 1), "wait_ratio": round(e / s, 2),
        "wait_saved_cores_per_loop": round((e - s) * 1e-6 * args.rate, 4),
        "work_hot_us": round(h, 1), "work_in_loop_us": round(w, 1), "cold_factor": round(w / h, 2),
    }))


if __name__ == "__main__":
    main()
