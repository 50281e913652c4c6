"""Tests of online_tokens.py: the verifier, the sampler, masks and ratios, learning on three seeds,
the diagnostics, bad settings and the CLI.

    python -m unittest -v test_online_tokens
"""

import csv
import io
import json
import math
import os
import tempfile
import unittest

import torch

import online_tokens
from lab_checks import torch_threads
from lab_testing import run_main
from rl_lab import DTYPE, grpo_policy_loss

_THREADS = torch_threads(1)  # the tensors are tiny: one thread, as the drivers use


def rollout_with_advantages(state):
    """online_tokens.rollout() then its advantages: the batch the update takes."""
    return online_tokens.compute_advantages(state, online_tokens.rollout(state))


def setUpModule():
    _THREADS.__enter__()


def tearDownModule():
    _THREADS.__exit__(None, None, None)


def t(values, **kwargs):
    return torch.tensor(values, dtype=DTYPE, **kwargs)


# ---------------------------------------------------------------------------------------------
# Online GRPO / CISPO (online_tokens.py --online)
# ---------------------------------------------------------------------------------------------


_ONLINE_CACHE = {}


def cached_online(**overrides):
    key = tuple(sorted(overrides.items()))
    if key not in _ONLINE_CACHE:
        _ONLINE_CACHE[key] = online_tokens.train(**overrides)
    return _ONLINE_CACHE[key]


class OnlineGRPO(unittest.TestCase):
    def test_verifier_scores_exact_answer_partial_truncation_and_the_rest(self):
        verify, eos = online_tokens.verify, online_tokens.EOS
        self.assertEqual(verify(5, [1, 0, 1, eos], False), 1.0)  # "101" then EOS
        self.assertEqual(verify(5, [1, 0, 1, 1, 0], True), 0.25)  # right answer, never stops
        self.assertEqual(verify(5, [1, 0, 1, 1, eos], False), 0.0)  # stops, but after a wrong extra digit
        self.assertEqual(verify(2, [1, 0, eos], False), 1.0)
        self.assertEqual(verify(2, [1, 1, 0, 0, 0], True), 0.0)
        self.assertEqual(verify(0, [eos], False), 0.0)  # the empty answer

    def test_initial_success_probability_is_the_hand_value_between_5_and_30_percent(self):
        state = online_tokens.setup()
        # uniform over {0, 1, EOS}: an answer of L digits plus EOS has probability (1/3)^(L+1);
        # answers 0, 1, 10, 11, 100, 101 have L = 1, 1, 2, 2, 3, 3
        expected = (2 / 9 + 2 / 27 + 2 / 81) / 6
        self.assertAlmostEqual(online_tokens.success_probability(state["table"].detach(), 1.0), expected, places=15)
        self.assertTrue(0.05 < expected < 0.30)

    def test_ratio_is_exactly_one_before_the_first_update(self):
        for temperature in (1.0, 0.7):
            state = online_tokens.setup(seed=3, temperature=temperature)
            with torch.no_grad():
                state["table"].add_(torch.randn(state["table"].shape, generator=torch.Generator().manual_seed(1),
                                                dtype=DTYPE))  # a policy that is not uniform
            batch = rollout_with_advantages(state)
            logps = online_tokens.token_logps(state["table"], batch["prompts"], batch["completion_ids"],
                                                        temperature)
            self.assertTrue(torch.equal(logps, batch["old_logps"]))  # bit for bit

    def test_tokens_after_eos_and_padding_receive_no_gradient(self):
        state = online_tokens.setup(seed=11)
        batch = rollout_with_advantages(state)
        kept = batch["mask"].bool()
        self.assertTrue(bool((~kept).any()))  # the batch has PAD positions
        for name, loss_fn in online_tokens.GROUP_LOSSES.items():
            with self.subTest(loss=name):
                logps = online_tokens.token_logps(state["table"], batch["prompts"], batch["completion_ids"],
                                                            1.0).detach().requires_grad_(True)
                loss = loss_fn(logps, batch["old_logps"], batch["ref_logps"], batch["advantages"], batch["mask"],
                               beta=0.02)
                loss.backward()
                self.assertEqual(logps.grad[~kept].abs().max().item(), 0.0)
                self.assertGreater(logps.grad[kept].abs().max().item(), 0.0)
        # the table states only reached after an EOS (previous token = EOS) get no gradient either
        state["table"].grad = None
        online_tokens.update(state, batch)
        state["table"].grad = None
        logps = online_tokens.token_logps(state["table"], batch["prompts"], batch["completion_ids"], 1.0)
        grpo_policy_loss(logps, batch["old_logps"], batch["ref_logps"], batch["advantages"],
                                          batch["mask"]).backward()
        self.assertEqual(state["table"].grad[:, :, online_tokens.EOS].abs().max().item(), 0.0)

    def test_truncated_responses_keep_every_token_and_no_eos(self):
        state = online_tokens.setup(seed=2, max_new_tokens=3)
        batch = rollout_with_advantages(state)
        truncated = batch["truncated"]
        self.assertTrue(bool(truncated.any()) and bool((~truncated).any()))
        # a truncated response has no EOS: all of its positions are real and all count in the loss
        self.assertTrue(bool(batch["mask"][truncated].bool().all()))
        self.assertFalse(bool((batch["completion_ids"][truncated] == online_tokens.EOS).any()))
        # a finished response counts up to and including its EOS, and nothing after
        for row in torch.nonzero(~truncated).flatten().tolist():
            ids = batch["completion_ids"][row].tolist()
            first_eos = ids.index(online_tokens.EOS)
            self.assertEqual(batch["mask"][row].tolist(), [1] * (first_eos + 1) + [0] * (2 - first_eos))

    def test_reference_never_changes(self):
        state = online_tokens.setup(seed=5)
        for _ in range(3):
            batch = rollout_with_advantages(state)
            online_tokens.update(state, batch)
        self.assertEqual(state["reference"].abs().max().item(), 0.0)
        self.assertFalse(state["reference"].requires_grad)
        # the reference is the uniform initial policy: every reference token log-prob is -ln 3
        torch.testing.assert_close(batch["ref_logps"], torch.full_like(batch["ref_logps"], -math.log(3.0)),
                                   rtol=0, atol=1e-15)
        self.assertGreater(state["table"].detach().abs().max().item(), 0.1)  # while the policy moved

    def test_both_losses_learn_on_three_seeds(self):
        for loss in ("grpo", "cispo"):
            for seed in (0, 7, 19):
                with self.subTest(loss=loss, seed=seed):
                    rows, report = cached_online(loss=loss, seed=seed)
                    self.assertAlmostEqual(report["initial_success_probability"], 0.0535, delta=1e-4)
                    self.assertGreater(rows[-1]["success_rate"], 0.9)
                    self.assertGreater(rows[-1]["success_probability"], 0.9)
                    self.assertEqual(rows[-1]["optimizer_steps"], 2 * (len(rows) - 1))  # row 0: before training

    def test_clip_binds_and_separates_grpo_from_cispo(self):
        grpo, cispo = cached_online(loss="grpo", seed=7)[0], cached_online(loss="cispo", seed=7)[0]
        # the first batch is the same (same seed, same sampler); Adam's first step moves ratios past 1.2
        self.assertEqual(grpo[1]["reward_mean"], cispo[1]["reward_mean"])
        self.assertGreater(grpo[1]["clip_fraction"], 0.0)
        self.assertEqual(cispo[1]["clip_fraction"], 0.0)  # CISPO never zeroes a gradient
        self.assertGreaterEqual(grpo[1]["outside_clip_range_fraction"], grpo[1]["clip_fraction"])
        self.assertNotEqual(grpo[-1]["success_probability"], cispo[-1]["success_probability"])

    def test_clip_diagnostics_hand_cases(self):
        ratio = t([1.5, 0.5, 1.5, 0.5, 5.5, 1.0])
        advantages = t([1.0, -1.0, -1.0, 1.0, 1.0, 0.0])
        grpo = online_tokens._ratio_diagnostics(ratio, advantages, online_tokens.config(), first_pass=False)
        # all but the last are outside 1 +- 0.2; the clip zeroes the first two and the 5.5 (A > 0) only
        self.assertEqual(grpo, {"clip_fraction": 3 / 6, "outside_clip_range_fraction": 5 / 6, "capped_fraction": 0.0})
        cispo = online_tokens._ratio_diagnostics(ratio, advantages, online_tokens.config(algorithm="cispo"), False)
        # the cap is absolute: 5.5 > 5 counts, while 1 + 5 = 6 would not; CISPO zeroes no gradient
        self.assertEqual((cispo["clip_fraction"], cispo["capped_fraction"]), (0.0, 1 / 6))
        first = online_tokens._ratio_diagnostics(ratio, advantages, online_tokens.config(), first_pass=True)
        self.assertEqual(first["clip_fraction"], 0.0)  # the first pass sees ratio 1 exactly

    def test_entropy_and_kl_columns_are_what_they_claim(self):
        rows = cached_online(loss="grpo", seed=7)[0]
        self.assertAlmostEqual(rows[1]["entropy"], math.log(3.0), places=14)  # the uniform first policy
        state = online_tokens.setup(seed=4)
        with torch.no_grad():
            state["table"].add_(torch.randn(state["table"].shape, generator=torch.Generator().manual_seed(8),
                                            dtype=DTYPE))
        batch = rollout_with_advantages(state)
        update = online_tokens.update(state, batch)
        row = online_tokens.record(state, batch, update, 1)
        kl_terms, entropies = [], []
        for n in range(batch["mask"].shape[0]):
            for position in range(batch["mask"].shape[1]):
                if batch["mask"][n, position]:
                    delta = batch["ref_logps"][n, position].item() - batch["old_logps"][n, position].item()
                    kl_terms.append(math.exp(delta) - delta - 1.0)  # k3 of the sampling policy vs the reference
                    logits = batch["old_logits"][n, position].tolist()
                    z = sum(math.exp(v) for v in logits)
                    entropies.append(-sum(math.exp(v) / z * (v - math.log(z)) for v in logits))
        self.assertAlmostEqual(row["kl_k3"], sum(kl_terms) / len(kl_terms), places=12)
        self.assertAlmostEqual(row["entropy"], sum(entropies) / len(entropies), places=12)

    def test_row_statistics_are_consistent(self):
        rows = cached_online(loss="grpo", seed=7)[0]
        # row 0 is the initial evaluation: the exact start, nothing sampled or updated
        self.assertEqual({name: value for name, value in rows[0].items() if value != 0},
                         {"success_probability": rows[0]["success_probability"]})
        self.assertAlmostEqual(rows[0]["success_probability"], (2 / 9 + 2 / 27 + 2 / 81) / 6, places=15)
        total = 0
        for row in rows[1:]:
            total += row["tokens_sampled"]
            self.assertEqual(row["total_tokens_sampled"], total)
            self.assertLessEqual(row["ratio_min"], 1.0)
            self.assertGreaterEqual(row["ratio_max"], 1.0)  # the first pass always sees ratio 1
            self.assertTrue(0.0 <= row["success_rate"] <= 1.0 and 0.0 <= row["truncated_fraction"] <= 1.0)
            self.assertTrue(1.0 <= row["mean_response_length"] <= 5.0)
            self.assertGreaterEqual(row["kl_k3"], 0.0)
        self.assertEqual(rows[1]["kl_k3"], 0.0)  # the first batch is sampled by the reference itself

    def test_same_seed_same_rows_and_reductions_change_the_run(self):
        first = online_tokens.train(steps=5, seed=13)[0]
        self.assertEqual(first, online_tokens.train(steps=5, seed=13)[0])
        token = online_tokens.train(steps=5, seed=13, reduction="token")[0]
        self.assertEqual(first[1]["reward_mean"], token[1]["reward_mean"])  # same first batch
        self.assertNotEqual(first[-1]["success_probability"], token[-1]["success_probability"])

    def test_online_train_rejects_bad_settings(self):
        cases = [("loss", {"loss": "ppo"}), ("reduction", {"reduction": "mean"}), ("steps", {"steps": 0}),
                 ("group_size", {"group_size": 1}), ("temperature", {"temperature": 0.0}),
                 ("seed", {"seed": 1.5}), ("epsilon", {"epsilon": 1.0}), ("learning_rate", {"learning_rate": -1}),
                 ("lr", {"lr": 0.1})]
        for name, overrides in cases:
            with self.subTest(overrides=overrides), self.assertRaisesRegex(ValueError, name):
                online_tokens.train(**overrides)


class OnlineValidation(unittest.TestCase):
    def test_verify_and_success_probability_reject_bad_input(self):
        verify, eos = online_tokens.verify, online_tokens.EOS
        table = torch.zeros(6, 5, 4, 3, dtype=DTYPE)
        cases = [
            ("number", lambda: verify(-1, [1, 0, 1, eos], False)),  # would wrap round to prompt 5
            ("number", lambda: verify(True, [1, eos], False)),
            ("number", lambda: verify(6, [1, eos], False)),
            ("tokens", lambda: verify(1, torch.tensor([1, eos]), False)),
            ("tokens", lambda: verify(1, [1, 7], False)),
            ("truncated", lambda: verify(1, [1, eos], True)),  # an EOS means the response stopped
            ("truncated", lambda: verify(1, [1, eos], "no")),
            ("temperature", lambda: online_tokens.success_probability(table, 0)),
            ("table", lambda: online_tokens.success_probability(torch.zeros(3, 5, 4, 3, dtype=DTYPE), 1.0)),
            ("loss", lambda: online_tokens.train(loss={"a": 1})),
            ("state", lambda: rollout_with_advantages({})),
        ]
        for name, call in cases:
            with self.subTest(argument=name), self.assertRaisesRegex(ValueError, name):
                call()
        self.assertEqual(verify(1, (1, eos), False), 1.0)  # a tuple is a sequence of ids too
        state = online_tokens.setup()
        with self.assertRaisesRegex(ValueError, "batch"):
            online_tokens.update(online_tokens.setup(max_new_tokens=3),
                                           rollout_with_advantages(state))

    def test_a_diverging_run_stops_with_one_line_and_leaves_nothing(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "deep", "er", "diverged")
            argv = ["--steps", "3", "--lr", "10", "--temperature", "0.05", "--updates-per-batch", "4",
                    "--output", out]
            code, stdout, stderr = run_main(online_tokens.main, argv)
            self.assertEqual(code, 1)
            self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
            self.assertIn("diverged", stderr)
            self.assertIn("--lr", stderr)
            self.assertEqual(os.listdir(tmp), [])  # not even the parent folders
        with self.assertRaises(online_tokens.TrainingDiverged):
            online_tokens.train(steps=3, learning_rate=10.0, temperature=0.05, updates_per_batch=4)


class OnlineCLI(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def test_writes_csv_and_json_byte_identically(self):
        out = os.path.join(self.tmp.name, "online")
        argv = ["--loss", "cispo", "--steps", "4", "--reduction", "constant", "--output", out]
        code, stdout, _ = run_main(online_tokens.main, argv)
        self.assertEqual(code, 0)
        self.assertIn("tokens/s", stdout)
        with open(os.path.join(out, "online.csv"), "rb") as handle:
            first_csv = handle.read()
        with open(os.path.join(out, "online.json"), "rb") as handle:
            first_json = handle.read()
        rows = list(csv.DictReader(io.StringIO(first_csv.decode())))
        self.assertEqual(list(rows[0]), online_tokens.COLUMNS)
        self.assertEqual([int(row["step"]) for row in rows], [0, 1, 2, 3, 4])
        report = json.loads(first_json)
        self.assertEqual((report["settings"]["algorithm"], report["settings"]["reduction"]), ("cispo", "constant"))
        run_main(online_tokens.main, argv)
        with open(os.path.join(out, "online.csv"), "rb") as handle:
            self.assertEqual(handle.read(), first_csv)
        with open(os.path.join(out, "online.json"), "rb") as handle:
            self.assertEqual(handle.read(), first_json)

    def test_bad_flags_exit_2_with_one_line_and_write_nothing(self):
        out = os.path.join(self.tmp.name, "never")
        cases = [
            ("--steps", ["--steps", "0"]),
            ("--group-size", ["--group-size", "1"]),
            ("--temperature", ["--temperature", "0"]),
            ("--temperature", ["--temperature", "nan"]),
            ("--epsilon", ["--epsilon", "1"]),
            ("--loss", ["--loss", "ppo"]),
            ("--reduction", ["--reduction", "mean"]),
            ("--max-new-tokens", ["--max-new-tokens", "65"]),
            ("--lr", ["--lr", "-0.1"]),
            ("--temperature", ["--temperature", "5e-324"]),  # would overflow every tempered logit
            ("--prompts", ["--prompts", "4096", "--group-size", "1024", "--max-new-tokens", "64"]),  # ~15 GB
        ]
        for flag, argv in cases:
            with self.subTest(argv=argv):
                code, stdout, stderr = run_main(online_tokens.main, argv + ["--output", out])
                self.assertEqual(code, 2)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn(flag, stderr)
                self.assertEqual(stdout, "")
                self.assertFalse(os.path.exists(out))



if __name__ == "__main__":
    unittest.main()
