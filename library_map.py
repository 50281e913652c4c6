"""What TRL and verl call each setting of the online driver: the "trl" and "verl" blocks of every
online.json, and the table in README.txt.

    python library_map.py                 # prints README's table: lab setting -> TRL, verl, what still differs

For one run's settings, `library_blocks(settings)` returns {"trl": ..., "verl": ...}. Each block holds
"options" (the option names and values that configure the same computation there; None when the
library has no trainer for it), "unmatched" (the lab's settings with no equivalent, each with a
one-line reason) and "differences" (what still differs when the options are set). Read from the
libraries' own source: TRL 1.10.0.dev0 (trl/trainer/grpo_config.py, grpo_trainer.py, rloo_config.py,
dpo_config.py, experimental/ppo, experimental/cpo, experimental/online_dpo) and verl 0.10.0.dev
(verl/trainer/config/ppo_trainer.yaml, actor/actor.yaml, verl/trainer/ppo/core_algos.py,
algorithm/rollout_correction.yaml) as of 2026-08. Option names move between versions; the
differences name the version where it matters.
"""

from __future__ import annotations

import sys

ACTOR = "actor_rollout_ref.actor."
ROLLOUT = "actor_rollout_ref.rollout."

GROUP_LOSS_TYPES = {"sequence": "grpo", "token": "dapo", "constant": "dr_grpo"}
VERL_AGG_MODES = {"sequence": "seq-mean-token-mean", "token": "token-mean", "constant": "seq-mean-token-sum-norm"}
VERL_KL_NAMES = {"k1": "k1", "k2": "mse", "k3": "low_var_kl"}
TRL_DPO_LOSS_TYPES = {"sigmoid": "sigmoid", "ipo": "ipo", "hinge": "hinge", "robust": "robust"}


def _group_blocks(s):
    """TRL GRPOConfig / RLOOConfig and verl for the GRPO family (grpo, cispo, gspo, sapo)."""
    trl, verl = {}, {}
    trl_unmatched, verl_unmatched = {}, {}
    trl_diff = ["TRL's group std is the unbiased one (divides by G - 1) with eps 1e-4; the lab's is the "
                "population std (divides by G) with eps 1e-4"]
    verl_diff = ["verl's group std is torch.std (unbiased) with eps 1e-6; the lab's is the population std "
                 "with eps 1e-4"]
    algorithm = s["algorithm"]
    rloo = s["advantage"] == "rloo"
    trl_config = "RLOOConfig" if rloo else "GRPOConfig"
    trl.update({"num_generations": s["group_size"], "max_completion_length": s["max_new_tokens"],
                "temperature": s["temperature"], "num_iterations": s["updates_per_batch"],
                "learning_rate": s["learning_rate"], "max_grad_norm": s["max_grad_norm"]})
    verl.update({ROLLOUT + "n": s["group_size"], "data.max_response_length": s["max_new_tokens"],
                 ROLLOUT + "temperature": s["temperature"], ACTOR + "ppo_epochs": s["updates_per_batch"],
                 ACTOR + "optim.lr": s["learning_rate"], ACTOR + "grad_clip": s["max_grad_norm"]})
    # advantages
    if rloo:
        trl["normalize_advantages"] = False
        verl["algorithm.adv_estimator"] = "rloo"
        trl_diff.append("TRL's RLOOTrainer clips one SEQUENCE ratio (exp of the summed token log-ratios) and "
                        "averages per sequence, whatever the lab's loss")
    else:
        trl["scale_rewards"] = s["scale_rewards"]
        verl["algorithm.adv_estimator"] = "grpo"
        if s["scale_rewards"] == "none":
            verl["algorithm.norm_adv_by_std_in_grpo"] = False
        elif s["scale_rewards"] == "batch":
            verl_unmatched["scale_rewards=batch"] = ("verl's grpo estimator divides by the group's std or none; "
                                                     "reinforce_plus_plus_baseline whitens over tokens instead")
        else:
            verl["algorithm.norm_adv_by_std_in_grpo"] = True
    # loss and reduction
    if algorithm in ("grpo", "cispo", "sapo"):
        if algorithm == "grpo":
            trl["loss_type"] = GROUP_LOSS_TYPES[s["reduction"]]
        else:
            trl["loss_type"] = algorithm
            if s["reduction"] != ("token" if algorithm == "cispo" else "sequence"):
                trl_unmatched[f"reduction={s['reduction']}"] = (
                    f"TRL's loss_type={algorithm!r} fixes its own reduction "
                    f"({'token mean' if algorithm == 'cispo' else 'per-sequence mean'})")
        verl[ACTOR + "loss_agg_mode"] = VERL_AGG_MODES[s["reduction"]]
        if s["reduction"] == "constant":
            trl["max_completion_length"] = s["max_new_tokens"]
            verl[ACTOR + "loss_scale_factor"] = s["max_new_tokens"]
            verl_diff.append("verl before 0.8 divided seq-mean-token-sum-norm by loss_scale_factor alone, not by "
                             "N * loss_scale_factor")
        if s["reduction"] == "token":
            trl_diff.append("TRL's 'dapo' divides by the token count of the whole generation batch (all processes "
                            "and accumulation steps): with one batch, the lab's token mean")
    if algorithm == "grpo":
        trl["epsilon"] = s["epsilon"]
        trl["epsilon_high"] = s["epsilon_high"] if s["epsilon_high"] is not None else s["epsilon"]
        verl[ACTOR + "policy_loss.loss_mode"] = "vanilla"
        verl[ACTOR + "clip_ratio_low"] = s["epsilon"]
        verl[ACTOR + "clip_ratio_high"] = trl["epsilon_high"]
        if s["dual_clip"] is not None:
            verl[ACTOR + "clip_ratio_c"] = s["dual_clip"]
            trl["delta"] = s["dual_clip"]
            trl_diff.append("TRL's delta caps the ratio itself (INTELLECT-2): for A < 0 the same bound as "
                            "dual-clip, for A > 0 the upper clip already binds first")
        else:
            verl[ACTOR + "clip_ratio_c"] = 1e9
            verl_diff.append("verl's vanilla loss always applies dual-clip (clip_ratio_c, default 3.0): a very "
                             "large value turns it off, as the lab's default")
    elif algorithm == "cispo":
        trl["epsilon_high"] = s["epsilon_high"]
        verl[ACTOR + "policy_loss.loss_mode"] = "cispo"
        verl[ACTOR + "clip_ratio_high"] = s["epsilon_high"] - 1.0
        verl[ACTOR + "clip_ratio_low"] = 10.0
        trl_diff.append("TRL's cispo cap is absolute like the lab's; left unset, epsilon_high falls back to "
                        "epsilon (0.2), a cap below 1")
        verl_diff.append("verl's cispo clamps the weight to [1 - clip_ratio_low, 1 + clip_ratio_high], relative "
                         "and two-sided: the lab's absolute cap c is clip_ratio_high = c - 1 with no lower bound")
    elif algorithm == "gspo":
        trl.update({"importance_sampling_level": "sequence", "loss_type": "grpo", "epsilon": s["epsilon"],
                    "epsilon_high": s["epsilon_high"]})
        verl.update({ACTOR + "policy_loss.loss_mode": "gspo", ACTOR + "clip_ratio_low": s["epsilon"],
                     ACTOR + "clip_ratio_high": s["epsilon_high"], ACTOR + "loss_agg_mode": "seq-mean-token-mean"})
        verl_diff.append("verl's gspo builds per-token ratios sg(s_i) * pi / sg(pi) (the same value and "
                         "gradient) and clamps the log-ratio at 10")
    elif algorithm == "sapo":
        trl.update({"sapo_temperature_pos": s["tau_pos"], "sapo_temperature_neg": s["tau_neg"]})
        verl.update({ACTOR + "policy_loss.loss_mode": "sapo", ACTOR + "tau_pos": s["tau_pos"],
                     ACTOR + "tau_neg": s["tau_neg"]})
        verl_diff.append("verl's SAPO example puts tau under policy_loss.*, but the loss reads actor.tau_pos / "
                         "actor.tau_neg")
    # KL
    if s["kl_in"] == "loss":
        trl["beta"] = s["beta"]
        if s["kl_estimator"] != "k3":
            trl_unmatched[f"kl_estimator={s['kl_estimator']}"] = "TRL's GRPO loss has only k3"
        verl.update({ACTOR + "use_kl_loss": s["beta"] > 0, ACTOR + "kl_loss_coef": s["beta"],
                     ACTOR + "kl_loss_type": VERL_KL_NAMES[s["kl_estimator"]], "algorithm.use_kl_in_reward": False})
        if s["kl_estimator"] == "k3":
            verl_diff.append("verl's low_var_kl clamps the log-ratio to +-20 and k3 to [-10, 10]")
    else:
        trl["beta"] = 0.0
        if rloo and s["kl_estimator"] == "k1":
            trl["beta"] = s["beta"]
        else:
            trl_unmatched["kl_in=reward"] = ("TRL folds the KL into the reward only in RLOO (k1 summed over the "
                                             "response); GRPO's KL is a loss term")
        verl.update({"algorithm.use_kl_in_reward": True, "algorithm.kl_ctrl.type": "fixed",
                     "algorithm.kl_ctrl.kl_coef": s["beta"], "algorithm.kl_penalty": VERL_KL_NAMES[s["kl_estimator"]],
                     ACTOR + "use_kl_loss": False})
        verl_diff.append("verl adds the KL penalty to each token's reward; the lab subtracts beta times the "
                         "response's summed estimate from the response's reward (the same total)")
    # truncation and length shaping
    if s["mask_truncated"]:
        trl["mask_truncated_completions"] = True
        verl_unmatched["mask_truncated"] = "verl has no option to drop truncated responses from the loss"
    if s["overlong_penalty"] is not None:
        trl_unmatched["overlong_penalty"] = ("a reward function, not an option: trl.rewards."
                                             f"get_soft_overlong_punishment({s['max_new_tokens']}, "
                                             f"{s['overlong_penalty']})")
        verl.update({"reward.reward_manager.name": "dapo", "reward.reward_kwargs.max_resp_len": s["max_new_tokens"],
                     "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
                     "reward.reward_kwargs.overlong_buffer_cfg.len": s["overlong_penalty"],
                     "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0})
    if s["dynamic_sampling"]:
        trl_unmatched["dynamic_sampling"] = "TRL does not support DAPO's dynamic sampling (its docs say so)"
        verl.update({"algorithm.filter_groups.enable": True, "algorithm.filter_groups.metric": "seq_reward",
                     "algorithm.filter_groups.max_num_gen_batches": s["max_resample_rounds"]})
    # sampler mismatch
    if s["rollout_temperature"] is not None or s["rollout_top_p"] is not None:
        trl_unmatched["rollout_temperature/top_p"] = ("TRL samples and scores at one temperature; the mismatch it "
                                                      "corrects is vLLM's numerics")
        verl_unmatched["rollout_temperature/top_p"] = ("verl scores at the rollout's temperature; the mismatch it "
                                                       "corrects is the inference engine's numerics")
    if s["tis_cap"] is not None:
        trl.update({"use_vllm": True, "vllm_importance_sampling_correction": True,
                    "vllm_importance_sampling_mode": "token_truncate", "vllm_importance_sampling_clip_max": s["tis_cap"]})
        verl.update({"algorithm.rollout_correction.rollout_is": "token",
                     "algorithm.rollout_correction.rollout_is_threshold": s["tis_cap"],
                     ROLLOUT + "calculate_log_probs": True})
        trl_diff.append("TRL before 1.6 named the cap vllm_importance_sampling_cap; its default mode is "
                        "sequence_mask, not token_truncate")
    else:
        trl["vllm_importance_sampling_correction"] = False
    return (
        {"config": trl_config, "options": trl, "unmatched": trl_unmatched, "differences": trl_diff},
        {"config": "ppo_trainer.yaml", "options": verl, "unmatched": verl_unmatched, "differences": verl_diff},
    )


def _ppo_blocks(s):
    trl = {"kl_coef": s["beta"], "kl_estimator": "k1", "cliprange": s["epsilon"], "vf_coef": s["value_coef"],
           "gamma": s["gamma"], "lam": s["gae_lambda"], "num_ppo_epochs": s["updates_per_batch"],
           "response_length": s["max_new_tokens"], "temperature": s["temperature"],
           "learning_rate": s["learning_rate"], "max_grad_norm": s["max_grad_norm"]}
    verl = {"algorithm.adv_estimator": "gae", "algorithm.gamma": s["gamma"], "algorithm.lam": s["gae_lambda"],
            "algorithm.use_kl_in_reward": True, "algorithm.kl_penalty": "kl", "algorithm.kl_ctrl.kl_coef": s["beta"],
            ACTOR + "clip_ratio": s["epsilon"], ACTOR + "ppo_epochs": s["updates_per_batch"],
            ACTOR + "loss_agg_mode": "token-mean", "data.max_response_length": s["max_new_tokens"]}
    trl_unmatched, verl_unmatched = {}, {}
    trl_diff = ["TRL's PPO gives the critic its own value head; the lab's is a separate table trained by the "
                "same Adam step"]
    verl_diff = ["verl trains the critic as a separate model with its own optimizer (no vf_coef)"]
    if s["value_clip"] is not None:
        trl["cliprange_value"] = s["value_clip"]
        verl["critic.cliprange_value"] = s["value_clip"]
    else:
        trl_unmatched["value_clip=None"] = "TRL always clips the value loss (cliprange_value, default 0.2)"
        verl_unmatched["value_clip=None"] = "verl always clips the value loss (critic.cliprange_value, default 0.5)"
    if not s["whiten_advantages"]:
        trl_unmatched["whiten_advantages=False"] = "TRL always whitens the advantages"
        verl_unmatched["whiten_advantages=False"] = "verl always whitens the advantages"
    else:
        trl_diff.append("TRL whitens with the unbiased variance; the lab with the population std")
    if s["truncation"] == "bootstrap" and s["cap_value"] == "table":
        trl_diff.append("with cap_value=table the state after the cap keeps value 0, so bootstrapping gives "
                        "TRL's and verl's terminal treatment exactly")
    if s["truncation"] == "bootstrap" and s["cap_value"] == "shared":
        reason = ("neither library bootstraps a response cut at the length limit: both take its next value as 0 "
                  "(the lab's --truncation terminal)")
        trl_unmatched["truncation=bootstrap"] = reason
        verl_unmatched["truncation=bootstrap"] = reason
    return (
        {"config": "PPOConfig (trl.experimental.ppo)", "options": trl, "unmatched": trl_unmatched,
         "differences": trl_diff},
        {"config": "ppo_trainer.yaml", "options": verl, "unmatched": verl_unmatched, "differences": verl_diff},
    )


def _dpo_blocks(s):
    loss = s["dpo_loss"]
    trl_unmatched, trl_diff = {}, []
    if s["offline"]:
        config = "SimPO: CPOConfig (trl.experimental.cpo)" if loss == "simpo" else "DPOConfig"
    else:
        config = "OnlineDPOConfig (trl.experimental.online_dpo)"
    if loss == "simpo":
        options = {"loss_type": "simpo", "cpo_alpha": 0.0, "simpo_gamma": s["simpo_gamma"], "beta": s["dpo_beta"]}
        if not s["offline"]:
            trl_unmatched["dpo_loss=simpo"] = "OnlineDPOConfig's loss_type is sigmoid or ipo"
    elif loss == "cdpo":
        options = {"loss_type": "sigmoid", "label_smoothing": s["label_smoothing"], "beta": s["dpo_beta"]}
        trl_diff.append("TRL up to 0.28 applied label_smoothing to 'sigmoid' (cDPO); 0.29 removed it")
    else:
        options = {"loss_type": TRL_DPO_LOSS_TYPES[loss], "beta": s["dpo_beta"]}
        if loss == "robust":
            options["label_smoothing"] = s["label_smoothing"]
        if not s["offline"] and loss not in ("sigmoid", "ipo"):
            trl_unmatched[f"dpo_loss={loss}"] = "OnlineDPOConfig's loss_type is sigmoid or ipo"
    if loss == "ipo":
        trl_diff.append("TRL's ipo averages the log-probs per token; --sequence-logp mean matches it")
    if s["sequence_logp"] == "mean" and loss not in ("ipo", "simpo"):
        trl_unmatched["sequence_logp=mean"] = "TRL's DPO sums the log-probs (except ipo, and sigmoid_norm)"
    if not s["offline"]:
        options.update({"max_new_tokens": s["max_new_tokens"], "temperature": s["temperature"]})
        trl_diff.append("TRL's online DPO samples 2 completions and lets a judge or reward model choose; the lab "
                        "samples G and pairs the best with the worst, skipping ties")
    verl = {"config": "verl-recipe spin (online DPO)", "options": None,
            "reason": "verl's core has no DPO trainer; the spin recipe's online DPO takes actor.dpo_beta and reads "
                      "its loss type from the batch"} if not s["offline"] else {
        "config": None, "options": None, "reason": "verl has no offline DPO trainer"}
    return {"config": config, "options": options, "unmatched": trl_unmatched, "differences": trl_diff}, verl


def library_blocks(settings):
    """{"trl": block, "verl": block} for one online run's settings (see the module docstring)."""
    algorithm = settings["algorithm"]
    if algorithm == "ppo":
        trl, verl = _ppo_blocks(settings)
    elif algorithm == "dpo":
        trl, verl = _dpo_blocks(settings)
    else:
        trl, verl = _group_blocks(settings)
    return {"trl": trl, "verl": verl}


# The README table: one row per lab setting, written from the same facts as the blocks above.
TABLE = [
    ("--advantage grpo --scale-rewards group", "GRPOConfig(scale_rewards=\"group\")",
     "algorithm.adv_estimator=grpo", "TRL: unbiased std, eps 1e-4; verl: unbiased std, eps 1e-6; the lab: population std"),
    ("--scale-rewards batch", "scale_rewards=\"batch\"", "none (reinforce_plus_plus_baseline whitens per token)",
     "TRL's batch std is over the raw rewards; the mean stays the group's"),
    ("--scale-rewards none", "scale_rewards=\"none\"", "algorithm.norm_adv_by_std_in_grpo=False", "Dr. GRPO"),
    ("--advantage rloo", "RLOOConfig (normalize_advantages=False)", "algorithm.adv_estimator=rloo",
     "TRL's RLOO clips one sequence ratio (product of token ratios)"),
    ("--reduction sequence", "loss_type=\"grpo\"", "actor.loss_agg_mode=seq-mean-token-mean",
     "TRL's default is \"dapo\" (token mean) since 0.22"),
    ("--reduction token", "loss_type=\"dapo\"", "actor.loss_agg_mode=token-mean",
     "both divide by the token count of the whole global batch"),
    ("--reduction constant", "loss_type=\"dr_grpo\", max_completion_length", "seq-mean-token-sum-norm, "
     "loss_scale_factor", "verl before 0.8 did not divide by N"),
    ("--epsilon E (grpo)", "epsilon", "actor.clip_ratio_low", "verl's yaml sets low and high explicitly: "
     "setting clip_ratio alone changes nothing"),
    ("--epsilon-high H (grpo)", "epsilon_high", "actor.clip_ratio_high", "DAPO recommends 0.28"),
    ("--dual-clip C", "delta=C (caps the ratio itself)", "actor.clip_ratio_c=C",
     "verl always applies dual-clip (default 3.0); TRL's delta also caps A > 0 ratios"),
    ("--algorithm cispo --epsilon-high C", "loss_type=\"cispo\", epsilon_high=C", "policy_loss.loss_mode=cispo, "
     "clip_ratio_high=C-1", "verl's cap is relative and two-sided; TRL's falls back to epsilon=0.2 when unset"),
    ("--algorithm gspo", "importance_sampling_level=\"sequence\"", "policy_loss.loss_mode=gspo",
     "set epsilon 3e-4, epsilon_high 4e-4 there too (both default to 0.2)"),
    ("--algorithm sapo", "loss_type=\"sapo\", sapo_temperature_pos/neg", "policy_loss.loss_mode=sapo, actor.tau_pos/neg",
     "no clip at all: the gate fades the gradient"),
    ("--kl-estimator k3 --kl-in loss", "beta (k3 only)", "actor.use_kl_loss, kl_loss_type=low_var_kl",
     "verl clamps k3 to [-10, 10]; TRL's beta defaults to 0"),
    ("--kl-estimator k1|k2", "none in GRPO (PPOConfig.kl_estimator k1|k3)", "kl_loss_type=k1 | mse",
     "k1 as a loss term has zero expected gradient"),
    ("--kl-in reward", "RLOO only (k1 summed)", "algorithm.use_kl_in_reward, kl_penalty", "verl adds it per token"),
    ("--mask-truncated", "mask_truncated_completions=True", "none", "truncated responses still count in the "
     "group's mean and std"),
    ("--overlong-penalty CACHE", "reward get_soft_overlong_punishment", "reward overlong_buffer_cfg (dapo manager)",
     "DAPO eq. 13"),
    ("--dynamic-sampling", "none (not supported)", "algorithm.filter_groups.enable", "verl-recipe/core dapo trainer"),
    ("--tis-cap C", "vllm_importance_sampling_correction, mode token_truncate, clip_max C",
     "algorithm.rollout_correction.rollout_is=token, rollout_is_threshold C",
     "both correct the engine's numerics; the lab's mismatch is a different temperature or top-p"),
    ("--algorithm ppo (per-token KL in the reward)", "PPOConfig(kl_coef, kl_estimator=\"k1\")",
     "adv_estimator=gae, use_kl_in_reward", "verl's lam defaults to 1.0, TRL's to 0.95"),
    ("--truncation bootstrap", "none: next value 0", "none: next value 0", "the lab's own: a cut response "
     "bootstraps V(state after the cap)"),
    ("--no-whiten / --value-clip", "always whitens / cliprange_value", "always whitens / critic.cliprange_value",
     "neither can switch whitening off"),
    ("--algorithm dpo --dpo-loss sigmoid|ipo|hinge|robust", "DPOConfig(loss_type=...)", "none in core "
     "(verl-recipe spin: online DPO)", "TRL's ipo averages log-probs per token"),
    ("--dpo-loss cdpo", "loss_type=\"sigmoid\", label_smoothing (TRL <= 0.28)", "none", "removed from TRL in 0.29"),
    ("--dpo-loss simpo", "CPOConfig(loss_type=\"simpo\", cpo_alpha=0)", "none", "reference-free, length-averaged"),
    ("--algorithm dpo (online)", "OnlineDPOConfig(loss_type sigmoid|ipo)", "verl-recipe spin", "TRL pairs 2 samples "
     "judged by a model"),
]


def readme_table():
    """TABLE as plain text for README.txt: one block per lab setting (four columns would not fit 100)."""
    lines = []
    for setting, trl, verl, note in TABLE:
        lines += [f"    {setting}", f"        TRL:  {trl}", f"        verl: {verl}", f"        note: {note}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(readme_table())
