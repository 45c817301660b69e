// Proportional-odds (ordered logistic) regression on grouped counts: w_n observations of
// category y_n at covariates X_n; ordered cutpoints c.
data {
  int<lower=1> N;
  int<lower=1> K;
  int<lower=2> C;
  array[N] int<lower=1, upper=C> y;
  array[N] int<lower=0> w;
  matrix[N, K] X;
}
parameters {
  vector[K] beta;
  ordered[C - 1] c;
}
model {
  vector[N] eta = X * beta;
  beta ~ normal(0, 5);
  c ~ normal(0, 5);
  for (n in 1:N)
    target += w[n] * ordered_logistic_lpmf(y[n] | eta[n], c);
}
