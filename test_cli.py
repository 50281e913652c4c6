"""The command-line contract, one test over every program of the lab: a bad flag exits 2 with one line
naming it and writes nothing; an output that is the wrong kind of path is refused and left untouched;
a rerun writes the same bytes; --help shows every option's default.

    python -m unittest -v test_cli

Each program's own outputs and messages are tested in its own file; here only what every one promises.
"""

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import unittest
from dataclasses import dataclass, field

import bench
import countdown
import course
import exercise_cases
import exercises
import experiments
import library_map
import make_docs
import online_algorithms
import online_settings
import online_tokens
import plot_course
import plot_results
import policies
import ppo_chain
import rl_lab
import sft
import tasks
import token_objectives
from lab.testing import HERE, run_main, single_thread_module

setUpModule, tearDownModule = single_thread_module()  # one torch thread, as the drivers train


@dataclass
class Program:
    """How to run a program cheaply into OUT (a folder or a file path), and its bad flags (flag, argv)."""

    main: object
    build_parser: object
    argv: list  # a cheap run; "{out}" is replaced by the output path
    output: str  # "folder" or "file"
    bad: list = field(default_factory=list)
    writes: bool = True


PLOT_INPUT = os.path.join(HERE, "results-chain")
MEMORY_FOLDER = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None  # a memory filesystem: quicker writes
PROGRAMS = {
    "rl_lab.py": Program(rl_lab.main, rl_lab.build_parser, ["--steps", "2", "--output", "{out}"], "folder", [
        ("--steps", ["--steps", "0"]), ("--steps", ["--steps", "1.5"]), ("--steps", ["--steps", "ten"]),
        ("--steps", ["--steps", " 3"]), ("--steps", ["--steps", "+3"]), ("--steps", ["--steps", "1_0"]),
        ("--steps", ["--steps", "\u0663"]), ("--seed", ["--seed", "\uff13"]), ("--step", ["--step", "3"]),
        ("--group-size", ["--group-size", "1"]), ("--preference-flips", ["--preference-flips", "13"]),
        ("--preference-flips", ["--algorithm", "grpo", "--preference-flips", "2"]), ("--seed", ["--seed", "-1"]),
        ("--seed", ["--seed", str(2**63)]), ("--grpo-prompts", ["--grpo-prompts", "0"]),
        ("--algorithm", ["--algorithm", "sac"]), ("--json", ["--algorithm", "ppo", "--json"]),
        ("--output", ["--algorithm", "atoms"]),  # the atoms write nothing (the test adds an --output)
        ("--group-size", ["--algorithm", "dpo", "--group-size", "4"]), ("--grpo-prompts", ["--algorithm", "ppo",
                                                                                          "--grpo-prompts", "3"]),
        ("--steps", ["--algorithm", "atoms", "--steps", "3"]), ("--sparse-rewards", ["--algorithm", "atoms",
                                                                                      "--sparse-rewards"]),
        ("--group-size", ["--grpo-prompts", "4096", "--group-size", "4096"]),  # 16.7M actions per iteration
    ]),
    "ppo_chain.py": Program(ppo_chain.main, ppo_chain.build_parser, ["--steps", "2", "--output", "{out}"], "folder", [
        ("--gae-lambda", ["--gae-lambda", "-0.1"]), ("--gae-lambda", ["--gae-lambda", "1.01"]),
        ("--gae-lambda", ["--gae-lambda", "inf"]), ("--gae-lambda", ["--gae-lambda", "nan"]),
        ("--steps", ["--steps", "100001"]), ("--seed", ["--seed", "7.5"]), ("--seed", ["--seed", "abc"]),
    ]),
    "token_objectives.py": Program(token_objectives.main, token_objectives.build_parser, ["--output", "{out}"], "file",
                                   [("--online", ["--online"])]),
    "online_tokens.py": Program(online_tokens.main, online_tokens.build_parser, ["--steps", "2", "--output", "{out}"],
                                "folder", [
        ("--steps", ["--steps", "0"]),
        ("--group-size", ["--group-size", "1"]),
        ("--temperature", ["--temperature", "0"]),
        ("--temperature", ["--temperature", "nan"]),
        ("--temperature", ["--temperature", "5e-324"]),  # would overflow every tempered logit
        ("--epsilon", ["--epsilon", "1"]),
        ("--loss", ["--loss", "grpo"]),  # the first release's name for --algorithm is gone
        ("--reduction", ["--reduction", "mean"]),
        ("--max-new-tokens", ["--max-new-tokens", "65"]),
        ("--lr", ["--lr", "-0.1"]),
        ("--prompts", ["--prompts", "4096", "--group-size", "1024", "--max-new-tokens", "64"]),  # ~15 GB
        ("--epsilon-high", ["--epsilon-high", "-1"]),
        ("--epsilon-high", ["--algorithm", "cispo", "--epsilon-high", "0"]),  # a cap of 0 keeps no weight
        ("--dual-clip", ["--dual-clip", "1"]),  # c must exceed 1
        ("--dual-clip", ["--algorithm", "cispo", "--dual-clip", "3"]),  # does not apply to cispo
        ("--gae-lambda", ["--gae-lambda", "0.5"]),  # a PPO flag with the default grpo
        ("--kl-estimator", ["--beta", "0", "--kl-estimator", "k2"]),  # no KL term: the estimator changes nothing
        ("--kl-in", ["--beta", "0", "--kl-in", "reward"]),
        ("--dpo-loss", ["--algorithm", "dpo", "--dpo-loss", "kto"]),
        ("--label-smoothing", ["--algorithm", "dpo", "--label-smoothing", "0.5"]),
        ("--label-smoothing", ["--algorithm", "dpo", "--label-smoothing", "0.2"]),  # sigmoid ignores it
        ("--scale-rewards", ["--advantage", "rloo", "--scale-rewards", "none"]),  # RLOO divides by no std
        ("--overlong-penalty", ["--overlong-penalty", "6"]),  # a cache beyond the 5-token cap
        ("--rollout-top-p", ["--rollout-top-p", "0"]),
        ("--tis-cap", ["--tis-cap", "0.5"]),
        ("--tis-cap", ["--algorithm", "gspo", "--tis-cap", "2"]),
        ("--reduction", ["--algorithm", "all", "--reduction", "token"]),  # not for ppo and dpo
        ("--algorithm", ["--algorithm", "reinforce"]),
        ("--truncation", ["--algorithm", "ppo", "--truncation", "never"]),
        ("--simpo-gamma", ["--algorithm", "dpo", "--simpo-gamma", "1"]),
        ("--max-resample-rounds", ["--max-resample-rounds", "3"]),  # without --dynamic-sampling
        ("--cap-value", ["--algorithm", "ppo", "--truncation", "terminal", "--cap-value", "shared"]),
        ("--dpo-beta", ["--algorithm", "dpo", "--dpo-loss", "ipo", "--dpo-beta", "1e-160"]),
        ("--tau-neg", ["--algorithm", "sapo", "--tau-neg", "5e-324"]),
        ("--task", ["--task", "countdown"]),  # a table cannot answer an unseen prompt
        ("--sampler-dtype", ["--sampler-dtype", "bfloat16"]),  # the table has no separate sampler
        ("--cap-value", ["--policy", "transformer", "--algorithm", "ppo", "--cap-value", "shared"]),
        ("--sft-folder", ["--policy", "transformer", "--sft-folder", os.devnull]),  # checked before any training
        ("--max-new-tokens", ["--policy", "transformer", "--max-new-tokens", "7"]),  # Countdown's longest is 8
        ("--prompts", ["--policy", "transformer", "--prompts", "4096", "--group-size", "2"]),  # memory
        # the second wave: each flag checked once, and each combination a loss cannot take
        ("--algorithm", ["--algorithm", "dppo"]),
        ("--advantage", ["--advantage", "gdpo"]),  # no task with several rewards in the loop
        ("--advantage", ["--advantage", "maxrl", "--kl-in", "reward"]),  # MaxRL needs rewards >= 0
        ("--advantage", ["--advantage", "maxrl", "--overlong-penalty", "2"]),
        ("--scale-rewards", ["--advantage", "opo", "--scale-rewards", "none"]),  # OPO divides by no std
        ("--epsilon", ["--algorithm", "kl-cov", "--epsilon", "0.1"]),  # KL-Cov has no ratio clip
        ("--epsilon", ["--algorithm", "dppo-tv", "--epsilon", "0"]),  # an empty trust region
        ("--dual-clip", ["--algorithm", "dppo-kl", "--dual-clip", "3"]),
        ("--reduction", ["--algorithm", "gmpo", "--reduction", "token"]),  # GMPO reduces per sequence itself
        ("--dppo-cap", ["--dppo-cap", "2"]),  # a DPPO setting with grpo
        ("--dppo-cap", ["--algorithm", "dppo-tv", "--dppo-cap", "0"]),
        ("--cov-fraction", ["--algorithm", "clip-cov", "--cov-fraction", "0"]),
        ("--cov-high", ["--algorithm", "clip-cov", "--cov-low", "5", "--cov-high", "1"]),
        ("--kl-cov-coef", ["--algorithm", "clip-cov", "--kl-cov-coef", "1"]),
        ("--dro-tau", ["--algorithm", "dro", "--dro-tau", "0"]),
        ("--cegppo-beta1", ["--algorithm", "cegppo", "--cegppo-beta1", "-1"]),
        ("--vespo-k-pos", ["--algorithm", "vespo", "--vespo-k-pos", "nan"]),
        ("--tis-cap", ["--algorithm", "vespo", "--tis-cap", "2"]),  # VESPO takes no importance weights
        ("--rollout-correction", ["--rollout-correction", "tokens"]),
        ("--rollout-correction", ["--algorithm", "luspo", "--rollout-correction", "token"]),
        ("--rollout-correction", ["--tis-cap", "2", "--rollout-correction", "token"]),  # TIS is one of its cases
        ("--rollout-correction-mode", ["--rollout-correction-mode", "mask"]),  # without --rollout-correction
        ("--rollout-correction-low", ["--rollout-correction", "token", "--rollout-correction-low", "3"]),  # > high
        ("--rollout-correction-high", ["--rollout-correction", "token", "--rollout-correction-high", "0"]),
        ("--off-policy-mask", ["--off-policy-mask", "-0.1"]),
        ("--off-policy-mask", ["--algorithm", "ppo", "--off-policy-mask", "0.1"]),
        ("--m2po", ["--m2po", "0"]),
        ("--kl-estimator", ["--kl-estimator", "k4"]),
        ("--kl-estimator", ["--kl-estimator", "k3+", "--kl-in", "reward"]),  # only its gradient differs from k3
        ("--entropy-coef", ["--entropy-coef", "-0.1"]),
        ("--entropy-coef", ["--algorithm", "dpo", "--entropy-coef", "0.1"]),
        ("--adaptive-entropy", ["--adaptive-entropy", "0"]),
        ("--top-entropy-quantile", ["--top-entropy-quantile", "1.5"]),
    ]),
    "experiments.py": Program(experiments.main, experiments.build_parser,
                              ["kl-estimators", "--seeds", "1", "--output", "{out}"], "folder", [
        ("NAME", ["nope"]), ("NAME", []), ("--seeds", ["all", "--seeds", "0"]), ("--jobs", ["all", "--jobs", "0"]),
        ("--seeds", ["all", "--seeds", "x"]), ("--seed-start", ["all", "--seed-start", "-1"]),
        ("--seed-start", ["all", "--seed-start", "1.5"]), ("--seed-start", ["all", "--seed-start", str(2**63)]),
        ("--timings", ["all", "--timings", os.curdir]),  # a folder: refused before any run
        ("--list", ["--list", "kl-estimators"]),  # --list runs nothing: the name would be lost
    ]),
    "plot_results.py": Program(plot_results.main, plot_results.build_parser,
                               ["--input", PLOT_INPUT, "--output", "{out}"], "file", [
        ("--output", ["--input", PLOT_INPUT, "--output", "figure.gif"]),
        ("--input", ["--input", os.path.join(PLOT_INPUT, "no-such-file.csv"), "--output",
                     os.path.join(tempfile.gettempdir(), "rl-lab-never-written.svg")]),
    ]),
    "sft.py": Program(sft.main, sft.build_parser, None, "folder", [("--steps", ["--steps", "-1"])], writes=False),
    "bench.py": Program(bench.main, bench.build_parser, None, "none", [
        ("--runs", ["--runs", "0"]), ("--part", ["--part", "everything"]),
        ("--output", ["--part", "transformer", "--output", os.curdir]),  # a folder: refused before any timing
        ("--tests", ["--part", "suite", "--tests", "nonexistent_mod"]), ("--tests", ["--tests", "test_results"]),
        ("--tests", ["--part", "suite", "--tests", "rl_lab"]),
    ], writes=False),
    "library_map.py": Program(library_map.main, library_map.build_parser, None, "none", [("--x", ["--x"])],
                              writes=False),
    "exercises.py": Program(exercises.main, exercises.build_parser, None, "none", [
        ("{start,check,train}", ["begin"]), ("{start,check,train}", []),
        ("--atom", ["check", "--atom", "ppo"]), ("--atom", ["train", "--atom", "gae"]),
        ("--file", ["check", "--file", os.path.join(tempfile.gettempdir(), "rl-lab-no-such-atoms.py")]),
        ("--file", ["start", "--file", os.curdir]),  # an existing path: start never replaces one
        ("--steps", ["train", "--steps", "0"]), ("--online-steps", ["train", "--online-steps", "1001"]),
        ("--steps", ["check", "--steps", "5"]),  # a flag of train only
    ], writes=False),
    "course.py": Program(course.main, course.build_parser, ["--chapter", "01-log-probabilities", "--output", "{out}"],
                         "folder", [("--chapter", ["--chapter", "nope"]), ("--chapter", ["--chapter", ""]),
                                    ("--output", ["--output", ""]),
                                    ("--output", ["--output", os.path.join(HERE, "README.txt", "inside")])]),
    "make_docs.py": Program(make_docs.main, make_docs.build_parser, None, "none", [("--check", ["--check=yes"])],
                            writes=False),
}


def path_for(program, folder):
    return os.path.join(folder, "out.svg" if program.output == "file" else "out")


def snapshot(path):
    """{relative path: bytes} of every file under `path` (or of the file itself)."""
    if os.path.isfile(path):
        with open(path, "rb") as handle:
            return {"": handle.read()}
    found = {}
    for folder, _, names in os.walk(path):
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                found[os.path.relpath(os.path.join(folder, name), path)] = handle.read()
    return found


# programs whose own tests already compare the bytes of two runs: the rerun below runs them once
BYTES_CHECKED_ELSEWHERE = {
    "experiments.py": "test_experiments: test_one_experiment_writes_its_files_and_the_same_bytes_whatever_the_jobs",
    "plot_results.py": "test_plot_results: test_renders_every_kind_and_the_svg_is_deterministic",
}


class Contract(unittest.TestCase):
    def run_program(self, program, argv):
        return run_main(program.main, argv)

    def test_a_bad_flag_exits_2_with_one_line_naming_it_and_writes_nothing(self):
        for name, program in PROGRAMS.items():
            for flag, argv in program.bad:
                with self.subTest(program=name, argv=argv), \
                        tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
                    out = os.path.join(tmp, "never")
                    extra = ["--output", out] if program.output != "none" and "--output" not in argv else []
                    code, stdout, stderr = self.run_program(program, argv + extra)
                    self.assertEqual(code, 2)
                    self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                    self.assertIn(flag, stderr)
                    self.assertEqual(stdout, "")
                    self.assertEqual(os.listdir(tmp), [])

    def test_an_output_of_the_wrong_kind_is_refused_and_left_untouched(self):
        for name, program in PROGRAMS.items():
            if not program.writes:
                continue
            with self.subTest(program=name), tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
                if program.output == "folder":  # a file where the folder goes
                    taken = os.path.join(tmp, "taken")
                    with open(taken, "w", encoding="utf-8") as handle:
                        handle.write("keep me\n")
                else:  # a folder where the file goes, holding a file
                    taken = os.path.join(tmp, "taken.svg")
                    os.mkdir(taken)
                    with open(os.path.join(taken, "inside"), "w", encoding="utf-8") as handle:
                        handle.write("keep me\n")
                before = snapshot(taken)
                argv = [taken if part == "{out}" else part for part in program.argv]
                code, stdout, stderr = self.run_program(program, argv)
                self.assertEqual(code, 2)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn("--output", stderr)
                self.assertEqual(snapshot(taken), before)
                self.assertEqual(sorted(os.listdir(tmp)), [os.path.basename(taken)])

    def test_a_rerun_writes_the_same_bytes_and_leaves_no_temporary(self):
        for name, program in PROGRAMS.items():
            if not program.writes:
                continue
            with self.subTest(program=name), tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
                out = path_for(program, os.path.join(tmp, "a"))
                argv = [out if part == "{out}" else part for part in program.argv]
                code, _, stderr = self.run_program(program, argv)
                self.assertEqual(code, 0, stderr)
                written = snapshot(out)
                self.assertGreater(len(written), 0)
                self.assertEqual([entry for entry in os.listdir(os.path.dirname(out)) if entry.startswith(".")], [])
                if name in BYTES_CHECKED_ELSEWHERE:
                    continue
                # the rerun goes over the first run's files, each spoiled first: it must write every one
                # again, byte for byte (a program that kept an existing file would keep the spoiled bytes)
                for relative in written:
                    with open(os.path.join(out, relative) if relative else out, "wb") as handle:
                        handle.write(b"spoiled\n")
                code, _, stderr = self.run_program(program, argv)
                self.assertEqual(code, 0, stderr)
                self.assertEqual(snapshot(out), written)
                self.assertEqual([entry for entry in os.listdir(os.path.dirname(out)) if entry.startswith(".")], [])

    def test_an_output_flag_pointing_into_the_runs_own_output_is_refused_before_any_work(self):
        with tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
            out = os.path.join(tmp, "out")
            experiment = ["zero-variance", "--quick", "--seeds", "1", "--output", out, "--timings"]
            cases = [
                ("--timings", experiments.main, experiment + [os.path.join(out, "zero-variance", "settings.json")]),
                ("--timings", experiments.main, experiment + [os.path.join(out, "zero-variance")]),  # a folder it makes
                ("--sft-folder", online_tokens.main, ["--policy", "transformer", "--steps", "1", "--output", out,
                                                      "--sft-folder", os.path.join(out, "online.json")]),
            ]
            for flag, main, argv in cases:
                with self.subTest(argv=argv):
                    code, stdout, stderr = run_main(main, argv)
                    self.assertEqual((code, stdout), (2, ""))
                    self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                    self.assertIn(f"argument {flag}: ", stderr)
                    self.assertIn(f"is inside --output '{out}'", stderr)
                    self.assertEqual(os.listdir(tmp), [])

    def test_help_shows_every_options_default(self):
        for name, program in PROGRAMS.items():
            with self.subTest(program=name):
                code, stdout, stderr = self.run_program(program, ["--help"])
                self.assertEqual((code, stderr), (0, ""))
                parser = program.build_parser()
                formatter = parser._get_formatter()
                for action in parser._actions:
                    if isinstance(action, argparse._HelpAction) or not action.option_strings:
                        continue
                    shown = formatter._expand_help(action) if action.help else ""  # as --help prints it
                    self.assertIn("default", shown.lower(),
                                  f"{name} {action.option_strings[0]}: its help does not state its default")
                    self.assertNotIn("default: None", shown, f"{name} {action.option_strings[0]}")
                    self.assertIn(action.option_strings[0], stdout)


# every program reads its flags before its heavy imports
FLAGS_FIRST = list(PROGRAMS) + ["bridge.py"]
HEAVY = ("torch", "matplotlib.pyplot")  # modules of a second or more (torch) or half a second (pyplot)


def imported_in_a_process(program, argv, stdout=subprocess.PIPE):
    """(status, stdout, stderr without the import lines, the modules imported) of `python program argv`."""
    finished = subprocess.run([sys.executable, "-X", "importtime", program, *argv], cwd=HERE, stdout=stdout,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                              env={**os.environ, "COLUMNS": "1000"})
    said, modules = [], set()
    for line in finished.stderr.splitlines():
        if line.startswith("import time:"):  # "import time: self [us] | cumulative | imported package"
            modules.add(line.rsplit("|", 1)[-1].strip())
        else:
            said.append(line)
    return finished.returncode, finished.stdout, "".join(line + "\n" for line in said), modules


class FlagsFirst(unittest.TestCase):
    """--help and a bad flag answer before torch (and pyplot) is imported, exactly as main() answers them."""

    def test_help_and_a_bad_flag_import_neither_torch_nor_pyplot_and_answer_as_main_does(self):
        cases = []
        for name in FLAGS_FIRST:
            bad = ["nope"] if name == "bridge.py" else PROGRAMS[name].bad[0][1]
            cases += [(name, ["--help"]), (name, bad)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            processes = list(pool.map(lambda case: imported_in_a_process(*case), cases))
        for (name, argv), (code, stdout, stderr, modules) in zip(cases, processes):
            with self.subTest(program=name, argv=argv):
                self.assertIn("lab.io", modules)  # the import lines were read
                self.assertEqual([module for module in HEAVY if module in modules], [])
                main = __import__("bridge").main if name == "bridge.py" else PROGRAMS[name].main
                self.assertEqual((code, stdout, stderr), run_main(main, argv))
                self.assertEqual(code, 0 if argv == ["--help"] else 2)
                self.assertEqual(len(stderr.splitlines()), 0 if code == 0 else 1, stderr)

    def test_every_bad_flag_is_refused_by_parse_which_runs_before_the_heavy_imports(self):
        for name in FLAGS_FIRST[:-1]:
            # make_docs.py and library_map.py import nothing heavy before main() has parsed: their main;
            # experiments.py imports the atlas in main(), after its parse
            parse = getattr(sys.modules[PROGRAMS[name].main.__module__], "parse", PROGRAMS[name].main)
            for flag, argv in PROGRAMS[name].bad:
                with self.subTest(program=name, argv=argv), tempfile.TemporaryDirectory(dir=MEMORY_FOLDER) as tmp:
                    extra = ["--output", os.path.join(tmp, "never")] if (
                        PROGRAMS[name].output != "none" and "--output" not in argv) else []
                    code, stdout, stderr = run_main(parse, argv + extra)
                    self.assertEqual((code, stdout), (2, ""))
                    self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                    self.assertIn(flag, stderr)

    @unittest.skipUnless(os.path.exists("/dev/full"), "needs /dev/full")
    def test_help_into_a_full_stdout_in_a_process_is_one_line_and_status_1(self):
        with open("/dev/full", "w") as full:
            code, _, stderr, modules = imported_in_a_process("rl_lab.py", ["--help"], stdout=full)
        self.assertEqual(code, 1)
        self.assertEqual(stderr, "rl_lab.py: error: cannot write to standard output: No space left on device\n")
        self.assertNotIn("torch", modules)


class TorchFreeNames(unittest.TestCase):
    """The names a program's flags take from a module that imports torch are declared without it: each
    declaration equals its source."""

    def test_course_names_every_chapter_and_figure_as_plot_course_draws_them(self):
        self.assertEqual(list(course.CHAPTER_FIGURES), list(course.CHAPTERS))
        self.assertEqual(course.CHAPTER_FIGURES, {chapter: tuple(figures)
                                                  for chapter, figures in plot_course.FIGURES.items()})

    def test_exercises_names_every_atom_in_the_courses_order(self):
        self.assertEqual(exercises.ATOMS, tuple(exercise_cases.BY_NAME))

    def test_online_settings_names_what_the_torch_modules_define(self):
        declared = online_settings
        self.assertEqual(declared.POLICIES, tuple(policies.POLICIES))
        self.assertEqual(declared.TASKS, tuple(tasks.TASKS))
        self.assertEqual(declared.TASK_REWARDS, tasks.TASK_REWARDS)
        self.assertEqual(declared.TASK_MIN_NEW_TOKENS, tasks.TASK_MIN_NEW_TOKENS)
        self.assertEqual(declared.TASK_MIN_NEW_TOKENS["countdown"], 2 * countdown.CountdownConfig().numbers_per_prompt)
        self.assertEqual(declared.SFT_STEPS, sft.SFTConfig().steps)
        self.assertEqual(declared.VERIFIER_LOOPHOLES, countdown.LOOPHOLES)
        self.assertEqual(declared.LOSS_KL_ESTIMATORS, tuple(online_algorithms.LOSS_KL_ESTIMATORS))
        self.assertEqual(declared.RATIO_CORRECTED_KL, online_algorithms.RATIO_CORRECTED_KL)
        for name in ("REDUCTIONS", "ROLLOUT_LEVELS", "ROLLOUT_MODES", "SAPO_MIN_TAU"):
            self.assertEqual(getattr(declared, name), getattr(rl_lab, name), name)
        self.assertEqual(online_tokens.FOUR_ALGORITHMS, rl_lab.ALGORITHMS)  # --algorithm all: the bandit's four


if __name__ == "__main__":
    unittest.main()
