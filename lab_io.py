"""Command-line and file plumbing shared by every program of the lab. It never imports torch, so the
plotter uses it too.

- `OneLineErrorParser`, `int_flag`, `float_flag`: every flag is checked before any work; a bad value
  is one line on stderr naming the flag and the allowed range, exit status 2.
- `output_folder_problem`, `output_file_problem` (and their `..._or_exit` forms): what cannot be
  written, or must not be replaced, is refused before any work: a path that is not a folder, a
  folder where a file goes, a link, device or pipe where a file goes, a name too long, a folder
  without write permission, another user's file in a sticky folder. Nothing is created by a check.
- `write_files`: a run's files are written all or nothing. Each is staged as a temporary file
  beside its target, then all are renamed into place with Ctrl-C and SIGTERM held back for those
  few microseconds; a failure removes the temporaries, the files already renamed and the folders
  this call created. The temporaries are named `.rl-lab-tmp-<pid>-<hex>`; one left by a killed
  process (SIGKILL cannot be caught) is removed by the next write into that folder.
- `run_cli`: runs a program's main() as a process: every failure ends with one line on stderr and
  a non-zero status, never a traceback (a full disk, a closed or full stdout, Ctrl-C, SIGTERM).
- `csv_text`, `json_text`: the deterministic text of the lab's CSV and JSON files.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import signal
import stat
import sys
import uuid

from lab_start import _exit_at_once  # the start-up handler, which run_cli replaces

TEMPORARY_PREFIX = ".rl-lab-tmp-"
_TEMPORARY_NAME = re.compile(r"\.rl-lab-tmp-([0-9]+)-[0-9a-f]{12}\Z")
_INTEGER_SYNTAX = re.compile(r"-?[0-9]+", re.ASCII)
_FLOAT_SYNTAX = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
# the signals a user or a process manager sends to stop a program; SIGHUP is absent on Windows
_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
TRACEBACK_VARIABLE = "RL_LAB_TRACEBACK"


class WriteFailed(OSError):
    """An output file could not be written; the message names the file and the reason in one line."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised like Ctrl-C so that the same clean-up runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


# ---------------------------------------------------------------------------------------------
# Flags
# ---------------------------------------------------------------------------------------------


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse parser whose errors are one line on stderr ('prog: error: ...') and exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # '--step' is not '--steps': every flag is spelled out
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def one_line(text):
    """`text` on one line: a value holding a newline must not split an error message."""
    return " ".join(str(text).splitlines())


def int_flag(low, high):
    """argparse type: a decimal integer in [low, high] (no floats, no bools)."""

    def parse(text):
        # int() alone would also take ' 3', '+3', '1_0' and non-ASCII digits
        # (and more than 4300 digits would exceed int()'s own limit: no valid value here is that long)
        if not _INTEGER_SYNTAX.fullmatch(text) or len(text) > 40:
            shown = text if len(text) <= 40 else text[:20] + "..."
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {shown!r}")
        value = int(text, 10)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer in [{low}, {high}], got {value}")
        return value

    return parse


def float_flag(low, high, *, low_open=False, high_open=False):
    """argparse type: a finite float in the range [low, high] (ends made open by low_open/high_open)."""
    interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"

    def parse(text):
        if not _FLOAT_SYNTAX.fullmatch(text):  # plain ASCII decimal notation; no 'nan', 'inf' or '1_0'
            shown = text if len(text) <= 40 else text[:20] + "..."
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {shown!r}")
        value = float(text)
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low) or (
            high_open and value == high
        ):
            raise argparse.ArgumentTypeError(f"expected a number in {interval}, got {text!r}")
        return value

    return parse


# ---------------------------------------------------------------------------------------------
# Checking an output before any work (nothing is created here)
# ---------------------------------------------------------------------------------------------


def _nearest_existing(path):
    existing = os.path.abspath(path)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    return existing


def _name_max(folder):
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # AttributeError: no pathconf on Windows
        return 255


def _sticky_refuses(folder, file_stat):
    """True when `folder` is sticky (like /tmp) and the file belongs to another user: rename fails there."""
    if not hasattr(os, "geteuid") or os.geteuid() == 0:
        return False
    folder_stat = os.stat(folder)
    euid = os.geteuid()
    return bool(folder_stat.st_mode & stat.S_ISVTX) and file_stat.st_uid != euid and folder_stat.st_uid != euid


def _target_problem(folder, name):
    """Why the file `name` in the existing folder `folder` must not be replaced, or None."""
    target = os.path.join(folder, name)
    try:
        target_stat = os.lstat(target)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"cannot inspect {target!r}: {error.strerror or error}"
    if stat.S_ISDIR(target_stat.st_mode):
        return f"{target!r} is a folder, so the file cannot be written"
    if not stat.S_ISREG(target_stat.st_mode):
        return f"{target!r} exists and is not a regular file (a link, device or pipe): it is never replaced"
    if _sticky_refuses(folder, target_stat):
        return f"{target!r} belongs to another user in a sticky folder, so it cannot be replaced"
    return None


def _probe_writable(folder):
    probe = os.path.join(folder, f"{TEMPORARY_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
    try:  # os.access says yes to root even where the filesystem refuses (e.g. /proc)
        with open(probe, "x", encoding="utf-8"):
            pass
    except OSError as error:
        return f"cannot write into {folder!r}: {error.strerror or error}"
    finally:  # also when Ctrl-C arrives right after the file was created
        if os.path.lexists(probe):
            os.unlink(probe)
    return None


def output_folder_problem(path, filenames=()):
    """A one-line reason why the run cannot write `filenames` into the folder `path`, or None.

    Creates nothing: a missing folder is judged by its nearest existing parent, and is created only
    when the files are written (`write_files`).
    """
    if not isinstance(path, str) or not path.strip():
        return f"expected a folder name, got {path!r}"
    if "\0" in path:
        return "expected a folder name without a NUL character"
    if os.path.lexists(path) and not os.path.isdir(path):
        return f"{path!r} exists and is not a folder"
    existing = _nearest_existing(path)
    if not os.path.isdir(existing):
        return f"{existing!r} is not a folder"
    name_max = _name_max(existing)
    missing = os.path.relpath(os.path.abspath(path), existing)
    for part in ([] if missing == os.curdir else missing.split(os.sep)) + list(filenames):
        if len(os.fsencode(part)) > name_max:
            return f"name {part[:40]!r}... is longer than the {name_max} bytes this filesystem allows"
    if os.path.isdir(path):
        for name in filenames:
            problem = _target_problem(path, name)
            if problem:
                return problem
    return _probe_writable(existing)


def output_file_problem(path):
    """A one-line reason why the file `path` cannot be written (or must not be replaced), or None."""
    if not isinstance(path, str) or not path.strip() or os.path.basename(path) == "":
        return f"expected a file path, got {path!r}"
    if os.path.isdir(path):
        return f"{path!r} is a folder, expected a file path"
    return output_folder_problem(os.path.dirname(path) or os.curdir, [os.path.basename(path)])


def output_folder_or_exit(parser, path, filenames=(), flag="--output"):
    """Check the output folder before any work, or exit 2 with one line naming the flag."""
    problem = output_folder_problem(path, filenames)
    if problem is not None:
        parser.error(f"argument {flag}: {problem}")


def output_file_or_exit(parser, path, flag="--output"):
    """Check an output file before any work, or exit 2 with one line naming the flag."""
    problem = output_file_problem(path)
    if problem is not None:
        parser.error(f"argument {flag}: {problem}")


# ---------------------------------------------------------------------------------------------
# Writing a run's files, all or nothing
# ---------------------------------------------------------------------------------------------


def _process_alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError, ValueError):  # PermissionError: alive, another user's
        return True
    return True


def remove_stale_temporaries(folder):
    """Remove `.rl-lab-tmp-<pid>-...` files in `folder` whose process no longer runs (a SIGKILL's
    leftovers); a running program's temporaries are left alone. Returns the names removed."""
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = _TEMPORARY_NAME.match(name)
        if match and not _process_alive(int(match.group(1))):
            try:
                os.unlink(os.path.join(folder, name))
                removed.append(name)
            except OSError:
                pass
    return removed


def _make_folders(folders):
    """Create the missing folders; return the ones created, parents first."""
    created = []
    for folder in sorted(set(folders)):
        missing = []
        while not os.path.lexists(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for path in reversed(missing):
            os.mkdir(path)
            created.append(path)
    return created


def _remove_folders(created):
    for path in reversed(created):
        try:
            os.rmdir(path)  # only if empty: never anything a user put there
        except OSError:
            pass


class HeldSignals:
    """Hold Ctrl-C, SIGTERM and SIGHUP back in this thread (and in every thread it starts meanwhile, which
    inherit the mask) for a block of microseconds; they arrive right after it."""

    def __enter__(self):
        self.held = hasattr(signal, "pthread_sigmask")
        if self.held:
            self.previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        return self

    def __exit__(self, *exc):
        if self.held:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.previous)
        return False


def write_files(files):
    """Write {path: text} (str as UTF-8 with '\\n' line ends, or bytes as they are) all or nothing, and
    create the missing folders.

    Raises WriteFailed naming the file (a full disk, a read-only folder, a target that turned into a
    link or device since the check); then no file of this call is left, neither new nor temporary,
    and the folders it created are removed again. Ctrl-C or SIGTERM during the writes does the same.
    """
    targets = [(os.path.abspath(path), text) for path, text in files.items()]
    created, staged, renamed = [], [], []
    try:
        try:
            created = _make_folders(os.path.dirname(path) for path, _ in targets)
        except OSError as error:
            raise WriteFailed(f"cannot create {error.filename!r}: {error.strerror or error}") from None
        for folder in sorted({os.path.dirname(path) for path, _ in targets}):
            remove_stale_temporaries(folder)
        for path, text in targets:
            problem = _target_problem(os.path.dirname(path), os.path.basename(path))
            if problem:
                raise WriteFailed(problem)
            temporary = os.path.join(os.path.dirname(path), f"{TEMPORARY_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}")
            staged.append((temporary, path))
            try:
                # "x", not mkstemp (whose 0600 mode would survive the rename): the umask applies
                if isinstance(text, bytes):
                    with open(temporary, "xb") as handle:
                        handle.write(text)
                else:
                    with open(temporary, "x", encoding="utf-8", newline="\n") as handle:
                        handle.write(text)
            except OSError as error:
                raise WriteFailed(f"cannot write {path!r}: {error.strerror or error}") from None
        with HeldSignals():
            for temporary, path in staged:
                try:
                    os.replace(temporary, path)
                except OSError as error:
                    raise WriteFailed(f"cannot replace {path!r}: {error.strerror or error}") from None
                renamed.append(path)
    except BaseException:
        # the files this call renamed into place, and the temporaries it has not renamed yet
        leftovers = renamed + [temporary for temporary, path in staged if path not in renamed]
        for leftover in leftovers:
            try:
                os.unlink(leftover)
            except OSError:
                pass
        _remove_folders(created)
        raise


def write_text_atomic(path, text):
    """Write one file through a temporary beside it (see `write_files`)."""
    write_files({path: text})


def csv_text(rows, columns):
    """Rows (dicts) as CSV text: header, one line per row, floats as Python repr, '\\n' line ends."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([repr(row[name]) if isinstance(row[name], float) else row[name] for name in columns])
    return buffer.getvalue()


def json_text(obj):
    """Deterministic JSON text (indent 2, insertion order, NaN/inf refused, trailing newline)."""
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


# ---------------------------------------------------------------------------------------------
# Running a program: one line for every way it can end badly
# ---------------------------------------------------------------------------------------------


def _program():
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "rl-lab"


def _raise_terminated(signum, frame):
    raise Terminated(signum)


def _say(text):
    try:
        sys.stderr.write(one_line(text) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # AttributeError: stderr closed (None)
        pass


def _settle_stdout():
    """Flush what main() printed; if stdout is closed or full, point it at the null device so that the
    interpreter's own flush at exit cannot print a second error."""
    if sys.stdout is None:  # started with stdout closed (`>&-`): print() already wrote nothing
        return None
    try:
        sys.stdout.flush()
        return None
    except (OSError, ValueError) as error:
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return error


def run_cli(main_function):
    """Run `main_function()` as a program and return its exit status; never lets a traceback out.

    - a closed stdout pipe (`... | head`): quiet, status 1 (every file is written before anything is
      printed, so nothing is lost);
    - Ctrl-C: one line, status 130; SIGTERM 143, SIGHUP 129 (the same clean-up as Ctrl-C);
    - a file that cannot be written (full disk, permissions) or a full stdout: one line, status 1;
    - anything unexpected: one line naming the exception, status 1 (set RL_LAB_TRACEBACK=1 to see
      the traceback).
    stdout and stderr replace what they cannot encode (an odd file name) instead of failing.
    """
    previous_handlers = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in _STOP_SIGNALS:
        if signum != signal.SIGINT:
            signal.signal(signum, _raise_terminated)
    try:
        return _run(main_function)
    finally:  # as found: a caller that runs main() in-process (the tests) keeps its own handlers
        for signum, handler in previous_handlers.items():
            if handler is not _exit_at_once and handler is not None:
                signal.signal(signum, handler)


def _run(main_function):
    for stream in (sys.stdout, sys.stderr):
        try:  # (a closed stream is None: AttributeError)
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    program = _program()
    try:
        status = main_function()
        error = _settle_stdout()
        if error is None:
            return status
        if isinstance(error, BrokenPipeError):
            return 1
        _say(f"{program}: error: cannot write to standard output: {getattr(error, 'strerror', None) or error}")
        return 1
    except BrokenPipeError:
        _settle_stdout()
        return 1
    except KeyboardInterrupt as interrupt:
        _settle_stdout()
        signum = interrupt.signum if isinstance(interrupt, Terminated) else signal.SIGINT
        name = signal.Signals(signum).name
        _say(f"{program}: interrupted ({name}): every output is whole; a run's files are written together, "
             "so a folder holds all of this run's files or none of them")
        return 128 + signum
    except MemoryError:
        _settle_stdout()
        _say(f"{program}: error: out of memory (choose smaller sizes)")
        return 1
    except OSError as error:
        _settle_stdout()
        reason = str(error) if isinstance(error, WriteFailed) else (
            f"{error.strerror or error}" + (f": {error.filename!r}" if error.filename else ""))
        _say(f"{program}: error: {reason}")
        return 1
    except Exception as error:  # a defect of the lab itself: still one line, with a way to see more
        _settle_stdout()
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        _say(f"{program}: error: unexpected {type(error).__name__}: {error} "
             f"(run with {TRACEBACK_VARIABLE}=1 to see where)")
        return 1
