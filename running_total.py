"""A task where writing intermediate results helps: evaluate a chain of operations left to right, mod 10,
optionally writing the running results.

    from running_total import RunningTotalConfig, RunningTotalTask
    task = RunningTotalTask(RunningTotalConfig())          # 6 digits 1..9, 5 operators from + and *, mod 10
    task.decode(task.prompt_tokens([0])[0])                # 'BOS9+1*3*7+8+7='
    [task.decode(s) for s in task.solutions(0)]            # ['5EOS', ';0;0;0;8;5EOS']

The atlas's r1-zero experiment (DeepSeek-R1, arXiv 2501.12948, sec. 2.2) in miniature: R1-Zero's responses
grow longer under RL together with the share of right answers, as the model writes out more of its
computation. This task gives a tiny transformer the same choice. A prompt is K digits joined by K - 1
operators ('+' or '*'); its answer is the value computed left to right, every step taken mod 10
(x1 = d1, x_k = (x_{k-1} op d_k) mod 10, the answer x_K). A response either answers at once or first
writes the running results x2 .. xK, one digit each after a ';', the last one being the answer:

    prompt   BOS 3 + 5 * 7 + 9 * 4 + 2 =
    direct   2 EOS                                       (2 tokens)
    partials ; 8 ; 6 ; 5 ; 0 ; 2 EOS                     (11 tokens: 3+5=8, 8*7=56->6, 6+9=15->5, 5*4=20->0, 0+2)

The verifier checks only the final answer: reward 1.0 when the response stops (EOS) and its last item (the
token before EOS, after a ';' or at the start) is the answer; 0.0 otherwise. What comes before the last
';' is never read, so a response may write anything there (the running results right, wrong, or noise).

Why the running results help: the direct answer composes K - 1 steps that do not commute (a '+' then a
'*' is not a '*' then a '+') in one forward pass; each running result is one step, one digit op one
digit, whose operands sit at fixed places (every item has one digit). The SFT start learns both ways
from demonstrations of which only a share `scratch_share` write the running results, so it rarely
writes them, and is right more often when it does (the atlas measures how much more).

The control `scratchpad="noise"`: the same prompts, verifier and lengths, but the demonstrations that
write items before the answer write random digits there. Writing them cannot help: the answer must still
be computed in one pass, after a distraction.

Conventions:
- Token ids: digit d has id d (0..9), then '+', '*', ';', '=', BOS, EOS. PAD shares EOS's id (the mask,
  not the id, marks padding), as in countdown.py.
- The prompts are a fixed pool drawn once from split_seed (digits uniform in 1..9, operators uniform,
  no prompt twice): prompts 0 .. test_prompts - 1 are the test split, the next train_prompts the train
  split. A test prompt is never trained on; its steps (digit op digit) are the train prompts' too.
- `solutions(prompt)` gives the two canonical correct responses (direct, and with the right running
  results); the verifier accepts more (any items before the final answer), so a probability computed
  over `solutions` is a lower bound of the success probability, never the success probability.

Shapes: N responses, R completion positions (at most max_new_tokens), P prompts.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from countdown import SPLITS, SplitPrompts
from lab.checks import check_indices, check_int, check_real, check_tensor

SCRATCHPADS = ("running", "noise")  # what the demonstrations that write items before the answer write there
OPERATORS = "+*"  # in the order of their token ids
MODULUS = 10  # every running result is one digit
REWARD_CORRECT = 1.0
MAX_DEMONSTRATIONS = 1_000_000


@dataclasses.dataclass(frozen=True)
class RunningTotalConfig:
    """The settings of the running-total task (JSON round trip: RunningTotalConfig(**dataclasses.asdict(c))).

    digits: digits per prompt K (3..8); scratchpad: "running" (the demonstrations' items before the answer
    are the running results) or "noise" (random digits); scratch_share: share of the SFT demonstrations
    that write K - 2 items before the answer, in [0, 1]; max_new_tokens: the response cap, at least the
    longest demonstration (2K - 1 tokens with its EOS) and at most 64; train_prompts, test_prompts:
    the sizes of the splits (1 .. 100000 each); split_seed: seeds the pool of prompts, an int in [0, 2**63).
    Raises ValueError naming the field for a bad value.
    """

    digits: int = 6
    scratchpad: str = "running"
    scratch_share: float = 0.1
    max_new_tokens: int = 16
    train_prompts: int = 20_000
    test_prompts: int = 512
    split_seed: int = 0

    def __post_init__(self):
        check_int("digits", self.digits, low=3, high=8)
        if self.scratchpad not in SCRATCHPADS:
            raise ValueError(f"scratchpad: expected one of {', '.join(SCRATCHPADS)}, got {self.scratchpad!r}")
        object.__setattr__(self, "scratch_share", check_real("scratch_share", self.scratch_share, low=0.0, high=1.0))
        check_int("max_new_tokens", self.max_new_tokens, low=2 * self.digits - 1, high=64)
        check_int("train_prompts", self.train_prompts, low=1, high=100_000)
        check_int("test_prompts", self.test_prompts, low=1, high=100_000)
        check_int("split_seed", self.split_seed, low=0, high=2**63 - 1)


def apply(value, operator, digit):
    """One step of the chain: (value operator digit) mod 10."""
    return (value + digit if operator == "+" else value * digit) % MODULUS


# the ids of the vocabulary's tokens after the digits 0-9 (RunningTotalTask.vocab)
OPERATOR_IDS = {operator: 10 + index for index, operator in enumerate(OPERATORS)}
SEPARATOR_ID, EQUALS_ID, BOS_ID, EOS_ID = 12, 13, 14, 15


@functools.lru_cache(maxsize=4)  # read, never written: the tasks of one split setting (scratchpads, shares) share it
def _chain_pool(split_seed, test_prompts, train_prompts, digits):
    """The prompt pool, test prompts first, per prompt (digits, operators): batches of candidate chains from
    one generator seeded with split_seed, each kept unless drawn before, until both splits are full."""
    generator = torch.Generator().manual_seed(split_seed)
    wanted = test_prompts + train_prompts
    if wanted > 9 ** digits * 2 ** (digits - 1) // 2:
        raise ValueError(f"train_prompts: {wanted} prompts in all is more than half of the "
                         f"{9 ** digits * 2 ** (digits - 1)} chains of {digits} digits")
    seen, chains = set(), []
    while len(chains) < wanted:
        drawn = torch.randint(1, 10, (wanted, digits), generator=generator).tolist()
        operators = torch.randint(0, len(OPERATORS), (wanted, digits - 1), generator=generator).tolist()
        for row_digits, row_operators in zip(drawn, operators):
            chain = (tuple(row_digits), "".join(OPERATORS[index] for index in row_operators))
            if chain not in seen and len(chains) < wanted:
                seen.add(chain)
                chains.append(chain)
    return tuple(chains)


@functools.lru_cache(maxsize=None)  # a chain's ids never change: computed once a process, for every task
def _chain_tokens(chain):
    """The ids of a chain's prompt, (digits, operators) -> (BOS, d1, op1, d2, ..., dK, '='); digit d has id d."""
    digits, operators = chain
    row = [BOS_ID, digits[0]]
    for operator, digit in zip(operators, digits[1:]):
        row += [OPERATOR_IDS[operator], digit]
    return tuple(row + [EQUALS_ID])


class RunningTotalTask(SplitPrompts):
    """The running-total task behind the lab's task interface (tasks.py; see the module docstring).

    Attributes: name "running-total"; config; vocab (token strings, id = index); separator_id, equals_id,
    bos_id, eos_id, pad_id (pad_id == eos_id); max_new_tokens (config.max_new_tokens).
    """

    name = "running-total"
    reward_names = ("correct",)

    def __init__(self, config=None):
        config = RunningTotalConfig() if config is None else config
        if not isinstance(config, RunningTotalConfig):
            raise ValueError(f"config: expected a RunningTotalConfig, got {type(config).__name__}")
        self.config = config
        self.vocab = tuple(str(digit) for digit in range(10)) + tuple(OPERATORS) + (";", "=", "BOS", "EOS")
        self.operator_ids = dict(OPERATOR_IDS)
        self.separator_id, self.equals_id, self.bos_id, self.eos_id = SEPARATOR_ID, EQUALS_ID, BOS_ID, EOS_ID
        self.pad_id = self.eos_id  # the mask, not the id, marks padding
        self.max_new_tokens = config.max_new_tokens
        self._build_prompts()

    # -- prompts ------------------------------------------------------------------------------------

    def _build_prompts(self):
        """The pool of chains (_chain_pool: shared by every task of the same split settings) and the splits."""
        self._chains = list(_chain_pool(self.config.split_seed, self.config.test_prompts,  # the task's own list
                                        self.config.train_prompts, self.config.digits))
        test, wanted = self.config.test_prompts, len(self._chains)
        self._split = {"test": torch.arange(test), "train": torch.arange(test, wanted)}

    def _check_prompt(self, name, prompt):
        if isinstance(prompt, torch.Tensor):
            check_tensor(name, prompt, kind="int", ndim=0)
            prompt = int(prompt)
        return check_int(name, prompt, low=0, high=len(self._chains) - 1)

    def chain(self, prompt):
        """(digits, operators) of prompt `prompt`: a tuple of K ints in 1..9 and a string of K - 1 operators."""
        return self._chains[self._check_prompt("prompt", prompt)]

    def _prompt_list(self, prompts):
        return check_indices("prompts", prompts, len(self._chains))

    def prompt_tokens(self, prompts):
        """The token ids of each prompt: BOS, d1 op1 d2 ... dK, '='. prompts: (N,) integer tensor or a list
        of global indices. Returns a list of N lists of 2K + 1 ints."""
        return [list(_chain_tokens(self._chains[prompt])) for prompt in self._prompt_list(prompts)]

    def running_results(self, prompt):
        """The K - 1 running results x2 .. xK, the last one the answer (a tuple of ints in 0..9)."""
        digits, operators = self.chain(prompt)
        results = []
        for operator, digit in zip(operators, digits[1:]):
            results.append(apply(results[-1] if results else digits[0], operator, digit))
        return tuple(results)

    def answer(self, prompt):
        """The chain's value, computed left to right mod 10 (an int in 0..9)."""
        return self.running_results(prompt)[-1]

    # -- the verifier -------------------------------------------------------------------------------

    def _response(self, values):
        """The response that writes `values` (digits), then EOS: the answer alone, or every value after a
        ';' (so the first token already says whether the response writes the running results)."""
        if len(values) == 1:
            return (values[0], self.eos_id)  # digit d has id d
        return tuple(token for value in values for token in (self.separator_id, value)) + (self.eos_id,)

    def final_answer(self, tokens, truncated):
        """The response's final item (the digit before EOS, after a ';' or at the start), or None when it
        has none (truncated, or no digit right after a separator or the start before EOS)."""
        if truncated or len(tokens) < 2 or tokens[-1] != self.eos_id or tokens[-2] > 9:
            return None
        if len(tokens) > 2 and tokens[-3] != self.separator_id:
            return None
        return tokens[-2]

    def writes_partials(self, tokens):
        """True when the response writes at least one item before its final one (two ';' or more)."""
        return list(tokens).count(self.separator_id) >= 2

    def _check_response(self, tokens, truncated):
        if not isinstance(tokens, (list, tuple)) or not all(
            isinstance(token, int) and not isinstance(token, bool) and 0 <= token < len(self.vocab) for token in tokens
        ):
            raise ValueError(f"tokens: expected a list of token ids in [0, {len(self.vocab)}), got {tokens!r}")
        if not 1 <= len(tokens) <= self.max_new_tokens:
            raise ValueError(f"tokens: expected 1 to {self.max_new_tokens} tokens, got {len(tokens)}")
        if not isinstance(truncated, bool):
            raise ValueError(f"truncated: expected a bool, got {type(truncated).__name__}")
        if self.eos_id in tokens[:-1]:
            raise ValueError("tokens: the tokens after the first EOS are padding; expected them dropped")
        if truncated != (tokens[-1] != self.eos_id):
            raise ValueError("truncated: expected True exactly when the response does not end with EOS")

    def verify(self, prompt, tokens, truncated):
        """The reward of one response: 1.0 when its final item is the chain's value, else 0.0.

        prompt: a global index; tokens: the response's real token ids (EOS included if any); truncated:
        True when it hit max_new_tokens without EOS. Raises ValueError naming the argument."""
        prompt = self._check_prompt("prompt", prompt)
        self._check_response(tokens, truncated)
        return REWARD_CORRECT if self.final_answer(list(tokens), truncated) == self.answer(prompt) else 0.0

    def rewards(self, prompts, completion_ids, real, truncated):
        """(N,) float64 the verifier's reward of each response: row i is verify(prompts[i],
        completion_ids[i][real[i]], truncated[i]). prompts (N,) int; completion_ids (N, R) int; real (N, R)
        bool, True up to and including the first EOS; truncated (N,) bool."""
        check_tensor("completion_ids", completion_ids, kind="int", ndim=2)
        check_tensor("real", real, kind="mask", ndim=2)
        check_tensor("truncated", truncated, kind="bool", ndim=1)
        scores = []
        for prompt, ids, kept, cut in zip(self._prompt_list(prompts), completion_ids.tolist(),
                                          real.bool().sum(dim=1).tolist(), truncated.tolist()):
            scores.append(REWARD_CORRECT if self.final_answer(ids[:kept], cut) == self.answer(prompt) else 0.0)
        return torch.tensor(scores, dtype=torch.float64)

    def reward_components(self, prompts, completion_ids, real, truncated):
        """(N, 1) float64: the one reward, as a column (the task has no second reward)."""
        return self.rewards(prompts, completion_ids, real, truncated).unsqueeze(1)

    def correct(self, rewards):
        """(N,) bool: the responses that earned the reward."""
        check_tensor("rewards", rewards, ndim=1)
        return rewards == REWARD_CORRECT

    def partial(self, rewards):
        """(N,) bool, all False: the reward is binary."""
        check_tensor("rewards", rewards, ndim=1)
        return torch.zeros_like(rewards, dtype=torch.bool)

    def solutions(self, prompt):
        """The two canonical correct responses: the direct answer, and the running results then the
        answer (token tuples, EOS included). The verifier accepts more (see the module docstring)."""
        return (self._response([self.answer(prompt)]), self._response(self.running_results(prompt)))

    def difficulty(self, prompt):
        """The count of '*' in the chain (0..K - 1)."""
        return self.chain(prompt)[1].count("*")

    def describe(self, prompt):
        """{"prompt": the prompt's text, "answer": the direct answer's text}, for a decoded batch."""
        prompt = self._check_prompt("prompt", prompt)
        return {"prompt": self.decode(self.prompt_tokens([prompt])[0]),
                "answer": self.decode(self.solutions(prompt)[0])}

    def decode(self, tokens):
        """The text of token ids (a list, tuple or 1-D integer tensor): their strings joined."""
        if isinstance(tokens, torch.Tensor):
            check_tensor("tokens", tokens, kind="int", ndim=1, allow_empty=True)
            tokens = tokens.tolist()
        return "".join(self.vocab[token] for token in tokens)

    # -- demonstrations for the SFT warm start -------------------------------------------------------

    def demonstrations(self, count, generator):
        """`count` (prompt, response) pairs from the train split, every response correct: with probability
        scratch_share it writes K - 2 items then the answer (the running results, or noise: uniform digits
        0..9), else the direct answer. Deterministic from `generator`, consumed by draw_prompts (one
        randint), torch.rand((count,), float64) for the choice, then torch.randint(0, 10, (count, K - 2))
        for the noise (drawn in both variants, so that their demonstrations share prompts and choices).
        Raises ValueError naming the argument."""
        check_int("count", count, low=1, high=MAX_DEMONSTRATIONS)
        prompts = self.draw_prompts(count, generator, "train").tolist()
        choices = torch.rand(count, generator=generator, dtype=torch.float64).tolist()
        noise = torch.randint(0, MODULUS, (count, self.config.digits - 2), generator=generator).tolist()
        pairs = []
        for prompt, choice, items in zip(prompts, choices, noise):
            if choice >= self.config.scratch_share:
                pairs.append((prompt, self._response([self.answer(prompt)])))
            elif self.config.scratchpad == "running":
                pairs.append((prompt, self._response(self.running_results(prompt))))
            else:
                pairs.append((prompt, self._response(items + [self.answer(prompt)])))
        return pairs

    def settings(self):
        """A JSON-ready dict describing the task: its config, formats, vocabulary, rewards and sizes."""
        return {
            "name": self.name,
            "config": dataclasses.asdict(self.config),
            "prompt_format": "BOS, d1 op1 d2 ... dK (digits 1..9, operators + and *), '='",
            "answer": "the chain's value, left to right, every step mod 10",
            "response_format": "the answer digit, or digits each after a ';', then EOS; the last digit is the answer",
            "verifier": "1.0 when the digit before EOS (after a ';' or alone) is the answer, else 0.0",
            "example": {"prompt": self.decode(self.prompt_tokens([0])[0]),
                        "solutions": [self.decode(solution) for solution in self.solutions(0)]},
            "vocab": list(self.vocab),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "max_new_tokens": self.max_new_tokens,
            "prompts": {split: self.prompt_count(split) for split in SPLITS},
        }
