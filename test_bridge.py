"""Tests of bridge.py and of the map's corrected claims (CorrectedClaims), against the installed TRL and verl.

    .venv-bridge/bin/python -m unittest -v test_bridge       # needs requirements-bridge.txt (docs/bridge.md)

Without the extra (the lab's own venv) the file adds no test and says so in one line, so the core
suite's count and time do not change. With it, `check` and `conformance` run once for the whole file
(about a minute: verl's Hydra composition costs most of it) and the tests read their results.
"""

import contextlib
import importlib
import importlib.metadata
import inspect
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest

import torch

import bridge
import library_export
import online_tokens
from online_settings import SETTINGS
from lab.testing import HERE, run_main, single_thread_module
from library_map import ACTOR, VERL_NO_DUAL_CLIP, library_blocks

try:
    LIBRARIES = bridge.libraries()
    MISSING = None
except bridge.ExtraMissing as error:
    LIBRARIES, MISSING = None, str(error)

setUpModule, _restore_threads = single_thread_module()


def tearDownModule():
    if Shared.verl is not None:
        Shared.verl.close()
    _restore_threads()


def load_tests(loader, tests, pattern):
    """No test at all without the extra: one line says why, and the core suite stays as it is."""
    if MISSING is not None:
        print(f"test_bridge: skipped, {MISSING}", file=sys.stderr)
        return unittest.TestSuite()
    return tests


def blocks(**options):
    return library_blocks(bridge.run_settings(options))


def source_of(module_name, relative):
    """The text of one installed source file of `module_name`'s package (read, not imported)."""
    package = importlib.import_module(module_name)
    with open(os.path.join(os.path.dirname(package.__file__), relative), encoding="utf-8") as handle:
        return handle.read()


class Shared:
    """check and conformance, run once for the file."""

    check = None
    conformance = None
    verl = None
    output_dir = None

    @classmethod
    def get(cls):
        if cls.check is None:
            cls.check = bridge.run_check()
            table, failures = bridge.run_conformance()
            cls.conformance = (table, failures)
            cls.verl = bridge.VerlConfigs()
            cls.output_dir = tempfile.mkdtemp()
        return cls


def table_rows(table):
    """The conformance table's rows as lists of cells, its first two parts, without the header lines."""
    rows = []
    for line in table.split("\n| lab atom")[0].splitlines():
        if line.startswith("|") and not line.startswith("|---") and not line.startswith("| lab setting") \
                and not line.startswith("| convention difference"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def convention(table, start):
    """The measured size of the convention row whose text starts with `start`."""
    for cells in table_rows(table):
        if cells[0].startswith(start):
            return cells[2]
    raise AssertionError(f"no convention row starting {start!r}")


def atom_rows(table):
    """The third table (the section-9 atoms) as {(atom, library): cells}, cells as in the table."""
    rows = {}
    for line in table.split("\n| lab atom")[1].splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[(cells[0], cells[1])] = cells
    return rows


class Commands(unittest.TestCase):
    def test_check_builds_every_block_of_every_representative_setting(self):
        lines, failures = Shared.get().check
        self.assertEqual(failures, 0, "\n".join(line for line in lines if "FAILED" in line))
        self.assertEqual(len(lines), len(bridge.REPRESENTATIVE_SETTINGS))

    def test_representative_settings_cover_every_algorithm_and_switch(self):
        algorithms = {options.get("algorithm", "grpo") for options in bridge.REPRESENTATIVE_SETTINGS}
        self.assertEqual(algorithms, set(online_tokens.ALGORITHMS))
        switches = {key for options in bridge.REPRESENTATIVE_SETTINGS for key in options}
        # every setting of the table policy (the transformer's are the lab's own: precision, cache, SFT)
        untested = {item.name for item in SETTINGS if item.policies is None} - switches
        # the sampler and optimizer settings are the same plain numbers in every block; the policy and the
        # task are the lab's (the export writes its own model and task)
        self.assertEqual(untested, {"steps", "seed", "prompts", "group_size", "max_new_tokens", "temperature",
                                    "updates_per_batch", "learning_rate", "epsilon", "tau_pos", "tau_neg",
                                    "gamma", "gae_lambda", "value_coef", "dpo_beta", "simpo_gamma", "task"})

    def test_check_refuses_an_option_the_installed_library_lacks(self):
        with self.assertRaisesRegex(ValueError, "RLOOConfig: .*loss_type"):
            bridge.trl_config({"config": "RLOOConfig", "options": {"loss_type": "grpo"}}, tempfile.mkdtemp())
        with self.assertRaisesRegex(ValueError, "ppo_trainer.yaml: .*reward.reward_kwargs"):
            Shared.get().verl.compose({"reward.reward_kwargs.max_resp_len": 5})
        with self.assertRaisesRegex(ValueError, "Invalid loss_agg_mode"):  # verl's ActorConfig validates it
            Shared.get().verl.compose({ACTOR + "loss_agg_mode": "tokenmean"})
        with self.assertRaisesRegex(ValueError, "Unsupported loss mode"):  # verl's policy-loss registry
            Shared.get().verl.compose({ACTOR + "policy_loss.loss_mode": "grpo"})
        with self.assertRaisesRegex(ValueError, "unknown KL estimator"):
            Shared.get().verl.compose({"algorithm.kl_penalty": "k4"})

    def test_conformance_matched_rows_agree_to_the_tolerance(self):
        table, failures = Shared.get().conformance
        self.assertEqual(failures, [])
        matched = [cells for cells in table_rows(table) if len(cells) == 7 and cells[6].startswith("matched")]
        self.assertGreaterEqual(len(matched), 25)
        for cells in matched:
            tolerance = bridge.SAPO_TRL_TOLERANCE if "sapo" in cells[0] and cells[1].startswith("TRL") \
                else bridge.TOLERANCE
            with self.subTest(setting=cells[0], library=cells[1]):
                self.assertLessEqual(float(cells[4]), tolerance)
                self.assertLessEqual(float(cells[5]), tolerance)
                self.assertAlmostEqual(float(cells[2]), float(cells[3]), delta=tolerance)

    def test_unmatched_rows_show_a_real_difference(self):
        table, _ = Shared.get().conformance
        sizes = {(cells[0], cells[1]): float(cells[4]) for cells in table_rows(table) if len(cells) == 7
                 and cells[6].startswith("unmatched") and "kl-in reward" not in cells[0]
                 and "--algorithm ppo" not in cells[0]}
        # the KL estimator TRL lacks, RLOO's sequence ratio, CISPO's and SAPO's fixed reductions
        self.assertEqual(len(sizes), 6)
        for key, size in sizes.items():
            with self.subTest(row=key):
                self.assertGreater(size, 1e-4)

    def test_the_committed_table_is_the_one_the_command_prints(self):
        # results-bridge/conformance.md is what docs/bridge.md shows (rendered by make_docs.py)
        table, _ = Shared.get().conformance
        with open(os.path.join(HERE, "results-bridge", "conformance.md"), encoding="utf-8") as handle:
            committed = handle.read()
        printed = table_rows(table)
        shown = table_rows(committed)
        self.assertEqual(len(shown), len(printed), "rerun: bridge.py conformance > results-bridge/conformance.md")
        # the difference columns hold float64 rounding (1e-17), which another CPU may round otherwise
        self.assertEqual([cells[:4] + cells[6:] if len(cells) == 7 else cells for cells in shown],
                         [cells[:4] + cells[6:] if len(cells) == 7 else cells for cells in printed])

    def test_the_committed_atom_table_is_the_one_the_command_prints(self):
        table, _ = Shared.get().conformance
        with open(os.path.join(HERE, "results-bridge", "conformance.md"), encoding="utf-8") as handle:
            committed = atom_rows(handle.read())
        printed = atom_rows(table)
        self.assertEqual(committed.keys(), printed.keys())
        for key, cells in printed.items():  # all but the two difference columns (float64 rounding)
            self.assertEqual(committed[key][:3] + committed[key][5:], cells[:3] + cells[5:])

    def test_every_library_backed_atom_of_section_9_has_a_row(self):
        table, _ = Shared.get().conformance
        atoms = {key[0].split("(")[0].split(" ")[0] for key in atom_rows(table)}
        self.assertEqual(atoms, {
            "dppo_policy_loss", "gmpo_policy_loss", "clip_cov_policy_loss", "kl_cov_policy_loss", "dro_policy_loss",
            "gpg_policy_loss", "reinforce_pp_baseline_advantages", "reinforce_pp_advantages", "opo_advantages",
            "passk_advantages", "gpg_advantages", "gdpo_advantages", "kl_straight_through", "token_entropy",
            "rollout_correction_weights", "vespo_policy_loss", "luspo_policy_loss", "clipped_policy_loss",
            "off_policy_sequence_mask", "high_entropy_token_mask"})
        libraries = {key[1].split(" ")[0] for key in atom_rows(table)}
        self.assertEqual(libraries, {"TRL", "verl"})

    def test_atom_rows_match_to_their_tolerance(self):
        table, failures = Shared.get().conformance
        self.assertEqual(failures, [])
        rows = atom_rows(table)
        matched = [cells for cells in rows.values() if cells[6] != "measured"]
        self.assertGreaterEqual(len(matched), 22)
        for cells in matched:
            with self.subTest(atom=cells[0], library=cells[1]):
                self.assertEqual(cells[2], str(len(bridge.ATOM_SEEDS)))
                tolerance = float(cells[6])
                self.assertLessEqual(tolerance, 1e-8)
                self.assertLessEqual(float(cells[3]), tolerance)
                if cells[4] != "-":
                    self.assertLessEqual(float(cells[4]), tolerance)
                if cells[5] == "none":
                    self.assertEqual(tolerance, bridge.TOLERANCE)
        losses = [cells for cells in matched if cells[0].split("(")[0].endswith("policy_loss")]
        self.assertTrue(all(cells[4] != "-" for cells in losses))  # every loss compares its gradient

    def test_atom_batches_are_ragged_and_make_the_masks_bind(self):
        import rl_lab

        for seed in bridge.ATOM_SEEDS:
            batch = bridge.atom_batch(seed)
            with self.subTest(seed=seed):
                self.assertGreater(len(set(batch["lengths"].tolist())), 2)
                self.assertTrue(bool((batch["logps"] < 0).all()))
                kept = batch["mask"].bool()
                dropped = rl_lab.off_policy_sequence_mask(batch["logps"], batch["sampler_logps"], batch["advantages"],
                                                          batch["mask"], threshold=0.05)
                self.assertLess(int(dropped.sum()), len(dropped))  # some sequence is dropped
                weights = rl_lab.rollout_correction_weights(batch["old_logps"], batch["sampler_logps"],
                                                            batch["mask"], mode="mask", low=0.5, high=2.0)
                self.assertTrue(bool((weights[kept] == 0).any()) and bool((weights[kept] > 0).any()))

    def test_measured_atom_conventions_have_their_sizes(self):
        table, _ = Shared.get().conformance
        rows = atom_rows(table)
        measured = {key: float(cells[3]) for key, cells in rows.items() if cells[6] == "measured"}
        self.assertEqual(len(measured), 8)
        for (atom, library), size in measured.items():
            with self.subTest(atom=atom, library=library):
                if atom.startswith("high_entropy_token_mask"):
                    self.assertEqual(size, 0.0)  # float32 quantile: no token flips on these batches
                elif library.startswith("verl adv_estimator=gdpo"):
                    self.assertGreater(size, 0.1)  # another formula (eps, token weights), not rounding
                else:  # a float32 Bessel factor or alpha: float32 rounding, relative 6e-8 at most
                    self.assertGreater(size, 1e-9)
                    self.assertLess(size, 1e-6)

    def test_trl_source_block_runs_the_installed_lines(self):
        import trl

        code = bridge.trl_source_block(trl.GRPOTrainer._generate_and_score_completions,
                                       "if self.use_vllm and self.vllm_importance_sampling_correction:",
                                       "# Compute the per-token log probabilities for the reference model")
        self.assertIn("vllm_importance_sampling_ratio = torch.exp(logps_diff)", code)
        self.assertFalse(code.startswith(" "))
        batch = bridge.atom_batch(0)
        weights = bridge._trl_is_weights(batch, "token_truncate", None, 2.0)
        expected = torch.exp((batch["old_logps"] - batch["sampler_logps"]) * batch["mask"]).clamp(max=2.0)
        self.assertTrue(torch.equal(weights, expected))

    def test_bad_flags_exit_2_with_one_line(self):
        for argv in ([], ["verify"], ["check", "--fast"]):
            with self.subTest(argv=argv):
                code, out, err = run_main(bridge.main, argv)
                self.assertEqual(code, 2)
                self.assertEqual(out, "")
                self.assertEqual(len(err.splitlines()), 1)
                self.assertTrue(err.startswith("bridge.py: error: "))


class Export(unittest.TestCase):
    def test_export_says_where_there_is_nothing_to_export(self):
        with self.assertRaisesRegex(ValueError, "no PPO trainer"):
            library_export.export_trl(bridge.run_settings({"algorithm": "ppo"}))
        with self.assertRaisesRegex(ValueError, "CPOConfig"):  # SimPO: TRL's CPOTrainer, not exported
            library_export.export_trl(bridge.run_settings({"algorithm": "dpo", "dpo_loss": "simpo", "offline": True}))
        with self.assertRaisesRegex(ValueError, "no DPO trainer"):
            library_export.export_verl(bridge.run_settings({"algorithm": "dpo"}))

    def test_exported_trl_scripts_compile_and_carry_the_map(self):
        for options in ({}, {"advantage": "rloo", "kl_in": "reward", "kl_estimator": "k1"}, {"algorithm": "cispo"}):
            with self.subTest(options=options):
                s = bridge.run_settings(options)
                text = library_export.export_trl(s)
                compile(text, "trl_run.py", "exec")
                block = library_blocks(s)["trl"]
                self.assertIn(f"from trl import {block['config']}", text)
                for key in block["unmatched"]:
                    self.assertIn(f"unmatched {key}", text)



# What verl.trainer.main_ppo runs before it needs a GPU, on each exported command, in a process of its own (Ray's
# import and Hydra's global state stay out of this one): the command's overrides composed with main_ppo's config
# (verl/trainer/config, ppo_trainer) by Hydra, then main_ppo's own main function (the body under its @hydra.main,
# which would compose the same config twice more per call): auto_set_device and validate_config(need_reference_policy,
# need_critic), with run_ppo (ray.init, the workers and the GPUs) replaced by a capture of the config; then the
# dataclasses the workers build from it. argv: the model folder to write, a JSON file of [label, exported file,
# override keys to drop] and the JSON file of the results.
VERL_START_UP = r"""
import json, os, shlex, sys, time, warnings
warnings.simplefilter("ignore")
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, PreTrainedTokenizerFast
import verl.trainer.main_ppo as main_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass

model_dir, jobs_path, results_path = sys.argv[1:4]
# a tiny model's config and tokenizer, written locally: verl reads both at start-up, and nothing is downloaded
vocabulary = ["<pad>", "<bos>", "<eos>"] + [chr(code) for code in range(32, 127)]
tokenizer = Tokenizer(models.WordLevel({token: i for i, token in enumerate(vocabulary)}, unk_token="<pad>"))
tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
tokenizer.decoder = decoders.Fuse()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
tokenizer.save_pretrained(model_dir)
LlamaConfig(vocab_size=len(vocabulary), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            architectures=["LlamaForCausalLM"]).save_pretrained(model_dir)
captured = []
main_ppo.run_ppo = lambda config, task_runner_class: captured.append(config)
initialize_config_dir(config_dir=os.path.join(os.path.dirname(main_ppo.__file__), "config"), version_base=None)
results = {}
with open(jobs_path, encoding="utf-8") as handle:
    jobs = json.load(handle)
for label, path, drop in jobs:
    with open(path, encoding="utf-8") as handle:
        lines = [line.removesuffix("\\") for line in handle.read().splitlines() if not line.startswith("#")]
    words = shlex.split(" ".join(lines))
    overrides = [word for word in words[3:] if word.split("=")[0] not in drop]
    started = time.perf_counter()
    try:
        main_ppo.main.__wrapped__(compose(config_name="ppo_trainer", overrides=overrides))
        config = captured.pop()
        nodes = (config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, config.algorithm,
                 config.actor_rollout_ref.model, config.critic if need_critic(config) else None)
        built = [None if node is None else type(omega_conf_to_dataclass(node)).__name__ for node in nodes]
        values = {}
        for word in overrides:
            key = word.split("=")[0].lstrip("+")
            value = OmegaConf.select(config, key)
            values[key] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        results[label] = {"error": None, "command": words[:3], "dataclasses": built, "values": values,
                          "need_critic": need_critic(config), "need_reference_policy": need_reference_policy(config),
                          "device": config.trainer.device}
    except Exception as error:
        results[label] = {"error": f"{type(error).__name__}: {' '.join(str(error).split())}"}
    results[label]["seconds"] = time.perf_counter() - started
with open(results_path, "w", encoding="utf-8") as handle:
    json.dump(results, handle)
"""
# Every export verl can run (the GRPO family with its switches, RLOO, Dr. GRPO, DAPO, CISPO, GSPO, SAPO, PPO), on
# both tasks: the binary one (the table policy) and Countdown (the transformer's)
VERL_EXPORTS = {
    "grpo": {}, "grpo --epsilon-high 0.28": {"epsilon_high": 0.28},
    "grpo --kl-in reward --kl-estimator k1": {"kl_in": "reward", "kl_estimator": "k1"},
    "grpo --tis-cap 2.0": {"tis_cap": 2.0}, "grpo --mask-truncated": {"mask_truncated": True},
    "rloo": {"advantage": "rloo"}, "dr-grpo": {"scale_rewards": "none", "reduction": "constant"},
    "dapo": {"epsilon_high": 0.28, "reduction": "token", "overlong_penalty": 2, "dynamic_sampling": True},
    "cispo": {"algorithm": "cispo"}, "gspo": {"algorithm": "gspo"}, "sapo": {"algorithm": "sapo"},
    "ppo": {"algorithm": "ppo"},
}
VERL_TASKS = {"binary": {}, "countdown": {"policy": "transformer"}}
# the overrides the review found missing: without each, verl's start-up must refuse the command
VERL_NEEDED = {"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": ("grpo", "Please set at least one of "
                                                                          "'actor_rollout_ref.ref.log_prob_micro"),
               "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": ("grpo", "Please set at least one of "
                                                                               "'actor_rollout_ref.rollout.log_prob"),
               "actor_rollout_ref.rollout.name": ("grpo", "Missing mandatory value: actor_rollout_ref.rollout.name"),
               "critic.ppo_micro_batch_size_per_gpu": ("ppo", "Please set at least one of 'critic.micro_batch_size'")}


def exported_words(text):
    """The words of an exported verl command, as the shell splits them (comments and line continuations out)."""
    return shlex.split(" ".join(line.removesuffix("\\") for line in text.splitlines() if not line.startswith("#")))


def other_values(item, value):
    """Values of a setting other than `value`, to try in turn (the first the lab accepts is used)."""
    if item.kind == "bool":
        return [not value]
    if item.kind == "choice":
        return [choice for choice in item.choices if choice != value]
    if item.kind == "text":
        return [value + "-other"]
    numbers = ([] if value is None else [value * 2, value / 2, value + 1]) + [2.0, 3.0, 0.5, 0.1, 0.04, 1.5]
    numbers = [int(round(number)) if item.kind == "int" else float(number) for number in numbers]
    return [number for number in numbers if number != value]


class VerlLaunch(unittest.TestCase):
    """Every exported verl command, run through verl's own start-up (main_ppo up to ray.init) on a local model."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model, cls.data = os.path.join(cls.tmp.name, "model"), os.path.join(cls.tmp.name, "data")
        cls.texts, cls.settings, jobs = {}, {}, []
        for task, task_options in VERL_TASKS.items():
            for name, options in VERL_EXPORTS.items():
                label, path = f"{name} ({task})", os.path.join(cls.tmp.name, f"{len(jobs)}.sh")
                options = {**task_options, **options}
                argv = shlex.split(bridge.settings_label(options)) if options else []
                argv += ["--export", "verl", path, "--model", cls.model, "--export-data-dir", cls.data]
                code, _, err = run_main(online_tokens.main, argv)
                if code != 0:
                    raise AssertionError(f"{label}: {err}")
                with open(path, encoding="utf-8") as handle:
                    cls.texts[label] = handle.read()
                cls.settings[label] = bridge.run_settings(options)
                jobs.append([label, path, []])
        for key, (name, _) in VERL_NEEDED.items():
            jobs.append([f"{name} without {key}", jobs[list(VERL_EXPORTS).index(name)][1], [key]])
        jobs_path, results_path = os.path.join(cls.tmp.name, "jobs.json"), os.path.join(cls.tmp.name, "results.json")
        with open(jobs_path, "w", encoding="utf-8") as handle:
            json.dump(jobs, handle)
        done = subprocess.run([sys.executable, "-c", VERL_START_UP, cls.model, jobs_path, results_path],
                              cwd=cls.tmp.name, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise AssertionError(f"verl's start-up harness failed: {done.stderr[-2000:]}")
        with open(results_path, encoding="utf-8") as handle:
            cls.results = json.load(handle)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_export_passes_main_ppos_checks_and_builds_its_configs(self):
        for label, s in self.settings.items():
            with self.subTest(label=label):
                result = self.results[label]
                self.assertIsNone(result["error"])
                self.assertEqual(result["command"], ["python3", "-m", "verl.trainer.main_ppo"])
                ppo = s["algorithm"] == "ppo"
                self.assertEqual(result["dataclasses"], ["FSDPActorConfig", "RolloutConfig", "AlgoConfig",
                                                         "HFModelConfig", "FSDPCriticConfig" if ppo else None])
                self.assertEqual(result["need_critic"], ppo)
                self.assertEqual(result["need_reference_policy"], s["beta"] > 0)  # the KL's reference
                self.assertEqual(result["device"], "cuda")  # auto_set_device keeps verl's GPU default

    def test_every_override_reads_back_as_exported(self):
        for label, text in self.texts.items():
            with self.subTest(label=label):
                values = self.results[label]["values"]
                words = exported_words(text)[3:]
                self.assertEqual(len(values), len(words))  # no key twice
                for word in words:
                    key, shown = word.split("=", 1)
                    value = values[key.lstrip("+")]
                    self.assertEqual(json.dumps(value) if isinstance(value, list) else bridge.hydra_value(value),
                                     shown, key)

    def test_a_real_models_settings_and_the_labs_run_length_seed_schedule_and_decay(self):
        actor, rollout = ACTOR, "actor_rollout_ref.rollout."
        for label, s in self.settings.items():
            with self.subTest(label=label):
                values = self.results[label]["values"]
                expected = {
                    # 128 prompts a step, or every train prompt once where the task has fewer (binary: 6)
                    actor + "optim.lr": 1e-6, "data.train_batch_size": {"binary": 6, "countdown": 128}[s["task"]],
                    actor + "ppo_mini_batch_size": {"binary": 6, "countdown": 128}[s["task"]],
                    "data.max_response_length": 256, "actor_rollout_ref.model.path": self.model,
                    "data.train_files": os.path.join(self.data, "train.parquet"),
                    "reward.custom_reward_function.path": os.path.join(self.data, "rl_lab_verifier.py"),
                    rollout + "name": "vllm", rollout + "n": s["group_size"],
                    actor + "ppo_epochs": s["updates_per_batch"],
                    "trainer.total_training_steps": s["steps"], "data.seed": s["seed"], rollout + "seed": s["seed"],
                    actor + "optim.lr_scheduler_type": "constant", actor + "optim.lr_warmup_steps": 0,
                    actor + "optim.weight_decay": 0.0}
                if s["algorithm"] == "ppo":
                    expected.update({"critic.model.path": self.model, "critic.optim.lr": 1e-5,
                                     "critic.optim.weight_decay": 0.0, "critic.optim.lr_scheduler_type": "constant"})
                self.assertEqual({key: values[key] for key in expected}, expected)
                self.assertNotEqual(values[actor + "optim.lr"], s["learning_rate"])
        self.assertEqual(self.settings["grpo (countdown)"]["steps"], 100)  # the transformer's own default, carried

    def test_lengths_scale_with_the_cap_dr_grpo_and_dapos_overlong_buffer(self):
        # the lab's cache of 2 tokens of its cap (5 binary, 8 Countdown), as the same share of verl's 256
        for task, cache in (("binary", 102), ("countdown", 64)):
            with self.subTest(task=task):
                dr_grpo = self.results[f"dr-grpo ({task})"]["values"]
                self.assertEqual(dr_grpo[ACTOR + "loss_scale_factor"], 256)  # = data.max_response_length
                dapo = self.results[f"dapo ({task})"]["values"]
                self.assertEqual(dapo["reward.reward_kwargs.max_resp_len"], 256)
                self.assertEqual(dapo["reward.reward_kwargs.overlong_buffer_cfg.len"], cache)
                self.assertEqual(dapo["algorithm.filter_groups.enable"], True)
                self.assertEqual(dapo[ACTOR + "clip_ratio_high"], 0.28)

    def test_verls_start_up_refuses_the_command_without_each_override_the_review_found_missing(self):
        for key, (name, message) in VERL_NEEDED.items():
            with self.subTest(key=key):
                self.assertIn(message, self.results[f"{name} without {key}"]["error"])

    def test_every_start_up_takes_a_few_seconds(self):
        seconds = [result["seconds"] for result in self.results.values()]
        self.assertEqual(len(seconds), 2 * len(VERL_EXPORTS) + len(VERL_NEEDED))
        self.assertLess(max(seconds), 20.0)  # composing and validating, nothing loaded but a config


class VerlExportHeader(unittest.TestCase):
    """What cannot be carried to verl is named, never dropped; what verl lacks at the core is refused."""

    def test_every_setting_changes_the_command_or_is_named_in_its_header(self):
        from lab.settings import SettingError
        from online_registry import ALGORITHMS
        from online_settings import APPLIES

        tested, applicable = set(), set()
        for algorithm in ALGORITHMS:
            for policy in ("table", "transformer"):
                try:
                    library_export.export_verl(bridge.run_settings({"algorithm": algorithm, "policy": policy}))
                except ValueError:  # DPO, and losses verl lacks (the next test)
                    continue
                for item in SETTINGS:
                    if item.name in ("algorithm", "policy", "task") or algorithm not in APPLIES[item.name] or \
                            (item.policies is not None and policy not in item.policies):
                        continue
                    applicable.add(item.name)
                    options = {"algorithm": algorithm, "policy": policy}
                    if item.requires is not None:
                        options[item.requires[0]] = item.requires[1][0]
                    base = library_export.export_verl(bridge.run_settings(options))
                    for value in other_values(item, bridge.run_settings(options)[item.name]):
                        try:
                            s = bridge.run_settings({**options, item.name: value})
                        except SettingError:
                            continue
                        text = library_export.export_verl(s)
                        header = text.split("python3 -m verl")[0]
                        with self.subTest(algorithm=algorithm, policy=policy, setting=item.name, value=value):
                            # the first line is the lab's command: it names every flag, carried or not
                            changed = text.split("\n", 1)[1] != base.split("\n", 1)[1]
                            self.assertTrue(changed or f"unmatched {item.name}" in header)
                        tested.add(item.name)
                        break
        self.assertEqual(tested, applicable)  # each setting of an exported run with a value that changes it
        self.assertGreater(len(tested), 50)

    def test_the_default_data_is_the_trl_scripts_folder_made_absolute_by_the_shell(self):
        for options, task in (({}, "binary"), ({"policy": "transformer"}, "countdown")):
            text = library_export.export_verl(bridge.run_settings(options))
            self.assertIn("data.train_files=$PWD/data/train.parquet", exported_words(text))
            self.assertIn(f"#   python online_tokens.py --task {task} --export-data DIR\n", text)

    def test_dpo_and_the_losses_verl_lacks_are_refused_naming_the_setting(self):
        import verl.trainer
        from verl.trainer.ppo import core_algos

        # verl 0.9.1 has no DPO trainer: no trainer module and no policy loss of that name
        files = [name for _, _, names in os.walk(os.path.dirname(verl.trainer.__file__)) for name in names]
        self.assertIn("main_ppo.py", files)
        self.assertEqual([name for name in files if "dpo" in name.lower()], [])
        with self.assertRaises(ValueError):
            core_algos.get_policy_loss_fn("dpo")
        for options, message in (({"algorithm": "dpo"}, "^algorithm: verl's core has no DPO trainer"),
                                 ({"algorithm": "dpo", "offline": True}, "^algorithm: verl has no offline DPO trainer"),
                                 ({"algorithm": "vespo"}, "^algorithm: no verl policy_loss.loss_mode .* vespo is not"),
                                 ({"advantage": "maxrl"}, "^advantage: verl 0.9.1 has no MaxRL estimator")):
            with self.subTest(options=options):
                with self.assertRaisesRegex(ValueError, message):
                    library_export.export_verl(bridge.run_settings(options))


class CorrectedClaims(unittest.TestCase):
    """One test per claim of the map that the installed libraries showed wrong."""

    def test_1_trl_has_no_ppo_trainer_and_the_ppo_block_says_so(self):
        import trl

        self.assertEqual(trl.__version__, bridge.PINNED["trl"])
        self.assertFalse(hasattr(trl, "PPOConfig"))
        self.assertFalse(hasattr(trl, "PPOTrainer"))
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(trl.__file__), "experimental", "ppo")))
        block = blocks(algorithm="ppo")["trl"]
        self.assertIsNone(block["config"])
        self.assertIsNone(block["options"])
        self.assertIn("no PPO trainer", block["reason"])

    def test_2_grpo_block_turns_off_trl_1_16_bias_corrected_kl(self):
        from trl import GRPOConfig

        default = GRPOConfig(output_dir=tempfile.mkdtemp(), **bridge.TRL_CPU)
        self.assertTrue(default.use_bias_correction_kl)  # TRL 1.16's default: k3 times the ratio
        self.assertIs(blocks()["trl"]["options"]["use_bias_correction_kl"], False)
        table, _ = Shared.get().conformance
        loss, grad = (float(x) for x in convention(table, "TRL 1.16 multiplies k3").split(" / "))
        self.assertGreater(loss, 1e-3)  # left at its default, TRL's loss moves by this much on the lab's batch
        self.assertGreater(grad, 1e-3)

    def test_3_rloo_block_emits_only_options_rlooconfig_has(self):
        import dataclasses

        from trl import RLOOConfig

        fields = {field.name for field in dataclasses.fields(RLOOConfig)}
        for name in ("loss_type", "delta", "vllm_importance_sampling_correction"):
            self.assertNotIn(name, fields)
        for options in ({"advantage": "rloo"}, {"advantage": "rloo", "dual_clip": 3.0, "tis_cap": 2.0},
                        {"algorithm": "cispo", "advantage": "rloo"}):
            with self.subTest(options=options):
                block = blocks(**options)["trl"]
                self.assertEqual(block["config"], "RLOOConfig")
                self.assertLessEqual(set(block["options"]), fields)
                bridge.trl_config(block, tempfile.mkdtemp())
        self.assertIn("dual_clip", blocks(advantage="rloo", dual_clip=3.0)["trl"]["unmatched"])

    def test_4_rloo_kl_in_the_loss_is_unmatched_in_trl(self):
        from trl import RLOOTrainer

        # RLOOTrainer's beta: beta times the summed k1 subtracted from the reward
        source = inspect.getsource(RLOOTrainer._generate_and_score_completions)
        self.assertIn("per_token_kl = old_per_token_logps - ref_per_token_logps", source)
        self.assertIn("rewards = rewards - self.beta * kl", source)
        block = blocks(advantage="rloo")["trl"]  # the lab's default: k3 in the loss
        self.assertEqual(block["options"]["beta"], 0.0)
        self.assertIn("kl_in=loss", block["unmatched"])
        folded = blocks(advantage="rloo", kl_in="reward", kl_estimator="k1")["trl"]
        self.assertEqual(folded["options"]["beta"], 0.02)
        self.assertEqual(folded["unmatched"], {})

    def test_5a_online_ipo_sums_log_probs(self):
        source = source_of("trl", "experimental/online_dpo/online_dpo_trainer.py")
        self.assertIn("cr_logprobs_sum = (cr_logprobs * ~cr_padding_mask).sum(1)", source)
        self.assertIn("losses = (logits - 1 / (2 * self.beta)) ** 2", source)
        self.assertEqual(blocks(algorithm="dpo", dpo_loss="ipo")["trl"]["unmatched"], {})
        self.assertIn("sequence_logp=mean",
                      blocks(algorithm="dpo", dpo_loss="ipo", sequence_logp="mean")["trl"]["unmatched"])
        # offline, TRL averages per token: the other way round
        self.assertIn("sequence_logp=sum", blocks(algorithm="dpo", dpo_loss="ipo", offline=True)["trl"]["unmatched"])

    def test_5b_online_cdpo_passes_no_label_smoothing(self):
        import dataclasses

        from trl.experimental.online_dpo import OnlineDPOConfig

        self.assertNotIn("label_smoothing", {field.name for field in dataclasses.fields(OnlineDPOConfig)})
        block = blocks(algorithm="dpo", dpo_loss="cdpo", label_smoothing=0.1)["trl"]
        self.assertNotIn("label_smoothing", block["options"])
        self.assertIn("label_smoothing", block["unmatched"])
        bridge.trl_config(block, tempfile.mkdtemp())

    def test_5c_trl_dpo_sigmoid_ignores_label_smoothing(self):
        source = source_of("trl", "trainer/dpo_trainer.py")
        branch = re.search(r'if loss_type == "sigmoid":\n(.*?)\n\s*elif', source, re.S).group(1)
        self.assertEqual(branch.strip(), "per_sequence_loss = -F.logsigmoid(self.beta * delta_score)")
        block = blocks(algorithm="dpo", offline=True, dpo_loss="cdpo", label_smoothing=0.1)["trl"]
        self.assertEqual(block["options"], {"beta": 0.5, "loss_type": "sigmoid"})
        self.assertIn("label_smoothing", block["unmatched"])

    def test_6_verl_ppo_sets_both_clip_ends_and_turns_dual_clip_off(self):
        from omegaconf import OmegaConf

        verl = Shared.get().verl
        config, _, _ = verl.compose({ACTOR + "clip_ratio": 0.3})
        # the yaml sets low and high itself: clip_ratio alone reaches neither
        self.assertEqual(OmegaConf.select(config, ACTOR + "clip_ratio_low"), 0.2)
        self.assertEqual(OmegaConf.select(config, ACTOR + "clip_ratio_c"), 3.0)
        options = blocks(algorithm="ppo", epsilon=0.3)["verl"]["options"]
        self.assertEqual((options[ACTOR + "clip_ratio_low"], options[ACTOR + "clip_ratio_high"]), (0.3, 0.3))
        self.assertEqual(options[ACTOR + "clip_ratio_c"], VERL_NO_DUAL_CLIP)
        self.assertGreater(VERL_NO_DUAL_CLIP, math.exp(20))  # verl's ratio never exceeds e**20
        table, _ = Shared.get().conformance
        ppo = [cells for cells in table_rows(table) if cells[0] == "--algorithm ppo"]
        self.assertEqual(len(ppo), 1)
        self.assertLessEqual(float(ppo[0][5]), bridge.TOLERANCE)

    def test_7_verl_sapo_ignores_loss_agg_mode(self):
        from verl.trainer.ppo import core_algos

        _, actor, _ = Shared.get().verl.compose({ACTOR + "policy_loss.loss_mode": "sapo"})
        batch = bridge.conformance_batch()
        advantages = torch.linspace(-1, 1, 8, dtype=torch.float64).unsqueeze(1) * batch["mask"]
        losses = [core_algos.compute_policy_loss_sapo(batch["old_logps"], batch["logps"], advantages, batch["mask"],
                                                      loss_agg_mode=mode, config=actor)[0].item()
                  for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]
        self.assertEqual(losses[0], losses[1])
        self.assertEqual(losses[2], losses[1])
        self.assertIn("reduction=token", blocks(algorithm="sapo", reduction="token")["verl"]["unmatched"])
        self.assertEqual(blocks(algorithm="sapo")["verl"]["unmatched"], {})

    def test_8_verl_dynamic_sampling_metric_and_no_cap(self):
        replay = source_of("verl", "trainer/ppo/v1/replay_buffer.py")
        self.assertIn('FILTER_GROUPS_REWARD_METRIC = "reward"', replay)
        trainer = source_of("verl", "trainer/ppo/v1/trainer_base.py")
        self.assertIn("max_num_gen_batches=%s is ignored by the built-in V1 ReplayBuffer", trainer)
        block = blocks(dynamic_sampling=True, max_resample_rounds=4)["verl"]
        self.assertEqual(block["options"]["algorithm.filter_groups.metric"], "reward")
        self.assertNotIn("algorithm.filter_groups.max_num_gen_batches", block["options"])
        self.assertIn("max_resample_rounds", block["unmatched"])

    def test_9a_reward_kwargs_need_hydras_plus_prefix(self):
        from omegaconf import OmegaConf

        verl = Shared.get().verl
        with self.assertRaises(ValueError):
            verl.compose({"reward.reward_kwargs.max_resp_len": 5})
        options = blocks(max_new_tokens=5, overlong_penalty=2)["verl"]["options"]
        kwargs = {key: value for key, value in options.items() if "reward_kwargs" in key}
        self.assertEqual(len(kwargs), 5)
        self.assertTrue(all(key.startswith("+reward.reward_kwargs.") for key in kwargs))
        config, _, _ = verl.compose(options)
        self.assertEqual(OmegaConf.to_container(config.reward.reward_kwargs),
                         {"max_resp_len": 5, "overlong_buffer_cfg": {"enable": True, "len": 2, "penalty_factor": 1.0,
                                                                     "log": False}})

    def test_9b_delta_only_where_it_equals_dual_clip(self):
        self.assertEqual(blocks(dual_clip=3.0)["trl"]["options"]["delta"], 3.0)
        self.assertEqual(blocks(dual_clip=1.28, epsilon_high=0.28)["trl"]["options"]["delta"], 1.28)
        low = blocks(dual_clip=1.1)["trl"]
        self.assertNotIn("delta", low["options"])
        self.assertIn("dual_clip", low["unmatched"])
        table, _ = Shared.get().conformance
        loss, grad = (float(x) for x in convention(table, "TRL's delta caps A > 0").split(" / "))
        self.assertGreater(loss, 1e-3)
        self.assertGreater(grad, 1e-3)

    def test_9c_the_map_names_the_installed_versions(self):
        import library_map

        self.assertEqual(importlib.metadata.version("trl"), "1.16.0")
        self.assertEqual(importlib.metadata.version("verl"), "0.9.1")
        self.assertIn("TRL 1.16.0", library_map.__doc__)
        self.assertRegex(library_map.__doc__, r"verl\s+0\.9\.1")
        self.assertNotIn("1.10.0.dev0", library_map.__doc__)

    def test_10_convention_differences_have_their_measured_sizes(self):
        table, _ = Shared.get().conformance
        # rewards (1, 0, 0, 0): A = 0.75 / (std + eps); population std sqrt(3)/4, unbiased 1/2
        lab = 0.75 / (math.sqrt(3) / 4 + 1e-4)
        self.assertAlmostEqual(float(convention(table, "group std: TRL's")), lab - 0.75 / (0.5 + 1e-4), places=3)
        self.assertAlmostEqual(float(convention(table, "group std: verl's")), lab - 0.75 / (0.5 + 1e-6), places=3)
        self.assertEqual(float(convention(table, "RLOO advantages")), 0.0)
        self.assertEqual(float(convention(table, "GAE returns")), 0.0)
        self.assertGreater(float(convention(table, "GAE whitening")), 0.01)
        self.assertAlmostEqual(float(convention(table, "verl clamps k3")), math.exp(12) - 13 - 10, delta=1e3)
        self.assertAlmostEqual(float(convention(table, "verl's vanilla loss always")), math.exp(1.5) - 3.0, places=2)
        self.assertAlmostEqual(float(convention(table, "verl clamps the log-ratio")), 1 - math.exp(-5), places=3)


def exported_data(task):
    """(folder, stdout) of `online_tokens.py --task T --export-data` into a fresh temporary folder."""
    folder = os.path.join(tempfile.mkdtemp(), task)
    code, out, err = run_main(online_tokens.main, ["--task", task, "--export-data", folder])
    if code != 0:
        raise AssertionError(err)
    return folder, out


class DataExport(unittest.TestCase):
    """The task's files load with the libraries' readers, and the verifier beside them scores them."""

    @classmethod
    def setUpClass(cls):
        from tasks import TASKS

        cls.tasks = {name: TASKS[name](8 if name == "countdown" else 5) for name in ("binary", "countdown")}
        cls.folders = {name: exported_data(name)[0] for name in cls.tasks}

    def test_jsonl_loads_with_datasets_and_holds_every_prompt(self):
        from datasets import load_dataset

        for name, task in self.tasks.items():
            with self.subTest(task=name):
                files = {split: os.path.join(self.folders[name], f"{split}.jsonl") for split in ("train", "test")}
                data = load_dataset("json", data_files=files)
                for split in ("train", "test"):
                    expected = task.split_prompts(split if task.prompt_count(split) else "train").tolist()
                    self.assertEqual(data[split]["index"], expected)
                    self.assertEqual(set(data[split]["split"]), {split})
                row = data["train"][0]
                if name == "countdown":
                    self.assertEqual((row["prompt"], row["numbers"], row["target"], row["solution"]),
                                     ("1234:1=", [1, 2, 3, 4], 1, "2-1"))
                else:
                    self.assertEqual((row["prompt"], row["number"], row["solution"]), ("0", 0, "0"))

    def test_parquet_has_verls_schema_and_the_verifier_scores_each_solution(self):
        import pandas
        import pyarrow.parquet

        for name in self.tasks:
            with self.subTest(task=name):
                verifier = bridge.load_script(os.path.join(self.folders[name], "rl_lab_verifier.py"))
                table = pyarrow.parquet.read_table(os.path.join(self.folders[name], "train.parquet"))
                self.assertEqual(table.column_names, ["data_source", "prompt", "ability", "reward_model", "extra_info"])
                frame = pandas.read_parquet(os.path.join(self.folders[name], "train.parquet"))
                with open(os.path.join(self.folders[name], "train.jsonl"), encoding="utf-8") as handle:
                    rows = [json.loads(line) for line in handle]
                self.assertEqual(len(frame), len(rows))
                self.assertEqual(set(frame["data_source"]), {f"rl_lab/{name}"})
                for record, row in zip(frame.to_dict("records"), rows):
                    self.assertEqual(list(record["prompt"]), [{"role": "user", "content": row["instruction"]}])
                    self.assertEqual(record["extra_info"], {"split": "train", "index": row["index"]})
                    truth = record["reward_model"]["ground_truth"]
                    self.assertEqual(verifier.compute_score(record["data_source"], row["solution"], truth), 1.0)
                    self.assertEqual(verifier.compute_score(record["data_source"], row["solution"] + "1", truth), 0.0)

    def test_the_verifier_copy_is_the_labs_module_and_reruns_are_identical(self):
        import text_verifier

        for name in self.tasks:
            with self.subTest(task=name):
                with open(text_verifier.__file__, "rb") as mine, \
                        open(os.path.join(self.folders[name], "rl_lab_verifier.py"), "rb") as copy:
                    self.assertEqual(mine.read(), copy.read())
                again, _ = exported_data(name)
                for filename in ("train.jsonl", "test.parquet"):
                    with open(os.path.join(self.folders[name], filename), "rb") as first, \
                            open(os.path.join(again, filename), "rb") as second:
                        self.assertEqual(first.read(), second.read())


class TrlExports(unittest.TestCase):
    """Every TRL export (the GRPO family's seven, DPO offline and online) on both tasks trains on a CPU with the
    tiny local model, and the lab's atoms recompute the captured step's loss and gradients."""

    def _trains_and_recomputes(self, task):
        for name, options in bridge.E2E_EXPORTS.items():
            with self.subTest(export=name):
                result = bridge.run_e2e({**options, **bridge.E2E_TASKS[task]})
                self.assertTrue(bridge.e2e_agrees(result), bridge.e2e_line(f"{name} {task}", result))
                self.assertGreater(result["grad_max"], 1e-4)  # a zero gradient would check nothing
                if "max_log_ratio" in result:
                    self.assertGreater(result["nonzero_advantages"], 0)  # the warm start makes rewards vary
                    self.assertGreater(result["max_log_ratio"], 0.2)  # off-policy: the clip can bind
                else:
                    self.assertGreater(result["pairs"], 0)

    def test_binary_exports_train_and_the_atoms_recompute_their_step(self):
        self._trains_and_recomputes("binary")

    def test_countdown_exports_train_and_the_atoms_recompute_their_step(self):
        self._trains_and_recomputes("countdown")

    def test_header_names_what_is_not_carried_and_the_run_length(self):
        s = bridge.run_settings({"tis_cap": 2.0, "dynamic_sampling": True, "overlong_penalty": 2, "steps": 30})
        text = library_export.export_trl(s)
        header = text.split('"""')[1]
        self.assertIn("TIS / rollout correction", header)
        self.assertIn("unmatched dynamic_sampling", header)
        self.assertIn("get_soft_overlong_punishment(5, 2) in reward_funcs", header)
        self.assertIn("the lab's evaluation", header)
        self.assertIn("max_steps = steps x 2", header)
        self.assertIn('"lr_scheduler_type": "constant", "weight_decay": 0.0', text)
        self.assertIn("max_steps=steps * UPDATES_PER_BATCH", text)
        self.assertIn("ITERATIONS = 30", text)
        self.assertNotIn('"use_vllm"', text)  # only the script's --vllm turns vLLM on
        self.assertIn("use_vllm=vllm", text)
        self.assertIsNone(re.search(r"if [0-9.]+ [<>]", text))  # no literal comparison decides anything
        self.assertTrue(all(len(line) <= 120 for line in text.splitlines()))
        online = library_export.export_trl(bridge.run_settings({"algorithm": "dpo", "updates_per_batch": 3}))
        self.assertIn("--updates-per-batch 3: OnlineDPOTrainer takes one optimizer step", online)

    def test_another_tasks_data_is_refused_before_training(self):
        folder = tempfile.mkdtemp()
        data, _ = exported_data("binary")
        path = os.path.join(folder, "run_trl.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(library_export.export_trl(bridge.run_settings({"policy": "transformer"})))  # Countdown's
        with bridge._quiet(), contextlib.redirect_stderr(io.StringIO()):
            script = bridge.load_script(path)
            with self.assertRaises(SystemExit) as caught:
                script.load_prompts(data, None)
        self.assertEqual(str(caught.exception), f"--data: {data} holds another task's prompts, not countdown's (no "
                         f"'numbers' column); write them with: python online_tokens.py --task countdown "
                         f"--export-data {data}")
        self.assertEqual(len(script.load_prompts(exported_data("countdown")[0], None)), 421)  # its own task's load

    def test_the_script_refuses_a_bad_flag_with_one_line_and_writes_nothing(self):
        folder = tempfile.mkdtemp()
        data, _ = exported_data("binary")
        path = os.path.join(folder, "run_trl.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(library_export.export_trl(bridge.run_settings({})))
        taken = os.path.join(folder, "taken")
        with open(taken, "w", encoding="utf-8") as handle:
            handle.write("keep me\n")
        empty = os.path.join(folder, "empty")
        os.mkdir(empty)
        out = os.path.join(folder, "run")
        cases = [("--steps", ["--steps", "0", "--data", data]), ("--steps", ["--steps", "1.5", "--data", data]),
                 ("--data", ["--data", os.path.join(folder, "nowhere")]), ("--data", ["--data", empty]),
                 ("--output", ["--data", data, "--output", taken]),
                 ("--model", ["--data", data, "--model", empty])]  # a folder without a tokenizer
        with bridge._quiet():
            script = bridge.load_script(path)
        for flag, argv in cases:
            with self.subTest(argv=argv):
                extra = [] if "--output" in argv else ["--output", out]
                code, stdout, stderr = run_main(script.main, argv + extra)
                self.assertEqual((code, stdout), (2, ""))
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn(f"argument {flag}: ", stderr)
                self.assertFalse(os.path.exists(out))
        self.assertEqual(sorted(os.listdir(folder)), ["empty", "run_trl.py", "taken"])
        with open(taken, encoding="utf-8") as handle:
            self.assertEqual(handle.read(), "keep me\n")
        self.assertEqual(os.listdir(empty), [])

    def test_ppo_export_exits_2_naming_the_flag_and_writes_nothing(self):
        folder = tempfile.mkdtemp()
        path = os.path.join(folder, "run_trl.py")
        code, out, err = run_main(online_tokens.main, ["--algorithm", "ppo", "--export", "trl", path])
        self.assertEqual((code, out), (2, ""))
        self.assertIn("argument --export: algorithm: TRL 1.16 has no PPO trainer", err)
        self.assertEqual(os.listdir(folder), [])

    def test_model_option_scales_the_run_and_trains_a_local_pretrained_folder(self):
        """--model takes a folder as from_pretrained reads it (here the tiny Llama, with a chat template):
        a pretrained model's learning rate, batch layout and length, and the prompts in words as chat."""
        folder = tempfile.mkdtemp()
        data, _ = exported_data("binary")
        path = os.path.join(folder, "run_trl.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(library_export.export_trl(bridge.run_settings({})))
        with bridge._quiet(), contextlib.redirect_stderr(io.StringIO()):
            script = bridge.load_script(path)
            tokenizer = script.build_tokenizer()
            tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
            pretrained = os.path.join(folder, "pretrained")
            script.build_model(tokenizer).save_pretrained(pretrained)
            tokenizer.save_pretrained(pretrained)
            trainer = script.make_trainer(os.path.join(folder, "run"), 1, data=data, model_name=pretrained)
            args = trainer.args
            self.assertEqual((args.learning_rate, args.lr_scheduler_type, args.weight_decay), (1e-6, "constant", 0.0))
            self.assertEqual((args.per_device_train_batch_size, args.gradient_accumulation_steps), (8, 8))
            self.assertEqual((args.max_completion_length, args.max_steps, args.seed), (256, 2, 7))
            self.assertEqual(trainer.train_dataset[0]["prompt"][0]["content"],
                             "Write the number 0 in binary. Answer with the binary digits only.")
            self.assertFalse(os.path.exists(os.path.join(folder, "run", "model")))  # nothing built or warmed up
            trainer.train()
        self.assertEqual(trainer.state.global_step, 2)


if __name__ == "__main__":
    unittest.main()
