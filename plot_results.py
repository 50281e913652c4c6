"""Redraw the lab's figures from its CSV/JSON outputs (reads files only; never imports torch).

    python plot_results.py --input results --output results/training-curves.svg
    python plot_results.py --input results-chain --output results-chain/ppo-chain.svg
    python plot_results.py --input results-tokens.json --output results-tokens.svg
    python plot_results.py --input results-online-grpo-sequence results-online-cispo-sequence --output online.png

The kind of input is detected from the files present: a folder with ppo/dpo/grpo/cispo.csv
(bandit, any subset), a folder with ppo-chain.csv (two-step chain), a token report JSON
(token_objectives.py), or one or more folders with online.csv (online GRPO/CISPO). The format
follows the --output extension: .svg (deterministic bytes) or .png.
"""

from __future__ import annotations

from lab_io import exit_quietly_on_signals

if __name__ == "__main__":  # first: a Ctrl-C while matplotlib loads below ends with one line
    exit_quietly_on_signals()

import argparse  # noqa: E402
import csv  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

from lab_io import OneLineErrorParser, one_line, output_file_problem, run_cli, write_files  # noqa: E402

# Without a writable home, matplotlib makes itself a temporary config and cache folder (removed at exit)
# and logs a warning about it that would break the one-line stderr: that warning is silenced here.
_matplotlib_log = logging.getLogger("matplotlib")
_previous_level = _matplotlib_log.level
_matplotlib_log.setLevel(logging.ERROR)
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no screen needed
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402  (installed with matplotlib)
from matplotlib.patches import Patch  # noqa: E402

_matplotlib_log.setLevel(_previous_level)

BANDIT_ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")
COLORS = {"ppo": "#1f77b4", "dpo": "#d62728", "grpo": "#2ca02c", "cispo": "#9467bd"}
INITIAL_EXPECTED_REWARD = (1.0 + 0.2 - 0.5) / 3
CHAIN_INITIAL_RETURN = 0.3
FORMATS = (".svg", ".png")
MAX_INPUT_BYTES = 64 * 2**20  # the lab's largest output is a few hundred KB; anything far larger is not one


class PlotInputError(Exception):
    """A problem with an input file: reported as one line naming the file, exit status 1."""


# ---------------------------------------------------------------------------------------------
# Reading and checking the files
# ---------------------------------------------------------------------------------------------


def _check_input_file(path):
    """Refuse what is not a regular file of a sane size before opening it: a FIFO would block forever
    and /dev/zero would never end."""
    try:
        info = os.stat(path)
    except OSError as error:
        raise PlotInputError(f"{path}: cannot read ({error.strerror or error})") from None
    if not stat.S_ISREG(info.st_mode):
        raise PlotInputError(f"{path}: not a regular file")
    if info.st_size > MAX_INPUT_BYTES:
        raise PlotInputError(f"{path}: {info.st_size} bytes, far larger than any output of the lab")


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


def detect_kind(path):
    """Return 'bandit', 'chain', 'tokens' or 'online' for an input path, or raise PlotInputError."""
    if os.path.isdir(path):
        names = set(os.listdir(path))
        if "online.csv" in names:
            return "online"
        if "ppo-chain.csv" in names:
            return "chain"
        if any(f"{algorithm}.csv" in names for algorithm in BANDIT_ALGORITHMS):
            return "bandit"
        if "results-tokens.json" in names:
            return "tokens"
        raise PlotInputError(
            f"{path}: no lab output found (expected ppo/dpo/grpo/cispo.csv, ppo-chain.csv, online.csv "
            "or results-tokens.json)"
        )
    if os.path.isfile(path) and path.endswith(".json"):
        return "tokens"
    if not os.path.exists(path):
        raise PlotInputError(f"{path}: no such file or folder")
    raise PlotInputError(f"{path}: expected an output folder or a token report .json")


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def _finish(axis, title, ylabel, xlabel="outer iteration (step)"):
    axis.set_title(title, fontsize=10)
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.grid(True, alpha=0.3)


def plot_bandit(folder):
    runs = {}
    for algorithm in BANDIT_ALGORITHMS:
        path = os.path.join(folder, f"{algorithm}.csv")
        if os.path.exists(path):
            runs[algorithm] = read_csv(
                path, ["step", "expected_reward", "best_action_probability", "kl_reference", "loss"]
            )
    figure, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    panels = [
        ("expected_reward", "Expected reward (exact)", "reward"),
        ("best_action_probability", "Best-action probability", "probability"),
        ("kl_reference", "KL(policy || reference), nats", "nats"),
        ("loss", "Loss (each method its own objective)", "loss"),
    ]
    for axis, (column, title, ylabel) in zip(axes.flat, panels):
        for algorithm, series in runs.items():
            steps = series["step"]
            values = series[column]
            if column == "loss":  # step 0 is a placeholder 0, not a measured loss
                steps, values = steps[1:], values[1:]
            axis.plot(steps, values, color=COLORS[algorithm], label=algorithm.upper(), linewidth=1.6)
        _finish(axis, title, ylabel)
    reward_axis = axes.flat[0]
    reward_axis.axhline(1.0, color="black", linestyle="--", linewidth=0.9, label="optimum 1")
    reward_axis.axhline(INITIAL_EXPECTED_REWARD, color="grey", linestyle=":", linewidth=0.9, label="uniform 0.2333")
    axes.flat[1].axhline(1 / 3, color="grey", linestyle=":", linewidth=0.9)
    axes.flat[2].axhline(math.log(3.0), color="black", linestyle="--", linewidth=0.9)
    axes.flat[2].annotate("ln 3: a deterministic policy", (0, math.log(3.0)), xytext=(2, -10),
                          textcoords="offset points", fontsize=7)
    reward_axis.legend(loc="best", fontsize=8)
    figure.suptitle(f"One-step bandit ({folder})", fontsize=11)
    return figure


def plot_chain(folder):
    series = read_csv(
        os.path.join(folder, "ppo-chain.csv"), ["step", "expected_return", "left_probability", "value_start"]
    )
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.8), constrained_layout=True)
    panels = [
        ("expected_return", "Expected return J (exact)", "return"),
        ("left_probability", "p(left | start): toward the reward", "probability"),
        ("value_start", "Critic V(start)", "value"),
    ]
    for axis, (column, title, ylabel) in zip(axes, panels):
        axis.plot(series["step"], series[column], color=COLORS["ppo"], linewidth=1.6)
        _finish(axis, title, ylabel)
    axes[0].axhline(1.0, color="black", linestyle="--", linewidth=0.9, label="optimum 1")
    axes[0].axhline(CHAIN_INITIAL_RETURN, color="grey", linestyle=":", linewidth=0.9, label="uniform 0.3")
    axes[2].axhline(1.0, color="black", linestyle="--", linewidth=0.9)
    axes[0].legend(loc="best", fontsize=8)
    figure.suptitle(f"Two-step chain, PPO + GAE ({folder})", fontsize=11)
    return figure


def _finite_number(path, where, value):
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer beyond the float range
        number = math.nan
    if not math.isfinite(number):
        raise PlotInputError(f"{path}: {where} is missing or not a finite number")
    return number


def plot_tokens(path):
    report = read_json(path)
    objectives = [name for name in ("dpo", "grpo", "cispo") if isinstance(report, dict) and isinstance(report.get(name), dict)]
    if not objectives:
        raise PlotInputError(f"{path}: not a token report (no dpo/grpo/cispo sections)")
    keys = ("initial_loss", "final_loss", "gradient_norm")
    values = {name: [_finite_number(path, f"{name}.{key}", report[name].get(key)) for key in keys] for name in objectives}
    reduction = report.get("reduction") if isinstance(report.get("reduction"), dict) else None
    panels = 3 if reduction else 2
    figure, axes = plt.subplots(1, panels, figsize=(5 * panels, 3.9), constrained_layout=True)
    positions = list(range(len(objectives)))
    labels = [name.upper() for name in objectives]
    colors = [COLORS[name] for name in objectives]
    width = 0.38
    for offset, index, shade in ((-width / 2, 0, 0.4), (width / 2, 1, 1.0)):
        bars = axes[0].bar([p + offset for p in positions], [values[name][index] for name in objectives], width,
                           color=colors, alpha=shade)
        axes[0].bar_label(bars, fmt="%.4f", fontsize=7)
    axes[0].axhline(0.0, color="black", linewidth=0.8)
    axes[0].set_xticks(positions, labels)
    axes[0].legend(handles=[Patch(facecolor="grey", alpha=0.4, label="before the step"),
                            Patch(facecolor="grey", label="after one SGD step (lr 0.1)")], fontsize=8)
    _finish(axes[0], "Loss before / after one step\n(each objective its own scale: do not compare)", "loss", "objective")
    bars = axes[1].bar(positions, [values[name][2] for name in objectives], color=colors)
    axes[1].bar_label(bars, fmt="%.6f", fontsize=7)
    axes[1].set_xticks(positions, labels)
    _finish(axes[1], "Gradient norm at the initial table\n(GRPO and CISPO identical at ratio 1)", "L2 norm", "objective")
    if reduction:
        contrast = [_finite_number(path, "reduction.per_response_mean", reduction.get("per_response_mean")),
                    _finite_number(path, "reduction.global_token_mean", reduction.get("global_token_mean"))]
        bars = axes[2].bar([0, 1], contrast, color=["#2ca02c", "#ff7f0e"])
        axes[2].bar_label(bars, fmt="%.4f", fontsize=8)
        axes[2].set_xticks([0, 1], ["per response,\nthen mean", "global token\nmean"])
        axes[2].axhline(0.0, color="black", linewidth=0.8)
        _finish(axes[2], "Same per-token GRPO loss, two reductions\n(-1 + 1)/2 = 0 vs (-2 + 3)/5 = 0.2", "loss",
                "reduction")
    figure.suptitle(f"Token-sequence objectives ({os.path.basename(path)})", fontsize=11)
    return figure


ONLINE_COLUMNS = ["step", "success_rate", "success_probability", "mean_response_length", "kl_k3"]


def plot_online(folders):
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8), constrained_layout=True)
    panels = [
        ("success_rate", "Success: sampled batch (solid), exact policy (dashed)", "share"),
        ("mean_response_length", "Mean response length (tokens, EOS included)", "tokens"),
        ("kl_k3", "k3 KL(sampling policy || reference) per token", "nats"),
    ]
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, folder in enumerate(folders):
        series = read_csv(os.path.join(folder, "online.csv"), ONLINE_COLUMNS)
        label = os.path.basename(os.path.normpath(folder))
        color = cycle[index % len(cycle)]
        for axis, (column, _, _) in zip(axes, panels):
            axis.plot(series["step"], series[column], color=color, label=f"{label} (sampled)" if axis is axes[0] else label,
                      linewidth=1.5, alpha=0.85)
        # the exact probability of the correct answer after each update, beside the noisy sampled rate
        axes[0].plot(series["step"], series["success_probability"], color=color, linestyle="--", linewidth=1.2,
                     label=f"{label} (exact, after update)")
    for axis, (_, title, ylabel) in zip(axes, panels):
        _finish(axis, title, ylabel, "iteration")
    axes[0].axhline(1.0, color="black", linestyle="--", linewidth=0.9)
    axes[0].legend(loc="best", fontsize=8)
    figure.suptitle("Online token-level GRPO / CISPO", fontsize=11)
    return figure


def render(inputs, output):
    """Draw the figure for `inputs` (list of paths) into `output`.

    Raises PlotInputError for bad input (nothing is written) and lab_io.WriteFailed when the file
    cannot be written (no partial file is left).
    """
    kinds = [detect_kind(path) for path in inputs]
    if len(inputs) > 1 and set(kinds) != {"online"}:
        raise PlotInputError(f"{inputs[1]}: several inputs are only supported for online run folders")
    kind = kinds[0]
    # finite but absurd values (say 1e308) overflow matplotlib's axis arithmetic: one line, not a traceback
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            if kind == "bandit":
                figure = plot_bandit(inputs[0])
            elif kind == "chain":
                figure = plot_chain(inputs[0])
            elif kind == "tokens":
                path = inputs[0]
                figure = plot_tokens(os.path.join(path, "results-tokens.json") if os.path.isdir(path) else path)
            else:
                figure = plot_online(inputs)
            save(figure, output)
        except (ArithmeticError, ValueError, np.linalg.LinAlgError) as error:
            plt.close("all")
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
                        help="a bandit or chain output folder, a token report .json, or one or more online run folders")
    parser.add_argument("--output", default="results/training-curves.svg",
                        help="figure file; the extension chooses the format: .svg (deterministic) or .png; "
                             "a missing folder is created")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = output_problem(args.output)
    if problem is not None:
        parser.error(f"argument --output: {problem}")
    try:
        kind = render(args.input, args.output)
    except PlotInputError as error:
        print(f"{parser.prog}: error: {one_line(error)}", file=sys.stderr)
        return 1
    print(f"{kind} figure from {', '.join(args.input)} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
