"""Claims as checks over the per-seed results, and their verdicts: a property counted over seeds
("count"), a paired difference between configurations that share seeds ("greater"), an equivalence
("within"), or an identity computed without seeds ("exact"); and the words a verdict is shown in.

Each claim is of one of two kinds. A "check" is an identity or a property of the code: its right answer
is known, and a failure is a bug. A "claim" is an RL effect that could come out either way: the atlas's
findings, which its headline counts. A run that never reached a target counts at its budget (see
`difference`): no seed is dropped for it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from atlas.stats import mean_interval, wilson_interval

HOLDS, FAILS, NOISE = "holds", "does not hold", "within noise"
CLAIM_TESTS = ("count", "greater", "within", "exact")
CHECK, CLAIM = "check", "claim"
KINDS = (CHECK, CLAIM)
# a target metric (the first iteration, step, sampled token or action at which a run reached 0.9) is None
# for a run that never reached it; the metric that holds what the run spent stands in for it: its budget
# ("iterations" is the run's last iteration, which the engine adds from its curve)
TARGET_BUDGETS = {"iterations_to_0.9": "iterations", "steps_to_0.9": "iterations",
                  "tokens_to_0.9": "total_tokens_sampled", "actions_to_0.9": "sampled_actions"}


@dataclass(frozen=True)
class Claim:
    """A claim as a check. `value(runs)` gets one seed's results, {configuration: metrics}, and returns:

    test "count":   a bool (the property holds in this seed); the claim holds when at least `at_least` of
                    the seeds (a share, rounded up, at least 1) show it, else does not hold (within
                    noise when no seed has a value);
    test "greater": a float claimed > 0 (a paired difference), or None when undefined in this seed (a
                    metric not measured; a target never reached counts at its budget); holds when the
                    95% t-interval of the mean over the defined seeds is above 0, does not hold when it
                    is below 0, within noise otherwise (how many seeds are above 0 is shown, not asked:
                    see GREATER_RULE);
    test "within":  a float claimed inside +-margin; holds when the 95% interval lies inside it, does not
                    hold when the interval lies wholly outside it, within noise otherwise;
    test "exact":   value(None) is a bool computed without seeds (an identity of a table).

    note: the cause, the ablation that tests it, or why a claim that does not hold is kept. A Claim is of
    the kind CLAIM (an RL effect that could come out either way); a Check is the same test of the kind
    CHECK (its answer is known)."""

    text: str
    value: object
    test: str = "count"
    at_least: float = 1.0  # test "count" only
    margin: float | None = None
    note: str = ""
    kind = CLAIM  # a class attribute, not a field: the class says the kind


@dataclass(frozen=True)
class Check(Claim):
    """A check: an identity or a property of the code, whose right answer is known (a failure is a bug,
    not a finding). Tested and shown like a Claim, counted apart from the claims."""

    kind = CHECK


class AtBudget(float):
    """A paired difference in which a run that never reached its target counts at its budget: a float,
    marked so that the verdict says how many seeds rest on a budget. The budget is a lower bound of the
    value the run would have had; where the two runs' budgets differ (tokens or actions sampled, not
    iterations), it is raised to the other run's value when below it, so that the difference never takes
    a sign the runs do not show: a seed where one run never reached the target counts toward the other
    (or as a tie, when the other reached it only after the first one's budget), and where both never
    did, as a tie."""


# a claim about how often an RL run does something ("reaches 0.9", "no prompt ends stuck") is a rate: it holds
# when at least 9 runs in 10 do. "Every seed" is what an identity asks; asked of a run, one rare seed (the default
# GRPO run gets a prompt stuck in about 1 of 60 seeds) fails it on one seed set and not on the next
MOST_RUNS = 0.9


# The same holds for a threshold on one measured value ("ends at most 0.02 above the start", "correlates
# positively"): it is a "greater" claim on the distance to the threshold, judged by its interval, never a count
# of the seeds on the right side. A count is for events: a run reaches a target or gets a prompt stuck, several
# signs hold together, a random pair orders two estimators.
#
# A "greater" verdict asks only for its interval, never a share of the seeds above 0 (4 of 5) as well: a share
# counted without its uncertainty decides a verdict by chance when the effect's true share of positive seeds sits
# at the threshold (at a true 0.8, "4 of 5" holds on 74% of seed sets, "16 of 20" on 63%, more seeds tend to a
# half, so they never settle it); on the seeds from 0, 100 and 700, most of the claims whose verdict differed
# between the sets under such a rule had 0.71-0.85 of their seeds above 0, pooled, against 0.80-0.86 asked
# (picked because they differed, so near the threshold partly by selection). The 95% interval holds on about
# 2.5% of seed sets with no effect, and its power grows to 1 with seeds for any real effect; the seeds above 0
# are shown beside it.
GREATER_RULE = "interval above 0"


def required_seeds(share, seeds):
    """How many of `seeds` seeds a share asks for: rounded up, at least 1 (4 of 5 for 0.8)."""
    return max(1, math.ceil(share * seeds - 1e-9))


def check_claim(claim, by_seed):
    """The verdict of `claim` over {seed: {configuration: metrics}}: a JSON-ready dict with the verdict,
    the count it rests on ("4 of 5 seeds"), the mean and its 95% interval (for a count, the share and
    Wilson's interval), and every seed's value."""
    if claim.test not in CLAIM_TESTS:
        raise ValueError(f"test: expected one of {', '.join(CLAIM_TESTS)}, got {claim.test!r}")
    if claim.test != "count" and claim.at_least != 1.0:
        raise ValueError(f"at_least: a share of seeds is asked by test 'count' only, got {claim.at_least} for "
                         f"test {claim.test!r}")
    result = {"claim": claim.text, "kind": claim.kind, "test": claim.test}
    if claim.test == "exact":
        holds = bool(claim.value(None))
        return {**result, "verdict": HOLDS if holds else FAILS, "needs": "exact", "count": "exact, no seeds",
                "agree": None,
                "seeds": 0, "required": None, "undefined": 0, "at_budget": 0, "mean": None, "interval": None,
                "margin": None, "per_seed": [], "note": claim.note}
    values = {seed: claim.value(runs) for seed, runs in by_seed.items()}
    defined = {seed: value for seed, value in values.items() if value is not None}
    seeds = len(defined)
    required = required_seeds(claim.at_least, seeds) if claim.test == "count" else None
    interval = None
    if claim.test == "count":
        agree = sum(bool(value) for value in defined.values())
        verdict = NOISE if not seeds else HOLDS if agree >= required else FAILS  # no seed: no verdict either way
        mean = agree / seeds if seeds else None
        low, high = wilson_interval(agree, seeds)
        interval = None if low is None else [low, high]
        per_seed = [{"seed": seed, "value": bool(value)} for seed, value in defined.items()]
    else:
        numbers = list(defined.values())
        mean, low, high = mean_interval(numbers) if numbers else (None, None, None)
        interval = None if low is None else [low, high]
        per_seed = [{"seed": seed, "value": value, "at_budget": isinstance(value, AtBudget)}
                    for seed, value in defined.items()]
        if claim.test == "greater":
            agree = sum(value > 0 for value in numbers)
            if low is not None and low > 0:
                verdict = HOLDS
            elif low is not None and high < 0:
                verdict = FAILS
            else:
                verdict = NOISE
        else:
            margin = claim.margin
            agree = sum(abs(value) < margin for value in numbers)
            if low is not None and -margin < low and high < margin:
                verdict = HOLDS
            elif low is not None and (low >= margin or high <= -margin):
                verdict = FAILS
            else:
                verdict = NOISE
    count = f"{agree} of {seeds} seeds"
    at_budget = sum(isinstance(value, AtBudget) for value in defined.values())  # a bool never is one
    if seeds == 0:  # every seed left out (no value, as a pass@64 that a --quick run does not sample)
        needs = "a seed with a value, and none has one"
    elif claim.test == "count":
        needs = "every seed" if required == seeds else f"{required} of {seeds} seeds"
    elif claim.test == "greater":
        needs = GREATER_RULE
    else:
        needs = f"interval inside +-{claim.margin}"
    return {**result, "verdict": verdict, "needs": needs, "count": count, "agree": agree, "seeds": seeds,
            "required": required, "undefined": len(values) - seeds, "at_budget": at_budget, "mean": mean,
            "interval": interval, "margin": claim.margin, "per_seed": per_seed, "note": claim.note}


def difference(metric, first, second):
    """A claim value: first's metric minus second's in one seed. For a target metric, a run that never
    reached the target counts at its budget (TARGET_BUDGETS), and the difference is an AtBudget; for any
    other metric, None when either run has no value (that seed is left out, and the verdict says so)."""
    def value(runs):
        a, b = runs[first][metric], runs[second][metric]
        if metric in TARGET_BUDGETS and (a is None or b is None):
            if a is None and b is None:
                return AtBudget(0.0)  # neither reached it: their budgets differ, not what they measure
            budget = TARGET_BUDGETS[metric]
            a = max(runs[first][budget], b) if a is None else a  # at least its budget, and later than the other
            b = max(runs[second][budget], a) if b is None else b
            return AtBudget(a - b)
        return None if a is None or b is None else a - b
    return value


def number_text(value):
    """A table cell: integers as they are; floats with 4 decimals, 1 from 100 up, 2 significant digits in
    scientific notation below 0.001 (exact identities show as e-15 there, not as 0.0000); None as "-"."""
    if value is None:
        return "-"
    if not isinstance(value, float):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.4f}" if abs(value) >= 1e-3 else f"{value:.1e}"


def _signed(value):
    text = number_text(value)
    return text if text.startswith("-") or text == "0" else "+" + text


def interval_text(verdict):
    """The numbers a verdict rests on, in words: a count's share and its Wilson interval, or a mean and
    its t-interval ("+0.0123 [+0.0040, +0.0206]")."""
    if verdict["test"] == "exact":
        return "exact"
    if verdict["mean"] is None:
        return "no seed has a value"
    if verdict["test"] == "count":
        text = f"share {verdict['mean']:.2f}"
        return text + (f" [{verdict['interval'][0]:.2f}, {verdict['interval'][1]:.2f}]" if verdict["interval"] else "")
    text = f"mean {_signed(verdict['mean'])}"
    if verdict["interval"] is None:
        return text + " (one seed: no interval)"
    return text + f" [{_signed(verdict['interval'][0])}, {_signed(verdict['interval'][1])}]"


def count_text(verdict):
    """"4 of 5 seeds" (above 0, or inside the margin; with the seeds that rest on a budget, a target never
    reached, and the seeds left out, no value), or "exact"."""
    if verdict["test"] == "exact":
        return "exact"
    where = {"greater": " above 0", "within": f" inside +-{verdict['margin']}"}.get(verdict["test"], "")
    text = verdict["count"] + where
    if verdict.get("at_budget"):
        text += f" ({verdict['at_budget']} at the budget: a target never reached)"
    return text + (f" ({verdict['undefined']} left out: no value)" if verdict["undefined"] else "")
