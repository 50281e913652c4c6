"""The lab's verifiers on decoded TEXT, for any tokenizer: the reward function TRL and verl call.

    reward_func(completions, number=[5, 2])                          # binary: [1.0, 0.0] for ["101", "1"]
    reward_func(completions, numbers=[[1, 2, 3, 4]], target=[1])     # Countdown: [1.0] for ["2-1"]
    compute_score("rl_lab/countdown", "2-1", '{"numbers": [1, 2, 3, 4], "target": 1, "operators": "+-"}')

Standard library only: `python online_tokens.py --export-data DIR` copies this file to
DIR/rl_lab_verifier.py, next to the data, so that a TRL script or verl's custom_reward_function loads it
without the lab. The rules are those of tasks.BinaryTask and countdown.CountdownTask (test_countdown.py
checks that the two agree on every prompt and on right, wrong and malformed responses):

- binary (columns `number`): the completion is the number in binary -> 1.0; a completion cut at the
  length limit (`truncated`) that starts with it -> 0.25; anything else 0.0.
- Countdown (columns `numbers`, `target`, `operators`, optional `partial_credit`): an expression over
  the given numbers (at least two, each at most once, one digit each) joined by the allowed operators,
  '*' binding before '+' and '-', whose value is the target -> 1.0; a legal expression that misses ->
  partial_credit (default 0.0); anything else, and any truncated completion, 0.0.

The text is the completion with its stop token removed (TRL and verl decode without special tokens);
whitespace anywhere in it is ignored (a pretrained tokenizer writes "2 + 3"; the lab's tokens never
hold a space, so this changes none of the lab's verdicts). Whether a completion was truncated is not in
its text: TRL's caller passes `truncated` (the ids end without EOS), verl's may put it in extra_info;
without it, a completion counts as finished. With the lab's tokens that only matters for the binary
task's partial credit: a truncated Countdown response is never a legal expression (the longest legal one
has 2k - 1 tokens for k numbers and the cap is at least 2k).
"""

import json

BINARY_CORRECT, BINARY_PARTIAL = 1.0, 0.25
COUNTDOWN_CORRECT = 1.0
DATA_SOURCES = ("rl_lab/binary", "rl_lab/countdown")


def completion_text(completion):
    """The text of one completion: a string as it is, or the content of the last message of a chat
    completion (TRL passes [{"role": "assistant", "content": ...}] for conversational prompts)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise ValueError(f"completions: expected a string or a list of chat messages, got {completion!r}")


def _without_whitespace(text):
    return "".join(text.split())


def score_binary(text, number, truncated=False):
    """The binary task's reward of one completion text for the prompt `number` (an int 0..5)."""
    answer, text = format(int(number), "b"), _without_whitespace(text)
    if not truncated:
        return BINARY_CORRECT if text == answer else 0.0
    return BINARY_PARTIAL if text.startswith(answer) else 0.0


def _evaluate(numbers, operators):
    """numbers[0] operators[0] numbers[1] ... with '*' before '+' and '-', then left to right."""
    total, term = 0, numbers[0]
    for operator, number in zip(operators, numbers[1:]):
        if operator == "*":
            term *= number
        else:
            total += term
            term = number if operator == "+" else -number
    return total + term


def judge_countdown(text, numbers, target, operators="+-"):
    """(legal, correct) of one completion text: a legal expression of `numbers`, and one equal to `target`."""
    text = _without_whitespace(text)
    digits, signs = text[0::2], text[1::2]
    legal = (len(text) % 2 == 1 and len(digits) >= 2 and all(sign in operators for sign in signs)
             and all(digit.isdigit() and digit.isascii() for digit in digits))
    if legal:
        used = [int(digit) for digit in digits]
        legal = all(number in numbers for number in used) and len(set(used)) == len(used)
        if legal:
            return True, _evaluate(used, signs) == int(target)
    return False, False


def score_countdown(text, numbers, target, operators="+-", partial_credit=0.0, truncated=False):
    """The Countdown reward of one completion text (see the module docstring)."""
    if truncated:
        return 0.0
    legal, correct = judge_countdown(text, [int(number) for number in numbers], target, operators)
    if not legal:
        return 0.0
    return COUNTDOWN_CORRECT if correct else float(partial_credit)


def reward_func(completions, truncated=None, number=None, numbers=None, target=None, operators=None,
                partial_credit=None, **columns):
    """TRL's reward function: one float per completion, from the dataset's answer columns (one entry per
    completion, as TRL passes them). `number` scores the binary task; `numbers` and `target` score
    Countdown. truncated: optional list of bools (the completion hit the length limit without stopping).
    Other columns (TRL's prompts, completion_ids, trainer_state, ...) are ignored."""
    count = len(completions)
    truncated = [False] * count if truncated is None else list(truncated)
    texts = [completion_text(completion) for completion in completions]
    if number is not None:
        return [score_binary(text, n, cut) for text, n, cut in zip(texts, number, truncated)]
    if numbers is None or target is None:
        raise ValueError("reward_func: expected the column `number` (binary) or `numbers` and `target` (Countdown)")
    operators = ["+-"] * count if operators is None else operators
    partial_credit = [0.0] * count if partial_credit is None else partial_credit
    return [score_countdown(text, given, goal, ops, credit, cut) for text, given, goal, ops, credit, cut
            in zip(texts, numbers, target, operators, partial_credit, truncated)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl's custom_reward_function: the reward of one decoded response. ground_truth: the answer data
    as a dict or its JSON text ({"number": n} or {"numbers": [...], "target": t, "operators": "+-"});
    extra_info may carry "truncated"."""
    answer = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    truncated = bool((extra_info or {}).get("truncated", False))
    if data_source == "rl_lab/binary":
        return score_binary(solution_str, answer["number"], truncated)
    if data_source == "rl_lab/countdown":
        return score_countdown(solution_str, answer["numbers"], answer["target"], answer.get("operators", "+-"),
                               answer.get("partial_credit", 0.0), truncated)
    raise ValueError(f"data_source: expected one of {DATA_SOURCES}, got {data_source!r}")
