"""The course's numbers: every value a chapter of docs/learn/ quotes or draws, computed from the atoms.

    python course.py                                # every chapter -> results-course/<chapter>.json + figures
    python course.py --chapter 05-trust-regions     # one chapter
    python -m unittest -v test_course

Each chapter of the course (docs/learn/NN-name.md) has one function here, `chapter_NN()`, that
computes what the chapter shows from the lab's atoms (rl_lab.py) and its small problems: exact
expectations on the bandit where an expectation is known in closed form, seeded samples beside them
where the point is how a sampled estimate behaves. It returns a JSON-able dict; plot_course.py draws
the chapter's figures from that dict alone. make_docs.py renders the numbers into the chapters, so no
number in the course is typed by hand.

Everything runs in float64 on one thread with one seeded torch.Generator per chapter: the same
command gives byte-identical files on one machine.
"""

from __future__ import annotations

if __name__ == "__main__":  # first: a Ctrl-C while torch loads below ends with one line, not a traceback
    from lab_start import exit_quietly_on_signals

    exit_quietly_on_signals()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

from lab_checks import torch_threads  # noqa: E402
from lab_io import OneLineErrorParser, json_text, output_folder_or_exit, run_cli, write_files  # noqa: E402
import rl_lab  # noqa: E402,F401  (the atoms every chapter is built from)

OUTPUT = "results-course"
SEED = 7


def _rounded(value, digits=12):
    """`value` (a float, tensor, or nested list/dict of them) as plain floats rounded to `digits`
    significant digits, so that the JSON does not carry the last bits that differ between CPUs."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, float):
        return float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {key: _rounded(item, digits) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item, digits) for item in value]
    return value


# ---------------------------------------------------------------------------------------------
# Chapter 1: probabilities and log-probabilities of a policy; the causal shift and masks
# ---------------------------------------------------------------------------------------------


def chapter_01():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 2: the policy gradient
# ---------------------------------------------------------------------------------------------


def chapter_02():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 3: baselines, advantages, the critic, TD errors and GAE
# ---------------------------------------------------------------------------------------------


def chapter_03():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 4: reusing a batch: importance sampling
# ---------------------------------------------------------------------------------------------


def chapter_04():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 5: trust regions: the clip, dual-clip, clip-higher, CISPO's cap, SAPO's gate, GSPO
# ---------------------------------------------------------------------------------------------


def chapter_05():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 6: the KL-regularized objective and its optimum; the KL estimators
# ---------------------------------------------------------------------------------------------


def chapter_06():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 7: preferences: Bradley-Terry, DPO, IPO, the hinge, SimPO
# ---------------------------------------------------------------------------------------------


def chapter_07():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 8: groups: GRPO's group baseline, RLOO, the std, tied groups, the group size
# ---------------------------------------------------------------------------------------------


def chapter_08():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 9: sequences: reductions, the length bias, micro-batches, EOS = PAD, left padding
# ---------------------------------------------------------------------------------------------


def chapter_09():
    return {}


# ---------------------------------------------------------------------------------------------
# Chapter 10: the whole loop on a transformer: SFT, then RL; pass@k; entropy
# ---------------------------------------------------------------------------------------------


def chapter_10():
    return {}


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

# The chapters in the course's order: the name of docs/learn/<name>.md -> the function computing it.
CHAPTERS = {
    "01-log-probabilities": chapter_01,
    "02-policy-gradient": chapter_02,
    "03-baselines-and-gae": chapter_03,
    "04-reusing-a-batch": chapter_04,
    "05-trust-regions": chapter_05,
    "06-kl-regularized-objective": chapter_06,
    "07-preferences": chapter_07,
    "08-groups": chapter_08,
    "09-sequences": chapter_09,
    "10-the-whole-loop": chapter_10,
}


def compute(chapter):
    """The chapter's report: {"chapter": name, ...its values}, rounded for the JSON."""
    with torch_threads(1), torch.no_grad():
        values = CHAPTERS[chapter]()
    return {"chapter": chapter, **_rounded(values)}


def files_of(chapter, report):
    """{relative file name: text or bytes}: the chapter's JSON and each of its figures."""
    import plot_course

    files = {f"{chapter}.json": json_text(report)}
    for name, draw in plot_course.FIGURES.get(chapter, {}).items():
        files[f"{chapter}-{name}.svg"] = plot_course.svg_bytes(draw(report))
    return files


def build_parser():
    parser = OneLineErrorParser(
        prog="course.py",
        description="Compute the numbers and figures of the course (docs/learn/) from the atoms.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--chapter", choices=("all", *CHAPTERS), default="all",
                        help="one chapter, or all of them")
    parser.add_argument("--output", default=OUTPUT, help="the folder for the JSON reports and figures")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    chapters = list(CHAPTERS) if args.chapter == "all" else [args.chapter]
    output_folder_or_exit(parser, args.output)
    files = {}
    for chapter in chapters:
        for name, data in files_of(chapter, compute(chapter)).items():
            files[os.path.join(args.output, name)] = data
    write_files(files)
    for path in files:
        print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
