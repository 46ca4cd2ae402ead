"""``recover``: make the bag of a killed recorder readable again, or salvage a damaged one (ROS-free).

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

A *damaged* bag (:func:`.integrity.verify_mcap`: a CRC mismatch, unreadable records, a lost summary, or a
closed episode's file cut short) is never changed: :func:`salvage_bag` writes every message of its intact
chunks into a new episode (by default the next ``episode_NNNN`` beside it) whose ``episode.yaml`` says where it
came from and what was lost (``salvage``: the damaged byte ranges with their topics and times, and the
messages lost per topic), written beside the target and renamed into place.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rosbags.rosbag2.metadata import parse_qos

from .cdr import has_header, header_stamp_ns
from .errors import DamagedEpisodeError, EpisodeDataError, RecordingError
from .integrity import IntegrityReport, intact_messages, verify_mcap
from .mcapfile import Scan, repair, scan
from .metadata import (
    METADATA,
    custom_data,
    doc_from_custom_data,
    episode_doc,
    read_metadata,
    read_sidecar,
    salvage_problems,
    write_sidecar,
)
from .stats import EpisodeStats, episode_stats
from .writer import (
    BagFile,
    BagTopic,
    bagfile_information,
    default_typestore,
    dump_yaml,
    type_hash,
    write_metadata_yaml,
)

SALVAGE_SUFFIX = "_salvaged"
"""Name suffix of a salvaged episode whose source is not a numbered ``episode_NNNN`` of an output directory."""


@dataclass(frozen=True)
class RecoverResult:
    """What :func:`recover_bag` found and did."""

    bag_dir: Path  # the readable episode: the one given (repaired in place), or the new one (salvaged)
    was_complete: bool  # the MCAP file had its footer: only the metadata was rewritten
    bytes_cut: int  # bytes of incomplete records removed from the end of the file
    message_count: int  # messages in the recovered bag
    stats: EpisodeStats
    salvaged_from: Path | None = None  # the damaged episode left unchanged (None: repaired in place)
    lost: dict[str, int] = field(default_factory=dict)  # topic -> messages lost (salvage)
    damage: tuple[str, ...] = ()  # the damaged byte ranges and what they held, one line each (salvage)


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


def recover_bag(bag_dir: str | Path, *, force: bool = False, out: str | Path | None = None) -> RecoverResult:
    """Make ``bag_dir`` a complete rosbag2 bag again, or salvage it if it is damaged (see the module description).

    Args:
        force: recover even if ``episode.yaml`` names a live recorder process on this
            host (a recycled pid); never do this to an episode being recorded.
        out: write the result into this new episode directory and leave ``bag_dir`` as it is, whatever its
            state (default: repair an unclosed bag in place; salvage a damaged one into the next
            ``episode_NNNN`` beside it, see :func:`salvage_target`).

    Raises:
        RecordingError: no MCAP file, not an MCAP file (``EpisodeDataError``), the episode is still being
            recorded, nothing of it is intact (``EpisodeDataError``), or files that cannot be written.
    """
    bag_dir = Path(bag_dir)
    path = mcap_file(bag_dir)
    sidecar = read_sidecar(bag_dir)
    if sidecar is not None and not force and (pid := _recorder_alive(sidecar)) is not None:
        raise RecordingError(
            f"{bag_dir} is still being recorded by process {pid} on this host; stop it first "
            "(or --force if that pid is reused)"
        )
    doc = sidecar if sidecar is not None else _description_from_metadata(bag_dir)
    report = verify_episode(bag_dir, doc=doc)
    if report.damaged or out is not None:
        return salvage_bag(bag_dir, report, doc=doc, out=out)
    result = scan(path)
    was_complete = result.complete
    size_before = result.size
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


def episode_closed(bag_dir: Path, doc: dict[str, Any]) -> bool:
    """Whether the episode was closed by its recorder (``metadata.yaml`` written, or its description says
    complete or recovered): a file that ends inside its data section is then damaged, not unclosed."""
    return (bag_dir / METADATA).is_file() or str(doc.get("state") or "") in ("complete", "recovered")


def _recorded_counts(bag_dir: Path) -> dict[str, int] | None:
    """Topic -> messages, from ``metadata.yaml`` (None without a readable one)."""
    try:
        meta = read_metadata(bag_dir)
        if meta is None:
            return None
        out: dict[str, int] = {}
        for t in meta.get("topics_with_message_count") or []:
            name = str(t["topic_metadata"]["name"])
            out[name] = out.get(name, 0) + int(t["message_count"])
        return out
    except (RecordingError, KeyError, TypeError, ValueError):
        return None


def verify_episode(bag_dir: str | Path, *, doc: dict[str, Any] | None = None, decode: bool | None = None
                   ) -> IntegrityReport:
    """:func:`.integrity.verify_mcap` of an episode directory's MCAP file, with what its description says:
    whether it was closed, its window (start and stop), and the message counts of ``metadata.yaml``.

    Args:
        doc: the episode description (default: :func:`.metadata.episode_doc`, or empty if it is unreadable).
        decode: see :func:`.integrity.verify_mcap`.

    Raises:
        RecordingError: no MCAP file (usage), or one that cannot be opened or is no MCAP file.
    """
    bag_dir = Path(bag_dir)
    path = mcap_file(bag_dir)
    if doc is None:
        try:
            doc = episode_doc(bag_dir)
        except RecordingError:
            doc = {}
    start, stop = doc.get("start_ns"), doc.get("stop_ns")
    window = (int(start), int(stop)) if isinstance(start, int) and isinstance(stop, int) and stop >= start else None
    return verify_mcap(path, closed=episode_closed(bag_dir, doc), decode=decode, window=window,
                       expected_counts=_recorded_counts(bag_dir))


def require_intact(bag_dir: str | Path, *, doc: dict[str, Any] | None = None) -> IntegrityReport:
    """:func:`verify_episode`, raising when the episode is damaged (what every reader of episodes does first).

    Raises:
        DamagedEpisodeError: one line naming the episode and the damage, and what to run.
        RecordingError: as :func:`verify_episode`.
    """
    bag_dir = Path(bag_dir)
    try:
        report = verify_episode(bag_dir, doc=doc)
    except DamagedEpisodeError:
        raise
    except EpisodeDataError as exc:  # not an MCAP file at all (empty, garbage), or unreadable: damaged too
        raise DamagedEpisodeError(f"{bag_dir}: damaged: {str(exc).removeprefix(f'{bag_dir}: ')}",
                                  episode=bag_dir) from exc
    if report.damaged:
        raise DamagedEpisodeError(
            f"{bag_dir}: {report.reason()}; `rynn-teleop episodes check {bag_dir}` lists what was lost, "
            f"`rynn-teleop episodes recover {bag_dir}` salvages the rest into a new episode",
            episode=bag_dir, report=report)
    return report


def refuse_damaged(bag_dir: str | Path, what: str) -> None:
    """For a reader of any rosbag2 directory (the replay sources): refuse a bag whose MCAP file is damaged.

    A bag without exactly one MCAP file (sqlite3 storage, several files) is not checked here.

    Raises:
        ConfigurationError: one line naming ``what`` (e.g. "replay camera"), the bag and the damage.
    """
    from ..errors import ConfigurationError

    bag_dir = Path(bag_dir)
    try:
        require_intact(bag_dir)
    except DamagedEpisodeError as exc:
        raise ConfigurationError(f"{what}: {exc}") from exc
    except RecordingError:
        return  # no single MCAP file (another storage): its reader reports what it finds


def salvage_target(bag_dir: Path) -> Path:
    """Where :func:`salvage_bag` writes by default: the next ``episode_NNNN`` of the output directory for a
    numbered episode, else ``<name>_salvaged`` (``_salvaged_2``... if taken) beside it."""
    from .episodes import EPISODE_PREFIX, next_episode_dir

    if re.fullmatch(rf"{EPISODE_PREFIX}\d+", bag_dir.name):
        return next_episode_dir(bag_dir.parent)
    target, n = bag_dir.with_name(bag_dir.name + SALVAGE_SUFFIX), 1
    while target.exists():
        n += 1
        target = bag_dir.with_name(f"{bag_dir.name}{SALVAGE_SUFFIX}_{n}")
    return target


def salvage_bag(bag_dir: str | Path, report: IntegrityReport | None = None, *, doc: dict[str, Any] | None = None,
                out: str | Path | None = None) -> RecoverResult:
    """Write every message of ``bag_dir``'s intact chunks into a new episode; ``bag_dir`` is not changed.

    The new episode is a bag as the recorder writes it (CRCs on), with ``episode.yaml`` holding the
    description of the source, ``state: recovered``, the statistics of what was kept, and ``salvage``:
    ``from`` (the source), ``kept_messages``, ``lost_messages`` (topic -> count) and ``damage`` (one line per
    damaged byte range); its ``problems`` say how much was lost. It is written beside the target and renamed
    into place, so a failure leaves nothing half-written.

    Args:
        report: the source's verification (default: :func:`verify_episode`).
        doc: the source's description (default: read from it).
        out: the new episode directory, which must not exist (default :func:`salvage_target`).

    Raises:
        RecordingError: ``out`` exists or cannot be written; ``EpisodeDataError``: nothing is intact.
    """
    bag_dir = Path(bag_dir)
    if doc is None:
        sidecar = read_sidecar(bag_dir)
        doc = sidecar if sidecar is not None else _description_from_metadata(bag_dir)
    report = report if report is not None else verify_episode(bag_dir, doc=doc)
    if not report.blocks:
        raise EpisodeDataError(f"{bag_dir}: nothing to salvage, no chunk of it is intact "
                               f"({report.reason() or 'empty'})", episode=bag_dir)
    target = Path(out) if out is not None else salvage_target(bag_dir)
    if target.exists():
        raise RecordingError(f"cannot salvage into {target}: it exists already (give a new --out)")
    if target.resolve() == bag_dir.resolve():
        raise RecordingError(f"cannot salvage {bag_dir} into itself (give a new --out)")
    stage = target.parent / f".{target.name}.salvage-{os.getpid()}"
    try:
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
    except OSError as exc:
        raise RecordingError(f"cannot salvage into {target}: {exc.strerror or exc} ({exc.filename or stage.parent})"
                             ) from exc
    try:
        new_doc, result = _write_salvage(bag_dir, report, doc, stage / target.name, target)
        os.replace(stage / target.name, target)
        stage.rmdir()
    except OSError as exc:
        shutil.rmtree(stage, ignore_errors=True)
        raise RecordingError(f"cannot salvage into {target}: {exc.strerror or exc}") from exc
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return result


def _write_salvage(source: Path, report: IntegrityReport, doc: dict[str, Any], bag: Path, target: Path
                   ) -> tuple[dict[str, Any], RecoverResult]:
    """Write the salvaged bag at ``bag`` (to be renamed ``target``) and its ``episode.yaml``."""
    typestore = default_typestore()
    qos = {ch.topic: parse_qos(ch.metadata.get("offered_qos_profiles", "")) for ch in report.channels.values()}
    kept = Scan(size=0, complete=True, keep_end=0, schemas=dict(report.schemas), channels=dict(report.channels))
    writer = BagFile(bag, typestore, qos)
    try:
        for m in intact_messages(report):
            ch = report.channels[m.channel_id]
            schema = report.schemas.get(ch.schema_id)
            writer.write(ch.topic, schema.name if schema is not None else "", m.log_time, m.data)
            kept.times.setdefault(m.channel_id, []).append(m.log_time)
            kept.stamps.setdefault(m.channel_id, []).append(header_stamp_ns(m.data))
        kept.channels = {cid: ch for cid, ch in kept.channels.items() if cid in kept.times}
        start_ns, stop_ns = _episode_window(kept, doc)
        stats = _surviving_stats(kept, doc, start_ns, stop_ns)
        lost = dict(report.lost_counts)
        damage = report.lines(start_ns)
        salvage = {"from": str(source.resolve()), "kept_messages": kept.message_count, "lost_messages": lost,
                   "damage": damage}
        new_doc = {**doc, "episode": target.name, "state": "recovered", "start_ns": start_ns, "stop_ns": stop_ns,
                   "stats": stats.to_dict(), "salvage": salvage}
        new_doc["problems"] = stats.problems() + salvage_problems(new_doc)
        writer.close(custom_data(new_doc))
    except BaseException:
        try:
            writer.abort()
        except OSError:
            pass  # the staging folder is removed anyway
        raise
    write_sidecar(bag, new_doc)
    return new_doc, RecoverResult(bag_dir=target, was_complete=report.complete, bytes_cut=0,
                                  message_count=kept.message_count, stats=stats, salvaged_from=source, lost=lost,
                                  damage=tuple(damage))
