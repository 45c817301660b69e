// Bayesian logistic regression with an intercept and N(0, prior_sd^2) priors
// (the model of the papers' logistic-regression experiments).
data {
  int<lower=0> N;
  int<lower=1> K;
  matrix[N, K] X;
  array[N] int<lower=0, upper=1> y;
  real<lower=0> prior_sd;
}
parameters {
  real alpha;
  vector[K] beta;
}
model {
  alpha ~ normal(0, prior_sd);
  beta ~ normal(0, prior_sd);
  y ~ bernoulli_logit(alpha + X * beta);
}
