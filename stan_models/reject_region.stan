// A normal whose density is zero (the model rejects) for x[1] > 1: a target that is
// -inf on part of the space.
data {
  int<lower=1> D;
}
parameters {
  vector[D] x;
}
model {
  if (x[1] > 1) {
    reject("x[1] = ", x[1], " is outside the support");
  }
  x ~ std_normal();
}
