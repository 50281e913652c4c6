"""RL post-training atoms and a one-step contextual bandit that trains PPO, DPO, GRPO and CISPO.

    python rl_lab.py --algorithm atoms                  # print a hand-checkable value of every atom (text)
    python rl_lab.py --algorithm all                    # train all four, write results/{ppo,dpo,grpo,cispo}.{csv,json}
    python rl_lab.py --algorithm dpo --preference-flips 12 --output results-dpo-flips12
    python rl_lab.py --algorithm grpo --group-size 4 --grpo-prompts 32 --output results-grpo-g4

The file opens with its flags, read before torch is imported so that --help answers at once. The first
half then holds the atoms: small pure functions, each written from its formula, each importable
(`from rl_lab import gae`). The second half assembles them into training loops on a 4-context x 3-action
bandit whose reward table is known, so every metric is computed exactly.

Shape notation used everywhere in the lab: B prompts or sequences, G group size, N = B*G sampled
responses, T tokens (or time steps), V vocabulary, X contexts, A actions, R response positions.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys

from lab.settings import SEED, SEED_LIMIT, STEPS, add_shared_argument
from lab.io import (
    OneLineErrorParser,
    csv_text,
    flags_first,
    float_flag,
    int_flag,
    json_text,
    output_folder_or_exit,
    run_cli,
    write_files,
)

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------

ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")  # the bandit's four
MAX_STEPS = 100_000
MAX_GROUP_SIZE = 4096
MAX_GRPO_PROMPTS = 4096
# B*G sampled actions per GRPO/CISPO iteration: 2**20 take about 0.3 GB of memory and 1 s per iteration
MAX_GROUP_ACTIONS = 2**20


def build_parser():
    parser = OneLineErrorParser(
        prog="rl_lab.py",
        description="Train PPO, DPO, GRPO and CISPO on a 4-context x 3-action bandit, or print the atoms.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--algorithm", choices=("atoms",) + ALGORITHMS + ("all",), default="all",
        help="what to run: 'atoms' prints hand-checkable values of every atom as compact text (--json: as JSON) "
             "and writes nothing; "
             "'all' trains ppo, dpo, grpo and cispo",
    )
    add_shared_argument(parser, STEPS, 120)
    add_shared_argument(parser, SEED, 7)
    parser.add_argument("--group-size", type=int_flag(2, MAX_GROUP_SIZE), default=8,
                        help=f"GRPO/CISPO answers sampled per prompt (G), integer in [2, {MAX_GROUP_SIZE}]")
    parser.add_argument("--grpo-prompts", type=int_flag(1, MAX_GRPO_PROMPTS), default=16,
                        help=f"GRPO/CISPO prompt groups per iteration (B; B*G actions), integer in [1, {MAX_GRPO_PROMPTS}]")
    parser.add_argument("--preference-flips", type=int_flag(0, 12), default=0,
                        help="DPO only: number of the 12 offline pairs whose chosen/rejected are swapped for the "
                             "whole run, integer in [0, 12]; with 'all' it applies to dpo alone")
    parser.add_argument("--reward-shift", type=float_flag(-100.0, 100.0), default=0.0,
                        help="a constant added to every reward: GRPO's advantages do not move, PPO's critic must "
                             "relearn (an extension the accompanying article proposes), number in [-100, 100]")
    parser.add_argument("--sparse-rewards", action="store_true",
                        help="reward 1 for each context's best action and 0 otherwise (the article's other "
                             "extension)")
    parser.add_argument("--json", action="store_true",
                        help="with --algorithm atoms: print the values as JSON instead of the compact text")
    parser.add_argument("--output", default="results",
                        help="folder for <algorithm>.csv and <algorithm>.json (created if missing)")
    return parser


def _first_given(parser, args, flags):
    """The first of `flags` whose value is not its default (given on the command line), or None."""
    return next((flag for flag in flags
                 if getattr(args, flag[2:].replace("-", "_")) != parser.get_default(flag[2:].replace("-", "_"))), None)


def parse(argv=None):
    """The flags, with every check main() makes on them before any work (a bad one exits 2 with one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.preference_flips and args.algorithm not in ("dpo", "all"):
        parser.error(f"argument --preference-flips: only applies to --algorithm dpo (or all), got {args.algorithm}")
    group_flag = _first_given(parser, args, ("--group-size", "--grpo-prompts"))
    if args.algorithm in ("ppo", "dpo") and group_flag:  # it would change nothing: say so, as for the others
        parser.error(f"argument {group_flag}: only applies to --algorithm grpo, cispo (or all), got {args.algorithm}")
    if args.algorithm in ("grpo", "cispo", "all") and args.group_size * args.grpo_prompts > MAX_GROUP_ACTIONS:
        parser.error(f"argument --group-size: --grpo-prompts x --group-size = {args.grpo_prompts * args.group_size} "
                     f"actions per iteration, more than {MAX_GROUP_ACTIONS} (about 0.3 GB); lower one of them")
    if args.json and args.algorithm != "atoms":
        parser.error(f"argument --json: only applies to --algorithm atoms, got {args.algorithm}")
    training_flag = _first_given(parser, args, ("--steps", "--seed", "--group-size", "--grpo-prompts",
                                                "--reward-shift", "--sparse-rewards", "--output"))
    if args.algorithm == "atoms" and training_flag:  # the atoms train and write nothing: the flag would be lost
        parser.error(f"argument {training_flag}: only applies to training, not to --algorithm atoms (which prints "
                     "and writes nothing)")
    if args.algorithm != "atoms":
        algorithms = ALGORITHMS if args.algorithm == "all" else (args.algorithm,)
        output_folder_or_exit(parser, args.output, [f"{name}.{ext}" for name in algorithms for ext in ("csv", "json")])
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch after the flags: `import torch` takes a second or more, --help and a bad flag none of it
import torch
import torch.nn.functional as F

from lab.checks import (
    check_choice,
    check_int,
    exp_limit,
    check_real,
    check_same_dtype,
    check_matching,
    check_same_shape,
    check_tensor,
    dtype_name,
    finite_result,
    stored,
    torch_threads,
    training_mode,
)

DTYPE = torch.float64
DEVICE = torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Atoms
# ---------------------------------------------------------------------------------------------
# Every atom checks its arguments and raises ValueError naming the one that is wrong, then checks its
# result once (@finite_result): finite arguments too large for the dtype (or an extreme scalar) give
# a ValueError naming an argument and the dtype, never a silent NaN or inf. The keyword `check=False`
# skips both: a training loop passes it for tensors it built itself (finite, of the right shapes by
# construction), and an atom passes it to the atoms it calls after checking its own arguments, so
# nothing is scanned twice per step. The maths is the same either way. Inputs that get no gradient go
# through `_constant`: detached, and copied when made under torch.inference_mode() (a generation
# loop's ids, masks and rewards), which autograd cannot save for the backward pass.
#
# The families, in this order: the clipped policy loss and its diagnostic; preference losses (DPO
# and its family); advantages (group, leave-one-out, GAE; then MaxRL, REINFORCE++, OPO, pass@k,
# GDPO, GPG); KL (exact, k1, k2, k3, the ratio-corrected k3, the straight-through k3+/k1+); token
# sequences (causal shift, masks, reductions); sequence policy losses (GRPO, CISPO, GSPO, SAPO; then
# DPPO, GMPO, Clip-Cov, KL-Cov, DRO, GPG, TOPR, CE-GPPO, VESPO, LUSPO); corrections and shaping
# (importance weights, rollout correction, off-policy masks, the overlong penalty); entropy.
#
# The second-wave atoms (SPEC section 9) make one check call, `_check_args`, so that the body reads as
# the formula; every token loss among them goes through `_token_loss_inputs`, which checks the shared
# arguments (policy, old and reference log-probs, advantages, the mask, beta, the reduction, the KL
# estimator, importance weights) once and sets every masked position to 0 before any exp().


# --- the clipped policy loss -----------------------------------------------------------------


def _clip_range(epsilon, epsilon_high, dual_clip):
    """Checked (epsilon, epsilon_high, dual_clip); epsilon_high None means epsilon (a symmetric range)."""
    epsilon = check_real("epsilon", epsilon, low=0.0, high=1.0, high_open=True)
    if epsilon_high is not None:
        epsilon_high = check_real("epsilon_high", epsilon_high, low=0.0, high=1e6)
    if dual_clip is not None:
        dual_clip = check_real("dual_clip", dual_clip, low=1.0, high=1e12, low_open=True)
    return epsilon, epsilon_high, dual_clip


def _constant(tensor):
    """`tensor` detached, as every input that gets no gradient; an inference tensor is copied first."""
    return tensor.clone() if tensor.is_inference() else tensor.detach()


# Scalar rules of `_check_args`: the bounds check_real takes; "none": True also lets None through.
_REAL = {}
_POSITIVE = {"low": 0.0, "low_open": True}
_NONNEGATIVE = {"low": 0.0}
_UNIT = {"low": 0.0, "high": 1.0}
_FRACTION = {"low": 0.0, "high": 1.0, "low_open": True}  # (0, 1]
_CLIP_WIDTH = {"low": 0.0, "high": 1.0, "high_open": True}  # a clip's epsilon, [0, 1)
_CLIP_HIGH = {"low": 0.0, "high": 1e6, "none": True}  # epsilon_high; None means epsilon


def _check_args(tensors=(), ndim=None, mask=None, vectors=(), lengths=None, reduction=None, max_new_tokens=None,
                ordered=(), requires=(), **scalars):
    """Every check of an atom in one call, so that the atom's body reads as its formula. Raises ValueError
    naming the argument.

    tensors: [(name, tensor)], floating tensors of one shape and dtype (`ndim` dimensions); the first is the
        reference for everything below.
    mask: (name, tensor), a 0/1 mask of the first tensor's shape.
    vectors: [(name, tensor, axis)], 1-D floating tensors in the first tensor's dtype, as long as its
        dimension `axis` (advantages, one per sequence: axis 0).
    lengths: (name, tensor), integer lengths >= 1 of the first tensor's shape.
    reduction, max_new_tokens: as `reduce_token_loss` (checked when reduction is not None).
    scalars: name=(value, rule); a rule is a dict of check_real's bounds (with "none": True, None passes),
        a tuple of allowed strings, or a type (bool: a flag; any other type: an instance of it or None).
    ordered: [(low_name, high_name, strict)]: two checked scalars that must be in order (None skips).
    requires: [(name, message, test)]: test() is False -> "name: message". Run last, on well-formed input.
    """
    if tensors:
        check_matching(list(tensors), ndim=ndim)
        first_name, first = tensors[0]
    if mask is not None:
        check_tensor(mask[0], mask[1], kind="mask", ndim=first.dim())
        check_same_shape([(first_name, first), mask])
    for name, vector, axis in vectors:
        check_tensor(name, vector, ndim=1)
        check_same_dtype([(first_name, first), (name, vector)])
        if vector.shape[0] != first.shape[axis]:
            raise ValueError(f"{name}: expected shape ({first.shape[axis]},), one per row of {first_name}, "
                             f"got {tuple(vector.shape)}")
    if lengths is not None:
        check_tensor(lengths[0], lengths[1], kind="int", ndim=first.dim())
        check_same_shape([(first_name, first), lengths])
        if bool((stored(lengths[1]) < 1).any()):
            raise ValueError(f"{lengths[0]}: expected lengths >= 1 (tokens in each response)")
    if reduction is not None:
        _checked_reduction(mask[1], reduction, max_new_tokens, first.shape[1])
    values = {}
    for name, (value, rule) in scalars.items():
        if rule is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected True or False, got {type(value).__name__} {value!r}")
        elif isinstance(rule, type):
            if value is not None and not isinstance(value, rule):
                raise ValueError(f"{name}: expected a {rule.__name__} or None, got {type(value).__name__}")
        elif isinstance(rule, tuple):
            check_choice(name, value, rule)
        elif not (value is None and rule.get("none")):
            value = check_real(name, value, **{key: bound for key, bound in rule.items() if key != "none"})
        values[name] = value
    for low_name, high_name, strict in ordered:
        low, high = values[low_name], values[high_name]
        if low is not None and high is not None and (high < low or (strict and high == low)):
            raise ValueError(f"{high_name}: expected a value {'>' if strict else '>='} {low_name} = {low}, got {high}")
    for name, message, test in requires:
        if not test():
            raise ValueError(f"{name}: {message}")


@finite_result("logp")
def clipped_policy_loss(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *, check=True):
    """PPO-Clip surrogate, elementwise, as a loss to MINIMIZE (PPO, arXiv 1707.06347, eq. 7).

        ratio = exp(logp - old_logp)
        loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps_high) * A)
        dual-clip c:  loss = min(loss, -c * A) where A < 0

    epsilon_high (DAPO's "clip-higher", arXiv 2503.14476, sec. 3.1, eq. 10) widens the upper end
    alone, so a rare token with A > 0 can grow further before the clip stops it; None keeps the range
    symmetric. dual_clip (dual-clip PPO, Ye et al., arXiv 1912.09729) bounds the loss of an A < 0
    element whose ratio ran far above 1: its unclipped -ratio * A would grow without limit.

    Args:
        logp: (...) float, log-probabilities (nats) of the taken actions under the current policy;
            gradient flows through it.
        old_logp: (...) same shape and dtype, log-probabilities under the sampling (old) policy;
            detached here, because the denominator of the ratio must stay fixed during the epochs.
        advantages: (...) same shape and dtype; detached here (the actor must not train the critic).
        epsilon: lower clip half-width, in [0, 1). epsilon_high: upper half-width >= 0, or None.
        dual_clip: c > 1, or None for no dual clip.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) per-element loss, no reduction.
    Raises:
        ValueError naming the argument for a non-tensor, empty, non-finite, mismatched shape/dtype
        or a scalar out of range; and, naming logp, for a loss the dtype cannot hold: without
        dual_clip, an element with A < 0 whose -A * ratio overflows (a log-ratio beyond about 709
        nats in float64, 88.7 in float32, 11 in float16, or less with a large |A|).

    Extreme but finite log-ratios are safe where the clip decides the value: there the log-ratio is
    clamped at `exp_limit` before exp(), so A > 0 with a huge ratio gives the clipped
    -(1 + eps_high) * A and a zero gradient, and A = 0 gives 0 (never inf * 0 = NaN). Where A < 0 and
    no dual clip bounds the loss, the loss is -A * ratio itself: it is never clamped (a clamped value
    would be finite and wrong). Below the limit nothing changes.
    """
    if check:
        check_matching([("logp", logp), ("old_logp", old_logp), ("advantages", advantages)])
        epsilon, epsilon_high, dual_clip = _clip_range(epsilon, epsilon_high, dual_clip)
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    old_logp = _constant(old_logp)
    advantages = _constant(advantages)
    logratio = logp - old_logp
    limit = exp_limit(logratio.dtype)
    # clamped before exp() only where a clip decides the value: A >= 0, or A < 0 under a dual clip
    clamped = logratio.clamp(max=limit)
    ratio = (clamped if dual_clip is not None else torch.where(advantages < 0, logratio, clamped)).exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - epsilon, 1.0 + epsilon_high)
    # max of the negatives == -min of the objectives: the pessimistic bound of eq. 7
    loss = torch.maximum(pg_loss1, pg_loss2)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    return loss


@finite_result("logp")
def reinforce_loss(logp, advantages, *, check=True):
    """The REINFORCE policy-gradient loss, elementwise, to MINIMIZE (Williams 1992, REINFORCE).

        loss = -A * logp            gradient: -A * grad(logp), the score-function estimator

    Williams, "Simple statistical gradient-following algorithms for connectionist reinforcement
    learning", Machine Learning 8, 1992: the REINFORCE rule with a baseline folded into A.

    Its value means nothing by itself (it is not the expected reward); its gradient does. On the
    first pass over a batch (logp == old_logp) the gradient equals `clipped_policy_loss`'s: PPO only
    changes what happens once the policy has moved.

    Args:
        logp: (...) float, log-probabilities (nats) of the taken actions under the current policy;
            gradient flows through it.
        advantages: (...) same shape and dtype; detached here: the advantage scales the step, it is
            not itself trained (a critic behind it must not be moved by the actor's loss).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) per-element loss, no reduction.
    Raises:
        ValueError naming the argument for a non-tensor, empty, non-finite or mismatched shape/dtype.
    """
    if check:
        check_matching([("logp", logp), ("advantages", advantages)])
    return -_constant(advantages) * logp


@finite_result("ratio")
def clip_fraction(ratio, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *, check=True):
    """Share of elements whose policy-gradient term PPO-Clip zeroes: the lab's `clip_fraction`.

        clipped = (A > 0 and ratio > 1 + eps_high) or (A < 0 and ratio < 1 - eps)
                  or, with dual_clip c, (A < 0 and ratio > c)

    Without dual_clip this is the count TRL (clip_ratio/region_mean) and verl (pg_clipfrac) log. With
    dual_clip the lab also counts A < 0 with ratio > c here; verl logs that share apart
    (pg_clipfrac_lower) and TRL has no dual-clip count. A ratio outside the
    range on the other side keeps the unclipped branch and its gradient, so the naive count
    |ratio - 1| > eps is larger. CISPO never zeroes a token (its weight is capped, the gradient kept).

    Args:
        ratio: (...) float, current/old probability ratios, >= 0 (detached here).
        advantages: (...) same shape and dtype (detached here).
        epsilon, epsilon_high, dual_clip: as `clipped_policy_loss`.
    Returns:
        0-dim tensor in [0, 1], without grad.
    Raises:
        ValueError naming the argument for bad tensors or scalars, or a negative ratio.
    """
    if check:
        check_matching([("ratio", ratio), ("advantages", advantages)])
        # a ratio is exp(logp - old_logp): a negative one is a wrong argument (a log-ratio, a difference)
        if bool((stored(ratio) < 0).any()):
            raise ValueError("ratio: expected probability ratios >= 0 (exp of a log-ratio), got a negative value")
        epsilon, epsilon_high, dual_clip = _clip_range(epsilon, epsilon_high, dual_clip)
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    ratio, advantages = _constant(ratio), _constant(advantages)
    clipped = ((advantages > 0) & (ratio > 1.0 + epsilon_high)) | ((advantages < 0) & (ratio < 1.0 - epsilon))
    if dual_clip is not None:
        clipped = clipped | ((advantages < 0) & (ratio > dual_clip))
    return clipped.to(ratio.dtype).mean()


# --- preference losses: DPO and its family ---------------------------------------------------


def _preference_margin(chosen, rejected, ref_chosen, ref_rejected, beta, check):
    """beta * ((chosen - rejected) - (ref_chosen - ref_rejected)), the references detached."""
    if check:
        check_matching([("chosen", chosen), ("rejected", rejected), ("ref_chosen", ref_chosen),
                        ("ref_rejected", ref_rejected)])
        beta = check_real("beta", beta, low=0.0, low_open=True)
    ref_margin = _constant(ref_chosen) - _constant(ref_rejected)
    return beta * ((chosen - rejected) - ref_margin)


def _label_smoothing(label_smoothing, check):
    if check:
        return check_real("label_smoothing", label_smoothing, low=0.0, high=0.5, high_open=True)
    return label_smoothing


@finite_result("chosen")
def dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, *, check=True):
    """Direct Preference Optimization loss, elementwise (DPO, arXiv 2305.18290, eq. 7).

        margin = (chosen - rejected) - (ref_chosen - ref_rejected)
        loss   = -logsigmoid(beta * margin)

    Args:
        chosen, rejected: (B,) or any common shape, float; sequence-SUMMED log-probs (nats) of the
            preferred and dispreferred answers under the trained policy (no length normalization).
        ref_chosen, ref_rejected: same shape and dtype, under the frozen reference; detached here.
        beta: > 0, the KL-regularization strength of the implicit reward beta * log(pi/pi_ref).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) per-pair loss. At policy == reference it is ln 2 for every pair (with nonzero gradient).
    Raises:
        ValueError naming the argument for bad tensors or beta <= 0.
    TRL: DPOConfig(loss_type="sigmoid", beta=...).
    """
    # logsigmoid is stable for large |margin|; log(sigmoid(x)) underflows to -inf for x << 0
    return -F.logsigmoid(_preference_margin(chosen, rejected, ref_chosen, ref_rejected, beta, check))


@finite_result("chosen")
def ipo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, *, check=True):
    """Identity Preference Optimization loss, elementwise (IPO, Azar et al., arXiv 2310.12036, eq. 17).

        margin = (chosen - rejected) - (ref_chosen - ref_rejected)
        loss   = (margin - 1 / (2 * beta)) ** 2

    A squared loss with a target margin of 1/(2 beta) nats instead of an ever larger one: it stops
    pushing once the margin is reached (DPO's loss keeps falling as the margin grows). Zero exactly
    at margin = 1/(2 beta). Arguments and errors as `dpo_loss` (beta is IPO's tau).
    TRL: DPOConfig(loss_type="ipo"), which feeds length-AVERAGED log-probs; pass those for its numbers.
    """
    margin = _preference_margin(chosen, rejected, ref_chosen, ref_rejected, 1.0, check)
    if check:
        beta = check_real("beta", beta, low=1e-12, high=1e12)  # the target 1/(2 beta) must stay finite
    return (margin - 1.0 / (2.0 * beta)).square()


@finite_result("chosen")
def dpo_hinge_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, *, check=True):
    """Hinge preference loss on the margin relative to the reference, elementwise (RSO's "hinge on the
    normalized likelihood", Liu et al., arXiv 2309.06657; TRL's loss_type="hinge").

        loss = relu(1 - beta * margin)

    Zero once beta * margin >= 1, i.e. beyond a margin of 1/beta nats: pairs already separated stop
    contributing. SLiC-HF's calibration loss (Zhao et al., arXiv 2305.10425) is a hinge too, but on the
    raw log-probability margin (no reference) and with a cross-entropy regularizer. Arguments and errors
    as `dpo_loss`. TRL: DPOConfig(loss_type="hinge").
    """
    return torch.relu(1.0 - _preference_margin(chosen, rejected, ref_chosen, ref_rejected, beta, check))


@finite_result("chosen")
def cdpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, label_smoothing=0.0, *, check=True):
    """Conservative DPO: DPO with label smoothing for noisy labels (Mitchell, 2023, "A note on DPO with
    noisy preferences & relationship to IPO").

        loss = (1 - e) * -logsigmoid(beta * margin) + e * -logsigmoid(-beta * margin)

    The label is believed with probability 1 - e: the loss has a minimum at a finite margin instead
    of rewarding an infinite one. e = label_smoothing in [0, 0.5); e = 0 is `dpo_loss`.
    Arguments and errors as `dpo_loss`. TRL: DPOConfig(loss_type="sigmoid", label_smoothing=e) up to
    version 0.28; later versions removed it (their "sigmoid" ignores label_smoothing).
    """
    logits = _preference_margin(chosen, rejected, ref_chosen, ref_rejected, beta, check)
    e = _label_smoothing(label_smoothing, check)
    if e == 0:  # exactly dpo_loss (and no 0 * inf where the margin is huge)
        return -F.logsigmoid(logits)
    return (1.0 - e) * -F.logsigmoid(logits) + e * -F.logsigmoid(-logits)


@finite_result("chosen")
def robust_dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, label_smoothing=0.0, *, check=True):
    """Robust DPO, elementwise (rDPO, Chowdhury et al., arXiv 2403.00409).

        loss = ((1 - e) * -logsigmoid(beta * margin) - e * -logsigmoid(-beta * margin)) / (1 - 2e)

    An unbiased estimate of the clean-label DPO loss when each label is flipped with probability e
    (its expectation over the noise equals `dpo_loss` on the true labels); e in [0, 0.5), e = 0 is
    `dpo_loss`. Unlike cDPO it can go negative. TRL: DPOConfig(loss_type="robust", label_smoothing=e).
    """
    logits = _preference_margin(chosen, rejected, ref_chosen, ref_rejected, beta, check)
    e = _label_smoothing(label_smoothing, check)
    if e == 0:  # exactly dpo_loss
        return -F.logsigmoid(logits)
    return ((1.0 - e) * -F.logsigmoid(logits) - e * -F.logsigmoid(-logits)) / (1.0 - 2.0 * e)


@finite_result("chosen_avg")
def simpo_loss(chosen_avg, rejected_avg, beta=2.0, gamma=0.5, *, check=True):
    """SimPO loss, elementwise (Meng et al., arXiv 2405.14734, eq. 6): no reference model.

        loss = -logsigmoid(beta * (chosen_avg - rejected_avg) - gamma)

    Args:
        chosen_avg, rejected_avg: (B,) float, length-AVERAGED log-probs (sum / number of response
            tokens) of the two answers under the trained policy; averaging removes the pull toward
            longer answers that summed log-probs carry.
        beta: > 0. gamma: >= 0, the target reward margin (nats after scaling by beta).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B,) per-pair loss.
    Raises:
        ValueError naming the argument for bad tensors or scalars.
    TRL: CPOConfig(loss_type="simpo", cpo_alpha=0.0, simpo_gamma=gamma, beta=beta).
    """
    if check:
        check_matching([("chosen_avg", chosen_avg), ("rejected_avg", rejected_avg)])
        beta = check_real("beta", beta, low=0.0, low_open=True)
        gamma = check_real("gamma", gamma, low=0.0)
    return -F.logsigmoid(beta * (chosen_avg - rejected_avg) - gamma)


# --- advantages ----------------------------------------------------------------------------


def masked(values, mask):
    """`values` where `mask` keeps a position (nonzero), exactly 0 elsewhere. where(), not a product: a
    masked position then contributes exactly 0 and no gradient, whatever it holds (0 * inf is NaN).
    values and mask broadcast together; no check (a helper of the atoms, not an atom)."""
    return torch.where(mask.bool(), values, torch.zeros_like(values))


def tied_groups(rewards, keepdim=False):
    """(B,) bool (or (B, 1) with keepdim): every reward of the group equals its first, the groups whose
    group-relative advantages are all 0 and that teach nothing. rewards (B, G)."""
    return (rewards == rewards[:, :1]).all(dim=1, keepdim=keepdim)


GROUP_SCALES = ("group", "batch", "none")


@finite_result("rewards")
def group_advantages(rewards, epsilon=1e-8, scale="group", *, check=True):
    """Group-relative advantages of outcome-supervised GRPO (DeepSeekMath, arXiv 2402.03300, sec. 4.1.2).

        A[b, g] = (R[b, g] - mean_g R[b]) / (std + epsilon)

    scale chooses the std (population std, dividing by G or by B*G):
    - "group": the row's own std (GRPO, the default);
    - "batch": the std of all B*G rewards, so prompts keep their relative scale (the group mean is
      still subtracted: the "Lite PPO" recipe of "Tricks or Traps?", arXiv 2508.08221);
    - "none": no division, A = R - row mean (Dr. GRPO, arXiv 2503.20783, sec. 3.1: dividing by the
      group's std up-weights prompts that are almost always or almost never solved).

    Args:
        rewards: (B, G) float, G >= 2 samples of the same prompt per row; detached here.
        epsilon: > 0 added to the std so that a near-constant group does not divide by ~0
            (it is unrelated to the PPO clip width).
        scale: "group", "batch" or "none".
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad, same dtype. A row whose rewards are all equal gives exact
        zeros whatever the scale (set explicitly: the float mean of equal values need not equal them).
    Raises:
        ValueError naming the argument for a non-2-D or non-finite tensor, G < 2, epsilon <= 0, an
        unknown scale, or rewards so large that their std overflows the dtype (in float64 beyond
        about 1e153 in magnitude: the advantages would be silently 0) or that R - mean does.
    TRL: GRPOConfig(scale_rewards="group"|"batch"|"none") (TRL's std is the unbiased one, its eps
    1e-4, and its "batch" std is over the raw rewards); verl: algorithm.norm_adv_by_std_in_grpo.
    """
    if check:
        check_tensor("rewards", rewards, ndim=2)
        if rewards.shape[1] < 2:
            raise ValueError(f"rewards: expected at least 2 samples per group (shape (B, G>=2)), got {tuple(rewards.shape)}")
        epsilon = check_real("epsilon", epsilon, low=0.0, low_open=True)
        check_choice("scale", scale, GROUP_SCALES)
    rewards = _constant(rewards)
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    constant_group = tied_groups(rewards, keepdim=True)  # (B, 1)
    centered = masked(rewards - mean, ~constant_group)
    if scale == "none":
        return centered
    if scale == "group":
        population_std = rewards.std(dim=1, correction=0, keepdim=True)  # (B, 1), divides by G
    else:
        population_std = rewards.std(correction=0)  # scalar, divides by B*G
    if check and not bool(torch.isfinite(population_std).all()):
        # the squares overflowed: dividing by an inf std would turn every advantage into a finite, wrong 0
        raise ValueError(f"rewards: values too large, their std overflows {rewards.dtype} (rescale the rewards)")
    # where(), not a plain division: in float16 an epsilon of 1e-8 rounds to 0, and a constant row's 0/0
    # would be NaN; the constant rows are exact zeros either way
    return masked(centered / (population_std + epsilon), ~constant_group)


@finite_result("rewards")
def group_relative_advantages(rewards, num_generations, eps=1e-4, scale="group", *, check=True):
    """The lesson's flat form of `group_advantages` (MiniMind train_grpo.py; DeepSeekMath sec. 4.1.2).

    Args:
        rewards: (B*G,) float, prompt-major: prompt i's generations sit at i*G .. i*G+G-1; detached.
        num_generations: G >= 2, an int.
        eps: > 0 added to the population std (the lesson's default 1e-4).
        scale: "group", "batch" or "none", as `group_advantages`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B*G,) advantages without grad; a group of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for a non-1-D tensor, a length not divisible by G, G < 2.
    """
    if check:
        check_tensor("rewards", rewards, ndim=1)
        num_generations = check_int("num_generations", num_generations, low=2)
        eps = check_real("eps", eps, low=0.0, low_open=True)
        if rewards.numel() % num_generations != 0:
            raise ValueError(
                f"rewards: length {rewards.numel()} is not divisible by num_generations={num_generations}"
            )
    grouped = rewards.reshape(-1, num_generations)  # (B*G,) -> (B, G)
    return group_advantages(grouped, epsilon=eps, scale=scale, check=check).reshape(-1)  # (B, G) -> (B*G,)


@finite_result("rewards")
def rloo_advantages(rewards, *, check=True):
    """REINFORCE leave-one-out advantages (Kool et al., ICLR 2019 workshop, "Buy 4 REINFORCE Samples, Get
    a Baseline for Free!"; RLOO, Ahmadian et al., arXiv 2402.14740): each sample's baseline is the mean
    reward of the OTHER samples of its prompt.

        A[b, i] = R[b, i] - (sum_j R[b, j] - R[b, i]) / (G - 1)  =  G / (G - 1) * (R[b, i] - mean_j R[b, j])

    The baseline does not depend on the sample it is subtracted from, so the policy gradient stays
    unbiased; no std is divided out.
    Args:
        rewards: (B, G) float, G >= 2; detached here.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad; a row of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for a non-2-D or non-finite tensor or G < 2.
    TRL: RLOOTrainer (normalize_advantages=False); verl: algorithm.adv_estimator=rloo.
    """
    if check:
        check_tensor("rewards", rewards, ndim=2)
        if rewards.shape[1] < 2:
            raise ValueError(f"rewards: expected at least 2 samples per group (shape (B, G>=2)), got {tuple(rewards.shape)}")
    rewards = _constant(rewards)
    group_size = rewards.shape[1]
    leave_one_out_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (group_size - 1)  # (B, G)
    return masked(rewards - leave_one_out_mean, ~tied_groups(rewards, keepdim=True))


@finite_result("rewards")
def gae(rewards, values, next_values, terminated, boundary, gamma=0.99, lam=0.95, *, check=True):
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
    terminated implies boundary. This is the time-limit distinction of Pardo et al., "Time Limits in
    Reinforcement Learning" (arXiv 1712.00378): bootstrap only where the cut is not part of the task.

    Args:
        rewards, values, next_values: (T,) float, same dtype; values are V(s_t) and next_values are
            V(s_{t+1}) from the old critic. All detached here.
        terminated, boundary: (T,) bool.
        gamma, lam: in [0, 1].
        check: validate the arguments (see the note above the atoms).
    Returns:
        (advantages, returns), both (T,) without grad, in the dtype of `rewards`.
    Raises:
        ValueError naming the argument for bad tensors, shape/dtype mismatches, gamma or lam outside
        [0, 1], a step that is terminated but not a boundary, or values so large that the returns
        overflow the dtype.
    """
    if check:
        check_matching([("rewards", rewards), ("values", values), ("next_values", next_values)], ndim=1)
        check_tensor("terminated", terminated, kind="bool", ndim=1)
        check_tensor("boundary", boundary, kind="bool", ndim=1)
        check_same_shape([("rewards", rewards), ("terminated", terminated), ("boundary", boundary)])
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
    returns = advantages + _constant(values).to(rewards.dtype)
    return advantages, returns


# --- advantages, second wave: MaxRL, REINFORCE++, OPO, pass@k, GDPO, GPG ----------------------


def _two_samples(rewards):
    """The `requires` rule of every group advantage: G >= 2 samples per prompt (axis 1 of rewards)."""
    return ("rewards", f"expected at least 2 samples per group (shape (B, G>=2, ...)), got {tuple(rewards.shape)}",
            lambda: rewards.shape[1] >= 2)


@finite_result("rewards")
def maxrl_advantages(rewards, epsilon=1e-6, *, check=True):
    """MaxRL advantages: the group-centred reward over the group's MEAN, not its std (Tajwar et al.,
    Maximum Likelihood Reinforcement Learning, arXiv 2602.02710).

        A[b, g] = (R[b, g] - mu_b) / (mu_b + epsilon)          mu_b = mean_g R[b]
        binary rewards: A = R / p_hat - 1,  p_hat the group's success rate

    With binary rewards the policy gradient then weighs a prompt by 1/p (the gradient of log p: the
    likelihood of success is maximized) instead of 1 (the gradient of p: plain RL). A prompt the policy
    rarely solves counts far more; one it always solves barely counts.

    Args:
        rewards: (B, G) float, G >= 2, every reward >= 0 (a mean of 0 must mean "never solved"); detached.
        epsilon: > 0; keeps a group of mean 0 finite (such a group has equal rewards: exact zeros anyway).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad; a row of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for a bad tensor, G < 2, a negative reward or epsilon <= 0.
    Libraries: not in TRL or verl 0.9.1; the authors' verl fork and SkyRL (adv_estimator="maxrl"). The
    RLHF Book's version takes epsilon 0 and sets A = 0 where mu = 0, which gives the same numbers.
    """
    if check:
        _check_args(tensors=[("rewards", rewards)], ndim=2, epsilon=(epsilon, _POSITIVE), requires=[
            _two_samples(rewards), ("rewards", "expected rewards >= 0", lambda: bool((stored(rewards) >= 0).all()))])
    rewards = _constant(rewards)
    mean = rewards.mean(dim=1, keepdim=True)  # (B, 1)
    return masked((rewards - mean) / (mean + epsilon), ~tied_groups(rewards, keepdim=True))


@finite_result("rewards")
def reinforce_pp_baseline_advantages(rewards, lengths=None, epsilon=1e-8, *, check=True):
    """REINFORCE++ with the group baseline: the group-centred reward, whitened over the whole batch's
    tokens (Hu et al., REINFORCE++, arXiv 2501.03262).

        c[b, g] = R[b, g] - mean_g R[b]                      (exactly 0 on a row of equal rewards)
        mu      = sum L c / sum L                             L = response lengths (weights)
        var     = sum L (c - mu)**2 / (sum L - 1)             (unbiased, over the batch's tokens)
        A       = (c - mu) / sqrt(var + epsilon)

    The group mean removes each prompt's difficulty; the batch std, unlike GRPO's per-group std, does
    not up-weight prompts whose few samples happen to agree. Weighting by L reproduces whitening over
    every response token, each carrying its response's c. The whitening shifts every advantage by mu,
    so a row of equal rewards gets -mu / std, not 0.

    Args:
        rewards: (B, G) float, G >= 2; detached.
        lengths: (B, G) integer response lengths >= 1, or None (every response weighs 1).
        epsilon: > 0, added to the variance under the square root.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad.
    Raises:
        ValueError naming the argument for bad tensors, G < 2, lengths < 1 or epsilon <= 0.
    verl: algorithm.adv_estimator="reinforce_plus_plus_baseline" (masked_whiten over the tokens; its
    group mean adds no epsilon to counts: equal up to rounding). TRL: none.
    """
    if check:
        _check_args(tensors=[("rewards", rewards)], ndim=2, lengths=None if lengths is None else ("lengths", lengths),
                    epsilon=(epsilon, _POSITIVE), requires=[_two_samples(rewards)])
    rewards = _constant(rewards)
    centered = masked(rewards - rewards.mean(dim=1, keepdim=True), ~tied_groups(rewards, keepdim=True))  # (B, G)
    weights = torch.ones_like(rewards) if lengths is None else lengths.to(rewards.dtype)
    total = weights.sum()
    mean = (weights * centered).sum() / total
    variance = (weights * (centered - mean).square()).sum() / (total - 1.0)  # unbiased, as over tokens
    return (centered - mean) / (variance + epsilon).sqrt()


REINFORCE_PP_WHITEN_EPSILON = 1e-8  # verl's masked_whiten: added to the variance under the square root


@finite_result("token_rewards")
def reinforce_pp_advantages(token_rewards, completion_mask, gamma=1.0, *, check=True):
    """REINFORCE++ without a critic or a group baseline: discounted returns of the kept tokens,
    whitened over the batch (Hu et al., REINFORCE++, arXiv 2501.03262).

        G_t = r_t + gamma * G_next          over kept tokens only, from the last to the first
        A_t = (G_t - mu) / sqrt(var + 1e-8) mu, var (unbiased) over every kept token of the batch

    A masked position (a prompt, a tool's output, padding) gets no reward and no discount: the return
    passes through it unchanged to the kept token before it, and the position itself gets 0.

    Args:
        token_rewards: (N, R) float per-token rewards (an outcome reward on the last kept token, a
            per-token KL penalty, or both); detached. Masked positions may hold any finite value.
        completion_mask: (N, R) 0/1, 1 on the tokens that count; at least 2 kept tokens in the batch.
        gamma: discount in [0, 1].
        check: validate the arguments (see the note above the atoms).
    Returns:
        (advantages, returns), both (N, R) without grad, 0 at masked positions.
    Raises:
        ValueError naming the argument for bad tensors, fewer than 2 kept tokens or gamma outside [0, 1].
    verl: algorithm.adv_estimator="reinforce_plus_plus" with algorithm.gamma (its loop resets the return
    at a masked position instead of passing it through: the same numbers for right padding). TRL: none.
    """
    if check:
        _check_args(tensors=[("token_rewards", token_rewards)], ndim=2, mask=("completion_mask", completion_mask),
                    gamma=(gamma, _UNIT), requires=[("completion_mask", "expected at least 2 kept tokens to whiten",
                                                     lambda: int((stored(completion_mask) != 0).sum()) >= 2)])
    kept = _constant(completion_mask).bool()  # (N, R)
    rewards = masked(_constant(token_rewards), kept)
    running = torch.zeros_like(rewards[:, 0])  # (N,): G_next of each sequence
    returns = []
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(kept[:, t], rewards[:, t] + gamma * running, running)
        returns.append(masked(running, kept[:, t]))
    returns = torch.stack(returns[::-1], dim=1)  # R x (N,) -> (N, R)
    values = returns[kept]  # (number of kept tokens,)
    mean = values.mean()
    variance = (values - mean).square().sum() / (values.numel() - 1)  # unbiased
    advantages = masked((returns - mean) / (variance + REINFORCE_PP_WHITEN_EPSILON).sqrt(), kept)
    return advantages, returns


@finite_result("rewards")
def opo_advantages(rewards, lengths, *, check=True):
    """OPO advantages: the reward minus the group's LENGTH-WEIGHTED mean reward, no std (Hao et al.,
    On-Policy RL with Optimal Reward Baseline, arXiv 2505.23585).

        b_b     = sum_g L[b, g] R[b, g] / sum_g L[b, g]
        A[b, g] = R[b, g] - b_b

    For a sequence-level reward the baseline that minimizes the gradient's variance weighs each sample
    by the squared norm of its score-function gradient; under the paper's assumption that this grows
    with the response length, the optimal baseline is the length-weighted mean.

    Args:
        rewards: (B, G) float, G >= 2; detached.
        lengths: (B, G) integer response lengths >= 1 (required).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad; a row of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for bad tensors, G < 2 or lengths < 1.
    verl: algorithm.adv_estimator="opo" (the same baseline, over the token counts of the responses).
    TRL: none.
    """
    if check:
        _check_args(tensors=[("rewards", rewards)], ndim=2, lengths=("lengths", lengths),
                    requires=[_two_samples(rewards)])
    rewards = _constant(rewards)
    weights = _constant(lengths).to(rewards.dtype)
    baseline = (weights * rewards).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True)  # (B, 1)
    return masked(rewards - baseline, ~tied_groups(rewards, keepdim=True))


@finite_result("rewards")
def passk_advantages(rewards, epsilon=1e-6, scale=True, *, check=True):
    """Pass@k advantages: only the best sample of each group gets credit, the margin by which it beats the
    second best (Tang et al., Optimizing Language Models for Inference Time Objectives using Reinforcement
    Learning, arXiv 2503.19595, the leave-one-out pass@k gradient with k = G).

        A[b, argmax] = (r_max - r_2nd) / (std_b + epsilon)     std_b unbiased; no division if not scale
        A[b, other]  = 0                                        (a tied maximum gives 0 everywhere)

    The group's reward under pass@G is its best sample's reward; removing that sample lowers it to the
    second best, so only the best sample is responsible for the difference.

    Args:
        rewards: (B, G) float, G >= 2; detached.
        epsilon: > 0 added to the std. scale: a bool, divide by the group's std.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad; a row of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for bad tensors, G < 2, epsilon <= 0 or a non-bool scale.
    verl: algorithm.adv_estimator="grpo_passk" (scale: algorithm.norm_adv_by_std_in_grpo). TRL: none.
    """
    if check:
        _check_args(tensors=[("rewards", rewards)], ndim=2, epsilon=(epsilon, _POSITIVE), scale=(scale, bool),
                    requires=[_two_samples(rewards)])
    rewards = _constant(rewards)
    top = rewards.topk(2, dim=1)  # values and indices (B, 2): the best and the second best
    margin = top.values[:, 0] - top.values[:, 1]  # (B,), 0 when the maximum is tied
    if scale:
        margin = margin / (rewards.std(dim=1) + epsilon)  # unbiased std of the row
    return torch.zeros_like(rewards).scatter(1, top.indices[:, :1], margin.unsqueeze(1))  # (B,) -> (B, G)


@finite_result("rewards")
def gdpo_advantages(rewards, reward_weights=None, epsilon=1e-4, *, check=True):
    """GDPO advantages for several rewards: normalize each reward within its group first, then sum them
    and normalize the sum over the batch (Liu et al., GDPO: Group reward-Decoupled Normalization Policy
    Optimization for Multi-reward RL Optimization, arXiv 2601.05242).

        z[b, g, k] = (R[b, g, k] - mean_g) / (std_g + epsilon)    per group and reward; 0 if constant
        s[b, g]    = sum_k w_k z[b, g, k]
        A[b, g]    = (s - mean s) / (std s + epsilon)             over all B*G; stds unbiased

    GRPO on the summed reward maps different reward combinations to the same advantage (a format point
    and a correctness point cancel); normalizing each reward first keeps their differences apart.

    Args:
        rewards: (B, G, K) float, G >= 2 samples, K rewards per sample; detached.
        reward_weights: (K,) float weights w, or None for all 1; detached.
        epsilon: > 0 added to both stds.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad; exact zeros when every s is equal (every group constant).
    Raises:
        ValueError naming the argument for bad tensors, G < 2, a weight vector of the wrong length or
        epsilon <= 0.
    TRL: GRPOConfig(multi_objective_aggregation="normalize_then_sum", reward_weights). verl:
    algorithm.adv_estimator="gdpo" differs: epsilon 1e-6, the batch whitening weighted by the token
    counts, and its first stage computed in float32.
    """
    if check:
        vectors = [] if reward_weights is None else [("reward_weights", reward_weights, 2)]
        _check_args(tensors=[("rewards", rewards)], ndim=3, vectors=vectors, epsilon=(epsilon, _POSITIVE),
                    requires=[_two_samples(rewards)])
    rewards = _constant(rewards)
    weights = torch.ones_like(rewards[0, 0]) if reward_weights is None else _constant(reward_weights)  # (K,)
    constant = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)  # (B, 1, K): a reward tied within its group
    mean, std = rewards.mean(dim=1, keepdim=True), rewards.std(dim=1, keepdim=True)  # (B, 1, K), unbiased
    summed = (masked((rewards - mean) / (std + epsilon), ~constant) * weights).sum(dim=-1)  # (B, G, K) -> (B, G)
    if bool((summed == summed.flatten()[0]).all()):  # the batch std is 0: rounding noise / epsilon is no signal
        return torch.zeros_like(summed)
    return (summed - summed.mean()) / (summed.std() + epsilon)  # over all B*G, unbiased


GPG_ALPHA_COUNTS = ("reward", "group")


@finite_result("rewards")
def gpg_advantages(rewards, f_norm=1.0, alpha_count="reward", *, check=True):
    """GPG advantages: the group-centred reward, no std, scaled up by the share of samples that teach
    something (Chu et al., GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning,
    arXiv 2504.02546).

        A[b, g] = alpha * (R[b, g] - mean_g R[b]) / f_norm
        alpha   = N / max(1, #(R != 0))                       "reward": verl's count, N = B*G
        alpha   = N / max(1, #responses in non-tied groups)   "group": the paper's B / (B - M)

    Groups whose rewards are all equal give zero gradient and dilute the batch mean; alpha undoes the
    dilution, so the step is as large as if only the informative samples had been drawn.

    Args:
        rewards: (B, G) float, G >= 2; detached.
        f_norm: > 0, a constant divisor (the paper's F_norm, 1 by default: the std is not used).
        alpha_count: "reward" or "group", what alpha counts (see above).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (B, G) advantages without grad; a row of equal rewards gives exact zeros.
    Raises:
        ValueError naming the argument for bad tensors, G < 2, f_norm <= 0 or an unknown alpha_count.
    verl: algorithm.adv_estimator="gpg" (alpha_count "reward"). TRL: none.
    """
    if check:
        _check_args(tensors=[("rewards", rewards)], ndim=2, f_norm=(f_norm, _POSITIVE),
                    alpha_count=(alpha_count, GPG_ALPHA_COUNTS), requires=[_two_samples(rewards)])
    rewards = _constant(rewards)
    tied = tied_groups(rewards, keepdim=True)  # (B, 1)
    if alpha_count == "reward":
        informative = int((rewards != 0).sum())
    else:
        informative = int((~tied).sum()) * rewards.shape[1]
    alpha = rewards.numel() / max(1, informative)
    return alpha * masked(rewards - rewards.mean(dim=1, keepdim=True), ~tied) / f_norm


# --- KL: exact, the three sampled estimators and their corrections -------------------------


@finite_result("logits")
def categorical_kl(logits, reference_logits, *, check=True):
    """Exact KL(softmax(logits) || softmax(reference_logits)) over the last axis, in nats.

    The trained policy comes first: in the RL literature and in TRL this is the reverse KL
    (mode-seeking); KL(reference || policy) is the forward one.

        KL = sum_a p(a) * (log p(a) - log q(a))

    Args:
        logits: (..., A) float, the trained policy; gradient flows to it.
        reference_logits: same shape and dtype, the reference; detached here.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) KL per row, >= 0.
    Raises:
        ValueError naming the argument for bad tensors, a shape mismatch or 0-D input, or a KL the
        dtype cannot hold (an action the policy takes that the reference all but excludes).

    An action whose probability underflows to 0 adds exactly 0 (0 * log 0 = 0 by convention, and by
    the limit), also where its log-probability is -inf: never 0 * inf = NaN, in the value or the gradient.
    """
    if check:
        check_matching([("logits", logits), ("reference_logits", reference_logits)])
        if logits.dim() == 0:
            raise ValueError("logits: expected at least 1 dimension (..., A)")
    logp = F.log_softmax(logits, dim=-1)
    ref_logp = F.log_softmax(_constant(reference_logits), dim=-1)
    p = logp.exp()
    # where(), in the factor that can be -inf: then neither the value nor its gradient meets 0 * inf
    log_ratio = torch.where(p > 0, logp - ref_logp, torch.zeros_like(logp))
    return (p * log_ratio).sum(dim=-1)


def kl_optimum_logp(rewards, ref_logp, beta):
    """log pi*(a|x) = log ref(a|x) + R(x, a) / beta - log Z(x): the maximizer of E_pi[R] - beta KL(pi || ref)
    per context (the KL-regularized objective's closed form; e.g. DPO, arXiv 2305.18290, eq. 4).

    Args: rewards (X, A) float; ref_logp (X, A) log-probs of the reference; beta > 0 (a float).
    Returns: (X, A) log-probs. At pi* the shaped reward R - beta log(pi* / ref) = beta log Z(x) is the
    same for every action: the exact gradient of the objective, p * (shaped - E_p[shaped]), is zero.
    """
    return F.log_softmax(ref_logp + rewards / beta, dim=-1)


FORWARD_OPTIMUM_BISECTIONS = 200  # halvings of [max R, max R + beta]: far below float64's resolution


def forward_kl_optimum_logp(rewards, ref_logp, beta):
    """The maximizer of E_pi[R] - beta KL(ref || pi) per context, with the FORWARD KL (the reference first):
    what k3 as an on-policy loss term optimizes, since E_{a~pi}[grad k3] = grad KL(ref || pi).

    Setting the gradient of sum_a p R + beta sum_a ref log p under sum_a p = 1 to zero gives
        p(a) = beta ref(a) / (mu - R(a)),    mu = E_p[R] + beta,
    with mu > max_a R chosen so that the p sum to 1; the sum falls from +inf (mu -> max R) to at most 1
    (mu = max R + beta), so mu is found by bisection, per context. Unlike pi*, p never falls below
    beta ref(a) / (max R - min R + beta): the forward KL keeps mass on every action the reference has.

    Args: rewards (X, A) float; ref_logp (X, A) log-probs of the reference (every entry finite); beta > 0.
    Returns: (X, A) log-probs.
    """
    ref = ref_logp.exp()
    low = rewards.max(dim=-1, keepdim=True).values  # (X, 1): the sum of p is +inf here
    high = low + beta  # the sum is <= 1 here
    for _ in range(FORWARD_OPTIMUM_BISECTIONS):
        middle = (low + high) / 2
        above_one = (beta * ref / (middle - rewards)).sum(dim=-1, keepdim=True) > 1.0  # (X, 1)
        low, high = torch.where(above_one, middle, low), torch.where(above_one, high, middle)
    probs = beta * ref / (high - rewards)
    return (probs / probs.sum(dim=-1, keepdim=True)).log()  # the last halving's rounding, normalized away


def _check_kl_args(policy_logps, ref_logps, check):
    if check:
        check_matching([("policy_logps", policy_logps), ("ref_logps", ref_logps)])


@finite_result("policy_logps")
def token_kl_penalty(policy_logps, ref_logps, *, check=True):
    """k3, the estimator of KL(policy || ref) per token used by GRPO (DeepSeekMath, arXiv 2402.03300,
    eq. 4; Schulman, "Approximating KL Divergence", 2020). Also importable as `kl_k3`.

        delta = ref_logp - policy_logp
        kl_k3 = exp(delta) - delta - 1        (>= 0)

    On tokens sampled from the policy: its mean is the exact KL(policy || ref) (unbiased; lower
    variance than k1 near the reference only: far from it k3 can spread more, see the atlas's
    kl-estimators). For one categorical draw from the current policy, its expected GRADIENT is the
    gradient of KL(ref || policy), the other direction (arXiv 2506.09477). For a sequence, a per-token
    loss term gives only a partial gradient of the sequence KL (Tang and Munos' second pitfall); the
    KL folded into the reward gives the exact one. On tokens drawn from another distribution (pi_old
    from the second pass on) it is biased; TRL's use_bias_correction_kl (on by default) multiplies it
    by the ratio pi/pi_old, which makes its expected gradient that of KL(policy || ref).
    Args:
        policy_logps: (...) float log-probs (nats) of the taken tokens; gradient flows through it.
        ref_logps: same shape and dtype, the frozen reference; detached here.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) per-token k3 values.
    Raises:
        ValueError naming the argument for bad tensors or mismatched shape/dtype, or (naming
        policy_logps) when ref_logps - policy_logps exceeds about 709.8 nats in float64: exp() overflows.
    TRL: GRPO's only estimator (beta); verl: kl_loss_type / kl_penalty "low_var_kl" (verl also
    clamps the log-ratio to +-20 and k3 to [-10, 10]).
    """
    _check_kl_args(policy_logps, ref_logps, check)
    delta = _constant(ref_logps) - policy_logps
    return delta.exp() - delta - 1.0


kl_k3 = token_kl_penalty  # one function, two names: the lesson's and Schulman's


@finite_result("policy_logps")
def kl_k1(policy_logps, ref_logps, *, check=True):
    """k1 = policy_logp - ref_logp per token, the plain log-ratio (Schulman, "Approximating KL
    Divergence", 2020).

    On tokens sampled from the policy: its mean is the exact KL(policy || ref) (unbiased, but high
    variance and often negative per token). On tokens drawn from the current policy and summed with
    weights that do not depend on the length (sum or constant reduction), its expected GRADIENT is
    0, since E[grad log policy] = 0: as a loss term it does not pull toward the reference
    (arXiv 2506.09477). Under the per-sequence mean the weight 1/|y| depends on later tokens, so it
    is near 0, not exactly 0; from the second pass on the samples come from pi_old and it pulls toward
    pi_old. It does work when folded into the reward, where the policy gradient multiplies it by
    grad log policy.
    Args, errors: as `token_kl_penalty` (the difference overflows only beyond about 9e307 nats).
    TRL: RLOOConfig.beta, the reward KL summed over the response; verl: kl_penalty / kl_loss_type "k1".
    """
    _check_kl_args(policy_logps, ref_logps, check)
    return policy_logps - _constant(ref_logps)


@finite_result("policy_logps")
def kl_k2(policy_logps, ref_logps, *, check=True):
    """k2 = 0.5 * (policy_logp - ref_logp) ** 2 per token (Schulman, "Approximating KL Divergence", 2020).

    On tokens sampled from the policy: its mean is biased (about KL when the two are close, >= 0 per
    token, low variance). For one categorical draw from the current policy, its expected GRADIENT is
    exactly the gradient of KL(policy || ref) (arXiv 2506.09477). For a sequence, a per-token k2 loss
    gives only a partial gradient of the sequence KL; the KL in the reward gives the exact one.
    Args, errors: as `token_kl_penalty`; the square overflows where |policy - ref| exceeds about 1.34e154
    nats in float64 (256 in float16: the square of the difference exceeds the dtype's largest number before
    it is halved), a ValueError naming policy_logps.
    verl: kl_loss_type / kl_penalty "mse" (k2); TRL: none.
    """
    _check_kl_args(policy_logps, ref_logps, check)
    return 0.5 * (policy_logps - _constant(ref_logps)).square()


@finite_result("policy_logps")
def kl_k3_is_corrected(policy_logps, old_logps, ref_logps, *, check=True):
    """k3 times the ratio pi / pi_old: the k3 penalty made right for tokens sampled from pi_old
    (DeepSeek-V3.2, arXiv 2512.02556, its unbiased KL estimate; Tang and Munos, arXiv 2506.09477).

        kl = exp(policy - old) * k3(policy, ref)          gradient through both factors

    From the second pass over a batch the tokens come from pi_old, not from the policy being trained,
    so a plain mean of k3 estimates the wrong expectation and its gradient is biased. The ratio turns
    the expectation under pi_old into one under pi. On the first pass (policy == old) the value is k3
    and the gradient is k2's, policy - ref: the gradient of KL(pi || ref) for one draw.

    Args:
        policy_logps: (...) float log-probs (nats) of the sampled tokens; gradient flows through it.
        old_logps: same shape and dtype, at sampling time; detached. ref_logps: the reference; detached.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) per-token values, >= 0.
    Raises:
        ValueError naming the argument for bad tensors, or (naming policy_logps) a ratio or k3 the dtype
        cannot hold.
    TRL: GRPOConfig(use_bias_correction_kl=True), on by default (at importance_sampling_level="sequence"
    the ratio is the sequence's s_i). verl: none.
    """
    if check:
        _check_args(tensors=[("policy_logps", policy_logps), ("old_logps", old_logps), ("ref_logps", ref_logps)])
    ratio = (policy_logps - _constant(old_logps)).exp()  # not detached: the correction is differentiated too
    return ratio * kl_k3(policy_logps, ref_logps, check=False)


STRAIGHT_THROUGH_KINDS = ("k3+", "k1+")


@finite_result("policy_logps")
def kl_straight_through(policy_logps, ref_logps, kind="k3+", *, check=True):
    """A KL estimate whose value is k3's (or k1's) and whose gradient is k2's: a straight-through estimator
    (verl's "k3+" and "k1+"; Tang and Munos, arXiv 2506.09477, show k2's gradient is the right one).

        kl = (k2 - sg(k2)) + sg(k)        k = k3 for "k3+", k1 for "k1+"

    The first bracket is exactly 0 in value and carries k2's gradient, policy - ref, which for one draw
    from the policy is the gradient of KL(pi || ref); the second carries the value, bit for bit, and no
    gradient. So the logged number stays the unbiased k3 (or k1) while the update follows k2.

    Args:
        policy_logps: (...) float log-probs (nats); gradient flows through it.
        ref_logps: same shape and dtype, the reference; detached.
        kind: "k3+" or "k1+".
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) per-token values equal to kl_k3 (or kl_k1) bit for bit.
    Raises:
        ValueError naming the argument for bad tensors or an unknown kind.
    verl: actor.kl_loss_type="k3+" or "k1+" (its k3 also clamps to [-10, 10]). TRL: none.
    """
    if check:
        _check_args(tensors=[("policy_logps", policy_logps), ("ref_logps", ref_logps)],
                    kind=(kind, STRAIGHT_THROUGH_KINDS))
    k2 = kl_k2(policy_logps, ref_logps, check=False)
    value = (kl_k3 if kind == "k3+" else kl_k1)(policy_logps, ref_logps, check=False).detach()
    return (k2 - k2.detach()) + value  # brackets first: 0 + value is value, exactly


# --- token sequences: the causal shift, masks and reductions ---------------------------------


@finite_result("logits")
def response_token_logps(logits, input_ids, response_mask, *, check=True):
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
        check: validate the arguments (see the note above the atoms).
    Returns:
        (token_logps (B, T-1) float with non-response positions exactly 0, valid (B, T-1) bool).
    Raises:
        ValueError naming the argument: wrong shapes/dtypes, T < 2, ids outside [0, V), a mask that
        is True at position 0 (no logits row scores it), or a row with no response token.
    """
    if check:
        check_tensor("logits", logits, ndim=3)
        check_tensor("input_ids", input_ids, kind="int", ndim=2)
        check_tensor("response_mask", response_mask, kind="bool", ndim=2)
        batch, length, vocab = logits.shape
        if input_ids.shape != (batch, length):
            raise ValueError(
                f"input_ids: expected shape {(batch, length)} to match logits, got {tuple(input_ids.shape)}")
        if response_mask.shape != (batch, length):
            raise ValueError(
                f"response_mask: expected shape {(batch, length)} to match logits, got {tuple(response_mask.shape)}"
            )
        if length < 2:
            raise ValueError(f"logits: expected at least 2 positions (T >= 2) for the causal shift, got T={length}")
        ids = stored(input_ids).long()  # int64: int16 cannot hold 40000
        if bool(((ids < 0) | (ids >= vocab)).any()):
            raise ValueError(f"input_ids: expected ids in [0, {vocab}), got values outside")
        if bool(response_mask[:, 0].any()):
            raise ValueError("response_mask: position 0 cannot be a response token (no logits row predicts it)")
        if not bool(response_mask[:, 1:].any(dim=1).all()):
            raise ValueError("response_mask: every row needs at least one response token")
    valid = _constant(response_mask[:, 1:])  # (B, T-1)
    logp = F.log_softmax(logits[:, :-1], dim=-1)  # (B, T-1, V)
    targets = _constant(input_ids[:, 1:]).long()  # (B, T-1); gather wants int64
    token_logps = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T-1, 1) -> (B, T-1)
    token_logps = masked(token_logps, valid)  # a masked position contributes exactly 0 and no gradient
    return token_logps, valid


@finite_result("logits")
def response_logps(logits, input_ids, response_mask, *, check=True):
    """(B,) response-only sum of `response_token_logps` (the sequence log-prob used by DPO).

    Same arguments and errors as `response_token_logps`.
    """
    token_logps, _ = response_token_logps(logits, input_ids, response_mask, check=check)
    return token_logps.sum(dim=-1)  # (B, T-1) -> (B,)


def completion_mask(completion_ids, eos_token_id, pad_mask=None, *, check=True):
    """Mask of the tokens that count: every position up to and including the first EOS.

    Follows MiniMind train_grpo.py: positions after the first EOS (padding, or anything generated
    after the answer stopped) are dropped; a row without EOS keeps all its real positions.

    Args:
        completion_ids: (N, R) signed integer token ids of the sampled completions (int8 to int64;
            compared in int64, so an eos_token_id beyond the dtype's range never wraps round).
        eos_token_id: int, the EOS id (it may equal the PAD id: the position decides).
        pad_mask: optional (N, R) bool/0-1, True on real (non-padding) positions, as the rollout's
            padding mask in the lesson; None means no padding. An EOS on a padding position is ignored.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N, R) int64 mask of 0/1.
    Raises:
        ValueError naming the argument for a bad tensor, shape or a non-int eos_token_id.
    """
    if check:
        check_tensor("completion_ids", completion_ids, kind="int", ndim=2)
        eos_token_id = check_int("eos_token_id", eos_token_id, low=0, high=SEED_LIMIT - 1)
        if pad_mask is not None:
            check_tensor("pad_mask", pad_mask, kind="mask", ndim=2)
            check_same_shape([("completion_ids", completion_ids), ("pad_mask", pad_mask)])
    real = torch.ones_like(completion_ids, dtype=torch.bool) if pad_mask is None else pad_mask.bool()
    is_eos = (completion_ids.long() == eos_token_id) & real  # (N, R), int64: 300 must not match an int8 44
    length = completion_ids.shape[1]
    has_eos = is_eos.any(dim=1)  # (N,)
    first_eos = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, length - 1, dtype=torch.long))
    positions = torch.arange(length).expand_as(completion_ids)  # (R,) -> (N, R)
    return ((positions <= first_eos.unsqueeze(1)) & real).long()


REDUCTIONS = ("sequence", "token", "constant")


def _checked_reduction(completion_mask, reduction, max_new_tokens, length):
    """The reduction arguments checked (completion_mask already is); returns max_new_tokens."""
    check_choice("reduction", reduction, REDUCTIONS)
    if max_new_tokens is not None:
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1, high=2**31 - 1)
    if reduction == "constant":
        longest = int((completion_mask.detach() != 0).sum(dim=1).max().item())
        if longest > (length if max_new_tokens is None else max_new_tokens):
            raise ValueError(f"max_new_tokens: expected at least the longest completion ({longest} tokens), "
                             f"got {max_new_tokens}")
    return max_new_tokens


@finite_result("per_token_loss")
def reduce_token_loss(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None, *, check=True):
    """Reduce a (N, R) per-token loss to a scalar over the valid (masked) tokens.

    - "sequence": mean over each sequence's valid tokens (count clamped to >= 1), then mean over
      sequences: every answer weighs the same (original GRPO, DeepSeekMath eq. 3; the lesson).
    - "token": sum over all valid tokens / their count: every token weighs the same, long answers
      weigh more (DAPO, arXiv 2503.14476, sec. 3.3, eq. 12).
    - "constant": sum over all valid tokens / (N * max_new_tokens), a constant that does not
      depend on the lengths (Dr. GRPO, arXiv 2503.20783, sec. 3.2; the length bias it removes: sec. 3.1).

    Args:
        per_token_loss: (N, R) float.
        completion_mask: (N, R) 0/1 of bool, int or float dtype.
        reduction: "sequence", "token" or "constant".
        max_new_tokens: int >= 1, the cap on a completion's length, for "constant" (R is used when
            None); a row with more kept tokens than the cap is an error.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar tensor.
    Raises:
        ValueError naming the argument for bad tensors, shapes, an unknown reduction or a
        max_new_tokens below the longest completion.
    TRL: GRPOConfig(loss_type="grpo" | "dapo" | "dr_grpo"); verl: actor.loss_agg_mode
    "seq-mean-token-mean" | "token-mean" | "seq-mean-token-sum-norm".
    """
    if check:
        check_tensor("per_token_loss", per_token_loss, kind="any_float", ndim=2)
        check_tensor("completion_mask", completion_mask, kind="mask", ndim=2)
        check_same_shape([("per_token_loss", per_token_loss), ("completion_mask", completion_mask)])
        max_new_tokens = _checked_reduction(completion_mask, reduction, max_new_tokens, per_token_loss.shape[1])
    mask = _constant(completion_mask).to(per_token_loss.dtype)
    if check and not bool(torch.isfinite(per_token_loss.detach()[mask > 0]).all()):
        raise ValueError("per_token_loss: expected finite values on the tokens the mask keeps")
    kept = masked(per_token_loss, mask)  # a masked position contributes exactly 0 and no gradient
    if reduction == "sequence":
        per_sequence = kept.sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (N, R) -> (N,)
        return per_sequence.mean()
    if reduction == "token":
        return kept.sum() / mask.sum().clamp(min=1.0)
    if max_new_tokens is None:  # "constant"
        max_new_tokens = per_token_loss.shape[1]
    return kept.sum() / (per_token_loss.shape[0] * max_new_tokens)


# --- sequence policy losses: GRPO, CISPO, GSPO, SAPO -----------------------------------------


def _kept_only(completion_mask, *token_tensors):
    """Replace every masked position by 0 before any exp(): padding may hold any finite filler (e.g.
    -1e9) and must neither overflow the ratio nor send NaN through the masked branch of where()."""
    return [masked(tensor, completion_mask.detach()) for tensor in token_tensors]


def _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, kl_estimator):
    check_matching([("policy_logps", policy_logps), ("old_logps", old_logps), ("ref_logps", ref_logps)], ndim=2)
    check_tensor("advantages", advantages, ndim=1)
    check_same_dtype([("policy_logps", policy_logps), ("advantages", advantages)])
    if advantages.shape[0] != policy_logps.shape[0]:
        raise ValueError(
            f"advantages: expected shape ({policy_logps.shape[0]},) one per sequence, got {tuple(advantages.shape)}"
        )
    check_tensor("completion_mask", completion_mask, kind="mask", ndim=2)
    check_same_shape([("policy_logps", policy_logps), ("completion_mask", completion_mask)])
    check_real("beta", beta, low=0.0)
    if kl_estimator not in KL_ESTIMATORS.values():
        raise ValueError(f"kl_estimator: expected one of the atoms kl_k1, kl_k2, kl_k3, got {kl_estimator!r}")


def _weighted(policy_term, importance_weights, completion_mask, check):
    """The (N, R) policy term times detached per-token importance weights, or unchanged for None."""
    if importance_weights is None:
        return policy_term
    if check:
        check_tensor("importance_weights", importance_weights, ndim=2)
        check_same_shape([("completion_mask", completion_mask), ("importance_weights", importance_weights)])
        if bool((stored(importance_weights) < 0).any()):
            raise ValueError("importance_weights: expected weights >= 0")
    return policy_term * _constant(importance_weights)


def _kl_term(kl_estimator, policy_logps, ref_logps, beta):
    """beta * the chosen estimator per token; a plain 0.0 when beta is 0 (x - 0.0 is x, bit for bit, and
    an estimate that would overflow on a far-off token cannot turn into 0 * inf = NaN)."""
    if beta == 0:
        return 0.0
    return beta * kl_estimator(policy_logps, ref_logps, check=False)


@finite_result("policy_logps")
def grpo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=0.2, beta=0.1, reduction="sequence",
    max_new_tokens=None, epsilon_high=None, dual_clip=None, *, kl_estimator=token_kl_penalty, importance_weights=None,
    check=True,
):
    """GRPO token loss of the lesson (MiniMind train_grpo.py; DeepSeekMath, arXiv 2402.03300, eq. 3).

        ratio    = exp(policy_logp - old_logp)                         # (N, R)
        per_tok  = -(min(ratio * A, clip(ratio, 1-eps, 1+eps_high) * A) - beta * kl)
        loss     = reduce_token_loss(per_tok, completion_mask, reduction)

    Args:
        policy_logps: (N, R) float log-probs of the sampled tokens under the current policy (grad).
        old_logps: (N, R) same dtype, cached at sampling time; detached.
        ref_logps: (N, R), the frozen reference; detached.
        advantages: (N,) one per sequence, broadcast over its tokens; detached.
        completion_mask: (N, R) 0/1 (bool, int or float), 1 on valid tokens.
        epsilon: clip half-width in [0, 1). beta: >= 0 weight of the reference KL.
        reduction, max_new_tokens: see `reduce_token_loss` (default: per-sequence mean, then mean).
        epsilon_high, dual_clip: see `clipped_policy_loss` (None: the symmetric range, no dual clip).
        kl_estimator: the per-token KL atom, kl_k3 (the lesson's, default), kl_k1 or kl_k2.
        importance_weights: None, or (N, R) detached per-token weights that multiply the policy term
            (not the KL term), such as `truncated_importance_weights`, as TRL applies them.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(epsilon, epsilon_high, beta); verl: actor.clip_ratio_low / clip_ratio_high /
    clip_ratio_c, kl_loss_coef, kl_loss_type.
    """
    if check:
        _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, kl_estimator)
        epsilon, epsilon_high, dual_clip = _clip_range(epsilon, epsilon_high, dual_clip)
        max_new_tokens = _checked_reduction(completion_mask, reduction, max_new_tokens, policy_logps.shape[1])
    policy_logps, old_logps, ref_logps = _kept_only(completion_mask, policy_logps, old_logps, ref_logps)
    expanded = _constant(advantages).unsqueeze(1).expand_as(policy_logps)  # (N,) -> (N, R): the sequence's A
    policy_term = -clipped_policy_loss(policy_logps, old_logps, expanded, epsilon, epsilon_high, dual_clip, check=False)
    policy_term = _weighted(policy_term, importance_weights, completion_mask, check)
    per_token_loss = -(policy_term - _kl_term(kl_estimator, policy_logps, ref_logps, beta))
    return reduce_token_loss(per_token_loss, completion_mask, reduction, max_new_tokens, check=False)


@finite_result("policy_logps")
def cispo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon_high=5.0, beta=0.1,
    reduction="sequence", max_new_tokens=None, *, kl_estimator=token_kl_penalty, importance_weights=None, check=True,
):
    """CISPO (Clipped IS-weight Policy Optimization) token loss, in the MiniMind lesson's variant
    (train_grpo.py) of MiniMax-M1's objective (arXiv 2506.13585, sec. 3.1).

        ratio    = exp(policy_logp - old_logp)
        weight   = sg(min(ratio, epsilon_high))                         # sg: stop-gradient (detached), capped
        per_tok  = -(weight * A * policy_logp - beta * kl)
        loss     = reduce_token_loss(per_tok, completion_mask, reduction)

    Unlike PPO-Clip, a token whose ratio is capped still passes gradient through policy_logp: the
    cap bounds the weight, it does not drop the token. Its value is a REINFORCE-style weighted
    log-likelihood, not a surrogate of the objective: do not compare it with the GRPO loss value.
    At ratio 1 with nothing capped its gradient equals GRPO's.

    The paper's form is token-level (one mean over all the batch's tokens, DAPO's normalization) with
    no KL term; the per-sequence mean and the KL term (the defaults reduction="sequence", beta=0.1)
    are the lesson's. With reduction="token" and beta=0 the gradient is the paper's. The paper clips
    the weight to [1 - eps_low, 1 + eps_high] with eps_low set large (in effect an upper cap relative to
    1); the absolute cap (default 5.0) is ScaleRL's (Khatri et al., arXiv 2510.13786), as in TRL.

    Args:
        as `grpo_policy_loss`; epsilon_high > 0 is an ABSOLUTE cap on the ratio (not 1 + eps).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(loss_type="cispo", epsilon_high=5.0) (the same absolute cap; left unset it falls
    back to epsilon, 0.2); verl: policy_loss.loss_mode="cispo" clamps the weight to
    [1 - clip_ratio_low, 1 + clip_ratio_high], a relative two-sided range.
    """
    if check:
        _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, kl_estimator)
        epsilon_high = check_real("epsilon_high", epsilon_high, low=0.0, low_open=True)
        max_new_tokens = _checked_reduction(completion_mask, reduction, max_new_tokens, policy_logps.shape[1])
    policy_logps, old_logps, ref_logps = _kept_only(completion_mask, policy_logps, old_logps, ref_logps)
    logratio = policy_logps - old_logps.detach()
    ratio = logratio.clamp(max=exp_limit(logratio.dtype)).exp()  # a huge ratio is capped below anyway
    # detached: the weight scales the score-function gradient but is not differentiated itself
    weight = ratio.clamp(max=epsilon_high).detach()
    policy_term = weight * _constant(advantages).unsqueeze(1) * policy_logps  # (N,) -> (N, 1) -> (N, R)
    policy_term = _weighted(policy_term, importance_weights, completion_mask, check)
    per_token_loss = -(policy_term - _kl_term(kl_estimator, policy_logps, ref_logps, beta))
    return reduce_token_loss(per_token_loss, completion_mask, reduction, max_new_tokens, check=False)


@finite_result("policy_logps")
def sequence_log_ratio(policy_logps, old_logps, completion_mask, *, check=True):
    """GSPO's log of the sequence ratio (arXiv 2507.18071, eq. 7): the mean over each sequence's kept
    tokens of logp - old_logp (count clamped to >= 1). exp() of it is the geometric mean of the token
    ratios, s_i = (pi(y_i) / pi_old(y_i)) ** (1 / |y_i|).

    Args:
        policy_logps: (N, R) float log-probs (nats) of the sampled tokens; gradient flows through it.
        old_logps: (N, R) same dtype, at sampling time; detached.
        completion_mask: (N, R) 0/1 (bool, int or float), 1 on the tokens that count.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N,) log sequence ratios, in the dtype of policy_logps.
    Raises:
        ValueError naming the argument for bad tensors or shapes.
    """
    if check:
        check_matching([("policy_logps", policy_logps), ("old_logps", old_logps)], ndim=2)
        check_tensor("completion_mask", completion_mask, kind="mask", ndim=2)
        check_same_shape([("policy_logps", policy_logps), ("completion_mask", completion_mask)])
    mask = _constant(completion_mask).to(policy_logps.dtype)
    policy_logps, old_logps = _kept_only(completion_mask, policy_logps, old_logps)
    return (policy_logps - old_logps.detach()).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)  # (N, R) -> (N,)


@finite_result("policy_logps")
def gspo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=3e-4, epsilon_high=4e-4, beta=0.0,
    *, kl_estimator=token_kl_penalty, check=True,
):
    """GSPO loss: one clipped ratio per SEQUENCE (Group Sequence Policy Optimization, Zheng et al.,
    arXiv 2507.18071, sec. 4.1, eqs. 5-7).

        s_i   = exp(mean over kept tokens of (logp - old_logp))          # (N,), length-normalized
        loss  = mean_i [ -min(s_i * A_i, clip(s_i, 1 - eps, 1 + eps_high) * A_i)
                         + beta * (mean over kept tokens of the KL estimate) ]

    The sequence is the unit the reward judges, so the whole sequence is clipped or kept together;
    a token's ratio no longer decides alone. Because s_i is a geometric mean, its deviation from 1 is
    far smaller than a token's: hence the tiny default range (3e-4, 4e-4), the paper's.

    Args:
        as `grpo_policy_loss` (no reduction: GSPO averages per sequence, then over sequences).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4,
    epsilon_high=4e-4, beta=0); verl: actor.policy_loss.loss_mode="gspo" with clip_ratio_low /
    clip_ratio_high.
    """
    if check:
        _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, kl_estimator)
        epsilon, epsilon_high, _ = _clip_range(epsilon, epsilon_high, None)
    log_s = sequence_log_ratio(policy_logps, old_logps, completion_mask, check=False)  # (N,)
    advantages = _constant(advantages)
    # the sequence log-ratio plays logp - old_logp in the token-level clipped loss
    per_sequence = clipped_policy_loss(log_s, torch.zeros_like(log_s), advantages, epsilon, epsilon_high, check=False)
    if beta > 0:
        policy_kept, ref_kept = _kept_only(completion_mask, policy_logps, ref_logps)
        kl_per_token = kl_estimator(policy_kept, ref_kept, check=False)
        mask = _constant(completion_mask).to(policy_logps.dtype)
        per_sequence = per_sequence + beta * masked(kl_per_token, mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_sequence.mean()


# Below it the gate is linear in the ratio to 12 digits (sigmoid's curvature at tau * (r - 1) is nil) and
# only its constant 2 / tau grows: 4 / tau is inf at tau = 5e-324, and the gradient NaN.
SAPO_MIN_TAU = 1e-6


@finite_result("policy_logps")
def sapo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, tau_pos=1.0, tau_neg=1.05, beta=0.0,
    reduction="sequence", max_new_tokens=None, *, kl_estimator=token_kl_penalty, importance_weights=None, check=True,
):
    """SAPO token loss: a smooth gate instead of a hard clip (Soft Adaptive Policy Optimization,
    Gao et al., arXiv 2511.20347; defaults tau_pos 1.0, tau_neg 1.05 as the paper's).

        gate(r)  = sigmoid(tau * (r - 1)) * 4 / tau        tau = tau_pos where A > 0, else tau_neg
        per_tok  = -(gate(ratio) * A - beta * kl)
        loss     = reduce_token_loss(per_tok, completion_mask, reduction)

    d gate / d r = 4 * sigmoid'(tau (r - 1)) equals 1 at r = 1, so on-policy the gradient is GRPO's;
    as r leaves 1 the gradient fades smoothly (a bell around r = 1) instead of dropping to 0 at the
    clip edge. tau_neg > tau_pos fades tokens with A < 0 faster: the paper's reason is that a
    negative-advantage update raises the logits of many unsampled tokens, spreading probability over
    the vocabulary, so those gradients should decay sooner.

    Args:
        as `grpo_policy_loss`, with tau_pos, tau_neg in [SAPO_MIN_TAU, 1e6] in place of the clip range.
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(loss_type="sapo", sapo_temperature_pos, sapo_temperature_neg); verl:
    policy_loss.loss_mode="sapo" with actor.tau_pos / actor.tau_neg.
    """
    if check:
        _check_sequence_loss_args(policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, kl_estimator)
        tau_pos = check_real("tau_pos", tau_pos, low=SAPO_MIN_TAU, high=1e6)
        tau_neg = check_real("tau_neg", tau_neg, low=SAPO_MIN_TAU, high=1e6)
        max_new_tokens = _checked_reduction(completion_mask, reduction, max_new_tokens, policy_logps.shape[1])
    policy_logps, old_logps, ref_logps = _kept_only(completion_mask, policy_logps, old_logps, ref_logps)
    logratio = policy_logps - old_logps.detach()
    ratio = logratio.clamp(max=exp_limit(logratio.dtype)).exp()  # the gate saturates long before the clamp
    expanded = _constant(advantages).unsqueeze(1).expand_as(ratio)  # (N,) -> (N, R)
    tau = torch.where(expanded > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    policy_term = _weighted(gate * expanded, importance_weights, completion_mask, check)
    per_token_loss = -(policy_term - _kl_term(kl_estimator, policy_logps, ref_logps, beta))
    return reduce_token_loss(per_token_loss, completion_mask, reduction, max_new_tokens, check=False)


# --- second-wave policy losses: DPPO, GMPO, Clip-Cov, KL-Cov, DRO, GPG, TOPR, CE-GPPO, VESPO, LUSPO


@dataclasses.dataclass
class _TokenLossInputs:
    """The checked, prepared inputs of a token policy loss: every masked position already holds 0 (before
    any exp, so that a filler such as -1e9 neither overflows nor sends NaN through a where()), and every
    input but policy_logps detached. The shapes: N sequences, R response positions."""

    policy: torch.Tensor  # (N, R) log-probs, gradient flows; 0 where masked
    old: torch.Tensor | None  # (N, R) detached, 0 where masked (None for a loss without the old policy)
    ref: torch.Tensor  # (N, R) detached, 0 where masked
    advantages: torch.Tensor  # (N, 1) detached: broadcasts over each sequence's tokens
    mask: torch.Tensor  # (N, R) 0/1 in the policy's dtype, detached
    completion_mask: torch.Tensor  # as given, for reduce_token_loss
    beta: float
    reduction: str | None
    max_new_tokens: int | None
    kl_estimator: object
    importance_weights: torch.Tensor | None  # (N, R), or None; `_weighted` detaches them

    def logratio(self):
        """l = logp - old, (N, R); 0 where masked."""
        return self.policy - self.old

    def ratio(self):
        """r = exp(l), (N, R); l clamped at exp_limit (about 709 nats in float64) so that r never overflows."""
        logratio = self.logratio()
        return logratio.clamp(max=exp_limit(logratio.dtype)).exp()

    def sequence_mean(self, per_token):
        """(N, R) -> (N,): the mean over each sequence's kept tokens, sum_t m x / max(sum_t m, 1)."""
        return masked(per_token, self.mask).sum(dim=1) / self.mask.sum(dim=1).clamp(min=1.0)

    def kl(self):
        """beta * kl_estimator per token, (N, R); zeros when beta is 0 (a far-off estimate is never computed)."""
        if self.beta == 0:
            return torch.zeros_like(self.policy)
        return self.beta * self.kl_estimator(self.policy, self.ref, check=False)

    def reduce(self, per_token_loss):
        """The tail every token loss shares: loss * importance weight + beta * kl per token (the weight is
        not on the KL), reduced by `reduce_token_loss`."""
        per_token_loss = _weighted(per_token_loss, self.importance_weights, self.completion_mask, False)
        per_token_loss = per_token_loss + _kl_term(self.kl_estimator, self.policy, self.ref, self.beta)
        return reduce_token_loss(per_token_loss, self.completion_mask, self.reduction, self.max_new_tokens, check=False)


def _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta=0.0,
                       reduction=None, max_new_tokens=None, kl_estimator=kl_k3, importance_weights=None,
                       ordered=(), requires=(), **scalars):
    """Check a token loss's arguments once (with check) and prepare them: a `_TokenLossInputs`. old_logps is
    None for a loss without the old policy (GPG); reduction None for a loss with its own reduction; scalars,
    ordered and requires as `_check_args`."""
    if check:
        logps = [(name, value) for name, value in (("policy_logps", policy_logps), ("old_logps", old_logps),
                                                   ("ref_logps", ref_logps)) if value is not None]
        _check_args(tensors=logps, ndim=2, mask=("completion_mask", completion_mask),
                    vectors=[("advantages", advantages, 0)], reduction=reduction, max_new_tokens=max_new_tokens,
                    ordered=ordered, requires=requires, beta=(beta, _NONNEGATIVE), **scalars)
        if kl_estimator not in KL_ESTIMATORS.values():
            raise ValueError(f"kl_estimator: expected one of the atoms kl_k1, kl_k2, kl_k3, got {kl_estimator!r}")
        if importance_weights is not None:
            _check_args(tensors=[("importance_weights", importance_weights)], ndim=2, requires=[
                ("importance_weights", f"expected the shape of completion_mask {tuple(completion_mask.shape)}",
                 lambda: importance_weights.shape == completion_mask.shape),
                ("importance_weights", "expected weights >= 0", lambda: bool((stored(importance_weights) >= 0).all()))])
    mask = _constant(completion_mask).to(policy_logps.dtype)
    constant = [None if value is None else _constant(value) for value in (old_logps, ref_logps)]
    policy, old, ref = [None if value is None else masked(value, mask) for value in [policy_logps] + constant]
    return _TokenLossInputs(policy, old, ref, _constant(advantages).unsqueeze(1), mask, completion_mask, beta,
                            reduction, max_new_tokens, kl_estimator, importance_weights)


DPPO_KINDS = ("tv", "kl")
DPPO_KL_EPSILON = 1e-8  # verl's: keeps log((1 - q) / (1 - p)) finite where a probability is 1


@finite_result("policy_logps")
def dppo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, kind="tv", delta=0.2, delta_high=None, cap=3.0,
    beta=0.0, reduction="token", max_new_tokens=None, *, kl_estimator=kl_k3, importance_weights=None, check=True,
):
    """DPPO token loss: a trust region on the token's PROBABILITY, not on its ratio (Qi et al., Rethinking the
    Trust Region in LLM Reinforcement Learning, arXiv 2602.04879, the binary TV and KL variants).

        p = exp(logp), q = exp(old)                     the sampled token's probability now and at sampling
        tv: keep = (p - q <= delta_high)   if A > 0     else (p - q >= -delta)
        kl: D = q (old - logp) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))      binary KL(q || p)
            keep = (D <= delta_high or p <= q)  if A > 0   else (D <= delta or p >= q)
        per_tok = -A * sg(min(r, cap)) * logp * keep    (keep detached; r = exp(logp - old))

    A ratio clip treats a rare token (q = 0.001 -> 0.003, ratio 3) as a large move and a frequent one
    (q = 0.99 -> 0.8, ratio 0.81) as a small one; in probability mass it is the other way round. DPPO
    drops a token's gradient only once its probability has moved too far in the direction its
    advantage pushes, measured in total variation (|p - q|) or in the binary KL of the token's
    Bernoulli (taken, not taken). The kept tokens get a capped-ratio, CISPO-like gradient.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        kind: "tv" or "kl". delta: > 0, the bound for A <= 0. delta_high: > 0, for A > 0 (None: delta).
        cap: > 0, the cap on the detached ratio that weighs the gradient.
        beta, reduction (default "token"), max_new_tokens, kl_estimator, importance_weights: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    verl: actor.policy_loss.loss_mode="dppo_tv" / "dppo_kl", delta and delta_high from clip_ratio_low /
    clip_ratio_high, cap from clip_ratio_c (ActorConfig's 3.0; the loss code falls back to 20 only when it
    is unset). The authors cap at 10 and take the ratio to the rollout engine's log-probs. TRL: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights, kind=(kind, DPPO_KINDS),
                           delta=(delta, _POSITIVE), delta_high=(delta_high, {**_POSITIVE, "none": True}),
                           cap=(cap, _POSITIVE))
    delta_high = delta if delta_high is None else delta_high
    logp = x.policy.detach()
    p, q = logp.exp(), x.old.exp()  # (N, R): masked positions hold logp = old = 0, so p = q = 1 and D = 0
    if kind == "tv":
        rose_too_far, fell_too_far = p - q > delta_high, p - q < -delta
    else:
        divergence = q * (x.old - logp) + (1 - q) * torch.log((1 - q + DPPO_KL_EPSILON) / (1 - p + DPPO_KL_EPSILON))
        rose_too_far, fell_too_far = (divergence > delta_high) & (p > q), (divergence > delta) & (p < q)
    keep = torch.where(x.advantages > 0, ~rose_too_far, ~fell_too_far).to(logp.dtype)  # (N, R), detached
    weight = x.ratio().detach().clamp(max=cap)  # detached: it scales the gradient of logp, as CISPO's weight
    return x.reduce(-x.advantages * weight * x.policy * keep)


@finite_result("policy_logps")
def gmpo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=0.4, epsilon_high=None, beta=0.0,
    *, kl_estimator=kl_k3, check=True,
):
    """GMPO loss: the GEOMETRIC mean of the token ratios, each clipped in log space, one term per sequence
    (Zhao et al., Geometric-Mean Policy Optimization, arXiv 2507.20673).

        sigma   = sign(A_i);  l = logp - old
        l~      = sigma * min(sigma * l, sigma * clamp(l, -epsilon, epsilon_high))   PPO's pessimism, in logs
        s_i     = exp(sum_t m l~ / n_i)                                             n_i = max(sum_t m, 1)
        loss    = mean_i [ -A_i s_i + beta * sum_t m kl / n_i ]

    GRPO averages token ratios arithmetically, so one token whose ratio explodes dominates its sequence;
    the geometric mean is the exponential of the mean log-ratio, far less sensitive to an outlier, which
    lets the clip range grow (epsilon is in log space: 0.4 allows ratios in [e^-0.4, e^0.4]).

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        epsilon: > 0, the lower log-space clip. epsilon_high: > 0 (None: epsilon).
        beta, kl_estimator: as `grpo_policy_loss` (the KL term is a per-sequence token mean).
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars, or a loss the dtype cannot hold
        (A < 0 with a mean log-ratio beyond about 709 nats: that side of the clip is unbounded).
    verl: actor.policy_loss.loss_mode="geo_mean" (its clip defaults to clip_ratio 0.2; it adds 1e-8 to the
    token counts). TRL: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta,
                           kl_estimator=kl_estimator, epsilon=(epsilon, _POSITIVE),
                           epsilon_high=(epsilon_high, {**_POSITIVE, "none": True}))
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    logratio = x.logratio()
    sign = torch.sign(x.advantages)  # (N, 1)
    pessimistic = sign * torch.minimum(sign * logratio, sign * logratio.clamp(-epsilon, epsilon_high))  # (N, R)
    sequence_ratio = x.sequence_mean(pessimistic).exp()  # (N,)
    per_sequence = -x.advantages.squeeze(1) * sequence_ratio + x.sequence_mean(x.kl())
    return per_sequence.mean()


def _kept_covariance(x):
    """(N, R) detached centred covariance cov = (A - mean A) * (logp - mean logp), both means over kept
    tokens (Clip-Cov's and KL-Cov's token score), 0 at masked positions."""
    count = x.mask.sum().clamp(min=1.0)
    advantages = x.advantages.expand_as(x.policy)  # (N, 1) -> (N, R)
    logp = x.policy.detach()
    mean_advantage, mean_logp = (advantages * x.mask).sum() / count, (logp * x.mask).sum() / count
    return masked((advantages - mean_advantage) * (logp - mean_logp), x.mask)


def _covariance_count(fraction, mask):
    """k = max(1, floor(fraction * number of kept tokens)), as verl's int(ratio * count)."""
    return max(1, int(fraction * float(mask.sum())))


@finite_result("policy_logps")
def clip_cov_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=0.2, epsilon_high=None, fraction=2e-4,
    cov_low=1.0, cov_high=5.0, beta=0.0, reduction="token", max_new_tokens=None, *, kl_estimator=kl_k3,
    importance_weights=None, check=True, generator=None,
):
    """Clip-Cov token loss: PPO-Clip, plus a few random high-covariance tokens whose gradient is cut (Cui et
    al., The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models, arXiv 2505.22617).

        ppo     = max(-A r, -A clip(r, 1 - eps, 1 + eps_high))          as `clipped_policy_loss`
        cov     = (A - mean A) (logp - mean logp)                         means over kept tokens, detached
        cand    = kept and not clipped (not -A clip(r) > -A r) and cov_low < cov < cov_high   (row-major)
        k       = max(1, floor(fraction * #kept))
        per_tok = ppo, but 0 on cand[randperm(#cand, generator)[:k]]    (no draw when there is no candidate)

    The paper shows the entropy falls at a rate set by the covariance of a token's log-prob and its
    advantage: confident tokens with a high advantage collapse the entropy. Removing the gradient of a
    small random share of exactly those tokens slows the collapse while leaving the rest of PPO intact.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        epsilon, epsilon_high: the clip range, as `clipped_policy_loss`.
        fraction: in (0, 1], the share of kept tokens cut. cov_low < cov_high: the covariance window.
        beta, reduction (default "token"), max_new_tokens, kl_estimator, importance_weights: as `grpo_policy_loss`.
        generator: the torch.Generator of the draw (None: the global one, as verl).
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    verl: actor.policy_loss.loss_mode="clip_cov" with policy_loss.clip_cov_ratio / clip_cov_lb /
    clip_cov_ub (verl draws from the global RNG). TRL: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights, ordered=[("cov_low", "cov_high", True)],
                           epsilon=(epsilon, _CLIP_WIDTH), epsilon_high=(epsilon_high, _CLIP_HIGH),
                           fraction=(fraction, _FRACTION), cov_low=(cov_low, _REAL), cov_high=(cov_high, _REAL),
                           generator=(generator, torch.Generator))
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    advantages = x.advantages.expand_as(x.policy)  # (N, 1) -> (N, R)
    ppo = clipped_policy_loss(x.policy, x.old, advantages, epsilon, epsilon_high, check=False)
    ratio = x.ratio().detach()
    clipped = -advantages * ratio.clamp(1.0 - epsilon, 1.0 + epsilon_high) > -advantages * ratio
    cov = _kept_covariance(x)
    candidates = (x.mask > 0) & ~clipped & (cov > cov_low) & (cov < cov_high)  # (N, R)
    where = candidates.flatten().nonzero().squeeze(1)  # row-major positions of the candidates
    cut = torch.ones_like(ppo).flatten()
    if where.numel() > 0:
        chosen = torch.randperm(where.numel(), generator=generator)[:_covariance_count(fraction, x.mask)]
        cut[where[chosen]] = 0.0
    return x.reduce(ppo * cut.reshape(ppo.shape))  # (N*R,) -> (N, R)


@finite_result("policy_logps")
def kl_cov_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, fraction=2e-4, coef=0.1, beta=0.0,
    reduction="token", max_new_tokens=None, *, kl_estimator=kl_k3, importance_weights=None, check=True,
):
    """KL-Cov token loss: the unclipped policy-gradient surrogate, plus a |log-ratio| penalty on the tokens
    of largest covariance (Cui et al., arXiv 2505.22617, KL-Cov).

        cov     = (A - mean A) (logp - mean logp)         means over kept tokens, detached
        top     = the k kept tokens of largest cov        k = max(1, floor(fraction * #kept))
        per_tok = -A r + coef * |logp - old|  on top,   -A r  elsewhere       (no clip at all)

    Like Clip-Cov it targets the few tokens that collapse the entropy, but instead of cutting their
    gradient it pulls them back toward the old policy, deterministically. Ties in cov go to the first
    in row-major order (a stable sort), so the choice is reproducible.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        fraction: in (0, 1]. coef: >= 0, the weight of the |log-ratio| penalty.
        beta, reduction (default "token"), max_new_tokens, kl_estimator, importance_weights: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    verl: actor.policy_loss.loss_mode="kl_cov" with policy_loss.kl_cov_ratio and ppo_kl_coef (0.1 in its
    config; the code's 1.0 applies only when it is unset; verl's topk breaks ties its own way). TRL: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights, fraction=(fraction, _FRACTION),
                           coef=(coef, _NONNEGATIVE))
    cov = _kept_covariance(x).flatten()
    kept = (x.mask > 0).flatten().nonzero().squeeze(1)  # row-major positions of the kept tokens
    order = torch.sort(cov[kept], descending=True, stable=True).indices[:_covariance_count(fraction, x.mask)]
    top = torch.zeros_like(cov)
    top[kept[order]] = 1.0
    logratio = x.logratio()
    return x.reduce(-x.advantages * x.ratio() + coef * logratio.abs() * top.reshape(logratio.shape))


@finite_result("policy_logps")
def dro_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, tau, beta=0.0, reduction="token",
    max_new_tokens=None, *, kl_estimator=kl_k3, importance_weights=None, check=True,
):
    """DRO token loss: the policy gradient plus a squared log-ratio that anchors the policy to pi_old
    (Richemond et al., Offline Regularised Reinforcement Learning for Large Language Models Alignment,
    arXiv 2405.19107, with pi_old in the reference's place, as verl).

        per_tok = -(A * logp - tau / 2 * (logp - old) ** 2)

    The square is a soft trust region: its gradient tau * (logp - old) grows with the distance from the
    old policy, instead of dropping to zero at a clip edge. At logp = old the gradient is REINFORCE's.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        tau: > 0, required (no default): the strength of the anchor.
        beta, reduction (default "token"), max_new_tokens, kl_estimator, importance_weights: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    verl: actor.policy_loss.loss_mode="dro" with dro_beta = tau. TRL: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights, tau=(tau, _POSITIVE))
    return x.reduce(-(x.advantages * x.policy - tau / 2.0 * x.logratio().square()))


@finite_result("policy_logps")
def gpg_policy_loss(
    policy_logps, ref_logps, advantages, completion_mask, beta=0.0, reduction="token", max_new_tokens=None, *,
    kl_estimator=kl_k3, importance_weights=None, check=True,
):
    """GPG token loss: plain REINFORCE, no ratio, no clip, no old policy (Chu et al., GPG: A Simple and
    Strong Reinforcement Learning Baseline for Model Reasoning, arXiv 2504.02546).

        per_tok = -A * logp

    One gradient step per batch makes pi_old the current policy, so the ratio is 1 and the clip never
    binds: GPG drops both and keeps the score-function gradient alone. Pair it with `gpg_advantages`.

    Args:
        policy_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss` (no old_logps).
        beta, reduction (default "token"), max_new_tokens, kl_estimator, importance_weights: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    verl: actor.policy_loss.loss_mode="gpg". TRL: none.
    """
    x = _token_loss_inputs(check, policy_logps, None, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights)
    return x.reduce(-x.advantages * x.policy)


@finite_result("policy_logps")
def topr_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, beta=0.0, reduction="constant",
    max_new_tokens=None, *, kl_estimator=kl_k3, importance_weights=None, check=True,
):
    """TOPR token loss: REINFORCE on the good sequences, a truncated importance weight on the bad ones only
    (Le Roux et al., Tapered Off-Policy REINFORCE, arXiv 2503.14286, the gradient of J_TOPR).

        w_i     = 1                                   if A_i >= 0
                = min(exp(sum_t m (logp - old)), 1)   if A_i < 0     (the sequence ratio, detached)
        per_tok = -w_i * A_i * logp

    A sequence with A >= 0 is pushed up at full strength whatever policy sampled it (supervised
    fine-tuning on the good samples); one with A < 0 is pushed down only as far as the current policy
    still produces it, so pushing an already unlikely bad answer further down cannot blow up.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        beta, reduction (default "constant": the paper sums over tokens and averages over sequences,
        which is R times the "constant" reduction), max_new_tokens, kl_estimator, importance_weights: as
        `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    Libraries: none in TRL or verl (ROLL has a TOPR loss with token ratios and the reward's sign in
    place of the advantage's).
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights)
    sequence_logratio = x.logratio().detach().sum(dim=1, keepdim=True)  # (N, R) -> (N, 1)
    weight = torch.where(x.advantages >= 0, torch.ones_like(sequence_logratio), sequence_logratio.clamp(max=0.0).exp())
    return x.reduce(-weight * x.advantages * x.policy)


@finite_result("policy_logps")
def cegppo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=0.2, epsilon_high=None, beta1=0.75,
    beta2=1.0, dual_clip=None, beta=0.0, reduction="token", max_new_tokens=None, *, kl_estimator=kl_k3,
    importance_weights=None, check=True,
):
    """CE-GPPO token loss: PPO-Clip whose clipped tokens keep a scaled gradient instead of none (Su et al.,
    CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in Reinforcement
    Learning, arXiv 2509.20712).

        u = r / sg(r)                                     value 1, gradient that of r
        per_tok = -beta1 * (1 - eps) * u * A        if r < 1 - eps and A < 0
                = -beta2 * (1 + eps_high) * u * A   if r > 1 + eps_high and A > 0
                = -r * A                            otherwise
        dual_clip c: per_tok = min(per_tok, -c A) where A < 0

    The value is PPO-Clip's times beta on the clipped branches; the gradient there is beta times the
    clip edge's, where PPO gives 0. beta1 < 1 lets clipped low-probability, negative-advantage tokens
    still raise the entropy a little; beta2 lets clipped positive ones still be learnt from.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        epsilon, epsilon_high, dual_clip: as `clipped_policy_loss`. beta1, beta2: >= 0.
        beta, reduction (default "token"), max_new_tokens, kl_estimator, importance_weights: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    Libraries: none in TRL or verl; the authors' verl fork, loss_func="gppo_general" (7B: beta1 0.75,
    beta2 1; it always dual-clips, c = 3, its recipe sets 10).
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, importance_weights, epsilon=(epsilon, _CLIP_WIDTH),
                           epsilon_high=(epsilon_high, _CLIP_HIGH), beta1=(beta1, _NONNEGATIVE),
                           beta2=(beta2, _NONNEGATIVE),
                           dual_clip=(dual_clip, {"low": 1.0, "high": 1e12, "low_open": True, "none": True}))
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    logratio, ratio, advantages = x.logratio(), x.ratio(), x.advantages
    unit = (logratio - logratio.detach()).exp()  # r / sg(r): exactly 1, with the gradient of r
    low = (ratio.detach() < 1.0 - epsilon) & (advantages < 0)
    high = (ratio.detach() > 1.0 + epsilon_high) & (advantages > 0)
    loss = torch.where(low, -beta1 * (1.0 - epsilon) * unit * advantages,
                       torch.where(high, -beta2 * (1.0 + epsilon_high) * unit * advantages, -ratio * advantages))
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    return x.reduce(loss)


VESPO_LOG_RATIO_CLAMP = 20.0  # TRL's: each token's log-ratio, and the sequence's log-weight from above
VESPO_MIN_WEIGHT = 1e-8  # TRL's floor of the sequence weight w
VESPO_MIN_LAMBDA = 1e-4  # TRL's floor of lambda


@finite_result("policy_logps")
def vespo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
    lambda_neg=2.0, beta=0.0, reduction="token", max_new_tokens=None, *, kl_estimator=kl_k3, check=True,
):
    """VESPO token loss: REINFORCE weighted by a smooth function of the SEQUENCE ratio (Shen et al., VESPO:
    Variational Sequence-Level Soft Policy Optimization for Off-Policy LLM Training, arXiv 2602.10693,
    eq. 20).

        log w   = clamp(sum_t m clamp(logp - old, -20, 20), log 1e-8, 20)      the sequence's log-ratio
        phi     = exp(lambda + k log w - lambda w) = w**k exp(lambda (1 - w))  (k, lambda) by sign of A
        per_tok = -sg(phi) * A * logp                                           (nan or inf phi -> 0)

    phi(1) = 1, so on-policy the gradient is REINFORCE's; phi peaks at w = k / lambda and falls to 0 both
    for w -> 0 and w -> inf: a soft trust region on the whole sequence's ratio, with no length
    normalization. The weight replaces the importance weight, so the loss takes no importance_weights.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        k_pos, lambda_pos: >= 0, the shape where A >= 0; k_neg, lambda_neg: >= 0, where A < 0 (lambda is
        used as max(lambda, 1e-4)).
        beta, reduction (default "token"), max_new_tokens, kl_estimator: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(loss_type="vespo", vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg).
    verl: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta, reduction,
                           max_new_tokens, kl_estimator, k_pos=(k_pos, _NONNEGATIVE),
                           lambda_pos=(lambda_pos, _NONNEGATIVE), k_neg=(k_neg, _NONNEGATIVE),
                           lambda_neg=(lambda_neg, _NONNEGATIVE))
    limit = VESPO_LOG_RATIO_CLAMP
    log_w = x.logratio().detach().clamp(-limit, limit).sum(dim=1, keepdim=True)  # (N, R) -> (N, 1)
    log_w = log_w.clamp(math.log(VESPO_MIN_WEIGHT), limit)
    positive = x.advantages >= 0  # (N, 1)
    k = torch.where(positive, torch.full_like(log_w, k_pos), torch.full_like(log_w, k_neg))
    lam = torch.where(positive, torch.full_like(log_w, max(lambda_pos, VESPO_MIN_LAMBDA)),
                      torch.full_like(log_w, max(lambda_neg, VESPO_MIN_LAMBDA)))
    phi = torch.nan_to_num((lam + k * log_w - lam * log_w.exp()).exp(), nan=0.0, posinf=0.0, neginf=0.0)
    return x.reduce(-phi * x.advantages * x.policy)


@finite_result("policy_logps")
def luspo_policy_loss(
    policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon=3e-4, epsilon_high=4e-4, beta=0.0,
    *, kl_estimator=kl_k3, check=True,
):
    """LUSPO loss: GSPO with each sequence's term scaled by its LENGTH (Liu et al., Length-Unbiased Sequence
    Policy Optimization: Revealing and Controlling Response Length Variation in RLVR, arXiv 2602.05261).

        s_i   = exp(sum_t m (logp - old) / n_i)                              GSPO's sequence ratio
        loss  = mean_i [ L_i * -min(s_i A_i, clip(s_i, 1 - eps, 1 + eps_high) A_i) + beta * sum_t m kl ]

    GSPO's per-sequence mean gives every response the same weight, so the gradient per token of a long
    response is smaller and the policy drifts toward short answers. Multiplying by L_i = sum_t m gives
    every token the same weight again; the KL term is likewise a sum over the tokens.

    Args:
        policy_logps, old_logps, ref_logps, advantages, completion_mask: as `grpo_policy_loss`.
        epsilon, epsilon_high: the clip range on s_i, as `gspo_policy_loss` (GSPO's tiny defaults).
        beta, kl_estimator: as `grpo_policy_loss`.
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar loss to minimize.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(loss_type="luspo", importance_sampling_level="sequence") (TRL's epsilon defaults to
    0.2; the defaults here are GSPO's). verl: none.
    """
    x = _token_loss_inputs(check, policy_logps, old_logps, ref_logps, advantages, completion_mask, beta,
                           kl_estimator=kl_estimator, epsilon=(epsilon, _CLIP_WIDTH),
                           epsilon_high=(epsilon_high, _CLIP_HIGH))
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    log_s = x.sequence_mean(x.logratio())  # (N,)
    per_sequence = clipped_policy_loss(log_s, torch.zeros_like(log_s), x.advantages.squeeze(1), epsilon, epsilon_high,
                                       check=False)
    lengths = x.mask.sum(dim=1)  # (N,) L_i
    return (lengths * per_sequence + masked(x.kl(), x.mask).sum(dim=1)).mean()


# --- corrections and shaping: importance weights, off-policy masks, the overlong penalty ----


@finite_result("old_logps")
def truncated_importance_weights(old_logps, rollout_logps, cap=2.0, *, check=True):
    """Truncated importance sampling weights for a sampler whose probabilities differ from the
    trainer's (IMPALA's truncated weights, Espeholt et al., arXiv 1802.01561, sec. 4.1; applied to
    rollout engines by Yao et al., 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
    RL Training").

        w = min(exp(old_logp - rollout_logp), cap)        detached

    The tokens were drawn from the rollout distribution (say another temperature or top-p), but the
    loss treats them as drawn from the trainer's old policy: multiplying each token's loss by w
    corrects the expectation back to the old policy; the cap bounds the variance a rare token could
    add (the price is a small bias where the cap binds).
    Args:
        old_logps: (...) float, the trainer's log-probs of the sampled tokens (before any update).
        rollout_logps: same shape and dtype, the sampler's log-probs of the same tokens.
        cap: >= 1.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) weights in [0, cap], without grad; exactly 1 where the two log-probs agree.
    Raises:
        ValueError naming the argument for bad tensors or a cap below 1.
    TRL: GRPOConfig(vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=
    "token_truncate", vllm_importance_sampling_clip_max=cap); verl: algorithm.rollout_correction
    .rollout_is="token", rollout_is_threshold=cap.
    """
    if check:
        check_matching([("old_logps", old_logps), ("rollout_logps", rollout_logps)])
        cap = check_real("cap", cap, low=1.0, high=1e12)
    log_weights = (old_logps - rollout_logps).detach()
    return log_weights.clamp(max=exp_limit(log_weights.dtype)).exp().clamp(max=cap)


@finite_result("lengths")
def overlong_penalty(lengths, max_new_tokens, cache, *, check=True):
    """DAPO's soft overlong punishment, added to the reward (arXiv 2503.14476, sec. 3.4, eq. 13).

        0                                  if L <= max_new_tokens - cache
        ((max_new_tokens - cache) - L) / cache   if max_new_tokens - cache < L <= max_new_tokens
        -1                                 if L > max_new_tokens

    A response that runs into the last `cache` tokens before the cap loses reward linearly, so the
    policy learns to stop before it is cut, without the noise of punishing a right but long answer
    at full strength.
    Args:
        lengths: (N,) integer tensor of response lengths in tokens (>= 0).
        max_new_tokens: int >= 1, the length cap. cache: int in [1, max_new_tokens].
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N,) float64 penalties in [-1, 0].
    Raises:
        ValueError naming the argument for a bad tensor, negative lengths or a cache out of range.
    TRL: the reward function trl.rewards.get_soft_overlong_punishment(max_completion_len,
    soft_punish_cache); verl: reward.reward_kwargs.overlong_buffer_cfg (enable, len, penalty_factor).
    """
    if check:
        check_tensor("lengths", lengths, kind="int", ndim=1)
        max_new_tokens = check_int("max_new_tokens", max_new_tokens, low=1, high=2**31 - 1)
        cache = check_int("cache", cache, low=1, high=max_new_tokens)
        if bool((stored(lengths) < 0).any()):
            raise ValueError("lengths: expected lengths >= 0")
    lengths = lengths.long().to(DTYPE)
    start = float(max_new_tokens - cache)
    ramp = (start - lengths) / cache
    penalty = torch.where(lengths <= start, torch.zeros_like(lengths), ramp)
    return torch.where(lengths > max_new_tokens, torch.full_like(lengths, -1.0), penalty)


ROLLOUT_LEVELS = ("token", "sequence")
ROLLOUT_MODES = ("truncate", "mask")
_WEIGHT_BOUND = {"low": 0.0, "high": 1e12, "low_open": True, "none": True}


@finite_result("old_logps")
def rollout_correction_weights(old_logps, rollout_logps, completion_mask, level="token", mode="truncate", low=None,
                               high=2.0, *, check=True):
    """Importance weights from the rollout engine's distribution to the trainer's old policy, per token or
    per sequence, truncated or masked (the general form of `truncated_importance_weights`; Yao et al., 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"; IcePop, Ling team, 2025).

        d       = old - rollout                                on kept tokens (0 at padding)
        token:    w = exp(d)            sequence: w_i = exp(sum_t d) on each of its tokens
        truncate: w = clamp(w, low, high)                      (None: that side open; capped = high exactly)
        mask:     w if low <= w <= high else 0                 (both bounds: IcePop's two-sided mask)

    Truncating keeps every token with a bounded weight (a little bias, bounded variance); masking drops
    the tokens or sequences whose mismatch is too large altogether (no bias from a clipped weight, but
    they teach nothing). A sequence weight is a product of token ratios: it catches a mismatch spread
    thinly over many tokens, which a token weight misses.

    Args:
        old_logps: (N, R) float, the trainer's log-probs of the sampled tokens; detached.
        rollout_logps: (N, R) same dtype, the sampler's log-probs of the same tokens; detached.
        completion_mask: (N, R) 0/1, 1 on the tokens that count.
        level: "token" or "sequence". mode: "truncate" or "mask" (mask needs low, high or both).
        low, high: > 0 (up to 1e12), low <= high, or None for an open side.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N, R) weights >= 0 without grad, 0 at padding; exactly 1 where the two log-probs agree (and 1 lies
        within the bounds).
    Raises:
        ValueError naming the argument for bad tensors, an unknown level or mode, bad bounds, or mode
        "mask" without a bound.
    verl: algorithm.rollout_correction.rollout_is="token" | "sequence" with rollout_is_threshold (2.0)
    or its "low_high" form, and rollout_rs for the mask (verl clamps the log-ratio at +-20 before exp).
    TRL: GRPOConfig(vllm_importance_sampling_mode="{level}_{mode}", vllm_importance_sampling_clip_min /
    vllm_importance_sampling_clip_max) (its default "sequence_mask", max 3.0).
    """
    if check:
        _check_args(tensors=[("old_logps", old_logps), ("rollout_logps", rollout_logps)], ndim=2,
                    mask=("completion_mask", completion_mask), level=(level, ROLLOUT_LEVELS),
                    mode=(mode, ROLLOUT_MODES), low=(low, _WEIGHT_BOUND), high=(high, _WEIGHT_BOUND),
                    ordered=[("low", "high", False)],
                    requires=[("high", "mode 'mask' needs a bound: low, high or both",
                               lambda: mode != "mask" or low is not None or high is not None)])
    kept = _constant(completion_mask).bool()
    log_weights = masked(_constant(old_logps) - _constant(rollout_logps), kept)  # (N, R)
    if level == "sequence":
        log_weights = log_weights.sum(dim=1, keepdim=True).expand_as(log_weights)  # (N, 1) -> (N, R)
    if high is not None:  # above the limit the weight is capped or masked anyway
        log_weights = log_weights.clamp(max=exp_limit(log_weights.dtype))
    weights = log_weights.exp()
    if mode == "truncate":
        weights = weights.clamp(min=low, max=high)
    else:
        inside = torch.ones_like(kept)
        if low is not None:
            inside = inside & (weights >= low)
        if high is not None:
            inside = inside & (weights <= high)
        weights = masked(weights, inside)
    return masked(weights, kept)


def off_policy_sequence_mask(policy_logps, sampling_logps, advantages, completion_mask, threshold, *, check=True):
    """DeepSeek-V3.2's off-policy sequence mask: drop a NEGATIVE-advantage sequence whose policy has drifted
    too far from the one that sampled it (DeepSeek-AI, DeepSeek-V3.2, arXiv 2512.02556, eq. 9).

        keep_i = A_i >= 0  or  sum_t m (sampling - policy) / n_i <= threshold      n_i = max(sum_t m, 1)

    The mean log-ratio of the sampler over the policy is a per-token KL estimate on the samples. A bad
    sequence the current policy no longer produces teaches little and, pushed down further, can
    destabilize training; a good one is always kept.

    Args:
        policy_logps: (N, R) float, the current (or old) policy's log-probs of the sampled tokens.
        sampling_logps: (N, R) same dtype, the sampler's log-probs. advantages: (N,).
        completion_mask: (N, R) 0/1. threshold: >= 0, required (no default).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N,) bool, without grad: True for the sequences to keep.
    Raises:
        ValueError naming the argument for bad tensors, shapes or a threshold that is not >= 0.
    TRL: GRPOConfig(off_policy_mask_threshold). verl: none.
    """
    if check:
        _check_args(tensors=[("policy_logps", policy_logps), ("sampling_logps", sampling_logps)], ndim=2,
                    mask=("completion_mask", completion_mask), vectors=[("advantages", advantages, 0)],
                    threshold=(threshold, _NONNEGATIVE))
    mask = _constant(completion_mask).to(policy_logps.dtype)
    gap = masked(_constant(sampling_logps) - _constant(policy_logps), mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return (_constant(advantages) >= 0) | (gap <= threshold)


def m2po_mask(policy_logps, behavior_logps, completion_mask, threshold=0.04, *, check=True):
    """M2PO's token mask: drop the fewest tokens of largest squared log-ratio that bring the batch's second
    moment below a threshold (Zheng, Zhao and Chen, Prosperity before Collapse: How Far Can Off-Policy RL
    Reach with Stale Data on LLMs?, arXiv 2510.01161, eqs. 4-5).

        M2   = (policy - behavior)**2 on kept tokens, sorted from the largest (a stable sort)
        drop = the shortest prefix whose removal leaves mean(M2 of the rest) < threshold
               (when none does, keep only the smallest)

    With stale data the token ratios spread out; clipping each ratio (PPO) throws away the rare,
    informative tokens whose ratio is high. Bounding the second moment of the log-ratios instead masks
    only the few outliers that make the batch's update unstable.

    Args:
        policy_logps: (N, R) float, the current policy's log-probs. behavior_logps: (N, R), the stale
            policy's that sampled the tokens. completion_mask: (N, R) 0/1.
        threshold: > 0, the bound on the mean of M2 (the paper's tau, 0.04).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N, R) bool, without grad: True on the kept tokens that stay, a subset of the mask.
    Raises:
        ValueError naming the argument for bad tensors, shapes or threshold <= 0.
    AReaL: actor.m2_threshold. TRL, verl: none.
    """
    if check:
        _check_args(tensors=[("policy_logps", policy_logps), ("behavior_logps", behavior_logps)], ndim=2,
                    mask=("completion_mask", completion_mask), threshold=(threshold, _POSITIVE))
    kept = _constant(completion_mask).bool()
    positions = kept.flatten().nonzero().squeeze(1)  # row-major positions of the kept tokens
    result = torch.zeros_like(kept).flatten()
    if positions.numel() == 0:
        return result.reshape(kept.shape)
    second_moment = (_constant(policy_logps) - _constant(behavior_logps)).square().flatten()[positions]
    order = torch.sort(second_moment, descending=True, stable=True).indices
    ranked = second_moment[order]
    count = ranked.numel()
    # rest_mean[j]: the mean after dropping the j largest, j = 0 .. count - 1
    rest_mean = ranked.flip(0).cumsum(0).flip(0) / torch.arange(count, 0, -1, dtype=ranked.dtype)
    below = (rest_mean < threshold).nonzero()
    dropped = int(below[0]) if below.numel() > 0 else count - 1
    result[positions[order[dropped:]]] = True
    return result.reshape(kept.shape)  # (N*R,) -> (N, R)


# --- entropy: the token entropy, its bonus, its adaptive coefficient, the high-entropy mask ----------


@finite_result("logits")
def token_entropy(logits, *, check=True):
    """Entropy of the policy's next-token distribution, per position, in nats.

        H = -sum_v softmax(logits)_v * log_softmax(logits)_v       over the last axis

    Args:
        logits: (..., V) float; gradient flows to it.
        check: validate the arguments (see the note above the atoms).
    Returns:
        (...) entropies in [0, log V].
    Raises:
        ValueError naming logits for a bad or 0-D tensor.
    verl: verl.utils.torch_functional.entropy_from_logits (logsumexp - sum p * logits, the same value).
    TRL: its entropy_from_logits, the same formula.
    """
    if check:
        _check_args(tensors=[("logits", logits)], requires=[("logits", "expected at least 1 dimension (..., V)",
                                                             lambda: logits.dim() >= 1)])
    logp = F.log_softmax(logits, dim=-1)  # log_softmax, never log(softmax): no log 0
    return -(logp.exp() * logp).sum(dim=-1)  # (..., V) -> (...)


@finite_result("entropies")
def entropy_bonus(entropies, completion_mask, coef, reduction="token", max_new_tokens=None, *, check=True):
    """The entropy bonus to ADD to a loss: minus coef times the reduced token entropy (Williams and Peng,
    1991; the entropy term of PPO, arXiv 1707.06347, eq. 9).

        bonus = -coef * reduce_token_loss(entropies, completion_mask, reduction)

    Minimizing the loss plus the bonus raises the entropy, which keeps the policy from collapsing onto
    one answer before it has explored.

    Args:
        entropies: (N, R) float, e.g. `token_entropy` of the response positions; gradient flows through it.
        completion_mask: (N, R) 0/1. coef: >= 0.
        reduction, max_new_tokens: as `reduce_token_loss` (default "token", the token mean).
        check: validate the arguments (see the note above the atoms).
    Returns:
        scalar, <= 0 for entropies >= 0.
    Raises:
        ValueError naming the argument for bad tensors, shapes or scalars.
    TRL: GRPOConfig(entropy_coef) (the token mean). verl: actor.entropy_coeff (its reduction is
    loss_agg_mode's; verl adds 1e-8 to token counts).
    """
    if check:
        _check_args(tensors=[("entropies", entropies)], ndim=2, mask=("completion_mask", completion_mask),
                    reduction=reduction, max_new_tokens=max_new_tokens, coef=(coef, _NONNEGATIVE))
    return -coef * reduce_token_loss(entropies, completion_mask, reduction, max_new_tokens, check=False)


def adaptive_entropy_coef(coef, entropy, target=0.2, delta=0.005, coef_min=0.0, coef_max=1.0, *, check=True):
    """Skywork-OR1's adaptive entropy coefficient: one step toward a target entropy (He et al., Skywork Open
    Reasoner 1 Technical Report, arXiv 2505.22312).

        coef_next = min(coef + delta, coef_max)   if entropy <= target
                  = max(coef - delta, coef_min)   otherwise

    A fixed entropy coefficient is either too weak (the entropy collapses) or too strong (it explodes);
    stepping it after each update keeps the entropy near the target instead.

    Args:
        coef: >= 0, the current coefficient. entropy: >= 0, the measured mean token entropy (a float).
        target: >= 0. delta: >= 0, the step. coef_min, coef_max: 0 <= coef_min <= coef_max.
        check: validate the arguments (see the note above the atoms).
    Returns:
        float, the next coefficient.
    Raises:
        ValueError naming the argument for a scalar out of range.
    TRL: GRPOConfig(use_adaptive_entropy=True, entropy_target, ...). verl: none.
    """
    if check:
        _check_args(coef=(coef, _NONNEGATIVE), entropy=(entropy, _NONNEGATIVE), target=(target, _NONNEGATIVE),
                    delta=(delta, _NONNEGATIVE), coef_min=(coef_min, _NONNEGATIVE), coef_max=(coef_max, _NONNEGATIVE),
                    ordered=[("coef_min", "coef_max", False)])
    if entropy <= target:
        return float(min(coef + delta, coef_max))
    return float(max(coef - delta, coef_min))


def high_entropy_token_mask(entropies, completion_mask, top_quantile=1.0, *, check=True):
    """The high-entropy "forking" tokens: the kept tokens whose entropy is in the batch's top share (Wang et
    al., Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning for LLM
    Reasoning, arXiv 2506.01939).

        keep = kept and H >= quantile(H[kept], 1 - top_quantile)       (linear interpolation)

    The paper finds that the gradient of the top 20% highest-entropy tokens, where the reasoning chooses
    a path, carries the learning; training on those alone matches or beats training on all tokens.

    Args:
        entropies: (N, R) float token entropies (detached here). completion_mask: (N, R) 0/1, at least one
            kept token.
        top_quantile: in [0, 1]; 1 keeps every kept token, 0 only those at the maximum (the paper's 0.2).
        check: validate the arguments (see the note above the atoms).
    Returns:
        (N, R) bool, without grad, a subset of the mask.
    Raises:
        ValueError naming the argument for bad tensors, a mask that keeps nothing or top_quantile
        outside [0, 1].
    TRL: GRPOConfig(top_entropy_quantile) (TRL takes the quantile in float32; here it is float64).
    verl: none.
    """
    if check:
        _check_args(tensors=[("entropies", entropies)], ndim=2, mask=("completion_mask", completion_mask),
                    top_quantile=(top_quantile, _UNIT), requires=[
                        ("completion_mask", "expected at least one kept token",
                         lambda: bool((stored(completion_mask) != 0).any()))])
    kept = _constant(completion_mask).bool()
    values = _constant(entropies).to(torch.float64)  # torch.quantile takes float32/float64 only
    threshold = torch.quantile(values[kept], 1.0 - top_quantile)  # linear interpolation
    return kept & (values >= threshold)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}  # names -> atoms, for the drivers' flags


# ---------------------------------------------------------------------------------------------
# The one-step contextual bandit: setup
# ---------------------------------------------------------------------------------------------

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
# where the KL to the reference goes (train's kl_placement; None: each algorithm's own, PPO's k1 of the sampling
# policy in the reward, GRPO's and CISPO's exact KL(current || reference) in the loss)
KL_PLACEMENTS = ("k1-reward", "k3-loss", "k3-is-loss")

COLUMNS = [
    "algorithm", "step", "optimizer_steps", "sampled_actions", "pair_presentations", "expected_reward",
    "best_action_probability", "entropy", "kl_reference", "loss", "value_loss", "clip_fraction",
    "old_policy_kl", "zero_group_fraction",
]
DPO_COLUMNS = COLUMNS + ["dpo_training_loss", "dpo_clean_loss"]


def reward_table(sparse=False, shift=0.0):
    """(X=4, A=3) float64 reward table R(x, a) of the bandit (rows = contexts).

    The article this lab accompanies (docs/sources.md) proposes two variants: sparse=True pays 1 for each
    context's best action and 0 for the others; shift adds a constant to every reward (a group-relative
    advantage does not move, a critic's target does).
    """
    table = torch.tensor(
        [[1.0, 0.2, -0.5], [-0.5, 1.0, 0.2], [0.2, -0.5, 1.0], [1.0, -0.5, 0.2]], dtype=DTYPE, device=DEVICE
    )
    if sparse:
        table = torch.zeros_like(table).scatter(1, table.argmax(dim=1, keepdim=True), 1.0)
    return table + shift if shift else table


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
    Raises ValueError naming the argument for a bad table.
    """
    check_tensor("logits", logits, ndim=2)
    rewards = reward_table().to(logits.dtype) if rewards is None else check_tensor("rewards", rewards, ndim=2)
    reference_logits = torch.zeros_like(logits) if reference_logits is None else reference_logits
    check_tensor("reference_logits", reference_logits, ndim=2)
    check_same_shape([("logits", logits), ("rewards", rewards), ("reference_logits", reference_logits)])
    check_same_dtype([("logits", logits), ("rewards", rewards), ("reference_logits", reference_logits)])
    with torch.no_grad():
        return _exact_metrics(F.log_softmax(logits, dim=-1), F.log_softmax(reference_logits, dim=-1), rewards)


def _exact_metrics(logp, ref_logp, rewards):
    """`evaluate` from the (X, A) log-probability tables of the policy and the reference."""
    probs = logp.exp()
    best = rewards.argmax(dim=-1, keepdim=True)  # (X, 1)
    return {
        "expected_reward": (probs * rewards).sum(dim=-1).mean().item(),
        "best_action_probability": probs.gather(-1, best).mean().item(),
        # 0 log 0 = 0: an action of probability 0 (a log-prob of -inf, from finite extreme logits) adds nothing
        "entropy": -torch.where(probs > 0, probs * logp, 0.0).sum(dim=-1).mean().item(),
        "kl_reference": torch.where(probs > 0, probs * (logp - ref_logp), 0.0).sum(dim=-1).mean().item(),
    }


KL_DESCRIPTIONS = {
    "k1-reward": "shaped reward R - kl_beta * (old_logp - ref_logp) (k1 of the sampling policy), no KL in the loss",
    "k3-loss": "kl_beta * mean k3(logp, ref_logp) over the sampled actions, in the loss",
    "k3-is-loss": "kl_beta * mean of (pi / pi_old) * k3(logp, ref_logp) over the sampled actions, in the loss",
}


def _settings(algorithm, steps, seed, group_size, grpo_prompts, rewards, reward_shift, sparse_rewards,
              kl_beta=KL_BETA, kl_placement=None, scale_rewards="group"):
    """The JSON settings: those every algorithm shares, then the ones that apply to `algorithm` (the KL's
    placement and the advantage scale only where they differ from the defaults, so default runs keep
    their files)."""
    settings = {
        "algorithm": algorithm,
        "seed": seed,
        "steps": steps,
        "dtype": dtype_name(DTYPE),
        "device": str(DEVICE),
        "torch": torch.__version__,
        "reward_table": rewards.tolist(),
        "reward_shift": reward_shift,
        "sparse_rewards": sparse_rewards,
        "num_contexts": NUM_CONTEXTS,
        "num_actions": NUM_ACTIONS,
        "reference": "uniform (zero logits), frozen",
        "optimizer": "Adam",
        "learning_rate": LEARNING_RATE,
        "adam_betas": [0.9, 0.999],
        "max_grad_norm": MAX_GRAD_NORM,
    }
    if algorithm == "dpo":
        settings.update({"dpo_beta": DPO_BETA, "offline_preference_pairs": int(preference_pairs(rewards).shape[0])})
        return settings
    settings.update({"kl_beta": kl_beta, "update_epochs": UPDATE_EPOCHS, "target_old_policy_kl": TARGET_OLD_POLICY_KL})
    if algorithm == "ppo":
        settings.update({"clip_epsilon": CLIP_EPSILON, "ppo_batch_size": PPO_BATCH_SIZE, "value_coef": VALUE_COEF,
                         "kl": KL_DESCRIPTIONS.get(kl_placement, "shaped return R - kl_beta * (old_logp - ref_logp)")})
        return settings
    settings.update({"clip_epsilon": CLIP_EPSILON} if algorithm == "grpo" else {"epsilon_high": EPSILON_HIGH})
    settings.update({
        "group_size": group_size,
        "online_batch_prompts": grpo_prompts,
        "group_advantage_epsilon": GROUP_ADVANTAGE_EPSILON,
        "kl": KL_DESCRIPTIONS.get(kl_placement, "kl_beta * exact KL(current || reference) over the drawn contexts, in "
                                                "the loss"),
    })
    if scale_rewards != "group":
        settings["scale_rewards"] = scale_rewards
    return settings


def _initial_row(algorithm, logits, rewards, reference_logits):
    row = {"algorithm": algorithm, "step": 0, "optimizer_steps": 0, "sampled_actions": 0, "pair_presentations": 0}
    row.update(evaluate(logits, rewards, reference_logits))
    row.update({"loss": 0.0, "value_loss": 0.0, "clip_fraction": 0.0, "old_policy_kl": 0.0, "zero_group_fraction": 0.0})
    return row


def optimizer_step(optimizer, params, loss, max_grad_norm=MAX_GRAD_NORM):
    """One optimizer step on `loss` with one gradient norm over all of `params` (every tensor the optimizer
    trains: actor and critic together) clipped to max_grad_norm. The lab's drivers all update through it."""
    for param in params:  # what optimizer.zero_grad() does by default, without its per-call overhead
        param.grad = None
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()


@training_mode()  # the updates need autograd even under the caller's torch.no_grad() or inference_mode()
@torch_threads(1)
def train(algorithm, *, steps=120, seed=7, group_size=8, preference_flips=0, grpo_prompts=16, reward_shift=0.0,
          sparse_rewards=False, kl_beta=KL_BETA, kl_placement=None, scale_rewards="group", observe=None):
    """Train one algorithm on the bandit; return (rows, settings).

    reward_shift (a constant added to every reward, in [-100, 100]) and sparse_rewards (1 for the best
    action, 0 otherwise) are the two variants the accompanying article proposes (docs/sources.md); the
    defaults are the article's table.
    kl_beta (in [0, 100]) weighs the KL to the reference; kl_placement (PPO, GRPO, CISPO) moves it: None
    keeps each algorithm's own (PPO: k1 of the sampling policy in the reward; GRPO, CISPO: the exact KL in
    the loss), "k1-reward" subtracts kl_beta * (old_logp - ref_logp) from each sampled reward, "k3-loss"
    adds kl_beta * the mean k3 of the sampled actions to the loss, "k3-is-loss" the same with each k3
    weighted by pi / pi_old (kl_k3_is_corrected); the atlas's kl-optimum compares them.
    scale_rewards (GRPO, CISPO): group_advantages' scale, "group" (default), "batch" or "none".
    observe(step, logits): called after every iteration with the (X, A) logits, detached (a copy).

    rows: list of dicts with the CSV columns (row 0 = initial evaluation), one per outer iteration.
    settings: the hyperparameters that apply to this algorithm, the seed, versions and (DPO) the
    preference data.
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
    reward_shift = check_real("reward_shift", reward_shift, low=-100.0, high=100.0)
    if not isinstance(sparse_rewards, bool):
        raise ValueError(f"sparse_rewards: expected True or False, got {sparse_rewards!r}")
    rewards = reward_table(sparse_rewards, reward_shift)
    pairs = preference_pairs(rewards)
    if preference_flips > pairs.shape[0]:
        raise ValueError(f"preference_flips: expected an integer in [0, {pairs.shape[0]}], got {preference_flips}")
    if preference_flips and algorithm != "dpo":
        raise ValueError(f"preference_flips: only applies to dpo, got {preference_flips} with {algorithm}")
    kl_beta = check_real("kl_beta", kl_beta, low=0.0, high=100.0)
    if kl_placement is not None:
        check_choice("kl_placement", kl_placement, KL_PLACEMENTS)
    check_choice("scale_rewards", scale_rewards, GROUP_SCALES)
    if algorithm == "dpo" and (kl_placement is not None or kl_beta != KL_BETA):
        raise ValueError(f"kl_placement: dpo has no KL penalty to place, got {kl_placement!r} (kl_beta {kl_beta})")
    if scale_rewards != "group" and algorithm not in ("grpo", "cispo"):
        raise ValueError(f"scale_rewards: only applies to grpo and cispo, got {scale_rewards!r} with {algorithm}")
    kl = _KlPenalty(kl_beta, kl_placement)

    # setup
    settings = _settings(algorithm, steps, seed, group_size, grpo_prompts, rewards, reward_shift, sparse_rewards,
                         kl_beta, kl_placement, scale_rewards)
    generator = torch.Generator(device=DEVICE).manual_seed(seed)  # the one seeding point of the run
    logits = torch.zeros(NUM_CONTEXTS, NUM_ACTIONS, dtype=DTYPE, device=DEVICE, requires_grad=True)
    reference_logits = torch.zeros(NUM_CONTEXTS, NUM_ACTIONS, dtype=DTYPE, device=DEVICE)  # frozen uniform
    rows = [_initial_row(algorithm, logits, rewards, reference_logits)]

    if algorithm == "dpo":
        flipped = torch.randperm(pairs.shape[0], generator=generator)[:preference_flips].sort().values
        training_pairs = pairs.clone()
        training_pairs[flipped, 1], training_pairs[flipped, 2] = pairs[flipped, 2], pairs[flipped, 1]
        ref_logp_table = F.log_softmax(reference_logits, dim=-1)
        with torch.no_grad():  # computed, not assumed: ln 2 only while policy = reference
            rows[0]["dpo_training_loss"] = _dpo_batch_loss(logits, ref_logp_table, training_pairs).item()
            rows[0]["dpo_clean_loss"] = _dpo_batch_loss(logits, ref_logp_table, pairs).item()
        settings.update({
            "preference_flips": preference_flips,
            "flipped_pair_indices": flipped.tolist(),
            "preference_columns": ["context", "chosen", "rejected"],
            "clean_preference_pairs": pairs.tolist(),
            "training_preference_pairs": training_pairs.tolist(),
        })
        _train_dpo(logits, reference_logits, rewards, pairs, training_pairs, steps, rows)
    elif algorithm == "ppo":
        _train_ppo(logits, reference_logits, rewards, generator, steps, rows, kl, observe)
    else:
        _train_group(algorithm, logits, reference_logits, rewards, generator, steps, group_size, grpo_prompts, rows,
                     kl, scale_rewards, observe)
    return rows, settings


@dataclasses.dataclass(frozen=True)
class _KlPenalty:
    """The KL to the reference as train places it: beta, and placement None (the algorithm's own) or one
    of KL_PLACEMENTS."""

    beta: float
    placement: str | None

    def in_reward(self, default):
        return self.placement == "k1-reward" or (self.placement is None and default)

    def loss_term(self, logp, old_logp, ref_logp):
        """beta * the mean k3 (or IS-corrected k3) of the sampled actions, gradient through logp; 0 where
        the KL is elsewhere."""
        if self.placement == "k3-loss":
            return self.beta * kl_k3(logp, ref_logp, check=False).mean()
        if self.placement == "k3-is-loss":
            return self.beta * kl_k3_is_corrected(logp, old_logp, ref_logp, check=False).mean()
        return 0.0


def _dpo_batch_loss(logits, ref_logp_table, pairs):
    """Mean DPO loss over (pairs, 3) rows (context, chosen, rejected); one action = one whole answer."""
    logp = F.log_softmax(logits, dim=-1)  # (X, A)
    context, chosen, rejected = pairs[:, 0], pairs[:, 1], pairs[:, 2]  # (pairs,) each
    return dpo_loss(
        logp[context, chosen], logp[context, rejected], ref_logp_table[context, chosen],
        ref_logp_table[context, rejected], beta=DPO_BETA, check=False,
    ).mean()


def _train_dpo(logits, reference_logits, rewards, clean_pairs, training_pairs, steps, rows):
    optimizer = torch.optim.Adam([logits], lr=LEARNING_RATE)
    ref_logp_table = F.log_softmax(reference_logits, dim=-1)  # (X, A), fixed for the run
    clean_labels = bool(torch.equal(training_pairs, clean_pairs))
    for step in range(1, steps + 1):
        # update: one full-batch step on the fixed offline pairs (no sampling, no old policy)
        loss = _dpo_batch_loss(logits, ref_logp_table, training_pairs)
        optimizer_step(optimizer, [logits], loss)
        # record: both diagnostics after the update, on the labels trained on and on the true ones
        with torch.no_grad():
            training_loss = _dpo_batch_loss(logits, ref_logp_table, training_pairs).item()
            # without flips the two label sets are the same pairs: the same number, computed once
            clean_loss = training_loss if clean_labels else _dpo_batch_loss(logits, ref_logp_table, clean_pairs).item()
            metrics = _exact_metrics(F.log_softmax(logits, dim=-1), ref_logp_table, rewards)
        row = {
            "algorithm": "dpo", "step": step, "optimizer_steps": step, "sampled_actions": 0,
            "pair_presentations": step * training_pairs.shape[0],
        }
        row.update(metrics)
        row.update({
            "loss": loss.item(), "value_loss": 0.0, "clip_fraction": 0.0, "old_policy_kl": 0.0,
            "zero_group_fraction": 0.0, "dpo_training_loss": training_loss, "dpo_clean_loss": clean_loss,
        })
        rows.append(row)


def _early_stop(old_logp_table, logp_table):
    """True once the exact KL(old || current), averaged over all contexts, exceeds the target."""
    kl = (old_logp_table.exp() * (old_logp_table - logp_table.detach())).sum(dim=-1).mean()  # categorical_kl
    return kl.item() > TARGET_OLD_POLICY_KL


def _clip_fraction_of_pass(epoch, logp, old_logp, advantages):
    """clip_fraction on the ratios this pass's loss sees; on the first pass every ratio is exactly 1,
    inside any clip range, so it is 0 without computing."""
    if epoch == 0:
        return 0.0
    return clip_fraction((logp.detach() - old_logp).exp(), advantages, CLIP_EPSILON, check=False).item()


def _train_ppo(logits, reference_logits, rewards, generator, steps, rows, kl, observe):
    values = torch.zeros(NUM_CONTEXTS, dtype=DTYPE, device=DEVICE, requires_grad=True)  # the critic V(x)
    params = [logits, values]
    optimizer = torch.optim.Adam(params, lr=LEARNING_RATE)
    ref_logp_table = F.log_softmax(reference_logits, dim=-1)  # (X, A)
    done = torch.ones(PPO_BATCH_SIZE, dtype=torch.bool)  # every answer ends its episode
    no_next_value = torch.zeros(PPO_BATCH_SIZE, dtype=DTYPE)
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
        shaped_returns = rewards[contexts, actions]
        if kl.in_reward(default=True):
            shaped_returns = shaped_returns - kl.beta * (old_logp - ref_logp)
        advantages, returns = gae(shaped_returns, old_values[contexts], no_next_value, done, done, check=False)
        # update: up to UPDATE_EPOCHS full-batch steps, stopped once the policy drifted from old
        losses, value_losses, clipped = [], [], []
        for epoch in range(UPDATE_EPOCHS):
            logp_table = F.log_softmax(logits, dim=-1)  # (X, A)
            # KL(old || old) is exactly 0: the first pass never stops, so it is not computed
            if epoch > 0 and _early_stop(old_logp_table, logp_table):
                break
            logp = logp_table[contexts, actions]
            clipped.append(_clip_fraction_of_pass(epoch, logp, old_logp, advantages))
            policy_loss = clipped_policy_loss(logp, old_logp, advantages, CLIP_EPSILON, check=False).mean()
            value_loss = (values[contexts] - returns).square().mean()
            loss = policy_loss + VALUE_COEF * value_loss + kl.loss_term(logp, old_logp, ref_logp)
            optimizer_step(optimizer, params, loss)
            optimizer_steps += 1
            losses.append(loss.item())
            value_losses.append(value_loss.item())
        # record
        rows.append(_record(
            "ppo", step, optimizer_steps, step * PPO_BATCH_SIZE, logits, old_logp_table, ref_logp_table, rewards,
            losses, value_losses, clipped, zero_group_fraction=0.0,
        ))
        if observe is not None:
            observe(step, logits.detach().clone())


def _train_group(algorithm, logits, reference_logits, rewards, generator, steps, group_size, grpo_prompts, rows,
                 kl, scale_rewards, observe):
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
        contexts = prompt_contexts.repeat_interleave(group_size)  # (B,) -> (B*G,), prompt-major
        actions = group_actions.reshape(-1)  # (B, G) -> (B*G,)
        old_logp = old_logp_table[contexts, actions]
        ref_logp = ref_logp_table[contexts, actions]
        # advantages: relative to the group, no critic (of the KL-shaped reward where the KL is in the reward)
        shaped = group_rewards
        if kl.in_reward(default=False):
            shaped = group_rewards - kl.beta * (old_logp - ref_logp).reshape(grpo_prompts, group_size)  # (B, G)
        advantages = group_advantages(shaped, GROUP_ADVANTAGE_EPSILON, scale_rewards, check=False).reshape(-1)
        zero_group_fraction = tied_groups(group_rewards).double().mean().item()  # of the task's reward
        # update
        losses, clipped = [], []
        for epoch in range(UPDATE_EPOCHS):
            logp_table = F.log_softmax(logits, dim=-1)  # (X, A)
            # KL(old || old) is exactly 0: the first pass never stops, so it is not computed
            if epoch > 0 and _early_stop(old_logp_table, logp_table):
                break
            logp = logp_table[contexts, actions]
            if algorithm == "grpo":
                clipped.append(_clip_fraction_of_pass(epoch, logp, old_logp, advantages))
                policy_loss = clipped_policy_loss(logp, old_logp, advantages, CLIP_EPSILON, check=False).mean()
            else:
                # an answer is a one-token sequence; beta=0 because the exact KL below replaces k3
                policy_loss = cispo_policy_loss(
                    logp.unsqueeze(1), old_logp.unsqueeze(1), ref_logp.unsqueeze(1), advantages, one_token_mask,
                    epsilon_high=EPSILON_HIGH, beta=0.0, check=False,
                )
            if kl.placement is None:  # the exact KL of the drawn contexts; its gradient is that of KL(pi || ref)
                kl_exact = categorical_kl(logits[prompt_contexts], reference_logits[prompt_contexts], check=False)
                loss = policy_loss + kl.beta * kl_exact.mean()
            else:
                loss = policy_loss + kl.loss_term(logp, old_logp, ref_logp)
            optimizer_step(optimizer, [logits], loss)
            optimizer_steps += 1
            losses.append(loss.item())
        # record (CISPO never zeroes a gradient: its clip_fraction stays 0)
        rows.append(_record(
            algorithm, step, optimizer_steps, step * batch_actions, logits, old_logp_table, ref_logp_table, rewards,
            losses, [], clipped, zero_group_fraction,
        ))
        if observe is not None:
            observe(step, logits.detach().clone())


def _record(algorithm, step, optimizer_steps, sampled_actions, logits, old_logp_table, ref_logp_table, rewards,
            losses, value_losses, clipped, zero_group_fraction):
    """Metrics after the updates of one iteration. loss, value_loss and clip_fraction are means over
    the passes taken, each measured on the ratios that pass's loss saw (before its step)."""
    with torch.no_grad():
        logp_table = F.log_softmax(logits, dim=-1)  # (X, A), after the updates
        row = {
            "algorithm": algorithm, "step": step, "optimizer_steps": optimizer_steps,
            "sampled_actions": sampled_actions, "pair_presentations": 0,
        }
        row.update(_exact_metrics(logp_table, ref_logp_table, rewards))
        old_policy_kl = (old_logp_table.exp() * (old_logp_table - logp_table)).sum(dim=-1).mean().item()
    row.update({
        "loss": math.fsum(losses) / len(losses) if losses else 0.0,
        "value_loss": math.fsum(value_losses) / len(value_losses) if value_losses else 0.0,
        "clip_fraction": math.fsum(clipped) / len(clipped) if clipped else 0.0,
        "old_policy_kl": old_policy_kl,
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


@training_mode()  # the examples differentiate, even under the caller's torch.no_grad() or inference_mode()
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

    # REINFORCE: -A * logp; its gradient -A is the clipped loss's on the first pass (ratio 1)
    logp = t([-1.0, -2.0], requires_grad=True)
    adv = t([2.0, -1.0])
    loss = reinforce_loss(logp, adv)
    loss.sum().backward()
    demo["reinforce_loss"] = {
        "logp": [-1.0, -2.0], "advantages": adv.tolist(), "loss": _rounded(loss.tolist()),
        "grad_logp": _rounded(logp.grad.tolist()),
        "reading": "the gradient is -A, the same as clipped_policy_loss's while logp == old_logp",
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

    # The field's variants. Clip-higher and dual-clip on the four PPO cases plus a far-off A < 0 ratio
    ratios = [1.5, 0.5, 1.5, 0.5, 4.0]
    logp = t(ratios).log()
    adv = t([1.0, -1.0, -1.0, 1.0, -1.0])
    demo["clip_variants"] = {
        "ratio": ratios, "advantages": adv.tolist(),
        "loss_eps_0.2": _rounded(clipped_policy_loss(logp, torch.zeros_like(logp), adv).tolist()),
        "loss_eps_high_0.28": _rounded(clipped_policy_loss(logp, torch.zeros_like(logp), adv, 0.2, 0.28).tolist()),
        "loss_dual_clip_3": _rounded(clipped_policy_loss(logp, torch.zeros_like(logp), adv, 0.2, None, 3.0).tolist()),
        "clip_fraction": _rounded(clip_fraction(t(ratios), adv).item()),
        "reading": "eps_high 0.28 lets the A > 0 ratio 1.5 count up to 1.28; dual-clip caps the A < 0 ratio 4 "
                   "at 3 * |A|; 2 of 5 gradients are zeroed (1.5 with A > 0, 0.5 with A < 0)",
    }

    # Advantages of one group of rewards [0, 0, 1, 1] and a second group [1, 0, 0, 0], three ways, plus RLOO
    groups = t([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    demo["advantage_variants"] = {
        "rewards": groups.tolist(),
        "group_std": _rounded(group_advantages(groups).tolist()),
        "batch_std": _rounded(group_advantages(groups, scale="batch").tolist()),
        "no_std": _rounded(group_advantages(groups, scale="none").tolist()),
        "rloo": _rounded(rloo_advantages(groups).tolist()),
        "reading": "the lone success of the second row gets +1.73 divided by its group's std, +0.75 without: a "
                   "small std up-weights rare outcomes; RLOO = G/(G-1) times no_std (4/3 here)",
    }

    # k1, k2, k3 on one token the policy gives 0.5 and the reference 0.25, and their means under the policy
    policy_probs, ref_probs = t([0.5, 0.25, 0.25]), t([0.25, 0.25, 0.5])
    policy_lp, ref_lp = policy_probs.log(), ref_probs.log()
    means = {name: _rounded((policy_probs * fn(policy_lp, ref_lp)).sum().item()) for name, fn in KL_ESTIMATORS.items()}
    demo["kl_estimators"] = {
        "policy": policy_probs.tolist(), "reference": ref_probs.tolist(),
        "kl_exact": _rounded((policy_probs * (policy_lp - ref_lp)).sum().item()),
        "k1_k2_k3_per_token": [_rounded(fn(policy_lp, ref_lp).tolist()) for fn in KL_ESTIMATORS.values()],
        "k1_k2_k3_mean_under_policy": [means["k1"], means["k2"], means["k3"]],
        "reading": "k1 and k3 average to the exact KL (k1 goes negative per token, k3 never); k2 is biased",
    }

    # GSPO's sequence ratio, SAPO's gate, truncated importance weights, the overlong penalty
    seq_logp = t([[math.log(1.2), math.log(0.9), 0.0]])
    seq_mask = torch.tensor([[1, 1, 0]])
    gate_ratios = t([0.5, 1.0, 1.5, 3.0])
    demo["sequence_variants"] = {
        "token_ratios": [1.2, 0.9], "gspo_sequence_ratio": _rounded(sequence_log_ratio(seq_logp, torch.zeros_like(seq_logp),
                                                                                        seq_mask).exp().item()),
        "sapo_ratios": gate_ratios.tolist(),
        "sapo_gate_tau_1": _rounded((torch.sigmoid(gate_ratios - 1.0) * 4.0).tolist()),
        "tis_weights_cap_2": _rounded(truncated_importance_weights(t([0.0, 0.0, 0.0]), t([0.0, math.log(0.8),
                                                                                          math.log(0.25)])).tolist()),
        "overlong_lengths": [10, 13, 16, 17], "overlong_penalty_max_16_cache_4": _rounded(
            overlong_penalty(torch.tensor([10, 13, 16, 17]), 16, 4).tolist()),
        "reading": "GSPO's ratio is the geometric mean sqrt(1.2 * 0.9) = 1.039; SAPO's gate has the ratio's "
                   "slope (1) at r = 1 and flattens away from it; TIS caps 1/0.25 = 4 at 2",
    }

    # The DPO family at one pair with margin 0.5 nats (beta 0.1; label smoothing 0.1)
    zero, half = t([0.0]), t([0.5])
    family = {
        "dpo_sigmoid": dpo_loss(half, zero, zero, zero, beta=0.1),
        "ipo": ipo_loss(half, zero, zero, zero, beta=0.1),
        "hinge": dpo_hinge_loss(half, zero, zero, zero, beta=0.1),
        "cdpo_e0.1": cdpo_loss(half, zero, zero, zero, beta=0.1, label_smoothing=0.1),
        "robust_e0.1": robust_dpo_loss(half, zero, zero, zero, beta=0.1, label_smoothing=0.1),
        "simpo_beta2_gamma0.5": simpo_loss(half, zero),
    }
    demo["dpo_family"] = {
        "margin": 0.5, **{name: _rounded(value.item()) for name, value in family.items()},
        "reading": "IPO is 0 at margin 1/(2 beta) = 5 and grows beyond it; the hinge is 0 from margin 1/beta = 10",
    }
    return demo


def atoms_text(demo):
    """The atoms demo as compact text: one block per atom, one line per value (JSON: --json)."""
    def shown(value):
        if isinstance(value, list):
            return "[" + ", ".join(shown(item) for item in value) + "]"
        if isinstance(value, bool):
            return "T" if value else "F"
        if isinstance(value, float):
            return f"{value:.6g}"
        return str(value)

    lines = []
    for atom, values in demo.items():
        lines.append(atom)
        for key, value in values.items():
            if key != "reading":
                lines.append(f"  {key:<36s} {shown(value) if not isinstance(value, str) else value}")
        if "reading" in values:
            lines.append(f"  -> {values['reading']}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def main(argv=None):
    args = parse(argv)
    if args.algorithm == "atoms":
        demo = atomic_demo()
        print(json_text(demo) if args.json else atoms_text(demo), end="")
        return 0
    algorithms = ALGORITHMS if args.algorithm == "all" else (args.algorithm,)
    files, summary = {}, []
    for algorithm in algorithms:
        rows, settings = train(
            algorithm, steps=args.steps, seed=args.seed, group_size=args.group_size,
            preference_flips=args.preference_flips if algorithm == "dpo" else 0, grpo_prompts=args.grpo_prompts,
            reward_shift=args.reward_shift, sparse_rewards=args.sparse_rewards,
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
