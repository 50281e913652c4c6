"""Tests of experiments.py at reduced size: exact identities exactly, learning effects in their documented
direction with loose thresholds, and the files' schema.

    python -m unittest -v test_experiments
"""

import csv
import io
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import unittest

import torch

import experiments
import online_tokens
from lab_testing import HERE, run_main, single_thread_module

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


class ExactIdentities(unittest.TestCase):
    def test_kl_estimator_values_and_expected_gradients(self):
        for distance in ("near", "far"):
            with self.subTest(distance=distance):
                metrics = experiments.run_kl_estimators(0, distance)["metrics"]
                self.assertLess(abs(metrics["k1_relative_bias"]), 1e-12)
                self.assertLess(abs(metrics["k3_relative_bias"]), 1e-12)
                self.assertGreater(abs(metrics["k2_relative_bias"]), 1e-3)
                self.assertLess(metrics["k1_grad_norm_ratio"], 1e-12)  # E[grad k1] = 0
                self.assertLess(metrics["k2_grad_error_forward_kl"], 1e-12)  # = grad KL(pi || ref)
                self.assertLess(metrics["k3_grad_error_reverse_kl"], 1e-12)  # = grad KL(ref || pi)
                self.assertGreater(metrics["k3_grad_error_forward_kl"], 1e-3)  # and not the other direction

    def test_microbatch_gradients(self):
        metrics = experiments.run_microbatch(0)["metrics"]
        self.assertGreater(metrics["length_spread"], 0)  # the batch's answers differ in length
        for micro in (1, 2, 4):
            with self.subTest(micro_batches=micro):
                self.assertLess(metrics[f"sequence_local_m{micro}"], 1e-12)
                self.assertLess(metrics[f"constant_local_m{micro}"], 1e-12)
                self.assertLess(metrics[f"token_global_m{micro}"], 1e-12)  # the fix: the global token count
        self.assertLess(metrics["token_local_m1"], 1e-12)
        self.assertGreater(metrics["token_local_m2"], 1e-3)  # verl issue 5625: local token counts
        self.assertGreater(metrics["token_local_m4"], 1e-3)

    def test_std_scaling_weight_table(self):
        columns, rows = experiments.std_scaling_table()
        one = rows[1]  # 1 success of 8: (1 - 1/8) / sqrt(1/8 * 7/8) = sqrt(7)
        self.assertAlmostEqual(one["group_success_advantage"], math.sqrt(7.0), places=6)
        self.assertAlmostEqual(one["none_success_advantage"], 0.875, places=15)
        # with the std the prompt's total weight is flat-ish (8 at 4/8, 5.29 at 1/8); without it, it
        # vanishes toward the edges (4 at 4/8, 1.75 at 1/8): the std boosts nearly solved/unsolved prompts
        self.assertAlmostEqual(rows[4]["group_total_weight"], 8.0, places=6)
        self.assertAlmostEqual(rows[1]["group_total_weight"] / rows[4]["group_total_weight"], 2 * math.sqrt(7) / 8,
                               places=6)
        self.assertAlmostEqual(rows[1]["none_total_weight"] / rows[4]["none_total_weight"], 1.75 / 4, places=15)
        self.assertEqual((rows[0]["group_total_weight"], rows[8]["none_total_weight"]), (0.0, 0.0))

    def test_exact_reward_distribution_of_the_uniform_policy(self):
        state = online_tokens.setup()
        distribution = experiments.reward_distribution(state)
        torch.testing.assert_close(distribution.sum(dim=1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-14)
        # prompt 0, answer "0": "0 EOS" has 1/9; "0" then four more digits (no EOS, cut) has (1/3)(2/3)**4
        self.assertAlmostEqual(distribution[0, 2].item(), 1 / 9, places=15)
        self.assertAlmostEqual(distribution[0, 1].item(), (1 / 3) * (2 / 3) ** 4, places=15)

    def test_a_reward_shift_leaves_group_advantages_and_moves_ppos(self):
        grpo = experiments.run_reward_shift(0, "grpo", 5.0, steps=2)["metrics"]
        ppo = experiments.run_reward_shift(0, "ppo", 5.0, steps=2)["metrics"]
        self.assertLess(grpo["advantage_change"], 1e-12)
        self.assertAlmostEqual(ppo["advantage_change"], 5.0, places=12)


class MechanismsAtReducedSize(unittest.TestCase):
    def test_zero_variance_is_predicted_by_the_exact_reward_distribution(self):
        result = experiments.run_zero_variance(0, group_size=4, prompts=16, steps=12)
        curve = result["curve"]
        measured = math.fsum(point["zero_group_fraction"] for point in curve) / len(curve)
        predicted = math.fsum(point["predicted_zero_group_fraction"] for point in curve) / len(curve)
        self.assertLess(abs(measured - predicted), 0.1)
        dynamic = experiments.run_zero_variance(0, group_size=8, prompts=8, steps=12, dynamic_sampling=True)
        self.assertLess(dynamic["metrics"]["zero_group_fraction"], 0.3)  # the tied groups were resampled away
        self.assertGreater(dynamic["metrics"]["responses_sampled"], 12 * 64)  # and paid for

    def test_more_updates_per_batch_clip_more(self):
        one = experiments.run_online(0, algorithm="gspo", updates_per_batch=1, steps=15)["metrics"]
        eight = experiments.run_online(0, algorithm="gspo", updates_per_batch=8, steps=15)["metrics"]
        self.assertEqual(one["clip_fraction"], 0.0)  # one step per batch: every ratio is exactly 1
        self.assertGreater(eight["clip_fraction"], 0.1)

    def test_every_experiment_writes_its_schema_at_reduced_size(self):
        table = {name: experiments.reduced(experiment, 3) for name, experiment in experiments.experiments().items()}
        seen = {}

        def finished(name, experiment, jobs, results):
            seen[name] = experiments.experiment_files(experiment, 1, jobs, results, name)

        experiments.run_experiments(list(table), 1, 1, finished, report=lambda line: None, table=table)
        self.assertEqual(sorted(seen), sorted(table))
        for name, files in seen.items():
            with self.subTest(experiment=name):
                summary = rows_of(files[os.path.join(name, "summary.csv")])
                runs = rows_of(files[os.path.join(name, "runs.csv")])
                self.assertEqual(len(summary), len(table[name].configurations))
                self.assertEqual(len(runs), len(table[name].configurations))  # one seed
                for metric in table[name].metrics:
                    for stat in ("mean", "std", "min", "max"):
                        self.assertIn(f"{metric}_{stat}", summary[0])
                settings = json.loads(files[os.path.join(name, "settings.json")])
                self.assertEqual(settings["experiment"], name)
                self.assertTrue(settings["claim"] and settings["source"])
                self.assertIn(f"python experiments.py {name}", settings["command"])
                markdown = files[os.path.join(name, "summary.md")]
                self.assertEqual(markdown.count("\n| "), len(summary) + 1 + sum(
                    len(rows) + 1 for _, rows in table[name].tables.values()))


# A child process runs run_experiments as the program would (under run_cli) over runners that stall or
# die; the test stops it from outside. Each prints "worker <pid>" when its run starts.
WORKERS_SCENARIO = """
import os, signal, sys, time
import experiments, lab_io

def stall(seed):
    os.write(1, f"worker {os.getpid()}\\n".encode())  # one write: workers share the pipe
    time.sleep(600)

def killed(seed):
    os.write(1, f"worker {os.getpid()}\\n".encode())  # one write: workers share the pipe
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does

experiments.RUNNERS.update(stall=stall, killed=killed)
runners = sys.argv[1].split(",")
table = {"t": experiments.Experiment("t", "", "", "", [({"n": i}, runner, {}) for i, runner in enumerate(runners)],
                                     ["m"])}
sys.exit(lab_io.run_cli(lambda: experiments.run_experiments(["t"], 1, len(runners), lambda *args: None,
                                                            report=print, table=table)))
"""


class Workers(unittest.TestCase):
    """Every early exit of a run over worker processes ends it at once, with one line, and no worker left."""

    def start(self, runners):
        child = subprocess.Popen([sys.executable, "-B", "-c", WORKERS_SCENARIO, runners], cwd=HERE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.addCleanup(child.stderr.close)
        self.addCleanup(child.stdout.close)
        self.addCleanup(lambda: child.poll() is None and os.killpg(child.pid, signal.SIGKILL))
        return child

    def workers_started(self, child, count):
        pids = []
        while len(pids) < count:
            line = child.stdout.readline()
            if not line:
                child.wait(timeout=60)
                self.fail(f"the run ended before its workers started: {child.stderr.read()}")
            pids.append(int(line.split()[1]))
        for pid in pids:  # whatever happens, none outlives the test
            self.addCleanup(lambda pid=pid: alive(pid) and os.kill(pid, signal.SIGKILL))
        return pids

    def ended(self, child, pids):
        try:
            child.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("the run did not end: its workers kept it waiting")
        stderr = child.stderr.read()
        self.assertNotIn("Traceback", stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertEqual([pid for pid in pids if alive(pid)], [])
        return child.returncode, stderr

    def test_sigterm_a_ctrl_c_and_a_killed_worker_each_stop_the_run_and_every_worker(self):
        terminated, interrupted, killed = self.start("stall,stall"), self.start("stall,stall"), self.start("stall,killed")
        terminated_pids = self.workers_started(terminated, 2)
        interrupted_pids = self.workers_started(interrupted, 2)
        killed_pids = self.workers_started(killed, 2)
        terminated.send_signal(signal.SIGTERM)  # to the main process only, as `kill -TERM PID` does
        os.killpg(interrupted.pid, signal.SIGINT)  # to the whole process group, as a terminal's Ctrl-C does
        code, stderr = self.ended(terminated, terminated_pids)
        self.assertEqual(code, 143)
        self.assertIn("interrupted (SIGTERM)", stderr)
        code, stderr = self.ended(interrupted, interrupted_pids)
        self.assertEqual(code, 130)
        self.assertIn("interrupted (SIGINT)", stderr)
        code, stderr = self.ended(killed, killed_pids)
        self.assertEqual(code, 1)
        self.assertRegex(stderr, r"worker process (\d+) ended by SIGKILL before its run finished")
        self.assertIn(int(stderr.split("worker process ")[1].split()[0]), killed_pids)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class CommandLine(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_list_names_every_experiment(self):
        code, stdout, _ = run_main(experiments.main, ["--list"])
        self.assertEqual(code, 0)
        names = [line.split()[0] for line in stdout.splitlines()]
        self.assertEqual(names, list(experiments.experiments()))
        for required in ("kl-estimators", "reduction-length-bias", "std-scaling", "zero-variance", "clip-higher",
                         "updates-per-batch", "sampler-mismatch", "microbatch", "grpo2-vs-dpo", "four-algorithms",
                         "dpo-label-flips", "group-size", "chain-lambda", "reward-shift", "sparse-reward"):
            self.assertIn(required, names)

    def test_one_experiment_writes_its_files_and_the_same_bytes_whatever_the_jobs(self):
        outputs = []
        for jobs in ("1", "2"):
            out = os.path.join(self.tmp.name, f"jobs{jobs}")
            code, stdout, stderr = run_main(experiments.main, ["kl-estimators", "--seeds", "2", "--jobs", jobs,
                                                               "--output", out])
            self.assertEqual((code, stderr), (0, ""))
            self.assertIn("ETA", stdout)
            folder = os.path.join(out, "kl-estimators")
            self.assertEqual(sorted(os.listdir(folder)), ["figure.svg", "runs.csv", "settings.json", "summary.csv",
                                                          "summary.md"])
            snapshot = {}
            for name in os.listdir(folder):
                with open(os.path.join(folder, name), "rb") as handle:
                    snapshot[name] = handle.read()
            outputs.append(snapshot)
        self.assertEqual(outputs[0], outputs[1])


if __name__ == "__main__":
    unittest.main()
