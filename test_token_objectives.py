"""Tests of token_objectives.py: the causal shift, EOS/PAD, the reductions, the one-step facts of
each objective, the lesson's trace, and the CLI.

    python -m unittest -v test_token_objectives
"""

import json
import math
import os
import tempfile
import unittest

import torch

import token_objectives
from lab.io import json_text
from lab.testing import float64, run_main, single_thread_module
from rl_lab import DTYPE, completion_mask

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train
t = float64


# ---------------------------------------------------------------------------------------------
# Token-sequence objectives (token_objectives.py)
# ---------------------------------------------------------------------------------------------


_TOKEN_REPORT = []


def token_report():
    """run() is deterministic, so the report shared by several tests is computed once."""
    if not _TOKEN_REPORT:
        _TOKEN_REPORT.append(token_objectives.run())
    return _TOKEN_REPORT[0]


def seeded_tables(seed=3):
    """(actor, old, reference) 5x5 tables that differ, so ratios are not 1 and the KL is not 0."""
    generator = torch.Generator().manual_seed(seed)
    reference = 0.5 * torch.randn(5, 5, generator=generator, dtype=DTYPE)
    old = reference + 0.5 * torch.randn(5, 5, generator=generator, dtype=DTYPE)
    actor = old + 0.5 * torch.randn(5, 5, generator=generator, dtype=DTYPE)
    return actor, old, reference


def slow_token_objectives(actor, old, reference, ids, mask):
    """Python-loop reference of the fixture objectives: plain floats, one token at a time."""
    def log_softmax_row(row):
        top = max(row)
        log_norm = top + math.log(sum(math.exp(value - top) for value in row))
        return [value - log_norm for value in row]

    actor, old, reference = actor.tolist(), old.tolist(), reference.tolist()
    ids, mask = ids.tolist(), mask.tolist()
    advantage = 0.5 / (0.5 + 1e-8)  # rewards [1, 0]: mean 0.5, population std 0.5
    advantages = [advantage, -advantage]
    grpo_rows, cispo_rows, all_grpo_tokens, sequence, ref_sequence = [], [], [], [], []
    for b in range(len(ids)):
        grpo_tokens, cispo_tokens, seq, ref_seq = [], [], 0.0, 0.0
        for position in range(1, len(ids[b])):
            if not mask[b][position]:
                continue
            previous, token = ids[b][position - 1], ids[b][position]
            logp_row = log_softmax_row(actor[previous])
            ref_row = log_softmax_row(reference[previous])
            logp, old_logp, ref_logp = logp_row[token], log_softmax_row(old[previous])[token], ref_row[token]
            ratio = math.exp(logp - old_logp)
            a = advantages[b]
            clipped = min(max(ratio, 0.8), 1.2)
            kl = sum(math.exp(p) * (p - q) for p, q in zip(logp_row, ref_row))
            grpo_tokens.append(-min(ratio * a, clipped * a) + 0.03 * kl)
            cispo_tokens.append(-min(ratio, 5.0) * a * logp + 0.03 * kl)
            seq += logp
            ref_seq += ref_logp
        grpo_rows.append(sum(grpo_tokens) / len(grpo_tokens))
        cispo_rows.append(sum(cispo_tokens) / len(cispo_tokens))
        all_grpo_tokens += grpo_tokens
        sequence.append(seq)
        ref_sequence.append(ref_seq)
    margin = (sequence[0] - sequence[1]) - (ref_sequence[0] - ref_sequence[1])
    return {
        "dpo": math.log1p(math.exp(-0.5 * margin)),
        "grpo": sum(grpo_rows) / len(grpo_rows),
        "cispo": sum(cispo_rows) / len(cispo_rows),
        "global_token_loss": sum(all_grpo_tokens) / len(all_grpo_tokens),
        "grpo_per_response": grpo_rows,
        "relative_margin": margin,
    }


class TokenObjectives(unittest.TestCase):
    # --- alignment: causal shift, EOS = PAD ---------------------------------------------------

    def test_fixture_scores_the_real_eos_and_not_the_pad(self):
        ids, mask = token_objectives.fixture()
        self.assertEqual(ids.tolist(), [[0, 1, 2, 4, 4], [0, 1, 3, 3, 4]])
        zeros = torch.zeros(5, 5, dtype=DTYPE)
        out = token_objectives.objectives(zeros, zeros, zeros, ids, mask)
        self.assertEqual(out["lengths"].tolist(), [2, 3])
        self.assertEqual(out["valid"].tolist(), [[False, True, True, False], [False, True, True, True]])
        ln5 = math.log(5.0)
        for b, row in enumerate(out["token_logps"].tolist()):
            for position, value in enumerate(row):
                expected = -ln5 if out["valid"][b, position] else 0.0
                self.assertAlmostEqual(value, expected, delta=1e-15)
        self.assertEqual(out["sequence_logps"].tolist(), token_report()["alignment"]["sequence_logps"])
        self.assertAlmostEqual(out["sequence_logps"][0].item(), -2 * ln5, delta=1e-14)
        self.assertAlmostEqual(out["sequence_logps"][1].item(), -3 * ln5, delta=1e-14)
        published = [round(value, 6) for value in token_report()["alignment"]["sequence_logps"]]
        self.assertEqual(published, [-3.218876, -4.828314])
        for value in out["mean_logps"].tolist():
            self.assertAlmostEqual(value, -ln5, delta=1e-15)

    def test_mask_that_drops_every_eos_id_shifts_both_rows_by_ln5(self):
        ids, mask = token_objectives.fixture()
        zeros = torch.zeros(5, 5, dtype=DTYPE)
        good = token_objectives.objectives(zeros, zeros, zeros, ids, mask)
        buggy = token_objectives.objectives(zeros, zeros, zeros, ids, mask & (ids != 4))
        self.assertEqual(buggy["lengths"].tolist(), [1, 2])
        shift = (buggy["sequence_logps"] - good["sequence_logps"]).tolist()
        for value in shift:
            self.assertAlmostEqual(value, math.log(5.0), delta=1e-14)
        bug = token_report()["eos_pad_bug"]
        self.assertEqual(bug["lengths"], [1, 2])
        self.assertEqual(bug["sequence_logp_shift"], shift)

    def test_appending_pad_columns_changes_no_loss_and_no_gradient(self):
        actor, old, reference = seeded_tables()
        names = ("dpo", "grpo", "cispo", "global_token_loss")

        def losses_and_gradients(extra_padding):
            ids, mask = token_objectives.fixture(extra_padding)
            results = {}
            for name in names:
                leaf = actor.clone().requires_grad_(True)
                out = token_objectives.objectives(leaf, old, reference, ids, mask)
                (gradient,) = torch.autograd.grad(out[name], leaf)
                results[name] = (out[name].item(), gradient)
            return results

        base = losses_and_gradients(0)
        self.assertGreater(base["grpo"][1].abs().max().item(), 1e-3)  # the gradients compared are not trivial
        for extra_padding in (1, 4, 9):
            padded = losses_and_gradients(extra_padding)
            for name in names:
                with self.subTest(extra_padding=extra_padding, objective=name):
                    self.assertAlmostEqual(padded[name][0], base[name][0], delta=1e-15)
                    self.assertLessEqual((padded[name][1] - base[name][1]).abs().max().item(), 1e-15)
        invariance = token_report()["padding_invariance"]
        self.assertEqual((invariance["max_abs_loss_difference"], invariance["max_abs_gradient_difference"]), (0.0, 0.0))

    def test_objectives_match_a_python_loop_reference(self):
        actor, old, reference = seeded_tables()
        ids, mask = token_objectives.fixture()
        out = token_objectives.objectives(actor, old, reference, ids, mask)
        slow = slow_token_objectives(actor, old, reference, ids, mask)
        for name in ("dpo", "grpo", "cispo", "global_token_loss", "relative_margin"):
            self.assertAlmostEqual(out[name].item(), slow[name], delta=1e-12, msg=name)
        for fast, reference_value in zip(out["grpo_per_response"].tolist(), slow["grpo_per_response"]):
            self.assertAlmostEqual(fast, reference_value, delta=1e-12)

    def test_old_and_reference_never_receive_gradient(self):
        actor, old, reference = seeded_tables()
        actor.requires_grad_(True)
        old.requires_grad_(True)
        reference.requires_grad_(True)
        ids, mask = token_objectives.fixture()
        out = token_objectives.objectives(actor, old, reference, ids, mask)
        (out["dpo"] + out["grpo"] + out["cispo"] + out["global_token_loss"]).backward()
        self.assertIsNone(old.grad)
        self.assertIsNone(reference.grad)
        self.assertGreater(actor.grad.abs().max().item(), 1e-3)

    # --- the one-step facts of each objective ------------------------------------------------------------

    def test_one_sgd_step_reproduces_the_published_facts(self):
        report = token_report()
        self.assertEqual(report["alignment"]["lengths"], [2, 3])
        self.assertAlmostEqual(report["dpo"]["initial_loss"], math.log(2.0), delta=1e-15)
        self.assertAlmostEqual(report["dpo"]["final_loss"], 0.668435, delta=5e-7)
        self.assertAlmostEqual(report["dpo"]["gradient_norm"], 0.5, delta=1e-12)
        self.assertAlmostEqual(report["grpo"]["initial_loss"], 0.0, delta=1e-12)
        self.assertAlmostEqual(report["grpo"]["gradient_norm"], 0.414997, delta=5e-7)
        self.assertAlmostEqual(report["grpo"]["final_loss"], -0.017285, delta=5e-7)
        self.assertAlmostEqual(report["cispo"]["initial_loss"], 0.0, delta=1e-12)
        self.assertAlmostEqual(report["cispo"]["final_loss"], 0.010463, delta=5e-7)
        for name in ("dpo", "grpo", "cispo"):
            with self.subTest(objective=name):
                self.assertEqual(report[name]["relative_margin_before"], 0.0)
                self.assertGreater(report[name]["relative_margin_after"], 0.05)  # the step favours the chosen answer

    def test_per_response_and_global_token_reductions_give_0_and_0_2(self):
        report = token_report()
        advantage = 0.5 / (0.5 + 1e-8)  # group_advantages' epsilon 1e-8 makes it 1 - 2e-8
        self.assertEqual(report["reduction"]["token_counts"], [2, 3])
        per_response = report["reduction"]["per_response_grpo_losses"]
        self.assertAlmostEqual(per_response[0], -advantage, delta=1e-15)
        self.assertAlmostEqual(per_response[1], advantage, delta=1e-15)
        self.assertAlmostEqual(report["reduction"]["per_response_mean"], 0.0, delta=1e-15)  # (-1 + 1) / 2
        self.assertAlmostEqual(report["initial_global_token_loss"], (-2 + 3) * advantage / 5, delta=1e-15)
        self.assertAlmostEqual(report["initial_global_token_loss"], 0.2, delta=1e-8)  # (-2 + 3) / 5 up to the epsilon

    def test_cispo_takes_grpo_step_at_ratio_one_and_differs_on_clipped_tokens(self):
        report = token_report()
        self.assertEqual(report["cispo_vs_grpo"]["gradient_max_abs_difference"], 0.0)
        self.assertEqual(report["cispo_vs_grpo"]["parameter_max_abs_difference_after_step"], 0.0)
        self.assertEqual(report["cispo"]["gradient_norm"], report["grpo"]["gradient_norm"])
        # same parameters after the step, yet another loss value: the CISPO number is not GRPO's surrogate
        self.assertGreater(report["cispo"]["final_loss"] - report["grpo"]["final_loss"], 0.02)
        # prompt -> good now has ratio 5e/(4+e) ~ 2.02 (A > 0) and prompt -> bad 5/(4+e) ~ 0.74 (A < 0):
        # both clipped, so GRPO keeps only the KL gradient on the prompt row; the other rows stay at ratio 1
        ids, mask = token_objectives.fixture()
        zeros = torch.zeros(5, 5, dtype=DTYPE)
        actor = zeros.clone()
        actor[token_objectives.PROMPT, token_objectives.GOOD] = 1.0
        gradients = {}
        for name in ("grpo", "cispo"):
            leaf = actor.clone().requires_grad_(True)
            out = token_objectives.objectives(leaf, zeros, zeros, ids, mask)
            (gradients[name],) = torch.autograd.grad(out[name], leaf)
        ratio = out["token_logps"].detach().exp() * 5.0  # old = uniform: ratio = p / (1/5)
        self.assertAlmostEqual(ratio[0, 1].item(), 5 * math.e / (4 + math.e), delta=1e-12)
        self.assertAlmostEqual(ratio[1, 1].item(), 5 / (4 + math.e), delta=1e-12)
        prompt = token_objectives.PROMPT
        self.assertGreater((gradients["grpo"][prompt] - gradients["cispo"][prompt]).abs().max().item(), 0.05)
        others = [row for row in range(5) if row != prompt]
        self.assertLessEqual((gradients["grpo"][others] - gradients["cispo"][others]).abs().max().item(), 1e-15)
        kl_leaf = actor.clone().requires_grad_(True)
        kl_out = token_objectives.objectives(kl_leaf, zeros, zeros, ids, mask)
        kl_only = 0.03 * (kl_out["kl_exact"] * kl_out["valid"]).sum(dim=1).div(kl_out["lengths"]).mean()
        (kl_gradient,) = torch.autograd.grad(kl_only, kl_leaf)
        self.assertLessEqual((gradients["grpo"][prompt] - kl_gradient[prompt]).abs().max().item(), 1e-15)

    # --- the lesson trace -------------------------------------------------------------------------

    def test_completion_mask_keeps_first_eos_and_rows_without_eos_up_to_padding(self):
        ids = torch.tensor([[3, 5, 5, 5], [4, 4, 5, 5], [3, 5, 3, 4], [3, 3, 4, 5], [4, 3, 4, 4], [5, 5, 5, 5]])
        pad_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
        expected = [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
        self.assertEqual(completion_mask(ids, 5, pad_mask).tolist(), expected)
        self.assertEqual(completion_mask(ids, 5).tolist()[3], [1, 1, 1, 1])  # no pad mask: the last 5 is an EOS
        trace = token_report()["trace"]
        self.assertEqual(trace["completion_mask"], [
            [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1],
            [1, 1, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0],
        ])

    def test_trace_matches_a_hand_computation(self):
        trace = token_report()["trace"]
        self.assertEqual(trace["grouped_rewards"], [[1.0, 0.0, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0]])
        # group 0 by hand: mean 0.375, population std sqrt(0.6875 / 4)
        group = [1.0, 0.0, 0.5, 0.0]
        mean = sum(group) / 4
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 4)
        self.assertEqual(mean, 0.375)
        self.assertAlmostEqual(std, math.sqrt(0.171875), delta=1e-15)
        self.assertAlmostEqual(trace["group_mean"][0], mean, delta=1e-15)
        self.assertAlmostEqual(trace["group_std"][0], std, delta=1e-15)
        for got, r in zip(trace["advantages"][:4], group):
            self.assertAlmostEqual(got, (r - mean) / (std + 1e-4), delta=1e-12)
        self.assertEqual(trace["advantages"][4:], [0.0, 0.0, 0.0, 0.0])  # the degenerate group: exact zeros
        self.assertEqual((trace["group_mean"][1], trace["group_std"][1]), (1.0, 0.0))
        # losses by a Python loop over every kept token of both groups
        kept = trace["completion_mask"]
        grpo_rows, cispo_rows, ratios, k3s = [], [], [], []
        for i, row in enumerate(kept):
            grpo_tokens, cispo_tokens = [], []
            a = trace["advantages"][i]
            for j, keep in enumerate(row):
                if not keep:
                    continue
                logp, old, ref = trace["current_logps"][i][j], trace["old_logps"][i][j], trace["ref_logps"][i][j]
                ratio = math.exp(logp - old)
                k3 = math.exp(ref - logp) - (ref - logp) - 1
                grpo_tokens.append(-(min(ratio * a, min(max(ratio, 0.8), 1.2) * a) - 0.1 * k3))
                cispo_tokens.append(-(min(ratio, 5.0) * a * logp - 0.1 * k3))
                ratios.append(ratio)
                k3s.append(k3)
            grpo_rows.append(sum(grpo_tokens) / len(grpo_tokens))
            cispo_rows.append(sum(cispo_tokens) / len(cispo_tokens))
        self.assertAlmostEqual(trace["grpo_loss"], sum(grpo_rows) / 8, delta=1e-12)
        self.assertAlmostEqual(trace["cispo_loss"], sum(cispo_rows) / 8, delta=1e-12)
        self.assertAlmostEqual(trace["ratio_min"], min(ratios), delta=1e-12)
        self.assertAlmostEqual(trace["ratio_max"], max(ratios), delta=1e-12)
        self.assertAlmostEqual(trace["kl_mean"], sum(k3s) / len(k3s), delta=1e-12)

    def test_trace_ratios_differ_from_1_and_are_clipped_on_both_sides(self):
        trace = token_report()["trace"]
        kept_ratios = [(trace["ratio"][i][j], trace["advantages"][i])
                       for i, row in enumerate(trace["completion_mask"]) for j, keep in enumerate(row) if keep]
        self.assertTrue(all(0.5 <= ratio <= 2.0 for ratio, _ in kept_ratios))
        self.assertTrue(any(ratio > 1.2 and a > 0 for ratio, a in kept_ratios))
        self.assertTrue(any(ratio < 0.8 and a < 0 for ratio, a in kept_ratios))
        self.assertTrue(any(abs(ratio - 1.0) < 0.2 and a != 0 for ratio, a in kept_ratios))
        self.assertTrue(all(abs(abs(ratio - 1.0) - 0.2) > 0.01 for ratio, _ in kept_ratios))  # none on a clip edge

    def test_trace_clipped_token_has_zero_grpo_policy_gradient_and_nonzero_cispo(self):
        trace = token_report()["trace"]
        clip = trace["clipped_token"]
        i, j = clip["row"], clip["position"]
        self.assertEqual(trace["completion_mask"][i][j], 1)
        self.assertGreater(clip["ratio"], 1.2)
        self.assertGreater(clip["advantage"], 0.0)
        length = sum(trace["completion_mask"][i])
        self.assertEqual(clip["grpo_policy_term_gradient"], 0.0)
        self.assertAlmostEqual(clip["cispo_policy_term_gradient"], -clip["ratio"] * clip["advantage"] / (8 * length),
                               delta=1e-15)
        logp, ref = trace["current_logps"][i][j], trace["ref_logps"][i][j]
        k3_gradient = 0.1 * (1.0 - math.exp(ref - logp)) / (8 * length)  # d/dlogp of beta * k3, reduced
        self.assertAlmostEqual(clip["grpo_gradient"], k3_gradient, delta=1e-15)
        self.assertAlmostEqual(clip["cispo_gradient"], clip["cispo_policy_term_gradient"] + k3_gradient, delta=1e-15)

    # --- arguments, global state, command line ----------------------------------------------------

    def test_rejects_bad_arguments_naming_them(self):
        for value in (True, 1.0, -1, 4097):
            with self.subTest(extra_padding=value), self.assertRaisesRegex(ValueError, "extra_padding"):
                token_objectives.fixture(value)
        ids, mask = token_objectives.fixture()
        zeros = torch.zeros(5, 5, dtype=DTYPE)
        cases = [
            ("actor", (torch.zeros(5, 4, dtype=DTYPE), zeros, zeros, ids, mask)),
            ("old", (zeros, torch.zeros(4, 4, dtype=DTYPE), zeros, ids, mask)),
            ("reference", (zeros, zeros, zeros.float(), ids, mask)),
            ("input_ids", (zeros, zeros, zeros, torch.cat([ids, ids[:1]]), torch.cat([mask, mask[:1]]))),
            ("input_ids", (zeros, zeros, zeros, ids.clamp(max=3) + 2, mask)),
            ("input_ids", (zeros, zeros, zeros, ids.double(), mask)),
            ("response_mask", (zeros, zeros, zeros, ids, mask.long())),
        ]
        for name, args in cases:
            with self.subTest(argument=name), self.assertRaisesRegex(ValueError, name):
                token_objectives.objectives(*args)

    def test_run_under_no_grad_gives_the_same_report_and_leaves_state_as_found(self):
        threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
        with torch.no_grad():
            report = token_objectives.run()
            self.assertFalse(torch.is_grad_enabled())
        self.assertEqual(json_text(report), json_text(token_report()))
        self.assertEqual((torch.get_num_threads(), torch.get_default_dtype(), torch.is_grad_enabled()),
                         (threads, dtype, True))

    def test_run_and_lesson_trace_under_inference_mode_give_the_same_reports(self):
        # the SGD steps differentiate: enable_grad alone fails under inference_mode
        expected = (json_text(token_report()), json_text(token_objectives.lesson_trace()))
        with torch.inference_mode():
            reports = (json_text(token_objectives.run()), json_text(token_objectives.lesson_trace()))
            self.assertEqual((torch.is_inference_mode_enabled(), torch.is_grad_enabled()), (True, False))
        self.assertEqual(reports, expected)


class TokenObjectivesCLI(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_writes_the_report_byte_identically_and_prints_the_facts(self):
        path = os.path.join(self.tmp.name, "new", "tokens.json")
        code, stdout, stderr = run_main(token_objectives.main, ["--output", path])
        self.assertEqual((code, stderr), (0, ""))
        with open(path, "rb") as handle:
            first = handle.read()
        self.assertEqual(first.decode("utf-8"), json_text(token_report()))
        self.assertEqual(json.loads(first)["trace"]["grouped_rewards"], [[1.0, 0.0, 0.5, 0.0], [1.0, 1.0, 1.0, 1.0]])
        for text in ("0.693147 -> +0.668435", "gradient norm 0.414997", "-0.017285", "+0.010463", "0.200000",
                     "grpo_loss", "cispo_loss", "clipped token", f"-> {path}"):
            self.assertIn(text, stdout)
        run_main(token_objectives.main, ["--output", path])
        with open(path, "rb") as handle:
            self.assertEqual(handle.read(), first)
        self.assertEqual(os.listdir(os.path.dirname(path)), ["tokens.json"])  # no temporary left behind

    def test_output_that_is_a_folder_or_under_a_file_is_a_one_line_error(self):
        blocker = os.path.join(self.tmp.name, "blocker")
        with open(blocker, "w") as handle:
            handle.write("keep me\n")
        for argv in (["--output", self.tmp.name], ["--output", os.path.join(blocker, "tokens.json")],
                     ["--output", ""], ["--output", os.path.join(self.tmp.name, "sub") + os.sep]):
            with self.subTest(argv=argv):
                code, stdout, stderr = run_main(token_objectives.main, argv)
                self.assertEqual(code, 2)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn("--output", stderr)
                self.assertEqual(stdout, "")
        self.assertEqual(os.listdir(self.tmp.name), ["blocker"])
        with open(blocker) as handle:
            self.assertEqual(handle.read(), "keep me\n")
        code, stdout, _ = run_main(token_objectives.main, ["--help"])
        self.assertEqual(code, 0)
        self.assertIn("default: results-tokens.json", stdout)

    def test_default_output_is_results_tokens_json_in_the_current_folder(self):
        previous = os.getcwd()
        os.chdir(self.tmp.name)
        try:
            code, _, stderr = run_main(token_objectives.main, [])
        finally:
            os.chdir(previous)
        self.assertEqual((code, stderr), (0, ""))
        with open(os.path.join(self.tmp.name, "results-tokens.json"), encoding="utf-8") as handle:
            self.assertEqual(handle.read(), json_text(token_report()))


if __name__ == "__main__":
    unittest.main()
