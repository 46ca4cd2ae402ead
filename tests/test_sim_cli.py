"""``rynn-teleop sim``: export-model writes an MJCF MuJoCo loads; errors are one line and exit 2."""

from __future__ import annotations

import argparse

import mujoco
import pytest

from rynn_teleop.sim import cli


def test_export_model_writes_an_mjcf_mujoco_loads(tmp_path, capsys) -> None:
    out = tmp_path / "twin.xml"
    assert cli.main(["export-model", str(out), "--scene", "bimanual_lift", "--seed", "3"]) == 0
    model = mujoco.MjModel.from_xml_path(str(out))
    assert model.nu == 54 and model.body("blue_bar") and model.site("shelf")
    assert "mujoco.viewer" in capsys.readouterr().err
    alone = tmp_path / "robot.xml"
    assert cli.main(["export-model", str(alone), "--scene", "none"]) == 0
    assert mujoco.MjModel.from_xml_path(str(alone)).nq == 54


def test_scenes_are_listed(capsys) -> None:
    assert cli.main(["scenes"]) == 0
    listed = capsys.readouterr().out
    assert "pick_place:" in listed and "bimanual_lift:" in listed


def test_a_bad_request_is_one_line_and_exit_2(tmp_path, capsys) -> None:
    assert cli.main(["export-model", str(tmp_path / "x.xml"), "--scene", "no_such_scene"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rynn-teleop: error: scene file") and "not found" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):
        cli.main(["run", "--seeds", "a-b"])


def test_add_parser_wires_sim_into_a_parent_parser() -> None:
    parser = argparse.ArgumentParser(prog="rynn-teleop")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sim", "run", "--scene", "bimanual_lift", "--seeds", "1,4-5"])
    assert args.func.__name__ == "_cmd_run" and args.seeds == [1, 4, 5] and args.scene == "bimanual_lift"
    args = parser.parse_args(["sim", "export-model"])
    assert args.output == "rynn_twin.xml" and args.scene == "pick_place" and args.seed == 0
