// Beta regression (Ferrari & Cribari-Neto 2004; Prater's gasoline yield, betareg
// GasolineYield): the proportion of crude oil converted to gasoline, mean
// inv_logit(alpha + batch effect + beta * temperature), precision phi.
data {
  int<lower=1> N;
  int<lower=1> K;
  matrix[N, K] X;
  vector<lower=0, upper=1>[N] y;
}
parameters {
  real alpha;
  vector[K] beta;
  real<lower=0> phi;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 5);
  phi ~ gamma(1, 0.01);
  y ~ beta_proportion(inv_logit(alpha + X * beta), phi);
}
