"""Runners: one run of a driver reduced to its metrics and a curve, {"metrics": {...}, "curve": [...]}.
Each is registered by name with `@runner` (the name a configuration of the catalogue gives), at module
level so that the engine's worker processes can run them."""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics

import torch
import torch.nn.functional as F

import online_tokens
import policies
import ppo_chain
import rl_lab
import sft
from atlas.exact import (REWARD_CLASSES, all_responses, expected_wrong_length, first_order_entropy_change,
                         policy_gradient_bias, reward_distribution)
from lab.checks import torch_threads
from online_algorithms import FAMILIES, differing_positions
from online_registry import family_of
from online_settings import LAST_ITERATIONS as LAST, TARGET_SUCCESS as TARGET, resolve
from policies import logps_of_tokens
from rl_lab import DTYPE
from running_total import RunningTotalConfig, RunningTotalTask
from tasks import TASKS
from tiny_lm import completion_log_probs

# TARGET: "learned", an exact success probability (online) or best-action probability (bandit) at least
# this; LAST: the iterations averaged for end-of-run statistics. Both are the online comparison's own.
STUCK = 0.5  # a prompt whose exact success ends below this is stuck (its groups mostly tie: no signal)

RUNNERS = {}  # name -> runner: what a configuration names and a worker runs
TRAINING_RUNNERS = set()  # the names of the runners that train for `steps` iterations: --quick shortens them
TRANSFORMER_RUNNERS = set()  # the names of the runners of the transformer: they load (or train) an SFT start
SFT_STARTS = {}  # transformer runner -> starts(seed, **options): the SFT start its run loads, or None (sft_start)


def sft_start(seed, sft_seed=None, subtraction_share=None, **options):
    """{"task", "max_new_tokens", "config" (sft.SFTConfig's fields), "folder"}: the SFT start that a transformer
    run with `options` loads (policies.sft_config_of), as the keyword arguments of `train_sft_start`. The
    engine gives every transformer run sft_seed = its seed, so the seeds of an experiment vary the start too."""
    cfg = resolve({"policy": "transformer", "sft_seed": seed if sft_seed is None else sft_seed,
                   **{name: options[name] for name in ("task", "max_new_tokens", "sft_steps", "sft_folder")
                      if name in options}})
    fields = {} if subtraction_share is None else {"subtraction_share": subtraction_share}
    config = policies.sft_config_of(cfg, **fields)
    return {"task": cfg.task, "max_new_tokens": cfg.max_new_tokens, "config": dataclasses.asdict(config),
            "folder": cfg.sft_folder}


def runner(function=None, *, trains=False, transformer=False, starts=sft_start):
    """Register a runner under its function's name: `@runner`, or `@runner(trains=True)` for one that takes
    `steps` (--quick shortens it); transformer=True for one that runs the transformer from an SFT start:
    starts(seed, **options) gives the start it loads (default `sft_start`, the one of its options), which the
    engine trains before the runs; starts=None for a runner that trains its own start inside the run."""
    def register(function):
        RUNNERS[function.__name__] = function
        if trains:
            TRAINING_RUNNERS.add(function.__name__)
        if transformer:
            TRANSFORMER_RUNNERS.add(function.__name__)
            SFT_STARTS[function.__name__] = starts
        return function
    return register if function is None else register(function)


@runner
def train_sft_start(seed, task, max_new_tokens, config, folder):
    """Train (or load) one SFT start into its cache folder (sft.load_or_train): the engine's warm start runs
    these in its workers before the transformer runs, which then find them cached. No metrics."""
    sft.load_or_train(TASKS[task](max_new_tokens), sft.SFTConfig(**config), folder)
    return {"metrics": {}, "curve": []}


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


@runner(trains=True)
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


@runner(trains=True)
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
    predicted = [item["predicted_zero_group_fraction"] for item in curve]
    metrics["predicted_zero_group_fraction"] = math.fsum(predicted) / len(predicted)
    metrics["measured_minus_predicted"] = metrics["zero_group_fraction"] - metrics["predicted_zero_group_fraction"]
    error = math.sqrt(math.fsum(variances)) / len(curve)
    metrics["measured_minus_predicted_z"] = metrics["measured_minus_predicted"] / error if error > 0 else 0.0
    return {"metrics": metrics, "curve": curve}


def prompt_success(state):
    """(P,) exact p(correct answer then EOS) of each prompt under the run's current policy."""
    return online_tokens.success_by_prompt(state.policy, state.evaluation["train"])


EASY, HARD = (0, 1), (4, 5)  # one-digit answers ("0", "1") and three-digit ones ("100", "101")


@runner(trains=True)
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


@runner(trains=True)
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


@runner(trains=True)
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


@runner(trains=True)
def run_chain(seed, gae_lambda, steps=120):
    rows, _ = ppo_chain.train(seed=seed, gae_lambda=gae_lambda, steps=steps)
    at = lambda step: rows[min(step, len(rows) - 1)]["expected_return"]  # noqa: E731
    metrics = {"final_expected_return": rows[-1]["expected_return"], "expected_return_step_1": at(1),
               "expected_return_step_5": at(5), "expected_return_step_10": at(10),
               "steps_to_0.9": _first_step(rows, "expected_return", TARGET)}
    return {"metrics": metrics, "curve": [{"step": row["step"], "expected_return": row["expected_return"],
                                           "left_probability": row["left_probability"]} for row in rows]}


@runner(trains=True)
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
    return {"metrics": metrics, "curve": [{"step": row["step"],
                                           "best_action_probability": row["best_action_probability"],
                                           "value_loss": row["value_loss"] if row["step"] else None} for row in rows]}


def _random_pair(seed, scale):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, generator=generator, dtype=DTYPE) * scale
    reference = torch.randn(6, generator=generator, dtype=DTYPE) * scale
    return logits, F.log_softmax(reference, dim=-1)


@runner
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


@runner
def run_microbatch(seed):
    """One batch (from a policy moved by a few GRPO steps, so lengths differ), split into M = 1, 2, 4
    micro-batches with gradient accumulation. For each reduction, the accumulated gradient with each
    micro-batch normalized locally (and weighted by its share of the sequences, as verl's
    loss_scale_factor) or by the global token count, against the full-batch gradient; and the spread
    (max - min) of the micro-batches' token counts at each M."""
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
                tokens = [mask[part].sum().item() for part in parts]  # equal counts: the local mean is the global
                metrics[f"token_count_spread_m{micro}"] = max(tokens) - min(tokens)
                def global_count(per_token, parts=parts):  # each micro-batch's sum over the global token count
                    return sum(torch.where(mask[part] > 0, per_token[part], torch.zeros_like(per_token[part])).sum()
                               / global_tokens for part in parts)

                metrics[f"token_global_m{micro}"] = (gradient(global_count) - full).norm().item() / full.norm().item()
    lengths = mask.sum(dim=1).double()
    metrics["length_spread"] = (lengths.max() - lengths.min()).item()
    return {"metrics": metrics, "curve": []}


# the transformer's runs: the SFT start is trained once (sft.py, cached in results-sft) and every run loads it
TRANSFORMER = {"policy": "transformer"}
TRANSFORMER_CURVE = ("success_probability", "test_success_probability", "entropy", "kl_reference",
                     "mean_correct_length", "mean_wrong_length")
TRANSFORMER_EVALUATION = ("pass@1", "pass@4", "pass@16", "pass@64", "entropy_per_token", "distinct_correct_per_prompt",
                          "mean_length_correct", "mean_length_wrong")


@runner(transformer=True)
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


def bandit_kl_targets(beta, algorithm, kl_placement, group_size=8):
    """The two points a bandit run with the KL at `beta` can converge to, as (X, A) log-probs: pi*, the
    optimum of E[R] - b KL(pi || ref), and the optimum of E[R] - b KL(ref || pi) (the forward KL), at the
    run's effective b. A KL in the reward is scaled with the reward, so b = beta. A KL term in GRPO's loss
    is not: GRPO's group mean holds the answer itself, so its policy term's expected gradient is (G - 1) / G
    of the exact one, and the loss term weighs b = beta * G / (G - 1) against it (PPO's critic baseline does
    not depend on the action: b = beta)."""
    rewards = rl_lab.reward_table()
    ref_logp = torch.full_like(rewards, -math.log(rl_lab.NUM_ACTIONS))  # the bandit's uniform reference
    in_loss = algorithm in ("grpo", "cispo") and kl_placement != "k1-reward"
    effective = beta * group_size / (group_size - 1) if in_loss else beta
    return rl_lab.kl_optimum_logp(rewards, ref_logp, effective), rl_lab.forward_kl_optimum_logp(rewards, ref_logp,
                                                                                                effective)


def _kl_rows(logp, other_logp):
    """(X,) KL(p || q) per context from (X, A) log-probs."""
    return (logp.exp() * (logp - other_logp)).sum(dim=-1)


@runner(trains=True)
def run_kl_optimum(seed, algorithm, kl_placement, beta, steps=150, scale_rewards="group"):
    """A bandit run (rl_lab.train) with the KL at `beta` placed by `kl_placement`, measured after every
    iteration against the two exact optima of `bandit_kl_targets`: the mean over contexts of
    KL(pi || pi*) and KL(pi || forward optimum) and the total variations, each averaged over the last
    LAST iterations (a constant learning rate leaves the policy jittering around its fixed point)."""
    reverse, forward = bandit_kl_targets(beta, algorithm, kl_placement)
    points = []

    def observe(step, logits):
        logp = F.log_softmax(logits, dim=-1)
        probs = logp.exp()
        points.append({"step": step, "kl_to_optimum": _kl_rows(logp, reverse).mean().item(),
                       "kl_to_forward_optimum": _kl_rows(logp, forward).mean().item(),
                       "tv_to_optimum": 0.5 * (probs - reverse.exp()).abs().sum(dim=-1).mean().item(),
                       "tv_to_forward_optimum": 0.5 * (probs - forward.exp()).abs().sum(dim=-1).mean().item()})

    rows, _ = rl_lab.train(algorithm, seed=seed, steps=steps, kl_beta=beta, kl_placement=kl_placement,
                           scale_rewards=scale_rewards, observe=observe)
    tail = points[-LAST:]
    metrics = {name: math.fsum(point[name] for point in tail) / len(tail) for name in (
        "kl_to_optimum", "kl_to_forward_optimum", "tv_to_optimum", "tv_to_forward_optimum")}
    metrics["nearer_forward_optimum"] = metrics["kl_to_optimum"] - metrics["kl_to_forward_optimum"]
    metrics["targets_kl"] = _kl_rows(forward, reverse).mean().item()  # KL(forward optimum || pi*): their distance
    metrics["final_expected_reward"] = rows[-1]["expected_reward"]
    metrics["final_kl_reference"] = rows[-1]["kl_reference"]
    return {"metrics": metrics, "curve": points}


def _covariance(x, y):
    """The population covariance of two (T,) tensors (a batch's tokens), as a float."""
    return ((x - x.mean()) * (y - y.mean())).mean().item()


def _correlation(x, y):
    """Pearson's correlation of two equal-length lists (None when either is constant)."""
    if len(x) < 2 or statistics.pstdev(x) == 0 or statistics.pstdev(y) == 0:
        return None
    return statistics.correlation(x, y)


@runner(trains=True)
def run_entropy_mechanism(seed, **options):
    """An online run of a table policy that measures, per iteration, the entropy mechanism of Cui et al.
    (arXiv 2505.22617) on the batch's kept tokens t, each in its state s_t = (prompt, position, previous
    token), with pi the policy that sampled the batch and pi' the one after the update:

        covariance          Cov_t(log pi(y_t | s_t), A_t)            the paper's batch quantity (natural PG:
                                                                      dH = -lr Cov(log pi, A))
        covariance_pg       Cov_t(log pi(y_t | s_t), pi(y_t | s_t) A_t)   its plain-PG form (dH = -lr Cov(log pi, pi A))
        first_order_change  mean_t of -Cov_{a~pi(.|s_t)}(log pi(a|s_t), z'(s_t, a) - z(s_t, a)), the first-order
                            entropy change of the update the optimizer made (Adam: neither form above)
        entropy_change      mean_t of H(pi'(.|s_t)) - H(pi(.|s_t)), measured exactly

    Metrics: each one's mean over the run, the share of iterations where -covariance and entropy_change have
    the same sign, their correlation over iterations (and the same for covariance_pg and first_order_change),
    the batch entropy averaged over the run (online_tokens' entropy column), and run_summary's."""
    state = online_tokens.setup(seed=seed, **options)
    if not state.policy.exact:
        raise ValueError("run_entropy_mechanism: needs a table policy (every state's distribution at hand)")
    previous = {"policy": state.policy.snapshot()}
    curve = []

    def observe(state, batch, credit, row):
        kept = credit.loss_mask.bool()  # (N, R)
        with torch.no_grad():
            old_logits = previous["policy"].logits(batch.prompts, batch.completion_ids)  # (N, R, V)
            new_logits = state.policy.logits(batch.prompts, batch.completion_ids)
            old_entropy = policies.entropies(old_logits)  # (N, R)
            first_order = first_order_entropy_change(old_logits, new_logits)  # (N, R)
            token_logp = batch.old_logps[kept]  # (T,) the sampled tokens
            advantages = credit.advantages.unsqueeze(1).expand_as(batch.old_logps)[kept]  # (N,) -> (N, R) -> (T,)
            curve.append({"step": row["step"], "entropy": row["entropy"],
                          "covariance": _covariance(token_logp, advantages),
                          "covariance_pg": _covariance(token_logp, token_logp.exp() * advantages),
                          "first_order_change": first_order[kept].mean().item(),
                          "entropy_change": (policies.entropies(new_logits) - old_entropy)[kept].mean().item(),
                          "success_probability": row["success_probability"]})
        previous["policy"] = state.policy.snapshot()

    rows, _ = online_tokens.run(state, observe=observe)
    metrics = online_metrics(rows)
    measured = [point["entropy_change"] for point in curve]
    for name in ("covariance", "covariance_pg", "first_order_change", "entropy_change"):
        metrics[f"{name}_mean"] = math.fsum(point[name] for point in curve) / len(curve)
    for name, sign in (("covariance", -1.0), ("covariance_pg", -1.0), ("first_order_change", 1.0)):
        predicted = [sign * point[name] for point in curve]
        agree = [p * m > 0 for p, m in zip(predicted, measured) if p != 0 and m != 0]
        metrics[f"{name}_sign_agreement"] = sum(agree) / len(agree) if agree else None
        metrics[f"{name}_correlation"] = _correlation(predicted, measured)
    metrics["entropy_mean"] = math.fsum(point["entropy"] for point in curve) / len(curve)
    return {"metrics": metrics, "curve": curve}


def answer_shape(task, tokens, truncated):
    """The shape of one Countdown response: each digit written "n", each other token as itself, the EOS
    left out, "..." after a response cut at the cap ("n+n-n", "n+", "n+n+n+n..."). Two responses of one
    shape differ only in the numbers they write."""
    body = [token for token in tokens if token != task.eos_id]
    shape = "".join("n" if token <= 9 else task.vocab[token] for token in body)  # digit d has id d
    return shape + ("..." if truncated else "")


def answer_pattern(task, tokens, truncated):
    """A response's opening, the shape up to its first operator: "n+" (a sum first), "n-" (a difference
    first), or the whole shape of one without an operator ("n", "n..."). The SFT start of the lab writes
    "n+" in about two responses of three: a frequent pattern that many shapes share."""
    return answer_shape(task, tokens, truncated)[:2]


def patterns_of(task, completion_ids, real, truncated):
    """The `answer_pattern` of every response of a batch: completion_ids (N, R), real (N, R), truncated (N,)."""
    return [answer_pattern(task, ids[:kept], cut) for ids, kept, cut in zip(
        completion_ids.tolist(), real.sum(dim=1).tolist(), truncated.tolist())]


def test_patterns(state, samples, generator):
    """The `answer_pattern` of `samples` responses to every test prompt (prompt-major), sampled by the run's
    current policy from `generator`."""
    prompts = state.task.split_prompts("test").repeat_interleave(samples)  # (P,) -> (P*S,)
    drawn = state.policy.sample(prompts, generator)
    return patterns_of(state.task, drawn.completion_ids, drawn.real, drawn.truncated)


def share_of(patterns, pattern):
    return sum(item == pattern for item in patterns) / len(patterns)


@runner(trains=True, transformer=True)
def run_spurious(seed, pattern_samples=8, **options):
    """A transformer run (a random reward, say) that measures the SFT start's most frequent answer pattern
    (`answer_pattern`) among `pattern_samples` sampled responses per test prompt, before and after training
    (the same generator seed both times, apart from the run's), and its share in every training batch.
    Metrics: run_online's, the top pattern's share before and after and the change, the exact test success
    before and after (the pattern itself, a string, stays out of the table: "n+" in every committed run);
    curve: the share per batch, the exact test success, the clip fraction."""
    state = online_tokens.setup(seed=seed, **TRANSFORMER, **options)
    before = test_patterns(state, pattern_samples, torch.Generator().manual_seed(seed))
    counts = {}
    for pattern in before:  # the first of the most frequent in the order drawn: deterministic
        counts[pattern] = counts.get(pattern, 0) + 1
    top = max(counts, key=counts.get)
    curve = []

    def observe(state, batch, credit, row):
        patterns = patterns_of(state.task, batch.completion_ids, batch.real, batch.truncated)
        curve.append({"step": row["step"], "pattern_share": share_of(patterns, top),
                      "test_success_probability": row["test_success_probability"],
                      "clip_fraction": row["clip_fraction"]})

    rows, _ = online_tokens.run(state, observe=observe)
    after = test_patterns(state, pattern_samples, torch.Generator().manual_seed(seed))
    metrics = online_metrics(rows)
    metrics.update({
        "pattern_share_before": share_of(before, top),
        "pattern_share_after": share_of(after, top),
        "pattern_share_change": share_of(after, top) - share_of(before, top),
        "initial_test_success_probability": rows[0]["test_success_probability"],
        "final_test_success_probability": rows[-1]["test_success_probability"],
        "test_success_change": rows[-1]["test_success_probability"] - rows[0]["test_success_probability"],
    })
    curve.insert(0, {"step": 0, "pattern_share": None,
                     "test_success_probability": rows[0]["test_success_probability"], "clip_fraction": None})
    return {"metrics": metrics, "curve": curve}


@runner(trains=True, transformer=True)
def run_reward_hacking(seed, window=LAST, **options):
    """A transformer run on a flawed verifier's reward (verifier_loophole): per batch, the mean proxy
    reward (trained on) and the true one (the correct verifier) and their gap, against the batch's KL to
    the reference. Metrics: run_online's, each mean over the first and the last `window` iterations
    (_head, _tail), the gap's growth (tail minus head) and the final exact train and test success."""
    state = online_tokens.setup(seed=seed, **TRANSFORMER, **options)
    rows, _ = online_tokens.run(state)
    trained = rows[1:]  # row 0 samples nothing

    def mean(column, part):
        return math.fsum(row[column] for row in part) / len(part)

    metrics = online_metrics(rows)
    for name, part in (("head", trained[:window]), ("tail", trained[-window:])):
        metrics[f"proxy_reward_{name}"] = mean("proxy_reward_mean", part)
        metrics[f"true_reward_{name}"] = mean("true_reward_mean", part)
        metrics[f"reward_gap_{name}"] = metrics[f"proxy_reward_{name}"] - metrics[f"true_reward_{name}"]
        metrics[f"kl_{name}"] = mean("kl_reference", part)
    metrics["reward_gap_growth"] = metrics["reward_gap_tail"] - metrics["reward_gap_head"]
    metrics["final_test_success_probability"] = rows[-1]["test_success_probability"]
    curve = [{"step": row["step"], "kl_reference": row["kl_reference"] if index else None,
              **{name: row[name] if index else None for name in ("proxy_reward_mean", "true_reward_mean")},
              "reward_gap": row["proxy_reward_mean"] - row["true_reward_mean"] if index else None,
              "success_probability": row["success_probability"]}
             for index, row in enumerate(rows)]
    return {"metrics": metrics, "curve": curve}


@runner(trains=True, transformer=True)
def run_dpo_displacement(seed, **options):
    """A transformer DPO run (offline pairs unless said otherwise) that follows its pairs: after each update,
    over the batch's pairs, the current policy's summed log-prob of the chosen and of the rejected responses
    minus the reference's (the SFT start's) on the same responses, their difference (the margin DPO
    raises), and in how many token positions each pair differs (online_algorithms.pair_distances).
    Likelihood displacement (Razin et al., arXiv 2410.08847) is a chosen change below 0 while the margin
    grows. Metrics: each of those averaged over the last LAST iterations (_tail), the first iteration's,
    and the final test success."""
    state = online_tokens.setup(seed=seed, **TRANSFORMER, algorithm="dpo", **options)
    curve = [{"step": 0, "chosen_logp_change": None, "rejected_logp_change": None, "margin": None,
              "chosen_logp": None, "pair_distance": None}]

    def observe(state, batch, credit, row):
        chosen, rejected = credit.chosen, credit.rejected
        point = {"step": row["step"]}
        if chosen.numel() == 0:  # every group tied: no pair, no step
            curve.append({**point, **{name: None for name in curve[0] if name != "step"}})
            return
        rows = torch.cat([chosen, rejected])  # (2K,)
        with torch.no_grad():
            logps = logps_of_tokens(state.policy.logits(batch.prompts[rows], batch.completion_ids[rows]),
                                    batch.completion_ids[rows])  # (2K, R)
        mask = batch.mask[rows]
        now = rl_lab.masked(logps, mask).sum(dim=1)  # (2K,) summed over each response's kept tokens
        start = rl_lab.masked(batch.ref_logps[rows], mask).sum(dim=1)
        change = (now - start).reshape(2, -1)  # (2K,) -> (2, K): chosen, rejected
        distances = differing_positions(batch.completion_ids, batch.real, chosen, rejected)  # (K,)
        curve.append({**point, "chosen_logp_change": change[0].mean().item(),
                      "rejected_logp_change": change[1].mean().item(),
                      "margin": (change[0] - change[1]).mean().item(),
                      "chosen_logp": now[: chosen.numel()].mean().item(),
                      "pair_distance": distances.double().mean().item()})

    rows, _ = online_tokens.run(state, observe=observe)
    metrics = {"final_test_success_probability": rows[-1]["test_success_probability"],
               "initial_test_success_probability": rows[0]["test_success_probability"]}
    for name in ("chosen_logp_change", "rejected_logp_change", "margin", "chosen_logp", "pair_distance"):
        values = [point[name] for point in curve[-LAST:] if point[name] is not None]
        metrics[f"{name}_tail"] = math.fsum(values) / len(values) if values else None
    first = next((point for point in curve[1:] if point["chosen_logp"] is not None), None)
    metrics["chosen_logp_first"] = None if first is None else first["chosen_logp"]
    for point, row in zip(curve, rows):
        point["test_success_probability"] = row["test_success_probability"]
    return {"metrics": metrics, "curve": curve}


# discover-or-sharpen: RL from SFT starts whose demonstrations hold the subtraction family at a chosen share
DISCOVERY_KS = (1, 16, 256)  # pass@k exactly, 1 - (1 - p)^k: 256 is "large k" (Yue et al. sample up to 256)
COVERED = 0.5  # a test prompt is covered at k when pass@k >= this (more likely solved than not in k samples)


@torch.no_grad()
def solution_probabilities(model, task, prompts):
    """Per prompt of `prompts` (global indices), the exact probability of each of its solutions under
    `model` at temperature 1: a list of lists of floats, in task.solutions order. Teacher forcing, as
    sft.exact_success, whose per-prompt sums these are."""
    pairs = [(prompt, solution) for prompt in prompts for solution in task.solutions(prompt)]
    ids, attention, completion = sft.pair_batch(task, [prompt for prompt, _ in pairs],
                                                [solution for _, solution in pairs])
    was_training = model.training
    model.eval()
    try:
        log_probs = completion_log_probs(model, ids, attention, completion)  # (N, T-1), 0 off the completion
    finally:
        model.train(was_training)
    flat = log_probs.double().sum(dim=1).exp().tolist()  # (N,) one per (prompt, solution) pair
    result, start = [], 0
    for prompt in prompts:
        count = len(task.solutions(prompt))
        result.append(flat[start:start + count])
        start += count
    return result


def family_evaluation(model, task, prompts):
    """What the model can sample on the test `prompts`, exactly: per prompt its success p (pass@1) and
    pass@k = 1 - (1 - p)^k for k in DISCOVERY_KS (the probability that k independent samples hold a
    correct one), and the probability of a correct answer that uses a subtraction. Returns
    (metrics, covered): metrics over the family's prompts (those whose every solution subtracts) and the
    others, and the family's share of the correct answers' probability over every prompt; covered: the
    set of prompts with pass@256 >= COVERED."""
    probabilities = solution_probabilities(model, task, prompts)
    success = [math.fsum(row) for row in probabilities]
    subtracting = [math.fsum(p for p, solution in zip(row, task.solutions(prompt))
                             if sft.uses_subtraction(task, solution)) for row, prompt in zip(probabilities, prompts)]
    family = [all(sft.uses_subtraction(task, solution) for solution in task.solutions(prompt)) for prompt in prompts]
    metrics = {}
    for group, members in (("family", [i for i, f in enumerate(family) if f]),
                           ("other", [i for i, f in enumerate(family) if not f])):
        for k in DISCOVERY_KS:
            metrics[f"{group}_pass@{k}"] = math.fsum(1.0 - (1.0 - success[i]) ** k for i in members) / len(members)
    metrics["family_share"] = math.fsum(subtracting) / math.fsum(success)
    covered = {prompt for prompt, p in zip(prompts, success) if 1.0 - (1.0 - p) ** DISCOVERY_KS[-1] >= COVERED}
    metrics["covered"] = len(covered)
    return metrics, covered


def transformer_run_from(model, seed, task=None, **options):
    """An online_tokens Run of the transformer policy `model` (its SFT start, trained elsewhere) as
    online_tokens.setup builds one, whose own start is the default SFT model; on `task` (None: the
    settings' task, TASKS[cfg.task])."""
    cfg = resolve({"policy": "transformer", "seed": seed, **options})
    task = TASKS[cfg.task](cfg.max_new_tokens) if task is None else task
    sampler_dtype = None if cfg.sampler_dtype is None else policies.DTYPES[cfg.sampler_dtype]
    policy = policies.TransformerPolicy(model.to(policies.DTYPES[cfg.dtype]), task, cfg.temperature,
                                        cfg.max_new_tokens, sampler_dtype, cfg.use_cache, cfg.position_ids)
    family = FAMILIES[family_of(cfg.algorithm)]
    generator = torch.Generator(device=rl_lab.DEVICE).manual_seed(cfg.seed)
    algorithm = family(cfg, policy.critic(cfg.cap_value) if family.needs_critic else None, generator)
    return online_tokens.Run(
        cfg=cfg, task=task, policy=policy, reference=policy.snapshot(), algorithm=algorithm,
        optimizer=torch.optim.Adam(policy.parameters() + algorithm.parameters(), lr=cfg.learning_rate),
        generator=generator,
        evaluation={split: online_tokens.solution_batch(
            task, online_tokens.evaluated_prompts(task, split, cfg.eval_prompts), cfg.max_new_tokens)
            for split in ("train", "test")},
        columns=online_tokens.COLUMNS + online_tokens.TRANSFORMER_COLUMNS + algorithm.extra_columns)


@runner(trains=True, transformer=True)
def run_discover_or_sharpen(seed, subtraction_share, **options):
    """GRPO (or the algorithm given) on the transformer from the SFT start whose correct demonstrations use a
    subtraction at `subtraction_share` (sft.subtraction_demonstrations; one start per share and SFT seed,
    cached in sft_folder: the engine sets the SFT seed to the run's seed). Metrics, exactly on every
    test prompt before (the start) and after RL: family_pass@k / other_pass@k, family_share, covered; and
    gained / lost, the test prompts covered after and not before, and the reverse."""
    cfg = resolve({"policy": "transformer", **options})
    task = TASKS[cfg.task](cfg.max_new_tokens)
    model, _, _ = sft.load_or_train(task, policies.sft_config_of(cfg, subtraction_share=subtraction_share),
                                    cfg.sft_folder)
    prompts = task.split_prompts("test").tolist()
    before, covered_before = family_evaluation(model, task, prompts)
    state = transformer_run_from(model, seed, **options)
    rows, _ = online_tokens.run(state)
    after, covered_after = family_evaluation(state.policy.model, task, prompts)
    metrics = {**online_metrics(rows), **{f"{name}_before": value for name, value in before.items()},
               **{f"{name}_after": value for name, value in after.items()},
               "gained": len(covered_after - covered_before), "lost": len(covered_before - covered_after)}
    for name in before:
        metrics[f"{name}_change"] = after[name] - before[name]
    points = [{"step": row["step"], "success_probability": row["success_probability"],
               "test_success_probability": row["test_success_probability"]} for row in rows]
    return {"metrics": metrics, "curve": points}


# forgetting: a second skill in the SFT mix that RL never sees; GRPO against rejection fine-tuning (RFT)
SKILL_SHARE = 0.2  # share of the SFT demonstrations that show the second skill
SKILL_PROMPTS = 128  # the second skill's evaluated demonstrations: the first train prompts' number sets
FORGETTING_ARMS = ("grpo", "rft")


def skill_pair(task, prompt):
    """The second skill's (prompt tokens, response tokens) for a Countdown prompt's numbers: the prompt
    BOS, the numbers, '=' (no ':' and no target: the RL task always has them), and the response their sum
    written out, n1+n2+...+EOS. The tokenizer already covers it; the RL task's prompts never take this form."""
    numbers = task.prompt_numbers(prompt)
    response = [token for number in numbers for token in (task.vocab.index("+"), number)][1:] + [task.eos_id]
    return [task.bos_id, *numbers, task.vocab.index("=")], response


def token_pair_batch(task, pairs):
    """(input_ids, attention_mask, completion_mask), each (N, P + R) int64, from N (prompt tokens, response
    tokens) pairs: the layout of sft.pair_batch (left padding, prompt, response, right padding) for prompts
    given as tokens, so that two prompt formats share one batch."""
    width = max(len(prompt) for prompt, _ in pairs)
    length = max(len(response) for _, response in pairs)
    rows, attention, completion = [], [], []
    for prompt, response in pairs:
        left, right = width - len(prompt), length - len(response)
        rows.append([task.pad_id] * left + list(prompt) + list(response) + [task.pad_id] * right)
        attention.append([0] * left + [1] * (len(prompt) + len(response)) + [0] * right)
        completion.append([0] * (left + len(prompt)) + [1] * len(response) + [0] * right)
    return tuple(torch.tensor(part, dtype=torch.long) for part in (rows, attention, completion))


_MIXED_STARTS = {}  # (sft steps, seed) -> the trained state_dict: one SFT start per seed, trained once per process


def mixed_sft_start(task, steps, seed):
    """A TinyLM trained as sft.train_sft trains (its defaults: Adam, the schedule, the clip, the batch size)
    on a mix: each of sft.SFTConfig().demonstrations (at most steps x batch size) is, with probability
    SKILL_SHARE, the second skill's pair (skill_pair) for the prompt the task drew, else the task's own.
    Seeded by `seed` (the demonstrations, the weights, the order), so every seed has its own start."""
    key = (steps, seed)
    config = sft.SFTConfig(steps=max(steps, 1), seed=seed)
    model_config = config.model_config(task)
    if key not in _MIXED_STARTS:
        generator = torch.Generator().manual_seed(seed)
        # no more demonstrations than the steps can use: the same set at the default size, fewer at --quick
        demonstrations = task.demonstrations(min(config.demonstrations, config.steps * config.batch_size), generator)
        draws = torch.rand(len(demonstrations), generator=generator, dtype=torch.float64).tolist()
        prompt_tokens = task.prompt_tokens([prompt for prompt, _ in demonstrations])
        pairs = [skill_pair(task, prompt) if u < SKILL_SHARE else (tokens, list(response))
                 for (prompt, response), tokens, u in zip(demonstrations, prompt_tokens, draws)]
        model = sft.TinyLM(model_config, generator=generator).to(sft.DTYPE)
        _sft_stage(model, token_pair_batch(task, pairs), steps, config, generator)
        _MIXED_STARTS[key] = {name: value.clone() for name, value in model.state_dict().items()}
    model = sft.TinyLM(model_config).to(sft.DTYPE)
    model.load_state_dict(_MIXED_STARTS[key])
    return model.eval()


@torch.no_grad()
def skill_measures(model, batch):
    """The second skill under `model`: (mean NLL per response token of its demonstrations `batch`, a
    token_pair_batch; the mean over them of the exact probability of writing the demonstration, exp(-sum))."""
    was_training = model.training
    model.eval()
    try:
        log_probs = completion_log_probs(model, *batch).double()  # (N, T-1), 0 off the completion
    finally:
        model.train(was_training)
    nll = -log_probs.sum() / batch[2][:, 1:].sum()
    return nll.item(), log_probs.sum(dim=1).exp().mean().item()


def pearson(xs, ys):
    """The sample correlation of two equal-length lists; None when either is constant."""
    mx, my = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    sxy = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = math.fsum((x - mx) ** 2 for x in xs), math.fsum((y - my) ** 2 for y in ys)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def rft_step(state, batch):
    """One Adam step of supervised fine-tuning on the batch's correct responses (rejection fine-tuning):
    the mean NLL per token of their kept tokens under the current policy. No step when none is correct.
    Returns how many responses it kept."""
    correct = state.task.correct(batch.rewards)  # (N,) bool
    if not bool(correct.any()):
        return 0
    logps = logps_of_tokens(state.policy.logits(batch.prompts[correct], batch.completion_ids[correct]),
                            batch.completion_ids[correct])  # (K, R)
    mask = batch.mask[correct].to(logps.dtype)
    online_tokens.clip_grad_norm_step(state, -(logps * mask).sum() / mask.sum())
    return int(correct.sum())


def forward_kl(state, start_batch):
    """KL(pi_0 ‖ pi) on the RL task in nats per response, RL's Razor's predictor of forgetting: the mean over the
    start's own samples (the first batch, drawn from pi_0) of sum_t (log pi_0 - log pi) over each response's
    tokens, an unbiased estimate (k1 on pi_0's samples). No gradient."""
    with torch.no_grad():
        logps = logps_of_tokens(state.policy.logits(start_batch.prompts, start_batch.completion_ids),
                                start_batch.completion_ids)  # (N, R)
        mask = start_batch.mask.to(logps.dtype)
        return ((start_batch.ref_logps - logps) * mask).sum(dim=1).mean().item()


@runner(trains=True, transformer=True, starts=None)  # its mixed start is trained inside the run, per seed
def run_forgetting(seed, arm, gain, **options):
    """From an SFT start that knows the RL task (Countdown) and a second skill (skill_pair: write the sum of the
    numbers), trained per seed (mixed_sft_start), train on Countdown only: arm "grpo" (online_tokens' update of
    the algorithm given) or "rft" (rft_step on the batch's correct samples), one Adam step per iteration on B*G
    fresh samples each. Before each iteration's update: the exact train success (the evaluated prompts), the
    forward KL(pi_0 || pi) on the RL task (`forward_kl`, on pi_0's first batch: the paper's predictor; kl_*
    metrics), the reverse KL(pi || pi_0) on the batch's own samples (reverse_kl_*), and the second skill's NLL
    and exact success on SKILL_PROMPTS demonstrations. Metrics: each at the start and the end, forgetting
    (the NLL's rise), the same at the first iteration whose success reaches the start's plus `gain` (the
    matched gain; the end when never reached, with reached 0), and the within-run correlation of the
    forgetting with the KL over the iterations."""
    cfg = resolve({"policy": "transformer", **options})
    task = TASKS[cfg.task](cfg.max_new_tokens)
    model = mixed_sft_start(task, cfg.sft_steps, seed)
    skill = token_pair_batch(task, [skill_pair(task, prompt) for prompt in task.split_prompts("train")[:SKILL_PROMPTS]
                                    .tolist()])
    state = transformer_run_from(model, seed, **options)
    curve, start_batch = [], None
    for step in range(cfg.steps + 1):
        success = online_tokens.evaluate(state)["success_probability"]
        nll, skill_success = skill_measures(state.policy.model, skill)
        batch = online_tokens.rollout(state)
        start_batch = batch if start_batch is None else start_batch  # pi_0's own samples: the first batch
        curve.append({"step": step, "success_probability": success, "kl_reference": batch.kl_reference,
                      "kl_forward": forward_kl(state, start_batch),
                      "skill_nll": nll, "skill_success": skill_success, "forgetting": nll - (curve[0]["skill_nll"]
                                                                                           if curve else nll)})
        if step == cfg.steps:
            break  # the last batch only measures the KL of the final policy
        if arm == "rft":
            rft_step(state, batch)
        else:
            online_tokens.update(state, batch, state.algorithm.credit(batch))
    first, last = curve[0], curve[-1]
    matched = next((point for point in curve if point["success_probability"] >= first["success_probability"] + gain),
                   None)
    at = last if matched is None else matched
    metrics = {"success_start": first["success_probability"], "success_end": last["success_probability"],
               "skill_nll_start": first["skill_nll"], "skill_nll_end": last["skill_nll"],
               "skill_success_start": first["skill_success"], "skill_success_end": last["skill_success"],
               "kl_end": last["kl_forward"], "reverse_kl_end": last["kl_reference"], "forgetting_end": last["forgetting"],
               "reached": int(matched is not None), "step_at_gain": at["step"], "kl_at_gain": at["kl_forward"],
               "reverse_kl_at_gain": at["kl_reference"],
               "forgetting_at_gain": at["forgetting"], "success_at_gain": at["success_probability"],
               "kl_forgetting_correlation": pearson([p["kl_forward"] for p in curve[1:]],
                                                    [p["forgetting"] for p in curve[1:]]) if len(curve) > 2 else None,
               "reverse_kl_forgetting_correlation": pearson([p["kl_reference"] for p in curve[1:]],
                                                            [p["forgetting"] for p in curve[1:]])
               if len(curve) > 2 else None}
    return {"metrics": metrics, "curve": curve}


# r1-zero: a task where writing the running results helps (running_total.py), from an SFT start per seed that
# can write them and rarely does
R1_SKILL_STEPS = 600  # SFT on demonstrations that all write the items before the answer: the start learns the skill
R1_ANSWER_STEPS = 400  # then SFT on the task's own mix, mostly direct answers: it learns to rarely use it
R1_ANSWER_LEARNING_RATE = 1e-3  # the second stage's peak Adam rate, a third of the first's (sft's default)
R1_SCRATCH_SHARE = 0.1  # share of the second stage's demonstrations that write the items
R1_MAX_NEW_TOKENS = 16  # the response cap of the r1-zero runs unless they give one: room past the full scratchpad (11)
R1_MEASURES = ("accuracy", "length", "partial_share", "accuracy_partial", "accuracy_direct")  # r1_zero_measures
_R1_STARTS = {}  # (task config, steps, seed) -> the trained state_dict: one start per seed, trained once per process


def _sft_stage(model, batch, steps, config, generator):
    """`steps` Adam steps of sft.train_sft's recipe on batch = (ids, attention, completion) (M, T) each: `config`'s
    batch size, clip and schedule (peak config.learning_rate over config.steps), sft's betas, a fresh Adam,
    batches drawn as shuffled passes from `generator`. The model ends in eval mode."""
    ids, attention, completion = batch
    optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, betas=sft.ADAM_BETAS, eps=sft.ADAM_EPS,
                                 foreach=True)
    per_pass = len(ids) // config.batch_size
    model.train()
    for step in range(1, steps + 1):
        if (step - 1) % per_pass == 0:
            order = torch.randperm(len(ids), generator=generator)
        rows = order[((step - 1) % per_pass) * config.batch_size:][:config.batch_size]
        loss = sft._training_loss(model, ids[rows], attention[rows], completion[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=True)
        for group in optimizer.param_groups:
            group["lr"] = sft.learning_rate_at(step, config)
        optimizer.step()
    model.eval()


@functools.lru_cache(maxsize=None)  # a task is read, never written: building its 20,512 prompts once a process
def r1_zero_task(scratchpad, max_new_tokens, scratch_share=R1_SCRATCH_SHARE):
    """The running-total task of the r1-zero runs: its demonstrations' items are `scratchpad` ("running"
    results, or "noise"), a share scratch_share of them write items."""
    return RunningTotalTask(RunningTotalConfig(scratchpad=scratchpad, scratch_share=scratch_share,
                                               max_new_tokens=max_new_tokens))


def r1_zero_start(seed, scratchpad, skill_steps=R1_SKILL_STEPS, answer_steps=R1_ANSWER_STEPS,
                  max_new_tokens=R1_MAX_NEW_TOKENS, **options):
    """The SFT start of seed `seed`, a TinyLM of sft.SFTConfig's size (float32, eval mode), trained in two stages
    from one generator seeded by `seed` (the demonstrations, the weights, the order): skill_steps steps on
    demonstrations that all write the items before the answer (the running results, or noise), then
    answer_steps steps at R1_ANSWER_LEARNING_RATE on the task's mix, a share R1_SCRATCH_SHARE writing them.
    Each stage draws steps x 64 demonstrations (each seen once). The first stage plays the pretrained model
    that can write out a computation, the second the tuning that makes it answer at once. Other options are
    the run's (ignored here)."""
    task = r1_zero_task(scratchpad, max_new_tokens)
    key = (task.config, skill_steps, answer_steps, seed)
    config = sft.SFTConfig(seed=seed)
    if key not in _R1_STARTS:
        generator = torch.Generator().manual_seed(seed)
        model = sft.TinyLM(config.model_config(task), generator=generator).to(sft.DTYPE)
        with torch.enable_grad(), torch_threads(1):  # one thread, as sft.train_sft: the same bits everywhere
            for steps, share, learning_rate in ((skill_steps, 1.0, config.learning_rate),
                                                (answer_steps, R1_SCRATCH_SHARE, R1_ANSWER_LEARNING_RATE)):
                if steps:
                    stage = r1_zero_task(scratchpad, max_new_tokens, share)
                    pairs = stage.demonstrations(steps * config.batch_size, generator)
                    _sft_stage(model, sft.pair_batch(stage, *zip(*pairs)), steps,
                               sft.SFTConfig(steps=steps, learning_rate=learning_rate), generator)
        _R1_STARTS[key] = {name: value.clone() for name, value in model.state_dict().items()}
    model = sft.TinyLM(config.model_config(task)).to(sft.DTYPE)
    model.load_state_dict(_R1_STARTS[key])
    return model.eval()


@torch.no_grad()
def r1_zero_measures(state, samples, generator):
    """The run's current policy on every test prompt, `samples` responses each (prompt-major), sampled from
    `generator`: accuracy (the verifier's), mean length (tokens, EOS included), the share that writes items
    before the answer (task.writes_partials), and the accuracy of those and of the others (None: none)."""
    prompts = state.task.split_prompts("test").repeat_interleave(samples)  # (P,) -> (P*S,)
    drawn = state.policy.sample(prompts, generator)
    correct = state.task.correct(state.task.rewards(prompts, drawn.completion_ids, drawn.real, drawn.truncated))
    partial = torch.tensor([state.task.writes_partials(ids[:kept]) for ids, kept in zip(
        drawn.completion_ids.tolist(), drawn.real.sum(dim=1).tolist())], dtype=torch.bool)  # (P*S,)

    def accuracy(rows):
        return correct[rows].double().mean().item() if bool(rows.any()) else None

    return {"accuracy": correct.double().mean().item(), "length": drawn.real.sum(dim=1).double().mean().item(),
            "partial_share": partial.double().mean().item(), "accuracy_partial": accuracy(partial),
            "accuracy_direct": accuracy(~partial)}


@runner(trains=True, transformer=True, starts=None)  # its two-stage start is trained inside the run, per seed
def run_r1_zero(seed, scratchpad, skill_steps=R1_SKILL_STEPS, answer_steps=R1_ANSWER_STEPS, measure_every=10,
                measure_samples=2, **options):
    """GRPO (or the algorithm given) on the running-total task from the seed's SFT start (r1_zero_start) whose
    items before the answer are `scratchpad`. Every measure_every iterations and at the end, the policy
    on every test prompt, measure_samples responses each (r1_zero_measures, from a generator seeded by the
    run's seed, apart from the run's): accuracy, length, the share writing items, and the accuracy with and
    without them. Metrics: each at the start (the SFT start) and the end, and the change; curve: those
    points, with the batch's mean length and reward at every iteration."""
    options = {"max_new_tokens": R1_MAX_NEW_TOKENS, **options}
    cfg = resolve({"policy": "transformer", **options})
    task = r1_zero_task(scratchpad, cfg.max_new_tokens)
    model = r1_zero_start(seed, scratchpad, skill_steps, answer_steps, cfg.max_new_tokens)
    state = transformer_run_from(model, seed, task=task, **options)
    generator = torch.Generator().manual_seed(seed)
    curve = []
    for step in range(cfg.steps + 1):  # step 0 measures the start; step s, the policy after s updates
        point = {"step": step, "batch_length": None, "batch_reward": None,  # None: not measured at this step
                 **{f"test_{name}": None for name in R1_MEASURES}}
        if step:
            batch = online_tokens.rollout(state)
            online_tokens.update(state, batch, state.algorithm.credit(batch))
            point.update(batch_length=batch.mask.sum(dim=1).double().mean().item(),
                         batch_reward=batch.rewards.mean().item())
        if step % measure_every == 0 or step == cfg.steps:
            point.update({f"test_{name}": value for name, value in r1_zero_measures(state, measure_samples,
                                                                                     generator).items()})
        curve.append(point)
    first, final = curve[0], {name[len("test_"):]: value for name, value in curve[-1].items() if name[:5] == "test_"}
    metrics = {}
    for name in R1_MEASURES:
        start, end = first[f"test_{name}"], final[name]
        metrics.update({f"{name}_start": start, f"{name}_end": end,
                        f"{name}_change": None if start is None or end is None else end - start})
    return {"metrics": metrics, "curve": curve}
