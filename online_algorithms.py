"""The online driver's algorithm families, each one object with the same methods.

    family = FAMILIES[family_of(cfg.algorithm)](cfg, critic, generator)
    scores  = family.scores(batch)                  # (N,) the reward the credit uses
    credit  = family.credit(batch)                  # advantages, per-token credit or preference pairs
    loss, diagnostics, ratio = family.loss(logps, batch, credit, first_pass, logits)   # one pass of the update
    columns = family.columns(batch, credit)         # its own CSV columns

Three families: the GRPO family (one registered policy loss per algorithm and one registered advantage
per --advantage, with the field's switches), token-level PPO with a critic, and online/offline DPO (one
registered preference loss per --dpo-loss). The registries live in online_registry.py: a new loss
variant is one atom in rl_lab.py, one `register_policy_loss` (or `register_advantage`,
`register_preference_loss`) call there, and one settings line in online_settings.py for a
hyperparameter of its own; verl's `register_policy_loss` is the model.

Shape notation: B prompts, G group size, N = B*G responses, R completion positions, K preference pairs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from library_map import dpo_blocks, group_blocks, ppo_blocks
from online_registry import (  # noqa: F401
    ADVANTAGES, ALGORITHMS, FOUR_ALGORITHMS, POLICY_LOSSES, PREFERENCE_LOSSES, family_of)
from rl_lab import (
    KL_ESTIMATORS,
    STRAIGHT_THROUGH_KINDS,
    adaptive_entropy_coef,
    clip_fraction,
    clipped_policy_loss,
    entropy_bonus,
    gae,
    high_entropy_token_mask,
    kl_k1,
    kl_k3_is_corrected,
    kl_straight_through,
    m2po_mask,
    masked,
    off_policy_sequence_mask,
    overlong_penalty,
    rollout_correction_weights,
    sequence_log_ratio,
    tied_groups,
    token_entropy,
    truncated_importance_weights,
)

GROUP_EPS = ADVANTAGES["grpo"].fixed["eps"]  # the lesson's eps of group_relative_advantages
WHITEN_EPS = 1e-8  # added to the std when PPO whitens its advantages, as TRL's masked_whiten


def groups_tie(rewards, group_size):
    """(B,) bool: every reward of the group equals its first (a group that teaches nothing)."""
    return tied_groups(rewards.reshape(-1, group_size))  # (B*G,) -> (B, G) -> (B,)


# ---------------------------------------------------------------------------------------------
# Registries: one entry per loss variant
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Diagnostics shared by the clipped families
# ---------------------------------------------------------------------------------------------


def ratio_diagnostics(ratio, advantages, cfg, zeroes, first_pass):
    """clip_fraction (the share whose gradient the loss zeroes), the naive share outside the clip range
    and CISPO's capped share, for the ratios one pass saw. The first pass sees ratio 1 exactly."""
    if first_pass or zeroes != "clip":  # CISPO caps the weight and keeps the gradient; SAPO's gate fades it
        zeroed = 0.0
    else:
        zeroed = clip_fraction(ratio, advantages, cfg.epsilon, cfg.epsilon_high, cfg.dual_clip, check=False).item()
    return {
        "clip_fraction": zeroed,
        # the naive count, against eps (0.2 as a yardstick for CISPO and SAPO, which do not clip)
        "outside_clip_range_fraction": ((ratio - 1.0).abs() > cfg.epsilon).double().mean().item(),
        "capped_fraction": (ratio > cfg.epsilon_high).double().mean().item() if zeroes == "cap" else 0.0,
    }


# ---------------------------------------------------------------------------------------------
# The GRPO family
# ---------------------------------------------------------------------------------------------


@dataclass
class GroupCredit:
    """advantages (B*G,) one per response; loss_mask (B*G, R) int64, the batch's mask without the
    truncated responses when they are masked out; importance_weights (B*G, R) or None (TIS, or the
    rollout correction)."""

    advantages: torch.Tensor
    loss_mask: torch.Tensor
    importance_weights: torch.Tensor | None

    def teaches(self):
        return bool(self.loss_mask.bool().any())  # every response masked out (all truncated): nothing to learn


@dataclass
class PassMasks:
    """What one pass's masks leave: loss_mask (B*G, R), the tokens the loss counts; keep (B*G, R) 0/1 or None,
    the factor of each token's policy term (a dropped token stays in the count and the KL); bonus_mask, the
    tokens the entropy bonus averages; columns, the share each mask dropped."""

    loss_mask: torch.Tensor
    keep: torch.Tensor | None
    bonus_mask: torch.Tensor
    columns: dict


class RatioCorrectedK3:
    """`kl_k3_is_corrected` as the per-token estimator a loss calls, estimator(policy, ref, check=False),
    with the old log-probs of the batch being trained on (--kl-estimator k3-is)."""

    def __init__(self, old_logps):
        self.old_logps = old_logps

    def __call__(self, policy_logps, ref_logps, *, check=False):
        return kl_k3_is_corrected(policy_logps, self.old_logps, ref_logps, check=check)


# --kl-estimator names -> the per-token estimator a loss takes; k3+ and k1+ have k3's (k1's) value and k2's
# gradient, k3-is is built per batch (RatioCorrectedK3)
LOSS_KL_ESTIMATORS = KL_ESTIMATORS | {kind: functools.partial(kl_straight_through, kind=kind)
                                      for kind in STRAIGHT_THROUGH_KINDS}
RATIO_CORRECTED_KL = "k3-is"


class GroupFamily:
    """The GRPO family: the registered advantage of `cfg.advantage` (group-relative, RLOO, MaxRL, ...), no
    critic, the registered loss of `cfg.algorithm`, and the switches every loss shares (the importance
    weights, the off-policy and second-moment masks, the entropy bonus and mask)."""

    needs_critic = False

    def __init__(self, cfg, critic=None, generator=None):
        self.cfg, self.entry, self.advantage = cfg, POLICY_LOSSES[cfg.algorithm], ADVANTAGES[cfg.advantage]
        self.kl_estimator = KL_ESTIMATORS.get(cfg.kl_estimator)  # the reward's KL: k1, k2 or k3
        kwargs = {"beta": 0.0 if cfg.kl_in == "reward" else cfg.beta, "check": False}
        if cfg.kl_estimator != RATIO_CORRECTED_KL:
            kwargs["kl_estimator"] = LOSS_KL_ESTIMATORS[cfg.kl_estimator]
        for name in self.entry.reads:
            if name == "reduction":
                kwargs.update(reduction=cfg.reduction, max_new_tokens=cfg.max_new_tokens)
            else:
                kwargs[self.entry.keyword(name)] = getattr(cfg, name)
        kwargs.update(self.entry.fixed)
        if self.entry.generator:  # Clip-Cov draws the tokens it detaches from the run's one generator
            kwargs["generator"] = generator
        self.kwargs = kwargs
        self.reward_components = self.advantage.inputs == "components"  # the rollout scores each reward apart
        self.entropy_coef = cfg.entropy_coef  # moves each optimizer step with --adaptive-entropy
        self.entropy_bonus = cfg.entropy_coef > 0 or cfg.adaptive_entropy is not None
        self.extra_columns = [name for name, on in (
            ("off_policy_masked_fraction", cfg.off_policy_mask is not None),
            ("m2po_masked_fraction", cfg.m2po is not None),
            ("entropy_masked_fraction", cfg.top_entropy_quantile is not None),
            ("entropy_coef", self.entropy_bonus)) if on]

    def parameters(self):
        return []

    def sampler(self):
        """(temperature, top_p) of the sampler: the trainer's unless a mismatch is asked for."""
        return self.cfg.rollout_temperature, self.cfg.rollout_top_p

    def scores(self, batch):
        """(B*G,) the reward the advantages use: the verifier's, plus DAPO's overlong penalty, minus beta
        times the response's summed KL estimate when the KL goes into the reward (TRL's RLOO, verl's
        use_kl_in_reward)."""
        cfg, scores = self.cfg, batch.rewards
        if cfg.overlong_penalty is not None:
            lengths = batch.mask.sum(dim=1)  # (B*G,) kept tokens, the EOS included
            scores = scores + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_penalty, check=False)
        if cfg.kl_in == "reward" and cfg.beta > 0:
            per_token = self.kl_estimator(batch.old_logps, batch.ref_logps, check=False)  # of the sampled tokens
            scores = scores - cfg.beta * masked(per_token, batch.mask).sum(dim=1)
        return scores

    def advantages(self, batch):
        """(B*G,) the registered advantage of the batch's scores (see online_registry.Advantage.inputs)."""
        entry, group_size = self.advantage, self.cfg.group_size
        kwargs = {keyword: getattr(self.cfg, name) for name, keyword in entry.reads.items()} | entry.fixed
        grouped = batch.scores.reshape(-1, group_size)  # (B*G,) -> (B, G)
        if entry.inputs == "scores":
            return entry.function(batch.scores, group_size, **kwargs, check=False)
        if entry.inputs == "groups":
            return entry.function(grouped, **kwargs, check=False).reshape(-1)
        if entry.inputs == "components":  # (B*G, K) -> (B, G, K)
            components = batch.reward_components.reshape(-1, group_size, batch.reward_components.shape[1])
            return entry.function(components, **kwargs, check=False).reshape(-1)
        lengths = batch.mask.sum(dim=1)  # (B*G,) kept tokens, the EOS included
        if entry.inputs == "lengths":
            return entry.function(grouped, lengths.reshape(-1, group_size), **kwargs, check=False).reshape(-1)
        # "tokens": the score on each response's last kept token; at gamma 1 every kept token of a response
        # gets the same whitened return, so its first token's is the response's advantage
        rows = torch.arange(batch.mask.shape[0])
        token_rewards = torch.zeros(batch.mask.shape, dtype=batch.scores.dtype)
        token_rewards[rows, lengths - 1] = batch.scores
        per_token, _ = entry.function(token_rewards, batch.mask, **kwargs, check=False)  # (B*G, R)
        return per_token[:, 0]

    def credit(self, batch):
        """The registered advantages, the loss mask, and the importance weights of --tis-cap (truncated
        importance sampling) or --rollout-correction."""
        cfg = self.cfg
        advantages = self.advantages(batch)
        advantages = advantages.to(batch.old_logps.dtype)  # rewards are float64; a transformer trains in float32
        if cfg.advantage_sign == "positive":  # PSR: only the responses better than their group's mean teach
            advantages = advantages.clamp(min=0.0)
        elif cfg.advantage_sign == "negative":  # NSR: only the worse ones, pushed down (arXiv 2506.01347)
            advantages = advantages.clamp(max=0.0)
        loss_mask = batch.mask
        if cfg.mask_truncated:  # DAPO-style: a cut response has no verdict to learn from
            loss_mask = loss_mask * (~batch.truncated).unsqueeze(1).long()
        weights = None
        if cfg.tis_cap is not None:
            weights = masked(truncated_importance_weights(batch.old_logps, batch.sampler_logps, cfg.tis_cap,
                                                          check=False), batch.mask)
        elif cfg.rollout_correction is not None:
            weights = rollout_correction_weights(
                batch.old_logps, batch.sampler_logps.to(batch.old_logps.dtype), batch.mask, cfg.rollout_correction,
                cfg.rollout_correction_mode, cfg.rollout_correction_low, cfg.rollout_correction_high, check=False)
        return GroupCredit(advantages, loss_mask, weights)

    def masks(self, logps, batch, credit, entropies):
        """The pass's PassMasks, each mask judged on this pass's policy: the responses the off-policy mask
        drops (DeepSeek-V3.2), the tokens M2PO drops, the tokens below the entropy quantile. As TRL does,
        the off-policy and the entropy masks zero the policy term and leave the token in the reduction's
        count and in the KL (a factor beside the importance weights); a loss that takes no weights drops
        the token from its loss mask instead, and so does M2PO."""
        cfg, mask, columns = self.cfg, credit.loss_mask, {}
        if cfg.off_policy_mask is None and cfg.m2po is None and cfg.top_entropy_quantile is None:
            return PassMasks(mask, None, mask, columns)
        kept = max(int(mask.sum().item()), 1)
        sampler_logps = batch.sampler_logps.to(logps.dtype)
        keep = torch.ones_like(logps)  # (B*G, R): the policy term's factor
        if cfg.m2po is not None:
            reduced = m2po_mask(logps, sampler_logps, mask, cfg.m2po, check=False).long()  # (B*G, R)
            columns["m2po_masked_fraction"] = (mask.sum() - reduced.sum()).item() / kept
            mask = reduced
        if cfg.off_policy_mask is not None:
            responses = off_policy_sequence_mask(logps, sampler_logps, credit.advantages, credit.loss_mask,
                                                 cfg.off_policy_mask, check=False)  # (B*G,)
            columns["off_policy_masked_fraction"] = (~responses).double().mean().item()
            keep = keep * responses.unsqueeze(1)  # (B*G,) -> (B*G, 1): the whole response
        bonus_mask = mask
        if cfg.top_entropy_quantile is not None:
            high = high_entropy_token_mask(entropies, credit.loss_mask, cfg.top_entropy_quantile,
                                           check=False)  # (B*G, R)
            columns["entropy_masked_fraction"] = (mask.sum() - high.sum()).item() / kept
            keep, bonus_mask = keep * high, mask * high.long()  # TRL's bonus averages the same tokens
        if not self.entry.weights:
            return PassMasks(mask * keep.long(), None, bonus_mask, columns)
        return PassMasks(mask, keep, bonus_mask, columns)

    def loss(self, logps, batch, credit, first_pass, logits=None):
        """One pass: the registered loss (plus the entropy bonus) and the ratios it saw (per kept token, or
        per response for a sequence-ratio loss). logits (B*G, R, V), with grad: for the entropy switches."""
        cfg, entry, kwargs = self.cfg, self.entry, self.kwargs
        entropies = None
        if self.entropy_bonus or cfg.top_entropy_quantile is not None:
            entropies = token_entropy(logits, check=False)  # (B*G, R), with grad
        masks = self.masks(logps.detach(), batch, credit, None if entropies is None else entropies.detach())
        weights = credit.importance_weights
        if masks.keep is not None:
            weights = masks.keep if weights is None else weights * masks.keep
        if weights is not None:
            kwargs = {**kwargs, "importance_weights": weights}
        if cfg.kl_estimator == RATIO_CORRECTED_KL:
            kwargs = {**kwargs, "kl_estimator": RatioCorrectedK3(masked(batch.old_logps, batch.mask))}
        inputs = (logps, batch.old_logps, batch.ref_logps) if entry.old_policy else (logps, batch.ref_logps)
        loss = entry.function(*inputs, credit.advantages, masks.loss_mask, **kwargs)
        columns = masks.columns
        if self.entropy_bonus:
            loss = loss + entropy_bonus(entropies, masks.bonus_mask, self.entropy_coef, check=False)
            columns["entropy_coef"] = self.entropy_coef
            if cfg.adaptive_entropy is not None:  # Skywork-OR1: one step of the coefficient per optimizer step
                entropy = masked(entropies.detach(), masks.bonus_mask).sum() / masks.bonus_mask.sum().clamp(min=1)
                self.entropy_coef = adaptive_entropy_coef(self.entropy_coef, entropy.item(), cfg.adaptive_entropy,
                                                          check=False)
        with torch.no_grad():
            kept = credit.loss_mask.bool()
            if entry.ratio == "sequence":
                ratio = sequence_log_ratio(logps.detach(), batch.old_logps, credit.loss_mask).exp()  # (B*G,)
                signs = credit.advantages
            else:
                ratio = (logps.detach() - batch.old_logps).exp()[kept]  # (kept,): the ratios this pass's loss saw
                signs = credit.advantages.unsqueeze(1).expand_as(kept)[kept]  # (B*G,) -> (B*G, R) -> (kept,)
            diagnostics = ratio_diagnostics(ratio, signs, self.cfg, entry.zeroes, first_pass)
        return loss, diagnostics | columns, ratio

    def columns(self, batch, credit):
        cfg, kept = self.cfg, batch.mask.bool()
        columns = {"masked_truncated": int(batch.truncated.sum().item()) if cfg.mask_truncated else 0}
        if credit.importance_weights is not None:
            weights = credit.importance_weights[kept]
            columns["importance_weight_mean"] = weights.mean().item()
            if cfg.tis_cap is not None:
                capped = weights >= cfg.tis_cap
            elif cfg.rollout_correction_mode == "mask":  # the share the mask zeroed
                capped = weights == 0
            else:  # the share a bound truncated
                low = cfg.rollout_correction_low
                capped = (weights >= cfg.rollout_correction_high) | ((weights <= low) if low is not None else False)
            columns["importance_weight_capped_fraction"] = capped.double().mean().item()
        return columns

    def per_response(self, batch, credit, row):
        return {"advantage": credit.advantages[row].item()}

    def settings(self):
        cfg = self.cfg
        kept = {"both": None, "positive": "A > 0", "negative": "A < 0"}[cfg.advantage_sign]
        sign = {} if kept is None else {"advantage_sign": f"only {kept} kept: every other advantage set to 0"}
        return {
            **sign,
            "group_advantage_eps": GROUP_EPS,
            "kl": (f"{cfg.kl_estimator} per token, beta times it in the loss" if cfg.kl_in == "loss" else
                   f"beta times the response's summed {cfg.kl_estimator} subtracted from its reward"),
            "truncated_responses": ("dropped from the loss" if cfg.mask_truncated else
                                    "kept in the loss: every real token counts (no EOS to score)"),
        }

    @staticmethod
    def library_blocks(settings):
        return group_blocks(settings)


# ---------------------------------------------------------------------------------------------
# Token-level PPO with a critic
# ---------------------------------------------------------------------------------------------


@dataclass
class TokenCredit:
    """Per-token credit, each (N, R), zeros off the mask, no grad: advantages (whitened over the kept
    tokens unless switched off), token_advantages (before whitening), returns (the critic's targets),
    old_values, token_rewards, next_values; loss_mask is the batch's mask."""

    advantages: torch.Tensor
    token_advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor
    token_rewards: torch.Tensor
    next_values: torch.Tensor
    loss_mask: torch.Tensor

    def teaches(self):
        return True  # every response has a kept token


class TokenPPO:
    """PPO with a critic and GAE per token (InstructGPT's recipe): the KL to the reference folded into
    each token's reward, the verifier's reward on the last token."""

    needs_critic = True
    extra_columns = []
    reward_components = False

    def __init__(self, cfg, critic, generator=None):
        self.cfg, self.critic = cfg, critic

    def parameters(self):
        return self.critic.parameters()

    def sampler(self):
        return None, None

    def scores(self, batch):
        return batch.rewards

    def credit(self, batch):
        """Rewards: -beta * k1(old, ref) on every kept token, plus the verifier's reward on the last kept
        token. A response that ends with EOS is terminated; one that hit max_new_tokens without EOS is, by
        default, a time limit: terminated=False, boundary=True, bootstrapped from V(state after the cap)
        (--truncation terminal treats it as terminal instead, as TRL and verl do). The verifier scores a
        cut response (its reward is paid on the last kept token), so the cap is part of the task and
        terminal is the consistent treatment: bootstrapping as well counts the future twice. Bootstrapping
        is right only where the cut is artificial and gets no verdict (Pardo et al., arXiv 1712.00378).
        With --cap-value table the state after the cap is never trained and keeps value 0, so the default
        gives terminal's numbers. The kept tokens are
        laid out response-major in one stream for `gae`, whose boundary flags stop each trace at its
        response's last token (PAD is never touched)."""
        cfg, mask = self.cfg, batch.mask.bool()
        with torch.no_grad():
            values, after_cap = self.critic.values(batch.prompts, batch.completion_ids)
            token_rewards = -cfg.beta * kl_k1(batch.old_logps, batch.ref_logps, check=False)  # (N, R)
        lengths = mask.sum(dim=1)  # (N,)
        last = lengths - 1
        rows = torch.arange(mask.shape[0])
        token_rewards = masked(token_rewards, mask) + 0.0  # + 0.0: no -0.0
        token_rewards[rows, last] += batch.rewards
        next_values = torch.zeros_like(values)
        next_values[:, :-1] = values[:, 1:]  # V(s_{t+1}) inside the response
        bootstrap = batch.truncated & (cfg.truncation == "bootstrap")
        next_values[rows, last] = torch.where(bootstrap, after_cap, torch.zeros_like(after_cap))
        terminated = torch.zeros_like(mask)
        boundary = torch.zeros_like(mask)
        terminated[rows, last] = ~bootstrap  # EOS, or the cap taken as terminal
        boundary[rows, last] = True
        advantages, returns = gae(  # (kept,) each: the stream of kept tokens, response-major
            token_rewards[mask], values[mask], next_values[mask], terminated[mask], boundary[mask],
            gamma=cfg.gamma, lam=cfg.gae_lambda, check=False,
        )
        token_advantages = torch.zeros_like(values)
        full_returns = torch.zeros_like(values)
        token_advantages[mask] = advantages
        full_returns[mask] = returns
        whitened = token_advantages
        if cfg.whiten_advantages:
            mean, std = token_advantages[mask].mean(), token_advantages[mask].std(correction=0)
            whitened = masked((token_advantages - mean) / (std + WHITEN_EPS), mask)
        return TokenCredit(whitened, token_advantages, full_returns, values, token_rewards, next_values, batch.mask)

    def loss(self, logps, batch, credit, first_pass, logits=None):
        """PPO-Clip per token (mean over kept tokens) plus value_coef times the critic's loss,
        0.5 * mean (V - returns)^2 (clipped around the old values with --value-clip). The advantages are
        detached, so the actor's loss sends no gradient to the critic."""
        cfg, kept = self.cfg, credit.loss_mask.bool()
        count = kept.sum().clamp(min=1)
        per_token = clipped_policy_loss(logps, batch.old_logps, credit.advantages, cfg.epsilon, check=False)  # (N, R)
        policy_loss = masked(per_token, kept).sum() / count
        values, _ = self.critic.values(batch.prompts, batch.completion_ids)  # (N, R), with grad
        squared = (values - credit.returns).square()
        if cfg.value_clip is not None:  # PPO2's value clipping, as TRL and verl
            clipped_values = credit.old_values + (values - credit.old_values).clamp(-cfg.value_clip, cfg.value_clip)
            squared = torch.maximum(squared, (clipped_values - credit.returns).square())
        value_loss = 0.5 * masked(squared, kept).sum() / count
        loss = policy_loss + cfg.value_coef * value_loss
        with torch.no_grad():
            ratio = (logps.detach() - batch.old_logps).exp()[kept]
            diagnostics = ratio_diagnostics(ratio, credit.advantages[kept], cfg, "clip", first_pass)
        diagnostics["value_loss"] = value_loss.item()
        return loss, diagnostics, ratio

    def columns(self, batch, credit):
        kept = credit.loss_mask.bool()
        returns, values = credit.returns[kept], credit.old_values[kept]
        variance = returns.var(correction=0).item()
        rows = torch.arange(kept.shape[0])
        return {
            "explained_variance": 1.0 - (returns - values).var(correction=0).item() / variance if variance > 0 else 0.0,
            "advantage_first_token": credit.token_advantages[:, 0].mean().item(),
            "advantage_last_token": credit.token_advantages[rows, kept.sum(dim=1) - 1].mean().item(),
        }

    def per_response(self, batch, credit, row):
        kept = credit.loss_mask[row].bool()
        return {"per_token": {  # the trace of PPO's credit, one entry per kept token
            "rewards": credit.token_rewards[row][kept].tolist(),
            "values": credit.old_values[row][kept].tolist(),
            "next_values": credit.next_values[row][kept].tolist(),
            "advantages": credit.token_advantages[row][kept].tolist(),
            "returns": credit.returns[row][kept].tolist(),
        }}

    def settings(self):
        return {
            "critic": self.critic.description,
            "kl": "per-token reward -beta * k1 against the reference, plus the verifier's reward on the last token",
            "state_after_the_cap": self.critic.after_cap,
            "whiten_eps": WHITEN_EPS,
        }

    @staticmethod
    def library_blocks(settings):
        return ppo_blocks(settings)


# ---------------------------------------------------------------------------------------------
# Online and offline DPO
# ---------------------------------------------------------------------------------------------


@dataclass
class PairCredit:
    """chosen / rejected (K,) rows of the batch, one pair per prompt whose rewards vary; tied_prompts,
    the prompts that gave no pair; loss_mask the batch's mask."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    tied_prompts: int
    loss_mask: torch.Tensor

    def teaches(self):
        return self.chosen.numel() > 0  # a batch without a pair (every prompt tied) takes no step


class PreferenceFamily:
    """DPO and its family on pairs made from the sampled groups: per prompt, the response with the
    highest verifier reward (chosen) against the lowest (rejected), against the frozen initial policy."""

    needs_critic = False

    extra_columns = []
    reward_components = False

    def __init__(self, cfg, critic=None, generator=None):
        self.cfg, self.entry = cfg, PREFERENCE_LOSSES[cfg.dpo_loss]

    def parameters(self):
        return []

    def sampler(self):
        return None, None

    def scores(self, batch):
        return batch.rewards

    def credit(self, batch):
        """The first in sampling order among equals; groups whose rewards all tie give no pair. With
        --dpo-rejected nearest (farthest) the rejected is, among the group's lowest-reward responses, the one
        that differs from the chosen in the fewest (most) token positions (`pair_distances`)."""
        group_size = self.cfg.group_size
        grouped = batch.rewards.reshape(-1, group_size)  # (B, G)
        offsets = torch.arange(grouped.shape[0]) * group_size
        varies = ~groups_tie(batch.rewards, group_size)
        chosen = grouped.argmax(dim=1) + offsets  # (B,)
        if self.cfg.dpo_rejected == "first":
            rejected = grouped.argmin(dim=1) + offsets
        else:
            distances = pair_distances(batch.completion_ids, batch.real, chosen, group_size)  # (B, G)
            lowest = grouped == grouped.min(dim=1, keepdim=True).values  # (B, G): the candidates
            if self.cfg.dpo_rejected == "nearest":
                rejected = torch.where(lowest, distances, distances.new_tensor(batch.real.shape[1] + 1)).argmin(dim=1)
            else:
                rejected = torch.where(lowest, distances, distances.new_tensor(-1)).argmax(dim=1)
            rejected = rejected + offsets
        return PairCredit(chosen[varies], rejected[varies], int((~varies).sum().item()), batch.mask)

    def sequence_logps(self, logps, mask):
        """(N,) a response's log-prob: the sum over its kept tokens, or their mean (--sequence-logp)."""
        kept = masked(logps, mask).sum(dim=1)
        if self.cfg.sequence_logp == "mean":
            return kept / mask.sum(dim=1).clamp(min=1)
        return kept

    def loss(self, logps, batch, credit, first_pass, logits=None):
        """One pass of the preference loss over the pairs, and the relative margin it saw (nats)."""
        cfg, chosen, rejected = self.cfg, credit.chosen, credit.rejected
        sequence = self.sequence_logps(logps, batch.mask)  # (N,)
        ref = self.sequence_logps(batch.ref_logps, batch.mask)
        extra = {keyword: getattr(cfg, name) for name, keyword in self.entry.reads.items()}
        references = (ref[chosen], ref[rejected]) if self.entry.reference else ()
        per_pair = self.entry.function(sequence[chosen], sequence[rejected], *references, cfg.dpo_beta, **extra,
                                   check=False)
        with torch.no_grad():  # the relative margin each pass saw, in nats of sequence log-prob
            margin = ((sequence[chosen] - sequence[rejected]) - (ref[chosen] - ref[rejected])).mean().item()
        return per_pair.mean(), {"preference_margin": margin}, None

    def columns(self, batch, credit):
        return {"pairs": int(credit.chosen.numel()), "tied_prompts": credit.tied_prompts}

    def per_response(self, batch, credit, row):
        return {}

    def settings(self):
        nearest = {"nearest": "the one nearest to the chosen", "farthest": "the one farthest from the chosen"}
        among = "" if self.cfg.dpo_rejected == "first" else (
            f" ({nearest[self.cfg.dpo_rejected]} in differing token positions among the lowest)")
        return {
            "pairs": (f"per prompt, the highest-reward response (chosen) against the lowest (rejected){among}; "
                      "prompts whose rewards all tie give no pair"),
            "data": ("sampled from the frozen initial policy, B x G per iteration" if self.cfg.offline
                     else "sampled from the current policy each iteration"),
        }

    @staticmethod
    def library_blocks(settings):
        return dpo_blocks(settings)


def differing_positions(completion_ids, real, first, second):
    """(K,) int64: in how many of the R positions response first[k] differs from response second[k]: its
    token, or whether the position is part of the response (a shorter response ends where the longer one
    goes on; PAD shares EOS's id, so the ids alone would not say). completion_ids (N, R), real (N, R) bool,
    first and second (K,) row indices."""
    differs = (completion_ids[first] != completion_ids[second]) | (real[first] != real[second])  # (K, R)
    return differs.sum(dim=1)


def pair_distances(completion_ids, real, chosen, group_size):
    """(B, G) int64: `differing_positions` of each response from its group's chosen one (chosen (B,) row
    indices; the chosen itself is at 0)."""
    rows = torch.arange(completion_ids.shape[0])
    distances = differing_positions(completion_ids, real, chosen.repeat_interleave(group_size), rows)  # (B*G,)
    return distances.reshape(-1, group_size)  # (B*G,) -> (B, G)


FAMILIES = {"group": GroupFamily, "ppo": TokenPPO, "dpo": PreferenceFamily}


def mean_of(values):
    return math.fsum(values) / len(values) if values else 0.0
