// Local-level (random walk plus noise) state-space model, centred latent level mu_t:
// mu_t ~ N(mu_{t-1}, sigma_level), y_t ~ N(mu_t, sigma_obs).
data {
  int<lower=2> T;
  vector[T] y;
}
parameters {
  real<lower=0> sigma_level;
  real<lower=0> sigma_obs;
  vector[T] mu;
}
model {
  sigma_level ~ normal(0, 2);
  sigma_obs ~ normal(0, 2);
  mu[1] ~ normal(y[1], 5);
  mu[2:T] ~ normal(mu[1:(T - 1)], sigma_level);
  y ~ normal(mu, sigma_obs);
}
