// Eight schools (Rubin 1981; Gelman et al., BDA3 5.5), centred: theta ~ N(mu, tau).
// The centred funnel between tau and theta makes samplers diverge or get stuck at small tau.
data {
  int<lower=1> J;
  vector[J] y;
  vector<lower=0>[J] sigma;
}
parameters {
  real mu;
  real<lower=0> tau;
  vector[J] theta;
}
model {
  mu ~ normal(0, 5);
  tau ~ cauchy(0, 5);
  theta ~ normal(mu, tau);
  y ~ normal(theta, sigma);
}
