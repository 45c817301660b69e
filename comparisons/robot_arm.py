"""Robot-arm regression with the GP-bandit sampler (Wang 2012, MSc thesis, §4.1, Table 4.1,
Figures 4.1–4.3), next to hand-set HMC and CmdStan's NUTS at an equal leapfrog budget.

    python comparisons/robot_arm.py            # reduced budget: ~6 min per HMC method,
                                               # ~10 min NUTS (2 busy cores)
    python comparisons/robot_arm.py --full     # the thesis's budget, 12× that
                                               # (--skip-nuts leaves NUTS out)

The data are ``robot_arm_data(seed)``: 200 training and 200 test cases.  Each method
samples the ``--folds`` networks of 8-fold cross-validation on the training cases (each
conditioned on 7/8 of them; ``stan_models/robot_arm.stan``, 16 hidden units):

* **bandit** — Algorithm 3: super-transitions of ``--budget`` leapfrog steps per network,
  the cross-validation reward of each one (held-out MSE from that super-transition's
  draws only), the thesis's tuner (:data:`~ahmc_stan.samplers.bandit.THESIS_TUNING`);
* **hand-set HMC** — the same super-transitions at one fixed γ: the scale phase's
  dual-averaged ε* (80 % acceptance, Stan's rule) and ``--hand-steps`` leapfrog steps
  (Neal's trajectories of 100 steps); the bandit starts from this γ too;
* **NUTS** — CmdStan, one chain per network, cut where its leapfrog steps (warmup
  included) reach the bandit's per-network total.

Both HMC runs start with the same scale phase (``--scale-iterations`` iterations of at most
``--scale-steps`` steps: per network a diagonal metric and ε*), counted in the budget.
Test MSE (mean over cases of the squared error summed over both outputs, the convention
of Table 4.1): per network, of the posterior predictive mean over the draws made after
``--discard`` of the network's leapfrog budget was spent (the thesis discards the first
6000 samples); reported as mean ± sd and median over the networks, and for the ensemble
(the networks' predictions averaged).

Budgets.  The thesis: 200 super-transitions of 24000 leapfrog steps (4.8 M per network,
Neal's 150 × 32000), box ε ∈ [0.01, 1.01] (a factor on Neal's heuristic step sizes),
L ∈ [20, 5020].  Here ``--full`` runs 200 × 24000 with L ∈ [20, 5020]; the default runs
100 × 4000 with the L box scaled by 4000/24000.  ε's box is [ε*/10, 3ε*] in the units of
the adapted metrics (the thesis's box spans ~1/20 to ~5 times a typical factor 0.2).

Outputs in ``comparisons/results/robot_arm/``: ``results.json``, ``results.md`` (the
table), ``reward_surface.png`` (Fig. 4.1), ``reward_slice.png`` (Fig. 4.2: GP mean ± sd
and the acquisition along L = the final γ's L), ``test_mse_trace.png`` (Fig. 4.3).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ahmc_stan import StanModel, run_nuts  # noqa: E402
from ahmc_stan.datasets import robot_arm_data, robot_arm_function  # noqa: E402
from ahmc_stan.rewards import (CrossValidation, fold_models, mean_squared_error,  # noqa: E402
                               predictions)
from ahmc_stan.samplers.bandit import run_rounds  # noqa: E402
from ahmc_stan.tuning import Box, Dimension  # noqa: E402

STAN_FILE = ROOT / "stan_models" / "robot_arm.stan"
OUT = ROOT / "comparisons" / "results" / "robot_arm"
THESIS_TABLE = [  # Table 4.1 of the thesis
    ("Rios Insua and Müller's MLP with reversible-jump MCMC", "0.00620"),
    ("MacKay's Gaussian approximation with highest evidence", "0.00573"),
    ("Neal's HMC (hand-tuned)", "0.00554"),
    ("Neal's HMC with ARD", "0.00549"),
    ("Reversible-jump MCMC, Andrieu et al.", "0.00502"),
    ("Adaptive HMC (median error)", "0.00499"),
    ("Adaptive HMC (mean error)", "0.00498 ± 0.00012"),
]


def neal_start(model: StanModel, rng: np.random.Generator) -> dict:
    """Neal's ``net-gen fix 0.5`` start: every prior sd and the noise sd 0.5; weights
    small (N(0, 0.1²)) rather than 0, so that the hidden units differ."""
    H = int(model.data["H"])
    tau = 1 / 0.5**2
    return {
        "W1": rng.normal(0, 0.1, (2, H)), "b1": rng.normal(0, 0.1, H),
        "W2": rng.normal(0, 0.1, (H, 2)), "b2": rng.normal(0, 0.1, 2),
        "tau_W1": tau, "tau_b1": tau, "tau_W2": tau, "tau_noise": tau}


def test_mse(test_model, positions_per_net, y_test, rng):
    """(per-network MSE, ensemble MSE, per-network predictive means) on the test set."""
    if min(len(x) for x in positions_per_net) == 0:
        raise ValueError("a network has no draws after the discarded part of the budget")
    means = [predictions(test_model, x, "y_pred", rng).mean(axis=0) for x in positions_per_net]
    per_net = [mean_squared_error(m, y_test) for m in means]
    return per_net, mean_squared_error(np.mean(means, axis=0), y_test), means


def kept_rows(n_grad: np.ndarray, discard: float) -> slice:
    """The iterations made after ``discard`` of the chain's leapfrog steps."""
    spent = np.cumsum(n_grad)
    return slice(int(np.searchsorted(spent, discard * spent[-1], side="right")), len(n_grad))


def run_hmc(models, x0s, args, *, tune: bool, box, initial):
    """Bandit (tune=True) or hand-set HMC (tune=False) on the fold networks."""
    cv = CrossValidation(models, [np.asarray(m.data["y_test"]) for m in models], "y_pred",
                         rng=args.seed)
    started = time.perf_counter()
    result = run_rounds(models, np.random.default_rng(args.seed), x0s, args.rounds,
                        args.budget, reward=lambda product: (lambda rnd: cv(rnd.positions)),
                        scale_iterations=args.scale_iterations, max_num_steps=args.scale_steps,
                        box=box, initial=initial, tune=tune,
                        progress=_progress("bandit" if tune else "hand-set", args.rounds))
    return result, cv.errors, time.perf_counter() - started


def _progress(name, total):
    def report(n):
        print(f"\r  {name}: {n}/{total} super-transitions", end="", flush=True)
        if n >= total:
            print()
    return report


def run_nuts_folds(models, inits, budget_per_net, args):
    """CmdStan NUTS per fold network, cut at the budget; returns per network the
    unconstrained draws after warmup, their leapfrog counts (warmup included), seconds
    and the number of warmup iterations.  A run that falls short of the budget is redone
    with more draws (same seed: the same chain, longer)."""
    def one(j):
        draws = math.ceil(1.2 * budget_per_net / 1023)  # NUTS at max treedepth 10
        for _ in range(4):
            fit = run_nuts(models[j], chains=1, warmup=args.nuts_warmup, draws=draws,
                           seed=args.seed + j, max_treedepth=10, parallel_chains=1,
                           inits=inits[j])
            n_grad = np.concatenate([fit.warmup_sampler_stats["n_grad"][0],
                                     fit.sampler_stats["n_grad"][0]])
            if n_grad.sum() >= budget_per_net:
                break
            draws = math.ceil(1.2 * draws * budget_per_net / n_grad.sum())
        n_warm = fit.warmup_draws.shape[1]
        n_total = int(np.searchsorted(np.cumsum(n_grad), budget_per_net, side="right"))
        thetas = fit.draws[0, :max(n_total - n_warm, 0), :fit.n_params]
        positions = np.array([models[j].unconstrain(t) for t in thetas]
                             ).reshape(-1, models[j].dims)
        return positions, n_grad[:n_total], fit.time_warmup + fit.time_sampling, n_warm

    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        return list(pool.map(one, range(len(models))))


def figures(tuner, out: Path):
    """Fig. 4.1 (GP mean reward over the box with the tried γ) and Fig. 4.2 (slice with
    ±1 sd and the acquisition) from the bandit's own GP."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    box = tuner.box
    tried = np.array([[h.gamma["step_size"], h.gamma["num_steps"]] for h in tuner.history])
    eps = np.linspace(box.dims[0].low, box.dims[0].high, 80)
    steps = np.linspace(box.dims[1].low, box.dims[1].high, 80)
    grid = np.array([[e, s] for e in eps for s in steps])
    unit = np.array([box.to_unit(g) for g in grid])
    mean = tuner.gp.predict(unit, return_var=False).reshape(len(eps), len(steps))
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    cs = ax.contourf(eps, steps, mean.T, levels=20, cmap="viridis")
    fig.colorbar(cs, ax=ax, label="GP mean reward")
    unique, counts = np.unique(tried, axis=0, return_counts=True)
    ax.scatter(unique[:, 0], unique[:, 1], s=10 + 6 * counts, c="white", edgecolors="k",
               label="tried (ε, L), size ∝ rounds")
    ax.set_xlabel("step size ε")
    ax.set_ylabel("leapfrog steps L")
    ax.set_title("Learned mean reward (thesis Fig. 4.1)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "reward_surface.png", dpi=120)
    plt.close(fig)

    L = tuner.propose()["num_steps"]
    line = np.array([box.to_unit([e, L]) for e in eps])
    mu, var = tuner.gp.predict(line)
    sd = np.sqrt(var)
    acq = tuner.acquisition(line)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 5.6), sharex=True)
    top.fill_between(eps, mu - sd, mu + sd, color="C0", alpha=0.3, label="± 1 sd")
    top.plot(eps, mu, color="C3", label="GP mean")
    at = tried[:, 1] == L
    top.scatter(tried[at, 0], [h.reward for h, a in zip(tuner.history, at) if a], s=12,
                c="k", label="rewards at this L")
    top.set_ylabel("reward")
    top.set_title(f"Slice at L = {L} (thesis Fig. 4.2)")
    top.legend(fontsize=8)
    bottom.plot(eps, acq, color="C2")
    bottom.set_ylabel("acquisition ū")
    bottom.set_xlabel("step size ε")
    fig.tight_layout()
    fig.savefig(out / "reward_slice.png", dpi=120)
    plt.close(fig)


def mse_trace(test_model, positions, y_test, rng, out: Path):
    """Fig. 4.3: mean over networks of the test MSE of the running predictive mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = min(len(x) for x in positions)
    curves = []
    for x in positions:
        pred = predictions(test_model, x[:n], "y_pred", rng)
        running = np.cumsum(pred, axis=0) / np.arange(1, n + 1)[:, None, None]
        curves.append(np.sum((running - y_test) ** 2, axis=2).mean(axis=1))
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(np.arange(1, n + 1), np.mean(curves, axis=0))
    ax.set_xlabel("samples used (after the discarded part)")
    ax.set_ylabel("test MSE (mean over networks)")
    ax.set_title("Bandit: test error given the number of samples (thesis Fig. 4.3)")
    fig.tight_layout()
    fig.savefig(out / "test_mse_trace.png", dpi=120)
    plt.close(fig)


def summarize(name, per_net, ensemble, leapfrog, seconds, gamma=None) -> dict:
    return {"method": name, "mse_mean": float(np.mean(per_net)),
            "mse_sd": float(np.std(per_net, ddof=1)), "mse_median": float(np.median(per_net)),
            "mse_ensemble": float(ensemble), "mse_per_network": [float(v) for v in per_net],
            "leapfrog_per_network": int(leapfrog), "seconds": float(seconds),
            "final_gamma": gamma}


def markdown(rows, args, floor: float) -> str:
    lines = [f"Robot arm (data seed {args.seed}), {args.folds} networks ({args.folds}-fold CV "
             f"on 200 training cases), test MSE on 200 test cases; {args.rounds} "
             f"super-transitions × {args.budget} leapfrog steps per network (+ scale phase); "
             f"draws after {args.discard:.0%} of each network's budget kept.  The test "
             f"set's own noise gives MSE {floor:.5f} for the true function (nominal "
             f"2 × 0.05² = 0.005).", "",
             "| method | test MSE mean ± sd | median | ensemble | leapfrog / network | "
             "seconds | final (ε, L) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["final_gamma"]
        lines.append(f"| {r['method']} | {r['mse_mean']:.5f} ± {r['mse_sd']:.5f} | "
                     f"{r['mse_median']:.5f} | {r['mse_ensemble']:.5f} | "
                     f"{r['leapfrog_per_network']:,} | {r['seconds']:.0f} | "
                     f"{'' if g is None else f'({g[0]:.4g}, {g[1]})'} |")
    lines += ["", "Thesis, Table 4.1 (4.8 M leapfrog steps per network):", "",
              "| method | test MSE |", "|---|---|"]
    lines += [f"| {m} | {v} |" for m, v in THESIS_TABLE]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="thesis budget: 200 × 24000")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--budget", type=int, default=4000)
    parser.add_argument("--folds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scale-iterations", type=int, default=150)
    parser.add_argument("--scale-steps", type=int, default=100)
    parser.add_argument("--hand-steps", type=int, default=100)
    parser.add_argument("--discard", type=float, default=0.5)
    parser.add_argument("--nuts-warmup", type=int, default=150)
    parser.add_argument("--skip-nuts", action="store_true")
    parser.add_argument("--jobs", type=int, default=2, help="parallel NUTS runs")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.full:
        args.rounds, args.budget = 200, 24000
    args.out.mkdir(parents=True, exist_ok=True)

    data = robot_arm_data(args.seed)
    full = StanModel(STAN_FILE, data, stanc_args=["--O1"])  # x_test: the 200 test cases
    models, _ = fold_models(full, args.folds, case_vars=["x", "y"], target="y_test")
    init_rng = np.random.default_rng(args.seed)
    inits = [neal_start(m, init_rng) for m in models]
    x0s = [m.unconstrain(i) for m, i in zip(models, inits)]
    scale = args.budget / 24000  # the thesis's L box at its budget
    l_low, l_high = max(1, round(20 * scale)), max(2, round(5020 * scale))
    box = lambda eps: Box([Dimension("step_size", eps / 10, 3 * eps),
                           Dimension("num_steps", l_low, l_high, integer=True)])
    hand = lambda eps: {"step_size": eps, "num_steps": int(np.clip(args.hand_steps, l_low, l_high))}
    y_test = np.asarray(data["y_test"])
    rng = np.random.default_rng(args.seed + 100)
    rows, report = [], {"args": {k: str(v) for k, v in vars(args).items()}}

    for name, tune in [("bandit (Algorithm 3, CV reward)", True), ("hand-set HMC", False)]:
        print(f"{name} ...", flush=True)
        result, cv_errors, seconds = run_hmc(models, x0s, args, tune=tune, box=box,
                                              initial=hand)
        kept = [c.positions[kept_rows(c.stats["n_grad"], args.discard)] for c in result.chains]
        per_net, ensemble, _ = test_mse(full, kept, y_test, rng)
        spent = np.mean([c.stats["n_grad"].sum() for c in result.chains])
        scheduled = int(result.chains[0].stats["n_grad"][:args.scale_iterations].sum()
                        + args.rounds * args.budget)  # a trajectory stopped at a non-
        # finite density (then rejected) spends fewer gradients than scheduled
        gamma = result.tuner.propose()
        rows.append(summarize(name, per_net, ensemble, spent, seconds,
                              (gamma["step_size"], gamma["num_steps"])))
        report[name] = {"cv_errors": cv_errors, "reference_step_sizes":
                        result.reference_step_sizes,
                        "history": [{"gamma": h.gamma, "reward": h.reward, "p": h.p,
                                     "moved": h.moved} for h in result.tuner.history],
                        "kept_draws_per_network": [len(k) for k in kept],
                        "scheduled_leapfrog_per_network": scheduled,
                        "gradients_per_network": [int(c.stats["n_grad"].sum())
                                                  for c in result.chains]}
        if tune:
            figures(result.tuner, args.out)
            mse_trace(full, kept, y_test, rng, args.out)
            budget_per_net = scheduled
        print(f"  test MSE {rows[-1]['mse_mean']:.5f} ± {rows[-1]['mse_sd']:.5f}, "
              f"ensemble {ensemble:.5f}, {seconds:.0f} s", flush=True)

    if not args.skip_nuts:
        print("NUTS (CmdStan) ...", flush=True)
        runs = run_nuts_folds(models, inits, budget_per_net, args)
        kept, spent, seconds = [], [], 0.0
        for positions, n_grad, secs, n_warm in runs:
            rows_kept = kept_rows(n_grad, args.discard)
            kept.append(positions[max(rows_kept.start - n_warm, 0):])
            spent.append(int(n_grad.sum()))
            seconds += secs
        per_net, ensemble, _ = test_mse(full, kept, y_test, rng)
        rows.append(summarize("NUTS (CmdStan 2.27)", per_net, ensemble, np.mean(spent),
                              seconds))
        report["NUTS"] = {"leapfrog_per_network": spent,
                          "kept_draws_per_network": [len(k) for k in kept]}
        print(f"  test MSE {rows[-1]['mse_mean']:.5f} ± {rows[-1]['mse_sd']:.5f}, "
              f"ensemble {ensemble:.5f}", flush=True)

    report["rows"] = rows
    (args.out / "results.json").write_text(json.dumps(report, indent=1, default=float))
    floor = mean_squared_error(robot_arm_function(np.asarray(data["x_test"])), y_test)
    report["noise_floor_mse"] = floor
    table = markdown(rows, args, floor)
    (args.out / "results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
