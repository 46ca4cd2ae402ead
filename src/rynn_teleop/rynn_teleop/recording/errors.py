"""The error every recording failure is reported with."""

from __future__ import annotations

from ..errors import RynnTeleopError


class RecordingError(RynnTeleopError):
    """An episode cannot be started, written, closed, recovered or read.

    Raised at ``start`` (an unwritable or unusable output directory), stored in
    ``EpisodeWriter.error`` when the writer thread fails (disk full, I/O error)
    and raised again when the episode is stopped, and raised by ``recover`` and
    the inspection functions for a bag they cannot read.
    """
