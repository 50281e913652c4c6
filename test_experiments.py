"""Tests of experiments.py at reduced size: exact identities exactly, learning effects in their documented
direction with loose thresholds, and the files' schema.

    python -m unittest -v test_experiments
"""

import csv
import inspect
import io
import itertools
import json
import math
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import torch

import experiments
import online_settings
import online_tokens
import plot_results
import rl_lab
import sft
from atlas import catalog, claims, engine, exact as enumeration, runners, stats
from policies import TablePolicy, logps_of_tokens
from tasks import countdown_task
from tiny_lm import TinyLM, completion_log_probs
from lab.testing import HERE, ForkedProgram, prefetch, run_main, shared_calls, single_thread_module

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train


def rows_of(text):
    return list(csv.DictReader(io.StringIO(text)))


class ExactIdentities(unittest.TestCase):
    def test_kl_estimator_values_and_expected_gradients(self):
        for distance in ("near", "far"):
            with self.subTest(distance=distance):
                metrics = runners.run_kl_estimators(0, distance)["metrics"]
                self.assertLess(abs(metrics["k1_relative_bias"]), 1e-12)
                self.assertLess(abs(metrics["k3_relative_bias"]), 1e-12)
                self.assertGreater(abs(metrics["k2_relative_bias"]), 1e-3)
                self.assertLess(metrics["k1_grad_norm_ratio"], 1e-12)  # E[grad k1] = 0
                self.assertLess(metrics["k2_grad_error_kl_pi_ref"], 1e-12)  # = grad KL(pi || ref)
                self.assertLess(metrics["k3_grad_error_kl_ref_pi"], 1e-12)  # = grad KL(ref || pi)
                self.assertGreater(metrics["k3_grad_error_kl_pi_ref"], 1e-3)  # and not the other direction

    def test_k2_bias_on_the_pair_computed_by_hand(self):
        # pi = (1/2, 1/4, 1/4), ref = (1/4, 1/4, 1/2): log(pi/ref) = (ln 2, 0, -ln 2)
        mean_k2, kl = enumeration.k2_worked_example()
        self.assertAlmostEqual(kl, 0.5 * math.log(2) - 0.25 * math.log(2), places=15)  # 0.1733
        self.assertAlmostEqual(mean_k2, 0.5 * (0.5 * math.log(2) ** 2 + 0.25 * math.log(2) ** 2), places=15)  # 0.1802
        self.assertAlmostEqual(mean_k2 / kl - 1, 0.0397, places=4)
        self.assertTrue(catalog._k2_worked_example_holds())
        with mock.patch.object(rl_lab, "kl_k2", rl_lab.kl_k1):  # an unbiased estimator in its place: the check fails
            self.assertFalse(catalog._k2_worked_example_holds())

    def test_microbatch_gradients(self):
        metrics = runners.run_microbatch(0)["metrics"]
        self.assertGreater(metrics["length_spread"], 0)  # the batch's answers differ in length
        for micro in (1, 2, 4):
            with self.subTest(micro_batches=micro):
                self.assertLess(metrics[f"sequence_local_m{micro}"], 1e-12)
                self.assertLess(metrics[f"constant_local_m{micro}"], 1e-12)
                self.assertLess(metrics[f"token_global_m{micro}"], 1e-12)  # the fix: the global token count
        self.assertLess(metrics["token_local_m1"], 1e-12)
        self.assertGreater(metrics["token_local_m2"], 1e-3)  # verl issue 5625: local token counts
        self.assertGreater(metrics["token_local_m4"], 1e-3)
        self.assertEqual((metrics["token_count_spread_m2"], metrics["token_count_spread_m4"]), (13, 14))
        self.assertTrue(all(catalog._local_token_mean_holds(metrics, micro) for micro in (2, 4)))

    def test_microbatch_equal_token_counts(self):
        # seed 1500's two halves hold the same number of tokens: each local token mean is the global one, so
        # the locally normalized gradient is exact at 2 micro-batches and off at 4 (counts 22 apart)
        metrics = runners.run_microbatch(1500)["metrics"]
        self.assertEqual((metrics["token_count_spread_m2"], metrics["token_count_spread_m4"]), (0, 22))
        self.assertLess(metrics["token_local_m2"], 1e-12)
        self.assertGreater(metrics["token_local_m4"], 1e-3)
        self.assertTrue(all(catalog._local_token_mean_holds(metrics, micro) for micro in (2, 4)))
        # the check fails where the counts differ and the gradients agree, or the counts agree and they differ
        self.assertFalse(catalog._local_token_mean_holds({**metrics, "token_local_m4": 0.0}, 4))
        self.assertFalse(catalog._local_token_mean_holds({**metrics, "token_local_m2": 0.01}, 2))

    def test_std_scaling_weight_table(self):
        columns, rows = enumeration.std_scaling_table()
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
        distribution = enumeration.reward_distribution(state)
        torch.testing.assert_close(distribution.sum(dim=1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-14)
        # prompt 0, answer "0": "0 EOS" has 1/9; "0" then four more digits (no EOS, cut) has (1/3)(2/3)**4
        self.assertAlmostEqual(distribution[0, 2].item(), 1 / 9, places=15)
        self.assertAlmostEqual(distribution[0, 1].item(), (1 / 3) * (2 / 3) ** 4, places=15)

    def test_a_reward_shift_leaves_group_advantages_and_moves_ppos(self):
        grpo = runners.run_reward_shift(0, "grpo", 5.0, steps=2)["metrics"]
        ppo = runners.run_reward_shift(0, "ppo", 5.0, steps=2)["metrics"]
        self.assertLess(grpo["advantage_change"], 1e-12)
        self.assertAlmostEqual(ppo["advantage_change"], 5.0, places=12)


    def test_grpos_group_mean_scales_the_expected_policy_gradient_by_g_minus_1_over_g(self):
        # why kl-optimum's GRPO loss-term targets sit at beta * G / (G - 1): enumerate every group of G = 3
        rewards, group = rl_lab.reward_table()[0], 3
        logits = torch.tensor([0.4, -0.1, 0.2], dtype=torch.float64, requires_grad=True)
        logp = torch.log_softmax(logits, dim=-1)
        surrogate = 0.0
        for actions in itertools.product(range(3), repeat=group):
            chosen = list(actions)
            advantages = rewards[chosen] - rewards[chosen].mean()  # scale "none"
            probability = logp.detach()[chosen].sum().exp()
            surrogate = surrogate + probability * (advantages * logp[chosen]).sum() / group
        (expected,) = torch.autograd.grad(surrogate, logits, retain_graph=True)
        (exact,) = torch.autograd.grad((logp.exp() * rewards).sum(), logits)
        torch.testing.assert_close(expected, exact * (group - 1) / group, rtol=0, atol=1e-15)

    def test_kl_optimum_targets_and_a_short_run_move_toward_the_predicted_point(self):
        reverse, forward = runners.bandit_kl_targets(0.3, "ppo", "k3-loss")
        # context 0 (R = 1, 0.2, -0.5; uniform reference) by hand: pi* = softmax(R / 0.3); the forward optimum
        # p = 0.1 / (mu - R) with mu found by bisection in plain floats
        pi_star = [math.exp(r / 0.3) for r in (1.0, 0.2, -0.5)]
        self.assertAlmostEqual(reverse[0].exp()[0].item(), pi_star[0] / sum(pi_star), places=14)
        low, high = 1.0, 1.3
        for _ in range(100):
            mu = (low + high) / 2
            low, high = (mu, high) if sum(0.1 / (mu - r) for r in (1.0, 0.2, -0.5)) > 1 else (low, mu)
        self.assertAlmostEqual(forward[0].exp()[0].item(), 0.1 / (high - 1.0), places=12)
        grpo_reverse, _ = runners.bandit_kl_targets(0.3, "grpo", "k3-loss")  # beta * 8 / 7 for a loss term
        uniform = torch.full_like(reverse, -math.log(3.0))
        torch.testing.assert_close(grpo_reverse, rl_lab.kl_optimum_logp(rl_lab.reward_table(), uniform, 0.3 * 8 / 7),
                                   rtol=0, atol=1e-15)
        runs = {placement: runners.run_kl_optimum(0, "ppo", placement, 0.3, steps=20)["metrics"]
                for placement in ("k1-reward", "k3-loss")}
        self.assertAlmostEqual(runs["k1-reward"]["targets_kl"], enumeration_kl(forward, reverse), places=14)
        self.assertLess(runs["k1-reward"]["nearer_forward_optimum"], 0)  # loose: 20 iterations, one seed
        self.assertGreater(runs["k3-loss"]["nearer_forward_optimum"], 0)

    def test_the_kl_optimum_closed_forms_are_stationary(self):
        self.assertLess(enumeration.kl_optimum_gradient((0.1, 0.3)), 1e-12)


    def test_first_order_entropy_change_is_minus_the_covariance_and_matches_autograd(self):
        logits = torch.tensor([[0.5, -0.3, 0.1], [1.2, 0.0, -0.7]], dtype=torch.float64)
        step = torch.tensor([[0.2, -0.1, 0.4], [-0.3, 0.5, 0.1]], dtype=torch.float64)
        leaf = logits.clone().requires_grad_(True)
        logp = torch.log_softmax(leaf, dim=-1)
        (gradient,) = torch.autograd.grad(-(logp.exp() * logp).sum(), leaf)  # dH/dz per row
        predicted = enumeration.first_order_entropy_change(logits, logits + step)
        torch.testing.assert_close(predicted, (gradient * step).sum(dim=-1), rtol=0, atol=1e-15)
        # a natural-gradient step dz = lr A gives -lr Cov_{a~p}(log p, A), the covariance by hand
        probs, logp = torch.softmax(logits, dim=-1), torch.log_softmax(logits, dim=-1)
        advantage, lr = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64), 1e-3
        covariance = [sum(p * (lp - sum(p * lp for p, lp in zip(row_p, row_lp))) * (a - sum(p * a for p, a in zip(
            row_p, advantage.tolist()))) for p, lp, a in zip(row_p, row_lp, advantage.tolist()))
            for row_p, row_lp in zip(probs.tolist(), logp.tolist())]
        torch.testing.assert_close(enumeration.first_order_entropy_change(logits, logits + lr * advantage),
                                   -lr * torch.tensor(covariance, dtype=torch.float64), rtol=0, atol=1e-16)
        # and it is first order: the exact change of a small step agrees to the step's square
        exact = -(torch.softmax(logits + 1e-4 * step, -1) * torch.log_softmax(logits + 1e-4 * step, -1)).sum(-1) - (
            -(probs * logp).sum(-1))
        torch.testing.assert_close(exact, enumeration.first_order_entropy_change(logits, logits + 1e-4 * step),
                                   rtol=0, atol=1e-8)

    def test_entropy_mechanism_starts_uniform_with_zero_covariance_and_measures_the_change(self):
        result = runners.run_entropy_mechanism(0, steps=5)
        first = result["curve"][0]
        self.assertAlmostEqual(first["entropy"], math.log(3.0), places=14)  # zeros: uniform over 0, 1, EOS
        self.assertLess(abs(first["covariance"]), 1e-15)  # every sampled token has log pi = -ln 3
        # the uniform table is the entropy's maximum: the first update's change is second order only
        self.assertLess(abs(first["first_order_change"]), 1e-15)
        self.assertEqual([point["step"] for point in result["curve"]], [1, 2, 3, 4, 5])
        for point in result["curve"]:
            self.assertLess(point["entropy_change"], 0.0)  # the first updates sharpen the table
        for point in result["curve"][2:]:  # away from the maximum the first order carries the change
            self.assertAlmostEqual(point["first_order_change"], point["entropy_change"], delta=0.2 * abs(
                point["entropy_change"]))
        metrics = result["metrics"]
        self.assertAlmostEqual(metrics["entropy_change_mean"], statistics.fmean(
            point["entropy_change"] for point in result["curve"]), places=14)
        self.assertIn("covariance_sign_agreement", metrics)

def enumeration_kl(logp, other_logp):
    """Mean over contexts of KL(p || q), a plain loop over the table."""
    total = 0.0
    for row, other in zip(logp.tolist(), other_logp.tolist()):
        total += sum(math.exp(a) * (a - b) for a, b in zip(row, other))
    return total / len(logp)


class Statistics(unittest.TestCase):
    def test_t_quantiles_match_hand_values_and_the_normal_limit(self):
        # df 1: the Cauchy, P(|T| <= t) = 2 atan(t) / pi, so t = tan(0.95 pi / 2); df 2: P = t / sqrt(t^2 + 2)
        self.assertAlmostEqual(stats.t_quantile(1), math.tan(0.95 * math.pi / 2), places=9)
        self.assertAlmostEqual(stats.t_quantile(2), 0.95 * math.sqrt(2) / math.sqrt(1 - 0.95**2), places=9)
        for df, published in ((4, 2.776445105), (9, 2.262157163), (19, 2.093024054), (30, 2.042272456)):
            with self.subTest(df=df):
                self.assertAlmostEqual(stats.t_quantile(df), published, places=8)
        self.assertAlmostEqual(stats.t_quantile(100000), stats.Z_95, places=4)
        self.assertAlmostEqual(stats.t_quantile(3, level=0.9), 2.353363435, places=8)
        for bad in (0, 1.5, True):
            with self.subTest(df=bad), self.assertRaisesRegex(ValueError, "df"):
                stats.t_quantile(bad)

    def test_mean_interval_and_wilson_interval_by_hand(self):
        mean, low, high = stats.mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
        half = 2.776445105 * math.sqrt(2.5) / math.sqrt(5)  # t(4) * sample std / sqrt(n)
        self.assertEqual(mean, 3.0)
        self.assertAlmostEqual(low, 3.0 - half, places=8)
        self.assertAlmostEqual(high, 3.0 + half, places=8)
        self.assertEqual(stats.mean_interval([0.7]), (0.7, None, None))  # one seed: no spread, no interval
        # 0 of 5: centre and half-width are both (z^2 / 10) / (1 + z^2 / 5)
        z2 = stats.Z_95**2
        self.assertEqual(stats.wilson_interval(0, 5)[0], 0.0)
        self.assertAlmostEqual(stats.wilson_interval(0, 5)[1], 2 * (z2 / 10) / (1 + z2 / 5), places=12)
        low, high = stats.wilson_interval(4, 5)
        self.assertTrue(0.3 < low < 0.8 < high <= 1.0)

    def test_paired_comparison_leaves_out_seeds_without_a_value_and_counts_signs(self):
        by_seed = {seed: {"a": {"iterations_to_0.9": a}, "b": {"iterations_to_0.9": b}}
                   for seed, (a, b) in enumerate([(12, 10), (9, 11), (15, 10), (None, 8), (11, 11)])}
        result = stats.paired_comparison(by_seed, "iterations_to_0.9", "a", "b")
        self.assertEqual([item["difference"] for item in result["per_seed"]], [2, -2, 5, 0])
        self.assertEqual((result["seeds"], result["left_out"]), (4, 1))  # seed 3 never reached: left out, not -1
        self.assertEqual((result["first_greater"], result["second_greater"]), (2, 1))
        self.assertEqual(result["mean_difference"], 1.25)
        half = stats.t_quantile(3) * statistics.stdev([2, -2, 5, 0]) / 2
        self.assertAlmostEqual(result["interval"][1] - 1.25, half, places=12)

    def test_never_reached_runs_are_counted_and_left_out_of_the_means(self):
        experiment = catalog.Experiment("x", "", "", "", [({"n": 1}, "run_online", {})],
                                        ["iterations_to_0.9", "final_success_probability"], seeds_reason="a test")
        jobs = engine.jobs_of(experiment, [0, 1, 2])
        results = [{"metrics": {"iterations_to_0.9": value, "final_success_probability": 0.5}, "curve": []}
                   for value in (10, None, 14)]
        (runs, _), _, (summary, columns) = engine.summarize(experiment, jobs, results)
        self.assertIsNone(runs[1]["iterations_to_0.9"])  # an empty cell in runs.csv
        row = summary[0]
        self.assertEqual((row["iterations_to_0.9_mean"], row["iterations_to_0.9_min"]), (12.0, 10))
        self.assertEqual(row["iterations_to_0.9_never"], 1)
        self.assertNotIn("final_success_probability_never", columns)
        markdown = engine.summary_markdown(experiment, [0, 1, 2], summary, [])
        self.assertIn("| 12.0000 +- 2.8284 [10, 14]; 1 of 3 never reached 0.9 |", markdown)
        all_never = [{"metrics": {"iterations_to_0.9": None, "final_success_probability": 0.5}, "curve": []}] * 3
        row = engine.summarize(experiment, jobs, all_never)[2][0][0]
        self.assertIsNone(row["iterations_to_0.9_mean"])
        self.assertIn("never reached 0.9 (3 of 3)", engine.summary_markdown(experiment, [0, 1, 2], [row], []))


def seeds_of(values, configuration="a", metric="m"):
    return {seed: {configuration: {metric: value}} for seed, value in enumerate(values)}


def runs_of(a, b, budget=40):
    """One seed's two runs, a and b, each with its iterations to 0.9 (None: never) and its budget."""
    return {"a": {"iterations_to_0.9": a, "iterations": budget}, "b": {"iterations_to_0.9": b, "iterations": budget}}


class Verdicts(unittest.TestCase):
    def verdict(self, values, **claim):
        return claims.check_claim(claims.Claim("c", lambda runs: runs["a"]["m"], **claim), seeds_of(values))

    def test_a_paired_difference_holds_fails_or_is_within_noise(self):
        holds = self.verdict([0.10, 0.20, 0.15, 0.12, 0.18], test="greater")
        self.assertEqual((holds["verdict"], holds["count"]), ("holds", "5 of 5 seeds"))
        self.assertGreater(holds["interval"][0], 0)
        fails = self.verdict([-0.10, -0.20, -0.15, -0.12, 0.01], test="greater")
        self.assertEqual((fails["verdict"], fails["count"]), ("does not hold", "1 of 5 seeds"))
        noise = self.verdict([0.10, -0.10, 0.05, -0.02, 0.01], test="greater")
        self.assertEqual((noise["verdict"], noise["count"]), ("within noise", "3 of 5 seeds"))
        # 4 of 5 agree but one large value against: the interval crosses 0, so within noise
        spread = self.verdict([0.01, 0.01, 0.01, 0.01, -1.0], test="greater")
        self.assertEqual(spread["verdict"], "within noise")
        one = self.verdict([0.3], test="greater")  # a single seed has no interval: never a verdict either way
        self.assertEqual((one["verdict"], one["interval"]), ("within noise", None))
        # 7 of 10 above 0, the interval above 0: holds. The seeds above 0 are shown, not asked: a share asked of
        # them (8 of 10) would leave the verdict to chance wherever an effect's true share of positive seeds sits at it
        most = self.verdict([0.3] * 7 + [-0.01] * 3, test="greater")
        self.assertEqual((most["verdict"], most["count"], most["needs"]),
                         ("holds", "7 of 10 seeds", "interval above 0"))
        self.assertGreater(most["interval"][0], 0)
        self.assertIsNone(most["required"])
        with self.assertRaisesRegex(ValueError, "^at_least: "):  # a share of seeds is a count's, never a greater's
            self.verdict([0.1, 0.2], test="greater", at_least=0.8)

    def test_a_threshold_on_a_measured_value_is_judged_by_the_interval_of_its_distance(self):
        # "ends at most 0.02 above the start": 0.02 minus the change, a "greater" claim; 4 of 5 seeds on the right
        # side with the interval across 0 is within noise, where a count of 4 of 5 would have said holds
        at_most = catalog._below(lambda runs: runs["change"], 0.02)
        self.assertAlmostEqual(at_most({"change": 0.05}), -0.03, places=15)
        self.assertIsNone(catalog._below(lambda runs: None, 0.02)({}))
        distances = [at_most({"change": change}) for change in (0.0, 0.01, -0.01, 0.015, 0.2)]
        self.assertEqual(sum(distance > 0 for distance in distances), 4)
        self.assertEqual(self.verdict(distances, test="greater")["verdict"], "within noise")
        self.assertEqual(self.verdict([0.01, 0.012, 0.015, 0.011, 0.013], test="greater")["verdict"], "holds")
        # every such claim of the catalogue is a "greater" now: no "most seeds" count left on one run's value
        texts = {claim.text: claim.test for experiment in catalog.experiments().values() for claim in experiment.claims}
        for text in (f"With the family rare, pass@256 on its prompts ends at most {catalog.NEAR} above the start's "
                     f"(sharpening, no discovery; {catalog.NEAR} minus the change)",
                     "... and within RFT"):
            self.assertEqual(texts[text], "greater")

    def test_a_count_needs_its_share_of_seeds_and_reports_wilson(self):
        four = self.verdict([True, True, False, True, True], at_least=0.8)
        self.assertEqual((four["verdict"], four["count"], four["required"]), ("holds", "4 of 5 seeds", 4))
        self.assertEqual(four["interval"], list(stats.wilson_interval(4, 5)))
        self.assertEqual(self.verdict([True, True, False, True, False], at_least=0.8)["verdict"], "does not hold")
        self.assertEqual(self.verdict([True] * 4 + [False])["verdict"], "does not hold")  # every seed by default
        some = self.verdict([False] * 9 + [True], at_least=0.0)  # at_least 0: one seed suffices
        self.assertEqual((some["verdict"], some["count"]), ("holds", "1 of 10 seeds"))

    def test_an_equivalence_holds_inside_the_margin_and_fails_outside(self):
        self.assertEqual(self.verdict([0.001, -0.002, 0.0, 0.002, -0.001], test="within", margin=0.01)["verdict"],
                         "holds")
        self.assertEqual(self.verdict([0.05, 0.06, 0.055, 0.052, 0.058], test="within", margin=0.01)["verdict"],
                         "does not hold")
        self.assertEqual(self.verdict([0.02, -0.02, 0.0, 0.015, -0.01], test="within", margin=0.01)["verdict"],
                         "within noise")

    def test_seeds_without_a_value_are_left_out_and_counted(self):
        verdict = self.verdict([0.1, None, 0.2, 0.15, 0.12], test="greater")
        self.assertEqual((verdict["seeds"], verdict["undefined"], verdict["verdict"]), (4, 1, "holds"))
        self.assertIn("1 left out", claims.count_text(verdict))
        self.assertEqual(verdict["needs"], "interval above 0")

    def test_a_claim_no_seed_has_a_value_for_says_so_instead_of_needing_1_of_0(self):
        for test, margin in (("greater", None), ("count", None), ("within", 0.1)):
            with self.subTest(test=test):
                verdict = self.verdict([None, None, None], test=test, margin=margin)
                self.assertEqual((verdict["seeds"], verdict["undefined"]), (0, 3))
                self.assertEqual(verdict["needs"], "a seed with a value, and none has one")
                self.assertEqual(verdict["verdict"], "within noise")  # a count too: nothing shows it fails
                self.assertTrue(claims.count_text(verdict).endswith("(3 left out: no value)"))

    def test_an_exact_claim_and_the_atlas_table(self):
        exact = claims.check_claim(claims.Check("e", lambda _: 1 + 1 == 2, "exact"), {})
        self.assertEqual((exact["verdict"], exact["count"], exact["kind"]), ("holds", "exact, no seeds", "check"))
        with tempfile.TemporaryDirectory() as folder:
            settings = {"experiment": "x", "seeds": [0, 1, 2, 3, 4], "claims": [
                self.verdict([0.10, 0.20, 0.15, 0.12, 0.18], test="greater"), exact]}
            os.makedirs(os.path.join(folder, "x"))
            with open(os.path.join(folder, "x", "settings.json"), "w", encoding="utf-8") as handle:
                json.dump(settings, handle)
            rows = engine.atlas_rows(folder)
            table = engine.atlas_markdown(rows, held_out=[rows]).splitlines()
            only_checks = engine.atlas_markdown(rows, kinds=("check",)).splitlines()
            counts = engine.verdict_counts(rows)
        self.assertEqual(table[0], "| experiment | kind | claim | needs | verdict (seeds from 0) | mean or share "
                                   "[95% interval] | verdict (seeds from 0) |")
        self.assertTrue(table[2].startswith("| x | claim | c | interval above 0 | holds, 5 of 5 seeds "
                                            "above 0 | mean +0.1500 ["))
        self.assertEqual(table[3], "| x | check | e | exact | holds, exact | exact | holds, exact |")
        self.assertEqual(only_checks[2:], ["| x | check | e | exact | holds, exact | exact |"])
        self.assertEqual(counts, {"check": {"holds": 1, "does not hold": 0, "within noise": 0},
                                  "claim": {"holds": 1, "does not hold": 0, "within noise": 0}})

    def test_two_seed_sets_agree_on_the_verdicts_they_share(self):
        exact = claims.check_claim(claims.Check("e", lambda _: True, "exact"), {})
        holds = self.verdict([0.10, 0.20, 0.15, 0.12, 0.18], test="greater")
        noise = self.verdict([0.10, -0.20, 0.15, -0.12, 0.18], test="greater")
        only_here = {**holds, "claim": "d"}  # judged by one set only: not counted
        self.assertEqual((holds["verdict"], noise["verdict"]), ("holds", "within noise"))
        with tempfile.TemporaryDirectory() as root:
            for folder, verdicts in (("a", [holds, exact, only_here]), ("b", [noise, exact])):
                os.makedirs(os.path.join(root, folder, "x"))
                with open(os.path.join(root, folder, "x", "settings.json"), "w", encoding="utf-8") as handle:
                    json.dump({"experiment": "x", "seeds": [0, 1, 2, 3, 4], "claims": verdicts}, handle)
            first, second = (engine.atlas_rows(os.path.join(root, folder)) for folder in ("a", "b"))
            self.assertEqual(engine.verdict_agreement(first, second), {"claim": (0, 1), "check": (1, 1)})
            self.assertEqual(engine.verdict_agreement(first, first), {"claim": (2, 2), "check": (1, 1)})

    def test_a_run_that_never_reached_the_target_counts_at_its_budget(self):
        # seed 0: both reached (12 - 8); seeds 1-3: the first never reached within 40 iterations; seed 4: neither
        reached = [(12, 8), (None, 10), (None, 30), (None, 25), (None, None)]
        by_seed = {seed: runs_of(a, b) for seed, (a, b) in enumerate(reached)}
        value = claims.difference("iterations_to_0.9", "a", "b")
        self.assertEqual([value(runs) for runs in by_seed.values()], [4, 30, 10, 15, 0])
        self.assertEqual([isinstance(value(runs), claims.AtBudget) for runs in by_seed.values()],
                         [False, True, True, True, True])
        verdict = claims.check_claim(claims.Claim("a needs more iterations", value, "greater"), by_seed)
        self.assertEqual((verdict["seeds"], verdict["undefined"], verdict["at_budget"]), (5, 0, 4))
        self.assertEqual((verdict["agree"], verdict["mean"]), (4, 11.8))
        half = stats.t_quantile(4) * statistics.stdev([4, 30, 10, 15, 0]) / math.sqrt(5)
        self.assertAlmostEqual(verdict["interval"][0], 11.8 - half, places=12)
        self.assertEqual(verdict["verdict"], "within noise")  # the spread of the budgets: the interval crosses 0
        self.assertEqual(claims.count_text(verdict), "4 of 5 seeds above 0 (4 at the budget: a target never reached)")
        # the reversal that dropping such runs hid (updates-per-batch on seeds 100-104): "a reaches the target in
        # fewer iterations" rested on the one seed where a reached it; in the other four a never did
        reversal = {seed: runs_of(a, b) for seed, (a, b) in enumerate([(8, 12), (None, 10), (None, 12), (None, 9),
                                                                        (None, 11)])}
        fewer = claims.Claim("a reaches it first", claims.difference("iterations_to_0.9", "b", "a"), "greater")
        against = claims.check_claim(fewer, reversal)
        self.assertEqual([item["value"] for item in against["per_seed"]], [4, -30, -28, -31, -29])
        self.assertEqual((against["verdict"], against["count"]), ("does not hold", "1 of 5 seeds"))

    def test_runs_with_different_budgets_never_give_a_sign_their_runs_do_not_show(self):
        # tokens to 0.9: each run's budget is what it sampled, so budgets differ between configurations
        def seed(a, a_budget, b, b_budget):
            return {"a": {"tokens_to_0.9": a, "total_tokens_sampled": a_budget},
                    "b": {"tokens_to_0.9": b, "total_tokens_sampled": b_budget}}
        value = claims.difference("tokens_to_0.9", "a", "b")
        self.assertEqual(value(seed(None, 9000, 4000, 30000)), 5000)  # a never reached in 9000: at least 9000
        self.assertEqual(value(seed(None, 3000, 4000, 30000)), 0)  # a stopped at 3000, b reached at 4000: a tie
        self.assertEqual(value(seed(5000, 30000, None, 3000)), 0)  # the same, the other way round
        self.assertEqual(value(seed(None, 3000, None, 30000)), 0)  # neither reached: a tie (not -27000)
        self.assertIsInstance(value(seed(None, 3000, None, 30000)), claims.AtBudget)
        # another metric's None is still left out, and said so
        tail = claims.difference("mean_wrong_length_tail", "a", "b")
        self.assertIsNone(tail({"a": {"mean_wrong_length_tail": None}, "b": {"mean_wrong_length_tail": 3.0}}))

    def test_checks_and_claims_are_named_and_counted_apart(self):
        self.assertEqual((claims.Claim("c", None).kind, claims.Check("c", None).kind), ("claim", "check"))
        verdicts = [claims.check_claim(claim, seeds_of([True] * 3)) for claim in (
            claims.Claim("one", lambda runs: runs["a"]["m"]), claims.Claim("two", lambda runs: not runs["a"]["m"]),
            claims.Check("three", lambda runs: runs["a"]["m"]))]
        self.assertEqual([verdict["kind"] for verdict in verdicts], ["claim", "claim", "check"])
        self.assertEqual(engine.verdicts_counted(verdicts), "Claims (RL effects that could come out either way): 1 "
                         "holds, 1 does not hold. Checks (identities and properties of the code): 1 holds.")


class ExactExpectations(unittest.TestCase):
    def setUp(self):
        self.state = online_tokens.setup()
        generator = torch.Generator().manual_seed(3)
        self.table = torch.randn(self.state.policy.table.shape, dtype=torch.float64, generator=generator)
        self.responses = enumeration.all_responses(self.state.task, 5)

    def test_the_enumeration_covers_every_response_once(self):
        self.assertEqual(self.responses.prompts.numel(), 6 * (1 + 2 + 4 + 8 + 16 + 32))  # EOS after 0..4 digits, or 5
        probabilities = enumeration.token_logps(self.table, self.responses, 1.0).sum(dim=1).exp()
        totals = torch.zeros(6, dtype=torch.float64).index_add_(0, self.responses.prompts, probabilities)
        torch.testing.assert_close(totals, torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-13)
        # a top-p sampler never writes a token outside its nucleus: its responses still sum to 1
        nucleus = enumeration.token_logps(self.table, self.responses, 1.0, top_p=0.8).sum(dim=1).exp()
        totals = torch.zeros(6, dtype=torch.float64).index_add_(0, self.responses.prompts, nucleus)
        torch.testing.assert_close(totals, torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-13)
        self.assertGreater(int((nucleus == 0).sum()), 0)

    def test_on_policy_the_expected_estimate_is_the_exact_gradient(self):
        exact, estimated = enumeration.expected_policy_gradients(self.table, self.responses, 1.0)
        self.assertGreater(exact.norm().item(), 1e-3)
        self.assertLess((estimated - exact).norm().item() / exact.norm().item(), 1e-12)
        self.assertLess(enumeration.policy_gradient_bias(self.table, self.responses, 1.0, 1.0, None, 2.0), 1e-12)

    def test_the_expected_estimate_of_a_mismatched_sampler_matches_monte_carlo(self):
        exact, expected = enumeration.expected_policy_gradients(self.table, self.responses, 1.0, 1.5, None, 2.0)
        # the same estimate averaged over 20000 responses drawn at temperature 1.5, TIS weights capped at 2
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, 6, (20000,), generator=generator)
        samples = TablePolicy(self.table, 1.0, self.state.task.eos_id).sample(prompts, generator, temperature=1.5)
        rewards = self.state.task.rewards(prompts, samples.completion_ids, samples.real, samples.truncated)
        q = enumeration.token_logps(self.table, self.responses, 1.5).sum(dim=1).exp()
        baseline = torch.zeros(6, dtype=torch.float64).index_add_(0, self.responses.prompts, q * self.responses.rewards)
        leaf = self.table.clone().requires_grad_(True)
        logits = TablePolicy(leaf, 1.0, self.state.task.eos_id).logits(prompts, samples.completion_ids)
        logps = torch.where(samples.real, logps_of_tokens(logits, samples.completion_ids), torch.zeros(()))
        weights = (logps.detach() - samples.sampler_logps).exp().clamp(max=2.0) * samples.real
        surrogate = ((rewards - baseline[prompts]) * (weights * logps).sum(dim=1)).mean()
        (sampled,) = torch.autograd.grad(surrogate, leaf)
        self.assertLess(((sampled - expected).norm() / expected.norm()).item(), 0.1)  # Monte Carlo noise only
        self.assertGreater(((sampled - exact).norm() / exact.norm()).item(), 0.2)  # the bias it measures

    def test_expected_wrong_length_matches_the_enumeration(self):
        for length in (5, 10):
            with self.subTest(max_new_tokens=length):
                state = online_tokens.setup(max_new_tokens=length)
                state.policy.table.data.copy_(torch.randn(state.policy.table.shape, dtype=torch.float64,
                                                          generator=torch.Generator().manual_seed(length)))
                responses = enumeration.all_responses(state.task, length)
                probabilities = enumeration.response_probabilities(state, responses)
                wrong = responses.rewards != 1.0
                enumerated = ((probabilities * responses.lengths)[wrong].sum() / probabilities[wrong].sum()).item()
                self.assertAlmostEqual(enumeration.expected_wrong_length(state), enumerated, places=12)


class FlawedAndRandomRewards(unittest.TestCase):
    """spurious-rewards and reward-hacking: their measurements by hand and against a slow reference, and one
    quick run of each."""

    def test_answer_shape_and_pattern_by_hand(self):
        task = countdown_task(8)
        cases = [("3+5-2EOS", False, "n+n-n", "n+"), ("7-6EOS", False, "n-n", "n-"), ("5EOS", False, "n", "n"),
                 ("5+7+EOS", False, "n+n+", "n+"), ("5+5+5+5", True, "n+n+n+n...", "n+")]
        for text, truncated, shape, pattern in cases:
            with self.subTest(text=text):
                tokens = task.encode(text)
                self.assertEqual(runners.answer_shape(task, tokens, truncated), shape)
                self.assertEqual(runners.answer_pattern(task, tokens, truncated), pattern)

    def test_loophole_table_against_pythons_eval(self):
        task = countdown_task(8)
        prompt = next(p for p in task.split_prompts("test").tolist() if len(task.solutions(p)) > 1)
        numbers, target = task.prompt_numbers(prompt), task.prompt_target(prompt)
        hits = {True: 0, False: 0}  # repeats allowed; split by whether a number repeats
        for count in range(2, 5):
            for chosen in itertools.product(numbers, repeat=count):
                for ops in itertools.product("+-", repeat=count - 1):
                    text = str(chosen[0]) + "".join(op + str(n) for op, n in zip(ops, chosen[1:]))
                    if eval(text) == target:  # a slow reference sharing no code with countdown.py
                        hits[len(set(chosen)) < count] += 1
        table = enumeration.loophole_table(task, [prompt])
        self.assertEqual(table["expressions_per_prompt"], 4 ** 2 * 2 + 4 ** 3 * 4 + 4 ** 4 * 8)  # 2336
        self.assertEqual(table["correct_per_prompt"], hits[False])
        self.assertEqual(table["correct_per_prompt"], len(task.solutions(prompt)))
        self.assertEqual(table["proxy_only_per_prompt"], hits[True])
        self.assertEqual(table["violations"], 0)

    def test_quick_runs_measure_what_they_report(self):
        spurious = runners.run_spurious(0, random_reward=0.5, updates_per_batch=4, pattern_samples=1,
                                        **catalog.TRANSFORMER_QUICK)
        metrics = spurious["metrics"]
        self.assertAlmostEqual(metrics["pattern_share_change"],
                               metrics["pattern_share_after"] - metrics["pattern_share_before"], places=12)
        self.assertEqual(len(spurious["curve"]), catalog.TRANSFORMER_QUICK["steps"] + 1)
        self.assertTrue(all(0.0 <= point["pattern_share"] <= 1.0 for point in spurious["curve"][1:]))
        hacking = runners.run_reward_hacking(0, verifier_loophole="reuse", **catalog.TRANSFORMER_QUICK)
        metrics, curve = hacking["metrics"], hacking["curve"][1:]
        self.assertTrue(all(point["proxy_reward_mean"] >= point["true_reward_mean"] for point in curve))
        head = math.fsum(point["reward_gap"] for point in curve) / len(curve)  # 2 iterations: head = tail = all
        self.assertAlmostEqual(metrics["reward_gap_head"], head, places=12)
        self.assertAlmostEqual(metrics["reward_gap_growth"], 0.0, places=12)


class MechanismsAtReducedSize(unittest.TestCase):
    def test_zero_variance_is_predicted_by_the_exact_reward_distribution(self):
        result = runners.run_zero_variance(0, group_size=4, prompts=16, steps=12)
        curve = result["curve"]
        measured = math.fsum(point["zero_group_fraction"] for point in curve) / len(curve)
        predicted = math.fsum(point["predicted_zero_group_fraction"] for point in curve) / len(curve)
        self.assertLess(abs(measured - predicted), 0.1)
        dynamic = runners.run_zero_variance(0, group_size=8, prompts=8, steps=12, dynamic_sampling=True)
        self.assertLess(dynamic["metrics"]["zero_group_fraction"], 0.3)  # the tied groups were resampled away
        self.assertGreater(dynamic["metrics"]["responses_sampled"], 12 * 64)  # and paid for

    def test_more_updates_per_batch_clip_more(self):
        # 4 iterations: eight updates per batch clip 0.67 of the ratios (0.66 over 15); one clips none, and so
        # would eight if the loop took one Adam step per batch whatever updates_per_batch says
        one = runners.run_online(0, algorithm="gspo", updates_per_batch=1, steps=4)["metrics"]
        eight = runners.run_online(0, algorithm="gspo", updates_per_batch=8, steps=4)["metrics"]
        self.assertEqual(one["clip_fraction"], 0.0)  # one step per batch: every ratio is exactly 1
        self.assertGreater(eight["clip_fraction"], 0.1)

    def test_dpo_displacement_measures_its_pairs_against_the_sft_start(self):
        options = {**catalog.DPO_QUICK, "offline": True, "steps": 2}
        still = runners.run_dpo_displacement(0, **options, learning_rate=1e-12)  # the policy stays the SFT start
        moved = runners.run_dpo_displacement(0, **options)
        for result in (still, moved):
            points = [point for point in result["curve"][1:] if point["margin"] is not None]
            self.assertGreaterEqual(len(points), 1)  # the 150-step SFT start answers some prompts right: pairs
            for point in points:
                self.assertAlmostEqual(point["margin"], point["chosen_logp_change"] - point["rejected_logp_change"],
                                       places=5)
                self.assertGreaterEqual(point["pair_distance"], 1)  # a correct and a wrong response differ
            self.assertEqual(result["metrics"]["margin_tail"],
                             math.fsum(point["margin"] for point in points) / len(points))
        for point in still["curve"][1:]:  # the same responses, the same model: every change is float32 rounding
            if point["margin"] is None:
                continue
            self.assertLess(abs(point["chosen_logp_change"]) + abs(point["rejected_logp_change"]), 1e-4)
        self.assertGreater(moved["metrics"]["margin_tail"], 1e-3)  # a DPO step raises the margin of its pairs
        self.assertIsNone(still["curve"][0]["margin"])  # row 0: nothing sampled yet

    def test_negative_samples_claims_read_before_and_after_pairs(self):
        table = catalog.experiments()["negative-samples"]
        names = [catalog.configuration_name(label) for label, _, _ in table.configurations]
        self.assertEqual(names[:3], ["advantage_sign=both beta=0.02", "advantage_sign=positive beta=0.02",
                                     "advantage_sign=negative beta=0.02"])
        runs = {name: {f"test_{metric}_{moment}": None for metric in runners.TRANSFORMER_EVALUATION
                       for moment in ("before", "after")} for name in names}
        for name, after in zip(names, (0.30, 0.40, 0.25, 0.36, 0.30)):  # pass@1 from 0.20
            runs[name].update({"test_pass@1_before": 0.20, "test_pass@1_after": after, "test_pass@16_before": 0.90})
        for name, after in zip(names, (0.91, 0.86, 0.93, 0.89, 0.90)):  # pass@16 from 0.90
            runs[name]["test_pass@16_after"] = after
        values = [claim.value(runs) for claim in table.claims]
        for got, expected in zip(values[:6], (0.20, 0.04, 0.03, 0.05, 0.10, 0.07)):  # NSR's pass@16 change 0.03
            self.assertAlmostEqual(got, expected, places=12)
        self.assertIsNone(values[6])  # no entropy measured (eval_samples 0): the seed has no value
        self.assertAlmostEqual(values[7], 0.07 - 0.01, places=12)  # NSR - PSR at beta 0.02, minus at beta 1
        # the sampled evaluation before and after training draws the same responses: a run that does not move
        # (learning rate 1e-12 in float32) reports pass@1 and the rest unchanged, to the bit
        still = runners.run_transformer(0, **{**catalog.TRANSFORMER_QUICK, "eval_samples": 4, "steps": 1},
                                        advantage_sign="negative", learning_rate=1e-12)["metrics"]
        for key in ("pass@1", "pass@4", "entropy_per_token", "distinct_correct_per_prompt"):
            self.assertEqual(still[f"test_{key}_after"], still[f"test_{key}_before"], key)
        self.assertGreater(still["test_entropy_per_token_before"], 0.0)

    def test_discover_or_sharpen_measures_pass_at_k_and_the_family_as_a_slow_reference_does(self):
        task = countdown_task(8)
        config = sft.SFTConfig(n_layer=1, n_head=2, d_model=16).model_config(task)
        model = TinyLM(config, generator=torch.Generator().manual_seed(0)).eval()  # random: every p is small
        prompts = task.split_prompts("test")[:12].tolist()
        metrics, covered = runners.family_evaluation(model, task, prompts)
        success, subtracting, family = [], [], []
        for prompt in prompts:  # one (prompt, solution) pair per forward pass
            paths = []
            for solution in task.solutions(prompt):
                ids, attention, completion = sft.pair_batch(task, [prompt], [solution])
                with torch.no_grad():
                    log_prob = float(completion_log_probs(model, ids, attention, completion).sum())
                paths.append((math.exp(log_prob), task.vocab.index("-") in solution))
            success.append(math.fsum(p for p, _ in paths))
            subtracting.append(math.fsum(p for p, minus in paths if minus))
            family.append(all(minus for _, minus in paths))
        self.assertTrue(any(family) and not all(family))
        for group, members in (("family", [p for p, f in zip(success, family) if f]),
                               ("other", [p for p, f in zip(success, family) if not f])):
            for k in runners.DISCOVERY_KS:
                self.assertAlmostEqual(metrics[f"{group}_pass@{k}"],
                                       statistics.fmean(1 - (1 - p) ** k for p in members), delta=1e-6)
        self.assertAlmostEqual(metrics["family_share"], math.fsum(subtracting) / math.fsum(success), delta=1e-6)
        self.assertEqual(covered, {prompt for prompt, p in zip(prompts, success) if 1 - (1 - p) ** 256 >= 0.5})
        self.assertEqual(metrics["covered"], len(covered))
        # a run at quick size: its changes are after - before, and the covered sets move by gained - lost
        quick = engine.at_quick_size(catalog.experiments()["discover-or-sharpen"]).configurations[1][2]
        result = runners.run_discover_or_sharpen(0, **quick)["metrics"]
        for name in metrics:
            self.assertEqual(result[f"{name}_change"], result[f"{name}_after"] - result[f"{name}_before"])
        self.assertEqual(result["covered_after"] - result["covered_before"], result["gained"] - result["lost"])
        self.assertEqual(quick["subtraction_share"], 0.03)

    def test_forgetting_measures_the_second_skill_as_a_slow_reference_does(self):
        task = countdown_task(8)
        prompt = task.split_prompts("train")[0].item()
        numbers = task.prompt_numbers(prompt)
        skill_prompt, skill_response = runners.skill_pair(task, prompt)
        self.assertEqual(task.decode(skill_prompt), "BOS" + "".join(map(str, numbers)) + "=")
        self.assertEqual(task.decode(skill_response), "+".join(map(str, numbers)) + "EOS")
        # the token batch is sft.pair_batch's layout for the task's own prompts
        prompts = task.split_prompts("train")[:3].tolist()
        responses = [list(task.solutions(p)[0]) + [task.eos_id] for p in prompts]
        ours = runners.token_pair_batch(task, [(tokens, response) for tokens, response in
                                               zip(task.prompt_tokens(prompts), responses)])
        for mine, theirs in zip(ours, sft.pair_batch(task, prompts, responses)):
            self.assertTrue(torch.equal(mine, theirs))
        # NLL per token and exact success of the skill, against one pair per forward pass
        config = sft.SFTConfig(n_layer=1, n_head=2, d_model=16).model_config(task)
        model = TinyLM(config, generator=torch.Generator().manual_seed(0)).eval()
        pairs = [runners.skill_pair(task, p) for p in prompts]
        nll, success = runners.skill_measures(model, runners.token_pair_batch(task, pairs))
        sums, tokens = [], 0
        for pair in pairs:
            batch = runners.token_pair_batch(task, [pair])
            with torch.no_grad():
                sums.append(float(completion_log_probs(model, *batch).double().sum()))
            tokens += len(pair[1])
        self.assertAlmostEqual(nll, -math.fsum(sums) / tokens, delta=1e-9)
        self.assertAlmostEqual(success, statistics.fmean(math.exp(s) for s in sums), delta=1e-12)
        # by hand: deviations (-1, 0, 1) and (-7/3, -1/3, 8/3): 5 / sqrt(2 * 114 / 9)
        self.assertAlmostEqual(runners.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 7.0]), 5 / math.sqrt(2 * 114 / 9),
                               delta=1e-12)
        self.assertIsNone(runners.pearson([1.0, 1.0], [2.0, 3.0]))
        # one RFT step: none correct, no step; some correct, their NLL falls and only they are counted
        state = runners.transformer_run_from(model, 0, **{**catalog.TRANSFORMER_QUICK, "learning_rate": 1e-3})
        batch = online_tokens.rollout(state)
        before = [value.clone() for value in state.policy.parameters()]
        batch.rewards = torch.zeros_like(batch.rewards)
        self.assertEqual(runners.rft_step(state, batch), 0)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(before, state.policy.parameters())))
        batch.rewards[:3] = 1.0

        def kept_nll():
            with torch.no_grad():
                logps = logps_of_tokens(state.policy.logits(batch.prompts[:3], batch.completion_ids[:3]),
                                        batch.completion_ids[:3])
            return -float((logps * batch.mask[:3]).sum() / batch.mask[:3].sum())

        start = kept_nll()
        self.assertEqual(runners.rft_step(state, batch), 3)
        self.assertLess(kept_nll(), start)
        # the forward KL(pi_0 || pi) on the batch (drawn from pi_0, the reference here), against a slow one: response
        # by response, pi_0's log-probs from the reference model itself rather than the batch's stored ones
        slow = []
        with torch.no_grad():
            for row in range(len(batch.prompts)):
                ids = batch.completion_ids[row:row + 1]
                logp, ref_logp = (logps_of_tokens(model.logits(batch.prompts[row:row + 1], ids), ids)
                                  for model in (state.policy, state.reference))
                slow.append(float(((ref_logp - logp) * batch.mask[row:row + 1]).sum()))
        self.assertGreater(max(map(abs, slow)), 1e-3)  # the step moved the policy
        self.assertAlmostEqual(runners.forward_kl(state, batch), sum(slow) / len(slow), places=5)
        # a run at quick size: the forgetting is the NLL's rise, the KL 0 before any update
        quick = engine.at_quick_size(catalog.experiments()["forgetting"]).configurations[1][2]
        result = runners.run_forgetting(0, **quick)
        metrics, curve = result["metrics"], result["curve"]
        self.assertEqual(quick["arm"], "rft")
        self.assertEqual(len(curve), quick["steps"] + 1)
        self.assertEqual(curve[0]["kl_reference"], 0.0)
        # the forward KL(pi_0 || pi) on pi_0's first batch: 0 at the start (the same weights), then it moves
        self.assertEqual(curve[0]["kl_forward"], 0.0)
        self.assertEqual((metrics["kl_end"], metrics["reverse_kl_end"]), (curve[-1]["kl_forward"], curve[-1]["kl_reference"]))
        self.assertEqual(metrics["forgetting_end"], metrics["skill_nll_end"] - metrics["skill_nll_start"])
        self.assertEqual(metrics["reached"],
                         int(metrics["success_at_gain"] >= metrics["success_start"] + quick["gain"]))

R1_ZERO_QUICK = engine.at_quick_size(catalog.experiments()["r1-zero"]).configurations[0][2]  # the useful arm


class R1Zero(unittest.TestCase):
    def test_r1_zero_measures_what_a_slow_count_of_its_samples_gives(self):
        quick = R1_ZERO_QUICK
        # the quick atlas's run of this arm (seed 0), as its engine ran it (prefetched)
        self.assertEqual(quick_table()["r1-zero"].configurations[0][2], quick)
        result = shared_calls([("test_experiments", "quick_atlas_run", (), {})])[0][2]
        metrics, curve = result["metrics"], result["curve"]
        self.assertEqual([point["step"] for point in curve], [0, 1, 2])
        for name in ("accuracy", "length", "partial_share"):
            self.assertEqual(metrics[f"{name}_change"], metrics[f"{name}_end"] - metrics[f"{name}_start"])
            self.assertEqual(metrics[f"{name}_start"], curve[0][f"test_{name}"])
        self.assertIsNone(curve[0]["batch_length"])  # nothing sampled for training before the first update
        self.assertIsNone(curve[1]["test_accuracy"])  # measured every 2 iterations and at the end
        # the measures against a slow count: the same draw of the start, response by response
        task = runners.r1_zero_task("running", 16)
        model = runners.r1_zero_start(0, "running", quick["skill_steps"], quick["answer_steps"])
        state = runners.transformer_run_from(model, 0, task=task, **{**catalog.TRANSFORMER_QUICK,
                                                                      "max_new_tokens": 16})
        measured = runners.r1_zero_measures(state, 1, torch.Generator().manual_seed(0))
        drawn = state.policy.sample(task.split_prompts("test"), torch.Generator().manual_seed(0))
        correct = partial = right_partial = length = 0
        for prompt, ids, kept, cut in zip(task.split_prompts("test").tolist(), drawn.completion_ids.tolist(),
                                          drawn.real.sum(dim=1).tolist(), drawn.truncated.tolist()):
            tokens = ids[:kept]
            score = task.verify(prompt, tokens, cut)
            writes = tokens.count(task.separator_id) >= 2
            correct, partial, length = correct + score, partial + writes, length + len(tokens)
            right_partial += score * writes
        count = task.prompt_count("test")
        self.assertAlmostEqual(measured["accuracy"], correct / count, delta=1e-12)
        self.assertAlmostEqual(measured["length"], length / count, delta=1e-12)
        self.assertAlmostEqual(measured["partial_share"], partial / count, delta=1e-12)
        if partial:
            self.assertAlmostEqual(measured["accuracy_partial"], right_partial / partial, delta=1e-12)
        self.assertEqual(measured, {name[5:]: value for name, value in curve[0].items() if name[:5] == "test_"})

    def test_the_engine_trains_no_cached_start_for_r1_zero_its_runs_train_their_own(self):
        experiment = catalog.experiments()["r1-zero"]
        self.assertIsNone(runners.SFT_STARTS["run_r1_zero"])
        self.assertEqual(engine.sft_starts([experiment]), [])
        self.assertEqual(engine.sft_folders([experiment]), [])
        # a start per seed: two seeds give two different starts, one seed the same start twice
        first, again, other = (runners.r1_zero_start(seed, "running", 2, 1) for seed in (0, 0, 1))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values())))
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), other.state_dict().values())))


def quick_table():
    """{name: experiment at quick size} of QUICK_EXPERIMENTS."""
    return {name: engine.at_quick_size(catalog.experiments()[name]) for name in QUICK_EXPERIMENTS}


def quick_atlas_run():
    """(seen, folders, r1-zero's first run): the quick experiments run as the program runs them (two workers);
    seen: {name: (seeds, {path: text} of its files, (titled panels, legends, title) of the figure they draw)};
    folders: the SFT cache folders of their starts; the result of r1-zero's first configuration at seed 0, as
    the runner returned it."""
    table, seen, first = quick_table(), {}, {}

    def finished(name, experiment, seeds, jobs, results):
        # here, while the workers run the next experiments: the files, and the figure they draw (built, not
        # saved: CommandLine writes one, test_plot_results checks the bytes)
        files = engine.experiment_files(experiment, seeds, jobs, results, name)
        settings = json.loads(files[os.path.join(name, "settings.json")])
        figure = plot_results.experiment_figure(
            settings, *(plot_results._rows_from_text(files.get(os.path.join(name, file), ""), file)
                        for file in ("summary.csv", "curves.csv", "runs.csv")))
        shown = [axis for axis in figure.axes if axis.get_visible() and axis.get_title()]
        facts = (len(shown), len(figure.legends), figure.get_suptitle())
        plot_results.plt.close(figure)
        seen[name] = (seeds, files, facts)
        if name == "r1-zero":
            first["r1-zero"] = results[0]  # jobs are configuration-major: the first configuration, the first seed

    engine.run_experiments(list(table), 1, 2, finished, report=lambda line: None, table=table)  # two workers
    return seen, engine.sft_folders(table.values(), 1), first["r1-zero"]


def committed_atlas_files():
    """{(atlas folder, name): (command, seeds, {path: text})}: each committed experiment's files as this code
    computes them from its committed runs (runs.csv, curves.csv), on both committed seed sets."""
    computed = {}
    for atlas in ("results-experiments", "results-experiments-start100"):
        for name, experiment in catalog.experiments().items():
            folder = os.path.join(HERE, atlas, name)
            with open(os.path.join(folder, "settings.json"), encoding="utf-8") as handle:
                command = json.load(handle)["command"]
            seeds, jobs, results = engine.results_from_folder(experiment, folder)
            computed[atlas, name] = engine.experiment_files(experiment, seeds, jobs, results, folder, command)
    return computed


# one experiment per runner, the cheapest, for the runs at quick size
QUICK_EXPERIMENTS = ("kl-estimators", "microbatch", "zero-variance", "std-scaling", "sampler-mismatch",
                     "grpo2-vs-dpo", "dpo-label-flips", "chain-lambda", "reward-shift", "padding-bug", "kl-optimum",
                     "entropy-mechanism", "dpo-displacement", "spurious-rewards", "reward-hacking",
                     "discover-or-sharpen", "forgetting", "r1-zero")


def assert_schema(test, experiment, folder, files):
    """The files of one experiment (experiment_files) have its schema: a summary row per configuration with
    every metric's statistics, a run per configuration and seed, its settings, a verdict per claim that
    names its kind, and a summary.md that shows each of them."""
    summary = rows_of(files[os.path.join(folder, "summary.csv")])
    runs = rows_of(files[os.path.join(folder, "runs.csv")])
    settings = json.loads(files[os.path.join(folder, "settings.json")])
    test.assertEqual(len(summary), len(experiment.configurations))
    test.assertEqual(len(runs), len(experiment.configurations) * len(settings["seeds"]))
    for metric in experiment.metrics:
        for stat in ("mean", "std", "min", "max"):
            test.assertIn(f"{metric}_{stat}", summary[0])
    test.assertEqual(settings["experiment"], experiment.name)
    test.assertTrue(settings["claim"] and settings["source"] and settings["seeds_reason"])
    test.assertIn(f"python experiments.py {experiment.name}", settings["command"])
    test.assertEqual(len(settings["claims"]), len(experiment.claims))
    test.assertGreater(len(settings["claims"]), 0)
    markdown = files[os.path.join(folder, "summary.md")]
    for verdict, claim in zip(settings["claims"], experiment.claims):
        test.assertIn(verdict["verdict"], ("holds", "does not hold", "within noise"))
        test.assertEqual(verdict["kind"], claim.kind)
        test.assertRegex(claims.count_text(verdict), r"^(\d+ of \d+ seeds|exact)")
        test.assertIn(f"| {verdict['kind']} | {verdict['verdict']} | {claims.count_text(verdict)} | {verdict['needs']} "
                      f"| {verdict['claim'].replace('|', chr(92) + '|')} |", markdown)
    test.assertIn(engine.verdicts_counted(settings["claims"]), markdown)
    test.assertEqual(markdown.count("\n| "), len(settings["claims"]) + 1 + len(summary) + 1 + sum(
        len(rows) + 1 for _, rows in experiment.tables.values()))


# what each runner hands its options to, to check them without a run
ONLINE_RUNNERS = ("run_online", "run_zero_variance", "run_std_scaling", "run_sampler_mismatch",
                  "run_entropy_mechanism")


def assert_options_are_settings(test, runner, options):
    """A configuration's options are ones its runner takes: the online runners' are online settings (checked
    by online_settings.resolve, as online_tokens.setup does), the bandit's rl_lab.train's arguments."""
    bound = inspect.signature(runners.RUNNERS[runner]).bind(0, **options)  # TypeError: an option it does not take
    passed = bound.arguments.get("options", {})
    if runner in ONLINE_RUNNERS:
        online_settings.resolve(dict(passed))
    elif runner in ("run_transformer", "run_spurious", "run_reward_hacking", "run_discover_or_sharpen",
                    "run_forgetting"):
        online_settings.resolve({**runners.TRANSFORMER, **passed})
    elif runner == "run_r1_zero":  # its own response cap unless the options give one
        online_settings.resolve({**runners.TRANSFORMER, "max_new_tokens": runners.R1_MAX_NEW_TOKENS, **passed})
    elif runner == "run_dpo_displacement":
        online_settings.resolve({**runners.TRANSFORMER, "algorithm": "dpo", **passed})
    elif runner == "run_bandit":
        inspect.signature(rl_lab.train).bind(options["algorithm"], seed=0, **passed)
    else:
        test.assertEqual(passed, {}, runner)


class CommittedAtlas(unittest.TestCase):
    """Every experiment, built without running it: its configurations take options their runners accept (at
    the default and the quick size), and its committed files, on both committed seed sets, are what this
    code computes from the committed runs (runs.csv, curves.csv): the summaries and verdicts, with every
    claim's kind and the runs that never reached a target counted at their budget."""

    def test_every_experiment_is_a_table_row_with_a_kind_for_each_claim_and_a_reason_for_its_seeds(self):
        table = catalog.experiments()
        self.assertEqual(tuple(table), experiments.NAMES)
        for name, experiment in table.items():
            with self.subTest(experiment=name):
                self.assertTrue(experiment.seeds_reason and not experiment.seeds_reason.endswith("."))
                self.assertTrue(all(claim.kind in claims.KINDS for claim in experiment.claims))
                self.assertEqual(len({claim.text for claim in experiment.claims}), len(experiment.claims))
                # a claim about how often a run does something is a rate: past 9 seeds none asks every seed
                # (an identity may: it is a check)
                every_seed = [claim.text for claim in experiment.claims if claim.kind == claims.CLAIM
                              and claim.test == "count" and experiment.seeds > 9
                              and claims.required_seeds(claim.at_least, experiment.seeds) == experiment.seeds]
                self.assertEqual(every_seed, [])
                for size in (experiment, engine.at_quick_size(experiment)):
                    for label, runner, options in size.configurations:
                        assert_options_are_settings(self, runner, options)

    def test_the_ablations_of_the_move_per_batch_scale_the_learning_rate_against_the_updates(self):
        # the policy moves per batch about as far as updates x rate: the ablation keeps the reuse and cuts the
        # move (8 updates at rate / 8 = 1 update at the default), or cuts the reuse and keeps the move
        default = online_settings.OnlineConfig().learning_rate
        self.assertEqual(default, 0.2)
        for name in ("clip-higher", "updates-per-batch"):
            with self.subTest(experiment=name):
                moves = {}
                for label, runner, options in catalog.experiments()[name].configurations:
                    rate = options.get("learning_rate", default)
                    self.assertEqual(label["learning_rate"], rate)  # the label names the rate the run takes
                    if rate != default:
                        moves[options["updates_per_batch"]] = options["updates_per_batch"] * rate
                self.assertEqual(moves, {8: 1 * default, 2: 8 * default})
        std = {(label["scale_rewards"], label["beta"]): options
               for label, _, options in catalog.experiments()["std-scaling"].configurations}
        self.assertEqual(std[("none", 0.0075)], {"scale_rewards": "none", "beta": 0.0075})

    def test_kl_placements_std_ablation_changes_only_the_std_and_measures_the_gaps_shrinkage(self):
        experiment = catalog.experiments()["kl-placement"]
        options = {catalog.configuration_name(label): (label, options)
                   for label, _, options in experiment.configurations}
        bare = [name for name, (label, _) in options.items() if label["scale_rewards"] == "none"]
        self.assertEqual(len(bare), 3)
        for name in bare:  # each run without the std has its twin with it: the same options but the std's
            label, without = options[name]
            twin = catalog.configuration_name({**label, "scale_rewards": "group"})
            self.assertEqual({**options[twin][1], "scale_rewards": "none"}, without)
        # one seed by hand: KL to the reference 1.8 (k3 in the loss), 1.2 (k1 in the reward), 1.9 (none) with
        # the std; 1.0, 0.9, 1.1 without. Gap 0.6 and 0.1; pull 0.7 and 0.2
        kl = dict(zip(["kl=k3 in the loss beta=0.02", "kl=k1 in the reward beta=0.02", "kl=none beta=0.0"],
                      [(1.8, 1.0), (1.2, 0.9), (1.9, 1.1)]))
        runs = {f"{name} scale_rewards={scale}": {"kl_reference": values[index]}
                for name, values in kl.items() for index, scale in enumerate(("group", "none"))}
        # the pull with the std (claim 3), then the gap, its shrinkage, half the gap minus the gap without the
        # std, the pull's shrinkage and the pull without the std
        expected = {2: 0.7, 4: 0.6, 5: 0.5, 6: 0.5 * 0.6 - 0.1, 7: 0.5, 8: 0.2}
        self.assertEqual(len(experiment.claims), 9)
        for index, want in expected.items():
            self.assertAlmostEqual(experiment.claims[index].value(runs), want, places=12, msg=index)

    def test_the_committed_summaries_are_what_the_code_computes_from_the_committed_runs(self):
        computed = shared_calls([("test_experiments", "committed_atlas_files", (), {})])[0]  # prefetched
        for atlas in ("results-experiments", "results-experiments-start100"):
            for name, experiment in catalog.experiments().items():
                folder = os.path.join(HERE, atlas, name)
                with self.subTest(folder=f"{atlas}/{name}"):
                    files = computed[atlas, name]
                    assert_schema(self, experiment, folder, files)
                    for path, text in files.items():
                        with open(path, encoding="utf-8", newline="") as handle:
                            self.assertEqual(handle.read(), text, f"{path}: run python experiments.py {name} "
                                             f"--from-runs{' --seed-start 100' if 'start100' in atlas else ''}")


# A child process runs run_experiments as the program would (under run_cli) over runners that stall or
# die; the test stops it from outside. Each prints "worker <pid>" when its run starts. The child is forked
# from this process (lab.testing.ForkedProgram): a process with its own signals, exit status and workers,
# without the seconds of a fresh interpreter importing torch.
STALLED = None  # Workers' folder: a stalled worker leaves its pid there once it has said it started


def _stall(seed):
    os.write(1, f"worker {os.getpid()}\n".encode())  # one write: workers share the pipe
    open(os.path.join(STALLED, str(os.getpid())), "w").close()
    time.sleep(600)


def _killed(seed):
    os.write(1, f"worker {os.getpid()}\n".encode())  # one write: workers share the pipe
    # the other worker must have said it started before this one dies (else the run may end first, however loaded
    # the machine): the test reads both lines
    deadline = time.monotonic() + 60
    while not any(name.isdigit() and int(name) in _siblings() for name in os.listdir(STALLED)) and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does


def _siblings():
    """The pids of the processes that share this worker's parent (the run's other workers)."""
    parent, pids = os.getppid(), set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == parent:
                        pids.add(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return pids


def _workers_scenario(names):
    runners.RUNNERS.update(stall=_stall, killed=_killed)  # in the child only
    table = {"t": catalog.Experiment("t", "", "", "", [({"n": i}, name, {}) for i, name in enumerate(names)], ["m"],
                                     seeds_reason="a test")}
    engine.run_experiments(["t"], 1, len(names), lambda *args: None, report=print, table=table)
    return 0


class Workers(unittest.TestCase):
    """Every early exit of a run over worker processes ends it at once, with one line, and no worker left."""

    @classmethod
    def setUpClass(cls):
        global STALLED
        cls.stalled = tempfile.TemporaryDirectory(prefix="rl-lab-stalled-")
        STALLED = cls.stalled.name  # before the children are forked: they read it

    @classmethod
    def tearDownClass(cls):
        cls.stalled.cleanup()

    def start(self, runners):
        child = ForkedProgram(lambda: _workers_scenario(runners.split(",")))
        self.addCleanup(child.close)
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
        terminated, interrupted = self.start("stall,stall"), self.start("stall,stall")
        killed = self.start("stall,killed")
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


NAP, IMPORTS = 0.01, 0.05  # seconds: a mocked run, and the mocked imports that the run's clock must leave out


def _nap(seed):
    time.sleep(NAP)
    return {"metrics": {"m": float(seed)}}


# a fresh interpreter (this one imported torch._dynamo long ago) for Timing, started when this file is imported:
# it imports torch beside the tests that run before Timing's
_FRESH_INTERPRETER = subprocess.Popen(
    [sys.executable, "-B", "-c", "import sys, time\nfrom atlas import engine\n"
     "before = 'torch._dynamo' in sys.modules\n"
     "started = time.perf_counter()\n"
     "engine.import_torch_lazy_modules()\n"
     "first = time.perf_counter() - started\n"
     "started = time.perf_counter()\n"
     "engine.import_torch_lazy_modules()\n"
     "print(before, 'torch._dynamo' in sys.modules, first > 10 * (time.perf_counter() - started))\n"],
    cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class Timing(unittest.TestCase):
    """A run's seconds (the progress lines, the totals, --timings) are the run's own: not a process's
    one-time imports, which took seconds in the first run of every worker."""

    @classmethod
    def setUpClass(cls):
        cls.fresh = _FRESH_INTERPRETER

    @classmethod
    def tearDownClass(cls):
        if cls.fresh.poll() is None:
            cls.fresh.kill()
        cls.fresh.communicate()

    def test_the_first_optimizer_of_a_process_imports_what_the_clock_leaves_out(self):
        stdout, stderr = self.fresh.communicate(timeout=120)
        self.assertEqual(stdout.split(), ["False", "True", "True"], stderr)

    def test_a_runs_seconds_leave_out_the_imports_in_one_process_and_over_workers(self):
        table = {"t": catalog.Experiment("t", "", "", "", [({"n": 0}, "nap", {}), ({"n": 1}, "nap", {})], ["m"],
                                         seeds_reason="a test")}
        with mock.patch.dict(runners.RUNNERS, nap=_nap), \
                mock.patch.object(engine, "import_torch_lazy_modules", side_effect=lambda: time.sleep(IMPORTS)):
            index, seconds, result = engine._run_job(("t", 3, {"n": 0}, 2, "nap", {}))
            self.assertEqual((index, result), (3, {"metrics": {"m": 2.0}}))
            self.assertGreaterEqual(seconds, NAP)
            self.assertLess(seconds, IMPORTS)  # the imports before the clock are not in it
            for jobs in (1, 2):  # in this process, and in forked workers
                lines = []
                totals = engine.run_experiments(["t"], 2, jobs, lambda *args: None, report=lines.append,
                                                     table=table)
                with self.subTest(jobs=jobs):
                    self.assertEqual(len(lines), 4)
                    self.assertGreaterEqual(totals["t"], 4 * NAP)
                    # with the imports the four runs would take at least 4 x (NAP + IMPORTS) = 0.24 s
                    self.assertLess(totals["t"], 4 * NAP + 0.12)


def _die_by_sigkill():
    os.kill(os.getpid(), signal.SIGKILL)


class HandOver(unittest.TestCase):
    def test_a_job_for_a_worker_that_died_is_the_line_saying_how_it_ended(self):
        context = multiprocessing.get_context("fork")
        ours, theirs = context.Pipe()
        process = context.Process(target=_die_by_sigkill, daemon=True)
        process.start()
        process.join()
        theirs.close()  # as _results_from_workers does: the dead worker held the only other end
        with self.assertRaisesRegex(ChildProcessError, rf"worker process {process.pid} ended by SIGKILL"):
            engine._hand_over(ours, ("job",), process)  # a BrokenPipeError would read as a closed stdout
        ours.close()


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

    def test_an_sft_cache_that_cannot_be_written_is_refused_before_any_run(self):
        cwd = os.getcwd()
        self.addCleanup(os.chdir, cwd)
        os.chdir(self.tmp.name)  # the quick transformer runs train their SFT start into ./results-sft/quick
        for make in (lambda: os.symlink("/nonexistent-rl-lab-target", "results-sft"),  # dangling: never followed
                     lambda: open("results-sft", "w").close()):
            make()
            code, stdout, stderr = run_main(experiments.main, ["passk-narrowing", "--quick", "--seeds", "1",
                                                               "--output", "out"])
            self.assertEqual((code, stdout), (2, ""))
            self.assertIn("the SFT cache of its transformer runs): 'results-sft' exists and is not a folder", stderr)
            self.assertEqual(sorted(os.listdir(".")), ["results-sft"])
            self.assertFalse(os.path.lexists("/nonexistent-rl-lab-target"))
            os.remove("results-sft")

    def test_help_and_a_bad_name_answer_before_torch_is_imported(self):
        # the torch-free copies in experiments.py are the catalogue's own
        self.assertEqual(experiments.NAMES, tuple(catalog.experiments()))
        self.assertEqual(experiments.DEFAULT_SEEDS, catalog.DEFAULT_SEEDS)
        self.assertEqual(experiments.QUICK_STEPS, engine.QUICK_STEPS)
        script = ("import sys, experiments\n"
                  "for argv in (['--help'], ['no-such-experiment'], ['kl-estimators', '--seeds', '0']):\n"
                  "    try:\n"
                  "        experiments.main(argv)\n"
                  "    except SystemExit as stop:\n"
                  "        print(stop.code, 'torch' in sys.modules)\n")
        done = subprocess.run([sys.executable, "-B", "-c", script], cwd=HERE, capture_output=True, text=True,
                              timeout=60)
        self.assertEqual(done.stdout.splitlines()[-3:], ["0 False", "2 False", "2 False"], done.stderr)
        self.assertIn("no experiment 'no-such-experiment'", done.stderr)

    def test_from_runs_rewrites_a_folder_from_its_runs_alone(self):
        committed = os.path.join(HERE, "results-experiments", "kl-estimators")
        out = os.path.join(self.tmp.name, "atlas")
        os.makedirs(os.path.join(out, "kl-estimators"))
        for name in ("runs.csv", "settings.json"):  # the runs, and the command that made them
            shutil.copy(os.path.join(committed, name), os.path.join(out, "kl-estimators", name))
        code, stdout, stderr = run_main(experiments.main, ["kl-estimators", "--from-runs", "--output", out])
        self.assertEqual((code, stderr), (0, ""))
        self.assertNotIn("ETA", stdout)  # nothing ran
        for name in sorted(os.listdir(committed)):
            with self.subTest(file=name), open(os.path.join(committed, name), "rb") as handle:
                with open(os.path.join(out, "kl-estimators", name), "rb") as written:
                    self.assertEqual(written.read(), handle.read())
        os.makedirs(os.path.join(out, "microbatch"))
        for argv, message in ((["microbatch"], "no runs to read in"),
                              (["kl-estimators", "--timings", os.path.join(self.tmp.name, "t.json")], "--timings")):
            with self.subTest(argv=argv):
                code, stdout, stderr = run_main(experiments.main, argv + ["--from-runs", "--output", out])
                self.assertEqual((code, stdout, len(stderr.splitlines())), (2, "", 1))
                self.assertIn(message, stderr)
        self.assertEqual(os.listdir(os.path.join(out, "microbatch")), [])

    def test_list_names_every_experiment(self):
        code, stdout, _ = run_main(experiments.main, ["--list"])
        self.assertEqual(code, 0)
        names = [line.split()[0] for line in stdout.splitlines()]
        self.assertEqual(names, list(catalog.experiments()))
        for required in ("kl-estimators", "reduction-length-bias", "std-scaling", "zero-variance", "clip-higher",
                         "updates-per-batch", "sampler-mismatch", "microbatch", "grpo2-vs-dpo", "four-algorithms",
                         "dpo-label-flips", "group-size", "chain-lambda", "reward-shift", "sparse-reward"):
            self.assertIn(required, names)

    def test_one_experiment_writes_its_files_and_the_same_bytes_whatever_the_jobs(self):
        # figure.svg is drawn from the other files alone (by name and text): a run whose files are the first
        # run's gets the first run's drawing, and the bytes of every file are still compared below
        drawn, draw = {}, plot_results.experiment_figure_bytes

        def draw_once(files, extension):
            key = (extension, tuple(sorted((os.path.basename(path), text) for path, text in files.items())))
            if key not in drawn:
                drawn[key] = draw(files, extension)
            return drawn[key]

        outputs = []
        for jobs in ("1", "2"):
            out = os.path.join(self.tmp.name, f"jobs{jobs}")
            with mock.patch.object(plot_results, "experiment_figure_bytes", draw_once):
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
        self.assertEqual(len(drawn), 1)  # the second run's files were the first's: one figure drawn

    def test_another_seed_start_writes_another_folder_with_those_seeds(self):
        self.assertEqual(experiments.default_output(), "results-experiments")
        self.assertEqual(experiments.default_output(None, 100), "results-experiments-start100")
        self.assertEqual(experiments.default_output(3, 100, True), "results-experiments-seeds3-start100-quick")
        previous = os.getcwd()
        os.chdir(self.tmp.name)  # the default folder is relative to where the command runs
        self.addCleanup(os.chdir, previous)
        code, stdout, stderr = run_main(experiments.main, ["kl-estimators", "--seeds", "3", "--seed-start", "100",
                                                           "--jobs", "1"])
        self.assertEqual((code, stderr), (0, ""))
        self.assertIn("verdicts:", stdout)
        self.assertEqual(os.listdir(self.tmp.name), ["results-experiments-seeds3-start100"])
        folder = os.path.join(self.tmp.name, "results-experiments-seeds3-start100", "kl-estimators")
        with open(os.path.join(folder, "settings.json"), encoding="utf-8") as handle:
            settings = json.load(handle)
        self.assertEqual(settings["seeds"], [100, 101, 102])
        self.assertEqual(settings["command"], "python experiments.py kl-estimators --seeds 3 --seed-start 100")
        with open(os.path.join(folder, "runs.csv"), encoding="utf-8", newline="") as handle:
            runs = list(csv.DictReader(handle))
        self.assertEqual([int(row["seed"]) for row in runs], [100, 101, 102] * 2)
        self.assertEqual([verdict["seeds"] for verdict in settings["claims"]], [3, 0, 3, 3, 3])  # 0: the exact check
        # the same seeds give the same numbers whatever the start: seed 100 here is run_kl_estimators(100)
        self.assertEqual(float(runs[0]["k2_relative_bias"]),
                         runners.run_kl_estimators(100, "near")["metrics"]["k2_relative_bias"])


class WorkersRunEveryRunnerAtQuickSize(unittest.TestCase):
    """The cheapest experiment of each runner, run as the program runs them, over two workers (last in this file:
    its runs are prefetched beside the tests before it)."""

    def test_one_experiment_per_runner_writes_its_schema_at_quick_size(self):
        # the cheapest experiment of each runner, run as the program runs them (two workers; quick_atlas_run,
        # prefetched); every other experiment is checked without a run, against its committed runs (CommittedAtlas)
        table = quick_table()
        # every runner, and the engine's own: the SFT starts, trained before the runs (one per seed and setting)
        self.assertEqual({runner for experiment in table.values() for _, runner, _ in experiment.configurations},
                         set(runners.RUNNERS) - {"train_sft_start"})
        starts = engine.sft_starts(table.values(), 1)
        self.assertEqual({start["config"]["seed"] for start in starts}, {0})
        # discover-or-sharpen's three shares, the default start at 20 and (dpo-displacement) 150 steps; forgetting
        # trains its own inside its runs
        self.assertEqual(sorted((str(start["config"]["subtraction_share"]), start["config"]["steps"]) for start in starts),
                         [("0.0", 20), ("0.03", 20), ("0.5", 20), ("None", 20), ("None", 150)])
        self.assertEqual([start["config"]["seed"] for start in engine.sft_starts([table["padding-bug"]], 3, 100)],
                         [100, 101, 102])
        seen, folders, _ = shared_calls([("test_experiments", "quick_atlas_run", (), {})])[0]
        self.assertEqual(sorted(seen), sorted(table))
        self.assertEqual(folders, engine.sft_folders(table.values(), 1))
        for folder in folders:  # each start trained once, cached for the runs
            self.assertTrue(os.path.isfile(os.path.join(folder, "model.pt")), folder)
        for name, (seeds, files, (panels_shown, legends, title)) in seen.items():
            with self.subTest(experiment=name):
                self.assertEqual(seeds, [0])
                assert_schema(self, table[name], name, files)
                self.assertTrue(engine.command_of(name, None, 100).endswith("--seed-start 100"))
                # its figure draws from these files: every panel's columns, metrics and claims exist
                settings = json.loads(files[os.path.join(name, "settings.json")])
                self.assertEqual(panels_shown, len(plot_results._panels_of(settings)))  # each titled, no empty slot
                self.assertEqual(legends, 1)
                self.assertTrue(title.startswith(f"{name}: "), title)


# the slowest tests' work, computed beside the tests before them, in the order the tests need it: the committed
# atlas recomputed from its runs, the quick atlas (with two workers of its own)
prefetch([("test_experiments", "committed_atlas_files", (), {})])
prefetch([("test_experiments", "quick_atlas_run", (), {})])


if __name__ == "__main__":
    unittest.main()
