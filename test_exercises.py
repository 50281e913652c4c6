"""Tests of exercises.py and exercise_cases.py: the lab's atoms pass every case, the stubs are "not
started", a learner's usual mistakes are caught with the hint that names them, and the commands.

    python -m unittest -v test_exercises
"""

import errno
import inspect
import io
import math
import os
import re
import sys
import tempfile
import unittest
from unittest import mock

import torch
import torch.nn.functional as F

import exercise_cases
import exercises
import rl_lab
from exercise_cases import BY_NAME, EXERCISES
from lab.io import MAX_INPUT_BYTES
from lab.testing import HERE, run_cli_in_process, run_main, single_thread_module

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train

# ---------------------------------------------------------------------------------------------
# Seeded mistakes: (exercise, the wrong function, a phrase of the hint that must name the mistake)
# ---------------------------------------------------------------------------------------------


def shift_off_by_one(logits, input_ids, response_mask, *, check=True):
    valid = response_mask[:, 1:]
    logp = F.log_softmax(logits[:, 1:], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, logp, torch.zeros_like(logp)), valid


def mask_forgotten(logits, input_ids, response_mask, *, check=True):
    logp = F.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return logp, response_mask[:, 1:]


def mask_drops_eos(completion_ids, eos_token_id, pad_mask=None, *, check=True):
    return (completion_ids != eos_token_id).long()


def reinforce_sign(logp, advantages, *, check=True):
    return advantages.detach() * logp


def reinforce_no_detach(logp, advantages, *, check=True):
    return -advantages * logp


def gae_boundary_stops_bootstrap(rewards, values, next_values, terminated, boundary, gamma=0.99, lam=0.95, *,
                                 check=True):
    advantages, running = [0.0] * len(rewards), 0.0
    for step in reversed(range(len(rewards))):
        cut = bool(boundary[step])  # the mistake: a time limit is treated as a terminal state
        delta = rewards[step].item() + (0.0 if cut else gamma * next_values[step].item()) - values[step].item()
        running = delta + (0.0 if cut else gamma * lam * running)
        advantages[step] = running
    advantages = torch.tensor(advantages, dtype=rewards.dtype)
    return advantages, advantages + values.detach()


def weights_inverted(old_logps, rollout_logps, cap=2.0, *, check=True):
    return (rollout_logps - old_logps).detach().exp().clamp(max=cap)


def clip_optimistic(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *, check=True):
    ratio = (logp - old_logp.detach()).exp()
    high = epsilon if epsilon_high is None else epsilon_high
    clipped = ratio.clamp(1 - epsilon, 1 + high)
    return torch.minimum(-ratio * advantages.detach(), -clipped * advantages.detach())  # min of the losses


def clip_ratio_inverted(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *, check=True):
    ratio = torch.exp(old_logp - logp)  # the mistake: the old policy over the new one
    high = epsilon if epsilon_high is None else epsilon_high
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - epsilon, 1 + high))


def clip_old_not_detached(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *, check=True):
    ratio = (logp - old_logp).exp()
    high = epsilon if epsilon_high is None else epsilon_high
    a = advantages.detach()
    loss = torch.maximum(-ratio * a, -ratio.clamp(1 - epsilon, 1 + high) * a)
    return loss if dual_clip is None else torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)


def cispo_weight_not_detached(policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon_high=5.0,
                              beta=0.1, reduction="sequence", max_new_tokens=None, *, kl_estimator=None,
                              importance_weights=None, check=True):
    mask = completion_mask.to(policy_logps.dtype)
    weight = (policy_logps - old_logps).exp().clamp(max=epsilon_high)  # the mistake: no detach
    delta = ref_logps - policy_logps
    per_token = -(weight * advantages.unsqueeze(1) * policy_logps - beta * (delta.exp() - delta - 1))
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def ratio_summed(policy_logps, old_logps, completion_mask, *, check=True):
    return ((policy_logps - old_logps.detach()) * completion_mask).sum(dim=1)


def k1_reversed(policy_logps, ref_logps, *, check=True):
    return ref_logps.detach() - policy_logps


def k2_without_half(policy_logps, ref_logps, *, check=True):
    return (policy_logps - ref_logps.detach()).square()


def k3_wrong_direction(policy_logps, ref_logps, *, check=True):
    delta = policy_logps - ref_logps.detach()
    return delta.exp() - delta - 1


def kl_weighted_by_reference(logits, reference_logits, *, check=True):
    logp, logq = F.log_softmax(logits, dim=-1), F.log_softmax(reference_logits.detach(), dim=-1)
    return (logq.exp() * (logq - logp)).sum(dim=-1)


def logps_of_softmax(logits, input_ids, response_mask, *, check=True):
    logp = torch.log(torch.softmax(logits[:, :-1], dim=-1))  # the mistake: underflows to log 0
    valid = response_mask[:, 1:].bool()
    token = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.where(valid, token, torch.zeros_like(token)), valid


def mask_eos_on_padding(completion_ids, eos_token_id, pad_mask=None, *, check=True):
    real = torch.ones_like(completion_ids, dtype=torch.bool) if pad_mask is None else pad_mask.bool()
    is_eos = completion_ids == eos_token_id  # the mistake: an EOS on padding counts as the end
    before = (is_eos.long().cumsum(dim=1) - is_eos.long()) == 0
    return (before & real).long()


def gae_next_values_not_detached(rewards, values, next_values, terminated, boundary, gamma=0.99, lam=0.95, *,
                                 check=True):
    advantages, running = [], 0.0
    for step in reversed(range(len(rewards))):
        keep = 0.0 if terminated[step] else 1.0
        delta = rewards[step] + gamma * next_values[step] * keep - values[step].detach()  # next_values not detached
        running = delta + gamma * lam * (0.0 if boundary[step] else 1.0) * running
        advantages.insert(0, running)
    advantages = torch.stack(advantages)
    return advantages, advantages + values.detach()


def weights_rollout_not_detached(old_logps, rollout_logps, cap=2.0, *, check=True):
    return (old_logps.detach() - rollout_logps).exp().clamp(max=cap)


def clip_branch_detached(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *, check=True):
    ratio = (logp - old_logp.detach()).exp()
    high = epsilon if epsilon_high is None else epsilon_high
    a = advantages.detach()
    return torch.maximum(-ratio * a, -ratio.clamp(1 - epsilon, 1 + high).detach() * a)  # halves the gradient inside


def clip_epsilon_high_falsy(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *,
                            check=True):
    ratio = (logp - old_logp.detach()).exp()
    high = epsilon_high or epsilon  # the mistake: 0.0 reads as "unset"
    a = advantages.detach()
    loss = torch.where(-ratio * a >= -ratio.clamp(1 - epsilon, 1 + high) * a, -ratio * a,
                       -ratio.clamp(1 - epsilon, 1 + high) * a)
    return loss if dual_clip is None else torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)


def clip_ratio_of_exponentials(logp, old_logp, advantages, epsilon=0.2, epsilon_high=None, dual_clip=None, *,
                               check=True):
    ratio = logp.exp() / old_logp.detach().exp()  # the mistake: 0 / 0 near -800
    high = epsilon if epsilon_high is None else epsilon_high
    a = advantages.detach()
    loss = torch.where(-ratio * a >= -ratio.clamp(1 - epsilon, 1 + high) * a, -ratio * a,
                       -ratio.clamp(1 - epsilon, 1 + high) * a)
    return loss if dual_clip is None else torch.where(a < 0, torch.minimum(loss, -dual_clip * a), loss)


def cispo_kl_detached(policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon_high=5.0, beta=0.1,
                      reduction="sequence", max_new_tokens=None, *, kl_estimator=None, importance_weights=None,
                      check=True):
    kept = completion_mask.bool()
    weight = (policy_logps - old_logps.detach()).exp().clamp(max=epsilon_high).detach()
    delta = ref_logps.detach() - policy_logps.detach()  # the mistake: the KL term sends no gradient
    per_token = -(weight * advantages.detach().unsqueeze(1) * policy_logps - beta * (delta.exp() - delta - 1))
    per_token = torch.where(kept, per_token, torch.zeros_like(per_token))
    return (per_token.sum(dim=1) / kept.sum(dim=1).clamp(min=1)).mean()


def cispo_mask_product(policy_logps, old_logps, ref_logps, advantages, completion_mask, epsilon_high=5.0, beta=0.1,
                       reduction="sequence", max_new_tokens=None, *, kl_estimator=None, importance_weights=None,
                       check=True):
    mask = completion_mask.to(policy_logps.dtype)
    weight = (policy_logps - old_logps.detach()).exp().clamp(max=epsilon_high).detach()
    delta = ref_logps.detach() - policy_logps
    per_token = -(weight * advantages.detach().unsqueeze(1) * policy_logps - beta * (delta.exp() - delta - 1))
    return ((per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()  # inf * 0 = nan


def k3_of_a_ratio(policy_logps, ref_logps, *, check=True):
    ratio = ref_logps.detach().exp() / policy_logps.exp()  # the mistake: 0 / 0 near -800
    return ratio - ratio.log() - 1


def dpo_two_branches(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, *, check=True):
    x = beta * ((chosen - rejected) - (ref_chosen.detach() - ref_rejected.detach()))
    return torch.where(x > 0, torch.log1p(torch.exp(-x)), -x + torch.log1p(torch.exp(x)))  # nan gradients far out


def group_epsilon_ignored(rewards, epsilon=1e-8, scale="group", *, check=True):
    rewards = rewards.detach()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    advantages = centred if scale == "none" else centred / (rewards.std(dim=1, keepdim=True, correction=0) + 1e-8)
    tied = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    return torch.where(tied, torch.zeros_like(advantages), advantages)


def group_none_not_zeroed(rewards, epsilon=1e-8, scale="group", *, check=True):
    rewards = rewards.detach()
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "none":
        return centred  # the mistake: a tied row keeps its rounding error
    tied = (rewards == rewards[:, :1]).all(dim=1, keepdim=True)
    advantages = centred / (rewards.std(dim=1, keepdim=True, correction=0) + epsilon)
    return torch.where(tied, torch.zeros_like(advantages), advantages)


def reduce_by_mask_product(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None, *, check=True):
    mask = completion_mask.to(per_token_loss.dtype)
    kept = per_token_loss * mask  # the mistake: inf * 0 = nan
    if reduction == "token":
        return kept.sum() / mask.sum().clamp(min=1)
    if reduction == "constant":
        return kept.sum() / (kept.shape[0] * (max_new_tokens or kept.shape[1]))
    return (kept.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def pass_at_k_by_factorials(n, c, k):
    def choose(a, b):
        return math.factorial(a) / (math.factorial(b) * math.factorial(a - b)) if 0 <= b <= a else 0.0
    return 1.0 if n - c < k else 1.0 - choose(n - c, k) / choose(n, k)


def logps_with_an_integer_mask(logits, input_ids, response_mask, *, check=True):
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    valid = response_mask[:, 1:].long()  # the mistake: ~valid of an integer mask is -1 and -2
    token = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.where(valid.bool(), token, torch.zeros_like(token)), valid


def reinforce_detaching_in_place(logp, advantages, *, check=True):
    return -advantages.detach_() * logp  # right values, but the caller's advantages lose their graph


def reinforce_flattened(logp, advantages, *, check=True):
    return (-advantages.detach() * logp).flatten()


def k1_of_a_ratio(policy_logps, ref_logps, *, check=True):
    return torch.log(policy_logps.exp() / ref_logps.detach().exp())


def rloo_without_tie_mask(rewards, *, check=True):
    rewards = rewards.detach()
    count = rewards.shape[1]
    return (count * rewards - rewards.sum(dim=1, keepdim=True)) / (count - 1)


def reduce_token_without_clamp(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None, *,
                               check=True):
    kept = torch.where(completion_mask.bool(), per_token_loss, torch.zeros_like(per_token_loss))
    mask = completion_mask.to(per_token_loss.dtype)
    if reduction == "token":
        return kept.sum() / mask.sum()  # the mistake: 0 / 0 on an empty batch
    if reduction == "constant":
        return kept.sum() / (kept.shape[0] * (max_new_tokens or kept.shape[1]))
    return (kept.sum(dim=1) / mask.sum(dim=1).clamp(min=1)).mean()


def kl_detached(logits, reference_logits, *, check=True):  # a value without a gradient: the KL would pull nothing
    logp, logq = F.log_softmax(logits, dim=-1), F.log_softmax(reference_logits.detach(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1).detach()


def kl_weights_detached(logits, reference_logits, *, check=True):  # its expected gradient is 0
    logp, logq = F.log_softmax(logits, dim=-1), F.log_softmax(reference_logits.detach(), dim=-1)
    return (logp.exp().detach() * (logp - logq)).sum(dim=-1)


def kl_log_of_softmax(logits, reference_logits, *, check=True):
    p, q = F.softmax(logits, dim=-1), F.softmax(reference_logits.detach(), dim=-1)
    return (p * (p.log() - q.log())).sum(dim=-1)


def dpo_rejected_detached(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, *, check=True):
    margin = (chosen - rejected.detach()) - (ref_chosen.detach() - ref_rejected.detach())
    return -F.logsigmoid(beta * margin)


def dpo_ref_rejected_not_detached(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, *, check=True):
    margin = (chosen - rejected) - (ref_chosen.detach() - ref_rejected)
    return -F.logsigmoid(beta * margin)


def dpo_default_beta_changed(chosen, rejected, ref_chosen, ref_rejected, beta=0.1, *, check=True):
    margin = (chosen - rejected) - (ref_chosen.detach() - ref_rejected.detach())  # right, but beta's default moved
    return -F.logsigmoid(beta * margin)


def dpo_log_of_sigmoid(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, *, check=True):
    margin = (chosen - rejected) - (ref_chosen.detach() - ref_rejected.detach())
    return -torch.log(torch.sigmoid(beta * margin))


def group_sample_std(rewards, epsilon=1e-8, scale="group", *, check=True):
    rewards = rewards.detach()
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    return centered if scale == "none" else centered / (rewards.std(dim=1, keepdim=True) + epsilon)


def group_no_exact_zeros(rewards, epsilon=1e-8, scale="group", *, check=True):
    rewards = rewards.detach()
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    return centered if scale == "none" else centered / (rewards.std(dim=1, correction=0, keepdim=True) + epsilon)


def rloo_with_own_reward(rewards, *, check=True):
    rewards = rewards.detach()
    return rewards - rewards.mean(dim=1, keepdim=True)


def reduce_always_token_mean(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None, *,
                             check=True):
    mask = completion_mask.to(per_token_loss.dtype)
    return (per_token_loss * mask).sum() / mask.sum()


def reduce_mask_forgotten(per_token_loss, completion_mask, reduction="sequence", max_new_tokens=None, *, check=True):
    return per_token_loss.mean()


def overlong_positive(lengths, max_new_tokens, cache, *, check=True):
    return -rl_lab.overlong_penalty(lengths, max_new_tokens, cache)


def pass_at_k_with_replacement(n, c, k):
    return 1.0 - (1.0 - c / n) ** k


MISTAKES = [
    ("response_token_logps", shift_off_by_one, "the causal shift"),
    ("response_token_logps", mask_forgotten, "set every position it hides to 0"),
    ("completion_mask", mask_drops_eos, "not `ids != eos`"),
    ("reinforce_loss", reinforce_sign, "the minus sign"),
    ("reinforce_loss", reinforce_no_detach, "detach the advantages"),
    ("gae", gae_boundary_stops_bootstrap, "only `terminated` stops the bootstrap"),
    ("truncated_importance_weights", weights_inverted, "not the inverse"),
    ("clipped_policy_loss", clip_optimistic, "the pessimistic branch"),
    ("clipped_policy_loss", clip_ratio_inverted, "not exp(old_logp - logp)"),
    ("clipped_policy_loss", clip_old_not_detached, "detach old_logp"),
    ("cispo_policy_loss", cispo_weight_not_detached, "detach the weight"),
    ("sequence_log_ratio", ratio_summed, "a mean, not a sum"),
    ("kl_k1", k1_reversed, "not the other way round"),
    ("kl_k2", k2_without_half, "the factor 1/2"),
    ("kl_k3", k3_wrong_direction, "has a mean under pi that is no KL"),
    ("categorical_kl", kl_weighted_by_reference, "weight by the POLICY"),
    ("response_token_logps", logps_of_softmax, "never log(softmax(...))"),
    ("response_token_logps", logps_with_an_integer_mask, "expected dtype bool, got int64"),
    ("reinforce_loss", reinforce_detaching_in_place, "it changed advantages in place"),
    ("reinforce_loss", reinforce_flattened, "keeps the inputs' shape"),
    ("kl_k1", k1_of_a_ratio, "subtract the log-probs"),
    ("rloo_advantages", rloo_without_tie_mask, "zero the tied rows themselves"),
    ("reduce_token_loss", reduce_token_without_clamp, "under 'token' too"),
    ("completion_mask", mask_eos_on_padding, "among the real positions only"),
    ("gae", gae_next_values_not_detached, "AND next_values"),
    ("truncated_importance_weights", weights_rollout_not_detached, "detach both log-probs"),
    ("clipped_policy_loss", clip_branch_detached, "splits it in half"),
    ("clipped_policy_loss", clip_epsilon_high_falsy, "test `epsilon_high is None`"),
    ("clipped_policy_loss", clip_ratio_of_exponentials, "one exponential of the difference"),
    ("cispo_policy_loss", cispo_kl_detached, "do not detach the policy inside k3"),
    ("cispo_policy_loss", cispo_mask_product, "inf * 0 = nan"),
    ("kl_k3", k3_of_a_ratio, "compute delta = ref - policy first"),
    ("dpo_loss", dpo_two_branches, "gradient is finite at any margin"),
    ("group_advantages", group_epsilon_ignored, "use the epsilon given"),
    ("group_advantages", group_none_not_zeroed, "whatever the scale"),
    ("reduce_token_loss", reduce_by_mask_product, "inf * 0 = nan"),
    ("pass_at_k", pass_at_k_by_factorials, "no factorials"),
    ("categorical_kl", kl_detached, "detach neither"),
    ("categorical_kl", kl_weights_detached, "detach neither"),
    ("categorical_kl", kl_log_of_softmax, "0 * -inf = nan"),
    ("dpo_loss", dpo_log_of_sigmoid, "use F.logsigmoid"),
    ("dpo_loss", dpo_rejected_detached, "flows into rejected too"),
    ("dpo_loss", dpo_default_beta_changed, "the default of beta is 0.1, the lab's is 0.5"),
    ("dpo_loss", dpo_ref_rejected_not_detached, "ref_rejected as ref_chosen"),
    ("group_advantages", group_sample_std, "POPULATION std"),
    ("group_advantages", group_no_exact_zeros, "exactly 0"),
    ("rloo_advantages", rloo_with_own_reward, "leave the sample out"),
    ("reduce_token_loss", reduce_always_token_mean, "not a token mean"),
    ("reduce_token_loss", reduce_mask_forgotten, "'sequence'"),
    ("overlong_penalty", overlong_positive, "a penalty is negative"),
    ("pass_at_k", pass_at_k_with_replacement, "WITHOUT replacement"),
]

# a learner's file that solves two exercises, gets one wrong and leaves the rest as stubs
PARTLY_SOLVED = '''
import torch


def kl_k1(policy_logps, ref_logps, *, check=True):
    return policy_logps - ref_logps.detach()


def kl_k2(policy_logps, ref_logps, *, check=True):
    return 0.5 * (policy_logps - ref_logps.detach()) ** 2


def kl_k3(policy_logps, ref_logps, *, check=True):
    delta = policy_logps - ref_logps.detach()  # the wrong direction
    return delta.exp() - delta - 1


def dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5, *, check=True):
    raise NotImplementedError


def gae(rewards, values, next_values, terminated, boundary, gamma=0.99, lam=0.95, *, check=True):
    return rewards[10]  # raises IndexError on every case
'''
SOLVED_BY_THE_LAB = '''
from rl_lab import (  # the solutions are rl_lab.py's atoms
    response_token_logps, completion_mask, reinforce_loss, gae, truncated_importance_weights, clipped_policy_loss,
    cispo_policy_loss, sequence_log_ratio, kl_k1, kl_k2, kl_k3, categorical_kl, dpo_loss, group_advantages,
    rloo_advantages, reduce_token_loss, overlong_penalty,
)
from countdown import pass_at_k
'''


class Cases(unittest.TestCase):
    def test_the_labs_atoms_pass_every_case(self):
        self.assertGreaterEqual(len(EXERCISES), 18)
        for exercise in EXERCISES:
            with self.subTest(exercise=exercise.name):
                result = exercises.grade(exercise, exercise.solution)
                self.assertEqual(result.line, f"{exercise.name}: passed ({len(exercise.cases)} cases)")

    def test_every_exercise_has_hand_and_reference_or_invariant_cases_with_a_hint(self):
        for exercise in EXERCISES:
            kinds = {case.name.split(":")[0] for case in exercise.cases}
            with self.subTest(exercise=exercise.name):
                self.assertIn("hand", kinds)
                self.assertTrue(kinds & {"reference", "invariant", "gradient"}, kinds)
                for case in exercise.cases:
                    self.assertRegex(case.section, r"\A[a-z0-9-]+\Z")
                    self.assertGreater(len(case.hint), 20)

    def test_the_course_order_follows_the_chapters(self):
        chapters = [exercise.chapter for exercise in EXERCISES]
        self.assertEqual(chapters, sorted(chapters))
        self.assertEqual(len({exercise.name for exercise in EXERCISES}), len(EXERCISES))

    def test_a_changed_default_fails_by_name_and_an_odd_one_never_crashes(self):
        def tensor_beta(chosen, rejected, ref_chosen, ref_rejected, beta=torch.tensor([0.5, 0.5]), *, check=True):
            return rl_lab.dpo_loss(chosen, rejected, ref_chosen, ref_rejected, 0.5)

        def int_cap(old_logps, rollout_logps, cap=2, *, check=True):  # 2 == 2.0: the same default
            return rl_lab.truncated_importance_weights(old_logps, rollout_logps, cap)

        result = exercises.grade(BY_NAME["dpo_loss"], tensor_beta)
        self.assertEqual(result.status, "failed")
        self.assertIn("the default of beta is [0.5, 0.5], the lab's is 0.5", result.line)
        self.assertEqual(exercises.grade(BY_NAME["truncated_importance_weights"], int_cap).status, "passed")

    def test_compare_checks_dtype_shape_values_and_exactness(self):
        compare = exercise_cases.compare
        self.assertIsNone(compare(torch.tensor([True, False]), torch.tensor([1, 0])))  # a 0/1 mask: ints or bools
        self.assertEqual(compare(torch.tensor([1, 0]), torch.tensor([True, False])),  # a bool mask: ~ must work
                         "expected dtype bool, got int64")
        self.assertEqual(compare(torch.tensor([1, 0]), torch.tensor([1.0, 0.0], dtype=torch.float64)),
                         "expected dtype float64, got int64")
        self.assertEqual(compare(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.0], dtype=torch.float64)),
                         "expected dtype float64, got float32")  # float32 cannot hold float64's values to 1e-10
        self.assertEqual(compare(torch.tensor([1, 0]).to(torch.complex128), torch.tensor([1, 0])),
                         "expected dtype int64, got complex128")
        self.assertIn("shape", compare(torch.tensor(1.0), torch.tensor([1.0])))
        self.assertEqual(compare(torch.tensor([1e-12]), torch.tensor([0.0]), exact=True),
                         "differs (exact values expected)")
        self.assertIsNone(compare(torch.tensor([1e-12]), torch.tensor([0.0])))
        self.assertEqual(compare(0.64, 0.7), "differs")
        self.assertIn("tuple", compare(torch.tensor([1.0]), (torch.tensor([1.0]), torch.tensor([True]))))
        self.assertEqual(compare(True, False), "differs")

    def test_a_tensor_that_differs_names_the_largest_difference_and_a_float32_step(self):
        compare = exercise_cases.compare
        expected = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
        close = expected.clone()
        close[1, 0] += 1.3e-7  # what one float32 factor in a float64 recursion leaves
        reason = compare(close, expected)
        self.assertTrue(reason.startswith("differs: largest difference 1.3e-07 at index [1, 0] (3.00000013 vs 3)"),
                        reason)
        self.assertIn("float32 step", reason)
        far = expected.clone()
        far[0, 1] = 5.0
        self.assertEqual(compare(far, expected), "differs: largest difference 3 at index [0, 1] (5 vs 2)")

    def test_the_hints_point_at_sections_of_the_chapters_that_exist(self):
        for exercise in EXERCISES:
            page = os.path.join(HERE, "docs", "learn", f"{exercise.chapter}.md")
            if not os.path.exists(page):
                continue  # the chapter is not written yet
            with open(page, encoding="utf-8") as handle:
                headings = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                            for line in handle if line.startswith("#")}
            for case in exercise.cases:
                with self.subTest(exercise=exercise.name, section=case.section):
                    self.assertIn(case.section, headings)


class Mistakes(unittest.TestCase):
    def test_every_exercise_has_a_seeded_mistake(self):
        self.assertEqual({name for name, _, _ in MISTAKES}, set(BY_NAME))

    def test_each_seeded_mistake_fails_with_the_hint_that_names_it(self):
        for name, wrong, phrase in MISTAKES:
            with self.subTest(exercise=name, mistake=wrong.__name__):
                exercise = BY_NAME[name]
                result = exercises.grade(exercise, wrong)
                self.assertEqual(result.status, "failed", result.line)
                self.assertIn(phrase, result.line)
                self.assertIn(f"(see docs/learn/{exercise.chapter}.md#", result.line)
                self.assertEqual(len(result.line.splitlines()), 1)

    def test_a_failing_case_shows_its_input_the_expected_and_the_obtained_value(self):
        result = exercises.grade(BY_NAME["pass_at_k"], pass_at_k_with_replacement)
        self.assertIn('case 2 of 6 "hand: n=5, c=2, k=2": input n=5, c=2, k=2; expected 0.7, got 0.64 (differs)',
                      result.line)


class Commands(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return path

    def test_start_writes_stubs_with_the_labs_names_and_signatures_that_are_not_started(self):
        path = os.path.join(self.tmp.name, "mine.py")
        code, stdout, stderr = run_main(exercises.main, ["start", "--file", path])
        self.assertEqual((code, stderr), (0, ""))
        self.assertIn(f"wrote {path}: {len(EXERCISES)} stubs", stdout)
        module = exercises.load_learner(path)
        for exercise in EXERCISES:
            with self.subTest(exercise=exercise.name):
                stub = getattr(module, exercise.name)
                self.assertEqual(inspect.signature(stub), inspect.signature(exercise.solution))
                self.assertIn(f"docs/learn/{exercise.chapter}.md", stub.__doc__)
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        self.assertIn("The solutions are rl_lab.py's atoms", text)
        self.assertLessEqual(max(len(line) for line in text.splitlines()), 120)
        code, stdout, _ = run_main(exercises.main, ["check", "--file", path])
        self.assertEqual(code, 0)  # nothing written yet, so nothing fails
        self.assertEqual(stdout.splitlines()[:-1], [f"{exercise.name}: not started" for exercise in EXERCISES])
        self.assertEqual(stdout.splitlines()[-1], f"0 passed, 0 failed, {len(EXERCISES)} not started of "
                                                  f"{len(EXERCISES)} exercises")

    def test_start_bare_writes_the_same_stubs_without_their_formulas(self):
        path = os.path.join(self.tmp.name, "bare.py")
        code, out, err = run_main(exercises.main, ["start", "--bare", "--file", path])
        self.assertEqual((code, err), (0, ""), out)
        module = exercises.load_learner(path)
        full = exercises.stub_text("bare.py")
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        self.assertLess(len(text), len(full))
        self.assertNotIn("delta_t = r_t + gamma", text)  # gae's formula
        self.assertIn("delta_t = r_t + gamma", full)
        self.assertIn("Returns (advantages, returns)", text)  # the shapes and what to return stay
        for exercise in EXERCISES:
            self.assertEqual(inspect.signature(getattr(module, exercise.name)),
                             inspect.signature(exercise.solution), exercise.name)
        code, _, err = run_main(exercises.main, ["check", "--bare", "--file", path])
        self.assertEqual(code, 2)
        self.assertIn("--bare", err)

    def test_start_refuses_an_existing_path_and_leaves_it_byte_identical(self):
        path = self.write("mine.py", "def gae():\n    return 'my own work'\n")
        with open(path, "rb") as handle:
            before = handle.read()
        for target in (path, self.tmp.name):  # a file, and a folder
            code, stdout, stderr = run_cli_in_process(exercises.main, ["start", "--file", target])
            self.assertEqual((code, stdout), (2, ""))
            self.assertEqual(len(stderr.strip().splitlines()), 1)
            self.assertIn("--file", stderr)
            self.assertIn("already exists", stderr)
        with open(path, "rb") as handle:
            self.assertEqual(handle.read(), before)
        self.assertEqual(os.listdir(self.tmp.name), ["mine.py"])

    def test_a_file_that_does_not_import_is_one_line_naming_the_file_and_line(self):
        broken = self.write("broken.py", "import math\n\ndef gae(:\n    pass\n")
        failing = self.write("failing.py", "import math\n\nVALUE = math.sqrt(-1)\n")
        for path, line in ((broken, 3), (failing, 3)):
            with self.subTest(path=os.path.basename(path)):
                code, stdout, stderr = run_cli_in_process(exercises.main, ["check", "--file", path])
                self.assertEqual((code, stdout), (1, ""))
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn(f"{path} line {line}:", stderr)
                self.assertNotIn("Traceback", stderr)

    def test_check_on_a_partly_solved_file_exits_1_and_names_the_failing_atoms(self):
        path = self.write("partly.py", PARTLY_SOLVED)
        code, stdout, stderr = run_cli_in_process(exercises.main, ["check", "--file", path])
        self.assertEqual((code, stderr), (1, ""))
        lines = {line.split(":")[0]: line for line in stdout.splitlines()[:-1]}
        self.assertEqual(len(lines), len(EXERCISES))
        self.assertEqual(lines["kl_k1"], "kl_k1: passed (4 cases)")
        self.assertEqual(lines["kl_k2"], "kl_k2: passed (4 cases)")
        self.assertIn("kl_k3: failed case 1 of 5", lines["kl_k3"])
        self.assertIn("has a mean under pi that is no KL", lines["kl_k3"])
        self.assertEqual(lines["dpo_loss"], "dpo_loss: not started")
        self.assertEqual(lines["pass_at_k"], "pass_at_k: not started (no function of that name)")
        # an exception inside the learner's atom is a failing case naming it and the line, not a crash
        self.assertIn("raised IndexError: index 10 is out of bounds", lines["gae"])
        line = PARTLY_SOLVED.splitlines().index("    return rewards[10]  # raises IndexError on every case") + 1
        self.assertIn(f"at {path}:{line};", lines["gae"])
        self.assertEqual(stdout.splitlines()[-1], f"2 passed, 2 failed, {len(EXERCISES) - 4} not started of "
                                                  f"{len(EXERCISES)} exercises")
        code, stdout, _ = run_main(exercises.main, ["check", "--file", path, "--atom", "kl_k1"])
        self.assertEqual((code, stdout), (0, "kl_k1: passed (4 cases)\n"))

    def test_an_unknown_atom_or_a_flag_of_another_command_exits_2_naming_it(self):
        path = self.write("partly.py", PARTLY_SOLVED)
        for argv, flag in ((["check", "--file", path, "--atom", "ppo"], "--atom"),
                           (["start", "--file", os.path.join(self.tmp.name, "new.py"), "--atom", "gae"], "--atom"),
                           (["check", "--file", path, "--steps", "5"], "--steps"),
                           (["check", "--file", os.path.join(self.tmp.name, "absent.py")], "--file")):
            with self.subTest(argv=argv):
                code, stdout, stderr = run_cli_in_process(exercises.main, argv)
                self.assertEqual((code, stdout), (2, ""))
                self.assertEqual(len(stderr.strip().splitlines()), 1)
                self.assertIn(flag, stderr)
        self.assertIn("gae", run_main(exercises.main, ["check", "--atom", "ppo"])[2])  # the names are listed
        self.assertEqual(sorted(os.listdir(self.tmp.name)), ["partly.py"])

    def test_train_with_the_labs_atoms_learns_and_matches_the_labs_runs(self):
        path = self.write("solved.py", SOLVED_BY_THE_LAB)
        code, stdout, stderr = run_cli_in_process(
            exercises.main, ["train", "--file", path, "--steps", "12", "--online-steps", "12"])
        self.assertEqual((code, stderr), (0, ""))
        lines = stdout.splitlines()
        self.assertIn(f"({len(EXERCISES)} of {len(EXERCISES)})", lines[0])
        self.assertEqual(len(lines), 1 + len(exercises.RUNS))
        for run, line in zip(exercises.RUNS, lines[1:]):
            with self.subTest(run=run.name):
                mine, lab = re.findall(r" ([0-9.]+) with ", line)
                self.assertEqual(mine, lab)  # the same atoms: the same run, bit for bit
                self.assertIn("; learns (bar", line)
                self.assertIn(f"with your {', '.join(run.atoms)},", line)

    def test_train_uses_only_the_atoms_that_pass_check_and_names_them(self):
        path = self.write("partly.py", PARTLY_SOLVED)
        code, stdout, _ = run_main(exercises.main, ["train", "--file", path, "--steps", "3", "--online-steps", "3"])
        self.assertEqual(code, 1)  # a 3-step bandit does not get halfway: the verdict is stated, not assumed
        self.assertIn("your atoms that pass check (2 of 18): kl_k1, kl_k2", stdout)
        self.assertIn("bandit ppo (3 steps): not run (it calls clipped_policy_loss, gae; none of yours passes check)",
                      stdout)

    def test_each_runs_atoms_are_the_ones_it_calls_and_the_lab_is_restored(self):
        atoms = {exercise.name: exercise.solution for exercise in EXERCISES}
        for run in exercises.RUNS:
            with self.subTest(run=run.name):
                _, calls = exercises.run_with(run, atoms, 2)
                self.assertEqual(set(calls), set(run.atoms))
        self.assertIs(rl_lab.clipped_policy_loss, BY_NAME["clipped_policy_loss"].solution)
        self.assertIs(rl_lab.KL_ESTIMATORS["k3"], rl_lab.token_kl_penalty)
        self.assertIs(exercises.online_algorithms.POLICY_LOSSES["cispo"].function, rl_lab.cispo_policy_loss)

    def test_an_atom_that_fails_inside_a_run_is_restored_and_reported(self):
        def broken(*args, **kwargs):
            raise RuntimeError("my bug")

        with self.assertRaisesRegex(RuntimeError, "my bug"):
            exercises.run_with(exercises.RUNS[1], {"dpo_loss": broken}, 2)
        self.assertIs(rl_lab.dpo_loss, BY_NAME["dpo_loss"].solution)
        self.assertTrue(math.isclose(rl_lab.train("dpo", steps=2)[0][-1]["expected_reward"],
                                     exercises.lab_run("bandit dpo", 2)[-1]["expected_reward"]))


def k1_file(body, header=""):
    """A learner's file whose kl_k1 runs `body` (indented lines) before returning the right value."""
    lines = "".join(f"    {line}\n" for line in body.splitlines())
    return (f"import os\nimport sys\n\nimport torch\n{header}\n\ndef kl_k1(policy_logps, ref_logps, *, check=True):\n"
            f"{lines}    return policy_logps - ref_logps.detach()\n")


def process_state():
    """What a learner's code must leave as it found it, comparable with ==."""
    return (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(), torch.get_rng_state().tolist(),
            os.getcwd(), rl_lab.gae, rl_lab.KL_ESTIMATORS["k3"], exercise_cases.TOLERANCE, torch.exp, torch.Tensor.exp)


class FullDisk:
    """open() for start's write: writes the first 100 characters, then fails as a full disk does, in write()
    or in close() (the last buffer, written when the file is closed)."""

    def __init__(self, path, mode, encoding, at):
        self.handle, self.at = open(path, mode, encoding=encoding), at

    def __enter__(self):
        return self

    def write(self, text):
        self.handle.write(text[:100])
        if self.at == "write":
            raise OSError(errno.ENOSPC, "No space left on device")

    def __exit__(self, *exc):
        self.handle.close()
        if self.at == "close":
            raise OSError(errno.ENOSPC, "No space left on device")


class LearnerFaults(unittest.TestCase):
    """A learner's file or command that goes wrong: one clear line, nothing lost, and the lab unchanged."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.before = process_state()
        self.addCleanup(lambda: self.assertEqual(process_state(), self.before, "the process was left changed"))

    def write(self, name, text, encoding="utf-8"):
        path = os.path.join(self.tmp.name, name)
        with open(path, "wb") as handle:
            handle.write(text if isinstance(text, bytes) else text.encode(encoding))
        return path

    def one_line_error(self, argv, code, *phrases):
        status, stdout, stderr = run_cli_in_process(exercises.main, argv)
        self.assertEqual(status, code, stderr)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertNotIn("Traceback", stderr)
        for phrase in phrases:
            self.assertIn(phrase, stderr)
        return stdout, stderr

    def grade_k1(self, body, header=""):
        return exercises.grade(BY_NAME["kl_k1"], exercises.load_learner(self.write("k1.py", k1_file(body, header)))
                               .kl_k1, os.path.join(self.tmp.name, "k1.py"))

    def test_start_refuses_a_link_a_fifo_and_a_missing_folder_before_writing(self):
        mine = self.write("mine.py", "my own work\n")
        os.symlink(mine, os.path.join(self.tmp.name, "link.py"))
        os.symlink(os.path.join(self.tmp.name, "nowhere.py"), os.path.join(self.tmp.name, "dangling.py"))
        os.mkfifo(os.path.join(self.tmp.name, "fifo.py"))
        listing = sorted(os.listdir(self.tmp.name))
        for name, phrase in (("link.py", "already exists"), ("dangling.py", "already exists"),
                             ("fifo.py", "already exists"), (os.path.join("missing", "new.py"), "does not exist"),
                             (os.path.join("mine.py", "new.py"), "is not a folder")):
            with self.subTest(name=name):
                stdout, _ = self.one_line_error(["start", "--file", os.path.join(self.tmp.name, name)], 2, "--file",
                                                phrase)
                self.assertEqual(stdout, "")
        self.assertEqual(sorted(os.listdir(self.tmp.name)), listing)
        self.assertEqual(os.readlink(os.path.join(self.tmp.name, "dangling.py")),
                         os.path.join(self.tmp.name, "nowhere.py"))
        with open(mine, encoding="utf-8") as handle:
            self.assertEqual(handle.read(), "my own work\n")
        self.one_line_error(["start", "--file", ""], 2, "--file", "expected a file path")

    @unittest.skipIf(os.geteuid() == 0, "root writes into a read-only folder")
    def test_start_refuses_a_read_only_folder(self):
        folder = os.path.join(self.tmp.name, "read-only")
        os.mkdir(folder, 0o555)
        self.addCleanup(os.chmod, folder, 0o755)
        self.one_line_error(["start", "--file", os.path.join(folder, "new.py")], 2, "--file", "cannot write")
        self.assertEqual(os.listdir(folder), [])

    def test_start_on_a_full_disk_leaves_no_half_file(self):
        path = os.path.join(self.tmp.name, "mine.py")
        for at in ("write", "close"):
            def fake_open(name, mode="r", encoding=None, at=at):  # only start's write ("x") meets the full disk
                return FullDisk(name, mode, encoding, at) if mode == "x" else open(name, mode, encoding=encoding)

            with self.subTest(at=at), mock.patch("exercises.open", create=True, side_effect=fake_open):
                stdout, _ = self.one_line_error(["start", "--file", path], 1, f"cannot write {path}",
                                                "No space left on device", "nothing was written")
                self.assertEqual(stdout, "")
                self.assertEqual(os.listdir(self.tmp.name), [])

    def test_a_file_is_decoded_as_python_decodes_a_module(self):
        # a coding line is honoured; bytes that are not UTF-8 without one are an error, never replaced silently
        latin = self.write("latin.py", "# -*- coding: latin-1 -*-\nWORD = 'café'\n" + k1_file(""), "latin-1")
        self.assertEqual(exercises.load_learner(latin).WORD, "café")
        self.assertEqual(run_main(exercises.main, ["check", "--file", latin, "--atom", "kl_k1"])[:2],
                         (0, "kl_k1: passed (4 cases)\n"))
        self.assertEqual(exercises.load_learner(self.write("bom.py", b"\xef\xbb\xbfWORD = 1\n")).WORD, 1)
        not_utf8 = self.write("not-utf8.py", "WORD = 'café'\n", "latin-1")
        self.one_line_error(["check", "--file", not_utf8], 1, f"{not_utf8} line 1: SyntaxError", "utf-8")
        nul = self.write("nul.py", b"WORD = 1\n\0\n")
        _, stderr = self.one_line_error(["check", "--file", nul], 1, f"{nul}: SyntaxError", "null bytes")
        self.assertNotIn("None", stderr)

    def test_a_path_that_is_empty_a_folder_a_fifo_or_huge_exits_2_naming_the_file(self):
        os.mkfifo(os.path.join(self.tmp.name, "fifo.py"))
        huge = self.write("huge.py", "")
        os.truncate(huge, MAX_INPUT_BYTES + 1)  # sparse: no time spent writing it
        for path, phrase in (("", "expected a file path"), (self.tmp.name, "not a regular file"),
                             (os.path.join(self.tmp.name, "fifo.py"), "not a regular file"),
                             (huge, f"{MAX_INPUT_BYTES + 1} bytes, more than")):
            with self.subTest(path=path):
                self.one_line_error(["check", "--file", path], 2, "--file", phrase)

    def test_an_exit_at_import_is_one_line_and_status_1(self):
        for statement, shown in (("sys.exit()", "called sys.exit()"), ("sys.exit(0)", "called sys.exit(0)"),
                                 ("os._exit(0)", "called os._exit(0)")):
            with self.subTest(statement=statement), mock.patch("os._exit", side_effect=AssertionError("real _exit")):
                path = self.write("exits.py", f"import os\nimport sys\n\n{statement}\n")
                stdout, _ = self.one_line_error(["check", "--file", path], 1, f"{path} line 4: {shown}",
                                                "does not import")
                self.assertEqual(stdout, "")

    def test_an_exit_inside_an_atom_fails_its_case_and_the_other_atoms_are_graded(self):
        # one file, one grading: kl_k1 calls sys.exit(3), kl_k2 (line 13) os._exit(0); every other atom is graded
        k2 = ("\n\ndef kl_k2(policy_logps, ref_logps, *, check=True):\n    os._exit(0)\n"
              "    return 0.5 * (policy_logps - ref_logps.detach()) ** 2\n")
        with mock.patch("os._exit", side_effect=AssertionError("real _exit")):
            path = self.write("exits.py", k1_file("sys.exit(3)") + k2 + SOLVED_BY_THE_LAB.replace("kl_k1, kl_k2, ", ""))
            code, stdout, stderr = run_cli_in_process(exercises.main, ["check", "--file", path])
        self.assertEqual((code, stderr), (1, ""))
        lines = stdout.splitlines()
        self.assertEqual(len(lines), len(EXERCISES) + 1)
        self.assertIn(f'kl_k1: failed case 1 of 4 "hand: policy minus reference": input policy_logps=[-1.0, '
                      f'-2.0], ref_logps=[-2.0, -1.0]; called sys.exit(3) at {path}:8;', stdout)
        k2_line = next(line for line in lines if line.startswith("kl_k2: "))
        self.assertTrue(k2_line.startswith("kl_k2: failed case 1 of "), k2_line)
        self.assertIn(f"called os._exit(0) at {path}:13;", k2_line)
        self.assertEqual(lines[-1], f"{len(EXERCISES) - 2} passed, 2 failed, 0 not started of "
                                    f"{len(EXERCISES)} exercises")

    def test_an_interrupt_inside_an_atom_ends_with_one_line_and_status_130(self):
        # an atom that never returns is stopped by Ctrl-C: the lines so far, the atom's, then run_cli's one line
        path = self.write("loops.py", k1_file("torch.set_default_dtype(torch.float64)\nraise KeyboardInterrupt"))
        code, stdout, stderr = run_cli_in_process(exercises.main, ["check", "--file", path])
        self.assertEqual(code, 130)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        self.assertIn("interrupted (SIGINT)", stderr)
        names = [exercise.name for exercise in EXERCISES]
        before = names[:names.index("kl_k1")]
        self.assertEqual(stdout.splitlines(), [f"{name}: not started (no function of that name)" for name in before]
                         + ["kl_k1: interrupted while its cases ran (an endless loop?); the atoms after it were not "
                            "graded"])
        self.assertIs(torch.get_default_dtype(), torch.float32)  # put back on the way out

    def test_the_learners_prints_come_just_before_their_atoms_line(self):
        path = self.write("prints.py", k1_file("print('debug ' * 20)\nprint('x' * 10_000)"))
        code, stdout, _ = run_main(exercises.main, ["check", "--file", path])
        lines = stdout.splitlines()
        self.assertEqual(code, 0)
        at = lines.index("kl_k1: passed (4 cases)")
        self.assertEqual(lines[at - 8:at], ["debug " * 20, "x" * 10_000] * 4)  # four cases, each printing twice
        self.assertEqual(lines[at - 9], "sequence_log_ratio: not started (no function of that name)")

    def test_a_wrong_return_value_fails_with_what_was_expected(self):
        for body, reason in (
            ("return (policy_logps - ref_logps.detach()).tolist()", "(expected a tensor, got list)"),
            ("return None", "got None (expected a tensor, got NoneType)"),
            ("return (policy_logps - ref_logps).detach().numpy()", "(expected a tensor, got ndarray)"),
            ("return torch.zeros(7, dtype=torch.float64)", "(expected shape (2,), got shape (7,))"),
            ("return torch.full((2,), float('nan'), dtype=torch.float64)", "got [nan, nan] (differs: NaN at index [0]"),
            ("return (policy_logps - ref_logps.detach()).float()", "(expected dtype float64, got float32)"),
            ("return (policy_logps - ref_logps.detach()).long()", "(expected dtype float64, got int64)"),
            ("return (policy_logps - ref_logps.detach()).to(torch.complex128)",
             "(expected dtype float64, got complex128)"),
            ("return (policy_logps - ref_logps.detach()).to('meta')",
             "got a strided tensor on meta (expected an ordinary CPU tensor"),
            ("return (policy_logps - ref_logps.detach()).to_sparse()",
             "got a sparse_coo tensor on cpu (expected an ordinary CPU tensor"),
            ("return torch.zeros(10**7, dtype=torch.float64)", "got (10000000,) [0.0, 0.0,"),
            ("return type('Odd', (), {'__repr__': lambda self: 1 / 0})()", "got a Odd (expected a tensor, got Odd)"),
            ("return policy_logps - ref_logps", "gradient: the reference gets none"),
        ):
            with self.subTest(body=body):
                result = self.grade_k1(body)
                self.assertEqual(result.status, "failed", result.line)
                self.assertIn(reason, result.line)
                self.assertLess(len(result.line), 1000)
        result = exercises.grade(BY_NAME["truncated_importance_weights"],
                                 lambda old_logps, rollout_logps, cap=2.0, **_: (old_logps - rollout_logps).exp()
                                 .clamp(max=cap))  # not detached: the output requires grad
        self.assertIn('case 4 of 5 "gradient: the weights carry none"', result.line)
        self.assertIn("expected False, got True (differs)", result.line)

    def test_a_wrong_signature_or_a_non_function_fails_and_extra_functions_and_classes_are_ignored(self):
        path = self.write("odd.py", "import dataclasses\n\n\ndef kl_k1(policy_logps):\n    return policy_logps\n\n"
                                    "kl_k2 = 3\n\n\ndef helper():\n    pass\n\n\n@dataclasses.dataclass\n"
                                    "class Settings:\n    beta: float = 0.1\n")
        code, stdout, _ = run_main(exercises.main, ["check", "--file", path])
        self.assertEqual(code, 1)
        lines = {line.split(":")[0]: line for line in stdout.splitlines()[:-1]}
        self.assertIn("raised TypeError: kl_k1() takes 1 positional argument but 2 were given", lines["kl_k1"])
        self.assertEqual(lines["kl_k2"], "kl_k2: failed: kl_k2 = 3 is not a function")
        self.assertNotIn("helper", stdout)

    def test_a_module_getattr_or_an_exception_whose_message_fails_is_the_learners_fault_not_a_crash(self):
        path = self.write("odd.py", "def __getattr__(name):\n    raise RuntimeError(name)\n\n\nclass Odd(Exception):\n"
                                    "    def __str__(self):\n        raise ValueError\n\n\n"
                                    "def kl_k1(policy_logps, ref_logps, *, check=True):\n    raise Odd()\n")
        code, stdout, stderr = run_cli_in_process(exercises.main, ["check", "--file", path])
        self.assertEqual((code, stderr), (1, ""))
        lines = {line.split(":")[0]: line for line in stdout.splitlines()[:-1]}
        self.assertEqual(lines["gae"], "gae: not started (no function of that name)")  # __getattr__ never asked
        self.assertIn("raised Odd: (its message cannot be shown) at", lines["kl_k1"])
        path = self.write("odd-import.py", "class Odd(Exception):\n    def __str__(self):\n"
                                           "        raise ValueError\n\n\nraise Odd()\n")
        self.one_line_error(["check", "--file", path], 1, f"{path} line 6: raised Odd: (its message cannot be shown)")

    def test_an_atom_that_changes_its_input_in_place_fails_whatever_it_returns(self):
        for body in ("ref_logps.mul_(2)", "value = policy_logps - ref_logps.detach()\nref_logps.zero_()\nreturn value"):
            with self.subTest(body=body):
                result = self.grade_k1(body)
                self.assertIn("(it changed ref_logps in place: an atom leaves its inputs as they are)", result.line)
                self.assertIn("input policy_logps=[-1.0, -2.0], ref_logps=[-2.0, -1.0];", result.line)  # as given

    def test_every_case_builds_new_tensors_on_every_call(self):
        for exercise in EXERCISES:
            for case in exercise.cases:
                with self.subTest(exercise=exercise.name, case=case.name):
                    (first, first_kw), (second, second_kw) = case.inputs(), case.inputs()
                    pairs = list(zip(first, second)) + [(first_kw[key], second_kw[key]) for key in first_kw]
                    for one, other in pairs:
                        if isinstance(one, torch.Tensor):
                            self.assertNotEqual(one.data_ptr(), other.data_ptr())
                            self.assertTrue(torch.equal(one, other))

    def test_a_process_setting_changed_in_an_atom_fails_its_case_and_is_put_back(self):
        for body, named in (
            ("torch.set_default_dtype(torch.float64)", "torch's default dtype (torch.set_default_dtype)"),
            ("torch.set_grad_enabled(False)", "torch's grad mode (torch.set_grad_enabled)"),
            ("torch.set_num_threads(3)", "torch's thread count (torch.set_num_threads)"),
            ("torch.manual_seed(0)", "torch's global random generator"),
            ("torch.rand(1)", "torch's global random generator"),
            ("os.chdir(os.sep)", "the working folder (os.chdir)"),
            ("sys.stdout = sys.stderr", "sys.stdout"),
            ("import rl_lab\nrl_lab.gae = None", "rl_lab.gae"),
            ("import rl_lab\nrl_lab.KL_ESTIMATORS['k3'] = None", "rl_lab.KL_ESTIMATORS"),
            ("import exercise_cases\nexercise_cases.TOLERANCE = 1.0", "exercise_cases.TOLERANCE"),
            ("torch.exp = torch.sin", "torch.exp"),
            ("torch.Tensor.exp = torch.Tensor.sin", "torch.Tensor.exp"),
        ):
            with self.subTest(body=body):
                stdout = sys.stdout
                result = self.grade_k1(body)
                self.assertEqual(process_state(), self.before)
                self.assertIs(sys.stdout, stdout)
                self.assertIn(f"kl_k1: failed case 1 of 4 \"hand: policy minus reference\": input policy_logps=[-1.0, "
                              f"-2.0], ref_logps=[-2.0, -1.0]; it changed {named}", result.line)
                self.assertIn("which the lab put back", result.line)

    def test_a_file_that_changes_the_process_when_imported_is_refused_and_the_lab_is_unchanged(self):
        path = self.write("patches.py", "import torch\nimport rl_lab\n\ntorch.set_default_dtype(torch.float64)\n"
                                        "rl_lab.dpo_loss = lambda *args, **kwargs: 0.0\n"
                                        "rl_lab.KL_ESTIMATORS['k3'] = None\n" + SOLVED_BY_THE_LAB)
        for command in ("check", "train"):
            with self.subTest(command=command):
                stdout, _ = self.one_line_error([command, "--file", path], 1, f"{path}: importing it changes torch's "
                                                "default dtype (torch.set_default_dtype), rl_lab.dpo_loss, "
                                                "rl_lab.KL_ESTIMATORS; the lab put it back")
                self.assertEqual(stdout, "")
        self.assertIs(rl_lab.dpo_loss, BY_NAME["dpo_loss"].solution)
        self.assertIs(rl_lab.KL_ESTIMATORS["k3"], rl_lab.token_kl_penalty)

    def test_a_fault_that_shows_only_in_a_training_run_is_reported_and_the_lab_is_put_back(self):
        graded = len(BY_NAME["dpo_loss"].cases)  # check calls dpo_loss once per case: the run's calls come after
        # (a thread count changed in a run is put back by the run itself: the lab's loops restore theirs)
        for fault, shown in (("torch.set_default_dtype(torch.float64)", "your atoms changed torch's default dtype"),
                             ("sys.exit(4)", "your atoms called sys.exit(4) at"),
                             ("import rl_lab\n        rl_lab.gae = None", "your atoms changed rl_lab.gae")):
            with self.subTest(fault=fault):
                path = self.write("later.py", f"import sys\n\nimport torch\nfrom rl_lab import dpo_loss as lab_dpo\n\n"
                                              f"CALLS = []\n\n\ndef dpo_loss(*args, **kwargs):\n"
                                              f"    CALLS.append(1)\n    if len(CALLS) > {graded}:\n        {fault}\n"
                                              f"    return lab_dpo(*args, **kwargs)\n")
                code, stdout, stderr = run_cli_in_process(exercises.main, ["train", "--file", path, "--steps", "2",
                                                                           "--online-steps", "2"])
                self.assertEqual((code, stderr), (1, ""))
                self.assertIn(f"bandit dpo (2 steps): {shown}", stdout)
                self.assertIn("does NOT learn", stdout.splitlines()[2])
                self.assertEqual(process_state(), self.before)


if __name__ == "__main__":
    unittest.main()
