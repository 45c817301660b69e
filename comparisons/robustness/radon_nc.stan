// Minnesota radon, non-centred: alpha = g0 + g1 u + sigma_a * alpha_raw.
data {
  int<lower=1> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> county;
  vector[N] x;
  vector[J] u;
  vector[N] y;
}
parameters {
  real g0;
  real g1;
  real beta;
  real<lower=0> sigma_a;
  real<lower=0> sigma_y;
  vector[J] alpha_raw;
}
transformed parameters {
  vector[J] alpha = g0 + g1 * u + sigma_a * alpha_raw;
}
model {
  g0 ~ normal(0, 10);
  g1 ~ normal(0, 10);
  beta ~ normal(0, 10);
  sigma_a ~ normal(0, 1);
  sigma_y ~ normal(0, 1);
  alpha_raw ~ std_normal();
  y ~ normal(alpha[county] + beta * x, sigma_y);
}
