// Bayesian neural network for the robot-arm data (Wang 2012 thesis, section 4.1; Neal 1996,
// "Bayesian Learning for Neural Networks", the robot-arm experiments): inputs x (2 joint
// angles), one layer of H tanh hidden units, 2 linear outputs, Gaussian noise.
//
// Neal's hierarchical priors: each group of weights (input-hidden W1, hidden biases b1,
// hidden-output W2) is Gaussian with a common precision tau_g; tau_g ~ Gamma with shape
// alpha/2 and mean 1/omega_g^2 (Neal's "omega:alpha" notation), with omega scaled by
// H^(-1/2) for W2 (Neal's "x" prefix); output biases N(0, bias_out_sd^2); the noise
// precision has the same Gamma prior.  The weights and biases are the 2H + H + 2H + 2
// = 82 dimensions of the thesis for H = 16; the four precisions, which Neal updates by
// Gibbs sampling, are sampled here jointly by HMC on the log scale.
//
// Generated quantities: y_pred[n, k] = the network output (no noise) at x_test[n].
data {
  int<lower=1> H;
  int<lower=0> N;
  matrix[N, 2] x;
  matrix[N, 2] y;
  int<lower=0> N_test;
  matrix[N_test, 2] x_test;
  real<lower=0> omega;        // prior width of the weight groups and the noise
  real<lower=0> alpha;        // prior shape of the precisions (Gamma shape alpha / 2)
  real<lower=0> bias_out_sd;  // sd of the output biases
}
transformed data {
  real shape = alpha / 2;
  real rate = shape * square(omega);          // mean precision 1 / omega^2
  real rate_out = shape * square(omega) / H;  // omega scaled by H^(-1/2)
}
parameters {
  matrix[2, H] W1;
  vector[H] b1;
  matrix[H, 2] W2;
  vector[2] b2;
  real<lower=0> tau_W1;
  real<lower=0> tau_b1;
  real<lower=0> tau_W2;
  real<lower=0> tau_noise;
}
model {
  matrix[N, 2] f = tanh(x * W1 + rep_matrix(b1', N)) * W2 + rep_matrix(b2', N);
  tau_W1 ~ gamma(shape, rate);
  tau_b1 ~ gamma(shape, rate);
  tau_W2 ~ gamma(shape, rate_out);
  tau_noise ~ gamma(shape, rate);
  to_vector(W1) ~ normal(0, inv_sqrt(tau_W1));
  b1 ~ normal(0, inv_sqrt(tau_b1));
  to_vector(W2) ~ normal(0, inv_sqrt(tau_W2));
  b2 ~ normal(0, bias_out_sd);
  to_vector(y) ~ normal(to_vector(f), inv_sqrt(tau_noise));
}
generated quantities {
  matrix[N_test, 2] y_pred = tanh(x_test * W1 + rep_matrix(b1', N_test)) * W2
                             + rep_matrix(b2', N_test);
}
