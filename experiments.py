"""The phenomena atlas: the lab's claims and the field's known effects, each a named experiment run over
seeds, its claims checked against every seed, written as tables, verdicts and a figure.

    python experiments.py --list                      # the experiments, one line each
    python experiments.py kl-estimators               # one experiment -> results-experiments/kl-estimators/
    python experiments.py all                         # every experiment (docs/atlas.md: how long it takes)
    python experiments.py all --seed-start 100        # the same claims on seeds nobody looked at
    python experiments.py zero-variance --seeds 10 --jobs 2 --quick
    python experiments.py all --timings results-bench/atlas.json   # also each experiment's run time

Each experiment runs the drivers' Python APIs in this process's workers (no shelling out) over seeds
S..S+N-1 (--seed-start S, default 0; --seeds N, default the experiment's own, 5 for most) and writes
results-experiments/<name>/: runs.csv (one row per run: configuration, seed, metrics; an empty cell is
a target never reached), curves.csv (per-iteration values of each run, where the experiment has curves),
summary.csv and summary.md (per configuration, each metric's mean, std over seeds, min and max, over the
runs that have a value, and how many never reached the target; then each claim's verdict), settings.json
(the claims with their verdicts and per-seed values, the source, the command, every run's options) and
figure.svg (drawn by plot_results.py from those files). Runs are spread over --jobs worker processes,
each running torch single-threaded; the files do not depend on --jobs, and the same seeds give the same
bytes.

A claim is a check over the per-seed results (`Claim`): a property counted over seeds ("count": holds
when enough seeds show it), a paired difference between configurations that share seeds ("greater":
holds when enough seeds agree in sign and the 95% t-interval of the mean difference excludes 0; does
not hold when the same is true the other way; within noise otherwise), an equivalence ("within": the
interval lies inside +-margin), or an exact identity computed without seeds ("exact").

A new experiment is one `Experiment` entry in `experiments()` (its configurations name a runner of
RUNNERS and its options), plus a runner when no existing one measures what it needs. Its `quick`
options shrink every run for tests and --quick (default: a few iterations of a training runner), and
its `cost` (seconds per run) orders the work and the ETA.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F

import online_tokens
import ppo_chain
import policies
from online_settings import resolve
from policies import TablePolicy, logps_of_tokens, nucleus
import rl_lab
from lab.checks import machine, torch_threads
from lab.io import (
    Progress,
    HeldSignals,
    OneLineErrorParser,
    Terminated,
    csv_text,
    int_flag,
    json_text,
    output_file_or_exit,
    output_folder_or_exit,
    run_cli,
    separate_outputs_or_exit,
    write_files,
)

DTYPE = rl_lab.DTYPE
TARGET = 0.9  # "learned": exact success probability (online) or best-action probability (bandit)
LAST = 10  # iterations averaged for end-of-run statistics
STUCK = 0.5  # a prompt whose exact success ends below this is stuck (its groups mostly tie: no signal)
DEFAULT_SEEDS = 5
QUICK_STEPS = 4  # iterations of every training run at --quick (tests): the mechanism, not the effect
# metrics that are the first iteration (or budget) at which a run reached TARGET: None when it never did
TARGET_METRICS = ("iterations_to_0.9", "tokens_to_0.9", "steps_to_0.9", "actions_to_0.9")
CONFIDENCE = 0.95
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile: Wilson's interval at 95%


# ---------------------------------------------------------------------------------------------
# Statistics over seeds: Student's t interval of a mean, Wilson's interval of a share
# ---------------------------------------------------------------------------------------------


def _t_coverage(theta, df):
    """P(|T| <= sqrt(df) tan(theta)) for Student's t with integer df >= 1, in closed form (Abramowitz and
    Stegun 26.7.3-4): a finite sum of powers of cos(theta), odd and even df apart."""
    cos, sin = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        term, total = cos, cos if df > 1 else 0.0  # the sum cos + 2/3 cos^3 + (2*4)/(3*5) cos^5 + ...
        for k in range(3, df - 1, 2):
            term *= (k - 1) / k * cos * cos
            total += term
        return 2.0 / math.pi * (theta + sin * total)
    term = total = 1.0  # the sum 1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ...
    for k in range(2, df - 1, 2):
        term *= (k - 1) / k * cos * cos
        total += term
    return sin * total


def t_quantile(df, level=CONFIDENCE):
    """The two-sided critical value t of Student's t with `df` degrees of freedom: P(|T| <= t) = level
    (12.706 for df 1, 2.776 for df 4, 2.262 for df 9). Found by bisection on the closed-form coverage,
    so no table and no scipy. Raises ValueError for df < 1 or level outside (0, 1)."""
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df: expected an integer >= 1, got {df!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: expected a number in (0, 1), got {level!r}")
    low, high = 0.0, math.pi / 2
    for _ in range(200):  # the coverage rises with theta from 0 to 1
        middle = (low + high) / 2
        if middle in (low, high):
            break
        low, high = (middle, high) if _t_coverage(middle, df) < level else (low, middle)
    return math.sqrt(df) * math.tan((low + high) / 2)


def mean_interval(values, level=CONFIDENCE):
    """(mean, low, high): the mean of `values` and its t-interval, mean -+ t * sample std / sqrt(n);
    low and high are None for fewer than 2 values (no spread to estimate)."""
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None, None
    half = t_quantile(len(values) - 1, level) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def wilson_interval(successes, trials):
    """The 95% Wilson score interval (low, high) of a share `successes` of `trials` (Wilson 1927): unlike
    k/n -+ 1.96 se it stays inside [0, 1] and is not empty at 0 of n."""
    if trials == 0:
        return None, None
    share, z2 = successes / trials, Z_95 * Z_95
    centre = (share + z2 / (2 * trials)) / (1 + z2 / trials)
    half = Z_95 / (1 + z2 / trials) * math.sqrt(share * (1 - share) / trials + z2 / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_differences(by_seed, metric, first, second):
    """{seed: first's metric - second's} over the seeds where both configurations have a value (a target
    metric is None for a run that never reached it: that seed is left out, not counted as -1)."""
    differences = {}
    for seed, runs in by_seed.items():
        a, b = runs[first][metric], runs[second][metric]
        if a is not None and b is not None:
            differences[seed] = a - b
    return differences


def paired_comparison(by_seed, metric, first, second):
    """The paired comparison of two configurations that share seeds: per-seed differences, their mean and
    95% t-interval, how many seeds have each sign, and how many seeds were left out (no value)."""
    differences = paired_differences(by_seed, metric, first, second)
    values = list(differences.values())
    mean, low, high = mean_interval(values) if values else (None, None, None)
    return {"metric": metric, "first": first, "second": second, "seeds": len(values),
            "left_out": len(by_seed) - len(values), "mean_difference": mean,
            "interval": None if low is None else [low, high],
            "first_greater": sum(value > 0 for value in values), "second_greater": sum(value < 0 for value in values),
            "per_seed": [{"seed": seed, "difference": value} for seed, value in differences.items()]}


# ---------------------------------------------------------------------------------------------
# Claims: a predicate over the per-seed results, and its verdict
# ---------------------------------------------------------------------------------------------

HOLDS, FAILS, NOISE = "holds", "does not hold", "within noise"
CLAIM_TESTS = ("count", "greater", "within", "exact")


@dataclass(frozen=True)
class Claim:
    """A claim as a check. `value(runs)` gets one seed's results, {configuration: metrics}, and returns:

    test "count":   a bool (the property holds in this seed); the claim holds when at least `at_least` of
                    the seeds (a share, rounded up, at least 1) show it, else does not hold;
    test "greater": a float claimed > 0 (a paired difference), or None when undefined in this seed (a
                    target never reached); holds when at least `at_least` of the defined seeds are > 0
                    and the 95% t-interval of the mean is above 0; does not hold when the same is true
                    below 0; within noise otherwise;
    test "within":  a float claimed inside +-margin; holds when the 95% interval lies inside it, does not
                    hold when the interval lies wholly outside it, within noise otherwise;
    test "exact":   value(None) is a bool computed without seeds (an identity of a table).

    note: the cause, the ablation that tests it, or why a claim that does not hold is kept."""

    text: str
    value: object
    test: str = "count"
    at_least: float = 1.0
    margin: float | None = None
    note: str = ""


def required_seeds(share, seeds):
    """How many of `seeds` seeds a share asks for: rounded up, at least 1 (4 of 5 for 0.8)."""
    return max(1, math.ceil(share * seeds - 1e-9))


def check_claim(claim, by_seed):
    """The verdict of `claim` over {seed: {configuration: metrics}}: a JSON-ready dict with the verdict,
    the count it rests on ("4 of 5 seeds"), the mean and its 95% interval (for a count, the share and
    Wilson's interval), and every seed's value."""
    if claim.test not in CLAIM_TESTS:
        raise ValueError(f"test: expected one of {', '.join(CLAIM_TESTS)}, got {claim.test!r}")
    result = {"claim": claim.text, "test": claim.test}
    if claim.test == "exact":
        holds = bool(claim.value(None))
        return {**result, "verdict": HOLDS if holds else FAILS, "needs": "exact", "count": "exact, no seeds",
                "agree": None,
                "seeds": 0, "required": None, "undefined": 0, "mean": None, "interval": None, "margin": None,
                "per_seed": [], "note": claim.note}
    values = {seed: claim.value(runs) for seed, runs in by_seed.items()}
    defined = {seed: value for seed, value in values.items() if value is not None}
    seeds = len(defined)
    required = required_seeds(claim.at_least, seeds)
    interval = None
    if claim.test == "count":
        agree = sum(bool(value) for value in defined.values())
        verdict = HOLDS if agree >= required else FAILS
        mean = agree / seeds if seeds else None
        low, high = wilson_interval(agree, seeds)
        interval = None if low is None else [low, high]
        per_seed = [{"seed": seed, "value": bool(value)} for seed, value in defined.items()]
    else:
        numbers = list(defined.values())
        mean, low, high = mean_interval(numbers) if numbers else (None, None, None)
        interval = None if low is None else [low, high]
        per_seed = [{"seed": seed, "value": value} for seed, value in defined.items()]
        if claim.test == "greater":
            agree, against = sum(value > 0 for value in numbers), sum(value < 0 for value in numbers)
            if low is not None and agree >= required and low > 0:
                verdict = HOLDS
            elif low is not None and against >= required and high < 0:
                verdict = FAILS
            else:
                verdict = NOISE
        else:
            margin = claim.margin
            agree = sum(abs(value) < margin for value in numbers)
            if low is not None and -margin < low and high < margin:
                verdict = HOLDS
            elif low is not None and (low >= margin or high <= -margin):
                verdict = FAILS
            else:
                verdict = NOISE
    count = f"{agree} of {seeds} seeds"
    if seeds == 0:  # every seed left out (a target no run reached, as in a --quick run): nothing to count
        needs = "a seed with a value, and none has one"
    elif claim.test == "count":
        needs = "every seed" if required == seeds else f"{required} of {seeds} seeds"
    elif claim.test == "greater":
        needs = f"{required} of {seeds} above 0, interval above 0"
    else:
        needs = f"interval inside +-{claim.margin}"
    return {**result, "verdict": verdict, "needs": needs, "count": count, "agree": agree, "seeds": seeds,
            "required": required,
            "undefined": len(values) - seeds, "mean": mean, "interval": interval, "margin": claim.margin,
            "per_seed": per_seed, "note": claim.note}


# ---------------------------------------------------------------------------------------------
# Exact quantities of a table policy: every response enumerated, no sampling
# ---------------------------------------------------------------------------------------------


@dataclass
class Responses:
    """Every response a table policy can write to every prompt, with its reward: prompts (M,) int64
    (prompt-major), completion_ids (M, R) int64 (PAD after the first EOS), real (M, R) bool (up to and
    including the first EOS), truncated (M,) bool, rewards (M,) float64, lengths (M,) float64 (the real
    tokens), prompt_count P. M = P * (sum_{k<R} (V-1)^k + (V-1)^R): 378 for the binary task at R = 5."""

    prompts: torch.Tensor
    completion_ids: torch.Tensor
    real: torch.Tensor
    truncated: torch.Tensor
    rewards: torch.Tensor
    lengths: torch.Tensor
    prompt_count: int


def all_responses(task, length):
    """Every response of `task` in at most `length` tokens to each train prompt (see `Responses`): k
    non-EOS tokens then EOS for k < length, and every `length` non-EOS tokens (truncated)."""
    words = [token for token in range(len(task.vocab)) if token != task.eos_id]
    bodies = [(list(body) + [task.eos_id], False) for k in range(length) for body in itertools.product(words, repeat=k)]
    bodies += [(list(body), True) for body in itertools.product(words, repeat=length)]
    ids = torch.full((len(bodies), length), task.pad_id, dtype=torch.long)
    real = torch.zeros(len(bodies), length, dtype=torch.bool)
    for row, (tokens, _) in enumerate(bodies):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        real[row, : len(tokens)] = True
    truncated = torch.tensor([cut for _, cut in bodies])
    prompt_count = task.prompt_count("train")
    prompts = torch.arange(prompt_count).repeat_interleave(len(bodies))  # (P,) -> (P*M,), prompt-major
    ids, real, truncated = ids.repeat(prompt_count, 1), real.repeat(prompt_count, 1), truncated.repeat(prompt_count)
    rewards = task.rewards(prompts, ids, real, truncated)
    return Responses(prompts, ids, real, truncated, rewards, real.sum(dim=1).to(DTYPE), prompt_count)


def token_logps(table, responses, temperature, top_p=None):
    """(M, R) log-prob of each token of every response under the table tempered by `temperature` (and
    restricted to the top-p nucleus, as a sampler draws), 0 past each response's end; a token outside the
    nucleus has -inf (that response is never drawn)."""
    logits = TablePolicy(table, temperature, None).logits(responses.prompts, responses.completion_ids)  # (M, R, V)
    if top_p is None:
        logps = logps_of_tokens(logits, responses.completion_ids)
    else:
        probs = nucleus(torch.softmax(logits, dim=-1).reshape(-1, logits.shape[-1]), top_p)  # (M*R, V)
        chosen = probs.reshape(logits.shape).gather(-1, responses.completion_ids.unsqueeze(-1)).squeeze(-1)
        logps = chosen.log()  # (M, R, 1) -> (M, R)
    return torch.where(responses.real, logps, torch.zeros_like(logps))


def response_probabilities(state, responses):
    """(M,) exact probability of each enumerated response under the run's current policy."""
    with torch.no_grad():
        return token_logps(state.policy.table.detach(), responses, state.cfg.temperature).sum(dim=1).exp()


REWARD_CLASSES = (0.0, 0.25, 1.0)  # the binary task's rewards: wrong, partial credit, correct


def reward_distribution(state, responses=None):
    """(P, 3) exact probabilities of the rewards 0, 0.25 and 1 for each prompt under the run's current
    table policy, summed over every response (`all_responses`)."""
    responses = all_responses(state.task, state.cfg.max_new_tokens) if responses is None else responses
    probabilities = response_probabilities(state, responses)
    distribution = torch.zeros(responses.prompt_count, len(REWARD_CLASSES), dtype=DTYPE)
    for index, reward in enumerate(REWARD_CLASSES):
        hits = responses.rewards == reward
        distribution[:, index].index_add_(0, responses.prompts[hits], probabilities[hits])
    return distribution


def expected_lengths(policy):
    """(P,) exact E[length] of each prompt's response under a table policy (tokens, EOS included): the sum
    over positions of the probability that the response is still running there, by the chain rule over
    the table's (position, previous token) states, as TablePolicy.response_kl walks them."""
    with torch.no_grad():
        probs = torch.softmax(policy.table.detach() / policy.temperature, dim=-1)  # (P, R, S, V)
        prompts, length, states, vocab = probs.shape
        reach = torch.zeros(prompts, states, dtype=probs.dtype)  # (P, S): p(running, previous token = s)
        reach[:, policy.bos_state] = 1.0
        total = torch.zeros(prompts, dtype=probs.dtype)
        for position in range(length):
            total = total + reach.sum(dim=1)  # a running response writes one token here
            flow = (reach.unsqueeze(-1) * probs[:, position]).sum(dim=1)  # (P, S, V) -> (P, V): p(next token)
            reach = torch.zeros_like(reach)
            reach[:, :vocab] = flow
            reach[:, policy.eos_id] = 0.0  # an EOS ends the response
        return total


def expected_wrong_length(state):
    """E[length | not correct] for a prompt drawn uniformly: the exact mean length (tokens, EOS included)
    of the answers that are not correct (partial credit included), under the run's current policy. What
    a sampled mean_wrong_length estimates, without its noise and without its gaps where a batch held no
    wrong answer. None when every answer is correct."""
    owner, prompts, ids, real, reachable, count = state.evaluation["train"]
    with torch.no_grad():
        logps = logps_of_tokens(state.policy.logits(prompts, ids), ids)  # (M, L) the correct answers
        path = torch.where(reachable, torch.where(real, logps, torch.zeros_like(logps)).sum(dim=1).exp(),
                           torch.zeros(ids.shape[0], dtype=logps.dtype))  # (M,)
        correct_mass = path.sum()
        correct_tokens = (path * real.sum(dim=1)).sum()
        wrong_mass = count - correct_mass
        wrong_tokens = expected_lengths(state.policy).sum() - correct_tokens
    return (wrong_tokens / wrong_mass).item() if wrong_mass > 0 else None


def expected_policy_gradients(table, responses, temperature, sampler_temperature=None, top_p=None, tis_cap=None):
    """(grad J, E_q[g]): the exact gradient of the expected reward and the exact expectation of its
    estimate when responses are drawn by a sampler q that may differ from the trainer p (another
    temperature, top-p), with or without truncated importance weights min(p_t / q_t, cap) per token (Yao et
    al. 2025). Both (P, R, S, V), like the table; every response enumerated, nothing sampled.

    J(theta) = mean over prompts of sum_y p_theta(y) R(y). The estimate from one response y ~ q is
    g = sum_t w_t (R(y) - b) grad log p_theta(y_t | y_<t): the policy term that GRPO's loss reduces to at
    ratio 1 (before its length and std normalization), with b = E_q[R] of the prompt (what a group mean
    estimates). With q = p and w = 1, E_q[g] = grad J exactly (b drops out: sum_y grad p_theta(y) = 0).
    table: the trainer's logits (detached inside); temperature: the trainer's."""
    table = table.detach().clone().requires_grad_(True)
    logps = token_logps(table, responses, temperature)  # (M, R), with grad
    prompts = responses.prompt_count
    objective = (logps.sum(dim=1).exp() * responses.rewards).sum() / prompts
    (exact,) = torch.autograd.grad(objective, table, retain_graph=True)  # logps serve the estimate too
    with torch.no_grad():
        sampler_logps = token_logps(table, responses, sampler_temperature or temperature, top_p)  # (M, R)
        drawn = torch.isfinite(sampler_logps)  # False for a token outside the nucleus: never drawn
        q = sampler_logps.sum(dim=1).exp()  # (M,) 0 for a response that holds such a token
        baseline = torch.zeros(prompts, dtype=DTYPE).index_add_(0, responses.prompts, q * responses.rewards)
        advantages = responses.rewards - baseline[responses.prompts]  # (M,)
        weights = torch.ones_like(sampler_logps)
        if tis_cap is not None:
            safe = torch.where(drawn, sampler_logps, torch.zeros_like(sampler_logps))
            weights = (logps.detach() - safe).exp().clamp(max=tis_cap)
        weights = torch.where(responses.real & drawn, weights, torch.zeros_like(weights))
    surrogate = (q * advantages * (weights * logps).sum(dim=1)).sum() / prompts
    (estimated,) = torch.autograd.grad(surrogate, table)
    return exact, estimated


def policy_gradient_bias(table, responses, temperature, sampler_temperature=None, top_p=None, tis_cap=None):
    """||E_q[g] - grad J|| / ||grad J|| of `expected_policy_gradients`: how far, relative to its size, the
    expected policy-gradient estimate of a mismatched sampler is from the exact gradient (0 on-policy)."""
    exact, estimated = expected_policy_gradients(table, responses, temperature, sampler_temperature, top_p, tis_cap)
    return ((estimated - exact).norm() / exact.norm()).item()


# ---------------------------------------------------------------------------------------------
# Runners: one run of a driver, reduced to metrics (and a curve). Module-level, so workers can run them.
# ---------------------------------------------------------------------------------------------


def _first_step(rows, column, threshold):
    return next((row["step"] for row in rows if row[column] >= threshold), None)


def online_metrics(rows):
    """End-of-run statistics of an online run (online_tokens.run_summary; None: never reached 0.9)."""
    return dict(online_tokens.run_summary(rows))


def end_of_run(state, responses):
    """What the policy ends with, per prompt, exactly: how many prompts are stuck (success below STUCK),
    how many of them on a partial-credit answer (a truncated response that starts right: p(0.25) above
    1/2), and the worst prompt's success."""
    success = online_tokens.success_by_prompt(state.policy, state.evaluation["train"])
    partial = reward_distribution(state, responses)[:, REWARD_CLASSES.index(state.task.reward_partial)]
    return {"stuck_prompts": int((success < STUCK).sum().item()),
            "partial_stuck_prompts": int(((success < STUCK) & (partial > 0.5)).sum().item()),
            "worst_prompt_success": success.min().item()}


# columns that hold a value at row 0 (the initial evaluation, before anything is sampled): the exact
# evaluation after each update, and the budget; the others describe a sampled batch, so row 0 has none
AT_START = ("success_probability", "test_success_probability", "kl_reference", "expected_reward",
            "best_action_probability", "expected_return", "left_probability", "total_tokens_sampled")


def run_online(seed, curve=(), exact_curve=(), **options):
    """One online_tokens run (any policy: the table, or the transformer with policy="transformer"):
    metrics (online_tokens.run_summary, plus the final test success where the task has a test split),
    and for the columns in `curve` a per-iteration curve (None where a row has no value: a sampled column
    at row 0, a length of answers the batch did not hold). A table policy also gets its end-of-run state
    of each prompt (`end_of_run`); exact_curve ("wrong_length",), a table only, adds E[length | wrong]
    after every update, exactly."""
    state = online_tokens.setup(seed=seed, **options)
    if exact_curve and not state.policy.exact:
        raise ValueError("exact_curve: needs a policy evaluated exactly (the table)")
    exact = [{"exact_wrong_length": expected_wrong_length(state)}] if exact_curve else []  # row 0: the start

    def observe(state, batch, credit, row):
        exact.append({"exact_wrong_length": expected_wrong_length(state)})

    rows, _ = online_tokens.run(state, observe=observe if exact_curve else None)
    metrics = online_metrics(rows)
    if "test_success_probability" in rows[-1]:
        metrics["final_test_success_probability"] = rows[-1]["test_success_probability"]
    if state.policy.exact:  # every response of a table enumerates in milliseconds; a transformer's cannot
        metrics.update(end_of_run(state, all_responses(state.task, state.cfg.max_new_tokens)))
    if exact_curve:
        tail = [point["exact_wrong_length"] for point in exact[-LAST:] if point["exact_wrong_length"] is not None]
        metrics["exact_wrong_length"] = math.fsum(tail) / len(tail) if tail else None
    points = []
    for index, row in enumerate(rows):
        point = {"step": row["step"]}
        for name in curve:
            empty = name in ("mean_correct_length", "mean_wrong_length") and row[name] == 0
            point[name] = None if empty or (index == 0 and name not in AT_START) else row[name]
        if exact_curve:
            point["exact_wrong_length"] = exact[index]["exact_wrong_length"]
        points.append(point)
    return {"metrics": metrics, "curve": points}


def run_zero_variance(seed, **options):
    """An online run that also predicts each batch's share of zero-variance groups from the exact
    reward distribution of the policy that sampled it: group g ties with probability
    p_g = sum over reward values v of q_v ** G. Given the policies, the measured share over the run is a
    mean of independent Bernoulli(p_g), so its standard error is exact too, sqrt(sum_t sum_g p_g (1 - p_g)
    / B^2) / T: measured_minus_predicted_z is the difference in those units (with dynamic sampling the
    kept groups are not the drawn ones, and the prediction describes the first draw only)."""
    state = online_tokens.setup(seed=seed, **options)
    responses = all_responses(state.task, state.cfg.max_new_tokens)
    group_size = state.cfg.group_size
    previous = {"q": reward_distribution(state, responses)}
    curve, variances = [], []

    def observe(state, batch, credit, row):
        prompts = batch.prompts.reshape(-1, group_size)[:, 0]  # (B*G,) -> (B,) one per group
        ties = (previous["q"][prompts] ** group_size).sum(dim=1)  # (B,) p_g
        variances.append((ties * (1 - ties)).sum().item() / prompts.numel() ** 2)
        curve.append({"step": row["step"], "zero_group_fraction": row["zero_group_fraction"],
                      "predicted_zero_group_fraction": ties.mean().item(),
                      "success_probability": row["success_probability"],
                      "total_tokens_sampled": row["total_tokens_sampled"]})
        previous["q"] = reward_distribution(state, responses)

    rows, _ = online_tokens.run(state, observe=observe)
    metrics = online_metrics(rows)
    metrics["predicted_zero_group_fraction"] = math.fsum(item["predicted_zero_group_fraction"] for item in curve) / len(curve)
    metrics["measured_minus_predicted"] = metrics["zero_group_fraction"] - metrics["predicted_zero_group_fraction"]
    error = math.sqrt(math.fsum(variances)) / len(curve)
    metrics["measured_minus_predicted_z"] = metrics["measured_minus_predicted"] / error if error > 0 else 0.0
    return {"metrics": metrics, "curve": curve}


def prompt_success(state):
    """(P,) exact p(correct answer then EOS) of each prompt under the run's current policy."""
    return online_tokens.success_by_prompt(state.policy, state.evaluation["train"])


EASY, HARD = (0, 1), (4, 5)  # one-digit answers ("0", "1") and three-digit ones ("100", "101")


def run_std_scaling(seed, **options):
    """An online run that records the exact success of the easy and the hard prompts after each update."""
    state = online_tokens.setup(seed=seed, **options)
    curve = []

    def observe(state, batch, credit, row):
        success = prompt_success(state)
        curve.append({"step": row["step"], "easy_success": success[list(EASY)].mean().item(),
                      "hard_success": success[list(HARD)].mean().item(),
                      "success_probability": row["success_probability"]})

    rows, _ = online_tokens.run(state, observe=observe)
    metrics = online_metrics(rows)
    for name in ("easy_success", "hard_success"):
        metrics[f"{name}_step_10"] = curve[9][name] if len(curve) >= 10 else curve[-1][name]
        metrics[f"{name}_final"] = curve[-1][name]
    return {"metrics": metrics, "curve": curve}


def run_sampler_mismatch(seed, tis_cap_measured=2.0, **options):
    """An online run whose sampler may differ from the trainer, that also measures after every update the
    bias of the expected policy gradient under that sampler, without and with truncated importance
    weights (cap `tis_cap_measured`), against the exact gradient (`policy_gradient_bias`), whatever the
    run itself uses. Metrics: the run's, and each bias averaged over the run."""
    state = online_tokens.setup(seed=seed, **options)
    responses = all_responses(state.task, state.cfg.max_new_tokens)
    cfg, curve = state.cfg, []

    def bias(table, cap):
        return policy_gradient_bias(table, responses, cfg.temperature, cfg.rollout_temperature, cfg.rollout_top_p, cap)

    def point(step, success):  # the policy that samples the next batch
        table = state.policy.table
        return {"step": step, "success_probability": success, "gradient_bias": bias(table, None),
                "gradient_bias_tis": bias(table, tis_cap_measured)}

    def observe(state, batch, credit, row):
        curve.append(point(row["step"], row["success_probability"]))

    start = point(0, online_tokens.evaluate(state)["success_probability"])
    rows, _ = online_tokens.run(state, observe=observe)
    metrics = {**online_metrics(rows), **end_of_run(state, responses)}
    for name in ("gradient_bias", "gradient_bias_tis"):  # over the policies that sampled a batch
        metrics[name] = math.fsum(item[name] for item in [start] + curve[:-1]) / len(curve)
    curve.insert(0, start)
    return {"metrics": metrics, "curve": curve}


def run_bandit(seed, algorithm, curve=("expected_reward",), **options):
    rows, _ = rl_lab.train(algorithm, seed=seed, **options)
    last = rows[-1]
    metrics = {
        "final_expected_reward": last["expected_reward"],
        "final_best_action_probability": last["best_action_probability"],
        "steps_to_0.9": _first_step(rows, "best_action_probability", TARGET),
        "sampled_actions": last["sampled_actions"],
        "zero_group_fraction": math.fsum(row["zero_group_fraction"] for row in rows[1:]) / (len(rows) - 1),
        "best_action_probability_step_10": rows[min(10, len(rows) - 1)]["best_action_probability"],
    }
    if algorithm == "dpo":
        metrics["dpo_training_loss"] = last["dpo_training_loss"]
        metrics["dpo_clean_loss"] = last["dpo_clean_loss"]
    reached = next((row for row in rows if row["best_action_probability"] >= TARGET), None)
    metrics["actions_to_0.9"] = reached["sampled_actions"] if reached else None
    points = [{"step": row["step"], **{name: row[name] if index or name in AT_START else None for name in curve}}
              for index, row in enumerate(rows)]
    return {"metrics": metrics, "curve": points}


def run_chain(seed, gae_lambda, steps=120):
    rows, _ = ppo_chain.train(seed=seed, gae_lambda=gae_lambda, steps=steps)
    at = lambda step: rows[min(step, len(rows) - 1)]["expected_return"]  # noqa: E731
    metrics = {"final_expected_return": rows[-1]["expected_return"], "expected_return_step_1": at(1),
               "expected_return_step_5": at(5), "expected_return_step_10": at(10),
               "steps_to_0.9": _first_step(rows, "expected_return", TARGET)}
    return {"metrics": metrics, "curve": [{"step": row["step"], "expected_return": row["expected_return"],
                                           "left_probability": row["left_probability"]} for row in rows]}


def run_reward_shift(seed, algorithm, shift, steps):
    """A bandit run with every reward shifted by `shift`; for GRPO also the first batch's advantages with
    and without the shift (they must agree), for PPO the critic's error after training."""
    rows, _ = rl_lab.train(algorithm, seed=seed, steps=steps, reward_shift=shift)
    metrics = {
        "best_action_probability_step_5": rows[min(5, steps)]["best_action_probability"],
        "best_action_probability_step_10": rows[min(10, steps)]["best_action_probability"],
        "final_best_action_probability": rows[-1]["best_action_probability"],
        "steps_to_0.9": _first_step(rows, "best_action_probability", TARGET),
    }
    # the first batch's advantages with and without the shift, each algorithm's own way
    generator = torch.Generator().manual_seed(seed)
    rewards = rl_lab.reward_table()[torch.randint(0, 4, (16,), generator=generator)][:, [0, 1, 2, 0, 1, 2, 0, 1]]
    if algorithm == "grpo":  # group-relative: the shift cancels in R - mean
        change = rl_lab.group_advantages(rewards + shift) - rl_lab.group_advantages(rewards)
    else:  # one-step GAE against the initial zero critic: A = R - V(x) moves with R
        flat, done = rewards.reshape(-1), torch.ones(rewards.numel(), dtype=torch.bool)
        zero = torch.zeros_like(flat)
        change = rl_lab.gae(flat + shift, zero, zero, done, done)[0] - rl_lab.gae(flat, zero, zero, done, done)[0]
    metrics["advantage_change"] = change.abs().max().item()
    return {"metrics": metrics, "curve": [{"step": row["step"], "best_action_probability": row["best_action_probability"],
                                           "value_loss": row["value_loss"] if row["step"] else None} for row in rows]}


def _random_pair(seed, scale):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, generator=generator, dtype=DTYPE) * scale
    reference = torch.randn(6, generator=generator, dtype=DTYPE) * scale
    return logits, F.log_softmax(reference, dim=-1)


def run_kl_estimators(seed, distance):
    """Exact statistics of k1, k2, k3 on a 6-way categorical: the bias and per-sample std of each value
    against the exact KL(pi || ref), and the distance of each expected gradient from the gradients of
    both KL directions (arXiv 2506.09477). Nothing is sampled: every expectation is a weighted sum."""
    logits, ref_logp = _random_pair(seed, {"near": 0.3, "far": 1.5}[distance])
    logp = F.log_softmax(logits, dim=-1)
    probs = logp.exp()
    exact = (probs * (logp - ref_logp)).sum().item()

    def gradient_of(function):
        leaf = logits.clone().requires_grad_(True)
        leaf_logp = F.log_softmax(leaf, dim=-1)
        (gradient,) = torch.autograd.grad(function(leaf_logp), leaf)
        return gradient

    grad_kl_pi_ref = gradient_of(lambda lp: (lp.exp() * (lp - ref_logp)).sum())  # the reverse KL, trained policy first
    grad_kl_ref_pi = gradient_of(lambda lp: (ref_logp.exp() * (ref_logp - lp)).sum())  # the forward KL
    metrics = {"kl_exact": exact}
    for name, estimator in rl_lab.KL_ESTIMATORS.items():
        values = estimator(logp, ref_logp)
        mean = (probs * values).sum().item()
        std = math.sqrt(max((probs * (values - mean) ** 2).sum().item(), 0.0))
        expected_gradient = gradient_of(lambda lp, estimator=estimator: (probs * estimator(lp, ref_logp)).sum())
        metrics.update({
            f"{name}_relative_bias": (mean - exact) / exact,
            f"{name}_relative_std": std / exact,
            f"{name}_grad_error_kl_pi_ref": (expected_gradient - grad_kl_pi_ref).norm().item()
            / grad_kl_pi_ref.norm().item(),
            f"{name}_grad_error_kl_ref_pi": (expected_gradient - grad_kl_ref_pi).norm().item()
            / grad_kl_ref_pi.norm().item(),
            f"{name}_grad_norm_ratio": expected_gradient.norm().item() / grad_kl_pi_ref.norm().item(),
        })
    return {"metrics": metrics, "curve": []}


def _per_token_loss(batch, credit, logps):
    """GRPO's per-token loss (PPO-Clip term + 0.02 k3) of a batch, before any reduction: (N, R)."""
    advantages = credit.advantages.unsqueeze(1).expand_as(logps)
    policy = rl_lab.clipped_policy_loss(logps, batch.old_logps, advantages, check=False)
    return policy + 0.02 * rl_lab.token_kl_penalty(logps, batch.ref_logps, check=False)


def run_microbatch(seed):
    """One batch (from a policy moved by a few GRPO steps, so lengths differ), split into M = 1, 2, 4
    micro-batches with gradient accumulation. For each reduction, the accumulated gradient with each
    micro-batch normalized locally (and weighted by its share of the sequences, as verl's
    loss_scale_factor) or by the global token count, against the full-batch gradient."""
    state = online_tokens.setup(seed=seed, steps=4)
    online_tokens.run(state)  # a few updates: lengths now differ within the batch
    batch = online_tokens.rollout(state)
    credit = online_tokens.credit(state, batch)
    mask = batch.mask
    count = mask.shape[0]
    global_tokens = mask.sum()

    def gradient(loss_of):
        policy = state.policy.snapshot()
        policy.table.requires_grad_(True)
        logps = logps_of_tokens(policy.logits(batch.prompts, batch.completion_ids), batch.completion_ids)
        (result,) = torch.autograd.grad(loss_of(_per_token_loss(batch, credit, logps)), policy.table)
        return result

    metrics = {}
    for reduction in rl_lab.REDUCTIONS:
        full = gradient(lambda per_token: rl_lab.reduce_token_loss(per_token, mask, reduction, 5))
        for micro in (1, 2, 4):
            size = count // micro
            parts = [slice(index * size, (index + 1) * size) for index in range(micro)]

            def local(per_token, parts=parts):  # each micro-batch reduced on its own, weighted by its share
                return sum(rl_lab.reduce_token_loss(per_token[part], mask[part], reduction, 5) * (size / count)
                           for part in parts)

            error = (gradient(local) - full).norm().item() / full.norm().item()
            metrics[f"{reduction}_local_m{micro}"] = error
            if reduction == "token":
                def global_count(per_token, parts=parts):  # each micro-batch's sum over the global token count
                    return sum(torch.where(mask[part] > 0, per_token[part], torch.zeros_like(per_token[part])).sum()
                               / global_tokens for part in parts)

                metrics[f"token_global_m{micro}"] = (gradient(global_count) - full).norm().item() / full.norm().item()
    lengths = mask.sum(dim=1).double()
    metrics["length_spread"] = (lengths.max() - lengths.min()).item()
    return {"metrics": metrics, "curve": []}


EXPERIMENT_FILES = ("runs.csv", "curves.csv", "summary.csv", "summary.md", "settings.json", "figure.svg",
                    "gradient_weight_by_successes.csv")
# runners that train for `steps` iterations: --quick (and the tests) shorten them

# the transformer's runs: the SFT start is trained once (sft.py, cached in results-sft) and every run loads it
TRANSFORMER = {"policy": "transformer"}
TRANSFORMER_CURVE = ("success_probability", "test_success_probability", "entropy", "kl_reference",
                     "mean_correct_length", "mean_wrong_length")
TRANSFORMER_EVALUATION = ("pass@1", "pass@4", "pass@16", "pass@64", "entropy_per_token", "distinct_correct_per_prompt",
                          "mean_length_correct", "mean_length_wrong")
TRANSFORMER_QUICK = {"steps": 2, "sft_steps": 20, "sft_folder": os.path.join("results-sft", "quick"), "prompts": 4,
                     "group_size": 4, "eval_prompts": 2, "eval_samples": 0}


def run_transformer(seed, curve=TRANSFORMER_CURVE, **options):
    """One transformer run (online_tokens.train(policy="transformer", ...)): run_online's metrics and
    curve, the sampled evaluation of the test prompts before (the SFT start) and after training
    (test_pass@k_before / _after, entropy_per_token_..., distinct_correct_per_prompt_..., ...), the
    exact train and test success at the start, and the sampler/trainer mismatch averaged over iterations."""
    state = online_tokens.setup(seed=seed, **TRANSFORMER, **options)
    rows, report = online_tokens.run(state)
    metrics = online_metrics(rows)
    metrics.update({
        "initial_success_probability": rows[0]["success_probability"],
        "initial_test_success_probability": rows[0]["test_success_probability"],
        "final_test_success_probability": rows[-1]["test_success_probability"],
        "generalization_gap": rows[-1]["success_probability"] - rows[-1]["test_success_probability"],
        "initial_generalization_gap": rows[0]["success_probability"] - rows[0]["test_success_probability"],
        "mean_wrong_length_tail": _tail(rows, "mean_wrong_length"),
        "mean_correct_length_tail": _tail(rows, "mean_correct_length"),
    })
    for name in ("sampler_logp_diff_mean", "sampler_logp_diff_max", "sampler_kl"):
        metrics[name] = math.fsum(row[name] for row in rows[1:]) / (len(rows) - 1)
    metrics["first_batch_logp_diff_max"] = rows[1]["sampler_logp_diff_max"]
    evaluation = report.get("evaluation", {})
    for moment in ("before", "after"):  # every key in every run (None: not measured, e.g. k above the samples)
        for key in TRANSFORMER_EVALUATION:
            metrics[f"test_{key}_{moment}"] = evaluation.get(moment, {}).get(key)
    points = [{"step": row["step"], **{name: None if (index == 0 and name not in AT_START) or (
        name in ("mean_correct_length", "mean_wrong_length") and row[name] == 0) else row[name] for name in curve}}
        for index, row in enumerate(rows)]
    return {"metrics": metrics, "curve": points}


def _tail(rows, column):
    """The mean of a length column over the last LAST iterations that sampled such a response (None: none)."""
    values = [row[column] for row in rows[-LAST:] if row[column] > 0]
    return math.fsum(values) / len(values) if values else None


STEP_RUNNERS = ("run_online", "run_zero_variance", "run_std_scaling", "run_sampler_mismatch", "run_bandit",
                "run_reward_shift", "run_chain")
RUNNERS = {function.__name__: function for function in (
    run_transformer,
    run_online, run_zero_variance, run_std_scaling, run_sampler_mismatch, run_bandit, run_chain, run_reward_shift,
    run_kl_estimators, run_microbatch)}


# ---------------------------------------------------------------------------------------------
# The experiments
# ---------------------------------------------------------------------------------------------


@dataclass
class Experiment:
    """A named experiment: its claim and source, the runs it needs per seed, and its claims as checks.

    configurations: [(label dict, runner name, options dict)], every one run on the same seeds (so two
    configurations compare seed by seed); claims: [Claim], whose value functions read one seed's
    {configuration name: metrics} (`configuration_name(label)`); seeds: how many the default run uses;
    quick: the options every run takes at --quick (None: QUICK_STEPS iterations for a training runner);
    cost: seconds per run on one core, roughly (the work's order and the ETA); figure: the panels that
    plot_results.py draws (see plot_results.experiment_figure)."""

    name: str
    summary: str
    source: str
    claim: str
    configurations: list
    metrics: list
    curves: tuple = ()
    tables: dict = field(default_factory=dict)
    figure: dict = field(default_factory=dict)
    claims: list = field(default_factory=list)
    seeds: int = DEFAULT_SEEDS
    quick: dict | None = None
    cost: float = 0.5


def configuration_name(label):
    """The name of a configuration in every file and claim: "key=value key=value" of its label."""
    return " ".join(f"{key}={value}" for key, value in label.items())


def at_quick_size(experiment):
    """A copy of `experiment` whose runs take its quick options (tests and --quick: the mechanism, not the
    effect): `experiment.quick`, or QUICK_STEPS iterations for the runners that train."""
    configurations = []
    for label, runner, options in experiment.configurations:
        quick = experiment.quick if experiment.quick is not None else (
            {"steps": QUICK_STEPS} if runner in STEP_RUNNERS else {})
        configurations.append((label, runner, {**options, **quick}))
    return replace(experiment, configurations=configurations)


def difference(metric, first, second):
    """A claim value: first's metric minus second's in one seed (None when either has none)."""
    def value(runs):
        a, b = runs[first][metric], runs[second][metric]
        return None if a is None or b is None else a - b
    return value


def _online(label, curve=(), **options):
    return (label, "run_online", {"curve": tuple(curve), **options})


ONLINE_CURVE = ("success_probability", "total_tokens_sampled")
C = configuration_name


def std_scaling_table():
    """The exact per-prompt weight of std scaling: for G = 8 binary rewards with k successes, the
    advantage of a success and of a failure, and the group's total |A| (the prompt's gradient weight)."""
    rows = []
    for successes in range(0, 9):
        rewards = torch.tensor([[1.0] * successes + [0.0] * (8 - successes)], dtype=DTYPE)
        row = {"successes_of_8": successes}
        for scale in ("group", "none"):
            advantages = rl_lab.group_advantages(rewards, scale=scale)[0]
            row[f"{scale}_success_advantage"] = advantages[0].item() if successes else 0.0
            row[f"{scale}_failure_advantage"] = advantages[-1].item() if successes < 8 else 0.0
            row[f"{scale}_total_weight"] = advantages.abs().sum().item()
        rows.append(row)
    return list(rows[0]), rows


def _kl_estimators():
    near, far = C({"distance": "near"}), C({"distance": "far"})
    both = (near, far)
    return Experiment(
        "kl-estimators", "k1/k2/k3: bias and spread of each value, and which KL each expected gradient follows",
        "Schulman, 'Approximating KL Divergence' (2020); Tang and Munos, arXiv 2506.09477; Shah et al., arXiv "
        "2512.21852; Zhang et al. (RPG), arXiv 2505.17508",
        "k1 and k3 are unbiased for KL(pi‖ref), k2 is not; as loss terms on one categorical draw from the current "
        "policy, E[grad k1] = 0, E[grad k2] = grad KL(pi‖ref), E[grad k3] = grad KL(ref‖pi). k3 spreads less "
        "than k1 near the reference only. Computed exactly by enumeration on 6-way categoricals, near (logits "
        "scaled 0.3) and far (1.5). These identities hold for one draw only: on a sequence, a per-token loss "
        "gives a partial gradient of the sequence KL (Tang and Munos' second pitfall).",
        [({"distance": distance}, "run_kl_estimators", {"distance": distance}) for distance in ("near", "far")],
        [f"{name}_{stat}" for name in ("k1", "k2", "k3") for stat in (
            "relative_bias", "relative_std", "grad_error_kl_pi_ref", "grad_error_kl_ref_pi")],
        claims=[
            Claim("k1 and k3 are unbiased for KL(pi‖ref): relative bias below 1e-12, near and far",
                  lambda runs: all(abs(runs[c][f"{k}_relative_bias"]) < 1e-12 for c in both for k in ("k1", "k3"))),
            Claim("k2 is biased: relative bias above 1e-3 in size, near and far",
                  lambda runs: all(abs(runs[c]["k2_relative_bias"]) > 1e-3 for c in both)),
            Claim("As loss terms: E[grad k1] = 0, E[grad k2] = grad KL(pi‖ref), E[grad k3] = grad KL(ref‖pi) "
                  "(relative errors below 1e-12), and E[grad k3] is not grad KL(pi‖ref) (above 1e-3), near and far",
                  lambda runs: all(runs[c]["k1_grad_norm_ratio"] < 1e-12 and runs[c]["k2_grad_error_kl_pi_ref"] < 1e-12
                                   and runs[c]["k3_grad_error_kl_ref_pi"] < 1e-12
                                   and runs[c]["k3_grad_error_kl_pi_ref"] > 1e-3 for c in both)),
            Claim("Near the reference, k3 spreads less than k1 (a smaller per-sample std)",
                  lambda runs: runs[near]["k3_relative_std"] < runs[near]["k1_relative_std"], at_least=0.8),
            Claim("Far from the reference, k3 still spreads less than k1",
                  lambda runs: runs[far]["k3_relative_std"] < runs[far]["k1_relative_std"], at_least=0.8,
                  note="The field often says that k3 has a lower variance than k1. k3 = exp(ref - logp) - (ref - logp) "
                       "- 1 grows exponentially on tokens the reference prefers by far, so far from the reference its "
                       "spread can exceed k1's: pick the estimator by the gradient you want, not by its spread."),
        ],
        figure={"panels": [
            {"kind": "values", "metrics": ["k1_relative_bias", "k2_relative_bias", "k3_relative_bias"],
             "title": "bias of the value, relative to KL(pi‖ref)", "ylabel": "(E[k] - KL) / KL"},
            {"kind": "values", "metrics": ["k1_relative_std", "k2_relative_std", "k3_relative_std"],
             "title": "per-sample std, relative to KL(pi‖ref)", "ylabel": "std(k) / KL"},
            {"kind": "values", "metrics": [f"{k}_grad_error_kl_pi_ref" for k in ("k1", "k2", "k3")],
             "title": "E[grad k] against grad KL(pi‖ref)", "ylabel": "relative error"},
            {"kind": "values", "metrics": [f"{k}_grad_error_kl_ref_pi" for k in ("k1", "k2", "k3")],
             "title": "E[grad k] against grad KL(ref‖pi)", "ylabel": "relative error"}]},
        cost=0.01,
    )


def _reduction_length_bias():
    sequence, token, constant = (C({"reduction": name}) for name in ("sequence", "token", "constant"))
    note = ("Not visible on the table policy: the sequence mean does give each token of a long wrong answer a "
            "smaller share of its negative advantage, but the table drops wrong answers within a few dozen "
            "iterations, before any length can grow, and the lengths left differ more between seeds than between "
            "reductions. The transformer experiment length-growth tests the claim where lengths can grow.")
    return Experiment(
        "reduction-length-bias", "sequence mean vs token mean vs constant: lengths of right and wrong answers",
        "Dr. GRPO, arXiv 2503.20783, sec. 3.1",
        "Dividing each response's loss by its own length lets long wrong answers lose less per token, so wrong "
        "answers grow longer under the per-sequence mean; the token mean and the constant do not favour length. "
        "Measured with --max-new-tokens 10 by the exact expected length of the policy's wrong answers (no "
        "sampling noise).",
        [_online({"reduction": reduction}, ("success_probability",), exact_curve=("wrong_length",),
                 reduction=reduction, max_new_tokens=10) for reduction in rl_lab.REDUCTIONS],
        ["exact_wrong_length", "mean_wrong_length", "mean_correct_length", "final_success_probability",
         "iterations_to_0.9"],
        ("exact_wrong_length", "success_probability"),
        claims=[
            Claim("Under the sequence mean, wrong answers are longer than under the token mean (their exact "
                  "expected length, last 10 iterations)",
                  difference("exact_wrong_length", sequence, token), "greater", 0.8, note=note),
            Claim("... and longer than under the constant (Dr. GRPO's fix)",
                  difference("exact_wrong_length", sequence, constant), "greater", 0.8),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["exact_wrong_length"], "title": "expected length of a wrong answer, exact",
             "ylabel": "tokens (EOS included)"},
            {"kind": "curves", "columns": ["success_probability"], "title": "exact success probability",
             "ylabel": "p(correct)"},
            {"kind": "claim", "claim": 0, "title": "sequence minus token mean: wrong-answer length per seed",
             "ylabel": "tokens"}]},
        cost=0.6,
    )


def _std_scaling():
    def name(scale, beta):
        return C({"scale_rewards": scale, "beta": beta})

    columns, rows = std_scaling_table()
    weight = {scale: rows[1][f"{scale}_total_weight"] / rows[4][f"{scale}_total_weight"] for scale in ("group", "none")}
    gap_on = difference("hard_success_final", name("group", 0.02), name("none", 0.02))
    gap_off = difference("hard_success_final", name("group", 0.0), name("none", 0.0))
    return Experiment(
        "std-scaling", "group vs batch vs no std, with and without the KL penalty: easy and hard prompts",
        "Dr. GRPO, arXiv 2503.20783, sec. 3.1 (question-level difficulty bias)",
        "Dividing by the group's std raises the total weight of a prompt whose group is nearly all right or all "
        "wrong relative to one near 50%, compared with no std; the prompt near 50% still weighs the most (exact "
        "table). In training, no std ends lower on the hard prompts (4 and 5, "
        "three-digit answers); the ablation without the KL penalty shows why: unscaled advantages are smaller, "
        "so the same KL penalty weighs more against them and holds the policy nearer the uniform reference.",
        [({"scale_rewards": scale, "beta": beta}, "run_std_scaling", {"scale_rewards": scale, "beta": beta})
         for beta in (0.02, 0.0) for scale in ("group", "batch", "none")],
        ["hard_success_final", "hard_success_step_10", "easy_success_step_10", "final_success_probability",
         "iterations_to_0.9"],
        ("hard_success", "easy_success"),
        {"gradient_weight_by_successes": (columns, rows)},
        claims=[
            Claim("With G = 8 the std flattens a prompt's total weight across difficulty: 1 success of 8 weighs "
                  f"{weight['group']:.3f} of 4 of 8 with the std, {weight['none']:.4f} without (exact)",
                  lambda _: weight["group"] > weight["none"], "exact"),
            Claim("With the KL penalty (beta 0.02), the group std ends higher on the hard prompts than no std",
                  gap_on, "greater", 0.8),
            Claim("The std's larger weight on rare successes speeds up the hard prompts early: hard-prompt success at "
                  "iteration 10, group minus none, above 0",
                  difference("hard_success_step_10", name("group", 0.02), name("none", 0.02)), "greater", 0.8,
                  note="The amplification is exact in the weights, yet the hard prompts do not learn faster with it "
                       "here: it is not what separates the two at the end."),
            Claim("With the KL penalty off, group and no std end within 0.01 of each other on the hard prompts",
                  gap_off, "within", margin=0.01),
            Claim("So the KL penalty makes the gap: (group - none) with beta 0.02 exceeds (group - none) with beta 0",
                  lambda runs: gap_on(runs) - gap_off(runs), "greater", 0.8),
        ],
        figure={"color_by": ["scale_rewards"], "panels": [
            {"kind": "curves", "columns": ["hard_success"], "where": {"beta": 0.02},
             "title": "hard prompts, KL penalty beta 0.02", "ylabel": "exact success (prompts 4, 5)"},
            {"kind": "curves", "columns": ["hard_success"], "where": {"beta": 0.0},
             "title": "hard prompts, KL penalty off", "ylabel": "exact success (prompts 4, 5)"},
            {"kind": "values", "metrics": ["hard_success_final"], "title": "hard prompts at the end",
             "ylabel": "exact success (prompts 4, 5)"}]},
        cost=0.6,
    )


def _zero_variance():
    static = [C({"group_size": size, "dynamic_sampling": False}) for size in (2, 4, 8, 16)]
    dynamic = C({"group_size": 8, "dynamic_sampling": True})
    return Experiment(
        "zero-variance", "share of groups whose rewards all tie, measured vs predicted; dynamic sampling",
        "DAPO, arXiv 2503.14476, sec. 3.2 (dynamic sampling, eq. 11)",
        "A group teaches nothing when its rewards tie; the share is predicted per prompt by sum_v q_v^G from the "
        "exact reward distribution of the policy that sampled it, and grows as G falls; dynamic sampling removes "
        "it at the price of extra samples. At a fixed 64 responses per iteration.",
        [({"group_size": size, "dynamic_sampling": False}, "run_zero_variance",
          {"group_size": size, "prompts": 64 // size}) for size in (2, 4, 8, 16)]
        + [({"group_size": 8, "dynamic_sampling": True}, "run_zero_variance",
            {"group_size": 8, "prompts": 8, "dynamic_sampling": True})],
        ["zero_group_fraction", "predicted_zero_group_fraction", "measured_minus_predicted",
         "measured_minus_predicted_z", "final_success_probability", "tokens_to_0.9", "responses_sampled"],
        ("zero_group_fraction", "predicted_zero_group_fraction", "success_probability"),
        claims=[
            Claim("The exact prediction matches the measured share up to sampling noise: the two differ by less "
                  "than 3 standard errors (exact, from the predicted probabilities) at every G",
                  lambda runs: all(abs(runs[c]["measured_minus_predicted_z"]) < 3 for c in static)),
            Claim("... without a bias: measured minus predicted, in standard errors and averaged over the four G, "
                  "lies within +-1", lambda runs: math.fsum(runs[c]["measured_minus_predicted_z"] for c in static)
                  / len(static), "within", margin=1.0,
                  note="A small positive mean difference in shares was once read as the measured share exceeding "
                       "the prediction; in units of its own sampling noise the difference is centred on 0."),
            Claim("The share of tied groups grows as G falls (G = 2 > 4 > 8 > 16)",
                  lambda runs: all(runs[a]["zero_group_fraction"] > runs[b]["zero_group_fraction"]
                                   for a, b in zip(static, static[1:]))),
            Claim("Dynamic sampling (G = 8) cuts the share of tied groups below half of static G = 8's",
                  lambda runs: runs[dynamic]["zero_group_fraction"] < 0.5 * runs[static[2]]["zero_group_fraction"]),
            Claim("... at the price of samples: it needs more sampled tokens to reach 0.9 than static G = 8",
                  difference("tokens_to_0.9", dynamic, static[2]), "greater", 0.8,
                  note="Here the groups tie mostly once the task is learned, so filtering them buys little per "
                       "sampled token."),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["zero_group_fraction", "predicted_zero_group_fraction"],
             "where": {"dynamic_sampling": False}, "title": "tied groups: measured (solid), predicted (dashed)",
             "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "zero_group_fraction", "where": {"dynamic_sampling": False},
             "title": "tied groups over the run, static sampling", "ylabel": "share of groups"},
            {"kind": "values", "metrics": ["measured_minus_predicted_z"], "where": {"dynamic_sampling": False},
             "title": "measured minus predicted, in standard errors", "ylabel": "z"},
            {"kind": "values", "metrics": ["tokens_to_0.9"], "title": "sampled tokens to exact success 0.9",
             "ylabel": "tokens"}]},
        cost=0.6,
    )


def _clip_higher():
    losses = [({"loss": "grpo", "epsilon_high": 0.2}, {}), ({"loss": "grpo", "epsilon_high": 0.28}, {"epsilon_high": 0.28}),
              ({"loss": "cispo", "epsilon_high": 5.0}, {"algorithm": "cispo"})]
    curve = ("entropy", "success_probability")

    def name(label, updates):
        return C({**label, "updates_per_batch": updates})

    at = {updates: [name(label, updates) for label, _ in losses] for updates in (8, 2)}
    return Experiment(
        "clip-higher", "eps_high 0.2 vs 0.28 (and CISPO) at 8 and 2 updates per batch: entropy, stuck prompts",
        "DAPO, arXiv 2503.14476, sec. 3.1 (clip-higher)",
        "A symmetric clip stops low-probability tokens with A > 0 early, so entropy collapses; raising the upper "
        "bound keeps exploring. On the table policy the entropy difference is not visible; what 8 updates per "
        "batch do show is a prompt that collapses onto a partial-credit answer (a truncated response that starts "
        "right, reward 0.25): its groups then tie and it never learns the answer. With 2 updates it does not "
        "happen, and raising eps_high does not prevent it.",
        [_online({**label, "updates_per_batch": updates}, curve, updates_per_batch=updates, **options)
         for updates in (8, 2) for label, options in losses],
        ["partial_stuck_prompts", "final_success_probability", "worst_prompt_success", "entropy_last",
         "clip_fraction", "iterations_to_0.9"],
        curve,
        claims=[
            Claim("Raising eps_high from 0.2 to 0.28 (8 updates per batch) ends with a higher entropy",
                  difference("entropy_last", at[8][1], at[8][0]), "greater", 0.8,
                  note="Not visible on the table policy, whose task has one right answer per prompt: collapsing onto "
                       "it is the goal. The transformer experiment clip-higher-entropy tests it."),
            Claim("At 8 updates per batch, some runs end with a prompt stuck on a partial-credit answer (success "
                  "below 0.5, partial credit above 0.5), whatever the loss",
                  lambda runs: any(runs[c]["partial_stuck_prompts"] > 0 for c in at[8]), at_least=0.0,
                  note="How often, per loss: the mean of partial_stuck_prompts in the table. Its groups all score "
                       "0.25, tie and teach nothing: a collapse onto the wrong mode, not a lack of exploration."),
            Claim("At 2 updates per batch no prompt ends stuck, for any of the three losses",
                  lambda runs: all(runs[c]["stuck_prompts"] == 0 for c in at[2])),
            Claim("Raising eps_high to 0.28 prevents it: no stuck prompt at eps_high 0.28 and 8 updates",
                  lambda runs: runs[at[8][1]]["stuck_prompts"] == 0,
                  note="Clip-higher is the field's remedy for entropy collapse; against this collapse it does not "
                       "help: the fewer updates per batch do."),
        ],
        figure={"color_by": ["loss", "epsilon_high"], "panels": [
            {"kind": "values", "metrics": ["partial_stuck_prompts"], "title": "prompts stuck on a partial-credit answer",
             "ylabel": "prompts per run (of 6)"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["entropy_last"], "title": "entropy, last 10 iterations",
             "ylabel": "nats per token"},
            {"kind": "curves", "columns": ["entropy"], "where": {"updates_per_batch": 8},
             "title": "entropy at 8 updates per batch", "ylabel": "nats per token", "log": True}]},
        seeds=10,
        cost=0.6,
    )


def _updates_per_batch():
    algorithms, counts = ("grpo", "cispo", "gspo"), (1, 2, 4, 8)

    def name(algorithm, updates):
        return C({"algorithm": algorithm, "updates_per_batch": updates})

    def falls(algorithm):
        return Claim(f"{algorithm.upper()}: the final success at 8 updates per batch is below that at 1",
                     difference("final_success_probability", name(algorithm, 1), name(algorithm, 8)),
                     "greater", 0.8)

    return Experiment(
        "updates-per-batch", "1, 2, 4, 8 Adam steps per batch for GRPO, CISPO, GSPO: the off-policy cost",
        "PPO, arXiv 1707.06347 (epochs per batch)",
        "Reusing a batch for more steps moves the policy further from the one that sampled it: the clip binds "
        "more and the final success falls, while the first iterations learn faster.",
        [_online({"algorithm": algorithm, "updates_per_batch": updates}, ("success_probability",),
                 algorithm=algorithm, updates_per_batch=updates)
         for algorithm in algorithms for updates in counts],
        ["final_success_probability", "iterations_to_0.9", "clip_fraction", "stuck_prompts"],
        ("success_probability",),
        claims=[
            Claim("The clip binds more with more updates per batch (clip_fraction at 1 < 2 < 4 < 8), for GRPO and "
                  "GSPO",
                  lambda runs: all(runs[name(a, u)]["clip_fraction"] < runs[name(a, v)]["clip_fraction"]
                                   for a in ("grpo", "gspo") for u, v in zip(counts, counts[1:])),
                  note="CISPO caps the weight instead of zeroing the gradient: its clip_fraction is 0 by definition."),
            falls("grpo"), falls("cispo"), falls("gspo"),
            Claim("GRPO reaches exact success 0.9 in fewer iterations at 8 updates per batch than at 1",
                  difference("iterations_to_0.9", name("grpo", 1), name("grpo", 8)), "greater", 0.8),
        ],
        figure={"color_by": ["algorithm"], "panels": [
            {"kind": "sweep", "x": "updates_per_batch", "metric": "final_success_probability",
             "title": "final exact success", "ylabel": "p(correct)"},
            {"kind": "sweep", "x": "updates_per_batch", "metric": "clip_fraction",
             "title": "share of clipped tokens (mean over the run)", "ylabel": "clip_fraction"},
            {"kind": "sweep", "x": "updates_per_batch", "metric": "iterations_to_0.9",
             "title": "iterations to exact success 0.9", "ylabel": "iterations"}]},
        cost=0.4,
    )


def _sampler_mismatch():
    samplers = (("same", {}), ("temperature 1.5", {"rollout_temperature": 1.5}), ("top-p 0.8", {"rollout_top_p": 0.8}))
    configurations = []
    for beta in (0.02, 0.0):
        for sampler, options in samplers:
            if beta == 0.0 and sampler != "temperature 1.5":
                continue  # the ablation needs only the sampler whose TIS loss it explains
            for tis in ((False,) if sampler == "same" else (False, True)):
                label = {"sampler": sampler, "tis": tis, "beta": beta}
                configurations.append((label, "run_sampler_mismatch",
                                       {**options, **({"tis_cap": 2.0} if tis else {}), "beta": beta}))

    def name(sampler, tis, beta=0.02):
        return C({"sampler": sampler, "tis": tis, "beta": beta})

    hot, hot_tis = name("temperature 1.5", False), name("temperature 1.5", True)
    top = name("top-p 0.8", False)
    loss_on = difference("final_success_probability", hot, hot_tis)
    loss_off = difference("final_success_probability", name("temperature 1.5", False, 0.0),
                          name("temperature 1.5", True, 0.0))
    return Experiment(
        "sampler-mismatch", "sample at another temperature or top-p than the trainer scores: gradient bias and TIS",
        "Yao et al. 2025 (truncated importance sampling for rollout/trainer mismatch); IMPALA, arXiv 1802.01561",
        "Tokens drawn from another distribution bias the gradient; weights min(p_trainer/p_sampler, cap) remove "
        "most of the bias where the sampler covers the trainer's support. Top-p removes tokens the trainer still "
        "gives probability: no weight can bring them back. The bias is measured directly: the exact expected "
        "gradient under the sampler, against the exact gradient, every response enumerated. Yet with the KL "
        "penalty on, TIS lowers the final success: TIS reweights the policy term but not the KL term, sampled "
        "from the same mismatched tokens; the ablation with the KL penalty off removes most of that loss.",
        configurations,
        ["final_success_probability", "gradient_bias", "gradient_bias_tis", "kl_reference", "iterations_to_0.9"],
        ("success_probability", "gradient_bias", "gradient_bias_tis"),
        claims=[
            Claim("The measurement: with the sampler equal to the trainer, the expected estimate is the exact "
                  "gradient (relative error below 1e-12)",
                  lambda runs: runs[name("same", False)]["gradient_bias"] < 1e-12),
            Claim("Sampling at temperature 1.5 biases the expected policy gradient (relative error above 0.5) and "
                  "TIS with cap 2 removes most of it (below a fifth of the error without)",
                  lambda runs: runs[hot]["gradient_bias"] > 0.5 and runs[hot]["gradient_bias_tis"]
                  < 0.2 * runs[hot]["gradient_bias"]),
            Claim("Top-p 0.8 biases it too (above 0.5), and TIS cannot remove it (with TIS above 0.9 of the error "
                  "without): the tokens outside the nucleus are never drawn",
                  lambda runs: runs[top]["gradient_bias"] > 0.5 and runs[top]["gradient_bias_tis"]
                  > 0.9 * runs[top]["gradient_bias"]),
            Claim("With the KL penalty on (beta 0.02), TIS lowers the final success at temperature 1.5",
                  loss_on, "greater", 0.8,
                  note="A correction of the gradient that costs final success: the k3 term keeps its uncorrected "
                       "weights while the policy term is reweighted, so the two no longer balance where they did "
                       "on-policy."),
            Claim("With the KL penalty off, TIS and no TIS end within 0.01 of each other at temperature 1.5",
                  loss_off, "within", margin=0.01),
            Claim("So the KL term makes the loss: (no TIS - TIS) with beta 0.02 exceeds it with beta 0",
                  lambda runs: loss_on(runs) - loss_off(runs), "greater", 0.8),
        ],
        figure={"color_by": ["sampler"], "panels": [
            {"kind": "values", "metrics": ["gradient_bias", "gradient_bias_tis"], "where": {"beta": 0.02, "tis": False},
             "title": "expected-gradient bias without / with TIS", "ylabel": "‖E[g] - grad J‖ / ‖grad J‖"},
            {"kind": "curves", "columns": ["success_probability"],
             "where": {"beta": 0.02, "sampler": ["same", "temperature 1.5"]},
             "title": "temperature 1.5, KL penalty beta 0.02", "ylabel": "exact success"},
            {"kind": "curves", "columns": ["success_probability"], "where": {"sampler": ["same", "top-p 0.8"]},
             "title": "top-p 0.8, without and with TIS (dashed)", "ylabel": "exact success"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"}]},
        cost=0.8,
    )


def _microbatch():
    every = (1, 2, 4)
    return Experiment(
        "microbatch", "one batch in 1, 2, 4 micro-batches: accumulated gradient vs the full batch, per reduction",
        "verl issue 5625 (token-mean normalized per micro-batch under gradient accumulation)",
        "With the token mean, normalizing each micro-batch by its own token count gives a different gradient than "
        "the full batch; normalizing by the global token count (or using the sequence mean or a constant) gives "
        "the same gradient exactly.",
        [({"batch": "seed"}, "run_microbatch", {})],
        [f"{reduction}_local_m{micro}" for reduction in rl_lab.REDUCTIONS for micro in every]
        + [f"token_global_m{micro}" for micro in every] + ["length_spread"],
        claims=[
            Claim("The token mean normalized per micro-batch gives another gradient than the full batch (relative "
                  "error above 1e-3) at 2 and 4 micro-batches",
                  lambda runs: all(runs["batch=seed"][f"token_local_m{micro}"] > 1e-3 for micro in (2, 4))),
            Claim("The token mean over the global token count, the sequence mean and the constant give the full "
                  "batch's gradient (relative error below 1e-12) at 1, 2 and 4 micro-batches",
                  lambda runs: all(runs["batch=seed"][f"{name}_m{micro}"] < 1e-12 for micro in every
                                   for name in ("token_global", "sequence_local", "constant_local"))),
        ],
        figure={"panels": [
            {"kind": "values", "metrics": [f"token_local_m{micro}" for micro in every],
             "title": "token mean, each micro-batch by its own count", "ylabel": "relative gradient error"},
            {"kind": "values", "metrics": [f"{name}_m4" for name in ("token_global", "sequence_local", "constant_local")],
             "title": "4 micro-batches: global count, sequence mean, constant", "ylabel": "relative gradient error",
             "same_y_as": 0}]},
        cost=0.1,
    )


def _grpo2_vs_dpo():
    labels = [({"algorithm": "grpo", "group_size": 2, "kl_penalty": "beta 0.02"}, {"group_size": 2, "prompts": 32}),
              ({"algorithm": "dpo", "group_size": 2, "kl_penalty": "implicit"},
               {"algorithm": "dpo", "group_size": 2, "prompts": 32}),
              ({"algorithm": "grpo", "group_size": 8, "kl_penalty": "beta 0.02"}, {"group_size": 8, "prompts": 8}),
              ({"algorithm": "grpo", "group_size": 2, "kl_penalty": "off"},
               {"group_size": 2, "prompts": 32, "beta": 0.0})]
    grpo2, dpo2, grpo8, grpo2_off = (C(label) for label, _ in labels)
    return Experiment(
        "grpo2-vs-dpo", "GRPO with G = 2 against online DPO at the same samples, with GRPO's KL penalty on and off",
        "It Takes Two: Your GRPO Is Secretly DPO, arXiv 2510.00977",
        "With two samples per prompt, GRPO's advantages are +-1 on pairs with different rewards: a contrastive "
        "update like DPO's. They end apart only through GRPO's explicit KL penalty: with it off, the two end "
        "alike. Whether either needs more samples than G = 8 depends on the seeds.",
        [_online(label, ONLINE_CURVE, **options) for label, options in labels],
        ["final_success_probability", "tokens_to_0.9", "iterations_to_0.9", "kl_reference", "responses_sampled"],
        ("success_probability",),
        claims=[
            Claim("With its KL penalty (beta 0.02), GRPO with G = 2 ends below online DPO",
                  difference("final_success_probability", dpo2, grpo2), "greater", 0.8),
            Claim("With GRPO's KL penalty off, GRPO with G = 2 and online DPO end within 0.01 of each other",
                  difference("final_success_probability", dpo2, grpo2_off), "within", margin=0.01),
            Claim("GRPO with G = 2 needs more sampled tokens to reach 0.9 than GRPO with G = 8",
                  difference("tokens_to_0.9", grpo2, grpo8), "greater", 0.8,
                  note="The paper's claim is the equivalence of the updates, not a sample cost; this is the atlas's "
                       "first edition's reading, kept so that its verdict on other seeds can be compared."),
            Claim("Online DPO (G = 2) needs more sampled tokens to reach 0.9 than GRPO with G = 8",
                  difference("tokens_to_0.9", dpo2, grpo8), "greater", 0.8),
        ],
        figure={"color_by": ["algorithm", "group_size"], "panels": [
            {"kind": "curves", "columns": ["success_probability"], "x": "total_tokens_sampled",
             "title": "exact success against sampled tokens", "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["tokens_to_0.9"], "title": "sampled tokens to exact success 0.9",
             "ylabel": "tokens"}]},
        cost=0.4,
    )


def _four_algorithms():
    # what still moves a prompt whose sampled answers all score alike, by algorithm
    tied = {"ppo": "its advantages are the critic's error alone (reward minus value), so only the critic's error "
                   "and the KL in the reward move it",
            "dpo": "it yields no pair, so the loss has no term for it (DPO has no KL-penalty term): nothing moves it",
            "grpo": "its group-relative advantages are 0, so only the KL penalty moves it",
            "cispo": "its group-relative advantages are 0, so only the KL penalty moves it"}

    def reaches(algorithm):
        configuration = C({"algorithm": algorithm})
        return Claim(f"{algorithm.upper()} reaches exact success 0.9",
                     lambda runs: runs[configuration]["iterations_to_0.9"] is not None,
                     note="A run that never reaches 0.9 ends with one prompt stuck near 0 success (stuck_prompts): "
                          f"its sampled answers all score alike; {tied[algorithm]}. The share, with its interval, "
                          "is how often over these seeds; a rare failure can be absent from one set of 20 seeds "
                          "and present in the next.")

    return Experiment(
        "four-algorithms", "PPO, DPO, GRPO, CISPO on the token task at one budget (B*G responses per iteration)",
        "the article this lab accompanies; InstructGPT, arXiv 2203.02155; DPO, arXiv 2305.18290",
        "At the same responses per iteration the four learn the task in most seeds; PPO's critic gives per-token "
        "credit, DPO uses only the best and worst response per prompt. A few seeds end stuck below 0.9, one "
        "prompt never answered right, PPO the most often; the counts over 20 seeds say how often.",
        [_online({"algorithm": algorithm}, ONLINE_CURVE, algorithm=algorithm)
         for algorithm in online_tokens.FOUR_ALGORITHMS],
        ["final_success_probability", "iterations_to_0.9", "tokens_to_0.9", "stuck_prompts", "kl_reference",
         "mean_correct_length", "mean_wrong_length"],
        ("success_probability",),
        claims=[reaches(algorithm) for algorithm in online_tokens.FOUR_ALGORITHMS],
        figure={"color_by": ["algorithm"], "panels": [
            {"kind": "curves", "columns": ["success_probability"], "x": "total_tokens_sampled",
             "title": "exact success against sampled tokens", "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["tokens_to_0.9"], "title": "sampled tokens to exact success 0.9",
             "ylabel": "tokens"},
            {"kind": "values", "metrics": ["kl_reference"], "title": "KL to the reference at the end",
             "ylabel": "nats per response"}]},
        seeds=20,
        cost=0.4,
    )


def _dpo_label_flips():
    flips = (0, 3, 6, 12)
    names = {count: C({"preference_flips": count}) for count in flips}
    start = 0.7 / 3  # the uniform policy's expected reward: mean of the table, (1.0 + 0.2 - 0.5) / 3
    return Experiment(
        "dpo-label-flips", "bandit DPO with 0, 3, 6, 12 of its 12 labels reversed",
        "the article, sec. 10.3",
        "The training loss falls whatever the labels say; the loss on the true labels rises with the flips. With "
        "3 of 12 reversed the true reward still rises from its start, less than with clean labels; with all 12 "
        "reversed it falls toward the worst possible: the optimizer solves the task it was given.",
        [({"preference_flips": count}, "run_bandit", {"algorithm": "dpo", "preference_flips": count}) for count in flips],
        ["final_expected_reward", "dpo_training_loss", "dpo_clean_loss"],
        ("expected_reward",),
        claims=[
            Claim("The training loss ends below ln 2 (its start) at every flip count",
                  lambda runs: all(runs[names[count]]["dpo_training_loss"] < math.log(2) for count in flips)),
            Claim("The loss on the true labels rises with the flips (0 < 3 < 6 < 12)",
                  lambda runs: all(runs[names[a]]["dpo_clean_loss"] < runs[names[b]]["dpo_clean_loss"]
                                   for a, b in zip(flips, flips[1:]))),
            Claim("With 3 of 12 labels reversed the true reward still rises above its start (0.2333)",
                  lambda runs: runs[names[3]]["final_expected_reward"] > start),
            Claim("... but ends below the clean labels' reward",
                  lambda runs: runs[names[3]]["final_expected_reward"] < runs[names[0]]["final_expected_reward"]),
            Claim("With all 12 reversed the true reward falls below -0.4 (the worst possible is -0.5)",
                  lambda runs: runs[names[12]]["final_expected_reward"] < -0.4),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["expected_reward"], "title": "true expected reward (exact)",
             "ylabel": "expected reward"},
            {"kind": "sweep", "x": "preference_flips", "metric": "final_expected_reward",
             "title": "final true reward", "ylabel": "expected reward"},
            {"kind": "sweep", "x": "preference_flips", "metric": "dpo_training_loss",
             "title": "final loss on the labels trained on", "ylabel": "DPO loss"},
            {"kind": "sweep", "x": "preference_flips", "metric": "dpo_clean_loss",
             "title": "final loss on the true labels", "ylabel": "DPO loss"}]},
        cost=0.15,
    )


def _group_size():
    sizes = (2, 4, 8, 16)
    names = [C({"group_size": size}) for size in sizes]
    return Experiment(
        "group-size", "bandit GRPO, G = 2, 4, 8, 16 at 128 actions per iteration",
        "the article, sec. 10.3",
        "At a fixed action budget, larger groups mean fewer prompts per batch; most groups tie once the policy is "
        "good, fewer the larger G, yet all reach the optimum.",
        [({"group_size": size}, "run_bandit", {"algorithm": "grpo", "group_size": size, "grpo_prompts": 128 // size,
                                               "curve": ("best_action_probability", "zero_group_fraction")})
         for size in sizes],
        ["zero_group_fraction", "actions_to_0.9", "final_expected_reward"],
        ("zero_group_fraction", "best_action_probability"),
        claims=[
            Claim("Every G reaches best-action probability 0.9",
                  lambda runs: all(runs[c]["actions_to_0.9"] is not None for c in names)),
            Claim("Most groups tie over the run (zero_group_fraction above 0.5) at every G",
                  lambda runs: all(runs[c]["zero_group_fraction"] > 0.5 for c in names)),
            Claim("The share of tied groups falls as G grows (G = 2 > 4 > 8 > 16)",
                  lambda runs: all(runs[a]["zero_group_fraction"] > runs[b]["zero_group_fraction"]
                                   for a, b in zip(names, names[1:]))),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["zero_group_fraction"], "max_step": 40,
             "title": "share of tied groups per batch, first 40 iterations", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "zero_group_fraction",
             "title": "tied groups, mean over the run", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "actions_to_0.9",
             "title": "sampled actions to best-action probability 0.9", "ylabel": "actions"}]},
        cost=0.35,
    )


def _chain_lambda():
    names = {value: C({"gae_lambda": value}) for value in (0.0, 0.95, 1.0)}
    return Experiment(
        "chain-lambda", "two-step chain PPO with GAE lambda 0, 0.95, 1",
        "GAE, arXiv 1506.02438; the chain page's GAE trace (docs/chain.md)",
        "lambda trades bias for variance; lambda 0 still learns a delayed reward through the critic's bootstrap, "
        "only slower at the start, and catches up.",
        [({"gae_lambda": value}, "run_chain", {"gae_lambda": value}) for value in (0.0, 0.95, 1.0)],
        ["expected_return_step_1", "expected_return_step_5", "expected_return_step_10", "final_expected_return"],
        ("expected_return",),
        claims=[
            Claim("lambda 0 starts slower: J at step 5 is below lambda 0.95's",
                  difference("expected_return_step_5", names[0.95], names[0.0]), "greater", 0.8),
            Claim("lambda 0 still learns the delayed reward: final J above 0.99",
                  lambda runs: runs[names[0.0]]["final_expected_return"] > 0.99),
            Claim("... and catches up: final J within 0.005 of lambda 0.95's",
                  difference("final_expected_return", names[0.95], names[0.0]), "within", margin=0.005),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["expected_return"], "max_step": 20,
             "title": "exact expected return, first 20 steps", "ylabel": "J"},
            {"kind": "values", "metrics": ["expected_return_step_1", "expected_return_step_5", "expected_return_step_10"],
             "title": "J at steps 1, 5, 10", "ylabel": "J"}]},
        cost=0.35,
    )


def _reward_shift():
    names = {(algorithm, shift): C({"algorithm": algorithm, "shift": shift})
             for algorithm in ("grpo", "ppo") for shift in (0.0, 5.0)}
    return Experiment(
        "reward-shift", "bandit rewards plus a constant: GRPO's advantages do not move, PPO's critic relearns",
        "the article, sec. 10.3",
        "A group-relative advantage subtracts the group mean, so a constant shift changes nothing; PPO's critic "
        "starts at 0 and must first learn the shift, and until then every sampled action looks good.",
        [({"algorithm": algorithm, "shift": shift}, "run_reward_shift",
          {"algorithm": algorithm, "shift": shift, "steps": 40})
         for algorithm in ("grpo", "ppo") for shift in (0.0, 5.0)],
        ["best_action_probability_step_5", "best_action_probability_step_10", "steps_to_0.9", "advantage_change"],
        ("best_action_probability",),
        claims=[
            Claim("GRPO's first-batch advantages do not move with a shift of 5 (by less than 1e-12)",
                  lambda runs: runs[names["grpo", 5.0]]["advantage_change"] < 1e-12),
            Claim("... so its run is the unshifted run: best-action probability at step 10 equal within 1e-9",
                  lambda runs: abs(runs[names["grpo", 5.0]]["best_action_probability_step_10"]
                                                 - runs[names["grpo", 0.0]]["best_action_probability_step_10"]) < 1e-9),
            Claim("PPO's first-batch advantages move by the whole shift (5, within 1e-12)",
                  lambda runs: abs(runs[names["ppo", 5.0]]["advantage_change"] - 5.0) < 1e-12),
            Claim("... and PPO learns slower with the shift: best-action probability at step 5 lower",
                  difference("best_action_probability_step_5", names["ppo", 0.0], names["ppo", 5.0]),
                  "greater", 0.8),
        ],
        figure={"color_by": ["algorithm"], "panels": [
            {"kind": "curves", "columns": ["best_action_probability"], "where": {"algorithm": "grpo"},
             "title": "GRPO: shift 0 and 5 (the same run)", "ylabel": "best-action probability"},
            {"kind": "curves", "columns": ["best_action_probability"], "where": {"algorithm": "ppo"},
             "title": "PPO: shift 0 and 5", "ylabel": "best-action probability"},
            {"kind": "values", "metrics": ["advantage_change"], "title": "first batch: change of the advantages",
             "ylabel": "max |A(R + 5) - A(R)|"}]},
        cost=0.15,
    )


def _sparse_reward():
    sizes = (2, 4, 8, 16)

    def name(rewards, size):
        return C({"rewards": rewards, "group_size": size})

    return Experiment(
        "sparse-reward", "bandit GRPO with sparse rewards (1 for the best action) vs dense, G at 128 actions per "
        "iteration", "the article, sec. 10.3",
        "With only one rewarded action, groups tie more often early (all failures); late, when the policy picks "
        "the best action every time, they tie whatever the other rewards are. Every G still learns, and on this "
        "bandit the sparse reward costs no more samples than the dense one.",
        [({"rewards": rewards, "group_size": size}, "run_bandit",
          {"algorithm": "grpo", "group_size": size, "grpo_prompts": 128 // size, "sparse_rewards": rewards == "sparse",
           "curve": ("best_action_probability", "zero_group_fraction")})
         for rewards in ("sparse", "dense") for size in sizes],
        ["zero_group_fraction", "actions_to_0.9", "final_best_action_probability"],
        ("zero_group_fraction", "best_action_probability"),
        claims=[
            Claim("With sparse rewards every G still reaches best-action probability 0.9",
                  lambda runs: all(runs[name("sparse", size)]["actions_to_0.9"] is not None for size in sizes)),
            Claim("At G = 2, sparse rewards tie more groups over the run than dense ones",
                  difference("zero_group_fraction", name("sparse", 2), name("dense", 2)), "greater", 0.8),
            Claim("At G = 16 too",
                  difference("zero_group_fraction", name("sparse", 16), name("dense", 16)), "greater", 0.8,
                  note="Most ties come once the policy is good, and those do not depend on the other actions' "
                       "rewards: a large group rarely ties early, dense or sparse."),
            Claim("Sparse rewards cost more sampled actions to reach 0.9 than dense ones at G = 8",
                  difference("actions_to_0.9", name("sparse", 8), name("dense", 8)), "greater", 0.8,
                  note="The field's intuition. On this bandit the best action's advantage is the largest in its "
                       "group either way, so the sparse table teaches the same thing."),
        ],
        figure={"color_by": ["rewards"], "panels": [
            {"kind": "curves", "columns": ["zero_group_fraction"], "where": {"group_size": 2}, "max_step": 40,
             "title": "tied groups per batch, G = 2, first 40 iterations", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "zero_group_fraction",
             "title": "tied groups, mean over the run", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "actions_to_0.9",
             "title": "sampled actions to best-action probability 0.9", "ylabel": "actions"}]},
        cost=0.35,
    )



# ---------------------------------------------------------------------------------------------
# The field's effects on the transformer policy (Countdown, from its SFT start)
# ---------------------------------------------------------------------------------------------


def _transformer(label, **options):
    return (label, "run_transformer", options)


def _before_after(metric):
    """A claim value: the test metric after training minus before (the SFT start) in one seed."""
    def value(runs, configuration):
        after, before = runs[configuration][f"test_{metric}_after"], runs[configuration][f"test_{metric}_before"]
        return None if after is None or before is None else after - before
    return value


def _negated(value):
    return None if value is None else -value


def _minus(first, second):
    return None if first is None or second is None else first - second


def _both_negative(first, second):
    return None if first is None or second is None else first < 0 and second < 0


def _passk_narrowing():
    default, strong = C({"beta": 0.02}), C({"beta": 0.2})
    change = {metric: _before_after(metric) for metric in ("pass@1", "pass@64", "entropy_per_token",
                                                          "distinct_correct_per_prompt")}
    return Experiment(
        "passk-narrowing", "transformer GRPO from its SFT start: pass@1 up, pass@k at large k down, diversity lost",
        "Yue et al., 'Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the Base "
        "Model?', arXiv 2504.13837",
        "RL sharpens the policy: pass@1 on test prompts rises while pass@64 falls below the SFT start, together "
        "with a fall of the entropy and of the number of distinct correct answers per prompt (measured in the "
        "same runs: a co-occurrence, not a shown cause). The ablation: a KL penalty ten times stronger holds the "
        "policy nearer its start and keeps more "
        "of pass@64.",
        [_transformer({"beta": beta}, beta=beta) for beta in (0.02, 0.2)],
        ["test_pass@1_before", "test_pass@1_after", "test_pass@64_before", "test_pass@64_after",
         "test_entropy_per_token_after", "test_distinct_correct_per_prompt_after", "kl_reference"],
        ("test_success_probability", "entropy"),
        claims=[
            Claim("RL raises pass@1 on the test prompts above the SFT start", lambda runs: change["pass@1"](runs, default),
                  "greater", 0.8),
            Claim("RL lowers pass@64 on the test prompts below the SFT start",
                  lambda runs: _negated(change["pass@64"](runs, default)), "greater", 0.8),
            Claim("Together with it, the entropy per sampled token and the distinct correct answers per test prompt "
                  "both fall", lambda runs: _both_negative(change["entropy_per_token"](runs, default),
                                                      change["distinct_correct_per_prompt"](runs, default))),
            Claim("The ablation: with beta 0.2 pass@64 falls less than with beta 0.02",
                  lambda runs: _minus(change["pass@64"](runs, strong), change["pass@64"](runs, default)), "greater", 0.8,
                  note="The KL penalty pulls the policy toward its SFT start, which keeps more of its diversity; "
                       "the price is a smaller gain in pass@1."),
        ],
        figure={"color_by": ["beta"], "panels": [
            {"kind": "values", "metrics": ["test_pass@1_before", "test_pass@1_after"], "title": "test pass@1, "
             "SFT start and after RL", "ylabel": "pass@1"},
            {"kind": "values", "metrics": ["test_pass@64_before", "test_pass@64_after"], "title": "test pass@64, "
             "SFT start and after RL", "ylabel": "pass@64"},
            {"kind": "curves", "columns": ["entropy"], "title": "entropy of the sampled tokens",
             "ylabel": "nats per token"},
            {"kind": "values", "metrics": ["test_distinct_correct_per_prompt_before",
                                           "test_distinct_correct_per_prompt_after"],
             "title": "distinct correct answers per test prompt, SFT start and after RL",
             "ylabel": "answers (of 64 samples)"}]},
        quick=TRANSFORMER_QUICK,
        cost=34.0,
    )


def _sft_vs_rl_generalization():
    run = C({"run": "default"})

    def gains(runs):
        metrics = runs[run]
        return (metrics["final_success_probability"] - metrics["initial_success_probability"],
                metrics["final_test_success_probability"] - metrics["initial_test_success_probability"])

    return Experiment(
        "sft-vs-rl-generalization", "transformer GRPO from its SFT start, RL only: exact success on train and on "
        "unseen test prompts",
        "Chu et al., 'SFT Memorizes, RL Generalizes', arXiv 2501.17161 (its RL side only: no SFT arm is run)",
        "The transformer shares its parameters across prompts: what RL teaches on the training prompts carries "
        "to prompts it never trained on, since Countdown's test prompts reuse the training prompts' arithmetic. "
        "The claims: the test success rises with the train success, by at least half as much; and a gap "
        "between the two opens as RL fits the training prompts.",
        [_transformer({"run": "default"}, eval_samples=0)],
        ["initial_success_probability", "final_success_probability", "initial_test_success_probability",
         "final_test_success_probability", "generalization_gap"],
        ("success_probability", "test_success_probability"),
        claims=[
            Claim("The exact success on unseen test prompts rises", lambda runs: gains(runs)[1], "greater", 0.8),
            Claim("It rises by at least half the gain on the training prompts",
                  lambda runs: gains(runs)[1] >= 0.5 * gains(runs)[0], at_least=0.8),
            Claim("A generalization gap opens: train minus test success is larger at the end than at the start",
                  lambda runs: runs[run]["generalization_gap"] - runs[run]["initial_generalization_gap"], "greater", 0.8),
        ],
        figure={"color_by": ["run"], "panels": [
            {"kind": "curves", "columns": ["success_probability"], "title": "exact success, train prompts",
             "ylabel": "p(correct)"},
            {"kind": "curves", "columns": ["test_success_probability"], "title": "exact success, test prompts",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["generalization_gap"], "title": "train minus test success at the end",
             "ylabel": "difference"}]},
        quick=TRANSFORMER_QUICK,
        cost=32.0,
    )


def _clip_higher_entropy():
    losses = ((({"loss": "grpo", "epsilon_high": 0.2}), {}), ({"loss": "grpo", "epsilon_high": 0.28},
              {"epsilon_high": 0.28}), ({"loss": "cispo", "epsilon_high": 5.0}, {"algorithm": "cispo"}))
    low, high, cispo = (C(label) for label, _ in losses)
    return Experiment(
        "clip-higher-entropy", "transformer: eps_high 0.2 vs 0.28 (and CISPO) at 4 updates per batch, entropy and pass@k",
        "DAPO, arXiv 2503.14476, sec. 3.1 (clip-higher); MiniMax-M1 (CISPO), arXiv 2506.13585",
        "DAPO's argument: a symmetric clip zeroes the gradient of a low-probability token with A > 0 once its "
        "ratio passes 1.2, so rare good tokens stop gaining and the entropy collapses; a higher upper bound "
        "(0.28) lets them grow, and CISPO zeroes no gradient at all. With 4 updates per batch the clip binds "
        "(the first claim checks it); whether the entropy and pass@16 follow on a model this small, over 5 "
        "seeds, is what the other claims test.",
        [_transformer(label, updates_per_batch=4, steps=60, eval_samples=32, **options) for label, options in losses],
        ["entropy_last", "clip_fraction", "final_test_success_probability", "test_pass@16_after",
         "test_distinct_correct_per_prompt_after"],
        ("entropy", "test_success_probability"),
        claims=[
            Claim("The mechanism is at work: the clip zeroes some gradients at eps_high 0.2 (mean clip fraction "
                  "above 0.005)", lambda runs: runs[low]["clip_fraction"] > 0.005),
            Claim("eps_high 0.28 ends with a higher entropy than 0.2", difference("entropy_last", high, low),
                  "greater", 0.8),
            Claim("eps_high 0.28 ends with a higher test pass@16 than 0.2",
                  difference("test_pass@16_after", high, low), "greater", 0.8),
            Claim("CISPO ends with a higher entropy than GRPO at eps_high 0.2", difference("entropy_last", cispo, low),
                  "greater", 0.8),
        ],
        figure={"color_by": ["loss", "epsilon_high"], "panels": [
            {"kind": "curves", "columns": ["entropy"], "title": "entropy of the sampled tokens",
             "ylabel": "nats per token"},
            {"kind": "values", "metrics": ["clip_fraction"], "title": "share of gradients the clip zeroes",
             "ylabel": "clip fraction"},
            {"kind": "values", "metrics": ["test_pass@16_after"], "title": "test pass@16 after RL", "ylabel": "pass@16"},
            {"kind": "curves", "columns": ["test_success_probability"], "title": "exact success, test prompts",
             "ylabel": "p(correct)"}]},
        quick=TRANSFORMER_QUICK,
        cost=22.0,
    )


def _length_growth():
    configurations = [({"reduction": reduction, "overlong": False}, {"reduction": reduction})
                      for reduction in rl_lab.REDUCTIONS] + [
        ({"reduction": "sequence", "overlong": True}, {"overlong_penalty": 2})]
    sequence, token, constant, shaped = (C(label) for label, _ in configurations)
    return Experiment(
        "length-growth", "transformer: length of wrong answers under sequence-mean, token-mean and constant reductions",
        "Dr. GRPO, arXiv 2503.20783, sec. 3.1 (length bias); DAPO, arXiv 2503.14476, sec. 3.4 (overlong shaping)",
        "Dividing each response's loss by its own length lets a long wrong answer lose less per token than a "
        "short one, so under the per-sequence mean wrong answers should grow longer than under the token mean "
        "or a constant; DAPO's soft overlong penalty pushes responses back under the cap.",
        [_transformer(label, steps=60, eval_samples=0, **options) for label, options in configurations],
        ["mean_wrong_length_tail", "mean_correct_length_tail", "final_test_success_probability"],
        ("mean_wrong_length", "mean_correct_length"),
        claims=[
            Claim("Wrong answers end longer under the sequence mean than under the token mean",
                  difference("mean_wrong_length_tail", sequence, token), "greater", 0.8),
            Claim("Wrong answers end longer under the sequence mean than under the constant",
                  difference("mean_wrong_length_tail", sequence, constant), "greater", 0.8),
            Claim("The overlong penalty (cache 2) shortens wrong answers under the sequence mean",
                  difference("mean_wrong_length_tail", sequence, shaped), "greater", 0.8),
        ],
        figure={"color_by": ["reduction", "overlong"], "panels": [
            {"kind": "curves", "columns": ["mean_wrong_length"], "title": "length of the wrong answers of each batch",
             "ylabel": "tokens (EOS included)"},
            {"kind": "values", "metrics": ["mean_wrong_length_tail"], "title": "wrong answers, last 10 iterations",
             "ylabel": "tokens"},
            {"kind": "values", "metrics": ["mean_correct_length_tail"], "title": "correct answers, last 10 iterations",
             "ylabel": "tokens"},
            {"kind": "values", "metrics": ["final_test_success_probability"], "title": "final exact test success",
             "ylabel": "p(correct)"}]},
        quick=TRANSFORMER_QUICK,
        cost=12.0,
    )


def _precision_mismatch():
    configurations = [({"sampler": "float32", "tis": False}, {}),
                      ({"sampler": "float16", "tis": False}, {"sampler_dtype": "float16"}),
                      ({"sampler": "bfloat16", "tis": False}, {"sampler_dtype": "bfloat16"}),
                      ({"sampler": "bfloat16", "tis": True}, {"sampler_dtype": "bfloat16", "tis_cap": 2.0})]
    fp32, fp16, bf16, bf16_tis = (C(label) for label, _ in configurations)
    return Experiment(
        "precision-mismatch", "transformer: a bfloat16 or float16 sampler against the float32 trainer, with TIS",
        "Yao et al. 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy RL Training'; IMPALA "
        "(truncated importance weights), arXiv 1802.01561",
        "An inference engine samples in a lower precision than the trainer scores in, so the two disagree on "
        "the log-prob of the very tokens drawn: bfloat16 (8-bit mantissa) far more than float16 (11-bit). The "
        "mismatch is measured token by token; the claims ask whether, at this size and learning rate, it changes "
        "what the run learns, and whether TIS does.",
        [_transformer(label, steps=60, eval_samples=0, **options) for label, options in configurations],
        ["sampler_logp_diff_mean", "sampler_logp_diff_max", "sampler_kl", "final_test_success_probability"],
        ("test_success_probability",),
        claims=[
            Claim("The mismatch orders by precision: bfloat16 > float16 > float32 in mean |log p_sampler - "
                  "log p_trainer| per token", lambda runs: runs[bf16]["sampler_logp_diff_mean"]
                  > runs[fp16]["sampler_logp_diff_mean"] > runs[fp32]["sampler_logp_diff_mean"]),
            Claim("A bfloat16 sampler ends within 0.05 of the float32 sampler's test success",
                  difference("final_test_success_probability", bf16, fp32), "within", margin=0.05),
            Claim("TIS (cap 2) on a bfloat16 sampler changes the final test success by less than 0.05",
                  difference("final_test_success_probability", bf16_tis, bf16), "within", margin=0.05),
        ],
        figure={"color_by": ["sampler", "tis"], "panels": [
            {"kind": "values", "metrics": ["sampler_logp_diff_mean"], "title": "mean |log p sampler - log p trainer|",
             "ylabel": "nats per token"},
            {"kind": "values", "metrics": ["sampler_logp_diff_max"], "title": "largest |log p sampler - log p "
             "trainer| of a batch", "ylabel": "nats"},
            {"kind": "curves", "columns": ["test_success_probability"], "title": "exact success, test prompts",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["final_test_success_probability"], "title": "final exact test success",
             "ylabel": "p(correct)"}]},
        quick=TRANSFORMER_QUICK,
        cost=14.0,
    )


def _kl_placement():
    configurations = [({"kl": "k3 in the loss", "beta": 0.02}, {}),
                      ({"kl": "k1 in the loss", "beta": 0.02}, {"kl_estimator": "k1"}),
                      ({"kl": "k1 in the reward", "beta": 0.02}, {"kl_in": "reward", "kl_estimator": "k1"}),
                      ({"kl": "none", "beta": 0.0}, {"beta": 0.0}),
                      ({"kl": "k3 in the loss", "beta": 0.2}, {"beta": 0.2})]
    k3, k1_loss, k1_reward, none, k3_strong = (C(label) for label, _ in configurations)
    return Experiment(
        "kl-placement", "transformer: the KL to the SFT start as k3 or k1 in the loss, k1 in the reward, or none",
        "Schulman, 'Approximating KL Divergence' (2020); Tang and Munos, arXiv 2506.09477; TRL's RLOO and verl's "
        "use_kl_in_reward (KL in the reward), GRPO's k3 in the loss (DeepSeekMath, arXiv 2402.03300); Shah et "
        "al., arXiv 2512.21852; Zhang et al. (RPG), arXiv 2505.17508",
        "Where the KL penalty goes decides how hard it pulls. As a loss term, k3's expected gradient pulls the "
        "policy toward the reference with weight beta per response (the sequence mean), while k1's expected "
        "gradient is near zero (exactly zero only on-policy with weights that do not depend on the length; the "
        "sequence mean's 1/|y| does). Per-token loss terms give a partial gradient of the sequence KL; the KL "
        "in the reward gives the exact one. Subtracted from the reward, beta times the KL summed over the "
        "response's tokens "
        "enters the advantages, which divide by the group's reward std: at the same beta it pulls several times "
        "harder. Measured as each run's KL to the reference at the end; the ablation raises the loss's beta "
        "tenfold.",
        [_transformer(label, steps=60, eval_samples=0, **options) for label, options in configurations],
        ["kl_reference", "final_test_success_probability", "entropy_last"],
        ("kl_reference",),
        claims=[
            Claim("k3 in the loss (beta 0.02) keeps the policy closer to the reference than no KL",
                  difference("kl_reference", none, k3), "greater", 0.8),
            Claim("k1 in the loss ends as far from the reference as no KL (within 0.3 nats)",
                  difference("kl_reference", k1_loss, none), "within", margin=0.3,
                  note="On one draw from the current policy E[grad k1] = 0; under the sequence mean the weight "
                       "1/|y| depends on the length, so it is near 0 rather than exactly 0, and mostly its noise "
                       "acts."),
            Claim("k1 in the reward (beta 0.02) keeps the policy closer to the reference than no KL",
                  difference("kl_reference", none, k1_reward), "greater", 0.8),
            Claim("The ablation: k3 in the loss at beta 0.2 keeps the policy closer to the reference than no KL",
                  difference("kl_reference", none, k3_strong), "greater", 0.8,
                  note="If it holds where beta 0.02 does not, the loss term's weight was too small to show, not "
                       "its direction wrong."),
        ],
        figure={"color_by": ["kl", "beta"], "panels": [
            {"kind": "curves", "columns": ["kl_reference"], "title": "KL(policy ‖ reference), estimated each batch",
             "ylabel": "nats per response"},
            {"kind": "values", "metrics": ["kl_reference"], "title": "KL to the reference at the end",
             "ylabel": "nats per response"},
            {"kind": "values", "metrics": ["final_test_success_probability"], "title": "final exact test success",
             "ylabel": "p(correct)"}]},
        quick=TRANSFORMER_QUICK,
        cost=12.0,
    )


def _padding_bug():
    right, bug = C({"position_ids": "mask"}), C({"position_ids": "arange"})
    return Experiment(
        "padding-bug", "transformer: position ids from the attention mask vs arange on left-padded prompts",
        "the article, sec. 7.2 (attention mask vs loss mask, left padding); Hugging Face transformers' "
        "position_ids from the attention mask in generation",
        "Left padding shifts a short prompt's tokens right; position ids computed from the attention mask "
        "(cumsum - 1) give its first real token position 0, as the sampler does, while arange 0..T-1 gives it "
        "position 1 or more. With arange the trainer scores the padded prompts' responses with other log-probs "
        "than the sampler drew them from: a sampler/trainer mismatch made by a bug. Countdown prompts differ in "
        "length by one token (a one- or two-digit target), so about a third of the prompts are padded.",
        [_transformer({"position_ids": value}, position_ids=value, steps=60, eval_samples=0) for value in ("mask", "arange")],
        ["first_batch_logp_diff_max", "sampler_logp_diff_mean", "final_test_success_probability", "kl_reference"],
        ("test_success_probability",),
        claims=[
            Claim("With mask positions the trainer scores the sampled tokens as the sampler drew them (largest "
                  "|difference| below 1e-4 in the first batch)", lambda runs: runs[right]["first_batch_logp_diff_max"]
                  < 1e-4),
            Claim("With arange positions it does not: the largest |difference| in the first batch exceeds 0.01 nats",
                  lambda runs: runs[bug]["first_batch_logp_diff_max"] > 0.01),
            Claim("The bug costs test success at the end", difference("final_test_success_probability", right, bug),
                  "greater", 0.8),
        ],
        figure={"color_by": ["position_ids"], "panels": [
            {"kind": "values", "metrics": ["first_batch_logp_diff_max"], "title": "largest |log p sampler - log p "
             "trainer|, first batch", "ylabel": "nats"},
            {"kind": "curves", "columns": ["test_success_probability"], "title": "exact success, test prompts",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["final_test_success_probability"], "title": "final exact test success",
             "ylabel": "p(correct)"}]},
        quick=TRANSFORMER_QUICK,
        cost=12.0,
    )


def experiments():
    """Every experiment of the atlas, by name."""
    found = [_kl_estimators(), _reduction_length_bias(), _std_scaling(), _zero_variance(), _clip_higher(),
             _updates_per_batch(), _sampler_mismatch(), _microbatch(), _grpo2_vs_dpo(), _four_algorithms(),
             _dpo_label_flips(), _group_size(), _chain_lambda(), _reward_shift(), _sparse_reward(),
             _passk_narrowing(), _sft_vs_rl_generalization(), _clip_higher_entropy(), _length_growth(),
             _precision_mismatch(), _kl_placement(), _padding_bug()]
    return {experiment.name: experiment for experiment in found}


# ---------------------------------------------------------------------------------------------
# Running and summarizing
# ---------------------------------------------------------------------------------------------


def _worker_signals():
    """A worker starts with the default action of every stop signal, unblocked: the handlers it inherits
    from the main process raise (they belong to the main process's clean-up), and a worker that cannot die
    by SIGTERM makes every early exit of the main process hang. A terminal's Ctrl-C or hang-up reaches the
    workers with the main process (one process group) and ends them at once; the main process stops the
    rest itself."""
    stop_signals = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    for signum in stop_signals:
        signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)


def _import_torch_lazy_modules():
    """Build and drop one optimizer: a process's first one imports torch._dynamo and sympy (1-2 s, several
    on a loaded machine), which would otherwise count as the run time of each process's first run."""
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])


def _run_job(job):
    """Worker entry: (experiment name, global index, label, seed, runner, options) -> (index, seconds, result);
    seconds: the run alone, the process's one-time imports excluded."""
    name, index, label, seed, runner, options = job
    _import_torch_lazy_modules()  # about a millisecond once they are imported
    started = time.perf_counter()
    with torch_threads(1):
        result = RUNNERS[runner](seed, **options)
    return index, time.perf_counter() - started, result


def _worker(connection, main_ends=()):
    """A worker process: run each job the main process sends, answer (True, result) or (False, the
    exception); stop at None, or when the main process is gone (its end of the pipe closed). `main_ends`:
    the main process's ends of the pipes, which a forked worker holds too and closes, or it would never
    see the main process's end closed."""
    for end in main_ends:
        end.close()
    _worker_signals()
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            answer = (True, _run_job(job))
        except Exception as error:  # raised again in the main process, which reports it in one line
            answer = (False, error)
        try:
            connection.send(answer)
        except (EOFError, OSError):
            return
        except Exception as error:  # an exception that cannot be pickled: its text
            connection.send((False, RuntimeError(f"{type(error).__name__}: {error}")))


def _worker_ended(process):
    """The exception for a worker that ended before answering: a stop signal is the run's own stop (a
    terminal's Ctrl-C reaches the workers too); anything else (SIGKILL from the out-of-memory killer) is an
    error naming how it ended."""
    process.join()
    signum = -process.exitcode if process.exitcode is not None and process.exitcode < 0 else None
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)):
        raise Terminated(signum)
    how = f"by {signal.Signals(signum).name}" if signum else f"with status {process.exitcode}"
    hint = " (the out-of-memory killer sends SIGKILL: try fewer --jobs)" if signum == getattr(signal, "SIGKILL", 0) else ""
    raise ChildProcessError(f"worker process {process.pid} ended {how} before its run finished{hint}")


def _hand_over(connection, job, process):
    """Send a job to a worker. A worker that died since its last answer shows as a broken pipe here:
    report how it ended, never a BrokenPipeError, which run_cli would take for a closed standard output."""
    try:
        connection.send(job)
    except OSError:
        _worker_ended(process)


def _results_from_workers(all_jobs, jobs_count):
    """Yield (index, seconds, result) of every job as `jobs_count` worker processes finish them. No pool
    threads: the main process hands each idle worker the next job and waits for any answer. However it
    ends (the last job, a stop signal, a failed write, a worker that died) it kills every worker and
    waits for it, so no worker outlives the run."""
    # fork where it exists: the workers inherit the imported modules instead of importing torch again
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    workers = {}  # the main process's end of each worker's pipe -> the worker process
    pending = list(reversed(all_jobs))
    try:
        for _ in range(min(jobs_count, len(all_jobs))):
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker, args=(theirs, [*workers, ours]), daemon=True)
            process.start()
            theirs.close()  # the worker's end lives in the worker only, so its death reads as end-of-file
            workers[ours] = process
        for connection in workers:
            _hand_over(connection, pending.pop(), workers[connection])
        busy = set(workers)
        while busy:
            for connection in multiprocessing.connection.wait(list(busy)):
                try:
                    finished, value = connection.recv()
                except (EOFError, OSError):
                    _worker_ended(workers[connection])
                if not finished:
                    raise value
                if pending:
                    _hand_over(connection, pending.pop(), workers[connection])
                else:
                    busy.discard(connection)
                yield value
    finally:
        with HeldSignals():  # a second Ctrl-C must not cut this short and leave a worker running
            for connection, process in workers.items():
                process.kill()  # SIGKILL: a worker holds nothing to clean up, and a stopped one dies too
                process.join()
                connection.close()



def seed_list(experiment, seeds=None, seed_start=0):
    """The seeds an experiment runs: seed_start .. seed_start + N - 1, N = `seeds` or the experiment's own."""
    return list(range(seed_start, seed_start + (experiment.seeds if seeds is None else seeds)))


def jobs_of(experiment, seeds):
    """Every run of an experiment over the list `seeds`, configuration-major then seed:
    (name, index, label, seed, runner, options)."""
    jobs = []
    for label, runner, options in experiment.configurations:
        for seed in seeds:
            jobs.append((experiment.name, len(jobs), label, seed, runner, options))
    return jobs


def results_by_seed(jobs, results):
    """{seed: {configuration name: metrics}}: what a claim reads, one seed at a time."""
    by_seed = {}
    for (_, _, label, seed, _, _), result in zip(jobs, results):
        by_seed.setdefault(seed, {})[configuration_name(label)] = result["metrics"]
    return by_seed


def _statistics(values):
    """mean, std over seeds (sample), min, max of the values that exist (None: none exists)."""
    if not values:
        return None, None, None, None
    return (math.fsum(values) / len(values), statistics.stdev(values) if len(values) > 1 else 0.0,
            min(values), max(values))


def summarize(experiment, jobs, results):
    """runs rows, curve rows and summary rows: per configuration, each metric's mean, std over seeds, min and
    max over the runs that have it, and for a target metric how many runs never reached it."""
    runs, curves, groups = [], [], {}
    label_keys = list(experiment.configurations[0][0])
    for (_, _, label, seed, _, _), result in zip(jobs, results):
        configuration = configuration_name(label)
        runs.append({"configuration": configuration, **label, "seed": seed, **result["metrics"]})
        for point in result["curve"]:
            curves.append({"configuration": configuration, "seed": seed, **point})
        groups.setdefault(configuration, (label, []))[1].append(result["metrics"])
    summary = []
    for configuration, (label, metrics_list) in groups.items():
        row = {"configuration": configuration, **label, "seeds": len(metrics_list)}
        for metric in experiment.metrics:
            values = [metrics[metric] for metrics in metrics_list if metrics[metric] is not None]
            for stat, value in zip(("mean", "std", "min", "max"), _statistics(values)):
                row[f"{metric}_{stat}"] = value
            if metric in TARGET_METRICS:
                row[f"{metric}_never"] = len(metrics_list) - len(values)
        summary.append(row)
    run_columns = ["configuration"] + label_keys + ["seed"] + list(results[0]["metrics"])
    curve_columns = list(curves[0]) if curves else []
    summary_columns = ["configuration"] + label_keys + ["seeds"] + [
        f"{metric}_{stat}" for metric in experiment.metrics
        for stat in ("mean", "std", "min", "max") + (("never",) if metric in TARGET_METRICS else ())]
    return (runs, run_columns), (curves, curve_columns), (summary, summary_columns)


def _number(value):
    """A table cell: integers as they are; floats with 4 decimals, 1 from 100 up, 2 significant digits in
    scientific notation below 0.001 (exact identities show as e-15 there, not as 0.0000); None as "-"."""
    if value is None:
        return "-"
    if not isinstance(value, float):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.4f}" if abs(value) >= 1e-3 else f"{value:.1e}"


def _signed(value):
    text = _number(value)
    return text if text.startswith("-") or text == "0" else "+" + text


def interval_text(verdict):
    """The numbers a verdict rests on, in words: a count's share and its Wilson interval, or a mean and
    its t-interval ("+0.0123 [+0.0040, +0.0206]")."""
    if verdict["test"] == "exact":
        return "exact"
    if verdict["mean"] is None:
        return "no seed has a value"
    if verdict["test"] == "count":
        text = f"share {verdict['mean']:.2f}"
        return text + (f" [{verdict['interval'][0]:.2f}, {verdict['interval'][1]:.2f}]" if verdict["interval"] else "")
    text = f"mean {_signed(verdict['mean'])}"
    if verdict["interval"] is None:
        return text + " (one seed: no interval)"
    return text + f" [{_signed(verdict['interval'][0])}, {_signed(verdict['interval'][1])}]"


def count_text(verdict):
    """"4 of 5 seeds" (above 0, or inside the margin; with the seeds left out: a target never reached),
    or "exact"."""
    if verdict["test"] == "exact":
        return "exact"
    where = {"greater": " above 0", "within": f" inside +-{verdict['margin']}"}.get(verdict["test"], "")
    text = verdict["count"] + where
    return text + (f" ({verdict['undefined']} left out: never reached)" if verdict["undefined"] else "")


def _cell(text):
    return str(text).replace("|", "\\|")  # a | inside a Markdown table cell


def _seed_range(seeds):
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def summary_markdown(experiment, seeds, summary_rows, verdicts):
    """The summary as Markdown: the claim, the verdict of each check, then one row per configuration with
    each metric as mean +- std [min, max] over the seeds that have it (and how many never reached the
    target), then the exact tables."""
    lines = [f"**{experiment.name}**: {experiment.summary}", "", experiment.claim, "",
             f"Source: {experiment.source}. Seeds {_seed_range(seeds)}, the same for every configuration "
             f"(paired); 95% intervals: Student's t for a mean, Wilson's for a share.", "",
             "| verdict | seeds | needs | claim | mean or share [95% interval] |", "|---|---|---|---|---|"]
    for verdict in verdicts:
        lines.append(f"| {verdict['verdict']} | {count_text(verdict)} | {verdict['needs']} | {_cell(verdict['claim'])} "
                     f"| {interval_text(verdict)} |")
    notes = [f"- {verdict['claim']}: {verdict['note']}" for verdict in verdicts if verdict["note"]]
    if notes:
        lines += [""] + notes
    header = ["configuration", "seeds"] + experiment.metrics
    lines += ["", "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in summary_rows:
        cells = [row["configuration"], str(row["seeds"])]
        for metric in experiment.metrics:
            never = row.get(f"{metric}_never", 0)
            if row[metric + "_mean"] is None:
                cells.append(f"never reached {TARGET} ({never} of {row['seeds']})")
                continue
            cell = (f"{_number(row[metric + '_mean'])} +- {_number(row[metric + '_std'])} "
                    f"[{_number(row[metric + '_min'])}, {_number(row[metric + '_max'])}]")
            cells.append(cell + (f"; {never} of {row['seeds']} never reached {TARGET}" if never else ""))
        lines.append("| " + " | ".join(cells) + " |")
    for table_name, (columns, rows) in experiment.tables.items():
        lines += ["", f"{table_name} (exact, no seeds):", "",
                  "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(_number(row[column]) for column in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def command_of(name, seeds=None, seed_start=0, quick=False):
    """The command that writes an experiment's folder with these flags."""
    return (f"python experiments.py {name}" + (f" --seeds {seeds}" if seeds is not None else "")
            + (f" --seed-start {seed_start}" if seed_start else "") + (" --quick" if quick else ""))


def experiment_files(experiment, seeds, jobs, results, folder, command=None):
    """{path: text} of one experiment's outputs over the list `seeds` (the figure is added by the caller)."""
    (runs, run_columns), (curves, curve_columns), (summary, summary_columns) = summarize(experiment, jobs, results)
    by_seed = results_by_seed(jobs, results)
    verdicts = [check_claim(claim, by_seed) for claim in experiment.claims]
    files = {
        os.path.join(folder, "runs.csv"): csv_text(runs, run_columns),
        os.path.join(folder, "summary.csv"): csv_text(summary, summary_columns),
        os.path.join(folder, "summary.md"): summary_markdown(experiment, seeds, summary, verdicts),
    }
    if curves:
        files[os.path.join(folder, "curves.csv")] = csv_text(curves, curve_columns)
    for table_name, (columns, rows) in experiment.tables.items():
        files[os.path.join(folder, f"{table_name}.csv")] = csv_text(rows, columns)
    files[os.path.join(folder, "settings.json")] = json_text({
        "experiment": experiment.name,
        "summary": experiment.summary,
        "source": experiment.source,
        "claim": experiment.claim,
        "claims": verdicts,
        "command": command or command_of(experiment.name),
        "seeds": list(seeds),
        "configurations": [{"label": label, "runner": runner, "options": {key: list(value) if isinstance(value, tuple)
                                                                           else value for key, value in options.items()}}
                           for label, runner, options in experiment.configurations],
        "metrics": experiment.metrics,
        "curves": list(experiment.curves),
        "figure": experiment.figure,
        "summary_statistics": ("mean, std (sample, over seeds), min and max of each metric per configuration, over "
                               "the runs that have it; a target metric's runs that never reached it are counted "
                               "('never') and left out of its statistics"),
        "verdicts": ("count: holds when at least the required seeds show the property; greater: holds when the "
                     "required seeds are above 0 and the 95% t-interval of the mean is above 0, does not hold when "
                     "both are true below 0, within noise otherwise; within: holds when the interval lies inside "
                     "+-margin, does not hold when it lies wholly outside"),
        "torch": torch.__version__,
    })
    return files


def atlas_rows(folder, names=None):
    """[(experiment, settings)] of the experiment folders under `folder` that hold a settings.json, in the
    atlas's order (`experiments()`), then any other in name order."""
    order = list(experiments()) if names is None else list(names)
    present = sorted(entry for entry in os.listdir(folder)
                     if os.path.isfile(os.path.join(folder, entry, "settings.json")))
    rows = []
    for name in [name for name in order if name in present] + [name for name in present if name not in order]:
        with open(os.path.join(folder, name, "settings.json"), encoding="utf-8") as handle:
            rows.append((name, json.load(handle)))
    return rows


def atlas_markdown(folder="results-experiments", held_out=()):
    """The atlas's verdicts as one Markdown table, rendered from the committed settings.json files (never
    typed by hand): experiment, claim, verdict with its count, and the mean or share with its 95%
    interval. held_out: more atlas folders (other seeds, e.g. --seed-start 100) whose verdicts on the same
    claims get a column each."""
    extra = [{(name, verdict["claim"]): verdict for name, settings in atlas_rows(other)
              for verdict in settings.get("claims", [])} for other in held_out]
    rows = atlas_rows(folder)
    header = ["experiment", "claim", "needs", _first_seed_title("verdict", rows), "mean or share [95% interval]"]
    header += [_first_seed_title("verdict", atlas_rows(other)) for other in held_out]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, settings in rows:
        for verdict in settings.get("claims", []):
            cells = [name, verdict["claim"], verdict.get("needs", ""), f"{verdict['verdict']}, {count_text(verdict)}",
                     interval_text(verdict)]
            for verdicts in extra:
                other = verdicts.get((name, verdict["claim"]))
                cells.append(f"{other['verdict']}, {count_text(other)}" if other else "-")
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _first_seed_title(title, rows):
    """"verdict (seeds from 100)": the seed set of an atlas folder, by its first seed (the experiments run
    different numbers of seeds from it)."""
    starts = sorted({settings["seeds"][0] for _, settings in rows if settings.get("seeds")})
    return f"{title} (seeds from {', '.join(map(str, starts))})" if starts else title


def sft_folders(selected):
    """The SFT cache folders the selected experiments' transformer runs train into (checked before any run)."""
    folders = set()
    for experiment in selected:
        for _, runner, options in experiment.configurations:
            if runner == "run_transformer":
                sft_options = {name: options[name] for name in ("sft_steps", "sft_folder") if name in options}
                folders.add(policies.sft_cache_folder(resolve({**TRANSFORMER, **sft_options})))
    return sorted(folders)


def warm_start(selected):
    """Train (or load) every SFT start the selected experiments' transformer runs load, once, here: the
    workers then all find it cached instead of each training the same one."""
    seen = set()
    for experiment in selected:
        for _, runner, options in experiment.configurations:
            if runner == "run_transformer":
                key = (options.get("sft_steps"), options.get("sft_folder"))
                if key not in seen:
                    seen.add(key)
                    sft_options = {name: options[name] for name in ("sft_steps", "sft_folder") if name in options}
                    online_tokens.setup(**TRANSFORMER, **sft_options)


def run_experiments(names, seeds, jobs_count, finished, report=print, table=None, seed_start=0):
    """Run the named experiments' runs over `jobs_count` workers; call finished(name, experiment, seeds,
    jobs, results) as soon as all runs of one experiment are done (results in job order). seeds: how many
    per experiment (None: each experiment's own), from seed_start. The costliest runs start first; one
    progress line per finished run goes to `report`, with an ETA weighted by the experiments' costs.
    table: {name: Experiment}, default `experiments()`. Returns {name: seconds}, each experiment's run
    time summed over its runs."""
    table = experiments() if table is None else table
    warm_start(table[name] for name in names)
    all_jobs, owner, seeds_of = [], {}, {}
    for name in names:
        seeds_of[name] = seed_list(table[name], seeds, seed_start)
        for job in jobs_of(table[name], seeds_of[name]):
            owner[len(all_jobs)] = name
            all_jobs.append((name, len(all_jobs)) + job[2:])
    cost = {index: table[owner[index]].cost for index in owner}
    order = sorted(range(len(all_jobs)), key=lambda index: -cost[index])  # stable: ties keep the table's order
    pending = {name: sum(1 for index in owner if owner[index] == name) for name in names}
    results, seconds_of = {}, dict.fromkeys(names, 0.0)
    total_cost, done_cost = sum(cost.values()), 0.0
    _import_torch_lazy_modules()  # before the ETA's clock, and forked workers inherit them
    started = time.perf_counter()
    ordered = [all_jobs[index] for index in order]
    iterator = map(_run_job, ordered) if jobs_count == 1 else _results_from_workers(ordered, jobs_count)
    try:
        for done, (index, seconds, result) in enumerate(iterator, start=1):
            results[index] = result
            name = owner[index]
            seconds_of[name] += seconds
            done_cost += cost[index]
            elapsed = time.perf_counter() - started
            job = all_jobs[index]
            eta = elapsed / done_cost * (total_cost - done_cost) if done_cost > 0 else 0.0
            report(f"[{done:3d}/{len(all_jobs)}] {name} {configuration_name(job[2])} seed {job[3]}: {seconds:.2f} s   "
                   f"ETA {eta:.0f} s")
            pending[name] -= 1
            if pending[name] == 0:
                indices = [i for i in range(len(all_jobs)) if owner[i] == name]
                finished(name, table[name], seeds_of[name], [all_jobs[i] for i in indices],
                         [results[i] for i in indices])
    finally:  # an early exit stops the workers now, not when the generator is collected
        if hasattr(iterator, "close"):
            iterator.close()
    return seconds_of


MAX_SEED_START = 2**63 - 1 - 100  # the drivers' seeds are below 2**63, and --seeds is at most 100


def default_output(seeds=None, seed_start=0, quick=False):
    """results-experiments for the default run; another --seeds, --seed-start or --quick writes its own
    folder (results-experiments-seeds10-start100-quick), so that the committed atlas is only rewritten by
    the command that made it."""
    return ("results-experiments" + (f"-seeds{seeds}" if seeds is not None else "")
            + (f"-start{seed_start}" if seed_start else "") + ("-quick" if quick else ""))


def build_parser():
    names = ", ".join(experiments())
    parser = OneLineErrorParser(
        prog="experiments.py",
        description="The phenomena atlas: named experiments over seeds, each claim checked against every seed, "
                    "written as runs, summary tables (CSV and Markdown), verdicts, settings and a figure per "
                    "experiment.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"experiments to run, or 'all': {names}")
    parser.add_argument("--list", action="store_true",
                        help="name every experiment with one line, and stop (default: off)")
    parser.add_argument("--seeds", type=int_flag(1, 100), default=None,
                        help="run N seeds of every configuration, integer in [1, 100] (default: each experiment's "
                             f"own, {DEFAULT_SEEDS} for most; --list shows it)")
    parser.add_argument("--seed-start", type=int_flag(0, MAX_SEED_START), default=0,
                        help="the first seed: seeds S..S+N-1; another start checks the claims on seeds nobody "
                             "tuned on; integer in [0, 2**63 - 101], so that every seed stays below 2**63 "
                             "(default: 0)")
    parser.add_argument("--quick", action="store_true",
                        help=f"every run at its experiment's quick size ({QUICK_STEPS} iterations for the training "
                             "runs): the mechanism in seconds, not the effect; verdicts mean little (default: off)")
    parser.add_argument("--jobs", type=int_flag(1, 64), default=os.cpu_count() or 1,
                        help="worker processes, integer in [1, 64] (default: the machine's cores)")
    parser.add_argument("--output", default=None,
                        help="folder of the experiments' folders (default: results-experiments for the default "
                             "seeds; with --seeds N, --seed-start S or --quick, results-experiments-seedsN-startS-quick "
                             "with the parts given, so that the committed atlas is only rewritten by the run that "
                             "made it)")
    parser.add_argument("--timings", default=None,
                        help="also write each experiment's run time (seconds summed over its runs), the wall time "
                             "and the machine to this JSON file, outside the deterministic results (default: off)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    table = experiments()
    if args.list:
        width = max(len(name) for name in table)
        print("\n".join(f"{name:{width}s}  {experiment.seeds:3d} seeds  {experiment.summary}"
                        for name, experiment in table.items()))
        return 0
    if not args.names:
        parser.error("argument NAME: name one or more experiments, or 'all' (see --list)")
    unknown = [name for name in args.names if name != "all" and name not in table]
    if unknown:
        parser.error(f"argument NAME: no experiment {unknown[0]!r} (expected one of: all, {', '.join(table)})")
    names = list(table) if "all" in args.names else list(dict.fromkeys(args.names))
    if args.output is None:
        args.output = default_output(args.seeds, args.seed_start, args.quick)
    output_folder_or_exit(parser, args.output)
    if args.timings is not None:
        output_file_or_exit(parser, args.timings, flag="--timings")
        separate_outputs_or_exit(parser, {"--timings": args.timings, "--output": args.output})
    for name in names:  # every experiment's folder, before any run
        output_folder_or_exit(parser, os.path.join(args.output, name), EXPERIMENT_FILES)
    if args.quick:
        table = {name: at_quick_size(experiment) for name, experiment in table.items()}
    for folder in sft_folders(table[name] for name in names):  # where a transformer run trains its SFT start
        output_folder_or_exit(parser, os.path.dirname(folder), flag="NAME (the SFT cache of its transformer runs)")
        output_folder_or_exit(parser, folder, policies.SFT_FILES, flag="NAME (the SFT cache of its transformer runs)")
    import plot_results  # matplotlib only now: --list and bad names stay quick

    written = []
    progress = Progress()

    def finished(name, experiment, seeds, jobs, results):
        folder = os.path.join(args.output, name)
        command = command_of(name, args.seeds, args.seed_start, args.quick)
        files = experiment_files(experiment, seeds, jobs, results, folder, command)
        files[os.path.join(folder, "figure.svg")] = plot_results.experiment_figure_bytes(files, ".svg")
        write_files(files)  # one experiment's files together: its folder holds all of them or none
        written.append(folder)
        settings = json.loads(files[os.path.join(folder, "settings.json")])
        verdicts = ", ".join(f"{verdict['verdict']} ({count_text(verdict)})" for verdict in settings["claims"])
        progress(f"-> {folder}: {', '.join(sorted(os.path.basename(path) for path in files))}")
        progress(f"   verdicts: {verdicts}")

    started = time.perf_counter()
    seconds = run_experiments(names, args.seeds, args.jobs, finished, report=progress, table=table,
                              seed_start=args.seed_start)
    progress("run time per experiment (sum over its runs, this machine): " + ", ".join(
        f"{name} {value:.1f} s" for name, value in sorted(seconds.items(), key=lambda item: -item[1])))
    wall = time.perf_counter() - started
    progress(f"{len(written)} experiment(s), {sum(seconds.values()):.1f} s of runs, {wall:.1f} s on {args.jobs} worker(s)")
    if args.timings is not None:  # measured, so never byte-identical: kept apart from the experiments' folders
        command = " ".join(["python experiments.py", *(argv if argv is not None else sys.argv[1:])])
        write_files({args.timings: json_text({
            "machine": machine(), "command": command, "jobs": args.jobs, "wall_seconds": round(wall, 1),
            "run_seconds": {name: round(value, 1) for name, value in seconds.items()},
            "seed_start": args.seed_start, "quick": args.quick,
            "seeds": {name: len(seed_list(table[name], args.seeds, args.seed_start)) for name in names}})})
        progress(f"-> {args.timings}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
