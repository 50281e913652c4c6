"""Command-line and file plumbing shared by every program of the lab. It never imports torch, so the
plotter uses it too.

- `OneLineErrorParser`, `int_flag`, `float_flag`: every flag is checked before any work; a bad value
  is one line on stderr naming the flag and the allowed range, exit status 2.
- `output_folder_problem`, `output_file_problem` (and their `..._or_exit` forms): what cannot be
  written, or must not be replaced, is refused before any work: a path that is not a folder, a
  folder where a file goes, a link, device or pipe where a file goes, a name or a path too long, a
  folder without write permission, another user's file in a sticky folder. Nothing is left by a check.
- `write_files`: a run's files are written all or nothing: staged in one fresh folder beside the
  output, then published by renames (a new folder by one rename). Runs into one output wait for each
  other; a file the run does not write is never touched, and nothing is ever deleted but the stage.
- `HeldSignals`: Ctrl-C, SIGTERM and SIGHUP wait until a block ends (the writes use it).
- `run_cli`: runs a program's main() as a process: every failure ends with one line on stderr and
  a non-zero status, never a traceback (a full disk, a closed or full stdout, Ctrl-C, SIGTERM, out
  of memory). `flags_first`: the same for a program's `parse`, before its heavy imports.
- `csv_text`, `json_text`: the deterministic text of the lab's CSV and JSON files.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import csv
import errno
import fcntl
import io
import json
import math
import os
import re
import signal
import stat
import sys
import threading
import uuid


TEMPORARY_PREFIX = ".rl-lab-tmp-"
_TEMPORARY_NAME = re.compile(r"\.rl-lab-tmp-([0-9]+)-([0-9a-f]{12})\Z")  # a stage: <pid>-<token>
# the longest a stage adds to a target's path: "/.rl-lab-tmp-<pid up to 10 digits>-<12 hex>/new"
STAGE_OVERHEAD = len("/" + TEMPORARY_PREFIX) + 10 + 1 + 12 + len("/new")
_INTEGER_SYNTAX = re.compile(r"-?[0-9]+", re.ASCII)
_FLOAT_SYNTAX = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what a user or a process manager sends to stop
TRACEBACK_VARIABLE = "RL_LAB_TRACEBACK"
_FULL_STREAM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)  # print() failing: the stream's device


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

    def _print_message(self, message, file=None):
        """argparse's, except that --help into a full standard output is an error (argparse ignores it
        and would exit 0 having printed nothing)."""
        if not message or file is None or file is not sys.stdout:
            return super()._print_message(message, file)
        try:
            file.write(message)
            file.flush()
        except BrokenPipeError:  # a reader that went away (`--help | head`): quiet, as run_cli has it
            raise
        except OSError as error:
            raise WriteFailed(f"cannot write to standard output: {error.strerror or error}") from None
        return None


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
# Stop signals: raised in the main thread, or held back until a block ends
# ---------------------------------------------------------------------------------------------
# Python runs a signal's handler in the main thread, whichever thread the kernel delivered it to (torch
# starts threads of its own), so the handler itself decides: raise now, or, inside a HeldSignals
# block of the main thread, remember the signal and raise it when the block ends. Once main() has ended
# (a stop being reported, or the run done), a stop signal changes nothing.
# Where Python drops an exception (a weakref callback such as the import lock's, run while torch imports
# lazily; a __del__), the stop is sent again from a thread, to be raised once the callback has returned.

_held = threading.local()  # .depth: HeldSignals blocks open in this thread; .pending: the signal waiting
_program_pid = os.getpid()  # the process whose run_cli installed the handlers (set again by run_cli)
_main_ended = False  # True once run_cli's main() has returned or raised (set again by run_cli)


def _stop(signum):
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _send_again(signum):
    _thread.start_new_thread(_thread.interrupt_main, (signum,))  # (threading.Thread would wait for it here)


def _in_unraisable_hook(frame):
    while frame is not None and frame.f_code is not _on_unraisable.__code__:
        frame = frame.f_back
    return frame is not None


def _on_stop_signal(signum, frame):
    """run_cli's handler of Ctrl-C, SIGTERM and SIGHUP. In a process forked from the program's (a worker
    before it sets its own handlers) it does what the default action does: end that process."""
    if os.getpid() != _program_pid:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _in_unraisable_hook(frame):  # raised here, it would be dropped too
        _send_again(signum)
    elif _main_ended:
        return
    elif getattr(_held, "depth", 0):
        _held.pending = signum
    else:
        _stop(signum)


def _on_unraisable(unraisable):
    """run_cli's sys.unraisablehook: a stop signal's exception that Python dropped is raised again."""
    error = unraisable.exc_value
    if isinstance(error, KeyboardInterrupt) and not _main_ended:
        _send_again(error.signum if isinstance(error, Terminated) else signal.SIGINT)
    else:
        sys.__unraisablehook__(unraisable)


class HeldSignals:
    """Hold Ctrl-C, SIGTERM and SIGHUP back for a block of the main thread: one that arrives meanwhile is
    raised as the block ends (also when the block ends by an exception). Effective under run_cli, whose
    handlers consult it; elsewhere Ctrl-C raises at once and the writer's clean-up handles it."""

    def __enter__(self):
        _held.depth = getattr(_held, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        _held.depth -= 1
        pending = getattr(_held, "pending", None)
        if _held.depth == 0 and pending is not None:
            _held.pending = None
            _stop(pending)
        return False


# ---------------------------------------------------------------------------------------------
# Checking an output before any work (nothing is left here)
# ---------------------------------------------------------------------------------------------


def _nearest_existing(path):
    """The nearest existing folder of an absolute, resolved path (the path itself when it exists)."""
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _target_path(path):
    """The absolute path the kernel writes for the file `path`: its folder resolved with os.path.realpath
    (links and '..' as the kernel follows them: with L a link, L/.. is the parent of L's target, where
    os.path.abspath would say the current folder), its own name kept, so that a link there is seen and
    refused rather than followed."""
    folder, name = os.path.split(path)
    return os.path.join(os.path.realpath(folder or os.curdir), name)


def _limit(folder, name, default):
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def _longest_path(folder):
    """The longest path a write under the existing `folder` can take: PATH_MAX less its final NUL and
    what the staging folder adds."""
    return _limit(folder, "PC_PATH_MAX", 4096) - 1 - STAGE_OVERHEAD


def _sticky_refuses(folder, file_stat):
    """True when `folder` is sticky (like /tmp) and the file belongs to another user: rename fails there."""
    euid, folder_stat = os.geteuid(), os.stat(folder)
    return euid != 0 and bool(folder_stat.st_mode & stat.S_ISVTX) and euid not in (file_stat.st_uid, folder_stat.st_uid)


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
    with HeldSignals():  # a stop signal between creating the probe and removing it waits for the removal
        try:  # os.access says yes to root even where the filesystem refuses (e.g. /proc)
            os.mkdir(probe)  # a folder: if a SIGKILL leaves it, it is empty, and the next write removes it
        except OSError as error:
            return f"cannot write into {folder!r}: {error.strerror or error}"
        os.rmdir(probe)
    return None


def output_folder_problem(path, filenames=()):
    """A one-line reason why the run cannot write `filenames` into the folder `path`, or None.

    Creates nothing that stays: a missing folder is judged by its nearest existing parent, and is
    created only when the files are written (`write_files`).
    """
    if not isinstance(path, str) or not path.strip():
        return f"expected a folder name, got {path!r}"
    if "\0" in path:
        return "expected a folder name without a NUL character"
    parts = path.split(os.sep)
    for count in range(1, len(parts) + 1):  # the path as given: a file or a dangling link on the way is no folder
        prefix = os.sep.join(parts[:count]) or os.sep
        if os.path.lexists(prefix) and not os.path.isdir(prefix):
            return f"{prefix!r} exists and is not a folder"
    folder = os.path.realpath(path)
    existing = _nearest_existing(folder)
    if not os.path.isdir(existing):
        return f"{existing!r} is not a folder"
    name_max = _limit(existing, "PC_NAME_MAX", 255)
    missing = os.path.relpath(folder, existing)
    for part in ([] if missing == os.curdir else missing.split(os.sep)) + list(filenames):
        if len(os.fsencode(part)) > name_max:
            return f"name {part[:40]!r}... is longer than the {name_max} bytes this filesystem allows"
    longest = _longest_path(existing)
    for name in list(filenames) or [""]:
        if len(os.fsencode(os.path.join(folder, name))) > longest:
            return (f"path {path[:40]!r}... is {len(os.fsencode(os.path.join(folder, name)))} bytes long once "
                    f"resolved; at most {longest} bytes can be written here")
    if os.path.isdir(folder):
        for name in filenames:
            problem = _target_problem(folder, name)
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


def separate_outputs_or_exit(parser, outputs):
    """Exit 2 with one line naming the flag when one output ({flag: path}) is another or lies inside it:
    a run would replace, or collide with, its own files after all its work."""
    resolved = {flag: os.path.realpath(path) for flag, path in outputs.items()}
    for flag, path in resolved.items():
        for other, folder in resolved.items():
            if other != flag and os.path.commonpath([path, folder]) == folder:
                parser.error(f"argument {flag}: {outputs[flag]!r} is inside {other} {outputs[other]!r}, where "
                             "the run writes its own files")


MAX_INPUT_BYTES = 64 * 2**20  # the lab's largest output is a few hundred KB; anything far larger is not one


def input_file_problem(path, max_bytes=MAX_INPUT_BYTES):
    """Why `path` cannot be read as one of the lab's outputs, or None. Checked before opening it: a FIFO
    would block forever, /dev/zero would never end, a huge file would fill memory."""
    try:
        info = os.stat(path)
    except OSError as error:
        return f"cannot read ({error.strerror or error})"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_size > max_bytes:
        return f"{info.st_size} bytes, more than the {max_bytes} bytes read at most (no file the lab reads is as large)"
    return None


def output_folder_or_exit(parser, path, filenames=(), flag="--output"):
    """Check the output folder before any work, or exit 2 with one line naming the flag."""
    if (problem := output_folder_problem(path, filenames)) is not None:
        parser.error(f"argument {flag}: {problem}")


def output_file_or_exit(parser, path, flag="--output"):
    """Check an output file before any work, or exit 2 with one line naming the flag."""
    if (problem := output_file_problem(path)) is not None:
        parser.error(f"argument {flag}: {problem}")


# ---------------------------------------------------------------------------------------------
# Writing a run's files, all or nothing
# ---------------------------------------------------------------------------------------------
# A write, under the lock of every folder it publishes into:
#   1. make one fresh stage, .rl-lab-tmp-<pid>-<token>, in the nearest existing folder of the outputs (the
#      anchor), and in it an empty file named <token>: the mark that says the folder is a stage;
#   2. write every file into it, as new/<path from the anchor>;
#   3. publish: a new folder whole with one rename, each file of an existing folder by one os.replace
#      (its previous version kept as old/<path>, a hard link, until every rename is done);
#   4. remove the stage, its mark last.
# A failure puts the previous files back and removes the stage. Stop signals wait for the whole write, so
# only a SIGKILL leaves a stage behind. A later write into that folder (or into a folder just below it)
# removes such a stage, and only it: what was published is never moved or removed, and one line says so.


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # PermissionError: alive, another user's
        pass
    return True


def _remove_tree(path):
    """Remove the folder `path` and everything in it without following links, by a loop rather than
    recursion (a staged path may be nested deeper than Python's recursion limit)."""
    stack = [path]
    while stack:
        entries = list(os.scandir(stack[-1]))
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
        subfolders = [entry.path for entry in entries if entry.is_dir(follow_symlinks=False)]
        if subfolders:
            stack.extend(subfolders)
        else:
            os.rmdir(stack.pop())


def _make_parents(path):
    """Create the missing folders above `path` (parents first), by a loop for the same reason."""
    missing, folder = [], os.path.dirname(path)
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(missing):
        os.mkdir(folder)


def _remove_stage(stage, token):
    """Remove a stage, its mark last: a removal cut short leaves it marked, or empty."""
    for entry in list(os.scandir(stage)):
        if entry.name != token:
            (_remove_tree if entry.is_dir(follow_symlinks=False) else os.unlink)(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(stage, token))
    os.rmdir(stage)


def _remove_dead_stages(folder):
    """Remove the stages that runs killed by SIGKILL left in `folder`: named for a pid that no process has
    now, and marked (or empty). Anything else named like a stage is left, and said."""
    for name in os.listdir(folder):
        match, path = _TEMPORARY_NAME.match(name), os.path.join(folder, name)
        if not match or _process_alive(int(match.group(1))) or os.path.islink(path) or not os.path.isdir(path):
            continue
        try:
            if not os.path.isfile(os.path.join(path, match.group(2))):
                os.rmdir(path)  # empty, it holds nothing; full and unmarked, it is not the lab's: OSError
                continue
            _remove_stage(path, match.group(2))
            _say(f"{_program()}: note: removed {path!r}, left by a run killed while writing (pid "
                 f"{match.group(1)}); the files it had published stay as they are")
        except OSError:
            _say(f"{_program()}: note: left {path!r} as it is: named like a stage of the lab, but not one it can "
                 "remove")


def _entries(anchor, targets):
    """[(path relative to the anchor, is a folder)] to publish, in order, for the target files."""
    entries = {}
    for target in targets:
        parts = os.path.relpath(target, anchor).split(os.sep)
        for depth in range(1, len(parts)):
            path = os.path.join(anchor, *parts[:depth])
            if not os.path.lexists(path):
                entries.setdefault(os.path.join(*parts[:depth]), True)  # a new folder, published whole
                break
            if not os.path.isdir(path):
                raise WriteFailed(f"cannot write {target!r}: {path!r} is not a folder")
        else:
            problem = _target_problem(os.path.dirname(target), parts[-1])
            if problem:
                raise WriteFailed(problem)
            entries.setdefault(os.path.join(*parts), False)
    return list(entries.items())


@contextlib.contextmanager
def _locked(folders):
    """An exclusive lock (flock) on each folder, taken in sorted order so that two runs cannot each hold
    one the other waits for. Released when the block ends, or when the process dies. A folder that
    cannot be opened or locked (no read permission, a filesystem without flock) stays unlocked."""
    with contextlib.ExitStack() as descriptors:
        for folder in sorted(set(folders)):
            with contextlib.suppress(OSError):
                descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
                descriptors.callback(os.close, descriptor)
                fcntl.flock(descriptor, fcntl.LOCK_EX)  # waits for another run's write to end
        yield


def _stage_and_publish(anchor, targets, entries):
    token = uuid.uuid4().hex[:12]
    stage = os.path.join(anchor, f"{TEMPORARY_PREFIX}{os.getpid()}-{token}")
    try:
        os.mkdir(stage)
    except OSError as error:
        raise WriteFailed(f"cannot write into {anchor!r}: {error.strerror or error}") from None
    published = []  # (path relative to the anchor, its previous version or None), to put back on a failure
    try:
        staged = [(os.path.join(stage, token), stage, "")] + [  # (where, the name an error gives, data)
            (os.path.join(stage, "new", os.path.relpath(target, anchor)), target, data)
            for target, data in targets.items()]
        for path, target, data in staged:
            try:
                _make_parents(path)
                # "x", not mkstemp (whose 0600 mode would survive the rename): the umask applies
                with open(path, "xb") as handle:
                    handle.write(data if isinstance(data, bytes) else bytes(data, "utf-8"))
            except OSError as error:
                raise WriteFailed(f"cannot write {target!r}: {error.strerror or error}") from None
        for relative, is_folder in entries:
            target, old = os.path.join(anchor, relative), None
            try:
                if not is_folder and os.path.lexists(target):  # the previous file: kept until all are renamed
                    old = os.path.join(stage, "old", relative)
                    _make_parents(old)
                    try:
                        os.link(target, old)
                    except OSError:  # a filesystem without hard links: moved aside for a moment instead
                        os.replace(target, old)
                published.append((relative, old))
                os.replace(os.path.join(stage, "new", relative), target)
            except OSError as error:
                raise WriteFailed(f"cannot write {target!r}: {error.strerror or error}") from None
    except BaseException:
        with contextlib.suppress(OSError):  # what cannot be put back stays in the stage, for the user to see
            for relative, old in reversed(published):
                target, new = os.path.join(anchor, relative), os.path.join(stage, "new", relative)
                if old is not None:
                    os.replace(old, target)
                elif not os.path.lexists(new):  # this run created it: back into the stage
                    os.replace(target, new)
            _remove_stage(stage, token)
        raise
    with contextlib.suppress(OSError):  # only the previous versions are left; the next write there removes them
        _remove_stage(stage, token)


def write_files(files):
    """Write {path: text} (str as UTF-8, or bytes as they are) all or nothing, and create the missing folders.

    Raises WriteFailed naming the file (a full disk, a read-only folder, a target that turned into a
    link or device since the check); then every file is as it was before the call, and no folder or
    temporary of this call is left. Runs writing into the same folder wait for each other. Under
    run_cli, Ctrl-C, SIGTERM and SIGHUP wait until the write is done or undone.
    """
    if not files:
        return
    targets = {}
    for path, data in files.items():
        if os.path.basename(path) in ("", os.curdir, os.pardir):
            raise WriteFailed(f"cannot write {path!r}: not a file name")
        target = _target_path(path)
        longest = _longest_path(_nearest_existing(os.path.dirname(target)))
        if len(os.fsencode(target)) > longest:  # refused before anything is made: 2,100 levels fail deep down
            raise WriteFailed(f"cannot write {target[:40]!r}...: the path is {len(os.fsencode(target))} bytes long; "
                              f"at most {longest} bytes can be written here")
        targets[target] = data
    base = os.path.commonpath([os.path.dirname(target) for target in targets])
    while True:
        anchor = _nearest_existing(base)
        entries = _entries(anchor, targets)
        with _locked([anchor] + [os.path.dirname(os.path.join(anchor, relative)) for relative, _ in entries]):
            with HeldSignals():
                if _nearest_existing(base) == anchor and _entries(anchor, targets) == entries:
                    for folder in dict.fromkeys([anchor, os.path.dirname(anchor)]):  # where a killed run staged
                        with contextlib.suppress(OSError):
                            _remove_dead_stages(folder)
                    _stage_and_publish(anchor, targets, entries)
                    return
        # another run created a folder of the path meanwhile: plan again


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


def _say(text):
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: stderr closed (None)
        sys.stderr.write(one_line(text) + "\n")
        sys.stderr.flush()


def _settle_stdout():
    """Flush what main() printed; if stdout is closed or full, point it at the null device so that the
    interpreter's own flush at exit cannot print a second error."""
    if _lost_stdout:  # Progress met it first and already pointed stdout at the null device
        return _lost_stdout.pop()
    if sys.stdout is None:  # started with stdout closed (`>&-`): print() already wrote nothing
        return None
    try:
        sys.stdout.flush()
        return None
    except (OSError, ValueError) as error:
        _stdout_to_null()
        return error


def _stdout_to_null():
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: stdout closed (None)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _out_of_memory(error):
    """MemoryError, torch's allocator failing (a RuntimeError), or a compiled module that could not allocate
    while torch imports lazily (a SystemError whose module set no exception)."""
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error)) or (
        isinstance(error, SystemError) and "without exception set" in str(error))


_lost_stdout = []  # the error that made Progress stop printing, other than a reader that went away


class Progress:
    """Progress lines of a long run on stdout: a reader that goes away (`| head`) stops the lines, not the
    run (the files are still written; stdout then points at the null device). Any other failure to print
    (a full disk behind `> file`) also lets the run finish and write its files, then run_cli ends it with
    one line and status 1: the printed results were lost, and the exit status must say so."""

    def __init__(self):
        self.closed = False

    def __call__(self, line):
        if self.closed:
            return
        try:
            print(line, flush=True)
        except (BrokenPipeError, OSError, ValueError, AttributeError) as error:  # AttributeError: stdout None
            self.closed = True
            if isinstance(error, OSError) and not isinstance(error, BrokenPipeError):
                _lost_stdout.append(error)
            _stdout_to_null()


def run_cli(main_function):
    """Run `main_function()` as a program and return its exit status; never lets a traceback out.

    - a closed stdout pipe (`... | head`): quiet, status 1 (every file is written before anything is
      printed, so nothing is lost);
    - Ctrl-C: one line, status 130; SIGTERM 143, SIGHUP 129 (the same clean-up as Ctrl-C); one that
      arrives while files are written waits until they are (see HeldSignals);
    - a file that cannot be written (full disk, permissions), a full stdout (--help too), out of
      memory: one line, status 1;
    - anything unexpected: one line naming the exception, status 1 (set RL_LAB_TRACEBACK=1 to see
      the traceback).
    stdout and stderr replace what they cannot encode (an odd file name) instead of failing.
    """
    global _program_pid, _main_ended
    _program_pid, _main_ended = os.getpid(), False
    previous_handlers = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    previous_unraisablehook = sys.unraisablehook
    try:
        return _run(main_function)
    finally:
        sys.unraisablehook = previous_unraisablehook
        for signum, handler in previous_handlers.items():  # as found: a caller running main() in-process
            signal.signal(signum, handler)


def flags_first(parse):
    """Run `parse()`, the flags and main()'s checks of them, as run_cli runs main(): exit on --help or a bad flag."""
    status = run_cli(parse)
    if isinstance(status, int):  # an exit (0 after --help); good flags return the parsed namespace
        sys.exit(status)


def _run(main_function):
    global _main_ended
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):  # (a closed stream is None: AttributeError)
            stream.reconfigure(errors="backslashreplace")
    program = _program()
    try:
        try:  # the handlers are installed inside the try, so that a stop signal from the first moment is caught
            sys.unraisablehook = _on_unraisable
            for signum in _STOP_SIGNALS:
                signal.signal(signum, _on_stop_signal)
            status = main_function()
        except SystemExit as exit_:  # argparse's exits: --help (0) and a bad flag (2)
            status = exit_.code
        finally:
            _main_ended = True  # a stop signal from now on changes nothing
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
    except OSError as error:
        _settle_stdout()
        if not isinstance(error, WriteFailed) and error.filename is None and error.errno in _FULL_STREAM:
            # print() itself failed (a full disk behind `> file`, /dev/full): the lab's own files are named
            _say(f"{program}: error: cannot write to standard output: {getattr(error, 'strerror', None) or error}")
            return 1
        reason = str(error) if isinstance(error, WriteFailed) else (
            f"{error.strerror or error}" + (f": {error.filename!r}" if error.filename else ""))
        _say(f"{program}: error: {reason}")
        return 1
    except Exception as error:  # a defect of the lab itself: still one line, with a way to see more
        _settle_stdout()
        if _out_of_memory(error):
            _say(f"{program}: error: out of memory (choose smaller sizes)")
            return 1
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        _say(f"{program}: error: unexpected {type(error).__name__}: {error} "
             f"(run with {TRACEBACK_VARIABLE}=1 to see where)")
        return 1
