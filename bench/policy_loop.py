"""The whole loop: scripted twin demonstrations -> LeRobot export -> ACT trained by LeRobot's trainer -> evaluation.

    .venv/bin/python bench/policy_loop.py [--demos 50] [--eval-seeds 0-19] [--steps 6000] [--out DIR]
                                          [--from record|export|train|evaluate]   # about 55 min on 2 cores

Named steps, each writing into ``--out`` (default a temporary folder; ``--from`` reruns the later steps on a
folder an earlier run left):

1. ``record``: the scripted operator does the ``pick_place`` task through the whole stack (``bench/sim_tasks.py``'s
   stack: the digital mode's nodes with the twin, the synthetic tracker and glove following the twin's layout,
   arm_ik, retargeting, the drivers' safety layer, the recorder), the camera switched to the physical feed (the
   head camera drawing the twin) so the recorded consumer feed is what a policy will see; one episode per layout
   seed 1000.. (never an evaluation seed). Only episodes the twin judged successful are kept as demonstrations.
2. ``export``: ``rynn-teleop episodes export`` of those episodes at the training image size (``--image-size``),
   each without its idle start (``--trim-idle-start``: the scripted operator waits about 2.5 s at home before it
   reaches; kept, those frames teach ACT that the scene at rest means "stay at rest", and the trained arms never
   moved).
3. ``train``: ``lerobot-train`` in the LeRobot environment (``scripts/lerobot_env.sh``) with the committed
   configuration ``config/policy/act_cpu.yaml``: ACT from scratch (no pretrained backbone can be fetched here).
4. ``evaluate``: ``rynn-teleop policy eval`` of the trained policy on the evaluation seeds (fresh twins, layouts
   never recorded), and the baseline measured in the same run: one recorded demonstration replayed open-loop
   (the ``replay`` policy backend) on the same seeds.

The last line printed is one JSON object: both success rates with their 95 % intervals, the ratio, the settings
and each step's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_tasks import parse_seeds, run_stack  # noqa: E402

TASK = "pick_place"
STEPS = ("record", "export", "train", "evaluate")
DEMO_SEED0 = 1000  # demonstrations use layouts 1000.. ; evaluation 0..
IMAGE_SIZE = (96, 72)  # [px] width, height of the exported frames the policy is trained on
TRAIN_CONFIG = ROOT / "config/policy/act_cpu.yaml"
RYNN = str(Path(sys.executable).parent / "rynn-teleop")


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def step_record(out: Path, demos: int) -> dict:
    """Record ``demos`` scripted episodes through the stack; the successful ones are listed in demos.json."""
    seeds = list(range(DEMO_SEED0, DEMO_SEED0 + demos))
    (out / "stack").mkdir(parents=True, exist_ok=True)
    result = run_stack(TASK, seeds, out / "stack", 100 + os.getpid() % 50, log, {}, ("--camera", "physical"))
    kept = [e["episode"] for e in result["episodes"] if e["success"] and e.get("episode")]
    (out / "demos.json").write_text(json.dumps({"episodes": kept, "stack": result}, indent=1))
    log(f"record: {len(kept)}/{len(seeds)} demonstrations succeeded on the twin")
    return {"recorded": len(seeds), "successful": len(kept), "wall_s": result["wall_s"]}


def step_export(out: Path) -> dict:
    """``rynn-teleop episodes export`` of the kept demonstrations at IMAGE_SIZE without their idle start
    (``--trim-idle-start``; episodes whose only problems are timing gaps of a loaded machine are kept: the twin
    judged them, ``--include-problems``)."""
    episodes = json.loads((out / "demos.json").read_text())["episodes"]
    dataset = out / "dataset"
    cmd = [RYNN, "episodes", "export", *episodes, "--out", str(dataset), "--repo-id", f"bench/{TASK}",
           "--image-size", f"{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}", "--trim-idle-start", "--include-problems", "--overwrite"]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    info = json.loads((dataset / "meta/info.json").read_text())
    log(f"export: {info['total_episodes']} episodes, {info['total_frames']} frames at {IMAGE_SIZE}")
    return {"episodes": info["total_episodes"], "frames": info["total_frames"], "image_size": list(IMAGE_SIZE)}


def step_train(out: Path, steps: int) -> dict:
    """``lerobot-train`` with config/policy/act_cpu.yaml on the export, in the LeRobot environment."""
    python = subprocess.run([str(ROOT / "scripts/lerobot_env.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    train = out / "train"
    shutil.rmtree(train, ignore_errors=True)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(out / "hf"))
    cmd = [str(Path(python).parent / "lerobot-train"), f"--config_path={TRAIN_CONFIG}",
           f"--dataset.root={out / 'dataset'}", f"--dataset.repo_id=bench/{TASK}", f"--output_dir={train}",
           f"--steps={steps}"]
    with (out / "train.log").open("w") as f:
        subprocess.run(cmd, check=True, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    losses = re.findall(r"step:(\d+)\S* .*? loss:([0-9.]+)", (out / "train.log").read_text())
    log(f"train: {steps} steps, last logged loss {losses[-1][1] if losses else '?'}")
    return {"steps": steps, "last_loss": float(losses[-1][1]) if losses else None, "config": str(TRAIN_CONFIG)}


def _eval(path: Path, seeds: list[int], report: Path, *extra: str) -> dict:
    """``rynn-teleop policy eval`` on consecutive ``seeds``: its report's summary."""
    shutil.rmtree(report, ignore_errors=True)
    cmd = [RYNN, "policy", "eval", str(path), "--task", TASK, "--episodes", str(len(seeds)), "--seed",
           str(seeds[0]), "--out", str(report), *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads((report / "report.json").read_text())["summary"]


def step_evaluate(out: Path, seeds: list[int]) -> dict:
    """The trained policy and the open-loop replay of demonstration 0, on the same fresh layouts."""
    if seeds != list(range(seeds[0], seeds[0] + len(seeds))):
        raise SystemExit("--eval-seeds must be consecutive (policy eval runs S..S+N-1)")
    policy = _eval(out / "train", seeds, out / "eval_policy")
    log(f"evaluate: policy {policy['successes']}/{policy['episodes']}")
    baseline = _eval(out / "dataset", seeds, out / "eval_replay", "--backend", "replay", "-p", "episode=0")
    log(f"evaluate: open-loop replay {baseline['successes']}/{baseline['episodes']}")
    rate, base = policy["success_rate"], baseline["success_rate"]
    return {"policy": policy, "baseline_open_loop_replay": baseline,
            "ratio": round(rate / base, 3) if base else None, "difference": round(rate - base, 4),
            "beats_baseline": rate > base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demos", type=int, default=50, help="scripted demonstrations to record (layouts 1000..)")
    parser.add_argument("--eval-seeds", default="0-19", help="evaluation layouts, e.g. 0-19")
    parser.add_argument("--steps", type=int, default=6000, help="training steps (batch 8; 6000: the measured run, "
                        "13/20 against the replay's 10/20)")
    parser.add_argument("--out", default=None, help="working folder (default: a temporary one, removed after a "
                        "complete run unless --keep)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--from", dest="start", choices=STEPS, default="record", help="first step to run")
    parser.add_argument("--until", choices=STEPS, default="evaluate", help="last step to run")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    out = Path(args.out or tempfile.mkdtemp(prefix="policy_loop_"))
    out.mkdir(parents=True, exist_ok=True)
    steps = STEPS[STEPS.index(args.start): STEPS.index(args.until) + 1]
    line: dict = {"task": TASK, "demos": args.demos, "eval_seeds": args.eval_seeds, "train_steps": args.steps,
                  "out": str(out)}
    t0 = time.monotonic()
    for name in steps:
        t = time.monotonic()
        if name == "record":
            line["record"] = step_record(out, args.demos)
        elif name == "export":
            line["export"] = step_export(out)
        elif name == "train":
            line["train"] = step_train(out, args.steps)
        else:
            line.update(step_evaluate(out, parse_seeds(args.eval_seeds)))
        line.setdefault("wall_s", {})[name] = round(time.monotonic() - t, 1)
    line["wall_s"]["total"] = round(time.monotonic() - t0, 1)
    print(json.dumps(line))
    if args.out is None and not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
