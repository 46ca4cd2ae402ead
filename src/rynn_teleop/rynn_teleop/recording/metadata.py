"""Where an episode's description lives: ``episode.yaml`` and rosbag2's ``metadata.yaml``.

Every episode directory holds a rosbag2 bag (``metadata.yaml`` + one MCAP file) and a sidecar
``episode.yaml``, both carrying the same description (task, operator, notes, camera sources, robot
description hash, calibration, software version, expected rates, state and, once stopped, the statistics):

* ``episode.yaml``: plain YAML, written at the start (``state: recording``) and rewritten at stop, failure
  or recovery, so a killed recorder leaves the description for ``recover`` (rosbag2 writes
  ``metadata.yaml`` only when a bag is closed);
* ``metadata.yaml``'s ``custom_data`` (rosbag2 metadata version >= 6): the same fields as strings under
  ``rynn_teleop.<field>`` (non-strings as compact JSON), so the bag describes itself to any rosbag2 tool.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..core.yamlfile import read_yaml
from .errors import EpisodeDataError

SIDECAR = "episode.yaml"
SIDECAR_FORMAT = "rynn_teleop/episode/1"
METADATA = "metadata.yaml"
CUSTOM_PREFIX = "rynn_teleop."


def write_yaml_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as YAML to ``path`` through a temporary file and a rename (never half-written).

    Raises:
        OSError: the file cannot be written.
    """
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        yaml.safe_dump(dict(data), f, sort_keys=False, default_flow_style=False, allow_unicode=True)
        f.flush()
    os.replace(tmp, path)


def read_sidecar(bag_dir: str | Path) -> dict[str, Any] | None:
    """The episode description of ``bag_dir/episode.yaml``, or None if there is none.

    Raises:
        EpisodeDataError: the file exists but is not a mapping of YAML.
    """
    path = Path(bag_dir) / SIDECAR
    if not path.is_file():
        return None
    return read_yaml(path, "episode description", error=EpisodeDataError, mapping=True)


def write_sidecar(bag_dir: str | Path, doc: Mapping[str, Any]) -> None:
    """Write ``bag_dir/episode.yaml`` atomically.

    Raises:
        OSError: the file cannot be written.
    """
    body = {k: v for k, v in doc.items() if k != "format"}
    write_yaml_atomic(Path(bag_dir) / SIDECAR, {"format": SIDECAR_FORMAT, **body})


def custom_data(doc: Mapping[str, Any]) -> dict[str, str]:
    """The episode description as rosbag2 ``custom_data``: ``rynn_teleop.<key>`` -> string (JSON if not a string)."""
    out = {}
    for key, value in doc.items():
        if key == "format":
            continue
        if isinstance(value, str):
            out[CUSTOM_PREFIX + key] = value
        else:
            out[CUSTOM_PREFIX + key] = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return out


def doc_from_custom_data(data: Mapping[str, str] | None) -> dict[str, Any]:
    """Inverse of :func:`custom_data` (keys without the ``rynn_teleop.`` prefix are ignored)."""
    doc: dict[str, Any] = {}
    for key, value in (data or {}).items():
        if not key.startswith(CUSTOM_PREFIX):
            continue
        try:
            doc[key[len(CUSTOM_PREFIX):]] = json.loads(value)
        except ValueError:
            doc[key[len(CUSTOM_PREFIX):]] = value
    return doc


def read_metadata(bag_dir: str | Path) -> dict[str, Any] | None:
    """The ``rosbag2_bagfile_information`` mapping of ``bag_dir/metadata.yaml``, or None if absent.

    Raises:
        EpisodeDataError: the file exists but is not rosbag2 metadata.
    """
    path = Path(bag_dir) / METADATA
    if not path.is_file():
        return None
    doc = read_yaml(path, "rosbag2 metadata", error=EpisodeDataError, mapping=True)
    try:
        return dict(doc["rosbag2_bagfile_information"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EpisodeDataError(f"{path} is not rosbag2 metadata: {exc}", episode=path.parent) from exc


def salvage_problems(doc: Mapping[str, Any]) -> list[str]:
    """The problem a salvaged episode carries (``salvage`` of its description): the messages its source lost.
    Empty for any other episode, and for a salvage that lost no message (only the index or other non-message
    data of its source was damaged)."""
    salvage = doc.get("salvage")
    if not isinstance(salvage, Mapping):
        return []
    lost = salvage.get("lost_messages") or {}
    total = sum(int(n) for n in lost.values()) if isinstance(lost, Mapping) else 0
    if not total:
        return []
    source = Path(str(salvage.get("from", "?"))).name
    return [f"salvaged from the damaged episode {source}: {total} message(s) lost ({', '.join(sorted(lost))})"]


def episode_doc(bag_dir: str | Path) -> dict[str, Any]:
    """The episode description: the sidecar, else ``metadata.yaml``'s custom data, else empty.

    Raises:
        EpisodeDataError: a file exists but cannot be parsed.
    """
    doc = read_sidecar(bag_dir)
    if doc is not None:
        return doc
    meta = read_metadata(bag_dir)
    return doc_from_custom_data(meta.get("custom_data") if meta else None)
