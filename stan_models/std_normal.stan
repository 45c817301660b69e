// Standard normal in D dimensions.
data {
  int<lower=1> D;
}
parameters {
  vector[D] x;
}
model {
  x ~ std_normal();
}
