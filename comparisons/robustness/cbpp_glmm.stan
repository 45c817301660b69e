// Binomial GLMM (lme4 cbpp): contagious bovine pleuropneumonia incidence in 15 herds over
// four periods; a period effect and a herd effect (non-centred), logit link.
data {
  int<lower=1> N;
  int<lower=1> H;
  int<lower=1> P;
  array[N] int<lower=1, upper=H> herd;
  array[N] int<lower=1, upper=P> period;
  array[N] int<lower=0> size;
  array[N] int<lower=0> incidence;
}
parameters {
  vector[P] beta;
  real<lower=0> sigma;
  vector[H] z;
}
model {
  beta ~ normal(0, 5);
  sigma ~ normal(0, 2);
  z ~ std_normal();
  incidence ~ binomial_logit(size, beta[period] + sigma * z[herd]);
}
