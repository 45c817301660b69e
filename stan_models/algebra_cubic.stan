// A parameter reached through Stan's algebraic solver: x solves x^3 + x = a, and y is
// observed around x.  The solver has no forward-mode instances, so ahmc-stan builds this
// model with Hessians by finite differences of gradients.
functions {
  vector cubic(vector x, vector a, array[] real x_r, array[] int x_i) {
    return x .* x .* x + x - a;
  }
}
data {
  int<lower=1> N;
  vector[N] y;
}
transformed data {
  array[0] real x_r;
  array[0] int x_i;
}
parameters {
  real a;
}
transformed parameters {
  real x = algebra_solver(cubic, rep_vector(0, 1), rep_vector(a, 1), x_r, x_i, 1e-12, 1e-12, 1000)[1];
}
model {
  a ~ normal(1, 2);
  y ~ normal(x, 1);
}
