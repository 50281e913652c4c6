"""Redraw the lab's figures from its CSV/JSON outputs (reads files only; never imports torch).

    python plot_results.py --input results --output results/training-curves.svg
    python ppo_chain.py --gae-lambda 0 --output /tmp/chain-lambda0                  # a second chain run, to overlay
    python plot_results.py --input results-chain /tmp/chain-lambda0 --output /tmp/chain.png   # one line per folder
    python plot_results.py --input results-tokens.json --output results-tokens.svg
    python plot_results.py --input results-online-grpo-sequence results-online-cispo-sequence --output /tmp/online.png
    python plot_results.py --input results-online-all --output /tmp/online-all.png     # four algorithms, one budget
    python plot_results.py --input results-experiments/group-size --output /tmp/group-size.svg   # an experiment

The kind of input is detected from the files present (FOLDER_MARKERS): a folder with summary.csv (an
experiment of experiments.py), a folder with comparison.csv (online_tokens.py --algorithm
all: one online.csv per algorithm subfolder), a folder with online.csv (one online run; a transformer
run gets its own figure), a folder with ppo-chain.csv (two-step chain), a folder with any of
ppo/dpo/grpo/cispo.csv (bandit), or a .json file, read as a token report (token_objectives.py).
Several folders of one kind (bandit, chain, online) are overlaid, one line per run, each labelled by
the settings in which it differs from the others (read from the run's JSON); an experiment folder and
a token report are drawn one at a time; inputs of different kinds are refused. The format follows the
--output extension: .svg (deterministic bytes) or .png.

A new kind is one function `plot_<kind>(inputs) -> Figure` (inputs: the list of paths) registered in
PLOTTERS, plus the file that marks its folders in FOLDER_MARKERS.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import io
import json
import logging
import math
import os
import re
import sys
import textwrap
import warnings

from lab.io import (
    MAX_INPUT_BYTES,
    OneLineErrorParser,
    flags_first,
    input_file_problem,
    one_line,
    output_file_problem,
    run_cli,
    write_files,
)

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before matplotlib is loaded
# ---------------------------------------------------------------------------------------------

FORMATS = (".svg", ".png")


def output_problem(output):
    """A one-line reason why `output` cannot be a figure file, checked without creating anything."""
    if os.path.splitext(output)[1].lower() not in FORMATS:
        return f"expected a file name ending in .svg or .png, got {output!r}"
    return output_file_problem(output)


def build_parser():
    parser = OneLineErrorParser(
        prog="plot_results.py",
        description="Redraw figures from the lab's CSV/JSON outputs (kind detected from the files).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--input", nargs="+", default=["results"],
                        help="one or more output folders of one kind, overlaid and labelled by their settings: "
                             "bandit (results), chain (results-chain), online run, online --algorithm all, or an "
                             "experiments.py experiment folder (results-experiments/NAME); or a token report .json")
    parser.add_argument("--output", default="results/training-curves.svg",
                        help="figure file; the extension chooses the format: .svg (deterministic) or .png; "
                             "a missing folder is created")
    return parser


def parse(argv=None):
    """The flags, with the output and the inputs' presence checked before any drawing (a bad one exits 2
    with one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = output_problem(args.output)
    if problem is not None:
        parser.error(f"argument --output: {problem}")
    for path in args.input:  # a path that is not there is a wrong flag; what a file holds is checked when read
        if not os.path.lexists(path):
            parser.error(f"argument --input: {path}: no such file or folder")
    return args


if __name__ == "__main__":
    flags_first(parse)

# matplotlib after the flags: it takes half a second or more to load, --help and a bad flag none of it.
# Without a writable home, matplotlib makes itself a temporary config and cache folder (removed at exit)
# and logs a warning about it that would break the one-line stderr: that warning is silenced here.
_matplotlib_log = logging.getLogger("matplotlib")
_previous_level = _matplotlib_log.level
_matplotlib_log.setLevel(logging.ERROR)
import matplotlib

matplotlib.use("Agg")  # files only, no screen needed
import matplotlib.pyplot as plt  # the backend must be chosen first
import numpy as np  # installed with matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FormatStrFormatter, MaxNLocator, NullLocator

_matplotlib_log.setLevel(_previous_level)

from online_registry import ALGORITHMS, COLORS  # no torch: the registry names its atoms
from online_settings import TARGET_SUCCESS  # the comparison's "reached" level

BANDIT_ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")
ONLINE_ALGORITHMS = ALGORITHMS  # online_tokens.ALGORITHMS, in figure order
# one colour per algorithm in every figure (each registry entry's own); runs of one algorithm get shades of it
# and their own dashes
OTHER_COLORS = ("#7f7f7f", "#17becf", "#bcbd22", "#e377c2")  # an algorithm this list does not know yet
DASHES = ("-", "--", ":", "-.")
# rl_lab.reward_table(): the bandit's rewards R(x, a), used when a run's JSON does not give its own table
BANDIT_REWARDS = [[1.0, 0.2, -0.5], [-0.5, 1.0, 0.2], [0.2, -0.5, 1.0], [1.0, -0.5, 0.2]]
CHAIN_INITIAL_RETURN = 0.3
# Settings that online_settings.resolve sets per algorithm (epsilon 0.2 but 3e-4 for gspo, epsilon_high
# 5.0 for cispo, ...): between two algorithms their difference is the algorithm's, so they label a run only
# when runs of the same algorithm differ in them.
RESOLVED_PER_ALGORITHM = ("epsilon", "epsilon_high", "dpo_beta", "sequence_logp")
LONGEST_LABEL_VALUE = 24  # a longer setting value is a sentence describing other settings, not a label
MAX_PASS_K = 1_000_000  # sft.sample_evaluation draws at most a million samples per prompt, so k is at most that
# sizes in points, chosen to read at 100% zoom (the figures are saved at 120 dpi)
STYLE = {"font.size": 10, "axes.titlesize": 10.5, "axes.labelsize": 10, "xtick.labelsize": 9.5,
         "ytick.labelsize": 9.5, "legend.fontsize": 9.5, "figure.titlesize": 12.5, "lines.linewidth": 1.7}
VALUE_FONT_SIZE = 10  # the numbers written on bars


class PlotInputError(Exception):
    """A problem with an input file: reported as one line naming the file, exit status 1."""


# ---------------------------------------------------------------------------------------------
# Reading and checking the files
# ---------------------------------------------------------------------------------------------


def _check_input_file(path):
    """Refuse what is not a regular file of a sane size before opening it (lab_io.input_file_problem)."""
    problem = input_file_problem(path, MAX_INPUT_BYTES)
    if problem is not None:
        raise PlotInputError(f"{path}: {problem}")


def read_csv(path, required_columns):
    """Read a metrics CSV into {column: list of floats}; check columns, rows, finiteness, steps.

    Raises PlotInputError naming the file when it is not a regular file, a column is missing, there
    are no data rows, a value is not a finite number or the step column does not strictly increase.
    """
    _check_input_file(path)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            rows = list(reader)
    except OSError as error:
        raise PlotInputError(f"{path}: cannot read ({error.strerror or error})") from None
    except (UnicodeDecodeError, csv.Error) as error:
        raise PlotInputError(f"{path}: not a readable CSV ({error})") from None
    missing = [name for name in required_columns if name not in header]
    if missing:
        raise PlotInputError(f"{path}: missing column(s) {', '.join(missing)}")
    if not rows:
        raise PlotInputError(f"{path}: no data rows")
    series = {}
    for name in required_columns:
        values = []
        for line, row in enumerate(rows, start=2):
            try:
                value = float(row[name])
            except (TypeError, ValueError):
                raise PlotInputError(f"{path}: line {line}: {name} is not a number ({row[name]!r})") from None
            if not math.isfinite(value):
                raise PlotInputError(f"{path}: line {line}: {name} is not finite ({row[name]})")
            values.append(value)
        series[name] = values
    steps = series["step"]
    for line, (previous, current) in enumerate(zip(steps, steps[1:]), start=3):
        if current <= previous:
            raise PlotInputError(f"{path}: line {line}: step {current:g} does not increase (previous {previous:g})")
    return series


def read_json(path):
    _check_input_file(path)
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except OSError as error:
        raise PlotInputError(f"{path}: cannot read ({error.strerror or error})") from None
    except (ValueError, RecursionError) as error:  # RecursionError: absurdly deep nesting
        raise PlotInputError(f"{path}: not valid JSON ({type(error).__name__})") from None


def read_settings(path):
    """The "settings" object of a run's JSON, or {} when the file is absent or holds none (the labels
    then fall back to the folder). A file that exists but is not valid JSON is an error."""
    if not os.path.lexists(path):
        return {}
    report = read_json(path)
    settings = report.get("settings") if isinstance(report, dict) else None
    return settings if isinstance(settings, dict) else {}


# Which kind a folder holds: the first kind whose marker file it contains.
FOLDER_MARKERS = (
    ("experiment", ("summary.csv",)),
    ("online-all", ("comparison.csv",)),
    ("online", ("online.csv",)),
    ("chain", ("ppo-chain.csv",)),
    ("bandit", tuple(f"{algorithm}.csv" for algorithm in BANDIT_ALGORITHMS)),
    ("tokens", ("results-tokens.json",)),
)


def detect_kind(path):
    """Return the kind of an input path (a key of PLOTTERS: 'experiment', 'online-all', 'online', 'chain',
    'bandit' or 'tokens'), or raise PlotInputError."""
    if os.path.isdir(path):
        names = set(os.listdir(path))
        for kind, markers in FOLDER_MARKERS:
            if names.intersection(markers):
                return kind
        expected = ", ".join(marker for _, markers in FOLDER_MARKERS for marker in markers)
        raise PlotInputError(f"{path}: no lab output found (expected one of {expected})")
    if os.path.isfile(path) and path.endswith(".json"):
        return "tokens"
    if not os.path.exists(path):
        raise PlotInputError(f"{path}: no such file or folder")
    raise PlotInputError(f"{path}: expected an output folder or a token report .json")


# ---------------------------------------------------------------------------------------------
# Runs and their labels: one line of a figure per run
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    """One training run: where it came from, its algorithm (colour and label), its CSV columns as lists
    of floats, and its JSON settings ({} when there is no JSON)."""

    source: str
    algorithm: str
    series: dict
    settings: dict


def _is_number(value):
    """A finite int or float from a JSON file (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _label_value(value):
    """A setting's value as label text, or None when it cannot label a run (a list, a table, a sentence)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str) and value and len(value) <= LONGEST_LABEL_VALUE and not any(c.isspace() for c in value):
        return value
    return None


def _literal(text):
    """`text` as matplotlib must draw it, character for character. Text from a file or a path may hold a
    '$', which starts matplotlib's math text ('$\\frac{$' cannot even be parsed): every title, axis label,
    tick label and legend entry passes here once, where it is handed to matplotlib."""
    return str(text).replace("$", r"\$")


def _algorithm_name(path, settings, default=""):
    """settings["algorithm"] of an online run, or `default` when the JSON gives none; PlotInputError naming
    the file for a value no algorithm has (a sentence, 100,000 characters), which could not label a line."""
    name = settings.get("algorithm")
    if not isinstance(name, str) or not name:
        return default
    if _label_value(name) is None:
        raise PlotInputError(f"{path}: settings.algorithm is not an algorithm's name (expected at most "
                             f"{LONGEST_LABEL_VALUE} characters without spaces, got {len(name)} characters)")
    return name


_ABSENT = object()  # a setting missing from a run's JSON where runs of the same algorithm have it


def _most_common(values, at_least):
    """The value more runs share than any other, if at least `at_least` share it; else None."""
    counts = collections.Counter(values).most_common()
    if counts[0][1] >= at_least and (len(counts) == 1 or counts[0][1] > counts[1][1]):
        return counts[0][0]
    return None


def setting_differences(settings_list, per_algorithm=RESOLVED_PER_ALGORITHM):
    """For each run's settings, the text 'key=value, ...' of the settings in which it differs from the others.

    A setting counts only among the runs that have it (a setting that does not apply to an algorithm is
    absent from its JSON). A run leaves a setting out when its value is the one most of those runs share
    and also the one most runs of its own algorithm share: of six runs, one with reduction=token gives
    'reduction=token' for that one and nothing for the others; GRPO runs with group sizes 2, 4, 8 and 16
    each name their size even if a CISPO run also uses 8. Without such a majority (two runs, or every
    value different) each run names its value. Keys in `per_algorithm` are compared only among runs of
    the same algorithm. The key "algorithm" itself is left to the caller. Order: the keys' order in the JSON.
    """
    keys = list(dict.fromkeys(key for settings in settings_list for key in settings if key != "algorithm"))
    parts = [[] for _ in settings_list]
    for key in keys:
        # a run of an algorithm whose other runs have the key lacks it only because its JSON is older: that
        # absence is a value of its own (compared, never printed); for another algorithm it does not apply
        having = {settings.get("algorithm") for settings in settings_list if key in settings}
        scopes = collections.defaultdict(list)  # runs compared with each other: all, or one algorithm's
        for index, settings in enumerate(settings_list):
            if key in settings:
                value = _label_value(settings[key])
            else:
                value = _ABSENT if settings.get("algorithm") in having else None
            if value is not None:
                algorithm = (settings.get("algorithm"), settings.get("dpo_loss"))
                scopes[algorithm if key in per_algorithm else None].append((index, algorithm, value))
        for members in scopes.values():
            if len({value for _, _, value in members}) < 2:
                continue
            shared = _most_common([value for _, _, value in members], at_least=2)
            within = {algorithm: _most_common([v for _, a, v in members if a == algorithm], at_least=1)
                      for _, algorithm, _ in members}
            for index, algorithm, value in members:
                if value is not _ABSENT and (shared is None or value != shared or within[algorithm] != shared):
                    parts[index].append(f"{key}={value}")
    return [", ".join(texts) for texts in parts]


def run_labels(runs, algorithm_in_label="when different"):
    """A legend label per run: the algorithm (always, "when different" between runs or when nothing
    else tells the run apart, or "never"), then the settings in which the run differs from the others.
    Runs whose labels would still coincide (no JSON, the same settings) get their folder appended."""
    differences = setting_differences([run.settings for run in runs])
    several_algorithms = len({run.algorithm for run in runs}) > 1
    labels = []
    for run, difference in zip(runs, differences):
        name = run.algorithm.upper()
        show = {"always": True, "never": False}.get(algorithm_in_label, several_algorithms or not difference)
        labels.append(", ".join(part for part in (name if show else "", difference) if part)
                      or os.path.normpath(run.source))
    counts = collections.Counter(labels)
    return [f"{label} ({os.path.normpath(run.source)})" if counts[label] > 1 else label
            for label, run in zip(labels, runs)]


def _shade(color, amount):
    """`color` mixed toward black (amount < 0) or white (amount > 0) by |amount| in [0, 1]."""
    rgb = np.array(to_rgb(color))
    target = np.ones(3) if amount > 0 else np.zeros(3)
    return tuple(float(c) for c in rgb + (target - rgb) * abs(amount))


def run_styles(runs):
    """Colour and dashes per run: the algorithm's colour (COLORS); several runs of one algorithm get
    shades of it, dark to light, and their own dash pattern, so that they stay apart in grey too."""
    by_algorithm = collections.defaultdict(list)
    for index, run in enumerate(runs):
        by_algorithm[run.algorithm].append(index)
    unknown = [algorithm for algorithm in by_algorithm if algorithm not in COLORS]
    styles = [None] * len(runs)
    for algorithm, indices in by_algorithm.items():
        base = COLORS.get(algorithm) or OTHER_COLORS[unknown.index(algorithm) % len(OTHER_COLORS)]
        amounts = np.linspace(-0.4, 0.3, len(indices)) if len(indices) > 1 else [0.0]
        for rank, (index, amount) in enumerate(zip(indices, amounts)):
            dashes = DASHES[rank % len(DASHES)]
            styles[index] = {"color": _shade(base, amount), "linestyle": dashes,
                             "linewidth": STYLE["lines.linewidth"] + (0.4 if dashes != "-" else 0.0)}
    return styles


# ---------------------------------------------------------------------------------------------
# Drawing helpers shared by the figures
# ---------------------------------------------------------------------------------------------


def _as_list(inputs):
    return [inputs] if isinstance(inputs, str) else list(inputs)


def _new_figure(rows, columns, width, height):
    """A figure with its own Agg canvas (no pyplot state) and a rows x columns grid of axes."""
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False)
    return figure, list(axes.flat)


def _finish(axis, title, ylabel, xlabel="outer iteration (step)"):
    axis.set_title(_literal(title))
    axis.set_xlabel(_literal(xlabel))
    axis.set_ylabel(_literal(ylabel))
    axis.grid(True, alpha=0.3)


def _plot_runs(axis, runs, styles, labels, x_column, column, from_step=0):
    """One line per run of `column` against `x_column`, for the rows with step >= from_step (1 skips the
    initial evaluation, where the sampled-batch and loss columns hold a placeholder 0)."""
    for run, style, label in zip(runs, styles, labels):
        keep = np.asarray(run.series["step"]) >= from_step
        axis.plot(np.asarray(run.series[x_column])[keep], np.asarray(run.series[column])[keep], label=label,
                  **style)


def mark_references(axis, references):
    """Draw horizontal reference lines [(value, text), ...] and label them on the right edge of `axis`,
    outside the data area, where no curve can cross the text. Equal values are marked once."""
    shown = {}
    for value, text in references:
        shown.setdefault(round(float(value), 12), (float(value), text))
    for value, _ in shown.values():
        axis.axhline(value, color="0.35", linestyle=(0, (2, 2)), linewidth=1.0, zorder=1)
    if shown:
        right = axis.secondary_yaxis("right")
        right.set_yticks([value for value, _ in shown.values()], labels=[text for _, text in shown.values()])
        right.tick_params(axis="y", length=3, colors="0.25", labelsize=9)
    return list(shown.values())


def _legend_below(figure, axis, handles=None, labels=None, title=None):
    """The runs' legend in one block below every panel (matplotlib's 'outside' placement reserves its
    room in the layout), so it never covers a curve, however many runs there are. The entries are the
    axis's, or `handles` and `labels` when given."""
    if handles is None:
        handles, labels = axis.get_legend_handles_labels()
    if not handles:
        return None
    # as many columns as fit the figure's width at the legend's font size (about 0.55 em per character);
    # a label longer than the figure is wide is wrapped after a comma
    character_points = 0.55 * STYLE["legend.fontsize"]
    width_points = figure.get_figwidth() * 72 * 0.95
    labels = [textwrap.fill(_literal(label), max(20, int(width_points / character_points) - 12),
                            break_on_hyphens=False) for label in labels]
    longest = max(len(line) for label in labels for line in label.splitlines())
    columns = max(1, min(len(labels), int(width_points // (longest * character_points + 50)), 4))
    # matplotlib fills a legend column by column; this order makes it read row by row, in the runs' order
    rows = -(-len(labels) // columns)
    order = [row * columns + column for column in range(columns) for row in range(rows)
             if row * columns + column < len(labels)]
    if title:  # wrapped to the figure's width, as the labels are
        title = textwrap.fill(_literal(title), max(20, int(width_points / character_points) - 12))
    return figure.legend([handles[i] for i in order], [labels[i] for i in order], loc="outside lower center",
                         ncol=columns, frameon=False, title=title, title_fontsize=STYLE["legend.fontsize"])


def _fixed(value, digits, sign=False):
    """`value` with `digits` decimals (and its sign when `sign`), without a '-0.000000' for a value that
    rounds to zero."""
    text = f"{value:{'+' if sign else ''}.{digits}f}"
    return text.lstrip("+-") if float(text) == 0 else text


def _bar_values(axis, bars, values, digits):
    """Write each bar's value on it, leave room for the numbers, and draw each bar's top as a thick line in
    its colour, so that a bar of height 0 (a loss of exactly 0) is seen, not missing."""
    for bar, value in zip(bars, values):
        axis.hlines(value, bar.get_x(), bar.get_x() + bar.get_width(), colors=[bar.get_edgecolor()], linewidth=3,
                    zorder=3)
    axis.bar_label(bars, labels=[_fixed(value, digits) for value in values], fontsize=VALUE_FONT_SIZE, padding=3)
    low, high = min(0.0, *values), max(0.0, *values)
    span = (high - low) or 1.0
    # room for the numbers above (and below) the bars, and for the thick top of a bar of height 0
    axis.set_ylim(low - (0.2 if low < 0 else 0.03) * span, high + 0.2 * span)
    axis.axhline(0.0, color="black", linewidth=0.8)


# ---------------------------------------------------------------------------------------------
# The figures, one function per kind
# ---------------------------------------------------------------------------------------------


BANDIT_COLUMNS = ["step", "expected_reward", "best_action_probability", "kl_reference", "loss"]


def load_bandit_runs(folders):
    """One Run per algorithm CSV of each folder, grouped by algorithm (PPO, DPO, GRPO, CISPO), then folder."""
    runs = []
    for algorithm in BANDIT_ALGORITHMS:
        for folder in _as_list(folders):
            path = os.path.join(folder, f"{algorithm}.csv")
            if os.path.exists(path):
                series = read_csv(path, BANDIT_COLUMNS)
                runs.append(Run(folder, algorithm, series, read_settings(os.path.join(folder, f"{algorithm}.json"))))
    return runs


def reward_table_of(settings):
    """The (X, A) reward table a bandit run used, from its settings ("reward_table": the rewards after any
    --reward-shift or --sparse-rewards), or BANDIT_REWARDS when the JSON is absent or holds none."""
    table = settings.get("reward_table")
    if not (isinstance(table, list) and table and isinstance(table[0], list) and table[0]):
        return BANDIT_REWARDS
    if all(isinstance(row, list) and len(row) == len(table[0]) and all(map(_is_number, row)) for row in table):
        return [[float(v) for v in row] for row in table]
    return BANDIT_REWARDS


def _bandit_references(runs):
    """Reference lines of the bandit's panels from each run's reward table (contexts weigh equally, as in
    rl_lab.evaluate): the optimum (best action everywhere), the uniform start and, once a run falls below
    its start, the worst (worst action everywhere); probability 1/A at the start; ln A, the KL of a
    deterministic policy from the uniform reference."""
    reward, probability, kl = [], [], []
    for run in runs:
        table = reward_table_of(run.settings)
        actions = len(table[0])
        optimum = sum(max(row) for row in table) / len(table)
        start = sum(sum(row) / actions for row in table) / len(table)
        worst = sum(min(row) for row in table) / len(table)
        reward += [(optimum, f"optimum {optimum:.4g}"), (start, f"uniform start {start:.3g}")]
        if min(run.series["expected_reward"]) < start - 1e-12:
            reward.append((worst, f"worst {worst:.4g}"))
        probability += [(1.0, "always best 1"), (1 / actions, f"uniform start 1/{actions}")]
        kl.append((math.log(actions), f"ln {actions} = {math.log(actions):.3f}:\ndeterministic"))
    return reward, probability, kl


def _optimum_of(run):
    """The best expected reward of a bandit run's table (the best action in every context)."""
    table = reward_table_of(run.settings)
    return sum(max(row) for row in table) / len(table)


def _plot_gaps(axis, runs, styles, labels, gaps):
    """One line per run of gaps(run) (what is left to the optimum, > 0) on a log axis: the last digits that
    a linear axis near 1 hides, where the algorithms differ. A gap of 0 or below has no place on a log axis
    and is left out (the run reached the optimum to the float's precision)."""
    for run, style, label in zip(runs, styles, labels):
        steps, values = np.asarray(run.series["step"]), np.asarray(gaps(run))
        shown = values > 0
        axis.plot(steps[shown], values[shown], label=label, **style)
    axis.set_yscale("log")


def plot_bandit(folders):
    """One-step bandit: exact reward and best-action probability (linear, and what is left to the optimum on
    a log scale, where PPO, GRPO and CISPO part), KL to the reference and the loss per outer iteration; one
    line per algorithm of each folder."""
    runs = load_bandit_runs(folders)
    styles, labels = run_styles(runs), run_labels(runs, algorithm_in_label="always")
    reward_references, probability_references, kl_references = _bandit_references(runs)
    shapes = sorted({(len(table), len(table[0])) for table in (reward_table_of(run.settings) for run in runs)})
    figure, axes = _new_figure(2, 3, 17, 8.8)
    reward, reward_gap, kl, probability, probability_gap, loss = axes
    panels = [
        (reward, "expected_reward", 0, "Expected reward (exact)", "expected reward", reward_references),
        (probability, "best_action_probability", 0, "Best-action probability (mean over the contexts)",
         "probability", probability_references),
        (kl, "kl_reference", 0, "KL(policy ‖ uniform reference), exact", "KL (nats)", kl_references),
        (loss, "loss", 1, "Loss: each method's own objective\n(compare shapes, not levels)",
         "loss (the method's objective)", []),
    ]
    for axis, column, from_step, title, ylabel, references in panels:
        _plot_runs(axis, runs, styles, labels, "step", column, from_step)
        mark_references(axis, references)
        _finish(axis, title, ylabel)
    _plot_gaps(reward_gap, runs, styles, labels,
               lambda run: _optimum_of(run) - np.asarray(run.series["expected_reward"]))
    _finish(reward_gap, "Left to the optimum: optimum - expected reward\n(log scale: where the methods part)",
            "reward below the optimum (log scale)")
    _plot_gaps(probability_gap, runs, styles, labels,
               lambda run: 1.0 - np.asarray(run.series["best_action_probability"]))
    _finish(probability_gap, "1 - best-action probability\n(log scale)", "probability of another action (log scale)")
    _legend_below(figure, axes[0])
    shape = ", ".join(f"{contexts} contexts x {actions} actions" for contexts, actions in shapes)
    figure.suptitle(_literal(f"One-step bandit ({shape}): exact evaluation after each outer iteration\n"
                             "x is each method's own iteration, not equal data or compute"))
    return figure


def _step_ticks(last_step):
    """0, 1, 2, 5, 10, 20, 50, ... up to `last_step`: readable ticks for a log step axis."""
    ticks, decade = [0.0], 1.0
    while decade <= last_step:
        ticks.extend(t for t in (decade, 2 * decade, 5 * decade) if t <= last_step)
        decade *= 10
    return ticks


CHAIN_COLUMNS = ["step", "expected_return", "left_probability", "value_start"]


def plot_chain(folders):
    """Two-step chain, PPO + GAE: exact return, p(left | start) and the critic's V(start); one line per folder."""
    runs = [Run(folder, "ppo", read_csv(os.path.join(folder, "ppo-chain.csv"), CHAIN_COLUMNS),
                read_settings(os.path.join(folder, "ppo-chain.json"))) for folder in _as_list(folders)]
    styles, labels = run_styles(runs), run_labels(runs, algorithm_in_label="never")
    figure, axes = _new_figure(1, 3, 14, 4.9)
    panels = [
        ("expected_return", "Expected return J (exact)", "return",
         [(1.0, "optimum 1"), (CHAIN_INITIAL_RETURN, "uniform start 0.3")]),
        ("left_probability", "p(left | start): the unrewarded first step", "probability",
         [(1.0, "optimum 1"), (0.5, "start 0.5")]),
        ("value_start", "Critic V(start): learns the optimal value 1", "value (return units)",
         [(1.0, "optimal value 1"), (0.0, "start 0")]),
    ]
    last_step = max(run.series["step"][-1] for run in runs)
    for axis, (column, title, ylabel, references) in zip(axes, panels):
        _plot_runs(axis, runs, styles, labels, "step", column)
        mark_references(axis, references)
        _finish(axis, title, ylabel, "outer iteration (log scale from 1)")
        # the lambdas differ in the first ten iterations, and all end at the optimum: a log x shows both
        axis.set_xscale("symlog", linthresh=1.0, linscale=0.5)
        axis.set_xlim(0, max(last_step, 1) * 1.05)
        axis.xaxis.set_major_locator(FixedLocator(_step_ticks(last_step)))
        axis.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        axis.xaxis.set_minor_locator(NullLocator())
    if len(runs) > 1:
        _legend_below(figure, axes[0])
    lambdas = {_label_value(run.settings["gae_lambda"]) for run in runs if _is_number(run.settings.get("gae_lambda"))}
    every_run = all("gae_lambda" in run.settings for run in runs)
    shared = f" (gae_lambda={lambdas.pop()})" if len(lambdas) == 1 and every_run else ""
    figure.suptitle(_literal(f"Two-step chain, PPO + GAE{shared}: the reward arrives one step after the choice that "
                             "earns it"))
    return figure


def _finite_number(path, where, value):
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer beyond the float range
        number = math.nan
    if not math.isfinite(number):
        raise PlotInputError(f"{path}: {where} is missing or not a finite number")
    return number


def _before_after(axis, before, after, color):
    """A loss before and after one step as two points joined by an arrow, on a y range fitted to the two
    values so that the change fills the panel however small it is next to the loss itself (DPO's -0.025
    beside its 0.69). Light and hatched = before, solid = after, both in the objective's colour."""
    axis.annotate("", xy=(1, after), xytext=(0, before),
                  arrowprops={"arrowstyle": "-|>", "color": color, "linewidth": 1.6, "shrinkA": 9, "shrinkB": 9,
                              "mutation_scale": 16})
    axis.scatter([0], [before], s=160, facecolor=_shade(color, 0.7), edgecolor=color, hatch="////", linewidth=1.4,
                 zorder=3)
    axis.scatter([1], [after], s=160, color=color, zorder=3)
    for x, value, side in ((0, before, -1), (1, after, 1)):  # on white, so that the zero line does not cross them
        axis.annotate(_fixed(value, 6), (x, value), xytext=(12 * side, 0), textcoords="offset points",
                      ha="left" if side > 0 else "right", va="center", fontsize=VALUE_FONT_SIZE, zorder=4,
                      bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5})
    low, high = min(before, after), max(before, after)
    pad = 0.3 * ((high - low) or abs(high) or 1.0)
    axis.set_ylim(low - pad, high + pad)
    axis.set_xlim(-0.9, 1.9)  # room for the numbers beside the points
    if low - pad <= 0.0 <= high + pad:
        axis.axhline(0.0, color="black", linewidth=0.8, zorder=1)


def _reduction_texts(reduction):
    """The two reductions as arithmetic, '(-1 + 1)/2' and '(-2 + 3)/5', from the report's per-response
    losses and token counts; None when the report does not hold them."""
    losses, counts = reduction.get("per_response_grpo_losses"), reduction.get("token_counts")
    if not (isinstance(losses, list) and isinstance(counts, list) and len(losses) == len(counts) > 0
            and all(map(_is_number, losses + counts))):
        return None
    per_response = " + ".join(f"{loss:.4g}" for loss in losses).replace("+ -", "- ")
    token_sums = " + ".join(f"{loss * count:.4g}" for loss, count in zip(losses, counts)).replace("+ -", "- ")
    return f"({per_response})/{len(losses)}", f"({token_sums})/{sum(counts):g}"


def plot_tokens(paths):
    """Token-sequence objectives: each objective's loss before and after one step on its own axes (the
    objectives have different scales and must not be compared), the gradient norms, the two reductions."""
    paths = _as_list(paths)
    if len(paths) > 1:
        raise PlotInputError(f"{paths[1]}: one token report at a time (they are deterministic: one is the same "
                             "as another)")
    path = paths[0]
    report = read_json(path)
    objectives = [name for name in ("dpo", "grpo", "cispo")
                  if isinstance(report, dict) and isinstance(report.get(name), dict)]
    if not objectives:
        raise PlotInputError(f"{path}: not a token report (no dpo/grpo/cispo sections)")
    keys = ("initial_loss", "final_loss", "gradient_norm")
    values = {name: [_finite_number(path, f"{name}.{key}", report[name].get(key)) for key in keys]
              for name in objectives}
    reduction = report.get("reduction") if isinstance(report.get("reduction"), dict) else None
    contrast = None
    if reduction:
        contrast = [_finite_number(path, "reduction.per_response_mean", reduction.get("per_response_mean")),
                    _finite_number(path, "reduction.global_token_mean", reduction.get("global_token_mean"))]
    settings = report.get("settings") if isinstance(report.get("settings"), dict) else {}
    rate = settings.get("learning_rate")
    step_text = f"after one SGD step\n(lr {rate:g})" if isinstance(rate, (int, float)) else "after one\nSGD step"

    figure = Figure(figsize=(13, 8.4), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.add_gridspec(2, 6)
    for index, name in enumerate(objectives):
        axis = figure.add_subplot(grid[0, 2 * index:2 * index + 2])
        _before_after(axis, values[name][0], values[name][1], COLORS[name])
        axis.set_xticks([0, 1], ["before\n(initial table)", step_text])
        _finish(axis, f"{name.upper()} loss: change {_fixed(values[name][1] - values[name][0], 6, sign=True)}",
                "loss (this objective's own scale)", "")
    norm_axis = figure.add_subplot(grid[1, 0:3] if contrast else grid[1, :])
    norms = [values[name][2] for name in objectives]
    colors = [COLORS[name] for name in objectives]
    bars = norm_axis.bar(range(len(objectives)), norms, width=0.6, color=colors, edgecolor=colors)
    _bar_values(norm_axis, bars, norms, 6)
    norm_axis.set_xticks(range(len(objectives)), [name.upper() for name in objectives])
    _finish(norm_axis, "Gradient norm of each loss at the initial table", "L2 norm of the gradient", "objective")
    if contrast:
        axis = figure.add_subplot(grid[1, 3:6])
        bars = axis.bar([0, 1], contrast, width=0.6, color=COLORS["grpo"], edgecolor=COLORS["grpo"])
        _bar_values(axis, bars, contrast, 4)
        arithmetic = _reduction_texts(reduction)
        ticks = ["per-response mean,\nthen over responses", "global token mean\n(all scored tokens)"]
        if arithmetic:
            ticks = [f"{tick}\n{text}" for tick, text in zip(ticks, arithmetic)]
        axis.set_xticks([0, 1], ticks)
        _finish(axis, "The same per-token GRPO losses, reduced two ways", "loss", "reduction")
    figure.suptitle(_literal(f"Token-sequence objectives ({os.path.basename(path)}): one step from the same initial "
                             "table\neach loss on its own axis: the values of different objectives are not comparable"))
    return figure


ONLINE_COLUMNS = ["step", "total_tokens_sampled", "success_rate", "success_probability", "mean_response_length",
                  "kl_reference"]


def _online_run(folder, algorithm=None):
    series = read_csv(os.path.join(folder, "online.csv"), ONLINE_COLUMNS)
    settings = read_settings(os.path.join(folder, "online.json"))
    return Run(folder, _algorithm_name(os.path.join(folder, "online.json"), settings, algorithm or ""), series,
               settings)


def _online_references(runs):
    """The start (exact success probability at step 0, from the data), the target 0.9 and the optimum 1, for
    the success panel."""
    starts = [(run.series["success_probability"][0], f"start {run.series['success_probability'][0]:.4f}")
              for run in runs if run.series["step"][0] == 0]
    return starts + [(TARGET_SUCCESS, f"target {TARGET_SUCCESS:g}"), (1.0, "optimum 1")]


def _plot_failure(axis, runs, styles, labels, x_column):
    """1 - the exact success probability per run on a log axis: near the end the runs differ in the third
    decimal (0.985 against 0.998), which a linear axis from 0 to 1 cannot show; the target's 0.1 marked.
    A probability of exactly 1 has no place on a log axis and is left out."""
    for run, style, label in zip(runs, styles, labels):
        failure = 1.0 - np.asarray(run.series["success_probability"])
        shown = failure > 0
        axis.plot(np.asarray(run.series[x_column])[shown], failure[shown], label=label, **style)
    axis.set_yscale("log")
    mark_references(axis, [(1.0 - TARGET_SUCCESS, f"target {1.0 - TARGET_SUCCESS:.1f}")])


def _first_at_target(run, x_column):
    """(x, p) of the first row whose exact success probability reaches TARGET_SUCCESS, or None."""
    for x, p in zip(run.series[x_column], run.series["success_probability"]):
        if p >= TARGET_SUCCESS:
            return x, p
    return None


TRANSFORMER_COLUMNS = ONLINE_COLUMNS + ["test_success_probability", "entropy", "mean_correct_length",
                                        "mean_wrong_length"]


def _csv_header(path):
    _check_input_file(path)
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise PlotInputError(f"{path}: not a readable CSV ({error})") from None


def _evaluations(run):
    """(before, after) of a transformer run's sampled evaluation ({} each when the JSON has none)."""
    report = read_json(os.path.join(run.source, "online.json")) if os.path.lexists(
        os.path.join(run.source, "online.json")) else {}
    evaluation = report.get("evaluation") if isinstance(report, dict) else None
    if not isinstance(evaluation, dict):
        return {}, {}
    before, after = evaluation.get("before"), evaluation.get("after")
    return (before if isinstance(before, dict) else {}), (after if isinstance(after, dict) else {})


def _pass_at_k(path, which, evaluation):
    """[(k, pass@k)] of the `which` ("before" or "after") evaluation, k increasing: its keys "pass@" + ASCII
    digits (str.isdigit would take "pass@²", and int() then fails); other keys ("pass@1_by_difficulty")
    are not pass@k. PlotInputError naming the file and key for a k outside [1, MAX_PASS_K] (k = 0 has no
    place on the log k axis) or a value that is not a probability."""
    points = []
    for key, value in evaluation.items():
        match = re.fullmatch(r"pass@([0-9]+)", key)
        if not match:
            continue
        k = int(match.group(1))
        if not 1 <= k <= MAX_PASS_K:
            raise PlotInputError(f"{path}: evaluation.{which}.{key}: k must be a whole number in [1, {MAX_PASS_K}]")
        if not _is_number(value) or not 0.0 <= value <= 1.0:
            raise PlotInputError(f"{path}: evaluation.{which}.{key} is not a probability ({value!r})")
        points.append((k, float(value)))
    return sorted(points)


def _distinct_correct(path, which, evaluation):
    """The `which` evaluation's distinct_correct_per_prompt (a mean count), None when it has none;
    PlotInputError naming the file and key for a value that is not a finite number >= 0."""
    if "distinct_correct_per_prompt" not in evaluation:
        return None
    value = evaluation["distinct_correct_per_prompt"]
    if not _is_number(value) or value < 0:
        raise PlotInputError(f"{path}: evaluation.{which}.distinct_correct_per_prompt is not a finite number >= 0 "
                             f"({value!r})")
    return float(value)


def plot_transformer(folders):
    """Transformer runs (online_tokens.py --policy transformer), one colour per folder: exact success on
    train and test prompts after each update, pass@k on the test prompts before and after training (the
    SFT start and the end), the entropy of the sampled tokens, the lengths of right and wrong responses,
    the KL to the reference, and the distinct correct answers per test prompt before and after."""
    runs = []
    for folder in _as_list(folders):
        series = read_csv(os.path.join(folder, "online.csv"), TRANSFORMER_COLUMNS)
        settings = read_settings(os.path.join(folder, "online.json"))
        runs.append(Run(folder, _algorithm_name(os.path.join(folder, "online.json"), settings), series, settings))
    styles, labels = run_styles(runs), run_labels(runs)
    figure, axes = _new_figure(2, 3, 16, 9.2)
    success, passk, entropy, lengths, kl, distinct = axes
    for run, style, label in zip(runs, styles, labels):
        steps = np.asarray(run.series["step"])
        success.plot(steps, run.series["success_probability"], label=label, **style)
        success.plot(steps, run.series["test_success_probability"], color=style["color"], linestyle=":",
                     linewidth=style["linewidth"] + 0.6)
        sampled = steps >= 1  # row 0 samples nothing
        entropy.plot(steps[sampled], np.asarray(run.series["entropy"])[sampled], **style)
        for column, dashes in (("mean_correct_length", "-"), ("mean_wrong_length", ":")):
            values = np.asarray(run.series[column])
            seen = sampled & (values > 0)  # 0: the batch held no response of that kind
            lengths.plot(steps[seen], values[seen], color=style["color"], linestyle=dashes,
                         linewidth=style["linewidth"])
        kl.plot(steps, run.series["kl_reference"], **style)
    _finish(success, "Exact success probability after each update", "p(correct response)", "iteration")
    _finish(entropy, "Entropy of the sampled tokens", "nats per token", "iteration")
    _finish(lengths, "Response length of the sampled batch,\ncorrect and wrong answers",
            "tokens (EOS included)", "iteration")
    if len(runs) == 1:  # one run: each line named at its end, no key to look up
        _label_line_ends(success, ["train prompts", "test prompts"])
        _label_line_ends(lengths, ["correct", "wrong"])
    _finish(kl, "KL(policy ‖ reference), estimated on each batch", "nats per response", "iteration")
    width = 0.8 / max(1, len(runs))
    for index, (run, style) in enumerate(zip(runs, styles)):
        path = os.path.join(run.source, "online.json")
        before, after = _evaluations(run)
        for which, evaluation, color, dashes in (("before", before, "0.45", "--"), ("after", after, style["color"], "-")):
            points = _pass_at_k(path, which, evaluation)
            if points:
                passk.plot([k for k, _ in points], [value for _, value in points], color=color, linestyle=dashes,
                           marker="o", linewidth=style["linewidth"])
                if len(runs) == 1:  # the values themselves: pass@64's 1.00 -> 0.98 is too small to see on 0-1
                    for k, value in points:
                        passk.annotate(f"{value:.2f}", (k, value), xytext=(0, -14 if which == "before" else 8),
                                       textcoords="offset points", ha="center", fontsize=8.5, color=color)
        values = [_distinct_correct(path, "before", before), _distinct_correct(path, "after", after)]
        if None not in values:
            bars = distinct.bar([position + index * width for position in (0, 1)], values, width,
                                color=[_shade(style["color"], 0.55), style["color"]], edgecolor=style["color"])
            _bar_values(distinct, bars, values, 2)
    passk.set_xscale("log", base=2)
    ks = sorted({k for run in runs for which, evaluation in zip(("before", "after"), _evaluations(run))
                 for k, _ in _pass_at_k(os.path.join(run.source, "online.json"), which, evaluation)})
    passk.set_xticks(ks, [str(k) for k in ks])
    passk.set_ylim(0.0, 1.1)
    _finish(passk, "pass@k on the test prompts, SFT start and after RL", "pass@k", "k (responses sampled per prompt)")
    passk.legend([Line2D([], [], color="0.45", linestyle="--", marker="o"),
                  Line2D([], [], color=styles[0]["color"] if len(runs) == 1 else "0.1", marker="o")],
                 ["SFT start", "after RL"], loc="lower right", frameon=False)
    distinct.set_xticks([0.4 - width / 2, 1.4 - width / 2], ["SFT start", "after RL"])
    _finish(distinct, "Distinct correct responses per test prompt\n(among the sampled ones)", "responses", "")
    _legend_below(figure, success)
    algorithms = ", ".join(dict.fromkeys(run.algorithm.upper() for run in runs if run.algorithm)) or "runs"
    figure.suptitle(_literal(f"Online {algorithms} on a tiny transformer, from its SFT start (Countdown)"))
    return figure


def _label_line_ends(axis, names):
    """Write names[i] just right of the last point of the axis's i-th line, in its colour, with room made
    on the right: a line labelled where it ends needs no key."""
    lines = [(line, name) for line, name in zip(axis.get_lines(), names) if len(line.get_xdata())]
    if not lines:  # nothing drawn (a batch with no wrong answer at all): nothing to name
        return
    for line, name in lines:
        x, y = line.get_xdata()[-1], line.get_ydata()[-1]
        axis.annotate(name, (x, y), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8.5,
                      color=line.get_color())
    low, high = axis.get_xlim()
    last = max(line.get_xdata()[-1] for line, _ in lines)
    ticks = [tick for tick in axis.get_xticks() if low <= tick <= last]  # no tick where there is no data
    axis.set_xlim(low, high + 0.22 * (high - low))
    axis.set_xticks(ticks)


def plot_online(folders):
    """Online runs (online_tokens.py), one line per folder: exact success, its failure probability on a log
    scale and KL after each update (from step 0), the sampled batch's success rate (from step 1: nothing is
    sampled at 0). The sampled batch's mean length is not drawn: once the task is learned it follows which
    prompts were drawn, not the policy.
    Transformer runs (their CSV has test_success_probability) get their own figure (plot_transformer)."""
    folders = _as_list(folders)
    transformer = ["test_success_probability" in _csv_header(os.path.join(folder, "online.csv")) for folder in folders]
    if any(transformer):
        if not all(transformer):
            raise PlotInputError(f"{folders[transformer.index(False)]}: a table run cannot share a figure with "
                                 f"{folders[transformer.index(True)]} (a transformer run); give runs of one policy")
        return plot_transformer(folders)
    runs = [_online_run(folder) for folder in folders]
    styles, labels = run_styles(runs), run_labels(runs)
    success_references = _online_references(runs)
    figure, axes = _new_figure(2, 2, 13, 8.8)
    panels = [
        ("success_probability", 0, "Exact success probability after each update", "p(correct answer, then EOS)",
         success_references),
        ("success_rate", 1, "Success rate of the sampled batch (noisy estimate of the above)",
         "share of responses correct", []),
        ("kl_reference", 0, "Exact KL(policy ‖ reference): how far training moved the policy", "nats per response",
         []),
    ]
    for axis, (column, from_step, title, ylabel, references) in zip([axes[0], axes[1], axes[3]], panels):
        _plot_runs(axis, runs, styles, labels, "step", column, from_step)
        mark_references(axis, references)
        _finish(axis, title, ylabel, "iteration (one sampled batch each)")
    _plot_failure(axes[2], runs, styles, labels, "step")
    _finish(axes[2], "Exact failure probability 1 - p (log scale):\nwhat is left to learn, where the runs part",
            "p(wrong answer) (log scale)", "iteration (one sampled batch each)")
    _legend_below(figure, axes[0])
    algorithms = ", ".join(dict.fromkeys(run.algorithm.upper() for run in runs if run.algorithm)) or "runs"
    figure.suptitle(_literal(f"Online {algorithms} on a tiny token policy (prompt n → n in binary, then EOS)"))
    return figure


def load_online_all_runs(folders):
    """One Run per <algorithm>/online.csv of each folder, grouped by algorithm, then folder."""
    found = {}
    for folder in _as_list(folders):
        found[folder] = [name for name in ONLINE_ALGORITHMS if os.path.exists(os.path.join(folder, name, "online.csv"))]
        if not found[folder]:
            raise PlotInputError(f"{folder}: comparison.csv but no <algorithm>/online.csv beside it "
                                 f"(expected subfolders among {', '.join(ONLINE_ALGORITHMS)})")
    return [_online_run(os.path.join(folder, name), name)
            for name in ONLINE_ALGORITHMS for folder in found if name in found[folder]]


def plot_online_all(folders):
    """online_tokens.py --algorithm all: the algorithms on shared axes against the sampled tokens (the budget
    they share), exact success with the start and the 0.9 target, exact KL to the reference, and the failure
    probability on a log scale, where algorithms that overlap near 1 part."""
    runs = load_online_all_runs(folders)
    styles, labels = run_styles(runs), run_labels(runs)
    reached = [_first_at_target(run, "total_tokens_sampled") for run in runs]
    labels = [f"{label}: p ≥ {TARGET_SUCCESS:g} after {point[0]:,.0f} tokens" if point else
              f"{label}: p < {TARGET_SUCCESS:g} throughout" for label, point in zip(labels, reached)]
    success_references = _online_references(runs)
    figure, axes = _new_figure(1, 3, 15, 5.6)
    panels = [
        ("success_probability", 0, "Exact success probability per sampled token\n(dots: first reaches the target)",
         "p(correct answer, then EOS)", success_references),
        ("kl_reference", 0, "Exact KL(policy ‖ reference)\nthe price of the gain", "nats per response", []),
    ]
    for axis, (column, from_step, title, ylabel, references) in zip(axes, panels):
        _plot_runs(axis, runs, styles, labels, "total_tokens_sampled", column, from_step)
        mark_references(axis, references)
        _finish(axis, title, ylabel, "sampled tokens (total so far)")
    _plot_failure(axes[2], runs, styles, labels, "total_tokens_sampled")
    _finish(axes[2], "Exact failure probability 1 - p (log scale)\nwhat is left to learn, where the lines part",
            "p(wrong answer) (log scale)", "sampled tokens (total so far)")
    for point, style in zip(reached, styles):
        if point:
            axes[0].plot([point[0]], [point[1]], marker="o", markersize=6, color=style["color"],
                         markeredgecolor="black", linestyle="none", zorder=3)
    _legend_below(figure, axes[0])
    algorithms = ", ".join(dict.fromkeys(run.algorithm.upper() for run in runs))
    figure.suptitle(_literal(f"{algorithms} on the same task at the same sampling budget: who learns with fewer "
                             "tokens"))
    return figure


# ---------------------------------------------------------------------------------------------
# The atlas: one experiments.py folder (settings.json, summary.csv, curves.csv)
# ---------------------------------------------------------------------------------------------

EXPERIMENT_CYCLE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f",
                    "#bcbd22", "#17becf", "#393b79", "#637939")
PANEL_KINDS = ("curves", "values", "sweep", "claim")  # see experiment_figure
PANEL_WIDTH, PANEL_HEIGHT = 4.9, 3.7  # inches per panel; up to 3 panels a row
PANEL_TITLE_CHARACTERS = 50  # a panel title wraps at this width (about 0.6 em per character at 10.5 pt)


def _rows_from_text(text, where):
    """CSV text -> list of dicts, numbers as floats where they parse (labels and empty cells stay strings)."""
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
    except csv.Error as error:
        raise PlotInputError(f"{where}: not a readable CSV ({error})") from None
    for row in rows:
        for key, value in row.items():
            try:
                row[key] = float(value)
            except (TypeError, ValueError):
                pass
    return rows


def _value(row, column):
    """A drawn cell: its float, or None where the cell is empty (a target never reached, a length of no
    answer, a sampled column at step 0)."""
    value = row.get(column)
    return value if isinstance(value, float) else None


def _same(label_value, wanted):
    """A label cell (parsed from CSV: 8.0, 'False', 'grpo') against a value from settings.json (8, false)."""
    if isinstance(wanted, bool) or isinstance(label_value, bool):
        return str(label_value) == str(wanted)
    if isinstance(wanted, (int, float)) and isinstance(label_value, float):
        return label_value == float(wanted)
    return str(label_value) == str(wanted)


def _selected(rows_by_configuration, where):
    """The configurations whose label matches every key of `where` (a panel's filter: a value, or a list
    of the values allowed)."""
    def matches(value, wanted):
        return any(_same(value, item) for item in wanted) if isinstance(wanted, list) else _same(value, wanted)

    return [name for name, row in rows_by_configuration.items()
            if all(matches(row.get(key), value) for key, value in (where or {}).items())]


def experiment_styles(summary, color_by):
    """{configuration: style}: one colour per configuration, the same in every panel. With color_by (label
    keys), the configurations that share those keys' values share a colour, and the others keys set the
    dashes and a shade, dark to light."""
    names = [row["configuration"] for row in summary]
    if not color_by:
        return {name: {"color": EXPERIMENT_CYCLE[index % len(EXPERIMENT_CYCLE)], "linestyle": "-"}
                for index, name in enumerate(names)}
    groups = collections.OrderedDict()
    for row in summary:
        groups.setdefault(tuple(str(row.get(key)) for key in color_by), []).append(row["configuration"])
    styles = {}
    for index, members in enumerate(groups.values()):
        base = EXPERIMENT_CYCLE[index % len(EXPERIMENT_CYCLE)]
        amounts = np.linspace(-0.35, 0.35, len(members)) if len(members) > 1 else [0.0]
        for rank, (name, amount) in enumerate(zip(members, amounts)):
            styles[name] = {"color": _shade(base, amount), "linestyle": DASHES[rank % len(DASHES)]}
    return styles


def experiment_families(summary, color_by):
    """{configuration: the colour its color_by group is shaded from} (None without color_by): the colour
    of a line that joins a group's configurations."""
    if not color_by:
        return {row["configuration"]: None for row in summary}
    keys = list(dict.fromkeys(tuple(str(row.get(key)) for key in color_by) for row in summary))
    return {row["configuration"]: EXPERIMENT_CYCLE[keys.index(tuple(str(row.get(key)) for key in color_by))
                                                   % len(EXPERIMENT_CYCLE)] for row in summary}


def _label(text):
    return text.replace("_", " ")


def _number_text(value):
    """A label value from a CSV cell (8.0, 0.02, 'False') as a reader writes it: 8, 0.02, False."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _flag(on, off):
    """A True/False label as words: `on` for True, `off` for False (None: say nothing)."""
    return lambda value: on if str(value) == "True" else off


# How the configurations' label keys (experiments.py) read in a legend or under a strip: a function of the
# value, returning the words, or None where the value needs no words (no overlong penalty). A key not listed
# reads as its name with spaces, then its value.
LABEL_WORDS = {
    "algorithm": lambda value: str(value).upper(),
    "loss": lambda value: str(value).upper(),
    "epsilon_high": lambda value: f"ε_high {_number_text(value)}",
    "updates_per_batch": lambda value: f"{_number_text(value)} update{'' if value == 1 else 's'} per batch",
    "learning_rate": lambda value: f"lr {_number_text(value)}",
    "group_size": lambda value: f"group size {_number_text(value)}",
    "dynamic_sampling": _flag("dynamic sampling", "static sampling"),
    "scale_rewards": lambda value: {"none": "no std"}.get(str(value), f"{value} std"),
    "beta": lambda value: f"KL β {_number_text(value)}",
    "kl_penalty": lambda value: {"implicit": "implicit KL", "off": "KL off"}.get(str(value), f"KL {value}"),
    "reduction": lambda value: {"constant": "constant"}.get(str(value), f"{value} mean"),
    "overlong": _flag("overlong penalty", None),
    "sampler": lambda value: {"same": "sampler as the trainer"}.get(  # T: the temperature, short under a strip
        str(value), f"{str(value).replace('temperature ', 'T ')} sampler"),
    "tis": _flag("TIS", "no TIS"),
    "gae_lambda": lambda value: f"λ {_number_text(value)}",
    "shift": lambda value: f"reward shift {_number_text(value)}",
    "rewards": lambda value: f"{value} rewards",
    "preference_flips": lambda value: f"{_number_text(value)} labels flipped",
    "distance": lambda value: f"{value} the reference",
    "kl": lambda value: {"none": "no KL"}.get(str(value), f"KL {value}"),
    "position_ids": lambda value: {"mask": "positions from the mask"}.get(str(value), f"positions {value}"),
    "run": lambda value: f"{value} run",
    "batch": lambda value: f"one batch per {value}",
}


def label_words(key, value):
    """One label key and its value in words (LABEL_WORDS), or None when the value needs none."""
    words = LABEL_WORDS.get(key)
    return words(value) if words else f"{_label(key)} {_number_text(value)}"


def strip_font_size(tick_texts, room):
    """STRIP_FONT_SIZE, or smaller (down to 6 pt) where a panel's strips are too narrow for their longest line
    (`room`: points from one strip to the next; 0.6 em a character): neighbouring labels must not touch."""
    longest = max((len(line) for text in tick_texts for line in text.split("\n")), default=1)
    return max(6.0, min(STRIP_FONT_SIZE, round(room / (0.6 * longest) * 0.9, 1)))


def configuration_texts(labels, keys=None):
    """For each configuration's label ({key: value}), the list of its parts in words, in the label's order:
    only the keys in `keys` when given (the keys whose values differ in a panel)."""
    return [[text for key, value in label.items() if keys is None or key in keys
             for text in [label_words(key, value)] if text] for label in labels]


def differing_keys(labels):
    """The label keys whose values differ between the configurations (the ones worth a word under a strip)."""
    keys = list(dict.fromkeys(key for label in labels for key in label))
    return [key for key in keys if len({str(label.get(key)) for label in labels}) > 1]


def _log_if_positive(axis, values, which="y"):
    """A log axis where asked and every drawn value is positive; a linear one otherwise (a zero or a
    negative value has no place on a log axis)."""
    values = [value for value in values if value is not None]
    if values and min(values) > 0:
        (axis.set_yscale if which == "y" else axis.set_xscale)("log")
        return True
    return False


# a band over the seeds covers their middle 80%: at 50 seeds a min-max band is the two most extreme seeds'
# and widens with every seed added (the bands of several configurations then merge into one grey area);
# the 10th to the 90th percentile settles as seeds are added
BAND_PERCENTILES = (10, 90)


def _band(values):
    """(low, high): the 10th and 90th percentiles of one point's seeds (numpy's linear interpolation between
    the sorted values; one seed: its value twice)."""
    low, high = np.percentile(values, BAND_PERCENTILES)
    return float(low), float(high)


def _panel_curves(axis, panel, curves, configurations, styles):
    """Each configuration's mean over seeds against the step (or panel["x"], averaged over seeds at each
    step), with the seeds' middle 80% as a band; with two columns, one line style each and no bands."""
    columns, x_column = panel["columns"], panel.get("x", "step")
    drawn = []
    for column_index, column in enumerate(columns):
        for name in configurations:
            points = collections.defaultdict(list)
            for row in curves:
                if row["configuration"] != name:
                    continue
                step, y = _value(row, "step"), _value(row, column)
                if y is None or step is None or ("max_step" in panel and step > panel["max_step"]):
                    continue
                points[step].append((_value(row, x_column) if x_column != "step" else step, y))
            steps = [step for step in sorted(points) if all(x is not None for x, _ in points[step])]
            if not steps:
                continue
            xs = [sum(x for x, _ in points[step]) / len(points[step]) for step in steps]
            ys = [[y for _, y in points[step]] for step in steps]
            style = dict(styles[name])
            if len(columns) > 1:
                style["linestyle"] = DASHES[column_index % len(DASHES)]
            if any(later < earlier for earlier, later in zip(xs, xs[1:])):  # an x that goes back and forth
                # (e.g. a KL): a band over it would be a tangle; each seed's point at each step shows the spread
                axis.scatter([x for step in steps for x, _ in points[step]],
                             [y for step in steps for _, y in points[step]], s=5, color=style["color"], alpha=0.3,
                             linewidths=0)
            elif len(columns) == 1:  # with two columns (solid and dashed) the bands would hide the lines
                lows, highs = zip(*(_band(values) for values in ys))
                axis.fill_between(xs, lows, highs, color=style["color"], alpha=0.13, linewidth=0)
            axis.plot(xs, [sum(values) / len(values) for values in ys], linewidth=1.6, **style)
            drawn += [value for values in ys for value in values]
    if panel.get("log"):
        _log_if_positive(axis, drawn)
    default_x = {"step": "iteration", "total_tokens_sampled": "sampled tokens"}.get(x_column, _label(x_column))
    _finish(axis, panel.get("title", _label(columns[0])), panel.get("ylabel", _label(columns[0])),
            panel.get("xlabel", default_x))


def _per_seed(runs, name, metric):
    return [value for value in (_value(row, metric) for row in runs if row["configuration"] == name)
            if value is not None]


def _statistics(row, seeds, metric, runs_of_configuration):
    """(mean, min, max, never) of a metric for one configuration: from its summary row, or from its runs
    when the summary does not hold the metric (a column runs.csv records for every run, such as the SFT
    start's value beside the metric the summary keeps after RL); never: the runs without a value."""
    if f"{metric}_mean" in row:
        return tuple(_value(row, f"{metric}_{stat}") for stat in ("mean", "min", "max", "never"))
    never = sum(1 for run in runs_of_configuration if _value(run, metric) is None)
    if not seeds:
        return None, None, None, never
    return sum(seeds) / len(seeds), min(seeds), max(seeds), never


STRIP_CHARACTERS = 9  # a strip's label wraps at this width (7.5 pt text under each column of a 6-strip panel)
STRIP_FONT_SIZE = 7.5


def _panel_values(axis, panel, summary_rows, runs, configurations, styles):
    """Per metric a group, per configuration a strip: every seed's value (dots), the mean (a wide bar) and
    the min-max range (a whisker). Under each strip, the configuration in words (the label keys that differ
    in this panel) and its mean; under a group, the metric when there are several. The axis fits the values,
    not 0, so that 0.97 and 0.99 stay apart; a configuration whose runs never reached the target says so."""
    metrics = panel["metrics"]
    # strips fill their group (each label gets the room), leaving a gap between groups when there are several
    width = (0.8 if len(metrics) > 1 else 0.96) / max(len(configurations), 1)
    keys = differing_keys([summary_rows[name]["label"] for name in configurations])
    words = dict(zip(configurations, configuration_texts([summary_rows[name]["label"] for name in configurations],
                                                         keys)))
    drawn, every_seed, ticks, tick_texts = [], [], [], []
    for index, name in enumerate(configurations):
        row = summary_rows[name]
        mine = [run for run in runs if run["configuration"] == name]
        for group, metric in enumerate(metrics):
            x = group + (index - (len(configurations) - 1) / 2) * width
            style = styles[name]
            seeds = _per_seed(runs, name, metric)
            mean, low, high, never = _statistics(row, seeds, metric, mine)
            lines = [textwrap.fill(part, STRIP_CHARACTERS, break_long_words=False) for part in words[name]]
            ticks.append(x)
            if mean is None:
                tick_texts.append("\n".join(lines + [f"never ({int(never or 0)})"]))
                continue
            spread = np.linspace(-0.25, 0.25, len(seeds)) * width if len(seeds) > 1 else [0.0] * len(seeds)
            axis.scatter([x + offset for offset in spread], seeds, s=12, color=style["color"], alpha=0.55,
                         linewidths=0, zorder=3)
            axis.vlines(x, low, high, color=style["color"], linewidth=1.0, zorder=2)
            axis.hlines(mean, x - 0.42 * width, x + 0.42 * width, color=style["color"], linewidth=3.0, zorder=4)
            tick_texts.append("\n".join(lines + [_compact(mean)] + ([textwrap.fill(f"{int(never)} never reached",
                                                                                  STRIP_CHARACTERS)] if never else [])))
            drawn += seeds + [mean, low, high]
            every_seed += seeds
    if drawn:
        low, high = min(drawn), max(drawn)
        span = (high - low) or max(abs(high), 1e-12)
        axis.set_ylim(low - 0.07 * span, high + 0.07 * span)  # the numbers are under the strips, not above
        if every_seed and all(float(value).is_integer() for value in every_seed):  # counts: whole-number ticks
            axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xticks(ticks, [_literal(text) for text in tick_texts], fontsize=strip_font_size(tick_texts, PANEL_WIDTH * 72 * 0.8 / len(metrics) * width))
    axis.tick_params(axis="x", length=2)
    if len(metrics) > 1:  # the metric of each group, below its strips' labels
        rows = max(text.count("\n") + 1 for text in tick_texts)
        secondary = axis.secondary_xaxis("bottom")
        # as many characters as a group's width holds (its axes about 80% of the panel, 0.62 em a character)
        characters = max(STRIP_CHARACTERS, int(PANEL_WIDTH * 72 * 0.8 / len(metrics) / (0.62 * 8.5)))
        secondary.set_xticks(range(len(metrics)), [_literal(textwrap.fill(_label(metric), characters))
                                                   for metric in metrics], fontsize=8.5, fontweight="bold")
        secondary.tick_params(axis="x", length=0, pad=rows * STRIP_FONT_SIZE * 1.2 + 10)
        secondary.spines["bottom"].set_visible(False)
    axis.set_xlim(-0.5, len(metrics) - 0.5)
    axis.set_title(_literal(panel.get("title", _label(metrics[0]))))
    axis.set_ylabel(_literal(panel.get("ylabel", _label(metrics[0]) if len(metrics) == 1 else "value")))
    axis.grid(True, axis="y", alpha=0.3)


def _compact(value):
    """A value written on a figure: 4 significant digits, scientific below 1e-3."""
    if value == 0:
        return "0"
    return f"{value:.1e}" if abs(value) < 1e-3 else f"{value:.4g}"


def _panel_sweep(axis, panel, summary_rows, runs, configurations, styles, families):
    """The metric against a numeric label (panel["x"]): one line per colour group (the configurations that
    share every other label value), the mean over seeds with the seeds' middle 80% as a band, every seed a dot."""
    x_key, metric = panel["x"], panel["metric"]
    lines = collections.OrderedDict()
    for name in configurations:
        row = summary_rows[name]
        others = tuple((key, str(value)) for key, value in row["label"].items() if key != x_key)
        lines.setdefault(others, []).append(name)
    xs_all, drawn, labelled = [], [], False
    for members in lines.values():
        points = []
        for name in members:
            x, row = _value(summary_rows[name]["label"], x_key), summary_rows[name]
            mean = _value(row, f"{metric}_mean")
            if x is None or mean is None:
                continue
            seeds = _per_seed(runs, name, metric)
            band = _band(seeds) if seeds else (_value(row, f"{metric}_min"), _value(row, f"{metric}_max"))
            points.append((x, mean, *band))
            never = _value(row, f"{metric}_never")
            if never:  # the mean is over the runs that reached the target: say how many did not
                axis.annotate(f"{int(never)} never", (x, _value(row, f"{metric}_max")), xytext=(0, 4),
                              textcoords="offset points", ha="center", fontsize=7.5, color=styles[name]["color"])
                labelled = True
            axis.scatter([x] * len(seeds), seeds, s=10, color=styles[name]["color"], alpha=0.45, linewidths=0, zorder=3)
            drawn += seeds
        if not points:
            continue
        points.sort()
        family = {families[name] for name in members}
        if len({styles[name]["color"] for name in members}) == 1:
            style = dict(styles[members[0]])
        elif len(family) == 1 and None not in family:  # shades of one colour: the line in that colour
            style = {"color": family.pop(), "linestyle": "-"}
        else:  # each x its own colour: a grey line joins them
            style = {"color": "0.3", "linestyle": "-"}
        axis.fill_between([p[0] for p in points], [p[2] for p in points], [p[3] for p in points], color=style["color"],
                          alpha=0.13, linewidth=0)
        axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=4, linewidth=1.6, **style)
        xs_all += [p[0] for p in points]
    axis.margins(x=0.08)  # room for a "never" count above the last x
    if labelled:  # and above the highest seed: an annotation takes no part in the autoscaled limits
        low, high = axis.get_ylim()
        axis.set_ylim(low, high + 0.08 * (high - low))
    values = sorted(set(xs_all))
    if values and values[0] > 0 and values[-1] / values[0] >= 8:  # 1, 2, 4, 8 or 2, 4, 8, 16: equal steps
        axis.set_xscale("log", base=2)
    if values:
        axis.xaxis.set_major_locator(FixedLocator(values))
        axis.xaxis.set_minor_locator(NullLocator())
        axis.set_xticklabels([_compact(value) for value in values])
    _finish(axis, panel.get("title", _label(metric)), panel.get("ylabel", _label(metric)),
            panel.get("xlabel", _label(x_key)))


def _panel_claim(axis, panel, settings):
    """One claim's per-seed values (a paired difference, or 1/0 for a count), their mean and 95% interval,
    0 and the margin marked: the evidence of the verdict."""
    verdict = settings["claims"][panel["claim"]]
    values = [item["value"] for item in verdict["per_seed"]]
    seeds = [item["seed"] for item in verdict["per_seed"]]
    values = [float(value) for value in values]
    axis.axhline(0.0, color="black", linewidth=0.8)
    if verdict.get("margin"):
        for sign in (-1, 1):
            axis.axhline(sign * verdict["margin"], color="0.4", linestyle=(0, (2, 2)), linewidth=1.0)
    axis.scatter(range(len(values)), values, s=22, color="#1f77b4", zorder=3)
    if verdict.get("mean") is not None:
        axis.axhline(verdict["mean"], color="#d62728", linewidth=1.4)
        if verdict.get("interval"):
            axis.axhspan(verdict["interval"][0], verdict["interval"][1], color="#d62728", alpha=0.12, linewidth=0)
    axis.set_xticks(range(len(values)), [_literal(seed) for seed in seeds], fontsize=8)
    title = panel.get("title") or f"{verdict['verdict']}: {verdict['count']}"
    _finish(axis, title, panel.get("ylabel", "per-seed value"), "seed (mean and 95% interval in red)")


def _names(value):
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _panels_of(settings):
    """The figure's panels: settings["figure"]["panels"], or one values panel per metric (first three)."""
    spec = settings.get("figure") or {}
    panels = spec.get("panels")
    if panels is None:
        return [{"kind": "values", "metrics": [metric]} for metric in (settings.get("metrics") or [])[:3]]
    return panels


def _check_experiment_settings(settings, where):
    """Refuse, naming the key, a settings.json whose figure keys are not what experiments.py writes: each
    name a string, each list a list (a list where a name belongs would reach matplotlib as a key)."""
    spec = settings.get("figure") or {}
    if not isinstance(spec, dict):
        raise PlotInputError(f"{where}/settings.json: 'figure' must be an object")
    expected = [(settings, "metrics", _names, "a list of names"), (settings, "curves", _names, "a list of names"),
                (settings, "seeds", lambda value: isinstance(value, list), "a list"),
                (settings, "claims", lambda value: isinstance(value, list) and all(isinstance(item, dict)
                                                                                  for item in value), "a list of objects"),
                (spec, "panels", lambda value: isinstance(value, list) and all(isinstance(item, dict) for item in value),
                 "a list of objects"),
                (spec, "color_by", _names, "a list of names")]
    for holder, key, valid, kind in expected:
        if key in holder and holder[key] is not None and not valid(holder[key]):
            raise PlotInputError(f"{where}/settings.json: {key!r} must be {kind}")
    needs = {"curves": ("columns",), "values": ("metrics",), "sweep": ("x", "metric"), "claim": ("claim",)}
    for index, panel in enumerate(_panels_of(settings)):
        kind = panel.get("kind")
        if kind not in PANEL_KINDS:
            raise PlotInputError(f"{where}/settings.json: panel {index}: 'kind' must be one of {', '.join(PANEL_KINDS)}")
        for key in needs[kind]:
            if key not in panel:
                raise PlotInputError(f"{where}/settings.json: panel {index} ({kind}) needs {key!r}")
        checks = [("columns", _names, "a list of names"), ("metrics", _names, "a list of names"),
                  ("x", lambda value: isinstance(value, str), "a name"),
                  ("metric", lambda value: isinstance(value, str), "a name"),
                  ("where", lambda value: isinstance(value, dict), "an object"),
                  ("log", lambda value: isinstance(value, bool), "true or false"),
                  ("max_step", lambda value: isinstance(value, (int, float)) and not isinstance(value, bool), "a number"),
                  ("claim", lambda value: isinstance(value, int) and not isinstance(value, bool)
                   and 0 <= value < len(settings.get("claims") or []), "the index of a claim"),
                  ("same_y_as", lambda value: isinstance(value, int) and not isinstance(value, bool)
                   and 0 <= value < len(_panels_of(settings)), "the index of a panel")]
        for key, valid, kind_text in checks:
            if key in panel and not valid(panel[key]):
                raise PlotInputError(f"{where}/settings.json: panel {index}: {key!r} must be {kind_text}")


def _check_cell(row, column, where, line):
    """A drawn cell is a finite number or empty (no value in that run); anything else is refused."""
    value = row.get(column)
    if value == "" or (isinstance(value, float) and math.isfinite(value)):
        return
    raise PlotInputError(f"{where}: line {line}: {column} is missing or not a finite number ({value!r})")


def _check_experiment(settings, summary, curves, runs, where):
    """Refuse, naming the file, what experiments.py would not have written."""
    if not summary:
        raise PlotInputError(f"{where}/summary.csv: no data rows")
    _check_experiment_settings(settings, where)
    panels = _panels_of(settings)
    metrics = [metric for panel in panels for metric in panel.get("metrics", [panel.get("metric")]) if metric]
    # a strip panel may draw a metric the summary leaves out from every run's value in runs.csv (_statistics)
    from_runs = {metric for panel in panels if panel.get("kind") == "values" for metric in panel["metrics"]
                 if f"{metric}_mean" not in summary[0] and runs and metric in runs[0]}
    needed = [f"{metric}_{stat}" for metric in metrics if metric not in from_runs for stat in ("mean", "min", "max")]
    for line, row in enumerate(summary, start=2):
        if not isinstance(row.get("configuration"), str):
            raise PlotInputError(f"{where}/summary.csv: line {line}: no configuration")
        for name in needed:
            if name not in row:
                raise PlotInputError(f"{where}/summary.csv: line {line}: {name} is missing")
            _check_cell(row, name, f"{where}/summary.csv", line)
    for line, row in enumerate(runs, start=2):
        if not isinstance(row.get("configuration"), str):
            raise PlotInputError(f"{where}/runs.csv: line {line}: configuration is missing")
        for metric in metrics:
            if metric in row:
                _check_cell(row, metric, f"{where}/runs.csv", line)
    # every column a panel draws, and the step, is a finite number or empty on every row
    columns = {column for panel in panels if panel.get("kind") == "curves"
               for column in panel["columns"] + [panel.get("x", "step")]}
    drawn = ["step"] + sorted(column for column in columns if curves and column in curves[0] and column != "step")
    for line, row in enumerate(curves, start=2):
        if not isinstance(row.get("configuration"), str):
            raise PlotInputError(f"{where}/curves.csv: line {line}: configuration is missing")
        for column in drawn:
            _check_cell(row, column, f"{where}/curves.csv", line)
            if column == "step" and row.get(column) == "":
                raise PlotInputError(f"{where}/curves.csv: line {line}: step is missing")


def _experiment_legend(figure, configurations, styles, labels, title=None):
    """One legend below every panel: a line per configuration in its colour and dashes, labelled in words
    (configuration_texts), under `title` (statistics_key)."""
    handles = [Line2D([], [], linewidth=2.0, **styles[name]) for name in configurations]
    if len(set(labels)) < len(labels):  # words that coincide would hide a configuration: its name instead
        labels = list(configurations)
    return _legend_below(figure, None, handles, labels, title)


def experiment_figure(settings, summary, curves, runs=(), where="experiment"):
    """The figure of one experiment from its parsed files: settings["figure"]["panels"], each one of

        {"kind": "curves", "columns": [c], "x": "step", "where": {label: value}, "max_step": n, "log": bool}
            each configuration's mean over seeds per iteration, the seeds' middle 80% as a band (none with two columns);
        {"kind": "values", "metrics": [m, ...], "where": {...}}
            every seed's value, the mean and the min-max per configuration (and per metric);
        {"kind": "sweep", "x": label key, "metric": m, "where": {...}}
            the metric against a numeric label, a line per group of the other labels;
        {"kind": "claim", "claim": index}
            one claim's per-seed values with their mean and 95% interval;

    all with optional "title", "ylabel", "xlabel". One colour per configuration in every panel
    (settings["figure"]["color_by"]: label keys whose values share a colour)."""
    runs = list(runs)
    _check_experiment(settings, summary, curves, runs, where)
    spec = settings.get("figure") or {}
    panels = _panels_of(settings)
    header = list(summary[0])
    label_keys = header[1: header.index("seeds")] if "seeds" in header else []  # between configuration and seeds
    summary_rows = {row["configuration"]: {**row, "label": {key: row[key] for key in label_keys}} for row in summary}
    configurations = list(summary_rows)
    styles = experiment_styles(summary, spec.get("color_by"))
    families = experiment_families(summary, spec.get("color_by"))
    columns = 2 if len(panels) == 4 else min(len(panels), 3) or 1  # 4 panels as 2 x 2: no empty slot
    rows = -(-len(panels) // columns) or 1
    figure, axes = _new_figure(rows, columns, PANEL_WIDTH * columns, PANEL_HEIGHT * rows + 1.3)
    for axis, panel in zip(axes, panels):
        chosen = _selected({name: row["label"] for name, row in summary_rows.items()}, panel.get("where"))
        if panel["kind"] == "curves":
            _panel_curves(axis, panel, curves, chosen, styles)
        elif panel["kind"] == "values":
            _panel_values(axis, panel, summary_rows, runs, chosen, styles)
        elif panel["kind"] == "sweep":
            _panel_sweep(axis, panel, summary_rows, runs, chosen, styles, families)
        else:
            _panel_claim(axis, panel, settings)
        axis.set_title(textwrap.fill(axis.get_title(), PANEL_TITLE_CHARACTERS))
    for axis, panel in zip(axes, panels):
        if "same_y_as" in panel:  # values of 0 read as 0 beside the other panel's, not on an axis of their own
            axis.set_ylim(axes[panel["same_y_as"]].get_ylim())
    for axis in axes[len(panels):]:
        axis.set_visible(False)
    texts = configuration_texts([summary_rows[name]["label"] for name in configurations])
    labels = [", ".join(parts) for parts in texts]
    _experiment_legend(figure, configurations, styles, labels, statistics_key(settings, panels))
    # the experiment and what it compares, in at most two lines; its source is in summary.md and the docs
    width_characters = int(PANEL_WIDTH * columns * 72 / (0.6 * STYLE["figure.titlesize"]))  # ~0.6 em a character
    title = textwrap.fill(f"{settings.get('experiment', 'experiment')}: {settings.get('summary', '')}",
                          width_characters, max_lines=2, placeholder=" ...")
    figure.suptitle(_literal(title), fontsize=STYLE["figure.titlesize"] - (0 if columns > 1 else 1.5))
    return figure


def statistics_key(settings, panels):
    """What the lines, bands, bars, whiskers and dots of an experiment's panels are, for the kinds of panel
    it has, with the seeds they summarize: the legend's title."""
    seeds = settings.get("seeds") or []
    seed_text = f"{len(seeds)} seeds ({seeds[0]}-{seeds[-1]})" if len(seeds) > 1 else f"{len(seeds)} seed"
    kinds = [panel.get("kind") for panel in panels]
    two_columns = any(len(panel.get("columns", ())) > 1 for panel in panels if panel.get("kind") == "curves")
    parts = []
    if "curves" in kinds:
        shared = " (none where solid and dashed lines share a panel)" if two_columns else ""
        parts.append(f"curves: line = mean over the seeds, band = their middle 80%{shared}")
    if "values" in kinds:
        parts.append("strips: dot = one seed, bar = mean (written under it), whisker = min-max")
    if "sweep" in kinds:
        parts.append("sweeps: line = mean, band = middle 80%, dot = one seed")
    if "claim" in kinds:
        parts.append("claim: dot = one seed's value, red = mean and 95% interval")
    return f"{seed_text}. " + "; ".join(parts)


def experiment_figure_bytes(files, extension):
    """The figure of one experiment from the {path: text} that experiments.py is about to write."""
    by_name = {os.path.basename(path): text for path, text in files.items()}
    settings = json.loads(by_name["settings.json"])
    with matplotlib.rc_context(STYLE):
        figure = experiment_figure(settings, _rows_from_text(by_name["summary.csv"], "summary.csv"),
                                   _rows_from_text(by_name.get("curves.csv", ""), "curves.csv"),
                                   _rows_from_text(by_name.get("runs.csv", ""), "runs.csv"))
        return figure_bytes(figure, extension)


def plot_experiment(folders):
    """One experiments.py folder; several are refused (each experiment has its own axes)."""
    folders = _as_list(folders)
    if len(folders) > 1:
        raise PlotInputError(f"{folders[1]}: draw one experiment folder at a time")
    folder = folders[0]
    settings = read_json(os.path.join(folder, "settings.json"))
    if not isinstance(settings, dict) or "experiment" not in settings:
        raise PlotInputError(f"{os.path.join(folder, 'settings.json')}: not an experiment's settings")
    texts = {}
    for name in ("summary.csv", "curves.csv", "runs.csv"):
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            _check_input_file(path)
            with open(path, encoding="utf-8", newline="") as handle:
                texts[name] = handle.read()
    if "summary.csv" not in texts:
        raise PlotInputError(f"{folder}: settings.json but no summary.csv")
    return experiment_figure(settings, _rows_from_text(texts["summary.csv"], "summary.csv"),
                             _rows_from_text(texts.get("curves.csv", ""), "curves.csv"),
                             _rows_from_text(texts.get("runs.csv", ""), "runs.csv"), folder)


# kind (see detect_kind) -> function(list of input paths) -> matplotlib Figure
PLOTTERS = {
    "experiment": plot_experiment,
    "bandit": plot_bandit,
    "chain": plot_chain,
    "tokens": plot_tokens,
    "online": plot_online,
    "online-all": plot_online_all,
}


# ---------------------------------------------------------------------------------------------
# From inputs to a file
# ---------------------------------------------------------------------------------------------


def figure_for(inputs):
    """(kind, Figure) for a list of input paths of one kind; raises PlotInputError naming the file for an
    input of another kind, an input given twice, or bad content."""
    inputs = _as_list(inputs)
    kinds = [detect_kind(path) for path in inputs]
    seen = set()
    for path, kind in zip(inputs, kinds):
        if kind != kinds[0]:
            raise PlotInputError(f"{path}: {kind} output cannot share a figure with {inputs[0]} ({kinds[0]} output); "
                                 "give inputs of one kind")
        real = os.path.realpath(path)
        if real in seen:
            raise PlotInputError(f"{path}: given twice")
        seen.add(real)
    if kinds[0] == "tokens":
        inputs = [os.path.join(path, "results-tokens.json") if os.path.isdir(path) else path for path in inputs]
    with matplotlib.rc_context(STYLE):  # font sizes are fixed when each text is made, so around the drawing
        return kinds[0], PLOTTERS[kinds[0]](inputs)


def render(inputs, output):
    """Draw the figure for `inputs` (list of paths) into `output`; return the kind.

    Raises PlotInputError for bad input (nothing is written) and lab_io.WriteFailed when the file
    cannot be written (no partial file is left).
    """
    # finite but absurd values (say 1e308) overflow matplotlib's axis arithmetic: one line, not a traceback;
    # and whatever matplotlib warns about while drawing (a layout that cannot fit the text, a RuntimeWarning
    # of its arithmetic) is not a line for the user's stderr: what cannot be drawn is an error above
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            kind, figure = figure_for(inputs)
            save(figure, output)
        except (ArithmeticError, ValueError, np.linalg.LinAlgError) as error:
            raise PlotInputError(f"{', '.join(inputs)}: the values cannot be drawn ({type(error).__name__})") from None
    return kind


def figure_bytes(figure, extension):
    """The figure as .svg or .png bytes, deterministic (no date in the metadata, a fixed SVG id salt)."""
    buffer = io.BytesIO()
    metadata = {"Date": None} if extension == ".svg" else {"Software": None}
    try:
        with matplotlib.rc_context({"svg.hashsalt": "rl-lab", "svg.fonttype": "none"}):
            figure.savefig(buffer, format=extension[1:], metadata=metadata, dpi=120)
    finally:
        plt.close(figure)
    return buffer.getvalue()


def save(figure, output):
    """Write the figure to `output` whole (lab_io.write_files); its folder is created only now, after
    the inputs were read, so a bad input leaves nothing."""
    data = figure_bytes(figure, os.path.splitext(output)[1].lower())
    write_files({output: data})


def main(argv=None):
    parser, args = build_parser(), parse(argv)
    try:
        kind = render(args.input, args.output)
    except PlotInputError as error:
        print(f"{parser.prog}: error: {one_line(error)}", file=sys.stderr)
        return 1
    print(f"{kind} figure from {', '.join(args.input)} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
