"""The course's concept figures, drawn from the chapter reports of course.py alone (never imports torch).

    python course.py        # computes every chapter's report and draws its figures into results-course/

One function per figure, `draw_<what>(report) -> Figure`, registered in FIGURES under its chapter.
Each figure reads without the text: axes with units, a legend off the data, a title that states the
point.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from plot_results import figure_bytes


def svg_bytes(figure):
    """The figure as deterministic SVG bytes (no date, a fixed id salt)."""
    return figure_bytes(figure, ".svg")


# ---------------------------------------------------------------------------------------------
# Chapters 1-5
# ---------------------------------------------------------------------------------------------

GREY = "0.75"


def _figure(width, height, rows=1, columns=1, **kwargs):
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False, **kwargs)


def _legend_right(figure, *axes, **kwargs):
    """One legend outside the plotting area, on the right, off every curve: the entries of every axis."""
    handles, labels = [], []
    for axis in axes:
        found = axis.get_legend_handles_labels()
        handles, labels = handles + found[0], labels + found[1]
    figure.legend(handles, labels, loc="outside right center", frameon=False, **kwargs)


def draw_shift(report):
    """Chapter 1: each logits row's softmax (left), the token it scores boxed; the per-token log-probs the
    atom returns (right), grey where the mask hides the token."""
    vocabulary, ids = report["vocabulary"], report["input_ids"]
    probabilities = report["probabilities"][:-1]  # the last row scores nothing: there is no token T
    valid, token_logps = report["valid"], report["token_logps"]
    figure, axes = _figure(12.5, 4.6, 1, 2, width_ratios=[1.15, 1])
    left, right = axes[0]
    image = left.imshow(probabilities, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for row, target in enumerate(report["targets"]):
        color = "tab:orange" if valid[row] else "0.45"
        left.add_patch(_box(target, row, color, "-" if valid[row] else ":"))
        for column, value in enumerate(probabilities[row]):
            left.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=8,
                      color="white" if value > 0.6 else "black")
    left.set_xticks(range(len(vocabulary)), vocabulary)
    left.set_yticks(range(len(probabilities)),
                    [f"row {t}: after {vocabulary[ids[t]]}" for t in range(len(probabilities))])
    left.set_xlabel("next token v")
    left.set_ylabel("logits row t (the prefix ends at position t)")
    left.set_title("softmax(logits[t]): row t scores token t+1 (boxed)", fontsize=10)
    figure.colorbar(image, ax=left, label="probability p(v | tokens 0..t)", shrink=0.85)
    positions = list(range(1, len(ids)))
    labels = [f"{t}: {vocabulary[ids[t]]}" for t in positions]
    colors = ["tab:orange" if keep else GREY for keep in valid]
    right.bar(range(len(positions)), token_logps, color=colors)
    for index, (value, keep) in enumerate(zip(token_logps, valid)):
        right.text(index, value - 0.04 if keep else -0.04, f"{value:.3f}" if keep else "masked: 0",
                   ha="center", va="top", fontsize=8)
    right.set_xticks(range(len(positions)), labels, fontsize=8)
    right.set_ylim(min(token_logps) - 0.35, 0.15)
    right.axhline(0.0, color="black", linewidth=0.6)
    right.set_xlabel("scored position t+1: its token (prompt, PAD: not scored)")
    right.set_ylabel("log p(token) (nats)")
    right.set_title(f"log-probs of the response: sum = {report['sequence_logp']:.3f} nats", fontsize=10)
    figure.suptitle("The causal shift: logits row t scores token t+1; only response tokens (EOS kept) count")
    return figure


def _box(column, row, color, style):
    from matplotlib.patches import Rectangle

    return Rectangle((column - 0.5, row - 0.5), 1, 1, fill=False, edgecolor=color, linewidth=2.2, linestyle=style)


def draw_sample_error(report):
    """Chapter 2: the relative error of the sampled policy gradient against the sample size, log-log."""
    sizes = report["sample_sizes"]
    figure, axes = _figure(7.8, 4.6)
    axis = axes[0][0]
    axis.errorbar(sizes, report["relative_error_mean"], yerr=report["relative_error_std"], fmt="o", capsize=3,
                  color="tab:blue", label=f"sampled REINFORCE estimate:\nmean and std over {report['repeats']} batches")
    axis.plot(sizes, report["relative_error_rms_exact"], color="black", linestyle="--",
              label="exact RMS error\nsqrt(variance / N) / |grad J|\n(a 1/sqrt(N) line)")
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("samples per estimate N (context, action pairs)")
    axis.set_ylabel("relative error |g_N - grad J| / |grad J|")
    axis.set_title("The score-function estimate is unbiased; its error falls as 1/sqrt(N)", fontsize=11)
    axis.grid(True, which="major", alpha=0.3)
    _legend_right(figure, axis)
    return figure


def draw_variance(report):
    """Chapter 3: the exact per-sample variance of the gradient estimate against a reward shift."""
    shifts = report["variance_by_shift"]
    figure, axes = _figure(7.8, 4.4)
    axis = axes[0][0]
    axis.plot(shifts["shifts"], shifts["no_baseline"], marker="o", color="tab:red", label="no baseline: R + c")
    axis.plot(shifts["shifts"], shifts["baseline"], marker="s", color="tab:green",
              label="baseline V(x): R + c - V(x) - c")
    axis.set_yscale("log")
    axis.set_xlabel("reward shift c added to every reward")
    axis.set_ylabel("variance of one-sample gradient\n(trace of its covariance)")
    axis.set_title("A shift grows the variance without a baseline; V(x) removes it", fontsize=11)
    axis.grid(True, alpha=0.3)
    _legend_right(figure, axis)
    return figure


def draw_gae_weights(report):
    """Chapter 3: the weight (gamma * lambda)^k of TD error k in GAE's advantage at step 0."""
    figure, axes = _figure(7.8, 4.4)
    axis = axes[0][0]
    for lam, marker in zip(report["gae_lambdas"], "osD^v"):
        weights = report["gae_weights"][str(lam)]
        axis.plot(range(len(weights)), weights, marker=marker, markersize=3.5, label=f"lambda = {lam}")
    axis.set_xlabel("k: steps ahead of the TD error delta_k")
    axis.set_ylabel("weight of delta_k in A_0")
    axis.set_title(f"GAE weighs TD error k by (gamma * lambda)^k (gamma = {report['gae_gamma']})", fontsize=11)
    axis.grid(True, alpha=0.3)
    _legend_right(figure, axis)
    return figure


def draw_lambda(report):
    """Chapter 3: exact bias and variance of the lambda-return on the three-step chain, for a right and a
    zero critic."""
    data = report["bias_variance"]
    figure, axes = _figure(10.5, 4.0, 1, 2)
    left, right = axes[0]
    styles = {"right": ("tab:green", "o", "right critic V = true values"),
              "zero": ("tab:red", "s", "wrong critic V = 0")}
    for name, (color, marker, label) in styles.items():
        left.plot(data["lambdas"], data[name]["bias"], color=color, marker=marker, label=label)
    # the variance does not depend on the critic here (it only shifts every outcome): one line, said so
    right.plot(data["lambdas"], data["zero"]["variance"], color="black", marker="D",
               label="variance, either critic\n(the two are equal)")
    left.set_xlabel("lambda")
    left.set_ylabel("bias of the return estimate at step 0")
    left.set_title("bias: only a wrong critic, shrinking to 0 at lambda = 1", fontsize=10)
    right.set_xlabel("lambda")
    right.set_ylabel("variance of the return estimate at step 0")
    right.set_title("variance: grows with lambda, whatever the critic", fontsize=10)
    for axis in (left, right):
        axis.grid(True, alpha=0.3)
    _legend_right(figure, left, right)
    figure.suptitle("Lambda trades the critic's bias against the sampled rewards' variance (3 steps, rewards 0 or 2)")
    return figure


def draw_corrections(report):
    """Chapter 4: bias and standard deviation of the importance-weighted estimate against the cap."""
    data = report["corrections"]
    figure, axes = _figure(10.5, 4.0, 1, 2)
    left, right = axes[0]
    for name, color, marker, label in (("tis", "tab:blue", "o", "truncated weights min(w, cap)"),
                                       ("mask", "tab:purple", "s", "masking: w = 0 where w > cap")):
        left.plot(data["caps"], data[name]["bias"], color=color, marker=marker, label=label)
        right.plot(data["caps"], [v**0.5 for v in data[name]["variance"]], color=color, marker=marker, label=label)
    left.axhline(0.0, color="black", linewidth=0.6)
    left.set_xlabel("cap on the importance weight")
    left.set_ylabel("bias of the one-sample estimate")
    left.set_title("the cost: a bias, 0 once the cap reaches the largest weight", fontsize=9)
    right.set_xlabel("cap on the importance weight")
    right.set_ylabel("standard deviation of one sample")
    right.set_title("the gain: a smaller spread", fontsize=9)
    for axis in (left, right):
        axis.grid(True, alpha=0.3)
    _legend_right(figure, right)
    figure.suptitle(f"Correcting a sampler that under-weights a rare action (largest weight "
                    f"{max(report['importance_sampling']['weights']):g})")
    return figure


METHOD_LABELS = {"ppo_clip": "PPO clip", "grpo": "GRPO", "cispo": "CISPO", "gspo": "GSPO", "sapo": "SAPO",
                 "dual_clip": "dual-clip", "clip_higher": "clip-higher"}


def draw_second_pass(report):
    """Chapter 4: how far each loss's gradient is from REINFORCE's once the ratio is not 1."""
    methods = report["methods"]
    values = [report["second_pass_relative_difference"][name] for name in methods]
    figure, axes = _figure(7.8, 4.0)
    axis = axes[0][0]
    bars = axis.bar([METHOD_LABELS[name] for name in methods], values, color="tab:blue")
    for bar, value, name in zip(bars, values, methods):
        text = f"{value:.3f}" + ("\n(its gradient is 0)" if report["second_pass_gradient_norm"][name] == 0 else "")
        axis.text(bar.get_x() + bar.get_width() / 2, value + 0.02, text, ha="center", va="bottom")
    axis.set_ylim(0.0, max(values) * 1.3)
    axis.set_ylabel("|grad - grad REINFORCE| / |grad REINFORCE|")
    axis.set_xlabel("loss (the same batch, per-sequence mean, no KL)")
    axis.set_title("First pass: all equal REINFORCE exactly. Second pass (ratio != 1): they differ", fontsize=10)
    return figure


def draw_clip(report):
    """Chapter 5: PPO's clipped objective against the ratio for A > 0 and A < 0 (PPO's Figure 1)."""
    ratios, eps = report["ratios"], report["clip_epsilon"]
    figure, axes = _figure(10.5, 4.0, 1, 2)
    for axis, sign, title in ((axes[0][0], "positive", "A = +1"), (axes[0][1], "negative", "A = -1")):
        data = report["objective"][sign]
        axis.plot(ratios, data["unclipped"], color=GREY, linestyle="--", label="unclipped ratio * A")
        axis.plot(ratios, data["ppo_clip"], color="tab:blue", linewidth=2.2, label="min(ratio * A, clip(ratio) * A)")
        for edge in (1 - eps, 1 + eps):
            axis.axvline(edge, color="0.4", linewidth=0.7, linestyle=":")
        axis.axvline(1.0, color="tab:red", linewidth=0.8, label="ratio = 1 (first pass)")
        axis.set_xlim(0.0, 2.0)
        axis.set_ylim(-2.0, 2.0) if sign == "negative" else axis.set_ylim(0.0, 2.0)
        axis.set_xlabel(f"ratio pi / pi_old (dotted: 1 - eps and 1 + eps, eps = {eps})")
        axis.set_ylabel("objective per token (to maximize)")
        axis.set_title(f"{title}: flat beyond 1 {'+' if sign == 'positive' else '-'} eps", fontsize=10)
        axis.grid(True, alpha=0.3)
    _legend_right(figure, axes[0][1])
    figure.suptitle("PPO's clip: the objective stops paying once the ratio leaves [1 - eps, 1 + eps] in A's direction")
    return figure


def draw_gradient_weights(report):
    """Chapter 5: each method's gradient weight (d objective / d logp over A) against the ratio."""
    ratios = report["ratios"]
    methods = ["ppo_clip", "clip_higher", "dual_clip", "cispo", "sapo"]
    notes = {"ppo_clip": f"eps = {report['clip_epsilon']}", "clip_higher": f"eps_high = {report['epsilon_high']}",
             "dual_clip": f"c = {report['dual_clip']:g}", "cispo": f"cap = {report['cispo_cap']:g}",
             "sapo": f"tau = {report['sapo_tau_pos']:g} / {report['sapo_tau_neg']:g}"}
    figure, axes = _figure(14.0, 5.4, 2, len(methods), sharex=True, sharey=True)
    for row, (sign, label) in enumerate((("positive", "A > 0"), ("negative", "A < 0"))):
        for column, name in enumerate(methods):
            axis = axes[row][column]
            axis.plot(ratios, ratios, color=GREY, linestyle="--", linewidth=1.0, label="ratio (no clip)")
            axis.plot(ratios, report["weight"][sign][name], color="tab:blue", linewidth=1.8, label="gradient weight")
            axis.set_xlim(0.0, 6.0)
            axis.set_ylim(-0.2, 6.2)
            axis.grid(True, alpha=0.3)
            axis.set_title(f"{METHOD_LABELS[name]} ({notes[name]}), {label}", fontsize=9)
            if row == 1:
                axis.set_xlabel("ratio pi / pi_old")
            if column == 0:
                axis.set_ylabel(f"{label}: weight on A * grad logp")
    _legend_right(figure, axes[0][-1])
    figure.suptitle("Gradient weight per token against the ratio: 1 at ratio 1 for every method; "
                    "where each stops or caps the gradient")
    return figure


def draw_sapo_gate(report):
    """Chapter 5: SAPO's gate against the ratio, beside PPO's hard clip."""
    ratios = report["ratios"]
    figure, axes = _figure(7.8, 4.4)
    axis = axes[0][0]
    positive = report["objective"]["positive"]["sapo"]
    negative = [-value for value in report["objective"]["negative"]["sapo"]]
    axis.plot(ratios, positive, color="tab:blue", label=f"gate, A > 0 (tau_pos = {report['sapo_tau_pos']:g})")
    axis.plot(ratios, negative, color="tab:red", linestyle="--",
              label=f"gate, A < 0 (tau_neg = {report['sapo_tau_neg']:g})")
    shift = 2.0 / report["sapo_tau_pos"] - 1.0
    axis.plot(ratios, [r + shift for r in ratios], color=GREY, linestyle=":",
              label=f"ratio + {shift:g}: the tangent at ratio 1")
    axis.set_xlim(0.0, 6.0)
    axis.set_ylim(0.0, 4.5)
    axis.set_xlabel("ratio pi / pi_old")
    axis.set_ylabel("gate(ratio) = 4 / tau * sigmoid(tau (ratio - 1))")
    axis.set_title("SAPO's gate: slope 1 at ratio 1, then it flattens smoothly (no hard edge)", fontsize=10)
    axis.grid(True, alpha=0.3)
    _legend_right(figure, axis)
    return figure


DPPO_METHODS = (("ppo_clip", "ratio clip (PPO)", "tab:gray"), ("dppo_tv", "DPPO, TV", "tab:blue"),
                ("dppo_kl", "DPPO, binary KL", "tab:green"))


def _label_edge(axis, sign, intervals, y):
    """Write the p where the gradient stops beside a bar (none where the region reaches 0 or 1)."""
    low, high = intervals[0][0], intervals[-1][1]
    if sign == "positive" and high < 1.0:
        axis.text(high + 0.01, y, f"p <= {high:g}", va="center", ha="left", fontsize=7)
    elif sign == "negative" and low > 0.0:
        inside = low < 0.15  # no room on the left: write it on the bar
        axis.text(low + 0.01 if inside else low - 0.01, y, f"p >= {low:g}", va="center",
                  ha="left" if inside else "right", fontsize=7, color="white" if inside else "black")


def draw_dppo_region(report):
    """Chapter 5 (the trust-regions page): where one token still passes a gradient against its new
    probability p, for a few old probabilities q: PPO's ratio clip beside DPPO's TV and KL regions."""
    dppo = report["dppo"]
    olds = dppo["old_probabilities"]
    figure, axes = _figure(11.0, 4.6, 1, 2, sharey=True)
    for axis, (sign, label) in zip(axes[0], (("positive", "A > 0"), ("negative", "A < 0"))):
        ticks, names = [], []
        for group, q in enumerate(olds):
            for row, (method, name, color) in enumerate(DPPO_METHODS):
                y = group * (len(DPPO_METHODS) + 1) + row
                spans = [(low, high - low) for low, high in dppo["region"][sign][str(q)][method]]
                axis.broken_barh(spans, (y - 0.35, 0.7), color=color, label=name if group == 0 else None)
                _label_edge(axis, sign, dppo["region"][sign][str(q)][method], y)
                axis.plot([q, q], [y - 0.45, y + 0.45], color="black", linewidth=1.4,
                          label="old probability q" if group == 0 and row == 0 else None)
                ticks.append(y)
                names.append(f"q = {q:g}: {name}")
        axis.set_yticks(ticks, names, fontsize=8)
        axis.set_xlim(0.0, 1.0)
        axis.set_xlabel("new probability p = pi(token) (coloured: the gradient is kept)")
        axis.set_title(f"{label}: the push {'up' if sign == 'positive' else 'down'} stops at the bar's "
                       f"{'right' if sign == 'positive' else 'left'} end", fontsize=10)
        axis.grid(True, axis="x", alpha=0.3)
    axes[0][0].invert_yaxis()  # once: the axes share y; the rare token's rows on top
    _legend_below(figure, [axes[0][0]], columns=4)
    figure.suptitle(f"A ratio clip lets a rare token (q = {olds[0]:g}) move only {dppo['delta']:g} x q; "
                    f"DPPO bounds the change of p itself (delta = {dppo['delta']:g})")
    return figure


def draw_gmpo_clip(report):
    """Chapter 5 (the trust-regions page): the log of the ratio each objective multiplies A by, against a
    one-token response's log-ratio: GMPO's log-space clip beside PPO's ratio clip."""
    gmpo = report["gmpo"]
    eps, ppo_eps = gmpo["epsilon"], report["clip_epsilon"]
    figure, axes = _figure(10.5, 4.2, 1, 2, sharey=True)
    for axis, (sign, label) in zip(axes[0], (("positive", "A > 0"), ("negative", "A < 0"))):
        data = gmpo["clip"][sign]
        axis.plot(gmpo["log_ratios"], gmpo["log_ratios"], color=GREY, linestyle="--", label="no clip")
        axis.plot(gmpo["log_ratios"], data["ppo_clip"]["log_ratio_seen"], color="tab:gray", linewidth=2.2,
                  label=f"PPO clip, ratio in [{1 - ppo_eps:g}, {1 + ppo_eps:g}]")
        axis.plot(gmpo["log_ratios"], data["gmpo"]["log_ratio_seen"], color="tab:blue", linewidth=1.6,
                  label=f"GMPO, log-ratio in [-{eps:g}, {eps:g}]")
        axis.set_xlim(-1.0, 1.0)
        axis.set_ylim(-1.0, 1.0)
        axis.set_xlabel("log-ratio log pi - log pi_old of a one-token response (nats)")
        axis.set_title(f"{label}: flat (no gradient) past the upper edge" if sign == "positive"
                       else f"{label}: flat (no gradient) past the lower edge", fontsize=10)
        axis.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("log of the ratio the objective weighs A by (nats)")
    _legend_below(figure, [axes[0][0]], columns=3)
    figure.suptitle(f"GMPO clips in log space: +-{eps:g} nats, about twice PPO's [{math.log(1 - ppo_eps):.2f}, "
                    f"{math.log(1 + ppo_eps):.2f}]")
    return figure


def draw_sequence_weights(report):
    """Chapter 5 (the sequence-weighted page): the weight VESPO and TOPR put on A * grad log pi against the
    sequence ratio w, beside the plain importance weight w."""
    weights = report["sequence_weights"]
    ratios = weights["ratios"]
    figure, axes = _figure(10.5, 4.4, 1, 2, sharey=True)
    for axis, (sign, label) in zip(axes[0], (("positive", "A >= 0"), ("negative", "A < 0"))):
        data = weights["weight"][sign]
        axis.plot(ratios, data["importance"], color=GREY, linestyle="--", label="importance weight w")
        axis.plot(ratios, data["topr"], color="tab:orange", linewidth=2.2, label="TOPR: 1, or min(w, 1) if A < 0")
        axis.plot(ratios, data["vespo"], color="tab:blue", linewidth=1.8,
                  label="VESPO: phi = w^k exp(lambda (1 - w))")
        peak = data["vespo_k"] / data["vespo_lambda"]
        axis.axvline(peak, color="tab:blue", linewidth=0.7, linestyle=":")
        axis.set_xscale("log")
        axis.set_xlim(ratios[0], ratios[-1])
        axis.set_ylim(0.0, 2.0)
        axis.set_xlabel("sequence ratio w = pi(y) / pi_old(y) (log scale)")
        axis.set_title(f"{label}: k = {data['vespo_k']:g}, lambda = {data['vespo_lambda']:g}, "
                       f"peak at w = k / lambda = {peak:.2g} (dotted)", fontsize=10)
        axis.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("weight on A * grad log pi(y)")
    _legend_below(figure, [axes[0][0]], columns=3)
    figure.suptitle("Both weights are 1 at w = 1; VESPO fades far off-policy responses on both sides, "
                    "TOPR only bad ones it has left")
    return figure


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
    reward_ax.set(xscale="log", xlabel="beta (reward per nat of KL)", ylabel="expected reward",
                  title="small beta: the reward's optimum")
    kl_ax.plot(betas, [row["kl_reference"] for row in curve], color="tab:green",
               label="KL(pi* || ref), mean over contexts")
    kl_ax.set(xscale="log", xlabel="beta (reward per nat of KL)", ylabel="KL(pi* || ref) (nats)",
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


def draw_entropy_mask(report):
    """Chapter 10 (the entropy page): each kept token's entropy on one batch, the (1 - rho) quantile line,
    and the tokens the high-entropy mask keeps."""
    data = report["entropy_mask"]
    figure, axes = _figure(10.5, 4.4)
    axis = axes[0][0]
    position, ticks = 0, []
    for response, (row, kept, chosen) in enumerate(zip(data["entropies"], data["completion_mask"], data["mask"])):
        # a response's kept tokens come first (padding after), so position + t lays them out in order
        others = [t for t in range(len(row)) if kept[t] and not chosen[t]]
        picked = [t for t in range(len(row)) if chosen[t]]
        axis.scatter([position + t for t in others], [row[t] for t in others], s=28, facecolors="none",
                     edgecolors="tab:gray",
                     label="kept token, masked out of the policy term" if response == 0 else None)
        axis.scatter([position + t for t in picked], [row[t] for t in picked], s=36, color="tab:orange",
                     label="high-entropy token: keeps its gradient" if response == 0 else None)
        count = sum(kept)
        ticks.append(position + (count - 1) / 2)
        position += count + 2
        if response < len(data["entropies"]) - 1:
            axis.axvline(position - 1.5, color="0.85", linewidth=0.8)
    axis.axhline(data["threshold"], color="tab:red", linestyle="--", linewidth=1.0,
                 label=f"quantile {1 - data['top_quantile']:g} of the kept entropies = {data['threshold']:.3f}")
    axis.axhline(math.log(data["vocabulary"]), color=GREY, linestyle=":", linewidth=1.0,
                 label=f"log V = {math.log(data['vocabulary']):.3f} (uniform over V = {data['vocabulary']})")
    axis.set_xticks(ticks, [f"response {i + 1}\n({n} tokens)" for i, n in enumerate(data["lengths"])])
    axis.set_xlabel("kept tokens of each response, in order (padding not drawn)")
    axis.set_ylabel("token entropy H (nats)")
    axis.set_ylim(0.0, math.log(data["vocabulary"]) * 1.08)
    axis.set_title(f"The mask keeps the batch's top {data['top_quantile']:.0%} entropies: {data['chosen']} of "
                   f"{data['kept']} kept tokens, wherever they fall", fontsize=11)
    axis.grid(True, axis="y", alpha=0.3)
    _legend_below(figure, [axis], columns=2)
    return figure



# chapter name -> {figure name: draw function}; course.py writes results-course/<chapter>-<figure>.svg
FIGURES = {
    "01-log-probabilities": {"shift": draw_shift},
    "02-policy-gradient": {"sample-error": draw_sample_error},
    "03-baselines-and-gae": {"variance": draw_variance, "gae-weights": draw_gae_weights, "lambda": draw_lambda},
    "04-reusing-a-batch": {"corrections": draw_corrections, "second-pass": draw_second_pass},
    "05-trust-regions": {"clip": draw_clip, "weights": draw_gradient_weights, "sapo-gate": draw_sapo_gate,
                         "dppo-region": draw_dppo_region, "gmpo-clip": draw_gmpo_clip,
                         "sequence-weights": draw_sequence_weights},
    "06-kl-regularized-objective": {"beta": draw_kl_beta, "estimators": draw_kl_estimators},
    "07-preferences": {"losses": draw_preference_losses},
    "08-groups": {"weights": draw_group_weights},
    "09-sequences": {"token-weights": draw_token_weights, "overlong": draw_overlong},
    "10-the-whole-loop": {"passk": draw_passk, "estimator": draw_passk_estimator, "entropy-mask": draw_entropy_mask},
}
