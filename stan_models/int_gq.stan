// A normal mean with integer generated quantities (Poisson counts, a sign), to check
// that integers stay integers in to_arviz().
parameters {
  real mu;
}
model {
  mu ~ normal(0, 1);
}
generated quantities {
  int positive = mu > 0;
  array[2] int counts;
  for (i in 1:2) counts[i] = poisson_rng(3);
  real mu2 = square(mu);
}
