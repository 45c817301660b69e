// AR(K) with an intercept, conditional on the first K observations.
data {
  int<lower=1> K;
  int<lower=K + 1> T;
  vector[T] y;
}
parameters {
  real alpha;
  vector[K] beta;
  real<lower=0> sigma;
}
model {
  vector[T - K] mu = rep_vector(alpha, T - K);
  for (k in 1:K)
    mu += beta[k] * y[(K + 1 - k):(T - k)];
  alpha ~ normal(0, 5);
  beta ~ normal(0, 1);
  sigma ~ exponential(1);
  y[(K + 1):T] ~ normal(mu, sigma);
}
