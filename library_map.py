"""What TRL and verl call each setting of the online driver: the "trl" and "verl" blocks of every
online.json, and the table of docs/bridge.md.

    python library_map.py                 # one block per setting: lab setting -> TRL, verl, what still differs
    .venv-bridge/bin/python bridge.py check   # builds every block into the libraries' own config objects (the extra)

For one run's settings, `library_blocks(settings)` returns {"trl": ..., "verl": ...}; what is particular to a
loss or an advantage comes from its registry entry (online_registry.py), so this file names none. Each block holds
"config" (the library's config class or file), "options" (the option names and values that configure
the same computation there; None, with a "reason", when the library has no trainer for it),
"unmatched" (the lab's settings with no equivalent, each with a one-line reason) and "differences"
(what still differs when the options are set). Checked against the released libraries as installed
by requirements-bridge.txt: TRL 1.16.0 (trl/trainer/grpo_config.py, grpo_trainer.py, rloo_config.py,
rloo_trainer.py, dpo_config.py, dpo_trainer.py, experimental/cpo, experimental/online_dpo) and verl
0.9.1 (verl/trainer/config/ppo_trainer.yaml, actor/actor.yaml, reward/reward.yaml,
verl/trainer/ppo/core_algos.py, verl/trainer/ppo/v1/trainer_base.py, replay_buffer.py). `bridge.py
check` builds every block into TRL's config classes and verl's composed Hydra config, and `bridge.py
conformance` runs the libraries' own loss code on the lab's batches; option names move between
versions, so both are rerun whenever the pins move.
"""

from __future__ import annotations

import sys

from lab.io import OneLineErrorParser, run_cli
from online_registry import (
    ACTOR,
    ADVANTAGES,
    POLICY_LOSSES,
    PREFERENCE_LOSSES,
    VERL_NO_DUAL_CLIP,
    epsilon_high_of,
    family_of,
)

ROLLOUT = "actor_rollout_ref.rollout."

VERL_AGG_MODES = {"sequence": "seq-mean-token-mean", "token": "token-mean", "constant": "seq-mean-token-sum-norm"}
VERL_KL_NAMES = {"k1": "k1", "k2": "mse", "k3": "low_var_kl", "k3+": "k3+", "k1+": "k1+"}
TRL_NO_PPO = ("TRL 1.16 has no PPO trainer: trl.experimental.ppo was removed (no PPOConfig or PPOTrainer in the "
              "package); verl's block is the way out for PPO")
RLOO_LOSS = ("TRL's RLOOTrainer has one loss: PPO-clip of one ratio per sequence, exp of the SUMMED token "
             "log-ratios, averaged over sequences")


def _common(s):
    """(TRL options, verl options) of the sampler and optimizer, shared by the GRPO family and PPO."""
    trl = {"num_generations": s["group_size"], "max_completion_length": s["max_new_tokens"],
           "temperature": s["temperature"], "num_iterations": s["updates_per_batch"],
           "learning_rate": s["learning_rate"], "max_grad_norm": s["max_grad_norm"]}
    verl = {ROLLOUT + "n": s["group_size"], "data.max_response_length": s["max_new_tokens"],
            ROLLOUT + "temperature": s["temperature"], ACTOR + "ppo_epochs": s["updates_per_batch"],
            ACTOR + "optim.lr": s["learning_rate"], ACTOR + "grad_clip": s["max_grad_norm"]}
    return trl, verl


# ---------------------------------------------------------------------------------------------
# The GRPO family: the loss's and the advantage's own options come from their registry entries
# (online_registry.py); what follows is what every loss shares.
# ---------------------------------------------------------------------------------------------


def _trl_rloo(s, loss, options, unmatched, differences):
    """RLOOConfig's part: one loss of its own, no IS correction, the KL (k1) only in the reward."""
    if loss.rloo_epsilon:
        options.update({"epsilon": s["epsilon"], "epsilon_high": epsilon_high_of(s)})
    if not loss.rloo_loss:
        unmatched[f"algorithm={s['algorithm']}"] = RLOO_LOSS + f"; no {s['algorithm']} loss"
    differences.append(RLOO_LOSS + "; the lab clips each token's ratio and reduces by its --reduction")
    if s["dual_clip"] is not None:
        unmatched["dual_clip"] = "RLOOConfig has no delta or dual-clip option"
    if s["tis_cap"] is not None:
        unmatched["tis_cap"] = "RLOOConfig has no importance-sampling correction options"
    options["beta"] = 0.0
    if s["kl_in"] == "reward" and s["kl_estimator"] == "k1":
        options["beta"] = s["beta"]
    elif s["kl_in"] == "reward":
        unmatched[f"kl_estimator={s['kl_estimator']}"] = "RLOO's reward KL is k1 only (summed over the response)"
    elif s["beta"] > 0:
        unmatched["kl_in=loss"] = ("RLOOConfig's beta subtracts beta * (summed k1) from the reward: RLOO has no "
                                   "KL loss term")


def _trl_grpo_config(s, loss, options, unmatched, differences):
    """GRPOConfig's part: the loss's entry, then the KL and the importance-sampling correction."""
    loss.trl(s, options, unmatched, differences)
    # TRL 1.16 corrects k3 by default (use_bias_correction_kl: k3 times the ratio pi/pi_old, whose expected
    # gradient is that of KL(pi || ref), the DeepSeek-V3.2 correction). The lab's k3 is the uncorrected one of
    # the lesson and DeepSeekMath, so the map turns the correction off unless --kl-estimator k3-is asks for it.
    options["use_bias_correction_kl"] = s["kl_estimator"] == "k3-is"
    if s["kl_in"] == "loss":
        options["beta"] = s["beta"]
        if s["kl_estimator"] not in ("k3", "k3-is"):
            unmatched[f"kl_estimator={s['kl_estimator']}"] = "TRL's GRPO loss has only k3"
        if s["kl_estimator"] == "k3-is" and loss.ratio == "sequence":
            differences.append("TRL's k3 correction at importance_sampling_level=sequence multiplies by the "
                               "sequence's ratio s_i; the lab's by each token's")
    else:
        options["beta"] = 0.0
        unmatched["kl_in=reward"] = ("TRL's GRPO KL is a loss term; only RLOOTrainer folds a KL (k1, summed) "
                                     "into the reward")
    if s["tis_cap"] is not None:
        options.update({"use_vllm": True, "vllm_importance_sampling_correction": True,
                        "vllm_importance_sampling_mode": "token_truncate",
                        "vllm_importance_sampling_clip_max": s["tis_cap"]})
        differences.append("TRL corrects vLLM's numerics against the trainer's, and only with use_vllm; its "
                           "default mode is sequence_mask, not token_truncate")
    elif s["rollout_correction"] is not None:
        options.update({"use_vllm": True, "vllm_importance_sampling_correction": True,
                        "vllm_importance_sampling_mode": f"{s['rollout_correction']}_{s['rollout_correction_mode']}",
                        "vllm_importance_sampling_clip_max": s["rollout_correction_high"]})
        if s["rollout_correction_low"] is not None:
            options["vllm_importance_sampling_clip_min"] = s["rollout_correction_low"]
        differences.append("TRL corrects vLLM's numerics against the trainer's, and only with use_vllm")
    else:
        options["vllm_importance_sampling_correction"] = False
    if s["off_policy_mask"] is not None:
        options["off_policy_mask_threshold"] = s["off_policy_mask"]
    _trl_entropy(s, options, unmatched, differences)


def _trl_entropy(s, options, unmatched, differences):
    if s["entropy_coef"] > 0 or s["adaptive_entropy"] is not None:
        options["entropy_coef"] = s["entropy_coef"]
    if s["adaptive_entropy"] is not None:
        options.update({"use_adaptive_entropy": True, "entropy_target": s["adaptive_entropy"]})
        differences.append("TRL applies the adaptive coefficient only while the entropy is at or below its "
                           "target; the lab applies it always")
    if s["top_entropy_quantile"] is not None:
        options["top_entropy_quantile"] = s["top_entropy_quantile"]
        differences.append("TRL takes the entropy quantile in float32")


def _trl_group(s):
    """TRL's GRPOConfig (or RLOOConfig for --advantage rloo) for the GRPO family."""
    options, _ = _common(s)
    unmatched, differences = {}, []
    loss, advantage = POLICY_LOSSES[s["algorithm"]], ADVANTAGES[s["advantage"]]
    advantage.trl(s, options, unmatched, differences)
    rloo = advantage.trl_config == "RLOOConfig"
    (_trl_rloo if rloo else _trl_grpo_config)(s, loss, options, unmatched, differences)
    if s["mask_truncated"]:
        options["mask_truncated_completions"] = True
    if s["overlong_penalty"] is not None:
        unmatched["overlong_penalty"] = ("a reward function, not an option: trl.rewards."
                                         f"get_soft_overlong_punishment({s['max_new_tokens']}, "
                                         f"{s['overlong_penalty']})")
    if s["dynamic_sampling"]:
        unmatched["dynamic_sampling"] = "TRL does not support DAPO's dynamic sampling (its docs say so)"
    if s["rollout_temperature"] is not None or s["rollout_top_p"] is not None:
        unmatched["rollout_temperature/top_p"] = ("TRL samples and scores at one temperature; the mismatch it "
                                                  "corrects is vLLM's numerics")
    if s["m2po"] is not None:
        unmatched["m2po"] = "TRL has no second-moment mask (AReaL's actor.m2_threshold)"
    if s["advantage_sign"] != "both":
        unmatched[f"advantage_sign={s['advantage_sign']}"] = "TRL has no option that keeps one sign of the advantages"
    _reward_functions(s, unmatched)
    return {"config": advantage.trl_config, "options": options, "unmatched": unmatched, "differences": differences}


def _reward_functions(s, unmatched):
    """The lab's rewards that are not its verifier's: in TRL and verl, a reward function of one's own."""
    if s["random_reward"] is not None:
        unmatched["random_reward"] = ("a reward function, not an option: one returning 1 with probability "
                                      f"{s['random_reward']}, whatever the completion")
    if s["verifier_loophole"] is not None:
        unmatched["verifier_loophole"] = ("a reward function, not an option: the Countdown verifier with the "
                                          f"{s['verifier_loophole']} loophole")


def _verl_group(s):
    """verl's ppo_trainer.yaml overrides for the GRPO family."""
    _, options = _common(s)
    unmatched, differences = {}, []
    loss = POLICY_LOSSES[s["algorithm"]]
    ADVANTAGES[s["advantage"]].verl(s, options, unmatched, differences)
    if "reduction" in loss.reads:  # a loss without a reduction of its own sets its loss_agg_mode itself
        options[ACTOR + "loss_agg_mode"] = VERL_AGG_MODES[s["reduction"]]
        if s["reduction"] == "constant":
            options[ACTOR + "loss_scale_factor"] = s["max_new_tokens"]
    loss.verl(s, options, unmatched, differences)
    if s["kl_in"] == "loss":
        options.update({ACTOR + "use_kl_loss": s["beta"] > 0, ACTOR + "kl_loss_coef": s["beta"]})
        if s["kl_estimator"] in VERL_KL_NAMES:
            options[ACTOR + "kl_loss_type"] = VERL_KL_NAMES[s["kl_estimator"]]
        else:
            options[ACTOR + "kl_loss_type"] = VERL_KL_NAMES["k3"]
            unmatched[f"kl_estimator={s['kl_estimator']}"] = "verl has no ratio-corrected k3 (TRL's default)"
        options["algorithm.use_kl_in_reward"] = False
        if s["kl_estimator"] in ("k3", "k3+"):
            differences.append("verl's low_var_kl clamps the log-ratio to +-20 and k3 to [-10, 10]")
    else:
        options.update({"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "fixed",
                        "algorithm.kl_ctrl.kl_coef": s["beta"],
                        "algorithm.kl_penalty": VERL_KL_NAMES[s["kl_estimator"]], ACTOR + "use_kl_loss": False})
        differences.append("verl adds the KL penalty to each token's reward; the lab subtracts beta times the "
                           "response's summed estimate from the response's reward (the same total)")
    if s["mask_truncated"]:
        unmatched["mask_truncated"] = "verl has no option to drop truncated responses from the loss"
    if s["overlong_penalty"] is not None:
        # reward_kwargs is not in verl's composed config: Hydra adds it only with the + prefix
        options.update({"reward.reward_manager.name": "dapo",
                        "+reward.reward_kwargs.max_resp_len": s["max_new_tokens"],
                        "+reward.reward_kwargs.overlong_buffer_cfg.enable": True,
                        "+reward.reward_kwargs.overlong_buffer_cfg.len": s["overlong_penalty"],
                        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
                        "+reward.reward_kwargs.overlong_buffer_cfg.log": False})
    if s["dynamic_sampling"]:
        # "reward" is verl 0.9's name for the response's own reward; other names read reward_extra_info
        options.update({"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "reward"})
        unmatched["max_resample_rounds"] = ("verl 0.9's trainer ignores filter_groups.max_num_gen_batches (it warns): "
                                            "it resamples without a cap")
    if s["rollout_temperature"] is not None or s["rollout_top_p"] is not None:
        unmatched["rollout_temperature/top_p"] = ("verl scores at the rollout's temperature; the mismatch it "
                                                  "corrects is the inference engine's numerics")
    if s["tis_cap"] is not None:
        options.update({"algorithm.rollout_correction.rollout_is": "token",
                        "algorithm.rollout_correction.rollout_is_threshold": s["tis_cap"],
                        ROLLOUT + "calculate_log_probs": True})
    _verl_rollout_correction(s, options, unmatched, differences)
    for name, reason in (("off_policy_mask", "verl has no off-policy sequence mask (TRL's off_policy_mask_threshold)"),
                         ("m2po", "verl has no second-moment mask (AReaL's actor.m2_threshold)"),
                         ("adaptive_entropy", "verl's entropy_coeff is a constant"),
                         ("top_entropy_quantile", "verl has no high-entropy token mask (TRL's top_entropy_quantile)")):
        if s[name] is not None:
            unmatched[name] = reason
    if s["advantage_sign"] != "both":
        unmatched[f"advantage_sign={s['advantage_sign']}"] = "verl has no option that keeps one sign of the advantages"
    if s["entropy_coef"] > 0:
        options[ACTOR + "entropy_coeff"] = s["entropy_coef"]
        differences.append("verl's entropy bonus is reduced by its loss_agg_mode; the lab's by the token mean")
    _reward_functions(s, unmatched)
    return {"config": "ppo_trainer.yaml", "options": options, "unmatched": unmatched, "differences": differences}


def _verl_rollout_correction(s, options, unmatched, differences):
    if s["rollout_correction"] is None:
        return
    if s["rollout_correction_mode"] == "mask":
        unmatched["rollout_correction_mode=mask"] = ("verl masks by rejection sampling (rollout_rs), on other "
                                                     "statistics than the weight's bounds")
        return
    low, high = s["rollout_correction_low"], s["rollout_correction_high"]
    options.update({"algorithm.rollout_correction.rollout_is": s["rollout_correction"],
                    "algorithm.rollout_correction.rollout_is_threshold": high if low is None else f"{low}_{high}",
                    ROLLOUT + "calculate_log_probs": True})
    differences.append("verl clamps the log of the weight at +-20 before exp()")


def group_blocks(s):
    """{"trl": block, "verl": block} of a GRPO-family run (grpo, cispo, gspo, sapo)."""
    return {"trl": _trl_group(s), "verl": _verl_group(s)}


def ppo_blocks(s):
    """{"trl": block, "verl": block} of a PPO run."""
    return dict(zip(("trl", "verl"), _ppo_blocks(s)))


def dpo_blocks(s):
    """{"trl": block, "verl": block} of a DPO-family run."""
    return dict(zip(("trl", "verl"), _dpo_blocks(s)))


def _ppo_blocks(s):
    _, verl = _common(s)
    verl.update({"algorithm.adv_estimator": "gae", "algorithm.gamma": s["gamma"], "algorithm.lam": s["gae_lambda"],
                 "algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "kl", "algorithm.kl_ctrl.type": "fixed",
                 "algorithm.kl_ctrl.kl_coef": s["beta"], ACTOR + "use_kl_loss": False,
                 ACTOR + "policy_loss.loss_mode": "vanilla", ACTOR + "clip_ratio_low": s["epsilon"],
                 ACTOR + "clip_ratio_high": s["epsilon"], ACTOR + "clip_ratio_c": VERL_NO_DUAL_CLIP,
                 ACTOR + "loss_agg_mode": "token-mean"})
    verl_unmatched = {}
    verl_diff = ["verl trains the critic as a separate model with its own optimizer (no vf_coef)",
                 "verl's vanilla loss always applies dual-clip (clip_ratio_c, default 3.0): 1e9 turns it off",
                 "verl clamps the log-ratio to [-20, 20] before exp()"]
    if s["value_clip"] is not None:
        verl["critic.cliprange_value"] = s["value_clip"]
    else:
        verl_unmatched["value_clip=None"] = "verl always clips the value loss (critic.cliprange_value, default 0.5)"
    if not s["whiten_advantages"]:
        verl_unmatched["whiten_advantages=False"] = "verl always whitens the GAE advantages"
    else:
        verl_diff.append("verl whitens with the unbiased variance, (A - mean) / sqrt(var + 1e-8); the lab with the "
                         "population std, (A - mean) / (std + 1e-8)")
    if s["truncation"] == "bootstrap" and s["cap_value"] == "table":
        verl_diff.append("with cap_value=table the state after the cap keeps value 0, so bootstrapping gives "
                         "verl's terminal treatment exactly")
    if s["truncation"] == "bootstrap" and s["cap_value"] == "shared":
        verl_unmatched["truncation=bootstrap"] = ("verl does not bootstrap a response cut at the length limit: its "
                                                  "next value is 0 (the lab's --truncation terminal)")
    return (
        {"config": None, "options": None, "reason": TRL_NO_PPO},
        {"config": "ppo_trainer.yaml", "options": verl, "unmatched": verl_unmatched, "differences": verl_diff},
    )


def _dpo_blocks(s):
    loss, offline, mean = PREFERENCE_LOSSES[s["dpo_loss"]], s["offline"], s["sequence_logp"] == "mean"
    unmatched, differences = {}, []
    options = {"beta": s["dpo_beta"]}
    if s["dpo_rejected"] != "first":
        unmatched[f"dpo_rejected={s['dpo_rejected']}"] = ("TRL's DPO trainers take the pairs as given (a judge or "
                                                          "the data chooses them)")
    if not offline:
        config = "OnlineDPOConfig (trl.experimental.online_dpo)"
        loss.trl_online(s, options, unmatched)
        if mean:
            unmatched["sequence_logp=mean"] = "TRL's online DPO sums the log-probs (ipo included)"
        options.update({"max_new_tokens": s["max_new_tokens"], "temperature": s["temperature"]})
        differences.append("TRL's online DPO samples 2 completions and lets a judge or reward model choose; the lab "
                           "samples G and pairs the best with the worst, skipping ties")
        verl = {"config": "verl-recipe spin (online DPO)", "options": None,
                "reason": "verl's core has no DPO trainer; the spin recipe's online DPO takes actor.dpo_beta and reads "
                          "its loss type from the batch"}
        return {"config": config, "options": options, "unmatched": unmatched, "differences": differences}, verl
    config = loss.trl_offline(s, options, unmatched)
    verl = {"config": None, "options": None, "reason": "verl has no offline DPO trainer"}
    return {"config": config, "options": options, "unmatched": unmatched, "differences": differences}, verl


FAMILY_BLOCKS = {"group": group_blocks, "ppo": ppo_blocks, "dpo": dpo_blocks}


def library_blocks(settings):
    """{"trl": block, "verl": block} for one online run's settings (see the module docstring)."""
    return FAMILY_BLOCKS[family_of(settings["algorithm"])](settings)


# The table of docs/bridge.md: one row per lab setting, written from the same facts as the blocks above.
TABLE = [
    ("--advantage grpo --scale-rewards group", "GRPOConfig(scale_rewards=\"group\")",
     "algorithm.adv_estimator=grpo", "TRL: unbiased std, eps 1e-4; verl: unbiased std, eps 1e-6; the lab: population std"),
    ("--scale-rewards batch", "scale_rewards=\"batch\"", "none (reinforce_plus_plus_baseline whitens per token)",
     "TRL's batch std is over the raw rewards; the mean stays the group's"),
    ("--scale-rewards none", "scale_rewards=\"none\"", "algorithm.norm_adv_by_std_in_grpo=False", "Dr. GRPO"),
    ("--advantage rloo", "RLOOConfig(normalize_advantages=False, epsilon, epsilon_high)", "algorithm.adv_estimator=rloo",
     "TRL's RLOO has one loss: PPO-clip of exp(summed token log-ratios) per sequence; no delta, no IS correction"),
    ("--reduction sequence", "loss_type=\"grpo\"", "actor.loss_agg_mode=seq-mean-token-mean",
     "TRL's default is \"dapo\" (token mean)"),
    ("--reduction token", "loss_type=\"dapo\"", "actor.loss_agg_mode=token-mean",
     "both divide by the token count of the whole global batch"),
    ("--reduction constant", "loss_type=\"dr_grpo\", max_completion_length", "seq-mean-token-sum-norm, "
     "loss_scale_factor", "both divide by N * max_new_tokens"),
    ("--epsilon E (grpo)", "epsilon", "actor.clip_ratio_low (and clip_ratio_high)", "verl's yaml sets low and high "
     "explicitly: clip_ratio alone changes nothing"),
    ("--epsilon-high H (grpo)", "epsilon_high", "actor.clip_ratio_high", "DAPO recommends 0.28"),
    ("--dual-clip C", "delta=C, only if C >= 1 + epsilon_high", "actor.clip_ratio_c=C",
     "TRL's delta also caps A > 0 ratios; verl's dual-clip is always on (3.0): the map sets 1e9 to turn it off"),
    ("--algorithm cispo --epsilon-high C", "loss_type=\"cispo\", epsilon_high=C", "policy_loss.loss_mode=cispo, "
     "clip_ratio_high=C-1", "verl's cap is relative and two-sided; TRL's falls back to epsilon=0.2 when unset"),
    ("--algorithm gspo", "importance_sampling_level=\"sequence\"", "policy_loss.loss_mode=gspo",
     "set epsilon 3e-4, epsilon_high 4e-4 there too (both default to 0.2)"),
    ("--algorithm sapo", "loss_type=\"sapo\", sapo_temperature_pos/neg", "policy_loss.loss_mode=sapo, actor.tau_pos/neg",
     "both fix the per-sequence mean: other --reduction values are unmatched"),
    ("--kl-estimator k3 --kl-in loss", "beta, use_bias_correction_kl=False", "actor.use_kl_loss, "
     "kl_loss_type=low_var_kl", "TRL's default use_bias_correction_kl=True is the fix of k3's gradient (k3 times "
     "the ratio: the gradient of KL(pi || ref); verl's k3+ does it too); the map turns it off to match the lab's "
     "uncorrected k3 (the lesson's and DeepSeekMath's); verl clamps k3 to [-10, 10]"),
    ("--kl-estimator k1|k2", "none (GRPO's loss has k3 only)", "kl_loss_type=k1 | mse",
     "k1 as a loss term has a near-zero expected gradient (exactly 0 on-policy with length-free weights)"),
    ("--kl-in reward", "RLOO only (k1 summed; RLOOConfig.beta)", "algorithm.use_kl_in_reward, kl_penalty",
     "verl adds it per token; RLOO with --kl-in loss has no TRL equivalent"),
    ("--mask-truncated", "mask_truncated_completions=True", "none", "truncated responses still count in the "
     "group's mean and std"),
    ("--overlong-penalty CACHE", "reward get_soft_overlong_punishment", "+reward.reward_kwargs.overlong_buffer_cfg "
     "(dapo manager)", "DAPO eq. 13; reward_kwargs needs Hydra's + prefix"),
    ("--dynamic-sampling", "none (not supported)", "algorithm.filter_groups.enable, metric=reward",
     "verl 0.9 ignores max_num_gen_batches: no cap like --max-resample-rounds"),
    ("--tis-cap C", "vllm_importance_sampling_correction, mode token_truncate, clip_max C",
     "algorithm.rollout_correction.rollout_is=token, rollout_is_threshold C",
     "both correct the engine's numerics; the lab's mismatch is a different temperature or top-p"),
    ("--algorithm dppo-tv | dppo-kl", "none", "policy_loss.loss_mode=dppo_tv | dppo_kl, clip_ratio_low/high = delta, "
     "clip_ratio_c = --dppo-cap", "verl's ActorConfig caps the ratio at 3.0 (its code's fallback is 20)"),
    ("--algorithm gmpo", "none", "policy_loss.loss_mode=geo_mean, clip_ratio_low/high", "verl clips in log space "
     "too; its default range is 0.2, GMPO's examples 0.4"),
    ("--algorithm clip-cov | kl-cov", "none", "loss_mode=clip_cov (clip_cov_ratio, clip_cov_lb, clip_cov_ub) | "
     "kl_cov (kl_cov_ratio, ppo_kl_coef)", "verl draws Clip-Cov's tokens from torch's global generator"),
    ("--algorithm dro | gpg", "none", "loss_mode=dro (policy_loss.dro_beta = --dro-tau) | gpg",
     "verl's dro_beta has no default"),
    ("--algorithm topr | cegppo", "none", "none", "no library home (ROLL has TOPR with token ratios; CE-GPPO is in "
     "its authors' verl fork)"),
    ("--algorithm vespo", "loss_type=\"vespo\", vespo_k_pos/lambda_pos/k_neg/lambda_neg", "none",
     "TRL's vespo takes the token mean and no importance-sampling correction"),
    ("--algorithm luspo", "loss_type=\"luspo\", importance_sampling_level=\"sequence\", epsilon, epsilon_high", "none",
     "TRL's epsilon defaults to 0.2: set GSPO's 3e-4 and 4e-4"),
    ("--advantage maxrl", "none", "none (SkyRL and the authors' verl fork: adv_estimator=maxrl)",
     "R / p - 1 for a 0/1 reward"),
    ("--advantage reinforce-pp | reinforce-pp-baseline | opo | passk | gpg", "none",
     "adv_estimator=reinforce_plus_plus | reinforce_plus_plus_baseline | opo | grpo_passk | gpg",
     "verl whitens with 1e-8 in its counts; the lab's reinforce-pp is at gamma 1"),
    ("--rollout-correction token|sequence --rollout-correction-mode truncate|mask", "vllm_importance_sampling_mode="
     "\"{level}_{mode}\", clip_min/clip_max", "rollout_correction.rollout_is=token|sequence, rollout_is_threshold "
     "(\"low_high\")", "TRL only with use_vllm; verl's mask is rejection sampling (rollout_rs): unmatched"),
    ("--off-policy-mask T", "off_policy_mask_threshold=T", "none", "DeepSeek-V3.2's sequence mask"),
    ("--m2po T", "none", "none", "AReaL's actor.m2_threshold"),
    ("--kl-estimator k3-is | k3+ | k1+", "use_bias_correction_kl=True (k3-is)", "kl_loss_type=k3+ | k1+",
     "TRL's correction at the sequence level multiplies by s_i"),
    ("--entropy-coef C --adaptive-entropy T", "entropy_coef, use_adaptive_entropy, entropy_target",
     "actor.entropy_coeff (constant)", "TRL applies the adaptive coefficient only at or below its target"),
    ("--top-entropy-quantile Q", "top_entropy_quantile=Q", "none", "TRL takes the quantile in float32"),
    ("--algorithm ppo (per-token KL in the reward)", "none: TRL 1.16 has no PPO trainer",
     "adv_estimator=gae, use_kl_in_reward, clip_ratio_low/high, clip_ratio_c=1e9", "verl's lam defaults to 1.0"),
    ("--truncation bootstrap", "none", "none: next value 0", "the lab's own: a cut response "
     "bootstraps V(state after the cap); right only when the cut gets no verdict, and here the verifier scores it, "
     "so terminal (TRL's and verl's treatment) is the consistent one"),
    ("--no-whiten / --value-clip", "none", "always whitens / critic.cliprange_value",
     "verl whitens with the unbiased variance and always clips the value loss"),
    ("--algorithm dpo --offline --dpo-loss sigmoid|ipo|hinge|robust", "DPOConfig(loss_type=...)", "none",
     "TRL's offline ipo averages log-probs per token (--sequence-logp mean); sigmoid_norm is sigmoid on averages"),
    ("--dpo-loss cdpo", "loss_type=\"sigmoid\" without label_smoothing", "none",
     "TRL 1.16's sigmoid ignores label_smoothing: cDPO is unmatched"),
    ("--dpo-loss simpo --offline", "CPOConfig(loss_type=\"simpo\", cpo_alpha=0)", "none",
     "reference-free, length-averaged"),
    ("--algorithm dpo (online)", "OnlineDPOConfig(loss_type sigmoid|ipo)", "verl-recipe spin",
     "TRL sums log-probs (ipo too) and pairs 2 samples judged by a model"),
]


def readme_table():
    """TABLE as plain text: one block per lab setting (four columns would not fit 100 characters)."""
    lines = []
    for setting, trl, verl, note in TABLE:
        lines += [f"    {setting}", f"        TRL:  {trl}", f"        verl: {verl}", f"        note: {note}"]
    return "\n".join(lines) + "\n"


def build_parser():
    return OneLineErrorParser(
        prog="library_map.py",
        description="Print what TRL and verl call each setting of online_tokens.py: one block per lab setting "
                    "(the TRL option, the verl option, what still differs). Takes no flag but --help.",
    )


def main(argv=None):
    build_parser().parse_args(argv)
    sys.stdout.write(readme_table())
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
