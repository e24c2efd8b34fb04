"""User-facing errors: one line, actionable, no traceback (the CLI prints them and exits non-zero)."""

from __future__ import annotations


class XLNetError(Exception):
    """An error caused by the user's input or environment. The message is shown as is, on one line."""

    exit_code = 2


class ConfigError(XLNetError):
    """A config key is unknown, has the wrong type or an impossible value."""


class DataError(XLNetError):
    """Input data (text, shards, records, labelled files) is missing, unreadable or inconsistent."""


class CheckpointError(XLNetError):
    """A checkpoint is missing, corrupt, or disagrees with the requested config."""


class DiskFull(XLNetError):
    """A write ran out of space (ENOSPC, EDQUOT): the partial output was removed and an earlier one left as it was."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl-C, so temporary outputs are removed (signals.sigterm_as_interrupt)."""


class Preempted(XLNetError):
    """Training stopped on SIGTERM after writing a checkpoint; ``--resume`` continues exactly. Exit code 75
    (EX_TEMPFAIL in sysexits.h: a temporary failure, retry later), so a job script can tell it from an error (2).
    The process is leaving: a repeated SIGTERM is ignored from then on (it must not cut the exit short), so a Python
    caller that catches this and goes on restores its own handler (``signal.signal(signal.SIGTERM, ...)``)."""

    exit_code = 75


STARTUP_SIGTERM = (
    "stopped on SIGTERM while starting, before any step of this call: nothing trained or lost, the lock released; "
    "rerun the same command to start or continue the run"
)
