// Multivariate normal with mean and covariance given as data.
data {
  int<lower=1> D;
  vector[D] mu;
  cov_matrix[D] Sigma;
}
parameters {
  vector[D] x;
}
model {
  x ~ multi_normal(mu, Sigma);
}
