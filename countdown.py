"""A small Countdown task for the online loop: reach a target with some of the given numbers.

    from countdown import CountdownConfig, CountdownTask, pass_at_k
    task = CountdownTask(CountdownConfig())                 # 4 numbers from 1..7, + and -, cap 8 tokens
    task.decode(task.prompt_tokens([0])[0])                 # 'BOS1234:1='
    [task.decode(s) for s in task.solutions(0)]             # ['2-1EOS', '3-2EOS', '4-3EOS', '2+3-4EOS', ...]

The task TinyZero and many RLVR papers train on, cut down so that a transformer of about 60k
parameters learns it on one CPU core in under a minute. A prompt gives distinct single-digit numbers in increasing
order and a target; a response is an expression over some of them (at least two, each at most once)
joined by the allowed operators, then EOS:

    prompt   BOS 2 3 5 7 : 1 0 =        (numbers 2 3 5 7, target 10)
    correct  3+7 EOS,  7+3 EOS,  2+3+5 EOS,  5+7-2 EOS,  7-2+5 EOS, ...  (12 with + and -)

Why this task (the effects of LLM-RL must be able to appear on it): a prompt has several
correct responses (so pass@k exceeds pass@1 and a policy can lose diversity while its pass@1 rises);
correct responses have 3, 5 or 7 tokens before the EOS (length varies, up to a cap); difficulty is
graded by how many numbers the shortest solution needs; the test split holds (numbers, target) pairs
never trained on, whose number sets and arithmetic facts are shared with the train split, so test
accuracy measures generalization and not recall; a rule-based verifier scores every response, with
an optional partial credit for a legal expression that misses the target (TinyZero's format score).

Conventions:
- Token ids: digit d has id d (0..9), then the operators, ':', '=', BOS, EOS. PAD shares EOS's id, as
  in online_tokens.py and token_objectives.py: what marks padding is the mask (`real`, the attention
  mask), never the id, so a mask built from `ids != pad_id` would drop every real EOS.
- Every prompt of the task has at least one correct response, and every correct response fits the cap
  with its EOS, so a response that hits the cap without EOS (truncated) is never correct.
- Operators bind as in arithmetic: '*' before '+' and '-', then left to right.
- Prompt indices are global (0..P-1, number sets in lexicographic order, then targets increasing); a
  split is a fixed subset of them, drawn once from `split_seed`.

Shapes: N responses, R completion positions (at most max_new_tokens), P prompts of the task.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
from typing import NamedTuple

import torch

from lab.checks import check_indices, check_int, check_real, check_tensor

SPLITS = ("train", "test")
OPERATORS = "+-*"  # the allowed operators, in the order of their token ids
MAX_NUMBERS_PER_PROMPT = 4  # exact enumeration: k numbers give sum_r k!/(k-r)! * ops^(r-1) expressions per set
MAX_DEMONSTRATIONS = 1_000_000
# pass_at_k's product takes c steps: a million samples (sft.sample_evaluation's limit too; Chen et al. draw
# 200) cost about 0.1 s, while n = 10**9 would run for minutes
PASS_AT_K_MAX_SAMPLES = 1_000_000
REWARD_CORRECT = 1.0
IMPERFECT_KINDS = ("wrong_value", "malformed", "overlong")  # drawn with equal probability
# a flawed verifier's loopholes (a proxy reward to hack, the atlas's reward-hacking): "reuse" also accepts an
# expression that uses a given number more than once, so it accepts every correct response and more
LOOPHOLES = ("reuse",)


@dataclasses.dataclass(frozen=True)
class CountdownConfig:
    """The size settings of the Countdown task (JSON round-trip: CountdownConfig(**dataclasses.asdict(c))).

    numbers_per_prompt: distinct numbers a prompt gives (2..4); largest_number: they are drawn from
    1..largest_number (numbers_per_prompt..9, one token each); operators: a non-empty string of
    distinct characters from "+-*"; test_fraction: share of the prompts of each difficulty held out
    as the test split (0 < f < 1); max_new_tokens: the response cap in tokens, at least
    2 * numbers_per_prompt (the longest expression and its EOS) and at most 64; partial_credit: the
    reward of a legal expression (given numbers, each at most once, at least two, ended by EOS) whose
    value misses the target, in [0, 1) (0 keeps the reward binary; TinyZero's format score is 0.1);
    imperfect_share: share of the SFT demonstrations that are imperfect (wrong value, malformed or
    overlong, a third each in expectation), in [0, 1]; split_seed: seeds the train/test split, an int
    in [0, 2**63).
    Raises ValueError naming the field for a bad value.
    """

    numbers_per_prompt: int = 4
    largest_number: int = 7
    operators: str = "+-"
    test_fraction: float = 0.2
    max_new_tokens: int = 8
    partial_credit: float = 0.0
    imperfect_share: float = 0.2
    split_seed: int = 0

    def __post_init__(self):
        check_int("numbers_per_prompt", self.numbers_per_prompt, low=2, high=MAX_NUMBERS_PER_PROMPT)
        check_int("largest_number", self.largest_number, low=self.numbers_per_prompt, high=9)
        if (not isinstance(self.operators, str) or not self.operators or len(set(self.operators)) != len(self.operators)
                or not set(self.operators) <= set(OPERATORS)):
            raise ValueError(f"operators: expected distinct characters from {OPERATORS!r}, got {self.operators!r}")
        check_int("max_new_tokens", self.max_new_tokens, low=2 * self.numbers_per_prompt, high=64)
        # stored as floats, so an int given here still writes 0.0 (not 0) into a run's JSON and rewards
        object.__setattr__(self, "test_fraction", check_real("test_fraction", self.test_fraction, low=0.0, high=1.0,
                                                             low_open=True, high_open=True))
        object.__setattr__(self, "partial_credit", check_real("partial_credit", self.partial_credit, low=0.0,
                                                              high=REWARD_CORRECT, high_open=True))
        object.__setattr__(self, "imperfect_share", check_real("imperfect_share", self.imperfect_share, low=0.0,
                                                               high=1.0))
        check_int("split_seed", self.split_seed, low=0, high=2**63 - 1)


def _evaluate(numbers, operators):
    """The value of numbers[0] operators[0] numbers[1] ... with '*' binding before '+' and '-'."""
    total, term = 0, numbers[0]
    for operator, number in zip(operators, numbers[1:]):
        if operator == "*":
            term *= number
        else:  # the finished term joins the total; the new one carries its sign
            total += term
            term = number if operator == "+" else -number
    return total + term


class Prompt(NamedTuple):
    """One prompt of the task: its number set, its target, where its solutions lie in the set's
    expressions (sorted by value) and its difficulty."""

    set_index: int
    target: int
    first: int  # the set's expressions[first:end] are exactly the prompt's solutions
    end: int
    difficulty: int  # the count of numbers the shortest solution uses


class SplitPrompts:
    """What a task with train and test prompts shares: `self._split`, {split: (P_split,) int64 global prompt
    indices, increasing}, set by the task; the splits' sizes, members and uniform draws from them."""

    def _check_split(self, split):
        if split not in SPLITS:
            raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
        return split

    def prompt_count(self, split):
        """The number of prompts in `split` ("train" or "test")."""
        return self._split[self._check_split(split)].numel()

    def split_prompts(self, split):
        """(P_split,) int64 the global indices of `split`'s prompts, increasing (a copy)."""
        return self._split[self._check_split(split)].clone()

    def draw_prompts(self, count, generator, split="train"):
        """(count,) int64 global prompt indices drawn uniformly with replacement from `split`.

        Consumes `generator` (a torch.Generator) exactly once: one torch.randint over the split's
        positions, then a lookup to global indices. Raises ValueError naming the argument.
        """
        check_int("count", count, low=1, high=2**31 - 1)
        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
        members = self._split[self._check_split(split)]
        positions = torch.randint(0, members.numel(), (count,), generator=generator)
        return members[positions]


@functools.lru_cache(maxsize=8)
def _enumerate(largest_number, numbers_per_prompt, operators):
    """(sets, expressions, prompts), tuples: per number set its numbers and its expressions (token bodies) sorted
    by value, and per global prompt index a Prompt. Every legal expression of every number set is enumerated;
    each reachable target >= 1 is a prompt. Computed once per setting in a process (the tasks share it, read only)."""
    sets, expressions, prompts = [], [], []
    for set_index, numbers in enumerate(itertools.combinations(range(1, largest_number + 1), numbers_per_prompt)):
        found = []  # (value, body tokens) in enumeration order: fewer numbers first
        for count in range(2, len(numbers) + 1):
            for chosen in itertools.permutations(numbers, count):
                for ops in itertools.product(operators, repeat=count - 1):
                    body = [chosen[0]]  # digit d has token id d
                    for op, number in zip(ops, chosen[1:]):
                        body += [10 + operators.index(op), number]
                    found.append((_evaluate(chosen, ops), tuple(body)))
        found.sort(key=lambda pair: pair[0])  # stable: enumeration order within a value
        values = [value for value, _ in found]
        sets.append(numbers)
        expressions.append(tuple(body for _, body in found))
        for target in sorted(set(value for value in values if value >= 1)):
            first, end = bisect.bisect_left(values, target), bisect.bisect_right(values, target)
            difficulty = min(len(body) for _, body in found[first:end]) // 2 + 1  # numbers used
            prompts.append(Prompt(set_index, target, first, end, difficulty))
    return tuple(sets), tuple(expressions), tuple(prompts)


class CountdownTask(SplitPrompts):
    """The Countdown task behind the lab's task interface (see the module docstring for the format).

    Attributes: name "countdown"; config; vocab (token strings, id = index); bos_id, eos_id, pad_id
    (pad_id == eos_id); max_new_tokens (the response cap, config.max_new_tokens).
    Building it enumerates every expression of every number set once (about 11k for the defaults).
    """

    name = "countdown"

    def __init__(self, config=None):
        config = CountdownConfig() if config is None else config
        if not isinstance(config, CountdownConfig):
            raise ValueError(f"config: expected a CountdownConfig, got {type(config).__name__}")
        self.config = config
        self.operators = "".join(op for op in OPERATORS if op in config.operators)  # token order, not the setting's
        self.vocab = tuple(str(digit) for digit in range(10)) + tuple(self.operators) + (":", "=", "BOS", "EOS")
        self.colon_id, self.equals_id = 10 + len(self.operators), 11 + len(self.operators)
        self.bos_id, self.eos_id = len(self.vocab) - 2, len(self.vocab) - 1
        self.pad_id = self.eos_id  # the mask, not the id, marks padding
        self.max_new_tokens = config.max_new_tokens
        self._operator_of = {10 + index: op for index, op in enumerate(self.operators)}  # token id -> operator
        self._build_prompts()
        self._build_split()

    # -- the prompts and the split ------------------------------------------------------------

    def _build_prompts(self):
        """Every legal expression of every number set; each reachable target >= 1 is a prompt (`_enumerate`)."""
        self._sets, self._expressions, self._prompts = _enumerate(
            self.config.largest_number, self.config.numbers_per_prompt, self.operators)

    def _build_split(self):
        """Hold out round(test_fraction * n_d) prompts (half to even) of each difficulty d, chosen by a permutation of a
        generator of its own seeded with split_seed: no global RNG state, and every difficulty is in both
        splits in the same proportion."""
        generator = torch.Generator().manual_seed(self.config.split_seed)
        test = []
        for difficulty in self.difficulties():
            members = torch.tensor([index for index, prompt in enumerate(self._prompts)
                                    if prompt.difficulty == difficulty])
            order = torch.randperm(members.numel(), generator=generator)
            test += members[order[: round(self.config.test_fraction * members.numel())]].tolist()
        test_set = set(test)
        train = [index for index in range(len(self._prompts)) if index not in test_set]
        if not test or not train:
            raise ValueError(f"test_fraction: {self.config.test_fraction} of {len(self._prompts)} prompts leaves "
                             "a split empty")
        self._split = {"train": torch.tensor(train, dtype=torch.long),
                       "test": torch.tensor(sorted(test), dtype=torch.long)}

    def difficulties(self):
        """The difficulties present in the task, increasing (2..numbers_per_prompt)."""
        return sorted(set(prompt.difficulty for prompt in self._prompts))

    def _check_prompt(self, name, prompt):
        return check_int(name, prompt, low=0, high=len(self._prompts) - 1)

    def prompt_numbers(self, prompt):
        """The numbers prompt `prompt` gives, increasing (a tuple of ints)."""
        return self._sets[self._prompts[self._check_prompt("prompt", prompt)].set_index]

    def prompt_target(self, prompt):
        """The target of prompt `prompt` (an int >= 1)."""
        return self._prompts[self._check_prompt("prompt", prompt)].target

    def _prompt_list(self, prompts):
        return check_indices("prompts", prompts, len(self._prompts))

    def prompt_tokens(self, prompts):
        """The token ids of each prompt: BOS, the numbers, ':', the target's digits, '='.

        prompts: (N,) integer tensor or a list of global indices. Returns a list of N lists of ints
        (lengths differ with the target's digit count). Raises ValueError naming `prompts`.
        """
        tokens = []
        for prompt in self._prompt_list(prompts):
            entry = self._prompts[prompt]
            digits = [int(digit) for digit in str(entry.target)]  # digit d has token id d
            tokens.append([self.bos_id, *self._sets[entry.set_index], self.colon_id, *digits, self.equals_id])
        return tokens

    # -- the verifier -------------------------------------------------------------------------

    def _check_response(self, tokens, truncated, tokens_name="tokens", truncated_name="truncated"):
        """Raise ValueError unless (tokens, truncated) is one response as the sampler returns it."""
        if not isinstance(tokens, (list, tuple)) or not all(
            isinstance(token, int) and not isinstance(token, bool) and 0 <= token < len(self.vocab) for token in tokens
        ):
            raise ValueError(f"{tokens_name}: expected a list of token ids in [0, {len(self.vocab)}), got {tokens!r}")
        if not 1 <= len(tokens) <= self.max_new_tokens:
            raise ValueError(f"{tokens_name}: expected 1 to {self.max_new_tokens} tokens, got {len(tokens)}")
        if not isinstance(truncated, bool):
            raise ValueError(f"{truncated_name}: expected a bool, got {type(truncated).__name__}")
        if self.eos_id in tokens[:-1]:
            raise ValueError(f"{tokens_name}: the tokens after the first EOS are padding; expected them dropped")
        stopped = tokens[-1] == self.eos_id
        if truncated and stopped:
            raise ValueError(f"{truncated_name}: a response that ends with EOS stopped; it cannot be truncated")
        if not truncated and not stopped:
            raise ValueError(f"{truncated_name}: a response without EOS only ends at the cap; expected True")
        if truncated and len(tokens) != self.max_new_tokens:
            raise ValueError(f"{tokens_name}: a truncated response holds max_new_tokens={self.max_new_tokens} "
                             f"tokens, got {len(tokens)}")

    def verify(self, prompt, tokens, truncated):
        """The rule-based reward of one response, a float: 1.0 for a correct expression then EOS;
        config.partial_credit for a legal expression then EOS whose value misses the target; 0.0 for
        anything else (a malformed expression, a number not given or used twice, a single number, a
        truncated response).

        prompt: a global prompt index (int); tokens: the response's real token ids (a list or tuple of
        ints, the EOS included if any); truncated: bool, True when the response hit max_new_tokens without
        EOS. Raises ValueError naming the argument when they do not describe one such response.
        """
        self._check_prompt("prompt", prompt)
        self._check_response(tokens, truncated)
        return self._score(prompt, tokens, truncated)

    def _judge(self, prompt, tokens, truncated, loophole=None):
        """(legal, correct) of one response: a legal expression then EOS, and one that also hits the target.
        loophole "reuse": a number may appear more than once (the flawed verifier's legality)."""
        if truncated:  # every legal expression fits the cap with its EOS: this one never stopped
            return False, False
        body = tokens[:-1]
        set_index, target = self._prompts[prompt].set_index, self._prompts[prompt].target
        numbers, operators = body[0::2], [self._operator_of.get(token) for token in body[1::2]]
        legal = (len(body) % 2 == 1 and len(numbers) >= 2 and None not in operators
                 and all(number in self._sets[set_index] for number in numbers)  # digit d has id d
                 and (loophole == "reuse" or len(set(numbers)) == len(numbers)))
        return legal, legal and _evaluate(numbers, operators) == target

    def _score(self, prompt, tokens, truncated, loophole=None):
        """`verify` without the argument checks."""
        legal, correct = self._judge(prompt, tokens, truncated, loophole)
        if not legal:
            return 0.0
        return REWARD_CORRECT if correct else self.config.partial_credit

    # the task's rewards one by one, for an advantage that normalizes each apart (GDPO): the correctness
    # reward and a format reward (a legal expression then EOS, whatever its value)
    reward_names = ("correct", "format")

    def reward_components(self, prompts, completion_ids, real, truncated):
        """(N, 2) float64: per response 1.0 or 0.0 for each of `reward_names`, from the same verdict as
        `rewards` (whose arguments it takes, unchecked: the rollout's own batch)."""
        verdicts = []
        for prompt, ids, kept, cut in zip(self._prompt_list(prompts), completion_ids.tolist(),
                                          real.bool().sum(dim=1).tolist(), truncated.tolist()):
            legal, correct = self._judge(prompt, ids[:kept], cut)
            verdicts.append((float(correct), float(legal)))
        return torch.tensor(verdicts, dtype=torch.float64)  # (N, 2)

    def rewards(self, prompts, completion_ids, real, truncated, loophole=None):
        """(N,) float64 the verifier's reward of each of N responses: row i equals
        verify(prompts[i], completion_ids[i][real[i]], truncated[i]).
        loophole: None (the correct verifier), or one of LOOPHOLES: a flawed verifier, whose reward is at
        least the correct one's on every response (a proxy reward to hack).

        prompts: (N,) integer tensor of global indices; completion_ids: (N, R) integer tensor, R <=
        max_new_tokens; real: (N, R) bool (or 0/1) mask, True on the tokens up to and including the first
        EOS (a prefix of each row); truncated: (N,) bool, True where the response hit the cap without EOS.
        Raises ValueError naming the argument (and the row) for inconsistent input.
        """
        check_tensor("prompts", prompts, kind="int", ndim=1)
        check_tensor("completion_ids", completion_ids, kind="int", ndim=2)
        check_tensor("real", real, kind="mask", ndim=2)
        check_tensor("truncated", truncated, kind="bool", ndim=1)
        if loophole is not None and loophole not in LOOPHOLES:
            raise ValueError(f"loophole: expected None or one of {', '.join(LOOPHOLES)}, got {loophole!r}")
        count = prompts.shape[0]
        if completion_ids.shape[0] != count or truncated.shape[0] != count:
            raise ValueError(f"completion_ids, truncated: expected {count} rows like prompts, got "
                             f"{completion_ids.shape[0]} and {truncated.shape[0]}")
        if real.shape != completion_ids.shape:
            raise ValueError(f"real: expected the shape of completion_ids {tuple(completion_ids.shape)}, "
                             f"got {tuple(real.shape)}")
        if completion_ids.shape[1] > self.max_new_tokens:
            raise ValueError(f"completion_ids: expected at most max_new_tokens={self.max_new_tokens} columns, "
                             f"got {completion_ids.shape[1]}")
        real = real.bool()
        if not bool((real.long().cummin(dim=1).values == real.long()).all()):  # (N, R): True then False
            raise ValueError("real: expected each row to be True on a prefix (the real tokens) then False")
        prompt_list = self._prompt_list(prompts)
        scores = []
        for row, (prompt, ids, kept, cut) in enumerate(
                zip(prompt_list, completion_ids.tolist(), real.sum(dim=1).tolist(), truncated.tolist())):
            tokens = ids[:kept]
            self._check_response(tokens, cut, f"completion_ids row {row}", f"truncated row {row}")
            scores.append(self._score(prompt, tokens, cut, loophole))
        return torch.tensor(scores, dtype=torch.float64)

    def correct(self, rewards):
        """(N,) bool: the responses that earned full credit. rewards: (N,) float tensor from rewards()."""
        check_tensor("rewards", rewards, ndim=1)
        return rewards == REWARD_CORRECT

    def partial(self, rewards):
        """(N,) bool: the responses that earned the partial credit (a legal expression, wrong value); none
        when partial_credit is 0 (the reward is then binary)."""
        check_tensor("rewards", rewards, ndim=1)
        if self.config.partial_credit == 0.0:
            return torch.zeros_like(rewards, dtype=torch.bool)
        return rewards == self.config.partial_credit

    def describe(self, prompt):
        """{"prompt": the prompt's text, "answer": its first solution's text}, for a decoded batch.

        prompt: a global index, a Python int or a 0-d integer tensor (one entry of a batch's prompts).
        Raises ValueError naming `prompt` for anything else (a float is not rounded to an index).
        """
        if isinstance(prompt, torch.Tensor):
            check_tensor("prompt", prompt, kind="int", ndim=0)
            prompt = int(prompt)
        self._check_prompt("prompt", prompt)
        return {"prompt": self.decode(self.prompt_tokens([prompt])[0]), "answer": self.decode(self.solutions(prompt)[0])}

    def solutions(self, prompt):
        """Every correct response of `prompt` (token tuples, EOS included), by exact enumeration: fewer
        numbers first, then the order of the numbers, then the operators' order."""
        set_index, _, first, end, _ = self._prompts[self._check_prompt("prompt", prompt)]
        return tuple(body + (self.eos_id,) for body in self._expressions[set_index][first:end])

    def difficulty(self, prompt):
        """How many numbers the shortest correct response of `prompt` uses (2..numbers_per_prompt)."""
        return self._prompts[self._check_prompt("prompt", prompt)].difficulty

    def difficulty_summary(self, split):
        """Per difficulty of `split` ({"2": ..., keys as strings for JSON}): its prompts, their mean count of
        correct responses, and how many ask for the sum of all the prompt's numbers. Such a target is
        reached only by adding every number (any minus, any number left out gives less), so it has the
        top difficulty and numbers_per_prompt! solutions, one per order: the difficulty counts numbers,
        not how rare a correct response is. Raises ValueError naming `split`."""
        members = self._split[self._check_split(split)].tolist()
        summary = {}
        for difficulty in self.difficulties():
            mine = [self._prompts[p] for p in members if self._prompts[p].difficulty == difficulty]
            summary[str(difficulty)] = {
                "prompts": len(mine),
                "mean_solutions": sum(prompt.end - prompt.first for prompt in mine) / len(mine) if mine else None,
                "sum_of_all_numbers": sum(prompt.target == sum(self._sets[prompt.set_index]) for prompt in mine),
            }
        return summary

    # -- text -----------------------------------------------------------------------------------

    def decode(self, tokens):
        """The text of token ids (a list, tuple or 1-D integer tensor): their strings joined."""
        if isinstance(tokens, torch.Tensor):
            check_tensor("tokens", tokens, kind="int", ndim=1, allow_empty=True)
            tokens = tokens.tolist()
        if not isinstance(tokens, (list, tuple)) or not all(
            isinstance(token, int) and not isinstance(token, bool) and 0 <= token < len(self.vocab) for token in tokens
        ):
            raise ValueError(f"tokens: expected token ids in [0, {len(self.vocab)}), got {tokens!r}")
        return "".join(self.vocab[token] for token in tokens)

    def encode(self, text):
        """The token ids of `text` (the inverse of decode): "BOS" and "EOS" are one token each, every other
        character is one token. Raises ValueError naming `text` at a character outside the vocabulary."""
        if not isinstance(text, str):
            raise ValueError(f"text: expected a str, got {type(text).__name__}")
        ids, position = [], 0
        while position < len(text):
            for special in ("BOS", "EOS"):
                if text.startswith(special, position):
                    ids.append(self.vocab.index(special))
                    position += len(special)
                    break
            else:
                if text[position] not in self.vocab:
                    raise ValueError(f"text: {text[position]!r} at position {position} is not in the vocabulary "
                                     f"{''.join(self.vocab[:-2])} BOS EOS")
                ids.append(self.vocab.index(text[position]))
                position += 1
        return ids

    # -- demonstrations for the SFT warm start -------------------------------------------------

    def demonstrations(self, count, generator):
        """`count` (prompt, response) pairs for supervised fine-tuning, from the train split only.

        Each pair: a global prompt index (int) and the response's token ids (a tuple of ints). With
        probability 1 - imperfect_share the response is a correct one drawn uniformly from the prompt's
        solutions() (so a prompt's demonstrations show its different answers); otherwise it is imperfect,
        of one of three kinds with probability 1/3 each: "wrong_value" (a legal expression of the prompt's
        numbers whose value misses the target, drawn uniformly, then EOS), "malformed" (a uniformly drawn
        solution with its last number dropped, so it ends on an operator, then EOS), "overlong" (a uniformly
        drawn solution continued with operators and the prompt's numbers up to max_new_tokens, no EOS).
        No imperfect response is correct. A number set whose expressions all share one value (two numbers
        and one operator) has no wrong value to show: its "wrong_value" draws are malformed instead.

        Deterministic from `generator`, which is consumed by four calls: draw_prompts (one randint), then
        three torch.rand in float64: the kind (count,), the choice among candidates (count,), the
        continuation of an overlong response (count, max_new_tokens); a draw u picks item int(u * n) of n.
        Raises ValueError naming the argument.
        """
        check_int("count", count, low=1, high=MAX_DEMONSTRATIONS)
        prompts = self.draw_prompts(count, generator, "train").tolist()
        kind_draws = torch.rand(count, generator=generator, dtype=torch.float64).tolist()
        choice_draws = torch.rand(count, generator=generator, dtype=torch.float64).tolist()
        continuation = torch.rand(count, self.max_new_tokens, generator=generator, dtype=torch.float64).tolist()
        share = self.config.imperfect_share
        pairs = []
        for prompt, kind_draw, choice_draw, fill in zip(prompts, kind_draws, choice_draws, continuation):
            set_index, _, first, end, _ = self._prompts[prompt]
            expressions = self._expressions[set_index]
            if kind_draw >= share:
                response = expressions[first + int(choice_draw * (end - first))] + (self.eos_id,)
            else:
                kind = IMPERFECT_KINDS[min(int(kind_draw / share * len(IMPERFECT_KINDS)), len(IMPERFECT_KINDS) - 1)]
                response = self._imperfect(kind, set_index, first, end, choice_draw, fill)
            pairs.append((prompt, response))
        return pairs

    def _imperfect(self, kind, set_index, first, end, choice_draw, fill):
        expressions = self._expressions[set_index]
        wrong = len(expressions) - (end - first)
        if kind == "wrong_value" and wrong > 0:
            # the expressions are sorted by value: the wrong ones are those before `first` and from `end` on
            index = int(choice_draw * wrong)
            return expressions[index if index < first else index + end - first] + (self.eos_id,)
        solution = expressions[first + int(choice_draw * (end - first))]
        if kind != "overlong":  # malformed, or a wrong value that does not exist
            return solution[:-1] + (self.eos_id,)
        operators, numbers = sorted(self._operator_of), self._sets[set_index]
        response = list(solution)
        while len(response) < self.max_new_tokens:  # the expression goes on past the target, never stopping
            choices = operators if len(response) % 2 == 1 else numbers
            response.append(choices[int(fill[len(response)] * len(choices))])
        return tuple(response)

    # -- the record ----------------------------------------------------------------------------

    def settings(self):
        """A JSON-ready dict describing the task: format, vocabulary, rewards, sizes and the counts of
        prompts per split and difficulty, solutions per prompt and response lengths."""
        by_difficulty, solutions = {}, {}
        for split in SPLITS:
            members = self._split[split].tolist()
            by_difficulty[split] = {str(difficulty): sum(self._prompts[p].difficulty == difficulty for p in members)
                                    for difficulty in self.difficulties()}
            counts = [self._prompts[p].end - self._prompts[p].first for p in members]
            solutions[split] = {"mean": sum(counts) / len(counts), "min": min(counts), "max": max(counts)}
        lengths = sorted(set(len(body) + 1 for bodies in self._expressions for body in bodies))
        return {
            "name": self.name,
            "config": dataclasses.asdict(self.config),
            "prompt_format": "BOS, the numbers increasing (one token each), ':', the target's digits, '='",
            "response_format": ("an expression over the prompt's numbers (at least two, each at most once) "
                                f"joined by {' '.join(self.operators)}, then EOS; '*' binds before '+' and '-'"),
            "example": {"prompt": self.decode(self.prompt_tokens([0])[0]),
                        "solutions": [self.decode(solution) for solution in self.solutions(0)]},
            "vocab": list(self.vocab),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "pad": "shares EOS's id: the mask (real / attention mask), not the id, marks padding",
            "max_new_tokens": self.max_new_tokens,
            "rewards": {"correct": REWARD_CORRECT, "legal_wrong_value": self.config.partial_credit,
                        "malformed_or_illegal": 0.0, "truncated": 0.0},
            "difficulty": "the count of numbers the shortest correct response uses",
            "prompts": {split: self.prompt_count(split) for split in SPLITS},
            "prompts_by_difficulty": by_difficulty,
            "solutions_per_prompt": solutions,
            "correct_response_tokens": lengths,  # EOS included
            "demonstrations": {"correct_share": 1.0 - self.config.imperfect_share,
                               "imperfect_kinds": list(IMPERFECT_KINDS)},
        }


def pass_at_k(n, c, k):
    """The unbiased estimator of pass@k from n samples of which c are correct (Chen et al. 2021,
    arXiv 2107.03374, eq. 1): 1 - C(n-c, k) / C(n, k), the probability that k of the n samples drawn
    without replacement hold at least one correct one.

    Computed as the paper's numerically stable product, 1 - prod_{i=n-c+1}^{n} (1 - k/i), never with
    factorials (C(200, 100) overflows a float); exactly 1.0 when n - c < k (every k-subset holds a
    correct sample). n, c, k: ints with 1 <= n <= PASS_AT_K_MAX_SAMPLES (1,000,000), 0 <= c <= n,
    1 <= k <= n. Returns a float in [0, 1]. Raises ValueError naming the argument.
    """
    check_int("n", n, low=1, high=PASS_AT_K_MAX_SAMPLES)
    check_int("c", c, low=0, high=n)
    check_int("k", k, low=1, high=n)
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
