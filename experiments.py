"""The phenomena atlas: the lab's claims and the field's known effects, each a named experiment run over
seeds, its claims checked against every seed, written as tables, verdicts and a figure.

    python experiments.py --list                      # the experiments, one line each
    python experiments.py kl-estimators               # one experiment -> results-experiments/kl-estimators/
    python experiments.py all                         # every experiment (docs/atlas.md: how long it takes)
    python experiments.py all --seed-start 100        # the same claims on a second, held-out set of seeds
    python experiments.py zero-variance --seeds 10 --jobs 2 --quick
    python experiments.py all --seed-start 900 --output /tmp/a --timings /tmp/t.json   # each one's run time too
    python experiments.py all --from-runs             # no run: summaries and verdicts from the committed runs

Each experiment runs the drivers' Python APIs in this process's workers (no shelling out) over seeds
S..S+N-1 (--seed-start S, default 0; --seeds N, default the experiment's own, 5 for most) and writes
results-experiments/<name>/: runs.csv (one row per run: configuration, seed, metrics; an empty cell is
a target never reached), curves.csv (per-iteration values of each run, where the experiment has curves),
summary.csv and summary.md (per configuration, each metric's mean, std over seeds, min and max, over the
runs that have a value, and how many never reached the target; then each claim's verdict), settings.json
(the claims with their verdicts and per-seed values, the source, the command, every run's options) and
figure.svg (drawn by plot_results.py from those files). Runs are spread over --jobs worker processes,
each running torch single-threaded; the files do not depend on --jobs, and the same seeds give the same
bytes.

A claim is a test over the per-seed results: a property counted over seeds ("count": holds when
enough seeds show it), a paired difference between configurations that share seeds ("greater": holds
when the 95% t-interval of the mean difference is above 0, does not hold when it is below 0, within
noise otherwise; how many seeds are above 0 is shown beside it), an equivalence ("within": holds when
the interval lies inside +-margin, does not hold when it lies wholly outside, within noise otherwise),
or an exact identity computed without seeds ("exact"). A difference or an equivalence with fewer than 2
seeds that have a value has no interval: within noise. It is of one of two kinds: a `Claim`, an RL
effect that could come out either way (the headline counts these), or a `Check`, an identity or a
property of the code whose answer is known. A run that never reached a target counts at its budget
(its last iteration, or the tokens or actions it sampled): no seed is dropped for it.

The atlas lives in the package atlas/, one concern per module: stats (t and Wilson intervals,
paired comparisons), claims (claims and their verdicts), exact (exact enumeration of a table policy),
runners (one run of a driver, reduced to metrics), catalog (every experiment, as a table of entries)
and engine (the worker pool, summaries, Markdown, files); experiments.py is its command line.
"""

from __future__ import annotations

import json
import os
import sys
import time

from lab.io import (
    OneLineErrorParser,
    Progress,
    int_flag,
    json_text,
    output_file_or_exit,
    output_folder_or_exit,
    run_cli,
    separate_outputs_or_exit,
    write_files,
)

# The catalogue's names in its order, its default seed count and the --quick iterations, torch-free so that
# --help and a bad flag or name answer before torch is imported (test_experiments holds them to atlas/).
NAMES = ("kl-estimators", "reduction-length-bias", "std-scaling", "zero-variance", "clip-higher", "updates-per-batch",
         "sampler-mismatch", "microbatch", "grpo2-vs-dpo", "four-algorithms", "dpo-label-flips", "group-size",
         "chain-lambda", "reward-shift", "sparse-reward", "passk-narrowing", "rl-generalization",
         "clip-higher-entropy", "length-growth", "precision-mismatch", "kl-placement", "padding-bug",
         "kl-optimum", "entropy-mechanism", "dpo-displacement", "negative-samples", "spurious-rewards",
         "reward-hacking", "discover-or-sharpen", "forgetting", "r1-zero")
DEFAULT_SEEDS = 5
QUICK_STEPS = 4
# what an experiment's folder may hold: every file the engine writes there
EXPERIMENT_FILES = ("runs.csv", "curves.csv", "summary.csv", "summary.md", "settings.json", "figure.svg",
                    "gradient_weight_by_successes.csv")
MAX_SEED_START = 2**63 - 1 - 100  # the drivers' seeds are below 2**63, and --seeds is at most 100


def default_output(seeds=None, seed_start=0, quick=False):
    """results-experiments for the default run; another --seeds, --seed-start or --quick writes its own
    folder (results-experiments-seeds10-start100-quick), so that the committed atlas is only rewritten by
    the command that made it."""
    return ("results-experiments" + (f"-seeds{seeds}" if seeds is not None else "")
            + (f"-start{seed_start}" if seed_start else "") + ("-quick" if quick else ""))


def build_parser():
    names = ", ".join(NAMES)
    parser = OneLineErrorParser(
        prog="experiments.py",
        description="The phenomena atlas: named experiments over seeds, each claim checked against every seed, "
                    "written as runs, summary tables (CSV and Markdown), verdicts, settings and a figure per "
                    "experiment.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"experiments to run, or 'all': {names}")
    parser.add_argument("--list", action="store_true",
                        help="name every experiment with one line, and stop (default: off)")
    parser.add_argument("--seeds", type=int_flag(1, 100), default=None,
                        help="run N seeds of every configuration, integer in [1, 100] (default: each experiment's "
                             f"own, {DEFAULT_SEEDS} for most; --list shows it)")
    parser.add_argument("--seed-start", type=int_flag(0, MAX_SEED_START), default=0,
                        help="the first seed: seeds S..S+N-1; another start checks the claims on another "
                             "set of seeds; integer in [0, 2**63 - 101], so that every seed stays below 2**63 "
                             "(default: 0)")
    parser.add_argument("--quick", action="store_true",
                        help=f"every run at its experiment's quick size ({QUICK_STEPS} iterations for the table "
                             "and bandit runs, 2 for the transformer's from a 20-step SFT start): the mechanism in seconds, not the effect; verdicts mean little (default: off)")
    parser.add_argument("--jobs", type=int_flag(1, 64), default=os.cpu_count() or 1,
                        help="worker processes, integer in [1, 64] (default: the machine's cores)")
    parser.add_argument("--output", default=None,
                        help="folder of the experiments' folders (default: results-experiments for the default "
                             "seeds; with --seeds N, --seed-start S or --quick, "
                             "results-experiments-seedsN-startS-quick with the parts given, so that the committed "
                             "atlas is only rewritten by the run that made it)")
    parser.add_argument("--from-runs", action="store_true",
                        help="run nothing: recompute each named experiment's summaries, verdicts, settings and figure "
                             "from the runs.csv and curves.csv already in its folder (the folder the same --seeds, "
                             "--seed-start and --quick write), with the catalogue's claims as they are now "
                             "(default: off)")
    parser.add_argument("--timings", default=None,
                        help="also write each experiment's run time (seconds summed over its runs), the wall time "
                             "and the machine to this JSON file, outside the deterministic results (default: off)")
    return parser


def parse(argv=None):
    """(parser, args, names): the flags checked, torch-free: --help, a bad flag, a bad name or an output
    that cannot be written ends here, before torch is imported. names: the experiments to run, in order."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list:
        if args.names:  # --list prints every experiment and runs none: a name would be lost
            parser.error(f"argument --list: lists every experiment and runs none, not with names ({args.names[0]})")
        return parser, args, []
    if not args.names:
        parser.error("argument NAME: name one or more experiments, or 'all' (see --list)")
    unknown = [name for name in args.names if name != "all" and name not in NAMES]
    if unknown:
        parser.error(f"argument NAME: no experiment {unknown[0]!r} (expected one of: all, {', '.join(NAMES)})")
    names = list(NAMES) if "all" in args.names else list(dict.fromkeys(args.names))
    if args.output is None:
        args.output = default_output(args.seeds, args.seed_start, args.quick)
    output_folder_or_exit(parser, args.output)
    if args.from_runs and args.timings is not None:
        parser.error("argument --timings: nothing runs with --from-runs, so there is no time to write")
    if args.timings is not None:
        output_file_or_exit(parser, args.timings, flag="--timings")
        separate_outputs_or_exit(parser, {"--timings": args.timings, "--output": args.output})
    for name in names:  # every experiment's folder, before any run
        output_folder_or_exit(parser, os.path.join(args.output, name), EXPERIMENT_FILES)
        if args.from_runs and not os.path.isfile(os.path.join(args.output, name, "runs.csv")):
            parser.error(f"argument --from-runs: no runs to read in {os.path.join(args.output, name)} "
                         "(run the experiment first)")
    return parser, args, names


def main(argv=None):
    parser, args, names = parse(argv)
    import policies  # torch from here on: the flags are checked
    from atlas.catalog import experiments
    from atlas.claims import count_text
    from atlas.engine import (at_quick_size, command_of, experiment_files, results_from_folder, run_experiments,
                              seed_list, sft_folders)
    from lab.checks import machine

    table = experiments()
    if args.list:
        width = max(len(name) for name in table)
        print("\n".join(f"{name:{width}s}  {experiment.seeds:3d} seeds  {experiment.summary}"
                        for name, experiment in table.items()))
        return 0
    if args.quick:
        table = {name: at_quick_size(experiment) for name, experiment in table.items()}
    if args.from_runs:
        import plot_results

        for name in names:
            folder = os.path.join(args.output, name)
            with open(os.path.join(folder, "settings.json"), encoding="utf-8") as handle:
                command = json.load(handle)["command"]  # the command that ran these runs
            try:
                seeds, jobs, results = results_from_folder(table[name], folder)
            except ValueError as error:
                parser.error(f"argument --from-runs: {error}")
            files = experiment_files(table[name], seeds, jobs, results, folder, command)
            files[os.path.join(folder, "figure.svg")] = plot_results.experiment_figure_bytes(files, ".svg")
            write_files(files)
            print(f"-> {folder}: {', '.join(sorted(os.path.basename(path) for path in files))}")
        return 0
    for folder in sft_folders([table[name] for name in names], args.seeds, args.seed_start):  # its SFT starts
        output_folder_or_exit(parser, os.path.dirname(folder), flag="NAME (the SFT cache of its transformer runs)")
        output_folder_or_exit(parser, folder, policies.SFT_FILES, flag="NAME (the SFT cache of its transformer runs)")
    import plot_results  # matplotlib only now: --list and bad names stay quick

    written = []
    progress = Progress()

    def finished(name, experiment, seeds, jobs, results):
        folder = os.path.join(args.output, name)
        command = command_of(name, args.seeds, args.seed_start, args.quick)
        files = experiment_files(experiment, seeds, jobs, results, folder, command)
        files[os.path.join(folder, "figure.svg")] = plot_results.experiment_figure_bytes(files, ".svg")
        write_files(files)  # one experiment's files together: its folder holds all of them or none
        written.append(folder)
        settings = json.loads(files[os.path.join(folder, "settings.json")])
        verdicts = ", ".join(f"{verdict['verdict']} ({count_text(verdict)})" for verdict in settings["claims"])
        progress(f"-> {folder}: {', '.join(sorted(os.path.basename(path) for path in files))}")
        progress(f"   verdicts: {verdicts}")

    started = time.perf_counter()
    seconds = run_experiments(names, args.seeds, args.jobs, finished, report=progress, table=table,
                              seed_start=args.seed_start)
    progress("run time per experiment (sum over its runs, this machine): " + ", ".join(
        f"{name} {value:.1f} s" for name, value in sorted(seconds.items(), key=lambda item: -item[1])))
    wall = time.perf_counter() - started
    progress(f"{len(written)} experiment(s), {sum(seconds.values()):.1f} s of runs, {wall:.1f} s on {args.jobs} "
             "worker(s)")
    if args.timings is not None:  # measured, so never byte-identical: kept apart from the experiments' folders
        command = " ".join(["python experiments.py", *(argv if argv is not None else sys.argv[1:])])
        write_files({args.timings: json_text({
            "machine": machine(), "command": command, "jobs": args.jobs, "wall_seconds": round(wall, 1),
            "run_seconds": {name: round(value, 1) for name, value in seconds.items()},
            "seed_start": args.seed_start, "quick": args.quick,
            "seeds": {name: len(seed_list(table[name], args.seeds, args.seed_start)) for name in names}})})
        progress(f"-> {args.timings}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
