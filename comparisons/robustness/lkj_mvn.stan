// Multivariate normal with scales tau and an LKJ(2) prior on the Cholesky factor L of
// the correlation matrix (cholesky_factor_corr); Omega = L L' is reported.
data {
  int<lower=1> N;
  int<lower=2> D;
  array[N] vector[D] y;
}
parameters {
  vector[D] mu;
  vector<lower=0>[D] tau;
  cholesky_factor_corr[D] L;
}
model {
  mu ~ normal(0, 10);
  tau ~ normal(0, 2);
  L ~ lkj_corr_cholesky(2);
  y ~ multi_normal_cholesky(mu, diag_pre_multiply(tau, L));
}
generated quantities {
  corr_matrix[D] Omega = multiply_lower_tri_self_transpose(L);
}
