"""Recovering the bag of a killed recorder (recording.recover, recording.mcapfile)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mcap.reader import make_reader
from mcap.records import Message
from mcap.stream_reader import StreamReader, breakup_chunk
from mcap_ros2.decoder import DecoderFactory
from rosbags.rosbag2 import Reader

from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder, EpisodeWriter, RecordingError, recover_bag
from rynn_teleop.recording.inspect import episodes_main

STR = "std_msgs/msg/String"
T0 = 1_700_000_000 * 1_000_000_000  # [ns]


def cdr_string(text: str) -> bytes:
    """A std_msgs/String in CDR (little endian), built by hand."""
    raw = text.encode() + b"\0"
    return b"\x00\x01\x00\x00" + len(raw).to_bytes(4, "little") + raw


def read_rosbags(bag: Path) -> list[tuple[str, int, bytes]]:
    with Reader(bag) as reader:
        return [(c.topic, t, bytes(d)) for c, t, d in reader.messages()]


def read_mcap(path: Path) -> list[tuple[str, int, bytes]]:
    """Through the summary and chunk indexes (seeking reader), decoding every message on the way."""
    with path.open("rb") as f:
        out = []
        reader = make_reader(f, decoder_factories=[DecoderFactory()])
        for _, channel, message, decoded in reader.iter_decoded_messages(log_time_order=False):
            assert decoded.data  # the stored definition decodes it
            out.append((channel.topic, message.log_time, bytes(message.data)))
    with path.open("rb") as f:  # and sequentially, to the footer and closing magic
        assert sum(isinstance(r, Message) for r in StreamReader(f).records) == len(out)
    return out


KILLED_RECORDER = r"""
import os, sys, time
from rynn_teleop.recording import EpisodeMetadata, EpisodeRecorder

def cdr(text):
    raw = text.encode() + b"\0"
    return b"\x00\x01\x00\x00" + len(raw).to_bytes(4, "little") + raw

out, log = sys.argv[1], os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
rec = EpisodeRecorder(out, {"/fast": 200.0, "/big": 30.0})
rec.start(EpisodeMetadata(task="killed"))
print("started", flush=True)
i = 0
while True:
    now = time.time_ns()
    rec.submit("/fast", "std_msgs/msg/String", cdr(f"fast {i} {now}"), now)
    if i % 50 == 0:  # a 200 kB message 5 times a second: chunks close by time (0.5 s) before size (1 MiB)
        rec.submit("/big", "std_msgs/msg/String", cdr(f"big {i} {now} " + "x" * 200_000), now)
    os.write(log, f"{i} {now}\n".encode())  # what was submitted when, unbuffered: survives the kill
    i += 1
    time.sleep(0.004)
"""


def test_sigkill_mid_episode_loses_at_most_the_last_second_after_recover(tmp_path):
    out, log = tmp_path / "out", tmp_path / "submitted.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RECORDER, str(out), str(log)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "started"
        time.sleep(2.5)
        kill_ns = time.time_ns()
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    bag = out / "episode_0001"
    assert not (bag / "metadata.yaml").exists()
    assert episodes_main(["check", str(bag)]) == 1  # not closed: check says so

    result = recover_bag(bag)
    assert not result.was_complete
    got = read_rosbags(bag)
    assert sorted(got) == sorted(read_mcap(bag / "episode_0001.mcap"))
    by_topic: dict[str, dict[int, tuple[int, bytes]]] = {"/fast": {}, "/big": {}}
    for topic, t, data in got:
        i = int(data[8:].split(b" ")[1])
        by_topic[topic][i] = (t, data)
    submitted = [tuple(map(int, line.split())) for line in log.read_text().splitlines() if len(line.split()) == 2]
    old = [(i, t) for i, t in submitted if t < kill_ns - 1_000_000_000]
    assert len(old) > 200  # the recorder ran for more than a second
    for i, t in old:  # every message older than the kill minus 1 s is there, bytes and receive time intact
        assert by_topic["/fast"][i] == (t, cdr_string(f"fast {i} {t}"))
        if i % 50 == 0:
            assert by_topic["/big"][i] == (t, cdr_string(f"big {i} {t} " + "x" * 200_000))
    assert sorted(by_topic["/fast"]) == list(range(len(by_topic["/fast"])))  # a prefix, no holes
    side = yaml.safe_load((bag / "episode.yaml").read_text())
    assert side["state"] == "recovered" and side["stats"]["topics"]["/fast"]["received"] == len(by_topic["/fast"])
    assert result.message_count == len(got)


def multi_chunk_bag(path: Path) -> list[tuple[str, int, bytes]]:
    """A closed bag of 3 topics whose 300 kB messages close a chunk every 4 (deterministic layout)."""
    w = EpisodeWriter(path, flush_period_s=3600)
    w.open()
    sent = []
    for i in range(20):
        msgs = [("/small", T0 + i * 10**7, cdr_string(f"s{i}"))]
        if i % 2 == 0:
            msgs.append(("/big", T0 + i * 10**7 + 1, cdr_string(f"b{i}" + "y" * 300_000)))
        if i == 9:
            msgs.append(("/late", T0 + i * 10**7 + 2, cdr_string("late topic")))
        for topic, t, data in msgs:
            assert w.submit(topic, STR, data, t)
            sent.append((topic, t, data))
    w.close()
    return sent


def chunk_layout(path: Path) -> list[tuple[int, int, int, int]]:
    """(start, end, message index end, messages) of every chunk, read with the mcap package (the oracle)."""
    out = []
    with path.open("rb") as f:
        for ci in make_reader(f).get_summary().chunk_indexes:
            f.seek(ci.chunk_start_offset)
            records = StreamReader(io.BytesIO(f.read(ci.chunk_length)), skip_magic=True, emit_chunks=True).records
            chunk = next(records)
            n = sum(isinstance(r, Message) for r in breakup_chunk(chunk))
            end = ci.chunk_start_offset + ci.chunk_length
            out.append((ci.chunk_start_offset, end, end + ci.message_index_length, n))
    return out


def test_recover_keeps_exactly_the_complete_chunks_wherever_the_file_was_cut(tmp_path):
    sent = multi_chunk_bag(tmp_path / "full")
    full = tmp_path / "full" / "full.mcap"
    data = full.read_bytes()
    layout = chunk_layout(full)
    assert len(layout) >= 3
    cuts = {0, 5, 20, len(data) - 1, len(data) - 40}
    for start, end, index_end, _ in layout:
        cuts |= {start + 100, end - 1, end, end + 3, index_end}
    for n, cut in enumerate(sorted(cuts)):
        bag = tmp_path / f"cut{n}"
        bag.mkdir()
        (bag / f"cut{n}.mcap").write_bytes(data[:cut])
        result = recover_bag(bag)
        got = read_rosbags(bag)
        assert got == sent[: len(got)], cut  # a prefix of what was sent, bytes and times identical
        assert sorted(read_mcap(bag / f"cut{n}.mcap")) == sorted(got), cut
        assert result.message_count == len(got) == sum(m for _, end, _, m in layout if end <= cut), cut
        again = recover_bag(bag)  # idempotent
        assert again.was_complete and read_rosbags(bag) == got


def test_recover_of_a_closed_bag_without_metadata_rebuilds_the_same_metadata(tmp_path):
    rec = EpisodeRecorder(tmp_path, {"/a": 100.0})
    bag = rec.start(EpisodeMetadata(task="t", operator="o"), now_ns=T0)
    for i in range(100):
        rec.submit("/a", STR, cdr_string(f"m{i}"), T0 + i * 10**7)
    rec.stop(now_ns=T0 + 10**9)
    before = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    (bag / "metadata.yaml").unlink()
    assert episodes_main(["recover", str(tmp_path)]) == 0
    after = yaml.safe_load((bag / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert after == before
    assert len(read_rosbags(bag)) == 100


def test_recover_refuses_an_episode_whose_recorder_still_runs(tmp_path):
    rec = EpisodeRecorder(tmp_path, {"/a": None})
    bag = rec.start(EpisodeMetadata())  # this process is the live recorder
    rec.submit("/a", STR, cdr_string("x"), T0)
    with pytest.raises(RecordingError, match=f"still being recorded by process {os.getpid()}"):
        recover_bag(bag)
    rec.stop()


def test_recover_errors_are_clear(tmp_path):
    with pytest.raises(RecordingError, match="expected one MCAP file"):
        recover_bag(tmp_path)
    (tmp_path / "junk.mcap").write_bytes(b"not an mcap file at all")
    with pytest.raises(RecordingError, match="not an MCAP file"):
        recover_bag(tmp_path)
