// ode_decay.stan's density with the solution in closed form (no ODE solver), so it
// builds with autodiff Hessians: the reference for the finite-difference ones.
data {
  int<lower=1> N;
  vector[N] ts;
  vector[N] y;
  real<lower=0> sigma;
  int<lower=0, upper=2> solver;
}
parameters {
  real<lower=0> k;
  real y0;
}
model {
  k ~ lognormal(log(0.5), 0.5);
  y0 ~ normal(1, 0.3);
  y ~ normal(y0 * exp(-k * ts), sigma);
}
