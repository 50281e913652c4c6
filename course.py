"""The course's numbers: every value a chapter of docs/learn/ quotes or draws, computed from the atoms.

    python course.py                                # every chapter -> results-course/<chapter>.json + figures
    python course.py --chapter 05-trust-regions     # one chapter
    python -m unittest -v test_course

Each chapter of the course (docs/learn/NN-name.md) has one function here, `chapter_NN()`, that
computes what the chapter shows from the lab's atoms (rl_lab.py) and its small problems: exact
expectations on the bandit where an expectation is known in closed form, seeded samples beside them
where the point is how a sampled estimate behaves. It returns a JSON-able dict; plot_course.py draws
the chapter's figures from that dict alone. make_docs.py renders the numbers into the chapters, so no
number in the course is typed by hand.

Everything runs in float64 on one thread with one seeded torch.Generator per chapter: the same
command gives byte-identical files on one machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from lab.io import OneLineErrorParser, flags_first, json_text, output_folder_or_exit, run_cli, write_files

HERE = os.path.dirname(os.path.abspath(__file__))  # the committed run of chapter 10 is read from here
OUTPUT = "results-course"
SEED = 7

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------

# The chapters in the course's order (docs/learn/<name>.md), each with the names of the figures
# plot_course.FIGURES draws for it: its keys, here without matplotlib (test_cli checks that the two agree).
CHAPTER_FIGURES = {
    "01-log-probabilities": ("shift",),
    "02-policy-gradient": ("sample-error",),
    "03-baselines-and-gae": ("variance", "gae-weights", "lambda"),
    "04-reusing-a-batch": ("corrections", "second-pass"),
    "05-trust-regions": ("clip", "weights", "sapo-gate", "dppo-region", "gmpo-clip", "sequence-weights"),
    "06-kl-regularized-objective": ("beta", "estimators"),
    "07-preferences": ("losses",),
    "08-groups": ("weights",),
    "09-sequences": ("token-weights", "overlong"),
    "10-the-whole-loop": ("passk", "estimator", "entropy-mask"),
}


def file_names(chapter):
    """The names of the files a chapter writes: its JSON, then each of its figures."""
    return [f"{chapter}.json"] + [f"{chapter}-{name}.svg" for name in CHAPTER_FIGURES[chapter]]


def build_parser():
    parser = OneLineErrorParser(
        prog="course.py",
        description="Compute the numbers and figures of the course (docs/learn/) from the atoms.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--chapter", choices=("all", *CHAPTER_FIGURES), default="all",
                        help="one chapter, or all of them")
    parser.add_argument("--output", default=OUTPUT, help="the folder for the JSON reports and figures")
    return parser


def parse(argv=None):
    """The flags, with every file of the output checked before any work (a bad one exits 2 with one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    chapters = list(CHAPTER_FIGURES) if args.chapter == "all" else [args.chapter]
    # a folder, link or pipe where one of the files goes is refused with the flag
    output_folder_or_exit(parser, args.output, [name for chapter in chapters for name in file_names(chapter)])
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch and the atoms after the flags: `import torch` takes a second or more, --help none of it
import torch

import countdown  # pass@k, chapter 10
from lab.checks import torch_threads
import rl_lab  # noqa: F401  the atoms every chapter is built from


def _rounded(value, digits=12):
    """`value` (a float, tensor, or nested list/dict of them) as plain floats rounded to `digits`
    significant digits, so that the JSON does not carry the last bits that differ between CPUs."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: _rounded(item, digits) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item, digits) for item in value]
    return value


# ---------------------------------------------------------------------------------------------
# Chapter 1: probabilities and log-probabilities of a policy; the causal shift and masks
# ---------------------------------------------------------------------------------------------

# A five-token vocabulary with EOS = PAD, as in token_objectives.py: the position, not the id, decides.
VOCABULARY_01 = ["BOS", "prompt", "good", "bad", "EOS/PAD"]
EOS_01 = 4
# one sequence: BOS prompt | good bad EOS | PAD; the response is positions 2-4 (its EOS included)
INPUT_IDS_01 = [0, 1, 2, 3, 4, 4]
RESPONSE_MASK_01 = [False, False, True, True, True, False]
# (T, V) logits, one row per position; row t scores the token at t+1 (typed here so a reader can redo them)
LOGITS_01 = [
    [0.0, 2.0, 0.5, 0.0, -1.0],
    [0.0, 0.0, 1.5, 0.5, 0.0],
    [0.0, 0.0, 0.5, 1.0, 0.5],
    [0.0, 0.0, 0.0, 0.5, 2.0],
    [0.0, 0.0, 0.0, 0.0, 3.0],
    [0.0, 0.0, 0.0, 0.0, 0.0],
]
UNDERFLOW_TOKENS_01 = 200  # a response of 200 tokens, each of probability 0.01
UNDERFLOW_PROBABILITY_01 = 0.01


def chapter_01():
    logits = torch.tensor([LOGITS_01], dtype=rl_lab.DTYPE)  # (B=1, T, V)
    input_ids = torch.tensor([INPUT_IDS_01])  # (1, T)
    response_mask = torch.tensor([RESPONSE_MASK_01])  # (1, T)
    token_logps, valid = rl_lab.response_token_logps(logits, input_ids, response_mask)  # (1, T-1) each
    probabilities = torch.softmax(logits[0], dim=-1)  # (T, V): row t is p(next token | tokens 0..t)
    completion = torch.tensor([INPUT_IDS_01[2:]])  # (1, R): the sampled completion good bad EOS PAD
    pad_mask = torch.tensor([RESPONSE_MASK_01[2:]])  # True on the real positions; the last one is padding
    kept = rl_lab.completion_mask(completion, EOS_01, pad_mask)
    # the classic mistake: dropping every id equal to EOS also drops the real EOS (EOS = PAD here)
    by_id = (completion != EOS_01).long()
    product = 1.0
    for _ in range(UNDERFLOW_TOKENS_01):
        product *= UNDERFLOW_PROBABILITY_01
    return {
        "vocabulary": VOCABULARY_01, "eos_token_id": EOS_01, "input_ids": INPUT_IDS_01,
        "response_mask": RESPONSE_MASK_01, "logits": LOGITS_01,
        "probabilities": probabilities,
        "row_sums": probabilities.sum(dim=-1),
        # shifted: entry t is row t's log-prob of token t+1; 0 where the token is not scored
        "targets": INPUT_IDS_01[1:],
        "token_logps": token_logps[0],
        "valid": valid[0].tolist(),
        "token_probabilities": token_logps[0].exp().where(valid[0], torch.zeros(())),
        "sequence_logp": token_logps[0].sum(),
        "sequence_probability": token_logps[0].sum().exp(),
        "completion_ids": completion[0].tolist(),
        "completion_mask": kept[0].tolist(),
        "mask_by_id": by_id[0].tolist(),
        "underflow": {
            "tokens": UNDERFLOW_TOKENS_01, "token_probability": UNDERFLOW_PROBABILITY_01,
            "product_of_probabilities": product,  # 1e-400 is below float64's smallest number: exactly 0
            "sum_of_logps": UNDERFLOW_TOKENS_01 * math.log(UNDERFLOW_PROBABILITY_01),
        },
    }


# ---------------------------------------------------------------------------------------------
# Chapter 2: the policy gradient
# ---------------------------------------------------------------------------------------------

SAMPLE_SIZES_02 = [2**k for k in range(13)]  # 1 .. 4096 sampled (context, action) pairs per estimate
REPEATS_02 = 16  # independent estimates per sample size, all from the chapter's one generator


def _bandit_policy_gradient(logits, rewards):
    """The exact policy gradient of the bandit, dJ/dlogits (X, A), two ways: by the score-function sum
    over every (context, action) and by autograd of the exact expected reward. Contexts weigh equally."""
    with torch.enable_grad():
        table = logits.detach().clone().requires_grad_(True)
        logp = torch.log_softmax(table, dim=-1)  # (X, A)
        # sum over x and a of p(x) pi(a|x) R(x,a) grad log pi(a|x): a REINFORCE loss weighted by probabilities
        weights = logp.exp().detach() / logits.shape[0]
        (score,) = torch.autograd.grad((-rl_lab.reinforce_loss(logp, rewards) * weights).sum(), table)
        expected = (torch.log_softmax(table, dim=-1).exp() * rewards).sum(dim=-1).mean()  # J
        (autograd,) = torch.autograd.grad(expected, table)
    return score, autograd


def _per_sample_variance(logits, rewards):
    """E ||g_1 - E g_1||^2 (the trace of the covariance) of the one-sample estimator g_1 = R grad log pi(a|x),
    x uniform and a ~ pi(.|x), summed exactly over the (x, a) pairs. rewards may be any (X, A) table of
    what multiplies the score (a reward, or a reward minus a baseline)."""
    contexts, actions = logits.shape
    probs = torch.softmax(logits, dim=-1)  # (X, A)
    mean = torch.zeros_like(logits)
    second_moment = 0.0
    for x in range(contexts):
        for a in range(actions):
            score = -probs[x].clone()  # grad of log pi(a|x) w.r.t. row x of the logits: onehot(a) - pi(.|x)
            score[a] += 1.0
            weight = probs[x, a] / contexts
            sample = torch.zeros_like(logits)
            sample[x] = rewards[x, a] * score
            mean += weight * sample
            second_moment += weight * float((sample**2).sum())
    return second_moment - float((mean**2).sum()), mean


def chapter_02():
    rewards = rl_lab.reward_table()
    logits = torch.zeros_like(rewards)  # the uniform start of every bandit run
    score, autograd = _bandit_policy_gradient(logits, rewards)
    variance, mean = _per_sample_variance(logits, rewards)
    norm = float(score.norm())
    generator = torch.Generator().manual_seed(SEED)
    contexts, actions = rewards.shape
    errors = []
    for size in SAMPLE_SIZES_02:
        row = []
        for _ in range(REPEATS_02):
            x = torch.randint(contexts, (size,), generator=generator)  # (N,)
            with torch.enable_grad():
                table = logits.clone().requires_grad_(True)
                probs = torch.softmax(table, dim=-1).detach()
                a = torch.multinomial(probs[x], 1, generator=generator).squeeze(1)  # (N, 1) -> (N,)
                logp = torch.log_softmax(table, dim=-1)[x, a]  # (N,)
                # minimizing the mean REINFORCE loss ascends J: its gradient is minus the estimate
                (gradient,) = torch.autograd.grad(rl_lab.reinforce_loss(logp, rewards[x, a]).mean(), table)
            row.append(float((-gradient - score).norm()) / norm)
        errors.append(row)
    errors_t = torch.tensor(errors, dtype=rl_lab.DTYPE)  # (sizes, repeats)
    return {
        "rewards": rewards, "logits": logits,
        "exact_gradient": score, "autograd_gradient": autograd,
        "score_vs_autograd_max_abs": (score - autograd).abs().max(),
        "exact_gradient_norm": norm,
        "per_sample_variance": variance,
        "expected_reward": (torch.softmax(logits, dim=-1) * rewards).sum(dim=-1).mean(),
        "sample_sizes": SAMPLE_SIZES_02, "repeats": REPEATS_02,
        "relative_errors": errors_t,
        "relative_error_mean": errors_t.mean(dim=1),
        "relative_error_std": errors_t.std(dim=1),  # sample std over the repeats
        # the exact root-mean-square relative error of an N-sample mean: sqrt(variance / N) / |grad J|
        "relative_error_rms_exact": [math.sqrt(variance / size) / norm for size in SAMPLE_SIZES_02],
        "error_ratio_first_to_last": float(errors_t[0].mean() / errors_t[-1].mean()),
    }


# ---------------------------------------------------------------------------------------------
# Chapter 3: baselines, advantages, the critic, TD errors and GAE
# ---------------------------------------------------------------------------------------------

SHIFTS_03 = [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
GAE_LAMBDAS_03 = [0.0, 0.5, 0.9, 0.95, 1.0]
GAE_GAMMA_03 = 0.99  # rl_lab.gae's default
GAE_STEPS_03 = 30
# the three-step chain of the bias/variance example: each reward is 0 or 2 with probability 1/2 (mean 1)
CHAIN_REWARDS_03 = (0.0, 2.0)
CHAIN_STEPS_03 = 3
LAMBDA_GRID_03 = [round(0.1 * k, 1) for k in range(11)]
# a token response cut at the cap: 4 tokens, the verifier's partial credit on the last one
CUT_REWARDS_03 = [0.0, 0.0, 0.0, 0.25]
CUT_VALUES_03 = [0.3, 0.3, 0.3, 0.3]
CUT_VALUE_AFTER_03 = 0.3  # what the critic says about the state after the cap


def _gae_weights(gamma, lam, steps):
    """The weight of TD error k in A_0, read off the atom: with a zero critic delta_k = r_k, so a reward
    of 1 at the last step alone gives A_t = (gamma * lam) ** (steps - 1 - t)."""
    rewards = torch.zeros(steps, dtype=rl_lab.DTYPE)
    rewards[-1] = 1.0
    zeros = torch.zeros(steps, dtype=rl_lab.DTYPE)
    last = torch.zeros(steps, dtype=torch.bool)
    last[-1] = True
    advantages, _ = rl_lab.gae(rewards, zeros, zeros, last, last, gamma=gamma, lam=lam)
    return advantages.flip(0)  # index k: the weight of delta_k in A_0


def _lambda_return_moments(values, lam):
    """Exact mean and variance of the GAE return at step 0 of the three-step chain (gamma 1), over the
    2**3 equally likely reward sequences, for a critic `values` = V(s_0), V(s_1), V(s_2)."""
    outcomes = []
    steps = CHAIN_STEPS_03
    for code in range(2**steps):
        rewards = torch.tensor([CHAIN_REWARDS_03[(code >> t) & 1] for t in range(steps)], dtype=rl_lab.DTYPE)
        v = torch.tensor(values, dtype=rl_lab.DTYPE)
        next_values = torch.cat([v[1:], torch.zeros(1, dtype=rl_lab.DTYPE)])
        end = torch.tensor([False] * (steps - 1) + [True])
        _, returns = rl_lab.gae(rewards, v, next_values, end, end, gamma=1.0, lam=lam)
        outcomes.append(float(returns[0]))
    mean = sum(outcomes) / len(outcomes)
    return mean, sum((g - mean) ** 2 for g in outcomes) / len(outcomes)


def chapter_03():
    rewards = rl_lab.reward_table()
    logits = torch.zeros_like(rewards)
    probs = torch.softmax(logits, dim=-1)
    baseline = (probs * rewards).sum(dim=-1, keepdim=True)  # (X, 1): V(x), the exact mean reward of x
    # the baseline's term alone: E[b(x) grad log pi(a|x)] = b(x) * sum_a grad pi(a|x) = 0
    _, baseline_term = _per_sample_variance(logits, baseline.expand_as(rewards))
    variances = {}
    for name, table in [("no_baseline", rewards), ("baseline", rewards - baseline),
                        ("shift_5_no_baseline", rl_lab.reward_table(shift=5.0)),
                        ("shift_5_baseline", rl_lab.reward_table(shift=5.0) - (baseline + 5.0))]:
        variances[name], mean = _per_sample_variance(logits, table)
        variances[name + "_mean_gradient"] = mean
    by_shift = {"shifts": SHIFTS_03, "no_baseline": [], "baseline": []}
    for shift in SHIFTS_03:
        shifted = rl_lab.reward_table(shift=shift)
        by_shift["no_baseline"].append(_per_sample_variance(logits, shifted)[0])
        by_shift["baseline"].append(_per_sample_variance(logits, shifted - (baseline + shift))[0])
    weights = {str(lam): _gae_weights(GAE_GAMMA_03, lam, GAE_STEPS_03) for lam in GAE_LAMBDAS_03}
    true_values = [float(CHAIN_STEPS_03 - t) for t in range(CHAIN_STEPS_03)]  # E[sum of the rest] = 1 per step
    critics = {"right": true_values, "zero": [0.0] * CHAIN_STEPS_03}
    bias_variance = {"lambdas": LAMBDA_GRID_03, "true_value": true_values[0], "critics": critics}
    for name, values in critics.items():
        moments = [_lambda_return_moments(values, lam) for lam in LAMBDA_GRID_03]
        bias_variance[name] = {"bias": [mean - true_values[0] for mean, _ in moments],
                               "variance": [variance for _, variance in moments]}
    cut = {"rewards": CUT_REWARDS_03, "values": CUT_VALUES_03, "value_after_cap": CUT_VALUE_AFTER_03,
           "gamma": 1.0, "lam": 1.0}
    steps = len(CUT_REWARDS_03)
    cut_rewards = torch.tensor(CUT_REWARDS_03, dtype=rl_lab.DTYPE)
    cut_values = torch.tensor(CUT_VALUES_03, dtype=rl_lab.DTYPE)
    next_values = torch.cat([cut_values[1:], torch.tensor([CUT_VALUE_AFTER_03], dtype=rl_lab.DTYPE)])
    boundary = torch.tensor([False] * (steps - 1) + [True])
    for name, terminated in [("terminal", boundary), ("time_limit", torch.zeros(steps, dtype=torch.bool))]:
        advantages, returns = rl_lab.gae(cut_rewards, cut_values, next_values, terminated, boundary, gamma=1.0, lam=1.0)
        cut[name] = {"terminated": terminated.tolist(), "advantages": advantages, "returns": returns}
    return {
        "rewards": rewards, "baseline": baseline.squeeze(1), "baseline_term": baseline_term,
        "baseline_term_max_abs": baseline_term.abs().max(),
        "variance": {key: value for key, value in variances.items() if not key.endswith("_mean_gradient")},
        "mean_gradient_max_abs_difference": max(
            float((variances[name + "_mean_gradient"] - variances["no_baseline_mean_gradient"]).abs().max())
            for name in ("baseline", "shift_5_no_baseline", "shift_5_baseline")),
        "variance_by_shift": by_shift,
        "gae_gamma": GAE_GAMMA_03, "gae_lambdas": GAE_LAMBDAS_03, "gae_weights": weights,
        "bias_variance": bias_variance,
        "cut": cut,
    }


# ---------------------------------------------------------------------------------------------
# Chapter 4: reusing a batch: importance sampling
# ---------------------------------------------------------------------------------------------

BATCH_04 = (4, 5, 4)  # N sequences, R tokens, V vocabulary of the fixed batch
LENGTHS_04 = [5, 3, 4, 2]  # kept tokens per sequence; the rest is padding
ADVANTAGES_04 = [1.0, -0.5, 0.75, -1.25]
STEP_SIZE_04 = 4.0  # one SGD step on the logits: some ratios leave [0.8, 1.2], one token is clipped
# importance sampling on four actions: the trainer's old policy and a sampler that under-weights action 3
IS_OLD_04 = [0.4, 0.3, 0.2, 0.1]
IS_SAMPLER_04 = [0.6, 0.3, 0.09, 0.01]
IS_REWARDS_04 = [0.0, 0.2, 0.5, 1.0]
IS_CAPS_04 = [1.0, 1.5, 2.0, 3.0, 5.0, 10.0]


def _policy_losses_04(logp, old_logp, advantages, mask):
    """{name: scalar loss} of the five policy losses and REINFORCE on one batch, all with the
    per-sequence mean (reduction "sequence"), no KL term (beta 0) and the atoms' default ranges."""
    zeros = torch.zeros_like(old_logp)  # the reference: unused when beta is 0
    expanded = advantages.unsqueeze(1).expand_as(logp)  # (N,) -> (N, R)
    return {
        "reinforce": rl_lab.reduce_token_loss(rl_lab.reinforce_loss(logp, expanded), mask),
        "ppo_clip": rl_lab.reduce_token_loss(rl_lab.clipped_policy_loss(logp, old_logp, expanded), mask),
        "grpo": rl_lab.grpo_policy_loss(logp, old_logp, zeros, advantages, mask, beta=0.0),
        "cispo": rl_lab.cispo_policy_loss(logp, old_logp, zeros, advantages, mask, beta=0.0),
        "gspo": rl_lab.gspo_policy_loss(logp, old_logp, zeros, advantages, mask, beta=0.0),
        "sapo": rl_lab.sapo_policy_loss(logp, old_logp, zeros, advantages, mask),
    }


def _logit_gradients_04(logits, old_logp, tokens, advantages, mask):
    """{name: d loss / d logits (N, R, V)} of each loss of `_policy_losses_04` at `logits`."""
    gradients = {}
    with torch.enable_grad():
        for name in ("reinforce", "ppo_clip", "grpo", "cispo", "gspo", "sapo"):
            table = logits.clone().requires_grad_(True)
            logp = torch.log_softmax(table, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (N, R)
            (gradients[name],) = torch.autograd.grad(_policy_losses_04(logp, old_logp, advantages, mask)[name], table)
    return gradients


def chapter_04():
    generator = torch.Generator().manual_seed(SEED)
    batch, length, vocab = BATCH_04
    old_logits = torch.randn(batch, length, vocab, generator=generator, dtype=rl_lab.DTYPE)  # (N, R, V)
    tokens = torch.multinomial(torch.softmax(old_logits, dim=-1).view(-1, vocab), 1,
                               generator=generator).view(batch, length)  # (N*R, 1) -> (N, R)
    mask = (torch.arange(length).unsqueeze(0) < torch.tensor(LENGTHS_04).unsqueeze(1)).long()  # (N, R)
    advantages = torch.tensor(ADVANTAGES_04, dtype=rl_lab.DTYPE)
    old_logp = torch.log_softmax(old_logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (N, R)
    # first pass: the policy is the one that sampled the batch, logp == old_logp, every ratio is exactly 1
    first = _logit_gradients_04(old_logits, old_logp, tokens, advantages, mask)
    # one SGD step on the REINFORCE loss moves the policy; the second pass sees ratios != 1
    new_logits = old_logits - STEP_SIZE_04 * first["reinforce"]
    second = _logit_gradients_04(new_logits, old_logp, tokens, advantages, mask)
    new_logp = torch.log_softmax(new_logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    ratio = (new_logp - old_logp).exp()
    kept = mask.bool()
    expanded = advantages.unsqueeze(1).expand_as(ratio)
    methods = [name for name in first if name != "reinforce"]
    # importance sampling, exactly on four actions: E_old[f] = E_sampler[(old / sampler) f]
    p_old = torch.tensor(IS_OLD_04, dtype=rl_lab.DTYPE)
    p_sampler = torch.tensor(IS_SAMPLER_04, dtype=rl_lab.DTYPE)
    f = torch.tensor(IS_REWARDS_04, dtype=rl_lab.DTYPE)
    target = float((p_old * f).sum())
    plain = (p_old.log() - p_sampler.log()).exp()  # (A,) the uncapped weights old / sampler
    corrections = {"caps": IS_CAPS_04, "tis": {"bias": [], "variance": []}, "mask": {"bias": [], "variance": []}}
    for cap in IS_CAPS_04:
        tis = rl_lab.truncated_importance_weights(p_old.log(), p_sampler.log(), cap=cap)
        # masking (rl_lab.rollout_correction_weights' mode "mask" on a batch's tokens; here one distribution's
        # actions): a weight over the cap is dropped, the others keep theirs
        masked_weights = torch.where(plain > cap, torch.zeros_like(plain), plain)
        for name, weights in (("tis", tis), ("mask", masked_weights)):
            mean = float((p_sampler * weights * f).sum())
            corrections[name]["bias"].append(mean - target)
            corrections[name]["variance"].append(float((p_sampler * (weights * f) ** 2).sum()) - mean**2)
    uncorrected_mean = float((p_sampler * f).sum())
    importance = {
        "old": IS_OLD_04, "sampler": IS_SAMPLER_04, "rewards": IS_REWARDS_04,
        "target": target, "uncorrected": uncorrected_mean, "weights": plain,
        "weighted": float((p_sampler * plain * f).sum()),
        "variance_uncapped": float((p_sampler * (plain * f) ** 2).sum()) - target**2,
    }
    return {
        "batch": {"sequences": batch, "tokens": length, "vocabulary": vocab, "lengths": LENGTHS_04,
                  "advantages": ADVANTAGES_04, "tokens_sampled": tokens.tolist(), "old_logp": old_logp,
                  "completion_mask": mask.tolist()},
        "methods": methods,
        "first_pass_max_abs_difference": {name: (first[name] - first["reinforce"]).abs().max() for name in methods},
        "first_pass_gradient_norm": first["reinforce"].norm(),
        "step_size": STEP_SIZE_04,
        "second_pass_ratios": ratio.where(kept, torch.zeros(())),  # 0 on padding
        "second_pass_ratio_min": ratio[kept].min(), "second_pass_ratio_max": ratio[kept].max(),
        "second_pass_clip_fraction": rl_lab.clip_fraction(ratio[kept], expanded[kept]),
        "second_pass_max_abs_difference": {name: (second[name] - second["reinforce"]).abs().max() for name in methods},
        "second_pass_gradient_norm": {name: second[name].norm() for name in methods},
        # GSPO's range (3e-4, 4e-4) is for a geometric mean: these sequence ratios are far outside it
        "second_pass_sequence_ratios": rl_lab.sequence_log_ratio(new_logp, old_logp, mask).exp(),
        "second_pass_relative_difference": {
            name: (second[name] - second["reinforce"]).norm() / second["reinforce"].norm() for name in methods},
        "importance_sampling": importance,
        "corrections": corrections,
    }


# ---------------------------------------------------------------------------------------------
# Chapter 5: trust regions: the clip, dual-clip, clip-higher, CISPO's cap, SAPO's gate, GSPO
# ---------------------------------------------------------------------------------------------

RATIOS_05 = [round(0.02 * k, 2) for k in range(1, 301)]  # 0.02 .. 6.0
CLIP_EPSILON_05 = 0.2
DUAL_CLIP_05 = 3.0
EPSILON_HIGH_05 = 0.28  # DAPO's clip-higher
CISPO_CAP_05 = 5.0  # the lab's default absolute cap (TRL's)
SAPO_TAUS_05 = (1.0, 1.05)  # tau_pos, tau_neg: the paper's defaults
# GSPO's worked example: one sequence of five kept tokens (and one padding position) and its token log-ratios
GSPO_LOG_RATIOS_05 = [0.1, -0.2, 0.05, math.log(3.0), -0.1, 7.0]
GSPO_MASK_05 = [1, 1, 1, 1, 1, 0]


def _one_token_batch(advantage):
    """(old_logp, ref_logp, advantages, mask) of len(RATIOS_05) one-token sequences sharing one A."""
    count = len(RATIOS_05)
    old = torch.zeros(count, 1, dtype=rl_lab.DTYPE)  # (N, 1): the ratio is exp(logp - 0)
    advantages = torch.full((count,), advantage, dtype=rl_lab.DTYPE)  # (N,)
    return old, torch.zeros_like(old), advantages, torch.ones(count, 1, dtype=torch.long)


def _weights_05(advantage):
    """{method: gradient weight against RATIOS_05} for one sign of A: d objective / d logp divided by A,
    by autograd through each atom (objective = minus the loss). Every ratio is its own one-token
    sequence, so the gradient of the summed loss is each token's own; the sequence atoms average over
    sequences, hence the factor N."""
    old, ref, advantages, mask = _one_token_batch(advantage)
    count = len(RATIOS_05)
    expanded = advantages.unsqueeze(1)  # (N,) -> (N, 1)
    losses = {
        "ppo_clip": lambda lp: rl_lab.clipped_policy_loss(lp, old, expanded, CLIP_EPSILON_05).sum(),
        "dual_clip": lambda lp: rl_lab.clipped_policy_loss(lp, old, expanded, CLIP_EPSILON_05,
                                                           dual_clip=DUAL_CLIP_05).sum(),
        "clip_higher": lambda lp: rl_lab.clipped_policy_loss(lp, old, expanded, CLIP_EPSILON_05,
                                                             EPSILON_HIGH_05).sum(),
        "cispo": lambda lp: count * rl_lab.cispo_policy_loss(lp, old, ref, advantages, mask, CISPO_CAP_05, 0.0),
        "sapo": lambda lp: count * rl_lab.sapo_policy_loss(lp, old, ref, advantages, mask, *SAPO_TAUS_05),
    }
    weights = {}
    with torch.enable_grad():
        for name, loss_of in losses.items():
            logp = torch.tensor(RATIOS_05, dtype=rl_lab.DTYPE).log().unsqueeze(1).requires_grad_(True)  # (N, 1)
            (gradient,) = torch.autograd.grad(loss_of(logp), logp)
            weights[name] = -gradient[:, 0] / advantage + 0.0  # + 0.0: a clipped -0.0 reads as 0.0
    return weights


def _objectives_05(advantage):
    """{name: objective per token against RATIOS_05} for one sign of A: PPO's clipped surrogate (and the
    plain ratio * A it bounds) from clipped_policy_loss, SAPO's gate * A from sapo_policy_loss."""
    old, ref, advantages, mask = _one_token_batch(advantage)
    logp = torch.tensor(RATIOS_05, dtype=rl_lab.DTYPE).log().unsqueeze(1)  # (N, 1)
    clipped = -rl_lab.clipped_policy_loss(logp, old, advantages.unsqueeze(1), CLIP_EPSILON_05)[:, 0]
    # SAPO returns a mean over sequences: one call per ratio gives each token's own value
    sapo = [float(-rl_lab.sapo_policy_loss(logp[i:i + 1], old[:1], ref[:1], advantages[:1], mask[:1],
                                           *SAPO_TAUS_05)) for i in range(len(RATIOS_05))]
    return {"unclipped": torch.tensor(RATIOS_05, dtype=rl_lab.DTYPE) * advantage, "ppo_clip": clipped,
            "sapo": sapo}


# The second-wave trust regions (docs/algorithms/trust-regions.md, sequence-weighted.md): one token, or one
# one-token response, at a time, so that every weight is read off the atom by autograd.
DPPO_OLD_PROBABILITIES_05 = [0.01, 0.5, 0.99]  # a rare, an even and a likely sampled token: q = pi_old
# p = pi, 0.0005 .. 0.9995: no edge of a region (a round number) falls on a grid point
DPPO_PROBABILITIES_05 = [(k - 0.5) / 1000 for k in range(1, 1001)]
DPPO_DELTA_05 = 0.2  # the atom's default delta = delta_high (verl's clip_ratio_low / clip_ratio_high)
DPPO_CAP_05 = 3.0  # the atom's default cap on the detached ratio (verl's clip_ratio_c)
GMPO_EPSILON_05 = 0.4  # the paper's log-space clip (the atom's default)
GMPO_LOG_RATIOS_05 = [round(-1.0 + 0.01 * k, 2) for k in range(201)]  # -1 .. 1 nats
SEQUENCE_WEIGHTS_05 = [10 ** (-2 + k / 50) for k in range(201)]  # w = pi(y) / pi_old(y), 0.01 .. 100
VESPO_SHAPES_05 = {"positive": (2.0, 3.0), "negative": (3.0, 2.0)}  # (k, lambda): the atom's (TRL's) defaults


def _token_weight(loss_of, logp_values, advantage):
    """-d loss / d logp over A at each of `logp_values` (one token each, a tensor (P,) of log-probs), by
    autograd through `loss_of(logp (P, 1))`, which must sum the tokens' own losses."""
    with torch.enable_grad():
        logp = logp_values.clone().unsqueeze(1).requires_grad_(True)  # (P,) -> (P, 1)
        (gradient,) = torch.autograd.grad(loss_of(logp), logp)
    return -gradient[:, 0] / advantage + 0.0  # + 0.0: a dropped -0.0 reads as 0.0


def _kept_intervals(grid, weights, lower, upper):
    """[[low, high], ...]: the intervals of `grid` (increasing, within [lower, upper]) where the gradient
    weight is not 0, each edge halfway between a kept and a dropped grid point (lower or upper at the ends),
    so an edge is known to half a grid step."""
    runs, start = [], None
    for index, weight in enumerate(list(weights) + [0.0]):
        if weight != 0.0 and start is None:
            start = index
        elif weight == 0.0 and start is not None:
            low = lower if start == 0 else (grid[start - 1] + grid[start]) / 2
            high = upper if index == len(grid) else (grid[index - 1] + grid[index]) / 2
            runs.append([low, high])
            start = None
    return runs


def _dppo_regions_05():
    """{sign: {q: {method: [[first p, last p], ...]}}}: where each loss still passes a
    gradient for one token of old probability q, against its new probability p. PPO's ratio clip
    (epsilon = delta) beside DPPO's two trust regions; every token is its own position of one batch."""
    probabilities = torch.tensor(DPPO_PROBABILITIES_05, dtype=rl_lab.DTYPE)
    count = len(DPPO_PROBABILITIES_05)
    mask = torch.ones(count, 1, dtype=torch.long)
    regions = {}
    for sign, advantage in (("positive", 1.0), ("negative", -1.0)):
        advantages = torch.full((count,), advantage, dtype=rl_lab.DTYPE)  # (P,)
        regions[sign] = {}
        for q in DPPO_OLD_PROBABILITIES_05:
            old = torch.full((count, 1), math.log(q), dtype=rl_lab.DTYPE)  # (P, 1)
            losses = {
                "ppo_clip": lambda lp: rl_lab.clipped_policy_loss(lp, old, advantages.unsqueeze(1),
                                                                  DPPO_DELTA_05).sum(),
                # the token mean over P one-token positions: times P gives each token's own loss
                **{f"dppo_{kind}": lambda lp, kind=kind: count * rl_lab.dppo_policy_loss(
                    lp, old, old, advantages, mask, kind=kind, delta=DPPO_DELTA_05, cap=DPPO_CAP_05)
                   for kind in ("tv", "kl")},
            }
            regions[sign][str(q)] = {}
            for name, loss_of in losses.items():
                weight = _token_weight(loss_of, probabilities.log(), advantage)
                regions[sign][str(q)][name] = _kept_intervals(DPPO_PROBABILITIES_05, weight.tolist(), 0.0, 1.0)
    return regions


def _gmpo_clip_05():
    """{sign: {method: {"log_ratio_seen", "weight"}}} against GMPO_LOG_RATIOS_05 for a one-token response:
    the log of the ratio each objective multiplies A by (GMPO's exp of its clipped mean log-ratio; PPO's
    pessimistic clipped ratio, epsilon 0.2) and the gradient weight -d loss / d logp over A."""
    log_ratios = torch.tensor(GMPO_LOG_RATIOS_05, dtype=rl_lab.DTYPE)
    count = len(GMPO_LOG_RATIOS_05)
    old = torch.zeros(count, 1, dtype=rl_lab.DTYPE)
    mask = torch.ones(count, 1, dtype=torch.long)
    clip = {}
    for sign, advantage in (("positive", 1.0), ("negative", -1.0)):
        advantages = torch.full((count,), advantage, dtype=rl_lab.DTYPE)
        ppo = lambda lp: rl_lab.clipped_policy_loss(lp, old, advantages.unsqueeze(1), CLIP_EPSILON_05)[:, 0]
        # GMPO averages over responses: times N gives each one-token response its own -A s_i
        gmpo = lambda lp: count * rl_lab.gmpo_policy_loss(lp, old, old, advantages, mask, GMPO_EPSILON_05)
        seen_ppo = (ppo(log_ratios.unsqueeze(1)) / -advantage).log()
        # one call per response: the value of each response's own term
        seen_gmpo = [math.log(float(rl_lab.gmpo_policy_loss(log_ratios[i:i + 1].unsqueeze(1), old[:1], old[:1],
                                                            advantages[:1], mask[:1], GMPO_EPSILON_05)) / -advantage)
                     for i in range(count)]
        clip[sign] = {
            "ppo_clip": {"log_ratio_seen": seen_ppo, "weight": _token_weight(lambda lp: ppo(lp).sum(), log_ratios,
                                                                             advantage)},
            "gmpo": {"log_ratio_seen": seen_gmpo, "weight": _token_weight(gmpo, log_ratios, advantage)},
        }
    return clip


def _sequence_weights_05():
    """{sign: {method: (W,)}}: the weight VESPO and TOPR put on A * grad log pi of a response against its
    sequence ratio w (SEQUENCE_WEIGHTS_05), read off each atom by autograd on one-token responses (so the
    token mean over the batch, times W, is each response's own loss); "importance" is w itself."""
    ratios = torch.tensor(SEQUENCE_WEIGHTS_05, dtype=rl_lab.DTYPE)
    count = len(SEQUENCE_WEIGHTS_05)
    old = torch.zeros(count, 1, dtype=rl_lab.DTYPE)
    mask = torch.ones(count, 1, dtype=torch.long)
    weights = {}
    for sign, advantage in (("positive", 1.0), ("negative", -1.0)):
        advantages = torch.full((count,), advantage, dtype=rl_lab.DTYPE)
        k, lam = VESPO_SHAPES_05[sign]
        vespo = lambda lp: count * rl_lab.vespo_policy_loss(lp, old, old, advantages, mask, *VESPO_SHAPES_05["positive"],
                                                            *VESPO_SHAPES_05["negative"])
        topr = lambda lp: count * rl_lab.topr_policy_loss(lp, old, old, advantages, mask, reduction="token")
        weights[sign] = {"vespo": _token_weight(vespo, ratios.log(), advantage),
                         "topr": _token_weight(topr, ratios.log(), advantage),
                         "importance": ratios, "vespo_k": k, "vespo_lambda": lam}
    return weights


def chapter_05():
    signs = {"positive": 1.0, "negative": -1.0}
    log_ratios = torch.tensor([GSPO_LOG_RATIOS_05], dtype=rl_lab.DTYPE)  # (1, R)
    mask = torch.tensor([GSPO_MASK_05])
    log_s = rl_lab.sequence_log_ratio(log_ratios, torch.zeros_like(log_ratios), mask)  # (1,)
    kept = log_ratios[0][mask[0].bool()]
    # the same sequence without its one large token: how far a single token moves the sequence ratio
    without = torch.cat([kept[:3], kept[4:]])
    ppo_rows = [1, 2, 5, 10]
    return {
        "ratios": RATIOS_05, "clip_epsilon": CLIP_EPSILON_05, "dual_clip": DUAL_CLIP_05,
        "epsilon_high": EPSILON_HIGH_05, "cispo_cap": CISPO_CAP_05,
        "sapo_tau_pos": SAPO_TAUS_05[0], "sapo_tau_neg": SAPO_TAUS_05[1],
        "objective": {sign: _objectives_05(advantage) for sign, advantage in signs.items()},
        "weight": {sign: _weights_05(advantage) for sign, advantage in signs.items()},
        "gspo": {
            "log_ratios": GSPO_LOG_RATIOS_05, "mask": GSPO_MASK_05,
            "token_ratios": kept.exp(),
            "sequence_log_ratio": log_s[0], "sequence_ratio": log_s[0].exp(),
            "arithmetic_mean_ratio": kept.exp().mean(),
            "sequence_ratio_without_largest": without.mean().exp(),
            "largest_token_ratio": kept.exp().max(),
        },
        "ppo_rows": ppo_rows,
        "dppo": {"old_probabilities": DPPO_OLD_PROBABILITIES_05, "probabilities": DPPO_PROBABILITIES_05,
                 "delta": DPPO_DELTA_05, "cap": DPPO_CAP_05, "region": _dppo_regions_05()},
        "gmpo": {"epsilon": GMPO_EPSILON_05, "log_ratios": GMPO_LOG_RATIOS_05, "clip": _gmpo_clip_05()},
        "sequence_weights": {"ratios": SEQUENCE_WEIGHTS_05, "weight": _sequence_weights_05()},
    }


# ---------------------------------------------------------------------------------------------
# Chapter 6: the KL-regularized objective and its optimum; the KL estimators
# ---------------------------------------------------------------------------------------------


# The reference of chapters 6 and 7: a fixed table that disagrees with the reward in places, so that the
# factor ref(a|x) of the optimum shows (a uniform reference would hide it).
REFERENCE_LOGITS = [[-0.5, 0.5, 0.0], [0.0, -0.5, 0.5], [0.5, 0.0, -0.5], [0.0, 0.0, 0.0]]
KL_BETAS = [0.03, 0.1, 0.3, 1.0, 3.0]  # where the closed form is checked against gradient ascent
ASCENT_STEPS = 3000
# step of the gradient ascent: 3 / beta per context (the objective is a mean over the 4 contexts); the
# curvature at the optimum is beta * (diag(p) - p p^T) <= beta / 2, so the step is stable and fast
ASCENT_STEP_TIMES_BETA = 3.0 * rl_lab.NUM_CONTEXTS
BETA_CURVE = [10 ** (-2 + 3 * i / 40) for i in range(41)]  # 0.01 .. 10 for the figure
ESTIMATOR_SCALES = {"near": 0.3, "far": 1.5}  # pi = softmax(scale * v) against a uniform reference
ESTIMATOR_DIRECTION = [1.0, -0.5, 0.3, -1.2, 0.8, -0.4]
ESTIMATOR_SAMPLES = 4096
RESET_BETA, RESET_ITERATIONS = 0.3, 3


def _reference_logp():
    return torch.log_softmax(torch.tensor(REFERENCE_LOGITS, dtype=rl_lab.DTYPE), dim=-1)  # (X, A)


def _exact_kl(logp, other_logp):
    """KL(p || q) per row from log-probs, summed over the last axis (nats)."""
    return (logp.exp() * (logp - other_logp)).sum(dim=-1)


def _relative_error(estimate, exact):
    return float((estimate - exact).norm() / exact.norm())


def _ascend_kl_objective(rewards, ref_logp, betas):
    """The logits reached by plain gradient ascent on the exact objective mean_x [sum_a p R - beta KL(p || ref)],
    from zeros, one independent problem per beta: (len(betas), X, A)."""
    beta = torch.tensor(betas, dtype=rl_lab.DTYPE)[:, None, None]  # (K, 1, 1)
    theta = torch.zeros(len(betas), *rewards.shape, dtype=rl_lab.DTYPE, requires_grad=True)  # (K, X, A)
    for _ in range(ASCENT_STEPS):
        logp = torch.log_softmax(theta, dim=-1)
        objective = (logp.exp() * (rewards - beta * (logp - ref_logp))).sum(dim=-1).mean(dim=-1)  # (K,)
        (gradient,) = torch.autograd.grad(objective.sum(), theta)
        theta = (theta + ASCENT_STEP_TIMES_BETA / beta * gradient).detach().requires_grad_(True)
    return theta.detach()


def _estimator_moments(scale):
    """Exact mean and std of k1, k2, k3 under pi = softmax(scale * v) against a uniform reference (enumerated
    over the 6 outcomes), and their means over ESTIMATOR_SAMPLES seeded draws."""
    logp = torch.log_softmax(scale * torch.tensor(ESTIMATOR_DIRECTION, dtype=rl_lab.DTYPE), dim=-1)  # (6,)
    ref_logp = torch.full_like(logp, -math.log(len(ESTIMATOR_DIRECTION)))
    kl = float(_exact_kl(logp, ref_logp))
    generator = torch.Generator().manual_seed(SEED)
    draws = torch.multinomial(logp.exp(), ESTIMATOR_SAMPLES, replacement=True, generator=generator)
    p = logp.exp()
    report = {"scale": scale, "kl": kl, "estimators": {}}
    for name, estimator in (("k1", rl_lab.kl_k1), ("k2", rl_lab.kl_k2), ("k3", rl_lab.kl_k3)):
        values = estimator(logp, ref_logp)  # (6,) the estimator's value on each outcome
        mean = float((p * values).sum())
        std = float((p * (values - mean).square()).sum().sqrt())
        report["estimators"][name] = {"mean": mean, "bias": mean - kl, "std": std,
                                      "sampled_mean": float(values[draws].mean())}
    return report


# the two small policies of the gradient examples: one token (V = 3), and two tokens where the second
# token's distribution depends on the first (a 3 x 3 table)
ONE_TOKEN = {"policy": [1.0, 0.0, -1.0], "reference": [0.0, 0.5, 0.0]}
TWO_TOKENS = {"first": [0.8, -0.3, 0.0], "second": [[1.0, 0.0, -1.0], [-0.5, 0.7, 0.0], [0.0, -1.0, 1.2]],
              "ref_first": [0.0, 0.4, -0.2], "ref_second": [[0.0, 0.0, 0.0], [0.3, -0.3, 0.0], [0.0, 0.5, -0.5]]}


def _surrogates(token_logps, ref_token_logps):
    """The KL terms the libraries put in a loss, per sequence: {name: (S,)}; token_logps (S, T) of each
    enumerated sequence under the policy (with grad), ref_token_logps (S, T) under the reference."""
    log_ratio = token_logps - ref_token_logps  # (S, T) k1 per token
    k1 = rl_lab.kl_k1(token_logps, ref_token_logps)
    k2 = rl_lab.kl_k2(token_logps, ref_token_logps)
    k3 = rl_lab.kl_k3(token_logps, ref_token_logps)
    # on-policy the old policy is the current one, detached: the ratio is 1 in value and carries the gradient
    sequence_logps = token_logps.sum(dim=-1)  # (S,)
    return {
        "k1 in the loss": k1.sum(dim=-1),
        "k2 in the loss": k2.sum(dim=-1),
        "k3 in the loss": k3.sum(dim=-1),
        # TRL's GRPOConfig(use_bias_correction_kl=True): per-token k3 times the ratio pi/old
        "k3 x ratio (TRL)": rl_lab.kl_k3_is_corrected(token_logps, token_logps.detach(), ref_token_logps).sum(dim=-1),
        # verl's kl_loss_type="k3+": k3's value, k2's gradient, straight through
        "k3+ (verl)": rl_lab.kl_straight_through(token_logps, ref_token_logps, "k3+").sum(dim=-1),
        # the KL in the reward: -beta * sum_t k1 (detached) multiplies grad log pi(y) like any reward
        "k1 in the reward": log_ratio.sum(dim=-1).detach() * sequence_logps,
        "k2 of the sequence log-ratio": rl_lab.kl_k2(sequence_logps, ref_token_logps.sum(dim=-1)),
    }


def _expected_gradients(parameters, sequence_probabilities, token_logps, ref_token_logps, exact_kl):
    """{name: {"value", "relative_error", "gradient"}} for every surrogate: its expectation over the enumerated
    sequences (probabilities detached, as samples would be) and the relative error of its expected gradient
    against the exact gradient of KL(pi || ref)."""
    (exact,) = torch.autograd.grad(exact_kl, parameters, retain_graph=True)
    weights = sequence_probabilities.detach()
    found = {}
    for name, surrogate in _surrogates(token_logps, ref_token_logps).items():
        expected = (weights * surrogate).sum()
        (gradient,) = torch.autograd.grad(expected, parameters, retain_graph=True)
        # the value each term reports: the reward's penalty is its k1 sum, the loss terms their own value
        value = float((weights * (token_logps - ref_token_logps).sum(dim=-1)).sum().detach()) if "reward" in name \
            else float((weights * surrogate.detach()).sum())
        found[name] = {"value": value, "relative_error": _relative_error(gradient, exact),
                       "gradient": gradient.flatten().tolist()}
    return {"exact_gradient": exact.flatten().tolist(), "estimators": found}


def _one_token_example():
    theta = torch.tensor(ONE_TOKEN["policy"], dtype=rl_lab.DTYPE, requires_grad=True)
    logp = torch.log_softmax(theta, dim=-1)  # (V,): each outcome is a one-token sequence
    ref_logp = torch.log_softmax(torch.tensor(ONE_TOKEN["reference"], dtype=rl_lab.DTYPE), dim=-1)
    kl = _exact_kl(logp, ref_logp)
    report = _expected_gradients(theta, logp.exp(), logp[:, None], ref_logp[:, None], kl)
    report["kl"] = float(kl.detach())
    # k3's expected gradient is the gradient of the forward KL(ref || pi) instead
    (forward,) = torch.autograd.grad(_exact_kl(ref_logp, logp), theta, retain_graph=True)
    k3 = (logp.exp().detach() * rl_lab.kl_k3(logp, ref_logp)).sum()
    (k3_gradient,) = torch.autograd.grad(k3, theta)
    report["k3_relative_error_to_forward_kl_gradient"] = _relative_error(k3_gradient, forward)
    return report


def _two_token_example():
    vocab = len(TWO_TOKENS["first"])
    # one flat parameter vector: the first token's logits (V,), then the second token's table (V, V), row = y1
    parameters = torch.tensor(TWO_TOKENS["first"] + sum(TWO_TOKENS["second"], []), dtype=rl_lab.DTYPE,
                              requires_grad=True)
    logp_first = torch.log_softmax(parameters[:vocab], dim=-1)  # (V,)
    logp_second = torch.log_softmax(parameters[vocab:].view(vocab, vocab), dim=-1)  # (V*V,) -> (V, V)
    ref_first = torch.log_softmax(torch.tensor(TWO_TOKENS["ref_first"], dtype=rl_lab.DTYPE), dim=-1)
    ref_second = torch.log_softmax(torch.tensor(TWO_TOKENS["ref_second"], dtype=rl_lab.DTYPE), dim=-1)
    y1 = torch.arange(vocab).repeat_interleave(vocab)  # (S = V*V,) every sequence (y1, y2), y1-major
    y2 = torch.arange(vocab).repeat(vocab)
    token_logps = torch.stack([logp_first[y1], logp_second[y1, y2]], dim=-1)  # (S, T=2)
    ref_token_logps = torch.stack([ref_first[y1], ref_second[y1, y2]], dim=-1)  # (S, T=2)
    sequence_probabilities = token_logps.sum(dim=-1).exp()  # (S,)
    kl = (sequence_probabilities * (token_logps - ref_token_logps).sum(dim=-1)).sum()  # KL(pi || ref), exact
    report = _expected_gradients(parameters, sequence_probabilities, token_logps, ref_token_logps, kl)
    report["kl"] = float(kl.detach())
    report["sequences"] = vocab * vocab
    return report


def chapter_06():
    rewards, ref_logp = rl_lab.reward_table(), _reference_logp()
    with torch.enable_grad():  # compute() runs under no_grad; the checks here need autograd
        ascended = _ascend_kl_objective(rewards, ref_logp, KL_BETAS)
        one_token, two_tokens = _one_token_example(), _two_token_example()
    checks = []
    for index, beta in enumerate(KL_BETAS):
        closed = rl_lab.kl_optimum_logp(rewards, ref_logp, beta).exp()
        found = torch.softmax(ascended[index], dim=-1)
        checks.append({"beta": beta, "max_abs_difference": float((closed - found).abs().max()),
                       "expected_reward": float((closed * rewards).sum(dim=-1).mean())})
    curve = []
    for beta in BETA_CURVE:
        logp = rl_lab.kl_optimum_logp(rewards, ref_logp, beta)
        curve.append({"beta": beta, "expected_reward": float((logp.exp() * rewards).sum(dim=-1).mean()),
                      "kl_reference": float(_exact_kl(logp, ref_logp).mean()),
                      "best_action_probability": float(logp.exp().max(dim=-1).values.mean())})
    log_ratio = torch.linspace(-2.0, 2.0, 81, dtype=rl_lab.DTYPE)  # log pi - log ref at one token
    zeros = torch.zeros_like(log_ratio)
    # resetting the reference: K outer iterations at beta, each against the last one's optimum, equal one
    # optimum at beta / K against the first reference (the exponents R / beta add up)
    reset_logp = ref_logp
    resets = []
    for iteration in range(1, RESET_ITERATIONS + 1):
        new_logp = rl_lab.kl_optimum_logp(rewards, reset_logp, RESET_BETA)
        resets.append({"iteration": iteration, "kl_to_previous": float(_exact_kl(new_logp, reset_logp).mean()),
                       "kl_to_first": float(_exact_kl(new_logp, ref_logp).mean()),
                       "expected_reward": float((new_logp.exp() * rewards).sum(dim=-1).mean())})
        reset_logp = new_logp
    equivalent = rl_lab.kl_optimum_logp(rewards, ref_logp, RESET_BETA / RESET_ITERATIONS).exp()
    return {
        "reference_logits": REFERENCE_LOGITS,
        "reference_probabilities": ref_logp.exp(),
        "reference_expected_reward": float((ref_logp.exp() * rewards).sum(dim=-1).mean()),
        "ascent_steps": ASCENT_STEPS,
        "optimum_checks": checks,
        "optimum_max_abs_difference": max(check["max_abs_difference"] for check in checks),
        "beta_curve": curve,
        "estimator_curves": {"log_ratio": log_ratio, "k1": rl_lab.kl_k1(log_ratio, zeros),
                             "k2": rl_lab.kl_k2(log_ratio, zeros), "k3": rl_lab.kl_k3(log_ratio, zeros)},
        "estimator_moments": {name: _estimator_moments(scale) for name, scale in ESTIMATOR_SCALES.items()},
        "estimator_samples": ESTIMATOR_SAMPLES,
        "one_token": one_token,
        "two_tokens": two_tokens,
        "reset": {"beta": RESET_BETA, "iterations": resets, "equivalent_beta": RESET_BETA / RESET_ITERATIONS,
                  "max_abs_difference_to_equivalent": float((reset_logp.exp() - equivalent).abs().max())},
    }


# ---------------------------------------------------------------------------------------------
# Chapter 7: preferences: Bradley-Terry, DPO, IPO, the hinge, SimPO
# ---------------------------------------------------------------------------------------------


PREFERENCE_BETA = rl_lab.DPO_BETA  # the bandit's DPO beta, for the optimum and the implicit reward
LOSS_BETA = 0.5  # one beta for DPO, IPO and the hinge in the figure, so their margins compare
SIMPO_BETA, SIMPO_GAMMA = 2.0, 0.5  # simpo_loss's defaults (SimPO's paper uses beta 2-2.5, gamma/beta ~0.5)
MARGINS = [-6.0 + 0.1 * i for i in range(121)]
QUOTED_MARGINS = [-2.0, 0.0, 1.0, 2.0, 4.0]


def _preference_losses(margin):
    """{name: (M,) loss} at each margin m (nats); chosen = m, rejected and the references 0. For SimPO
    m is the difference of the length-averaged log-probs (it has no reference)."""
    zeros = torch.zeros_like(margin)
    return {
        "dpo": rl_lab.dpo_loss(margin, zeros, zeros, zeros, beta=LOSS_BETA),
        "ipo": rl_lab.ipo_loss(margin, zeros, zeros, zeros, beta=LOSS_BETA),
        "hinge": rl_lab.dpo_hinge_loss(margin, zeros, zeros, zeros, beta=LOSS_BETA),
        "simpo": rl_lab.simpo_loss(margin, zeros, beta=SIMPO_BETA, gamma=SIMPO_GAMMA),
    }


def _loss_curves(margins):
    """{name: {"loss": (M,), "weight": (M,)}}: each loss and its gradient weight -dL/dm against the margin."""
    margin = torch.tensor(margins, dtype=rl_lab.DTYPE, requires_grad=True)
    curves = {}
    for name, loss in _preference_losses(margin).items():
        (gradient,) = torch.autograd.grad(loss.sum(), margin)  # elementwise: d loss_m / d m
        curves[name] = {"loss": loss.detach(), "weight": -gradient}
    return curves


def chapter_07():
    rewards, ref_logp = rl_lab.reward_table(), _reference_logp()
    optimum_logp = rl_lab.kl_optimum_logp(rewards, ref_logp, PREFERENCE_BETA)  # pi* of chapter 6 for this beta
    pairs = rl_lab.preference_pairs(rewards)  # (12, 3): context, chosen, rejected
    context, chosen, rejected = pairs[:, 0], pairs[:, 1], pairs[:, 2]
    # the implicit reward beta * log(pi*/ref) = R - beta log Z(x): a difference within a context drops Z
    implicit = PREFERENCE_BETA * (optimum_logp - ref_logp)  # (X, A)
    implicit_margin = implicit[context, chosen] - implicit[context, rejected]  # (12,)
    reward_margin = rewards[context, chosen] - rewards[context, rejected]
    loss_at_optimum = rl_lab.dpo_loss(optimum_logp[context, chosen], optimum_logp[context, rejected],
                                      ref_logp[context, chosen], ref_logp[context, rejected], beta=PREFERENCE_BETA)
    loss_at_reference = rl_lab.dpo_loss(ref_logp[context, chosen], ref_logp[context, rejected],
                                        ref_logp[context, chosen], ref_logp[context, rejected], beta=PREFERENCE_BETA)
    bradley_terry_nll = -torch.nn.functional.logsigmoid(reward_margin)  # -log P(chosen > rejected) under BT
    with torch.enable_grad():
        curves = _loss_curves(MARGINS)
        quoted = _loss_curves(QUOTED_MARGINS)
    return {
        "beta": PREFERENCE_BETA,
        "pairs": pairs,
        "reward_margins": reward_margin,
        "implicit_margins": implicit_margin,
        "implicit_margin_max_abs_difference": float((implicit_margin - reward_margin).abs().max()),
        "log_partition": torch.logsumexp(ref_logp + rewards / PREFERENCE_BETA, dim=-1) * PREFERENCE_BETA,
        "loss_at_optimum": loss_at_optimum,
        "bradley_terry_nll": bradley_terry_nll,
        "loss_at_optimum_max_abs_difference": float((loss_at_optimum - bradley_terry_nll).abs().max()),
        "loss_at_reference": float(loss_at_reference.mean()),
        "loss_beta": LOSS_BETA, "simpo_beta": SIMPO_BETA, "simpo_gamma": SIMPO_GAMMA,
        "ipo_target_margin": 1.0 / (2.0 * LOSS_BETA), "hinge_zero_margin": 1.0 / LOSS_BETA,
        "margins": MARGINS,
        "curves": curves,
        "quoted": [{"margin": margin, **{f"{name}_{part}": float(quoted[name][part][index])
                                         for name in quoted for part in ("loss", "weight")}}
                   for index, margin in enumerate(QUOTED_MARGINS)],
    }


# ---------------------------------------------------------------------------------------------
# Chapter 8: groups: GRPO's group baseline, RLOO, the std, tied groups, the group size
# ---------------------------------------------------------------------------------------------


GROUP_SIZE = 8
TIE_GROUP_SIZES = [2, 4, 8, 16]
TIE_SUCCESS_RATES = [0.1, 0.5, 0.9]
TIE_SAMPLED_GROUPS = 4096  # seeded groups per (G, q) to set the measured share of ties beside the exact one
BUDGET = 128  # responses per batch, B * G, for the choice of G
BUDGET_SUCCESS_RATE = 0.9  # a policy that is already good: most groups tie


def _group_weights(group_size):
    """One row per success count c = 0..G of a group of binary rewards: the total |A| of the group under
    group_advantages with the std (scale "group") and without (scale "none"), and their closed forms."""
    counts = torch.arange(group_size + 1)
    # row c: c successes then G - c failures, (G+1, G)
    rewards = (torch.arange(group_size)[None, :] < counts[:, None]).to(rl_lab.DTYPE)
    with_std = rl_lab.group_advantages(rewards, scale="group").abs().sum(dim=1)  # (G+1,)
    without_std = rl_lab.group_advantages(rewards, scale="none").abs().sum(dim=1)
    rows = []
    for c in range(group_size + 1):
        p = c / group_size
        rows.append({"successes": c, "success_rate": p, "with_std": float(with_std[c]),
                     "without_std": float(without_std[c]),
                     "with_std_closed_form": 2 * group_size * math.sqrt(p * (1 - p)),
                     "without_std_closed_form": 2 * group_size * p * (1 - p)})
    half = rows[group_size // 2]
    for row in rows:
        row["with_std_relative"] = row["with_std"] / half["with_std"]
        row["without_std_relative"] = row["without_std"] / half["without_std"]
    return rows


def _tie_probability(success_rate, group_size):
    """P(all G binary rewards equal) = sum_v q_v^G over the reward values v."""
    return success_rate ** group_size + (1.0 - success_rate) ** group_size


def chapter_08():
    generator = torch.Generator().manual_seed(SEED)
    # RLOO against the group mean on seeded rewards: the same direction, scaled by G / (G - 1)
    rewards = torch.rand(4, GROUP_SIZE, generator=generator, dtype=rl_lab.DTYPE)  # (B, G)
    rloo = rl_lab.rloo_advantages(rewards)
    centred = rl_lab.group_advantages(rewards, scale="none")
    leave_one_out = torch.stack([torch.cat([row[:i], row[i + 1:]]).mean() for row in rewards
                                 for i in range(GROUP_SIZE)]).view_as(rewards)  # slow reference, (B*G,) -> (B, G)
    ties = []
    for group_size in TIE_GROUP_SIZES:
        for q in TIE_SUCCESS_RATES:
            draws = torch.rand(TIE_SAMPLED_GROUPS, group_size, generator=generator, dtype=rl_lab.DTYPE) < q
            measured = float(rl_lab.tied_groups(draws.to(rl_lab.DTYPE)).to(rl_lab.DTYPE).mean())
            ties.append({"group_size": group_size, "success_rate": q,
                         "exact": _tie_probability(q, group_size), "measured": measured})
    budget = []
    for group_size in TIE_GROUP_SIZES:
        prompts = BUDGET // group_size
        tie = _tie_probability(BUDGET_SUCCESS_RATE, group_size)
        budget.append({"group_size": group_size, "prompts": prompts, "tie_probability": tie,
                       "informative_groups": prompts * (1.0 - tie),
                       # dynamic sampling draws prompts until `prompts` groups vary: 1 / (1 - tie) each
                       "prompts_drawn_by_dynamic_sampling": prompts / (1.0 - tie)})
    # the bandit's uniform start: in every context the 3 actions have 3 distinct rewards
    uniform = torch.full((rl_lab.NUM_ACTIONS,), 1.0 / rl_lab.NUM_ACTIONS, dtype=rl_lab.DTYPE)
    return {
        "group_size": GROUP_SIZE,
        "weights": _group_weights(GROUP_SIZE),
        "rloo_example": {"rewards": rewards, "rloo": rloo, "centred": centred,
                         "max_abs_difference_to_scaled": float((rloo - GROUP_SIZE / (GROUP_SIZE - 1) * centred)
                                                               .abs().max()),
                         "max_abs_difference_to_loop": float((rloo - (rewards - leave_one_out)).abs().max()),
                         # GRPO's baseline includes the sample itself: R - mean = (G-1)/G (R - mean of the others)
                         "max_abs_difference_self_included": float((centred - (GROUP_SIZE - 1) / GROUP_SIZE
                                                                    * (rewards - leave_one_out)).abs().max())},
        "ties": ties,
        "tie_sampled_groups": TIE_SAMPLED_GROUPS,
        "budget": BUDGET, "budget_success_rate": BUDGET_SUCCESS_RATE, "budget_rows": budget,
        "bandit_uniform_tie_probability": float((uniform ** GROUP_SIZE).sum()),
    }


# ---------------------------------------------------------------------------------------------
# Chapter 9: sequences: reductions, the length bias, micro-batches, EOS = PAD, left padding
# ---------------------------------------------------------------------------------------------


LENGTHS = list(range(1, 17))  # one response of each length 1..16 in one batch, for the per-token weights
MAX_NEW_TOKENS = 16
MICRO_LENGTHS = [2, 3, 7, 8]  # a batch of 4 responses cut into 2 micro-batches of 2
OVERLONG_MAX, OVERLONG_CACHE = 16, 4
EOS = 4  # EOS = PAD, as in token_objectives.py
EOS_EXAMPLE = [[2, EOS, EOS, EOS], [3, 3, EOS, EOS], [2, 3, 3, 3]]
PADDING_PROMPTS = [[1, 2, 3], [2, 3]]  # two prompts of different lengths, left-padded into one batch
PADDING_COMPLETION = [4, 5]


def _length_mask(lengths, width):
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(rl_lab.DTYPE)  # (N, width)


def _token_weights(lengths, width, max_new_tokens):
    """{reduction: (N,) gradient of the reduced loss with respect to one token's loss, per response}."""
    mask = _length_mask(lengths, width)
    weights = {}
    for reduction in rl_lab.REDUCTIONS:
        per_token = torch.zeros(len(lengths), width, dtype=rl_lab.DTYPE, requires_grad=True)
        loss = rl_lab.reduce_token_loss(per_token, mask, reduction, max_new_tokens=max_new_tokens)
        (gradient,) = torch.autograd.grad(loss, per_token)
        weights[reduction] = gradient[:, 0]  # the first token of each response: every kept token weighs the same
    return weights


def _micro_batches():
    """The token mean of a batch against the same loss accumulated over two micro-batches."""
    generator = torch.Generator().manual_seed(SEED)
    width = max(MICRO_LENGTHS)
    mask = _length_mask(MICRO_LENGTHS, width)
    per_token = torch.randn(len(MICRO_LENGTHS), width, generator=generator, dtype=rl_lab.DTYPE)
    full = float(rl_lab.reduce_token_loss(per_token, mask, "token"))
    halves = [slice(0, 2), slice(2, 4)]
    # gradient accumulation as often written: each micro-batch's own token mean, averaged over micro-batches
    per_micro = sum(float(rl_lab.reduce_token_loss(per_token[part], mask[part], "token")) for part in halves) / 2
    # the fix: each micro-batch's token sum over the batch's token count
    total = float(mask.sum())
    global_count = sum(float((per_token[part] * mask[part]).sum()) / total for part in halves)
    sequence = float(rl_lab.reduce_token_loss(per_token, mask, "sequence"))
    sequence_micro = sum(float(rl_lab.reduce_token_loss(per_token[part], mask[part], "sequence"))
                         for part in halves) / 2
    return {"lengths": MICRO_LENGTHS, "micro_batches": [[0, 1], [2, 3]], "token_mean": full,
            "per_micro_batch_token_mean": per_micro, "global_token_count": global_count,
            "sequence_mean": sequence, "sequence_mean_micro_batches": sequence_micro,
            # the per-token weights: 1/(2 * tokens of its micro-batch) against 1/(batch's tokens)
            "per_micro_batch_weights": [1.0 / (2 * sum(MICRO_LENGTHS[:2])), 1.0 / (2 * sum(MICRO_LENGTHS[2:]))],
            "batch_weight": 1.0 / sum(MICRO_LENGTHS)}


def _padding_example():
    """Response log-probs of one tiny transformer (random weights, seeded) for two prompts scored alone and
    left-padded in one batch, with position ids from the mask and with arange."""
    import tiny_lm  # the course's only use of the transformer: the padding lesson

    config = tiny_lm.TinyLMConfig(vocab_size=8, n_layer=1, n_head=2, d_model=16, max_len=16, init_std=0.5)
    with torch.random.fork_rng():  # TinyLM initializes from the global generator: seed it, then restore it
        torch.manual_seed(SEED)
        model = tiny_lm.TinyLM(config).to(rl_lab.DTYPE)
    model.eval()
    width = max(len(prompt) for prompt in PADDING_PROMPTS) + len(PADDING_COMPLETION)
    ids = torch.zeros(len(PADDING_PROMPTS), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    completion = torch.zeros_like(ids)
    alone = []
    for row, prompt in enumerate(PADDING_PROMPTS):
        sequence = prompt + PADDING_COMPLETION
        start = width - len(sequence)  # left padding: the real tokens end at the right edge
        ids[row, start:] = torch.tensor(sequence)
        attention[row, start:] = 1
        completion[row, width - len(PADDING_COMPLETION):] = 1
        single = torch.tensor([sequence])
        scores = tiny_lm.completion_log_probs(model, single, torch.ones_like(single),
                                              torch.tensor([[0] * len(prompt) + [1] * len(PADDING_COMPLETION)]))
        alone.append(scores[0, -len(PADDING_COMPLETION):])
    alone = torch.stack(alone)  # (N, completion tokens)
    positions = tiny_lm.position_ids_from_mask(attention)
    arange = torch.arange(width).expand_as(ids)
    from_mask = tiny_lm.completion_log_probs(model, ids, attention, completion, position_ids=positions)
    from_arange = tiny_lm.completion_log_probs(model, ids, attention, completion, position_ids=arange)
    tail = slice(width - 1 - len(PADDING_COMPLETION), width - 1)  # the completion's scores after the shift
    return {"input_ids": ids, "attention_mask": attention, "position_ids_from_mask": positions,
            "position_ids_arange": arange,
            "max_abs_difference_mask_positions": float((from_mask[:, tail] - alone).abs().max()),
            "max_abs_difference_arange_positions": float((from_arange[:, tail] - alone).abs().max())}


def chapter_09():
    with torch.enable_grad():
        weights = _token_weights(LENGTHS, MAX_NEW_TOKENS, MAX_NEW_TOKENS)
    ids = torch.tensor(EOS_EXAMPLE)
    lengths = torch.arange(OVERLONG_MAX + 3)  # 0 .. max + 2 tokens
    short_right, long_wrong = LENGTHS[1], LENGTHS[-1]  # a right answer of 2 tokens, a wrong one of 16
    return {
        "lengths": LENGTHS, "max_new_tokens": MAX_NEW_TOKENS,
        "token_weights": weights,
        "short_right_length": short_right, "long_wrong_length": long_wrong,
        # under the sequence mean the short answer's tokens weigh long/short times more than the long one's
        "sequence_weight_ratio": float(weights["sequence"][short_right - 1] / weights["sequence"][long_wrong - 1]),
        "micro_batches": _micro_batches(),
        "eos_example": {"ids": ids, "eos": EOS, "completion_mask": rl_lab.completion_mask(ids, EOS),
                        "buggy_mask": (ids != EOS).long()},
        "padding": _padding_example(),
        "overlong": {"max_new_tokens": OVERLONG_MAX, "cache": OVERLONG_CACHE, "lengths": lengths,
                     "penalty": rl_lab.overlong_penalty(lengths, OVERLONG_MAX, OVERLONG_CACHE)},
    }


# ---------------------------------------------------------------------------------------------
# Chapter 10: the whole loop on a transformer: SFT, then RL; pass@k; entropy
# ---------------------------------------------------------------------------------------------


ONLINE_RUN = os.path.join("results-online-transformer-grpo-sequence", "online.json")  # python online_tokens.py
PASSK_SAMPLES = 64  # n samples per prompt, as the run's evaluation draws
PASSK_CORRECT = [1, 4, 16, 32]  # c correct of n for the estimator's figure
# two prompts, 64 samples each: before RL each has 14 right answers; after, one has 56 and the other none
NARROWING_BEFORE, NARROWING_AFTER = [14, 14], [56, 0]
PASSK_QUOTED_K = [1, 4, 16, 64]


def _pass_at_k_of_prompts(counts, n, k):
    """pass@k of a set of prompts: the mean over the prompts of the unbiased estimator."""
    return sum(countdown.pass_at_k(n, c, k) for c in counts) / len(counts)

# The high-entropy mask on one batch (docs/algorithms/entropy.md): seeded logits whose sharpness varies from
# token to token, as a policy's does (sure of most tokens, unsure at a few forks), and ragged lengths
ENTROPY_LENGTHS_10 = [12, 9, 6, 11]  # kept tokens of each of the N = 4 responses, R = 12 positions
ENTROPY_VOCABULARY_10 = 8
ENTROPY_TOP_QUANTILE_10 = 0.2  # the paper's rho


def _entropy_mask_batch():
    """One batch's token entropies (nats), its mask and high_entropy_token_mask's choice at the paper's rho."""
    generator = torch.Generator().manual_seed(SEED)
    count, width = len(ENTROPY_LENGTHS_10), max(ENTROPY_LENGTHS_10)
    # a sharpness per token: most tokens sure (large scale), about one in five unsure (small scale)
    scale = torch.where(torch.rand(count, width, generator=generator, dtype=rl_lab.DTYPE) < 0.2, 0.5, 4.0)
    logits = scale.unsqueeze(-1) * torch.randn(count, width, ENTROPY_VOCABULARY_10, generator=generator,
                                               dtype=rl_lab.DTYPE)  # (N, R, V)
    entropies = rl_lab.token_entropy(logits)  # (N, R, V) -> (N, R)
    mask = (torch.arange(width).unsqueeze(0) < torch.tensor(ENTROPY_LENGTHS_10).unsqueeze(1)).long()  # (N, R)
    chosen = rl_lab.high_entropy_token_mask(entropies, mask, ENTROPY_TOP_QUANTILE_10)
    return {"lengths": ENTROPY_LENGTHS_10, "vocabulary": ENTROPY_VOCABULARY_10,
            "top_quantile": ENTROPY_TOP_QUANTILE_10, "entropies": entropies, "completion_mask": mask,
            # the line the mask cuts at: the (1 - rho) quantile of the kept tokens' entropies, as the atom takes it
            "threshold": torch.quantile(entropies[mask.bool()], 1.0 - ENTROPY_TOP_QUANTILE_10),
            "mask": chosen.long(), "kept": int(mask.sum()), "chosen": int(chosen.sum())}


def chapter_10():
    with open(os.path.join(HERE, ONLINE_RUN), encoding="utf-8") as handle:
        run = json.load(handle)
    settings, evaluation = run["settings"], run["evaluation"]
    keys = [key for key in evaluation["before"] if key.startswith("pass@") and key[5:].isdigit()]  # "pass@1", ...
    ks = [int(key.split("@")[1]) for key in keys]
    n = PASSK_SAMPLES
    estimator = {c: [countdown.pass_at_k(n, c, k) for k in range(1, n + 1)] for c in PASSK_CORRECT}
    # the naive plug-in 1 - (1 - c/n)^k treats the n samples as draws with replacement: biased low
    naive = {c: [1.0 - (1.0 - c / n) ** k for k in range(1, n + 1)] for c in PASSK_CORRECT}
    return {
        "run": ONLINE_RUN,
        "settings": {key: settings[key] for key in ("algorithm", "policy", "task", "steps", "prompts", "group_size",
                                                    "beta", "learning_rate", "sft_steps", "eval_prompts",
                                                    "eval_samples", "max_new_tokens", "kl_estimator", "reduction")},
        "evaluation_split": evaluation["before"]["split"], "evaluation_prompts": evaluation["before"]["prompts"],
        "evaluation_samples": evaluation["before"]["samples"],
        "ks": ks,
        "pass_before": [evaluation["before"][key] for key in keys],
        "pass_after": [evaluation["after"][key] for key in keys],
        "entropy_before": evaluation["before"]["entropy_per_token"],
        "entropy_after": evaluation["after"]["entropy_per_token"],
        "distinct_before": evaluation["before"]["distinct_correct_per_prompt"],
        "distinct_after": evaluation["after"]["distinct_correct_per_prompt"],
        "estimator": {"samples": n, "correct": PASSK_CORRECT, "k": list(range(1, n + 1)),
                      "unbiased": {str(c): values for c, values in estimator.items()},
                      "naive": {str(c): values for c, values in naive.items()}},
        # at k = n the unbiased estimator is each prompt's 0/1 "any of its n samples correct": its noise is
        # that of a share over the evaluation's prompts, sqrt(p (1 - p) / prompts)
        "pass_at_n": {when: {"k": ks[-1], "value": evaluation[when][keys[-1]],
                             "standard_error": math.sqrt(evaluation[when][keys[-1]] * (1 - evaluation[when][keys[-1]])
                                                         / evaluation[when]["prompts"])}
                      for when in ("before", "after")} if ks[-1] == evaluation["before"]["samples"] else None,
        "narrowing": {"samples": n, "before": NARROWING_BEFORE, "after": NARROWING_AFTER,
                      "rows": [{"k": k, "before": _pass_at_k_of_prompts(NARROWING_BEFORE, n, k),
                                "after": _pass_at_k_of_prompts(NARROWING_AFTER, n, k)} for k in PASSK_QUOTED_K]},
        "entropy_mask": _entropy_mask_batch(),
    }


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

# The chapters in the course's order: the name of docs/learn/<name>.md -> the function computing it.
CHAPTERS = {
    "01-log-probabilities": chapter_01,
    "02-policy-gradient": chapter_02,
    "03-baselines-and-gae": chapter_03,
    "04-reusing-a-batch": chapter_04,
    "05-trust-regions": chapter_05,
    "06-kl-regularized-objective": chapter_06,
    "07-preferences": chapter_07,
    "08-groups": chapter_08,
    "09-sequences": chapter_09,
    "10-the-whole-loop": chapter_10,
}


def compute(chapter):
    """The chapter's report: {"chapter": name, ...its values}, rounded for the JSON."""
    with torch_threads(1), torch.no_grad():
        values = CHAPTERS[chapter]()
    return {"chapter": chapter, **_rounded(values)}


def files_of(chapter, report):
    """{relative file name: text or bytes}: the chapter's JSON and each of its figures."""
    import plot_course

    files = {f"{chapter}.json": json_text(report)}
    for name, draw in plot_course.FIGURES.get(chapter, {}).items():
        files[f"{chapter}-{name}.svg"] = plot_course.svg_bytes(draw(report))
    return files


def main(argv=None):
    args = parse(argv)
    chapters = list(CHAPTERS) if args.chapter == "all" else [args.chapter]
    files = {}
    for chapter in chapters:
        for name, data in files_of(chapter, compute(chapter)).items():
            files[os.path.join(args.output, name)] = data
    write_files(files)
    for path in files:
        print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
