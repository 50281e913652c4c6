"""The atlas's engine: runs an experiment's jobs over worker processes, summarizes them over seeds, checks
its claims, and renders its files (runs.csv, curves.csv, summary.csv, summary.md, settings.json; the
caller adds figure.svg) and the atlas's verdict table.

The worker pool is written by hand for its signal discipline: a Ctrl-C, SIGTERM or a killed worker ends
every worker and reads as one line, and no worker outlives the run."""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import statistics
import time
from dataclasses import replace

import torch

import sft
from atlas.catalog import configuration_name, experiments
from atlas.claims import (CHECK, CLAIM, FAILS, HOLDS, KINDS, NOISE, check_claim, count_text, interval_text,
                          number_text)
from atlas.runners import RUNNERS, SFT_STARTS, TARGET, TRAINING_RUNNERS, TRANSFORMER_RUNNERS
from lab.checks import import_torch_lazy_modules, torch_threads
from lab.io import HeldSignals, Terminated, csv_text, json_text
from tasks import TASKS

QUICK_STEPS = 4  # iterations of every training run at --quick (tests): the mechanism, not the effect
# metrics that are the first iteration (or budget) at which a run reached TARGET: None when it never did
TARGET_METRICS = ("iterations_to_0.9", "tokens_to_0.9", "steps_to_0.9", "actions_to_0.9")


def at_quick_size(experiment):
    """A copy of `experiment` whose runs take its quick options (tests and --quick: the mechanism, not the
    effect): `experiment.quick`, or QUICK_STEPS iterations for the runners that train."""
    configurations = []
    for label, runner, options in experiment.configurations:
        quick = experiment.quick if experiment.quick is not None else (
            {"steps": QUICK_STEPS} if runner in TRAINING_RUNNERS else {})
        configurations.append((label, runner, {**options, **quick}))
    return replace(experiment, configurations=configurations)


def _worker_signals():
    """A worker starts with the default action of every stop signal, unblocked: the handlers it inherits
    from the main process raise (they belong to the main process's clean-up), and a worker that cannot die
    by SIGTERM makes every early exit of the main process hang. A terminal's Ctrl-C or hang-up reaches the
    workers with the main process (one process group) and ends them at once; the main process stops the
    rest itself."""
    stop_signals = [getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)]
    for signum in stop_signals:
        signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stop_signals)


def _run_job(job):
    """Worker entry: (experiment name, global index, label, seed, runner, options) -> (index, seconds, result);
    seconds: the run alone, the process's one-time imports excluded."""
    name, index, label, seed, runner, options = job
    if runner in TRANSFORMER_RUNNERS:  # each seed its own SFT start, so a claim replicates over starts too
        options = {"sft_seed": seed, **options}
    import_torch_lazy_modules()  # about a millisecond once they are imported
    started = time.perf_counter()
    with torch_threads(1):
        result = RUNNERS[runner](seed, **options)
    return index, time.perf_counter() - started, result


def _worker(connection, main_ends=()):
    """A worker process: run each job the main process sends, answer (True, result) or (False, the
    exception); stop at None, or when the main process is gone (its end of the pipe closed). `main_ends`:
    the main process's ends of the pipes, which a forked worker holds too and closes, or it would never
    see the main process's end closed."""
    for end in main_ends:
        end.close()
    _worker_signals()
    while True:
        try:
            job = connection.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            answer = (True, _run_job(job))
        except Exception as error:  # raised again in the main process, which reports it in one line
            answer = (False, error)
        try:
            connection.send(answer)
        except (EOFError, OSError):
            return
        except Exception as error:  # an exception that cannot be pickled: its text
            connection.send((False, RuntimeError(f"{type(error).__name__}: {error}")))


def _worker_ended(process):
    """The exception for a worker that ended before answering: a stop signal is the run's own stop (a
    terminal's Ctrl-C reaches the workers too); anything else (SIGKILL from the out-of-memory killer) is an
    error naming how it ended."""
    process.join()
    signum = -process.exitcode if process.exitcode is not None and process.exitcode < 0 else None
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    if signum in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)):
        raise Terminated(signum)
    how = f"by {signal.Signals(signum).name}" if signum else f"with status {process.exitcode}"
    killed = signum == getattr(signal, "SIGKILL", 0)
    hint = " (the out-of-memory killer sends SIGKILL: try fewer --jobs)" if killed else ""
    raise ChildProcessError(f"worker process {process.pid} ended {how} before its run finished{hint}")


def _hand_over(connection, job, process):
    """Send a job to a worker. A worker that died since its last answer shows as a broken pipe here:
    report how it ended, never a BrokenPipeError, which run_cli would take for a closed standard output."""
    try:
        connection.send(job)
    except OSError:
        _worker_ended(process)


def _results_from_workers(all_jobs, jobs_count):
    """Yield (index, seconds, result) of every job as `jobs_count` worker processes finish them. No pool
    threads: the main process hands each idle worker the next job and waits for any answer. However it
    ends (the last job, a stop signal, a failed write, a worker that died) it kills every worker and
    waits for it, so no worker outlives the run."""
    # fork where it exists: the workers inherit the imported modules instead of importing torch again
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    import_torch_lazy_modules()  # once, here: forked workers inherit them instead of each importing them again
    workers = {}  # the main process's end of each worker's pipe -> the worker process
    pending = list(reversed(all_jobs))
    try:
        for _ in range(min(jobs_count, len(all_jobs))):
            ours, theirs = context.Pipe()
            process = context.Process(target=_worker, args=(theirs, [*workers, ours]), daemon=True)
            process.start()
            theirs.close()  # the worker's end lives in the worker only, so its death reads as end-of-file
            workers[ours] = process
        for connection in workers:
            _hand_over(connection, pending.pop(), workers[connection])
        busy = set(workers)
        while busy:
            for connection in multiprocessing.connection.wait(list(busy)):
                try:
                    finished, value = connection.recv()
                except (EOFError, OSError):
                    _worker_ended(workers[connection])
                if not finished:
                    raise value
                if pending:
                    _hand_over(connection, pending.pop(), workers[connection])
                else:
                    busy.discard(connection)
                yield value
    finally:
        with HeldSignals():  # a second Ctrl-C must not cut this short and leave a worker running
            for connection, process in workers.items():
                process.kill()  # SIGKILL: a worker holds nothing to clean up, and a stopped one dies too
                process.join()
                connection.close()


def seed_list(experiment, seeds=None, seed_start=0):
    """The seeds an experiment runs: seed_start .. seed_start + N - 1, N = `seeds` or the experiment's own."""
    return list(range(seed_start, seed_start + (experiment.seeds if seeds is None else seeds)))


def jobs_of(experiment, seeds):
    """Every run of an experiment over the list `seeds`, configuration-major then seed:
    (name, index, label, seed, runner, options)."""
    jobs = []
    for label, runner, options in experiment.configurations:
        for seed in seeds:
            jobs.append((experiment.name, len(jobs), label, seed, runner, options))
    return jobs


def _cell_value(text):
    """A cell of runs.csv or curves.csv as the value the runner returned: "" is None, an integer is an
    int, anything else a float (csv_text writes floats as their repr, so they read back exactly)."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if text.lstrip("-").isdigit():  # repr never writes a float without a "." or an exponent: "3.0", "1e-05"
        return int(text)
    return float(text)


def _read_rows(path):
    with open(path, encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def results_from_folder(experiment, folder):
    """(seeds, jobs, results) of the runs committed in an experiment's folder, read back from its runs.csv
    and curves.csv as the runners returned them, so that its summaries, verdicts and figure can be
    recomputed without running anything. Raises ValueError, naming the file, when the runs are not those
    of `experiment` (another catalogue than the one that ran them)."""
    path = os.path.join(folder, "runs.csv")
    columns, rows = _read_rows(path)
    seeds = list(dict.fromkeys(int(row["seed"]) for row in rows))
    jobs = jobs_of(experiment, seeds)
    metrics = columns[columns.index("seed") + 1:]
    runs = {(row["configuration"], int(row["seed"])): {name: _cell_value(row[name]) for name in metrics}
            for row in rows}
    wanted = [(configuration_name(label), seed) for _, _, label, seed, _, _ in jobs]
    if sorted(runs) != sorted(wanted) or len(rows) != len(wanted):
        raise ValueError(f"{path}: its runs are not the configurations and seeds of the experiment "
                         f"{experiment.name!r} (run it again)")
    curves = {}
    if os.path.isfile(os.path.join(folder, "curves.csv")):
        columns, rows = _read_rows(os.path.join(folder, "curves.csv"))
        for row in rows:
            point = {name: _cell_value(row[name]) for name in columns[2:]}  # after configuration, seed
            curves.setdefault((row["configuration"], int(row["seed"])), []).append(point)
    return seeds, jobs, [{"metrics": runs[key], "curve": curves.get(key, [])} for key in wanted]


def results_by_seed(jobs, results):
    """{seed: {configuration name: metrics}}: what a claim reads, one seed at a time; a run with a curve
    also has "iterations", its last iteration (the budget of a target it never reached)."""
    by_seed = {}
    for (_, _, label, seed, _, _), result in zip(jobs, results):
        budget = {"iterations": result["curve"][-1]["step"]} if result["curve"] else {}
        by_seed.setdefault(seed, {})[configuration_name(label)] = {**result["metrics"], **budget}
    return by_seed


def _statistics(values):
    """mean, std over seeds (sample), min, max of the values that exist (None: none exists)."""
    if not values:
        return None, None, None, None
    return (math.fsum(values) / len(values), statistics.stdev(values) if len(values) > 1 else 0.0,
            min(values), max(values))


def summarize(experiment, jobs, results):
    """runs rows, curve rows and summary rows: per configuration, each metric's mean, std over seeds, min and
    max over the runs that have it, and for a target metric how many runs never reached it."""
    runs, curves, groups = [], [], {}
    label_keys = list(experiment.configurations[0][0])
    for (_, _, label, seed, _, _), result in zip(jobs, results):
        configuration = configuration_name(label)
        runs.append({"configuration": configuration, **label, "seed": seed, **result["metrics"]})
        for point in result["curve"]:
            curves.append({"configuration": configuration, "seed": seed, **point})
        groups.setdefault(configuration, (label, []))[1].append(result["metrics"])
    summary = []
    for configuration, (label, metrics_list) in groups.items():
        row = {"configuration": configuration, **label, "seeds": len(metrics_list)}
        for metric in experiment.metrics:
            values = [metrics[metric] for metrics in metrics_list if metrics[metric] is not None]
            for stat, value in zip(("mean", "std", "min", "max"), _statistics(values)):
                row[f"{metric}_{stat}"] = value
            if metric in TARGET_METRICS:
                row[f"{metric}_never"] = len(metrics_list) - len(values)
        summary.append(row)
    run_columns = ["configuration"] + label_keys + ["seed"] + list(results[0]["metrics"])
    curve_columns = list(curves[0]) if curves else []
    summary_columns = ["configuration"] + label_keys + ["seeds"] + [
        f"{metric}_{stat}" for metric in experiment.metrics
        for stat in ("mean", "std", "min", "max") + (("never",) if metric in TARGET_METRICS else ())]
    return (runs, run_columns), (curves, curve_columns), (summary, summary_columns)


def _cell(text):
    return str(text).replace("|", "\\|")  # a | inside a Markdown table cell


def _seed_range(seeds):
    return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])


def verdicts_counted(verdicts):
    """"Claims (RL effects that could come out either way): 2 hold, 1 within noise. Checks (identities and
    properties of the code): 1 holds." over one experiment's verdicts; a kind it has none of is left out."""
    words = {HOLDS: ("holds", "hold"), FAILS: ("does not hold", "do not hold"), NOISE: ("within noise",) * 2}
    parts = []
    for kind, title in ((CLAIM, "Claims (RL effects that could come out either way)"),
                        (CHECK, "Checks (identities and properties of the code)")):
        found = [verdict["verdict"] for verdict in verdicts if verdict["kind"] == kind]
        counts = [(name, found.count(name)) for name in (HOLDS, FAILS, NOISE) if found.count(name)]
        if counts:
            parts.append(f"{title}: " + ", ".join(f"{number} {words[name][number != 1]}" for name, number in counts)
                         + ".")
    return " ".join(parts)


def summary_markdown(experiment, seeds, summary_rows, verdicts):
    """The summary as Markdown: the claim, the verdicts (each row naming its kind, claim or check, and the
    verdicts of each kind counted apart), then one row per configuration with each metric as mean +- std
    [min, max] over the seeds that have it (and how many never reached the target), then the exact
    tables."""
    lines = [f"**{experiment.name}**: {experiment.summary}", "", experiment.claim, "",
             f"Source: {experiment.source}. Seeds {_seed_range(seeds)}, the same for every configuration "
             f"(paired); 95% intervals: Student's t for a mean, Wilson's for a share. "
             f"Default seeds {experiment.seeds} (an effect in standard deviations of its per-seed values): "
             f"{experiment.seeds_reason}.", "",
             verdicts_counted(verdicts), "",
             "| kind | verdict | seeds | needs | claim | mean or share [95% interval] |", "|---|---|---|---|---|---|"]
    for verdict in verdicts:
        lines.append(f"| {verdict['kind']} | {verdict['verdict']} | {count_text(verdict)} | {verdict['needs']} "
                     f"| {_cell(verdict['claim'])} | {interval_text(verdict)} |")
    notes = [f"- {verdict['claim']}: {verdict['note']}" for verdict in verdicts if verdict["note"]]
    if notes:
        lines += [""] + notes
    header = ["configuration", "seeds"] + experiment.metrics
    lines += ["", "Each configuration's metrics over its seeds: mean +- standard deviation [lowest, highest] (a spread, "
              "not an interval).", "",
              "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in summary_rows:
        cells = [row["configuration"], str(row["seeds"])]
        for metric in experiment.metrics:
            never = row.get(f"{metric}_never", 0)
            if row[metric + "_mean"] is None:
                cells.append(f"never reached {TARGET} ({never} of {row['seeds']})")
                continue
            cell = (f"{number_text(row[metric + '_mean'])} +- {number_text(row[metric + '_std'])} "
                    f"[{number_text(row[metric + '_min'])}, {number_text(row[metric + '_max'])}]")
            cells.append(cell + (f"; {never} of {row['seeds']} never reached {TARGET}" if never else ""))
        lines.append("| " + " | ".join(cells) + " |")
    for table_name, (columns, rows) in experiment.tables.items():
        lines += ["", f"{table_name} (exact, no seeds):", "",
                  "| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        lines += ["| " + " | ".join(number_text(row[column]) for column in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def command_of(name, seeds=None, seed_start=0, quick=False):
    """The command that writes an experiment's folder with these flags."""
    return (f"python experiments.py {name}" + (f" --seeds {seeds}" if seeds is not None else "")
            + (f" --seed-start {seed_start}" if seed_start else "") + (" --quick" if quick else ""))


def experiment_files(experiment, seeds, jobs, results, folder, command=None):
    """{path: text} of one experiment's outputs over the list `seeds` (the figure is added by the caller)."""
    (runs, run_columns), (curves, curve_columns), (summary, summary_columns) = summarize(experiment, jobs, results)
    by_seed = results_by_seed(jobs, results)
    verdicts = [check_claim(claim, by_seed) for claim in experiment.claims]
    files = {
        os.path.join(folder, "runs.csv"): csv_text(runs, run_columns),
        os.path.join(folder, "summary.csv"): csv_text(summary, summary_columns),
        os.path.join(folder, "summary.md"): summary_markdown(experiment, seeds, summary, verdicts),
    }
    if curves:
        files[os.path.join(folder, "curves.csv")] = csv_text(curves, curve_columns)
    for table_name, (columns, rows) in experiment.tables.items():
        files[os.path.join(folder, f"{table_name}.csv")] = csv_text(rows, columns)
    files[os.path.join(folder, "settings.json")] = json_text({
        "experiment": experiment.name,
        "summary": experiment.summary,
        "source": experiment.source,
        "claim": experiment.claim,
        "claims": verdicts,
        "command": command or command_of(experiment.name),
        "seeds": list(seeds),
        "configurations": [{"label": label, "runner": runner,
                            "options": {key: list(value) if isinstance(value, tuple) else value
                                        for key, value in options.items()}}
                           for label, runner, options in experiment.configurations],
        "metrics": experiment.metrics,
        "curves": list(experiment.curves),
        "figure": experiment.figure,
        "summary_statistics": ("mean, std (sample, over seeds), min and max of each metric per configuration, over "
                               "the runs that have it; a target metric's runs that never reached it are counted "
                               "('never') and left out of its statistics"),
        "seeds_reason": experiment.seeds_reason,
        **({"sft_start": "one per seed: every transformer run starts from the SFT start trained with its own seed "
                         "(sft_seed = seed)"}
           if any(runner in TRANSFORMER_RUNNERS for _, runner, _ in experiment.configurations) else {}),
        "verdicts": ("count: holds when at least the required seeds show the property; greater: holds when the "
                     "95% t-interval of the mean is above 0, does not hold when it is below 0, within noise "
                     "otherwise (the seeds above 0 are counted, not asked); within: holds when the interval lies "
                     "inside +-margin, does not hold when it lies wholly outside. A run that never reached a target "
                     "counts at its budget (its last iteration, or the tokens or actions it sampled; raised to the other "
                     "run's value when below it, and a tie when neither reached it): 'at_budget' seeds. kind: "
                     "'check' (an identity or a property of the code, whose answer is known) or "
                     "'claim' (an RL effect that could come out either way)"),
        "torch": torch.__version__,
    })
    return files


def atlas_rows(folder, names=None):
    """[(experiment, settings)] of the experiment folders under `folder` that hold a settings.json, in the
    atlas's order (`experiments()`), then any other in name order."""
    order = list(experiments()) if names is None else list(names)
    present = sorted(entry for entry in os.listdir(folder)
                     if os.path.isfile(os.path.join(folder, entry, "settings.json")))
    rows = []
    for name in [name for name in order if name in present] + [name for name in present if name not in order]:
        with open(os.path.join(folder, name, "settings.json"), encoding="utf-8") as handle:
            rows.append((name, json.load(handle)))
    return rows


def atlas_markdown(rows, held_out=(), kinds=KINDS):
    """The atlas's verdicts as one Markdown table, rendered from the committed settings.json files (never
    typed by hand): experiment, kind, claim, verdict with its count, and the mean or share with its 95%
    interval. rows: `atlas_rows` of one atlas folder; held_out: `atlas_rows` of more folders (other seeds,
    e.g. --seed-start 100), whose verdicts on the same claims get a column each; kinds: the kinds of claims
    the table shows (both by default)."""
    extra = [_verdicts_of(other) for other in held_out]
    header = ["experiment", "kind", "claim", "needs", _first_seed_title("verdict", rows),
              "mean or share [95% interval]"]
    header += [_first_seed_title("verdict", other) for other in held_out]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for name, settings in rows:
        for verdict in settings.get("claims", []):
            if verdict.get("kind") not in kinds:
                continue
            cells = [name, verdict["kind"], verdict["claim"], verdict.get("needs", ""),
                     f"{verdict['verdict']}, {count_text(verdict)}", interval_text(verdict)]
            for verdicts in extra:
                other = verdicts.get((name, verdict["claim"]))
                cells.append(f"{other['verdict']}, {count_text(other)}" if other else "-")
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def verdict_counts(rows):
    """{kind: {verdict: how many}} over `atlas_rows` of one atlas folder: the headline, claims and checks
    apart (every kind and verdict present, 0 where none)."""
    counts = {kind: dict.fromkeys((HOLDS, FAILS, NOISE), 0) for kind in KINDS}
    for _, settings in rows:
        for verdict in settings.get("claims", []):
            counts[verdict["kind"]][verdict["verdict"]] += 1
    return counts


def verdict_agreement(rows, other):
    """{kind: (same, shared)}: of the claims (and checks) that two atlas folders (two seed sets, as their
    `atlas_rows`) both judge, how many get the same verdict in both."""
    theirs = _verdicts_of(other)
    agreement = {kind: [0, 0] for kind in KINDS}
    for key, verdict in _verdicts_of(rows).items():
        if key in theirs:
            agreement[verdict["kind"]][0] += verdict["verdict"] == theirs[key]["verdict"]
            agreement[verdict["kind"]][1] += 1
    return {kind: tuple(pair) for kind, pair in agreement.items()}


def _verdicts_of(rows):
    """{(experiment, claim text): verdict} of an atlas folder's `atlas_rows`."""
    return {(name, verdict["claim"]): verdict for name, settings in rows for verdict in settings.get("claims", [])}


def first_seeds(rows):
    """"100": the seed set of an atlas folder's `atlas_rows`, by its first seed (the experiments run different
    numbers of seeds from it); "" when no experiment has seeds."""
    return ", ".join(map(str, sorted({settings["seeds"][0] for _, settings in rows if settings.get("seeds")})))


def _first_seed_title(title, rows):
    """"verdict (seeds from 100)": a column's title for the seed set of `rows`."""
    starts = first_seeds(rows)
    return f"{title} (seeds from {starts})" if starts else title


def sft_starts(selected, seeds=None, seed_start=0):
    """The distinct SFT starts (train_sft_start's keyword arguments) that the selected experiments' transformer
    runs load, over their seeds (`seed_list`): one per seed and setting, in the order first needed."""
    starts = {}
    for experiment in selected:
        for _, runner, options in experiment.configurations:
            if SFT_STARTS.get(runner) is not None:
                for seed in seed_list(experiment, seeds, seed_start):
                    start = SFT_STARTS[runner](seed, **{"sft_seed": seed, **options})
                    starts.setdefault(json.dumps(start, sort_keys=True), start)
    return list(starts.values())


def sft_folders(selected, seeds=None, seed_start=0):
    """The SFT cache folders the selected experiments' transformer runs train into (checked before any run)."""
    return sorted({sft.cache_folder_of(TASKS[start["task"]](start["max_new_tokens"]), sft.SFTConfig(**start["config"]),
                                       start["folder"]) for start in sft_starts(selected, seeds, seed_start)})


def warm_start(selected, seeds=None, seed_start=0, jobs_count=1, report=print):
    """Train (or load) every SFT start the selected experiments' transformer runs load, once, over `jobs_count`
    workers, before the runs: the runs then all find their start cached instead of two workers training one."""
    jobs = [("sft", index, {}, start["config"]["seed"], "train_sft_start", start)
            for index, start in enumerate(sft_starts(selected, seeds, seed_start))]
    iterator = map(_run_job, jobs) if jobs_count == 1 or len(jobs) < 2 else _results_from_workers(jobs, jobs_count)
    try:
        for done, (index, seconds, _) in enumerate(iterator, start=1):
            if seconds > 1.0:  # a start trained now (a cached one loads in milliseconds)
                report(f"[sft {done}/{len(jobs)}] SFT start, seed {jobs[index][3]}: {seconds:.1f} s")
    finally:
        if hasattr(iterator, "close"):
            iterator.close()


def run_experiments(names, seeds, jobs_count, finished, report=print, table=None, seed_start=0):
    """Run the named experiments' runs over `jobs_count` workers; call finished(name, experiment, seeds,
    jobs, results) as soon as all runs of one experiment are done (results in job order). seeds: how many
    per experiment (None: each experiment's own), from seed_start. The costliest runs start first; one
    progress line per finished run goes to `report`, with an ETA weighted by the experiments' costs.
    table: {name: Experiment}, default `experiments()`. Returns {name: seconds}, each experiment's run
    time summed over its runs."""
    table = experiments() if table is None else table
    import_torch_lazy_modules()  # forked workers inherit them
    warm_start([table[name] for name in names], seeds, seed_start, jobs_count, report)
    all_jobs, owner, seeds_of = [], {}, {}
    for name in names:
        seeds_of[name] = seed_list(table[name], seeds, seed_start)
        for job in jobs_of(table[name], seeds_of[name]):
            owner[len(all_jobs)] = name
            all_jobs.append((name, len(all_jobs)) + job[2:])
    cost = {index: table[owner[index]].cost for index in owner}
    order = sorted(range(len(all_jobs)), key=lambda index: -cost[index])  # stable: ties keep the table's order
    pending = {name: sum(1 for index in owner if owner[index] == name) for name in names}
    results, seconds_of = {}, dict.fromkeys(names, 0.0)
    total_cost, done_cost = sum(cost.values()), 0.0
    import_torch_lazy_modules()  # before the ETA's clock, and forked workers inherit them
    started = time.perf_counter()
    ordered = [all_jobs[index] for index in order]
    iterator = map(_run_job, ordered) if jobs_count == 1 else _results_from_workers(ordered, jobs_count)
    try:
        for done, (index, seconds, result) in enumerate(iterator, start=1):
            results[index] = result
            name = owner[index]
            seconds_of[name] += seconds
            done_cost += cost[index]
            elapsed = time.perf_counter() - started
            job = all_jobs[index]
            eta = elapsed / done_cost * (total_cost - done_cost) if done_cost > 0 else 0.0
            report(f"[{done:3d}/{len(all_jobs)}] {name} {configuration_name(job[2])} seed {job[3]}: {seconds:.2f} s   "
                   f"ETA {eta:.0f} s")
            pending[name] -= 1
            if pending[name] == 0:
                indices = [i for i in range(len(all_jobs)) if owner[i] == name]
                finished(name, table[name], seeds_of[name], [all_jobs[i] for i in indices],
                         [results[i] for i in indices])
    finally:  # an early exit stops the workers now, not when the generator is collected
        if hasattr(iterator, "close"):
            iterator.close()
    return seconds_of
