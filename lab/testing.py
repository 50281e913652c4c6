"""Helpers shared by the test files (test_*.py): running a main() in-process, tolerant comparison of
committed outputs, the single-thread setting of every test module, and deterministic runs computed over
the machine's cores, once per test process.

    python -m unittest                  # every test file of the lab (discovery: test_*.py)
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import csv
import functools
import importlib
import inspect
import io
import json
import math
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time
import traceback
from unittest import mock

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the lab's folder, above lab/
# Committed and published floats are compared with this relative tolerance, never byte for byte: another
# CPU (or another BLAS path) may round a reduction differently in the 16th-17th significant digit, e.g.
# 0.668435395925845 here and 0.6684353959258452 on an AVX2 machine. Two runs on one machine are compared
# byte for byte instead (the lab's determinism promise).
COMMITTED_RTOL = 1e-12
# absolute floor for values that should be 0 but carry rounding noise (a mean of +-1e-17 terms)
COMMITTED_ATOL = 1e-15


def single_thread_module():
    """(setUpModule, tearDownModule) for a test file: one torch thread while its tests run, as the
    drivers train (the tensors are tiny), and the caller's thread count restored afterwards."""
    from lab.checks import torch_threads

    guard = torch_threads(1)
    return (lambda: guard.__enter__()), (lambda: guard.__exit__(None, None, None))


def float64(values, **kwargs):
    """A float64 tensor of `values` (the lab's dtype), the tests' shorthand."""
    import torch

    return torch.tensor(values, dtype=torch.float64, **kwargs)


def run_main(main, argv, env=None):
    """Run a driver's main(argv) in-process; return (exit_code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    # a wide terminal: argparse wraps --help (even inside words with hyphens) to COLUMNS
    environment = {"COLUMNS": "1000", **(env or {})}
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), mock.patch.dict(os.environ, environment):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def run_cli_in_process(main, argv, env=None):
    """Run main(argv) under lab_io.run_cli, as the program would run; return (status, stdout, stderr)."""
    from lab import io as lab_io

    return run_main(lambda args: lab_io.run_cli(lambda: main(args)), argv, env)


def _differences(expected, actual, where, found, limit=5, abs_tol=COMMITTED_ATOL):
    """Append (where, expected, actual) for every number or value that differs beyond the tolerance."""
    if len(found) >= limit:
        return
    numbers = (int, float)
    if isinstance(expected, bool) or isinstance(actual, bool) or not (
        isinstance(expected, numbers) and isinstance(actual, numbers)
    ):
        if isinstance(expected, dict) and isinstance(actual, dict):
            if list(expected) != list(actual):
                found.append((f"{where} keys", list(expected), list(actual)))
                return
            for key in expected:
                _differences(expected[key], actual[key], f"{where}.{key}" if where else key, found, limit)
        elif isinstance(expected, list) and isinstance(actual, list):
            if len(expected) != len(actual):
                found.append((f"{where} length", len(expected), len(actual)))
                return
            for index, (a, b) in enumerate(zip(expected, actual)):
                _differences(a, b, f"{where}[{index}]", found, limit)
        elif expected != actual:
            found.append((where, expected, actual))
        return
    if isinstance(expected, int) and isinstance(actual, int):
        if expected != actual:
            found.append((where, expected, actual))
        return
    if not math.isclose(expected, actual, rel_tol=COMMITTED_RTOL, abs_tol=abs_tol):
        found.append((where, expected, actual))


def _parse_number(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def committed_differences(relative, fresh_text):
    """Compare a committed CSV or JSON file of the lab with freshly generated text, numbers with
    COMMITTED_RTOL. Returns a list of (where, committed value, fresh value); where names the key path
    (JSON) or the row's step and the column (CSV)."""
    with open(os.path.join(HERE, relative), encoding="utf-8", newline="") as handle:
        committed_text = handle.read()
    found = []
    if relative.endswith(".json"):
        _differences(json.loads(committed_text), json.loads(fresh_text), "", found)
        return found
    committed = list(csv.reader(io.StringIO(committed_text)))
    fresh = list(csv.reader(io.StringIO(fresh_text)))
    if committed[:1] != fresh[:1]:
        return [("header", committed[:1], fresh[:1])]
    if len(committed) != len(fresh):
        return [("number of rows", len(committed) - 1, len(fresh) - 1)]
    header = committed[0]
    for line, (old_row, new_row) in enumerate(zip(committed[1:], fresh[1:]), start=2):
        for column, old_value, new_value in zip(header, old_row, new_row):
            _differences(_parse_number(old_value), _parse_number(new_value), f"line {line} {column}", found)
    return found


def value_differences(committed_text, fresh, abs_tol=COMMITTED_ATOL):
    """[(where, committed, fresh)] when one committed CSV cell differs from a fresh value beyond COMMITTED_RTOL
    (and the absolute floor abs_tol)."""
    found = []
    _differences(_parse_number(committed_text), fresh, "value", found, abs_tol=abs_tol)
    return found


def describe_differences(relative, found):
    shown = "; ".join(f"{where}: in the checkout {old!r}, fresh {new!r}" for where, old, new in found)
    folder = os.path.dirname(relative) or relative
    return (f"{relative} differs from a fresh default run beyond the relative tolerance {COMMITTED_RTOL}: {shown}. "
            "If a command with other flags wrote into this path, restore the committed files with "
            f"`git checkout -- {folder}`; if the code changed a default run on purpose, regenerate and commit them.")


def _call(job):
    module, function, args, kwargs = job
    from lab.checks import torch_threads

    with torch_threads(1):
        return getattr(importlib.import_module(module), function)(*args, **kwargs)


_SHARED = {}  # (module, function, bound arguments) -> result, for the whole test process


def _shared_key(job):
    module, function, args, kwargs = job
    bound = inspect.signature(getattr(importlib.import_module(module), function)).bind(*args, **kwargs)
    bound.apply_defaults()  # train("ppo") and train("ppo", seed=7) are one run
    return module, function, repr(sorted(bound.arguments.items()))


_PREFETCHED = {}  # key -> the forked process computing it (prefetch), until shared_calls collects it


def _import_torch_lazy_modules():
    """lab.checks.import_torch_lazy_modules before a fork, once torch is imported (this module does not
    import it: a test of what a program imports before its flags are parsed imports this module too)."""
    if "torch" in sys.modules:
        from lab.checks import import_torch_lazy_modules

        import_torch_lazy_modules()


class _Prefetch:
    """One forked process that computes a list of shared calls, one after the other, and sends their results
    (pickled) down a pipe. It starts when a test file is imported and runs beside the tests before it; the
    processes of several files compute one after another, in the order the files were imported (the order
    their tests run), each after the one before has computed its runs."""

    _computed = None  # the read end of the last process's "computed" pipe: at its end of file, the next starts

    def __init__(self, keys, jobs):
        self.keys, self.results = keys, None
        read, write = os.pipe()
        after, (computed_read, computed_write) = _Prefetch._computed, os.pipe()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        _import_torch_lazy_modules()
        self.pid = os.fork()
        if self.pid == 0:  # the child: compute, send, and end without returning into the tests
            with contextlib.suppress(BaseException):
                os.setpgid(0, 0)  # a group of its own, with the workers it forks: stop() ends them all
                os.close(read)
                os.close(computed_read)
                os.nice(10)  # the tests in the main process go first; this takes the cycles they leave
                try:
                    if after is not None:
                        os.read(after, 1)  # end of file: the process before has computed its runs
                    answer = (True, [_call(job) for job in jobs])  # one after the other: one core
                except BaseException as error:  # raised in the test that asks for it
                    answer = (False, f"{type(error).__name__}: {error}")
                os.close(computed_write)
                with os.fdopen(write, "wb") as out:
                    pickle.dump(answer, out)
            os._exit(0)
        with contextlib.suppress(OSError):  # as the child does: whichever runs first, the group exists
            os.setpgid(self.pid, self.pid)
        os.close(write)
        os.close(computed_write)
        if after is not None:
            os.close(after)
        _Prefetch._computed = computed_read
        self.read = os.fdopen(read, "rb")

    def collect(self):
        """{key: result}: waits for the process; raises RuntimeError (each time it is asked) if it failed."""
        if self.results is None:
            try:
                data = self.read.read()
            finally:
                self.read.close()
                _, status = os.waitpid(self.pid, 0)
            try:
                finished, value = pickle.loads(data)
            except Exception:  # nothing or a part sent: it died (a signal, out of memory) or could not pickle
                finished, value = False, f"its process (status {status}) sent no complete results"
            self.results = dict(zip(self.keys, value)) if finished else RuntimeError(
                f"a prefetched run failed: {value}")
        if isinstance(self.results, RuntimeError):
            raise self.results
        return self.results

    def stop(self):
        if self.results is None:
            with contextlib.suppress(ProcessLookupError, ChildProcessError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)  # the process and the workers it forked, quietly
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.read.close()


def selects_tests(argv):
    """True when a unittest command line (sys.argv of `python -m unittest ...` or of `python test_x.py ...`)
    picks classes or tests (a dotted name past a module, or -k), not whole modules or a discovery. Another
    program's command line (bench.py's, say) selects nothing."""
    if not argv or not (argv[0].endswith("unittest") or os.path.basename(argv[0]).startswith("test_")):
        return False
    arguments = argv[1:]
    if any(argument == "-k" or argument.startswith("-k") for argument in arguments):
        return True
    names = [argument for argument in arguments if not argument.startswith("-") and not os.path.isdir(argument)]
    if not argv[0].endswith("unittest"):  # python test_x.py Class...: every name is a class or a test
        return bool(names)
    return any("." in (name[:-3] if name.endswith(".py") else name) for name in names)


def prefetch(jobs):
    """Start computing these shared_calls jobs now, in one forked process beside the tests (where fork
    exists and the machine has two cores or more); shared_calls then collects them instead of computing them.
    A test file calls it when it is imported, for the runs its slowest classes need. Nothing starts when
    the command line selects single classes or tests (`python -m unittest test_x.Class`, `-k`): their
    runs are computed where asked, and the other classes' runs not at all. A process that is not
    collected is killed when the tests end."""
    if (os.cpu_count() or 1) < 2 or not hasattr(os, "fork") or selects_tests(sys.argv):
        return
    keys, todo = [], []
    for job in jobs:
        key = _shared_key(job)
        if key not in _SHARED and key not in _PREFETCHED and key not in keys:
            keys.append(key)
            todo.append(job)
    if todo:
        _PREFETCHED.update(dict.fromkeys(keys, _Prefetch(keys, todo)))


@atexit.register
def _stop_prefetches():
    for handle in set(_PREFETCHED.values()):
        handle.stop()


def shared_calls(jobs):
    """parallel_calls for deterministic runs that several test files train: each distinct call is computed
    once per test process (the missing ones over the cores, or collected from a prefetch); each caller gets
    its own copy."""
    keys = [_shared_key(job) for job in jobs]
    for key in keys:
        if key not in _SHARED and key in _PREFETCHED:
            _SHARED.update(_PREFETCHED[key].collect())
    missing = {}
    for key, job in zip(keys, jobs):
        if key not in _SHARED:
            missing.setdefault(key, job)
    _SHARED.update(zip(missing, parallel_calls(list(missing.values()))))
    return [copy.deepcopy(_SHARED[key]) for key in keys]


def shared_function(module, function):
    """A patch of module.function (mock.patch.object) for a block in which a main() trains: each call is
    looked up among the shared_calls results by its bound arguments, and computed here when missing. A
    main that passed other arguments than the run a test expects gets the other run."""
    target = importlib.import_module(module)
    original = getattr(target, function)

    @functools.wraps(original)  # inspect.signature, and so _shared_key, see the original's parameters
    def call(*args, **kwargs):
        key = _shared_key((module, function, args, kwargs))
        if key not in _SHARED:
            _SHARED[key] = original(*args, **kwargs)
        return copy.deepcopy(_SHARED[key])

    return mock.patch.object(target, function, call)


def parallel_calls(jobs):
    """[(module, function, args, kwargs)] -> results in order, spread over the machine's cores (fork). The
    runs are deterministic and single-threaded, so the results do not depend on where they ran; this only
    shortens the learning tests, which train dozens of runs."""
    workers = min(os.cpu_count() or 1, len(jobs))
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        return [_call(job) for job in jobs]
    _import_torch_lazy_modules()
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return pool.map(_call, jobs, chunksize=1)


class ForkedProgram:
    """`function()` run as a program (under lab_io.run_cli) in a child forked from the tests' process: a
    process of its own, leading its own process group (setsid), stdin on the null device, stdout and stderr
    on pipes. Its stop signals, exit status and worker processes are a program's, without the seconds a
    fresh interpreter spends importing torch. The members of subprocess.Popen that the tests use (text
    pipes)."""

    def __init__(self, function):
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        for stream in (sys.stdout, sys.stderr):  # nothing of the parent's buffers is written twice
            stream.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the tests
            status = 1
            try:
                os.setsid()
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(out_write, 1)
                os.dup2(err_write, 2)
                for fd in (out_read, out_write, err_read, err_write):
                    os.close(fd)
                # fresh streams on the pipes, whatever the test runner put in their place (unittest -b)
                sys.stdin = open(0, closefd=False)
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                from lab import io as lab_io

                result = lab_io.run_cli(function)
                status = 0 if result is None else result  # as sys.exit reads it
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # the harness itself failed: say how, on the child's stderr
                os.write(2, traceback.format_exc().encode())
            finally:
                os._exit(status if isinstance(status, int) else 1)
        self.pid, self.returncode = pid, None
        os.close(out_write)
        os.close(err_write)
        self.stdout = open(out_read, encoding="utf-8")
        self.stderr = open(err_read, encoding="utf-8")

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout):
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked program {self.pid}", timeout)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum):
        if self.poll() is None:
            os.kill(self.pid, signum)

    def close(self):
        """Kill the child's process group if the child still runs, reap it, close the pipes."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.wait(60)
        self.stdout.close()
        self.stderr.close()
