"""The phenomena atlas: the lab's claims and the field's known effects, each a named experiment run over
seeds, written as tables and a figure.

    python experiments.py --list                      # the experiments, one line each
    python experiments.py kl-estimators               # one experiment -> results-experiments/kl-estimators/
    python experiments.py all                         # every experiment (a few minutes on 2 cores)
    python experiments.py zero-variance --seeds 10 --jobs 2

Each experiment runs the drivers' Python APIs in this process's workers (no shelling out) over seeds
0..N-1 and writes results-experiments/<name>/: runs.csv (one row per run: configuration, seed,
metrics), curves.csv (per-iteration values of each run, where the experiment has curves),
summary.csv and summary.md (per configuration, each metric's mean, std over seeds, min and max),
settings.json (the claim, its source, the commands, every run's options) and figure.svg (drawn by
plot_results.py from those files). Runs are spread over --jobs worker processes, each running torch
single-threaded; the files do not depend on --jobs, and the same seeds give the same bytes.
"""

from __future__ import annotations

if __name__ == "__main__":  # first: a Ctrl-C while torch loads below ends with one line, not a traceback
    from lab_start import exit_quietly_on_signals

    exit_quietly_on_signals()

import math  # noqa: E402
import multiprocessing  # noqa: E402
import multiprocessing.connection  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import online_tokens  # noqa: E402
import ppo_chain  # noqa: E402
from policies import logps_of_tokens  # noqa: E402
import rl_lab  # noqa: E402
from lab_checks import torch_threads  # noqa: E402
from lab_io import (  # noqa: E402
    HeldSignals,
    OneLineErrorParser,
    Terminated,
    csv_text,
    int_flag,
    json_text,
    output_folder_or_exit,
    run_cli,
    write_files,
)

DTYPE = rl_lab.DTYPE
TARGET = 0.9  # "learned": exact success probability (online) or best-action probability (bandit)
LAST = 10  # iterations averaged for end-of-run statistics
DEFAULT_SEEDS = 5


# ---------------------------------------------------------------------------------------------
# Runners: one run of a driver, reduced to metrics (and a curve). Module-level, so workers can run them.
# ---------------------------------------------------------------------------------------------


def _first_step(rows, column, threshold):
    return next((row["step"] for row in rows if row[column] >= threshold), -1)


def _tail_mean(rows, column, positive_only=False):
    tail = rows[-LAST:]
    values = [row[column] for row in tail if not positive_only or row[column] > 0]
    return math.fsum(values) / len(values) if values else 0.0


def online_metrics(rows):
    """End-of-run statistics of an online run (online_tokens.run_summary; -1: never reached 0.9)."""
    return {name: -1 if value is None else value for name, value in online_tokens.run_summary(rows).items()}


def run_online(seed, curve=(), **options):
    """One online_tokens run: metrics and, for the columns in `curve`, a per-iteration curve."""
    rows, _ = online_tokens.train(seed=seed, **options)
    return {"metrics": online_metrics(rows),
            "curve": [{"step": row["step"], **{name: row[name] for name in curve}} for row in rows]}


def reward_distribution(state):
    """(P, 3) exact probabilities of the rewards 0, 0.25 and 1 for each prompt under the run's current
    table policy, by walking every response (at most 2**R + 2**R - 1 of them) through the tempered table."""
    task, table = state.task, state.policy.table.detach()
    logp = torch.log_softmax(table / state.cfg.temperature, dim=-1)  # (P, R, S, V)
    prompts, length = table.shape[0], table.shape[1]
    bos_state = state.policy.bos_state
    distribution = torch.zeros(prompts, 3, dtype=DTYPE)
    for prompt in range(prompts):
        stack = [([], 0.0)]  # (tokens so far, log-prob)
        while stack:
            tokens, lp = stack.pop()
            position = len(tokens)
            previous = tokens[-1] if tokens else bos_state
            for token in range(len(task.vocab)):
                step_lp = lp + logp[prompt, position, previous, token].item()
                if token == task.eos_id:
                    reward = task.verify(prompt, tokens + [token], False)
                elif position + 1 == length:
                    reward = task.verify(prompt, tokens + [token], True)
                else:
                    stack.append((tokens + [token], step_lp))
                    continue
                distribution[prompt, {0.0: 0, 0.25: 1, 1.0: 2}[reward]] += math.exp(step_lp)
    return distribution


def run_zero_variance(seed, **options):
    """An online run that also predicts each batch's share of zero-variance groups from the exact
    reward distribution of the policy that sampled it: per group, sum over reward values v of q_v ** G."""
    state = online_tokens.setup(seed=seed, **options)
    group_size = state.cfg.group_size
    previous = {"q": reward_distribution(state)}
    curve = []

    def observe(state, batch, credit, row):
        prompts = batch.prompts.reshape(-1, group_size)[:, 0]  # (B,) one per group
        predicted = (previous["q"][prompts] ** group_size).sum(dim=1).mean().item()
        curve.append({"step": row["step"], "zero_group_fraction": row["zero_group_fraction"],
                      "predicted_zero_group_fraction": predicted, "success_probability": row["success_probability"],
                      "total_tokens_sampled": row["total_tokens_sampled"]})
        previous["q"] = reward_distribution(state)

    rows, _ = online_tokens.run(state, observe=observe)
    metrics = online_metrics(rows)
    metrics["predicted_zero_group_fraction"] = math.fsum(item["predicted_zero_group_fraction"] for item in curve) / len(curve)
    metrics["measured_minus_predicted"] = metrics["zero_group_fraction"] - metrics["predicted_zero_group_fraction"]
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
    metrics["actions_to_0.9"] = reached["sampled_actions"] if reached else -1
    return {"metrics": metrics, "curve": [{"step": row["step"], **{name: row[name] for name in curve}} for row in rows]}


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
                                           "value_loss": row["value_loss"]} for row in rows]}


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

    forward = gradient_of(lambda lp: (lp.exp() * (lp - ref_logp)).sum())
    reverse = gradient_of(lambda lp: (ref_logp.exp() * (ref_logp - lp)).sum())
    metrics = {"kl_exact": exact}
    for name, estimator in rl_lab.KL_ESTIMATORS.items():
        values = estimator(logp, ref_logp)
        mean = (probs * values).sum().item()
        std = math.sqrt(max((probs * (values - mean) ** 2).sum().item(), 0.0))
        expected_gradient = gradient_of(lambda lp, estimator=estimator: (probs * estimator(lp, ref_logp)).sum())
        metrics.update({
            f"{name}_relative_bias": (mean - exact) / exact,
            f"{name}_relative_std": std / exact,
            f"{name}_grad_error_forward_kl": (expected_gradient - forward).norm().item() / forward.norm().item(),
            f"{name}_grad_error_reverse_kl": (expected_gradient - reverse).norm().item() / reverse.norm().item(),
            f"{name}_grad_norm_ratio": expected_gradient.norm().item() / forward.norm().item(),
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
STEP_RUNNERS = ("run_online", "run_zero_variance", "run_std_scaling", "run_bandit", "run_reward_shift", "run_chain")


def reduced(experiment, steps):
    """A copy of `experiment` whose training runs take `steps` iterations (for quick tests of the mechanism)."""
    configurations = [(label, runner, {**options, "steps": steps} if runner in STEP_RUNNERS else options)
                      for label, runner, options in experiment.configurations]
    return Experiment(experiment.name, experiment.summary, experiment.source, experiment.claim, configurations,
                      experiment.metrics, experiment.curves, experiment.tables, experiment.figure)


RUNNERS = {function.__name__: function for function in (
    run_online, run_zero_variance, run_std_scaling, run_bandit, run_chain, run_reward_shift, run_kl_estimators,
    run_microbatch)}


# ---------------------------------------------------------------------------------------------
# The experiments
# ---------------------------------------------------------------------------------------------


@dataclass
class Experiment:
    """A named experiment: its claim and source, and the runs it needs per seed."""

    name: str
    summary: str
    source: str
    claim: str
    configurations: list  # [(label dict, runner name, options dict)]
    metrics: list  # the metric names its summary shows
    curves: tuple = ()  # the curve columns its figure draws
    tables: dict = field(default_factory=dict)  # extra exact tables (name -> (columns, rows)), seed-free
    figure: dict = field(default_factory=dict)  # {"bars": [[metric, ...], ...], "log": [bool, ...]} for the plot


def _online(label, curve=(), **options):
    return (label, "run_online", {"curve": tuple(curve), **options})


ONLINE_CURVE = ("success_probability", "total_tokens_sampled")


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


def experiments():
    """Every experiment of the atlas, by name."""
    long_task = {"max_new_tokens": 10}
    found = [
        Experiment(
            "kl-estimators", "k1/k2/k3: bias and spread of each value, and which KL each expected gradient follows",
            "Schulman, 'Approximating KL Divergence' (2020); Tang and Munos, arXiv 2506.09477",
            "k1 and k3 are unbiased for KL(pi||ref), k2 is not; k3 never goes negative and spreads less than k1; "
            "as loss terms, E[grad k1] = 0, E[grad k2] = grad KL(pi||ref), E[grad k3] = grad KL(ref||pi).",
            [({"distance": distance}, "run_kl_estimators", {"distance": distance}) for distance in ("near", "far")],
            [f"{name}_{stat}" for name in ("k1", "k2", "k3") for stat in (
                "relative_bias", "relative_std", "grad_error_forward_kl", "grad_error_reverse_kl")],
            figure={"bars": [[f"{name}_relative_{stat}" for stat in ("bias", "std") for name in ("k1", "k2", "k3")],
                             [f"{name}_grad_error_{direction}_kl" for direction in ("forward", "reverse")
                              for name in ("k1", "k2", "k3")]],
                    "log": [False, True]},
        ),
        Experiment(
            "reduction-length-bias", "sequence mean vs token mean vs constant: lengths of right and wrong answers",
            "Dr. GRPO, arXiv 2503.20783, sec. 3.1",
            "Dividing each response's loss by its own length lets long wrong answers lose less per token, so wrong "
            "answers grow longer under the per-sequence mean; the token mean and the constant do not favour length.",
            [_online({"reduction": reduction}, ("mean_correct_length", "mean_wrong_length", "success_probability"),
                     reduction=reduction, **long_task) for reduction in rl_lab.REDUCTIONS],
            ["final_success_probability", "mean_correct_length", "mean_wrong_length", "iterations_to_0.9"],
            ("mean_wrong_length", "mean_correct_length", "success_probability"),
            figure={"curve_panels": [["mean_wrong_length", "mean_correct_length"], ["success_probability"]],
                    "bars": [["mean_correct_length", "mean_wrong_length"]]},
        ),
        Experiment(
            "std-scaling", "group vs batch vs no std: the per-prompt weight (exact) and easy vs hard prompts",
            "Dr. GRPO, arXiv 2503.20783, sec. 3.1 (question-level difficulty bias)",
            "Dividing by the group's std gives a prompt whose group is nearly all right or all wrong a larger total "
            "weight than one near 50%: rare successes on hard prompts get amplified.",
            [({"scale_rewards": scale}, "run_std_scaling", {"scale_rewards": scale})
             for scale in ("group", "batch", "none")],
            ["final_success_probability", "easy_success_step_10", "hard_success_step_10", "hard_success_final",
             "iterations_to_0.9"],
            ("hard_success", "easy_success"),
            {"gradient_weight_by_successes": std_scaling_table()},
            figure={"curve_panels": [["hard_success", "easy_success"]],
                    "bars": [["easy_success_step_10", "hard_success_step_10", "hard_success_final"]]},
        ),
        Experiment(
            "zero-variance", "share of groups whose rewards all tie, measured vs p^G + (1-p)^G; dynamic sampling",
            "DAPO, arXiv 2503.14476, sec. 3.2 (dynamic sampling, eq. 11)",
            "A group teaches nothing when its rewards tie; the share is predicted per prompt by sum_v q_v^G from the "
            "exact reward distribution, grows with G falling and with learning; dynamic sampling removes it at the "
            "price of extra samples.",
            [({"group_size": size, "dynamic_sampling": False}, "run_zero_variance",
              {"group_size": size, "prompts": 64 // size}) for size in (2, 4, 8, 16)]
            + [({"group_size": 8, "dynamic_sampling": True}, "run_zero_variance",
                {"group_size": 8, "prompts": 8, "dynamic_sampling": True})],
            ["zero_group_fraction", "predicted_zero_group_fraction", "measured_minus_predicted", "final_success_probability",
             "tokens_to_0.9", "responses_sampled"],
            ("zero_group_fraction", "predicted_zero_group_fraction", "success_probability"),
            figure={"curve_panels": [["zero_group_fraction", "predicted_zero_group_fraction"], ["success_probability"]],
                    "bars": [["zero_group_fraction", "predicted_zero_group_fraction", "final_success_probability"]]},
        ),
        Experiment(
            "clip-higher", "eps_high 0.2 vs 0.28 (and CISPO) with 8 updates per batch: entropy, clipping, success",
            "DAPO, arXiv 2503.14476, sec. 3.1 (clip-higher)",
            "A symmetric clip stops low-probability tokens with A > 0 early, so entropy collapses; raising the upper "
            "bound keeps exploring. With many updates per batch the clip binds often enough to show it.",
            [_online({"loss": "grpo", "epsilon_high": 0.2}, ("entropy", "clip_fraction", "success_probability"),
                     updates_per_batch=8),
             _online({"loss": "grpo", "epsilon_high": 0.28}, ("entropy", "clip_fraction", "success_probability"),
                     updates_per_batch=8, epsilon_high=0.28),
             _online({"loss": "cispo", "epsilon_high": 5.0}, ("entropy", "clip_fraction", "success_probability"),
                     algorithm="cispo", updates_per_batch=8)],
            ["final_success_probability", "entropy_last", "clip_fraction", "iterations_to_0.9"],
            ("entropy", "clip_fraction", "success_probability"),
            figure={"bars": [["final_success_probability", "entropy_last", "clip_fraction"]]},
        ),
        Experiment(
            "updates-per-batch", "1, 2, 4, 8 Adam steps per batch for GRPO, CISPO, GSPO: the off-policy cost",
            "PPO, arXiv 1707.06347 (epochs per batch); the lab's own README",
            "Reusing a batch for more steps moves the policy further from the one that sampled it: the clip binds "
            "more and the final success falls.",
            [_online({"algorithm": algorithm, "updates_per_batch": updates}, ("success_probability",),
                     algorithm=algorithm, updates_per_batch=updates)
             for algorithm in ("grpo", "cispo", "gspo") for updates in (1, 2, 4, 8)],
            ["final_success_probability", "iterations_to_0.9", "clip_fraction"],
            ("success_probability",),
            figure={"bars": [["final_success_probability", "clip_fraction"]]},
        ),
        Experiment(
            "sampler-mismatch", "sample at another temperature or top-p than the trainer scores, with and without TIS",
            "Yao et al. 2025 (truncated importance sampling for rollout/trainer mismatch); IMPALA, arXiv 1802.01561",
            "Tokens drawn from another distribution bias the gradient; weights min(p_trainer/p_sampler, cap) correct "
            "it where the sampler covers the trainer's support. Top-p removes tokens the trainer still gives "
            "probability: no weight can bring them back.",
            [_online({"sampler": "same", "tis": False}, ONLINE_CURVE)]
            + [_online({"sampler": name, "tis": tis}, ONLINE_CURVE, **sampler, **({"tis_cap": 2.0} if tis else {}))
               for name, sampler in (("temperature 1.5", {"rollout_temperature": 1.5}),
                                     ("top-p 0.8", {"rollout_top_p": 0.8})) for tis in (False, True)],
            ["final_success_probability", "iterations_to_0.9"],
            ("success_probability",),
            figure={"bars": [["final_success_probability"]]},
        ),
        Experiment(
            "microbatch", "one batch in 1, 2, 4 micro-batches: accumulated gradient vs the full batch, per reduction",
            "verl issue 5625 (token-mean normalized per micro-batch under gradient accumulation)",
            "With the token mean, normalizing each micro-batch by its own token count gives a different gradient than "
            "the full batch; normalizing by the global token count (or using the sequence mean or a constant) gives "
            "the same gradient exactly.",
            [({"batch": "seed"}, "run_microbatch", {})],
            [f"{reduction}_local_m{micro}" for reduction in rl_lab.REDUCTIONS for micro in (1, 2, 4)]
            + [f"token_global_m{micro}" for micro in (1, 2, 4)],
            figure={"bars": [[f"{reduction}_local_m{micro}" for reduction in rl_lab.REDUCTIONS for micro in (2, 4)]
                             + [f"token_global_m{micro}" for micro in (2, 4)]], "log": [True]},
        ),
        Experiment(
            "grpo2-vs-dpo", "GRPO with G = 2 against online DPO at the same samples",
            "It Takes Two: Your GRPO Is Secretly DPO, arXiv 2510.00977",
            "With two samples per prompt, GRPO's advantages are +-1 on pairs with different rewards: a contrastive "
            "update like DPO's; the two learn alike at the same number of samples.",
            [_online({"algorithm": "grpo", "group_size": 2}, ONLINE_CURVE, group_size=2, prompts=32),
             _online({"algorithm": "dpo", "group_size": 2}, ONLINE_CURVE, algorithm="dpo", group_size=2, prompts=32),
             _online({"algorithm": "grpo", "group_size": 8}, ONLINE_CURVE, group_size=8, prompts=8)],
            ["final_success_probability", "iterations_to_0.9", "tokens_to_0.9", "responses_sampled"],
            ("success_probability",),
            figure={"bars": [["final_success_probability"]]},
        ),
        Experiment(
            "four-algorithms", "PPO, DPO, GRPO, CISPO on the token task at one budget (B*G responses per iteration)",
            "the article this lab accompanies; InstructGPT, arXiv 2203.02155; DPO, arXiv 2305.18290",
            "At the same responses per iteration all four reach the task; PPO's critic gives per-token credit, DPO "
            "uses only the best and worst response per prompt.",
            [_online({"algorithm": algorithm}, ONLINE_CURVE + ("kl_reference",), algorithm=algorithm)
             for algorithm in online_tokens.FOUR_ALGORITHMS],
            ["final_success_probability", "iterations_to_0.9", "tokens_to_0.9", "kl_reference", "mean_correct_length", "mean_wrong_length"],
            ("success_probability", "kl_reference"),
            figure={"bars": [["final_success_probability", "kl_reference"]]},
        ),
        Experiment(
            "dpo-label-flips", "bandit DPO with 0, 3, 6, 12 of its 12 labels reversed",
            "the article, sec. 10.3",
            "The training loss falls whatever the labels say; with reversed labels the clean loss rises and the true "
            "reward falls: the optimizer solves the task it was given.",
            [({"preference_flips": flips}, "run_bandit", {"algorithm": "dpo", "preference_flips": flips})
             for flips in (0, 3, 6, 12)],
            ["final_expected_reward", "dpo_training_loss", "dpo_clean_loss"],
            ("expected_reward",),
            figure={"bars": [["final_expected_reward", "dpo_training_loss", "dpo_clean_loss"]]},
        ),
        Experiment(
            "group-size", "bandit GRPO, G = 2, 4, 8, 16 at 128 actions per iteration",
            "the article, sec. 10.3",
            "At a fixed action budget, larger groups mean fewer prompts per batch; most groups tie once the policy is "
            "good, yet all reach the optimum.",
            [({"group_size": size}, "run_bandit", {"algorithm": "grpo", "group_size": size, "grpo_prompts": 128 // size})
             for size in (2, 4, 8, 16)],
            ["final_expected_reward", "zero_group_fraction", "actions_to_0.9"],
            ("expected_reward",),
            figure={"bars": [["final_expected_reward", "zero_group_fraction"]]},
        ),
        Experiment(
            "chain-lambda", "two-step chain PPO with GAE lambda 0, 0.95, 1",
            "GAE, arXiv 1506.02438; the lab's section 6",
            "lambda trades bias for variance; lambda 0 still learns a delayed reward through the critic's bootstrap, "
            "only slower at the start.",
            [({"gae_lambda": value}, "run_chain", {"gae_lambda": value}) for value in (0.0, 0.95, 1.0)],
            ["expected_return_step_1", "expected_return_step_5", "expected_return_step_10", "final_expected_return"],
            ("expected_return",),
            figure={"bars": [["expected_return_step_1", "expected_return_step_5", "expected_return_step_10",
                              "final_expected_return"]]},
        ),
        Experiment(
            "reward-shift", "bandit rewards plus a constant: GRPO's advantages do not move, PPO's critic relearns",
            "the article, sec. 10.3",
            "A group-relative advantage subtracts the group mean, so a constant shift changes nothing; PPO's critic "
            "starts at 0 and must first learn the shift, and until then every sampled action looks good.",
            [({"algorithm": algorithm, "shift": shift}, "run_reward_shift",
              {"algorithm": algorithm, "shift": shift, "steps": 40})
             for algorithm in ("grpo", "ppo") for shift in (0.0, 5.0)],
            ["best_action_probability_step_5", "best_action_probability_step_10", "steps_to_0.9", "advantage_change"],
            ("best_action_probability",),
            figure={"bars": [["best_action_probability_step_5", "best_action_probability_step_10"],
                             ["advantage_change"]], "log": [False, True]},
        ),
        Experiment(
            "sparse-reward", "bandit GRPO with sparse rewards (1 for the best action): G at 128 actions per iteration",
            "the article, sec. 10.3",
            "With only one rewarded action, groups tie more often (all failures early, all successes late); at a "
            "fixed budget the group size decides how many samples learning costs.",
            [({"group_size": size}, "run_bandit", {"algorithm": "grpo", "group_size": size,
                                                   "grpo_prompts": 128 // size, "sparse_rewards": True})
             for size in (2, 4, 8, 16)],
            ["zero_group_fraction", "actions_to_0.9", "final_best_action_probability"],
            ("expected_reward",),
            figure={"bars": [["zero_group_fraction", "final_best_action_probability"]]},
        ),
    ]
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


def _run_job(job):
    """Worker entry: (experiment name, global index, label, seed, runner, options) -> (index, seconds, result)."""
    name, index, label, seed, runner, options = job
    started = time.perf_counter()
    with torch_threads(1):
        result = RUNNERS[runner](seed, **options)
    return index, time.perf_counter() - started, result


def _worker(connection):
    """A worker process: run each job the main process sends, answer (True, result) or (False, the
    exception); stop at None, or when the main process is gone (its end of the pipe closed)."""
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
            process = context.Process(target=_worker, args=(theirs,), daemon=True)
            process.start()
            theirs.close()  # the worker's end lives in the worker only, so its death reads as end-of-file
            workers[ours] = process
        for connection in workers:
            connection.send(pending.pop())
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
                    connection.send(pending.pop())
                else:
                    busy.discard(connection)
                yield value
    finally:
        with HeldSignals():  # a second Ctrl-C must not cut this short and leave a worker running
            for connection, process in workers.items():
                process.kill()  # SIGKILL: a worker holds nothing to clean up, and a stopped one dies too
                process.join()
                connection.close()


def jobs_of(experiment, seeds):
    """Every run of an experiment, configuration-major then seed: (name, index, label, seed, runner, options)."""
    jobs = []
    for label, runner, options in experiment.configurations:
        for seed in range(seeds):
            jobs.append((experiment.name, len(jobs), label, seed, runner, options))
    return jobs


def summarize(experiment, jobs, results):
    """runs rows, curve rows and summary rows (mean, std over seeds, min, max of each metric)."""
    runs, curves, groups = [], [], {}
    label_keys = list(experiment.configurations[0][0])
    for (_, index, label, seed, _, _), result in zip(jobs, results):
        configuration = " ".join(f"{key}={value}" for key, value in label.items())
        runs.append({"configuration": configuration, **label, "seed": seed, **result["metrics"]})
        for point in result["curve"]:
            curves.append({"configuration": configuration, "seed": seed, **point})
        groups.setdefault(configuration, (label, []))[1].append(result["metrics"])
    summary = []
    for configuration, (label, metrics_list) in groups.items():
        row = {"configuration": configuration, **label, "seeds": len(metrics_list)}
        for metric in experiment.metrics:
            values = [metrics[metric] for metrics in metrics_list]
            row[f"{metric}_mean"] = math.fsum(values) / len(values)
            row[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
            row[f"{metric}_min"] = min(values)
            row[f"{metric}_max"] = max(values)
        summary.append(row)
    run_columns = ["configuration"] + label_keys + ["seed"] + list(results[0]["metrics"])
    curve_columns = list(curves[0]) if curves else []
    summary_columns = ["configuration"] + label_keys + ["seeds"] + [
        f"{metric}_{stat}" for metric in experiment.metrics for stat in ("mean", "std", "min", "max")]
    return (runs, run_columns), (curves, curve_columns), (summary, summary_columns)


def _number(value):
    """A table cell: integers as they are; floats with 4 decimals, 1 from 100 up, 2 significant digits in
    scientific notation below 0.001 (exact identities show as e-15 there, not as 0.0000)."""
    if not isinstance(value, float):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.4f}" if abs(value) >= 1e-3 else f"{value:.1e}"


def summary_markdown(experiment, summary_rows):
    """The summary as a Markdown table: one row per configuration, each metric as mean +- std [min, max]."""
    header = ["configuration", "seeds"] + experiment.metrics
    lines = [f"**{experiment.name}**: {experiment.claim}", "",
             "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in summary_rows:
        cells = [row["configuration"], str(row["seeds"])]
        for metric in experiment.metrics:
            cells.append(f"{_number(row[metric + '_mean'])} +- {_number(row[metric + '_std'])} "
                         f"[{_number(row[metric + '_min'])}, {_number(row[metric + '_max'])}]")
        lines.append("| " + " | ".join(cells) + " |")
    for table_name, (columns, rows) in experiment.tables.items():
        lines += ["", f"{table_name} (exact, no seeds):", "",
                  "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(_number(row[column]) for column in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def experiment_files(experiment, seeds, jobs, results, folder):
    """{path: text} of one experiment's outputs (the figure is added by the caller)."""
    (runs, run_columns), (curves, curve_columns), (summary, summary_columns) = summarize(experiment, jobs, results)
    files = {
        os.path.join(folder, "runs.csv"): csv_text(runs, run_columns),
        os.path.join(folder, "summary.csv"): csv_text(summary, summary_columns),
        os.path.join(folder, "summary.md"): summary_markdown(experiment, summary),
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
        "command": f"python experiments.py {experiment.name} --seeds {seeds}",
        "seeds": list(range(seeds)),
        "configurations": [{"label": label, "runner": runner, "options": {key: list(value) if isinstance(value, tuple)
                                                                           else value for key, value in options.items()}}
                           for label, runner, options in experiment.configurations],
        "metrics": experiment.metrics,
        "curves": list(experiment.curves),
        "figure": experiment.figure,
        "summary_statistics": "mean, std (sample, over seeds), min and max of each metric per configuration",
        "torch": torch.__version__,
    })
    return files


def run_experiments(names, seeds, jobs_count, finished, report=print, table=None):
    """Run the named experiments' runs over `jobs_count` workers; call finished(name, experiment, jobs,
    results) as soon as all runs of one experiment are done (results in job order). One progress line per
    finished run goes to `report`. table: {name: Experiment}, default `experiments()`."""
    table = experiments() if table is None else table
    all_jobs, owner = [], {}
    for name in names:
        for job in jobs_of(table[name], seeds):
            owner[len(all_jobs)] = name
            all_jobs.append((name, len(all_jobs)) + job[2:])
    pending = {name: len(jobs_of(table[name], seeds)) for name in names}
    results = {}
    started = time.perf_counter()
    iterator = map(_run_job, all_jobs) if jobs_count == 1 else _results_from_workers(all_jobs, jobs_count)
    try:
        for done, (index, seconds, result) in enumerate(iterator, start=1):
            results[index] = result
            name = owner[index]
            elapsed = time.perf_counter() - started
            job = all_jobs[index]
            label = " ".join(f"{key}={value}" for key, value in job[2].items())
            report(f"[{done:3d}/{len(all_jobs)}] {name} {label} seed {job[3]}: {seconds:.2f} s   "
                   f"ETA {elapsed / done * (len(all_jobs) - done):.0f} s")
            pending[name] -= 1
            if pending[name] == 0:
                indices = [i for i in range(len(all_jobs)) if owner[i] == name]
                finished(name, table[name], [all_jobs[i] for i in indices], [results[i] for i in indices])
    finally:  # an early exit stops the workers now, not when the generator is collected
        if hasattr(iterator, "close"):
            iterator.close()


def build_parser():
    names = ", ".join(experiments())
    parser = OneLineErrorParser(
        prog="experiments.py",
        description="The phenomena atlas: named experiments over seeds, written as runs, summary tables "
                    "(CSV and Markdown), settings and a figure per experiment.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"experiments to run, or 'all': {names}")
    parser.add_argument("--list", action="store_true",
                        help="name every experiment with one line, and stop (default: off)")
    parser.add_argument("--seeds", type=int_flag(1, 100), default=DEFAULT_SEEDS,
                        help="run seeds 0..N-1 of every configuration, integer in [1, 100] (default: 5)")
    parser.add_argument("--jobs", type=int_flag(1, 64), default=os.cpu_count() or 1,
                        help="worker processes, integer in [1, 64] (default: the machine's cores)")
    parser.add_argument("--output", default=None,
                        help="folder of the experiments' folders (default: results-experiments for the default 5 "
                             "seeds, results-experiments-seeds<N> for another number, so that the committed "
                             "atlas is only rewritten by the run that made it)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    table = experiments()
    if args.list:
        width = max(len(name) for name in table)
        print("\n".join(f"{name:{width}s}  {experiment.summary}" for name, experiment in table.items()))
        return 0
    if not args.names:
        parser.error("argument NAME: name one or more experiments, or 'all' (see --list)")
    unknown = [name for name in args.names if name != "all" and name not in table]
    if unknown:
        parser.error(f"argument NAME: no experiment {unknown[0]!r} (expected one of: all, {', '.join(table)})")
    names = list(table) if "all" in args.names else list(dict.fromkeys(args.names))
    if args.output is None:
        args.output = "results-experiments" if args.seeds == DEFAULT_SEEDS else f"results-experiments-seeds{args.seeds}"
    output_folder_or_exit(parser, args.output)
    for name in names:  # every experiment's folder, before any run
        output_folder_or_exit(parser, os.path.join(args.output, name), EXPERIMENT_FILES)
    import plot_results  # matplotlib only now: --list and bad names stay quick

    written = []
    closed = []

    def progress(line):
        """One progress line; a reader that went away (`| head`) stops the lines, not the run."""
        if closed:
            return
        try:
            print(line, flush=True)
        except (BrokenPipeError, OSError, ValueError, AttributeError):
            closed.append(True)
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass

    def finished(name, experiment, jobs, results):
        folder = os.path.join(args.output, name)
        files = experiment_files(experiment, args.seeds, jobs, results, folder)
        files[os.path.join(folder, "figure.svg")] = plot_results.experiment_figure_bytes(files, ".svg")
        write_files(files)  # one experiment's files together: its folder holds all of them or none
        written.append(folder)
        progress(f"-> {folder}: {', '.join(sorted(os.path.basename(path) for path in files))}")

    started = time.perf_counter()
    run_experiments(names, args.seeds, args.jobs, finished, report=progress)
    progress(f"{len(written)} experiment(s), {time.perf_counter() - started:.1f} s on {args.jobs} worker(s)")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
