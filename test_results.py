"""The committed reference results are what a fresh default run writes, to a relative tolerance.

    python -m unittest -v test_results

Every float is compared with lab_testing.COMMITTED_RTOL (1e-12 relative), never byte for byte: another
CPU may round a reduction differently in the last digits. Byte identity of two runs on one machine is
checked in each driver's own tests.
"""

import unittest

import online_tokens
import ppo_chain
import rl_lab
import token_objectives
from lab_io import csv_text, json_text
from lab_testing import committed_differences, describe_differences, single_thread_module

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train


class CommittedResults(unittest.TestCase):
    def assert_matches(self, relative, fresh_text):
        found = committed_differences(relative, fresh_text)
        self.assertEqual(found, [], describe_differences(relative, found))

    def test_bandit_results_match_a_fresh_run(self):
        for algorithm in rl_lab.ALGORITHMS:
            with self.subTest(algorithm=algorithm):
                rows, settings = rl_lab.train(algorithm)
                columns = rl_lab.DPO_COLUMNS if algorithm == "dpo" else rl_lab.COLUMNS
                self.assert_matches(f"results/{algorithm}.csv", csv_text(rows, columns))
                self.assert_matches(f"results/{algorithm}.json",
                                    json_text({"settings": settings, "initial": rows[0], "final": rows[-1]}))

    def test_chain_and_token_results_match_a_fresh_run(self):
        rows, report = ppo_chain.train()
        self.assert_matches("results-chain/ppo-chain.csv", csv_text(rows, ppo_chain.COLUMNS))
        self.assert_matches("results-chain/ppo-chain.json", json_text(report))
        self.assert_matches("results-tokens.json", json_text(token_objectives.run()))

    def test_online_results_match_a_fresh_run(self):
        for loss in ("grpo", "cispo"):
            with self.subTest(loss=loss):
                rows, report = online_tokens.train(loss=loss)
                self.assert_matches(f"results-online-{loss}-sequence/online.csv", csv_text(rows, online_tokens.COLUMNS))
                self.assert_matches(f"results-online-{loss}-sequence/online.json", json_text(report))


if __name__ == "__main__":
    unittest.main()
