// Stochastic volatility (Kim, Shephard & Chib 1998; Girolami & Calderhead 2011; Wang,
// Mohamed & de Freitas 2013, section 5.3), non-centred: the AR(1) log-volatility x is
// built from standard-normal innovations z, so the sampler moves z, beta, phi, sigma2.
//   y_t = eps_t * beta * exp(x_t / 2),  x_1 ~ N(0, sigma2 / (1 - phi^2)),
//   x_{t+1} = phi * x_t + eta_t,  eta_t ~ N(0, sigma2),
//   p(beta) ∝ 1 / beta,  (phi + 1) / 2 ~ Beta(20, 1.5),  sigma2 ~ Scaled-Inv-chi2(10, 0.05).
data {
  int<lower=2> T;
  vector[T] y;
}
parameters {
  real<lower=0> beta;
  real<lower=-1, upper=1> phi;
  real<lower=0> sigma2;
  vector[T] z;
}
transformed parameters {
  vector[T] x;
  {
    real sigma = sqrt(sigma2);
    x[1] = z[1] * sigma / sqrt(1 - square(phi));
    for (t in 2:T) {
      x[t] = phi * x[t - 1] + sigma * z[t];
    }
  }
}
model {
  target += -log(beta);                            // p(beta) ∝ 1 / beta (improper)
  target += beta_lpdf((phi + 1) / 2 | 20, 1.5);    // the affine map's Jacobian is constant
  sigma2 ~ scaled_inv_chi_square(10, sqrt(0.05));  // scale s with s^2 = 0.05
  z ~ std_normal();
  y ~ normal(0, beta * exp(x / 2));
}
