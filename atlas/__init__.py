"""The phenomena atlas, one concern per module: stats, claims, exact, runners, catalog, engine.
Its command line is experiments.py."""
