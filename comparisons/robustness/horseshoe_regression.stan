// Linear regression with the regularised horseshoe prior (Piironen & Vehtari 2017, eqs.
// 2.8-2.9, non-centred): local scales with Cauchy tails, a global scale from the guess of
// p0 relevant predictors, and a slab of scale 2 for the large coefficients.
data {
  int<lower=1> N;
  int<lower=1> K;
  matrix[N, K] X;
  vector[N] y;
  real<lower=0> p0;
}
transformed data {
  real slab_scale = 2;
  real slab_df = 4;
}
parameters {
  real alpha;
  vector[K] z;
  vector<lower=0>[K] lambda;
  real<lower=0> tau;
  real<lower=0> caux;
  real<lower=0> sigma;
}
transformed parameters {
  vector[K] beta;
  {
    real c = slab_scale * sqrt(caux);
    vector[K] lambda_tilde = sqrt(c^2 * square(lambda) ./ (c^2 + tau^2 * square(lambda)));
    beta = z .* lambda_tilde * tau;
  }
}
model {
  real tau0 = p0 / (K - p0) / sqrt(N);
  alpha ~ normal(0, 1);
  z ~ std_normal();
  lambda ~ cauchy(0, 1);
  tau ~ cauchy(0, tau0 * sigma);
  caux ~ inv_gamma(0.5 * slab_df, 0.5 * slab_df);
  sigma ~ normal(0, 1);
  y ~ normal(alpha + X * beta, sigma);
}
