// Robust linear regression: Student-t errors with unknown degrees of freedom
// (gamma(2, 0.1) prior on nu, Juarez & Steel 2010), whose posterior is skewed and heavy-tailed.
data {
  int<lower=1> N;
  int<lower=1> K;
  matrix[N, K] X;
  vector[N] y;
}
parameters {
  real alpha;
  vector[K] beta;
  real<lower=0> sigma;
  real<lower=1> nu;
}
model {
  alpha ~ normal(20, 20);
  beta ~ normal(0, 20);
  sigma ~ normal(0, 10);
  nu ~ gamma(2, 0.1);
  y ~ student_t(nu, alpha + X * beta, sigma);
}
