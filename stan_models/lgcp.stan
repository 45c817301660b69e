// Log-Gaussian Cox process on a d x d grid (Christensen et al. 2005; Girolami &
// Calderhead 2011, section 9; Wang, Mohamed & de Freitas 2013, section 5.2), non-centred:
// the latent field is x = mu + L z with z ~ N(0, I) and L the Cholesky factor of the GP
// covariance, passed as data, so the hyperparameters (mu, sigma^2, beta) are fixed.
//   y_ij ~ Poisson(s * exp(x_ij)),  s = 1 / d^2 (the cell area; passed as `area`).
data {
  int<lower=1> n;                   // number of cells, d^2
  array[n] int<lower=0> y;          // counts, cells in column-major grid order
  real mu;
  real<lower=0> area;
  cholesky_factor_cov[n] L;
}
transformed data {
  real log_area = log(area);
}
parameters {
  vector[n] z;
}
transformed parameters {
  vector[n] x = mu + L * z;
}
model {
  z ~ std_normal();
  y ~ poisson_log(log_area + x);
}
