// Neal's funnel (Neal 2003): v ~ N(0, 3^2), x_k ~ N(0, exp(v / 2)^2), k = 1..K, centred.
// Exact moments: E v = 0, sd v = 3, E x_k = 0, sd x_k = exp(9 / 4).
data {
  int<lower=1> K;
}
parameters {
  real v;
  vector[K] x;
}
model {
  v ~ normal(0, 3);
  x ~ normal(0, exp(v / 2));
}
