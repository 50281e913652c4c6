"""Tests of the running-total task (running_total.py): its chains computed by hand, the verifier that reads only
the final answer, the split and the demonstrations.

    python -m unittest -v test_running_total
"""

import unittest

import torch

from running_total import RunningTotalConfig, RunningTotalTask, apply


class RunningTotal(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.task = RunningTotalTask(RunningTotalConfig(train_prompts=2000, test_prompts=64))

    def test_a_chain_is_computed_left_to_right_mod_10(self):
        # 3+5 = 8, 8*7 = 56 -> 6, 6+9 = 15 -> 5, 5*4 = 20 -> 0, 0+2 = 2
        task = RunningTotalTask(RunningTotalConfig(train_prompts=10, test_prompts=2))
        task._chains[0] = ((3, 5, 7, 9, 4, 2), "+*+*+")  # a prompt set by hand, in this test's own task
        self.assertEqual(task.running_results(0), (8, 6, 5, 0, 2))
        self.assertEqual(task.answer(0), 2)
        self.assertEqual(task.decode(task.prompt_tokens([0])[0]), "BOS3+5*7+9*4+2=")
        self.assertEqual([task.decode(s) for s in task.solutions(0)], ["2EOS", ";8;6;5;0;2EOS"])
        self.assertEqual(task.difficulty(0), 2)
        self.assertEqual((apply(9, "*", 9), apply(9, "+", 9)), (1, 8))

    def test_the_verifier_reads_only_the_final_answer(self):
        task = self.task
        answer = task.answer(1)
        right, wrong, eos, sep = answer, (answer + 1) % 10, task.eos_id, task.separator_id
        cases = [([right, eos], False, 1.0), ([sep, 7, sep, 7, sep, right, eos], False, 1.0),
                 ([sep, right, eos], False, 1.0), ([wrong, eos], False, 0.0),
                 ([sep, right, sep, wrong, eos], False, 0.0),
                 ([7, right, eos], False, 0.0),  # two digits: not one item
                 ([task.equals_id, right, eos], False, 0.0), ([eos], False, 0.0),
                 ([sep, right] * 8, True, 0.0)]  # truncated at the cap of 16
        for tokens, truncated, reward in cases:
            with self.subTest(tokens=task.decode(tokens)):
                self.assertEqual(task.verify(1, tokens, truncated), reward)
        self.assertFalse(task.writes_partials([sep, right, eos]))
        self.assertTrue(task.writes_partials([sep, 7, sep, right, eos]))
        # the batch form agrees with verify, row by row
        rows = [tokens + [eos] * (16 - len(tokens)) for tokens, _, _ in cases]
        real = torch.tensor([[index <= tokens.index(eos) if eos in tokens else True for index in range(16)]
                             for tokens, _, _ in cases])
        rewards = task.rewards(torch.ones(len(cases), dtype=torch.long), torch.tensor(rows), real,
                               torch.tensor([truncated for _, truncated, _ in cases]))
        self.assertEqual(rewards.tolist(), [reward for _, _, reward in cases])
        with self.assertRaisesRegex(ValueError, "^truncated"):
            task.verify(1, [right, eos], True)

    def test_the_splits_are_disjoint_and_the_demonstrations_correct_and_paired(self):
        task = self.task
        train, test = set(task.split_prompts("train").tolist()), set(task.split_prompts("test").tolist())
        self.assertEqual((len(train), len(test), len(train & test)), (2000, 64, 0))
        chains = [task.chain(prompt) for prompt in range(2064)]
        self.assertEqual(len(set(chains)), 2064)  # no prompt twice
        self.assertTrue(all(1 <= digit <= 9 for digits, _ in chains for digit in digits))
        running = RunningTotalTask(RunningTotalConfig(train_prompts=2000, test_prompts=64, scratch_share=0.3))
        noise = RunningTotalTask(RunningTotalConfig(train_prompts=2000, test_prompts=64, scratch_share=0.3,
                                                    scratchpad="noise"))
        pairs = running.demonstrations(4000, torch.Generator().manual_seed(5))
        noisy = noise.demonstrations(4000, torch.Generator().manual_seed(5))
        self.assertTrue(all(prompt in train for prompt, _ in pairs))
        self.assertTrue(all(running.verify(p, list(r), False) == 1.0 for p, r in pairs + noisy))
        writes = [running.writes_partials(r) for _, r in pairs]
        self.assertEqual(writes, [noise.writes_partials(r) for _, r in noisy])  # the same choices, the same lengths
        self.assertEqual([len(r) for _, r in pairs], [len(r) for _, r in noisy])
        self.assertAlmostEqual(sum(writes) / len(writes), 0.3, delta=0.03)  # 4 sigma of 4000 Bernoulli(0.3) draws
        self.assertTrue(all(r == running.solutions(p)[1] for (p, r), w in zip(pairs, writes) if w))
        self.assertGreater(sum(r != noise.solutions(p)[1] for (p, r), w in zip(noisy, writes) if w), 0)

    def test_a_bad_setting_is_named(self):
        for field, value, pattern in (("digits", 9, "^digits"), ("scratchpad", "none", "^scratchpad"),
                                      ("scratch_share", 1.5, "^scratch_share"), ("max_new_tokens", 10, "^max_new")):
            with self.subTest(field=field), self.assertRaisesRegex(ValueError, pattern):
                RunningTotalConfig(**{field: value})


if __name__ == "__main__":
    unittest.main()
