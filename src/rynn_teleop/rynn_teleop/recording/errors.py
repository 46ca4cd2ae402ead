"""The errors recording failures are reported with, and the exit codes the command line gives them.

Exit codes of ``rynn-teleop episodes ...`` and ``rynn-teleop world-model dataset``: 2 (:data:`USAGE_EXIT_CODE`)
for what the user asked (a bad argument, a path that does not exist or is not an episode, an output that
cannot be created or written, a file that cannot be opened), 1 (:data:`DATA_EXIT_CODE`) for what the data
holds (a damaged, unreadable or incomplete episode, a check that fails). An error carries its code in
``exit_code``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import REFUSED_EXIT_CODE, RynnTeleopError

if TYPE_CHECKING:
    from .integrity import IntegrityReport

USAGE_EXIT_CODE = REFUSED_EXIT_CODE
"""Exit code of a command refused for what it was asked to do (2, as argparse)."""
DATA_EXIT_CODE = 1
"""Exit code of a command that found the data damaged, unreadable or failing its check."""


class RecordingError(RynnTeleopError):
    """An episode cannot be started, written, closed, recovered or read.

    Raised at ``start`` (an unwritable or unusable output directory), stored in
    ``EpisodeWriter.error`` when the writer thread fails (disk full, I/O error)
    and raised again when the episode is stopped, and raised by ``recover`` and
    the inspection functions for a bag they cannot read.
    """

    exit_code = USAGE_EXIT_CODE


class EpisodeDataError(RecordingError):
    """An episode's bag cannot be read as needed, or lacks what is needed (its data is at fault).

    Attributes:
        episode: the episode directory (or bag file) it is about (None: not about one episode).
        topic: the topic it is about, or None.
    """

    exit_code = DATA_EXIT_CODE

    def __init__(self, message: str, *, episode: Path | None = None, topic: str | None = None) -> None:
        super().__init__(message)
        self.episode = episode
        self.topic = topic

    def __reduce__(self) -> tuple[Any, ...]:  # keeps the class, episode and topic across a process pool
        return (_rebuild_error, (type(self), self.args[0], self.episode, self.topic))


def _rebuild_error(cls: type[EpisodeDataError], message: str, episode: Path | None,
                   topic: str | None) -> EpisodeDataError:
    return cls(message, episode=episode, topic=topic)


class DamagedEpisodeError(EpisodeDataError):
    """An episode's MCAP file is damaged (:func:`.integrity.verify_mcap`): its message names the episode and
    says why in one line; ``rynn-teleop episodes check`` lists what was lost and ``episodes recover`` salvages
    the intact part into a new episode.

    Attributes:
        report: what the verification found (None once the error crossed a process boundary).
    """

    def __init__(self, message: str, *, episode: Path | None = None, topic: str | None = None,
                 report: IntegrityReport | None = None) -> None:
        super().__init__(message, episode=episode, topic=topic)
        self.report = report
