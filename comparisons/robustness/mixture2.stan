// Two-component normal mixture with ordered means (identifies the labels).
data {
  int<lower=1> N;
  vector[N] y;
  real prior_loc;
  real<lower=0> prior_scale;
}
parameters {
  ordered[2] mu;
  vector<lower=0>[2] sigma;
  real<lower=0, upper=1> lambda;
}
model {
  mu ~ normal(prior_loc, prior_scale);
  sigma ~ normal(0, prior_scale);
  lambda ~ beta(2, 2);
  for (n in 1:N)
    target += log_mix(lambda, normal_lpdf(y[n] | mu[1], sigma[1]),
                      normal_lpdf(y[n] | mu[2], sigma[2]));
}
