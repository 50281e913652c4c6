"""The online driver's registered variants: one entry per policy loss (an --algorithm of the GRPO
family), per advantage (--advantage) and per preference loss (--dpo-loss), each carrying everything
about it: its atom, the settings it reads, its own defaults and ranges, what TRL and verl call it, its
plot colour and the settings the bridge check builds. It imports no torch (the plotter reads the
colours, library_map.py the mappings); an atom is named here and looked up in rl_lab when a run calls it.

    entry = POLICY_LOSSES["cispo"]
    entry.function                  # rl_lab.cispo_policy_loss
    entry.trl(s, options, unmatched, differences)   # fills TRL's block for run settings s

Adding a loss is one atom in rl_lab.py and one `register_policy_loss` call below (plus a settings line
in online_settings.py for a hyperparameter of its own); verl's `register_policy_loss` is the model.
A mapper takes the run's settings `s` (a dict) and fills the block's options, its unmatched settings
({setting: reason}) and its differences (one line each), in that order of keys.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

ACTOR = "actor_rollout_ref.actor."
POLICY_LOSS = ACTOR + "policy_loss."


def _function(name):
    """The rl_lab function `name`, looked up at call time (so a patched rl_lab is seen)."""
    return getattr(importlib.import_module("rl_lab"), name)


# ---------------------------------------------------------------------------------------------
# Mappers shared by several entries
# ---------------------------------------------------------------------------------------------


def trl_unmapped(s, options, unmatched, differences):
    unmatched[f"algorithm={s['algorithm']}"] = "no TRL loss_type is mapped to this loss"


def verl_unmapped(s, options, unmatched, differences):
    unmatched[f"algorithm={s['algorithm']}"] = "no verl policy_loss.loss_mode is mapped to this loss"


def epsilon_high_of(s):
    return s["epsilon_high"] if s["epsilon_high"] is not None else s["epsilon"]


def _trl_batch_token_count(s, differences):
    if s["reduction"] == "token":
        differences.append("TRL's 'dapo' and 'cispo' divide by the token count of the whole generation batch "
                           "(all processes and accumulation steps): with one batch, the lab's token mean")


def _trl_own_reduction(s, unmatched, own):
    """TRL's cispo and sapo loss types fix their reduction: another --reduction is unmatched."""
    if s["reduction"] != own:
        unmatched[f"reduction={s['reduction']}"] = (
            f"TRL's loss_type={s['algorithm']!r} fixes its own reduction "
            f"({'token mean over the batch' if own == 'token' else 'per-sequence mean'})")


def _verl_clip(s, options, mode):
    options.update({POLICY_LOSS + "loss_mode": mode, ACTOR + "clip_ratio_low": s["epsilon"],
                    ACTOR + "clip_ratio_high": epsilon_high_of(s)})


VERL_LOG_RATIO_CLAMP = "verl clamps the log-ratio to [-20, 20] before exp()"


# ---------------------------------------------------------------------------------------------
# Policy losses (the GRPO family)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyLoss:
    """A GRPO-family loss and everything the loop, the maps and the plots need to know about it.

    atom: the name of its rl_lab function. reads: the settings passed to it (besides beta and the KL
    estimator, which every loss takes); "reduction" also passes max_new_tokens. keywords: {setting: the
    atom's keyword} where they differ (DPPO's delta is --epsilon); fixed: keywords with one value (DPPO's
    kind). old_policy: it takes old_logps (GPG does not); weights: it takes importance_weights (TIS, the
    rollout correction); generator: it draws (Clip-Cov), from the run's generator. ratio: "token" or
    "sequence" (one per response) for the diagnostics. zeroes: how clip_fraction counts: "clip" (PPO-Clip
    zeroes the gradient outside [1 - epsilon, 1 + epsilon_high]), "cap" (CISPO caps the weight, zeroes
    nothing; capped_fraction counts the caps), "none" (no ratio clip of that form: 0). defaults / ranges:
    its own default and range of a shared setting. trl / verl: the mappers of its options; rloo_epsilon:
    TRL's RLOOConfig takes its epsilon; rloo_loss: TRL's RLOO loss is this loss. color: its colour in every
    figure. samples: the settings (besides the algorithm) that `bridge.py check` builds with it."""

    atom: str
    reads: tuple
    keywords: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    old_policy: bool = True
    weights: bool = True
    generator: bool = False
    ratio: str = "token"
    zeroes: str = "clip"
    defaults: dict = field(default_factory=dict)
    ranges: dict = field(default_factory=dict)
    trl: object = trl_unmapped
    verl: object = verl_unmapped
    rloo_epsilon: bool = False
    rloo_loss: bool = False
    color: str = "#7f7f7f"
    samples: tuple = ()
    summary: str = ""

    @property
    def function(self):
        return _function(self.atom)

    def keyword(self, setting):
        return self.keywords.get(setting, setting)


POLICY_LOSSES = {}


def register_policy_loss(name, atom, **entry):
    POLICY_LOSSES[name] = PolicyLoss(atom, **entry)


def _trl_grpo(s, options, unmatched, differences):
    epsilon_high = epsilon_high_of(s)
    options.update({"loss_type": GROUP_LOSS_TYPES[s["reduction"]], "epsilon": s["epsilon"],
                    "epsilon_high": epsilon_high})
    if s["dual_clip"] is not None and s["dual_clip"] >= 1.0 + epsilon_high:
        options["delta"] = s["dual_clip"]
        differences.append("TRL's delta caps the ratio itself (INTELLECT-2): for A < 0 the same bound as "
                           "dual-clip; for A > 0 the upper clip binds first, since delta >= 1 + epsilon_high")
    elif s["dual_clip"] is not None:
        unmatched["dual_clip"] = (f"TRL's delta caps the ratio for A > 0 too: below 1 + epsilon_high "
                                  f"({1.0 + epsilon_high:g}) it clips tokens the lab's dual-clip keeps")
    _trl_batch_token_count(s, differences)


def _trl_gspo(s, options, unmatched, differences):
    options.update({"importance_sampling_level": "sequence", "loss_type": "grpo", "epsilon": s["epsilon"],
                    "epsilon_high": s["epsilon_high"]})


def _trl_cispo(s, options, unmatched, differences):
    options["loss_type"] = "cispo"
    options["epsilon_high"] = s["epsilon_high"]
    differences.append("TRL's cispo cap is absolute like the lab's; left unset, epsilon_high falls back "
                       "to epsilon (0.2), a cap below 1")
    _trl_own_reduction(s, unmatched, "token")
    _trl_batch_token_count(s, differences)


def _trl_sapo(s, options, unmatched, differences):
    options["loss_type"] = "sapo"
    options.update({"sapo_temperature_pos": s["tau_pos"], "sapo_temperature_neg": s["tau_neg"]})
    _trl_own_reduction(s, unmatched, "sequence")


def _verl_grpo(s, options, unmatched, differences):
    options.update({POLICY_LOSS + "loss_mode": "vanilla", ACTOR + "clip_ratio_low": s["epsilon"],
                    ACTOR + "clip_ratio_high": epsilon_high_of(s)})
    options[ACTOR + "clip_ratio_c"] = s["dual_clip"] if s["dual_clip"] is not None else VERL_NO_DUAL_CLIP
    if s["dual_clip"] is None:
        differences.append("verl's vanilla loss always applies dual-clip (clip_ratio_c, default 3.0): 1e9 "
                           "turns it off, since verl's ratio never exceeds e**20")
    differences.append(VERL_LOG_RATIO_CLAMP)


def _verl_cispo(s, options, unmatched, differences):
    options.update({POLICY_LOSS + "loss_mode": "cispo", ACTOR + "clip_ratio_high": s["epsilon_high"] - 1.0,
                    ACTOR + "clip_ratio_low": 10.0})
    differences.append("verl's cispo clamps the weight to [1 - clip_ratio_low, 1 + clip_ratio_high], relative "
                       "and two-sided: the lab's absolute cap c is clip_ratio_high = c - 1 with no lower bound")


def _verl_gspo(s, options, unmatched, differences):
    options.update({POLICY_LOSS + "loss_mode": "gspo", ACTOR + "clip_ratio_low": s["epsilon"],
                    ACTOR + "clip_ratio_high": s["epsilon_high"], ACTOR + "loss_agg_mode": "seq-mean-token-mean"})
    differences.append("verl's gspo builds per-token ratios sg(s_i) * pi / sg(pi) (the same value and "
                       "gradient) and clamps the log-ratio at 10")


def _verl_sapo(s, options, unmatched, differences):
    options.update({POLICY_LOSS + "loss_mode": "sapo", ACTOR + "tau_pos": s["tau_pos"],
                    ACTOR + "tau_neg": s["tau_neg"]})
    if s["reduction"] != "sequence":
        unmatched[f"reduction={s['reduction']}"] = ("verl's sapo reduces with seq-mean-token-mean whatever "
                                                    "loss_agg_mode says (which still reduces its KL loss)")
    differences.append("verl's SAPO reads actor.tau_pos / actor.tau_neg (its example puts them under "
                       "policy_loss.*, where nothing reads them)")


def _verl_dppo(kind):
    def mapper(s, options, unmatched, differences):
        _verl_clip(s, options, f"dppo_{kind}")
        options[ACTOR + "clip_ratio_c"] = s["dppo_cap"]
        differences.append("verl's DPPO reads delta from clip_ratio_low / clip_ratio_high and the ratio's cap "
                           "from clip_ratio_c (its ActorConfig's 3.0; the code's own fallback is 20)")
        differences.append(VERL_LOG_RATIO_CLAMP)
    return mapper


def _verl_gmpo(s, options, unmatched, differences):
    _verl_clip(s, options, "geo_mean")
    differences.append("verl's geo_mean clips the log-ratio in log space like the lab, adds 1e-8 to the "
                       "token counts and clamps the log-ratios at 20")


def _verl_clip_cov(s, options, unmatched, differences):
    _verl_clip(s, options, "clip_cov")
    options.update({POLICY_LOSS + "clip_cov_ratio": s["cov_fraction"], POLICY_LOSS + "clip_cov_lb": s["cov_low"],
                    POLICY_LOSS + "clip_cov_ub": s["cov_high"]})
    differences.append("verl draws the tokens it detaches from torch's global generator; the lab from the "
                       "run's generator (the same law, other draws)")


def _verl_kl_cov(s, options, unmatched, differences):
    options.update({POLICY_LOSS + "loss_mode": "kl_cov", POLICY_LOSS + "kl_cov_ratio": s["cov_fraction"],
                    POLICY_LOSS + "ppo_kl_coef": s["kl_cov_coef"]})


def _verl_dro(s, options, unmatched, differences):
    options.update({POLICY_LOSS + "loss_mode": "dro", POLICY_LOSS + "dro_beta": s["dro_tau"]})


def _verl_gpg(s, options, unmatched, differences):
    options[POLICY_LOSS + "loss_mode"] = "gpg"


def _trl_vespo(s, options, unmatched, differences):
    options.update({"loss_type": "vespo", "vespo_k_pos": s["vespo_k_pos"], "vespo_lambda_pos": s["vespo_lambda_pos"],
                    "vespo_k_neg": s["vespo_k_neg"], "vespo_lambda_neg": s["vespo_lambda_neg"]})
    if s["reduction"] != "token":
        unmatched[f"reduction={s['reduction']}"] = "TRL's vespo loss type takes the token mean over the batch"


def _trl_luspo(s, options, unmatched, differences):
    options.update({"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": s["epsilon"],
                    "epsilon_high": s["epsilon_high"]})
    differences.append("TRL's epsilon defaults to 0.2; LUSPO takes GSPO's 3e-4 and 4e-4, set here")


GROUP_LOSS_TYPES = {"sequence": "grpo", "token": "dapo", "constant": "dr_grpo"}
# verl's vanilla loss always applies dual-clip (clip_ratio_c, default 3.0, asserted > 1); its ratio is exp of a
# log-ratio clamped at 20, so at most e**20 = 4.85e8, and a constant above that never binds: dual-clip off.
VERL_NO_DUAL_CLIP = 1e9
TOKEN = {"reduction": "token"}  # the library's default reduction of the second-wave token losses
POSITIVE = {"low": 0.0, "low_open": True}  # a half-width that must be > 0 (a trust region of 0 keeps nothing)

register_policy_loss("grpo", "grpo_policy_loss", reads=("epsilon", "epsilon_high", "dual_clip", "reduction"),
                     trl=_trl_grpo, verl=_verl_grpo, rloo_epsilon=True, rloo_loss=True, color="#2ca02c",
                     summary="PPO-Clip per token, group-relative advantages (DeepSeekMath)")
register_policy_loss("cispo", "cispo_policy_loss", reads=("epsilon_high", "reduction"), zeroes="cap",
                     defaults={"epsilon_high": 5.0}, ranges={"epsilon_high": POSITIVE}, trl=_trl_cispo,
                     verl=_verl_cispo, color="#9467bd",
                     samples=({}, {"reduction": "token"}, {"reduction": "constant", "tis_cap": 2.0}),
                     summary="detached capped ratio times the log-prob (MiniMax-M1)")
register_policy_loss("gspo", "gspo_policy_loss", reads=("epsilon", "epsilon_high"), ratio="sequence", weights=False,
                     defaults={"epsilon": 3e-4, "epsilon_high": 4e-4}, trl=_trl_gspo, verl=_verl_gspo,
                     rloo_epsilon=True, color="#ff7f0e", samples=({}, {"beta": 0.02}),
                     summary="one clipped length-normalized ratio per response (Qwen)")
register_policy_loss("sapo", "sapo_policy_loss", reads=("tau_pos", "tau_neg", "reduction"), zeroes="none",
                     trl=_trl_sapo, verl=_verl_sapo, color="#8c564b", samples=({}, {"reduction": "token"}),
                     summary="a smooth sigmoid gate instead of the clip (Qwen)")
# the second wave (SPEC section 9): each with its library's defaults
register_policy_loss("dppo-tv", "dppo_policy_loss", reads=("epsilon", "epsilon_high", "dppo_cap", "reduction"),
                     keywords={"epsilon": "delta", "epsilon_high": "delta_high", "dppo_cap": "cap"},
                     fixed={"kind": "tv"}, zeroes="none", defaults=TOKEN, ranges={"epsilon": POSITIVE,
                     "epsilon_high": POSITIVE}, verl=_verl_dppo("tv"), color="#17becf",
                     samples=({}, {"epsilon_high": 0.3, "dppo_cap": 10.0}),
                     summary="a trust region on the token's probability, p - q (DPPO)")
register_policy_loss("dppo-kl", "dppo_policy_loss", reads=("epsilon", "epsilon_high", "dppo_cap", "reduction"),
                     keywords={"epsilon": "delta", "epsilon_high": "delta_high", "dppo_cap": "cap"},
                     fixed={"kind": "kl"}, zeroes="none", defaults=TOKEN, ranges={"epsilon": POSITIVE,
                     "epsilon_high": POSITIVE}, verl=_verl_dppo("kl"), color="#0b6e75", samples=({},),
                     summary="a trust region on the binary KL of the token's probability (DPPO)")
register_policy_loss("gmpo", "gmpo_policy_loss", reads=("epsilon", "epsilon_high"), ratio="sequence", weights=False,
                     zeroes="none", defaults={"epsilon": 0.4}, ranges={"epsilon": POSITIVE,
                     "epsilon_high": POSITIVE}, verl=_verl_gmpo, color="#bcbd22",
                     samples=({}, {"epsilon_high": 0.5}),
                     summary="the geometric mean of the token ratios, clipped in log space (GMPO)")
register_policy_loss("clip-cov", "clip_cov_policy_loss", reads=("epsilon", "epsilon_high", "cov_fraction",
                     "cov_low", "cov_high", "reduction"), keywords={"cov_fraction": "fraction"}, generator=True,
                     defaults=TOKEN, verl=_verl_clip_cov, color="#e377c2",
                     samples=({}, {"cov_fraction": 0.01, "cov_low": 0.5, "cov_high": 2.0}),
                     summary="PPO-Clip, and no gradient on a few tokens of high covariance (Clip-Cov)")
register_policy_loss("kl-cov", "kl_cov_policy_loss", reads=("cov_fraction", "kl_cov_coef", "reduction"),
                     keywords={"cov_fraction": "fraction", "kl_cov_coef": "coef"}, zeroes="none", defaults=TOKEN,
                     verl=_verl_kl_cov, color="#a05195", samples=({}, {"cov_fraction": 0.01, "kl_cov_coef": 0.5}),
                     summary="no clip; a |log-ratio| penalty on the tokens of highest covariance (KL-Cov)")
register_policy_loss("dro", "dro_policy_loss", reads=("dro_tau", "reduction"), keywords={"dro_tau": "tau"},
                     zeroes="none", defaults=TOKEN, verl=_verl_dro, color="#525252", samples=({}, {"dro_tau": 0.5}),
                     summary="the policy gradient with a quadratic log-ratio anchor (DRO)")
register_policy_loss("gpg", "gpg_policy_loss", reads=("reduction",), old_policy=False, zeroes="none",
                     defaults=TOKEN, verl=_verl_gpg, color="#393b79", samples=({},),
                     summary="plain -A log p, no ratio at all (GPG)")
register_policy_loss("topr", "topr_policy_loss", reads=("reduction",), zeroes="none",
                     defaults={"reduction": "constant"}, color="#637939", samples=({},),
                     summary="negative responses weighted by their truncated sequence ratio (TOPR)")
register_policy_loss("cegppo", "cegppo_policy_loss", reads=("epsilon", "epsilon_high", "cegppo_beta1",
                     "cegppo_beta2", "dual_clip", "reduction"), keywords={"cegppo_beta1": "beta1",
                     "cegppo_beta2": "beta2"}, zeroes="none", defaults=TOKEN, color="#8c6d31",
                     samples=({}, {"cegppo_beta1": 0.5, "cegppo_beta2": 0.8, "dual_clip": 3.0}),
                     summary="the clip keeps a scaled gradient outside the range (CE-GPPO)")
register_policy_loss("vespo", "vespo_policy_loss", reads=("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                     "vespo_lambda_neg", "reduction"), keywords={"vespo_k_pos": "k_pos",
                     "vespo_lambda_pos": "lambda_pos", "vespo_k_neg": "k_neg", "vespo_lambda_neg": "lambda_neg"},
                     weights=False, zeroes="none", defaults=TOKEN, trl=_trl_vespo, color="#843c39",
                     samples=({}, {"vespo_k_pos": 1.0, "vespo_lambda_pos": 2.0, "vespo_k_neg": 2.0,
                               "vespo_lambda_neg": 1.0}),
                     summary="a smooth weight of the sequence ratio, w**k exp(lambda (1 - w)) (VESPO)")
register_policy_loss("luspo", "luspo_policy_loss", reads=("epsilon", "epsilon_high"), ratio="sequence", weights=False,
                     defaults={"epsilon": 3e-4, "epsilon_high": 4e-4}, trl=_trl_luspo, color="#e6550d", samples=({},),
                     summary="GSPO's clipped sequence ratio, weighted by the response's length (LUSPO)")


# ---------------------------------------------------------------------------------------------
# Advantages (--advantage)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Advantage:
    """An advantage of the GRPO family: its rl_lab atom and how the loop calls it.

    inputs: "scores" (the (N,) scores and G: group_relative_advantages), "groups" ((B, G) scores),
    "lengths" ((B, G) scores and response lengths), "tokens" ((N, R) token rewards, the score on each
    response's last kept token, and the mask: one advantage per kept token, constant along a response at
    gamma 1), "components" ((B, G, K) the task's rewards one by one: a task with several). reads:
    {setting: the atom's keyword}; fixed: keywords with one value. nonnegative: the atom
    needs scores >= 0 (MaxRL divides by the mean). trl_config: the TRL config class that holds it; trl /
    verl: the mappers of its options. samples: settings the bridge check builds with it."""

    atom: str
    inputs: str = "groups"
    reads: dict = field(default_factory=dict)
    fixed: dict = field(default_factory=dict)
    nonnegative: bool = False
    trl_config: str = "GRPOConfig"
    trl: object = None
    verl: object = None
    samples: tuple = ()
    summary: str = ""

    @property
    def function(self):
        return _function(self.atom)


ADVANTAGES = {}


def register_advantage(name, atom, **entry):
    ADVANTAGES[name] = Advantage(atom, **entry)


def _trl_grpo_advantage(s, options, unmatched, differences):
    options["scale_rewards"] = s["scale_rewards"]
    if s["scale_rewards"] != "none":
        differences.append("TRL's group std is the unbiased one (divides by G - 1) with eps 1e-4; the lab's is "
                           "the population std (divides by G) with eps 1e-4")


def _trl_rloo_advantage(s, options, unmatched, differences):
    options["normalize_advantages"] = False


def _trl_no_advantage(s, options, unmatched, differences):
    options["scale_rewards"] = "none"
    unmatched[f"advantage={s['advantage']}"] = ("TRL's GRPOTrainer has only the group-relative advantage "
                                                "(scale_rewards group, batch or none)")


def _verl_grpo_advantage(s, options, unmatched, differences):
    options["algorithm.adv_estimator"] = "grpo"
    if s["scale_rewards"] == "batch":
        unmatched["scale_rewards=batch"] = ("verl's grpo estimator divides by the group's std or none; "
                                            "reinforce_plus_plus_baseline whitens over tokens instead")
    else:
        options["algorithm.norm_adv_by_std_in_grpo"] = s["scale_rewards"] == "group"
    if s["scale_rewards"] == "group":
        differences.append("verl's group std is torch.std (unbiased, divides by G - 1) with eps 1e-6; the "
                           "lab's is the population std with eps 1e-4")


def _verl_estimator(name, difference=None):
    def mapper(s, options, unmatched, differences):
        options["algorithm.adv_estimator"] = name
        if difference is not None:
            differences.append(difference)
    return mapper


def _verl_maxrl(s, options, unmatched, differences):
    options["algorithm.adv_estimator"] = "grpo"
    unmatched["advantage=maxrl"] = ("verl 0.9.1 has no MaxRL estimator (the authors' verl fork and SkyRL's "
                                    "adv_estimator=maxrl have it)")


def _trl_gdpo(s, options, unmatched, differences):
    options["multi_objective_aggregation"] = "normalize_then_sum"
    differences.append("TRL sums its reward functions' normalized rewards (reward_weights 1): the lab's "
                       "Countdown rewards are its two functions, correct and format")


def _verl_gdpo(s, options, unmatched, differences):
    options["algorithm.adv_estimator"] = "gdpo"
    differences.append("verl's gdpo adds 1e-6 (the lab 1e-4) to its stds, weights the batch whitening by the "
                       "token counts and takes its first stage in float32")


register_advantage("grpo", "group_relative_advantages", inputs="scores", reads={"scale_rewards": "scale"},
                   fixed={"eps": 1e-4}, trl=_trl_grpo_advantage, verl=_verl_grpo_advantage,
                   summary="(reward - group mean) / std")
register_advantage("rloo", "rloo_advantages", trl_config="RLOOConfig", trl=_trl_rloo_advantage,
                   verl=_verl_estimator("rloo"), samples=({}, {"kl_in": "reward", "kl_estimator": "k1"},
                   {"kl_in": "reward", "kl_estimator": "k3"}, {"dual_clip": 3.0, "tis_cap": 2.0}),
                   summary="reward - mean of the other responses of the prompt")
register_advantage("maxrl", "maxrl_advantages", samples=({},), nonnegative=True, trl=_trl_no_advantage,
                   verl=_verl_maxrl,
                   summary="(reward - mean) / mean: reward / p - 1 for a 0/1 reward (MaxRL)")
register_advantage("reinforce-pp", "reinforce_pp_advantages", samples=({},), inputs="tokens", fixed={"gamma": 1.0},
                   trl=_trl_no_advantage, verl=_verl_estimator(
                       "reinforce_plus_plus", "verl whitens with the unbiased variance and adds 1e-8 to its count"),
                   summary="the return whitened over the batch's kept tokens (REINFORCE++)")
register_advantage("reinforce-pp-baseline", "reinforce_pp_baseline_advantages", samples=({},), inputs="lengths",
                   trl=_trl_no_advantage, verl=_verl_estimator(
                       "reinforce_plus_plus_baseline", "verl whitens over tokens (masked_whiten): the lab weights "
                       "each response by its length, the same numbers up to its 1e-8"),
                   summary="reward - group mean, whitened over the batch's tokens (REINFORCE++ with baseline)")
register_advantage("opo", "opo_advantages", samples=({},), inputs="lengths", trl=_trl_no_advantage,
                   verl=_verl_estimator("opo"),
                   summary="reward - the length-weighted group mean (OPO)")
register_advantage("passk", "passk_advantages", samples=({},), trl=_trl_no_advantage,
                   verl=_verl_estimator("grpo_passk"),
                   summary="only the best response of a group gets credit: best - second best (pass@k)")
register_advantage("gdpo", "gdpo_advantages", inputs="components", trl=_trl_gdpo, verl=_verl_gdpo,
                   samples=({"policy": "transformer"},),
                   summary="each of the task's rewards normalized in its group, then the sum over the batch (GDPO)")
register_advantage("gpg", "gpg_advantages", samples=({},), trl=_trl_no_advantage, verl=_verl_estimator("gpg"),
                   summary="(reward - group mean) scaled by the share of nonzero rewards (GPG)")


# ---------------------------------------------------------------------------------------------
# Preference losses (--algorithm dpo --dpo-loss)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PreferenceLoss:
    """A DPO-family loss: its rl_lab atom, the settings it reads ({setting: the atom's keyword}), whether it
    compares against the reference, its defaults of shared settings, and its TRL mappers: trl_online
    (OnlineDPOConfig, fills loss_type) and trl_offline (returns the config class name)."""

    atom: str
    reads: dict = field(default_factory=dict)
    reference: bool = True
    defaults: dict = field(default_factory=dict)
    trl_online: object = None
    trl_offline: object = None
    summary: str = ""

    @property
    def function(self):
        return _function(self.atom)


PREFERENCE_LOSSES = {}


def register_preference_loss(name, atom, **entry):
    PREFERENCE_LOSSES[name] = PreferenceLoss(atom, **entry)


def losses_reading(setting):
    """The preference losses whose atom reads `setting` (the ones it changes something for)."""
    return tuple(name for name, entry in PREFERENCE_LOSSES.items() if setting in entry.reads)


def _online_as(loss_type, label_smoothing=False):
    def mapper(s, options, unmatched):
        options["loss_type"] = loss_type
        if label_smoothing and s["label_smoothing"] > 0:
            unmatched["label_smoothing"] = "OnlineDPOConfig has no label_smoothing: its sigmoid loss is plain DPO"
    return mapper


def _online_none(s, options, unmatched):
    options["loss_type"] = "sigmoid"
    unmatched[f"dpo_loss={s['dpo_loss']}"] = "OnlineDPOConfig's loss_type is sigmoid or ipo"


def _offline_sigmoid(label_smoothing=False):
    def mapper(s, options, unmatched):
        # sigmoid_norm is DPO on per-token averages, the lab's --sequence-logp mean
        options["loss_type"] = "sigmoid_norm" if s["sequence_logp"] == "mean" else "sigmoid"
        if label_smoothing and s["label_smoothing"] > 0:
            unmatched["label_smoothing"] = ("TRL 1.16 has no cDPO: its sigmoid loss ignores label_smoothing (used "
                                            "only by robust, exo_pair and aot)")
        return "DPOConfig"
    return mapper


def _offline_ipo(s, options, unmatched):
    options["loss_type"] = "ipo"
    if s["sequence_logp"] != "mean":
        unmatched["sequence_logp=sum"] = "TRL's offline ipo averages the log-probs per token: --sequence-logp mean"
    return "DPOConfig"


def _offline_summed(loss_type, label_smoothing=False):
    def mapper(s, options, unmatched):
        options["loss_type"] = loss_type
        if label_smoothing:
            options["label_smoothing"] = s["label_smoothing"]
        if s["sequence_logp"] == "mean":
            unmatched["sequence_logp=mean"] = f"TRL's {loss_type} sums the log-probs"
        return "DPOConfig"
    return mapper


def _offline_simpo(s, options, unmatched):
    options.update({"loss_type": "simpo", "cpo_alpha": 0.0, "simpo_gamma": s["simpo_gamma"]})
    if s["sequence_logp"] != "mean":
        unmatched["sequence_logp=sum"] = "TRL's SimPO averages the log-probs per token"
    return "CPOConfig (trl.experimental.cpo)"


register_preference_loss("sigmoid", "dpo_loss", defaults={"dpo_beta": 0.5}, trl_online=_online_as("sigmoid"),
                         trl_offline=_offline_sigmoid(), summary="DPO")
# ipo's beta sets its target margin 1/(2 beta), the hinge's 1/beta: TRL's 0.1
register_preference_loss("ipo", "ipo_loss", defaults={"dpo_beta": 0.1}, trl_online=_online_as("ipo"),
                         trl_offline=_offline_ipo, summary="IPO")
register_preference_loss("hinge", "dpo_hinge_loss", defaults={"dpo_beta": 0.1}, trl_online=_online_none,
                         trl_offline=_offline_summed("hinge"), summary="RSO's hinge on the relative margin")
register_preference_loss("cdpo", "cdpo_loss", reads={"label_smoothing": "label_smoothing"},
                         defaults={"dpo_beta": 0.5}, trl_online=_online_as("sigmoid", label_smoothing=True),
                         trl_offline=_offline_sigmoid(label_smoothing=True), summary="DPO with label smoothing")
register_preference_loss("robust", "robust_dpo_loss", reads={"label_smoothing": "label_smoothing"},
                         defaults={"dpo_beta": 0.5}, trl_online=_online_none,
                         trl_offline=_offline_summed("robust", label_smoothing=True), summary="rDPO")
register_preference_loss("simpo", "simpo_loss", reads={"simpo_gamma": "gamma"}, reference=False,
                         defaults={"dpo_beta": 2.0, "sequence_logp": "mean"}, trl_online=_online_none,
                         trl_offline=_offline_simpo, summary="no reference, length-averaged log-probs")


# ---------------------------------------------------------------------------------------------
# Algorithms and their colours
# ---------------------------------------------------------------------------------------------

ALGORITHMS = ("ppo", "dpo") + tuple(POLICY_LOSSES)
FOUR_ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")  # --algorithm all: the article's three and CISPO
FAMILY_COLORS = {"ppo": "#1f77b4", "dpo": "#d62728"}  # PPO and DPO are algorithms of their own family
COLORS = FAMILY_COLORS | {name: entry.color for name, entry in POLICY_LOSSES.items()}


def family_of(algorithm):
    """The family an algorithm belongs to: "group" for every registered policy loss, else its own."""
    return "group" if algorithm in POLICY_LOSSES else algorithm
