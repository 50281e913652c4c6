"""Tests of bridge.py and of the map's twelve corrected claims, against the installed TRL and verl.

    .venv-bridge/bin/python -m unittest -v test_bridge       # needs requirements-bridge.txt (docs/bridge.md)

Without the extra (the lab's own venv) the file adds no test and says so in one line, so the core
suite's count and time do not change. With it, `check` and `conformance` run once for the whole file
(about a minute: verl's Hydra composition costs most of it) and the tests read their results.
"""

import importlib
import importlib.metadata
import inspect
import math
import os
import re
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
    def test_exported_verl_command_composes_in_verl(self):
        from hydra import compose

        Shared.get()
        for options in ({}, {"algorithm": "ppo"}, {"algorithm": "sapo", "overlong_penalty": 2},
                        {"dynamic_sampling": True, "tis_cap": 2.0, "kl_in": "reward"}):
            with self.subTest(options=options):
                text = library_export.export_verl(bridge.run_settings(options))
                lines = text.splitlines()
                start = lines.index("python3 -m verl.trainer.main_ppo \\")
                overrides = [line.strip().removesuffix(" \\") for line in lines[start + 1:]]
                config = compose(config_name="ppo_trainer", overrides=overrides)
                self.assertEqual(config.actor_rollout_ref.rollout.n, 8)
                self.assertTrue(all(line.startswith("#") for line in lines[:start]))

    def test_export_says_where_there_is_nothing_to_export(self):
        with self.assertRaisesRegex(ValueError, "no PPO trainer"):
            library_export.export_trl(bridge.run_settings({"algorithm": "ppo"}))
        with self.assertRaisesRegex(ValueError, "GRPO family"):
            library_export.export_trl(bridge.run_settings({"algorithm": "dpo"}))
        text = library_export.export_verl(bridge.run_settings({"algorithm": "dpo"}))
        self.assertIn("no DPO trainer", text)
        self.assertNotIn("python3", text)

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

    def test_exported_trl_script_trains_and_the_atoms_recompute_its_step(self):
        result = bridge.run_e2e()
        self.assertLessEqual(result["loss_difference"], bridge.E2E_TOLERANCE)
        self.assertLessEqual(result["grad_difference"], bridge.E2E_TOLERANCE)
        self.assertGreater(result["nonzero_advantages"], 0)  # the warm start makes rewards vary
        self.assertGreater(result["max_log_ratio"], 0.2)  # the captured step is off-policy: the clip can bind


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


if __name__ == "__main__":
    unittest.main()
