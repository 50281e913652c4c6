"""Online RL on a tiny autoregressive policy: sample, verify, update, token by token. PPO with a critic,
online DPO, GRPO, CISPO, GSPO and SAPO on one task, with the field's switches (RLOO, Dr. GRPO, DAPO,
dual-clip, k1/k2/k3, KL in the loss or the reward, truncation, sampler mismatch and TIS).

    python online_tokens.py                              # GRPO -> results-online-grpo-sequence/online.{csv,json}
    python online_tokens.py --algorithm cispo            # -> results-online-cispo-sequence/ (--loss cispo too)
    python online_tokens.py --algorithm ppo              # PPO + GAE with a critic -> results-online-ppo/
    python online_tokens.py --algorithm all              # PPO, DPO, GRPO, CISPO at one budget -> results-online-all/

The loop of RL with a verifiable reward (RLVR), on a CPU in a fraction of a second. The task: the
prompt is a number n in 0..5 and the correct answer is n in binary ("0", "1", "10", "11", "100",
"101") followed by EOS; a rule-based verifier scores each response. The policy is a table of
next-token logits indexed by (prompt, position, previous token), all zeros at the start. Each
iteration samples B prompts x G responses token by token from a frozen snapshot (the old policy),
scores them and updates the table with the chosen algorithm; online.csv (row 0 = the initial
evaluation, then one row per iteration) and online.json (settings, the TRL and verl options that do
the same, the first batch decoded, the final row) record it.

Shape notation (as in rl_lab.py): B prompts, G group size, N = B*G responses, R completion
positions (max_new_tokens), V vocabulary, P prompts of the task, S = V+1 previous-token states.
"""

from __future__ import annotations

if __name__ == "__main__":  # first: a Ctrl-C while torch loads below ends with one line, not a traceback
    from lab_start import exit_quietly_on_signals

    exit_quietly_on_signals()

import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from lab_checks import check_choice, check_int, check_real, check_tensor, exp_limit, torch_threads  # noqa: E402
from lab_io import (  # noqa: E402
    OneLineErrorParser,
    csv_text,
    float_flag,
    int_flag,
    json_text,
    output_folder_or_exit,
    run_cli,
    write_files,
)
from library_map import library_blocks  # noqa: E402
from rl_lab import (  # noqa: E402
    DEVICE,
    DTYPE,
    KL_ESTIMATORS,
    SEED_LIMIT,
    cdpo_loss,
    cispo_policy_loss,
    clip_fraction,
    clipped_policy_loss,
    completion_mask,
    dpo_hinge_loss,
    dpo_loss,
    gae,
    group_relative_advantages,
    grpo_policy_loss,
    gspo_policy_loss,
    ipo_loss,
    kl_k1,
    overlong_penalty,
    rloo_advantages,
    robust_dpo_loss,
    sapo_policy_loss,
    sequence_log_ratio,
    simpo_loss,
    token_kl_penalty,
    truncated_importance_weights,
)

# ---------------------------------------------------------------------------------------------
# Setup: the task, the verifier, the table policy and the run's settings
# ---------------------------------------------------------------------------------------------
# The policy is indexed by (prompt, position, previous token): the previous token is what an
# autoregressive model conditions on; the position lets the table write "11" and "100", whose
# repeated digits a previous-token-only table could not tell apart.

VOCAB = ("0", "1", "EOS")
EOS = 2
PAD = EOS  # PAD shares the EOS id: only the position (after the first EOS) makes it PAD
BOS_STATE = len(VOCAB)  # the "previous token" of the first position
NUMBERS = tuple(range(6))
ANSWERS = tuple(tuple(int(bit) for bit in format(n, "b")) for n in NUMBERS)
REWARD_CORRECT = 1.0  # the exact answer followed by EOS
REWARD_PARTIAL = 0.25  # the right answer at the start of a response that hit the cap without EOS
MAX_GRAD_NORM = 1.0
GROUP_EPS = 1e-4  # the lesson's eps of group_relative_advantages
WHITEN_EPS = 1e-8  # added to the std when PPO whitens its advantages, as TRL's masked_whiten
# B*G*R token positions per batch: 2**20 take about 0.5 GB of memory and 5 s per iteration on one core
MAX_TOKEN_POSITIONS = 2**20
MIN_TEMPERATURE = 0.01  # below it the tempered logits overflow exp() once the table has learned anything

# names -> atoms: a driver never switches on a loss name inside the maths
GROUP_LOSSES = {"grpo": grpo_policy_loss, "cispo": cispo_policy_loss, "gspo": gspo_policy_loss,
                "sapo": sapo_policy_loss}
DPO_LOSSES = {"sigmoid": dpo_loss, "ipo": ipo_loss, "hinge": dpo_hinge_loss, "cdpo": cdpo_loss,
              "robust": robust_dpo_loss, "simpo": simpo_loss}
ALGORITHMS = ("ppo", "dpo") + tuple(GROUP_LOSSES)
FOUR_ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")  # --algorithm all: the article's three and CISPO
REDUCTIONS = ("sequence", "token", "constant")
ADVANTAGES = ("grpo", "rloo")
SCALES = ("group", "batch", "none")
KL_PLACEMENTS = ("loss", "reward")
TRUNCATIONS = ("bootstrap", "terminal")
CAP_VALUES = ("table", "shared")
SEQUENCE_LOGPS = ("sum", "mean")

DEFAULTS = {
    # every algorithm
    "algorithm": "grpo", "steps": 60, "seed": 7, "prompts": 8, "group_size": 8, "max_new_tokens": 5,
    "temperature": 1.0, "updates_per_batch": 2, "beta": 0.02, "learning_rate": 0.2,
    # the GRPO family (grpo, cispo, gspo, sapo)
    "reduction": "sequence", "epsilon": None, "epsilon_high": None, "dual_clip": None, "tau_pos": 1.0,
    "tau_neg": 1.05, "advantage": "grpo", "scale_rewards": "group", "kl_estimator": "k3", "kl_in": "loss",
    "mask_truncated": False, "overlong_penalty": None, "dynamic_sampling": False, "max_resample_rounds": 8,
    "rollout_temperature": None, "rollout_top_p": None, "tis_cap": None,
    # PPO
    "gamma": 1.0, "gae_lambda": 0.95, "truncation": "bootstrap", "cap_value": "table", "whiten_advantages": True,
    "value_coef": 0.5, "value_clip": None,
    # DPO
    "dpo_loss": "sigmoid", "dpo_beta": None, "label_smoothing": 0.0, "simpo_gamma": 0.5, "sequence_logp": None,
    "offline": False,
}
COMMON = ("algorithm", "steps", "seed", "prompts", "group_size", "max_new_tokens", "temperature",
          "updates_per_batch", "learning_rate")
GROUP_FAMILY = tuple(GROUP_LOSSES)
APPLIES = {  # setting -> the algorithms it applies to; setting one for another algorithm is an error
    **{key: ALGORITHMS for key in COMMON},
    "beta": ("ppo",) + GROUP_FAMILY,
    **{key: GROUP_FAMILY for key in ("advantage", "scale_rewards", "kl_estimator", "kl_in", "mask_truncated",
                                     "overlong_penalty", "dynamic_sampling", "max_resample_rounds",
                                     "rollout_temperature", "rollout_top_p")},
    "reduction": ("grpo", "cispo", "sapo"), "tis_cap": ("grpo", "cispo", "sapo"),
    "epsilon": ("ppo", "grpo", "gspo"), "epsilon_high": ("grpo", "cispo", "gspo"), "dual_clip": ("grpo",),
    "tau_pos": ("sapo",), "tau_neg": ("sapo",),
    **{key: ("ppo",) for key in ("gamma", "gae_lambda", "truncation", "cap_value", "whiten_advantages",
                                 "value_coef", "value_clip")},
    **{key: ("dpo",) for key in ("dpo_loss", "dpo_beta", "label_smoothing", "simpo_gamma", "sequence_logp",
                                 "offline")},
}

COLUMNS = [
    "step", "optimizer_steps", "responses_sampled", "tokens_sampled", "total_tokens_sampled", "reward_mean",
    "success_rate", "partial_rate", "mean_response_length", "mean_correct_length", "mean_wrong_length",
    "truncated_fraction", "zero_group_fraction", "ratio_min", "ratio_max", "clip_fraction",
    "outside_clip_range_fraction", "capped_fraction", "kl_k3", "entropy", "loss",
    # the GRPO family's switches
    "filtered_groups", "extra_responses", "masked_truncated", "importance_weight_mean",
    "importance_weight_capped_fraction",
    # PPO
    "value_loss", "explained_variance", "advantage_first_token", "advantage_last_token",
    # DPO
    "pairs", "tied_prompts", "preference_margin",
    # exact, after the update
    "success_probability", "kl_reference",
]
INTEGER_COLUMNS = ("step", "optimizer_steps", "responses_sampled", "tokens_sampled", "total_tokens_sampled",
                   "filtered_groups", "extra_responses", "masked_truncated", "pairs", "tied_prompts")


def policy_logits(table, prompts, positions, previous, temperature):
    """(..., V) tempered next-token logits of the table policy: table[prompt, position, previous] / T.

    table (P, R, S, V); prompts, positions and previous broadcast to the same shape (...).
    Sampling and scoring both call this, so old and current log-probs use the same tempered logits.
    """
    return table[prompts, positions, previous] / temperature


def previous_tokens(completion_ids):
    """(N, R) the token before each completion position; position 0's is the BOS state."""
    bos = torch.full((completion_ids.shape[0], 1), BOS_STATE, dtype=torch.long, device=DEVICE)
    return torch.cat([bos, completion_ids[:, :-1]], dim=1)


def completion_logits(table, prompts, completion_ids, temperature):
    """(N, R, V) tempered logits at every completion position, given the tokens before it (teacher forcing).

    prompts (N,) int64; completion_ids (N, R) int64.
    """
    count, length = completion_ids.shape
    positions = torch.arange(length, device=DEVICE).expand(count, length)  # (R,) -> (N, R)
    return policy_logits(table, prompts.unsqueeze(1), positions, previous_tokens(completion_ids), temperature)


def token_logps(table, prompts, completion_ids, temperature):
    """(N, R) log-prob of every completion token under `table` (PAD positions included; masks drop them)."""
    return logps_of_tokens(completion_logits(table, prompts, completion_ids, temperature), completion_ids)


def logps_of_tokens(logits, completion_ids):
    """(N, R) log-prob of each token in completion_ids under (N, R, V) logits."""
    logp = torch.log_softmax(logits, dim=-1)  # (N, R, V)
    return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (N, R, 1) -> (N, R)


def verify(number, tokens, truncated):
    """The rule-based reward of one response: 1 for the exact binary answer then EOS, REWARD_PARTIAL
    for a truncated response (no EOS) that starts with the right answer, 0 otherwise.

    number: the prompt's int in 0..5; tokens: the response's real token ids (a list or tuple of ints in
    0..2, the EOS included if any); truncated: bool, True when the response hit the length cap (then
    it holds no EOS). Raises ValueError naming the argument for anything else.
    """
    number = check_int("number", number, low=0, high=len(ANSWERS) - 1)
    if not isinstance(tokens, (list, tuple)) or not all(
        isinstance(token, int) and not isinstance(token, bool) and 0 <= token < len(VOCAB) for token in tokens
    ):
        raise ValueError(f"tokens: expected a list of token ids in [0, {len(VOCAB)}), got {tokens!r}")
    if not isinstance(truncated, bool):
        raise ValueError(f"truncated: expected a bool, got {type(truncated).__name__}")
    tokens = list(tokens)
    if truncated and EOS in tokens:
        raise ValueError("truncated: a response that holds an EOS stopped; it cannot be truncated")
    return _score(number, tokens, truncated)


def _score(number, tokens, truncated):
    """`verify` without the argument checks, for the rollout's own lists."""
    answer = list(ANSWERS[number])
    if not truncated and tokens == answer + [EOS]:
        return REWARD_CORRECT
    if truncated and tokens[: len(answer)] == answer:
        return REWARD_PARTIAL
    return 0.0


def answer_table():
    """(P, R=4) the correct completions (answer, EOS, then PAD) and their (P, R) bool real mask."""
    length = max(len(answer) for answer in ANSWERS) + 1
    ids = torch.full((len(ANSWERS), length), PAD, dtype=torch.long, device=DEVICE)
    real = torch.zeros(len(ANSWERS), length, dtype=torch.bool, device=DEVICE)
    for number, answer in enumerate(ANSWERS):
        ids[number, : len(answer) + 1] = torch.tensor(list(answer) + [EOS])
        real[number, : len(answer) + 1] = True
    return ids, real


def success_probability(table, temperature):
    """Exact mean over prompts of p(correct answer then EOS): the product of its token probabilities.

    table: (P=6, R, S=4, V=3) float logits of the policy; temperature in [0.01, 10].
    Raises ValueError naming the argument for a bad table or temperature.
    """
    _check_table(table)
    check_real("temperature", temperature, low=MIN_TEMPERATURE, high=10.0)
    return _success_probability(table.detach(), temperature)


def _success_probability(table, temperature):
    ids, real = _ANSWERS_TABLE
    if ids.shape[1] > table.shape[1]:  # the cap is shorter than the longest answer + EOS
        ids, real = ids[:, : table.shape[1]], real[:, : table.shape[1]]
        reachable = torch.tensor([len(answer) + 1 <= table.shape[1] for answer in ANSWERS])
    else:
        reachable = torch.ones(len(ANSWERS), dtype=torch.bool)
    with torch.no_grad():
        logps = token_logps(table[:, : ids.shape[1]], torch.arange(ids.shape[0]), ids, temperature)
        path = torch.where(real, logps, torch.zeros_like(logps)).sum(dim=1).exp()  # (P,)
        return torch.where(reachable, path, torch.zeros_like(path)).mean().item()


_ANSWERS_TABLE = answer_table()  # built once; read-only


def response_kl(table, reference, temperature):
    """Exact KL(policy || reference) between the two distributions over whole responses, in nats,
    averaged over the prompts: by the chain rule, the sum over positions of each state's categorical
    KL weighted by the probability that the policy reaches that state (no sampling).

    table, reference: (P, R, S, V) logits; the same temperature tempers both, as in training.
    """
    with torch.no_grad():
        logp = torch.log_softmax(table / temperature, dim=-1)  # (P, R, S, V)
        ref_logp = torch.log_softmax(reference / temperature, dim=-1)
        kl_state = (logp.exp() * (logp - ref_logp)).sum(dim=-1)  # (P, R, S)
        reach = torch.zeros(table.shape[0], table.shape[2], dtype=table.dtype)  # (P, S): p(state at position t)
        reach[:, BOS_STATE] = 1.0
        total = torch.zeros(table.shape[0], dtype=table.dtype)
        for position in range(table.shape[1]):
            total = total + (reach * kl_state[:, position]).sum(dim=1)
            flow = (reach.unsqueeze(-1) * logp[:, position].exp()).sum(dim=1)  # (P, V): p(next token)
            reach = torch.zeros_like(reach)
            reach[:, : len(VOCAB)] = flow
            reach[:, EOS] = 0.0  # an EOS ends the response: nothing follows it
        return total.mean().item()


def _check_table(table):
    check_tensor("table", table, ndim=4)
    prompts, _, states, vocab = table.shape
    if (prompts, states, vocab) != (len(NUMBERS), len(VOCAB) + 1, len(VOCAB)):
        raise ValueError(
            f"table: expected shape ({len(NUMBERS)}, R, {len(VOCAB) + 1}, {len(VOCAB)}), got {tuple(table.shape)}"
        )


def _check_state(state):
    keys = ("config", "generator", "table", "reference", "optimizer")
    if not isinstance(state, dict) or any(key not in state for key in keys):
        raise ValueError("state: expected the dict returned by online_tokens.setup()")


_BATCH_KEYS = ("prompts", "completion_ids", "real", "truncated", "rewards", "scores", "mask", "old_logps",
               "ref_logps", "old_logits")


def _check_batch(batch, state):
    if not isinstance(batch, dict) or any(key not in batch for key in _BATCH_KEYS):
        raise ValueError("batch: expected the dict returned by online_tokens.rollout()")
    count = state["config"]["prompts"] * state["config"]["group_size"]
    shape = (count, state["config"]["max_new_tokens"])
    if tuple(batch["completion_ids"].shape) != shape:
        raise ValueError(f"batch: expected {count} responses of {shape[1]} positions, from this state's rollout")


def config(**options):
    """DEFAULTS with `options`, validated and resolved; raises ValueError naming the bad key.

    `loss` is accepted for `algorithm` (the first release's name for grpo and cispo). Options that do
    not apply to the algorithm are errors (APPLIES); None defaults resolve per algorithm: epsilon 0.2
    (gspo 3e-4), epsilon_high none for grpo (a symmetric range), 5.0 for cispo (an absolute cap), 4e-4
    for gspo; dpo_beta 0.5 (ipo and hinge 0.1, simpo 2.0); sequence_logp sum (simpo mean).
    """
    options = dict(options)
    if "loss" in options:
        loss = options.pop("loss")
        if not isinstance(loss, str) or loss not in GROUP_LOSSES:
            raise ValueError(f"loss: expected one of {', '.join(GROUP_LOSSES)}, got {loss!r}")
        if options.setdefault("algorithm", loss) != loss:
            raise ValueError(f"loss: {loss!r} names another algorithm than algorithm={options['algorithm']!r}")
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a setting of the online run (expected one of {', '.join(DEFAULTS)})")
    algorithm = check_choice("algorithm", options.get("algorithm", DEFAULTS["algorithm"]), ALGORITHMS)
    for key in options:
        if algorithm not in APPLIES[key]:
            raise ValueError(f"{key}: does not apply to {algorithm} (only to {', '.join(APPLIES[key])})")
    s = {**DEFAULTS, **options}
    for name, low, high in (("steps", 1, 100_000), ("seed", 0, SEED_LIMIT - 1), ("prompts", 1, 4096),
                            ("group_size", 2, 1024), ("max_new_tokens", 1, 64), ("updates_per_batch", 1, 64),
                            ("max_resample_rounds", 1, 64)):
        check_int(name, s[name], low=low, high=high)
    positions = s["prompts"] * s["group_size"] * s["max_new_tokens"]
    if positions > MAX_TOKEN_POSITIONS:
        raise ValueError(f"prompts: prompts * group_size * max_new_tokens = {positions} token positions per batch, "
                         f"more than {MAX_TOKEN_POSITIONS}")
    check_real("temperature", s["temperature"], low=MIN_TEMPERATURE, high=10.0)
    check_real("beta", s["beta"], low=0.0, high=10.0)
    check_real("learning_rate", s["learning_rate"], low=0.0, high=10.0, low_open=True)
    for name, choices in (("reduction", REDUCTIONS), ("advantage", ADVANTAGES), ("scale_rewards", SCALES),
                          ("kl_estimator", tuple(KL_ESTIMATORS)), ("kl_in", KL_PLACEMENTS),
                          ("truncation", TRUNCATIONS), ("cap_value", CAP_VALUES), ("dpo_loss", tuple(DPO_LOSSES))):
        check_choice(name, s[name], choices)
    for name in ("mask_truncated", "dynamic_sampling", "whiten_advantages", "offline"):
        if not isinstance(s[name], bool):
            raise ValueError(f"{name}: expected True or False, got {s[name]!r}")
    if s["advantage"] == "rloo" and "scale_rewards" in options and s["scale_rewards"] != "group":
        raise ValueError("scale_rewards: RLOO divides by no std; it applies to advantage='grpo' only")
    # an option that another option switches off would change nothing: an error, not a silent no-op
    for key, needs, holds in (("label_smoothing", "dpo_loss", ("cdpo", "robust")), ("simpo_gamma", "dpo_loss", ("simpo",)),
                              ("max_resample_rounds", "dynamic_sampling", (True,)),
                              ("cap_value", "truncation", ("bootstrap",))):
        if key in options and s[needs] not in holds:
            raise ValueError(f"{key}: applies only with {needs} {' or '.join(map(str, holds))}, got {s[needs]}")
    # per-algorithm defaults
    if s["epsilon"] is None:
        s["epsilon"] = 3e-4 if algorithm == "gspo" else 0.2
    if s["epsilon_high"] is None:
        s["epsilon_high"] = {"cispo": 5.0, "gspo": 4e-4}.get(algorithm)
    if s["dpo_beta"] is None:  # ipo's beta sets its target margin 1/(2 beta), the hinge's 1/beta: TRL's 0.1
        s["dpo_beta"] = {"simpo": 2.0, "ipo": 0.1, "hinge": 0.1}.get(s["dpo_loss"], 0.5)
    if s["sequence_logp"] is None:
        s["sequence_logp"] = "mean" if s["dpo_loss"] == "simpo" else "sum"
    check_choice("sequence_logp", s["sequence_logp"], SEQUENCE_LOGPS)
    check_real("epsilon", s["epsilon"], low=0.0, high=1.0, high_open=True)
    if s["epsilon_high"] is not None:
        high = 100.0 if algorithm == "cispo" else 10.0
        check_real("epsilon_high", s["epsilon_high"], low=0.0, high=high, low_open=algorithm == "cispo")
    if s["dual_clip"] is not None:
        check_real("dual_clip", s["dual_clip"], low=1.0, high=1e6, low_open=True)
    for name in ("tau_pos", "tau_neg"):
        check_real(name, s[name], low=0.0, high=100.0, low_open=True)
    check_real("dpo_beta", s["dpo_beta"], low=1e-6, high=100.0)
    check_real("label_smoothing", s["label_smoothing"], low=0.0, high=0.5, high_open=True)
    check_real("simpo_gamma", s["simpo_gamma"], low=0.0, high=100.0)
    check_real("gamma", s["gamma"], low=0.0, high=1.0)
    check_real("gae_lambda", s["gae_lambda"], low=0.0, high=1.0)
    check_real("value_coef", s["value_coef"], low=0.0, high=100.0)
    if s["value_clip"] is not None:
        check_real("value_clip", s["value_clip"], low=0.0, high=100.0, low_open=True)
    if s["overlong_penalty"] is not None:
        check_int("overlong_penalty", s["overlong_penalty"], low=1, high=s["max_new_tokens"])
    if s["rollout_temperature"] is not None:
        check_real("rollout_temperature", s["rollout_temperature"], low=MIN_TEMPERATURE, high=10.0)
    if s["rollout_top_p"] is not None:
        check_real("rollout_top_p", s["rollout_top_p"], low=0.0, high=1.0, low_open=True)
    if s["tis_cap"] is not None:
        check_real("tis_cap", s["tis_cap"], low=1.0, high=1e6)
    if s["reduction"] == "sequence" and algorithm == "cispo" and "reduction" not in options:
        pass  # the lesson's CISPO averages per sequence too (the first release's default)
    return s


def settings_of(run_config):
    """The JSON settings: the options that apply to the run's algorithm, then the task and the versions."""
    algorithm = run_config["algorithm"]
    settings = {key: value for key, value in run_config.items() if algorithm in APPLIES[key]}
    settings.update({
        "task": "write the prompt's number in binary, then EOS",
        "vocabulary": list(VOCAB),
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "prompts_and_answers": {str(n): format(n, "b") for n in NUMBERS},
        "reward_correct": REWARD_CORRECT,
        "reward_partial_truncated": REWARD_PARTIAL,
        "policy": "table of logits (prompt, position, previous token) -> next token, zeros at start (uniform)",
        "reference": "the initial policy, frozen",
        "old_policy": "a frozen snapshot taken before each batch is sampled",
        "optimizer": "Adam",
        "max_grad_norm": MAX_GRAD_NORM,
        "dtype": str(DTYPE).replace("torch.", ""),
        "device": str(DEVICE),
        "torch": torch.__version__,
    })
    if algorithm in GROUP_FAMILY:
        settings["group_advantage_eps"] = GROUP_EPS
        settings["kl"] = (f"{run_config['kl_estimator']} per token, beta times it in the loss"
                          if run_config["kl_in"] == "loss" else
                          f"beta times the response's summed {run_config['kl_estimator']} subtracted from its reward")
        settings["truncated_responses"] = ("dropped from the loss" if run_config["mask_truncated"] else
                                           "kept in the loss: every real token counts (no EOS to score)")
    elif algorithm == "ppo":
        settings["critic"] = "table of values (prompt, position, previous token), zeros at start, same Adam step"
        settings["kl"] = "per-token reward -beta * k1 against the reference, plus the verifier's reward on the last token"
        settings["state_after_the_cap"] = (
            "its own row of the critic table, which no response ever acts in: it keeps its initial 0"
            if run_config["cap_value"] == "table" else
            "the critic's last-position entry for the same prompt and previous token (a critic that shares "
            "across positions)")
        settings["whiten_eps"] = WHITEN_EPS
    else:
        settings["pairs"] = ("per prompt, the highest-reward response (chosen) against the lowest (rejected); "
                             "prompts whose rewards all tie give no pair")
        settings["data"] = ("sampled from the frozen initial policy, B x G per iteration" if run_config["offline"]
                            else "sampled from the current policy each iteration")
    return settings


def setup(**options):
    """Everything a run holds: config, generator, policy table, frozen reference, critic (PPO),
    optimizer, counters. The table (P, R, S, V) starts at zeros (a uniform policy); the reference is a
    frozen copy. Raises ValueError naming a bad setting."""
    run_config = config(**options)
    shape = (len(NUMBERS), run_config["max_new_tokens"], len(VOCAB) + 1, len(VOCAB))
    table = torch.zeros(shape, dtype=DTYPE, device=DEVICE, requires_grad=True)
    params = [table]
    critic = None
    if run_config["algorithm"] == "ppo":
        # (P, R+1, S): V(prompt, position, previous token); row R is the state after the cap
        critic_shape = (shape[0], shape[1] + 1, shape[2])
        critic = torch.zeros(critic_shape, dtype=DTYPE, device=DEVICE, requires_grad=True)
        params.append(critic)
    return {
        "config": run_config,
        "generator": torch.Generator(device=DEVICE).manual_seed(run_config["seed"]),  # the one seeding point
        "table": table,
        "critic": critic,
        "reference": torch.zeros(shape, dtype=DTYPE, device=DEVICE),
        "optimizer": torch.optim.Adam(params, lr=run_config["learning_rate"]),
        "optimizer_steps": 0,
        "total_tokens": 0,
    }


# ---------------------------------------------------------------------------------------------
# Rollout: sample responses token by token, score them, cache what the update needs
# ---------------------------------------------------------------------------------------------


def nucleus(probs, top_p):
    """(N, V) probabilities restricted to the smallest set of most likely tokens whose mass reaches
    top_p (the token that crosses it included), renormalized: top-p sampling."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above each one
    keep_sorted = before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(dim=-1, keepdim=True)


def sample_completions(table, prompts, max_new_tokens, temperature, generator, top_p=None, with_logps=False):
    """Sample one completion per prompt token by token from `table` (the frozen sampling policy).

    Returns (completion_ids (N, R) int64 with PAD after the first EOS, real (N, R) bool True up to and
    including the EOS, truncated (N,) bool: the response hit max_new_tokens without an EOS, and, with
    with_logps, sampler_logps (N, R): the log-prob the sampler gave each sampled token, else None).
    """
    count = prompts.shape[0]
    completion_ids = torch.full((count, max_new_tokens), PAD, dtype=torch.long, device=DEVICE)
    real = torch.zeros(count, max_new_tokens, dtype=torch.bool, device=DEVICE)
    sampler_logps = torch.zeros(count, max_new_tokens, dtype=table.dtype) if with_logps else None
    previous = torch.full((count,), BOS_STATE, dtype=torch.long, device=DEVICE)
    finished = torch.zeros(count, dtype=torch.bool, device=DEVICE)
    with torch.no_grad():
        for position in range(max_new_tokens):
            positions = torch.full((count,), position, dtype=torch.long, device=DEVICE)
            probs = torch.softmax(policy_logits(table, prompts, positions, previous, temperature), dim=-1)  # (N, V)
            if top_p is not None:
                probs = nucleus(probs, top_p)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N, 1) -> (N,)
            if with_logps:
                sampler_logps[:, position] = probs.gather(1, tokens.unsqueeze(1)).squeeze(1).log()
            tokens = torch.where(finished, torch.full_like(tokens, PAD), tokens)  # PAD after the EOS
            real[:, position] = ~finished
            completion_ids[:, position] = tokens
            finished = finished | (tokens == EOS)
            previous = tokens
    return completion_ids, real, ~finished, sampler_logps


def _sample_groups(state, sampler, prompt_count):
    """`prompt_count` prompts x G responses from the frozen `sampler` table, verified: a dict of tensors."""
    run_config = state["config"]
    group_size = run_config["group_size"]
    numbers = torch.randint(0, len(NUMBERS), (prompt_count,), generator=state["generator"])  # (B,)
    prompts = numbers.repeat_interleave(group_size)  # (B,) -> (B*G,), prompt-major
    mismatch = run_config["algorithm"] in GROUP_FAMILY and (
        run_config["rollout_temperature"] is not None or run_config["rollout_top_p"] is not None)
    sampling_temperature = run_config["rollout_temperature"] or run_config["temperature"]
    completion_ids, real, truncated, sampler_logps = sample_completions(
        sampler, prompts, run_config["max_new_tokens"], sampling_temperature, state["generator"],
        run_config["rollout_top_p"] if mismatch else None, with_logps=mismatch,
    )
    rewards = torch.tensor(
        [_score(number, [token for token, keep in zip(ids, row_real) if keep], cut)
         for number, ids, row_real, cut in zip(prompts.tolist(), completion_ids.tolist(), real.tolist(),
                                               truncated.tolist())],
        dtype=DTYPE, device=DEVICE,
    )  # (B*G,): the verifier's score of each response's real tokens
    return {"prompts": prompts, "completion_ids": completion_ids, "real": real, "truncated": truncated,
            "rewards": rewards, "sampler_logps": sampler_logps}


def _concat(parts):
    return {key: None if parts[0][key] is None else torch.cat([part[key] for part in parts]) for key in parts[0]}


def _group_varies(rewards, group_size):
    """(B,) bool: the group's rewards are not all equal."""
    grouped = rewards.reshape(-1, group_size)  # (B*G,) -> (B, G)
    return ~(grouped == grouped[:, :1]).all(dim=1)


def rollout(state):
    """Sample B prompts x G responses from a frozen snapshot (the current policy, or the initial one for
    offline DPO), score them and cache what the update needs.

    With dynamic sampling (DAPO, arXiv 2503.14476, sec. 3.2, eq. 11), groups whose rewards all tie are
    dropped and new batches of B prompts are drawn, up to max_resample_rounds more, until B groups vary
    (if they never do, the batch is filled with the last tied groups, which teach nothing); every
    response drawn counts in the budget. Returns a dict: prompts (B*G,) prompt-major, completion_ids /
    real (B*G, R), truncated (B*G,), rewards (B*G,) the verifier's, scores (B*G,) the reward the
    advantages use (with the overlong penalty and the KL in the reward when chosen), mask (B*G, R)
    int64, old_logps / ref_logps (B*G, R), old_logits (B*G, R, V), importance_weights (B*G, R) or None,
    and the counts responses_sampled, tokens_sampled, filtered_groups; all without grad.
    """
    _check_state(state)
    run_config = state["config"]
    temperature, group_size, batch_prompts = run_config["temperature"], run_config["group_size"], run_config["prompts"]
    offline = run_config["algorithm"] == "dpo" and run_config["offline"]
    old = (state["reference"] if offline else state["table"]).detach().clone()
    parts = [_sample_groups(state, old, batch_prompts)]
    responses_sampled = batch_prompts * group_size
    tokens_sampled = int(parts[0]["real"].sum().item())
    filtered_groups = 0
    if run_config["algorithm"] in GROUP_FAMILY and run_config["dynamic_sampling"]:
        kept, spare = [], []
        for round_index in range(run_config["max_resample_rounds"] + 1):
            if round_index > 0:
                parts.append(_sample_groups(state, old, batch_prompts))
                responses_sampled += batch_prompts * group_size
                tokens_sampled += int(parts[-1]["real"].sum().item())
            varies = _group_varies(parts[-1]["rewards"], group_size).tolist()
            filtered_groups += varies.count(False)
            kept += [(len(parts) - 1, group) for group, ok in enumerate(varies) if ok]
            spare += [(len(parts) - 1, group) for group, ok in enumerate(varies) if not ok]
            if len(kept) >= batch_prompts:
                break
        chosen = (kept + spare[::-1])[:batch_prompts]  # the groups that vary first, in the order drawn
        rows = torch.cat([torch.arange(group * group_size, (group + 1) * group_size) + sum(
            part["prompts"].shape[0] for part in parts[:part_index]) for part_index, group in chosen])
        batch = {key: None if value is None else value[rows] for key, value in _concat(parts).items()}
    else:
        batch = parts[0]
    completion_ids, real, prompts = batch["completion_ids"], batch["real"], batch["prompts"]
    mask = completion_mask(completion_ids, EOS, real, check=False)  # (B*G, R): tokens up to the first EOS
    with torch.no_grad():
        # cached once, from the same tempered logits the update uses: the ratio is exactly 1 at first
        old_logits = completion_logits(old, prompts, completion_ids, temperature)  # (B*G, R, V)
        old_logps = logps_of_tokens(old_logits, completion_ids)  # the same ops as token_logps(old, ...)
        ref_logps = token_logps(state["reference"], prompts, completion_ids, temperature)
    batch.update({"mask": mask, "old_logps": old_logps, "ref_logps": ref_logps, "old_logits": old_logits,
                  "responses_sampled": responses_sampled, "tokens_sampled": tokens_sampled,
                  "filtered_groups": filtered_groups})
    batch["scores"] = _scores(run_config, batch)
    batch["importance_weights"] = None
    if batch["sampler_logps"] is not None and run_config["tis_cap"] is not None:
        weights = truncated_importance_weights(old_logps, batch["sampler_logps"], run_config["tis_cap"], check=False)
        batch["importance_weights"] = torch.where(mask.bool(), weights, torch.zeros_like(weights))
    return batch


def _scores(run_config, batch):
    """(B*G,) the reward the advantages use: the verifier's, plus DAPO's overlong penalty, minus beta
    times the response's summed KL estimate when the KL goes into the reward (TRL's RLOO, verl's
    use_kl_in_reward). PPO and DPO use the verifier's reward itself here."""
    scores = batch["rewards"]
    if run_config["algorithm"] not in GROUP_FAMILY:
        return scores
    lengths = batch["mask"].sum(dim=1)  # (B*G,) kept tokens, the EOS included
    if run_config["overlong_penalty"] is not None:
        scores = scores + overlong_penalty(lengths, run_config["max_new_tokens"], run_config["overlong_penalty"],
                                           check=False)
    if run_config["kl_in"] == "reward" and run_config["beta"] > 0:
        estimator = KL_ESTIMATORS[run_config["kl_estimator"]]
        per_token = estimator(batch["old_logps"], batch["ref_logps"], check=False)  # of the sampled tokens
        kept = torch.where(batch["mask"].bool(), per_token, torch.zeros_like(per_token))
        scores = scores - run_config["beta"] * kept.sum(dim=1)
    return scores


# ---------------------------------------------------------------------------------------------
# Advantages: relative to the group (GRPO family), per token through a critic (PPO), or pairs (DPO)
# ---------------------------------------------------------------------------------------------


def group_advantages_of(run_config, scores):
    """(B*G,) advantages of the GRPO family from the scores: group-relative with the chosen std
    (group, batch or none: Dr. GRPO), or RLOO's leave-one-out baseline."""
    if run_config["advantage"] == "rloo":
        return rloo_advantages(scores.reshape(-1, run_config["group_size"]), check=False).reshape(-1)
    return group_relative_advantages(scores, run_config["group_size"], eps=GROUP_EPS,
                                     scale=run_config["scale_rewards"], check=False)


def critic_values(critic, prompts, completion_ids, cap_value="table"):
    """(N, R) V(s_t) of every completion position and (N,) V of the state after the cap.

    The state after the cap, (prompt, R, last token), is the one a time-limited response stopped in.
    cap_value "table": its own row of the (P, R+1, S) critic; no response ever acts there, so it keeps
    its initial 0. "shared": the last position's entry for the same prompt and previous token, what a
    critic that shares its estimate across positions (as a language model's value head does) gives.
    """
    count, length = completion_ids.shape
    positions = torch.arange(length, device=DEVICE).expand(count, length)  # (R,) -> (N, R)
    values = critic[prompts.unsqueeze(1), positions, previous_tokens(completion_ids)]  # (N, R)
    cap_position = length if cap_value == "table" else length - 1
    after_cap = critic[prompts, cap_position, completion_ids[:, -1]]  # (N,)
    return values, after_cap


def ppo_advantages(run_config, critic, batch):
    """Per-token rewards, GAE per response and the critic's targets (InstructGPT's recipe).

    Rewards: -beta * k1(old, ref) on every kept token (the KL folded into the reward), plus the
    verifier's reward on the last kept token. A response that ends with EOS is terminated; one that
    hit max_new_tokens without EOS is a time limit: terminated=False, boundary=True, bootstrapped from
    V(state after the cap) (--truncation terminal treats it as terminal instead, as TRL and verl do).
    The kept tokens are laid out response-major, one response after another, in one stream for
    `gae`, whose boundary flags stop each trace at its response's last token (PAD is never touched).
    Returns (advantages, returns, old values, token rewards, next values), each (N, R), zeros off the
    mask, no grad.
    """
    mask = batch["mask"].bool()
    with torch.no_grad():
        values, after_cap = critic_values(critic.detach(), batch["prompts"], batch["completion_ids"],
                                          run_config["cap_value"])
        token_rewards = -run_config["beta"] * kl_k1(batch["old_logps"], batch["ref_logps"], check=False)  # (N, R)
    lengths = mask.sum(dim=1)  # (N,)
    last = lengths - 1
    rows = torch.arange(mask.shape[0])
    token_rewards = torch.where(mask, token_rewards, torch.zeros_like(token_rewards)) + 0.0  # + 0.0: no -0.0
    token_rewards[rows, last] += batch["rewards"]
    next_values = torch.zeros_like(values)
    next_values[:, :-1] = values[:, 1:]  # V(s_{t+1}) inside the response
    bootstrap = batch["truncated"] & (run_config["truncation"] == "bootstrap")
    next_values[rows, last] = torch.where(bootstrap, after_cap, torch.zeros_like(after_cap))
    terminated = torch.zeros_like(mask)
    boundary = torch.zeros_like(mask)
    terminated[rows, last] = ~bootstrap  # EOS, or the cap taken as terminal
    boundary[rows, last] = True
    advantages, returns = gae(  # (kept,) each: the stream of kept tokens, response-major
        token_rewards[mask], values[mask], next_values[mask], terminated[mask], boundary[mask],
        gamma=run_config["gamma"], lam=run_config["gae_lambda"], check=False,
    )
    full_advantages = torch.zeros_like(values)
    full_returns = torch.zeros_like(values)
    full_advantages[mask] = advantages
    full_returns[mask] = returns
    return full_advantages, full_returns, values, token_rewards, next_values


def preference_pairs(run_config, batch):
    """Per prompt group, the response with the highest verifier reward (chosen) and the lowest (rejected);
    the first in sampling order among equals. Groups whose rewards all tie give no pair.
    Returns (chosen rows (K,), rejected rows (K,), tied prompt count)."""
    grouped = batch["rewards"].reshape(-1, run_config["group_size"])  # (B, G)
    offsets = torch.arange(grouped.shape[0]) * run_config["group_size"]
    varies = ~(grouped == grouped[:, :1]).all(dim=1)
    chosen = (grouped.argmax(dim=1) + offsets)[varies]
    rejected = (grouped.argmin(dim=1) + offsets)[varies]
    return chosen, rejected, int((~varies).sum().item())


def compute_advantages(state, batch):
    """Add what the algorithm's update needs to the batch: `advantages` (GRPO family: (B*G,); PPO:
    (B*G, R) per token, whitened over the kept tokens unless switched off, with `returns`,
    `old_values` and the raw `token_advantages`), or `chosen` / `rejected` rows and `tied_prompts` (DPO)."""
    run_config = state["config"]
    algorithm = run_config["algorithm"]
    if algorithm in GROUP_FAMILY:
        batch["advantages"] = group_advantages_of(run_config, batch["scores"])
    elif algorithm == "ppo":
        advantages, returns, values, token_rewards, next_values = ppo_advantages(run_config, state["critic"], batch)
        batch.update({"token_advantages": advantages, "returns": returns, "old_values": values,
                      "token_rewards": token_rewards, "next_values": next_values})
        if run_config["whiten_advantages"]:
            kept = batch["mask"].bool()
            mean, std = advantages[kept].mean(), advantages[kept].std(correction=0)
            advantages = torch.where(kept, (advantages - mean) / (std + WHITEN_EPS), torch.zeros_like(advantages))
        batch["advantages"] = advantages
    else:
        batch["chosen"], batch["rejected"], batch["tied_prompts"] = preference_pairs(run_config, batch)
    return batch


# ---------------------------------------------------------------------------------------------
# Update: a few Adam steps on the algorithm's loss of one batch
# ---------------------------------------------------------------------------------------------


class TrainingDiverged(FloatingPointError):
    """The policy moved so far within one batch that a ratio or the k3 term overflows exp()."""


def _check_exponents(logps, batch, kept):
    """Raise TrainingDiverged before exp() of a log-ratio (ratio) or of ref - logp (k3) overflows."""
    limit = exp_limit(logps.dtype)  # about 708.8 nats in float64: the atoms' own limit
    if not bool(kept.any()):
        return
    largest = max((logps - batch["old_logps"])[kept].max().item(), (batch["ref_logps"] - logps)[kept].max().item())
    if largest > limit:
        raise TrainingDiverged(
            f"a log-ratio of {largest:.0f} nats overflows exp(): the policy moved too far within one batch "
            "(lower --lr or --updates-per-batch, or raise --temperature)"
        )


def _optimizer_step(state, loss):
    params = [state["table"]] + ([state["critic"]] if state["critic"] is not None else [])
    for param in params:  # what optimizer.zero_grad() does by default, without its per-call overhead
        param.grad = None
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)  # one norm over the actor and the critic
    state["optimizer"].step()
    state["optimizer_steps"] += 1


def _current_logps(state, batch):
    return token_logps(state["table"], batch["prompts"], batch["completion_ids"], state["config"]["temperature"])


def _ratio_diagnostics(ratio, advantages, run_config, first_pass):
    """clip_fraction (the share whose gradient the loss zeroes), the naive share outside the clip range
    and CISPO's capped share, for the ratios one pass saw. The first pass sees ratio 1 exactly."""
    algorithm = run_config["algorithm"]
    if first_pass or algorithm in ("sapo", "dpo"):  # SAPO has no hard clip: its gate only fades the gradient
        zeroed = 0.0
    elif algorithm == "cispo":
        zeroed = 0.0  # CISPO caps the weight and keeps the gradient
    else:
        zeroed = clip_fraction(ratio, advantages, run_config["epsilon"], run_config["epsilon_high"],
                               run_config["dual_clip"], check=False).item()
    epsilon = run_config["epsilon"]
    cap = run_config["epsilon_high"] if algorithm == "cispo" else None
    return {
        "clip_fraction": zeroed,
        # the naive count, against eps (0.2 as a yardstick for CISPO and SAPO, which do not clip)
        "outside_clip_range_fraction": ((ratio - 1.0).abs() > epsilon).double().mean().item(),
        "capped_fraction": (ratio > cap).double().mean().item() if cap is not None else 0.0,
    }


def update_group(state, batch):
    """updates_per_batch Adam steps on the GRPO-family loss; ratios and clip shares are those each
    pass's loss saw (before its step): per kept token, or per sequence for GSPO."""
    run_config = state["config"]
    algorithm = run_config["algorithm"]
    mask = batch["mask"]
    if run_config["mask_truncated"]:  # DAPO-style: a cut response has no verdict to learn from
        mask = mask * (~batch["truncated"]).unsqueeze(1).long()
    kept = mask.bool()
    kwargs = {"beta": 0.0 if run_config["kl_in"] == "reward" else run_config["beta"],
              "kl_estimator": KL_ESTIMATORS[run_config["kl_estimator"]], "check": False}
    if algorithm == "grpo":
        kwargs.update(epsilon=run_config["epsilon"], epsilon_high=run_config["epsilon_high"],
                      dual_clip=run_config["dual_clip"])
    elif algorithm == "cispo":
        kwargs["epsilon_high"] = run_config["epsilon_high"]
    elif algorithm == "gspo":
        kwargs.update(epsilon=run_config["epsilon"], epsilon_high=run_config["epsilon_high"])
    else:
        kwargs.update(tau_pos=run_config["tau_pos"], tau_neg=run_config["tau_neg"])
    if algorithm != "gspo":
        kwargs.update(reduction=run_config["reduction"], max_new_tokens=run_config["max_new_tokens"])
        if batch["importance_weights"] is not None:
            kwargs["importance_weights"] = batch["importance_weights"]
    loss_fn = GROUP_LOSSES[algorithm]
    if not bool(kept.any()):  # every response masked out (all truncated, --mask-truncated): nothing to learn
        return {"loss": 0.0, "ratio_min": 0.0, "ratio_max": 0.0}
    signs = batch["advantages"].unsqueeze(1).expand_as(kept)[kept]  # (B*G,) -> (B*G, R) -> (kept,)
    losses, ratios, diagnostics = [], [], []
    for epoch in range(run_config["updates_per_batch"]):
        logps = _current_logps(state, batch)
        _check_exponents(logps.detach(), batch, kept)
        loss = loss_fn(logps, batch["old_logps"], batch["ref_logps"], batch["advantages"], mask, **kwargs)
        with torch.no_grad():
            if algorithm == "gspo":
                ratio = sequence_log_ratio(logps.detach(), batch["old_logps"], mask).exp()  # (B*G,): one per sequence
                diagnostics.append(_ratio_diagnostics(ratio, batch["advantages"], run_config, epoch == 0))
            else:
                ratio = (logps.detach() - batch["old_logps"]).exp()[kept]  # (kept,): the ratios this pass's loss saw
                diagnostics.append(_ratio_diagnostics(ratio, signs, run_config, epoch == 0))
        _optimizer_step(state, loss)
        losses.append(loss.item())
        ratios.append(ratio)
    return _pass_summary(losses, ratios, diagnostics)


def update_ppo(state, batch):
    """updates_per_batch Adam steps on PPO-Clip per token (mean over kept tokens) plus value_coef times
    the critic's loss, 0.5 * mean (V - returns)^2 (clipped around the old values with --value-clip).
    The advantages are detached, so the actor's loss sends no gradient to the critic."""
    run_config = state["config"]
    kept = batch["mask"].bool()
    count = kept.sum().clamp(min=1)
    losses, value_losses, ratios, diagnostics = [], [], [], []
    for epoch in range(run_config["updates_per_batch"]):
        logps = _current_logps(state, batch)
        _check_exponents(logps.detach(), batch, kept)
        per_token = clipped_policy_loss(logps, batch["old_logps"], batch["advantages"], run_config["epsilon"],
                                        check=False)  # (N, R)
        policy_loss = torch.where(kept, per_token, torch.zeros_like(per_token)).sum() / count
        values, _ = critic_values(state["critic"], batch["prompts"], batch["completion_ids"])  # (N, R), with grad
        squared = (values - batch["returns"]).square()
        if run_config["value_clip"] is not None:  # PPO2's value clipping, as TRL and verl
            clipped_values = batch["old_values"] + (values - batch["old_values"]).clamp(
                -run_config["value_clip"], run_config["value_clip"])
            squared = torch.maximum(squared, (clipped_values - batch["returns"]).square())
        value_loss = 0.5 * torch.where(kept, squared, torch.zeros_like(squared)).sum() / count
        loss = policy_loss + run_config["value_coef"] * value_loss
        with torch.no_grad():
            ratio = (logps.detach() - batch["old_logps"]).exp()[kept]
            diagnostics.append(_ratio_diagnostics(ratio, batch["advantages"][kept], run_config, epoch == 0))
        _optimizer_step(state, loss)
        losses.append(loss.item())
        value_losses.append(value_loss.item())
        ratios.append(ratio)
    summary = _pass_summary(losses, ratios, diagnostics)
    summary["value_loss"] = math.fsum(value_losses) / len(value_losses)
    return summary


def sequence_logps_of(run_config, logps, mask):
    """(N,) a response's log-prob: the sum over its kept tokens, or their mean (--sequence-logp)."""
    kept = torch.where(mask.bool(), logps, torch.zeros_like(logps)).sum(dim=1)
    if run_config["sequence_logp"] == "mean":
        return kept / mask.sum(dim=1).clamp(min=1)
    return kept


def update_dpo(state, batch):
    """updates_per_batch Adam steps on the chosen DPO-family loss of the batch's pairs, against the
    frozen initial policy; a batch without a pair (every prompt tied) takes no step."""
    run_config = state["config"]
    chosen, rejected = batch["chosen"], batch["rejected"]
    losses, margins = [], []
    if chosen.numel() == 0:
        return {"loss": 0.0, "preference_margin": 0.0, "ratio_min": 0.0, "ratio_max": 0.0}
    loss_fn = DPO_LOSSES[run_config["dpo_loss"]]
    ref = sequence_logps_of(run_config, batch["ref_logps"], batch["mask"])
    for _ in range(run_config["updates_per_batch"]):
        sequence = sequence_logps_of(run_config, _current_logps(state, batch), batch["mask"])  # (N,)
        if run_config["dpo_loss"] == "simpo":  # reference-free
            per_pair = loss_fn(sequence[chosen], sequence[rejected], run_config["dpo_beta"], run_config["simpo_gamma"],
                               check=False)
        elif run_config["dpo_loss"] in ("cdpo", "robust"):
            per_pair = loss_fn(sequence[chosen], sequence[rejected], ref[chosen], ref[rejected], run_config["dpo_beta"],
                               run_config["label_smoothing"], check=False)
        else:
            per_pair = loss_fn(sequence[chosen], sequence[rejected], ref[chosen], ref[rejected], run_config["dpo_beta"],
                               check=False)
        loss = per_pair.mean()
        with torch.no_grad():  # the relative margin each pass saw, in nats of sequence log-prob
            margins.append(((sequence[chosen] - sequence[rejected]) - (ref[chosen] - ref[rejected])).mean().item())
        _optimizer_step(state, loss)
        losses.append(loss.item())
    return {"loss": math.fsum(losses) / len(losses), "preference_margin": math.fsum(margins) / len(margins),
            "ratio_min": 0.0, "ratio_max": 0.0}


def _pass_summary(losses, ratios, diagnostics):
    all_ratios = torch.cat(ratios)
    summary = {
        "loss": math.fsum(losses) / len(losses),
        "ratio_min": all_ratios.min().item(),
        "ratio_max": all_ratios.max().item(),
    }
    for name in diagnostics[0]:
        summary[name] = math.fsum(item[name] for item in diagnostics) / len(diagnostics)
    return summary


UPDATES = {"ppo": update_ppo, "dpo": update_dpo, **{name: update_group for name in GROUP_FAMILY}}


def update(state, batch):
    """The algorithm's update on one batch (after `compute_advantages`); returns its diagnostics."""
    _check_state(state)
    _check_batch(batch, state)
    return UPDATES[state["config"]["algorithm"]](state, batch)


# ---------------------------------------------------------------------------------------------
# Record: one row per iteration, and the run
# ---------------------------------------------------------------------------------------------


def _mean(values):
    return math.fsum(values) / len(values) if values else 0.0


def record(state, batch, update_diagnostics, step):
    """One CSV row: batch statistics (the responses the update used), the budget (every response and
    token drawn, resampled ones included), update diagnostics, and the exact success probability and
    response KL to the reference of the policy after the update."""
    run_config = state["config"]
    kept = batch["mask"].bool()
    rewards = batch["rewards"]
    state["total_tokens"] += batch["tokens_sampled"]
    lengths = batch["mask"].sum(dim=1).tolist()
    correct = (rewards == REWARD_CORRECT).tolist()
    with torch.no_grad():
        old_logp_all = torch.log_softmax(batch["old_logits"], dim=-1)  # (B*G, R, V)
        entropy = -(old_logp_all.exp() * old_logp_all).sum(dim=-1)[kept].mean().item()
        grouped = rewards.reshape(-1, run_config["group_size"])  # (B*G,) -> (B, G)
        kl_k3 = token_kl_penalty(batch["old_logps"], batch["ref_logps"], check=False)[kept].mean().item()
    row = {name: 0 if name in INTEGER_COLUMNS else 0.0 for name in COLUMNS}
    row.update({
        "step": step,
        "optimizer_steps": state["optimizer_steps"],
        "responses_sampled": batch["responses_sampled"],
        "tokens_sampled": batch["tokens_sampled"],
        "total_tokens_sampled": state["total_tokens"],
        "reward_mean": rewards.mean().item(),
        "success_rate": (rewards == REWARD_CORRECT).double().mean().item(),
        "partial_rate": (rewards == REWARD_PARTIAL).double().mean().item(),
        "mean_response_length": batch["mask"].sum(dim=1).double().mean().item(),
        "mean_correct_length": _mean([float(n) for n, ok in zip(lengths, correct) if ok]),
        "mean_wrong_length": _mean([float(n) for n, ok in zip(lengths, correct) if not ok]),
        "truncated_fraction": batch["truncated"].double().mean().item(),
        "zero_group_fraction": (grouped == grouped[:, :1]).all(dim=1).double().mean().item(),
        "kl_k3": kl_k3,
        "entropy": entropy,
        "filtered_groups": batch["filtered_groups"],
        "extra_responses": batch["responses_sampled"] - batch["prompts"].shape[0],
        "success_probability": _success_probability(state["table"].detach(), run_config["temperature"]),
        "kl_reference": response_kl(state["table"].detach(), state["reference"], run_config["temperature"]),
    })
    algorithm = run_config["algorithm"]
    if algorithm in GROUP_FAMILY:
        row["masked_truncated"] = int(batch["truncated"].sum().item()) if run_config["mask_truncated"] else 0
        weights = batch["importance_weights"]
        if weights is not None:
            row["importance_weight_mean"] = weights[kept].mean().item()
            row["importance_weight_capped_fraction"] = (weights[kept] >= run_config["tis_cap"]).double().mean().item()
    elif algorithm == "ppo":
        returns, values = batch["returns"][kept], batch["old_values"][kept]
        variance = returns.var(correction=0).item()
        row["explained_variance"] = 1.0 - (returns - values).var(correction=0).item() / variance if variance > 0 else 0.0
        rows_index = torch.arange(kept.shape[0])
        row["advantage_first_token"] = batch["token_advantages"][:, 0].mean().item()
        row["advantage_last_token"] = batch["token_advantages"][rows_index, kept.sum(dim=1) - 1].mean().item()
    else:
        row["pairs"] = int(batch["chosen"].numel())
        row["tied_prompts"] = batch["tied_prompts"]
    row.update(update_diagnostics)
    return {name: row[name] for name in COLUMNS}


def initial_row(state):
    """Row 0, the initial evaluation, as in every CSV of the lab: the exact success probability of the
    initial policy (its KL to the reference is 0); nothing is sampled or updated yet, so every other
    column is 0."""
    row = {name: 0 if name in INTEGER_COLUMNS else 0.0 for name in COLUMNS}
    run_config = state["config"]
    row["success_probability"] = _success_probability(state["table"].detach(), run_config["temperature"])
    row["kl_reference"] = response_kl(state["table"].detach(), state["reference"], run_config["temperature"])
    return row


def decode_batch(batch, group_size, groups=2):
    """The first `groups` groups of a batch as readable text: prompt, response, reward, advantage."""
    decoded = []
    for row in range(min(groups * group_size, batch["prompts"].shape[0])):
        ids = batch["completion_ids"][row][batch["real"][row]].tolist()
        item = {
            "prompt": int(batch["prompts"][row]),
            "answer": format(int(batch["prompts"][row]), "b"),
            "response": " ".join(VOCAB[token] for token in ids),
            "truncated": bool(batch["truncated"][row]),
            "reward": batch["rewards"][row].item(),
        }
        if "advantages" in batch and batch["advantages"].dim() == 1:
            item["advantage"] = batch["advantages"][row].item()
        if "token_advantages" in batch:
            kept = batch["mask"][row].bool()
            item["per_token"] = {  # the trace of PPO's credit, one entry per kept token
                "rewards": batch["token_rewards"][row][kept].tolist(),
                "values": batch["old_values"][row][kept].tolist(),
                "next_values": batch["next_values"][row][kept].tolist(),
                "advantages": batch["token_advantages"][row][kept].tolist(),
                "returns": batch["returns"][row][kept].tolist(),
            }
        decoded.append(item)
    return decoded


@torch.enable_grad()  # the updates need autograd even when the caller runs under torch.no_grad()
def train(**options):
    """Train the table policy online with one algorithm; return (rows, report).

    Keyword arguments override DEFAULTS (see `config`; `loss` is accepted for `algorithm`).
    rows: row 0 (the initial evaluation), then one dict per iteration, with COLUMNS. report: settings,
    the TRL and verl options that do the same ("trl", "verl"), the exact initial success probability,
    the first batch decoded, and the final row. Raises ValueError naming a bad setting.
    """
    return run(setup(**options))


@torch.enable_grad()
@torch_threads(1)  # tiny tensors: more threads only wait for each other (see lab_checks.torch_threads)
def run(state, observe=None):
    """The training loop of `train` on a prepared `setup` state: (rows, report).

    observe: None, or a function called as observe(state, batch, row) after each iteration's record,
    for experiments that measure more than the row (it must not change the state).
    """
    rows, first_batch = [initial_row(state)], None
    for step in range(1, state["config"]["steps"] + 1):
        batch = compute_advantages(state, rollout(state))
        if first_batch is None:
            first_batch = decode_batch(batch, state["config"]["group_size"])
        update_diagnostics = update(state, batch)
        rows.append(record(state, batch, update_diagnostics, step))
        if observe is not None:
            observe(state, batch, rows[-1])
    settings = settings_of(state["config"])
    report = {
        "settings": settings,
        **library_blocks(state["config"] | {"max_grad_norm": MAX_GRAD_NORM}),
        "initial_success_probability": rows[0]["success_probability"],
        "first_batch": first_batch,
        "final": rows[-1],
    }
    return rows, report


# ---------------------------------------------------------------------------------------------
# Four algorithms at one budget: the comparison table
# ---------------------------------------------------------------------------------------------

COMPARISON_COLUMNS = [
    "algorithm", "final_success_probability", "best_success_probability", "iterations_to_0.9",
    "tokens_to_0.9", "mean_correct_length", "mean_wrong_length", "kl_reference", "responses_sampled",
    "optimizer_steps",
]
TARGET_SUCCESS = 0.9
LAST_ITERATIONS = 10  # lengths are averaged over the last iterations: one batch is noisy


def comparison_row(algorithm, rows):
    """One line of the comparison: exact success (final, best), the first iteration and the sampled tokens
    at which it passed TARGET_SUCCESS (-1: never), response lengths over the last iterations, the exact
    KL to the reference, the budget used."""
    reached = next((row for row in rows if row["success_probability"] >= TARGET_SUCCESS), None)
    last = rows[-LAST_ITERATIONS:] if len(rows) > LAST_ITERATIONS else rows[1:]
    return {
        "algorithm": algorithm,
        "final_success_probability": rows[-1]["success_probability"],
        "best_success_probability": max(row["success_probability"] for row in rows),
        "iterations_to_0.9": reached["step"] if reached else -1,
        "tokens_to_0.9": reached["total_tokens_sampled"] if reached else -1,
        "mean_correct_length": _mean([row["mean_correct_length"] for row in last if row["mean_correct_length"] > 0]),
        "mean_wrong_length": _mean([row["mean_wrong_length"] for row in last if row["mean_wrong_length"] > 0]),
        "kl_reference": rows[-1]["kl_reference"],
        "responses_sampled": sum(row["responses_sampled"] for row in rows),
        "optimizer_steps": rows[-1]["optimizer_steps"],
    }


def markdown_table(rows, columns):
    """Rows of dicts as a Markdown table (floats with 4 decimals), ready for README."""
    def cell(value):
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row[name]) for name in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# Write and command line
# ---------------------------------------------------------------------------------------------


FLAGS = {  # flag -> (config key, argparse type or "store_true", help); defaults come from DEFAULTS
    "--steps": ("steps", int_flag(1, 100_000), "iterations (sample, score, update), integer in [1, 100000]"),
    "--seed": ("seed", int_flag(0, SEED_LIMIT - 1), "seed of the run's torch.Generator, integer in [0, 2**63 - 1]"),
    "--prompts": ("prompts", int_flag(1, 4096), "prompts drawn per iteration (B), integer in [1, 4096]"),
    "--group-size": ("group_size", int_flag(2, 1024), "responses per prompt (G), integer in [2, 1024]; "
                     "B*G responses per iteration for every algorithm"),
    "--max-new-tokens": ("max_new_tokens", int_flag(1, 64),
                         "cap on response length; a response that reaches it without EOS is truncated, "
                         "integer in [1, 64]"),
    "--temperature": ("temperature", float_flag(MIN_TEMPERATURE, 10.0),
                      f"temperature of the trainer's policy (sampling and every log-prob), number in "
                      f"[{MIN_TEMPERATURE}, 10]"),
    "--updates-per-batch": ("updates_per_batch", int_flag(1, 64),
                            "Adam steps on each batch (ratios leave 1 after the first), integer in [1, 64]"),
    "--beta": ("beta", float_flag(0.0, 10.0), "KL weight: GRPO family, the KL to the reference in the loss "
               "(or the reward); PPO, the per-token -beta * k1 reward; number in [0, 10]"),
    "--lr": ("learning_rate", float_flag(0.0, 10.0, low_open=True), "Adam learning rate, number in (0, 10]"),
    # GRPO family
    "--reduction": ("reduction", REDUCTIONS, "grpo/cispo/sapo: sequence = mean per response then over "
                    "responses (GRPO, the lesson); token = mean over all kept tokens (DAPO); constant = sum / "
                    "(B*G*max_new_tokens) (Dr. GRPO)"),
    "--epsilon": ("epsilon", float_flag(0.0, 1.0, high_open=True), "clip half-width below 1 (grpo, gspo, ppo), "
                  "number in [0, 1); default 0.2, gspo 3e-4"),
    "--epsilon-high": ("epsilon_high", float_flag(0.0, 100.0), "grpo/gspo: upper clip half-width (DAPO's "
                       "clip-higher; default: --epsilon, gspo 4e-4); cispo: the absolute cap on the ratio "
                       "(default 5.0); number in [0, 100]"),
    "--dual-clip": ("dual_clip", float_flag(1.0, 1e6, low_open=True), "grpo: dual-clip constant c > 1, the "
                    "loss of an A < 0 token is at most -c * A (default: off)"),
    "--tau-pos": ("tau_pos", float_flag(0.0, 100.0, low_open=True), "sapo: gate temperature for A > 0 (default 1.0)"),
    "--tau-neg": ("tau_neg", float_flag(0.0, 100.0, low_open=True), "sapo: gate temperature for A < 0 (default 1.05)"),
    "--advantage": ("advantage", ADVANTAGES, "GRPO family: grpo = group-relative (reward - group mean) / std; "
                    "rloo = reward - mean of the other responses of the prompt"),
    "--scale-rewards": ("scale_rewards", SCALES, "advantage grpo: divide by the group's std, the batch's, or "
                        "none (Dr. GRPO)"),
    "--kl-estimator": ("kl_estimator", tuple(KL_ESTIMATORS), "GRPO family: the per-token KL estimator (k3 "
                       "as the lesson; k1 = log-ratio; k2 = half its square)"),
    "--kl-in": ("kl_in", KL_PLACEMENTS, "GRPO family: the KL as a loss term, or subtracted from each "
                "response's reward (beta times its summed estimate) before the advantages"),
    "--mask-truncated": ("mask_truncated", "store_true", "GRPO family: drop responses that hit the cap "
                         "from the loss"),
    "--overlong-penalty": ("overlong_penalty", int_flag(1, 64), "GRPO family: DAPO's soft overlong "
                           "punishment with this cache (tokens before the cap where it ramps to -1)"),
    "--dynamic-sampling": ("dynamic_sampling", "store_true", "GRPO family: resample until every group's "
                           "rewards vary (DAPO), counting every extra response"),
    "--max-resample-rounds": ("max_resample_rounds", int_flag(1, 64), "dynamic sampling: extra batches "
                              "drawn at most, integer in [1, 64] (default 8)"),
    "--rollout-temperature": ("rollout_temperature", float_flag(MIN_TEMPERATURE, 10.0), "GRPO family: "
                              "sample at this temperature while the trainer scores at --temperature (a "
                              "sampler/trainer mismatch)"),
    "--rollout-top-p": ("rollout_top_p", float_flag(0.0, 1.0, low_open=True), "GRPO family: sample from the "
                        "top-p nucleus while the trainer scores the full distribution, number in (0, 1]"),
    "--tis-cap": ("tis_cap", float_flag(1.0, 1e6), "grpo/cispo/sapo: weight each token's policy term by "
                  "min(p_trainer / p_sampler, cap) (truncated importance sampling), number >= 1"),
    # PPO
    "--gamma": ("gamma", float_flag(0.0, 1.0), "ppo: discount in [0, 1] (default 1)"),
    "--gae-lambda": ("gae_lambda", float_flag(0.0, 1.0), "ppo: GAE lambda in [0, 1] (default 0.95)"),
    "--truncation": ("truncation", TRUNCATIONS, "ppo: a response cut at the cap bootstraps V(state after "
                     "the cap) (the lab's time limit), or is terminal (TRL, verl)"),
    "--cap-value": ("cap_value", CAP_VALUES, "ppo --truncation bootstrap: the value of the state after the cap "
                    "comes from its own critic row (never visited: 0) or the last position's (shared)"),
    "--no-whiten": ("whiten_advantages", "store_false", "ppo: do not whiten the advantages over the batch's "
                    "kept tokens (whitened by default, as TRL and verl)"),
    "--value-coef": ("value_coef", float_flag(0.0, 100.0), "ppo: weight of the critic's loss, number in "
                     "[0, 100] (default 0.5)"),
    "--value-clip": ("value_clip", float_flag(0.0, 100.0, low_open=True), "ppo: clip the value update "
                     "around the old values (PPO2; default: off)"),
    # DPO
    "--dpo-loss": ("dpo_loss", tuple(DPO_LOSSES), "dpo: sigmoid (DPO), ipo, hinge (SLiC), cdpo (label "
                   "smoothing), robust (rDPO), simpo (no reference, length-averaged)"),
    "--dpo-beta": ("dpo_beta", float_flag(1e-6, 100.0), "dpo: beta of the loss, number in [1e-6, 100] "
                   "(default 0.5; ipo and hinge 0.1; simpo 2.0)"),
    "--label-smoothing": ("label_smoothing", float_flag(0.0, 0.5, high_open=True), "dpo cdpo/robust: the "
                          "believed label-flip rate e in [0, 0.5) (default 0)"),
    "--simpo-gamma": ("simpo_gamma", float_flag(0.0, 100.0), "dpo simpo: the target margin gamma "
                      "(default 0.5)"),
    "--sequence-logp": ("sequence_logp", SEQUENCE_LOGPS, "dpo: a response's log-prob is the sum over its "
                        "tokens (DPO) or their mean (default: sum; simpo: mean)"),
    "--offline": ("offline", "store_true", "dpo: pairs sampled from the frozen initial policy, not the "
                  "current one (online vs offline, one flag apart)"),
}


def build_parser():
    parser = OneLineErrorParser(
        prog="online_tokens.py",
        description="Online RL of a tiny autoregressive policy with a rule-based verifier: PPO (critic + GAE), "
                    "online DPO and its family, GRPO, CISPO, GSPO, SAPO, with the field's switches; writes "
                    "online.csv and online.json (per algorithm, plus a comparison table for --algorithm all). "
                    "Every option is off (or the first release's value) by default; one that does not apply "
                    "to the algorithm is an error.",
    )
    parser.add_argument("--algorithm", choices=ALGORITHMS + ("all",), default=None,
                        help="what to train (default: grpo); 'all' = ppo, dpo, grpo, cispo from the same "
                             "initial policy at the same budget (B*G responses per iteration)")
    parser.add_argument("--loss", choices=tuple(GROUP_LOSSES), default=None,
                        help="the first release's name for --algorithm within the GRPO family (grpo, cispo, "
                             "gspo, sapo); both may be given if they agree")
    parser.add_argument("--output", default=None,
                        help="the output folder (default: results-online-<algorithm>-<reduction> for the GRPO "
                             "family, results-online-<algorithm> for ppo and dpo, results-online-all for all, each "
                             "followed by every option that differs from its default, e.g. "
                             "results-online-grpo-sequence-advantage-rloo; created when the files are written)")
    for flag, (key, kind, text) in FLAGS.items():
        if kind in ("store_true", "store_false"):
            parser.add_argument(flag, dest=key, action=kind, default=None, help=text)
        elif isinstance(kind, tuple):
            parser.add_argument(flag, dest=key, choices=kind, default=None,
                                help=f"{text} (default: {DEFAULTS[key]})")
        else:
            shown = "" if DEFAULTS[key] is None or "default" in text else f" (default: {DEFAULTS[key]})"
            parser.add_argument(flag, dest=key, type=kind, default=None, help=text + shown)
    return parser


def _options_from(parser, args):
    options = {key: getattr(args, key) for key, _, _ in FLAGS.values() if getattr(args, key) is not None}
    if args.loss is not None and args.algorithm not in (None, args.loss):
        parser.error(f"argument --loss: {args.loss!r} disagrees with --algorithm {args.algorithm}")
    algorithm = args.algorithm or args.loss or DEFAULTS["algorithm"]
    flag_of = {key: flag for flag, (key, _, _) in FLAGS.items()}
    targets = FOUR_ALGORITHMS if algorithm == "all" else (algorithm,)
    for key in options:
        missing = [name for name in targets if name not in APPLIES[key]]
        if missing:
            parser.error(f"argument {flag_of[key]}: does not apply to {', '.join(missing)} "
                         f"(only to {', '.join(APPLIES[key])})")
    try:  # every other rule of config(), checked before anything is written or trained
        for name in targets:
            config(algorithm=name, **options)
    except ValueError as error:
        key = str(error).split(":")[0]
        parser.error(f"argument {flag_of.get(key, '--' + key.replace('_', '-'))}: {str(error)[len(key) + 2:]}")
    return algorithm, options


def default_output(algorithm, options):
    """The folder a run writes when --output is not given: results-online-<algorithm>[-<reduction>], then
    every other option that differs from its default (results-online-grpo-sequence-advantage-rloo), so
    that only the default run writes the committed default folder."""
    if algorithm == "all":
        name = "results-online-all"
    elif algorithm in GROUP_FAMILY:
        reduction = "sequence" if algorithm == "gspo" else options.get("reduction", DEFAULTS["reduction"])
        name = f"results-online-{algorithm}-{reduction}"
    else:
        name = f"results-online-{algorithm}"
    for key, value in options.items():
        if key != "reduction" and value != DEFAULTS[key]:
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            name += f"-{key.replace('_', '-')}-{shown}"
    return name


def summary_text(rows, report, seconds):
    """A few readable lines: start, end, the budget, and the first group of the first batch."""
    first, last = rows[1], rows[-1]  # rows[0] is the initial evaluation: nothing sampled yet
    trained = rows[1:]
    settings = report["settings"]
    lines = [
        f"online {settings['algorithm']}, {settings['steps']} iterations of {settings['prompts']} prompts x "
        f"{settings['group_size']} responses, seed {settings['seed']}",
        f"  exact success probability {report['initial_success_probability']:.4f} -> {last['success_probability']:.4f}"
        f"; exact KL to the reference {last['kl_reference']:.4f} nats per response",
        f"  sampled success rate {first['success_rate']:.3f} (first batch) -> {last['success_rate']:.3f} (last batch); "
        f"mean response length {first['mean_response_length']:.2f} -> {last['mean_response_length']:.2f}",
        f"  clip_fraction mean {_mean([row['clip_fraction'] for row in trained]):.4f}; "
        f"{last['total_tokens_sampled']} tokens sampled in {sum(row['responses_sampled'] for row in rows)} responses",
        f"  training loop {seconds:.2f} s, {last['total_tokens_sampled'] / seconds:,.0f} tokens/s (sampling, scoring "
        "and updates; machine-dependent, so printed here and kept out of the files, which stay byte-identical)",
        "  first group of the first batch:",
    ]
    for item in report["first_batch"][: settings["group_size"]]:
        advantage = f" advantage {item['advantage']:+.3f}" if "advantage" in item else ""
        lines.append(
            f"    prompt {item['prompt']} (answer {item['answer']}): {item['response']:<18s} "
            f"{'truncated ' if item['truncated'] else ''}reward {item['reward']:.2f}{advantage}"
        )
    return "\n".join(lines) + "\n"


def _train_timed(options):
    state = setup(**options)  # outside the clock: torch's first optimizer construction costs ~0.8 s
    started = time.perf_counter()
    rows, report = run(state)
    return rows, report, time.perf_counter() - started


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    algorithm, options = _options_from(parser, args)
    output = default_output(algorithm, options) if args.output is None else args.output
    names = FOUR_ALGORITHMS if algorithm == "all" else (algorithm,)
    folders = {name: os.path.join(output, name) if algorithm == "all" else output for name in names}
    output_folder_or_exit(parser, output, ["comparison.csv", "comparison.md"] if algorithm == "all" else
                          ["online.csv", "online.json"])
    if algorithm == "all":  # each algorithm's folder too, before any training
        for name in names:
            output_folder_or_exit(parser, folders[name], ["online.csv", "online.json"])
    files, summaries, comparison, timings = {}, [], [], []
    for name in names:
        try:
            rows, report, seconds = _train_timed({**options, "algorithm": name})
        except TrainingDiverged as error:  # nothing was written: the files come only after the training
            print(f"{parser.prog}: error: training diverged ({name}): {error}", file=sys.stderr)
            return 1
        csv_path, json_path = os.path.join(folders[name], "online.csv"), os.path.join(folders[name], "online.json")
        files[csv_path] = csv_text(rows, COLUMNS)
        files[json_path] = json_text(report)
        summaries.append(summary_text(rows, report, seconds) + f"-> {csv_path}, {json_path}\n")
        comparison.append(comparison_row(name, rows))
        timings.append(seconds)
    if algorithm == "all":
        files[os.path.join(output, "comparison.csv")] = csv_text(comparison, COMPARISON_COLUMNS)
        files[os.path.join(output, "comparison.md")] = markdown_table(comparison, COMPARISON_COLUMNS)
    write_files(files)  # every algorithm's files together: a folder holds all of this run's files or none
    print("".join(summaries), end="")
    if algorithm == "all":
        shown = [{**row, "wall_seconds": seconds} for row, seconds in zip(comparison, timings)]
        print(f"\nthe four at one budget (wall_seconds is this machine's; the files leave it out):\n"
              f"{markdown_table(shown, COMPARISON_COLUMNS + ['wall_seconds'])}"
              f"-> {os.path.join(output, 'comparison.csv')}, {os.path.join(output, 'comparison.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
