"""The bridge to TRL and verl, checked by the libraries themselves: every option the map emits is built
into the library's own config object, and every mapped loss is computed by the library's own code on
the lab's batches.

    .venv-bridge/bin/python bridge.py check        # every mapped setting -> TRL's and verl's config classes
    .venv-bridge/bin/python bridge.py conformance  # the lab's losses and the libraries' on the same batches
    .venv-bridge/bin/python bridge.py e2e          # every exported TRL script trains; the atoms recompute a step

Needs the optional extra (requirements-bridge.txt, in its own venv); the lab itself does not. `check`
builds library_map.library_blocks(settings) for REPRESENTATIVE_SETTINGS (every algorithm and switch of
online_tokens.py) into GRPOConfig, RLOOConfig, DPOConfig, OnlineDPOConfig and CPOConfig, and into
verl's ppo_trainer.yaml composed with the overrides by Hydra (which refuses a key the config does not
have) and converted to verl's ActorConfig and AlgoConfig dataclasses (which validate the values); it
reads every option back and fails on any difference. `conformance` feeds one float64 batch (per-token
log-probs, masks, rewards) to the lab's atoms and to TRL's GRPOTrainer._compute_loss,
RLOOTrainer._compute_loss, CPOTrainer.cpo_loss and verl's actor loss (verl.workers.utils.losses
.ppo_loss), and compares the losses and their gradients with respect to the per-token log-probs; it
also measures each documented convention difference. A third table holds every atom of the second wave
that TRL or verl implements against the library's own function on ragged float64 batches of several seeds
(value and gradient); where the function runs only inside a trainer's generation step, the lines of it
are executed as the library wrote them (`trl_source_block`). `e2e` writes each task's data
(task_data.py) and library_export.export_trl's script for each of E2E_EXPORTS (GRPO, RLOO, Dr. GRPO,
DAPO, CISPO, GSPO, SAPO, offline and online DPO) on both tasks, trains it with the script's tiny model,
keeps one step's batch as TRL fed it to its loss and recomputes that loss and its parameter gradients
with the lab's atoms (float32, to 1e-6, the gradients relative to their size). All exit 1 when
something disagrees.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import math
import os
import sys
import tempfile
import warnings
from collections import defaultdict

from lab.io import OneLineErrorParser, flags_first, run_cli

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------


def build_parser():
    parser = OneLineErrorParser(
        prog="bridge.py",
        description="Check the lab's map to TRL and verl against the installed libraries: build every mapped "
                    "configuration (check), or compare the lab's losses with the libraries' own loss code on the "
                    "same batch (conformance, a Markdown table). Needs requirements-bridge.txt.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser,
                                     metavar="{check,conformance,e2e}")
    commands.add_parser("check", help="build every mapped configuration into TRL's and verl's config objects")
    commands.add_parser("conformance", help="the lab's losses against the libraries' on one float64 batch")
    commands.add_parser("e2e", help="every exported TRL script (the GRPO family, DPO offline and online, both tasks) "
                                    "trains 2 lab iterations on a CPU; the lab's atoms recompute one step of each")
    return parser


def parse(argv=None):
    """The flags (a bad one exits 2 with one line)."""
    return build_parser().parse_args(argv)


if __name__ == "__main__":
    flags_first(parse)

# torch, the lab and the map after the flags: `import torch` takes a second or more, --help none of it
import torch

import online_tokens
from lab.checks import torch_threads
from library_map import ACTOR, VERL_NO_DUAL_CLIP, library_blocks
from online_algorithms import WHITEN_EPS, GroupCredit, GroupFamily, PreferenceFamily
from online_registry import ADVANTAGES, POLICY_LOSSES
from online_settings import BY_NAME, OnlineConfig, resolve
from rl_lab import (
    clipped_policy_loss,
    gae,
    group_relative_advantages,
    kl_k3,
    masked,
    rloo_advantages,
    simpo_loss,
)

INSTALL = ("python3 -m venv .venv-bridge && .venv-bridge/bin/pip install -r requirements.txt && "
           ".venv-bridge/bin/pip install --no-deps -r requirements-bridge.txt")
PINNED = {"trl": "1.16.0", "verl": "0.9.1"}
# conformance: the lab and the library compute the same float64 expression in another order
TOLERANCE = 1e-10
# TRL's sapo builds its temperatures with torch.where on Python floats, which gives float32 tensors
# (grpo_trainer.py line 3122): in a float64 batch its gate carries float32 rounding
SAPO_TRL_TOLERANCE = 1e-7

# Every algorithm and every switch of online_tokens.py at least once (check builds them all): the shared
# switches here, then each registered loss and advantage with the samples its entry names.
REPRESENTATIVE_SETTINGS = [
    {},
    {"reduction": "token"},
    {"reduction": "constant"},
    {"scale_rewards": "batch"},
    {"scale_rewards": "none"},
    {"epsilon_high": 0.28},
    {"dual_clip": 3.0},
    {"dual_clip": 1.1},
    {"kl_estimator": "k1"},
    {"kl_estimator": "k2"},
    {"kl_in": "reward"},
    {"kl_in": "reward", "kl_estimator": "k2"},
    {"beta": 0.0},
    {"mask_truncated": True},
    {"overlong_penalty": 2},
    {"dynamic_sampling": True, "max_resample_rounds": 4},
    {"random_reward": 0.5},
    {"rollout_temperature": 1.5},
    {"rollout_top_p": 0.9},
    {"tis_cap": 2.0},
    {"rollout_correction": "token"},
    {"rollout_correction": "sequence", "rollout_correction_low": 0.5, "rollout_correction_high": 3.0},
    {"rollout_correction": "token", "rollout_correction_mode": "mask"},
    {"off_policy_mask": 0.5},
    {"m2po": 0.04},
    {"kl_estimator": "k3-is"},
    {"kl_estimator": "k3+"},
    {"kl_estimator": "k1+"},
    {"entropy_coef": 0.01},
    {"advantage_sign": "negative"},
    {"adaptive_entropy": 0.3, "entropy_coef": 0.01},
    {"top_entropy_quantile": 0.2},
    {"algorithm": "ppo"},
    {"algorithm": "ppo", "value_clip": 0.2},
    {"algorithm": "ppo", "whiten_advantages": False, "truncation": "terminal"},
    {"algorithm": "ppo", "cap_value": "shared"},
    {"algorithm": "dpo"},
    {"algorithm": "dpo", "dpo_loss": "ipo"},
    {"algorithm": "dpo", "dpo_loss": "ipo", "sequence_logp": "mean"},
    {"algorithm": "dpo", "dpo_loss": "hinge"},
    {"algorithm": "dpo", "dpo_loss": "cdpo", "label_smoothing": 0.1},
    {"algorithm": "dpo", "dpo_loss": "robust", "label_smoothing": 0.1},
    {"algorithm": "dpo", "dpo_loss": "simpo"},
    {"algorithm": "dpo", "offline": True},
    {"algorithm": "dpo", "offline": True, "dpo_rejected": "nearest"},
    {"algorithm": "dpo", "offline": True, "sequence_logp": "mean"},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "ipo"},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "ipo", "sequence_logp": "mean"},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "hinge"},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "cdpo", "label_smoothing": 0.1},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "robust", "label_smoothing": 0.1},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "simpo"},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "simpo", "sequence_logp": "sum"},
]
REPRESENTATIVE_SETTINGS += [{"algorithm": name, **sample} for name, entry in POLICY_LOSSES.items()
                            for sample in entry.samples]
REPRESENTATIVE_SETTINGS += [{"advantage": name, **sample} for name, entry in ADVANTAGES.items()
                            for sample in entry.samples]

# The GRPO-family settings whose loss conformance compares (the ones both libraries map, and a few
# whose unmatched part is measured rather than hidden).
CONFORMANCE_SETTINGS = [
    {},
    {"reduction": "token"},
    {"reduction": "constant"},
    {"scale_rewards": "none"},
    {"epsilon_high": 0.28},
    {"dual_clip": 3.0},
    {"kl_in": "reward"},
    {"kl_estimator": "k1"},
    {"kl_estimator": "k2"},
    {"mask_truncated": True},
    {"tis_cap": 2.0},
    {"advantage": "rloo"},
    {"algorithm": "cispo"},
    {"algorithm": "cispo", "reduction": "token"},
    {"algorithm": "gspo"},
    {"algorithm": "gspo", "beta": 0.02},
    {"algorithm": "sapo"},
    {"algorithm": "sapo", "reduction": "token"},
    {"algorithm": "ppo"},
    {"algorithm": "dpo", "offline": True, "dpo_loss": "simpo"},
]

# What a verl launch must give beside the map's overrides for verl's ActorConfig to validate.
VERL_LAUNCH = {ACTOR + "ppo_micro_batch_size_per_gpu": 8}
# What a CPU run needs and the map leaves to the user: TRL's defaults are bf16 and gradient checkpointing.
TRL_CPU = {"use_cpu": True, "bf16": False, "fp16": False, "gradient_checkpointing": False, "report_to": "none"}


class ExtraMissing(Exception):
    """TRL or verl (the optional extra) is not installed."""


def settings_label(options):
    """The online_tokens.py flags that give these options, e.g. '--algorithm cispo --reduction token'."""
    words = []
    for key, value in options.items():
        flag = BY_NAME[key].option
        if BY_NAME[key].kind == "bool":
            words.append(flag)  # a switch: --mask-truncated, or --no-whiten for whiten_advantages=False
        else:
            words.append(f"{flag} {value}")
    return " ".join(words) or "(defaults: --algorithm grpo)"


def run_settings(options):
    """The dict online_tokens passes to library_blocks: the resolved config plus max_grad_norm."""
    return dataclasses.asdict(resolve(options)) | {"max_grad_norm": online_tokens.MAX_GRAD_NORM}


def lab_config(s):
    """The OnlineConfig of a run_settings dict."""
    return OnlineConfig(**{name: value for name, value in s.items() if name in BY_NAME})


# ---------------------------------------------------------------------------------------------
# The libraries: imported on first use, so that the lab's tests run without them
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet():
    """The libraries' import-time and config-time warnings (deprecations, missing GPUs) are not the bridge's
    output: hold them, and stdout prints from verl's logging setup, while the libraries run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(io.StringIO()):
            yield


def libraries():
    """{"trl": module, "verl": module}; raises ExtraMissing naming what is absent and how to install it."""
    found = {}
    for name in PINNED:
        try:
            with _quiet():
                found[name] = importlib.import_module(name)
        except ImportError as error:
            raise ExtraMissing(f"the bridge needs TRL {PINNED['trl']} and verl {PINNED['verl']} ({error}); "
                               f"install the extra into its own venv: {INSTALL}") from error
    return found


TRL_CONFIG_CLASSES = {
    "GRPOConfig": ("trl", "GRPOConfig"),
    "RLOOConfig": ("trl", "RLOOConfig"),
    "DPOConfig": ("trl", "DPOConfig"),
    "CPOConfig (trl.experimental.cpo)": ("trl.experimental.cpo", "CPOConfig"),
    "OnlineDPOConfig (trl.experimental.online_dpo)": ("trl.experimental.online_dpo", "OnlineDPOConfig"),
}


def trl_config(block, output_dir):
    """The block's options built into TRL's own config class; raises ValueError for an option the class
    does not have or a value it refuses, and for one it stores differently than given."""
    module_name, class_name = TRL_CONFIG_CLASSES[block["config"]]
    with _quiet():
        config_class = getattr(importlib.import_module(module_name), class_name)
        try:
            config = config_class(output_dir=output_dir, **TRL_CPU, **block["options"])
        except (TypeError, ValueError) as error:
            raise ValueError(f"{class_name}: {error}") from error
    for key, value in block["options"].items():
        stored = getattr(config, key)
        if not _same(stored, value) and not _same(stored, [value]):  # DPOConfig keeps loss_type as a list
            raise ValueError(f"{class_name}.{key}: set to {value!r}, the config holds {stored!r}")
    return config


def _same(stored, value):
    if isinstance(value, float) and isinstance(stored, (int, float)) and not isinstance(stored, bool):
        return math.isclose(stored, value, rel_tol=1e-12, abs_tol=0.0)
    return type(stored) is type(value) and stored == value


def hydra_value(value):
    """A Python value as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


class VerlConfigs:
    """verl's ppo_trainer.yaml, from the installed package, composed with overrides by verl's own Hydra setup."""

    def __init__(self):
        from hydra import initialize_config_dir

        import verl

        folder = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
        self._context = initialize_config_dir(config_dir=folder, version_base=None)
        self._context.__enter__()

    def close(self):
        self._context.__exit__(None, None, None)

    def compose(self, options):
        """(composed DictConfig, ActorConfig, AlgoConfig); raises ValueError for a key the config does not
        have, a value verl's dataclasses refuse, or a value read back differently."""
        from hydra import compose
        from omegaconf import OmegaConf

        from verl.utils.config import omega_conf_to_dataclass

        overrides = [f"{key}={hydra_value(value)}" for key, value in {**VERL_LAUNCH, **options}.items()]
        try:
            with _quiet():
                config = compose(config_name="ppo_trainer", overrides=overrides)
                actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
                algorithm = omega_conf_to_dataclass(config.algorithm)
                _check_verl_names(config)
        except Exception as error:  # Hydra's and the dataclasses' own exceptions: the option is not verl's
            raise ValueError(f"ppo_trainer.yaml: {' '.join(str(error).split())}") from error
        for key, value in options.items():
            stored = OmegaConf.select(config, key.lstrip("+"))
            if not _same(stored, value):
                raise ValueError(f"ppo_trainer.yaml {key}: set to {value!r}, the config holds {stored!r}")
        return config, actor, algorithm


def _check_verl_names(config):
    """The names verl's dataclasses take as any string and its trainer looks up later: the policy loss,
    the advantage estimator and the KL estimators must be in verl's own registries."""
    from verl.trainer.ppo import core_algos

    actor = config.actor_rollout_ref.actor
    core_algos.get_policy_loss_fn(actor.policy_loss.loss_mode)
    core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)
    zeros = torch.zeros(1, dtype=torch.float64)
    for name in (actor.kl_loss_type, config.algorithm.kl_penalty):
        try:
            core_algos.kl_penalty(zeros, zeros, name)
        except NotImplementedError as error:
            raise ValueError(f"unknown KL estimator {name!r}") from error


# ---------------------------------------------------------------------------------------------
# check
# ---------------------------------------------------------------------------------------------


def check_block(library, block, verl_configs, output_dir):
    """One line describing what was built; raises ValueError for what the library refuses."""
    if block["options"] is None:
        if library == "trl" and block["reason"].startswith("TRL 1.16 has no PPO trainer"):
            import trl

            with _quiet():
                present = hasattr(trl, "PPOConfig") or importlib.util.find_spec("trl.experimental.ppo") is not None
            if present:
                raise ValueError("trl: the map says TRL has no PPO trainer, but trl.PPOConfig or "
                                 "trl.experimental.ppo exists")
        return f"{library}: none ({block['reason'].split(':')[0]})"
    if library == "trl":
        trl_config(block, output_dir)
        return f"trl: {block['config'].split()[0]} ({len(block['options'])} options)"
    verl_configs.compose(block["options"])
    return f"verl: ppo_trainer.yaml ({len(block['options'])} overrides)"


def run_check(settings_list=None):
    """(lines, failures): every mapped configuration of `settings_list` built by its library."""
    libraries()
    lines, failures = [], 0
    verl_configs = VerlConfigs()
    try:
        with tempfile.TemporaryDirectory() as output_dir:
            for options in REPRESENTATIVE_SETTINGS if settings_list is None else settings_list:
                blocks = library_blocks(run_settings(options))
                parts = []
                for library in ("trl", "verl"):
                    try:
                        parts.append(check_block(library, blocks[library], verl_configs, output_dir))
                    except ValueError as error:
                        failures += 1
                        parts.append(f"{library}: FAILED: {error}")
                lines.append(f"{settings_label(options)}: " + "; ".join(parts))
    finally:
        verl_configs.close()
    return lines, failures


# ---------------------------------------------------------------------------------------------
# conformance: one batch, the lab's atoms and the libraries' loss code
# ---------------------------------------------------------------------------------------------

PROMPTS, GROUP = 2, 4
LENGTHS = (5, 5, 3, 2, 1, 5, 4, 2)  # kept tokens per response; 5 = the cap, so rows 0, 1, 5 are truncated
REWARDS = (1.0, 0.0, 0.25, 0.0, 1.0, 1.0, 0.0, 0.25)


def conformance_batch(seed=0):
    """One float64 batch of PROMPTS x GROUP responses of max_new_tokens = 5 positions: the tensors the
    online driver's update sees (mask, truncated, rewards, old/ref/sampler log-probs) and the current
    per-token log-probs. Log-ratios spread over about +-0.5 with a few large ones (2.0 and 1.3), so that
    clips, dual-clip, CISPO's cap and the TIS cap all bind somewhere."""
    generator = torch.Generator().manual_seed(seed)
    count, length = PROMPTS * GROUP, max(LENGTHS)
    positions = torch.arange(length).expand(count, length)  # (R,) -> (N, R)
    lengths = torch.tensor(LENGTHS)
    mask = (positions < lengths.unsqueeze(1)).long()  # (N, R): tokens up to and including EOS
    old_logps = -1.5 * torch.rand(count, length, generator=generator, dtype=torch.float64)
    logps = old_logps + 0.4 * torch.randn(count, length, generator=generator, dtype=torch.float64)
    logps[1, 0] = old_logps[1, 0] + 2.0  # A < 0 there: dual-clip (3.0) binds, CISPO's cap (5.0) does not
    logps[4, 0] = old_logps[4, 0] + 1.3
    ref_logps = old_logps + 0.3 * torch.randn(count, length, generator=generator, dtype=torch.float64)
    sampler_logps = old_logps - 0.8 * torch.rand(count, length, generator=generator, dtype=torch.float64)
    return {
        "mask": mask, "truncated": lengths == length, "rewards": torch.tensor(REWARDS, dtype=torch.float64),
        "old_logps": old_logps, "ref_logps": ref_logps, "sampler_logps": sampler_logps, "logps": logps,
    }


def loop_batch(batch):
    """The conformance batch as the online loop's Batch (the fields its GRPO family reads)."""
    loop = online_tokens.Batch(None, None, batch["mask"].bool(), batch["truncated"], batch["rewards"],
                               batch["sampler_logps"])
    loop.mask, loop.old_logps, loop.ref_logps = batch["mask"], batch["old_logps"], batch["ref_logps"]
    return loop


def lab_inputs(s, batch):
    """(advantages (N,), loss mask (N, R), importance weights or None), made by the online loop's own
    GRPO-family object: its scores (the verifier's reward, DAPO's penalty, the KL in the reward) and credit."""
    family, loop = GroupFamily(lab_config(s)), loop_batch(batch)
    loop.scores = family.scores(loop)
    credit = family.credit(loop)
    return credit.advantages, credit.loss_mask, credit.importance_weights


def lab_group_loss(s, logps, batch, advantages, mask, weights):
    """The online loop's GRPO-family loss: its registered atom with the run's settings."""
    loop = online_tokens.Batch(None, None, None, None, None, None)
    loop.old_logps, loop.ref_logps = batch["old_logps"], batch["ref_logps"]
    loss, _, _ = GroupFamily(lab_config(s)).loss(logps, loop, GroupCredit(advantages, mask, weights), first_pass=True)
    return loss


def _trl_trainer(trainer_class, config):
    """A TRL trainer that holds what its __init__ derives from `config` and nothing else, for calling its
    loss method on given log-probs: the attributes read by GRPOTrainer._compute_loss (grpo_trainer.py,
    __init__ lines 782-983 in 1.16.0) and RLOOTrainer._compute_loss (rloo_trainer.py lines 566-669)."""
    from accelerate import Accelerator

    trainer = trainer_class.__new__(trainer_class)
    trainer.args = config
    trainer.accelerator = Accelerator(cpu=True)
    trainer.model = torch.nn.Module().train()  # _compute_loss reads only .training from it
    trainer._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    trainer.current_gradient_accumulation_steps = 1
    trainer.aux_loss_enabled = False
    trainer.router_aux_loss_coef = 0.0
    trainer.beta = config.beta
    trainer.epsilon_low = config.epsilon
    trainer.epsilon_high = config.epsilon_high if config.epsilon_high is not None else config.epsilon
    for name in ("max_completion_length", "num_generations", "use_vllm", "vllm_importance_sampling_correction",
                 "loss_type", "scale_rewards", "importance_sampling_level", "off_policy_mask_threshold",
                 "top_entropy_quantile", "entropy_coef", "use_adaptive_entropy"):
        if hasattr(config, name):
            setattr(trainer, name, getattr(config, name))
    trainer._entropy_bonus_enabled = bool(getattr(config, "entropy_coef", 0.0)) or getattr(
        config, "use_adaptive_entropy", False)
    return trainer


def _leaf(logps):
    return logps.detach().clone().requires_grad_(True)


def _loss_and_grad(function, logps):
    """(loss as a float, d loss / d logps (N, R)) of function(leaf) for a fresh leaf copy of logps."""
    leaf = _leaf(logps)
    with _quiet():
        loss = function(leaf)
    (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
    return loss.item(), torch.zeros_like(logps) if grad is None else grad


def trl_group_loss(config, logps, batch, advantages, mask, weights):
    """TRL's own GRPOTrainer._compute_loss (or RLOOTrainer's) on the batch."""
    import trl

    rloo = isinstance(config, trl.RLOOConfig)
    trainer = _trl_trainer(trl.RLOOTrainer if rloo else trl.GRPOTrainer, config)
    # the model's forward is the one thing replaced: the log-probs are given
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logps, torch.zeros_like(logps), None)
    count, length = logps.shape
    inputs = {"prompt_ids": torch.zeros(count, 1, dtype=torch.long),
              "prompt_mask": torch.ones(count, 1, dtype=torch.long),
              "completion_ids": torch.zeros(count, length, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages}
    if rloo:
        inputs["old_logps"] = (batch["old_logps"] * mask).sum(dim=1)  # (N, R) -> (N,): RLOO's sequence log-prob
    else:
        inputs.update({"old_per_token_logps": batch["old_logps"], "ref_per_token_logps": batch["ref_logps"],
                       "num_items_in_batch": mask.sum()})
        if weights is not None:
            inputs["importance_sampling_ratio"] = weights
    return trainer._compute_loss(None, inputs)


def verl_actor_loss(actor_config, logps, batch, token_advantages, mask, weights):
    """verl's own actor loss (verl.workers.utils.losses.ppo_loss: policy loss, agg_loss and the KL loss)
    on the batch, with the log-probs in the unpadded layout its engines produce."""
    from tensordict import TensorDict

    from verl.utils import tensordict_utils
    from verl.workers.utils.losses import ppo_loss

    count, length = logps.shape
    lengths = mask.sum(dim=1).tolist()
    # no-padding layout: each sequence is its 1-token prompt then its kept response tokens; the engine's
    # log_probs row t scores token t+1, so a response's log-probs sit one position to the left
    pieces = [torch.cat([logps[row, :kept], logps.new_zeros(1)]) for row, kept in enumerate(lengths)]
    data = TensorDict({
        "prompts": torch.zeros(count, 1, dtype=torch.long), "responses": torch.zeros(count, length, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(count, 1, dtype=torch.long), mask], dim=1), "response_mask": mask,
        "old_log_probs": batch["old_logps"], "advantages": token_advantages, "ref_log_prob": batch["ref_logps"],
    }, batch_size=[count])
    if weights is not None:
        data["rollout_is_weights"] = weights
    tensordict_utils.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=count)
    loss, _ = ppo_loss(actor_config, {"log_probs": torch.cat(pieces)}, data)
    return loss


def _row(setting, library, lab, theirs, note):
    (lab_loss, lab_grad), (their_loss, their_grad) = lab, theirs
    return {"setting": setting, "library": library, "lab_loss": lab_loss, "library_loss": their_loss,
            "loss_difference": abs(lab_loss - their_loss),
            "grad_difference": (lab_grad - their_grad).abs().max().item(), "note": note}


def conformance_rows(verl_configs, output_dir):
    """One row per (setting, library) of CONFORMANCE_SETTINGS: both losses, and the largest differences of
    the loss and of its gradient with respect to the per-token log-probs. A row whose note is not
    "matched" names the map's unmatched entry: its difference is measured, not a failure."""
    batch = conformance_batch()
    rows = []
    for options in CONFORMANCE_SETTINGS:
        s = run_settings(options)
        blocks = library_blocks(s)
        label = settings_label(options)
        if s["algorithm"] == "ppo":
            rows.append(_ppo_row(label, s, blocks["verl"], batch, verl_configs))
            continue
        if s["algorithm"] == "dpo":
            rows.append(_simpo_row(label, s, blocks["trl"], batch, output_dir))
            continue
        advantages, mask, weights = lab_inputs(s, batch)
        lab = _loss_and_grad(lambda leaf: lab_group_loss(s, leaf, batch, advantages, mask, weights), batch["logps"])
        trl_block = blocks["trl"]
        config = trl_config(trl_block, output_dir)
        theirs = _loss_and_grad(lambda leaf: trl_group_loss(config, leaf, batch, advantages, mask, weights),
                                batch["logps"])
        rows.append(_row(label, f"TRL {trl_block['config']}", lab, theirs, _note(trl_block)))
        if rows[-1]["note"] == "matched" and tolerance_of(rows[-1]) != TOLERANCE:
            rows[-1]["note"] = "matched (TRL's sapo temperatures are float32)"
        verl_block = blocks["verl"]
        if verl_block["unmatched"].keys() & {"mask_truncated"}:
            continue  # verl cannot drop truncated responses: no verl loss to compare
        _, actor, _ = verl_configs.compose(verl_block["options"])
        token_advantages = advantages.unsqueeze(1) * batch["mask"]  # (N,) -> (N, R), as verl's estimators
        theirs = _loss_and_grad(lambda leaf: verl_actor_loss(actor, leaf, batch, token_advantages, mask, weights),
                                batch["logps"])
        rows.append(_row(label, "verl actor loss", lab, theirs, _note(verl_block)))
    return rows


def _note(block):
    return "matched" if not block["unmatched"] else "unmatched: " + ", ".join(block["unmatched"])


def _ppo_row(label, s, verl_block, batch, verl_configs):
    """The lab's PPO policy loss (clipped_policy_loss, mean over kept tokens) and verl's actor loss, on
    per-token advantages."""
    generator = torch.Generator().manual_seed(1)
    mask = batch["mask"]
    token_advantages = torch.randn(mask.shape, generator=generator, dtype=torch.float64) * mask

    def lab_loss(leaf):
        per_token = clipped_policy_loss(leaf, batch["old_logps"], token_advantages, s["epsilon"])
        return torch.where(mask.bool(), per_token, torch.zeros_like(per_token)).sum() / mask.sum()

    _, actor, _ = verl_configs.compose(verl_block["options"])
    lab = _loss_and_grad(lab_loss, batch["logps"])
    theirs = _loss_and_grad(lambda leaf: verl_actor_loss(actor, leaf, batch, token_advantages, mask, None),
                            batch["logps"])
    return _row(label, "verl actor loss", lab, theirs, _note(verl_block))


def _simpo_row(label, s, trl_block, batch, output_dir):
    """The lab's SimPO on length-averaged log-probs and TRL's CPOTrainer.cpo_loss; pairs are rows (0, 1),
    (2, 3), ... of the batch."""
    from trl.experimental.cpo import CPOTrainer

    config = trl_config(trl_block, output_dir)
    from accelerate import Accelerator

    trainer = CPOTrainer.__new__(CPOTrainer)  # what CPOTrainer.__init__ derives for cpo_loss (lines 353-371)
    trainer.accelerator = Accelerator(cpu=True)
    for name in ("beta", "label_smoothing", "loss_type", "simpo_gamma", "alpha"):
        setattr(trainer, name, getattr(config, name))
    mask = batch["mask"]

    def averaged(leaf):  # (N, R) -> (N,): each response's mean log-prob over its kept tokens
        return PreferenceFamily(lab_config(s)).sequence_logps(leaf, mask)

    def lab_loss(leaf):
        sequence = averaged(leaf)
        return simpo_loss(sequence[0::2], sequence[1::2], s["dpo_beta"], s["simpo_gamma"]).mean()

    def trl_loss(leaf):
        sequence = averaged(leaf)
        return trainer.cpo_loss(sequence[0::2], sequence[1::2])[0].mean()

    return _row(label, "TRL CPOTrainer.cpo_loss", _loss_and_grad(lab_loss, batch["logps"]),
                _loss_and_grad(trl_loss, batch["logps"]), _note(trl_block))


def convention_rows(verl_configs, output_dir):
    """Each documented convention difference, measured: (convention, what is compared, size)."""
    import trl
    from trl.trainer.utils import nanstd

    from verl.trainer.ppo import core_algos

    rows = []
    small_group = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)  # one success in four
    lab = group_relative_advantages(small_group, 4)
    trl_advantages = (small_group - small_group.mean()) / (nanstd(small_group) + 1e-4)  # grpo_trainer.py 2770-2787
    rows.append(("group std: TRL's is the unbiased one (eps 1e-4), the lab's the population std",
                 "advantages of rewards (1, 0, 0, 0)", (lab - trl_advantages).abs().max().item()))
    index = ["p"] * 4
    token_rewards = torch.zeros(4, 3, dtype=torch.float64)
    token_rewards[:, -1] = small_group
    verl_advantages, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, torch.ones(4, 3), index)
    rows.append(("group std: verl's is torch.std (unbiased, eps 1e-6)", "advantages of rewards (1, 0, 0, 0)",
                 (lab - verl_advantages[:, 0]).abs().max().item()))
    verl_rloo, _ = core_algos.compute_rloo_outcome_advantage(token_rewards.clone(), torch.ones(4, 3), index)
    rows.append(("RLOO advantages: verl's estimator (no convention differs)", "advantages of rewards (1, 0, 0, 0)",
                 (rloo_advantages(small_group.unsqueeze(0))[0] - verl_rloo[:, 0]).abs().max().item()))
    rows.extend(_gae_rows(core_algos))
    logratio = torch.tensor([12.0, 25.0], dtype=torch.float64)
    verl_k3 = core_algos.kl_penalty(torch.zeros(2, dtype=torch.float64), logratio, "low_var_kl")
    rows.append(("verl clamps k3 at 10 (and the log-ratio at 20)", "k3 at ref - logp = 12",
                 (kl_k3(torch.zeros(2, dtype=torch.float64), logratio) - verl_k3)[0].abs().item()))
    rows.extend(_clip_rows(core_algos, verl_configs))
    rows.extend(_trl_default_rows(trl, output_dir))
    return rows


def _gae_rows(core_algos):
    """verl's GAE (terminal at the last kept token) against the lab's gae atom, before and after whitening."""
    generator = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    rewards = torch.zeros(3, 4, dtype=torch.float64)
    rewards[torch.arange(3), mask.sum(dim=1) - 1] = torch.tensor([1.0, 0.0, 0.25], dtype=torch.float64)
    values = torch.rand(3, 4, generator=generator, dtype=torch.float64) * mask
    gamma, lam = 1.0, 0.95
    verl_advantages, verl_returns = core_algos.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    lab_advantages, lab_returns = torch.zeros_like(values), torch.zeros_like(values)
    for row in range(3):
        kept = int(mask[row].sum())
        next_values = torch.cat([values[row, 1:kept], values.new_zeros(1)])
        done = torch.arange(kept) == kept - 1  # the response ends: terminal, as in verl
        advantages, returns = gae(rewards[row, :kept], values[row, :kept], next_values, done, done, gamma, lam)
        lab_advantages[row, :kept], lab_returns[row, :kept] = advantages, returns
    kept = mask.bool()
    mean, std = lab_advantages[kept].mean(), lab_advantages[kept].std(correction=0)
    whitened = (lab_advantages - mean) / (std + WHITEN_EPS)
    return [
        ("GAE returns: verl's compute_gae_advantage_return (no convention differs)", "3 responses, gamma 1, lam 0.95",
         (lab_returns - verl_returns)[kept].abs().max().item()),
        ("GAE whitening: verl's variance is unbiased, eps 1e-8 inside the sqrt", "the same advantages, whitened",
         (whitened - verl_advantages)[kept].abs().max().item()),
    ]


def _clip_rows(core_algos, verl_configs):
    """verl's log-ratio clamp at 20 and its default dual-clip, against the lab's clipped loss."""
    rows = []
    _, actor, _ = verl_configs.compose({ACTOR + "loss_agg_mode": "token-mean"})  # verl's defaults: dual-clip 3.0
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[1.5, 25.0]], dtype=torch.float64)  # ratios e**1.5 = 4.5 and e**25
    advantages = torch.full((1, 2), -1.0, dtype=torch.float64)
    mask = torch.ones(1, 2)
    lab = clipped_policy_loss(logp[:, :1], old[:, :1], advantages[:, :1]).item()
    verl, _ = core_algos.compute_policy_loss_vanilla(old[:, :1], logp[:, :1], advantages[:, :1], mask[:, :1],
                                                     config=actor)
    rows.append(("verl's vanilla loss always applies dual-clip (clip_ratio_c 3.0 unless set)",
                 "A = -1 at ratio 4.5", abs(lab - verl.item())))
    _, actor_off, _ = verl_configs.compose({ACTOR + "loss_agg_mode": "token-mean",
                                            ACTOR + "clip_ratio_c": VERL_NO_DUAL_CLIP})
    lab = clipped_policy_loss(logp[:, 1:], old[:, 1:], advantages[:, 1:], check=False).item()
    verl, _ = core_algos.compute_policy_loss_vanilla(old[:, 1:], logp[:, 1:], advantages[:, 1:], mask[:, 1:],
                                                     config=actor_off)
    rows.append(("verl clamps the log-ratio at 20 (dual-clip off)", "A = -1 at log-ratio 25 (relative)",
                 abs(lab - verl.item()) / abs(lab)))
    return rows


def _trl_default_rows(trl, output_dir):
    """What TRL's defaults change when the map's settings are left out: use_bias_correction_kl, and RLOO's
    sequence ratio against the lab's token loss."""
    batch = conformance_batch()
    s = run_settings({})
    advantages, mask, weights = lab_inputs(s, batch)
    lab = _loss_and_grad(lambda leaf: lab_group_loss(s, leaf, batch, advantages, mask, weights), batch["logps"])
    block = library_blocks(s)["trl"]
    default = dict(block, options={key: value for key, value in block["options"].items()
                                   if key != "use_bias_correction_kl"})
    config = trl_config(default, output_dir)
    theirs = _loss_and_grad(lambda leaf: trl_group_loss(config, leaf, batch, advantages, mask, weights),
                            batch["logps"])
    rows = [("TRL 1.16 multiplies k3 by the ratio by default (use_bias_correction_kl=True)",
             "loss / gradient, the default GRPO batch",
             f"{abs(lab[0] - theirs[0]):.3g} / {(lab[1] - theirs[1]).abs().max().item():.3g}")]
    # the map leaves delta out below 1 + epsilon_high: what it would do there
    s = run_settings({"dual_clip": 1.1})
    lab = _loss_and_grad(lambda leaf: lab_group_loss(s, leaf, batch, advantages, mask, weights), batch["logps"])
    block = library_blocks(s)["trl"]
    config = trl_config(dict(block, options={**block["options"], "delta": 1.1}), output_dir)
    theirs = _loss_and_grad(lambda leaf: trl_group_loss(config, leaf, batch, advantages, mask, weights),
                            batch["logps"])
    rows.append(("TRL's delta caps A > 0 ratios too: below 1 + epsilon_high it is not dual-clip",
                 "loss / gradient, --dual-clip 1.1 as delta=1.1",
                 f"{abs(lab[0] - theirs[0]):.3g} / {(lab[1] - theirs[1]).abs().max().item():.3g}"))
    return rows


# ---------------------------------------------------------------------------------------------
# The atoms of the second wave (the variants of 2025-2026), each against the library function that computes it
# ---------------------------------------------------------------------------------------------

ATOM_SEEDS = (0, 1, 2)
ATOM_PROMPTS, ATOM_GROUP, ATOM_LENGTH = 3, 4, 6
# "the library adds 1e-8 to token counts" (verl's masked_mean, geo_mean's n_i): a relative 1e-8 at most
COUNT_EPS_TOLERANCE = 1e-8


def atom_batch(seed):
    """One float64 batch of ATOM_PROMPTS x ATOM_GROUP responses, ragged (1 to ATOM_LENGTH kept tokens, one
    full row per group), with finite filler at padding: log-probs below 0 (probabilities in (0.05, 0.98),
    as DPPO's binary KL needs p < 1), per-sequence advantages of both signs with a few exact zeros,
    rewards on two objectives and logits over a vocabulary of 7."""
    generator = torch.Generator().manual_seed(100 + seed)
    count, length = ATOM_PROMPTS * ATOM_GROUP, ATOM_LENGTH

    def uniform(*shape):
        return torch.rand(*shape, generator=generator, dtype=torch.float64)

    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    lengths = torch.randint(1, length + 1, (count,), generator=generator)
    lengths[::ATOM_GROUP] = length
    mask = (torch.arange(length).expand(count, length) < lengths.unsqueeze(1)).long()  # (N, R)
    old_logps = -3.0 * uniform(count, length) - 0.02
    logps = (old_logps + 0.5 * normal(count, length)).clamp(max=-0.02)
    advantages = normal(count)
    advantages[[1, 6]] = 0.0
    rewards = (uniform(count, 2) * 3).floor() / 2  # (N, K=2): 0, 0.5 or 1 on each objective
    rewards[ATOM_GROUP:2 * ATOM_GROUP, 0] = 1.0  # one group ties on the first objective
    return {
        "mask": mask, "lengths": lengths, "advantages": advantages, "rewards": rewards,
        "old_logps": old_logps, "logps": logps, "ref_logps": old_logps + 0.3 * normal(count, length),
        "sampler_logps": (old_logps - 1.8 * uniform(count, length) + 0.9).clamp(max=-0.01),  # ratios 0.4 to 2.5
        "logits": 2.0 * normal(count, length, 7),
    }


def _masked_difference(lab, theirs, kept):
    """Largest |lab - theirs| on the kept positions (both may hold anything at padding)."""
    return (lab.double() - theirs.double())[kept].abs().max().item()


class AtomRow:
    """One row of the atom table: `compare(batch, seed)` -> (value difference, gradient difference or None)
    for one seed; the row keeps the largest over ATOM_SEEDS. `tolerance` None: a measured convention, not
    a failure."""

    def __init__(self, atom, library, compare, convention="none", tolerance=TOLERANCE):
        self.atom, self.library, self.compare = atom, library, compare
        self.convention, self.tolerance = convention, tolerance

    def run(self):
        values, grads = [], []
        for seed in ATOM_SEEDS:
            value, grad = self.compare(atom_batch(seed), seed)
            values.append(value)
            grads.append(grad)
        grad = None if grads[0] is None else max(grads)
        return {"atom": self.atom, "library": self.library, "seeds": len(ATOM_SEEDS), "value": max(values),
                "grad": grad, "convention": self.convention, "tolerance": self.tolerance}


def _loss_pair(lab, theirs, batch, source="logps"):
    """(value difference, gradient difference) of two scalar losses of batch[source]."""
    mine = _loss_and_grad(lab, batch[source])
    other = _loss_and_grad(theirs, batch[source])
    return abs(mine[0] - other[0]), (mine[1] - other[1]).abs().max().item()


def _token_advantages(batch):
    return batch["advantages"].unsqueeze(1) * batch["mask"]  # (N,) -> (N, R), as verl's estimators


def _verl_loss_row(atom, mode, lab, overrides, verl_configs, convention="none", tolerance=TOLERANCE):
    """A policy-loss atom against verl's actor loss (ppo_loss, its registered policy_loss.loss_mode)."""
    _, actor, _ = verl_configs.compose({ACTOR + "loss_agg_mode": "token-mean", ACTOR + "policy_loss.loss_mode": mode,
                                        **overrides})

    def compare(batch, seed):
        torch.manual_seed(seed)  # clip_cov draws its tokens from the global generator
        their = _loss_and_grad(lambda leaf: verl_actor_loss(actor, leaf, batch, _token_advantages(batch),
                                                            batch["mask"], None), batch["logps"])
        mine = _loss_and_grad(lambda leaf: lab(leaf, batch, seed), batch["logps"])
        return abs(mine[0] - their[0]), (mine[1] - their[1]).abs().max().item()

    return AtomRow(atom, f"verl loss_mode={mode} (actor loss)", compare, convention, tolerance)


def _p(leaf, batch):
    """The P arguments of a section-9 token loss."""
    return leaf, batch["old_logps"], batch["ref_logps"], batch["advantages"], batch["mask"]


def verl_loss_rows(verl_configs):
    import rl_lab

    clip = {ACTOR + "clip_ratio_low": 0.2, ACTOR + "clip_ratio_high": 0.28}
    cov = {ACTOR + "policy_loss.clip_cov_ratio": 0.2, ACTOR + "policy_loss.clip_cov_lb": 0.02,
           ACTOR + "policy_loss.clip_cov_ub": 5.0}
    return [
        _verl_loss_row("dppo_policy_loss(kind='tv', delta=0.2, delta_high=0.28, cap=3.0)", "dppo_tv",
                       lambda leaf, batch, seed: rl_lab.dppo_policy_loss(*_p(leaf, batch), kind="tv", delta=0.2,
                                                                       delta_high=0.28, cap=3.0),
                       {**clip, ACTOR + "clip_ratio_c": 3.0}, verl_configs),
        _verl_loss_row("dppo_policy_loss(kind='kl', delta=0.05, delta_high=0.1, cap=3.0)", "dppo_kl",
                       lambda leaf, batch, seed: rl_lab.dppo_policy_loss(*_p(leaf, batch), kind="kl", delta=0.05,
                                                                       delta_high=0.1, cap=3.0),
                       {ACTOR + "clip_ratio_low": 0.05, ACTOR + "clip_ratio_high": 0.1, ACTOR + "clip_ratio_c": 3.0},
                       verl_configs),
        _verl_loss_row("gmpo_policy_loss(epsilon=0.2, epsilon_high=0.28)", "geo_mean",
                       lambda leaf, batch, seed: rl_lab.gmpo_policy_loss(*_p(leaf, batch), epsilon=0.2,
                                                                       epsilon_high=0.28),
                       clip, verl_configs, "verl adds 1e-8 to each response's token count (n_i + 1e-8)",
                       COUNT_EPS_TOLERANCE),
        _verl_loss_row("clip_cov_policy_loss(fraction=0.2, cov_low=0.02, cov_high=5.0)", "clip_cov",
                       lambda leaf, batch, seed: rl_lab.clip_cov_policy_loss(
                           *_p(leaf, batch), epsilon=0.2, epsilon_high=0.28, fraction=0.2, cov_low=0.02,
                           cov_high=5.0, generator=torch.Generator().manual_seed(seed)),
                       {**clip, **cov}, verl_configs, "verl draws from torch's global generator (seeded the "
                       "same here); its means over kept tokens add 1e-8 to the count", COUNT_EPS_TOLERANCE),
        _verl_loss_row("kl_cov_policy_loss(fraction=0.2, coef=0.1)", "kl_cov",
                       lambda leaf, batch, seed: rl_lab.kl_cov_policy_loss(*_p(leaf, batch), fraction=0.2, coef=0.1),
                       {ACTOR + "policy_loss.kl_cov_ratio": 0.2, ACTOR + "policy_loss.ppo_kl_coef": 0.1},
                       verl_configs),
        _verl_loss_row("dro_policy_loss(tau=0.5)", "dro",
                       lambda leaf, batch, seed: rl_lab.dro_policy_loss(*_p(leaf, batch), tau=0.5),
                       {ACTOR + "policy_loss.dro_beta": 0.5}, verl_configs),
        _verl_loss_row("gpg_policy_loss()", "gpg",
                       lambda leaf, batch, seed: rl_lab.gpg_policy_loss(leaf, batch["ref_logps"], batch["advantages"],
                                                                      batch["mask"]),
                       {}, verl_configs),
    ]


def _index():
    """verl's group ids: response i belongs to prompt i // ATOM_GROUP."""
    import numpy as np

    return np.array([i // ATOM_GROUP for i in range(ATOM_PROMPTS * ATOM_GROUP)])


def _outcome_rewards(batch, column=0):
    """(N, R) token rewards with the response's reward on its last kept token, as verl's reward manager."""
    rewards = torch.zeros_like(batch["old_logps"])
    rewards[torch.arange(rewards.shape[0]), batch["lengths"] - 1] = batch["rewards"][:, column]
    return rewards


def _grouped(values):
    return values.reshape(ATOM_PROMPTS, ATOM_GROUP)


BESSEL_FLOAT32 = "float32 Bessel factor n/(n-1) (an integer count divided in torch's default dtype)"


def _advantage_row(atom, estimator, lab, config=None, convention="none", tolerance=TOLERANCE, mask_dtype=None):
    """An advantage atom (B, G) against verl's registered estimator's (N, R) output, on the kept tokens;
    mask_dtype: the response mask as that dtype (verl's own is int64)."""

    def compare(batch, seed):
        from verl.trainer.ppo import core_algos

        kept = batch["mask"].bool()
        mask = batch["mask"] if mask_dtype is None else batch["mask"].to(mask_dtype)
        theirs, _ = core_algos.get_adv_estimator_fn(estimator)(
            token_level_rewards=_outcome_rewards(batch), response_mask=mask, index=_index(), config=config)
        mine = lab(batch).reshape(-1, 1).expand_as(theirs)  # (B, G) -> (N, R): one value on every token
        return _masked_difference(mine, theirs, kept), None

    return AtomRow(atom, f"verl adv_estimator={estimator}", compare, convention, tolerance)


def verl_other_rows(verl_configs):
    import rl_lab
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights
    from verl.utils.torch_functional import entropy_from_logits

    _, _, algorithm = verl_configs.compose({"algorithm.gamma": 0.9})
    _, _, algorithm_default = verl_configs.compose({})
    def baseline(batch):
        return rl_lab.reinforce_pp_baseline_advantages(_grouped(batch["rewards"][:, 0]), _grouped(batch["lengths"]))

    rows = [
        _advantage_row("reinforce_pp_baseline_advantages(lengths=L)", "reinforce_plus_plus_baseline", baseline,
                       convention="float64 mask: verl whitens over tokens with 1e-8 added to the counts (masked_mean)",
                       tolerance=COUNT_EPS_TOLERANCE, mask_dtype=torch.float64),
        _advantage_row("reinforce_pp_baseline_advantages(lengths=L)", "reinforce_plus_plus_baseline", baseline,
                       convention=f"int64 mask (verl's own): masked_var's {BESSEL_FLOAT32}", tolerance=None),
        _advantage_row("opo_advantages(lengths=L)", "opo",
                       lambda batch: rl_lab.opo_advantages(_grouped(batch["rewards"][:, 0]), _grouped(batch["lengths"]))),
        _advantage_row("passk_advantages(epsilon=1e-6)", "grpo_passk",
                       lambda batch: rl_lab.passk_advantages(_grouped(batch["rewards"][:, 0])), config=algorithm_default),
        _advantage_row("gpg_advantages(alpha_count='reward')", "gpg",
                       lambda batch: rl_lab.gpg_advantages(_grouped(batch["rewards"][:, 0])),
                       convention="verl's alpha = N / #(R != 0) divides integers: float32", tolerance=None),
    ]

    for dtype, convention, tolerance in (
            (torch.float64, "float64 mask: verl whitens with 1e-8 added to the counts (masked_mean)",
             COUNT_EPS_TOLERANCE),
            (torch.int64, f"int64 mask (verl's own): masked_var's {BESSEL_FLOAT32}", None)):
        def reinforce_pp(batch, seed, dtype=dtype):
            kept = batch["mask"].bool()
            token_rewards = _outcome_rewards(batch) + 0.1 * batch["ref_logps"] * batch["mask"]  # a reward every token
            mine, mine_returns = rl_lab.reinforce_pp_advantages(token_rewards, batch["mask"], gamma=0.9)
            theirs, their_returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(
                token_rewards, batch["mask"].to(dtype), config=algorithm)
            return max(_masked_difference(mine, theirs, kept),
                       _masked_difference(mine_returns, their_returns, kept)), None

        rows.append(AtomRow("reinforce_pp_advantages(gamma=0.9)",
                            "verl adv_estimator=reinforce_plus_plus (and returns)", reinforce_pp, convention,
                            tolerance))
    rows.append(AtomRow("gdpo_advantages(reward_weights=(1, 0.5))", "verl adv_estimator=gdpo (2 reward keys)",
                        _gdpo_verl, "verl: eps 1e-6 (the lab's, TRL's 1e-4), its second stage whitens over tokens "
                        "(length-weighted), its rewards float32", None))

    for kind in ("k3+", "k1+"):
        def straight_through(batch, seed, kind=kind):
            kept = batch["mask"].bool()

            def lab(leaf):
                return rl_lab.kl_straight_through(leaf, batch["ref_logps"], kind)

            def theirs(leaf):
                return core_algos.kl_penalty(leaf, batch["ref_logps"], kind)

            difference = _masked_difference(lab(batch["logps"]), theirs(batch["logps"]), kept)
            _, grad = _loss_pair(lambda leaf: (lab(leaf) * batch["mask"]).sum(),
                                 lambda leaf: (theirs(leaf) * batch["mask"]).sum(), batch)
            return difference, grad

        rows.append(AtomRow(f"kl_straight_through(kind='{kind}')", f"verl kl_penalty('{kind}') (kl_loss_type)",
                            straight_through))

    def entropy(batch, seed):
        kept = batch["mask"].bool()
        difference = _masked_difference(rl_lab.token_entropy(batch["logits"]), entropy_from_logits(batch["logits"]),
                                        kept)
        _, grad = _loss_pair(lambda leaf: (rl_lab.token_entropy(leaf) * batch["mask"]).sum(),
                             lambda leaf: (entropy_from_logits(leaf) * batch["mask"]).sum(), batch, "logits")
        return difference, grad

    rows.append(AtomRow("token_entropy(logits)", "verl entropy_from_logits", entropy,
                        "verl: logsumexp - sum p*logits (the lab: -sum p*log p), float64 rounding"))

    for level, threshold, low, high, mode in (("token", 2.0, None, 2.0, "truncate"),
                                              ("sequence", 2.0, None, 2.0, "truncate"),
                                              ("token", "0.5_2.0", 0.5, 2.0, "mask"),
                                              ("sequence", "0.5_2.0", 0.5, 2.0, "mask")):
        def rollout(batch, seed, level=level, threshold=threshold, low=low, high=high, mode=mode):
            kept = batch["mask"].bool()
            mine = rl_lab.rollout_correction_weights(batch["old_logps"], batch["sampler_logps"], batch["mask"],
                                                     level=level, mode=mode, low=low, high=high)
            with _quiet():
                theirs, _ = compute_rollout_correction_weights(batch["old_logps"] - batch["sampler_logps"],
                                                               batch["mask"], rollout_is=level,
                                                               rollout_is_threshold=threshold)
            return _masked_difference(mine, theirs, kept), None

        rows.append(AtomRow(f"rollout_correction_weights(level='{level}', mode='{mode}', low={low}, high={high})",
                            f"verl compute_rollout_correction_weights(rollout_is='{level}', threshold={threshold!r})",
                            rollout, "verl clamps the log-ratio at +-20 (not reached here)"))
    return rows


GDPO_WEIGHTS = (1.0, 0.5)


def _gdpo_verl(batch, seed):
    """verl's GDPO (two reward keys, weights GDPO_WEIGHTS) against the lab's gdpo_advantages: the size of
    the convention difference (eps 1e-6 vs 1e-4, token-weighted second stage, float32 rewards)."""
    import rl_lab
    from verl.trainer.ppo import core_algos

    count = ATOM_PROMPTS * ATOM_GROUP
    config = {"gdpo_reward_keys": ["first", "second"], "gdpo_reward_weights": list(GDPO_WEIGHTS),
              "norm_adv_by_std_in_grpo": True}
    non_tensor = {"first": batch["rewards"][:, 0].numpy(), "second": batch["rewards"][:, 1].numpy()}
    layout = {"prompts": torch.zeros(count, 1, dtype=torch.long),
              "attention_mask": torch.cat([torch.ones(count, 1, dtype=torch.long), batch["mask"]], dim=1)}
    theirs, _ = core_algos.compute_gdpo_outcome_advantage(
        _outcome_rewards(batch), batch["mask"], _index(), config=config, non_tensor_batch=non_tensor, batch=layout)
    mine = rl_lab.gdpo_advantages(batch["rewards"].reshape(ATOM_PROMPTS, ATOM_GROUP, 2),
                                  torch.tensor(GDPO_WEIGHTS, dtype=torch.float64))
    return _masked_difference(mine.reshape(-1, 1).expand_as(theirs), theirs, batch["mask"].bool()), None


def trl_source_block(method, start, end):
    """The lines of TRL's `method` strictly between the first line whose text is `start` and the next one
    whose text is `end` (both stripped), dedented: library code that runs only inside a trainer's
    generation step, executed as TRL wrote it on given tensors."""
    import inspect
    import textwrap

    lines = inspect.getsource(method).splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() == start)
    last = next(i for i in range(first + 1, len(lines)) if lines[i].strip() == end)
    return textwrap.dedent("\n".join(lines[first + 1:last]))


def _trl_is_weights(batch, mode, low, high):
    """TRL's importance-sampling weights of the vLLM sampler (_generate_and_score_completions, the block
    under `if self.use_vllm and self.vllm_importance_sampling_correction:`), run on the batch."""
    import types

    import trl

    code = trl_source_block(trl.GRPOTrainer._generate_and_score_completions,
                            "if self.use_vllm and self.vllm_importance_sampling_correction:",
                            "# Compute the per-token log probabilities for the reference model")
    trainer = types.SimpleNamespace(vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_min=low,
                                    vllm_importance_sampling_clip_max=high)
    scope = {"self": trainer, "torch": torch, "math": math, "completion_mask": batch["mask"], "tool_mask": None,
             "old_per_token_logps": batch["old_logps"], "sampling_per_token_logps": batch["sampler_logps"]}
    exec(compile(code, "trl/trainer/grpo_trainer.py", "exec"), scope)  # noqa: S102: the installed library's code
    return scope["vllm_importance_sampling_ratio"]


def _trl_gdpo(batch, weights):
    """TRL's multi_objective_aggregation="normalize_then_sum" advantages (_generate_and_score_completions)."""
    import types

    import trl
    from trl.trainer.utils import nanstd

    code = trl_source_block(trl.GRPOTrainer._generate_and_score_completions,
                            'elif self.multi_objective_aggregation == "normalize_then_sum":', "else:")
    count, objectives = batch["rewards"].shape
    trainer = types.SimpleNamespace(reward_funcs=[None] * objectives,
                                    reward_weights=torch.tensor(weights, dtype=torch.float64))
    scope = {"self": trainer, "torch": torch, "nanstd": nanstd, "device": "cpu", "num_generations": ATOM_GROUP,
             "rewards_per_func": batch["rewards"], "unscorable_mask": torch.zeros(count, dtype=torch.bool)}
    exec(compile(code, "trl/trainer/grpo_trainer.py", "exec"), scope)  # noqa: S102: the installed library's code
    return scope["advantages"]


def trl_rows(output_dir):
    import rl_lab
    import trl

    def grpo_config(**options):
        return trl_config({"config": "GRPOConfig", "options": options}, output_dir)

    def loss_row(atom, lab, options, convention="none"):
        config = grpo_config(**options)

        def compare(batch, seed):
            return _loss_pair(lambda leaf: lab(leaf, batch),
                              lambda leaf: trl_group_loss(config, leaf, batch, batch["advantages"], batch["mask"],
                                                          None), batch)

        shown = ", ".join(f"{key}={value!r}" for key, value in options.items())
        return AtomRow(atom, f"TRL GRPOTrainer._compute_loss ({shown})", compare, convention)

    def ratio_weighted_k3(leaf, batch):
        advantages = batch["advantages"].unsqueeze(1).expand_as(leaf)
        per_token = rl_lab.clipped_policy_loss(leaf, batch["old_logps"], advantages, 0.2) + 0.04 * \
            rl_lab.kl_k3_is_corrected(leaf, batch["old_logps"], batch["ref_logps"])
        return rl_lab.reduce_token_loss(per_token, batch["mask"], "sequence")

    rows = [
        loss_row("vespo_policy_loss() (k 2/3, lambda 3/2)", lambda leaf, batch: rl_lab.vespo_policy_loss(*_p(leaf, batch)),
                 {"loss_type": "vespo", "beta": 0.0}),
        loss_row("luspo_policy_loss(epsilon=3e-4, epsilon_high=4e-4)",
                 lambda leaf, batch: rl_lab.luspo_policy_loss(*_p(leaf, batch)),
                 {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": 3e-4,
                  "epsilon_high": 4e-4, "beta": 0.0}),
        loss_row("clipped_policy_loss + 0.04 * kl_k3_is_corrected, sequence mean", ratio_weighted_k3,
                 {"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": True}),
    ]

    def off_policy(batch, seed):
        mine = rl_lab.off_policy_sequence_mask(batch["logps"], batch["sampler_logps"], batch["advantages"],
                                               batch["mask"], threshold=0.05)
        theirs = trl.GRPOTrainer.get_off_policy_mask(batch["advantages"].unsqueeze(1), batch["logps"],
                                                     batch["sampler_logps"], batch["mask"], 0.05)
        return (mine.double() - theirs[:, 0].double()).abs().max().item(), None

    rows.append(AtomRow("off_policy_sequence_mask(threshold=0.05)", "TRL GRPOTrainer.get_off_policy_mask",
                        off_policy))

    for level, mode, low, high in (("token", "truncate", None, 2.0), ("sequence", "truncate", 0.5, 3.0),
                                   ("token", "mask", 0.5, 2.0), ("sequence", "mask", None, 3.0)):
        def weights(batch, seed, level=level, mode=mode, low=low, high=high):
            mine = rl_lab.rollout_correction_weights(batch["old_logps"], batch["sampler_logps"], batch["mask"],
                                                     level=level, mode=mode, low=low, high=high)
            theirs = _trl_is_weights(batch, f"{level}_{mode}", low, high).expand_as(mine)
            return _masked_difference(mine, theirs, batch["mask"].bool()), None

        rows.append(AtomRow(f"rollout_correction_weights(level='{level}', mode='{mode}', low={low}, high={high})",
                            f"TRL vllm_importance_sampling_mode='{level}_{mode}' (its block of "
                            "_generate_and_score_completions, run on the batch)", weights))

    def gdpo(batch, seed):
        mine = rl_lab.gdpo_advantages(batch["rewards"].reshape(ATOM_PROMPTS, ATOM_GROUP, 2),
                                      torch.tensor(GDPO_WEIGHTS, dtype=torch.float64))
        return (mine.reshape(-1) - _trl_gdpo(batch, GDPO_WEIGHTS)).abs().max().item(), None

    rows.append(AtomRow("gdpo_advantages(reward_weights=(1, 0.5))", "TRL multi_objective_aggregation="
                        "'normalize_then_sum' (its block of _generate_and_score_completions, run on the batch)", gdpo,
                        f"TRL's nanstd: a {BESSEL_FLOAT32}", None))

    for quantile in (0.2, 0.5, 0.0):
        def entropy_mask(batch, seed, quantile=quantile):
            trainer = _trl_trainer(trl.GRPOTrainer, grpo_config(top_entropy_quantile=quantile))
            entropies = rl_lab.token_entropy(batch["logits"])
            mine = rl_lab.high_entropy_token_mask(entropies, batch["mask"], top_quantile=quantile)
            theirs = trainer.get_high_entropy_mask(entropies, batch["mask"], 1 - quantile)
            return float((mine != theirs).sum()), None

        rows.append(AtomRow(f"high_entropy_token_mask(top_quantile={quantile})",
                            "TRL GRPOTrainer.get_high_entropy_mask", entropy_mask,
                            "TRL takes the quantile in float32 (value: tokens whose mask differs)", None))
    return rows


def atom_rows(verl_configs, output_dir):
    """Every section-9 atom a library implements, against that library's own function, over ATOM_SEEDS."""
    return [row.run() for row in verl_loss_rows(verl_configs) + verl_other_rows(verl_configs) + trl_rows(output_dir)]


def atom_table(rows):
    lines = ["| lab atom | library code | seeds | max abs diff, value | max abs diff, gradient | convention | "
             "tolerance |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        grad = "-" if row["grad"] is None else f"{row['grad']:.1e}"
        tolerance = "measured" if row["tolerance"] is None else f"{row['tolerance']:.0e}"
        lines.append(f"| {row['atom']} | {row['library']} | {row['seeds']} | {row['value']:.1e} | {grad} | "
                     f"{row['convention']} | {tolerance} |")
    return "\n".join(lines) + "\n"


def atom_failures(rows):
    return [row for row in rows if row["tolerance"] is not None
            and max(row["value"], row["grad"] or 0.0) > row["tolerance"]]


# ---------------------------------------------------------------------------------------------
# The Markdown table README holds
# ---------------------------------------------------------------------------------------------


def tolerance_of(row):
    """The largest difference a matched row may show: float64 rounding, or float32's for TRL's sapo."""
    if row["library"].startswith("TRL") and row["setting"].startswith("--algorithm sapo"):
        return SAPO_TRL_TOLERANCE
    return TOLERANCE


def conformance_table(rows, conventions):
    """Markdown: the losses and their largest differences, then the convention differences measured."""
    lines = ["| lab setting | library code | loss (lab) | loss (library) | max abs diff, loss | max abs diff, "
             "gradient | map |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['setting']} | {row['library']} | {row['lab_loss']:.10f} | {row['library_loss']:.10f} "
                     f"| {row['loss_difference']:.1e} | {row['grad_difference']:.1e} | {row['note']} |")
    lines += ["", "| convention difference | measured on | size |", "|---|---|---|"]
    for convention, measured_on, size in conventions:
        shown = size if isinstance(size, str) else f"{size:.3g}"
        lines.append(f"| {convention} | {measured_on} | {shown} |")
    return "\n".join(lines) + "\n"


def run_conformance():
    """(Markdown table, failures): a matched row whose loss or gradient differs beyond TOLERANCE fails."""
    libraries()
    verl_configs = VerlConfigs()
    try:
        with tempfile.TemporaryDirectory() as output_dir:
            rows = conformance_rows(verl_configs, output_dir)
            conventions = convention_rows(verl_configs, output_dir)
            atoms = atom_rows(verl_configs, output_dir)
    finally:
        verl_configs.close()
    failures = [row for row in rows if row["note"].startswith("matched")
                and max(row["loss_difference"], row["grad_difference"]) > tolerance_of(row)]
    failures += [{"setting": row["atom"], "library": row["library"], "loss_difference": row["value"],
                  "grad_difference": row["grad"] or 0.0} for row in atom_failures(atoms)]
    return conformance_table(rows, conventions) + "\n" + atom_table(atoms), failures


# ---------------------------------------------------------------------------------------------
# e2e: an exported TRL script trains on a CPU; the lab's atoms recompute one step of it
# ---------------------------------------------------------------------------------------------

E2E_STEPS = 2  # lab iterations: with num_iterations 2, 4 optimizer steps of the GRPO family
E2E_TOLERANCE = 1e-6  # float32: TRL's forward pass and the lab's recompute of it, same model and inputs; the
# gradients' tolerance is relative to their largest entry (float32 rounding grows with it)
CAPTURED_CALL = 1  # the second loss of the run: after one optimizer step, so ratios and margins leave 1 and 0
# the exports `test_bridge` trains (each on both tasks): name -> online_tokens options
E2E_EXPORTS = {
    "grpo": {},
    "rloo": {"advantage": "rloo"},
    "dr-grpo": {"reduction": "constant", "scale_rewards": "none"},
    "dapo": {"epsilon_high": 0.28, "reduction": "token", "overlong_penalty": 2},
    "cispo": {"algorithm": "cispo", "reduction": "token"},
    "gspo": {"algorithm": "gspo"},
    "sapo": {"algorithm": "sapo"},
    "dpo-offline": {"algorithm": "dpo", "offline": True},
    "dpo-online": {"algorithm": "dpo"},
}
# Countdown with B = 4 prompts (the transformer's default is 16): the same code paths, a quarter of the sampling
E2E_TASKS = {"binary": {}, "countdown": {"task": "countdown", "policy": "transformer", "prompts": 4}}
_WARM_STARTS = {}  # (task, seed) -> the tiny model's state after the script's SFT warm start


def _reusing_warm_start(script):
    """Make the loaded script's warm start run once per task and process (the Countdown one takes most of a
    run's time): later runs of the same task load its result, the same tensors a new warm start would give."""
    original = script.warm_start

    def warm_start(model, tokenizer, dataset):
        key = (script.TASK, script.SEED)
        if key not in _WARM_STARTS:
            original(model, tokenizer, dataset)
            _WARM_STARTS[key] = {name: value.detach().clone() for name, value in model.state_dict().items()}
        model.load_state_dict(_WARM_STARTS[key])

    script.warm_start = warm_start


def load_script(path):
    """The exported script as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location("exported_trl_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parameters(model):
    return [param for param in model.parameters() if param.requires_grad]


def capturing(trainer_class):
    """A subclass of TRL's trainer that keeps one call of its own _compute_loss (the GRPO family's and
    DPOTrainer's): the inputs TRL fed it, the model's parameters, the loss and its gradient."""

    class Capturing(trainer_class):
        captured = None
        calls = 0

        def _compute_loss(self, model, inputs, *rest):
            result = super()._compute_loss(model, inputs, *rest)
            loss = result[0] if isinstance(result, tuple) else result
            if type(self).calls == CAPTURED_CALL:
                grads = torch.autograd.grad(loss, _parameters(model), retain_graph=True)
                type(self).captured = {
                    "inputs": {key: value.detach().clone() for key, value in inputs.items()
                               if isinstance(value, torch.Tensor)},
                    "state": {name: value.detach().clone() for name, value in model.state_dict().items()},
                    "loss": loss.detach().clone(), "grads": [grad.clone() for grad in grads],
                }
            type(self).calls += 1
            return result

    return Capturing


def capturing_online_dpo(trainer_class):
    """A subclass of OnlineDPOTrainer that keeps one training step: its loss is computed inside
    training_step (generation, rewards, loss, backward), so the step's policy forward inputs, rewards,
    parameters (before the step) and gradients (after its backward, before the optimizer) are kept."""

    class Capturing(trainer_class):
        captured = None
        calls = 0
        recording = None

        def _forward(self, model, prompt_ids, prompt_mask, completion_ids, completion_mask, *rest):
            if type(self).recording is not None and model is not self.ref_model:
                type(self).recording["inputs"] = {"prompt_ids": prompt_ids.clone(), "prompt_mask": prompt_mask.clone(),
                                                  "completion_ids": completion_ids.clone(),
                                                  "completion_mask": completion_mask.clone()}
            return super()._forward(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *rest)

        def _calculate_rewards_from_functions(self, *args, **kwargs):
            rewards = super()._calculate_rewards_from_functions(*args, **kwargs)
            if type(self).recording is not None:
                type(self).recording["rewards"] = rewards.detach().clone()
            return rewards

        def training_step(self, model, inputs, *rest):
            if type(self).calls == CAPTURED_CALL:
                type(self).recording = {"state": {name: value.detach().clone()
                                                  for name, value in model.state_dict().items()}}
            loss = super().training_step(model, inputs, *rest)
            if type(self).recording is not None:
                grads = [param.grad.detach().clone() for param in _parameters(model)]
                type(self).captured = {**type(self).recording, "loss": loss.detach().clone(), "grads": grads}
                type(self).recording = None
            type(self).calls += 1
            return loss

    return Capturing


def _completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature=1.0):
    """(N, R) the lab's response_token_logps of the completions after their prompts (left-padded prompts,
    right-padded completions), at `temperature`."""
    from rl_lab import response_token_logps

    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (N, P) + (N, R) -> (N, T)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits / temperature
    completion = torch.zeros_like(input_ids, dtype=torch.bool)
    completion[:, prompt_ids.shape[1]:] = completion_mask.bool()
    token_logps, _ = response_token_logps(logits, input_ids, completion)
    return token_logps[:, -completion_ids.shape[1]:]  # (N, T-1) -> (N, R): the completion's positions


def lab_recompute(model, captured, s, block):
    """(loss, gradients, largest |log-ratio|) of the captured GRPO-family step recomputed by the lab: a
    plain forward pass of the same parameters, the lab's response_token_logps at TRL's temperature, and its
    GRPO-family atom."""
    inputs = captured["inputs"]
    model.load_state_dict(captured["state"])
    logps = _completion_logps(model, inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
                              inputs["completion_mask"], block["options"]["temperature"])
    if block["config"] == "RLOOConfig":  # RLOOTrainer's one loss (the map flags it): PPO-clip of exp(summed log-ratios)
        sequence = masked(logps, inputs["completion_mask"]).sum(dim=1)  # (N, R) -> (N,)
        old = inputs.get("old_logps", sequence.detach())
        epsilon = block["options"].get("epsilon", 0.2)
        per_sequence = clipped_policy_loss(sequence, old, inputs["advantages"], epsilon,
                                           block["options"].get("epsilon_high", epsilon))
        return per_sequence.mean(), torch.autograd.grad(per_sequence.mean(), _parameters(model)), \
            (sequence.detach() - old).abs().max().item()
    old_logps = inputs.get("old_per_token_logps", logps.detach())
    ref_logps = inputs.get("ref_per_token_logps", torch.zeros_like(logps))
    loss = lab_group_loss(s, logps, {"old_logps": old_logps, "ref_logps": ref_logps}, inputs["advantages"],
                          inputs["completion_mask"], None)
    log_ratio = (logps.detach() - old_logps)[inputs["completion_mask"].bool()].abs().max().item()
    return loss, torch.autograd.grad(loss, _parameters(model)), log_ratio


def lab_preference_loss(s, logps, ref_logps, mask, chosen, rejected):
    """The online loop's DPO-family loss (its registered atom with the run's settings) on these pairs."""
    from online_algorithms import PairCredit

    loop = online_tokens.Batch(None, None, None, None, None, None)
    loop.mask, loop.ref_logps = mask, ref_logps
    loss, _, _ = PreferenceFamily(lab_config(s)).loss(logps, loop, PairCredit(chosen, rejected, 0, mask), True)
    return loss


def lab_recompute_dpo(model, reference, captured, s):
    """(loss, gradients, largest |margin|) of DPOTrainer's captured step: its batch is [chosen; rejected]
    rows of prompt + response, completion_mask marking the response (EOS included)."""
    from rl_lab import response_token_logps

    inputs = captured["inputs"]
    model.load_state_dict(captured["state"])
    ids, attention, response = inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"].bool()
    logps, mask = response_token_logps(model(input_ids=ids, attention_mask=attention).logits, ids, response)
    with torch.no_grad():
        ref_logps, _ = response_token_logps(reference(input_ids=ids, attention_mask=attention).logits, ids, response)
    pairs = ids.shape[0] // 2
    chosen, rejected = torch.arange(pairs), torch.arange(pairs, 2 * pairs)
    loss = lab_preference_loss(s, logps, ref_logps, mask.long(), chosen, rejected)
    margin = ((logps - ref_logps).sum(dim=1)[chosen] - (logps - ref_logps).sum(dim=1)[rejected]).abs().max().item()
    return loss, torch.autograd.grad(loss, _parameters(model)), margin


def lab_recompute_online_dpo(model, reference, captured, s):
    """(loss, gradients, largest |margin|) of OnlineDPOTrainer's captured step: two completions per prompt
    (the first B rows, then the second B), the higher reward chosen (TRL's rule: the first on a tie)."""
    inputs = captured["inputs"]
    model.load_state_dict(captured["state"])
    logps = _completion_logps(model, **inputs)  # TRL's online DPO scores at temperature 1
    with torch.no_grad():
        ref_logps = _completion_logps(reference, **inputs)
    rewards = captured["rewards"]
    prompts = rewards.shape[0] // 2
    first = rewards[:prompts] >= rewards[prompts:]
    rows = torch.arange(prompts)
    chosen, rejected = torch.where(first, rows, rows + prompts), torch.where(first, rows + prompts, rows)
    mask = inputs["completion_mask"].long()
    loss = lab_preference_loss(s, logps, ref_logps, mask, chosen, rejected)
    sums = ((logps - ref_logps) * mask).sum(dim=1)
    return loss, torch.autograd.grad(loss, _parameters(model)), (sums[chosen] - sums[rejected]).abs().max().item()


def run_e2e(options=None, folder=None, steps=E2E_STEPS):
    """Export the task's data and the TRL script of `options` (default: the lab's default GRPO run), train
    `steps` lab iterations of it on a CPU, and recompute the captured step with the lab's atoms:
    {"loss_trl", "loss_lab", "loss_difference", "grad_difference", "seconds", "max_log_ratio" (the GRPO
    family) or "max_margin" (DPO), "nonzero_advantages" or "pairs", "responses"}."""
    import time

    import task_data
    from lab.io import write_files
    from library_export import TRL_TRAINERS, export_trl
    from tasks import TASKS

    libraries()
    s = run_settings(options or {})
    block = library_blocks(s)["trl"]
    _, trainer_name, body = TRL_TRAINERS[block["config"]]
    with tempfile.TemporaryDirectory() as scratch:
        folder = folder or scratch
        data, path = os.path.join(folder, "data"), os.path.join(folder, "run_trl.py")
        write_files({**task_data.data_files(TASKS[s["task"]](s["max_new_tokens"]), data), path: export_trl(s)})
        started = time.perf_counter()
        with _quiet(), contextlib.redirect_stderr(io.StringIO()):  # TRL's progress bars
            script = load_script(path)
            _reusing_warm_start(script)
            trainer_class = (capturing_online_dpo if body == "online_dpo" else capturing)(getattr(script, trainer_name))
            output = os.path.join(folder, "run")
            trainer = script.make_trainer(output, steps, trainer_class, data=data)
            trainer.train()
            seconds = time.perf_counter() - started
            captured = trainer_class.captured
            if captured is None:
                raise RuntimeError(f"the run made fewer than {CAPTURED_CALL + 1} loss calls")
            result = {"seconds": seconds, "loss_trl": captured["loss"].item()}
            model = trainer.accelerator.unwrap_model(trainer.model)
            if body == "group":
                loss, grads, log_ratio = lab_recompute(model, captured, s, block)
                advantages = captured["inputs"]["advantages"]
                result.update(max_log_ratio=log_ratio, nonzero_advantages=int((advantages != 0).sum()),
                              responses=advantages.numel())
            else:
                reference = type(model).from_pretrained(os.path.join(output, "model"))
                recompute = lab_recompute_online_dpo if body == "online_dpo" else lab_recompute_dpo
                loss, grads, margin = recompute(model, reference, captured, s)
                rows = captured["inputs"]["input_ids" if body == "offline_dpo" else "completion_ids"].shape[0]
                result.update(max_margin=margin, pairs=rows // 2, responses=rows)
    grad_difference = max((mine - theirs).abs().max().item() for mine, theirs in zip(grads, captured["grads"]))
    result["grad_max"] = max(grad.abs().max().item() for grad in captured["grads"])  # a zero gradient checks nothing
    return {**result, "loss_lab": loss.item(), "loss_difference": abs(loss.item() - result["loss_trl"]),
            "grad_difference": grad_difference}


def e2e_agrees(result):
    """True when the lab's recompute of a run_e2e result matches TRL's loss and gradients to E2E_TOLERANCE."""
    return (result["loss_difference"] <= E2E_TOLERANCE
            and result["grad_difference"] <= E2E_TOLERANCE * max(1.0, result["grad_max"]))


def e2e_line(label, result):
    """One readable line of a run_e2e result (its wall time is this machine's)."""
    if "max_log_ratio" in result:
        seen = (f"{result['nonzero_advantages']} of {result['responses']} advantages nonzero, log-ratios up to "
                f"{result['max_log_ratio']:.2g}")
    else:
        seen = f"{result['pairs']} pairs, margins up to {result['max_margin']:.2g} nats"
    return (f"{label}: {result['seconds']:.1f} s; step {CAPTURED_CALL + 1} loss TRL {result['loss_trl']:.8f}, lab "
            f"{result['loss_lab']:.8f} (difference {result['loss_difference']:.1e}); gradients up to "
            f"{result['grad_max']:.2g} differ by {result['grad_difference']:.1e} ({seen})")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


@torch_threads(1)  # tiny tensors, as the drivers
def main(argv=None):
    parser, args = build_parser(), parse(argv)
    try:
        if args.command == "check":
            lines, failures = run_check()
            print("\n".join(lines))
            print(f"{len(lines)} settings, {2 * len(lines)} blocks: {failures} failed")
            return 1 if failures else 0
        if args.command == "e2e":
            failures = 0
            for task, task_options in E2E_TASKS.items():
                for name, options in E2E_EXPORTS.items():
                    result = run_e2e({**options, **task_options})
                    failures += not e2e_agrees(result)
                    print(e2e_line(f"{name} {task}", result))
            print(f"{len(E2E_TASKS) * len(E2E_EXPORTS)} exported TRL scripts, {E2E_STEPS} lab iterations each on a "
                  f"CPU: {failures} differ from the lab's atoms beyond {E2E_TOLERANCE:.0e}")
            return 1 if failures else 0
        table, failures = run_conformance()
        print(table, end="")
        for row in failures:
            print(f"bridge.py: error: {row['setting']} ({row['library']}) differs by {row['loss_difference']:.1e} "
                  f"in the loss, {row['grad_difference']:.1e} in the gradient", file=sys.stderr)
        return 1 if failures else 0
    except ExtraMissing as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
