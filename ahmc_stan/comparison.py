"""Side-by-side efficiency of several fits of one model, relative to CmdStan's NUTS.

``compare({"nuts": nuts_fit, "ahmc": ahmc_fit, ...})`` tabulates every fit's
:meth:`Fit.efficiency` (ESS computed identically for every sampler), ranks the rows by
``min_ess_per_grad`` (best first; ``nan`` last) and adds ratio columns to the NUTS row:
``min_ess_per_grad / NUTS``, ``min_ess_per_grad_total / NUTS`` and
``min_ess_per_s / NUTS`` (> 1 means better than NUTS).  The NUTS row is the key named
``"nuts"`` (any case), else the fit whose ``sampler`` is ``"nuts"``.

An ESS means nothing when the chains have not converged, so every fit is also run through
:func:`ahmc_stan.convergence.diagnose`: columns ``converged`` (no R-hat > 1.01, no bulk or
tail ESS < 100 per chain, no stuck chain, divergences in at most 1% of the post-warmup
iterations) and ``problems`` (short text of every problem found, warnings such as E-BFMI,
max tree depth or step-size spread included; "" when none).  Fits that have not converged
rank last (each group ordered by ``min_ess_per_grad``); their ratio columns stay, and
:func:`to_markdown` marks them with `` *`` and a note under the table.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .fit import Fit

__all__ = ["compare", "to_markdown", "RATIO_COLUMNS"]

#: efficiency() field → name of its ratio-to-NUTS column.
RATIO_COLUMNS = {
    "min_ess_per_grad": "min_ess_per_grad / NUTS",
    "min_ess_per_grad_total": "min_ess_per_grad_total / NUTS",
    "min_ess_per_s": "min_ess_per_s / NUTS",
}


def _nuts_key(fits: Mapping[str, Fit]) -> str | None:
    for key in fits:
        if str(key).lower() == "nuts":
            return key
    for key, fit in fits.items():
        if str(fit.sampler).lower() == "nuts":
            return key
    return None


def compare(fits: Mapping[str, Fit]) -> "pandas.DataFrame":  # noqa: F821
    """One row per fit (indexed by the dict's keys), columns ``sampler``, ``incomplete``,
    ``converged``, ``problems``, the :meth:`Fit.efficiency` fields and, when a NUTS fit
    is present, the ratio columns of :data:`RATIO_COLUMNS`; converged fits first, each
    group sorted by ``min_ess_per_grad`` descending (``nan`` last)."""
    import pandas as pd

    if not fits:
        raise ValueError("compare() needs at least one fit")
    rows = {}
    for key, fit in fits.items():
        diagnosis = fit.diagnose()
        rows[str(key)] = {"sampler": fit.sampler, "incomplete": fit.incomplete,
                          "converged": diagnosis.converged, "problems": diagnosis.summary(),
                          **fit.efficiency()}
    df = pd.DataFrame.from_dict(rows, orient="index")
    df.index.name = "fit"
    nuts = _nuts_key(fits)
    if nuts is not None:
        base = df.loc[str(nuts)]
        for field, column in RATIO_COLUMNS.items():
            ref = float(base[field])
            df[column] = [float(v) / ref if ref > 0 and math.isfinite(ref) else math.nan
                          for v in df[field]]
    df = df.sort_values("min_ess_per_grad", ascending=False, na_position="last",
                        kind="stable")
    return df.sort_values("converged", ascending=False, kind="stable")


def _format(value, floatfmt: str) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if math.isnan(value):
            return "nan"
        if value == int(value) and abs(value) < 1e15 and floatfmt.endswith("g"):
            return str(int(value))
        return format(value, floatfmt)
    return str(value).replace("|", "\\|")


def to_markdown(df: "pandas.DataFrame", *, columns: list[str] | None = None,  # noqa: F821
                floatfmt: str = ".4g", index: bool = True) -> str:
    """A GitHub-flavoured Markdown pipe table of ``df`` (no ``tabulate`` needed).

    ``columns`` selects and orders columns; floats use ``floatfmt`` (integral values are
    printed as integers); numeric columns are right-aligned.  When ``df`` has a
    ``converged`` column (:func:`compare`), the rows that have not converged get a
    trailing `` *`` on their label (first cell) and a note under the table lists them
    with their ``problems``, whatever ``columns`` shows.
    """
    import pandas as pd

    unconverged = ([not bool(v) for v in df["converged"]] if "converged" in df.columns
                   else [False] * len(df))
    notes = [f"{_format(label, floatfmt)} ({df['problems'].iloc[i]})"
             if "problems" in df.columns and df["problems"].iloc[i]
             else _format(label, floatfmt)
             for i, label in enumerate(df.index) if unconverged[i]]
    if columns is not None:
        df = df[columns]
    heads = ([str(df.index.name or "")] if index else []) + [str(c) for c in df.columns]
    numeric = ([pd.api.types.is_numeric_dtype(df.index.dtype)] if index else []) + \
        [pd.api.types.is_numeric_dtype(df[c].dtype) and not pd.api.types.is_bool_dtype(
            df[c].dtype) for c in df.columns]
    body = []
    for label, row in zip(df.index, df.itertuples(index=False)):
        cells = ([_format(label, floatfmt)] if index else []) + \
            [_format(v, floatfmt) for v in row]
        if unconverged[len(body)] and cells:
            cells[0] += " *"
        body.append(cells)
    widths = [max([len(h), 3] + [len(r[i]) for r in body]) for i, h in enumerate(heads)]

    def line(cells):
        return "| " + " | ".join(
            c.rjust(w) if num else c.ljust(w)
            for c, w, num in zip(cells, widths, numeric)) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2))
                          for w, num in zip(widths, numeric)) + "|"
    table = "\n".join([line(heads), rule, *(line(r) for r in body)])
    if notes:
        table += ("\n\n\\* not converged (R-hat, ESS, stuck chains or divergences), so their "
                  "ESS figures are not meaningful: " + "; ".join(notes))
    return table
