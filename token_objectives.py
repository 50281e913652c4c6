"""Token-sequence objectives: the causal shift, a real EOS that shares its id with PAD, and the reduction.

    python token_objectives.py                              # writes results-tokens.json, prints facts and trace
    python token_objectives.py --output results-tokens-copy.json
    python -m unittest -v test_token_objectives

Part 1 (`run`): a trainable 5x5 bigram table scores two fixed answers to one prompt, a chosen answer
of 2 scored tokens and a rejected one of 3. DPO, GRPO and CISPO each take one SGD step from the same
all-zero table (old = reference = that table, frozen). Every number is small enough to check by hand:
each token starts at -ln 5, DPO starts at ln 2, GRPO's loss starts at ~0 with a nonzero gradient, and
the global token mean of the same per-token loss is 0.2 instead of 0.

Part 2 (`lesson_trace`): the GRPO/CISPO trace of the MiniMind lesson (train_grpo.py) on a fixed batch
of 2 prompts x 4 generations: flat rewards -> group-relative advantages -> completion mask (first EOS
kept, PAD and anything after dropped) -> current/old/reference token log-probs from three seeded
bigram tables -> k3 KL -> GRPO and CISPO losses, plus both gradients on one clipped token.

The online loop (sampling, a verifier, training over many batches) is its own driver: online_tokens.py.

Shape notation (as in rl_lab.py): B sequences (or prompts), G group size, T tokens, V vocabulary,
P prompt tokens, R completion positions.
"""

from __future__ import annotations

import argparse
import math
import sys

from lab.io import OneLineErrorParser, flags_first, json_text, output_file_or_exit, run_cli, write_files

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------


def build_parser():
    parser = OneLineErrorParser(
        prog="token_objectives.py",
        description="DPO, GRPO and CISPO on two fixed token sequences (one SGD step each) plus the lesson's "
                    "GRPO/CISPO trace, written as one JSON report.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--output", default="results-tokens.json", help="the JSON report file")
    return parser


def parse(argv=None):
    """The flags, with the output checked before any work (a bad one exits 2 with one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    output_file_or_exit(parser, args.output)
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch and the bandit's atoms after the flags: `import torch` takes a second or more, --help none of it
import torch

from lab.checks import (
    check_int,
    check_same_dtype,
    check_same_shape,
    check_tensor,
    dtype_name,
    torch_threads,
    training_mode,
)
from rl_lab import (
    DEVICE,
    DTYPE,
    categorical_kl,
    cispo_policy_loss,
    completion_mask,
    dpo_loss,
    group_advantages,
    group_relative_advantages,
    grpo_policy_loss,
    reduce_token_loss,
    response_token_logps,
    token_kl_penalty,
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

# The objective hyperparameters of the token objectives (docs/token-objectives.md), restated here (not
# imported from the bandit) so that the published facts do not move if the bandit is ever retuned.
DPO_BETA = 0.5
CLIP_EPSILON = 0.2
KL_BETA = 0.03  # weight of the exact categorical KL to the reference (replaces the sampled k3 estimate)
EPSILON_HIGH = 5.0  # CISPO's absolute cap on the ratio
GROUP_ADVANTAGE_EPSILON = 1e-8  # rl_lab.group_advantages' default: advantages are +-(1 - 2e-8), not +-1
LEARNING_RATE = 0.1  # one plain SGD step: theta <- theta - lr * grad
OBJECTIVES = ("dpo", "grpo", "cispo")
PADDING_CHECK_COLUMNS = 4  # the report also shows that 4 appended PAD columns change nothing


def fixture(extra_padding=0):
    """The two fixed answers of the token objectives, optionally with extra PAD columns on the right.

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
    with training_mode():  # works even under the caller's torch.no_grad() or inference_mode()
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
        "dtype": dtype_name(DTYPE),
        "device": str(DEVICE),
        "torch": torch.__version__,
    }


@training_mode()  # the SGD steps need autograd even under the caller's torch.no_grad() or inference_mode()
@torch_threads(1)
def run():
    """Part 1: the one-step facts of each objective plus the lesson trace; returns a JSON-ready dict.

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
    with training_mode():
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


def main(argv=None):
    args = parse(argv)
    report = run()
    write_files({args.output: json_text(report)})
    print(summary_text(report), end="")
    print(f"-> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
