"""Settings declared once: a driver's options as the fields of one frozen dataclass (CleanRL's `Args`),
from which its argparse flags, `--help` with every default, validation, per-algorithm defaults and the
JSON "settings" block are all derived. It never imports torch, so the plotter could use it too.

    @dataclass(frozen=True)
    class Config:
        steps: int = setting(60, "iterations (sample, score, update)", low=1, high=100_000)
        epsilon_high: float = setting(None, "upper clip half-width", low=0.0, high=100.0, optional=True)

    parser = OneLineErrorParser(prog="driver.py")
    add_arguments(parser, declared(Config))                 # one flag per field, default shown in --help
    options = given_options(parser.parse_args(argv), declared(Config))   # only what the user typed

A value is checked once, by `check_value`, which raises `SettingError` (a ValueError whose message starts
with the setting's name, and which carries the flag): the Python API shows `epsilon_high: ...`, the
command line `argument --epsilon-high: ...`, from the same object and without parsing any message.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re

_INTEGER_SYNTAX = re.compile(r"-?[0-9]+", re.ASCII)
_FLOAT_SYNTAX = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
SEED_LIMIT = 2**63  # seeds are integers in [0, 2**63), what torch.Generator.manual_seed takes


class SettingError(ValueError):
    """A setting's value is not allowed. str(error) starts with the setting's name (the API's spelling);
    `flag` is the command line's spelling and `reason` the rest, so a CLI can say `argument --flag: reason`."""

    def __init__(self, name, flag, reason):
        super().__init__(f"{name}: {reason}")
        self.name, self.flag, self.reason = name, flag, reason


@dataclasses.dataclass(frozen=True)
class Setting:
    """One declared option. kind: "int", "float", "bool", "choice" or "text" (a folder name); low/high bound numbers (an int
    `high` may also name another setting, e.g. "max_new_tokens"); optional: None is allowed and means
    "off"; applies: the algorithms it applies to (None: every one); requires: (other setting, allowed
    values), the setting only changes something when the other one holds one of them."""

    kind: str
    default: object
    help: str
    low: float | None = None
    high: float | str | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    optional: bool = False
    applies: tuple | None = None
    policies: tuple | None = None  # the policies it applies to (None: every one)
    requires: tuple | None = None
    flag: str | None = None
    action: str | None = None  # "store_true" / "store_false" for a bool switch
    default_text: str | None = None  # --help's default where it depends on other settings
    # left out of the JSON settings block while it changes nothing (at its default, or its `requires` unmet):
    # the switches added after the committed runs, whose files stay byte-identical
    quiet: bool = False
    name: str = ""

    @property
    def option(self):
        return self.flag or "--" + self.name.replace("_", "-")

    def interval(self, high=None):
        high = self.high if high is None else high
        shown = "2**63 - 1" if high == SEED_LIMIT - 1 else high
        return f"{'(' if self.low_open else '['}{self.low}, {shown}{')' if self.high_open else ']'}"


def setting(default, help, *, kind=None, **options):
    """A dataclass field declaring a Setting (see `Setting`); kind is inferred from the default and the
    options when not given: choices -> "choice", a bool default -> "bool", a float bound -> "float"."""
    if kind is None:
        if options.get("choices"):
            kind = "choice"
        elif isinstance(default, bool):
            kind = "bool"
        elif isinstance(default, str):
            kind = "text"
        elif isinstance(default, float) or any(isinstance(options.get(key), float) for key in ("low", "high")):
            kind = "float"
        else:
            kind = "int"
    return dataclasses.field(default=default, metadata={"setting": Setting(kind, default, help, **options)})


def declared(config_class):
    """The Settings of a config dataclass, in field order, each with its name filled in."""
    return [dataclasses.replace(field.metadata["setting"], name=field.name)
            for field in dataclasses.fields(config_class) if "setting" in field.metadata]


def check_value(item, value, high=None):
    """Return `value` checked against the Setting `item` (ints of a float setting become floats);
    raise SettingError naming it. high: the resolved bound when `item.high` names another setting."""
    def fail(reason):
        raise SettingError(item.name, item.option, reason)

    if value is None:
        if item.optional:
            return None
        fail("expected a value, got None")
    if item.kind == "choice":
        if not isinstance(value, str) or value not in item.choices:
            fail(f"expected one of {', '.join(map(repr, item.choices))}, got {value!r}")
        return value
    if item.kind == "bool":
        if not isinstance(value, bool):
            fail(f"expected True or False, got {value!r}")
        return value
    if item.kind == "text":
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            fail(f"expected a non-empty name without NUL, got {value!r}")
        return value
    bound = item.high if high is None else high
    if item.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            fail(f"expected an integer, got {type(value).__name__} {value!r}")
        if value < item.low or value > bound:
            fail(f"expected an integer in [{item.low}, {bound}], got {value}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"expected a real number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond the float range
        fail(f"expected a finite number, got an integer with {len(str(abs(value)))} digits")
    if not math.isfinite(number):
        fail(f"expected a finite number, got {number}")
    if number < item.low or number > bound or (item.low_open and number == item.low) or (
            item.high_open and number == bound):
        fail(f"expected a number in {item.interval(bound)}, got {number!r}")
    return number


def _from_text(item):
    """argparse type: the flag's text as a value of the setting's kind (syntax only; ranges are checked
    once, by check_value, for flags and keyword arguments alike)."""
    def parse(text):
        shown = text if len(text) <= 40 else text[:20] + "..."
        if item.kind == "int":
            # int() alone would take ' 3', '+3', '1_0' and non-ASCII digits (and more than 4300 digits
            # would exceed its own limit: no valid value is that long)
            if not _INTEGER_SYNTAX.fullmatch(text) or len(text) > 40:
                raise argparse.ArgumentTypeError(f"expected an integer in [{item.low}, {item.high}], got {shown!r}")
            return int(text, 10)
        if not _FLOAT_SYNTAX.fullmatch(text):  # plain ASCII decimal notation; no 'nan', 'inf' or '1_0'
            raise argparse.ArgumentTypeError(f"expected a number in {item.interval()}, got {shown!r}")
        return float(text)

    parse.__name__ = item.kind  # argparse names the type in its own message
    return parse


def help_text(item):
    """The flag's help: its text, then the default (or what it depends on) and, for numbers, the range."""
    if item.default_text is not None:
        default = item.default_text
    elif item.default is None:
        default = "off"
    elif item.kind == "bool" and item.action == "store_false":  # --no-X: "(default: on)" would read as "--no-X on"
        default = "not given"
    elif item.kind == "bool":
        default = "on" if item.default else "off"
    else:
        default = str(item.default)
    text = item.help
    if item.kind in ("int", "float"):
        kind = "integer" if item.kind == "int" else "number"
        text += f"; {kind} in {item.interval()}"
    return f"{text} (default: {default})"


def add_arguments(parser, items):
    """One argparse flag per Setting. Every flag defaults to None, so `given_options` can tell what
    the user typed; the real defaults are the dataclass's and are shown in the help."""
    for item in items:
        if item.kind == "bool":
            parser.add_argument(item.option, dest=item.name, action=item.action or "store_true", default=None,
                                help=help_text(item))
        elif item.kind == "choice":
            parser.add_argument(item.option, dest=item.name, choices=item.choices, default=None,
                                help=help_text(item))
        elif item.kind == "text":
            parser.add_argument(item.option, dest=item.name, default=None, metavar=item.name.upper(),
                                help=help_text(item))
        else:
            parser.add_argument(item.option, dest=item.name, type=_from_text(item), default=None,
                                metavar=item.name.upper(), help=help_text(item))


def given_options(args, items):
    """{name: value} of the settings given on the command line."""
    return {item.name: getattr(args, item.name) for item in items if getattr(args, item.name) is not None}


def add_shared_argument(parser, item, default):
    """A flag shared by several drivers (seed, steps) with this driver's default, checked by argparse's
    type function (for drivers whose settings are not a dataclass)."""
    item = dataclasses.replace(item, default=default)

    def parse(text):
        try:
            return check_value(item, _from_text(item)(text))
        except SettingError as error:
            raise argparse.ArgumentTypeError(error.reason) from None

    parse.__name__ = item.kind
    # "%(default)s": argparse fills it in, and an ArgumentDefaultsHelpFormatter then adds no second default
    shown = dataclasses.replace(item, default_text="%(default)s")
    parser.add_argument(item.option, dest=item.name, type=parse, default=default, metavar=item.name.upper(),
                        help=help_text(shown))


def _shared(name, **fields):
    return dataclasses.replace(Setting(**fields), name=name)


# The settings every training driver has, declared once (each driver gives its own default).
SEED = _shared("seed", kind="int", default=7, help="seed of the run's torch.Generator, the one seeding point",
               low=0, high=SEED_LIMIT - 1)
STEPS = _shared("steps", kind="int", default=120, help="outer iterations (sample, score, update)",
                low=1, high=100_000)
