"""Serve one LeRobot policy folder over stdin/stdout (a script run by LeRobot's own Python, not a module).

Run as ``<lerobot python> lerobot_worker.py POLICY_FOLDER [--device cpu] [--threads 1] ...`` by
:class:`rynn_teleop.policies.lerobot.LeRobotPolicy`. It imports torch and LeRobot (0.6.1) and never the
``rynn_teleop`` package, whose dependencies are not in LeRobot's environment; the framing is the sibling file
``wire.py``, loaded by its location.

Loading is LeRobot's own (``lerobot-record --policy.path`` / ``lerobot-eval`` do the same):
``PreTrainedConfig.from_pretrained`` with overrides (device; ``pretrained_backbone_weights=null`` so that
nothing is downloaded, the trained backbone comes from model.safetensors; n_action_steps and
temporal_ensemble_coeff when given), ``get_policy_class(type).from_pretrained(strict=True)`` and
``make_pre_post_processors`` from the folder with the device override. One action is LeRobot's
``predict_action``: ``prepare_observation_for_inference`` -> preprocessor -> ``policy.select_action`` ->
postprocessor, so action chunking and temporal ensembling are the policy's own.

Protocol (wire.py messages; stdout carries nothing else: fd 1 is pointed at stderr at start, so prints of any
library go to the log): first the worker sends ``{"op": "ready", ...}`` (what it loaded) or
``{"op": "error", "phase": "load", "error": ...}`` and exits 1. Then, per request ``{"op": OP, "id": n}``, one
reply ``{"ok": true, "id": n, ...}`` or ``{"ok": false, "id": n, "error": "Type: text", "traceback": ...}``
(the worker keeps serving). OPs: ``spec``; ``reset``; ``act`` (arrays: the observation; reply array
``action``, the postprocessed action of the batch's first row, float32); ``normalized`` (arrays: the
observation; reply arrays: every tensor of the preprocessed batch, header ``values``: the others);
``close`` (reply, then exit 0). Every reply carries ``chunks``, how many times the model predicted an
action chunk since start, and ``seconds``, the request's time in the worker [s]. End of stdin: exit 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
wire = None  # the sibling wire.py, loaded by main() (importing this file has no side effect)


def _load_wire():
    spec = importlib.util.spec_from_file_location("rynn_policy_wire", os.path.join(_HERE, "wire.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="the policy folder (config.json, model.safetensors, policy_*processor*)")
    parser.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:N, mps, xpu")
    parser.add_argument("--n-action-steps", type=int, default=0, help="actions per model run (0: the policy's)")
    parser.add_argument("--temporal-ensemble-coeff", type=float, default=0.0,
                        help="ACT's temporal ensembling coefficient (0: the policy's own)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--seed", type=int, default=0, help="torch seed, set at start and at every reset")
    parser.add_argument("--task", default="", help="the task instruction (language-conditioned policies)")
    parser.add_argument("--robot-type", default="", help="the robot type (the dataset's robot_type)")
    return parser.parse_args(argv)


def _overrides(args: argparse.Namespace, fields: dict) -> list[str]:
    """The draccus overrides of config.json (its decoded ``fields``) that ``args`` ask for."""
    out = [f"--device={args.device}"]
    if "pretrained_backbone_weights" in fields:
        out.append("--pretrained_backbone_weights=null")  # no download; model.safetensors has the backbone
    for flag, value, absent in (("n_action_steps", args.n_action_steps, 0),
                                ("temporal_ensemble_coeff", args.temporal_ensemble_coeff, 0.0)):
        if value == absent:
            continue
        if flag not in fields:
            raise ValueError(f"policy type {fields.get('type')!r} has no setting {flag}")
        out.append(f"--{flag}={value}")
    if args.temporal_ensemble_coeff and not args.n_action_steps and "n_action_steps" in fields:
        out.append("--n_action_steps=1")  # ACT ensembles only when it predicts at every step
    return out


def _stat_warnings(preprocessor, eps_floor: float = 1e-6) -> list[str]:
    """Features whose normalisation divides by (almost) zero: a joint that never moved in the training data
    turns any deviation at run time into a huge input."""
    out = []
    for step in getattr(preprocessor, "steps", ()):
        stats = getattr(step, "_tensor_stats", None)
        norm_map = getattr(step, "norm_map", None)
        features = getattr(step, "features", None)
        if not stats or not norm_map or not features:
            continue
        for key, feature in features.items():
            mode = str(getattr(norm_map.get(feature.type), "value", norm_map.get(feature.type)))
            s = stats.get(key, {})
            if mode == "MEAN_STD" and "std" in s:
                spread = s["std"]
            elif mode == "MIN_MAX" and "min" in s and "max" in s:
                spread = s["max"] - s["min"]
            else:
                continue
            flat = spread.reshape(-1)
            bad = int((flat.abs() <= eps_floor).sum())
            if bad:
                out.append(f"{key}: {bad} of {flat.numel()} dimension(s) have a {mode} spread of 0 in the "
                           "training statistics; any deviation there is normalised to a huge value")
    return out


class Server:
    """The loaded policy and its requests."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from lerobot.configs import PreTrainedConfig
        from lerobot.policies import get_policy_class, make_pre_post_processors
        from lerobot.utils.device_utils import is_torch_device_available

        started = time.perf_counter()
        self.torch = torch
        self.args = args
        torch.set_num_threads(args.threads)
        try:
            torch.set_num_interop_threads(args.threads)
        except RuntimeError:  # only before the first parallel work; harmless if too late
            pass
        if not is_torch_device_available(args.device):  # LeRobot would switch device silently
            raise ValueError(f"torch device {args.device!r} is not available in this environment "
                             f"(torch {torch.__version__})")
        path = args.path
        with open(os.path.join(path, "config.json")) as f:
            fields = json.load(f)
        self.config = PreTrainedConfig.from_pretrained(path, cli_overrides=_overrides(args, fields))
        self.policy = get_policy_class(self.config.type).from_pretrained(path, config=self.config, strict=True)
        self.preprocessor, self.postprocessor = make_pre_post_processors(
            self.config, pretrained_path=path, preprocessor_overrides={"device_processor": {"device": args.device}})
        self.device = torch.device(self.config.device)
        self.chunks = 0
        predict = getattr(self.policy, "predict_action_chunk", None)
        if predict is not None:  # count model runs (select_action calls it when its queue is empty)
            def counted(*a, **k):
                self.chunks += 1
                return predict(*a, **k)

            self.policy.predict_action_chunk = counted
        self.reset()
        self.load_s = time.perf_counter() - started
        self.warnings = _stat_warnings(self.preprocessor)

    # ------------------------------------------------------------------ requests
    def ready(self) -> dict:
        import lerobot

        return {"op": "ready", **self.spec(), "load_s": self.load_s, "warnings": self.warnings,
                "versions": {"lerobot": getattr(lerobot, "__version__", "?"), "torch": self.torch.__version__,
                             "python": sys.version.split()[0]}}

    def spec(self) -> dict:
        cfg = self.config

        def features(table):
            return {k: {"type": str(getattr(f.type, "value", f.type)), "shape": list(f.shape)}
                    for k, f in (table or {}).items()}

        return {"type": cfg.type, "device": str(cfg.device), "input_features": features(cfg.input_features),
                "output_features": features(cfg.output_features),
                "chunk_size": getattr(cfg, "chunk_size", None), "n_action_steps": getattr(cfg, "n_action_steps", None),
                "temporal_ensemble_coeff": getattr(cfg, "temporal_ensemble_coeff", None),
                "threads": self.torch.get_num_threads()}

    def reset(self) -> dict:
        self.torch.manual_seed(self.args.seed)
        self.policy.reset()
        return {}

    def _batch(self, arrays: dict):
        """The observation arrays as LeRobot's predict_action makes its batch, preprocessed."""
        from lerobot.policies import prepare_observation_for_inference

        wanted = self.config.input_features or {}
        missing = [k for k in wanted if k not in arrays]
        if missing:
            raise ValueError(f"the observation lacks {', '.join(missing)} (it has {', '.join(arrays) or 'nothing'})")
        observation = {}
        for key, feature in wanted.items():
            array = arrays[key]
            shape = tuple(feature.shape)
            want = (shape[1], shape[2], shape[0]) if "image" in key and len(shape) == 3 else shape
            if array.shape != want:
                raise ValueError(f"{key} has shape {array.shape}, the policy takes {want}")
            observation[key] = array
        batch = prepare_observation_for_inference(observation, self.device, self.args.task or None,
                                                  self.args.robot_type or None)
        return self.preprocessor(batch)

    def _amp(self):
        from contextlib import nullcontext

        if self.device.type == "cuda" and getattr(self.config, "use_amp", False):
            return self.torch.autocast(device_type="cuda")
        return nullcontext()

    def act(self, arrays: dict) -> tuple[dict, dict]:
        with self.torch.inference_mode(), self._amp():
            action = self.postprocessor(self.policy.select_action(self._batch(arrays)))
        action = action.detach().to("cpu", self.torch.float32).numpy()
        return {}, {"action": action.reshape(action.shape[0], -1)[0] if action.ndim > 1 else action}

    def normalized(self, arrays: dict) -> tuple[dict, dict]:
        with self.torch.inference_mode(), self._amp():
            batch = self._batch(arrays)
        tensors, values = {}, {}
        for key, value in batch.items():
            if isinstance(value, self.torch.Tensor):
                tensors[key] = value.detach().to("cpu").numpy()
            else:
                values[key] = value if isinstance(value, (str, int, float, bool, list, type(None))) else repr(value)
        return {"values": values}, tensors


def _serve(server: Server, inp, out) -> int:
    while True:
        message = wire.read_message(inp)
        if message is None:
            return 0
        op, rid = message.header.get("op"), message.header.get("id")
        started = time.perf_counter()
        try:
            if op == "spec":
                header, arrays = server.spec(), {}
            elif op == "reset":
                header, arrays = server.reset(), {}
            elif op == "act":
                header, arrays = server.act(message.arrays)
            elif op == "normalized":
                header, arrays = server.normalized(message.arrays)
            elif op == "close":
                header, arrays = {}, {}
            else:
                raise ValueError(f"unknown request {op!r}")
            reply = {"ok": True, **header}
        except Exception as exc:  # noqa: BLE001 - reported to the runner; the worker keeps serving
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            arrays = {}
        reply.update(id=rid, chunks=server.chunks, seconds=time.perf_counter() - started)
        wire.write_message(out, reply, arrays)
        if op == "close":
            return 0


def main(argv: list[str]) -> int:
    global wire
    # The script's folder is sys.path[0], and it holds lerobot.py (the runner): it would shadow the lerobot package.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    wire = _load_wire()
    out = os.fdopen(os.dup(1), "wb")  # the protocol channel: the real stdout
    os.dup2(2, 1)  # everything else printed to fd 1 (Python or C) goes to stderr, the runner's log
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    sys.stdin = open(os.devnull)  # nothing else may read the protocol channel
    args = _arguments(argv)
    try:
        server = Server(args)
    except BaseException as exc:  # noqa: BLE001 - reported to the runner, which refuses to start
        traceback.print_exc()
        wire.write_message(out, {"op": "error", "phase": "load", "error": f"{type(exc).__name__}: {exc}"})
        return 1
    for line in server.warnings:
        print(f"lerobot_worker: warning: {line}", file=sys.stderr)
    wire.write_message(out, server.ready())
    try:
        return _serve(server, inp, out)
    except BrokenPipeError:  # the runner went away
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
