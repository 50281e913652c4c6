"""Token-sequence objectives: the causal shift, a real EOS that shares its id with PAD, and the reduction.

    python token_objectives.py                              # writes results-tokens.json, prints facts and trace
    python token_objectives.py --online --loss grpo         # online training -> results-online-grpo-sequence/
    python token_objectives.py --online --loss cispo --reduction token --output results-online-cispo-token
    python -m unittest -v test_rl_lab.TokenObjectives test_rl_lab.OnlineGRPO

Part 1 (`run`): a trainable 5x5 bigram table scores two fixed answers to one prompt, a chosen answer
of 2 scored tokens and a rejected one of 3. DPO, GRPO and CISPO each take one SGD step from the same
all-zero table (old = reference = that table, frozen). Every number is small enough to check by hand:
each token starts at -ln 5, DPO starts at ln 2, GRPO's loss starts at ~0 with a nonzero gradient, and
the global token mean of the same per-token loss is 0.2 instead of 0.

Part 2 (`lesson_trace`): the GRPO/CISPO trace of the MiniMind lesson (train_grpo.py) on a fixed batch
of 2 prompts x 4 generations: flat rewards -> group-relative advantages -> completion mask (first EOS
kept, PAD and anything after dropped) -> current/old/reference token log-probs from three seeded
bigram tables -> k3 KL -> GRPO and CISPO losses, plus both gradients on one clipped token.

Part 3 (`online_train`, `--online`): the real loop on a CPU. A tiny autoregressive policy (a table of
next-token logits indexed by prompt, position and previous token) learns to write a number in binary and
stop: B prompts x G responses sampled token by token from a frozen snapshot, a rule-based verifier,
group-relative advantages, completion masks, k3 KL to the frozen initial policy, and GRPO or CISPO with a
per-sequence, per-token or constant reduction; online.csv (one row per iteration) and online.json.

Shape notation (as in rl_lab.py): B sequences (or prompts), G group size, T tokens, V vocabulary,
P prompt tokens, R completion positions.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch

from rl_lab import (
    DEVICE,
    DTYPE,
    SEED_LIMIT,
    OneLineErrorParser,
    categorical_kl,
    check_int,
    check_real,
    check_same_dtype,
    check_same_shape,
    check_tensor,
    cispo_policy_loss,
    completion_mask,
    csv_text,
    dpo_loss,
    float_flag,
    group_advantages,
    group_relative_advantages,
    grpo_policy_loss,
    int_flag,
    json_text,
    output_dir_or_exit,
    run_cli,
    output_file_or_exit,
    reduce_token_loss,
    response_token_logps,
    token_kl_penalty,
    torch_threads,
    write_text_atomic,
)

# ---------------------------------------------------------------------------------------------
# Setup
# ---------------------------------------------------------------------------------------------

# Vocabulary of the fixture. EOS and PAD share id 4: the POSITION decides which role a 4 plays.
BOS, PROMPT, GOOD, BAD, EOS = 0, 1, 2, 3, 4
PAD = EOS
VOCAB = ("BOS", "prompt", "good", "bad", "EOS/PAD")
VOCAB_SIZE = len(VOCAB)
# One prompt, chosen answer first, then rejected; rewards [1, 0] make them a group of G = 2.
INPUT_IDS = ((BOS, PROMPT, GOOD, EOS, PAD), (BOS, PROMPT, BAD, BAD, EOS))
RESPONSE_MASK = ((False, False, True, True, False), (False, False, True, True, True))
REWARDS = (1.0, 0.0)
MAX_EXTRA_PADDING = 4096

# The objective hyperparameters of SPEC section 5, restated here (not imported from the bandit) so that
# the published facts do not move if the bandit is ever retuned.
DPO_BETA = 0.5
CLIP_EPSILON = 0.2
KL_BETA = 0.03  # weight of the exact categorical KL to the reference (replaces the sampled k3 estimate)
EPSILON_HIGH = 5.0  # CISPO's absolute cap on the ratio
GROUP_ADVANTAGE_EPSILON = 1e-8  # rl_lab.group_advantages' default: advantages are +-(1 - 2e-8), not +-1
LEARNING_RATE = 0.1  # one plain SGD step: theta <- theta - lr * grad
OBJECTIVES = ("dpo", "grpo", "cispo")
PADDING_CHECK_COLUMNS = 4  # the report also shows that 4 appended PAD columns change nothing


def fixture(extra_padding=0):
    """The two fixed answers of SPEC section 5, optionally with extra PAD columns on the right.

        input_ids     [[0,1,2,4,4], [0,1,3,3,4]]      BOS prompt good EOS PAD / BOS prompt bad bad EOS
        response_mask [[F,F,T,T,F], [F,F,T,T,T]]      the real EOS is scored, the PAD is not

    Args:
        extra_padding: int in [0, 4096], PAD columns (id 4, mask False) appended to both rows.
    Returns:
        (input_ids (B=2, T=5+extra_padding) int64, response_mask (2, T) bool).
    Raises:
        ValueError for a bool, float or out-of-range extra_padding.
    """
    extra_padding = check_int("extra_padding", extra_padding, low=0, high=MAX_EXTRA_PADDING)
    ids = torch.tensor(INPUT_IDS, dtype=torch.long, device=DEVICE)
    mask = torch.tensor(RESPONSE_MASK, dtype=torch.bool, device=DEVICE)
    pad_ids = torch.full((ids.shape[0], extra_padding), PAD, dtype=torch.long, device=DEVICE)
    pad_mask = torch.zeros(ids.shape[0], extra_padding, dtype=torch.bool, device=DEVICE)
    return torch.cat([ids, pad_ids], dim=1), torch.cat([mask, pad_mask], dim=1)  # (2, 5) -> (2, 5 + extra)


def bigram_logits(table, input_ids):
    """(B, T, V) next-token logits of a bigram model: row t depends only on the token at position t."""
    return table[input_ids]  # (V, V)[(B, T)] -> (B, T, V)


def _check_tables_and_ids(actor, old, reference, input_ids):
    check_tensor("actor", actor, ndim=2)
    if actor.shape[0] != actor.shape[1]:
        raise ValueError(f"actor: expected a square (V, V) bigram table, got shape {tuple(actor.shape)}")
    check_tensor("old", old, ndim=2)
    check_tensor("reference", reference, ndim=2)
    tables = [("actor", actor), ("old", old), ("reference", reference)]
    check_same_shape(tables)
    check_same_dtype(tables)
    check_tensor("input_ids", input_ids, kind="int", ndim=2)
    if input_ids.shape[0] != len(REWARDS):
        raise ValueError(
            f"input_ids: expected {len(REWARDS)} rows (chosen, rejected), got shape {tuple(input_ids.shape)}"
        )
    vocab = actor.shape[0]
    # checked before indexing the table, so a bad id is a ValueError rather than an IndexError
    if bool(((input_ids < 0) | (input_ids >= vocab)).any()):
        raise ValueError(f"input_ids: expected ids in [0, {vocab}), got values outside")


# ---------------------------------------------------------------------------------------------
# Objectives (the "rollout" is the fixed pair: nothing is sampled in part 1)
# ---------------------------------------------------------------------------------------------


def objectives(actor, old, reference, input_ids, response_mask):
    """DPO, GRPO and CISPO on the fixed chosen/rejected pair, plus the alignment they rest on.

    Shared alignment: logits = table[input_ids] (B, T, V); `response_token_logps` applies the causal
    shift, so the scores live on T-1 positions and `valid` (B, T-1) marks the scored response tokens.

        dpo   = dpo_loss(seq_chosen, seq_rejected, ref_chosen, ref_rejected, beta 0.5)  (summed logps)
        grpo  = per token clipped loss (eps 0.2, advantage of rewards [1, 0]) + 0.03 * exact KL,
                mean over each response's valid tokens, then mean over the 2 responses
        cispo = the same with CISPO's policy term -sg(min(ratio, 5)) * A * logp

    The KL is `categorical_kl` at every observed prefix: the exact KL of the 5-token next-token
    distributions, not the sampled k3 estimate (so the atoms' own k3 weight is set to 0).

    Args:
        actor: (V, V) float bigram logits table (row = previous token); gradient flows to it.
        old: (V, V), the sampling snapshot that defines the ratio; detached here.
        reference: (V, V), the frozen reference of DPO and of the KL; detached here.
        input_ids: (2, T) int64, chosen row then rejected row (as `fixture`).
        response_mask: (2, T) bool, True on scored response tokens (a real EOS included).
    Returns:
        dict of tensors: `dpo, grpo, cispo` (scalar losses with grad), `global_token_loss` (GRPO's
        per-token loss reduced as one global token mean, with grad), `grpo_per_response` (2,) (each
        response's own token mean: the two terms the per-response reduction averages),
        `relative_margin` (scalar, DPO's (chosen - rejected) - (ref_chosen - ref_rejected) in nats,
        detached), `sequence_logps` (2,),
        `mean_logps` (2,) (sum / length), `token_logps` (2, T-1), `lengths` (2,) int64,
        `advantages` (2,), `valid` (2, T-1) bool, `kl_exact` (2, T-1) per position.
    Raises:
        ValueError naming the argument for bad tables, ids or mask (see `response_token_logps`).
    """
    _check_tables_and_ids(actor, old, reference, input_ids)
    # detached: the ratio's denominator and the reference are fixed points, never trained
    old = old.detach()
    reference = reference.detach()
    logits = bigram_logits(actor, input_ids)  # (B, T, V)
    ref_logits = bigram_logits(reference, input_ids)  # (B, T, V)
    token_logps, valid = response_token_logps(logits, input_ids, response_mask)  # (B, T-1) each
    old_token_logps, _ = response_token_logps(bigram_logits(old, input_ids), input_ids, response_mask)
    ref_token_logps, _ = response_token_logps(ref_logits, input_ids, response_mask)
    lengths = valid.sum(dim=1)  # (B, T-1) -> (B,)
    sequence_logps = token_logps.sum(dim=1)  # (B, T-1) -> (B,)
    ref_sequence_logps = ref_token_logps.sum(dim=1)

    # DPO: one pair, sequence-summed log-probs (no length normalization)
    chosen, rejected = sequence_logps[:1], sequence_logps[1:]  # (1,) each
    ref_chosen, ref_rejected = ref_sequence_logps[:1], ref_sequence_logps[1:]
    dpo = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=DPO_BETA).mean()
    relative_margin = ((chosen - rejected) - (ref_chosen - ref_rejected)).detach().squeeze(0)

    # GRPO and CISPO: one group of G = 2 answers; the sequence advantage is broadcast over its tokens
    rewards = torch.tensor([REWARDS], dtype=actor.dtype, device=DEVICE)  # (1, G)
    advantages = group_advantages(rewards, GROUP_ADVANTAGE_EPSILON).reshape(-1)  # (1, G) -> (G,), G = B = 2
    # exact KL at each scored prefix: row t of the logits is the next-token distribution after token t
    kl_exact = categorical_kl(logits[:, :-1], ref_logits[:, :-1])  # (B, T-1, V) -> (B, T-1)
    kl_sequence_mean = reduce_token_loss(kl_exact, valid, "sequence")  # scalar
    # beta=0 in the sequence atoms: the exact KL above replaces their sampled k3 term
    grpo_policy = grpo_policy_loss(token_logps, old_token_logps, ref_token_logps, advantages, valid,
                                   epsilon=CLIP_EPSILON, beta=0.0)
    cispo_policy = cispo_policy_loss(token_logps, old_token_logps, ref_token_logps, advantages, valid,
                                     epsilon_high=EPSILON_HIGH, beta=0.0)
    # the same per-token GRPO loss, reduced over all valid tokens at once (DAPO's token-level mean)
    global_token_loss = grpo_policy_loss(token_logps, old_token_logps, ref_token_logps, advantages, valid,
                                         epsilon=CLIP_EPSILON, beta=0.0, reduction="token") + (
        KL_BETA * reduce_token_loss(kl_exact, valid, "token")
    )
    # each response alone (a one-row batch reduced per sequence is that row's token mean): the two
    # terms that the per-response reduction averages
    grpo_per_response = torch.stack([
        grpo_policy_loss(token_logps[row:row + 1], old_token_logps[row:row + 1], ref_token_logps[row:row + 1],
                         advantages[row:row + 1], valid[row:row + 1], epsilon=CLIP_EPSILON, beta=0.0)
        + KL_BETA * reduce_token_loss(kl_exact[row:row + 1], valid[row:row + 1])
        for row in range(token_logps.shape[0])
    ])  # (B,)
    return {
        "dpo": dpo,
        "grpo": grpo_policy + KL_BETA * kl_sequence_mean,
        "cispo": cispo_policy + KL_BETA * kl_sequence_mean,
        "global_token_loss": global_token_loss,
        "grpo_per_response": grpo_per_response,
        "relative_margin": relative_margin,
        "sequence_logps": sequence_logps,
        "mean_logps": sequence_logps / lengths.to(sequence_logps.dtype),
        "token_logps": token_logps,
        "lengths": lengths,
        "advantages": advantages,
        "valid": valid,
        "kl_exact": kl_exact,
    }


# ---------------------------------------------------------------------------------------------
# Update: one SGD step per objective from the same initialization
# ---------------------------------------------------------------------------------------------


def _one_sgd_step(name, initial, input_ids, response_mask):
    """One SGD step on objective `name` from `initial`: (outputs before, gradient (V, V), table after)."""
    actor = initial.clone().requires_grad_(True)
    with torch.enable_grad():  # works even when the caller runs under torch.no_grad()
        before = objectives(actor, initial, initial, input_ids, response_mask)
        (gradient,) = torch.autograd.grad(before[name], actor)
    with torch.no_grad():
        after_table = initial - LEARNING_RATE * gradient
    return before, gradient, after_table


def _settings():
    return {
        "vocabulary": list(VOCAB),
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "input_ids": [list(row) for row in INPUT_IDS],
        "response_mask": [list(row) for row in RESPONSE_MASK],
        "rewards": list(REWARDS),
        "initial_table": "zeros (V, V): every next token has probability 1/5",
        "old_and_reference": "the initial table, frozen",
        "dpo_beta": DPO_BETA,
        "clip_epsilon": CLIP_EPSILON,
        "kl_beta": KL_BETA,
        "kl_estimator": "exact categorical KL(policy || reference) over the 5 next tokens at each scored prefix",
        "epsilon_high": EPSILON_HIGH,
        "group_advantage_epsilon": GROUP_ADVANTAGE_EPSILON,
        "reduction": "per response (mean over its valid tokens), then mean over responses",
        "optimizer": "SGD, one step",
        "learning_rate": LEARNING_RATE,
        "dtype": str(DTYPE).replace("torch.", ""),
        "device": str(DEVICE),
        "torch": torch.__version__,
    }


@torch_threads(1)
def run():
    """Part 1: the facts of SPEC section 5 plus the lesson trace; returns a JSON-ready dict.

    Keys: `settings`; `alignment` (lengths, sequence/mean/token logps, advantages, valid);
    `eos_pad_bug` (the `mask & (ids != 4)` mask and what it changes); `reduction` (per-response vs
    global token mean at the initial table); `initial_global_token_loss`; `dpo`, `grpo`, `cispo` each
    with `initial_loss, final_loss, gradient_norm, relative_margin_before, relative_margin_after`;
    `cispo_vs_grpo`; `padding_invariance`; `trace` (see `lesson_trace`).
    """
    input_ids, response_mask = fixture()
    initial = torch.zeros(VOCAB_SIZE, VOCAB_SIZE, dtype=DTYPE, device=DEVICE)
    report = {"settings": _settings()}

    # alignment at the initial table (old = reference = actor)
    with torch.no_grad():
        start = objectives(initial, initial, initial, input_ids, response_mask)
        # the classic bug: dropping every 4 also drops the real EOS of both rows
        buggy_mask = response_mask & (input_ids != EOS)
        buggy = objectives(initial, initial, initial, input_ids, buggy_mask)
    report["alignment"] = {
        "lengths": start["lengths"].tolist(),
        "sequence_logps": start["sequence_logps"].tolist(),
        "mean_logps": start["mean_logps"].tolist(),
        "token_logps": start["token_logps"].tolist(),
        "advantages": start["advantages"].tolist(),
        "valid": start["valid"].tolist(),
        "minus_ln5": -math.log(VOCAB_SIZE),
    }
    report["eos_pad_bug"] = {
        "mask_expression": "response_mask & (input_ids != 4)",
        "mask": buggy_mask.tolist(),
        "lengths": buggy["lengths"].tolist(),
        "sequence_logps": buggy["sequence_logps"].tolist(),
        "sequence_logp_shift": (buggy["sequence_logps"] - start["sequence_logps"]).tolist(),
        "ln5": math.log(VOCAB_SIZE),
    }
    report["reduction"] = {
        "token_counts": start["lengths"].tolist(),
        "per_response_grpo_losses": start["grpo_per_response"].tolist(),
        "per_response_mean": start["grpo"].item(),
        "global_token_mean": start["global_token_loss"].item(),
    }
    report["initial_global_token_loss"] = start["global_token_loss"].item()

    # update: one SGD step per objective, each from the same zeros
    after_tables, gradients = {}, {}
    for name in OBJECTIVES:
        before, gradient, after_table = _one_sgd_step(name, initial, input_ids, response_mask)
        with torch.no_grad():
            after = objectives(after_table, initial, initial, input_ids, response_mask)
        after_tables[name], gradients[name] = after_table, gradient
        report[name] = {
            "initial_loss": before[name].item(),
            "final_loss": after[name].item(),
            "gradient_norm": gradient.norm().item(),
            "relative_margin_before": before["relative_margin"].item(),
            "relative_margin_after": after["relative_margin"].item(),
        }
    report["cispo_vs_grpo"] = {
        "gradient_max_abs_difference": (gradients["cispo"] - gradients["grpo"]).abs().max().item(),
        "parameter_max_abs_difference_after_step": (after_tables["cispo"] - after_tables["grpo"]).abs().max().item(),
        "grpo_loss_after_step": report["grpo"]["final_loss"],
        "cispo_loss_after_step": report["cispo"]["final_loss"],
        "reading": "same parameters, different loss values: the CISPO value is not a surrogate of GRPO's",
    }
    report["padding_invariance"] = _padding_invariance(initial, report, gradients)
    report["trace"] = lesson_trace()
    return report


def _padding_invariance(initial, report, gradients):
    """Largest change of each initial loss and gradient when PADDING_CHECK_COLUMNS PAD columns are appended."""
    padded_ids, padded_mask = fixture(PADDING_CHECK_COLUMNS)
    loss_difference, gradient_difference = 0.0, 0.0
    for name in OBJECTIVES:
        padded, padded_gradient, _ = _one_sgd_step(name, initial, padded_ids, padded_mask)
        loss_difference = max(loss_difference, abs(padded[name].item() - report[name]["initial_loss"]))
        gradient_difference = max(gradient_difference, (padded_gradient - gradients[name]).abs().max().item())
    return {
        "extra_pad_columns": PADDING_CHECK_COLUMNS,
        "max_abs_loss_difference": loss_difference,
        "max_abs_gradient_difference": gradient_difference,
    }


# ---------------------------------------------------------------------------------------------
# Part 2: the lesson's GRPO/CISPO trace (MiniMind train_grpo.py:121-143)
# ---------------------------------------------------------------------------------------------

# picked among seeds 0..29: kept tokens are clipped on both sides (ratio > 1.2 with A > 0, < 0.8 with
# A < 0), others are not, all ratios stay in [0.5, 2] and none sits within 0.01 of a clip edge
TRACE_SEED = 20
TRACE_BOS, TRACE_PROMPT_A, TRACE_PROMPT_B, TRACE_GOOD, TRACE_BAD, TRACE_EOS = 0, 1, 2, 3, 4, 5
TRACE_PAD = TRACE_EOS
TRACE_VOCAB = ("BOS", "prompt_a", "prompt_b", "good", "bad", "EOS/PAD")
TRACE_NUM_GENERATIONS = 4
TRACE_EPSILON = 0.2
TRACE_EPSILON_HIGH = 5.0
TRACE_BETA = 0.1
TRACE_ADVANTAGE_EPS = 1e-4
# reference = 0.5 * noise; old = reference + 0.3 * noise; current = old + 0.3 * noise: three tables that
# differ, with ratios current/old inside about [0.5, 1.5] so the clip of 0.2 is crossed on some tokens
TRACE_REFERENCE_SCALE = 0.5
TRACE_OLD_DRIFT = 0.3
TRACE_CURRENT_DRIFT = 0.3

# (B, P) prompts; (B*G, R) completions, prompt-major; pad mask True on real (generated) positions.
TRACE_PROMPTS = ((TRACE_BOS, TRACE_PROMPT_A), (TRACE_BOS, TRACE_PROMPT_B))
_G, _B, _E = TRACE_GOOD, TRACE_BAD, TRACE_EOS
TRACE_COMPLETIONS = (
    (_G, _E, _E, _E),  # prompt a: good EOS, then 2 PAD (padded rollout: the pad mask ends the row)
    (_B, _B, _E, _E),  # prompt a: bad bad EOS EOS, pad mask all 1 (torch rollout): the mask stops at the FIRST EOS
    (_G, _B, _G, _E),  # prompt a: EOS in the last slot
    (_B, _G, _B, _B),  # prompt a: no EOS (stopped at max_new_tokens): every position counts
    (_G, _E, _E, _E),  # prompt b: every answer earns 1 (a degenerate group: exact zero advantages)
    (_G, _E, _G, _B),  # prompt b: tokens generated after the EOS are real but dropped
    (_E, _E, _E, _E),  # prompt b: EOS at once, then 3 PAD
    (_G, _G, _B, _E),  # prompt b: no EOS among the real positions, then 1 PAD: kept up to its padding
)
TRACE_PAD_MASK = (
    (1, 1, 0, 0), (1, 1, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1),
    (1, 1, 0, 0), (1, 1, 1, 1), (1, 0, 0, 0), (1, 1, 1, 0),
)
TRACE_REWARDS = (1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 1.0, 1.0)  # (B*G,), prompt-major as calculate_rewards writes them


def trace_batch():
    """The fixed batch of the trace: (prompt_ids (B, P), completion_ids (B*G, R), pad_mask (B*G, R) bool,
    rewards (B*G,) float64). PAD positions hold the EOS id; only the pad mask tells them apart."""
    return (
        torch.tensor(TRACE_PROMPTS, dtype=torch.long, device=DEVICE),
        torch.tensor(TRACE_COMPLETIONS, dtype=torch.long, device=DEVICE),
        torch.tensor(TRACE_PAD_MASK, dtype=torch.bool, device=DEVICE),
        torch.tensor(TRACE_REWARDS, dtype=DTYPE, device=DEVICE),
    )


def trace_tables(seed=TRACE_SEED):
    """(reference, old, current) (V, V) float64 bigram tables drawn from one seeded torch.Generator."""
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (len(TRACE_VOCAB), len(TRACE_VOCAB))
    reference = TRACE_REFERENCE_SCALE * torch.randn(shape, generator=generator, dtype=DTYPE, device=DEVICE)
    old = reference + TRACE_OLD_DRIFT * torch.randn(shape, generator=generator, dtype=DTYPE, device=DEVICE)
    current = old + TRACE_CURRENT_DRIFT * torch.randn(shape, generator=generator, dtype=DTYPE, device=DEVICE)
    return reference, old, current


def completion_token_logps(table, prompt_ids, completion_ids, num_generations):
    """(B*G, R) log-prob of every completion position (PAD included, as in the lesson; the mask drops it).

    The sequence is prompt + completion (B*G, P+R); after the causal shift, column P-1 of the
    (B*G, P+R-1) scores is the first completion token (the lesson's `.gather(1, logp_pos)`).
    """
    prompts = prompt_ids.repeat_interleave(num_generations, dim=0)  # (B, P) -> (B*G, P), prompt-major
    sequences = torch.cat([prompts, completion_ids], dim=1)  # (B*G, P+R)
    prompt_length = prompt_ids.shape[1]
    scored = torch.zeros_like(sequences, dtype=torch.bool)
    scored[:, prompt_length:] = True  # every completion position, so PAD gets a real score here
    token_logps, _ = response_token_logps(bigram_logits(table, sequences), sequences, scored)  # (B*G, P+R-1)
    return token_logps[:, prompt_length - 1:]  # (B*G, P+R-1) -> (B*G, R)


def lesson_trace(seed=TRACE_SEED):
    """The lesson's GRPO/CISPO trace on the fixed batch; returns a JSON-ready dict.

    ratio_min / ratio_max are over the tokens the completion mask keeps; kl_mean is the k3 mean over
    those tokens (every kept token weighs the same). `clipped_token` is the first kept token with a
    positive advantage and ratio > 1 + eps: PPO-Clip's policy term gives it zero gradient, CISPO's
    gives -min(ratio, eps_high) * A / (N * L); the k3 term adds the same gradient to both.
    """
    prompt_ids, completion_ids, pad_mask, rewards = trace_batch()
    num_generations = TRACE_NUM_GENERATIONS
    reference, old, current = trace_tables(seed)
    # advantages: relative to the group (train_grpo.py:121-124)
    grouped_rewards = rewards.reshape(-1, num_generations)  # (B*G,) -> (B, G)
    group_mean = grouped_rewards.mean(dim=1)  # (B,)
    group_std = grouped_rewards.std(dim=1, correction=0)  # (B,), population std as the lesson's unbiased=False
    advantages = group_relative_advantages(rewards, num_generations, eps=TRACE_ADVANTAGE_EPS)  # (B*G,)
    # mask: up to and including the first EOS among real positions (train_grpo.py:126-130)
    mask = completion_mask(completion_ids, TRACE_EOS, pad_mask)  # (B*G, R) int64
    kept = mask.bool()
    # token log-probs under the three tables (train_grpo.py:97-105); only the current one is trained
    with torch.no_grad():
        old_logps = completion_token_logps(old, prompt_ids, completion_ids, num_generations)
        ref_logps = completion_token_logps(reference, prompt_ids, completion_ids, num_generations)
        current_logps = completion_token_logps(current, prompt_ids, completion_ids, num_generations)
    ratio = (current_logps - old_logps).exp()  # (B*G, R)
    kl_k3 = token_kl_penalty(current_logps, ref_logps)  # (B*G, R)

    losses, gradients = {}, {}
    with torch.enable_grad():
        for name, loss_fn, kwargs in (
            ("grpo", grpo_policy_loss, {"epsilon": TRACE_EPSILON}),
            ("cispo", cispo_policy_loss, {"epsilon_high": TRACE_EPSILON_HIGH}),
        ):
            for beta in (TRACE_BETA, 0.0):  # the full loss, then its policy term alone
                policy_logps = current_logps.clone().requires_grad_(True)  # a leaf: gradient per token log-prob
                loss = loss_fn(policy_logps, old_logps, ref_logps, advantages, mask, beta=beta, **kwargs)
                (gradient,) = torch.autograd.grad(loss, policy_logps)
                losses[name, beta], gradients[name, beta] = loss.item(), gradient

    clipped = (advantages.unsqueeze(1) > 0) & kept & (ratio > 1.0 + TRACE_EPSILON)  # (B*G, R)
    row, position = (int(index) for index in clipped.nonzero()[0])
    return {
        "settings": {
            "seed": seed,
            "vocabulary": list(TRACE_VOCAB),
            "eos_token_id": TRACE_EOS,
            "pad_token_id": TRACE_PAD,
            "num_generations": num_generations,
            "epsilon": TRACE_EPSILON,
            "epsilon_high": TRACE_EPSILON_HIGH,
            "beta": TRACE_BETA,
            "kl_estimator": "k3 per token: exp(ref - policy) - (ref - policy) - 1",
            "advantage_eps": TRACE_ADVANTAGE_EPS,
            "tables": f"reference = {TRACE_REFERENCE_SCALE} * randn; old = reference + {TRACE_OLD_DRIFT} * randn; "
                      f"current = old + {TRACE_CURRENT_DRIFT} * randn (one generator, in that order)",
            "reduction": "per response (mean over its kept tokens), then mean over responses",
        },
        "prompt_ids": prompt_ids.tolist(),
        "completion_ids": completion_ids.tolist(),
        "pad_mask": pad_mask.long().tolist(),
        "rewards": rewards.tolist(),
        "grouped_rewards": grouped_rewards.tolist(),
        "group_mean": group_mean.tolist(),
        "group_std": group_std.tolist(),
        "advantages": advantages.tolist(),
        "completion_mask": mask.tolist(),
        "current_logps": current_logps.tolist(),
        "old_logps": old_logps.tolist(),
        "ref_logps": ref_logps.tolist(),
        "ratio": ratio.tolist(),
        "kl_k3": kl_k3.tolist(),
        "ratio_min": ratio[kept].min().item(),
        "ratio_max": ratio[kept].max().item(),
        "kl_mean": kl_k3[kept].mean().item(),
        "grpo_loss": losses["grpo", TRACE_BETA],
        "cispo_loss": losses["cispo", TRACE_BETA],
        "clipped_token": {
            "row": row,
            "position": position,
            "token_id": int(completion_ids[row, position]),
            "advantage": advantages[row].item(),
            "ratio": ratio[row, position].item(),
            "grpo_gradient": gradients["grpo", TRACE_BETA][row, position].item(),
            "cispo_gradient": gradients["cispo", TRACE_BETA][row, position].item(),
            "grpo_policy_term_gradient": gradients["grpo", 0.0][row, position].item(),
            "cispo_policy_term_gradient": gradients["cispo", 0.0][row, position].item(),
            "reading": "gradient of the loss w.r.t. this token's log-prob: PPO-Clip drops the token's policy "
                       "gradient, CISPO keeps it with the detached weight min(ratio, epsilon_high)",
        },
    }


# ---------------------------------------------------------------------------------------------
# Part 3: online GRPO / CISPO (`--online`): sample, verify, update a tiny autoregressive policy
# ---------------------------------------------------------------------------------------------
# The task: write the prompt's number in binary, then stop. Prompt n in 0..5 has one correct answer
# (format(n, "b"): "0", "1", "10", "11", "100", "101") and the verifier checks the exact tokens and the
# EOS. The policy is a table of next-token logits indexed by (prompt, position, previous token): the
# previous token is what an autoregressive model conditions on; the position lets the table write
# "11" and "100", whose repeated digits a previous-token-only table could not tell apart.

ONLINE_VOCAB = ("0", "1", "EOS")
ONLINE_EOS = 2
ONLINE_PAD = ONLINE_EOS  # PAD shares the EOS id: only the position (after the first EOS) makes it PAD
ONLINE_BOS_STATE = len(ONLINE_VOCAB)  # the "previous token" of the first position
ONLINE_NUMBERS = tuple(range(6))
ONLINE_ANSWERS = tuple(tuple(int(bit) for bit in format(n, "b")) for n in ONLINE_NUMBERS)
REWARD_CORRECT = 1.0  # the exact answer followed by EOS
REWARD_PARTIAL = 0.25  # the right answer at the start of a response that hit the cap without EOS
ONLINE_LOSSES = {"grpo": grpo_policy_loss, "cispo": cispo_policy_loss}  # names -> atoms (no switch inside)
ONLINE_REDUCTIONS = ("sequence", "token", "constant")
ONLINE_GROUP_EPS = 1e-4  # the lesson's eps of group_relative_advantages
ONLINE_MAX_GRAD_NORM = 1.0
ONLINE_DEFAULTS = {
    "loss": "grpo", "reduction": "sequence", "steps": 60, "seed": 7, "prompts": 8, "group_size": 8,
    "max_new_tokens": 5, "temperature": 1.0, "updates_per_batch": 2, "beta": 0.02, "epsilon": 0.2,
    "epsilon_high": 5.0, "learning_rate": 0.2,
}
ONLINE_COLUMNS = [
    "step", "optimizer_steps", "tokens_sampled", "total_tokens_sampled", "reward_mean", "success_rate",
    "partial_rate", "mean_response_length", "truncated_fraction", "zero_group_fraction", "ratio_min",
    "ratio_max", "clip_fraction_naive", "clip_fraction_effective", "capped_fraction", "kl_k3", "entropy",
    "loss", "success_probability",
]


def online_logits(table, prompts, positions, previous, temperature):
    """(..., V) tempered next-token logits of the table policy: table[prompt, position, previous] / T.

    table (P, R, V+1, V); prompts, positions and previous broadcast to the same shape (...).
    Sampling and scoring both call this, so old and current log-probs use the same tempered logits.
    """
    return table[prompts, positions, previous] / temperature


def completion_logits(table, prompts, completion_ids, temperature):
    """(N, R, V) tempered logits at every completion position, given the tokens before it (teacher forcing).

    prompts (N,) int64; completion_ids (N, R) int64. The previous token of position 0 is the BOS state.
    """
    count, length = completion_ids.shape
    bos = torch.full((count, 1), ONLINE_BOS_STATE, dtype=torch.long, device=DEVICE)
    previous = torch.cat([bos, completion_ids[:, :-1]], dim=1)  # (N, R): the token before each position
    positions = torch.arange(length, device=DEVICE).expand(count, length)  # (R,) -> (N, R)
    return online_logits(table, prompts.unsqueeze(1), positions, previous, temperature)  # (N, R, V)


def online_token_logps(table, prompts, completion_ids, temperature):
    """(N, R) log-prob of every completion token under `table` (PAD positions included; masks drop them)."""
    return logps_of_tokens(completion_logits(table, prompts, completion_ids, temperature), completion_ids)


def logps_of_tokens(logits, completion_ids):
    """(N, R) log-prob of each token in completion_ids under (N, R, V) logits."""
    logp = torch.log_softmax(logits, dim=-1)  # (N, R, V)
    return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (N, R, 1) -> (N, R)


def sample_completions(table, prompts, max_new_tokens, temperature, generator):
    """Sample one completion per prompt token by token from `table` (the frozen old policy).

    Returns (completion_ids (N, R) int64 with PAD after the first EOS, real (N, R) bool True up to and
    including the EOS, truncated (N,) bool: the response hit max_new_tokens without an EOS).
    """
    count = prompts.shape[0]
    completion_ids = torch.full((count, max_new_tokens), ONLINE_PAD, dtype=torch.long, device=DEVICE)
    real = torch.zeros(count, max_new_tokens, dtype=torch.bool, device=DEVICE)
    previous = torch.full((count,), ONLINE_BOS_STATE, dtype=torch.long, device=DEVICE)
    finished = torch.zeros(count, dtype=torch.bool, device=DEVICE)
    with torch.no_grad():
        for position in range(max_new_tokens):
            positions = torch.full((count,), position, dtype=torch.long, device=DEVICE)
            probs = torch.softmax(online_logits(table, prompts, positions, previous, temperature), dim=-1)  # (N, V)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N, 1) -> (N,)
            tokens = torch.where(finished, torch.full_like(tokens, ONLINE_PAD), tokens)  # PAD after the EOS
            real[:, position] = ~finished
            completion_ids[:, position] = tokens
            finished = finished | (tokens == ONLINE_EOS)
            previous = tokens
    return completion_ids, real, ~finished


def verify(number, tokens, truncated):
    """The rule-based reward of one response: 1 for the exact binary answer then EOS, REWARD_PARTIAL
    for a truncated response (no EOS) that starts with the right answer, 0 otherwise.

    number: the prompt's int in 0..5; tokens: the response's real token ids (a list or tuple of ints in
    0..2, the EOS included if any); truncated: bool, True when the response hit the length cap (then
    it holds no EOS). Raises ValueError naming the argument for anything else.
    """
    number = check_int("number", number, low=0, high=len(ONLINE_ANSWERS) - 1)
    if not isinstance(tokens, (list, tuple)) or not all(
        isinstance(token, int) and not isinstance(token, bool) and 0 <= token < len(ONLINE_VOCAB) for token in tokens
    ):
        raise ValueError(f"tokens: expected a list of token ids in [0, {len(ONLINE_VOCAB)}), got {tokens!r}")
    if not isinstance(truncated, bool):
        raise ValueError(f"truncated: expected a bool, got {type(truncated).__name__}")
    tokens = list(tokens)
    if truncated and ONLINE_EOS in tokens:
        raise ValueError("truncated: a response that holds an EOS stopped; it cannot be truncated")
    answer = list(ONLINE_ANSWERS[number])
    if not truncated and tokens == answer + [ONLINE_EOS]:
        return REWARD_CORRECT
    if truncated and tokens[: len(answer)] == answer:
        return REWARD_PARTIAL
    return 0.0


def answer_table():
    """(P, R=4) the correct completions (answer, EOS, then PAD) and their (P, R) bool real mask."""
    length = max(len(answer) for answer in ONLINE_ANSWERS) + 1
    ids = torch.full((len(ONLINE_ANSWERS), length), ONLINE_PAD, dtype=torch.long, device=DEVICE)
    real = torch.zeros(len(ONLINE_ANSWERS), length, dtype=torch.bool, device=DEVICE)
    for number, answer in enumerate(ONLINE_ANSWERS):
        ids[number, : len(answer) + 1] = torch.tensor(list(answer) + [ONLINE_EOS])
        real[number, : len(answer) + 1] = True
    return ids, real


def success_probability(table, temperature):
    """Exact mean over prompts of p(correct answer then EOS): the product of its token probabilities.

    table: (P=6, R, V+1=4, V=3) float logits of the online policy; temperature in (0, 10].
    Raises ValueError naming the argument for a bad table or temperature.
    """
    _check_online_table(table)
    check_real("temperature", temperature, low=0.0, high=10.0, low_open=True)
    ids, real = answer_table()
    if ids.shape[1] > table.shape[1]:  # the cap is shorter than the longest answer + EOS
        ids, real = ids[:, : table.shape[1]], real[:, : table.shape[1]]
        reachable = torch.tensor([len(answer) + 1 <= table.shape[1] for answer in ONLINE_ANSWERS])
    else:
        reachable = torch.ones(len(ONLINE_ANSWERS), dtype=torch.bool)
    with torch.no_grad():
        logps = online_token_logps(table[:, : ids.shape[1]], torch.arange(ids.shape[0]), ids, temperature)
        path = torch.where(real, logps, torch.zeros_like(logps)).sum(dim=1).exp()  # (P,)
        return torch.where(reachable, path, torch.zeros_like(path)).mean().item()


def _check_online_table(table):
    check_tensor("table", table, ndim=4)
    prompts, _, states, vocab = table.shape
    if (prompts, states, vocab) != (len(ONLINE_NUMBERS), len(ONLINE_VOCAB) + 1, len(ONLINE_VOCAB)):
        raise ValueError(
            f"table: expected shape ({len(ONLINE_NUMBERS)}, R, {len(ONLINE_VOCAB) + 1}, {len(ONLINE_VOCAB)}), "
            f"got {tuple(table.shape)}"
        )


def _check_state(state):
    keys = ("config", "generator", "table", "reference", "optimizer", "loss_fn", "loss_kwargs")
    if not isinstance(state, dict) or any(key not in state for key in keys):
        raise ValueError("state: expected the dict returned by online_setup()")


def _check_batch(batch, state):
    if not isinstance(batch, dict) or any(key not in batch for key in _BATCH_KEYS):
        raise ValueError("batch: expected the dict returned by online_rollout()")
    count = state["config"]["prompts"] * state["config"]["group_size"]
    shape = (count, state["config"]["max_new_tokens"])
    if tuple(batch["completion_ids"].shape) != shape or tuple(batch["advantages"].shape) != (count,):
        raise ValueError(f"batch: expected {count} responses of {shape[1]} positions, from this state's rollout")


_BATCH_KEYS = ("prompts", "completion_ids", "real", "truncated", "rewards", "advantages", "mask", "old_logps",
               "ref_logps", "old_logits")


def _online_settings(config):
    settings = dict(config)
    settings.update({
        "task": "write the prompt's number in binary, then EOS",
        "vocabulary": list(ONLINE_VOCAB),
        "eos_token_id": ONLINE_EOS,
        "pad_token_id": ONLINE_PAD,
        "prompts_and_answers": {str(n): format(n, "b") for n in ONLINE_NUMBERS},
        "reward_correct": REWARD_CORRECT,
        "reward_partial_truncated": REWARD_PARTIAL,
        "policy": "table of logits (prompt, position, previous token) -> next token, zeros at start (uniform)",
        "reference": "the initial policy, frozen",
        "old_policy": "a frozen snapshot taken before each batch is sampled",
        "optimizer": "Adam",
        "max_grad_norm": ONLINE_MAX_GRAD_NORM,
        "group_advantage_eps": ONLINE_GROUP_EPS,
        "kl": "k3 per token inside the loss atoms (beta); kl_k3 column: old vs reference on the sampled tokens",
        "truncated_responses": "kept in the loss: every real token counts (no EOS to score)",
        "dtype": str(DTYPE).replace("torch.", ""),
        "device": str(DEVICE),
        "torch": torch.__version__,
    })
    return settings


def online_config(**overrides):
    """ONLINE_DEFAULTS with `overrides`, validated; raises ValueError naming the bad key."""
    unknown = sorted(set(overrides) - set(ONLINE_DEFAULTS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a setting of the online run (expected one of {', '.join(ONLINE_DEFAULTS)})")
    config = {**ONLINE_DEFAULTS, **overrides}
    if not isinstance(config["loss"], str) or config["loss"] not in ONLINE_LOSSES:
        raise ValueError(f"loss: expected 'grpo' or 'cispo', got {config['loss']!r}")
    if not isinstance(config["reduction"], str) or config["reduction"] not in ONLINE_REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(ONLINE_REDUCTIONS)}, got {config['reduction']!r}")
    for name, low, high in (("steps", 1, 100_000), ("seed", 0, 2**63 - 1), ("prompts", 1, 4096),
                            ("group_size", 2, 1024), ("max_new_tokens", 1, 64), ("updates_per_batch", 1, 64)):
        check_int(name, config[name], low=low, high=high)
    check_real("temperature", config["temperature"], low=0.0, high=10.0, low_open=True)
    check_real("beta", config["beta"], low=0.0, high=10.0)
    check_real("epsilon", config["epsilon"], low=0.0, high=1.0, high_open=True)
    check_real("epsilon_high", config["epsilon_high"], low=0.0, high=100.0, low_open=True)
    check_real("learning_rate", config["learning_rate"], low=0.0, high=10.0, low_open=True)
    return config


def online_setup(**overrides):
    """Everything a run holds: config, generator, policy table, frozen reference, optimizer, counters.

    The table (P, R, V+1, V) starts at zeros (a uniform policy) and the reference is a frozen copy.
    """
    config = online_config(**overrides)
    shape = (len(ONLINE_NUMBERS), config["max_new_tokens"], len(ONLINE_VOCAB) + 1, len(ONLINE_VOCAB))
    table = torch.zeros(shape, dtype=DTYPE, device=DEVICE, requires_grad=True)
    loss_kwargs = {"beta": config["beta"], "reduction": config["reduction"], "max_new_tokens": config["max_new_tokens"]}
    if config["loss"] == "grpo":
        loss_kwargs["epsilon"] = config["epsilon"]
    else:
        loss_kwargs["epsilon_high"] = config["epsilon_high"]
    return {
        "config": config,
        "generator": torch.Generator(device=DEVICE).manual_seed(config["seed"]),  # the one seeding point
        "table": table,
        "reference": torch.zeros(shape, dtype=DTYPE, device=DEVICE),
        "optimizer": torch.optim.Adam([table], lr=config["learning_rate"]),
        "loss_fn": ONLINE_LOSSES[config["loss"]],
        "loss_kwargs": loss_kwargs,
        "optimizer_steps": 0,
        "total_tokens": 0,
    }


def online_rollout(state):
    """Sample B prompts x G responses from a frozen snapshot, score them and build the batch.

    Returns a dict: prompts (B*G,) prompt-major, completion_ids / real (B*G, R), truncated (B*G,),
    rewards (B*G,), advantages (B*G,), mask (B*G, R) int64, old_logps / ref_logps (B*G, R) and
    old_logits (B*G, R, V), all without grad.
    """
    _check_state(state)
    config = state["config"]
    temperature, group_size = config["temperature"], config["group_size"]
    old = state["table"].detach().clone()
    numbers = torch.randint(0, len(ONLINE_NUMBERS), (config["prompts"],), generator=state["generator"])  # (B,)
    prompts = numbers.repeat_interleave(group_size)  # (B,) -> (B*G,)
    completion_ids, real, truncated = sample_completions(
        old, prompts, config["max_new_tokens"], temperature, state["generator"]
    )
    rewards = torch.tensor(
        [verify(number, ids[row_real].tolist(), cut)
         for number, ids, row_real, cut in zip(prompts.tolist(), completion_ids, real, truncated.tolist())],
        dtype=DTYPE, device=DEVICE,
    )  # (B*G,)
    # advantages relative to each prompt's group; the mask keeps tokens up to the first EOS
    advantages = group_relative_advantages(rewards, group_size, eps=ONLINE_GROUP_EPS)
    mask = completion_mask(completion_ids, ONLINE_EOS, real)  # (B*G, R)
    with torch.no_grad():
        # cached once, from the same tempered logits the update uses: the ratio is exactly 1 at first
        old_logits = completion_logits(old, prompts, completion_ids, temperature)  # (B*G, R, V)
        old_logps = logps_of_tokens(old_logits, completion_ids)  # the same ops as online_token_logps(old, ...)
        ref_logps = online_token_logps(state["reference"], prompts, completion_ids, temperature)
    return {
        "prompts": prompts, "completion_ids": completion_ids, "real": real, "truncated": truncated,
        "rewards": rewards, "advantages": advantages, "mask": mask, "old_logps": old_logps,
        "ref_logps": ref_logps, "old_logits": old_logits,
    }


def clip_diagnostics(ratio, advantages, loss, epsilon, epsilon_high):
    """Shares of tokens, for ratios (K,) and their sequences' advantages (K,):

    - clip_fraction_naive: |ratio - 1| > epsilon, the usual PPO count;
    - clip_fraction_effective: tokens whose policy-gradient term the loss zeroes. GRPO's PPO-Clip zeroes
      it only on the side the policy already moved toward: A > 0 and ratio > 1 + eps, or A < 0 and
      ratio < 1 - eps (the other side keeps the unclipped branch and its gradient). CISPO never zeroes
      it: 0. (The k3 term still passes gradient in both.)
    - capped_fraction: ratio > epsilon_high, where CISPO caps the detached weight; for GRPO only a count.
    """
    if loss == "grpo":
        zeroed = ((advantages > 0) & (ratio > 1.0 + epsilon)) | ((advantages < 0) & (ratio < 1.0 - epsilon))
    else:
        zeroed = torch.zeros_like(ratio, dtype=torch.bool)
    return {
        "clip_fraction_naive": ((ratio - 1.0).abs() > epsilon).double().mean().item(),
        "clip_fraction_effective": zeroed.double().mean().item(),
        "capped_fraction": (ratio > epsilon_high).double().mean().item(),
    }


class TrainingDiverged(FloatingPointError):
    """The policy moved so far within one batch that a ratio or the k3 term overflows exp()."""


def _check_exponents(logps, batch, kept):
    """Raise TrainingDiverged before exp() of a log-ratio (ratio) or of ref - logp (k3) overflows."""
    limit = math.log(torch.finfo(logps.dtype).max)  # about 709.8 nats in float64
    largest = max((logps - batch["old_logps"])[kept].max().item(), (batch["ref_logps"] - logps)[kept].max().item())
    if largest > limit:
        raise TrainingDiverged(
            f"a log-ratio of {largest:.0f} nats overflows exp(): the policy moved too far within one batch "
            "(lower --lr or --updates-per-batch, or raise --temperature)"
        )


def online_update(state, batch):
    """`updates_per_batch` Adam steps on the GRPO or CISPO loss of one batch; returns their diagnostics.

    Ratios and clip fractions are those each pass's loss saw (before its step), over kept tokens,
    averaged over the passes; see `clip_diagnostics` for the three fractions.
    """
    _check_state(state)
    _check_batch(batch, state)
    config = state["config"]
    kept = batch["mask"].bool()
    signs = batch["advantages"].unsqueeze(1).expand_as(kept)[kept]  # (B*G,) -> (B*G, R) -> (kept,)
    losses, ratios = [], []
    diagnostics = {"clip_fraction_naive": [], "clip_fraction_effective": [], "capped_fraction": []}
    for _ in range(config["updates_per_batch"]):
        logps = online_token_logps(state["table"], batch["prompts"], batch["completion_ids"], config["temperature"])
        _check_exponents(logps.detach(), batch, kept)
        loss = state["loss_fn"](logps, batch["old_logps"], batch["ref_logps"], batch["advantages"], batch["mask"],
                                **state["loss_kwargs"])
        state["optimizer"].zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([state["table"]], ONLINE_MAX_GRAD_NORM)
        state["optimizer"].step()
        state["optimizer_steps"] += 1
        with torch.no_grad():
            ratio = (logps.detach() - batch["old_logps"]).exp()[kept]  # (kept,): the ratios this pass's loss saw
        losses.append(loss.item())
        ratios.append(ratio)
        for name, value in clip_diagnostics(ratio, signs, config["loss"], config["epsilon"],
                                            config["epsilon_high"]).items():
            diagnostics[name].append(value)
    passes = len(losses)
    all_ratios = torch.cat(ratios)
    return {
        "loss": math.fsum(losses) / passes,
        "ratio_min": all_ratios.min().item(),
        "ratio_max": all_ratios.max().item(),
        **{name: math.fsum(values) / passes for name, values in diagnostics.items()},
    }


def online_record(state, batch, update, step):
    """One CSV row: batch statistics (responses sampled this iteration), update diagnostics, and the
    exact success probability of the policy after the update."""
    config = state["config"]
    kept = batch["mask"].bool()
    rewards = batch["rewards"]
    tokens_sampled = int(kept.sum().item())
    state["total_tokens"] += tokens_sampled
    with torch.no_grad():
        old_logp_all = torch.log_softmax(batch["old_logits"], dim=-1)  # (B*G, R, V)
        entropy = -(old_logp_all.exp() * old_logp_all).sum(dim=-1)[kept].mean().item()
        grouped = rewards.reshape(-1, config["group_size"])  # (B*G,) -> (B, G)
        kl_k3 = token_kl_penalty(batch["old_logps"], batch["ref_logps"])[kept].mean().item()
    row = {
        "step": step,
        "optimizer_steps": state["optimizer_steps"],
        "tokens_sampled": tokens_sampled,
        "total_tokens_sampled": state["total_tokens"],
        "reward_mean": rewards.mean().item(),
        "success_rate": (rewards == REWARD_CORRECT).double().mean().item(),
        "partial_rate": (rewards == REWARD_PARTIAL).double().mean().item(),
        "mean_response_length": batch["mask"].sum(dim=1).double().mean().item(),
        "truncated_fraction": batch["truncated"].double().mean().item(),
        "zero_group_fraction": (grouped == grouped[:, :1]).all(dim=1).double().mean().item(),
        "kl_k3": kl_k3,
        "entropy": entropy,
        "success_probability": success_probability(state["table"].detach(), config["temperature"]),
    }
    row.update(update)
    return {name: row[name] for name in ONLINE_COLUMNS}


@torch.enable_grad()  # the updates need autograd even when the caller runs under torch.no_grad()
def online_train(**overrides):
    """Train the table policy online with GRPO or CISPO; return (rows, report).

    Keyword arguments override ONLINE_DEFAULTS (loss, reduction, steps, seed, prompts, group_size,
    max_new_tokens, temperature, updates_per_batch, beta, epsilon, epsilon_high, learning_rate).
    rows: one dict per iteration with ONLINE_COLUMNS. report: settings, the exact initial success
    probability, the first batch decoded, and the final row. Raises ValueError naming a bad setting.
    """
    return online_run(online_setup(**overrides))


@torch.enable_grad()
@torch_threads(1)  # tiny tensors: more threads only wait for each other (see rl_lab.torch_threads)
def online_run(state):
    """The training loop of `online_train` on a prepared `online_setup` state: (rows, report)."""
    initial_success = success_probability(state["table"].detach(), state["config"]["temperature"])
    rows, first_batch = [], None
    for step in range(1, state["config"]["steps"] + 1):
        batch = online_rollout(state)
        if first_batch is None:
            first_batch = decode_batch(batch, state["config"]["group_size"])
        update = online_update(state, batch)
        rows.append(online_record(state, batch, update, step))
    report = {
        "settings": _online_settings(state["config"]),
        "initial_success_probability": initial_success,
        "first_batch": first_batch,
        "final": rows[-1],
    }
    return rows, report


def decode_batch(batch, group_size, groups=2):
    """The first `groups` groups of a batch as readable text: prompt, response, reward, advantage."""
    decoded = []
    for row in range(min(groups * group_size, batch["prompts"].shape[0])):
        ids = batch["completion_ids"][row][batch["real"][row]].tolist()
        decoded.append({
            "prompt": int(batch["prompts"][row]),
            "answer": format(int(batch["prompts"][row]), "b"),
            "response": " ".join(ONLINE_VOCAB[token] for token in ids),
            "truncated": bool(batch["truncated"][row]),
            "reward": batch["rewards"][row].item(),
            "advantage": batch["advantages"][row].item(),
        })
    return decoded


# ---------------------------------------------------------------------------------------------
# Record: a readable summary of the report
# ---------------------------------------------------------------------------------------------


def _floats(values, digits=6):
    return "[" + ", ".join(f"{value:.{digits}f}" for value in values) + "]"


def _trace_token_name(token_id, real):
    if not real:
        return "PAD"
    return "EOS" if token_id == TRACE_EOS else TRACE_VOCAB[token_id]


def summary_text(report):
    """The report as plain text for the terminal (the JSON keeps the full precision)."""
    a, bug, red = report["alignment"], report["eos_pad_bug"], report["reduction"]
    lines = [
        "part 1: 5x5 bigram table, ids BOS=0 prompt=1 good=2 bad=3 EOS=PAD=4; one SGD step (lr 0.1) per objective",
        f"  scored lengths {a['lengths']}  token log-prob {a['token_logps'][0][1]:.6f} (-ln 5)  "
        f"summed logps {_floats(a['sequence_logps'])}  mean logps {_floats(a['mean_logps'])}",
        f"  bug `mask & (ids != 4)`: lengths {bug['lengths']}, summed logps shift by "
        f"{_floats(bug['sequence_logp_shift'])} (+ln 5 = {bug['ln5']:.6f} each: the real EOS is lost)",
        f"  reduction at the start: per response {_floats(red['per_response_grpo_losses'])} -> mean "
        f"{red['per_response_mean']:.6f}; global token mean (-2 + 3)/5 = {red['global_token_mean']:.6f}",
    ]
    for name in OBJECTIVES:
        item = report[name]
        lines.append(
            f"  {name:5s} loss {item['initial_loss']:+.6f} -> {item['final_loss']:+.6f}  gradient norm "
            f"{item['gradient_norm']:.6f}  relative margin {item['relative_margin_before']:+.6f} -> "
            f"{item['relative_margin_after']:+.6f}"
        )
    same = report["cispo_vs_grpo"]
    pad = report["padding_invariance"]
    lines += [
        f"  cispo vs grpo: max |gradient difference| {same['gradient_max_abs_difference']:.3g}, max |parameter "
        f"difference| after the step {same['parameter_max_abs_difference_after_step']:.3g}; the loss values differ",
        f"  {pad['extra_pad_columns']} extra PAD columns: max |loss change| {pad['max_abs_loss_difference']:.3g}, "
        f"max |gradient change| {pad['max_abs_gradient_difference']:.3g}",
    ]
    trace = report["trace"]
    s = trace["settings"]
    lines += [
        "",
        f"part 2: lesson trace, {len(trace['grouped_rewards'])} prompts x {s['num_generations']} generations, "
        f"ids BOS=0 prompt_a=1 prompt_b=2 good=3 bad=4 EOS=PAD=5, seed {s['seed']}, eps {s['epsilon']}, "
        f"epsilon_high {s['epsilon_high']}, beta {s['beta']}",
        "  row  completion           pad   mask  reward  advantage  ratio on kept tokens",
    ]
    rows = zip(trace["completion_ids"], trace["pad_mask"], trace["completion_mask"])
    for index, (ids, real, kept) in enumerate(rows):
        words = " ".join(f"{_trace_token_name(token, flag):4s}" for token, flag in zip(ids, real))
        ratios = " ".join(f"{r:.3f}" if k else "  -  " for r, k in zip(trace["ratio"][index], kept))
        lines.append(
            f"  {index:3d}  {words} {''.join(map(str, real))}  {''.join(map(str, kept))}  "
            f"{trace['rewards'][index]:6.2f}  {trace['advantages'][index]:+9.6f}  {ratios}"
        )
    clip = trace["clipped_token"]
    lines += [
        f"  grouped_rewards {trace['grouped_rewards']}",
        f"  group_mean {_floats(trace['group_mean'])}  group_std {_floats(trace['group_std'])}",
        f"  ratio_min {trace['ratio_min']:.6f}  ratio_max {trace['ratio_max']:.6f}  kl_mean {trace['kl_mean']:.6f}",
        f"  grpo_loss {trace['grpo_loss']:+.6f}  cispo_loss {trace['cispo_loss']:+.6f}  (different objectives: "
        "do not compare the two values)",
        f"  clipped token row {clip['row']} position {clip['position']}: ratio {clip['ratio']:.6f}, advantage "
        f"{clip['advantage']:+.6f}; d loss / d logp: grpo {clip['grpo_gradient']:+.6f} "
        f"(policy term {clip['grpo_policy_term_gradient']:+.6f}), cispo {clip['cispo_gradient']:+.6f} "
        f"(policy term {clip['cispo_policy_term_gradient']:+.6f})",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Write (command line)
# ---------------------------------------------------------------------------------------------


ONLINE_FLAGS = {  # flag -> (config key, argparse type, help)
    "--loss": ("loss", None, "policy loss: grpo (PPO-Clip per token) or cispo (detached capped weight)"),
    "--reduction": ("reduction", None, "sequence: mean per response then over responses (GRPO, the lesson); "
                                      "token: mean over all kept tokens (DAPO); constant: sum / (B*G*max_new_tokens) "
                                      "(Dr. GRPO)"),
    "--steps": ("steps", int_flag(1, 100_000), "iterations (sample, score, update), integer in [1, 100000]"),
    "--seed": ("seed", int_flag(0, SEED_LIMIT - 1), "seed of the run's torch.Generator, integer in [0, 2**63 - 1]"),
    "--prompts": ("prompts", int_flag(1, 4096), "prompts drawn per iteration (B), integer in [1, 4096]"),
    "--group-size": ("group_size", int_flag(2, 1024), "responses per prompt (G), integer in [2, 1024]"),
    "--max-new-tokens": ("max_new_tokens", int_flag(1, 64),
                         "cap on response length; a response that reaches it without EOS is truncated, "
                         "integer in [1, 64]"),
    "--temperature": ("temperature", float_flag(0.0, 10.0, low_open=True),
                      "sampling temperature, also applied to every log-prob, number in (0, 10]"),
    "--updates-per-batch": ("updates_per_batch", int_flag(1, 64),
                            "Adam steps on each batch (ratios leave 1 after the first), integer in [1, 64]"),
    "--beta": ("beta", float_flag(0.0, 10.0), "weight of the k3 KL to the reference, number in [0, 10]"),
    "--epsilon": ("epsilon", float_flag(0.0, 1.0, high_open=True), "GRPO clip half-width, number in [0, 1)"),
    "--epsilon-high": ("epsilon_high", float_flag(0.0, 100.0, low_open=True),
                       "CISPO's absolute cap on the ratio, number in (0, 100]"),
    "--lr": ("learning_rate", float_flag(0.0, 10.0, low_open=True), "Adam learning rate, number in (0, 10]"),
}


def build_parser():
    parser = OneLineErrorParser(
        prog="token_objectives.py",
        description="DPO, GRPO and CISPO on two fixed token sequences (one SGD step each) plus the lesson's "
                    "GRPO/CISPO trace, written as one JSON report; or, with --online, real online GRPO/CISPO "
                    "training of a tiny autoregressive policy, written as online.csv and online.json.",
    )
    parser.add_argument("--output", default=None,
                        help="without --online: the JSON report file (default: results-tokens.json); with --online: "
                             "the output folder (default: results-online-<loss>-<reduction>)")
    online = parser.add_argument_group("online GRPO/CISPO (only with --online)")
    online.add_argument("--online", action="store_true", help="train online instead of writing the fixed report")
    for flag, (key, parse, text) in ONLINE_FLAGS.items():
        default = ONLINE_DEFAULTS[key]
        extra = {"choices": ("grpo", "cispo")} if key == "loss" else (
            {"choices": ONLINE_REDUCTIONS} if key == "reduction" else {"type": parse})
        online.add_argument(flag, dest=key, default=None, help=f"{text} (default: {default})", **extra)
    return parser


def online_summary(rows, report, seconds):
    """A few readable lines: start, end, and the first group of the first batch."""
    first, last = rows[0], rows[-1]
    settings = report["settings"]
    lines = [
        f"online {settings['loss']} ({settings['reduction']} reduction), {settings['steps']} iterations of "
        f"{settings['prompts']} prompts x {settings['group_size']} responses, seed {settings['seed']}",
        f"  exact success probability {report['initial_success_probability']:.4f} -> {last['success_probability']:.4f}",
        f"  sampled success rate {first['success_rate']:.3f} (first batch) -> {last['success_rate']:.3f} (last batch); "
        f"mean response length {first['mean_response_length']:.2f} -> {last['mean_response_length']:.2f}",
        f"  last iteration: kl_k3 {last['kl_k3']:.4f}, clip fraction naive {last['clip_fraction_naive']:.4f}, "
        f"effective {last['clip_fraction_effective']:.4f}; mean over the run: naive "
        f"{math.fsum(row['clip_fraction_naive'] for row in rows) / len(rows):.4f}, effective "
        f"{math.fsum(row['clip_fraction_effective'] for row in rows) / len(rows):.4f}; "
        f"{last['total_tokens_sampled']} tokens sampled",
        f"  training loop {seconds:.2f} s, {last['total_tokens_sampled'] / seconds:,.0f} tokens/s (sampling, scoring "
        "and updates; machine-dependent, so printed here and kept out of the files, which stay byte-identical)",
        "  first group of the first batch:",
    ]
    for item in report["first_batch"][: settings["group_size"]]:
        lines.append(
            f"    prompt {item['prompt']} (answer {item['answer']}): {item['response']:<18s} "
            f"{'truncated ' if item['truncated'] else ''}reward {item['reward']:.2f} advantage {item['advantage']:+.3f}"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {key: getattr(args, key) for key, _, _ in ONLINE_FLAGS.values() if getattr(args, key) is not None}
    if not args.online:
        if overrides:
            flag = next(flag for flag, (key, _, _) in ONLINE_FLAGS.items() if key in overrides)
            parser.error(f"argument {flag}: only applies with --online")
        output = "results-tokens.json" if args.output is None else args.output
        output_file_or_exit(parser, output)
        report = run()
        write_text_atomic(output, json_text(report))
        print(summary_text(report), end="")
        print(f"-> {output}")
        return 0
    config = {**ONLINE_DEFAULTS, **overrides}
    output = f"results-online-{config['loss']}-{config['reduction']}" if args.output is None else args.output
    created = not os.path.exists(output)
    output_dir_or_exit(parser, output, ["online.csv", "online.json"])
    state = online_setup(**overrides)  # outside the clock: torch's first optimizer construction costs ~0.8 s
    started = time.perf_counter()
    try:
        rows, report = online_run(state)
    except TrainingDiverged as error:
        if created and not os.listdir(output):
            os.rmdir(output)  # leave nothing behind: the folder was made for this run
        print(f"{parser.prog}: error: training diverged: {error}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    write_text_atomic(os.path.join(output, "online.csv"), csv_text(rows, ONLINE_COLUMNS))
    write_text_atomic(os.path.join(output, "online.json"), json_text(report))
    print(online_summary(rows, report, seconds), end="")
    print(f"-> {os.path.join(output, 'online.csv')}, {os.path.join(output, 'online.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
