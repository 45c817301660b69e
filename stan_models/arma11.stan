// ARMA(1,1) (Stan User's Guide, "Moving average models"):
//   y[t] ~ normal(mu + phi * y[t-1] + theta * err[t-1], sigma),
//   err[t] = y[t] - (mu + phi * y[t-1] + theta * err[t-1]),  err[1] = y[1] - mu * (1 + phi).
// With |theta| > 1 the errors grow geometrically and the log density is astronomically
// steep: a start there traps a step-size adaptation (tests/test_warmup_recovery.py).
data {
  int<lower=1> T;
  vector[T] y;
}
parameters {
  real mu;
  real phi;
  real theta;
  real<lower=0> sigma;
}
model {
  vector[T] err;
  err[1] = y[1] - (mu + phi * mu);
  for (t in 2:T) {
    err[t] = y[t] - (mu + phi * y[t - 1] + theta * err[t - 1]);
  }
  mu ~ normal(0, 10);
  phi ~ normal(0, 10);
  theta ~ normal(0, 10);
  sigma ~ cauchy(0, 5);
  err ~ normal(0, sigma);
}
