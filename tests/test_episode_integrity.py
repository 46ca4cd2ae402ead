"""Recorded episodes prove their integrity (recording.integrity, recording.recover, the readers).

A small episode (chunks of 64 KiB, so that it has a dozen) is damaged at seeded random offsets of its header,
a chunk's records, its summary and its footer, and cut at several points. For every case: ``episodes check``
flags it (exit 1, "DAMAGED"); ``recover`` salvages exactly the messages of the chunks the damage did not touch
(compared with the undamaged file's chunks, bytes and receive times) into a new episode and leaves the original
byte for byte; the LeRobot export and the world-model dataset builder refuse it with a one-line reason and
write nothing. Also: the recorder's CRCs and their switch, the stamp checks that stand in for CRCs in files
without them, an in-place repair that carries CRCs, ``--skip-damaged``, and the replays' refusal.
"""

from __future__ import annotations

import hashlib
import io
import random
import shutil
import struct
from pathlib import Path
from typing import NamedTuple

import pytest
from mcap.reader import make_reader
from mcap.records import Message
from mcap.stream_reader import StreamReader, breakup_chunk
from recording_episodes import build_episode
from rosbags.rosbag2 import Reader

import rynn_teleop.recording.writer as writer_module
from rynn_teleop.errors import ConfigurationError
from rynn_teleop.recording.errors import DamagedEpisodeError, EpisodeDataError
from rynn_teleop.recording.export import ExportError, export_lerobot
from rynn_teleop.recording.inspect import episodes_main
from rynn_teleop.recording.integrity import MAGIC, verify_mcap
from rynn_teleop.recording.recover import mcap_file, recover_bag, verify_episode
from rynn_teleop.world_model.training.dataset import NoUsableEpisodeError, build_dataset

SEED = 35
SMALL_CHUNK = 64 * 1024  # [bytes]


class Chunk(NamedTuple):
    start: int  # offset of the chunk record [bytes]
    records: int  # offset of its first record (after the chunk's own fields) [bytes]
    end: int  # offset after the chunk record [bytes]
    messages: list[tuple[int, int, bytes]]  # (channel id, log time, data)


class Layout(NamedTuple):
    """Where things are in the undamaged file."""

    size: int
    header: tuple[int, int]  # the header record [start, end)
    chunks: list[Chunk]
    summary: tuple[int, int]  # the summary section [start, footer)
    footer: tuple[int, int]  # the footer record and the closing magic
    topics: dict[int, str]  # channel id -> topic


def layout_of(path: Path) -> Layout:
    data = path.read_bytes()
    (header_len,) = struct.unpack_from("<Q", data, len(MAGIC) + 1)
    with path.open("rb") as f:
        summary = make_reader(f).get_summary()
    chunks = []
    for ci in sorted(summary.chunk_indexes, key=lambda c: c.chunk_start_offset):
        body = data[ci.chunk_start_offset:ci.chunk_start_offset + ci.chunk_length]
        chunk = next(StreamReader(io.BytesIO(body), skip_magic=True, emit_chunks=True).records)
        messages = [(r.channel_id, r.log_time, bytes(r.data)) for r in breakup_chunk(chunk) if isinstance(r, Message)]
        records = ci.chunk_start_offset + 9 + 8 + 8 + 8 + 4 + 4 + len(ci.compression) + 8
        chunks.append(Chunk(ci.chunk_start_offset, records, ci.chunk_start_offset + ci.chunk_length, messages))
    footer_at = len(data) - len(MAGIC) - 29
    (summary_start,) = struct.unpack_from("<Q", data, footer_at + 9)
    return Layout(len(data), (len(MAGIC), len(MAGIC) + 9 + header_len), chunks, (summary_start, footer_at),
                  (footer_at, len(data)), {cid: ch.topic for cid, ch in summary.channels.items()})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, Layout]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_module, "CHUNK_SIZE", SMALL_CHUNK)
        episode = build_episode(tmp_path_factory.mktemp("pristine") / "out", digital=False, seconds=1.0)
    found = layout_of(mcap_file(episode))
    assert len(found.chunks) >= 8
    return episode, found


class Case(NamedTuple):
    name: str
    start: int  # first damaged byte [bytes]
    length: int  # damaged bytes (XOR with non-zero values); 0: the file is cut at ``start``


def cases(layout: Layout) -> list[Case]:
    """Seeded random damage in each part of the file, and cuts at several points."""
    rng = random.Random(SEED)
    out = []

    def inside(name: str, lo: int, hi: int, most: int) -> None:
        start = rng.randrange(lo, hi)
        out.append(Case(name, start, rng.randint(1, min(most, hi - start))))

    for k in range(2):
        inside(f"header{k}", *layout.header, 16)
    for k, chunk in enumerate(rng.sample(layout.chunks, 3)):
        inside(f"payload{k}", chunk.records, chunk.end, 64)
    for k in range(2):
        inside(f"summary{k}", *layout.summary, 32)
    for k in range(2):
        inside(f"footer{k}", *layout.footer, 8)
    middle = rng.choice(layout.chunks[1:-1])
    for name, cut in (("cut_in_header", rng.randrange(*layout.header)),
                      ("cut_in_chunk", rng.randrange(middle.records, middle.end)),
                      ("cut_after_chunk", middle.end),
                      ("cut_in_summary", rng.randrange(*layout.summary))):
        out.append(Case(name, cut, 0))
    return out


def damage(episode: Path, case: Case, rng: random.Random) -> None:
    path = mcap_file(episode)
    data = bytearray(path.read_bytes())
    if case.length == 0:
        del data[case.start:]
    else:
        for i in range(case.start, case.start + case.length):
            data[i] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))


def intact_messages(layout: Layout, case: Case) -> list[tuple[str, int, bytes]]:
    """(topic, receive time, data) of every message of the chunks the damage leaves whole, in file order."""
    end = layout.size if case.length == 0 else case.start + case.length
    out = []
    for chunk in layout.chunks:
        whole = chunk.end <= case.start if case.length == 0 else (chunk.end <= case.start or chunk.start >= end)
        if whole:
            out += [(layout.topics[cid], t, data) for cid, t, data in chunk.messages]
    return out


def read_bag(bag: Path) -> list[tuple[str, int, bytes]]:
    with Reader(bag) as reader:
        return [(c.topic, t, bytes(d)) for c, t, d in reader.messages()]


def test_every_damage_is_flagged_salvaged_exactly_and_refused_by_the_readers(pristine, tmp_path, capsys):
    source, layout = pristine
    rng = random.Random(SEED + 1)
    every = cases(layout)
    assert {c.name.rstrip("0123456789") for c in every} >= {"header", "payload", "summary", "footer"}
    for case in every:
        work = tmp_path / case.name
        episode = work / source.name
        shutil.copytree(source, episode)
        damage(episode, case, rng)
        digest = hashlib.sha256(mcap_file(episode).read_bytes()).hexdigest()

        assert episodes_main(["check", str(episode)]) == 1, case
        out = capsys.readouterr().out
        assert f"{episode}: DAMAGED" in out, (case, out)
        if case.name.startswith("payload"):
            assert "chunk CRC mismatch" in out and "lost" in out and "/joint_states" in out, (case, out)

        expected = intact_messages(layout, case)
        if expected:
            result = recover_bag(episode)
            assert result.salvaged_from == episode and result.bag_dir == work / "episode_0002", case
            assert result.message_count == len(expected), case
            assert read_bag(result.bag_dir) == expected, case  # bytes and receive times, in the same order
            assert not verify_episode(result.bag_dir).damaged, case
            if len(expected) < sum(len(c.messages) for c in layout.chunks):
                assert result.lost and result.damage, case
        else:  # cut before the first chunk: nothing to salvage, said so (the data: exit 1)
            with pytest.raises(EpisodeDataError, match="nothing to salvage") as err:
                recover_bag(episode)
            assert err.value.exit_code == 1 and not (work / "episode_0002").exists()
        assert hashlib.sha256(mcap_file(episode).read_bytes()).hexdigest() == digest, case  # never modified

        with pytest.raises(ExportError, match="damaged") as err:
            export_lerobot([episode], work / "dataset", "test/damaged", workers=1)
        assert err.value.episode == episode and err.value.exit_code == 1
        assert "\n" not in str(err.value) and not (work / "dataset").exists()
        with pytest.raises(DamagedEpisodeError, match="damaged"):
            build_dataset([episode], work / "clips", preset="tiny", clip_frames=5, echo=None)
        assert not (work / "clips").exists() and not list(work.glob(".clips*"))


def test_the_recorder_writes_crcs_by_default_and_can_be_told_not_to(pristine, tmp_path, capsys):
    source, layout = pristine
    report = verify_mcap(mcap_file(source), decode=True)
    assert report.ok and report.crc_chunks == len(layout.chunks) and report.plain_chunks == 0
    assert report.data_crc == "ok" and report.decoded == report.messages == sum(len(c.messages) for c in layout.chunks)
    data = mcap_file(source).read_bytes()
    assert struct.unpack_from("<I", data, layout.footer[0] + 25)[0] != 0  # the summary's CRC
    assert episodes_main(["check", str(source)]) == 0
    assert "data-section CRC ok" in capsys.readouterr().out

    plain = build_episode(tmp_path / "plain", digital=False, seconds=0.5, crcs=False)
    report = verify_mcap(mcap_file(plain), decode=None)
    assert not report.damaged and report.crc_chunks == 0 and report.plain_chunks > 0 and report.data_crc == "absent"
    assert report.decoded == report.messages  # without CRCs, decoding is the proof
    assert episodes_main(["check", str(plain)]) == 0
    assert "without CRC" in capsys.readouterr().out


def test_damage_outside_the_chunks_that_still_parses_fails_the_data_section_crc(pristine, tmp_path):
    source, layout = pristine
    episode = tmp_path / source.name
    shutil.copytree(source, episode)
    path = mcap_file(episode)
    data = bytearray(path.read_bytes())
    data[layout.header[1] - 2] ^= 0x01  # a character of the header's library string: still valid text
    path.write_bytes(bytes(data))
    report = verify_episode(episode)
    assert report.damaged and report.data_crc == "mismatch" and "data-section CRC mismatch" in report.reason()
    assert report.messages == sum(len(c.messages) for c in layout.chunks) and not report.lost_counts
    assert recover_bag(episode).message_count == report.messages


def test_without_crcs_garbage_stamps_and_undecodable_messages_still_show(tmp_path):
    plain = build_episode(tmp_path / "plain", digital=False, seconds=0.5, crcs=False)
    path = mcap_file(plain)
    data = path.read_bytes()
    with path.open("rb") as f:
        reader = make_reader(f)
        first = next(m for _, ch, m in reader.iter_messages(topics=["/arms/command"]))
    at = data.index(first.data)
    stamped = bytearray(data)
    stamped[at + 4:at + 8] = struct.pack("<i", 2**31 - 1)  # header.stamp.sec: year 2038, not this episode
    path.write_bytes(bytes(stamped))
    report = verify_episode(plain)
    assert report.damaged and "implausible stamps" in report.reason()
    garbled = bytearray(data)
    garbled[at + 16:at + 20] = b"\xff\xff\xff\xff"  # a string length no message has
    path.write_bytes(bytes(garbled))
    report = verify_episode(plain, decode=None)
    assert report.damaged and "does not decode" in report.reason()


def test_a_repaired_killed_recording_carries_crcs_and_recover_out_leaves_it_as_it_was(pristine, tmp_path):
    source, layout = pristine
    middle = layout.chunks[len(layout.chunks) // 2]
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "killed.mcap").write_bytes(mcap_file(source).read_bytes()[:middle.end + 5])  # no metadata: unclosed
    kept = sum(len(c.messages) for c in layout.chunks if c.end <= middle.end)

    copy = tmp_path / "copy"
    before = (killed / "killed.mcap").read_bytes()
    result = recover_bag(killed, out=copy)
    assert result.salvaged_from == killed and result.message_count == kept
    assert (killed / "killed.mcap").read_bytes() == before and not (killed / "metadata.yaml").exists()

    result = recover_bag(killed)  # in place, as for a killed recorder
    assert result.salvaged_from is None and result.message_count == kept
    report = verify_mcap(killed / "killed.mcap", decode=True)
    assert report.ok and report.complete and report.data_crc == "ok"
    data = bytearray((killed / "killed.mcap").read_bytes())
    footer_at = len(data) - len(MAGIC) - 29
    (summary_start,) = struct.unpack_from("<Q", data, footer_at + 9)
    data[summary_start + 3] ^= 0x40  # the repaired summary carries its CRC too
    (killed / "killed.mcap").write_bytes(bytes(data))
    assert "summary CRC mismatch" in verify_episode(killed).reason()


def test_skip_damaged_leaves_the_damaged_episode_out_with_its_reason(pristine, tmp_path, capsys):
    source, layout = pristine
    bad = tmp_path / "bad" / source.name
    shutil.copytree(source, bad)
    damage(bad, Case("payload", layout.chunks[2].records + 10, 4), random.Random(SEED))
    report = export_lerobot([bad, source], tmp_path / "dataset", "test/skip", workers=1, skip_damaged=True)
    assert [e.source for e in report.episodes] == [source]
    (skipped,) = report.skipped
    assert skipped.damaged and skipped.source == bad and "chunk CRC mismatch" in skipped.problems[0]
    assert episodes_main(["export", str(bad), "--out", str(tmp_path / "cli"), "--repo-id", "t/x",
                          "--skip-damaged", "--workers", "1"]) == 1  # nothing left to export
    assert "skipped, damaged: chunk CRC mismatch" in capsys.readouterr().out
    with pytest.raises(NoUsableEpisodeError, match="damaged: chunk CRC mismatch") as err:
        build_dataset([bad], tmp_path / "clips", preset="tiny", clip_frames=5, echo=None, skip_damaged=True)
    assert err.value.exit_code == 1


def test_a_salvage_that_lost_nothing_checks_clean_and_one_that_lost_messages_says_so(pristine, tmp_path, capsys):
    source, layout = pristine
    index_only = tmp_path / "a" / source.name
    shutil.copytree(source, index_only)
    damage(index_only, Case("summary", layout.summary[0] + 40, 8), random.Random(SEED))
    salvaged = recover_bag(index_only).bag_dir
    assert episodes_main(["check", str(salvaged)]) == 0
    lossy = tmp_path / "b" / source.name
    shutil.copytree(source, lossy)
    damage(lossy, Case("payload", layout.chunks[3].records + 100, 4), random.Random(SEED))
    salvaged = recover_bag(lossy).bag_dir
    capsys.readouterr()
    assert episodes_main(["check", str(salvaged)]) == 1
    assert f"salvaged from the damaged episode {source.name}" in capsys.readouterr().out


def test_replays_refuse_a_damaged_bag_in_one_line(pristine, tmp_path):
    from rynn_teleop.sources.playback import open_bag

    source, layout = pristine
    bad = tmp_path / source.name
    shutil.copytree(source, bad)
    damage(bad, Case("payload", layout.chunks[1].records + 7, 3), random.Random(SEED))
    with pytest.raises(ConfigurationError, match=r"^replay hand source: .*damaged: chunk CRC mismatch") as err:
        open_bag(bad, "replay hand source")
    assert "\n" not in str(err.value)
    reader = open_bag(source, "replay hand source")  # an intact one opens
    reader.close()


def test_list_shows_an_episode_whose_description_is_unreadable(pristine, tmp_path, capsys):
    source, _ = pristine
    out = tmp_path / "out"
    shutil.copytree(source, out / "episode_0001")
    shutil.copytree(source, out / "episode_0002")
    (out / "episode_0002" / "episode.yaml").write_text("state: [unclosed\n")
    assert episodes_main(["list", str(out)]) == 1
    text = capsys.readouterr().out
    assert "episode_0001" in text and "unreadable" in text and "invalid YAML" in text
