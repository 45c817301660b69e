// Zero-inflated negative-binomial regression: a logit model of structural zeros and a
// NB2 count model with log link, the same covariates in both.
data {
  int<lower=1> N;
  int<lower=1> K;
  matrix[N, K] X;
  array[N] int<lower=0> y;
}
parameters {
  real a_count;
  vector[K] b_count;
  real<lower=0> phi;
  real a_zero;
  vector[K] b_zero;
}
model {
  vector[N] eta = a_count + X * b_count;
  vector[N] theta = a_zero + X * b_zero;
  a_count ~ normal(0, 5);
  b_count ~ normal(0, 2.5);
  phi ~ gamma(2, 0.1);
  a_zero ~ normal(0, 5);
  b_zero ~ normal(0, 2.5);
  for (n in 1:N) {
    if (y[n] == 0)
      target += log_sum_exp(log_inv_logit(theta[n]),
                            log1m_inv_logit(theta[n]) + neg_binomial_2_log_lpmf(0 | eta[n], phi));
    else
      target += log1m_inv_logit(theta[n]) + neg_binomial_2_log_lpmf(y[n] | eta[n], phi);
  }
}
