"""The committed reference results are what a fresh default run writes, to a relative tolerance.

    python -m unittest -v test_results

Every float is compared with lab_testing.COMMITTED_RTOL (1e-12 relative), never byte for byte: another
CPU may round a reduction differently in the last digits. Byte identity of two runs on one machine is
checked in each driver's own tests.
"""

import csv
import json
import os
import unittest

import online_tokens
import ppo_chain
import rl_lab
import token_objectives
from atlas import runners
from lab.io import csv_text, json_text
from lab.testing import (HERE, committed_differences, describe_differences, prefetch, shared_calls, single_thread_module,
                         value_differences)

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train
ATLAS = "results-experiments"


def atlas_first_runs():
    """{experiment: (runner, seed, options)} of each atlas experiment's first run (first configuration, first
    seed), from the committed settings.json, for every experiment whose runs are not the transformer's."""
    first = {}
    for name in sorted(os.listdir(os.path.join(HERE, ATLAS))):
        settings = atlas_settings(name)
        configuration = settings["configurations"][0]
        if configuration["runner"] not in runners.TRANSFORMER_RUNNERS:
            first[name] = (configuration["runner"], settings["seeds"][0], configuration["options"])
    return first


def fresh_jobs():
    """{name: shared_calls job} of every fresh run the committed results are compared with."""
    jobs = {("bandit", algorithm): ("rl_lab", "train", (algorithm,), {}) for algorithm in rl_lab.ALGORITHMS}
    jobs[("chain",)] = ("ppo_chain", "train", (), {})
    jobs[("tokens",)] = ("token_objectives", "run", (), {})
    for algorithm in ("grpo", "cispo") + tuple(online_tokens.FOUR_ALGORITHMS):
        jobs[("online", algorithm)] = ("online_tokens", "train", (), {"algorithm": algorithm})
    for name, (runner, seed, options) in atlas_first_runs().items():
        jobs[("atlas", name)] = ("atlas.runners", runner, (seed,), options)
    return jobs


class CommittedResults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):  # every fresh run (each deterministic), collected from the prefetch (end of file)
        cls.first_runs = atlas_first_runs()
        jobs = fresh_jobs()
        cls.fresh = dict(zip(jobs, shared_calls(list(jobs.values()))))

    def assert_matches(self, relative, fresh_text):
        found = committed_differences(relative, fresh_text)
        self.assertEqual(found, [], describe_differences(relative, found))

    def test_bandit_results_match_a_fresh_run(self):
        for algorithm in rl_lab.ALGORITHMS:
            with self.subTest(algorithm=algorithm):
                rows, settings = self.fresh[("bandit", algorithm)]
                columns = rl_lab.DPO_COLUMNS if algorithm == "dpo" else rl_lab.COLUMNS
                self.assert_matches(f"results/{algorithm}.csv", csv_text(rows, columns))
                self.assert_matches(f"results/{algorithm}.json",
                                    json_text({"settings": settings, "initial": rows[0], "final": rows[-1]}))

    def test_chain_and_token_results_match_a_fresh_run(self):
        rows, report = self.fresh[("chain",)]
        self.assert_matches("results-chain/ppo-chain.csv", csv_text(rows, ppo_chain.COLUMNS))
        self.assert_matches("results-chain/ppo-chain.json", json_text(report))
        self.assert_matches("results-tokens.json", json_text(self.fresh[("tokens",)]))

    def test_online_results_match_a_fresh_run(self):
        for algorithm in ("grpo", "cispo"):
            with self.subTest(algorithm=algorithm):
                rows, report = self.fresh[("online", algorithm)]
                folder = f"results-online-{algorithm}-sequence"
                self.assert_matches(f"{folder}/online.csv", csv_text(rows, online_tokens.COLUMNS))
                self.assert_matches(f"{folder}/online.json", json_text(report))

    def test_the_four_algorithm_comparison_matches_a_fresh_run(self):
        comparison = []
        for algorithm in online_tokens.FOUR_ALGORITHMS:
            with self.subTest(algorithm=algorithm):
                rows, report = self.fresh[("online", algorithm)]
                self.assert_matches(f"results-online-all/{algorithm}/online.csv", csv_text(rows, online_tokens.COLUMNS))
                self.assert_matches(f"results-online-all/{algorithm}/online.json", json_text(report))
                comparison.append(online_tokens.comparison_row(algorithm, rows))
        self.assert_matches("results-online-all/comparison.csv", csv_text(comparison, online_tokens.COMPARISON_COLUMNS))

    def test_each_atlas_experiment_reproduces_its_first_committed_run(self):
        # the whole atlas takes minutes; its first run of each experiment (first configuration, first seed),
        # rerun from the committed settings.json, checks that the committed tables come from this code
        # (a transformer experiment's run needs the default SFT start, half a minute to train, then a
        # quarter of a minute: those are checked by test_the_transformer_atlas_summaries_are_their_runs)
        self.assertGreaterEqual(len(self.first_runs), 15)
        for name, (runner, seed, options) in self.first_runs.items():
            with self.subTest(experiment=name):
                with open(os.path.join(HERE, ATLAS, name, "runs.csv"), encoding="utf-8", newline="") as handle:
                    committed = next(csv.DictReader(handle))
                self.assertEqual(int(committed["seed"]), seed)
                self.assertIs(runners.RUNNERS[runner], getattr(runners, runner))  # the runner that was run
                metrics = self.fresh[("atlas", name)]["metrics"]
                for metric, value in metrics.items():
                    if value is None:  # a target never reached: an empty cell
                        self.assertEqual(committed[metric], "", f"{ATLAS}/{name}/runs.csv, first row, {metric}")
                        continue
                    # identities such as an estimator's bias are 0 up to ~1e-14 of rounding, whose digits
                    # differ between CPUs: an absolute floor of 1e-12 for them
                    found = value_differences(committed[metric], value, abs_tol=1e-12)
                    self.assertEqual(found, [], f"{ATLAS}/{name}/runs.csv, first row, {metric}: committed "
                                                f"{committed[metric]!r}, fresh {value!r}")

    def test_the_transformer_atlas_summaries_are_their_runs(self):
        # every summary mean is the mean over the committed runs of its configuration, in the committed
        # atlas and in its held-out seed set, for every transformer experiment (whose runs themselves are
        # too slow to rerun here) and, in the held-out set, every other one too
        checked = 0
        for folder in (ATLAS, ATLAS + "-start100"):
            for name in sorted(os.listdir(os.path.join(HERE, folder))):
                settings = atlas_settings(name, folder)
                if folder == ATLAS and settings["configurations"][0]["runner"] not in runners.TRANSFORMER_RUNNERS:
                    continue
                with self.subTest(folder=folder, experiment=name):
                    runs = rows_of(os.path.join(folder, name, "runs.csv"))
                    summary = rows_of(os.path.join(folder, name, "summary.csv"))
                    self.assertEqual(len(runs), len(settings["configurations"]) * len(settings["seeds"]))
                    for row in summary:
                        mine = [run for run in runs if run["configuration"] == row["configuration"]]
                        self.assertEqual(sorted(int(run["seed"]) for run in mine), settings["seeds"])
                        for metric in settings["metrics"]:
                            values = [float(run[metric]) for run in mine if run[metric] != ""]
                            if values:
                                self.assertAlmostEqual(float(row[f"{metric}_mean"]), sum(values) / len(values),
                                                       delta=1e-9 * max(1.0, abs(float(row[f"{metric}_mean"]))))
                    checked += 1
        self.assertGreaterEqual(checked, 7 + 22)


def atlas_settings(name, folder=ATLAS):
    with open(os.path.join(HERE, folder, name, "settings.json"), encoding="utf-8") as handle:
        return json.load(handle)


def rows_of(relative):
    with open(os.path.join(HERE, relative), encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


prefetch(list(fresh_jobs().values()))  # CommittedResults' runs, computed beside the tests that run before it


if __name__ == "__main__":
    unittest.main()
