// An improper posterior: `a` has neither prior nor likelihood (flat on the real line), so
// no sampler can converge on it; `b` is a standard normal.
parameters {
  real a;
  real b;
}
model {
  b ~ normal(0, 1);
}
