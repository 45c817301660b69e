// Epilepsy seizure counts (Thall & Vail 1990; BUGS "Epil", Breslow & Clayton 1993):
// Poisson GLMM with a random effect per subject and one per observation, non-centred.
data {
  int<lower=1> N;
  int<lower=1> J;
  int<lower=1> K;
  array[N] int<lower=1, upper=J> subject;
  matrix[N, K] X;
  array[N] int<lower=0> y;
}
parameters {
  real alpha;
  vector[K] beta;
  real<lower=0> sigma_subject;
  real<lower=0> sigma_obs;
  vector[J] z_subject;
  vector[N] z_obs;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 2.5);
  sigma_subject ~ normal(0, 1);
  sigma_obs ~ normal(0, 1);
  z_subject ~ std_normal();
  z_obs ~ std_normal();
  y ~ poisson_log(alpha + X * beta + sigma_subject * z_subject[subject] + sigma_obs * z_obs);
}
