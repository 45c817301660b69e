// Michaelis-Menten nonlinear regression (Bates & Watts 1988, Puromycin): the rate of an
// enzymatic reaction, Vm * conc / (K + conc), with Vm and K per state (treated or not).
// Vm and K are strongly and nonlinearly correlated (a curved ridge).
data {
  int<lower=1> N;
  vector<lower=0>[N] conc;
  array[N] int<lower=1, upper=2> state;
  vector[N] rate;
}
parameters {
  vector<lower=0>[2] Vm;
  vector<lower=0>[2] K;
  real<lower=0> sigma;
}
model {
  Vm ~ normal(0, 250);
  K ~ lognormal(log(0.1), 1);
  sigma ~ normal(0, 20);
  rate ~ normal(Vm[state] .* conc ./ (K[state] + conc), sigma);
}
