// x[d] ~ normal(m, 1), and beyond |x[d] - m| = w a wall: the log density also falls by
// exp(a u) - 1 - a u, u = |x[d] - m| - w (continuous with its gradient at u = 0).  At
// a = 80 the wall is 10^31 nats high at u = 0.9: a chain started there has its step-size
// adaptation trapped (tests/test_warmup_recovery.py).  With m far from 0 every Stan-rule
// initial point (uniform(-2, 2)) is on the wall.
data {
  int<lower=1> D;
  real m;
  real<lower=0> w;
  real<lower=0> a;
}
parameters {
  vector[D] x;
}
model {
  x ~ normal(m, 1);
  for (d in 1:D) {
    real u = (x[d] > m ? x[d] - m : m - x[d]) - w;
    if (u > 0) {
      target += -(expm1(a * u) - a * u);
    }
  }
}
