// A lower-bounded scale, a bounded probability and a matrix parameter: exercises the
// constraining transforms, their Jacobians and the column-major name order.
data {
  real<lower=0> rate;
}
parameters {
  real<lower=0> sigma;
  real<lower=0, upper=1> p;
  matrix[2, 3] M;
}
model {
  sigma ~ exponential(rate);
  p ~ beta(2, 3);
  to_vector(M) ~ normal(0, sigma);
}
generated quantities {
  real sigma_sq = square(sigma);
}
