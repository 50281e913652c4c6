"""Tests of course.py and plot_course.py: every number a chapter of docs/learn/ quotes, checked
against a hand computation, a slow reference or an invariant, and the committed reports against a
fresh computation.

    python -m unittest -v test_course
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import unittest
from unittest import mock

import torch

import countdown
import course
import plot_course
import rl_lab
from lab.io import json_text
from lab.testing import HERE, committed_differences, describe_differences, run_main, single_thread_module

setUpModule, tearDownModule = single_thread_module()


class Chapters(unittest.TestCase):
    def test_every_chapter_has_a_function_and_a_page_name_in_the_course_order(self):
        self.assertEqual(list(course.CHAPTERS), [f"{n:02d}-" + name for n, name in enumerate(
            ["log-probabilities", "policy-gradient", "baselines-and-gae", "reusing-a-batch", "trust-regions",
             "kl-regularized-objective", "preferences", "groups", "sequences", "the-whole-loop"], start=1)])


class CommandLine(unittest.TestCase):
    """What is particular to course.py's command line; the contract every program keeps is test_cli's."""

    def test_the_files_named_before_the_work_are_the_files_written(self):
        named = [name for chapter in course.CHAPTERS for name in course.file_names(chapter)]
        self.assertEqual(sorted(named), sorted(os.listdir(os.path.join(HERE, course.OUTPUT))))
        chapter = "01-log-probabilities"
        self.assertEqual(list(course.files_of(chapter, report_of(chapter))), course.file_names(chapter))

    def test_a_folder_link_or_pipe_where_a_file_goes_is_refused_before_any_work(self):
        chapter = "01-log-probabilities"
        json_name, figure_name = course.file_names(chapter)[:2]
        for kind, name in (("folder", json_name), ("link", json_name), ("pipe", figure_name)):
            with self.subTest(kind=kind), tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "out")
                os.mkdir(out)
                kept = os.path.join(tmp, "kept.json")
                with open(kept, "w", encoding="utf-8") as handle:
                    handle.write("mine\n")
                target = os.path.join(out, name)
                {"folder": os.mkdir, "link": lambda path: os.symlink(kept, path), "pipe": os.mkfifo}[kind](target)
                with mock.patch("course.compute", side_effect=AssertionError("computed before the check")):
                    code, stdout, stderr = run_main(course.main, ["--chapter", chapter, "--output", out])
                self.assertEqual((code, stdout), (2, ""))
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn("argument --output:", stderr)
                self.assertIn(repr(os.path.join(os.path.realpath(out), name)), stderr)
                self.assertEqual(os.listdir(out), [name])
                with open(kept, encoding="utf-8") as handle:
                    self.assertEqual(handle.read(), "mine\n")


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
                               ("05-trust-regions", ["clip", "weights", "sapo-gate", "dppo-region", "gmpo-clip",
                                                    "sequence-weights"])]:
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

ROUNDED = 1e-11  # relative tolerance of a value of a report (rounded to 12 significant digits)


class RoundedValues(unittest.TestCase):
    """assertClose: equal up to the 12 significant digits a report keeps (and 1e-13 near 0)."""

    def assertClose(self, a, b, message=None):
        self.assertTrue(math.isclose(a, b, rel_tol=ROUNDED, abs_tol=1e-13), f"{a!r} != {b!r} {message or ''}")


_FRESH = {}  # chapter -> a fresh report, computed once for all the tests of chapters 6-10


def fresh_report(chapter):
    if chapter not in _FRESH:
        _FRESH[chapter] = course.compute(chapter)
    return _FRESH[chapter]


class CommittedChapters6To10(unittest.TestCase):
    def test_each_committed_report_is_a_fresh_computation(self):
        for chapter in list(course.CHAPTERS)[5:]:
            with self.subTest(chapter=chapter):
                relative = f"{course.OUTPUT}/{chapter}.json"
                found = committed_differences(relative, json_text(fresh_report(chapter)))
                self.assertEqual(found, [], describe_differences(relative, found))

    def test_each_chapter_draws_its_registered_figures(self):
        for chapter in list(course.CHAPTERS)[5:]:
            with self.subTest(chapter=chapter):
                self.assertGreaterEqual(len(plot_course.FIGURES[chapter]), 1)


class KLRegularizedObjective(RoundedValues):
    def setUp(self):
        self.report = fresh_report("06-kl-regularized-objective")

    def test_gradient_ascent_finds_the_closed_form_optimum_at_every_beta(self):
        self.assertEqual([check["beta"] for check in self.report["optimum_checks"]], course.KL_BETAS)
        self.assertLess(self.report["optimum_max_abs_difference"], 1e-12)

    def test_the_optimum_beats_every_other_policy_on_the_objective(self):
        # J(pi*) >= J(pi) for seeded random policies, from the formula: the closed form is the maximum
        rewards, ref_logp = rl_lab.reward_table(), course._reference_logp()
        beta = 0.3
        optimum = rl_lab.kl_optimum_logp(rewards, ref_logp, beta)

        def objective(logp):
            return float((logp.exp() * (rewards - beta * (logp - ref_logp))).sum(dim=-1).mean())

        generator = torch.Generator().manual_seed(0)
        for _ in range(20):
            other = torch.log_softmax(optimum + 0.3 * torch.randn(4, 3, generator=generator, dtype=torch.float64), -1)
            self.assertLess(objective(other), objective(optimum))
        # and J(pi*) = mean_x beta log Z(x), the value of the optimum
        log_z = torch.logsumexp(ref_logp + rewards / beta, dim=-1)
        self.assertClose(objective(optimum), float((beta * log_z).mean()))

    def test_beta_trades_reward_for_kl_monotonically(self):
        curve = self.report["beta_curve"]
        rewards = [row["expected_reward"] for row in curve]
        kls = [row["kl_reference"] for row in curve]
        self.assertTrue(all(a >= b for a, b in zip(rewards, rewards[1:])))
        self.assertTrue(all(a >= b for a, b in zip(kls, kls[1:])))
        self.assertAlmostEqual(rewards[0], 1.0, delta=1e-9)  # beta 0.01: the best action everywhere
        self.assertLess(kls[-1], 2e-3)  # beta 10: nearly the reference

    def test_the_estimator_curves_are_the_formulas(self):
        curves = self.report["estimator_curves"]
        for x, k1, k2, k3 in zip(curves["log_ratio"], curves["k1"], curves["k2"], curves["k3"]):
            self.assertClose(k1, x)
            self.assertClose(k2, 0.5 * x * x)
            self.assertClose(k3, math.exp(-x) + x - 1.0)

    def test_k1_and_k3_are_unbiased_k2_is_not_and_k3_spreads_less_only_near(self):
        moments = self.report["estimator_moments"]
        for place in ("near", "far"):
            estimators = moments[place]["estimators"]
            self.assertLess(abs(estimators["k1"]["bias"]), 1e-12)
            self.assertLess(abs(estimators["k3"]["bias"]), 1e-12)
            self.assertGreater(abs(estimators["k2"]["bias"]), 1e-4)
        self.assertLess(moments["near"]["estimators"]["k3"]["std"], moments["near"]["estimators"]["k1"]["std"])
        self.assertGreater(moments["far"]["estimators"]["k3"]["std"], moments["far"]["estimators"]["k1"]["std"])

    def test_the_sampled_means_lie_within_four_standard_errors_of_the_kl(self):
        samples = self.report["estimator_samples"]
        for place in ("near", "far"):
            kl = self.report["estimator_moments"][place]["kl"]
            for name in ("k1", "k3"):
                estimator = self.report["estimator_moments"][place]["estimators"][name]
                self.assertLess(abs(estimator["sampled_mean"] - kl), 4 * estimator["std"] / math.sqrt(samples))

    def test_one_token_gradients_k2_trl_k3_plus_and_the_reward_are_exact_k1_is_zero(self):
        found = self.report["one_token"]["estimators"]
        for name in ("k2 in the loss", "k3 x ratio (TRL)", "k3+ (verl)", "k1 in the reward"):
            self.assertLess(found[name]["relative_error"], 1e-12, name)
        for component in found["k1 in the loss"]["gradient"]:
            self.assertLess(abs(component), 1e-15)  # E[grad log pi] = 0
        self.assertGreater(found["k3 in the loss"]["relative_error"], 0.01)
        self.assertLess(self.report["one_token"]["k3_relative_error_to_forward_kl_gradient"], 1e-12)

    def test_one_token_k2_gradient_by_hand(self):
        # E_pi[(log pi - log ref) grad log pi] with grad_theta log pi(y) = e_y - pi, by a loop over y
        policy = torch.softmax(torch.tensor(course.ONE_TOKEN["policy"], dtype=torch.float64), -1)
        ref = torch.softmax(torch.tensor(course.ONE_TOKEN["reference"], dtype=torch.float64), -1)
        gradient = [0.0, 0.0, 0.0]
        for y in range(3):
            log_ratio = math.log(policy[y] / ref[y])
            for j in range(3):
                gradient[j] += float(policy[y]) * log_ratio * ((1.0 if j == y else 0.0) - float(policy[j]))
        for a, b in zip(self.report["one_token"]["exact_gradient"], gradient):
            self.assertClose(a, b)

    def test_two_tokens_only_the_kl_in_the_reward_and_the_sequence_k2_give_the_exact_gradient(self):
        found = self.report["two_tokens"]["estimators"]
        self.assertLess(found["k1 in the reward"]["relative_error"], 1e-12)
        self.assertLess(found["k2 of the sequence log-ratio"]["relative_error"], 1e-12)
        self.assertEqual(found["k1 in the loss"]["relative_error"], 1.0)  # its expected gradient is 0
        for name in ("k2 in the loss", "k3 in the loss", "k3 x ratio (TRL)", "k3+ (verl)"):
            self.assertGreater(found[name]["relative_error"], 0.05, name)
        # on-policy TRL's ratio-weighted k3 and verl's k3+ have per-token k2's gradient exactly
        for name in ("k3 x ratio (TRL)", "k3+ (verl)"):
            for a, b in zip(found[name]["gradient"], found["k2 in the loss"]["gradient"]):
                self.assertClose(a, b)

    def test_two_token_kl_by_a_loop_over_the_nine_sequences(self):
        first = torch.softmax(torch.tensor(course.TWO_TOKENS["first"], dtype=torch.float64), -1)
        second = torch.softmax(torch.tensor(course.TWO_TOKENS["second"], dtype=torch.float64), -1)
        ref_first = torch.softmax(torch.tensor(course.TWO_TOKENS["ref_first"], dtype=torch.float64), -1)
        ref_second = torch.softmax(torch.tensor(course.TWO_TOKENS["ref_second"], dtype=torch.float64), -1)
        kl = 0.0
        for y1, y2 in itertools.product(range(3), range(3)):
            p = float(first[y1] * second[y1, y2])
            q = float(ref_first[y1] * ref_second[y1, y2])
            kl += p * math.log(p / q)
        self.assertClose(self.report["two_tokens"]["kl"], kl)
        # k1 and k3 summed over the tokens are unbiased for it; k2 is not
        found = self.report["two_tokens"]["estimators"]
        self.assertClose(found["k1 in the loss"]["value"], kl)
        self.assertClose(found["k3 in the loss"]["value"], kl)
        self.assertGreater(abs(found["k2 in the loss"]["value"] - kl), 1e-5)

    def test_resetting_the_reference_k_times_equals_beta_over_k(self):
        reset = self.report["reset"]
        self.assertLess(reset["max_abs_difference_to_equivalent"], 1e-12)
        self.assertClose(reset["equivalent_beta"], reset["beta"] / len(reset["iterations"]))
        kl_to_first = [row["kl_to_first"] for row in reset["iterations"]]
        self.assertTrue(all(a < b for a, b in zip(kl_to_first, kl_to_first[1:])))  # the drift grows
        last = reset["iterations"][-1]
        self.assertLess(last["kl_to_previous"], last["kl_to_first"])


class Preferences(RoundedValues):
    def setUp(self):
        self.report = fresh_report("07-preferences")

    def test_the_implicit_reward_differences_are_the_reward_differences(self):
        self.assertLess(self.report["implicit_margin_max_abs_difference"], 1e-12)
        rewards = rl_lab.reward_table()
        for (x, w, l), margin in zip(self.report["pairs"], self.report["reward_margins"]):
            self.assertClose(margin, float(rewards[x, w] - rewards[x, l]))

    def test_dpo_at_the_optimum_is_bradley_terrys_negative_log_likelihood(self):
        self.assertLess(self.report["loss_at_optimum_max_abs_difference"], 1e-12)
        for margin, nll in zip(self.report["reward_margins"], self.report["bradley_terry_nll"]):
            self.assertClose(nll, -math.log(1.0 / (1.0 + math.exp(-margin))))
        self.assertClose(self.report["loss_at_reference"], math.log(2.0))

    def test_the_quoted_losses_and_weights_by_hand(self):
        beta = self.report["loss_beta"]
        for row in self.report["quoted"]:
            m = row["margin"]
            sig = 1.0 / (1.0 + math.exp(beta * m))  # sigmoid(-beta m)
            self.assertClose(row["dpo_loss"], -math.log(1.0 - sig))
            self.assertClose(row["dpo_weight"], beta * sig)
            self.assertClose(row["ipo_loss"], (m - 1.0 / (2 * beta)) ** 2)
            self.assertClose(row["ipo_weight"], -2.0 * (m - 1.0 / (2 * beta)))
            self.assertClose(row["hinge_loss"], max(0.0, 1.0 - beta * m))
            self.assertClose(row["hinge_weight"], beta if beta * m < 1 else 0.0)

    def test_dpo_keeps_a_positive_weight_ipo_changes_sign_at_its_target(self):
        curves, margins = self.report["curves"], self.report["margins"]
        self.assertTrue(all(w > 0 for w in curves["dpo"]["weight"]))
        weights = curves["dpo"]["weight"]
        self.assertTrue(all(a > b for a, b in zip(weights, weights[1:])))
        target = self.report["ipo_target_margin"]
        for m, w in zip(margins, curves["ipo"]["weight"]):
            if abs(m - target) > 1e-9:
                self.assertEqual(w > 0, m < target)


class Groups(RoundedValues):
    def setUp(self):
        self.report = fresh_report("08-groups")

    def test_the_weight_table_matches_its_closed_forms(self):
        for row in self.report["weights"]:
            # group_advantages divides by std + 1e-8: the closed form holds to ~1e-7 relative
            self.assertAlmostEqual(row["with_std"], row["with_std_closed_form"], delta=1e-6)
            self.assertClose(row["without_std"], row["without_std_closed_form"])

    def test_a_one_of_eight_prompt_weighs_0_661_with_the_std_and_0_4375_without(self):
        one = self.report["weights"][1]
        self.assertAlmostEqual(one["with_std_relative"], math.sqrt(7) / 4, delta=1e-7)  # 0.6614
        self.assertClose(one["without_std_relative"], 0.4375)
        for row in self.report["weights"]:
            self.assertLessEqual(row["with_std_relative"], 1.0 + 1e-12)  # no prompt outweighs 4 of 8

    def test_rloo_is_the_centred_advantage_scaled_by_g_over_g_minus_1(self):
        example = self.report["rloo_example"]
        for name in ("max_abs_difference_to_scaled", "max_abs_difference_to_loop", "max_abs_difference_self_included"):
            self.assertLess(example[name], 1e-12, name)

    def test_tied_groups_exact_and_measured(self):
        for row in self.report["ties"]:
            q, g = row["success_rate"], row["group_size"]
            self.assertClose(row["exact"], q ** g + (1 - q) ** g)
            standard_error = math.sqrt(row["exact"] * (1 - row["exact"]) / self.report["tie_sampled_groups"])
            self.assertLess(abs(row["measured"] - row["exact"]), 5 * standard_error + 1e-3)
        self.assertClose(self.report["bandit_uniform_tie_probability"], 3 * (1 / 3) ** 8)

    def test_the_budget_rows(self):
        for row in self.report["budget_rows"]:
            self.assertEqual(row["prompts"] * row["group_size"], self.report["budget"])
            self.assertAlmostEqual(row["prompts_drawn_by_dynamic_sampling"] * (1 - row["tie_probability"]),
                                   row["prompts"], delta=1e-9)


class Sequences(RoundedValues):
    def setUp(self):
        self.report = fresh_report("09-sequences")

    def test_per_token_weights_of_each_reduction_by_hand(self):
        lengths, weights = self.report["lengths"], self.report["token_weights"]
        n, total, cap = len(lengths), sum(lengths), self.report["max_new_tokens"]
        for index, length in enumerate(lengths):
            self.assertClose(weights["sequence"][index], 1.0 / (n * length))
            self.assertClose(weights["token"][index], 1.0 / total)
            self.assertClose(weights["constant"][index], 1.0 / (n * cap))
        self.assertEqual(self.report["sequence_weight_ratio"], 8.0)

    def test_micro_batches_by_a_loop(self):
        micro = self.report["micro_batches"]
        self.assertClose(micro["global_token_count"], micro["token_mean"])
        self.assertClose(micro["sequence_mean_micro_batches"], micro["sequence_mean"])
        self.assertGreater(abs(micro["per_micro_batch_token_mean"] - micro["token_mean"]), 1e-3)
        lengths = micro["lengths"]
        self.assertClose(micro["per_micro_batch_weights"][0], 1 / (2 * (lengths[0] + lengths[1])))
        self.assertClose(micro["per_micro_batch_weights"][1], 1 / (2 * (lengths[2] + lengths[3])))

    def test_the_completion_mask_keeps_the_first_eos_the_buggy_mask_drops_it(self):
        example = self.report["eos_example"]
        for ids, kept, buggy in zip(example["ids"], example["completion_mask"], example["buggy_mask"]):
            first_eos = ids.index(example["eos"]) if example["eos"] in ids else len(ids) - 1
            self.assertEqual(kept, [1 if t <= first_eos else 0 for t in range(len(ids))])
            self.assertEqual(buggy, [0 if token == example["eos"] else 1 for token in ids])

    def test_mask_positions_reproduce_the_unpadded_log_probs_arange_does_not(self):
        padding = self.report["padding"]
        self.assertLess(padding["max_abs_difference_mask_positions"], 1e-12)
        self.assertGreater(padding["max_abs_difference_arange_positions"], 1e-2)
        for mask, positions in zip(padding["attention_mask"], padding["position_ids_from_mask"]):
            first = mask.index(1)
            self.assertEqual(positions[first:], list(range(len(mask) - first)))

    def test_the_overlong_penalty_by_hand(self):
        overlong = self.report["overlong"]
        cap, cache = overlong["max_new_tokens"], overlong["cache"]
        for length, penalty in zip(overlong["lengths"], overlong["penalty"]):
            expected = 0.0 if length <= cap - cache else (-1.0 if length > cap else ((cap - cache) - length) / cache)
            self.assertClose(penalty, expected)


class TheWholeLoop(RoundedValues):
    def setUp(self):
        self.report = fresh_report("10-the-whole-loop")

    def test_pass_at_n_is_a_share_of_the_prompts_with_its_binomial_standard_error(self):
        prompts = self.report["evaluation_prompts"]
        for when in ("before", "after"):
            quoted = self.report["pass_at_n"][when]
            self.assertEqual(quoted["k"], self.report["evaluation_samples"])
            solved = quoted["value"] * prompts  # at k = n each prompt counts 0 or 1
            self.assertAlmostEqual(solved, round(solved), places=8)
            p = round(solved) / prompts
            self.assertAlmostEqual(quoted["standard_error"], math.sqrt(p * (1 - p) / prompts), places=10)
        self.assertEqual(self.report["pass_at_n"]["before"]["standard_error"], 0.0)  # all 106 solved

    def test_the_report_quotes_the_committed_run(self):
        with open(os.path.join(course.HERE, self.report["run"]), encoding="utf-8") as handle:
            evaluation = json.load(handle)["evaluation"]
        for k, before, after in zip(self.report["ks"], self.report["pass_before"], self.report["pass_after"]):
            self.assertClose(before, evaluation["before"][f"pass@{k}"])
            self.assertClose(after, evaluation["after"][f"pass@{k}"])
        self.assertEqual(self.report["ks"], [1, 4, 16, 64])
        self.assertGreater(self.report["pass_after"][0], self.report["pass_before"][0])  # pass@1 up
        self.assertLess(self.report["pass_after"][-1], self.report["pass_before"][-1])  # pass@64 down
        self.assertLess(self.report["entropy_after"], self.report["entropy_before"])
        self.assertLess(self.report["distinct_after"], self.report["distinct_before"])

    def test_the_estimator_against_the_binomial_definition(self):
        estimator = self.report["estimator"]
        n = estimator["samples"]
        for c in estimator["correct"]:
            for k, value in zip(estimator["k"], estimator["unbiased"][str(c)]):
                self.assertClose(value, 1.0 - math.comb(n - c, k) / math.comb(n, k))
                self.assertGreaterEqual(value + 1e-12, estimator["naive"][str(c)][k - 1])  # the plug-in is low

    def test_the_narrowing_example(self):
        rows = {row["k"]: row for row in self.report["narrowing"]["rows"]}
        self.assertClose(rows[1]["before"], 14 / 64)
        self.assertClose(rows[1]["after"], 56 / 128)
        self.assertEqual(rows[64]["before"], 1.0)
        self.assertEqual(rows[64]["after"], 0.5)
        self.assertEqual(countdown.pass_at_k(64, 0, 64), 0.0)




class HighEntropyMaskFigure(unittest.TestCase):
    """Chapter 10's one batch under the high-entropy mask, against a hand-taken linear quantile."""

    def setUp(self):
        self.data = report_of("10-the-whole-loop")["entropy_mask"]
        self.kept = [h for row, mask in zip(self.data["entropies"], self.data["completion_mask"])
                     for h, m in zip(row, mask) if m]

    def test_threshold_is_the_linear_quantile_of_the_kept_entropies(self):
        values = sorted(self.kept)
        position = (len(values) - 1) * (1 - self.data["top_quantile"])
        low = math.floor(position)
        expected = values[low] + (position - low) * (values[low + 1] - values[low])
        self.assertTrue(math.isclose(self.data["threshold"], expected, rel_tol=1e-11),
                        (self.data["threshold"], expected))

    def test_mask_keeps_exactly_the_kept_tokens_at_or_above_the_threshold(self):
        for row, mask, chosen in zip(self.data["entropies"], self.data["completion_mask"], self.data["mask"]):
            for h, m, c in zip(row, mask, chosen):
                self.assertEqual(c, int(bool(m) and h >= self.data["threshold"]), (h, m))
        # distinct entropies: the top n - ceil((n - 1)(1 - rho)) of n kept tokens, 8 of 38
        count = len(self.kept)
        self.assertEqual(self.data["chosen"], count - math.ceil((count - 1) * (1 - self.data["top_quantile"])))
        self.assertEqual((self.data["kept"], self.data["chosen"]), (sum(self.data["lengths"]), 8))

    def test_entropies_lie_between_zero_and_log_v(self):
        for h in self.kept:
            self.assertTrue(0.0 <= h <= math.log(self.data["vocabulary"]) + 1e-12, h)



# ---------------------------------------------------------------------------------------------
# Chapter 5's figures of the second-wave trust regions and sequence weights (the algorithm pages)
# ---------------------------------------------------------------------------------------------

def _binary_kl(q, p):
    """KL(Bernoulli(q) || Bernoulli(p)) in nats, with DPPO's 1e-8 on the 'not taken' side."""
    return q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))


def _bisect(f, low, high, steps=80):
    """The root of an increasing f on [low, high] (f(low) <= 0 <= f(high))."""
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if f(middle) <= 0 else (low, middle)
    return (low + high) / 2


class SecondWaveTrustRegionFigures(unittest.TestCase):
    """The DPPO, GMPO, VESPO and TOPR curves of chapter 5 against their formulas, by hand."""

    def setUp(self):
        self.report = report_of("05-trust-regions")
        self.dppo = self.report["dppo"]
        self.half_step = (self.dppo["probabilities"][1] - self.dppo["probabilities"][0]) / 2

    def _single_interval(self, sign, q, method):
        intervals = self.dppo["region"][sign][str(q)][method]
        self.assertEqual(len(intervals), 1, (sign, q, method))
        return intervals[0]

    def test_ratio_clip_keeps_p_within_one_plus_minus_eps_times_q(self):
        eps = self.dppo["delta"]
        for q in self.dppo["old_probabilities"]:
            self.assertEqual(self._single_interval("positive", q, "ppo_clip")[0], 0.0)
            self.assertAlmostEqual(self._single_interval("positive", q, "ppo_clip")[1], min(q * (1 + eps), 1.0),
                                   delta=self.half_step)
            self.assertAlmostEqual(self._single_interval("negative", q, "ppo_clip")[0], q * (1 - eps),
                                   delta=self.half_step)
            self.assertEqual(self._single_interval("negative", q, "ppo_clip")[1], 1.0)

    def test_dppo_tv_keeps_p_within_q_plus_minus_delta(self):
        delta = self.dppo["delta"]
        for q in self.dppo["old_probabilities"]:
            self.assertAlmostEqual(self._single_interval("positive", q, "dppo_tv")[1], min(q + delta, 1.0),
                                   delta=self.half_step)
            self.assertAlmostEqual(self._single_interval("negative", q, "dppo_tv")[0], max(q - delta, 0.0),
                                   delta=self.half_step)
        # the rare token: the ratio clip stops it at p = 0.012, the TV region at 0.21
        self.assertAlmostEqual(self._single_interval("positive", 0.01, "dppo_tv")[1], 0.21, places=12)
        self.assertAlmostEqual(self._single_interval("positive", 0.01, "ppo_clip")[1], 0.012, places=12)

    def test_dppo_kl_edge_is_where_the_binary_kl_reaches_delta(self):
        delta, grid = self.dppo["delta"], self.dppo["probabilities"]
        for q in self.dppo["old_probabilities"]:
            up = 1.0 if _binary_kl(q, grid[-1]) <= delta else _bisect(lambda p: _binary_kl(q, p) - delta, q, grid[-1])
            down = 0.0 if _binary_kl(q, grid[0]) <= delta else _bisect(lambda p: delta - _binary_kl(q, p), grid[0], q)
            self.assertAlmostEqual(self._single_interval("positive", q, "dppo_kl")[1], up, delta=self.half_step)
            self.assertAlmostEqual(self._single_interval("negative", q, "dppo_kl")[0], down, delta=self.half_step)
        # q = 0.5: the binary KL is symmetric in p around 0.5, so the two edges mirror each other
        self.assertAlmostEqual(self._single_interval("positive", 0.5, "dppo_kl")[1],
                               1 - self._single_interval("negative", 0.5, "dppo_kl")[0], delta=2 * self.half_step)

    def test_every_region_keeps_the_on_policy_token(self):
        for sign, by_q in self.dppo["region"].items():
            for q, methods in by_q.items():
                for method, intervals in methods.items():
                    self.assertTrue(any(low < float(q) < high for low, high in intervals), (sign, q, method))

    def test_gmpo_and_ppo_see_the_pessimistic_clipped_log_ratio(self):
        gmpo, eps = self.report["gmpo"], self.report["gmpo"]["epsilon"]
        low, high = math.log(0.8), math.log(1.2)
        for sign, pick in (("positive", min), ("negative", max)):
            clip = gmpo["clip"][sign]
            for index, l in enumerate(gmpo["log_ratios"]):
                self.assertAlmostEqual(clip["gmpo"]["log_ratio_seen"][index], pick(l, min(max(l, -eps), eps)),
                                       places=10)
                self.assertAlmostEqual(clip["ppo_clip"]["log_ratio_seen"][index], pick(l, min(max(l, low), high)),
                                       places=10)
                if abs(abs(l) - eps) > 1e-9:  # off the edges: weight e^l inside the kept side, 0 past it
                    clipped = l > eps if sign == "positive" else l < -eps
                    self.assertAlmostEqual(clip["gmpo"]["weight"][index], 0.0 if clipped else math.exp(l), places=10)

    def test_vespo_weight_is_the_gamma_shape_with_its_peak_at_k_over_lambda(self):
        weights = self.report["sequence_weights"]
        ratios = weights["ratios"]
        for sign, (k, lam) in (("positive", (2.0, 3.0)), ("negative", (3.0, 2.0))):
            phi = weights["weight"][sign]["vespo"]
            for index, w in enumerate(ratios):
                self.assertTrue(math.isclose(phi[index], w ** k * math.exp(lam * (1 - w)), rel_tol=1e-10,
                                             abs_tol=1e-15), (sign, w))
            self.assertAlmostEqual(phi[ratios.index(1.0)], 1.0, places=12)
            peak = ratios[phi.index(max(phi))]
            self.assertLess(abs(math.log(peak / (k / lam))), math.log(10) / 50)  # within one grid step

    def test_topr_weight_is_one_for_good_responses_and_min_w_one_for_bad(self):
        weights = self.report["sequence_weights"]
        for index, w in enumerate(weights["ratios"]):
            self.assertAlmostEqual(weights["weight"]["positive"]["topr"][index], 1.0, places=12)
            self.assertAlmostEqual(weights["weight"]["negative"]["topr"][index], min(w, 1.0), places=12)


if __name__ == "__main__":
    unittest.main()
