"""Load an exported dataset with LeRobot's own reader and dump what it returns (run in .venv-lerobot/).

Usage: python tests/lerobot_check.py ROOT REPO_ID OUT.npz INDEX [INDEX ...]

Writes OUT.npz with, per queried frame index I: ``I/image.<key>`` (H, W, 3) uint8 (rounded), ``I/float.<key>``
(3, H, W) float32 in [0, 1] exactly as LeRobot returns it, ``I/state``,
``I/action``, ``I/timestamp``, ``I/frame_index``, ``I/episode_index``, ``I/index``, and a JSON
summary ``summary`` (features, lengths, fps, tasks, policy feature types, each video key's feature
``info`` as LeRobot's metadata holds it, a delta-timestamp item's shapes). A depth key comes back like any
video key, ``I/image.<key>`` as LeRobot decodes it. Exits non-zero with LeRobot's traceback if LeRobot
rejects the dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile


def main(argv: list[str]) -> int:
    root, repo_id, out = argv[0], argv[1], argv[2]
    indices = [int(x) for x in argv[3:]]
    cache = tempfile.mkdtemp(prefix="lerobot-check-")
    try:
        return _check(root, repo_id, out, indices, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _check(root: str, repo_id: str, out: str, indices: list[int], cache: str) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HOME", cache)
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join(cache, "datasets"))

    import lerobot
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    try:  # LeRobot 0.6 (the environment's release)
        from lerobot.utils.feature_utils import dataset_to_policy_features
    except ImportError:  # LeRobot 0.4-0.5
        from lerobot.datasets.utils import dataset_to_policy_features

    ds = LeRobotDataset(repo_id, root=root)
    fps = ds.fps
    image_keys = list(ds.meta.video_keys)
    arrays: dict[str, np.ndarray] = {}
    for i in indices:
        item = ds[i]
        for key in image_keys:
            chw = item[key].numpy()
            arrays[f"{i}/float.{key}"] = chw
            arrays[f"{i}/image.{key}"] = np.clip(np.round(chw.transpose(1, 2, 0) * 255.0), 0, 255).astype(np.uint8)
        for name, key in (("state", "observation.state"), ("action", "action")):
            arrays[f"{i}/{name}"] = item[key].numpy()
        for key in ("timestamp", "frame_index", "episode_index", "index", "task_index", "stamp_ns"):
            arrays[f"{i}/{key}"] = item[key].numpy()
        arrays[f"{i}/task"] = np.array(item["task"])

    delta = {"action": [k / fps for k in range(4)], image_keys[0]: [-1 / fps, 0.0]}
    chunked = LeRobotDataset(repo_id, root=root, delta_timestamps=delta)
    mid = chunked[len(chunked) // 2]
    summary = {
        "lerobot_version": getattr(lerobot, "__version__", "?"),
        "num_frames": ds.num_frames,
        "num_episodes": ds.num_episodes,
        "fps": fps,
        "features": {k: {"dtype": v["dtype"], "shape": list(v["shape"]), "names": v.get("names")}
                     for k, v in ds.features.items()},
        "video_keys": image_keys,
        "episode_lengths": [int(x) for x in ds.meta.episodes["length"]],
        "tasks": [str(t) for t in ds.meta.tasks.index],
        "policy_features": {k: str(v.type) for k, v in dataset_to_policy_features(ds.features).items()},
        "stats_keys": sorted(ds.meta.stats),
        "feature_info": {k: ds.meta.info["features"][k].get("info") for k in image_keys},
        "chunk_action_shape": list(mid["action"].shape),
        "chunk_image_shape": list(mid[image_keys[0]].shape),
    }
    np.savez(out, summary=np.array(json.dumps(summary)), **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
