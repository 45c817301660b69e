"""The papers' reference numbers, shown beside ours in the report: Wang, Mohamed & de
Freitas (2013), Titsias & Dellaportas (2019), Wang (2012) and Alfaki, Subbey & Haugland
(2008)."""

from __future__ import annotations

import math

#: Wang, Mohamed & de Freitas (2013), section 5.3, Table 1: ESS per leapfrog step, (mean, sd)
#: of the minimum, median and maximum over coordinates.  The table prints no unit; its
#: values are plausible only as multiples of 10⁻³ (with ε ≤ 10⁻² a trajectory costs tens
#: to hundreds of gradients), so ours are shown ×10³ — an assumption, not the paper's word.
PAPER_SV = {"ahmc": ((1.3, 0.1), (6.9, 0.7), (14.9, 1.4)),
            "nuts": ((0.7, 0.3), (3.5, 1.6), (9.0, 2.8))}

#: Titsias & Dellaportas (2019), section 4.2, Table 1: time (s), acceptance rate, ESS (min,
#: median, max) of 2·10⁴ draws, min ESS/s (sd); our label → (paper's label, values).
PAPER_GAD = {
    "neal100": {
        "gadmala": ("gadMALAf", 8.7, 0.563, (1431.2, 2001.2, 2470.5), (165.08, 18.80)),
        "gadmala_exact": ("gadMALAe", 10.1, 0.535, (940.5, 2006.3, 2747.6), (93.67, 10.28)),
        "gadrwm": ("gadRWM", 6.3, 0.252, (24.9, 65.4, 122.2), (3.93, 0.71)),
        "am": ("AM", 2.3, 0.257, (8.7, 48.6, 829.1), (3.83, 0.89)),
        "rwm": ("RWM", 2.1, 0.261, (2.9, 8.4, 2547.6), (1.38, 0.06)),
        "mala": ("MALA", 3.0, 0.530, (2.9, 10.0, 12489.2), (0.99, 0.03)),
        "hmc": ("HMC-20", 47.4, 0.694, (306.1, 1537.8, 19732.4), (6.47, 3.52)),
        "nuts": ("NUTS", 360.5, math.nan, (18479.6, 20000.0, 20000.0), (51.28, 1.64)),
    },
    "caravan": {
        "gadmala": ("gadMALAf", 24.8, 0.599, (204.8, 785.9, 1129.5), (8.30, 2.34)),
        "gadmala_exact": ("gadMALAe", 91.5, 0.492, (56.4, 496.4, 1420.2), (0.62, 0.16)),
        "gadrwm": ("gadRWM", 23.0, 0.227, (5.6, 35.5, 98.8), (0.24, 0.04)),
        "am": ("AM", 18.2, 0.257, (3.2, 11.8, 62.5), (0.18, 0.02)),
        "rwm": ("RWM", 17.4, 0.242, (3.0, 9.3, 52.5), (0.17, 0.02)),
        "mala": ("MALA", 22.5, 0.543, (4.4, 28.3, 326.0), (0.20, 0.06)),
        "hmc": ("HMC-10", 225.8, 0.711, (248.3, 2415.7, 19778.7), (1.10, 0.14)),
        "nuts": ("NUTS", 1412.1, math.nan, (7469.5, 20000.0, 20000.0), (5.29, 0.38)),
    },
}

#: Wang (2012), section 4.1, Table 4.1: mean squared test error on the robot arm.
PAPER_ROBOT_ARM = {"Neal's (1996) HMC, hand-tuned": 0.00554,
                   "Adaptive HMC (median error)": 0.00499,
                   "Adaptive HMC (mean error)": 0.00498}

#: Alfaki, Subbey & Haugland (2008), numerical results: N_eff of N = 2000 draws on standard
#: normals (experiment → {sampler: N_eff}).
PAPER_TALK = {"std64": {"hmc": 542, "ohmc": 614, "svhmc": 1059, "osvhmc": 1400},
              "std128": {"hmc": 554, "svhmc": 1167}}


