"""The online driver's tasks: prompts, a rule-based verifier and the correct answers, behind one interface.

A task is an object with these members (the online loop, the policies and the experiments use nothing
else, so a new task plugs in without touching the loop):

    name, vocab (token strings, id = index), eos_id, pad_id, max_new_tokens (the response cap it needs)
    prompt_count(split), split_prompts(split) prompts in "train" or "test": how many, which (global indices)
    draw_prompts(count, generator, split)     (count,) int64 global prompt indices, one torch.randint call
    prompt_tokens(prompts)                    token ids of each prompt (for a language model; the table
                                              policy indexes the prompt itself)
    verify(prompt, tokens, truncated)         the reward of one response (arguments checked)
    rewards(prompts, completion_ids, real, truncated)   (N,) float64 rewards of a batch
    correct(rewards), partial(rewards)        (N,) bool: full credit, partial credit
    solutions(prompt)                         every correct response (token tuples, EOS included)
    describe(prompt)                          {"prompt": ..., "answer": ...} for decoded batches
    decode(tokens)                            readable text of token ids
    settings()                                the JSON block that describes the task
    reward_names                              the names of its rewards (Countdown's two: correct, format)
    reward_components(...)                    (N, K) its rewards one by one, for a task with several

The binary task is the lab's first: the prompt is a number n in 0..5 and the correct answer is n in
binary ("0", "1", "10", "11", "100", "101") followed by EOS.
"""

from __future__ import annotations

import functools

import torch

from countdown import CountdownConfig, CountdownTask
from lab.checks import check_int

DTYPE = torch.float64


class BinaryTask:
    """Write the prompt's number in binary, then EOS. Six prompts, all in the train split (a lookup-table
    policy cannot generalize to an unseen prompt, so there is no test split)."""

    name = "binary"
    vocab = ("0", "1", "EOS")
    eos_id = 2
    pad_id = 2  # PAD shares the EOS id: only the position (after the first EOS) makes it PAD
    max_new_tokens = 5
    numbers = tuple(range(6))
    answers = tuple(tuple(int(bit) for bit in format(n, "b")) for n in numbers)
    reward_correct = 1.0  # the exact answer followed by EOS
    reward_partial = 0.25  # the right answer at the start of a response that hit the cap without EOS

    def prompt_count(self, split="train"):
        return len(self.numbers) if split == "train" else 0

    def split_prompts(self, split="train"):
        """(P_split,) int64 the prompts of a split: all six in train, none in test."""
        return torch.arange(self.prompt_count(split))

    def draw_prompts(self, count, generator, split="train"):
        """(count,) int64: prompts drawn uniformly with replacement, one torch.randint call."""
        if split != "train":
            raise ValueError(f"split: the binary task has only a train split, got {split!r}")
        return torch.randint(0, len(self.numbers), (count,), generator=generator)

    def verify(self, prompt, tokens, truncated):
        """The rule-based reward of one response: 1 for the exact binary answer then EOS, `reward_partial`
        for a truncated response (no EOS) that starts with the right answer, 0 otherwise.

        prompt: the prompt's int in 0..5; tokens: the response's real token ids (a list or tuple of ints
        in 0..2, the EOS included if any); truncated: bool, True when the response hit the length cap
        (then it holds no EOS). Raises ValueError naming the argument for anything else.
        """
        prompt = check_int("prompt", prompt, low=0, high=len(self.answers) - 1)
        if not isinstance(tokens, (list, tuple)) or not all(
            isinstance(token, int) and not isinstance(token, bool) and 0 <= token < len(self.vocab) for token in tokens
        ):
            raise ValueError(f"tokens: expected a list of token ids in [0, {len(self.vocab)}), got {tokens!r}")
        if not isinstance(truncated, bool):
            raise ValueError(f"truncated: expected a bool, got {type(truncated).__name__}")
        tokens = list(tokens)
        if truncated and self.eos_id in tokens:
            raise ValueError("truncated: a response that holds an EOS stopped; it cannot be truncated")
        return self._score(prompt, tokens, truncated)

    def _score(self, prompt, tokens, truncated):
        """`verify` without the argument checks, for the rollout's own lists."""
        answer = list(self.answers[prompt])
        if not truncated and tokens == answer + [self.eos_id]:
            return self.reward_correct
        if truncated and tokens[: len(answer)] == answer:
            return self.reward_partial
        return 0.0

    def rewards(self, prompts, completion_ids, real, truncated):
        """(N,) float64: the verifier's score of each response's real tokens.

        prompts (N,) int64; completion_ids (N, R) int64; real (N, R) bool, True up to and including the
        first EOS; truncated (N,) bool."""
        return torch.tensor(
            [self._score(prompt, [token for token, keep in zip(ids, row_real) if keep], cut)
             for prompt, ids, row_real, cut in zip(prompts.tolist(), completion_ids.tolist(), real.tolist(),
                                                   truncated.tolist())],
            dtype=DTYPE,
        )

    reward_names = ("reward",)  # one reward: an advantage over several (GDPO) needs another task

    def correct(self, rewards):
        return rewards == self.reward_correct

    def partial(self, rewards):
        return rewards == self.reward_partial

    def solutions(self, prompt):
        return (self.answers[int(prompt)] + (self.eos_id,),)

    def describe(self, prompt):
        return {"prompt": int(prompt), "answer": format(int(prompt), "b")}

    def decode(self, tokens):
        return " ".join(self.vocab[token] for token in tokens)

    def settings(self):
        return {
            "description": "write the prompt's number in binary, then EOS",
            "vocabulary": list(self.vocab),
            "eos_token_id": self.eos_id,
            "pad_token_id": self.pad_id,
            "prompts_and_answers": {str(n): format(n, "b") for n in self.numbers},
            "reward_correct": self.reward_correct,
            "reward_partial_truncated": self.reward_partial,
        }


@functools.lru_cache(maxsize=8)
def countdown_task(max_new_tokens):
    """The default Countdown task for this response cap, built once per process (it enumerates about 11k
    expressions; a task never changes once built)."""
    return CountdownTask(CountdownConfig(max_new_tokens=max_new_tokens))


TASKS = {  # name -> a builder of the task for responses of at most max_new_tokens tokens
    "binary": lambda max_new_tokens: BinaryTask(),
    "countdown": countdown_task,
}
# the rewards each task scores one by one (reward_components): Countdown's correctness and format
TASK_REWARDS = {"binary": BinaryTask.reward_names, "countdown": CountdownTask.reward_names}
# the shortest cap each task accepts: Countdown's verifier needs room for its longest expression and EOS
TASK_MIN_NEW_TOKENS = {"binary": 1, "countdown": 2 * CountdownConfig().numbers_per_prompt}
