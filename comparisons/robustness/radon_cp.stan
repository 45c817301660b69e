// Minnesota radon (Gelman & Hill 2007, ch. 12), centred varying intercepts with the
// county-level log-uranium predictor: alpha_j ~ N(g0 + g1 u_j, sigma_a),
// log radon_i ~ N(alpha_county[i] + beta basement_i, sigma_y).
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
  vector[J] alpha;
}
model {
  g0 ~ normal(0, 10);
  g1 ~ normal(0, 10);
  beta ~ normal(0, 10);
  sigma_a ~ normal(0, 1);
  sigma_y ~ normal(0, 1);
  alpha ~ normal(g0 + g1 * u, sigma_a);
  y ~ normal(alpha[county] + beta * x, sigma_y);
}
