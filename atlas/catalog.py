"""The atlas's catalogue: every experiment as one `Experiment` entry, its configurations (each names a
runner of atlas/runners.py and its options), the metrics its tables show, its claims and its figure.
`experiments()` returns them by name, in the atlas's order.

A new experiment is one builder here, listed in `experiments()` (and its name in experiments.py's
NAMES), plus a runner when no existing one measures what it needs. Its `quick` options shrink every
run for tests and --quick (default: a few iterations of a training runner), and its `cost` (seconds per
run) orders the work and the ETA."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field

from atlas.claims import MOST_RUNS, Check, Claim, difference
from atlas.exact import k2_worked_example, kl_optimum_gradient, loophole_table, std_scaling_table
from online_algorithms import FOUR_ALGORITHMS
from online_settings import OnlineConfig
from rl_lab import REDUCTIONS
from tasks import countdown_task

DEFAULT_SEEDS = 5
LEARNING_RATE = OnlineConfig().learning_rate  # the table policy's default Adam rate (0.2)
TRANSFORMER_QUICK = {"steps": 2, "sft_steps": 20, "sft_folder": os.path.join("results-sft", "quick"), "prompts": 4,
                     "group_size": 4, "eval_prompts": 2, "eval_samples": 0}


@dataclass
class Experiment:
    """A named experiment: its claim and source, the runs it needs per seed, and its claims as checks.

    configurations: [(label dict, runner name, options dict)], every one run on the same seeds (so two
    configurations compare seed by seed); claims: [Claim], whose value functions read one seed's
    {configuration name: metrics} (`configuration_name(label)`); seeds: how many the default run uses,
    and seeds_reason, one line: why that many, for the size of the effects its claims test (an effect is
    the mean paired difference over the std of its per-seed values: 5 seeds separate one above
    t_4 / sqrt(5) = 1.24 from 0; "needs about N" is the count that detects the effect measured on seeds
    0-4 with 80% power, (1.96 + 0.84)^2 / effect^2 + 1; a verdict that must also hold on another seed set
    asks for 95% power, (1.96 + 1.645)^2 / effect^2 + 1, since two sets at 80% agree on a real effect only
    about 0.8^2 + 0.2^2 = 68% of the time);
    quick: the options every run takes at --quick (None: QUICK_STEPS iterations for a training runner);
    cost: seconds per run on one core, roughly (the work's order and the ETA); figure: the panels that
    plot_results.py draws (see plot_results.experiment_figure)."""

    name: str
    summary: str
    source: str
    claim: str
    configurations: list
    metrics: list
    curves: tuple = ()
    tables: dict = field(default_factory=dict)
    figure: dict = field(default_factory=dict)
    claims: list = field(default_factory=list)
    seeds: int = DEFAULT_SEEDS
    quick: dict | None = None
    cost: float = 0.5
    seeds_reason: str = field(kw_only=True)


def configuration_name(label):
    """The name of a configuration in every file and claim: "key=value key=value" of its label."""
    return " ".join(f"{key}={value}" for key, value in label.items())


def _online(label, curve=(), **options):
    return (label, "run_online", {"curve": tuple(curve), **options})


ONLINE_CURVE = ("success_probability", "total_tokens_sampled")
C = configuration_name


def _k2_worked_example_holds():
    mean_k2, kl = k2_worked_example()
    return (abs(mean_k2 - 0.375 * math.log(2) ** 2) < 1e-12 and abs(kl - 0.25 * math.log(2)) < 1e-12
            and mean_k2 / kl - 1 > 1e-3)  # (3/8) ln^2 2 / ((1/4) ln 2) - 1 = 1.5 ln 2 - 1


def _kl_estimators():
    near, far = C({"distance": "near"}), C({"distance": "far"})
    both = (near, far)
    return Experiment(
        name="kl-estimators",
        summary="k1/k2/k3: bias and spread of each value, and which KL each expected gradient follows",
        source="Schulman, 'Approximating KL Divergence' (2020); Tang and Munos, arXiv 2506.09477; Shah et al., arXiv "
               "2512.21852; Zhang et al. (RPG), arXiv 2505.17508",
        claim="k1 and k3 are unbiased for KL(pi‖ref), k2 is not; as loss terms on one categorical draw from the "
              "current policy, E[grad k1] = 0, E[grad k2] = grad KL(pi‖ref), E[grad k3] = grad KL(ref‖pi). k3 spreads "
              "less than k1 near the reference only. Computed exactly by enumeration on 6-way categoricals, near "
              "(logits scaled 0.3) and far (1.5). These identities hold for one draw only: on a sequence, a per-token "
              "loss gives a partial gradient of the sequence KL (Tang and Munos' second pitfall).",
        configurations=[({"distance": distance}, "run_kl_estimators", {"distance": distance})
                        for distance in ("near", "far")],
        metrics=[f"{name}_{stat}" for name in ("k1", "k2", "k3") for stat in (
                    "relative_bias", "relative_std", "grad_error_kl_pi_ref", "grad_error_kl_ref_pi")],
        claims=[
            Check("k1 and k3 are unbiased for KL(pi‖ref): relative bias below 1e-12, near and far",
                  lambda runs: all(abs(runs[c][f"{k}_relative_bias"]) < 1e-12 for c in both for k in ("k1", "k3"))),
            Check("k2 is biased: on pi = (1/2, 1/4, 1/4), ref = (1/4, 1/4, 1/2) the atom gives E[k2] = (3/8) ln^2 2 "
                  "= 0.1802 against KL(pi‖ref) = (1/4) ln 2 = 0.1733, a relative bias of 1.5 ln 2 - 1 = +0.040, as "
                  "computed by hand (within 1e-12)", lambda _: _k2_worked_example_holds(), "exact",
                  note="On the random pairs its bias takes either sign and can come near 0 (the first panel): a bias "
                       "that depends on the pair, which is why the check is the pair computed by hand."),
            Check("As loss terms: E[grad k1] = 0, E[grad k2] = grad KL(pi‖ref), E[grad k3] = grad KL(ref‖pi) "
                  "(relative errors below 1e-12), and E[grad k3] is not grad KL(pi‖ref) (above 1e-3), near and far",
                  lambda runs: all(runs[c]["k1_grad_norm_ratio"] < 1e-12 and runs[c]["k2_grad_error_kl_pi_ref"] < 1e-12
                                   and runs[c]["k3_grad_error_kl_ref_pi"] < 1e-12
                                   and runs[c]["k3_grad_error_kl_pi_ref"] > 1e-3 for c in both)),
            Claim("Near the reference, k3 spreads less than k1 (a smaller per-sample std)",
                  lambda runs: runs[near]["k3_relative_std"] < runs[near]["k1_relative_std"], at_least=0.8),
            Claim("Far from the reference, k3 still spreads less than k1",
                  lambda runs: runs[far]["k3_relative_std"] < runs[far]["k1_relative_std"], at_least=0.8,
                  note="The field often says that k3 has a lower variance than k1. k3 = exp(ref - logp) - (ref - logp) "
                       "- 1 grows exponentially on tokens the reference prefers by far, so far from the reference its "
                       "spread can exceed k1's: pick the estimator by the gradient you want, not by its spread."),
        ],
        figure={"panels": [
            {"kind": "values", "metrics": ["k1_relative_bias", "k2_relative_bias", "k3_relative_bias"],
             "title": "bias of the value, relative to KL(pi‖ref)", "ylabel": "(E[k] - KL) / KL"},
            {"kind": "values", "metrics": ["k1_relative_std", "k2_relative_std", "k3_relative_std"],
             "title": "per-sample std, relative to KL(pi‖ref)", "ylabel": "std(k) / KL"},
            {"kind": "values", "metrics": [f"{k}_grad_error_kl_pi_ref" for k in ("k1", "k2", "k3")],
             "title": "E[grad k] against grad KL(pi‖ref)", "ylabel": "relative error"},
            {"kind": "values", "metrics": [f"{k}_grad_error_kl_ref_pi" for k in ("k1", "k2", "k3")],
             "title": "E[grad k] against grad KL(ref‖pi)", "ylabel": "relative error"}]},
        seeds=40,
        seeds_reason="exact, nothing sampled: each seed draws one pair of categoricals. The identities hold on any "
                     "pair; the spread claims are shares of pairs, which 5 pairs left to chance (far from the "
                     "reference k3 spread less than k1 on 0.44 of 400 pilot pairs, seeds 5000-5399, against the 0.8 "
                     "asked: 4 of 5 happens on 12% of seed sets); at 40 pairs 32 are asked, and a share of 0.44 "
                     "reaches it on none (near the reference: 400 of 400)",
        cost=0.01,
    )


def _reduction_length_bias():
    sequence, token, constant = (C({"reduction": name}) for name in ("sequence", "token", "constant"))
    note = ("A small gap, a fraction of a token: the table drops wrong answers within a few dozen iterations, "
            "before lengths can grow far, and the lengths left differ a lot between seeds, so 5 seeds left it "
            "within noise; 30 are run (the default seeds' reason says why). The transformer experiment "
            "length-growth compares the reductions where answers are longer.")
    return Experiment(
        name="reduction-length-bias",
        summary="sequence mean vs token mean vs constant: lengths of right and wrong answers",
        source="Dr. GRPO, arXiv 2503.20783, sec. 3.1",
        claim="Dividing each response's loss by its own length lets long wrong answers lose less per token, so wrong "
              "answers grow longer under the per-sequence mean; the token mean and the constant do not favour length. "
              "Measured with --max-new-tokens 10 by the exact expected length of the policy's wrong answers (no "
              "sampling noise).",
        configurations=[_online({"reduction": reduction}, ("success_probability",), exact_curve=("wrong_length",),
                                reduction=reduction, max_new_tokens=10) for reduction in REDUCTIONS],
        metrics=["exact_wrong_length", "mean_wrong_length", "mean_correct_length", "final_success_probability",
                 "iterations_to_0.9"],
        curves=("exact_wrong_length", "success_probability"),
        claims=[
            Claim("Under the sequence mean, wrong answers are longer than under the token mean (their exact "
                  "expected length, last 10 iterations)",
                  difference("exact_wrong_length", sequence, token), "greater", note=note),
            Claim("... and longer than under the constant (Dr. GRPO's fix)",
                  difference("exact_wrong_length", sequence, constant), "greater"),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["exact_wrong_length"], "title": "expected length of a wrong answer, exact",
             "ylabel": "tokens (EOS included)"},
            {"kind": "curves", "columns": ["success_probability"], "title": "exact success probability",
             "ylabel": "p(correct)"},
            {"kind": "claim", "claim": 0, "title": "sequence minus token mean: wrong-answer length per seed",
             "ylabel": "tokens"}]},
        seeds=30,
        seeds_reason="seeds 0-19 and 100-119 pooled measured 0.78 and 0.81, which need about 23 seeds for the 95% "
                     "power that keeps a verdict on another seed set (20, chosen at 80% from seeds 0-4, gave 16 of 20 "
                     "above 0 on each committed set, and a set from 300 read one of them within noise): 30",
        cost=0.6,
    )


def _std_scaling():
    def name(scale, beta):
        return C({"scale_rewards": scale, "beta": beta})

    columns, rows = std_scaling_table()
    weight = {scale: rows[1][f"{scale}_total_weight"] / rows[4][f"{scale}_total_weight"] for scale in ("group", "none")}
    gap_on = difference("hard_success_final", name("group", 0.02), name("none", 0.02))
    gap_off = difference("hard_success_final", name("group", 0.0), name("none", 0.0))
    matched = 0.0075  # the beta at which no std ends where the group std does at 0.02 (a run outside the atlas)
    return Experiment(
        name="std-scaling",
        summary="group vs batch vs no std, with and without the KL penalty, and no std at a matched beta: easy and "
                "hard prompts",
        source="Dr. GRPO, arXiv 2503.20783, sec. 3.1 (question-level difficulty bias)",
        claim="Dividing by the group's std raises the total weight of a prompt whose group is nearly all right or all "
              "wrong relative to one near 50%, compared with no std; the prompt near 50% still weighs the most (exact "
              "table). In training, no std ends lower at the same KL penalty, on the hard prompts (4 and 5, "
              "three-digit answers) and on the easy ones too: an effect of the effective beta, not of difficulty. "
              "Unscaled advantages are smaller, so the same beta weighs more against them and holds the policy "
              f"nearer the uniform reference. The ablations: with the KL penalty off the gap goes; at beta {matched:g} "
              "no std is asked to end where the group std does at beta 0.02 (the verdicts below say on which "
              "seed sets it does).",
        configurations=[({"scale_rewards": scale, "beta": beta}, "run_std_scaling",
                         {"scale_rewards": scale, "beta": beta})
                        for beta in (0.02, 0.0) for scale in ("group", "batch", "none")]
                       + [({"scale_rewards": "none", "beta": matched}, "run_std_scaling",
                           {"scale_rewards": "none", "beta": matched})],
        metrics=["hard_success_final", "easy_success_final", "hard_success_step_10", "easy_success_step_10",
                 "final_success_probability", "iterations_to_0.9"],
        curves=("hard_success", "easy_success"),
        tables={"gradient_weight_by_successes": (columns, rows)},
        claims=[
            Check("With G = 8 the std flattens a prompt's total weight across difficulty: 1 success of 8 weighs "
                  f"{weight['group']:.3f} of 4 of 8 with the std, {weight['none']:.4f} without (exact)",
                  lambda _: weight["group"] > weight["none"], "exact"),
            Claim("With the KL penalty (beta 0.02), the group std ends higher on the hard prompts than no std",
                  gap_on, "greater"),
            Claim("The easy prompts (0 and 1) show the gap too: with beta 0.02, the group std ends higher on them "
                  "than no std", difference("easy_success_final", name("group", 0.02), name("none", 0.02)),
                  "greater",
                  note="The gap is not specific to hard prompts: the std's weighting by difficulty is not what makes "
                       "it."),
            Claim("The std's larger weight on rare successes speeds up the hard prompts early: hard-prompt success at "
                  "iteration 10, group minus none, above 0",
                  difference("hard_success_step_10", name("group", 0.02), name("none", 0.02)), "greater",
                  note="The amplification is exact in the weights; this asks whether the hard prompts learn faster "
                       "with it early."),
            Claim("With the KL penalty off, group and no std end within 0.01 of each other on the hard prompts",
                  gap_off, "within", margin=0.01,
                  note="A claim, not a check: with the KL off both runs head for 1 and almost always end there, but a "
                       "run can leave a prompt stuck on a partial answer (seed 1116 of an unseen set ended 0.275 "
                       "apart), so it can fail for an RL reason."),
            Claim("So the KL penalty makes the gap: (group - none) with beta 0.02 exceeds (group - none) with beta 0",
                  lambda runs: gap_on(runs) - gap_off(runs), "greater"),
            Claim(f"The effective beta: no std at beta {matched:g} ends higher on the hard prompts than no std at "
                  "beta 0.02", difference("hard_success_final", name("none", matched), name("none", 0.02)),
                  "greater"),
            Claim("... and within 0.01 of the group std at beta 0.02: a smaller beta does what the std does",
                  difference("hard_success_final", name("group", 0.02), name("none", matched)), "within",
                  margin=0.01,
                  note="If the std's weighting by difficulty made the gap, no beta would close it on the hard prompts "
                       "while leaving the weights unscaled."),
        ],
        figure={"color_by": ["scale_rewards"], "panels": [
            {"kind": "curves", "columns": ["hard_success"], "where": {"beta": 0.02},
             "title": "hard prompts, KL penalty beta 0.02", "ylabel": "exact success (prompts 4, 5)"},
            {"kind": "curves", "columns": ["hard_success"], "where": {"beta": 0.0},
             "title": "hard prompts, KL penalty off", "ylabel": "exact success (prompts 4, 5)"},
            {"kind": "values", "metrics": ["hard_success_final"], "title": "hard prompts at the end",
             "ylabel": "exact success (prompts 4, 5)"},
            {"kind": "values", "metrics": ["easy_success_final"], "title": "easy prompts at the end",
             "ylabel": "exact success (prompts 0, 1)"}]},
        seeds=55,
        seeds_reason="the KL-made gap measures 2.5 on seeds 0-4, over the 1.24 that 5 seeds separate; the equivalence "
                     "at the matched beta needs an interval inside +-0.01: at 10 seeds (std 0.010 over seeds 0-9 and "
                     "100-109 pooled, mean +0.002) its half-width is 0.007 and one committed set read it within noise, "
                     "at 20 it is 0.005; the early speed-up, none on seeds 0-4 (-0.25), measures -0.51 pooled over 20 "
                     "seeds from each of 0, 100 and 1300 (does not hold on two, within noise on the third), which "
                     "needs (1.96 + 1.645)^2 / 0.51^2 + 1 = 51 seeds for 95% power, so 55. The equivalence with the KL "
                     "off, which one seed whose prompt stays stuck can break, no seed count settles",
        cost=0.6,
    )


def _zero_variance():
    static = [C({"group_size": size, "dynamic_sampling": False}) for size in (2, 4, 8, 16)]
    dynamic = C({"group_size": 8, "dynamic_sampling": True})
    return Experiment(
        name="zero-variance",
        summary="share of groups whose rewards all tie, measured vs predicted; dynamic sampling",
        source="DAPO, arXiv 2503.14476, sec. 3.2 (dynamic sampling, eq. 11)",
        claim="A group teaches nothing when its rewards tie; the share is predicted per prompt by sum_v q_v^G from "
              "the exact reward distribution of the policy that sampled it, and grows as G falls; dynamic sampling "
              "removes it at the price of extra samples. At a fixed 64 responses per iteration.",
        configurations=[({"group_size": size, "dynamic_sampling": False}, "run_zero_variance",
                         {"group_size": size, "prompts": 64 // size}) for size in (2, 4, 8, 16)]
                       + [({"group_size": 8, "dynamic_sampling": True}, "run_zero_variance",
                           {"group_size": 8, "prompts": 8, "dynamic_sampling": True})],
        metrics=["zero_group_fraction", "predicted_zero_group_fraction", "measured_minus_predicted",
                 "measured_minus_predicted_z", "final_success_probability", "tokens_to_0.9", "responses_sampled"],
        curves=("zero_group_fraction", "predicted_zero_group_fraction", "success_probability"),
        claims=[
            Check("The exact prediction matches the measured share up to sampling noise: the two differ by less "
                  "than 3 standard errors (exact, from the predicted probabilities) at every G",
                  lambda runs: all(abs(runs[c]["measured_minus_predicted_z"]) < 3 for c in static), at_least=0.8,
                  note="A statistical check: were the prediction exact, a seed passes with probability about 0.99 "
                       "(four G, each within 3 standard errors with probability 0.997 for a normal z), so a rule "
                       "of every seed would fail about one seed set in twelve by chance; 80% of the seeds are "
                       "required (13 of 16). The rule was every seed until seeds 100-107 gave 7 of 8."),
            Check("... without a bias: measured minus predicted, in standard errors and averaged over the four G, "
                  "lies within +-1", lambda runs: math.fsum(runs[c]["measured_minus_predicted_z"] for c in static)
                  / len(static), "within", margin=1.0,
                  note="A small positive mean difference in shares was once read as the measured share exceeding "
                       "the prediction; in units of its own sampling noise the difference is centred on 0."),
            Check("The share of tied groups grows as G falls (G = 2 > 4 > 8 > 16)",
                  lambda runs: all(runs[a]["zero_group_fraction"] > runs[b]["zero_group_fraction"]
                                   for a, b in zip(static, static[1:]))),
            Check("Dynamic sampling (G = 8) cuts the share of tied groups below half of static G = 8's",
                  lambda runs: runs[dynamic]["zero_group_fraction"] < 0.5 * runs[static[2]]["zero_group_fraction"]),
            Claim("... at the price of samples: it needs more sampled tokens to reach 0.9 than static G = 8",
                  difference("tokens_to_0.9", dynamic, static[2]), "greater",
                  note="Here the groups tie mostly once the task is learned, so filtering them buys little per "
                       "sampled token."),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["zero_group_fraction", "predicted_zero_group_fraction"],
             "where": {"dynamic_sampling": False}, "title": "tied groups: measured (solid), predicted (dashed)",
             "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "zero_group_fraction", "where": {"dynamic_sampling": False},
             "title": "tied groups over the run, static sampling", "ylabel": "share of groups"},
            {"kind": "values", "metrics": ["measured_minus_predicted_z"], "where": {"dynamic_sampling": False},
             "title": "measured minus predicted, in standard errors", "ylabel": "z"},
            {"kind": "values", "metrics": ["tokens_to_0.9"], "title": "sampled tokens to exact success 0.9",
             "ylabel": "tokens"}]},
        seeds=18,
        seeds_reason="the prediction is exact batch by batch, so a few seeds test it; the token price, pooled over "
                     "the seeds from 0, 100, 1300 and 1500 (effects in standard deviations, 95% power), measures "
                     "0.88, which needs 18 (16 had been chosen from 1.03 over seeds 0-7 and 100-107; 16 seeds from "
                     "1500 left it within noise)",
        cost=0.6,
    )


def _clip_higher():
    losses = [({"loss": "grpo", "epsilon_high": 0.2}, {}),
              ({"loss": "grpo", "epsilon_high": 0.28}, {"epsilon_high": 0.28}),
              ({"loss": "cispo", "epsilon_high": 5.0}, {"algorithm": "cispo"})]
    curve = ("entropy", "success_probability")
    # the ablation of the cause, on GRPO at eps_high 0.2: the step per update scaled against the reuse, so that
    # 8 updates at an eighth of the rate move the policy per batch about as far as 1 at the default, and 2 at
    # four times the rate as far as 8
    rates = ((8, LEARNING_RATE / 8), (2, 4 * LEARNING_RATE))

    def name(label, updates, rate=LEARNING_RATE):
        return C({**label, "updates_per_batch": updates, "learning_rate": rate})

    at = {updates: [name(label, updates) for label, _ in losses] for updates in (8, 2)}
    slow, fast = (name(losses[0][0], updates, rate) for updates, rate in rates)
    return Experiment(
        name="clip-higher",
        summary="eps_high 0.2 vs 0.28 (and CISPO) at 8 and 2 updates per batch, and the learning rate scaled "
                "against them: entropy, stuck prompts",
        source="DAPO, arXiv 2503.14476, sec. 3.1 (clip-higher)",
        claim="A symmetric clip stops low-probability tokens with A > 0 early, so entropy collapses; raising the "
              "upper bound keeps exploring. On the table policy the entropy difference is not visible; what 8 updates "
              "per batch do show is a prompt that collapses onto a partial-credit answer (a truncated response that "
              "starts right, reward 0.25): its groups then mostly tie and it never learns the answer. It follows how "
              "far the policy moves per sampled batch, not the reuse of the batch: 8 updates at an eighth of the "
              "learning rate do not stick, 2 updates at four times the rate do. Raising eps_high does not "
              "prevent it.",
        configurations=[_online({**label, "updates_per_batch": updates, "learning_rate": LEARNING_RATE}, curve,
                                updates_per_batch=updates, **options)
                        for updates in (8, 2) for label, options in losses]
                       + [_online({**losses[0][0], "updates_per_batch": updates, "learning_rate": rate}, curve,
                                  updates_per_batch=updates, learning_rate=rate) for updates, rate in rates],
        metrics=["partial_stuck_prompts", "stuck_prompts", "final_success_probability", "worst_prompt_success",
                 "entropy_last", "clip_fraction", "iterations_to_0.9"],
        curves=curve,
        claims=[
            Claim("Raising eps_high from 0.2 to 0.28 (8 updates per batch) ends with a higher entropy",
                  difference("entropy_last", at[8][1], at[8][0]), "greater",
                  note="Not visible on the table policy, whose task has one right answer per prompt: collapsing onto "
                       "it is the goal. The transformer experiment clip-higher-entropy tests it."),
            Claim("At 8 updates per batch, some runs end with a prompt stuck on a partial-credit answer (success "
                  "below 0.5, partial credit above 0.5), whatever the loss",
                  lambda runs: any(runs[c]["partial_stuck_prompts"] > 0 for c in at[8]), at_least=0.0,
                  note="How often, per loss: the mean of partial_stuck_prompts in the table. Its groups all score "
                       "0.25, tie and teach nothing: a collapse onto the wrong mode, not a lack of exploration."),
            Claim("At 2 updates per batch no prompt ends stuck, for any of the three losses, in at least 9 runs in 10",
                  lambda runs: all(runs[c]["stuck_prompts"] == 0 for c in at[2]), at_least=MOST_RUNS,
                  note="A rate, not every seed: the default GRPO run gets a prompt stuck in about 1 seed in 60."),
            Claim("Raising eps_high to 0.28 prevents it: no stuck prompt at eps_high 0.28 and 8 updates, in at least "
                  "9 runs in 10",
                  lambda runs: runs[at[8][1]]["stuck_prompts"] == 0, at_least=MOST_RUNS,
                  note="Clip-higher is the field's remedy for entropy collapse; against this collapse it does not "
                       "help: a smaller move per batch does."),
            Claim(f"The cause removed, the reuse kept: at 8 updates and an eighth of the learning rate "
                  f"({LEARNING_RATE / 8:g}), no prompt ends stuck in at least 9 runs in 10 (GRPO, eps_high 0.2)",
                  lambda runs: runs[slow]["stuck_prompts"] == 0, at_least=MOST_RUNS,
                  note="The policy moves per batch about as far as with 1 update at the default rate: if the reuse "
                       "itself made the prompts stick, they would stick here too."),
            Claim(f"The cause kept, the reuse cut: 2 updates at four times the learning rate ({4 * LEARNING_RATE:g}) "
                  "end with more stuck prompts than 2 updates at the default rate (GRPO, eps_high 0.2)",
                  difference("stuck_prompts", fast, at[2][0]), "greater",
                  note="A paired count per seed, most of it 0 or 1: half of the seeds above 0 is asked, not 0.8, "
                       "since a count of 0 or 1 stuck prompt cannot rise in every seed; the interval decides."),
        ],
        figure={"color_by": ["loss", "epsilon_high", "learning_rate"], "panels": [
            {"kind": "values", "metrics": ["stuck_prompts"], "where": {"learning_rate": LEARNING_RATE},
             "title": "prompts stuck below success 0.5", "ylabel": "prompts per run (of 6)"},
            {"kind": "values", "metrics": ["stuck_prompts"], "where": {"loss": "grpo", "epsilon_high": 0.2},
             "title": "GRPO: stuck prompts against the updates and the learning rate",
             "ylabel": "prompts per run (of 6)"},
            {"kind": "values", "metrics": ["entropy_last"], "where": {"learning_rate": LEARNING_RATE},
             "title": "entropy, last 10 iterations", "ylabel": "nats per token"},
            {"kind": "curves", "columns": ["entropy"], "where": {"updates_per_batch": 8},
             "title": "entropy at 8 updates per batch", "ylabel": "nats per token", "log": True}]},
        seeds=15,
        seeds_reason="a prompt sticks in a few runs of 10 at 8 updates and the default rate, and the ablation at four "
                     "times the rate in 11 of 15 seeds against 0 of 15 at an eighth: 15 seeds count both and "
                     "separate effects above 0.55; the entropy gap measures 0.13 over the 15 seeds, too small for "
                     "any affordable count",
        cost=0.6,
    )


def _updates_per_batch():
    algorithms, counts = ("grpo", "cispo", "gspo"), (1, 2, 4, 8)
    rates = ((8, LEARNING_RATE / 8), (2, 4 * LEARNING_RATE))  # the ablation of the cause, GRPO only (clip-higher's)

    def name(algorithm, updates, rate=LEARNING_RATE):
        return C({"algorithm": algorithm, "updates_per_batch": updates, "learning_rate": rate})

    def falls(algorithm):
        return Claim(f"{algorithm.upper()}: the final success at 8 updates per batch is below that at 1",
                     difference("final_success_probability", name(algorithm, 1), name(algorithm, 8)),
                     "greater")

    slow, fast = (name("grpo", updates, rate) for updates, rate in rates)
    return Experiment(
        name="updates-per-batch",
        summary="1, 2, 4, 8 Adam steps per batch for GRPO, CISPO, GSPO, and the learning rate scaled against them: "
                "how far the policy moves per batch",
        source="PPO, arXiv 1707.06347 (epochs per batch)",
        claim="More steps on a batch move the policy further from the one that sampled it: the clip binds more and "
              "the final success falls, while the first iterations learn faster. The fall follows how far the "
              "policy moves per sampled batch (the steps times the learning rate), not the reuse of the batch: the "
              "ablation runs GRPO at 8 steps and an eighth of the rate (the reuse kept, the move cut) and at 2 "
              "steps and four times the rate (the reuse cut, the move kept).",
        configurations=[_online({"algorithm": algorithm, "updates_per_batch": updates, "learning_rate": LEARNING_RATE},
                                ("success_probability",), algorithm=algorithm, updates_per_batch=updates)
                        for algorithm in algorithms for updates in counts]
                       + [_online({"algorithm": "grpo", "updates_per_batch": updates, "learning_rate": rate},
                                  ("success_probability",), algorithm="grpo", updates_per_batch=updates,
                                  learning_rate=rate) for updates, rate in rates],
        metrics=["final_success_probability", "iterations_to_0.9", "clip_fraction", "stuck_prompts"],
        curves=("success_probability",),
        claims=[
            Check("The clip binds more with more updates per batch (clip_fraction at 1 < 2 < 4 < 8), for GRPO and "
                  "GSPO",
                  lambda runs: all(runs[name(a, u)]["clip_fraction"] < runs[name(a, v)]["clip_fraction"]
                                   for a in ("grpo", "gspo") for u, v in zip(counts, counts[1:])),
                  note="CISPO caps the weight instead of zeroing the gradient: its clip_fraction is 0 by definition."),
            falls("grpo"), falls("cispo"), falls("gspo"),
            Claim("GRPO reaches exact success 0.9 in fewer iterations at 8 updates per batch than at 1",
                  difference("iterations_to_0.9", name("grpo", 1), name("grpo", 8)), "greater"),
            Claim(f"The move cut, the reuse kept: GRPO at 8 updates and an eighth of the learning rate "
                  f"({LEARNING_RATE / 8:g}) ends higher than at 8 updates and the default rate",
                  difference("final_success_probability", slow, name("grpo", 8)), "greater",
                  note="If the reuse itself cost success, a smaller rate at the same 8 steps per batch would not "
                       "give it back."),
            Claim(f"The move kept, the reuse cut: GRPO at 2 updates and four times the learning rate "
                  f"({4 * LEARNING_RATE:g}) ends below 1 update at the default rate",
                  difference("final_success_probability", name("grpo", 1), fast), "greater"),
        ],
        figure={"color_by": ["algorithm"], "panels": [
            {"kind": "sweep", "x": "updates_per_batch", "metric": "final_success_probability",
             "where": {"learning_rate": LEARNING_RATE}, "title": "final exact success", "ylabel": "p(correct)"},
            {"kind": "sweep", "x": "updates_per_batch", "metric": "clip_fraction",
             "where": {"learning_rate": LEARNING_RATE}, "title": "share of clipped tokens (mean over the run)",
             "ylabel": "clip_fraction"},
            {"kind": "sweep", "x": "updates_per_batch", "metric": "iterations_to_0.9",
             "where": {"learning_rate": LEARNING_RATE}, "title": "iterations to exact success 0.9",
             "ylabel": "iterations"},
            {"kind": "values", "metrics": ["final_success_probability"], "where": {"algorithm": "grpo"},
             "title": "GRPO: the learning rate against the updates", "ylabel": "p(correct)"}]},
        seeds=50,
        seeds_reason="the fall measures 3.4 (GRPO) and 11 (GSPO) on seeds 0-4; CISPO's 0.63 needs about 21; the "
                     "ablation at an eighth of the learning rate measures 0.52 pooled over 21 seeds from each of 0, "
                     "100 and 1300 (holds on two, within noise on the third), which needs (1.96 + 1.645)^2 / 0.52^2 "
                     "+ 1 = 49 seeds for 95% power, so 50",
        cost=0.4,
    )


def _sampler_mismatch():
    samplers = (("same", {}), ("temperature 1.5", {"rollout_temperature": 1.5}), ("top-p 0.8", {"rollout_top_p": 0.8}))
    configurations = []
    for beta in (0.02, 0.0):
        for sampler, options in samplers:
            if beta == 0.0 and sampler != "temperature 1.5":
                continue  # the ablation needs only the sampler whose TIS loss it explains
            for tis in ((False,) if sampler == "same" else (False, True)):
                label = {"sampler": sampler, "tis": tis, "beta": beta}
                configurations.append((label, "run_sampler_mismatch",
                                       {**options, **({"tis_cap": 2.0} if tis else {}), "beta": beta}))

    def name(sampler, tis, beta=0.02):
        return C({"sampler": sampler, "tis": tis, "beta": beta})

    hot, hot_tis = name("temperature 1.5", False), name("temperature 1.5", True)
    top = name("top-p 0.8", False)
    loss_on = difference("final_success_probability", hot, hot_tis)
    loss_off = difference("final_success_probability", name("temperature 1.5", False, 0.0),
                          name("temperature 1.5", True, 0.0))
    return Experiment(
        name="sampler-mismatch",
        summary="sample at another temperature or top-p than the trainer scores: gradient bias and TIS",
        source="Yao et al. 2025 (truncated importance sampling for rollout/trainer mismatch); IMPALA, arXiv 1802.01561",
        claim="Tokens drawn from another distribution bias the gradient; weights min(p_trainer/p_sampler, cap) remove "
              "most of the bias where the sampler covers the trainer's support. Top-p removes tokens the trainer "
              "still gives probability: no weight can bring them back. The bias is measured directly: the exact "
              "expected gradient under the sampler, against the exact gradient, every response enumerated. Yet with "
              "the KL penalty on, TIS lowers the final success: TIS reweights the policy term but not the KL term, "
              "sampled from the same mismatched tokens; the ablation with the KL penalty off removes most of that "
              "loss.",
        configurations=configurations,
        metrics=["final_success_probability", "gradient_bias", "gradient_bias_tis", "kl_reference",
                 "iterations_to_0.9"],
        curves=("success_probability", "gradient_bias", "gradient_bias_tis"),
        claims=[
            Check("The measurement: with the sampler equal to the trainer, the expected estimate is the exact "
                  "gradient (relative error below 1e-12)",
                  lambda runs: runs[name("same", False)]["gradient_bias"] < 1e-12),
            Check("Sampling at temperature 1.5 biases the expected policy gradient (relative error above 0.5) and "
                  "TIS with cap 2 removes most of it (below a fifth of the error without)",
                  lambda runs: runs[hot]["gradient_bias"] > 0.5 and runs[hot]["gradient_bias_tis"]
                  < 0.2 * runs[hot]["gradient_bias"]),
            Check("Top-p 0.8 biases it too (above 0.5), and TIS cannot remove it (with TIS above 0.9 of the error "
                  "without): the tokens outside the nucleus are never drawn",
                  lambda runs: runs[top]["gradient_bias"] > 0.5 and runs[top]["gradient_bias_tis"]
                  > 0.9 * runs[top]["gradient_bias"]),
            Claim("With the KL penalty on (beta 0.02), TIS lowers the final success at temperature 1.5",
                  loss_on, "greater",
                  note="A correction of the gradient that costs final success: the k3 term keeps its uncorrected "
                       "weights while the policy term is reweighted, so the two no longer balance where they did "
                       "on-policy."),
            Check("With the KL penalty off, TIS and no TIS end within 0.01 of each other at temperature 1.5",
                  loss_off, "within", margin=0.01),
            Claim("So the KL term makes the loss: (no TIS - TIS) with beta 0.02 exceeds it with beta 0",
                  lambda runs: loss_on(runs) - loss_off(runs), "greater"),
        ],
        figure={"color_by": ["sampler"], "panels": [
            {"kind": "values", "metrics": ["gradient_bias", "gradient_bias_tis"], "where": {"beta": 0.02, "tis": False},
             "title": "expected-gradient bias without / with TIS", "ylabel": "‖E[g] - grad J‖ / ‖grad J‖"},
            {"kind": "curves", "columns": ["success_probability"],
             "where": {"beta": 0.02, "sampler": ["same", "temperature 1.5"]},
             "title": "temperature 1.5, KL penalty beta 0.02", "ylabel": "exact success"},
            {"kind": "curves", "columns": ["success_probability"], "where": {"sampler": ["same", "top-p 0.8"]},
             "title": "top-p 0.8, without and with TIS (dashed)", "ylabel": "exact success"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"}]},
        seeds_reason="the biases are exact; the cost of TIS measures 15 on seeds 0-4, far over the 1.24 that 5 seeds "
                     "separate",
        cost=0.8,
    )


def _local_token_mean_holds(runs, micro):
    """One seed's batch: the locally normalized token mean is off (above 1e-3) where the micro-batches' token
    counts differ, exact (below 1e-12) where they are equal (then each local mean is the global one)."""
    error = runs[f"token_local_m{micro}"]
    return error > 1e-3 if runs[f"token_count_spread_m{micro}"] > 0 else error < 1e-12


def _microbatch():
    every = (1, 2, 4)
    return Experiment(
        name="microbatch",
        summary="one batch in 1, 2, 4 micro-batches: accumulated gradient vs the full batch, per reduction",
        source="verl issue 5625 (token-mean normalized per micro-batch under gradient accumulation)",
        claim="With the token mean, normalizing each micro-batch by its own token count gives a different gradient "
              "than the full batch; normalizing by the global token count (or using the sequence mean or a constant) "
              "gives the same gradient exactly.",
        configurations=[({"batch": "seed"}, "run_microbatch", {})],
        metrics=[f"{reduction}_local_m{micro}" for reduction in REDUCTIONS for micro in every]
                + [f"token_global_m{micro}" for micro in every]
                + [f"token_count_spread_m{micro}" for micro in every] + ["length_spread"],
        claims=[
            Check("The token mean normalized per micro-batch gives another gradient than the full batch (relative "
                  "error above 1e-3) at 2 and 4 micro-batches wherever their token counts differ, and the same "
                  "(below 1e-12) wherever they are equal",
                  lambda runs: all(_local_token_mean_holds(runs["batch=seed"], micro) for micro in (2, 4))),
            Check("The token mean over the global token count, the sequence mean and the constant give the full "
                  "batch's gradient (relative error below 1e-12) at 1, 2 and 4 micro-batches",
                  lambda runs: all(runs["batch=seed"][f"{name}_m{micro}"] < 1e-12 for micro in every
                                   for name in ("token_global", "sequence_local", "constant_local"))),
        ],
        figure={"panels": [
            {"kind": "values", "metrics": [f"token_local_m{micro}" for micro in every],
             "title": "token mean, each micro-batch by its own count", "ylabel": "relative gradient error"},
            {"kind": "values",
             "metrics": [f"{name}_m4" for name in ("token_global", "sequence_local", "constant_local")],
             "title": "4 micro-batches: global count, sequence mean, constant", "ylabel": "relative gradient error",
             "same_y_as": 0}]},
        seeds_reason="exact gradients of one batch per seed: 5 batches show that the identities hold whatever the "
                     "batch",
        cost=0.1,
    )


def _grpo2_vs_dpo():
    labels = [({"algorithm": "grpo", "group_size": 2, "kl_penalty": "beta 0.02"}, {"group_size": 2, "prompts": 32}),
              ({"algorithm": "dpo", "group_size": 2, "kl_penalty": "implicit"},
               {"algorithm": "dpo", "group_size": 2, "prompts": 32}),
              ({"algorithm": "grpo", "group_size": 8, "kl_penalty": "beta 0.02"}, {"group_size": 8, "prompts": 8}),
              ({"algorithm": "grpo", "group_size": 2, "kl_penalty": "off"},
               {"group_size": 2, "prompts": 32, "beta": 0.0})]
    grpo2, dpo2, grpo8, grpo2_off = (C(label) for label, _ in labels)
    return Experiment(
        name="grpo2-vs-dpo",
        summary="GRPO with G = 2 against online DPO at the same samples, with GRPO's KL penalty on and off",
        source="It Takes Two: Your GRPO Is Secretly DPO, arXiv 2510.00977",
        claim="With two samples per prompt, GRPO's advantages are +-1 on pairs with different rewards: a contrastive "
              "update like DPO's, the same direction with another size. They end apart mostly through GRPO's explicit "
              "KL penalty: with it off, the two end alike in 39 of the 40 committed seeds. Whether either needs "
              "more samples than G = 8 depends on the seeds.",
        configurations=[_online(label, ONLINE_CURVE, **options) for label, options in labels],
        metrics=["final_success_probability", "tokens_to_0.9", "iterations_to_0.9", "kl_reference",
                 "responses_sampled"],
        curves=("success_probability",),
        claims=[
            Claim("With its KL penalty (beta 0.02), GRPO with G = 2 ends below online DPO",
                  difference("final_success_probability", dpo2, grpo2), "greater"),
            Claim("With GRPO's KL penalty off, GRPO with G = 2 and online DPO end within 0.01 of each other",
                  difference("final_success_probability", dpo2, grpo2_off), "within", margin=0.01,
                  note="A claim, not a check: the two updates share their direction on a pair, not their size "
                       "(+-1 against DPO's sigmoid weight), so a run can end elsewhere. Seed 105 does: GRPO without "
                       "its KL never reaches 0.9 and ends 0.165 below DPO, where the other 39 committed seeds end "
                       "within 0.005."),
            Claim("GRPO with G = 2 needs more sampled tokens to reach 0.9 than GRPO with G = 8",
                  difference("tokens_to_0.9", grpo2, grpo8), "greater",
                  note="The paper's claim is the equivalence of the updates, not a sample cost; this is the atlas's "
                       "first edition's reading, kept so that its verdict on other seeds can be compared."),
            Claim("Online DPO (G = 2) needs more sampled tokens to reach 0.9 than GRPO with G = 8",
                  difference("tokens_to_0.9", dpo2, grpo8), "greater"),
        ],
        figure={"color_by": ["algorithm", "group_size"], "panels": [
            {"kind": "curves", "columns": ["success_probability"], "x": "total_tokens_sampled",
             "title": "exact success against sampled tokens", "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["tokens_to_0.9"], "title": "sampled tokens to exact success 0.9",
             "ylabel": "tokens"}]},
        seeds=60,
        seeds_reason="the gap made by the KL penalty measures 3.9 on seeds 0-4, over the 1.24 that 5 seeds separate; "
                     "G = 2's token cost measured 1.01 over seeds 0-4 and 100-104 pooled, but 0.48 over 20 seeds from "
                     "each of 0, 100 and 1300 (within noise on two, holds on the third: ten seeds had overestimated "
                     "it), which needs (1.96 + 1.645)^2 / 0.48^2 + 1 = 57 seeds for 95% power, so 60",
        cost=0.4,
    )


def _four_algorithms():
    # what still moves a prompt whose sampled answers all score alike, by algorithm
    tied = {"ppo": "its advantages are the critic's error alone (reward minus value), so only the critic's error "
                   "and the KL in the reward move it",
            "dpo": "it yields no pair, so the loss has no term for it (DPO has no KL-penalty term): nothing moves it",
            "grpo": "its group-relative advantages are 0, so only the KL penalty moves it",
            "cispo": "its group-relative advantages are 0, so only the KL penalty moves it"}

    def reaches(algorithm):
        configuration = C({"algorithm": algorithm})
        return Claim(f"{algorithm.upper()} reaches exact success 0.9 in at least 9 runs in 10",
                     lambda runs: runs[configuration]["iterations_to_0.9"] is not None, at_least=MOST_RUNS,
                     note="A run that never reaches 0.9 ends with one prompt stuck near 0 success (stuck_prompts): "
                          f"its sampled answers all score alike; {tied[algorithm]}. The share, with its interval, "
                          "is how often over these seeds. A rate, not every seed: a rare failure (about 1 run in 60 "
                          "for GRPO) is absent from one set of 20 seeds and present in the next.")

    return Experiment(
        name="four-algorithms",
        summary="PPO, DPO, GRPO, CISPO on the token task at one budget (B*G responses per iteration)",
        source="the article this lab accompanies; InstructGPT, arXiv 2203.02155; DPO, arXiv 2305.18290",
        claim="At the same responses per iteration the four learn the task in most seeds; PPO's critic gives "
              "per-token credit, DPO uses only the best and worst response per prompt. A few seeds end stuck below "
              "0.9, one prompt never answered right, PPO the most often; the counts over 20 seeds say how often.",
        configurations=[_online({"algorithm": algorithm}, ONLINE_CURVE, algorithm=algorithm)
                        for algorithm in FOUR_ALGORITHMS],
        metrics=["final_success_probability", "iterations_to_0.9", "tokens_to_0.9", "stuck_prompts", "kl_reference",
                 "mean_correct_length", "mean_wrong_length"],
        curves=("success_probability",),
        claims=[reaches(algorithm) for algorithm in FOUR_ALGORITHMS],
        figure={"color_by": ["algorithm"], "panels": [
            {"kind": "curves", "columns": ["success_probability"], "x": "total_tokens_sampled",
             "title": "exact success against sampled tokens", "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["final_success_probability"], "title": "final exact success",
             "ylabel": "p(correct)"},
            {"kind": "values", "metrics": ["tokens_to_0.9"], "title": "sampled tokens to exact success 0.9",
             "ylabel": "tokens"},
            {"kind": "values", "metrics": ["kl_reference"], "title": "KL to the reference at the end",
             "ylabel": "nats per response"}]},
        seeds=20,
        seeds_reason="a run that never reaches 0.9 comes about once in 20: 20 seeds show it and bound its rate "
                     "(Wilson's interval)",
        cost=0.4,
    )


def _dpo_label_flips():
    flips = (0, 3, 6, 12)
    names = {count: C({"preference_flips": count}) for count in flips}
    start = 0.7 / 3  # the uniform policy's expected reward: mean of the table, (1.0 + 0.2 - 0.5) / 3
    return Experiment(
        name="dpo-label-flips",
        summary="bandit DPO with 0, 3, 6, 12 of its 12 labels reversed",
        source="the article, sec. 10.3",
        claim="The training loss falls whatever the labels say; the loss on the true labels rises with the flips. "
              "With 3 of 12 reversed the true reward still rises from its start, less than with clean labels; with "
              "all 12 reversed it falls toward the worst possible: the optimizer solves the task it was given.",
        configurations=[({"preference_flips": count}, "run_bandit", {"algorithm": "dpo", "preference_flips": count})
                        for count in flips],
        metrics=["final_expected_reward", "dpo_training_loss", "dpo_clean_loss"],
        curves=("expected_reward",),
        claims=[
            Check("The training loss ends below ln 2 (its start) at every flip count",
                  lambda runs: all(runs[names[count]]["dpo_training_loss"] < math.log(2) for count in flips)),
            Claim("The loss on the true labels rises with the flips (0 < 3 < 6 < 12)",
                  lambda runs: all(runs[names[a]]["dpo_clean_loss"] < runs[names[b]]["dpo_clean_loss"]
                                   for a, b in zip(flips, flips[1:]))),
            Claim("With 3 of 12 labels reversed the true reward still rises above its start (0.2333)",
                  lambda runs: runs[names[3]]["final_expected_reward"] > start),
            Claim("... but ends below the clean labels' reward",
                  lambda runs: runs[names[3]]["final_expected_reward"] < runs[names[0]]["final_expected_reward"]),
            Check("With all 12 reversed the true reward falls below -0.4 (the worst possible is -0.5)",
                  lambda runs: runs[names[12]]["final_expected_reward"] < -0.4),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["expected_reward"], "title": "true expected reward (exact)",
             "ylabel": "expected reward"},
            {"kind": "sweep", "x": "preference_flips", "metric": "final_expected_reward",
             "title": "final true reward", "ylabel": "expected reward"},
            {"kind": "sweep", "x": "preference_flips", "metric": "dpo_training_loss",
             "title": "final loss on the labels trained on", "ylabel": "DPO loss"},
            {"kind": "sweep", "x": "preference_flips", "metric": "dpo_clean_loss",
             "title": "final loss on the true labels", "ylabel": "DPO loss"}]},
        seeds_reason="the bandit's losses and rewards are exact and their orderings hold by wide margins: 5 seeds "
                     "show them",
        cost=0.15,
    )


def _group_size():
    sizes = (2, 4, 8, 16)
    names = [C({"group_size": size}) for size in sizes]
    return Experiment(
        name="group-size",
        summary="bandit GRPO, G = 2, 4, 8, 16 at 128 actions per iteration",
        source="the article, sec. 10.3",
        claim="At a fixed action budget, larger groups mean fewer prompts per batch; most groups tie once the policy "
              "is good, fewer the larger G, yet all reach the optimum.",
        configurations=[({"group_size": size}, "run_bandit",
                         {"algorithm": "grpo", "group_size": size, "grpo_prompts": 128 // size,
                          "curve": ("best_action_probability", "zero_group_fraction")})
                        for size in sizes],
        metrics=["zero_group_fraction", "actions_to_0.9", "final_expected_reward"],
        curves=("zero_group_fraction", "best_action_probability"),
        claims=[
            Check("Every G reaches best-action probability 0.9",
                  lambda runs: all(runs[c]["actions_to_0.9"] is not None for c in names)),
            Check("Most groups tie over the run (zero_group_fraction above 0.5) at every G",
                  lambda runs: all(runs[c]["zero_group_fraction"] > 0.5 for c in names)),
            Check("The share of tied groups falls as G grows (G = 2 > 4 > 8 > 16)",
                  lambda runs: all(runs[a]["zero_group_fraction"] > runs[b]["zero_group_fraction"]
                                   for a, b in zip(names, names[1:]))),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["zero_group_fraction"], "max_step": 40,
             "title": "share of tied groups per batch, first 40 iterations", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "zero_group_fraction",
             "title": "tied groups, mean over the run", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "actions_to_0.9",
             "title": "sampled actions to best-action probability 0.9", "ylabel": "actions"}]},
        seeds_reason="the shares of tied groups are means over every iteration, far apart from one G to the next: 5 "
                     "seeds show them",
        cost=0.35,
    )


def _chain_lambda():
    names = {value: C({"gae_lambda": value}) for value in (0.0, 0.95, 1.0)}
    return Experiment(
        name="chain-lambda",
        summary="two-step chain PPO with GAE lambda 0, 0.95, 1",
        source="GAE, arXiv 1506.02438; the chain page's GAE trace (docs/chain.md)",
        claim="lambda trades bias for variance; lambda 0 still learns a delayed reward through the critic's "
              "bootstrap, only slower at the start, and catches up.",
        configurations=[({"gae_lambda": value}, "run_chain", {"gae_lambda": value}) for value in (0.0, 0.95, 1.0)],
        metrics=["expected_return_step_1", "expected_return_step_5", "expected_return_step_10",
                 "final_expected_return"],
        curves=("expected_return",),
        claims=[
            Claim("lambda 0 starts slower: J at step 5 is below lambda 0.95's",
                  difference("expected_return_step_5", names[0.95], names[0.0]), "greater"),
            Claim("lambda 0 still learns the delayed reward: final J above 0.99",
                  lambda runs: runs[names[0.0]]["final_expected_return"] > 0.99),
            Check("... and catches up: final J within 0.005 of lambda 0.95's",
                  difference("final_expected_return", names[0.95], names[0.0]), "within", margin=0.005),
        ],
        figure={"panels": [
            {"kind": "curves", "columns": ["expected_return"], "max_step": 20,
             "title": "exact expected return, first 20 steps", "ylabel": "J"},
            {"kind": "values",
             "metrics": ["expected_return_step_1", "expected_return_step_5", "expected_return_step_10"],
             "title": "J at steps 1, 5, 10", "ylabel": "J"}]},
        seeds_reason="the slow start measures 5.1 on seeds 0-4, over the 1.24 that 5 seeds separate",
        cost=0.35,
    )


def _reward_shift():
    names = {(algorithm, shift): C({"algorithm": algorithm, "shift": shift})
             for algorithm in ("grpo", "ppo") for shift in (0.0, 5.0)}
    return Experiment(
        name="reward-shift",
        summary="bandit rewards plus a constant: GRPO's advantages do not move, PPO's critic relearns",
        source="the article, sec. 10.3",
        claim="A group-relative advantage subtracts the group mean, so a constant shift changes nothing; PPO's critic "
              "starts at 0 and must first learn the shift, and until then every sampled action looks good.",
        configurations=[({"algorithm": algorithm, "shift": shift}, "run_reward_shift",
                         {"algorithm": algorithm, "shift": shift, "steps": 40})
                        for algorithm in ("grpo", "ppo") for shift in (0.0, 5.0)],
        metrics=["best_action_probability_step_5", "best_action_probability_step_10", "steps_to_0.9",
                 "advantage_change"],
        curves=("best_action_probability",),
        claims=[
            Check("GRPO's first-batch advantages do not move with a shift of 5 (by less than 1e-12)",
                  lambda runs: runs[names["grpo", 5.0]]["advantage_change"] < 1e-12),
            Check("... so its run is the unshifted run: best-action probability at step 10 equal within 1e-9",
                  lambda runs: abs(runs[names["grpo", 5.0]]["best_action_probability_step_10"]
                                                 - runs[names["grpo", 0.0]]["best_action_probability_step_10"]) < 1e-9),
            Check("PPO's first-batch advantages move by the whole shift (5, within 1e-12)",
                  lambda runs: abs(runs[names["ppo", 5.0]]["advantage_change"] - 5.0) < 1e-12),
            Claim("... and PPO learns slower with the shift: best-action probability at step 5 lower",
                  difference("best_action_probability_step_5", names["ppo", 0.0], names["ppo", 5.0]),
                  "greater"),
        ],
        figure={"color_by": ["algorithm"], "panels": [
            {"kind": "curves", "columns": ["best_action_probability"], "where": {"algorithm": "grpo"},
             "title": "GRPO: shift 0 and 5 (the same run)", "ylabel": "best-action probability"},
            {"kind": "curves", "columns": ["best_action_probability"], "where": {"algorithm": "ppo"},
             "title": "PPO: shift 0 and 5", "ylabel": "best-action probability"},
            {"kind": "values", "metrics": ["advantage_change"], "title": "first batch: change of the advantages",
             "ylabel": "max |A(R + 5) - A(R)|"}]},
        seeds_reason="the advantages are identities; the slower PPO start measures 3.8 on seeds 0-4, over the 1.24 "
                     "that 5 seeds separate",
        cost=0.15,
    )


def _sparse_reward():
    sizes = (2, 4, 8, 16)

    def name(rewards, size):
        return C({"rewards": rewards, "group_size": size})

    return Experiment(
        name="sparse-reward",
        summary="bandit GRPO with sparse rewards (1 for the best action) vs dense, G at 128 actions per iteration",
        source="the article, sec. 10.3",
        claim="With only one rewarded action, groups tie more often early (all failures); late, when the policy picks "
              "the best action every time, they tie whatever the other rewards are. Every G still learns, and on this "
              "bandit the sparse reward costs no more samples than the dense one.",
        configurations=[({"rewards": rewards, "group_size": size}, "run_bandit",
                         {"algorithm": "grpo", "group_size": size, "grpo_prompts": 128 // size,
                          "sparse_rewards": rewards == "sparse",
                          "curve": ("best_action_probability", "zero_group_fraction")})
                        for rewards in ("sparse", "dense") for size in sizes],
        metrics=["zero_group_fraction", "actions_to_0.9", "final_best_action_probability"],
        curves=("zero_group_fraction", "best_action_probability"),
        claims=[
            Claim("With sparse rewards every G still reaches best-action probability 0.9, in at least 9 runs in 10",
                  lambda runs: all(runs[name("sparse", size)]["actions_to_0.9"] is not None for size in sizes),
                  at_least=MOST_RUNS),
            Claim("At G = 2, sparse rewards tie more groups over the run than dense ones",
                  difference("zero_group_fraction", name("sparse", 2), name("dense", 2)), "greater"),
            Claim("At G = 16 too",
                  difference("zero_group_fraction", name("sparse", 16), name("dense", 16)), "greater",
                  note="Most ties come once the policy is good, and those do not depend on the other actions' "
                       "rewards: a large group rarely ties early, dense or sparse."),
            Claim("Sparse rewards cost more sampled actions to reach 0.9 than dense ones at G = 8",
                  difference("actions_to_0.9", name("sparse", 8), name("dense", 8)), "greater",
                  note="The field's intuition. On this bandit the best action's advantage is the largest in its "
                       "group either way, so the sparse table teaches the same thing."),
        ],
        figure={"color_by": ["rewards"], "panels": [
            {"kind": "curves", "columns": ["zero_group_fraction"], "where": {"group_size": 2}, "max_step": 40,
             "title": "tied groups per batch, G = 2, first 40 iterations", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "zero_group_fraction",
             "title": "tied groups, mean over the run", "ylabel": "share of groups"},
            {"kind": "sweep", "x": "group_size", "metric": "actions_to_0.9",
             "title": "sampled actions to best-action probability 0.9", "ylabel": "actions"}]},
        seeds=22,
        seeds_reason="the tie gap at G = 2 measures 2.8 on seeds 0-4; at G = 16 (0.62) it needs about 22 seeds, which "
                     "separate effects above 0.44; the sample cost measured none (-0.45)",
        cost=0.35,
    )


# ---------------------------------------------------------------------------------------------
# The field's effects on the transformer policy (Countdown, from its SFT start)
# ---------------------------------------------------------------------------------------------


def _transformer(label, runner="run_transformer", **options):
    return (label, runner, options)


# the panels several transformer experiments share, by name
SHARED_PANELS = {
    "test success": {"kind": "curves", "columns": ["test_success_probability"], "title": "exact success, test prompts",
                     "ylabel": "p(correct)"},
    "final test success": {"kind": "values", "metrics": ["final_test_success_probability"],
                           "title": "final exact test success", "ylabel": "p(correct)"},
    "entropy": {"kind": "curves", "columns": ["entropy"], "title": "entropy of the sampled tokens",
                "ylabel": "nats per token"},
}


# a preference pair needs a correct response: the 20-step SFT start of TRANSFORMER_QUICK almost never answers
# right, one of 150 steps does on a few prompts of 8 (about 5 s of SFT once, then cached)
DPO_QUICK = {**TRANSFORMER_QUICK, "sft_steps": 150, "prompts": 8, "group_size": 8}


def _transformer_experiment(color_by, panels, **fields):
    """An Experiment of transformer runs: TRANSFORMER_QUICK at --quick, and a figure coloured by the label
    keys `color_by` whose panels are dicts or the names of SHARED_PANELS."""
    figure = {"color_by": color_by,
              "panels": [dict(SHARED_PANELS[panel]) if isinstance(panel, str) else panel for panel in panels]}
    return Experiment(figure=figure, **{"quick": TRANSFORMER_QUICK, **fields})


def _before_after(metric):
    """A claim value: the test metric after training minus before (the SFT start) in one seed."""
    def value(runs, configuration):
        after, before = runs[configuration][f"test_{metric}_after"], runs[configuration][f"test_{metric}_before"]
        return None if after is None or before is None else after - before
    return value


def _negated(value):
    return None if value is None else -value


def _minus(first, second):
    return None if first is None or second is None else first - second


def _shrinkage(with_std, without, share=1.0):
    """A claim value from two claim values of one seed: `share` times the first minus the second (how much of
    an effect goes when a cause is removed; None when either is undefined)."""
    def value(runs):
        first, second = with_std(runs), without(runs)
        return None if first is None or second is None else share * first - second
    return value


def _below(value, threshold):
    """A claim value for "at most `threshold`" in a "greater" claim: threshold - value (None stays None), so that
    the interval decides, not a share of the seeds (see claims.GREATER_RULE)."""
    def distance(runs):
        measured = value(runs)
        return None if measured is None else threshold - measured
    return distance


def _both_negative(first, second):
    return None if first is None or second is None else first < 0 and second < 0


def _passk_narrowing():
    default, strong = C({"beta": 0.02}), C({"beta": 0.2})
    change = {metric: _before_after(metric) for metric in ("pass@1", "pass@64", "entropy_per_token",
                                                          "distinct_correct_per_prompt")}
    return _transformer_experiment(
        name="passk-narrowing",
        summary="transformer GRPO from its SFT start: pass@1 up, pass@k at large k down, diversity lost",
        source="Yue et al., 'Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond the "
               "Base Model?', arXiv 2504.13837",
        claim="After RL, pass@1 on test prompts rises while pass@64 falls below the SFT start. The entropy and the "
              "number of distinct correct answers per prompt fall in the same runs: a co-occurrence, measured "
              "together with the fall of pass@64, not a shown cause of it; whether RL's correct answers are among "
              "the SFT start's is not tested. The ablation: with a KL penalty ten times stronger, pass@64 falls "
              "less.",
        configurations=[_transformer({"beta": beta}, beta=beta) for beta in (0.02, 0.2)],
        metrics=["test_pass@1_before", "test_pass@1_after", "test_pass@64_before", "test_pass@64_after",
                 "test_entropy_per_token_after", "test_distinct_correct_per_prompt_after", "kl_reference"],
        curves=("test_success_probability", "entropy"),
        claims=[
            Claim("RL raises pass@1 on the test prompts above the SFT start",
                  lambda runs: change["pass@1"](runs, default),
                  "greater"),
            Claim("RL lowers pass@64 on the test prompts below the SFT start",
                  lambda runs: _negated(change["pass@64"](runs, default)), "greater"),
            Claim("Together with it, the entropy per sampled token and the distinct correct answers per test prompt "
                  "both fall, in at least 9 runs in 10",
                  lambda runs: _both_negative(change["entropy_per_token"](runs, default),
                                              change["distinct_correct_per_prompt"](runs, default)),
                  at_least=MOST_RUNS),
            Claim("The ablation: with beta 0.2 pass@64 falls less than with beta 0.02",
                  lambda runs: _minus(change["pass@64"](runs, strong), change["pass@64"](runs, default)),
                  "greater",
                  note="The stronger penalty changes pass@64 and pass@1 together (a smaller gain in pass@1); "
                       "whether it keeps pass@64 through the entropy or the distinct answers is not tested here."),
        ],
        color_by=["beta"], panels=[
            {"kind": "values", "metrics": ["test_pass@1_before", "test_pass@1_after"], "title": "test pass@1, "
             "SFT start and after RL", "ylabel": "pass@1"},
            {"kind": "values", "metrics": ["test_pass@64_before", "test_pass@64_after"], "title": "test pass@64, "
             "SFT start and after RL", "ylabel": "pass@64"},
            "entropy",
            {"kind": "values", "metrics": ["test_distinct_correct_per_prompt_before",
                                           "test_distinct_correct_per_prompt_after"],
             "title": "distinct correct answers per test prompt, SFT start and after RL",
             "ylabel": "answers (of 64 samples)"}],
        seeds=10,
        seeds_reason="pooled over the seeds from 0 and 100 (effects in standard deviations, 95% power): pass@1 "
                     "rises by 11.7 and the ablation measures 1.73 (6 seeds); pass@64's fall measures 3.05 there "
                     "but 1.65 with the seeds from 1700 (7 seeds), where 5 seeds left two of the claims within "
                     "noise: 10 seeds",
        cost=34.0,
    )


def _rl_generalization():
    run = C({"run": "default"})

    def gains(runs):
        metrics = runs[run]
        return (metrics["final_success_probability"] - metrics["initial_success_probability"],
                metrics["final_test_success_probability"] - metrics["initial_test_success_probability"])

    return _transformer_experiment(
        name="rl-generalization",
        summary="transformer GRPO from its SFT start: exact success on train and on unseen test prompts",
        source="Chu et al., 'SFT Memorizes, RL Generalizes', arXiv 2501.17161 (its RL side only: no SFT arm is run, so "
               "the comparison of SFT with RL that its title makes is not made here)",
        claim="RL only, from the SFT start: how much of what RL gains on the training prompts it keeps on test "
              "prompts. The transformer shares its parameters across prompts: what RL teaches on the training prompts "
              "carries "
              "to prompts it never trained on, since Countdown's test prompts reuse the training prompts' arithmetic. "
              "The claims: the test success rises with the train success, by at least half as much; and a gap between "
              "the two opens as RL fits the training prompts.",
        configurations=[_transformer({"run": "default"}, eval_samples=0)],
        metrics=["initial_success_probability", "final_success_probability", "initial_test_success_probability",
                 "final_test_success_probability", "generalization_gap"],
        curves=("success_probability", "test_success_probability"),
        claims=[
            Claim("The exact success on unseen test prompts rises", lambda runs: gains(runs)[1], "greater"),
            Claim("It rises by at least half the gain on the training prompts (test gain minus half the train gain)",
                  lambda runs: gains(runs)[1] - 0.5 * gains(runs)[0], "greater"),
            Claim("A generalization gap opens: train minus test success is larger at the end than at the start",
                  lambda runs: runs[run]["generalization_gap"] - runs[run]["initial_generalization_gap"],
                  "greater"),
        ],
        color_by=["run"], panels=[
            {"kind": "curves", "columns": ["success_probability"], "title": "exact success, train prompts",
             "ylabel": "p(correct)"},
            "test success",
            {"kind": "values", "metrics": ["generalization_gap"], "title": "train minus test success at the end",
             "ylabel": "difference"}],
        seeds=24,
        seeds_reason="pooled over the seeds from 0, 100, 1300 and 1500 (effects in standard deviations, 95% power): "
                     "the opening gap measures 0.77, which needs 24 seeds (it was within noise at 5 on two of the "
                     "four sets); the test gain (6.6 on seeds 0-4) needs far fewer",
        cost=32.0,
    )


def _clip_higher_entropy():
    losses = ((({"loss": "grpo", "epsilon_high": 0.2}), {}), ({"loss": "grpo", "epsilon_high": 0.28},
              {"epsilon_high": 0.28}), ({"loss": "cispo", "epsilon_high": 5.0}, {"algorithm": "cispo"}))
    low, high, cispo = (C(label) for label, _ in losses)
    return _transformer_experiment(
        name="clip-higher-entropy",
        summary="transformer: eps_high 0.2 vs 0.28 (and CISPO) at 4 updates per batch, entropy and pass@k",
        source="DAPO, arXiv 2503.14476, sec. 3.1 (clip-higher); MiniMax-M1 (CISPO), arXiv 2506.13585",
        claim="DAPO's argument: a symmetric clip zeroes the gradient of a low-probability token with A > 0 once its "
              "ratio passes 1.2, so rare good tokens stop gaining and the entropy collapses; a higher upper bound "
              "(0.28) lets them grow, and CISPO zeroes no gradient at all. With 4 updates per batch the clip binds "
              "(the first claim checks it); whether the entropy and pass@16 follow on a model this small, over 5 "
              "seeds, is what the other claims test.",
        configurations=[_transformer(label, updates_per_batch=4, steps=60, eval_samples=32, **options)
                        for label, options in losses],
        metrics=["entropy_last", "clip_fraction", "final_test_success_probability", "test_pass@16_after",
                 "test_distinct_correct_per_prompt_after"],
        curves=("entropy", "test_success_probability"),
        claims=[
            Check("The mechanism is at work: the clip zeroes some gradients at eps_high 0.2 (mean clip fraction "
                  "above 0.005)", lambda runs: runs[low]["clip_fraction"] > 0.005),
            Claim("eps_high 0.28 ends with a higher entropy than 0.2", difference("entropy_last", high, low),
                  "greater"),
            Claim("eps_high 0.28 ends with a higher test pass@16 than 0.2",
                  difference("test_pass@16_after", high, low), "greater"),
            Claim("CISPO ends with a higher entropy than GRPO at eps_high 0.2", difference("entropy_last", cispo, low),
                  "greater"),
        ],
        color_by=["loss", "epsilon_high"], panels=[
            "entropy",
            {"kind": "values", "metrics": ["clip_fraction"], "title": "share of gradients the clip zeroes",
             "ylabel": "clip fraction"},
            {"kind": "values", "metrics": ["test_pass@16_after"], "title": "test pass@16 after RL",
             "ylabel": "pass@16"},
            "test success"],
        seeds=11,
        seeds_reason="pooled over the seeds from 0, 100, 1300 and 1500 (effects in standard deviations, 95% power): "
                     "CISPO's entropy over GRPO's measures 1.17, which needs 11 seeds (8 had been chosen from 1.46 "
                     "over seeds 0-4, 100-104 and 500-504); eps_high's entropy and pass@16 gaps measure 0.36 and "
                     "0.10, which no affordable count separates (they stay within noise)",
        cost=22.0,
    )


def _length_growth():
    configurations = [({"reduction": reduction, "overlong": False}, {"reduction": reduction})
                      for reduction in REDUCTIONS] + [
        ({"reduction": "sequence", "overlong": True}, {"overlong_penalty": 2})]
    sequence, token, constant, shaped = (C(label) for label, _ in configurations)
    return _transformer_experiment(
        name="length-growth",
        summary="transformer: length of wrong answers at the end under sequence-mean, token-mean and constant "
                "reductions (a comparison between reductions, not a growth over the run)",
        source="Dr. GRPO, arXiv 2503.20783, sec. 3.1 (length bias); DAPO, arXiv 2503.14476, sec. 3.4 (overlong "
               "shaping)",
        claim="Dividing each response's loss by its own length lets a long wrong answer lose less per token than a "
              "short one, so under the per-sequence mean wrong answers should end longer than under the token mean "
              "or a constant; DAPO's soft overlong penalty pushes responses back under the cap. What is measured is "
              "the length of the wrong answers over the last 10 iterations, compared between reductions. Over the run "
              "the lengths barely move (a few tenths of a token from the first 10 iterations to the last, against "
              "a cap of 8), so the experiment's name says more than it measures: a growth over the run needs a task "
              "where longer answers help.",
        configurations=[_transformer(label, steps=60, eval_samples=0, **options) for label, options in configurations],
        metrics=["mean_wrong_length_tail", "mean_correct_length_tail", "final_test_success_probability"],
        curves=("mean_wrong_length", "mean_correct_length"),
        claims=[
            Claim("Wrong answers end longer under the sequence mean than under the token mean",
                  difference("mean_wrong_length_tail", sequence, token), "greater"),
            Claim("Wrong answers end longer under the sequence mean than under the constant",
                  difference("mean_wrong_length_tail", sequence, constant), "greater"),
            Claim("The overlong penalty (cache 2) shortens wrong answers under the sequence mean",
                  difference("mean_wrong_length_tail", sequence, shaped), "greater"),
        ],
        color_by=["reduction", "overlong"], panels=[
            {"kind": "curves", "columns": ["mean_wrong_length"], "title": "length of the wrong answers of each batch",
             "ylabel": "tokens (EOS included)"},
            {"kind": "values", "metrics": ["mean_wrong_length_tail"], "title": "wrong answers, last 10 iterations",
             "ylabel": "tokens"},
            {"kind": "values", "metrics": ["mean_correct_length_tail"], "title": "correct answers, last 10 iterations",
             "ylabel": "tokens"},
            "final test success"],
        seeds=7,
        seeds_reason="pooled over seeds 0-4, 100-104 and 500-504 (effects in standard deviations, 95% power): the "
                     "gaps measure 1.49 to 4.2; 1.49 (sequence mean against the constant) needs 7 seeds",
        cost=12.0,
    )


def _precision_mismatch():
    configurations = [({"sampler": "float32", "tis": False}, {}),
                      ({"sampler": "float16", "tis": False}, {"sampler_dtype": "float16"}),
                      ({"sampler": "bfloat16", "tis": False}, {"sampler_dtype": "bfloat16"}),
                      ({"sampler": "bfloat16", "tis": True}, {"sampler_dtype": "bfloat16", "tis_cap": 2.0})]
    fp32, fp16, bf16, bf16_tis = (C(label) for label, _ in configurations)
    return _transformer_experiment(
        name="precision-mismatch",
        summary="transformer: a bfloat16 or float16 sampler against the float32 trainer, with TIS",
        source="Yao et al. 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy RL Training'; IMPALA "
               "(truncated importance weights), arXiv 1802.01561",
        claim="An inference engine samples in a lower precision than the trainer scores in, so the two disagree on "
              "the log-prob of the very tokens drawn: bfloat16 (8-bit mantissa) far more than float16 (11-bit). The "
              "mismatch is measured token by token; the claims ask whether, at this size and learning rate, it "
              "changes what the run learns, and whether TIS does.",
        configurations=[_transformer(label, steps=60, eval_samples=0, **options) for label, options in configurations],
        metrics=["sampler_logp_diff_mean", "sampler_logp_diff_max", "sampler_kl", "final_test_success_probability"],
        curves=("test_success_probability",),
        claims=[
            Check("The mismatch orders by precision: bfloat16 > float16 > float32 in mean |log p_sampler - "
                  "log p_trainer| per token", lambda runs: runs[bf16]["sampler_logp_diff_mean"]
                  > runs[fp16]["sampler_logp_diff_mean"] > runs[fp32]["sampler_logp_diff_mean"]),
            Claim("A bfloat16 sampler ends within 0.05 of the float32 sampler's test success",
                  difference("final_test_success_probability", bf16, fp32), "within", margin=0.05),
            Claim("TIS (cap 2) on a bfloat16 sampler changes the final test success by less than 0.05",
                  difference("final_test_success_probability", bf16_tis, bf16), "within", margin=0.05),
        ],
        color_by=["sampler", "tis"], panels=[
            {"kind": "values", "metrics": ["sampler_logp_diff_mean"], "title": "mean |log p sampler - log p trainer|",
             "ylabel": "nats per token"},
            {"kind": "values", "metrics": ["sampler_logp_diff_max"], "title": "largest |log p sampler - log p "
             "trainer| of a batch", "ylabel": "nats"},
            "test success",
            "final test success"],
        seeds=8,
        seeds_reason="the ordering is a property of the number formats; an equivalence inside +-0.05 needs about "
                     "(1.96 + 1.645)^2 sd^2 / (0.05 - |mean|)^2 seeds: pooled over seeds 0-4, 100-104 and 500-504 "
                     "(effects in standard deviations, 95% power) that is 4 for both, and 5 seeds left one or the "
                     "other within noise on one of three sets, so 8 (a t-interval narrower by a third)",
        cost=14.0,
    )


def _kl_placement():
    with_std = [({"kl": "k3 in the loss", "beta": 0.02}, {}),
                ({"kl": "k1 in the loss", "beta": 0.02}, {"kl_estimator": "k1"}),
                ({"kl": "k1 in the reward", "beta": 0.02}, {"kl_in": "reward", "kl_estimator": "k1"}),
                ({"kl": "none", "beta": 0.0}, {"beta": 0.0}),
                ({"kl": "k3 in the loss", "beta": 0.2}, {"beta": 0.2})]
    # the ablation of the std: the placements it compares, with the advantages left undivided (Dr. GRPO's)
    without_std = [({"kl": "k3 in the loss", "beta": 0.02}, {"scale_rewards": "none"}),
                   ({"kl": "k1 in the reward", "beta": 0.02},
                    {"kl_in": "reward", "kl_estimator": "k1", "scale_rewards": "none"}),
                   ({"kl": "none", "beta": 0.0}, {"beta": 0.0, "scale_rewards": "none"})]
    configurations = ([({**label, "scale_rewards": "group"}, options) for label, options in with_std]
                      + [({**label, "scale_rewards": "none"}, options) for label, options in without_std])
    k3, k1_loss, k1_reward, none, k3_strong, k3_bare, k1_reward_bare, none_bare = (
        C(label) for label, _ in configurations)
    gap, gap_bare = difference("kl_reference", k3, k1_reward), difference("kl_reference", k3_bare, k1_reward_bare)
    pull, pull_bare = difference("kl_reference", none, k1_reward), difference("kl_reference", none_bare, k1_reward_bare)
    return _transformer_experiment(
        name="kl-placement",
        summary="transformer: the KL to the SFT start as k3 or k1 in the loss, k1 in the reward, or none; with and "
                "without the group's std",
        source="Schulman, 'Approximating KL Divergence' (2020); Tang and Munos, arXiv 2506.09477; TRL's RLOO and "
               "verl's use_kl_in_reward (KL in the reward), GRPO's k3 in the loss (DeepSeekMath, arXiv 2402.03300); "
               "Shah et al., arXiv 2512.21852; Zhang et al. (RPG), arXiv 2505.17508; Liu et al. (Dr. GRPO, no std), "
               "arXiv 2503.20783",
        claim="Where the KL penalty goes decides how hard it pulls. As a loss term, k3's expected gradient pulls the "
              "policy toward the reference with weight beta per response (the sequence mean), while k1's expected "
              "gradient is near zero (exactly zero only on-policy with weights that do not depend on the length; the "
              "sequence mean's 1/|y| does). Per-token loss terms give a partial gradient of the sequence KL; the KL "
              "in the reward gives the exact one. Subtracted from the reward, beta times the KL summed over the "
              "response's tokens enters the advantages, which divide by the group's reward std: at the same beta it "
              "ends nearer the reference than k3 in the loss. The stated cause is that division: where a group's "
              "answers differ, the std of its 0/1 rewards is at most 0.5, which multiplies the KL part by 2 or more; "
              "where they all score alike, the std is the KL part's own spread, and the KL alone sets advantages of "
              "size about 1. The loss term keeps its beta. The ablation runs the same placements without the std "
              "(scale_rewards none): there the gap between k1 in the reward and k3 in the loss must shrink, most of "
              "it vanish. Measured as each run's KL to the reference at the end; a second ablation raises the loss's "
              "beta tenfold.",
        configurations=[_transformer(label, steps=60, eval_samples=0, **options) for label, options in configurations],
        metrics=["kl_reference", "final_test_success_probability", "entropy_last"],
        curves=("kl_reference",),
        claims=[
            Claim("k3 in the loss (beta 0.02) keeps the policy closer to the reference than no KL",
                  difference("kl_reference", none, k3), "greater"),
            Claim("k1 in the loss ends as far from the reference as no KL (within 0.3 nats)",
                  difference("kl_reference", k1_loss, none), "within", margin=0.3,
                  note="On one draw from the current policy E[grad k1] = 0; under the sequence mean the weight "
                       "1/|y| depends on the length, so it is near 0 rather than exactly 0, and mostly its noise "
                       "acts."),
            Claim("k1 in the reward (beta 0.02) keeps the policy closer to the reference than no KL", pull, "greater",
                  note="How far it holds the policy; why is the ablation without the std below."),
            Claim("The ablation: k3 in the loss at beta 0.2 keeps the policy closer to the reference than no KL",
                  difference("kl_reference", none, k3_strong), "greater",
                  note="If it holds where beta 0.02 does not, the loss term's weight was too small to show, not "
                       "its direction wrong."),
            Claim("With the group's std, k1 in the reward ends nearer the reference than k3 in the loss (both beta "
                  "0.02)", gap, "greater"),
            Claim("The ablation of the std: without it, that gap (KL of k3 in the loss minus KL of k1 in the reward) "
                  "shrinks", _shrinkage(gap, gap_bare), "greater",
                  note="The value is the gap with the std minus the gap without it, per seed. If it does not hold, the "
                       "division by the std is not what makes the reward placement pull harder."),
            Claim("Without the std, more than half of that gap vanishes", _shrinkage(gap, gap_bare, share=0.5),
                  "greater", note="The value is half the gap with the std minus the gap without it, per seed."),
            Claim("Without the std, the pull of k1 in the reward (no KL minus k1 in the reward) is smaller than with "
                  "it", _shrinkage(pull, pull_bare), "greater",
                  note="Each pull is measured against the run with no KL at the same scaling, so whatever the std "
                       "does to the verifier's part of the reward alone cancels."),
            Claim("Without the std, k1 in the reward still keeps the policy closer to the reference than no KL",
                  pull_bare, "greater",
                  note="A run outside the atlas measured this pull at 0.17 nats, not significant at its seeds; at 24 "
                       "seeds it holds on both committed sets (0.35 and 0.24 nats): a smaller pull that survives "
                       "without the division, against 0.59 and 0.54 with it."),
        ],
        color_by=["kl", "beta", "scale_rewards"], panels=[
            {"kind": "curves", "columns": ["kl_reference"], "title": "KL(policy ‖ reference), estimated each batch",
             "ylabel": "nats per response"},
            {"kind": "values", "metrics": ["kl_reference"], "title": "KL to the reference at the end",
             "ylabel": "nats per response"},
            "final test success"],
        seeds=24,
        seeds_reason="pooled over the seeds from 0 and 100 (effects in standard deviations, 95% power): the KL in "
                     "the reward and at beta 0.2 pull by 2.0 and 3.7, the std's gap and its ablation by 1.2 to 1.6 "
                     "(8 to 11 seeds), the pull's shrinkage by 0.96 (16), k1's equivalence inside 0.3 nats (mean "
                     "+0.02, sd 0.29) needs 17, and k3 in the loss at beta 0.02 measures 0.79 (0.72 with the seeds "
                     "from 1700), which needs 23-27: 24 seeds, where 10 left three claims within noise on the "
                     "seeds from 1700; the pull of k1 in the reward without the std (0.64) would need 34",
        cost=8.0,
    )


def _padding_bug():
    right, bug = C({"position_ids": "mask"}), C({"position_ids": "arange"})
    return _transformer_experiment(
        name="padding-bug",
        summary="transformer: position ids from the attention mask vs arange on left-padded prompts",
        source="the article, sec. 7.2 (attention mask vs loss mask, left padding); Hugging Face transformers' "
               "position_ids from the attention mask in generation",
        claim="Left padding shifts a short prompt's tokens right; position ids computed from the attention mask "
              "(cumsum - 1) give its first real token position 0, as the sampler does, while arange 0..T-1 gives it "
              "position 1 or more. With arange the trainer scores the padded prompts' responses with other log-probs "
              "than the sampler drew them from: a sampler/trainer mismatch made by a bug. Countdown prompts differ in "
              "length by one token (a one- or two-digit target), so about a third of the prompts are padded.",
        configurations=[_transformer({"position_ids": value}, position_ids=value, steps=60, eval_samples=0)
                        for value in ("mask", "arange")],
        metrics=["first_batch_logp_diff_max", "sampler_logp_diff_mean", "final_test_success_probability",
                 "kl_reference"],
        curves=("test_success_probability",),
        claims=[
            Check("With mask positions the trainer scores the sampled tokens as the sampler drew them (largest "
                  "|difference| below 1e-4 in the first batch)", lambda runs: runs[right]["first_batch_logp_diff_max"]
                  < 1e-4),
            Check("With arange positions it does not: the largest |difference| in the first batch exceeds 0.01 nats",
                  lambda runs: runs[bug]["first_batch_logp_diff_max"] > 0.01),
            Claim("The bug costs test success at the end", difference("final_test_success_probability", right, bug),
                  "greater"),
        ],
        color_by=["position_ids"], panels=[
            {"kind": "values", "metrics": ["first_batch_logp_diff_max"], "title": "largest |log p sampler - log p "
             "trainer|, first batch", "ylabel": "nats"},
            "test success",
            "final test success"],
        seeds_reason="the mismatch is a property of the code; its cost in success measures 8.4 on seeds 0-4, over the "
                     "1.24 that 5 seeds separate",
        cost=12.0,
    )


KL_OPTIMUM_BETAS = (0.1, 0.3)  # where KL(forward optimum || pi*) is 0.37 and 0.10 nats: far apart against the jitter
KL_OPTIMUM_GRADIENT_TOLERANCE = 1e-9  # float64 closed forms: their gradients are rounding, about 1e-16


def _kl_optimum():
    placements = ("k1-reward", "k3-loss", "k3-is-loss")
    algorithms = {"ppo": {}, "grpo": {"scale_rewards": "none"}}

    def name(algorithm, placement, beta):
        return C({"algorithm": algorithm, "kl": placement, "beta": beta})

    def every(placement, test):  # one seed: the test holds at every algorithm and beta
        return lambda runs: all(test(runs[name(algorithm, placement, beta)]) for algorithm in algorithms
                                for beta in KL_OPTIMUM_BETAS)

    return Experiment(
        name="kl-optimum",
        summary="bandit: the KL as k1 in the reward, k3 in the loss or IS-corrected k3, against the exact optima",
        source="Schulman, 'Approximating KL Divergence' (2020); Tang and Munos, arXiv 2506.09477 (k3's gradient is "
               "the forward KL's); Rafailov et al. (DPO), arXiv 2305.18290, eq. 4 (pi* = ref exp(R / beta) / Z); "
               "DeepSeek-V3.2, arXiv 2512.02556 (k3 weighted by pi / pi_old)",
        claim="The KL-regularized objective E[R] - beta KL(pi || ref) has the closed-form optimum pi* proportional "
              "to ref * exp(R / beta). PPO and GRPO with k1 = log pi_old - log ref subtracted from the reward "
              "converge to it: at pi* the shaped reward is the same for every action, so every advantage is 0. "
              "With k3 in the loss they converge elsewhere, because for a softmax policy sampled on-policy "
              "E_{a~pi}[grad k3] = E[(1 - ref / pi) grad log pi] = pi - ref on the logits, the gradient of the "
              "forward KL(ref || pi): the run maximizes E[R] - beta KL(ref || pi), whose optimum p(a) = beta ref(a) "
              "/ (mu - R(a)) keeps mass on every action. The ablation removes the cause: k3 weighted by "
              "pi / pi_old has the expected gradient of KL(pi || ref), so that run must end near pi* again. "
              "Distances are exact (the mean over the 4 contexts of KL(pi || target)), averaged over the last 10 "
              "of 150 iterations; GRPO runs without the std (scale_rewards none), whose division would change "
              "the effective beta of a loss term with the policy's own reward spread.",
        configurations=[({"algorithm": algorithm, "kl": placement, "beta": beta}, "run_kl_optimum",
                         {"algorithm": algorithm, "kl_placement": placement, "beta": beta, **options})
                        for algorithm, options in algorithms.items() for beta in KL_OPTIMUM_BETAS
                        for placement in placements],
        metrics=["kl_to_optimum", "kl_to_forward_optimum", "tv_to_optimum", "tv_to_forward_optimum", "targets_kl",
                 "final_expected_reward", "final_kl_reference"],
        curves=("kl_to_optimum", "kl_to_forward_optimum"),
        claims=[
            Check(f"The closed forms are the optima: the exact gradient of each objective at its closed form is "
                  f"below {KL_OPTIMUM_GRADIENT_TOLERANCE:g} (pi* for the reverse KL, p = beta ref / (mu - R) for "
                  "the forward KL), at both betas",
                  lambda _: kl_optimum_gradient(KL_OPTIMUM_BETAS) < KL_OPTIMUM_GRADIENT_TOLERANCE, "exact"),
            Claim("k1 in the reward converges to pi*: KL(pi || pi*) ends below a tenth of the two optima's distance "
                  "KL(forward optimum || pi*), for PPO and GRPO at both betas",
                  every("k1-reward", lambda run: run["kl_to_optimum"] < 0.1 * run["targets_kl"])),
            Claim("k3 in the loss does not reach pi*: KL(pi || pi*) ends above half the two optima's distance, for "
                  "PPO and GRPO at both betas",
                  every("k3-loss", lambda run: run["kl_to_optimum"] > 0.5 * run["targets_kl"])),
            Claim("The cause: k3 in the loss ends nearer the forward-KL optimum than pi* (KL(pi || pi*) - KL(pi || "
                  "forward optimum) above 0), for PPO and GRPO at both betas",
                  every("k3-loss", lambda run: run["nearer_forward_optimum"] > 0),
                  note="GRPO's forward optimum is at beta * G / (G - 1): its group mean holds the answer itself, "
                       "so the policy term's expected gradient is (G - 1) / G of the exact one while the loss "
                       "term's is not scaled."),
            Claim("The ablation, the cause removed: k3 weighted by pi / pi_old (expected gradient that of KL(pi || "
                  "ref)) ends nearer pi* than the forward optimum, for PPO and GRPO at both betas",
                  every("k3-is-loss", lambda run: run["nearer_forward_optimum"] < 0),
                  note="If the distance to pi* came from k3's noise or its bias on samples from pi_old rather than "
                       "from the direction of its expected gradient, this run would stay away from pi* too."),
        ],
        figure={"color_by": ["kl"], "panels": [panel for beta, algorithm in zip(KL_OPTIMUM_BETAS, ("grpo", "ppo"))
                                               for panel in (
            {"kind": "values", "metrics": ["kl_to_optimum"], "where": {"beta": beta},
             "title": f"beta {beta}: distance to pi* at the end", "ylabel": "KL(pi ‖ pi*), nats"},
            {"kind": "values", "metrics": ["kl_to_forward_optimum"], "where": {"beta": beta},
             "title": f"beta {beta}: distance to the forward-KL optimum", "ylabel": "KL(pi ‖ forward optimum), nats"},
            {"kind": "curves", "columns": ["kl_to_optimum"], "where": {"algorithm": algorithm, "beta": beta},
             "title": f"{algorithm.upper()}, beta {beta}: distance to pi* over the run",
             "ylabel": "KL(pi ‖ pi*), nats", "log": True})]},
        seeds_reason="a first seed put the runs' distances to the two optima 0.05-0.37 nats apart, against a "
                     "seed-to-seed spread below 0.005 nats: each claim counts every seed, and 5 cannot miss an "
                     "effect that size by chance",
        cost=1.7,
    )


ENTROPY_STEPS = 40  # the table's entropy falls from ln 3 to about 0.03 nats in 40 iterations: the fall, not the floor
CUT_FRACTION = 0.2  # the ablation's share of kept tokens whose gradient is cut (Clip-Cov's own default cuts one token)


def _entropy_mechanism():
    losses = [({"loss": "grpo"}, {}),
              ({"loss": "grpo eps_high 0.28"}, {"epsilon_high": 0.28}),
              ({"loss": "clip-cov"}, {"algorithm": "clip-cov"}),
              ({"loss": "kl-cov"}, {"algorithm": "kl-cov"}),
              ({"loss": "cut 20% with cov > 0"}, {"algorithm": "clip-cov", "cov_fraction": CUT_FRACTION,
                                                  "cov_low": 0.0, "cov_high": 1e6}),
              ({"loss": "cut 20% at random"}, {"algorithm": "clip-cov", "cov_fraction": CUT_FRACTION,
                                               "cov_low": -1e6, "cov_high": 1e6})]
    grpo, high, clip_cov, kl_cov, cut_positive, cut_random = (C(label) for label, _ in losses)
    return Experiment(
        name="entropy-mechanism",
        summary="table policy: Cov(log pi, A) per batch against the entropy change; Clip-Cov, KL-Cov, clip-higher",
        source="Cui et al. 2025, 'The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models', "
               "arXiv 2505.22617 (the covariance, Clip-Cov, KL-Cov); DAPO, arXiv 2503.14476, sec. 3.1 (clip-higher)",
        claim="For a softmax policy the first-order change of a state's entropy under an update dz of its logits is "
              "-Cov_{a~pi}(log pi(a), dz(a)); a policy-gradient step (dz = lr pi A) makes it -lr Cov(log pi, pi A), "
              "a natural-gradient step (dz = lr A) -lr Cov(log pi, A): confident tokens with a positive advantage "
              "lower the entropy. The paper tracks Cov(log pi, A) over a batch's tokens. The lab's optimizer is Adam "
              "with a clipped gradient norm, which is neither, so the run measures three predictions per iteration "
              "on the batch's kept tokens: the paper's -Cov(log pi, A), the plain-gradient form -Cov(log pi, pi A), "
              "and the first-order change of the update Adam made, each against the exactly measured change of the "
              "entropy at those tokens' states. The table policy (online_tokens, 40 iterations) because every "
              "state's distribution is at hand and a run takes a second; the transformer's budget does not allow "
              "36 seeds of 6 losses. Clip-Cov (its defaults cut 1 token a batch) and KL-Cov should lower the "
              "covariance and slow the entropy's fall, and so should clip-higher. The ablation cuts the gradient of "
              "20% of the tokens, all of positive covariance (the cause removed: the fall must not be faster than "
              "GRPO's), against 20% at random (the cause kept).",
        configurations=[(label, "run_entropy_mechanism", {"steps": ENTROPY_STEPS, **options})
                        for label, options in losses],
        metrics=["covariance_sign_agreement", "covariance_correlation", "covariance_pg_correlation",
                 "first_order_change_correlation", "covariance_mean", "entropy_change_mean", "entropy_mean",
                 "entropy_last", "clip_fraction", "final_success_probability"],
        curves=("entropy", "covariance", "entropy_change", "first_order_change"),
        claims=[
            Claim("The paper's prediction -Cov(log pi, A) and the measured entropy change agree in sign in most "
                  "iterations under GRPO (the share of iterations that agree, minus a half)",
                  lambda runs: runs[grpo]["covariance_sign_agreement"] - 0.5, "greater"),
            Claim("... and correlate over the iterations (Pearson's r above 0)",
                  lambda runs: runs[grpo]["covariance_correlation"], "greater"),
            Check("The first-order change of the update Adam made tracks the measured change (r above 0.9, every "
                  "seed): the expansion holds at this step size",
                  lambda runs: runs[grpo]["first_order_change_correlation"] > 0.9),
            Claim("Of the two closed forms the plain-gradient one, -Cov(log pi, pi A), correlates better with the "
                  "measured change than the paper's natural-gradient one",
                  lambda runs: runs[grpo]["covariance_pg_correlation"] - runs[grpo]["covariance_correlation"],
                  "greater",
                  note="Adam's step is neither lr pi A nor lr A; the claim asks which form it resembles here."),
            Claim("Clip-Cov lowers the covariance term against GRPO (Cov(log pi, A), mean over the run)",
                  difference("covariance_mean", grpo, clip_cov), "greater"),
            Claim("KL-Cov lowers the covariance term against GRPO",
                  difference("covariance_mean", grpo, kl_cov), "greater"),
            Claim("Clip-Cov slows the entropy's fall: a higher batch entropy averaged over the run than GRPO",
                  difference("entropy_mean", clip_cov, grpo), "greater"),
            Claim("KL-Cov slows the entropy's fall against GRPO", difference("entropy_mean", kl_cov, grpo),
                  "greater"),
            Claim("Clip-higher (eps_high 0.28) slows the entropy's fall against GRPO",
                  difference("entropy_mean", high, grpo), "greater",
                  note="It can only act where the clip binds: clip_fraction in the table says how often it does."),
            Claim("The ablation, the cause removed: cutting the gradient of 20% of the tokens, all of positive "
                  "covariance, keeps more entropy than GRPO (it must not lose it faster)",
                  difference("entropy_mean", cut_positive, grpo), "greater"),
            Claim("... and more than cutting as many tokens at random (the cause kept)",
                  difference("entropy_mean", cut_positive, cut_random), "greater",
                  note="If cutting any 20% of the gradient slowed the fall as much, the covariance would not be "
                       "what sets it."),
        ],
        figure={"color_by": ["loss"], "panels": [
            {"kind": "curves", "columns": ["entropy"], "title": "entropy of the sampled tokens' distributions",
             "ylabel": "nats per token", "log": True},
            {"kind": "curves", "columns": ["covariance"], "title": "Cov(log pi, A) over each batch's tokens",
             "ylabel": "nats x advantage"},
            {"kind": "values", "metrics": ["entropy_mean"], "title": "entropy averaged over the run",
             "ylabel": "nats per token"},
            {"kind": "values", "metrics": ["covariance_correlation", "covariance_pg_correlation",
                                           "first_order_change_correlation"], "where": {"loss": "grpo"},
             "title": "GRPO: each prediction's correlation with the measured entropy change",
             "ylabel": "Pearson's r over iterations"}]},
        seeds=45,
        seeds_reason="on a first seed the losses' run-mean entropies differed by 0.01-0.08 nats with paired "
                     "differences of either sign, so 20 (an effect of 0.66 separated); seeds 0-19 and 100-119 pooled "
                     "then measured the random-cut control at 0.63, within noise on one set and holding on the other: "
                     "it needs about 34 for the 95% power that keeps a verdict on another seed set, so 36; over 36 "
                     "seeds from each of 0, 100 and 1300 it measures 0.55 (within noise on one, holds on two), which "
                     "needs (1.96 + 1.645)^2 / 0.55^2 + 1 = 44 seeds, so 45",
        cost=1.0,
    )


def _dpo_displacement():
    pairs = ("first", "nearest", "farthest")
    first, nearest, farthest = (C({"rejected": choice}) for choice in pairs)

    def falls_while_margin_grows(configuration):
        def value(runs):  # a run without a pair in its last iterations (none tied at full size) shows nothing
            margin, change = runs[configuration]["margin_tail"], runs[configuration]["chosen_logp_change_tail"]
            return margin is not None and change is not None and margin > 0 and change < 0
        return value

    def closer(runs):
        near, far = runs[nearest]["pair_distance_tail"], runs[farthest]["pair_distance_tail"]
        return near is not None and far is not None and near < far

    return _transformer_experiment(
        name="dpo-displacement",
        summary="transformer offline DPO: the chosen answers' log-prob falls while the margin grows; pair similarity",
        source="Razin et al., 'Unintentional Unalignment: Likelihood Displacement in Direct Preference "
               "Optimization', arXiv 2410.08847; RPO (Pang et al., arXiv 2404.19733) for the SFT-term remedy",
        claim="DPO raises the margin between the chosen and the rejected response, not the chosen one's likelihood: "
              "both can fall, the rejected faster, so the chosen response ends less likely than at the start "
              "(likelihood displacement). The paper's cause: pairs whose chosen and rejected are similar (their "
              "hidden embeddings align) displace the most. In the lab: offline pairs (sampled from the SFT start), "
              "per prompt the first correct response against one of the wrong ones, either the first wrong one "
              "(the lab's pairs), the nearest to the chosen (fewest token positions that differ) or the farthest "
              "(--dpo-rejected). The log-probs are measured on each batch's pairs after its update, against the "
              "SFT start on the same responses. The known remedy, an SFT term on the chosen (RPO), is not run: the "
              "lab's preference losses have no such term.",
        configurations=[_transformer({"rejected": choice}, runner="run_dpo_displacement", offline=True,
                                     dpo_rejected=choice, steps=25, eval_samples=0) for choice in pairs],
        metrics=["chosen_logp_change_tail", "rejected_logp_change_tail", "margin_tail", "chosen_logp_tail",
                 "pair_distance_tail", "final_test_success_probability"],
        quick=DPO_QUICK,
        curves=("chosen_logp_change", "rejected_logp_change", "margin", "pair_distance"),
        claims=[
            Claim("With the lab's pairs, the margin grows (above 0, last 10 iterations) while the chosen responses' "
                  "log-prob falls below the SFT start's, in most seeds", falls_while_margin_grows(first),
                  at_least=0.8),
            Check("The ablation's switch does what it says: the nearest pairs differ in fewer token positions than "
                  "the farthest", closer,
                  note="A property of the pairs (a check of --dpo-rejected), not an RL effect."),
            Claim("The stated cause, removed: pairs that differ in more tokens displace less (the chosen log-prob "
                  "change, farthest minus nearest, above 0)",
                  difference("chosen_logp_change_tail", farthest, nearest), "greater",
                  note="The paper measures similarity on hidden embeddings; the lab's proxy is the count of "
                       "differing tokens. The farther pairs also gain the larger margin (margin_tail in the table): "
                       "this ablation does not hold fixed how far DPO moves a pair, and a claim per nat of margin "
                       "would need runs of its own."),
            Claim("The stated cause, kept: with the nearest pairs the chosen log-prob still falls below its start "
                  "while the margin grows, in most seeds", falls_while_margin_grows(nearest), at_least=0.8),
        ],
        color_by=["rejected"], panels=[
            {"kind": "curves", "columns": ["chosen_logp_change"], "title": "chosen responses: log-prob minus the "
             "SFT start's", "ylabel": "nats per response"},
            {"kind": "curves", "columns": ["margin"], "title": "the margin: chosen minus rejected change",
             "ylabel": "nats per pair"},
            {"kind": "values", "metrics": ["chosen_logp_change_tail"], "title": "chosen log-prob change, last 10 "
             "iterations", "ylabel": "nats per response"},
            {"kind": "values", "metrics": ["pair_distance_tail"], "title": "token positions in which a pair differs",
             "ylabel": "positions (of 8)"}],
        seeds=13,
        seeds_reason="10 were chosen before the runs for the ablation, whose paired difference of two runs is "
                     "noisier than the displacement (1 to 2 nats on seed 0); pooled over seeds 0-9, 100-109 and "
                     "500-509 (effects in standard deviations, 95% power) it measures 1.06, which needs 13",
        cost=5.0,
    )


def _negative_samples():
    def name(sign, beta=0.02):
        return C({"advantage_sign": sign, "beta": beta})

    both, positive, negative = name("both"), name("positive"), name("negative")
    strong = {sign: name(sign, 1.0) for sign in ("positive", "negative")}
    change = {metric: _before_after(metric) for metric in ("pass@1", "pass@16", "entropy_per_token",
                                                          "distinct_correct_per_prompt")}

    def gap(runs, beta):  # NSR's pass@16 after RL minus PSR's, at one KL beta
        return _minus(runs[name("negative", beta)]["test_pass@16_after"],
                      runs[name("positive", beta)]["test_pass@16_after"])

    def more_diverse(runs):  # None without a sampled evaluation (--quick)
        nsr, psr = runs[negative], runs[positive]
        entropy = _minus(nsr["test_entropy_per_token_after"], psr["test_entropy_per_token_after"])
        distinct = _minus(nsr["test_distinct_correct_per_prompt_after"], psr["test_distinct_correct_per_prompt_after"])
        return None if entropy is None or distinct is None else entropy > 0 and distinct > 0

    configurations = [({"advantage_sign": sign, "beta": beta}, {"advantage_sign": sign, "beta": beta})
                      for beta, signs in ((0.02, ("both", "positive", "negative")), (1.0, ("positive", "negative")))
                      for sign in signs]
    return _transformer_experiment(
        name="negative-samples",
        summary="transformer GRPO from its SFT start on A < 0 only (NSR), A > 0 only (PSR) or both: pass@1, pass@16",
        source="Zhu et al., 'The Surprising Effectiveness of Negative Reinforcement in LLM Reasoning', "
               "arXiv 2506.01347",
        claim="Training only on the responses with A > 0 (positive sample reinforcement, PSR) sharpens the policy: "
              "pass@1 rises and pass@k at large k falls below the start. Training only on those with A < 0 (NSR) "
              "pushes the wrong answers' probability to the model's other candidates in proportion to its prior, so "
              "it keeps the diversity and pass@k at large k. Here (Countdown, 30 iterations from the SFT start, 32 "
              "test samples per prompt) large k is 16; --advantage-sign zeroes the other sign's advantages, the KL "
              "penalty stays on every token. The cause is measured by the entropy per token and the distinct "
              "correct answers per test prompt; the ablation: at KL beta 1 the policy stays near its start, and "
              "NSR's pass@16 advantage over PSR must shrink.",
        configurations=[_transformer(label, steps=30, eval_samples=32, **options)
                        for label, options in configurations],
        metrics=["test_pass@1_before", "test_pass@1_after", "test_pass@16_before", "test_pass@16_after",
                 "test_entropy_per_token_before", "test_entropy_per_token_after",
                 "test_distinct_correct_per_prompt_before", "test_distinct_correct_per_prompt_after", "kl_reference",
                 "final_test_success_probability"],
        curves=("test_success_probability", "entropy"),
        claims=[
            Claim("PSR raises pass@1 on the test prompts above the SFT start",
                  lambda runs: change["pass@1"](runs, positive), "greater"),
            Claim("PSR lowers pass@16 on the test prompts below the SFT start",
                  lambda runs: _negated(change["pass@16"](runs, positive)), "greater"),
            Claim("NSR raises pass@16 on the test prompts above the SFT start (the paper: it keeps or raises it)",
                  lambda runs: change["pass@16"](runs, negative), "greater"),
            Claim("NSR raises pass@1 above the SFT start too", lambda runs: change["pass@1"](runs, negative),
                  "greater"),
            Claim("Both signs together (the default) raise pass@1 above the SFT start",
                  lambda runs: change["pass@1"](runs, both), "greater"),
            Claim("NSR ends with a higher pass@16 than PSR (KL beta 0.02)", lambda runs: gap(runs, 0.02),
                  "greater"),
            Claim("Together with it, NSR ends with a higher entropy per sampled token and more distinct correct "
                  "answers per test prompt than PSR", more_diverse, at_least=0.8),
            Claim("The ablation: at KL beta 1 NSR's pass@16 advantage over PSR shrinks (the gap at beta 0.02 minus "
                  "the gap at beta 1, above 0)", lambda runs: _minus(gap(runs, 0.02), gap(runs, 1.0)), "greater",
                  note="A strong KL penalty holds both near the SFT start, so neither can move the mass; if the "
                       "gap does not shrink, it is not NSR's movement that makes it."),
        ],
        color_by=["advantage_sign", "beta"], panels=[
            {"kind": "values", "metrics": ["test_pass@1_before", "test_pass@1_after"], "where": {"beta": 0.02},
             "title": "test pass@1, SFT start and after RL", "ylabel": "pass@1"},
            {"kind": "values", "metrics": ["test_pass@16_before", "test_pass@16_after"], "where": {"beta": 0.02},
             "title": "test pass@16, SFT start and after RL", "ylabel": "pass@16"},
            {"kind": "values", "metrics": ["test_pass@16_after"], "title": "test pass@16 after RL, KL beta 0.02 "
             "and 1", "ylabel": "pass@16"},
            {"kind": "values", "metrics": ["test_entropy_per_token_before", "test_entropy_per_token_after"],
             "where": {"beta": 0.02}, "title": "entropy per sampled test token", "ylabel": "nats per token"},
            {"kind": "values", "metrics": ["test_distinct_correct_per_prompt_before",
                                           "test_distinct_correct_per_prompt_after"], "where": {"beta": 0.02},
             "title": "distinct correct answers per test prompt", "ylabel": "answers (of 32 samples)"},
            {"kind": "claim", "claim": 7, "title": "the ablation: NSR's pass@16 gap, beta 0.02 minus beta 1",
             "ylabel": "difference of pass@16 gaps"}],
        seeds=13,
        seeds_reason="pooled over seeds 0-4, 100-104 and 500-504 (effects in standard deviations, 95% power): the "
                     "pass@1 rises measure 2.3 to 6.2; NSR's pass@16 under PSR's 1.06, which needs 13 seeds; the "
                     "beta-1 ablation of that gap (0.74) would need 25",
        cost=8.0,
    )


def _spurious_rewards():
    # a random reward for every run (each response 1 with probability 1/2, whatever its answer); 4 updates per
    # batch, so that ratios leave 1 and the clip can act; a third of the transformer's learning rate, since
    # on noise alone 3e-4 moved a pilot run (seed 50, in neither seed set) 2.6 to 7.4 nats from its start
    # in 40 iterations
    shared = {"random_reward": 0.5, "updates_per_batch": 4, "learning_rate": 1e-4, "steps": 40, "eval_samples": 0}
    losses = [({"loss": "grpo, clip 0.2"}, {}),
              ({"loss": "grpo, no clip"}, {"epsilon": 0.999, "epsilon_high": 100.0}),
              ({"loss": "cispo"}, {"algorithm": "cispo"})]
    clip, free, cispo = (C(label) for label, _ in losses)
    return _transformer_experiment(
        name="spurious-rewards",
        summary="transformer GRPO on random rewards with the ratio clip, without it, and CISPO: does the "
                "SFT start's most frequent answer pattern grow?",
        source="Shao et al. 2025, 'Spurious Rewards: Rethinking Training Signals in RLVR', arXiv 2506.10947 "
               "(the clipping-bias explanation, sec. 4)",
        claim="Each response is rewarded 1 with probability 1/2, drawn from the run's generator whatever it "
              "answers, so every advantage has mean 0. The paper's explanation of why such rewards still change "
              "the policy is the clip: where ratios leave 1 +- eps, it stops the gradient of improbable tokens "
              "sooner than that of probable ones, so under zero-mean noise the probable behaviour gains. The "
              "pattern measured is the SFT start's most frequent opening of an answer, the shape up to its first "
              "operator (\"n+\": a sum first, about two answers of three), among 8 sampled responses per test "
              "prompt before and after training, on the same draws. The ablation of the cause: a clip range so "
              "wide it never acts (eps 0.999 below, 100 above), where the growth must vanish; CISPO, which "
              "zeroes no token's gradient, likewise. The pattern and the learning rate were chosen on one pilot "
              "seed (50); the claims were stated before the committed seeds were run.",
        configurations=[_spurious(label, **shared, **options) for label, options in losses],
        metrics=["pattern_share_before", "pattern_share_after", "pattern_share_change",
                 "initial_test_success_probability", "final_test_success_probability", "clip_fraction",
                 "kl_reference"],
        curves=("pattern_share", "test_success_probability"),
        claims=[
            Check("The clip acts at eps 0.2 (mean clip fraction above 0.001) and never with the clip off (0)",
                  lambda runs: runs[clip]["clip_fraction"] > 0.001 and runs[free]["clip_fraction"] == 0.0),
            Claim("Under the clip, the SFT start's most frequent answer pattern grows (share after minus before)",
                  lambda runs: runs[clip]["pattern_share_change"], "greater"),
            Claim("The ablation: without the clip it grows less than with it (change with the clip minus without)",
                  difference("pattern_share_change", clip, free), "greater",
                  note="The test of the clipping-bias explanation: it fails if the noise alone moves the pattern "
                       "as much without the clip."),
            Claim("Without the clip the pattern's share falls (its change below 0; within noise: neither a fall nor a "
                  "growth is shown)",
                  lambda runs: _negated(runs[free]["pattern_share_change"]), "greater"),
            Claim("CISPO, which zeroes no token's gradient, grows it less than the clip does",
                  difference("pattern_share_change", clip, cispo), "greater"),
            Claim("Random rewards lower the exact test success under the clip (start minus end)",
                  lambda runs: runs[clip]["initial_test_success_probability"]
                  - runs[clip]["final_test_success_probability"], "greater",
                  note="The paper's models gained from random rewards because the pattern the clip amplified "
                       "(code reasoning in Qwen2.5-Math) was already a good one; here nothing ties the pattern to "
                       "correct answers."),
        ],
        color_by=["loss"], panels=[
            {"kind": "curves", "columns": ["pattern_share"], "title": "share of the top pattern in each batch",
             "ylabel": "share of responses"},
            {"kind": "values", "metrics": ["pattern_share_before", "pattern_share_after"],
             "title": "share of the top pattern, test prompts, before and after", "ylabel": "share of responses"},
            {"kind": "curves", "columns": ["test_success_probability"],
             "title": "exact test success on random rewards", "ylabel": "p(correct)"},
            {"kind": "claim", "claim": 2, "title": "pattern growth, clip minus no clip, per seed",
             "ylabel": "share change difference"}],
        cost=16.0,
        seeds_reason="a pilot (seed 50, in neither set) moved the share +0.02 under the clip and -0.09 without it, "
                     "about four times one run's sampling error (0.023 from 848 responses), so 5 seeds; on seeds 0-4 "
                     "the growth under the clip measures 0.06 and clip minus no clip 0.22, which need about 1900 "
                     "and 160 seeds: no effect of the size the pilot showed; the fall of the test success measures 2.2",
    )


def _spurious(label, **options):
    return (label, "run_spurious", options)


@functools.lru_cache(maxsize=1)
def _loophole():
    """The flawed verifier against the correct one on every 10th test prompt (atlas.exact.loophole_table)."""
    task = countdown_task(8)
    return loophole_table(task, task.split_prompts("test")[::10].tolist())


def _reward_hacking():
    betas = (0.0, 0.2)
    free, held = (C({"beta": beta}) for beta in betas)
    return _transformer_experiment(
        name="reward-hacking",
        summary="transformer GRPO on a flawed Countdown verifier: proxy and true reward against KL(pi‖ref), "
                "KL penalty beta 0 and 0.2",
        source="Gao et al. 2023, 'Scaling Laws for Reward Model Overoptimization', arXiv 2210.10760 (in "
               "miniature: a verifier with a loophole instead of a learned reward model)",
        claim="The reward trained on is a flawed verifier's: it also accepts an expression that uses a given number "
              "twice (the loophole \"reuse\"), so it rewards every correct answer and more. The lab's correct "
              "verifier gives the true reward. Both are averaged over each batch, and their gap (proxy minus "
              "true: answers that score only through the loophole) is read against the batch's KL(pi‖ref). The "
              "claims: the gap widens as the run moves away from its start, and a stronger KL penalty keeps it "
              "smaller. With the loophole removed the two verifiers agree: the gap is 0 by construction, checked "
              "exactly below.",
        configurations=[(({"beta": beta}), "run_reward_hacking",
                         {"verifier_loophole": "reuse", "beta": beta, "steps": 60, "eval_samples": 0})
                        for beta in betas],
        metrics=["reward_gap_head", "reward_gap_tail", "reward_gap_growth", "proxy_reward_tail", "true_reward_tail",
                 "kl_head", "kl_tail", "final_test_success_probability"],
        curves=("proxy_reward_mean", "true_reward_mean", "reward_gap", "kl_reference"),
        claims=[
            Check("The loophole only adds: over every expression of 2-4 numbers (repeats allowed) of every 10th test "
                  "prompt, the flawed verifier accepts every correct one and others, and agrees with the correct "
                  "verifier on every expression without a repeated number (exact)",
                  lambda _: _loophole()["violations"] == 0 and _loophole()["proxy_only_per_prompt"] > 0, "exact",
                  note="The ablation of the loophole: without it the proxy is the true reward, and the gap is 0 "
                       "by construction."),
            Claim("Without a KL penalty the gap widens over the run: proxy minus true reward, last 10 iterations "
                  "minus first 10", lambda runs: runs[free]["reward_gap_growth"], "greater"),
            Claim("... and with beta 0.2 too", lambda runs: runs[held]["reward_gap_growth"], "greater"),
            Claim("The control works: beta 0.2 ends nearer the reference (KL of the last 10 iterations, beta 0 "
                  "minus 0.2)", difference("kl_tail", free, held), "greater"),
            Claim("A stronger KL penalty keeps the gap smaller: the last 10 iterations' gap, beta 0 minus beta 0.2",
                  difference("reward_gap_tail", free, held), "greater"),
        ],
        color_by=["beta"], panels=[
            {"kind": "curves", "columns": ["proxy_reward_mean", "true_reward_mean"],
             "title": "proxy reward (solid) and true reward (dashed) per batch", "ylabel": "mean reward"},
            {"kind": "curves", "columns": ["reward_gap"], "x": "kl_reference",
             "title": "proxy minus true reward against the KL to the start", "ylabel": "reward gap",
             "xlabel": "KL(pi ‖ ref), nats per response"},
            {"kind": "curves", "columns": ["kl_reference"], "title": "KL to the reference, estimated each batch",
             "ylabel": "nats per response"},
            {"kind": "values", "metrics": ["reward_gap_head", "reward_gap_tail"],
             "title": "reward gap, first and last 10 iterations", "ylabel": "proxy minus true reward"}],
        cost=13.0,
        seeds=17,
        seeds_reason="pilot runs (seed 50, in neither set) gave a last-10-iteration gap of 0.048 at beta 0 and 0.016 "
                     "at beta 0.2, about four times one run's sampling error (0.008 from 1280 responses), so 5 seeds "
                     "at first; pooled over seeds 0-4, 100-104 and 500-504 (effects in standard deviations, 95% "
                     "power) the growth measures 0.90 at beta 0 and 1.02 at beta 0.2, which need 17 and 14 seeds; "
                     "the beta gap (0.76) would need 24",
    )


# the SFT starts' share of correct demonstrations that subtract (sft.subtraction_demonstrations)
SUBTRACTION_SHARES = {"absent": 0.0, "rare": 0.03, "common": 0.5}
DISCOVERY_STEPS = 40  # GRPO iterations: pass@1 on the test prompts moves by about 0.1 in 40 (one measured run)
NEAR = 0.02  # "does not rise": pass@256 ends at most this above the start (exact in each run; the seeds still vary)
MAX_GAINED = 2  # "a subset up to noise": at most this many of the 106 test prompts newly covered


def _discover_or_sharpen():
    absent, rare, common = (C({"family": name}) for name in SUBTRACTION_SHARES)

    def change(configuration, metric):
        return lambda runs: runs[configuration][f"{metric}_change"]

    return _transformer_experiment(
        name="discover-or-sharpen",
        summary="transformer GRPO from SFT starts where subtracting answers are absent, rare or common: "
                "pass@1 and pass@256 on the prompts that need one",
        source="Yue et al. 2025, 'Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs Beyond "
               "the Base Model?', arXiv 2504.13837 (the coverage analysis: the prompts solved at large k)",
        claim="The family: the Countdown answers that use a subtraction ('-' among their operators, countdown.py's "
              "enumeration of every solution); its prompts are the test prompts whose every solution subtracts "
              "(33 of 106). Three SFT starts differ only in their correct demonstrations: none of them subtracts "
              "(absent), 3% do (rare) or half do (common); the imperfect demonstrations (wrong values, malformed, "
              "overlong) still show '-'. GRPO runs 40 iterations from each. Everything is measured exactly on every "
              "test prompt: p = the probability of a correct answer (pass@1) and pass@k = 1 - (1 - p)^k. "
              "The claims: RL sharpens what the start can sample and does not discover more. With the family absent "
              "RL does not raise pass@256 on its prompts above the start's; with it rare RL raises pass@1 there but "
              "not pass@256; the test prompts covered after RL (pass@256 >= 0.5) are those covered at the start, up "
              "to noise. The stated cause, RL reweights what the start can already sample, has its ablation: with "
              "the family common, pass@1 on its prompts rises most.",
        configurations=[({"family": name}, "run_discover_or_sharpen",
                         {"subtraction_share": share, "steps": DISCOVERY_STEPS, "eval_prompts": 8, "eval_samples": 0})
                        for name, share in SUBTRACTION_SHARES.items()],
        metrics=["family_pass@1_before", "family_pass@1_after", "family_pass@256_before", "family_pass@256_after",
                 "other_pass@1_before", "other_pass@1_after", "family_share_before", "family_share_after",
                 "covered_before", "covered_after", "gained", "lost"],
        curves=("success_probability", "test_success_probability"),
        claims=[
            Claim(f"With the family absent, RL does not raise pass@256 on its prompts: it ends at most {NEAR} above "
                  f"the start's ({NEAR} minus the change)", _below(change(absent, "family_pass@256"), NEAR),
                  "greater"),
            Claim("With the family absent, its share of the correct answers' probability does not grow by more "
                  f"than {NEAR} ({NEAR} minus the change)", _below(change(absent, "family_share"), NEAR), "greater",
                  note="Kept though it does not hold at 9 seeds on both committed sets (the share 0.029 -> 0.072 and "
                       "0.022 -> 0.069): the absent start still samples subtracting answers (its imperfect "
                       "demonstrations show '-'), pass@1 0.01 and pass@256 0.77-0.80 on the family's prompts before "
                       "RL, so RL can sharpen them too. A growing share is sharpening as much as discovery; the test "
                       "of discovery is the pass@256 claim above."),
            Claim("With the family rare, RL raises pass@1 on its prompts", change(rare, "family_pass@1"),
                  "greater"),
            Claim(f"With the family rare, pass@256 on its prompts ends at most {NEAR} above the start's "
                  f"(sharpening, no discovery; {NEAR} minus the change)", _below(change(rare, "family_pass@256"), NEAR),
                  "greater"),
            Claim(f"Coverage: in every start, at most {MAX_GAINED} test prompts are covered (pass@256 >= 0.5) after "
                  "RL and not at the start",
                  lambda runs: all(runs[c]["gained"] <= MAX_GAINED for c in (absent, rare, common)), at_least=0.8),
            Claim("The ablation, the cause kept: with the family common, pass@1 on its prompts rises more than with "
                  "it rare", lambda runs: runs[common]["family_pass@1_change"] - runs[rare]["family_pass@1_change"],
                  "greater"),
            Claim("... and more than with it absent",
                  lambda runs: runs[common]["family_pass@1_change"] - runs[absent]["family_pass@1_change"],
                  "greater",
                  note="If RL found answers the start cannot sample, the absent start would gain as much as the "
                       "common one on the family's prompts."),
        ],
        color_by=["family"], panels=[
            {"kind": "values", "metrics": ["family_pass@1_before", "family_pass@1_after"],
             "title": "pass@1 on the family's prompts: RL raises it", "ylabel": "pass@1 (exact)"},
            {"kind": "values", "metrics": ["family_pass@256_before", "family_pass@256_after"],
             "title": "pass@256 on them: near the start's on average", "ylabel": "pass@256 (exact)"},
            {"kind": "values", "metrics": ["family_share_before", "family_share_after"],
             "title": "share of p(correct) on subtracting answers", "ylabel": "share (all 106 test prompts)"},
            {"kind": "values", "metrics": ["gained", "lost"],
             "title": "test prompts covered after RL, not before (gained) and lost",
             "ylabel": "prompts of 106 (pass@256 >= 0.5)"}],
        seeds=9,
        seeds_reason="one SFT start per share (about 50 s each) shared by the seeds, which vary the RL run only; "
                     "pooled over the seeds from 0, 100, 1300 and 1500 (effects in standard deviations, 95% power), "
                     "the rare family's pass@256 distance to 'at most 0.02 above the start' measures 1.36, which "
                     "needs 9 seeds (5 left it within noise on two of the four sets); the absent family's effects "
                     "(0.46 and 0.08) need more than any affordable count",
        cost=13.0,
    )


FORGETTING_GAIN = 0.1  # the matched gain: exact train success 0.1 above the start's (about 15 iterations, seed 0)
FORGETTING_STEPS = 40


def _forgetting():
    grpo, rft = (C({"arm": arm}) for arm in ("grpo", "rft"))

    def larger_kl_forgets_more(runs):  # the forgetting difference, signed by which arm moved more in KL
        kl, forgetting = (runs[rft][name] - runs[grpo][name] for name in ("kl_at_gain", "forgetting_at_gain"))
        return math.copysign(forgetting, kl)

    def correlation(configuration):
        return lambda runs: runs[configuration]["kl_forgetting_correlation"]

    return _transformer_experiment(
        name="forgetting",
        summary="transformer GRPO vs rejection fine-tuning on Countdown: the forgetting of a second SFT skill "
                "against the forward KL(pi_0‖pi) on the RL task, at a matched gain",
        source="Shenfeld et al. 2025, 'RL's Razor: Why Online Reinforcement Learning Forgets Less', arXiv 2509.04259",
        claim="The second skill: a prompt BOS, the numbers, '=' (no target) answered by the sum of the numbers "
              "written out (1+2+3+4); a fifth of each seed's SFT demonstrations show it, the rest are Countdown's. "
              "RL never sees it. Each seed trains its own SFT start, then two arms train on Countdown only, one "
              "Adam step per iteration on 16 x 8 = 128 fresh samples, no KL penalty: GRPO, and rejection fine-tuning (RFT: "
              "the NLL of the batch's correct samples). Forgetting is the rise of the second skill's NLL per token "
              f"(128 demonstrations, exact); the KL is the paper's predictor, the forward KL(pi_0‖pi) on the RL "
              "task, estimated on the start's own first batch of 128 samples (the reverse KL(pi‖pi_0) on each "
              "batch is kept as reverse_kl_*). The matched gain: "
              f"the first iteration whose exact train success is {FORGETTING_GAIN} above the start's (the end when "
              "never reached). The claims: forgetting grows with the KL in both arms, and at the matched gain RL "
              "moves less in KL and forgets less than RFT. The stated cause, forgetting follows the KL on the new "
              "task whatever the algorithm, has its ablation across arms: the arm with the larger KL forgets more.",
        configurations=[({"arm": arm}, "run_forgetting",
                         {"arm": arm, "gain": FORGETTING_GAIN, "steps": FORGETTING_STEPS, "beta": 0.0,
                          "updates_per_batch": 1, "eval_prompts": 32, "eval_samples": 0})
                        for arm in ("grpo", "rft")],
        metrics=["success_start", "success_end", "reached", "step_at_gain", "kl_at_gain", "forgetting_at_gain",
                 "kl_end", "forgetting_end", "skill_success_start", "skill_success_end", "kl_forgetting_correlation",
                 "reverse_kl_at_gain", "reverse_kl_forgetting_correlation"],
        curves=("success_probability", "kl_forward", "kl_reference", "forgetting", "skill_success"),
        claims=[
            Claim("Both arms reach the matched gain within the run",
                  lambda runs: runs[grpo]["reached"] == 1 and runs[rft]["reached"] == 1, at_least=0.8),
            Claim("Within GRPO, forgetting grows with KL(pi_0‖pi): their correlation over the iterations is "
                  "positive", correlation(grpo), "greater"),
            Claim("... and within RFT", correlation(rft), "greater"),
            Claim("At the matched gain RL moves less: KL(pi_0‖pi) on the RL task, RFT minus GRPO",
                  difference("kl_at_gain", rft, grpo), "greater"),
            Claim("At the matched gain RL forgets less: the second skill's NLL rise, RFT minus GRPO",
                  difference("forgetting_at_gain", rft, grpo), "greater"),
            Claim("The ablation of the cause, across algorithms: the arm with the larger KL at the matched gain "
                  "forgets more (RFT minus GRPO forgetting, signed by RFT minus GRPO KL)", larger_kl_forgets_more,
                  "greater",
                  note="If forgetting followed the algorithm and not the KL, the arm that moved more would not "
                       "be the one that forgets more."),
        ],
        color_by=["arm"], panels=[
            {"kind": "curves", "columns": ["forgetting"], "x": "success_probability",
             "title": "forgetting against the gain on the RL task", "ylabel": "second skill's NLL rise, nats/token",
             "xlabel": "exact train success on Countdown"},
            {"kind": "curves", "columns": ["forgetting"], "x": "kl_forward",
             "title": "forgetting against the KL on the RL task", "ylabel": "second skill's NLL rise, nats/token",
             "xlabel": "KL(pi_0 ‖ pi), nats per response"},
            {"kind": "curves", "columns": ["kl_forward"], "x": "success_probability",
             "title": "KL paid for the gain", "ylabel": "KL(pi_0 ‖ pi), nats per response",
             "xlabel": "exact train success on Countdown"},
            {"kind": "values", "metrics": ["forgetting_at_gain", "forgetting_end"],
             "title": "forgetting at the matched gain and at the end", "ylabel": "NLL rise, nats/token"}],
        cost=20.0,
        seeds_reason="the budget: each seed trains its own SFT start (about 25 s) shared by its two arms, so the "
                     "seeds replicate over SFT starts; 5 seeds separate an effect of 1.24; one pilot run (seed 0, "
                     "30 iterations) fixed the gain and the length before the claims were written; on seeds 0-4 the "
                     "matched-gain KL gap measures -0.38 (RFT moves less than GRPO in 4 of 5 seeds on both sets) "
                     "and the forgetting gap 0.42 (about 55 and 45 seeds), beyond any budget of this lab",
    )


R1_STEPS = 40  # GRPO iterations: one pilot run (seed 0) reached most of its length by iteration 10 of 100
R1_OVERLONG_CACHE = 10  # DAPO's soft overlong cache: with the cap of 16, a response past 6 tokens loses reward
R1_LENGTH_MARGIN = 0.5  # "length does not grow": the test mean length ends at most this many tokens above the start
R1_ARMS = {"useful": {"scratchpad": "running"}, "useless": {"scratchpad": "noise"},
           "overlong": {"scratchpad": "running", "overlong_penalty": R1_OVERLONG_CACHE}}


@functools.lru_cache(maxsize=1)
def _r1_zero_verifier():
    """The verifier against the task's own definition, on every test prompt of the running-total task (exact):
    the two canonical answers score 1, the direct answer with another digit 0, and noise written before the
    right final answer 1 (only the final answer is read)."""
    from running_total import RunningTotalConfig, RunningTotalTask  # a few ms; the catalogue stays light
    task = RunningTotalTask(RunningTotalConfig())
    violations = 0
    for prompt in task.split_prompts("test").tolist():
        answer = task.answer(prompt)
        direct, running = task.solutions(prompt)
        noise = (task.separator_id, (answer + 3) % 10, task.separator_id, answer, task.eos_id)
        wrong = ((answer + 1) % 10, task.eos_id)
        scores = [task.verify(prompt, list(tokens), False) for tokens in (direct, running, noise, wrong)]
        violations += scores != [1.0, 1.0, 1.0, 0.0]
    return {"violations": violations, "prompts": task.prompt_count("test")}


def _r1_zero():
    useful, useless, overlong = (C({"arm": arm}) for arm in R1_ARMS)

    def change(configuration, metric):
        return lambda runs: runs[configuration][f"{metric}_change"]

    return _transformer_experiment(
        name="r1-zero",
        summary="transformer GRPO on a task where writing the running results helps: test accuracy and response "
                "length grow together; not when the written items are noise; the overlong penalty",
        source="DeepSeek-AI 2025, 'DeepSeek-R1: Incentivizing Reasoning Capability in LLMs via Reinforcement "
               "Learning', arXiv 2501.12948, sec. 2.2 (R1-Zero); DAPO, arXiv 2503.14476, sec. 3.4 (overlong shaping)",
        claim="The task (running_total.py): a prompt is 6 digits joined by 5 operators, + or *, computed left to "
              "right mod 10 (BOS 3+5*7+9*4+2 =); a response answers at once (2 EOS, 2 tokens) or first writes the "
              "running results, each after a ';' (;8;6;5;0;2 EOS, 11 tokens). The verifier reads only the final "
              "answer, the digit before EOS. Each seed trains its own SFT start in two stages: 600 steps on "
              "demonstrations that all write the items (the model that can write out its computation), then 400 "
              "on a mix where a tenth do (the tuning that makes it answer at once). GRPO then runs 40 iterations "
              "with the lab's transformer defaults. Every 5 iterations the policy answers every one of the 512 "
              "test prompts once (sampled, 512 responses a point). The arms: useful (the items are the running "
              "results); useless (the same task, prompts and lengths, but the SFT items are random digits, so "
              "writing them cannot help); overlong (useful, with DAPO's soft overlong penalty, cache "
              f"{R1_OVERLONG_CACHE} of the cap 16: a response of 7 tokens or more loses reward, the full scratchpad "
              "0.5). The claims: in the useful arm accuracy, length and the share writing the items grow together; "
              "the SFT start is right more often when it writes them. The stated cause, length grows because the "
              "written results raise accuracy, has its ablation: with useless items length must not grow.",
        configurations=[({"arm": arm}, "run_r1_zero", {**options, "steps": R1_STEPS, "measure_every": 5,
                                                        "measure_samples": 1, "eval_prompts": 2, "eval_samples": 0})
                        for arm, options in R1_ARMS.items()],
        metrics=["accuracy_start", "accuracy_end", "length_start", "length_end", "partial_share_start",
                 "partial_share_end", "accuracy_partial_start", "accuracy_direct_start"],
        curves=("test_accuracy", "test_length", "test_partial_share", "batch_length", "batch_reward"),
        claims=[
            Check("The verifier reads only the final answer: on every test prompt both canonical answers and noise "
                  "items before the right answer score 1, a wrong direct answer 0 (exact)",
                  lambda _: _r1_zero_verifier()["violations"] == 0, "exact"),
            Claim("The SFT start is right more often when it writes the running results: its test accuracy with "
                  "them minus without, on the same sampled prompts",
                  lambda runs: _minus(runs[useful]["accuracy_partial_start"], runs[useful]["accuracy_direct_start"]),
                  "greater"),
            Claim("Useful: test accuracy rises under RL (end minus start)", change(useful, "accuracy"), "greater"),
            Claim("Useful: the mean test response length rises with it", change(useful, "length"), "greater"),
            Claim("Useful: the share of test responses that write the running results rises",
                  change(useful, "partial_share"), "greater"),
            Claim(f"The ablation, useless items: the mean test length does not grow (it ends at most "
                  f"{R1_LENGTH_MARGIN} token above the start: {R1_LENGTH_MARGIN} minus the change)",
                  _below(change(useless, "length"), R1_LENGTH_MARGIN), "greater",
                  note="The sequence-mean loss has a length bias of its own (length-growth): if length grew for "
                       "that reason, it would grow here too."),
            Claim("The useful arm's length grows more than the useless arm's",
                  difference("length_change", useful, useless), "greater"),
            Claim("The overlong penalty keeps responses shorter: final test length, useful minus overlong",
                  difference("length_end", useful, overlong), "greater"),
            Claim("... and with them the accuracy lower: final test accuracy, useful minus overlong",
                  difference("accuracy_end", useful, overlong), "greater"),
        ],
        color_by=["arm"], panels=[
            {"kind": "curves", "columns": ["test_accuracy"], "title": "test accuracy (512 samples a point)",
             "ylabel": "share correct"},
            {"kind": "curves", "columns": ["test_length"], "title": "mean test response length",
             "ylabel": "tokens (EOS included)"},
            {"kind": "curves", "columns": ["test_partial_share"], "title": "share writing the running results",
             "ylabel": "share of test responses"},
            {"kind": "values", "metrics": ["accuracy_partial_start", "accuracy_direct_start"],
             "title": "the SFT start's accuracy with and without them", "ylabel": "share correct"}],
        quick={**TRANSFORMER_QUICK, "skill_steps": 4, "answer_steps": 2, "measure_every": 2},
        cost=40.0,
        seeds=12,
        seeds_reason="each seed trains its own two SFT starts (about 20 s each), so the seeds replicate over SFT "
                     "starts; pooled over the seeds from 0, 100, 1300 and 1500 (effects in standard deviations, 95% "
                     "power), the overlong penalty's length gap measures 1.51 (7 seeds) and the accuracy lost to it "
                     "1.14, which needs 12 (5, chosen from one pilot run, left it within noise on three of the four "
                     "sets); the useless items' length (0.44) would need about 70",
    )


def experiments():
    """Every experiment of the atlas, by name."""
    found = [_kl_estimators(), _reduction_length_bias(), _std_scaling(), _zero_variance(), _clip_higher(),
             _updates_per_batch(), _sampler_mismatch(), _microbatch(), _grpo2_vs_dpo(), _four_algorithms(),
             _dpo_label_flips(), _group_size(), _chain_lambda(), _reward_shift(), _sparse_reward(),
             _passk_narrowing(), _rl_generalization(), _clip_higher_entropy(), _length_growth(),
             _precision_mismatch(), _kl_placement(), _padding_bug(),
             _kl_optimum(), _entropy_mechanism(), _dpo_displacement(), _negative_samples(),
             _spurious_rewards(), _reward_hacking(), _discover_or_sharpen(), _forgetting(), _r1_zero()]
    return {experiment.name: experiment for experiment in found}
