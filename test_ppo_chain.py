"""Tests of ppo_chain.py: the episode-major rollout, GAE credit through time, the seed-7 reference,
learning on three seeds, lambda 0, and the CLI.

    python -m unittest -v test_ppo_chain
"""

import csv
import json
import math
import os
import tempfile
import unittest
from unittest import mock

import torch

import ppo_chain
from lab.testing import float64, run_main, shared_calls, shared_function, single_thread_module
from rl_lab import DTYPE, SEED_LIMIT

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train
t = float64


# ---------------------------------------------------------------------------------------------
# Two-step chain (ppo_chain.py)
# ---------------------------------------------------------------------------------------------

CHAIN_REFERENCE_EXPECTED_RETURN = 0.9995921742541397  # the chain's published run: seed 7, 120 steps, lambda 0.95
CHAIN_REFERENCE_LEFT_PROBABILITY = 0.9997095339889668
CHAIN_LEARNING_SEEDS = (0, 7, 19)
# every run passes 0.97 by step 10; with the GAE advantages or the policy loss negated none does
CHAIN_LEARNING_STEPS = 12


def chain_tables(values=(0.0, 0.0, 0.0), logits=None):
    """(S, A) actor logits (zeros = uniform unless given) and (S,) critic values, float64."""
    actor = torch.zeros(3, 2, dtype=DTYPE) if logits is None else torch.tensor(logits, dtype=DTYPE)
    return actor, torch.tensor(values, dtype=DTYPE)


def chain_batch(seed, episodes=64, values=(0.0, 0.0, 0.0)):
    return ppo_chain.rollout(*chain_tables(values), torch.Generator().manual_seed(seed), episodes)


def chain_first_step_leaks(advantages, rewards, first_index, last_index, lam):
    """Episodes whose first-step advantage is not lam * (their own terminal reward) (zero critic, gamma 1)."""
    return [
        episode for episode, (first, last) in enumerate(zip(first_index, last_index))
        if advantages[first].item() != lam * rewards[last].item()
    ]


class ChainRollout(unittest.TestCase):
    def test_rollout_is_episode_major_with_both_flags_true_only_on_step_one(self):
        values = (0.25, 0.5, 0.75)
        actor, critic = chain_tables(values)
        actor.requires_grad_()
        critic.requires_grad_()
        batch = ppo_chain.rollout(actor, critic, torch.Generator().manual_seed(3), episodes=16)
        self.assertEqual(sorted(batch), sorted(ppo_chain.ROLLOUT_KEYS))
        for key, tensor in batch.items():
            self.assertEqual(tuple(tensor.shape), (32,), key)
            self.assertFalse(tensor.requires_grad, key)
        states, actions = batch["states"].tolist(), batch["actions"].tolist()
        for episode in range(16):
            first, last = 2 * episode, 2 * episode + 1
            self.assertEqual(states[first], 0)
            self.assertEqual(states[last], 1 + actions[first])  # left -> state 1, right -> state 2
            self.assertEqual(batch["rewards"][first].item(), 0.0)
            self.assertEqual(batch["rewards"][last].item(), ppo_chain.REWARDS[states[last]][actions[last]])
            self.assertEqual(batch["values"][first].item(), 0.25)
            self.assertEqual(batch["values"][last].item(), values[states[last]])
            self.assertEqual(batch["next_values"][first].item(), values[states[last]])  # bootstrap V(second state)
            self.assertEqual(batch["next_values"][last].item(), 0.0)  # nothing after a true terminal
            self.assertEqual(batch["terminated"][first].item(), False)
            self.assertEqual(batch["terminated"][last].item(), True)
            self.assertEqual(batch["boundary"].tolist()[first:last + 1], [False, True])
        self.assertTrue(torch.equal(batch["old_logp"], torch.full((32,), -math.log(2.0), dtype=DTYPE)))

    def test_rollout_draws_all_first_actions_then_all_second_actions(self):
        logits = [[0.3, -0.2], [1.0, 0.0], [-0.5, 0.5]]
        actor, critic = chain_tables(logits=logits)
        batch = ppo_chain.rollout(actor, critic, torch.Generator().manual_seed(11), episodes=32)
        # the same stream consumed in the rollout's documented order: one multinomial call per step index
        generator = torch.Generator().manual_seed(11)
        probs = torch.softmax(actor, dim=-1)
        first = torch.multinomial(probs[torch.zeros(32, dtype=torch.long)], 1, generator=generator).squeeze(1)
        second = torch.multinomial(probs[first + 1], 1, generator=generator).squeeze(1)
        self.assertEqual(batch["actions"][0::2].tolist(), first.tolist())
        self.assertEqual(batch["actions"][1::2].tolist(), second.tolist())
        expected_logp = torch.log_softmax(actor, dim=-1)[batch["states"], batch["actions"]]
        self.assertTrue(torch.allclose(batch["old_logp"], expected_logp, rtol=0, atol=1e-15))

    def test_rollout_rejects_bad_arguments_naming_them(self):
        actor, critic = chain_tables()
        generator = torch.Generator().manual_seed(0)
        cases = [
            ("actor", (torch.zeros(4, 2, dtype=DTYPE), critic, generator, 4)),
            ("critic", (actor, torch.zeros(2, dtype=DTYPE), generator, 4)),
            ("generator", (actor, critic, 7, 4)),
            ("episodes", (actor, critic, generator, 0)),
            ("episodes", (actor, critic, generator, True)),
            ("episodes", (actor, critic, generator, 2.0)),
        ]
        for name, args in cases:
            with self.subTest(name=name, args=args[2:]), self.assertRaisesRegex(ValueError, f"^{name}:"):
                ppo_chain.rollout(*args)


class ChainAdvantages(unittest.TestCase):
    def test_chain_first_step_inherits_only_its_own_terminal_reward(self):
        batch = chain_batch(seed=4)
        rewards = batch["rewards"]
        terminal = sorted(set(rewards[1::2].tolist()))
        self.assertEqual(terminal, [0.0, 0.2, 1.0])  # all three outcomes occur, so a leak would show
        first_index, last_index = range(0, 128, 2), range(1, 128, 2)
        for lam in (0.0, 0.95, 1.0):
            with self.subTest(lam=lam):
                advantages, returns = ppo_chain.advantages_and_returns(batch, lam)
                self.assertEqual(chain_first_step_leaks(advantages, rewards, first_index, last_index, lam), [])
                self.assertEqual(advantages[1::2].tolist(), rewards[1::2].tolist())
                self.assertTrue(torch.equal(returns, advantages))  # zero critic: lambda-return = advantage
                rewarded = [e for e in range(64) if rewards[2 * e + 1].item() == 1.0]
                self.assertEqual({advantages[2 * e].item() for e in rewarded}, {lam})  # exactly lambda

    def test_chain_step_major_flattening_leaks_the_next_episodes_reward(self):
        batch = chain_batch(seed=4)
        rewards = batch["rewards"]
        step_major = torch.cat([torch.arange(0, 128, 2), torch.arange(1, 128, 2)])  # e0t0..e63t0, e0t1..e63t1
        shuffled = {key: tensor[step_major] for key, tensor in batch.items()}
        self.assertEqual((rewards[1].item(), rewards[127].item()), (1.0, 0.0))  # episode 0 earns 1, episode 63 nothing
        for lam in (0.95, 1.0):
            with self.subTest(lam=lam):
                advantages, _ = ppo_chain.advantages_and_returns(shuffled, lam)
                # in the shuffled stream episode e's first step sits at e and its last step at 64 + e
                leaks = chain_first_step_leaks(advantages, shuffled["rewards"], range(64), range(64, 128), lam)
                self.assertGreater(len(leaks), 0)
                # the last first step is followed by episode 0's terminal step and inherits ITS reward
                self.assertEqual(advantages[63].item(), lam * rewards[1].item())
                self.assertNotEqual(advantages[63].item(), lam * rewards[127].item())

    def test_chain_advantages_match_a_per_episode_loop_with_a_nonzero_critic(self):
        values = (0.4, 0.9, 0.1)
        batch = chain_batch(seed=2, episodes=32, values=values)
        for lam in (0.0, 0.95, 1.0):
            expected_advantages, expected_returns = [], []
            for episode in range(32):  # the slow reference: each episode on its own, gamma = 1
                second_state = batch["states"][2 * episode + 1].item()
                last = batch["rewards"][2 * episode + 1].item() - values[second_state]  # terminal: no bootstrap
                first = (0.0 + values[second_state] - values[0]) + lam * last
                expected_advantages += [first, last]
                expected_returns += [first + values[0], last + values[second_state]]
            advantages, returns = ppo_chain.advantages_and_returns(batch, lam)
            with self.subTest(lam=lam):
                expected_advantages = torch.tensor(expected_advantages, dtype=DTYPE)
                torch.testing.assert_close(advantages, expected_advantages, rtol=0, atol=1e-15)
                torch.testing.assert_close(returns, torch.tensor(expected_returns, dtype=DTYPE), rtol=0, atol=1e-15)

    def test_chain_time_limit_cut_bootstraps_final_observation_but_terminal_does_not(self):
        values = (0.25, 0.5, 0.75)
        batch = chain_batch(seed=4, episodes=3, values=values)
        # episode 1 is cut by a time limit after its first step: its second transition is never taken
        keep = torch.tensor([0, 1, 2, 4, 5])
        cut = {key: tensor[keep].clone() for key, tensor in batch.items()}
        cut["terminated"][2], cut["boundary"][2] = False, True
        final_observation_value = values[batch["states"][3].item()]
        self.assertEqual(cut["next_values"][2].item(), final_observation_value)
        advantages, _ = ppo_chain.advantages_and_returns(cut, 0.95)
        self.assertEqual(advantages[2].item(), 0.0 + final_observation_value - values[0])
        truly_terminal = dict(cut, terminated=cut["boundary"].clone())
        terminal_advantages, _ = ppo_chain.advantages_and_returns(truly_terminal, 0.95)
        self.assertEqual(terminal_advantages[2].item(), 0.0 - values[0])
        # the cut neither leaks into episode 0 nor receives episode 2's trace
        full, _ = ppo_chain.advantages_and_returns(batch, 0.95)
        self.assertEqual(advantages[[0, 1, 3, 4]].tolist(), full[[0, 1, 4, 5]].tolist())


def learning_runs():
    """{seed: train(80 steps, seed)} and {"lambda 0": the same at seed 7 with gae_lambda 0}: the four runs
    at once, over the machine's cores (each deterministic)."""
    options = {seed: {"seed": seed} for seed in CHAIN_LEARNING_SEEDS}
    options["lambda 0"] = {"seed": 7, "gae_lambda": 0.0}
    results = shared_calls([("ppo_chain", "train", (), {"steps": CHAIN_LEARNING_STEPS, **kwargs})
                            for kwargs in options.values()])
    return dict(zip(options, results))


class ChainTraining(unittest.TestCase):
    @classmethod
    def setUpClass(cls):  # the default run, which test_results compares with the committed one: trained once
        cls.rows, cls.report = shared_calls([("ppo_chain", "train", (), {})])[0]

    def test_chain_seed7_reproduces_the_reference_final_return(self):
        final = self.report["final"]
        self.assertAlmostEqual(final["expected_return"], CHAIN_REFERENCE_EXPECTED_RETURN, delta=1e-9)
        self.assertAlmostEqual(final["left_probability"], CHAIN_REFERENCE_LEFT_PROBABILITY, delta=1e-9)
        self.assertEqual(final, self.rows[-1])
        self.assertEqual(
            (final["step"], final["optimizer_steps"], final["sampled_episodes"], final["sampled_transitions"]),
            (120, 480, 7680, 15360),
        )
        self.assertEqual(self.report["final_action_probabilities"][0][0], final["left_probability"])
        initial = self.report["initial"]
        self.assertAlmostEqual(initial["expected_return"], 0.3, delta=1e-15)
        self.assertEqual(
            (initial["left_probability"], initial["value_start"], initial["old_policy_kl"]), (0.5, 0.0, 0.0)
        )
        self.assertEqual([row["step"] for row in self.rows], list(range(121)))
        self.assertLessEqual(max(row["old_policy_kl"] for row in self.rows), ppo_chain.TARGET_OLD_POLICY_KL)

    def test_chain_report_holds_the_spec_settings(self):
        self.assertEqual(
            list(self.report),
            ["settings", "initial", "final", "first_rollout_trace", "final_action_probabilities"],
        )
        settings = self.report["settings"]
        expected = {
            "seed": 7, "steps": 120, "gae_lambda": 0.95, "gamma": 1.0, "episodes_per_batch": 64,
            "transitions_per_episode": 2, "learning_rate": 0.08, "update_epochs": 4, "clip_epsilon": 0.2,
            "target_old_policy_kl": 0.05, "reference_kl": False, "advantage_normalization": False,
            "device": "cpu", "dtype": "float64", "torch": torch.__version__,
        }
        self.assertEqual({key: settings[key] for key in expected}, expected)

    def test_chain_first_rollout_trace_gives_the_rewarded_first_step_exactly_lambda(self):
        trace = self.report["first_rollout_trace"]
        for key in ppo_chain.ROLLOUT_KEYS + ("advantages", "returns"):
            self.assertEqual(len(trace[key]), 8, key)
        self.assertEqual(trace["episode"], [0, 0, 1, 1, 2, 2, 3, 3])
        self.assertEqual(trace["terminated"], [False, True] * 4)
        self.assertEqual(trace["boundary"], [False, True] * 4)
        self.assertEqual(trace["values"], [0.0] * 8)
        # seed 7: episodes 0-2 go right and end with 0, episode 3 goes left and earns 1
        self.assertEqual(trace["states"], [0, 2, 0, 2, 0, 2, 0, 1])
        self.assertEqual(trace["rewards"], [0.0] * 7 + [1.0])
        self.assertEqual(trace["advantages"], [0.0] * 6 + [0.95, 1.0])  # nothing reaches episode 2
        self.assertEqual(trace["returns"], trace["advantages"])
        self.assertEqual(trace["old_logp"], [-math.log(2.0)] * 8)

    def test_chain_learns_on_seeds_0_7_19_in_12_steps(self):
        runs = learning_runs()
        for seed in CHAIN_LEARNING_SEEDS:
            with self.subTest(seed=seed):
                rows, _ = runs[seed]
                self.assertAlmostEqual(rows[0]["expected_return"], 0.3, delta=1e-15)
                self.assertGreater(rows[-1]["expected_return"], 0.97)
                self.assertGreater(rows[-1]["left_probability"], 0.97)

    def test_chain_lambda_zero_first_step_advantage_is_zero_yet_it_learns(self):
        rows, report = learning_runs()["lambda 0"]
        trace = report["first_rollout_trace"]
        self.assertEqual(trace["advantages"][0::2], [0.0] * 4)  # one-step TD with a zero critic
        self.assertEqual(trace["advantages"][1::2], trace["rewards"][1::2])
        # so the first batch cannot move the start state's policy (zero advantage -> zero gradient, zero Adam step)
        self.assertEqual(rows[1]["left_probability"], 0.5)
        # from the second batch on, the learned V(second state) is bootstrapped into the first step's advantage
        self.assertGreater(rows[2]["left_probability"], 0.6)
        self.assertGreater(rows[-1]["expected_return"], 0.97)

    def test_chain_training_is_reproducible_and_seed_dependent(self):
        first = ppo_chain.train(steps=5, seed=19)
        self.assertEqual(first, ppo_chain.train(steps=5, seed=19))
        other_rows, _ = ppo_chain.train(steps=5, seed=20)
        self.assertNotEqual(first[0][-1]["expected_return"], other_rows[-1]["expected_return"])

    def test_chain_train_rejects_bad_arguments_naming_them(self):
        cases = [
            ("steps", {"steps": 0}), ("steps", {"steps": True}), ("steps", {"steps": 3.0}),
            ("seed", {"seed": -1}), ("seed", {"seed": SEED_LIMIT}), ("seed", {"seed": 7.0}),
            ("gae_lambda", {"gae_lambda": -0.1}), ("gae_lambda", {"gae_lambda": 1.5}),
            ("gae_lambda", {"gae_lambda": float("nan")}), ("gae_lambda", {"gae_lambda": True}),
        ]
        for name, kwargs in cases:
            with self.subTest(**kwargs), self.assertRaisesRegex(ValueError, f"^{name}:"):
                ppo_chain.train(**kwargs)

    def test_chain_early_stop_kl_is_exact_and_averaged_over_visited_states(self):
        old = torch.tensor([[0.0, 0.0], [1.0, -1.0], [0.5, 0.0]], dtype=DTYPE)
        new = torch.tensor([[0.4, 0.0], [1.0, -1.0], [0.0, 0.5]], dtype=DTYPE)
        states = torch.tensor([0, 1, 0, 2, 0, 1])

        def kl_loop(row):
            p = [math.exp(x) / sum(math.exp(y) for y in old[row].tolist()) for x in old[row].tolist()]
            q = [math.exp(x) / sum(math.exp(y) for y in new[row].tolist()) for x in new[row].tolist()]
            return sum(pa * math.log(pa / qa) for pa, qa in zip(p, q))

        expected = sum(kl_loop(s) for s in states.tolist()) / len(states)
        self.assertAlmostEqual(ppo_chain.old_policy_kl(old, new, states), expected, delta=1e-15)

    def test_chain_early_stop_cuts_the_epochs(self):
        # at 0.05 the default run never stops early (480 = 4 x 120 steps); force it
        with mock.patch.object(ppo_chain, "TARGET_OLD_POLICY_KL", 1e-12):
            rows = ppo_chain.train(steps=4, seed=7)[0]
        self.assertEqual([row["optimizer_steps"] for row in rows], [0, 1, 2, 3, 4])
        self.assertGreater(rows[-1]["old_policy_kl"], 1e-12)

    def test_chain_training_leaves_global_torch_state_unchanged(self):
        before = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
        ppo_chain.train(steps=1)
        self.assertEqual((torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()), before)

    def test_chain_training_under_no_grad_or_inference_mode_gives_the_same_rows_and_keeps_the_mode(self):
        expected = ppo_chain.train(steps=2, seed=5)
        for mode in (torch.no_grad, torch.inference_mode):
            with self.subTest(mode=mode.__name__), mode():
                self.assertEqual(ppo_chain.train(steps=2, seed=5), expected)
                self.assertEqual((torch.is_inference_mode_enabled(), torch.is_grad_enabled()),
                                 (mode is torch.inference_mode, False))


class ChainAPIValidation(unittest.TestCase):
    def test_evaluate_advantages_and_rollout_reject_bad_input(self):
        actor, critic = chain_tables()
        cases = [
            ("actor", lambda: ppo_chain.evaluate("a", "b")),
            ("actor", lambda: ppo_chain.evaluate(torch.zeros(4, 2, dtype=DTYPE), critic)),
            ("critic", lambda: ppo_chain.evaluate(actor, torch.zeros(1, dtype=DTYPE))),
            ("actor", lambda: ppo_chain.evaluate(torch.full((3, 2), float("nan"), dtype=DTYPE), critic)),
            ("batch", lambda: ppo_chain.advantages_and_returns({}, 0.5)),
            ("episodes", lambda: ppo_chain.rollout(actor, critic, torch.Generator(), 2**63)),
        ]
        for name, call in cases:
            with self.subTest(argument=name), self.assertRaisesRegex(ValueError, name):
                call()
        self.assertAlmostEqual(ppo_chain.evaluate(actor, critic)["expected_return"], 0.25 * 1.0 + 0.25 * 0.2, places=15)


class ChainCLI(unittest.TestCase):
    def test_chain_cli_default_run_writes_the_reference(self):
        with tempfile.TemporaryDirectory() as tmp:
            first = os.path.join(tmp, "a")
            with shared_function("ppo_chain", "train"):  # the default run, trained once for the test files
                code, stdout, stderr = run_main(ppo_chain.main, ["--output", first])
            self.assertEqual((code, stderr), (0, ""))
            self.assertIn("0.3000 -> 0.9996", stdout)
            with open(os.path.join(first, "ppo-chain.csv"), encoding="utf-8", newline="") as handle:
                rows = list(csv.DictReader(handle))
            self.assertEqual(list(rows[0]), ppo_chain.COLUMNS)
            self.assertEqual(len(rows), 121)
            self.assertAlmostEqual(float(rows[-1]["expected_return"]), CHAIN_REFERENCE_EXPECTED_RETURN, delta=1e-9)
            with open(os.path.join(first, "ppo-chain.json"), encoding="utf-8") as handle:
                report = json.load(handle)
            self.assertAlmostEqual(report["final"]["left_probability"], CHAIN_REFERENCE_LEFT_PROBABILITY, delta=1e-9)
            self.assertEqual(sorted(os.listdir(first)), ["ppo-chain.csv", "ppo-chain.json"])
        self.assertEqual(ppo_chain.build_parser().parse_args([]).output, "results-chain")

