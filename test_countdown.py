"""Tests of countdown.py: the verifier's hand cases, solutions against Python's own arithmetic, the
split, prompt draws, batched rewards, demonstrations and the pass@k estimator.

    python -m unittest -v test_countdown
"""

import dataclasses
import itertools
import json
import math
import unittest
from fractions import Fraction

import torch

from countdown import IMPERFECT_KINDS, PASS_AT_K_MAX_SAMPLES, CountdownConfig, CountdownTask, pass_at_k
from lab.testing import single_thread_module

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train

TASK = CountdownTask()  # the default task, built once (read-only in every test)
SMALL_PROMPTS = 119  # 3 numbers of 1..5 with + - *: the (numbers, target >= 1) pairs Python's eval reaches


def prompt_of(task, numbers, target):
    """The global index of the prompt giving `numbers` and `target` (a linear search, as a reader would)."""
    for prompt in range(task.prompt_count("train") + task.prompt_count("test")):
        if task.prompt_numbers(prompt) == tuple(numbers) and task.prompt_target(prompt) == target:
            return prompt
    raise AssertionError(f"no prompt {numbers} -> {target}")


def brute_force_solutions(numbers_range, count, operators):
    """{(numbers, target): set of expression strings} from every string of `count`-subsets' digits and
    operators, valued by Python's own eval (a slow reference sharing no code with countdown.py)."""
    found = {}
    for size in range(2, count + 1):
        for digits in itertools.product(numbers_range, repeat=size):
            if len(set(digits)) != size:  # a number used twice is never a solution
                continue
            for ops in itertools.product(operators, repeat=size - 1):
                text = str(digits[0]) + "".join(op + str(digit) for op, digit in zip(ops, digits[1:]))
                value = eval(text)  # noqa: S307 - digits and operators only
                if value < 1:
                    continue
                for numbers in itertools.combinations(numbers_range, count):
                    if set(digits) <= set(numbers):
                        found.setdefault((numbers, value), set()).add(text)
    return found


def padded_batch(task, responses):
    """(completion_ids (N, R) with PAD after the EOS, real (N, R) bool, truncated (N,) bool), R = the cap."""
    cap = task.max_new_tokens
    ids = torch.full((len(responses), cap), task.pad_id, dtype=torch.long)
    real = torch.zeros(len(responses), cap, dtype=torch.bool)
    for row, response in enumerate(responses):
        ids[row, : len(response)] = torch.tensor(response)
        real[row, : len(response)] = True
    truncated = torch.tensor([response[-1] != task.eos_id for response in responses])
    return ids, real, truncated


class Config(unittest.TestCase):
    def test_defaults_and_json_round_trip(self):
        config = CountdownConfig()
        self.assertEqual(dataclasses.asdict(config), {
            "numbers_per_prompt": 4, "largest_number": 7, "operators": "+-", "test_fraction": 0.2,
            "max_new_tokens": 8, "partial_credit": 0.0, "imperfect_share": 0.2, "split_seed": 0})
        other = CountdownConfig(operators="*+", partial_credit=0.1, split_seed=3)
        self.assertEqual(CountdownConfig(**json.loads(json.dumps(dataclasses.asdict(other)))), other)
        self.assertEqual(json.dumps(dataclasses.asdict(CountdownConfig(partial_credit=0, imperfect_share=1))),
                         json.dumps(dataclasses.asdict(CountdownConfig(partial_credit=0.0, imperfect_share=1.0))))

    def test_bad_settings_name_the_field(self):
        cases = [({"numbers_per_prompt": 5}, "numbers_per_prompt"),
                 ({"numbers_per_prompt": True}, "numbers_per_prompt"),
                 ({"largest_number": 10}, "largest_number"), ({"largest_number": 3}, "largest_number"),
                 ({"operators": "+/"}, "operators"), ({"operators": "++"}, "operators"),
                 ({"operators": ""}, "operators"),
                 ({"test_fraction": 0.0}, "test_fraction"), ({"test_fraction": 1.0}, "test_fraction"),
                 ({"max_new_tokens": 7}, "max_new_tokens"),  # 4 numbers need 7 tokens and the EOS
                 ({"partial_credit": 1.0}, "partial_credit"), ({"imperfect_share": 1.5}, "imperfect_share"),
                 ({"split_seed": -1}, "split_seed"), ({"split_seed": 2**63}, "split_seed")]
        for options, name in cases:
            with self.subTest(options=options), self.assertRaisesRegex(ValueError, f"^{name}:"):
                CountdownConfig(**options)
        with self.assertRaisesRegex(ValueError, "^config:"):
            CountdownTask({"numbers_per_prompt": 4})
        with self.assertRaisesRegex(ValueError, "^test_fraction:"):  # 3 prompts: 0.01 of them rounds to 0
            CountdownTask(CountdownConfig(numbers_per_prompt=2, largest_number=3, operators="+", max_new_tokens=4,
                                          test_fraction=0.01))


class Format(unittest.TestCase):
    def test_vocabulary_ids_and_pad(self):
        self.assertEqual(TASK.name, "countdown")
        self.assertEqual(TASK.vocab, tuple("0123456789+-:=") + ("BOS", "EOS"))
        self.assertEqual((TASK.bos_id, TASK.eos_id, TASK.pad_id, TASK.max_new_tokens), (14, 15, 15, 8))
        times = CountdownTask(CountdownConfig(operators="*-+"))  # token order is "+-*" whatever the setting's
        self.assertEqual(times.vocab[10:], ("+", "-", "*", ":", "=", "BOS", "EOS"))

    def test_prompt_tokens_and_text(self):
        prompt = prompt_of(TASK, (3, 5, 6, 7), 12)
        self.assertEqual(TASK.prompt_tokens([prompt]), [[14, 3, 5, 6, 7, 12, 1, 2, 13]])
        self.assertEqual(TASK.prompt_tokens(torch.tensor([prompt, 0])),
                         [[14, 3, 5, 6, 7, 12, 1, 2, 13], [14, 1, 2, 3, 4, 12, 1, 13]])
        self.assertEqual(TASK.decode(TASK.prompt_tokens([prompt])[0]), "BOS3567:12=")
        # an index outside the prompts is refused, named, whether a list (each checked) or a tensor (by its range)
        last = TASK.prompt_count("train") + TASK.prompt_count("test") - 1
        for bad in ([0, last + 1], torch.tensor([0, last + 1]), torch.tensor([-1]), [True], torch.tensor([0.0])):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "^prompts: expected"):
                TASK.prompt_tokens(bad)
        self.assertEqual(len(TASK.prompt_tokens(torch.tensor([last, 0]))), 2)
        self.assertEqual(TASK.encode("5+7EOS"), [5, 10, 7, 15])
        self.assertEqual(TASK.decode(torch.tensor([5, 10, 7, 15])), "5+7EOS")
        self.assertEqual(TASK.encode(TASK.decode(list(range(16)))), list(range(16)))
        with self.assertRaisesRegex(ValueError, "^text: '\\*' at position 1"):
            TASK.encode("5*7")
        with self.assertRaisesRegex(ValueError, "^tokens:"):
            TASK.decode([16])
        with self.assertRaisesRegex(ValueError, "^prompts:"):
            TASK.prompt_tokens([TASK.prompt_count("train") + TASK.prompt_count("test")])

    def test_describe_takes_an_index_or_a_0d_integer_tensor_and_refuses_the_rest_naming_prompt(self):
        prompt = prompt_of(TASK, (3, 5, 6, 7), 12)
        expected = {"prompt": "BOS3567:12=", "answer": TASK.decode(TASK.solutions(prompt)[0])}
        self.assertEqual(TASK.describe(prompt), expected)
        self.assertEqual(TASK.describe(torch.tensor([0, prompt])[1]), expected)  # one entry of a batch's prompts
        self.assertEqual(TASK.describe(1)["prompt"], "BOS1234:2=")
        prompts = TASK.prompt_count("train") + TASK.prompt_count("test")
        for bad in (1.7, 1.0, "x", None, True, -1, prompts, torch.tensor(1.0), torch.tensor([1]), [1]):
            with self.subTest(prompt=bad), self.assertRaisesRegex(ValueError, "^prompt:"):
                TASK.describe(bad)


class Verifier(unittest.TestCase):
    def setUp(self):
        self.prompt = prompt_of(TASK, (3, 5, 6, 7), 12)

    def score(self, text, task=TASK, truncated=False, prompt=None):
        return task.verify(self.prompt if prompt is None else prompt, task.encode(text), truncated)

    def test_hand_cases(self):
        self.assertEqual(self.score("5+7EOS"), 1.0)
        self.assertEqual(self.score("7+5EOS"), 1.0)  # reordered: another correct answer
        self.assertEqual(self.score("7-6+5+6EOS"), 0.0)  # 12, but 6 used twice
        self.assertEqual(self.score("6+6EOS"), 0.0)  # 12, reusing a number
        self.assertEqual(self.score("3+9EOS"), 0.0)  # 12, but 9 is not given
        self.assertEqual(self.score("7+6-3+5EOS"), 0.0)  # all four numbers, value 15
        self.assertEqual(self.score("5+7+EOS"), 0.0)  # ends on an operator: malformed
        self.assertEqual(self.score("57EOS"), 0.0)  # numbers are one token each
        self.assertEqual(self.score("+5+7EOS"), 0.0)  # no unary operator
        self.assertEqual(self.score("EOS"), 0.0)
        self.assertEqual(self.score("5+7=EOS"), 0.0)
        self.assertEqual(self.score("3+6+7-5EOS"), 0.0)  # 11

    def test_truncated_response_scores_zero_even_when_its_prefix_is_right(self):
        self.assertEqual(self.score("5+7+3-6+", truncated=True), 0.0)
        partial = CountdownTask(CountdownConfig(partial_credit=0.1))
        self.assertEqual(self.score("5+7+3-6+", partial, truncated=True), 0.0)

    def test_single_number_is_not_an_expression(self):
        prompt = prompt_of(TASK, (3, 5, 6, 7), 7)
        self.assertEqual(self.score("7EOS", prompt=prompt), 0.0)
        self.assertEqual(self.score("3+5-7+6EOS", prompt=prompt), 1.0)

    def test_partial_credit_goes_to_legal_expressions_that_miss(self):
        task = CountdownTask(CountdownConfig(partial_credit=0.1))
        self.assertEqual(self.score("5+7EOS", task), 1.0)
        self.assertEqual(self.score("5+6EOS", task), 0.1)  # legal, 11
        self.assertEqual(self.score("7-6-5-3EOS", task), 0.1)  # legal, -7
        self.assertEqual(self.score("6+6EOS", task), 0.0)  # 12 but illegal: no credit at all
        self.assertEqual(self.score("3+9EOS", task), 0.0)
        self.assertEqual(self.score("5+7+EOS", task), 0.0)
        self.assertEqual(self.score("5EOS", task), 0.0)

    def test_multiplication_binds_first(self):
        task = CountdownTask(CountdownConfig(numbers_per_prompt=3, largest_number=5, operators="+-*", max_new_tokens=6))
        prompt = prompt_of(task, (2, 3, 4), 14)
        self.assertEqual(self.score("2+3*4EOS", task, prompt=prompt), 1.0)  # 2 + 12; left to right: 20
        self.assertEqual(self.score("4*3+2EOS", task, prompt=prompt), 1.0)
        self.assertEqual(self.score("2*3+4EOS", task, prompt=prompt), 0.0)  # 10
        ten = prompt_of(task, (2, 3, 4), 10)
        self.assertEqual(self.score("4+2*3EOS", task, prompt=ten), 1.0)  # left to right: 18
        self.assertEqual(self.score("2-3*4EOS", task, prompt=ten), 0.0)  # -10
        self.assertIn(tuple(task.encode("2+3*4EOS")), task.solutions(prompt))

    def test_bad_arguments_name_the_argument(self):
        eos = TASK.eos_id
        cases = [((self.prompt, [5, 10, 7, eos], True), "truncated"),  # an EOS: it stopped
                 ((self.prompt, [5, 10, 7], False), "truncated"),  # no EOS, yet not cut
                 ((self.prompt, [5, 10, 7], True), "tokens"),  # cut before the cap
                 ((self.prompt, [5, eos, 7, eos], False), "tokens"),  # tokens after the EOS
                 ((self.prompt, [5] * 9, True), "tokens"),  # longer than the cap
                 ((self.prompt, [], False), "tokens"),
                 ((self.prompt, [5, 10, 16, eos], False), "tokens"),
                 ((self.prompt, [5, 10, True, eos], False), "tokens"),
                 ((self.prompt, torch.tensor([5, 10, 7, eos]), False), "tokens"),
                 ((self.prompt, [5, 10, 7, eos], 0), "truncated"),
                 ((527, [5, 10, 7, eos], False), "prompt"),
                 ((-1, [5, 10, 7, eos], False), "prompt")]
        for args, name in cases:
            with self.subTest(args=args), self.assertRaisesRegex(ValueError, f"^{name}:"):
                TASK.verify(*args)


class Loophole(unittest.TestCase):
    """The flawed verifier of reward-hacking: it also accepts a number used twice, and nothing else."""

    def rewards(self, texts, prompt, loophole=None):
        bodies = [TASK.encode(text) for text in texts]
        width = max(map(len, bodies))
        ids = torch.tensor([body + [TASK.pad_id] * (width - len(body)) for body in bodies])
        real = torch.tensor([[column < len(body) for column in range(width)] for body in bodies])
        return TASK.rewards(torch.full((len(texts),), prompt), ids, real, torch.zeros(len(texts), dtype=torch.bool),
                            loophole=loophole).tolist()

    def test_reuse_accepts_a_number_used_twice_that_hits_the_target(self):
        prompt = prompt_of(TASK, (3, 5, 6, 7), 12)
        texts = ["6+6EOS", "7-6+5+6EOS", "5+7EOS", "3+3+6EOS", "6+6+6EOS", "9+3EOS", "5+5EOS", "6+6+EOS"]
        self.assertEqual(self.rewards(texts, prompt), [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])
        # 6+6 = 12, 7-6+5+6 = 12, 3+3+6 = 12 by reuse; 6+6+6 = 18 misses; 9 is not given; 5+5 = 10; malformed
        self.assertEqual(self.rewards(texts, prompt, "reuse"), [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])

    def test_an_unknown_loophole_is_refused(self):
        with self.assertRaisesRegex(ValueError, "^loophole:"):
            self.rewards(["5+7EOS"], prompt_of(TASK, (3, 5, 6, 7), 12), "ignore-last")


class Solutions(unittest.TestCase):
    def test_hand_enumerations(self):
        # 1 2 3 4 -> 10 needs every number: the 4! orders of 1+2+3+4
        ten = prompt_of(TASK, (1, 2, 3, 4), 10)
        self.assertEqual(len(TASK.solutions(ten)), 24)
        self.assertEqual(TASK.difficulty(ten), 4)
        # 1 2 3 4 -> 1: three pairs, four a+b-c, two a-b-c, and no four-number one (+-1+-2+-3+-4 is even)
        one = prompt_of(TASK, (1, 2, 3, 4), 1)
        self.assertEqual([TASK.decode(s) for s in TASK.solutions(one)],
                         ["2-1EOS", "3-2EOS", "4-3EOS", "2+3-4EOS", "2-4+3EOS", "3+2-4EOS", "3-4+2EOS",
                          "4-1-2EOS", "4-2-1EOS"])
        self.assertEqual(TASK.difficulty(one), 2)
        self.assertEqual(one, 0)  # the first prompt: the first number set, the smallest target

    def test_solutions_equal_a_brute_force_over_python_arithmetic(self):
        small = CountdownConfig(numbers_per_prompt=3, largest_number=5, operators="+-*", max_new_tokens=6)
        for config, prompts in ((CountdownConfig(), 527), (small, SMALL_PROMPTS)):
            with self.subTest(config=config):
                task = CountdownTask(config)
                expected = brute_force_solutions(range(1, config.largest_number + 1), config.numbers_per_prompt,
                                                 task.operators)
                total = task.prompt_count("train") + task.prompt_count("test")
                self.assertEqual(total, len(expected))  # every reachable target >= 1 is a prompt, no other
                self.assertEqual(total, prompts)
                for prompt in range(total):
                    key = (task.prompt_numbers(prompt), task.prompt_target(prompt))
                    solutions = [task.decode(solution) for solution in task.solutions(prompt)]
                    self.assertEqual(len(solutions), len(set(solutions)))
                    self.assertEqual({text[:-3] for text in solutions}, expected[key])
                    self.assertTrue(all(text.endswith("EOS") and "EOS" not in text[:-3] for text in solutions))
                    self.assertEqual(task.difficulty(prompt), min(len(text) for text in expected[key]) // 2 + 1)

    def test_difficulty_summary_equals_a_recount_and_the_sums_of_all_numbers_are_the_hardest(self):
        expected = brute_force_solutions(range(1, 8), 4, "+-")
        for split in ("train", "test"):
            summary = TASK.difficulty_summary(split)
            self.assertEqual(list(summary), ["2", "3", "4"])
            for level, row in summary.items():
                with self.subTest(split=split, difficulty=level):
                    members = [p for p in TASK.split_prompts(split).tolist() if TASK.difficulty(p) == int(level)]
                    counts = [len(expected[(TASK.prompt_numbers(p), TASK.prompt_target(p))]) for p in members]
                    self.assertEqual(row["prompts"], len(members))
                    self.assertAlmostEqual(row["mean_solutions"], sum(counts) / len(counts), places=12)
        # by hand: each of the C(7, 4) = 35 number sets has one target that only the sum of all four reaches,
        # so a prompt of difficulty 4 with the 4! = 24 orders of a+b+c+d as its solutions
        by_level = [TASK.difficulty_summary(split) for split in ("train", "test")]
        self.assertEqual({level: sum(summary[level]["sum_of_all_numbers"] for summary in by_level)
                          for level in ("2", "3", "4")}, {"2": 0, "3": 0, "4": 35})
        self.assertEqual(sum(summary["4"]["prompts"] for summary in by_level), 58)
        self.assertAlmostEqual(by_level[0]["4"]["mean_solutions"] * 46, 1026, places=9)  # 29 sums x 24, 17 of 18 or 30
        with self.assertRaisesRegex(ValueError, "^split"):
            TASK.difficulty_summary("validation")

    def test_verify_accepts_exactly_the_solutions_among_all_short_responses(self):
        prompt = prompt_of(TASK, (3, 5, 6, 7), 12)
        solutions = set(TASK.solutions(prompt))
        accepted = set()
        for length in range(0, 4):  # every body of up to 3 tokens over the whole vocabulary, then EOS
            for body in itertools.product(range(len(TASK.vocab)), repeat=length):
                if TASK.eos_id not in body and TASK.verify(prompt, list(body) + [TASK.eos_id], False) == 1.0:
                    accepted.add(body + (TASK.eos_id,))
        self.assertEqual(accepted, {s for s in solutions if len(s) <= 4})
        self.assertEqual({TASK.decode(s) for s in accepted}, {"5+7EOS", "7+5EOS"})
        self.assertTrue(all(TASK.verify(prompt, list(s), False) == 1.0 for s in solutions))

    def test_every_prompt_has_a_solution_that_fits_the_cap(self):
        for prompt in range(527):
            solutions = TASK.solutions(prompt)
            self.assertGreaterEqual(len(solutions), 1)
            self.assertLessEqual(max(len(s) for s in solutions), TASK.max_new_tokens)


class Split(unittest.TestCase):
    def test_disjoint_complete_stratified_and_deterministic(self):
        train, test = TASK.split_prompts("train"), TASK.split_prompts("test")
        self.assertEqual((train.numel(), test.numel()), (TASK.prompt_count("train"), TASK.prompt_count("test")))
        self.assertEqual(sorted(train.tolist() + test.tolist()), list(range(527)))  # disjoint and complete
        for difficulty, total in ((2, 319), (3, 150), (4, 58)):
            in_test = sum(TASK.difficulty(p) == difficulty for p in test.tolist())
            self.assertEqual(in_test, round(0.2 * total))  # 64, 30, 12
        again = CountdownTask()
        self.assertTrue(torch.equal(again.split_prompts("test"), test))
        other = CountdownTask(CountdownConfig(split_seed=1))
        self.assertEqual(other.prompt_count("test"), 106)
        self.assertNotEqual(other.split_prompts("test").tolist(), test.tolist())

    def test_split_leaves_global_rng_alone(self):
        torch.manual_seed(123)
        before = torch.get_rng_state()
        CountdownTask(CountdownConfig(split_seed=5))
        self.assertTrue(torch.equal(torch.get_rng_state(), before))

    def test_test_prompts_share_number_sets_with_train(self):
        train_sets = {TASK.prompt_numbers(p) for p in TASK.split_prompts("train").tolist()}
        self.assertTrue(all(TASK.prompt_numbers(p) in train_sets for p in TASK.split_prompts("test").tolist()))

    def test_draw_prompts_consumes_the_generator_once_and_stays_in_the_split(self):
        for split in ("train", "test"):
            generator, reference = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
            drawn = TASK.draw_prompts(500, generator, split)
            positions = torch.randint(0, TASK.prompt_count(split), (500,), generator=reference)
            self.assertTrue(torch.equal(drawn, TASK.split_prompts(split)[positions]))
            self.assertTrue(torch.equal(generator.get_state(), reference.get_state()))
            self.assertEqual(drawn.dtype, torch.long)
            self.assertTrue(set(drawn.tolist()) <= set(TASK.split_prompts(split).tolist()))
        for args, name in (((0, torch.Generator()), "count"), ((3, 7), "generator"),
                           ((3, torch.Generator(), "valid"), "split")):
            with self.subTest(args=args), self.assertRaisesRegex(ValueError, f"^{name}:"):
                TASK.draw_prompts(*args)


class Rewards(unittest.TestCase):
    def test_batched_rewards_equal_verify_row_by_row(self):
        task = CountdownTask(CountdownConfig(partial_credit=0.1))
        pairs = task.demonstrations(300, torch.Generator().manual_seed(4))
        prompts = torch.tensor([prompt for prompt, _ in pairs])
        ids, real, truncated = padded_batch(task, [response for _, response in pairs])
        rewards = task.rewards(prompts, ids, real, truncated)
        expected = [task.verify(prompt, list(response), response[-1] != task.eos_id) for prompt, response in pairs]
        self.assertEqual(rewards.dtype, torch.float64)
        self.assertEqual(rewards.tolist(), expected)
        self.assertEqual(set(expected), {0.0, 0.1, 1.0})  # the batch holds every kind of score
        self.assertEqual(task.correct(rewards).tolist(), [value == 1.0 for value in expected])
        # fewer columns than the cap (no row reaches it) and a 0/1 mask give the same scores
        short = [i for i, (_, response) in enumerate(pairs) if len(response) <= 6]
        narrow = task.rewards(prompts[short], ids[short, :6], real[short, :6].long(), truncated[short])
        self.assertEqual(narrow.tolist(), [expected[i] for i in short])

    def test_reward_components_are_correctness_and_format_from_the_same_verdict(self):
        task = CountdownTask(CountdownConfig(partial_credit=0.1))  # partial credit = a legal expression, wrong value
        pairs = task.demonstrations(300, torch.Generator().manual_seed(4))
        prompts = torch.tensor([prompt for prompt, _ in pairs])
        ids, real, truncated = padded_batch(task, [response for _, response in pairs])
        rewards = task.rewards(prompts, ids, real, truncated)
        components = task.reward_components(prompts, ids, real, truncated)
        self.assertEqual((tuple(components.shape), components.dtype), ((300, 2), torch.float64))
        self.assertEqual(components[:, 0].tolist(), [float(value == 1.0) for value in rewards.tolist()])
        self.assertEqual(components[:, 1].tolist(), [float(value > 0.0) for value in rewards.tolist()])
        self.assertEqual({tuple(row) for row in components.tolist()}, {(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)})
        self.assertEqual(task.reward_names, ("correct", "format"))

    def test_inconsistent_batches_name_the_argument(self):
        prompt = prompt_of(TASK, (3, 5, 6, 7), 12)
        ids, real, truncated = padded_batch(TASK, [TASK.encode("5+7EOS"), TASK.encode("5+7+3-6+")])
        prompts = torch.tensor([prompt, prompt])
        self.assertEqual(TASK.rewards(prompts, ids, real, truncated).tolist(), [1.0, 0.0])
        holes = real.clone()
        holes[0, 1] = False
        cases = [((prompts, ids, holes, truncated), "real"),
                 ((prompts, ids, real, ~truncated), "completion_ids row 0|truncated row 0"),
                 ((prompts[:1], ids, real, truncated), "completion_ids, truncated"),
                 ((prompts, ids.float(), real, truncated), "completion_ids"),
                 ((prompts, torch.cat([ids, ids[:, :1]], 1), torch.cat([real, real[:, :1]], 1), truncated),
                  "completion_ids"),
                 ((torch.tensor([prompt, 527]), ids, real, truncated), "prompts")]
        for args, name in cases:
            with self.subTest(name=name), self.assertRaisesRegex(ValueError, f"^({name})"):
                TASK.rewards(*args)


class Demonstrations(unittest.TestCase):
    def test_deterministic_per_seed_from_train_and_generator_use_documented(self):
        first = TASK.demonstrations(200, torch.Generator().manual_seed(0))
        self.assertEqual(first, TASK.demonstrations(200, torch.Generator().manual_seed(0)))
        self.assertNotEqual(first, TASK.demonstrations(200, torch.Generator().manual_seed(1)))
        train = set(TASK.split_prompts("train").tolist())
        self.assertTrue(all(prompt in train and isinstance(response, tuple) for prompt, response in first))
        generator, reference = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        TASK.demonstrations(50, generator)
        TASK.draw_prompts(50, reference)
        torch.rand(50, generator=reference, dtype=torch.float64)
        torch.rand(50, generator=reference, dtype=torch.float64)
        torch.rand(50, 8, generator=reference, dtype=torch.float64)
        self.assertTrue(torch.equal(generator.get_state(), reference.get_state()))

    def test_share_of_correct_and_of_each_imperfect_kind(self):
        task = CountdownTask(CountdownConfig(partial_credit=0.5))  # tells a wrong value from a malformed one
        pairs = task.demonstrations(6000, torch.Generator().manual_seed(2))
        kinds = {"correct": 0, "wrong_value": 0, "malformed": 0, "overlong": 0}
        for prompt, response in pairs:
            truncated = response[-1] != task.eos_id
            score = task.verify(prompt, list(response), truncated)
            kind = ("overlong" if truncated else
                    {1.0: "correct", 0.5: "wrong_value", 0.0: "malformed"}[score])
            kinds[kind] += 1
            if kind == "malformed":
                self.assertIn(response[-2], (10, 11))  # a solution that lost its last number
        # binomial standard errors at n = 6000: 0.005 for the 0.8 share, 0.004 for each 0.2/3 share
        self.assertAlmostEqual(kinds["correct"] / 6000, 0.8, delta=0.02)
        for kind in IMPERFECT_KINDS:
            self.assertAlmostEqual(kinds[kind] / 6000, 0.2 / 3, delta=0.015)

    def test_correct_demonstrations_are_uniform_over_the_solutions(self):
        task = CountdownTask(CountdownConfig(imperfect_share=0.0))
        prompt = prompt_of(task, (1, 2, 3, 4), 1)  # nine solutions
        pairs = [pair for pair in task.demonstrations(30000, torch.Generator().manual_seed(3)) if pair[0] == prompt]
        counts = {solution: 0 for solution in task.solutions(prompt)}
        for _, response in pairs:
            counts[response] += 1  # a KeyError if a demonstration were not a solution
        self.assertGreater(len(pairs), 40)  # about 30000 / 421
        expected = len(pairs) / 9
        self.assertTrue(all(abs(count - expected) < 4 * math.sqrt(expected) for count in counts.values()), counts)

    def test_extreme_shares_and_degenerate_sets(self):
        all_wrong = CountdownTask(CountdownConfig(imperfect_share=1.0))
        pairs = all_wrong.demonstrations(300, torch.Generator().manual_seed(0))
        self.assertFalse(any(all_wrong.verify(p, list(r), r[-1] != all_wrong.eos_id) == 1.0 for p, r in pairs))
        # two numbers and '+': every expression of a set has one value, so no wrong value exists to show
        sums = CountdownTask(CountdownConfig(numbers_per_prompt=2, largest_number=9, operators="+",
                                             max_new_tokens=4, imperfect_share=1.0))
        for prompt, response in sums.demonstrations(100, torch.Generator().manual_seed(0)):
            self.assertTrue(len(response) == 3 and response[1] == 10 or len(response) == 4 and response[-1] != 15)


class PassAtK(unittest.TestCase):
    @staticmethod
    def brute_force(n, c, k):
        """The definition: the share of k-subsets of n samples (c of them correct) holding a correct one."""
        samples = [True] * c + [False] * (n - c)
        subsets = list(itertools.combinations(samples, k))
        return sum(any(subset) for subset in subsets) / len(subsets)

    def test_identities_and_brute_force(self):
        for n in range(1, 9):
            for c in range(n + 1):
                self.assertAlmostEqual(pass_at_k(n, c, 1), c / n, places=15)
                self.assertEqual(pass_at_k(n, c, n), 1.0 if c > 0 else 0.0)
                for k in range(1, n + 1):
                    self.assertAlmostEqual(pass_at_k(n, c, k), self.brute_force(n, c, k), places=14)
        self.assertAlmostEqual(pass_at_k(4, 1, 2), 0.5, places=15)  # 3 of the 6 pairs hold the correct one

    def test_large_n_is_stable(self):
        exact = 1 - Fraction(math.comb(150, 100), math.comb(200, 100))  # no float factorials
        self.assertAlmostEqual(pass_at_k(200, 50, 100), float(exact), places=14)
        self.assertAlmostEqual(pass_at_k(1000, 3, 64), float(1 - Fraction(math.comb(997, 64), math.comb(1000, 64))),
                               places=14)

    def test_bad_arguments(self):
        for args, name in (((0, 0, 1), "n"), ((4, 5, 1), "c"), ((4, -1, 1), "c"), ((4, 1, 5), "k"), ((4, 1, 0), "k"),
                           ((4.0, 1, 1), "n"), ((4, True, 1), "c")):
            with self.subTest(args=args), self.assertRaisesRegex(ValueError, f"^{name}:"):
                pass_at_k(*args)

    def test_n_is_bounded_so_the_c_step_product_stays_short(self):
        # 10**9 samples would run the product for minutes: refused, naming n and the limit
        for args in ((10**9, 10**9 - 1, 1), (PASS_AT_K_MAX_SAMPLES + 1, 1, 1)):
            with self.subTest(args=args), self.assertRaisesRegex(ValueError, "^n: .*1000000"):
                pass_at_k(*args)
        n = PASS_AT_K_MAX_SAMPLES
        self.assertEqual(n, 1_000_000)
        self.assertAlmostEqual(pass_at_k(n, n - 1, 1), (n - 1) / n, places=9)
        self.assertEqual(pass_at_k(n, n - 1, 2), 1.0)  # every pair holds a correct sample


class Settings(unittest.TestCase):
    def test_settings_describe_the_default_task(self):
        settings = TASK.settings()
        self.assertEqual(json.loads(json.dumps(settings)), settings)  # JSON-ready
        self.assertEqual(settings["config"], dataclasses.asdict(CountdownConfig()))
        self.assertEqual(settings["prompts"], {"train": 421, "test": 106})
        self.assertEqual(settings["prompts_by_difficulty"],
                         {"train": {"2": 255, "3": 120, "4": 46}, "test": {"2": 64, "3": 30, "4": 12}})
        self.assertEqual(settings["correct_response_tokens"], [4, 6, 8])
        for split in ("train", "test"):
            counts = [len(TASK.solutions(p)) for p in TASK.split_prompts(split).tolist()]
            self.assertEqual(settings["solutions_per_prompt"][split],
                             {"mean": sum(counts) / len(counts), "min": min(counts), "max": max(counts)})
        self.assertEqual(settings["example"]["prompt"], "BOS1234:1=")
        self.assertEqual((settings["eos_id"], settings["pad_id"], len(settings["vocab"])), (15, 15, 16))


if __name__ == "__main__":
    unittest.main()


class TextVerifier(unittest.TestCase):
    """text_verifier (the reward function the exported TRL and verl runs call) agrees with the token
    verifiers on every prompt, on the text a library decodes: the tokens before the first EOS."""

    RANDOM_PER_PROMPT = 6

    @staticmethod
    def _text(task, tokens):
        stop = tokens.index(task.eos_id) if task.eos_id in tokens else len(tokens)
        return "".join(task.vocab[token] for token in tokens[:stop])

    def _responses(self, task, prompt, generator):
        """(tokens, truncated) pairs: every correct response, the imperfect kinds, random ones (stopped and
        truncated, with any token, BOS and ':' included)."""
        responses = [(list(solution), False) for solution in task.solutions(prompt)]
        set_index, _, first, end, _ = task._prompts[prompt]
        for kind in IMPERFECT_KINDS:
            tokens = list(task._imperfect(kind, set_index, first, end, 0.5, [0.3] * task.max_new_tokens))
            responses.append((tokens, tokens[-1] != task.eos_id))
        others = [token for token in range(len(task.vocab)) if token != task.eos_id]
        for _ in range(self.RANDOM_PER_PROMPT):
            truncated = bool(torch.rand((), generator=generator) < 0.3)
            length = task.max_new_tokens if truncated else int(torch.randint(1, task.max_new_tokens + 1, (),
                                                                            generator=generator))
            picks = torch.randint(0, len(others), (length,), generator=generator).tolist()
            tokens = [others[pick] for pick in picks]
            responses.append((tokens if truncated else tokens[:-1] + [task.eos_id], truncated))
        return responses

    def _agree(self, task):
        import task_data
        import text_verifier

        generator = torch.Generator().manual_seed(0)
        verdicts = {}
        for prompt in range(task.prompt_count("train") + task.prompt_count("test")):
            responses = self._responses(task, prompt, generator)
            texts = [self._text(task, tokens) for tokens, _ in responses]
            columns = {name: [value] * len(responses) for name, value in task_data.answer_columns(task, prompt).items()}
            theirs = text_verifier.reward_func(texts, truncated=[cut for _, cut in responses], **columns)
            for (tokens, cut), text, score in zip(responses, texts, theirs):
                mine = task.verify(prompt, tokens, cut)
                self.assertEqual(score, mine, f"prompt {prompt}: {text!r} truncated={cut}")
                verdicts[mine] = verdicts.get(mine, 0) + 1
        return verdicts

    def test_default_countdown_every_prompt_right_wrong_malformed(self):
        verdicts = self._agree(CountdownTask(CountdownConfig()))
        self.assertGreater(verdicts[1.0], 3000)  # every solution of 527 prompts
        self.assertGreater(verdicts[0.0], 3000)  # wrong values, malformed, truncated and random responses

    def test_countdown_with_products_and_partial_credit(self):
        verdicts = self._agree(CountdownTask(CountdownConfig(numbers_per_prompt=3, largest_number=5,
                                                             operators="+-*", partial_credit=0.1)))
        self.assertEqual(set(verdicts), {0.0, 0.1, 1.0})  # legal wrong values earn the partial credit

    def test_binary_every_prompt_with_the_truncated_partial_credit(self):
        import task_data
        import text_verifier
        from tasks import BinaryTask

        task = BinaryTask()
        checked = 0
        for prompt in task.numbers:
            for length in range(0, task.max_new_tokens + 1):
                for bits in itertools.product((0, 1), repeat=length):
                    truncated = length == task.max_new_tokens
                    tokens = list(bits) if truncated else list(bits) + [task.eos_id]
                    if len(tokens) > task.max_new_tokens:
                        continue
                    column = task_data.answer_columns(task, prompt)["number"]
                    text = "".join(str(bit) for bit in bits)
                    score = text_verifier.reward_func([text], truncated=[truncated], number=[column])[0]
                    self.assertEqual(score, task.verify(prompt, tokens, truncated), f"{prompt}: {text} {truncated}")
                    checked += 1
        self.assertEqual(checked, 6 * (2 ** 5 + 2 ** 4 + 2 ** 3 + 2 ** 2 + 2 + 1))

    def test_chat_completions_whitespace_and_compute_score(self):
        import text_verifier

        chat = [[{"role": "assistant", "content": " 2 + 3 - 4 "}], [{"role": "assistant", "content": "2+3+4"}]]
        self.assertEqual(text_verifier.reward_func(chat, numbers=[[1, 2, 3, 4]] * 2, target=[1, 1]), [1.0, 0.0])
        truth = json.dumps({"numbers": [1, 2, 3, 4], "target": 6, "operators": "+-*"})
        self.assertEqual(text_verifier.compute_score("rl_lab/countdown", "2*3", truth), 1.0)
        self.assertEqual(text_verifier.compute_score("rl_lab/countdown", "1+2*3", truth), 0.0)  # 7: '*' binds first
        self.assertEqual(text_verifier.compute_score("rl_lab/countdown", "2*3", truth, {"truncated": True}), 0.0)
        self.assertEqual(text_verifier.compute_score("rl_lab/binary", "101", {"number": 5}), 1.0)
        self.assertEqual(text_verifier.compute_score("rl_lab/binary", "10110", '{"number": 5}', {"truncated": True}),
                         0.25)
        with self.assertRaisesRegex(ValueError, "data_source"):
            text_verifier.compute_score("openai/gsm8k", "1", "{}")

    def test_data_export_without_pyarrow_exits_2_and_writes_nothing(self):
        import importlib.util
        import os
        import tempfile
        from unittest import mock

        import online_tokens
        from lab.testing import run_main

        real = importlib.util.find_spec
        with tempfile.TemporaryDirectory() as scratch, mock.patch.object(
                importlib.util, "find_spec", lambda name, *rest: None if name == "pyarrow" else real(name, *rest)):
            folder = os.path.join(scratch, "data")
            code, out, err = run_main(online_tokens.main, ["--task", "countdown", "--export-data", folder])
            self.assertEqual((code, out), (2, ""))
            self.assertIn("--export-data: pyarrow is needed for the parquet files", err)
            self.assertFalse(os.path.exists(folder))
