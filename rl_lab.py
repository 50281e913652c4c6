"""RL post-training atoms and a one-step contextual bandit that trains PPO, DPO, GRPO and CISPO.

    python rl_lab.py --algorithm atoms                  # print a hand-checkable value of every atom (JSON)
    python rl_lab.py --algorithm all                    # train all four, write results/{ppo,dpo,grpo,cispo}.{csv,json}
    python rl_lab.py --algorithm dpo --preference-flips 12 --output results-dpo-flips12
    python rl_lab.py --algorithm grpo --group-size 4 --grpo-prompts 32 --output results-grpo-g4

The first half of this file holds the atoms: small pure functions, each written from its formula,
each importable (`from rl_lab import gae`). The second half assembles them into training loops on a
4-context x 3-action bandit whose reward table is known, so every metric is computed exactly.

Shape notation used everywhere in the lab: B prompts or sequences, G group size, N = B*G sampled
responses, T tokens (or time steps), V vocabulary, X contexts, A actions, R response positions.
"""

from __future__ import annotations

from lab_io import exit_quietly_on_signals

if __name__ == "__main__":  # first: a Ctrl-C while torch loads below ends with one line, not a traceback
    exit_quietly_on_signals()

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab_checks import (  # noqa: E402
    check_int,
    exp_limit,
    check_real,
    check_same_dtype,
    check_same_shape,
    check_tensor,
    torch_threads,
)
from lab_io import (  # noqa: E402
    OneLineErrorParser,
    csv_text,
    int_flag,
    json_text,
    output_folder_or_exit,
    run_cli,
    write_files,
)

DTYPE = torch.float64
DEVICE = torch.device("cpu")
SEED_LIMIT = 2**63


# ---------------------------------------------------------------------------------------------
# Atoms
# ---------------------------------------------------------------------------------------------


def clipped_policy_loss(logp, old_logp, advantages, epsilon=0.2):
    """PPO-Clip surrogate, elementwise, as a loss to MINIMIZE (PPO, arXiv 1707.06347, eq. 7).

        ratio = exp(logp - old_logp)
        loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)

    Args:
        logp: (...) float, log-probabilities (nats) of the taken actions under the current policy;
            gradient flows through it.
        old_logp: (...) same shape and dtype, log-probabilities under the sampling (old) policy;
            detached here, because the denominator of the ratio must stay fixed during the epochs.
        advantages: (...) same shape and dtype; detached here (the actor must not train the critic).
        epsilon: clip half-width, in [0, 1).
    Returns:
        (...) per-element loss, no reduction.
    Raises:
        ValueError naming the argument for a non-tensor, empty, non-finite, mismatched shape/dtype
        or an epsilon outside [0, 1); and for a loss that overflows the dtype: an element with A < 0
        whose log-ratio exceeds `exp_limit` (about 708.8 nats in float64, 87.7 in float32, 10.1 in
        float16), where the unclipped branch -A * ratio is the loss and is not representable.

    Extreme but finite log-ratios are safe where the clip decides the value: the log-ratio is clamped
    at `exp_limit` before exp(), so A > 0 with a huge ratio gives the clipped -(1 + eps) * A and a
    zero gradient, and A = 0 gives 0 (never inf * 0 = NaN). Below the limit nothing changes.
    """
    for name, value in (("logp", logp), ("old_logp", old_logp), ("advantages", advantages)):
        check_tensor(name, value)
    pairs = [("logp", logp), ("old_logp", old_logp), ("advantages", advantages)]
    check_same_shape(pairs)
    check_same_dtype(pairs)
    epsilon = check_real("epsilon", epsilon, low=0.0, high=1.0, high_open=True)
    old_logp = old_logp.detach()
    advantages = advantages.detach()
    logratio = logp - old_logp
    limit = exp_limit(logratio.dtype)
    if bool((logratio.detach() > limit).any()) and bool(((logratio.detach() > limit) & (advantages < 0)).any()):
        raise ValueError(
            f"logp: logp - old_logp exceeds {limit:.1f} nats on an element with advantages < 0, where the loss "
            f"-A * exp(logp - old_logp) overflows {logratio.dtype}"
        )
    # clamped before exp(): beyond the limit only A >= 0 elements remain, whose value the clip decides
    ratio = logratio.clamp(max=limit).exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - epsilon, 1.0 + epsilon)
    # max of the negatives == -min of the objectives: the pessimistic bound of eq. 7
    return torch.maximum(pg_loss1, pg_loss2)


def dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5):
    """Direct Preference Optimization loss, elementwise (DPO, arXiv 2305.18290, eq. 7).

        margin = (chosen - rejected) - (ref_chosen - ref_rejected)
        loss   = -logsigmoid(beta * margin)

    Args:
        chosen, rejected: (B,) or any common shape, float; sequence-SUMMED log-probs (nats) of the
            preferred and dispreferred answers under the trained policy (no length normalization).
        ref_chosen, ref_rejected: same shape and dtype, under the frozen reference; detached here.
        beta: > 0, the KL-regularization strength of the implicit reward beta * log(pi/pi_ref).
    Returns:
        (...) per-pair loss. At policy == reference it is ln 2 for every pair (with nonzero gradient).
    Raises:
        ValueError naming the argument for bad tensors or beta <= 0.
    """
    pairs = [("chosen", chosen), ("rejected", rejected), ("ref_chosen", ref_chosen), ("ref_rejected", ref_rejected)]
    for name, value in pairs:
        check_tensor(name, value)
    check_same_shape(pairs)
    check_same_dtype(pairs)
    beta = check_real("beta", beta, low=0.0, low_open=True)
    ref_margin = ref_chosen.detach() - ref_rejected.detach()
    margin = (chosen - rejected) - ref_margin
    # logsigmoid is stable for large |margin|; log(sigmoid(x)) underflows to -inf for x << 0
    return -F.logsigmoid(beta * margin)


def group_advantages(rewards, epsilon=1e-8):
    """Group-relative advantages of outcome-supervised GRPO (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2).

        A[b, g] = (R[b, g] - mean_g R[b]) / (population_std_g R[b] + epsilon)

    Args:
        rewards: (B, G) float, G >= 2 samples of the same prompt per row; detached here.
        epsilon: > 0 added to the std so that a near-constant group does not divide by ~0
            (it is unrelated to the PPO clip width).
    Returns:
        (B, G) advantages without grad, same dtype. A row whose rewards are all equal gives exact
        zeros (set explicitly: the float mean of equal values need not equal them bit for bit).
    Raises:
        ValueError naming the argument for a non-2-D or non-finite tensor, G < 2, epsilon <= 0, or
        rewards so large that their std overflows the dtype (in float64 beyond about 1e153 in magnitude).
    """
    check_tensor("rewards", rewards, ndim=2)
    if rewards.shape[1] < 2:
        raise ValueError(f"rewards: expected at least 2 samples per group (shape (B, G>=2)), got {tuple(rewards.shape)}")
    epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)
    rewards = rewards.detach()
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    population_std = rewards.std(dim=1, correction=0, keepdim=True)  # (B, 1), divides by G
    if not bool(torch.isfinite(population_std).all() and torch.isfinite(mean).all()):
        # the squares overflowed: dividing by an inf std would turn every advantage into 0
        raise ValueError(f"rewards: values too large, their std overflows {rewards.dtype} (rescale the rewards)")
    constant_group = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (B, 1)
    centered = torch.where(constant_group, torch.zeros_like(rewards), rewards - mean)
    return centered / (population_std + epsilon)


def group_relative_advantages(rewards, num_generations, eps=1e-4):
    """The lesson's flat form of `group_advantages` (MiniMind train_grpo.py; DeepSeekMath sec. 4.1.2).

    Args:
        rewards: (B*G,) float, prompt-major: prompt i's generations sit at i*G .. i*G+G-1; detached.
        num_generations: G >= 2, an int.
        eps: > 0 added to the population std (the lesson's default 1e-4).
    Returns:
        (B*G,) advantages without grad; a group of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for a non-1-D tensor, a length not divisible by G, G < 2.
    """
    check_tensor("rewards", rewards, ndim=1)
    num_generations = check_int("num_generations", num_generations, low=2)
    eps = check_real("eps", eps, low=0.0, low_open=True)
    if rewards.numel() % num_generations != 0:
        raise ValueError(
            f"rewards: length {rewards.numel()} is not divisible by num_generations={num_generations}"
        )
    grouped = rewards.reshape(-1, num_generations)  # (B*G,) -> (B, G)
    return group_advantages(grouped, epsilon=eps).reshape(-1)  # (B, G) -> (B*G,)


def categorical_kl(logits, reference_logits):
    """Exact forward KL(softmax(logits) || softmax(reference_logits)) over the last axis, in nats.

        KL = sum_a p(a) * (log p(a) - log q(a))

    Args:
        logits: (..., A) float, the trained policy; gradient flows to it.
        reference_logits: same shape and dtype, the reference; detached here.
    Returns:
        (...) KL per row, >= 0.
    Raises:
        ValueError naming the argument for bad tensors, a shape mismatch or 0-D input.
    """
    check_tensor("logits", logits)
    check_tensor("reference_logits", reference_logits)
    if logits.dim() == 0:
        raise ValueError("logits: expected at least 1 dimension (..., A)")
    check_same_shape([("logits", logits), ("reference_logits", reference_logits)])
    check_same_dtype([("logits", logits), ("reference_logits", reference_logits)])
    logp = F.log_softmax(logits, dim=-1)
    ref_logp = F.log_softmax(reference_logits.detach(), dim=-1)
    return (logp.exp() * (logp - ref_logp)).sum(dim=-1)


def token_kl_penalty(policy_logps, ref_logps):
    """The k3 estimator of KL(policy || ref) per token (DeepSeekMath, arXiv 2402.03300, eq. 4).

        delta = ref_logp - policy_logp
        kl_k3 = exp(delta) - delta - 1        (>= 0)

    Its expectation over tokens sampled from the policy equals the exact KL; on tokens drawn from
    another distribution it is biased.
    Args:
        policy_logps: (...) float log-probs (nats) of the taken tokens; gradient flows through it.
        ref_logps: same shape and dtype, the frozen reference; detached here.
    Returns:
        (...) per-token k3 values.
    Raises:
        ValueError naming the argument for bad tensors or mismatched shape/dtype, or when
        ref_logps - policy_logps exceeds `exp_limit` (about 708.8 nats in float64): exp() overflows.
    """
    pairs = [("policy_logps", policy_logps), ("ref_logps", ref_logps)]
    for name, value in pairs:
        check_tensor(name, value)
    check_same_shape(pairs)
    check_same_dtype(pairs)
    delta = ref_logps.detach() - policy_logps
    limit = exp_limit(delta.dtype)
    if bool((delta.detach() > limit).any()):
        raise ValueError(
            f"policy_logps: ref_logps - policy_logps exceeds {limit:.1f} nats, so k3 = exp(delta) - delta - 1 "
            f"overflows {delta.dtype}"
        )
    return delta.exp() - delta - 1.0


def response_token_logps(logits, input_ids, response_mask):
    """Per-token log-probs of the response tokens, with the causal shift.

    Row t of the logits scores token t+1, so the scores live on positions 1..T-1:

        logp   = log_softmax(logits[:, :-1])             # (B, T-1, V)
        target = input_ids[:, 1:]                         # (B, T-1)
        valid  = response_mask[:, 1:]                     # (B, T-1)

    Args:
        logits: (B, T, V) float, T >= 2.
        input_ids: (B, T) signed integer token ids in [0, V) (int8 to int64; compared and gathered in int64).
        response_mask: (B, T) bool, True on response tokens (a real EOS included), False on the
            prompt and on padding. Decide it by position, never by `ids != eos_id`: when EOS and PAD
            share an id that drops the real EOS.
    Returns:
        (token_logps (B, T-1) float with non-response positions exactly 0, valid (B, T-1) bool).
    Raises:
        ValueError naming the argument: wrong shapes/dtypes, T < 2, ids outside [0, V), a mask that
        is True at position 0 (no logits row scores it), or a row with no response token.
    """
    check_tensor("logits", logits, ndim=3)
    check_tensor("input_ids", input_ids, kind="int", ndim=2)
    check_tensor("response_mask", response_mask, kind="bool", ndim=2)
    batch, length, vocab = logits.shape
    if input_ids.shape != (batch, length):
        raise ValueError(f"input_ids: expected shape {(batch, length)} to match logits, got {tuple(input_ids.shape)}")
    if response_mask.shape != (batch, length):
        raise ValueError(
            f"response_mask: expected shape {(batch, length)} to match logits, got {tuple(response_mask.shape)}"
        )
    if length < 2:
        raise ValueError(f"logits: expected at least 2 positions (T >= 2) for the causal shift, got T={length}")
    input_ids = input_ids.long()  # a narrow dtype would wrap round V (int16 cannot hold 40000)
    if bool(((input_ids < 0) | (input_ids >= vocab)).any()):
        raise ValueError(f"input_ids: expected ids in [0, {vocab}), got values outside")
    if bool(response_mask[:, 0].any()):
        raise ValueError("response_mask: position 0 cannot be a response token (no logits row predicts it)")
    valid = response_mask[:, 1:]  # (B, T-1)
    if not bool(valid.any(dim=1).all()):
        raise ValueError("response_mask: every row needs at least one response token")
    logp = F.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V)
    targets = input_ids[:, 1:]  # (B, T-1)
    token_logps = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T-1, 1) -> (B, T-1)
    # where(), not multiplication: a masked position then contributes exactly 0 and no gradient
    token_logps = torch.where(valid, token_logps, torch.zeros_like(token_logps))
    return token_logps, valid


def response_logps(logits, input_ids, response_mask):
    """(B,) response-only sum of `response_token_logps` (the sequence log-prob used by DPO).

    Same arguments and errors as `response_token_logps`.
    """
    token_logps, _ = response_token_logps(logits, input_ids, response_mask)
    return token_logps.sum(dim=-1)  # (B, T-1) -> (B,)


def gae(rewards, values, next_values, terminated, boundary, gamma=0.99, lam=0.95):
    """Generalized Advantage Estimation over one temporal stream (GAE, arXiv 1506.02438, eq. 16).

        delta_t     = r_t + gamma * V(s_{t+1}) * (1 - terminated_t) - V(s_t)
        A_t         = delta_t + gamma * lam * (1 - boundary_t) * A_{t+1}
        returns_t   = A_t + V(s_t)                  (the lambda-return, the critic's target)

    Two flags, because bootstrapping and the recursion stop for different reasons:
    - terminated_t: a true terminal state; its future value is 0, so no bootstrap.
    - boundary_t: the stream is cut after t (episode end, rollout cut or time limit); the trace
      must not leak into the next, unrelated transition.
    A time limit is terminated=False, boundary=True with next_values_t = V(final observation):
    the episode could have gone on, so its value still counts (not the value after a reset).
    terminated implies boundary.

    Args:
        rewards, values, next_values: (T,) float, same dtype; values are V(s_t) and next_values are
            V(s_{t+1}) from the old critic. All detached here.
        terminated, boundary: (T,) bool.
        gamma, lam: in [0, 1].
    Returns:
        (advantages, returns), both (T,) without grad, in the dtype of `rewards`.
    Raises:
        ValueError naming the argument for bad tensors, shape/dtype mismatches, gamma or lam outside
        [0, 1], or a step that is terminated but not a boundary.
    """
    for name, value in (("rewards", rewards), ("values", values), ("next_values", next_values)):
        check_tensor(name, value, ndim=1)
    check_tensor("terminated", terminated, kind="bool", ndim=1)
    check_tensor("boundary", boundary, kind="bool", ndim=1)
    pairs = [("rewards", rewards), ("values", values), ("next_values", next_values)]
    check_same_shape(pairs + [("terminated", terminated), ("boundary", boundary)])
    check_same_dtype(pairs)
    gamma = check_real("gamma", gamma, low=0.0, high=1.0)
    lam = check_real("lam", lam, low=0.0, high=1.0)
    if bool((terminated & ~boundary).any()):
        raise ValueError("terminated: a terminated step must also be a boundary (terminated implies boundary)")
    # The recursion is sequential; Python floats (IEEE double) keep it exact and fast for short streams.
    r, v, nv = rewards.tolist(), values.tolist(), next_values.tolist()
    term, bound = terminated.tolist(), boundary.tolist()
    advantages = [0.0] * len(r)
    lastgaelam = 0.0
    for t in reversed(range(len(r))):
        nextnonterminal = 0.0 if term[t] else 1.0
        nextnotboundary = 0.0 if bound[t] else 1.0
        delta = r[t] + gamma * nv[t] * nextnonterminal - v[t]
        lastgaelam = delta + gamma * lam * nextnotboundary * lastgaelam
        advantages[t] = lastgaelam
    advantages = torch.tensor(advantages, dtype=rewards.dtype)
    returns = advantages + values.detach().to(rewards.dtype)
    return advantages, returns


def reduce_token_loss(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None):
    """Reduce a (N, R) per-token loss to a scalar over the valid (masked) tokens.

    - "sequence": mean over each sequence's valid tokens (count clamped to >= 1), then mean over
      sequences: every answer weighs the same (original GRPO, DeepSeekMath eq. 3; the lesson).
    - "token": sum over all valid tokens / their count: every token weighs the same, long answers
      weigh more (DAPO, arXiv 2503.14476, eq. 8).
    - "constant": sum over all valid tokens / (N * max_new_tokens), a constant that does not
      depend on the lengths (Dr. GRPO, arXiv 2503.20783, sec. 3.2).

    Args:
        per_token_loss: (N, R) float.
        completion_mask: (N, R) 0/1 of bool, int or float dtype.
        reduction: "sequence", "token" or "constant".
        max_new_tokens: int >= 1, the cap on a completion's length, for "constant" (R is used when
            None); a row with more kept tokens than the cap is an error.
    Returns:
        scalar tensor.
    Raises:
        ValueError naming the argument for bad tensors, shapes, an unknown reduction or a
        max_new_tokens below the longest completion.
    """
    check_tensor("per_token_loss", per_token_loss, kind="any_float", ndim=2)
    check_tensor("completion_mask", completion_mask, kind="mask", ndim=2)
    check_same_shape([("per_token_loss", per_token_loss), ("completion_mask", completion_mask)])
    if max_new_tokens is not None:
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1, high=2**31 - 1)
    mask = completion_mask.detach().to(per_token_loss.dtype)
    if not bool(torch.isfinite(per_token_loss.detach()[mask > 0]).all()):
        raise ValueError("per_token_loss: expected finite values on the tokens the mask keeps")
    # where(), not multiplication: a masked position contributes exactly 0 and no gradient, whatever it holds
    masked = torch.where(mask > 0, per_token_loss, torch.zeros_like(per_token_loss))
    if reduction == "sequence":
        per_sequence = masked.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (N, R) -> (N,)
        return per_sequence.mean()
    if reduction == "token":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if reduction == "constant":
        if max_new_tokens is None:
            max_new_tokens = per_token_loss.shape[1]
        longest = int(mask.sum(dim=1).max().item())
        if longest > max_new_tokens:
            raise ValueError(f"max_new_tokens: expected at least the longest completion ({longest} tokens), "
                             f"got {max_new_tokens}")
        return masked.sum() / (per_token_loss.shape[0] * max_new_tokens)
    raise ValueError(f"reduction: expected 'sequence', 'token' or 'constant', got {reduction!r}")


def _kept_only(completion_mask, *token_tensors):
    """Replace every masked position by 0 before any exp(): padding may hold any finite filler (e.g.
    -1e9) and must neither overflow the ratio nor send NaN through the masked branch of where()."""
    kept = completion_mask.detach() != 0
    return [torch.where(kept, tensor, torch.zeros_like(tensor)) for tensor in token_tensors]


def _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask):
    pairs = [("policy_logps", policy_logps), ("old_logps", old_logps), ("ref_logps", ref_logps)]
    for name, value in pairs:
        check_tensor(name, value, ndim=2)
    check_same_shape(pairs)
    check_tensor("advantages", advantages, ndim=1)
    check_same_dtype(pairs + [("advantages", advantages)])
    if advantages.shape[0] != policy_logps.shape[0]:
        raise ValueError(
            f"advantages: expected shape ({policy_logps.shape[0]},) one per sequence, got {tuple(advantages.shape)}"
        )
    check_tensor("completion_mask", completion_mask, kind="mask", ndim=2)
    check_same_shape([("policy_logps", policy_logps), ("completion_mask", completion_mask)])


def grpo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=0.2, beta=0.1, reduction="sequence",
    max_new_tokens=None,
):
    """GRPO token loss of the lesson (MiniMind train_grpo.py; DeepSeekMath, arXiv 2402.03300, eq. 3).

        ratio    = exp(policy_logp - old_logp)                         # (N, R)
        per_tok  = -(min(ratio * A, clip(ratio, 1-eps, 1+eps) * A) - beta * kl_k3)
        loss     = reduce_token_loss(per_tok, completion_mask, reduction)

    Args:
        policy_logps: (N, R) float log-probs of the sampled tokens under the current policy (grad).
        old_logps: (N, R) same dtype, cached at sampling time; detached.
        ref_logps: (N, R), the frozen reference; detached.
        advantages: (N,) one per sequence, broadcast over its tokens; detached.
        completion_mask: (N, R) 0/1 (bool, int or float), 1 on valid tokens.
        epsilon: clip half-width in [0, 1). beta: >= 0 weight of the k3 reference KL.
        reduction, max_new_tokens: see `reduce_token_loss` (default: per-sequence mean, then mean).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    """
    _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask)
    check_real("beta", beta, low=0.0)
    policy_logps, old_logps, ref_logps = _kept_only(completion_mask, policy_logps, old_logps, ref_logps)
    policy_term = -clipped_policy_loss(
        policy_logps, old_logps, advantages.detach().unsqueeze(1).expand_as(policy_logps), epsilon
    )  # (N,) -> (N, R) broadcast of the sequence advantage
    kl_k3 = token_kl_penalty(policy_logps, ref_logps)
    per_token_loss = -(policy_term - beta * kl_k3)
    return reduce_token_loss(per_token_loss, completion_mask, reduction, max_new_tokens)


def cispo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon_high=5.0, beta=0.1,
    reduction="sequence", max_new_tokens=None,
):
    """CISPO token loss (MiniMax-M1, arXiv 2506.13585, sec. 3.1, eq. 4; MiniMind train_grpo.py).

        ratio    = exp(policy_logp - old_logp)
        weight   = sg(min(ratio, epsilon_high))                         # detached, capped
        per_tok  = -(weight * A * policy_logp - beta * kl_k3)
        loss     = reduce_token_loss(per_tok, completion_mask, reduction)

    Unlike PPO-Clip, a token whose ratio is capped still passes gradient through policy_logp: the
    cap bounds the weight, it does not drop the token. Its value is a REINFORCE-style weighted
    log-likelihood, not a surrogate of the objective: do not compare it with the GRPO loss value.
    At ratio 1 with nothing capped its gradient equals GRPO's.

    Args:
        as `grpo_policy_loss`; epsilon_high > 0 is an ABSOLUTE cap on the ratio (not 1 + eps).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    """
    _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask)
    epsilon_high = check_real("epsilon_high", epsilon_high, low=0.0, low_open=True)
    check_real("beta", beta, low=0.0)
    policy_logps, old_logps, ref_logps = _kept_only(completion_mask, policy_logps, old_logps, ref_logps)
    logratio = policy_logps - old_logps.detach()
    ratio = logratio.clamp(max=exp_limit(logratio.dtype)).exp()  # a huge ratio is capped below anyway
    # detached: the weight scales the score-function gradient but is not differentiated itself
    weight = ratio.clamp(max=epsilon_high).detach()
    policy_term = weight * advantages.detach().unsqueeze(1) * policy_logps  # (N,) -> (N, 1) -> (N, R)
    kl_k3 = token_kl_penalty(policy_logps, ref_logps)
    per_token_loss = -(policy_term - beta * kl_k3)
    return reduce_token_loss(per_token_loss, completion_mask, reduction, max_new_tokens)


def completion_mask(completion_ids, eos_token_id, pad_mask=None):
    """Mask of the tokens that count: every position up to and including the first EOS.

    Follows MiniMind train_grpo.py: positions after the first EOS (padding, or anything generated
    after the answer stopped) are dropped; a row without EOS keeps all its real positions.

    Args:
        completion_ids: (N, R) signed integer token ids of the sampled completions (int8 to int64;
            compared in int64, so an eos_token_id beyond the dtype's range never wraps round).
        eos_token_id: int, the EOS id (it may equal the PAD id: the position decides).
        pad_mask: optional (N, R) bool/0-1, True on real (non-padding) positions, as the rollout's
            padding mask in the lesson; None means no padding. An EOS on a padding position is ignored.
    Returns:
        (N, R) int64 mask of 0/1.
    Raises:
        ValueError naming the argument for a bad tensor, shape or a non-int eos_token_id.
    """
    check_tensor("completion_ids", completion_ids, kind="int", ndim=2)
    eos_token_id = check_int("eos_token_id", eos_token_id, low=0, high=SEED_LIMIT - 1)
    if pad_mask is None:
        real = torch.ones_like(completion_ids, dtype=torch.bool)
    else:
        check_tensor("pad_mask", pad_mask, kind="mask", ndim=2)
        check_same_shape([("completion_ids", completion_ids), ("pad_mask", pad_mask)])
        real = pad_mask.bool()
    is_eos = (completion_ids.long() == eos_token_id) & real  # (N, R), int64: 300 must not match an int8 44
    length = completion_ids.shape[1]
    has_eos = is_eos.any(dim=1)  # (N,)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, length - 1, dtype=torch.long))
    positions = torch.arange(length).expand_as(completion_ids)  # (R,) -> (N, R)
    return ((positions <= first_eos.unsqueeze(1)) & real).long()


# ---------------------------------------------------------------------------------------------
# The one-step contextual bandit: setup
# ---------------------------------------------------------------------------------------------

ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")
NUM_CONTEXTS = 4
NUM_ACTIONS = 3
LEARNING_RATE = 0.08
MAX_GRAD_NORM = 1.0
CLIP_EPSILON = 0.2
KL_BETA = 0.03
DPO_BETA = 0.5
UPDATE_EPOCHS = 4
TARGET_OLD_POLICY_KL = 0.05
PPO_BATCH_SIZE = 128
VALUE_COEF = 0.5
EPSILON_HIGH = 5.0
GROUP_ADVANTAGE_EPSILON = 1e-8
MAX_STEPS = 100_000
MAX_GROUP_SIZE = 4096
MAX_GRPO_PROMPTS = 4096
# B*G sampled actions per GRPO/CISPO iteration: 2**20 take about 0.3 GB of memory and 1 s per iteration
MAX_GROUP_ACTIONS = 2**20

COLUMNS = [
    "algorithm", "step", "optimizer_steps", "sampled_actions", "pair_presentations", "expected_reward",
    "best_action_probability", "entropy", "kl_reference", "loss", "value_loss", "clip_fraction",
    "old_policy_kl", "zero_group_fraction",
]
DPO_COLUMNS = COLUMNS + ["dpo_training_loss", "dpo_clean_loss"]


def reward_table():
    """(X=4, A=3) float64 reward table R(x, a) of the bandit (rows = contexts)."""
    return torch.tensor(
        [[1.0, 0.2, -0.5], [-0.5, 1.0, 0.2], [0.2, -0.5, 1.0], [1.0, -0.5, 0.2]], dtype=DTYPE, device=DEVICE
    )


def preference_pairs(rewards):
    """The offline pairs (context, chosen, rejected) with R(chosen) > R(rejected), as a (12, 3) int64.

    Enumerated context-major, then chosen, then rejected, in index order.
    """
    pairs = []
    for context in range(rewards.shape[0]):
        for chosen in range(rewards.shape[1]):
            for rejected in range(rewards.shape[1]):
                if rewards[context, chosen] > rewards[context, rejected]:
                    pairs.append([context, chosen, rejected])
    return torch.tensor(pairs, dtype=torch.long)


def evaluate(logits, rewards=None, reference_logits=None):
    """Exact evaluation of a (X, A) logits table; contexts weigh equally, nothing is sampled.

    Returns a dict of floats: expected_reward = mean_x sum_a p(a|x) R(x, a),
    best_action_probability = mean_x p(argmax_a R(x, a) | x), entropy (nats, mean over x) and
    kl_reference = mean_x KL(p(.|x) || reference(.|x)) (exact; reference defaults to uniform).
    """
    check_tensor("logits", logits, ndim=2)
    rewards = reward_table().to(logits.dtype) if rewards is None else check_tensor("rewards", rewards, ndim=2)
    reference_logits = torch.zeros_like(logits) if reference_logits is None else reference_logits
    check_tensor("reference_logits", reference_logits, ndim=2)
    check_same_shape([("logits", logits), ("rewards", rewards), ("reference_logits", reference_logits)])
    check_same_dtype([("logits", logits), ("rewards", rewards), ("reference_logits", reference_logits)])
    with torch.no_grad():
        logp = F.log_softmax(logits, dim=-1)  # (X, A)
        probs = logp.exp()
        best = rewards.argmax(dim=-1, keepdim=True)  # (X, 1)
        return {
            "expected_reward": (probs * rewards).sum(dim=-1).mean().item(),
            "best_action_probability": probs.gather(-1, best).mean().item(),
            "entropy": -(probs * logp).sum(dim=-1).mean().item(),
            "kl_reference": categorical_kl(logits, reference_logits).mean().item(),
        }


def _settings(algorithm, steps, seed, group_size, grpo_prompts):
    return {
        "algorithm": algorithm,
        "seed": seed,
        "steps": steps,
        "dtype": str(DTYPE).replace("torch.", ""),
        "device": str(DEVICE),
        "torch": torch.__version__,
        "reward_table": reward_table().tolist(),
        "num_contexts": NUM_CONTEXTS,
        "num_actions": NUM_ACTIONS,
        "optimizer": "Adam",
        "learning_rate": LEARNING_RATE,
        "adam_betas": [0.9, 0.999],
        "max_grad_norm": MAX_GRAD_NORM,
        "clip_epsilon": CLIP_EPSILON,
        "kl_beta": KL_BETA,
        "dpo_beta": DPO_BETA,
        "update_epochs": UPDATE_EPOCHS,
        "target_old_policy_kl": TARGET_OLD_POLICY_KL,
        "ppo_batch_size": PPO_BATCH_SIZE,
        "value_coef": VALUE_COEF,
        "epsilon_high": EPSILON_HIGH,
        "group_advantage_epsilon": GROUP_ADVANTAGE_EPSILON,
        "group_size": group_size,
        "online_batch_prompts": grpo_prompts,
        "offline_preference_pairs": int(preference_pairs(reward_table()).shape[0]),
    }


def _old_policy_kl(old_logits, logits):
    """Exact KL(old || current) averaged over all contexts (nats): the early-stop statistic."""
    return categorical_kl(old_logits, logits.detach()).mean().item()


def _initial_row(algorithm, logits, rewards, reference_logits):
    row = {"algorithm": algorithm, "step": 0, "optimizer_steps": 0, "sampled_actions": 0, "pair_presentations": 0}
    row.update(evaluate(logits, rewards, reference_logits))
    row.update({"loss": 0.0, "value_loss": 0.0, "clip_fraction": 0.0, "old_policy_kl": 0.0, "zero_group_fraction": 0.0})
    return row


def _clip_step(optimizer, params, loss):
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
    optimizer.step()


@torch.enable_grad()  # the updates need autograd even when the caller runs under torch.no_grad()
@torch_threads(1)
def train(algorithm, *, steps=120, seed=7, group_size=8, preference_flips=0, grpo_prompts=16):
    """Train one algorithm on the bandit; return (rows, settings).

    rows: list of dicts with the CSV columns (row 0 = initial evaluation), one per outer iteration.
    settings: every hyperparameter, the seed, versions and (DPO) the preference data.
    Raises ValueError naming the argument for an unknown algorithm or an out-of-range integer.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm: expected one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    steps = check_int("steps", steps, low=1, high=MAX_STEPS)
    seed = check_int("seed", seed, low=0, high=SEED_LIMIT - 1)
    group_size = check_int("group_size", group_size, low=2, high=MAX_GROUP_SIZE)
    grpo_prompts = check_int("grpo_prompts", grpo_prompts, low=1, high=MAX_GRPO_PROMPTS)
    preference_flips = check_int("preference_flips", preference_flips, low=0)
    if algorithm in ("grpo", "cispo") and group_size * grpo_prompts > MAX_GROUP_ACTIONS:
        raise ValueError(f"group_size: group_size * grpo_prompts = {group_size * grpo_prompts} actions per iteration, "
                         f"more than {MAX_GROUP_ACTIONS}")
    rewards = reward_table()
    pairs = preference_pairs(rewards)
    if preference_flips > pairs.shape[0]:
        raise ValueError(f"preference_flips: expected an integer in [0, {pairs.shape[0]}], got {preference_flips}")
    if preference_flips and algorithm != "dpo":
        raise ValueError(f"preference_flips: only applies to dpo, got {preference_flips} with {algorithm}")

    settings = _settings(algorithm, steps, seed, group_size, grpo_prompts)
    generator = torch.Generator(device=DEVICE).manual_seed(seed)  # the one seeding point of the run
    logits = torch.zeros(NUM_CONTEXTS, NUM_ACTIONS, dtype=DTYPE, device=DEVICE, requires_grad=True)
    reference_logits = torch.zeros(NUM_CONTEXTS, NUM_ACTIONS, dtype=DTYPE, device=DEVICE)  # frozen uniform
    rows = [_initial_row(algorithm, logits, rewards, reference_logits)]

    if algorithm == "dpo":
        flipped = torch.randperm(pairs.shape[0], generator=generator)[:preference_flips].sort().values
        training_pairs = pairs.clone()
        training_pairs[flipped, 1], training_pairs[flipped, 2] = pairs[flipped, 2], pairs[flipped, 1]
        with torch.no_grad():  # computed, not assumed: ln 2 only while policy = reference
            rows[0]["dpo_training_loss"] = _dpo_batch_loss(logits, reference_logits, training_pairs).item()
            rows[0]["dpo_clean_loss"] = _dpo_batch_loss(logits, reference_logits, pairs).item()
        settings.update({
            "preference_flips": preference_flips,
            "flipped_pair_indices": flipped.tolist(),
            "preference_columns": ["context", "chosen", "rejected"],
            "clean_preference_pairs": pairs.tolist(),
            "training_preference_pairs": training_pairs.tolist(),
        })
        _train_dpo(logits, reference_logits, rewards, pairs, training_pairs, steps, rows)
    elif algorithm == "ppo":
        _train_ppo(logits, reference_logits, rewards, generator, steps, rows)
    else:
        _train_group(algorithm, logits, reference_logits, rewards, generator, steps, group_size, grpo_prompts, rows)
    return rows, settings


def _dpo_batch_loss(logits, reference_logits, pairs):
    """Mean DPO loss over (pairs, 3) rows (context, chosen, rejected); one action = one whole answer."""
    logp = F.log_softmax(logits, dim=-1)  # (X, A)
    ref_logp = F.log_softmax(reference_logits, dim=-1)
    context, chosen, rejected = pairs[:, 0], pairs[:, 1], pairs[:, 2]  # (pairs,) each
    return dpo_loss(
        logp[context, chosen], logp[context, rejected], ref_logp[context, chosen], ref_logp[context, rejected],
        beta=DPO_BETA,
    ).mean()


def _train_dpo(logits, reference_logits, rewards, clean_pairs, training_pairs, steps, rows):
    optimizer = torch.optim.Adam([logits], lr=LEARNING_RATE)
    for step in range(1, steps + 1):
        # update: one full-batch step on the fixed offline pairs (no sampling, no old policy)
        loss = _dpo_batch_loss(logits, reference_logits, training_pairs)
        _clip_step(optimizer, [logits], loss)
        # record: both diagnostics after the update, on the labels trained on and on the true ones
        with torch.no_grad():
            training_loss = _dpo_batch_loss(logits, reference_logits, training_pairs).item()
            clean_loss = _dpo_batch_loss(logits, reference_logits, clean_pairs).item()
        row = {
            "algorithm": "dpo", "step": step, "optimizer_steps": step, "sampled_actions": 0,
            "pair_presentations": step * training_pairs.shape[0],
        }
        row.update(evaluate(logits, rewards, reference_logits))
        row.update({
            "loss": loss.item(), "value_loss": 0.0, "clip_fraction": 0.0, "old_policy_kl": 0.0,
            "zero_group_fraction": 0.0, "dpo_training_loss": training_loss, "dpo_clean_loss": clean_loss,
        })
        rows.append(row)


def _train_ppo(logits, reference_logits, rewards, generator, steps, rows):
    values = torch.zeros(NUM_CONTEXTS, dtype=DTYPE, device=DEVICE, requires_grad=True)  # the critic V(x)
    params = [logits, values]
    optimizer = torch.optim.Adam(params, lr=LEARNING_RATE)
    ref_logp_table = F.log_softmax(reference_logits, dim=-1)  # (X, A)
    optimizer_steps = 0
    for step in range(1, steps + 1):
        # rollout: contexts, then one action each from the frozen old policy
        old_logits = logits.detach().clone()
        old_values = values.detach().clone()
        old_logp_table = F.log_softmax(old_logits, dim=-1)  # (X, A)
        contexts = torch.randint(0, NUM_CONTEXTS, (PPO_BATCH_SIZE,), generator=generator)
        actions = torch.multinomial(old_logp_table.exp()[contexts], 1, generator=generator).squeeze(1)  # (N, 1) -> (N,)
        old_logp = old_logp_table[contexts, actions]
        ref_logp = ref_logp_table[contexts, actions]
        # advantages: KL-shaped terminal return; one step, so GAE with terminated=boundary=True is R - V_old(x)
        shaped_returns = rewards[contexts, actions] - KL_BETA * (old_logp - ref_logp)
        done = torch.ones(PPO_BATCH_SIZE, dtype=torch.bool)
        advantages, returns = gae(shaped_returns, old_values[contexts], torch.zeros_like(shaped_returns), done, done)
        # update: up to UPDATE_EPOCHS full-batch steps, stopped once the policy drifted from old
        losses, value_losses = [], []
        for _ in range(UPDATE_EPOCHS):
            if _old_policy_kl(old_logits, logits) > TARGET_OLD_POLICY_KL:
                break
            logp = F.log_softmax(logits, dim=-1)[contexts, actions]
            policy_loss = clipped_policy_loss(logp, old_logp, advantages, CLIP_EPSILON).mean()
            value_loss = (values[contexts] - returns).square().mean()
            loss = policy_loss + VALUE_COEF * value_loss
            _clip_step(optimizer, params, loss)
            optimizer_steps += 1
            losses.append(loss.item())
            value_losses.append(value_loss.item())
        # record
        rows.append(_online_row(
            "ppo", step, optimizer_steps, step * PPO_BATCH_SIZE, logits, old_logits, contexts, actions, old_logp,
            rewards, reference_logits, losses, value_losses, zero_group_fraction=0.0,
        ))


def _train_group(algorithm, logits, reference_logits, rewards, generator, steps, group_size, grpo_prompts, rows):
    optimizer = torch.optim.Adam([logits], lr=LEARNING_RATE)
    ref_logp_table = F.log_softmax(reference_logits, dim=-1)  # (X, A)
    optimizer_steps = 0
    batch_actions = grpo_prompts * group_size
    one_token_mask = torch.ones(batch_actions, 1, dtype=torch.bool)  # each answer is one "token" long
    for step in range(1, steps + 1):
        # rollout: B contexts, then G answers each from the old policy, in one multinomial call
        old_logits = logits.detach().clone()
        old_logp_table = F.log_softmax(old_logits, dim=-1)
        prompt_contexts = torch.randint(0, NUM_CONTEXTS, (grpo_prompts,), generator=generator)  # (B,)
        group_actions = torch.multinomial(
            old_logp_table.exp()[prompt_contexts], group_size, replacement=True, generator=generator
        )  # (B, G)
        group_rewards = rewards[prompt_contexts.unsqueeze(1), group_actions]  # (B, G)
        # advantages: relative to the group, no critic
        advantages = group_advantages(group_rewards, GROUP_ADVANTAGE_EPSILON).reshape(-1)  # (B, G) -> (B*G,)
        zero_group_fraction = (group_rewards == group_rewards[:, :1]).all(dim=1).double().mean().item()
        contexts = prompt_contexts.repeat_interleave(group_size)  # (B,) -> (B*G,), prompt-major
        actions = group_actions.reshape(-1)  # (B, G) -> (B*G,)
        old_logp = old_logp_table[contexts, actions]
        ref_logp = ref_logp_table[contexts, actions]
        # update
        losses = []
        for _ in range(UPDATE_EPOCHS):
            if _old_policy_kl(old_logits, logits) > TARGET_OLD_POLICY_KL:
                break
            logp = F.log_softmax(logits, dim=-1)[contexts, actions]
            if algorithm == "grpo":
                policy_loss = clipped_policy_loss(logp, old_logp, advantages, CLIP_EPSILON).mean()
            else:
                # an answer is a one-token sequence; beta=0 because the exact KL below replaces k3
                policy_loss = cispo_policy_loss(
                    logp.unsqueeze(1), old_logp.unsqueeze(1), ref_logp.unsqueeze(1), advantages, one_token_mask,
                    epsilon_high=EPSILON_HIGH, beta=0.0,
                )
            kl_exact = categorical_kl(logits[prompt_contexts], reference_logits[prompt_contexts]).mean()
            loss = policy_loss + KL_BETA * kl_exact
            _clip_step(optimizer, [logits], loss)
            optimizer_steps += 1
            losses.append(loss.item())
        # record
        rows.append(_online_row(
            algorithm, step, optimizer_steps, step * batch_actions, logits, old_logits, contexts, actions, old_logp,
            rewards, reference_logits, losses, [], zero_group_fraction,
        ))


def _online_row(algorithm, step, optimizer_steps, sampled_actions, logits, old_logits, contexts, actions, old_logp,
                rewards, reference_logits, losses, value_losses, zero_group_fraction):
    """Metrics after the updates of one iteration; loss fields are means over the steps taken."""
    with torch.no_grad():
        ratio = (F.log_softmax(logits, dim=-1)[contexts, actions] - old_logp).exp()
        clip_fraction = ((ratio - 1.0).abs() > CLIP_EPSILON).double().mean().item()
    row = {
        "algorithm": algorithm, "step": step, "optimizer_steps": optimizer_steps, "sampled_actions": sampled_actions,
        "pair_presentations": 0,
    }
    row.update(evaluate(logits, rewards, reference_logits))
    row.update({
        "loss": math.fsum(losses) / len(losses) if losses else 0.0,
        "value_loss": math.fsum(value_losses) / len(value_losses) if value_losses else 0.0,
        "clip_fraction": clip_fraction,
        "old_policy_kl": _old_policy_kl(old_logits, logits),
        "zero_group_fraction": zero_group_fraction,
    })
    return row


# ---------------------------------------------------------------------------------------------
# Hand-checkable values of every atom
# ---------------------------------------------------------------------------------------------


def _rounded(values, digits=12):
    """Round floats in a (nested) list so that the printed demo reads like a hand computation."""
    if isinstance(values, list):
        return [_rounded(value, digits) for value in values]
    return round(values, digits) + 0.0  # + 0.0 turns -0.0 into 0.0


@torch.enable_grad()  # the examples differentiate, even when the caller runs under torch.no_grad()
def atomic_demo():
    """Small inputs with known answers for every atom; returns a JSON-ready dict of lists and floats."""
    t = lambda values, **kw: torch.tensor(values, dtype=DTYPE, **kw)  # noqa: E731 (a local shorthand)
    demo = {}

    # GAE: a terminal reward of 1 reaches all three steps when gamma = lam = 1 and V = 0
    rewards = t([0.0, 0.0, 1.0])
    zeros = torch.zeros_like(rewards)
    terminated = torch.tensor([False, False, True])
    advantages, returns = gae(rewards, zeros, zeros, terminated, terminated, gamma=1.0, lam=1.0)
    # a time limit: not terminated, so the final observation's value (0.5) is bootstrapped
    limit_adv, _ = gae(t([0.0, 1.0]), t([0.0, 0.0]), t([0.0, 0.5]), torch.tensor([False, False]),
                       torch.tensor([False, True]), gamma=1.0, lam=1.0)
    demo["gae"] = {
        "rewards": rewards.tolist(), "terminated": terminated.tolist(),
        "advantages_gamma1_lam1": _rounded(advantages.tolist()), "returns": _rounded(returns.tolist()),
        "time_limit_advantages_bootstrap_0.5": _rounded(limit_adv.tolist()),
    }

    # PPO-Clip: ratios 1.5 / 0.5 with A = +1 / -1 cover the four cases
    logp = t([1.5, 0.5, 1.5, 0.5]).log().requires_grad_()
    adv = t([1.0, -1.0, -1.0, 1.0])
    loss = clipped_policy_loss(logp, torch.zeros_like(logp), adv, epsilon=0.2)
    loss.sum().backward()
    demo["clipped_policy_loss"] = {
        "ratio": [1.5, 0.5, 1.5, 0.5], "advantages": adv.tolist(), "loss": _rounded(loss.tolist()),
        "grad_logp": _rounded(logp.grad.tolist()),
        "reading": "ratio 1.5 A+1 and ratio 0.5 A-1 are clipped (zero gradient); the other two keep their gradient",
    }

    # DPO at policy == reference: ln 2, and the gradient pushes chosen up and rejected down
    chosen = t([-2.0], requires_grad=True)
    rejected = t([-2.0], requires_grad=True)
    reference = t([-2.0])
    loss = dpo_loss(chosen, rejected, reference, reference, beta=0.5).mean()
    loss.backward()
    swapped = dpo_loss(t([-1.0]), t([-3.0]), reference, reference, beta=0.5)
    straight = dpo_loss(t([-3.0]), t([-1.0]), reference, reference, beta=0.5)
    demo["dpo_loss"] = {
        "loss_at_reference": _rounded(loss.item()), "ln2": _rounded(math.log(2.0)),
        "grad_chosen": _rounded(chosen.grad.item()), "grad_rejected": _rounded(rejected.grad.item()),
        "preference_probabilities_sum_to_1": _rounded((-swapped).exp().item() + (-straight).exp().item()),
    }

    # Group advantages: [0,0,1,1] -> about [-1,-1,1,1]; an all-equal group -> exact zeros
    grouped = t([[0.0, 0.0, 1.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    demo["group_advantages"] = {"rewards": grouped.tolist(), "advantages": _rounded(group_advantages(grouped).tolist())}
    flat = t([0.0, 0.0, 1.0, 1.0, 0.2, 0.2, 0.2, 0.2])
    demo["group_relative_advantages"] = {
        "rewards": flat.tolist(), "num_generations": 4,
        "advantages": _rounded(group_relative_advantages(flat, 4).tolist()),
    }

    # Exact KL and the k3 estimator: the policy-weighted mean of k3 over all actions equals the exact KL
    logits = t([[1.0, 0.0, -1.0]])
    ref_logits = torch.zeros_like(logits)
    policy_logp = F.log_softmax(logits, dim=-1)
    k3 = token_kl_penalty(policy_logp, F.log_softmax(ref_logits, dim=-1))
    demo["kl"] = {
        "logits": logits.tolist(), "reference_logits": ref_logits.tolist(),
        "kl_exact": _rounded(categorical_kl(logits, ref_logits).item()),
        "kl_k3_per_action": _rounded(k3.tolist()[0]),
        "kl_k3_expected_under_policy": _rounded((policy_logp.exp() * k3).sum().item()),
    }

    # Causal shift and EOS/PAD: uniform logits over V=5 give -ln 5 per scored token
    ids = torch.tensor([[0, 1, 2, 4, 4], [0, 1, 3, 3, 4]])
    mask = torch.tensor([[False, False, True, True, False], [False, False, True, True, True]])
    token_logps, valid = response_token_logps(torch.zeros(2, 5, 5, dtype=DTYPE), ids, mask)
    demo["response_logps"] = {
        "input_ids": ids.tolist(), "response_mask": mask.tolist(), "valid": valid.tolist(),
        "token_logps": _rounded(token_logps.tolist()), "minus_ln5": _rounded(-math.log(5.0)),
        "sequence_logps": _rounded(response_logps(torch.zeros(2, 5, 5, dtype=DTYPE), ids, mask).tolist()),
    }
    completion_ids = torch.tensor([[2, 4, 4, 4], [3, 3, 3, 3], [4, 2, 2, 4]])
    demo["completion_mask"] = {
        "completion_ids": completion_ids.tolist(), "eos_token_id": 4,
        "mask": completion_mask(completion_ids, 4).tolist(),
    }

    # Reductions of one per-token loss: answers of 2 and 4 valid tokens
    per_token = t([[1.0, 1.0, 0.0, 0.0], [4.0, 4.0, 4.0, 4.0]])
    lengths_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    demo["reduce_token_loss"] = {
        "per_token_loss": per_token.tolist(), "completion_mask": lengths_mask.tolist(),
        "sequence": _rounded(reduce_token_loss(per_token, lengths_mask, "sequence").item()),
        "token": _rounded(reduce_token_loss(per_token, lengths_mask, "token").item()),
        "constant_max_new_tokens_8": _rounded(reduce_token_loss(per_token, lengths_mask, "constant", 8).item()),
        "reading": "(1 + 4)/2 = 2.5 per answer; 18/6 = 3 per token (the long answer weighs more); 18/(2*8) = 1.125",
    }

    # GRPO vs CISPO on one token whose ratio (1.5) is outside the clip range, A = +1, beta = 0
    grads = {}
    for name, fn, kwargs in (("grpo", grpo_policy_loss, {"epsilon": 0.2}), ("cispo", cispo_policy_loss, {"epsilon_high": 5.0})):
        token_logp = t([[math.log(1.5)]], requires_grad=True)
        fn(token_logp, t([[0.0]]), t([[0.0]]), t([1.0]), torch.ones(1, 1), beta=0.0, **kwargs).backward()
        grads[name] = _rounded(token_logp.grad.item())
    demo["clipped_token_gradient"] = {
        "ratio": 1.5, "advantage": 1.0, "grpo_grad_logp": grads["grpo"], "cispo_grad_logp": grads["cispo"],
        "reading": "PPO-Clip drops the token; CISPO keeps it with the detached weight min(ratio, epsilon_high) = 1.5",
    }
    return demo


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def build_parser():
    parser = OneLineErrorParser(
        prog="rl_lab.py",
        description="Train PPO, DPO, GRPO and CISPO on a 4-context x 3-action bandit, or print the atoms.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--algorithm", choices=("atoms",) + ALGORITHMS + ("all",), default="all",
        help="what to run: 'atoms' prints hand-checkable values of every atom as JSON and writes nothing; "
             "'all' trains ppo, dpo, grpo and cispo",
    )
    parser.add_argument("--steps", type=int_flag(1, MAX_STEPS), default=120,
                        help=f"outer iterations (rollout + updates), integer in [1, {MAX_STEPS}]")
    parser.add_argument("--seed", type=int_flag(0, SEED_LIMIT - 1), default=7,
                        help="seed of the run's torch.Generator, integer in [0, 2**63 - 1]")
    parser.add_argument("--group-size", type=int_flag(2, MAX_GROUP_SIZE), default=8,
                        help=f"GRPO/CISPO answers sampled per prompt (G), integer in [2, {MAX_GROUP_SIZE}]")
    parser.add_argument("--grpo-prompts", type=int_flag(1, MAX_GRPO_PROMPTS), default=16,
                        help=f"GRPO/CISPO prompt groups per iteration (B; B*G actions), integer in [1, {MAX_GRPO_PROMPTS}]")
    parser.add_argument("--preference-flips", type=int_flag(0, 12), default=0,
                        help="DPO only: number of the 12 offline pairs whose chosen/rejected are swapped for the "
                             "whole run, integer in [0, 12]; with 'all' it applies to dpo alone")
    parser.add_argument("--output", default="results",
                        help="folder for <algorithm>.csv and <algorithm>.json (created if missing)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.preference_flips and args.algorithm not in ("dpo", "all"):
        parser.error(f"argument --preference-flips: only applies to --algorithm dpo (or all), got {args.algorithm}")
    if args.algorithm in ("grpo", "cispo", "all") and args.group_size * args.grpo_prompts > MAX_GROUP_ACTIONS:
        parser.error(f"argument --group-size: --grpo-prompts x --group-size = {args.grpo_prompts * args.group_size} "
                     f"actions per iteration, more than {MAX_GROUP_ACTIONS} (about 0.3 GB); lower one of them")
    if args.algorithm == "atoms":
        print(json_text(atomic_demo()), end="")
        return 0
    algorithms = ALGORITHMS if args.algorithm == "all" else (args.algorithm,)
    output_folder_or_exit(parser, args.output, [f"{name}.{ext}" for name in algorithms for ext in ("csv", "json")])
    files, summary = {}, []
    for algorithm in algorithms:
        rows, settings = train(
            algorithm, steps=args.steps, seed=args.seed, group_size=args.group_size,
            preference_flips=args.preference_flips if algorithm == "dpo" else 0, grpo_prompts=args.grpo_prompts,
        )
        columns = DPO_COLUMNS if algorithm == "dpo" else COLUMNS
        csv_path = os.path.join(args.output, f"{algorithm}.csv")
        json_path = os.path.join(args.output, f"{algorithm}.json")
        files[csv_path] = csv_text(rows, columns)
        files[json_path] = json_text({"settings": settings, "initial": rows[0], "final": rows[-1]})
        summary.append(summary_line(algorithm, rows, settings) + f"  -> {csv_path}, {json_path}")
    # every algorithm's files together, after all the training: an interrupted run leaves the old folder whole
    write_files(files)
    print("\n".join(summary))  # printed after the files: a closed stdout pipe then loses nothing
    return 0


def summary_line(algorithm, rows, settings):
    """One line per trained algorithm: start and end of the exact metrics (and DPO's label flips)."""
    first, last = rows[0], rows[-1]
    line = (
        f"{algorithm:5s} expected_reward {first['expected_reward']:.4f} -> {last['expected_reward']:.4f}  "
        f"best_action_probability {last['best_action_probability']:.4f}  kl_reference {last['kl_reference']:.4f}  "
        f"optimizer_steps {last['optimizer_steps']}"
    )
    if algorithm == "dpo":
        line += (
            f"  flips {settings['preference_flips']}/{len(settings['clean_preference_pairs'])}  dpo_training_loss "
            f"{first['dpo_training_loss']:.4f} -> {last['dpo_training_loss']:.4f}  dpo_clean_loss "
            f"{first['dpo_clean_loss']:.4f} -> {last['dpo_clean_loss']:.4f}"
        )
    return line


if __name__ == "__main__":
    sys.exit(run_cli(main))
