"""The report: efficiency tables, the papers' tables beside ours (Wang, Mohamed & de Freitas
2013; Titsias & Dellaportas 2019; Wang 2012; Alfaki, Subbey & Haugland 2008), the figures
and :func:`write_report` (``jobs.csv``, ``chains.csv``, ``summary.md``, PNG figures).

Efficiency is :meth:`~ahmc_stan.fit.Fit.efficiency` (ArviZ bulk-ESS) on the columns each
paper measured; the box plots use one value per chain, as Wang, Mohamed & de Freitas (2013,
section 5) do.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from .papers import PAPER_GAD, PAPER_ROBOT_ARM, PAPER_SV, PAPER_TALK
from .registry import experiments


# ---- tables ----------------------------------------------------------------------------------

def _fmt(mean: float, sd: float | None = None, digits: str = ".3g") -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    text = format(mean, digits)
    return text if sd is None or math.isnan(sd) else f"{text} ± {format(sd, digits)}"


def _ok(jobs):
    return jobs[jobs["error"] == ""] if "error" in jobs else jobs


def efficiency_table(jobs, experiment: str):
    """Mean over repeats of each sampler's efficiency on one experiment, with the ratio to
    NUTS per gradient and per second (> 1: better than NUTS)."""
    import pandas as pd

    from ..comparison import to_markdown

    sub = jobs[jobs["experiment"] == experiment]
    fields = ["min_ess_bulk", "median_ess_bulk", "min_ess_per_grad", "min_ess_per_grad_total",
              "min_ess_per_s", "min_ess_per_s_total", "max_rhat", "accept_rate",
              "wall_seconds"]
    ok = _ok(sub)
    mean = ok.groupby("sampler", sort=False)[[f for f in fields if f in ok]].mean()
    nuts = mean.loc["nuts"] if "nuts" in mean.index else None
    for f, col in (("min_ess_per_grad", "per grad / NUTS"), ("min_ess_per_s", "per s / NUTS")):
        mean[col] = mean[f] / nuts[f] if nuts is not None and f in mean else math.nan
    failed = sub[sub["error"] != ""].groupby("sampler")["error"].first()
    for label, err in failed.items():
        if label not in mean.index:
            mean.loc[label] = math.nan
    mean["error"] = [failed.get(label, "") for label in mean.index]
    mean = mean.sort_values("min_ess_per_grad", ascending=False, na_position="last")
    mean.index.name = "sampler"
    return mean, to_markdown(pd.DataFrame(mean), floatfmt=".3g")


#: Above this max R-hat (of the sampler or of NUTS) a ratio is flagged: ESS of chains that
#: have not mixed means little.
RHAT_WARNING = 1.1


def overview_table(jobs) -> str:
    """One row per experiment, one column per sampler: min ESS per gradient and per second
    relative to NUTS (``per grad / per s``; > 1 is better than NUTS; ``–`` where the
    sampler uses no gradients or did not run); flagged with the worse max R-hat of the two
    when it exceeds :data:`RHAT_WARNING`."""
    cells: dict[str, dict[str, str]] = {}
    samplers: list[str] = []
    for exp in dict.fromkeys(jobs["experiment"]):
        table, _ = efficiency_table(jobs, exp)
        for label, row in table.iterrows():
            if label == "nuts":
                continue
            samplers = list(dict.fromkeys([*samplers, label]))
            text = "failed" if row["error"] else \
                f"{_fmt(row['per grad / NUTS'])} / {_fmt(row['per s / NUTS'])}"
            worst = max(row.get("max_rhat", math.nan), table["max_rhat"].get("nuts", math.nan))
            if worst > RHAT_WARNING:
                text += f" (R̂ {worst:.2g})"
            cells.setdefault(exp, {})[label] = text
    lines = ["| experiment | " + " | ".join(samplers) + " |",
             "|---|" + "---:|" * len(samplers)]
    lines += [f"| {exp} | " + " | ".join(row.get(s, "–") for s in samplers) + " |"
              for exp, row in cells.items()]
    return "\n".join(lines)


def _per_chain_stats(chains, experiment: str, sampler: str, scale: float = 1.0):
    sub = chains[(chains["experiment"] == experiment) & (chains["sampler"] == sampler)]
    return [(float(sub[c].mean() * scale), float(sub[c].std(ddof=1) * scale) if len(sub) > 1
             else math.nan) for c in ("min_ess_per_grad", "median_ess_per_grad",
                                      "max_ess_per_grad")] if len(sub) else None


def sv_table(chains) -> str:
    """Wang et al. (2013) Table 1 beside ours: ESS per leapfrog ×10³ (mean ± sd over
    chains), minimum / median / maximum over x, β, φ, σ²."""
    lines = ["| sampler | source | minimum | median | maximum |", "|---|---|---:|---:|---:|"]
    samplers = list(dict.fromkeys(["ahmc", "nuts", *chains[chains["experiment"] == "sv"]
                                   ["sampler"]]))
    for s in samplers:
        if s in PAPER_SV:
            lines.append(f"| {s} | paper | " + " | ".join(_fmt(m, sd, ".2g") for m, sd in
                                                           PAPER_SV[s]) + " |")
        ours = _per_chain_stats(chains, "sv", s, 1e3)
        if ours:
            lines.append(f"| {s} | ours | " + " | ".join(_fmt(m, sd, ".3g") for m, sd in ours)
                         + " |")
    return "\n".join(lines)


def gad_table(jobs) -> str:
    """Titsias & Dellaportas (2019) Table 1 beside ours.  Ours: time and ESS per chain
    (a paper run is one chain of 2·10⁴ draws), min ESS/s = pooled min ESS / total time;
    HMC-L is the best of HMC-5/10/20, as in the paper."""
    lines = ["| experiment | method | source | time (s) | accept | ESS (min, med, max) "
             "| min ESS/s |", "|---|---|---|---:|---:|---|---:|"]
    ok = _ok(jobs)
    for exp, rows in PAPER_GAD.items():
        sub = ok[ok["experiment"] == exp]
        for label, (paper_label, t, acc, ess, ess_s) in rows.items():
            lines.append(f"| {exp} | {paper_label} | paper | {t} | {_fmt(acc)} | "
                         f"({', '.join(f'{v:g}' for v in ess)}) | {_fmt(*ess_s)} |")
            mine = sub[sub["sampler"].str.startswith(label + "-") if label == "hmc"
                       else sub["sampler"] == label]
            if mine.empty:
                continue
            if label == "hmc":
                best = mine.groupby("sampler")["min_ess_per_s_total"].mean().idxmax()
                mine = mine[mine["sampler"] == best]
            per_chain = mine["chains"]
            time_chain = ((mine["time_warmup"] + mine["time_sampling"]) / per_chain).mean()
            ess = [(mine[f"{s}_ess_bulk"] / per_chain).mean() for s in ("min", "median", "max")]
            rate = mine["min_ess_per_s_total"]
            lines.append(f"| {exp} | {mine['sampler'].iloc[0]} | ours | {time_chain:.3g} | "
                         f"{mine['accept_rate'].mean():.3f} | "
                         f"({', '.join(f'{v:.4g}' for v in ess)}) | "
                         f"{_fmt(rate.mean(), rate.std(ddof=1) if len(rate) > 1 else None)} |")
    return "\n".join(lines)


def robot_arm_table(jobs) -> str:
    """Wang (2012) Table 4.1 beside our test MSE (:func:`predictive_mse`, mean over
    repeats)."""
    lines = ["| method | source | test MSE |", "|---|---|---:|"]
    lines += [f"| {k} | paper | {v:g} |" for k, v in PAPER_ROBOT_ARM.items()]
    sub = _ok(jobs[jobs["experiment"] == "robot_arm"])
    if "test_mse" in sub:
        for s, v in sub.groupby("sampler", sort=False)["test_mse"].mean().items():
            lines.append(f"| {s} | ours | {v:.5f} |")
    return "\n".join(lines)


def talk_table(jobs) -> str:
    """Alfaki et al. (2008) N_eff/N beside ours (median bulk-ESS / draws, pooled chains)."""
    lines = ["| experiment | sampler | paper N_eff / N | ours median ESS / N |",
             "|---|---|---:|---:|"]
    ok = _ok(jobs)
    for exp, rows in PAPER_TALK.items():
        sub = ok[ok["experiment"] == exp]
        for s in dict.fromkeys([*rows, *sub["sampler"]]):
            mine = sub[sub["sampler"] == s]
            ours = (mine["median_ess_bulk"] / (mine["chains"] * mine["draws"])).mean() \
                if len(mine) else math.nan
            paper = rows.get(s, math.nan) / 2000
            if len(mine) or s in rows:
                lines.append(f"| {exp} | {s} | {_fmt(paper)} | {_fmt(ours)} |")
    return "\n".join(lines)


def sensitivity_table(results) -> str:
    """Figure 1 of Wang et al. (2013) in numbers."""
    lines = ["| ε | L | accept (paper: ≈ 0.7 for all three) | min ESS of 1000 | "
             "min ESS / grad |", "|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['step_size']} | {r['num_steps']} | {r['accept_rate']:.3f} | "
                     f"{r['min_ess']:.1f} | {r['min_ess_per_grad']:.2e} |")
    return "\n".join(lines)


# ---- figures ---------------------------------------------------------------------------------

def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_logistic(chains, path: Path) -> None:
    """Wang et al. (2013) Figure 2: per-chain min / median / max ESS per gradient, one
    group of boxes per data set, one box per sampler."""
    plt = _pyplot()
    sub = chains[chains["experiment"].isin(
        [e for e, x in experiments().items() if x.group == "logistic"])]
    sets = list(dict.fromkeys(sub["experiment"]))
    samplers = list(dict.fromkeys(sub["sampler"]))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=False)
    width = 0.8 / max(len(samplers), 1)
    for ax, stat in zip(axes, ("min", "median", "max")):
        for k, s in enumerate(samplers):
            data = [sub[(sub["experiment"] == e) & (sub["sampler"] == s)]
                    [f"{stat}_ess_per_grad"].dropna().to_numpy() for e in sets]
            pos = [i + (k - (len(samplers) - 1) / 2) * width for i in range(len(sets))]
            keep = [(p, d) for p, d in zip(pos, data) if len(d)]
            if keep:
                bp = ax.boxplot([d for _, d in keep], positions=[p for p, _ in keep],
                                widths=width * 0.9, patch_artist=True)
                for box in bp["boxes"]:
                    box.set_facecolor(f"C{k}")
            ax.plot([], [], color=f"C{k}", lw=6, label=s)
        ax.set_xticks(range(len(sets)), sets)
        ax.set_yscale("log")
        ax.set_title(f"{stat} ESS per gradient")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lgcp(fields: dict, truth: tuple[dict, np.ndarray], path: Path) -> None:
    """Wang et al. (2013) Figure 4: the true latent field and the counts, then the
    posterior mean and variance of x by each sampler."""
    plt = _pyplot()
    data, x_true = truth
    d = int(round(math.sqrt(data["n"])))
    grid = lambda v: np.asarray(v).reshape(d, d, order="F")  # noqa: E731
    rows = [("truth", [("latent field x", x_true), ("counts y", data["y"])])]
    rows += [(s, [("posterior mean of x", m), ("posterior variance of x", v)])
             for s, (m, v) in fields.items()]
    fig, axes = plt.subplots(len(rows), 2, figsize=(7, 3.2 * len(rows)), squeeze=False)
    lo, hi = float(np.min(x_true)), float(np.max(x_true))
    for (name, panels), ax_row in zip(rows, axes):
        for (title, values), ax in zip(panels, ax_row):
            kw = {"vmin": lo, "vmax": hi} if "mean" in title or "field" in title else {}
            im = ax.imshow(grid(values), origin="lower", **kw)
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sensitivity(results, path: Path) -> None:
    """Wang et al. (2013) Figure 1: trajectories and autocorrelations of HMC at three
    nearby (ε, L)."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(results), figsize=(4 * len(results), 7), squeeze=False)
    for k, r in enumerate(results):
        x = r["draws"]
        ax = axes[0, k]
        ax.plot(x[:, 0], x[:, 1], "-", lw=0.3, color="0.6")
        ax.plot(x[:, 0], x[:, 1], ".", ms=2)
        ax.set_title(f"ε = {r['step_size']}, L = {r['num_steps']}, "
                     f"accept {r['accept_rate']:.2f}", fontsize=9)
        ax.set_aspect("equal")
        ax = axes[1, k]
        for j, acf in enumerate(r["acf"]):
            ax.bar(np.arange(len(acf)) + 0.4 * j, acf, width=0.4, label=f"x{j + 1}")
        ax.set_xlabel("lag")
        ax.set_ylim(-1, 1)
        ax.legend(fontsize=8)
    axes[1, 0].set_ylabel("autocorrelation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(target: Path, jobs, chains, *, fields=None, sensitivity=None, lgcp=None,
                 figures: bool = True, notes: Sequence[str] = ()) -> dict[str, str]:
    """Write ``jobs.csv``, ``chains.csv``, ``summary.md`` and the figures; return the
    markdown tables by name."""
    target = Path(target)
    jobs.to_csv(target / "jobs.csv", index=False)
    chains.to_csv(target / "chains.csv", index=False)
    tables: dict[str, str] = {}
    sections = []
    for exp in dict.fromkeys(jobs["experiment"]):
        _, md = efficiency_table(jobs, exp)
        tables[f"efficiency:{exp}"] = md
        sections.append(f"### {exp}\n\n{experiments()[exp].source}.\n\n{md}\n")
    done = set(jobs["experiment"])
    tables["overview"] = overview_table(jobs)
    if "sv" in done:
        tables["sv"] = sv_table(chains)
    if done & set(PAPER_GAD):
        tables["gad"] = gad_table(jobs)
    if done & set(PAPER_TALK):
        tables["talk"] = talk_table(jobs)
    if "robot_arm" in done:
        tables["robot_arm"] = robot_arm_table(jobs)
    if sensitivity is not None:
        tables["sensitivity"] = sensitivity_table(sensitivity)
    titles = {"overview": "Min ESS relative to NUTS, per gradient / per second (warmup "
                          "excluded; > 1: better than NUTS)",
              "sv": "Stochastic volatility: ESS per leapfrog ×10³ (Wang et al. 2013, "
                    "Table 1)",
              "gad": "gadMALA table (Titsias & Dellaportas 2019, Table 1)",
              "talk": "Standard normals (Alfaki et al. 2008)",
              "robot_arm": "Robot arm test MSE (Wang 2012, Table 4.1)",
              "sensitivity": "HMC's sensitivity to (ε, L) on the 2-d Gaussian "
                             "(Wang et al. 2013, Figure 1)"}
    papers = [f"## {titles[k]}\n\n{tables[k]}\n" for k in titles if k in tables]
    figs = []
    if figures:
        if any(experiments().get(e) and experiments()[e].group == "logistic" for e in done) \
                and len(chains):
            plot_logistic(chains, target / "logistic_ess.png")
            figs.append("logistic_ess.png")
        if fields and lgcp is not None:
            plot_lgcp(fields, lgcp, target / "lgcp_field.png")
            figs.append("lgcp_field.png")
        if sensitivity is not None:
            plot_sensitivity(sensitivity, target / "sensitivity.png")
            figs.append("sensitivity.png")
    text = ["# Results\n",
            "Efficiency on the measured columns (ArviZ bulk-ESS); per grad / NUTS and per s / "
            "NUTS > 1 mean better than NUTS.  Means over repeats.\n",
            *(f"- {n}" for n in notes), "" if notes else None,
            *papers, "## Efficiency per experiment\n", *sections,
            *(f"![{f}]({f})\n" for f in figs)]
    (target / "summary.md").write_text("\n".join(t for t in text if t is not None))
    return tables
