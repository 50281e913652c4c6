"""Benchmark the drivers: whole-process wall time, the fixed start-up, the training loop alone, tokens/s.

    python bench.py                 # 3 runs of each figure, medians, with the machine named
    python bench.py --runs 7        # more runs on a noisy machine
    python bench.py --part transformer --output results-bench/transformer.json   # what docs/ quotes
    python bench.py --part suite --runs 3 --output results-bench/suite.json      # the test suite, as README quotes

It prints, per driver: the wall time of the whole default command in a fresh
process; the fixed start-up every process pays (`import torch` plus the first torch optimizer, which
imports torch._dynamo); the training loop alone, in this process after that start-up; and, for the
online driver, the sampled tokens per second. For the transformer policy (tiny_lm.py): sampled tokens
per second with and without the KV cache and in lower precisions, and the time to score a batch.
Timings are machine-dependent and noisy: compare medians of the same script on the same machine,
never against a number measured elsewhere. With --output it also writes the figures, the lines
printed and the machine they were measured on to a JSON file; the guide quotes the committed
results-bench/transformer.json with its machine named.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from lab.io import OneLineErrorParser, flags_first, int_flag, json_text, output_file_or_exit, run_cli, write_files

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------

PARTS = ("all", "drivers", "transformer", "suite")


def build_parser():
    parser = OneLineErrorParser(prog="bench.py", description="Time every driver: whole process, start-up, "
                                "training loop, tokens/s; the tiny transformer's sampling, SFT and RL run.")
    parser.add_argument("--runs", type=int_flag(1, 50), default=3,
                        help="runs of each figure, integer in [1, 50]; the median is shown (default: 3)")
    parser.add_argument("--part", choices=PARTS, default="all",
                        help="what to time: the drivers (whole process, loop, tokens/s), the transformer "
                             "(tiny_lm sampling and scoring, SFT, one RL run), the test suite (python -m "
                             "unittest), or all (default: all)")
    parser.add_argument("--tests", nargs="+", default=[], metavar="MODULE",
                        help="with --part suite: time only these test modules (default: the whole suite)")
    parser.add_argument("--output", default=None,
                        help="also write the figures, the printed lines and the machine to this JSON file "
                             "(default: off, print only)")
    return parser


def parse(argv=None):
    """The flags, with the output file checked before any timing (a bad one exits 2 with one line)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tests and args.part != "suite":
        parser.error(f"argument --tests: only with --part suite, got --part {args.part}")
    here = os.path.dirname(os.path.abspath(__file__))
    for name in args.tests:
        if not (name.isidentifier() and name.startswith("test_") and os.path.isfile(os.path.join(here, name + ".py"))):
            parser.error(f"argument --tests: {name!r} is not one of the lab's test modules (test_<name>, a "
                         "test_<name>.py beside bench.py)")
    if args.output is not None:
        output_file_or_exit(parser, args.output)
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch and the drivers after the flags: `import torch` takes a second or more, --help none of it
import torch

import online_tokens
import ppo_chain
import rl_lab
import tiny_lm
import token_objectives
from lab.checks import machine, torch_threads

HERE = os.path.dirname(os.path.abspath(__file__))
STARTUP = "import torch; torch.optim.Adam([torch.zeros(1, requires_grad=True)])"
COMMANDS = {  # driver -> (default command, the training loop alone in-process)
    "rl_lab.py (4 bandit trainings)": (["rl_lab.py"], lambda: [rl_lab.train(name) for name in rl_lab.ALGORITHMS]),
    "ppo_chain.py": (["ppo_chain.py"], lambda: ppo_chain.train()),
    "token_objectives.py": (["token_objectives.py"], lambda: token_objectives.run()),
    "online_tokens.py (grpo)": (["online_tokens.py"], lambda: online_tokens.train()),
    "online_tokens.py --algorithm all": (["online_tokens.py", "--algorithm", "all"],
                                         lambda: [online_tokens.train(algorithm=name)
                                                  for name in online_tokens.FOUR_ALGORITHMS]),
}


@contextlib.contextmanager
def scratch_folder():
    """A fresh temporary folder for the drivers' outputs, removed when the block ends, however it ends.

    A folder that cannot be removed (TMPDIR made read-only or full meanwhile) is left behind, never
    reported: the error that ended the block is the one to report, and a clean-up error would replace it
    with the bare name of a file inside the folder. tempfile.TemporaryDirectory cannot promise that on
    Python 3.11: even with ignore_cleanup_errors=True, a PermissionError while removing the folder ends
    in a RecursionError.
    """
    folder = tempfile.mkdtemp()
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def timed_process(argv, runs, folder):
    """Median and min wall seconds of `python argv...` in fresh processes (output into `folder`).

    Raises ChildProcessError with the process's own last line when it fails (a full TMPDIR: the driver
    cannot write its files there), which run_cli prints as one line.
    """
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        finished = subprocess.run([sys.executable, *argv], cwd=folder, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, errors="backslashreplace")
        times.append(time.perf_counter() - started)
        if finished.returncode != 0:
            said = (finished.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            raise ChildProcessError(f"{os.path.basename(argv[0])} failed in {folder} (status {finished.returncode}): {said}")
    return statistics.median(times), min(times)


def timed_call(function, runs):
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), min(times)


def sampling_flops(config, batch, prompt_width, steps):
    """Floating-point operations (multiply-adds count 2) of one cached sampling call: the prompt of every
    row at once (batch x prompt_width tokens attending over prompt_width keys), then `steps` - 1 steps of
    one token per row attending over the keys so far, and the LM head once per sampled token. The
    layer norms, GELU and softmax are left out (a few percent)."""
    width, layers = config.d_model, config.n_layer
    weights = (3 + 1 + 2 * config.mlp_ratio) * width * width  # qkv, out projection, MLP: multiply-adds per token
    per_token = lambda keys: layers * (2 * weights + 4 * keys * width)  # noqa: E731  (q k^T and p v: 2 x 2 keys D)
    prompt = batch * prompt_width * per_token(prompt_width)
    sampled = sum(batch * per_token(prompt_width + step) for step in range(1, steps))
    return prompt + sampled + batch * steps * 2 * width * config.vocab_size


def matmul_gflops(runs, config, rows=768, repeats=200):
    """GFLOP/s of this machine's matrix product at the model's shapes, one thread: the (rows x D) @ (D x 4D)
    product of the MLP, the largest kernel of a sampling call; the rate a sampler limited by arithmetic
    alone could reach."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, config.d_model, generator=generator)
    b = torch.randn(config.d_model, config.mlp_ratio * config.d_model, generator=generator)
    seconds, _ = timed_call(lambda: [a @ b for _ in range(repeats)], runs)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] * repeats / seconds / 1e9


def tiny_lm_lines(runs, batch=64, prompt_width=12, new_tokens=16, repeats=10):
    """(lines, figures) of tiny_lm figures for one RL batch: `batch` prompts of 4..prompt_width tokens, left-padded,
    `new_tokens` sampled per prompt by the default TinyLMConfig on one thread. Sampling with and without
    the KV cache (tokens/s over batch x new_tokens positions), with the cache in bfloat16 and float16
    (the sampler/trainer mismatch setting), and scoring the finished batch as the update does: a forward
    pass without gradient (old or reference log-probs) and a forward + backward pass. Each figure is the
    median over `runs` of the mean of `repeats` calls (one call lasts milliseconds). figures:
    {"parameters", "prompts", "new_tokens", "tokens_sampled", "sampling": {name: {"ms", "tokens_per_s"}},
    "flops_per_sampled_token", "cache_gflops" (the rate sampling with the cache reaches), "matmul_gflops" (the
    machine's, see `matmul_gflops`), "limit_tokens_per_s" (matmul_gflops over the FLOPs a token), "scoring_forward_ms",
    "scoring_forward_backward_ms"}."""
    with torch_threads(1):
        generator = torch.Generator().manual_seed(0)
        config = tiny_lm.TinyLMConfig()
        model = tiny_lm.TinyLM(config, generator=generator)
        lengths = torch.randint(4, prompt_width + 1, (batch,), generator=generator)
        mask = (torch.arange(prompt_width) >= prompt_width - lengths[:, None]).long()  # (B, P) left padding
        ids = torch.where(mask.bool(), torch.randint(3, config.vocab_size, (batch, prompt_width),
                                                     generator=generator), 0)

        def sample(use_cache=True, dtype=None):
            return tiny_lm.generate(model, ids, mask, new_tokens, eos_id=1, pad_id=0, use_cache=use_cache,
                                    dtype=dtype, generator=torch.Generator().manual_seed(1))

        out = sample()
        steps = int(out.completion_mask.any(dim=0).sum())  # columns sampled before every row ended

        def score(backward):
            log_probs = tiny_lm.completion_log_probs(model, out.sequences, out.attention_mask, out.completion_mask)
            if backward:
                log_probs.sum().backward()

        def per_call(function):  # (median, min) seconds of one call
            median, fastest = timed_call(lambda: [function() for _ in range(repeats)], runs)
            return median / repeats, fastest / repeats

        lines = [f"tiny_lm.py (default config, {model.num_parameters():,} parameters, 1 thread): {batch} prompts "
                 f"of 4-{prompt_width} tokens, left-padded, x {new_tokens} new tokens ({batch * steps} sampled)"]
        figures = {"parameters": model.num_parameters(), "prompts": batch, "new_tokens": new_tokens,
                   "tokens_sampled": batch * steps, "sampling": {}}
        for key, name, options in (("cache", "sampling with the KV cache", {}),
                                   ("no_cache", "sampling without the cache", {"use_cache": False}),
                                   ("cache_bfloat16", "sampling with the cache, bfloat16", {"dtype": torch.bfloat16}),
                                   ("cache_float16", "sampling with the cache, float16", {"dtype": torch.float16})):
            seconds, fastest = per_call(lambda: sample(**options))
            figures["sampling"][key] = {"ms": round(seconds * 1e3, 2), "tokens_per_s": round(batch * steps / seconds)}
            lines.append(f"  {name:36s} {seconds * 1e3:7.1f} ms [{fastest * 1e3:.1f}] "
                         f"{batch * steps / seconds:9,.0f} tokens/s")
        flops = sampling_flops(config, batch, prompt_width, steps)
        achieved = flops / (figures["sampling"]["cache"]["ms"] / 1e3) / 1e9
        peak = matmul_gflops(runs, config)
        limit = peak * 1e9 / (flops / (batch * steps))  # tokens/s of a sampler limited by arithmetic alone
        figures.update(flops_per_sampled_token=round(flops / (batch * steps)), cache_gflops=round(achieved, 2),
                       matmul_gflops=round(peak, 1), limit_tokens_per_s=round(limit))
        lines.append(f"  {'FLOPs with the cache':36s} {flops / (batch * steps) / 1e3:7.0f} k a sampled token "
                     f"(prompt included): {achieved:.1f} GFLOP/s, {achieved / peak:.0%} of the {peak:.0f} GFLOP/s "
                     f"of this machine's matrix product at the MLP's shape (a limit of {limit:,.0f} tokens/s)")
        with torch.no_grad():
            forward, fastest = per_call(lambda: score(False))
        lines.append(f"  {'scoring forward (no gradient)':36s} {forward * 1e3:7.1f} ms [{fastest * 1e3:.1f}] "
                     f"({batch} x {out.sequences.shape[1]} tokens)")
        both, fastest = per_call(lambda: score(True))
        lines.append(f"  {'scoring forward + backward':36s} {both * 1e3:7.1f} ms [{fastest * 1e3:.1f}]")
        figures.update(scoring_forward_ms=round(forward * 1e3, 2), scoring_forward_backward_ms=round(both * 1e3, 2))
    return lines, figures


class PhaseClock:
    """Time spent in named methods while the clock is on: each (owner, method) is wrapped for the block."""

    def __init__(self, **methods):
        self.methods, self.seconds = methods, {name: 0.0 for name in methods}

    def __enter__(self):
        self.saved = {}
        for name, (owner, attribute) in self.methods.items():
            original = getattr(owner, attribute)
            self.saved[name] = (owner, attribute, original)

            def timed(*args, _original=original, _name=name, **kwargs):
                started = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.seconds[_name] += time.perf_counter() - started

            setattr(owner, attribute, timed)
        return self

    def __exit__(self, *exc):
        for owner, attribute, original in self.saved.values():
            setattr(owner, attribute, original)
        return False


def transformer_lines(runs):
    """The transformer policy end to end: the SFT warm start (trained once into a fresh cache), one default
    RL run (`online_tokens.py --policy transformer`, 100 iterations) and the share of an iteration spent
    sampling, scoring (the old and reference log-probs), updating and evaluating. Returns (lines, figures):
    {"parameters", "sft_steps", "sft_seconds", "rl_iterations", "rl_run_seconds", "iteration_ms",
    "shares": {phase: share of an iteration}}."""
    import countdown
    import policies
    import sft

    with scratch_folder() as cache, torch_threads(1):
        task = countdown.CountdownTask()
        started = time.perf_counter()
        model, report, _ = sft.load_or_train(task, sft.SFTConfig(), cache)
        sft_seconds = time.perf_counter() - started
        run = timed_call(lambda: online_tokens.train(policy="transformer", sft_folder=cache, eval_samples=0), runs)
        state = online_tokens.setup(policy="transformer", sft_folder=cache, eval_samples=0)
        clock = PhaseClock(sampling=(policies.TransformerPolicy, "sample"), rollout=(online_tokens, "rollout"),
                           updating=(online_tokens, "update"), evaluating=(online_tokens, "evaluate"))
        with clock:
            started = time.perf_counter()
            online_tokens.run(state)
            total = time.perf_counter() - started
    phases = {"sampling": clock.seconds["sampling"], "scoring": clock.seconds["rollout"] - clock.seconds["sampling"],
              "updating": clock.seconds["updating"], "evaluating": clock.seconds["evaluating"]}
    phases["the rest (credit, records)"] = total - sum(phases.values())
    iterations = state.cfg.steps
    lines = [f"transformer policy on Countdown ({model.num_parameters():,} parameters, 1 thread):",
             f"  SFT warm start ({sft.SFTConfig().steps} steps, trained once): {sft_seconds:.1f} s "
             f"(completion loss {report['loss']['initial']:.3f} -> {report['loss']['final']:.3f})",
             f"  RL run (grpo, {iterations} iterations of {state.cfg.prompts} x {state.cfg.group_size}, no sampled "
             f"evaluation): {run[0]:.1f} s [{run[1]:.1f}]",
             f"  one iteration, {total / iterations * 1e3:.0f} ms:"]
    lines += [f"    {name:28s} {seconds / total:6.1%}" for name, seconds in phases.items()]
    figures = {"parameters": model.num_parameters(), "sft_steps": sft.SFTConfig().steps,
               "sft_seconds": round(sft_seconds, 2), "rl_iterations": iterations, "rl_run_seconds": round(run[0], 2),
               "iteration_ms": round(total / iterations * 1e3, 1),
               "shares": {name: round(seconds / total, 4) for name, seconds in phases.items()}}
    return lines, figures


class ClassClock:
    """A unittest result that times each test class: wall and CPU seconds (os.times of this process plus
    its waited-for children) from the end of the previous class's last test to the end of this class's
    last test, so a class's setUpClass (and its module's setUpModule) is counted with it."""

    def __init__(self):
        self.seconds = {}  # "module.Class" -> [tests, wall, cpu]
        self.last = self._now()

    @staticmethod
    def _now():
        times = os.times()
        return time.perf_counter(), times.user + times.system + times.children_user + times.children_system

    def result(self):
        import unittest

        clock = self

        class Result(unittest.TextTestResult):
            def stopTest(self, test):
                super().stopTest(test)
                clock.stopped(test)

        return Result

    def stopped(self, test):
        now = self._now()
        name = f"{type(test).__module__}.{type(test).__name__}"
        entry = self.seconds.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += now[0] - self.last[0]
        entry[2] += now[1] - self.last[1]
        self.last = now


def suite_child(names):
    """Run the tests `names` (module names; all of discovery when empty) as `python -m unittest` does, from
    this folder, timing each class; print one JSON line {"seconds", "cpu_seconds", "failures", "classes":
    {class: [tests, wall, cpu]}} last on stdout. Returns the exit status (1 when a test failed)."""
    import json
    import unittest

    os.chdir(HERE)
    started = ClassClock._now()
    loader = unittest.TestLoader()
    suite = loader.loadTestsFromNames(names) if names else loader.discover(HERE)
    clock = ClassClock()  # the imports of discovery are in the total, not in the first class
    runner = unittest.TextTestRunner(stream=open(os.devnull, "w"), resultclass=clock.result())
    outcome = runner.run(suite)
    ended = ClassClock._now()
    broken = [str(test) for test, _ in outcome.failures + outcome.errors]
    print(json.dumps({"seconds": ended[0] - started[0], "cpu_seconds": ended[1] - started[1], "failures": broken,
                      "classes": clock.seconds}))
    return 1 if broken else 0


def suite_lines(runs, names=(), rows=None):
    """(lines, figures) of the test suite: `python -m unittest` in this folder (or only the test modules
    `names`), as .ci/run runs it, in a fresh process, timed per test class (see ClassClock). figures
    {"seconds", "min_seconds", "cpu_seconds", "classes": {class: {"tests", "seconds", "cpu_seconds"}}}, each
    figure the median over `runs`; the table lists the `rows` classes of most CPU (all when None)."""
    import json

    results = []
    for _ in range(runs):
        finished = subprocess.run([sys.executable, "-c", "import bench, sys; sys.exit(bench.suite_child(sys.argv[1:]))",
                                   *names], cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = finished.stdout.strip().splitlines()
        if not said:
            raise ChildProcessError(f"the test suite ended with status {finished.returncode} and no timing: "
                                    + (finished.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1])
        results.append(json.loads(said[-1]))
    median = statistics.median
    classes = {}
    for name in results[0]["classes"]:
        entries = [result["classes"].get(name, [0, 0.0, 0.0]) for result in results]
        classes[name] = {"tests": entries[0][0], "seconds": round(median([e[1] for e in entries]), 2),
                         "cpu_seconds": round(median([e[2] for e in entries]), 2)}
    walls = [result["seconds"] for result in results]
    cpu = median([result["cpu_seconds"] for result in results])
    tests = sum(entry["tests"] for entry in classes.values())
    lines = [f"test suite (python -m unittest{' ' + ' '.join(names) if names else ''}): {median(walls):.0f} s "
             f"[{min(walls):.0f}], {cpu:.1f} CPU s, {tests} tests in {len(classes)} classes"]
    for result in results:
        lines += [f"  FAILED: {test}" for test in result["failures"]]
    ranked = sorted(classes.items(), key=lambda item: -item[1]["cpu_seconds"])
    lines.append(f"  {'class':58s} {'tests':>5s} {'wall s':>7s} {'CPU s':>7s}")
    for name, entry in ranked[:rows]:
        lines.append(f"  {name:58s} {entry['tests']:5d} {entry['seconds']:7.2f} {entry['cpu_seconds']:7.2f}")
    return lines, {"seconds": round(median(walls), 1), "min_seconds": round(min(walls), 1),
                   "cpu_seconds": round(cpu, 1), "classes": classes}


def drivers_lines(runs):
    """Lines of the drivers' figures: the fixed start-up, each default command in a fresh process and its
    training loop alone in this process, the online driver's sampled tokens per second."""
    lines = []
    with scratch_folder() as folder:
        startup = timed_process(["-c", STARTUP], runs, folder)
        lines.append(f"fixed start-up (import torch + first optimizer): {startup[0]:.2f} s [{startup[1]:.2f}]")
        rl_lab.train("dpo", steps=1)  # this process's own start-up, outside every clock below
        lines.append(f"{'driver':34s} {'whole process':>15s} {'training loop':>15s}")
        for name, (command, loop) in COMMANDS.items():
            whole = timed_process([os.path.join(HERE, command[0]), *command[1:]], runs, folder)
            alone = timed_call(loop, runs)
            lines.append(f"{name:34s} {whole[0]:8.2f} s [{whole[1]:.2f}] {alone[0]:8.3f} s [{alone[1]:.3f}]")
    rows = online_tokens.train()[0]
    loop = timed_call(online_tokens.train, runs)
    tokens = rows[-1]["total_tokens_sampled"]
    lines += ["", f"online_tokens.py (grpo, 60 iterations of 8 x 8): {tokens} tokens sampled, "
                  f"{tokens / loop[0]:,.0f} tokens/s (sampling, scoring and updates)"]
    return lines


def main(argv=None):
    args = parse(argv)
    lines = [f"machine: {machine()}", f"runs per figure: {args.runs} (median, min in brackets)"]
    report = {"machine": machine(), "runs": args.runs, "part": args.part,
              "command": " ".join(["python bench.py", *(argv if argv is not None else sys.argv[1:])])}
    torch.set_num_threads(1)  # as the drivers train
    if args.part in ("all", "drivers"):
        lines += ["", *drivers_lines(args.runs)]
    if args.part in ("all", "transformer"):
        sampling_lines, report["tiny_lm"] = tiny_lm_lines(args.runs)
        run_lines, report["transformer"] = transformer_lines(args.runs)
        lines += ["", *sampling_lines, "", *run_lines]
    if args.part in ("all", "suite"):
        suite, report["suite"] = suite_lines(args.runs, args.tests)
        lines += ["", *suite]
    print("\n".join(lines))
    if args.output is not None:
        report["lines"] = lines
        write_files({args.output: json_text(report)})
        print(f"-> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
