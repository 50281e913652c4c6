"""The course's exercises: write the lab's atoms yourself, have them graded, then train with them.

    python exercises.py start                       # writes my_atoms.py: one stub per exercise, in the course's order
    python exercises.py check                       # grades my_atoms.py: one line per atom
    python exercises.py check --atom gae            # one atom
    python exercises.py train                       # the bandit (and the online task) with your passing atoms

Each exercise is one atom of rl_lab.py (pass_at_k: countdown.py), with the same name and signature.
The cases that grade it are the ones that test the lab's own atom (exercise_cases.py): hand-computed
values, slow references, invariants and gradient checks, each with a hint that names the usual
mistake and the chapter's section that explains it. The solutions are the lab's atoms.

`check` imports the learner's file in this process (it never runs it as a script) and reports, per
atom, `passed (N cases)`, `not started` (the stub still raises NotImplementedError) or the first
failing case. `train` puts the atoms that pass `check` in place of the lab's for the duration of
each run, and prints each run's result beside the lab's own run.

The learner's code shares the process with the cases and the lab's runs, so it must leave the process
as it found it: a file or an atom that changes torch's settings (default dtype, grad mode, threads,
global generator) or a name in the lab's modules (`rl_lab.gae = ...`), changes an input in place, or
exits (sys.exit, os._exit) fails with one line, and the change is put back. An atom that never returns
is stopped by Ctrl-C: the atoms graded so far are printed, then one line, status 130.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import inspect
import math
import operator
import os
import sys
import traceback
import types
from dataclasses import dataclass

from lab.io import (
    OneLineErrorParser,
    WriteFailed,
    flags_first,
    input_file_problem,
    int_flag,
    one_line,
    output_file_problem,
    run_cli,
)

DEFAULT_FILE = "my_atoms.py"
BANDIT_STEPS = 60  # a short run: the lab's four algorithms are above 0.97 expected reward by then
ONLINE_STEPS = 30  # the online task's success probability passes 0.98 by then
SEED = 7
SHOWN_CHARACTERS = 160  # an input or a value longer than this is cut in a report line

# ---------------------------------------------------------------------------------------------
# Command line: the flags first, so that --help and a bad flag answer before torch is loaded
# ---------------------------------------------------------------------------------------------

# the exercises' atoms in the course's order: exercise_cases.BY_NAME's keys without torch (test_cli checks them)
ATOMS = ("response_token_logps", "completion_mask", "reinforce_loss", "gae", "truncated_importance_weights",
         "clipped_policy_loss", "cispo_policy_loss", "sequence_log_ratio", "kl_k1", "kl_k2", "kl_k3", "categorical_kl",
         "dpo_loss", "group_advantages", "rloo_advantages", "reduce_token_loss", "overlong_penalty", "pass_at_k")


def build_parser():
    parser = OneLineErrorParser(
        prog="exercises.py",
        description="The course's exercises: write the lab's atoms in your own file (start), have them graded by "
                    "the lab's own cases (check), then train the bandit and the online task with them (train).",
    )
    parser.add_argument("command", choices=("start", "check", "train"), metavar="{start,check,train}",
                        help="start: write the stubs; check: grade them; train: train with the ones that pass")
    parser.add_argument("--file", default=DEFAULT_FILE,
                        help=f"the learner's file; start refuses to replace an existing path (default: {DEFAULT_FILE})")
    parser.add_argument("--bare", action="store_true",
                        help="start: stubs without the formulas, to derive them from the chapters (default: off, "
                             "each stub gives its formula)")
    parser.add_argument("--atom", choices=ATOMS, metavar="NAME",
                        help="check: grade this one atom only, by the lab's name of it (default: every atom)")
    parser.add_argument("--steps", type=int_flag(1, 1000), default=BANDIT_STEPS,
                        help=f"train: bandit iterations per algorithm, in [1, 1000] (default: {BANDIT_STEPS})")
    parser.add_argument("--online-steps", type=int_flag(1, 1000), default=ONLINE_STEPS,
                        help=f"train: online task iterations per algorithm, in [1, 1000] (default: {ONLINE_STEPS})")
    return parser


def file_problem(command, path):
    """Why --file cannot be used by `command` (start writes it, check and train read it), or None."""
    if command == "start":
        if os.path.lexists(path):
            return f"{path} already exists; start never replaces a file (choose another --file)"
        folder = os.path.dirname(path)
        problem = output_file_problem(path)
        if problem is None and folder and not os.path.isdir(folder):
            problem = f"the folder {folder!r} does not exist (create it first)"
        return problem
    problem = "expected a file path" if not path else input_file_problem(path)
    if problem is not None:
        hint = f"; write one with python exercises.py start --file {path}" if path and not os.path.lexists(path) else ""
        return f"{path!r}: {problem}{hint}"
    return None


def parse(argv=None):
    """The flags, with every check made before any work (a bad one exits 2 with one line naming it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    given = set(argv if argv is not None else sys.argv[1:])
    if args.atom is not None and args.command != "check":
        parser.error(f"argument --atom: only applies to check, not to {args.command}")
    if args.bare and args.command != "start":
        parser.error(f"argument --bare: only applies to start, not to {args.command}")
    for flag in ("--steps", "--online-steps"):
        if args.command != "train" and any(item == flag or item.startswith(flag + "=") for item in given):
            parser.error(f"argument {flag}: only applies to train, not to {args.command}")
    problem = file_problem(args.command, args.file)
    if problem is not None:
        parser.error(f"argument --file: {problem}")
    return args


if __name__ == "__main__":
    flags_first(parse)

# torch and the lab's modules after the flags: `import torch` takes a second or more, --help none of it
import torch

import online_algorithms
import online_tokens
import rl_lab
from exercise_cases import BY_NAME, EXERCISES, failure
from lab.checks import torch_threads

# ---------------------------------------------------------------------------------------------
# start: the learner's file
# ---------------------------------------------------------------------------------------------

HEADER = '''"""My atoms: one stub per exercise of the course (docs/learn/), in the chapters' order.

    python exercises.py check --file {file}              # grade every atom written so far
    python exercises.py check --file {file} --atom gae   # one atom
    python exercises.py train --file {file}              # train the bandit with the atoms that pass

Replace each `raise NotImplementedError` by your code; a stub left as it is counts as not started.
Each function has the name and the signature of the lab's atom. The solutions are rl_lab.py's atoms
(pass_at_k: countdown.py's): read them after you have tried.

Shapes: B prompts or sequences, G group size, N responses, T tokens or time steps, R response
positions, V vocabulary, A actions. Tensors are float64, log-probabilities are in nats. The keyword
`check` is the lab's switch for validating arguments: you may ignore it.
"""

import math

import torch
import torch.nn.functional as F

from rl_lab import token_kl_penalty  # the lab's k3: cispo_policy_loss's default estimator, as in the lab
'''


@functools.cache
def _source_tree(filename):
    """The ast of a lab module's source, parsed once (rl_lab.py holds most of the 18 atoms)."""
    with open(filename, encoding="utf-8") as handle:
        return ast.parse(handle.read())


def _definition(function):
    """The ast node of a lab atom's definition, read from its module's source."""
    function = inspect.unwrap(function)
    tree = _source_tree(inspect.getsourcefile(function))
    return next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function.__name__)


def _wrapped_def(name, arguments, width=100):
    """`def name(arguments):`, wrapped at the commas so that no line passes `width`."""
    line = f"def {name}({arguments}):"
    if len(line) <= width:
        return line
    lines, current = [f"def {name}("], "   "
    for part in arguments.split(", "):
        if len(current) + len(part) + 2 > width:
            lines.append(current.rstrip())
            current = "   "
        current += f" {part},"
    lines.append(current)
    return "\n".join(lines) + "\n):"


def bare(doc):
    """An exercise's docstring without its formula: the lines indented under the text (the formula block)
    go, so that the learner derives them from the chapter; the shapes, what to detach and the source stay."""
    return "\n".join(line for line in doc.split("\n") if not line.startswith(" " * 8))


def stub_text(file_name=DEFAULT_FILE, formulas=True):
    """The text of a learner's file: the header, then every exercise's stub under its chapter (without
    the formulas when `formulas` is false)."""
    parts, chapter = [HEADER.format(file=file_name)], None
    for exercise in EXERCISES:
        if exercise.chapter != chapter:
            chapter = exercise.chapter
            title = f"# --- {chapter}: docs/learn/{chapter}.md "
            parts.append(f"\n\n{title}{'-' * max(3, 100 - len(title))}\n")
        arguments = ast.unparse(_definition(exercise.solution).args)
        parts.append(f"\n\n{_wrapped_def(exercise.name, arguments)}\n"
                     f'    """{exercise.doc if formulas else bare(exercise.doc)}\n\n'
                     f'    Chapter: docs/learn/{exercise.chapter}.md\n    """\n'
                     f"    raise NotImplementedError\n")
    return "".join(parts)


def start(parser, path, formulas=True):
    """Write the stubs to `path`; an existing path of any kind is refused and left as it is, and a write
    that fails (a full disk) leaves no file."""
    text = stub_text(os.path.basename(path), formulas)
    created = False
    try:
        with open(path, "x", encoding="utf-8") as handle:  # "x": fails rather than replace a file made meanwhile
            created = True
            handle.write(text)
    except FileExistsError:
        parser.error(f"argument --file: {path} already exists; start never replaces a file (choose another --file)")
    except BaseException as error:  # the write or the close (the last buffer) failed, or a Ctrl-C came
        if created:
            os.remove(path)  # never leave half a file
        if isinstance(error, OSError):
            raise WriteFailed(f"cannot write {path}: {error.strerror or error}; nothing was written") from None
        raise
    print(f"wrote {path}: {len(EXERCISES)} stubs, chapters 01-10; next: python exercises.py check --file {path}")
    return 0


# ---------------------------------------------------------------------------------------------
# check: grading a learner's file
# ---------------------------------------------------------------------------------------------


class LearnerFileError(Exception):
    """The learner's file does not import; the message is one line naming the file and the line."""


# ---------------------------------------------------------------------------------------------
# The learner's code runs in this process: whatever it changes for the process is put back
# ---------------------------------------------------------------------------------------------
# The learner's file and atoms run in the lab's own process, beside the cases, their references and the
# lab's own runs. learner_code() records what they could change for all of those, puts back whatever a
# block of the learner's code changed, and lists it, so that the change is reported as the learner's (an
# atom is a pure function) and never alters a later case or the lab's values:
# - the process settings below (torch's default dtype, grad mode, threads, global generator; the output
#   streams; the working folder);
# - the names in the lab's modules (and their registries, one level down) and in torch's, F's, math's and
#   torch.Tensor's namespaces, through which the cases, references and runs find their functions: a
#   learner's `rl_lab.gae = gae` would otherwise make the lab's own run use the learner's gae.
# os._exit, which would end the process at once and without a word, raises LearnerExit in the block.

HERE = os.path.dirname(os.path.abspath(__file__))


def _set_default_device(device):
    torch.set_default_device(None if device.type == "cpu" else device)  # None: no device mode left installed


PROCESS_SETTINGS = (  # (what it is, how it is set, read, put back)
    ("torch's default dtype", "torch.set_default_dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("torch's grad mode", "torch.set_grad_enabled", torch.is_grad_enabled, torch.set_grad_enabled),
    ("torch's thread count", "torch.set_num_threads", torch.get_num_threads, torch.set_num_threads),
    ("torch's default device", "torch.set_default_device", torch.get_default_device, _set_default_device),
    ("torch's global random generator", "torch.manual_seed, or a draw without generator=",
     torch.get_rng_state, torch.set_rng_state),
    ("torch's deterministic mode", "torch.use_deterministic_algorithms", torch.are_deterministic_algorithms_enabled,
     torch.use_deterministic_algorithms),
    ("sys.stdout", "an assignment", lambda: sys.stdout, lambda value: setattr(sys, "stdout", value)),
    ("sys.stderr", "an assignment", lambda: sys.stderr, lambda value: setattr(sys, "stderr", value)),
    ("the working folder", "os.chdir", os.getcwd, os.chdir),
)
SHOWN_CHANGES = 3  # a report names at most this many changes


class LearnerExit(SystemExit):
    """The learner's code called os._exit: raised instead, so that the process can report it."""


def _exit_raises(status):
    raise LearnerExit(status)


# the namespaces outside the lab through which the cases and the lab's atoms find their functions
LIBRARY_NAMESPACES = {"torch": torch, "torch.nn.functional": torch.nn.functional, "torch.Tensor": torch.Tensor,
                      "math": math}


_CLASSIFIED = {}  # module name -> (the module, whether its file is in this folder): torch alone loads a thousand


def _lab_modules():
    """{name: module} of the lab's modules loaded so far: every module whose file is in this folder."""
    found = {}
    for name, module in list(sys.modules.items()):
        known = _CLASSIFIED.get(name)
        if known is None or known[0] is not module:
            path = getattr(module, "__file__", None) or os.sep
            known = module, os.path.dirname(os.path.abspath(path)) == HERE
            if os.path.isabs(path):  # a relative one follows the current folder, which may change
                _CLASSIFIED[name] = known
        if known[1]:
            found[name] = module
    return found


def _snapshot():
    """({name: (namespace, its names and values, {registry name: its items})}, [each process setting]).
    A registry is a dict held by a lab module (rl_lab.KL_ESTIMATORS)."""
    namespaces = {}
    for name, namespace in {**_lab_modules(), **LIBRARY_NAMESPACES}.items():
        names = dict(vars(namespace))
        registries = {} if name in LIBRARY_NAMESPACES else {
            key: dict(value) for key, value in names.items() if type(value) is dict and not key.startswith("__")}
        namespaces[name] = (namespace, names, registries)
    return namespaces, [read() for _, _, read, _ in PROCESS_SETTINGS]


def _same(before, after):
    if isinstance(before, torch.Tensor):
        return isinstance(after, torch.Tensor) and torch.equal(before, after)
    return before == after


def _identical(now, before):
    """Whether two dicts hold the same keys in the same order, each bound to the same object: the common
    case, checked at C speed before the slow comparison that says what changed."""
    return list(now) == list(before) and all(map(operator.is_, now.values(), before.values()))


def _put_back(snapshot):
    """Restore what changed since `snapshot` was taken; return [what changed, in words]. The settings
    first: torch's own setters rebind names (set_default_dtype rebinds torch.Storage)."""
    namespaces, settings = snapshot
    changed = []
    for (what, how, read, put), before in zip(PROCESS_SETTINGS, settings):
        if not _same(before, read()):
            changed.append(f"{what} ({how})")
            put(before)
    for name, (namespace, names, registries) in namespaces.items():
        now = dict(vars(namespace))
        if not _identical(now, names):
            for key, value in names.items():
                if key not in now or now[key] is not value:
                    changed.append(f"{name}.{key}")
                    setattr(namespace, key, value)
            for key, value in now.items():  # a name added; an imported submodule is no change
                if key not in names and not isinstance(value, types.ModuleType):
                    changed.append(f"{name}.{key}")
                    delattr(namespace, key)
        for key, items in registries.items():
            registry = names[key]
            if _identical(registry, items):
                continue
            if registry.keys() != items.keys() or any(registry[entry] is not item for entry, item in items.items()):
                changed.append(f"{name}.{key}")
                registry.clear()
                registry.update(items)
    return changed


@contextlib.contextmanager
def learner_code(changes):
    """Run a block of the learner's code; afterwards (an exception included) everything it changed for the
    process is put back, and `changes` (a list) receives what, in words."""
    snapshot, real_exit = _snapshot(), os._exit
    os._exit = _exit_raises
    try:
        yield
    finally:
        os._exit = real_exit
        changes.extend(_put_back(snapshot))


def changes_text(changes):
    """'a, b and 2 more' for a list of changes."""
    shown = ", ".join(changes[:SHOWN_CHANGES])
    return shown + (f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else "")


def raised_text(error):
    """What the learner's code did, in words: an exit, or an exception and its message."""
    if isinstance(error, SystemExit):
        status = "" if error.code is None else repr(error.code)
        return f"called {'os._exit' if isinstance(error, LearnerExit) else 'sys.exit'}({status})"
    try:
        message = one_line(error)
    except Exception:  # an exception class of the learner's whose __str__ fails
        message = "(its message cannot be shown)"
    return f"raised {type(error).__name__}: {message}"


def _learner_line(error, path):
    """The line of the deepest frame of `error`'s traceback inside the learner's file, or None."""
    where = os.path.abspath(path)
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if frame.filename == where]
    return frames[-1].lineno if frames else None


def load_learner(path):
    """The learner's file as a module, compiled and run in this process as an import would (from its bytes,
    so that Python decodes them as it decodes a module: UTF-8 or the file's coding line; no bytecode
    written, so an edit is always seen). Raises LearnerFileError with one line for a file that does not
    import, exits, or changes the process (see learner_code)."""
    with open(path, "rb") as handle:
        source = handle.read()
    module = types.ModuleType("learner_atoms")
    module.__file__ = os.path.abspath(path)
    try:
        code = compile(source, module.__file__, "exec")
    except (SyntaxError, ValueError) as error:  # ValueError: a NUL byte, before Python 3.12
        line = getattr(error, "lineno", None)
        raise LearnerFileError(f"{path}{f' line {line}' if line else ''}: {type(error).__name__}: "
                               f"{one_line(getattr(error, 'msg', error))} (the file does not import)") from None
    changes = []
    try:
        with learner_code(changes):
            sys.modules[module.__name__] = module  # as during an import: @dataclass looks its module up there
            try:
                exec(code, module.__dict__)  # noqa: S102 (the learner's own file, run as an import would)
            finally:
                del sys.modules[module.__name__]  # never taken for one of the lab's modules afterwards
    except (Exception, SystemExit) as error:
        line = _learner_line(error, path)
        raise LearnerFileError(f"{path}{'' if line is None else f' line {line}'}: {raised_text(error)} "
                               "(the file does not import)") from None
    if changes:
        raise LearnerFileError(f"{path}: importing it changes {changes_text(changes)}; the lab put it back. The "
                               "cases and the lab's runs share this process: a file of atoms leaves it as it found it")
    return module


def short(value):
    """A value on one short line: tensors as nested lists of 6 significant digits. Never raises and never
    reads more of a value than it shows: it is a learner's return value."""
    if isinstance(value, torch.Tensor):
        if value.is_nested or value.layout != torch.strided or value.device.type != "cpu":
            text = f"a {'nested' if value.is_nested else str(value.layout).replace('torch.', '')} tensor " \
                   f"on {value.device.type}"  # its values cannot be listed
        else:
            text = _tensor_text(value.detach())
    elif isinstance(value, (tuple, list)):
        text = "(" + ", ".join(short(item) for item in value[:SHOWN_CHARACTERS]) + ")"
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        try:
            text = repr(value)
        except Exception:  # a learner's object whose repr fails
            text = f"a {type(value).__name__}"
    return text if len(text) <= SHOWN_CHARACTERS else text[:SHOWN_CHARACTERS - 3] + "..."


def _tensor_text(value):
    """A CPU tensor's values; one of more than SHOWN_CHARACTERS elements as its first ones, flattened."""
    cut = value.numel() > SHOWN_CHARACTERS  # cut anyway when shown: listing all of a huge tensor takes minutes
    shown = value.reshape(-1)[:SHOWN_CHARACTERS] if cut else value
    if shown.dtype == torch.bool:
        text = str(shown.tolist()).replace("True", "T").replace("False", "F")
    elif shown.is_floating_point():
        text = str(_rounded(shown.tolist()))
    else:
        text = str(shown.tolist())
    return f"{tuple(value.shape)} {text}" if value.dim() > 1 or cut else text


def _rounded(values):
    if isinstance(values, list):
        return [_rounded(item) for item in values]
    return float(f"{values:.6g}")


def _shown_inputs(case, exercise):
    args, kwargs = case.inputs()
    names = list(inspect.signature(exercise.solution).parameters)
    parts = [f"{name}={short(value)}" for name, value in zip(names, args)]
    parts += [f"{name}={short(value)}" for name, value in kwargs.items()]
    return ", ".join(parts) if parts else "none"


@dataclass(frozen=True)
class Grade:
    """The result of one exercise: status "passed", "not started" or "failed", and its report line."""

    name: str
    status: str
    line: str


def changed_default(solution, function):
    """None when every default value of the lab's atom (a number, string, bool or None; not a function) is
    the learner's too, else which one differs: a case passes its keywords, a run relies on the defaults."""
    try:
        theirs = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a callable without a signature: the cases will say what fails
        return None
    for name, parameter in inspect.signature(solution).parameters.items():
        default = parameter.default
        if default is inspect.Parameter.empty or callable(default) or name not in theirs:
            continue
        mine = theirs[name].default
        try:  # a learner's default may be anything, a tensor among them: never a crash here
            same = type(mine) in (int, float, str, bool, type(None)) and isinstance(mine, bool) == isinstance(
                default, bool) and bool(mine == default)
        except Exception:
            same = False
        if not same:
            shown = "none" if mine is inspect.Parameter.empty else short(mine)
            return f"the default of {name} is {shown}, the lab's is {default!r}"
    return None


def grade(exercise, function, path=None):
    """Run `exercise`'s cases on `function` in order; stop at the first failing one. path: the learner's
    file, to locate an exception raised inside it. Each case runs under learner_code: a case that changes
    the process fails, and the change is put back before the next."""
    if function is None:
        return Grade(exercise.name, "not started", f"{exercise.name}: not started (no function of that name)")
    if not callable(function):
        return Grade(exercise.name, "failed", f"{exercise.name}: failed: {exercise.name} = {short(function)} is not "
                                              "a function")
    changed = changed_default(exercise.solution, function)
    if changed is not None:
        return Grade(exercise.name, "failed", f"{exercise.name}: failed: {changed}; keep the stub's signature (the "
                                              f"lab's runs call the atom with its defaults) (see docs/learn/"
                                              f"{exercise.chapter}.md#exercises)")
    for number, case in enumerate(exercise.cases, start=1):
        where = f'case {number} of {len(exercise.cases)} "{case.name}"'
        hint = f"hint: {case.hint} (see {exercise.pointer(case)})"
        changes = []
        try:
            with learner_code(changes):
                found = failure(case, function)
        except NotImplementedError:
            if number == 1 and not changes:
                return Grade(exercise.name, "not started", f"{exercise.name}: not started")
            found = ("raised NotImplementedError", None, None)
        except (Exception, SystemExit) as error:  # the learner's atom failed: a failing case, never a crash
            line = _learner_line(error, path) if path else None
            raised = short(raised_text(error))[1:-1] + (f" at {path}:{line}" if line else "")
            return Grade(exercise.name, "failed",
                         f"{exercise.name}: failed {where}: input {_shown_inputs(case, exercise)}; {raised}; {hint}")
        if changes:
            return Grade(exercise.name, "failed",
                         f"{exercise.name}: failed {where}: input {_shown_inputs(case, exercise)}; it changed "
                         f"{changes_text(changes)}, which the lab put back: an atom leaves the process as it "
                         "found it (the cases and the lab's runs share it)")
        if found is not None:
            reason, obtained, expected = found
            return Grade(exercise.name, "failed",
                         f"{exercise.name}: failed {where}: input {_shown_inputs(case, exercise)}; "
                         f"expected {short(expected)}, got {short(obtained)} ({reason}); {hint}")
    return Grade(exercise.name, "passed", f"{exercise.name}: passed ({len(exercise.cases)} cases)")


def chosen_exercises(names=None):
    """The exercises `names` (all when None), in the course's order."""
    return [exercise for exercise in EXERCISES if names is None or exercise.name in names]


def atom_of(module, name):
    """The learner's module's `name`, or None: read from its namespace, so that a module __getattr__ of the
    learner's does not run outside learner_code."""
    return vars(module).get(name)


def grade_file(module, path, names=None):
    """[Grade] for the exercises `names` (all when None), in the course's order."""
    return [grade(exercise, atom_of(module, exercise.name), path) for exercise in chosen_exercises(names)]


def check(path, atom):
    """Grade the learner's file, printing each atom's line as soon as it is known: a Ctrl-C (an atom that
    never returns) stops with the lines so far, the interrupted atom's and one line from run_cli."""
    module = load_learner(path)  # checked by parse
    grades = []
    for exercise in chosen_exercises(None if atom is None else [atom]):
        try:
            result = grade(exercise, atom_of(module, exercise.name), path)
        except KeyboardInterrupt:
            print(f"{exercise.name}: interrupted while its cases ran (an endless loop?); the atoms after it were "
                  "not graded", flush=True)
            raise
        print(result.line, flush=True)
        grades.append(result)
    counts = {status: sum(result.status == status for result in grades) for status in ("passed", "failed",
                                                                                        "not started")}
    if len(grades) > 1:
        print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['not started']} not started "
              f"of {len(grades)} exercises")
    return 1 if counts["failed"] else 0


# ---------------------------------------------------------------------------------------------
# train: the lab's loops with the learner's atoms
# ---------------------------------------------------------------------------------------------
# A run looks its atoms up at call time in these modules' namespaces, and in the registries they
# hold (rl_lab.KL_ESTIMATORS, online_algorithms.POLICY_LOSSES and PREFERENCE_LOSSES): every place
# where the lab's atom object is found is given the learner's for the duration of the run, and put
# back in a finally block. The lab's atoms also call each other through rl_lab's namespace (the
# GRPO loss calls clipped_policy_loss), so a learner's atom is used wherever the lab's would be.
PATCHED_MODULES = (rl_lab, online_algorithms, online_tokens)


@dataclass(frozen=True)
class Run:
    """A short training run: its name, the lab atoms it calls (test_exercises checks this against the
    calls counted in a run), the metric that says it learns, and how to run it."""

    name: str
    atoms: tuple
    metric: str
    steps_flag: str
    train: object

    def __call__(self, steps):
        return self.train(steps)


def _bandit(algorithm):
    return lambda steps: rl_lab.train(algorithm, steps=steps, seed=SEED)[0]


def _online(algorithm):
    return lambda steps: online_tokens.train(algorithm=algorithm, steps=steps, seed=SEED)[0]


RUNS = (
    Run("bandit ppo", ("clipped_policy_loss", "gae"), "expected_reward", "--steps", _bandit("ppo")),
    Run("bandit dpo", ("dpo_loss",), "expected_reward", "--steps", _bandit("dpo")),
    Run("bandit grpo", ("group_advantages", "clipped_policy_loss", "categorical_kl"), "expected_reward", "--steps",
        _bandit("grpo")),
    Run("bandit cispo", ("group_advantages", "cispo_policy_loss", "reduce_token_loss", "categorical_kl"),
        "expected_reward", "--steps", _bandit("cispo")),
    Run("online grpo", ("completion_mask", "group_advantages", "clipped_policy_loss", "reduce_token_loss", "kl_k3"),
        "success_probability", "--online-steps", _online("grpo")),
    Run("online cispo", ("completion_mask", "group_advantages", "cispo_policy_loss", "reduce_token_loss", "kl_k3"),
        "success_probability", "--online-steps", _online("cispo")),
)


def learns_threshold(start_value):
    """The stated bar: halfway from the run's start to the best possible value, 1."""
    return start_value + 0.5 * (1.0 - start_value)


def _counted(name, function, calls):
    """`function` counting its calls in calls[name]; a `check` keyword it does not take is dropped."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # a callable without a signature (a builtin): pass `check` as given
        parameters = {"check": None}
    takes_check = "check" in parameters or any(
        getattr(parameter, "kind", None) is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())

    @functools.wraps(function)
    def call(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        if not takes_check:
            kwargs.pop("check", None)
        return function(*args, **kwargs)

    return call


def _replacements(atoms):
    """[(container, key, lab object, learner object)] for every place a run finds one of the lab's atoms.
    atoms: {name: replacement}; a container is a module or one of its dicts."""
    by_id = {id(BY_NAME[name].solution): replacement for name, replacement in atoms.items()}
    found = []
    for module in PATCHED_MODULES:
        for key, value in vars(module).items():
            if id(value) in by_id:
                found.append((module, key, value, by_id[id(value)]))
            elif isinstance(value, dict) and not key.startswith("__"):
                for entry, item in value.items():
                    if id(item) in by_id:
                        found.append((value, entry, item, by_id[id(item)]))
                    elif dataclasses.is_dataclass(item) and id(getattr(item, "atom", None)) in by_id:
                        found.append((value, entry, item, dataclasses.replace(item, atom=by_id[id(item.atom)])))
    return found


def _put(container, key, value):
    if isinstance(container, dict):
        container[key] = value
    else:
        setattr(container, key, value)


def run_with(run, atoms, steps):
    """(rows, {atom name: calls}) of `run` with `atoms` ({name: function}) in place of the lab's ones."""
    calls = {}
    counted = {name: _counted(name, function, calls) for name, function in atoms.items()}
    replaced = _replacements(counted)
    try:
        for container, key, _, mine in replaced:
            _put(container, key, mine)
        rows = run(steps)
    finally:
        for container, key, lab, _ in reversed(replaced):
            _put(container, key, lab)
    return rows, calls


@functools.cache
def lab_run(name, steps):
    """The lab's own run (deterministic: computed once per process)."""
    run = next(run for run in RUNS if run.name == name)
    return run(steps)


def train(path, bandit_steps, online_steps):
    module = load_learner(path)  # checked by parse
    grades = grade_file(module, path)
    passing = {result.name: atom_of(module, result.name) for result in grades if result.status == "passed"}
    if not passing:
        print(f"none of the atoms in {path} passes check yet: nothing to train with "
              f"(python exercises.py check --file {path})")
        return 1
    print(f"your atoms that pass check ({len(passing)} of {len(EXERCISES)}): {', '.join(passing)}")
    learned, tried = True, 0
    for run in RUNS:
        steps = bandit_steps if run.steps_flag == "--steps" else online_steps
        mine = {name: passing[name] for name in run.atoms if name in passing}
        label = f"{run.name} ({steps} steps)"
        if not mine:
            print(f"{label}: not run (it calls {', '.join(run.atoms)}; none of yours passes check)")
            continue
        tried += 1
        lab_rows = lab_run(run.name, steps)
        start_value, lab_value = lab_rows[0][run.metric], lab_rows[-1][run.metric]
        bar = learns_threshold(start_value)
        metric = run.metric.replace("_", " ")
        changes = []
        try:
            with learner_code(changes):
                rows, calls = run_with(run, mine, steps)
        except (Exception, SystemExit) as error:  # the learner's atom failed inside the loop: reported, not a crash
            line = _learner_line(error, path)
            print(f"{label}: your atoms {raised_text(error)}{f' at {path}:{line}' if line else ''}; does NOT learn")
            learned = False
            continue
        if changes:
            print(f"{label}: your atoms changed {changes_text(changes)}, which the lab put back; does NOT learn")
            learned = False
            continue
        value = rows[-1][metric.replace(" ", "_")]
        used = [name for name in mine if calls.get(name)]
        learns = value == value and value >= bar  # (a NaN never learns)
        learned = learned and learns
        print(f"{label}: {metric} {value:.5f} with your {', '.join(used) or '(none called)'}, {lab_value:.5f} "
              f"with the lab's; {'learns' if learns else 'does NOT learn'} (bar {bar:.5f}: halfway from the "
              f"start {start_value:.5f} to the best, 1)")
    return 0 if learned and tried else 1


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


@torch_threads(1)  # tiny tensors, as the drivers
def main(argv=None):
    parser, args = build_parser(), parse(argv)  # the parser: start's last check, as it creates the file
    if args.command == "start":
        return start(parser, args.file, formulas=not args.bare)
    try:
        if args.command == "check":
            return check(args.file, args.atom)
        return train(args.file, args.steps, args.online_steps)
    except LearnerFileError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run_cli(main))
