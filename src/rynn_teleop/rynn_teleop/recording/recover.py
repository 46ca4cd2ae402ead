"""``recover``: make the bag of a killed recorder readable again (ROS-free).

A recorder killed with SIGKILL (or by a power cut) leaves an MCAP file that
ends in the middle of a record, without summary or footer, and no
``metadata.yaml``. :func:`recover_bag` keeps every complete chunk (the writer
flushes one at least every ``flush_period_s``), cuts the rest, appends an index
and footer (:func:`.mcapfile.repair`) and writes ``metadata.yaml`` as rosbag2
and rosbags write it, with the episode description of ``episode.yaml`` in its
custom data and integrity statistics recomputed from what survived (the
episode stop is then the last surviving receive time). Recovering a bag that
was closed properly only rewrites ``metadata.yaml`` and ``episode.yaml`` with
the same content; recovering twice is harmless.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

from rosbags.rosbag2.metadata import dump_qos_v9, parse_qos
from ruamel.yaml import YAML

from .cdr import has_header
from .errors import RecordingError
from .mcapfile import Scan, repair, scan
from .metadata import (
    METADATA,
    custom_data,
    doc_from_custom_data,
    read_metadata,
    read_sidecar,
    write_sidecar,
)
from .stats import EpisodeStats, episode_stats
from .writer import BAG_VERSION, UNKNOWN_TYPE_HASH, default_typestore


@dataclass(frozen=True)
class RecoverResult:
    """What :func:`recover_bag` found and did."""

    bag_dir: Path
    was_complete: bool  # the MCAP file had its footer: only the metadata was rewritten
    bytes_cut: int  # bytes of incomplete records removed from the end of the file
    message_count: int  # messages in the recovered bag
    stats: EpisodeStats


def mcap_file(bag_dir: str | Path) -> Path:
    """The MCAP file of a bag directory (``<name>.mcap``, else the only ``*.mcap`` in it).

    Raises:
        RecordingError: none, or several without the standard name.
    """
    bag_dir = Path(bag_dir)
    if not bag_dir.is_dir():
        raise RecordingError(f"{bag_dir} is not a directory")
    standard = bag_dir / f"{bag_dir.name}.mcap"
    if standard.is_file():
        return standard
    found = sorted(bag_dir.glob("*.mcap"))
    if len(found) != 1:
        raise RecordingError(f"{bag_dir}: expected one MCAP file, found {len(found)}")
    return found[0]


def _topics(result: Scan) -> list[dict[str, Any]]:
    """``topics_with_message_count`` entries of metadata.yaml (version 9) for the scanned channels."""
    typestore = default_typestore()
    out = []
    for cid in sorted(result.channels):
        ch = result.channels[cid]
        schema = result.schemas.get(ch.schema_id)
        type_name = schema.name if schema is not None else ""
        qos_text = ch.metadata.get("offered_qos_profiles", "")
        out.append(
            {
                "topic_metadata": {
                    "name": ch.topic,
                    "type": type_name,
                    "serialization_format": ch.message_encoding,
                    "offered_qos_profiles": dump_qos_v9(parse_qos(qos_text)),
                    "type_description_hash": (
                        typestore.hash_rihs01(type_name) if type_name in typestore.fielddefs else UNKNOWN_TYPE_HASH
                    ),
                },
                "message_count": len(result.times.get(cid, ())),
            }
        )
    return out


def bag_metadata(mcap_name: str, result: Scan, custom: dict[str, str]) -> dict[str, Any]:
    """The ``rosbag2_bagfile_information`` of a one-file MCAP bag, as rosbags' writer produces it."""
    times = [t for ts in result.times.values() for t in ts]
    start = min(times, default=0)
    duration = max(times, default=0) - start
    count = len(times)
    return {
        "version": BAG_VERSION,
        "storage_identifier": "mcap",
        "relative_file_paths": [mcap_name],
        "duration": {"nanoseconds": duration},
        "starting_time": {"nanoseconds_since_epoch": start},
        "message_count": count,
        "topics_with_message_count": _topics(result),
        "compression_format": "",
        "compression_mode": "",
        "files": [
            {
                "path": mcap_name,
                "starting_time": {"nanoseconds_since_epoch": start},
                "duration": {"nanoseconds": duration},
                "message_count": count,
            }
        ],
        "custom_data": custom or None,
        "ros_distro": "rosbags",
    }


def _dump(data: Any) -> str:
    """YAML text in rosbags' style (ruamel, block style), which rosbag2's yaml-cpp reads."""
    stream = StringIO()
    writer = YAML(typ="safe")
    writer.default_flow_style = False
    writer.dump(data, stream)
    return stream.getvalue()


def _recorder_alive(doc: dict[str, Any]) -> int | None:
    """The pid of the recorder that is still writing this episode on this host, if any."""
    rec = doc.get("recorder") or {}
    pid = rec.get("pid")
    if doc.get("state") != "recording" or rec.get("host") != socket.gethostname() or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid  # exists, owned by someone else
    return pid


def recover_bag(bag_dir: str | Path, *, force: bool = False) -> RecoverResult:
    """Make ``bag_dir`` a complete rosbag2 bag again (see the module description).

    Args:
        force: recover even if ``episode.yaml`` names a live recorder process on this
            host (a recycled pid); never do this to an episode being recorded.

    Raises:
        RecordingError: no MCAP file, not an MCAP file, the episode is still being
            recorded, or files that cannot be written.
    """
    bag_dir = Path(bag_dir)
    path = mcap_file(bag_dir)
    sidecar = read_sidecar(bag_dir)
    if sidecar is not None and not force and (pid := _recorder_alive(sidecar)) is not None:
        raise RecordingError(
            f"{bag_dir} is still being recorded by process {pid} on this host; stop it first (or --force if that pid is reused)"
        )
    result = scan(path)
    was_complete = result.complete
    size_before = result.size
    if sidecar is not None:
        doc = sidecar
    else:
        try:
            meta = read_metadata(bag_dir)
        except RecordingError:
            meta = None  # a half-written metadata.yaml is what recover replaces
        doc = doc_from_custom_data(meta.get("custom_data") if meta else None)
    if was_complete and doc.get("state") == "complete" and doc.get("stats"):
        stats = EpisodeStats.from_dict(doc["stats"])  # written at stop, with the recorder's drop counts
    else:
        times_by_topic: dict[str, tuple[str, list[int]]] = {}
        stamps_by_topic: dict[str, list[int]] = {}  # header stamps as times, 0 for types without a header
        typestore = default_typestore()
        for cid, ch in result.channels.items():
            schema = result.schemas.get(ch.schema_id)
            type_name = schema.name if schema is not None else ""
            known_type, times = times_by_topic.setdefault(ch.topic, (type_name, []))
            times.extend(ch_times := result.times.get(cid, ()))
            stamps_by_topic.setdefault(ch.topic, []).extend(
                result.stamps.get(cid, ()) if has_header(typestore, type_name) else [0] * len(ch_times)
            )
            if type_name not in known_type.split(", "):
                times_by_topic[ch.topic] = (f"{known_type}, {type_name}", times)
        all_times = [t for _, ts in times_by_topic.values() for t in ts]
        start_ns = int(doc.get("start_ns") or min(all_times, default=0))
        stop_ns = int(doc.get("stop_ns") or max(all_times, default=start_ns))
        stats = episode_stats(
            times_by_topic,
            start_ns=start_ns,
            stop_ns=stop_ns,
            expected_rates=doc.get("expected_rates") or {},
            stamps=stamps_by_topic,
            gap_rates=doc.get("gap_rates") or {},
        )
        doc.update(state="recovered", stop_ns=stop_ns, stats=stats.to_dict(), problems=stats.problems())
    custom = custom_data(doc)
    info = bag_metadata(path.name, result, custom)
    try:
        if not was_complete:
            repair(path, result, {"serialized_metadata": _dump(info).strip()})
        meta_path = bag_dir / METADATA
        tmp = meta_path.with_name(METADATA + ".tmp")
        tmp.write_text(_dump({"rosbag2_bagfile_information": info}), encoding="utf-8")
        tmp.replace(meta_path)
        if sidecar is not None:
            write_sidecar(bag_dir, doc)
    except OSError as exc:
        raise RecordingError(f"cannot recover {bag_dir}: {exc.strerror or exc}") from exc
    return RecoverResult(
        bag_dir=bag_dir,
        was_complete=was_complete,
        bytes_cut=0 if was_complete else max(0, size_before - result.keep_end),
        message_count=result.message_count,
        stats=stats,
    )

