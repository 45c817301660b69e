// Lotka-Volterra predator-prey ODE (Carpenter 2018, Stan case study) on the Hudson's Bay
// Company hare (prey, u) and lynx (predator, v) pelts, solved with ode_rk45;
// multiplicative (lognormal) measurement error.
functions {
  vector dz_dt(real t, vector z, real alpha, real beta, real gamma, real delta) {
    vector[2] dz;
    dz[1] = (alpha - beta * z[2]) * z[1];
    dz[2] = (-gamma + delta * z[1]) * z[2];
    return dz;
  }
}
data {
  int<lower=1> N;
  array[N] real ts;
  vector<lower=0>[2] y_init;
  array[N] vector<lower=0>[2] y;
}
parameters {
  real<lower=0> alpha;
  real<lower=0> beta;
  real<lower=0> gamma;
  real<lower=0> delta;
  vector<lower=0>[2] z_init;
  vector<lower=0>[2] sigma;
}
transformed parameters {
  array[N] vector[2] z = ode_rk45(dz_dt, z_init, 0, ts, alpha, beta, gamma, delta);
}
model {
  alpha ~ normal(1, 0.5);
  gamma ~ normal(1, 0.5);
  beta ~ normal(0.05, 0.05);
  delta ~ normal(0.05, 0.05);
  sigma ~ lognormal(-1, 1);
  z_init ~ lognormal(log(10), 1);
  y_init ~ lognormal(log(z_init), sigma);
  for (n in 1:N)
    y[n] ~ lognormal(log(z[n]), sigma);
}
