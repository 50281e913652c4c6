"""Tests of lab/io.py: faults and hostile input end with one line and lose nothing.

    python -m unittest -v test_lab_io

Each class guards one cause: outputs that must not be replaced (and paths resolved as the kernel
resolves them), files written all or nothing (a full disk, a failed rename, Ctrl-C or SIGTERM in the
middle, a stop signal between two renames), no folder left by a failed write, a run killed (SIGKILL) at
every step of its write that costs the user nothing, runs into one output one after the other, run_cli's
one line for every failure, stop signals at the moments Python would drop or repeat them, the workers
of a killed experiments.py, and what needs a fresh process (a Ctrl-C while torch is still loading).
"""

import builtins
import contextlib
import errno
import fcntl
import io
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import weakref
from unittest import mock

import torch

import bench
import experiments
from atlas import engine as atlas_engine
from lab import io as lab_io
import online_tokens
import plot_results
import ppo_chain
import rl_lab
import token_objectives
from lab.checks import torch_threads
from lab import testing as lab_testing
from lab.testing import HERE, run_cli_in_process, run_main


MEMORY_FOLDER = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # a memory filesystem: quicker writes


def staged(path):
    """True for a file written inside a write's stage (.rl-lab-tmp-<pid>-<hex>/...)."""
    return lab_io.TEMPORARY_PREFIX in str(path) and not os.path.basename(str(path)).startswith(
        lab_io.TEMPORARY_PREFIX)


def failing_open(fail_on_call, exception):
    """A replacement for open() that raises `exception` when the n-th file is staged."""
    calls = {"count": 0}
    real_open = builtins.open

    def fake_open(path, mode="r", *args, **kwargs):
        if "x" in mode and staged(path):
            calls["count"] += 1
            if calls["count"] == fail_on_call:
                handle = real_open(path, mode, *args, **kwargs)  # the staged file exists, then the write fails
                handle.close()
                raise exception
        return real_open(path, mode, *args, **kwargs)

    return fake_open


def contents(folder):
    """{relative path: text} of every file under `folder`."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(root, name), encoding="utf-8") as handle:
                found[os.path.relpath(os.path.join(root, name), folder)] = handle.read()
    return found


def write_under_run_cli(files):
    """write_files(files) as a program runs it (run_cli's signal handlers); (status, stdout, stderr)."""
    return run_cli_in_process(lambda argv: lab_io.write_files(files) or 0, [])


def dead_pid():
    """The pid of a process that has ended (it is not reused within the test's few milliseconds)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _record_start(path, value):
    """A prefetch job for Prefetch: appends `value` to the file at `path` when it starts, and returns value squared."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(f"{value}\n")
    time.sleep(0.05)
    return value * value


class Prefetch(unittest.TestCase):
    """lab.testing.prefetch: what a forked process computed is what shared_calls returns, in the order the
    prefetches were made; a failed run is an error in the test that asks for it, never a silent recomputation."""

    def test_results_arrive_in_order_and_a_failure_raises(self):
        if (os.cpu_count() or 1) < 2 or not hasattr(os, "fork"):
            self.skipTest("prefetch computes in place on one core")
        # a chain of its own: not behind the suite's prefetches, which would make it wait for all of them
        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(lab_testing._Prefetch, "_computed", None), \
                mock.patch.object(sys, "argv", ["python -m unittest"]):  # the whole suite, whatever was selected
            log = os.path.join(tmp, "starts")
            first = [("test_lab_io", "_record_start", (log, value), {}) for value in (3, 4)]
            second = [("test_lab_io", "_record_start", (log, 5), {})]
            lab_testing.prefetch(first)
            lab_testing.prefetch(second)
            failed = [("math", "sqrt", (-1.0,), {})]
            lab_testing.prefetch(failed)
            self.assertEqual(lab_testing.shared_calls(second + first), [25, 9, 16])
            with open(log, encoding="utf-8") as handle:  # computed once each, the first prefetch first
                self.assertEqual(handle.read().split(), ["3", "4", "5"])
            for _ in range(2):  # asked again (another test of the class), the same error
                with self.assertRaisesRegex(RuntimeError, "a prefetched run failed: ValueError: math domain error"):
                    lab_testing.shared_calls(failed)


    def test_a_selection_of_classes_or_tests_prefetches_nothing(self):
        cases = {("python -m unittest",): False, ("python -m unittest", "discover", "-s", ".", "-p", "test_*.py"): False,
                 ("python -m unittest", "test_online_tokens", "test_results.py"): False,
                 ("python -m unittest", "test_online_tokens.Learning"): True,
                 ("python -m unittest", "-k", "Learning"): True, ("python -m unittest", "-kLearning"): True,
                 ("test_results.py",): False, ("test_results.py", "CommittedResults"): True,
                 ("bench.py", "--part", "suite", "--output", "results-bench/suite.json"): False}
        for argv, selects in cases.items():
            with self.subTest(argv=argv):
                self.assertIs(lab_testing.selects_tests(list(argv)), selects)
        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(lab_testing._Prefetch, "_computed", None), \
                mock.patch.object(sys, "argv", ["python -m unittest", "test_lab_io.Prefetch"]):
            log = os.path.join(tmp, "starts")
            jobs = [("test_lab_io", "_record_start", (log, 6), {})]
            lab_testing.prefetch(jobs)
            self.assertNotIn(lab_testing._shared_key(jobs[0]), lab_testing._PREFETCHED)  # nothing started
            self.assertEqual(lab_testing.shared_calls(jobs), [36])  # computed where asked
            with open(log, encoding="utf-8") as handle:
                self.assertEqual(handle.read().split(), ["6"])

class OutputsThatMustNotBeReplaced(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(dir=MEMORY_FOLDER)
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def test_a_device_a_pipe_or_a_link_is_refused_before_any_work(self):
        os.mkfifo(self.path("fifo.json"))
        os.mkfifo(self.path("fifo.svg"))
        os.makedirs(self.path("run"))
        os.symlink("/etc/hostname", self.path("run", "ppo.csv"))
        os.makedirs(self.path("online"))
        os.mkfifo(self.path("online", "online.json"))
        cases = [
            (token_objectives.main, ["--output", os.devnull]),
            (token_objectives.main, ["--output", self.path("fifo.json")]),
            (rl_lab.main, ["--algorithm", "ppo", "--steps", "1", "--output", self.path("run")]),
            (online_tokens.main, ["--steps", "1", "--output", self.path("online")]),
            (plot_results.main, ["--input", os.path.join(HERE, "results-chain"), "--output", self.path("fifo.svg")]),
        ]
        for main, argv in cases:
            with self.subTest(program=main.__module__, output=argv[-1]):
                code, stdout, stderr = run_main(main, argv)
                self.assertEqual(code, 2)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn("--output", stderr)
                self.assertIn("not a regular file", stderr)
                self.assertEqual(stdout, "")
        self.assertTrue(os.path.islink(self.path("run", "ppo.csv")))
        self.assertEqual(os.listdir(self.path("run")), ["ppo.csv"])
        self.assertEqual(sorted(os.listdir(self.path("online"))), ["online.json"])

    def test_another_users_file_in_a_sticky_folder_is_refused_before_any_work(self):
        sticky = self.path("shared")
        os.makedirs(sticky)
        os.chmod(sticky, 0o1777)
        with open(os.path.join(sticky, "ppo-chain.json"), "w", encoding="utf-8") as handle:
            handle.write("{}\n")
        # the folder and the file belong to this test's user; seen as another user, rename would fail
        with mock.patch.object(os, "geteuid", return_value=os.stat(sticky).st_uid + 4242):
            code, _, stderr = run_main(ppo_chain.main, ["--steps", "1", "--output", sticky])
        self.assertEqual(code, 2)
        self.assertIn("another user", stderr)
        self.assertIn("ppo-chain.json", stderr)

    def test_a_path_through_a_link_and_dotdot_goes_where_the_kernel_resolves_it(self):
        os.makedirs(self.path("deep", "inner"))
        os.symlink(self.path("deep", "inner"), self.path("link"))
        # the kernel reads link/.. as deep (the parent of the link's target); lexically it would be tmp
        output = os.path.join(self.path("link"), "..", "run")
        self.assertIsNone(lab_io.output_folder_problem(output, ["ppo-chain.csv"]))
        code, _, stderr = run_main(ppo_chain.main, ["--steps", "1", "--output", output])
        self.assertEqual((code, stderr), (0, ""))
        self.assertEqual(sorted(os.listdir(self.path("deep", "run"))), ["ppo-chain.csv", "ppo-chain.json"])
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["deep", "link"])

    def test_a_path_longer_than_the_system_allows_is_refused_before_any_work(self):
        deep = os.path.join(self.tmp.name, *["a"] * 2100, "t.json")  # 2,100 levels, about 4,300 bytes
        code, stdout, stderr = run_main(token_objectives.main, ["--output", deep])
        self.assertEqual((code, stdout), (2, ""))
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("--output", stderr)
        self.assertIn("bytes", stderr)
        with self.assertRaises(lab_io.WriteFailed):  # the writer alone: it fails and leaves nothing either
            lab_io.write_files({deep: "{}\n"})
        self.assertEqual(os.listdir(self.tmp.name), [])

    def test_an_output_named_like_a_stage_is_never_removed_by_a_later_write(self):
        stage_like = f"{lab_io.TEMPORARY_PREFIX}{dead_pid()}-abcdefabcdef"  # a pid that has ended
        self.assertIsNone(lab_io.output_folder_problem(self.path(stage_like), ["online.csv"]))
        lab_io.write_files({self.path(stage_like, "online.csv"): "x\n"})
        with mock.patch.object(sys, "stderr", io.StringIO()) as err:
            lab_io.write_files({self.path("figure.svg"): "<svg/>\n"})  # a write beside it
        self.assertEqual(contents(self.tmp.name), {f"{stage_like}/online.csv": "x\n", "figure.svg": "<svg/>\n"})
        self.assertEqual(err.getvalue().count("\n"), 1)  # without the lab's mark it is not a stage: said, kept
        self.assertIn(f"left '{self.path(stage_like)}' as it is", err.getvalue())

    def test_a_file_or_a_dangling_link_on_the_way_is_no_folder(self):
        os.symlink(self.path("nowhere"), self.path("dangling"))
        open(self.path("file"), "w").close()
        self.assertIn("'%s' exists and is not a folder" % self.path("dangling"),
                      lab_io.output_folder_problem(self.path("dangling", "quick")))
        self.assertIn("'%s' exists and is not a folder" % self.path("file"),
                      lab_io.output_file_problem(self.path("file", "quick", "out.json")))
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["dangling", "file"])  # nowhere was not created

    def test_checks_create_nothing(self):
        target = self.path("a", "b", "c")
        self.assertIsNone(lab_io.output_folder_problem(target, ["x.csv"]))
        self.assertIsNone(lab_io.output_file_problem(os.path.join(target, "f.json")))
        self.assertEqual(os.listdir(self.tmp.name), [])
        with open(self.path("file"), "w", encoding="utf-8") as handle:
            handle.write("keep\n")
        self.assertIn("not a folder", lab_io.output_folder_problem(self.path("file", "sub")))
        self.assertIn("not a folder", lab_io.output_folder_problem(self.path("file")))


class AllOrNothing(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(dir=MEMORY_FOLDER)
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def test_a_full_disk_leaves_neither_file_and_removes_the_new_folder(self):
        out = self.path("new", "chain")
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        with mock.patch("builtins.open", failing_open(2, full)):
            code, stdout, stderr = run_cli_in_process(ppo_chain.main, ["--steps", "1", "--output", out])
        self.assertEqual(code, 1)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("No space left on device", stderr)
        self.assertIn("ppo-chain.", stderr)  # the file that could not be written
        self.assertEqual(stdout, "")
        self.assertEqual(os.listdir(self.tmp.name), [])  # the folders made for the run are gone again

    def test_a_failed_rename_puts_the_previous_files_back(self):
        old = {"a.csv": "old a\n", "b.csv": "old b\n", "figure.svg": "a user's figure\n"}
        for name, text in old.items():
            with open(self.path(name), "w", encoding="utf-8") as handle:
                handle.write(text)
        files = {self.path("a.csv"): "new a\n", self.path("b.csv"): "new b\n", self.path("c.csv"): "new c\n"}
        real_replace = os.replace

        def replace(source, target):
            if target == self.path("c.csv"):  # a.csv and b.csv were replaced already
                raise PermissionError(errno.EPERM, "Operation not permitted", target)
            return real_replace(source, target)

        with mock.patch.object(os, "replace", replace), self.assertRaises(lab_io.WriteFailed) as caught:
            lab_io.write_files(files)
        self.assertIn("c.csv", str(caught.exception))
        self.assertEqual(contents(self.tmp.name), old)  # the previous run's files, whole; nothing else

    def test_ctrl_c_during_the_writes_keeps_the_old_folder_whole(self):
        out = self.path("run")
        self.assertEqual(run_main(rl_lab.main, ["--steps", "2", "--output", out])[0], 0)
        before = contents(out)
        with mock.patch("builtins.open", failing_open(5, KeyboardInterrupt())):
            code, stdout, stderr = run_cli_in_process(rl_lab.main, ["--steps", "3", "--output", out])
        self.assertEqual(code, 130)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("interrupted", stderr)
        self.assertEqual(contents(out), before)  # every file is the old run's: no mix of two runs

    def test_sigterm_during_the_writes_lets_them_finish_then_stops(self):
        real_open = builtins.open
        sent = []

        def terminating_open(path, mode="r", *args, **kwargs):
            if "x" in mode and staged(path) and not sent:
                sent.append(path)
                os.kill(os.getpid(), signal.SIGTERM)  # while the first file is staged
            return real_open(path, mode, *args, **kwargs)

        out = self.path("chain")
        with mock.patch("builtins.open", terminating_open):
            code, _, stderr = run_cli_in_process(ppo_chain.main, ["--steps", "1", "--output", out])
        self.assertEqual(code, 143)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("SIGTERM", stderr)
        self.assertEqual(len(sent), 1)
        self.assertEqual(os.listdir(self.tmp.name), ["chain"])  # the run's folder, whole; no stage
        self.assertEqual(sorted(os.listdir(out)), ["ppo-chain.csv", "ppo-chain.json"])

    def test_a_stop_signal_between_two_renames_waits_for_the_last(self):
        # torch's own threads can receive a signal; Python then runs the handler in the main thread at
        # its next instruction, wherever that is: here, right after the first of two renames
        for name, text in (("ppo.csv", "old csv\n"), ("ppo.json", "old json\n"), ("dpo.csv", "dpo\n")):
            with open(self.path(name), "w", encoding="utf-8") as handle:
                handle.write(text)
        real_replace = os.replace
        called = []

        def replace(source, target):
            real_replace(source, target)
            if target == self.path("ppo.csv"):
                called.append(target)
                signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)

        with mock.patch.object(os, "replace", replace):
            code, _, stderr = write_under_run_cli({self.path("ppo.csv"): "new csv\n",
                                                   self.path("ppo.json"): "new json\n"})
        self.assertEqual(called, [self.path("ppo.csv")])
        self.assertEqual(code, 143)
        self.assertIn("SIGTERM", stderr)
        self.assertEqual(contents(self.tmp.name), {"ppo.csv": "new csv\n", "ppo.json": "new json\n",
                                                    "dpo.csv": "dpo\n"})

    def test_a_stop_signal_while_the_probe_is_removed_leaves_no_probe(self):
        real_rmdir = os.rmdir

        def rmdir(path, *args, **kwargs):
            if os.path.basename(str(path)).startswith(lab_io.TEMPORARY_PREFIX):
                signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # just before the probe is removed
            return real_rmdir(path, *args, **kwargs)

        with mock.patch.object(os, "rmdir", rmdir):
            code, _, stderr = run_cli_in_process(ppo_chain.main, ["--steps", "1", "--output", self.path("new", "x")])
        self.assertEqual(code, 143)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertEqual(os.listdir(self.tmp.name), [])  # the probe was in tmp, the nearest existing folder

    def test_written_files_follow_the_umask(self):
        previous = os.umask(0o022)
        try:
            path = self.path("metrics.csv")
            lab_io.write_files({path: "x\n"})
        finally:
            os.umask(previous)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o644)

    def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(self):
        path = self.path("metrics.csv")
        lab_io.write_files({path: "old\n"})
        with self.assertRaises(TypeError):
            lab_io.write_files({path: 12345})  # fails inside the write, after the temporary exists
        with open(path, encoding="utf-8") as handle:
            self.assertEqual(handle.read(), "old\n")
        self.assertEqual(os.listdir(self.tmp.name), ["metrics.csv"])


class NoFolderLeftByAFailedWrite(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(dir=MEMORY_FOLDER)
        self.addCleanup(self.tmp.cleanup)

    def test_no_inode_for_the_second_new_folder_leaves_no_folder(self):
        real_mkdir = os.mkdir
        calls = []

        def mkdir(path, *args, **kwargs):
            calls.append(path)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
            return real_mkdir(path, *args, **kwargs)

        out = os.path.join(self.tmp.name, "a", "b", "c")
        with mock.patch.object(os, "mkdir", mkdir):
            code, stdout, stderr = run_cli_in_process(ppo_chain.main, ["--steps", "1", "--output", out])
        self.assertEqual((code, stdout), (1, ""))
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("No space left on device", stderr)
        self.assertEqual(len(calls), 2)
        self.assertEqual(os.listdir(self.tmp.name), [])


def killed_at(step, files):
    """Write `files` in a forked process that SIGKILLs itself just before the `step`-th call of the write
    to mkdir, open, link, replace, unlink or rmdir. True if it was killed, False if the write ended first."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's lines run in the fork
        try:
            calls = []

            def before(real):
                def call(*args, **kwargs):
                    calls.append(real)
                    if len(calls) == step:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)
                return call

            with contextlib.ExitStack() as patches:
                for name in ("mkdir", "link", "replace", "unlink", "rmdir"):
                    patches.enter_context(mock.patch.object(os, name, before(getattr(os, name))))
                patches.enter_context(mock.patch("builtins.open", before(builtins.open)))
                lab_io.write_files(files)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        return True
    if os.WEXITSTATUS(status) != 0:
        raise AssertionError("the write failed in the child")
    return False


class KilledRuns(unittest.TestCase):
    """A run killed by SIGKILL at every step of its write; then the reruns, the user's own files and the
    writes beside it that follow. Whatever the killed run had published stays; nothing of the user's goes."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(dir=MEMORY_FOLDER)
        self.addCleanup(self.tmp.cleanup)
        os.mkdir(self.path("runs"))

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def write(self, files):
        """write_files(files); the notes it printed on stderr, each one line."""
        with mock.patch.object(sys, "stderr", io.StringIO()) as err:
            lab_io.write_files(files)
        return err.getvalue().splitlines()

    def kill_at_every_step(self, files, then):
        """For step 1, 2, ...: a fresh copy of runs/ (from `self.before`), a run of `files` killed there,
        then `then(step)`; until a run ends before its step. Returns the number of steps."""
        for step in range(1, 100):
            self.reset()
            if not killed_at(step, files):
                return step - 1
            with self.subTest(step=step):
                then(step)
                stages = [os.path.join(root, name) for root, folders, names in os.walk(self.tmp.name)
                          for name in folders + names if name.startswith(lab_io.TEMPORARY_PREFIX)]
                self.assertEqual(stages, [])  # every stage of the killed run was removed, nothing more
        self.fail("the write never ended")

    def reset(self):
        for root, folders, names in os.walk(self.path("runs"), topdown=False):
            for name in names:
                os.unlink(os.path.join(root, name))
            for name in folders:
                os.rmdir(os.path.join(root, name))
        for relative, text in self.before.items():
            os.makedirs(os.path.dirname(self.path("runs", relative)), exist_ok=True)
            with open(self.path("runs", relative), "w", encoding="utf-8") as handle:
                handle.write(text)

    def user_note(self, folder):
        with open(self.path("runs", folder, "notes.txt"), "w", encoding="utf-8") as handle:
            handle.write("the user's notes\n")

    def test_a_new_folder_killed_anywhere_then_a_rerun_a_note_and_writes_beside_it_lose_nothing(self):
        self.before = {"other/keep.csv": "another run\n"}
        run = {self.path("runs", "exp1", "ppo.csv"): "killed\n", self.path("runs", "exp1", "ppo.json"): "killed\n"}
        rerun = dict.fromkeys(run, "rerun\n")

        def then(step):
            notes = self.write(rerun)  # into the same folder: whole again
            self.assertLessEqual(len(notes), 1)
            self.assertTrue(all("note: removed" in note and "pid" in note for note in notes), notes)
            self.user_note("exp1")
            self.assertEqual(self.write({self.path("runs", "fig.svg"): "<svg/>\n"}), [])  # the plotter
            self.assertEqual(self.write({self.path("runs", "exp2", "ppo.csv"): "sibling\n"}), [])  # a sibling
            self.assertEqual(contents(self.path("runs")), {
                "exp1/ppo.csv": "rerun\n", "exp1/ppo.json": "rerun\n", "exp1/notes.txt": "the user's notes\n",
                "fig.svg": "<svg/>\n", "exp2/ppo.csv": "sibling\n", "other/keep.csv": "another run\n"})

        self.assertGreaterEqual(self.kill_at_every_step(run, then), 8)  # mkdir, mark, folders, 2 files, rename...

    def test_a_killed_write_into_a_folder_keeps_each_file_whole_and_the_users_file(self):
        self.before = {"exp1/ppo.csv": "old\n", "exp1/ppo.json": "old\n"}
        run = {self.path("runs", "exp1", "ppo.csv"): "killed\n", self.path("runs", "exp1", "ppo.json"): "killed\n"}

        def then(step):
            self.user_note("exp1")
            self.assertEqual(self.write({self.path("runs", "fig.svg"): "<svg/>\n"}), [])  # beside: not its stage
            found = contents(self.path("runs", "exp1"))
            self.assertEqual(found.pop("notes.txt"), "the user's notes\n")
            for name in ("ppo.csv", "ppo.json"):  # each file whole: the old or the new one (a mix until a rerun)
                self.assertIn(found.pop(name), ("old\n", "killed\n"))
            self.write(dict.fromkeys(run, "rerun\n"))  # the rerun removes the stage and writes both
            self.assertEqual(contents(self.path("runs")), {
                "exp1/ppo.csv": "rerun\n", "exp1/ppo.json": "rerun\n", "exp1/notes.txt": "the user's notes\n",
                "fig.svg": "<svg/>\n"})

        self.assertGreaterEqual(self.kill_at_every_step(run, then), 8)

    def test_a_killed_sft_write_then_a_rerun_keeps_the_cache_it_loaded(self):
        # sft.py writes a new cache folder and the evaluation together; the rerun loads the cache the killed
        # run had published and writes only its evaluation: the cache stays as it was
        self.before = {"evaluation.json": "old\n"}
        run = {self.path("runs", "sft-key", "model.pt"): "weights\n",
               self.path("runs", "sft-key", "config.json"): "{}\n", self.path("runs", "evaluation.json"): "killed\n"}

        def then(step):
            cache = contents(self.path("runs", "sft-key"))
            self.write({self.path("runs", "evaluation.json"): "rerun\n"})
            self.assertEqual(contents(self.path("runs", "sft-key")), cache)
            self.assertIn(cache, ({}, {"model.pt": "weights\n", "config.json": "{}\n"}))  # all or nothing

        self.assertGreaterEqual(self.kill_at_every_step(run, then), 8)

    def test_what_is_not_the_stage_of_a_dead_run_is_left(self):
        prefix = lab_io.TEMPORARY_PREFIX
        empty, unmarked = f"{prefix}{dead_pid()}-0123456789ab", f"{prefix}{dead_pid()}-ba9876543210"
        live = f"{prefix}{os.getppid()}-0123456789ab"  # a running process's stage: never touched
        os.mkdir(self.path("runs", empty))  # a killed probe, or a stage killed before its mark: empty
        for name in (unmarked, live):
            os.mkdir(self.path("runs", name))
            with open(self.path("runs", name, "mine.txt"), "w", encoding="utf-8") as handle:
                handle.write("a user's file\n")
        notes = self.write({self.path("runs", "fig.svg"): "<svg/>\n"})
        self.assertEqual(sorted(os.listdir(self.path("runs"))), sorted([unmarked, live, "fig.svg"]))
        self.assertEqual(len(notes), 1)
        self.assertIn(f"left '{self.path('runs', unmarked)}' as it is", notes[0])


class ConcurrentRuns(unittest.TestCase):
    """A second run starts while the first is inside its write (at an exact point: an os function the
    first calls); it gets as far as it can, which must be no farther than the lock."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(dir=MEMORY_FOLDER)
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def race(self, first, second, function, when):
        """Run write_files(first); when function(*args) is called with `when(args)` true, run
        write_files(second) in a thread until it ends or waits for the lock. Returns the second's error."""
        real_function, real_flock = getattr(os, function), fcntl.flock
        main_thread = threading.current_thread()
        waiting, errors = threading.Event(), []

        def second_run():
            try:
                lab_io.write_files(second)
            except BaseException as error:  # reported by the test, not lost in the thread
                errors.append(error)

        other = threading.Thread(target=second_run)

        def hooked(*args, **kwargs):
            if when(args) and threading.current_thread() is main_thread and other.ident is None:
                other.start()
                while other.is_alive() and not waiting.is_set():
                    other.join(0.01)
            return real_function(*args, **kwargs)

        def flock(descriptor, operation):
            if threading.current_thread() is not main_thread:
                waiting.set()  # the second run reached the lock (and waits there while the first holds it)
            return real_flock(descriptor, operation)

        with mock.patch.object(os, function, hooked), mock.patch.object(fcntl, "flock", flock):
            lab_io.write_files(first)
        other.join()
        return errors

    def test_two_runs_into_one_existing_folder_do_not_mix(self):
        os.makedirs(self.path("run"))
        first = {self.path("run", "ppo.csv"): "first\n", self.path("run", "ppo.json"): "first\n"}
        second = {self.path("run", "ppo.csv"): "second\n", self.path("run", "ppo.json"): "second\n"}
        # the second run starts just before the first one's second rename
        errors = self.race(first, second, "replace", lambda args: args[1] == self.path("run", "ppo.json"))
        self.assertEqual(errors, [])
        self.assertEqual(contents(self.tmp.name), {"run/ppo.csv": "second\n", "run/ppo.json": "second\n"})

    def test_two_runs_creating_one_new_folder_both_succeed(self):
        first = {self.path("run", "ppo.csv"): "first\n", self.path("run", "ppo.json"): "first\n"}
        second = {self.path("run", "ppo.csv"): "second\n", self.path("run", "ppo.json"): "second\n"}
        # the second run starts when the first creates its first folder
        errors = self.race(first, second, "mkdir", lambda args: True)
        self.assertEqual(errors, [])
        self.assertEqual(contents(self.tmp.name), {"run/ppo.csv": "second\n", "run/ppo.json": "second\n"})


class FullStream(io.RawIOBase):
    """A standard output on a full disk: every write fails with ENOSPC."""

    def writable(self):
        return True

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class OneLineForEveryFailure(unittest.TestCase):
    def test_a_full_stdout_is_one_line_and_status_1(self):
        def main(argv):
            print("a summary line")
            return 0

        full = io.TextIOWrapper(io.BufferedWriter(FullStream()), encoding="utf-8")
        err = io.StringIO()
        with mock.patch.object(sys, "stdout", full), mock.patch.object(sys, "stderr", err):
            code = lab_io.run_cli(lambda: main([]))
        self.assertEqual(code, 1)
        self.assertEqual(err.getvalue().count("\n"), 1)
        self.assertIn("cannot write to standard output: No space left on device", err.getvalue())

    def test_progress_into_a_full_stdout_lets_the_run_finish_then_says_so_with_status_1(self):
        written = []

        def main(argv):
            progress = lab_io.Progress()
            progress("step 1")  # fails: the run goes on
            written.append("files")
            progress("step 2")
            return 0

        def printing_main(argv):
            print("a line", flush=True)  # fails inside main: an OSError without a file name
            return 0

        for program, expected_written in ((main, ["files"]), (printing_main, [])):
            written.clear()
            full = io.TextIOWrapper(io.BufferedWriter(FullStream()), encoding="utf-8")
            err = io.StringIO()
            with mock.patch.object(sys, "stdout", full), mock.patch.object(sys, "stderr", err):
                code = lab_io.run_cli(lambda: program([]))
            self.assertEqual(code, 1)
            self.assertEqual(written, expected_written)
            self.assertEqual(err.getvalue().count("\n"), 1)
            self.assertIn("cannot write to standard output: No space left on device", err.getvalue())

    @unittest.skipUnless(os.path.exists("/dev/full"), "needs /dev/full")
    def test_progress_or_print_into_dev_full_in_a_process_is_status_1(self):
        # In a real process Progress points the full stdout at the null device: the flush at the end then
        # succeeds, so only the recorded failure can make the status say that the printed lines were lost.
        # A print() longer than the buffer fails at once, keeping nothing to flush: its OSError names no file.
        for line in ("lab_io.Progress()('a progress line')", "print('a long table ' * 10000)"):
            code = f"import sys\nfrom lab import io as lab_io\ndef main():\n    {line}\n    return 0\nsys.exit(lab_io.run_cli(main))\n"
            with self.subTest(line=line), open("/dev/full", "w") as full:
                finished = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE, text=True,
                                          cwd=HERE, timeout=60, check=False)
                self.assertEqual(finished.returncode, 1)
                self.assertEqual(finished.stderr.count("\n"), 1)
                self.assertIn("cannot write to standard output: No space left on device", finished.stderr)

    def test_help_into_a_full_stdout_is_one_line_and_status_1_in_every_program(self):
        for module in (rl_lab, ppo_chain, token_objectives, online_tokens, experiments, plot_results, bench):
            with self.subTest(program=module.__name__):
                full = io.TextIOWrapper(io.BufferedWriter(FullStream()), encoding="utf-8")
                err = io.StringIO()
                with mock.patch.object(sys, "stdout", full), mock.patch.object(sys, "stderr", err):
                    code = lab_io.run_cli(lambda: module.main(["--help"]))
                self.assertEqual(code, 1)
                self.assertEqual(err.getvalue().count("\n"), 1, err.getvalue())
                self.assertIn("cannot write to standard output: No space left on device", err.getvalue())

    def test_torchs_out_of_memory_is_the_out_of_memory_line(self):
        raised = [  # what torch's CPU allocator raises (a RuntimeError, not a MemoryError), and what a compiled
            # module raises when it cannot allocate as torch imports it lazily on the first optimizer step
            RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                         "memory: you tried to allocate 68719476736 bytes. Error code 12"),
            SystemError("error return without exception set"),
        ]
        for error in raised:
            def main(argv):
                raise error

            with self.subTest(error=type(error).__name__):
                code, _, stderr = run_cli_in_process(main, [])
                self.assertEqual(code, 1)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn("error: out of memory (choose smaller sizes)", stderr)
                self.assertNotIn("unexpected", stderr)

    def test_a_benchmarked_driver_that_fails_is_one_line_with_its_own_message(self):
        # bench.py runs each driver in a temporary folder: a full TMPDIR makes the driver fail there
        failing = ["-c", "import sys; sys.exit('ppo_chain.py: error: cannot write ...: No space left on device')"]
        with tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
            code, _, stderr = run_cli_in_process(lambda argv: bench.timed_process(failing, 1, tmp) or 0, [])
        self.assertEqual(code, 1)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("(status 1): ppo_chain.py: error: cannot write ...: No space left on device", stderr)
        self.assertNotIn("unexpected", stderr)

    def test_a_temporary_folder_that_cannot_be_removed_never_hides_the_error_of_the_benchmark(self):
        # TMPDIR made read-only in the middle of a run: the driver fails, and so does removing its folder
        made = []

        def fail_in(folder):
            made.append(folder)
            with open(os.path.join(folder, "ppo-chain.csv"), "w", encoding="utf-8") as handle:
                handle.write("step\n")
            raise ChildProcessError("ppo_chain.py failed (status 1): ppo_chain.py: error: Read-only file system")

        def rmdir(path, *args, **kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

        entry_points = [
            ("main", lambda argv: bench.main(argv),
             mock.patch.object(bench, "timed_process", lambda argv, runs, folder: fail_in(folder))),
            ("transformer_lines", lambda argv: bench.transformer_lines(1),
             mock.patch("sft.load_or_train", lambda task, config, cache: fail_in(cache))),
        ]
        for name, entry_point, failing in entry_points:
            # torch_threads: bench.main sets one thread for the rest of its process, this one included
            with self.subTest(entry_point=name), failing, mock.patch("os.rmdir", rmdir), \
                    torch_threads(torch.get_num_threads()):
                code, _, stderr = run_cli_in_process(entry_point, ["--runs", "1"])
            self.assertEqual(code, 1)
            self.assertEqual(len(stderr.splitlines()), 1, stderr)
            # the driver's failure, not the clean-up's PermissionError on 'ppo-chain.csv' or a RecursionError
            self.assertTrue(stderr.endswith(": error: ppo_chain.py failed (status 1): ppo_chain.py: error: "
                                            "Read-only file system\n"), stderr)
            os.rmdir(made[-1])  # the folder the failed clean-up left behind, now empty
        self.assertEqual(len(made), 2)  # each entry point failed inside its scratch folder

    def test_bench_scratch_folder_is_removed_after_success_and_failure(self):
        with bench.scratch_folder() as folder:
            with open(os.path.join(folder, "ppo.csv"), "w", encoding="utf-8") as handle:
                handle.write("step\n")
        self.assertFalse(os.path.exists(folder))
        with self.assertRaisesRegex(ChildProcessError, "^the run failed$"), bench.scratch_folder() as folder:
            os.mkdir(os.path.join(folder, "sub"))
            raise ChildProcessError("the run failed")
        self.assertFalse(os.path.exists(folder))
        with mock.patch("os.rmdir", side_effect=PermissionError(errno.EACCES, "Permission denied")):
            with bench.scratch_folder() as folder:  # a folder that cannot be removed is no error of the run
                pass
        self.assertTrue(os.path.isdir(folder))
        os.rmdir(folder)

    def test_a_name_a_strict_stdout_cannot_encode_is_escaped(self):
        strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
        with mock.patch.object(sys, "stdout", strict):
            code = lab_io.run_cli(lambda: print("-> bad\udcffname/ppo.csv") or 0)
            strict.flush()
            printed = strict.buffer.getvalue()
        self.assertEqual(code, 0)
        self.assertEqual(printed, b"-> bad\\udcffname/ppo.csv\n")

    def test_an_unexpected_exception_is_one_line_with_a_way_to_see_more(self):
        def main(argv):
            raise TypeError("a defect")

        code, _, stderr = run_cli_in_process(main, [])
        self.assertEqual(code, 1)
        self.assertEqual(len(stderr.strip().splitlines()), 1)
        self.assertIn("unexpected TypeError: a defect", stderr)
        self.assertIn(lab_io.TRACEBACK_VARIABLE, stderr)

    def test_ctrl_c_while_drawing_a_figure_is_one_line_and_writes_nothing(self):
        with tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
            out = os.path.join(tmp, "new", "chain.svg")
            with mock.patch.object(plot_results, "figure_bytes", side_effect=KeyboardInterrupt):
                code, _, stderr = run_cli_in_process(
                    plot_results.main, ["--input", os.path.join(HERE, "results-chain"), "--output", out])
            self.assertEqual(code, 130)
            self.assertEqual(len(stderr.strip().splitlines()), 1)
            self.assertEqual(os.listdir(tmp), [])


class StopSignals(unittest.TestCase):
    """The first stop signal ends the run with its one line and status, wherever it lands; later ones
    change nothing. Each case sends the signal at the exact moment named."""

    def test_a_stop_that_python_drops_inside_a_callback_still_ends_the_run(self):
        # torch's lazy imports run importlib's module-lock callbacks by the thousand; an exception raised in
        # a callback is printed as "Exception ignored" and dropped, and the run would go on
        finished = []

        def main(argv):
            class Thing:
                pass

            def callback(reference):
                os.kill(os.getpid(), signal.SIGINT)
                return len(finished)  # the handler runs here, inside the callback

            thing = Thing()
            reference = weakref.ref(thing, callback)
            del thing
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the training that must not go on
                pass
            finished.append(reference)
            return 0

        code, _, stderr = run_cli_in_process(main, [])
        self.assertEqual((code, finished), (130, []))
        self.assertEqual(len(stderr.splitlines()), 1, stderr)
        self.assertIn("interrupted (SIGINT)", stderr)

    def test_a_second_stop_while_the_first_is_reported_changes_nothing(self):
        def main(argv):
            os.kill(os.getpid(), signal.SIGTERM)
            return 0

        def settle_and_ctrl_c():  # a Ctrl-C just after a SIGTERM, while run_cli handles the first
            os.kill(os.getpid(), signal.SIGINT)

        with mock.patch.object(lab_io, "_settle_stdout", settle_and_ctrl_c):
            code, _, stderr = run_cli_in_process(main, [])
        self.assertEqual(code, 143)
        self.assertEqual(len(stderr.splitlines()), 1, stderr)
        self.assertIn("interrupted (SIGTERM)", stderr)

    def test_a_stop_as_the_handlers_are_installed_or_restored_is_one_line_or_nothing(self):
        real_signal, started = signal.signal, []

        def ctrl_c_once_installed(signum, handler):
            previous = real_signal(signum, handler)
            if handler is lab_io._on_stop_signal and signum == signal.SIGINT:
                os.kill(os.getpid(), signal.SIGINT)  # before main() starts
            return previous

        with mock.patch.object(signal, "signal", ctrl_c_once_installed):
            code, _, stderr = run_cli_in_process(lambda argv: started.append(argv) or 0, [])
        self.assertEqual((code, started), (130, []))
        self.assertEqual(len(stderr.splitlines()), 1, stderr)

        def sigterm_while_restored(signum, handler):
            if handler is not lab_io._on_stop_signal:  # run_cli puts the caller's handlers back: main() has ended
                lab_io._on_stop_signal(signal.SIGTERM, None)
            return real_signal(signum, handler)

        with mock.patch.object(signal, "signal", sigterm_while_restored):
            code, _, stderr = run_cli_in_process(lambda argv: started.append(argv) or 0, [])
        self.assertEqual((code, stderr, started), (0, "", [[]]))


class KilledMainProcess(unittest.TestCase):
    def test_the_workers_of_experiments_end_when_the_main_process_is_killed(self):
        # each worker is forked from the main process; if it kept the main process's end of its own pipe,
        # it would never read end-of-file when SIGKILL ends the main process, and would live on
        with tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
            def nap(seed):  # a job: say which process runs it, then take a moment
                with open(os.path.join(tmp, f"{seed}.pid"), "w", encoding="utf-8") as handle:
                    handle.write(str(os.getpid()))
                time.sleep(0.05)
                return seed

            jobs = [("nap", index, "nap", seed, "nap", {}) for index, seed in enumerate((1, 2, 3))]
            with mock.patch.dict(atlas_engine.RUNNERS, {"nap": nap}):
                main = os.fork()
                if main == 0:  # pragma: no cover - the main process of the pool, in the fork
                    try:
                        for _ in atlas_engine._results_from_workers(jobs, 2):
                            pass
                    finally:
                        os._exit(0)
            paths = [os.path.join(tmp, f"{seed}.pid") for seed in (1, 2)]
            deadline = time.monotonic() + 30
            while not all(os.path.exists(path) and os.path.getsize(path) for path in paths):
                self.assertLess(time.monotonic(), deadline, "the workers never started")
                time.sleep(0.01)
            os.kill(main, signal.SIGKILL)
            os.waitpid(main, 0)
            workers = []
            for path in paths:
                with open(path, encoding="utf-8") as handle:
                    workers.append(int(handle.read()))
            self.addCleanup(lambda: [os.kill(pid, signal.SIGKILL) for pid in workers if running(pid)])
            deadline = time.monotonic() + 10  # each ends once its job is done and its answer cannot go out
            while any(running(pid) for pid in workers) and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual([pid for pid in workers if running(pid)], [])


def running(pid):
    """True while `pid` is a process that has not ended (a zombie, which no parent reaps here, has ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class FreshProcess(unittest.TestCase):
    """What needs a new Python process: a Ctrl-C while torch is still loading, and a closed pipe."""

    def test_ctrl_c_while_starting_writes_nothing_and_a_closed_pipe_is_quiet(self):
        with tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
            out = os.path.join(tmp, "out")
            starting = subprocess.Popen(
                [sys.executable, "-B", os.path.join(HERE, "rl_lab.py"), "--algorithm", "ppo", "--steps", "3", "--output", out],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp,
            )
            # the pipe test runs meanwhile: a reader that went away before the first byte (`| head` does it later)
            piped = subprocess.Popen([sys.executable, "-B", os.path.join(HERE, "library_map.py")],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)
            piped.stdout.close()
            # inside torch's import (here the signal lands at 0.1-0.2 s and the process ends at 0.26 s, when torch._C
            # has loaded); at 0.3 s the import was over, and the test timed a whole run, or a SIGINT that numpy's
            # import swallowed, instead
            time.sleep(0.1)
            starting.send_signal(signal.SIGINT)
            _, stderr = starting.communicate(timeout=60)
            # while torch loads, Python's own KeyboardInterrupt (a traceback is acceptable) or, where the import
            # swallows it, a whole run: the folder holds all of the run's files or none of them
            written = sorted(os.listdir(out)) if os.path.exists(out) else []
            self.assertIn(written, ([], ["ppo.csv", "ppo.json"]), stderr)
            self.assertEqual(starting.returncode == 0, bool(written), stderr)
            _, stderr = piped.communicate(timeout=60)
            self.assertEqual((piped.returncode, stderr), (1, b""))  # quiet, and the status says the lines were lost
            self.assertEqual(os.listdir(tmp), ["out"] if written else [])


if __name__ == "__main__":
    unittest.main()
