"""Tests of plot_results.py: every kind of figure, deterministic SVG, bad and extreme inputs, and that
the plotter never imports torch.

    python -m unittest -v test_plot_results
"""

import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

from lab import io as lab_io
import matplotlib.colors
import online_tokens
import plot_results
import ppo_chain
import rl_lab
from lab.testing import HERE, run_main

# ---------------------------------------------------------------------------------------------
# Figures (plot_results.py) and the committed reference results
# ---------------------------------------------------------------------------------------------


def write_csv(path, header, rows):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(",".join(header) + "\n")
        for row in rows:
            handle.write(",".join(str(value) for value in row) + "\n")


FEW_STEPS = 3  # the figures are about labels, layout and values, not about learning: tiny runs are enough


def write_bandit(folder, algorithm, **options):
    """A short rl_lab run written as rl_lab.py writes it: <algorithm>.csv and .json. Returns the rows."""
    rows, settings = rl_lab.train(algorithm, steps=FEW_STEPS, **options)
    columns = rl_lab.DPO_COLUMNS if algorithm == "dpo" else rl_lab.COLUMNS
    lab_io.write_files({
        os.path.join(folder, f"{algorithm}.csv"): lab_io.csv_text(rows, columns),
        os.path.join(folder, f"{algorithm}.json"): lab_io.json_text({"settings": settings, "initial": rows[0],
                                                                     "final": rows[-1]}),
    })
    return rows


def write_chain(folder, **options):
    rows, report = ppo_chain.train(steps=FEW_STEPS, **options)
    lab_io.write_files({os.path.join(folder, "ppo-chain.csv"): lab_io.csv_text(rows, ppo_chain.COLUMNS),
                        os.path.join(folder, "ppo-chain.json"): lab_io.json_text(report)})
    return rows


def write_online(folder, **options):
    rows, report = online_tokens.train(steps=FEW_STEPS, **options)
    lab_io.write_files({os.path.join(folder, "online.csv"): lab_io.csv_text(rows, online_tokens.COLUMNS),
                        os.path.join(folder, "online.json"): lab_io.json_text(report)})
    return rows


def write_online_all(folder):
    """What `online_tokens.py --algorithm all` writes: <algorithm>/online.{csv,json} and comparison.csv.
    Returns {algorithm: rows}."""
    runs = {name: write_online(os.path.join(folder, name), algorithm=name) for name in online_tokens.FOUR_ALGORITHMS}
    comparison = [online_tokens.comparison_row(name, rows) for name, rows in runs.items()]
    lab_io.write_files({os.path.join(folder, "comparison.csv"):
                        lab_io.csv_text(comparison, online_tokens.COMPARISON_COLUMNS)})
    return runs


_SHARED = {}  # what several tests inspect, made once per test process: the fresh four-algorithm folder, the renders


def tearDownModule():
    if "folder" in _SHARED:
        _SHARED["folder"].cleanup()


def shared_online_all():
    """(folder, {algorithm: rows}) of one write_online_all into a folder named all, written once per test process
    for the tests that only read it."""
    if "online-all" not in _SHARED:
        _SHARED["folder"] = tempfile.TemporaryDirectory()
        folder = os.path.join(_SHARED["folder"].name, "all")
        _SHARED["online-all"] = folder, write_online_all(folder)
    return _SHARED["online-all"]


ONLINE_RUNS = ({}, {"reduction": "token"}, {"algorithm": "cispo"}, {"algorithm": "gspo"}, {"algorithm": "sapo"},
               {"advantage": "rloo"})  # six online runs in one figure: a long legend


def shared_online_runs():
    """[folder] of one write_online per options of ONLINE_RUNS, written once per test process."""
    if "online" not in _SHARED:
        root = os.path.dirname(shared_online_all()[0])
        _SHARED["online"] = [os.path.join(root, f"run{index}") for index in range(len(ONLINE_RUNS))]
        for folder, options in zip(_SHARED["online"], ONLINE_RUNS):
            write_online(folder, **options)
    return _SHARED["online"]


def shared_render(inputs, extension=".svg"):
    """(kind, Figure, bytes) of the figure for `inputs` written as .svg or .png by figure_bytes, drawn once per
    test process (a figure takes 0.4-1 s to draw) and shared by the tests that inspect it: its artists keep the
    layout of that drawing, so a test reads them (window extents with figure.canvas.get_renderer()) instead of
    drawing again. The Figure is closed: never drawn or changed by a test."""
    key = (tuple(inputs), extension)
    if key not in _SHARED:
        kind, figure = plot_results.figure_for(list(inputs))
        _SHARED[key] = kind, figure, plot_results.figure_bytes(figure, extension)
    return _SHARED[key]


def data_lines(axis):
    """The lines of the runs (reference lines and markers have no legend label)."""
    return [line for line in axis.get_lines() if not line.get_label().startswith("_")]


def reference_labels(axis):
    """{tick label text: value} of the labels written on the right edge of `axis` beside its reference lines."""
    labels = {}
    for child in axis.child_axes:
        for value, text in zip(child.yaxis.get_ticklocs(), child.yaxis.get_ticklabels()):
            labels[text.get_text()] = value
    return labels


class Plotter(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # a fresh interpreter that imports the plotter with no writable home, started now: it draws beside the
        # class's first tests instead of before its own
        cls.home_tmp = tempfile.TemporaryDirectory()
        with open(os.path.join(cls.home_tmp.name, "a-file"), "w", encoding="utf-8") as handle:
            handle.write("not a folder\n")
        # no folder can be made under a file, even by root: matplotlib falls back to a temporary one
        environment = {key: value for key, value in os.environ.items() if not key.startswith(("XDG_", "MPL"))}
        environment["HOME"] = os.path.join(cls.home_tmp.name, "a-file", "home")
        cls.home_svg = os.path.join(cls.home_tmp.name, "chain.svg")
        script = (
            "import sys, plot_results; "
            f"code = plot_results.main(['--input', {os.path.join(HERE, 'results-chain')!r}, '--output', "
            f"{cls.home_svg!r}]); print(code, 'torch' in sys.modules)"
        )
        cls.homeless = subprocess.Popen([sys.executable, "-B", "-c", script], stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=HERE, env=environment)

    @classmethod
    def tearDownClass(cls):
        if cls.homeless.poll() is None:
            cls.homeless.kill()
        cls.homeless.communicate()
        cls.home_tmp.cleanup()

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def test_renders_every_kind_and_the_svg_is_deterministic(self):
        chain = [os.path.join(HERE, "results-chain")]
        cases = [
            ("bandit", [os.path.join(HERE, "results")],
             ["PPO", "DPO", "GRPO", "CISPO", "optimum 1", "uniform start 1/3"]),
            ("tokens", [os.path.join(HERE, "results-tokens.json")], ["GRPO", "global token", "0.010463"]),
            # labelled by their settings (the algorithm), never by the folder names (run0 ... run5)
            ("online", shared_online_runs(), ["GRPO", "CISPO", "GSPO", "SAPO", "advantage=rloo", "start 0.0535"]),
            # a fresh run's files, a legend outside, reference labels
            ("online-all", [shared_online_all()[0]], ["PPO", "DPO", "GRPO", "CISPO", "target 0.9", "sampled tokens"]),
        ]
        # each kind drawn once for the process (the tests of its artists inspect the same Figure); the chain as a
        # PNG too: the format follows the extension (one kind is enough: the same code path)
        self.assertEqual(shared_render(chain, ".png")[2][:8], b"\x89PNG\r\n\x1a\n")
        for kind, inputs, texts in cases + [("chain", chain, ["Expected return", "V(start)", "gae_lambda=0.95"])]:
            with self.subTest(kind=kind):
                if kind == "chain":  # the chain's SVG as main wrote it into a long file name
                    drawn, svg = plot_results.detect_kind(chain[0]), self.long_name_chain()
                else:
                    drawn, _, svg = shared_render(inputs)
                self.assertEqual(drawn, kind)
                self.assertTrue(svg.startswith(b"<?xml"))
                missing = [text for text in texts if text.encode() not in svg]
                self.assertEqual(missing, [])
        # the committed online runs too, labelled GRPO and CISPO (built, not drawn: the six runs above are)
        kind, figure = plot_results.figure_for([os.path.join(HERE, "results-online-grpo-sequence"),
                                                os.path.join(HERE, "results-online-cispo-sequence")])
        self.addCleanup(plot_results.plt.close, figure)
        labels = [line.get_label() for line in data_lines(figure.axes[0])]
        self.assertEqual((kind, labels), ("online", ["GRPO", "CISPO"]))
        self.assertIn("start 0.0535", reference_labels(figure.axes[0]))
        # the SVG's ids and metadata come from one writer, figure_bytes, whatever the kind: the chain drawn by
        # a fresh interpreter (with no writable home) gives the bytes main wrote in this process
        self.homeless_finished()
        with open(self.home_svg, "rb") as handle:
            self.assertTrue(handle.read() == self.long_name_chain(), "two renders of the same input differ")

    def long_name_chain(self):
        """The bytes of the chain's figure written by main() into a long file name in a missing folder (created,
        as the drivers do), once per class."""
        if not hasattr(type(self), "long_name_svg"):
            long_name = os.path.join(self.home_tmp.name, "new", "y" * 240 + ".svg")
            chain = os.path.join(HERE, "results-chain")
            self.assertEqual(run_main(plot_results.main, ["--input", chain, "--output", long_name])[0], 0)
            with open(long_name, "rb") as handle:
                type(self).long_name_svg = handle.read()
        return self.long_name_svg

    def homeless_finished(self):
        """(stdout, stderr) of the fresh interpreter started by setUpClass, once it has ended."""
        if not hasattr(type(self), "homeless_output"):
            type(self).homeless_output = self.homeless.communicate(timeout=120)
        return self.homeless_output

    def test_y_range_follows_the_data_for_a_reversed_dpo_run(self):
        out = self.path("flipped")
        rows, _ = rl_lab.train("dpo", seed=7, preference_flips=12)
        lab_io.write_files({os.path.join(out, "dpo.csv"): lab_io.csv_text(rows, rl_lab.DPO_COLUMNS)})
        figure = plot_results.plot_bandit(out)
        try:
            low, high = figure.axes[0].get_ylim()
            self.assertLess(low, rows[-1]["expected_reward"])  # about -0.496 stays inside the panel
            self.assertGreater(high, 1.0)
            self.assertEqual([line.get_label() for line in figure.axes[0].get_lines()][0], "DPO")
        finally:
            plot_results.plt.close(figure)

    def test_bad_inputs_give_one_line_naming_the_file(self):
        header = ["step", "expected_reward", "best_action_probability", "kl_reference", "loss"]
        os.makedirs(self.path("empty"))
        write_csv(self.path("empty", "ppo.csv"), header, [])
        os.makedirs(self.path("nan"))
        write_csv(self.path("nan", "grpo.csv"), header, [[0, 0.2, 0.3, 0.0, 0.0], [1, "nan", 0.3, 0.0, 0.1]])
        os.makedirs(self.path("steps"))
        write_csv(self.path("steps", "dpo.csv"), header, [[0, 0.2, 0.3, 0.0, 0.0], [0, 0.3, 0.3, 0.0, 0.1]])
        os.makedirs(self.path("nothing"))
        with open(self.path("broken.json"), "w") as handle:
            handle.write("{not json")
        cases = [
            (self.path("missing"), 2, "argument --input: "),  # a path that is not there: a wrong flag
            (self.path("empty"), 1, "no data rows"),
            (self.path("nan"), 1, "not finite"),
            (self.path("steps"), 1, "does not increase"),
            (self.path("nothing"), 1, "no lab output found"),
            (self.path("broken.json"), 1, "not valid JSON"),
        ]
        for path, status, text in cases:
            with self.subTest(path=os.path.basename(path)):
                code, stdout, stderr = run_main(plot_results.main, ["--input", path, "--output", self.path("f.svg")])
                self.assertEqual(code, status)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn(text, stderr)
                self.assertIn(os.path.basename(path), stderr)
                self.assertFalse(os.path.exists(self.path("f.svg")))
        code, _, stderr = run_main(plot_results.main, ["--input", os.path.join(HERE, "results"), "--output",
                                                       self.path("f.pdf")])
        self.assertEqual(code, 2)
        self.assertIn("--output", stderr)
        with open(self.path("a-file"), "w") as handle:
            handle.write("keep\n")
        for target, text in ((self.path("a-file", "f.svg"), "not a folder"), (self.path("missing"), ".svg or .png")):
            code, _, stderr = run_main(plot_results.main, ["--input", os.path.join(HERE, "results-chain"), "--output",
                                                           target])
            self.assertEqual(code, 2)
            self.assertEqual(len(stderr.strip().splitlines()), 1)
            self.assertIn(text, stderr)
        # a missing output folder is created, as the drivers do: test_extreme_inputs_and_outputs_give_one_line
        # writes its long name into one

    def test_extreme_inputs_and_outputs_give_one_line(self):
        os.makedirs(self.path("big"))
        write_csv(self.path("big", "ppo-chain.csv"), ["step", "expected_return", "left_probability", "value_start"],
                  [[0, 1e308, 0.5, 0], [1, -1e308, 0.5, 0]])
        with open(self.path("huge.json"), "w") as handle:
            handle.write('{"dpo": {"initial_loss": ' + "1" * 401 + ', "final_loss": 1, "gradient_norm": 1}}')
        with open(self.path("deep.json"), "w") as handle:
            handle.write("[" * 100000 + "]" * 100000)
        cases = [
            (["--input", self.path("big")], 1, "cannot be drawn"),
            (["--input", self.path("huge.json")], 1, "not a finite number"),
            (["--input", self.path("deep.json")], 1, "not valid JSON"),
            (["--input", "a\nb"], 2, "no such file"),
        ]
        out = self.path("never", "made", "f.svg")
        for argv, status, text in cases:
            with self.subTest(argv=argv[1][-12:]):
                code, _, stderr = run_main(plot_results.main, argv + ["--output", out])
                self.assertEqual(code, status)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn(text, stderr)
                self.assertFalse(os.path.exists(self.path("never")))  # a bad input creates no folder
        chain = os.path.join(HERE, "results-chain")
        self.assertTrue(self.long_name_chain().startswith(b"<?xml"))  # a long name, in a missing folder
        code, _, stderr = run_main(plot_results.main, ["--input", chain, "--output", self.path("z" * 300 + ".svg")])
        self.assertEqual((code, "longer than" in stderr), (2, True))

    def test_plotter_never_imports_torch_and_stays_quiet_without_a_writable_home(self):
        stdout, stderr = self.homeless_finished()
        self.assertEqual(stdout.split()[-2:], ["0", "False"], stderr)
        self.assertEqual(stderr, "")
        self.assertTrue(os.path.exists(self.home_svg))

    def test_a_garbled_experiment_folder_is_one_line_naming_the_file(self):
        source = os.path.join(HERE, "results-experiments", "kl-estimators")
        cases = [("summary.csv", "configuration,seeds\n", "no data rows"),
                 ("settings.json", '{"experiment": "x", "metrics": ["nope"]}', "nope_mean is missing"),
                 ("settings.json", '{"experiment": "x", "figure": 5}', "'figure' must be an object")]
        for name, text, expected in cases:
            with self.subTest(file=name, expected=expected):
                stderr = self.plot_with_one_file_replaced(source, name, text, f"garbled-{len(expected)}")
                self.assertIn(expected, stderr)
                self.assertIn(name if name != "settings.json" or "nope" not in text else "summary.csv", stderr)

    def plot_with_one_file_replaced(self, source, name, text, folder_name):
        """Copy an experiment folder, replace one of its files with `text`, plot it: the one line of stderr
        (after checking the status 1 and that it is one line)."""
        import shutil

        folder = self.path(folder_name)
        shutil.copytree(source, folder)
        with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
            handle.write(text)
        code, _, stderr = run_main(plot_results.main, ["--input", folder, "--output", self.path("m.svg")])
        self.assertEqual(code, 1)
        self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
        return stderr

    def test_a_malformed_settings_or_a_non_number_in_curves_is_one_line_naming_the_file(self):
        source = os.path.join(HERE, "results-experiments", "zero-variance")
        with open(os.path.join(source, "settings.json"), encoding="utf-8") as handle:
            settings = json.load(handle)
        with open(os.path.join(source, "curves.csv"), encoding="utf-8", newline="") as handle:
            curves = handle.read().splitlines(keepends=True)
        header = curves[0].rstrip("\n").split(",")
        column = header.index("zero_group_fraction")

        def curves_with(value):  # line 3 of curves.csv with one drawn value replaced
            cells = curves[2].rstrip("\n").split(",")
            cells[column] = value
            return "".join(curves[:2] + [",".join(cells) + "\n"] + curves[3:])

        cases = [
            ("settings.json", json.dumps({**settings, "curves": [["zero_group_fraction"]]}), "'curves' must be a list of names"),
            ("settings.json", json.dumps({**settings, "metrics": [["responses"]]}), "'metrics' must be a list of names"),
            ("settings.json", json.dumps({**settings, "figure": {"panels": ["responses"]}}),
             "'panels' must be a list of objects"),
            ("settings.json", json.dumps({**settings, "figure": {"panels": [{"kind": "pie"}]}}),
             "panel 0: 'kind' must be one of"),
            ("settings.json", json.dumps({**settings, "figure": {"panels": [{"kind": "curves", "columns": "x"}]}}),
             "panel 0: 'columns' must be a list of names"),
            ("settings.json", json.dumps({**settings, "figure": {"panels": [{"kind": "claim", "claim": 99}]}}),
             "panel 0: 'claim' must be the index of a claim"),
            ("settings.json", json.dumps({**settings, "seeds": 5}), "'seeds' must be a list"),
            ("curves.csv", curves_with("nan"), "line 3: zero_group_fraction is missing or not a finite number"),
            ("curves.csv", curves_with("inf"), "line 3: zero_group_fraction is missing or not a finite number"),
            ("curves.csv", curves_with("text"), "line 3: zero_group_fraction is missing or not a finite number"),
        ]
        for index, (name, text, expected) in enumerate(cases):
            with self.subTest(file=name, expected=expected):
                stderr = self.plot_with_one_file_replaced(source, name, text, f"malformed-{index}")
                self.assertIn(f"{name}: {expected}" if name == "settings.json" else expected, stderr)
                self.assertIn(name, stderr)
                self.assertFalse(os.path.exists(self.path("m.svg")))

    def transformer_copy(self, name, change):
        """A copy of the committed transformer run whose online.json `change(report)` edited."""
        import shutil

        folder = self.path(name)
        shutil.copytree(os.path.join(HERE, "results-online-transformer-grpo-sequence"), folder)
        with open(os.path.join(folder, "online.json"), encoding="utf-8") as handle:
            report = json.load(handle)
        change(report)
        with open(os.path.join(folder, "online.json"), "w", encoding="utf-8") as handle:
            json.dump(report, handle)  # NaN is written as NaN, as a damaged file may hold it
        return folder

    def test_a_damaged_transformer_evaluation_or_algorithm_is_one_line_naming_the_file_and_key(self):
        def evaluation(which, key, value):
            return lambda report: report["evaluation"][which].update({key: value})

        distinct = "distinct_correct_per_prompt is not a finite number >= 0"
        cases = [
            (evaluation("before", "distinct_correct_per_prompt", math.nan), f"evaluation.before.{distinct} (nan)"),
            (evaluation("after", "distinct_correct_per_prompt", -5), f"evaluation.after.{distinct} (-5)"),
            (evaluation("after", "distinct_correct_per_prompt", "6"), f"evaluation.after.{distinct} ('6')"),
            (evaluation("before", "distinct_correct_per_prompt", True), f"evaluation.before.{distinct} (True)"),
            (evaluation("before", "pass@0", 0.5), "evaluation.before.pass@0: k must be a whole number in [1, 1000000]"),
            (evaluation("after", "pass@1000001", 1.0), "evaluation.after.pass@1000001: k must be a whole number"),
            (evaluation("after", "pass@1", math.nan), "evaluation.after.pass@1 is not a probability (nan)"),
            (lambda report: report["settings"].update({"algorithm": "a" * 100_000}),
             "settings.algorithm is not an algorithm's name (expected at most 24 characters without spaces, "
             "got 100000 characters)"),
        ]
        for index, (change, expected) in enumerate(cases):
            with self.subTest(expected=expected):
                folder = self.transformer_copy(f"damaged-{index}", change)
                code, _, stderr = run_main(plot_results.main, ["--input", folder, "--output", self.path("d.svg")])
                self.assertEqual((code, len(stderr.strip().splitlines())), (1, 1), stderr)
                self.assertIn(f"{os.path.join(folder, 'online.json')}: {expected}", stderr)
                self.assertFalse(os.path.exists(self.path("d.svg")))

    def test_text_from_files_is_drawn_literally_and_only_ascii_digits_make_a_pass_at_k(self):
        # a '$' starts matplotlib's math text: "$\frac{$" cannot be parsed, "$x$" would lose its dollars
        def change(report, x):
            report["settings"]["algorithm"] = "$\\frac{$"
            report["settings"]["$x$"] = x  # a key of the settings, named in the legend where the runs differ
            report["evaluation"]["after"]["pass@\u00b2"] = 0.5  # str.isdigit is true for a superscript two
            report["evaluation"]["after"]["distinct_correct_per_prompt"] = 1e308  # finite: drawn, and quiet

        first = self.transformer_copy("dollar-1", lambda report: change(report, 1))
        second = self.transformer_copy("dollar-2", lambda report: change(report, 2))
        output = self.path("dollar.svg")
        code, _, stderr = run_main(plot_results.main, ["--input", first, second, "--output", output])
        self.assertEqual((code, stderr), (0, ""))  # not even a warning of matplotlib's layout
        with open(output, encoding="utf-8") as handle:
            svg = handle.read()
        for text in ("Online $\\FRAC{$ on a tiny transformer", "$x$=1", "$x$=2"):
            self.assertIn(text, svg)
        kind, figure = plot_results.figure_for([first])
        passk = figure.axes[1]
        self.assertEqual([list(line.get_xdata()) for line in passk.get_lines()], [[1, 4, 16, 64]] * 2)
        self.assertEqual(figure.get_suptitle(),
                         "Online \\$\\FRAC{\\$ on a tiny transformer, from its SFT start (Countdown)")
        # the atlas too: its title, source and panel titles come from settings.json
        import shutil

        folder = self.path("atlas")
        shutil.copytree(os.path.join(HERE, "results-experiments", "kl-estimators"), folder)
        with open(os.path.join(folder, "settings.json"), encoding="utf-8") as handle:
            settings = json.load(handle)
        settings.update({"summary": "costs $\\frac{$"})
        settings["figure"]["panels"][0]["title"] = "$5 panel"
        with open(os.path.join(folder, "settings.json"), "w", encoding="utf-8") as handle:
            json.dump(settings, handle)
        code, _, stderr = run_main(plot_results.main, ["--input", folder, "--output", output])
        self.assertEqual((code, stderr), (0, ""))
        with open(output, encoding="utf-8") as handle:
            svg = handle.read()
        self.assertIn("costs $\\frac{$", svg)
        self.assertIn("$5 panel", svg)

    def test_a_pipe_or_a_device_as_input_is_refused_and_creates_nothing(self):
        os.makedirs(self.path("fifo"))
        os.mkfifo(self.path("fifo", "ppo.csv"))  # reading it would block forever
        os.makedirs(self.path("zero"))
        os.symlink("/dev/zero", self.path("zero", "ppo-chain.csv"))  # reading it would never end
        for folder in ("fifo", "zero"):
            with self.subTest(input=folder):
                out = self.path("new", "figure.svg")
                code, _, stderr = run_main(plot_results.main, ["--input", self.path(folder), "--output", out])
                self.assertEqual(code, 1)
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn("not a regular file", stderr)
                self.assertFalse(os.path.exists(self.path("new")))



class PlotterLabelsAndLayout(unittest.TestCase):
    """Several runs in one figure: labels read from the settings, legends outside the data, one axes per
    token objective, the four-algorithm folder, reference lines labelled, mixed kinds refused."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def figure(self, inputs):
        kind, figure = plot_results.figure_for(inputs)
        self.addCleanup(plot_results.plt.close, figure)
        return kind, figure

    def test_setting_differences_name_what_differs_and_leave_out_the_shared_value(self):
        def grpo(**changes):
            return {"algorithm": "grpo", "seed": 7, "reduction": "sequence", "advantage": "grpo", "epsilon": 0.2,
                    "epsilon_high": None, "kl": "k3 per token, beta times it in the loss", **changes}

        cases = [
            # one of six differs: only that one names it
            ([grpo(), grpo(), grpo(reduction="token"), grpo(advantage="rloo"), grpo(), grpo()],
             ["", "", "reduction=token", "advantage=rloo", "", ""]),
            # two runs, no majority: both name their value; the sentence "kl" never labels
            ([grpo(), grpo(reduction="token", kl="k3 per token, in the reward")],
             ["reduction=sequence", "reduction=token"]),
            # epsilon_high is resolved per algorithm (5.0 is CISPO's default), epsilon is absent for CISPO
            ([grpo(), {"algorithm": "cispo", "seed": 7, "reduction": "sequence", "advantage": "grpo",
                       "epsilon_high": 5.0}], ["", ""]),
            # group sizes 2, 4, 8 of GRPO each named, although CISPO's 8 makes 8 the most common value
            ([{"algorithm": "grpo", "group_size": 2}, {"algorithm": "grpo", "group_size": 4},
              {"algorithm": "grpo", "group_size": 8}, {"algorithm": "cispo", "group_size": 8}],
             ["group_size=2", "group_size=4", "group_size=8", ""]),
            # numbers as a person writes them (the chain's JSON has no "algorithm": all runs are one algorithm)
            ([{"gae_lambda": 0.95, "seed": 7}, {"gae_lambda": 0.0, "seed": 7}, {"gae_lambda": 1.0, "seed": 7}],
             ["gae_lambda=0.95", "gae_lambda=0", "gae_lambda=1"]),
            # a setting missing from one algorithm's JSON does not apply to it (CISPO's epsilon above), but one
            # missing where another run of the same algorithm has it is an older JSON: the run with it names it
            ([{"algorithm": "grpo", "seed": 7}, {"algorithm": "grpo", "seed": 7, "reward_shift": 1.0},
              {"algorithm": "ppo", "seed": 7}], ["", "reward_shift=1", ""]),
        ]
        for settings, expected in cases:
            with self.subTest(expected=expected):
                self.assertEqual(plot_results.setting_differences(settings), expected)

    def test_several_bandit_folders_overlay_one_line_per_run_labelled_by_settings(self):
        base, flips, small_groups = self.path("base"), self.path("flips3"), self.path("g4")
        clean = write_bandit(base, "dpo")
        write_bandit(base, "grpo")
        flipped = write_bandit(flips, "dpo", preference_flips=3)
        grouped = write_bandit(small_groups, "grpo", group_size=4, grpo_prompts=32)
        kind, figure = self.figure([base, flips, small_groups])
        self.assertEqual(kind, "bandit")
        expected = {
            "DPO, preference_flips=0": clean,
            "DPO, preference_flips=3": flipped,
            "GRPO, group_size=8, online_batch_prompts=16": None,
            "GRPO, group_size=4, online_batch_prompts=32": grouped,
        }
        lines = {line.get_label(): line for line in data_lines(figure.axes[0])}
        self.assertEqual(sorted(lines), sorted(expected))
        for label, rows in expected.items():
            if rows is not None:  # each line is its own run's exact expected reward, step by step
                self.assertEqual(list(lines[label].get_xdata()), [row["step"] for row in rows])
                self.assertEqual(list(lines[label].get_ydata()), [row["expected_reward"] for row in rows])
        # runs of one algorithm: its colour family, told apart by their dashes
        self.assertNotEqual(lines["DPO, preference_flips=0"].get_linestyle(),
                            lines["DPO, preference_flips=3"].get_linestyle())
        legend = [text.get_text() for text in figure.legends[0].get_texts()]
        self.assertEqual(sorted(legend), sorted(expected))

    def test_several_chain_folders_overlay_labelled_by_gae_lambda(self):
        folders = {"gae_lambda=0.95": self.path("l95"), "gae_lambda=0": self.path("l0"),
                   "gae_lambda=1": self.path("l1")}
        rows = {label: write_chain(folder, gae_lambda=float(label.split("=")[1])) for label, folder in folders.items()}
        code, stdout, stderr = run_main(plot_results.main, ["--input", *folders.values(), "--output",
                                                            self.path("chain.svg")])
        self.assertEqual((code, stderr), (0, ""))
        _, figure = self.figure(list(folders.values()))
        for axis, column in zip(figure.axes, ("expected_return", "left_probability", "value_start")):
            lines = {line.get_label(): list(line.get_ydata()) for line in data_lines(axis)}
            self.assertEqual(lines, {label: [row[column] for row in rows[label]] for label in folders})
        with open(self.path("chain.svg"), "rb") as handle:
            svg = handle.read()
        self.assertEqual([label for label in folders if label.encode() not in svg], [])

    def test_online_runs_are_labelled_by_what_differs_and_the_start_is_marked(self):
        grpo, token, cispo = self.path("grpo"), self.path("token"), self.path("cispo")
        rows = write_online(grpo)
        write_online(token, reduction="token")
        write_online(cispo, algorithm="cispo")
        cases = [
            ([grpo, token, cispo], ["GRPO, reduction=sequence", "GRPO, reduction=token", "CISPO"]),
            ([grpo, token], ["reduction=sequence", "reduction=token"]),  # one algorithm: named in the title
            ([grpo, cispo], ["GRPO", "CISPO"]),
        ]
        for inputs, labels in cases:
            with self.subTest(labels=labels):
                kind, figure = self.figure(inputs)
                self.assertEqual(kind, "online")
                self.assertEqual([line.get_label() for line in data_lines(figure.axes[0])], labels)
        exact, sampled = figure.axes[0], figure.axes[1]
        start = rows[0]["success_probability"]
        self.assertAlmostEqual(start, (2 / 9 + 2 / 27 + 2 / 81) / 6, places=12)
        references = reference_labels(exact)
        self.assertAlmostEqual(references[f"start {start:.4f}"], start, places=12)
        self.assertEqual(references["target 0.9"], 0.9)
        # the exact probability is drawn from the initial evaluation; the sampled batch from step 1 on
        self.assertEqual(data_lines(exact)[0].get_xdata()[0], 0)
        self.assertEqual(list(data_lines(sampled)[0].get_xdata()), [row["step"] for row in rows[1:]])
        self.assertEqual(list(data_lines(sampled)[0].get_ydata()), [row["success_rate"] for row in rows[1:]])

    def test_no_legend_covers_an_axes_in_the_online_and_four_algorithm_figures(self):
        for inputs in (shared_online_runs(), [shared_online_all()[0]]):
            with self.subTest(inputs=len(inputs)):
                # the figure as test_renders_every_kind_and_the_svg_is_deterministic drew it (its layout is done)
                _, figure, _ = shared_render(inputs)
                renderer = figure.canvas.get_renderer()
                legends = list(figure.legends) + [axis.get_legend() for axis in figure.axes if axis.get_legend()]
                self.assertEqual(len(legends), 1)
                box = legends[0].get_window_extent(renderer)
                self.assertEqual(len(legends[0].get_texts()), len(inputs) if len(inputs) > 1 else 4)
                for axis in figure.axes:
                    self.assertFalse(box.overlaps(axis.get_window_extent(renderer)), axis.get_title())
                self.assertTrue(figure.bbox.contains(box.x0, box.y0) and figure.bbox.contains(box.x1, box.y1))
                # the reference lines' labels (start, target, optimum) sit right of the data area, inside the figure
                success = figure.axes[0]
                labels = success.child_axes[0].yaxis.get_ticklabels()
                self.assertEqual(len(labels), 3)
                for label in labels:
                    extent = label.get_window_extent(renderer)
                    self.assertGreaterEqual(extent.x0, success.get_window_extent(renderer).x1)
                    self.assertLessEqual(extent.x1, figure.bbox.x1)

    def test_a_transformer_run_gets_its_own_figure_from_its_files(self):
        # the SFT start of the atlas's --quick runs, in their cache (test_experiments trains it there once)
        folder, sft_folder = self.path("transformer"), os.path.join(HERE, "results-sft", "quick")
        rows, report = online_tokens.train(policy="transformer", steps=2, sft_steps=20, sft_folder=sft_folder,
                                           prompts=4, group_size=4, eval_prompts=4, eval_samples=4)
        lab_io.write_files({os.path.join(folder, "online.csv"): lab_io.csv_text(rows, list(rows[0])),
                            os.path.join(folder, "online.json"): lab_io.json_text(report)})
        kind, figure = self.figure([folder])
        self.assertEqual(kind, "online")
        success, passk, entropy, lengths, kl, distinct = figure.axes[:6]
        lines = success.get_lines()  # train then test success, both from step 0
        self.assertEqual([list(line.get_ydata()) for line in lines],
                         [[row["success_probability"] for row in rows], [row["test_success_probability"] for row in rows]])
        before, after = report["evaluation"]["before"], report["evaluation"]["after"]
        self.assertEqual([list(line.get_xdata()) for line in passk.get_lines()], [[1, 4], [1, 4]])
        self.assertEqual(list(passk.get_lines()[0].get_ydata()), [before["pass@1"], before["pass@4"]])
        self.assertEqual(list(passk.get_lines()[1].get_ydata()), [after["pass@1"], after["pass@4"]])
        self.assertEqual([bar.get_height() for bar in distinct.patches],
                         [before["distinct_correct_per_prompt"], after["distinct_correct_per_prompt"]])
        self.assertEqual(list(entropy.get_lines()[0].get_xdata()), [1, 2])  # row 0 samples nothing
        with self.assertRaisesRegex(plot_results.PlotInputError, "one policy"):
            write_online(self.path("table"))
            self.figure([folder, self.path("table")])

    def test_each_token_objective_has_its_own_axes_and_readable_values(self):
        report_path = os.path.join(HERE, "results-tokens.json")
        with open(report_path, encoding="utf-8") as handle:
            report = json.load(handle)
        _, figure = self.figure([report_path])
        loss_axes = {axis.get_title().split()[0]: axis for axis in figure.axes if " loss: change" in axis.get_title()}
        self.assertEqual(sorted(loss_axes), ["CISPO", "DPO", "GRPO"])
        for name, axis in loss_axes.items():
            section = report[name.lower()]
            before, after = axis.collections[:2]  # the two points, before at x 0 and after at x 1
            self.assertEqual([list(before.get_offsets()[0]), list(after.get_offsets()[0])],
                             [[0, section["initial_loss"]], [1, section["final_loss"]]])
            # before light and hatched, after solid in the objective's colour: the ticks say which is which
            self.assertEqual((before.get_hatch(), after.get_hatch()), ("////", None))
            color = plot_results.COLORS[name.lower()]
            self.assertEqual(matplotlib.colors.to_hex(after.get_facecolor()[0]), color)
            self.assertEqual(matplotlib.colors.to_hex(before.get_edgecolor()[0]), color)
            self.assertNotEqual(matplotlib.colors.to_hex(before.get_facecolor()[0]), color)
            self.assertEqual([tick.get_text().split("\n")[0] for tick in axis.get_xticklabels()],
                             ["before", "after one SGD step"])
            # on its own axis the change fills more than half the height: neither GRPO's -0.017 nor DPO's
            # -0.025 next to its 0.69 is lost
            low, high = axis.get_ylim()
            self.assertGreater(abs(section["final_loss"] - section["initial_loss"]) / (high - low), 0.5)
            values = [text for text in axis.texts if text.get_text()]
            self.assertEqual([text.get_text() for text in values],
                             [f"{section['initial_loss']:.6f}", f"{section['final_loss']:.6f}"])
            self.assertTrue(all(text.get_fontsize() >= 9 for text in values))
        self.assertEqual(loss_axes["GRPO"].get_title(), "GRPO loss: change -0.017285")
        self.assertEqual(len({id(axis) for axis in loss_axes.values()}), 3)

    def test_four_algorithm_folder_is_detected_and_drawn_against_sampled_tokens(self):
        folder, runs = shared_online_all()
        self.assertEqual(plot_results.detect_kind(folder), "online-all")
        self.assertEqual(plot_results.detect_kind(os.path.join(folder, "grpo")), "online")
        kind, figure, _ = shared_render([folder])
        self.assertEqual(kind, "online-all")
        success, kl, failure = figure.axes[:3]
        lines = data_lines(success)
        self.assertEqual([line.get_label().split(":")[0] for line in lines], ["PPO", "DPO", "GRPO", "CISPO"])
        for line, (name, rows) in zip(lines, runs.items()):
            self.assertEqual(matplotlib.colors.to_hex(line.get_color()), plot_results.COLORS[name])
            self.assertEqual(list(line.get_xdata()), [row["total_tokens_sampled"] for row in rows])
            self.assertEqual(list(line.get_ydata()), [row["success_probability"] for row in rows])
        for line, rows in zip(data_lines(kl), runs.values()):
            self.assertEqual(list(line.get_ydata()), [row["kl_reference"] for row in rows])
        for line, rows in zip(data_lines(failure), runs.values()):  # 1 - p on a log axis, every row (p < 1)
            self.assertEqual(list(line.get_xdata()), [row["total_tokens_sampled"] for row in rows])
            self.assertEqual(list(line.get_ydata()), [1.0 - row["success_probability"] for row in rows])
        self.assertEqual(failure.get_yscale(), "log")
        self.assertEqual(success.get_xlabel(), "sampled tokens (total so far)")
        references = reference_labels(success)
        self.assertEqual(references["target 0.9"], 0.9)
        self.assertIn("start 0.0535", references)

    def test_every_reference_line_is_labelled(self):
        _, figure = self.figure([os.path.join(HERE, "results")])
        reward, reward_gap, kl, probability, probability_gap, loss = figure.axes[:6]
        self.assertEqual(reference_labels(reward), {"optimum 1": 1.0, "uniform start 0.233": (1.0 + 0.2 - 0.5) / 3})
        self.assertEqual(reference_labels(probability), {"always best 1": 1.0, "uniform start 1/3": 1 / 3})
        self.assertEqual(list(reference_labels(kl).values()), [math.log(3.0)])
        self.assertEqual(reference_labels(loss), {})
        # every dashed reference line has its label: the lines drawn across the panel are the labelled values
        for axis in (reward, probability, kl):
            across = sorted(line.get_ydata()[0] for line in axis.get_lines() if line.get_label().startswith("_"))
            self.assertEqual(across, sorted(reference_labels(axis).values()))
        # a run below the uniform start (all DPO labels reversed) also gets the worst reward marked
        rows, settings = rl_lab.train("dpo", steps=FEW_STEPS, preference_flips=12)
        lab_io.write_files({self.path("flipped", "dpo.csv"): lab_io.csv_text(rows, rl_lab.DPO_COLUMNS)})
        _, figure = self.figure([self.path("flipped")])
        self.assertEqual(reference_labels(figure.axes[0])["worst -0.5"], -0.5)

    def test_mixed_kinds_repeated_inputs_and_several_token_reports_are_refused_with_one_line(self):
        write_chain(self.path("chain"))
        write_bandit(self.path("bandit"), "grpo")
        write_online(self.path("online"))
        every = shared_online_all()[0]  # a folder named all
        tokens = os.path.join(HERE, "results-tokens.json")
        cases = [
            ([self.path("bandit"), self.path("chain")], "chain", "one kind"),
            ([self.path("online"), every], "all", "one kind"),
            ([every, tokens], "results-tokens.json", "one kind"),
            ([self.path("chain"), self.path("chain")], "chain", "given twice"),
            ([tokens, self.path("copy.json")], "copy.json", "one token report"),
        ]
        with open(tokens, encoding="utf-8") as source, open(self.path("copy.json"), "w", encoding="utf-8") as copy:
            copy.write(source.read())
        out = self.path("never", "f.svg")
        for inputs, name, text in cases:
            with self.subTest(text=text, name=name):
                code, stdout, stderr = run_main(plot_results.main, ["--input", *inputs, "--output", out])
                self.assertEqual((code, stdout), (1, ""))
                self.assertEqual(len(stderr.strip().splitlines()), 1, stderr)
                self.assertIn(text, stderr)
                self.assertIn(name, stderr.split(":")[2])  # the file is named first, right after "error:"
                self.assertFalse(os.path.exists(self.path("never")))


def csv_rows(path):
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


class FiguresSayWhatTheyShow(unittest.TestCase):
    """Each committed figure names its statistics, labels its strips and legends in words, and shows the
    number its table quotes."""

    def figure(self, inputs):
        _, figure = plot_results.figure_for(inputs)
        self.addCleanup(plot_results.plt.close, figure)
        return figure

    def experiment(self, name):
        return self.figure([os.path.join(HERE, "results-experiments", name)])

    def test_configuration_labels_read_as_words(self):
        texts = plot_results.configuration_texts([{"group_size": 8.0, "dynamic_sampling": "False"},
                                                 {"loss": "grpo", "epsilon_high": 0.28, "updates_per_batch": 2.0},
                                                 {"reduction": "sequence", "overlong": "False"},
                                                 {"a_new_key": "x"}])
        self.assertEqual(texts, [["group size 8", "static sampling"], ["GRPO", "ε_high 0.28", "2 updates per batch"],
                                 ["sequence mean"], ["a new key x"]])
        self.assertEqual(plot_results.differing_keys([{"a": 1.0, "b": "x"}, {"a": 2.0, "b": "x"}]), ["a"])

    def test_every_experiment_legend_is_words_under_a_key_of_its_statistics(self):
        for name in ("zero-variance", "clip-higher", "four-algorithms", "reduction-length-bias"):
            with self.subTest(experiment=name):
                figure = self.experiment(name)
                legend = figure.legends[0]
                labels = [text.get_text() for text in legend.get_texts()]
                self.assertTrue(labels)
                for label in labels:  # no "group_size=8 dynamic_sampling=False"
                    self.assertNotIn("=", label)
                    self.assertNotIn("_", label.replace("ε_high", ""))
                key = legend.get_title().get_text().replace("\n", " ")
                self.assertRegex(key, r"^\d+ seeds \(\d+-\d+\)\. ")
                with open(os.path.join(HERE, "results-experiments", name, "settings.json"), encoding="utf-8") as handle:
                    kinds = {panel["kind"] for panel in plot_results._panels_of(json.load(handle))}
                for kind, words in (("curves", "band = their middle 80%"), ("values", "whisker = min-max"),
                                    ("sweep", "sweeps: line = mean"), ("claim", "95% interval")):
                    self.assertEqual(words in key, kind in kinds, (kind, key))
                self.assertLessEqual(figure.get_suptitle().count("\n"), 1)  # at most two lines

    def test_strips_have_their_configuration_and_mean_under_them_and_a_fitted_axis(self):
        folder = os.path.join(HERE, "results-experiments", "clip-higher")
        runs = csv_rows(os.path.join(folder, "runs.csv"))
        stuck = self.experiment("clip-higher").axes[0]
        ticks = [tick.get_text() for tick in stuck.get_xticklabels()]
        self.assertEqual(len(ticks), 6)
        first = [float(run["stuck_prompts"]) for run in runs
                 if run["configuration"] == "loss=grpo epsilon_high=0.2 updates_per_batch=8 learning_rate=0.2"]
        self.assertEqual(ticks[0].split("\n")[0], "GRPO")
        self.assertIn("8 updates", ticks[0].replace("\n", " "))
        self.assertEqual(ticks[0].split("\n")[-1], f"{sum(first) / len(first):.4g}")
        low, high = stuck.get_ylim()  # 0 and 1 stuck prompts: the axis ends just past them, not at 1.2
        self.assertTrue(-0.1 < low < 0 and 1 < high < 1.1, (low, high))
        self.assertEqual([tick for tick in stuck.get_yticks() if low <= tick <= high], [0, 1])

    def test_a_band_covers_the_middle_80_percent_of_the_seeds(self):
        # by hand: 11 values 0..10 -> the 10th and 90th percentiles 1 and 9; 5 values -> 0.4 of the way from the
        # lowest to the next (1.4) and from the highest down (4.6); one seed -> its value
        self.assertEqual(plot_results._band(list(range(11))), (1.0, 9.0))
        low, high = plot_results._band([5.0, 1.0, 3.0, 2.0, 4.0])
        self.assertAlmostEqual(low, 1.4, places=12)
        self.assertAlmostEqual(high, 4.6, places=12)
        self.assertEqual(plot_results._band([0.25]), (0.25, 0.25))
        # the committed std-scaling figure (55 seeds): the group-std run's band of hard-prompt success at iteration 10
        # is its seeds' 10th to 90th percentile there, inside their min-max
        folder = os.path.join(HERE, "results-experiments", "std-scaling")
        at_10 = [float(row["hard_success"]) for row in csv_rows(os.path.join(folder, "curves.csv"))
                 if row["configuration"] == "scale_rewards=group beta=0.02" and row["step"] == "10"]
        self.assertEqual(len(at_10), 55)
        axis = self.experiment("std-scaling").axes[0]
        line = axis.get_lines()[0]  # the first configuration's mean: the group std's, as its value says
        self.assertAlmostEqual(line.get_ydata()[list(line.get_xdata()).index(10)], sum(at_10) / 55, places=9)
        band = axis.collections[0]
        self.assertEqual(tuple(band.get_facecolor()[0][:3]), plot_results.to_rgb(line.get_color()))
        edge = band.get_paths()[0].vertices
        ys = sorted(y for x, y in edge if abs(x - 10) < 1e-9)
        expected = plot_results.np.percentile(at_10, [10, 90])
        self.assertAlmostEqual(ys[0], expected[0], places=9)
        self.assertAlmostEqual(ys[-1], expected[1], places=9)
        self.assertGreater(ys[0], min(at_10))
        self.assertLess(ys[-1], max(at_10))

    def test_a_never_reached_count_is_written_inside_its_sweep_panel(self):
        # updates-per-batch at 8 updates: 13 to 33 of 50 runs never reach 0.9, labelled above their highest seed
        figure = self.experiment("updates-per-batch")
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        sweep = next(axis for axis in figure.axes if axis.get_title() == "iterations to exact success 0.9")
        labels = [text for text in sweep.texts if text.get_text().endswith(" never")]
        self.assertGreaterEqual(len(labels), 3)
        frame = sweep.get_window_extent(renderer)
        for label in labels:
            box = label.get_window_extent(renderer)
            self.assertLessEqual(box.y1, frame.y1, label.get_text())  # not over the top edge or the title

    def test_passk_narrowing_shows_the_sft_start_beside_the_distinct_answers_after_rl(self):
        folder = os.path.join(HERE, "results-experiments", "passk-narrowing")
        runs = csv_rows(os.path.join(folder, "runs.csv"))
        distinct = self.experiment("passk-narrowing").axes[3]
        ticks = [tick.get_text() for tick in distinct.get_xticklabels()]
        self.assertEqual(len(ticks), 4)  # before and after, for each beta
        for tick, (beta, when) in zip(ticks, [("0.02", "before"), ("0.02", "after"), ("0.2", "before"),
                                              ("0.2", "after")]):  # per configuration, its two metrics
            values = [float(run[f"test_distinct_correct_per_prompt_{when}"]) for run in runs
                      if run["configuration"] == f"beta={beta}"]
            self.assertIn(f"{sum(values) / len(values):.4g}", tick)
        self.assertIn("SFT start", distinct.get_title().replace("\n", " "))

    def test_the_bandit_figure_shows_what_is_left_to_the_optimum_on_a_log_scale(self):
        figure = self.figure([os.path.join(HERE, "results")])
        gap = figure.axes[1]
        self.assertEqual(gap.get_yscale(), "log")
        rows = csv_rows(os.path.join(HERE, "results", "grpo.csv"))
        line = [line for line in gap.get_lines() if line.get_label() == "GRPO"][0]
        self.assertAlmostEqual(line.get_ydata()[-1], 1.0 - float(rows[-1]["expected_reward"]), delta=1e-12)

    def test_the_transformer_figure_prints_pass_at_k_and_names_its_lines(self):
        folder = os.path.join(HERE, "results-online-transformer-grpo-sequence")
        with open(os.path.join(folder, "online.json"), encoding="utf-8") as handle:
            evaluation = json.load(handle)["evaluation"]
        figure = self.figure([folder])
        success, passk, _, lengths = figure.axes[:4]
        printed = [text.get_text() for text in passk.texts]
        for which in ("before", "after"):  # the drop at pass@64 (1.00 -> 0.98) is written, not only drawn
            self.assertIn(f"{evaluation[which]['pass@64']:.2f}", printed)
        self.assertEqual([text.get_text() for text in passk.get_legend().get_texts()], ["SFT start", "after RL"])
        self.assertEqual([text.get_text() for text in success.texts], ["train prompts", "test prompts"])
        self.assertEqual([text.get_text() for text in lengths.texts], ["correct", "wrong"])


if __name__ == "__main__":
    unittest.main()
