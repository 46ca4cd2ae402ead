"""Every ``rynn-teleop`` subcommand against bad inputs: a clear message and exit 2 (the request) or 1 (the data),
never a traceback.

The table runs each command in this process through ``cli.main`` (a few also as real processes) against:
a missing path, an empty file or folder, a folder that is no episode, a file where a folder is expected (and the
reverse), episodes whose MCAP file is cut short, damaged in a chunk, empty, not MCAP, or unreadable (a link to
``/proc/self/mem``: opening works, reading fails with EIO, for root too), an unparsable description, and outputs
that cannot be created (``/proc/nope``) or exist. Files without read permission are checked too, except as root,
which reads a file whatever its mode (the ``/proc/self/mem`` rows stand for an unreadable file there).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from recording_episodes import build_episode

import rynn_teleop.recording.writer as writer_module
from rynn_teleop import cli
from rynn_teleop.recording.recover import mcap_file

UNREADABLE = "/proc/self/mem"  # opens, but reading it fails with EIO, for root too
UNWRITABLE = "/proc/nope"  # nothing can be created under /proc
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Placeholder -> path of every kind of bad input (built once)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(writer_module, "CHUNK_SIZE", 64 * 1024)  # a few chunks: damage one, keep the others
        good = build_episode(root / "out", digital=False, seconds=0.5)
    data = mcap_file(good).read_bytes()

    def episode(name: str, content: bytes | None) -> str:
        path = root / name
        shutil.copytree(good, path)
        (path / f"{good.name}.mcap").rename(path / f"{name}.mcap")
        if content is not None:
            (path / f"{name}.mcap").write_bytes(content)
        return str(path)

    damaged = bytearray(data)
    middle = len(data) // 3
    damaged[middle:middle + 64] = bytes(b ^ 0x5A for b in damaged[middle:middle + 64])
    garbage = bytearray(data)  # the bad-input sweep's finding: 4 kB of garbage in the middle of the file
    garbage[middle:middle + 4096] = random.Random(35).randbytes(4096)
    paths = {
        "missing": str(root / "missing"),
        "garbage4k": episode("garbage4k", bytes(garbage)),
        "good": str(good),
        "trunc": episode("trunc", data[: len(data) // 2]),
        "corrupt": episode("corrupt", bytes(damaged)),
        "emptymcap": episode("emptymcap", b""),
        "junkmcap": episode("junkmcap", b"not an mcap file at all"),
        "badyaml": episode("badyaml", None),
        "unreadable": episode("unreadable", None),
        "noperm": episode("noperm", None),
        "unwritable": UNWRITABLE,
        "procfile": UNREADABLE,
    }
    (Path(paths["badyaml"]) / "episode.yaml").write_text("state: [unclosed\n")
    link = Path(paths["unreadable"]) / "unreadable.mcap"
    link.unlink()
    link.symlink_to(UNREADABLE)
    (Path(paths["noperm"]) / "noperm.mcap").chmod(0)
    for name in ("emptydir", "notep", "cfgdir"):
        (root / name).mkdir()
        paths[name] = str(root / name)
    (root / "notep" / "readme.txt").write_text("not an episode")
    (root / "cfgdir" / "arm_ik.yaml").write_text("arm_ik: [\n")
    for name, text in (("emptyfile", ""), ("file", "\x00\x01 not yaml: ["), ("badyamlfile", "a: [1, 2\n"),
                       ("nopermfile", "a: 1\n")):
        (root / f"{name}.txt").write_text(text)
        paths[name] = str(root / f"{name}.txt")
    (root / "nopermfile.txt").chmod(0)
    paths["new"] = str(root / "new")  # an output that does not exist yet (each row adds its own suffix)
    return paths


class Row(NamedTuple):
    argv: str  # the arguments, with {placeholders} of ``inputs``
    code: int  # the exit code expected: 2 the request, 1 the data (0: the command did its job)
    message: str  # a regular expression the output (standard output and error) must contain (``.`` spans lines)
    no_root: bool = False  # a permission case: root reads whatever the mode


EPISODE_KINDS = {  # input -> (exit code, message) common to the commands that read episodes
    "missing": (2, "is not a directory"),
    "file": (2, "is not a directory"),
    "emptydir": (2, "neither an episode"),
    "notep": (2, "neither an episode"),
}

ROWS: dict[str, Row] = {
    # episodes list
    "list/missing": Row("episodes list {missing}", 2, "is not a directory"),
    "list/file": Row("episodes list {file}", 2, "is not a directory"),
    "list/episode": Row("episodes list {good}", 2, "is an episode, not an output directory"),
    "list/not-episodes": Row("episodes list {notep}", 0, "no episodes in"),
    # episodes info (statistics from the index)
    **{f"info/{k}": Row(f"episodes info {{{k}}}", *v) for k, v in EPISODE_KINDS.items()},
    "info/trunc": Row("episodes info {trunc}", 1, "damaged: .* no readable index"),
    "info/corrupt": Row("episodes info {corrupt}", 1, "damaged: .*crc validation failed"),
    "info/emptymcap": Row("episodes info {emptymcap}", 1, "damaged"),
    "info/junkmcap": Row("episodes info {junkmcap}", 1, "damaged: .*invalid magic"),
    "info/badyaml": Row("episodes info {badyaml}", 1, "episode.yaml, line 2, column 1: invalid YAML"),
    "info/unreadable": Row("episodes info {unreadable}", 1, "Input/output error"),
    "info/plot-unwritable": Row("episodes info {good} --plot {unwritable}/x.png", 2, "cannot write /proc/nope/x.png"),
    # episodes check (verifies) and check --quick (statistics only)
    **{f"check/{k}": Row(f"episodes check {{{k}}}", *v) for k, v in EPISODE_KINDS.items()},
    "check/trunc": Row("episodes check {trunc}", 1, r"DAMAGED, .*(cut off|ends before).*message\(s\) lost on"),
    "check/corrupt": Row("episodes check {corrupt}", 1, r"DAMAGED, chunk CRC mismatch .*lost .* from \+"),
    "check/emptymcap": Row("episodes check {emptymcap}", 1, "DAMAGED, .*not an MCAP file \\(it is empty\\)"),
    "check/junkmcap": Row("episodes check {junkmcap}", 1, "DAMAGED, .*not an MCAP file"),
    "check/badyaml": Row("episodes check {badyaml}", 1, "DAMAGED, .*invalid YAML"),
    "check/unreadable": Row("episodes check {unreadable}", 1, "cannot read .*Input/output error"),
    "check/garbage4k": Row("episodes check {garbage4k}", 1, r"DAMAGED, .*message\(s\) lost"),
    "info/garbage4k": Row("episodes info {garbage4k}", 1, "damaged"),
    "export/garbage4k": Row("episodes export {garbage4k} --out {new} --repo-id t/x --include-problems", 1,
                            "damaged"),
    "check/noperm": Row("episodes check {noperm}", 2, "cannot read .*Permission denied", no_root=True),
    "check-quick/trunc": Row("episodes check --quick {trunc}", 1, "damaged"),
    "check-quick/corrupt": Row("episodes check --quick {corrupt}", 1, "damaged: .*crc validation failed"),
    # episodes recover (salvages into a new episode; the original is never changed)
    **{f"recover/{k}": Row(f"episodes recover {{{k}}}", *v) for k, v in EPISODE_KINDS.items()},
    "recover/trunc": Row("episodes recover {trunc} --out {new}", 0, r"salvaged \d+ message\(s\) into .*is unchanged"),
    "recover/corrupt": Row("episodes recover {corrupt} --out {new}", 0, r"salvaged \d+ message\(s\)"),
    "recover/emptymcap": Row("episodes recover {emptymcap}", 1, "not an MCAP file"),
    "recover/junkmcap": Row("episodes recover {junkmcap}", 1, "not an MCAP file"),
    "recover/badyaml": Row("episodes recover {badyaml}", 1, "invalid YAML"),
    "recover/unreadable": Row("episodes recover {unreadable}", 1, "Input/output error"),
    "recover/out-unwritable": Row("episodes recover {corrupt} --out {unwritable}", 2, "cannot salvage into /proc/nope"),
    "recover/out-exists": Row("episodes recover {corrupt} --out {notep}", 2, "exists already"),
    # episodes export
    **{f"export/{k}": Row(f"episodes export {{{k}}} --out {{new}} --repo-id t/x --workers 1", *v)
       for k, v in EPISODE_KINDS.items()},
    **{f"export/{k}": Row(f"episodes export {{{k}}} --out {{new}} --repo-id t/x --workers 1", 1, m)
       for k, m in (("trunc", "damaged"), ("corrupt", "damaged: chunk CRC mismatch"),
                    ("emptymcap", "damaged: .*not an MCAP file"), ("junkmcap", "damaged: .*not an MCAP file"),
                    ("badyaml", "invalid YAML"), ("unreadable", "damaged: cannot read .*Input/output error"))},
    "export/out-unwritable": Row("episodes export {good} --out {unwritable} --repo-id t/x", 2,
                                 "cannot create the dataset folder /proc/nope"),
    "export/out-file": Row("episodes export {good} --out {file} --repo-id t/x", 2, "exists; use --append"),
    "export/bad-number": Row("episodes export {good} --out {new} --repo-id t/x --fps abc", 2, "invalid int value"),
    "episodes/no-command": Row("episodes", 2, "arguments are required"),
    "episodes/unknown": Row("episodes nonsense", 2, "invalid choice"),
    # world-model dataset
    **{f"dataset/{k}": Row(f"world-model dataset {{{k}}} --out {{new}}", *v) for k, v in EPISODE_KINDS.items()},
    **{f"dataset/{k}": Row(f"world-model dataset {{{k}}} --out {{new}}", 1, m)
       for k, m in (("trunc", "damaged"), ("corrupt", "damaged: chunk CRC mismatch"),
                    ("emptymcap", "damaged: .*not an MCAP file"), ("junkmcap", "damaged: .*not an MCAP file"),
                    ("badyaml", "no usable episode.*invalid YAML"), ("unreadable", "Input/output error"))},
    "dataset/out-unwritable": Row("world-model dataset {good} --out {unwritable}", 2,
                                  "cannot create the dataset folder /proc/nope"),
    "dataset/out-exists": Row("world-model dataset {good} --out {notep}", 2, "exists and is not an empty folder"),
    # urdf
    "urdf/config-missing": Row("urdf --config {missing}", 2, "not found"),
    "urdf/config-empty": Row("urdf --config {emptyfile}", 2, "expected a mapping"),
    "urdf/config-dir": Row("urdf --config {emptydir}", 2, "Is a directory"),
    "urdf/config-bad": Row("urdf --config {badyamlfile}", 2, "invalid YAML"),
    "urdf/config-unreadable": Row("urdf --config {procfile}", 2, "Input/output error"),
    "urdf/config-noperm": Row("urdf --config {nopermfile}", 2, "Permission denied", no_root=True),
    "urdf/compare-missing": Row("urdf --compare {missing}", 2, "No such file"),
    "urdf/compare-empty": Row("urdf --compare {emptyfile}", 2, "not a URDF"),
    "urdf/compare-dir": Row("urdf --compare {emptydir}", 2, "Is a directory"),
    "urdf/compare-junk": Row("urdf --compare {file}", 2, "not a URDF"),
    "urdf/compare-unreadable": Row("urdf --compare {procfile}", 2, "cannot read --compare .*Input/output error"),
    "urdf/output-dir": Row("urdf --output {emptydir}", 2, "cannot write --output .*Is a directory"),
    "urdf/output-unwritable": Row("urdf --output {unwritable}/robot.urdf", 2, "cannot write --output"),
    # params, run (nothing starts: arguments, parameter files and overrides are refused first)
    "params/unknown": Row("params nonode", 2, "unknown node 'nonode'; known nodes"),
    "run/no-nodes": Row("run", 2, "name the nodes"),
    "run/unknown-node": Row("run nonode", 2, "unknown node"),
    "run/config-missing": Row("run arm_ik --config-dir {missing}", 2, "--config-dir .*not a folder"),
    "run/config-file": Row("run arm_ik --config-dir {file}", 2, "not a folder"),
    "run/config-bad": Row("run arm_ik --config-dir {cfgdir}", 2, "arm_ik.yaml, line 2, column 1: invalid YAML"),
    "run/param-range": Row("run arm_ik -p arm_ik.rate_hz=1e9", 2, r"'rate_hz' = 1000000000.0 is out of range"),
    "run/param-type": Row("run arm_ik -p arm_ik.rate_hz=fast", 2, "has type str, expected float"),
    "run/param-form": Row("run arm_ik -p rate_hz=100", 2, "NODE.KEY=VALUE"),
    "run/param-node": Row("run arm_ik -p recorder.crcs=false", 2, "node 'recorder' is not started"),
    "run/param-key": Row("run arm_ik -p arm_ik.nope=1", 2, "unknown parameter 'nope'"),
    "run/duration": Row("run arm_ik --duration -1", 2, "a duration must be a finite number"),
    "run/duration-text": Row("run arm_ik --duration soon", 2, "is not a number of seconds"),
    # demo, call
    "demo/out-unwritable": Row("demo --out {unwritable}", 2, "/proc/nope"),
    "demo/duration": Row("demo --duration 0", 2, "a duration must be"),
    "demo/port": Row("demo --interactive --port 99999", 2, "a port is an integer"),
    "call/unknown": Row("call nonsense", 2, "invalid choice"),
    # world-model tools
    "encode-prompt/missing": Row("world-model encode-prompt {missing} robot {new}/p.safetensors", 2, "no such folder"),
    "encode-prompt/file": Row("world-model encode-prompt {file} robot {new}/p.safetensors", 2, "no such folder"),
    "tiny-base/missing": Row("world-model tiny-base {missing} --out {new} --prompt-file {new}/p.safetensors", 2,
                             "not a world-model dataset"),
    "tiny-base/file": Row("world-model tiny-base {file} --out {new} --prompt-file {new}/p.safetensors", 2,
                          "Not a directory"),
    "train/missing": Row("world-model train {missing}", 2, "train config not found"),
    "train/empty": Row("world-model train {emptyfile}", 2, "is required"),
    "train/dir": Row("world-model train {emptydir}", 2, "Is a directory"),
    "train/bad": Row("world-model train {badyamlfile}", 2, "invalid YAML"),
    "train/unreadable": Row("world-model train {procfile}", 2, "Input/output error"),
    "train/noperm": Row("world-model train {nopermfile}", 2, "Permission denied", no_root=True),
    "distill/missing": Row("world-model distill {missing}", 2, "distill config not found"),
    "distill/bad": Row("world-model distill {badyamlfile}", 2, "invalid YAML"),
    "eval/missing": Row("world-model eval {missing} --base-dir {missing} --weights-dir {missing} "
                        "--prompt-file {missing} --out {new}", 2, "not a world-model dataset"),
}


def _argv(row: Row, inputs: dict[str, str], key: str) -> list[str]:
    values = dict(inputs, new=f"{inputs['new']}-{re.sub(r'[^a-z0-9]+', '_', key)}")
    return [part.format(**values) for part in row.argv.split()]


@pytest.mark.parametrize("key", list(ROWS))
def test_bad_input_gives_a_message_and_an_exit_code_never_a_traceback(key, inputs, capsys):
    row = ROWS[key]
    if row.no_root and IS_ROOT:
        pytest.skip("running as root, which reads a file whatever its mode (the /proc/self/mem rows cover "
                    "an unreadable file)")
    try:
        code = cli.main(_argv(row, inputs, key))
    except SystemExit as exc:  # argparse: usage errors
        code = exc.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == row.code, f"{key}: exit {code}, expected {row.code}\n{text}"
    assert re.search(row.message, text, re.S), f"{key}: no {row.message!r} in\n{text}"
    assert "Traceback" not in text
    if row.code == 2:
        assert out.err.strip(), f"{key}: a refusal goes to standard error"


SUBPROCESS_ROWS = ["check/corrupt", "export/out-unwritable", "urdf/compare-junk", "run/param-range"]


@pytest.mark.parametrize("key", SUBPROCESS_ROWS)
def test_as_a_process_too(key, inputs, module_ros_env):
    row = ROWS[key]
    proc = subprocess.run([sys.executable, "-m", "rynn_teleop.cli", *_argv(row, inputs, key + "_process")],
                          capture_output=True, text=True, timeout=120, env=module_ros_env)
    assert proc.returncode == row.code, proc.stderr
    assert re.search(row.message, proc.stdout + proc.stderr, re.S) and "Traceback" not in proc.stderr


@pytest.mark.parametrize(("text", "value"), [
    ("1e9", 1e9), ("2.0E-3", 2.0e-3), (".5", 0.5), ("1.5e3", 1500.0), ("+1e-2", 0.01), ("-3", -3), ("200", 200),
    ("1_000", 1000), ("true", True), ("[1e9, .5]", [1e9, 0.5]), ("lab", "lab"), ("1e", "1e"),
])
def test_numbers_parse_as_users_write_them(text, value):
    got = cli.parse_value(text)
    assert got == value and type(got) is type(value)


def test_an_override_in_range_written_with_an_exponent_is_accepted():
    args = cli.build_parser().parse_args(["run", "arm_ik", "-p", "arm_ik.rate_hz=2.5e2", "-p",
                                          "arm_ik.ik.damping=1E-3"])
    nodes, overrides = cli._run_plan(args)
    assert nodes == ["arm_ik"] and overrides["arm_ik"] == {"rate_hz": 250.0, "ik.damping": 1e-3}
