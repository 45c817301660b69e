// GARCH(1, 1) (Stan User's Guide 3.2) with alpha1 + beta1 < 1.
data {
  int<lower=2> T;
  vector[T] r;
  real<lower=0> sigma1;
}
parameters {
  real mu;
  real<lower=0> alpha0;
  real<lower=0, upper=1> alpha1;
  real<lower=0, upper=(1 - alpha1)> beta1;
}
model {
  vector[T] sigma;
  sigma[1] = sigma1;
  for (t in 2:T)
    sigma[t] = sqrt(alpha0 + alpha1 * square(r[t - 1] - mu) + beta1 * square(sigma[t - 1]));
  mu ~ normal(0, 1);
  alpha0 ~ normal(0, 1);
  r ~ normal(mu, sigma);
}
