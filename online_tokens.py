"""Online RL on a tiny autoregressive policy: sample, verify, update, token by token. PPO with a critic,
online DPO, GRPO, CISPO, GSPO and SAPO on one task, with the field's switches (RLOO, Dr. GRPO, DAPO,
dual-clip, k1/k2/k3, KL in the loss or the reward, truncation, sampler mismatch and TIS), and the second
wave registered in online_registry.py (DPPO, GMPO, Clip-Cov, KL-Cov, DRO, GPG, TOPR, CE-GPPO, VESPO,
LUSPO; MaxRL, REINFORCE++, OPO, pass@k, GDPO; rollout correction, off-policy and M2PO masks, k3-is/k3+/k1+,
the entropy bonus, its adaptive coefficient and the high-entropy mask).

    python online_tokens.py                              # GRPO -> results-online-grpo-sequence/online.{csv,json}
    python online_tokens.py --algorithm cispo            # -> results-online-cispo-sequence/
    python online_tokens.py --algorithm ppo              # PPO + GAE with a critic -> results-online-ppo/
    python online_tokens.py --algorithm all              # PPO, DPO, GRPO, CISPO at one budget -> results-online-all/
    python online_tokens.py --algorithm dppo-tv --advantage maxrl   # -> results-online-dppo-tv-token-advantage-maxrl/

The loop of RL with a verifiable reward (RLVR), on a CPU in a fraction of a second. The task (tasks.py):
the prompt is a number n in 0..5 and the correct answer is n in binary followed by EOS; a rule-based
verifier scores each response. The policy (policies.py) is a table of next-token logits indexed by
(prompt, position, previous token), all zeros at the start. Each iteration samples B prompts x G
responses token by token from a frozen snapshot (the old policy), scores them, computes the algorithm's
credit and updates the policy; online.csv (row 0 = the initial evaluation, then one row per iteration)
and online.json (settings, the TRL and verl options that do the same, the first batch decoded, the final
row) record it. The settings are declared once in online_settings.py, the algorithms and their loss
registries live in online_algorithms.py: this file is the loop, read top to bottom.

Shape notation (as in rl_lab.py): B prompts, G group size, N = B*G responses, R completion positions
(max_new_tokens), V vocabulary.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass

from lab.io import (
    OneLineErrorParser,
    Progress,
    csv_text,
    flags_first,
    json_text,
    output_file_or_exit,
    output_folder_or_exit,
    run_cli,
    separate_outputs_or_exit,
    write_files,
)
from library_export import VERL_DATA, VERL_MODEL, export_trl, export_verl
from lab.settings import SettingError, add_arguments, given_options, help_text
from online_registry import ALGORITHMS, FOUR_ALGORITHMS, family_of
from online_settings import (
    APPLIES, BY_NAME, LAST_ITERATIONS, SETTINGS, TARGET_SUCCESS, TASK_DEFAULTS, TASK_MIN_NEW_TOKENS, default_output,
    resolve, settings_block)
import task_data

MAX_GRAD_NORM = 1.0
EXPORTS = {"trl": export_trl, "verl": export_verl}  # --export LIBRARY FILE


# ---------------------------------------------------------------------------------------------
# Command line: every flag from the settings' declarations, first, so that --help and a bad flag answer
# before torch is loaded
# ---------------------------------------------------------------------------------------------


def build_parser():
    parser = OneLineErrorParser(
        prog="online_tokens.py",
        description="Online RL of a tiny autoregressive policy with a rule-based verifier: PPO (critic + GAE), "
                    "online DPO and its family, GRPO, CISPO, GSPO, SAPO and every loss and advantage registered "
                    "in online_registry.py (DPPO, GMPO, Clip-Cov, KL-Cov, DRO, GPG, TOPR, CE-GPPO, VESPO, LUSPO; "
                    "MaxRL, REINFORCE++, OPO, pass@k, GDPO, GPG), with the field's switches; writes "
                    "online.csv and online.json (per algorithm, plus a comparison table for --algorithm all). "
                    "Every option is off (or the first release's value) by default; one that does not apply "
                    "to the algorithm is an error.",
    )
    algorithm = BY_NAME["algorithm"]
    parser.add_argument("--algorithm", choices=ALGORITHMS + ("all",), default=None,
                        help=help_text(dataclasses.replace(
                            algorithm, help="what to train; 'all' = ppo, dpo, grpo, cispo from the same initial "
                                            "policy at the same budget (B*G responses per iteration)")))
    add_arguments(parser, [with_algorithms(item) for item in SETTINGS if item.name != "algorithm"])
    parser.add_argument("--export", nargs=2, metavar=("LIBRARY", "FILE"), default=None,
                        help="instead of training, write FILE: with LIBRARY trl, a runnable TRL 1.16 script of this "
                             "run's settings (the GRPO family, DPO offline and online; either task; it reads the "
                             "folder of --export-data and takes --model); with verl, the verl 0.9.1 launch command "
                             "with its overrides (see library_export.py); FILE's folder is created if missing "
                             "(default: off, train)")
    parser.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                        help="with --export verl: the Hugging Face model (a hub name or a local folder) the launch "
                             "trains, its learning rate, batch and lengths set for a pretrained model (default: "
                             f"{VERL_MODEL})")
    parser.add_argument("--export-data-dir", default=None, metavar="DIR",
                        help="with --export verl: the folder of --export-data's train.parquet, test.parquet and "
                             f"rl_lab_verifier.py that the launch reads (default: {VERL_DATA})")
    parser.add_argument("--export-data", metavar="DIR", default=None,
                        help="instead of training, write the task's prompts into DIR as the libraries read them: "
                             "train/test.jsonl (TRL, datasets), train/test.parquet (verl's schema) and "
                             "rl_lab_verifier.py (the text verifier: TRL's reward_func, verl's compute_score); "
                             "see task_data.py. The parquet files need pyarrow (requirements-bridge.txt): without "
                             "it the export exits 2 and writes nothing (default: off, train)")
    parser.add_argument("--output", default=None,
                        help="the output folder (default: results-online-<algorithm>-<reduction> for the GRPO "
                             "family, results-online-<algorithm> for ppo and dpo, results-online-all for all, each "
                             "followed by every option that differs from its default, e.g. "
                             "results-online-grpo-sequence-advantage-rloo; created when the files are written)")
    return parser


def with_algorithms(item):
    """The setting with the algorithms (and the policy) it applies to in front of its help, unless it applies
    to all."""
    where = "" if APPLIES[item.name] == ALGORITHMS else ", ".join(APPLIES[item.name])
    if item.policies is not None:
        where = f"{where} ({' or '.join(item.policies)} policy)" if where else f"{' or '.join(item.policies)} policy"
    if item.requires is not None:
        flag = BY_NAME[item.requires[0]].option
        values = [value for value in item.requires[1] if not isinstance(value, bool)]
        where += f" with {flag} {' or '.join(values)}" if values else f" with {flag}"
    return dataclasses.replace(item, help=f"{where.strip()}: {item.help}") if where else item


def options_from(parser, args):
    """(algorithm or "all", the options given); every option checked against every algorithm it will
    train with, or exit 2 with one line naming the flag."""
    options = given_options(args, [item for item in SETTINGS if item.name != "algorithm"])
    algorithm = args.algorithm or BY_NAME["algorithm"].default
    for name in FOUR_ALGORITHMS if algorithm == "all" else (algorithm,):
        try:
            resolve({**options, "algorithm": name})
        except SettingError as error:
            parser.error(f"argument {error.flag}: {error.reason}")
    return algorithm, options


def export_text_or_exit(parser, algorithm, options, library, path, launch):
    """The TRL script or the verl command of these settings, or exit 2 with one line when the library has no
    trainer for them or the path cannot be written. `launch` holds --model and --export-data-dir (the verl
    export's)."""
    if library not in EXPORTS:
        parser.error(f"argument --export: expected trl or verl, got {library!r}")
    if algorithm == "all":
        parser.error("argument --export: one algorithm at a time (not all)")
    given = {key: value for key, value in launch.items() if value is not None}
    if library != "verl" and given:
        parser.error(f"argument --{next(iter(given)).replace('_', '-')}: only with --export verl")
    output_file_or_exit(parser, path, flag="--export")
    settings = dataclasses.asdict(resolve({**options, "algorithm": algorithm})) | {"max_grad_norm": MAX_GRAD_NORM}
    try:
        return EXPORTS[library](settings, **given)
    except ValueError as error:
        parser.error(f"argument --export: {error}")


def launch_of(args):
    """The verl export's --model and --export-data-dir, as export_verl's keyword arguments."""
    return {"model": args.model, "data_dir": args.export_data_dir}


def data_settings_or_exit(parser, args):
    """(task, max_new_tokens) of --export-data, or exit 2 with one line when another setting than the task's
    is given, pyarrow is missing or the folder cannot be written."""
    options = given_options(args, SETTINGS)
    others = [BY_NAME[name].option for name in options if name not in ("task", "max_new_tokens")]
    others += [flag for flag, value in (("--export", args.export), ("--output", args.output), ("--model", args.model),
                                        ("--export-data-dir", args.export_data_dir)) if value is not None]
    if others:
        parser.error(f"argument --export-data: takes only --task and --max-new-tokens (it writes the task's "
                     f"prompts), got {' '.join(others)}")
    task = options.get("task", BY_NAME["task"].default)
    max_new_tokens = options.get("max_new_tokens", TASK_DEFAULTS[task]["max_new_tokens"])
    if max_new_tokens < TASK_MIN_NEW_TOKENS[task]:
        parser.error(f"argument --max-new-tokens: expected at least {TASK_MIN_NEW_TOKENS[task]} for the {task} task "
                     f"(its longest correct response), got {max_new_tokens}")
    if task_data.pyarrow_missing():
        parser.error(f"argument --export-data: {task_data.PYARROW_NEEDED}")
    output_folder_or_exit(parser, args.export_data, task_data.DATA_FILES, flag="--export-data")
    return task, max_new_tokens


def parse(argv=None):
    """The flags, with every check made before any work: each option against every algorithm it trains with,
    the export, the output folders (a bad one exits 2 with one line naming the flag)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.export_data is not None:  # the data has no policy or algorithm: a run's checks do not apply
        data_settings_or_exit(parser, args)
        return args
    algorithm, options = options_from(parser, args)
    for flag, value in (("--model", args.model), ("--export-data-dir", args.export_data_dir)):
        if value is not None and (not value.strip() or any(ord(character) < 32 for character in value)):
            parser.error(f"argument {flag}: expected a name or path, non-empty and without control characters (a "
                         f"newline would end the script's comment), got {value!r}")
    if args.export is not None:
        if args.output is not None:  # an export trains nothing, so it would write nothing there
            parser.error("argument --output: not with --export, which writes only its FILE and trains nothing")
        export_text_or_exit(parser, algorithm, options, *args.export, launch=launch_of(args))
        return args
    for flag, value in (("--model", args.model), ("--export-data-dir", args.export_data_dir)):
        if value is not None:  # the lab trains its own policy on its own task: the flag would change nothing
            parser.error(f"argument {flag}: only with --export verl")
    output = default_output(algorithm, options) if args.output is None else args.output
    names = FOUR_ALGORITHMS if algorithm == "all" else (algorithm,)
    output_folder_or_exit(parser, output, ["comparison.csv", "comparison.md"] if algorithm == "all" else
                          ["online.csv", "online.json"])
    if algorithm == "all":  # each algorithm's folder too, before any training
        for name in names:
            output_folder_or_exit(parser, os.path.join(output, name), ["online.csv", "online.json"])
    cfg = resolve({**options, "algorithm": names[0]})
    if cfg.policy == "transformer":  # a transformer's SFT cache is written there when it is trained
        output_folder_or_exit(parser, cfg.sft_folder, flag="--sft-folder")
        separate_outputs_or_exit(parser, {"--sft-folder": cfg.sft_folder, "--output": output})
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch, the policies and the atoms after the flags: `import torch` takes a second or more, --help none of it
import torch

from lab.checks import dtype_name, exp_limit, torch_threads, training_mode
from online_algorithms import FAMILIES, groups_tie, mean_of
import policies
from policies import POLICIES, entropies, logps_of_tokens
from rl_lab import DEVICE, completion_mask, masked, optimizer_step, token_kl_penalty
from tasks import TASKS


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
# a transformer's task has a test split; its sampler runs apart from the trainer (KV cache, another precision)
TRANSFORMER_COLUMNS = ["test_success_probability", "sampler_logp_diff_mean", "sampler_logp_diff_max", "sampler_kl"]
# with a reward that is not the verifier's, the batch's mean of each: the one trained on and the correct one
LOOPHOLE_COLUMNS = ["proxy_reward_mean", "true_reward_mean"]
RANDOM_REWARD_COLUMNS = ["true_reward_mean"]
INTEGER_COLUMNS = ("step", "optimizer_steps", "responses_sampled", "tokens_sampled", "total_tokens_sampled",
                   "filtered_groups", "extra_responses", "masked_truncated", "pairs", "tied_prompts")


# ---------------------------------------------------------------------------------------------
# Setup: the run's settings, task, policy, frozen reference, algorithm, optimizer and generator
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    """Everything a run holds. The reference is a frozen copy of the initial policy; the algorithm owns
    what it trains besides the policy (PPO's critic); the generator is the run's one seeding point;
    evaluation holds the correct responses of the prompts evaluated exactly after every update."""

    cfg: object
    task: object
    policy: object
    reference: object
    algorithm: object
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    evaluation: dict  # split -> solution_batch(...) of its evaluated prompts
    columns: list  # the CSV columns of this run: COLUMNS, and TRANSFORMER_COLUMNS for a transformer
    optimizer_steps: int = 0
    total_tokens: int = 0


def setup(**options):
    """A Run from keyword settings (see online_settings.OnlineConfig); raises ValueError naming a bad one.
    A transformer run loads (or first trains) its SFT warm start here; progress lines go to `progress`."""
    progress = options.pop("progress", None)
    cfg = resolve(options)
    task = TASKS[cfg.task](cfg.max_new_tokens)
    policy = POLICIES[cfg.policy](cfg, task, progress=progress)
    family = FAMILIES[family_of(cfg.algorithm)]
    generator = torch.Generator(device=DEVICE).manual_seed(cfg.seed)
    algorithm = family(cfg, policy.critic(cfg.cap_value) if family.needs_critic else None, generator)
    splits = ("train",) if task.prompt_count("test") == 0 else ("train", "test")
    exact = policy.exact  # a table is evaluated exactly on every prompt; a transformer on a fixed draw
    return Run(
        cfg=cfg, task=task, policy=policy, reference=policy.snapshot(), algorithm=algorithm,
        optimizer=torch.optim.Adam(policy.parameters() + algorithm.parameters(), lr=cfg.learning_rate),
        generator=generator,
        evaluation={split: solution_batch(task, evaluated_prompts(task, split, None if exact else cfg.eval_prompts),
                                          cfg.max_new_tokens) for split in splits},
        # the second wave's switches add their own columns, only when they are on
        columns=COLUMNS + ([] if exact else TRANSFORMER_COLUMNS) + reward_columns(cfg) + algorithm.extra_columns,
    )


def reward_columns(cfg):
    """The columns of a run whose reward is not the verifier's (none for the others)."""
    if cfg.verifier_loophole is not None:
        return LOOPHOLE_COLUMNS
    return RANDOM_REWARD_COLUMNS if cfg.random_reward is not None else []


def _check_run(state):
    if not isinstance(state, Run):
        raise ValueError(f"state: expected the Run returned by online_tokens.setup(), got {type(state).__name__}")


# ---------------------------------------------------------------------------------------------
# Rollout: sample responses token by token, score them, cache what the update needs
# ---------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """What the rollout hands to the credit and the update, all without grad.

    prompts (N,) int64 prompt-major (prompt i's responses at i*G .. i*G+G-1); completion_ids (N, R) int64,
    PAD after the first EOS; real (N, R) bool, up to and including the first EOS; truncated (N,) bool;
    rewards (N,) float64, the verifier's; sampler_logps (N, R), the sampler's log-probs of its tokens;
    mask (N, R) int64, the tokens a loss counts (= real); old_logps / ref_logps (N, R), the old and the
    reference policy's log-probs at the trainer's temperature; old_entropy (N, R), the old policy's
    entropy at each position; kl_reference, KL(old || reference) over whole responses estimated on the
    batch (`kl_per_response`); scores (N,), the reward the credit uses (the algorithm's `scores`);
    responses_sampled, tokens_sampled: the budget spent, resampled responses included; filtered_groups:
    groups dropped by dynamic sampling; reward_components (N, K), the task's rewards one by one (only for an
    advantage that reads them); true_rewards (N,) float64, the correct verifier's, where `rewards` are another
    (--random-reward, --verifier-loophole; None otherwise)."""

    prompts: torch.Tensor
    completion_ids: torch.Tensor
    real: torch.Tensor
    truncated: torch.Tensor
    rewards: torch.Tensor
    sampler_logps: torch.Tensor
    mask: torch.Tensor = None
    old_logps: torch.Tensor = None
    ref_logps: torch.Tensor = None
    old_entropy: torch.Tensor = None
    kl_reference: float = 0.0
    scores: torch.Tensor = None
    responses_sampled: int = 0
    tokens_sampled: int = 0
    filtered_groups: int = 0
    reward_components: torch.Tensor = None
    true_rewards: torch.Tensor = None


def kl_per_response(logits, ref_logits, mask):
    """KL(policy || reference) over whole responses in nats, estimated on responses the policy sampled:
    by the chain rule it is E_y[sum_t KL(p(.|y<t) || q(.|y<t))], so each response contributes the sum
    over its kept positions of the full categorical KL at the prefix it reached (Rao-Blackwellized: no
    variance from the token drawn at t). logits, ref_logits (N, R, V); mask (N, R). Returns the mean
    over responses (a float)."""
    logp, ref_logp = torch.log_softmax(logits, dim=-1), torch.log_softmax(ref_logits, dim=-1)  # (N, R, V)
    per_position = (logp.exp() * (logp - ref_logp)).sum(dim=-1)  # (N, R)
    return masked(per_position, mask).sum(dim=1).mean().item()


def sample_groups(state, sampler, prompt_count):
    """`prompt_count` prompts x G responses from the frozen `sampler`, verified: a Batch of the rollout's fields."""
    prompts = state.task.draw_prompts(prompt_count, state.generator)  # (B,)
    prompts = prompts.repeat_interleave(state.cfg.group_size)  # (B,) -> (B*G,), prompt-major
    temperature, top_p = state.algorithm.sampler()
    samples = sampler.sample(prompts, state.generator, temperature=temperature, top_p=top_p)
    if state.cfg.verifier_loophole is None:
        rewards = state.task.rewards(prompts, samples.completion_ids, samples.real, samples.truncated)
    else:  # the flawed verifier's: the reward trained on is a proxy (the correct one is kept in `rollout`)
        rewards = state.task.rewards(prompts, samples.completion_ids, samples.real, samples.truncated,
                                     loophole=state.cfg.verifier_loophole)
    if state.cfg.random_reward is not None:  # spurious: drawn whatever the answer, from the run's one generator
        draws = torch.rand(rewards.shape, generator=state.generator, dtype=rewards.dtype)  # (B*G,)
        rewards = (draws < state.cfg.random_reward).to(rewards.dtype)
    return Batch(prompts, samples.completion_ids, samples.real, samples.truncated, rewards, samples.sampler_logps)


def _rows(batch, rows):
    """The batch's rollout fields at `rows`."""
    return Batch(batch.prompts[rows], batch.completion_ids[rows], batch.real[rows], batch.truncated[rows],
                 batch.rewards[rows], batch.sampler_logps[rows])


def _concat(parts):
    return Batch(*(torch.cat([getattr(part, name) for part in parts]) for name in
                   ("prompts", "completion_ids", "real", "truncated", "rewards", "sampler_logps")))


def rollout(state):
    """Sample B prompts x G responses from a frozen snapshot (the current policy, or the initial one for
    offline DPO), score them and cache what the update needs (see `Batch`).

    With dynamic sampling (DAPO, arXiv 2503.14476, sec. 3.2, eq. 11), groups whose rewards all tie are
    dropped and new batches of B prompts are drawn, up to max_resample_rounds more, until B groups vary
    (if they never do, the batch is filled with the last tied groups, which teach nothing); every
    response drawn counts in the budget.
    """
    _check_run(state)
    cfg = state.cfg
    old = (state.reference if cfg.offline else state.policy).snapshot()
    parts = [sample_groups(state, old, cfg.prompts)]
    responses_sampled = cfg.prompts * cfg.group_size
    tokens_sampled = int(parts[0].real.sum().item())
    filtered_groups = 0
    if cfg.dynamic_sampling:
        kept, spare = [], []
        for round_index in range(cfg.max_resample_rounds + 1):
            if round_index > 0:
                parts.append(sample_groups(state, old, cfg.prompts))
                responses_sampled += cfg.prompts * cfg.group_size
                tokens_sampled += int(parts[-1].real.sum().item())
            varies = (~groups_tie(parts[-1].rewards, cfg.group_size)).tolist()
            filtered_groups += varies.count(False)
            kept += [(len(parts) - 1, group) for group, ok in enumerate(varies) if ok]
            spare += [(len(parts) - 1, group) for group, ok in enumerate(varies) if not ok]
            if len(kept) >= cfg.prompts:
                break
        chosen = (kept + spare[::-1])[: cfg.prompts]  # the groups that vary first, in the order drawn
        offsets = [sum(part.prompts.shape[0] for part in parts[:index]) for index in range(len(parts))]
        rows = torch.cat([torch.arange(group * cfg.group_size, (group + 1) * cfg.group_size) + offsets[part_index]
                          for part_index, group in chosen])
        batch = _rows(_concat(parts), rows)
    else:
        batch = parts[0]
    batch.mask = completion_mask(batch.completion_ids, state.task.eos_id, batch.real, check=False)  # (N, R)
    if reward_columns(cfg):  # the reward trained on is not the verifier's: keep the verifier's beside it
        batch.true_rewards = state.task.rewards(batch.prompts, batch.completion_ids, batch.real, batch.truncated)
    if state.algorithm.reward_components:  # an advantage that normalizes each of the task's rewards apart
        batch.reward_components = state.task.reward_components(batch.prompts, batch.completion_ids, batch.real,
                                                               batch.truncated)  # (N, K)
    with torch.no_grad():
        # from the same tempered logits the update uses: the ratio is exactly 1 at first
        old_logits = old.logits(batch.prompts, batch.completion_ids)  # (N, R, V)
        batch.old_logps = logps_of_tokens(old_logits, batch.completion_ids)
        batch.old_entropy = entropies(old_logits)
        ref_logits = state.reference.logits(batch.prompts, batch.completion_ids)
        batch.ref_logps = logps_of_tokens(ref_logits, batch.completion_ids)
        batch.kl_reference = kl_per_response(old_logits, ref_logits, batch.mask)
    kept = batch.mask.bool()
    for name in ("sampler_logps", "old_logps", "ref_logps"):  # a sampler in float16 can overflow, for one
        if not bool(torch.isfinite(getattr(batch, name)[kept]).all()):
            raise TrainingDiverged(f"the batch's {name} are not finite: the policy's logits overflow "
                                   f"{getattr(batch, name).dtype} (lower --lr, or sample in another --sampler-dtype)")
    batch.responses_sampled, batch.tokens_sampled, batch.filtered_groups = (
        responses_sampled, tokens_sampled, filtered_groups)
    batch.scores = state.algorithm.scores(batch)
    return batch


# ---------------------------------------------------------------------------------------------
# Advantages: the algorithm's credit (group-relative, per token through a critic, or pairs)
# ---------------------------------------------------------------------------------------------


def credit(state, batch):
    """The algorithm's credit of a batch: GroupCredit, TokenCredit or PairCredit (online_algorithms.py)."""
    _check_run(state)
    return state.algorithm.credit(batch)


# ---------------------------------------------------------------------------------------------
# Update: a few Adam steps on the algorithm's loss of one batch
# ---------------------------------------------------------------------------------------------


class TrainingDiverged(FloatingPointError):
    """The policy moved so far within one batch that a ratio or the k3 term overflows exp()."""


def check_exponents(logps, batch, kept):
    """Raise TrainingDiverged before exp() of a log-ratio (ratio) or of ref - logp (k3) overflows."""
    limit = exp_limit(logps.dtype)  # about 708.8 nats in float64: the atoms' own limit
    if not bool(kept.any()):
        return
    largest = max((logps - batch.old_logps)[kept].max().item(), (batch.ref_logps - logps)[kept].max().item())
    if largest > limit:
        raise TrainingDiverged(
            f"a log-ratio of {largest:.0f} nats overflows exp(): the policy moved too far within one batch "
            "(lower --lr or --updates-per-batch, or raise --temperature)"
        )


def clip_grad_norm_step(state, loss):
    """Backward, one gradient-norm clip over every trained tensor (actor and critic), one Adam step."""
    optimizer_step(state.optimizer, state.policy.parameters() + state.algorithm.parameters(), loss, MAX_GRAD_NORM)
    state.optimizer_steps += 1


def update(state, batch, batch_credit):
    """updates_per_batch Adam steps on the algorithm's loss of one batch. Returns the update's columns:
    the mean loss over the passes, the range of the ratios the passes saw (per kept token, or per
    sequence for GSPO) and the mean of each diagnostic; {} when the batch teaches nothing (no step)."""
    _check_run(state)
    if tuple(batch.completion_ids.shape) != (state.cfg.prompts * state.cfg.group_size, state.cfg.max_new_tokens):
        raise ValueError("batch: expected a batch of this run's shape, from rollout(state)")
    if not batch_credit.teaches():
        return {}
    kept = batch_credit.loss_mask.bool()
    losses, ratios, passes = [], [], []
    for epoch in range(state.cfg.updates_per_batch):
        logits = state.policy.logits(batch.prompts, batch.completion_ids)  # (N, R, V)
        logps = logps_of_tokens(logits, batch.completion_ids)
        check_exponents(logps.detach(), batch, kept)
        loss, diagnostics, ratio = state.algorithm.loss(logps, batch, batch_credit, first_pass=epoch == 0,
                                                        logits=logits)
        clip_grad_norm_step(state, loss)
        losses.append(loss.item())
        passes.append(diagnostics)
        if ratio is not None:
            ratios.append(ratio)
    summary = {"loss": mean_of(losses)}
    if ratios:
        all_ratios = torch.cat(ratios)
        summary.update(ratio_min=all_ratios.min().item(), ratio_max=all_ratios.max().item())
    for name in passes[0]:
        summary[name] = mean_of([diagnostics[name] for diagnostics in passes])
    return summary


# ---------------------------------------------------------------------------------------------
# Record: exact evaluation, one row per iteration, and the run
# ---------------------------------------------------------------------------------------------


def evaluated_prompts(task, split, count=None):
    """The prompts of `split` evaluated after every update: all of them, or `count` of them drawn once
    by a generator of their own (seed 0), so that every run of a task is measured on the same ones."""
    prompts = task.split_prompts(split)
    if count is None or count >= prompts.numel():
        return prompts
    return prompts[torch.randperm(prompts.numel(), generator=torch.Generator().manual_seed(0))[:count]].sort().values


def solution_batch(task, prompts, max_new_tokens):
    """The correct responses of `prompts` as one batch: (owner (M,) the position in `prompts` of each
    solution's prompt, prompts (M,) its global index, ids (M, L) PAD after the EOS, real (M, L) bool,
    reachable (M,) bool: it fits in max_new_tokens, count: len(prompts)). L is the longest solution,
    cut to max_new_tokens."""
    owner, indices, solutions = [], [], []
    for position, prompt in enumerate(prompts.tolist()):
        for solution in task.solutions(prompt):
            owner.append(position)
            indices.append(prompt)
            solutions.append(solution)
    length = min(max(len(solution) for solution in solutions), max_new_tokens)
    ids = torch.full((len(solutions), length), task.pad_id, dtype=torch.long, device=DEVICE)
    real = torch.zeros(len(solutions), length, dtype=torch.bool, device=DEVICE)
    for row, solution in enumerate(solutions):
        ids[row, : min(len(solution), length)] = torch.tensor(solution[:length])
        real[row, : min(len(solution), length)] = True
    reachable = torch.tensor([len(solution) <= max_new_tokens for solution in solutions])
    return torch.tensor(owner), torch.tensor(indices), ids, real, reachable, len(prompts)


def success_by_prompt(policy, solutions):
    """(P,) exact p(a correct response) of each prompt of a solution_batch: the sum over its solutions of
    the product of their token probabilities (teacher forcing, no sampling), with the positions the
    sampler uses (so that --position-ids arange measures the model as it answers, not as it is scored)."""
    owner, prompts, ids, real, reachable, count = solutions
    with torch.no_grad():
        logps = logps_of_tokens(policy.logits(prompts, ids, positions="mask"), ids)  # (M, L): as it samples
        path = masked(masked(logps, real).sum(dim=1).exp(), reachable)  # (M, L) -> (M,)
        return torch.zeros(count, dtype=path.dtype).index_add_(0, owner, path)  # (M,) -> (P,)


def evaluate(state, batch=None):
    """The evaluation columns of the policy after an update: the exact success probability on the train
    prompts (and the test prompts of a task that has them), and the KL to the reference over whole
    responses, exact for a table, estimated on the batch for a transformer (see `kl_per_response`)."""
    columns = {"success_probability": success_by_prompt(state.policy, state.evaluation["train"]).mean().item()}
    if "test" in state.evaluation:
        columns["test_success_probability"] = success_by_prompt(state.policy, state.evaluation["test"]).mean().item()
    if state.policy.exact:
        columns["kl_reference"] = state.policy.response_kl(state.reference)
    else:  # the policy that sampled the batch (before this update); 0 before any batch
        columns["kl_reference"] = 0.0 if batch is None else batch.kl_reference
    return columns


def record(state, batch, batch_credit, update_columns, step):
    """One CSV row: batch statistics (the responses the update used), the budget (every response and
    token drawn, resampled ones included), the algorithm's columns, the update's diagnostics, and the
    exact evaluation of the policy after the update."""
    kept = batch.mask.bool()
    # the verifier's verdicts (success, lengths of right and wrong answers), whatever reward was trained on
    rewards = batch.rewards if batch.true_rewards is None else batch.true_rewards
    lengths = batch.mask.sum(dim=1).tolist()
    correct = state.task.correct(rewards).tolist()
    with torch.no_grad():
        entropy = batch.old_entropy[kept].mean().item()
        kl_k3 = token_kl_penalty(batch.old_logps, batch.ref_logps, check=False)[kept].mean().item()
    row = {name: 0 if name in INTEGER_COLUMNS else 0.0 for name in state.columns}
    row.update({
        "step": step,
        "optimizer_steps": state.optimizer_steps,
        "responses_sampled": batch.responses_sampled,
        "tokens_sampled": batch.tokens_sampled,
        "total_tokens_sampled": state.total_tokens,
        "reward_mean": batch.rewards.mean().item(),
        "success_rate": state.task.correct(rewards).double().mean().item(),
        "partial_rate": state.task.partial(rewards).double().mean().item(),
        "mean_response_length": batch.mask.sum(dim=1).double().mean().item(),
        "mean_correct_length": mean_of([float(n) for n, ok in zip(lengths, correct) if ok]),
        "mean_wrong_length": mean_of([float(n) for n, ok in zip(lengths, correct) if not ok]),
        "truncated_fraction": batch.truncated.double().mean().item(),
        "zero_group_fraction": groups_tie(batch.rewards, state.cfg.group_size).double().mean().item(),
        "kl_k3": kl_k3,
        "entropy": entropy,
        "filtered_groups": batch.filtered_groups,
        "extra_responses": batch.responses_sampled - batch.prompts.shape[0],
        **evaluate(state, batch),
    })
    if batch.true_rewards is not None:
        row.update(proxy_reward_mean=batch.rewards.mean().item(), true_reward_mean=batch.true_rewards.mean().item())
    if not state.policy.exact:
        row.update(sampler_mismatch(batch))
    row.update(state.algorithm.columns(batch, batch_credit))
    row.update(update_columns)
    return {name: row[name] for name in state.columns}


def initial_row(state):
    """Row 0, the initial evaluation, as in every CSV of the lab: the exact evaluation of the initial
    policy; nothing is sampled or updated yet, so every other column is 0."""
    row = {name: 0 if name in INTEGER_COLUMNS else 0.0 for name in state.columns}
    row.update(evaluate(state))
    return row


def sampler_mismatch(batch):
    """How far the sampler's log-probs of its own tokens are from the trainer's (the old policy's, at the
    trainer's precision), over the kept tokens: mean and max |log p_sampler - log p_trainer|, and the
    sampled-token estimate of KL(sampler || trainer) per token, mean(log p_sampler - log p_trainer) (the
    tokens were drawn from the sampler). A KV cache in another precision is what makes them differ."""
    kept = batch.mask.bool()
    difference = (batch.sampler_logps.to(batch.old_logps.dtype) - batch.old_logps)[kept]
    return {"sampler_logp_diff_mean": difference.abs().mean().item(),
            "sampler_logp_diff_max": difference.abs().max().item(), "sampler_kl": difference.mean().item() + 0.0}


def decode_batch(state, batch, batch_credit, teaching=2):
    """A batch's groups in order, up to the `teaching`-th whose rewards vary (every group when fewer vary),
    as readable text: prompt, response, reward, the credit. The groups before it tie: their advantages are
    0, so an example of them alone would show nothing of the credit."""
    varies = (~groups_tie(batch.rewards, state.cfg.group_size)).nonzero().flatten().tolist()  # (B,) -> group ids
    groups = varies[teaching - 1] + 1 if len(varies) >= teaching else batch.prompts.shape[0] // state.cfg.group_size
    decoded = []
    for row in range(groups * state.cfg.group_size):
        ids = batch.completion_ids[row][batch.real[row]].tolist()
        decoded.append({
            **state.task.describe(batch.prompts[row]),
            "response": state.task.decode(ids),
            "truncated": bool(batch.truncated[row]),
            "reward": batch.rewards[row].item(),
            **state.algorithm.per_response(batch, batch_credit, row),
        })
    return decoded


def settings_of(state):
    """The JSON settings: the options that apply to the run's algorithm and policy, the task's own
    description (task_settings), the policy and the versions, then what the algorithm adds."""
    return {
        **settings_block(state.cfg),
        "task_settings": state.task.settings(),
        "policy_description": state.policy.description,
        "reference": "the initial policy, frozen",
        "old_policy": "a frozen snapshot taken before each batch is sampled",
        "optimizer": "Adam",
        "max_grad_norm": MAX_GRAD_NORM,
        "dtype": dtype_name(state.policy.parameters()[0].dtype),
        "device": str(DEVICE),
        "torch": torch.__version__,
        **state.algorithm.settings(),
    }


@training_mode()  # the updates need autograd, whatever the caller's grad mode (no_grad, inference_mode)
def train(**options):
    """Train the table policy online with one algorithm; return (rows, report).

    Keyword arguments are settings (online_settings.OnlineConfig). rows: row 0 (the initial evaluation),
    then one dict per iteration, with COLUMNS. report: settings, the TRL and verl options that do the
    same ("trl", "verl"), the exact initial success probability, the first batch decoded, and the final
    row. Raises ValueError naming a bad setting, TrainingDiverged if a ratio would overflow.
    """
    return run(setup(**options))


@training_mode()
@torch_threads(1)  # tiny tensors: more threads only wait for each other (see lab.checks.torch_threads)
def run(state, observe=None):
    """The training loop of `train` on a prepared `setup` Run: (rows, report).

    observe: None, or a function called as observe(state, batch, credit, row) after each iteration's
    record, for experiments that measure more than the row (it must not change the state).
    """
    _check_run(state)
    rows, first_batch = [initial_row(state)], None
    before = sampled_evaluation(state)
    for step in range(1, state.cfg.steps + 1):
        batch = rollout(state)
        batch_credit = state.algorithm.credit(batch)
        if first_batch is None:
            first_batch = decode_batch(state, batch, batch_credit)
        update_columns = update(state, batch, batch_credit)
        state.total_tokens += batch.tokens_sampled
        rows.append(record(state, batch, batch_credit, update_columns, step))
        if observe is not None:
            observe(state, batch, batch_credit, rows[-1])
    report = {
        "settings": settings_of(state),
        **state.algorithm.library_blocks(dataclasses.asdict(state.cfg) | {"max_grad_norm": MAX_GRAD_NORM}),
        "initial_success_probability": rows[0]["success_probability"],
        "first_batch": first_batch,
        "final": rows[-1],
    }
    if before is not None:
        report["evaluation"] = {"before": before, "after": sampled_evaluation(state)}
    return rows, report


def sampled_evaluation(state):
    """For a policy that cannot be evaluated exactly everywhere (the transformer): pass@k and the rest of
    sft.sample_evaluation on every test prompt, from a generator of its own (seeded by the run's seed,
    so that the same draws serve before and after training and the training stream is left as it is).
    None for a table, or with eval_samples 0."""
    if state.policy.exact or state.cfg.eval_samples == 0:
        return None
    generator = torch.Generator().manual_seed(state.cfg.seed)
    return state.policy.sample_evaluation("test", state.cfg.eval_samples, generator)


# ---------------------------------------------------------------------------------------------
# Four algorithms at one budget: the comparison table
# ---------------------------------------------------------------------------------------------

COMPARISON_COLUMNS = [
    "algorithm", "final_success_probability", "best_success_probability", "iterations_to_0.9",
    "tokens_to_0.9", "mean_correct_length", "mean_wrong_length", "kl_reference", "responses_sampled",
    "optimizer_steps",
]


def run_summary(rows):
    """End-of-run statistics of an online run's rows: exact success (final, best), the first iteration
    and the sampled tokens at which it passed TARGET_SUCCESS (None: never), response lengths of right and
    wrong answers over the last iterations (iterations that sampled none left out), the exact KL to the
    reference, the budget used, and means of the diagnostics over the iterations."""
    reached = next((row for row in rows if row["success_probability"] >= TARGET_SUCCESS), None)
    last, trained = rows[-LAST_ITERATIONS:], rows[1:]
    return {
        "final_success_probability": rows[-1]["success_probability"],
        "best_success_probability": max(row["success_probability"] for row in rows),
        "iterations_to_0.9": reached["step"] if reached else None,
        "tokens_to_0.9": reached["total_tokens_sampled"] if reached else None,
        "mean_correct_length": mean_of([row["mean_correct_length"] for row in last if row["mean_correct_length"] > 0]),
        "mean_wrong_length": mean_of([row["mean_wrong_length"] for row in last if row["mean_wrong_length"] > 0]),
        "kl_reference": rows[-1]["kl_reference"],
        "responses_sampled": sum(row["responses_sampled"] for row in rows),
        "optimizer_steps": rows[-1]["optimizer_steps"],
        "total_tokens_sampled": rows[-1]["total_tokens_sampled"],
        "clip_fraction": mean_of([row["clip_fraction"] for row in trained]),
        "entropy_last": mean_of([row["entropy"] for row in last]),
        "zero_group_fraction": mean_of([row["zero_group_fraction"] for row in trained]),
    }


def comparison_row(algorithm, rows):
    """One line of the comparison table (-1: never reached 0.9 within the run)."""
    summary = run_summary(rows)
    row = {"algorithm": algorithm, **{name: summary[name] for name in COMPARISON_COLUMNS[1:]}}
    return {name: -1 if value is None else value for name, value in row.items()}


def markdown_table(rows, columns):
    """Rows of dicts as a Markdown table (floats with 4 decimals), ready for README."""
    def cell(value):
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row[name]) for name in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def first_teaching_group(first_batch, group_size):
    """(1-based index, its responses) of the first group in `first_batch` (the JSON's decoded responses,
    group after group) whose rewards vary; (None, the first group) when every group's rewards tie."""
    groups = [first_batch[start:start + group_size] for start in range(0, len(first_batch), group_size)]
    for index, group in enumerate(groups, start=1):
        if len({item["reward"] for item in group}) > 1:
            return index, group
    return None, groups[0]


def summary_text(rows, report, seconds):
    """A few readable lines: start, end, the budget, and the first group of the first batch whose rewards
    vary (an example of the credit: a tied group's group-relative advantages are all 0, and it gives DPO no
    pair; PPO's advantages come from its critic)."""
    first, last = rows[1], rows[-1]  # rows[0] is the initial evaluation: nothing sampled yet
    settings = report["settings"]
    lines = [
        f"online {settings['algorithm']}, {settings['steps']} iterations of {settings['prompts']} prompts x "
        f"{settings['group_size']} responses, seed {settings['seed']}",
        f"  exact success probability {report['initial_success_probability']:.4f} -> {last['success_probability']:.4f}"
        f"; exact KL to the reference {last['kl_reference']:.4f} nats per response",
        f"  sampled success rate {first['success_rate']:.3f} (first batch) -> {last['success_rate']:.3f} (last batch); "
        f"mean response length {first['mean_response_length']:.2f} -> {last['mean_response_length']:.2f}",
        f"  clip_fraction mean {mean_of([row['clip_fraction'] for row in rows[1:]]):.4f}; "
        f"{last['total_tokens_sampled']} tokens sampled in {sum(row['responses_sampled'] for row in rows)} responses",
        f"  training loop {seconds:.2f} s, {last['total_tokens_sampled'] / seconds:,.0f} tokens/s (sampling, scoring "
        "and updates; machine-dependent, so printed here and kept out of the files, which stay byte-identical)",
    ]
    index, group = first_teaching_group(report["first_batch"], settings["group_size"])
    family = family_of(settings["algorithm"])
    if index is None:
        consequence = {"group": ": every advantage is 0", "dpo": ": no group gives a preference pair",
                       "ppo": "; PPO's advantages come from its critic"}[family]
        lines.append(f"  first group of the first batch (no group's rewards vary in it{consequence}):")
    else:
        consequence = {"group": ", so {} advantages are 0", "dpo": ", so {} no preference pair",
                       "ppo": " (PPO's advantages come from its critic, not from the group)"}[family]
        one, several = {"group": ("its", "their"), "dpo": ("it gives", "they give"), "ppo": ("", "")}[family]
        before = {1: "", 2: "; group 1 ties" + consequence.format(one)}.get(
            index, f"; groups 1-{index - 1} tie" + consequence.format(several))
        lines.append(f"  group {index} of {settings['prompts']} in the first batch, the first whose rewards "
                     f"vary{before}:")
    for item in group:
        advantage = f" advantage {item['advantage']:+.3f}" if "advantage" in item else ""
        lines.append(
            f"    prompt {item['prompt']} (answer {item['answer']}): {item['response']:<18s} "
            f"{'truncated ' if item['truncated'] else ''}reward {item['reward']:.2f}{advantage}"
        )
    return "\n".join(lines) + "\n"


def _train_timed(options):
    # outside the clock: torch's first optimizer construction costs ~0.8 s, a transformer's first SFT ~30 s
    state = setup(**options, progress=Progress())
    started = time.perf_counter()
    rows, report = run(state)
    return rows, report, time.perf_counter() - started


def export(parser, algorithm, options, library, path, launch):
    """Write the TRL script or the verl command of these settings to `path` (no training); parse has
    checked them."""
    write_files({path: export_text_or_exit(parser, algorithm, options, library, path, launch)})
    print(f"{library} export of {algorithm} -> {path}")
    return 0


def export_data(parser, args):
    """Write the task's prompts and the text verifier into --export-data's folder (no training); parse has
    checked the settings."""
    task, max_new_tokens = data_settings_or_exit(parser, args)
    write_files(task_data.data_files(TASKS[task](max_new_tokens), args.export_data))
    print(f"{task} prompts -> {', '.join(os.path.join(args.export_data, name) for name in task_data.DATA_FILES)}")
    return 0


def main(argv=None):
    parser, args = build_parser(), parse(argv)
    if args.export_data is not None:
        return export_data(parser, args)
    algorithm, options = options_from(parser, args)
    if args.export is not None:
        return export(parser, algorithm, options, *args.export, launch=launch_of(args))
    output = default_output(algorithm, options) if args.output is None else args.output
    names = FOUR_ALGORITHMS if algorithm == "all" else (algorithm,)
    folders = {name: os.path.join(output, name) if algorithm == "all" else output for name in names}
    sft_folder = policies.sft_cache_folder(resolve({**options, "algorithm": names[0]}))
    if sft_folder is not None:  # its name holds the cache key, which needs the task: checked here, before training
        output_folder_or_exit(parser, sft_folder, policies.SFT_FILES, flag="--sft-folder")
    files, summaries, comparison, timings = {}, [], [], []
    for name in names:
        try:
            rows, report, seconds = _train_timed({**options, "algorithm": name})
        except FloatingPointError as error:  # TrainingDiverged, or a sampler's overflow: nothing was written yet
            print(f"{parser.prog}: error: training diverged ({name}): {error}", file=sys.stderr)
            return 1
        csv_path, json_path = os.path.join(folders[name], "online.csv"), os.path.join(folders[name], "online.json")
        files[csv_path] = csv_text(rows, list(rows[0]))
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
