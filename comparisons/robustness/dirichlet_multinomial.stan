// Eye colour by hair colour: a multinomial per hair colour with simplex theta_h drawn from
// a Dirichlet(kappa * phi) around a shared simplex phi (hierarchical Dirichlet-multinomial).
data {
  int<lower=1> H;
  int<lower=2> K;
  array[H, K] int<lower=0> counts;
}
parameters {
  simplex[K] phi;
  real<lower=0> kappa;
  array[H] simplex[K] theta;
}
model {
  kappa ~ lognormal(log(10), 1.5);
  for (h in 1:H) {
    theta[h] ~ dirichlet(kappa * phi);
    counts[h] ~ multinomial(theta[h]);
  }
}
