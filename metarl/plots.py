"""A run's figures from plain arrays (``metarl.figures`` reads the run): each a ``Figure`` on the Agg canvas, never
through pyplot (no global state, no display needed); ``save(fig, path)`` writes it."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.mathtext import MathTextParser
from matplotlib.ticker import MaxNLocator

from metarl.stats import t_interval

LEARNED, BASELINE = "tab:blue", "tab:orange"
FORMULA_COLOURS = ("tab:green", "tab:red", "tab:purple", "tab:brown")
DPI = 100
ERROR = "error e = prediction - target"  # the x axis of every value-loss panel


def new_figure(width: float, height: float, note: str = "", fontsize: float = 9) -> Figure:
    """An empty figure on the Agg canvas, ``note`` (if any) its title above every panel."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    if note:
        fig.suptitle(note, fontsize=fontsize)
    return fig


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path


def _grid(n: int, max_cols: int, width: float, height: float, note: str = "", pad: float = 0.0):
    cols = min(max_cols, n)
    rows = -(-n // cols)
    fig = new_figure(width * cols, height * rows + pad, note)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n)]


def _generations(history: Sequence[dict]):
    """The records' generations and ``column(key) -> values`` (NaN where a record lacks ``key`` or holds null)."""
    column = lambda k: np.array([r.get(k) for r in history], dtype=float)
    return column("generation"), column


def _generation_axis(ax, gens: np.ndarray) -> None:
    ax.set_xlabel("generation")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if len(gens) == 1:
        ax.set_xlim(gens[0] - 1, gens[0] + 1)


def fitness_figure(history: Sequence[dict], title: str = "", paired: bool = False) -> Figure:
    """The population's fitness per generation, and the baseline (``fitness.control``; ``paired``: the line at 0)."""
    fig = new_figure(7, 4)
    ax = fig.add_subplot()
    gens, col = _generations(history)
    ax.fill_between(gens, col("q10"), col("q90"), color=LEARNED, alpha=0.15, lw=0, label="population q10-q90")
    ax.fill_between(gens, col("q25"), col("q75"), color=LEARNED, alpha=0.3, lw=0, label="population q25-q75")
    ax.plot(gens, col("q50"), color=LEARNED, lw=1, ls=":", label="median")
    ax.plot(gens, col("mean"), color=LEARNED, lw=2, label="mean")
    ax.plot(gens, col("best"), color="tab:green", lw=1, marker=".", label="best of generation")
    ax.step(gens, col("best_so_far"), where="post", color="black", lw=1, ls="--", label="best so far")
    if any("control" in r for r in history):
        control = np.zeros_like(gens) if paired else col("control")
        ax.plot(gens, control, color=BASELINE, lw=1.5, marker=".",
                label="baseline (control; fitness paired: member - control)" if paired else "baseline (control)")
    bad = np.nan_to_num(col("nonfinite")) > 0
    if bad.any():
        ax.plot(gens[bad], col("worst")[bad], "x", color="red", label="generation with diverged members")
    _generation_axis(ax, gens)
    ax.set(ylabel="fitness - baseline's (paired)" if paired else "fitness (episode return)",
           title=title or "fitness over generations")
    ax.legend(fontsize=8, loc="best")
    return fig


def signal_figure(history: Sequence[dict], threshold: float, title: str = "") -> Figure:
    """``figures/signal.png`` as docs/signal.md describes it, from the records' fields of those names."""
    fig = new_figure(7, 5.5)
    top, bottom = fig.subplots(2, 1, sharex=True)
    gens, col = _generations(history)
    top.plot(gens, col("signal_between"), color=LEARNED, lw=2, marker=".", label="signal_between (V_b)")
    top.plot(gens, col("seed_noise"), color="tab:red", lw=1.5, marker=".", label="seed_noise (V_w / num_seeds)")
    top.set(ylabel="variance of the\nmembers' mean fitness",
            yscale="log" if np.nanmax(np.r_[col("signal_between"), col("seed_noise"), 0.0]) > 0 else "linear")
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper left")
    if any("best_vs_control" in r for r in history):
        margin = top.twinx()
        margin.plot(gens, col("best_vs_control"), color=BASELINE, lw=1, ls="--", label="best_vs_control")
        margin.plot(gens, col("mean_vs_control"), color=BASELINE, lw=1, ls=":", label="mean_vs_control")
        margin.axhline(0.0, color=BASELINE, lw=0.5)
        margin.set_ylabel("fitness - baseline's", fontsize=8)
        margin.legend(fontsize=8, loc="upper right")
    bottom.plot(gens, col("signal"), color=LEARNED, lw=2, marker=".", label="signal")
    bottom.plot(gens, col("update_signal"), color="tab:green", lw=1, marker=".", label="update_signal")
    bottom.axhline(threshold, color="tab:red", lw=1, ls="--", label=f"noise-dominated below {threshold}")
    bottom.set(ylim=(-0.05, 1.05), ylabel="fraction that is signal")
    _generation_axis(bottom, gens)
    bottom.legend(fontsize=8, loc="best")
    top.set_title(title or "signal and seed noise per generation", fontsize=10)
    return fig


def task_fitness_figure(history: Sequence[dict], names: Sequence[str]) -> Figure:
    """One panel per task: raw returns per generation, the normalised score (baseline = 1) on the right axis."""
    fig, axes = _grid(len(names), 3, 4, 3)
    gens, _ = _generations(history)
    for name, ax in zip(names, axes):
        _, col = _generations([r.get("tasks", {}).get(name, {}) for r in history])
        ax.plot(gens, col("raw_mean"), color=LEARNED, lw=2, label="population mean")
        ax.plot(gens, col("raw_best"), ".", color="tab:green", label="best member")
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("return")
        _generation_axis(ax, gens)
        score = ax.twinx()
        score.plot(gens, col("score_mean"), color="0.4", lw=0.8, ls="--", label="mean score")
        score.set_ylabel("normalised score", fontsize=8)
    axes[0].legend(fontsize=7, loc="lower right")
    return fig


def _twin_if_needed(ax, learned: np.ndarray, baseline: np.ndarray, ylabel: str, **font):
    """The axes to draw the learned curve on: its own right one (labelled ``ylabel``) when its scale differs
    from L2's by over 5x, as the learned loss has an arbitrary scale and its shape is what is compared."""
    a, b = np.nanmax(np.abs(learned)), np.nanmax(np.abs(baseline))
    if a > 0 and b > 0 and 0.2 <= a / b <= 5:
        return ax
    twin = ax.twinx()
    twin.tick_params(axis="y", colors=LEARNED)
    twin.set_ylabel(ylabel, color=LEARNED, **font)
    return twin


def _error_panel(ax, ylabel: str, title: str) -> None:
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set(xlabel=ERROR, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)


def value_loss_figure(errors: np.ndarray, loss: np.ndarray, grad: np.ndarray, fixed: str = "") -> Figure:
    """The learned loss shifted to 0 at zero error beside L2, and its gradient beside L2's."""
    fig = new_figure(11, 4.2, fixed)
    zero = int(np.argmin(np.abs(errors)))
    panels = (("loss", loss - loss[zero], "learned - learned(0)", 0.5 * errors**2, "L2: 0.5 e²",
               f"value loss (learned at 0: {loss[zero]:.3g}, range {np.ptp(loss):.3g})"),
              ("d loss / d prediction", grad, "learned", errors, "L2: e", "gradient w.r.t. the prediction"))
    for ax, (name, learned, label, base, base_label, title) in zip(fig.subplots(1, 2), panels):
        lines = ax.plot(errors, base, color=BASELINE, lw=2, label=base_label)
        _error_panel(ax, name, title)
        target = _twin_if_needed(ax, learned, base, f"learned {name}")
        lines += target.plot(errors, learned, color=LEARNED, lw=2,
                             label=label + (" (right axis)" if target is not ax else ""))
        ax.legend(handles=lines, fontsize=8, loc="upper center")
    return fig


def value_loss_progress_figure(errors: np.ndarray, curves: dict, fixed: str = "") -> Figure:
    """The shifted loss and its gradient through training (``curves``: fraction of training done -> (loss, grad))."""
    fig = new_figure(11, 4.2, fixed)
    zero = int(np.argmin(np.abs(errors)))
    left, right = fig.subplots(1, 2)
    for i, (fraction, (loss, grad)) in enumerate(sorted(curves.items())):
        color = colormaps["viridis"](i / max(1, len(curves) - 1))
        left.plot(errors, loss - loss[zero], color=color, lw=2, label=f"{fraction:.0%} of training")
        right.plot(errors, grad, color=color, lw=2)
    left.plot(errors, 0.5 * errors**2, color=BASELINE, lw=1, ls="--", label="L2: 0.5 e²")
    right.plot(errors, errors, color=BASELINE, lw=1, ls="--", label="L2: e")
    for ax, name, title in ((left, "loss - loss(0)", "learned value loss through training"),
                            (right, "d loss / d prediction", "its gradient w.r.t. the prediction")):
        _error_panel(ax, name, title)
        ax.legend(fontsize=8, loc="upper center")
    return fig


def value_loss_heatmap_figure(errors: np.ndarray, other: np.ndarray, loss: np.ndarray, grad: np.ndarray,
                              other_name: str, fixed: str = "") -> Figure:
    """The loss and its gradient over error x another input; ``loss``, ``grad``: (len(other), len(errors))."""
    fig = new_figure(11, 4.2, fixed)
    zero = int(np.argmin(np.abs(errors)))
    for ax, (z, name) in zip(fig.subplots(1, 2), ((loss - loss[:, zero:zero + 1], "learned loss - loss at e=0"),
                                                  (grad, "d loss / d prediction"))):
        fig.colorbar(ax.pcolormesh(errors, other, z, shading="auto", cmap="RdBu_r", norm=_centred(z)), ax=ax)
        ax.set(xlabel=ERROR, ylabel=other_name, title=name)
    return fig


def _centred(z):
    """A colour scale symmetric about 0, so that the sign of ``z`` reads off its colour."""
    lim = (float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 0.0) or 1.0
    return TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)


def policy_objective_figure(ratios: np.ndarray, advantages: np.ndarray, drift: np.ndarray,
                            ppo_drift: np.ndarray, clip_eps: float, note: str = "") -> Figure:
    """Heatmaps over ratio r and advantage A, learned | PPO: the drift, then the objective r A - drift."""
    fig = new_figure(10, 8, note)
    r, a = np.meshgrid(ratios, advantages)
    rows = (("drift", drift, ppo_drift, "magma", None),
            ("objective r·A - drift", r * a - drift, r * a - ppo_drift, "RdBu_r", "centred"))
    for axes, (name, learned, ppo, cmap, norm) in zip(fig.subplots(2, 2), rows):
        both = np.stack([learned, ppo])
        kw = {"norm": _centred(both)} if norm else {"vmin": 0.0, "vmax": max(float(np.nanmax(both)), 1e-6)}
        for ax, z, who in zip(axes, (learned, ppo), ("learned", f"PPO (clip_eps={clip_eps:g})")):
            fig.colorbar(ax.pcolormesh(ratios, advantages, z, shading="auto", cmap=cmap, **kw), ax=ax)
            if np.nanmax(z) > np.nanmin(z):
                ax.contour(ratios, advantages, z, levels=8, colors="k", linewidths=0.4, alpha=0.6)
            for x in (1 - clip_eps, 1 + clip_eps):
                ax.axvline(x, color="white" if cmap == "magma" else "grey", ls="--", lw=0.8)
            ax.set_title(f"{who}: {name}", fontsize=10)
            ax.set(xlabel="ratio r = π / π_old", ylabel="advantage A")
    return fig


def math_label(latex: str) -> str:
    """``$latex$`` when matplotlib's mathtext reads it and it is short enough for a legend line, else ""."""
    if len(latex) > 110:
        return ""
    try:
        MathTextParser("path").parse(f"${latex}$")
    except ValueError:
        return ""
    return f"${latex}$"


def formula_figure(x: np.ndarray, rows: Sequence[Sequence[dict]], xlabel: str, note: str = "") -> Figure:
    """Line panels over ``x``: ``rows`` of ``{title, ylabel, curves: [(label, y, style)]}``, style ``learned``,
    ``formula`` or ``baseline``; one legend below. Learned curve and formulas may get a right axis (_twin_if_needed)."""
    ncols = max(len(r) for r in rows)
    fig = new_figure(5.5 * ncols, 3.6 * len(rows) + 1.2, note, fontsize=8)
    handles = {}
    for i, row in enumerate(rows):
        for j, panel in enumerate(row):
            ax = fig.add_subplot(len(rows), ncols, i * ncols + j + 1)
            by_style = {style: [(label, y) for label, y, s in panel["curves"] if s == style]
                        for style in ("learned", "formula", "baseline")}
            for label, y in by_style["baseline"]:
                handles[label] = ax.plot(x, y, color=BASELINE, lw=1.5)[0]
            target = ax
            if by_style["baseline"] and by_style["learned"]:
                target = _twin_if_needed(ax, by_style["learned"][0][1], by_style["baseline"][0][1],
                                         "learned and formulas (right axis)", fontsize=8)
            for label, y in by_style["learned"]:
                handles[label] = target.plot(x, y, color=LEARNED, lw=2.5)[0]
            for k, (label, y) in enumerate(by_style["formula"]):
                handles[label] = target.plot(x, y, color=FORMULA_COLOURS[k % len(FORMULA_COLOURS)], lw=1.5, ls="--")[0]
            ax.axhline(0, color="grey", lw=0.5)
            ax.set_title(panel["title"], fontsize=9)
            ax.set(xlabel=xlabel, ylabel=panel["ylabel"])
            ax.grid(alpha=0.3)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center", fontsize=8, ncols=1)
    return fig


def hyperparams_figure(generations: Sequence[float], means: dict, lows: Optional[dict], highs: Optional[dict],
                       bounds: dict, log: dict, best: Optional[dict] = None,
                       best_generation: Optional[float] = None, note: str = "") -> Figure:
    """One panel per hyperparameter: the search mean, mean -+ std and bounds per generation, the exported best."""
    fig, axes = _grid(len(means), 4, 3.2, 2.8, note, pad=0.4)
    gens = np.asarray(generations, dtype=float)
    for name, ax in zip(means, axes):
        if lows is not None and highs is not None:
            ax.fill_between(gens, lows[name], highs[name], color=LEARNED, alpha=0.25, lw=0, label="mean -+ std")
        ax.plot(gens, means[name], color=LEARNED, marker="o", ms=3, lw=1.5, label="search mean")
        for b in bounds[name]:
            ax.axhline(b, color="grey", ls=":", lw=0.8)
        if best is not None:
            ax.plot([best_generation if best_generation is not None else gens[-1]], [best[name]], "*",
                    color="tab:green", ms=10, label="exported best")
        ax.set(title=name, yscale="log" if log[name] else "linear")
        _generation_axis(ax, gens)
    axes[0].legend(fontsize=7)
    return fig


def schedule_figure(progress: np.ndarray, curves: dict, baseline: str) -> Figure:
    """One panel per hyperparameter: ``curves[name] = (learned, baseline)`` over the training progress."""
    fig, axes = _grid(len(curves), len(curves), 4.0, 3.2)
    for ax, (name, (learned, own)) in zip(axes, curves.items()):
        ax.plot(progress, learned, color=LEARNED, label="learned")
        ax.plot(progress, own, "--", color=BASELINE, label=baseline)
        ax.set(xlabel="fraction of training done", title=name)
    axes[0].legend(fontsize=7)
    return fig


def learning_curves_figure(frames: np.ndarray, sides: Sequence[tuple], title: str = "") -> Figure:
    """Per side (``sides``: label, colour, returns of shape (seeds, updates)), the mean return per update with its
    95% t-interval."""
    fig = new_figure(7, 4)
    ax = fig.add_subplot()
    for label, colour, c in sides:
        c = np.asarray(c, dtype=float)
        low, high = t_interval(c, axis=0)
        ax.fill_between(frames, low, high, color=colour, alpha=0.25, lw=0)
        ax.plot(frames, np.nanmean(c, axis=0), color=colour, lw=2, label=f"{label} (n={c.shape[0]})")
    ax.set(xlabel="environment frames", ylabel="episode return",
           title=title or "learning curves (mean, 95% CI over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def task_scores_figure(rows: Sequence[dict], aggregates: dict, sides: Sequence[tuple]) -> Figure:
    """Each task's normalised score per side (baseline = 1), and the IQM per split; ``sides``: label, colour, and
    its IQM's part of aggregates[split] (None: the split itself) and key."""
    fig = new_figure(11, 4.2)
    ax, agg = fig.subplots(1, 2, width_ratios=[3, 1])
    x = np.arange(len(rows))
    for offset, (label, color, part, key) in zip(np.linspace(-0.15, 0.15, len(sides)), sides):
        means = np.array([r["normalized"][label] for r in rows])
        lows, highs = np.array([r["normalized_ci95"][label] for r in rows]).T
        ax.errorbar(x + offset, means, yerr=[means - lows, highs - means], fmt="o", color=color, capsize=3, label=label)
        for j, split in enumerate(aggregates.values()):
            numbers = split[part] if part else split
            value, (lo, hi) = numbers[key], numbers[f"{key}_ci95"]
            agg.errorbar([j + offset], [value], yerr=[[value - lo], [hi - value]], fmt="s", color=color, capsize=3)
    for i, r in enumerate(rows):
        if r["split"] == "held-out":
            ax.axvspan(i - 0.5, i + 0.5, color="0.9", zorder=0)
    ax.axhline(1.0, color=BASELINE, lw=0.8, ls="--")
    ax.axhline(0.0, color="0.5", lw=0.8, ls=":")
    # "total_timesteps=" spelled out made neighbouring labels overlap at seven tasks
    ax.set_xticks(x, [r["task"].replace("[", "\n[").replace("total_timesteps=", "T=")
                      + ("\n(held out)" if r["split"] == "held-out" else "") for r in rows], fontsize=7)
    ax.set_ylabel("normalised score (baseline = 1, random = 0)")
    ax.legend(fontsize=8)
    names = list(aggregates)
    agg.set_xticks(np.arange(len(names)), [f"{n}\nP(improve) {aggregates[n]['probability_of_improvement']:.2f}"
                                           for n in names], fontsize=8)
    agg.set_xlim(-0.6, len(names) - 0.4)
    agg.set_title("IQM (stratified bootstrap 95% CI)", fontsize=9)
    return fig


def per_task_figure(rows: Sequence[dict], ks: Sequence[int], per_task: Sequence[tuple],
                    others: Sequence[tuple]) -> Figure:
    """Per task: the final return of PPO tuned on it against its tuning trainings k (``per_task``: label and colour
    of a side per k), the ``others`` (label, colour) as bands."""
    fig, axes = _grid(len(rows), 4, 4.2, 3.0, "final return against tuning trainings per task (95% CIs)")
    per_task, line = [label for label, _ in per_task], per_task[0][1]
    for ax, row in zip(axes, rows):
        for label, colour in others:
            side = row["sides"][label]
            ax.axhspan(*side["ci95"], color=colour, alpha=0.2, lw=0)
            ax.axhline(side["mean"], color=colour, lw=1.5, label=f"{label.split(':')[0]} (no per-task tuning)")
        means = np.array([row["sides"][label]["mean"] for label in per_task])
        lows, highs = np.array([row["sides"][label]["ci95"] for label in per_task]).T
        ax.errorbar(ks, means, yerr=[means - lows, highs - means], fmt="o-", color=line, capsize=3,
                    label="tuned per task")
        for k in ks:
            spread = [t["mean"] for t in row.get("per_task", {}).get(str(k), [])]
            ax.plot([k] * len(spread), spread, ".", color=line, alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(ks), [str(k) for k in ks])
        ax.set(xlabel="trainings per tuning (k)", title=row["task"].replace("[", "\n["))
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("final return")
    axes[0].legend(fontsize=6)
    return fig
