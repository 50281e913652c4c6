"""The first line every program of the lab runs: a Ctrl-C, SIGTERM or SIGHUP before main() starts
(importing torch takes about a second) ends the process at once with one line, not a traceback; so
does running out of memory while importing.

It imports nothing but os, signal and sys, so that it is in place within a millisecond of the
interpreter's start; lab_io.run_cli replaces these handlers once main() runs.
"""

import os
import signal
import sys

_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def _exit_at_once(signum, frame):
    program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "rl-lab"
    os.write(2, f"{program}: interrupted while starting: nothing was written\n".encode())
    os._exit(128 + signum)


def _out_of_memory_at_once(kind, error, traceback):
    """sys.excepthook until the program ends: an import that runs out of memory (torch's, under a low
    `ulimit -v`: a MemoryError, or a compiled module's SystemError) is one line, not a traceback."""
    if issubclass(kind, MemoryError) or (issubclass(kind, SystemError) and "without exception set" in str(error)):
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "rl-lab"
        os.write(2, f"{program}: error: out of memory while starting\n".encode())
    else:
        sys.__excepthook__(kind, error, traceback)


def exit_quietly_on_signals():
    """Until run_cli takes over: Ctrl-C, SIGTERM or SIGHUP end the process at once with one line; running
    out of memory while importing is one line too."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _exit_at_once)
    sys.excepthook = _out_of_memory_at_once
