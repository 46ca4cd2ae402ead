"""``rynn-teleop world-model <tool>``: each training tool is reachable, has its own help, and errors exit 2."""

from __future__ import annotations

from importlib import import_module

import pytest

from rynn_teleop.cli import TRAINING_TOOLS, main
from rynn_teleop.errors import REFUSED_EXIT_CODE


@pytest.mark.parametrize("tool", sorted(TRAINING_TOOLS))
def test_every_tool_has_its_own_help(tool, capsys):
    module = import_module(f"rynn_teleop.world_model.training.{TRAINING_TOOLS[tool][0]}")
    assert callable(module.add_arguments) and callable(module.run_cli)
    with pytest.raises(SystemExit) as exit_info:
        main(["world-model", tool, "--help"])
    assert exit_info.value.code == 0
    assert f"rynn-teleop world-model {tool}" in capsys.readouterr().out


def test_a_user_error_is_one_line_and_exit_code_2(tmp_path, capsys):
    assert main(["world-model", "dataset", str(tmp_path / "absent"), "--out", str(tmp_path / "out")]) \
        == REFUSED_EXIT_CODE
    err = capsys.readouterr().err
    assert err.startswith("rynn-teleop: error: ") and "absent" in err and "Traceback" not in err
