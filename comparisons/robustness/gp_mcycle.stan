// Gaussian-process regression, hyperparameters only (the latent function integrated out):
// MASS mcycle, head acceleration (standardised) against time (ms / 10). Length scale rho,
// marginal sd alpha, noise sd sigma.
data {
  int<lower=1> N;
  array[N] real x;
  vector[N] y;
}
parameters {
  real<lower=0> rho;
  real<lower=0> alpha;
  real<lower=0> sigma;
}
model {
  matrix[N, N] L_K;
  {
    matrix[N, N] K = gp_exp_quad_cov(x, alpha, rho);
    for (n in 1:N) {
      K[n, n] = K[n, n] + square(sigma);
    }
    L_K = cholesky_decompose(K);
  }
  rho ~ inv_gamma(5, 5);
  alpha ~ normal(0, 1);
  sigma ~ normal(0, 1);
  y ~ multi_normal_cholesky(rep_vector(0, N), L_K);
}
