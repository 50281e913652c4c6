"""The first line every program of the lab runs: until lab_io.run_cli takes over, a Ctrl-C, SIGTERM or SIGHUP
(importing torch takes about a second), or out of memory while importing, is one line and no traceback."""

import os
import signal
import sys


def _exit_at_once(signum, frame):
    os.write(2, f"{os.path.basename(sys.argv[0])}: interrupted while starting: nothing was written\n".encode())
    os._exit(128 + signum)


def _out_of_memory_at_once(kind, error, traceback):  # a compiled module that cannot allocate: SystemError
    if not (issubclass(kind, MemoryError) or (issubclass(kind, SystemError) and "exception set" in str(error))):
        return sys.__excepthook__(kind, error, traceback)
    os.write(2, f"{os.path.basename(sys.argv[0])}: error: out of memory while starting\n".encode())


def exit_quietly_on_signals():
    """Imports only os, signal and sys: in place within a millisecond of the interpreter's start."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        signal.signal(getattr(signal, name), _exit_at_once)
    sys.excepthook = _out_of_memory_at_once
