"""The lab's plumbing, apart from the lessons: argument checks shared by the atoms (checks.py), files written
whole and one-line errors (io.py), settings declared once (settings.py), and the tests' helpers (testing.py).
A learner reads the programs at the top level; nothing here is an idea of RL."""
