// Simple linear regression y ~ normal(alpha + beta * x, sigma) with weak priors.
// With an uncentred predictor (calendar years, heights in inches) the posterior of
// (alpha, beta) is a thin ridge: their correlation is -mean(x) / sqrt(mean(x)^2 + var(x)).
data {
  int<lower=1> N;
  vector[N] x;
  vector[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> sigma;
}
model {
  alpha ~ normal(0, 1000);
  beta ~ normal(0, 100);
  sigma ~ exponential(0.1);
  y ~ normal(alpha + beta * x, sigma);
}
