// Eight schools, centred parameterisation (Rubin 1981; Gelman et al. BDA 5.5): the
// funnel between tau and theta makes HMC/NUTS diverge.
data {
  int<lower=0> J;
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
