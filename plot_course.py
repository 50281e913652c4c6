"""The course's concept figures, drawn from the chapter reports of course.py alone (never imports torch).

    python course.py        # computes every chapter's report and draws its figures into results-course/

One function per figure, `draw_<what>(report) -> Figure`, registered in FIGURES under its chapter.
Each figure reads without the text: axes with units, a legend off the data, a title that states the
point.
"""

from __future__ import annotations

from matplotlib.figure import Figure  # noqa: F401

from plot_results import figure_bytes


def svg_bytes(figure):
    """The figure as deterministic SVG bytes (no date, a fixed id salt)."""
    return figure_bytes(figure, ".svg")


# ---------------------------------------------------------------------------------------------
# Chapters 1-5
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Chapters 6-10
# ---------------------------------------------------------------------------------------------


def _legend_below(figure, axes, columns=4):
    """One legend for the figure, under the axes (never over the data)."""
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    figure.legend(handles, labels, loc="outside lower center", ncols=columns, frameon=False)


def draw_kl_beta(report):
    """Chapter 6: what beta buys: the optimum's expected reward and its KL to the reference against beta."""
    curve = report["beta_curve"]
    betas = [row["beta"] for row in curve]
    figure = Figure(figsize=(9, 4.4), layout="constrained")
    reward_ax, kl_ax = figure.subplots(1, 2)
    reward_ax.plot(betas, [row["expected_reward"] for row in curve], color="tab:blue",
                   label="pi*: expected reward (exact)")
    reward_ax.axhline(report["reference_expected_reward"], color="gray", linestyle=":",
                      label="the reference's expected reward")
    reward_ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8, label="the best possible (1)")
    checks = report["optimum_checks"]
    reward_ax.plot([row["beta"] for row in checks], [row["expected_reward"] for row in checks], "o", color="tab:red",
                   label="beta where gradient ascent was checked")
    reward_ax.set(xscale="log", xlabel="beta (nats of KL per unit of reward)", ylabel="expected reward",
                  title="small beta: the reward's optimum")
    kl_ax.plot(betas, [row["kl_reference"] for row in curve], color="tab:green",
               label="KL(pi* || ref), mean over contexts")
    kl_ax.set(xscale="log", xlabel="beta (nats of KL per unit of reward)", ylabel="KL(pi* || ref) (nats)",
              title="large beta: stay at the reference")
    figure.suptitle("The optimum pi* ~ ref * exp(R / beta) on the bandit: beta trades reward for closeness")
    _legend_below(figure, [reward_ax, kl_ax], columns=2)
    return figure


def draw_kl_estimators(report):
    """Chapter 6: k1, k2, k3 of one token against its log-ratio log pi - log ref."""
    curves = report["estimator_curves"]
    x = curves["log_ratio"]
    figure = Figure(figsize=(8.5, 4.8), layout="constrained")
    ax = figure.subplots()
    ax.axhline(0.0, color="gray", linewidth=0.6)
    ax.plot(x, curves["k1"], label="k1 = log-ratio (can be < 0)", color="tab:blue")
    ax.plot(x, curves["k2"], label="k2 = (log-ratio)^2 / 2", color="tab:orange")
    ax.plot(x, curves["k3"], label="k3 = exp(-log-ratio) + log-ratio - 1", color="tab:green")
    ax.set(xlabel="log pi(y) - log ref(y) of the sampled token (nats)", ylabel="per-token estimate (nats)",
           title="k2 and k3 are >= 0 and agree near 0; k3 grows fast where pi < ref")
    _legend_below(figure, [ax], columns=3)
    return figure


def draw_preference_losses(report):
    """Chapter 7: DPO, IPO, the hinge and SimPO against the margin, and their gradient weights."""
    margins, curves = report["margins"], report["curves"]
    beta = report["loss_beta"]
    names = {"dpo": f"DPO (beta {beta})", "ipo": f"IPO (beta {beta}, target 1/(2 beta))",
             "hinge": f"hinge (beta {beta})",
             "simpo": f"SimPO (beta {report['simpo_beta']}, gamma {report['simpo_gamma']}; x = mean log-prob gap)"}
    colors = {"dpo": "tab:blue", "ipo": "tab:orange", "hinge": "tab:green", "simpo": "tab:purple"}
    figure = Figure(figsize=(10, 4.8), layout="constrained")
    loss_ax, weight_ax = figure.subplots(1, 2)
    for name, label in names.items():
        loss_ax.plot(margins, curves[name]["loss"], color=colors[name], label=label)
        weight_ax.plot(margins, curves[name]["weight"], color=colors[name], label=label)
    for ax in (loss_ax, weight_ax):
        ax.axvline(0.0, color="gray", linewidth=0.6)
        ax.set_xlabel("margin m = implicit reward gap / beta (nats)")
    weight_ax.axhline(0.0, color="gray", linewidth=0.6)
    loss_ax.set(ylim=(0, 6), ylabel="loss", title="the loss of one pair")
    weight_ax.set(ylim=(-2.5, 2.5), ylabel="-dL/dm: how hard the pair is pushed",
                  title="DPO's push fades; IPO's reverses past its target")
    figure.suptitle("Preference losses against the pair's margin")
    _legend_below(figure, [loss_ax], columns=2)
    return figure


def draw_group_weights(report):
    """Chapter 8: a group's total |advantage| against its success rate, with and without the std."""
    rows = report["weights"]
    rates = [row["success_rate"] for row in rows]
    dense = [i / 200 for i in range(201)]
    g = report["group_size"]
    figure = Figure(figsize=(10, 4.6), layout="constrained")
    total_ax, relative_ax = figure.subplots(1, 2)
    total_ax.plot(dense, [2 * g * (p * (1 - p)) ** 0.5 for p in dense], color="tab:blue", linewidth=0.8)
    total_ax.plot(dense, [2 * g * p * (1 - p) for p in dense], color="tab:orange", linewidth=0.8)
    total_ax.plot(rates, [row["with_std"] for row in rows], "o", color="tab:blue",
                  label="with the std (scale \"group\"): 2G sqrt(p(1-p))")
    total_ax.plot(rates, [row["without_std"] for row in rows], "s", color="tab:orange",
                  label="without (scale \"none\"): 2G p(1-p)")
    total_ax.set(xlabel=f"success rate p = c / G of the group (G = {g})", ylabel="total |A| over the group",
                 title="total weight of one prompt")
    relative_ax.plot(rates, [row["with_std_relative"] for row in rows], "o-", color="tab:blue")
    relative_ax.plot(rates, [row["without_std_relative"] for row in rows], "s-", color="tab:orange")
    relative_ax.set(xlabel=f"success rate p = c / G of the group (G = {g})", ylim=(0, 1.08),
                    ylabel=f"weight / weight at {g // 2} of {g}", title="relative to a 50% prompt")
    figure.suptitle("The std flattens the curve; the 50% prompt still weighs the most (points: exact, G = 8)")
    _legend_below(figure, [total_ax], columns=2)
    return figure


def draw_token_weights(report):
    """Chapter 9: the gradient weight of one token against its response's length, per reduction."""
    lengths, weights = report["lengths"], report["token_weights"]
    labels = {"sequence": "\"sequence\": 1 / (N L)", "token": "\"token\": 1 / (total tokens)",
              "constant": f"\"constant\": 1 / (N * {report['max_new_tokens']})"}
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.subplots()
    for (name, label), marker in zip(labels.items(), "os^"):
        ax.plot(lengths, weights[name], marker=marker, label=label)
    ax.set(yscale="log", xlabel="length L of the token's response (tokens)",
           ylabel="d loss / d (one token's loss)",
           title=f"Only the sequence mean weighs a token by 1 / L ({len(lengths)} responses, L = 1..{lengths[-1]})")
    _legend_below(figure, [ax], columns=3)
    return figure


def draw_overlong(report):
    """Chapter 9: DAPO's overlong penalty against the length."""
    overlong = report["overlong"]
    cap, cache = overlong["max_new_tokens"], overlong["cache"]
    figure = Figure(figsize=(7, 4.2), layout="constrained")
    ax = figure.subplots()
    ax.plot(overlong["lengths"], overlong["penalty"], "o-", color="tab:red")
    ax.axvspan(cap - cache, cap, color="tab:red", alpha=0.1)
    ax.text(cap - cache + 0.1, -0.05, f"the last {cache} tokens", va="top", fontsize=9)
    ax.set(xlabel="response length L (tokens)", ylabel="penalty added to the reward", ylim=(-1.15, 0.15),
           title=f"The overlong penalty: 0, then a ramp to -1 at the cap ({cap})")
    return figure


def draw_passk(report):
    """Chapter 10: pass@k against k before and after RL, from the committed transformer run."""
    ks = report["ks"]
    figure = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = figure.subplots()
    ax.plot(ks, report["pass_before"], "o-", label="SFT start (before RL)", color="tab:gray")
    ax.plot(ks, report["pass_after"], "s-", label="after RL (GRPO)", color="tab:blue")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set(xlabel="k (samples per prompt)", ylabel="pass@k (unbiased, test prompts)", ylim=(0, 1.05),
           title="RL raises pass@1 and lowers pass@64")
    _legend_below(figure, [ax], columns=2)
    return figure


def draw_passk_estimator(report):
    """Chapter 10: the unbiased pass@k estimator of one prompt against the naive plug-in."""
    estimator = report["estimator"]
    figure = Figure(figsize=(11, 5.4), layout="constrained")
    ax = figure.subplots()
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:purple"]
    for c, color in zip(estimator["correct"], colors):
        ax.plot(estimator["k"], estimator["unbiased"][str(c)], color=color, label=f"c = {c}: unbiased")
        ax.plot(estimator["k"], estimator["naive"][str(c)], color=color, linestyle=":",
                label=f"c = {c}: 1 - (1 - c/n)^k")
    ax.set_xscale("log", base=2)
    ticks = [2 ** power for power in range(7) if 2 ** power <= estimator["samples"]]
    ax.set_xticks(ticks, [str(k) for k in ticks])
    ax.set(xlabel=f"k (of n = {estimator['samples']} samples)", ylabel="pass@k of one prompt", ylim=(0, 1.05),
           title="The unbiased estimator reaches 1 at k = n - c + 1; the plug-in is low")
    _legend_below(figure, [ax], columns=4)
    return figure



# chapter name -> {figure name: draw function}; course.py writes results-course/<chapter>-<figure>.svg
FIGURES = {
    "06-kl-regularized-objective": {"beta": draw_kl_beta, "estimators": draw_kl_estimators},
    "07-preferences": {"losses": draw_preference_losses},
    "08-groups": {"weights": draw_group_weights},
    "09-sequences": {"token-weights": draw_token_weights, "overlong": draw_overlong},
    "10-the-whole-loop": {"passk": draw_passk, "estimator": draw_passk_estimator},
}
