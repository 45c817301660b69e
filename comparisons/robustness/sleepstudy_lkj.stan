// Sleep deprivation (lme4 sleepstudy): reaction time ~ days with correlated subject-level
// intercepts and slopes, non-centred, LKJ prior on their cholesky_factor_corr.
data {
  int<lower=1> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> subject;
  vector[N] days;
  vector[N] y;
}
parameters {
  vector[2] beta;
  vector<lower=0>[2] tau;
  cholesky_factor_corr[2] L;
  matrix[2, J] z;
  real<lower=0> sigma;
}
transformed parameters {
  matrix[J, 2] b = (diag_pre_multiply(tau, L) * z)';
}
model {
  beta ~ normal(0, 5);
  tau ~ normal(0, 1);
  L ~ lkj_corr_cholesky(2);
  to_vector(z) ~ std_normal();
  sigma ~ normal(0, 1);
  y ~ normal(beta[1] + b[subject, 1] + (beta[2] + b[subject, 2]) .* days, sigma);
}
