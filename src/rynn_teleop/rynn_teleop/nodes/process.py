"""Process set-up shared by every entry point that runs nodes: transport profile, allocator, GIL switch
interval, scheduling class, frozen start-up objects.

``run_single`` (one node, its console script) and ``runner.Composition`` (several nodes in one process) call
these in the same order: :func:`use_transport_profile` before rclpy starts, :func:`process_priority_class`
before any node is built, :func:`use_process_priority` and :func:`freeze_startup_objects` once they exist.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal
import sys
from collections.abc import Iterable

from ..core.scheduling import (
    REALTIME_ENV,
    PriorityClass,
    apply_process_priority,
    process_priority,
    process_threads,
    realtime_mode,
)
from ..paths import config_file

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
ALLOCATOR_SETTINGS = {  # [bytes]
    "mmap_threshold": 32 << 20,  # buffers below this come from the heap, not from a fresh mmap each time
    "trim_threshold": 128 << 20,  # free memory kept at the heap top before it is returned to the system
    "top_pad": 16 << 20,  # extra room kept when a heap grows or shrinks
}


def tune_allocator() -> bool:
    """Keep freed megabyte-sized buffers in the process heap (glibc ``mallopt``); True if applied.

    Every image (0.9 MB for 640x480 RGB) passes through several fresh buffers
    per hop (rmw serialization, Fast DDS payloads, the Python message). With
    glibc's defaults those come from ``mmap`` or are trimmed off the heap top
    right after use, so each buffer costs a page fault per 4 KiB page when it is
    touched again; kept in the heap, it does not (``bench/camera.py`` shows the
    effect on an image hop). The price is up to ``trim_threshold`` of freed
    memory kept per process. Not glibc (musl, macOS), or
    ``RYNN_TELEOP_TUNE_MALLOC=0`` in the environment: nothing is changed and
    False is returned.
    """
    if os.environ.get("RYNN_TELEOP_TUNE_MALLOC", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    ok = mallopt(_M_MMAP_THRESHOLD, ALLOCATOR_SETTINGS["mmap_threshold"]) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, ALLOCATOR_SETTINGS["trim_threshold"]) == 1
    ok &= mallopt(_M_TOP_PAD, ALLOCATOR_SETTINGS["top_pad"]) == 1
    return bool(ok)


#: [s] how long a Python thread may hold the GIL while another waits for it (CPython's default is 5 ms)
GIL_SWITCH_INTERVAL_S = 0.001


def tune_threads() -> None:
    """Let a node's threads take turns at the GIL every :data:`GIL_SWITCH_INTERVAL_S`, and keep the BLAS
    libraries loaded so far (numpy's OpenBLAS) to one thread.

    A node process runs its executor thread beside loop threads (``TeleopNode.create_loop``): with CPython's
    default 5 ms, a message callback (the feed switch forwarding a frame) waits up to 5 ms per GIL
    acquisition while a loop thread computes (the synthetic camera drawing its next frame).

    One BLAS thread: a BLAS worker thread inherits the real-time priority of the node thread that first calls
    into BLAS, and OpenBLAS workers wait for work by spinning on ``sched_yield``, which never gives the CPU to
    a lower priority. Measured in the demo with the twin: the synthetic camera's ray cast of a new twin layout
    (a (76800, 3) @ (3, 3) product, split over two OpenBLAS threads) took 3 s of CPU instead of 0.14 s and
    held the camera's frames back for up to 1.2 s at a time for 11 s. The node processes' products are small
    (joints, poses, one image's rays): one thread loses nothing.
    """
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def use_transport_profile() -> str:
    """Prepare this process for camera-sized messages; returns the Fast DDS profile in use.

    Points Fast DDS at ``config/fastdds_profile.xml`` unless
    ``FASTDDS_DEFAULT_PROFILES_FILE`` is set (shared memory + loopback UDP with
    large buffers is what lets camera images through; it must be set before
    the first participant exists), and tunes the allocator
    (:func:`tune_allocator`).
    """
    tune_allocator()
    tune_threads()
    profile = os.environ.get("FASTDDS_DEFAULT_PROFILES_FILE")
    if not profile:
        path = config_file("fastdds_profile.xml")
        if path.exists():
            os.environ["FASTDDS_DEFAULT_PROFILES_FILE"] = profile = str(path)
    return profile or ""


def process_priority_class(node_classes: Iterable[type]) -> PriorityClass:
    """The most urgent of ``node_classes``' ``PRIORITY`` classes, and a check of ``RYNN_TELEOP_REALTIME``:
    call it before starting anything, so that a bad setting refuses the start.

    Raises:
        ConfigurationError: an unknown class or an ``RYNN_TELEOP_REALTIME`` that is neither "auto" nor "off".
    """
    cls = process_priority([getattr(c, "PRIORITY", "normal") for c in node_classes])
    realtime_mode(os.environ.get(REALTIME_ENV))
    return cls


def use_process_priority(cls: PriorityClass) -> str:
    """Give every thread of this process ``cls``'s scheduling (:func:`~.core.scheduling.apply_process_priority`,
    mode from the ``RYNN_TELEOP_REALTIME`` environment variable: "auto" by default, or "off"); returns what
    was done, for the log. Call it once the nodes are built: start-up ran in the normal scheduler, and the
    middleware's, executors' and loops' threads, which exist by then, take the class (threads started
    later inherit it from the thread that starts them)."""
    return apply_process_priority(cls, realtime_mode(os.environ.get(REALTIME_ENV)), threads=process_threads())


def freeze_startup_objects() -> int:
    """Collect the garbage of start-up, then move every object alive now into the collector's permanent
    generation (``gc.freeze``), where full collections no longer scan it; returns how many were frozen.

    A process's entry point calls it once its nodes exist (``rynn-teleop run``, the console scripts): a
    full collection (which holds the GIL, so every thread of the process waits) then scans only the objects
    made since, not every object the imports and the nodes' construction left (``bench/gc_pause.py``).
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def release_startup_objects() -> None:
    """Undo :func:`freeze_startup_objects` once the nodes are destroyed, and collect: frozen objects are never
    collected, so the native objects in their reference cycles (Ruckig's, MuJoCo's) would still be alive when
    the interpreter ends, and their bindings report them as leaked on the way out."""
    gc.unfreeze()
    gc.collect()


def params_files(args: Iterable[str]) -> list[str]:
    """The ``--params-file PATH`` (or ``--params-file=PATH``) paths inside the ``--ros-args`` sections of ``args``
    (a section ends at ``--``)."""
    out: list[str] = []
    args = list(args)
    in_ros = False
    for i, arg in enumerate(args):
        if arg == "--ros-args":
            in_ros = True
        elif arg == "--":
            in_ros = False
        elif in_ros and arg == "--params-file" and i + 1 < len(args):
            out.append(args[i + 1])
        elif in_ros and arg.startswith("--params-file="):
            out.append(arg.split("=", 1)[1])
    return out


_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


def terminate_with_parent() -> None:
    """In a child process before it runs (``preexec_fn``): SIGTERM when its parent (the demo, ``run --mode``)
    dies, however it dies (Linux; elsewhere nothing: a killed parent leaves its children to be stopped by hand)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
