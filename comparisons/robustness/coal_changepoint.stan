// Coal-mining disasters with one change point (Stan User's Guide, "Change point models"):
// the discrete change year is summed out, so the posterior of the two rates is a mixture
// over 112 years.
data {
  int<lower=1> T;
  array[T] int<lower=0> D;
  real<lower=0> r_e;
  real<lower=0> r_l;
}
transformed data {
  real log_unif = -log(T);
}
parameters {
  real<lower=0> e;
  real<lower=0> l;
}
model {
  vector[T] lp;
  {
    vector[T + 1] lp_e;
    vector[T + 1] lp_l;
    lp_e[1] = 0;
    lp_l[1] = 0;
    for (t in 1:T) {
      lp_e[t + 1] = lp_e[t] + poisson_lpmf(D[t] | e);
      lp_l[t + 1] = lp_l[t] + poisson_lpmf(D[t] | l);
    }
    lp = rep_vector(log_unif + lp_l[T + 1], T) + head(lp_e, T) - head(lp_l, T);
  }
  e ~ exponential(r_e);
  l ~ exponential(r_l);
  target += log_sum_exp(lp);
}
