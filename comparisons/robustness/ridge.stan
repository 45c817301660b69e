// A weakly identified location: only a + b is informed by the data, a - b only by the
// N(0, 10^2) priors (posterior correlation of a and b near -1); unknown noise scale.
data {
  int<lower=1> N;
  vector[N] y;
}
parameters {
  real a;
  real b;
  real<lower=0> sigma;
}
model {
  a ~ normal(0, 10);
  b ~ normal(0, 10);
  sigma ~ normal(0, 2);
  y ~ normal(a + b, sigma);
}
