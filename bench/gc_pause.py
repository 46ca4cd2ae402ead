"""How long a full garbage collection holds the GIL in a node process, before and after start-up objects are
frozen (``nodes.process.freeze_startup_objects``): every thread of the process, its control loop included, waits
that long whenever Python runs one.

    .venv/bin/python bench/gc_pause.py [--node arm_ik] [--repeat 5]

Builds the node (composed runner, in this process, real rclpy on its own domain), then times ``gc.collect()``
``--repeat`` times (baseline: as the process is after start-up), freezes, and times it again. Prints one
JSON line: median pause before and after [ms], the objects frozen, and ``speedup`` (before / after).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time


def _pauses(repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", default="arm_ik", help="the node to build (default arm_ik)")
    parser.add_argument("--repeat", type=int, default=5, help="collections timed before and after")
    args = parser.parse_args()
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] != "LOCALHOST":
        raise SystemExit("bench/gc_pause.py: set ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST")
    os.environ.setdefault("ROS_DOMAIN_ID", str(90 + os.getpid() % 20))
    os.environ["RYNN_TELEOP_REALTIME"] = "off"  # this process only measures

    from rynn_teleop.nodes.process import freeze_startup_objects
    from rynn_teleop.runner import Composition

    with Composition([args.node]):
        time.sleep(1.0)
        tracked = len(gc.get_objects())
        before = _pauses(args.repeat)
        frozen = freeze_startup_objects()
        after = _pauses(args.repeat)
    b, a = statistics.median(before), statistics.median(after)
    print(json.dumps({"node": args.node, "tracked_objects": tracked, "frozen": frozen,
                      "full_collection_ms_before": round(b, 2), "full_collection_ms_after": round(a, 3),
                      "speedup": round(b / max(a, 1e-3), 1)}))


if __name__ == "__main__":
    main()
