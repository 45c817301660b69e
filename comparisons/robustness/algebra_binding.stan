// Ligand binding at equilibrium: for each total ligand concentration Ltot_n the free
// ligand L_n solves L + P L / (Kd + L) = Ltot_n (solved on the log scale with
// algebra_solver); the observed bound fraction is L_n / (Kd + L_n) with normal noise.
functions {
  vector binding(vector logL, vector theta, array[] real x_r, array[] int x_i) {
    int N = num_elements(logL);
    vector[N] L = exp(logL);
    return L + theta[2] * L ./ (theta[1] + L) - to_vector(x_r);
  }
}
data {
  int<lower=1> N;
  array[N] real<lower=0> Ltot;
  vector[N] y;
}
transformed data {
  array[0] int x_i;
  vector[N] guess = log(to_vector(Ltot)) - 1;
}
parameters {
  real<lower=0> Kd;
  real<lower=0> P;
  real<lower=0> sigma;
}
transformed parameters {
  vector[N] frac;
  {
    vector[2] theta = [Kd, P]';
    vector[N] L = exp(algebra_solver(binding, guess, theta, Ltot, x_i, 1e-10, 1e-8, 1000));
    frac = L ./ (Kd + L);
  }
}
model {
  Kd ~ lognormal(0, 1);
  P ~ lognormal(0, 1);
  sigma ~ normal(0, 0.2);
  y ~ normal(frac, sigma);
}
