"""Exact quantities of a table policy, every response enumerated and nothing sampled: the probability of
each response and of each reward, expected lengths, the exact policy gradient against the expectation of
its estimate under a mismatched sampler; the exact per-prompt weight of group std scaling; and the bandit's
KL-regularized optima checked against their objectives' gradients; the first-order entropy change of a
softmax under a change of its logits; k2's bias on a pair small enough to compute by hand."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

import rl_lab
from policies import TablePolicy, logps_of_tokens, nucleus
from rl_lab import DTYPE


@dataclass
class Responses:
    """Every response a table policy can write to every prompt, with its reward: prompts (M,) int64
    (prompt-major), completion_ids (M, R) int64 (PAD after the first EOS), real (M, R) bool (up to and
    including the first EOS), truncated (M,) bool, rewards (M,) float64, lengths (M,) float64 (the real
    tokens), prompt_count P. M = P * (sum_{k<R} (V-1)^k + (V-1)^R): 378 for the binary task at R = 5."""

    prompts: torch.Tensor
    completion_ids: torch.Tensor
    real: torch.Tensor
    truncated: torch.Tensor
    rewards: torch.Tensor
    lengths: torch.Tensor
    prompt_count: int


def all_responses(task, length):
    """Every response of `task` in at most `length` tokens to each train prompt (see `Responses`): k
    non-EOS tokens then EOS for k < length, and every `length` non-EOS tokens (truncated)."""
    words = [token for token in range(len(task.vocab)) if token != task.eos_id]
    bodies = [(list(body) + [task.eos_id], False) for k in range(length) for body in itertools.product(words, repeat=k)]
    bodies += [(list(body), True) for body in itertools.product(words, repeat=length)]
    ids = torch.full((len(bodies), length), task.pad_id, dtype=torch.long)
    real = torch.zeros(len(bodies), length, dtype=torch.bool)
    for row, (tokens, _) in enumerate(bodies):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        real[row, : len(tokens)] = True
    truncated = torch.tensor([cut for _, cut in bodies])
    prompt_count = task.prompt_count("train")
    prompts = torch.arange(prompt_count).repeat_interleave(len(bodies))  # (P,) -> (P*M,), prompt-major
    ids, real, truncated = ids.repeat(prompt_count, 1), real.repeat(prompt_count, 1), truncated.repeat(prompt_count)
    rewards = task.rewards(prompts, ids, real, truncated)
    return Responses(prompts, ids, real, truncated, rewards, real.sum(dim=1).to(DTYPE), prompt_count)


def token_logps(table, responses, temperature, top_p=None):
    """(M, R) log-prob of each token of every response under the table tempered by `temperature` (and
    restricted to the top-p nucleus, as a sampler draws), 0 past each response's end; a token outside the
    nucleus has -inf (that response is never drawn)."""
    logits = TablePolicy(table, temperature, None).logits(responses.prompts, responses.completion_ids)  # (M, R, V)
    if top_p is None:
        logps = logps_of_tokens(logits, responses.completion_ids)
    else:
        probs = nucleus(torch.softmax(logits, dim=-1).reshape(-1, logits.shape[-1]), top_p)  # (M*R, V)
        chosen = probs.reshape(logits.shape).gather(-1, responses.completion_ids.unsqueeze(-1)).squeeze(-1)
        logps = chosen.log()  # (M, R, 1) -> (M, R)
    return torch.where(responses.real, logps, torch.zeros_like(logps))


def response_probabilities(state, responses):
    """(M,) exact probability of each enumerated response under the run's current policy."""
    with torch.no_grad():
        return token_logps(state.policy.table.detach(), responses, state.cfg.temperature).sum(dim=1).exp()


REWARD_CLASSES = (0.0, 0.25, 1.0)  # the binary task's rewards: wrong, partial credit, correct


def reward_distribution(state, responses=None):
    """(P, 3) exact probabilities of the rewards 0, 0.25 and 1 for each prompt under the run's current
    table policy, summed over every response (`all_responses`)."""
    responses = all_responses(state.task, state.cfg.max_new_tokens) if responses is None else responses
    probabilities = response_probabilities(state, responses)
    distribution = torch.zeros(responses.prompt_count, len(REWARD_CLASSES), dtype=DTYPE)
    for index, reward in enumerate(REWARD_CLASSES):
        hits = responses.rewards == reward
        distribution[:, index].index_add_(0, responses.prompts[hits], probabilities[hits])
    return distribution


def expected_lengths(policy):
    """(P,) exact E[length] of each prompt's response under a table policy (tokens, EOS included): the sum
    over positions of the probability that the response is still running there, by the chain rule over
    the table's (position, previous token) states, as TablePolicy.response_kl walks them."""
    with torch.no_grad():
        probs = torch.softmax(policy.table.detach() / policy.temperature, dim=-1)  # (P, R, S, V)
        prompts, length, states, vocab = probs.shape
        reach = torch.zeros(prompts, states, dtype=probs.dtype)  # (P, S): p(running, previous token = s)
        reach[:, policy.bos_state] = 1.0
        total = torch.zeros(prompts, dtype=probs.dtype)
        for position in range(length):
            total = total + reach.sum(dim=1)  # a running response writes one token here
            flow = (reach.unsqueeze(-1) * probs[:, position]).sum(dim=1)  # (P, S, V) -> (P, V): p(next token)
            reach = torch.zeros_like(reach)
            reach[:, :vocab] = flow
            reach[:, policy.eos_id] = 0.0  # an EOS ends the response
        return total


def expected_wrong_length(state):
    """E[length | not correct] for a prompt drawn uniformly: the exact mean length (tokens, EOS included)
    of the answers that are not correct (partial credit included), under the run's current policy. What
    a sampled mean_wrong_length estimates, without its noise and without its gaps where a batch held no
    wrong answer. None when every answer is correct."""
    owner, prompts, ids, real, reachable, count = state.evaluation["train"]
    with torch.no_grad():
        logps = logps_of_tokens(state.policy.logits(prompts, ids), ids)  # (M, L) the correct answers
        path = torch.where(reachable, torch.where(real, logps, torch.zeros_like(logps)).sum(dim=1).exp(),
                           torch.zeros(ids.shape[0], dtype=logps.dtype))  # (M,)
        correct_mass = path.sum()
        correct_tokens = (path * real.sum(dim=1)).sum()
        wrong_mass = count - correct_mass
        wrong_tokens = expected_lengths(state.policy).sum() - correct_tokens
    return (wrong_tokens / wrong_mass).item() if wrong_mass > 0 else None


def expected_policy_gradients(table, responses, temperature, sampler_temperature=None, top_p=None, tis_cap=None):
    """(grad J, E_q[g]): the exact gradient of the expected reward and the exact expectation of its
    estimate when responses are drawn by a sampler q that may differ from the trainer p (another
    temperature, top-p), with or without truncated importance weights min(p_t / q_t, cap) per token (Yao et
    al. 2025). Both (P, R, S, V), like the table; every response enumerated, nothing sampled.

    J(theta) = mean over prompts of sum_y p_theta(y) R(y). The estimate from one response y ~ q is
    g = sum_t w_t (R(y) - b) grad log p_theta(y_t | y_<t): the policy term that GRPO's loss reduces to at
    ratio 1 (before its length and std normalization), with b = E_q[R] of the prompt (what a group mean
    estimates). With q = p and w = 1, E_q[g] = grad J exactly (b drops out: sum_y grad p_theta(y) = 0).
    table: the trainer's logits (detached inside); temperature: the trainer's."""
    table = table.detach().clone().requires_grad_(True)
    logps = token_logps(table, responses, temperature)  # (M, R), with grad
    prompts = responses.prompt_count
    objective = (logps.sum(dim=1).exp() * responses.rewards).sum() / prompts
    (exact,) = torch.autograd.grad(objective, table, retain_graph=True)  # logps serve the estimate too
    with torch.no_grad():
        sampler_logps = token_logps(table, responses, sampler_temperature or temperature, top_p)  # (M, R)
        drawn = torch.isfinite(sampler_logps)  # False for a token outside the nucleus: never drawn
        q = sampler_logps.sum(dim=1).exp()  # (M,) 0 for a response that holds such a token
        baseline = torch.zeros(prompts, dtype=DTYPE).index_add_(0, responses.prompts, q * responses.rewards)
        advantages = responses.rewards - baseline[responses.prompts]  # (M,)
        weights = torch.ones_like(sampler_logps)
        if tis_cap is not None:
            safe = torch.where(drawn, sampler_logps, torch.zeros_like(sampler_logps))
            weights = (logps.detach() - safe).exp().clamp(max=tis_cap)
        weights = torch.where(responses.real & drawn, weights, torch.zeros_like(weights))
    surrogate = (q * advantages * (weights * logps).sum(dim=1)).sum() / prompts
    (estimated,) = torch.autograd.grad(surrogate, table)
    return exact, estimated


def policy_gradient_bias(table, responses, temperature, sampler_temperature=None, top_p=None, tis_cap=None):
    """||E_q[g] - grad J|| / ||grad J|| of `expected_policy_gradients`: how far, relative to its size, the
    expected policy-gradient estimate of a mismatched sampler is from the exact gradient (0 on-policy)."""
    exact, estimated = expected_policy_gradients(table, responses, temperature, sampler_temperature, top_p, tis_cap)
    return ((estimated - exact).norm() / exact.norm()).item()


def k2_worked_example():
    """(E_pi[k2], KL(pi || ref)) in float64 on rl_lab's worked pair pi = (1/2, 1/4, 1/4), ref = (1/4, 1/4, 1/2),
    from the atom kl_k2: by hand E[k2] = (1/2)(1/2 ln^2 2 + 1/4 ln^2 2) = (3/8) ln^2 2 = 0.1802 and
    KL = 1/2 ln 2 - 1/4 ln 2 = (1/4) ln 2 = 0.1733, a relative bias of 1.5 ln 2 - 1 = +0.0397."""
    probs = torch.tensor([0.5, 0.25, 0.25], dtype=DTYPE)
    logp, ref_logp = probs.log(), torch.tensor([0.25, 0.25, 0.5], dtype=DTYPE).log()
    return (probs * rl_lab.kl_k2(logp, ref_logp)).sum().item(), (probs * (logp - ref_logp)).sum().item()


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


def kl_optimum_gradient(betas):
    """The largest |gradient| on the logits of each exact bandit objective at its closed form, over `betas`:
    E[R] - beta KL(pi || ref) at rl_lab.kl_optimum_logp, E[R] - beta KL(ref || pi) at
    rl_lab.forward_kl_optimum_logp (mean over contexts; uniform reference). 0 up to rounding where the
    closed forms are the optima."""
    rewards = rl_lab.reward_table()
    ref_logp = torch.full_like(rewards, -math.log(rl_lab.NUM_ACTIONS))
    largest = 0.0
    for beta in betas:
        objectives = (  # logp (X, A) -> the objective, a scalar
            (rl_lab.kl_optimum_logp,
             lambda logp: (logp.exp() * (rewards - beta * (logp - ref_logp))).sum(dim=-1).mean()),
            (rl_lab.forward_kl_optimum_logp,
             lambda logp: ((logp.exp() * rewards).sum(dim=-1) + beta * (ref_logp.exp() * logp).sum(dim=-1)).mean()))
        for optimum, objective in objectives:
            logits = optimum(rewards, ref_logp, beta).clone().requires_grad_(True)
            with torch.enable_grad():
                (gradient,) = torch.autograd.grad(objective(torch.log_softmax(logits, dim=-1)), logits)
            largest = max(largest, gradient.abs().max().item())
    return largest


def first_order_entropy_change(logits, new_logits):
    """(...) the first-order change of the entropy of softmax(logits) over the last axis when the logits
    move to new_logits: sum_a dH/dz_a dz_a with dH/dz_a = -p_a (log p_a + H), that is -Cov_{a~p}(log p(a),
    dz(a)) (Cui et al., arXiv 2505.22617, lemma 1). With dz = lr p A (a policy-gradient step on a softmax)
    it is -lr Cov(log p, p A); with dz = lr A (natural gradient) -lr Cov(log p, A). Shapes (..., V) in."""
    logp = torch.log_softmax(logits, dim=-1)
    probs = logp.exp()
    entropy = -(probs * logp).sum(dim=-1, keepdim=True)  # (..., 1)
    return -(probs * (logp + entropy) * (new_logits - logits)).sum(dim=-1)


def loophole_table(task, prompts, loophole="reuse"):
    """The flawed verifier against the correct one on every expression of 2 to numbers_per_prompt numbers
    (repeats allowed) over each prompt's numbers, then EOS, for each of `prompts` (global indices): per prompt, how many
    each accepts, on average; and how many expressions break the loophole's contract (the flawed verifier
    rewards less than the correct one, or differs from it on an expression without a repeated number).
    JSON-ready: {"prompts", "expressions_per_prompt", "correct_per_prompt", "proxy_per_prompt",
    "proxy_only_per_prompt", "violations"}."""
    operators = [task.vocab.index(op) for op in task.operators]
    prompts = list(prompts)
    width = 2 * task.config.numbers_per_prompt  # the longest expression and its EOS
    expressions = correct = proxy = violations = 0
    for prompt in prompts:
        numbers = task.prompt_numbers(prompt)
        bodies, repeats = [], []
        for count in range(2, len(numbers) + 1):
            for chosen in itertools.product(numbers, repeat=count):
                for ops in itertools.product(operators, repeat=count - 1):
                    bodies.append([chosen[0]] + [token for pair in zip(ops, chosen[1:]) for token in pair])
                    repeats.append(len(set(chosen)) < count)
        ids = torch.tensor([body + [task.eos_id] * (width - len(body)) for body in bodies])  # (M, R): EOS, PAD
        real = torch.tensor([[column <= len(body) for column in range(width)] for body in bodies])  # body, EOS
        owner, cut = torch.full((len(bodies),), prompt), torch.zeros(len(bodies), dtype=torch.bool)
        true = task.rewards(owner, ids, real, cut)  # (M,)
        flawed = task.rewards(owner, ids, real, cut, loophole=loophole)
        repeated = torch.tensor(repeats)
        expressions += len(bodies)
        correct += int((true == 1.0).sum())
        proxy += int((flawed == 1.0).sum())
        violations += int(((flawed < true) | (~repeated & (flawed != true))).sum())
    return {"prompts": len(prompts), "expressions_per_prompt": expressions / len(prompts),
            "correct_per_prompt": correct / len(prompts), "proxy_per_prompt": proxy / len(prompts),
            "proxy_only_per_prompt": (proxy - correct) / len(prompts), "violations": violations}
