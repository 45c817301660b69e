// Weibull accelerated-failure-time regression with right censoring.
data {
  int<lower=1> N;
  int<lower=1> K;
  matrix[N, K] X;
  vector<lower=0>[N] t;
  array[N] int<lower=0, upper=1> event;
}
parameters {
  real<lower=0> shape;
  real b0;
  vector[K] b;
}
model {
  vector[N] scale = exp(b0 + X * b);
  shape ~ lognormal(0, 1);
  b0 ~ normal(0, 5);
  b ~ normal(0, 2.5);
  for (n in 1:N) {
    if (event[n] == 1)
      target += weibull_lpdf(t[n] | shape, scale[n]);
    else
      target += weibull_lccdf(t[n] | shape, scale[n]);
  }
}
