"""Tests of sft.py: the completion-only loss, determinism, the cache, exact success against a slow loop
and against sampled frequencies, sampled pass@k against a slow recount, a does-it-learn check, the CLI.

    python -m unittest -v test_sft
"""

import copy
import dataclasses
import io
import json
import math
import os
import stat
import tempfile
import unittest
from unittest import mock

import torch
import torch.nn as nn

from lab import io as lab_io
import sft
from countdown import CountdownConfig, CountdownTask, pass_at_k
from lab.io import json_text
from lab.testing import run_cli_in_process, run_main, single_thread_module
from tiny_lm import TinyLM, TinyLMConfig, completion_log_probs, generate

_one_thread, tearDownModule = single_thread_module()  # one torch thread, as the drivers train

# 3 numbers of 1..5 with + and -: 60 train and 15 test prompts, responses of at most 6 tokens
SMALL_TASK = CountdownTask(CountdownConfig(numbers_per_prompt=3, largest_number=5, max_new_tokens=6))
# a few steps of a very small model: the cache and determinism tests train it several times
TINY = sft.SFTConfig(n_layer=1, n_head=2, d_model=16, demonstrations=128, steps=8, batch_size=16, warmup_steps=2,
                     learning_rate=1e-2)
# long enough to solve some prompts: the sampling tests need success probabilities well above 0
TRAINED = sft.SFTConfig(n_layer=1, n_head=2, d_model=32, demonstrations=1024, steps=100, batch_size=32,
                        warmup_steps=2, learning_rate=1e-2)
MODEL, REPORT = None, None  # trained once on SMALL_TASK with TRAINED, read-only in every test


def setUpModule():
    global MODEL, REPORT
    _one_thread()
    MODEL, REPORT = sft.train_sft(SMALL_TASK, TRAINED)


def state_bytes(model):
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue()


def file_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


class FixedLogits(nn.Module):
    """A stand-in model whose logits are a parameter, whatever the input: a loss computed from it can only
    depend on the input through the targets it scores, so what the mask keeps out is visible exactly."""

    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(logits.clone())

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.logits


# ---------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------


class HelperArguments(unittest.TestCase):
    def test_each_public_helper_names_the_argument_it_cannot_use(self):
        task, config = CountdownTask(), sft.SFTConfig()
        cases = [
            ("prompts", sft.prompt_batch, (task, [])),
            ("responses", sft.pair_batch, (task, [0], [[len(task.vocab)]])),  # one past the vocabulary
            ("responses", sft.pair_batch, (task, [0], ["ab"])),
            ("step", sft.learning_rate_at, (0, config)),
            ("step", sft.learning_rate_at, (config.steps + 1, config)),
            ("config", sft.learning_rate_at, (1, None)),
            ("cache_folder", sft.load_or_train, (task, config, "a\0b")),
            ("cache_folder", sft.cache_folder_of, (task, config, None)),
            ("folder", sft.load_cached, (task, config, None)),
            ("evaluations", sft.table_text, ({},)),
        ]
        for name, function, arguments in cases:
            with self.subTest(function=function.__name__, name=name):
                with self.assertRaisesRegex(ValueError, f"^{name}: expected"):
                    function(*arguments)
        self.assertEqual(sft.learning_rate_at(config.steps, config), config.min_lr_ratio * config.learning_rate)


class Settings(unittest.TestCase):
    def test_json_round_trip_and_the_model_config_from_the_task(self):
        config = sft.SFTConfig()
        self.assertEqual(sft.SFTConfig(**json.loads(json.dumps(dataclasses.asdict(config)))), config)
        task = CountdownTask()
        model_config = config.model_config(task)
        # BOS, 4 numbers, ':', a 2-digit target (at most 4+5+6+7 = 22), '=' then 8 response tokens
        self.assertEqual(sft.max_prompt_width(task), 9)
        self.assertEqual((model_config.vocab_size, model_config.max_len), (16, 17))
        self.assertEqual((model_config.n_layer, model_config.n_head, model_config.d_model), (2, 4, 48))
        self.assertEqual(dataclasses.replace(config, max_len=32).model_config(task).max_len, 32)

    def test_bad_settings_raise_naming_the_field(self):
        cases = [("steps", -1), ("steps", 1.5), ("batch_size", 0), ("learning_rate", 0.0), ("n_layer", True),
                 ("seed", -1), ("min_lr_ratio", 1.5), ("grad_clip", 0.0), ("demonstrations", 0), ("max_len", 1)]
        for name, value in cases:
            with self.subTest(name=name, value=value), self.assertRaises(ValueError) as raised:
                sft.SFTConfig(**{name: value})
            self.assertTrue(str(raised.exception).startswith(name + ":"), str(raised.exception))
        with self.assertRaisesRegex(ValueError, r"^d_model: expected a multiple of n_head=4"):
            sft.SFTConfig(d_model=10)
        with self.assertRaisesRegex(ValueError, r"^max_len: expected at least 17"):
            sft.SFTConfig(max_len=16).model_config(CountdownTask())
        with self.assertRaisesRegex(ValueError, "^config: expected an SFTConfig"):
            sft.train_sft(SMALL_TASK, {"steps": 1})

    def test_learning_rate_warms_up_then_decays_by_a_cosine(self):
        config = sft.SFTConfig(steps=100, warmup_steps=10, learning_rate=1e-2, min_lr_ratio=0.1)
        self.assertAlmostEqual(sft.learning_rate_at(1, config), 1e-3, delta=1e-15)
        self.assertAlmostEqual(sft.learning_rate_at(10, config), 1e-2, delta=1e-15)
        self.assertAlmostEqual(sft.learning_rate_at(55, config), 1e-3 + 0.5 * 9e-3, delta=1e-15)  # half-way: cos = 0
        self.assertAlmostEqual(sft.learning_rate_at(100, config), 1e-3, delta=1e-15)


# ---------------------------------------------------------------------------------------------
# Batches and the loss
# ---------------------------------------------------------------------------------------------


class Loss(unittest.TestCase):
    # V = 4 with probabilities 0.1, 0.2, 0.3, 0.4 at every position: log_softmax(log p) = log p
    PROBABILITIES = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    # row 0: one pad, prompt [1, 2], completion [3, 0]; row 1: prompt [2, 1, 1], completion [2], one pad
    IDS = torch.tensor([[0, 1, 2, 3, 0], [2, 1, 1, 2, 0]])
    ATTENTION = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    COMPLETION = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]])

    def fixed_model(self):
        return FixedLogits(self.PROBABILITIES.log().expand(2, 5, 4))

    def test_hand_computed_loss_scores_completion_tokens_only(self):
        model = self.fixed_model()
        loss = sft.completion_loss(model, self.IDS, self.ATTENTION, self.COMPLETION)
        # completion tokens 3 (p 0.4) and 0 (p 0.1) in row 0, 2 (p 0.3) in row 1: a mean over 3 tokens
        expected = -(math.log(0.4) + math.log(0.1) + math.log(0.3)) / 3
        self.assertAlmostEqual(loss.item(), expected, delta=1e-15)
        for row, column, token in ((0, 2, 3), (1, 1, 3), (1, 2, 0), (0, 0, 2), (1, 4, 3)):  # prompt and pad tokens
            with self.subTest(row=row, column=column):
                ids = self.IDS.clone()
                ids[row, column] = token
                self.assertEqual(sft.completion_loss(model, ids, self.ATTENTION, self.COMPLETION).item(), loss.item())
        ids = self.IDS.clone()
        ids[0, 4] = 1  # a completion token: p 0.1 -> 0.2
        changed = sft.completion_loss(model, ids, self.ATTENTION, self.COMPLETION).item()
        self.assertAlmostEqual(changed, -(math.log(0.4) + math.log(0.2) + math.log(0.3)) / 3, delta=1e-15)
        self.assertAlmostEqual(loss.item() - changed, math.log(2) / 3, delta=1e-15)

    def test_gradient_reaches_only_the_positions_that_predict_completion_tokens(self):
        model = self.fixed_model()
        sft.completion_loss(model, self.IDS, self.ATTENTION, self.COMPLETION).backward()
        expected = torch.zeros(2, 5, 4, dtype=torch.float64)
        # d loss / d logits[n, t] = (softmax - one_hot(token t+1)) / 3 where token t+1 is a completion token
        for row, column, token in ((0, 2, 3), (0, 3, 0), (1, 2, 2)):
            expected[row, column] = (self.PROBABILITIES - nn.functional.one_hot(torch.tensor(token), 4)) / 3
        self.assertLess((model.logits.grad - expected).abs().max().item(), 1e-15)

    def test_pair_batch_left_pads_prompts_and_right_pads_responses(self):
        prompts = [0, SMALL_TASK.split_prompts("train")[-1].item()]  # the targets have 1 and 2 digits
        first, second = SMALL_TASK.prompt_tokens(prompts)
        self.assertEqual((len(first), len(second)), (7, 8))
        responses = [(1, 10, 2, SMALL_TASK.eos_id), (3, SMALL_TASK.eos_id)]
        ids, attention, completion = sft.pair_batch(SMALL_TASK, prompts, responses)
        pad = SMALL_TASK.pad_id
        self.assertEqual(ids.tolist(), [[pad] + first + list(responses[0]), second + list(responses[1]) + [pad, pad]])
        self.assertEqual(attention.tolist(), [[0] + [1] * 11, [1] * 10 + [0, 0]])
        self.assertEqual(completion.tolist(), [[0] * 8 + [1] * 4, [0] * 8 + [1, 1, 0, 0]])

    def test_loss_of_a_padded_batch_equals_a_loop_over_single_sequences(self):
        model = TinyLM(TinyLMConfig(vocab_size=16, max_len=14, n_layer=1, n_head=2, d_model=16),
                       generator=torch.Generator().manual_seed(3)).double()
        prompts = [0, 7, SMALL_TASK.split_prompts("train")[-1].item()]
        responses = [(1, 10, 2, SMALL_TASK.eos_id), (3, 11, 1, 10, 5, SMALL_TASK.eos_id), (2, 3, 10)]
        ids, attention, completion = sft.pair_batch(SMALL_TASK, prompts, responses)
        loss = sft.completion_loss(model, ids, attention, completion).item()
        total, count = 0.0, 0
        for prompt, response in zip(SMALL_TASK.prompt_tokens(prompts), responses):
            sequence = torch.tensor([prompt + list(response)])  # (1, L), no padding at all
            log_softmax = torch.log_softmax(model(sequence)[0], dim=-1)  # (L, V)
            for position in range(len(prompt), sequence.shape[1]):
                total -= log_softmax[position - 1, sequence[0, position]].item()
                count += 1
        self.assertEqual(count, 4 + 6 + 3)
        self.assertAlmostEqual(loss, total / count, delta=1e-12)

    def test_the_training_steps_loss_is_the_bits_and_gradients_of_completion_loss(self):
        # float32, as SFT trains: a different order of additions would show in the last bits
        model = TinyLM(TinyLMConfig(vocab_size=16, max_len=14, n_layer=2, n_head=2, d_model=16),
                       generator=torch.Generator().manual_seed(4))
        prompts = [0, 7, 3, SMALL_TASK.split_prompts("train")[-1].item()]
        responses = [(1, 10, 2, SMALL_TASK.eos_id), (3, 11, 1, 10, 5, SMALL_TASK.eos_id), (2, 3, 10), (4,)]
        batch = sft.pair_batch(SMALL_TASK, prompts, responses)
        gradients = []
        for loss_of in (sft.completion_loss, sft._training_loss):
            model.zero_grad(set_to_none=True)
            loss = loss_of(model, *batch)
            loss.backward()
            gradients.append((loss.detach(), [parameter.grad.clone() for parameter in model.parameters()]))
        (plain, plain_grads), (fast, fast_grads) = gradients
        self.assertTrue(torch.equal(fast, plain))
        self.assertGreater(plain.item(), 1.0)  # a random model: about log 16 nats
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(plain_grads, fast_grads)))
        self.assertGreater(sum(grad.abs().sum().item() for grad in fast_grads), 0.0)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------


class Training(unittest.TestCase):
    def test_same_config_gives_identical_state_dict_and_report_bytes(self):
        torch.manual_seed(1)  # the global generator must play no part
        global_state = torch.get_rng_state()
        first_model, first_report = sft.train_sft(SMALL_TASK, TINY)
        self.assertTrue(torch.equal(torch.get_rng_state(), global_state))
        torch.manual_seed(2)
        second_model, second_report = sft.train_sft(SMALL_TASK, TINY)
        self.assertEqual(state_bytes(first_model), state_bytes(second_model))
        self.assertEqual(json_text(first_report), json_text(second_report))
        other_model, _ = sft.train_sft(SMALL_TASK, dataclasses.replace(TINY, seed=1))
        self.assertNotEqual(state_bytes(first_model), state_bytes(other_model))

    def test_progress_lines_match_the_loss_curve(self):
        lines = []
        _, report = sft.train_sft(SMALL_TASK, dataclasses.replace(TINY, steps=20), progress=lines.append)
        self.assertEqual(len(lines), sft.PROGRESS_LINES)
        self.assertEqual([point["step"] for point in report["curve"]], list(range(2, 21, 2)))
        # labelled as what it averages: the training batches since the previous line, not the report's loss
        self.assertTrue(lines[-1].startswith(f"sft step    20/20  batch loss {report['curve'][-1]['loss']:.4f} "
                                             "(mean of steps 19-20)  grad_norm "), lines[-1])
        self.assertIn("(mean of steps 1-2)", lines[0])
        lines = []
        sft.train_sft(SMALL_TASK, dataclasses.replace(TINY, steps=3), progress=lines.append)
        self.assertIn("batch loss", lines[-1])
        self.assertIn("(mean of step 3)", lines[-1])  # one step per line: no range

    def test_summary_line_names_the_set_and_the_weights_of_its_loss(self):
        report = {"model": {"parameters": 12345}, "demonstrations": {"count": 1024},
                  "loss": {"initial": 2.77258, "final": 0.75849}}
        self.assertEqual(sft.summary_line("results-sft/sft-abc", report),
                         "SFT model results-sft/sft-abc: 12,345 parameters, completion loss on the first 1024 "
                         "demonstrations 2.7726 (initial weights) -> 0.7585 (trained) nats/token")
        report["demonstrations"]["count"] = 20_000  # the report scores at most LOSS_ROWS of them
        self.assertIn(f"on the first {sft.LOSS_ROWS} demonstrations", sft.summary_line("f", report))

    def test_a_short_run_lowers_the_completion_loss_well_below_its_start(self):
        loss = REPORT["loss"]
        self.assertAlmostEqual(loss["initial"], math.log(16), delta=0.1)  # near-uniform at initialization
        self.assertLess(loss["final"], 0.5 * loss["initial"])
        self.assertLess(REPORT["curve"][-1]["loss"], REPORT["curve"][0]["loss"] - 0.5)  # nats: the first 10 steps' mean
        demonstrations = REPORT["demonstrations"]
        self.assertEqual(demonstrations["count"], 1024)
        self.assertEqual(demonstrations["correct"] + demonstrations["imperfect"], 1024)
        self.assertAlmostEqual(demonstrations["correct"] / 1024, 0.8, delta=0.05)  # imperfect_share 0.2

    def test_training_under_inference_mode_gives_the_same_model(self):
        with torch.inference_mode():
            inside, _ = sft.train_sft(SMALL_TASK, TINY)
        outside, _ = sft.train_sft(SMALL_TASK, TINY)
        self.assertEqual(state_bytes(inside), state_bytes(outside))

    def test_zero_steps_returns_the_initialization(self):
        model, report = sft.train_sft(SMALL_TASK, dataclasses.replace(TINY, steps=0))
        generator = torch.Generator().manual_seed(TINY.seed)
        SMALL_TASK.demonstrations(TINY.demonstrations, generator)  # what train_sft draws first
        initial = TinyLM(TINY.model_config(SMALL_TASK), generator=generator)
        self.assertEqual(state_bytes(model), state_bytes(initial))
        self.assertEqual(report["loss"]["initial"], report["loss"]["final"])
        self.assertEqual(report["curve"], [])


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


class Cache(unittest.TestCase):
    def test_second_call_loads_without_training(self):
        with tempfile.TemporaryDirectory() as tmp:
            lines = []
            model, report, folder = sft.load_or_train(SMALL_TASK, TINY, tmp, progress=lines.append)
            self.assertEqual(folder, os.path.join(tmp, "sft-" + sft.cache_key(SMALL_TASK, TINY)))
            self.assertEqual(sorted(os.listdir(folder)), ["config.json", "model.pt", "report.json"])
            self.assertTrue(lines[0].startswith(f"sft: training into {folder}"))
            recorded = json.loads(file_bytes(os.path.join(folder, "config.json")))
            self.assertEqual(recorded["model_config"], dataclasses.asdict(TINY.model_config(SMALL_TASK)))
            self.assertEqual(recorded["key_inputs"]["sft"], sft.settings_of(TINY))
            # a model without the subtraction option keeps the key it had before the option existed
            self.assertEqual(set(dataclasses.asdict(TINY)) - set(recorded["key_inputs"]["sft"]), {"subtraction_share"})
            self.assertEqual(recorded["key_inputs"]["torch"], torch.__version__)
            self.assertEqual(file_bytes(os.path.join(folder, "model.pt")), state_bytes(model))
            with mock.patch.object(sft, "train_sft", side_effect=AssertionError("trained again")):
                lines = []
                loaded, loaded_report, loaded_folder = sft.load_or_train(SMALL_TASK, TINY, tmp, progress=lines.append)
            self.assertEqual(lines, [f"sft: loaded the cached model {folder}"])
            self.assertEqual(loaded_folder, folder)
            self.assertEqual(state_bytes(loaded), state_bytes(model))
            self.assertEqual(loaded_report, report)
            self.assertFalse(loaded.training)

    def test_a_changed_setting_trains_into_another_folder(self):
        with tempfile.TemporaryDirectory() as tmp:
            _, _, folder = sft.load_or_train(SMALL_TASK, TINY, tmp)
            other_task = CountdownTask(dataclasses.replace(SMALL_TASK.config, imperfect_share=0.5))
            changes = [(SMALL_TASK, dataclasses.replace(TINY, steps=9)),
                       (SMALL_TASK, dataclasses.replace(TINY, learning_rate=2e-2)),
                       (other_task, TINY)]
            folders = {folder}
            for task, config in changes:
                with self.subTest(config=config), mock.patch.object(sft, "train_sft", wraps=sft.train_sft) as trained:
                    _, _, changed = sft.load_or_train(task, config, tmp)
                    self.assertEqual(trained.call_count, 1)
                    folders.add(changed)
            self.assertEqual(len(folders), 4)
            self.assertEqual(sorted(os.listdir(tmp)), sorted(os.path.basename(path) for path in folders))
            with mock.patch.object(torch, "__version__", "0.0.0"):  # another torch, another key
                self.assertNotEqual(sft.cache_key(SMALL_TASK, TINY), os.path.basename(folder)[len("sft-"):])

    def test_a_corrupt_or_partial_folder_is_retrained_never_used(self):
        def flip_a_byte(path):
            data = bytearray(file_bytes(path))
            data[len(data) // 2] ^= 0xFF
            with open(path, "wb") as handle:
                handle.write(bytes(data))

        def truncate(path):
            data = file_bytes(path)
            with open(path, "wb") as handle:
                handle.write(data[: len(data) // 2])

        damages = [("model.pt", flip_a_byte, "does not match the checksum"),
                   ("model.pt", truncate, "does not match the checksum"),
                   ("report.json", os.remove, "FileNotFoundError"),
                   ("config.json", truncate, "JSONDecodeError")]
        with tempfile.TemporaryDirectory() as tmp:
            model, _, folder = sft.load_or_train(SMALL_TASK, TINY, tmp)
            originals = {name: file_bytes(os.path.join(folder, name)) for name in os.listdir(folder)}
            for name, damage, reason in damages:
                with self.subTest(name=name, damage=damage.__name__):
                    damage(os.path.join(folder, name))
                    self.assertIn(reason, sft.load_cached(SMALL_TASK, TINY, folder)[2])
                    lines = []
                    with mock.patch.object(sft, "train_sft", wraps=sft.train_sft) as trained:
                        retrained, _, _ = sft.load_or_train(SMALL_TASK, TINY, tmp, progress=lines.append)
                    self.assertEqual(trained.call_count, 1)
                    self.assertIn(reason, lines[0])
                    self.assertEqual(state_bytes(retrained), state_bytes(model))
                    self.assertEqual({name: file_bytes(os.path.join(folder, name)) for name in os.listdir(folder)},
                                     originals)


    def test_a_pipe_a_link_or_a_huge_file_in_the_cache_is_never_read(self):
        with tempfile.TemporaryDirectory() as tmp:
            _, _, folder = sft.load_or_train(SMALL_TASK, TINY, tmp)
            model_path, config_path = os.path.join(folder, "model.pt"), os.path.join(folder, "config.json")
            with open(model_path, "r+b") as handle:  # sparse: 100 MB that take no disk
                handle.truncate(100 * 2**20)
            self.assertIn("far more than any SFT model", sft.load_cached(SMALL_TASK, TINY, folder)[2])
            sft.load_or_train(SMALL_TASK, TINY, tmp)  # retrained: a regular file is replaced
            self.assertIsNone(sft.load_cached(SMALL_TASK, TINY, folder)[2])
            os.remove(config_path)
            os.mkfifo(config_path)  # opening it for reading would wait for a writer forever
            self.assertIn("not a regular file", sft.load_cached(SMALL_TASK, TINY, folder)[2])
            with self.assertRaisesRegex(lab_io.WriteFailed, "config.json"):  # and it is never replaced
                sft.load_or_train(SMALL_TASK, TINY, tmp)
            self.assertTrue(stat.S_ISFIFO(os.lstat(config_path).st_mode))


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


class SubtractionShare(unittest.TestCase):
    """sft.subtraction_demonstrations: the correct demonstrations redrawn so a chosen share subtracts."""

    def draw(self, share, count=2000):
        generator = torch.Generator().manual_seed(0)
        pairs = SMALL_TASK.demonstrations(count, generator)
        return pairs, sft.subtraction_demonstrations(SMALL_TASK, pairs, share, generator)

    def test_the_share_of_subtracting_correct_demonstrations_is_the_setting(self):
        minus = SMALL_TASK.vocab.index("-")
        for share in (0.0, 0.25, 1.0):
            with self.subTest(share=share):
                pairs, redrawn = self.draw(share)
                self.assertEqual(len(redrawn), len(pairs))
                correct = [(prompt, response) for prompt, response in redrawn
                           if response in SMALL_TASK.solutions(prompt)]
                kept = [(prompt, response) for prompt, response in pairs if response in SMALL_TASK.solutions(prompt)]
                self.assertEqual(len(correct), len(kept))  # a correct demonstration stays a correct one
                subtracting = sum(minus in response for _, response in correct) / len(correct)
                # binomial: 3 standard errors of about 1600 draws is under 0.035
                self.assertLess(abs(subtracting - share), 0.035)
                self.assertTrue(all(prompt in SMALL_TASK.split_prompts("train").tolist() for prompt, _ in redrawn))
                # the imperfect demonstrations are the task's own, in their places
                self.assertEqual([pair for pair in redrawn if pair[1] not in SMALL_TASK.solutions(pair[0])],
                                 [pair for pair in pairs if pair[1] not in SMALL_TASK.solutions(pair[0])])

    def test_absent_leaves_the_prompts_that_need_a_subtraction_without_a_correct_demonstration(self):
        _, redrawn = self.draw(0.0)
        needing = {prompt for prompt in SMALL_TASK.split_prompts("train").tolist()
                   if all(sft.uses_subtraction(SMALL_TASK, s) for s in SMALL_TASK.solutions(prompt))}
        self.assertTrue(needing)
        self.assertFalse([prompt for prompt, response in redrawn
                          if prompt in needing and response in SMALL_TASK.solutions(prompt)])

    def test_the_option_has_its_own_cache_key_and_a_deterministic_draw(self):
        keys = {sft.cache_key(SMALL_TASK, dataclasses.replace(TINY, subtraction_share=share)) for share in (0.0, 0.5)}
        keys.add(sft.cache_key(SMALL_TASK, TINY))
        self.assertEqual(len(keys), 3)
        self.assertEqual(self.draw(0.5)[1], self.draw(0.5)[1])
        self.assertTrue(sft.uses_subtraction(SMALL_TASK, tuple(SMALL_TASK.encode("3-1EOS"))))
        self.assertFalse(sft.uses_subtraction(SMALL_TASK, tuple(SMALL_TASK.encode("3+1EOS"))))
        with self.assertRaisesRegex(ValueError, "^share"):
            sft.subtraction_demonstrations(SMALL_TASK, [], 1.5, torch.Generator())


class ExactSuccess(unittest.TestCase):
    def test_equals_a_loop_over_each_solution_alone(self):
        model = copy.deepcopy(MODEL).double()
        prompts = SMALL_TASK.split_prompts("test")[:6]
        for temperature in (1.0, 0.7):
            expected = []
            for prompt, tokens in zip(prompts.tolist(), SMALL_TASK.prompt_tokens(prompts)):
                total = 0.0
                for solution in SMALL_TASK.solutions(prompt):
                    sequence = torch.tensor([tokens + list(solution)])  # (1, L), no padding
                    completion = torch.zeros_like(sequence)
                    completion[0, len(tokens):] = 1
                    log_probs = completion_log_probs(model, sequence, torch.ones_like(sequence), completion,
                                                     temperature=temperature)
                    total += math.exp(log_probs.sum().item())
                expected.append(total)
            for batch_rows in (sft.DEFAULT_BATCH_ROWS, 5):  # one forward pass, or several chunks
                with self.subTest(temperature=temperature, batch_rows=batch_rows):
                    success = sft.exact_success(model, SMALL_TASK, prompts, temperature, batch_rows=batch_rows)
                    self.assertEqual(success.dtype, torch.float64)
                    self.assertLess(max(abs(a - b) / b for a, b in zip(success.tolist(), expected)), 1e-12)

    def test_agrees_with_sampled_frequencies(self):
        prompts = SMALL_TASK.split_prompts("train")
        samples = 2000
        for temperature in (1.0, 0.7):
            success = sft.exact_success(MODEL, SMALL_TASK, prompts, temperature)
            best = prompts[success.argsort(descending=True)[:3]]  # the likeliest to be solved
            rows = best.repeat_interleave(samples)  # (3,) -> (3 * samples,)
            ids, mask = sft.prompt_batch(SMALL_TASK, rows)
            out = generate(MODEL, ids, mask, SMALL_TASK.max_new_tokens, eos_id=SMALL_TASK.eos_id,
                           pad_id=SMALL_TASK.pad_id, temperature=temperature,
                           generator=torch.Generator().manual_seed(11))
            width = ids.shape[1]
            rewards = SMALL_TASK.rewards(rows, out.sequences[:, width:], out.completion_mask[:, width:], out.truncated)
            frequencies = SMALL_TASK.correct(rewards).view(3, samples).double().mean(dim=1)  # (3 * samples,) -> (3,)
            for prompt, frequency, probability in zip(best.tolist(), frequencies.tolist(),
                                                      sft.exact_success(MODEL, SMALL_TASK, best, temperature).tolist()):
                with self.subTest(temperature=temperature, prompt=prompt):
                    self.assertGreater(probability, 0.05)  # a test with something to detect
                    bound = 4 * math.sqrt(probability * (1 - probability) / samples)  # 4 standard errors
                    self.assertLess(abs(frequency - probability), bound)

    def test_bad_arguments_name_the_argument(self):
        for kwargs, name in (({"prompts": []}, "prompts"), ({"prompts": [0], "temperature": 0.0}, "temperature"),
                             ({"prompts": [10_000]}, "prompts"), ({"prompts": [0], "batch_rows": 0}, "batch_rows")):
            with self.subTest(name=name), self.assertRaisesRegex(ValueError, f"^{name}"):
                sft.exact_success(MODEL, SMALL_TASK, **kwargs)


class SampleEvaluation(unittest.TestCase):
    def test_matches_a_slow_recount_of_the_same_samples(self):
        samples, ks = 16, (1, 4, 16)
        generator = torch.Generator().manual_seed(5)
        state = generator.get_state()
        result = sft.sample_evaluation(MODEL, SMALL_TASK, "test", ks=ks, samples=samples, generator=generator)
        # the same draws: one generate call over every prompt's samples (15 x 16 rows < batch_size)
        prompts = SMALL_TASK.split_prompts("test")
        rows = prompts.repeat_interleave(samples)
        ids, mask = sft.prompt_batch(SMALL_TASK, rows)
        out = generate(MODEL, ids, mask, SMALL_TASK.max_new_tokens, eos_id=SMALL_TASK.eos_id,
                       pad_id=SMALL_TASK.pad_id, generator=torch.Generator().set_state(state))
        width = ids.shape[1]
        counts, distinct, correct_lengths, wrong_lengths, entropies, truncated = {}, {}, [], [], [], 0
        for row, prompt in enumerate(rows.tolist()):
            length = int(out.completion_mask[row].sum())
            tokens = out.sequences[row, width:width + length].tolist()
            cut = bool(out.truncated[row])
            truncated += cut
            correct = SMALL_TASK.verify(prompt, tokens, cut) == 1.0
            counts[prompt] = counts.get(prompt, 0) + correct
            distinct.setdefault(prompt, set())
            if correct:
                distinct[prompt].add(tuple(tokens))
            (correct_lengths if correct else wrong_lengths).append(length)
            real = out.sequences[row, out.attention_mask[row].bool()]  # the row without padding
            probabilities = torch.softmax(MODEL(real[None])[0].double(), dim=-1)  # (L, V)
            prompt_length = len(real) - length
            for position in range(prompt_length - 1, len(real) - 1):  # the distributions the tokens came from
                entropies.append(-(probabilities[position] * probabilities[position].log()).sum().item())
        self.assertEqual(result["prompts"], 15)
        for k in ks:
            expected = sum(pass_at_k(samples, count, k) for count in counts.values()) / 15
            self.assertAlmostEqual(result[f"pass@{k}"], expected, delta=1e-12)
        self.assertAlmostEqual(result["pass@1"], sum(counts.values()) / (15 * samples), delta=1e-12)
        self.assertGreater(result["pass@16"], result["pass@1"])  # several samples solve more prompts
        self.assertAlmostEqual(result["distinct_correct_per_prompt"],
                               sum(len(found) for found in distinct.values()) / 15, delta=1e-12)
        self.assertAlmostEqual(result["mean_length_correct"], sum(correct_lengths) / len(correct_lengths), delta=1e-12)
        self.assertAlmostEqual(result["mean_length_wrong"], sum(wrong_lengths) / len(wrong_lengths), delta=1e-12)
        self.assertAlmostEqual(result["truncation_rate"], truncated / (15 * samples), delta=1e-12)
        self.assertAlmostEqual(result["entropy_per_token"], sum(entropies) / len(entropies), delta=1e-5)  # float32
        self.assertAlmostEqual(result["exact_pass@1"],
                               sft.exact_success(MODEL, SMALL_TASK, prompts).mean().item(), delta=1e-12)
        by_difficulty = {}
        for prompt, count in counts.items():
            by_difficulty.setdefault(str(SMALL_TASK.difficulty(prompt)), []).append(count / samples)
        self.assertEqual(result["prompts_by_difficulty"], {level: len(v) for level, v in sorted(by_difficulty.items())})
        for level, values in by_difficulty.items():
            self.assertAlmostEqual(result["pass@1_by_difficulty"][level], sum(values) / len(values), delta=1e-12)

    def test_deterministic_from_the_generator_and_a_subset_of_prompts(self):
        def run(seed, **options):
            return sft.sample_evaluation(MODEL, SMALL_TASK, "train", ks=(1, 8), samples=8,
                                         generator=torch.Generator().manual_seed(seed), **options)

        self.assertEqual(json_text(run(3)), json_text(run(3)))
        self.assertEqual(json_text(run(3, batch_size=64)), json_text(run(3, batch_size=64)))
        self.assertNotEqual(run(3)["pass@1"], run(4)["pass@1"])
        subset = run(3, max_prompts=5)
        self.assertEqual(subset["prompts"], 5)
        self.assertEqual(sum(subset["prompts_by_difficulty"].values()), 5)
        self.assertEqual(run(3, max_prompts=1000)["prompts"], 60)

    def test_bad_arguments_name_the_argument(self):
        generator = torch.Generator().manual_seed(0)
        cases = [({"split": "valid"}, "split"), ({"ks": (32,), "samples": 16}, "ks"), ({"samples": 0}, "samples"),
                 ({"max_prompts": 0}, "max_prompts"), ({"temperature": -1.0}, "temperature"),
                 ({"generator": 7}, "generator")]
        for options, name in cases:
            arguments = {"split": "test", "generator": generator, **options}
            split = arguments.pop("split")
            with self.subTest(name=name), self.assertRaisesRegex(ValueError, f"^{name}"):
                sft.sample_evaluation(MODEL, SMALL_TASK, split, **arguments)


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

SMALL_FLAGS = ["--steps", "4", "--demonstrations", "64", "--n-layer", "1", "--n-head", "2", "--d-model", "16",
               "--samples", "8", "--max-prompts", "3"]


class CommandLine(unittest.TestCase):
    def test_help_shows_every_flag_with_its_default(self):
        code, stdout, _ = run_main(sft.main, ["--help"])
        self.assertEqual(code, 0)
        flat = " ".join(stdout.split())
        for item in sft.SETTINGS:
            self.assertIn(item.option, flat)
        steps_help = ("--steps STEPS Adam steps (0: the random initialization, untrained); integer in [0, 100000] "
                      "(default: 1500)")
        for text in (steps_help, "(default: results-sft)", "--lr LEARNING_RATE", "(default: 0.003)",
                     "(default: 64)", "(default: every prompt)", "(default: off)"):
            self.assertIn(text, flat)
        self.assertEqual(flat.count("(default:"), len(sft.SETTINGS) + 4)

    def test_bad_flags_exit_2_naming_the_flag_before_writing(self):
        cases = [("--steps", "-1"), ("--steps", "1.5"), ("--lr", "0"), ("--lr", "nan"), ("--d-model", "10"),
                 ("--max-len", "5"), ("--samples", "0"), ("--seed", "-1"), ("--batch-size", "x"),
                 ("--max-prompts", "0"), ("--eval-seed", "-2")]
        with tempfile.TemporaryDirectory() as tmp:
            output = os.path.join(tmp, "out")
            for flag, value in cases:
                with self.subTest(flag=flag, value=value):
                    code, stdout, stderr = run_main(sft.main, [flag, value, "--output", output])
                    self.assertEqual(code, 2)
                    self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                    self.assertIn(flag, stderr)
                    self.assertEqual(stdout, "")
                    self.assertFalse(os.path.exists(output))

    def test_a_small_run_writes_the_cache_and_the_evaluation_and_reruns_identically(self):
        with tempfile.TemporaryDirectory() as tmp:
            output = os.path.join(tmp, "out")
            code, stdout, _ = run_main(sft.main, SMALL_FLAGS + ["--output", output])
            self.assertEqual(code, 0)
            self.assertIn("sft: training into", stdout)
            self.assertIn("pass@1", stdout)
            path = os.path.join(output, "evaluation.json")
            first = file_bytes(path)
            document = json.loads(first)
            folder = os.path.join(output, document["sft"]["folder"])
            self.assertEqual(sorted(os.listdir(folder)), ["config.json", "model.pt", "report.json"])
            self.assertEqual(sorted(os.listdir(output)), sorted([document["sft"]["folder"], "evaluation.json"]))
            for split in ("train", "test"):
                evaluation = document["evaluation"][split]
                self.assertEqual((evaluation["prompts"], evaluation["samples"]), (3, 8))
                self.assertEqual([key for key in evaluation if key.startswith("pass@") and key[5:].isdigit()],
                                 ["pass@1", "pass@4"])  # k up to --samples
            code, stdout, _ = run_main(sft.main, SMALL_FLAGS + ["--output", output])
            self.assertEqual(code, 0)
            self.assertIn("sft: loaded the cached model", stdout)
            self.assertEqual(file_bytes(path), first)

    def test_an_interrupted_evaluation_leaves_neither_the_new_model_nor_an_evaluation(self):
        with tempfile.TemporaryDirectory() as tmp:
            output = os.path.join(tmp, "out")
            with mock.patch.object(sft, "sample_evaluation", side_effect=KeyboardInterrupt):
                code, _, stderr = run_cli_in_process(sft.main, SMALL_FLAGS + ["--output", output])
            self.assertEqual(code, 130)
            self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
            self.assertFalse(os.path.exists(output))  # the model is written with its evaluation, or not at all


if __name__ == "__main__":
    unittest.main()
