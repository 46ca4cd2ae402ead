"""Process priorities: each node's class, the class a process takes, and what it asks the kernel for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from rynn_teleop.core.scheduling import (
    BACKGROUND_THREAD_NICE,
    PRIORITY_CLASSES,
    REALTIME_ENV,
    PriorityClass,
    apply_process_priority,
    lower_this_thread,
    process_cpus,
    process_priority,
)
from rynn_teleop.errors import ConfigurationError


class FakeSystem:
    """The ``os`` calls apply_process_priority uses, recording them; ``refuse``: sched_setscheduler fails."""

    SCHED_OTHER = 0
    SCHED_RR = 2
    PRIO_PROCESS = 0

    def __init__(self, refuse: bool = False, nice: int = 0, policy: int = 0) -> None:
        self.refuse = refuse
        self.nice = nice
        self.policy = policy
        self.calls: list[tuple] = []
        self.nices: dict[int, int] = {}  # thread id -> nice value set (others: ``nice``)

    def sched_getscheduler(self, pid: int) -> int:
        return self.policy

    @staticmethod
    def sched_param(priority: int) -> int:
        return priority

    def sched_setscheduler(self, pid: int, policy: int, param: int) -> None:
        self.calls.append(("sched_setscheduler", pid, policy, param))
        if pid in self.ended:
            raise ProcessLookupError(3, "No such process")
        if self.refuse and policy != self.SCHED_OTHER:
            raise PermissionError(1, "Operation not permitted")
        self.policy = policy

    def getpriority(self, which: int, who: int) -> int:
        if who in self.ended:
            raise ProcessLookupError(3, "No such process")
        return self.nices.get(who, self.nice)

    def setpriority(self, which: int, who: int, value: int) -> None:
        self.calls.append(("setpriority", which, who, value))
        self.nices[who] = value
        if who == 0:
            self.nice = value

    ended: frozenset[int] = frozenset()  # thread ids that have ended


class PlacingSystem(FakeSystem):
    """FakeSystem with CPU affinity: every thread may use ``cpus`` until placed."""

    def __init__(self, cpus=(0, 1), **kwargs) -> None:
        super().__init__(**kwargs)
        self.cpus = frozenset(cpus)
        self.placed: dict[int, frozenset[int]] = {}  # thread id -> CPUs set

    def sched_getaffinity(self, pid: int) -> frozenset[int]:
        return self.placed.get(pid, self.cpus)

    def sched_setaffinity(self, pid: int, cpus) -> None:
        self.calls.append(("sched_setaffinity", pid, frozenset(cpus)))
        if pid in self.ended:
            raise ProcessLookupError(3, "No such process")
        self.placed[pid] = frozenset(cpus)


def test_a_process_takes_the_most_urgent_class_of_its_nodes():
    assert process_priority(["record", "control", "stream"]).name == "control"
    assert process_priority(["normal", "generate"]).name == "generate"
    assert process_priority([]).name == "normal"
    with pytest.raises(ConfigurationError, match="'urgent'.*control, record, input"):
        process_priority(["control", "urgent"])


def test_classes_are_ordered_by_urgency():
    ranked = [c.rr_priority for c in PRIORITY_CLASSES.values() if c.rr_priority is not None]
    assert ranked == sorted(ranked, reverse=True) and len(set(ranked)) == len(ranked)
    assert all(1 <= p <= 98 for p in ranked)
    assert all(c.fallback_nice >= 0 for c in PRIORITY_CLASSES.values())  # a fallback never needs privilege


def test_real_time_round_robin_where_permitted():
    system = FakeSystem()
    said = apply_process_priority(PRIORITY_CLASSES["control"], "auto", system)
    assert system.calls == [("sched_setscheduler", 0, FakeSystem.SCHED_RR, 30)]
    assert "SCHED_RR priority 30" in said


def test_every_thread_given_takes_the_class_but_those_that_lowered_themselves_or_ended():
    import threading

    system = FakeSystem()
    system.ended = frozenset({12})
    lowered = []

    def lower() -> None:
        lowered.append((threading.get_native_id(), lower_this_thread(FakeSystem())))

    worker = threading.Thread(target=lower)
    worker.start()
    worker.join()
    tid = lowered[0][0]
    said = apply_process_priority(PRIORITY_CLASSES["record"], "auto", system, threads=[11, 12, tid, 13])
    assert [c[1] for c in system.calls] == [11, 12, 13] and "SCHED_RR priority 25" in said
    # the fallback too: every thread, never one that lowered itself
    system = FakeSystem(refuse=True)
    apply_process_priority(PRIORITY_CLASSES["generate"], "auto", system, threads=[11, tid, 13])
    assert [c[2] for c in system.calls if c[0] == "setpriority"] == [11, 13]


def test_the_world_model_is_never_real_time():
    """Unbounded work at any real-time priority spends the real-time budget the arm loops share (the kernel
    stops every real-time thread of a CPU once 95 % of a second went to them there)."""
    system = FakeSystem()
    said = apply_process_priority(PRIORITY_CLASSES["generate"], "auto", system)
    assert system.calls == [("setpriority", FakeSystem.PRIO_PROCESS, 0, 10)] and said == "generate: nice 10"


def test_cpu_placement_gives_the_control_processes_a_cpu_of_their_own():
    assert process_cpus("control", [3, 1, 2]) == {1}  # the lowest CPU the process may use
    assert process_cpus("others", [3, 1, 2]) == {2, 3}
    assert process_cpus("control", [5]) is None and process_cpus("others", [5]) is None  # one CPU: not placed
    with pytest.raises(ConfigurationError, match="'isolated'.*control, others"):
        process_cpus("isolated", [0, 1])
    assert [c.name for c in PRIORITY_CLASSES.values() if c.placement == "control"] == ["control"]
    assert {c.name: c.placement for c in PRIORITY_CLASSES.values() if c.placement != "others"} == {
        "control": "control", "generate": None, "normal": None}
    assert process_cpus(None, [0, 1]) is None


def test_a_process_is_placed_only_where_its_nodes_agree():
    """The drivers with the description: the control CPU; the whole stack in one process (``run --mode``):
    not placed, so it keeps every CPU; the camera with the feed switch: the other CPUs."""
    assert process_priority(["control", "control", "normal"]).placement == "control"
    whole = process_priority(["control", "record", "input", "stream", "generate", "normal"])
    assert whole.name == "control" and whole.rr_priority == 30 and whole.placement is None
    assert process_priority(["stream", "stream"]).placement == "others"
    assert process_priority(["input", "generate"]).placement == "others"
    assert process_priority(["generate"]).placement is None  # the world model alone: every CPU
    assert process_priority([]).placement is None and process_priority(["normal"]).placement is None
    system = PlacingSystem()
    assert apply_process_priority(whole, "auto", system, threads=[11]) == "control: SCHED_RR priority 30"
    assert system.placed == {}


def test_every_node_process_is_placed_and_the_control_cpu_needs_real_time():
    system = PlacingSystem(cpus=(0, 1, 2, 3))
    said = apply_process_priority(PRIORITY_CLASSES["control"], "auto", system, threads=[11, 12])
    assert system.placed == {11: {0}, 12: {0}} and said == "control: SCHED_RR priority 30 on CPU 0"
    system = PlacingSystem(cpus=(0, 1, 2, 3))
    system.ended = frozenset({12})
    said = apply_process_priority(PRIORITY_CLASSES["input"], "auto", system, threads=[11, 12, 13])
    assert system.placed == {11: {1, 2, 3}, 13: {1, 2, 3}} and said == "input: SCHED_RR priority 20 on CPU 1, 2, 3"
    # the world model: in the normal scheduler, not placed (it runs where no real-time thread does, any CPU:
    # placed beside the real-time input, camera and recorder its DDS threads waited 100+ ms behind them)
    system = PlacingSystem()
    said = apply_process_priority(PRIORITY_CLASSES["generate"], "auto", system, threads=[11])
    assert said == "generate: nice 10"
    assert system.placed == {}
    # the normal class (tools, the demo's parent, which hands its CPUs down to the stack it spawns): as started
    system = PlacingSystem()
    said = apply_process_priority(PRIORITY_CLASSES["normal"], "auto", system, threads=[11])
    assert said == "normal: normal scheduling"
    assert system.calls == []
    # real time refused: the others still leave the control CPU; a control process stays where it was
    system = PlacingSystem(refuse=True)
    said = apply_process_priority(PRIORITY_CLASSES["record"], "auto", system, threads=[11])
    assert system.placed == {11: {1}} and said.startswith("record: normal scheduling on CPU 1 (SCHED_RR 25 refused")
    system = PlacingSystem(refuse=True)
    said = apply_process_priority(PRIORITY_CLASSES["control"], "auto", system, threads=[11])
    assert system.placed == {} and " on CPU" not in said
    # one CPU, or off: not placed
    for system, mode in ((PlacingSystem(cpus=(4,)), "auto"), (PlacingSystem(), "off")):
        said = apply_process_priority(PRIORITY_CLASSES["control"], mode, system, threads=[11])
        assert system.placed == {} and " on CPU" not in said, mode


def test_a_thread_started_after_the_placement_keeps_it_when_it_lowers_itself():
    """The recorder's file writer (started with each episode) runs beside the drains, off the control CPU."""
    system = PlacingSystem(cpus=(0, 1))
    apply_process_priority(PRIORITY_CLASSES["record"], "auto", system, threads=[0])
    placed = len(system.calls)
    assert lower_this_thread(system) and system.placed == {0: {1}}
    assert [c for c in system.calls[placed:] if c[0] == "sched_setaffinity"] == []


def test_refused_real_time_falls_back_to_nice_and_says_why():
    system = FakeSystem(refuse=True)
    said = apply_process_priority(PriorityClass("background", 5, 10), "auto", system)
    assert system.calls[-1] == ("setpriority", FakeSystem.PRIO_PROCESS, 0, 10)
    assert "nice 10" in said and "refused" in said and "Operation not permitted" in said
    # the arm loops keep their nice value: no privilege to raise it
    system = FakeSystem(refuse=True)
    said = apply_process_priority(PRIORITY_CLASSES["control"], "auto", system)
    assert [c[0] for c in system.calls] == ["sched_setscheduler"]
    assert "normal scheduling" in said and "refused" in said


def test_a_nice_value_is_never_lowered_and_normal_or_off_changes_nothing():
    system = FakeSystem(refuse=True, nice=15)
    apply_process_priority(PRIORITY_CLASSES["generate"], "auto", system)
    assert system.nice == 15 and not any(c[0] == "setpriority" for c in system.calls)
    system = FakeSystem()
    apply_process_priority(PRIORITY_CLASSES["normal"], "auto", system)
    assert system.calls == []
    system = FakeSystem()
    assert "unchanged" in apply_process_priority(PRIORITY_CLASSES["control"], "off", system)
    assert system.calls == []
    with pytest.raises(ConfigurationError, match=f"{REALTIME_ENV}.*'auto' or 'off'.*'yes'"):
        apply_process_priority(PRIORITY_CLASSES["control"], "yes", FakeSystem())


def test_a_background_thread_leaves_real_time_and_lowers_itself():
    system = FakeSystem(policy=FakeSystem.SCHED_RR)
    assert lower_this_thread(system)
    assert system.policy == FakeSystem.SCHED_OTHER and system.nice == BACKGROUND_THREAD_NICE
    assert not lower_this_thread(system)  # already there
    system = FakeSystem(nice=19)
    assert not lower_this_thread(system) and system.nice == 19  # never raised


def test_the_recorders_file_writer_runs_behind_its_drains(tmp_path):
    """The writer thread of an episode lowers itself (the process's drains keep their priority)."""
    import threading

    from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder

    recorder = EpisodeRecorder(tmp_path, {"/x": 10.0})
    recorder.start(EpisodeMetadata(task="t"))
    writer = next(t for t in threading.enumerate() if t.name.startswith("episode-writer"))
    deadline = time.monotonic() + 10.0  # the thread lowers itself as it starts: wait for it, not a fixed time
    while (nice := os.getpriority(os.PRIO_PROCESS, writer.native_id)) < BACKGROUND_THREAD_NICE \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    recorder.stop()
    assert nice >= BACKGROUND_THREAD_NICE


def test_every_node_declares_a_known_class():
    from rynn_teleop.nodes import REGISTRY, node_class

    classes = {name: node_class(name).PRIORITY for name in REGISTRY}
    assert set(classes.values()) <= set(PRIORITY_CLASSES)
    assert classes["arm_ik"] == classes["arm_driver"] == classes["hand_driver"] == "control"
    assert classes["tracker"] == classes["hand_retarget"] == "input"
    assert classes["head_camera"] == classes["camera_switch"] == "stream"
    assert (classes["world_model"], classes["recorder"]) == ("generate", "record")
    # the recorder's drains come right after the arm loops: its subscriptions' history is short
    assert list(PRIORITY_CLASSES)[:2] == ["control", "record"]
    assert classes["robot_description"] == "normal"
    assert classes["console"] == "input"  # XR frames reach the tracker and hand_retarget through it


CHILD = textwrap.dedent("""
    import json, os, sys, threading
    from rynn_teleop.nodes import node_class
    from rynn_teleop.nodes.process import process_priority_class, use_process_priority
    cls = process_priority_class([node_class(n) for n in sys.argv[1:]])
    go, started = threading.Event(), {}

    def early():  # a thread that exists before the call (the middleware's, a loop's)
        go.wait()
        started.update(policy=os.sched_getscheduler(0), nice=os.nice(0), cpus=sorted(os.sched_getaffinity(0)))

    before = threading.Thread(target=early)
    before.start()
    start_up = os.sched_getscheduler(0)
    said = use_process_priority(cls)
    go.set(); before.join()
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(policy=os.sched_getscheduler(0), nice=os.nice(0),
                                                         cpus=sorted(os.sched_getaffinity(0))))
    thread.start(); thread.join()
    print(json.dumps({"said": said, "thread": seen, "early": started, "start_up": start_up}))
""")


def _child(nodes: list[str], mode: str) -> dict:
    env = dict(os.environ, **{REALTIME_ENV: mode})
    out = subprocess.run([sys.executable, "-c", CHILD, *nodes], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rr_permitted() -> bool:
    probe = "import os; os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling calls")
def test_a_runner_process_and_the_threads_it_starts_take_its_nodes_class():
    """The process running arm_ik and the recorder: start-up runs as the process was started; then its
    threads (loops, the middleware's), those that exist and those started afterwards, take the arm loops'
    class. Where real-time scheduling is refused, only the log says so."""
    got = _child(["recorder", "arm_ik"], "auto")
    assert got["start_up"] == os.sched_getscheduler(0)  # start-up runs as started
    started_cpus = sorted(os.sched_getaffinity(0))  # a child starts with this thread's CPUs
    if _rr_permitted():
        assert got["thread"]["policy"] == got["early"]["policy"] == os.SCHED_RR
        assert "SCHED_RR priority 30" in got["said"]
    else:
        assert got["thread"]["policy"] == os.sched_getscheduler(0) and "refused" in got["said"]  # as started
    assert got["thread"]["cpus"] == got["early"]["cpus"] == started_cpus  # nodes placed differently: not placed
    # the arm loops alone: on the control CPU where real time is granted
    got = _child(["arm_ik"], "auto")
    control = started_cpus[:1] if _rr_permitted() and len(started_cpus) > 1 else started_cpus
    assert got["thread"]["cpus"] == got["early"]["cpus"] == control
    # the world model alone: nice 10 in the normal scheduler, real time permitted or not, not placed
    got = _child(["world_model"], "auto")
    assert got["thread"]["nice"] >= 10 and got["early"]["nice"] >= 10
    assert got["thread"]["policy"] == got["early"]["policy"] == os.sched_getscheduler(0)
    assert got["thread"]["cpus"] == got["early"]["cpus"] == started_cpus
    # no nodes (the demo's parent, which spawns the stack): as started, so its children may use every CPU
    got = _child([], "auto")
    assert got["thread"]["cpus"] == got["early"]["cpus"] == started_cpus and got["said"] == "normal: normal scheduling"
    # off: as started (a child starts with this thread's scheduling)
    got = _child(["arm_ik"], "off")
    assert got["thread"]["policy"] == os.sched_getscheduler(0) and "unchanged" in got["said"]
    assert got["thread"]["cpus"] == started_cpus


COMPOSED = textwrap.dedent("""
    import json, os
    from rynn_teleop.runner import Composition
    with Composition(["joint_sweep"]) as comp:
        policies = sorted({os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")})
        print(json.dumps({"said": comp.priority, "policies": policies}))
""")


@pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux scheduling calls")
def test_the_composed_runner_gives_all_its_threads_its_nodes_class(ros_env):
    """Its loop, executor and middleware threads all run in the class of its nodes once they are built."""
    env = dict(ros_env, **{REALTIME_ENV: "auto"})
    out = subprocess.run([sys.executable, "-c", COMPOSED], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["said"].startswith("input: ")
    assert got["policies"] == [os.SCHED_RR if _rr_permitted() else os.sched_getscheduler(0)]
    env[REALTIME_ENV] = "sometimes"
    out = subprocess.run([sys.executable, "-c", COMPOSED], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "RYNN_TELEOP_REALTIME must be 'auto' or 'off'" in out.stderr


def test_a_console_script_with_a_bad_setting_refuses_to_start(ros_env):
    script = ("import sys; from rynn_teleop.nodes import node_class; from rynn_teleop.nodes.base import run_single; "
              "sys.exit(run_single(node_class('joint_sweep'), ['joint_sweep']))")
    env = dict(ros_env, **{REALTIME_ENV: "sometimes"})
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "[joint_sweep] refusing to start: RYNN_TELEOP_REALTIME must be 'auto' or 'off'" in out.stderr


def test_a_node_process_keeps_blas_to_one_thread():
    """A BLAS worker inherits the real-time priority of the node thread that first calls into BLAS and waits for
    work by spinning: a node process keeps numpy's BLAS to one thread (``nodes.process.tune_threads``)."""
    code = ("import json, numpy, threadpoolctl\n"
            "from rynn_teleop.nodes.process import tune_threads\n"
            "before = [p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'blas']\n"
            "tune_threads()\n"
            "after = [p['num_threads'] for p in threadpoolctl.threadpool_info() if p['user_api'] == 'blas']\n"
            "print(json.dumps([before, after]))\n")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    before, after = json.loads(out.stdout.splitlines()[-1])
    assert after and set(after) == {1}, (before, after)  # numpy's BLAS found, and limited to one thread
