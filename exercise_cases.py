"""The course's exercises and their cases: one set that grades a learner's atoms (exercises.py) and
tests the lab's own (test_exercises.py, test_rl_lab.py). The lab's atoms are the reference solutions:
the solutions are rl_lab.py's atoms (and countdown.py's pass_at_k).

    python exercises.py check --file my_atoms.py      # every case below, against a learner's file
    python -m unittest -v test_exercises              # the lab's atoms pass them all; common mistakes fail

Each exercise names a lab atom, its chapter (docs/learn/NN-name.md) and a few cases. A case is
- hand: inputs small enough to compute on paper, the expected value written out;
- reference: seeded random inputs, the expected value from a plain Python loop over the formula;
- invariant: a property that must hold (the loss at ratio 1 is -A, tied groups give exact zeros);
- gradient: where a detach matters, the gradient that reaches an input (0 for what is detached).
Every case carries the hint a learner sees when it fails: the usual mistake it catches and the
section of the chapter that explains it.

Shape notation (as in rl_lab.py): B prompts or sequences, G group size, N responses, T tokens or time
steps, R response positions, V vocabulary, A actions.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable

import torch

import countdown
import rl_lab
from lab.checks import dtype_name

DTYPE = torch.float64
TOLERANCE = 1e-10  # absolute and relative, in float64: a correct formula is within ~1e-15


def t(values, **kwargs):
    """A float64 tensor (the lab's dtype), the cases' shorthand."""
    return torch.tensor(values, dtype=DTYPE, **kwargs)


def seeded(seed):
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class Case:
    """One graded call of an atom.

    inputs: () -> (args, kwargs), fresh tensors on every call (a gradient case needs new leaves).
    expected: the value, or a slow reference called with the same arguments as the atom.
    measure: None (the atom's return value) or (atom, args, kwargs) -> what is compared, e.g. a gradient.
    hint: the mistake this case catches, in one sentence; section: the anchor in the chapter.
    exact: compare with no tolerance at all (exact zeros)."""

    name: str
    inputs: Callable
    expected: object
    hint: str
    section: str
    measure: Callable | None = None
    exact: bool = False


@dataclass(frozen=True)
class Exercise:
    """An atom to write: its name (the lab's), chapter, the lab's solution, the stub's docstring (shapes,
    what is detached, the formula, the source) and its cases, in the order they are tried."""

    name: str
    chapter: str
    solution: Callable
    doc: str
    cases: tuple

    def pointer(self, case):
        return f"docs/learn/{self.chapter}.md#{case.section}"


def given(*args, **kwargs):
    """inputs for a case: () -> (args, kwargs), new objects on every call; each argument may be a function
    building a fresh tensor, and a tensor written here is copied, so that an atom that changes its input in
    place cannot change the next call's (the expected value's, a later case's or the report's)."""
    def fresh(value):
        if callable(value):
            return value()
        if isinstance(value, torch.Tensor):
            return value.detach().clone().requires_grad_(value.requires_grad)
        return value

    def build():
        return tuple(fresh(arg) for arg in args), {key: fresh(value) for key, value in kwargs.items()}
    return build


def gradient_of(index):
    """measure: the gradient of the atom's output (its first output, summed) w.r.t. argument `index`;
    zeros where none arrives (a detached input)."""
    def measure(atom, args, kwargs):
        leaf = args[index]
        out = atom(*args, **kwargs)
        out = out[0] if isinstance(out, (tuple, list)) else out
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward()
        return torch.zeros_like(leaf) if leaf.grad is None else leaf.grad
    return measure


def first_row(atom, args, kwargs):
    """measure: the first row of the atom's (first) output, to compare one row exactly."""
    out = atom(*args, **kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out[0] if isinstance(out, torch.Tensor) and out.ndim >= 1 else out


def output_requires_grad(atom, args, kwargs):
    """measure: whether any output still carries a gradient (it must not when the atom detaches)."""
    out = atom(*args, **kwargs)
    outputs = out if isinstance(out, (tuple, list)) else (out,)
    return any(isinstance(item, torch.Tensor) and item.requires_grad for item in outputs)


def leaf(values):
    """A function building a fresh float64 leaf that requires grad, for gradient cases."""
    return lambda: t(values, requires_grad=True)


def random_leaf(shape, seed, scale=1.0, requires_grad=False):
    return lambda: (torch.randn(shape, generator=seeded(seed), dtype=DTYPE) * scale).requires_grad_(requires_grad)


LN = math.log

# ---------------------------------------------------------------------------------------------
# 01 log-probabilities: the causal shift and the masks
# ---------------------------------------------------------------------------------------------


def _response_token_logps_loop(logits, input_ids, response_mask, **_):
    batch, length, vocab = logits.shape
    values, valid = [], []
    for b in range(batch):
        row, kept = [], []
        for position in range(length - 1):
            scores = [logits[b, position, v].item() for v in range(vocab)]
            top = max(scores)
            log_normalizer = top + math.log(sum(math.exp(s - top) for s in scores))
            keep = bool(response_mask[b, position + 1])
            target = int(input_ids[b, position + 1])
            row.append(scores[target] - log_normalizer if keep else 0.0)
            kept.append(keep)
        values.append(row)
        valid.append(kept)
    return t(values), torch.tensor(valid)


_SHIFT_LOGITS = [[[0.0, LN(3.0)], [LN(3.0), 0.0], [0.0, 0.0]]]  # row 0 favours token 1, row 1 token 0
_RANDOM_MASK = torch.tensor([[False, False, True, True, True], [False, True, True, False, False]])

RESPONSE_TOKEN_LOGPS = Exercise(
    "response_token_logps", "01-log-probabilities", rl_lab.response_token_logps,
    """Log-probabilities of the response tokens, with the causal shift.

    logits (B, T, V) float; input_ids (B, T) int64; response_mask (B, T) bool, True on response tokens
    (a real EOS included), False on the prompt and on padding.
    Row t of the logits scores token t+1:
        logp   = log_softmax(logits[:, :-1])         # (B, T-1, V)
        target = input_ids[:, 1:]                     # (B, T-1)
        valid  = response_mask[:, 1:]                 # (B, T-1)
    Returns (token_logps (B, T-1), exactly 0 where not valid; valid (B, T-1) bool).
    Nothing to detach: the gradient flows to the logits. Source: the autoregressive factorization
    log p(y) = sum_t log p(y_t | y_<t) (the lab's response_token_logps).""",
    (
        Case("hand: row t of the logits scores token t+1",
             given(lambda: t(_SHIFT_LOGITS), torch.tensor([[0, 1, 0]]), torch.tensor([[False, True, True]])),
             (t([[LN(0.75), LN(0.75)]]), torch.tensor([[True, True]])),
             "the causal shift: compare logits[:, :-1] with input_ids[:, 1:] (off by one otherwise)",
             "the-derivation"),
        Case("hand: prompt positions are exactly 0, valid is the shifted mask",
             given(lambda: torch.zeros(1, 4, 2, dtype=DTYPE), torch.tensor([[0, 1, 1, 0]]),
                   torch.tensor([[False, False, True, True]])),
             (t([[0.0, -LN(2.0), -LN(2.0)]]), torch.tensor([[False, True, True]])),
             "shift the mask with the targets (response_mask[:, 1:]) and set every position it hides to 0",
             "the-derivation"),
        Case("invariant: padding columns change nothing",
             given(lambda: torch.cat([t(_SHIFT_LOGITS), t([[[3.0, -2.0], [0.5, 7.0]]])], dim=1),
                   torch.tensor([[0, 1, 0, 0, 0]]), torch.tensor([[False, True, True, False, False]])),
             (t([[LN(0.75), LN(0.75), 0.0, 0.0]]), torch.tensor([[True, True, False, False]])),
             "padding is decided by the mask, never by the ids: masked positions give exactly 0",
             "the-derivation"),
        Case("gradient: the logits of masked positions get none",
             given(lambda: torch.zeros(1, 3, 2, dtype=DTYPE, requires_grad=True), torch.tensor([[0, 1, 0]]),
                   torch.tensor([[False, False, True]])),
             t([[[0.0, 0.0], [0.5, -0.5], [0.0, 0.0]]]),
             "hide the masked positions with torch.where (or a product), so that they send no gradient",
             "the-derivation", measure=gradient_of(0)),
        Case("hand: a target the logits give e^-800 has log-prob -800, not -inf",
             given(lambda: t([[[0.0, -800.0], [0.0, 0.0]]]), torch.tensor([[0, 1]]), torch.tensor([[False, True]])),
             (t([[-800.0]]), torch.tensor([[True]])),
             "take log_softmax, never log(softmax(...)): the softmax underflows to 0 and its log is -inf",
             "the-derivation"),
        Case("reference: seeded random (B=2, T=5, V=4) against a Python loop",
             given(random_leaf((2, 5, 4), 1, scale=2.0), torch.randint(0, 4, (2, 5), generator=seeded(2)),
                   _RANDOM_MASK),
             _response_token_logps_loop,
             "log_softmax over the vocabulary (the last axis), then gather the target's entry",
             "the-derivation"),
    ),
)


def _completion_mask_loop(completion_ids, eos_token_id, pad_mask=None, **_):
    rows = []
    for n in range(completion_ids.shape[0]):
        row, ended = [], False
        for r in range(completion_ids.shape[1]):
            real = True if pad_mask is None else bool(pad_mask[n, r])
            keep = real and not ended
            row.append(1 if keep else 0)
            if keep and int(completion_ids[n, r]) == eos_token_id:
                ended = True
        rows.append(row)
    return torch.tensor(rows)


COMPLETION_MASK = Exercise(
    "completion_mask", "01-log-probabilities", rl_lab.completion_mask,
    """The mask of the tokens that count: every position up to AND including the first EOS.

    completion_ids (N, R) int64; eos_token_id int; pad_mask None or (N, R) bool/0-1, True on real
    (non-padding) positions. An EOS on a padding position is not an answer's end; a row without
    EOS keeps all its real positions. EOS may share its id with PAD: the position decides.
    Returns (N, R) int64 of 0/1. Nothing to detach (integers). Source: MiniMind train_grpo.py
    (the lesson's completion mask; TRL and verl build the same).""",
    (
        Case("hand: up to and including the first EOS; no EOS keeps the row",
             given(torch.tensor([[5, 2, 9, 2, 7], [3, 3, 3, 3, 3]]), 2),
             torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]),
             "keep every position up to AND including the first EOS (the EOS is scored), not `ids != eos`",
             "the-derivation"),
        Case("hand: EOS = PAD id, an EOS on padding is not an end",
             given(torch.tensor([[3, 4, 4], [2, 3, 4]]), 4, torch.tensor([[1, 1, 0], [1, 1, 0]])),
             torch.tensor([[1, 1, 0], [1, 1, 0]]),
             "padding positions (pad_mask 0) are never kept, and an EOS there does not end the answer",
             "the-derivation"),
        Case("hand: EOS = PAD id on a left pad: the end is the first EOS among the REAL positions",
             given(torch.tensor([[4, 3, 4, 5]]), 4, torch.tensor([[0, 1, 1, 1]])), torch.tensor([[0, 1, 1, 0]]),
             "look for the EOS among the real positions only (ids == eos AND pad_mask): padding before the "
             "answer may carry EOS's id",
             "the-derivation"),
        Case("reference: seeded random ids (6, 7) with padding, against a Python loop",
             given(torch.randint(0, 5, (6, 7), generator=seeded(3)), 3,
                   torch.rand(6, 7, generator=seeded(4)) > 0.2),
             _completion_mask_loop,
             "only the FIRST real EOS ends a row; every later position is dropped",
             "the-derivation"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 02 the policy gradient
# ---------------------------------------------------------------------------------------------

REINFORCE_LOSS = Exercise(
    "reinforce_loss", "02-policy-gradient", rl_lab.reinforce_loss,
    """The REINFORCE loss, elementwise, to MINIMIZE.

    logp (...) float: log-probs (nats) of the taken actions, gradient flows through it.
    advantages (...) same shape: DETACH them (they scale the step, they are not trained).
        loss = -A * logp              (no reduction)
    Its gradient -A * grad(logp) is the score-function estimator of the policy gradient.
    Source: Williams 1992, REINFORCE.""",
    (
        Case("hand: -A * logp, no reduction",
             given(t([-1.0, -2.0, -0.5]), t([2.0, -1.0, 0.0])), t([2.0, -2.0, 0.0]),
             "the loss is -A * logp per element (the minus sign: a loss is minimized), with no mean",
             "the-derivation"),
        Case("hand: (2, 2) in, (2, 2) out",
             given(t([[-1.0, -2.0], [-0.5, -3.0]]), t([[2.0, -1.0], [0.0, 1.0]])), t([[2.0, -2.0], [0.0, 3.0]]),
             "elementwise: the loss keeps the inputs' shape (no flatten, no reduction)",
             "the-atom"),
        Case("gradient: d loss / d logp = -A",
             given(leaf([-1.0, -2.0, -0.5]), t([2.0, -1.0, 0.0])), t([-2.0, 1.0, 0.0]),
             "the gradient w.r.t. logp is -A: multiply by the advantage, do not exponentiate logp",
             "the-derivation", measure=gradient_of(0)),
        Case("gradient: advantages get none",
             given(t([-1.0, -2.0, -0.5]), leaf([2.0, -1.0, 0.0])), t([0.0, 0.0, 0.0]),
             "detach the advantages (advantages.detach()): the actor's loss must not train them",
             "the-derivation", measure=gradient_of(1)),
        Case("reference: seeded random (10,) against a Python loop",
             given(random_leaf((10,), 5), random_leaf((10,), 6)),
             lambda logp, advantages, **_: t([-a * lp for lp, a in zip(logp.tolist(), advantages.tolist())]),
             "elementwise -A * logp, same shape as the inputs",
             "the-derivation"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 03 baselines, advantages and GAE
# ---------------------------------------------------------------------------------------------


def _gae_loop(rewards, values, next_values, terminated, boundary, gamma=0.99, lam=0.95, **_):
    advantages = [0.0] * len(rewards)
    running = 0.0
    for step in reversed(range(len(rewards))):
        bootstrap = 0.0 if terminated[step] else gamma * next_values[step].item()
        delta = rewards[step].item() + bootstrap - values[step].item()
        running = delta + (0.0 if boundary[step] else gamma * lam * running)
        advantages[step] = running
    return t(advantages), t([a + v for a, v in zip(advantages, values.tolist())])


def _random_flags():
    boundary = torch.rand(12, generator=seeded(7)) < 0.3
    terminated = boundary & (torch.rand(12, generator=seeded(8)) < 0.5)  # terminated implies boundary
    return terminated, boundary


GAE = Exercise(
    "gae", "03-baselines-and-gae", rl_lab.gae,
    """Generalized Advantage Estimation over one stream of T steps.

    rewards, values, next_values (T,) float: values = V(s_t), next_values = V(s_t+1) (old critic).
    terminated, boundary (T,) bool: terminated stops the bootstrap; boundary (episode end, rollout
    cut, time limit) stops the recursion. terminated implies boundary.
        delta_t = r_t + gamma * V(s_t+1) * (1 - terminated_t) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - boundary_t) * A_t+1       (backwards in t)
        returns = A + values
    Returns (advantages, returns), both (T,) WITHOUT gradient (detach the values).
    Source: Schulman et al. 2015, GAE, arXiv 1506.02438, eq. 16.""",
    (
        Case("hand: two steps, gamma 1, lam 0.5",
             given(t([0.0, 1.0]), t([0.5, 0.8]), t([0.8, 0.0]), torch.tensor([False, True]),
                   torch.tensor([False, True]), gamma=1.0, lam=0.5),
             (t([0.4, 0.2]), t([0.9, 1.0])),
             "go backwards: A_t = delta_t + gamma * lam * A_t+1, and returns = advantages + values",
             "gaes-weights"),
        Case("hand: a time limit still bootstraps",
             given(t([1.0]), t([0.0]), t([2.0]), torch.tensor([False]), torch.tensor([True]), gamma=0.5, lam=0.9),
             (t([2.0]), t([2.0])),
             "only `terminated` stops the bootstrap gamma * V(next); a time limit (boundary only) keeps it",
             "terminal-or-time-limit-where-the-stream-is-cut"),
        Case("hand: a boundary stops the trace",
             given(t([0.0, 1.0]), t([0.0, 0.0]), t([0.0, 0.0]), torch.tensor([False, True]),
                   torch.tensor([True, True]), gamma=1.0, lam=1.0),
             (t([0.0, 1.0]), t([0.0, 1.0])),
             "`boundary` (not `terminated`) stops the recursion: the next episode's credit must not leak back",
             "terminal-or-time-limit-where-the-stream-is-cut"),
        Case("gradient: the outputs carry none",
             given(leaf([0.0, 1.0]), leaf([0.5, 0.8]), leaf([0.8, 0.0]), torch.tensor([False, True]),
                   torch.tensor([False, True]), gamma=1.0, lam=0.5),
             False,
             "advantages and returns are targets: detach rewards, values AND next_values before computing them",
             "the-atom", measure=output_requires_grad),
        Case("reference: seeded random stream (T=12) with episode ends, against a Python loop",
             given(random_leaf((12,), 9), random_leaf((12,), 10), random_leaf((12,), 11),
                   lambda: _random_flags()[0], lambda: _random_flags()[1], gamma=0.9, lam=0.8),
             _gae_loop,
             "bootstrap with next_values where not terminated, reset the trace at every boundary",
             "gaes-weights"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 04 reusing a batch: importance weights
# ---------------------------------------------------------------------------------------------

TRUNCATED_IMPORTANCE_WEIGHTS = Exercise(
    "truncated_importance_weights", "04-reusing-a-batch", rl_lab.truncated_importance_weights,
    """Truncated importance weights for a sampler that differs from the trainer.

    old_logps (...) float: the trainer's log-probs of the sampled tokens; rollout_logps (...) the
    sampler's log-probs of the same tokens; cap >= 1.
        w = min(exp(old_logps - rollout_logps), cap)
    Returns (...) weights WITHOUT gradient (detach). Source: Espeholt et al. 2018, IMPALA,
    arXiv 1802.01561, sec. 4.1 (truncated importance sampling).""",
    (
        Case("hand: trainer over sampler, capped",
             given(t([0.0, LN(3.0), -1.0]), t([0.0, 0.0, 0.0]), 2.0), t([1.0, 2.0, math.exp(-1.0)]),
             "w = exp(old - rollout): the trainer's probability over the sampler's (not the inverse)",
             "the-derivation"),
        Case("hand: the cap is the largest weight itself",
             given(t([LN(1.5), LN(5.0)]), t([0.0, 0.0]), 4.0), t([1.5, 4.0]),
             "cap bounds the weight itself, min(w, cap): not 1 + cap, and no lower bound",
             "the-derivation"),
        Case("hand: log-probs near -800",
             given(t([-800.0, -800.0]), t([-800.5, -799.0]), 2.0), t([math.exp(0.5), math.exp(-1.0)]),
             "w = exp(old - rollout), one exponential of the difference: exp(old) / exp(rollout) is 0 / 0",
             "the-derivation"),
        Case("gradient: the weights carry none",
             given(leaf([0.0, -1.0]), leaf([0.0, 0.0])), False,
             "the weights are constants of the batch: detach both log-probs (or the result)",
             "the-derivation", measure=output_requires_grad),
        Case("reference: seeded random (12,) against a Python loop",
             given(random_leaf((12,), 12), random_leaf((12,), 13), 1.5),
             lambda old, rollout, cap=2.0, **_: t([min(math.exp(o - r), cap)
                                                  for o, r in zip(old.tolist(), rollout.tolist())]),
             "elementwise min(exp(old - rollout), cap)",
             "the-derivation"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 05 trust regions: the clip, CISPO's cap, the sequence ratio
# ---------------------------------------------------------------------------------------------


def _clipped_loop(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, **_):
    high = epsilon if epsilon_high is None else epsilon_high
    out = []
    for lp, old, a in zip(logp.tolist(), old_logp.tolist(), advantages.tolist()):
        ratio = math.exp(lp - old)
        loss = -min(ratio * a, min(max(ratio, 1.0 - epsilon), 1.0 + high) * a)
        if dual_clip is not None and a < 0:
            loss = min(loss, -dual_clip * a)
        out.append(loss)
    return t(out)


_FOUR_RATIOS = [LN(1.5), LN(0.5), LN(1.5), LN(0.5)]
_FOUR_SIGNS = [1.0, -1.0, -1.0, 1.0]

CLIPPED_POLICY_LOSS = Exercise(
    "clipped_policy_loss", "05-trust-regions", rl_lab.clipped_policy_loss,
    """PPO-Clip, elementwise, to MINIMIZE.

    logp (...) float, gradient flows; old_logp (...) DETACH (the ratio's denominator stays fixed);
    advantages (...) DETACH.
        ratio = exp(logp - old_logp)
        loss  = max(-ratio * A, -clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)   (= -min of the two)
        epsilon_high None means epsilon;
        dual_clip c (None: off): where A < 0, loss = min(loss, -c * A).
    Returns (...) no reduction. Source: Schulman et al. 2017, PPO, arXiv 1707.06347, eq. 7; DAPO
    arXiv 2503.14476 eq. 10 (clip-higher); Ye et al. 2019, arXiv 1912.09729 (dual-clip).""",
    (
        Case("invariant: at ratio 1 the loss is -A",
             given(t([-0.3, -1.2, -2.0]), t([-0.3, -1.2, -2.0]), t([0.7, -1.3, 2.5])), t([-0.7, 1.3, -2.5]),
             "ratio = exp(logp - old_logp), and the loss is the NEGATIVE objective (it is minimized)",
             "the-derivation"),
        Case("hand: the ratio's direction, inside the clip (ratio e^0.1 = 1.10517)",
             given(t([-1.0, -1.0]), t([-1.1, -1.1]), t([1.0, -1.0])), t([-math.exp(0.1), math.exp(0.1)]),
             "the ratio is the new policy over the old one: exp(logp - old_logp), not exp(old_logp - logp)",
             "the-derivation"),
        Case("hand: ratios 1.5 / 0.5 with A = +1 / -1",
             given(t(_FOUR_RATIOS), t([0.0] * 4), t(_FOUR_SIGNS)), t([-1.2, 0.8, 1.5, -0.5]),
             "take the pessimistic branch: max(-r*A, -clip(r)*A), i.e. -min of the objectives (not -max)",
             "the-derivation"),
        Case("gradient: zero where the clip binds, -A*r elsewhere",
             given(lambda: t(_FOUR_RATIOS, requires_grad=True), t([0.0] * 4), t(_FOUR_SIGNS)),
             t([0.0, 0.0, 1.5, -0.5]),
             "clip the ratio, not logp or the loss: where the clip binds the gradient is 0",
             "the-derivation", measure=gradient_of(0)),
        Case("gradient: -A*r inside the clip range too (ratio 1.1, epsilon 0.2)",
             given(leaf([LN(1.1), LN(1.1)]), t([0.0, 0.0]), t([1.0, -1.0])), t([-1.1, 1.1]),
             "inside the clip range both branches are equal and the gradient is the unclipped one's, -A*r: "
             "torch.maximum of two equal values splits it in half, and a detached clip branch shows it",
             "the-derivation", measure=gradient_of(0)),
        Case("hand: log-probs near -800 give ratio 1, not nan",
             given(t([-800.0, -800.0]), t([-800.0, -800.5]), t([1.0, 1.0])), t([-1.0, -1.2]),
             "ratio = exp(logp - old_logp), one exponential of the difference: exp(logp) / exp(old_logp) is 0 / 0",
             "the-derivation"),
        Case("gradient: old_logp gets none",
             given(t([-1.0, -2.0]), leaf([-1.1, -1.9]), t([1.0, -1.0])), t([0.0, 0.0]),
             "detach old_logp: the ratio's denominator is the sampling policy, fixed during the epochs",
             "the-derivation", measure=gradient_of(1)),
        Case("gradient: advantages get none",
             given(t([-1.0, -2.0]), t([-1.1, -1.9]), leaf([1.0, -1.0])), t([0.0, 0.0]),
             "detach the advantages: the policy loss must not move them",
             "the-derivation", measure=gradient_of(2)),
        Case("hand: epsilon_high widens the upper end only",
             given(t([LN(1.5), LN(0.5)]), t([0.0, 0.0]), t([1.0, -1.0]), epsilon=0.2, epsilon_high=0.28),
             t([-1.28, 0.8]),
             "clip(ratio, 1 - epsilon, 1 + epsilon_high): epsilon_high moves the upper end, epsilon the lower",
             "the-gradient-weight-of-each-method"),
        Case("hand: epsilon_high 0 caps the ratio at 1 (it is a value, not 'unset')",
             given(t([LN(1.5)]), t([0.0]), t([1.0]), epsilon=0.2, epsilon_high=0.0), t([-1.0]),
             "only None means 'use epsilon': test `epsilon_high is None`, not its truth (0.0 is a bound)",
             "the-gradient-weight-of-each-method"),
        Case("hand: dual_clip caps the loss of A < 0 only",
             given(t([LN(5.0), LN(5.0), LN(0.5)]), t([0.0] * 3), t([-1.0, 1.0, -2.0]), dual_clip=3.0),
             t([3.0, -1.2, 1.6]),
             "dual_clip c applies where A < 0 only: loss = min(loss, -c * A) there",
             "the-gradient-weight-of-each-method"),
        Case("reference: seeded random (30,), epsilon 0.1, epsilon_high 0.3, dual_clip 2, against a loop",
             given(random_leaf((30,), 14, scale=0.6), random_leaf((30,), 15, scale=0.6), random_leaf((30,), 16),
                   epsilon=0.1, epsilon_high=0.3, dual_clip=2.0),
             _clipped_loop,
             "every case together: the ratio, the asymmetric clip, the pessimistic max, the dual clip",
             "the-derivation"),
    ),
)


def _cispo_loop(policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon_high=5.0, beta=0.1, **_):
    per_sequence = []
    for n in range(policy_logps.shape[0]):
        total, count = 0.0, 0
        for r in range(policy_logps.shape[1]):
            if not completion_mask[n, r]:
                continue
            lp, old, ref = policy_logps[n, r].item(), old_logps[n, r].item(), ref_logps[n, r].item()
            weight = min(math.exp(lp - old), epsilon_high)
            delta = ref - lp
            total += -(weight * advantages[n].item() * lp - beta * (math.exp(delta) - delta - 1.0))
            count += 1
        per_sequence.append(total / max(count, 1))
    return t(sum(per_sequence) / len(per_sequence))


_CAPPED = [-3.0 + LN(10.0)]  # ratio 10 against old_logp -3

CISPO_POLICY_LOSS = Exercise(
    "cispo_policy_loss", "05-trust-regions", rl_lab.cispo_policy_loss,
    """CISPO's token loss: a capped, DETACHED importance weight times the log-prob.

    policy_logps (N, R) float, gradient flows; old_logps, ref_logps (N, R): detach; advantages (N,)
    one per sequence: detach; completion_mask (N, R) 0/1.
        weight  = detach(min(exp(policy - old), epsilon_high))      # an ABSOLUTE cap, not 1 + eps
        per_tok = -(weight * A * policy_logp - beta * k3)           k3 = exp(ref - policy) - (ref - policy) - 1
        loss    = mean over sequences of (mean over the sequence's kept tokens)   (reduction="sequence")
    The cases use reduction="sequence" and leave max_new_tokens, kl_estimator, importance_weights
    at their defaults; you may ignore those. Returns a scalar.
    Source: MiniMax-M1, arXiv 2506.13585, sec. 3.1, eq. 4.""",
    (
        Case("hand: on-policy, beta 0: -(A * logp) averaged over the tokens",
             given(t([[-1.0, -2.0]]), t([[-1.0, -2.0]]), t([[-1.0, -2.0]]), t([1.0]), torch.tensor([[1, 1]]),
                   beta=0.0),
             t(1.5),
             "the policy term is weight * A * logp (a weighted log-likelihood), not weight * A",
             "the-gradient-weight-of-each-method"),
        Case("hand: ratio 10 is capped at epsilon_high 5",
             given(t([_CAPPED]), t([[-3.0]]), t([[-3.0]]), t([2.0]), torch.tensor([[1]]), beta=0.0),
             t(-10.0 * _CAPPED[0]),
             "epsilon_high is an ABSOLUTE cap on the ratio: weight = min(ratio, epsilon_high), not 1 + epsilon_high",
             "the-gradient-weight-of-each-method"),
        Case("gradient: a capped token still passes gradient",
             given(lambda: t([_CAPPED], requires_grad=True), t([[-3.0]]), t([[-3.0]]), t([2.0]), torch.tensor([[1]]),
                   beta=0.0),
             t([[-10.0]]),
             "CISPO caps the weight, it does not drop the token: the gradient -weight * A flows through logp",
             "the-gradient-weight-of-each-method", measure=gradient_of(0)),
        Case("gradient: the weight is detached (-A / n at ratio 1)",
             given(leaf([[-1.0, -2.0]]), t([[-1.0, -2.0]]), t([[-1.0, -2.0]]), t([1.0]), torch.tensor([[1, 1]]),
                   beta=0.0),
             t([[-0.5, -0.5]]),
             "detach the weight (sg): only logp is differentiated, so at ratio 1 the gradient is GRPO's -A / n",
             "the-gradient-weight-of-each-method", measure=gradient_of(0)),
        Case("hand: the KL term is + beta * k3 per token",
             given(t([[-1.0]]), t([[-1.0]]), t([[-1.5]]), t([0.0]), torch.tensor([[1]]), beta=0.1),
             t(0.1 * (math.exp(-0.5) + 0.5 - 1.0)),
             "add + beta * k3 with k3 = exp(ref - policy) - (ref - policy) - 1 (ref over policy: the direction)",
             "the-gradient-weight-of-each-method"),
        Case("gradient: beta * (1 - exp(ref - policy)) from the KL term, on top of -A / n",
             given(leaf([[-1.0, -2.0]]), t([[-1.0, -2.0]]), t([[-1.5, -1.0]]), t([1.0]), torch.tensor([[1, 1]]),
                   beta=0.1),
             t([[0.5 * (-1.0 + 0.1 * (1.0 - math.exp(-0.5))), 0.5 * (-1.0 + 0.1 * (1.0 - math.exp(1.0)))]]),
             "the KL term is differentiated through policy_logps: do not detach the policy inside k3",
             "the-gradient-weight-of-each-method", measure=gradient_of(0)),
        Case("gradient: ref_logps get none",
             given(t([[-1.0]]), t([[-1.0]]), leaf([[-1.5]]), t([1.0]), torch.tensor([[1]]), beta=0.1), t([[0.0]]),
             "detach ref_logps: the reference is frozen",
             "the-gradient-weight-of-each-method", measure=gradient_of(2)),
        Case("gradient: the advantages get none",
             given(t([[-1.0]]), t([[-1.0]]), t([[-1.5]]), leaf([1.0]), torch.tensor([[1]]), beta=0.1), t([0.0]),
             "detach the advantages: the policy loss must not move them",
             "the-gradient-weight-of-each-method", measure=gradient_of(3)),
        Case("hand: masked positions are left out of the mean",
             given(t([[-1.0, 0.0]]), t([[-1.0, -3.0]]), t([[-1.0, 5.0]]), t([1.0]), torch.tensor([[1, 0]])),
             t(1.0),
             "average over each sequence's KEPT tokens only: masked positions add nothing and are not counted",
             "the-gradient-weight-of-each-method"),
        Case("hand: a masked position may hold any filler (-1e9 here)",
             given(t([[-1.0, -1e9]]), t([[-1.0, -3.0]]), t([[-1.0, 5.0]]), t([1.0]), torch.tensor([[1, 0]])),
             t(1.0),
             "select the kept tokens (or torch.where) before exp and the products: a masked -1e9 gives "
             "exp(ref + 1e9) = inf, and inf * 0 = nan",
             "the-gradient-weight-of-each-method"),
        Case("reference: seeded random (N=3, R=4) with a mask, epsilon_high 1.5, beta 0.1, against a loop",
             given(random_leaf((3, 4), 17, scale=0.5), random_leaf((3, 4), 18, scale=0.5),
                   random_leaf((3, 4), 19, scale=0.5), random_leaf((3,), 20),
                   torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]), epsilon_high=1.5, beta=0.1),
             _cispo_loop,
             "cap, detach, weight the log-prob, add the KL, then mean per sequence and mean over sequences",
             "the-gradient-weight-of-each-method"),
    ),
)

SEQUENCE_LOG_RATIO = Exercise(
    "sequence_log_ratio", "05-trust-regions", rl_lab.sequence_log_ratio,
    """GSPO's log sequence ratio: the MEAN of (logp - old_logp) over each sequence's kept tokens.

    policy_logps (N, R) float, gradient flows; old_logps (N, R): detach; completion_mask (N, R) 0/1.
        log s_i = sum_t m * (policy - old) / max(sum_t m, 1)
    Returns (N,). exp(log s_i) is the geometric mean of the token ratios.
    Source: Zheng et al. 2025, GSPO, arXiv 2507.18071, eq. 7.""",
    (
        Case("hand: the mean over the kept tokens",
             given(t([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]]), t([[-2.0, -2.0, 0.0], [-2.0, 3.0, 3.0]]),
                   torch.tensor([[1, 1, 0], [1, 0, 0]])),
             t([0.5, 1.5]),
             "divide by the number of KEPT tokens (a mean, not a sum; not by R) and skip masked positions",
             "gspos-sequence-ratio"),
        Case("hand: a row with no kept token gives 0",
             given(t([[-1.0, -2.0]]), t([[0.0, 0.0]]), torch.tensor([[0, 0]])), t([0.0]),
             "clamp the kept count to at least 1: an empty row is 0, never 0/0",
             "gspos-sequence-ratio"),
        Case("hand: 800 kept tokens at log-ratio 1 give 1",
             given(lambda: torch.ones(1, 800, dtype=DTYPE), lambda: torch.zeros(1, 800, dtype=DTYPE),
                   torch.ones(1, 800, dtype=torch.long)), t([1.0]),
             "average the log-ratios: the product of 800 ratios e^1 overflows before its log is taken",
             "gspos-sequence-ratio"),
        Case("gradient: 1 / n on each kept token",
             given(leaf([[-1.0, -2.0, -9.0], [-0.5, 0.0, 0.0]]), t([[-2.0, -2.0, 0.0], [-2.0, 3.0, 3.0]]),
                   torch.tensor([[1, 1, 0], [1, 0, 0]])),
             t([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]),
             "every kept token has the share 1 / n_i of its sequence's log-ratio; masked tokens none",
             "gspos-sequence-ratio", measure=gradient_of(0)),
        Case("gradient: old_logps get none",
             given(t([[-1.0, -2.0]]), leaf([[-2.0, -2.0]]), torch.tensor([[1, 1]])), t([[0.0, 0.0]]),
             "detach old_logps: they belong to the sampling policy",
             "gspos-sequence-ratio", measure=gradient_of(1)),
    ),
)

# ---------------------------------------------------------------------------------------------
# 06 the KL-regularized objective: exact KL and the k1/k2/k3 estimators
# ---------------------------------------------------------------------------------------------

_KL_DOC = """
    policy_logps (...) float: log-probs (nats) of the sampled tokens under the policy, gradient flows;
    ref_logps (...) same shape: the frozen reference, DETACH it.
    Returns (...) per token, no reduction. Source: Schulman 2020, "Approximating KL Divergence"."""

KL_K1 = Exercise(
    "kl_k1", "06-kl-regularized-objective", rl_lab.kl_k1,
    """k1, the plain log-ratio estimator of KL(policy || ref), per token.

        k1 = policy_logp - ref_logp""" + _KL_DOC,
    (
        Case("hand: policy minus reference",
             given(t([-1.0, -2.0]), t([-2.0, -1.0])), t([1.0, -1.0]),
             "k1 = log pi - log ref (policy minus reference), not the other way round",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("hand: (2, 2) log-probs near -800, one 800 nats from the reference",
             given(t([[-800.0, -1.0], [-3.0, -2.0]]), t([[-801.0, -801.0], [-2.0, -2.0]])),
             t([[1.0, 800.0], [-1.0, 0.0]]),
             "subtract the log-probs (log of a ratio of exponentials is nan near -800), and keep their shape",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("gradient: 1 for every token",
             given(leaf([-1.0, -2.0]), t([-2.0, -1.0])), t([1.0, 1.0]),
             "k1 is linear in policy_logp: its gradient is 1",
             "estimating-the-kl-from-samples-k1-k2-k3", measure=gradient_of(0)),
        Case("gradient: the reference gets none",
             given(t([-1.0, -2.0]), leaf([-2.0, -1.0])), t([0.0, 0.0]),
             "detach ref_logps: the reference is frozen",
             "estimating-the-kl-from-samples-k1-k2-k3", measure=gradient_of(1)),
    ),
)

KL_K2 = Exercise(
    "kl_k2", "06-kl-regularized-objective", rl_lab.kl_k2,
    """k2, half the squared log-ratio, per token.

        k2 = 0.5 * (policy_logp - ref_logp) ** 2""" + _KL_DOC,
    (
        Case("hand: half the square",
             given(t([-1.0, -2.0]), t([-3.0, -1.5])), t([2.0, 0.125]),
             "k2 = 0.5 * (policy - ref)**2: the factor 1/2 makes its gradient the log-ratio",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("hand: log-probs near -800, one 800 nats from the reference",
             given(t([-800.0, -1.0]), t([-801.0, -801.0])), t([0.5, 320000.0]),
             "half the square of the difference of the log-probs: never a log of a ratio of exponentials",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("gradient: the log-ratio",
             given(leaf([-1.0, -2.0]), t([-3.0, -1.5])), t([2.0, -0.5]),
             "d k2 / d policy = policy - ref",
             "estimating-the-kl-from-samples-k1-k2-k3", measure=gradient_of(0)),
        Case("gradient: the reference gets none",
             given(t([-1.0, -2.0]), leaf([-3.0, -1.5])), t([0.0, 0.0]),
             "detach ref_logps: the reference is frozen",
             "estimating-the-kl-from-samples-k1-k2-k3", measure=gradient_of(1)),
    ),
)

KL_K3 = Exercise(
    "kl_k3", "06-kl-regularized-objective", rl_lab.kl_k3,
    """k3, the estimator GRPO uses, per token (the lab's token_kl_penalty).

        delta = ref_logp - policy_logp
        k3    = exp(delta) - delta - 1          (>= 0, 0 where policy == ref)""" + _KL_DOC,
    (
        Case("hand: exp(delta) - delta - 1 with delta = ref - policy",
             given(t([-1.0, -2.0]), t([-2.0, -1.0])), t([math.exp(-1.0), math.exp(1.0) - 2.0]),
             "delta = ref - policy (swapped, exp(policy - ref) - ... - 1 has a mean under pi that is no KL at all)",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("invariant: 0 where policy equals reference",
             given(random_leaf((6,), 21), random_leaf((6,), 21)), t([0.0] * 6),
             "k3 = exp(delta) - delta - 1 is exactly 0 at delta = 0: do not forget the -1",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("hand: log-probs near -800, and a reference 800 nats below the policy",
             given(t([-800.0, -1.0]), t([-801.0, -801.0])), t([math.exp(-1.0), 799.0]),
             "compute delta = ref - policy first, then exp(delta) - delta - 1: exp(ref) / exp(policy) is 0 / 0 "
             "near -800, and log of an underflowed ratio is -inf",
             "estimating-the-kl-from-samples-k1-k2-k3"),
        Case("gradient: 1 - exp(ref - policy)",
             given(leaf([-1.0, -2.0]), t([-2.0, -1.0])), t([1.0 - math.exp(-1.0), 1.0 - math.exp(1.0)]),
             "policy_logp enters delta with a minus sign: d k3 / d policy = 1 - exp(ref - policy)",
             "estimating-the-kl-from-samples-k1-k2-k3", measure=gradient_of(0)),
        Case("gradient: the reference gets none",
             given(t([-1.0, -2.0]), leaf([-2.0, -1.0])), t([0.0, 0.0]),
             "detach ref_logps: the reference is frozen",
             "estimating-the-kl-from-samples-k1-k2-k3", measure=gradient_of(1)),
    ),
)


def _categorical_kl_loop(logits, reference_logits, **_):
    def log_softmax(row):
        top = max(row)
        normalizer = top + math.log(sum(math.exp(x - top) for x in row))
        return [x - normalizer for x in row]

    flat_p = logits.reshape(-1, logits.shape[-1]).tolist()
    flat_q = reference_logits.reshape(-1, logits.shape[-1]).tolist()
    out = []
    for row_p, row_q in zip(flat_p, flat_q):
        log_p, log_q = log_softmax(row_p), log_softmax(row_q)
        out.append(sum(math.exp(lp) * (lp - lq) for lp, lq in zip(log_p, log_q)))
    return t(out).reshape(logits.shape[:-1])


_KL_HAND = 0.75 * LN(1.5) + 0.25 * LN(0.5)  # KL((3/4, 1/4) || uniform), the hand case's value

CATEGORICAL_KL = Exercise(
    "categorical_kl", "06-kl-regularized-objective", rl_lab.categorical_kl,
    """The exact KL(softmax(logits) || softmax(reference_logits)) over the last axis, in nats.

    logits (..., A) float, gradient flows; reference_logits (..., A): DETACH.
        KL = sum_a p(a) * (log p(a) - log q(a)),   log p = log_softmax(logits), log q likewise
    Returns (...). Use log_softmax, never log(softmax(...)). Source: the definition of the
    Kullback-Leibler divergence (the lab's categorical_kl; the bandit's KL term).""",
    (
        Case("hand: p = (3/4, 1/4) against the uniform",
             given(t([[LN(3.0), 0.0]]), t([[0.0, 0.0]])),
             t([0.75 * LN(1.5) + 0.25 * LN(0.5)]),
             "weight by the POLICY p (KL(p || q), the direction), with log_softmax of both logits",
             "which-kl-reverse-and-forward"),
        Case("invariant: logits shifted by a constant are the same distribution",
             given(t([[1.0, -2.0, 0.5]]), t([[6.0, 3.0, 5.5]])), t([0.0]),
             "normalize with log_softmax: raw logits are not log-probabilities",
             "which-kl-reverse-and-forward"),
        Case("gradient: the reference gets none",
             given(t([[LN(3.0), 0.0]]), leaf([[0.0, 0.0]])), t([[0.0, 0.0]]),
             "detach reference_logits: the reference is frozen",
             "which-kl-reverse-and-forward", measure=gradient_of(1)),
        Case("gradient: d KL / d logits_a = p(a) * (log p(a) - log q(a) - KL), for p = (3/4, 1/4)",
             given(leaf([[LN(3.0), 0.0]]), t([[0.0, 0.0]])),
             t([[0.75 * (LN(1.5) - _KL_HAND), 0.25 * (LN(0.5) - _KL_HAND)]]),
             "the gradient flows through the policy's log_softmax AND through the weights p: detach neither",
             "which-kl-reverse-and-forward", measure=gradient_of(0)),
        Case("hand: p = (1, e^-800) against the uniform is ln 2, not nan",
             given(t([[0.0, -800.0]]), t([[0.0, 0.0]])), t([LN(2.0)]),
             "log(softmax(...)) gives log 0 = -inf and 0 * -inf = nan: take log_softmax, and p = its exp",
             "which-kl-reverse-and-forward"),
        Case("hand: the uniform against q = (1, e^-800) is 400 - ln 2, not inf",
             given(t([[0.0, 0.0]]), t([[0.0, -800.0]])), t([400.0 - LN(2.0)]),
             "log_softmax for the reference too: log(softmax(...)) of a -800 logit is -inf",
             "which-kl-reverse-and-forward"),
        Case("reference: seeded random (2, 3, 4) against a Python loop",
             given(random_leaf((2, 3, 4), 22, scale=1.5), random_leaf((2, 3, 4), 23, scale=1.5)),
             _categorical_kl_loop,
             "sum over the LAST axis only (the actions), one KL per row",
             "which-kl-reverse-and-forward"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 07 preferences: DPO
# ---------------------------------------------------------------------------------------------


def _dpo_loop(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, **_):
    out = []
    for c, r, rc, rr in zip(chosen.tolist(), rejected.tolist(), ref_chosen.tolist(), ref_rejected.tolist()):
        x = beta * ((c - r) - (rc - rr))
        out.append(math.log1p(math.exp(-x)) if x > 0 else -x + math.log1p(math.exp(x)))  # -log sigmoid(x)
    return t(out)


DPO_LOSS = Exercise(
    "dpo_loss", "07-preferences", rl_lab.dpo_loss,
    """The DPO loss, per pair.

    chosen, rejected (B,) float: sequence-SUMMED log-probs of the preferred and the dispreferred
    answer under the policy, gradient flows; ref_chosen, ref_rejected (B,): the reference, DETACH.
        margin = (chosen - rejected) - (ref_chosen - ref_rejected)
        loss   = -logsigmoid(beta * margin)       (F.logsigmoid, never log(sigmoid(...)))
    Returns (B,). Source: Rafailov et al. 2023, DPO, arXiv 2305.18290, eq. 7.""",
    (
        Case("invariant: ln 2 at policy = reference",
             given(t([-2.0, -5.0]), t([-3.0, -1.0]), t([-2.0, -5.0]), t([-3.0, -1.0])), t([LN(2.0), LN(2.0)]),
             "at policy = reference the margin is 0 and -log sigmoid(0) = ln 2: subtract the reference's margin",
             "dpo-from-the-kl-optimum"),
        Case("hand: margin 2, beta 0.5",
             given(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.0]), beta=0.5), t([math.log1p(math.exp(-1.0))]),
             "margin = (chosen - rejected) - (ref_chosen - ref_rejected), times beta, inside -logsigmoid",
             "dpo-from-the-kl-optimum"),
        Case("hand: a margin of -1000 gives a loss of 1000, not inf",
             given(t([-1000.0]), t([0.0]), t([0.0]), t([0.0]), beta=1.0), t([1000.0]),
             "use F.logsigmoid: log(sigmoid(x)) underflows to -inf for x << 0",
             "the-formula-as-the-atoms-compute-it"),
        Case("gradient: -1 at a margin of -1000 and 0 at +1000, not nan",
             given(leaf([-1000.0, 1000.0]), t([0.0, 0.0]), t([0.0, 0.0]), t([0.0, 0.0]), beta=1.0), t([-1.0, 0.0]),
             "F.logsigmoid's gradient is finite at any margin; a hand-written log1p(exp(...)) branch sends inf / inf "
             "= nan back from the branch torch.where does not pick",
             "the-formula-as-the-atoms-compute-it", measure=gradient_of(0)),
        Case("gradient: -beta * sigmoid(-beta * margin) on chosen",
             given(leaf([-2.0, -1.0]), t([-2.0, -3.0]), t([-2.0, -2.0]), t([-2.0, -2.0]), beta=0.5),
             t([-0.25, -0.5 / (1.0 + math.exp(1.0))]),
             "d loss / d chosen = -beta * sigmoid(-beta * margin): raising the chosen answer lowers the loss",
             "dpo-from-the-kl-optimum", measure=gradient_of(0)),
        Case("gradient: +beta * sigmoid(-beta * margin) on rejected",
             given(t([-2.0, -1.0]), leaf([-2.0, -3.0]), t([-2.0, -2.0]), t([-2.0, -2.0]), beta=0.5),
             t([0.25, 0.5 / (1.0 + math.exp(1.0))]),
             "the gradient flows into rejected too (detach only the reference): DPO pushes the dispreferred "
             "answer down as it pulls the preferred one up",
             "dpo-from-the-kl-optimum", measure=gradient_of(1)),
        Case("gradient: the reference gets none",
             given(t([-1.0]), t([-2.0]), leaf([-1.5]), t([-1.0])), t([0.0]),
             "detach the reference log-probs: the reference is frozen",
             "dpo-from-the-kl-optimum", measure=gradient_of(2)),
        Case("gradient: the reference's rejected answer gets none",
             given(t([-1.0]), t([-2.0]), t([-1.5]), leaf([-1.0])), t([0.0]),
             "detach both reference log-probs, ref_rejected as ref_chosen: the reference is frozen",
             "dpo-from-the-kl-optimum", measure=gradient_of(3)),
        Case("reference: seeded random (8,), beta 0.3, against a Python loop",
             given(random_leaf((8,), 24, 3.0), random_leaf((8,), 25, 3.0), random_leaf((8,), 26, 3.0),
                   random_leaf((8,), 27, 3.0), beta=0.3),
             _dpo_loop,
             "elementwise, one loss per pair, no mean",
             "dpo-from-the-kl-optimum"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 08 groups: group-relative and leave-one-out advantages
# ---------------------------------------------------------------------------------------------


def _group_loop(rewards, epsilon=1e-8, scale="group", **_):
    out = []
    for row in rewards.tolist():
        mean = sum(row) / len(row)
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / len(row))  # population: divide by G
        tied = all(r == row[0] for r in row)
        out.append([0.0 if tied else (r - mean) / (std + epsilon) if scale == "group" else r - mean for r in row])
    return t(out)


GROUP_ADVANTAGES = Exercise(
    "group_advantages", "08-groups", rl_lab.group_advantages,
    """GRPO's group-relative advantages.

    rewards (B, G) float, G >= 2 samples of one prompt per row: DETACH.
        scale="group": A = (R - row mean) / (row POPULATION std + epsilon)    (divide by G, not G-1)
        scale="none":  A = R - row mean                                       (Dr. GRPO)
        ("batch", the std of all B*G rewards, is not graded.)
    A row of equal rewards gives EXACT zeros (set them: the float mean of equal values may differ).
    Returns (B, G) without gradient. Source: Shao et al. 2024, DeepSeekMath, arXiv 2402.03300,
    sec. 4.1.2; Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, sec. 3.1.""",
    (
        Case("hand: two samples, population std 0.5",
             given(t([[1.0, 0.0]])), t([[0.5 / (0.5 + 1e-8), -0.5 / (0.5 + 1e-8)]]),
             "divide by the POPULATION std (correction=0, divide by G): torch.std divides by G-1 by default",
             "what-the-std-does-to-a-prompts-weight"),
        Case("hand: one row per prompt, each with its own mean and std",
             given(t([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 4.0, 4.0]])),
             t([[0.75 / (math.sqrt(0.1875) + 1e-8)] + [-0.25 / (math.sqrt(0.1875) + 1e-8)] * 3,
                [-1.0 / (1.0 + 1e-8)] * 2 + [1.0 / (1.0 + 1e-8)] * 2]),
             "the mean and the std are per row (dim=1, keepdim=True): each prompt is its own group",
             "the-group-baseline"),
        Case("invariant: equal rewards give exact zeros",
             given(t([[0.1, 0.1, 0.1]])), t([[0.0, 0.0, 0.0]]),
             "a tied group teaches nothing: set its advantages to exactly 0 (its float mean need not equal "
             "the rewards, and (R - mean) / epsilon blows the rounding error up)",
             "tied-groups", exact=True),
        Case("invariant: a tied row of seven 0.1 gives exact zeros beside a row that varies",
             given(t([[0.1] * 7, [1.0] + [0.0] * 6])), t([0.0] * 7),
             "find the tied rows by comparing the rewards (not by the centred values, whose rounding need not be 0) "
             "and zero them row by row",
             "tied-groups", measure=first_row, exact=True),
        Case("hand: scale='none' subtracts the mean only",
             given(t([[1.0, 0.0, 0.0, 0.0]]), scale="none"), t([[0.75, -0.25, -0.25, -0.25]]),
             "scale='none' (Dr. GRPO) divides by nothing: A = R - row mean",
             "what-the-std-does-to-a-prompts-weight"),
        Case("hand: epsilon 0.5 is added to the std",
             given(t([[1.0, 0.0]]), epsilon=0.5), t([[0.5, -0.5]]),
             "use the epsilon given: A = (R - mean) / (std + epsilon)",
             "what-the-std-does-to-a-prompts-weight"),
        Case("invariant: equal rewards give exact zeros with scale='none' too",
             given(t([[0.1, 0.1, 0.1]]), scale="none"), t([[0.0, 0.0, 0.0]]),
             "set a tied group's advantages to exactly 0 whatever the scale: 0.1 - mean(0.1, 0.1, 0.1) is not 0",
             "tied-groups", exact=True),
        Case("gradient: the advantages carry none",
             given(leaf([[1.0, 0.0]])), False,
             "detach the rewards: advantages are constants of the batch",
             "the-group-baseline", measure=output_requires_grad),
        Case("reference: seeded random (3, 5), against a Python loop",
             given(random_leaf((3, 5), 28)), _group_loop,
             "(R - row mean) / (row population std + epsilon), row by row",
             "what-the-std-does-to-a-prompts-weight"),
    ),
)


def _rloo_loop(rewards, **_):
    out = []
    for row in rewards.tolist():
        out.append([r - (sum(row) - r) / (len(row) - 1) for r in row])
    return t(out)


RLOO_ADVANTAGES = Exercise(
    "rloo_advantages", "08-groups", rl_lab.rloo_advantages,
    """REINFORCE leave-one-out advantages: each sample's baseline is the mean of the OTHER samples.

    rewards (B, G) float, G >= 2: DETACH.
        A[b, i] = R[b, i] - (sum_j R[b, j] - R[b, i]) / (G - 1)      (= G / (G - 1) * (R - row mean))
    No std. A row of equal rewards gives exact zeros. Returns (B, G) without gradient.
    Source: Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al.
    2024, RLOO, arXiv 2402.14740.""",
    (
        Case("hand: one success among four",
             given(t([[1.0, 0.0, 0.0, 0.0]])), t([[1.0, -1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0]]),
             "leave the sample out of its own baseline: the mean of the OTHER G-1 rewards (divide by G-1)",
             "the-group-baseline"),
        Case("invariant: equal rewards give exact zeros",
             given(t([[0.1, 0.1, 0.1]])), t([[0.0, 0.0, 0.0]]),
             "a tied group teaches nothing: set its advantages to exactly 0",
             "tied-groups", exact=True),
        Case("invariant: a tied row of seven 0.1 gives exact zeros beside a row that varies",
             given(t([[0.1] * 7, [1.0] + [0.0] * 6])), t([0.0] * 7),
             "zero the tied rows themselves: R - mean of the others leaves a rounding error on seven 0.1",
             "tied-groups", measure=first_row, exact=True),
        Case("gradient: the advantages carry none",
             given(leaf([[1.0, 0.0]])), False,
             "detach the rewards: advantages are constants of the batch",
             "the-group-baseline", measure=output_requires_grad),
        Case("reference: seeded random (2, 5), against a Python loop",
             given(random_leaf((2, 5), 29)), _rloo_loop,
             "R[i] minus the mean of the others, row by row; no std",
             "the-group-baseline"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 09 sequences: reductions and the overlong penalty
# ---------------------------------------------------------------------------------------------

_LOSSES = [[1.0, 3.0, 100.0], [4.0, 100.0, 100.0]]  # 100: filler at masked positions
_KEPT = [[1, 1, 0], [1, 0, 0]]


def _reduce_loop(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None, **_):
    sums, counts = [], []
    for row, kept in zip(per_token_loss.tolist(), completion_mask.tolist()):
        sums.append(sum(value for value, keep in zip(row, kept) if keep))
        counts.append(sum(1 for keep in kept if keep))
    if reduction == "sequence":
        return t(sum(s / max(c, 1) for s, c in zip(sums, counts)) / len(sums))
    if reduction == "token":
        return t(sum(sums) / max(sum(counts), 1))
    return t(sum(sums) / (len(sums) * (max_new_tokens or per_token_loss.shape[1])))


REDUCE_TOKEN_LOSS = Exercise(
    "reduce_token_loss", "09-sequences", rl_lab.reduce_token_loss,
    """Reduce a per-token loss (N, R) to a scalar over the kept tokens.

    per_token_loss (N, R) float (masked positions may hold any filler); completion_mask (N, R) 0/1.
        "sequence": mean over each row's kept tokens (count clamped to >= 1), then mean over rows
        "token":    sum over all kept tokens / their number
        "constant": sum over all kept tokens / (N * max_new_tokens), R when max_new_tokens is None
    Returns a scalar. Source: DeepSeekMath eq. 3 ("sequence"); DAPO, arXiv 2503.14476, eq. 12
    ("token"); Dr. GRPO, arXiv 2503.20783, sec. 3.2 ("constant").""",
    (
        Case("hand: 'sequence', every answer weighs the same",
             given(t(_LOSSES), torch.tensor(_KEPT)), t(3.0),
             "'sequence': the mean over each row's kept tokens, then the mean of those means (not a token mean; "
             "divide by each row's kept count, not the padded length R)",
             "three-reductions"),
        Case("hand: 'token', every token weighs the same",
             given(t(_LOSSES), torch.tensor(_KEPT), reduction="token"), t(8.0 / 3.0),
             "'token': the sum over ALL kept tokens divided by their total count",
             "three-reductions"),
        Case("hand: 'constant' with max_new_tokens 4",
             given(t(_LOSSES), torch.tensor(_KEPT), reduction="constant", max_new_tokens=4), t(1.0),
             "'constant': the kept sum over N * max_new_tokens, a number that does not depend on the lengths",
             "three-reductions"),
        Case("hand: 'constant' without max_new_tokens uses R",
             given(t(_LOSSES), torch.tensor(_KEPT), reduction="constant"), t(8.0 / 6.0),
             "'constant' with max_new_tokens None divides by N * R",
             "three-reductions"),
        Case("hand: a row with no kept token",
             given(t([[5.0, 5.0], [2.0, 4.0]]), torch.tensor([[0, 0], [1, 1]])), t(1.5),
             "an empty row contributes 0 (clamp its count to 1) and still counts in the mean over rows",
             "three-reductions"),
        Case("hand: a masked position may hold any filler (inf here)",
             given(t([[2.0, math.inf], [2.0, 2.0]]), torch.tensor([[1, 0], [1, 1]])), t(2.0),
             "select the kept tokens (torch.where) instead of multiplying by the mask: inf * 0 = nan",
             "three-reductions"),
        Case("hand: 'token' over a batch with no kept token is 0",
             given(t([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[0, 0], [0, 0]]), reduction="token"), t(0.0),
             "clamp the token count to at least 1 under 'token' too: 0 / 0 is nan",
             "three-reductions"),
        Case("gradient: 1 / (n_i * N) on each kept token ('sequence')",
             given(lambda: t(_LOSSES, requires_grad=True), torch.tensor(_KEPT)),
             t([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]),
             "masked positions get no gradient; a kept token of a short answer weighs more under 'sequence'",
             "three-reductions", measure=gradient_of(0)),
        Case("reference: seeded random (4, 6) with a mask, 'token', against a Python loop",
             given(random_leaf((4, 6), 30), lambda: (torch.rand(4, 6, generator=seeded(31)) > 0.4).long(),
                   reduction="token"),
             _reduce_loop,
             "only kept tokens count, in the sum and in the count",
             "three-reductions"),
    ),
)


def _overlong_loop(lengths, max_new_tokens, cache, **_):
    start = max_new_tokens - cache
    return t([0.0 if n <= start else -1.0 if n > max_new_tokens else (start - n) / cache for n in lengths.tolist()])


OVERLONG_PENALTY = Exercise(
    "overlong_penalty", "09-sequences", rl_lab.overlong_penalty,
    """DAPO's soft overlong penalty, added to the reward.

    lengths (N,) int64 (tokens); max_new_tokens int >= 1; cache int in [1, max_new_tokens].
        0                                     if L <= max_new_tokens - cache
        ((max_new_tokens - cache) - L) / cache     if max_new_tokens - cache < L <= max_new_tokens
        -1                                    if L > max_new_tokens
    Returns (N,) float64 in [-1, 0]. Source: Yu et al. 2025, DAPO, arXiv 2503.14476, eq. 13.""",
    (
        Case("hand: max 10, cache 4",
             given(torch.tensor([5, 6, 7, 10, 11]), 10, 4), t([0.0, 0.0, -0.25, -1.0, -1.0]),
             "a penalty is negative: ((max - cache) - L) / cache falls from 0 at L = max - cache to -1 at L = max",
             "the-overlong-penalty"),
        Case("reference: every length 0..14 with max 12, cache 5, against a Python loop",
             given(torch.arange(15), 12, 5), _overlong_loop,
             "the three pieces meet at L = max - cache (0) and L = max (-1); beyond max it is -1",
             "the-overlong-penalty"),
    ),
)

# ---------------------------------------------------------------------------------------------
# 10 the whole loop: pass@k
# ---------------------------------------------------------------------------------------------


def _pass_at_k_grid(atom, args, kwargs):
    """measure: the atom on every (n, c, k) with 1 <= k <= n <= 8, 0 <= c <= n, as one tensor."""
    return t([float(atom(n, c, k)) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)])


PASS_AT_K = Exercise(
    "pass_at_k", "10-the-whole-loop", countdown.pass_at_k,
    """The unbiased estimator of pass@k from n samples of which c are correct.

    n, c, k ints with 1 <= k <= n, 0 <= c <= n. Returns a float in [0, 1].
        pass@k = 1 - C(n - c, k) / C(n, k)      (k of the n samples drawn WITHOUT replacement)
    Exactly 1.0 when n - c < k. Avoid factorials of large n: a product or math.comb works.
    Source: Chen et al. 2021, arXiv 2107.03374, eq. 1.""",
    (
        Case("hand: n=2, c=1, k=1", given(2, 1, 1), 0.5,
             "pass@1 is the success rate c / n", "passk-unbiased"),
        Case("hand: n=5, c=2, k=2", given(5, 2, 2), 0.7,
             "draw WITHOUT replacement: 1 - C(n-c, k) / C(n, k), not 1 - (1 - c/n)**k",
             "passk-unbiased"),
        Case("hand: n=4, c=3, k=2 is certain", given(4, 3, 2), 1.0,
             "when fewer than k samples are wrong every k-subset holds a correct one: exactly 1",
             "passk-unbiased"),
        Case("hand: no correct sample", given(5, 0, 3), 0.0,
             "with c = 0 no subset holds a correct sample: exactly 0",
             "passk-unbiased"),
        Case("hand: n=2000, c=10, k=1000 without overflow",
             given(2000, 10, 1000), 1.0 - math.comb(1990, 1000) / math.comb(2000, 1000),
             "no factorials: 1 - prod over i in (n-c, n] of (1 - k / i), or math.comb's integers",
             "passk-unbiased"),
        Case("reference: every n <= 8 against math.comb",
             given(), t([1.0 - math.comb(n - c, k) / math.comb(n, k)
                         for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]),
             "1 - C(n-c, k) / C(n, k) for every n, c, k",
             "passk-unbiased", measure=_pass_at_k_grid),
    ),
)

# The course's order: chapter by chapter, as the stubs appear in a learner's file.
EXERCISES = (
    RESPONSE_TOKEN_LOGPS, COMPLETION_MASK, REINFORCE_LOSS, GAE, TRUNCATED_IMPORTANCE_WEIGHTS, CLIPPED_POLICY_LOSS,
    CISPO_POLICY_LOSS, SEQUENCE_LOG_RATIO, KL_K1, KL_K2, KL_K3, CATEGORICAL_KL, DPO_LOSS, GROUP_ADVANTAGES,
    RLOO_ADVANTAGES, REDUCE_TOKEN_LOSS, OVERLONG_PENALTY, PASS_AT_K,
)
BY_NAME = {exercise.name: exercise for exercise in EXERCISES}


# ---------------------------------------------------------------------------------------------
# Running a case
# ---------------------------------------------------------------------------------------------


def _unusual(tensor):
    """Why the values of `tensor` cannot be read as numbers here (a sparse, nested or meta tensor), or None."""
    if tensor.is_nested or tensor.layout != torch.strided or tensor.device.type != "cpu":
        layout = "nested" if tensor.is_nested else str(tensor.layout).replace("torch.", "")
        return f"expected an ordinary CPU tensor, got a {layout} tensor on {tensor.device.type}"
    return None


def _dtype_differs(obtained, expected):
    """Why `obtained`'s dtype does not do for `expected`'s, or None: a float result in the expected float
    dtype (a float32 result cannot hold the float64 values to 1e-10); a bool result where bools are expected
    (~ of an integer mask is -1 and -2); an integer or bool result where integers are expected (a 0/1 mask
    may be either)."""
    if expected.is_floating_point():
        fits = obtained.dtype == expected.dtype
    elif expected.dtype == torch.bool:
        fits = obtained.dtype == torch.bool
    else:
        fits = not (obtained.is_floating_point() or obtained.is_complex())
    return None if fits else f"expected dtype {dtype_name(expected.dtype)}, got {dtype_name(obtained.dtype)}"


def compare(obtained, expected, exact=False):
    """None when `obtained` matches `expected` (tensors: dtype, shape and values within TOLERANCE, or
    exactly with exact=True; tuples item by item; floats; bools), else the reason in a few words.
    Never raises, whatever `obtained` is: it is a learner's return value."""
    if isinstance(expected, tuple):
        if not isinstance(obtained, (tuple, list)) or len(obtained) != len(expected):
            return f"expected a tuple of {len(expected)} tensors"
        for index, (mine, theirs) in enumerate(zip(obtained, expected)):
            reason = compare(mine, theirs, exact)
            if reason is not None:
                return f"output {index}: {reason}"
        return None
    if isinstance(expected, bool):
        return None if obtained is expected or (isinstance(obtained, bool) and obtained == expected) else "differs"
    if isinstance(expected, float):
        if isinstance(obtained, torch.Tensor) and obtained.numel() == 1 and _unusual(obtained) is None and (
                obtained.is_floating_point()):
            obtained = obtained.item()
        if isinstance(obtained, bool) or not isinstance(obtained, (int, float)):
            return f"expected a number, got {type(obtained).__name__}"
        return None if math.isclose(obtained, expected, rel_tol=TOLERANCE, abs_tol=TOLERANCE) else "differs"
    if not isinstance(obtained, torch.Tensor):
        return f"expected a tensor, got {type(obtained).__name__}"
    reason = _unusual(obtained) or _dtype_differs(obtained, expected)
    if reason is not None:
        return reason
    if tuple(obtained.shape) != tuple(expected.shape):
        return f"expected shape {tuple(expected.shape)}, got shape {tuple(obtained.shape)}"
    mine, theirs = obtained.detach().to(DTYPE), expected.detach().to(DTYPE)
    if exact:
        return None if torch.equal(mine, theirs) else "differs (exact values expected)"
    if torch.allclose(mine, theirs, rtol=TOLERANCE, atol=TOLERANCE):
        return None
    return _largest_difference(mine, theirs)


def _largest_difference(mine, theirs):
    """"differs", with where and by how much: values that print alike may still differ in the last
    digits, and a difference near 1e-7 is the mark of a float32 step in a float64 computation."""
    gaps = (mine - theirs).abs().nan_to_num(nan=math.inf)
    where = tuple(int(i) for i in torch.unravel_index(gaps.argmax(), gaps.shape)) if gaps.ndim else ()
    gap = float(gaps.max())
    if math.isnan(float(mine[where])):
        return f"differs: NaN at index {list(where)} (expected {float(theirs[where]):.10g})"
    text = f"differs: largest difference {gap:.3g} at index {list(where)} ({float(mine[where]):.10g} vs " \
           f"{float(theirs[where]):.10g})"
    if 1e-9 < gap < 1e-5:
        text += "; a difference this small usually means a float32 step (.float(), a Python float into a " \
                "float32 tensor): keep every tensor in the inputs' dtype, e.g. flags.to(values.dtype)"
    return text


def expected_value(case):
    """The case's expected value: written out, or computed by its slow reference on fresh inputs."""
    if not callable(case.expected):
        return case.expected
    args, kwargs = case.inputs()
    return case.expected(*args, **kwargs)


def _tensors(args, kwargs):
    """[(position or keyword, tensor)] of a call's tensor arguments."""
    return [(key, value) for key, value in [*enumerate(args), *kwargs.items()] if isinstance(value, torch.Tensor)]


def _changed_inputs(atom, copies, args, kwargs):
    """The names of the tensor arguments whose values or requires_grad differ from `copies` ((values,
    requires_grad) taken before the call: a detach_() cuts a caller's graph); a positional one is named by
    the atom's own parameter name. The cases' inputs hold no NaN."""
    try:
        names = list(inspect.signature(atom).parameters)
    except (TypeError, ValueError):  # a callable without a signature
        names = []
    changed = []
    for (key, value), (copy, requires_grad) in zip(_tensors(args, kwargs), copies):
        if value.shape != copy.shape or not torch.equal(value.detach(), copy) or value.requires_grad != requires_grad:
            changed.append(key if isinstance(key, str) else names[key] if key < len(names) else f"argument {key + 1}")
    return changed


def obtained_value(case, atom):
    """(what `atom` gives on the case, [the inputs it changed in place]); exceptions propagate: the caller
    reports them."""
    args, kwargs = case.inputs()
    copies = [(value.detach().clone(), value.requires_grad) for _, value in _tensors(args, kwargs)]
    obtained = atom(*args, **kwargs) if case.measure is None else case.measure(atom, args, kwargs)
    return obtained, _changed_inputs(atom, copies, args, kwargs)


def failure(case, atom):
    """None when `atom` passes `case`, else (reason, obtained, expected); exceptions propagate. An atom
    that changes an input in place fails whatever it returns: a caller's tensor would change under it."""
    expected = expected_value(case)
    obtained, changed = obtained_value(case, atom)
    if changed:
        return f"it changed {', '.join(changed)} in place: an atom leaves its inputs as they are", obtained, expected
    reason = compare(obtained, expected, case.exact)
    return None if reason is None else (reason, obtained, expected)
