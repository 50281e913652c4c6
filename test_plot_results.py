"""Tests of plot_results.py: every kind of figure, deterministic SVG, bad and extreme inputs, and that
the plotter never imports torch.

    python -m unittest -v test_plot_results
"""

import os
import subprocess
import sys
import tempfile
import unittest

import lab_io
import plot_results
import rl_lab
from lab_testing import HERE, run_main

# ---------------------------------------------------------------------------------------------
# Figures (plot_results.py) and the committed reference results
# ---------------------------------------------------------------------------------------------


def write_csv(path, header, rows):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(",".join(header) + "\n")
        for row in rows:
            handle.write(",".join(str(value) for value in row) + "\n")


class Plotter(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def test_renders_every_kind_and_the_svg_is_deterministic(self):
        cases = [
            ("bandit", [os.path.join(HERE, "results")], ["PPO", "DPO", "GRPO", "CISPO", "optimum 1"]),
            ("chain", [os.path.join(HERE, "results-chain")], ["Expected return", "V(start)"]),
            ("tokens", [os.path.join(HERE, "results-tokens.json")], ["GRPO", "global token"]),
            ("online", [os.path.join(HERE, "results-online-grpo-sequence"),
                        os.path.join(HERE, "results-online-cispo-sequence")],
             ["results-online-grpo-sequence", "results-online-cispo-sequence"]),
        ]
        for kind, inputs, texts in cases:
            with self.subTest(kind=kind):
                first, second = self.path(f"{kind}-1.svg"), self.path(f"{kind}-2.svg")
                self.assertEqual(plot_results.render(inputs, first), kind)
                plot_results.render(inputs, second)
                with open(first, "rb") as a, open(second, "rb") as b:
                    svg = a.read()
                    self.assertEqual(svg, b.read())
                for text in texts:
                    self.assertIn(text.encode(), svg)
                png = self.path(f"{kind}.png")
                plot_results.render(inputs, png)
                with open(png, "rb") as handle:
                    self.assertEqual(handle.read(8), b"\x89PNG\r\n\x1a\n")

    def test_y_range_follows_the_data_for_a_reversed_dpo_run(self):
        out = self.path("flipped")
        rows, _ = rl_lab.train("dpo", seed=7, preference_flips=12)
        lab_io.write_text_atomic(os.path.join(out, "dpo.csv"), lab_io.csv_text(rows, rl_lab.DPO_COLUMNS))
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
            (self.path("missing"), 1, "no such file or folder"),
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
        # a missing output folder is created, as the drivers do
        code, _, _ = run_main(plot_results.main, ["--input", os.path.join(HERE, "results-chain"), "--output",
                                                  self.path("new", "chain.svg")])
        self.assertEqual(code, 0)
        self.assertTrue(os.path.isfile(self.path("new", "chain.svg")))

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
            (["--input", "a\nb"], 1, "no such file"),
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
        long_name = self.path("y" * 240 + ".svg")
        self.assertEqual(run_main(plot_results.main, ["--input", chain, "--output", long_name])[0], 0)
        self.assertTrue(os.path.isfile(long_name))
        code, _, stderr = run_main(plot_results.main, ["--input", chain, "--output", self.path("z" * 300 + ".svg")])
        self.assertEqual((code, "longer than" in stderr), (2, True))

    def test_plotter_never_imports_torch_and_stays_quiet_without_a_writable_home(self):
        with open(self.path("a-file"), "w", encoding="utf-8") as handle:
            handle.write("not a folder\n")
        # no folder can be made under a file, even by root: matplotlib falls back to a temporary one
        environment = {key: value for key, value in os.environ.items() if not key.startswith(("XDG_", "MPL"))}
        environment["HOME"] = self.path("a-file", "home")
        script = (
            "import sys, plot_results; "
            f"code = plot_results.main(['--input', {os.path.join(HERE, 'results-chain')!r}, '--output', "
            f"{self.path('chain.svg')!r}]); print(code, 'torch' in sys.modules)"
        )
        result = subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, cwd=HERE,
                                check=False, env=environment)
        self.assertEqual(result.stdout.split()[-2:], ["0", "False"], result.stderr)
        self.assertEqual(result.stderr, "")
        self.assertTrue(os.path.exists(self.path("chain.svg")))

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



if __name__ == "__main__":
    unittest.main()
