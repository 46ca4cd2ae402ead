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
from pathlib import Path
from typing import Any

from rosbags.rosbag2.metadata import parse_qos

from .cdr import has_header
from .errors import RecordingError
from .mcapfile import Scan, repair, scan
from .metadata import (
    custom_data,
    doc_from_custom_data,
    read_metadata,
    read_sidecar,
    write_sidecar,
)
from .stats import EpisodeStats, episode_stats
from .writer import BagTopic, bagfile_information, default_typestore, dump_yaml, type_hash, write_metadata_yaml


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


def _topics(result: Scan) -> list[BagTopic]:
    """The bag's connections (one per scanned channel, in channel id order) with their surviving counts."""
    typestore = default_typestore()
    out = []
    for cid in sorted(result.channels):
        ch = result.channels[cid]
        schema = result.schemas.get(ch.schema_id)
        type_name = schema.name if schema is not None else ""
        out.append(
            BagTopic(
                name=ch.topic,
                type_name=type_name,
                offered_qos=parse_qos(ch.metadata.get("offered_qos_profiles", "")),
                type_hash=type_hash(typestore, type_name),
                message_count=len(result.times.get(cid, ())),
                serialization_format=ch.message_encoding,
            )
        )
    return out


def bag_metadata(mcap_name: str, result: Scan, custom: dict[str, str]) -> dict[str, Any]:
    """The ``rosbag2_bagfile_information`` of a one-file MCAP bag, as the episode writer produces it."""
    times = [t for ts in result.times.values() for t in ts]
    return bagfile_information(
        mcap_name, _topics(result), start_ns=min(times, default=0), end_ns=max(times, default=0), custom_data=custom
    )


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


def _description_from_metadata(bag_dir: Path) -> dict[str, Any]:
    """The episode description kept in ``metadata.yaml``'s custom data (empty if there is none or it is cut)."""
    try:
        meta = read_metadata(bag_dir)
    except RecordingError:
        meta = None  # a half-written metadata.yaml is what recover replaces
    return doc_from_custom_data(meta.get("custom_data") if meta else None)


def _episode_window(result: Scan, doc: dict[str, Any]) -> tuple[int, int]:
    """(start, stop) [ns] of the episode: the description's, else the first and last surviving receive times."""
    all_times = [t for cid in result.channels for t in result.times.get(cid, ())]
    start_ns = int(doc.get("start_ns") or min(all_times, default=0))
    stop_ns = int(doc.get("stop_ns") or max(all_times, default=start_ns))
    return start_ns, stop_ns


def _surviving_stats(result: Scan, doc: dict[str, Any], start_ns: int, stop_ns: int) -> EpisodeStats:
    """The integrity statistics of the messages that survived, over [start_ns, stop_ns] [ns]."""
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
    return episode_stats(
        times_by_topic,
        start_ns=start_ns,
        stop_ns=stop_ns,
        expected_rates=doc.get("expected_rates") or {},
        stamps=stamps_by_topic,
        gap_rates=doc.get("gap_rates") or {},
    )


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
            f"{bag_dir} is still being recorded by process {pid} on this host; stop it first "
            "(or --force if that pid is reused)"
        )
    result = scan(path)
    was_complete = result.complete
    size_before = result.size
    doc = sidecar if sidecar is not None else _description_from_metadata(bag_dir)
    if was_complete and doc.get("state") == "complete" and doc.get("stats"):
        stats = EpisodeStats.from_dict(doc["stats"])  # written at stop, with the recorder's drop counts
    else:
        start_ns, stop_ns = _episode_window(result, doc)
        stats = _surviving_stats(result, doc, start_ns, stop_ns)
        doc.update(state="recovered", stop_ns=stop_ns, stats=stats.to_dict(), problems=stats.problems())
    info = bag_metadata(path.name, result, custom_data(doc))
    try:
        if not was_complete:
            repair(path, result, {"serialized_metadata": dump_yaml(info).strip()})
        write_metadata_yaml(bag_dir, info)
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

