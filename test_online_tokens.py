"""Tests of online_tokens.py: the verifier, the sampler, masks and ratios, learning on three seeds,
the diagnostics, bad settings and the CLI.

    python -m unittest -v test_online_tokens
"""

import csv
import dataclasses
import io
import json
import math
import os
import shlex
import tempfile
import unittest

import torch

import library_export
import online_tokens
import sft
from countdown import CountdownTask
from lab.testing import HERE, float64, parallel_calls, prefetch, run_main, shared_calls, single_thread_module
import online_algorithms
import online_registry
import rl_lab
from online_algorithms import POLICY_LOSSES, PREFERENCE_LOSSES, ratio_diagnostics
import online_settings
from online_settings import default_output, resolve
from policies import TableCritic, logps_of_tokens, nucleus, prompt_table
from tasks import BinaryTask
from rl_lab import DTYPE, dpo_loss, grpo_policy_loss, sequence_log_ratio, clipped_policy_loss

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train
t = float64


def rollout_with_credit(state):
    """online_tokens.rollout() then the algorithm's credit: what the update takes."""
    batch = online_tokens.rollout(state)
    return batch, online_tokens.credit(state, batch)


def current_logps(state, batch, policy=None):
    """(N, R) log-probs of the batch's tokens under the run's current policy (with gradient)."""
    policy = state.policy if policy is None else policy
    return logps_of_tokens(policy.logits(batch.prompts, batch.completion_ids), batch.completion_ids)


def shuffled(state, seed):
    """Give the run's table policy random preferences (a uniform table looks the same at every temperature)."""
    with torch.no_grad():
        state.policy.table.add_(torch.randn(state.policy.table.shape, generator=torch.Generator().manual_seed(seed),
                                            dtype=DTYPE))




# ---------------------------------------------------------------------------------------------
# Online GRPO / CISPO
# ---------------------------------------------------------------------------------------------


def cached_online(**overrides):
    """online_tokens.train(**overrides), computed once per test process (test_results trains the default runs)."""
    return shared_calls([("online_tokens", "train", (), overrides)])[0]


TASK = BinaryTask()
EOS = TASK.eos_id


class OnlineGRPO(unittest.TestCase):
    def test_verifier_scores_exact_answer_partial_truncation_and_the_rest(self):
        verify, eos = TASK.verify, EOS
        self.assertEqual(verify(5, [1, 0, 1, eos], False), 1.0)  # "101" then EOS
        self.assertEqual(verify(5, [1, 0, 1, 1, 0], True), 0.25)  # right answer, never stops
        self.assertEqual(verify(5, [1, 0, 1, 1, eos], False), 0.0)  # stops, but after a wrong extra digit
        self.assertEqual(verify(2, [1, 0, eos], False), 1.0)
        self.assertEqual(verify(2, [1, 1, 0, 0, 0], True), 0.0)
        self.assertEqual(verify(0, [eos], False), 0.0)  # the empty answer

    def test_initial_success_probability_is_the_hand_value(self):
        state = online_tokens.setup()
        # uniform over {0, 1, EOS}: an answer of L digits plus EOS has probability (1/3)^(L+1);
        # answers 0, 1, 10, 11, 100, 101 have L = 1, 1, 2, 2, 3, 3
        expected = (2 / 9 + 2 / 27 + 2 / 81) / 6
        self.assertAlmostEqual(online_tokens.evaluate(state)["success_probability"], expected, places=15)
        self.assertEqual(online_tokens.evaluate(state)["kl_reference"], 0.0)
        # with a cap of 2 tokens only "0" and "1" (then EOS) fit: the others count 0
        short = online_tokens.setup(max_new_tokens=2)
        self.assertAlmostEqual(online_tokens.evaluate(short)["success_probability"], (2 / 9) / 6, places=15)

    def test_exact_success_is_the_sum_over_each_prompts_correct_responses(self):
        state = online_tokens.setup(seed=3)
        shuffled(state, 4)
        by_prompt = online_tokens.success_by_prompt(state.policy, state.evaluation["train"])
        # by hand: walk the table along each answer (previous token = BOS, then the answer's digits)
        logp = torch.log_softmax(state.policy.table.detach(), dim=-1)
        for prompt in range(6):
            tokens = list(TASK.answers[prompt]) + [EOS]
            previous, total = state.policy.bos_state, 0.0
            for position, token in enumerate(tokens):
                total += logp[prompt, position, previous, token].item()
                previous = token
            self.assertAlmostEqual(by_prompt[prompt].item(), math.exp(total), places=14)

    def test_ratio_is_exactly_one_before_the_first_update(self):
        for temperature in (1.0, 0.7):
            state = online_tokens.setup(seed=3, temperature=temperature)
            shuffled(state, 1)  # a policy that is not uniform
            batch, _ = rollout_with_credit(state)
            self.assertTrue(torch.equal(current_logps(state, batch), batch.old_logps))  # bit for bit

    def test_tokens_after_eos_and_padding_receive_no_gradient(self):
        state = online_tokens.setup(seed=11)
        batch, credit = rollout_with_credit(state)
        kept = batch.mask.bool()
        self.assertTrue(bool((~kept).any()))  # the batch has PAD positions
        for name, entry in POLICY_LOSSES.items():
            with self.subTest(loss=name):
                logps = current_logps(state, batch).detach().requires_grad_(True)
                inputs = (logps, batch.old_logps, batch.ref_logps) if entry.old_policy else (logps, batch.ref_logps)
                extra = {"tau": 0.1} if name == "dro" else {}  # DRO's tau has no default
                loss = entry.function(*inputs, credit.advantages, batch.mask, beta=0.02, **extra)
                loss.backward()
                self.assertEqual(logps.grad[~kept].abs().max().item(), 0.0)
                self.assertGreater(logps.grad[kept].abs().max().item(), 0.0)
        # the table states only reached after an EOS (previous token = EOS) get no gradient either
        online_tokens.update(state, batch, credit)
        state.policy.table.grad = None
        grpo_policy_loss(current_logps(state, batch), batch.old_logps, batch.ref_logps, credit.advantages,
                         batch.mask).backward()
        self.assertEqual(state.policy.table.grad[:, :, EOS].abs().max().item(), 0.0)

    def test_truncated_responses_keep_every_token_and_no_eos(self):
        state = online_tokens.setup(seed=2, max_new_tokens=3)
        batch, _ = rollout_with_credit(state)
        truncated = batch.truncated
        self.assertTrue(bool(truncated.any()) and bool((~truncated).any()))
        # a truncated response has no EOS: all of its positions are real and all count in the loss
        self.assertTrue(bool(batch.mask[truncated].bool().all()))
        self.assertFalse(bool((batch.completion_ids[truncated] == EOS).any()))
        # a finished response counts up to and including its EOS, and nothing after
        for row in torch.nonzero(~truncated).flatten().tolist():
            ids = batch.completion_ids[row].tolist()
            first_eos = ids.index(EOS)
            self.assertEqual(batch.mask[row].tolist(), [1] * (first_eos + 1) + [0] * (2 - first_eos))

    def test_sampler_logps_are_the_log_probs_the_sampler_drew_from(self):
        state = online_tokens.setup(seed=6, temperature=0.8)
        shuffled(state, 9)
        batch, _ = rollout_with_credit(state)
        kept = batch.real
        # same policy, same temperature: the sampler's log-probs are the trainer's old ones (to rounding:
        # log(softmax) there, log_softmax here), and 0 past the end
        torch.testing.assert_close(batch.sampler_logps[kept], batch.old_logps[kept], rtol=0, atol=1e-14)
        self.assertEqual(batch.sampler_logps[~kept].abs().max().item(), 0.0)

    def test_reference_never_changes(self):
        state = online_tokens.setup(seed=5)
        for _ in range(3):
            batch, credit = rollout_with_credit(state)
            online_tokens.update(state, batch, credit)
        self.assertEqual(state.reference.table.abs().max().item(), 0.0)
        self.assertFalse(state.reference.table.requires_grad)
        # the reference is the uniform initial policy: every reference token log-prob is -ln 3
        torch.testing.assert_close(batch.ref_logps, torch.full_like(batch.ref_logps, -math.log(3.0)),
                                   rtol=0, atol=1e-15)
        self.assertGreater(state.policy.table.detach().abs().max().item(), 0.1)  # while the policy moved

    def test_optimizer_steps_follow_updates_per_batch(self):
        for algorithm in ("grpo", "cispo"):
            rows = cached_online(algorithm=algorithm, seed=7)[0]
            self.assertEqual(rows[-1]["optimizer_steps"], 2 * (len(rows) - 1))  # row 0: before training

    def test_clip_binds_and_separates_grpo_from_cispo(self):
        grpo, cispo = cached_online(algorithm="grpo", seed=7)[0], cached_online(algorithm="cispo", seed=7)[0]
        # the first batch is the same (same seed, same sampler); Adam's first step moves ratios past 1.2
        self.assertEqual(grpo[1]["reward_mean"], cispo[1]["reward_mean"])
        self.assertGreater(grpo[1]["clip_fraction"], 0.0)
        self.assertEqual(cispo[1]["clip_fraction"], 0.0)  # CISPO never zeroes a gradient
        self.assertGreaterEqual(grpo[1]["outside_clip_range_fraction"], grpo[1]["clip_fraction"])
        self.assertNotEqual(grpo[-1]["success_probability"], cispo[-1]["success_probability"])

    def test_clip_diagnostics_hand_cases(self):
        ratio = t([1.5, 0.5, 1.5, 0.5, 5.5, 1.0])
        advantages = t([1.0, -1.0, -1.0, 1.0, 1.0, 0.0])
        grpo = ratio_diagnostics(ratio, advantages, resolve({}), "clip", first_pass=False)
        # all but the last are outside 1 +- 0.2; the clip zeroes the first two and the 5.5 (A > 0) only
        self.assertEqual(grpo, {"clip_fraction": 3 / 6, "outside_clip_range_fraction": 5 / 6, "capped_fraction": 0.0})
        cispo = ratio_diagnostics(ratio, advantages, resolve({"algorithm": "cispo"}), "cap", False)
        # the cap is absolute: 5.5 > 5 counts, while 1 + 5 = 6 would not; CISPO zeroes no gradient
        self.assertEqual((cispo["clip_fraction"], cispo["capped_fraction"]), (0.0, 1 / 6))
        first = ratio_diagnostics(ratio, advantages, resolve({}), "clip", first_pass=True)
        self.assertEqual(first["clip_fraction"], 0.0)  # the first pass sees ratio 1 exactly

    def test_entropy_and_kl_columns_are_what_they_claim(self):
        rows = cached_online(algorithm="grpo", seed=7)[0]
        self.assertAlmostEqual(rows[1]["entropy"], math.log(3.0), places=14)  # the uniform first policy
        state = online_tokens.setup(seed=4)
        shuffled(state, 8)
        old = state.policy.snapshot()
        batch, credit = rollout_with_credit(state)
        row = online_tokens.record(state, batch, credit, online_tokens.update(state, batch, credit), 1)
        old_logits = old.logits(batch.prompts, batch.completion_ids)
        kl_terms, entropies = [], []
        for n in range(batch.mask.shape[0]):
            for position in range(batch.mask.shape[1]):
                if batch.mask[n, position]:
                    delta = batch.ref_logps[n, position].item() - batch.old_logps[n, position].item()
                    kl_terms.append(math.exp(delta) - delta - 1.0)  # k3 of the sampling policy vs the reference
                    logits = old_logits[n, position].tolist()
                    z = sum(math.exp(v) for v in logits)
                    entropies.append(-sum(math.exp(v) / z * (v - math.log(z)) for v in logits))
        self.assertAlmostEqual(row["kl_k3"], sum(kl_terms) / len(kl_terms), places=12)
        self.assertAlmostEqual(row["entropy"], sum(entropies) / len(entropies), places=12)

    def test_row_statistics_are_consistent(self):
        rows = cached_online(algorithm="grpo", seed=7)[0]
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
        cases = [("algorithm", {"algorithm": "reinforce"}), ("reduction", {"reduction": "mean"}),
                 ("steps", {"steps": 0}), ("group_size", {"group_size": 1}), ("temperature", {"temperature": 0.0}),
                 ("seed", {"seed": 1.5}), ("epsilon", {"epsilon": 1.0}), ("learning_rate", {"learning_rate": -1}),
                 ("lr", {"lr": 0.1}), ("loss", {"loss": "grpo"}), ("reduction", {"algorithm": "ppo", "reduction": "token"}),
                 ("label_smoothing", {"algorithm": "dpo", "label_smoothing": 0.1})]
        for name, overrides in cases:
            with self.subTest(overrides=overrides), self.assertRaisesRegex(ValueError, f"^{name}: "):
                online_tokens.train(**overrides)

    def test_every_algorithms_own_defaults_resolve(self):
        self.assertEqual((resolve({}).epsilon, resolve({}).epsilon_high), (0.2, None))
        self.assertEqual(resolve({"algorithm": "cispo"}).epsilon_high, 5.0)
        self.assertEqual((resolve({"algorithm": "gspo"}).epsilon, resolve({"algorithm": "gspo"}).epsilon_high),
                         (3e-4, 4e-4))
        simpo = resolve({"algorithm": "dpo", "dpo_loss": "simpo"})
        self.assertEqual((simpo.dpo_beta, simpo.sequence_logp), (2.0, "mean"))
        self.assertEqual(resolve({"algorithm": "dpo", "dpo_loss": "ipo"}).dpo_beta, 0.1)
        self.assertEqual(resolve({"beta": 0}).beta, 0.0)  # a float setting holds a float
        self.assertIsInstance(resolve({"beta": 0}).beta, float)
        with self.assertRaisesRegex(ValueError, "^epsilon_high: "):
            resolve({"algorithm": "cispo", "epsilon_high": 0.0})  # an absolute cap of 0 keeps no weight


class FirstBatchExample(unittest.TestCase):
    """The printout's example group teaches advantages: the first group of the first batch whose rewards vary."""

    @staticmethod
    def items(*rewards):
        return [{"prompt": 0, "answer": "0", "response": "EOS", "truncated": False, "reward": reward,
                 "advantage": 0.0} for reward in rewards]

    def summary_header(self, first_batch, algorithm="grpo"):
        row = {"success_probability": 0.5, "kl_reference": 0.0, "success_rate": 0.5, "mean_response_length": 1.0,
               "clip_fraction": 0.0, "total_tokens_sampled": 8, "responses_sampled": 4}
        report = {"settings": {"algorithm": algorithm, "steps": 1, "prompts": 3, "group_size": 2, "seed": 0},
                  "initial_success_probability": 0.5, "first_batch": first_batch}
        lines = online_tokens.summary_text([row, row], report, 1.0).splitlines()
        return lines[5], lines[6:]

    def test_the_first_batch_is_decoded_up_to_its_second_group_that_varies(self):
        state = online_tokens.setup(algorithm="grpo", seed=7)  # the default run's first batch
        batch, credit = rollout_with_credit(state)
        decoded = online_tokens.decode_batch(state, batch, credit)
        group_size = state.cfg.group_size
        grouped = batch.rewards.reshape(-1, group_size)  # (B*G,) -> (B, G)
        varies = [index for index in range(grouped.shape[0]) if len(set(grouped[index].tolist())) > 1]
        self.assertEqual(varies[:2], [2, 3])  # groups 1 and 2 (0 and 1 here) tie
        self.assertEqual(len(decoded), (varies[1] + 1) * group_size)
        self.assertEqual([item["reward"] for item in decoded], batch.rewards[: len(decoded)].tolist())
        index, group = online_tokens.first_teaching_group(decoded, group_size)
        self.assertEqual((index, group), (3, decoded[2 * group_size: 3 * group_size]))
        self.assertTrue(all(item["advantage"] == 0.0 for item in decoded[: 2 * group_size]))
        advantages = [item["advantage"] for item in group]
        self.assertAlmostEqual(sum(advantages), 0.0, places=12)  # relative to the group's mean
        self.assertGreater(max(advantages), 0.0)

    def test_first_teaching_group_hand_cases(self):
        tie, varies = self.items(0.0, 0.0), self.items(0.0, 1.0)
        self.assertEqual(online_tokens.first_teaching_group(varies + tie, 2), (1, varies))
        self.assertEqual(online_tokens.first_teaching_group(tie + tie + varies, 2), (3, varies))
        self.assertEqual(online_tokens.first_teaching_group(tie + self.items(1.0, 1.0), 2), (None, tie))

    def test_the_summary_says_which_group_it_shows_and_why(self):
        tie, varies = self.items(0.0, 0.0), self.items(0.0, 1.0)
        header, shown = self.summary_header(varies + varies)
        self.assertEqual(header, "  group 1 of 3 in the first batch, the first whose rewards vary:")
        self.assertEqual(len(shown), 2)
        self.assertIn("reward 1.00", shown[1])
        self.assertEqual(self.summary_header(tie + varies)[0], "  group 2 of 3 in the first batch, the first whose "
                                                                "rewards vary; group 1 ties, so its advantages are 0:")
        self.assertEqual(self.summary_header(tie + tie + varies)[0], "  group 3 of 3 in the first batch, the first "
                                                                       "whose rewards vary; groups 1-2 tie, so their "
                                                                       "advantages are 0:")
        header, shown = self.summary_header(tie + tie + tie)
        self.assertEqual(header, "  first group of the first batch (no group's rewards vary in it: every advantage "
                                 "is 0):")
        self.assertEqual(len(shown), 2)
        # a tied group costs DPO its pair; PPO's critic gives it advantages all the same
        self.assertTrue(self.summary_header(tie + tie + varies, "dpo")[0].endswith(
            "groups 1-2 tie, so they give no preference pair:"))
        self.assertTrue(self.summary_header(tie + varies, "dpo")[0].endswith("group 1 ties, so it gives no preference "
                                                                             "pair:"))
        for first_batch, ending in ((tie + varies, "group 1 ties (PPO's advantages come from its critic, not from the "
                                                   "group):"),
                                    (tie + tie + tie, "vary in it; PPO's advantages come from its critic):")):
            self.assertTrue(self.summary_header(first_batch, "ppo")[0].endswith(ending))


class OnlineValidation(unittest.TestCase):
    def test_verify_rejects_bad_input(self):
        verify, eos = TASK.verify, EOS
        cases = [
            ("prompt", lambda: verify(-1, [1, 0, 1, eos], False)),  # would wrap round to prompt 5
            ("prompt", lambda: verify(True, [1, eos], False)),
            ("prompt", lambda: verify(6, [1, eos], False)),
            ("tokens", lambda: verify(1, torch.tensor([1, eos]), False)),
            ("tokens", lambda: verify(1, [1, 7], False)),
            ("truncated", lambda: verify(1, [1, eos], True)),  # an EOS means the response stopped
            ("truncated", lambda: verify(1, [1, eos], "no")),
            ("state", lambda: rollout_with_credit({})),
        ]
        for name, call in cases:
            with self.subTest(argument=name), self.assertRaisesRegex(ValueError, name):
                call()
        self.assertEqual(verify(1, (1, eos), False), 1.0)  # a tuple is a sequence of ids too
        batch, credit = rollout_with_credit(online_tokens.setup())
        with self.assertRaisesRegex(ValueError, "batch"):
            online_tokens.update(online_tokens.setup(max_new_tokens=3), batch, credit)

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
        argv = ["--algorithm", "cispo", "--steps", "4", "--reduction", "constant", "--output", out]
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

    def test_export_writes_the_trl_script_or_the_verl_command_without_training(self):
        script, command = os.path.join(self.tmp.name, "run.py"), os.path.join(self.tmp.name, "run.sh")
        code, stdout, stderr = run_main(online_tokens.main, ["--algorithm", "cispo", "--reduction", "token",
                                                              "--export", "trl", script])
        self.assertEqual((code, stderr), (0, ""))
        with open(script, encoding="utf-8") as handle:
            text = handle.read()
        self.assertIn("python online_tokens.py --algorithm cispo --reduction token", text)
        self.assertIn('"loss_type": "cispo"', text)
        compile(text, script, "exec")  # a Python script, runnable where TRL is installed
        code, _, stderr = run_main(online_tokens.main, ["--task", "countdown", "--policy", "transformer", "--algorithm",
                                                         "dpo", "--export", "trl", script])  # a regular file: replaced
        self.assertEqual((code, stderr), (0, ""))
        with open(script, encoding="utf-8") as handle:
            text = handle.read()
        self.assertIn("python online_tokens.py --algorithm dpo --policy transformer --task countdown", text)
        self.assertIn("OnlineDPOConfig(output_dir=output", text)
        self.assertIn("CHARACTERS = '0123456789+-*:='", text)
        code, _, _ = run_main(online_tokens.main, ["--algorithm", "ppo", "--export", "verl", command])
        self.assertEqual(code, 0)
        with open(command, encoding="utf-8") as handle:
            self.assertIn("algorithm.adv_estimator=gae", handle.read())
        code, stdout, stderr = run_main(online_tokens.main, ["--algorithm", "ppo", "--export", "trl", script + "2"])
        self.assertEqual((code, stdout), (2, ""))  # TRL 1.16 has no PPO trainer
        self.assertIn("--export", stderr)
        code, stdout, stderr = run_main(online_tokens.main, ["--algorithm", "dpo", "--dpo-loss", "simpo", "--offline",
                                                              "--export", "trl", script + "3"])
        self.assertEqual((code, stdout), (2, ""))  # SimPO is TRL's CPOTrainer, which the export does not write
        self.assertIn("argument --export: algorithm: the export covers GRPOConfig", stderr)
        code, stdout, stderr = run_main(online_tokens.main, ["--export-data", script + "5", "--algorithm", "dpo"])
        self.assertEqual((code, stdout), (2, ""))  # the data has no algorithm
        self.assertIn("argument --export-data: takes only --task and --max-new-tokens", stderr)
        code, stdout, stderr = run_main(online_tokens.main, ["--export", "trl", script + "4", "--output", "x"])
        self.assertEqual((code, stdout), (2, ""))
        self.assertIn("argument --output: not with --export", stderr)
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["run.py", "run.sh"])
        with self.assertRaisesRegex(ValueError, "^settings: .* missing algorithm"):
            library_export.export_trl({})
        with self.assertRaisesRegex(ValueError, "^settings: .* got NoneType"):
            library_export.export_verl(None)

    def test_export_verl_takes_the_model_and_the_data_folder_and_refuses_dpo(self):
        command = os.path.join(self.tmp.name, "run.sh")
        argv = ["--policy", "transformer", "--task", "countdown", "--export", "verl", command,
                "--model", "/models/mine", "--export-data-dir", "/data/countdown"]
        code, stdout, stderr = run_main(online_tokens.main, argv)
        self.assertEqual((code, stderr), (0, ""))
        with open(command, encoding="utf-8") as handle:
            lines = [line.strip().removesuffix(" \\") for line in handle if not line.startswith("#")]
        for override in ("actor_rollout_ref.model.path=/models/mine", "data.train_files=/data/countdown/train.parquet",
                         "reward.custom_reward_function.path=/data/countdown/rl_lab_verifier.py",
                         "actor_rollout_ref.actor.optim.lr=1e-06", "trainer.total_training_steps=100",
                         "actor_rollout_ref.actor.optim.weight_decay=0.0", "data.seed=7"):
            self.assertIn(override, lines)
        self.assertNotIn("actor_rollout_ref.actor.optim.lr=0.0003", lines)  # the lab's rate is not a 0.5B model's
        for argv, flag in ((["--export", "trl", command + "2", "--model", "m"], "--model"),
                           (["--export-data-dir", "d"], "--export-data-dir"),
                           (["--algorithm", "dpo", "--export", "verl", command + "3"], "--export"),
                           (["--algorithm", "dpo", "--offline", "--export", "verl", command + "4"], "--export")):
            with self.subTest(argv=argv):
                code, stdout, stderr = run_main(online_tokens.main, argv)
                self.assertEqual((code, stdout), (2, ""))
                self.assertTrue(stderr.startswith(f"online_tokens.py: error: argument {flag}: "), stderr)
                self.assertEqual(len(stderr.splitlines()), 1)
        self.assertIn("DPO trainer", stderr)
        self.assertEqual(os.listdir(self.tmp.name), ["run.sh"])  # a refused export writes nothing
        for argv, flag in ((["--export", "verl", command + "5", "--model", ""], "--model"),
                           (["--export", "verl", command + "6", "--export-data-dir", "a\nrm -rf ~"], "--export-data-dir")):
            with self.subTest(argv=argv):  # an empty name, or a newline that would end the script's comment
                code, stdout, stderr = run_main(online_tokens.main, argv)
                self.assertEqual((code, stdout), (2, ""))
                self.assertTrue(stderr.startswith(f"online_tokens.py: error: argument {flag}: expected a name"))
        self.assertEqual(os.listdir(self.tmp.name), ["run.sh"])

    def test_export_verl_quotes_a_model_and_a_folder_the_shell_would_split_or_run(self):
        command = os.path.join(self.tmp.name, "run.sh")
        argv = ["--export", "verl", command, "--model", "x; touch pwned", "--export-data-dir", "/tmp/my data"]
        self.assertEqual(run_main(online_tokens.main, argv)[0], 0)
        with open(command, encoding="utf-8") as handle:
            words = shlex.split(handle.read(), comments=True)  # as the shell reads it: one word an override
        self.assertIn("actor_rollout_ref.model.path=x; touch pwned", words)
        self.assertIn("data.train_files=/tmp/my data/train.parquet", words)
        self.assertIn('trainer.logger=["console"]', words)
        self.assertNotIn("touch", words)
        self.assertEqual(run_main(online_tokens.main, ["--export", "verl", command + "2"])[0], 0)
        with open(command + "2", encoding="utf-8") as handle:  # the default folder stays $PWD/data, expanded
            self.assertIn("    data.train_files=$PWD/data/train.parquet \\\n", handle.read())

    def test_all_writes_four_folders_and_a_comparison_byte_identically(self):
        out = os.path.join(self.tmp.name, "four")
        argv = ["--algorithm", "all", "--steps", "3", "--output", out]
        code, stdout, stderr = run_main(online_tokens.main, argv)
        self.assertEqual((code, stderr), (0, ""))
        self.assertEqual(sorted(os.listdir(out)), ["cispo", "comparison.csv", "comparison.md", "dpo", "grpo", "ppo"])
        with open(os.path.join(out, "comparison.csv"), encoding="utf-8") as handle:
            table = list(csv.DictReader(handle))
        self.assertEqual([row["algorithm"] for row in table], list(online_tokens.FOUR_ALGORITHMS))
        self.assertEqual({row["responses_sampled"] for row in table}, {str(3 * 64)})  # one budget: B*G per iteration
        self.assertIn("wall_seconds", stdout)
        snapshot = {}
        for folder, _, names in os.walk(out):
            for name in names:
                with open(os.path.join(folder, name), "rb") as handle:
                    snapshot[os.path.relpath(os.path.join(folder, name), out)] = handle.read()
        self.assertEqual(len(snapshot), 10)
        self.assertNotIn(b"wall", snapshot["comparison.csv"])  # machine-dependent: printed, not written
        run_main(online_tokens.main, argv)
        for relative, content in snapshot.items():
            with open(os.path.join(out, relative), "rb") as handle:
                self.assertEqual(handle.read(), content, relative)

    def test_every_report_names_the_trl_and_verl_options(self):
        cases = [
            ({}, "trl", "loss_type", "grpo"),
            ({}, "verl", "actor_rollout_ref.actor.loss_agg_mode", "seq-mean-token-mean"),
            ({"scale_rewards": "none"}, "verl", "algorithm.norm_adv_by_std_in_grpo", False),
            ({"advantage": "rloo"}, "verl", "algorithm.adv_estimator", "rloo"),
            ({"algorithm": "gspo"}, "trl", "importance_sampling_level", "sequence"),
            ({"algorithm": "cispo"}, "verl", "actor_rollout_ref.actor.clip_ratio_high", 4.0),
            ({"epsilon_high": 0.28}, "trl", "epsilon_high", 0.28),
            ({"dual_clip": 3.0}, "verl", "actor_rollout_ref.actor.clip_ratio_c", 3.0),
            ({"kl_in": "reward", "kl_estimator": "k2"}, "verl", "algorithm.kl_penalty", "mse"),
            ({"algorithm": "ppo"}, "verl", "algorithm.kl_penalty", "kl"),
            ({"algorithm": "dpo", "dpo_loss": "ipo"}, "trl", "loss_type", "ipo"),
        ]
        for options, library, key, value in cases:
            with self.subTest(options=options, key=key):
                report = online_tokens.train(steps=1, **options)[1]
                self.assertEqual(list(report)[:3], ["settings", "trl", "verl"])
                self.assertEqual(report[library]["options"][key], value)
        shared = online_tokens.train(steps=1, algorithm="ppo", cap_value="shared")[1]
        self.assertIn("truncation=bootstrap", shared["verl"]["unmatched"])  # verl does not bootstrap a cut response
        self.assertIsNone(shared["trl"]["options"])  # TRL 1.16 has no PPO trainer
        dpo = online_tokens.train(steps=1, algorithm="dpo")[1]
        self.assertIsNone(dpo["verl"]["options"])  # verl's core has no DPO trainer


# ---------------------------------------------------------------------------------------------
# Token-level PPO with a critic (online_tokens.py --algorithm ppo)
# ---------------------------------------------------------------------------------------------


def hand_batch():
    """Three responses of prompt 2 ("10"), R = 4: one ends with EOS, one is cut at the cap, one is PAD-heavy."""
    ids = torch.tensor([[1, 0, EOS, EOS], [1, 1, 0, 1], [EOS, EOS, EOS, EOS]])
    real = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    generator = torch.Generator().manual_seed(3)
    batch = online_tokens.Batch(torch.tensor([2, 2, 2]), ids, real, torch.tensor([False, True, False]),
                                t([1.0, 0.25, 0.0]), torch.zeros(3, 4, dtype=DTYPE))
    batch.mask = real.long()
    batch.old_logps = -torch.rand(3, 4, generator=generator, dtype=DTYPE)
    batch.ref_logps = -torch.rand(3, 4, generator=generator, dtype=DTYPE)
    return batch


def loop_gae(rewards, values, next_value, terminal, gamma, lam):
    """Plain GAE over one response, last token first."""
    advantages, running = [0.0] * len(rewards), 0.0
    for index in reversed(range(len(rewards))):
        following = next_value if index == len(rewards) - 1 else values[index + 1]
        if index == len(rewards) - 1 and terminal:
            following = 0.0
        delta = rewards[index] + gamma * following - values[index]
        running = delta + gamma * lam * (0.0 if index == len(rewards) - 1 else running)
        advantages[index] = running
    return advantages


class TokenPPO(unittest.TestCase):
    def test_per_token_advantages_match_a_loop_of_gae_per_response(self):
        batch = hand_batch()
        generator = torch.Generator().manual_seed(8)
        values = torch.randn(6, 5, 4, generator=generator, dtype=DTYPE)  # (P, R+1, S), row 4: after the cap
        for cap_value in ("table", "shared"):
            for truncation in ("bootstrap", "terminal"):
                with self.subTest(cap_value=cap_value, truncation=truncation):
                    cfg = resolve({"algorithm": "ppo", "max_new_tokens": 4, "beta": 0.1, "gamma": 0.9,
                                   "gae_lambda": 0.8, "truncation": truncation, "whiten_advantages": False})
                    cfg = dataclasses.replace(cfg, cap_value=cap_value)  # resolve() refuses it with terminal
                    critic = TableCritic((6, 4, 4, 3), bos_state=3, cap_value=cap_value)
                    critic.table = values
                    credit = online_algorithms.TokenPPO(cfg, critic).credit(batch)
                    for n in range(3):
                        length = int(batch.mask[n].sum())
                        previous = [3] + batch.completion_ids[n, :length - 1].tolist()
                        v = [values[2, position, previous[position]].item() for position in range(length)]
                        r = [-0.1 * (batch.old_logps[n, p] - batch.ref_logps[n, p]).item() for p in range(length)]
                        r[-1] += batch.rewards[n].item()
                        cut = bool(batch.truncated[n])
                        row = 4 if cap_value == "table" else 3
                        after_cap = values[2, row, batch.completion_ids[n, 3]].item()
                        expected = loop_gae(r, v, after_cap, not (cut and truncation == "bootstrap"), 0.9, 0.8)
                        self.assertEqual(len(expected), length)
                        for position in range(4):
                            want = expected[position] if position < length else 0.0  # PAD is never touched
                            self.assertAlmostEqual(credit.advantages[n, position].item(), want, places=13)
                            if position < length:
                                self.assertAlmostEqual(credit.returns[n, position].item(), want + v[position],
                                                       places=13)

    def test_a_table_critic_bootstraps_the_cut_response_from_0_so_it_equals_terminal(self):
        bootstrap = online_tokens.train(algorithm="ppo", steps=12, seed=3)[0]
        terminal = online_tokens.train(algorithm="ppo", steps=12, seed=3, truncation="terminal")[0]
        shared = online_tokens.train(algorithm="ppo", steps=12, seed=3, cap_value="shared")[0]
        self.assertEqual(bootstrap, terminal)  # the state after the cap is never visited: its value stays 0
        self.assertNotEqual(bootstrap[-1]["success_probability"], shared[-1]["success_probability"])

    def test_the_critic_never_receives_the_actors_gradient_and_whitening_is_standard(self):
        state = online_tokens.setup(algorithm="ppo", seed=4)
        critic = state.algorithm.critic.table
        with torch.no_grad():
            critic.add_(torch.randn(critic.shape, generator=torch.Generator().manual_seed(1), dtype=DTYPE))
        batch, credit = rollout_with_credit(state)
        kept = batch.mask.bool()
        self.assertAlmostEqual(credit.advantages[kept].mean().item(), 0.0, places=13)
        self.assertAlmostEqual(credit.advantages[kept].std(correction=0).item(), 1.0, places=7)  # eps 1e-8
        policy_loss = clipped_policy_loss(current_logps(state, batch), batch.old_logps, credit.advantages)[kept].mean()
        actor_grad, critic_grad = torch.autograd.grad(policy_loss, [state.policy.table, critic], allow_unused=True)
        self.assertIsNone(critic_grad)  # advantages are detached: no path from the actor's loss to the critic
        self.assertGreater(actor_grad.abs().max().item(), 0.0)

    def test_first_update_direction_is_reinforce_with_the_critic_by_hand(self):
        state = online_tokens.setup(algorithm="ppo", seed=5, beta=0.0, whiten_advantages=False)
        batch, credit = rollout_with_credit(state)
        kept = batch.mask.bool()
        logps = current_logps(state, batch)
        loss = torch.where(kept, clipped_policy_loss(logps, batch.old_logps, credit.advantages),
                           torch.zeros_like(logps)).sum() / kept.sum()
        (gradient,) = torch.autograd.grad(loss, state.policy.table)
        # by hand: -(1/K) sum_t A_t grad log pi(a_t | s_t), with grad log softmax = onehot - p (all p = 1/3)
        expected = torch.zeros_like(gradient)
        count = int(kept.sum())
        for n in range(kept.shape[0]):
            previous = state.policy.bos_state
            for position in range(int(kept[n].sum())):
                token = int(batch.completion_ids[n, position])
                advantage = credit.advantages[n, position].item()
                for a in range(3):
                    indicator = 1.0 if a == token else 0.0
                    expected[int(batch.prompts[n]), position, previous, a] -= advantage * (indicator - 1 / 3) / count
                previous = token
        torch.testing.assert_close(gradient, expected, rtol=0, atol=1e-14)
        # with a zero critic and gamma 1, the last token's advantage is the response's reward
        last = kept.sum(dim=1) - 1
        torch.testing.assert_close(credit.advantages[torch.arange(kept.shape[0]), last], batch.rewards,
                                   rtol=0, atol=1e-15)


# ---------------------------------------------------------------------------------------------
# Online DPO (online_tokens.py --algorithm dpo)
# ---------------------------------------------------------------------------------------------


class OnlineDPO(unittest.TestCase):
    def test_two_samples_with_two_rewards_give_the_dpo_atom_on_that_pair(self):
        for seed in range(40):  # the first seed whose one group of 2 has two different rewards
            state = online_tokens.setup(algorithm="dpo", seed=seed, prompts=1, group_size=2, updates_per_batch=1)
            batch, credit = rollout_with_credit(state)
            if batch.rewards[0] != batch.rewards[1]:
                break
        self.assertEqual(credit.chosen.numel(), 1)
        chosen, rejected = int(credit.chosen[0]), int(credit.rejected[0])
        self.assertGreater(batch.rewards[chosen].item(), batch.rewards[rejected].item())
        logps = current_logps(state, batch)
        kept = batch.mask.bool()
        summed = torch.where(kept, logps, torch.zeros_like(logps)).sum(dim=1)
        ref = torch.where(kept, batch.ref_logps, torch.zeros_like(logps)).sum(dim=1)
        expected = dpo_loss(summed[chosen:chosen + 1], summed[rejected:rejected + 1],
                            ref[chosen:chosen + 1], ref[rejected:rejected + 1], beta=0.5)
        diagnostics = online_tokens.update(state, batch, credit)
        self.assertAlmostEqual(diagnostics["loss"], expected.item(), places=14)
        self.assertAlmostEqual(diagnostics["loss"], math.log(2.0), places=14)  # policy = reference at the start

    def test_tied_prompts_contribute_nothing(self):
        state = online_tokens.setup(algorithm="dpo", seed=1)
        batch = online_tokens.rollout(state)
        batch.rewards = torch.zeros_like(batch.rewards)  # every prompt's responses tie
        credit = online_tokens.credit(state, batch)
        self.assertEqual((credit.chosen.numel(), credit.tied_prompts), (0, 8))
        before = state.policy.table.detach().clone()
        self.assertEqual(online_tokens.update(state, batch, credit), {})  # no step: the row keeps its zeros
        self.assertEqual(state.optimizer_steps, 0)
        self.assertTrue(torch.equal(state.policy.table.detach(), before))

    def test_offline_pairs_come_from_the_initial_policy(self):
        state = online_tokens.setup(algorithm="dpo", seed=2, offline=True)
        with torch.no_grad():
            state.policy.table[:, :, :, EOS] += 50.0  # a policy that would only ever say EOS
        batch = online_tokens.rollout(state)
        self.assertGreater(batch.mask.sum(dim=1).double().mean().item(), 1.5)  # sampled from the uniform start
        online = online_tokens.setup(algorithm="dpo", seed=2)
        with torch.no_grad():
            online.policy.table[:, :, :, EOS] += 50.0
        self.assertEqual(online_tokens.rollout(online).mask.sum(dim=1).double().mean().item(), 1.0)

    def test_every_preference_loss_is_its_atom_on_the_pairs(self):
        for name, entry in PREFERENCE_LOSSES.items():
            with self.subTest(dpo_loss=name):
                options = {"label_smoothing": 0.2} if "label_smoothing" in entry.reads else {}
                state = online_tokens.setup(algorithm="dpo", seed=3, dpo_loss=name, **options)
                shuffled(state, 6)
                batch, credit = rollout_with_credit(state)
                logps = current_logps(state, batch)
                kept = batch.mask.bool()
                sequence = torch.where(kept, logps, torch.zeros_like(logps)).sum(dim=1)
                ref = torch.where(kept, batch.ref_logps, torch.zeros_like(logps)).sum(dim=1)
                if state.cfg.sequence_logp == "mean":
                    sequence, ref = sequence / kept.sum(dim=1), ref / kept.sum(dim=1)
                c, r = credit.chosen, credit.rejected
                extra = {keyword: getattr(state.cfg, setting) for setting, keyword in entry.reads.items()}
                references = (ref[c], ref[r]) if entry.reference else ()
                expected = entry.function(sequence[c], sequence[r], *references, beta=state.cfg.dpo_beta, **extra).mean()
                loss, _, _ = state.algorithm.loss(logps, batch, credit, first_pass=True)
                self.assertAlmostEqual(loss.item(), expected.item(), places=13)

    def test_pair_distances_count_differing_tokens_and_where_a_response_ends(self):
        # PAD shares EOS's id (13 here): rows 0 and 1 differ at position 2 (3 vs EOS) and at 3, where row 1
        # has ended (its PAD reads as EOS, like row 0's real EOS); rows 2 and 3 differ at 0, 1, 2 and 3
        ids = torch.tensor([[1, 2, 3, 13], [1, 2, 13, 13], [1, 4, 3, 13], [5, 6, 13, 13]])
        real = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]]).bool()
        self.assertEqual(online_algorithms.pair_distances(ids, real, torch.tensor([0, 3]), 2).tolist(),
                         [[0, 2], [4, 0]])
        self.assertEqual(online_algorithms.differing_positions(ids, real, torch.tensor([0, 1]),
                                                               torch.tensor([2, 3])).tolist(), [1, 2])

    def test_the_rejected_response_is_the_first_nearest_or_farthest_of_the_lowest(self):
        def distance(batch, a, b):  # the slow reference: position by position
            ids, real = batch.completion_ids.tolist(), batch.real.tolist()
            return sum(int(ids[a][t] != ids[b][t] or real[a][t] != real[b][t]) for t in range(len(ids[a])))

        picks = {}
        for choice in online_settings.DPO_REJECTED:
            state = online_tokens.setup(algorithm="dpo", seed=3, dpo_rejected=choice, group_size=8)
            shuffled(state, 6)
            picks[choice] = rollout_with_credit(state)
        batch, first = picks["first"]
        self.assertGreater(first.chosen.numel(), 3)
        for choice, (other, credit) in picks.items():
            self.assertTrue(torch.equal(other.completion_ids, batch.completion_ids))  # one batch for the three
            self.assertTrue(torch.equal(credit.chosen, first.chosen))  # the chosen does not depend on the choice
        for pair, (chosen, rejected) in enumerate(zip(first.chosen.tolist(), first.rejected.tolist())):
            start = chosen - chosen % 8
            rewards = batch.rewards[start:start + 8]
            lowest = [start + g for g in range(8) if rewards[g] == rewards.min()]
            distances = {row: distance(batch, chosen, row) for row in lowest}
            self.assertEqual(rejected, lowest[0])
            nearest, farthest = picks["nearest"][1].rejected[pair].item(), picks["farthest"][1].rejected[pair].item()
            self.assertEqual(nearest, min(lowest, key=lambda row: (distances[row], row)))
            self.assertEqual(farthest, min(lowest, key=lambda row: (-distances[row], row)))
        differs = [picks["nearest"][1].rejected, picks["farthest"][1].rejected]
        self.assertFalse(torch.equal(*differs))  # the choice changes some pairs on this batch
        self.assertNotIn("dpo_rejected", online_tokens.settings_of(online_tokens.setup(algorithm="dpo", seed=3)))


# ---------------------------------------------------------------------------------------------
# The GRPO family's switches
# ---------------------------------------------------------------------------------------------


class GroupFamilySwitches(unittest.TestCase):
    def test_advantage_sign_keeps_one_sign_and_the_two_add_up_to_both(self):
        credits = {}
        for sign in ("both", "positive", "negative"):
            state = online_tokens.setup(seed=6, advantage_sign=sign)
            shuffled(state, 2)
            credits[sign] = rollout_with_credit(state)[1].advantages
        both, positive, negative = credits["both"], credits["positive"], credits["negative"]
        self.assertTrue(bool((both > 0).any()) and bool((both < 0).any()))  # the batch has both signs
        self.assertTrue(torch.equal(positive, torch.where(both > 0, both, torch.zeros_like(both))))
        self.assertTrue(torch.equal(negative, torch.where(both < 0, both, torch.zeros_like(both))))
        self.assertTrue(torch.equal(positive + negative, both))
        self.assertNotIn("advantage_sign", online_tokens.settings_of(online_tokens.setup(seed=6)))
        with self.assertRaisesRegex(ValueError, "advantage_sign"):
            resolve({"algorithm": "dpo", "advantage_sign": "negative"})

    def test_kl_in_the_reward_is_beta_times_the_summed_estimate(self):
        state = online_tokens.setup(seed=6, kl_in="reward", kl_estimator="k1", beta=0.5)
        shuffled(state, 2)
        batch = online_tokens.rollout(state)
        kept = batch.mask.bool()
        summed = torch.where(kept, batch.old_logps - batch.ref_logps, torch.zeros_like(batch.old_logps))
        torch.testing.assert_close(batch.scores, batch.rewards - 0.5 * summed.sum(dim=1), rtol=0, atol=1e-14)

    def test_overlong_penalty_and_masked_truncation(self):
        state = online_tokens.setup(seed=3, max_new_tokens=4, overlong_penalty=2, mask_truncated=True)
        batch, credit = rollout_with_credit(state)
        lengths = batch.mask.sum(dim=1)
        expected = batch.rewards + torch.where(lengths <= 2, torch.zeros_like(batch.rewards), (2.0 - lengths) / 2)
        torch.testing.assert_close(batch.scores, expected, rtol=0, atol=1e-15)
        self.assertTrue(bool(batch.truncated.any()))
        logps = current_logps(state, batch).detach().requires_grad_(True)
        grpo_policy_loss(logps, batch.old_logps, batch.ref_logps, credit.advantages, credit.loss_mask).backward()
        self.assertEqual(logps.grad[batch.truncated].abs().max().item(), 0.0)
        self.assertEqual(credit.loss_mask[batch.truncated].abs().max().item(), 0)
        row = online_tokens.record(state, batch, credit, online_tokens.update(state, batch, credit), 1)
        self.assertEqual(row["masked_truncated"], int(batch.truncated.sum()))

    def test_a_batch_whose_every_response_is_masked_takes_no_step(self):
        # with top-p 1e-9 only one token of the uniform start is ever sampled, a digit (ties sort to token 0):
        # every response runs to the cap, is truncated and masked out
        rows = online_tokens.train(steps=2, mask_truncated=True, rollout_top_p=1e-9)[0]
        self.assertEqual([row["optimizer_steps"] for row in rows], [0, 0, 0])
        self.assertEqual([row["masked_truncated"] for row in rows[1:]], [64, 64])

    def test_a_random_reward_ignores_the_answer_and_the_verifiers_is_logged_beside_it(self):
        # probability 1: every response scores 1 and every group ties; the row's success
        # rate and true_reward_mean are the verifier's, which the same seed's default batch shows
        rows = online_tokens.train(steps=2, random_reward=1.0)[0]
        default = online_tokens.train(steps=1)[0]
        self.assertEqual([row["reward_mean"] for row in rows[1:]], [1.0, 1.0])
        # advantages 0 and the policy at its reference (k3's gradient 0 there): every gradient is 0, it never moves
        self.assertEqual({row["success_probability"] for row in rows}, {rows[0]["success_probability"]})
        self.assertEqual(rows[1]["true_reward_mean"], default[1]["reward_mean"])
        self.assertEqual(rows[1]["success_rate"], default[1]["success_rate"])
        self.assertNotIn("true_reward_mean", default[1])
        state = online_tokens.setup(seed=4, random_reward=0.5)
        batch = online_tokens.rollout(state)
        self.assertEqual(set(batch.rewards.tolist()), {0.0, 1.0})
        torch.testing.assert_close(batch.true_rewards, state.task.rewards(batch.prompts, batch.completion_ids,
                                                                          batch.real, batch.truncated))

    def test_a_random_reward_and_a_loophole_are_refused_where_they_change_nothing(self):
        for options, flag in (({"random_reward": 0.5, "advantage": "gdpo", "policy": "transformer"}, "advantage"),
                              ({"verifier_loophole": "reuse"}, "verifier_loophole"),
                              ({"random_reward": 1.5}, "random_reward")):
            with self.subTest(options=options), self.assertRaisesRegex(ValueError, f"^{flag}"):
                resolve(options)

    def test_dynamic_sampling_keeps_groups_that_vary_and_counts_every_response(self):
        state = online_tokens.setup(seed=7, dynamic_sampling=True)
        batch = online_tokens.rollout(state)
        grouped = batch.rewards.reshape(8, 8)
        self.assertFalse(bool((grouped == grouped[:, :1]).all(dim=1).any()))  # every group varies
        self.assertGreater(batch.responses_sampled, 64)
        self.assertEqual(batch.responses_sampled % 64, 0)  # whole batches of 8 prompts were drawn
        self.assertGreater(batch.filtered_groups, 0)
        self.assertGreaterEqual(batch.tokens_sampled, int(batch.mask.sum()))

    def test_importance_weights_are_1_without_mismatch_and_capped_with_one(self):
        same, credit = rollout_with_credit(online_tokens.setup(seed=2, rollout_temperature=1.0, tis_cap=2.0))
        kept = same.mask.bool()
        torch.testing.assert_close(credit.importance_weights[kept], torch.ones(int(kept.sum()), dtype=DTYPE),
                                   rtol=0, atol=1e-14)
        state = online_tokens.setup(seed=2, rollout_temperature=3.0, tis_cap=1.5)
        shuffled(state, 5)  # a uniform table looks the same at every temperature: give it preferences
        hot, credit = rollout_with_credit(state)
        weights = credit.importance_weights[hot.mask.bool()]
        self.assertLess(weights.min().item(), 1.0)
        self.assertEqual(weights.max().item(), 1.5)
        self.assertEqual(credit.importance_weights[~hot.mask.bool()].abs().max().item(), 0.0)
        torch.testing.assert_close(nucleus(t([[0.5, 0.3, 0.2]]), 0.75), t([[0.625, 0.375, 0.0]]),
                                   rtol=0, atol=1e-15)  # 0.5 + 0.3 reach 0.75: 0.2 is cut

    def test_gspo_sees_sequence_ratio_1_on_the_first_pass(self):
        rows = online_tokens.train(algorithm="gspo", steps=2, seed=1)[0]
        self.assertEqual(rows[1]["ratio_max"] >= 1.0 >= rows[1]["ratio_min"], True)
        state = online_tokens.setup(algorithm="gspo", seed=1)
        batch, _ = rollout_with_credit(state)
        ratio = sequence_log_ratio(current_logps(state, batch), batch.old_logps, batch.mask).exp()
        self.assertEqual(ratio.tolist(), [1.0] * 64)


# ---------------------------------------------------------------------------------------------
# The second wave (SPEC section 9): registered losses, advantages and switches
# ---------------------------------------------------------------------------------------------

# loss -> (options that differ from its defaults, the atom's keywords they must reach); beta 0.02 besides
WIRING = {
    "dppo-tv": ({"epsilon": 0.05, "epsilon_high": 0.1, "dppo_cap": 1.5},
                {"kind": "tv", "delta": 0.05, "delta_high": 0.1, "cap": 1.5, "reduction": "token"}),
    "dppo-kl": ({"epsilon": 0.01, "dppo_cap": 1.5}, {"kind": "kl", "delta": 0.01, "cap": 1.5, "reduction": "token"}),
    "gmpo": ({"epsilon": 0.05, "epsilon_high": 0.1}, {"epsilon": 0.05, "epsilon_high": 0.1}),
    "clip-cov": ({"epsilon": 0.05, "cov_fraction": 0.2, "cov_low": -5.0, "cov_high": 5.0},
                 {"epsilon": 0.05, "fraction": 0.2, "cov_low": -5.0, "cov_high": 5.0, "reduction": "token"}),
    "kl-cov": ({"cov_fraction": 0.2, "kl_cov_coef": 2.0}, {"fraction": 0.2, "coef": 2.0, "reduction": "token"}),
    "dro": ({"dro_tau": 3.0}, {"tau": 3.0, "reduction": "token"}),
    "gpg": ({"reduction": "sequence"}, {"reduction": "sequence"}),
    "topr": ({"reduction": "sequence"}, {"reduction": "sequence"}),
    "cegppo": ({"epsilon": 0.05, "cegppo_beta1": 0.3, "cegppo_beta2": 2.0, "dual_clip": 2.0},
               {"epsilon": 0.05, "beta1": 0.3, "beta2": 2.0, "dual_clip": 2.0, "reduction": "token"}),
    "vespo": ({"vespo_k_pos": 1.0, "vespo_lambda_pos": 0.5, "vespo_k_neg": 1.5, "vespo_lambda_neg": 0.7},
              {"k_pos": 1.0, "lambda_pos": 0.5, "k_neg": 1.5, "lambda_neg": 0.7, "reduction": "token"}),
    "luspo": ({"epsilon": 0.01, "epsilon_high": 0.02}, {"epsilon": 0.01, "epsilon_high": 0.02}),
}
FIRST_WAVE = ("grpo", "cispo", "gspo", "sapo")
NEW_ADVANTAGES = ("maxrl", "reinforce-pp", "reinforce-pp-baseline", "opo", "passk", "gpg")


def moved_batch(options, seed=3):
    """A run's batch, credit and the log-probs after one update on it (ratios away from 1)."""
    state = online_tokens.setup(seed=seed, **options)
    shuffled(state, 4)
    batch, credit = rollout_with_credit(state)
    online_tokens.update(state, batch, credit)
    return state, batch, credit


def reinforce_pp_by_hand(scores, lengths):
    """REINFORCE++ at gamma 1 with the reward on the last token: every kept token's return is the response's
    score; whitened over the kept tokens (unbiased variance, + 1e-8 in the sqrt), a loop over responses."""
    tokens = [score for score, length in zip(scores.tolist(), lengths.tolist()) for _ in range(length)]
    mean = math.fsum(tokens) / len(tokens)
    variance = math.fsum((value - mean) ** 2 for value in tokens) / (len(tokens) - 1)
    return t([(score - mean) / math.sqrt(variance + 1e-8) for score in scores.tolist()])


class SecondWave(unittest.TestCase):
    def test_every_registered_loss_is_its_atom_with_the_settings_its_entry_names(self):
        self.assertEqual(set(WIRING) | set(FIRST_WAVE), set(POLICY_LOSSES))
        for name, (options, keywords) in WIRING.items():
            with self.subTest(loss=name):
                state, batch, credit = moved_batch({"algorithm": name, **options})
                entry = POLICY_LOSSES[name]
                logps = current_logps(state, batch)
                draws = torch.Generator().set_state(state.generator.get_state())  # Clip-Cov's draw, replayed
                loss = state.algorithm.loss(logps, batch, credit, first_pass=False, logits=None)[0]
                atom = getattr(rl_lab, entry.atom)
                inputs = (logps, batch.old_logps, batch.ref_logps) if entry.old_policy else (logps, batch.ref_logps)
                extra = {"max_new_tokens": 5} if "reduction" in keywords else {}
                if entry.generator:
                    extra["generator"] = draws
                expected = atom(*inputs, credit.advantages, batch.mask, beta=0.02, **keywords, **extra)
                self.assertEqual(loss.item(), expected.item())
                # the settings change the loss: a loop that dropped them would fail above
                defaults = {key: value for key, value in keywords.items() if key == "kind"}
                defaults.update({"tau": 0.1} if "tau" in keywords else {})  # DRO's atom has no default tau
                if entry.generator:
                    extra["generator"] = torch.Generator().set_state(state.generator.get_state())
                plain = atom(*inputs, credit.advantages, batch.mask, beta=0.02, **defaults, **extra)
                self.assertNotAlmostEqual(plain.item(), expected.item(), places=9)

    def test_every_registered_advantage_is_its_atom_on_the_scores(self):
        for name in NEW_ADVANTAGES:
            with self.subTest(advantage=name):
                state = online_tokens.setup(seed=3, advantage=name)
                shuffled(state, 4)
                batch = online_tokens.rollout(state)
                grouped, lengths = batch.scores.reshape(8, 8), batch.mask.sum(dim=1)
                expected = {
                    "maxrl": lambda: rl_lab.maxrl_advantages(grouped),
                    "reinforce-pp": lambda: reinforce_pp_by_hand(batch.scores, lengths),
                    "reinforce-pp-baseline": lambda: rl_lab.reinforce_pp_baseline_advantages(grouped,
                                                                                          lengths.reshape(8, 8)),
                    "opo": lambda: rl_lab.opo_advantages(grouped, lengths.reshape(8, 8)),
                    "passk": lambda: rl_lab.passk_advantages(grouped),
                    "gpg": lambda: rl_lab.gpg_advantages(grouped),
                }[name]().reshape(-1)
                advantages = online_tokens.credit(state, batch).advantages
                torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-12)
                grpo = rl_lab.group_relative_advantages(batch.scores, 8, eps=1e-4)
                self.assertGreater((advantages - grpo).abs().max().item(), 1e-3)  # not GRPO's under another name

    def test_each_new_loss_and_advantage_learns_the_binary_task(self):
        # 10 iterations from 0.0535: each passes 0.35 on seed 7; with the advantages' sign flipped each falls
        # to 0.001, with them zeroed each stays at 0.053
        runs = [{"algorithm": name} for name in WIRING] + [{"advantage": name} for name in NEW_ADVANTAGES]
        results = parallel_calls([("online_tokens", "train", (), {"steps": 10, **options}) for options in runs])
        for options, (rows, _) in zip(runs, results):  # computed at once, over the machine's cores
            with self.subTest(**options):
                self.assertAlmostEqual(rows[0]["success_probability"], 0.0535, delta=1e-4)
                self.assertGreater(rows[-1]["success_probability"], 0.35)

    def test_rollout_correction_token_truncate_is_tis_and_the_sequence_mask_keeps_whole_responses(self):
        def weights(**options):
            state = online_tokens.setup(seed=2, rollout_temperature=3.0, **options)
            shuffled(state, 5)
            batch, credit = rollout_with_credit(state)
            return batch, credit.importance_weights

        batch, tis = weights(tis_cap=1.5)
        _, token = weights(rollout_correction="token", rollout_correction_high=1.5)
        self.assertTrue(torch.equal(tis, token))
        self.assertEqual(token.max().item(), 1.5)
        _, masked_weights = weights(rollout_correction="sequence", rollout_correction_mode="mask",
                                    rollout_correction_low=0.5, rollout_correction_high=2.0)
        kept = batch.mask.bool()
        for row in range(batch.mask.shape[0]):  # a loop over responses: exp(sum of old - sampler), or 0 outside
            log_weight = math.fsum((batch.old_logps[row][kept[row]] - batch.sampler_logps[row][kept[row]]).tolist())
            weight = math.exp(log_weight) if 0.5 <= math.exp(log_weight) <= 2.0 else 0.0
            torch.testing.assert_close(masked_weights[row][kept[row]], torch.full((int(kept[row].sum()),), weight,
                                                                                dtype=DTYPE), rtol=1e-12, atol=0)
            self.assertEqual(masked_weights[row][~kept[row]].abs().sum().item(), 0.0)
        self.assertTrue(0 < int((masked_weights[:, 0] == 0).sum()) < batch.mask.shape[0])  # some masked, not all

    def test_the_off_policy_mask_drops_only_negative_responses_far_from_the_sampler(self):
        state, batch, credit = moved_batch({"rollout_temperature": 2.0, "off_policy_mask": 0.05, "reduction": "token"})
        logps = current_logps(state, batch).detach()
        masks = state.algorithm.masks(logps, batch, credit, None)
        kept = batch.mask.bool()
        dropped = []
        for row in range(kept.shape[0]):  # a loop over responses
            gap = (batch.sampler_logps[row] - logps[row])[kept[row]].mean().item()
            dropped.append(credit.advantages[row].item() < 0 and gap > 0.05)
            self.assertEqual(masks.keep[row].tolist(), [0.0 if dropped[-1] else 1.0] * 5)
        self.assertTrue(0 < sum(dropped) < int((credit.advantages < 0).sum()))
        self.assertEqual(masks.columns["off_policy_masked_fraction"], sum(dropped) / 64)
        # as TRL: a dropped response's policy term is 0, its tokens stay in the token mean's count
        self.assertTrue(torch.equal(masks.loss_mask, credit.loss_mask))
        loss = state.algorithm.loss(logps, batch, credit, first_pass=False)[0]
        expected = grpo_policy_loss(logps, batch.old_logps, batch.ref_logps, credit.advantages, batch.mask, beta=0.02,
                                    reduction="token", importance_weights=masks.keep)
        self.assertEqual(loss.item(), expected.item())
        # a loss that takes no weights (VESPO) drops the responses from its mask instead
        state, batch, credit = moved_batch({"algorithm": "vespo", "rollout_temperature": 2.0, "off_policy_mask": 0.05})
        logps = current_logps(state, batch).detach()
        masks = state.algorithm.masks(logps, batch, credit, None)
        self.assertIsNone(masks.keep)
        kept = batch.mask.bool()
        for row in range(kept.shape[0]):
            gap = (batch.sampler_logps[row] - logps[row])[kept[row]].mean().item()
            drop = credit.advantages[row].item() < 0 and gap > 0.05
            self.assertEqual(masks.loss_mask[row].tolist(), [0] * 5 if drop else credit.loss_mask[row].tolist())
        self.assertGreater(masks.columns["off_policy_masked_fraction"], 0.0)

    def test_m2po_drops_the_largest_squared_log_ratios_until_their_mean_is_below_the_threshold(self):
        state, batch, credit = moved_batch({"rollout_temperature": 2.0, "m2po": 0.04})
        logps = current_logps(state, batch).detach()
        masks = state.algorithm.masks(logps, batch, credit, None)
        squared = (logps - batch.sampler_logps).square()
        kept, left = batch.mask.bool(), masks.loss_mask.bool()
        self.assertLess(squared[left].mean().item(), 0.04)
        self.assertGreaterEqual(squared[kept & ~left].min().item(), squared[left].max().item())
        self.assertGreater(int((kept & ~left).sum()), 0)
        self.assertAlmostEqual(masks.columns["m2po_masked_fraction"], int((kept & ~left).sum()) / int(kept.sum()),
                               places=15)

    def test_k3_is_and_k3_plus_have_k3s_value_and_k2s_gradient_on_the_first_pass(self):
        def first_pass(estimator):
            state = online_tokens.setup(seed=4, beta=0.5, kl_estimator=estimator)
            shuffled(state, 8)  # the policy leaves the reference (snapshotted at setup): the KL is not 0
            batch, credit = rollout_with_credit(state)
            logps = current_logps(state, batch).detach().requires_grad_(True)
            loss = state.algorithm.loss(logps, batch, credit, first_pass=True)[0]
            loss.backward()
            return loss.item(), logps.grad

        k3, k3_grad = first_pass("k3")
        k2, k2_grad = first_pass("k2")
        self.assertGreater((k3_grad - k2_grad).abs().max().item(), 1e-6)  # k3's gradient is not k2's
        for estimator in ("k3+", "k3-is"):
            with self.subTest(estimator=estimator):
                value, grad = first_pass(estimator)
                self.assertAlmostEqual(value, k3, places=15)
                torch.testing.assert_close(grad, k2_grad, rtol=0, atol=1e-15)
        value, grad = first_pass("k1+")
        torch.testing.assert_close(grad, k2_grad, rtol=0, atol=1e-15)

    def test_the_entropy_bonus_is_minus_coef_times_the_token_mean_entropy(self):
        state = online_tokens.setup(seed=5, entropy_coef=0.1)
        shuffled(state, 3)
        batch, credit = rollout_with_credit(state)
        logits = state.policy.logits(batch.prompts, batch.completion_ids)
        logps = logps_of_tokens(logits, batch.completion_ids)
        loss = state.algorithm.loss(logps, batch, credit, first_pass=True, logits=logits)[0]
        plain = online_algorithms.GroupFamily(resolve({})).loss(logps, batch, credit, first_pass=True)[0]
        kept = batch.mask.bool()
        probs = torch.softmax(logits, dim=-1)
        entropy = -(probs * torch.log_softmax(logits, dim=-1)).sum(dim=-1)[kept].mean()
        self.assertAlmostEqual(loss.item() - plain.item(), -0.1 * entropy.item(), places=14)

    def test_the_adaptive_coefficient_moves_by_delta_each_optimizer_step_within_its_bounds(self):
        # a target above any entropy of 3 tokens (ln 3 = 1.1 nats) raises it; a target near 0 lowers it to 0
        rising = online_tokens.train(steps=3, entropy_coef=0.05, adaptive_entropy=5.0)[0]
        falling = online_tokens.train(steps=3, entropy_coef=0.008, adaptive_entropy=1e-3)[0]
        # the column is the mean of the coefficients the two passes of the iteration used
        for got, expected in zip([row["entropy_coef"] for row in rising[1:]], [0.0525, 0.0625, 0.0725]):
            self.assertAlmostEqual(got, expected, places=12)
        for got, expected in zip([row["entropy_coef"] for row in falling[1:]], [0.0055, 0.0, 0.0]):
            self.assertAlmostEqual(got, expected, places=12)

    def test_the_entropy_mask_keeps_the_top_share_of_kept_tokens(self):
        state = online_tokens.setup(seed=5, top_entropy_quantile=0.25)
        shuffled(state, 3)
        batch, credit = rollout_with_credit(state)
        logits = state.policy.logits(batch.prompts, batch.completion_ids).detach()
        entropies = rl_lab.token_entropy(logits)
        masks = state.algorithm.masks(current_logps(state, batch).detach(), batch, credit, entropies)
        columns = masks.columns
        self.assertTrue(torch.equal(masks.loss_mask, credit.loss_mask))  # as TRL: low-entropy tokens stay counted
        self.assertTrue(torch.equal(masks.bonus_mask.bool(), masks.keep.bool()))  # the bonus averages the kept ones
        kept, left = batch.mask.bool(), masks.keep.bool()
        values = sorted(entropies[kept].tolist())
        threshold = torch.quantile(entropies[kept], 0.75).item()
        self.assertEqual(left.tolist(), (kept & (entropies >= threshold)).tolist())
        # ties at the quantile stay in: at least the top quarter, far from every token
        self.assertTrue(0.25 * len(values) <= int(left.sum()) < 0.5 * len(values))
        self.assertAlmostEqual(columns["entropy_masked_fraction"], 1 - int(left.sum()) / len(values), places=15)

    def test_the_default_folder_names_the_losss_own_reduction(self):
        self.assertEqual(default_output("dppo-tv", {"advantage": "maxrl"}), "results-online-dppo-tv-token-advantage-maxrl")
        self.assertEqual(default_output("topr", {"reduction": "constant"}), "results-online-topr-constant")
        self.assertEqual(default_output("topr", {"reduction": "token"}), "results-online-topr-token")
        self.assertEqual(default_output("luspo", {}), "results-online-luspo-sequence")  # its own, per sequence

    def test_every_entry_has_its_atom_a_colour_of_its_own_and_a_known_mapping(self):
        for name, entry in POLICY_LOSSES.items():
            with self.subTest(loss=name):
                self.assertTrue(callable(getattr(rl_lab, entry.atom)))
                self.assertRegex(entry.color, r"^#[0-9a-f]{6}$")
        colors = [entry.color for entry in POLICY_LOSSES.values()] + list(online_registry.FAMILY_COLORS.values())
        self.assertEqual(len(set(colors)), len(colors))
        for name, entry in online_registry.ADVANTAGES.items():
            self.assertTrue(callable(getattr(rl_lab, entry.atom)), name)


# ---------------------------------------------------------------------------------------------
# The transformer policy on Countdown (online_tokens.py --policy transformer)
# ---------------------------------------------------------------------------------------------


TASK_COUNTDOWN = CountdownTask()


def state_model(options):
    """The SFT start of a transformer run with these options (loaded from its cache)."""
    return online_tokens.setup(**options).policy.model


class TransformerRuns(unittest.TestCase):
    # a short SFT start of its own (the default one takes half a minute), in the cache of the atlas's --quick
    # runs (results-sft/quick, ignored by git, a folder per setting): trained by the first run of the suite
    # in this checkout, loaded by the next ones
    small = {"policy": "transformer", "sft_steps": 40, "sft_folder": os.path.join(HERE, "results-sft", "quick"),
             "prompts": 4, "group_size": 4, "eval_prompts": 4, "eval_samples": 0}
    SWITCHES = {"rollout_correction": "token", "off_policy_mask": 0.5, "m2po": 0.04, "kl_estimator": "k3-is",
                "entropy_coef": 0.01, "adaptive_entropy": 0.3, "top_entropy_quantile": 0.5}
    PRECISIONS = (("float64", None), ("float32", None), ("float32", "bfloat16"), ("float32", "float16"))

    @classmethod
    def jobs(cls):
        """{name: shared_calls job} of the class's runs."""
        jobs = {("algorithm", name): {"steps": 2, "algorithm": name} for name in online_tokens.ALGORITHMS}
        for options in cls.second_wave_options():
            jobs[("second wave", tuple(options.items()))] = {"steps": 1, **options}
        for trainer, sampler in cls.PRECISIONS:
            jobs[("precision", trainer, sampler)] = {"steps": 1, "dtype": trainer, "sampler_dtype": sampler}
        jobs[("pass@k",)] = {"steps": 1, "eval_samples": 4}
        jobs[("seed 3",)] = {"steps": 2, "seed": 3}
        jobs[("seed 4",)] = {"steps": 2, "seed": 4}
        return {name: ("online_tokens", "train", (), {**cls.small, **options}) for name, options in jobs.items()}

    @classmethod
    def setUpClass(cls):  # the class's runs, collected from the prefetch below (it loads or trains the start first)
        jobs = cls.jobs()
        cls.runs = dict(zip(jobs, shared_calls(list(jobs.values()))))

    @classmethod
    def second_wave_options(cls):
        return [{"advantage": name} for name in NEW_ADVANTAGES + ("gdpo",)] + [cls.SWITCHES]

    def test_every_algorithm_runs_and_reports_the_transformers_columns(self):
        for algorithm in online_tokens.ALGORITHMS:
            with self.subTest(algorithm=algorithm):
                rows, report = self.runs[("algorithm", algorithm)]
                self.assertEqual(list(rows[0]), online_tokens.COLUMNS + online_tokens.TRANSFORMER_COLUMNS)
                self.assertEqual(list(report)[:3], ["settings", "trl", "verl"])
                self.assertEqual((report["settings"]["policy"], report["settings"]["task"]), ("transformer", "countdown"))
                self.assertEqual(rows[-1]["optimizer_steps"] > 0, rows[-1]["pairs"] > 0 or algorithm != "dpo")
                self.assertNotIn("evaluation", report)  # eval_samples 0

    def test_the_second_waves_advantages_and_switches_run_and_add_their_columns(self):
        extra = ["off_policy_masked_fraction", "m2po_masked_fraction", "entropy_masked_fraction", "entropy_coef"]
        for options in self.second_wave_options():
            with self.subTest(**options):
                rows, report = self.runs[("second wave", tuple(options.items()))]
                columns = online_tokens.COLUMNS + online_tokens.TRANSFORMER_COLUMNS
                self.assertEqual(list(rows[0]), columns + (extra if options == self.SWITCHES else []))
                self.assertEqual(rows[-1]["optimizer_steps"], 2)
                self.assertTrue(all(math.isfinite(rows[-1][name]) for name in columns + extra if name in rows[-1]))
                self.assertEqual({name: report["settings"][name] for name in options}, options)

    def test_gdpo_normalizes_countdowns_correctness_and_format_apart(self):
        state = online_tokens.setup(advantage="gdpo", **self.small)
        batch, credit = rollout_with_credit(state)
        components = TASK_COUNTDOWN.reward_components(batch.prompts, batch.completion_ids, batch.real, batch.truncated)
        self.assertTrue(torch.equal(batch.reward_components, components))
        self.assertEqual(components[:, 0].tolist(), TASK_COUNTDOWN.correct(batch.rewards).double().tolist())
        expected = rl_lab.gdpo_advantages(components.reshape(4, 4, 2)).reshape(-1).to(credit.advantages.dtype)
        torch.testing.assert_close(credit.advantages, expected, rtol=0, atol=0)
        self.assertGreater(len(set(components[:, 1].tolist())), 1)  # the format reward varies in this batch

    def test_pass_at_k_before_and_after_on_every_test_prompt(self):
        rows, report = self.runs[("pass@k",)]
        before, after = report["evaluation"]["before"], report["evaluation"]["after"]
        self.assertEqual((before["prompts"], before["samples"], before["split"]), (106, 4, "test"))
        self.assertTrue(0.0 <= before["pass@1"] <= before["pass@4"] <= 1.0)
        self.assertEqual(list(before), list(after))
        # the exact pass@1 of the evaluation and of the row 0 use the same model at the same temperature;
        # the row's is over a fixed draw of 4 test prompts, the evaluation's over all 106
        all_prompts = sft.exact_success(state_model(self.small), TASK_COUNTDOWN, TASK_COUNTDOWN.split_prompts("test"))
        self.assertAlmostEqual(before["exact_pass@1"], all_prompts.mean().item(), places=5)

    def test_one_prompt_table_per_task_shared_by_the_policy_reference_and_snapshots(self):
        state = online_tokens.setup(**self.small)
        table = prompt_table(state.task)
        self.assertIs(prompt_table(state.task), table)  # built once
        everything = list(range(state.task.prompt_count("train") + state.task.prompt_count("test")))
        for built, expected in zip(table, sft.prompt_batch(state.task, everything)):
            self.assertTrue(torch.equal(built, expected))
        prompts = torch.tensor([5, 0, 5, 9])
        for policy in (state.policy, state.reference, state.policy.snapshot()):
            ids, mask = policy.prompt_batch(prompts)
            expected_ids, expected_mask = sft.prompt_batch(state.task, prompts)  # cut to these prompts' width
            self.assertTrue(torch.equal(ids, expected_ids) and torch.equal(mask, expected_mask))

    def test_the_ratio_is_exactly_one_before_the_first_update_in_float64(self):
        state = online_tokens.setup(dtype="float64", **self.small)
        batch, _ = rollout_with_credit(state)
        self.assertEqual(batch.old_logps.dtype, torch.float64)
        self.assertTrue(torch.equal(current_logps(state, batch), batch.old_logps))  # bit for bit

    def test_the_sampler_in_a_lower_precision_differs_from_the_trainer_by_a_measured_amount(self):
        differences = {}
        for trainer, sampler in self.PRECISIONS:
            rows, _ = self.runs[("precision", trainer, sampler)]
            differences[(trainer, sampler)] = rows[1]["sampler_logp_diff_max"]
        # the same precision: the KV cache and the full forward pass add in another order, nothing more
        self.assertLess(differences[("float64", None)], 1e-12)
        self.assertLess(differences[("float32", None)], 1e-5)
        # an inference engine's lower precision: a real mismatch, larger for bfloat16's 8-bit mantissa
        self.assertGreater(differences[("float32", "bfloat16")], 1e-3)
        self.assertGreater(differences[("float32", "bfloat16")], differences[("float32", "float16")])
        self.assertGreater(differences[("float32", "float16")], 10 * differences[("float32", None)])

    def test_arange_positions_on_left_padded_prompts_are_a_sampler_trainer_mismatch(self):
        right = online_tokens.rollout(online_tokens.setup(dtype="float64", **self.small))
        bug = online_tokens.rollout(online_tokens.setup(dtype="float64", position_ids="arange", **self.small))
        self.assertTrue(torch.equal(right.completion_ids, bug.completion_ids))  # the sampler is the same
        padded = torch.tensor([len(tokens) < 9 for tokens in TASK_COUNTDOWN.prompt_tokens(bug.prompts)])
        kept = bug.mask.bool()
        difference = (bug.sampler_logps - bug.old_logps).abs()
        torch.testing.assert_close(right.sampler_logps[kept], right.old_logps[kept], rtol=0, atol=1e-12)
        self.assertTrue(bool(padded.any()) and bool((~padded).any()))
        # only the prompts that were padded (a one-digit target: 8 tokens, not 9) are scored wrongly
        self.assertGreater(difference[padded.unsqueeze(1) & kept].max().item(), 1e-3)
        self.assertLess(difference[~padded.unsqueeze(1) & kept].max().item(), 1e-12)

    def test_a_sampler_whose_logits_overflow_its_precision_stops_the_run(self):
        state = online_tokens.setup(sampler_dtype="float16", **self.small)
        with torch.no_grad():  # weights far beyond what float16 holds once multiplied through the layers
            for parameter in state.policy.parameters():
                parameter.mul_(1e4)
        with self.assertRaises(FloatingPointError):  # never NaN log-probs in a batch
            online_tokens.rollout(state)

    def test_the_default_folder_names_the_settings_but_not_the_sft_folder_and_stays_short(self):
        from online_settings import default_output
        self.assertEqual(default_output("grpo", {"policy": "transformer", "sft_folder": "/tmp/x/../y"}),
                         "results-online-transformer-grpo-sequence")
        self.assertEqual(default_output("grpo", {"policy": "transformer", "learning_rate": 1e-3}),
                         "results-online-transformer-grpo-sequence-learning-rate-0.001")
        many = {"policy": "transformer", "eval_prompts": 3, "eval_samples": 5, "sampler_dtype": "float16",
                "steps": 7, "prompts": 3, "group_size": 5, "temperature": 0.9, "learning_rate": 1e-4, "seed": 11}
        long_name = default_output("grpo", many)
        self.assertLessEqual(len(long_name), 120)
        self.assertNotEqual(long_name, default_output("grpo", {**many, "seed": 12}))  # the digest tells them apart

    def test_a_run_under_inference_mode_is_the_same_run(self):
        with torch.inference_mode():
            inside = online_tokens.train(steps=2, seed=4, **self.small)
            self.assertTrue(torch.is_inference_mode_enabled())  # the caller's mode, kept
        self.assertEqual(inside, self.runs[("seed 4",)])  # the same run outside it, in a worker process
        with torch.inference_mode():
            self.assertEqual(online_tokens.train(steps=2, seed=4)[0], online_tokens.train(steps=2, seed=4)[0])

    def test_the_kv_cache_draws_the_same_responses_as_full_forward_passes(self):
        batches = []
        for use_cache in (True, False):
            state = online_tokens.setup(dtype="float64", use_cache=use_cache, **self.small)
            batches.append(online_tokens.rollout(state))
        self.assertTrue(torch.equal(batches[0].completion_ids, batches[1].completion_ids))
        torch.testing.assert_close(batches[0].sampler_logps, batches[1].sampler_logps, rtol=0, atol=1e-12)

    def test_the_same_seed_gives_the_same_run(self):
        first = self.runs[("seed 3",)]  # computed in a worker process, the second here
        self.assertEqual(first, online_tokens.train(steps=2, seed=3, **self.small))

    def test_the_kl_to_the_reference_is_the_chain_rule_sum_over_the_sampled_prefixes(self):
        state = online_tokens.setup(**self.small)
        with torch.no_grad():  # a policy away from its reference
            for parameter in state.policy.parameters():
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
        batch = online_tokens.rollout(state)
        old = state.policy.snapshot()
        with torch.no_grad():
            logp = torch.log_softmax(old.logits(batch.prompts, batch.completion_ids), dim=-1)
            ref = torch.log_softmax(state.reference.logits(batch.prompts, batch.completion_ids), dim=-1)
        total = 0.0
        for n in range(batch.mask.shape[0]):
            for position in range(int(batch.mask[n].sum())):
                p, q = logp[n, position].double(), ref[n, position].double()
                total += float((p.exp() * (p - q)).sum())
        self.assertGreater(batch.kl_reference, 0.0)
        self.assertAlmostEqual(batch.kl_reference, total / batch.mask.shape[0], delta=1e-5)


# ---------------------------------------------------------------------------------------------
# Learning: the four algorithms and the GRPO family's variants on seeds 0, 7 and 19
# ---------------------------------------------------------------------------------------------

LEARNING_SEEDS = (0, 7, 19)


# 8 of the default 60 iterations, from 0.0535: every run below passes 0.44 by then on every seed (the
# lowest, dpo on seed 7), and with the update's sign flipped (the loss negated before backward) every one
# ends below 0.003; without an update each stays at 0.0535. LEARNING_THRESHOLD sits between.
LEARNING_STEPS = 8
LEARNING_THRESHOLD = 0.3
# Offline DPO has reached its plateau by 20 iterations (0.44-0.63 on these seeds, about where it stays at the
# default 60), while online DPO is at 0.94-0.98 by then; offline DPO scored on fresh pairs (the bug of
# sampling from the current policy) would be online DPO, and the gap would be 0.
STALL_STEPS = 20
LEARNING_RUNS = [{"algorithm": algorithm, "steps": LEARNING_STEPS} for algorithm in online_tokens.FOUR_ALGORITHMS] + [
    {"steps": LEARNING_STEPS, **options} for options in (
        {"algorithm": "gspo"}, {"algorithm": "sapo"}, {"advantage": "rloo"}, {"scale_rewards": "none"},
        {"scale_rewards": "batch"}, {"epsilon_high": 0.28}, {"dual_clip": 3.0}, {"kl_estimator": "k1"},
        {"kl_estimator": "k2"}, {"dynamic_sampling": True})] + [
    {"algorithm": "dpo", "offline": True, "steps": STALL_STEPS}, {"algorithm": "dpo", "steps": STALL_STEPS}]


class Learning(unittest.TestCase):
    @classmethod
    def setUpClass(cls):  # the 48 runs at once, over the machine's cores (each deterministic)
        shared_calls([("online_tokens", "train", (), {"seed": seed, **options})
                      for options in LEARNING_RUNS for seed in LEARNING_SEEDS])

    def assert_learns(self, options, seeds=LEARNING_SEEDS, threshold=LEARNING_THRESHOLD):
        for seed in seeds:
            with self.subTest(seed=seed, **options):
                rows, report = cached_online(seed=seed, steps=LEARNING_STEPS, **options)
                self.assertAlmostEqual(report["initial_success_probability"], 0.0535, delta=1e-4)
                self.assertGreater(rows[-1]["success_probability"], threshold)

    def test_ppo_dpo_grpo_cispo_learn_at_one_budget(self):
        for algorithm in online_tokens.FOUR_ALGORITHMS:
            self.assert_learns({"algorithm": algorithm})

    def test_the_grpo_familys_variants_learn(self):
        for options in ({"algorithm": "gspo"}, {"algorithm": "sapo"}, {"advantage": "rloo"},
                        {"scale_rewards": "none"}, {"scale_rewards": "batch"}, {"epsilon_high": 0.28},
                        {"dual_clip": 3.0}, {"kl_estimator": "k1"}, {"kl_estimator": "k2"},
                        {"dynamic_sampling": True}):
            self.assert_learns(options)

    def test_offline_dpo_learns_something_and_stalls_below_online_dpo(self):
        # README: offline DPO learns only from the initial policy's pairs and stalls near 0.6 (a result,
        # not a bug), while online DPO at the same budget passes 0.9 on the same seeds
        for seed in LEARNING_SEEDS:
            offline = cached_online(seed=seed, algorithm="dpo", offline=True, steps=STALL_STEPS)
            online = cached_online(seed=seed, algorithm="dpo", steps=STALL_STEPS)
            offline, online = (run[0][-1]["success_probability"] for run in (offline, online))
            self.assertTrue(0.3 < offline < 0.8, offline)
            self.assertGreater(online - offline, 0.1)


# the runs of the two slowest classes, computed beside the tests that run before them, in the order the tests
# need them, each list one run after the other (the first transformer run loads their SFT start, or trains it
# on a fresh checkout, and the others load it)
prefetch([("online_tokens", "train", (), {"seed": seed, **options}) for options in LEARNING_RUNS
          for seed in LEARNING_SEEDS])
prefetch(list(TransformerRuns.jobs().values()))


if __name__ == "__main__":
    unittest.main()
