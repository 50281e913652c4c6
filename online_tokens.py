"""Online GRPO and CISPO on a tiny autoregressive policy: sample, verify, update, token by token.

    python online_tokens.py --loss grpo                 # -> results-online-grpo-sequence/online.{csv,json}
    python online_tokens.py --loss cispo                # -> results-online-cispo-sequence/
    python online_tokens.py --loss grpo --reduction token --output results-online-grpo-token
    python plot_results.py --input results-online-grpo-sequence results-online-cispo-sequence --output online.svg

The loop of RL with a verifiable reward (RLVR), on a CPU in a fraction of a second. The task: the
prompt is a number n in 0..5 and the correct answer is n in binary ("0", "1", "10", "11", "100",
"101") followed by EOS; a rule-based verifier scores each response. The policy is a table of
next-token logits indexed by (prompt, position, previous token), all zeros at the start. Each
iteration samples B prompts x G responses token by token from a frozen snapshot (the old policy),
scores them, computes group-relative advantages and completion masks, and takes a few Adam steps on
the GRPO or CISPO loss with a k3 KL to the frozen initial policy, reduced per sequence, per token or
by a constant; online.csv (row 0 = the initial evaluation, then one row per iteration) and
online.json record it.

Shape notation (as in rl_lab.py): B prompts, G group size, N = B*G responses, R completion
positions (max_new_tokens), V vocabulary, P prompts of the task.
"""

from __future__ import annotations

from lab_io import exit_quietly_on_signals

if __name__ == "__main__":  # first: a Ctrl-C while torch loads below ends with one line, not a traceback
    exit_quietly_on_signals()

import math  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from lab_checks import check_int, check_real, check_tensor, exp_limit, torch_threads  # noqa: E402
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
from rl_lab import (  # noqa: E402
    DEVICE,
    DTYPE,
    SEED_LIMIT,
    cispo_policy_loss,
    clip_fraction,
    completion_mask,
    group_relative_advantages,
    grpo_policy_loss,
    token_kl_penalty,
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
LOSSES = {"grpo": grpo_policy_loss, "cispo": cispo_policy_loss}  # names -> atoms (no switch inside)
REDUCTIONS = ("sequence", "token", "constant")
GROUP_EPS = 1e-4  # the lesson's eps of group_relative_advantages
MAX_GRAD_NORM = 1.0
# B*G*R token positions per batch: 2**20 take about 0.5 GB of memory and 5 s per iteration on one core
MAX_TOKEN_POSITIONS = 2**20
MIN_TEMPERATURE = 0.01  # below it the tempered logits overflow exp() once the table has learned anything
DEFAULTS = {
    "loss": "grpo", "reduction": "sequence", "steps": 60, "seed": 7, "prompts": 8, "group_size": 8,
    "max_new_tokens": 5, "temperature": 1.0, "updates_per_batch": 2, "beta": 0.02, "epsilon": 0.2,
    "epsilon_high": 5.0, "learning_rate": 0.2,
}
COLUMNS = [
    "step", "optimizer_steps", "tokens_sampled", "total_tokens_sampled", "reward_mean", "success_rate",
    "partial_rate", "mean_response_length", "truncated_fraction", "zero_group_fraction", "ratio_min",
    "ratio_max", "clip_fraction", "outside_clip_range_fraction", "capped_fraction", "kl_k3", "entropy",
    "loss", "success_probability",
]


def policy_logits(table, prompts, positions, previous, temperature):
    """(..., V) tempered next-token logits of the table policy: table[prompt, position, previous] / T.

    table (P, R, V+1, V); prompts, positions and previous broadcast to the same shape (...).
    Sampling and scoring both call this, so old and current log-probs use the same tempered logits.
    """
    return table[prompts, positions, previous] / temperature


def completion_logits(table, prompts, completion_ids, temperature):
    """(N, R, V) tempered logits at every completion position, given the tokens before it (teacher forcing).

    prompts (N,) int64; completion_ids (N, R) int64. The previous token of position 0 is the BOS state.
    """
    count, length = completion_ids.shape
    bos = torch.full((count, 1), BOS_STATE, dtype=torch.long, device=DEVICE)
    previous = torch.cat([bos, completion_ids[:, :-1]], dim=1)  # (N, R): the token before each position
    positions = torch.arange(length, device=DEVICE).expand(count, length)  # (R,) -> (N, R)
    return policy_logits(table, prompts.unsqueeze(1), positions, previous, temperature)  # (N, R, V)


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

    table: (P=6, R, V+1=4, V=3) float logits of the policy; temperature in (0, 10].
    Raises ValueError naming the argument for a bad table or temperature.
    """
    _check_table(table)
    check_real("temperature", temperature, low=0.0, high=10.0, low_open=True)
    ids, real = answer_table()
    if ids.shape[1] > table.shape[1]:  # the cap is shorter than the longest answer + EOS
        ids, real = ids[:, : table.shape[1]], real[:, : table.shape[1]]
        reachable = torch.tensor([len(answer) + 1 <= table.shape[1] for answer in ANSWERS])
    else:
        reachable = torch.ones(len(ANSWERS), dtype=torch.bool)
    with torch.no_grad():
        logps = token_logps(table[:, : ids.shape[1]], torch.arange(ids.shape[0]), ids, temperature)
        path = torch.where(real, logps, torch.zeros_like(logps)).sum(dim=1).exp()  # (P,)
        return torch.where(reachable, path, torch.zeros_like(path)).mean().item()


def _check_table(table):
    check_tensor("table", table, ndim=4)
    prompts, _, states, vocab = table.shape
    if (prompts, states, vocab) != (len(NUMBERS), len(VOCAB) + 1, len(VOCAB)):
        raise ValueError(
            f"table: expected shape ({len(NUMBERS)}, R, {len(VOCAB) + 1}, {len(VOCAB)}), got {tuple(table.shape)}"
        )


def _check_state(state):
    keys = ("config", "generator", "table", "reference", "optimizer", "loss_fn", "loss_kwargs")
    if not isinstance(state, dict) or any(key not in state for key in keys):
        raise ValueError("state: expected the dict returned by online_tokens.setup()")


_BATCH_KEYS = ("prompts", "completion_ids", "real", "truncated", "rewards", "advantages", "mask", "old_logps",
               "ref_logps", "old_logits")


def _check_batch(batch, state):
    if not isinstance(batch, dict) or any(key not in batch for key in _BATCH_KEYS):
        raise ValueError("batch: expected the dict returned by online_tokens.rollout()")
    count = state["config"]["prompts"] * state["config"]["group_size"]
    shape = (count, state["config"]["max_new_tokens"])
    if tuple(batch["completion_ids"].shape) != shape or tuple(batch["advantages"].shape) != (count,):
        raise ValueError(f"batch: expected {count} responses of {shape[1]} positions, from this state's rollout")


def _settings(config):
    settings = dict(config)
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
        "group_advantage_eps": GROUP_EPS,
        "kl": "k3 per token inside the loss atoms (beta); kl_k3 column: old vs reference on the sampled tokens",
        "truncated_responses": "kept in the loss: every real token counts (no EOS to score)",
        "dtype": str(DTYPE).replace("torch.", ""),
        "device": str(DEVICE),
        "torch": torch.__version__,
    })
    return settings


def config(**overrides):
    """DEFAULTS with `overrides`, validated; raises ValueError naming the bad key."""
    unknown = sorted(set(overrides) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a setting of the online run (expected one of {', '.join(DEFAULTS)})")
    settings = {**DEFAULTS, **overrides}
    if not isinstance(settings["loss"], str) or settings["loss"] not in LOSSES:
        raise ValueError(f"loss: expected 'grpo' or 'cispo', got {settings['loss']!r}")
    if not isinstance(settings["reduction"], str) or settings["reduction"] not in REDUCTIONS:
        raise ValueError(f"reduction: expected one of {', '.join(REDUCTIONS)}, got {settings['reduction']!r}")
    for name, low, high in (("steps", 1, 100_000), ("seed", 0, 2**63 - 1), ("prompts", 1, 4096),
                            ("group_size", 2, 1024), ("max_new_tokens", 1, 64), ("updates_per_batch", 1, 64)):
        check_int(name, settings[name], low=low, high=high)
    positions = settings["prompts"] * settings["group_size"] * settings["max_new_tokens"]
    if positions > MAX_TOKEN_POSITIONS:
        raise ValueError(f"prompts: prompts * group_size * max_new_tokens = {positions} token positions per batch, "
                         f"more than {MAX_TOKEN_POSITIONS}")
    check_real("temperature", settings["temperature"], low=MIN_TEMPERATURE, high=10.0)
    check_real("beta", settings["beta"], low=0.0, high=10.0)
    check_real("epsilon", settings["epsilon"], low=0.0, high=1.0, high_open=True)
    check_real("epsilon_high", settings["epsilon_high"], low=0.0, high=100.0, low_open=True)
    check_real("learning_rate", settings["learning_rate"], low=0.0, high=10.0, low_open=True)
    return settings


def setup(**overrides):
    """Everything a run holds: config, generator, policy table, frozen reference, optimizer, counters.

    The table (P, R, V+1, V) starts at zeros (a uniform policy) and the reference is a frozen copy.
    """
    run_config = config(**overrides)
    shape = (len(NUMBERS), run_config["max_new_tokens"], len(VOCAB) + 1, len(VOCAB))
    table = torch.zeros(shape, dtype=DTYPE, device=DEVICE, requires_grad=True)
    loss_kwargs = {"beta": run_config["beta"], "reduction": run_config["reduction"],
                   "max_new_tokens": run_config["max_new_tokens"]}
    if run_config["loss"] == "grpo":
        loss_kwargs["epsilon"] = run_config["epsilon"]
    else:
        loss_kwargs["epsilon_high"] = run_config["epsilon_high"]
    return {
        "config": run_config,
        "generator": torch.Generator(device=DEVICE).manual_seed(run_config["seed"]),  # the one seeding point
        "table": table,
        "reference": torch.zeros(shape, dtype=DTYPE, device=DEVICE),
        "optimizer": torch.optim.Adam([table], lr=run_config["learning_rate"]),
        "loss_fn": LOSSES[run_config["loss"]],
        "loss_kwargs": loss_kwargs,
        "optimizer_steps": 0,
        "total_tokens": 0,
    }


# ---------------------------------------------------------------------------------------------
# Rollout: sample responses token by token from the frozen old policy, and score them
# ---------------------------------------------------------------------------------------------


def sample_completions(table, prompts, max_new_tokens, temperature, generator):
    """Sample one completion per prompt token by token from `table` (the frozen old policy).

    Returns (completion_ids (N, R) int64 with PAD after the first EOS, real (N, R) bool True up to and
    including the EOS, truncated (N,) bool: the response hit max_new_tokens without an EOS).
    """
    count = prompts.shape[0]
    completion_ids = torch.full((count, max_new_tokens), PAD, dtype=torch.long, device=DEVICE)
    real = torch.zeros(count, max_new_tokens, dtype=torch.bool, device=DEVICE)
    previous = torch.full((count,), BOS_STATE, dtype=torch.long, device=DEVICE)
    finished = torch.zeros(count, dtype=torch.bool, device=DEVICE)
    with torch.no_grad():
        for position in range(max_new_tokens):
            positions = torch.full((count,), position, dtype=torch.long, device=DEVICE)
            probs = torch.softmax(policy_logits(table, prompts, positions, previous, temperature), dim=-1)  # (N, V)
            tokens = torch.multinomial(probs, 1, generator=generator).squeeze(1)  # (N, 1) -> (N,)
            tokens = torch.where(finished, torch.full_like(tokens, PAD), tokens)  # PAD after the EOS
            real[:, position] = ~finished
            completion_ids[:, position] = tokens
            finished = finished | (tokens == EOS)
            previous = tokens
    return completion_ids, real, ~finished


def rollout(state):
    """Sample B prompts x G responses from a frozen snapshot, score them and cache what the update needs.

    Returns a dict: prompts (B*G,) prompt-major, completion_ids / real (B*G, R), truncated (B*G,),
    rewards (B*G,), mask (B*G, R) int64, old_logps / ref_logps (B*G, R) and old_logits (B*G, R, V),
    all without grad (the advantages are added by `compute_advantages`).
    """
    _check_state(state)
    run_config = state["config"]
    temperature, group_size = run_config["temperature"], run_config["group_size"]
    old = state["table"].detach().clone()
    numbers = torch.randint(0, len(NUMBERS), (run_config["prompts"],), generator=state["generator"])  # (B,)
    prompts = numbers.repeat_interleave(group_size)  # (B,) -> (B*G,)
    completion_ids, real, truncated = sample_completions(
        old, prompts, run_config["max_new_tokens"], temperature, state["generator"]
    )
    rewards = torch.tensor(
        [verify(number, ids[row_real].tolist(), cut)
         for number, ids, row_real, cut in zip(prompts.tolist(), completion_ids, real, truncated.tolist())],
        dtype=DTYPE, device=DEVICE,
    )  # (B*G,)
    mask = completion_mask(completion_ids, EOS, real)  # (B*G, R): tokens up to and including the first EOS
    with torch.no_grad():
        # cached once, from the same tempered logits the update uses: the ratio is exactly 1 at first
        old_logits = completion_logits(old, prompts, completion_ids, temperature)  # (B*G, R, V)
        old_logps = logps_of_tokens(old_logits, completion_ids)  # the same ops as token_logps(old, ...)
        ref_logps = token_logps(state["reference"], prompts, completion_ids, temperature)
    return {
        "prompts": prompts, "completion_ids": completion_ids, "real": real, "truncated": truncated,
        "rewards": rewards, "mask": mask, "old_logps": old_logps, "ref_logps": ref_logps, "old_logits": old_logits,
    }


# ---------------------------------------------------------------------------------------------
# Advantages: relative to each prompt's group, no critic
# ---------------------------------------------------------------------------------------------


def compute_advantages(state, batch):
    """Add `advantages` (B*G,) to the batch: group_relative_advantages of its rewards (eps 1e-4)."""
    batch["advantages"] = group_relative_advantages(batch["rewards"], state["config"]["group_size"], eps=GROUP_EPS)
    return batch


# ---------------------------------------------------------------------------------------------
# Update: a few Adam steps on the GRPO or CISPO loss of one batch
# ---------------------------------------------------------------------------------------------


def clip_diagnostics(ratio, advantages, loss, epsilon, epsilon_high):
    """Shares of tokens, for ratios (K,) and their sequences' advantages (K,):

    - clip_fraction: tokens whose policy-gradient term the loss zeroes (rl_lab.clip_fraction, the
      bandit's definition and TRL's and verl's). GRPO's PPO-Clip zeroes it only on the side the policy
      already moved toward: A > 0 and ratio > 1 + eps, or A < 0 and ratio < 1 - eps. CISPO never
      zeroes it: 0. (The KL term still passes gradient in both.)
    - outside_clip_range_fraction: |ratio - 1| > epsilon, the naive count (a ratio outside the range
      on the unfavourable side keeps its gradient, so it is larger);
    - capped_fraction: ratio > epsilon_high, where CISPO caps the detached weight; for GRPO only a count.
    """
    zeroed = clip_fraction(ratio, advantages, epsilon, check=False).item() if loss == "grpo" else 0.0
    return {
        "clip_fraction": zeroed,
        "outside_clip_range_fraction": ((ratio - 1.0).abs() > epsilon).double().mean().item(),
        "capped_fraction": (ratio > epsilon_high).double().mean().item(),
    }


class TrainingDiverged(FloatingPointError):
    """The policy moved so far within one batch that a ratio or the k3 term overflows exp()."""


def _check_exponents(logps, batch, kept):
    """Raise TrainingDiverged before exp() of a log-ratio (ratio) or of ref - logp (k3) overflows."""
    limit = exp_limit(logps.dtype)  # about 708.8 nats in float64: the atoms' own limit
    largest = max((logps - batch["old_logps"])[kept].max().item(), (batch["ref_logps"] - logps)[kept].max().item())
    if largest > limit:
        raise TrainingDiverged(
            f"a log-ratio of {largest:.0f} nats overflows exp(): the policy moved too far within one batch "
            "(lower --lr or --updates-per-batch, or raise --temperature)"
        )


def update(state, batch):
    """`updates_per_batch` Adam steps on the GRPO or CISPO loss of one batch; returns their diagnostics.

    Ratios and clip fractions are those each pass's loss saw (before its step), over kept tokens,
    averaged over the passes; see `clip_diagnostics` for the three fractions.
    """
    _check_state(state)
    _check_batch(batch, state)
    run_config = state["config"]
    kept = batch["mask"].bool()
    signs = batch["advantages"].unsqueeze(1).expand_as(kept)[kept]  # (B*G,) -> (B*G, R) -> (kept,)
    losses, ratios = [], []
    diagnostics = {"clip_fraction": [], "outside_clip_range_fraction": [], "capped_fraction": []}
    for _ in range(run_config["updates_per_batch"]):
        logps = token_logps(state["table"], batch["prompts"], batch["completion_ids"], run_config["temperature"])
        _check_exponents(logps.detach(), batch, kept)
        loss = state["loss_fn"](logps, batch["old_logps"], batch["ref_logps"], batch["advantages"], batch["mask"],
                                **state["loss_kwargs"])
        state["optimizer"].zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_([state["table"]], MAX_GRAD_NORM)
        state["optimizer"].step()
        state["optimizer_steps"] += 1
        with torch.no_grad():
            ratio = (logps.detach() - batch["old_logps"]).exp()[kept]  # (kept,): the ratios this pass's loss saw
        losses.append(loss.item())
        ratios.append(ratio)
        for name, value in clip_diagnostics(ratio, signs, run_config["loss"], run_config["epsilon"],
                                            run_config["epsilon_high"]).items():
            diagnostics[name].append(value)
    passes = len(losses)
    all_ratios = torch.cat(ratios)
    return {
        "loss": math.fsum(losses) / passes,
        "ratio_min": all_ratios.min().item(),
        "ratio_max": all_ratios.max().item(),
        **{name: math.fsum(values) / passes for name, values in diagnostics.items()},
    }


# ---------------------------------------------------------------------------------------------
# Record: one row per iteration, and the run
# ---------------------------------------------------------------------------------------------


def record(state, batch, update_diagnostics, step):
    """One CSV row: batch statistics (responses sampled this iteration), update diagnostics, and the
    exact success probability of the policy after the update."""
    run_config = state["config"]
    kept = batch["mask"].bool()
    rewards = batch["rewards"]
    tokens_sampled = int(kept.sum().item())
    state["total_tokens"] += tokens_sampled
    with torch.no_grad():
        old_logp_all = torch.log_softmax(batch["old_logits"], dim=-1)  # (B*G, R, V)
        entropy = -(old_logp_all.exp() * old_logp_all).sum(dim=-1)[kept].mean().item()
        grouped = rewards.reshape(-1, run_config["group_size"])  # (B*G,) -> (B, G)
        kl_k3 = token_kl_penalty(batch["old_logps"], batch["ref_logps"])[kept].mean().item()
    row = {
        "step": step,
        "optimizer_steps": state["optimizer_steps"],
        "tokens_sampled": tokens_sampled,
        "total_tokens_sampled": state["total_tokens"],
        "reward_mean": rewards.mean().item(),
        "success_rate": (rewards == REWARD_CORRECT).double().mean().item(),
        "partial_rate": (rewards == REWARD_PARTIAL).double().mean().item(),
        "mean_response_length": batch["mask"].sum(dim=1).double().mean().item(),
        "truncated_fraction": batch["truncated"].double().mean().item(),
        "zero_group_fraction": (grouped == grouped[:, :1]).all(dim=1).double().mean().item(),
        "kl_k3": kl_k3,
        "entropy": entropy,
        "success_probability": success_probability(state["table"].detach(), run_config["temperature"]),
    }
    row.update(update_diagnostics)
    return {name: row[name] for name in COLUMNS}


def initial_row(state):
    """Row 0, the initial evaluation, as in every CSV of the lab: the exact success probability of the
    initial policy; nothing is sampled or updated yet, so every other column is 0."""
    row = {name: 0.0 for name in COLUMNS}
    row.update({"step": 0, "optimizer_steps": 0, "tokens_sampled": 0, "total_tokens_sampled": 0})
    row["success_probability"] = success_probability(state["table"].detach(), state["config"]["temperature"])
    return row


def decode_batch(batch, group_size, groups=2):
    """The first `groups` groups of a batch as readable text: prompt, response, reward, advantage."""
    decoded = []
    for row in range(min(groups * group_size, batch["prompts"].shape[0])):
        ids = batch["completion_ids"][row][batch["real"][row]].tolist()
        decoded.append({
            "prompt": int(batch["prompts"][row]),
            "answer": format(int(batch["prompts"][row]), "b"),
            "response": " ".join(VOCAB[token] for token in ids),
            "truncated": bool(batch["truncated"][row]),
            "reward": batch["rewards"][row].item(),
            "advantage": batch["advantages"][row].item(),
        })
    return decoded


@torch.enable_grad()  # the updates need autograd even when the caller runs under torch.no_grad()
def train(**overrides):
    """Train the table policy online with GRPO or CISPO; return (rows, report).

    Keyword arguments override DEFAULTS (loss, reduction, steps, seed, prompts, group_size,
    max_new_tokens, temperature, updates_per_batch, beta, epsilon, epsilon_high, learning_rate).
    rows: row 0 (the initial evaluation), then one dict per iteration, with COLUMNS. report: settings, the exact initial success
    probability, the first batch decoded, and the final row. Raises ValueError naming a bad setting.
    """
    return run(setup(**overrides))


@torch.enable_grad()
@torch_threads(1)  # tiny tensors: more threads only wait for each other (see lab_checks.torch_threads)
def run(state):
    """The training loop of `train` on a prepared `setup` state: (rows, report)."""
    rows, first_batch = [initial_row(state)], None
    for step in range(1, state["config"]["steps"] + 1):
        batch = compute_advantages(state, rollout(state))
        if first_batch is None:
            first_batch = decode_batch(batch, state["config"]["group_size"])
        update_diagnostics = update(state, batch)
        rows.append(record(state, batch, update_diagnostics, step))
    report = {
        "settings": _settings(state["config"]),
        "initial_success_probability": rows[0]["success_probability"],
        "first_batch": first_batch,
        "final": rows[-1],
    }
    return rows, report


# ---------------------------------------------------------------------------------------------
# Write and command line
# ---------------------------------------------------------------------------------------------


FLAGS = {  # flag -> (config key, argparse type, help)
    "--loss": ("loss", None, "policy loss: grpo (PPO-Clip per token) or cispo (detached capped weight)"),
    "--reduction": ("reduction", None, "sequence: mean per response then over responses (GRPO, the lesson); "
                                      "token: mean over all kept tokens (DAPO); constant: sum / (B*G*max_new_tokens) "
                                      "(Dr. GRPO)"),
    "--steps": ("steps", int_flag(1, 100_000), "iterations (sample, score, update), integer in [1, 100000]"),
    "--seed": ("seed", int_flag(0, SEED_LIMIT - 1), "seed of the run's torch.Generator, integer in [0, 2**63 - 1]"),
    "--prompts": ("prompts", int_flag(1, 4096), "prompts drawn per iteration (B), integer in [1, 4096]"),
    "--group-size": ("group_size", int_flag(2, 1024), "responses per prompt (G), integer in [2, 1024]"),
    "--max-new-tokens": ("max_new_tokens", int_flag(1, 64),
                         "cap on response length; a response that reaches it without EOS is truncated, "
                         "integer in [1, 64]"),
    "--temperature": ("temperature", float_flag(MIN_TEMPERATURE, 10.0),
                      f"sampling temperature, also applied to every log-prob, number in [{MIN_TEMPERATURE}, 10]"),
    "--updates-per-batch": ("updates_per_batch", int_flag(1, 64),
                            "Adam steps on each batch (ratios leave 1 after the first), integer in [1, 64]"),
    "--beta": ("beta", float_flag(0.0, 10.0), "weight of the k3 KL to the reference, number in [0, 10]"),
    "--epsilon": ("epsilon", float_flag(0.0, 1.0, high_open=True), "GRPO clip half-width, number in [0, 1)"),
    "--epsilon-high": ("epsilon_high", float_flag(0.0, 100.0, low_open=True),
                       "CISPO's absolute cap on the ratio, number in (0, 100]"),
    "--lr": ("learning_rate", float_flag(0.0, 10.0, low_open=True), "Adam learning rate, number in (0, 10]"),
}


def build_parser():
    parser = OneLineErrorParser(
        prog="online_tokens.py",
        description="Online GRPO/CISPO training of a tiny autoregressive policy with a rule-based verifier; "
                    "writes online.csv and online.json.",
    )
    parser.add_argument("--output", default=None,
                        help="the output folder (default: results-online-<loss>-<reduction>, created if missing)")
    for flag, (key, parse, text) in FLAGS.items():
        default = DEFAULTS[key]
        extra = {"choices": tuple(LOSSES)} if key == "loss" else (
            {"choices": REDUCTIONS} if key == "reduction" else {"type": parse})
        parser.add_argument(flag, dest=key, default=None, help=f"{text} (default: {default})", **extra)
    return parser


def summary_text(rows, report, seconds):
    """A few readable lines: start, end, and the first group of the first batch."""
    first, last = rows[1], rows[-1]  # rows[0] is the initial evaluation: nothing sampled yet
    trained = rows[1:]
    settings = report["settings"]
    lines = [
        f"online {settings['loss']} ({settings['reduction']} reduction), {settings['steps']} iterations of "
        f"{settings['prompts']} prompts x {settings['group_size']} responses, seed {settings['seed']}",
        f"  exact success probability {report['initial_success_probability']:.4f} -> {last['success_probability']:.4f}",
        f"  sampled success rate {first['success_rate']:.3f} (first batch) -> {last['success_rate']:.3f} (last batch); "
        f"mean response length {first['mean_response_length']:.2f} -> {last['mean_response_length']:.2f}",
        f"  last iteration: kl_k3 {last['kl_k3']:.4f}, clip_fraction {last['clip_fraction']:.4f}; mean over the "
        f"run: clip_fraction {math.fsum(row['clip_fraction'] for row in trained) / len(trained):.4f} (outside the "
        f"clip range: {math.fsum(row['outside_clip_range_fraction'] for row in trained) / len(trained):.4f}); "
        f"{last['total_tokens_sampled']} tokens sampled",
        f"  training loop {seconds:.2f} s, {last['total_tokens_sampled'] / seconds:,.0f} tokens/s (sampling, scoring "
        "and updates; machine-dependent, so printed here and kept out of the files, which stay byte-identical)",
        "  first group of the first batch:",
    ]
    for item in report["first_batch"][: settings["group_size"]]:
        lines.append(
            f"    prompt {item['prompt']} (answer {item['answer']}): {item['response']:<18s} "
            f"{'truncated ' if item['truncated'] else ''}reward {item['reward']:.2f} advantage {item['advantage']:+.3f}"
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {key: getattr(args, key) for key, _, _ in FLAGS.values() if getattr(args, key) is not None}
    run_config = {**DEFAULTS, **overrides}
    positions = run_config["prompts"] * run_config["group_size"] * run_config["max_new_tokens"]
    if positions > MAX_TOKEN_POSITIONS:
        parser.error(f"argument --prompts: --prompts x --group-size x --max-new-tokens = {positions} token positions "
                     f"per batch, more than {MAX_TOKEN_POSITIONS} (about 0.5 GB); lower one of them")
    output = f"results-online-{run_config['loss']}-{run_config['reduction']}" if args.output is None else args.output
    output_folder_or_exit(parser, output, ["online.csv", "online.json"])
    state = setup(**overrides)  # outside the clock: torch's first optimizer construction costs ~0.8 s
    started = time.perf_counter()
    try:
        rows, report = run(state)
    except TrainingDiverged as error:  # nothing was written: the files come only after the training
        print(f"{parser.prog}: error: training diverged: {error}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    csv_path, json_path = os.path.join(output, "online.csv"), os.path.join(output, "online.json")
    write_files({csv_path: csv_text(rows, COLUMNS), json_path: json_text(report)})
    print(summary_text(rows, report, seconds), end="")
    print(f"-> {csv_path}, {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
