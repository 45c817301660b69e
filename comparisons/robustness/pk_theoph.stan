// One-compartment pharmacokinetics with first-order absorption (theophylline, one
// subject), written as an ODE for the gut and central amounts and solved with ode_bdf;
// ka = ke + exp(log_dka) > ke removes the flip-flop mode; lognormal concentration error.
// Log-scale parameters with offset/multiplier: Stan's default inits (uniform(-2, 2)
// unconstrained) then stay within 2 prior sds, away from the far tail where the late
// amounts underflow the solver's tolerance and the gradient is noise.
functions {
  vector pk(real t, vector A, real ka, real ke) {
    vector[2] dA;
    dA[1] = -ka * A[1];
    dA[2] = ka * A[1] - ke * A[2];
    return dA;
  }
}
data {
  int<lower=1> N;
  array[N] real ts;
  vector<lower=0>[N] conc;
  real<lower=0> dose;
}
parameters {
  real<offset=log(0.1), multiplier=0.5> log_ke;
  real<offset=log(1.5), multiplier=0.7> log_dka;
  real<offset=log(30), multiplier=0.5> log_V;
  real<lower=0> sigma;
}
transformed parameters {
  real ke = exp(log_ke);
  real ka = ke + exp(log_dka);
  real V = exp(log_V);
  vector[N] mu;
  {
    array[N] vector[2] A = ode_bdf(pk, [dose, 0]', 0, ts, ka, ke);
    for (n in 1:N)
      mu[n] = A[n][2] / V;
  }
}
model {
  log_ke ~ normal(log(0.1), 0.5);
  log_dka ~ normal(log(1.5), 0.7);
  log_V ~ normal(log(30), 0.5);
  sigma ~ normal(0, 0.5);
  conc ~ lognormal(log(mu), sigma);
}
