"""Write a tiny ACT policy folder as ``lerobot-train`` lays it out, or dump LeRobot's preprocessing of a dataset
frame (run in LeRobot's environment, ``scripts/lerobot_env.sh``; LeRobot 0.6.1).

Usage:
    python tests/lerobot_tiny_policy.py write DATASET_ROOT OUT [--repo-id R] [--chunk-size 5] [--n-action-steps N]
        [--seed 0] [--action-dims N] [--permute-state-names]
    python tests/lerobot_tiny_policy.py frame POLICY_FOLDER DATASET_ROOT INDEX OUT.npz

``write`` makes OUT as a ``lerobot-train --output_dir=OUT --steps=1`` run leaves it: ``checkpoints/000001/
pretrained_model/`` (config.json, model.safetensors, train_config.json, policy_preprocessor.json and
policy_postprocessor.json with their normalizer state files) and the relative link ``checkpoints/last``. The
policy is built as lerobot-train builds it: ``make_policy`` from the dataset's metadata (features from
meta/info.json) and ``make_pre_post_processors`` with the dataset's stats (ImageNet stats for the cameras, as
``--dataset.use_imagenet_stats=true`` does), randomly initialised (seeded; ``pretrained_backbone_weights=None``,
nothing downloaded) and tiny (dim_model 32, 2 heads, feed-forward 64, one layer each), then saved with LeRobot's
own ``save_pretrained``. The wrong variants train on a copy of the dataset's meta/ under ``OUT/dataset``
(train_config.json's dataset.root points there): ``--action-dims N`` keeps the first N action joints (a
policy of another robot); ``--permute-state-names`` swaps the names of the first two state joints.

``frame`` writes OUT.npz with ``raw.<key>``, dataset frame INDEX as LeRobot's reader returns it (images as
(H, W, 3) uint8, the reader's [0, 1] floats times 255 rounded; the state float32), and ``norm.<key>``, every
tensor of the policy folder's preprocessor applied to that frame as a training batch of one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path


def _offline() -> None:
    cache = tempfile.mkdtemp(prefix="lerobot-tiny-")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HOME", cache)
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(cache, "datasets"))


def _wrong_meta(root: Path, out: Path, action_dims: int | None, permute_state: bool) -> Path:
    """A copy of ``root``'s meta/ under ``out`` changed as asked; returns the copy's root."""
    import numpy as np

    copy = out / "dataset"
    shutil.copytree(root / "meta", copy / "meta")
    info = json.loads((copy / "meta/info.json").read_text())
    stats = json.loads((copy / "meta/stats.json").read_text())
    if action_dims is not None:
        feature = info["features"]["action"]
        feature["shape"] = [action_dims]
        feature["names"] = feature["names"][:action_dims]
        stats["action"] = {k: np.asarray(v)[..., :action_dims].tolist() if np.ndim(v) else v
                           for k, v in stats["action"].items()}
    if permute_state:
        names = info["features"]["observation.state"]["names"]
        names[0], names[1] = names[1], names[0]
    (copy / "meta/info.json").write_text(json.dumps(info, indent=4))
    (copy / "meta/stats.json").write_text(json.dumps(stats, indent=4))
    return copy


def write(args: argparse.Namespace) -> int:
    _offline()
    import torch
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.dataset_metadata import LeRobotDatasetMetadata
    from lerobot.policies import ACTConfig, make_policy, make_pre_post_processors
    from lerobot.utils.constants import CHECKPOINTS_DIR, IMAGENET_STATS, LAST_CHECKPOINT_LINK, PRETRAINED_MODEL_DIR
    from lerobot.utils.random_utils import set_seed

    out = Path(args.out)
    root = Path(args.dataset_root).resolve()
    if args.action_dims is not None or args.permute_state_names:
        root = _wrong_meta(root, out, args.action_dims, args.permute_state_names).resolve()
    meta = LeRobotDatasetMetadata(args.repo_id, root=root)
    set_seed(args.seed)
    cfg = ACTConfig(chunk_size=args.chunk_size, n_action_steps=args.n_action_steps or args.chunk_size,
                    dim_model=32, n_heads=2, dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1,
                    n_vae_encoder_layers=1, latent_dim=8, pretrained_backbone_weights=None, device="cpu",
                    push_to_hub=False)
    policy = make_policy(cfg, ds_meta=meta)
    stats = {k: dict(v) for k, v in meta.stats.items()}
    for key in meta.camera_keys:  # --dataset.use_imagenet_stats=true (lerobot-train's default)
        for stat, value in IMAGENET_STATS.items():
            stats[key][stat] = torch.tensor(value, dtype=torch.float32)
    preprocessor, postprocessor = make_pre_post_processors(cfg, dataset_stats=stats)
    train = TrainPipelineConfig(dataset=DatasetConfig(repo_id=args.repo_id, root=str(root)), policy=cfg,
                                output_dir=out, steps=1, batch_size=1, num_workers=0, seed=args.seed, save_freq=1)
    folder = out / CHECKPOINTS_DIR / "000001" / PRETRAINED_MODEL_DIR  # common/train_utils.save_checkpoint
    policy.save_pretrained(folder)
    train.save_pretrained(folder)
    preprocessor.save_pretrained(folder)
    postprocessor.save_pretrained(folder)
    (out / CHECKPOINTS_DIR / LAST_CHECKPOINT_LINK).symlink_to("000001")
    print(folder)
    return 0


def frame(args: argparse.Namespace) -> int:
    _offline()
    import numpy as np
    from lerobot.configs import PreTrainedConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.policies import make_pre_post_processors

    folder = args.policy_folder
    cfg = PreTrainedConfig.from_pretrained(folder, cli_overrides=["--device=cpu"])
    preprocessor, _ = make_pre_post_processors(cfg, pretrained_path=folder,
                                               preprocessor_overrides={"device_processor": {"device": "cpu"}})
    info = json.loads((Path(args.dataset_root) / "meta/info.json").read_text())
    item = LeRobotDataset(info.get("repo_id", "test/policy"), root=args.dataset_root)[args.index]
    arrays = {}
    batch = {}
    for key in cfg.input_features:
        value = item[key]
        if "image" in key:
            arrays[f"raw.{key}"] = np.clip(np.round(value.numpy().transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)
        else:
            arrays[f"raw.{key}"] = value.numpy().astype(np.float32)
        batch[key] = value.unsqueeze(0)
    batch["task"] = [item["task"]]
    for key, value in preprocessor(batch).items():
        if hasattr(value, "numpy"):
            arrays[f"norm.{key}"] = value.detach().cpu().numpy()
    np.savez(args.out, **arrays)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("dataset_root")
    w.add_argument("out")
    w.add_argument("--repo-id", default="test/policy")
    w.add_argument("--chunk-size", type=int, default=5)
    w.add_argument("--n-action-steps", type=int, default=0, help="0: the chunk size")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--action-dims", type=int, default=None)
    w.add_argument("--permute-state-names", action="store_true")
    f = sub.add_parser("frame")
    f.add_argument("policy_folder")
    f.add_argument("dataset_root")
    f.add_argument("index", type=int)
    f.add_argument("out")
    args = parser.parse_args(argv)
    return write(args) if args.command == "write" else frame(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
