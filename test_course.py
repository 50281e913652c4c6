"""Tests of course.py and plot_course.py: every number a chapter of docs/learn/ quotes, checked
against a hand computation, a slow reference or an invariant, and the committed reports against a
fresh computation.

    python -m unittest -v test_course
"""

from __future__ import annotations

import unittest

import course
from lab_testing import single_thread_module

setUpModule, tearDownModule = single_thread_module()


class Chapters(unittest.TestCase):
    def test_every_chapter_has_a_function_and_a_page_name_in_the_course_order(self):
        self.assertEqual(list(course.CHAPTERS), [f"{n:02d}-" + name for n, name in enumerate(
            ["log-probabilities", "policy-gradient", "baselines-and-gae", "reusing-a-batch", "trust-regions",
             "kl-regularized-objective", "preferences", "groups", "sequences", "the-whole-loop"], start=1)])


# ---------------------------------------------------------------------------------------------
# Chapters 1-5
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapters 6-10
# ---------------------------------------------------------------------------------------------


if __name__ == "__main__":
    unittest.main()
