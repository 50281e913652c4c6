"""Tests of lab_io.py: faults and hostile input end with one line and lose nothing.

    python -m unittest -v test_lab_io

Each class guards one cause: outputs that must not be replaced, files written all or nothing (a full
disk, a failed rename, Ctrl-C or SIGTERM in the middle), stale temporaries of a killed run, run_cli's
one line for every failure, and a Ctrl-C while torch is still loading (the one fresh process here).
"""

import builtins
import errno
import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import lab_io
import online_tokens
import plot_results
import ppo_chain
import rl_lab
import token_objectives
from lab_testing import HERE, run_cli_in_process, run_main


def failing_open(fail_on_call, exception):
    """A replacement for open() that raises `exception` when the n-th temporary file is written."""
    calls = {"count": 0}
    real_open = builtins.open

    def fake_open(path, mode="r", *args, **kwargs):
        if "x" in mode and os.path.basename(str(path)).startswith(lab_io.TEMPORARY_PREFIX):
            calls["count"] += 1
            if calls["count"] == fail_on_call:
                handle = real_open(path, mode, *args, **kwargs)  # the temporary exists, then the write fails
                handle.close()
                raise exception
        return real_open(path, mode, *args, **kwargs)

    return fake_open


def dead_pid():
    """The pid of a process that has ended (it is not reused within the test's few milliseconds)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


class OutputsThatMustNotBeReplaced(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
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
        self.tmp = tempfile.TemporaryDirectory()
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

    def test_a_failed_rename_removes_the_files_already_renamed_and_keeps_the_old_ones_out(self):
        files = {self.path("a.csv"): "new a\n", self.path("b.csv"): "new b\n"}
        real_replace = os.replace

        def replace(source, target):
            if target.endswith("b.csv"):
                raise PermissionError(errno.EPERM, "Operation not permitted", target)
            return real_replace(source, target)

        with mock.patch.object(os, "replace", replace), self.assertRaises(lab_io.WriteFailed) as caught:
            lab_io.write_files(files)
        self.assertIn("b.csv", str(caught.exception))
        self.assertEqual(os.listdir(self.tmp.name), [])  # a.csv was renamed, then removed: neither is left

    def test_ctrl_c_during_the_writes_keeps_the_old_folder_whole(self):
        out = self.path("run")
        self.assertEqual(run_main(rl_lab.main, ["--steps", "2", "--output", out])[0], 0)
        before = {}
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), "rb") as handle:
                before[name] = handle.read()
        with mock.patch("builtins.open", failing_open(5, KeyboardInterrupt())):
            code, stdout, stderr = run_cli_in_process(rl_lab.main, ["--steps", "3", "--output", out])
        self.assertEqual(code, 130)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("interrupted", stderr)
        after = {}
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), "rb") as handle:
                after[name] = handle.read()
        self.assertEqual(after, before)  # every file is the old run's: no mix of two runs

    def test_sigterm_cleans_up_like_ctrl_c(self):
        previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
        self.addCleanup(lambda: [signal.signal(signum, handler) for signum, handler in previous.items()])
        real_open = builtins.open
        opened = []

        def terminating_open(path, mode="r", *args, **kwargs):
            handle = real_open(path, mode, *args, **kwargs)
            if "x" in mode:
                opened.append(path)
                if len(opened) == 3:  # the pre-flight probe, ppo-chain.csv's temporary, then the json's
                    os.kill(os.getpid(), signal.SIGTERM)
            return handle

        out = self.path("chain")
        with mock.patch("builtins.open", terminating_open):
            code, _, stderr = run_cli_in_process(ppo_chain.main, ["--steps", "1", "--output", out])
        self.assertEqual(code, 143)
        self.assertIn("SIGTERM", stderr)
        self.assertEqual(len(opened), 3)
        self.assertEqual(os.listdir(self.tmp.name), [])  # both temporaries and the new folder are gone

    def test_stale_temporaries_of_a_killed_run_are_removed_by_the_next_write(self):
        stale = f"{lab_io.TEMPORARY_PREFIX}{dead_pid()}-0123456789ab"
        live = f"{lab_io.TEMPORARY_PREFIX}{os.getppid()}-0123456789ab"  # a running process's: left alone
        for name in (stale, live):
            with open(self.path(name), "w", encoding="utf-8") as handle:
                handle.write("cut mid-li")
        lab_io.write_text_atomic(self.path("metrics.csv"), "x\n")
        self.assertEqual(sorted(os.listdir(self.tmp.name)), sorted(["metrics.csv", live]))

    def test_written_files_follow_the_umask(self):
        previous = os.umask(0o022)
        try:
            path = self.path("metrics.csv")
            lab_io.write_text_atomic(path, "x\n")
        finally:
            os.umask(previous)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o644)

    def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(self):
        path = self.path("metrics.csv")
        lab_io.write_text_atomic(path, "old\n")
        with self.assertRaises(TypeError):
            lab_io.write_text_atomic(path, 12345)  # fails inside the write, after the temporary exists
        with open(path, encoding="utf-8") as handle:
            self.assertEqual(handle.read(), "old\n")
        self.assertEqual(os.listdir(self.tmp.name), ["metrics.csv"])


class OneLineForEveryFailure(unittest.TestCase):
    def test_a_full_stdout_is_one_line_and_status_1(self):
        class FullStream(io.RawIOBase):
            def writable(self):
                return True

            def write(self, data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

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
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "new", "chain.svg")
            with mock.patch.object(plot_results, "figure_bytes", side_effect=KeyboardInterrupt):
                code, _, stderr = run_cli_in_process(
                    plot_results.main, ["--input", os.path.join(HERE, "results-chain"), "--output", out])
            self.assertEqual(code, 130)
            self.assertEqual(len(stderr.strip().splitlines()), 1)
            self.assertEqual(os.listdir(tmp), [])


class FreshProcess(unittest.TestCase):
    """What needs a new Python process: signals while torch is still loading, and a closed pipe."""

    def test_ctrl_c_while_starting_and_a_closed_pipe_end_with_one_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            starting = subprocess.Popen(
                [sys.executable, "-B", os.path.join(HERE, "rl_lab.py"), "--output", out],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp,
            )
            # the pipe test runs meanwhile: the first byte of the atoms table, then the pipe closes
            piped = subprocess.Popen(
                [sys.executable, "-B", os.path.join(HERE, "rl_lab.py"), "--algorithm", "atoms"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp,
            )
            time.sleep(0.3)  # importing torch takes about a second
            starting.send_signal(signal.SIGINT)
            _, stderr = starting.communicate(timeout=60)
            self.assertEqual(starting.returncode, 130)
            self.assertEqual(len(stderr.decode().strip().splitlines()), 1, stderr)
            self.assertIn("interrupted", stderr.decode())
            self.assertNotIn("Traceback", stderr.decode())
            self.assertFalse(os.path.exists(out))
            self.assertTrue(piped.stdout.read(1))
            piped.stdout.close()  # as `| head -c 1` does
            stderr = piped.stderr.read().decode()
            piped.stderr.close()
            self.assertIn(piped.wait(timeout=60), (0, 1))
            self.assertNotIn("Traceback", stderr)
            self.assertEqual(os.listdir(tmp), [])  # atoms mode writes nothing


if __name__ == "__main__":
    unittest.main()
