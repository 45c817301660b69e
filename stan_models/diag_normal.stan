// Independent normals with standard deviations given as data (Neal's 100-d Gaussian
// with sds 0.01, 0.02, ..., 1.00 in the papers' experiments).
data {
  int<lower=1> D;
  vector<lower=0>[D] sigma;
}
parameters {
  vector[D] x;
}
model {
  x ~ normal(0, sigma);
}
