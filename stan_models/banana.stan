// A banana-shaped (non-Gaussian) 2-d density: x1 ~ N(0, 1), x2 | x1 ~ N(b (x1^2 - 1), 1),
// so E[x2] = 0 and sd(x2) = sqrt(1 + 2 b^2).  Its Hessian varies with x1, so variable-step
// integrators are not volume-preserving on it by accident.
data {
  real<lower=0> b;
}
parameters {
  real x1;
  real x2;
}
model {
  x1 ~ std_normal();
  x2 ~ normal(b * (square(x1) - 1), 1);
}
