"""The course's concept figures, drawn from the chapter reports of course.py alone (never imports torch).

    python course.py        # computes every chapter's report and draws its figures into results-course/

One function per figure, `draw_<what>(report) -> Figure`, registered in FIGURES under its chapter.
Each figure reads without the text: axes with units, a legend off the data, a title that states the
point.
"""

from __future__ import annotations

from matplotlib.figure import Figure  # noqa: F401

from plot_results import figure_bytes


def svg_bytes(figure):
    """The figure as deterministic SVG bytes (no date, a fixed id salt)."""
    return figure_bytes(figure, ".svg")


# ---------------------------------------------------------------------------------------------
# Chapters 1-5
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapters 6-10
# ---------------------------------------------------------------------------------------------


# chapter name -> {figure name: draw function}; course.py writes results-course/<chapter>-<figure>.svg
FIGURES = {
}
