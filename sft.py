"""Supervised fine-tuning (SFT) warm start of the tiny transformer on the task's demonstrations, its cache,
and the evaluation the RL loop reuses.

    python sft.py                                   # train (or load) the default SFT model, evaluate it
    python sft.py --steps 100 --output results-sft-short
    python -m unittest -v test_sft

`python sft.py` writes `results-sft/sft-<key>/{model.pt, config.json, report.json}` the first time (the
cache: a later run with the same settings loads it instead of training) and `results-sft/evaluation.json`
(pass@k, entropy, distinct correct answers, lengths, truncation on the train and test prompts).

Why a warm start: RL from verifiable rewards only learns from responses that are sometimes right. A
random transformer almost never writes a correct Countdown expression, so every group would score 0
and carry no gradient. SFT on demonstrations (mostly correct, several different correct answers per
prompt, some imperfect) gives a policy with a broad output distribution that solves some prompts but
not all: room for RL to raise pass@1, and for pass@k to show whether it keeps its diversity.

Read it top to bottom: the settings and the flags, turning (prompt, response) pairs into one padded batch, the loss
(next-token cross-entropy on completion tokens only), training, the cache, the evaluation, main().

Shape notation (as in tiny_lm.py): N sequences, T = P + R positions (P prompt positions, left-padded;
R response positions, right-padded), V vocabulary; S samples per prompt.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import os
import stat
import sys
import time

from lab.io import (
    OneLineErrorParser,
    Progress,
    flags_first,
    int_flag,
    json_text,
    output_folder_or_exit,
    run_cli,
    write_files,
)
from lab.settings import (
    SEED_LIMIT,
    SettingError,
    add_arguments,
    check_value,
    declared,
    given_options,
    setting,
)

# ---------------------------------------------------------------------------------------------
# Settings and the flags, first: --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------

EVALUATION_FILE = "evaluation.json"


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The settings of one SFT warm start; with the task's settings they are the cache key.

    JSON round trip: `SFTConfig(**json.loads(json.dumps(dataclasses.asdict(config))))`. Every field is
    checked when the object is built; a bad value raises `lab.settings.SettingError` (a ValueError whose
    message starts with the field's name). The model's vocabulary comes from the task, and so does its
    number of positions unless `max_len` is given.
    """

    # the model (tiny_lm.TinyLMConfig's fields; dropout stays 0: the sampler and the trainer must agree)
    # (the bounds keep a run within a few GB and an hour on a CPU: larger is another project)
    n_layer: int = setting(2, "transformer blocks", low=1, high=8)
    n_head: int = setting(4, "attention heads (d_model must be a multiple)", low=1, high=16)
    d_model: int = setting(48, "width of the residual stream", low=1, high=256)
    mlp_ratio: int = setting(4, "the MLP's hidden width is mlp_ratio * d_model", low=1, high=8)
    max_len: int = setting(None, "positions of the model; off: the task's longest prompt plus its response cap",
                           low=2, high=256, optional=True)
    # the data
    demonstrations: int = setting(20_000, "demonstrations drawn from the task's train prompts (mostly correct, "
                                  "some imperfect: the task's imperfect_share)", low=1, high=1_000_000)
    subtraction_share: float = setting(None, "share of the correct demonstrations that use a subtraction (a "
                                       "'-' among their operators); off: each prompt's solutions drawn uniformly "
                                       "(the task's own demonstrations)", low=0.0, high=1.0,
                                       optional=True)
    # the optimization
    steps: int = setting(1500, "Adam steps (0: the random initialization, untrained)", low=0, high=100_000)
    batch_size: int = setting(64, "demonstrations per step (drawn as shuffled passes over the set)",
                              low=1, high=4096)
    learning_rate: float = setting(3e-3, "Adam learning rate (betas 0.9, 0.95)", low=0.0, high=1.0, low_open=True,
                                   flag="--lr")
    warmup_steps: int = setting(30, "steps of linear warm-up to the learning rate, then cosine decay to "
                                "min_lr_ratio of it", low=0, high=100_000)
    min_lr_ratio: float = setting(0.1, "the learning rate at the last step, as a share of --lr", low=0.0, high=1.0)
    grad_clip: float = setting(1.0, "clip the global gradient norm to this", low=0.0, high=1e6, low_open=True)
    seed: int = setting(0, "seeds the demonstrations, the initial weights and the batch order (one generator)",
                        low=0, high=SEED_LIMIT - 1)

    def __post_init__(self):
        for item in declared(SFTConfig):
            object.__setattr__(self, item.name, check_value(item, getattr(self, item.name)))
        if self.d_model % self.n_head:
            raise SettingError("d_model", "--d-model", f"expected a multiple of n_head={self.n_head}, "
                                                       f"got {self.d_model}")

    def model_config(self, task):
        """The TinyLMConfig of the model for `task`: vocab from the task, positions from max_len or the task.
        Raises SettingError (a ValueError) naming max_len when it cannot hold a prompt and a full response."""
        needed = max_prompt_width(task) + task.max_new_tokens
        max_len = needed if self.max_len is None else self.max_len
        if max_len < needed:
            raise SettingError("max_len", "--max-len", f"expected at least {needed} (the task's longest prompt and "
                                                       f"its response cap of {task.max_new_tokens}), got {max_len}")
        return TinyLMConfig(vocab_size=len(task.vocab), n_layer=self.n_layer, n_head=self.n_head,
                            d_model=self.d_model, max_len=max_len, mlp_ratio=self.mlp_ratio)


SETTINGS = declared(SFTConfig)


def build_parser():
    parser = OneLineErrorParser(
        prog="sft.py",
        description="Train (or load from the cache in --output) the SFT warm start of the tiny transformer on "
                    "the default Countdown task, then evaluate it on the train and test prompts: pass@k, "
                    "entropy per token, distinct correct answers. Writes <output>/sft-<key>/ (the cache) and "
                    "<output>/evaluation.json.",
    )
    add_arguments(parser, SETTINGS)
    parser.add_argument("--samples", type=int_flag(1, 4096), default=64, metavar="SAMPLES",
                        help="responses sampled per prompt; pass@k is reported for k in 1, 4, 16, 64 up to it, "
                             "integer in [1, 4096] (default: 64)")
    parser.add_argument("--eval-seed", type=int_flag(0, SEED_LIMIT - 1), default=0, metavar="EVAL_SEED",
                        help="seed of the evaluation's sampling generator, integer in [0, 2**63 - 1] (default: 0)")
    parser.add_argument("--max-prompts", type=int_flag(1, 100_000), default=None, metavar="MAX_PROMPTS",
                        help="evaluate at most this many prompts per split, a random subset, integer in "
                             "[1, 100000] (default: every prompt)")
    parser.add_argument("--output", default="results-sft",
                        help="the folder of the cache and of evaluation.json (default: results-sft)")
    return parser


def config_from(parser, args):
    """The SFTConfig of the flags given, or exit 2 with one line naming the flag."""
    try:
        return SFTConfig(**given_options(args, SETTINGS))
    except SettingError as error:
        parser.error(f"argument {error.flag}: {error.reason}")


def parse(argv=None):
    """The flags, with the settings and the output checked before any work (a bad one exits 2 with one line).
    What depends on the task's prompts (a --max-len too short for them, the cache folder) is checked by
    main() once the task is built, still before any training."""
    parser = build_parser()
    args = parser.parse_args(argv)
    config_from(parser, args)
    output_folder_or_exit(parser, args.output, [EVALUATION_FILE])
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch, the task and the model after the flags: `import torch` takes a second or more, --help none of it
import torch

from countdown import CountdownTask, pass_at_k
from lab.checks import check_indices, check_int, check_real, check_tensor, dtype_name, torch_threads, training_mode
from tiny_lm import TinyLM, TinyLMConfig, completion_log_probs, completion_scores, generate

# Adam as language models are fine-tuned (GPT-3, nanoGPT): beta2 0.95 forgets old squared gradients
# faster than the default 0.999, which keeps the step size in check when the loss landscape shifts.
ADAM_BETAS = (0.9, 0.95)
ADAM_EPS = 1e-8
DTYPE = torch.float32  # SFT trains as an LM trainer does; the RL loop casts the weights to its own dtype
PROGRESS_LINES = 10  # progress lines (and points of the report's loss curve) per run
# the report's loss before and after training is over the first LOSS_ROWS demonstrations: a fixed set,
# cheap to score (the whole set would add seconds for a number that differs in the third digit)
LOSS_ROWS = 2048
CACHE_FORMAT = 1  # part of the cache key: raise it when training or the files change meaning
SFT_PREFIX = "sft-"
MODEL_FILE, CONFIG_FILE, REPORT_FILE = "model.pt", "config.json", "report.json"
KEY_LENGTH = 12  # hex digits of the cache key: 48 bits, no collision among any realistic number of settings
PASS_KS = (1, 4, 16, 64)
DEFAULT_BATCH_ROWS = 4096  # sequences per forward pass in the evaluation: about 20 MB of activations


def settings_of(config):
    """The SFT settings as a JSON-ready dict, without subtraction_share when it is off: a setting added
    after the cache existed stays out of the key of every model that does not use it, so those keep theirs."""
    settings = dataclasses.asdict(config)
    if settings["subtraction_share"] is None:
        del settings["subtraction_share"]
    return settings


def _check_task(task):
    for member in ("vocab", "max_new_tokens", "eos_id", "pad_id", "prompt_tokens", "solutions", "demonstrations",
                   "split_prompts", "prompt_count", "rewards", "correct", "difficulty", "settings"):
        if not hasattr(task, member):
            raise ValueError(f"task: expected a task with demonstrations and solutions (countdown.CountdownTask), "
                             f"got {type(task).__name__} without {member!r}")
    return task


def _check_config(config):
    if not isinstance(config, SFTConfig):
        raise ValueError(f"config: expected an SFTConfig, got {type(config).__name__}")
    return config


def _check_model(model):
    if not isinstance(model, TinyLM):
        raise ValueError(f"model: expected a TinyLM, got {type(model).__name__}")
    return model


def _prompt_list(task, name, prompts):
    """The global prompt indices `prompts` (a non-empty 1-D integer tensor or list of ints) as a list, each checked."""
    if not isinstance(prompts, torch.Tensor) and (not isinstance(prompts, (list, tuple)) or not prompts):
        raise ValueError(f"{name}: expected a non-empty 1-D integer tensor or list of prompt indices")
    return check_indices(name, prompts, task.prompt_count("train") + task.prompt_count("test"))


# ---------------------------------------------------------------------------------------------
# (prompt, response) pairs as one padded batch
# ---------------------------------------------------------------------------------------------


def max_prompt_width(task):
    """The longest prompt of the task, in tokens (both splits)."""
    prompts = torch.cat([task.split_prompts("train"), task.split_prompts("test")])
    return max(len(tokens) for tokens in task.prompt_tokens(prompts))


def prompt_batch(task, prompts):
    """((N, P) int64 prompt ids left-padded with pad_id, (N, P) int64 attention mask), P = the longest prompt.

    Left padding puts every prompt's last token in the same column, so a sampler appends the response
    at the same position for every row; position ids come from the mask (tiny_lm), so padding changes
    no log-prob.
    """
    tokens = task.prompt_tokens(_prompt_list(_check_task(task), "prompts", prompts))
    width = max(len(row) for row in tokens)
    ids = torch.tensor([[task.pad_id] * (width - len(row)) + row for row in tokens], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in tokens], dtype=torch.long)
    return ids, mask


def pair_batch(task, prompts, responses):
    """(input_ids, attention_mask, completion_mask), each (N, P + R) int64, for teacher forcing.

    prompts: N global prompt indices; responses: N token sequences (EOS included when the response has
    one), R = the longest. Layout per row: left padding, prompt, response, right padding. attention_mask
    is 1 on the prompt and the response; completion_mask is 1 on the response only: the tokens that are
    scored (the loss mask), never the prompt, never padding.
    """
    if not isinstance(responses, (list, tuple)) or not all(isinstance(response, (list, tuple)) for response in responses):
        raise ValueError("responses: expected a list of token-id lists")
    largest = len(_check_task(task).vocab) - 1  # the task checked once, not once per token
    responses = [[check_int("responses", token, low=0, high=largest) for token in response] for response in responses]
    if len(responses) != len(prompts):
        raise ValueError(f"responses: expected {len(prompts)} like prompts, got {len(responses)}")
    if not all(responses):
        raise ValueError("responses: expected at least one token in every response")
    ids, mask = prompt_batch(task, prompts)
    length = max(len(response) for response in responses)
    completion_ids = torch.tensor([response + [task.pad_id] * (length - len(response)) for response in responses],
                                  dtype=torch.long)
    completion = torch.tensor([[1] * len(response) + [0] * (length - len(response)) for response in responses],
                              dtype=torch.long)
    input_ids = torch.cat([ids, completion_ids], dim=1)  # (N, P) + (N, R) -> (N, P + R)
    attention_mask = torch.cat([mask, completion], dim=1)
    completion_mask = torch.cat([torch.zeros_like(mask), completion], dim=1)
    return input_ids, attention_mask, completion_mask


# ---------------------------------------------------------------------------------------------
# The loss: next-token cross-entropy on completion tokens only
# ---------------------------------------------------------------------------------------------


def completion_loss(model, input_ids, attention_mask, completion_mask):
    """Scalar SFT loss: the mean next-token cross-entropy (nats per token) over the completion tokens.

        loss = -sum_{n,t} m[n,t+1] log p(x[n,t+1] | x[n,<=t]) / sum_{n,t} m[n,t+1],   m = completion_mask

    With the causal shift (tiny_lm.completion_log_probs): column t scores token t+1. Prompt and padding
    tokens are attended to (prompt) or hidden (padding) but never scored: they carry no loss, and
    padding no gradient. Every completion token of the batch weighs the same (a token mean, not a mean
    of per-sequence means), as HF/TRL's SFTTrainer computes it with a completion-only loss mask.
    Arguments as tiny_lm.completion_scores; raises ValueError when completion_mask marks no token.
    """
    log_probs = completion_log_probs(model, input_ids, attention_mask, completion_mask)  # (N, T-1), 0 off the mask
    count = int(completion_mask[:, 1:].sum())
    if count == 0:
        raise ValueError("completion_mask: expected at least one completion token after position 0")
    return -log_probs.sum() / count


def _training_loss(model, input_ids, attention_mask, completion_mask):
    """`completion_loss` of a training batch, the same bits and gradients, without what a step does not need:
    the argument checks (pair_batch built and checked every row once) and the entropy (no loss term). A
    loss that is not finite raises FloatingPointError in the training loop."""
    logits = model(input_ids, attention_mask, check=False)  # (N, T, V)
    log_softmax = torch.log_softmax(logits[:, :-1], dim=-1)  # (N, T-1, V): row t scores token t+1
    log_probs = log_softmax.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # (N, T-1, 1) -> (N, T-1)
    scored = completion_mask[:, 1:].bool()
    log_probs = torch.where(scored, log_probs, torch.zeros_like(log_probs))  # as completion_scores masks them
    return -log_probs.sum() / int(scored.sum())


@torch.no_grad()
def _dataset_loss(model, input_ids, attention_mask, completion_mask, batch_rows=DEFAULT_BATCH_ROWS):
    """`completion_loss` over a whole set of sequences (a float, nats per completion token), in chunks of
    batch_rows sequences, summed in float64."""
    total, count = 0.0, 0
    for start in range(0, input_ids.shape[0], batch_rows):
        rows = slice(start, start + batch_rows)
        log_probs = completion_log_probs(model, input_ids[rows], attention_mask[rows], completion_mask[rows])
        total -= float(log_probs.double().sum())
        count += int(completion_mask[rows, 1:].sum())
    return total / count


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


def learning_rate_at(step, config):
    """The learning rate of Adam step `step` (1-based): linear warm-up over warmup_steps, then cosine decay
    from learning_rate to min_lr_ratio * learning_rate at the last step (the schedule of GPT-3 and nanoGPT).
    Raises ValueError naming `config` (not an SFTConfig) or `step` (not an int in [1, config.steps])."""
    _check_config(config)
    check_int("step", step, low=1, high=max(config.steps, 1))
    peak = config.learning_rate
    if step <= config.warmup_steps:
        return peak * step / config.warmup_steps
    decay_steps = config.steps - config.warmup_steps
    progress = (step - config.warmup_steps) / decay_steps if decay_steps > 0 else 1.0
    floor = config.min_lr_ratio * peak
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def _demonstration_summary(task, pairs):
    """Counts describing a demonstration set (all deterministic): correct and imperfect responses,
    distinct prompts and distinct (prompt, response) pairs, completion tokens."""
    correct = sum(response in set(task.solutions(prompt)) for prompt, response in pairs)
    return {"count": len(pairs), "correct": correct, "imperfect": len(pairs) - correct,
            "distinct_prompts": len({prompt for prompt, _ in pairs}),
            "distinct_pairs": len(set(pairs)),
            "completion_tokens": sum(len(response) for _, response in pairs)}


def uses_subtraction(task, response):
    """True when the response (token ids) holds the operator '-': the solution family of the option
    subtraction_share. A prompt needs the family when every one of its solutions is in it."""
    return task.vocab.index("-") in response


def subtraction_demonstrations(task, pairs, share, generator):
    """The demonstrations `pairs` (task.demonstrations) with each correct one redrawn so that a share
    `share` of them use a subtraction (`uses_subtraction`), in expectation; imperfect ones are kept.

    Per correct demonstration, three float64 draws (u_side, u_prompt, u_choice) from one
    torch.rand((count, 3), generator): the side is the family when u_side < share, else the solutions
    without a subtraction; when its prompt has a solution on that side, one of them is drawn
    (item int(u_choice * n) of n), otherwise the prompt is redrawn among the train prompts that have one
    (item int(u_prompt * m) of m) first. With share 0 no correct demonstration uses a subtraction, so the
    prompts that need one never get a correct demonstration; the imperfect ones (wrong values, malformed,
    overlong) still show the operator. Raises ValueError naming the argument.
    """
    _check_task(task)
    share = check_real("share", share, low=0.0, high=1.0)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    sides = {}  # prompt -> (solutions without a subtraction, solutions with one)
    for prompt in task.split_prompts("train").tolist():
        solutions = task.solutions(prompt)
        sides[prompt] = (tuple(s for s in solutions if not uses_subtraction(task, s)),
                         tuple(s for s in solutions if uses_subtraction(task, s)))
    holders = [[prompt for prompt, pair in sides.items() if pair[side]] for side in (0, 1)]  # per side
    draws = torch.rand((len(pairs), 3), generator=generator, dtype=torch.float64).tolist()
    redrawn = []
    for (prompt, response), (u_side, u_prompt, u_choice) in zip(pairs, draws):
        if response not in task.solutions(prompt):  # imperfect: kept as the task drew it
            redrawn.append((prompt, response))
            continue
        side = 1 if u_side < share else 0
        if not sides[prompt][side]:
            prompt = holders[side][int(u_prompt * len(holders[side]))]
        candidates = sides[prompt][side]
        redrawn.append((prompt, candidates[int(u_choice * len(candidates))]))
    return redrawn


@training_mode()  # it calls backward(), whatever the caller's grad mode
def train_sft(task, config, progress=None):
    """Train a TinyLM on the task's demonstrations; return (model, report).

    One torch.Generator seeded with config.seed is the only source of randomness, consumed in this order:
    task.demonstrations(config.demonstrations, generator), the model's initial weights, then one
    torch.randperm per pass over the demonstrations (batches are consecutive slices of it; a pass's last
    partial batch is dropped). Float32, one torch thread, Adam (ADAM_BETAS) with the global gradient norm
    clipped to grad_clip and the learning rate of `learning_rate_at`. The same task and config give a
    byte-identical state_dict and report.

    progress: None or a callable taking one line of text, called PROGRESS_LINES times (with the wall
    time, which the report leaves out).
    Returns the model in eval mode (float32, no value head) and a JSON-ready report: the settings, the
    model's config and size, the optimizer, the demonstrations' counts, the completion loss over the
    first LOSS_ROWS demonstrations before and after training, and a loss curve (mean training loss and
    gradient norm over each interval between progress lines).
    Raises ValueError naming the argument.
    """
    _check_task(task)
    _check_config(config)
    if progress is not None and not callable(progress):
        raise ValueError(f"progress: expected None or a callable, got {type(progress).__name__}")
    model_config = config.model_config(task)
    started = time.perf_counter()
    with torch_threads(1):
        generator = torch.Generator().manual_seed(config.seed)
        pairs = task.demonstrations(config.demonstrations, generator)
        if config.subtraction_share is not None:
            pairs = subtraction_demonstrations(task, pairs, config.subtraction_share, generator)
        model = TinyLM(model_config, generator=generator).to(DTYPE)
        input_ids, attention_mask, completion_mask = pair_batch(task, *zip(*pairs))  # (M, T) each
        fixed = slice(0, LOSS_ROWS)
        initial_loss = _dataset_loss(model, input_ids[fixed], attention_mask[fixed], completion_mask[fixed])
        # foreach: one kernel per operation over all parameters (the same numbers, a few ms less per step)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.learning_rate, betas=ADAM_BETAS, eps=ADAM_EPS,
                                     foreach=True)
        batch_size = min(config.batch_size, len(pairs))
        per_pass = len(pairs) // batch_size
        every = max(1, math.ceil(config.steps / PROGRESS_LINES))
        curve, losses, norms = [], [], []
        model.train()
        for step in range(1, config.steps + 1):
            if (step - 1) % per_pass == 0:  # a new shuffled pass over the demonstrations
                order = torch.randperm(len(pairs), generator=generator)
            rows = order[((step - 1) % per_pass) * batch_size:][:batch_size]
            loss = _training_loss(model, input_ids[rows], attention_mask[rows], completion_mask[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip, foreach=True)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate_at(step, config)
            optimizer.step()
            losses.append(loss.item())
            if not math.isfinite(losses[-1]):
                raise FloatingPointError(f"sft: the training loss is not finite at step {step} (lower --lr)")
            norms.append(norm.item())
            if step % every == 0 or step == config.steps:
                curve.append({"step": step, "loss": sum(losses) / len(losses),
                              "grad_norm": sum(norms) / len(norms), "learning_rate": learning_rate_at(step, config)})
                first, losses, norms = step - len(losses) + 1, [], []
                if progress is not None:  # the training batches' loss, with the weights of their steps
                    steps = f"step {step}" if first == step else f"steps {first}-{step}"
                    progress(f"sft step {step:5d}/{config.steps}  batch loss {curve[-1]['loss']:.4f} (mean of "
                             f"{steps})  grad_norm {curve[-1]['grad_norm']:.3f}  lr {curve[-1]['learning_rate']:.2e}  "
                             f"{time.perf_counter() - started:.1f} s")
        model.eval()
        final_loss = _dataset_loss(model, input_ids[fixed], attention_mask[fixed], completion_mask[fixed])
    report = {
        "settings": settings_of(config),
        "task": task.settings(),
        "model": {"config": dataclasses.asdict(model_config), "parameters": model.num_parameters(),
                  "dtype": dtype_name(DTYPE)},
        "optimizer": {"name": "Adam", "betas": list(ADAM_BETAS), "eps": ADAM_EPS, "grad_clip": config.grad_clip,
                      "schedule": "linear warm-up, then cosine decay to min_lr_ratio"},
        "demonstrations": _demonstration_summary(task, pairs),
        "loss": {"unit": f"nats per completion token, over the first {min(LOSS_ROWS, len(pairs))} demonstrations",
                 "initial": initial_loss, "final": final_loss},
        "curve": curve,
        "torch": torch.__version__,
    }
    return model, report


# ---------------------------------------------------------------------------------------------
# The cache: one folder per setting, written all or nothing, checked before it is used
# ---------------------------------------------------------------------------------------------


def canonical_json(obj):
    """The one text of `obj` the key is hashed from: sorted keys, no spaces, NaN refused."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _key_inputs(task, config):
    """Everything an SFT model depends on, JSON-ready: the cache format, the task's settings (its config
    and what it derives), the SFT settings, the model's config, the optimizer's constants, torch's version."""
    return {"format": CACHE_FORMAT, "task": task.settings(), "sft": settings_of(config),
            "model": dataclasses.asdict(config.model_config(task)),
            "optimizer": {"betas": list(ADAM_BETAS), "eps": ADAM_EPS}, "dtype": dtype_name(DTYPE),
            "torch": torch.__version__}


def cache_key(task, config):
    """The first KEY_LENGTH hex digits of the SHA-256 of canonical_json(_key_inputs(task, config))."""
    return _sha256(canonical_json(_key_inputs(_check_task(task), _check_config(config))).encode())[:KEY_LENGTH]


def cache_folder_of(task, config, cache_folder):
    """The folder `<cache_folder>/sft-<key>` that holds (or will hold) this setting's SFT model. Raises
    ValueError naming the argument."""
    return os.path.join(_check_folder("cache_folder", cache_folder), SFT_PREFIX + cache_key(task, config))


def _check_folder(name, folder):
    if not isinstance(folder, str) or not folder.strip() or "\0" in folder:
        raise ValueError(f"{name}: expected a folder name (a non-empty string without NUL), got {folder!r}")
    return folder


def _cache_files(task, config, model, report):
    """{file name: bytes or text} of a cache folder: model.pt (torch.save of the state_dict), report.json,
    and config.json (the key, its inputs, the model's config, and the SHA-256 of the other two files,
    which is how a corrupt or partial folder is recognized)."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    model_bytes = buffer.getvalue()
    report_text = json_text(report)
    config_json = {
        "key": cache_key(task, config),
        "model_config": dataclasses.asdict(model.config),
        "sha256": {MODEL_FILE: _sha256(model_bytes), REPORT_FILE: _sha256(report_text.encode())},
        "key_inputs": _key_inputs(task, config),
    }
    return {MODEL_FILE: model_bytes, REPORT_FILE: report_text, CONFIG_FILE: json_text(config_json)}


MAX_CACHE_FILE_BYTES = 64 * 2**20  # the default model.pt is about 250 KB; the largest accepted model a few MB


def _read(folder, name):
    """A cache file's bytes, if it is a regular file of a sane size: a link, a pipe (which would block), a
    device or a huge file is a reason to retrain, never read."""
    path = os.path.join(folder, name)
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{name} is not a regular file")
    if info.st_size > MAX_CACHE_FILE_BYTES:
        raise ValueError(f"{name} holds {info.st_size} bytes, far more than any SFT model")
    with open(path, "rb") as handle:
        return handle.read()


def load_cached(task, config, folder):
    """(model, report, None) from a cache folder, or (None, None, reason) when it is missing or unusable.

    Usable means: config.json parses, its key and key inputs are this setting's, model.pt and report.json
    have the SHA-256 it records, and the state_dict loads into the recorded config with every tensor
    finite. Anything else is a reason (a missing file, a truncated or altered one, another torch
    version), never an exception: the caller retrains. Raises ValueError naming a bad argument.
    """
    _check_task(task)
    _check_config(config)
    if not os.path.isdir(_check_folder("folder", folder)):
        return None, None, "no cache folder"
    try:
        recorded = json.loads(_read(folder, CONFIG_FILE).decode("utf-8"))
        if recorded.get("key") != cache_key(task, config) or (
                canonical_json(recorded.get("key_inputs")) != canonical_json(_key_inputs(task, config))):
            return None, None, f"{CONFIG_FILE} was written for other settings"
        model_bytes, report_bytes = _read(folder, MODEL_FILE), _read(folder, REPORT_FILE)
        for name, data in ((MODEL_FILE, model_bytes), (REPORT_FILE, report_bytes)):
            if _sha256(data) != recorded["sha256"][name]:
                return None, None, f"{name} does not match the checksum in {CONFIG_FILE}"
        model_config = TinyLMConfig(**recorded["model_config"])
        if model_config != config.model_config(task):
            return None, None, f"{CONFIG_FILE} records another model config"
        state = torch.load(io.BytesIO(model_bytes), weights_only=True)
        # the initial weights are overwritten at once: a fixed generator leaves the global one alone
        model = TinyLM(model_config, generator=torch.Generator().manual_seed(0)).to(DTYPE)
        model.load_state_dict(state, strict=True)
        if not all(bool(torch.isfinite(tensor).all()) for tensor in model.state_dict().values()):
            return None, None, f"{MODEL_FILE} holds non-finite weights"
        report = json.loads(report_bytes.decode("utf-8"))
    except Exception as error:  # noqa: BLE001 - whatever is wrong with a cache folder, it is retrained, never used
        return None, None, f"{type(error).__name__}: {error}"
    return model.eval(), report, None


def load_or_train(task, config, cache_folder, progress=None, write=True):
    """The SFT model of (task, config): loaded from `<cache_folder>/sft-<key>/` when a usable copy is there,
    otherwise trained with `train_sft` and written there (all three files at once, lab_io.write_files).

    Returns (model, report, folder), and with write=False (model, report, folder, files): the files are not
    written but returned ({path: bytes or text}, empty when the model was loaded), for a caller that writes
    them together with its own. A changed setting (task, SFT config, torch version) has another key, so it
    trains into another folder; a corrupt or partial folder (see `load_cached`) is retrained and replaced,
    with a progress line saying why. progress: None or a callable taking one line of text.
    Raises ValueError naming the argument; lab_io.WriteFailed (an OSError) when the files cannot be written.
    """
    _check_task(task)
    _check_config(config)
    _check_folder("cache_folder", cache_folder)
    folder = cache_folder_of(task, config, cache_folder)
    model, report, reason = load_cached(task, config, folder)
    files = {}
    if model is not None:
        if progress is not None:
            progress(f"sft: loaded the cached model {folder}")
    else:
        if progress is not None:
            progress(f"sft: training into {folder} ({reason})")
        model, report = train_sft(task, config, progress)
        files = {os.path.join(folder, name): data for name, data in _cache_files(task, config, model, report).items()}
    if not write:
        return model, report, folder, files
    if files:
        write_files(files)
    return model, report, folder


# ---------------------------------------------------------------------------------------------
# Evaluation: exact success probabilities, and sampled pass@k with its companions
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def exact_success(model, task, prompts, temperature=1.0, batch_rows=DEFAULT_BATCH_ROWS):
    """(P,) float64: per prompt, the exact probability that one sampled response is correct (noise-free pass@1).

        success(x) = sum over y in task.solutions(x) of exp(sum_t log p_T(y_t | x, y_<t))

    where p_T is the model's distribution at `temperature` (the one `tiny_lm.generate` samples from with
    top_p = 1). Exact because the solutions are enumerated and are the only correct responses, each ends
    with EOS (the sampler stops there) and fits the response cap. Computed by teacher forcing: every
    (prompt, solution) pair is one row of a batch (prompt left-padded, solution right-padded), scored in
    forward passes of at most batch_rows rows, no sampling. Each solution's log-prob is summed in the
    model's dtype per token and in float64 across tokens; float32 logits limit it to about 1e-6 relative.

    model: a TinyLM (left in its train/eval mode); task: a task with solutions (countdown.CountdownTask);
    prompts: (P,) int tensor or list of global prompt indices; temperature > 0.
    Raises ValueError naming the argument.
    """
    _check_model(model)
    _check_task(task)
    prompt_list = _prompt_list(task, "prompts", prompts)
    check_real("temperature", temperature, low=0.0, low_open=True)
    check_int("batch_rows", batch_rows, low=1)
    pairs = [(row, prompt, solution) for row, prompt in enumerate(prompt_list) for solution in task.solutions(prompt)]
    success = torch.zeros(len(prompt_list), dtype=torch.float64)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(pairs), batch_rows):
            chunk = pairs[start:start + batch_rows]
            owners = torch.tensor([row for row, _, _ in chunk])  # (N,) the prompt each row belongs to
            ids, attention, completion = pair_batch(task, [prompt for _, prompt, _ in chunk],
                                                    [solution for _, _, solution in chunk])
            log_probs = completion_log_probs(model, ids, attention, completion, temperature=temperature)  # (N, T-1)
            success.index_add_(0, owners, log_probs.double().sum(dim=1).exp())  # (N,) summed into (P,)
    finally:
        model.train(was_training)
    return success


def _check_ks(ks, samples):
    if not isinstance(ks, (list, tuple)) or not ks:
        raise ValueError(f"ks: expected a non-empty list of integers, got {ks!r}")
    return tuple(check_int("ks", k, low=1, high=samples) for k in ks)


def _mean_or_none(values):
    return sum(values) / len(values) if values else None


@torch.no_grad()
def sample_evaluation(model, task, split, *, ks=PASS_KS, samples=64, generator, temperature=1.0, max_prompts=None,
                      batch_size=DEFAULT_BATCH_ROWS):
    """Sample `samples` responses per prompt of `split` and report what RL changes, as a JSON-ready dict.

    Sampling: tiny_lm.generate with the KV cache, the model's dtype, `temperature`, top_p 1, the task's
    response cap. Rows are prompt-major (prompt i's samples are rows i*S .. i*S + S - 1), sampled in
    batches of at most batch_size rows (whole prompts, at least one). With max_prompts (< the split's
    size), that many prompts are chosen first by one torch.randperm from `generator` (then sorted).
    Deterministic from the generator's state, the arguments and batch_size.

    Returns:
        split, prompts, samples, temperature;
        "pass@k" for every k in ks: the unbiased estimator (countdown.pass_at_k, Chen et al. 2021 eq. 1)
            from each prompt's S samples and c correct ones, averaged over prompts;
        exact_pass@1: mean of `exact_success` over the same prompts (pass@1 without sampling noise);
        entropy_per_token: nats, mean over every sampled token of the entropy of the distribution it
            was drawn from (at `temperature`);
        distinct_correct_per_prompt: mean over prompts of the number of different correct responses
            among its S samples; solutions_per_prompt: mean number of correct responses that exist;
        mean_length_correct, mean_length_wrong: mean response length in tokens (EOS included) of the
            correct and of the other responses (None when there is none);
        truncation_rate: share of responses that hit the cap without EOS;
        pass@1_by_difficulty, prompts_by_difficulty: {difficulty: value} (task.difficulty).
    Raises ValueError naming the argument (k > samples among them).
    """
    _check_model(model)
    _check_task(task)
    check_int("samples", samples, low=1, high=1_000_000)
    ks = _check_ks(ks, samples)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    check_real("temperature", temperature, low=0.0, low_open=True)
    check_int("batch_size", batch_size, low=1)
    prompts = task.split_prompts(split)
    if max_prompts is not None:
        check_int("max_prompts", max_prompts, low=1)
        if max_prompts < prompts.numel():
            prompts = prompts[torch.randperm(prompts.numel(), generator=generator)[:max_prompts]].sort().values
    prompt_list = prompts.tolist()
    per_batch = max(1, batch_size // samples)  # whole prompts per generate call
    correct_counts, distinct, lengths_correct, lengths_wrong = [], [], [], []
    entropy_sum, token_count, truncated_count = 0.0, 0, 0
    was_training = model.training
    model.eval()  # as generate() samples: the entropies are those of the distributions it drew from
    try:
        for start in range(0, len(prompt_list), per_batch):
            chunk = prompts[start:start + per_batch]
            rows = chunk.repeat_interleave(samples)  # (B,) -> (B*S,) prompt-major
            ids, mask = prompt_batch(task, rows)
            out = generate(model, ids, mask, task.max_new_tokens, eos_id=task.eos_id, pad_id=task.pad_id,
                           temperature=temperature, generator=generator)
            width = ids.shape[1]
            completion_ids = out.sequences[:, width:]  # (B*S, R)
            real = out.completion_mask[:, width:].bool()  # (B*S, R)
            correct = task.correct(task.rewards(rows, completion_ids, real, out.truncated))  # (B*S,)
            scores = completion_scores(model, out.sequences, out.attention_mask, out.completion_mask,
                                       temperature=temperature)
            entropy_sum += float(scores.entropy.double().sum())
            token_count += int(out.completion_mask.sum())
            truncated_count += int(out.truncated.sum())
            lengths = real.sum(dim=1)  # (B*S,) tokens, EOS included
            lengths_correct += lengths[correct].tolist()
            lengths_wrong += lengths[~correct].tolist()
            by_prompt = correct.view(len(chunk), samples)  # (B*S,) -> (B, S)
            correct_counts += by_prompt.sum(dim=1).tolist()
            for index in range(len(chunk)):
                responses = completion_ids[index * samples:(index + 1) * samples]
                kept = real[index * samples:(index + 1) * samples]
                distinct.append(len({tuple(responses[row][kept[row]].tolist())
                                     for row in range(samples) if by_prompt[index, row]}))
    finally:
        model.train(was_training)
    exact = exact_success(model, task, prompts, temperature, batch_size)
    difficulties = [task.difficulty(prompt) for prompt in prompt_list]
    result = {"split": split, "prompts": len(prompt_list), "samples": samples, "temperature": temperature}
    for k in ks:
        result[f"pass@{k}"] = _mean_or_none([pass_at_k(samples, count, k) for count in correct_counts])
    result.update({
        "exact_pass@1": float(exact.mean()),
        "entropy_per_token": entropy_sum / token_count,
        "distinct_correct_per_prompt": _mean_or_none(distinct),
        "solutions_per_prompt": _mean_or_none([len(task.solutions(prompt)) for prompt in prompt_list]),
        "mean_length_correct": _mean_or_none(lengths_correct),
        "mean_length_wrong": _mean_or_none(lengths_wrong),
        "truncation_rate": truncated_count / (len(prompt_list) * samples),
        "pass@1_by_difficulty": {},
        "prompts_by_difficulty": {},
    })
    for difficulty in sorted(set(difficulties)):
        counts = [count for count, level in zip(correct_counts, difficulties) if level == difficulty]
        result["pass@1_by_difficulty"][str(difficulty)] = _mean_or_none([count / samples for count in counts])
        result["prompts_by_difficulty"][str(difficulty)] = len(counts)
    return result


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

TABLE_ROWS = ("exact_pass@1", *(f"pass@{k}" for k in PASS_KS), "entropy_per_token", "distinct_correct_per_prompt",
              "solutions_per_prompt", "mean_length_correct", "mean_length_wrong", "truncation_rate")


def summary_line(folder, report):
    """The model's line of the printout: its size and the completion loss over the report's fixed set of
    demonstrations, at the initial and the trained weights (not the progress lines' batch loss, which
    averages the last interval's training batches, each with the weights of its step)."""
    loss = report["loss"]
    scored = min(LOSS_ROWS, report["demonstrations"]["count"])
    return (f"SFT model {folder}: {report['model']['parameters']:,} parameters, completion loss on the first "
            f"{scored} demonstrations {loss['initial']:.4f} (initial weights) -> {loss['final']:.4f} (trained) "
            "nats/token")


def table_text(evaluations):
    """The evaluation as a small text table: one row per metric, one column per split. evaluations:
    {split: the dict `sample_evaluation` returns}; ValueError naming it when it is empty or not that."""
    if not isinstance(evaluations, dict) or not evaluations or not all(
            isinstance(value, dict) and "pass@1_by_difficulty" in value and "prompts" in value
            for value in evaluations.values()):
        raise ValueError("evaluations: expected {split: sample_evaluation(...)} with at least one split")
    splits = list(evaluations)
    lines = [f"{'':28s}" + "".join(f"{split:>10s}" for split in splits)]
    rows = list(TABLE_ROWS) + [f"pass@1 difficulty {level}" for level in evaluations[splits[0]]["pass@1_by_difficulty"]]
    for row in rows:
        cells = []
        for split in splits:
            if row.startswith("pass@1 difficulty"):
                value = evaluations[split]["pass@1_by_difficulty"].get(row.split()[-1])
            else:
                value = evaluations[split].get(row)
            cells.append(f"{'-':>10s}" if value is None else f"{value:10.4f}")
        lines.append(f"{row:28s}" + "".join(cells))
    prompts = "  ".join(f"{split} {evaluations[split]['prompts']}" for split in splits)
    lines.append(f"{'prompts':28s}{prompts}")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser, args = build_parser(), parse(argv)
    config = config_from(parser, args)
    task = CountdownTask()
    try:
        folder = cache_folder_of(task, config, args.output)
    except SettingError as error:  # max_len too small for the task
        parser.error(f"argument {error.flag}: {error.reason}")
    output_folder_or_exit(parser, folder, [MODEL_FILE, CONFIG_FILE, REPORT_FILE])
    ks = tuple(k for k in PASS_KS if k <= args.samples)
    started = time.perf_counter()
    progress = Progress()
    model, report, folder, cache = load_or_train(task, config, args.output, progress=progress, write=False)
    trained = time.perf_counter() - started
    evaluations = {}
    generator = torch.Generator().manual_seed(args.eval_seed)
    with torch_threads(1):
        for split in ("train", "test"):
            evaluations[split] = sample_evaluation(model, task, split, ks=ks, samples=args.samples,
                                                   generator=generator, max_prompts=args.max_prompts)
    evaluated = time.perf_counter() - started - trained
    document = {
        "task": dataclasses.asdict(task.config),
        "sft": {"folder": os.path.basename(folder), "settings": settings_of(config),
                "parameters": report["model"]["parameters"], "loss": report["loss"],
                "demonstrations": report["demonstrations"]},
        "evaluation_settings": {"samples": args.samples, "ks": list(ks), "eval_seed": args.eval_seed,
                                "max_prompts": args.max_prompts, "temperature": 1.0, "top_p": 1.0,
                                "sampler": "tiny_lm.generate with the KV cache, float32",
                                "order": "train then test, from one generator"},
        "evaluation": evaluations,
    }
    path = os.path.join(args.output, EVALUATION_FILE)
    write_files({**cache, path: json_text(document)})  # a new model and its evaluation together, or neither
    print(f"\n{summary_line(folder, report)} (SFT {trained:.1f} s, evaluation {evaluated:.1f} s on this machine)\n")
    print(table_text(evaluations), end="")
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
