// Two-state Gaussian hidden Markov model, forward algorithm; ordered emission means
// identify the states; rows of the transition matrix are simplexes; uniform start.
data {
  int<lower=2> T;
  vector[T] y;
  real prior_loc;
  real<lower=0> prior_scale;
}
parameters {
  array[2] simplex[2] Gamma;
  ordered[2] mu;
  vector<lower=0>[2] sigma;
}
model {
  vector[2] lp;
  mu ~ normal(prior_loc, prior_scale);
  sigma ~ normal(0, prior_scale);
  for (k in 1:2)
    lp[k] = log(0.5) + normal_lpdf(y[1] | mu[k], sigma[k]);
  for (t in 2:T) {
    vector[2] acc;
    for (k in 1:2)
      acc[k] = log_sum_exp(lp[1] + log(Gamma[1][k]), lp[2] + log(Gamma[2][k]))
               + normal_lpdf(y[t] | mu[k], sigma[k]);
    lp = acc;
  }
  target += log_sum_exp(lp);
}
