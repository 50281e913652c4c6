"""Tests of course.py and plot_course.py: every number a chapter of docs/learn/ quotes, checked
against a hand computation, a slow reference or an invariant, and the committed reports against a
fresh computation.

    python -m unittest -v test_course
"""

from __future__ import annotations

import json
import math
import os
import unittest

import course
import plot_course
from lab_io import json_text
from lab_testing import HERE, committed_differences, describe_differences, single_thread_module

setUpModule, tearDownModule = single_thread_module()


class Chapters(unittest.TestCase):
    def test_every_chapter_has_a_function_and_a_page_name_in_the_course_order(self):
        self.assertEqual(list(course.CHAPTERS), [f"{n:02d}-" + name for n, name in enumerate(
            ["log-probabilities", "policy-gradient", "baselines-and-gae", "reusing-a-batch", "trust-regions",
             "kl-regularized-objective", "preferences", "groups", "sequences", "the-whole-loop"], start=1)])


# ---------------------------------------------------------------------------------------------
# Chapters 1-5
# ---------------------------------------------------------------------------------------------

_REPORTS = {}


def report_of(chapter):
    """course.compute(chapter), computed once per test run."""
    if chapter not in _REPORTS:
        _REPORTS[chapter] = course.compute(chapter)
    return _REPORTS[chapter]


class CommittedReportsOfChapters1To5(unittest.TestCase):
    def test_committed_reports_equal_a_fresh_computation(self):
        for chapter in list(course.CHAPTERS)[:5]:
            with self.subTest(chapter=chapter):
                relative = os.path.join(course.OUTPUT, f"{chapter}.json")
                found = committed_differences(relative, json_text(report_of(chapter)))
                self.assertEqual(found, [], describe_differences(relative, found))

    def test_every_chapter_registers_its_figures(self):
        for chapter, names in [("01-log-probabilities", ["shift"]), ("02-policy-gradient", ["sample-error"]),
                               ("03-baselines-and-gae", ["variance", "gae-weights", "lambda"]),
                               ("04-reusing-a-batch", ["corrections", "second-pass"]),
                               ("05-trust-regions", ["clip", "weights", "sapo-gate"])]:
            self.assertEqual(list(plot_course.FIGURES[chapter]), names)


class Chapter01LogProbabilities(unittest.TestCase):
    def setUp(self):
        self.report = report_of("01-log-probabilities")

    def test_token_logps_equal_a_python_loop_over_the_shifted_rows(self):
        ids, logits, mask = self.report["input_ids"], self.report["logits"], self.report["response_mask"]
        for t in range(len(ids) - 1):
            row = logits[t]
            expected = row[ids[t + 1]] - math.log(sum(math.exp(v) for v in row)) if mask[t + 1] else 0.0
            self.assertAlmostEqual(self.report["token_logps"][t], expected, places=10)
        self.assertEqual(self.report["valid"], [False, True, True, True, False])

    def test_sequence_logp_is_the_sum_and_its_exp_the_product_of_the_token_probabilities(self):
        valid = self.report["valid"]
        logps = [v for v, keep in zip(self.report["token_logps"], valid) if keep]
        self.assertAlmostEqual(self.report["sequence_logp"], sum(logps), places=10)
        product = math.prod(p for p, keep in zip(self.report["token_probabilities"], valid) if keep)
        self.assertAlmostEqual(self.report["sequence_probability"], product, places=10)

    def test_every_softmax_row_sums_to_one(self):
        for total in self.report["row_sums"]:
            self.assertAlmostEqual(total, 1.0, places=10)

    def test_completion_mask_keeps_the_first_eos_and_the_id_test_drops_it(self):
        self.assertEqual(self.report["completion_mask"], [1, 1, 1, 0])
        self.assertEqual(self.report["mask_by_id"], [1, 1, 0, 0])

    def test_a_product_of_200_probabilities_underflows_and_the_sum_of_logs_does_not(self):
        underflow = self.report["underflow"]
        self.assertEqual(underflow["product_of_probabilities"], 0.0)
        self.assertAlmostEqual(underflow["sum_of_logps"], 200 * math.log(0.01), places=9)

    def test_the_token_report_quoted_scores_every_kept_token_at_minus_ln5(self):
        with open(os.path.join(HERE, "results-tokens.json"), encoding="utf-8") as handle:
            alignment = json.load(handle)["alignment"]
        for length, total in zip(alignment["lengths"], alignment["sequence_logps"]):
            self.assertAlmostEqual(total, -length * math.log(5.0), places=10)


class Chapter02PolicyGradient(unittest.TestCase):
    def setUp(self):
        self.report = report_of("02-policy-gradient")
        self.rewards = self.report["rewards"]

    def test_exact_gradient_is_a_quarter_of_pi_times_reward_minus_the_context_mean(self):
        for x, row in enumerate(self.rewards):
            mean = sum(row) / 3
            for b, reward in enumerate(row):
                self.assertAlmostEqual(self.report["exact_gradient"][x][b], 0.25 * (reward - mean) / 3, places=10)
        self.assertLess(self.report["score_vs_autograd_max_abs"], 1e-15)

    def test_per_sample_variance_equals_the_hand_formula_at_the_uniform_policy(self):
        # |R grad log pi|^2 = R^2 ((2/3)^2 + 2 (1/3)^2) = R^2 * 2/3, averaged over the 12 equally likely pairs
        second = sum(2 / 3 * r * r for row in self.rewards for r in row) / 12
        norm2 = self.report["exact_gradient_norm"] ** 2
        self.assertAlmostEqual(self.report["per_sample_variance"], second - norm2, places=10)
        for size, rms in zip(self.report["sample_sizes"], self.report["relative_error_rms_exact"]):
            self.assertAlmostEqual(rms, math.sqrt(self.report["per_sample_variance"] / size)
                                   / self.report["exact_gradient_norm"], places=10)

    def test_sampled_errors_follow_the_exact_rms_and_fall_by_about_sqrt_4096(self):
        for mean, rms in zip(self.report["relative_error_mean"], self.report["relative_error_rms_exact"]):
            self.assertGreater(mean / rms, 0.5)
            self.assertLess(mean / rms, 1.5)
        self.assertGreater(self.report["error_ratio_first_to_last"], 32)
        self.assertLess(self.report["error_ratio_first_to_last"], 128)

    def test_expected_reward_at_the_start_is_the_committed_bandit_runs_first_row(self):
        with open(os.path.join(HERE, "results", "ppo.json"), encoding="utf-8") as handle:
            initial = json.load(handle)["initial"]["expected_reward"]
        self.assertAlmostEqual(self.report["expected_reward"], initial, places=10)
        self.assertAlmostEqual(initial, sum(map(sum, self.rewards)) / 12, places=10)


class Chapter03BaselinesAndGae(unittest.TestCase):
    def setUp(self):
        self.report = report_of("03-baselines-and-gae")

    def test_the_baseline_term_has_zero_mean_and_leaves_the_mean_gradient_unchanged(self):
        self.assertLess(self.report["baseline_term_max_abs"], 1e-15)
        self.assertLess(self.report["mean_gradient_max_abs_difference"], 1e-15)

    def test_variances_equal_the_hand_formula(self):
        rewards = self.report["rewards"]
        means = [sum(row) / 3 for row in rewards]
        norm2 = sum(((r - m) / 12) ** 2 for row, m in zip(rewards, means) for r in row)  # |grad J|^2

        def variance(table):
            return sum(2 / 3 * v * v for row in table for v in row) / 12 - norm2

        variances = self.report["variance"]
        self.assertAlmostEqual(variances["no_baseline"], variance(rewards), places=10)
        centred = [[r - m for r in row] for row, m in zip(rewards, means)]
        self.assertAlmostEqual(variances["baseline"], variance(centred), places=10)
        self.assertAlmostEqual(variances["shift_5_no_baseline"], variance([[r + 5 for r in row] for row in rewards]),
                               places=10)
        self.assertAlmostEqual(variances["shift_5_baseline"], variances["baseline"], places=10)

    def test_variance_is_quadratic_in_the_shift_without_a_baseline_and_flat_with_one(self):
        by_shift = self.report["variance_by_shift"]
        values = by_shift["no_baseline"]
        second = [values[i + 1] - 2 * values[i] + values[i - 1] for i in range(1, len(values) - 1)]
        for difference in second:
            self.assertAlmostEqual(difference, 2 * 2 / 3, places=9)  # d^2/dc^2 of (2/3) E[(R + c)^2]
        for value in by_shift["baseline"]:
            self.assertAlmostEqual(value, self.report["variance"]["baseline"], places=10)

    def test_gae_weights_are_powers_of_gamma_lambda(self):
        gamma = self.report["gae_gamma"]
        for lam in self.report["gae_lambdas"]:
            for k, weight in enumerate(self.report["gae_weights"][str(lam)]):
                self.assertAlmostEqual(weight, (gamma * lam) ** k, places=10)

    def test_lambda_return_bias_and_variance_equal_the_closed_forms(self):
        data = self.report["bias_variance"]
        for index, lam in enumerate(data["lambdas"]):
            # rewards 0 or 2 (mean 1, variance 1): with a zero critic G = r0 + lam r1 + lam^2 r2
            self.assertAlmostEqual(data["zero"]["bias"][index], (1 + lam + lam**2) - 3, places=10)
            self.assertAlmostEqual(data["right"]["bias"][index], 0.0, places=10)
            for critic in ("zero", "right"):
                self.assertAlmostEqual(data[critic]["variance"][index], 1 + lam**2 + lam**4, places=10)

    def test_a_scored_cut_is_terminal_and_the_time_limit_bootstrap_adds_the_value_after_the_cap(self):
        cut = self.report["cut"]
        credit, after = cut["rewards"][-1], cut["value_after_cap"]
        self.assertEqual(cut["terminal"]["returns"], [credit] * 4)
        for value in cut["time_limit"]["returns"]:
            self.assertAlmostEqual(value, credit + after, places=10)
        self.assertAlmostEqual(cut["terminal"]["advantages"][-1], credit - cut["values"][-1], places=10)


class Chapter04ReusingABatch(unittest.TestCase):
    def setUp(self):
        self.report = report_of("04-reusing-a-batch")

    def test_first_pass_every_loss_has_the_reinforce_gradient(self):
        for name, difference in self.report["first_pass_max_abs_difference"].items():
            with self.subTest(loss=name):
                self.assertLess(difference, 1e-15)
        self.assertGreater(self.report["first_pass_gradient_norm"], 0.01)

    def test_second_pass_the_losses_differ_and_ppo_clip_is_grpo(self):
        relative = self.report["second_pass_relative_difference"]
        self.assertAlmostEqual(relative["ppo_clip"], relative["grpo"], places=10)
        for name in ("ppo_clip", "cispo", "sapo"):
            self.assertGreater(relative[name], 0.05)
        self.assertNotAlmostEqual(relative["cispo"], relative["ppo_clip"], places=3)

    def test_second_pass_clip_fraction_equals_a_count_over_the_kept_tokens(self):
        ratios, mask = self.report["second_pass_ratios"], self.report["batch"]["completion_mask"]
        advantages = self.report["batch"]["advantages"]
        clipped = kept = 0
        for row, keep_row, advantage in zip(ratios, mask, advantages):
            for ratio, keep in zip(row, keep_row):
                if keep:
                    kept += 1
                    clipped += (advantage > 0 and ratio > 1.2) or (advantage < 0 and ratio < 0.8)
        self.assertGreater(clipped, 0)
        self.assertAlmostEqual(self.report["second_pass_clip_fraction"], clipped / kept, places=10)

    def test_gspo_clips_every_sequence_of_the_second_pass_in_its_tiny_range(self):
        self.assertEqual(self.report["second_pass_gradient_norm"]["gspo"], 0.0)
        for ratio, advantage in zip(self.report["second_pass_sequence_ratios"], self.report["batch"]["advantages"]):
            self.assertTrue(ratio > 1 + 4e-4 if advantage > 0 else ratio < 1 - 3e-4)

    def test_importance_weights_recover_the_old_policy_mean(self):
        data = self.report["importance_sampling"]
        target = sum(p * f for p, f in zip(data["old"], data["rewards"]))
        self.assertAlmostEqual(data["target"], target, places=10)
        self.assertAlmostEqual(data["weighted"], target, places=10)
        self.assertAlmostEqual(data["uncorrected"], sum(q * f for q, f in zip(data["sampler"], data["rewards"])),
                               places=10)

    def test_cap_bias_and_variance_equal_a_loop_and_vanish_once_the_cap_reaches_the_largest_weight(self):
        data, corrections = self.report["importance_sampling"], self.report["corrections"]
        largest = max(p / q for p, q in zip(data["old"], data["sampler"]))
        for index, cap in enumerate(corrections["caps"]):
            for name in ("tis", "mask"):
                terms = []
                for p, q, f in zip(data["old"], data["sampler"], data["rewards"]):
                    weight = min(p / q, cap) if name == "tis" else (p / q if p / q <= cap else 0.0)
                    terms.append((q, weight * f))
                mean = sum(q * v for q, v in terms)
                self.assertAlmostEqual(corrections[name]["bias"][index], mean - data["target"], places=10)
                self.assertAlmostEqual(corrections[name]["variance"][index],
                                       sum(q * v * v for q, v in terms) - mean**2, places=10)
                if cap >= largest:
                    self.assertAlmostEqual(corrections[name]["bias"][index], 0.0, places=10)
        variances = corrections["tis"]["variance"]
        self.assertEqual(variances, sorted(variances))


class Chapter05TrustRegions(unittest.TestCase):
    def setUp(self):
        self.report = report_of("05-trust-regions")
        self.ratios = self.report["ratios"]

    def _off_edges(self, *edges):
        return [(i, r) for i, r in enumerate(self.ratios) if all(abs(r - edge) > 1e-9 for edge in edges)]

    def test_clipped_objective_is_the_min_of_the_two_branches(self):
        for sign, advantage in (("positive", 1.0), ("negative", -1.0)):
            for index, ratio in enumerate(self.ratios):
                expected = min(ratio * advantage, min(max(ratio, 0.8), 1.2) * advantage)
                self.assertAlmostEqual(self.report["objective"][sign]["ppo_clip"][index], expected, places=10)

    def test_gradient_weights_equal_the_case_analysis(self):
        weight = self.report["weight"]
        cases = {
            ("positive", "ppo_clip"): (lambda r: r if r < 1.2 else 0.0, (1.2,)),
            ("negative", "ppo_clip"): (lambda r: r if r > 0.8 else 0.0, (0.8,)),
            ("positive", "clip_higher"): (lambda r: r if r < 1.28 else 0.0, (1.28,)),
            ("negative", "dual_clip"): (lambda r: r if 0.8 < r < 3.0 else 0.0, (0.8, 3.0)),
            ("positive", "cispo"): (lambda r: min(r, 5.0), (5.0,)),
            ("negative", "cispo"): (lambda r: min(r, 5.0), (5.0,)),
        }
        for (sign, name), (expected, edges) in cases.items():
            for index, ratio in self._off_edges(*edges):
                self.assertAlmostEqual(weight[sign][name][index], expected(ratio), places=10, msg=(sign, name, ratio))

    def test_sapo_weight_is_four_sigmoid_prime_times_the_ratio_and_the_gate_its_integral(self):
        for sign, tau, advantage in (("positive", 1.0, 1.0), ("negative", 1.05, -1.0)):
            for index, ratio in enumerate(self.ratios):
                s = 1 / (1 + math.exp(-tau * (ratio - 1)))
                self.assertAlmostEqual(self.report["weight"][sign]["sapo"][index], 4 * s * (1 - s) * ratio, places=10)
                self.assertAlmostEqual(self.report["objective"][sign]["sapo"][index], 4 / tau * s * advantage,
                                       places=10)

    def test_every_weight_is_one_at_ratio_one(self):
        index = self.ratios.index(1.0)
        for sign in ("positive", "negative"):
            for name, values in self.report["weight"][sign].items():
                self.assertAlmostEqual(values[index], 1.0, places=10, msg=(sign, name))

    def test_gspo_sequence_ratio_is_the_geometric_mean_of_the_kept_token_ratios(self):
        gspo = self.report["gspo"]
        kept = [math.exp(v) for v, m in zip(gspo["log_ratios"], gspo["mask"]) if m]
        self.assertAlmostEqual(gspo["sequence_ratio"], math.prod(kept) ** (1 / len(kept)), places=10)
        self.assertAlmostEqual(gspo["arithmetic_mean_ratio"], sum(kept) / len(kept), places=10)
        self.assertGreater(gspo["arithmetic_mean_ratio"], gspo["sequence_ratio"])  # AM >= GM
        self.assertAlmostEqual(gspo["sequence_ratio"] / gspo["sequence_ratio_without_largest"],
                               (3.0 / gspo["sequence_ratio_without_largest"]) ** (1 / 5), places=10)


# ---------------------------------------------------------------------------------------------
# Chapters 6-10
# ---------------------------------------------------------------------------------------------


if __name__ == "__main__":
    unittest.main()
