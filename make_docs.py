"""Render the guide (docs/*.md) and README.txt from their templates and the committed results.

    python make_docs.py             # rewrite README.txt and every page of docs/ (after new results)
    python make_docs.py --check     # write nothing; exit 1 naming the first page and line that differs
    python -m unittest -v test_make_docs

No measured number is typed into a page: a template (docs/templates/) holds the prose and placeholders,
and every number, table and flag list is rendered from the committed results (results/, results-chain/,
results-tokens.json, results-online-*/, results-experiments/, results-bridge/conformance.md, the timings
of results-bench/*.json with the machine they were measured on) or from the
code itself (each program's argparse parser, the atoms' docstrings, library_map's table, the test files).

A placeholder is `{{ EXPRESSION }}` or `{{ EXPRESSION:FORMAT }}`, on one line: a Python f-string
replacement field evaluated against the names of `namespace(root)`, e.g.

    {{bandit.ppo.final.expected_reward:.4f}}        one number of results/ppo.json, 4 decimals
    {{bandit_rows.grpo[1].clip_fraction:.3f}}       row step=1 of results/grpo.csv
    {{online.transformer.evaluation.after["pass@1"]:.3f}}
    {{flags("online_tokens.py")}}                   a Markdown table of the program's flags, from its parser

JSON objects and CSV rows read as attributes (`.final`) or items (`["pass@1"]`); CSV cells that hold a
number are numbers. The pages, in order: README.txt (docs/templates/README.txt); docs/NAME.md for each
docs/templates/NAME.md; docs/algorithms/NAME.md for each docs/templates/algorithms/NAME.md, whose
sections fill the one skeleton docs/templates/_algorithm.md; docs/learn/NAME.md (the course) for each
docs/templates/learn/NAME.md, with the chapter reports of results-course/ as `course["NN-name"]`;
docs/atlas/NAME.md for each folder of results-experiments/, from docs/templates/_experiment.md. docs/
holds only rendered pages: a page is added as a template. A .md file under docs/ that no template renders
(a page whose template or folder is gone, or a file of the user's) is never deleted: a write names it, and
--check fails on it until it is removed by hand.
"""

from __future__ import annotations

import argparse
import ast
import csv
import dataclasses
import functools
import importlib
import inspect
import json
import os
import re
import stat
import sys
import textwrap

from atlas.claims import count_text
from lab.io import OneLineErrorParser, input_file_problem, run_cli, write_files

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join("docs", "templates")
README = "README.txt"
PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}")
SECTION = re.compile(r"^<!-- section: ([a-z_]+) -->$")

# Every program of the lab, and the module whose build_parser() is its command line.
PROGRAMS = {
    "rl_lab.py": "rl_lab", "ppo_chain.py": "ppo_chain", "token_objectives.py": "token_objectives",
    "online_tokens.py": "online_tokens", "sft.py": "sft", "experiments.py": "experiments",
    "plot_results.py": "plot_results", "bench.py": "bench", "library_map.py": "library_map",
    "bridge.py": "bridge", "exercises.py": "exercises", "course.py": "course", "make_docs.py": "make_docs",
}
# The algorithm pages: each a content file docs/templates/algorithms/NAME.md with these sections, in the
# skeleton's order (the skeleton gives every page the same headings).
# The sections of each docs/templates/algorithms/*.md, in page order: the lesson first (background, key
# equations derived, pseudocode, the lab's runs and numbers), then the reference (contract, libraries, papers)
ALGORITHM_SECTIONS = ("title", "background", "equations", "pseudocode", "runs", "measured", "atom", "libraries",
                      "papers")
BANDIT_ALGORITHMS = ("ppo", "dpo", "grpo", "cispo")
ONLINE_RUNS = {"grpo": "results-online-grpo-sequence", "cispo": "results-online-cispo-sequence",
               "transformer": "results-online-transformer-grpo-sequence"}
ATLAS = "results-experiments"
COURSE = "results-course"  # python course.py: one <chapter>.json per chapter of docs/learn/
CONFORMANCE = os.path.join("results-bridge", "conformance.md")
BENCH = os.path.join("results-bench", "transformer.json")  # python bench.py --part transformer --output BENCH
SUITE_BENCH = os.path.join("results-bench", "suite.json")  # python bench.py --part suite --runs 3 --output SUITE_BENCH
ATLAS_TIMINGS = os.path.join("results-bench", "atlas.json")  # python experiments.py all --timings ATLAS_TIMINGS
LEARNER_FILE_START = '"""My atoms: '  # how exercises.py start begins a learner's file (exercises.HEADER)
ARXIV = re.compile(r"arXiv[ :]*([0-9]{4}\.[0-9]{4,5})")
# What each cited arXiv id is. An id cited in the code but missing here is listed without a title.
ARXIV_TITLES = {
    "1506.02438": "Schulman et al., High-Dimensional Continuous Control Using Generalized Advantage Estimation (GAE)",
    "1707.06347": "Schulman et al., Proximal Policy Optimization Algorithms (PPO)",
    "1712.00378": "Pardo et al., Time Limits in Reinforcement Learning",
    "1802.01561": "Espeholt et al., IMPALA (V-trace: truncated importance sampling)",
    "1904.09751": "Holtzman et al., The Curious Case of Neural Text Degeneration (top-p sampling)",
    "1909.08593": "Ziegler et al., Fine-Tuning Language Models from Human Preferences",
    "1912.09729": "Ye et al., Mastering Complex Control in MOBA Games with Deep RL (dual-clip PPO)",
    "2107.03374": "Chen et al., Evaluating Large Language Models Trained on Code (the pass@k estimator)",
    "2203.02155": "Ouyang et al., Training language models to follow instructions with human feedback (InstructGPT)",
    "2210.10760": "Gao et al., Scaling Laws for Reward Model Overoptimization",
    "2305.10425": "Zhao et al., SLiC-HF: Sequence Likelihood Calibration with Human Feedback",
    "2305.18290": "Rafailov et al., Direct Preference Optimization (DPO)",
    "2309.06657": "Liu et al., Statistical Rejection Sampling Improves Preference Optimization (RSO)",
    "2310.12036": "Azar et al., A General Theoretical Paradigm to Understand Learning from Human Preferences (IPO)",
    "2402.03300": "Shao et al., DeepSeekMath (GRPO, the k3 KL term)",
    "2402.14740": "Ahmadian et al., Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human "
                  "Feedback in LLMs (RLOO)",
    "2403.00409": "Chowdhury et al., Provably Robust DPO: Aligning Language Models with Noisy Feedback (rDPO)",
    "2404.19733": "Pang et al., Iterative Reasoning Preference Optimization (RPO)",
    "2405.14734": "Meng et al., SimPO: Simple Preference Optimization with a Reference-Free Reward",
    "2405.19107": "Richemond et al., Offline Regularised Reinforcement Learning for Large Language Models Alignment "
                  "(DRO)",
    "2410.08847": "Razin et al., Unintentional Unalignment: Likelihood Displacement in Direct Preference Optimization",
    "2501.03262": "Hu et al., REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    "2501.12948": "DeepSeek-AI, DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement Learning",
    "2501.17161": "Chu et al., SFT Memorizes, RL Generalizes: A Comparative Study of Foundation Model Post-training",
    "2503.14286": "Le Roux et al., Tapered Off-Policy REINFORCE: Stable and Efficient Reinforcement Learning for LLMs "
                  "(TOPR)",
    "2503.14476": "Yu et al., DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    "2503.19595": "Tang et al., Optimizing Language Models for Inference Time Objectives using Reinforcement Learning "
                  "(pass@k advantages)",
    "2503.20783": "Liu et al., Understanding R1-Zero-Like Training: A Critical Perspective (Dr. GRPO)",
    "2504.02546": "Chu et al., GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning",
    "2504.13837": "Yue et al., Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the "
                  "Base Model?",
    "2505.07291": "Prime Intellect Team, INTELLECT-2: A Reasoning Model Trained Through Globally Decentralized "
                  "Reinforcement Learning (two-sided clip)",
    "2505.17508": "Zhang et al., On the Design of KL-Regularized Policy Gradient Algorithms for LLM Reasoning (RPG)",
    "2505.22312": "He et al., Skywork Open Reasoner 1 Technical Report (adaptive entropy control)",
    "2505.22617": "Cui et al., The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models "
                  "(Clip-Cov, KL-Cov)",
    "2505.23585": "Hao et al., On-Policy RL with Optimal Reward Baseline (OPO)",
    "2506.01347": "Zhu et al., The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning",
    "2506.01939": "Wang et al., Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement "
                  "Learning for LLM Reasoning",
    "2506.09477": "Tang and Munos, On a Few Pitfalls in KL Divergence Gradient Estimation for RL",
    "2506.10947": "Shao et al., Spurious Rewards: Rethinking Training Signals in RLVR",
    "2506.13585": "MiniMax, MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention (CISPO)",
    "2507.18071": "Zheng et al., Group Sequence Policy Optimization (GSPO)",
    "2507.20673": "Zhao et al., Geometric-Mean Policy Optimization (GMPO)",
    "2508.08221": "Liu et al., Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning (Lite PPO)",
    "2509.04259": "Shenfeld, Pari and Agrawal, RL's Razor: Why Online Reinforcement Learning Forgets Less",
    "2509.20712": "Su et al., CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in "
                  "Reinforcement Learning",
    "2510.00977": "Wu et al., It Takes Two: Your GRPO Is Secretly DPO",
    "2510.01161": "Zheng, Zhao and Chen, Prosperity before Collapse: How Far Can Off-Policy RL Reach with Stale Data "
                  "on LLMs? (M2PO)",
    "2510.13786": "Khatri et al., The Art of Scaling Reinforcement Learning Compute for LLMs (ScaleRL)",
    "2511.20347": "Gao et al., Soft Adaptive Policy Optimization (SAPO)",
    "2512.02556": "DeepSeek-AI, DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models",
    "2512.21852": "Shah et al., A Comedy of Estimators: On KL Regularization in RL Training of LLMs",
    "2601.05242": "Liu et al., GDPO: Group reward-Decoupled Normalization Policy Optimization for Multi-reward RL "
                  "Optimization",
    "2602.02710": "Tajwar et al., Maximum Likelihood Reinforcement Learning (MaxRL)",
    "2602.04879": "Qi et al., Rethinking the Trust Region in LLM Reinforcement Learning (DPPO)",
    "2602.05261": "Liu et al., Length-Unbiased Sequence Policy Optimization: Revealing and Controlling Response "
                  "Length Variation in RLVR (LUSPO)",
    "2602.10693": "Shen et al., VESPO: Variational Sequence-Level Soft Policy Optimization for Off-Policy LLM Training",
}


class RenderError(Exception):
    """A template that cannot be rendered: the message names the template, the line and the placeholder."""


# ---------------------------------------------------------------------------------------------
# Reading the committed results
# ---------------------------------------------------------------------------------------------


class Data(dict):
    """A JSON object or CSV row whose keys also read as attributes: `run.final.expected_reward`."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no key {name!r} (keys: {', '.join(map(str, self))})") from None


def _open_result(root, relative, **options):
    """Open a committed result for reading, or raise RenderError naming it: a FIFO, a device or a huge file
    in its place is refused before it is opened (it would block or never end)."""
    path = os.path.join(root, relative)
    problem = input_file_problem(path)
    if problem is not None:
        raise RenderError(f"{relative}: {problem}")
    try:
        return open(path, encoding="utf-8", **options)
    except OSError as error:
        raise RenderError(f"{relative}: cannot read ({error.strerror or error})") from None


def read_json(root, relative):
    with _open_result(root, relative) as handle:
        try:
            return json.load(handle, object_hook=Data)
        except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError too
            raise RenderError(f"{relative}: not valid JSON ({type(error).__name__}: {error})") from None


def _cell(text):
    """A CSV cell as the number it holds (int or float), or the text itself."""
    try:
        value = float(text)
    except ValueError:
        return text
    return int(text) if text.lstrip("-").isdigit() else value


def read_csv(root, relative):
    """The rows of a committed CSV as Data (numbers as numbers); RenderError naming the file when it cannot
    be read or has no data row (every CSV the lab writes has one)."""
    with _open_result(root, relative, newline="") as handle:
        try:
            rows = [Data({key: _cell(value) for key, value in row.items()}) for row in csv.DictReader(handle)]
        except (ValueError, csv.Error) as error:
            raise RenderError(f"{relative}: not a readable CSV ({type(error).__name__}: {error})") from None
    if not rows:
        raise RenderError(f"{relative}: no data rows")
    return rows


def read_text(root, relative):
    with _open_result(root, relative) as handle:
        try:
            return handle.read()
        except ValueError as error:
            raise RenderError(f"{relative}: not UTF-8 text ({error})") from None


def course_reports(root):
    """The chapter reports of results-course/ (file names), in the course's order."""
    folder = os.path.join(root, COURSE)
    return sorted(name for name in os.listdir(folder) if name.endswith(".json")) if os.path.isdir(folder) else []


def experiment_folders(root):
    """The folders of results-experiments/ that hold a settings.json, in name order."""
    folder = os.path.join(root, ATLAS)
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if os.path.isfile(os.path.join(folder, name, "settings.json")))


# ---------------------------------------------------------------------------------------------
# Markdown helpers
# ---------------------------------------------------------------------------------------------

_ESCAPED = str.maketrans({"\\": "\\\\", "|": "\\|", "*": "\\*", "_": "\\_", "`": "\\`", "[": "\\[", "]": "\\]",
                          "<": "&lt;", ">": "&gt;"})


def escape(text):
    """Text for a Markdown table cell, shown as it is (no emphasis, no HTML, no cell break)."""
    return str(text).translate(_ESCAPED)


def unescape(text):
    """The inverse of `escape`."""
    text = text.replace("&lt;", "<").replace("&gt;", ">")
    return re.sub(r"\\(.)", r"\1", text)


def prose(text):
    """Like `escape`, but a `span` in backticks stays inline code (a docstring's names read as code)."""
    parts = re.split(r"`([^`]+)`", str(text))  # even indexes: prose, odd: what was in backticks
    return "".join(code(part) if index % 2 else escape(part) for index, part in enumerate(parts))


def code(text):
    """Inline code in a table cell (a | still ends a cell inside backticks on GitHub)."""
    return "`" + str(text).replace("|", "\\|") + "`"


def number(value, digits=4):
    """A number for a page: integers as they are; floats from 0.01 to 1e6 with `digits` decimals and no
    trailing zeros, others in scientific notation with `digits` significant digits."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if value == 0:
        return "0"
    if 0.01 <= abs(value) < 1e6:
        return f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return f"{value:.{digits - 1}e}"


def numbers(values, digits=4):
    """A (nested) list of numbers as "[0, 1.5, -0.5]", each with `digits` significant digits."""
    if isinstance(values, (list, tuple)):
        return "[" + ", ".join(numbers(value, digits) for value in values) + "]"
    return number(values, digits)


def table(rows, columns, headers=None, formats=None):
    """A Markdown table of `rows` (dicts): one column per key of `columns`; formats {column: spec or
    callable}, default `number`."""
    formats = formats or {}
    lines = ["| " + " | ".join(headers or columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        cells = []
        for column in columns:
            value, shape = row[column], formats.get(column)
            if callable(shape):
                cells.append(shape(value))
            elif shape is not None:
                cells.append(format(value, shape))
            else:
                cells.append(number(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def transpose(columns, keys):
    """Rows (dicts with an "entry" index) from a dict of equal-length lists, e.g. a JSON trace."""
    return [Data({"entry": index, **{key: columns[key][index] for key in keys}})
            for index in range(len(columns[keys[0]]))]


def mean_of(rows, column, start=1):
    """The mean of a column over rows[start:] (row 0 of every CSV is the initial evaluation)."""
    values = [row[column] for row in rows[start:]]
    return sum(values) / len(values)


def change(before, after, digits=4):
    """"rises from 0.2196 to 0.441" or "falls from ..." or "stays at ...": a measured change in words."""
    if after == before:
        return f"stays at {number(after, digits)}"
    return f"{'rises' if after > before else 'falls'} from {number(before, digits)} to {number(after, digits)}"


def task_of(settings):
    """The task's description inside an online run's settings (nested under task_settings, or at the top
    level in runs written before it was nested)."""
    return settings.get("task_settings", settings)


def difficulty_summary(settings, split):
    """countdown.CountdownTask.difficulty_summary(split) of the task an online run's settings describe."""
    return json.loads(_difficulty_summary_text(json.dumps(task_of(settings)["config"], sort_keys=True), split),
                      object_hook=Data)


@functools.lru_cache(maxsize=None)
def _difficulty_summary_text(config, split):
    """The summary as JSON text, computed once per task and split (building the task enumerates every
    prompt's solutions; a page quotes it several times and the tests render every page often)."""
    countdown = importlib.import_module("countdown")
    task = countdown.CountdownTask(countdown.CountdownConfig(**json.loads(config)))
    return json.dumps(task.difficulty_summary(split))


def pins(root, filename, *packages):
    """The pinned "name==version" lines of a requirements file for `packages`."""
    lines = read_text(root, filename).splitlines()
    return [line.split()[0] for line in lines if line.split("==")[0] in packages]


def block(text, language="text"):
    return f"```{language}\n{text.rstrip()}\n```"


# ---------------------------------------------------------------------------------------------
# From the code: flags, docstrings, atoms, tests, citations
# ---------------------------------------------------------------------------------------------


def parser_of(program):
    return importlib.import_module(PROGRAMS[program]).build_parser()


def split_default(help_text):
    """(default, help without its trailing "(default: ...)") of a flag's help as --help prints it; the
    default is "" for a flag whose help states none."""
    if help_text.endswith(")") and "(default: " in help_text:
        start = help_text.rindex("(default: ")
        return help_text[start + len("(default: "):-1], help_text[:start].rstrip()
    if help_text.endswith(")") and "default: " in help_text:  # "(see ...; default: off, train)": keep it whole
        return help_text[help_text.rindex("default: ") + len("default: "):-1], help_text
    return "", help_text


def flag_rows(program):
    """[{flag, values, default, help}] of every argument of a program's parser, as --help shows them."""
    parser = parser_of(program)
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                rows.append({"flag": choice.dest, "values": "(command)", "default": "", "help": choice.help or ""})
            continue
        expanded = formatter._expand_help(action) if action.help else ""
        default, description = split_default(" ".join(expanded.split()))
        if action.option_strings:
            flag = ", ".join(action.option_strings)
        else:
            flag = action.metavar or action.dest
        if action.choices is not None and action.option_strings:
            values = "{" + ",".join(map(str, action.choices)) + "}"
        elif action.nargs == 0:
            values = ""
        elif isinstance(action.metavar, tuple):
            values = " ".join(action.metavar)
        else:
            values = action.metavar or action.dest.upper()
            values += " ..." if action.nargs in ("+", "*") else ""
        rows.append({"flag": flag, "values": values, "default": default, "help": description})
    return rows


def flags(program, only=None):
    """The flags table of a program (a marker comment first, so that the tests find it); only: the
    option strings to show (all when None)."""
    lines = [f"<!-- flags of {program} -->", "| flag | values | default | what it does |", "|---|---|---|---|"]
    for row in flag_rows(program):
        if only is not None and row["flag"] not in only:
            continue
        values = code(row["values"]) if row["values"] else ""
        lines.append(f"| {code(row['flag'])} | {values} | {escape(row['default'])} "
                     f"| {escape(row['help'])} |")
    if len(lines) == 3:  # a program without flags: no empty table
        return f"{lines[0]}\nNo flag but `--help`."
    return "\n".join(lines)


def algorithm_flags(algorithm):
    """The flags of online_tokens.py that apply to `algorithm` and not to every algorithm."""
    settings = importlib.import_module("online_settings")
    every = importlib.import_module("online_algorithms").ALGORITHMS
    options = [item.option for item in settings.SETTINGS
               if algorithm in settings.APPLIES[item.name] and settings.APPLIES[item.name] != every]
    return flags("online_tokens.py", only=options)


def _module_tree(root, filename):
    """The parsed source of a module, read now (the parse is cached by the source's text: a copy of the lab,
    or a render after an edit, parses only what changed). Read only: never change the tree."""
    with open(os.path.join(root, filename), encoding="utf-8") as handle:
        return _parsed(handle.read())


@functools.cache
def _parsed(source):
    return ast.parse(source)


def module_docstring(root, filename):
    """A module's docstring, read from the top of its source (the lab's modules all start with one)."""
    match = re.match(r'\s*(?:#[^\n]*\n\s*)*"""(.*?)"""', read_text(root, filename), re.DOTALL)
    return inspect.cleandoc(match.group(1)) if match else ""


def commands(root, filename):
    """The runnable command lines at the top of a module's docstring (the lab's convention), as a block."""
    lines = [line.strip() for line in module_docstring(root, filename).splitlines()
             if line.startswith(("    python", "    .venv"))]
    return block("\n".join(lines), "sh")


def _functions(root, filename):
    return {node.name: node for node in _module_tree(root, filename).body
            if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


def signature(root, filename, name):
    node = _functions(root, filename)[name]
    return f"{name}({ast.unparse(node.args)})"


def docstring(root, filename, name):
    node = _functions(root, filename).get(name)
    if node is None:
        raise KeyError(f"{filename} has no function {name!r}")
    return ast.get_docstring(node) or ""


def atom(root, name, filename="rl_lab.py"):
    """An atom's signature and whole docstring (its contract), as a code block, and where it lives."""
    return (f"`{signature(root, filename, name)}` in `{filename}`\n\n"
            + block(docstring(root, filename, name)))


def atom_families(root):
    """[(family, [(name, first paragraph of its docstring)])] of rl_lab.py's atoms: the public functions between
    its "Atoms" and "bandit" headers, grouped by the "# --- family ---" comments."""
    with open(os.path.join(root, "rl_lab.py"), encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    functions = _functions(root, "rl_lab.py")
    families, inside = [], False
    for line in lines:
        if line == "# Atoms":
            inside = True
        elif line.startswith("# The one-step contextual bandit"):
            break
        elif inside and line.startswith("# --- "):
            families.append((line.strip("# -"), []))
        elif inside and families and line.startswith("def ") and not line.startswith("def _"):
            name = line[4:line.index("(")]
            first = (ast.get_docstring(functions[name]) or "").split("\n\n")[0]
            families[-1][1].append((name, " ".join(first.split())))
        elif inside and families and re.match(r"^[a-z_0-9]+ = [a-z_]+$", line):  # an alias: kl_k3 = token_kl_penalty
            alias, target = line.split(" = ")
            families[-1][1].append((alias, f"the same function object as `{target}`"))
    return families


def atoms_index(root):
    lines = []
    for family, names in atom_families(root):
        lines += ["", f"### {family[0].upper() + family[1:]}", "",
                  "| atom | what it computes (first paragraph of its docstring) |", "|---|---|"]
        lines += [f"| `{name}` | {prose(summary)} |" for name, summary in names]
    return "\n".join(lines).strip()


def test_files(root):
    """A table of the test files and what each checks (its docstring's first paragraph). No counts: they
    would change with every test added, and `python -m unittest` prints them."""
    rows = []
    for filename in (name for name in lab_python_files(root) if name.startswith("test_")):
        first = module_docstring(root, filename).split("\n\n")[0]
        rows.append(f"| `{filename}` | {prose(' '.join(first.split()))} |")
    return "\n".join(["| file | what it checks (its docstring) |", "|---|---|"] + rows)


def lab_python_files(root):
    """The lab's own Python files in `root`, sorted: every *.py but a learner's file of exercises (it starts
    as exercises.HEADER does, whatever --file named it), so that following the course changes no page."""
    return sorted(name for name in os.listdir(root) if name.endswith(".py")
                  and not read_text(root, name).startswith(LEARNER_FILE_START))


def citations(root):
    """{arXiv id: sorted files that cite it} over the lab's Python files (the atlas/ package's too) and the
    atlas's settings."""
    found = {}
    names = lab_python_files(root)
    names += sorted(os.path.join("atlas", name) for name in os.listdir(os.path.join(root, "atlas"))
                    if name.endswith(".py"))
    names += [os.path.join(ATLAS, folder, "settings.json") for folder in experiment_folders(root)]
    for name in names:
        if name == "make_docs.py":
            continue
        for arxiv_id in ARXIV.findall(read_text(root, name)):
            found.setdefault(arxiv_id, set()).add(name.split(os.sep)[0] if name.startswith(ATLAS) else name)
    return {arxiv_id: sorted(files) for arxiv_id, files in sorted(found.items())}


def arxiv_table(root):
    lines = ["| arXiv | paper | cited in |", "|---|---|---|"]
    for arxiv_id, files in citations(root).items():
        title = ARXIV_TITLES.get(arxiv_id, "(no title recorded in make_docs.ARXIV_TITLES)")
        lines.append(f"| {arxiv_id} | {escape(title)} | {', '.join(f'`{name}`' for name in files)} |")
    return "\n".join(lines)


def paper(arxiv_id):
    """A cited paper: its title as recorded in ARXIV_TITLES, and its arXiv id."""
    return f"{ARXIV_TITLES[arxiv_id]}, arXiv {arxiv_id}"


def library_table():
    return block(importlib.import_module("library_map").readme_table())


def _for_algorithm(setting, algorithm):
    """A row's lab setting concerns `algorithm`: it names it, or names no algorithm at all."""
    return algorithm is None or "--algorithm" not in setting or f"--algorithm {algorithm}" in setting


def map_rows(*settings, algorithm=None):
    """The rows of library_map.TABLE whose lab setting contains one of `settings` (and, with `algorithm`,
    names that algorithm or none), as a Markdown table."""
    rows = [row for row in importlib.import_module("library_map").TABLE
            if any(setting in row[0] for setting in settings) and _for_algorithm(row[0], algorithm)]
    lines = ["| lab setting | TRL | verl | what still differs |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(escape(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def library_options(**options):
    """What library_map.library_blocks gives for an online run with `options` (resolved as the online
    driver resolves them): each library's config, options, unmatched settings and differences."""
    blocks = importlib.import_module("library_map").library_blocks(
        importlib.import_module("bridge").run_settings(options))
    shown = " ".join(f"--{key.replace('_', '-')}" + ("" if value is True else f" {value}")
                     for key, value in options.items())
    lines = [f"`online_tokens.py {shown}`".replace(" `", "`") if shown else "`online_tokens.py`"]
    for library in ("trl", "verl"):
        item = blocks[library]
        name = {"trl": "TRL", "verl": "verl"}[library]
        if item.get("options") is None:
            lines += ["", f"- **{name}**: none. {escape(item.get('reason', ''))}"]
            continue
        lines += ["", f"- **{name}** (`{item['config']}`):", ""]
        lines += ["  " + line for line in block("\n".join(f"{key}={json.dumps(value)}"
                                                          for key, value in item["options"].items())).splitlines()]
        for key, reason in item.get("unmatched", {}).items():
            lines.append(f"  - unmatched `{key}`: {escape(reason)}")
        for difference in item.get("differences", []):
            lines.append(f"  - differs: {escape(difference)}")
    return "\n".join(lines)


def conformance_rows(root, *settings, algorithm=None):
    """The rows of the committed conformance table (results-bridge/conformance.md, its first table) whose
    lab setting contains one of `settings` (and, with `algorithm`, names it or no algorithm), with its
    header."""
    lines = read_text(root, CONFORMANCE).split("\n\n")[0].strip().splitlines()
    kept = [line for line in lines[2:] if any(setting in line.split(" | ")[0] for setting in settings)
            and _for_algorithm(line.split(" | ")[0], algorithm)]
    return "\n".join(lines[:2] + kept)


def figure_kinds():
    """The plotter's input kinds (plot_results.FOLDER_MARKERS, PLOTTERS) as a table, in detection order."""
    plot_results = importlib.import_module("plot_results")
    lines = ["| kind | detected by | drawn by |", "|---|---|---|"]
    for kind, markers in plot_results.FOLDER_MARKERS:
        function = plot_results.PLOTTERS.get(kind)
        name = getattr(function, "__name__", str(function))
        lines.append(f"| {kind} | {', '.join(f'`{marker}`' for marker in markers)} | `{name}` |")
    return "\n".join(lines)


def applies_table():
    """Which online setting applies to which algorithm (online_settings.APPLIES), as a table."""
    settings = importlib.import_module("online_settings")
    algorithms = importlib.import_module("online_algorithms").ALGORITHMS
    lines = ["| setting | flag | " + " | ".join(algorithms) + " | policies |",
             "|---|---|" + "---|" * len(algorithms) + "---|"]
    for item in settings.SETTINGS:
        marks = ["x" if algorithm in settings.APPLIES[item.name] else "" for algorithm in algorithms]
        policies = ", ".join(item.policies) if item.policies else "all"
        lines.append(f"| {item.name} | `{item.option}` | " + " | ".join(marks) + f" | {policies} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The atlas
# ---------------------------------------------------------------------------------------------


# what a reader of an atlas table needs to know about a metric to read its numbers, shown under the table
METRIC_NOTES = {
    "sampler_kl": "`sampler_kl` is a sampled estimate, not the exact KL(sampler || trainer): the k1 estimator, the "
                  "mean of log p_sampler - log p_trainer over the tokens the sampler drew. Its terms have either "
                  "sign, so the estimate of a KL this close to 0 can come out negative (k3, whose terms are never "
                  "negative, is not what this column logs).",
}


class Experiment:
    """One folder of results-experiments/, read generically: its settings.json (claim, source, command,
    configurations, and the claims' verdicts where the folder has them) and its summary.md."""

    def __init__(self, root, name):
        self.root, self.name = root, name
        self.folder = os.path.join(ATLAS, name)
        self.settings = read_json(root, os.path.join(self.folder, "settings.json"))
        self.files = sorted(os.listdir(os.path.join(root, self.folder)))

    def get(self, key, default=""):
        return self.settings.get(key, default)

    def verdicts(self):
        """One line per judged claim, naming its kind ("claim: holds, 5 of 5 seeds above 0: TEXT"), or a
        sentence saying there is none."""
        claims = [claim for claim in self.settings.get("claims") or []
                  if isinstance(claim, dict) and "verdict" in claim]
        lines = []
        for claim in claims:
            kind = f"{claim['kind']}: " if "kind" in claim else ""
            count = f", {count_text(claim)}" if claim.get("count") else ""
            lines.append(f"- {kind}**{claim['verdict']}**{count}: {claim.get('claim', '')}")
        if not lines and "verdict" in self.settings:
            lines.append(f"- **{self.settings['verdict']}**")
        return "\n".join(lines) if lines else ("No verdict recorded in this folder: it was written before the "
                                               "atlas judged its claims.")

    def summary(self):
        """summary.md without its title paragraph ("**name**: ...") and without the claim, which the page
        shows from settings.json: its tables, notes and statistics, in its own order."""
        if "summary.md" not in self.files:
            return "(no summary.md in this folder)"
        text = read_text(self.root, os.path.join(self.folder, "summary.md"))
        paragraphs = [part.strip() for part in re.split(r"\n\s*\n", text) if part.strip()]
        if paragraphs and paragraphs[0].startswith("**"):
            paragraphs = paragraphs[1:]
        return "\n\n".join(part for part in paragraphs if part != self.settings.get("claim", "").strip())

    def metric_notes(self):
        """The METRIC_NOTES of the metrics this folder's table shows, each as a paragraph after the summary
        ("" when it shows none)."""
        return "".join(f"\n\n{METRIC_NOTES[name]}" for name in self.settings.get("metrics", []) if name in METRIC_NOTES)

    def configurations(self):
        rows = []
        for configuration in self.settings.get("configurations", []):
            label = " ".join(f"{key}={value}" for key, value in configuration.get("label", {}).items())
            options = ", ".join(f"{key}={json.dumps(value)}" for key, value in configuration.get("options", {}).items())
            runner = configuration.get("runner", "")
            rows.append(f"| {escape(label)} | `{runner}` | {escape(options) or '(defaults)'} |")
        if not rows:
            return ""
        return "\n".join(["| configuration | runner | options |", "|---|---|---|"] + rows)

    def figures(self):
        return [name for name in self.files if name.endswith((".svg", ".png"))]

    def file_links(self):
        return ", ".join(f"[{name}](@REPO@/{ATLAS}/{self.name}/{name})" for name in self.files)

    def seeds(self):
        seeds = self.settings.get("seeds") or []
        if not seeds:
            return "no seeds (exact)"
        return f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"


def atlas_sets(root):
    """[(first seeds, atlas_rows)] of the committed atlas and then of each committed held-out seed set
    (results-experiments-start<S>), read once for a rendering: "0" or "100", the first seed of each set."""
    engine = importlib.import_module("atlas.engine")
    held_out = sorted(name for name in os.listdir(root)
                      if name.startswith(ATLAS + "-start") and os.path.isdir(os.path.join(root, name)))
    sets = []
    for folder in [ATLAS] + held_out:
        rows = engine.atlas_rows(os.path.join(root, folder))
        sets.append((engine.first_seeds(rows), rows))
    return sets


def atlas_table(root, sets, kind):
    """The verdict table of atlas/engine.py's atlas_markdown for one kind ("claim" or "check"), with a
    verdict column for each committed held-out seed set (`atlas_sets`). Experiment names link to their pages."""
    engine = importlib.import_module("atlas.engine")
    names = experiment_folders(root)
    text = engine.atlas_markdown(sets[0][1], held_out=[rows for _, rows in sets[1:]], kinds=(kind,)).strip()
    linked = []
    for line in text.splitlines():
        cells = line.split(" | ")
        first = cells[0][2:] if line.startswith("| ") else ""
        if first in names:
            line = f"| [{first}](@DOCS@/atlas/{first}.md) | " + " | ".join(cells[1:])
        linked.append(line)
    return "\n".join(linked)


# ---------------------------------------------------------------------------------------------
# The names a template sees
# ---------------------------------------------------------------------------------------------


def readme_before_after(evaluation):
    """The few rows of a transformer run's before/after evaluation that README.txt shows, indented."""
    rows = [("pass@1", "pass@1", 4), ("pass@64", "pass@64", 4), ("entropy per token", "entropy_per_token", 4),
            ("distinct correct answers per prompt", "distinct_correct_per_prompt", 2)]
    lines = [f"    {'':38s}{'SFT start':>10s}{'after RL':>10s}"]
    for label, key, digits in rows:
        before, after = evaluation.before[key], evaluation.after[key]
        lines.append(f"    {label:38s}{before:10.{digits}f}{after:10.{digits}f}")
    return "\n".join(lines)


def verl_export(options):
    """The file `python online_tokens.py --export verl FILE` writes for these settings ({name: value}), as
    docs/from-lab-to-gpu.md shows it."""
    online_tokens = importlib.import_module("online_tokens")
    settings = dataclasses.asdict(importlib.import_module("online_settings").resolve(options))
    settings["max_grad_norm"] = online_tokens.MAX_GRAD_NORM
    return importlib.import_module("library_export").export_verl(settings)


# a verdict counted in a sentence: (one, several)
VERDICT_WORDS = {"holds": ("holds", "hold"), "does not hold": ("does not hold", "do not hold"),
                 "within noise": ("is within noise", "are within noise")}


def atlas_headline(sets, width=None):
    """The atlas's verdicts counted, claims and checks apart, on each committed seed set (`atlas_sets`: "The
    atlas states 55 claims (...). On the seeds from 0, 36 hold, ..."), wrapped at `width` (None: one line).
    Only the claims are findings; the checks (where a failure is a bug) are counted after them."""
    engine = importlib.import_module("atlas.engine")
    counts = [(start, engine.verdict_counts(rows)) for start, rows in sets]

    def counted(kind):  # one sentence per seed set
        return " ".join(f"On the seeds from {start}, " + ", ".join(
            f"{number} {VERDICT_WORDS[verdict][number != 1]}" for verdict, number in by_kind[kind].items()) + "."
            for start, by_kind in counts)

    claims, checks = (sum(counts[0][1][kind].values()) for kind in ("claim", "check"))
    agreement = ""
    for start, rows in sets[1:]:  # how many verdicts another seed set repeats
        same = engine.verdict_agreement(sets[0][1], rows)
        agreement += (f" The seeds from {sets[0][0]} and from {start} give the same verdict "
                      f"to {same['claim'][0]} of {same['claim'][1]} claims ({same['claim'][0] / same['claim'][1]:.0%})"
                      f" and {same['check'][0]} of {same['check'][1]} checks.")
    text = (f"The atlas states {claims} claims (RL effects that could come out either way). {counted('claim')} "
            f"Its {checks} checks (identities and properties of the code, whose answer is known) are counted "
            f"apart. {counted('check')}{agreement}")
    return text if width is None else textwrap.fill(text, width)


def namespace(root):
    """Every name a placeholder may use: the committed results, the code's facts, the helpers."""
    rl_lab = importlib.import_module("rl_lab")
    online_settings = importlib.import_module("online_settings")
    online_algorithms = importlib.import_module("online_algorithms")
    online_registry = importlib.import_module("online_registry")
    lab_testing = importlib.import_module("lab.testing")
    sets = atlas_sets(root)  # every settings.json of the atlas's seed sets, read once

    def section_reader(relative):
        return lambda: read_text(root, relative)

    names = {
        "bandit": Data({algorithm: read_json(root, f"results/{algorithm}.json") for algorithm in BANDIT_ALGORITHMS}),
        "bandit_rows": Data({algorithm: read_csv(root, f"results/{algorithm}.csv") for algorithm in BANDIT_ALGORITHMS}),
        "chain": read_json(root, "results-chain/ppo-chain.json"),
        "chain_rows": read_csv(root, "results-chain/ppo-chain.csv"),
        "tokens": read_json(root, "results-tokens.json"),
        "online": Data({name: read_json(root, f"{folder}/online.json") for name, folder in ONLINE_RUNS.items()}),
        "online_rows": Data({name: read_csv(root, f"{folder}/online.csv") for name, folder in ONLINE_RUNS.items()}),
        "four": Data({algorithm: read_json(root, f"results-online-all/{algorithm}/online.json")
                      for algorithm in BANDIT_ALGORITHMS}),
        "comparison": Data({row.algorithm: row for row in read_csv(root, "results-online-all/comparison.csv")}),
        "comparison_md": read_text(root, "results-online-all/comparison.md").strip(),
        "atlas": Data({name: Experiment(root, name) for name in experiment_folders(root)}),
        "atlas_rows": lambda name: Data({row.configuration: row
                                         for row in read_csv(root, os.path.join(ATLAS, name, "summary.csv"))}),
        "course": Data({os.path.splitext(name)[0]: read_json(root, os.path.join(COURSE, name))
                        for name in course_reports(root)}),
        "bench": read_json(root, BENCH),
        "suite_bench": read_json(root, SUITE_BENCH),
        "atlas_timings": read_json(root, ATLAS_TIMINGS),
        "conformance": section_reader(CONFORMANCE),
        "json": json, "pins": lambda filename, *packages: pins(root, filename, *packages),
        "online_default": lambda name: online_settings.BY_NAME[name].default,
        "policy_losses": online_registry.POLICY_LOSSES, "preference_losses": online_registry.PREFERENCE_LOSSES,
        "advantages": online_registry.ADVANTAGES,
        "demo": json.loads(json.dumps(rl_lab.atomic_demo()), object_hook=Data),
        "atoms_text": lambda: rl_lab.atoms_text(rl_lab.atomic_demo()),
        "readme_before_after": readme_before_after, "verl_export": verl_export,
        "sft_table": lambda evaluation: importlib.import_module("sft").table_text(evaluation).rstrip(),
        "limits": Data({
            "group_actions": rl_lab.MAX_GROUP_ACTIONS, "token_positions": online_settings.MAX_TOKEN_POSITIONS,
            "min_temperature": online_settings.MIN_TEMPERATURE, "sapo_min_tau": rl_lab.SAPO_MIN_TAU,
            "transformer_responses": online_settings.POLICY_MAX_RESPONSES["transformer"],
            "committed_rtol": lab_testing.COMMITTED_RTOL, "committed_atol": lab_testing.COMMITTED_ATOL,
        }),
        "table": table, "number": number, "numbers": numbers, "mean_of": mean_of,
        "transpose": transpose, "change": change, "task_of": task_of, "difficulty_summary": difficulty_summary,
        "escape": escape, "block": block, "code": code,
        "flags": flags, "algorithm_flags": algorithm_flags, "applies_table": applies_table,
        "figure_kinds": figure_kinds, "library_table": library_table,
        "map_rows": map_rows, "library_options": library_options, "paper": paper,
        "conformance_rows": lambda *settings, algorithm=None: conformance_rows(root, *settings, algorithm=algorithm),
        "commands": lambda filename: commands(root, filename),
        "module_docstring": lambda filename: module_docstring(root, filename),
        "atom": lambda name, filename="rl_lab.py": atom(root, name, filename),
        "docstring": lambda name, filename="rl_lab.py": docstring(root, filename, name),
        "atoms_index": lambda: atoms_index(root),
        "test_files": lambda: test_files(root),
        "arxiv_table": lambda: arxiv_table(root),
        "atlas_table": lambda kind: atlas_table(root, sets, kind),
        "atlas_headline": lambda width=None: atlas_headline(sets, width),
        "experiment_link": lambda name, text=None: _experiment_link(root, name, text),
        "atlas_summary": lambda name: _atlas_summary(root, name),
    }
    names["printed"] = Data(printed_summaries(root, names))
    names["bench_text"] = "\n".join(names["bench"].lines[3:])  # what bench.py printed below its machine line
    return names


def printed_summaries(root, names):
    """What the drivers print after a run, rendered by their own summary functions from the committed
    files: {"bandit": lines of rl_lab.py --algorithm all, "tokens": token_objectives.py's summary,
    "online": {run: online_tokens.py's summary}}. The online summary's timing line is left out (it is
    measured, machine-dependent and in no file)."""
    rl_lab = importlib.import_module("rl_lab")
    online_tokens = importlib.import_module("online_tokens")
    token_objectives = importlib.import_module("token_objectives")
    bandit = "\n".join(rl_lab.summary_line(name, names["bandit_rows"][name], names["bandit"][name].settings)
                       for name in BANDIT_ALGORITHMS)
    online = {}
    runs = dict(names["online"].items())
    rows = dict(names["online_rows"].items())
    for algorithm in BANDIT_ALGORITHMS:
        runs[f"all/{algorithm}"] = names["four"][algorithm]
        rows[f"all/{algorithm}"] = read_csv(root, f"results-online-all/{algorithm}/online.csv")
    for name, report in runs.items():
        text = online_tokens.summary_text(rows[name], report, 1.0)
        online[name] = "\n".join(line for line in text.splitlines() if not line.startswith("  training loop"))
    return {"bandit": bandit, "tokens": token_objectives.summary_text(names["tokens"]).rstrip(), "online": Data(online)}


def _experiment_link(root, name, text=None):
    """A link to an atlas page from a page of docs/ (or docs/algorithms/), or the plain name where the
    folder is not committed."""
    if name not in experiment_folders(root):
        return f"`{name}` (no folder in {ATLAS}/ yet)"
    return f"[{text or name}](@DOCS@/atlas/{name}.md)"


def _atlas_summary(root, name):
    if name not in experiment_folders(root):
        return f"(the experiment `{name}` has no folder in {ATLAS}/ yet)"
    return Experiment(root, name).summary()


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


@functools.cache
def _compiled(field):
    """A placeholder's field, compiled once a process (a field recurs on many pages, and in every rendering)."""
    return compile("f'''{" + field + "}'''", "<placeholder>", "eval")


def render(text, names, where):
    """`text` with every placeholder replaced by its value (see the module docstring)."""
    rendered = []
    for line_number, line in enumerate(text.split("\n"), start=1):
        def replace(match, line_number=line_number):
            field = match.group(1).strip()
            try:  # the field is an f-string replacement field of the lab's own templates
                return eval(_compiled(field), names)
            except Exception as error:  # noqa: BLE001 (any failure names the template, line and placeholder)
                raise RenderError(f"{where} line {line_number}: {{{{{field}}}}}: {type(error).__name__}: "
                                  f"{' '.join(str(error).split())}") from None
        rendered.append(PLACEHOLDER.sub(replace, line))
    return "\n".join(rendered)


def sections(text, where):
    """{name: text} of a content file cut at its `<!-- section: NAME -->` lines."""
    found, current = {}, None
    for line in text.split("\n"):
        match = SECTION.match(line)
        if match:
            current = match.group(1)
            found[current] = []
        elif current is not None:
            found[current].append(line)
    if tuple(found) != ALGORITHM_SECTIONS:
        raise RenderError(f"{where}: expected the sections {', '.join(ALGORITHM_SECTIONS)} in this order, "
                          f"got {', '.join(found) or 'none'}")
    return {name: "\n".join(lines).strip() for name, lines in found.items()}


def _finish(text, page):
    """The page's final text: @DOCS@ and @REPO@ (the docs/ folder and the repository's root, as the
    shared helpers and skeletons write links) made relative to the page; one newline at the end."""
    depth = page.count("/")
    docs = {0: "docs/", 1: "", 2: "../"}[depth]
    repo = "../" * depth
    return text.replace("@DOCS@/", docs).replace("@REPO@/", repo).rstrip() + "\n"


def render_all(root=HERE):
    """{relative path: text} of every page (README.txt, docs/...), rendered from the templates under
    `root` and the results under `root`. Raises RenderError naming a template that cannot be rendered."""
    names = namespace(root)
    templates = os.path.join(root, TEMPLATES)
    pages = {README: _finish(render(read_text(root, os.path.join(TEMPLATES, README)), names, README), README)}
    for filename in sorted(os.listdir(templates)):
        if filename.endswith(".md") and not filename.startswith("_"):
            where = os.path.join(TEMPLATES, filename)
            pages[f"docs/{filename}"] = _finish(render(read_text(root, where), names, where), f"docs/{filename}")
    skeleton_path = os.path.join(TEMPLATES, "_algorithm.md")
    skeleton = read_text(root, skeleton_path)
    for filename in sorted(os.listdir(os.path.join(templates, "algorithms"))):
        if not filename.endswith(".md"):
            continue
        where = os.path.join(TEMPLATES, "algorithms", filename)
        parts = sections(read_text(root, where), where)
        local = dict(names, section=lambda name, parts=parts, where=where: render(parts[name], names, where),
                     algorithm=filename[:-len(".md")])
        page = f"docs/algorithms/{filename}"
        pages[page] = _finish(render(skeleton, local, f"{skeleton_path} for {where}"), page)
    learn = os.path.join(templates, "learn")  # the course: docs/learn/NAME.md for each learn/NAME.md
    for filename in sorted(os.listdir(learn)) if os.path.isdir(learn) else []:
        if filename.endswith(".md"):
            where = os.path.join(TEMPLATES, "learn", filename)
            page = f"docs/learn/{filename}"
            pages[page] = _finish(render(read_text(root, where), names, where), page)
    experiment_path = os.path.join(TEMPLATES, "_experiment.md")
    experiment_template = read_text(root, experiment_path)
    for name in experiment_folders(root):
        local = dict(names, experiment=names["atlas"][name])
        page = f"docs/atlas/{name}.md"
        pages[page] = _finish(render(experiment_template, local, f"{experiment_path} for {name}"), page)
    return pages


def committed_pages(root=HERE):
    """The rendered pages present under `root`: README.txt and every .md of docs/ outside the templates."""
    found = [README] if os.path.isfile(os.path.join(root, README)) else []
    for folder, subfolders, files in os.walk(os.path.join(root, "docs")):
        subfolders[:] = sorted(name for name in subfolders
                               if os.path.join(folder, name) != os.path.join(root, TEMPLATES))
        found += sorted(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                        for name in files if name.endswith(".md"))
    return found


def _around_difference(old, new, width=120):
    """The two lines cut to `width` characters around their first differing character ("..." where cut), so
    that a difference far into a long line shows."""
    start = next((index for index, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    start = max(0, start - width // 3)

    def cut(text):
        return ("..." if start else "") + text[start:start + width] + ("..." if len(text) > start + width else "")

    return cut(old), cut(new)


def first_difference(pages, root=HERE):
    """None when every page under `root` is what `pages` holds; else one line naming the first page (in
    render order) and line that differs, or the page that is missing or no longer rendered."""
    for path, text in pages.items():
        target = os.path.join(root, path)
        if os.path.lexists(target) and not _regular(target):
            return f"{path} is not a regular file (a link, folder or device): remove it, then run python make_docs.py"
        if not os.path.isfile(target):
            return f"{path} is missing: run python make_docs.py"
        committed = read_text(root, path).split("\n")
        rendered = text.split("\n")
        for line_number, (old, new) in enumerate(zip(committed, rendered), start=1):
            if old != new:
                page, rendering = _around_difference(old.strip(), new.strip())
                return (f"{path} line {line_number} differs from what the templates and committed results "
                        f"render: page {page!r}, rendered {rendering!r} "
                        "(edit the template, not the page, then run python make_docs.py)")
        if len(committed) != len(rendered):
            line_number = min(len(committed), len(rendered)) + 1
            return f"{path} line {line_number} differs: the page has {len(committed)} lines, the rendering " \
                   f"{len(rendered)} (run python make_docs.py)"
    for path in committed_pages(root):
        if path not in pages:
            return f"{path} is not rendered by make_docs.py (its template or results folder is gone): remove it"
    return None


def _regular(path):
    return stat.S_ISREG(os.lstat(path).st_mode)


def write_pages(pages, root=HERE):
    """Write every page that changed (all or nothing); return (written, unrendered) lists of relative
    paths: unrendered are the .md files under docs/ that no template renders (a page whose experiment
    is gone, or a file of the user's), which are left as they are: nothing is ever deleted. A page whose
    place is a link, a folder or a device is never replaced: RenderError naming it, and nothing is written."""
    for path in pages:
        target = os.path.join(root, path)
        if os.path.lexists(target) and not _regular(target):
            raise RenderError(f"{path} is not a regular file (a link, folder or device): it is never replaced "
                              "nor removed; remove it yourself")
    changed = {os.path.join(root, path): text for path, text in pages.items()
               if not os.path.isfile(os.path.join(root, path)) or read_text(root, path) != text}
    write_files(changed)
    unrendered = [path for path in committed_pages(root) if path not in pages]
    return sorted(os.path.relpath(path, root) for path in changed), unrendered


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def build_parser():
    parser = OneLineErrorParser(
        prog="make_docs.py",
        description="Render README.txt and the guide in docs/ from docs/templates/ and the committed results.",
    )
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 with one line naming the first page and line that differs "
                             "from the rendering (default: off, write the pages)")
    return parser


def main(argv=None, root=HERE):
    args = build_parser().parse_args(argv)
    from lab.checks import torch_threads

    try:
        with torch_threads(1):  # the atoms' demo values: tiny tensors
            pages = render_all(root)
    except RenderError as error:
        print(f"make_docs.py: error: {error}", file=sys.stderr)
        return 1
    if args.check:
        problem = first_difference(pages, root)
        if problem is not None:
            print(f"make_docs.py: {problem}", file=sys.stderr)
            return 1
        print(f"make_docs.py: all {len(pages)} pages are what the templates and committed results render")
        return 0
    try:
        written, unrendered = write_pages(pages, root)
    except RenderError as error:
        print(f"make_docs.py: error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    for path in unrendered:
        print(f"kept {path}: no template renders it (if it was one of the guide's pages, remove it yourself)")
    print(f"{len(pages)} pages, {len(written)} rewritten" + (f", {len(unrendered)} kept unrendered" if unrendered
                                                              else ""))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
