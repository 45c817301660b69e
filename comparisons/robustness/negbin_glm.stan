// Negative-binomial regression (mean-dispersion parametrisation, log link).
data {
  int<lower=1> N;
  int<lower=1> K;
  matrix[N, K] X;
  array[N] int<lower=0> y;
}
parameters {
  real alpha;
  vector[K] beta;
  real<lower=0> phi;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 2.5);
  phi ~ gamma(2, 0.1);
  y ~ neg_binomial_2_log(alpha + X * beta, phi);
}
