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

if __name__ == "__main__":  # first: a Ctrl-C while torch loads below ends with one line, not a traceback
    from lab_start import exit_quietly_on_signals

    exit_quietly_on_signals()

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from lab_checks import torch_threads  # noqa: E402
from lab_io import OneLineErrorParser, json_text, output_folder_or_exit, run_cli, write_files  # noqa: E402
import rl_lab  # noqa: E402,F401  (the atoms every chapter is built from)

OUTPUT = "results-course"
SEED = 7


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


def _reinforce_loss(advantages, logp):
    """REINFORCE's per-sample loss -(A * logp), elementwise, A detached (Williams 1992). The lab's
    rl_lab.py has no such atom yet, so it is written here from the formula."""
    return -(advantages.detach() * logp)


def _bandit_policy_gradient(logits, rewards):
    """The exact policy gradient of the bandit, dJ/dlogits (X, A), two ways: by the score-function sum
    over every (context, action) and by autograd of the exact expected reward. Contexts weigh equally."""
    with torch.enable_grad():
        table = logits.detach().clone().requires_grad_(True)
        logp = torch.log_softmax(table, dim=-1)  # (X, A)
        # sum over x and a of p(x) pi(a|x) R(x,a) grad log pi(a|x): a REINFORCE loss weighted by probabilities
        weights = logp.exp().detach() / logits.shape[0]
        (score,) = torch.autograd.grad((-_reinforce_loss(rewards, logp) * weights).sum(), table)
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
                (gradient,) = torch.autograd.grad(_reinforce_loss(rewards[x, a], logp).mean(), table)
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
        "reinforce": rl_lab.reduce_token_loss(_reinforce_loss(expanded, logp), mask),
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
        # masking (no atom in rl_lab.py): a token whose weight exceeds the cap is dropped, the others keep theirs
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
    }


# ---------------------------------------------------------------------------------------------
# Chapter 6: the KL-regularized objective and its optimum; the KL estimators
# ---------------------------------------------------------------------------------------------


def chapter_06():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 7: preferences: Bradley-Terry, DPO, IPO, the hinge, SimPO
# ---------------------------------------------------------------------------------------------


def chapter_07():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 8: groups: GRPO's group baseline, RLOO, the std, tied groups, the group size
# ---------------------------------------------------------------------------------------------


def chapter_08():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 9: sequences: reductions, the length bias, micro-batches, EOS = PAD, left padding
# ---------------------------------------------------------------------------------------------


def chapter_09():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 10: the whole loop on a transformer: SFT, then RL; pass@k; entropy
# ---------------------------------------------------------------------------------------------


def chapter_10():
    return {}


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


def build_parser():
    parser = OneLineErrorParser(
        prog="course.py",
        description="Compute the numbers and figures of the course (docs/learn/) from the atoms.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--chapter", choices=("all", *CHAPTERS), default="all",
                        help="one chapter, or all of them")
    parser.add_argument("--output", default=OUTPUT, help="the folder for the JSON reports and figures")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    chapters = list(CHAPTERS) if args.chapter == "all" else [args.chapter]
    output_folder_or_exit(parser, args.output)
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
