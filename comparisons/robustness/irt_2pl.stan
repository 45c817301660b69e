// Two-parameter logistic item response model: an ability per person, a discrimination
// and a difficulty per item, with hierarchical priors on the items (non-centred).
data {
  int<lower=1> I;
  int<lower=1> J;
  array[J, I] int<lower=0, upper=1> y;
}
parameters {
  vector[J] theta;
  vector<lower=0>[I] a;
  real mu_b;
  real<lower=0> sigma_b;
  vector[I] b_raw;
}
transformed parameters {
  vector[I] b = mu_b + sigma_b * b_raw;
}
model {
  theta ~ std_normal();
  a ~ lognormal(0, 0.5);
  mu_b ~ normal(0, 2);
  sigma_b ~ normal(0, 1);
  b_raw ~ std_normal();
  for (j in 1:J)
    y[j] ~ bernoulli_logit(a .* (theta[j] - b));
}
