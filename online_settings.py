"""Every setting of the online driver, declared once: the fields of `OnlineConfig`. The command line,
`--help`, validation, per-algorithm defaults, the JSON "settings" block and the default output folder
are derived from these declarations (lab/settings.py says how).

    cfg = resolve({"algorithm": "cispo", "reduction": "token"})   # an OnlineConfig, or SettingError
    cfg.epsilon_high                                              # 5.0: CISPO's own default

An option that does not apply to the algorithm is an error, and so is one that another option switches
off (--label-smoothing with the sigmoid loss): a setting that would change nothing must not be silently
accepted.
"""

from __future__ import annotations

import dataclasses
import hashlib

from lab.settings import SEED, SEED_LIMIT, STEPS, SettingError, check_value, declared, setting
from online_registry import ADVANTAGES, ALGORITHMS, POLICY_LOSSES, PREFERENCE_LOSSES, losses_reading

# What the declarations need from the modules that import torch, named here without torch, so that
# online_tokens.py answers --help and a bad flag at once. test_cli checks each against its source.
POLICIES = ("table", "transformer")  # policies.POLICIES
TASKS = ("binary", "countdown")  # tasks.TASKS
TASK_REWARDS = {"binary": ("reward",), "countdown": ("correct", "format")}  # tasks.TASK_REWARDS
TASK_MIN_NEW_TOKENS = {"binary": 1, "countdown": 8}  # tasks.TASK_MIN_NEW_TOKENS
SFT_STEPS = 1500  # sft.SFTConfig().steps
LOSS_KL_ESTIMATORS = ("k1", "k2", "k3", "k3+", "k1+")  # online_algorithms.LOSS_KL_ESTIMATORS
RATIO_CORRECTED_KL = "k3-is"  # online_algorithms.RATIO_CORRECTED_KL
REDUCTIONS = ("sequence", "token", "constant")  # rl_lab.REDUCTIONS
ROLLOUT_LEVELS = ("token", "sequence")  # rl_lab.ROLLOUT_LEVELS
ROLLOUT_MODES = ("truncate", "mask")  # rl_lab.ROLLOUT_MODES
SAPO_MIN_TAU = 1e-6  # rl_lab.SAPO_MIN_TAU
VERIFIER_LOOPHOLES = ("reuse",)  # countdown.LOOPHOLES

# the response cap each task needs by default: binary answers have at most 3 digits + EOS; Countdown's
# longest expression over 4 numbers has 7 tokens + EOS
TASK_DEFAULTS = {"binary": {"max_new_tokens": 5}, "countdown": {"max_new_tokens": 8}}
# what a transformer needs besides the table's settings: Countdown as its task, a learning rate in the
# usual fine-tuning range (a few times higher moves the policy far from its start without raising its test
# success), 16 prompts a batch (at 8 many of Countdown's groups tie) and 100 iterations, about where test
# success levels off (docs/transformer.md shows the committed run)
POLICY_DEFAULTS = {"table": {}, "transformer": {"task": "countdown", "learning_rate": 3e-4, "prompts": 16,
                                                "steps": 100}}

# a run's comparison row: the iterations and tokens until the exact success probability first reaches
# TARGET_SUCCESS, lengths averaged over the last LAST_ITERATIONS iterations (one batch is noisy); the plotter
# and the atlas (atlas/runners.py) read them from here
TARGET_SUCCESS = 0.9
LAST_ITERATIONS = 10
DPO_REJECTED = ("first", "nearest", "farthest")  # --dpo-rejected: which lowest-reward response a pair rejects
MAX_DEFAULT_NAME = 120  # characters of a default output folder name (a file system allows 255 bytes)
MIN_TEMPERATURE = 0.01  # below it the tempered logits overflow exp() once the table has learned anything
# B*G*R token positions per batch: 2**20 take about 0.5 GB of memory and 5 s per iteration on one core
MAX_TOKEN_POSITIONS = 2**20
GROUP = tuple(POLICY_LOSSES)  # the GRPO family: every registered policy loss
# a transformer's batch of 2048 responses (64 prompts x 32) peaks at about 0.7 GB: 4096 stays near 1.5 GB
POLICY_MAX_RESPONSES = {"table": 2**20, "transformer": 4096}
# a table has one row per prompt and cannot answer a prompt it never trained on: only the binary task
POLICY_TASKS = {"table": ("binary",), "transformer": ("countdown",)}
EVERY = ALGORITHMS
# the settings of the importance weights: they apply to every loss that takes weights (entry.weights)
WEIGHT_SETTINGS = ("tis_cap", "rollout_correction", "rollout_correction_mode", "rollout_correction_low",
                   "rollout_correction_high")
# --kl-estimator choices that differ from k3 (k1) only in their gradient: in the reward nothing is differentiated
GRADIENT_ONLY_KL = ("k3-is", "k3+", "k1+")


def _own_defaults(setting):
    """--help's default text of a shared setting: the declared one, then each loss's own."""
    own = {}
    for name, entry in POLICY_LOSSES.items():
        if setting in entry.defaults:
            own.setdefault(entry.defaults[setting], []).append(name)
    return "; ".join(f"{', '.join(names)} {value}" for value, names in own.items())


def _shared(item, default, **options):
    return setting(default, item.help, kind=item.kind, low=item.low, high=item.high, **options)


@dataclasses.dataclass(frozen=True)
class OnlineConfig:
    """One online run's settings; field order is the order of the JSON "settings" block."""

    # every algorithm
    algorithm: str = setting("grpo", "what to train", choices=ALGORITHMS)
    policy: str = setting("table", "the policy: a lookup table (exact evaluation, no sharing) or a tiny transformer "
                          "warm-started by SFT (tiny_lm.py)", choices=POLICIES)
    task: str = setting("binary", "binary = write a number 0..5 in binary; countdown = reach a target with given "
                        "numbers (needs --policy transformer)", choices=TASKS, default_text="binary; "
                        "countdown with --policy transformer")
    steps: int = _shared(STEPS, 60, default_text="60; 100 with --policy transformer")
    seed: int = _shared(SEED, 7)
    prompts: int = setting(8, "prompts drawn per iteration (B)", low=1, high=4096,
                           default_text="8; 16 with --policy transformer")
    group_size: int = setting(8, "responses per prompt (G); B*G responses per iteration for every algorithm",
                              low=2, high=1024)
    max_new_tokens: int = setting(5, "cap on response length; a response that reaches it without EOS is truncated",
                                  low=1, high=64, default_text="5; 8 with --task countdown")
    temperature: float = setting(1.0, "temperature of the trainer's policy (sampling and every log-prob)",
                                 low=MIN_TEMPERATURE, high=10.0)
    updates_per_batch: int = setting(2, "Adam steps on each batch (ratios leave 1 after the first)", low=1, high=64)
    beta: float = setting(0.02, "KL weight: GRPO family, the KL to the reference in the loss (or the reward); "
                          "PPO, the per-token -beta * k1 reward", low=0.0, high=10.0, applies=("ppo",) + GROUP)
    learning_rate: float = setting(0.2, "Adam learning rate", low=0.0, high=10.0, low_open=True, flag="--lr",
                                   default_text="0.2; 0.0003 with --policy transformer")
    # the GRPO family
    reduction: str = setting("sequence", "sequence = mean per response then over responses (GRPO, the lesson); "
                             "token = mean over all kept tokens (DAPO); constant = sum / (B*G*max_new_tokens) "
                             "(Dr. GRPO)", choices=REDUCTIONS, applies=(),
                             default_text="sequence; " + _own_defaults("reduction"))
    epsilon: float = setting(0.2, "clip half-width below 1; dppo-tv: the trust region on p - q; dppo-kl: on the "
                             "binary KL; gmpo: in log space", low=0.0, high=1.0, high_open=True, applies=("ppo",),
                             default_text="0.2; " + _own_defaults("epsilon"))
    epsilon_high: float = setting(None, "upper clip half-width (DAPO's clip-higher); cispo: the absolute cap on "
                                  "the ratio", low=0.0, high=100.0, optional=True, applies=(),
                                  default_text="--epsilon; " + _own_defaults("epsilon_high"))
    dual_clip: float = setting(None, "dual-clip constant c > 1: the loss of an A < 0 token is at most -c * A",
                               low=1.0, high=1e6, low_open=True, optional=True, applies=())
    tau_pos: float = setting(1.0, "SAPO's gate temperature for A > 0", low=SAPO_MIN_TAU, high=100.0, applies=())
    tau_neg: float = setting(1.05, "SAPO's gate temperature for A < 0", low=SAPO_MIN_TAU, high=100.0, applies=())
    advantage: str = setting("grpo", "; ".join(f"{name} = {entry.summary}" for name, entry in ADVANTAGES.items()),
                             choices=tuple(ADVANTAGES), applies=GROUP)
    scale_rewards: str = setting("group", "divide by the group's std, the batch's, or none (Dr. GRPO)",
                                 choices=("group", "batch", "none"), applies=GROUP, requires=("advantage", ("grpo",)))
    kl_estimator: str = setting("k3", "the per-token KL estimator (k3 as the lesson; k1 = log-ratio; k2 = half "
                                "its square; k3-is = k3 times the ratio to the old policy, TRL's default; k3+ and "
                                "k1+ = k3's and k1's value with k2's gradient, verl's)",
                                choices=LOSS_KL_ESTIMATORS + (RATIO_CORRECTED_KL,), applies=GROUP)
    kl_in: str = setting("loss", "the KL as a loss term, or subtracted from each response's reward (beta times "
                         "its summed estimate) before the advantages", choices=("loss", "reward"), applies=GROUP)
    mask_truncated: bool = setting(False, "drop responses that hit the cap from the loss", applies=GROUP)
    overlong_penalty: int = setting(None, "DAPO's soft overlong punishment with this cache (tokens before the "
                                    "cap where it ramps to -1)", low=1, high="max_new_tokens", optional=True,
                                    applies=GROUP)
    advantage_sign: str = setting("both", "keep the advantages of both signs, only A > 0 (positive sample "
                                  "reinforcement) or only A < 0 (negative sample reinforcement; Zhu et al., "
                                  "arXiv 2506.01347): the other sign's responses get advantage 0",
                                  choices=("both", "positive", "negative"), applies=GROUP, quiet=True)
    random_reward: float = setting(None, "train on a spurious reward: each response gets 1 with this probability, "
                                   "else 0, drawn from the run's generator whatever its answer (Shao et al. 2025); "
                                   "the verifier's own reward is logged as true_reward_mean", low=0.0, high=1.0,
                                   optional=True, applies=GROUP, quiet=True)
    verifier_loophole: str = setting(None, "train on a flawed verifier's reward (a proxy to hack): reuse = it also "
                                     "accepts an expression that uses a given number twice; the correct verifier's "
                                     "reward is logged as true_reward_mean, the flawed one's as proxy_reward_mean",
                                     choices=VERIFIER_LOOPHOLES, optional=True, applies=GROUP,
                                     policies=("transformer",), quiet=True)
    dynamic_sampling: bool = setting(False, "resample until every group's rewards vary (DAPO), counting every "
                                     "extra response", applies=GROUP)
    max_resample_rounds: int = setting(8, "extra batches drawn at most", low=1, high=64,
                                       applies=GROUP, requires=("dynamic_sampling", (True,)))
    rollout_temperature: float = setting(None, "sample at this temperature while the trainer scores at "
                                         "--temperature (a sampler/trainer mismatch)", low=MIN_TEMPERATURE,
                                         high=10.0, optional=True, applies=GROUP)
    rollout_top_p: float = setting(None, "sample from the top-p nucleus while the trainer scores the full "
                                   "distribution", low=0.0, high=1.0, low_open=True, optional=True, applies=GROUP)
    tis_cap: float = setting(None, "weight each token's policy term by min(p_trainer / p_sampler, cap) "
                             "(truncated importance sampling)", low=1.0, high=1e6, optional=True, applies=())
    # the second wave (SPEC section 9): every switch off by default, and out of the JSON settings while off
    rollout_correction: str = setting(None, "weight each token's policy term by p_trainer / p_sampler of the token "
                                      "or of the whole sequence (verl's rollout_is, TRL's vllm_importance_sampling_"
                                      "mode); --tis-cap C is --rollout-correction token --rollout-correction-high C",
                                      choices=ROLLOUT_LEVELS, optional=True, applies=(), quiet=True)
    rollout_correction_mode: str = setting("truncate", "truncate the weight to [low, high], or mask: zero the "
                                           "weight that leaves [low, high] (IcePop with both bounds)",
                                           choices=ROLLOUT_MODES, applies=(), quiet=True,
                                           requires=("rollout_correction", ROLLOUT_LEVELS))
    rollout_correction_low: float = setting(None, "the weight's lower bound (off: open below)", low=0.0, high=1e6,
                                            low_open=True, optional=True, applies=(), quiet=True,
                                            requires=("rollout_correction", ROLLOUT_LEVELS))
    rollout_correction_high: float = setting(2.0, "the weight's upper bound", low=0.0, high=1e6, low_open=True,
                                             applies=(), quiet=True, requires=("rollout_correction", ROLLOUT_LEVELS))
    off_policy_mask: float = setting(None, "drop from the loss a response with A < 0 whose mean log-ratio sampler / "
                                     "policy exceeds this many nats (DeepSeek-V3.2, TRL's off_policy_mask_threshold)",
                                     low=0.0, high=1e6, optional=True, applies=GROUP, quiet=True)
    m2po: float = setting(None, "drop the tokens of largest squared log-ratio policy / sampler until their mean is "
                          "below this (M2PO; its paper's 0.04)", low=0.0, high=1e6, low_open=True, optional=True,
                          applies=GROUP, quiet=True)
    entropy_coef: float = setting(0.0, "entropy bonus: minus this times the token mean of the policy's entropy "
                                  "in the loss (TRL's entropy_coef, verl's entropy_coeff)", low=0.0, high=10.0,
                                  applies=GROUP, quiet=True)
    adaptive_entropy: float = setting(None, "target entropy in nats per token: the entropy coefficient starts at "
                                      "--entropy-coef and moves by 0.005 each optimizer step, up while the entropy "
                                      "is at or below the target, down above it, within [0, 1] (Skywork-OR1, TRL's "
                                      "use_adaptive_entropy)", low=0.0, high=100.0, low_open=True, optional=True,
                                      applies=GROUP, quiet=True)
    top_entropy_quantile: float = setting(None, "train only on the kept tokens whose entropy is in this top share "
                                          "of the batch's (0: the highest only; arXiv 2506.01939's 0.2, TRL's "
                                          "top_entropy_quantile)", low=0.0, high=1.0, optional=True, applies=GROUP,
                                          quiet=True)
    # the second wave's losses: each setting applies to the losses that read it (online_registry.py)
    dppo_cap: float = setting(3.0, "DPPO's cap on the detached ratio that weights each kept token (verl's "
                              "clip_ratio_c)", low=0.0, high=1e6, low_open=True, applies=())
    cov_fraction: float = setting(2e-4, "the share of kept tokens Clip-Cov detaches and KL-Cov penalizes (at least "
                                  "one token; verl's clip_cov_ratio, kl_cov_ratio)", low=0.0, high=1.0,
                                  low_open=True, applies=())
    cov_low: float = setting(1.0, "Clip-Cov's lower bound on a candidate token's covariance (verl's clip_cov_lb)",
                             low=-1e6, high=1e6, applies=())
    cov_high: float = setting(5.0, "Clip-Cov's upper bound on a candidate token's covariance (verl's clip_cov_ub)",
                              low=-1e6, high=1e6, applies=())
    kl_cov_coef: float = setting(0.1, "KL-Cov's weight of |log-ratio| on its tokens (verl's ppo_kl_coef)", low=0.0,
                                 high=100.0, applies=())
    dro_tau: float = setting(0.1, "DRO's weight tau of the anchor tau / 2 * (log-ratio)**2 (verl's dro_beta, which "
                             "has no default)", low=0.0, high=100.0, low_open=True, applies=())
    cegppo_beta1: float = setting(0.75, "CE-GPPO's scale of the gradient of an A < 0 token below 1 - epsilon",
                                  low=0.0, high=100.0, applies=())
    cegppo_beta2: float = setting(1.0, "CE-GPPO's scale of the gradient of an A > 0 token above 1 + epsilon_high",
                                  low=0.0, high=100.0, applies=())
    vespo_k_pos: float = setting(2.0, "VESPO's power k of the sequence weight for A >= 0", low=0.0, high=100.0,
                                 applies=())
    vespo_lambda_pos: float = setting(3.0, "VESPO's lambda for A >= 0", low=0.0, high=100.0, applies=())
    vespo_k_neg: float = setting(3.0, "VESPO's power k for A < 0", low=0.0, high=100.0, applies=())
    vespo_lambda_neg: float = setting(2.0, "VESPO's lambda for A < 0", low=0.0, high=100.0, applies=())
    # PPO
    gamma: float = setting(1.0, "discount", low=0.0, high=1.0, applies=("ppo",))
    gae_lambda: float = setting(0.95, "GAE lambda", low=0.0, high=1.0, applies=("ppo",))
    truncation: str = setting("bootstrap", "a response cut at the cap bootstraps V(state after the cap), or is "
                              "terminal (TRL, verl). The verifier scores a cut response, so the cap is part of the "
                              "task and terminal is the right treatment here; bootstrap is right only where the cut "
                              "gets no verdict (Pardo et al. 2018). With --cap-value table the two give the same "
                              "numbers", choices=("bootstrap", "terminal"), applies=("ppo",))
    cap_value: str = setting("table", "the value of the state after the cap comes from its "
                             "own critic row (never visited: 0) or the last position's (shared)",
                             choices=("table", "shared"), applies=("ppo",), requires=("truncation", ("bootstrap",)),
                             policies=("table",))
    whiten_advantages: bool = setting(True, "whiten the advantages over the batch's kept tokens, as TRL and verl; "
                                      "--no-whiten switches it off", applies=("ppo",), flag="--no-whiten",
                                      action="store_false")
    value_coef: float = setting(0.5, "weight of the critic's loss", low=0.0, high=100.0, applies=("ppo",))
    value_clip: float = setting(None, "clip the value update around the old values (PPO2)", low=0.0, high=100.0,
                                low_open=True, optional=True, applies=("ppo",))
    # DPO
    dpo_loss: str = setting("sigmoid", "sigmoid (DPO), ipo, hinge (RSO), cdpo (label smoothing), robust (rDPO), "
                            "simpo (no reference, length-averaged)", choices=tuple(PREFERENCE_LOSSES),
                            applies=("dpo",))
    dpo_beta: float = setting(0.5, "beta of the loss", low=1e-6, high=100.0, applies=("dpo",),
                              default_text="0.5; ipo and hinge 0.1; simpo 2.0")
    label_smoothing: float = setting(0.0, "the believed label-flip rate e", low=0.0, high=0.5, high_open=True,
                                     applies=("dpo",), requires=("dpo_loss", losses_reading("label_smoothing")))
    simpo_gamma: float = setting(0.5, "SimPO's target margin gamma", low=0.0, high=100.0, applies=("dpo",),
                                 requires=("dpo_loss", losses_reading("simpo_gamma")))
    sequence_logp: str = setting("sum", "a response's log-prob is the sum over its tokens (DPO) or their mean",
                                 choices=("sum", "mean"), applies=("dpo",), default_text="sum; simpo mean")
    offline: bool = setting(False, "pairs sampled from the frozen initial policy, not the current one (online vs "
                            "offline, one flag apart)", applies=("dpo",))
    dpo_rejected: str = setting("first", "which of a group's lowest-reward responses is the rejected one: the first "
                                "in sampling order, the nearest to the chosen (fewest token positions that differ) "
                                "or the farthest (most); ties go to the first", choices=DPO_REJECTED,
                                applies=("dpo",), quiet=True)
    # the transformer policy
    dtype: str = setting("float32", "the trainer's precision: every log-prob, ratio and update",
                         choices=("float32", "float64"), policies=("transformer",))
    sampler_dtype: str = setting(None, "the sampler's precision (the KV-cache forward passes), as an inference engine "
                                 "samples in a lower one than the trainer scores in", optional=True,
                                 choices=("float64", "float32", "bfloat16", "float16"), policies=("transformer",),
                                 default_text="--dtype")
    position_ids: str = setting("mask", "how the trainer numbers the positions of a left-padded batch: from the "
                                "attention mask (cumsum - 1, as the sampler does) or arange 0..T-1 in every row (the "
                                "left-padding bug: a padded prompt's tokens get shifted positions)",
                                choices=("mask", "arange"), policies=("transformer",))
    use_cache: bool = setting(True, "sample with the KV cache (--no-cache: a full forward pass per token; the same "
                              "samples)", flag="--no-cache", action="store_false", policies=("transformer",))
    sft_steps: int = setting(SFT_STEPS, "Adam steps of the SFT warm start (0: start from the random "
                             "initialization)", low=0, high=100_000, policies=("transformer",))
    sft_folder: str = setting("results-sft", "the folder of cached SFT models, one subfolder per SFT setting "
                              "(reused by later runs with the same settings)", policies=("transformer",))
    sft_seed: int = setting(0, "seeds the SFT warm start (its demonstrations, initial weights and batch order; "
                            "0: the start `python sft.py` trains); the atlas sets it to each run's seed, so that "
                            "its seeds vary the start too", low=0, high=SEED_LIMIT - 1, policies=("transformer",))
    eval_prompts: int = setting(32, "prompts of each split whose exact success probability is computed after "
                                "every update (a fixed draw)", low=1, high=100_000, policies=("transformer",))
    eval_samples: int = setting(64, "responses sampled per test prompt for pass@k before and after training (0: "
                                "no sampled evaluation)", low=0, high=1024, policies=("transformer",))


SETTINGS = declared(OnlineConfig)
BY_NAME = {item.name: item for item in SETTINGS}


def applies_to(item):
    """The algorithms a setting applies to: its declared ones (None: every one), and every registered
    policy loss that reads it."""
    if item.applies is None:
        return EVERY
    readers = tuple(name for name, entry in POLICY_LOSSES.items()
                    if item.name in entry.reads or (item.name in WEIGHT_SETTINGS and entry.weights))
    return tuple(name for name in EVERY if name in item.applies or name in readers)


APPLIES = {item.name: applies_to(item) for item in SETTINGS}


def _error(name, reason):
    item = BY_NAME[name]
    return SettingError(name, item.option, reason)


def check_applies(algorithm, options):
    """SettingError for the first option that does not apply to `algorithm`."""
    for name in options:
        if name not in BY_NAME:
            raise SettingError(name, "--" + name.replace("_", "-"),
                               f"not a setting of the online run (expected one of {', '.join(BY_NAME)})")
        if algorithm not in APPLIES[name]:
            raise _error(name, f"does not apply to {algorithm} (only to {', '.join(APPLIES[name])})")


def resolve(options):
    """An OnlineConfig from {name: value}: the declared defaults, then the policy's, the task's, the
    algorithm's and the preference loss's own, then `options`; every value checked once. Raises
    SettingError (a ValueError whose message starts with the setting's name) for an unknown, inapplicable
    or bad setting."""
    algorithm = check_value(BY_NAME["algorithm"], options.get("algorithm", BY_NAME["algorithm"].default))
    check_applies(algorithm, options)
    policy = check_value(BY_NAME["policy"], options.get("policy", BY_NAME["policy"].default))
    for name in options:
        if BY_NAME[name].policies is not None and policy not in BY_NAME[name].policies:
            raise _error(name, f"does not apply to the {policy} policy (only to {', '.join(BY_NAME[name].policies)})")
    values = {item.name: item.default for item in SETTINGS}
    values.update(POLICY_DEFAULTS[policy])
    task = check_value(BY_NAME["task"], options.get("task", values["task"]))
    if task not in POLICY_TASKS[policy]:
        raise _error("task", f"{task} needs another policy than {policy} (it takes {', '.join(POLICY_TASKS[policy])})")
    values.update(TASK_DEFAULTS[task])
    if algorithm in POLICY_LOSSES:
        values.update(POLICY_LOSSES[algorithm].defaults)
    dpo_loss = check_value(BY_NAME["dpo_loss"], options.get("dpo_loss", values["dpo_loss"]))
    values.update(PREFERENCE_LOSSES[dpo_loss].defaults)
    values.update(options)
    ranges = POLICY_LOSSES[algorithm].ranges if algorithm in POLICY_LOSSES else {}
    for item in SETTINGS:
        if item.name in ranges:
            item = dataclasses.replace(item, **ranges[item.name])
        high = values[item.high] if isinstance(item.high, str) else None
        values[item.name] = check_value(item, values[item.name], high=high)
    for name in options:  # an option that another option switches off would change nothing: an error
        needs = BY_NAME[name].requires
        if needs is not None and values[needs[0]] not in needs[1]:
            holds = " or ".join(map(str, needs[1]))
            raise _error(name, f"applies only with {needs[0]} {holds}, got {values[needs[0]]}")
    check_combinations(values, options)
    if values["max_new_tokens"] < TASK_MIN_NEW_TOKENS[task]:
        raise _error("max_new_tokens", f"expected at least {TASK_MIN_NEW_TOKENS[task]} for the {task} task (its "
                                       f"longest correct response), got {values['max_new_tokens']}")
    responses = values["prompts"] * values["group_size"]
    if responses > POLICY_MAX_RESPONSES[policy]:
        raise _error("prompts", f"prompts * group_size = {responses} responses per batch, more than the "
                                f"{POLICY_MAX_RESPONSES[policy]} a {policy} policy holds in a few GB of memory")
    positions = responses * values["max_new_tokens"]
    if positions > MAX_TOKEN_POSITIONS:
        raise _error("prompts", f"prompts * group_size * max_new_tokens = {positions} token positions per batch, "
                                f"more than {MAX_TOKEN_POSITIONS}")
    return OnlineConfig(**values)


def check_combinations(values, options):
    """SettingError for settings that are each in range but that the run cannot take together."""
    if values["tis_cap"] is not None and values["rollout_correction"] is not None:
        raise _error("rollout_correction", "not with --tis-cap, one of its cases (--rollout-correction token "
                                           "--rollout-correction-high C): give one of the two")
    low, high = values["rollout_correction_low"], values["rollout_correction_high"]
    if values["rollout_correction"] is not None and low is not None and low > high:
        raise _error("rollout_correction_low", f"expected at most --rollout-correction-high ({high}), got {low}")
    if "cov_low" in options or "cov_high" in options:
        if values["cov_low"] >= values["cov_high"]:
            raise _error("cov_high", f"expected more than --cov-low ({values['cov_low']}), got {values['cov_high']}")
    for name in ("kl_estimator", "kl_in"):
        if name in options and values["beta"] == 0:  # no KL term: the estimator and its place change nothing
            raise _error(name, "changes nothing at --beta 0 (no KL term): give a beta above 0, or leave it out")
    if values["kl_estimator"] in GRADIENT_ONLY_KL and values["kl_in"] == "reward":
        raise _error("kl_estimator", f"{values['kl_estimator']} differs from k3 (k1) only in its gradient, and a KL "
                                     "in the reward (--kl-in reward) is not differentiated: take k3 or k1")
    if values["random_reward"] is not None and values["verifier_loophole"] is not None:
        raise _error("random_reward", "not with --verifier-loophole: a random reward reads no verifier")
    if values["algorithm"] in POLICY_LOSSES and ADVANTAGES[values["advantage"]].inputs == "components":
        rewards = TASK_REWARDS[values["task"]]
        if len(rewards) < 2:
            raise _error("advantage", f"{values['advantage']} normalizes each of several rewards apart; the "
                                      f"{values['task']} task has one (countdown has {len(TASK_REWARDS['countdown'])}:"
                                      f" --policy transformer)")
        changed = [flag for flag, on in (("--kl-in reward", values["kl_in"] == "reward"),
                                         ("--overlong-penalty", values["overlong_penalty"] is not None),
                                         ("--random-reward", values["random_reward"] is not None),
                                         ("--verifier-loophole", values["verifier_loophole"] is not None)) if on]
        if changed:
            raise _error("advantage", f"{values['advantage']} reads the task's rewards one by one, which do not "
                                      f"see {' and '.join(changed)}")
    negative = [flag for flag, on in (("--kl-in reward", values["kl_in"] == "reward" and values["beta"] > 0),
                                      ("--overlong-penalty", values["overlong_penalty"] is not None)) if on]
    if values["algorithm"] in POLICY_LOSSES and ADVANTAGES[values["advantage"]].nonnegative and negative:
        raise _error("advantage", f"{values['advantage']} divides by the group's mean reward and needs rewards >= 0, "
                                  f"which {' and '.join(negative)} can make negative")


def settings_block(cfg):
    """The run's settings that apply to its algorithm and policy, in declaration order (the JSON
    "settings" head); a quiet setting only while it changes something."""
    return {item.name: getattr(cfg, item.name) for item in SETTINGS if cfg.algorithm in APPLIES[item.name]
            and (item.policies is None or cfg.policy in item.policies) and not _silent(item, cfg)}


def _silent(item, cfg):
    if not item.quiet:
        return False
    if item.requires is not None:
        return getattr(cfg, item.requires[0]) not in item.requires[1]
    return getattr(cfg, item.name) == item.default


def default_output(algorithm, options):
    """The folder a run writes when --output is not given: results-online-[transformer-]<algorithm>
    [-<reduction>], then every other option that differs from its default for that policy
    (results-online-grpo-sequence-advantage-rloo), so that only the default run writes the committed
    default folder."""
    policy = options.get("policy", BY_NAME["policy"].default)
    defaults = {item.name: item.default for item in SETTINGS} | POLICY_DEFAULTS[policy]
    defaults |= POLICY_LOSSES[algorithm].defaults if algorithm in POLICY_LOSSES else {}  # a loss's own reduction
    prefix = "results-online" if policy == BY_NAME["policy"].default else f"results-online-{policy}"
    if algorithm == "all":
        name = f"{prefix}-all"
    elif algorithm in GROUP:  # gspo has no reduction of its own: it averages per sequence
        reduction = options.get("reduction", defaults["reduction"])
        name = f"{prefix}-{algorithm}-{reduction if algorithm in APPLIES['reduction'] else 'sequence'}"
    else:
        name = f"{prefix}-{algorithm}"
    for key, value in options.items():
        # a folder name (--sft-folder) is not a setting of the run's numbers: it stays out of the name
        if key not in ("reduction", "algorithm", "policy") and BY_NAME[key].kind != "text" and value != defaults[key]:
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            name += f"-{key.replace('_', '-')}-{shown}"
    if len(name) > MAX_DEFAULT_NAME:  # many options: the start of the name, and a digest of the whole
        name = f"{name[:MAX_DEFAULT_NAME - 13]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return name
