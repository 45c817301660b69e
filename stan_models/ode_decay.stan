// Exponential decay observed with noise: dy/dt = -k y, y(0) = y0, solved by Stan's ODE
// solvers (solver 1: ode_rk45_tol, 2: ode_bdf_tol) or in closed form (solver 0).  Stan's
// ODE solvers have no forward-mode instances, so ahmc-stan builds this model with
// Hessians by finite differences of gradients.
functions {
  vector decay(real t, vector y, real k) {
    return -k * y;
  }
}
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
transformed parameters {
  vector[N] mu;
  if (solver == 0) {
    mu = y0 * exp(-k * ts);
  } else {
    array[N] vector[1] z;
    if (solver == 1)
      z = ode_rk45_tol(decay, rep_vector(y0, 1), 0.0, to_array_1d(ts), 1e-10, 1e-10, 100000, k);
    else
      z = ode_bdf_tol(decay, rep_vector(y0, 1), 0.0, to_array_1d(ts), 1e-10, 1e-10, 100000, k);
    for (n in 1:N) mu[n] = z[n][1];
  }
}
model {
  k ~ lognormal(log(0.5), 0.5);
  y0 ~ normal(1, 0.3);
  y ~ normal(mu, sigma);
}
