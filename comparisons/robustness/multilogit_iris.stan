// Multinomial logistic regression on R iris: species from the four measurements
// (standardised), the first species' coefficients fixed at zero. Setosa is linearly
// separable from the others, so its coefficients are held only by their priors:
// skewed, heavy directions.
data {
  int<lower=1> N;
  int<lower=1> D;
  int<lower=2> C;
  matrix[N, D] X;
  array[N] int<lower=1, upper=C> y;
}
parameters {
  vector[C - 1] alpha;
  matrix[D, C - 1] beta;
}
model {
  matrix[N, C] eta = append_col(rep_vector(0, N),
                                rep_matrix(alpha', N) + X * beta);
  alpha ~ normal(0, 5);
  to_vector(beta) ~ normal(0, 5);
  for (n in 1:N) {
    y[n] ~ categorical_logit(eta[n]');
  }
}
