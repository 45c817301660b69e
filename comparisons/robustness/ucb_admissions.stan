// UC Berkeley admissions 1973 by department and gender: hierarchical binomial-logit,
// non-centred department intercepts a_j = mu + sigma z_j and a common gender effect.
data {
  int<lower=1> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> dept;
  array[N] int<lower=0> applicants;
  array[N] int<lower=0> admitted;
  vector[N] female;
}
parameters {
  real mu;
  real<lower=0> sigma;
  real beta;
  vector[J] z;
}
transformed parameters {
  vector[J] a = mu + sigma * z;
}
model {
  mu ~ normal(0, 2);
  sigma ~ normal(0, 2);
  beta ~ normal(0, 1);
  z ~ std_normal();
  admitted ~ binomial_logit(applicants, a[dept] + beta * female);
}
