"""The first line every program of the lab runs: a Ctrl-C, SIGTERM or SIGHUP before main() starts
(importing torch takes about a second) ends the process at once with one line, not a traceback.

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


def exit_quietly_on_signals():
    """Until run_cli takes over: Ctrl-C, SIGTERM or SIGHUP end the process at once with one line."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _exit_at_once)
